"""Revocation lists: a person's signed list of its revoked (stolen, lost) device keys, and
the store of the lists a home has seen (specs/peers.md §10).

A list is signed by the person key (``kith device revoke NAME``) over its own domain
(:func:`node.trust.signing.device_revocation_payload`); its ``seq`` only grows, and each new
list names every device the person revoked before (revoking one device never revokes the
others: only the keys named). Wire shape (exact fields, strict lowercase hex, at most
:data:`MAX_LIST_BYTES` of compact JSON, at most :data:`MAX_REVOKED` keys, no key twice)::

    {"type": "revocation", "person_key": hex64, "created": "YYYY-MM-DDTHH:MM:SSZ",
     "seq": int, "revoked": [hex64, ...], "signature": hex128}

The checks (:func:`check_list`) are pure, so the session engine uses them on a list carried
in ``_session_ready``. :class:`RevocationStore` is ``<home>/revocations.json`` (0600,
tmp+rename): per person key, the newest list seen and the union of every key any list of
that person revoked here (a newer list never un-revokes a key). The home's own person's list
is kept there too; it is what this device carries in its handshakes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from node.common.errors import ConfigError, KithError, SigningError
from node.common.home import atomic_write
from node.trust.signing import (
    PUBLIC_KEY_HEX_LEN,
    SIGNATURE_HEX_LEN,
    check_hex,
    device_revocation_payload,
    public_key_of,
    sign,
    verify,
)

REVOCATIONS_FILE = "revocations.json"
#: The largest list, as compact UTF-8 JSON (bytes): it travels in a handshake frame.
MAX_LIST_BYTES = 4096
#: The most device keys one list names (48 keys fit well inside :data:`MAX_LIST_BYTES`).
MAX_REVOKED = 48
#: The most persons whose lists one home keeps (the oldest received is dropped beyond).
MAX_PERSONS = 1024
STORE_VERSION = 1

_CREATED_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_FIELDS = frozenset({"type", "person_key", "created", "seq", "revoked", "signature"})


@dataclass(frozen=True)
class RevocationList:
    """A checked list (signature verified).

    Attributes:
        person: the person key that signed it (64 hex). seq: its sequence number.
        revoked: the device keys it revokes, in its order. doc: the wire object.
    """

    person: str
    seq: int
    revoked: tuple[str, ...]
    doc: dict[str, Any]


def list_size(doc: object) -> int:
    """Bytes of ``doc`` as compact UTF-8 JSON (what :data:`MAX_LIST_BYTES` bounds)."""
    return len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def check_list(doc: object, *, person: str | None = None) -> RevocationList:
    """Check a revocation list: size, then shape and strict hex, then (if ``person`` is
    given) that it is that person's, then the signature.

    Raises:
        KithError: ``revocation-malformed`` (not an object, larger than 4 KiB, wrong fields
            or types, non-strict hex, more than 48 keys, a key twice),
            ``revocation-wrong-person`` (signed by a person key other than ``person``),
            ``revocation-forged`` (the signature does not verify).
    """
    def bad(message: str) -> KithError:
        return KithError("revocation-malformed", message)

    if not isinstance(doc, dict):
        raise bad("a revocation list is a JSON object")
    if list_size(doc) > MAX_LIST_BYTES:
        raise bad(f"a revocation list is at most {MAX_LIST_BYTES} bytes")
    if set(doc) != _FIELDS or doc.get("type") != "revocation":
        raise bad(f"a revocation list has exactly the fields {sorted(_FIELDS)} and type 'revocation'")
    revoked, seq, created = doc["revoked"], doc["seq"], doc["created"]
    if not isinstance(revoked, list) or len(revoked) > MAX_REVOKED:
        raise bad(f"revoked is a list of at most {MAX_REVOKED} device keys")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2 ** 53:
        raise bad("seq must be an integer from 0 to 2^53 - 1")
    if not isinstance(created, str) or _CREATED_RE.fullmatch(created) is None:
        raise bad("created must be RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)")
    try:
        check_hex(doc["person_key"], PUBLIC_KEY_HEX_LEN, "person_key")
        check_hex(doc["signature"], SIGNATURE_HEX_LEN, "signature")
        for key in revoked:
            check_hex(key, PUBLIC_KEY_HEX_LEN, "revoked")
    except SigningError as exc:
        raise bad(exc.message) from None
    if len(set(revoked)) != len(revoked):
        raise bad("a device key appears twice in revoked")
    if person is not None and doc["person_key"] != person:
        raise KithError("revocation-wrong-person", "the revocation list is signed by another person key")
    payload = device_revocation_payload(person_key=doc["person_key"], created=created, seq=seq, revoked=revoked)
    try:
        verify(doc["person_key"], payload, doc["signature"], field="revocation signature")
    except SigningError:
        raise KithError("revocation-forged", "the revocation list's signature does not verify") from None
    return RevocationList(doc["person_key"], seq, tuple(revoked), dict(doc))


def make_list(person_secret: bytes, revoked: list[str], seq: int, created: str) -> dict[str, Any]:
    """Sign a revocation list with the person key's 32-byte seed (wire shape above).

    Raises:
        KithError: ``revocation-malformed`` when it would break a rule of :func:`check_list`
            (too many keys, a key twice); SigningError ``bad-hex`` for a malformed key.
    """
    person_key = public_key_of(person_secret)
    doc = {"type": "revocation", "person_key": person_key, "created": created, "seq": seq,
           "revoked": list(revoked)}
    doc["signature"] = sign(person_secret, device_revocation_payload(person_key=person_key, created=created,
                                                                     seq=seq, revoked=list(revoked)))
    check_list(doc)
    return doc


@dataclass
class Offered:
    """What :meth:`RevocationStore.offer` did with a list.

    Attributes:
        outcome: ``new`` (kept: no list of that person before, or a larger ``seq``),
            ``same`` (the list kept already), ``stale`` (an older ``seq`` than the one kept:
            ignored; the newer stays).
        newly_revoked: device keys revoked here by this list for the first time.
    """

    outcome: str
    newly_revoked: list[str]


class RevocationStore:
    """``<home>/revocations.json``: per person key, the newest list and every key revoked.

    File shape: ``{"version": 1, "persons": {"<person key>": {"list": <wire list>,
    "revoked": [<device keys>], "receivedAt": "<RFC 3339>", "via": "own" | "handshake" |
    "import" | "server"}}}``.
    """

    def __init__(self, path: Path, persons: dict[str, dict[str, Any]]) -> None:
        self.path = path
        self.persons = persons
        self._index()

    @classmethod
    def load(cls, home: Path) -> "RevocationStore":
        """Read the store (missing → empty); every list in it is checked again.

        Raises:
            ConfigError: ``config-invalid`` naming the file when it is not valid.
        """
        path = Path(home) / REVOCATIONS_FILE
        try:
            raw = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return cls(path, {})
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: "[[[[…"
            raise ConfigError("config-invalid", f"{REVOCATIONS_FILE} is not valid JSON") from None
        persons: dict[str, dict[str, Any]] = {}
        try:
            if raw.get("version") != STORE_VERSION:
                raise ValueError("unknown version")
            for person, rec in raw["persons"].items():
                checked = check_list(rec["list"], person=person)
                revoked = rec["revoked"]
                for key in revoked:
                    check_hex(key, PUBLIC_KEY_HEX_LEN, "revoked")
                if not set(checked.revoked) <= set(revoked):
                    raise ValueError("revoked lacks a key of its list")
                persons[person] = {"list": checked.doc, "revoked": list(revoked),
                                   "receivedAt": str(rec.get("receivedAt", "")), "via": str(rec.get("via", ""))}
        except (AttributeError, KeyError, TypeError, ValueError, KithError) as exc:
            detail = getattr(exc, "message", "") or str(exc) or type(exc).__name__
            raise ConfigError("config-invalid", f"{REVOCATIONS_FILE}: {detail}") from None
        return cls(path, persons)

    def _index(self) -> None:
        self._revoked: dict[str, set[str]] = {}
        for person, rec in self.persons.items():
            for key in rec["revoked"]:
                self._revoked.setdefault(key, set()).add(person)

    def revokes(self, device_key: str, persons: Iterable[str]) -> str | None:
        """The person key among ``persons`` whose list kept here revoked ``device_key``, or
        None. A list speaks only for its own person: a caller passes the person keys it
        knows ``device_key`` belongs to (a verified chain's lineage, or the person pins
        that have seen the device present one), never every list kept — a person pinned
        here could otherwise sign a list naming someone else's device (specs/peers.md §10).
        """
        by = self._revoked.get(device_key)
        if not by:
            return None
        return next((p for p in persons if p in by), None)

    def list_for(self, person: str) -> dict[str, Any] | None:
        """The newest list of ``person`` kept here (wire shape), or None."""
        rec = self.persons.get(person)
        return None if rec is None else rec["list"]

    def offer(self, checked: RevocationList, *, via: str, now: str) -> Offered:
        """Keep ``checked`` (already verified by :func:`check_list`) when it is newer than the
        list of its person kept here, and save. An older list never replaces a newer one.

        Returns:
            :class:`Offered`.
        """
        rec = self.persons.get(checked.person)
        if rec is not None:
            kept = rec["list"]["seq"]
            if checked.seq < kept:
                return Offered("stale", [])
            if checked.seq == kept:
                return Offered("same", [])
        before = set(rec["revoked"]) if rec else set()
        union = list(rec["revoked"]) if rec else []
        union += [k for k in checked.revoked if k not in before]
        self.persons.pop(checked.person, None)  # newest received last (the oldest goes first)
        self.persons[checked.person] = {"list": checked.doc, "revoked": union, "receivedAt": now, "via": via}
        while len(self.persons) > MAX_PERSONS:
            self.persons.pop(next(iter(self.persons)))
        self._index()
        self.save()
        return Offered("new", [k for k in checked.revoked if k not in before])

    def save(self) -> None:
        """Write the store (0600, tmp+rename)."""
        data = {"version": STORE_VERSION, "persons": self.persons}
        atomic_write(self.path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))


def own_devices(home: Path, person: Any, this_key: str) -> list[dict[str, Any]]:
    """This home's person's devices as every view shows them (``kith device list``,
    ``kith person show``, ``kith status``): ``[{"name", "key", "seq", "created", "this",
    "revoked"}]`` in binding order — ``revoked`` when a revocation list kept here (the
    person's own, or one of a key it rotated from) revokes the device key.

    Args:
        person: the home's :class:`node.trust.person.PersonRecord`. this_key: this
            device's key (64 hex).
    """
    store, mine = RevocationStore.load(home), person.all_keys()  # its lists before rotations too
    return [{"name": d["device_name"], "key": d["device_key"], "seq": d["seq"], "created": d["created"],
             "this": d["device_key"] == this_key, "revoked": store.revokes(d["device_key"], mine) is not None}
            for d in person.devices]


def device_marks(row: dict[str, Any]) -> str:
    """The marks a device row carries in text (one wording for every view):
    ``  (this device)`` and/or ``  REVOKED``."""
    return ("  (this device)" if row["this"] else "") + ("  REVOKED" if row["revoked"] else "")


def revoked_seen_devices(home: Path, registry: Any) -> dict[str, set[str]]:
    """The owner's view (``kith peers list``, the dashboard): per person pin name, the devices
    it has seen that a revocation list kept in ``home`` revokes — a list of that pin's person
    key, or of a key this home followed it rotating to (specs/peers.md §10, §11).

    Args:
        registry: a :class:`node.trust.peers.PeerRegistry`.
    """
    from node.trust.rotation import RotationLedger

    pins = [rec for rec in registry.peers.values() if rec.devices and rec.seen_devices]
    if not pins:
        return {}
    store, ledger = RevocationStore.load(home), RotationLedger.load(home)
    return {rec.name: {k for k in rec.seen_devices if store.revokes(k, ledger.forward(rec.public_key))}
            for rec in pins}


__all__ = ["MAX_LIST_BYTES", "MAX_PERSONS", "MAX_REVOKED", "Offered", "REVOCATIONS_FILE", "RevocationList",
           "RevocationStore", "check_list", "device_marks", "list_size", "make_list", "own_devices",
           "revoked_seen_devices"]
