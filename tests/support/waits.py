"""Bounded waits on a condition: what a test does instead of a fixed sleep.

A test that needs something to have happened (a card posted, a record written, a socket
closed) polls for it with :func:`wait_for`, which fails with a sentence naming what did not
happen once its bound is spent. Async tests of an in-process host use :func:`until`
(:meth:`support.hosts.InProcessHost.until` / :meth:`support.memory.MemoryHost.until`);
given the host's ManualClock and a ``tick_s`` it also drives the host's background
machines (the peers watcher, the view warmer, the sealed take loop, the post keeper), which
sleep on that clock and wake only when it is advanced.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import anyio


def wait_for(what: str, check: Callable[[], Any], *, timeout_s: float = 60.0,
             every_s: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy and return that value.

    Args:
        what: what is awaited, for the failure message ("the card on the server").
        check: called with no argument, at once and then every ``every_s`` seconds.
        timeout_s: the bound, seconds.
        every_s: the poll interval, seconds.

    Raises:
        AssertionError: ``check`` stayed falsy for ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(every_s)


def answered_and_acked(held: Callable[[], list[str]], question_ids: list[str]) -> Callable[[], bool]:
    """The check of :func:`wait_for` for a host that took sealed questions from a holder:
    the holder keeps something (the sealed answer) and none of ``question_ids`` any more.

    A host leaves each answer first and acks the questions it answered after, in one call
    (:func:`node.community.inbox.take_step`); a test that stopped the host on the first new
    record could stop it between the two and find the question still held.

    Args:
        held: returns the record ids the holder keeps now.
        question_ids: the record ids it kept before the host took them.

    Returns:
        a ``() -> bool``.
    """
    def check() -> bool:
        ids = held()
        return bool(ids) and not set(ids) & set(question_ids)

    return check


async def until(cond: Callable[[], Any], timeout: float, *, clock: Any = None, tick_s: float | None = None,
                every_s: float = 0.005) -> None:
    """Poll ``cond`` on the event loop until it is truthy (an async test's :func:`wait_for`).

    Args:
        cond: called with no argument, at once and then every ``every_s`` seconds.
        timeout: the bound, seconds of real time.
        clock: the host's :class:`node.runtime.clock.ManualClock`, or None.
        tick_s: with ``clock``: advance it by this many seconds before each poll, so a
            machine that sleeps on it (a poll period, a retry) runs again; the period of
            the machine a test waits on (e.g. ``node.host.revocation.POLL_INTERVAL_S``).
        every_s: the poll interval, seconds of real time.

    Raises:
        TimeoutError: ``cond`` stayed falsy for ``timeout`` seconds.
    """
    with anyio.fail_after(timeout):
        while not cond():
            if tick_s is not None:
                clock.advance(tick_s)
            await anyio.sleep(every_s)
