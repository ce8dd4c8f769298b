"""The doorkeeper: every admission decision of a host, in one machine with one entry point.

A guest passes the door in steps, each a request to :meth:`Doorkeeper.admit`, which
answers :class:`Admitted` or :class:`Refused` (the code the guest is sent, the message,
and a ``reason`` for the owner's event):

1. :class:`Arrival` — its stream opened. Under ``presence = granted`` a key holding no
   grant gets the unknown-post refusal before anything else (node/host/grants.py); a
   stopping host refuses ``session-shutdown``; then a session slot is taken in the
   :class:`node.host.sessions.SessionTable` (per-peer and anonymous bounds, fair
   eviction, failed-handshake cool-downs; a pinned key, or a device a person pin has seen,
   takes a pinned peer's slot, outside the anonymous share). Admitted carries the :class:`Visit`: the peer
   registry as read now, which every later step of this connection judges by.
2. :class:`Init` — its ``_session_init`` was read: revoked device, blocked key, a pinned
   name claimed by another key, ``--peers-only`` (:func:`judge_init`, pure).
3. :class:`Deferral` — a guest that advertised ``person_chain_v1`` and was refused at
   step 2 for not being pinned itself may be judged again by its person at step 5
   (specs/peers.md §10).
4. :class:`Chain` — its binding chain verified: the host's rotation ledger
   (node/trust/rotation.py) may refuse it; rotations of known peers are followed.
5. :class:`Ready` — at ``_session_ready``: a revocation list it carried is taken, a device
   its person revoked or a blocked person is refused, a device of a person pin
   (``--devices``) holds that pin's grants (:attr:`Visit.pin`).

A **sealed question** (specs/sealed.md §4, issue 43 item 3) has no connection; its asker
is judged by the same rules in one request, :class:`Sealed` — the presence rule of step 1
(no slot is taken: it holds no session), then steps 2–5 with the chain the question carried
(a chain lets step 2's refusal be deferred, as ``person_chain_v1`` does) and no revocation
list. So a sealed question is admitted exactly when a live handshake of that device would be.

The engine asks steps 2–5 through its ``HostConfig`` seams (``admit``, ``defer``,
``check_person``, ``admit_person``); :func:`engine_seams` builds them from one visit, so the
translation of a refusal into :class:`HandshakeError` is written once. The doorkeeper does
no I/O of its own: it reads the peers watcher's registry and revocation lists, takes slots
in the table and asks the rotation ledger; its collaborators are given at construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from node.common.errors import HandshakeError
from node.common.host_events import PersonRotated
from node.host.grants import has_grant, refusal_code
from node.trust.rotation import pinned_in_lineage

#: ``_session_init`` refusals a guest that advertised ``person_chain_v1`` may have deferred to
#: ``_session_ready`` (``HostConfig.defer``, specs/peers.md §10).
DEFERRABLE_CODES = ("handshake-not-admitted", "peer-key-changed")


# ------------------------------------------------------------------ answers
@dataclass(frozen=True)
class Admitted:
    """The step passed. ``visit``: the connection's :class:`Visit` (set by every step)."""

    visit: "Visit | None" = None


@dataclass(frozen=True)
class Refused:
    """The step refused the guest.

    Attributes:
        code: the stable code it is sent (``_session_reject``; specs/error-codes.md).
        message: the peer message, or None for the code's own.
        reason: why, for the owner's ``session-refused`` event only (e.g. ``no-grant``).
    """

    code: str
    message: str | None = None
    reason: str | None = None


Verdict = Union[Admitted, Refused]


# ------------------------------------------------------------------ what one connection carries
@dataclass
class Visit:
    """What the door knows of one connection's guest between its steps.

    Attributes:
        key: the QUIC-authenticated device key (64 hex).
        registry: the peer registry as read when the stream opened (a person pin's
            grants replace it with the newest one at :class:`Ready`).
        pinned: the registry record of this device key, or None.
        profile: what a deferred guest shared (its name claim is judged at :class:`Ready`).
        pin: the person pin whose grants this device holds (after :class:`Ready`), or None.
    """

    key: str
    registry: Any
    pinned: Any = None
    profile: dict[str, Any] = field(default_factory=dict)
    pin: Any = None


@dataclass(frozen=True)
class Arrival:
    """The guest's stream opened (before any slot, nonce or post use is taken).

    Attributes:
        key: the peer's key ("" when the transport cannot name it).
        token: the connection's number (the session table's key).
        end: ``(code, message)`` → ends that session now (the table's eviction and revocation).
        alive: False once the session is leaving on its own.
    """

    key: str
    token: int
    end: Callable[[str, str], None]
    alive: Callable[[], bool] = lambda: True


@dataclass(frozen=True)
class Init:
    """The guest's ``_session_init`` was read: its claimed ``profile``."""

    visit: Visit
    profile: dict[str, Any]


@dataclass(frozen=True)
class Deferral:
    """Step 2 refused the guest with ``code``; may its person decide at :class:`Ready`?"""

    visit: Visit
    profile: dict[str, Any]
    code: str


@dataclass(frozen=True)
class Chain:
    """The guest's binding chain verified: ``person`` (a
    :class:`node.trust.binding.PersonIdentity`)."""

    visit: Visit
    person: Any


@dataclass(frozen=True)
class Ready:
    """``_session_ready`` with the chain and revocation list verified.

    Attributes:
        person: the verified :class:`node.trust.binding.PersonIdentity`, or None (no chain).
        revocation: the verified revocation list it carried, or None.
        deferred: the code step 2 deferred (:class:`Deferral`), or None.
    """

    visit: Visit
    person: Any
    revocation: Any
    deferred: str | None


@dataclass(frozen=True)
class Sealed:
    """A sealed question's asker, opened and verified (specs/sealed.md §4).

    Attributes:
        key: the sender's device key (the record's signature verified by it).
        person: its verified :class:`node.trust.binding.PersonIdentity`, or None (no chain).
    """

    key: str
    person: Any


Request = Union[Arrival, Init, Deferral, Chain, Ready, Sealed]


# ------------------------------------------------------------------ the pure rule of step 2
def judge_init(registry: Any, peers_only: bool, key: str, profile: dict[str, Any], revocations: Any = None,
               presence: str = "open") -> Verdict:
    """May guest ``key`` open a session once its ``_session_init`` is read? (DESIGN §6, §10;
    pure: reads ``registry`` and ``revocations`` only).

    Refused, in this order: ``handshake-device-revoked`` for a key that a kept revocation
    list of a person pin that has seen it as its device names
    (:func:`node.trust.peers.persons_of_device`; any other device is judged by its chain at
    :class:`Ready`); ``handshake-peer-blocked`` for a blocked key (``kith peers block``);
    ``peer-key-changed`` for a key that is not pinned but whose shared ``displayName``
    claims a pinned name; with ``peers_only``, ``handshake-not-admitted`` for a key not in
    ``registry``. Under ``presence = granted`` a refusal passes through
    :func:`node.host.grants.refusal_code` (a no-grant code becomes the unknown-post one),
    except a deferrable code of a key that holds a grant (a person pin's seen device: its
    chain decides at :class:`Ready`).
    """
    from node.trust.peers import persons_of_device

    verdict: Verdict = Admitted()
    if revocations is not None and revocations.revokes(key, persons_of_device(registry, key)) is not None:
        verdict = Refused("handshake-device-revoked", "this device was revoked by its person")
    elif registry.is_blocked(key):
        verdict = Refused("handshake-peer-blocked", "this key is blocked")
    elif registry.claimed_by_other(key, profile) is not None:
        verdict = Refused("peer-key-changed", "a pinned peer name with a different key")
    elif peers_only and registry.by_key(key) is None:
        verdict = Refused("handshake-not-admitted")
    if presence != "granted":
        return verdict
    granted = has_grant(registry, key, revocations)
    if isinstance(verdict, Admitted):
        return verdict if granted else Refused(refusal_code(presence, "handshake-not-admitted", granted=False))
    if granted and verdict.code in DEFERRABLE_CODES:
        return verdict
    return Refused(refusal_code(presence, verdict.code, granted=granted))


def admits(registry: Any, peers_only: bool, key: str, profile: dict[str, Any], revocations: Any = None) -> bool:
    """:func:`judge_init` under ``open`` presence as the engine's old ``admit`` shape: True,
    False for ``handshake-not-admitted``, or raises :class:`HandshakeError` for any other
    refusal (kept as :meth:`node.host.sessions.SessionTable.admits`)."""
    verdict = judge_init(registry, peers_only, key, profile, revocations)
    if isinstance(verdict, Admitted):
        return True
    if verdict.code == "handshake-not-admitted":
        return False
    raise HandshakeError(verdict.code, verdict.message)


def admission(registry: Any, peers_only: bool, revocations: Any = None,
              presence: str = "open") -> Callable[[str, dict[str, Any]], bool]:
    """:func:`judge_init` bound to ``registry`` as an engine ``HostConfig.admit``: True, False
    (``open`` presence, not admitted) or raises :class:`HandshakeError` with the code."""

    def admit(key: str, profile: dict[str, Any]) -> bool:
        if presence != "granted":
            return admits(registry, peers_only, key, profile, revocations)
        verdict = judge_init(registry, peers_only, key, profile, revocations, presence)
        if isinstance(verdict, Refused):
            raise HandshakeError(verdict.code, verdict.message)
        return True

    return admit


# ------------------------------------------------------------------ the machine
class Doorkeeper:
    """The host's admission, one request at a time (:meth:`admit`).

    Args:
        table: the host's :class:`node.host.sessions.SessionTable` (slots, cool-downs).
        peers: the host's :class:`node.host.revocation.PeersWatcher` (``current()``,
            ``known()``, ``revocations()``, ``apply_list()``).
        rotations: the host's :class:`node.trust.rotation.RotationLedger`.
        presence: ``"open"`` or ``"granted"`` (``kith host --presence``).
        peers_only: admit only keys in the registry (``--peers-only``).
        closing: True once the host is stopping (new sessions get ``session-shutdown``).
        emit: reports ``person-rotated`` events (the host's :meth:`~node.host.host.Host.emit`).
    """

    def __init__(self, *, table: Any, peers: Any, rotations: Any, presence: str = "open", peers_only: bool = False,
                 closing: Callable[[], bool] = lambda: False,
                 emit: Callable[[dict[str, Any]], None] = lambda _ev: None) -> None:
        self.table = table
        self.peers = peers
        self.rotations = rotations
        self.presence = presence
        self.peers_only = peers_only
        self.closing = closing
        self.emit = emit

    def admit(self, request: Request) -> Verdict:
        """Judge one step of a guest (see the module docstring for the steps and their rules).

        Returns:
            :class:`Admitted` (with the connection's :class:`Visit`) or :class:`Refused`.
        """
        step = self._STEPS.get(type(request))
        if step is None:
            raise TypeError(f"not a door request: {type(request).__name__}")
        return step(self, request)

    def _arrival(self, r: Arrival) -> Verdict:
        registry = self.peers.current()  # re-read once per connection: `kith peers` may have changed it
        granted = has_grant(registry, r.key, self.peers.revocations())
        if self.presence == "granted" and not granted:
            # first, before any other refusal (a shutting-down host's session-shutdown included):
            # no slot, nonce or post use is taken, no heartbeat is ever sent (node/host/grants.py)
            return Refused(refusal_code("granted", "handshake-not-admitted", granted=False), reason="no-grant")
        if self.closing():
            return Refused("session-shutdown")
        pinned = registry.by_key(r.key)
        # a device a person pin has seen holds that pin's grant: a pinned peer's slot, not
        # the anonymous share (its chain is still judged at Ready)
        code = self.table.open_session(r.token, r.key, r.end, alive=r.alive, anonymous=pinned is None and not granted,
                                       name=pinned.name if pinned else None)
        if code == "handshake-too-many-failures":
            left = max(1, math.ceil(self.table.cooldown_left(r.key)))
            return Refused(code, f"Too many failed handshakes from this key; try again in {left} s.")
        if code is not None:
            return Refused(code)
        return Admitted(Visit(r.key, registry, pinned))

    def _init(self, r: Init) -> Verdict:
        verdict = judge_init(r.visit.registry, self.peers_only, r.visit.key, r.profile, self.peers.revocations(),
                             self.presence)
        return Admitted(r.visit) if isinstance(verdict, Admitted) else verdict

    def _deferral(self, r: Deferral) -> Verdict:
        # only a device key that is not pinned itself, refused only for not being pinned
        # (--peers-only) or for claiming a pinned name
        if r.visit.pinned is not None or r.code not in DEFERRABLE_CODES:
            return Refused(r.code)
        r.visit.profile = dict(r.profile)
        return Admitted(r.visit)

    def _chain(self, r: Chain) -> Verdict:
        # Rotations are *recorded* (and the owner told, person-rotated) only for a peer the
        # registry knows — its device key, or a key of its lineage, is pinned — so strangers
        # cannot grow the ledger, push pinned people's entries out of it, or make the host
        # write for every handshake.
        v, pid = r.visit, r.person
        known = v.registry.by_key(v.key) is not None or pinned_in_lineage(v.registry, self.rotations, pid) is not None
        try:
            if not known:
                self.rotations.check(pid)
                return Admitted(v)
            for old, new, via in self.rotations.follow(pid):
                self.emit(PersonRotated(old_person=old, person=new, via=via, peer=v.key,
                                        device_name=pid.device_name).to_dict())
        except HandshakeError as exc:
            return Refused(exc.code, exc.message)
        return Admitted(v)

    def _ready(self, r: Ready) -> Verdict:
        v, person, deferred = r.visit, r.person, r.deferred
        if r.revocation is not None:
            # judged on the newest registry read; a pin on a key the chain rotated from counts
            self.peers.apply_list(r.revocation, via="handshake", lineage=self.rotations.lineage(person))
        kept = self.peers.revocations()
        if person is None:
            # a key that names no person cannot contest a kept list that names it
            if kept.revokes(v.key, kept.persons) is not None:
                return Refused("handshake-device-revoked", "this device was revoked by its person")
            return Refused(deferred) if deferred is not None else Admitted(v)
        if kept.revokes(person.device, self.rotations.lineage(person)) is not None:
            return Refused("handshake-device-revoked", "this device was revoked by its person")
        known = self.peers.known()  # the newest registry the host read: a pin removed meanwhile grants nothing
        if known.is_blocked(person.person):
            return Refused("handshake-peer-blocked", "this device's person key is blocked")
        pin = None
        if v.pinned is None:  # a pin on this person key, or on a key it rotated from (specs/peers.md §11)
            rec = pinned_in_lineage(known, self.rotations, person)
            pin = rec if rec is not None and rec.devices else None
        if deferred == "peer-key-changed" and (pin is None or known.claimed_by_other(
                v.key, v.profile) not in (None, pin)):
            return Refused("peer-key-changed", "a pinned peer name with a different key")
        if deferred == "handshake-not-admitted" and pin is None:
            return Refused("handshake-person-not-pinned")
        v.pin = pin
        if pin is not None:
            v.registry = known  # the record the session's grants and seenDevices come from
        return Admitted(v)


    def _sealed(self, r: Sealed) -> Verdict:
        # the steps a live guest of this device passes, in order, with what the record carried
        registry = self.peers.current()
        if self.presence == "granted" and not has_grant(registry, r.key, self.peers.revocations()):
            return Refused(refusal_code("granted", "handshake-not-admitted", granted=False), reason="no-grant")
        visit = Visit(r.key, registry, registry.by_key(r.key))
        deferred = None
        verdict = self._init(Init(visit, {}))
        if isinstance(verdict, Refused):
            if r.person is None or isinstance(self._deferral(Deferral(visit, {}, verdict.code)), Refused):
                return verdict
            deferred = verdict.code
        if r.person is not None:
            verdict = self._chain(Chain(visit, r.person))
            if isinstance(verdict, Refused):
                return verdict
        return self._ready(Ready(visit, r.person, None, deferred))

    def sealed_name(self, key: str, person: Any) -> str | None:
        """Who a sealed question's asker is to this host now (:class:`Sealed`): the registry
        name it is answered under — its device pin's, or the person pin (``--devices``) it
        is a device of — or None (an anonymous peer).

        Raises:
            HandshakeError: the refusal a live handshake of that device would get
                (``handshake-device-revoked``, ``handshake-peer-blocked``,
                ``handshake-not-admitted``, ``handshake-person-not-pinned``, the unknown-post
                code under ``presence = granted``, a rotation refusal, ...).
        """
        verdict = self.admit(Sealed(key, person))
        if isinstance(verdict, Refused):
            raise HandshakeError(verdict.code, verdict.message)
        visit = verdict.visit
        rec = (visit.pinned or visit.pin) if visit is not None else None
        return rec.name if rec is not None else None

    #: Each step of a guest → the method judging it (:meth:`admit`).
    _STEPS: dict[type, Callable[["Doorkeeper", Any], Verdict]] = {
        Arrival: _arrival, Init: _init, Deferral: _deferral, Chain: _chain, Ready: _ready, Sealed: _sealed}


def engine_seams(door: Doorkeeper, visit: Visit) -> dict[str, Callable[..., Any]]:
    """The engine's ``HostConfig`` admission seams for one visit — ``admit``, ``defer``,
    ``check_person``, ``admit_person`` — each asking ``door`` and raising
    :class:`HandshakeError` for a :class:`Refused` (``defer`` answers True/False)."""

    def ask(request: Request) -> None:
        verdict = door.admit(request)
        if isinstance(verdict, Refused):
            raise HandshakeError(verdict.code, verdict.message)

    def admit(_key: str, profile: dict[str, Any]) -> bool:
        ask(Init(visit, profile))
        return True

    def defer(_key: str, profile: dict[str, Any], code: str) -> bool:
        return isinstance(door.admit(Deferral(visit, profile, code)), Admitted)

    return {"admit": admit, "defer": defer,
            "check_person": lambda person: ask(Chain(visit, person)),
            "admit_person": lambda person, revocation, deferred: ask(Ready(visit, person, revocation, deferred))}


__all__ = ["Admitted", "Arrival", "Chain", "DEFERRABLE_CODES", "Deferral", "Doorkeeper", "Init", "Ready",
           "Refused", "Request", "Sealed", "Verdict", "Visit", "admission", "admits", "engine_seams", "judge_init"]
