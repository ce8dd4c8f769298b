"""Domain-separated, line-based signed payloads (DESIGN §4).

A payload is a domain tag line followed by fixed ``label:value`` lines in a fixed order,
joined by ``\\n`` and encoded as UTF-8. It is never JSON canonicalisation. Values are
validated *before* building: no ``\\n`` (or ``\\r``) inside a value; keys, signatures and
nonces are strict lowercase hex of the exact length (no uppercase, whitespace or ``0x``).

Signatures are Ed25519 (pynacl) as 128 lowercase hex characters.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Callable

import nacl.exceptions
import nacl.signing

from node.common.errors import SigningError

PUBLIC_KEY_HEX_LEN = 64
SIGNATURE_HEX_LEN = 128
NONCE_HEX_LEN = 64
SHA256_HEX_LEN = 64

TAG_TRANSPORT_BINDING = "kith-transport-binding-v1"
TAG_SESSION = "kith-session-v1"
TAG_SESSION_HOST = "kith-session-host-v1"
TAG_SESSION_GUEST = "kith-session-guest-v1"
TAG_REQUEST = "kith-request-v1"
#: People and devices (specs/peers.md §9): each statement has its own domain, so a device
#: binding can never stand for a successor or a recovery statement, nor for a session.
TAG_DEVICE_BINDING = "kith-device-binding-v1"
TAG_PERSON_SUCCESSOR = "kith-person-successor-v1"
TAG_PERSON_RECOVERY = "kith-person-recovery-v1"
#: A rotation signed by the recovery key (the person key's device was lost; specs/peers.md §11).
TAG_PERSON_RECOVERY_ROTATION = "kith-person-recovery-rotation-v1"
#: A person's list of revoked (stolen, lost) device keys (specs/peers.md §10).
TAG_DEVICE_REVOCATION = "kith-device-revocation-v1"
#: A host's signed citation of one served result (specs/signed-payloads.md §4): its own
#: domain, so a citation signature never stands for a session, a request or a binding.
TAG_CITATION = "kith-citation-v1"
#: A hosting device's card: how to reach it and what it shares in public totals
#: (specs/signed-payloads.md §3b), signed by the device key its binding chain binds.
TAG_DEVICE_CARD = "kith-device-card-v1"
#: A device card that names where its host takes sealed questions (specs/sealed.md §6): the
#: v1 lines plus the holders, in their own domain so a v1 signature never stands for a v2 card.
TAG_DEVICE_CARD_V2 = "kith-device-card-v2"
#: A sealed question or answer, signed by its sender's device key (specs/sealed.md §2).
TAG_SEALED_RECORD = "kith-sealed-record-v1"
#: Every domain tag above: a verifier names a signature made for another of them.
DOMAIN_TAGS = (TAG_TRANSPORT_BINDING, TAG_SESSION, TAG_SESSION_HOST, TAG_SESSION_GUEST,
               TAG_REQUEST, TAG_DEVICE_BINDING, TAG_PERSON_SUCCESSOR, TAG_PERSON_RECOVERY,
               TAG_PERSON_RECOVERY_ROTATION, TAG_DEVICE_REVOCATION, TAG_CITATION, TAG_DEVICE_CARD,
               TAG_DEVICE_CARD_V2, TAG_SEALED_RECORD)

_HEX_RE = {n: re.compile(rf"[0-9a-f]{{{n}}}") for n in (64, 128)}


def check_hex(value: object, length: int, field: str) -> str:
    """Return ``value`` if it is strict lowercase hex of exactly ``length`` characters.

    Raises:
        SigningError: ``bad-hex`` naming ``field`` (uppercase, whitespace, ``0x``, wrong
            length or a non-string all fail).
    """
    pattern = _HEX_RE.get(length) or re.compile(rf"[0-9a-f]{{{length}}}")
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise SigningError("bad-hex", f"{field} must be {length} lowercase hex characters")
    return value


def new_nonce() -> str:
    """Return a fresh 32-byte random nonce as 64 lowercase hex characters."""
    return secrets.token_hex(32)


def sha256_hex(data: bytes) -> str:
    """SHA-256 of ``data`` as 64 lowercase hex characters."""
    return hashlib.sha256(data).hexdigest()


def _line_value(value: object, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SigningError("bad-payload-value", f"{field} must be a string")
    text = str(value)
    if "\n" in text or "\r" in text:
        raise SigningError("bad-payload-value", f"{field} must not contain a line break")
    return text


def build_payload(tag: str, fields: list[tuple[str, object]]) -> bytes:
    """Build ``tag\\nlabel:value\\n...`` (no trailing newline) as UTF-8 bytes.

    Raises:
        SigningError: ``bad-payload-value`` if a value contains a line break.
    """
    lines = [tag] + [f"{label}:{_line_value(value, label)}" for label, value in fields]
    return "\n".join(lines).encode("utf-8")


def transport_binding_payload(*, host_public_key: str, transport: str, ticket: str,
                              protocol_id: str, expires_at: str) -> bytes:
    """The transport-binding payload an invitation's host signs (DESIGN §4).

    Lines: ``kith-transport-binding-v1``, ``host_public_key``, ``transport``, ``ticket``,
    ``protocol_id``, ``expires_at`` (RFC 3339 UTC).

    Raises:
        SigningError: ``bad-hex`` for a malformed key or protocol id, ``bad-payload-value``
            for a value with a line break.
    """
    check_hex(host_public_key, PUBLIC_KEY_HEX_LEN, "host_public_key")
    check_hex(protocol_id, SHA256_HEX_LEN, "protocol_id")
    return build_payload(TAG_TRANSPORT_BINDING, [
        ("host_public_key", host_public_key), ("transport", transport), ("ticket", ticket),
        ("protocol_id", protocol_id), ("expires_at", expires_at),
    ])


def session_payload(*, post_id: str, protocol_id: str, host_public_key: str,
                    guest_public_key: str, guest_nonce: str, host_nonce: str) -> bytes:
    """The session canonical payload (DESIGN §4); ``session_id`` is its SHA-256 hex.

    Raises:
        SigningError: ``bad-hex`` for malformed keys/nonces/protocol id.
    """
    check_hex(protocol_id, SHA256_HEX_LEN, "protocol_id")
    check_hex(host_public_key, PUBLIC_KEY_HEX_LEN, "host_public_key")
    check_hex(guest_public_key, PUBLIC_KEY_HEX_LEN, "guest_public_key")
    check_hex(guest_nonce, NONCE_HEX_LEN, "guest_nonce")
    check_hex(host_nonce, NONCE_HEX_LEN, "host_nonce")
    return build_payload(TAG_SESSION, [
        ("post_id", post_id), ("protocol_id", protocol_id),
        ("host_public_key", host_public_key), ("guest_public_key", guest_public_key),
        ("guest_nonce", guest_nonce), ("host_nonce", host_nonce),
    ])


def session_id_of(payload: bytes) -> str:
    """``session_id`` = SHA-256 hex of the session payload bytes."""
    return sha256_hex(payload)


def role_message(role: str, payload: bytes) -> bytes:
    """The bytes a session participant signs: its role tag line, then the payload.

    ``role`` is ``host`` or ``guest``; the tags differ so one signature can never stand
    for the other (DESIGN §4).
    """
    tag = {"host": TAG_SESSION_HOST, "guest": TAG_SESSION_GUEST}[role]
    return tag.encode() + b"\n" + payload


def request_payload(*, method: str, path: str, timestamp: int, nonce: str, body: bytes) -> bytes:
    """The signed-REST-request payload (DESIGN §4): method, path with query, integer Unix
    seconds, request nonce, SHA-256 hex of the body.

    Raises:
        SigningError: ``bad-hex`` for a malformed nonce, ``bad-payload-value`` otherwise.
    """
    check_hex(nonce, NONCE_HEX_LEN, "nonce")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise SigningError("bad-payload-value", "timestamp must be an integer")
    return build_payload(TAG_REQUEST, [
        ("method", method.upper()), ("path", path), ("timestamp", str(timestamp)),
        ("nonce", nonce), ("body_sha256", sha256_hex(body)),
    ])


def _check_seq(seq: object) -> str:
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2 ** 53:
        raise SigningError("bad-payload-value", "seq must be an integer from 0 to 2^53 - 1")
    return str(seq)


def device_binding_payload(*, person_key: str, device_key: str, device_name: str, created: str,
                           seq: int) -> bytes:
    """What a person key signs to bind one device key (specs/peers.md §9).

    Lines: ``kith-device-binding-v1``, ``person_key``, ``device_key``, ``device_name``,
    ``created`` (RFC 3339 UTC), ``seq`` (decimal, 0 ≤ seq < 2^53).

    Raises:
        SigningError: ``bad-hex`` for a malformed key, ``bad-payload-value`` for a line
            break or a bad ``seq``.
    """
    check_hex(person_key, PUBLIC_KEY_HEX_LEN, "person_key")
    check_hex(device_key, PUBLIC_KEY_HEX_LEN, "device_key")
    return build_payload(TAG_DEVICE_BINDING, [
        ("person_key", person_key), ("device_key", device_key), ("device_name", device_name),
        ("created", created), ("seq", _check_seq(seq)),
    ])


def person_successor_payload(*, person_key: str, successor_key: str, created: str, seq: int) -> bytes:
    """What a person key signs to name its successor (a rotation, specs/peers.md §9).

    Lines: ``kith-person-successor-v1``, ``person_key`` (the old key, the signer),
    ``successor_key``, ``created`` (RFC 3339 UTC), ``seq``.

    Raises:
        SigningError: as :func:`device_binding_payload`.
    """
    check_hex(person_key, PUBLIC_KEY_HEX_LEN, "person_key")
    check_hex(successor_key, PUBLIC_KEY_HEX_LEN, "successor_key")
    return build_payload(TAG_PERSON_SUCCESSOR, [
        ("person_key", person_key), ("successor_key", successor_key), ("created", created),
        ("seq", _check_seq(seq)),
    ])


def person_recovery_payload(*, person_key: str, recovery_key: str, created: str) -> bytes:
    """What a person key signs at ``kith init`` to name the public half of its recovery
    secret (the key that may later sign a rotation when the person key is lost).

    Lines: ``kith-person-recovery-v1``, ``person_key``, ``recovery_key``, ``created``.

    Raises:
        SigningError: as :func:`device_binding_payload`.
    """
    check_hex(person_key, PUBLIC_KEY_HEX_LEN, "person_key")
    check_hex(recovery_key, PUBLIC_KEY_HEX_LEN, "recovery_key")
    return build_payload(TAG_PERSON_RECOVERY, [
        ("person_key", person_key), ("recovery_key", recovery_key), ("created", created),
    ])


def citation_payload(*, host_public_key: str, source: str, version: str, span: str,
                     text_sha256: str, signed_at: str, tag: str = TAG_CITATION) -> bytes:
    """What a host signs for one served result (specs/signed-payloads.md §4).

    Lines: ``kith-citation-v1``, ``host_public_key``, ``source`` (the source id sent),
    ``version`` (the keyed document version, 64 hex), ``span`` (its canonical text,
    :func:`node.answer.citation.span_text`), ``text_sha256`` (of the exact evidence text
    sent, UTF-8), ``signed_at`` (RFC 3339 UTC). ``tag`` is only for a verifier naming a
    signature made in another domain; signers never pass it.

    Raises:
        SigningError: ``bad-hex`` for a malformed key, version or digest,
            ``bad-payload-value`` for a value with a line break.
    """
    check_hex(host_public_key, PUBLIC_KEY_HEX_LEN, "host_public_key")
    check_hex(version, SHA256_HEX_LEN, "version")
    check_hex(text_sha256, SHA256_HEX_LEN, "text_sha256")
    return build_payload(tag, [
        ("host_public_key", host_public_key), ("source", source), ("version", version),
        ("span", span), ("text_sha256", text_sha256), ("signed_at", signed_at),
    ])


def person_recovery_rotation_payload(*, person_key: str, recovery_key: str, successor_key: str,
                                     created: str, seq: int) -> bytes:
    """What the recovery key signs to name a successor of the person key it was vouched for
    by (a rotation when the person key is lost, specs/peers.md §11).

    Lines: ``kith-person-recovery-rotation-v1``, ``person_key`` (the old key, *not* the
    signer), ``recovery_key`` (the signer), ``successor_key``, ``created`` (RFC 3339 UTC),
    ``seq``.

    Raises:
        SigningError: as :func:`device_binding_payload`.
    """
    check_hex(person_key, PUBLIC_KEY_HEX_LEN, "person_key")
    check_hex(recovery_key, PUBLIC_KEY_HEX_LEN, "recovery_key")
    check_hex(successor_key, PUBLIC_KEY_HEX_LEN, "successor_key")
    return build_payload(TAG_PERSON_RECOVERY_ROTATION, [
        ("person_key", person_key), ("recovery_key", recovery_key), ("successor_key", successor_key),
        ("created", created), ("seq", _check_seq(seq)),
    ])


def device_revocation_payload(*, person_key: str, created: str, seq: int, revoked: list[str]) -> bytes:
    """What a person key signs to revoke devices (specs/peers.md §10).

    Lines: ``kith-device-revocation-v1``, ``person_key``, ``created`` (RFC 3339 UTC),
    ``seq`` (decimal, 0 ≤ seq < 2^53; a newer list has a larger one), ``count`` (how many
    keys follow), then one ``revoked`` line per device key, in the list's order.

    Raises:
        SigningError: ``bad-hex`` for a malformed key, ``bad-payload-value`` for a line
            break or a bad ``seq``.
    """
    check_hex(person_key, PUBLIC_KEY_HEX_LEN, "person_key")
    for key in revoked:
        check_hex(key, PUBLIC_KEY_HEX_LEN, "revoked")
    return build_payload(TAG_DEVICE_REVOCATION, [
        ("person_key", person_key), ("created", created), ("seq", _check_seq(seq)), ("count", str(len(revoked))),
        *(("revoked", key) for key in revoked),
    ])


def device_card_payload(*, person_key: str, device_key: str, device_name: str, post_id: str, ticket: str,
                        expires_at: str, documents: int, chunks: int, created: str, seq: int,
                        mailboxes: list[str] | None = None) -> bytes:
    """What a hosting device signs as its card (specs/signed-payloads.md §3b).

    Lines: ``kith-device-card-v1``, ``person_key``, ``device_key``, ``device_name``,
    ``post_id``, ``ticket_sha256`` (SHA-256 of the ticket's UTF-8, hex), ``expires_at``
    (the invitation's), ``documents``, ``chunks`` (public totals, decimal), ``created``
    (RFC 3339 UTC), ``seq`` (decimal, 0 ≤ seq < 2^53; a newer card has a larger one).
    With ``mailboxes`` (card format 2, specs/sealed.md §6) the tag is
    ``kith-device-card-v2`` and ``count`` and one ``mailbox`` line per URL follow.

    Raises:
        SigningError: ``bad-hex`` for a malformed key, ``bad-payload-value`` for a line
            break, a bad ``seq`` or a negative total.
    """
    check_hex(person_key, PUBLIC_KEY_HEX_LEN, "person_key")
    check_hex(device_key, PUBLIC_KEY_HEX_LEN, "device_key")
    for label, n in (("documents", documents), ("chunks", chunks)):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2 ** 53:
            raise SigningError("bad-payload-value", f"{label} must be an integer from 0 to 2^53 - 1")
    lines: list[tuple[str, object]] = [
        ("person_key", person_key), ("device_key", device_key), ("device_name", device_name),
        ("post_id", post_id), ("ticket_sha256", sha256_hex(ticket.encode("utf-8"))), ("expires_at", expires_at),
        ("documents", str(documents)), ("chunks", str(chunks)), ("created", created), ("seq", _check_seq(seq)),
    ]
    if mailboxes is None:
        return build_payload(TAG_DEVICE_CARD, lines)
    return build_payload(TAG_DEVICE_CARD_V2, [*lines, ("count", str(len(mailboxes))),
                                              *(("mailbox", url) for url in mailboxes)])


def public_key_of(secret_seed: bytes) -> str:
    """The Ed25519 public key (64 lowercase hex) of a 32-byte seed."""
    return nacl.signing.SigningKey(secret_seed).verify_key.encode().hex()


def sign(secret_seed: bytes, message: bytes) -> str:
    """Sign ``message`` with the 32-byte Ed25519 seed; return 128 lowercase hex."""
    return nacl.signing.SigningKey(secret_seed).sign(message).signature.hex()


def signer_of(secret_seed: bytes) -> Callable[[bytes], str]:
    """``message → signature`` (128 lowercase hex) with the 32-byte seed's key expanded
    once: what a signer of many messages (citations, one per result) uses instead of
    :func:`sign`."""
    key = nacl.signing.SigningKey(secret_seed)
    return lambda message: key.sign(message).signature.hex()


def verify(public_key: str, message: bytes, signature: str, *, field: str = "signature") -> None:
    """Verify an Ed25519 ``signature`` (128 hex) over ``message`` by ``public_key`` (64 hex).

    Raises:
        SigningError: ``bad-hex`` if key or signature is not strict hex of the exact length;
            ``bad-signature`` if it does not verify.
    """
    check_hex(public_key, PUBLIC_KEY_HEX_LEN, "public key")
    check_hex(signature, SIGNATURE_HEX_LEN, field)
    try:
        nacl.signing.VerifyKey(bytes.fromhex(public_key)).verify(message, bytes.fromhex(signature))
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
        raise SigningError("bad-signature", f"{field} does not verify") from None
