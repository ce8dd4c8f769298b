"""Binding chains: the signed statements that tie a device key to a person key
(specs/peers.md §9). Pure functions over dicts — no I/O, so the session engine may use them.

A chain is a JSON list of at most :data:`MAX_CHAIN_LINKS` links, oldest first. Every link
but the last is a *successor* link (a person key naming the key that replaces it, a
rotation) or a *recovery* link (the same, signed by the person's recovery key, which the
old person key vouched for in the link's recovery statement); the last is the *device* link (the current person key binding this device's
key). Each link is signed by its ``person_key`` over its own domain-separated payload
(:func:`node.trust.signing.device_binding_payload`,
:func:`node.trust.signing.person_successor_payload`). A chain proves: the device key was
bound by the person key that signed the last link, and that key descends from the first
link's key through the successor links. It does not prove that the person key is the one a
host pinned — that is the host's registry's question (:func:`node.trust.peers.person_pin`,
specs/peers.md §10) — nor that the device was not revoked (:mod:`node.trust.revocation_list`).

Wire shape of one link (exact fields, strict lowercase hex, exact lengths)::

    {"type": "device", "person_key": hex64, "device_key": hex64, "device_name": str,
     "created": "YYYY-MM-DDTHH:MM:SSZ", "seq": int, "signature": hex128}
    {"type": "successor", "person_key": hex64, "successor_key": hex64,
     "created": "...Z", "seq": int, "signature": hex128}
    {"type": "recovery", "person_key": hex64, "recovery_key": hex64,
     "recovery_created": "...Z", "recovery_signature": hex128, "successor_key": hex64,
     "created": "...Z", "seq": int, "signature": hex128}
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable

from node.common.errors import HandshakeError, KithError, SigningError
from node.trust.signing import (
    PUBLIC_KEY_HEX_LEN,
    SIGNATURE_HEX_LEN,
    check_hex,
    device_binding_payload,
    person_recovery_payload,
    person_recovery_rotation_payload,
    person_successor_payload,
    public_key_of,
    sign,
    verify,
)

#: The most links a chain may have (DESIGN §16: checked before any signature is).
MAX_CHAIN_LINKS = 4
#: The longest device name, in characters.
MAX_DEVICE_NAME = 64

_CREATED_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_DEVICE_FIELDS = frozenset({"type", "person_key", "device_key", "device_name", "created", "seq", "signature"})
_SUCCESSOR_FIELDS = frozenset({"type", "person_key", "successor_key", "created", "seq", "signature"})
_RECOVERY_FIELDS = _SUCCESSOR_FIELDS | {"recovery_key", "recovery_created", "recovery_signature"}
#: How a rotation link was signed (:attr:`PersonIdentity.rotations`).
VIA_PERSON, VIA_RECOVERY = "person", "recovery"


@dataclass(frozen=True)
class PersonIdentity:
    """Who a verified chain says the peer is.

    Attributes:
        person: the person key that signed the device binding (64 hex).
        device: the device key (64 hex; equals the QUIC remote id).
        device_name: the name the person gave this device.
        earlier: older person keys the chain descends from, oldest first (empty without
            a rotation).
        seq: the device binding's sequence number.
        rotations: the chain's rotation links as ``(old_key, successor_key, via)``, oldest
            first; ``via`` is :data:`VIA_PERSON` (signed by the old key) or
            :data:`VIA_RECOVERY` (signed by its recovery key).
    """

    person: str
    device: str
    device_name: str
    earlier: tuple[str, ...] = ()
    seq: int = 0
    rotations: tuple[tuple[str, str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON shape: ``{"person", "device", "device_name", "earlier": [...], "seq"}``."""
        return {"person": self.person, "device": self.device, "device_name": self.device_name,
                "earlier": list(self.earlier), "seq": self.seq}


def check_device_name(name: object) -> str:
    """Return ``name`` if it is a usable device name: 1–64 characters, no control or
    separator-line characters, no leading/trailing space.

    Raises:
        SigningError: ``bad-payload-value``.
    """
    if (not isinstance(name, str) or not 1 <= len(name) <= MAX_DEVICE_NAME or name != name.strip()
            or any(unicodedata.category(c)[0] == "C" or c in "\u2028\u2029" for c in name)):
        raise SigningError("bad-payload-value",
                           f"a device name is 1 to {MAX_DEVICE_NAME} printable characters")
    return name


def _malformed(message: str) -> HandshakeError:
    return HandshakeError("handshake-binding-malformed", message)


def _check_link(link: object, last: bool, i: int) -> dict[str, Any]:
    if not isinstance(link, dict):
        raise _malformed(f"link {i} is not an object")
    kind = link.get("type")
    if last and kind != "device":
        raise _malformed(f"link {i} must be a device link")
    if not last and kind not in ("successor", "recovery"):
        raise _malformed(f"link {i} must be a successor or recovery link")
    fields = _DEVICE_FIELDS if last else _RECOVERY_FIELDS if kind == "recovery" else _SUCCESSOR_FIELDS
    if set(link) != fields:
        raise _malformed(f"link {i} must have exactly the fields {sorted(fields)}")
    try:
        check_hex(link["person_key"], PUBLIC_KEY_HEX_LEN, "person_key")
        check_hex(link["device_key" if last else "successor_key"], PUBLIC_KEY_HEX_LEN,
                  "device_key" if last else "successor_key")
        check_hex(link["signature"], SIGNATURE_HEX_LEN, "signature")
        if last:
            check_device_name(link["device_name"])
        if kind == "recovery":
            check_hex(link["recovery_key"], PUBLIC_KEY_HEX_LEN, "recovery_key")
            check_hex(link["recovery_signature"], SIGNATURE_HEX_LEN, "recovery_signature")
    except SigningError as exc:
        raise _malformed(f"link {i}: {exc.message}") from None
    for key in ("created", "recovery_created") if kind == "recovery" else ("created",):
        if not isinstance(link[key], str) or _CREATED_RE.fullmatch(link[key]) is None:
            raise _malformed(f"link {i}: {key} must be RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)")
    seq = link["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2 ** 53:
        raise _malformed(f"link {i}: seq must be an integer from 0 to 2^53 - 1")
    return link


def check_link(link: object, last: bool, i: int) -> dict[str, Any]:
    """Check one link's shape (exact fields, strict hex, dates, seq) — no signature.

    Args:
        last: True for the device link, False for a rotation (successor / recovery) link.
        i: its index (named in the message).

    Raises:
        HandshakeError: ``handshake-binding-malformed``.
    """
    return _check_link(link, last, i)


def link_payload(link: dict[str, Any]) -> bytes:
    """The signed bytes of one (already shape-checked) link."""
    if link["type"] == "device":
        return device_binding_payload(person_key=link["person_key"], device_key=link["device_key"],
                                      device_name=link["device_name"], created=link["created"], seq=link["seq"])
    if link["type"] == "recovery":
        return person_recovery_rotation_payload(person_key=link["person_key"], recovery_key=link["recovery_key"],
                                                successor_key=link["successor_key"], created=link["created"],
                                                seq=link["seq"])
    return person_successor_payload(person_key=link["person_key"], successor_key=link["successor_key"],
                                    created=link["created"], seq=link["seq"])


def device_link(person_secret: bytes, device_key: str, device_name: str, created: str, seq: int) -> dict[str, Any]:
    """Sign a device link with the person key's 32-byte seed (wire shape above).

    Raises:
        SigningError: ``bad-hex`` / ``bad-payload-value`` for a malformed key, name or seq.
    """
    check_device_name(device_name)
    person_key = public_key_of(person_secret)
    link = {"type": "device", "person_key": person_key, "device_key": device_key, "device_name": device_name,
            "created": created, "seq": seq}
    return {**link, "signature": sign(person_secret, link_payload({**link, "signature": ""}))}


def successor_link(person_secret: bytes, successor_key: str, created: str, seq: int) -> dict[str, Any]:
    """Sign a successor (rotation) link with the old person key's seed (wire shape above).

    Raises:
        SigningError: ``bad-hex`` / ``bad-payload-value`` for a malformed key or seq.
    """
    link = {"type": "successor", "person_key": public_key_of(person_secret), "successor_key": successor_key,
            "created": created, "seq": seq}
    return {**link, "signature": sign(person_secret, link_payload({**link, "signature": ""}))}


def recovery_link(recovery_secret_seed: bytes, person_key: str, recovery_created: str, recovery_signature: str,
                  successor_key: str, created: str, seq: int) -> dict[str, Any]:
    """Sign a recovery (rotation) link with the recovery key's seed
    (:func:`node.trust.person.recovery_seed`): ``person_key`` is replaced by
    ``successor_key``. ``recovery_created`` / ``recovery_signature`` are the old person
    key's statement vouching for the recovery key (``person.json``), carried so a host can
    check it.

    Raises:
        SigningError: ``bad-hex`` / ``bad-payload-value`` for a malformed key or seq.
    """
    link = {"type": "recovery", "person_key": person_key, "recovery_key": public_key_of(recovery_secret_seed),
            "recovery_created": recovery_created, "recovery_signature": recovery_signature,
            "successor_key": successor_key, "created": created, "seq": seq}
    return {**link, "signature": sign(recovery_secret_seed, link_payload({**link, "signature": ""}))}


def verify_link(link: dict[str, Any], i: int = 0) -> None:
    """Verify one shape-checked link's signatures: its ``signature`` by its ``person_key``
    (a recovery link: first the person key's statement vouching for ``recovery_key``, then
    ``signature`` by that recovery key).

    Raises:
        HandshakeError: ``handshake-rotation-unknown-key`` (the recovery statement does not
            verify), ``handshake-binding-forged`` (the signature does not).
    """
    signer = link["person_key"]
    if link["type"] == "recovery":
        try:
            verify(signer, person_recovery_payload(person_key=signer, recovery_key=link["recovery_key"],
                                                   created=link["recovery_created"]),
                   link["recovery_signature"], field=f"link {i} recovery_signature")
        except SigningError:
            raise HandshakeError("handshake-rotation-unknown-key",
                                 f"link {i} is signed by a recovery key its person key never vouched for") from None
        signer = link["recovery_key"]
    try:
        verify(signer, link_payload(link), link["signature"], field=f"link {i} signature")
    except SigningError:
        raise HandshakeError("handshake-binding-forged", f"link {i}'s signature does not verify") from None


def verify_chain(chain: object, device_key: str, *, before_signatures: Callable[[], None] = lambda: None
                 ) -> PersonIdentity:
    """Verify a binding chain for ``device_key`` (the QUIC-authenticated remote id).

    Order (specs/session.md §4.3): the length first, then every link's shape and the
    chain's continuity, then ``before_signatures()`` (the handshake verifies the session
    signature there), then each link's signature.

    Returns:
        the :class:`PersonIdentity` the chain proves.

    Raises:
        HandshakeError: ``handshake-chain-too-long`` (more than 4 links),
            ``handshake-binding-malformed`` (not a list, empty, wrong fields or types,
            non-strict hex, a bad name or date), ``handshake-chain-gap`` (a rotation link
            from a key the previous link does not name), ``handshake-binding-wrong-person``
            (the device link signed by a key other than the one the last rotation names),
            ``handshake-chain-loop`` (a person key appears twice),
            ``handshake-binding-wrong-device`` (the device link binds another key),
            ``handshake-binding-forged`` (a link's signature does not verify),
            ``handshake-rotation-unknown-key`` (a recovery link signed by a recovery key
            its old person key never vouched for).
    """
    if not isinstance(chain, list):
        raise _malformed("binding_chain must be a list")
    if len(chain) > MAX_CHAIN_LINKS:
        raise HandshakeError("handshake-chain-too-long", f"a binding chain has at most {MAX_CHAIN_LINKS} links")
    if not chain:
        raise _malformed("binding_chain is empty")
    links = [_check_link(link, i == len(chain) - 1, i) for i, link in enumerate(chain)]
    seen: set[str] = set()
    for i, link in enumerate(links):
        if link["person_key"] in seen:
            raise HandshakeError("handshake-chain-loop", f"link {i} repeats a person key")
        seen.add(link["person_key"])
        if i and link["person_key"] != links[i - 1]["successor_key"]:
            if i == len(links) - 1:
                raise HandshakeError("handshake-binding-wrong-person",
                                     f"link {i} is signed by a key the chain does not lead to")
            raise HandshakeError("handshake-chain-gap", f"rotation link {i} starts from a key link {i - 1} does not name")
    device = links[-1]
    if device["device_key"] != device_key:
        raise HandshakeError("handshake-binding-wrong-device", "the binding is for another device key")
    before_signatures()
    for i, link in enumerate(links):
        verify_link(link, i)
    return PersonIdentity(person=device["person_key"], device=device_key, device_name=device["device_name"],
                          earlier=tuple(link["person_key"] for link in links[:-1]), seq=device["seq"],
                          rotations=tuple((link["person_key"], link["successor_key"],
                                           VIA_RECOVERY if link["type"] == "recovery" else VIA_PERSON)
                                          for link in links[:-1]))



def compact_size(doc: object) -> int:
    """Bytes of ``doc`` as compact UTF-8 JSON: what the size bounds of a person's signed
    documents (a device card, a revocation list) count."""
    return len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def check_bounded_object(doc: object, *, code: str, what: str, max_bytes: int) -> dict[str, Any]:
    """``doc`` when it is a JSON object of at most ``max_bytes`` (:func:`compact_size`):
    the first check of a signed document another node sent.

    Raises:
        KithError: ``code``, "<what> is a JSON object" or "<what> is at most N bytes".
    """
    if not isinstance(doc, dict):
        raise KithError(code, f"{what} is a JSON object")
    if compact_size(doc) > max_bytes:
        raise KithError(code, f"{what} is at most {max_bytes} bytes")
    return doc

__all__ = ["MAX_CHAIN_LINKS", "MAX_DEVICE_NAME", "PersonIdentity", "VIA_PERSON", "VIA_RECOVERY", "check_bounded_object",
           "check_device_name", "check_link", "compact_size",
           "device_link", "link_payload", "recovery_link", "successor_link", "verify_chain", "verify_link"]
