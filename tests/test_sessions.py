"""The host's admission rules, without iroh: :class:`node.runtime.sessions.Admission`
driven directly with a fake clock and recording callbacks (what ``serve_host`` does over
real connections is in tests/test_transport_session.py and tests/test_host_admission.py)."""

from __future__ import annotations

import pytest

from node.common.errors import HandshakeError
from node.runtime.sessions import HANDSHAKE_GRACE_S, Admission, AdmissionLimits
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
    young = adm.clock.t
    adm.clock.t += HANDSHAKE_GRACE_S - 0.5
    assert s.open(C)[1] == "handshake-host-busy"  # a young handshake is not evicted
    adm.clock.t = young + HANDSHAKE_GRACE_S
    token, refusal = s.open(C)
    assert refusal is None
    assert s.ended == {old: "handshake-host-busy"}
    assert events == [{"event": "session-refused", "peer": B, "code": "handshake-host-busy", "reason": "evicted"}]
    assert s.open(A)[1] == "handshake-host-busy"  # C's handshake is young: nothing to evict
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


# ------------------------------------------------------------ fair admission (issue 11 §5)
def test_anonymous_peers_share_a_bounded_part_so_a_pinned_peer_finds_a_slot():
    adm, s, _ = make(max_sessions=4, max_sessions_per_peer=4, anonymous_sessions=3, evict_idle_after_s=30)
    for _ in range(3):
        t, r = s.open(A, anonymous=True)
        assert r is None
        adm.session_ready(t)
    assert s.open(B, anonymous=True)[1] == "handshake-host-busy"  # the anonymous share is full, none idle
    assert s.open(C, anonymous=False)[1] is None  # the pinned peer still gets in
    assert s.ended == {}


def test_idle_anonymous_sessions_are_evicted_oldest_idle_first():
    adm, s, events = make(max_sessions=8, max_sessions_per_peer=4, anonymous_sessions=3, evict_idle_after_s=30)
    clock = adm.clock
    tokens = []
    for _ in range(3):
        t, _ = s.open(A, anonymous=True)
        adm.session_ready(t)
        tokens.append(t)
        clock.t += 1
    clock.t += 40
    adm.note_activity(tokens[0])  # the oldest session answered a query just now
    t, r = s.open(B, anonymous=True)
    assert r is None
    assert s.ended == {tokens[1]: "session-evicted"}  # idle longest, not the oldest
    assert events[-1]["event"] == "session-evicted" and events[-1]["peer"] == A
    assert events[-1]["idle_s"] == 42.0
    adm.session_ready(t)
    clock.t += 29
    c, r = s.open(C, anonymous=True)
    assert r is None and s.ended[tokens[2]] == "session-evicted"  # idle 70 s
    adm.session_ready(c)
    # the rest answered a query or became ready under 30 s ago: not idle yet, so refused
    assert s.open(C, anonymous=True)[1] == "handshake-host-busy"
    assert len(s.ended) == 2


def test_a_pinned_ready_session_is_never_evicted_and_a_pinned_newcomer_evicts_an_idle_anonymous_one():
    adm, s, _ = make(max_sessions=2, max_sessions_per_peer=4, anonymous_sessions=2, evict_idle_after_s=5)
    pinned, _ = s.open(C, anonymous=False)
    anon, _ = s.open(A, anonymous=True)
    adm.session_ready(pinned)
    adm.session_ready(anon)
    adm.clock.t += 100
    assert s.open(B, anonymous=False)[1] is None
    assert s.ended == {anon: "session-evicted"}
    assert s.open(A, anonymous=True)[1] == "handshake-host-busy"  # only pinned sessions left


def test_activity_tracking_ignores_rate_limited_answers():
    adm, s, _ = make(max_sessions=2, anonymous_sessions=2, evict_idle_after_s=10)
    t, _ = s.open(A, anonymous=True)
    adm.session_ready(t)

    class Handle:
        status = "rate-limited"

        def search(self, request):
            return {"status": self.status, "envelope": None}

    inner = Handle()
    from node.runtime.sessions import ActivityTracked

    tracked = ActivityTracked(inner, lambda: adm.note_activity(t))
    adm.clock.t += 20
    assert tracked.search({"query": "x"})["status"] == "rate-limited"
    assert tracked.status == "rate-limited"  # other attributes pass through
    b, _ = s.open(B, anonymous=True)
    adm.session_ready(b)
    adm.clock.t += 20
    inner.status = "ok"
    assert s.open(C, anonymous=True)[1] is None  # t stayed idle through the rate-limited answer
    assert t in s.ended


# ------------------------------------------------------------ failed handshakes (issue 11 §1)
def test_failure_cap_cools_a_key_down_and_counts_only_verification_failures():
    adm, s, _ = make(max_failures=3, failure_cooldown_s=60)
    for code in ("handshake-host-busy", "handshake-not-admitted", "handshake-post-expired", "handshake-unknown-post"):
        adm.record_failure(A, "p", code)  # the host's own refusals are not failures
    assert adm.cooldown_left(A) == 0
    adm.record_failure(A, "p", "handshake-bad-signature")
    adm.record_failure(A, "p", "handshake-key-mismatch")
    assert s.open(A)[1] is None
    adm.record_failure(A, "p", "handshake-nonce-reused")
    assert adm.cooldown_left(A) == 60
    assert s.open(A)[1] == "handshake-too-many-failures"
    assert s.open(B)[1] is None  # another key is not affected
    adm.clock.t += 59.5
    assert adm.cooldown_left(A) == 0.5
    adm.clock.t += 1
    assert s.open(A)[1] is None


def test_a_success_resets_the_count():
    adm, _s, _ = make(max_failures=3)
    adm.record_failure(A, "p", "handshake-timeout")
    adm.record_failure(A, "p", "handshake-timeout")
    adm.succeeded(A)
    adm.record_failure(A, "p", "handshake-timeout")
    adm.record_failure(A, "p", "handshake-timeout")
    assert adm.cooldown_left(A) == 0


def test_a_post_is_retired_after_n_failures_from_any_keys_only_when_allowed():
    adm, _s, _ = make(max_failures=3, retire_on_failures=True)
    assert adm.record_failure(A, "p", "handshake-bad-signature") is None
    assert adm.record_failure(B, "p", "handshake-bad-signature") is None
    assert adm.record_failure(C, "p", "handshake-bad-signature") == "p"
    assert adm.retired("p") and not adm.retired("q")
    assert adm.record_failure(C, "p", "handshake-bad-signature") is None  # retired once
    public, _s, _ = make(max_failures=3, retire_on_failures=False)  # a public multi-use post
    for i in range(10):
        assert public.record_failure(f"{i:064x}", "p", "handshake-bad-signature") is None
    assert not public.retired("p")


def test_failure_memory_is_bounded():
    from node.runtime.sessions import MAX_FAILURE_KEYS

    adm, _s, _ = make(max_failures=2)
    for i in range(MAX_FAILURE_KEYS + 10):
        adm.record_failure(f"{i:064x}", "p", "handshake-timeout")
    assert len(adm._failures) == MAX_FAILURE_KEYS


def test_a_key_whose_session_was_evicted_cannot_evict_in_turn():
    """Throw-away attackers reconnecting after an eviction must not keep every anonymous
    slot young by evicting each other: an evicted key takes only free slots for a while,
    and an honest newcomer can still evict the idle sessions they hold."""
    from node.runtime.sessions import EVICTED_KEY_PAUSE

    adm, s, _ = make(max_sessions=8, max_sessions_per_peer=4, anonymous_sessions=2, evict_idle_after_s=5)
    a1, _ = s.open(A, anonymous=True)
    b1, _ = s.open(B, anonymous=True)
    adm.session_ready(a1)
    adm.session_ready(b1)
    adm.clock.t += 10
    c1, r = s.open(C, anonymous=True)  # C evicts A's idle session
    assert r is None and s.ended == {a1: "session-evicted"}
    adm.session_ready(c1)
    adm.clock.t += 10
    assert s.open(A, anonymous=True)[1] == "handshake-host-busy"  # A was just evicted: no eviction for it
    assert b1 not in s.ended and c1 not in s.ended
    honest = "d" * 64
    assert s.open(honest, anonymous=True)[1] is None  # a new key still gets in
    assert s.ended[b1] == "session-evicted"
    adm.clock.t += EVICTED_KEY_PAUSE * 5
    assert s.open(A, anonymous=True)[1] is None  # the pause is over: A may evict again
