"""The optional UI branch of the handshake (DESIGN §6) as its own small state machine.

After ``_session_proof`` carried a ``ui_offer``, a guest that advertised ``p2p_ui_v1`` and
has no local UI sends ``_ui_artifact_request``; the host sends ``_ui_artifact_begin``,
``_ui_artifact_file`` chunks and ``_ui_artifact_end``; the guest answers
``_ui_artifact_ack`` or ``_ui_artifact_error``. A failed branch ends only the branch: the
handshake goes on without a UI. No I/O; the bundle rules themselves (paths, manifest,
hashes) are :mod:`node.engine.ui`.

States are :class:`UiState`; every legal move is one row of :data:`HOST_TRANSITIONS` or
:data:`GUEST_TRANSITIONS` (``(state, input) → next state``). An input with no row is
refused with ``handshake-unexpected-frame`` — or, on a guest that never asked,
``ui-not-requested`` — which ends the whole handshake (the peer broke the order).
"""

from __future__ import annotations

import enum
from typing import Any, Callable

from node.common.errors import HandshakeError
from node.engine import frames as F
from node.engine import ui as UI
from node.engine.events import Event, UiArtifactReceived, UiArtifactRefused
from node.engine.framing import LineFramer


class UiState(enum.Enum):
    """Where the UI branch of one side is."""

    NONE = "none"            # no branch: nothing offered (host) / nothing asked (guest)
    OFFERED = "offered"      # host: the ui_offer went out in _session_proof
    SENT = "sent"            # host: the bundle is queued; waiting for ack or error
    REQUESTED = "requested"  # guest: _ui_artifact_request sent; waiting for the manifest
    RECEIVING = "receiving"  # guest: manifest accepted; file data flowing
    DRAINING = "draining"    # guest: we refused the bundle; the rest is ignored until its end
    DONE = "done"            # the branch is over (received, refused or never wanted)


class UiInput(enum.Enum):
    """What can happen to a UI branch."""

    OFFER = "offer"      # host: we put a ui_offer in _session_proof
    REQUEST = "request"  # host: _ui_artifact_request arrived
    ANSWER = "answer"    # host: _ui_artifact_ack or _ui_artifact_error arrived
    ASK = "ask"          # guest: we send _ui_artifact_request
    BEGIN = "begin"      # guest: _ui_artifact_begin arrived (manifest accepted)
    FILE = "file"        # guest: _ui_artifact_file arrived
    END = "end"          # guest: _ui_artifact_end arrived
    ERROR = "error"      # guest: the host's _ui_artifact_error arrived
    REFUSE = "refuse"    # guest: our check failed, or a UI frame was malformed


S, I = UiState, UiInput

#: Host: (state, input) → next state. ``(NONE, REQUEST)`` is a request for a UI that was
#: never offered: answered with ``ui-not-offered``, the branch is over.
HOST_TRANSITIONS: dict[tuple[UiState, UiInput], UiState] = {
    (S.NONE, I.OFFER): S.OFFERED,
    (S.NONE, I.REQUEST): S.DONE,
    (S.OFFERED, I.REQUEST): S.SENT,
    (S.SENT, I.ANSWER): S.DONE,
}

#: Guest: (state, input) → next state. While draining a refused bundle, file data and
#: malformed frames are ignored (``DRAINING`` loops) until ``_ui_artifact_end``.
GUEST_TRANSITIONS: dict[tuple[UiState, UiInput], UiState] = {
    (S.NONE, I.ASK): S.REQUESTED,
    (S.REQUESTED, I.BEGIN): S.RECEIVING,
    (S.RECEIVING, I.FILE): S.RECEIVING,
    (S.DRAINING, I.FILE): S.DRAINING,
    (S.RECEIVING, I.END): S.DONE,
    (S.DRAINING, I.END): S.DONE,
    (S.REQUESTED, I.ERROR): S.DONE,
    (S.RECEIVING, I.ERROR): S.DONE,
    (S.DRAINING, I.ERROR): S.DONE,
    (S.REQUESTED, I.REFUSE): S.DRAINING,
    (S.RECEIVING, I.REFUSE): S.DRAINING,
    (S.DRAINING, I.REFUSE): S.DRAINING,
}

#: Why an input with no row is refused (the local message of ``handshake-unexpected-frame``).
_OUT_OF_ORDER: dict[UiInput, str] = {
    I.REQUEST: "a second _ui_artifact_request",
    I.ANSWER: "a UI answer without a UI transfer",
    I.BEGIN: "a second _ui_artifact_begin",
    I.FILE: "UI file data before the manifest",
    I.END: "_ui_artifact_end before the manifest",
    I.ERROR: "a UI error after the UI branch",
}

#: Guest states in which UI data frames are expected (long lines allowed, malformed UI
#: frames end only the branch).
RECEIVING_STATES = frozenset({S.REQUESTED, S.RECEIVING, S.DRAINING})


class _Branch:
    """A UI branch: the current state and the one way to change it."""

    transitions: dict[tuple[UiState, UiInput], UiState] = {}

    def __init__(self, queue: Callable[[F.SystemFrame], None]) -> None:
        self.state = UiState.NONE
        self._queue = queue

    def _refusal(self, inp: UiInput) -> HandshakeError:
        return HandshakeError("handshake-unexpected-frame", _OUT_OF_ORDER.get(inp, f"UI {inp.value} out of order"))

    def require(self, inp: UiInput) -> None:
        """Raise unless ``inp`` is legal now.

        Raises:
            HandshakeError: ``handshake-unexpected-frame`` (or ``ui-not-requested``).
        """
        if (self.state, inp) not in self.transitions:
            raise self._refusal(inp)

    def step(self, inp: UiInput) -> UiState:
        """Apply ``inp`` (see the transition table) and return the new state.

        Raises:
            HandshakeError: as :meth:`require`.
        """
        self.require(inp)
        self.state = self.transitions[(self.state, inp)]
        return self.state


class HostUiBranch(_Branch):
    """The host's side: offer the bundle, send it on request, take the guest's answer.

    Args:
        bundle: the protocol's UI bundle when the host shares one, else None.
        queue: queues one system frame for the guest.
    """

    transitions = HOST_TRANSITIONS

    def __init__(self, bundle: UI.Bundle | None, queue: Callable[[F.SystemFrame], None]) -> None:
        super().__init__(queue)
        self.bundle = bundle
        self.bytes_sent = 0

    def offer(self, capabilities: list[str]) -> dict[str, Any] | None:
        """The ``ui_offer`` of ``_session_proof`` (files, total bytes) when we share a
        bundle and the guest advertised ``p2p_ui_v1``; None otherwise."""
        if self.bundle is None or UI.CAPABILITY not in capabilities:
            return None
        self.step(I.OFFER)
        return {"files": len(self.bundle.files), "total_bytes": self.bundle.total_bytes}

    @property
    def awaiting_answer(self) -> bool:
        """True while the bundle is out and the guest's ack or error is due."""
        return self.state is S.SENT

    def on_request(self) -> list[Event]:
        """``_ui_artifact_request`` arrived: queue the bundle, or ``ui-not-offered``."""
        if self.step(I.REQUEST) is S.DONE:
            self._queue(F.UiArtifactError(code="ui-not-offered", message="this host offered no UI"))
            return [UiArtifactRefused("ui-not-offered", "this host offered no UI", "host")]
        b = self.bundle
        assert b is not None
        self._queue(F.UiArtifactBegin(files=[F.UiManifestFile(f.path, f.size, f.sha256) for f in b.files],
                                      total_bytes=b.total_bytes))
        for f in b.files:
            data = b.data[f.path]
            for off in range(0, len(data), UI.CHUNK_BYTES):
                self._queue(F.UiArtifactFile(path=f.path, offset=off, data=data[off:off + UI.CHUNK_BYTES]))
        self._queue(F.UiArtifactEnd())
        self.bytes_sent += b.total_bytes
        return []

    def on_answer(self, frame: F.UiArtifactAck | F.UiArtifactError) -> list[Event]:
        """The guest's ack or error arrived: the branch is over."""
        self.step(I.ANSWER)
        if isinstance(frame, F.UiArtifactError):
            return [UiArtifactRefused(frame.code[:64], frame.message[:500], "guest")]
        return []


class GuestUiBranch(_Branch):
    """The guest's side: ask, receive and verify the bundle, answer ack or error.

    While the branch receives, the framer's line limit is raised to
    :data:`node.engine.ui.UI_LINE_BYTES` (one file chunk) and the guest's
    :class:`~node.engine.events.ProofVerified` waits for the branch's end.

    Args:
        queue: queues one system frame for the host.
        framer: the session's line framer (its limit is raised while receiving).
        line_bytes: the protocol's ``max_message_bytes`` (restored at the end).
    """

    transitions = GUEST_TRANSITIONS

    def __init__(self, queue: Callable[[F.SystemFrame], None], framer: LineFramer, line_bytes: int) -> None:
        super().__init__(queue)
        self._framer = framer
        self._line_bytes = line_bytes
        self._receiver: UI.BundleReceiver | None = None
        self._pending: list[Event] = []

    def _refusal(self, inp: UiInput) -> HandshakeError:
        if self.state is S.NONE:
            return HandshakeError("ui-not-requested", "the host sent UI data that was not requested")
        return super()._refusal(inp)

    @property
    def receiving(self) -> bool:
        """True while UI data frames are expected."""
        return self.state in RECEIVING_STATES

    def ask(self, pending: list[Event]) -> None:
        """Send ``_ui_artifact_request``; ``pending`` (the proof) is released at the end."""
        self.step(I.ASK)
        self._queue(F.UiArtifactRequest())
        self._framer.max_line_bytes = max(self._line_bytes, UI.UI_LINE_BYTES)
        self._pending = pending

    def on_frame(self, frame: F.SystemFrame) -> list[Event]:
        """One well-formed UI frame from the host (begin, file, end or error).

        Raises:
            HandshakeError: ``ui-not-requested`` / ``handshake-unexpected-frame``.
        """
        if isinstance(frame, F.UiArtifactError):
            self.step(I.ERROR)
            return self._finish([UiArtifactRefused(frame.code[:64], frame.message[:500], "host")])
        if isinstance(frame, F.UiArtifactBegin):
            self.require(I.BEGIN)
            entries = [UI.FileEntry(f.path, f.size, f.sha256) for f in frame.files]
            try:
                UI.check_manifest(entries, frame.total_bytes, [f.type for f in frame.files])
            except HandshakeError as exc:
                return self._refuse(exc)
            self._receiver = UI.BundleReceiver(entries, frame.total_bytes)
            self.step(I.BEGIN)
            return []
        if isinstance(frame, F.UiArtifactFile):
            if self.step(I.FILE) is S.DRAINING:
                return []
            assert self._receiver is not None
            try:
                self._receiver.add(frame.path, frame.offset, frame.data)
            except HandshakeError as exc:
                return self._refuse(exc)
            return []
        assert isinstance(frame, F.UiArtifactEnd)
        self.require(I.END)
        if self.state is S.DRAINING:
            self.step(I.END)
            return self._finish([])
        receiver = self._receiver
        assert receiver is not None
        try:
            files = receiver.finish()
        except HandshakeError as exc:
            events = self._refuse(exc)
            self.step(I.END)
            return self._finish(events)
        self.step(I.END)
        self._queue(F.UiArtifactAck())
        return self._finish([UiArtifactReceived(files, receiver.total_bytes)])

    def on_malformed(self, action: str, detail: str) -> list[Event]:
        """A UI frame with wrong/missing/extra fields (e.g. ``"size": true``) while
        receiving: refuse the bundle with ``ui-manifest-mismatch`` and go on without a UI;
        while draining a refused bundle it is ignored (a malformed end ends the drain)."""
        events: list[Event] = []
        if self.state is not S.DRAINING:
            events = self._refuse(HandshakeError("ui-manifest-mismatch", f"a malformed {action}: {detail}"[:500]))
        else:
            self.step(I.REFUSE)
        if action == "_ui_artifact_end":
            self.step(I.END)
            return self._finish(events)
        return events

    def _refuse(self, exc: HandshakeError) -> list[Event]:
        """We refuse the bundle: tell the host, ignore the rest of the transfer."""
        self.step(I.REFUSE)
        self._queue(F.UiArtifactError(code=exc.code, message=exc.message))
        self._receiver = None
        return [UiArtifactRefused(exc.code, exc.message, "guest")]

    def _finish(self, events: list[Event]) -> list[Event]:
        self._receiver = None
        self._framer.max_line_bytes = self._line_bytes
        out, self._pending = events + self._pending, []
        return out


__all__ = ["GUEST_TRANSITIONS", "HOST_TRANSITIONS", "GuestUiBranch", "HostUiBranch", "RECEIVING_STATES",
           "UiInput", "UiState"]
