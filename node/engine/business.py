"""The business loop's rules (DESIGN §7): which message may be sent by whom and when. No I/O.

For every business message, sent or received: an object with a string ``action`` → not a
system frame → declared by the protocol → allowed for the sender's direction → valid
against the message's compiled schema → turn rules of the flow mode. Each side checks
each message once: the sender what its hooks produce, the receiver what arrives. It
also counts messages (``max_messages``) and invalid input (``max_invalid``), and answers
the system frames allowed after the handshake (``_ping``, ``_pong``, ``_error``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from node.common.errors import CODES, ProtocolViolation
from node.engine import frames as F
from node.engine.events import Event, RemoteError

if TYPE_CHECKING:
    from node.protocol.spec import ProtocolSpec

#: Fatal framing problems: the stream cannot be resynchronised.
FATAL_FRAME_CODES = frozenset({"frame-too-large", "frame-truncated"})
#: System frames a ready session accepts; any other ``_`` action is refused.
_READY_SYSTEM = frozenset({"_ping", "_pong", "_error"})


def peer_message(code: str) -> str:
    """What a peer is told about ``code``: the code's fixed message from CODES, never the
    local message (which may carry exception text, names or paths) — issue 5, rule 7."""
    return CODES.get(code, CODES["internal-error"])[1]


def _schema_path(path: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


class BusinessLoop:
    """Counts and checks business messages for one session.

    Args:
        spec: the loaded protocol spec (messages with compiled validators, flow, limits).
        queue: queues one system frame for the peer (``_pong``).
    """

    def __init__(self, spec: "ProtocolSpec", queue: Callable[[F.SystemFrame], None]) -> None:
        self.spec = spec
        self._queue = queue
        self.messages = 0
        self.invalid = 0
        self._awaiting: str | None = None  # role whose reply is due (turn rules)

    def check(self, msg: Any, *, sender: str) -> bool:
        """Check one business message from ``sender`` (``guest``/``host``); return whether
        it is terminal. Nothing is counted (see :meth:`accept`).

        Raises:
            ProtocolViolation: ``frame-missing-action``, ``message-unexpected-system-frame``,
                ``message-undeclared-action``, ``message-wrong-direction``,
                ``message-schema-invalid`` (naming the JSON path and keyword) or
                ``message-out-of-turn``.
        """
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
        err = mspec.first_error(msg)
        if err is not None:
            raise ProtocolViolation("message-schema-invalid",
                                    f"{action!r} does not match its schema at {_schema_path(err.absolute_path)} "
                                    f"({err.validator})")
        if not mspec.terminal and self.spec.flow_mode != "free":
            if self._awaiting is None and sender != self.spec.first:
                raise ProtocolViolation("message-out-of-turn", f"the {sender} may not send {action!r} now")
            if self._awaiting is not None and self._awaiting != sender:
                raise ProtocolViolation("message-out-of-turn", f"the {sender} must wait for a reply")
        return mspec.terminal

    def accept(self, sender: str, terminal: bool) -> None:
        """Count a checked message from ``sender`` and advance the turn."""
        self.messages += 1
        if terminal or self.spec.flow_mode == "free":
            return
        other = "host" if sender == "guest" else "guest"
        self._awaiting = other if self._awaiting is None else None

    @property
    def awaiting(self) -> str | None:
        """The role whose reply is due now (turn rules; None in ``free`` flow or when
        nobody owes one)."""
        return self._awaiting

    @property
    def limit_reached(self) -> bool:
        """True once ``max_messages`` messages were exchanged."""
        return self.messages >= self.spec.limits.max_messages

    def count_invalid(self) -> bool:
        """Count one refused incoming message; True when that exceeds ``max_invalid``."""
        self.invalid += 1
        return self.invalid > self.spec.limits.max_invalid

    def system_frame(self, obj: dict[str, Any]) -> list[Event]:
        """A system frame after the handshake: ``_ping`` is answered, ``_error`` reported.

        Raises:
            ProtocolViolation: ``message-unexpected-system-frame`` for any other system
                action, a malformed one.
            HandshakeError: ``handshake-malformed`` for a malformed ``_ping``/``_error``.
        """
        if obj["action"] not in _READY_SYSTEM:
            raise ProtocolViolation("message-unexpected-system-frame")
        frame = F.decode_system(obj)
        if isinstance(frame, F.Ping):
            self._queue(F.Pong(t=frame.t))
        elif isinstance(frame, F.Error):
            return [RemoteError(frame.code[:64], frame.message[:500])]
        return []
