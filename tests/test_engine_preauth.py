"""Small frames before trust (issue 42 item 5): every line a host receives before READY is
bounded by PRE_READY_MAX_LINE_BYTES (64 KiB), whatever the protocol's max_message_bytes;
after READY the protocol's own limit holds again (specs/session.md §2)."""

from __future__ import annotations

import json

import pytest

from node.engine.session import PRE_READY_MAX_LINE_BYTES, MessageRefused, SessionClosed, State
from node.protocol.spec import load_spec

from support.engines import EnginePair
from support.homes import PROTOCOLS


@pytest.fixture(scope="module")
def kq():
    return load_spec(PROTOCOLS / "knowledge-query")


def test_the_small_limit_is_small_and_below_the_protocol_limit(kq):
    assert PRE_READY_MAX_LINE_BYTES <= 64 * 1024 < kq.limits.max_message_bytes


@pytest.mark.parametrize("chunk", [4096, 1 << 20])
def test_a_one_mib_session_init_is_refused_before_the_host_buffers_it(kq, host_id, guest_id, chunk):
    pair = EnginePair(kq, host_id, guest_id)
    pair.guest.initiate()
    init = json.loads(pair.guest.data_to_send())
    init["profile"] = {"name": "x" * (1 << 20)}  # 1 MiB: under the protocol's 8 MiB
    line = json.dumps(init).encode() + b"\n"
    events, most = [], 0
    for i in range(0, len(line), chunk):
        events += pair.host.receive_data(line[i:i + chunk])
        most = max(most, pair.host._framer.buffered)
        if pair.host.closed:
            break
    closed = [e for e in events if isinstance(e, SessionClosed)]
    assert closed and closed[0].code == "frame-too-large" and closed[0].reason == "rejected"
    assert most <= PRE_READY_MAX_LINE_BYTES
    reply = [json.loads(x) for x in pair.host.data_to_send().splitlines()]
    assert reply[-1]["action"] == "_session_reject" and reply[-1]["code"] == "frame-too-large"


def test_a_handshake_line_just_under_the_limit_is_not_refused_for_its_size(kq, host_id, guest_id):
    pair = EnginePair(kq, host_id, guest_id)
    pair.guest.initiate()
    init = json.loads(pair.guest.data_to_send())
    line = json.dumps(init).encode()
    init["profile"] = {"pad": "x" * (PRE_READY_MAX_LINE_BYTES - len(line) - 40)}
    line = json.dumps(init).encode()
    assert len(line) <= PRE_READY_MAX_LINE_BYTES
    events = pair.host.receive_data(line + b"\n")
    assert not any(isinstance(e, SessionClosed) and e.code == "frame-too-large" for e in events)


def test_after_ready_the_protocol_limit_holds_even_in_the_chunk_that_made_it_ready(kq, host_id, guest_id):
    pair = EnginePair(kq, host_id, guest_id)
    pair.guest.initiate()
    pair.pump()
    assert pair.guest.state is State.AWAIT_CONFIRM
    pair.guest.confirm_ready()
    ready = pair.guest.data_to_send()
    big = json.dumps({"action": "query", "pad": "y" * (256 * 1024)}).encode() + b"\n"  # > 64 KiB, < 8 MiB
    events = pair.host.receive_data(ready + big)  # _session_ready and a big line in one read
    assert pair.host.state is State.READY and not pair.host.closed
    refused = [e for e in events if isinstance(e, MessageRefused)]
    assert refused and refused[0].code != "frame-too-large"  # refused by its schema, not its size
    assert pair.host._framer.max_line_bytes == kq.limits.max_message_bytes


def test_the_guest_keeps_the_protocol_limit_before_ready(kq, host_id, guest_id):
    pair = EnginePair(kq, host_id, guest_id)
    assert pair.guest._framer.max_line_bytes == kq.limits.max_message_bytes
