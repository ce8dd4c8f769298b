"""The community server: an ASGI app (Starlette) over a SQLite or PostgreSQL store (DESIGN §12).

It helps peers find each other: identities (a key and a profile),
protocol specs by content, invitations (publish, browse, get, status, renew, withdraw,
``max_sessions``), session proofs (submit, status, close) and feedback (one rating per
participant per session). It never sees plaintext: with the mailbox on (``--mailbox``,
off by default) it holds opaque sealed records only (specs/sealed.md) — keys, times, a
size bucket and ciphertext — and otherwise has nowhere to store a query, an answer or
corpus data. Routes, bodies, statuses, error codes and the order of every check
are specified in ``specs/community-api.md``.

Rules enforced here (all answers are JSON; every error is
``{"error": {"code": ..., "message": ...}}`` with a code registered in
:data:`node.common.errors.CODES`):

- every request takes a token from its client address's bucket, every signed request one
  from its key's bucket; an empty bucket answers 429 ``rate-limited`` with ``Retry-After``
  (:mod:`node.community.ratelimit`; the buckets live in the database, so every instance on
  one database shares them — nothing that affects an answer is kept in the process);
- a post carries a liveness lease its running host refreshes (``POST .../lease``); a post
  whose lease lapsed leaves browse and answers 410 ``invitation-host-offline``;
- a database that is unavailable (or a statement over its timeout) answers 503
  ``database-unavailable`` / ``database-timeout`` with ``Retry-After``;
- mutations are signed requests (DESIGN §4; :mod:`node.community.requests`), with nonces
  remembered for the ±300 s window so a replay answers 409 ``request-replayed``;
- bodies are bounded (``Content-Length`` over the cap answers 413 before reading; a
  streamed body is cut off at the cap); JSON nesting is bounded too;
- an invitation is verified like ``kith join`` would, except that the iroh ticket is never
  parsed here (this module does not import iroh); the server assigns the ``post_id``;
- a session proof is accepted only if ``session_id`` is the SHA-256 of the recomputed
  payload, both role signatures verify (DESIGN §4, §6) and its invitation is neither
  withdrawn nor consumed (``max_sessions`` proofs already recorded).

Database work runs in worker threads (``anyio.to_thread.run_sync``) so the event loop never
blocks on it.

Embedding: :func:`run_server_in_thread` serves an app on loopback in a daemon thread
(tests, the demo); ``kith community serve`` uses :func:`node.common.http.serve_forever`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import secrets
import time
import unicodedata
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio.to_thread
import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import node
from node.common.errors import (
    CommunityError,
    InvitationError,
    KithError,
    ProtocolViolation,
    SigningError,
    SpecError,
)
from node.common.http import (
    MAX_JSON_DEPTH,
    bind_socket,
    error_response,
    read_body,
    serve_app_in_thread,
    too_deep,
)
from node.community.ratelimit import RateLimits, SharedBuckets, retry_after_header
from node.community.requests import (
    REQUEST_WINDOW_S,
    SignedRequest,
    check_signed_request,
)
from node.community.store import CommunityStore, InvitationRow, MailboxLimits, open_store
from node.protocol.spec import parse_spec
from node.trust.invitation import (
    MAX_INVITATION_BYTES,
    POST_ID_RE,
    Invitation,
    check_binding,
    parse_invitation,
    parse_rfc3339,
    rfc3339,
)
from node.trust.signing import (
    PUBLIC_KEY_HEX_LEN,
    SHA256_HEX_LEN,
    check_hex,
    role_message,
    session_id_of,
    session_payload,
    verify,
)
from node.common.names import name_skeletons  # the node's look-alike fold, shared (not copied)
from node.community.defaults import DEFAULT_LEASE_TTL_S, DEFAULT_PORT  # noqa: F401  (re-exported)

SERVICE = "kith-community"
API_PREFIX = "/api/v1"
DEFAULT_MAX_BODY_BYTES = 64 * 1024
#: Largest protocol spec body accepted by ``POST /protocols`` (bytes).
DEFAULT_MAX_SPEC_BYTES = 256 * 1024
#: Bytes of randomness in a server-assigned post_id (16 bytes → 32 lowercase hex).
POST_ID_BYTES = 16
#: Deepest JSON nesting accepted in any body (objects and arrays).
#: Latest accepted ``expires_at``: 30 days after the server clock (+ the request window).
MAX_INVITATION_TTL_S = 30 * 24 * 3600 + REQUEST_WINDOW_S
MAX_SESSIONS_LIMIT = 1_000_000
MAX_TAGS = 16
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,31}")
PROTOCOL_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
CLOSE_REASON_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
MAX_MESSAGE_CHARS = 1000
MAX_DISPLAY_NAME_CHARS = 64
MAX_ABOUT_CHARS = 500
MAX_COMMENT_CHARS = 1000
DEFAULT_BROWSE_LIMIT = 20
MAX_BROWSE_LIMIT = 100
LEASE_REFRESH_DIVISOR = 3.0
#: Largest ``POST /mailbox`` body: the largest sealed record (a 128 KiB bucket in base64,
#: 16 recipients) with room to spare, in bytes.
MAX_SEALED_BODY_BYTES = 192 * 1024
#: Most records one ``POST /mailbox/take`` returns, and most ids one ack names.
MAX_TAKE = 100
#: A take stops adding records once their buckets pass this (bytes): its answer stays under
#: the client's 1 MiB cap once base64-encoded.
MAX_TAKE_BYTES = 512 * 1024
_RECORD_ID_RE = re.compile(r"[0-9a-f]{32}")
_SENDER_KEY_RE = re.compile(r"[0-9a-f]{64}")
#: ``Retry-After`` of a 503 (the database is unavailable or a statement timed out), seconds.
RETRY_AFTER_UNAVAILABLE_S = 2

log = logging.getLogger("kith.community")


class SessionProof(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/v1/sessions``: the session payload fields, its id, both signatures."""

    session_id: str
    post_id: str
    protocol_id: str
    host_public_key: str
    guest_public_key: str
    guest_nonce: str
    host_nonce: str
    host_signature: str
    guest_signature: str


class ProfileBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/v1/identities``: the profile of the signing key."""

    display_name: str
    about: str = ""


class RenewBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/v1/invitations/{post_id}/renew``: the new expiry, re-signed."""

    expires_at: str
    transport_binding_signature: str


class EmptyBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``.../withdraw`` and ``.../lease``: empty or ``{}``."""


class CloseBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/v1/sessions/{session_id}/close``: an optional reason code."""

    reason: str = "closed"


class TakeBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/v1/mailbox/take``: how many records at most (empty: 20), and
    optionally the cursor ``after`` (a take's ``next``: only records after the last it gave;
    any JSON value here, so that every bad cursor is refused alike by :func:`parse_take_cursor`)."""

    limit: int = 20
    after: Any = None


#: A take's cursor: the last record's stored time (``float.hex``), sender key and record id.
_CURSOR_RE = re.compile(r"(-?0x[01]\.[0-9a-f]{1,13}p[+-][0-9]{1,4})\.([0-9a-f]{64})\.([0-9a-f]{32})")


def take_cursor(position: tuple[float, str, str]) -> str:
    """The opaque cursor a take answers as ``next`` for a record's ``(stored_unix, sender,
    id)`` position (:meth:`CommunityStore.take_sealed`): ``<float.hex>.<sender>.<id>``, exact
    (a float's hex form round-trips), so no record is skipped or taken twice by it."""
    return f"{float(position[0]).hex()}.{position[1]}.{position[2]}"


def parse_take_cursor(cursor: object) -> tuple[float, str, str]:
    """The ``(stored_unix, sender, id)`` position of a take's ``after`` (:func:`take_cursor`).

    Raises:
        CommunityError: ``take-cursor-invalid`` (400) for anything a take did not answer as
            ``next`` (not a string, another shape, a time that is not finite).
    """
    match = _CURSOR_RE.fullmatch(cursor) if isinstance(cursor, str) and len(cursor) <= 128 else None
    stored = float.fromhex(match.group(1)) if match is not None else float("nan")
    if match is None or not math.isfinite(stored):
        raise CommunityError("take-cursor-invalid", "after is the next cursor a take answered", status=400)
    return stored, match.group(2), match.group(3)


class AckRecord(msgspec.Struct, forbid_unknown_fields=True):
    """One record of an ack: its sender key and its id (records are kept by both)."""

    sender: str
    id: str


class AckBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/v1/mailbox/ack``: the records taken and dealt with (a recipient),
    or withdrawn (their sender)."""

    records: list[AckRecord]


class FeedbackBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/v1/sessions/{session_id}/feedback``."""

    rating: int
    comment: str | None = None


# --- responses -----------------------------------------------------------------------------
def new_post_id() -> str:
    """A fresh server-assigned ``post_id``: 32 lowercase hex characters (128 random bits).

    Hex, not base64url: an id starting with ``-`` would read as an option on a command line
    (``kith join -5C9...``).
    """
    return secrets.token_hex(POST_ID_BYTES)


class RateLimited(CommunityError):
    """429 ``rate-limited`` carrying the seconds until the bucket has a token."""

    def __init__(self, wait_s: float, what: str) -> None:
        super().__init__("rate-limited", f"too many requests from this {what}; retry later",
                         status=429)
        self.wait_s = wait_s


async def _on_kith_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KithError)
    status = exc.status  # 400 unless the raise site gave one (KithError.status)
    headers = ({"Retry-After": retry_after_header(exc.wait_s)}
               if isinstance(exc, RateLimited) else None)
    if status == 503:
        headers = {"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)}
    return error_response(exc.code, exc.message, status, headers)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return error_response("method-not-allowed", "that method is not allowed on this route",
                              405, headers=exc.headers)
    if exc.status_code == 404:
        return error_response("not-found", "no such route", 404)
    return error_response("server-error", "the request could not be handled", exc.status_code)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response("internal-error", "an internal error occurred", 500)


def _used_up(state: str, row: InvitationRow, *, consumed_status: int, then: str = "") -> CommunityError | None:
    """The refusal of an invitation no one may join any more, or None for any other ``state``:
    ``invitation-withdrawn`` (410), or ``invitation-consumed`` with ``consumed_status`` (410
    to a reader, 409 to a session proof that came too late) and ``then`` after its message."""
    if state == "withdrawn":
        return CommunityError("invitation-withdrawn", "the host withdrew this invitation", status=410)
    if state == "consumed":
        return CommunityError("invitation-consumed", f"the invitation allowed {row.max_sessions} session(s) "
                              f"and they were used{then}", status=consumed_status)
    return None


def _time(unix: float | None) -> str | None:
    return None if unix is None else rfc3339(datetime.fromtimestamp(unix, timezone.utc))


# --- request plumbing ---------------------------------------------------------------------
def _raw_path(request: Request) -> str:
    """The path exactly as received (percent-encoded), with ``?query`` when present."""
    raw = request.scope.get("raw_path") or request.url.path.encode("utf-8")
    path = raw.decode("latin-1")
    query = request.scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


def decode_json(body: bytes, kind: type | None = None, *, what: str = "body",
                empty: bool = False) -> Any:
    """Decode a request body as a JSON object (or into the msgspec ``kind``).

    Args:
        empty: accept an empty body as ``{}``.

    Raises:
        CommunityError: 400 ``request-invalid`` — not JSON, not UTF-8, not an object,
            nested deeper than :data:`MAX_JSON_DEPTH`, or not the shape of ``kind``
            (the message names the field).
    """
    if empty and not body.strip():
        body = b"{}"
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        raise CommunityError("request-invalid", f"the {what} is not JSON", status=400) from None
    if not isinstance(data, dict):
        raise CommunityError("request-invalid", f"the {what} must be a JSON object", status=400)
    if too_deep(data):
        raise CommunityError("request-invalid",
                             f"the {what} nests deeper than {MAX_JSON_DEPTH} levels", status=400)
    if kind is None:
        return data
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise CommunityError("request-invalid", f"{what}: {exc}", status=400) from None


def _plain_text(value: str, field: str, max_chars: int, *, code: str = "request-invalid",
                allow_empty: bool = True) -> str:
    """Refuse control characters, over-long or (unless allowed) blank text."""
    if len(value) > max_chars:
        raise CommunityError(code, f"{field} is longer than {max_chars} characters", status=400)
    if not allow_empty and not value.strip():
        raise CommunityError(code, f"{field} must not be empty", status=400)
    if any(unicodedata.category(ch) == "Cc" or ch in _BIDI_CONTROLS for ch in value):
        raise CommunityError(code, f"{field} must not contain control characters", status=400)
    return value


#: Bidirectional-text controls: they can make a name or comment display as another.
_BIDI_CONTROLS = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                           "\u2066\u2067\u2068\u2069")


def _public_key_param(value: str) -> str | None:
    try:
        return check_hex(value, PUBLIC_KEY_HEX_LEN, "public key")
    except SigningError:
        return None


class _App:
    """Route handlers sharing one store, body caps, rate limits and clock."""

    def __init__(self, store: CommunityStore, *, max_body_bytes: int, max_spec_bytes: int,
                 rate_limits: RateLimits, clock: Callable[[], float],
                 lease_ttl_s: float, mailbox: MailboxLimits | None = None,
                 mailbox_admits: Callable[[str, tuple[str, ...]], bool] | None = None) -> None:
        self.store = store
        self.mailbox = mailbox
        self.mailbox_admits = mailbox_admits
        self.max_body_bytes = max_body_bytes
        self.max_spec_bytes = max_spec_bytes
        self.clock = clock
        self.lease_ttl_s = lease_ttl_s
        # in the database, so every instance on it shares them
        self.key_buckets = SharedBuckets(store, rate_limits.per_key, "key", clock=clock)
        self.address_buckets = SharedBuckets(store, rate_limits.per_address, "addr",
                                             clock=clock)

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    def limited(self, handler: Callable[[Request], Awaitable[JSONResponse]]
                ) -> Callable[[Request], Awaitable[JSONResponse]]:
        """Wrap a route handler with the per-address bucket (checked before the body)."""

        @functools.wraps(handler)
        async def wrapper(request: Request) -> JSONResponse:
            address = request.client.host if request.client else "unknown"
            wait = await self.address_buckets.take(address)
            if wait:
                raise RateLimited(wait, "address")
            return await handler(request)

        return wrapper

    async def _signed_body(self, request: Request, cap: int | None = None
                           ) -> tuple[SignedRequest, bytes]:
        """Read the bounded body, verify the request signature, take a token from the
        key's bucket, refuse a replayed nonce."""
        body = await read_body(request, cap or self.max_body_bytes)
        now = self.clock()
        signed = check_signed_request(request.headers, method=request.method,
                                      path=_raw_path(request), body=body, now=now)
        wait = await self.key_buckets.take(signed.public_key)
        if wait:
            raise RateLimited(wait, "key")
        fresh = await self._db(self.store.remember_nonce, signed.nonce, signed.public_key,
                               signed.timestamp, now=now, window_s=REQUEST_WINDOW_S)
        if not fresh:
            raise CommunityError("request-replayed", "that request nonce was already used",
                                 status=409)
        return signed, body

    # GET /api/v1/health
    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": SERVICE, "version": node.__version__})

    # --- identities ------------------------------------------------------------------------
    # POST /api/v1/identities
    async def register_identity(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request)
        profile = decode_json(body, ProfileBody, what="profile")
        _plain_text(profile.display_name, "display_name", MAX_DISPLAY_NAME_CHARS,
                    allow_empty=False)
        _plain_text(profile.about, "about", MAX_ABOUT_CHARS)
        skeletons = name_skeletons(profile.display_name)
        if not skeletons:
            raise CommunityError("request-invalid", "display_name must contain something "
                                 "besides spaces and format characters", status=400)
        created = await self._db(self.store.upsert_identity, signed.public_key,
                                 display_name=profile.display_name, about=profile.about,
                                 now=self.clock(), skeletons=skeletons)
        if created is None:
            raise CommunityError("display-name-taken", "another identity already uses a "
                                 "display name that looks like this one; choose another",
                                 status=409)
        record = await self._db(self.store.get_identity, signed.public_key)
        return JSONResponse(_identity_json(record), status_code=201 if created else 200,
                            headers={"Location": f"{API_PREFIX}/identities/{signed.public_key}"})

    # GET /api/v1/identities/{public_key}
    async def get_identity(self, request: Request) -> JSONResponse:
        key = _public_key_param(request.path_params["public_key"])
        record = await self._db(self.store.get_identity, key) if key else None
        if record is None:
            raise CommunityError("identity-not-found", "no identity with that public key",
                                 status=404)
        return JSONResponse(_identity_json(record))

    # --- revocation lists (specs/peers.md §10) --------------------------------------------------
    # POST /api/v1/revocations
    async def publish_revocation(self, request: Request) -> JSONResponse:
        from node.trust.revocation_list import MAX_LIST_BYTES, check_list

        signed, body = await self._signed_body(request, MAX_LIST_BYTES + 1024)
        raw = decode_json(body, what="revocation list")
        try:
            checked = check_list(raw)
        except KithError as exc:  # revocation-malformed / -forged
            raise CommunityError("request-invalid", exc.message, status=400) from None
        outcome = await self._db(self.store.put_revocation, checked.person, checked.seq, checked.doc,
                                 published_by=signed.public_key, now=self.clock())
        if outcome == "stale":
            raise KithError("revocation-stale", "a newer revocation list of that person is kept here",
                            status=409)
        return JSONResponse({"person_key": checked.person, "seq": checked.seq, "stored": outcome == "new"},
                            status_code=201 if outcome == "new" else 200,
                            headers={"Location": f"{API_PREFIX}/revocations/{checked.person}"})

    # GET /api/v1/revocations/{person_key}
    async def get_revocation(self, request: Request) -> JSONResponse:
        key = _public_key_param(request.path_params["person_key"])
        doc = await self._db(self.store.get_revocation, key) if key else None
        if doc is None:
            raise CommunityError("revocation-not-found", "no revocation list of that person key", status=404)
        return JSONResponse(doc)

    # --- device cards (specs/peers.md §13) ----------------------------------------------------
    # POST /api/v1/cards
    async def publish_card(self, request: Request) -> JSONResponse:
        from node.trust.card import MAX_CARD_BYTES, check_card
        from node.trust.invitation import parse_rfc3339

        signed, body = await self._signed_body(request, MAX_CARD_BYTES + 1024)
        raw = decode_json(body, what="device card")
        try:
            card = check_card(raw, device=signed.public_key)  # only a device posts its own card
        except KithError as exc:  # card-malformed / -forged / -wrong-device
            raise KithError(exc.code, exc.message, status=400) from None
        expires = parse_rfc3339(card.invitation.expires_at).timestamp()
        outcome = await self._db(self.store.put_card, card.device, card.person, card.seq, card.doc,
                                 expires_unix=expires, now=self.clock())
        if outcome == "stale":
            raise KithError("card-stale", "a newer card of that device is kept here", status=409)
        return JSONResponse({"person_key": card.person, "device_key": card.device, "seq": card.seq,
                             "stored": outcome == "new"}, status_code=201 if outcome == "new" else 200,
                            headers={"Location": f"{API_PREFIX}/cards/{card.person}"})

    # GET /api/v1/cards/{person_key}
    async def get_cards(self, request: Request) -> JSONResponse:
        key = _public_key_param(request.path_params["person_key"])
        cards = await self._db(self.store.get_cards, key, now=self.clock()) if key else []
        if not cards:
            raise CommunityError("card-not-found", "no live card of that person key", status=404)
        return JSONResponse({"person_key": key, "cards": cards})

    # --- the mailbox of sealed records (specs/sealed.md) ------------------------------------
    def _mailbox_limits(self) -> MailboxLimits:
        if self.mailbox is None:
            raise CommunityError("mailbox-off", "this community server keeps no mailbox (it runs without "
                                 "--mailbox)", status=404)
        return self.mailbox

    # POST /api/v1/mailbox
    async def put_sealed(self, request: Request) -> JSONResponse:
        from node.trust.sealed import check_envelope

        limits = self._mailbox_limits()
        signed, body = await self._signed_body(request, MAX_SEALED_BODY_BYTES)
        raw = decode_json(body, what="sealed record")
        try:
            env = check_envelope(raw, now=self.clock())
        except KithError as exc:  # sealed-malformed / -wrong-size / -expired
            raise KithError(exc.code, exc.message, status=400) from None
        if env.sender != signed.public_key:
            raise CommunityError("forbidden", "a sealed record is put by its sender's key", status=403)
        if self.mailbox_admits is not None and not self.mailbox_admits(env.sender, env.recipients):
            raise CommunityError("mailbox-not-held", "this holder keeps mail only to or from its person's devices",
                                 status=403)
        outcome = await self._db(self.store.put_sealed, record_id=env.id, sender=env.sender, recipients=env.wrapped,
                                 bucket=env.bucket, box=env.box, created_unix=env.created_unix,
                                 expires_unix=env.expires_unix, limits=limits, now=self.clock())
        return JSONResponse({"id": env.id, "stored": outcome == "new", "expires": raw["expires"]},
                            status_code=201 if outcome == "new" else 200)

    # POST /api/v1/mailbox/take
    async def take_sealed(self, request: Request) -> JSONResponse:
        from node.trust.sealed import Envelope

        self._mailbox_limits()
        signed, body = await self._signed_body(request)
        take = decode_json(body, TakeBody, what="take", empty=True)
        if isinstance(take.limit, bool) or not 1 <= take.limit <= MAX_TAKE:
            raise CommunityError("request-invalid", f"limit is 1 to {MAX_TAKE}", status=400)
        after = parse_take_cursor(take.after) if take.after is not None else None
        rows, more = await self._db(self.store.take_sealed, signed.public_key, limit=take.limit,
                                    max_bytes=MAX_TAKE_BYTES, now=self.clock(), after=after)
        records = [Envelope(r["id"], r["sender"], tuple(r["recipients"]), r["recipients"], int(r["created_unix"]),
                            int(r["expires_unix"]), r["bucket"], r["box"]).as_json() for r in rows]
        answer: dict[str, Any] = {"records": records, "more": more}
        if rows:
            answer["next"] = take_cursor(rows[-1]["position"])
        return JSONResponse(answer)

    # POST /api/v1/mailbox/ack
    async def ack_sealed(self, request: Request) -> JSONResponse:
        self._mailbox_limits()
        signed, body = await self._signed_body(request)
        ack = decode_json(body, AckBody, what="ack")
        if not 1 <= len(ack.records) <= MAX_TAKE or any(
                _RECORD_ID_RE.fullmatch(r.id) is None or _SENDER_KEY_RE.fullmatch(r.sender) is None
                for r in ack.records):
            raise CommunityError("request-invalid", f"records is 1 to {MAX_TAKE} records, each a sender key "
                                 "(64 lowercase hex) and a record id (32 lowercase hex)", status=400)
        removed = await self._db(self.store.ack_sealed, signed.public_key, [(r.sender, r.id) for r in ack.records])
        return JSONResponse({"removed": removed})

    # --- protocols -------------------------------------------------------------------------
    # POST /api/v1/protocols
    async def publish_protocol(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request, self.max_spec_bytes)
        raw = decode_json(body, what="spec")
        spec = parse_published_spec(raw)
        created = await self._db(self.store.insert_protocol, protocol_id=spec.protocol_id,
                                 name=spec.name, version=spec.version, spec=raw,
                                 published_by=signed.public_key, now=self.clock())
        record = await self._db(self.store.get_protocol, spec.protocol_id)
        return JSONResponse(_protocol_json(record), status_code=201 if created else 200,
                            headers={"Location": f"{API_PREFIX}/protocols/{spec.protocol_id}"})

    # GET /api/v1/protocols/{protocol_id}
    async def get_protocol(self, request: Request) -> JSONResponse:
        protocol_id = request.path_params["protocol_id"]
        record = None
        if _public_key_param(protocol_id):  # same shape: 64 lowercase hex
            record = await self._db(self.store.get_protocol, protocol_id)
        if record is None:
            raise CommunityError("protocol-id-not-found", "no protocol spec with that "
                                 "protocol_id was published here", status=404)
        return JSONResponse(_protocol_json(record))

    # --- invitations -----------------------------------------------------------------------
    # POST /api/v1/invitations
    async def publish_invitation(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request)
        if len(body) > MAX_INVITATION_BYTES:
            raise CommunityError("request-too-large", "an invitation is at most 64 KiB",
                                 status=413)
        data = decode_json(body, what="invitation")
        listed = request.query_params.get("listed", "true")
        if listed not in ("true", "false") or len(request.query_params) > 1 or \
                (request.query_params and "listed" not in request.query_params):
            raise CommunityError("request-invalid", "the only query parameter of a publish is listed=true|false",
                                 status=400)
        post_id = new_post_id()
        data["post_id"] = post_id  # any client-side post_id is ignored: the server assigns it
        inv = parse_invitation(data)  # InvitationError invitation-malformed → 400
        if signed.public_key != inv.host_public_key:
            raise CommunityError("forbidden", "only the invitation's host key may publish it",
                                 status=403)
        now = self.clock()
        expires_unix = check_invitation(inv, now=now)
        check_invitation_fields(inv, expires_unix=expires_unix, now=now)
        document = inv.to_dict()
        for _ in range(3):  # a collision of 128 random bits does not happen; stay correct anyway
            if await self._db(self.store.insert_invitation, post_id=inv.post_id,
                              host_public_key=inv.host_public_key,
                              protocol_id=inv.protocol.protocol_id,
                              protocol_name=inv.protocol.name, document=document,
                              expires_unix=expires_unix, max_sessions=inv.max_sessions,
                              tags=inv.tags, now=now, lease_unix=now + self.lease_ttl_s,
                              unlisted=listed == "false"):
                break
            inv.post_id = document["post_id"] = new_post_id()
        else:
            raise KithError("internal-error", "could not assign a post_id", status=500)
        return JSONResponse(document, status_code=201,
                            headers={"Location": f"{API_PREFIX}/invitations/{inv.post_id}"})

    # GET /api/v1/invitations
    async def browse_invitations(self, request: Request) -> JSONResponse:
        query = parse_browse_query(request.query_params.multi_items())
        rows = await self._db(self.store.browse_invitations, now=self.clock(), **query)
        now = self.clock()
        items = [_post_json(row, now) for row in rows]
        next_cursor = str(rows[-1].seq) if len(rows) == query["limit"] else None
        return JSONResponse({"invitations": items, "next_cursor": next_cursor})

    async def _invitation(self, post_id: str) -> InvitationRow:
        row = await self._db(self.store.get_invitation, post_id) \
            if POST_ID_RE.fullmatch(post_id) else None
        if row is None:
            raise InvitationError("invitation-not-found", "no invitation with that post_id",
                                  status=404)
        return row

    # GET /api/v1/invitations/{post_id}
    async def get_invitation(self, request: Request) -> JSONResponse:
        row = await self._invitation(request.path_params["post_id"])
        state = row.state(self.clock())
        gone = _used_up(state, row, consumed_status=410, then="; ask the host for a new post_id")
        if gone is not None:
            raise gone
        if state == "expired":
            raise InvitationError("invitation-expired",
                                  f"the invitation expired at {row.document.get('expires_at')}",
                                  status=410)
        if state == "offline":
            raise CommunityError("invitation-host-offline",
                                 "the host has not refreshed this post's liveness lease since "
                                 f"{_time(row.lease_unix)}: it is not running", status=410)
        headers = ({"Kith-Lease-Expires-At": _time(row.lease_unix)}
                   if row.lease_unix is not None else None)
        return JSONResponse(row.document, headers=headers)

    # GET /api/v1/invitations/{post_id}/status
    async def invitation_status(self, request: Request) -> JSONResponse:
        row = await self._invitation(request.path_params["post_id"])
        return JSONResponse(_post_json(row, self.clock()))

    async def _own_invitation(self, request: Request, signed: SignedRequest) -> InvitationRow:
        row = await self._invitation(request.path_params["post_id"])
        if row.document.get("host_public_key") != signed.public_key:
            raise CommunityError("forbidden", "only the invitation's host key may change it",
                                 status=403)
        return row

    async def _own_invitation_bodiless(self, request: Request, *, what: str) -> InvitationRow:
        """The invitation of a signed change that carries no body (a lease refresh, a
        withdrawal): the signature checked, the body empty, the signer its host key.

        Raises:
            CommunityError: as :meth:`_signed_body`, :func:`decode_json` (naming ``what``) and
                :meth:`_own_invitation`, in that order.
        """
        signed, body = await self._signed_body(request)
        decode_json(body, EmptyBody, what=what, empty=True)
        return await self._own_invitation(request, signed)

    # POST /api/v1/invitations/{post_id}/renew
    async def renew_invitation(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request)
        renew = decode_json(body, RenewBody, what="renewal")
        row = await self._own_invitation(request, signed)
        now = self.clock()
        state = row.state(now)
        if state in ("withdrawn", "consumed"):
            raise CommunityError(f"invitation-{state}",
                                 f"a {state} invitation cannot be renewed; publish a new one",
                                 status=410)
        document = dict(row.document)
        document["expires_at"] = renew.expires_at
        document["transport_binding_signature"] = renew.transport_binding_signature
        inv = parse_invitation(document)
        expires_unix = check_invitation(inv, now=now)
        check_invitation_fields(inv, expires_unix=expires_unix, now=now)
        if not await self._db(self.store.renew_invitation, inv.post_id, document=document,
                              expires_unix=expires_unix, lease_unix=now + self.lease_ttl_s):
            raise CommunityError("invitation-consumed", "the invitation was withdrawn or "
                                 "consumed meanwhile; publish a new one", status=410)
        return JSONResponse(document)

    # POST /api/v1/invitations/{post_id}/lease
    async def refresh_lease(self, request: Request) -> JSONResponse:
        row = await self._own_invitation_bodiless(request, what="lease refresh")
        post_id = row.document["post_id"]
        now = self.clock()
        if row.state(now) in ("live", "offline"):  # a host back after a partition revives it
            await self._db(self.store.refresh_lease, post_id, lease_unix=now + self.lease_ttl_s,
                           now=now)
            row = await self._invitation(post_id)
        out = _post_json(row, self.clock())
        out["lease"] = {"ttl_s": self.lease_ttl_s,
                        "refresh_s": round(self.lease_ttl_s / LEASE_REFRESH_DIVISOR, 3)}
        return JSONResponse(out)

    # POST /api/v1/invitations/{post_id}/withdraw
    async def withdraw_invitation(self, request: Request) -> JSONResponse:
        row = await self._own_invitation_bodiless(request, what="withdrawal")
        post_id = row.document["post_id"]
        await self._db(self.store.withdraw_invitation, post_id, now=self.clock())
        row = await self._invitation(post_id)
        return JSONResponse(_post_json(row, self.clock()))

    # --- sessions --------------------------------------------------------------------------
    # POST /api/v1/sessions
    async def submit_session(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request)
        proof = decode_json(body, SessionProof, what="session proof")
        if signed.public_key not in (proof.host_public_key, proof.guest_public_key):
            raise CommunityError("forbidden", "only a session participant may submit its proof",
                                 status=403)
        check_session_proof(proof)
        if not POST_ID_RE.fullmatch(proof.post_id):
            raise CommunityError("session-invalid", "post_id is not a valid post_id", status=400)
        row = await self._db(self.store.get_invitation, proof.post_id)
        if row is None:
            raise InvitationError("invitation-not-found", "no invitation with that post_id",
                                  status=404)
        if row.document.get("host_public_key") != proof.host_public_key:
            raise CommunityError("session-invalid",
                                 "host_public_key differs from the invitation's host",
                                 status=400)
        if row.document.get("protocol", {}).get("protocol_id") != proof.protocol_id:
            raise CommunityError("session-invalid",
                                 "protocol_id differs from the invitation's protocol", status=400)
        record = msgspec.to_builtins(proof)
        record["created_at"] = _time(self.clock())
        outcome = await self._db(self.store.insert_session, record)
        if outcome == "duplicate":
            raise CommunityError("session-duplicate", "that session proof was already recorded",
                                 status=409)
        gone = _used_up(outcome, row, consumed_status=409)
        if gone is not None:
            raise gone
        if outcome == "no-invitation":  # pragma: no cover - invitations are never deleted
            raise InvitationError("invitation-not-found", "no invitation with that post_id",
                                  status=404)
        stored = await self._db(self.store.get_session, proof.session_id)
        return JSONResponse(_session_json(stored), status_code=201,
                            headers={"Location": f"{API_PREFIX}/sessions/{proof.session_id}"})

    async def _session(self, request: Request) -> dict[str, Any]:
        session_id = request.path_params["session_id"]
        record = None
        try:
            check_hex(session_id, SHA256_HEX_LEN, "session_id")
        except SigningError:
            pass
        else:
            record = await self._db(self.store.get_session, session_id)
        if record is None:
            raise CommunityError("session-not-found", "no session with that session_id",
                                 status=404)
        return record

    @staticmethod
    def _participant(record: dict[str, Any], signed: SignedRequest, action: str) -> str:
        """The signer's role in the session, or 403 ``forbidden``."""
        if signed.public_key == record["host_public_key"]:
            return "host"
        if signed.public_key == record["guest_public_key"]:
            return "guest"
        raise CommunityError("forbidden", f"only a session participant may {action} it",
                             status=403)

    # GET /api/v1/sessions/{session_id}
    async def get_session(self, request: Request) -> JSONResponse:
        return JSONResponse(_session_json(await self._session(request)))

    # POST /api/v1/sessions/{session_id}/close
    async def close_session(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request)
        close = decode_json(body, CloseBody, what="close request", empty=True)
        if not CLOSE_REASON_RE.fullmatch(close.reason):
            raise CommunityError("request-invalid", "reason must be 1-64 of a-z 0-9 - "
                                 "starting with a letter or digit", status=400)
        record = await self._session(request)
        self._participant(record, signed, "close")
        if not await self._db(self.store.close_session, record["session_id"],
                              closed_by=signed.public_key, reason=close.reason,
                              now=self.clock()):
            raise ProtocolViolation("session-closed", "the session is already closed", status=409)
        return JSONResponse(_session_json(await self._session(request)))

    # POST /api/v1/sessions/{session_id}/feedback
    async def submit_feedback(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request)
        feedback = decode_json(body, FeedbackBody, what="feedback")
        if not 1 <= feedback.rating <= 5:
            raise CommunityError("request-invalid", "rating must be an integer from 1 to 5",
                                 status=400)
        if feedback.comment is not None:
            _plain_text(feedback.comment, "comment", MAX_COMMENT_CHARS)
        record = await self._session(request)
        role = self._participant(record, signed, "rate")
        subject = record["guest_public_key" if role == "host" else "host_public_key"]
        if not await self._db(self.store.insert_feedback, session_id=record["session_id"],
                              rater_public_key=signed.public_key, subject_public_key=subject,
                              rater_role=role, rating=feedback.rating,
                              comment=feedback.comment, now=self.clock()):
            raise CommunityError("feedback-duplicate",
                                 "you already rated this session (one rating per participant)",
                                 status=409)
        return JSONResponse(await self._feedback_json(record["session_id"]), status_code=201)

    # GET /api/v1/sessions/{session_id}/feedback
    async def get_feedback(self, request: Request) -> JSONResponse:
        record = await self._session(request)
        return JSONResponse(await self._feedback_json(record["session_id"]))

    async def _feedback_json(self, session_id: str) -> dict[str, Any]:
        rows = await self._db(self.store.list_feedback, session_id)
        return {"session_id": session_id, "feedback": [
            {"rater_public_key": r["rater_public_key"], "rater_role": r["rater_role"],
             "rating": r["rating"], "comment": r["comment"],
             "created_at": _time(r["created_unix"])} for r in rows]}


# --- JSON shapes ---------------------------------------------------------------------------
def _identity_json(record: dict[str, Any]) -> dict[str, Any]:
    count = record["ratings_count"]
    return {"public_key": record["public_key"], "display_name": record["display_name"],
            "about": record["about"], "created_at": _time(record["created_unix"]),
            "updated_at": _time(record["updated_unix"]),
            "ratings": {"count": count,
                        "average": round(record["ratings_sum"] / count, 2) if count else None}}


def _protocol_json(record: dict[str, Any]) -> dict[str, Any]:
    return {"protocol_id": record["protocol_id"], "name": record["name"],
            "version": record["version"], "spec": record["spec"],
            "published_by": record["published_by"], "created_at": _time(record["created_unix"])}


def _post_json(row: InvitationRow, now: float) -> dict[str, Any]:
    """A post: the invitation document with its server-side state (browse, status, lease).

    ``online`` is True while the host's liveness lease holds, False once it lapsed, None
    for a post published before leases (liveness unknown)."""
    return {"post_id": row.document["post_id"], "state": row.state(now),
            "sessions": row.sessions_count, "max_sessions": row.max_sessions,
            "expires_at": row.document.get("expires_at"),
            "withdrawn_at": _time(row.withdrawn_unix),
            "online": None if row.lease_unix is None else row.lease_unix > now,
            "lease_expires_at": _time(row.lease_unix),
            "host_display_name": row.host_display_name, "invitation": row.document}


def _session_json(record: dict[str, Any]) -> dict[str, Any]:
    out = {k: record[k] for k in (
        "session_id", "post_id", "protocol_id", "host_public_key", "guest_public_key",
        "guest_nonce", "host_nonce", "host_signature", "guest_signature", "created_at")}
    out["state"] = "open" if record["closed_unix"] is None else "closed"
    out["closed_at"] = _time(record["closed_unix"])
    out["closed_by"] = record["closed_by"]
    out["close_reason"] = record["close_reason"]
    return out


# --- verification (pure) ------------------------------------------------------------------
def parse_browse_query(items: list[tuple[str, str]]) -> dict[str, Any]:
    """Check the browse query string: ``protocol`` (a name, or a 64-hex protocol_id),
    ``tag``, ``host`` (64 hex), ``limit`` (1-100, default 20), ``cursor`` (from
    ``next_cursor``); each at most once, nothing else.

    Returns:
        Keyword arguments for :meth:`CommunityStore.browse_invitations` (without ``now``).

    Raises:
        CommunityError: 400 ``request-invalid`` naming the parameter.
    """
    allowed = ("protocol", "tag", "host", "limit", "cursor")
    seen: dict[str, str] = {}
    for name, value in items:
        if name not in allowed:
            raise CommunityError("request-invalid", f"unknown query parameter {name[:32]!r}; "
                                 f"use {', '.join(allowed)}", status=400)
        if name in seen:
            raise CommunityError("request-invalid", f"query parameter {name} given twice",
                                 status=400)
        seen[name] = value
    out: dict[str, Any] = {"limit": DEFAULT_BROWSE_LIMIT}
    if "protocol" in seen:
        value = seen["protocol"]
        if re.fullmatch(r"[0-9a-f]{64}", value):
            out["protocol_id"] = value
        elif PROTOCOL_NAME_RE.fullmatch(value):
            out["protocol_name"] = value
        else:
            raise CommunityError("request-invalid", "protocol must be a protocol name or a "
                                 "64-hex protocol_id", status=400)
    if "tag" in seen:
        if not TAG_RE.fullmatch(seen["tag"]):
            raise CommunityError("request-invalid", "tag must be 1-32 of A-Z a-z 0-9 . _ + - "
                                 "starting with a letter or digit", status=400)
        out["tag"] = seen["tag"]
    if "host" in seen:
        if _public_key_param(seen["host"]) is None:
            raise CommunityError("request-invalid", "host must be a 64-hex public key",
                                 status=400)
        out["host_public_key"] = seen["host"]
    if "limit" in seen:
        value = seen["limit"]
        if not re.fullmatch(r"[0-9]{1,3}", value) or not 1 <= int(value) <= MAX_BROWSE_LIMIT:
            raise CommunityError("request-invalid",
                                 f"limit must be an integer from 1 to {MAX_BROWSE_LIMIT}",
                                 status=400)
        out["limit"] = int(value)
    if "cursor" in seen:
        if not re.fullmatch(r"[1-9][0-9]{0,17}", seen["cursor"]):
            raise CommunityError("request-invalid", "cursor must be a next_cursor value",
                                 status=400)
        out["before_seq"] = int(seen["cursor"])
    return out


def parse_published_spec(raw: dict[str, Any]) -> Any:
    """Check a published protocol spec like a local ``spec.json`` (DESIGN §7) and compute
    its ``protocol_id`` (SHA-256 of the RFC 8785 canonical JSON, DESIGN §4).

    Returns:
        The :class:`node.protocol.spec.ProtocolSpec`.

    Raises:
        SpecError: 400 ``spec-invalid`` (meta-schema, reserved actions, message schemas,
            or a value RFC 8785 cannot canonicalise, e.g. an integer beyond 2**53).
    """
    try:
        return parse_spec(raw, origin="spec")
    except SpecError:
        raise
    except (ValueError, TypeError, RecursionError):
        raise SpecError("spec-invalid", "spec: a value cannot be canonicalised "
                                        "(RFC 8785: integers within 2**53, finite numbers)") from None


def check_invitation(inv: Invitation, *, now: float) -> float:
    """Verify a published invitation without parsing its iroh ticket (DESIGN §5, §12).

    Checks, in order: strict hex of ``host_public_key``, ``transport_info.endpoint_id``,
    ``transport_binding_signature`` and ``protocol.protocol_id``; the binding signature over
    :meth:`Invitation.binding_payload` by ``host_public_key``; ``iroh_ticket`` (when present)
    equals ``transport_info.ticket``; ``transport_info.endpoint_id`` equals
    ``host_public_key``; ``expires_at`` is RFC 3339 and later than ``now``.

    Args:
        inv: a structurally valid invitation (from :func:`parse_invitation`).
        now: the server's Unix time in seconds.

    Returns:
        ``expires_at`` as Unix seconds.

    Raises:
        InvitationError: ``invitation-bad-hex``, ``invitation-bad-signature``,
            ``invitation-ticket-mismatch``, ``invitation-endpoint-mismatch``,
            ``invitation-malformed`` (bad ``expires_at``), ``invitation-expired`` (all 400).
    """
    check_binding(inv)
    if inv.transport_info.endpoint_id != inv.host_public_key:
        raise InvitationError("invitation-endpoint-mismatch",
                              "transport_info.endpoint_id differs from host_public_key")
    try:
        expires = parse_rfc3339(inv.expires_at).timestamp()
    except ValueError:
        raise InvitationError("invitation-malformed", "expires_at is not RFC 3339") from None
    if expires <= now:
        raise InvitationError("invitation-expired", f"the invitation expired at {inv.expires_at}")
    return expires


def check_invitation_fields(inv: Invitation, *, expires_unix: float, now: float) -> None:
    """The server's bounds on what it lists (after :func:`check_invitation`).

    Checks, in order: ``expires_at`` at most 30 days ahead; ``max_sessions`` absent or
    1-1,000,000; at most 16 ``tags``, each 1-32 of ``A-Z a-z 0-9 . _ + -`` starting with a
    letter or digit; ``message`` at most 1000 characters without control characters.

    Raises:
        InvitationError: 400 ``invitation-malformed`` naming the field.
    """
    if expires_unix > now + MAX_INVITATION_TTL_S:
        raise InvitationError("invitation-malformed",
                              "expires_at is more than 30 days after the server clock")
    if inv.max_sessions is not None and not 1 <= inv.max_sessions <= MAX_SESSIONS_LIMIT:
        raise InvitationError("invitation-malformed",
                              f"max_sessions must be from 1 to {MAX_SESSIONS_LIMIT}")
    if len(inv.tags) > MAX_TAGS:
        raise InvitationError("invitation-malformed", f"at most {MAX_TAGS} tags")
    for tag in inv.tags:
        if not TAG_RE.fullmatch(tag):
            raise InvitationError("invitation-malformed", "a tag is 1-32 of A-Z a-z 0-9 . _ + - "
                                  "starting with a letter or digit")
    if inv.message is not None:
        try:
            _plain_text(inv.message, "message", MAX_MESSAGE_CHARS)
        except CommunityError as exc:
            raise InvitationError("invitation-malformed", exc.message) from None


def check_session_proof(proof: SessionProof) -> None:
    """Recompute the session payload and verify ``session_id`` and both role signatures.

    The host signature must verify over ``role_message("host", payload)`` with
    ``host_public_key`` and the guest signature over ``role_message("guest", payload)`` with
    ``guest_public_key`` (DESIGN §4), so one can never stand for the other.

    A proof whose host and guest are the same key is refused too (nobody rates themselves).

    Raises:
        CommunityError: ``session-invalid`` (400) naming the first check that failed.
    """
    try:
        payload = session_payload(
            post_id=proof.post_id, protocol_id=proof.protocol_id,
            host_public_key=proof.host_public_key, guest_public_key=proof.guest_public_key,
            guest_nonce=proof.guest_nonce, host_nonce=proof.host_nonce)
    except SigningError as exc:
        raise CommunityError("session-invalid", exc.message, status=400) from None
    if proof.host_public_key == proof.guest_public_key:
        raise CommunityError("session-invalid", "host and guest are the same key", status=400)
    if session_id_of(payload) != proof.session_id:
        raise CommunityError("session-invalid",
                             "session_id is not the SHA-256 of the session payload", status=400)
    for role, key, signature in (("host", proof.host_public_key, proof.host_signature),
                                 ("guest", proof.guest_public_key, proof.guest_signature)):
        try:
            verify(key, role_message(role, payload), signature, field=f"{role}_signature")
        except SigningError:
            raise CommunityError("session-invalid", f"{role}_signature does not verify",
                                 status=400) from None


# --- the app ---------------------------------------------------------------------------------
def create_app(database: Path | str | CommunityStore, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_spec_bytes: int = DEFAULT_MAX_SPEC_BYTES,
               rate_limits: RateLimits | None = None,
               clock: Callable[[], float] = time.time,
               lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
               mailbox: MailboxLimits | None = None,
               mailbox_admits: Callable[[str, tuple[str, ...]], bool] | None = None) -> Starlette:
    """Build the community server ASGI app.

    Args:
        database: a SQLite file path (created with its folder if missing; usually
            :func:`node.community.store.default_db_path` of the server's home), a database
            URL (``postgresql://...``, ``sqlite:///...``) or an open store.
        max_body_bytes: the largest accepted request body, in bytes (default 64 KiB).
        max_spec_bytes: the largest accepted protocol spec body, in bytes (default 256 KiB).
        rate_limits: per-key and per-address token buckets (default :class:`RateLimits`).
        clock: returns the current Unix time in seconds (tests inject one).
        lease_ttl_s: how long a post's liveness lease holds after a refresh, in seconds
            (default 24; hosts refresh every third of it).
        mailbox: keep sealed records within these bounds (``kith community serve
            --mailbox``; specs/sealed.md); None (the default): the mailbox routes answer
            404 ``mailbox-off``.
        mailbox_admits: ``(sender key, recipient keys) → bool``, asked for every record put
            after its envelope is checked; False refuses it ``403 mailbox-not-held`` (a
            person's device holding mail, ``kith host --hold-mail``, keeps only records to or
            from its person's devices: specs/sealed.md §7b). None: every record is admitted.

    Returns:
        A Starlette app serving the routes of ``specs/community-api.md``; its store is
        ``app.state.store`` (close it with ``app.state.store.close()`` when done).

    Raises:
        UsageError / ConfigError / CommunityError: from :func:`open_store`.
    """
    store = database if isinstance(database, CommunityStore) else open_store(database)
    h = _App(store, max_body_bytes=max_body_bytes, max_spec_bytes=max_spec_bytes,
             rate_limits=rate_limits or RateLimits(), clock=clock, lease_ttl_s=lease_ttl_s,
             mailbox=mailbox, mailbox_admits=mailbox_admits)
    p = API_PREFIX
    table: list[tuple[str, Callable[[Request], Awaitable[JSONResponse]], str]] = [
        (f"{p}/health", h.health, "GET"),
        (f"{p}/identities", h.register_identity, "POST"),
        (f"{p}/identities/{{public_key}}", h.get_identity, "GET"),
        (f"{p}/revocations", h.publish_revocation, "POST"),
        (f"{p}/revocations/{{person_key}}", h.get_revocation, "GET"),
        (f"{p}/cards", h.publish_card, "POST"),
        (f"{p}/cards/{{person_key}}", h.get_cards, "GET"),
        (f"{p}/mailbox", h.put_sealed, "POST"),
        (f"{p}/mailbox/take", h.take_sealed, "POST"),
        (f"{p}/mailbox/ack", h.ack_sealed, "POST"),
        (f"{p}/protocols", h.publish_protocol, "POST"),
        (f"{p}/protocols/{{protocol_id}}", h.get_protocol, "GET"),
        (f"{p}/invitations", h.publish_invitation, "POST"),
        (f"{p}/invitations", h.browse_invitations, "GET"),
        (f"{p}/invitations/{{post_id}}", h.get_invitation, "GET"),
        (f"{p}/invitations/{{post_id}}/status", h.invitation_status, "GET"),
        (f"{p}/invitations/{{post_id}}/renew", h.renew_invitation, "POST"),
        (f"{p}/invitations/{{post_id}}/withdraw", h.withdraw_invitation, "POST"),
        (f"{p}/invitations/{{post_id}}/lease", h.refresh_lease, "POST"),
        (f"{p}/sessions", h.submit_session, "POST"),
        (f"{p}/sessions/{{session_id}}", h.get_session, "GET"),
        (f"{p}/sessions/{{session_id}}/close", h.close_session, "POST"),
        (f"{p}/sessions/{{session_id}}/feedback", h.submit_feedback, "POST"),
        (f"{p}/sessions/{{session_id}}/feedback", h.get_feedback, "GET"),
    ]
    # one Route per path with a method dispatcher, so a wrong method answers 405 (not 404)
    by_path: dict[str, dict[str, Callable[[Request], Awaitable[JSONResponse]]]] = {}
    for path, handler, method in table:
        by_path.setdefault(path, {})[method] = h.limited(handler)
    routes = []
    for path, methods in by_path.items():
        async def dispatch(request: Request, _methods=methods) -> JSONResponse:
            method = "GET" if request.method == "HEAD" else request.method
            return await _methods[method](request)

        routes.append(Route(path, dispatch, methods=list(methods)))
    app = Starlette(routes=routes, exception_handlers={
        KithError: _on_kith_error,
        HTTPException: _on_http_error,
        Exception: _on_unexpected,
    })
    app.state.store = store
    return app


@contextlib.contextmanager
def run_server_in_thread(database: Path | str | CommunityStore, host: str = "127.0.0.1",
                         port: int = 0, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                         max_spec_bytes: int = DEFAULT_MAX_SPEC_BYTES,
                         rate_limits: RateLimits | None = None,
                         clock: Callable[[], float] = time.time,
                         lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
                         startup_timeout_s: float = 10.0,
                         trust_proxy: list[str] | None = None,
                         mailbox: MailboxLimits | None = None,
                         mailbox_admits: Callable[[str, tuple[str, ...]], bool] | None = None) -> Iterator[str]:
    """Serve a community app in a daemon thread for the duration of a ``with`` block.

    Args:
        database: a SQLite path, a database URL or an open store (see :func:`create_app`;
            a store opened here is closed on exit, a store passed in is left open).
        host, port: where to listen (port 0 = a free port).
        max_body_bytes, max_spec_bytes, rate_limits, clock, lease_ttl_s, mailbox,
            mailbox_admits: passed to :func:`create_app`.
        startup_timeout_s: how long to wait for the server to start, in seconds.
        trust_proxy: reverse proxies (IP/CIDR) whose ``X-Forwarded-For`` is taken as the
            client address; default none (``kith community serve --trust-proxy``).

    Yields:
        The base URL, e.g. ``"http://127.0.0.1:41234"`` (the real port).

    Raises:
        CommunityError: ``server-start-failed`` if the address cannot be bound or the
            server does not start in time.
    """
    app = create_app(database, max_body_bytes=max_body_bytes, max_spec_bytes=max_spec_bytes,
                     rate_limits=rate_limits, clock=clock, lease_ttl_s=lease_ttl_s, mailbox=mailbox,
                     mailbox_admits=mailbox_admits)
    owned = not isinstance(database, CommunityStore)
    try:
        sock = bind_socket(host, port)
    except BaseException:
        if owned:
            app.state.store.close()
        raise
    try:
        with serve_app_in_thread(app, sock, what="the community server",
                                 startup_timeout_s=startup_timeout_s, trust_proxy=trust_proxy) as url:
            yield url
    finally:
        if owned:
            app.state.store.close()
