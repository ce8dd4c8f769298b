"""Device cards: how a guest reaches every hosting device of a person (specs/peers.md §13,
specs/signed-payloads.md §3b).

A *card* is one hosting device's statement: "I am device D of person P (here is the binding
chain P's key signed), you reach me by this invitation, I share these public totals". The
person key vouches for the device (the chain's device link, :mod:`node.trust.binding`); the
device key signs the rest (``kith-device-card-v1``), so a device that does not hold the
person key — every device but one — publishes its own card and re-signs it whenever its
address changes. Wire shape (exact fields)::

    {"type": "device-card", "person_key": hex64, "device_key": hex64, "device_name": str,
     "binding_chain": [link, ...], "invitation": {...}, "totals": {"documents": int,
     "chunks": int}, "created": "YYYY-MM-DDTHH:MM:SSZ", "seq": int, "signature": hex128}

A **format-2** card adds ``"mailboxes": [url, ...]`` — where the device takes sealed
questions (specs/sealed.md §6) — and is signed over ``kith-device-card-v2``; older guests
refuse it as ``card-malformed`` (they check the fields exactly).

``totals`` are what the device shares with anyone (the ``public`` tier), never what a given
peer may see. :func:`check_card` is pure (no I/O); :class:`CardStore` is the guest's
``<home>/cards.json`` — the cards of the persons it pinned with ``--devices``, each device's
newest, with when it last answered and last failed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from node.common.errors import ConfigError, HandshakeError, InvitationError, KithError, SigningError
from node.common.home import atomic_write, read_json_state
from node.trust.binding import PersonIdentity, check_bounded_object, verify_chain
from node.trust.invitation import Invitation, check_binding, parse_invitation
from node.trust.signing import PUBLIC_KEY_HEX_LEN, SIGNATURE_HEX_LEN, check_hex, device_card_payload, sign, verify

#: The largest card, as compact UTF-8 JSON (bytes): it travels in a handshake frame.
MAX_CARD_BYTES = 16 << 10
#: Most devices of one person whose cards a home keeps (the oldest received goes first).
MAX_DEVICES = 16
#: Most persons whose cards a home keeps.
MAX_PERSONS = 256
CARDS_FILE = "cards.json"
#: The host's own last card sequence number (``<home>/card-seq``): a new card always has a larger one.
SEQ_FILE = "card-seq"
STORE_VERSION = 1

_FIELDS = frozenset({"type", "person_key", "device_key", "device_name", "binding_chain", "invitation", "totals",
                     "created", "seq", "signature"})
#: Card format 2 (specs/sealed.md §6): format 1 plus ``mailboxes``, where the device takes
#: its sealed questions; signed over ``kith-device-card-v2``.
_FIELDS_V2 = _FIELDS | {"mailboxes"}
#: Most mailbox URLs one card names, and the longest one (characters).
MAX_MAILBOXES = 4
MAX_MAILBOX_URL = 200
_MAILBOX_RE = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?")
#: A holder reached over iroh (specs/sealed.md §7b): ``iroh:`` + its iroh EndpointTicket
#: (lowercase base32), at most :data:`MAX_IROH_MAILBOX` characters.
MAX_IROH_MAILBOX = 600
IROH_MAILBOX_RE = re.compile(r"iroh:endpoint[a-z2-7]{40,587}")
_CREATED_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
#: A kept ``lastSeen`` / ``lastFailed``: RFC 3339 UTC, milliseconds allowed.
_MARK_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z")


@dataclass(frozen=True)
class DeviceCard:
    """A checked card (chain, invitation binding and card signature verified).

    Attributes:
        person: the person key that bound the device (64 hex). device: the device key.
        device_name: the name the person gave it. invitation: its parsed invitation.
        documents, chunks: the public totals. seq: the card's sequence number.
        identity: the chain's :class:`node.trust.binding.PersonIdentity` (its ``earlier``
            keys are the person's rotated-from keys). doc: the wire object.
    """

    person: str
    device: str
    device_name: str
    invitation: Invitation
    documents: int
    chunks: int
    seq: int
    identity: PersonIdentity
    doc: dict[str, Any]
    #: where the device takes sealed questions (card format 2; empty: format 1)
    mailboxes: tuple[str, ...] = ()

    @property
    def format(self) -> int:
        """1, or 2 for a card with ``mailboxes`` (specs/sealed.md §6)."""
        return 2 if "mailboxes" in self.doc else 1

    def lineage(self) -> list[str]:
        """The person key and every earlier key the chain descends from."""
        return [self.person, *self.identity.earlier]


def _payload(doc: dict[str, Any], inv: Invitation) -> bytes:
    return device_card_payload(person_key=doc["person_key"], device_key=doc["device_key"],
                               device_name=doc["device_name"], post_id=inv.post_id, ticket=inv.transport_info.ticket,
                               expires_at=inv.expires_at, documents=doc["totals"]["documents"],
                               chunks=doc["totals"]["chunks"], created=doc["created"], seq=doc["seq"],
                               mailboxes=doc.get("mailboxes"))


def is_mailbox(url: object) -> bool:
    """True when ``url`` is one entry of a card's ``mailboxes``: a community server's (or a
    holder's) base URL — ``http``/``https``, a host, an optional plain path, at most
    :data:`MAX_MAILBOX_URL` characters, no query, user or space — or a holder over iroh,
    ``iroh:<ticket>`` (:data:`IROH_MAILBOX_RE`; specs/sealed.md §6, §7b)."""
    return isinstance(url, str) and (
        (len(url) <= MAX_MAILBOX_URL and _MAILBOX_RE.fullmatch(url) is not None)
        or (len(url) <= MAX_IROH_MAILBOX and IROH_MAILBOX_RE.fullmatch(url) is not None))


def check_mailboxes(urls: object) -> list[str]:
    """Return ``urls`` if it is a card's ``mailboxes``: 1 to :data:`MAX_MAILBOXES` distinct
    entries, each :func:`is_mailbox`.

    Raises:
        KithError: ``card-malformed``.
    """
    if (not isinstance(urls, list) or not 1 <= len(urls) <= MAX_MAILBOXES or len(set(map(str, urls))) != len(urls)
            or not all(is_mailbox(u) for u in urls)):
        raise KithError("card-malformed", f"mailboxes is 1 to {MAX_MAILBOXES} distinct http(s) base URLs or "
                        "iroh:<ticket> holders")
    return list(urls)


def make_card(device_secret: bytes, chain: list[dict[str, Any]], invitation: dict[str, Any], *,
              documents: int, chunks: int, created: str, seq: int,
              mailboxes: list[str] | None = None) -> dict[str, Any]:
    """Sign this device's card with its own key's 32-byte seed.

    Args:
        chain: this device's binding chain (:func:`node.trust.person.own_chain`).
        invitation: the device's live invitation document (its host key is this device).
        documents, chunks: the public totals. created: RFC 3339 UTC. seq: larger than
            any card this device signed before.
        mailboxes: the community servers where this device takes sealed questions: a
            card format 2 (specs/sealed.md §6), which older guests refuse; None (the
            default) signs a format-1 card exactly as before.

    Returns:
        the card (wire shape above, plus ``mailboxes`` when given).

    Raises:
        SigningError: ``bad-hex`` / ``bad-payload-value`` for a malformed value.
        KithError: ``card-malformed`` for ``mailboxes`` that are not 1-4 distinct URLs.
    """
    device = chain[-1]
    inv = parse_invitation(invitation)
    doc = {"type": "device-card", "person_key": device["person_key"], "device_key": device["device_key"],
           "device_name": device["device_name"], "binding_chain": list(chain), "invitation": dict(invitation),
           "totals": {"documents": documents, "chunks": chunks}, "created": created, "seq": seq}
    if mailboxes is not None:
        doc["mailboxes"] = check_mailboxes(list(mailboxes))
    return {**doc, "signature": sign(device_secret, _payload(doc, inv))}


def _int(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value < 2 ** 53


def check_card(doc: object, *, device: str | None = None) -> DeviceCard:
    """Check a card: size, shape and strict hex, then the binding chain (the person key's
    signature binding the device), then the invitation's own binding signature and that it
    names the card's device, then the card's signature by the device key.

    Args:
        device: the device key the card must be of (a card in a handshake: the
            QUIC-authenticated host key), or None (a card from the community server).

    Returns:
        the :class:`DeviceCard`.

    Raises:
        KithError: ``card-malformed`` (not an object, larger than 16 KiB, wrong fields or
            types, non-strict hex, a malformed chain or invitation, a device name other
            than the chain's), ``card-wrong-device`` (the chain, the invitation or the
            card names another device than ``device`` / the card's own), ``card-forged``
            (a signature of the chain, of the invitation or of the card does not verify).
    """
    def bad(message: str) -> KithError:
        return KithError("card-malformed", message)

    doc = check_bounded_object(doc, code="card-malformed", what="a device card", max_bytes=MAX_CARD_BYTES)
    if set(doc) not in (_FIELDS, _FIELDS_V2) or doc.get("type") != "device-card":
        raise bad(f"a device card has exactly the fields {sorted(_FIELDS)} (and, format 2, mailboxes) "
                  "and type 'device-card'")
    mailboxes = tuple(check_mailboxes(doc["mailboxes"])) if "mailboxes" in doc else ()
    totals = doc["totals"]
    if (not isinstance(totals, dict) or set(totals) != {"documents", "chunks"}
            or not _int(totals["documents"]) or not _int(totals["chunks"])):
        raise bad("totals is {documents, chunks}, integers from 0 to 2^53 - 1")
    if not _int(doc["seq"]):
        raise bad("seq must be an integer from 0 to 2^53 - 1")
    if not isinstance(doc["created"], str) or _CREATED_RE.fullmatch(doc["created"]) is None:
        raise bad("created must be RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)")
    try:
        check_hex(doc["person_key"], PUBLIC_KEY_HEX_LEN, "person_key")
        check_hex(doc["device_key"], PUBLIC_KEY_HEX_LEN, "device_key")
        check_hex(doc["signature"], SIGNATURE_HEX_LEN, "signature")
    except SigningError as exc:
        raise bad(exc.message) from None
    if device is not None and doc["device_key"] != device:
        raise KithError("card-wrong-device", "the card is of another device than the one that sent it")
    if not isinstance(doc["invitation"], dict):
        raise bad("invitation is an invitation document")
    try:
        inv = parse_invitation(doc["invitation"])
    except InvitationError as exc:
        raise bad(f"invitation: {exc.message}") from None
    try:
        who = verify_chain(doc["binding_chain"], doc["device_key"])
    except HandshakeError as exc:
        if exc.code == "handshake-binding-forged":
            raise KithError("card-forged", "the card's binding chain does not verify") from None
        if exc.code == "handshake-binding-wrong-device":
            raise KithError("card-wrong-device", "the card's binding chain binds another device") from None
        raise bad(f"binding_chain: {exc.message}") from None
    if who.person != doc["person_key"] or who.device_name != doc["device_name"]:
        raise bad("person_key and device_name are the chain's device link's")
    if inv.host_public_key != doc["device_key"]:
        raise KithError("card-wrong-device", "the card's invitation is another device's")
    try:
        check_binding(inv)
    except InvitationError as exc:
        if exc.code == "invitation-bad-signature":
            raise KithError("card-forged", "the card's invitation signature does not verify") from None
        raise bad(f"invitation: {exc.message}") from None
    try:
        verify(doc["device_key"], _payload(doc, inv), doc["signature"], field="card signature")
    except SigningError:
        raise KithError("card-forged", "the card's signature does not verify by its device key") from None
    return DeviceCard(who.person, doc["device_key"], doc["device_name"], inv, totals["documents"],
                      totals["chunks"], doc["seq"], who, dict(doc), mailboxes)


#: Seconds within which an online device's repeated answers are not written again.
MARK_EVERY_S = 60


def _seconds(stamp: str) -> float:
    from node.trust.invitation import parse_rfc3339

    try:
        return parse_rfc3339(stamp).timestamp()
    except (ValueError, TypeError):
        return 0.0


@dataclass
class CardEntry:
    """One device's newest card kept here, and what this home saw of it.

    Attributes:
        card: the wire object. via: ``handshake`` or ``server``. received_at: RFC 3339 UTC.
        last_seen: when this device last answered a question here (RFC 3339 UTC) or None.
        last_failed: when it was last asked and did not answer (RFC 3339 UTC) or None.
    """

    card: dict[str, Any]
    via: str
    received_at: str
    last_seen: str | None = None
    last_failed: str | None = None

    @property
    def online(self) -> bool:
        """True when its last ask here was answered (it answered after it last failed).

        The stamps are compared as times, not text: stamps with milliseconds (what
        :mod:`node.guest.cards` writes) and older second stamps order correctly."""
        return self.last_seen is not None and (self.last_failed is None
                                               or _seconds(self.last_seen) >= _seconds(self.last_failed))

    def as_json(self) -> dict[str, Any]:
        """The stored shape."""
        return {"card": self.card, "via": self.via, "receivedAt": self.received_at, "lastSeen": self.last_seen,
                "lastFailed": self.last_failed}


class CardStore:
    """``<home>/cards.json``: per pinned person key, per device key, its newest card.

    File shape: ``{"version": 1, "persons": {PERSON: {DEVICE: {"card", "via", "receivedAt",
    "lastSeen", "lastFailed"}}}}`` (0600, tmp+rename). Bounded: :data:`MAX_DEVICES` per
    person, :data:`MAX_PERSONS` persons.
    """

    def __init__(self, path: Path, persons: dict[str, dict[str, CardEntry]]) -> None:
        self.path = path
        self.persons = persons

    @classmethod
    def load(cls, home: Path) -> "CardStore":
        """Read the store (missing → empty). Every entry is checked for its shape (a card
        object, ``via`` ``handshake``/``server``, RFC 3339 UTC times or null), so a
        hand-edited file is refused here rather than failing later.

        Raises:
            ConfigError: ``config-invalid`` for a file that is not a valid store, its hint
                saying to remove it (the cards are learnt again).
        """
        path = Path(home) / CARDS_FILE
        hint = (f"remove {path} (it only keeps what this home learnt: each device's card comes back "
                "with its next handshake or from the person's community server)")
        try:
            raw = read_json_state(path, hint=hint)
        except FileNotFoundError:
            return cls(path, {})

        def stamp(value: object, what: str, *, optional: bool) -> Any:
            pattern = _CREATED_RE if what == "receivedAt" else _MARK_RE
            if (value is None and optional) or (isinstance(value, str) and pattern.fullmatch(value)):
                return value
            raise ValueError(f"{what} must be an RFC 3339 UTC time{' or null' if optional else ''}")

        persons: dict[str, dict[str, CardEntry]] = {}
        try:
            if raw.get("version") != STORE_VERSION:
                raise ValueError("unknown version")
            for person, devices in raw["persons"].items():
                check_hex(person, PUBLIC_KEY_HEX_LEN, "person")
                persons[person] = {}
                for key, e in devices.items():
                    check_hex(key, PUBLIC_KEY_HEX_LEN, "device")
                    if not isinstance(e["card"], dict) or e["via"] not in ("handshake", "server"):
                        raise ValueError(f"device {key[:16]}…: card must be an object, via handshake or server")
                    persons[person][key] = CardEntry(dict(e["card"]), e["via"],
                                                     stamp(e["receivedAt"], "receivedAt", optional=False),
                                                     stamp(e.get("lastSeen"), "lastSeen", optional=True),
                                                     stamp(e.get("lastFailed"), "lastFailed", optional=True))
        except (AttributeError, KeyError, TypeError, ValueError, SigningError) as exc:
            raise ConfigError("config-invalid", f"{CARDS_FILE}: {getattr(exc, 'message', exc)}", hint=hint) from None
        return cls(path, persons)

    def devices_of(self, person: str) -> dict[str, CardEntry]:
        """The devices of ``person`` (a pinned person key) kept here, by device key."""
        return dict(self.persons.get(person, {}))

    def offer(self, person: str, card: DeviceCard, *, via: str, now: str) -> str:
        """Keep ``card`` (checked) as the newest of its device under the pin ``person``, and save.

        Returns:
            ``"new"`` (kept) or ``"same"`` (this very card is kept already).

        Raises:
            KithError: ``card-stale`` — a card of that device with a larger ``seq`` is kept,
                or another card with the same ``seq`` (an older card never replaces a newer one).
        """
        devices = self.persons.setdefault(person, {})
        kept = devices.get(card.device)
        if kept is not None:
            if kept.card == card.doc:
                return "same"
            if card.seq <= kept.card.get("seq", -1):
                raise KithError("card-stale", f"a newer card of device {card.device[:16]}… is kept already")
        entry = CardEntry(card.doc, via, now, kept.last_seen if kept else None, kept.last_failed if kept else None)
        devices.pop(card.device, None)
        devices[card.device] = entry  # newest received last: the oldest goes first
        while len(devices) > MAX_DEVICES:
            devices.pop(next(iter(devices)))
        self.persons.pop(person)
        self.persons[person] = devices
        while len(self.persons) > MAX_PERSONS:
            self.persons.pop(next(iter(self.persons)))
        self.save()
        return "new"

    def forget(self, person: str, devices: Iterable[str]) -> None:
        """Drop the cards of ``devices`` (revoked ones) under ``person``, and save when any went."""
        kept = self.persons.get(person, {})
        gone = [d for d in devices if kept.pop(d, None) is not None]
        if gone:
            self.save()

    def mark(self, person: str, device: str, *, ok: bool, now: str) -> bool:
        """Record that ``device`` answered (``ok``) or failed to, at ``now``, and save —
        unless it only repeats what is kept (an online device answering again, or an
        offline one failing again, within :data:`MARK_EVERY_S` of the kept time: not every
        ask costs a write).

        Returns:
            True when the store was written.
        """
        entry = self.persons.get(person, {}).get(device)
        if entry is None:
            return False
        kept = entry.last_seen if ok else entry.last_failed
        if entry.online == ok and kept is not None and _seconds(now) - _seconds(kept) < MARK_EVERY_S:
            return False
        if ok:
            entry.last_seen = now
        else:
            entry.last_failed = now
        self.save()
        return True

    def save(self) -> None:
        """Write the store (0600, tmp+rename)."""
        data = {"version": STORE_VERSION,
                "persons": {p: {k: e.as_json() for k, e in d.items()} for p, d in self.persons.items()}}
        atomic_write(self.path, (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))


__all__ = ["CARDS_FILE", "CardEntry", "CardStore", "DeviceCard", "MAX_CARD_BYTES", "MAX_DEVICES", "MAX_MAILBOXES",
           "IROH_MAILBOX_RE", "MAX_IROH_MAILBOX", "SEQ_FILE", "check_card", "check_mailboxes", "is_mailbox",
           "make_card"]
