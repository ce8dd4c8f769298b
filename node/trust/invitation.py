"""Invitations: what a Host publishes and what ``kith join`` verifies (DESIGN §5).

Schema: ``specs/invitation.schema.json``. The host signs the transport-binding payload
(DESIGN §4) over ``host_public_key``, ``transport``, ``transport_info.ticket``,
``protocol.protocol_id`` and ``expires_at``; :func:`verify_invitation` checks it *before*
the ticket is parsed, so a tampered ticket fails as a bad signature.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import msgspec

from node.common.errors import InvitationError, SigningError
from node.trust.identity import Identity
from node.trust.signing import (
    PUBLIC_KEY_HEX_LEN,
    SHA256_HEX_LEN,
    SIGNATURE_HEX_LEN,
    check_hex,
    transport_binding_payload,
    verify,
)

INVITATION_VERSION = 1
POST_ID_RE = re.compile(r"[A-Za-z0-9_-]{8,64}")
MAX_INVITATION_BYTES = 64 * 1024
DEFAULT_TTL_S = 24 * 3600


class ProtocolRef(msgspec.Struct, forbid_unknown_fields=True):
    """``protocol`` object: name, version and ``protocol_id`` (SHA-256 hex of the spec)."""

    name: str
    version: str
    protocol_id: str


class TransportInfo(msgspec.Struct, forbid_unknown_fields=True):
    """``transport_info``: ``version`` 1, ``endpoint_id`` (= host key), iroh ``ticket``."""

    version: int
    endpoint_id: str
    ticket: str


class Invitation(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """An invitation document (DESIGN §5; ``specs/invitation.schema.json``)."""

    invitation_version: int
    post_id: str
    protocol: ProtocolRef
    host_public_key: str
    transport: str
    transport_info: TransportInfo
    transport_binding_signature: str
    created_at: str
    expires_at: str
    iroh_ticket: str | None = None
    message: str | None = None
    tags: list[str] = msgspec.field(default_factory=list)
    max_sessions: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The invitation as a JSON-ready dict."""
        return msgspec.to_builtins(self)

    def binding_payload(self) -> bytes:
        """The transport-binding payload built from this invitation's fields (DESIGN §4)."""
        return transport_binding_payload(
            host_public_key=self.host_public_key, transport=self.transport,
            ticket=self.transport_info.ticket, protocol_id=self.protocol.protocol_id,
            expires_at=self.expires_at,
        )


def rfc3339(dt: datetime) -> str:
    """Format an aware datetime as RFC 3339 UTC with a ``Z`` suffix, second precision."""
    return dt.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: str) -> datetime:
    """Parse an RFC 3339 timestamp that carries a zone (``Z`` or ``±HH:MM``).

    Raises:
        ValueError: if it is not RFC 3339 with an explicit zone.
    """
    if not isinstance(value, str) or not re.fullmatch(
            r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", value):
        raise ValueError("not RFC 3339")
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def new_post_id() -> str:
    """A random ``post_id`` for file mode: 32 lowercase hex characters."""
    return secrets.token_hex(16)


def create_invitation(identity: Identity, *, protocol_name: str, protocol_version: str,
                      protocol_id: str, ticket: str, post_id: str | None = None,
                      ttl_s: int = DEFAULT_TTL_S, message: str | None = None,
                      tags: list[str] | None = None, max_sessions: int | None = None,
                      now: datetime | None = None) -> Invitation:
    """Build and sign an invitation for this host.

    Args:
        identity: the host identity; its public key is the endpoint id.
        ticket: the iroh ``EndpointTicket`` string of the bound endpoint.
        post_id: the server-assigned id, or None to assign a random one (file mode).
        ttl_s: seconds until ``expires_at``.

    Returns:
        A signed :class:`Invitation` (``iroh_ticket`` mirrors ``transport_info.ticket``).
    """
    now = now or datetime.now(timezone.utc)
    inv = Invitation(
        invitation_version=INVITATION_VERSION,
        post_id=post_id or new_post_id(),
        protocol=ProtocolRef(protocol_name, protocol_version, protocol_id),
        host_public_key=identity.public_key,
        transport="iroh",
        transport_info=TransportInfo(1, identity.public_key, ticket),
        transport_binding_signature="",
        created_at=rfc3339(now),
        expires_at=rfc3339(now + timedelta(seconds=ttl_s)),
        iroh_ticket=ticket,
        message=message,
        tags=list(tags or []),
        max_sessions=max_sessions,
    )
    inv.transport_binding_signature = identity.sign(inv.binding_payload())
    return inv


def parse_invitation(data: bytes | str | dict[str, Any]) -> Invitation:
    """Decode an invitation document (bytes, JSON text or an already-decoded dict).

    Structure only: signatures, expiry and protocol are checked by :func:`verify_invitation`.

    Raises:
        InvitationError: ``invitation-malformed`` (bad JSON, unknown or missing fields,
            wrong types, oversize, bad post_id or version).
    """
    try:
        if isinstance(data, dict):
            inv = msgspec.convert(data, Invitation)
        else:
            raw = data.encode("utf-8") if isinstance(data, str) else data
            if len(raw) > MAX_INVITATION_BYTES:
                raise InvitationError("invitation-malformed", "invitation is larger than 64 KiB")
            inv = msgspec.json.decode(raw, type=Invitation)
    except msgspec.ValidationError as exc:
        raise InvitationError("invitation-malformed", f"invitation: {exc}") from None
    except msgspec.DecodeError:
        raise InvitationError("invitation-malformed", "invitation is not valid JSON") from None
    if inv.invitation_version != INVITATION_VERSION:
        raise InvitationError("invitation-malformed",
                              f"unsupported invitation_version {inv.invitation_version}")
    if not POST_ID_RE.fullmatch(inv.post_id):
        raise InvitationError("invitation-malformed", "post_id must be 8-64 of [A-Za-z0-9_-]")
    if inv.transport != "iroh" or inv.transport_info.version != 1:
        raise InvitationError("invitation-malformed", "transport must be iroh, version 1")
    return inv


def check_binding(inv: Invitation) -> None:
    """The checks every verifier of an invitation makes first (``kith join`` and the
    community server alike), in this order: strict lowercase hex of the exact length for
    keys, signature and protocol id; the transport binding signature (DESIGN §4) over
    ``transport_info.ticket``; ``iroh_ticket`` equal to ``transport_info.ticket`` when
    present. The ticket itself is not parsed here.

    Raises:
        InvitationError: ``invitation-bad-hex``, ``invitation-bad-signature``,
            ``invitation-ticket-mismatch``.
    """
    try:
        check_hex(inv.host_public_key, PUBLIC_KEY_HEX_LEN, "host_public_key")
        check_hex(inv.transport_info.endpoint_id, PUBLIC_KEY_HEX_LEN, "transport_info.endpoint_id")
        check_hex(inv.transport_binding_signature, SIGNATURE_HEX_LEN, "transport_binding_signature")
        check_hex(inv.protocol.protocol_id, SHA256_HEX_LEN, "protocol.protocol_id")
    except SigningError as exc:
        raise InvitationError("invitation-bad-hex", exc.message) from None
    try:
        verify(inv.host_public_key, inv.binding_payload(), inv.transport_binding_signature,
               field="transport_binding_signature")
    except SigningError:
        raise InvitationError("invitation-bad-signature",
                              "the invitation's transport binding signature does not verify "
                              "(the ticket or another signed field was changed)") from None
    if inv.iroh_ticket is not None and inv.iroh_ticket != inv.transport_info.ticket:
        raise InvitationError("invitation-ticket-mismatch")


def verify_invitation(inv: Invitation, *, ticket_endpoint_id: Callable[[str], str],
                      local_protocol_id: str | None, now: datetime | None = None) -> None:
    """Run every check ``kith join`` needs before connecting (DESIGN §5), in this order.

    Args:
        ticket_endpoint_id: parses an iroh ticket and returns its endpoint id (64 hex);
            raises ``ValueError`` on a bad ticket. Called only after the signature verified.
        local_protocol_id: ``protocol_id`` of the local protocol with the invitation's
            name, or None if there is no such protocol.

    Raises:
        InvitationError: ``invitation-bad-hex``, ``invitation-bad-signature``,
            ``invitation-ticket-mismatch``, ``invitation-bad-ticket``,
            ``invitation-endpoint-mismatch``, ``invitation-expired``,
            ``invitation-unknown-protocol``, ``invitation-protocol-mismatch``.
    """
    check_binding(inv)
    try:
        ticket_id = ticket_endpoint_id(inv.transport_info.ticket)
    except ValueError:
        raise InvitationError("invitation-bad-ticket") from None
    if not (ticket_id == inv.transport_info.endpoint_id == inv.host_public_key):
        raise InvitationError("invitation-endpoint-mismatch")
    try:
        expires = parse_rfc3339(inv.expires_at)
    except ValueError:
        raise InvitationError("invitation-malformed", "expires_at is not RFC 3339") from None
    if expires <= (now or datetime.now(timezone.utc)):
        raise InvitationError("invitation-expired", f"the invitation expired at {inv.expires_at}")
    if local_protocol_id is None:
        raise InvitationError("invitation-unknown-protocol",
                              f"protocol {inv.protocol.name!r} is not installed here")
    if local_protocol_id != inv.protocol.protocol_id:
        raise InvitationError("invitation-protocol-mismatch",
                              f"protocol {inv.protocol.name!r} here has a different protocol_id "
                              "than the host's")
