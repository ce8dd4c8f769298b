"""Revocation that cuts live sessions (specs/peers.md §5): the running host learns of
``kith peers remove`` / ``kith peers block`` by a cheap ``stat`` of ``peers.json`` and
ends that peer's open sessions with ``session-revoked``.

:class:`LiveSessions` is the host's table of every session from its first frame to its end
(``end_sessions(peer_key, code)`` aborts them); :class:`PeersWatcher` polls the stamps of
``peers.json`` and ``policy.toml`` (:func:`node.policy.store.file_stamp`, one ``os.stat``
each per :data:`POLL_INTERVAL_S`), diffs the registry and revokes; pending approvals of a
revoked peer are denied (:func:`cancel_approvals`). New handshakes of a blocked key are
refused by the host's admission predicate (``handshake-peer-blocked``), which re-reads the
registry for every connection, so they never depend on the watcher.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio

from node.common.errors import ConfigError, KithError, PolicyError
from node.policy.store import file_stamp
from node.trust.peers import PEERS_FILE, PeerRegistry

log = logging.getLogger("kith.revocation")

#: How often the host stats ``peers.json`` and ``policy.toml`` (s): a revocation ends
#: live sessions within about this long (the issue asks for 5 s).
POLL_INTERVAL_S = 0.5


@dataclass
class _Live:
    engine: Any
    scope: anyio.CancelScope
    peer: str
    name: str | None  # the registry name the peer had when it connected
    session_id: str | None = None
    revoked: str | None = None  # the code it was ended with
    ended_at: float | None = None  # Unix time (s) of the revocation
    since: float | None = None  # Unix time (s) it became ready
    pairing_code: str | None = None
    queries: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


class LiveSessions:
    """The host's sessions by connection token, from the first frame to their end.

    The host calls :meth:`add` once the session's engine exists, :meth:`ready` when it
    is ready, :meth:`discard` when it ended; :meth:`end_sessions` ends the ones of a key
    (revocation), :meth:`end_session` one session by id (the owner's ``kith sessions
    end``), both through the same abort. :meth:`listing` is what the control channel
    shows (node/runtime/control.py). All calls run in the host's event loop, except
    :meth:`count`, which a hook's worker thread calls.
    """

    def __init__(self) -> None:
        self._by_token: dict[int, _Live] = {}

    def add(self, token: int, engine: Any, scope: anyio.CancelScope, peer: str, name: str | None) -> None:
        """Track a new session of ``peer`` admitted under registry ``name`` (or None)."""
        self._by_token[token] = _Live(engine, scope, peer, name)

    def ready(self, token: int, session_id: str, pairing_code: str | None = None) -> None:
        """The session of ``token`` finished its handshake (``pairing_code``: the safety
        code both sides can compare, :func:`node.trust.pairing.pairing_code`)."""
        live = self._by_token.get(token)
        if live is not None:
            live.session_id = session_id
            live.since = time.time()
            live.pairing_code = pairing_code

    def count(self, token: int, status: str) -> None:
        """The session of ``token`` answered one query with ``status`` (``ok``,
        ``rate-limited``, ...). Called from a hook's worker thread (GIL-atomic updates)."""
        live = self._by_token.get(token)
        if live is not None:
            live.queries += 1
            live.statuses[status] = live.statuses.get(status, 0) + 1

    def listing(self) -> list[dict[str, Any]]:
        """The ready sessions still running, oldest first: ``[{"id", "peer": {"name",
        "key"}, "tier" ("pinned" | "anonymous"), "since" (RFC 3339), "queries",
        "statuses", "safetyCode"}]`` (the control channel's shape, specs/control.md)."""
        from node.runtime.control import rfc3339

        out = []
        for live in self._by_token.values():
            if live.session_id is None or live.revoked is not None or live.engine.closed:
                continue
            row: dict[str, Any] = {"id": live.session_id, "peer": {"name": live.name, "key": live.peer},
                                   "tier": "pinned" if live.name is not None else "anonymous",
                                   "since": rfc3339(live.since or time.time()), "queries": live.queries,
                                   "statuses": dict(live.statuses)}
            if live.pairing_code:
                row["safetyCode"] = live.pairing_code
            out.append(row)
        return out

    def end_session(self, session_id: str, code: str, message: str) -> bool:
        """End the ready session ``session_id`` now with ``code`` (as :meth:`end_sessions`
        ends a key's). Returns False when no such session is running."""
        for live in self._by_token.values():
            if live.session_id == session_id and live.revoked is None and not live.engine.closed:
                self._end(live, code, message)
                return True
        return False

    def _end(self, live: _Live, code: str, message: str) -> None:
        live.engine.abort(code, message)
        live.revoked, live.ended_at = code, time.time()
        live.scope.cancel()

    def discard(self, token: int) -> None:
        """The session of ``token`` ended (idempotent)."""
        self._by_token.pop(token, None)

    def revoked(self, token: int) -> str | None:
        """The code the session of ``token`` was ended with by :meth:`end_sessions` or
        :meth:`end_session`, or None."""
        live = self._by_token.get(token)
        return live.revoked if live is not None else None

    def revoked_outcome(self, token: int) -> Any:
        """How a session ended by :meth:`end_sessions` / :meth:`end_session` ended, as the driver would have
        said (a :class:`node.runtime.driver.SessionOutcome`), or None when it was not."""
        from node.runtime.driver import SessionOutcome

        live = self._by_token.get(token)
        if live is None or live.revoked is None:
            return None
        ev = live.engine.close_event
        return SessionOutcome(session_id=live.session_id, reason=ev.reason if ev else "aborted",
                              code=live.revoked, message=ev.message if ev else "", ended_at=live.ended_at)

    def peers(self) -> dict[str, set[str | None]]:
        """Live peer key → the registry names its sessions were admitted under."""
        out: dict[str, set[str | None]] = {}
        for live in self._by_token.values():
            out.setdefault(live.peer, set()).add(live.name)
        return out

    def end_sessions(self, peer_key: str, code: str = "session-revoked", *,
                     handshake_code: str | None = None, admitted_as: str | None = None) -> int:
        """End every live session of ``peer_key`` now.

        A ready session is told ``_error code``; one still in its handshake gets
        ``_session_reject handshake_code`` (default: ``code``). Whatever a hook is still
        computing for it is dropped: the engine is closed, so its reply is never sent
        (the driver delivers hook output only to an open engine), and the session's
        cancel scope ends its tasks (the queued ``_error`` is still flushed).

        Args:
            peer_key: 64 hex.
            code / handshake_code: the codes sent (``session-revoked``, ``handshake-peer-blocked``).
            admitted_as: end only the sessions admitted under this registry name (a
                removed peer's sessions admitted anonymously after the change stay);
                None = all of them (a block).

        Returns:
            How many sessions were ended.
        """
        n = 0
        for live in list(self._by_token.values()):
            if live.peer != peer_key or live.revoked is not None or live.engine.closed:
                continue
            if admitted_as is not None and live.name != admitted_as:
                continue
            sent = code if live.session_id is not None else (handshake_code or code)
            self._end(live, sent, "the host revoked this peer")
            n += 1
        return n


def cancel_approvals(home: Path, peer_key: str) -> list[str]:
    """Deny every pending approval request of ``peer_key`` (a revoked peer's requests
    must not be approvable later). Returns the ids denied."""
    from node.policy.approvals import Approvals

    store = Approvals(home)
    out = []
    for req in store.pending():
        if req.peer_key != peer_key:
            continue
        try:
            store.decide(req.id, False)
        except PolicyError:  # decided meanwhile by `kith approvals`
            continue
        out.append(req.id)
    return out


class PeersWatcher:
    """Polls ``peers.json`` (and ``policy.toml``) while the host runs.

    Args:
        home: the node home.
        sessions: the host's :class:`LiveSessions`.
        on_event: the host's event sink; gets ``peer-revoked`` {``peer``, ``peer_name``,
            ``cause`` (``removed`` | ``blocked``), ``code``, ``sessions_ended``,
            ``approvals_cancelled``}, ``policy-reloaded`` {``ok``, ``rules`` | ``code``}
            and ``config-invalid`` {``file``} (the last good registry stays in force).
        interval_s: poll period (s).
    """

    def __init__(self, home: Path, sessions: LiveSessions, *, on_event: Callable[[dict[str, Any]], None],
                 interval_s: float = POLL_INTERVAL_S) -> None:
        self.home = Path(home)
        self.sessions = sessions
        self.on_event = on_event
        self.interval_s = interval_s
        self._peers_stamp = file_stamp(self.home / PEERS_FILE)
        self._policy_stamp = file_stamp(self.home / "policy.toml")
        registry = PeerRegistry.load(self.home)
        self._registry = registry
        self._pinned = {r.public_key: r.name for r in registry.peers.values()}
        self._blocked = set(registry.blocked)
        self._bad_stamp: Any = None

    def current(self) -> PeerRegistry:
        """The registry as ``peers.json`` says now; the last one that loaded when the file
        is broken (a corrupt or half-edited ``peers.json`` never stops the host)."""
        try:
            registry = PeerRegistry.load(self.home)
        except ConfigError:
            return self._registry
        self._registry = registry
        return registry

    async def run(self) -> None:
        """Poll until cancelled; never raises for a bad file."""
        while True:
            await anyio.sleep(self.interval_s)
            try:
                self.poll()
            except KithError as exc:  # e.g. approvals unreadable: keep serving
                log.warning("revocation check failed: %s", exc.code)

    def poll(self) -> list[dict[str, Any]]:
        """One check. Returns the ``peer-revoked`` events it emitted."""
        self._poll_policy()
        stamp = file_stamp(self.home / PEERS_FILE)
        if stamp == self._peers_stamp:
            return []
        try:
            registry = PeerRegistry.load(self.home)
        except ConfigError:
            if stamp != self._bad_stamp:  # say so once per broken version of the file
                self._bad_stamp = stamp
                log.warning("%s is not valid; the host keeps the registry it last read", PEERS_FILE)
                self.on_event({"event": "config-invalid", "file": PEERS_FILE})
            return []
        self._peers_stamp = stamp
        self._registry = registry
        pinned = {r.public_key: r.name for r in registry.peers.values()}
        blocked = set(registry.blocked)
        out: list[dict[str, Any]] = []
        for key in sorted(blocked - self._blocked):
            n = self.sessions.end_sessions(key, "session-revoked", handshake_code="handshake-peer-blocked")
            out.append(self._revoked(key, self._pinned.get(key) or registry.blocked[key].name, "blocked",
                                     "session-revoked", n))
        for key, name in sorted(self._pinned.items()):
            if key in blocked or pinned.get(key) == name:
                continue
            # unpinned (or pinned under another name): sessions admitted under the old name end
            n = self.sessions.end_sessions(key, "session-revoked", admitted_as=name)
            out.append(self._revoked(key, name, "removed", "session-revoked", n))
        self._pinned, self._blocked = pinned, blocked
        return out

    def _revoked(self, key: str, name: str | None, cause: str, code: str, n: int) -> dict[str, Any]:
        ev = {"event": "peer-revoked", "peer": key, "peer_name": name, "cause": cause, "code": code,
              "sessions_ended": n, "approvals_cancelled": cancel_approvals(self.home, key)}
        self.on_event(ev)
        return ev

    def _poll_policy(self) -> None:
        stamp = file_stamp(self.home / "policy.toml")
        if stamp == self._policy_stamp:
            return
        self._policy_stamp = stamp
        from node.policy.store import Policy

        try:
            policy = Policy.load(self.home)
        except KithError as exc:
            self.on_event({"event": "policy-reloaded", "ok": False, "code": exc.code})
            return
        self.on_event({"event": "policy-reloaded", "ok": True, "rules": len(policy.rules)})


__all__ = ["LiveSessions", "PeersWatcher", "POLL_INTERVAL_S", "cancel_approvals"]
