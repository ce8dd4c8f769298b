"""``kith peers``: the trusted peer registry ``<home>/peers.json`` (DESIGN §10, specs/peers.md)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from node.cli.common import (err_console, untrusted_console as console, emit_json, home_of, safe_text,
                             server_option, command_group, json_option)
from node.trust.peers import PeerRegistry, load_own_profile, save_own_profile, set_pin_until


def _cancel_approvals(home, key: str) -> list[str]:
    """Deny the peer's pending approval requests now (a running host also does it when it
    sees the change; specs/peers.md §5), and say so on stderr."""
    from node.host.revocation import cancel_approvals

    ids = cancel_approvals(home, key)
    if ids:
        err_console.print(f"cancelled {len(ids)} pending approval request(s) of that peer", highlight=False)
    return ids


def _warn_pin_end(home, name: str, ends: Optional[str]) -> None:
    """When the pin NAME ends, its key is an anonymous peer: say on stderr which indexed
    sources scrubbed for NAME (and not for every peer) it would then be served unscrubbed
    (specs/policy.md §9.5; a warning, the pin is kept)."""
    if ends is None:
        return
    from node.policy.scrub_coverage import change_unscrubs
    from node.policy.store import Policy

    policy = Policy.load(home)
    lapsed, _ = change_unscrubs(home, policy, policy, served_as={name: None})
    for u in lapsed:
        err_console.print(f"warning: when the pin ends ({ends}) {name}'s key is an anonymous peer; "
                          + u.line().replace(f"{name}: ", "", 1), highlight=False, markup=False, soft_wrap=True)


def _audit(home, event: str, **fields) -> None:
    """Record an owner's registry change in ``<home>/audit.jsonl`` (node/trust/audit_log.py)."""
    from node.trust.audit_log import AuditLog

    log = AuditLog(home)
    log.record(event, sync=True, **fields)
    log.close()

peers_app = command_group(
    "Trusted peers: pin a local name to a peer's public key. Hosts name guests by it "
    "(policy 'peers' rules, `kith host --peers-only`), both sides refuse a pinned name "
    "with a changed key, and known peers' shared profiles are merged after each session."
)

_JSON = json_option()


@peers_app.command("add")
def add_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Local name: 1-64 of [A-Za-z0-9_.-], starting alphanumeric."),
    key: str = typer.Argument(..., help="The peer's public key (64 lowercase hex; `kith init` prints it)."),
    note: str = typer.Option("", "--note", help="Your own note about this peer (never sent)."),
    invite: Optional[str] = typer.Option(None, "--invite", metavar="FILE|POST_ID", help="Keep this invitation of the peer (verified: its host key must be KEY) so `kith ask --peer NAME` can reach it."),
    server: Optional[str] = server_option("The community server the invitation comes from (fetches a POST_ID; asked for a newer invitation when the saved one no longer works). With --devices: where the person's devices post their cards (every device is asked at once).", from_env=False),
    until: Optional[str] = typer.Option(None, "--until", metavar="DATE|DURATION", help="The pin ends then (2027-01-31, 2027-01-31T18:00:00Z, 12h, 7d, 2w): a running host ends its sessions and it is a stranger again."),
    devices: bool = typer.Option(False, "--devices", help="KEY is a person key: every device with a valid binding of it is NAME (one set of tiers, approvals and one quota). Without it KEY is one device's key and another device of that person is a stranger."),
    as_json: bool = _JSON,
) -> None:
    """Pin NAME to KEY (refused when NAME or KEY is already pinned)."""
    from node.common.errors import UsageError
    from node.common.grants import parse_until

    ends = parse_until(until) if until is not None else None  # grant-bad-until before anything is written
    home = home_of(ctx)
    registry = PeerRegistry.load(home)
    inv_doc = None
    if invite is not None:
        import anyio

        from node.common.errors import HandshakeError
        from node.guest.guest import resolve_invitation
        from node.guest.targets import check_invitation

        inv = anyio.run(lambda: resolve_invitation(invite, server_url=server), backend="asyncio")
        if devices:
            _check_person_invite(home, key, inv.host_public_key)
        elif inv.host_public_key != key:
            raise HandshakeError("host-key-changed",
                                 f"the invitation is signed by host key {inv.host_public_key}, "
                                 f"not by the key given ({key})")
        check_invitation(inv, home)  # binding signature, expiry, protocol id (as `kith join`)
        inv_doc = inv.to_dict()
    elif server is not None and not devices:
        raise UsageError("usage", "--server is used with --invite (or with --devices: the person's device cards)")
    if devices:
        from node.trust.peers import pin_person

        rec = pin_person(registry, name, key, note, invitation=inv_doc, server=server)
    else:
        rec = registry.add(name, key, note, invitation=inv_doc, server=server)
    if ends is not None:
        rec = set_pin_until(registry, rec.name, ends)
        _warn_pin_end(home, rec.name, ends)
    if as_json:
        emit_json(registry.to_json(rec))
    else:
        console.print(f"pinned {rec.name} → {'person ' if devices else ''}{rec.public_key[:16]}…"
                      + (" and every device it binds" if devices else ""), highlight=False, markup=False)


@peers_app.command("remove")
def remove_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The local name to remove."),
    yes: bool = typer.Option(False, "--yes", help="Remove it even if its key, then an anonymous peer, would be served sources unscrubbed that are scrubbed for NAME (without it, a terminal asks and anything else is refused)."),
    as_json: bool = _JSON,
) -> None:
    """Remove NAME from the registry. A copy of NAME's sources kept here is deleted (and
    said so). A running host ends its sessions admitted under
    NAME within seconds (session-revoked); it may join again as an anonymous peer — so when
    something is scrubbed for NAME (or its groups) and not for every peer, this says which
    indexed sources its key would then receive unscrubbed and asks first (--yes)."""
    from node.cli.policy_cmd import guarded_write
    from node.common.errors import PolicyError
    from node.policy.store import Policy

    home = home_of(ctx)
    registry = PeerRegistry.load(home)
    if registry.by_name(name) is None:
        raise PolicyError("peer-not-found", f"no peer named {name!r}")
    policy = Policy.load(home)
    removed = []
    guarded_write(home, policy, policy, lambda: removed.append(registry.remove(name)), yes=yes,
                  served_as={name: None})
    rec = removed[0]
    cancelled = _cancel_approvals(home, rec.public_key)
    _audit(home, "peer-removed", peer=rec.public_key, peer_name=rec.name, approvals_cancelled=cancelled or None)
    from node.guest.copies.lifecycle import end_copies

    ended: list[dict] = []  # its copy kept here goes with it (specs/copies.md §5)
    end_copies(home, peer=rec.name, via="peer-removed", notify=ended.append)
    if as_json:
        emit_json({"name": rec.name, "removed": True,
                   "copyRemoved": sum(n["removed"] for n in ended) if ended else None})
    else:
        console.print(f"removed {rec.name}", highlight=False, markup=False)
        for n in ended:
            err_console.print(f"kith: {n['text']}", highlight=False, markup=False)


@peers_app.command("block")
def block_cmd(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="KEY|NAME", help="A pinned name, or a public key (64 lowercase hex)."),
    note: str = typer.Option("", "--note", help="Why (your own note, never sent)."),
    as_json: bool = _JSON,
) -> None:
    """Block a key: a running host ends its sessions within seconds (session-revoked),
    cancels its pending approvals and refuses its new handshakes (handshake-peer-blocked)
    until `kith peers unblock`. A pinned peer stays pinned."""
    home = home_of(ctx)
    registry = PeerRegistry.load(home)
    rec = registry.block(target, note)
    cancelled = _cancel_approvals(home, rec.public_key)
    _audit(home, "peer-blocked", peer=rec.public_key, peer_name=rec.name, note=rec.note or None,
           approvals_cancelled=cancelled or None)
    if as_json:
        emit_json({**registry.block_json(rec), "blocked": True})
    else:
        # the key once: after the name when there is one, alone otherwise
        who = f"{rec.name} ({rec.public_key[:16]}…)" if rec.name else rec.public_key[:16] + "…"
        console.print(f"blocked {who}", highlight=False, markup=False)


@peers_app.command("unblock")
def unblock_cmd(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="KEY|NAME", help="The blocked key, or the name it was blocked under."),
    as_json: bool = _JSON,
) -> None:
    """Lift a block (peer-not-blocked when that key is not blocked)."""
    home = home_of(ctx)
    registry = PeerRegistry.load(home)
    rec = registry.unblock(target)
    _audit(home, "peer-unblocked", peer=rec.public_key, peer_name=rec.name)
    if as_json:
        emit_json({**registry.block_json(rec), "blocked": False})
    else:
        console.print(f"unblocked {rec.name or rec.public_key[:16] + '…'}", highlight=False, markup=False)


@peers_app.command("code")
def code_cmd(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="NAME|KEY", help="A pinned name, or a public key (64 lowercase hex)."),
    as_json: bool = _JSON,
) -> None:
    """Print the pairing code of this node and a peer: five words both owners read aloud
    to check they hold each other's real key (specs/peers.md §6). For a person pin
    (`--devices`) the words are per device — those each device and this one compare —
    so each device seen so far is listed with its own."""
    from node.trust.identity import load_identity
    from node.trust.pairing import pairing_code

    home = home_of(ctx)
    registry = PeerRegistry.load(home)
    key, name = registry.resolve(target)
    own = load_identity(home).public_key
    rec = registry.peers.get(name) if name is not None else None
    if rec is not None and rec.devices:  # a person key: no device ever shows words of it
        devices = [{"key": k, "name": d["name"], "pairing_code": pairing_code(own, k)}
                   for k, d in sorted(rec.seen_devices.items(), key=lambda kd: (kd[1]["firstSeen"], kd[0]))]
        if as_json:
            emit_json({"name": name, "publicKey": key, "ownPublicKey": own, "pairing_code": None,
                       "devices": devices})
            return
        if not devices:
            console.print(f"{name} is a person pin: its words are per device, and none of its devices has "
                          "joined yet (each shows its words when it connects; `kith status` lists them per "
                          "session)", highlight=False, markup=False)
            return
        console.print(f"{name} is a person pin: each device has its own words (those it and this node compare)",
                      highlight=False, markup=False)
        for d in devices:
            console.print(f"  {safe_text(d['name'])} ({d['key'][:16]}…): {d['pairing_code']}",
                          highlight=False, markup=False)
        return
    code = pairing_code(own, key)
    if as_json:
        emit_json({"name": name, "publicKey": key, "ownPublicKey": own, "pairing_code": code})
    else:
        console.print(code, highlight=False, markup=False)


@peers_app.command("list")
def list_cmd(
    ctx: typer.Context,
    rank: Optional[str] = typer.Option(None, "--rank", metavar="QUERY",
                                       help="Only peers matching QUERY, best first (name, note, shared profile)."),
    as_json: bool = _JSON,
) -> None:
    """List pinned peers (by name, or ranked by --rank QUERY)."""
    registry = PeerRegistry.load(home_of(ctx))
    from node.trust.revocation_list import revoked_seen_devices

    revoked = revoked_seen_devices(home_of(ctx), registry)
    from node.trust.card import CardStore

    cards = CardStore.load(home_of(ctx))  # each device's card: when it last answered here (specs/peers.md §13)

    def reach(rec, key: str) -> dict:
        entry = cards.devices_of(rec.public_key).get(key)
        return {"card": entry is not None, "online": bool(entry and entry.online),
                "lastSeen": entry.last_seen if entry else None, "lastFailed": entry.last_failed if entry else None}
    if rank is not None:
        rows = [(score, rec) for score, rec in registry.rank(rank)]
    else:
        rows = [(None, rec) for _, rec in sorted(registry.peers.items())]
    if as_json:
        out = []
        groups = _groups_by_member(home_of(ctx))
        for score, rec in rows:
            item = registry.to_json(rec)
            item["groups"] = [{"group": g, "until": u} for g, u in sorted(groups.get(rec.name, {}).items())]
            for dev in item.get("seenDevices", []):
                dev["revoked"] = dev["key"] in revoked.get(rec.name, ())
                dev.update(reach(rec, dev["key"]))
            if score is not None:
                item["score"] = score
            out.append(item)
        emit_json({"peers": out, "blocked": [registry.block_json(b) for _, b in sorted(registry.blocked.items())]})
        return
    blocked = sorted(registry.blocked.values(), key=lambda b: (b.name or "", b.public_key))
    if not rows:
        console.print("no peers" + (" match" if rank is not None else " pinned"), highlight=False)
    if blocked and rank is None:
        for b in blocked:
            console.print(f"blocked: {b.public_key[:16]}…" + (f" ({b.name})" if b.name else "") +
                          (f" — {b.note}" if b.note else "") + f"  since {b.blocked_at}", highlight=False, markup=False)
    if not rows:
        return
    groups = _groups_by_member(home_of(ctx))
    table = Table("name", "key", "display name", "note", "profile synced", "groups", "until", box=None,
                  header_style="bold")
    for _, rec in rows:
        table.add_row(rec.name, ("person " if rec.devices else "") + rec.public_key[:16] + "…",
                      rec.profile.get("displayName", ""), rec.note, rec.profile_synced_at or "-",
                      _groups_text(groups.get(rec.name, {})), _until_text(rec.until))
        for dev in registry.to_json(rec)["seenDevices"]:  # a person pin's devices seen so far
            mark = "  REVOKED" if dev["key"] in revoked.get(rec.name, ()) else ""
            seen = reach(rec, dev["key"])
            state = ("online" if seen["online"] else "offline") + (f", last seen {seen['lastSeen']}"
                                                                    if seen["lastSeen"] else ", never answered here")
            table.add_row("", f"  device {dev['key'][:16]}…", dev["name"],
                          f"first seen {dev['firstSeen']}{mark}; {state}" if seen["card"]
                          else f"first seen {dev['firstSeen']}{mark}", "", "", "")
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


# ------------------------------------------------------------ grants that end, groups (issue 22 item 5)
from typing import List  # noqa: E402 - typer reads the annotations below from the module
def _until_text(until: Optional[str]) -> str:
    """``-`` (never ends), the end, or ``ended <end>``."""
    from node.common.grants import until_text

    return until_text(until, still="") or "-"


def _groups_by_member(home) -> dict:
    """Registry name → {group name: membership end | None} (``policy.toml``; an
    unreadable policy shows no groups)."""
    from node.common.errors import KithError
    from node.policy.store import Policy

    try:
        return Policy.load(home).groups_by_member()
    except KithError:
        return {}


def _groups_text(groups: dict) -> str:
    """``@team (until <end>)``, or ``(ended <end>)`` once the membership ended."""
    from node.common.grants import until_text

    return ", ".join(f"@{g}" + (f" ({until_text(u)})" if u else "")
                     for g, u in sorted(groups.items())) or "-"


@peers_app.command("until")
def until_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A pinned name."),
    until: str = typer.Argument(..., metavar="DATE|DURATION|never", help="When the pin ends (as `kith peers add --until`), or 'never'."),
    as_json: bool = _JSON,
) -> None:
    """Set (or lift, with 'never') when the pin NAME ends. A running host ends its
    sessions when it does (session-grant-expired)."""
    from node.common.grants import parse_until

    ends = None if until == "never" else parse_until(until)
    home = home_of(ctx)
    rec = set_pin_until(PeerRegistry.load(home), name, ends)
    _warn_pin_end(home, rec.name, ends)
    _audit(home, "grant-changed", kind="pin", peer=rec.public_key, peer_name=rec.name, until=ends)
    if as_json:
        emit_json(PeerRegistry.load(home).to_json(rec))
    else:
        console.print(f"{rec.name}: " + (f"pinned until {ends}" if ends else "pinned with no end"),
                      highlight=False, markup=False)


group_app = typer.Typer(help="Groups of peers: policy overrides, 'peers' rules and quotas name them as @NAME.",
                        no_args_is_help=True)
peers_app.add_typer(group_app, name="group")


def _group_json(group) -> dict:
    return {"group": group.name, "members": [{"name": m, "until": u} for m, u in sorted(group.members.items())]}


@group_app.command("add")
def group_add_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The group (made when new)."),
    peers: List[str] = typer.Argument(..., metavar="PEER...", help="Pinned peer names (whatever each pins)."),
    until: Optional[str] = typer.Option(None, "--until", metavar="DATE|DURATION", help="These memberships end then (as `kith peers add --until`)."),
    yes: bool = typer.Option(False, "--yes", help="Make the change even if it would serve indexed sources unscrubbed that a scrub entry covered (without it, a terminal asks and anything else is refused)."),
    as_json: bool = _JSON,
) -> None:
    """Add PEERs to group NAME (in policy.toml). Rules then name the group with
    `--for @NAME` / `--peer @NAME`; a running host applies it from its next query. A
    membership's --until ends what the group grants, never what it scrubs."""
    from node.cli.policy_cmd import guarded_write
    from node.common.grants import parse_until
    from node.policy.store import Policy

    ends = parse_until(until) if until is not None else None
    home = home_of(ctx)
    before = Policy.load(home)
    policy = Policy.load(home)
    group = policy.add_members(name, list(peers), ends)
    guarded_write(home, before, policy, policy.save, yes=yes)
    registry = PeerRegistry.load(home)
    unpinned = sorted({p for p in peers if registry.by_name(p) is None})
    for p in unpinned:
        err_console.print(f"warning: no pinned peer is named {p}: the membership applies to nobody until one is",
                          highlight=False, markup=False)
    _audit(home, "group-changed", group=name, added=sorted(set(peers)), until=ends)
    if as_json:
        emit_json({**_group_json(group), "unpinnedPeers": unpinned})
    else:
        console.print(f"@{name}: " + ", ".join(f"{m}" + (f" (until {u})" if u else "")
                                               for m, u in sorted(group.members.items())),
                      highlight=False, markup=False)


@group_app.command("remove")
def group_remove_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The group."),
    peers: Optional[List[str]] = typer.Argument(None, metavar="[PEER...]", help="Members to remove (none: the whole group)."),
    yes: bool = typer.Option(False, "--yes", help="Remove them even if indexed sources scrubbed for @NAME would then reach them unscrubbed (without it, a terminal asks and anything else is refused)."),
    as_json: bool = _JSON,
) -> None:
    """Remove PEERs from group NAME, or the whole group. Rules naming @NAME stay (they then
    match nobody). A running host applies it from its next query. When something is
    scrubbed for @NAME, says which indexed sources the removed members would then receive
    unscrubbed and asks first (--yes)."""
    from node.cli.policy_cmd import guarded_write
    from node.policy.store import Policy

    home = home_of(ctx)
    before = Policy.load(home)
    policy = Policy.load(home)
    policy.remove_members(name, list(peers or ()))
    guarded_write(home, before, policy, policy.save, yes=yes)
    _audit(home, "group-changed", group=name, removed=sorted(set(peers or ())) or None, deleted=not peers or None)
    left = policy.groups.get(name)
    if as_json:
        emit_json(_group_json(left) if left is not None else {"group": name, "members": [], "removed": True})
    else:
        console.print(f"@{name}: " + (", ".join(sorted(left.members)) if left and left.members else
                                      "removed" if left is None else "no members"), highlight=False, markup=False)


@group_app.command("list")
def group_list_cmd(ctx: typer.Context, as_json: bool = _JSON) -> None:
    """List the groups, their members and when each membership ends."""
    from node.policy.store import Policy

    policy = Policy.load(home_of(ctx))
    groups = [policy.groups[n] for n in sorted(policy.groups)]
    if as_json:
        emit_json({"groups": [_group_json(g) for g in groups]})
        return
    if not groups:
        console.print("no groups (`kith peers group add NAME PEER...`)", highlight=False, markup=False)
    for g in groups:
        console.print(f"@{g.name}", highlight=False, markup=False)
        for m, u in sorted(g.members.items()):
            console.print(f"  {m}  until {_until_text(u)}", highlight=False, markup=False)


# ------------------------------------------------------------------ people (issue 22)
def _check_person_invite(home, person_key: str, host_key: str) -> None:
    """``kith peers add NAME KEY --devices --invite``: the invitation's host key must be
    KEY or a device this home knows KEY bound (this home's own person's devices; a binding
    is verified where it was received). Raises ``host-key-changed`` otherwise."""
    from node.common.errors import HandshakeError
    from node.trust.peers import known_device_of

    if known_device_of(home, person_key, host_key):
        return
    raise HandshakeError("host-key-changed",
                         f"the invitation's host key {host_key} is not {person_key} nor a device this home "
                         "knows it bound", hint="pin the person without --invite; its devices are recognised "
                         "by the binding chain they present when they connect")


@peers_app.command("import-revocation")
def import_revocation_cmd(
    ctx: typer.Context,
    file: str = typer.Argument(..., metavar="FILE", help="A revocation list (`kith device revoke --out FILE` wrote it; '-' reads stdin)."),
    as_json: bool = _JSON,
) -> None:
    """Take a person's revocation list by hand: its devices are refused from now on
    (handshake-device-revoked) and a running host ends their live sessions within a second
    (session-device-revoked). An older list than the one kept is refused (revocation-stale)."""
    import json
    import sys
    from pathlib import Path

    from node.common.errors import ConfigError, KithError
    from node.runtime.clock import SYSTEM_CLOCK, rfc3339
    from node.trust.revocation_list import MAX_LIST_BYTES, RevocationStore, check_list

    home = home_of(ctx)
    try:
        data = sys.stdin.buffer.read(MAX_LIST_BYTES * 2) if file == "-" else Path(file).read_bytes()[:MAX_LIST_BYTES * 2]
        doc = json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError("file-not-found", f"no such file: {file}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: "[[[[…"
        raise KithError("revocation-malformed", "the file is not a JSON revocation list") from None
    checked = check_list(doc)
    store = RevocationStore.load(home)
    offered = store.offer(checked, via="import", now=rfc3339(SYSTEM_CLOCK.time()))
    if offered.outcome == "stale":
        kept = store.list_for(checked.person)
        raise KithError("revocation-stale", f"this home keeps list {kept['seq'] if kept else '?'} of that person; "
                        f"list {checked.seq} is older and never replaces it")
    registry = PeerRegistry.load(home)
    from node.trust.peers import person_pin

    pin = person_pin(registry, checked.person)
    _audit(home, "revocation-imported", person=checked.person, peer_name=pin.name if pin else None,
           seq=checked.seq, devices=offered.newly_revoked or None)
    from node.guest.copies.lifecycle import end_copies

    ended: list[dict] = []  # copies held from a revoked device's host key go (specs/copies.md §5)
    for key in offered.newly_revoked:
        end_copies(home, host_key=key, via="device-revoked", notify=ended.append)
    for n in ended:
        err_console.print(f"kith: {n['text']}", highlight=False, markup=False)
    out = {"person": checked.person, "peer_name": pin.name if pin else None, "seq": checked.seq,
           "outcome": offered.outcome, "revoked": list(checked.revoked), "newly_revoked": offered.newly_revoked}
    if as_json:
        emit_json(out)
        return
    who = pin.name if pin else f"person {checked.person[:16]}…"
    if offered.outcome == "same":
        console.print(f"{who}: revocation list {checked.seq} is kept already", highlight=False, markup=False)
    else:
        console.print(f"{who}: revocation list {checked.seq} kept; {len(offered.newly_revoked)} device(s) newly "
                      f"revoked ({len(checked.revoked)} in all)", highlight=False, markup=False)
