"""The session state machine: handshake (DESIGN §6) and business loop (DESIGN §7). No I/O.

Feed it bytes with :meth:`SessionEngine.receive_data` / :meth:`receive_eof`, give it the
messages your hooks produce with :meth:`send_message`, and write whatever
:meth:`data_to_send` returns to the stream. It returns :class:`Event` objects telling the
driver what happened. Time, randomness and signing come in as arguments, so the same
engine runs over the memory pipe and over iroh (``node.driver`` pumps it).

Order on every incoming frame: line framing → JSON decode → system/business split →
action declared for the sender's direction → jsonschema → state/turn rules → event for
the hook. Outgoing business messages are validated the same way for our direction, then
passed through ``egress_check``.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from node.errors import (
    EgressRefused,
    HandshakeError,
    HookError,
    KithError,
    ProtocolViolation,
    SigningError,
)
from node.engine import frames as F
from node.engine.framing import LineFramer, decode_frame, encode_frame
from node.signing import (
    NONCE_HEX_LEN,
    PUBLIC_KEY_HEX_LEN,
    SIGNATURE_HEX_LEN,
    check_hex,
    role_message,
    session_id_of,
    session_payload,
    verify,
)

# Fatal framing problems: the stream cannot be resynchronised.
_FATAL = frozenset({"frame-too-large", "frame-truncated"})


class State(enum.Enum):
    """Where a session is."""

    HANDSHAKE = "handshake"
    AWAIT_CONFIRM = "await-confirm"  # guest: proof verified, waiting for the driver
    READY = "ready"
    CLOSED = "closed"


# ---------------------------------------------------------------- events
@dataclass(frozen=True)
class Event:
    """Base class of everything the engine reports."""


@dataclass(frozen=True)
class ProofVerified(Event):
    """Guest only: the host's proof verified and the guest signed. The driver may submit
    ``proof`` (every field of ``POST /api/v1/sessions``, both signatures) to the community
    server, then must call :meth:`SessionEngine.confirm_ready`.
    """

    proof: dict[str, Any]


@dataclass(frozen=True)
class SessionReady(Event):
    """The handshake completed; business messages may flow."""

    session_id: str
    peer_public_key: str
    peer_profile: dict[str, Any]
    peer_capabilities: list[str]
    proof: dict[str, Any]


@dataclass(frozen=True)
class MessageReceived(Event):
    """A valid business message from the peer, ready for ``on_message``."""

    message: dict[str, Any]
    terminal: bool


@dataclass(frozen=True)
class MessageRefused(Event):
    """An invalid incoming message was refused before hooks (answered with ``_error``)."""

    code: str
    message: str


@dataclass(frozen=True)
class RemoteError(Event):
    """The peer sent ``_error``."""

    code: str
    message: str


@dataclass(frozen=True)
class SessionClosed(Event):
    """The session ended. ``reason``: ``completed`` (a terminal message), ``rejected``
    (handshake refused by either side), ``aborted`` (limits/invalid input/local abort),
    ``peer-disconnected`` (EOF without a terminal message). ``code`` is the stable code."""

    reason: str
    code: str | None = None
    message: str = ""


# ---------------------------------------------------------------- config
@dataclass
class HostConfig:
    """What the host needs to judge a ``_session_init``.

    Attributes:
        remote_id: the QUIC-authenticated peer id (``Connection.remote_id()``), 64 hex.
        post_protocol: ``post_id`` → the protocol_id of that live post, or None.
        nonce_unseen: records a guest nonce and returns False if it was seen before.
        admit: ``(guest_key, profile)`` → True if the peer may open a session.
    """

    remote_id: str
    post_protocol: Callable[[str], str | None]
    nonce_unseen: Callable[[str], bool]
    admit: Callable[[str, dict[str, Any]], bool] = lambda key, profile: True


@dataclass
class GuestConfig:
    """What the guest sends and expects.

    Attributes:
        remote_id: the QUIC-authenticated host id, 64 hex.
        post_id: the invitation's post id.
        host_public_key: the invitation's host key (must equal ``remote_id``).
        profile: shared profile fields sent in ``_session_init``.
        capabilities: e.g. ``["p2p_ui_v1"]``.
    """

    remote_id: str
    post_id: str
    host_public_key: str
    profile: dict[str, Any] = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=list)


class SessionEngine:
    """One side of one session.

    Args:
        role: ``"guest"`` or ``"host"``.
        spec: the loaded :class:`node.spec.ProtocolSpec`.
        public_key: our identity public key (64 hex).
        sign: signs bytes with our identity, returning 128 hex.
        host / guest: the role's :class:`HostConfig` / :class:`GuestConfig`.
        random_bytes: source of randomness (default ``os.urandom``).
        egress_check: called with each outgoing business frame's bytes; raises
            :class:`node.errors.EgressRefused` to refuse it.
    """

    def __init__(self, role: str, spec: Any, *, public_key: str, sign: Callable[[bytes], str],
                 host: HostConfig | None = None, guest: GuestConfig | None = None,
                 random_bytes: Callable[[int], bytes] = os.urandom,
                 egress_check: Callable[[bytes], None] | None = None) -> None:
        if role not in ("guest", "host"):
            raise ValueError("role must be 'guest' or 'host'")
        if (role == "host") != (host is not None) or (role == "guest") != (guest is not None):
            raise ValueError("give HostConfig for a host and GuestConfig for a guest")
        self.role = role
        self.peer_role = "host" if role == "guest" else "guest"
        self.spec = spec
        self.public_key = public_key
        self._sign = sign
        self._host = host
        self._guest = guest
        self._random = random_bytes
        self._egress_check = egress_check
        self._framer = LineFramer(spec.limits.max_message_bytes)
        self._out = bytearray()
        self.state = State.HANDSHAKE
        self.session_id: str | None = None
        self.peer_public_key: str | None = None
        self.peer_profile: dict[str, Any] = {}
        self._payload_fields: dict[str, str] = {}
        self._payload: bytes | None = None
        self._proof: dict[str, Any] = {}
        self._saw_first = False
        self._invalid = 0
        self._messages = 0
        self._awaiting: str | None = None  # role whose reply is due (turn rules)
        self._capabilities: list[str] = []
        self.close_event: SessionClosed | None = None

    # ------------------------------------------------------------ public API
    def initiate(self) -> None:
        """Guest: queue ``_session_init``. Call once, before any data is received."""
        assert self._guest is not None
        g = self._guest
        nonce = self._random(32).hex()
        self._payload_fields = {"post_id": g.post_id, "guest_nonce": nonce}
        self._queue(F.SessionInit(post_id=g.post_id, protocol_id=self.spec.protocol_id,
                                  guest_public_key=self.public_key, guest_nonce=nonce,
                                  capabilities=list(g.capabilities), profile=dict(g.profile)))

    def data_to_send(self) -> bytes:
        """Return and clear the bytes queued for the peer."""
        data = bytes(self._out)
        self._out.clear()
        return data

    @property
    def closed(self) -> bool:
        """True once the session ended (the driver then sends EOF and closes)."""
        return self.state is State.CLOSED

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the peer; return what happened, in order."""
        events: list[Event] = []
        if self.closed:
            return events
        try:
            lines = self._framer.feed(data)
        except ProtocolViolation as exc:
            return self._fail(exc)
        for line in lines:
            if self.closed:
                break
            events.extend(self._receive_line(line))
        return events

    def receive_eof(self) -> list[Event]:
        """The peer closed its sending side (or the connection dropped)."""
        if self.closed:
            return []
        try:
            self._framer.eof()
        except ProtocolViolation as exc:
            return self._fail(exc)
        if self.state is State.READY:
            return self._close("peer-disconnected", "peer-disconnected")
        return self._close("peer-disconnected", "peer-disconnected",
                           "the peer closed the connection during the handshake")

    def confirm_ready(self) -> list[Event]:
        """Guest: after :class:`ProofVerified`, send ``_session_ready`` with our signature."""
        assert self._guest is not None and self.state is State.AWAIT_CONFIRM
        assert self._payload is not None and self.session_id is not None
        self._queue(F.SessionReady(session_id=self.session_id, guest_signature=self._proof["guest_signature"]))
        self.state = State.READY
        return [SessionReady(self.session_id, self.peer_public_key or "", dict(self.peer_profile), [],
                             dict(self._proof))]

    def send_message(self, message: dict[str, Any]) -> list[Event]:
        """Validate one business message produced by our hooks and queue it.

        Returns ``[SessionClosed("completed")]`` when the message is terminal.

        Raises:
            HookError: ``hook-output-invalid`` (not a dict, undeclared action, wrong
                direction, schema, turn rules, size).
            EgressRefused: from ``egress_check``.
            ProtocolViolation: ``session-closed`` / ``message-before-ready``.
        """
        if self.closed:
            raise ProtocolViolation("session-closed")
        if self.state is not State.READY:
            raise ProtocolViolation("message-before-ready")
        try:
            terminal = self._check_business(message, sender=self.role)
        except ProtocolViolation as exc:
            raise HookError("hook-output-invalid", f"our {message.get('action') if isinstance(message, dict) else '?'!r} "
                                                   f"message was refused: {exc.message}") from None
        data = encode_frame(message)
        if len(data) - 1 > self.spec.limits.max_message_bytes:
            raise HookError("hook-output-invalid", "our message is larger than max_message_bytes")
        if self._egress_check is not None:
            self._egress_check(data)
        self._out += data
        self._messages += 1
        self._advance_turn(self.role, terminal)
        if terminal:
            return self._close("completed", None)
        return self._check_message_limit()

    def finish(self) -> list[Event]:
        """End the session cleanly from our side without a terminal message (a hook
        reported ``completed``); the driver then sends EOF."""
        if self.closed:
            return []
        return self._close("completed", None)

    def abort(self, code: str, message: str | None = None) -> list[Event]:
        """End the session now, telling the peer ``code`` (``_session_reject`` during the
        handshake, ``_error`` after it)."""
        if self.closed:
            return []
        exc = KithError(code, message)
        return self._fail(exc)

    # ------------------------------------------------------------ internals
    def _queue(self, frame: F.SystemFrame) -> None:
        self._out += encode_frame(F.to_dict(frame))

    def _close(self, reason: str, code: str | None, message: str = "") -> list[Event]:
        self.state = State.CLOSED
        ev = SessionClosed(reason, code, message)
        self.close_event = ev
        return [ev]

    def _fail(self, exc: KithError) -> list[Event]:
        """Fatal: tell the peer, then close."""
        if self.state in (State.HANDSHAKE, State.AWAIT_CONFIRM):
            self._queue(F.SessionReject(code=exc.code, message=exc.message))
            return self._close("rejected", exc.code, exc.message)
        self._queue(F.Error(code=exc.code, message=exc.message))
        return self._close("aborted", exc.code, exc.message)

    def _receive_line(self, line: bytes) -> list[Event]:
        try:
            obj = decode_frame(line)
        except ProtocolViolation as exc:
            return self._invalid_input(exc)
        action = obj["action"]
        if self.state is not State.READY:
            return self._handshake_frame(obj)
        if action.startswith("_"):
            return self._system_frame_when_ready(obj)
        try:
            terminal = self._check_business(obj, sender=self.peer_role)
        except ProtocolViolation as exc:
            return self._invalid_input(exc)
        self._messages += 1
        self._advance_turn(self.peer_role, terminal)
        events: list[Event] = [MessageReceived(obj, terminal)]
        if terminal:
            events.extend(self._close("completed", None))
        else:
            events.extend(self._check_message_limit())
        return events

    def _invalid_input(self, exc: ProtocolViolation) -> list[Event]:
        if self.state is not State.READY or exc.code in _FATAL:
            return self._fail(exc)
        self._invalid += 1
        if self._invalid > self.spec.limits.max_invalid:
            return self._fail(ProtocolViolation("too-many-invalid"))
        self._queue(F.Error(code=exc.code, message=exc.message))
        return [MessageRefused(exc.code, exc.message)]

    def _check_message_limit(self) -> list[Event]:
        if self._messages >= self.spec.limits.max_messages and not self.closed:
            return self._fail(ProtocolViolation("message-limit-exceeded"))
        return []

    def _check_business(self, msg: Any, *, sender: str) -> bool:
        if not isinstance(msg, dict) or not isinstance(msg.get("action"), str):
            raise ProtocolViolation("frame-missing-action")
        action = msg["action"]
        if action.startswith("_"):
            raise ProtocolViolation("message-unexpected-system-frame")
        mspec = self.spec.messages.get(action)
        if mspec is None:
            raise ProtocolViolation("message-undeclared-action", "the action is not declared by the protocol")
        if not mspec.allowed_from(sender):
            raise ProtocolViolation("message-wrong-direction",
                                    f"{action!r} may not be sent by the {sender}")
        err = next(iter(mspec.validator.iter_errors(msg)), None)
        if err is not None:
            where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
            raise ProtocolViolation("message-schema-invalid",
                                    f"{action!r} does not match its schema at {where} ({err.validator})")
        if not mspec.terminal and self.spec.flow_mode != "free":
            if self._awaiting is None and sender != self.spec.first:
                raise ProtocolViolation("message-out-of-turn", f"the {sender} may not send {action!r} now")
            if self._awaiting is not None and self._awaiting != sender:
                raise ProtocolViolation("message-out-of-turn", f"the {sender} must wait for a reply")
        return mspec.terminal

    def _advance_turn(self, sender: str, terminal: bool) -> None:
        if terminal or self.spec.flow_mode == "free":
            return
        other = "host" if sender == "guest" else "guest"
        self._awaiting = other if self._awaiting is None else None

    def _system_frame_when_ready(self, obj: dict[str, Any]) -> list[Event]:
        action = obj["action"]
        if action in ("_ping", "_pong", "_error"):
            try:
                frame = F.decode_system(obj)
            except ProtocolViolation as exc:
                return self._invalid_input(exc)
            if isinstance(frame, F.Ping):
                self._queue(F.Pong(t=frame.t))
                return []
            if isinstance(frame, F.Error):
                return [RemoteError(frame.code[:64], frame.message[:500])]
            return []
        return self._invalid_input(ProtocolViolation("message-unexpected-system-frame"))

    # ------------------------------------------------------------ handshake
    def _handshake_frame(self, obj: dict[str, Any]) -> list[Event]:
        first = not self._saw_first
        self._saw_first = True
        action = obj["action"]
        if not action.startswith("_"):
            if first and self.role == "host":
                return self._fail(HandshakeError("handshake-first-frame"))
            return self._fail(ProtocolViolation("message-before-ready"))
        try:
            frame = F.decode_system(obj)
        except ProtocolViolation as exc:
            if first and self.role == "host" and action != "_session_init":
                return self._fail(HandshakeError("handshake-first-frame"))
            return self._fail(HandshakeError("handshake-malformed", exc.message))
        if isinstance(frame, F.SessionReject):
            return self._close("rejected", frame.code[:64], frame.message[:500])
        if isinstance(frame, (F.Ping, F.Pong)) and not first:
            if isinstance(frame, F.Ping):
                self._queue(F.Pong(t=frame.t))
            return []
        try:
            if self.role == "host":
                return self._host_handshake(frame, first)
            return self._guest_handshake(frame)
        except SigningError as exc:
            # strict-hex failures name their field: a nonce → bad-nonce, a signature →
            # bad-signature, a key or id → malformed (DESIGN §6 stable codes)
            if exc.code != "bad-hex":
                code = "handshake-malformed"
            elif "nonce" in exc.message:
                code = "handshake-bad-nonce"
            elif "signature" in exc.message:
                code = "handshake-bad-signature"
            else:
                code = "handshake-malformed"
            return self._fail(HandshakeError(code, exc.message))
        except HandshakeError as exc:
            return self._fail(exc)

    def _host_handshake(self, frame: F.SystemFrame, first: bool) -> list[Event]:
        h = self._host
        assert h is not None
        if first:
            if not isinstance(frame, F.SessionInit):
                raise HandshakeError("handshake-first-frame")
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
            if not h.admit(frame.guest_public_key, frame.profile):
                raise HandshakeError("handshake-not-admitted")
            host_nonce = self._random(32).hex()
            if host_nonce == frame.guest_nonce:  # pragma: no cover - 2^-256
                raise HandshakeError("handshake-nonce-reused")
            self._payload = session_payload(
                post_id=frame.post_id, protocol_id=self.spec.protocol_id,
                host_public_key=self.public_key, guest_public_key=frame.guest_public_key,
                guest_nonce=frame.guest_nonce, host_nonce=host_nonce)
            self.session_id = session_id_of(self._payload)
            self.peer_public_key = frame.guest_public_key
            self.peer_profile = dict(frame.profile)
            self._capabilities = list(frame.capabilities)
            sig = self._sign(role_message("host", self._payload))
            self._proof = {"session_id": self.session_id, "post_id": frame.post_id,
                           "protocol_id": self.spec.protocol_id, "host_public_key": self.public_key,
                           "guest_public_key": frame.guest_public_key, "guest_nonce": frame.guest_nonce,
                           "host_nonce": host_nonce, "host_signature": sig}
            self._queue(F.SessionProof(session_id=self.session_id, host_public_key=self.public_key,
                                       host_nonce=host_nonce, host_signature=sig))
            return []
        if not isinstance(frame, F.SessionReady):
            raise HandshakeError("handshake-unexpected-frame", f"expected _session_ready, got {frame.__struct_config__.tag}")
        if frame.session_id != self.session_id:
            raise HandshakeError("handshake-session-mismatch")
        assert self._payload is not None and self.peer_public_key is not None
        check_hex(frame.guest_signature, SIGNATURE_HEX_LEN, "guest_signature")
        try:
            verify(self.peer_public_key, role_message("guest", self._payload), frame.guest_signature,
                   field="guest_signature")
        except SigningError:
            raise HandshakeError("handshake-bad-signature", "the guest signature does not verify") from None
        self._proof["guest_signature"] = frame.guest_signature
        self.state = State.READY
        return [SessionReady(self.session_id, self.peer_public_key, dict(self.peer_profile),
                             list(self._capabilities), dict(self._proof))]

    def _guest_handshake(self, frame: F.SystemFrame) -> list[Event]:
        g = self._guest
        assert g is not None
        if self.state is not State.HANDSHAKE or not isinstance(frame, F.SessionProof):
            raise HandshakeError("handshake-unexpected-frame",
                                 f"expected _session_proof, got {frame.__struct_config__.tag}")
        check_hex(frame.host_public_key, PUBLIC_KEY_HEX_LEN, "host_public_key")
        if not (frame.host_public_key == g.host_public_key == g.remote_id):
            raise HandshakeError("handshake-key-mismatch",
                                 "the host key differs from the invitation's key or the QUIC remote id")
        check_hex(frame.host_nonce, NONCE_HEX_LEN, "host_nonce")
        if frame.host_nonce == self._payload_fields["guest_nonce"]:
            raise HandshakeError("handshake-nonce-reused", "the host echoed our nonce")
        payload = session_payload(
            post_id=g.post_id, protocol_id=self.spec.protocol_id, host_public_key=frame.host_public_key,
            guest_public_key=self.public_key, guest_nonce=self._payload_fields["guest_nonce"],
            host_nonce=frame.host_nonce)
        sid = session_id_of(payload)
        if frame.session_id != sid:
            raise HandshakeError("handshake-session-mismatch")
        check_hex(frame.host_signature, SIGNATURE_HEX_LEN, "host_signature")
        try:
            verify(frame.host_public_key, role_message("host", payload), frame.host_signature,
                   field="host_signature")
        except SigningError:
            raise HandshakeError("handshake-bad-signature", "the host signature does not verify") from None
        self._payload = payload
        self.session_id = sid
        self.peer_public_key = frame.host_public_key
        self._proof = {"session_id": sid, "post_id": g.post_id, "protocol_id": self.spec.protocol_id,
                       "host_public_key": frame.host_public_key, "guest_public_key": self.public_key,
                       "guest_nonce": self._payload_fields["guest_nonce"], "host_nonce": frame.host_nonce,
                       "host_signature": frame.host_signature,
                       "guest_signature": self._sign(role_message("guest", payload))}
        self.state = State.AWAIT_CONFIRM
        return [ProofVerified(dict(self._proof))]


__all__ = [
    "EgressRefused", "Event", "GuestConfig", "HostConfig", "MessageReceived", "MessageRefused",
    "ProofVerified", "RemoteError", "SessionClosed", "SessionEngine", "SessionReady", "State",
]
