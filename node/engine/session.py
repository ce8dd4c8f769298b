"""The session state machine: one side of one session (DESIGN §6 handshake, §7 business
loop). No I/O.

Feed it bytes with :meth:`SessionEngine.receive_data` / :meth:`receive_eof`, give it the
messages your hooks produce with :meth:`send_message`, and write whatever
:meth:`data_to_send` returns to the stream. It returns :class:`Event` objects telling the
driver what happened. Time, randomness and signing come in as arguments, so the same
engine runs over the memory pipe and over iroh (``node.runtime.driver`` pumps it).

Order on every incoming frame: line framing → JSON decode → system/business split →
action declared for the sender's direction → jsonschema → state/turn rules → event for
the hook. Outgoing business messages are validated the same way for our direction,
encoded once, then passed through ``egress_check`` as an :class:`OutgoingFrame` (the
message and the exact bytes that will leave, so no later step re-encodes or decodes it).

This class only composes the concerns, each its own small module: framing
(:mod:`node.engine.framing`), the handshakes (:mod:`node.engine.handshake`), the UI
branch (:mod:`node.engine.ui_branch`), the business loop (:mod:`node.engine.business`),
the timers (:mod:`node.engine.timers`) and the events it reports
(:mod:`node.engine.events`).
"""

from __future__ import annotations

import enum
import os
import time
from typing import Any, Callable, NamedTuple

import msgspec

from node.common.errors import EgressRefused, HandshakeError, HookError, KithError, ProtocolViolation, SigningError
from node.engine import frames as F
from node.engine.business import FATAL_FRAME_CODES, BusinessLoop, peer_message
from node.engine.events import (
    Event,
    MessageReceived,
    MessageRefused,
    ProofVerified,
    RemoteError,
    SessionClosed,
    SessionReady,
    UiArtifactReceived,
    UiArtifactRefused,
)
from node.engine.framing import LineFramer, decode_frame, encode_frame
from node.engine.handshake import GuestConfig, GuestHandshake, HostConfig, HostHandshake, signing_refusal
from node.engine.timers import PING, SessionTimers, Timeouts
from node.engine.ui_branch import GuestUiBranch, HostUiBranch

_struct_encoder = msgspec.json.Encoder()

# Host → guest UI transfer frames; malformed ones end only the UI branch while it runs.
_UI_DATA_ACTIONS = frozenset({"_ui_artifact_begin", "_ui_artifact_file", "_ui_artifact_end"})


#: The line limit of everything a host receives before READY (bytes, without the ``\n``),
#: whatever the protocol's ``max_message_bytes``: an unauthenticated dialer makes the host
#: buffer at most this much (specs/session.md §2). A ``_session_init`` with a full profile
#: is a few KiB.
PRE_READY_MAX_LINE_BYTES = 64 * 1024


class OutgoingFrame(NamedTuple):
    """One outgoing business frame as the egress seam sees it (``egress_check``).

    Attributes:
        message: the validated business message (a JSON object; treat it as read-only).
        data: its encoding, exactly the bytes queued for the peer (UTF-8 JSON + ``\\n``).
        replying_to: the peer's last business message in this session (the one it
            answers), or None before any.
    """

    message: dict[str, Any]
    data: bytes
    replying_to: dict[str, Any] | None


class State(enum.Enum):
    """Where a session is."""

    HANDSHAKE = "handshake"
    AWAIT_CONFIRM = "await-confirm"  # guest: proof verified, waiting for the driver
    READY = "ready"
    CLOSED = "closed"


class SessionEngine:
    """One side of one session.

    Args:
        role: ``"guest"`` or ``"host"``.
        spec: the loaded :class:`node.protocol.spec.ProtocolSpec`.
        public_key: our identity public key (64 hex).
        sign: signs bytes with our identity, returning 128 hex.
        host / guest: the role's :class:`HostConfig` / :class:`GuestConfig`.
        random_bytes: source of randomness (default ``os.urandom``).
        egress_check: called once with each outgoing business frame as an
            :class:`OutgoingFrame` (message, its bytes, the peer message it answers)
            after validation and encoding, before it is queued — the gate seam
            (:meth:`node.policy.gate.EgressGate.check_frame`) and, on a host, the audit
            tap; raises :class:`node.common.errors.EgressRefused` to refuse it (nothing
            is queued then). It returns None, or an :class:`OutgoingFrame` whose
            message and bytes replace the frame (the host's signed citations): the
            replacement must keep the action, match its schema and fit
            ``max_message_bytes`` (``hook-output-invalid`` otherwise).
        clock: monotonic time in seconds (time is an input: tests pass a fake clock).
        timeouts: the session bounds (:class:`node.engine.timers.Timeouts`); None = no
            timers until :meth:`set_timeouts` (the driver sets them).
    """

    def __init__(self, role: str, spec: Any, *, public_key: str, sign: Callable[[bytes], str],
                 host: HostConfig | None = None, guest: GuestConfig | None = None,
                 random_bytes: Callable[[int], bytes] = os.urandom,
                 egress_check: Callable[[OutgoingFrame], OutgoingFrame | None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 timeouts: Timeouts | None = None) -> None:
        if role not in ("guest", "host"):
            raise ValueError("role must be 'guest' or 'host'")
        if (role == "host") != (host is not None) or (role == "guest") != (guest is not None):
            raise ValueError("give HostConfig for a host and GuestConfig for a guest")
        self.role = role
        self.peer_role = "host" if role == "guest" else "guest"
        self._spec = spec
        self.public_key = public_key
        self._host = host
        self._guest = guest
        self._egress_check = egress_check
        self._last_received: dict[str, Any] | None = None  # the peer's last business message
        self._framer = LineFramer(spec.limits.max_message_bytes if host is None else
                                  min(spec.limits.max_message_bytes, PRE_READY_MAX_LINE_BYTES))
        #: the frames queued for the peer, each whole with its newline (data_to_send joins
        #: them only when there is more than one: a lone frame leaves without a copy)
        self._out: list[bytes] = []
        self.state = State.HANDSHAKE
        self._saw_first = False
        self._got_business = False  # a business message of the peer was accepted (READY only)
        self.close_event: SessionClosed | None = None
        self._clock = clock
        self.timers = SessionTimers(timeouts or Timeouts(None, None, None, None), clock())
        common = dict(spec=spec, public_key=public_key, sign=sign, random_bytes=random_bytes, queue=self._queue)
        self._hs: HostHandshake | GuestHandshake
        self._host_ui: HostUiBranch | None = None
        self._guest_ui: GuestUiBranch | None = None
        if host is not None:
            self._host_ui = HostUiBranch(host.ui_bundle, self._queue)
            self._hs = HostHandshake(host, self._host_ui, **common)
        else:
            assert guest is not None
            self._guest_ui = GuestUiBranch(self._queue, self._framer, spec.limits.max_message_bytes)
            self._hs = GuestHandshake(guest, self._guest_ui, **common)
        self._loop = BusinessLoop(spec, self._queue)

    @property
    def spec(self) -> Any:
        """The :class:`node.protocol.spec.ProtocolSpec` this side speaks."""
        return self._spec

    @spec.setter
    def spec(self, spec: Any) -> None:
        self._spec = self._hs.spec = self._loop.spec = spec

    # ------------------------------------------------------------ what the handshake learnt
    @property
    def session_id(self) -> str | None:
        """The session id (64 hex) once the handshake produced one, else None."""
        return self._hs.session_id

    @property
    def peer_public_key(self) -> str | None:
        """The peer's identity key (64 hex) once its frame verified, else None."""
        return self._hs.peer_public_key

    @property
    def peer_profile(self) -> dict[str, Any]:
        """The profile the peer shared in the handshake (``{}`` until then)."""
        return self._hs.peer_profile

    @property
    def ui_bytes_sent(self) -> int:
        """Host: bytes of UI bundle sent in this session (0 on a guest)."""
        return self._host_ui.bytes_sent if self._host_ui is not None else 0

    @property
    def _payload(self) -> bytes | None:
        return self._hs.payload

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
        if due == "peer-unresponsive":
            what = " while its reply was due" if self.timers.awaiting_since is not None else ""
            return self._fail(KithError(due, f"nothing from the peer for {self.timers.silence(now):.0f} s{what}"))
        return self._fail(KithError(due))

    def _turn_changed(self) -> None:
        """A business message went either way: a guest owes nothing and awaits the host's
        reply, or not — the in-flight heartbeat applies only while it does
        (:meth:`node.engine.timers.SessionTimers.awaiting`)."""
        self.timers.awaiting(self.role == "guest" and self._loop.awaiting == "host", self._clock())

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
                    try:  # send_message validates it (once)
                        self.send_message(cand)
                    except KithError:
                        continue
                    return self._close("shutdown", code, "the session ended because this node is shutting down")
        self._fail(KithError(code))
        return self._close("shutdown", code, "the session ended because this node is shutting down")

    def initiate(self) -> None:
        """Guest: queue ``_session_init``. Call once, before any data is received."""
        assert isinstance(self._hs, GuestHandshake)
        self._hs.initiate()

    @property
    def has_data_to_send(self) -> bool:
        """True while bytes for the peer are queued (:meth:`data_to_send` would return some)."""
        return bool(self._out)

    def data_to_send(self) -> bytes:
        """Return and clear the bytes queued for the peer."""
        out = self._out
        if not out:
            return b""
        self._out = []
        return out[0] if len(out) == 1 else b"".join(out)

    @property
    def closed(self) -> bool:
        """True once the session ended (the driver then sends EOF and closes)."""
        return self.state is State.CLOSED

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the peer; return what happened, in order.

        A host before READY takes the bytes one line at a time under
        :data:`PRE_READY_MAX_LINE_BYTES`, so the line that makes the session ready is
        handled before the next line is measured against the protocol's own limit."""
        events: list[Event] = []
        while data and not self.closed and self._small_frames:
            nl = data.find(b"\n")
            head, data = (data, b"") if nl < 0 else (data[:nl + 1], data[nl + 1:])
            events.extend(self._receive_chunk(head))
            if not self._small_frames:  # READY now: the protocol's limit from here on
                self._framer.max_line_bytes = self.spec.limits.max_message_bytes
        if data:
            events.extend(self._receive_chunk(data))
        return events

    @property
    def _small_frames(self) -> bool:
        """A host whose session is not ready yet (its framer holds lines to the small limit)."""
        return self.role == "host" and self.state is not State.READY

    def _receive_chunk(self, data: bytes) -> list[Event]:
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
            if len(line) > self.spec.limits.max_message_bytes and not self._ui_receiving:
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
        assert isinstance(self._hs, GuestHandshake) and self.state is State.AWAIT_CONFIRM
        frame, ready = self._hs.ready_frame()
        self._queue(frame)
        self.state = State.READY
        self.timers.session_ready(self._clock())
        return [ready]

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
            terminal = self._loop.check(message, sender=self.role)
        except ProtocolViolation as exc:
            raise HookError("hook-output-invalid", f"our {message.get('action') if isinstance(message, dict) else '?'!r} "
                                                   f"message was refused: {exc.message}") from None
        data = encode_frame(message)
        if len(data) - 1 > self.spec.limits.max_message_bytes:
            raise HookError("hook-output-invalid", "our message is larger than max_message_bytes")
        if self._egress_check is not None:
            out = self._egress_check(OutgoingFrame(message, data, self._last_received))
            if out is not None:  # the seam rewrote the frame (signed citations): that is what leaves
                data = self._rewritten(message, out)
        self._out.append(data)
        self._loop.accept(self.role, terminal)
        self.timers.business(self._clock())
        self._turn_changed()
        if terminal:
            return self._close("completed", None)
        return self._check_message_limit()

    def _rewritten(self, message: dict[str, Any], out: OutgoingFrame) -> bytes:
        """The bytes of a frame the egress seam rewrote, after the checks the original
        passed: the same action, valid against its schema, within ``max_message_bytes``.

        Raises:
            HookError: ``hook-output-invalid`` when the rewrite breaks one of them.
        """
        action = message.get("action")
        mspec = self.spec.messages.get(action)
        if (not isinstance(out.message, dict) or out.message.get("action") != action or mspec is None
                or mspec.first_error(out.message) is not None):
            raise HookError("hook-output-invalid", f"the egress seam's rewrite of our {action!r} "
                                                   "message does not match its schema")
        if len(out.data) - 1 > self.spec.limits.max_message_bytes:
            raise HookError("hook-output-invalid", "our rewritten message is larger than max_message_bytes")
        return out.data

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
    @property
    def _ui_receiving(self) -> bool:
        return self._guest_ui is not None and self._guest_ui.receiving

    def _queue(self, frame: F.SystemFrame) -> None:
        self._out.append(_struct_encoder.encode(frame) + b"\n")

    def _close(self, reason: str, code: str | None, message: str = "") -> list[Event]:
        self.state = State.CLOSED
        ev = SessionClosed(reason, code, message)
        self.close_event = ev
        return [ev]

    def _fail(self, exc: KithError) -> list[Event]:
        """Fatal: tell the peer (the code and its fixed message only), then close."""
        if self.state in (State.HANDSHAKE, State.AWAIT_CONFIRM):
            self._queue(F.SessionReject(code=exc.code, message=peer_message(exc.code)))
            return self._close("rejected", exc.code, exc.message)
        self._queue(F.Error(code=exc.code, message=peer_message(exc.code)))
        return self._close("aborted", exc.code, exc.message)

    def _receive_line(self, line: bytes) -> list[Event]:
        try:
            obj = decode_frame(line)
        except ProtocolViolation as exc:
            return self._invalid_input(exc)
        if self.state is not State.READY:
            return self._handshake_frame(obj)
        if obj["action"] == "_session_reject" and self.role == "guest" and not self._got_business:
            # the Host refuses at _session_ready (a guest is ready once it sent it; session.md §4.3)
            try:
                frame = F.decode_system(obj)
            except (ProtocolViolation, HandshakeError) as exc:
                return self._fail(HandshakeError("handshake-malformed", exc.message))
            return self._close("rejected", frame.code[:64], frame.message[:500])
        try:
            if obj["action"].startswith("_"):
                return self._loop.system_frame(obj)
            terminal = self._loop.check(obj, sender=self.peer_role)
        except (ProtocolViolation, HandshakeError) as exc:
            return self._invalid_input(exc)
        self._loop.accept(self.peer_role, terminal)
        self._got_business = True
        self._last_received = obj
        self.timers.business(self._clock())
        self._turn_changed()
        events: list[Event] = [MessageReceived(obj, terminal)]
        if terminal:
            events.extend(self._close("completed", None))
        else:
            events.extend(self._check_message_limit())
        return events

    def _invalid_input(self, exc: ProtocolViolation) -> list[Event]:
        if self.state is not State.READY or exc.code in FATAL_FRAME_CODES:
            return self._fail(exc)
        if self._loop.count_invalid():
            return self._fail(ProtocolViolation("too-many-invalid"))
        self._queue(F.Error(code=exc.code, message=peer_message(exc.code)))
        return [MessageRefused(exc.code, exc.message)]

    def _check_message_limit(self) -> list[Event]:
        if self._loop.limit_reached and not self.closed:
            return self._fail(ProtocolViolation("message-limit-exceeded"))
        return []

    def _handshake_frame(self, obj: dict[str, Any]) -> list[Event]:
        """One frame before the session is ready: the first-frame and decoding rules, a
        peer's ``_session_reject``, heartbeats, then the role's handshake step."""
        first = not self._saw_first
        self._saw_first = True
        action = obj["action"]
        if not action.startswith("_"):
            if first and self.role == "host":
                return self._fail(HandshakeError("handshake-first-frame"))
            return self._fail(ProtocolViolation("message-before-ready"))
        try:
            frame = F.decode_system(obj)
        except (ProtocolViolation, HandshakeError) as exc:
            if first and self.role == "host" and action != "_session_init":
                return self._fail(HandshakeError("handshake-first-frame"))
            if self._guest_ui is not None and action in _UI_DATA_ACTIONS and self._guest_ui.receiving:
                return self._guest_ui.on_malformed(action, exc.message)  # ends the UI branch only (DESIGN §6)
            return self._fail(HandshakeError("handshake-malformed", exc.message))
        if isinstance(frame, F.SessionReject):
            return self._close("rejected", frame.code[:64], frame.message[:500])
        if isinstance(frame, (F.Ping, F.Pong)) and not first:
            if isinstance(frame, F.Ping):
                self._queue(F.Pong(t=frame.t))
            return []
        try:
            if isinstance(self._hs, HostHandshake):
                events = self._hs.step(frame, first)
                if self._hs.ready:
                    self.state = State.READY
                    self.timers.session_ready(self._clock())
            else:
                events = self._hs.step(frame)
                if self._hs.verified and self.state is State.HANDSHAKE:
                    self.state = State.AWAIT_CONFIRM
            if not self.closed and not isinstance(frame, F.UiArtifactFile):
                self.timers.handshake_step(self._clock())
            return events
        except SigningError as exc:
            return self._fail(signing_refusal(exc))
        except HandshakeError as exc:
            return self._fail(exc)


__all__ = [
    "EgressRefused", "Event", "GuestConfig", "HostConfig", "MessageReceived", "MessageRefused", "OutgoingFrame",
    "PRE_READY_MAX_LINE_BYTES",
    "ProofVerified", "RemoteError", "SessionClosed", "SessionEngine", "SessionReady", "State",
    "Timeouts", "UiArtifactReceived", "UiArtifactRefused",
]
