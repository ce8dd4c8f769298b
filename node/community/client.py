"""Async client for the community server (``specs/community-api.md``; DESIGN §12).

Every failure is a :class:`~node.errors.CommunityError`:

- no answer (connection refused, DNS, TLS, timeout, dropped connection) →
  ``server-unreachable`` with a message naming the server URL (never exception text),
  ``status`` 0;
- an error answer → the server's ``code`` when it is registered in
  :data:`node.errors.CODES` (else ``server-error``), the server's message, and the HTTP
  ``status``;
- a success answer that is not what the API promises → ``server-error``.

Mutations are signed with the client's identity (:func:`node.community.requests.signed_headers`).
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import msgspec

from node.community.requests import signed_headers
from node.errors import CODES, CommunityError, InvitationError, UsageError
from node.identity import Identity
from node.invitation import POST_ID_RE, Invitation, parse_invitation

API_PREFIX = "/api/v1"
#: Largest response body the client reads, in bytes.
MAX_RESPONSE_BYTES = 1024 * 1024
_MAX_MESSAGE_CHARS = 300


def _display_url(base_url: str) -> str:
    """The base URL without any ``user:password@`` part (safe to print)."""
    parts = urlsplit(base_url)
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port is not None:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _one_line(text: object) -> str:
    line = " ".join(str(text).split())
    return line[:_MAX_MESSAGE_CHARS]


class CommunityClient:
    """A client for one community server.

    Args:
        base_url: ``http://`` or ``https://`` URL of the server, optionally with a path
            prefix (the API lives under ``<base_url>/api/v1``).
        identity: the identity that signs mutations; None for a read-only client.
        timeout_s: per-request timeout (connect, read, write, pool), in seconds.

    Raises:
        UsageError: ``usage`` if ``base_url`` is not an http(s) URL with a host.

    Use as ``async with CommunityClient(url, identity) as client: ...`` or call
    :meth:`aclose`.
    """

    def __init__(self, base_url: str, identity: Identity | None = None, *,
                 timeout_s: float = 10.0) -> None:
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
        self.display_url = _display_url(self.base_url)
        self._path_prefix = urlsplit(self.base_url).path.rstrip("/")
        self.identity = identity
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s,
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
            async with self._http.stream(method, API_PREFIX + path, content=body,
                                         headers=headers) as response:
                raw = bytearray()
                async for chunk in response.aiter_bytes():
                    raw += chunk
                    if len(raw) > MAX_RESPONSE_BYTES:
                        raise CommunityError("server-error",
                                             f"the community server at {self.display_url} sent "
                                             "an oversize answer", status=response.status_code)
                status = response.status_code
        except httpx.TimeoutException:
            raise CommunityError("server-unreachable",
                                 f"the community server at {self.display_url} did not answer "
                                 f"within {self.timeout_s:g} s", status=0) from None
        except httpx.HTTPError:
            raise CommunityError("server-unreachable",
                                 f"cannot reach the community server at {self.display_url}",
                                 status=0) from None
        try:
            data = json.loads(bytes(raw))
        except ValueError:
            data = None
        if 200 <= status < 300:
            if data is None:
                raise CommunityError("server-error", f"the community server at "
                                     f"{self.display_url} sent an answer that is not JSON",
                                     status=status)
            return status, data
        raise self._error_of(status, data)

    def _error_of(self, status: int, data: Any) -> CommunityError:
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), str):
            code = err["code"] if err["code"] in CODES else "server-error"
            message = err.get("message")
            text = _one_line(message) if isinstance(message, str) and message.strip() else None
            return CommunityError(code, text or CODES[code][1], status=status)
        return CommunityError("server-error", f"the community server at {self.display_url} "
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

    async def publish_invitation(self, inv: Invitation) -> Invitation:
        """``POST /api/v1/invitations`` (signed; the identity must be the invitation's host).

        Args:
            inv: a signed invitation (its ``post_id`` is ignored by the server).

        Returns:
            The stored invitation, carrying the server-assigned ``post_id``.

        Raises:
            CommunityError: the server's refusal (``forbidden``, ``invitation-*``,
                ``request-*``), ``server-unreachable`` or ``server-error`` (also if the
                server returned a different invitation than the one sent).
            UsageError: the client has no identity.
        """
        body = msgspec.json.encode(inv)
        status, data = await self._request("POST", "/invitations", body=body, signed=True)
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
        expiry and protocol (:func:`node.invitation.verify_invitation`).

        Raises:
            CommunityError: ``invitation-not-found`` (404; also for a malformed post_id,
                without asking the server), ``invitation-expired`` (410),
                ``server-unreachable``, ``server-error`` (also if the answer is not an
                invitation with that post_id).
        """
        if not isinstance(post_id, str) or not POST_ID_RE.fullmatch(post_id):
            raise CommunityError("invitation-not-found",
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

    async def get_session(self, session_id: str) -> dict[str, str]:
        """``GET /api/v1/sessions/{session_id}`` → the stored record.

        Raises:
            CommunityError: ``not-found`` (404), ``server-unreachable``, ``server-error``.
        """
        if not isinstance(session_id, str) or len(session_id) != 64 or not all(
                c in "0123456789abcdef" for c in session_id):
            raise CommunityError("not-found", "a session_id is 64 lowercase hex characters",
                                 status=404)
        status, data = await self._request("GET", f"/sessions/{session_id}")
        if not isinstance(data, dict) or data.get("session_id") != session_id:
            raise CommunityError("server-error", "the community server answered with another "
                                 "session record", status=status)
        return data
