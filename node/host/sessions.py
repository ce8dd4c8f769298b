"""The host's session table: the one place that knows who is connected.

:class:`SessionTable` holds every session of one host process from the moment its stream
opens to its end: admission slots (overall, per peer key, the anonymous share), fair
eviction, activity, the reserved use count of each post, failed-handshake cool-downs,
live revocation (``kith peers remove|block``), the owner's ``kith sessions end`` and what
the control channel lists. There is one way to end a session from outside —
:meth:`SessionTable.end` — and every rule above uses it. The table does no I/O and never
sleeps: it carries out its decisions through the ``end`` callback each connection gives
it, and time is the host's injected :class:`node.runtime.clock.Clock`, so every rule here
is tested without iroh (``tests/test_sessions.py``).

Who may come in is the doorkeeper's (node/host/doorkeeper.py): it takes the slots
here (:meth:`SessionTable.open_session`) and judges each step of a handshake.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

from node.common.host_events import SessionEvicted, SessionRefused
from node.runtime.clock import SYSTEM_CLOCK, Clock, rfc3339
from node.host.doorkeeper import admission, admits  # their old home: `admission` is still imported from here

#: Live sessions a host serves at once (``HostOptions.max_sessions``).
MAX_CONCURRENT_SESSIONS = 64
#: Live sessions one peer key may hold at once.
MAX_SESSIONS_PER_PEER = 4
#: Default share of the session slots anonymous peers (keys not in the registry) may hold
#: together: the rest is kept for pinned peers (``kith host --anonymous-slots``).
ANONYMOUS_SHARE = 0.75
#: A READY anonymous session with no answered query for this long may be evicted by *any*
#: newcomer that needs its slot (s; ``kith host --evict-idle-after``).
EVICT_IDLE_AFTER_S = 30.0
#: A READY anonymous session that answered no query for this long (s) and has none in
#: flight is *quiet*: a newcomer that holds no session yet — a pinned guest, or an
#: anonymous key with no session — may evict it at once (issue 19: an honest guest is never
#: made to wait out :data:`EVICT_IDLE_AFTER_S` behind throw-away keys).
QUIET_AFTER_S = 2.0
#: A session still in its handshake is evicted for a newcomer only once it is this old (s):
#: an honest handshake takes milliseconds on loopback and a few round trips elsewhere, so a
#: flood of newcomers cannot evict honest handshakes, only stalled ones.
HANDSHAKE_GRACE_S = 1.0
#: An anonymous key one of whose sessions was evicted may not evict a session itself for
#: this many ``evict_idle_after_s`` (it may still take a free slot).
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
    "handshake-chain-too-long", "handshake-binding-malformed", "handshake-binding-forged",
    "handshake-binding-wrong-person", "handshake-binding-wrong-device", "handshake-chain-loop",
    # not handshake-person-key-retired / -rotation-revoked-key: the host's own decision from
    # its rotation ledger (node/trust/rotation.py), like not-admitted
    "handshake-chain-gap", "handshake-rotation-unknown-key",
    "handshake-revocation-malformed", "handshake-revocation-forged", "handshake-revocation-wrong-person",
    "peer-disconnected",  # hung up before _session_ready: the proof is missing
})
#: How a session can be ended from outside (:attr:`Ended.cause`).
END_CAUSES = ("evicted", "revoked", "owner")


@dataclass
class Ended:
    """How the table ended a session from outside.

    Attributes:
        code: the code the peer was sent (``session-evicted``, ``handshake-host-busy``,
            ``session-revoked``, ``handshake-peer-blocked``, ``session-ended-by-owner``).
        cause: one of :data:`END_CAUSES`.
        at: Unix time (s) it was ended.
        ready: the session had finished its handshake.
    """

    code: str
    cause: str
    at: float
    ready: bool


@dataclass
class _Session:
    """One session slot: a connection whose stream is open and whose session runs.

    Attributes:
        peer: the QUIC-authenticated peer key (64 hex).
        end: ``(code, message)`` → ends that session now (the connection aborts its engine,
            which queues ``_session_reject``/``_error``, and cancels it); called at most once.
        alive: False once the session is ending on its own (its engine closed): such a
            session is not evicted or listed, it is leaving anyway.
        anonymous: the key was not in the peer registry when it was admitted.
        name: the registry name it was admitted under (None: anonymous).
        opened / last_active: monotonic s it took the slot / last answered a query.
        busy: queries being answered right now (a session answering is never evicted).
        ready / session_id / since / pairing_code: set once the handshake completed
            (``since`` in Unix s).
        admitted: the door admitted it at ``_session_ready`` (:meth:`SessionTable.session_admitted`):
            its handshake is over on the engine's side, though not yet recorded as ready.
        person: the guest's verified person identity (``{"key", "deviceName", "earlier"}``)
            once admitted, or None (device-key-only identity).
        via_person: the person key of the person pin (``kith peers add --devices``) whose
            grants this device holds, or None (it holds its own, or none).
        post: the post whose use count this session reserved, or None.
        ended: set when the table ended it from outside; it then holds no slot.
        path: the network path its data takes now (``{"kind", "relayUrl", "remote"}``,
            :meth:`node.transport.paths.PathInfo.to_dict`), or None before it is known.
    """

    peer: str
    end: Callable[[str, str], None]
    alive: Callable[[], bool]
    anonymous: bool
    name: str | None
    opened: float
    last_active: float
    busy: int = 0
    ready: bool = False
    admitted: bool = False
    session_id: str | None = None
    since: float | None = None
    pairing_code: str | None = None
    person: dict[str, Any] | None = None
    via_person: str | None = None
    post: str | None = None
    ended: Ended | None = None
    queries: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    path: dict[str, Any] | None = None

    @property
    def holds_slot(self) -> bool:
        return self.ended is None


@dataclass
class AdmissionLimits:
    """The numbers :class:`SessionTable` enforces.

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
            query before *any* newcomer may evict it (``kith host --evict-idle-after``);
            a newcomer holding no session needs only :attr:`quiet_after_s`.
        quiet_after_s: see :data:`QUIET_AFTER_S`.
        max_failures / failure_cooldown_s: after ``max_failures`` failed handshakes a key
            is refused (``handshake-too-many-failures``) for ``failure_cooldown_s`` s.
    """

    max_sessions: int = MAX_CONCURRENT_SESSIONS
    max_sessions_per_peer: int = MAX_SESSIONS_PER_PEER
    post_max_sessions: int | None = None
    anonymous_sessions: int | None = None
    evict_idle_after_s: float = EVICT_IDLE_AFTER_S
    quiet_after_s: float = QUIET_AFTER_S
    max_failures: int = MAX_FAILED_HANDSHAKES
    failure_cooldown_s: float = FAILURE_COOLDOWN_S

    @property
    def anonymous_limit(self) -> int:
        """The effective bound on anonymous slots (never more than ``max_sessions``)."""
        if self.anonymous_sessions is not None:
            return max(0, min(self.anonymous_sessions, self.max_sessions))
        return max(1, int(self.max_sessions * ANONYMOUS_SHARE))


def is_failure(code: str | None) -> bool:
    """Does a handshake that named a live post and ended with ``code`` count as failed?
    (:data:`FAILURE_CODES`)."""
    return code in FAILURE_CODES


class SessionTable:
    """Slots, reservations, evictions and the live listing of one host process (not
    thread-safe: call it from the host's event loop, except :meth:`activity`, which a
    hook's worker thread calls).

    Args:
        limits: the bounds.
        on_event: receives the host events this class decides (``session-refused`` with
            ``reason: "evicted"``, ``session-evicted``).
        clock: the host's clock (:mod:`node.runtime.clock`).
    """

    def __init__(self, limits: AdmissionLimits | None = None, *,
                 on_event: Callable[[dict[str, Any]], None] = lambda _ev: None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.limits = limits or AdmissionLimits()
        self.on_event = on_event
        self.clock = clock
        #: connections without a stream yet, oldest first: token -> (peer, evict callback)
        self._pending: dict[int, tuple[str, Callable[[], None]]] = {}
        #: sessions in the order they took their slot: token -> session
        self._sessions: dict[int, _Session] = {}
        #: post_id -> sessions reserved (at _session_init) or kept (once ready)
        self._claimed: dict[str, int] = {}
        #: post_id -> its own session limit (posts restored from an earlier run)
        self._post_limits: dict[str, int | None] = {}
        #: peer key -> (failed handshakes since the last cool-down, cool-down end), LRU order
        self._failures: dict[str, tuple[int, float]] = {}
        #: anonymous key -> when one of its sessions (or stalled handshakes) was last evicted
        #: (bounded, oldest dropped)
        self._evicted: dict[str, float] = {}

    # ------------------------------------------------------------ pending connections
    def connection_arrived(self, token: int, peer: str, evict: Callable[[], None]) -> None:
        """A QUIC connection was accepted; it waits for its first stream. When the pool of
        such connections is full (``max_sessions``), the *oldest* is evicted: ``evict`` of
        that one is called (the host cancels its wait and closes it with QUIC reason
        ``handshake-host-busy``) and a ``session-refused`` event with ``reason: "evicted"``
        is emitted. ``peer`` may be "" when the transport cannot name it."""
        if len(self._pending) >= self.limits.max_sessions:
            oldest = next(iter(self._pending))
            old_peer, old_evict = self._pending.pop(oldest)
            old_evict()
            self.on_event(SessionRefused(peer=old_peer, code="handshake-host-busy", reason="evicted").to_dict())
        self._pending[token] = (peer, evict)

    def connection_done(self, token: int) -> None:
        """The connection opened its stream, failed, or was evicted: it leaves the pool."""
        self._pending.pop(token, None)

    @property
    def pending(self) -> int:
        """Connections still waiting for their first stream."""
        return len(self._pending)

    # ------------------------------------------------------------ admission
    def open_session(self, token: int, peer: str, end: Callable[[str, str], None],
                     alive: Callable[[], bool] = lambda: True, *, anonymous: bool = False,
                     name: str | None = None) -> str | None:
        """Take a session slot for the stream of connection ``token``.

        Fair admission (issues 11, 19): anonymous peers together hold at most
        ``anonymous_limit`` slots, so a pinned peer always finds one. When the slots a
        newcomer may use are all taken, room is made, in this order:

        1. the oldest session still in its handshake, if at least
           :data:`HANDSHAKE_GRACE_S` old, is ended with ``handshake-host-busy``
           (``session-refused`` event, ``reason: "evicted"``);
        2. a newcomer that holds no session yet (a pinned guest, or an anonymous key
           with none) evicts a *quiet* anonymous session (no query answered for
           ``quiet_after_s``, none in flight) of the anonymous key holding the most
           sessions, its idlest one — at once, no timer to wait out;
        3. any other newcomer evicts the READY anonymous session idle the longest, if
           idle for at least ``evict_idle_after_s``.

        Evictions of ready sessions end them with ``session-evicted`` (``session-evicted``
        event). A pinned peer's session is never evicted, a session answering a query is
        never evicted, an anonymous newcomer only ever evicts anonymous sessions, and an
        anonymous key one of whose sessions (ready, or a stalled handshake) was evicted
        evicts none itself — neither step 1 nor 2 nor 3 — for :data:`EVICTED_KEY_PAUSE` ×
        ``evict_idle_after_s``: evicted keys cannot evict each other into a loop, and
        stallers that reconnect at once cannot keep every handshake younger than the grace.

        Args:
            end: ``(code, message)`` → ends this session now (see :class:`_Session`).
            alive: False once the session is leaving on its own.
            anonymous: the key is not in the registry; name: the registry name it has.

        Returns:
            None when a slot was taken (release it with :meth:`close_session`), else the
            refusal code to send at once: ``handshake-too-many-failures`` (``peer`` is in
            its cool-down; :meth:`cooldown_left`), ``handshake-peer-busy`` (``peer`` holds
            ``max_sessions_per_peer`` already, every one of them answering or still in its
            handshake: otherwise its own READY session with none in flight, the one answered
            least recently, is evicted for it instead) or ``handshake-host-busy`` (no slot
            could be freed).
        """
        if self.cooldown_left(peer) > 0:
            return "handshake-too-many-failures"
        held = self.sessions_of(peer)
        if held >= self.limits.max_sessions_per_peer:
            if not self._evict_own(peer):
                return "handshake-peer-busy"
            held -= 1
        now = self.clock.monotonic()
        paused = anonymous and now - self._evicted.get(peer, -math.inf) \
            < EVICTED_KEY_PAUSE * self.limits.evict_idle_after_s
        fresh = held == 0 and not paused
        if anonymous and self.anonymous_sessions >= self.limits.anonymous_limit \
                and not self._make_room(fresh=fresh, may_evict=not paused):
            return "handshake-host-busy"
        if self.sessions >= self.limits.max_sessions and \
                not self._make_room(fresh=fresh, may_evict=not paused, anonymous_only=anonymous):
            return "handshake-host-busy"
        self._sessions[token] = _Session(peer=peer, end=end, alive=alive, anonymous=anonymous,
                                         name=None if anonymous else name, opened=now, last_active=now)
        return None

    def _evict_own(self, peer: str) -> bool:
        """Make room for a newcomer of key ``peer`` that holds ``max_sessions_per_peer``
        already: its own READY session with no query in flight, the one answered least
        recently, is ended with ``session-evicted``. Such sessions are most often a killed
        process's, which the host would otherwise hold until the heartbeat gives up on it
        (30 s); a live one's guest opens another when it asks again (specs/session.md).

        No quiet time is asked for, unlike an anonymous newcomer's eviction of another key
        (:data:`QUIET_AFTER_S`): a key ends only its own sessions here, so it can harm no
        one else, and a guest killed several times within two seconds (Ctrl-C on
        ``kith copies sync``) is let in however fast it came back. Returns False when every
        session of the key is answering or still in its handshake."""
        now = self.clock.monotonic()
        idle = [(s.last_active, t) for t, s in self._sessions.items()
                if s.peer == peer and s.ready and s.holds_slot and s.busy == 0 and s.alive()]
        if not idle:
            return False
        last, token = min(idle)
        self.end(token, "session-evicted", "evicted: this peer key opened a new session and this one was its least recently used",
                 cause="evicted")
        self.on_event(SessionEvicted(peer=peer, idle_s=round(now - last, 3)).to_dict())
        return True

    def _make_room(self, *, fresh: bool, may_evict: bool, anonymous_only: bool = True) -> bool:
        if not may_evict:
            return False
        if self._evict_oldest_handshake(anonymous_only):
            return True
        if fresh and self._evict(self._quiet_victim()):
            return True
        return self._evict(self._idlest_victim())

    def _evictable(self, s: _Session, idle_for: float) -> bool:
        return (s.ready and s.anonymous and s.holds_slot and s.busy == 0 and s.alive()
                and self.clock.monotonic() - s.last_active >= idle_for)

    def _quiet_victim(self) -> int | None:
        quiet = [(t, s) for t, s in self._sessions.items() if self._evictable(s, self.limits.quiet_after_s)]
        if not quiet:
            return None
        held: dict[str, int] = {}
        for s in self._sessions.values():
            if s.holds_slot and s.anonymous:
                held[s.peer] = held.get(s.peer, 0) + 1
        # the key holding the most sessions gives one up; among its, the idlest
        _n, _last, token = min((-held[s.peer], s.last_active, t) for t, s in quiet)
        return token

    def _idlest_victim(self) -> int | None:
        idle = [(s.last_active, t) for t, s in self._sessions.items()
                if self._evictable(s, self.limits.evict_idle_after_s)]
        return min(idle)[1] if idle else None

    def _evict(self, token: int | None) -> bool:
        if token is None:
            return False
        s = self._sessions[token]
        now = self.clock.monotonic()
        idle_s = round(now - s.last_active, 3)
        self.end(token, "session-evicted", "evicted: the host needed this idle anonymous session's slot",
                 cause="evicted")
        self._note_evicted(s.peer, now)
        self.on_event(SessionEvicted(peer=s.peer, idle_s=idle_s).to_dict())
        return True

    def _note_evicted(self, peer: str, now: float) -> None:
        """Remember that a session of anonymous ``peer`` was evicted (bounded, oldest dropped)."""
        self._evicted.pop(peer, None)
        self._evicted[peer] = now
        while len(self._evicted) > MAX_FAILURE_KEYS:
            self._evicted.pop(next(iter(self._evicted)))

    def _evict_oldest_handshake(self, anonymous_only: bool) -> bool:
        now = self.clock.monotonic()
        for token, s in list(self._sessions.items()):
            if s.ready or not s.holds_slot or not s.alive() or (anonymous_only and not s.anonymous):
                continue
            if now - s.opened < HANDSHAKE_GRACE_S:
                return False  # the oldest handshake is young (in order: so are the rest)
            self.end(token, "handshake-host-busy", "evicted: the host is full and this handshake is the oldest",
                     cause="evicted")
            if s.anonymous:  # a staller that reconnects at once must not evict in turn
                self._note_evicted(s.peer, now)
            self.on_event(SessionRefused(peer=s.peer, code="handshake-host-busy", reason="evicted").to_dict())
            return True
        return False

    # ------------------------------------------------------------ life of a session
    def session_admitted(self, token: int, person: dict[str, Any] | None = None,
                         via_person: tuple[str, str] | None = None) -> None:
        """The door admitted session ``token`` at ``_session_ready``: from now on a
        revocation list, block or removal naming its verified person or its person pin ends
        it (:meth:`end_sessions`, with the ready session's code: the engine's handshake is
        over). Called in the same step as the verdict, before :meth:`session_ready`, so no
        list the host takes in between goes unmatched (specs/peers.md §5).

        Args:
            person: the guest's verified person (``{"key", "deviceName", "earlier"}``) or None.
            via_person: ``(pin name, person key)`` when the device holds a person pin's
                grants (specs/peers.md §10): the session is listed under that name, a
                removal or block of the person ends it, and from now on it is a pinned
                peer's session — out of the anonymous share and never evicted.
        """
        s = self._sessions.get(token)
        if s is None:
            return
        s.admitted, s.person = True, person
        if via_person is not None:
            s.name, s.via_person = via_person
            s.anonymous = False  # it came in on an anonymous slot (its device key is not pinned)

    def session_ready(self, token: int, session_id: str | None = None, pairing_code: str | None = None) -> bool:
        """The session completed its handshake: its post reservation is kept for good
        (its person was recorded by :meth:`session_admitted`).

        Args:
            session_id: its id (64 hex); pairing_code: the words both sides can compare
                (:func:`node.trust.pairing.pairing_code`).

        Returns:
            True when its post is now used up here (``post_max_sessions`` reached).
        """
        s = self._sessions.get(token)
        if s is None:
            return False
        s.ready = s.admitted = True
        s.last_active = self.clock.monotonic()
        s.session_id, s.since, s.pairing_code = session_id, self.clock.time(), pairing_code
        limit = self.post_limit(s.post) if s.post is not None else None
        return s.post is not None and limit is not None and self._claimed.get(s.post, 0) >= limit

    def begin_query(self, token: int) -> None:
        """A query of this session is being answered (it is not evictable meanwhile).
        Safe from a hook's worker thread (one attribute update under the GIL)."""
        s = self._sessions.get(token)
        if s is not None:
            s.busy += 1

    def activity(self, token: int, status: str) -> None:
        """The session answered one query with ``status`` (``ok``, ``rate-limited``, ...):
        counted for the listing, and — unless ``rate-limited`` — the session is not idle
        (a session kept alive by over-quota queries stays idle). Pairs with
        :meth:`begin_query`. Safe from a hook's worker thread."""
        s = self._sessions.get(token)
        if s is None:
            return
        s.busy = max(0, s.busy - 1)
        s.queries += 1
        s.statuses[status] = s.statuses.get(status, 0) + 1
        if status != "rate-limited":
            s.last_active = self.clock.monotonic()

    def set_path(self, token: int, path: dict[str, Any]) -> None:
        """The session's network path is now ``path`` (``{"kind", "relayUrl", "remote"}``;
        the connection reads it from the transport, specs/transport.md §3)."""
        s = self._sessions.get(token)
        if s is not None:
            s.path = dict(path)

    def end(self, token: int, code: str, message: str = "", *, cause: str = "revoked") -> bool:
        """End session ``token`` now with ``code``: the one way a session is ended from
        outside (eviction, revocation, the owner). Its slot is free at once; the
        connection's own cleanup (:meth:`close_session`) still runs later.

        Args:
            cause: one of :data:`END_CAUSES`.

        Returns:
            False when that session is not running (already ended, or unknown).
        """
        s = self._sessions.get(token)
        if s is None or not s.holds_slot:
            return False
        s.ended = Ended(code=code, cause=cause, at=self.clock.time(), ready=s.ready)
        self._give_back(s)
        s.end(code, message)
        return True

    def ended(self, token: int) -> Ended | None:
        """How the table ended session ``token``, or None (it was not ended from outside)."""
        s = self._sessions.get(token)
        return s.ended if s is not None else None

    def close_session(self, token: int) -> None:
        """The session's connection is done (any way): its slot is free again and a post
        reservation of a session that never became ready is given back. Idempotent."""
        s = self._sessions.pop(token, None)
        if s is not None and s.holds_slot:
            self._give_back(s)

    def _give_back(self, s: _Session) -> None:
        if s.post is not None and not s.ready:
            self._claimed[s.post] -= 1
            s.post = None

    # ------------------------------------------------------------ revocation and the owner
    def end_sessions(self, peer: str, code: str = "session-revoked", *, handshake_code: str | None = None,
                     admitted_as: str | None = None, message: str = "the host revoked this peer",
                     of_persons: Collection[str] | None = None) -> int:
        """End every live session of ``peer`` now (specs/peers.md §5).

        A ready (or admitted, :meth:`session_admitted`) session is told ``_error code``;
        one still in its handshake gets
        ``_session_reject handshake_code`` (default: ``code``). ``peer`` is a device key or
        a person key (then every device whose verified chain names it, and every device
        holding that person pin's grants).

        Args:
            admitted_as: end only the sessions admitted under this registry name (a
                removed peer's sessions admitted anonymously after the change stay);
                None = all of them (a block).
            of_persons: end only the sessions whose verified chain names one of these
                person keys (the chain's key or an earlier one) or that hold a person pin
                on one of them: a revocation list revokes its own person's devices only.
                None = all.

        Returns:
            How many sessions were ended.
        """
        n = 0
        for token, s in list(self._sessions.items()):
            if peer not in (s.peer, s.via_person, (s.person or {}).get("key")) or not s.holds_slot or not s.alive():
                continue
            if admitted_as is not None and s.name != admitted_as:
                continue
            if of_persons is not None and not {s.via_person, (s.person or {}).get("key"),
                                               *(s.person or {}).get("earlier", ())} & set(of_persons):
                continue
            sent = code if s.admitted else (handshake_code or code)
            n += self.end(token, sent, message, cause="revoked")
        return n

    def end_named(self, name: str, code: str, message: str = "") -> int:
        """End every live session admitted under the registry name ``name`` (whatever its
        key: a grant that ended, node/host/grants.py). Returns how many."""
        n = 0
        for token, s in list(self._sessions.items()):
            if s.name == name and s.holds_slot and s.alive():
                n += self.end(token, code, message, cause="revoked")
        return n

    def end_session(self, session_id: str, code: str, message: str) -> bool:
        """End the ready session ``session_id`` now (the owner's ``kith sessions end``).
        Returns False when no such session is running."""
        for token, s in self._sessions.items():
            if s.session_id == session_id and s.holds_slot and s.alive():
                return self.end(token, code, message, cause="owner")
        return False

    def rename(self, token: int, name: str | None) -> None:
        """The key of session ``token`` is pinned under ``name`` now (or unpinned: None):
        the listing and later revocations follow it. An anonymous session keeps its
        anonymous slot accounting (it was admitted into the anonymous share)."""
        s = self._sessions.get(token)
        if s is not None:
            s.name = name

    def tokens_of(self, peer: str) -> list[int]:
        """Tokens of the live sessions of ``peer``."""
        return [t for t, s in self._sessions.items() if s.peer == peer and s.holds_slot]

    def listing(self) -> list[dict[str, Any]]:
        """The ready sessions still running, oldest first: ``[{"id", "peer": {"name",
        "key", "person": {"key", "deviceName", "earlier"} | null, "viaPerson" (the name is a
        person pin's, specs/peers.md §10)}, "tier" ("pinned" |
        "anonymous"), "since" (RFC 3339), "queries", "statuses", "path": {"kind"
        ("direct" | "relayed" | "unknown"), "relayUrl", "remote"}, "pairingCode"}]`` (the
        control channel's shape, specs/control.md; ``peer.key`` is the device key)."""
        out = []
        for s in self._sessions.values():
            if s.session_id is None or not s.holds_slot or not s.alive():
                continue
            row: dict[str, Any] = {"id": s.session_id, "peer": {"name": s.name, "key": s.peer, "person": s.person,
                                                                "viaPerson": s.via_person is not None},
                                   "tier": "pinned" if s.name is not None else "anonymous",
                                   "since": rfc3339(s.since if s.since is not None else self.clock.time()),
                                   "queries": s.queries, "statuses": dict(s.statuses),
                                   "path": dict(s.path) if s.path else {"kind": "unknown", "relayUrl": None,
                                                                        "remote": None}}
            if s.pairing_code:
                row["pairingCode"] = s.pairing_code
            out.append(row)
        return out

    def peers(self) -> dict[str, set[str | None]]:
        """Live peer key → the registry names its sessions were admitted under."""
        out: dict[str, set[str | None]] = {}
        for s in self._sessions.values():
            if s.holds_slot:
                out.setdefault(s.peer, set()).add(s.name)
        return out

    # ------------------------------------------------------------ counts
    @property
    def anonymous_sessions(self) -> int:
        """Slots anonymous peers hold now."""
        return sum(1 for s in self._sessions.values() if s.anonymous and s.holds_slot)

    def sessions_of(self, peer: str) -> int:
        """Slots ``peer`` holds now."""
        return sum(1 for s in self._sessions.values() if s.peer == peer and s.holds_slot)

    @property
    def sessions(self) -> int:
        """Slots taken now (sessions handshaking or ready)."""
        return sum(1 for s in self._sessions.values() if s.holds_slot)

    @property
    def connections(self) -> int:
        """Sessions whose connection has not finished its cleanup yet (ended ones too)."""
        return len(self._sessions)

    # ------------------------------------------------------------ post uses
    def claim_post(self, token: int, post_id: str) -> bool:
        """Reserve one use of ``post_id`` for this session (its ``_session_init`` named it).

        Returns False when the session reserved a post already or the post is used up
        here (``post_max_sessions``): the host enforces the use count itself, not only
        the community server, and concurrent handshakes cannot overshoot it.
        """
        s = self._sessions.get(token)
        if s is None or s.post is not None or not s.holds_slot:
            return False
        limit = self.post_limit(post_id)
        if limit is not None and self._claimed.get(post_id, 0) >= limit:
            return False
        self._claimed[post_id] = self._claimed.get(post_id, 0) + 1
        s.post = post_id
        return True

    def claimed(self, post_id: str) -> int:
        """Uses of ``post_id`` reserved or kept now."""
        return self._claimed.get(post_id, 0)

    def post_limit(self, post_id: str) -> int | None:
        """Sessions ``post_id`` admits: its own ``max_sessions`` when it was restored
        (:meth:`restore_post`), else ``post_max_sessions``."""
        return self._post_limits.get(post_id, self.limits.post_max_sessions)

    def restore_post(self, post_id: str, uses: int, limit: int | None) -> None:
        """A post of an earlier run of this host comes back with the ``uses`` it had
        (sessions that became ready) and its own ``limit`` (its invitation's
        ``max_sessions``; None = unlimited): its use count goes on where it stopped
        (node/host/posts.py, issue 30)."""
        self._claimed[post_id] = max(self._claimed.get(post_id, 0), int(uses))
        self._post_limits[post_id] = limit

    # ------------------------------------------------------------ failed handshakes
    def record_failure(self, peer: str, code: str) -> None:
        """A handshake of ``peer`` that named a live post ended with ``code``: when
        :func:`is_failure`, it counts, and the key's ``max_failures``-th failure starts its
        cool-down (and resets its count). (A post's own failure cap is
        :meth:`node.host.posts.Posts.record_failure`.)"""
        if not is_failure(code):
            return
        now = self.clock.monotonic()
        count, until = self._failures.pop(peer, (0, 0.0))
        count += 1
        if count >= self.limits.max_failures:
            count, until = 0, now + self.limits.failure_cooldown_s
        self._failures[peer] = (count, until)  # most recently failing last
        while len(self._failures) > MAX_FAILURE_KEYS:
            self._failures.pop(next(iter(self._failures)))

    def cooldown_left(self, peer: str) -> float:
        """Seconds ``peer`` is still refused for failed handshakes (0 = none)."""
        _count, until = self._failures.get(peer, (0, 0.0))
        return max(0.0, until - self.clock.monotonic())

    def succeeded(self, peer: str) -> None:
        """``peer`` completed a handshake: its failure count starts again from 0 (a
        cool-down in force is not lifted; it could not have got this far)."""
        count, until = self._failures.get(peer, (0, 0.0))
        if count and until <= self.clock.monotonic():
            del self._failures[peer]

    @property
    def failure_keys(self) -> int:
        """Keys whose failures are remembered now (≤ :data:`MAX_FAILURE_KEYS`)."""
        return len(self._failures)

    # ------------------------------------------------------------ the predicate
    #: The ``_session_init`` admission predicate, :func:`node.host.doorkeeper.admits`
    #: (the doorkeeper holds every admission rule; kept here under its old name).
    admits = staticmethod(admits)


class ActivityTracked:
    """A knowledge handle that tells the session table about each query it answers:
    ``begin()`` before every ``search``, ``done(status)`` after it (the status is
    ``"error"`` when the search raised). Other attributes pass through to ``inner``.

    Args:
        inner: the peer's :class:`node.answer.service.Knowledge`.
        begin / done: :meth:`SessionTable.begin_query` / :meth:`SessionTable.activity`
            bound to the session's token.
        answered: when given, called with each answer dict before it is returned (the
            audit tap takes the scrubbing gate's counts from it,
            :meth:`node.host.audit._SessionTap.answered`).
    """

    def __init__(self, inner: Any, begin: Callable[[], None], done: Callable[[str], None],
                 answered: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._inner = inner
        self._begin = begin
        self._done = done
        self._answered = answered

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        """``inner.search(request)``; see :meth:`node.answer.service.Knowledge.search`."""
        self._begin()
        status = "error"
        try:
            result = self._inner.search(request)
            got = result.get("status") if isinstance(result, dict) else None
            status = str(got or "unknown")[:64]
            if self._answered is not None and isinstance(result, dict):
                self._answered(result)
            return result
        finally:
            self._done(status)

    def copy_documents(self, sources: Any) -> dict[str, Any]:
        """``inner.copy_documents(sources)``; the spans scrubbed from what is sent go to
        ``answered`` as ``{"scrubbed": {kind: n}}`` (the audit's ``copy-sent`` record)."""
        scrubbed: dict[str, int] = {}
        result = self._inner.copy_documents(sources, scrubbed)
        if self._answered is not None and isinstance(result, dict):
            self._answered({"scrubbed": scrubbed})
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


__all__ = ["ActivityTracked", "AdmissionLimits", "ANONYMOUS_SHARE", "END_CAUSES", "EVICT_IDLE_AFTER_S",
           "EVICTED_KEY_PAUSE", "Ended", "FAILURE_CODES", "FAILURE_COOLDOWN_S", "HANDSHAKE_GRACE_S",
           "MAX_CONCURRENT_SESSIONS", "MAX_FAILED_HANDSHAKES", "MAX_SESSIONS_PER_PEER", "QUIET_AFTER_S",
           "SessionTable", "admission", "is_failure"]
