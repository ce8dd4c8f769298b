"""The doorkeeper (node/host/doorkeeper.py) driven directly, step by step, with the real
parts it asks — a :class:`SessionTable` on a :class:`ManualClock`, the peers watcher over a
real ``peers.json``, the rotation ledger, real binding chains and revocation lists — and no
transport: who is refused at which step, with which code, and what a refusal leaves behind
(no slot). Over real connections the same rules are in tests/test_host_admission.py,
tests/test_presence.py and tests/test_person_grants.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node.common.errors import HandshakeError
from node.runtime.clock import ManualClock
from node.host.doorkeeper import (
    Admitted,
    Arrival,
    Chain,
    Deferral,
    Doorkeeper,
    Init,
    Ready,
    Refused,
    engine_seams,
    judge_init,
)
from node.host.revocation import PeersWatcher
from node.host.sessions import AdmissionLimits, SessionTable
from node.trust.binding import device_link, verify_chain
from node.trust.identity import Identity
from node.trust.peers import PeerRegistry, pin_person
from node.trust.revocation_list import check_list, make_list
from node.trust.rotation import RotationLedger
from node.trust.signing import public_key_of

WHEN = "2026-12-01T10:00:00Z"


def _key() -> str:
    return Identity(os.urandom(32)).public_key


class Door:
    """A doorkeeper over a fresh home, with the parts it asks kept for the test to read."""

    def __init__(self, home: Path, *, presence: str = "open", peers_only: bool = False, **limits) -> None:
        self.home = home
        self.clock = ManualClock()
        self.events: list[dict] = []
        self.closing = False
        self.table = SessionTable(AdmissionLimits(**limits), on_event=self.events.append, clock=self.clock)
        self.watcher = PeersWatcher(home, self.table, on_event=self.events.append, clock=self.clock)
        self.door = Doorkeeper(table=self.table, peers=self.watcher, rotations=RotationLedger.load(home),
                               presence=presence, peers_only=peers_only, closing=lambda: self.closing,
                               emit=self.events.append)
        self.ended: dict[int, str] = {}
        self._token = 0

    def arrive(self, key: str):
        self._token += 1
        token = self._token
        return self.door.admit(Arrival(key, token, lambda code, _m: self.ended.__setitem__(token, code)))


class Person:
    """A person key that binds devices (real signed chains)."""

    def __init__(self) -> None:
        self.secret = os.urandom(32)
        self.key = public_key_of(self.secret)

    def device(self, name: str, seq: int = 1) -> tuple[Identity, object]:
        ident = Identity(os.urandom(32))
        chain = [device_link(self.secret, ident.public_key, name, WHEN, seq)]
        return ident, verify_chain(chain, ident.public_key)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


# ----------------------------------------------------------------------------- step 1: arrival
def test_under_granted_presence_a_key_without_a_grant_is_refused_first_and_takes_no_slot(home):
    alice = _key()
    PeerRegistry.load(home).add("alice", alice)
    d = Door(home, presence="granted")
    d.closing = True  # a stopping host: the no-grant refusal still comes first
    stranger = d.arrive(_key())
    assert stranger == Refused("handshake-unknown-post", reason="no-grant")
    assert d.arrive(alice) == Refused("session-shutdown")
    assert d.table.sessions == 0
    d.closing = False
    admitted = d.arrive(alice)
    assert isinstance(admitted, Admitted) and admitted.visit.pinned.name == "alice"
    assert d.table.sessions == 1


def test_a_key_in_its_cool_down_is_told_how_long_is_left_and_comes_back_after_it(home):
    d = Door(home, max_failures=2, failure_cooldown_s=90.0)
    guest = _key()
    for _ in range(2):
        d.table.record_failure(guest, "handshake-bad-signature")
    refused = d.arrive(guest)
    assert refused == Refused("handshake-too-many-failures",
                              "Too many failed handshakes from this key; try again in 90 s.")
    d.clock.advance(89.5)
    assert "try again in 1 s" in d.arrive(guest).message  # never "0 s"
    d.clock.advance(1.0)
    assert isinstance(d.arrive(guest), Admitted)


def test_the_slot_bounds_refuse_a_peer_over_its_share(home):
    d = Door(home, max_sessions_per_peer=1)
    guest = _key()
    assert isinstance(d.arrive(guest), Admitted)
    assert d.arrive(guest) == Refused("handshake-peer-busy")
    assert d.table.sessions_of(guest) == 1


# ----------------------------------------------------------------------------- step 2: _session_init
def test_a_device_its_person_pin_has_seen_takes_a_pinned_slot_not_an_anonymous_one(home):
    """The anonymous share is full of guests who are asking (none may be evicted): a device
    of a person pin that the host has seen before still gets in, as a pinned peer would
    (it holds the pin's grant, node/host/grants.py); a device the pin has not seen, or
    one its person revoked, is an anonymous newcomer and is turned away."""
    from node.trust.peers import note_device

    person = Person()
    registry = PeerRegistry.load(home)
    rec = pin_person(registry, "alice", person.key)
    seen, _ = person.device("laptop")
    note_device(registry, rec, seen.public_key, "laptop")
    d = Door(home, anonymous_sessions=1)
    busy = d.arrive(_key())
    assert isinstance(busy, Admitted)
    d.table.session_ready(busy_token := d._token)
    d.table.begin_query(busy_token)  # answering a query: never evicted
    unseen, _ = person.device("phone")
    assert d.arrive(unseen.public_key) == Refused("handshake-host-busy")
    admitted = d.arrive(seen.public_key)
    assert isinstance(admitted, Admitted) and admitted.visit.pinned is None  # judged by its chain later
    assert d.table.anonymous_sessions == 1 and d.table.sessions == 2 and d.ended == {}


def test_init_judges_by_the_registry_read_when_the_stream_opened(home):
    d = Door(home, peers_only=True)
    late = _key()
    visit = d.arrive(late).visit
    PeerRegistry.load(home).add("late", late)  # pinned while its handshake runs
    assert d.door.admit(Init(visit, {})) == Refused("handshake-not-admitted")
    assert isinstance(d.door.admit(Init(d.arrive(late).visit, {})), Admitted)  # the next connection sees it


def test_the_init_rule_in_order_and_under_granted_presence(home):
    reg = PeerRegistry.load(home)
    alice, blocked, stranger = _key(), _key(), _key()
    reg.add("alice", alice)
    reg.block(blocked)
    assert judge_init(reg, False, blocked, {}) == Refused("handshake-peer-blocked", "this key is blocked")
    assert judge_init(reg, False, stranger, {"displayName": "Alice"}).code == "peer-key-changed"
    assert judge_init(reg, False, stranger, {}) == Admitted()
    assert judge_init(reg, True, stranger, {}) == Refused("handshake-not-admitted")
    assert judge_init(reg, True, alice, {"displayName": "alice"}) == Admitted()
    # granted: every no-grant refusal reads as an unknown post; a grant holder keeps its own
    assert judge_init(reg, False, stranger, {}, presence="granted") == Refused("handshake-unknown-post")
    assert judge_init(reg, False, blocked, {}, presence="granted") == Refused("handshake-unknown-post")
    assert judge_init(reg, False, alice, {}, presence="granted") == Admitted()


# ----------------------------------------------------------------------------- steps 3-5: the person
def test_a_device_of_a_person_pin_is_deferred_at_init_and_admitted_by_its_person_at_ready(home):
    person = Person()
    pin = pin_person(PeerRegistry.load(home), "alice", person.key)
    ident, pid = person.device("laptop")
    d = Door(home, peers_only=True)
    visit = d.arrive(ident.public_key).visit
    assert d.door.admit(Init(visit, {})) == Refused("handshake-not-admitted")
    assert isinstance(d.door.admit(Deferral(visit, {"displayName": "alice"}, "handshake-not-admitted")), Admitted)
    assert visit.profile == {"displayName": "alice"}
    assert isinstance(d.door.admit(Chain(visit, pid)), Admitted)
    assert isinstance(d.door.admit(Ready(visit, pid, None, "handshake-not-admitted")), Admitted)
    assert visit.pin.name == pin.name == "alice"  # the device holds the person pin's grants


def test_only_an_unpinned_device_refused_for_a_deferrable_code_is_deferred(home):
    alice = _key()
    PeerRegistry.load(home).add("alice", alice)
    d = Door(home)
    pinned = d.arrive(alice).visit
    assert d.door.admit(Deferral(pinned, {}, "handshake-not-admitted")) == Refused("handshake-not-admitted")
    stranger = d.arrive(_key()).visit
    assert d.door.admit(Deferral(stranger, {}, "handshake-peer-blocked")) == Refused("handshake-peer-blocked")


def test_at_ready_a_deferred_device_without_its_persons_pin_is_refused(home):
    person = Person()
    ident, pid = person.device("laptop")
    d = Door(home, peers_only=True)
    visit = d.arrive(ident.public_key).visit
    assert d.door.admit(Ready(visit, pid, None, "handshake-not-admitted")) == Refused("handshake-person-not-pinned")
    no_chain = d.arrive(_key()).visit
    assert d.door.admit(Ready(no_chain, None, None, "handshake-not-admitted")) == Refused("handshake-not-admitted")


def test_a_revocation_list_carried_at_ready_refuses_the_device_it_revokes_and_no_other(home):
    person = Person()
    pin_person(PeerRegistry.load(home), "alice", person.key)
    thief, thief_pid = person.device("old-phone", seq=1)
    desk, desk_pid = person.device("desk", seq=2)
    revocation = check_list(make_list(person.secret, [thief.public_key], 1, WHEN), person=person.key)
    d = Door(home)
    desk_visit = d.arrive(desk.public_key).visit
    assert isinstance(d.door.admit(Ready(desk_visit, desk_pid, revocation, None)), Admitted)
    thief_visit = d.arrive(thief.public_key).visit
    refused = d.door.admit(Ready(thief_visit, thief_pid, None, None))
    assert refused.code == "handshake-device-revoked"


def test_a_blocked_person_key_refuses_its_devices_at_ready(home):
    person = Person()
    reg = PeerRegistry.load(home)
    pin_person(reg, "alice", person.key)
    reg.block(person.key)
    ident, pid = person.device("laptop")
    d = Door(home)
    visit = d.arrive(ident.public_key).visit
    assert d.door.admit(Ready(visit, pid, None, None)).code == "handshake-peer-blocked"


# ----------------------------------------------------------------------------- the engine's seams
def test_the_engine_seams_raise_the_doors_refusals(home):
    d = Door(home, peers_only=True)
    visit = d.arrive(_key()).visit
    seams = engine_seams(d.door, visit)
    with pytest.raises(HandshakeError) as exc:
        seams["admit"](visit.key, {})
    assert exc.value.code == "handshake-not-admitted"
    assert seams["defer"](visit.key, {}, "handshake-not-admitted") is True
    assert seams["defer"](visit.key, {}, "handshake-peer-blocked") is False
    with pytest.raises(HandshakeError) as exc:
        seams["admit_person"](None, None, "handshake-not-admitted")
    assert exc.value.code == "handshake-not-admitted"


def test_a_request_the_door_does_not_know_is_a_programming_error(home):
    with pytest.raises(TypeError):
        Door(home).door.admit("let me in")  # type: ignore[arg-type]
