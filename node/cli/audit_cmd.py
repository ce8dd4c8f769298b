"""``kith audit``: read the host's audit log ``<home>/audit.jsonl`` (specs/peers.md §7)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import typer

from node.cli.common import err_console, emit_json, home_of, safe_text, untrusted_console as console
from node.common.errors import UsageError

_DURATION_RE = re.compile(r"(\d{1,9})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``30s`` / ``15m`` / ``2h`` / ``7d`` → a timedelta.

    Raises:
        UsageError: ``usage`` for anything else.
    """
    m = _DURATION_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise UsageError("usage", "--since DURATION: a number and a unit s, m, h or d (e.g. 30m, 2h, 7d)")
    return timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])


def _parse_ts(ts: str) -> datetime | None:
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None


_SHOWN = ("post_id", "reason", "code", "cause", "query_id", "status", "sources", "scrubbed", "query", "query_hmac",
          "approval_id", "decision", "pairing_code", "sessions_ended", "approvals_cancelled", "note", "ok", "rules",
          # people, groups and grants that end (issue 22 items 4-6)
          "person", "device_name", "old_person", "via", "kind", "group", "glob", "tier", "until", "added", "removed",
          "seq",
          # what the network learns (issue 23): a session's path and the one before a change
          "path", "previous",
          # what a copy sent (issue 42): how many documents, their ids above
          "documents")


def audit_cmd(
    ctx: typer.Context,
    peer: Optional[str] = typer.Option(None, "--peer", metavar="NAME|KEY", help="Only records of this peer (a registry name, or a 64-hex key)."),
    since: Optional[str] = typer.Option(None, "--since", metavar="DURATION", help="Only records of the last DURATION (30s, 15m, 2h, 7d)."),
    session: Optional[str] = typer.Option(None, "--session", metavar="ID", help="Only records of this session (its id, or a prefix of at least 8 hex)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: {records, skipped}."),
) -> None:
    """Show the audit log: sessions, queries (keyed hashes unless `kith host --audit-queries`),
    source ids served, copies sent (copy-sent: source ids, versions, scrub counts), approvals, revocations, blocks, policy reloads, refused handshakes.
    A corrupt or truncated line is reported and skipped."""
    from node.trust.audit_log import AuditProblem, read_audit
    from node.trust.peers import PeerRegistry

    home = home_of(ctx)
    cutoff = datetime.now(timezone.utc) - parse_duration(since) if since is not None else None
    if session is not None and not re.fullmatch(r"[0-9a-f]{8,64}", session):
        raise UsageError("usage", "--session ID: the session id (64 lowercase hex) or a prefix of at least 8")
    key = name = None
    if peer is not None:
        try:
            key, name = PeerRegistry.load(home).resolve(peer)
        except Exception as exc:  # a removed peer's name is still in old records
            if getattr(exc, "code", None) != "peer-not-found":
                raise
            name = peer

    def keep(rec: dict[str, Any]) -> bool:
        if peer is not None and not ((key is not None and rec.get("peer") == key)
                                     or (name is not None and rec.get("peer_name") == name)):
            return False
        if session is not None and not str(rec.get("session_id") or "").startswith(session):
            return False
        if cutoff is not None:
            ts = _parse_ts(rec["ts"])
            if ts is None or ts < cutoff:
                return False
        return True

    problems: list[AuditProblem] = []
    records = [rec for rec in read_audit(home, problems) if keep(rec)]
    for p in problems:
        err_console.print(f"warning [audit-line-invalid]: {p.file} line {p.line}: {p.message} (skipped)",
                          highlight=False, markup=False)
    if as_json:
        emit_json({"records": records, "skipped": [p.to_dict() for p in problems]})
        return
    if not records:
        console.print("no audit records" + (" match" if (peer or since or session) else ""), highlight=False)
        return
    for rec in records:
        who = rec.get("peer_name") or (str(rec.get("peer"))[:16] + "…" if rec.get("peer") else "-")
        sid = str(rec.get("session_id") or "")[:12] or "-"
        details = " ".join(f"{k}={safe_text(_short(rec[k]))}" for k in _SHOWN if k in rec)
        console.print(f"{safe_text(rec['ts'])}  {safe_text(rec['event']):<17} {safe_text(who):<18} {sid:<12} {details}",
                      highlight=False, markup=False, soft_wrap=True)


def _short(value: Any) -> str:
    if isinstance(value, dict):  # the scrubbing gate's counts: email:2,card:1
        return ",".join(f"{k}:{v}" for k, v in list(value.items())[:10]) or "none"
    if isinstance(value, list):
        return ",".join(str(v) for v in value[:10]) + (f",…(+{len(value) - 10})" if len(value) > 10 else "")
    return str(value)[:200]
