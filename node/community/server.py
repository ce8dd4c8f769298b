"""The community server, first cut: an ASGI app (Starlette) over a SQLite store (DESIGN §12).

It helps peers find each other and nothing more: Hosts publish signed invitations, Guests
fetch them by ``post_id``, participants record session proofs. It never receives a query,
an answer or corpus data, and has nowhere to store one. Routes, bodies, statuses and error
codes are specified in ``specs/community-api.md``.

Rules enforced here (all answers are JSON; every error is
``{"error": {"code": ..., "message": ...}}`` with a code registered in
:data:`node.errors.CODES`):

- mutations are signed requests (DESIGN §4; :mod:`node.community.requests`), with nonces
  remembered for the ±300 s window so a replay answers 409 ``request-replayed``;
- bodies are bounded (``Content-Length`` over the cap answers 413 before reading; a
  streamed body is cut off at the cap);
- an invitation is verified like ``kith join`` would, except that the iroh ticket is never
  parsed here (this module does not import iroh): binding signature over the §4 lines,
  ``iroh_ticket == transport_info.ticket``, ``transport_info.endpoint_id ==
  host_public_key``, not expired; the server assigns the ``post_id``;
- a session proof is accepted only if ``session_id`` is the SHA-256 of the recomputed
  payload and both role signatures verify (DESIGN §4, §6).

SQLite work runs in worker threads (``anyio.to_thread.run_sync``) with a bounded busy
timeout, so the event loop never blocks on the database.

Embedding: :func:`run_server_in_thread` serves an app on loopback in a daemon thread
(tests, the demo); ``kith community serve`` uses :func:`serve_forever`.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import anyio.to_thread
import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import node
from node.community.requests import REQUEST_WINDOW_S, SignedRequest, check_signed_request
from node.community.store import CommunityStore
from node.errors import CommunityError, InvitationError, KithError, SigningError
from node.invitation import (
    MAX_INVITATION_BYTES,
    POST_ID_RE,
    Invitation,
    parse_invitation,
    parse_rfc3339,
    rfc3339,
)
from node.signing import (
    PUBLIC_KEY_HEX_LEN,
    SHA256_HEX_LEN,
    SIGNATURE_HEX_LEN,
    check_hex,
    role_message,
    session_id_of,
    session_payload,
    verify,
)

SERVICE = "kith-community"
API_PREFIX = "/api/v1"
DEFAULT_MAX_BODY_BYTES = 64 * 1024
DEFAULT_PORT = 8787
#: Bytes of randomness in a server-assigned post_id (16 bytes → 22 url-safe characters).
POST_ID_BYTES = 16

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


_SESSION_PROOF_DECODER = msgspec.json.Decoder(SessionProof)
_ANY_DECODER = msgspec.json.Decoder()


# --- responses -----------------------------------------------------------------------------
def new_post_id() -> str:
    """A fresh server-assigned ``post_id``: 32 lowercase hex characters (128 random bits).

    Hex, not base64url: an id starting with ``-`` would read as an option on a command line
    (``kith join -5C9...``).
    """
    return secrets.token_hex(POST_ID_BYTES)


def error_response(code: str, message: str, status: int,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape: ``{"error": {"code": code, "message": message}}``."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


async def _on_kith_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KithError)
    status = exc.status if isinstance(exc, CommunityError) else 400
    return error_response(exc.code, exc.message, status)


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


# --- request plumbing ---------------------------------------------------------------------
async def _read_body(request: Request, cap: int) -> bytes:
    """Read at most ``cap`` bytes of body; refuse more with 413 ``request-too-large``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise CommunityError("request-invalid", "Content-Length is not a number", status=400)
        if int(declared) > cap:
            raise CommunityError("request-too-large", f"the body is larger than {cap} bytes",
                                 status=413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise CommunityError("request-too-large", f"the body is larger than {cap} bytes",
                                 status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def _raw_path(request: Request) -> str:
    """The path exactly as received (percent-encoded), with ``?query`` when present."""
    raw = request.scope.get("raw_path") or request.url.path.encode("utf-8")
    path = raw.decode("latin-1")
    query = request.scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


class _App:
    """Route handlers sharing one store, body cap and clock."""

    def __init__(self, store: CommunityStore, max_body_bytes: int,
                 clock: Callable[[], float]) -> None:
        self.store = store
        self.max_body_bytes = max_body_bytes
        self.clock = clock

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    async def _signed_body(self, request: Request) -> tuple[SignedRequest, bytes]:
        """Read the bounded body, verify the request signature, refuse a replayed nonce."""
        body = await _read_body(request, self.max_body_bytes)
        now = self.clock()
        signed = check_signed_request(request.headers, method=request.method,
                                      path=_raw_path(request), body=body, now=now)
        fresh = await self._db(self.store.remember_nonce, signed.nonce, signed.public_key,
                               signed.timestamp, now=now, window_s=REQUEST_WINDOW_S)
        if not fresh:
            raise CommunityError("request-replayed", "that request nonce was already used",
                                 status=409)
        return signed, body

    # GET /api/v1/health
    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": SERVICE, "version": node.__version__})

    # POST /api/v1/invitations
    async def publish_invitation(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request)
        if len(body) > MAX_INVITATION_BYTES:
            raise CommunityError("request-too-large", "an invitation is at most 64 KiB",
                                 status=413)
        try:
            data = _ANY_DECODER.decode(body)
        except msgspec.DecodeError:
            raise CommunityError("request-invalid", "the body is not JSON", status=400) from None
        if not isinstance(data, dict):
            raise CommunityError("request-invalid", "the body must be a JSON object", status=400)
        post_id = new_post_id()
        data["post_id"] = post_id  # any client-side post_id is ignored: the server assigns it
        inv = parse_invitation(data)  # InvitationError invitation-malformed → 400
        if signed.public_key != inv.host_public_key:
            raise CommunityError("forbidden", "only the invitation's host key may publish it",
                                 status=403)
        expires_unix = check_invitation(inv, now=self.clock())
        document = inv.to_dict()
        for _ in range(3):  # a collision of 128 random bits does not happen; stay correct anyway
            if await self._db(self.store.insert_invitation, post_id=inv.post_id,
                              host_public_key=inv.host_public_key,
                              protocol_id=inv.protocol.protocol_id, document=document,
                              expires_unix=expires_unix, now=self.clock()):
                break
            inv.post_id = document["post_id"] = new_post_id()
        else:
            raise CommunityError("internal-error", "could not assign a post_id", status=500)
        return JSONResponse(document, status_code=201,
                            headers={"Location": f"{API_PREFIX}/invitations/{inv.post_id}"})

    # GET /api/v1/invitations/{post_id}
    async def get_invitation(self, request: Request) -> JSONResponse:
        post_id = request.path_params["post_id"]
        found = None
        if POST_ID_RE.fullmatch(post_id):
            found = await self._db(self.store.get_invitation, post_id)
        if found is None:
            raise CommunityError("invitation-not-found", "no invitation with that post_id",
                                 status=404)
        document, expires_unix = found
        if expires_unix <= self.clock():
            raise CommunityError("invitation-expired",
                                 f"the invitation expired at {document.get('expires_at')}",
                                 status=410)
        return JSONResponse(document)

    # POST /api/v1/sessions
    async def submit_session(self, request: Request) -> JSONResponse:
        signed, body = await self._signed_body(request)
        try:
            proof = _SESSION_PROOF_DECODER.decode(body)
        except msgspec.ValidationError as exc:
            raise CommunityError("request-invalid", f"session proof: {exc}", status=400) from None
        except msgspec.DecodeError:
            raise CommunityError("request-invalid", "the body is not JSON", status=400) from None
        if signed.public_key not in (proof.host_public_key, proof.guest_public_key):
            raise CommunityError("forbidden", "only a session participant may submit its proof",
                                 status=403)
        check_session_proof(proof)
        if not POST_ID_RE.fullmatch(proof.post_id):
            raise CommunityError("session-invalid", "post_id is not a valid post_id", status=400)
        found = await self._db(self.store.get_invitation, proof.post_id)
        if found is None:
            raise CommunityError("invitation-not-found", "no invitation with that post_id",
                                 status=404)
        document = found[0]
        if document.get("host_public_key") != proof.host_public_key:
            raise CommunityError("session-invalid",
                                 "host_public_key differs from the invitation's host",
                                 status=400)
        if document.get("protocol", {}).get("protocol_id") != proof.protocol_id:
            raise CommunityError("session-invalid",
                                 "protocol_id differs from the invitation's protocol", status=400)
        record = msgspec.to_builtins(proof)
        record["created_at"] = rfc3339(datetime.fromtimestamp(self.clock(), timezone.utc))
        if not await self._db(self.store.insert_session, record):
            raise CommunityError("session-duplicate", "that session proof was already recorded",
                                 status=409)
        return JSONResponse(record, status_code=201,
                            headers={"Location": f"{API_PREFIX}/sessions/{proof.session_id}"})

    # GET /api/v1/sessions/{session_id}
    async def get_session(self, request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        record = None
        try:
            check_hex(session_id, SHA256_HEX_LEN, "session_id")
        except SigningError:
            pass
        else:
            record = await self._db(self.store.get_session, session_id)
        if record is None:
            raise CommunityError("not-found", "no session with that session_id", status=404)
        return JSONResponse(record)


# --- verification (pure) ------------------------------------------------------------------
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
    try:
        check_hex(inv.host_public_key, PUBLIC_KEY_HEX_LEN, "host_public_key")
        check_hex(inv.transport_info.endpoint_id, PUBLIC_KEY_HEX_LEN, "transport_info.endpoint_id")
        check_hex(inv.transport_binding_signature, SIGNATURE_HEX_LEN, "transport_binding_signature")
        check_hex(inv.protocol.protocol_id, SHA256_HEX_LEN, "protocol.protocol_id")
    except SigningError as exc:
        raise InvitationError("invitation-bad-hex", exc.message) from None
    try:
        verify(inv.host_public_key, inv.binding_payload(), inv.transport_binding_signature,
               field="transport_binding_signature")
    except SigningError:
        raise InvitationError("invitation-bad-signature",
                              "the transport binding signature does not verify (the ticket or "
                              "another signed field was changed)") from None
    if inv.iroh_ticket is not None and inv.iroh_ticket != inv.transport_info.ticket:
        raise InvitationError("invitation-ticket-mismatch")
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


def check_session_proof(proof: SessionProof) -> None:
    """Recompute the session payload and verify ``session_id`` and both role signatures.

    The host signature must verify over ``role_message("host", payload)`` with
    ``host_public_key`` and the guest signature over ``role_message("guest", payload)`` with
    ``guest_public_key`` (DESIGN §4), so one can never stand for the other.

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
def create_app(db_path: Path, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               clock: Callable[[], float] = time.time) -> Starlette:
    """Build the community server ASGI app.

    Args:
        db_path: the SQLite database (created with its folder if missing); usually
            :func:`node.community.store.default_db_path` of the server's home.
        max_body_bytes: the largest accepted request body, in bytes (default 64 KiB).
        clock: returns the current Unix time in seconds (tests inject one).

    Returns:
        A Starlette app serving the routes of ``specs/community-api.md``.
    """
    handlers = _App(CommunityStore(db_path), max_body_bytes, clock)
    routes = [
        Route(f"{API_PREFIX}/health", handlers.health, methods=["GET"]),
        Route(f"{API_PREFIX}/invitations", handlers.publish_invitation, methods=["POST"]),
        Route(f"{API_PREFIX}/invitations/{{post_id}}", handlers.get_invitation, methods=["GET"]),
        Route(f"{API_PREFIX}/sessions", handlers.submit_session, methods=["POST"]),
        Route(f"{API_PREFIX}/sessions/{{session_id}}", handlers.get_session, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={
        KithError: _on_kith_error,
        HTTPException: _on_http_error,
        Exception: _on_unexpected,
    })


# --- serving ----------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket (``port`` 0 picks a free port).

    Raises:
        CommunityError: ``server-start-failed`` if the address cannot be bound (the message
            names the address, not the OS error text).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only for that proto
    # (without it every answer waits ~40 ms for a delayed ACK, measured).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise CommunityError("server-start-failed",
                             f"cannot listen on {host}:{port} (in use or not a local address)",
                             status=0) from None
    return sock


def base_url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT`` for a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn.Server that stops on SIGINT/SIGTERM without re-raising the signal afterwards
    (so ``kith community serve`` exits 0 after a clean shutdown)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(sig: int, frame: FrameType | None) -> None:
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _config(app: Starlette, *, access_log: bool) -> uvicorn.Config:
    # log_config=None: leave the embedding process's logging alone (uvicorn's default config
    # would send access lines to stdout, which must carry only JSON in --json mode).
    return uvicorn.Config(app, lifespan="off", log_config=None, access_log=access_log,
                          server_header=False, timeout_graceful_shutdown=5)


def serve_forever(app: Starlette, sock: socket.socket, *, access_log: bool = False) -> None:
    """Serve ``app`` on the bound ``sock`` in this (main) thread until SIGINT/SIGTERM."""
    server = _Server(_config(app, access_log=access_log))
    server.run(sockets=[sock])


@contextlib.contextmanager
def run_server_in_thread(db_path: Path, host: str = "127.0.0.1", port: int = 0, *,
                         max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                         clock: Callable[[], float] = time.time,
                         startup_timeout_s: float = 10.0) -> Iterator[str]:
    """Serve a community app in a daemon thread for the duration of a ``with`` block.

    Args:
        db_path: the SQLite database. host, port: where to listen (port 0 = a free port).
        max_body_bytes, clock: passed to :func:`create_app`.
        startup_timeout_s: how long to wait for the server to start, in seconds.

    Yields:
        The base URL, e.g. ``"http://127.0.0.1:41234"`` (the real port).

    Raises:
        CommunityError: ``server-start-failed`` if the address cannot be bound or the
            server does not start in time.
    """
    app = create_app(db_path, max_body_bytes=max_body_bytes, clock=clock)
    sock = bind_socket(host, port)
    url = base_url_of(sock)
    server = _Server(_config(app, access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name=f"kith-community {url}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise CommunityError("server-start-failed",
                                     f"the community server at {url} did not start", status=0)
            time.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
