"""``kith peers``: the trusted peer registry ``<home>/peers.json`` (DESIGN §10, specs/peers.md)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from node.cli.common import untrusted_console as console, emit_json, home_of
from node.trust.peers import PeerRegistry, load_own_profile, save_own_profile

peers_app = typer.Typer(
    help=(
        "Trusted peers: pin a local name to a peer's public key. Hosts name guests by it "
        "(policy 'peers' rules, `kith host --peers-only`), both sides refuse a pinned name "
        "with a changed key, and known peers' shared profiles are merged after each session."
    ),
    no_args_is_help=True,
)

_JSON = typer.Option(False, "--json", help="Print JSON on stdout.")


@peers_app.command("add")
def add_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Local name: 1-64 of [A-Za-z0-9_.-], starting alphanumeric."),
    key: str = typer.Argument(..., help="The peer's public key (64 lowercase hex; `kith init` prints it)."),
    note: str = typer.Option("", "--note", help="Your own note about this peer (never sent)."),
    as_json: bool = _JSON,
) -> None:
    """Pin NAME to KEY (refused when NAME or KEY is already pinned)."""
    registry = PeerRegistry.load(home_of(ctx))
    rec = registry.add(name, key, note)
    if as_json:
        emit_json(registry.to_json(rec))
    else:
        console.print(f"pinned {rec.name} → {rec.public_key[:16]}…", highlight=False, markup=False)


@peers_app.command("remove")
def remove_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The local name to remove."),
    as_json: bool = _JSON,
) -> None:
    """Remove NAME from the registry."""
    registry = PeerRegistry.load(home_of(ctx))
    rec = registry.remove(name)
    if as_json:
        emit_json({"name": rec.name, "removed": True})
    else:
        console.print(f"removed {rec.name}", highlight=False, markup=False)


@peers_app.command("list")
def list_cmd(
    ctx: typer.Context,
    rank: Optional[str] = typer.Option(None, "--rank", metavar="QUERY",
                                       help="Only peers matching QUERY, best first (name, note, shared profile)."),
    as_json: bool = _JSON,
) -> None:
    """List pinned peers (by name, or ranked by --rank QUERY)."""
    registry = PeerRegistry.load(home_of(ctx))
    if rank is not None:
        rows = [(score, rec) for score, rec in registry.rank(rank)]
    else:
        rows = [(None, rec) for _, rec in sorted(registry.peers.items())]
    if as_json:
        out = []
        for score, rec in rows:
            item = registry.to_json(rec)
            if score is not None:
                item["score"] = score
            out.append(item)
        emit_json({"peers": out})
        return
    if not rows:
        console.print("no peers" + (" match" if rank is not None else " pinned"), highlight=False)
        return
    table = Table("name", "key", "display name", "note", "profile synced", box=None, header_style="bold")
    for _, rec in rows:
        table.add_row(rec.name, rec.public_key[:16] + "…", rec.profile.get("displayName", ""), rec.note,
                      rec.profile_synced_at or "-")
    console.print(table)


@peers_app.command("profile")
def profile_cmd(
    ctx: typer.Context,
    display_name: Optional[str] = typer.Option(None, "--display-name", help="Short name peers see."),
    full_name: Optional[str] = typer.Option(None, "--full-name"),
    short_descr: Optional[str] = typer.Option(None, "--short-descr", help="One line about you."),
    description: Optional[str] = typer.Option(None, "--description"),
    as_json: bool = _JSON,
) -> None:
    """Show (or, with options, set) the profile this node shares in every handshake."""
    home = home_of(ctx)
    profile = load_own_profile(home)
    changes = {"displayName": display_name, "fullName": full_name, "shortDescr": short_descr,
               "description": description}
    if any(v is not None for v in changes.values()):
        profile.update({k: v for k, v in changes.items() if v is not None})
        profile = save_own_profile(home, profile)
    if as_json:
        emit_json(profile)
    elif not profile:
        console.print("no profile shared (set one with --display-name ...)", highlight=False)
    else:
        for k, v in profile.items():
            console.print(f"{k}: {v}", highlight=False, markup=False)
