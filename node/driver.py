"""``run_session``: the one pump every transport uses (memory pipe, iroh).

It reads bytes from a :class:`node.transport.base.ByteStream`, feeds them to a
:class:`node.engine.session.SessionEngine`, calls the protocol hooks for the events the
engine reports (sync hooks in a worker thread, all hooks under ``hook_timeout_s``), hands
hook output back to the engine (which validates it), and writes what the engine queued.
Every wait is bounded: each handshake step by ``handshake_timeout_s`` (10 s), the business
loop by the protocol's ``idle_timeout_s``.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import anyio

from node.engine.session import (
    Event,
    MessageReceived,
    MessageRefused,
    ProofVerified,
    RemoteError,
    SessionClosed,
    SessionEngine,
    SessionReady,
)
from node.errors import CODES, EgressRefused, HookError, KithError, TransportError
from node.hooks import HookContext, HookResult, Hooks, normalize_result

log = logging.getLogger("kith.session")

HANDSHAKE_TIMEOUT_S = 10.0


@dataclass
class SessionOutcome:
    """How a session ended.

    Attributes:
        session_id: 64 hex, or None if the handshake never produced one.
        reason: ``completed`` | ``rejected`` | ``aborted`` | ``peer-disconnected``.
        code: the stable code of a rejection/abort (None when completed).
        message: human text for ``code``.
        proof: the session proof (both signatures) once the handshake completed.
        remote_errors: ``(code, message)`` pairs the peer reported with ``_error``.
        refused: codes of incoming messages the engine refused before hooks.
    """

    session_id: str | None
    reason: str
    code: str | None = None
    message: str = ""
    proof: dict[str, Any] | None = None
    remote_errors: list[tuple[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True for a session that completed cleanly."""
        return self.reason == "completed"


async def _call_hook(fn: Callable[..., Any] | None, args: tuple[Any, ...], timeout_s: float | None) -> HookResult:
    if fn is None:
        return HookResult()
    try:
        with anyio.fail_after(timeout_s):
            if inspect.iscoroutinefunction(fn):
                value = await fn(*args)
            else:
                value = await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
                if inspect.isawaitable(value):
                    value = await value
    except TimeoutError:
        raise HookError("hook-timeout", f"{getattr(fn, '__name__', 'hook')} did not finish within {timeout_s} s") from None
    except KithError:
        raise
    except Exception as exc:  # a hook bug must not crash the node
        log.warning("hook %s raised %s", getattr(fn, "__name__", "hook"), type(exc).__name__, exc_info=True)
        raise HookError("hook-failed", f"{getattr(fn, '__name__', 'hook')} raised {type(exc).__name__}") from None
    return normalize_result(value)


async def run_session(
    stream: Any,
    engine: SessionEngine,
    hooks: Hooks,
    *,
    make_context: Callable[[SessionReady], HookContext],
    on_proof: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    hook_timeout_s: float | None | str = "spec",
    idle_timeout_s: float | None | str = "spec",
) -> SessionOutcome:
    """Run one session to its end over ``stream`` and return how it ended.

    Args:
        stream: a ByteStream (``receive``/``send``/``send_eof``/``aclose``).
        engine: a fresh engine for our role (the guest's sends ``_session_init`` here).
        hooks: the protocol's loaded hooks.
        make_context: builds the :class:`HookContext` once the session is ready.
        on_proof: guest only — called with the verified proof before ``_session_ready``
            (submits it to the community server); its errors are logged, not fatal.
        hook_timeout_s / idle_timeout_s: seconds; ``"spec"`` takes the protocol's limits,
            None disables the bound (an interactive guest waiting on its user).

    Never raises for peer behaviour; transport failures end the session as
    ``peer-disconnected``. The stream is closed on return.
    """
    limits = engine.spec.limits
    hook_t = limits.hook_timeout_s if hook_timeout_s == "spec" else hook_timeout_s
    idle_t = limits.idle_timeout_s if idle_timeout_s == "spec" else idle_timeout_s
    outcome = SessionOutcome(session_id=None, reason="aborted")
    ctx: HookContext | None = None

    async def flush() -> None:
        data = engine.data_to_send()
        if data:
            await stream.send(data)

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

    async def process(events: list[Event]) -> None:
        nonlocal ctx
        queue = list(events)
        while queue:
            ev = queue.pop(0)
            if isinstance(ev, ProofVerified):
                if on_proof is not None:
                    try:
                        await on_proof(ev.proof)
                    except KithError as exc:
                        log.warning("could not record the session proof: %s", exc.message)
                queue[:0] = engine.confirm_ready()
            elif isinstance(ev, SessionReady):
                outcome.session_id = ev.session_id
                outcome.proof = ev.proof
                ctx = make_context(ev)
                queue[:0] = await hook(hooks.on_start, ctx)
            elif isinstance(ev, MessageReceived):
                assert ctx is not None
                queue[:0] = await hook(hooks.on_message, ctx, ev.message)
            elif isinstance(ev, MessageRefused):
                outcome.refused.append(ev.code)
            elif isinstance(ev, RemoteError):
                outcome.remote_errors.append((ev.code, ev.message))
            elif isinstance(ev, SessionClosed):
                outcome.reason, outcome.code, outcome.message = ev.reason, ev.code, ev.message
            await flush()
        await flush()

    try:
        if engine.role == "guest":
            engine.initiate()
            await flush()
        step_key: object = None
        step_deadline = 0.0
        while not engine.closed:
            if ctx is None:
                # one deadline per handshake step: bytes trickling in do not extend it
                key = (engine.state, engine.session_id)
                if key != step_key:
                    step_key, step_deadline = key, anyio.current_time() + handshake_timeout_s
                timeout: float | None = max(0.0, step_deadline - anyio.current_time())
            else:
                timeout = idle_t
            try:
                with anyio.fail_after(timeout):
                    data = await stream.receive()
            except TimeoutError:
                code = "handshake-timeout" if ctx is None else "idle-timeout"
                await process(engine.abort(code))
                break
            except TransportError:
                data = b""
            await process(engine.receive_data(data) if data else engine.receive_eof())
    except TransportError:
        if not engine.closed:
            engine.receive_eof()
        if engine.close_event is not None:
            ev = engine.close_event
            outcome.reason, outcome.code, outcome.message = ev.reason, ev.code, ev.message
    finally:
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(2):
                    await flush()
                    await stream.send_eof()
            except TransportError:
                pass
            if ctx is not None:
                reason = outcome.code or outcome.reason
                try:
                    await _call_hook(hooks.on_end, (ctx, reason), hook_t)
                except HookError as exc:
                    log.warning("on_end failed: %s", exc.message)
            with anyio.move_on_after(2):
                await stream.aclose()
    return outcome
