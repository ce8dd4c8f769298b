"""The host's admission: who may take a session slot, and who gives one up.

:class:`Admission` is the bookkeeping ``serve_host`` used to keep in closures: connections
waiting for their first stream, session slots (overall and per peer key), the reserved
use count of each post, and the order in which sessions are evicted. It does no I/O and
never sleeps: what it decides is carried out through callbacks the host passes in
(``close`` a connection, ``end`` a session), and time is an injected clock, so every rule
here is tested without iroh (``tests/test_admission.py``).

The admission predicate (:meth:`Admission.admits`) is the one place that decides whether a
guest key may open a session once its ``_session_init`` is read (DESIGN §6, §10).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from node.common.errors import HandshakeError

#: Live sessions a host serves at once (``HostOptions.max_sessions``).
MAX_CONCURRENT_SESSIONS = 64
#: Live sessions one peer key may hold at once.
MAX_SESSIONS_PER_PEER = 4


@dataclass
class _Slot:
    """One session slot: a connection whose stream is open and whose session runs.

    Attributes:
        peer: the QUIC-authenticated peer key (64 hex).
        end: ``(code, message)`` → ends that session now (the host aborts its engine and
            cancels it); called at most once.
        ready: the session reached READY (the handshake completed).
        alive: False once the session is ending on its own (its engine closed): such a
            handshake is not evicted, it is leaving anyway.
        post: the post whose use count this session reserved, or None.
    """

    peer: str
    end: Callable[[str, str], None]
    alive: Callable[[], bool] = lambda: True
    ready: bool = False
    post: str | None = None
    ended: bool = False


@dataclass
class AdmissionLimits:
    """The numbers :class:`Admission` enforces.

    Attributes:
        max_sessions: session slots overall (``HostOptions.max_sessions``); also the size
            of the pool of connections that have not opened their stream yet.
        max_sessions_per_peer: slots one peer key may hold.
        post_max_sessions: sessions one post admits (the invitation's ``max_sessions``;
            1 = single-use), or None for unlimited.
    """

    max_sessions: int = MAX_CONCURRENT_SESSIONS
    max_sessions_per_peer: int = MAX_SESSIONS_PER_PEER
    post_max_sessions: int | None = None


@dataclass
class Admission:
    """Slots, reservations and evictions of one host process (not thread-safe: call it
    from the host's event loop only).

    Args:
        limits: the bounds.
        on_event: receives the host events this class decides (``session-refused`` with
            ``reason: "evicted"``), as ``serve_host``'s ``on_event``.
        clock: monotonic seconds (injectable for tests).
    """

    limits: AdmissionLimits
    on_event: Callable[[dict[str, Any]], None] = lambda _ev: None
    clock: Callable[[], float] = time.monotonic
    #: connections without a stream yet, oldest first: token -> (peer, evict callback)
    _pending: dict[int, tuple[str, Callable[[], None]]] = field(default_factory=dict)
    #: session slots in the order they were taken: token -> slot
    _slots: dict[int, _Slot] = field(default_factory=dict)
    #: post_id -> sessions reserved (at _session_init) or kept (once ready)
    _claimed: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------ pending connections
    def connection_arrived(self, token: int, peer: str, evict: Callable[[], None]) -> None:
        """A QUIC connection was accepted; it waits for its first stream. When the pool of
        such connections is full (``max_sessions``), the *oldest* is evicted: ``evict`` of
        that one is called (the host cancels its wait and closes it with QUIC reason
        ``handshake-host-busy``) and a ``session-refused`` event with ``reason: "evicted"``
        is emitted. ``peer`` may be "" when iroh cannot name it."""
        if len(self._pending) >= self.limits.max_sessions:
            oldest = next(iter(self._pending))
            old_peer, old_evict = self._pending.pop(oldest)
            old_evict()
            self.on_event({"event": "session-refused", "peer": old_peer, "code": "handshake-host-busy",
                           "reason": "evicted"})
        self._pending[token] = (peer, evict)

    def connection_done(self, token: int) -> None:
        """The connection opened its stream, failed, or was evicted: it leaves the pool."""
        self._pending.pop(token, None)

    @property
    def pending(self) -> int:
        """Connections still waiting for their first stream."""
        return len(self._pending)

    # ------------------------------------------------------------ session slots
    def open_session(self, token: int, peer: str, end: Callable[[str, str], None],
                     alive: Callable[[], bool] = lambda: True) -> str | None:
        """Take a session slot for the stream of connection ``token``.

        When every slot is taken, the oldest session still in its handshake is ended with
        ``handshake-host-busy`` (an honest handshake takes milliseconds) to make room.

        Returns:
            None when a slot was taken (release it with :meth:`close_session`), else the
            refusal code to send at once: ``handshake-host-busy`` (every slot holds a
            ready session) or ``handshake-peer-busy`` (``peer`` holds
            ``max_sessions_per_peer`` already).
        """
        if len(self._slots) >= self.limits.max_sessions and not self._evict_oldest_handshake():
            return "handshake-host-busy"
        if self.sessions_of(peer) >= self.limits.max_sessions_per_peer:
            return "handshake-peer-busy"
        self._slots[token] = _Slot(peer=peer, end=end, alive=alive)
        return None

    def _evict_oldest_handshake(self) -> bool:
        for token, slot in list(self._slots.items()):
            if slot.ready or slot.ended or not slot.alive():
                continue
            slot.ended = True
            slot.end("handshake-host-busy", "evicted: the host is full and this handshake is the oldest")
            self._release(token)
            self.on_event({"event": "session-refused", "peer": slot.peer, "code": "handshake-host-busy",
                           "reason": "evicted"})
            return True
        return False

    def claim_post(self, token: int, post_id: str) -> bool:
        """Reserve one use of ``post_id`` for this session (its ``_session_init`` named it).

        Returns False when the session reserved a post already or the post is used up
        here (``post_max_sessions``): the host enforces the use count itself, not only
        the community server, and concurrent handshakes cannot overshoot it.
        """
        slot = self._slots.get(token)
        if slot is None or slot.post is not None:
            return False
        limit = self.limits.post_max_sessions
        if limit is not None and self._claimed.get(post_id, 0) >= limit:
            return False
        self._claimed[post_id] = self._claimed.get(post_id, 0) + 1
        slot.post = post_id
        return True

    def reserved_post(self, token: int) -> str | None:
        """The post this session reserved, or None."""
        slot = self._slots.get(token)
        return slot.post if slot is not None else None

    def session_ready(self, token: int) -> bool:
        """The session completed its handshake: its reservation is kept for good.

        Returns:
            True when its post is now used up here (``post_max_sessions`` reached).
        """
        slot = self._slots.get(token)
        if slot is None:
            return False
        slot.ready = True
        limit = self.limits.post_max_sessions
        return slot.post is not None and limit is not None and self._claimed.get(slot.post, 0) >= limit

    def close_session(self, token: int) -> None:
        """The session ended (any way): its slot is free again, and a post reservation of a
        session that never became ready is given back. Idempotent."""
        self._release(token)

    def _release(self, token: int) -> None:
        slot = self._slots.pop(token, None)
        if slot is not None and slot.post is not None and not slot.ready:
            self._claimed[slot.post] -= 1

    def end_sessions(self, peer: str, code: str, message: str = "") -> int:
        """End every live session (handshaking or ready) of ``peer`` with ``code`` (e.g.
        a revocation). Returns how many were ended; their slots are free at once."""
        ended = 0
        for token, slot in list(self._slots.items()):
            if slot.peer != peer or slot.ended:
                continue
            slot.ended = True
            slot.end(code, message)
            self._release(token)
            ended += 1
        return ended

    def sessions_of(self, peer: str) -> int:
        """Slots ``peer`` holds now."""
        return sum(1 for s in self._slots.values() if s.peer == peer)

    @property
    def sessions(self) -> int:
        """Slots taken now (sessions handshaking or ready)."""
        return len(self._slots)

    def claimed(self, post_id: str) -> int:
        """Uses of ``post_id`` reserved or kept now."""
        return self._claimed.get(post_id, 0)

    # ------------------------------------------------------------ the predicate
    @staticmethod
    def admits(registry: Any, peers_only: bool, key: str, profile: dict[str, Any]) -> bool:
        """May guest ``key`` open a session once its ``_session_init`` is read? (DESIGN §6, §10)

        The one admission predicate (the engine's ``HostConfig.admit``). Raises
        :class:`HandshakeError` ``peer-key-changed`` for a guest whose key is not pinned
        but whose shared ``displayName`` claims a pinned name; with ``peers_only``,
        returns False (→ ``handshake-not-admitted``) for a key not in ``registry``.
        """
        if registry.claimed_by_other(key, profile) is not None:
            raise HandshakeError("peer-key-changed", "a pinned peer name with a different key")
        return not peers_only or registry.by_key(key) is not None


def admission(registry: Any, peers_only: bool) -> Callable[[str, dict[str, Any]], bool]:
    """The host's ``HostConfig.admit``: :meth:`Admission.admits` bound to ``registry``."""
    return lambda key, profile: Admission.admits(registry, peers_only, key, profile)


__all__ = ["Admission", "AdmissionLimits", "MAX_CONCURRENT_SESSIONS", "MAX_SESSIONS_PER_PEER", "admission"]
