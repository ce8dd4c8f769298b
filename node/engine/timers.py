"""Session timing decisions, with time as an input (DESIGN §3 heartbeat, §6 handshake
steps, §7 idle limit). No I/O, no clock of its own: every method takes ``now`` (seconds on
a monotonic clock) and answers what is due.

Rules:

- handshake: every step (waiting for the peer's next handshake frame, or for the local
  driver to confirm) must finish within ``handshake_step_s`` → ``handshake-timeout``;
- after the handshake, a ``_ping`` is due every ``ping_interval_s``;
- no complete frame from the peer for ``unresponsive_s`` → ``peer-unresponsive``
  (a killed peer sends nothing, not even a QUIC close, so this is how it is noticed);
- while a reply of the peer is due (a guest's question in flight: :meth:`SessionTimers.awaiting`),
  the tighter ``inflight_ping_s`` / ``inflight_unresponsive_s`` apply instead, counted from
  the later of the peer's last frame and the moment the question left — a host killed
  while a question is out is known within seconds, an idle session stays lazy
  (specs/session.md §7.2; the iroh 1.2.0 Python binding exposes no QUIC keep-alive or idle
  timeout, so this heartbeat is the only liveness signal);
- no business message in either direction for ``idle_s`` → ``idle-timeout``.

Any bound may be None (disabled).
"""

from __future__ import annotations

from dataclasses import dataclass

PING_INTERVAL_S = 10.0
UNRESPONSIVE_S = 30.0
HANDSHAKE_STEP_S = 10.0
#: While a question is in flight: ``_ping`` every second, and the host is gone after 4 s
#: without a frame (its pongs come back within a round trip even while it searches: the
#: driver's receiver answers pings beside the hooks).
INFLIGHT_PING_S = 1.0
INFLIGHT_UNRESPONSIVE_S = 4.0

@dataclass(frozen=True)
class Timeouts:
    """The bounds of one session, in seconds (None = no bound).

    Attributes:
        handshake_step_s: each handshake step (default 10 s, DESIGN §6).
        ping_interval_s: ``_ping`` period after the handshake (default 10 s, DESIGN §3).
        unresponsive_s: silence after which the peer is declared gone (default 30 s).
        idle_s: business silence after which the session ends (the protocol's
            ``idle_timeout_s``; None for an interactive guest).
        inflight_ping_s / inflight_unresponsive_s: the ping period and the dead-peer
            bound while a reply of the peer is due (None: the idle ones apply then too).
    """

    handshake_step_s: float | None = HANDSHAKE_STEP_S
    ping_interval_s: float | None = PING_INTERVAL_S
    unresponsive_s: float | None = UNRESPONSIVE_S
    idle_s: float | None = None
    inflight_ping_s: float | None = None
    inflight_unresponsive_s: float | None = None


PING = "ping"


class SessionTimers:
    """Tracks the last activity of one session and says what is due.

    Args:
        timeouts: the bounds.
        now: the current time (s, monotonic); the first handshake step starts here.
    """

    def __init__(self, timeouts: Timeouts, now: float) -> None:
        self.timeouts = timeouts
        self.ready = False
        self.step_started = now
        self.last_frame_in = now
        self.last_ping_out = now
        self.last_business = now
        self.awaiting_since: float | None = None  # a reply of the peer is due since then

    # ------------------------------------------------------------------ activity
    def frame_received(self, now: float) -> None:
        """A complete frame (any kind) arrived from the peer."""
        self.last_frame_in = now

    def handshake_step(self, now: float) -> None:
        """The handshake advanced; the next step starts now."""
        self.step_started = now

    def session_ready(self, now: float) -> None:
        """The handshake completed; heartbeat and idle bounds apply from now."""
        self.ready = True
        self.last_frame_in = self.last_ping_out = self.last_business = now

    def business(self, now: float) -> None:
        """A business message was sent or received."""
        self.last_business = now

    def ping_sent(self, now: float) -> None:
        """We queued a ``_ping``."""
        self.last_ping_out = now

    def awaiting(self, due: bool, now: float) -> None:
        """A reply of the peer is due from ``now`` (``due``), or no longer (it came, or the
        turn passed back): the in-flight bounds apply only meanwhile."""
        if not due:
            self.awaiting_since = None
        elif self.awaiting_since is None:
            self.awaiting_since = now

    def _bounds(self) -> tuple[float | None, float | None, float]:
        """``(ping period, dead-peer bound, silence counted from)`` in force now."""
        t = self.timeouts
        if self.awaiting_since is not None and t.inflight_unresponsive_s is not None:
            ping = t.inflight_ping_s if t.inflight_ping_s is not None else t.ping_interval_s
            return ping, t.inflight_unresponsive_s, max(self.last_frame_in, self.awaiting_since)
        return t.ping_interval_s, t.unresponsive_s, self.last_frame_in

    def silence(self, now: float) -> float:
        """Seconds since the peer's last complete frame."""
        return now - self.last_frame_in

    # ------------------------------------------------------------------ decisions
    def due(self, now: float) -> str | None:
        """What must happen at ``now``.

        Each bound is tested as ``now >= start + bound``, the very sum
        :meth:`next_deadline` returns, so a clock read exactly at a deadline finds it
        due (``now - start >= bound`` can round the other way: a driver woken at the
        deadline then found nothing due and slept 0 s again, spinning).

        Returns:
            None (nothing), :data:`PING`, or an abort code: ``handshake-timeout``,
            ``peer-unresponsive`` or ``idle-timeout``.
        """
        t = self.timeouts
        if not self.ready:
            if t.handshake_step_s is not None and now >= self.step_started + t.handshake_step_s:
                return "handshake-timeout"
            return None
        ping, dead, heard = self._bounds()
        if dead is not None and now >= heard + dead:
            return "peer-unresponsive"
        if t.idle_s is not None and now >= self.last_business + t.idle_s:
            return "idle-timeout"
        if ping is not None and now >= self.last_ping_out + ping:
            return PING
        return None

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`due` may answer something (None: never)."""
        t = self.timeouts
        if not self.ready:
            return None if t.handshake_step_s is None else self.step_started + t.handshake_step_s
        ping, dead, heard = self._bounds()
        cands = []
        if dead is not None:
            cands.append(heard + dead)
        if t.idle_s is not None:
            cands.append(self.last_business + t.idle_s)
        if ping is not None:
            cands.append(self.last_ping_out + ping)
        return min(cands) if cands else None
