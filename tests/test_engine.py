"""The sans-I/O engine: handshake checks, business-loop validation, limits and endings,
heartbeats, handshake step deadlines and idle limits (a fake clock: no sleeping, no I/O)."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.engine.framing import LineFramer, decode_frame, encode_frame
from node.engine.session import (
    GuestConfig,
    HostConfig,
    MessageReceived,
    MessageRefused,
    OutgoingFrame,
    RemoteError,
    SessionClosed,
    SessionEngine,
    SessionReady,
    State,
)
from node.engine.timers import PING, SessionTimers, Timeouts
from node.common.errors import EgressRefused, HookError, ProtocolViolation
from node.trust.signing import role_message, session_id_of, session_payload
from node.protocol.spec import load_spec

from support.engines import POST_ID, EnginePair
from support.homes import PROTOCOLS, REPO, new_identity


@pytest.fixture(scope="module")
def echo():
    return load_spec(PROTOCOLS / "echo")


@pytest.fixture(scope="module")
def kq():
    return load_spec(PROTOCOLS / "knowledge-query")


def frames(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines()]


def test_engine_imports_no_io_libraries():
    # every module of the engine package, not only the ones that exist today
    code = ("import sys, importlib, pkgutil, node.engine;"
            "[importlib.import_module('node.engine.' + m.name) for m in pkgutil.iter_modules(node.engine.__path__)];"
            "assert 'node.engine.ui_branch' in sys.modules and 'node.engine.handshake' in sys.modules;"
            "bad=[m for m in ('anyio','iroh','socket','asyncio','httpx') if m in sys.modules];"
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"node.engine imported I/O modules: {proc.stdout}"


# ------------------------------------------------------------------------ handshake
def test_handshake_completes_and_both_sides_agree_on_session_id(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    pair.handshake()
    assert pair.host.state is State.READY and pair.guest.state is State.READY
    ready_h = pair.of(pair.host_events, SessionReady)[0]
    ready_g = pair.of(pair.guest_events, SessionReady)[0]
    assert ready_h.session_id == ready_g.session_id == pair.host.session_id
    assert ready_h.peer_public_key == guest_id.public_key
    proof = ready_h.proof
    payload = session_payload(post_id=POST_ID, protocol_id=echo.protocol_id, host_public_key=host_id.public_key,
                              guest_public_key=guest_id.public_key, guest_nonce=proof["guest_nonce"],
                              host_nonce=proof["host_nonce"])
    assert session_id_of(payload) == ready_h.session_id
    # role tags: the host signature does not verify as a guest signature
    from node.trust.signing import verify
    from node.common.errors import SigningError
    verify(host_id.public_key, role_message("host", payload), proof["host_signature"])
    with pytest.raises(SigningError):
        verify(host_id.public_key, role_message("guest", payload), proof["host_signature"])


def reject_code(pair: EnginePair, side: str = "host") -> str | None:
    events = pair.host_events if side == "host" else pair.guest_events
    closed = pair.of(events, SessionClosed)
    assert closed, f"{side} did not close"
    assert closed[0].reason == "rejected"
    return closed[0].code


def test_first_frame_must_be_session_init(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    pair.host_events += pair.host.receive_data(encode_frame({"action": "say", "text": "hi"}))
    assert reject_code(pair) == "handshake-first-frame"
    assert frames(pair.host.data_to_send())[0]["action"] == "_session_reject"


def test_first_frame_other_system_frame_is_refused(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    pair.host_events += pair.host.receive_data(encode_frame({"action": "_ping"}))
    assert reject_code(pair) == "handshake-first-frame"


def test_claimed_key_must_equal_quic_remote_id(echo, host_id, guest_id):
    other = new_identity()
    pair = EnginePair(echo, host_id, guest_id, claimed_guest_key=other.public_key)
    pair.handshake()
    assert reject_code(pair) == "handshake-key-mismatch"
    assert reject_code(pair, "guest") == "handshake-key-mismatch"


def test_unknown_post_is_refused(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id, post_id="not-this-post")
    pair.handshake()
    assert reject_code(pair) == "handshake-unknown-post"


def test_protocol_mismatch_is_refused(echo, kq, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    pair.guest.spec = kq  # the guest speaks another protocol
    pair.handshake()
    assert reject_code(pair) == "handshake-protocol-mismatch"


def test_replayed_nonce_is_refused(echo, host_id, guest_id):
    seen: set[str] = set()
    first = EnginePair(echo, host_id, guest_id, seen=seen)
    first.guest.initiate()
    init = first.guest.data_to_send()
    first.host.receive_data(init)
    replay = EnginePair(echo, host_id, guest_id, seen=seen)
    replay.host_events += replay.host.receive_data(init)
    assert reject_code(replay) == "handshake-nonce-reused"


@pytest.mark.parametrize("nonce", ["AB" * 32, "ab" * 31, "0x" + "ab" * 31, " " + "ab" * 31 + "a", "zz" * 32])
def test_malformed_nonce_is_refused(echo, host_id, guest_id, nonce):
    pair = EnginePair(echo, host_id, guest_id)
    init = {"action": "_session_init", "post_id": POST_ID, "protocol_id": echo.protocol_id,
            "guest_public_key": guest_id.public_key, "guest_nonce": nonce}
    pair.host_events += pair.host.receive_data(encode_frame(init))
    assert reject_code(pair) == "handshake-bad-nonce"


def test_unknown_field_in_session_init_is_refused(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    init = {"action": "_session_init", "post_id": POST_ID, "protocol_id": echo.protocol_id,
            "guest_public_key": guest_id.public_key, "guest_nonce": "ab" * 32, "sneaky": 1}
    pair.host_events += pair.host.receive_data(encode_frame(init))
    assert reject_code(pair) == "handshake-malformed"


def test_bad_guest_signature_is_refused(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    pair.guest.initiate()
    pair.pump()
    sid = pair.host.session_id
    forged = {"action": "_session_ready", "session_id": sid, "guest_signature": "00" * 64}
    pair.host_events += pair.host.receive_data(encode_frame(forged))
    assert reject_code(pair) == "handshake-bad-signature"


def test_guest_signature_with_host_role_tag_is_refused(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    pair.guest.initiate()
    pair.pump()
    payload = pair.host._payload
    wrong_role = guest_id.sign(role_message("host", payload))
    pair.host_events += pair.host.receive_data(encode_frame(
        {"action": "_session_ready", "session_id": pair.host.session_id, "guest_signature": wrong_role}))
    assert reject_code(pair) == "handshake-bad-signature"


def test_ready_with_wrong_session_id_is_refused(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    pair.guest.initiate()
    pair.pump()
    pair.host_events += pair.host.receive_data(encode_frame(
        {"action": "_session_ready", "session_id": "ab" * 32, "guest_signature": "00" * 64}))
    assert reject_code(pair) == "handshake-session-mismatch"


def _proof_for(pair: EnginePair, **override) -> bytes:
    pair.guest.initiate()
    init = frames(pair.guest.data_to_send())[0]
    pair.host.receive_data(encode_frame(init))
    proof = frames(pair.host.data_to_send())[0]
    proof.update(override)
    return encode_frame(proof)


def test_guest_refuses_tampered_host_signature(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    data = _proof_for(pair, host_signature="11" * 64)
    pair.guest_events += pair.guest.receive_data(data)
    assert reject_code(pair, "guest") == "handshake-bad-signature"


def test_guest_refuses_wrong_session_id(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    data = _proof_for(pair, session_id="cd" * 32)
    pair.guest_events += pair.guest.receive_data(data)
    assert reject_code(pair, "guest") == "handshake-session-mismatch"


def test_guest_refuses_host_key_other_than_invitation(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id, guest_expects_host=new_identity().public_key)
    pair.handshake()
    assert reject_code(pair, "guest") == "handshake-key-mismatch"


def test_business_frame_before_ready_is_a_protocol_error(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    pair.guest.initiate()
    pair.pump()
    pair.host_events += pair.host.receive_data(encode_frame({"action": "say", "text": "early"}))
    assert reject_code(pair) == "message-before-ready"


def test_rejected_guest_sees_the_hosts_code(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id, post_id="gone-post")
    pair.handshake()
    closed = pair.of(pair.guest_events, SessionClosed)[0]
    assert (closed.reason, closed.code) == ("rejected", "handshake-unknown-post")


# ------------------------------------------------------------------------ business loop
def ready_pair(spec, host_id, guest_id) -> EnginePair:
    pair = EnginePair(spec, host_id, guest_id)
    pair.handshake()
    assert pair.host.state is State.READY
    return pair


def test_valid_message_reaches_hook_and_reply_flows(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)
    pair.guest.send_message({"action": "say", "text": "hello"})
    pair.pump()
    got = pair.of(pair.host_events, MessageReceived)
    assert [m.message for m in got] == [{"action": "say", "text": "hello"}]
    pair.host.send_message({"action": "echo", "text": "HELLO", "count": 1})
    pair.pump()
    assert pair.of(pair.guest_events, MessageReceived)[0].message["text"] == "HELLO"


@pytest.mark.parametrize("line, code", [
    (b'{"action":"say","text":"hi","extra":1}', "message-schema-invalid"),          # unknown field
    (b'{"action":"say"}', "message-schema-invalid"),                                 # missing field
    (b'{"action":"say","text":5}', "message-schema-invalid"),                        # wrong type
    (b'{"action":"say","text":""}', "message-schema-invalid"),                       # out of range
    (b'{"action":"shout","text":"hi"}', "message-undeclared-action"),               # undeclared
    (b'{"action":"echo","text":"hi","count":1}', "message-wrong-direction"),         # host's message
    (b'{"action":"_session_init","post_id":"x"}', "message-unexpected-system-frame"),  # system frame mid-session
    (b'{"action":"say","text":"\xff\xfe"}', "frame-invalid-utf8"),
    (b'{"action":"say",', "frame-invalid-json"),
    (b'[1,2,3]', "frame-invalid-json"),
    (b'{"text":"no action"}', "frame-missing-action"),
])
def test_invalid_messages_are_refused_before_hooks(echo, host_id, guest_id, line, code):
    pair = ready_pair(echo, host_id, guest_id)
    events = pair.host.receive_data(line + b"\n")
    assert not [e for e in events if isinstance(e, MessageReceived)]
    refused = [e for e in events if isinstance(e, (MessageRefused, SessionClosed))]
    assert refused and refused[0].code == code
    reply = frames(pair.host.data_to_send())[-1]
    assert reply["action"] == "_error" and reply["code"] == code
    assert "\xff" not in reply["message"] and "no action" not in reply["message"]  # no echo of data


def test_oversize_line_aborts_the_session(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)
    big = b'{"action":"say","text":"' + b"x" * (echo.limits.max_message_bytes + 10) + b'"}\n'
    events = pair.host.receive_data(big[:5000]) + pair.host.receive_data(big[5000:])
    closed = [e for e in events if isinstance(e, SessionClosed)]
    assert closed and closed[0].code == "frame-too-large" and pair.host.closed


def test_too_many_invalid_messages_abort(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)  # echo: max_invalid = 1
    pair.host.receive_data(b'{"action":"nope"}\n')
    assert not pair.host.closed
    events = pair.host.receive_data(b'{"action":"nope"}\n')
    assert pair.host.closed and events[-1].code == "too-many-invalid"


def test_turn_rules_refuse_a_second_request_before_the_reply(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)
    pair.guest.send_message({"action": "say", "text": "one"})
    with pytest.raises(HookError) as exc:
        pair.guest.send_message({"action": "say", "text": "two"})
    assert "out-of-turn" in exc.value.message or "wait" in exc.value.message


def test_hook_output_is_validated(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)
    with pytest.raises(HookError):
        pair.guest.send_message({"action": "say", "text": 42})
    with pytest.raises(HookError):
        pair.guest.send_message({"action": "echo", "text": "x", "count": 1})  # wrong direction for the guest


def test_egress_check_refuses_outgoing_message(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)

    answered: list = []
    seen: list = []

    def no_secrets(frame: OutgoingFrame) -> None:
        answered.append(frame.replying_to)
        seen.append(frame)
        if b"/home/owner" in frame.data:
            raise EgressRefused("egress-leak")

    pair.host._egress_check = no_secrets
    pair.handshake()
    pair.guest.send_message({"action": "say", "text": "hi"})
    pair.pump()
    with pytest.raises(EgressRefused):
        pair.host.send_message({"action": "echo", "text": "/home/owner/secret.txt", "count": 1})
    assert pair.host.data_to_send() == b""
    assert answered == [{"action": "say", "text": "hi"}]  # the seam sees what it answers
    # a frame that passes: the seam saw the message and exactly the bytes that leave, once
    ok = {"action": "echo", "text": "fine", "count": 1}
    pair.host.send_message(ok)
    assert len(seen) == 2 and seen[1].message == ok
    assert pair.host.data_to_send() == seen[1].data


def test_terminal_message_closes_both_sides(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)
    events = pair.guest.send_message({"action": "bye"})
    assert events[-1].reason == "completed" and pair.guest.closed
    pair.pump()
    assert pair.host.closed and pair.of(pair.host_events, SessionClosed)[0].reason == "completed"


def test_eof_mid_session_is_peer_disconnected(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)
    events = pair.host.receive_eof()
    assert events[0].reason == "peer-disconnected" and events[0].code == "peer-disconnected"


def test_partial_line_at_eof_is_a_protocol_error(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)
    pair.host.receive_data(b'{"action":"say"')
    events = pair.host.receive_eof()
    assert events[0].code == "frame-truncated"


def test_ping_is_answered_and_error_reported(echo, host_id, guest_id):
    pair = ready_pair(echo, host_id, guest_id)
    assert pair.host.receive_data(b'{"action":"_ping","t":7}\n') == []
    assert frames(pair.host.data_to_send()) == [{"action": "_pong", "t": 7}]
    events = pair.host.receive_data(b'{"action":"_error","code":"x","message":"y"}\n')
    assert isinstance(events[0], RemoteError)


def test_message_limit_aborts(host_id, guest_id):
    raw = json.loads((PROTOCOLS / "echo" / "spec.json").read_text())
    raw["limits"]["max_messages"] = 2
    from node.protocol.spec import parse_spec
    spec = parse_spec(raw)
    pair = ready_pair(spec, host_id, guest_id)
    pair.guest.send_message({"action": "say", "text": "1"})
    pair.pump()
    events = pair.host.send_message({"action": "echo", "text": "1", "count": 1})
    assert events and events[-1].code == "message-limit-exceeded"


def test_send_before_ready_raises(echo, host_id, guest_id):
    pair = EnginePair(echo, host_id, guest_id)
    with pytest.raises(ProtocolViolation):
        pair.guest.send_message({"action": "say", "text": "x"})


# ------------------------------------------------------------------------ framing
@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=20), max_size=4), max_size=6),
       st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20))
def test_framer_reassembles_any_split(objs, cuts):
    data = b"".join(encode_frame({"action": "x", **o}) for o in objs)
    framer = LineFramer(1 << 20)
    out, pos, i = [], 0, 0
    while pos < len(data):
        step = cuts[i % len(cuts)]
        out += framer.feed(data[pos:pos + step])
        pos += step
        i += 1
    framer.eof()
    assert [decode_frame(line) for line in out] == [msgspec.json.decode(encode_frame({"action": "x", **o})) for o in objs]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_framer_and_decoder_never_crash_on_garbage(data):
    framer = LineFramer(128)
    try:
        lines = framer.feed(data)
    except ProtocolViolation as exc:
        assert exc.code == "frame-too-large"
        return
    for line in lines:
        try:
            decode_frame(line)
        except ProtocolViolation as exc:
            assert exc.code.startswith("frame-")


# ------------------------------------------------------------------ heartbeats and deadlines
# Heartbeats, handshake step deadlines and idle limits in the engine, with time as input
# (a fake clock): no sleeping, no I/O.

class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


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


def test_a_clock_read_exactly_at_the_next_deadline_finds_it_due():
    """A driver sleeps until ``next_deadline()`` and asks ``due()`` then: at that very
    instant something is due, whatever the floats round to (1000.05 - 1000.0 < 0.05 made
    the driver find nothing due and sleep 0 s again, for ever on a manual clock)."""
    quick = Timeouts(handshake_step_s=0.05, ping_interval_s=0.05, unresponsive_s=0.15, idle_s=0.35)
    for start in (1000.0, 0.1, 1e6 + 0.3, 12345.678):
        t = SessionTimers(quick, now=start)
        assert t.due(t.next_deadline()) == "handshake-timeout"
        t.session_ready(start)
        assert t.due(t.next_deadline()) == PING
        t.ping_sent(t.next_deadline())
        t.frame_received(t.last_ping_out)
        while (at := t.next_deadline()) is not None and t.due(at) == PING:
            t.ping_sent(at)
            if at - t.last_frame_in > 1:
                break
        assert t.due(t.next_deadline()) in ("peer-unresponsive", "idle-timeout")


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


INFLIGHT = Timeouts(handshake_step_s=10, ping_interval_s=10, unresponsive_s=30, idle_s=300,
                   inflight_ping_s=1, inflight_unresponsive_s=4)


def test_a_host_silent_while_a_question_is_out_is_gone_in_seconds(kq, host_id, guest_id):
    """Issue 30 item 2: idle, 9 s of silence is nothing; once the guest's question is out
    the in-flight bounds apply (a ping each second, gone 4 s after the later of the last
    frame and the question), and the close says so; an answered question brings the lazy
    heartbeat back."""
    clock = Clock()
    host, guest = pair(kq, host_id, guest_id, clock, INFLIGHT)
    handshake(host, guest)
    guest.data_to_send()
    clock.t += 9
    assert guest.tick() == [] and guest.data_to_send() == b""  # idle: no ping before 10 s
    guest.send_message({"action": "query", "query_id": "q1", "query": "staging"})
    host.receive_data(guest.data_to_send())
    clock.t += 1
    assert guest.tick() == [] and actions(guest.data_to_send()) == ["_ping"]  # in flight: every second
    clock.t += 2.9
    assert guest.tick() == []  # 3.9 s after the question: not yet (the silence before it does not count)
    guest.data_to_send()
    clock.t += 0.1
    closed = [e for e in guest.tick() if isinstance(e, SessionClosed)]
    assert closed and closed[0].code == "peer-unresponsive"
    assert "13 s while its reply was due" in closed[0].message  # silent since its last frame


def test_pongs_and_the_answer_keep_an_in_flight_session_alive(kq, host_id, guest_id):
    clock = Clock()
    host, guest = pair(kq, host_id, guest_id, clock, INFLIGHT)
    handshake(host, guest)
    guest.data_to_send()
    guest.send_message({"action": "query", "query_id": "q1", "query": "staging"})
    host.receive_data(guest.data_to_send())
    for _ in range(10):  # a slow answer: 10 s of pings, each answered
        clock.t += 1
        assert guest.tick() == []
        host.receive_data(guest.data_to_send())
        guest.receive_data(host.data_to_send())
    envelope = {"schemaVersion": 2, "available": True, "reason": None, "results": [],
                **{k: None for k in ("queryPlan", "citationPack", "eventAggregation", "answerSynthesis", "quality",
                                     "retrievalController", "agentic", "externalAgentContract")}}
    host.send_message({"action": "results", "query_id": "q1", "status": "ok", "envelope": envelope})
    guest.receive_data(host.data_to_send())
    assert not guest.closed and guest.timers.awaiting_since is None
    clock.t += 9
    assert guest.tick() == [] and not guest.closed  # answered: the idle heartbeat again


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

def test_bench_engine_runs_and_reports_both_validation_paths():
    """``scripts/bench_engine`` runs end to end (tiny parameters; it measures, never asserts time)."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_engine"), "--rounds", "20", "--repeats", "1",
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for mode in ("compiled", "jsonschema"):
        assert {"exchange", "send query", "receive results", "validate query"} <= set(out[mode])
    assert out["results_bytes"] > 1000
