"""System frames (``action`` starting with ``_``) as typed msgspec structs (DESIGN §6).

One struct per frame kind, tagged by ``action``; :func:`decode_system` converts an already
decoded JSON object strictly (unknown fields and wrong types refused). Schemas for these
frames are published in ``specs/frames.schema.json``.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from node.common.errors import HandshakeError, ProtocolViolation


class _Frame(msgspec.Struct, tag_field="action", forbid_unknown_fields=True, omit_defaults=True):
    pass


class SessionInit(_Frame, tag="_session_init"):
    """Guest → Host, first frame: who the guest is and which post it joins."""

    post_id: str
    protocol_id: str
    guest_public_key: str
    guest_nonce: str
    capabilities: list[str] = msgspec.field(default_factory=list)
    profile: dict[str, Any] = msgspec.field(default_factory=dict)


class SessionProof(_Frame, tag="_session_proof"):
    """Host → Guest: the session id, host nonce and the host's signature over the payload."""

    session_id: str
    host_public_key: str
    host_nonce: str
    host_signature: str
    ui_offer: dict[str, Any] | None = None
    profile: dict[str, Any] = msgspec.field(default_factory=dict)
    #: 2 when the host speaks system frames v2 (only sent to a guest that advertised
    #: ``person_chain_v1``; specs/session.md §4.2); absent = v1.
    frames_version: int | None = None
    #: Only to a guest that advertised ``device_card_v1``: this hosting device's card
    #: (:func:`node.trust.card.check_card` owns its shape; the guest checks it, specs/session.md §4.2).
    device_card: Any = None
    #: Only to a guest that advertised ``copy_state_v1``: the state of the copy grant for
    #: this guest, ``{"granted", "stamp", "until"}`` (the guest's runtime checks its shape:
    #: :func:`node.guest.copies.checks.check_copy_state`; specs/session.md §4.2, specs/copies.md §5).
    copy_state: Any = None


class SessionReady(_Frame, tag="_session_ready"):
    """Guest → Host: the guest's signature; the session is live once the host verifies it."""

    session_id: str
    guest_signature: str
    #: v2 only (the host's proof said ``frames_version: 2``): the guest's binding chain,
    #: checked by :func:`node.trust.binding.verify_chain` (specs/session.md §4.3), which
    #: owns its whole shape (a non-list is ``handshake-binding-malformed`` too).
    binding_chain: Any = None
    #: v2 only, and only with ``binding_chain``: the newest revocation list of the guest's
    #: person (:func:`node.trust.revocation_list.check_list` owns its shape; specs/session.md §4.3).
    revocation_list: Any = None


class SessionReject(_Frame, tag="_session_reject"):
    """Either side during the handshake: a refusal with a stable code, then close."""

    code: str
    message: str


class Error(_Frame, tag="_error"):
    """Either side after the handshake: an invalid message was refused (no echo of data)."""

    code: str
    message: str


class Ping(_Frame, tag="_ping"):
    """Heartbeat request; answered with :class:`Pong`."""

    t: int | None = None


class Pong(_Frame, tag="_pong"):
    """Heartbeat answer."""

    t: int | None = None


class UiManifestFile(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One entry of a UI manifest: relative POSIX ``path``, ``size`` (bytes), ``sha256``
    (64 hex) and ``type`` (only ``file`` is accepted; anything else is a link/dir/device)."""

    path: str
    size: int
    sha256: str
    type: str = "file"


class UiArtifactRequest(_Frame, tag="_ui_artifact_request"):
    """Guest → Host, after ``_session_proof`` carried a ``ui_offer``: send me your UI."""


class UiArtifactBegin(_Frame, tag="_ui_artifact_begin"):
    """Host → Guest: the manifest (paths, sizes, SHA-256) and the total in bytes."""

    files: list[UiManifestFile]
    total_bytes: int


class UiArtifactFile(_Frame, tag="_ui_artifact_file"):
    """Host → Guest: one chunk of one file (``data`` is base64 on the wire)."""

    path: str
    offset: int
    data: bytes


class UiArtifactEnd(_Frame, tag="_ui_artifact_end"):
    """Host → Guest: every file was sent."""


class UiArtifactAck(_Frame, tag="_ui_artifact_ack"):
    """Guest → Host: the bundle verified (paths, sizes, hashes, index.html)."""


class UiArtifactError(_Frame, tag="_ui_artifact_error"):
    """Either side: the UI branch failed with a stable code; the handshake continues
    without a UI."""

    code: str
    message: str


SystemFrame = Union[SessionInit, SessionProof, SessionReady, SessionReject, Error, Ping, Pong,
                    UiArtifactRequest, UiArtifactBegin, UiArtifactFile, UiArtifactEnd, UiArtifactAck,
                    UiArtifactError]
SYSTEM_ACTIONS = frozenset({"_session_init", "_session_proof", "_session_ready", "_session_reject",
                            "_error", "_ping", "_pong", "_ui_artifact_request", "_ui_artifact_begin",
                            "_ui_artifact_file", "_ui_artifact_end", "_ui_artifact_ack",
                            "_ui_artifact_error"})


def decode_system(obj: dict[str, Any]) -> SystemFrame:
    """Convert a decoded frame whose action starts with ``_`` into its struct.

    Raises:
        ProtocolViolation: ``message-undeclared-action`` for an unknown system action.
        HandshakeError: ``handshake-malformed`` for wrong or missing fields.
    """
    if obj.get("action") not in SYSTEM_ACTIONS:
        raise ProtocolViolation("message-undeclared-action", "unknown system frame")
    try:
        return msgspec.convert(obj, SystemFrame)
    except msgspec.ValidationError as exc:
        raise HandshakeError("handshake-malformed", f"{obj['action']}: {exc}") from None


def to_dict(frame: SystemFrame) -> dict[str, Any]:
    """A system frame as a JSON-ready dict (with its ``action``)."""
    return msgspec.to_builtins(frame)
