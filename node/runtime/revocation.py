"""Revocation that cuts live sessions (specs/peers.md §5): the running host learns of
``kith peers remove`` / ``kith peers block`` by a cheap ``stat`` of ``peers.json`` and
ends that peer's open sessions with ``session-revoked``.

:class:`PeersWatcher` polls the stamps of
``peers.json`` and ``policy.toml`` (:func:`node.policy.store.file_stamp`, one ``os.stat``
each per :data:`POLL_INTERVAL_S`), diffs the registry and ends the revoked peer's sessions through the host's one session table
(:meth:`node.runtime.sessions.SessionTable.end_sessions`); pending approvals of a
revoked peer are denied (:func:`cancel_approvals`). New handshakes of a blocked key are
refused by the host's admission predicate (``handshake-peer-blocked``), which re-reads the
registry for every connection, so they never depend on the watcher.
"""

from __future__ import annotations

import logging
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
        sessions: the host's :class:`node.runtime.sessions.SessionTable`.
        on_event: the host's event sink; gets ``peer-revoked`` {``peer``, ``peer_name``,
            ``cause`` (``removed`` | ``blocked``), ``code``, ``sessions_ended``,
            ``approvals_cancelled``}, ``policy-reloaded`` {``ok``, ``rules`` | ``code``}
            and ``config-invalid`` {``file``} (the last good registry stays in force).
        interval_s: poll period (s).
        now: Unix time (s) pins' ``until`` is compared with (the host's clock).
    """

    def __init__(self, home: Path, sessions: Any, *, on_event: Callable[[dict[str, Any]], None],
                 interval_s: float = POLL_INTERVAL_S, now: Callable[[], float] | None = None) -> None:
        import time

        self.home = Path(home)
        self.now = now or time.time
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
        """The registry as ``peers.json`` says now, without the pins whose ``until`` has
        passed (:func:`node.trust.peers.pins_in_force`); the last one that loaded when the
        file is broken (a corrupt or half-edited ``peers.json`` never stops the host)."""
        from node.trust.peers import pins_in_force

        try:
            registry = PeerRegistry.load(self.home)
        except ConfigError:
            return pins_in_force(self._registry, self.now())
        self._registry = registry
        return pins_in_force(registry, self.now())

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
        for key, name in sorted(pinned.items()):
            if key not in self._pinned and key not in blocked:
                # newly pinned: its live anonymous sessions are listed under the name from now
                # on (and a later `peers remove` of that name ends them)
                for token in self.sessions.tokens_of(key):
                    self.sessions.rename(token, name)
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


__all__ = ["PeersWatcher", "POLL_INTERVAL_S", "cancel_approvals"]
