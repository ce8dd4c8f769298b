"""Why a dial ended (node/guest/targets.py; specs/ask.md §3): a session that ended unanswered
is sorted into the per-peer table's ``refused`` or ``unreachable`` with its code — no
network, the outcomes built by hand as the driver reports them."""

from __future__ import annotations

import pytest

from node.common.errors import HandshakeError, TransportError
from node.guest.targets import GONE_CODES, PeerGone, classify_gone, connect_failed, post_gone
from node.runtime.driver import SessionOutcome


def _gone(reached: bool = False, error=None, **outcome) -> PeerGone:
    return PeerGone(SessionOutcome(session_id=None, **outcome) if outcome else None, error, reached)


def test_a_connection_that_failed_is_unreachable_with_the_transport_code():
    gone = _gone(error=TransportError("transport-connect-failed", "no answer"))
    assert connect_failed(gone) and classify_gone(gone) == ("unreachable", "transport-connect-failed")


def test_a_refusal_before_the_session_is_refused_with_its_code():
    gone = _gone(error=HandshakeError("host-key-changed", "another key"))
    assert not connect_failed(gone) and classify_gone(gone) == ("refused", "host-key-changed")


@pytest.mark.parametrize("code", GONE_CODES)
def test_a_post_the_host_no_longer_honours_is_invitation_gone(code):
    gone = _gone(reason="rejected", code=code)
    assert post_gone(gone) and classify_gone(gone) == ("refused", "invitation-gone")


def test_another_rejection_is_refused_with_its_code():
    gone = _gone(reason="rejected", code="handshake-peer-blocked")
    assert not post_gone(gone) and classify_gone(gone) == ("refused", "handshake-peer-blocked")


def test_a_host_error_is_refused_unless_it_evicted_or_shut_down():
    assert classify_gone(_gone(True, reason="aborted", remote_errors=[("query-invalid", "bad")])) == (
        "refused", "query-invalid")
    assert classify_gone(_gone(True, reason="aborted", remote_errors=[("session-evicted", "idle")])) == (
        "unreachable", "peer-disconnected")


def test_a_session_that_went_silent_or_was_ended_is_unreachable():
    assert classify_gone(_gone(True, reason="aborted", code="peer-unresponsive")) == (
        "unreachable", "peer-unresponsive")
    assert classify_gone(_gone(True, reason="peer-disconnected", peer_end={"action": "end", "reason": "shutdown"})) == (
        "unreachable", "session-shutdown")
    assert classify_gone(_gone(True)) == ("unreachable", "peer-disconnected")
