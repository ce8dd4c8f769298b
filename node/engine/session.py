"""The session state machine: handshake (DESIGN §6) and business loop (DESIGN §7). No I/O.

Feed it bytes with :meth:`SessionEngine.receive_data` / :meth:`receive_eof`, give it the
messages your hooks produce with :meth:`send_message`, and write whatever
:meth:`data_to_send` returns to the stream. It returns :class:`Event` objects telling the
driver what happened. Time, randomness and signing come in as arguments, so the same
engine runs over the memory pipe and over iroh (``node.runtime.driver`` pumps it).

Order on every incoming frame: line framing → JSON decode → system/business split →
action declared for the sender's direction → jsonschema → state/turn rules → event for
the hook. Outgoing business messages are validated the same way for our direction, then
passed through ``egress_check``.
"""

from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from node.common.errors import (
    CODES,
    EgressRefused,
    HandshakeError,
    HookError,
    KithError,
    ProtocolViolation,
    SigningError,
)
from node.engine import frames as F
from node.engine import ui as UI
from node.engine.framing import LineFramer, decode_frame, encode_frame
from node.engine.timers import PING, SessionTimers, Timeouts
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

_struct_encoder = msgspec.json.Encoder()

# Fatal framing problems: the stream cannot be resynchronised.
_FATAL = frozenset({"frame-too-large", "frame-truncated"})
# Host → guest UI transfer frames; malformed ones end only the UI branch while it runs.
_UI_DATA_ACTIONS = frozenset({"_ui_artifact_begin", "_ui_artifact_file", "_ui_artifact_end"})
_UI_RECEIVING = frozenset({"requested", "receiving", "draining"})


class State(enum.Enum):
    """Where a session is."""

    HANDSHAKE = "handshake"
    AWAIT_CONFIRM = "await-confirm"  # guest: proof verified, waiting for the driver
    READY = "ready"
    CLOSED = "closed"


def _peer_message(code: str) -> str:
    """What a peer is told about ``code``: the code's fixed message from CODES, never the
    local message (which may carry exception text, names or paths) — issue 5, rule 7."""
    return CODES.get(code, CODES["internal-error"])[1]


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
class UiArtifactReceived(Event):
    """Guest only: the Host's UI bundle arrived and verified (paths, sizes, SHA-256,
    ``index.html``); ``_ui_artifact_ack`` is queued. ``files``: path → bytes, in manifest
    order; the driver installs them (``node.runtime.ui_artifacts``). Never part of the session
    payload or proof."""

    files: dict[str, bytes]
    total_bytes: int


@dataclass(frozen=True)
class UiArtifactRefused(Event):
    """The UI branch failed; the handshake goes on without a UI. ``by`` is the side that
    refused (``guest``/``host``), ``code`` the stable ``ui-*`` code."""

    code: str
    message: str
    by: str


@dataclass(frozen=True)
class SessionClosed(Event):
    """The session ended. ``reason``: ``completed`` (a terminal message), ``rejected``
    (handshake refused by either side), ``aborted`` (limits/invalid input/local abort,
    including ``peer-unresponsive``, ``idle-timeout`` and ``handshake-timeout``),
    ``peer-disconnected`` (EOF without a terminal message), ``shutdown`` (we are shutting
    down: :meth:`SessionEngine.shutdown`). ``code`` is the stable code."""

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
        admit: ``(guest_key, profile)`` → True if the peer may open a session (False →
            ``handshake-not-admitted``; it may raise :class:`HandshakeError` itself for a
            more precise code).
        profile: the host's shared profile, sent in ``_session_proof`` (omitted if empty).
        ui_bundle: the protocol's UI bundle when the host runs with ``--share-ui``
            (offered only to guests advertising ``p2p_ui_v1``), else None.
        named_post: called with the ``post_id`` of a decoded ``_session_init`` before any
            check of it, so the host can count a handshake that names its post and then
            fails (the failed-handshake cap, specs/session.md).
    """

    remote_id: str
    post_protocol: Callable[[str], str | None]
    nonce_unseen: Callable[[str], bool]
    admit: Callable[[str, dict[str, Any]], bool] = lambda key, profile: True
    named_post: Callable[[str], None] = lambda post_id: None
    ui_bundle: UI.Bundle | None = None
    profile: dict[str, Any] = field(default_factory=dict)


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
    """

    remote_id: str
    post_id: str
    host_public_key: str
    profile: dict[str, Any] = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=list)
    want_ui: bool = False
    admit_host: Callable[[str, dict[str, Any]], bool] = lambda key, profile: True


class SessionEngine:
    """One side of one session.

    Args:
        role: ``"guest"`` or ``"host"``.
        spec: the loaded :class:`node.protocol.spec.ProtocolSpec`.
        public_key: our identity public key (64 hex).
        sign: signs bytes with our identity, returning 128 hex.
        host / guest: the role's :class:`HostConfig` / :class:`GuestConfig`.
        random_bytes: source of randomness (default ``os.urandom``).
        egress_check: called with each outgoing business frame's bytes; raises
            :class:`node.common.errors.EgressRefused` to refuse it.
        clock: monotonic time in seconds (time is an input: tests pass a fake clock).
        timeouts: the session bounds (:class:`node.engine.timers.Timeouts`); None = no
            timers until :meth:`set_timeouts` (the driver sets them).
    """

    def __init__(self, role: str, spec: Any, *, public_key: str, sign: Callable[[bytes], str],
                 host: HostConfig | None = None, guest: GuestConfig | None = None,
                 random_bytes: Callable[[int], bytes] = os.urandom,
                 egress_check: Callable[[bytes], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 timeouts: Timeouts | None = None) -> None:
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
        self._clock = clock
        self.timers = SessionTimers(timeouts or Timeouts(None, None, None, None), clock())
        # UI branch: host None|"offered"|"sent"|"done"; guest None|"requested"|"receiving"|"draining"|"done"
        self._ui_state: str | None = None
        self._ui_receiver: UI.BundleReceiver | None = None
        self._ui_offer: dict[str, Any] | None = None
        self._pending_proof: list[Event] = []
        self.ui_bytes_sent = 0

    # ------------------------------------------------------------ public API
    def set_timeouts(self, timeouts: Timeouts) -> None:
        """Apply session bounds; the current handshake step starts now."""
        now = self._clock()
        ready = self.timers.ready
        self.timers = SessionTimers(timeouts, now)
        if ready:
            self.timers.session_ready(now)

    def next_deadline(self) -> float | None:
        """The clock time at which :meth:`tick` may have something to do (None: never)."""
        if self.closed:
            return None
        return self.timers.next_deadline()

    def tick(self) -> list[Event]:
        """Apply the timers at the current clock time: queue a ``_ping`` when one is due,
        or end the session with ``handshake-timeout`` / ``peer-unresponsive`` /
        ``idle-timeout`` (DESIGN §3, §6, §7)."""
        if self.closed:
            return []
        now = self._clock()
        due = self.timers.due(now)
        if due is None:
            return []
        if due == PING:
            self.timers.ping_sent(now)
            self._queue(F.Ping(t=int(now * 1000)))
            return []
        return self._fail(KithError(due))

    def shutdown(self, code: str = "session-shutdown") -> list[Event]:
        """End the session because we are shutting down (SIGINT/SIGTERM).

        After the handshake, the protocol's terminal message for our role is sent when the
        protocol has one whose schema accepts ``{"action", "reason": "shutdown"}`` or the
        bare ``{"action"}`` (for knowledge-query: ``end``), so the peer sees a clean end;
        otherwise ``_error`` with ``code``. During the handshake: ``_session_reject``.
        The close event has reason ``shutdown`` and ``code``.
        """
        if self.closed:
            return []
        if self.state is State.READY:
            for action, m in self.spec.messages.items():
                if not (m.terminal and m.allowed_from(self.role)):
                    continue
                for cand in ({"action": action, "reason": "shutdown"}, {"action": action}):
                    if not m.validator.is_valid(cand):
                        continue
                    try:
                        self.send_message(cand)
                    except KithError:
                        continue
                    return self._close("shutdown", code, "the session ended because this node is shutting down")
        self._fail(KithError(code))
        return self._close("shutdown", code, "the session ended because this node is shutting down")

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
        if lines:
            self.timers.frame_received(self._clock())
        for line in lines:
            if self.closed:
                break
            if len(line) > self.spec.limits.max_message_bytes and self._ui_state not in ("requested", "receiving",
                                                                                          "draining"):
                events.extend(self._fail(ProtocolViolation(
                    "frame-too-large", f"a line is longer than {self.spec.limits.max_message_bytes} bytes")))
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

    @property
    def clock(self) -> Callable[[], float]:
        """The engine's clock (monotonic seconds); drivers schedule :meth:`tick` with it."""
        return self._clock

    def connection_lost(self) -> list[Event]:
        """The transport failed (reset, write to a gone peer): close as
        ``peer-disconnected`` without queueing anything."""
        if self.closed:
            return []
        return self._close("peer-disconnected", "peer-disconnected", "the connection was lost")

    def confirm_ready(self) -> list[Event]:
        """Guest: after :class:`ProofVerified`, send ``_session_ready`` with our signature."""
        assert self._guest is not None and self.state is State.AWAIT_CONFIRM
        assert self._payload is not None and self.session_id is not None
        self._queue(F.SessionReady(session_id=self.session_id, guest_signature=self._proof["guest_signature"]))
        self.state = State.READY
        self.timers.session_ready(self._clock())
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
        self.timers.business(self._clock())
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
        self._out += _struct_encoder.encode(frame)
        self._out += b"\n"

    def _close(self, reason: str, code: str | None, message: str = "") -> list[Event]:
        self.state = State.CLOSED
        ev = SessionClosed(reason, code, message)
        self.close_event = ev
        return [ev]

    def _fail(self, exc: KithError) -> list[Event]:
        """Fatal: tell the peer (the code and its fixed message only), then close."""
        if self.state in (State.HANDSHAKE, State.AWAIT_CONFIRM):
            self._queue(F.SessionReject(code=exc.code, message=_peer_message(exc.code)))
            return self._close("rejected", exc.code, exc.message)
        self._queue(F.Error(code=exc.code, message=_peer_message(exc.code)))
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
        self.timers.business(self._clock())
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
        self._queue(F.Error(code=exc.code, message=_peer_message(exc.code)))
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
            if self.role == "guest" and action in _UI_DATA_ACTIONS and self._ui_state in _UI_RECEIVING:
                return self._ui_malformed(action, exc.message)  # ends the UI branch only (DESIGN §6)
            return self._fail(HandshakeError("handshake-malformed", exc.message))
        if isinstance(frame, F.SessionReject):
            return self._close("rejected", frame.code[:64], frame.message[:500])
        if isinstance(frame, (F.Ping, F.Pong)) and not first:
            if isinstance(frame, F.Ping):
                self._queue(F.Pong(t=frame.t))
            return []
        try:
            if self.role == "host":
                events = self._host_handshake(frame, first)
            else:
                events = self._guest_handshake(frame)
            if not self.closed and not isinstance(frame, F.UiArtifactFile):
                self.timers.handshake_step(self._clock())
            return events
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
            offer = None
            if h.ui_bundle is not None and UI.CAPABILITY in self._capabilities:
                offer = {"files": len(h.ui_bundle.files), "total_bytes": h.ui_bundle.total_bytes}
                self._ui_state = "offered"
            self._queue(F.SessionProof(session_id=self.session_id, host_public_key=self.public_key,
                                       host_nonce=host_nonce, host_signature=sig, ui_offer=offer,
                                       profile=dict(h.profile)))
            return []
        if isinstance(frame, F.UiArtifactRequest):
            if self._ui_state == "offered":
                self._send_bundle()
                return []
            if self._ui_state is None:
                self._ui_state = "done"
                self._queue(F.UiArtifactError(code="ui-not-offered", message="this host offered no UI"))
                return [UiArtifactRefused("ui-not-offered", "this host offered no UI", "host")]
            raise HandshakeError("handshake-unexpected-frame", "a second _ui_artifact_request")
        if isinstance(frame, (F.UiArtifactAck, F.UiArtifactError)):
            if self._ui_state != "sent":
                raise HandshakeError("handshake-unexpected-frame", "a UI answer without a UI transfer")
            self._ui_state = "done"
            if isinstance(frame, F.UiArtifactError):
                return [UiArtifactRefused(frame.code[:64], frame.message[:500], "guest")]
            return []
        if self._ui_state == "sent":
            raise HandshakeError("handshake-unexpected-frame", "expected _ui_artifact_ack or _ui_artifact_error")
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
        self.timers.session_ready(self._clock())
        return [SessionReady(self.session_id, self.peer_public_key, dict(self.peer_profile),
                             list(self._capabilities), dict(self._proof))]

    def _guest_handshake(self, frame: F.SystemFrame) -> list[Event]:
        g = self._guest
        assert g is not None
        if isinstance(frame, (F.UiArtifactBegin, F.UiArtifactFile, F.UiArtifactEnd, F.UiArtifactError)):
            return self._guest_ui(frame)
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
        if not g.admit_host(frame.host_public_key, dict(frame.profile)):
            raise HandshakeError("handshake-not-admitted", "this guest does not accept the host")
        self.peer_profile = dict(frame.profile)
        self._payload = payload
        self.session_id = sid
        self.peer_public_key = frame.host_public_key
        self._proof = {"session_id": sid, "post_id": g.post_id, "protocol_id": self.spec.protocol_id,
                       "host_public_key": frame.host_public_key, "guest_public_key": self.public_key,
                       "guest_nonce": self._payload_fields["guest_nonce"], "host_nonce": frame.host_nonce,
                       "host_signature": frame.host_signature,
                       "guest_signature": self._sign(role_message("guest", payload))}
        self.state = State.AWAIT_CONFIRM
        verified: list[Event] = [ProofVerified(dict(self._proof))]
        if g.want_ui and UI.CAPABILITY in g.capabilities and isinstance(frame.ui_offer, dict):
            # the UI branch runs before _session_ready; ProofVerified waits for its end
            self._queue(F.UiArtifactRequest())
            self._ui_state = "requested"
            self._framer.max_line_bytes = max(self.spec.limits.max_message_bytes, UI.UI_LINE_BYTES)
            self._pending_proof = verified
            return []
        return verified

    # ------------------------------------------------------------ UI branch
    def _send_bundle(self) -> None:
        b = self._host.ui_bundle if self._host else None
        assert b is not None
        self._queue(F.UiArtifactBegin(files=[F.UiManifestFile(f.path, f.size, f.sha256) for f in b.files],
                                      total_bytes=b.total_bytes))
        for f in b.files:
            data = b.data[f.path]
            for off in range(0, len(data), UI.CHUNK_BYTES):
                self._queue(F.UiArtifactFile(path=f.path, offset=off, data=data[off:off + UI.CHUNK_BYTES]))
        self._queue(F.UiArtifactEnd())
        self._ui_state = "sent"
        self.ui_bytes_sent += b.total_bytes

    def _ui_finish(self, events: list[Event]) -> list[Event]:
        self._ui_state = "done"
        self._ui_receiver = None
        self._framer.max_line_bytes = self.spec.limits.max_message_bytes
        out, self._pending_proof = events + self._pending_proof, []
        return out

    def _ui_refuse(self, exc: HandshakeError) -> list[Event]:
        """We refuse the bundle: tell the host, ignore the rest of the transfer."""
        self._queue(F.UiArtifactError(code=exc.code, message=exc.message))
        self._ui_state = "draining"
        self._ui_receiver = None
        return [UiArtifactRefused(exc.code, exc.message, "guest")]

    def _ui_malformed(self, action: str, detail: str) -> list[Event]:
        """A UI frame with wrong/missing/extra fields (e.g. ``"size": true``): refuse the
        bundle with ``ui-manifest-mismatch`` and go on without a UI; while draining a
        refused bundle, a malformed frame is ignored (a malformed end ends the drain)."""
        if self._ui_state == "draining":
            return self._ui_finish([]) if action == "_ui_artifact_end" else []
        events = self._ui_refuse(HandshakeError("ui-manifest-mismatch", f"a malformed {action}: {detail}"[:500]))
        return self._ui_finish(events) if action == "_ui_artifact_end" else events

    def _guest_ui(self, frame: F.SystemFrame) -> list[Event]:
        st = self._ui_state
        if st is None:
            raise HandshakeError("ui-not-requested", "the host sent UI data that was not requested")
        if isinstance(frame, F.UiArtifactError):
            if st not in ("requested", "receiving", "draining"):
                raise HandshakeError("handshake-unexpected-frame", "a UI error after the UI branch")
            return self._ui_finish([UiArtifactRefused(frame.code[:64], frame.message[:500], "host")])
        if isinstance(frame, F.UiArtifactBegin):
            if st != "requested":
                raise HandshakeError("handshake-unexpected-frame", "a second _ui_artifact_begin")
            entries = [UI.FileEntry(f.path, f.size, f.sha256) for f in frame.files]
            try:
                UI.check_manifest(entries, frame.total_bytes, [f.type for f in frame.files])
            except HandshakeError as exc:
                return self._ui_refuse(exc)
            self._ui_receiver = UI.BundleReceiver(entries, frame.total_bytes)
            self._ui_state = "receiving"
            return []
        if isinstance(frame, F.UiArtifactFile):
            if st == "draining":
                return []
            if st != "receiving" or self._ui_receiver is None:
                raise HandshakeError("handshake-unexpected-frame", "UI file data before the manifest")
            try:
                self._ui_receiver.add(frame.path, frame.offset, frame.data)
            except HandshakeError as exc:
                return self._ui_refuse(exc)
            return []
        assert isinstance(frame, F.UiArtifactEnd)
        if st == "draining":
            return self._ui_finish([])
        if st != "receiving" or self._ui_receiver is None:
            raise HandshakeError("handshake-unexpected-frame", "_ui_artifact_end before the manifest")
        receiver = self._ui_receiver
        try:
            files = receiver.finish()
        except HandshakeError as exc:
            events = self._ui_refuse(exc)
            return self._ui_finish(events)
        self._queue(F.UiArtifactAck())
        return self._ui_finish([UiArtifactReceived(files, receiver.total_bytes)])


__all__ = [
    "EgressRefused", "Event", "GuestConfig", "HostConfig", "MessageReceived", "MessageRefused",
    "ProofVerified", "RemoteError", "SessionClosed", "SessionEngine", "SessionReady", "State",
    "Timeouts", "UiArtifactReceived", "UiArtifactRefused",
]
