"""run_session over the memory pipe: heartbeats, a zombie peer, pings during a slow hook,
clean shutdown, and every end reason reaching ``on_end``."""

from __future__ import annotations

import time

import anyio

from node.runtime.driver import run_session
from node.runtime.hooks import HookContext, HookResult, Hooks, PeerInfo, load_hooks
from node.protocol.spec import load_spec
from node.transport.memory import memory_pipe

from conftest import PROTOCOLS
from test_driver import ctx_factory, engines, recording, run_pair

ECHO = PROTOCOLS / "echo"
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
    spec = load_spec(ECHO)
    ended = []

    async def scenario():
        h_eng, g_eng = engines(spec, host_id, guest_id)
        g_stream, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)
        async with anyio.create_task_group() as tg:
            tg.cancel_scope.deadline = anyio.current_time() + 10
            tg.start_soon(zombie_guest, g_eng, g_stream, anyio.lowlevel.checkpoint)
            t0 = time.monotonic()
            out = await run_session(h_stream, h_eng, recording(load_hooks(ECHO), ended),
                                    make_context=ctx_factory("host"), heartbeat=FAST)
            elapsed = time.monotonic() - t0
            tg.cancel_scope.cancel()
        return out, elapsed

    out, elapsed = anyio.run(scenario)
    assert (out.reason, out.code) == ("aborted", "peer-unresponsive")
    assert ended == ["peer-unresponsive"]
    assert out.session_id is not None  # the session existed: its id stays usable for feedback
    assert elapsed < 5


def test_pings_are_answered_while_a_slow_hook_runs(host_id, guest_id):
    """A guest hook that takes longer than the unresponsive bound must not get the session
    killed: the receiver answers pings while the hook runs."""
    spec = load_spec(ECHO)
    base = load_hooks(ECHO)

    def slow_on_message(ctx, message):
        time.sleep(0.9)  # > 0.4 s unresponsive bound, < echo's 5 s hook timeout
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
