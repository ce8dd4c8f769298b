"""Sealed records: a question or an answer signed by its sender's device key and sealed so
that only its recipients' device keys open it (specs/sealed.md).

A sealed record is what a *holder* (the community server's mailbox, a device that holds
mail) keeps for two nodes that are never up at the same time. The holder sees the outer
record only: the record id, the sender's device key, the recipients' device keys, the size
bucket and two times. Everything else — the kind (question or answer), the question id,
the request, the answer, the sender's binding chain — is inside the box.

Construction (specs/sealed.md §2):

- the *inner* record is compact UTF-8 JSON ``{"kind", "question_id", "sender", "chain",
  "recipients", "created", "expires", "body", "signature"}``; ``body`` is a JSON text
  (a string: the bytes signed are exactly the bytes carried, no JSON canonicalisation);
  ``signature`` is the sender's Ed25519 signature over the line payload
  ``kith-sealed-record-v1`` (:func:`sealed_payload`), which names every recipient, so a
  recipient cannot pass the record on to a key it was not sealed to;
- it is padded to a size bucket (:data:`BUCKETS`: 4-byte big-endian length, the inner
  bytes, zero bytes up to the bucket) and encrypted once with a fresh random 32-byte key
  (XSalsa20-Poly1305, ``nacl.secret.SecretBox``);
- that key is wrapped for each recipient with ``nacl.public.SealedBox`` (ephemeral X25519,
  XSalsa20-Poly1305) to the recipient's X25519 key converted from its Ed25519 device key.

Pure functions, no I/O: the only inputs besides the record are the keys and ``now``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import struct
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

import nacl.exceptions
import nacl.public
import nacl.secret
import nacl.signing

from node.common.errors import HandshakeError, KithError, SigningError
from node.trust.binding import PersonIdentity, verify_chain
from node.trust.signing import (
    PUBLIC_KEY_HEX_LEN,
    SIGNATURE_HEX_LEN,
    TAG_SEALED_RECORD,
    build_payload,
    check_hex,
    sha256_hex,
    verify,
)

#: Padded plaintext sizes (bytes): 1 KiB doubling to 128 KiB. A record's box is exactly
#: one of these plus :data:`BOX_OVERHEAD`; any other length is ``sealed-wrong-size``.
BUCKETS = tuple(1024 << i for i in range(8))
#: SecretBox nonce (24) + Poly1305 tag (16).
BOX_OVERHEAD = nacl.secret.SecretBox.NONCE_SIZE + nacl.secret.SecretBox.MACBYTES
#: A wrapped content key: ephemeral X25519 public key (32) + tag (16) + the 32-byte key.
WRAPPED_BYTES = 32 + 16 + 32
#: Most recipients of one record (a person's devices: the card store keeps 16).
MAX_RECIPIENTS = 16
#: Longest a record may be kept, from ``created`` to ``expires`` (seconds): 30 days, as
#: the outbox's longest ``--keep`` (specs/outbox.md §1).
MAX_LIFETIME_S = 30 * 24 * 3600
#: The prefix of an outbox question's ``query_id`` on the wire (live and sealed alike): the
#: host knows an outbox question by it (specs/outbox.md §3, specs/sealed.md §5).
QUERY_ID_PREFIX = "outbox:"
#: How far ``created`` may be ahead of the opener's clock (seconds), as signed requests.
CLOCK_SKEW_S = 300
#: The 4-byte length prefix inside the padding.
_LEN = struct.Struct(">I")
KINDS = ("question", "answer")
_OUTER_FIELDS = frozenset({"type", "version", "id", "sender", "recipients", "created", "expires", "bucket", "box"})
_INNER_FIELDS = frozenset({"kind", "question_id", "sender", "chain", "recipients", "created", "expires", "body",
                           "signature"})
_ID_RE = re.compile(r"[0-9a-f]{32}")
_TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
#: Domain of the outer id: the holder's id differs for a question and its answer.
_ID_DOMAIN = b"kith-sealed-id-v2\n"


def record_id(kind: str, question_id: str, sender: str, recipients: Iterable[str]) -> str:
    """The outer id of the ``kind`` record of question ``question_id`` from ``sender`` to
    ``recipients``: the first 32 hex of SHA-256(``kith-sealed-id-v2\n`` kind ``\n``
    question_id ``\n`` sender ``\n`` the recipient keys ascending, comma-joined).

    The same question asked of two peers (one outbox id, specs/outbox.md §3) gives two
    records, and their two answers two more, so one holder keeps all four; a host answering
    again (killed before its ack) makes the same id. A holder cannot link a question's
    record to its answer's by id (specs/sealed.md §1, §3)."""
    text = "\n".join((kind, question_id, sender, ",".join(sorted(recipients))))
    return hashlib.sha256(_ID_DOMAIN + text.encode()).hexdigest()[:32]


def sealed_payload(*, kind: str, question_id: str, sender: str, recipients: list[str], created: str,
                   expires: str, body_sha256: str) -> bytes:
    """What the sender's device key signs (specs/signed-payloads.md §3c).

    Lines: ``kith-sealed-record-v1``, ``kind``, ``question_id``, ``sender``, ``count`` (how
    many recipients follow), one ``recipient`` line each (in the record's order, which is
    ascending), ``created``, ``expires`` (RFC 3339 UTC), ``body_sha256`` (SHA-256 hex of the
    body text's UTF-8).

    Raises:
        SigningError: ``bad-hex`` for a malformed key or digest, ``bad-payload-value`` for a
            value with a line break.
    """
    check_hex(sender, PUBLIC_KEY_HEX_LEN, "sender")
    for key in recipients:
        check_hex(key, PUBLIC_KEY_HEX_LEN, "recipient")
    check_hex(body_sha256, 64, "body_sha256")
    return build_payload(TAG_SEALED_RECORD, [
        ("kind", kind), ("question_id", question_id), ("sender", sender), ("count", str(len(recipients))),
        *(("recipient", key) for key in recipients), ("created", created), ("expires", expires),
        ("body_sha256", body_sha256),
    ])


def _rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(int(unix), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _unix(stamp: str) -> int:
    return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp())


def bucket_for(size: int) -> int:
    """The smallest bucket that holds ``size`` inner bytes and the 4-byte length.

    Raises:
        KithError: ``sealed-wrong-size`` when even the largest bucket is too small.
    """
    for bucket in BUCKETS:
        if size + _LEN.size <= bucket:
            return bucket
    raise KithError("sealed-wrong-size", f"a sealed record holds at most {BUCKETS[-1] - _LEN.size} bytes")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object, field: str) -> bytes:
    if not isinstance(text, str):
        raise KithError("sealed-malformed", f"{field} must be base64 text")
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise KithError("sealed-malformed", f"{field} is not strict base64") from None
    if _b64(data) != text:
        raise KithError("sealed-malformed", f"{field} is not canonical base64")
    return data


def _x25519_public(device_key: str) -> nacl.public.PublicKey:
    try:
        return nacl.signing.VerifyKey(bytes.fromhex(device_key)).to_curve25519_public_key()
    except (nacl.exceptions.CryptoError, ValueError):
        raise KithError("sealed-malformed", "a recipient is not a usable Ed25519 public key") from None


def seal(device_secret: bytes, chain: list[dict[str, Any]] | None, *, kind: str, question_id: str,
         body: dict[str, Any], recipients: Iterable[str], now: float, expires: float) -> dict[str, Any]:
    """Sign and seal one record (specs/sealed.md §2).

    Args:
        device_secret: the sender's device key (32-byte Ed25519 seed).
        chain: the sender's binding chain (:func:`node.trust.person.own_chain`), or None for
            a home without a person.
        kind: ``question`` or ``answer``. question_id: the question's id (32 lowercase hex;
            the idempotency key end to end, specs/outbox.md §3).
        body: the record's JSON object (a question: ``request``, ``peer``, ``reply_to``;
            an answer: ``results``), carried as compact JSON text.
        recipients: the device keys that may open it (1 to :data:`MAX_RECIPIENTS`).
        now, expires: Unix seconds (``expires - now`` at most :data:`MAX_LIFETIME_S`).

    Returns:
        the outer record (wire shape of specs/sealed.md §1).

    Raises:
        KithError: ``sealed-malformed`` (a bad kind, id, recipient list or lifetime),
            ``sealed-wrong-size`` (larger than the largest bucket).
        SigningError: ``bad-hex`` for a malformed key.
    """
    keys = sorted(set(recipients))
    if kind not in KINDS:
        raise KithError("sealed-malformed", "kind is question or answer")
    if not isinstance(question_id, str) or _ID_RE.fullmatch(question_id) is None:
        raise KithError("sealed-malformed", "question_id is 32 lowercase hex characters")
    if not 1 <= len(keys) <= MAX_RECIPIENTS:
        raise KithError("sealed-malformed", f"a sealed record has 1 to {MAX_RECIPIENTS} recipients")
    if not 0 < int(expires) - int(now) <= MAX_LIFETIME_S:
        raise KithError("sealed-malformed", "expires is after created, at most 30 days")
    signing_key = nacl.signing.SigningKey(device_secret)
    sender = signing_key.verify_key.encode().hex()
    created, until = _rfc3339(now), _rfc3339(expires)
    body_text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    payload = sealed_payload(kind=kind, question_id=question_id, sender=sender, recipients=keys, created=created,
                             expires=until, body_sha256=sha256_hex(body_text.encode("utf-8")))
    inner = {"kind": kind, "question_id": question_id, "sender": sender, "chain": chain, "recipients": keys,
             "created": created, "expires": until, "body": body_text,
             "signature": signing_key.sign(payload).signature.hex()}
    raw = json.dumps(inner, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    bucket = bucket_for(len(raw))
    padded = _LEN.pack(len(raw)) + raw + bytes(bucket - _LEN.size - len(raw))
    content_key = os.urandom(nacl.secret.SecretBox.KEY_SIZE)
    box = bytes(nacl.secret.SecretBox(content_key).encrypt(padded))
    return {"type": "sealed", "version": 1, "id": record_id(kind, question_id, sender, keys), "sender": sender,
            "recipients": [{"key": k, "wrapped": _b64(nacl.public.SealedBox(_x25519_public(k)).encrypt(content_key))}
                           for k in keys],
            "created": created, "expires": until, "bucket": bucket, "box": _b64(box)}


@dataclass(frozen=True)
class Envelope:
    """What a holder learns from a record: its outer fields, shape-checked (no key opens
    anything here).

    Attributes:
        id: the outer id (32 hex). sender: the sender's device key. recipients: the
            recipients' device keys, ascending. wrapped: recipient key → its wrapped
            content key (80 bytes). created_unix, expires_unix: Unix seconds. bucket: the
            padded size. box: the ciphertext (``bucket`` + 40 bytes).
    """

    id: str
    sender: str
    recipients: tuple[str, ...]
    wrapped: dict[str, bytes]
    created_unix: int
    expires_unix: int
    bucket: int
    box: bytes

    def as_json(self) -> dict[str, Any]:
        """The wire record again (what a holder hands out)."""
        return {"type": "sealed", "version": 1, "id": self.id, "sender": self.sender,
                "recipients": [{"key": k, "wrapped": _b64(self.wrapped[k])} for k in self.recipients],
                "created": _rfc3339(self.created_unix), "expires": _rfc3339(self.expires_unix),
                "bucket": self.bucket, "box": _b64(self.box)}


def check_envelope(doc: object, *, now: float) -> Envelope:
    """Check a record's outer shape as a holder does — before it stores anything
    (specs/sealed.md §4, steps 1-3).

    Args:
        now: the holder's clock, Unix seconds.

    Returns:
        the :class:`Envelope`.

    Raises:
        KithError: ``sealed-malformed`` (not an object of exactly the outer fields, strict
            hex, canonical base64, sorted distinct recipients, a lifetime over 30 days),
            ``sealed-wrong-size`` (``bucket`` not one of :data:`BUCKETS`, or a box or a
            wrapped key of another length), ``sealed-expired`` (``expires`` has passed, or
            ``created`` is more than 300 s ahead of ``now``).
    """
    def bad(message: str) -> KithError:
        return KithError("sealed-malformed", message)

    if not isinstance(doc, dict) or set(doc) != _OUTER_FIELDS or doc.get("type") != "sealed":
        raise bad(f"a sealed record is an object of exactly {sorted(_OUTER_FIELDS)}, type 'sealed'")
    if doc["version"] != 1 or isinstance(doc["version"], bool):
        raise bad("version is 1")
    if not isinstance(doc["id"], str) or _ID_RE.fullmatch(doc["id"]) is None:
        raise bad("id is 32 lowercase hex characters")
    try:
        check_hex(doc["sender"], PUBLIC_KEY_HEX_LEN, "sender")
    except SigningError as exc:
        raise bad(exc.message) from None
    for field in ("created", "expires"):
        if not isinstance(doc[field], str) or _TIME_RE.fullmatch(doc[field]) is None:
            raise bad(f"{field} is RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)")
    try:
        created, expires = _unix(doc["created"]), _unix(doc["expires"])
    except ValueError:
        raise bad("created and expires are real dates") from None
    if not 0 < expires - created <= MAX_LIFETIME_S:
        raise bad("expires is after created, at most 30 days")
    bucket = doc["bucket"]
    if isinstance(bucket, bool) or bucket not in BUCKETS:
        raise KithError("sealed-wrong-size", "bucket is not one of the sealed record sizes")
    rec = doc["recipients"]
    if not isinstance(rec, list) or not 1 <= len(rec) <= MAX_RECIPIENTS:
        raise bad(f"recipients is a list of 1 to {MAX_RECIPIENTS}")
    wrapped: dict[str, bytes] = {}
    for r in rec:
        if not isinstance(r, dict) or set(r) != {"key", "wrapped"}:
            raise bad("each recipient is {key, wrapped}")
        try:
            key = check_hex(r["key"], PUBLIC_KEY_HEX_LEN, "recipient key")
        except SigningError as exc:
            raise bad(exc.message) from None
        if wrapped and key <= list(wrapped)[-1]:
            raise bad("recipients are distinct, in ascending key order")
        w = _unb64(r["wrapped"], "wrapped")
        if len(w) != WRAPPED_BYTES:
            raise KithError("sealed-wrong-size", f"a wrapped key is {WRAPPED_BYTES} bytes")
        wrapped[key] = w
    box = _unb64(doc["box"], "box")
    if len(box) != bucket + BOX_OVERHEAD:
        raise KithError("sealed-wrong-size", "the box is not the size its bucket says")
    if expires <= now:
        raise KithError("sealed-expired", "the sealed record has expired")
    if created > now + CLOCK_SKEW_S:
        raise KithError("sealed-expired", "the sealed record is dated more than 300 s ahead")
    return Envelope(doc["id"], doc["sender"], tuple(wrapped), wrapped, created, expires, bucket, box)


@dataclass(frozen=True)
class Opened:
    """A record that opened and verified.

    Attributes:
        kind: ``question`` or ``answer``. question_id: the idempotency key (32 hex).
        id: the outer id. sender: the sender's device key. identity: its verified binding
            chain's :class:`PersonIdentity`, or None when it carried none.
        recipients: every key it was sealed to. created_unix, expires_unix: Unix seconds.
        body: the decoded body object.
    """

    kind: str
    question_id: str
    id: str
    sender: str
    identity: PersonIdentity | None
    recipients: tuple[str, ...]
    created_unix: int
    expires_unix: int
    body: dict[str, Any]


def open_sealed(doc: object, device_secret: bytes, *, now: float) -> Opened:
    """Open a record with this device's key, verify it, and return what it says
    (specs/sealed.md §4: the order of the checks is the order of the refusals).

    Args:
        doc: the outer record as received (untrusted).
        device_secret: this device's 32-byte Ed25519 seed.
        now: Unix seconds.

    Returns:
        the :class:`Opened` record. A replay (an id already acted on) is the caller's
        check: :class:`SeenRecords`.

    Raises:
        KithError: ``sealed-malformed``, ``sealed-wrong-size``, ``sealed-expired`` (as
            :func:`check_envelope`; ``sealed-malformed`` also for inner bytes that are not
            a record), ``sealed-not-for-me`` (this device's key is not a recipient),
            ``sealed-forged`` (the wrapped key or the box does not open, the inner record
            differs from the outer, the chain or the signature does not verify).
    """
    env = check_envelope(doc, now=now)
    signing_key = nacl.signing.SigningKey(device_secret)
    me = signing_key.verify_key.encode().hex()
    if me not in env.wrapped:
        raise KithError("sealed-not-for-me", "this device's key is not a recipient of the sealed record")
    try:
        content_key = nacl.public.SealedBox(signing_key.to_curve25519_private_key()).decrypt(env.wrapped[me])
        padded = nacl.secret.SecretBox(content_key).decrypt(env.box)
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        raise KithError("sealed-forged", "the sealed record does not open with this device's key") from None
    (length,) = _LEN.unpack_from(padded)
    if length > len(padded) - _LEN.size or any(padded[_LEN.size + length:]):
        raise KithError("sealed-malformed", "the sealed record's padding is not zeros after its length")
    try:
        inner = json.loads(padded[_LEN.size:_LEN.size + length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise KithError("sealed-malformed", "the opened record is not UTF-8 JSON") from None
    if not isinstance(inner, dict) or set(inner) != _INNER_FIELDS:
        raise KithError("sealed-malformed", f"the opened record has exactly {sorted(_INNER_FIELDS)}")
    if (inner["kind"] not in KINDS or not isinstance(inner["question_id"], str)
            or _ID_RE.fullmatch(inner["question_id"]) is None or not isinstance(inner["body"], str)):
        raise KithError("sealed-malformed", "the opened record's kind, question_id or body is not valid")
    try:  # JSON's \u escapes spell lone surrogates, which are not UTF-8 text
        body_bytes = inner["body"].encode("utf-8")
    except UnicodeEncodeError:
        raise KithError("sealed-malformed", "the opened record's body is not UTF-8 text") from None
    try:
        check_hex(inner["signature"], SIGNATURE_HEX_LEN, "signature")
    except SigningError as exc:
        raise KithError("sealed-malformed", exc.message) from None
    if (inner["sender"] != env.sender or inner["recipients"] != list(env.recipients)
            or inner["created"] != doc["created"] or inner["expires"] != doc["expires"]  # type: ignore[index]
            or record_id(inner["kind"], inner["question_id"], env.sender, env.recipients) != env.id):
        raise KithError("sealed-forged", "the sealed record's outer fields differ from what its sender signed")
    identity = None
    if inner["chain"] is not None:
        try:
            identity = verify_chain(inner["chain"], env.sender)
        except HandshakeError as exc:
            raise KithError("sealed-forged", f"the sender's binding chain does not verify ({exc.code})") from None
    payload = sealed_payload(kind=inner["kind"], question_id=inner["question_id"], sender=env.sender,
                             recipients=list(env.recipients), created=inner["created"], expires=inner["expires"],
                             body_sha256=sha256_hex(body_bytes))
    try:
        verify(env.sender, payload, inner["signature"], field="sealed record signature")
    except SigningError:
        raise KithError("sealed-forged", "the sealed record's signature does not verify by its sender") from None
    try:
        body = json.loads(inner["body"])
    except (ValueError, RecursionError):
        raise KithError("sealed-malformed", "the opened record's body is not JSON") from None
    if not isinstance(body, dict):
        raise KithError("sealed-malformed", "the opened record's body is a JSON object")
    try:  # a string in it that is not UTF-8 text (a lone surrogate) could not be hashed,
        # logged or answered (the audit log's query hash, the answer's encoding raised)
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise KithError("sealed-malformed", "the opened record's body holds text that is not UTF-8") from None
    return Opened(inner["kind"], inner["question_id"], env.id, env.sender, identity, env.recipients,
                  env.created_unix, env.expires_unix, body)


def seen_key(kind: str, sender: str, question_id: str) -> str:
    """The key a record is acted on once under (specs/sealed.md §5): its kind, its sender's
    device key and its question id — not the outer id, so a fresh sealing of the same
    question to another set of recipients (a person's new device) is the same question, and
    a question answered live (the knowledge-query ``query_id`` ``outbox:<question id>`` from
    that device key) is the same question too. Keyed by sender, so a peer that learnt a
    question id cannot use it up for the asker."""
    return f"{kind}:{sender}:{question_id}"


class SeenRecords:
    """What this node acted on, each until its record expires: a second delivery of one is
    ``sealed-replayed`` (specs/sealed.md §5), keyed by :func:`seen_key`. In memory, bounded
    by ``max_ids`` (the ones closest to expiry go first); :class:`node.trust.sealed_seen.DurableSeen`
    keeps the same in a file so a host restarting answers a question once.

    Each key is ``[until, reply, done]``: ``reply`` a sealed reply made but not yet left
    (:meth:`keep_unsent`), ``done`` once acted on (:meth:`admit`, which also forgets the
    reply in the same write).
    """

    def __init__(self, max_ids: int = 100_000, max_unsent: int = 2_000) -> None:
        self.max_ids = max_ids
        self.max_unsent = max_unsent
        self._rows: dict[str, tuple[int, dict[str, Any] | None, bool]] = {}
        self._lock = threading.RLock()  # a host's take loop and its live sessions share one

    # --- storage hooks (a durable subclass writes through) -------------------------------
    def _ready(self) -> None:
        """Called under the lock before each use (a durable subclass opens its file here)."""

    def _put(self, key: str, row: tuple[int, dict[str, Any] | None, bool]) -> None:
        self._rows[key] = row

    def _drop(self, keys: list[str]) -> None:
        for key in keys:
            self._rows.pop(key, None)

    def _expire(self, now: float) -> None:
        gone = [k for k, (until, _r, _d) in self._rows.items() if until <= now]
        if gone:
            self._drop(gone)

    def _bound(self) -> None:
        if len(self._rows) > self.max_ids:
            order = sorted(self._rows, key=lambda k: self._rows[k][0])
            self._drop(order[:len(self._rows) - self.max_ids])
        unsent = [k for k, (_u, r, _d) in self._rows.items() if r is not None]
        if len(unsent) > self.max_unsent:
            unsent.sort(key=lambda k: self._rows[k][0])
            self._drop(unsent[:len(unsent) - self.max_unsent])

    # --- the record's view ---------------------------------------------------------------
    def unsent(self, opened: Opened, *, now: float) -> dict[str, Any] | None:
        """The sealed reply made to ``opened`` that was not left yet (:meth:`keep_unsent`),
        or None: a record is acted on once even while its reply waits for room at a holder,
        or when the process was killed before it was left (specs/sealed.md §5)."""
        with self._lock:
            self._ready()
            row = self._rows.get(seen_key(opened.kind, opened.sender, opened.question_id))
        return row[1] if row is not None and row[0] > now and not row[2] else None

    def keep_unsent(self, opened: Opened, reply: dict[str, Any] | None, *, now: float) -> None:
        """Keep ``reply`` (a sealed record) for ``opened`` until it is acted on or expires
        (``reply`` None forgets it); at most ``max_unsent`` (the ones closest to expiry go
        first)."""
        with self._lock:
            self._ready()
            self._expire(now)
            key = seen_key(opened.kind, opened.sender, opened.question_id)
            row = self._rows.get(key)
            if row is not None and row[2]:
                return
            if reply is None:
                if row is not None:
                    self._drop([key])
                return
            self._put(key, (opened.expires_unix, reply, False))
            self._bound()

    def seen(self, opened: Opened, *, now: float) -> bool:
        """True when ``opened`` was acted on and has not expired (nothing is recorded)."""
        return self.seen_question(opened.kind, opened.sender, opened.question_id, now=now)

    def seen_question(self, kind: str, sender: str, question_id: str, *, now: float) -> bool:
        """True when the record ``(kind, sender, question_id)`` was acted on and has not expired."""
        with self._lock:
            self._ready()
            row = self._rows.get(seen_key(kind, sender, question_id))
        return row is not None and row[0] > now and row[2]

    def admit(self, opened: Opened, *, now: float) -> None:
        """Record ``opened`` as acted on (forgetting its unsent reply), or refuse a record
        acted on before.

        Raises:
            KithError: ``sealed-replayed`` when it was acted on and has not expired.
        """
        self.mark(opened.kind, opened.sender, opened.question_id, until=opened.expires_unix, now=now)

    def mark(self, kind: str, sender: str, question_id: str, *, until: float, now: float) -> None:
        """Record ``(kind, sender, question_id)`` as acted on until ``until`` (Unix seconds):
        :meth:`admit`, or a question a host answered live (specs/sealed.md §5).

        Raises:
            KithError: ``sealed-replayed`` when it was acted on and has not expired.
        """
        with self._lock:
            self._ready()
            self._expire(now)
            key = seen_key(kind, sender, question_id)
            row = self._rows.get(key)
            if row is not None and row[2]:
                raise KithError("sealed-replayed", "this sealed record was delivered here before")
            self._put(key, (int(until), None, True))
            self._bound()


__all__ = ["BUCKETS", "BOX_OVERHEAD", "CLOCK_SKEW_S", "Envelope", "KINDS", "MAX_LIFETIME_S", "MAX_RECIPIENTS",
           "Opened", "SeenRecords", "WRAPPED_BYTES", "bucket_for", "check_envelope", "open_sealed", "record_id",
           "seal", "sealed_payload", "seen_key"]
