"""Heartbeats, handshake step deadlines and idle limits in the engine, with time as input
(a fake clock): no sleeping, no I/O."""

from __future__ import annotations

import json

import pytest

from node.engine.session import GuestConfig, HostConfig, SessionClosed, SessionEngine, State
from node.engine.timers import PING, SessionTimers, Timeouts, heartbeat_from_env
from node.protocol.spec import load_spec

from conftest import PROTOCOLS
from helpers import POST_ID


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def echo():
    return load_spec(PROTOCOLS / "echo")


T = Timeouts(handshake_step_s=10, ping_interval_s=10, unresponsive_s=30, idle_s=300)


def pair(spec, host_id, guest_id, clock, timeouts=T):
    seen: set[str] = set()
    host = SessionEngine("host", spec, public_key=host_id.public_key, sign=host_id.sign, clock=clock,
                         timeouts=timeouts,
                         host=HostConfig(remote_id=guest_id.public_key, post_protocol={POST_ID: spec.protocol_id}.get,
                                         nonce_unseen=lambda n: n not in seen and not seen.add(n)))
    guest = SessionEngine("guest", spec, public_key=guest_id.public_key, sign=guest_id.sign, clock=clock,
                          timeouts=timeouts,
                          guest=GuestConfig(remote_id=host_id.public_key, post_id=POST_ID,
                                            host_public_key=host_id.public_key))
    return host, guest


def handshake(host, guest):
    guest.initiate()
    host.receive_data(guest.data_to_send())
    guest.receive_data(host.data_to_send())
    guest.confirm_ready()
    host.receive_data(guest.data_to_send())
    assert host.state is State.READY and guest.state is State.READY


def actions(data: bytes) -> list[str]:
    return [json.loads(x)["action"] for x in data.splitlines()]


def test_timers_pure_decisions():
    t = SessionTimers(T, now=0.0)
    assert t.due(9.9) is None and t.due(10.0) == "handshake-timeout"
    t.handshake_step(5.0)
    assert t.due(14.9) is None and t.next_deadline() == 15.0
    t.session_ready(20.0)
    assert t.due(29.9) is None and t.due(30.0) == PING
    t.ping_sent(30.0)
    t.frame_received(35.0)
    assert t.due(39.0) is None and t.due(40.0) == PING
    assert t.due(65.0) == "peer-unresponsive"  # 30 s after the last frame
    t2 = SessionTimers(Timeouts(None, None, None, 5.0), now=0.0)
    t2.session_ready(0.0)
    assert t2.due(5.0) == "idle-timeout"
    assert SessionTimers(Timeouts(None, None, None, None), 0.0).next_deadline() is None


@pytest.mark.parametrize("raw,want", [("0.2,1", (0.2, 1.0)), ("", None), ("1", None), ("x,y", None),
                                      ("5,1", None), ("0,1", None)])
def test_test_only_heartbeat_override_is_strict(raw, want):
    assert heartbeat_from_env({"KITH_TEST_HEARTBEAT": raw}) == want


def test_ping_every_interval_and_pong_answers(echo, host_id, guest_id):
    clock = Clock()
    host, guest = pair(echo, host_id, guest_id, clock)
    handshake(host, guest)
    clock.t += 9.9
    assert host.tick() == [] and host.data_to_send() == b""
    clock.t += 0.1
    assert host.tick() == []
    ping = host.data_to_send()
    assert actions(ping) == ["_ping"]
    guest.receive_data(ping)
    pong = guest.data_to_send()
    assert actions(pong) == ["_pong"]
    assert host.next_deadline() == pytest.approx(clock.t + 10)


def test_silent_peer_is_aborted_peer_unresponsive(echo, host_id, guest_id):
    clock = Clock()
    host, guest = pair(echo, host_id, guest_id, clock)
    handshake(host, guest)
    events = []
    for _ in range(4):  # pings go out every 10 s, nothing comes back
        clock.t += 10
        events += host.tick()
    closed = [e for e in events if isinstance(e, SessionClosed)]
    assert closed and closed[0].reason == "aborted" and closed[0].code == "peer-unresponsive"
    assert "_error" in actions(host.data_to_send())


def test_pongs_keep_the_session_alive(echo, host_id, guest_id):
    clock = Clock()
    host, guest = pair(echo, host_id, guest_id, clock)
    handshake(host, guest)
    for _ in range(20):  # 200 s with pings answered: alive (idle is 300 s)
        clock.t += 10
        assert host.tick() == []
        guest.receive_data(host.data_to_send())
        host.receive_data(guest.data_to_send())
    assert not host.closed


def test_idle_timeout_counts_business_messages_only(echo, host_id, guest_id):
    clock = Clock()
    host, guest = pair(echo, host_id, guest_id, clock, Timeouts(10, 10, 30, 60))
    handshake(host, guest)
    events = []
    for _ in range(7):  # pings answered, but no business message for 60 s
        clock.t += 10
        events += host.tick()
        guest.receive_data(host.data_to_send())
        host.receive_data(guest.data_to_send())
    closed = [e for e in events if isinstance(e, SessionClosed)]
    assert closed and closed[0].code == "idle-timeout"


def test_each_handshake_step_has_a_deadline_trickling_bytes_do_not_extend_it(echo, host_id, guest_id):
    clock = Clock()
    host, guest = pair(echo, host_id, guest_id, clock)
    guest.initiate()
    init = guest.data_to_send()
    events = []
    for i in range(len(init) - 1):  # one byte per second, never a whole frame
        clock.t += 1
        events += host.receive_data(init[i:i + 1])
        events += host.tick()
        if events:
            break
    closed = [e for e in events if isinstance(e, SessionClosed)]
    assert closed and closed[0].reason == "rejected" and closed[0].code == "handshake-timeout"
    assert json.loads(host.data_to_send())["code"] == "handshake-timeout"


def test_guest_waiting_for_the_proof_times_out(echo, host_id, guest_id):
    clock = Clock()
    _, guest = pair(echo, host_id, guest_id, clock)
    guest.initiate()
    guest.data_to_send()
    clock.t += 10
    assert guest.tick()[0].code == "handshake-timeout"


def test_timers_off_by_default(echo, host_id, guest_id):
    clock = Clock()
    host = SessionEngine("host", echo, public_key=host_id.public_key, sign=host_id.sign, clock=clock,
                         host=HostConfig(remote_id=guest_id.public_key, post_protocol={}.get,
                                         nonce_unseen=lambda n: True))
    clock.t += 10_000
    assert host.tick() == [] and host.next_deadline() is None


def test_shutdown_sends_the_terminal_message(echo, host_id, guest_id):
    clock = Clock()
    host, guest = pair(echo, host_id, guest_id, clock)
    handshake(host, guest)
    ev = host.shutdown()
    assert ev[0].reason == "shutdown" and ev[0].code == "session-shutdown"
    out = host.data_to_send()
    assert actions(out) == ["bye"]
    got = guest.receive_data(out)
    assert [e for e in got if isinstance(e, SessionClosed)][0].reason == "completed"


def test_shutdown_during_the_handshake_rejects(echo, host_id, guest_id):
    clock = Clock()
    host, guest = pair(echo, host_id, guest_id, clock)
    guest.initiate()
    host.shutdown()
    assert json.loads(host.data_to_send())["code"] == "session-shutdown"
