"""Approvals of ``ask``-tier sources and per-peer promotion (DESIGN §10, §13).

Layout under ``<home>/approvals/`` (every file 0600, written tmp+rename):

* ``requests/<id>.json`` — written by the Host when a query's best evidence is ``ask``:
  ``{"id", "peer": {"key", "name"}, "query", "sources": [ids], "createdAt"}``. No chunk
  text, no real path: ``sources`` are canonical (wire) ids.
* ``decisions/<id>.json`` — written by ``kith approvals approve|deny ID [--remember]``:
  the request's fields plus ``{"decision": "approved"|"denied", "remember", "decidedAt"}``.
* ``promoted.json`` — ``{"peers": {"<key>": {"name", "allow": [ids], "deny": [ids]}}}``:
  what ``--remember`` decided for a peer, for every future query (survives restarts).

A decision without ``--remember`` applies to the same peer asking the same query again
(whitespace, Unicode form and case of the query do not matter) for
:data:`DECISION_TTL_S`; with ``--remember`` the sources are promoted (or refused) for
that peer for any query. Only ``ask``-tier sources are ever opened this way: a source
whose rule later becomes ``private`` or ``never`` stays closed whatever was approved.
Peers are identified by public key (a registry name can be re-pinned to another key).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from node.common.errors import ConfigError, PolicyError
from node.common.home import atomic_write, read_json_state, read_regular

APPROVALS_DIR = "approvals"
PROMOTED_FILE = "promoted.json"
#: How long a decision without ``--remember`` answers a repeated query (seconds).
DECISION_TTL_S = 7 * 24 * 3600
#: Open requests kept at once, per peer and in total; beyond, no new file is written
#: (the peer still gets ``pending-approval``; a hostile peer cannot fill the disk).
MAX_PENDING_PER_PEER = 20
MAX_PENDING_TOTAL = 500
#: Sources recorded per request.
MAX_SOURCES_PER_REQUEST = 20
ID_RE = re.compile(r"[0-9a-f]{16}")
#: the shortest id prefix :meth:`Approvals.resolve` accepts
MIN_ID_PREFIX = 4
PREFIX_RE = re.compile(r"[0-9a-f]{%d,16}" % MIN_ID_PREFIX)
MAX_FILE_BYTES = 1 << 20


def query_key(query: str) -> str:
    """The form in which two queries count as "the same query": NFKC, casefolded,
    whitespace runs collapsed to one space, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", query).casefold().split())


def safe_id(text: Any) -> str:
    """``text`` cut to 40 printable ASCII characters, for naming a bad id in a message."""
    return "".join(c if " " <= c <= "~" else "?" for c in str(text)[:40])


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_stamp(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


@dataclass
class ApprovalRequest:
    """One request for the owner's decision.

    Attributes:
        id: 16 lowercase hex (random).
        peer_key: the asking peer's public key (64 hex).
        peer_name: its registry name, or ``None`` for an anonymous peer.
        query: the query text as asked.
        sources: the canonical ids of the ``ask`` sources that would answer it.
        created_at: RFC 3339 UTC.
        decision: ``None`` while pending, else ``"approved"`` / ``"denied"``.
        remember: whether the decision was remembered (promotion).
        decided_at: RFC 3339 UTC of the decision, or ``None``.
        via: the id of the remembered decision that settled this request too (it was
            pending for the same peer and only asked about sources that decision
            promoted or refused), else ``None``.
    """

    id: str
    peer_key: str
    peer_name: str | None
    query: str
    sources: list[str]
    created_at: str
    decision: str | None = None
    remember: bool = False
    decided_at: str | None = None
    via: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of the request (plus the decision fields once decided)."""
        out: dict[str, Any] = {"id": self.id, "peer": {"key": self.peer_key, "name": self.peer_name},
                               "query": self.query, "sources": list(self.sources),
                               "createdAt": self.created_at}
        if self.decision is not None:
            out.update({"decision": self.decision, "remember": self.remember, "decidedAt": self.decided_at})
            if self.via is not None:
                out["via"] = self.via
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> ApprovalRequest | None:
        """Parse a request/decision file's JSON; ``None`` when it is not one."""
        try:
            peer = raw["peer"]
            rid, key, query, sources = raw["id"], peer["key"], raw["query"], raw["sources"]
            if not (isinstance(rid, str) and ID_RE.fullmatch(rid) and isinstance(key, str)
                    and isinstance(query, str) and isinstance(sources, list)
                    and all(isinstance(s, str) for s in sources)):
                return None
            name = peer.get("name")
            decision = raw.get("decision")
            if decision not in (None, "approved", "denied"):
                return None
            via = raw.get("via")
            return cls(rid, key, name if isinstance(name, str) else None, query, list(sources),
                       str(raw.get("createdAt") or ""), decision, bool(raw.get("remember", False)),
                       raw.get("decidedAt") if isinstance(raw.get("decidedAt"), str) else None,
                       via if isinstance(via, str) and ID_RE.fullmatch(via) else None)
        except (KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class Verdicts:
    """What the owner decided for one (peer, query): ids opened and ids refused."""

    allow: frozenset[str] = frozenset()
    deny: frozenset[str] = frozenset()


class Approvals:
    """The approvals folder of one home. Safe to share between sessions of one process.

    Reads are cached per folder modification time, so the Host sees a decision made by
    ``kith approvals`` in another process at its next query.

    Args:
        home: the node home.
    """

    def __init__(self, home: Path) -> None:
        self.root = Path(home) / APPROVALS_DIR
        self.requests_dir = self.root / "requests"
        self.decisions_dir = self.root / "decisions"
        self.promoted_path = self.root / PROMOTED_FILE
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[tuple[int, int, frozenset[str]], dict[str, ApprovalRequest]]] = {}
        self._promoted_cache: tuple[tuple[int, int], dict[str, Any]] | None = None
        self._merged_cache: tuple[tuple[Any, Any], Any] | None = None

    # --- reading ------------------------------------------------------------------------
    @staticmethod
    def _read_json(path: Path) -> Any:
        try:
            data = read_regular(path, MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                return None
            return read_json_state(path, data=data)
        except (OSError, ConfigError):
            return None

    def _load_dir(self, folder: Path) -> dict[str, ApprovalRequest]:
        try:
            st = folder.stat()
            names = frozenset(n for n in os.listdir(folder) if n.endswith(".json"))
        except OSError:
            return {}
        # the names are part of the key: a coarse directory mtime cannot hide a new file
        sig = (st.st_mtime_ns, st.st_ino, names)
        cached = self._cache.get(folder)
        if cached is not None and cached[0] == sig:
            return cached[1]
        out: dict[str, ApprovalRequest] = {}
        for name in names:
            entry = folder / name
            stem = name[:-5]
            if not ID_RE.fullmatch(stem):
                continue
            req = ApprovalRequest.from_dict(self._read_json(entry))
            if req is not None and req.id == stem:
                out[stem] = req
        self._cache[folder] = (sig, out)
        return out

    def _merged(self) -> tuple[dict[str, ApprovalRequest], dict[tuple[str, str], list[ApprovalRequest]]]:
        """Requests by id with decisions merged in, and the decided ones by (peer key,
        query key); rebuilt only when a folder changed. Callers must not mutate them."""
        reqs_dir, decs_dir = self._load_dir(self.requests_dir), self._load_dir(self.decisions_dir)
        cached = self._merged_cache
        if cached is not None and cached[0][0] is reqs_dir and cached[0][1] is decs_dir:
            return cached[1]
        key = (reqs_dir, decs_dir)  # the very dicts _load_dir cached (identity, not equality)
        reqs = {k: dataclasses.replace(v) for k, v in reqs_dir.items()}
        for rid, dec in decs_dir.items():
            base = reqs.get(rid) or dataclasses.replace(dec)
            base.decision, base.remember, base.decided_at = dec.decision, dec.remember, dec.decided_at
            base.via = dec.via
            reqs[rid] = base
        decided: dict[tuple[str, str], list[ApprovalRequest]] = {}
        for req in reqs.values():
            if req.decision is not None:
                decided.setdefault((req.peer_key, query_key(req.query)), []).append(req)
        self._merged_cache = (key, (reqs, decided))
        return reqs, decided

    def requests(self) -> dict[str, ApprovalRequest]:
        """Every request by id (copies), with its decision merged in when there is one."""
        with self._lock:
            return {k: dataclasses.replace(v) for k, v in self._merged()[0].items()}

    def get(self, rid: str) -> ApprovalRequest | None:
        """The request ``rid`` (any spelling that is not 16 lowercase hex → ``None``)."""
        if not isinstance(rid, str) or not ID_RE.fullmatch(rid):
            return None
        return self.requests().get(rid)

    def resolve(self, ref: str) -> str:
        """The full id of the one request whose id starts with ``ref`` (the whole id, or a
        prefix of at least :data:`MIN_ID_PREFIX` hex characters; case-insensitive), so
        the owner can type what ``kith approvals list`` shows or the guest was told.

        Raises:
            PolicyError: ``approval-not-found`` (no match, or ``ref`` is not 4-16 hex),
                ``approval-id-ambiguous`` (more than one request matches).
        """
        text = ref.strip().lower() if isinstance(ref, str) else ""
        if not PREFIX_RE.fullmatch(text):
            raise PolicyError("approval-not-found", f"no approval request {safe_id(ref)!r} "
                                                    f"(an id is 16 hex characters; a unique prefix of "
                                                    f"{MIN_ID_PREFIX} or more also works)")
        matches = sorted(rid for rid in self.requests() if rid.startswith(text))
        if not matches:
            raise PolicyError("approval-not-found", f"no approval request {text!r}")
        if len(matches) > 1:
            shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise PolicyError("approval-id-ambiguous", f"{text!r} matches {len(matches)} requests: {shown}")
        return matches[0]

    def promoted(self, peer_key: str) -> Verdicts:
        """What ``--remember`` decided for ``peer_key``."""
        with self._lock:
            try:
                st = self.promoted_path.stat()
                sig = (st.st_mtime_ns, st.st_ino)
            except OSError:
                return Verdicts()
            if self._promoted_cache is None or self._promoted_cache[0] != sig:
                raw = self._read_json(self.promoted_path)
                peers = raw.get("peers") if isinstance(raw, dict) else None
                self._promoted_cache = (sig, peers if isinstance(peers, dict) else {})
            rec = self._promoted_cache[1].get(peer_key)
        if not isinstance(rec, dict):
            return Verdicts()
        allow = [s for s in rec.get("allow") or [] if isinstance(s, str)]
        deny = [s for s in rec.get("deny") or [] if isinstance(s, str)]
        return Verdicts(frozenset(allow), frozenset(deny))

    def verdicts(self, peer_key: str, query: str, *, now: datetime | None = None) -> Verdicts:
        """Sources opened / refused for ``peer_key`` asking ``query``: remembered decisions
        for any query, plus unexpired decisions on the same query (:func:`query_key`).

        ``promoted.json`` holds the *latest* remembered decision per source, so a
        remembered decision file counts only for sources ``promoted.json`` does not name
        (e.g. when it was lost): ``deny --remember`` followed later by
        ``approve --remember`` of the same source opens it for every query, including
        the first one."""
        now = now or _now()
        qk = query_key(query)
        promoted = self.promoted(peer_key)
        allow, deny = set(promoted.allow), set(promoted.deny)
        named = promoted.allow | promoted.deny
        with self._lock:
            decided = list(self._merged()[1].get((peer_key, qk), ()))
        for req in decided:
            when = _parse_stamp(req.decided_at)
            if req.remember:
                sources = [s for s in req.sources if s not in named]
            elif when is None or now - when > timedelta(seconds=DECISION_TTL_S):
                continue
            else:
                sources = req.sources
            (allow if req.decision == "approved" else deny).update(sources)
        return Verdicts(frozenset(allow - deny), frozenset(deny))

    def pending(self) -> list[ApprovalRequest]:
        """Undecided requests, oldest first."""
        return sorted((r for r in self.requests().values() if r.decision is None),
                      key=lambda r: (r.created_at, r.id))

    # --- writing --------------------------------------------------------------------------
    def request(self, peer_key: str, peer_name: str | None, query: str,
                sources: list[str]) -> ApprovalRequest | None:
        """Record (or reuse) the pending request of ``peer_key`` for ``query``.

        An undecided request of the same peer for the same query whose sources include
        ``sources`` is reused (asking again does not pile up files). Returns ``None`` when
        the caps (:data:`MAX_PENDING_PER_PEER`, :data:`MAX_PENDING_TOTAL`) are reached.
        """
        sources = list(dict.fromkeys(sources))[:MAX_SOURCES_PER_REQUEST]
        qk = query_key(query)
        pending = self.pending()
        for req in pending:
            if req.peer_key == peer_key and query_key(req.query) == qk and set(sources) <= set(req.sources):
                return req
        if (len(pending) >= MAX_PENDING_TOTAL
                or sum(r.peer_key == peer_key for r in pending) >= MAX_PENDING_PER_PEER):
            return None
        req = ApprovalRequest(os.urandom(8).hex(), peer_key, peer_name, query, sources, _stamp(_now()))
        with self._lock:
            atomic_write(self.requests_dir / f"{req.id}.json",
                         json.dumps(req.to_dict(), indent=2, ensure_ascii=False).encode("utf-8") + b"\n")
        return req

    def decide(self, rid: str, approve: bool, *, remember: bool = False) -> ApprovalRequest:
        """Write ``decisions/<rid>.json``; with ``remember`` also promote (or refuse) the
        request's sources for that peer in ``promoted.json``.

        With ``remember``, the peer's other pending requests that only ask about sources
        now promoted (approve) or refused (deny) for it are decided the same way, with
        ``via`` = ``rid`` (specs/approvals.md §3).

        Raises:
            PolicyError: ``approval-not-found`` (unknown or malformed id),
                ``approval-decided`` (already decided).
        """
        req = self.get(rid)
        if req is None:
            raise PolicyError("approval-not-found", f"no approval request {rid!r}")
        if req.decision is not None:
            raise PolicyError("approval-decided", f"request {rid} was already {req.decision}")
        req.decision = "approved" if approve else "denied"
        req.remember = remember
        req.decided_at = _stamp(_now())
        with self._lock:
            atomic_write(self.decisions_dir / f"{req.id}.json",
                         json.dumps(req.to_dict(), indent=2, ensure_ascii=False).encode("utf-8") + b"\n")
            if remember:
                raw = self._read_json(self.promoted_path)
                peers = raw.get("peers") if isinstance(raw, dict) and isinstance(raw.get("peers"), dict) else {}
                rec = peers.get(req.peer_key) if isinstance(peers.get(req.peer_key), dict) else {}
                allow = [s for s in rec.get("allow") or [] if isinstance(s, str)]
                deny = [s for s in rec.get("deny") or [] if isinstance(s, str)]
                for s in req.sources:
                    if approve:
                        deny = [d for d in deny if d != s]
                        allow = allow if s in allow else allow + [s]
                    else:
                        allow = [a for a in allow if a != s]
                        deny = deny if s in deny else deny + [s]
                peers[req.peer_key] = {"name": req.peer_name, "allow": allow, "deny": deny}
                atomic_write(self.promoted_path,
                             json.dumps({"peers": peers}, indent=2, ensure_ascii=False).encode("utf-8") + b"\n")
        if remember:
            self._settle_covered(req, set(allow if approve else deny))
        return req

    def _settle_covered(self, decided: ApprovalRequest, covered: set[str]) -> None:
        """After a remembered decision, decide the same way every other pending request of
        that peer (by key) whose sources are all in ``covered`` (now promoted, or refused,
        for that peer): they would otherwise stay listed as pending though nothing is left
        to decide. Each gets ``decisions/<id>.json`` with ``remember`` and ``via`` = the
        deciding request's id."""
        for other in self.pending():
            if (other.id == decided.id or other.peer_key != decided.peer_key
                    or not other.sources or not set(other.sources) <= covered):
                continue
            other.decision, other.remember = decided.decision, True
            other.decided_at, other.via = decided.decided_at, decided.id
            with self._lock:
                atomic_write(self.decisions_dir / f"{other.id}.json",
                             json.dumps(other.to_dict(), indent=2, ensure_ascii=False).encode("utf-8") + b"\n")


@dataclass
class OwnerDecision:
    """What :func:`decide_as_owner` did.

    Attributes:
        request: the decided request.
        settled: ids of the peer's other pending requests the remembered decision settled.
        closed: the request's sources that are no longer ``ask`` in ``policy.toml`` and
            stay closed although approved (the owner should be told).
    """

    request: ApprovalRequest
    settled: list[str]
    closed: list[str]


def decide_as_owner(home: Path, rid: str, approve: bool, *, remember: bool = False) -> OwnerDecision:
    """The owner's decision on request ``rid`` — the whole id or a unique prefix,
    :meth:`Approvals.resolve` — (``kith approvals approve|deny``, the dashboard):
    :meth:`Approvals.decide`, then the ``approval-decided`` audit record
    (issue 11), then the check of which approved sources policy now keeps closed.

    Raises:
        PolicyError: ``approval-not-found``, ``approval-id-ambiguous``, ``approval-decided``.
    """
    from node.policy.store import Policy
    from node.trust.audit_log import AuditLog

    store = Approvals(home)
    req = store.decide(store.resolve(rid), approve, remember=remember)
    settled = sorted(r.id for r in store.requests().values() if r.via == req.id) if remember else []
    audit = AuditLog(home)
    try:
        audit.record("approval-decided", sync=True, approval_id=req.id, peer=req.peer_key,
                     peer_name=req.peer_name, decision=req.decision, remember=remember,
                     sources=req.sources, settled=settled or None)
    finally:
        audit.close()
    closed: list[str] = []
    if approve:
        policy = Policy.load(home)
        closed = [s for s in req.sources if policy.decide(s, req.peer_name).tier != "ask"]
    return OwnerDecision(req, settled, closed)
