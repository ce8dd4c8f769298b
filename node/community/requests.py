"""Signed REST requests to the community server (DESIGN §4, §12).

A mutation carries four headers:

- ``X-Kith-Key``: the signer's public key (64 lowercase hex);
- ``X-Kith-Timestamp``: integer Unix seconds;
- ``X-Kith-Nonce``: 32 random bytes as 64 lowercase hex;
- ``X-Kith-Signature``: Ed25519 (128 lowercase hex) over
  :func:`node.trust.signing.request_payload` (method, path with query, timestamp, nonce,
  SHA-256 of the body).

The client side is :func:`signed_headers`. The server side is :func:`check_signed_request`,
which is pure (headers, request line, body and the current time in; the verified
:class:`SignedRequest` or a :class:`~node.common.errors.CommunityError` out). Remembering nonces
to refuse replays needs state, so it lives in the store
(:meth:`node.community.store.CommunityStore.remember_nonce`); the server calls it only
after this check passed, so unauthenticated requests never touch the nonce table.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from node.common.errors import CommunityError, SigningError
from node.trust.identity import Identity
from node.trust.signing import (
    NONCE_HEX_LEN,
    PUBLIC_KEY_HEX_LEN,
    SIGNATURE_HEX_LEN,
    check_hex,
    new_nonce,
    request_payload,
    verify,
)

HEADER_KEY = "X-Kith-Key"
HEADER_TIMESTAMP = "X-Kith-Timestamp"
HEADER_NONCE = "X-Kith-Nonce"
HEADER_SIGNATURE = "X-Kith-Signature"
SIGNED_HEADERS = (HEADER_KEY, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)

#: Accepted clock skew between client and server, in seconds (DESIGN §4: ±300 s).
REQUEST_WINDOW_S = 300

_TIMESTAMP_RE = re.compile(r"0|[1-9][0-9]{0,11}")


@dataclass(frozen=True)
class SignedRequest:
    """A request whose signature verified.

    Attributes:
        public_key: the signer (64 lowercase hex).
        timestamp: the signed Unix time in seconds.
        nonce: the request nonce (64 lowercase hex); the caller must still refuse a nonce
            seen before.
    """

    public_key: str
    timestamp: int
    nonce: str


def signed_headers(identity: Identity, method: str, path: str, body: bytes, *,
                   now: float | None = None, nonce: str | None = None) -> dict[str, str]:
    """Build the four ``X-Kith-*`` headers for one request (DESIGN §4).

    Args:
        identity: the signer.
        method: HTTP method (any case; signed upper-case).
        path: the request path exactly as the server will see it, with the query string
            if any (e.g. ``/api/v1/invitations``). Behind a reverse proxy that rewrites
            paths, sign the path the server receives.
        body: the exact body bytes that will be sent (``b""`` for none).
        now: Unix time in seconds to sign (default: the current time); tests use it to
            make stale requests.
        nonce: 64 lowercase hex (default: a fresh random nonce). Never reuse one.

    Returns:
        ``{"X-Kith-Key": ..., "X-Kith-Timestamp": ..., "X-Kith-Nonce": ...,
        "X-Kith-Signature": ...}``.
    """
    timestamp = int(time.time() if now is None else now)
    nonce = nonce or new_nonce()
    payload = request_payload(method=method, path=path, timestamp=timestamp, nonce=nonce,
                              body=body)
    return {
        HEADER_KEY: identity.public_key,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: identity.sign(payload),
    }


def check_signed_request(headers: Mapping[str, str], *, method: str, path: str, body: bytes,
                         now: float, window_s: int = REQUEST_WINDOW_S) -> SignedRequest:
    """Verify a signed request's headers against its request line and body.

    Checks, in order: all four headers present; key, nonce and signature strict hex and
    the timestamp a plain non-negative integer; the signature verifies; the timestamp is
    within ``±window_s`` seconds of ``now``. Replay (a nonce seen before) is the caller's
    job, after this returns.

    Args:
        headers: the request headers (a case-insensitive mapping such as Starlette's
            ``Headers``, or a dict with the canonical header names).
        method: the HTTP method received.
        path: the raw path received, with ``?query`` when there is one.
        body: the body bytes received.
        now: the server's current Unix time in seconds.

    Returns:
        The :class:`SignedRequest` (signer key, timestamp, nonce).

    Raises:
        CommunityError: ``request-unsigned`` (401) when a header is missing,
            ``request-bad-signature`` (401) for malformed values or a signature that does
            not verify, ``request-stale`` (401) outside the window.
    """
    values = {}
    for name in SIGNED_HEADERS:
        value = headers.get(name)
        if value is None:
            value = headers.get(name.lower())
        if value is None:
            raise CommunityError("request-unsigned", f"the {name} header is missing", status=401)
        values[name] = value
    key, ts_text = values[HEADER_KEY], values[HEADER_TIMESTAMP]
    nonce, signature = values[HEADER_NONCE], values[HEADER_SIGNATURE]
    try:
        check_hex(key, PUBLIC_KEY_HEX_LEN, HEADER_KEY)
        check_hex(nonce, NONCE_HEX_LEN, HEADER_NONCE)
        check_hex(signature, SIGNATURE_HEX_LEN, HEADER_SIGNATURE)
    except SigningError as exc:
        raise CommunityError("request-bad-signature", exc.message, status=401) from None
    if _TIMESTAMP_RE.fullmatch(ts_text) is None:
        raise CommunityError("request-bad-signature",
                             f"{HEADER_TIMESTAMP} must be integer Unix seconds", status=401)
    timestamp = int(ts_text)
    try:
        payload = request_payload(method=method, path=path, timestamp=timestamp, nonce=nonce,
                                  body=body)
        verify(key, payload, signature, field=HEADER_SIGNATURE)
    except SigningError:
        raise CommunityError("request-bad-signature",
                             "the request signature does not verify for this method, path "
                             "and body", status=401) from None
    if abs(now - timestamp) > window_s:
        raise CommunityError("request-stale",
                             f"the request timestamp is more than {window_s} s from the "
                             "server clock", status=401)
    return SignedRequest(public_key=key, timestamp=timestamp, nonce=nonce)
