"""``kith copies``: the copies this node keeps of hosts that granted one (specs/copies.md;
node/guest/copies/)."""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer

from node.cli.common import (TransportArgs, emit_json, err_console, home_of, identity_home_of, safe_text,
                             transport_options, untrusted_console as console, command_group, json_option)

copies_app = command_group(
    "Copies of hosts' sources this node keeps, so it can search them while the host sleeps. "
    "A host grants one with `kith policy copy GLOB --for NAME`; `kith copies sync NAME` pulls it "
    "(signed, scrubbed documents; only what changed), `kith ask --peer NAME` answers from it when "
    "the host is unreachable (or with --copy). A copy is never served on to anyone."
)

_JSON = json_option()


def _say_report(r: dict[str, Any]) -> None:
    if r["status"] == "ended":
        err_console.print(f"{safe_text(r['peer'])} no longer grants a copy: deleted {r['removed']} document(s)",
                          highlight=False, markup=False)
        return
    line = (f"{safe_text(r['peer'])}: {r['documents']} document(s), {r['bytes']:,} bytes; fetched {r['fetched']}, "
            f"unchanged {r['unchanged']}, deleted {r['removed']}")
    if r["removed"]:
        line += " (no longer granted)"
    if r.get("repaired"):
        line += f"; {r['repaired']} fetched again (the file here was gone or changed)"
    console.print(line, highlight=False, markup=False)
    for key, what in (("tooLarge", "too large to copy"), ("refused", "refused by the host")):
        if r[key]:
            err_console.print(f"  {len(r[key])} document(s) {what}", highlight=False, markup=False)


@copies_app.command("list")
def list_cmd(ctx: typer.Context, as_json: bool = _JSON) -> None:
    """List the copies kept here: peer, documents, bytes, when last synced, when the grant
    ends. A copy past its end is deleted first (and said so on stderr). A damaged copy is
    listed with its code and the way out, the others as usual, and said on stderr as every
    refusal is (error [code]: message, then its hint); the exit status is then 1."""
    from node.guest.copies.lifecycle import expire_copies
    from node.guest.copies.search import copy_age_text
    from node.guest.copies.store import list_copies

    expire_copies(home_of(ctx))
    rows = list_copies(home_of(ctx))
    damaged = [r for r in rows if "error" in r]
    if as_json:
        emit_json({"copies": rows})
        _say_damaged(damaged)
        return
    if not rows:
        console.print("no copies are kept here (a host grants one with `kith policy copy GLOB --for YOU`; "
                      "then `kith copies sync NAME`)", highlight=False, markup=False)
        return
    for r in rows:
        if "error" in r:
            err = r["error"]
            console.print(f"{safe_text(r['peer'])}: damaged — {err['code']}: {err['message']}"
                          + (f" ({err['hint']})" if err.get("hint") else ""), highlight=False, markup=False)
            continue
        budget = "" if r["maxBytes"] is None else f" of {r['maxBytes']:,}"
        when = copy_age_text(r["peer"], r["syncedAt"]) if r["syncedAt"] else "never completed a sync"
        ends = f"ends {r['until']}" if r["until"] else "no end set"
        console.print(f"{safe_text(r['peer'])}: {r['documents']} document(s), {r['bytes']:,}{budget} bytes, "
                      f"{when.replace('from ', '', 1) if r['syncedAt'] else when}, {ends}",
                      highlight=False, markup=False)
    _say_damaged(damaged)


def _say_damaged(damaged: list[dict[str, Any]]) -> None:
    """Each damaged copy of a listing as ``kith`` says every refusal — ``error [code]:
    message`` and its ``hint:`` on stderr (:func:`node.cli.main.print_error`; stdout keeps
    the listing, in --json mode its one document) — then exit 1; nothing when none is."""
    if not damaged:
        return
    from node.cli.main import print_error
    from node.common.errors import error_for

    for r in damaged:
        err = r["error"]
        print_error(error_for(err["code"], err["message"], hint=err.get("hint")))
    raise typer.Exit(1)


@copies_app.command("sync")
@transport_options()
def sync_cmd(
    ctx: typer.Context,
    name: Optional[list[str]] = typer.Argument(None, metavar="[NAME]...", help="Pinned peers to sync (default: every copy kept here)."),
    transport: TransportArgs = TransportArgs(),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, max=86400.0, metavar="SECONDS", help="Give up a peer's sync after this long (what was committed is kept)."),
    as_json: bool = _JSON,
) -> None:
    """Pull the copy each host grants this node: its manifest, then only what changed;
    what the host no longer grants is deleted (and said so). Each document is checked
    against the host's signature before it is kept; a killed or refused sync leaves the
    previous copy whole. Progress on stderr."""
    import anyio

    from node.common.errors import CODES, KithError, UsageError
    from node.guest.copies.store import CopyStore, list_copies
    from node.guest.copies.sync import sync_with_pool
    from node.guest.owner import Guest
    from node.guest.targets import PeerGone, classify_gone

    home = identity_home_of(ctx)
    mode = transport.mode(home, "copies sync")
    names = list(dict.fromkeys(name or [])) or [r["peer"] for r in list_copies(home)]  # each once
    if not names:
        raise UsageError("usage", "name a pinned peer (`kith copies sync NAME`); no copy is kept here yet")
    guest = Guest(home, mode=mode, local=mode.offline)  # the asking side of this process
    guest.load()  # a home without an identity is refused before any peer is asked
    reports: list[dict[str, Any]] = []
    failed = 0

    def _kept(n: str) -> bool:
        try:
            return CopyStore(home, n).exists()
        except KithError:  # not a registry name: never a copy
            return False

    async def main() -> None:
        nonlocal failed
        async with guest.session_pool() as pool:
            for n in names:
                def progress(done: int, total: int, n: str = n) -> None:
                    if total:
                        err_console.print(f"{safe_text(n)}: {done}/{total} document(s)", highlight=False, markup=False)
                try:
                    with anyio.fail_after(timeout):
                        r = await sync_with_pool(pool, n, progress=progress)
                except PeerGone as gone:
                    status, code = classify_gone(gone)
                    r = {"peer": n, "status": status, "code": code or "peer-disconnected"}
                except TimeoutError:
                    r = {"peer": n, "status": "peer-timeout", "code": "peer-timeout"}
                except KithError as exc:
                    r = {"peer": n, "status": "refused", "code": exc.code, "message": exc.message,
                         **({"hint": exc.hint} if exc.hint else {})}
                if r["status"] not in ("ok", "ended") and "hint" not in r and r.get("code") in CODES:
                    r.update({"hint": CODES[r["code"]].hint} if CODES[r["code"]].hint else {})
                reports.append(r)
                if r["status"] not in ("ok", "ended"):
                    failed += 1
                    err_console.print(f"{safe_text(n)}: {r['status']} ({r.get('code')})"
                                      + (f": {safe_text(r['message'])}" if r.get("message") else "")
                                      + (" — the previous copy is kept" if _kept(n) else " — no copy is kept here")
                                      + (f"\n  hint: {safe_text(r['hint'])}" if r.get("hint") else ""),
                                      highlight=False, markup=False)
                elif not as_json:
                    _say_report(r)

    anyio.run(main, backend="asyncio")
    if as_json:
        emit_json({"copies": reports})
    sys.stdout.flush()
    if failed:
        raise typer.Exit(1)


@copies_app.command("remove")
def remove_cmd(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME", help="The peer whose copy to delete."),
               as_json: bool = _JSON) -> None:
    """Delete the copy of NAME kept here (the host's grant is unchanged: a later sync makes it again)."""
    from node.common.errors import ConfigError
    from node.guest.copies.store import CopyStore

    store = CopyStore(home_of(ctx), name)
    if not store.remove():
        raise ConfigError("copy-not-found", f"no copy of {name} is kept here")
    if as_json:
        emit_json({"removed": name})
    else:
        console.print(f"deleted the copy of {safe_text(name)}", highlight=False, markup=False)
