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

import math

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from node.common.errors import HandshakeError

#: Live sessions a host serves at once (``HostOptions.max_sessions``).
MAX_CONCURRENT_SESSIONS = 64
#: Live sessions one peer key may hold at once.
MAX_SESSIONS_PER_PEER = 4
#: Default share of the session slots anonymous peers (keys not in the registry) may hold
#: together: the rest is kept for pinned peers (``kith host --anonymous-slots``).
ANONYMOUS_SHARE = 0.75
#: A READY anonymous session with no answered query for this long may be evicted when a
#: newcomer needs its slot (s; ``kith host --evict-idle-after``).
EVICT_IDLE_AFTER_S = 30.0
#: A session still in its handshake is evicted for a newcomer only once it is this old (s):
#: an honest handshake takes milliseconds on loopback and a few round trips elsewhere, so a
#: flood of newcomers cannot evict honest handshakes, only stalled ones.
HANDSHAKE_GRACE_S = 1.0
#: An anonymous key one of whose sessions was evicted may not evict an idle session itself
#: for this many ``evict_idle_after_s`` (it may still take a free slot).
EVICTED_KEY_PAUSE = 4
#: Failed handshakes (a live post named, then verification failed) one key may have before
#: it is refused for :data:`FAILURE_COOLDOWN_S` (``kith host --max-failed-handshakes``);
#: also what retires a single-use or file-mode post.
MAX_FAILED_HANDSHAKES = 10
#: How long a key over the failure cap is refused (s; ``kith host --failure-cooldown``).
FAILURE_COOLDOWN_S = 600.0
#: Keys whose failures are remembered at once; the least recently failing is forgotten
#: beyond (bounded memory under a flood of throw-away keys).
MAX_FAILURE_KEYS = 4096
#: The refusal codes that make a handshake *failed* once it named a live post: the guest
#: did not prove who it is (issue 11). Refusals that are the host's own decision
#: (busy, not admitted, expired, unknown post) are not failures.
FAILURE_CODES = frozenset({
    "handshake-key-mismatch", "handshake-bad-nonce", "handshake-nonce-reused", "handshake-bad-signature",
    "handshake-malformed", "handshake-protocol-mismatch", "handshake-session-mismatch",
    "handshake-unexpected-frame", "handshake-timeout", "handshake-first-frame",
    "peer-disconnected",  # hung up before _session_ready: the proof is missing
})


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
    anonymous: bool = False
    ready: bool = False
    last_active: float = 0.0
    opened: float = 0.0
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
        anonymous_sessions: slots anonymous peers may hold together (``kith host
            --anonymous-slots``); None = :data:`ANONYMOUS_SHARE` of ``max_sessions``
            (at least 1). Pinned peers may use every slot.
        evict_idle_after_s: how long a READY anonymous session must have answered no
            query before a newcomer may evict it (``kith host --evict-idle-after``).
        max_failures / failure_cooldown_s: after ``max_failures`` failed handshakes a key
            is refused (``handshake-too-many-failures``) for ``failure_cooldown_s`` s.
        retire_on_failures: a post that collects ``max_failures`` failed handshakes from
            any keys is retired (stops being honoured). The host sets it for file mode and
            for single-use posts only: post ids are public in ``browse``, so a stranger
            must never be able to rotate a public multi-use post.
    """

    max_sessions: int = MAX_CONCURRENT_SESSIONS
    max_sessions_per_peer: int = MAX_SESSIONS_PER_PEER
    post_max_sessions: int | None = None
    anonymous_sessions: int | None = None
    evict_idle_after_s: float = EVICT_IDLE_AFTER_S
    max_failures: int = MAX_FAILED_HANDSHAKES
    failure_cooldown_s: float = FAILURE_COOLDOWN_S
    retire_on_failures: bool = False

    @property
    def anonymous_limit(self) -> int:
        """The effective bound on anonymous slots (never more than ``max_sessions``)."""
        if self.anonymous_sessions is not None:
            return max(0, min(self.anonymous_sessions, self.max_sessions))
        return max(1, int(self.max_sessions * ANONYMOUS_SHARE))


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
    #: peer key -> (failed handshakes since the last cool-down, cool-down end), LRU order
    _failures: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: post_id -> failed handshakes that named it; and the posts retired for it
    _post_failures: dict[str, int] = field(default_factory=dict)
    #: anonymous key -> when one of its sessions was last evicted (bounded, oldest dropped)
    _evicted: dict[str, float] = field(default_factory=dict)
    _retired: set[str] = field(default_factory=set)

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
                     alive: Callable[[], bool] = lambda: True, *, anonymous: bool = False) -> str | None:
        """Take a session slot for the stream of connection ``token``.

        Fair admission (issue 11): anonymous peers together hold at most
        ``anonymous_limit`` slots, so a pinned peer always finds one. When the slots a
        newcomer may use are all taken, room is made, in this order: the oldest session
        still in its handshake, if at least :data:`HANDSHAKE_GRACE_S` old, is ended with
        ``handshake-host-busy`` (an honest handshake takes milliseconds; ``session-refused``
        event, ``reason: "evicted"``), else the
        READY anonymous session idle the longest — if idle for at least
        ``evict_idle_after_s`` — is ended with ``session-evicted`` (``session-evicted``
        event). A pinned peer's READY session is never evicted, an anonymous newcomer
        only ever evicts anonymous sessions, and a key one of whose sessions was evicted
        evicts none itself for :data:`EVICTED_KEY_PAUSE` × ``evict_idle_after_s``.

        Returns:
            None when a slot was taken (release it with :meth:`close_session`), else the
            refusal code to send at once: ``handshake-too-many-failures`` (``peer`` is in
            its cool-down; :meth:`cooldown_left`), ``handshake-peer-busy`` (``peer`` holds
            ``max_sessions_per_peer`` already) or ``handshake-host-busy`` (no slot could
            be freed).
        """
        if self.cooldown_left(peer) > 0:
            return "handshake-too-many-failures"
        if self.sessions_of(peer) >= self.limits.max_sessions_per_peer:
            return "handshake-peer-busy"
        # a key whose session was just evicted may not evict another one in turn: throw-away
        # attackers would otherwise keep every anonymous slot young by evicting each other
        evicts = not (anonymous and self.clock() - self._evicted.get(peer, -math.inf)
                      < EVICTED_KEY_PAUSE * self.limits.evict_idle_after_s)
        if anonymous and self.anonymous_sessions >= self.limits.anonymous_limit \
                and not self._make_room(anonymous_only=True, idle=evicts):
            return "handshake-host-busy"
        if len(self._slots) >= self.limits.max_sessions and \
                not self._make_room(anonymous_only=anonymous, idle=evicts):
            return "handshake-host-busy"
        now = self.clock()
        self._slots[token] = _Slot(peer=peer, end=end, alive=alive, anonymous=anonymous, last_active=now,
                                   opened=now)
        return None

    def _make_room(self, *, anonymous_only: bool, idle: bool = True) -> bool:
        return self._evict_oldest_handshake(anonymous_only) or (idle and self._evict_idlest(anonymous_only))

    def _evict_oldest_handshake(self, anonymous_only: bool) -> bool:
        now = self.clock()
        for token, slot in list(self._slots.items()):
            if slot.ready or slot.ended or not slot.alive() or (anonymous_only and not slot.anonymous):
                continue
            if now - slot.opened < HANDSHAKE_GRACE_S:
                return False  # the oldest handshake is young (in order: so are the rest)
            slot.ended = True
            slot.end("handshake-host-busy", "evicted: the host is full and this handshake is the oldest")
            self._release(token)
            self.on_event({"event": "session-refused", "peer": slot.peer, "code": "handshake-host-busy",
                           "reason": "evicted"})
            return True
        return False

    def _evict_idlest(self, anonymous_only: bool) -> bool:
        now = self.clock()
        idle = [(slot.last_active, token) for token, slot in self._slots.items()
                if slot.ready and slot.anonymous and not slot.ended and slot.alive()
                and now - slot.last_active >= self.limits.evict_idle_after_s]
        if not idle:
            return False
        last_active, token = min(idle)
        slot = self._slots[token]
        slot.ended = True
        slot.end("session-evicted", "evicted: the host needed this idle anonymous session's slot")
        self._release(token)
        self._evicted.pop(slot.peer, None)
        self._evicted[slot.peer] = now
        while len(self._evicted) > MAX_FAILURE_KEYS:
            self._evicted.pop(next(iter(self._evicted)))
        self.on_event({"event": "session-evicted", "peer": slot.peer, "code": "session-evicted",
                       "idle_s": round(now - last_active, 3)})
        return True

    def note_activity(self, token: int) -> None:
        """The session answered a query (not ``rate-limited``): it is not idle. Safe to
        call from a hook's worker thread (one attribute store)."""
        slot = self._slots.get(token)
        if slot is not None:
            slot.last_active = self.clock()

    @property
    def anonymous_sessions(self) -> int:
        """Slots anonymous peers hold now."""
        return sum(1 for s in self._slots.values() if s.anonymous)

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
        slot.last_active = self.clock()
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

    # ------------------------------------------------------------ failed handshakes
    def record_failure(self, peer: str, post_id: str, code: str) -> str | None:
        """A handshake of ``peer`` that named the live post ``post_id`` ended with ``code``.

        Counts it when ``code`` is in :data:`FAILURE_CODES`: the key's ``max_failures``-th
        failure starts its cool-down (and resets its count); with ``retire_on_failures``,
        the post's ``max_failures``-th failure (from any keys) retires it.

        Returns:
            ``post_id`` when this failure retired it (the host withdraws and replaces it
            with a server, or stops accepting in file mode), else None.
        """
        if code not in FAILURE_CODES:
            return None
        now = self.clock()
        count, until = self._failures.pop(peer, (0, 0.0))
        count += 1
        if count >= self.limits.max_failures:
            count, until = 0, now + self.limits.failure_cooldown_s
        self._failures[peer] = (count, until)  # most recently failing last
        while len(self._failures) > MAX_FAILURE_KEYS:
            self._failures.pop(next(iter(self._failures)))
        if not self.limits.retire_on_failures or post_id in self._retired:
            return None
        self._post_failures[post_id] = self._post_failures.get(post_id, 0) + 1
        if self._post_failures[post_id] >= self.limits.max_failures:
            self._retired.add(post_id)
            return post_id
        return None

    def cooldown_left(self, peer: str) -> float:
        """Seconds ``peer`` is still refused for failed handshakes (0 = none)."""
        _count, until = self._failures.get(peer, (0, 0.0))
        return max(0.0, until - self.clock())

    def succeeded(self, peer: str) -> None:
        """``peer`` completed a handshake: its failure count starts again from 0 (a
        cool-down in force is not lifted; it could not have got this far)."""
        count, until = self._failures.get(peer, (0, 0.0))
        if count and until <= self.clock():
            del self._failures[peer]

    def retired(self, post_id: str) -> bool:
        """``post_id`` collected ``max_failures`` failed handshakes and is not honoured."""
        return post_id in self._retired

    # ------------------------------------------------------------ the predicate
    @staticmethod
    def admits(registry: Any, peers_only: bool, key: str, profile: dict[str, Any]) -> bool:
        """May guest ``key`` open a session once its ``_session_init`` is read? (DESIGN §6, §10)

        The one admission predicate (the engine's ``HostConfig.admit``). Raises
        :class:`HandshakeError` ``handshake-peer-blocked`` for a blocked key (``kith peers
        block``, specs/peers.md) and ``peer-key-changed`` for a guest whose key is not
        pinned but whose shared ``displayName`` claims a pinned name; with ``peers_only``,
        returns False (→ ``handshake-not-admitted``) for a key not in ``registry``.
        """
        if registry.is_blocked(key):
            raise HandshakeError("handshake-peer-blocked", "this key is blocked")
        if registry.claimed_by_other(key, profile) is not None:
            raise HandshakeError("peer-key-changed", "a pinned peer name with a different key")
        return not peers_only or registry.by_key(key) is not None


class ActivityTracked:
    """A knowledge handle that tells :class:`Admission` when it answered a query: every
    ``search`` whose status is not ``rate-limited`` calls ``note()`` (a rate-limited
    answer is not activity, so a session kept alive by over-quota queries stays idle), and
    every ``search`` calls ``count(status)`` when given.
    Other attributes pass through to ``inner``."""

    def __init__(self, inner: Any, note: Callable[[], None],
                 count: Callable[[str], None] | None = None) -> None:
        self._inner = inner
        self._note = note
        self._count = count

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        """``inner.search(request)``; see :meth:`node.answer.service.Knowledge.search`.
        ``count(status)`` (when given) is told every answer's status (the owner's per-session
        counts, :meth:`node.runtime.revocation.LiveSessions.count`)."""
        result = self._inner.search(request)
        status = result.get("status") if isinstance(result, dict) else None
        if status != "rate-limited":
            self._note()
        if self._count is not None:
            self._count(str(status or "unknown")[:64])
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def admission(registry: Any, peers_only: bool) -> Callable[[str, dict[str, Any]], bool]:
    """The host's ``HostConfig.admit``: :meth:`Admission.admits` bound to ``registry``."""
    return lambda key, profile: Admission.admits(registry, peers_only, key, profile)


__all__ = ["ActivityTracked", "Admission", "AdmissionLimits", "ANONYMOUS_SHARE", "EVICT_IDLE_AFTER_S",
           "FAILURE_CODES", "HANDSHAKE_GRACE_S", "FAILURE_COOLDOWN_S", "MAX_FAILED_HANDSHAKES", "MAX_CONCURRENT_SESSIONS", "MAX_SESSIONS_PER_PEER", "admission"]
