"""run_session over the memory pipe: hooks, timeouts, disconnects, hook failures,
heartbeats, a zombie peer, clean shutdown and every end reason reaching ``on_end``."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from node.runtime.driver import run_session
from node.runtime.hooks import HookResult, Hooks, load_hooks
from node.protocol.spec import load_spec
from node.transport.memory import memory_pipe

from support.engines import ctx_factory, engines, run_pair
from support.homes import PROTOCOLS

ECHO = PROTOCOLS / "echo"


def recording(hooks: Hooks, ended: list) -> Hooks:
    def on_end(ctx, reason):
        ended.append(reason)
        if hooks.on_end:
            hooks.on_end(ctx, reason)
    return Hooks(on_start=hooks.on_start, on_message=hooks.on_message, on_end=on_end, module=hooks.module)


def test_echo_session_completes_and_on_end_gets_completed(host_id, guest_id):
    spec = load_spec(ECHO)
    h_end, g_end, got = [], [], []
    out = anyio.run(run_pair, spec, host_id, guest_id, recording(load_hooks(ECHO), h_end),
                    recording(load_hooks(ECHO), g_end), {"texts": ["a", "b", "c"], "on_message": got.append})
    assert out["host"].ok and out["guest"].ok
    assert [m["text"] for m in got] == ["A", "B", "C"]
    assert h_end == ["completed"] and g_end == ["completed"]
    assert out["host"].session_id == out["guest"].session_id


def test_dropped_connection_ends_with_peer_disconnected(host_id, guest_id):
    spec = load_spec(ECHO)
    h_end = []

    async def scenario():
        h_eng, g_eng = engines(spec, host_id, guest_id)
        g_stream, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)

        async with anyio.create_task_group() as tg:
            result = {}

            async def host():
                result["host"] = await run_session(h_stream, h_eng, recording(load_hooks(ECHO), h_end),
                                                   make_context=ctx_factory("host"))

            async def guest():
                # run the handshake by hand, then drop the pipe without a terminal message
                g_eng.initiate()
                await g_stream.send(g_eng.data_to_send())
                while g_eng.state.value != "await-confirm":
                    g_eng.receive_data(await g_stream.receive())
                g_eng.confirm_ready()
                await g_stream.send(g_eng.data_to_send())
                await anyio.sleep(0.05)
                await g_stream.aclose()

            tg.start_soon(host)
            tg.start_soon(guest)
        return result

    async def bounded():
        with anyio.fail_after(20):
            return await scenario()

    result = anyio.run(bounded)
    assert result["host"].reason == "peer-disconnected"
    assert h_end == ["peer-disconnected"]
    # when it ended, whichever of the driver's tasks saw the end first (the host's
    # session-ended event carries it; it was None when the receiver's cancel beat the
    # processor to the engine's close event, and the event broke its schema under load)
    assert result["host"].ended_at is not None


async def advance_until(clock, ended, step_s: float, limit_s: float) -> float:
    """Advance the session's ManualClock ``clock`` by ``step_s`` whenever its ticker is
    asleep on it, until ``ended()``; the seconds the clock moved. Real time bounds only a
    failure (60 s); the session's clock bounds the behaviour: AssertionError once it moved
    ``limit_s`` without ``ended()``."""
    # a step a float holds exactly (1/16 s): a reading that lands on a deadline the engine
    # computed as a sum can fall short of it by rounding, and the ticker then spins on
    # sleep(0) at that reading instead of sleeping on the clock
    assert (step_s * 1024).is_integer(), step_s
    start = clock.monotonic()
    with anyio.fail_after(60):
        while not ended():
            if clock.sleepers():
                assert clock.monotonic() - start < limit_s, f"not ended after {limit_s} s of the session's clock"
                clock.advance(step_s)
            await anyio.sleep(0.001)
    return clock.monotonic() - start


def test_silent_guest_hits_the_handshake_timeout(host_id, guest_id):
    """A guest that connects and says nothing is ended by the handshake step's bound: at
    0.3 s of the session's clock, not before and not never (a ManualClock the test moves)."""
    from node.runtime.clock import ManualClock

    spec = load_spec(ECHO)
    clock = ManualClock()

    async def scenario():
        h_eng, _ = engines(spec, host_id, guest_id, clock=clock)
        _g, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)
        out = {}

        async def host():
            out["host"] = await run_session(h_stream, h_eng, load_hooks(ECHO), make_context=ctx_factory("host"),
                                            handshake_timeout_s=0.3, clock=clock)

        async with anyio.create_task_group() as tg:
            tg.start_soon(host)
            moved = await advance_until(clock, lambda: h_eng.closed, 1 / 16, 5.0)
        return out["host"], moved

    out, moved = anyio.run(scenario)
    assert (out.reason, out.code) == ("rejected", "handshake-timeout")
    assert 0.3 - 1e-6 <= moved < 1.0, moved


def test_slow_hook_is_aborted_with_hook_timeout(host_id, guest_id):
    spec = load_spec(ECHO)

    released = threading.Event()

    def slow(ctx, message):  # returns only once the test is over (bounded)
        released.wait(timeout=30)
        return {"action": "echo", "text": "late", "count": 1}

    host_hooks = Hooks(on_message=slow)
    try:
        out = anyio.run(lambda: run_pair(spec, host_id, guest_id, host_hooks, load_hooks(ECHO), {"texts": ["x"]},
                                         hook_timeout_s=0.2))
    finally:
        released.set()
    assert out["host"].code == "hook-timeout"
    assert ("hook-timeout" in [c for c, _ in out["guest"].remote_errors]) or out["guest"].reason != "completed"


def test_crashing_hook_aborts_without_leaking_exception_text(host_id, guest_id):
    spec = load_spec(ECHO)

    def boom(ctx, message):
        raise RuntimeError("/home/owner/secret.txt exploded")

    out = anyio.run(lambda: run_pair(spec, host_id, guest_id, Hooks(on_message=boom), load_hooks(ECHO),
                                     {"texts": ["x"]}))
    assert out["host"].code == "hook-failed"
    for code, message in out["guest"].remote_errors:
        assert "secret" not in message and "/home" not in message


def test_invalid_hook_output_is_refused_before_sending(host_id, guest_id):
    spec = load_spec(ECHO)

    def wrong(ctx, message):
        return {"action": "echo", "text": "x"}  # missing required "count"

    out = anyio.run(lambda: run_pair(spec, host_id, guest_id, Hooks(on_message=wrong), load_hooks(ECHO),
                                     {"texts": ["x"]}))
    assert out["host"].code == "hook-output-invalid"


def test_trickling_bytes_do_not_extend_the_handshake_step(host_id, guest_id):
    """A guest that sends one byte every 0.125 s of the session's clock, never a whole
    frame: the step's bound (0.5 s) ends it with `handshake-timeout` long before the trickle
    (6 s) would end — each byte does not start the step again."""
    from node.runtime.clock import ManualClock

    spec = load_spec(ECHO)
    clock = ManualClock()

    async def scenario():
        h_eng, _ = engines(spec, host_id, guest_id, clock=clock)
        g_stream, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)
        result = {}
        sent = [0]

        async def host():
            result["out"] = await run_session(h_stream, h_eng, load_hooks(ECHO), make_context=ctx_factory("host"),
                                              handshake_timeout_s=0.5, clock=clock)

        async def trickle():  # one byte every 0.125 s of the session's clock, 48 of them (6 s)
            for _ in range(48):
                try:
                    await g_stream.send(b" ")
                except Exception:
                    return
                sent[0] += 1
                await clock.sleep(0.125)

        async with anyio.create_task_group() as tg:
            tg.start_soon(host)
            tg.start_soon(trickle)
            # the clock moves only while the ticker and the trickle are both asleep on it
            with anyio.fail_after(60):
                while not h_eng.closed:
                    if clock.sleepers() >= 2:
                        assert sent[0] < 48, "the trickle ended before the handshake step did"
                        clock.advance(0.125)
                    await anyio.sleep(0.001)
                while "out" not in result:
                    await anyio.sleep(0.001)
            tg.cancel_scope.cancel()  # the trickle, asleep on a clock that moves no more
        return result["out"], sent[0]

    out, sent = anyio.run(scenario)
    assert out.code == "handshake-timeout", (out.reason, out.code)
    assert sent <= 5, f"{sent} bytes (0.125 s apart) went in before the 0.5 s step ended"


def test_hook_abort_with_an_unregistered_code_becomes_hook_failed(host_id, guest_id):
    from node.runtime.hooks import HookResult

    spec = load_spec(ECHO)
    out = anyio.run(lambda: run_pair(spec, host_id, guest_id,
                                     Hooks(on_message=lambda ctx, m: HookResult(abort="made-up-code")),
                                     load_hooks(ECHO), {"texts": ["x"]}))
    assert out["host"].code == "hook-failed"


# ------------------------------------------------------------------ heartbeats and endings
# run_session over the memory pipe: heartbeats, a zombie peer, pings during a slow hook,
# clean shutdown, and every end reason reaching ``on_end``.

FAST = (0.05, 0.4)  # ping every 50 ms, unresponsive after 400 ms


async def zombie_guest(g_eng, g_stream, after_ready):
    """Handshake by hand, then go silent without closing (a frozen/killed process)."""
    g_eng.initiate()
    await g_stream.send(g_eng.data_to_send())
    while g_eng.state.value != "await-confirm":
        g_eng.receive_data(await g_stream.receive())
    g_eng.confirm_ready()
    await g_stream.send(g_eng.data_to_send())
    await after_ready()
    await anyio.sleep_forever()


def test_frozen_peer_is_detected_by_heartbeat_and_on_end_gets_the_reason(host_id, guest_id):
    """A guest that goes silent after the handshake without closing: the host's heartbeat
    ends the session `peer-unresponsive` once 0.4 s of the session's clock passed without a
    word (a ManualClock the test moves; pings every 0.05 s), and `on_end` gets the reason."""
    from node.engine.session import State
    from node.runtime.clock import ManualClock

    spec = load_spec(ECHO)
    ended = []
    clock = ManualClock()

    async def scenario():
        h_eng, g_eng = engines(spec, host_id, guest_id, clock=clock)
        g_stream, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)
        out = {}

        async def host():
            out["host"] = await run_session(h_stream, h_eng, recording(load_hooks(ECHO), ended),
                                            make_context=ctx_factory("host"), heartbeat=FAST, clock=clock)

        async with anyio.create_task_group() as tg:
            tg.start_soon(zombie_guest, g_eng, g_stream, anyio.lowlevel.checkpoint)
            tg.start_soon(host)
            with anyio.fail_after(60):  # the handshake done (the clock has not moved yet)
                while h_eng.state is not State.READY and not h_eng.closed:
                    await anyio.sleep(0.001)
            moved = await advance_until(clock, lambda: h_eng.closed, 1 / 16, 5.0)
            with anyio.fail_after(60):
                while "host" not in out:
                    await anyio.sleep(0.001)
            tg.cancel_scope.cancel()
        return out["host"], moved

    out, moved = anyio.run(scenario)
    assert (out.reason, out.code) == ("aborted", "peer-unresponsive")
    assert ended == ["peer-unresponsive"]
    assert out.session_id is not None  # the session existed: its id stays usable for feedback
    assert 0.4 - 1e-6 <= moved < 1.0, moved  # the unresponsive bound on the session's clock


def test_pings_are_answered_while_a_slow_hook_runs(host_id, guest_id):
    """A guest hook that takes longer than the unresponsive bound must not get the session
    killed: the receiver answers pings while the hook runs."""
    spec = load_spec(ECHO)
    base = load_hooks(ECHO)

    def slow_on_message(ctx, message):
        time.sleep(0.9)  # kept: the subject is real time (> 0.4 s unresponsive bound, < echo's 5 s hook timeout)
        return base.on_message(ctx, message)

    guest_hooks = Hooks(on_start=base.on_start, on_message=slow_on_message, on_end=base.on_end, module=base.module)
    out = anyio.run(lambda: run_pair(spec, host_id, guest_id, load_hooks(ECHO), guest_hooks,
                                     {"texts": ["a", "b"]}, heartbeat=FAST))
    assert out["host"].ok and out["guest"].ok, (out["host"], out["guest"])


def test_stop_ends_a_live_session_with_the_terminal_message(host_id, guest_id):
    spec = load_spec(ECHO)
    h_end, g_end = [], []
    stop = anyio.Event()

    def guest_on_start(ctx):
        return {"action": "say", "text": "hello"}

    def guest_on_message(ctx, message):
        stop.set()  # the host is asked to shut down while the guest still has a session
        return None

    guest_hooks = recording(Hooks(on_start=guest_on_start, on_message=guest_on_message), g_end)

    async def scenario():
        h_eng, g_eng = engines(spec, host_id, guest_id)
        g_stream, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)
        out = {}

        async def host():
            out["host"] = await run_session(h_stream, h_eng, recording(load_hooks(ECHO), h_end),
                                            make_context=ctx_factory("host"), stop=stop)

        async def guest():
            out["guest"] = await run_session(g_stream, g_eng, guest_hooks, make_context=ctx_factory("guest"))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(host)
                tg.start_soon(guest)
        return out

    out = anyio.run(scenario)
    assert (out["host"].reason, out["host"].code) == ("shutdown", "session-shutdown")
    assert out["guest"].ok  # the guest saw the protocol's `bye`: a clean end, not a hang-up
    assert h_end == ["session-shutdown"] and g_end == ["completed"]


def test_cancelled_session_still_ends_cleanly_for_the_peer(host_id, guest_id):
    """Ctrl-C on one side (its task cancelled) still sends the terminal message."""
    spec = load_spec(ECHO)

    async def scenario():
        h_eng, g_eng = engines(spec, host_id, guest_id)
        g_stream, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)
        out = {}

        async def guest():
            out["guest"] = await run_session(g_stream, g_eng, Hooks(), make_context=ctx_factory("guest"))

        async with anyio.create_task_group() as tg:
            tg.cancel_scope.deadline = anyio.current_time() + 10
            tg.start_soon(guest)
            with anyio.move_on_after(0.3):
                out["host"] = await run_session(h_stream, h_eng, load_hooks(ECHO), make_context=ctx_factory("host"))
        return out

    out = anyio.run(scenario)
    assert out["guest"].ok and "host" not in out


def test_hook_abort_codes_reach_on_end(host_id, guest_id):
    spec = load_spec(ECHO)
    ended = []
    host_hooks = recording(Hooks(on_message=lambda ctx, m: HookResult(abort="hook-timeout")), ended)
    out = anyio.run(lambda: run_pair(spec, host_id, guest_id, host_hooks, load_hooks(ECHO), {"texts": ["x"]}))
    assert out["host"].code == "hook-timeout" and ended == ["hook-timeout"]
    assert out["guest"].remote_errors[0][0] == "hook-timeout"


def _echo_with_threads(inline=None, delay_s=0.0):
    """The echo hooks, the host's ``on_message`` a plain sync function recording the
    thread it ran in (and, with ``delay_s``, how many ran at once)."""
    import threading

    base = load_hooks(ECHO)
    seen: list[tuple[str, bool]] = []
    running = [0, 0]  # now, most at once
    lock = threading.Lock()

    def on_message(ctx, message):
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        try:
            if delay_s:
                time.sleep(delay_s)  # kept: a hook that takes time, so calls that overlap are seen overlapping
            seen.append((message.get("text", ""), threading.current_thread() is threading.main_thread()))
            return base.on_message(ctx, message)
        finally:
            with lock:
                running[0] -= 1

    if inline is not None:
        on_message.inline = inline
    return Hooks(on_start=base.on_start, on_message=on_message, on_end=base.on_end, module=base.module), seen, running


def test_a_plain_sync_hook_still_runs_in_a_worker_thread(host_id, guest_id):
    spec = load_spec(ECHO)
    hooks, seen, _ = _echo_with_threads()
    got = []
    out = anyio.run(run_pair, spec, host_id, guest_id, hooks, load_hooks(ECHO), {"texts": ["a", "b"],
                                                                                "on_message": got.append})
    assert out["host"].ok and [m["text"] for m in got] == ["A", "B"]
    assert [on_loop for text, on_loop in seen if text] == [False, False]  # unchanged: the thread hop


def test_a_hook_that_says_its_call_is_small_runs_on_the_event_loop(host_id, guest_id):
    spec = load_spec(ECHO)
    hooks, seen, _ = _echo_with_threads(inline=lambda ctx, message: message.get("text") != "large")
    got = []
    out = anyio.run(run_pair, spec, host_id, guest_id, hooks, load_hooks(ECHO),
                    {"texts": ["small", "large", "tiny"], "on_message": got.append})
    assert out["host"].ok and [m["text"] for m in got] == ["SMALL", "LARGE", "TINY"]  # the same answers
    assert [(t, on_loop) for t, on_loop in seen if t] == [("small", True), ("large", False), ("tiny", True)]


def test_large_calls_share_a_bounded_pool_and_a_broken_predicate_is_large(host_id, guest_id):
    from node.runtime.driver import HOOK_THREADS

    spec = load_spec(ECHO)

    def predicate(ctx, message):
        if message.get("text") == "boom":
            raise RuntimeError("a broken predicate")
        return False

    hooks, seen, running = _echo_with_threads(inline=predicate, delay_s=0.05)

    async def many():
        async with anyio.create_task_group() as tg:
            for _ in range(HOOK_THREADS * 3):
                tg.start_soon(run_pair, spec, host_id, guest_id, hooks, load_hooks(ECHO),
                              {"texts": ["x", "boom"]})

    anyio.run(many)
    assert len([t for t, _ in seen if t]) == HOOK_THREADS * 3 * 2  # every call answered
    assert not any(on_loop for _, on_loop in seen)
    assert 1 <= running[1] <= HOOK_THREADS  # never more at once than the pool's bound


def test_a_small_call_runs_on_the_loop_while_another_hook_call_runs_in_a_thread(host_id, guest_id):
    """A call that says it is small runs on the event loop even while a hook call of
    another session is held in a thread — and is answered before that one is released
    (the loop is not blocked by it, and small answers do not queue behind it)."""
    import threading

    spec = load_spec(ECHO)
    base = load_hooks(ECHO)
    started, release = threading.Event(), threading.Event()

    def slow(ctx, message):  # a plain sync hook, held until the small session has asked
        started.set()
        release.wait(30)
        return base.on_message(ctx, message)

    slow_hooks = Hooks(on_start=base.on_start, on_message=slow, on_end=base.on_end, module=base.module)
    small_hooks, seen, _ = _echo_with_threads(inline=lambda ctx, message: True)
    got: list = []

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_pair, spec, host_id, guest_id, slow_hooks, load_hooks(ECHO), {"texts": ["slow"]})
            await anyio.to_thread.run_sync(started.wait, 30)
            await run_pair(spec, host_id, guest_id, small_hooks, load_hooks(ECHO),
                           {"texts": ["during"], "on_message": got.append})
            got.append({"text": "released" if release.is_set() else "still held"})
            release.set()

    anyio.run(main)
    assert [m["text"] for m in got] == ["DURING", "still held"]
    assert [(t, on_loop) for t, on_loop in seen if t] == [("during", True)]


@pytest.mark.parametrize("raw,want", [("0.2,1", (0.2, 1.0)), ("", None), ("1", None), ("x,y", None),
                                      ("5,1", None), ("0,1", None)])
def test_test_only_heartbeat_override_is_strict(raw, want):
    """The driver reads the test-only override; the engine reads no environment."""
    from node.runtime.driver import heartbeat_from_env

    assert heartbeat_from_env({"KITH_TEST_HEARTBEAT": raw}) == want


def test_the_engine_reads_no_environment_variable():
    import ast
    from pathlib import Path as _Path

    import node.engine

    for path in sorted(_Path(node.engine.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        reads = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv")]
        assert reads == [], f"{path.name} reads the environment at lines {reads}"


def test_the_ticker_waits_on_the_clock_the_engine_reads():
    """``run_session(clock=)``: the ticker sleeps on the session's clock (issue 39 item 5),
    so a guest whose engine reads a ManualClock, facing a host that never answers its
    ``_session_init``, ends with ``handshake-timeout`` once that clock has moved past the
    step bound — asleep on it until then."""
    import os

    from node.engine.session import GuestConfig, SessionEngine
    from node.runtime.clock import ManualClock
    from node.trust.identity import Identity

    spec = load_spec(ECHO)
    host_id, guest_id = Identity(os.urandom(32)), Identity(os.urandom(32))
    clock = ManualClock()
    engine = SessionEngine("guest", spec, public_key=guest_id.public_key, sign=guest_id.sign,
                           guest=GuestConfig(remote_id=host_id.public_key, post_id="ab" * 16,
                                             host_public_key=host_id.public_key), clock=clock.monotonic)
    g_stream, _silent_host = memory_pipe(guest_id.public_key, host_id.public_key)
    out = {}

    async def main():
        async def guest():
            out["guest"] = await run_session(g_stream, engine, load_hooks(ECHO), make_context=ctx_factory("guest"),
                                             handshake_timeout_s=10, heartbeat=None, clock=clock)
        async with anyio.create_task_group() as tg:
            tg.start_soon(guest)
            with anyio.fail_after(30):  # the init sent, the ticker asleep on the clock
                while clock.sleepers() == 0:
                    await anyio.sleep(0.005)
            assert "guest" not in out
            clock.advance(10.5)
            with anyio.fail_after(30):
                while "guest" not in out:
                    await anyio.sleep(0.005)

    anyio.run(main, backend="asyncio")
    assert out["guest"].code == "handshake-timeout", (out["guest"].reason, out["guest"].code)
