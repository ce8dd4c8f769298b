"""The host's clock: one object for every time the host reads or waits on.

The host's session table, its posts and its listing read time only through a
:class:`Clock`, so tests drive admission, eviction and expiry by advancing a
:class:`ManualClock` instead of sleeping out real bounds. Two readings are kept apart on
purpose: :meth:`Clock.monotonic` orders and measures (idle times, handshake ages,
cool-downs) and never jumps; :meth:`Clock.time` is Unix time for what is compared with the
outside world (an invitation's ``expires_at``, RFC 3339 stamps in events and listings). A
wall clock that jumps therefore moves expiry and stamps, never an idle measure, so it
cannot end a healthy session.
"""

from __future__ import annotations

import math
import time as _time
from typing import Protocol

import anyio


class Clock(Protocol):
    """What the host needs of a clock."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""

    def time(self) -> float:
        """Unix time (s, UTC)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock (0 or less: one scheduling point)."""


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time`, :func:`anyio.sleep`."""

    def monotonic(self) -> float:
        """:func:`time.monotonic`."""
        return _time.monotonic()

    def time(self) -> float:
        """:func:`time.time`."""
        return _time.time()

    async def sleep(self, seconds: float) -> None:
        """:func:`anyio.sleep` (negative → 0)."""
        await anyio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when told to (tests, ``kith protocol test``).

    Args:
        start: the Unix time it reads first (s; default: now, so invitations made with
            the real clock are not expired on it); its monotonic reading starts at 1000.

    :meth:`sleep` waits until :meth:`advance` (or :meth:`jump_wall`, which moves only the
    wall reading) has moved the monotonic reading past its deadline. Call :meth:`advance`
    from the event loop the sleepers run in.
    """

    def __init__(self, start: float | None = None) -> None:
        self._mono = 1000.0
        self._wall = _time.time() if start is None else float(start)
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def monotonic(self) -> float:
        """The monotonic reading (s)."""
        return self._mono

    def time(self) -> float:
        """The wall reading (Unix s)."""
        return self._wall

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock was advanced by ``seconds`` (``inf``: until cancelled)."""
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        entry = (self._mono + seconds if math.isfinite(seconds) else math.inf, woken)
        self._sleepers.append(entry)
        try:
            await woken.wait()
        finally:  # a sleep cancelled before its time (a timer raced with a queue) waits no more
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def sleepers(self) -> int:
        """How many :meth:`sleep` calls wait now, a cancelled one no more (a test waits for
        a machine to be asleep on this clock before it advances it)."""
        return len(self._sleepers)

    def advance(self, seconds: float) -> None:
        """Move both readings forward by ``seconds`` (≥ 0) and wake the sleepers due."""
        if seconds < 0:
            raise ValueError("a monotonic clock never goes back")
        self._mono += seconds
        self._wall += seconds
        due = [(at, ev) for at, ev in self._sleepers if at <= self._mono]
        self._sleepers = [(at, ev) for at, ev in self._sleepers if at > self._mono]
        for _at, ev in due:
            ev.set()

    def jump_wall(self, seconds: float) -> None:
        """Move only the wall reading (either way): a system clock that jumps."""
        self._wall += seconds


def rfc3339(unix: float) -> str:
    """Unix seconds → ``YYYY-MM-DDTHH:MM:SSZ`` (UTC), the stamp every host event and
    listing uses (:func:`node.trust.invitation.rfc3339`'s format)."""
    from datetime import datetime, timezone

    from node.trust.invitation import rfc3339 as format_rfc3339

    return format_rfc3339(datetime.fromtimestamp(unix, timezone.utc))


def unix_of(rfc3339_text: str) -> float:
    """An RFC 3339 stamp with a zone (:func:`node.trust.invitation.parse_rfc3339`) →
    Unix seconds; 0.0 when it is not one (an unreadable expiry then counts as expired)."""
    from node.trust.invitation import parse_rfc3339

    try:
        return parse_rfc3339(rfc3339_text).timestamp()
    except ValueError:
        return 0.0


#: The clock a host uses unless it is given another.
SYSTEM_CLOCK = SystemClock()

__all__ = ["Clock", "ManualClock", "SYSTEM_CLOCK", "SystemClock", "rfc3339", "unix_of"]
