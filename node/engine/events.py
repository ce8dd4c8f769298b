"""What the session engine reports to its driver (DESIGN §6, §7): one frozen dataclass per
event kind. No I/O. :class:`node.engine.session.SessionEngine` returns lists of these from
every call that can change the session; ``node.runtime.driver`` acts on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    """Base class of everything the engine reports."""


@dataclass(frozen=True)
class ProofVerified(Event):
    """Guest only: the host's proof verified and the guest signed. The driver may submit
    ``proof`` (every field of ``POST /api/v1/sessions``, both signatures) to the community
    server, then must call :meth:`node.engine.session.SessionEngine.confirm_ready`.
    """

    proof: dict[str, Any]


@dataclass(frozen=True)
class SessionReady(Event):
    """The handshake completed; business messages may flow.

    ``peer_person`` (host only): the :class:`node.trust.binding.PersonIdentity` the guest's
    verified binding chain proves, or None for a guest that sent none (an old guest, or an
    old host's v1 handshake: device-key-only identity)."""

    session_id: str
    peer_public_key: str
    peer_profile: dict[str, Any]
    peer_capabilities: list[str]
    proof: dict[str, Any]
    peer_person: Any = None
    #: (guest only) the host's device card as sent (``device_card``, unchecked: the guest's
    #: runtime checks it, node/guest/cards.py), or None.
    peer_card: Any = None
    #: (guest only) the host's copy grant state as sent (``copy_state``, unchecked: the
    #: guest's runtime checks it, node/guest/copies/lifecycle.py), or None (not sent).
    peer_copy_state: Any = None


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
    down: :meth:`node.engine.session.SessionEngine.shutdown`). ``code`` is the stable code."""

    reason: str
    code: str | None = None
    message: str = ""
