"""The host's admission rules, without iroh: :class:`node.runtime.admission.Admission`
driven directly with a fake clock and recording callbacks (what ``serve_host`` does over
real connections is in tests/test_transport_session.py and tests/test_host_admission.py)."""

from __future__ import annotations

import pytest

from node.common.errors import HandshakeError
from node.runtime.admission import Admission, AdmissionLimits
from node.trust.peers import PeerRegistry

A, B, C = "a" * 64, "b" * 64, "c" * 64


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Sessions:
    """Opens sessions on an Admission and records which were ended, with what code."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self.ended: dict[int, str] = {}
        self.closing: set[int] = set()
        self.next = 0

    def open(self, peer: str, **kw) -> tuple[int, str | None]:
        self.next += 1
        token = self.next
        refusal = self.adm.open_session(token, peer, lambda code, _msg, t=token: self.ended.__setitem__(t, code),
                                        alive=lambda t=token: t not in self.closing, **kw)
        return token, refusal


def make(**limits) -> tuple[Admission, Sessions, list[dict]]:
    events: list[dict] = []
    adm = Admission(AdmissionLimits(**limits), on_event=events.append, clock=Clock())
    return adm, Sessions(adm), events


def test_per_peer_and_overall_bounds():
    adm, s, _ = make(max_sessions=3, max_sessions_per_peer=2)
    t1, r1 = s.open(A)
    t2, r2 = s.open(A)
    for t in (t1, t2):
        adm.session_ready(t)
    assert (r1, r2) == (None, None)
    assert s.open(A)[1] == "handshake-peer-busy"
    t3, r3 = s.open(B)
    adm.session_ready(t3)
    assert r3 is None
    assert s.open(C)[1] == "handshake-host-busy"  # every slot holds a ready session
    adm.close_session(t1)
    assert s.open(C)[1] is None
    assert adm.sessions == 3 and s.ended == {}


def test_full_host_evicts_the_oldest_handshake_not_a_ready_session():
    adm, s, events = make(max_sessions=3)
    ready, _ = s.open(A)
    adm.session_ready(ready)
    closing, _ = s.open(B)
    s.closing.add(closing)  # its engine closed already: leaving on its own, not evicted
    old, _ = s.open(B)
    token, refusal = s.open(C)
    assert refusal is None
    assert s.ended == {old: "handshake-host-busy"}
    assert events == [{"event": "session-refused", "peer": B, "code": "handshake-host-busy", "reason": "evicted"}]
    adm.close_session(old)  # the evicted task's own cleanup: idempotent
    assert adm.sessions == 3 and adm.sessions_of(C) == 1 and token


def test_pending_pool_evicts_the_oldest_connection():
    adm, _s, events = make(max_sessions=2)
    evicted: list[int] = []
    for token in (1, 2, 3):
        adm.connection_arrived(token, f"{token}" * 64, lambda t=token: evicted.append(t))
    assert evicted == [1] and adm.pending == 2
    assert events[-1] == {"event": "session-refused", "peer": "1" * 64, "code": "handshake-host-busy",
                          "reason": "evicted"}
    adm.connection_done(2)
    adm.connection_arrived(4, "4" * 64, lambda: evicted.append(4))
    assert evicted == [1] and adm.pending == 2


def test_single_use_post_admits_one_handshake_and_gives_back_a_failed_reservation():
    adm, s, _ = make(post_max_sessions=1)
    t1, _ = s.open(A)
    t2, _ = s.open(B)
    assert adm.claim_post(t1, "p")
    assert not adm.claim_post(t1, "p")  # one reservation per session
    assert not adm.claim_post(t2, "p")  # used up while t1 handshakes
    adm.close_session(t1)  # t1 never became ready: the use is given back
    assert adm.claimed("p") == 0
    t3, _ = s.open(C)
    assert adm.claim_post(t3, "p")
    assert adm.session_ready(t3) is True  # used up now
    adm.close_session(t3)
    assert adm.claimed("p") == 1  # kept once ready


def test_end_sessions_ends_every_session_of_a_key_and_frees_the_slots():
    adm, s, _ = make(max_sessions=4, max_sessions_per_peer=4)
    a1, _ = s.open(A)
    a2, _ = s.open(A)
    b1, _ = s.open(B)
    adm.session_ready(a1)
    assert adm.end_sessions(A, "session-revoked") == 2
    assert s.ended == {a1: "session-revoked", a2: "session-revoked"}
    assert adm.sessions_of(A) == 0 and adm.sessions == 1
    assert adm.end_sessions(A, "session-revoked") == 0
    assert b1 not in s.ended


def test_admission_predicate(tmp_path):
    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", A)
    assert Admission.admits(reg, False, B, {})
    assert not Admission.admits(reg, True, B, {})
    assert Admission.admits(reg, True, A, {"displayName": "alice"})
    with pytest.raises(HandshakeError) as exc:
        Admission.admits(reg, False, B, {"displayName": "alice"})
    assert exc.value.code == "peer-key-changed"
