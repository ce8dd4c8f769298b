"""Async client for the community server (``specs/community-api.md``; DESIGN §12).

Every failure is a :class:`~node.common.errors.CommunityError`:

- no answer (connection refused, DNS, TLS, timeout, dropped connection) →
  ``server-unreachable`` with a message naming the server URL (never exception text),
  ``status`` 0;
- an error answer → the server's ``code`` when it is registered in
  :data:`node.common.errors.CODES` (else ``server-error``), the server's message, and the HTTP
  ``status``;
- a success answer that is not what the API promises → ``server-error``.

Mutations are signed with the client's identity (:func:`node.community.requests.signed_headers`).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import ssl
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio
import httpx
import msgspec

from node.common.names import holder_text
from node.community.requests import signed_headers
from node.common.errors import CODES, CommunityError, InvitationError, KithError, UsageError, error_for
from node.trust.identity import Identity
from node.trust.invitation import POST_ID_RE, Invitation, parse_invitation, rfc3339
from node.protocol.spec import parse_spec, protocol_id_of

API_PREFIX = "/api/v1"
_log = logging.getLogger("kith.community.client")
#: Largest response body the client reads, in bytes.
MAX_RESPONSE_BYTES = 1024 * 1024
_MAX_MESSAGE_CHARS = 300


@functools.lru_cache(maxsize=2)
def tls_context(scheme: str = "https") -> ssl.SSLContext:
    """The process's one client TLS context per URL scheme, made on first use and shared by
    every :class:`CommunityClient`: loading certifi's CA bundle costs ~50 ms of CPU, which a
    client per request (the outbox's takes, card fetches) paid every time (issue 43's asker
    CPU).

    Args:
        scheme: ``https``: certifi's CA bundle, hostname checked (what httpx builds by
            default with ``trust_env=False``). ``http``: no request of such a client ever
            uses TLS (its requests go to its base URL; redirects are not followed), so no
            bundle is loaded: the context still requires a certificate and checks the
            hostname, and so fails closed if one ever did.
    """
    if scheme == "https":
        return httpx.create_ssl_context(verify=True, trust_env=False)
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, with no CA: trusts nothing


def _one_line(text: object) -> str:
    line = " ".join(str(text).split())
    return line[:_MAX_MESSAGE_CHARS]



def _record_of(data: Any, status: int, field: str, value: str, what: str) -> dict[str, Any]:
    """``data`` when it is the record asked for (an object whose ``field`` is ``value``).

    Raises:
        CommunityError: ``server-error`` (with the answer's HTTP ``status``) when the server
            answered with anything else (``what`` names the record in the message).
    """
    if not isinstance(data, dict) or data.get(field) != value:
        raise CommunityError("server-error", f"the community server answered with another {what}",
                             status=status)
    return data

class CommunityClient:
    """A client for one community server.

    Args:
        base_url: ``http://`` or ``https://`` URL of the server, optionally with a path
            prefix (the API lives under ``<base_url>/api/v1``).
        identity: the identity that signs mutations; None for a read-only client.
        timeout_s: per-request timeout (connect, read, write, pool), in seconds.
        transport: the httpx transport requests go through (None: HTTP); a holder over iroh
            (:func:`node.community.iroh_mail.mail_client`) or this device's own held mail
            (in-process ASGI) gives its own.

    Raises:
        UsageError: ``usage`` if ``base_url`` is not an http(s) URL with a host.

    Use as ``async with CommunityClient(url, identity) as client: ...`` or call
    :meth:`aclose`.
    """

    def __init__(self, base_url: str, identity: Identity | None = None, *,
                 timeout_s: float = 10.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        try:
            parts = urlsplit(base_url)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018  (raises ValueError on a bad port)
        except ValueError:
            valid = False
        if not valid:
            raise UsageError("usage", "the community server URL must be http:// or https:// "
                                      "with a host, e.g. http://127.0.0.1:8787")
        self.base_url = base_url.rstrip("/")
        self.display_url = holder_text(self.base_url)
        #: What messages call the other end: a device holding mail names itself
        #: (:func:`node.community.iroh_mail.mail_client`); codes stay the same.
        self.party = "the community server"
        self._path_prefix = urlsplit(self.base_url).path.rstrip("/")
        self.identity = identity
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, transport=transport,
                                       verify=tls_context(parts.scheme),
                                       follow_redirects=False, trust_env=False)

    async def __aenter__(self) -> CommunityClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the underlying HTTP connections."""
        await self._http.aclose()

    # --- plumbing ------------------------------------------------------------------------
    async def _request(self, method: str, path: str, *, body: bytes | None = None,
                       signed: bool = False) -> tuple[int, Any]:
        """Send one request; return ``(status, decoded JSON)`` for a 2xx answer."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if signed:
            if self.identity is None:
                raise UsageError("usage", "this community request must be signed; the client "
                                          "has no identity")
            signed_path = self._path_prefix + API_PREFIX + path
            headers.update(signed_headers(self.identity, method, signed_path, body or b""))
        try:
            # one total deadline per request: a server dripping a byte at a time cannot
            # stretch httpx's per-read timeout into a hang
            with anyio.fail_after(self.timeout_s):
                async with self._http.stream(method, API_PREFIX + path, content=body,
                                             headers=headers) as response:
                    raw = bytearray()
                    async for chunk in response.aiter_bytes():
                        raw += chunk
                        if len(raw) > MAX_RESPONSE_BYTES:
                            raise CommunityError("server-error",
                                                 f"{self.party} at {self.display_url} sent "
                                                 "an oversize answer", status=response.status_code)
                    status = response.status_code
        except (httpx.TimeoutException, TimeoutError):
            raise CommunityError("server-unreachable",
                                 f"{self.party} at {self.display_url} did not answer "
                                 f"within {self.timeout_s:g} s", status=0) from None
        except httpx.HTTPError:
            raise CommunityError("server-unreachable",
                                 f"cannot reach {self.party} at {self.display_url}",
                                 status=0) from None
        try:
            data = json.loads(bytes(raw))
        except (ValueError, RecursionError):  # RecursionError: a hostile, deeply nested answer
            data = None
        if 200 <= status < 300:
            if data is None:
                raise CommunityError("server-error", f"{self.party} at "
                                     f"{self.display_url} sent an answer that is not JSON",
                                     status=status)
            return status, data
        raise self._error_of(status, data)

    def _error_of(self, status: int, data: Any) -> KithError:
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), str):
            code = err["code"] if err["code"] in CODES else "server-error"
            message = err.get("message")
            text = _one_line(message) if isinstance(message, str) and message.strip() else None
            return error_for(code, text, status=status)
        return CommunityError("server-error", f"{self.party} at {self.display_url} "
                              f"answered HTTP {status}", status=status)

    def _invitation_of(self, data: Any, status: int) -> Invitation:
        try:
            return parse_invitation(data if isinstance(data, dict) else {})
        except InvitationError as exc:
            raise CommunityError("server-error", f"the community server sent an invalid "
                                 f"invitation ({exc.message})", status=status) from None

    # --- API -------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """``GET /api/v1/health`` → ``{"status": "ok", "service": "kith-community",
        "version": ...}``.

        Raises:
            CommunityError: ``server-unreachable``, ``server-error`` (also when the answer
                is not a kith-community health document).
        """
        status, data = await self._request("GET", "/health")
        if not isinstance(data, dict) or data.get("service") != "kith-community":
            raise CommunityError("server-error", f"{self.display_url} is not a Kith community "
                                 "server", status=status)
        return data

    async def publish_invitation(self, inv: Invitation, *, unlisted: bool = False) -> Invitation:
        """``POST /api/v1/invitations`` (signed; the identity must be the invitation's host).

        Args:
            inv: a signed invitation (its ``post_id`` is ignored by the server).
            unlisted: ``?listed=false``: the post is reachable by ``post_id`` (and by
                ``browse --host KEY``) but absent from browsing.

        Returns:
            The stored invitation, carrying the server-assigned ``post_id``.

        Raises:
            CommunityError: the server's refusal (``forbidden``, ``invitation-*``,
                ``request-*``), ``server-unreachable`` or ``server-error`` (also if the
                server returned a different invitation than the one sent).
            UsageError: the client has no identity.
        """
        body = msgspec.json.encode(inv)
        status, data = await self._request("POST", "/invitations?listed=false" if unlisted else "/invitations",
                                           body=body, signed=True)
        stored = self._invitation_of(data, status)
        sent = inv.to_dict()
        got = stored.to_dict()
        sent.pop("post_id")
        got.pop("post_id")
        if sent != got:
            raise CommunityError("server-error", "the community server stored a different "
                                 "invitation than the one sent", status=status)
        return stored

    async def get_invitation(self, post_id: str) -> Invitation:
        """``GET /api/v1/invitations/{post_id}``.

        Only the structure is checked here; ``kith join`` verifies the signature, ticket,
        expiry and protocol (:func:`node.trust.invitation.verify_invitation`).

        Raises:
            CommunityError: ``invitation-not-found`` (404; also for a malformed post_id,
                without asking the server), ``invitation-expired`` (410),
                ``server-unreachable``, ``server-error`` (also if the answer is not an
                invitation with that post_id).
        """
        if not isinstance(post_id, str) or not POST_ID_RE.fullmatch(post_id):
            raise InvitationError("invitation-not-found",
                                  "a post_id is 8-64 characters of A-Z a-z 0-9 _ -", status=404)
        status, data = await self._request("GET", f"/invitations/{post_id}")
        inv = self._invitation_of(data, status)
        if inv.post_id != post_id:
            raise CommunityError("server-error", "the community server answered with another "
                                 "invitation", status=status)
        return inv

    async def submit_session(self, proof: dict[str, str]) -> dict[str, str]:
        """``POST /api/v1/sessions`` (signed by the host or the guest of the session).

        Args:
            proof: ``session_id``, ``post_id``, ``protocol_id``, ``host_public_key``,
                ``guest_public_key``, ``guest_nonce``, ``host_nonce``, ``host_signature``,
                ``guest_signature`` (DESIGN §4, §6).

        Returns:
            The stored record: those fields plus ``created_at`` (RFC 3339 UTC).

        Raises:
            CommunityError: ``session-invalid``, ``session-duplicate`` (409), ``forbidden``
                (403), ``invitation-not-found`` (404), ``request-*``,
                ``server-unreachable``, ``server-error``.
            UsageError: the client has no identity.
        """
        body = json.dumps(proof, separators=(",", ":")).encode("utf-8")
        status, data = await self._request("POST", "/sessions", body=body, signed=True)
        if not isinstance(data, dict) or data.get("session_id") != proof.get("session_id"):
            raise CommunityError("server-error", "the community server answered with another "
                                 "session record", status=status)
        return data

    async def get_session(self, session_id: str) -> dict[str, Any]:
        """``GET /api/v1/sessions/{session_id}`` → the session record and its status
        (``state`` ``open``/``closed``, ``closed_at``, ``closed_by``, ``close_reason``).

        Raises:
            CommunityError: ``session-not-found`` (404; also for a malformed id, without
                asking the server), ``server-unreachable``, ``server-error``.
        """
        _check_session_id(session_id)
        status, data = await self._request("GET", f"/sessions/{session_id}")
        return _record_of(data, status, "session_id", session_id, "session record")

    async def close_session(self, session_id: str, reason: str = "closed") -> dict[str, Any]:
        """``POST /api/v1/sessions/{session_id}/close`` (signed by a participant).

        Args:
            reason: 1-64 of ``a-z 0-9 -`` (e.g. ``completed``, ``peer-unresponsive``).

        Returns:
            The session record, now ``state: closed``.

        Raises:
            CommunityError: ``session-not-found`` (404), ``forbidden`` (403),
                ``session-closed`` (409), ``request-*``, ``server-unreachable``,
                ``server-error``.
        """
        _check_session_id(session_id)
        body = json.dumps({"reason": reason}).encode()
        status, data = await self._request("POST", f"/sessions/{session_id}/close", body=body,
                                           signed=True)
        return _record_of(data, status, "session_id", session_id, "session record")

    async def submit_feedback(self, session_id: str, rating: int,
                              comment: str | None = None) -> dict[str, Any]:
        """``POST /api/v1/sessions/{session_id}/feedback`` (signed by a participant).

        Args:
            rating: 1-5. comment: at most 1000 characters, no control characters.

        Returns:
            ``{"session_id", "feedback": [{"rater_public_key", "rater_role", "rating",
            "comment", "created_at"}, ...]}`` — every rating of the session so far.

        Raises:
            CommunityError: ``session-not-found`` (404), ``forbidden`` (403, not a
                participant), ``feedback-duplicate`` (409), ``request-invalid`` (400),
                ``request-*``, ``server-unreachable``, ``server-error``.
        """
        _check_session_id(session_id)
        doc: dict[str, Any] = {"rating": rating}
        if comment is not None:
            doc["comment"] = comment
        status, data = await self._request("POST", f"/sessions/{session_id}/feedback",
                                           body=json.dumps(doc).encode(), signed=True)
        return self._feedback_of(data, status, session_id)

    async def get_feedback(self, session_id: str) -> dict[str, Any]:
        """``GET /api/v1/sessions/{session_id}/feedback`` → the session's ratings.

        Raises:
            CommunityError: ``session-not-found``, ``server-unreachable``, ``server-error``.
        """
        _check_session_id(session_id)
        status, data = await self._request("GET", f"/sessions/{session_id}/feedback")
        return self._feedback_of(data, status, session_id)

    def _feedback_of(self, data: Any, status: int, session_id: str) -> dict[str, Any]:
        if (not isinstance(data, dict) or data.get("session_id") != session_id
                or not isinstance(data.get("feedback"), list)):
            raise CommunityError("server-error", "the community server answered with another "
                                 "feedback list", status=status)
        return data

    # --- identities ------------------------------------------------------------------------
    async def register_identity(self, display_name: str, about: str = "") -> dict[str, Any]:
        """``POST /api/v1/identities``: register (or update) this client's key with a
        profile. The signed request is the proof of possession of the key.

        Returns:
            ``{"public_key", "display_name", "about", "created_at", "updated_at",
            "ratings": {"count", "average"}}``.

        Raises:
            CommunityError: ``request-invalid`` (a blank, over-long or control-character
                name/about), ``request-*``, ``server-unreachable``, ``server-error``.
            UsageError: the client has no identity.
        """
        body = json.dumps({"display_name": display_name, "about": about}).encode()
        status, data = await self._request("POST", "/identities", body=body, signed=True)
        assert self.identity is not None
        return _record_of(data, status, "public_key", self.identity.public_key, "identity")

    async def get_identity(self, public_key: str) -> dict[str, Any]:
        """``GET /api/v1/identities/{public_key}`` → the profile and ratings received.

        Raises:
            CommunityError: ``identity-not-found`` (404; also for a malformed key, without
                asking), ``server-unreachable``, ``server-error``.
        """
        if not isinstance(public_key, str) or not _HEX64.fullmatch(public_key):
            raise CommunityError("identity-not-found", "a public key is 64 lowercase hex "
                                 "characters", status=404)
        status, data = await self._request("GET", f"/identities/{public_key}")
        return _record_of(data, status, "public_key", public_key, "identity")

    # --- revocation lists (specs/peers.md §10) --------------------------------------------
    async def publish_revocation(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v1/revocations``: publish a person's signed revocation list (the
        server checks it and keeps it when its ``seq`` is the newest).

        Returns:
            ``{"person_key", "seq", "stored"}`` (``stored`` false: that list was kept already).

        Raises:
            CommunityError: ``revocation-stale`` (409: a newer list is kept), ``request-invalid``,
                ``request-*``, ``server-unreachable``, ``server-error``.
        """
        body = json.dumps(doc, separators=(",", ":")).encode()
        _status, data = await self._request("POST", "/revocations", body=body, signed=True)
        return data if isinstance(data, dict) else {}

    async def get_revocation(self, person_key: str) -> dict[str, Any] | None:
        """``GET /api/v1/revocations/{person_key}``: the newest list the server keeps for that
        person (unchecked here: the caller verifies it), or None (404).

        Raises:
            CommunityError: ``server-unreachable``, ``server-error``.
        """
        if not isinstance(person_key, str) or not _HEX64.fullmatch(person_key):
            return None
        try:
            _status, data = await self._request("GET", f"/revocations/{person_key}")
        except CommunityError as exc:
            if exc.code == "revocation-not-found":
                return None
            raise
        return data if isinstance(data, dict) else None

    # --- device cards (specs/peers.md §13) ---------------------------------------------------
    async def publish_card(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v1/cards``: publish this hosting device's signed card (the server
        checks it and keeps it when its ``seq`` is the newest of that device).

        Returns:
            ``{"person_key", "device_key", "seq", "stored"}`` (``stored`` false: kept already).

        Raises:
            CommunityError: ``card-stale`` (409), ``card-malformed`` / ``card-forged`` /
                ``card-wrong-device`` (400), ``request-*``, ``server-unreachable``, ``server-error``.
        """
        body = json.dumps(doc, separators=(",", ":")).encode()
        _status, data = await self._request("POST", "/cards", body=body, signed=True)
        return data if isinstance(data, dict) else {}

    async def get_cards(self, person_key: str) -> list[dict[str, Any]]:
        """``GET /api/v1/cards/{person_key}``: the newest card of each device of that person
        the server keeps (unchecked here: the caller verifies each), or ``[]`` (404).

        Raises:
            CommunityError: ``server-unreachable``, ``server-error``.
        """
        if not isinstance(person_key, str) or not _HEX64.fullmatch(person_key):
            return []
        try:
            _status, data = await self._request("GET", f"/cards/{person_key}")
        except CommunityError as exc:
            if exc.code == "card-not-found":
                return []
            raise
        cards = data.get("cards") if isinstance(data, dict) else None
        return [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []

    # --- the mailbox of sealed records (specs/sealed.md) ---------------------------------------
    async def put_sealed(self, record: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v1/mailbox``: leave a sealed record (:func:`node.trust.sealed.seal`;
        the identity must be its ``sender``). Putting the same record again is harmless.

        Returns:
            ``{"id", "stored", "expires"}`` (``stored`` false: this record was kept already).

        Raises:
            CommunityError: ``mailbox-off`` (404), ``sealed-*`` (400), ``forbidden`` (403: not
                the sender), ``mailbox-not-accepted`` (403: the host's card here does not opt in),
                ``mailbox-conflict`` (409), ``mailbox-sender-full`` (429),
                ``mailbox-recipient-full`` / ``mailbox-full`` (507), ``rate-limited``,
                ``request-*``, ``server-unreachable``, ``server-error`` (also an answer
                naming another id).
        """
        body = json.dumps(record, separators=(",", ":")).encode()
        status, data = await self._request("POST", "/mailbox", body=body, signed=True)
        if not isinstance(data, dict) or data.get("id") != record.get("id") or not isinstance(data.get("stored"), bool):
            raise CommunityError("server-error", f"{self.party} at {self.display_url} answered a "
                                 "mailbox put with another record", status=status)
        return data

    async def take_sealed_page(self, limit: int = 20, after: str | None = None
                               ) -> tuple[list[dict[str, Any]], bool, str | None]:
        """``POST /api/v1/mailbox/take``: the sealed records waiting for this identity's key,
        oldest first, after the page whose ``next`` is ``after`` (None: from the oldest), so a
        caller pages past records it leaves there (specs/community-api.md, "Mailbox"). They
        stay at the server until :meth:`ack_sealed`; each is unchecked here — the caller
        opens it with :func:`node.trust.sealed.open_sealed`.

        Args:
            limit: most records (1-100).
            after: the ``next`` of the page before, or None.

        Returns:
            ``(records, more, next)``: ``next`` is the opaque cursor to pass as ``after`` for
            the following page (None when the page is empty or the holder gave none: an
            older holder, which takes no cursor).

        Raises:
            CommunityError: ``mailbox-off``, ``rate-limited``, ``request-*``,
                ``server-unreachable``, ``server-error``; ``take-cursor-invalid`` for a cursor
                the holder did not give.
        """
        body = json.dumps({"limit": limit} if after is None else {"limit": limit, "after": after}).encode()
        status, data = await self._request("POST", "/mailbox/take", body=body, signed=True)
        records = data.get("records") if isinstance(data, dict) else None
        if not isinstance(records, list):
            raise CommunityError("server-error", f"{self.party} at {self.display_url} answered a "
                                 "mailbox take without records", status=status)
        cursor = data.get("next")
        return ([r for r in records if isinstance(r, dict)], data.get("more") is True,
                cursor if isinstance(cursor, str) and records else None)

    async def ack_sealed(self, records: list[tuple[str, str]]) -> int:
        """``POST /api/v1/mailbox/ack``: remove records this identity took and dealt with,
        each named by ``(sender key, record id)`` — a holder keys records by both, so an ack
        never removes another sender's record under the same id (a record not kept, or not
        sealed to this key, is ignored).

        Returns:
            how many records the server removed.

        Raises:
            CommunityError: ``mailbox-off``, ``request-invalid`` (not 1-100 records),
                ``rate-limited``, ``request-*``, ``server-unreachable``, ``server-error``.
        """
        body = json.dumps({"records": [{"sender": s, "id": i} for s, i in records]}).encode()
        _status, data = await self._request("POST", "/mailbox/ack", body=body, signed=True)
        removed = data.get("removed") if isinstance(data, dict) else None
        return removed if isinstance(removed, int) and not isinstance(removed, bool) else 0

    # --- protocols -------------------------------------------------------------------------
    async def publish_protocol(self, spec: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v1/protocols``: publish a spec.json object by content.

        Returns:
            ``{"protocol_id", "name", "version", "spec", "published_by", "created_at"}``;
            ``protocol_id`` is checked to be the SHA-256 of the spec's canonical JSON.

        Raises:
            CommunityError: ``spec-invalid`` is raised by the server as a 400 with that
                code; ``request-*``, ``server-unreachable``, ``server-error``.
        """
        body = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        status, data = await self._request("POST", "/protocols", body=body, signed=True)
        return self._protocol_of(data, status, protocol_id_of(spec))

    async def get_protocol(self, protocol_id: str) -> dict[str, Any]:
        """``GET /api/v1/protocols/{protocol_id}`` → the published spec, verified here: its
        recomputed ``protocol_id`` must equal the one asked for and it must load as a spec
        (a lying server answers ``server-error``).

        Raises:
            CommunityError: ``protocol-id-not-found`` (404; also for a malformed id),
                ``server-unreachable``, ``server-error``.
        """
        if not isinstance(protocol_id, str) or not _HEX64.fullmatch(protocol_id):
            raise CommunityError("protocol-id-not-found", "a protocol_id is 64 lowercase hex "
                                 "characters", status=404)
        status, data = await self._request("GET", f"/protocols/{protocol_id}")
        return self._protocol_of(data, status, protocol_id)

    def _protocol_of(self, data: Any, status: int, protocol_id: str) -> dict[str, Any]:
        spec = data.get("spec") if isinstance(data, dict) else None
        try:
            ok = (isinstance(spec, dict) and data.get("protocol_id") == protocol_id
                  and protocol_id_of(spec) == protocol_id)
            if ok:
                parse_spec(spec, origin="published spec")
        except (KithError, ValueError, TypeError, RecursionError):
            ok = False
        if not ok:
            raise CommunityError("server-error", "the community server answered with a spec "
                                 "that does not hash to that protocol_id", status=status)
        return data

    # --- invitations: browse, status, renew, withdraw ---------------------------------------
    async def browse(self, *, protocol: str | None = None, tag: str | None = None,
                     host: str | None = None, limit: int | None = None,
                     cursor: str | None = None) -> dict[str, Any]:
        """``GET /api/v1/invitations?...`` → ``{"invitations": [post, ...],
        "next_cursor": str | None}``, live posts only, newest first.

        Each post: ``post_id``, ``state``, ``sessions``, ``max_sessions``, ``expires_at``,
        ``withdrawn_at``, ``online`` (True while the host's liveness lease holds, None when
        the server has no lease for it), ``lease_expires_at``, ``host_display_name``,
        ``invitation`` (the document; invalid documents are dropped here, not trusted).

        Args:
            protocol: a protocol name or a 64-hex protocol_id. tag: one tag.
            host: a host public key. limit: 1-100. cursor: ``next_cursor`` of a page.

        Raises:
            CommunityError: ``request-invalid`` (a bad filter), ``server-unreachable``,
                ``server-error``.
        """
        params = {k: str(v) for k, v in (("protocol", protocol), ("tag", tag), ("host", host),
                                          ("limit", limit), ("cursor", cursor)) if v is not None}
        path = "/invitations" + (f"?{urlencode(params)}" if params else "")
        status, data = await self._request("GET", path)
        posts = data.get("invitations") if isinstance(data, dict) else None
        if not isinstance(posts, list):
            raise CommunityError("server-error", "the community server answered browse with "
                                 "something else", status=status)
        kept = []
        for post in posts:
            try:
                inv = parse_invitation(post.get("invitation") if isinstance(post, dict) else {})
            except InvitationError:
                continue
            if post.get("post_id") == inv.post_id:
                kept.append(post)
        next_cursor = data.get("next_cursor")
        return {"invitations": kept,
                "next_cursor": next_cursor if isinstance(next_cursor, str) else None}

    async def invitation_status(self, post_id: str) -> dict[str, Any]:
        """``GET /api/v1/invitations/{post_id}/status`` → the post (``state`` one of
        ``live``, ``offline``, ``expired``, ``withdrawn``, ``consumed``; ``online`` and
        ``lease_expires_at`` its liveness; see :meth:`browse`).

        Raises:
            CommunityError: ``invitation-not-found``, ``server-unreachable``,
                ``server-error``.
        """
        _check_post_id(post_id)
        status, data = await self._request("GET", f"/invitations/{post_id}/status")
        return self._post_of(data, status, post_id)

    def _post_of(self, data: Any, status: int, post_id: str) -> dict[str, Any]:
        if (not isinstance(data, dict) or data.get("post_id") != post_id
                or data.get("state") not in POST_STATES):
            raise CommunityError("server-error", "the community server answered with another "
                                 "post", status=status)
        return data

    async def renew_invitation(self, inv: Invitation, *, ttl_s: int,
                               now: datetime | None = None) -> Invitation:
        """``POST /api/v1/invitations/{post_id}/renew``: move ``expires_at`` to
        ``now + ttl_s`` and re-sign the transport binding (the identity must be the host).

        Returns:
            The renewed invitation as stored.

        Raises:
            CommunityError: ``forbidden``, ``invitation-withdrawn`` / ``invitation-consumed``
                (410), ``invitation-malformed`` (more than 30 days), ``request-*``,
                ``server-unreachable``, ``server-error``.
            UsageError: the client has no identity.
        """
        if self.identity is None:
            raise UsageError("usage", "renewing an invitation needs the host identity")
        renewed = parse_invitation(inv.to_dict())
        renewed.expires_at = rfc3339((now or datetime.now(timezone.utc))
                                     + timedelta(seconds=ttl_s))
        renewed.transport_binding_signature = self.identity.sign(renewed.binding_payload())
        body = json.dumps({"expires_at": renewed.expires_at,
                           "transport_binding_signature":
                               renewed.transport_binding_signature}).encode()
        status, data = await self._request("POST", f"/invitations/{inv.post_id}/renew",
                                           body=body, signed=True)
        stored = self._invitation_of(data, status)
        if stored.to_dict() != renewed.to_dict():
            raise CommunityError("server-error", "the community server stored a different "
                                 "renewal than the one sent", status=status)
        return stored

    async def withdraw_invitation(self, post_id: str) -> dict[str, Any]:
        """``POST /api/v1/invitations/{post_id}/withdraw`` (signed by the host; idempotent).

        Returns:
            The post, ``state: withdrawn``.

        Raises:
            CommunityError: ``invitation-not-found``, ``forbidden``, ``request-*``,
                ``server-unreachable``, ``server-error``.
        """
        _check_post_id(post_id)
        status, data = await self._request("POST", f"/invitations/{post_id}/withdraw",
                                           body=b"{}", signed=True)
        return self._post_of(data, status, post_id)


    async def refresh_lease(self, post_id: str) -> dict[str, Any]:
        """``POST /api/v1/invitations/{post_id}/lease`` (signed by the host): extend the
        post's liveness lease; the answer says what became of the post meanwhile.

        Returns:
            The post (its ``state``, ``expires_at`` — moved by a renew elsewhere —
            ``online``, ``lease_expires_at``) plus ``lease``: ``{"ttl_s", "refresh_s"}``, the
            server's lease length and how often to refresh, in seconds.

        Raises:
            CommunityError: ``invitation-not-found`` (the server lost the post),
                ``forbidden`` (another key's post), ``rate-limited``, ``request-*``,
                ``database-*`` (503), ``server-unreachable``, ``server-error``.
        """
        _check_post_id(post_id)
        status, data = await self._request("POST", f"/invitations/{post_id}/lease",
                                           body=b"{}", signed=True)
        post = self._post_of(data, status, post_id)
        lease = post.get("lease")
        if (not isinstance(lease, dict) or not all(
                isinstance(lease.get(k), (int, float)) and not isinstance(lease.get(k), bool)
                and 0 < lease[k] <= 1e8 for k in ("ttl_s", "refresh_s"))):
            raise CommunityError("server-error", "the community server answered a lease "
                                 "refresh without its lease", status=status)
        return post


#: The states a post can be in (``specs/community-api.md``, "Post states").
POST_STATES = ("live", "offline", "expired", "withdrawn", "consumed")
_HEX64 = re.compile(r"[0-9a-f]{64}")


async def close_session_quietly(server_url: str, identity: Identity, session_id: str,
                                reason: str, *, timeout_s: float = 5.0) -> bool:
    """Close a session on the server at its end, never failing the caller.

    ``reason`` is folded to ``a-z 0-9 -`` (at most 64). Returns True if this call closed
    it; False if it was already closed, unknown (no proof recorded), or the server could
    not be reached within ``timeout_s`` seconds (logged at debug level).
    """
    folded = "".join(c if c.isalnum() or c == "-" else "-"
                     for c in reason.lower() if c.isascii())[:64].strip("-") or "closed"
    try:
        async with CommunityClient(server_url, identity, timeout_s=timeout_s) as client:
            await client.close_session(session_id, reason=folded)
    except KithError as exc:
        _log.debug("session %s not closed on the server: %s", session_id[:12], exc.code)
        return False
    return True


def _check_session_id(session_id: object) -> None:
    if not isinstance(session_id, str) or not _HEX64.fullmatch(session_id):
        raise CommunityError("session-not-found", "a session_id is 64 lowercase hex characters",
                             status=404)


def _check_post_id(post_id: object) -> None:
    if not isinstance(post_id, str) or not POST_ID_RE.fullmatch(post_id):
        raise InvitationError("invitation-not-found",
                              "a post_id is 8-64 characters of A-Z a-z 0-9 _ -", status=404)
