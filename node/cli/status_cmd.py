"""``kith status`` and ``kith sessions``: the owner's view of this node and of its running
host (read over the control channel, node/host/control.py; specs/control.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from node.cli.common import emit_json, home_of, list_options_only, untrusted_console
from node.common.errors import KithError

sessions_app = typer.Typer(help="Live sessions of the running `kith host` (list; `end ID`).",
                           invoke_without_command=True, no_args_is_help=False)


def _print(line: str) -> None:
    # peer names and ids come from peers: never markup, never control characters, never wrapped
    untrusted_console.print(line, soft_wrap=True)


def _identity(home: Path) -> dict[str, Any] | None:
    from node.trust.identity import load_identity
    from node.trust.person import load_person

    try:
        ident = load_identity(home)
    except KithError as exc:
        if exc.code == "home-not-initialized":
            return None
        raise
    from node.trust.revocation_list import own_devices

    person = load_person(home)
    # person.json lost beside person.key: `kith person show` refuses it config-invalid with
    # the repair; status names that code instead of leaving the person out without a word
    person_error = "config-invalid" if person is None and (home / "person.key").exists() else None
    return {"fingerprint": ident.fingerprint, "key": ident.public_key,
            "person": person.person_key if person is not None else None, "personError": person_error,
            "devices": [{k: d[k] for k in ("name", "key", "this", "revoked")}
                        for d in (own_devices(home, person, ident.public_key) if person is not None else [])],
            "rotations": len(person.successors) if person is not None else 0}


def _index(home: Path) -> dict[str, Any]:
    """The corpus as this home's files say (``kith index status`` in short)."""
    from node.corpus.store import Corpus

    try:
        with Corpus(home, readonly=True) as corpus:
            with corpus.record.faults():
                stats = corpus.stats()
                roots = [f"/{r.prefix}/" for r in corpus.roots()]
    except KithError as exc:
        return {"ready": False, "roots": [], "documents": 0, "chunks": 0, "failed": 0, "lastSync": None,
                "error": exc.code}
    return {"ready": bool(stats.get("ready")), "roots": roots, "documents": stats.get("documents", 0),
            "chunks": stats.get("chunks", 0), "failed": stats.get("failed", 0), "lastSync": stats.get("last_sync")}


def _host_files(home: Path) -> list[dict[str, Any]]:
    """The host's state databases of this home that do not read (``quota.sqlite``,
    ``seen-nonces.sqlite``, ``sealed-seen.sqlite``: what ``kith host`` refuses to start
    on, specs/error-codes.md ``config-invalid``), probed as the host probes them — read
    only, writing nothing (:func:`node.common.dbfaults.probe_state_db`).

    Returns:
        ``[{"file", "code", "message", "hint"}]``, one per damaged file; [] when all read
        (a missing file reads: it is made empty when first needed).
    """
    from node.policy.quota import QuotaStore
    from node.trust import sealed_seen, seen_nonces

    out = []
    for kind, name in ((QuotaStore, QuotaStore.FILE_NAME), (seen_nonces.SeenNonces, seen_nonces.FILE_NAME),
                       (sealed_seen.DurableSeen, sealed_seen.FILE_NAME)):
        try:
            kind(home)  # its constructor only probes the file: nothing is opened for writing
        except KithError as exc:
            out.append({"file": name, "code": exc.code, "message": exc.message, "hint": exc.hint})
    return out


def _policy(home: Path, host: dict[str, Any] | None) -> dict[str, Any]:
    """``{"ok", "rules", "groups", "code", "message", "inForce"}``: policy.toml as it reads
    now, and ``inForce`` — the running host's ``{"rules", "groups"}`` (its last good
    policy when the file is broken), or null without a host (specs/control.md)."""
    from node.policy.store import Policy

    try:
        policy = Policy.load(home)
        out: dict[str, Any] = {"ok": True, "rules": len(policy.rules), "groups": len(policy.groups),
                               "code": None, "message": None}
    except KithError as exc:
        out = {"ok": False, "rules": None, "groups": None, "code": exc.code, "message": exc.message}
    out["inForce"] = host.get("policy") if host is not None else None
    return out


def _policy_line(p: dict[str, Any], host_running: bool) -> str:
    if p["ok"]:
        return f"policy: {p['rules']} rule(s), {p['groups']} group(s)"
    line = f"policy: policy.toml is not valid ({p['code']}: {p['message']}); "
    held = p.get("inForce")
    if held is not None:
        return line + (f"the running host keeps the last good policy it read ({held['rules']} rule(s), "
                       f"{held['groups']} group(s)) until the file is fixed (`kith policy check`)")
    if host_running:
        return line + "the running host keeps the last good policy it read until the file is fixed"
    return line + "`kith host` refuses to start until it is fixed (`kith policy check`)"


def _host_state(home: Path) -> dict[str, Any] | None:
    """The running host's state, or None when no host runs (``host-not-running``)."""
    from node.host.control import ControlClient

    try:
        return ControlClient(home).state()
    except KithError as exc:
        if exc.code == "host-not-running":
            return None
        raise


def status_report(home: Path) -> dict[str, Any]:
    """``kith status --json``: ``{"home", "identity": {"fingerprint", "key" (this device),
    "person" (the person key, null before `kith init` migrated the home), "devices":
    [{"name", "key", "this", "revoked"}] (the devices that person bound; ``revoked`` by a
    list kept here, :func:`node.trust.revocation_list.own_devices`), "rotations" (how many times
    its key was rotated)} | null,
    "index": {...}, "host": <state document> | null, "approvals": [...], "grants": [{"kind"
    ("pin" | "group" | "override"), "peer_name", "group"?, "glob"?, "tier"?, "until",
    "ended"}], "policy": {"ok", "rules", "groups", "code", "message", "inForce"}}``
    (specs/control.md; ``grants``: every grant with an end, soonest first, specs/peers.md
    §12; ``policy``: :func:`_policy`; ``sharing``: scrub rules, copy grants and who was
    sent copies, :func:`node.host.grants.sharing_report`; ``kept``: this node's copies of
    peers and its outbox, :func:`node.guest.kept.kept_report`; ``hostFiles``: the host's
    state databases that do not read, :func:`_host_files`). Works without a running host
    (``host`` null)."""
    from node.guest.kept import kept_report
    from node.host.control import pending_approvals
    from node.host.grants import sharing_report

    host = _host_state(home)
    return {"home": str(home), "identity": _identity(home), "index": _index(home), "host": host,
            "approvals": host["approvals"] if host is not None else pending_approvals(home),
            "grants": _grants(home), "policy": _policy(home, host), "hostFiles": _host_files(home),
            "sharing": sharing_report(home), "kept": kept_report(home)}


def _grants(home: Path) -> list[dict[str, Any]]:
    """Every grant of this home that ends, soonest first (:func:`node.host.grants.grants_with_ends`)."""
    from node.common.grants import ended
    from node.host.grants import grants_with_ends

    rows = [{**{k: v for k, v in g.items() if k != "names"}, "ended": ended(g["until"])}
            for g in grants_with_ends(home)]
    return sorted(rows, key=lambda g: (g["until"], g["kind"], g["peer_name"]))


def _grant_line(g: dict[str, Any]) -> str:
    from node.common.grants import until_text

    when = until_text(g["until"])
    if g["kind"] == "pin":
        return f"  pin {g['peer_name']} {when}"
    if g["kind"] == "group":
        return f"  {g['peer_name']} in @{g['group']} {when}"
    return f"  override {g['glob']} → {g['tier']} for {g['peer_name']} {when}"


def _peer(row: dict[str, Any]) -> str:
    peer = row.get("peer") or {}
    name = peer.get("name")
    key = str(peer.get("key") or "")
    out = f"{name} ({key[:16]}…)" if name else f"{key[:16]}…"  # the tier column says anonymous
    person = peer.get("person")
    if peer.get("viaPerson") and isinstance(person, dict):  # a person pin's device (specs/peers.md §10)
        return f"{name}'s device {str(person.get('deviceName') or '')!r} ({key[:16]}…)"
    if isinstance(person, dict) and person.get("key"):  # a verified binding chain (specs/peers.md §9)
        out += f" person {str(person['key'])[:16]}… device {str(person.get('deviceName') or '')!r}"
    return out


def _path(path: Any) -> str:
    """A session's path for people: ``direct``, ``relayed via URL`` or ``path unknown``
    (the peer's address stays in ``--json``)."""
    from node.transport.paths import PathInfo

    if not isinstance(path, dict) or path.get("kind") not in ("direct", "relayed"):
        return "path unknown"
    return PathInfo(str(path["kind"]), relay_url=path.get("relayUrl")).describe()


def _session_lines(sessions: list[dict[str, Any]]) -> list[str]:
    from node.host.control import short_ids

    ids = short_ids([s["id"] for s in sessions])
    out = []
    for s in sessions:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(s.get("statuses", {}).items())) or "none"
        quota = s.get("quotaLeft") or {}
        left = f"{quota['queries']}/{quota['burst']} (refills {quota['queriesPerHour']}/h)" \
            if "queries" in quota else "?"
        line = (f"  {ids[s['id']]}  {_peer(s)}  {s['tier']}  since {s['since']}  {_path(s.get('path'))}  "
                f"queries {s['queries']} "
                f"({statuses})  quota left {left}")
        if s.get("pairingCode"):
            line += f"  pairing code {s['pairingCode']}"
        out.append(line)
    return out


def status_cmd(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show this node: identity, roots and index, the running host with its posts, live
    sessions and pending approvals ("host: not running" when no `kith host` runs), the
    scrub rules, copy grants and peers sent copies, and the copies and outbox kept here."""
    report = status_report(home_of(ctx))
    if json_out:
        emit_json(report)
        return
    from node.trust.revocation_list import device_marks

    ident, index, host = report["identity"], report["index"], report["host"]
    _print(f"home: {report['home']}")
    _print(f"identity: {ident['fingerprint']}  ({ident['key']})" if ident else
           "identity: none (run `kith init`)")
    if ident and ident.get("person"):
        devices = ", ".join(d["name"] + device_marks(d).replace("  ", " ") for d in ident["devices"])
        _print(f"person: {ident['person']}  devices: {devices}"
               + (f"  rotated {ident['rotations']} time(s)" if ident["rotations"] else ""))
    elif ident and ident.get("personError"):
        _print(f"person: unreadable [{ident['personError']}] (`kith person show` says why and how to repair it)")
    _print(_policy_line(report["policy"], host is not None))
    for f in report["hostFiles"]:  # what `kith host` refuses to start on, said before it is started
        _print(f"host file: {f['message']} [{f['code']}], `kith host` refuses to start on it"
               + (f" — hint: {f['hint']}" if f["hint"] else ""))
    roots = " ".join(index["roots"]) or "none (`kith index add PATH`)"
    if index.get("error"):  # a damaged or unreadable record: its code, and where the repair is said
        _print(f"index: unreadable [{index['error']}] (`kith index status` says why and how to repair it)")
    else:
        _print(f"index: {'ready' if index['ready'] else 'not ready'}, roots {roots}, documents {index['documents']}, "
               f"chunks {index['chunks']}" + (f", failed {index['failed']}" if index.get("failed") else ""))
    if host is None:
        _print("host: not running")
    else:
        node = host["node"]
        warm = "ready" if host["index"].get("ready") else "warming up" if host["index"].get("documents") else \
            "no index"
        _print(f"host: running (pid {node['pid']}, since {node['startedAt']}), index {warm}")
        t = host.get("transport") or {}
        if t.get("mode"):
            relay = ""
            if t.get("relays"):
                relay = f", relays {' '.join(t['relays'])} " + ("(reached: " + t["homeRelay"] + ")" if t.get("homeRelay")
                                                               else "(not reached)")
            _print(f"  transport: {t['mode']}" + (" relay-only" if t.get("relayOnly") else "") + relay
                   + (f", discovery {t['discovery']}" if t.get("mode") == "lan" else "")
                   + f", presence {t.get('presence', 'open')}")
        for post in host["posts"]:
            where = f" on {post['server']}" if post.get("server") else " (invitation file)"
            _print(f"  post {post['postId']}{where}, expires {post.get('expiresAt') or '?'}")
        _print(f"sessions: {len(host['sessions'])}")
        for line in _session_lines(host["sessions"]):
            _print(line)
    _print(f"approvals pending: {len(report['approvals'])}")
    for a in report["approvals"]:
        _print(f"  {a['id']}  {_peer(a)}  since {a['since']}  {a.get('source') or ''}")
    if report["grants"]:
        _print(f"grants that end: {len(report['grants'])}")
        for g in report["grants"]:
            _print(_grant_line(g))
    for line in _sharing_lines(report["sharing"]) + _kept_lines(report["kept"]):
        _print(line)


def _sharing_lines(s: dict[str, Any]) -> list[str]:
    from node.common.grants import until_text

    out = []
    if s["scrubs"]:
        out.append(f"scrub rules: {len(s['scrubs'])}")
        out += [f"  {', '.join(r['kinds'])} for {r['for']}" + (f" in {r['glob']}" if r["glob"] else "")
                for r in s["scrubs"]]
    if s["copyGrants"]:
        out.append(f"copy grants: {len(s['copyGrants'])}")
        out += [f"  {c['glob']} for {c['for']}" + (f" {until_text(c['until'])}" if c["until"] else "")
                + (f", at most {c['maxBytes']} bytes" if c["maxBytes"] is not None else "") for c in s["copyGrants"]]
    if s["copiesSent"]:
        seen = s.get("copiesSentFrom") or {}
        scope = "" if seen.get("whole", True) else \
            f" (from the audit log's last {seen['bytes'] >> 20} MiB; `kith audit` for all)"
        out.append(f"copies sent (peers that may hold them){scope}: {len(s['copiesSent'])}")
        out += [f"  {r['peer_name'] or str(r['peer'])[:16] + '…'}: {r['documents']} document(s), last sent "
                f"{r['lastSentAt']}" for r in s["copiesSent"]]
    return out


def _kept_lines(k: dict[str, Any]) -> list[str]:
    from node.common.grants import until_text

    out = []
    if k["copies"]:
        out.append(f"copies kept here: {len(k['copies'])}")
        for c in k["copies"]:
            if c.get("error"):
                out.append(f"  {c.get('peer') or '?'}: unreadable [{c['error']['code']}] (`kith copies list`)")
            else:
                out.append(f"  {c['peer']}: {c['documents']} document(s), {c['bytes']} bytes, synced "
                           f"{c.get('syncedAt') or 'never'}" + (f", {until_text(c['until'])}" if c.get("until") else ""))
    o = k["outbox"]
    if o is not None:
        out.append(f"outbox: unreadable [{o['error']}] (`kith outbox list`)" if "error" in o else
                   f"outbox: {o['questions']} question(s) kept, {o['open']} delivery(ies) waiting")
    return out


@sessions_app.callback()
def sessions_cmd(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the running host's live sessions (ids, peer, since, queries, statuses, quota left)."""
    if ctx.invoked_subcommand is not None:
        list_options_only(ctx)
        return
    from node.host.control import ControlClient

    sessions = ControlClient(home_of(ctx)).state()["sessions"]
    if json_out:
        emit_json({"sessions": sessions})
        return
    if not sessions:
        _print("no live sessions")
        return
    for line in _session_lines(sessions):
        _print(line.strip())


@sessions_app.command("end")
def sessions_end_cmd(
    ctx: typer.Context,
    session_id: str = typer.Argument(..., metavar="ID", help="Session id, or a unique prefix of it (≥ 4 digits)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """End one live session now: the guest is told `session-ended-by-owner`."""
    from node.host.control import ControlClient

    out = ControlClient(home_of(ctx)).end_session(session_id)
    if json_out:
        emit_json(out)
        return
    _print(f"ended session {out['ended']} of {_peer(out)}")


__all__ = ["sessions_app", "status_cmd", "status_report"]
