"""The host's session table, without iroh: :class:`node.host.sessions.SessionTable`
driven directly with a :class:`node.runtime.clock.ManualClock` and recording callbacks
(what the host does over real connections is in tests/test_transport_session.py,
tests/test_host_admission.py and, over memory pipes, tests/test_host_machines.py)."""

from __future__ import annotations

import pytest

from node.common.errors import HandshakeError
from node.runtime.clock import ManualClock
from node.host.sessions import HANDSHAKE_GRACE_S, QUIET_AFTER_S, AdmissionLimits, SessionTable
from node.trust.peers import PeerRegistry

A, B, C = "a" * 64, "b" * 64, "c" * 64


class Sessions:
    """Opens sessions on a SessionTable and records which were ended, with what code."""

    def __init__(self, adm: SessionTable) -> None:
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


def make(**limits) -> tuple[SessionTable, Sessions, list[dict]]:
    events: list[dict] = []
    adm = SessionTable(AdmissionLimits(**limits), on_event=events.append, clock=ManualClock())
    return adm, Sessions(adm), events


def test_per_peer_and_overall_bounds():
    adm, s, _ = make(max_sessions=3, max_sessions_per_peer=2)
    t1, r1 = s.open(A)
    t2, r2 = s.open(A)
    for t in (t1, t2):
        adm.session_ready(t)
        adm.begin_query(t)  # both answering: neither makes room for a third of A
    assert (r1, r2) == (None, None)
    assert s.open(A)[1] == "handshake-peer-busy"
    t3, r3 = s.open(B)
    adm.session_ready(t3)
    assert r3 is None
    assert s.open(C)[1] == "handshake-host-busy"  # every slot holds a ready session
    adm.close_session(t1)
    assert s.open(C)[1] is None
    assert adm.sessions == 3 and s.ended == {}


def test_a_key_at_its_cap_evicts_its_own_idle_session_not_another_keys():
    """A guest killed a few times (its sessions dead until the heartbeat gives up) is not
    refused for the next half minute, however fast it came back: its own least recently
    answered idle session makes room at once (no quiet time: the outcome must not depend
    on how fast the guest restarted)."""
    adm, s, events = make(max_sessions_per_peer=2)
    first, _ = s.open(A, name="alice")
    adm.session_ready(first)
    adm.clock.advance(0.25)
    second, _ = s.open(A, name="alice")
    adm.session_ready(second)
    other, _ = s.open(B, name="bea")
    adm.session_ready(other)
    adm.clock.advance(0.25)
    third, code = s.open(A, name="alice")  # half a second after the first: the first makes room
    assert code is None
    assert s.ended == {first: "session-evicted"} and adm.sessions_of(A) == 2
    assert events[-1] == {"event": "session-evicted", "peer": A, "code": "session-evicted", "idle_s": 0.5}
    adm.begin_query(second)  # answering: never evicted
    assert s.open(A, name="alice")[1] == "handshake-peer-busy"  # the third is not READY yet
    adm.session_ready(third)
    adm.begin_query(third)
    assert s.open(A, name="alice")[1] == "handshake-peer-busy"  # both answering
    adm.activity(third, "ok")
    assert s.open(A, name="alice")[1] is None  # the third, done answering, makes room
    assert third in s.ended and second not in s.ended and other not in s.ended


def test_full_host_evicts_the_oldest_handshake_not_a_ready_session():
    adm, s, events = make(max_sessions=3)
    ready, _ = s.open(A)
    adm.session_ready(ready)
    closing, _ = s.open(B)
    s.closing.add(closing)  # its engine closed already: leaving on its own, not evicted
    old, _ = s.open(B)
    adm.clock.advance(HANDSHAKE_GRACE_S - 0.5)
    assert s.open(C)[1] == "handshake-host-busy"  # a young handshake is not evicted
    adm.clock.advance(0.5)
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


def test_a_list_of_its_person_ends_a_session_admitted_but_not_yet_ready_with_the_ready_code():
    """From the door's verdict at ``_session_ready`` on (:meth:`SessionTable.session_admitted`)
    a revocation list of the session's verified person finds it, before the host records it
    ready; one still in its handshake, whose person is not known yet, is not a list's to end
    (specs/peers.md §5, §10)."""
    adm, s, _ = make(max_sessions=4, max_sessions_per_peer=4)
    admitted, _ = s.open(A)
    shaking, _ = s.open(A)
    adm.session_admitted(admitted, {"key": C, "deviceName": "laptop", "earlier": []})
    assert adm.end_sessions(A, "session-device-revoked", handshake_code="handshake-device-revoked",
                            of_persons=[C]) == 1
    assert s.ended == {admitted: "session-device-revoked"}
    assert shaking not in s.ended and adm.sessions_of(A) == 1


def test_admission_predicate(tmp_path):
    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", A)
    assert SessionTable.admits(reg, False, B, {})
    assert not SessionTable.admits(reg, True, B, {})
    assert SessionTable.admits(reg, True, A, {"displayName": "alice"})
    with pytest.raises(HandshakeError) as exc:
        SessionTable.admits(reg, False, B, {"displayName": "alice"})
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
        clock.advance(1)
    clock.advance(40)
    adm.begin_query(tokens[0])
    adm.activity(tokens[0], "ok")  # the oldest session answered a query just now
    t, r = s.open(B, anonymous=True)
    assert r is None
    assert s.ended == {tokens[1]: "session-evicted"}  # idle longest, not the oldest
    assert events[-1]["event"] == "session-evicted" and events[-1]["peer"] == A
    assert events[-1]["idle_s"] == 42.0
    adm.session_ready(t)
    clock.advance(29)
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
    adm.clock.advance(100)
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
    from node.host.sessions import ActivityTracked

    tracked = ActivityTracked(inner, lambda: adm.begin_query(t), lambda status: adm.activity(t, status))
    adm.clock.advance(20)
    assert tracked.search({"query": "x"})["status"] == "rate-limited"
    assert tracked.status == "rate-limited"  # other attributes pass through
    b, _ = s.open(B, anonymous=True)
    adm.session_ready(b)
    adm.clock.advance(20)
    inner.status = "ok"
    assert s.open(C, anonymous=True)[1] is None  # t stayed idle through the rate-limited answer
    assert t in s.ended


def test_a_session_answering_a_query_is_never_evicted():
    adm, s, _ = make(max_sessions=1, anonymous_sessions=1, evict_idle_after_s=10)
    t, _ = s.open(A, anonymous=True)
    adm.session_ready(t, "s" * 64)
    adm.begin_query(t)  # a hook is answering (say, a slow search)
    adm.clock.advance(1000)
    assert s.open(B, anonymous=True)[1] == "handshake-host-busy"
    assert s.open(C)[1] == "handshake-host-busy"  # not even for a pinned newcomer
    adm.activity(t, "ok")  # answered: active just now
    assert s.open(B, anonymous=True)[1] == "handshake-host-busy"
    adm.clock.advance(QUIET_AFTER_S)
    assert s.open(B, anonymous=True)[1] is None and s.ended == {t: "session-evicted"}


# ------------------------------------------------------------ fair admission without a wait (issue 19)
def fill_with_throwaway_keys(adm, s, n_keys: int, per_key: int) -> dict[str, list[int]]:
    held: dict[str, list[int]] = {}
    for i in range(n_keys):
        key = f"{i + 1:064x}"
        for _ in range(per_key):
            token, refusal = s.open(key, anonymous=True)
            assert refusal is None
            adm.session_ready(token, f"{token:064x}")
            held.setdefault(key, []).append(token)
    return held


def test_a_full_host_admits_a_pinned_guest_and_a_fresh_key_at_once():
    """Every slot is held by sessions of throw-away keys that ask nothing: a pinned
    guest and an anonymous key with no session get in once those sessions are quiet
    (QUIET_AFTER_S), long before --evict-idle-after (300 s here); the victim is a
    session of the key holding the most."""
    adm, s, events = make(max_sessions=8, max_sessions_per_peer=4, anonymous_sessions=8, evict_idle_after_s=300)
    held = fill_with_throwaway_keys(adm, s, 2, 4)
    big = f"{1:064x}"
    s.open(f"{9:064x}", anonymous=True)  # refused now: no room
    adm.close_session(held[f"{2:064x}"].pop())  # key 2 now holds 3, key 1 holds 4
    token, _ = s.open(f"{3:064x}", anonymous=True)  # the free slot
    adm.session_ready(token)
    assert s.open("f" * 64, anonymous=True)[1] == "handshake-host-busy"  # nobody quiet yet
    adm.clock.advance(QUIET_AFTER_S)
    assert s.open("f" * 64, anonymous=True)[1] is None  # a fresh anonymous key: at once
    assert list(s.ended) == [held[big][0]]  # the key holding the most gave one up
    assert s.open(C)[1] is None  # a pinned guest: at once too
    assert len(s.ended) == 2 and all(code == "session-evicted" for code in s.ended.values())
    assert [e["event"] for e in events].count("session-evicted") == 2


def test_a_key_that_holds_sessions_waits_for_evict_idle_after():
    adm, s, _ = make(max_sessions=4, max_sessions_per_peer=4, anonymous_sessions=4, evict_idle_after_s=30)
    fill_with_throwaway_keys(adm, s, 1, 3)
    mine, _ = s.open(B, anonymous=True)
    adm.session_ready(mine)
    adm.clock.advance(QUIET_AFTER_S + 1)
    assert s.open(B, anonymous=True)[1] == "handshake-host-busy"  # B holds one: no fast path
    adm.clock.advance(30)
    assert s.open(B, anonymous=True)[1] is None  # the old rule: idle for --evict-idle-after


def test_throwaway_keys_cannot_evict_each_other_in_a_loop():
    """Evicted keys come back at once, over and over (for less than --evict-idle-after):
    each evicted key is paused, and a key holding a session has no fast path, so
    evictions stop after one round."""
    adm, s, _ = make(max_sessions=4, max_sessions_per_peer=4, anonymous_sessions=4, evict_idle_after_s=30)
    keys = [f"{i + 1:064x}" for i in range(8)]
    for key in keys[:4]:
        token, _ = s.open(key, anonymous=True)
        adm.session_ready(token)
    for _round in range(12):  # 24 s < evict_idle_after_s
        adm.clock.advance(QUIET_AFTER_S)
        for key in keys:
            token, refusal = s.open(key, anonymous=True)
            if refusal is None:
                adm.session_ready(token)
    assert len(s.ended) == 4  # the four newcomers evicted once each; the evicted never evict back
    assert adm.sessions == 4


# ------------------------------------------------------------ failed handshakes (issue 11 §1)
def test_failure_cap_cools_a_key_down_and_counts_only_verification_failures():
    adm, s, _ = make(max_failures=3, failure_cooldown_s=60)
    for code in ("handshake-host-busy", "handshake-not-admitted", "handshake-post-expired", "handshake-unknown-post"):
        adm.record_failure(A, code)  # the host's own refusals are not failures
    assert adm.cooldown_left(A) == 0
    adm.record_failure(A, "handshake-bad-signature")
    adm.record_failure(A, "handshake-key-mismatch")
    assert s.open(A)[1] is None
    adm.record_failure(A, "handshake-nonce-reused")
    assert adm.cooldown_left(A) == 60
    assert s.open(A)[1] == "handshake-too-many-failures"
    assert s.open(B)[1] is None  # another key is not affected
    adm.clock.advance(59.5)
    assert adm.cooldown_left(A) == 0.5
    adm.clock.advance(1)
    assert s.open(A)[1] is None


def test_a_success_resets_the_count():
    adm, _s, _ = make(max_failures=3)
    adm.record_failure(A, "handshake-timeout")
    adm.record_failure(A, "handshake-timeout")
    adm.succeeded(A)
    adm.record_failure(A, "handshake-timeout")
    adm.record_failure(A, "handshake-timeout")
    assert adm.cooldown_left(A) == 0


def test_a_post_is_retired_after_n_failures_from_any_keys_only_when_allowed():
    from node.host.posts import Posts

    events: list[dict] = []
    warned: list[str] = []
    posts = Posts("proto", server_url=None, identity=None, invite_file=None, emit=events.append,
                  warn=warned.append, clock=ManualClock(), max_failures=3, retire_on_failures=True)
    posts._live["p"] = "proto"
    for _ in range(2):
        posts.record_failure("p", "handshake-bad-signature")
    posts.record_failure("p", "handshake-host-busy")  # the host's own refusal: not a failure
    assert not posts.retired("p") and posts.joinable("p")
    posts.record_failure("p", "handshake-bad-signature")
    assert posts.retired("p") and not posts.retired("q") and not posts.joinable("p")
    posts.record_failure("p", "handshake-bad-signature")  # retired once
    assert events == [{"event": "post-retired", "post_id": "p", "reason": "too-many-failures"}]
    assert len(warned) == 1 and "restart `kith host`" in warned[0]
    public = Posts("proto", server_url="http://127.0.0.1:1", identity=None, invite_file=None,
                   emit=events.append, warn=warned.append, max_failures=3, retire_on_failures=False)
    public._live["p"] = "proto"
    for _ in range(10):
        public.record_failure("p", "handshake-bad-signature")  # a public multi-use post
    assert not public.retired("p")


def test_failure_memory_is_bounded():
    from node.host.sessions import MAX_FAILURE_KEYS

    adm, _s, _ = make(max_failures=2)
    for i in range(MAX_FAILURE_KEYS + 10):
        adm.record_failure(f"{i:064x}", "handshake-timeout")
    assert adm.failure_keys == MAX_FAILURE_KEYS


def test_a_key_whose_session_was_evicted_cannot_evict_in_turn():
    """Throw-away attackers reconnecting after an eviction must not keep every anonymous
    slot young by evicting each other: an evicted key takes only free slots for a while,
    and an honest newcomer can still evict the idle sessions they hold."""
    from node.host.sessions import EVICTED_KEY_PAUSE

    adm, s, _ = make(max_sessions=8, max_sessions_per_peer=4, anonymous_sessions=2, evict_idle_after_s=5)
    a1, _ = s.open(A, anonymous=True)
    b1, _ = s.open(B, anonymous=True)
    adm.session_ready(a1)
    adm.session_ready(b1)
    adm.clock.advance(10)
    c1, r = s.open(C, anonymous=True)  # C evicts A's idle session
    assert r is None and s.ended == {a1: "session-evicted"}
    adm.session_ready(c1)
    adm.clock.advance(10)
    assert s.open(A, anonymous=True)[1] == "handshake-host-busy"  # A was just evicted: no eviction for it
    assert b1 not in s.ended and c1 not in s.ended
    honest = "d" * 64
    assert s.open(honest, anonymous=True)[1] is None  # a new key still gets in
    assert s.ended[b1] == "session-evicted"
    adm.clock.advance(EVICTED_KEY_PAUSE * 5)
    assert s.open(A, anonymous=True)[1] is None  # the pause is over: A may evict again


def test_stallers_that_reconnect_at_once_cannot_keep_every_handshake_young():
    """The stalled-handshake flood: throw-away keys open handshakes that never finish and
    reconnect the moment they are evicted, so that every handshake stays younger than the
    grace. An evicted staller evicts nothing in turn; once the grace passes, an honest
    newcomer evicts the oldest stalled handshake at once."""
    adm, s, events = make(max_sessions=8, max_sessions_per_peer=4, anonymous_sessions=6, evict_idle_after_s=30)
    stallers = [f"{i + 1:064x}" for i in range(10)]
    for key in stallers[:6]:
        s.open(key, anonymous=True)
    per_round = []
    for _round in range(10):  # each round: the clock passes the grace, every staller retries
        adm.clock.advance(HANDSHAKE_GRACE_S)
        before = len(events)
        for key in stallers:
            s.open(key, anonymous=True)
        per_round.append(sum(1 for e in events[before:] if e.get("reason") == "evicted"))
    assert per_round[-5:] == [0] * 5, per_round  # the evictions stop: every evicted staller is paused
    adm.clock.advance(HANDSHAKE_GRACE_S)
    honest = "f" * 64
    token, refusal = s.open(honest, anonymous=True)
    assert refusal is None and adm.sessions_of(honest) == 1
    adm.session_ready(token)


def test_a_device_holding_a_person_pins_grants_is_a_pinned_session_never_evicted():
    """A person pin's device (``kith peers add NAME KEY --devices``) comes in on an anonymous
    slot (its key is not in the registry); once its chain made it the pin's (``via_person``)
    it is a pinned peer's session: listed ``pinned``, out of the anonymous share, and never
    evicted for an anonymous newcomer however quiet it is."""
    adm, s, events = make(max_sessions=4, anonymous_sessions=1, evict_idle_after_s=30.0)
    laptop, refused = s.open(A, anonymous=True)
    assert refused is None
    adm.session_admitted(laptop, via_person=("alice", "d" * 64))  # the door's verdict at _session_ready
    adm.session_ready(laptop, "1" * 64)
    adm.clock.advance(QUIET_AFTER_S + 60.0)  # quiet, and idle past --evict-idle-after
    stranger, refused = s.open(B, anonymous=True)
    assert refused is None and s.ended == {}  # the stranger took the free anonymous slot
    adm.session_ready(stranger, "2" * 64)
    assert adm.anonymous_sessions == 1
    adm.clock.advance(QUIET_AFTER_S + 60.0)
    _, refused = s.open(C, anonymous=True)  # a fresh stranger evicts the quiet stranger only
    assert refused is None and s.ended == {stranger: "session-evicted"}
    assert [r["tier"] for r in adm.listing() if r["peer"]["key"] == A] == ["pinned"]
