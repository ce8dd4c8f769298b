"""Binding chains: the signed statements that tie a device key to a person key
(specs/peers.md §9). Pure functions over dicts — no I/O, so the session engine may use them.

A chain is a JSON list of at most :data:`MAX_CHAIN_LINKS` links, oldest first. Every link
but the last is a *successor* link (a person key naming the key that replaces it, a
rotation); the last is the *device* link (the current person key binding this device's
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
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable

from node.common.errors import HandshakeError, SigningError
from node.trust.signing import (
    PUBLIC_KEY_HEX_LEN,
    SIGNATURE_HEX_LEN,
    check_hex,
    device_binding_payload,
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
    """

    person: str
    device: str
    device_name: str
    earlier: tuple[str, ...] = ()
    seq: int = 0

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
    want = "device" if last else "successor"
    if kind != want:
        raise _malformed(f"link {i} must be a {want} link")
    fields = _DEVICE_FIELDS if last else _SUCCESSOR_FIELDS
    if set(link) != fields:
        raise _malformed(f"link {i} must have exactly the fields {sorted(fields)}")
    try:
        check_hex(link["person_key"], PUBLIC_KEY_HEX_LEN, "person_key")
        check_hex(link["device_key" if last else "successor_key"], PUBLIC_KEY_HEX_LEN,
                  "device_key" if last else "successor_key")
        check_hex(link["signature"], SIGNATURE_HEX_LEN, "signature")
        if last:
            check_device_name(link["device_name"])
    except SigningError as exc:
        raise _malformed(f"link {i}: {exc.message}") from None
    if not isinstance(link["created"], str) or _CREATED_RE.fullmatch(link["created"]) is None:
        raise _malformed(f"link {i}: created must be RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)")
    seq = link["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2 ** 53:
        raise _malformed(f"link {i}: seq must be an integer from 0 to 2^53 - 1")
    return link


def link_payload(link: dict[str, Any]) -> bytes:
    """The signed bytes of one (already shape-checked) link."""
    if link["type"] == "device":
        return device_binding_payload(person_key=link["person_key"], device_key=link["device_key"],
                                      device_name=link["device_name"], created=link["created"], seq=link["seq"])
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
            non-strict hex, a bad name or date), ``handshake-binding-wrong-person`` (a link
            signed by a key other than the one the previous link names),
            ``handshake-chain-loop`` (a person key appears twice),
            ``handshake-binding-wrong-device`` (the device link binds another key),
            ``handshake-binding-forged`` (a link's signature does not verify).
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
            raise HandshakeError("handshake-binding-wrong-person",
                                 f"link {i} is signed by a key the chain does not lead to")
    device = links[-1]
    if device["device_key"] != device_key:
        raise HandshakeError("handshake-binding-wrong-device", "the binding is for another device key")
    before_signatures()
    for i, link in enumerate(links):
        try:
            verify(link["person_key"], link_payload(link), link["signature"], field=f"link {i} signature")
        except SigningError:
            raise HandshakeError("handshake-binding-forged", f"link {i}'s signature does not verify") from None
    return PersonIdentity(person=device["person_key"], device=device_key, device_name=device["device_name"],
                          earlier=tuple(link["person_key"] for link in links[:-1]), seq=device["seq"])


__all__ = ["MAX_CHAIN_LINKS", "MAX_DEVICE_NAME", "PersonIdentity", "check_device_name", "device_link",
           "link_payload", "successor_link", "verify_chain"]
