"""The two handshakes (DESIGN §6) as step functions: one frame in, events out. No I/O.

:class:`HostHandshake` judges ``_session_init`` and sends ``_session_proof``, then
verifies ``_session_ready``; :class:`GuestHandshake` sends ``_session_init``, verifies
``_session_proof`` and signs. Both build the same session payload
(:func:`node.trust.signing.session_payload`) and proof. A refusal is raised as
:class:`node.common.errors.HandshakeError` with its stable code (the engine sends
``_session_reject`` and closes); :func:`signing_refusal` maps strict-hex failures to
theirs. The optional UI branch between proof and ready is :mod:`node.engine.ui_branch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from node.common.errors import HandshakeError, KithError, SigningError
from node.engine import frames as F
from node.engine import ui as UI
from node.engine.events import Event, ProofVerified, SessionReady
from node.engine.ui_branch import GuestUiBranch, HostUiBranch
from node.trust.binding import PersonIdentity, verify_chain
from node.trust.revocation_list import RevocationList, check_list
from node.trust.signing import (
    NONCE_HEX_LEN,
    PUBLIC_KEY_HEX_LEN,
    SIGNATURE_HEX_LEN,
    check_hex,
    role_message,
    session_id_of,
    session_payload,
    verify,
)

if TYPE_CHECKING:
    from node.protocol.spec import ProtocolSpec

#: The capability a guest with a binding chain advertises in ``_session_init``; a host that
#: knows it answers with ``frames_version`` :data:`FRAMES_V2` in ``_session_proof``, and only
#: then may ``_session_ready`` carry ``binding_chain`` (specs/session.md §4).
PERSON_CAPABILITY = "person_chain_v1"
FRAMES_V2 = 2
#: The capability a guest that takes device cards advertises; only then does
#: ``_session_proof`` carry ``device_card`` (specs/session.md §4.2, specs/peers.md §13).
CARD_CAPABILITY = "device_card_v1"
#: The capability a guest that reads card format 2 (``mailboxes``, specs/sealed.md §6)
#: advertises beside :data:`CARD_CAPABILITY`; a guest advertising ``device_card_v1`` alone
#: (an older one) is sent the host's format-1 card of the same ``seq`` instead.
CARD_V2_CAPABILITY = "device_card_v2"
#: The capability a guest that keeps copies advertises; only then does ``_session_proof``
#: carry ``copy_state`` (specs/session.md §4.2, specs/copies.md §5).
COPY_CAPABILITY = "copy_state_v1"


@dataclass
class HostConfig:
    """What the host needs to judge a ``_session_init``.

    Attributes:
        remote_id: the QUIC-authenticated peer id (``Connection.remote_id()``), 64 hex.
        post_protocol: ``post_id`` → the protocol_id of that live post, or None.
        nonce_unseen: records a guest nonce and returns False if it was seen before.
        admit: ``(guest_key, profile)`` → True if the peer may open a session (False →
            ``handshake-not-admitted``; it may raise :class:`HandshakeError` itself for a
            more precise code).
        profile: the host's shared profile, sent in ``_session_proof`` (omitted if empty).
        ui_bundle: the protocol's UI bundle when the host runs with ``--share-ui``
            (offered only to guests advertising ``p2p_ui_v1``), else None.
        named_post: called with the ``post_id`` of a decoded ``_session_init`` before any
            check of it, so the host can count a handshake that names its post and then
            fails (the failed-handshake cap, specs/session.md).
        check_person: called with the verified chain's
            :class:`node.trust.binding.PersonIdentity` before the session is ready; it may
            raise :class:`HandshakeError` (a rotation the host's ledger refuses,
            ``handshake-rotation-revoked-key`` / ``handshake-person-key-retired``,
            node/trust/rotation.py).
        defer: ``(guest_key, profile, code)`` → True to let a guest that advertised
            ``person_chain_v1`` go on although ``admit`` refused it with ``code``
            (``handshake-not-admitted`` or ``peer-key-changed``): its person decides at
            ``_session_ready`` (``admit_person`` gets the code back). Default: never.
        admit_person: ``(person, revocation, deferred)`` → None, called at ``_session_ready``
            once the chain (:class:`node.trust.binding.PersonIdentity` or None) and the
            revocation list (:class:`node.trust.revocation_list.RevocationList` or None)
            verified, before the session is ready; ``deferred`` is the code ``defer``
            accepted, or None. It raises :class:`HandshakeError` to refuse (e.g.
            ``handshake-device-revoked``, specs/peers.md §10).
        card: ``()`` → this hosting device's card (specs/peers.md §13) or None, sent in
            ``_session_proof`` to a guest that advertised ``device_card_v1`` and
            ``device_card_v2``.
        card_v1: ``()`` → the same card in format 1 (no ``mailboxes``, same ``seq``;
            specs/sealed.md §6) or None, sent to a guest that advertised ``device_card_v1``
            only; None (the default): ``card`` is sent to it too.
        copy_state: ``(person_capable)`` → the copy grant state for this guest
            (``{"granted": bool, "stamp": str, "until": str | None}``, specs/copies.md §5) or
            None when the host cannot tell yet (``person_capable``: the guest advertised
            ``person_chain_v1``, so its person may only be known at ``_session_ready``);
            called after admission, sent in ``_session_proof`` only to a guest that
            advertised ``copy_state_v1``.
    """

    remote_id: str
    post_protocol: Callable[[str], str | None]
    nonce_unseen: Callable[[str], bool]
    admit: Callable[[str, dict[str, Any]], bool] = lambda key, profile: True
    named_post: Callable[[str], None] = lambda post_id: None
    check_person: Callable[[Any], None] = lambda person: None
    ui_bundle: UI.Bundle | None = None
    profile: dict[str, Any] = field(default_factory=dict)
    defer: Callable[[str, dict[str, Any], str], bool] = lambda key, profile, code: False
    admit_person: Callable[[PersonIdentity | None, RevocationList | None, str | None], None] = \
        lambda person, revocation, deferred: None
    card: Callable[[], dict[str, Any] | None] = lambda: None
    card_v1: Callable[[], dict[str, Any] | None] | None = None
    copy_state: Callable[[bool], dict[str, Any] | None] = lambda person_capable: None


@dataclass
class GuestConfig:
    """What the guest sends and expects.

    Attributes:
        remote_id: the QUIC-authenticated host id, 64 hex.
        post_id: the invitation's post id.
        host_public_key: the invitation's host key (must equal ``remote_id``).
        profile: shared profile fields sent in ``_session_init``.
        capabilities: e.g. ``["p2p_ui_v1"]`` (``--accept-host-ui``).
        want_ui: request the host's UI when it offers one (``p2p_ui_v1`` advertised and no
            local UI for the protocol). Without it no transfer ever happens.
        admit_host: ``(host_key, host_profile)`` → True to go on once the proof verified;
            it may raise :class:`HandshakeError` (e.g. ``host-key-changed``); False →
            ``handshake-not-admitted``.
        binding_chain: this device's binding chain (:mod:`node.trust.binding`), or None.
            When set, ``person_chain_v1`` is advertised and the chain is sent in
            ``_session_ready`` to a host that answered with system frames v2; an old host
            gets the v1 handshake (device-key-only identity).
        revocation_list: the newest revocation list of this device's person (wire shape,
            :mod:`node.trust.revocation_list`), or None; sent beside ``binding_chain`` only.
        want_card: advertise ``device_card_v1``: the host's device card comes back in
            ``_session_proof`` (unchecked here; :attr:`SessionReady.peer_card`).
        want_copy_state: advertise ``copy_state_v1``: the host's copy grant state for this
            guest comes back in ``_session_proof`` (unchecked here;
            :attr:`SessionReady.peer_copy_state`).
    """

    remote_id: str
    post_id: str
    host_public_key: str
    profile: dict[str, Any] = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=list)
    want_ui: bool = False
    admit_host: Callable[[str, dict[str, Any]], bool] = lambda key, profile: True
    binding_chain: list[dict[str, Any]] | None = None
    revocation_list: dict[str, Any] | None = None
    want_card: bool = False
    want_copy_state: bool = False


def signing_refusal(exc: SigningError) -> HandshakeError:
    """The handshake code of a strict-hex/signature failure: a nonce → ``handshake-bad-nonce``,
    a signature → ``handshake-bad-signature``, a key or id → ``handshake-malformed``
    (DESIGN §6 stable codes)."""
    if exc.code != "bad-hex":
        code = "handshake-malformed"
    elif "nonce" in exc.message:
        code = "handshake-bad-nonce"
    elif "signature" in exc.message:
        code = "handshake-bad-signature"
    else:
        code = "handshake-malformed"
    return HandshakeError(code, exc.message)


class _Handshake:
    """What both handshakes learn: the session id, the peer, the payload and the proof.

    Args:
        spec: the loaded protocol spec. public_key: ours (64 hex). sign: signs bytes with
            our identity (128 hex). random_bytes: randomness source (nonces).
        queue: queues one system frame for the peer.
    """

    def __init__(self, spec: "ProtocolSpec", public_key: str, sign: Callable[[bytes], str],
                 random_bytes: Callable[[int], bytes], queue: Callable[[F.SystemFrame], None]) -> None:
        self.spec = spec
        self.public_key = public_key
        self._sign = sign
        self._random = random_bytes
        self._queue = queue
        self.session_id: str | None = None
        self.peer_public_key: str | None = None
        self.peer_profile: dict[str, Any] = {}
        self.capabilities: list[str] = []
        self.payload: bytes | None = None
        self.proof: dict[str, Any] = {}


class HostHandshake(_Handshake):
    """The host's steps: ``_session_init`` → ``_session_proof`` (→ UI branch) →
    ``_session_ready``. :attr:`ready` turns True when the guest's signature verified."""

    def __init__(self, config: HostConfig, ui: HostUiBranch, **kw: Any) -> None:
        super().__init__(**kw)
        self.config = config
        self.ui = ui
        self.ready = False
        self.frames_version: int | None = None  # FRAMES_V2 once offered in our proof
        self.deferred: str | None = None  # the admission code deferred to _session_ready

    def step(self, frame: F.SystemFrame, first: bool) -> list[Event]:
        """Judge one system frame from the guest (``first``: the session's first frame).

        Returns:
            ``[SessionReady]`` when the handshake completed, UI events, or nothing.

        Raises:
            HandshakeError: any ``handshake-*`` refusal (or ``ui-*`` through the UI branch).
            SigningError: a field that is not strict hex (see :func:`signing_refusal`).
        """
        if first:
            return self._init(frame)
        if isinstance(frame, F.UiArtifactRequest):
            return self.ui.on_request()
        if isinstance(frame, (F.UiArtifactAck, F.UiArtifactError)):
            return self.ui.on_answer(frame)
        if self.ui.awaiting_answer:
            raise HandshakeError("handshake-unexpected-frame", "expected _ui_artifact_ack or _ui_artifact_error")
        if not isinstance(frame, F.SessionReady):
            raise HandshakeError("handshake-unexpected-frame", f"expected _session_ready, got {frame.__struct_config__.tag}")
        return self._ready(frame)

    def _init(self, frame: F.SystemFrame) -> list[Event]:
        h = self.config
        if not isinstance(frame, F.SessionInit):
            raise HandshakeError("handshake-first-frame")
        h.named_post(frame.post_id)
        check_hex(frame.guest_public_key, PUBLIC_KEY_HEX_LEN, "guest_public_key")
        if frame.guest_public_key != h.remote_id:
            raise HandshakeError("handshake-key-mismatch")
        check_hex(frame.guest_nonce, NONCE_HEX_LEN, "guest_nonce")
        live_protocol = h.post_protocol(frame.post_id)
        if live_protocol is None:
            raise HandshakeError("handshake-unknown-post")
        if frame.protocol_id != live_protocol or frame.protocol_id != self.spec.protocol_id:
            raise HandshakeError("handshake-protocol-mismatch")
        if not h.nonce_unseen(frame.guest_nonce):
            raise HandshakeError("handshake-nonce-reused")
        self._admit(frame)
        host_nonce = self._random(32).hex()
        if host_nonce == frame.guest_nonce:  # pragma: no cover - 2^-256
            raise HandshakeError("handshake-nonce-reused")
        self.payload = session_payload(
            post_id=frame.post_id, protocol_id=self.spec.protocol_id,
            host_public_key=self.public_key, guest_public_key=frame.guest_public_key,
            guest_nonce=frame.guest_nonce, host_nonce=host_nonce)
        self.session_id = session_id_of(self.payload)
        self.peer_public_key = frame.guest_public_key
        self.peer_profile = dict(frame.profile)
        self.capabilities = list(frame.capabilities)
        sig = self._sign(role_message("host", self.payload))
        self.proof = {"session_id": self.session_id, "post_id": frame.post_id,
                      "protocol_id": self.spec.protocol_id, "host_public_key": self.public_key,
                      "guest_public_key": frame.guest_public_key, "guest_nonce": frame.guest_nonce,
                      "host_nonce": host_nonce, "host_signature": sig}
        self.ui.bundle = h.ui_bundle
        offer = self.ui.offer(self.capabilities)
        self.frames_version = FRAMES_V2 if PERSON_CAPABILITY in self.capabilities else None
        card = None
        if CARD_CAPABILITY in self.capabilities:  # an older guest reads format 1 only (specs/sealed.md §6)
            card = h.card() if CARD_V2_CAPABILITY in self.capabilities or h.card_v1 is None else h.card_v1()
        copy_state = (h.copy_state(PERSON_CAPABILITY in self.capabilities)
                      if COPY_CAPABILITY in self.capabilities else None)
        self._queue(F.SessionProof(session_id=self.session_id, host_public_key=self.public_key,
                                   host_nonce=host_nonce, host_signature=sig, ui_offer=offer,
                                   profile=dict(h.profile), frames_version=self.frames_version,
                                   device_card=card, copy_state=copy_state))
        return []

    def _admit(self, frame: F.SessionInit) -> None:
        """``admit``, or — for a guest that advertised ``person_chain_v1`` and whose refusal
        ``defer`` accepts — its decision kept for ``_session_ready`` (:attr:`deferred`)."""
        h = self.config
        capable = PERSON_CAPABILITY in frame.capabilities
        try:
            if h.admit(frame.guest_public_key, frame.profile):
                return
            code = "handshake-not-admitted"
        except HandshakeError as exc:
            if not capable or not h.defer(frame.guest_public_key, frame.profile, exc.code):
                raise
            self.deferred = exc.code
            return
        if not capable or not h.defer(frame.guest_public_key, frame.profile, code):
            raise HandshakeError(code)
        self.deferred = code

    def _ready(self, frame: F.SessionReady) -> list[Event]:
        if frame.session_id != self.session_id:
            raise HandshakeError("handshake-session-mismatch")
        assert self.payload is not None and self.peer_public_key is not None and self.session_id is not None
        check_hex(frame.guest_signature, SIGNATURE_HEX_LEN, "guest_signature")
        payload, key = self.payload, self.peer_public_key

        def session_signature() -> None:
            try:
                verify(key, role_message("guest", payload), frame.guest_signature, field="guest_signature")
            except SigningError:
                raise HandshakeError("handshake-bad-signature", "the guest signature does not verify") from None

        person = None
        if frame.binding_chain is None:
            session_signature()
        elif self.frames_version != FRAMES_V2:
            raise HandshakeError("handshake-malformed", "binding_chain is a system frames v2 field")
        else:  # the chain's length and shape first, then every signature (session.md §4.3)
            person = verify_chain(frame.binding_chain, key, before_signatures=session_signature)
            self.config.check_person(person)
        revocation = None
        if frame.revocation_list is not None:
            if person is None:
                raise HandshakeError("handshake-malformed", "revocation_list is sent only with binding_chain")
            try:
                revocation = check_list(frame.revocation_list, person=person.person)
            except KithError as exc:  # revocation-malformed / -wrong-person / -forged
                raise HandshakeError("handshake-" + exc.code, exc.message) from None
        self.config.admit_person(person, revocation, self.deferred)
        self.proof["guest_signature"] = frame.guest_signature
        self.ready = True
        return [SessionReady(self.session_id, self.peer_public_key, dict(self.peer_profile),
                             list(self.capabilities), dict(self.proof), person)]


class GuestHandshake(_Handshake):
    """The guest's steps: ``_session_init`` → verify ``_session_proof`` and sign (→ UI
    branch) → :class:`ProofVerified`; after the driver's confirmation, ``_session_ready``.
    :attr:`verified` turns True once the host's proof verified."""

    def __init__(self, config: GuestConfig, ui: GuestUiBranch, **kw: Any) -> None:
        super().__init__(**kw)
        self.config = config
        self.ui = ui
        self.verified = False
        self._nonce = ""
        self._advertised: list[str] = []
        self.host_frames_version: int | None = None  # FRAMES_V2 when the host's proof said so
        self.peer_card: Any = None  # the host's device card as sent (checked by the runtime)
        self.peer_copy_state: Any = None  # the host's copy grant state as sent (checked by the runtime)

    def initiate(self) -> None:
        """Queue ``_session_init`` with a fresh 32-byte nonce."""
        g = self.config
        self._nonce = self._random(32).hex()
        caps = list(g.capabilities)
        if g.binding_chain is not None and PERSON_CAPABILITY not in caps:
            caps.append(PERSON_CAPABILITY)
        if g.want_card:
            caps += [c for c in (CARD_CAPABILITY, CARD_V2_CAPABILITY) if c not in caps]
        if g.want_copy_state and COPY_CAPABILITY not in caps:
            caps.append(COPY_CAPABILITY)
        self._advertised = caps
        self._queue(F.SessionInit(post_id=g.post_id, protocol_id=self.spec.protocol_id,
                                  guest_public_key=self.public_key, guest_nonce=self._nonce,
                                  capabilities=caps, profile=dict(g.profile)))

    def step(self, frame: F.SystemFrame) -> list[Event]:
        """Judge one system frame from the host.

        Returns:
            ``[ProofVerified]`` (held back until a requested UI branch ends), UI events,
            or nothing.

        Raises:
            HandshakeError: any ``handshake-*`` refusal (or ``ui-*`` through the UI branch).
            SigningError: a field that is not strict hex (see :func:`signing_refusal`).
        """
        if isinstance(frame, (F.UiArtifactBegin, F.UiArtifactFile, F.UiArtifactEnd, F.UiArtifactError)):
            return self.ui.on_frame(frame)
        if self.verified or not isinstance(frame, F.SessionProof):
            raise HandshakeError("handshake-unexpected-frame",
                                 f"expected _session_proof, got {frame.__struct_config__.tag}")
        return self._proof(frame)

    def _proof(self, frame: F.SessionProof) -> list[Event]:
        g = self.config
        if frame.frames_version is not None and (frame.frames_version != FRAMES_V2
                                                 or PERSON_CAPABILITY not in self._advertised):
            raise HandshakeError("handshake-malformed", "frames_version was not offered")
        if frame.device_card is not None and CARD_CAPABILITY not in self._advertised:
            raise HandshakeError("handshake-malformed", "device_card was not asked for")
        if frame.copy_state is not None and COPY_CAPABILITY not in self._advertised:
            raise HandshakeError("handshake-malformed", "copy_state was not asked for")
        check_hex(frame.host_public_key, PUBLIC_KEY_HEX_LEN, "host_public_key")
        if not (frame.host_public_key == g.host_public_key == g.remote_id):
            raise HandshakeError("handshake-key-mismatch",
                                 "the host key differs from the invitation's key or the QUIC remote id")
        check_hex(frame.host_nonce, NONCE_HEX_LEN, "host_nonce")
        if frame.host_nonce == self._nonce:
            raise HandshakeError("handshake-nonce-reused", "the host echoed our nonce")
        payload = session_payload(
            post_id=g.post_id, protocol_id=self.spec.protocol_id, host_public_key=frame.host_public_key,
            guest_public_key=self.public_key, guest_nonce=self._nonce, host_nonce=frame.host_nonce)
        sid = session_id_of(payload)
        if frame.session_id != sid:
            raise HandshakeError("handshake-session-mismatch")
        check_hex(frame.host_signature, SIGNATURE_HEX_LEN, "host_signature")
        try:
            verify(frame.host_public_key, role_message("host", payload), frame.host_signature,
                   field="host_signature")
        except SigningError:
            raise HandshakeError("handshake-bad-signature", "the host signature does not verify") from None
        if not g.admit_host(frame.host_public_key, dict(frame.profile)):
            raise HandshakeError("handshake-not-admitted", "this guest does not accept the host")
        self.peer_profile = dict(frame.profile)
        self.payload = payload
        self.session_id = sid
        self.peer_public_key = frame.host_public_key
        self.host_frames_version = frame.frames_version
        self.peer_card = frame.device_card
        self.peer_copy_state = frame.copy_state
        self.proof = {"session_id": sid, "post_id": g.post_id, "protocol_id": self.spec.protocol_id,
                      "host_public_key": frame.host_public_key, "guest_public_key": self.public_key,
                      "guest_nonce": self._nonce, "host_nonce": frame.host_nonce,
                      "host_signature": frame.host_signature,
                      "guest_signature": self._sign(role_message("guest", payload))}
        self.verified = True
        verified: list[Event] = [ProofVerified(dict(self.proof))]
        if g.want_ui and UI.CAPABILITY in g.capabilities and isinstance(frame.ui_offer, dict):
            # the UI branch runs before _session_ready; ProofVerified waits for its end
            self.ui.ask(verified)
            return []
        return verified

    def ready_frame(self) -> tuple[F.SessionReady, SessionReady]:
        """After :class:`ProofVerified`: the ``_session_ready`` frame to send and the
        :class:`SessionReady` event to report."""
        assert self.verified and self.session_id is not None
        chain = self.config.binding_chain if self.host_frames_version == FRAMES_V2 else None
        revocation = self.config.revocation_list if chain is not None else None
        frame = F.SessionReady(session_id=self.session_id, guest_signature=self.proof["guest_signature"],
                               binding_chain=list(chain) if chain is not None else None,
                               revocation_list=dict(revocation) if revocation is not None else None)
        return frame, SessionReady(self.session_id, self.peer_public_key or "", dict(self.peer_profile), [],
                                   dict(self.proof), peer_card=self.peer_card,
                                   peer_copy_state=self.peer_copy_state)
