"""``run_session``: the one pump every transport uses (memory pipe, iroh).

It reads bytes from a :class:`node.transport.base.ByteStream`, feeds them to a
:class:`node.engine.session.SessionEngine`, calls the protocol hooks for the events the
engine reports (sync hooks in a worker thread — or on the event loop, when the hook says
the call is small: ``inline``, node/runtime/hooks.py — all hooks under
``hook_timeout_s``), hands
hook output back to the engine (which validates it), and writes what the engine queued.
Every wait is bounded: each handshake step by ``handshake_timeout_s`` (10 s), the business
loop by the protocol's ``idle_timeout_s``, the peer's liveness by the heartbeat
(``_ping`` every 10 s, no frame for 30 s → ``peer-unresponsive``; DESIGN §3), every send by
``send_timeout_s``. The timing decisions are the engine's (``node.engine.timers``, time
as input); the driver only sleeps until the engine's next deadline.

Three tasks share one engine (all in one event loop, engine calls never interleave): a
*receiver* that reads and feeds bytes (so pings are answered even while a hook runs), a
*ticker* that applies the timers, and a *processor* that runs hooks for the events in
order. Outgoing bytes go through one lock, so frames are never interleaved.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import anyio
import anyio.lowlevel

from node.engine.events import (Event, MessageReceived, MessageRefused, ProofVerified, RemoteError, SessionClosed,
                                SessionReady, UiArtifactReceived, UiArtifactRefused)
from node.engine.session import SessionEngine
from node.engine.timers import INFLIGHT_PING_S, INFLIGHT_UNRESPONSIVE_S, PING_INTERVAL_S, UNRESPONSIVE_S, Timeouts
from node.common.errors import CODES, EgressRefused, HookError, KithError, TransportError
from node.runtime.hooks import HookContext, HookResult, Hooks, normalize_result
from node.runtime.clock import SYSTEM_CLOCK, Clock
from node.transport.base import ByteStream

log = logging.getLogger("kith.session")

HANDSHAKE_TIMEOUT_S = 10.0
#: ``_error`` frames kept in the outcome per session (the rest are dropped: bounded memory)
MAX_REMOTE_ERRORS = 32
#: Events the receiver may queue ahead of the processor before it stops reading (the
#: transport's flow control then pushes back on the peer).
MAX_QUEUED_EVENTS = 64
#: After the peer ended the session cleanly, how long hooks still queued may run (s).
DRAIN_GRACE_S = 1.0


#: Test-only override of the heartbeat, ``"<ping_interval_s>,<unresponsive_s>"`` (e.g.
#: ``"0.2,1"``), so that tests and the load script can watch a killed ``kith join``
#: being detected in about a second instead of 30. Never set it in production.
TEST_HEARTBEAT_ENV = "KITH_TEST_HEARTBEAT"


def heartbeat_from_env(environ: dict[str, str] | None = None) -> tuple[float, float] | None:
    """Parse the test-only :data:`TEST_HEARTBEAT_ENV` override.

    Returns:
        ``(ping_interval_s, unresponsive_s)``, or None when unset or malformed (a malformed
        value is ignored so a typo can never disable the heartbeat).
    """
    raw = (environ if environ is not None else os.environ).get(TEST_HEARTBEAT_ENV, "")
    if not raw:
        return None
    try:
        ping, dead = (float(x) for x in raw.split(","))
    except ValueError:
        return None
    if not (0 < ping < dead <= 3600):
        return None
    return ping, dead


def default_heartbeat() -> tuple[float, float]:
    """``(ping_interval_s, unresponsive_s)``: (10, 30) unless the test-only
    ``KITH_TEST_HEARTBEAT`` variable overrides it (:func:`heartbeat_from_env`: the driver
    reads the environment, the engine never does)."""
    return heartbeat_from_env() or (PING_INTERVAL_S, UNRESPONSIVE_S)


def inflight_heartbeat() -> tuple[float, float]:
    """``(ping_interval_s, unresponsive_s)`` while a guest's question is in flight: (1, 4)
    (``node.engine.timers.INFLIGHT_*``), or the test-only ``KITH_TEST_HEARTBEAT`` values
    when that variable is set (one heartbeat for the whole session then)."""
    return heartbeat_from_env() or (INFLIGHT_PING_S, INFLIGHT_UNRESPONSIVE_S)


@dataclass
class SessionOutcome:
    """How a session ended.

    Attributes:
        session_id: 64 hex, or None if the handshake never produced one.
        reason: ``completed`` | ``rejected`` | ``aborted`` | ``peer-disconnected``.
        code: the stable code of a rejection/abort (None when completed).
        message: human text for ``code``.
        proof: the session proof (both signatures) once the handshake completed.
        remote_errors: ``(code, message)`` pairs the peer reported with ``_error`` —
            recorded as they arrive, even while a hook is still running.
        refused: codes of incoming messages the engine refused before hooks.
        ui_refused: ``(code, side)`` when the UI branch failed (side that refused).
        ui_received: bytes of UI bundle received and verified (guest), 0 otherwise.
        ui_path: where the guest installed the UI (``on_ui``'s return value), or None.
        peer_end: the peer's terminal message when the *peer* ended the session (e.g. a
            host on SIGTERM: ``{"action": "end", "reason": "shutdown"}``), else None —
            recorded as it arrives, even while a hook is still running.
        ended_at: Unix time (s) when the engine ended the session — before the stream is
            flushed and closed, which may take up to a few seconds with a dead peer; always
            set once :func:`run_session` returned (the host's ``session-ended`` carries it).
        last_heard_at: Unix time (s) of the peer's last complete frame when the session
            ended (for ``peer-unresponsive``: since when the peer has been silent), or None
            before the handshake.
    """

    session_id: str | None
    reason: str
    code: str | None = None
    message: str = ""
    proof: dict[str, Any] | None = None
    remote_errors: list[tuple[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    ui_refused: list[tuple[str, str]] = field(default_factory=list)
    ui_received: int = 0
    ui_path: Any = None
    peer_end: dict[str, Any] | None = None
    ended_at: float | None = None
    last_heard_at: float | None = None

    @property
    def ok(self) -> bool:
        """True for a session that completed cleanly."""
        return self.reason == "completed"


#: Worker threads per event loop for the sync hooks that say how large each call is
#: (an ``inline`` predicate, :mod:`node.runtime.hooks`) and were told it is large: a few,
#: so a burst of large searches does not become a pile of threads on a 2-core host.
HOOK_THREADS = 4
#: Honour the hooks' ``inline`` predicates (False: every sync hook in a worker thread, as
#: before issue 31 — ``scripts/load`` measures both in one run).
INLINE_HOOKS = True
_hook_limiter: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("kith_hook_limiter")


def _bounded_hook_threads() -> anyio.CapacityLimiter:
    """This event loop's :data:`HOOK_THREADS` limiter (made on first use)."""
    try:
        return _hook_limiter.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(HOOK_THREADS)
        _hook_limiter.set(limiter)
        return limiter


def _runs_inline(fn: Any, args: tuple[Any, ...]) -> bool | None:
    """The hook's own word on this call (:mod:`node.runtime.hooks`, ``inline``): True —
    small, run it on the event loop; False — large, run it in the bounded hook threads;
    None — it says nothing (every hook without ``inline``, or a predicate answering
    None): a worker thread, as always. A predicate that raises counts as False."""
    inline = getattr(fn, "inline", None)
    if inline is None or not INLINE_HOOKS:
        return None
    try:
        said = inline(*args)
        return None if said is None else bool(said)
    except Exception:  # a broken predicate must not break the session: the safe way
        log.warning("hook %s: its inline predicate raised", getattr(fn, "__name__", "hook"), exc_info=True)
        return False


def _log_refusal(fn: Any, exc: KithError) -> None:
    """A hook ended by a refusal (a fault of the home, most often): its code, message and
    hint in one line — the owner's way out (the peer is told only ``hook-failed``)."""
    log.warning("hook %s refused: [%s] %s%s", getattr(fn, "__name__", "hook"), exc.code, exc.message,
                f" — hint: {exc.hint}" if exc.hint else "")


async def _call_hook(fn: Callable[..., Any] | None, args: tuple[Any, ...], timeout_s: float | None) -> HookResult:
    if fn is None:
        return HookResult()
    # one deadline for the whole call (its thread part and any awaitable it returns); a
    # call run inline on the loop gets no cancel scope: nothing could interrupt it
    deadline = math.inf if timeout_s is None else anyio.current_time() + timeout_s
    try:
        if inspect.iscoroutinefunction(fn):
            with anyio.fail_at(deadline):
                value = await fn(*args)
        else:
            inline = _runs_inline(fn, args)
            if inline:
                # small work: no thread hop (hook_timeout_s cannot interrupt it), even while
                # other calls run in threads — taking a thread too whenever one was busy
                # kept 16 guests' answers in threads for good, at 1.5x the host CPU per
                # answer and 0.65x the throughput of answering inline (scripts/load 2a)
                value = fn(*args)
            else:
                with anyio.fail_at(deadline):
                    if inline is None:
                        value = await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
                    else:
                        value = await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True,
                                                               limiter=_bounded_hook_threads())
        if inspect.isawaitable(value):
            with anyio.fail_at(deadline):
                value = await value
    except TimeoutError:
        raise HookError("hook-timeout", f"{getattr(fn, '__name__', 'hook')} did not finish within {timeout_s} s") from None
    except HookError:
        raise
    except KithError as exc:  # e.g. a CorpusError inside a hook: still the hook's failure
        _log_refusal(fn, exc)
        raise HookError("hook-failed", f"{getattr(fn, '__name__', 'hook')} failed ({exc.code})") from None
    except OSError as exc:  # a file of the home: disk-full or io-error, told with its way out
        from node.common.dbfaults import DISK_FULL_ERRNOS, disk_full, io_error

        where = str(exc.filename) if exc.filename else "the Kith home"
        refusal = disk_full(where) if exc.errno in DISK_FULL_ERRNOS else io_error(where, exc.strerror or type(exc).__name__)
        _log_refusal(fn, refusal)
        raise HookError("hook-failed", f"{getattr(fn, '__name__', 'hook')} failed ({refusal.code})") from None
    except Exception as exc:  # a hook bug must not crash the node
        log.warning("hook %s raised %s", getattr(fn, "__name__", "hook"), type(exc).__name__, exc_info=True)
        raise HookError("hook-failed", f"{getattr(fn, '__name__', 'hook')} raised {type(exc).__name__}") from None
    return normalize_result(value)


async def run_session(
    stream: ByteStream,
    engine: SessionEngine,
    hooks: Hooks,
    *,
    make_context: Callable[[SessionReady], HookContext],
    on_proof: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    on_ui: Callable[[UiArtifactReceived, str], Any] | None = None,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    hook_timeout_s: float | None | str = "spec",
    idle_timeout_s: float | None | str = "spec",
    heartbeat: tuple[float, float] | None | str = "default",
    send_timeout_s: float | None | str = "default",
    stop: anyio.Event | None = None,
    on_refused: Callable[[str, str], None] | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> SessionOutcome:
    """Run one session to its end over ``stream`` and return how it ended.

    Args:
        stream: the session's :class:`node.transport.base.ByteStream` (memory pipe, iroh).
        engine: a fresh engine for our role (the guest's sends ``_session_init`` here).
        hooks: the protocol's loaded hooks.
        make_context: builds the :class:`HookContext` once the session is ready.
        on_proof: guest only — called with the verified proof before ``_session_ready``
            (submits it to the community server); its errors are logged, not fatal.
        on_ui: guest only — called (in a worker thread) with the verified UI bundle and
            the session id; installs it and returns where (kept in ``outcome.ui_path``).
            A :class:`node.common.errors.KithError` from it is logged, not fatal.
        handshake_timeout_s: bound of each handshake step (s).
        hook_timeout_s / idle_timeout_s: seconds; ``"spec"`` takes the protocol's limits,
            None disables the bound (an interactive guest waiting on its user).
        heartbeat: ``(ping_interval_s, unresponsive_s)``; ``"default"`` = (10, 30) while
            idle and (1, 4) while a guest's question is in flight
            (:func:`inflight_heartbeat`), or the test-only ``KITH_TEST_HEARTBEAT`` override
            for both; a tuple given applies throughout; None disables it.
        send_timeout_s: bound of one send (s); ``"default"`` = the unresponsive bound. A
            peer that stops reading is aborted with ``peer-unresponsive``.
        stop: when set, the session ends cleanly after the current hook: the protocol's
            terminal message (``end``) or ``_error session-shutdown`` is sent.
        on_refused: called (on the event loop) with ``(code, message)`` of each message
            of the peer this engine refused (``message-schema-invalid``, …; the engine has
            answered it with ``_error`` and counts it against ``max_invalid``).
        clock: the :class:`node.runtime.clock.Clock` the ticker waits on until the engine's
            next deadline; the engine must read the same clock
            (``SessionEngine(clock=clock.monotonic)``), so a test that builds both on a
            :class:`~node.runtime.clock.ManualClock` drives heartbeats and timeouts by
            advancing it. A host's sessions run on the real clock: their timers measure a
            live peer over a real transport (the host's own clock drives admission,
            eviction and expiry, :mod:`node.host.host`).

    Never raises for peer behaviour; transport failures end the session as
    ``peer-disconnected``. The stream is closed on return; ``on_end`` gets the reason
    (``completed``, ``peer-disconnected``, ``peer-unresponsive``, ``idle-timeout``,
    ``session-shutdown``, or the abort code).
    """
    limits = engine.spec.limits
    hook_t = limits.hook_timeout_s if hook_timeout_s == "spec" else hook_timeout_s
    idle_t = limits.idle_timeout_s if idle_timeout_s == "spec" else idle_timeout_s
    hb = default_heartbeat() if heartbeat == "default" else heartbeat
    flight = inflight_heartbeat() if heartbeat == "default" else None
    send_t = (hb[1] if hb else None) if send_timeout_s == "default" else send_timeout_s
    engine.set_timeouts(Timeouts(handshake_step_s=handshake_timeout_s, ping_interval_s=hb[0] if hb else None,
                                 unresponsive_s=hb[1] if hb else None, idle_s=idle_t,
                                 inflight_ping_s=flight[0] if flight else None,
                                 inflight_unresponsive_s=flight[1] if flight else None))
    tick_cap = min(1.0, hb[0]) if hb else 1.0
    outcome = SessionOutcome(session_id=None, reason="aborted")
    ctx: HookContext | None = None
    send_lock = anyio.Lock(fast_acquire=True)  # uncontended (most flushes): no checkpoint, no loop turn
    queue_in, queue_out = anyio.create_memory_object_stream[Any](math.inf)
    shutdown_marker = object()
    write_dead = False
    write_failed = anyio.Event()  # a send failed: the watchdog ends the session unless it ends first

    def emit(events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, MessageReceived) and ev.terminal and outcome.peer_end is None:
                outcome.peer_end = ev.message
            elif isinstance(ev, RemoteError) and len(outcome.remote_errors) < MAX_REMOTE_ERRORS:
                # recorded as it arrives: the peer's reason for hanging up (e.g. session-revoked)
                # must survive even while a hook (the guest's ask> prompt) is still running
                outcome.remote_errors.append((ev.code, ev.message))
            queue_in.send_nowait(ev)

    async def flush() -> None:
        nonlocal write_dead
        if not engine.has_data_to_send:  # most flushes after a receive: nothing to send, no lock
            return
        async with send_lock:
            data = engine.data_to_send()
            if not data or write_dead:
                return
            try:
                if send_t is None:
                    await stream.send(data)
                else:  # a bare scope: fail_after's generator wrapper cost ~4 µs a send
                    with anyio.CancelScope(deadline=anyio.current_time() + send_t) as scope:
                        await stream.send(data)
                    if scope.cancelled_caught:
                        write_dead = True
                        emit(engine.abort("peer-unresponsive", "the peer stopped reading"))
                        engine.data_to_send()
            except TransportError:
                # the peer may have closed after sending its last frame (a _session_reject
                # at _session_ready): the receiver reads what arrived first, and the session
                # is lost only if it has not ended within DRAIN_GRACE_S (watchdog below)
                write_dead = True
                write_failed.set()

    async def watchdog() -> None:
        while not engine.closed:
            with anyio.move_on_after(tick_cap):
                await write_failed.wait()
            if write_failed.is_set():
                await anyio.sleep(DRAIN_GRACE_S)
                if not engine.closed:
                    emit(engine.connection_lost())
                return

    async def deliver(result: HookResult) -> list[Event]:
        out: list[Event] = []
        for msg in result.messages:
            if engine.closed:
                break
            try:
                out.extend(engine.send_message(msg))
            except HookError as exc:
                log.warning("hook output refused: %s", exc.message)
                out.extend(engine.abort(exc.code, exc.message))
            except EgressRefused as exc:
                log.warning("egress gate refused an outgoing message")
                out.extend(engine.abort(exc.code, exc.message))
        if result.abort and not engine.closed:
            # a hook may only abort with a registered code; anything else is a hook bug
            code = result.abort if result.abort in CODES else "hook-failed"
            out.extend(engine.abort(code))
        elif result.completed and not engine.closed:
            out.extend(engine.finish())
        return out

    async def hook(fn: Any, *args: Any) -> list[Event]:
        try:
            return await deliver(await _call_hook(fn, args, hook_t))
        except HookError as exc:
            return engine.abort(exc.code, exc.message)

    async def handle(ev: Any) -> list[Event]:
        nonlocal ctx
        if ev is shutdown_marker:
            return engine.shutdown()
        if isinstance(ev, ProofVerified):
            if on_proof is not None:
                try:
                    await on_proof(ev.proof)
                except KithError as exc:
                    log.warning("could not record the session proof: %s", exc.message)
            return [] if engine.closed else engine.confirm_ready()
        if isinstance(ev, SessionReady):
            outcome.session_id = ev.session_id
            outcome.proof = ev.proof
            ctx = make_context(ev)
            return await hook(hooks.on_start, ctx)
        if isinstance(ev, MessageReceived):
            if ctx is None or (engine.closed and not ev.terminal):
                return []
            return await hook(hooks.on_message, ctx, ev.message)
        if isinstance(ev, MessageRefused):
            outcome.refused.append(ev.code)
            if on_refused is not None:
                on_refused(ev.code, ev.message)
        elif isinstance(ev, RemoteError):
            pass  # recorded in emit() (bounded by MAX_REMOTE_ERRORS: a peer may send thousands)
        elif isinstance(ev, UiArtifactRefused):
            outcome.ui_refused.append((ev.code, ev.by))
        elif isinstance(ev, UiArtifactReceived):
            outcome.ui_received = ev.total_bytes
            if on_ui is not None:
                try:
                    outcome.ui_path = await anyio.to_thread.run_sync(on_ui, ev, engine.session_id or "")
                except KithError as exc:
                    log.warning("could not install the host's UI: %s", exc.message)
        elif isinstance(ev, SessionClosed):
            outcome.reason, outcome.code, outcome.message = ev.reason, ev.code, ev.message
            if outcome.ended_at is None:
                outcome.ended_at = time.time()
                if outcome.session_id is not None:
                    outcome.last_heard_at = outcome.ended_at - engine.timers.silence(engine.clock())
        return []

    async def processor(scope: anyio.CancelScope) -> None:
        while True:
            try:  # an event already queued is taken without a loop turn (receive() always yields once)
                first = queue_out.receive_nowait()
            except anyio.WouldBlock:
                try:
                    first = await queue_out.receive()
                except anyio.EndOfStream:
                    break
            except anyio.EndOfStream:
                break
            pending = [first]
            while pending:
                ev = pending.pop(0)
                pending[:0] = await handle(ev)
                await flush()
            if engine.closed and engine.close_event is not None and outcome.reason == engine.close_event.reason \
                    and outcome.code == engine.close_event.code:
                break
        scope.cancel()

    def abandon_hooks_if_aborted(scope: anyio.CancelScope) -> None:
        # the session ended under the processor (peer's terminal message, abort, timeout):
        # a hook still running has no one to answer. After a clean `completed` end the
        # processor gets DRAIN_GRACE_S to run the queued hooks (the terminal message's
        # on_message); after anything else it stops now.
        if engine.closed and engine.close_event is not None:
            if engine.close_event.reason != "completed":
                scope.cancel()
            else:
                scope.deadline = min(scope.deadline, anyio.current_time() + DRAIN_GRACE_S)

    async def receiver(scope: anyio.CancelScope) -> None:
        while not engine.closed:
            try:
                data = await stream.receive()
            except TransportError:
                data = b""
            if engine.closed:
                return
            events = engine.receive_data(data) if data else engine.receive_eof()
            await flush()
            emit(events)
            abandon_hooks_if_aborted(scope)
            if not data:
                return
            while queue_out.statistics().current_buffer_used > MAX_QUEUED_EVENTS and not engine.closed:
                await anyio.sleep(0.005)

    async def ticker(scope: anyio.CancelScope) -> None:
        now = engine.clock
        while not engine.closed:
            deadline = engine.next_deadline()
            delay = tick_cap if deadline is None else min(max(deadline - now(), 0.0), tick_cap)
            await clock.sleep(delay)
            events = engine.tick()
            await flush()
            emit(events)
            abandon_hooks_if_aborted(scope)

    async def stopper() -> None:
        assert stop is not None
        await stop.wait()
        queue_in.send_nowait(shutdown_marker)

    try:
        if engine.role == "guest":
            engine.initiate()
            await flush()
        async with anyio.create_task_group() as tg:
            tg.start_soon(processor, tg.cancel_scope)
            tg.start_soon(receiver, tg.cancel_scope)
            tg.start_soon(ticker, tg.cancel_scope)
            tg.start_soon(watchdog)
            if stop is not None:
                tg.start_soon(stopper)
    finally:
        with anyio.CancelScope(shield=True):
            if not engine.closed:  # cancelled from outside (Ctrl-C): end cleanly
                engine.shutdown()
            if engine.close_event is not None and outcome.reason == "aborted" and outcome.code is None:
                ev = engine.close_event
                outcome.reason, outcome.code, outcome.message = ev.reason, ev.code, ev.message
            if outcome.ended_at is None:  # the processor was cancelled before it took the close event
                outcome.ended_at = time.time()  # (a receiver seeing EOF cancels at once): the end is now
            if outcome.last_heard_at is None and engine.session_id is not None:
                outcome.last_heard_at = outcome.ended_at - engine.timers.silence(engine.clock())
            try:
                with anyio.move_on_after(2):
                    await flush()
                    await stream.send_eof()
            except TransportError:
                pass
            if outcome.code == "peer-unresponsive" and hasattr(stream, "drain_timeout_s"):
                stream.drain_timeout_s = 0.0  # a silent peer acknowledges nothing: do not wait for it
            if ctx is not None:
                reason = outcome.code or outcome.reason
                try:
                    await _call_hook(hooks.on_end, (ctx, reason), hook_t)
                except HookError as exc:
                    log.warning("on_end failed: %s", exc.message)
            with anyio.move_on_after(2):
                await stream.aclose()
            queue_in.close()
            queue_out.close()
    return outcome
