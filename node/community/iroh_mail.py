"""The mailbox over iroh: a device of the person that holds mail serves the mailbox routes on
its own ALPN beside ``knowledge-query`` (specs/sealed.md §7c; issue 43 item 2b).

A holder named ``iroh:<ticket>`` in a card's ``mailboxes`` (or given to ``--holder``) is
reached on the endpoint its ticket names with the ALPN :data:`MAILBOX_ALPN` — the guest's
session-pool endpoint, or the host's own — never over HTTP. One connection carries one
bi-stream; on it, one **request frame** then one **response frame**, as many times as the
client likes. A frame is one line of compact UTF-8 JSON ending in ``\\n``:

- request (at most :data:`MAX_REQUEST_FRAME` bytes):
  ``{"op": "put"|"take"|"ack", "headers": {the four X-Kith-* headers}, "body": "<base64>"}``
  — the very signed request ``POST /api/v1/mailbox``, ``/mailbox/take`` or ``/mailbox/ack``
  carries over HTTP (the signature covers ``POST``, that path and the body bytes);
- response (at most :data:`MAX_RESPONSE_FRAME` bytes): ``{"status": <the route's HTTP
  status>, "body": <the route's JSON body>}``.

The holder answers each request by handing it, as is, to the one mailbox app
(:func:`node.community.server.create_app` of ``<home>/mailbox.sqlite3``, called in-process
through ASGI): the one signature check, nonce memory, rate limits (the per-address bucket
keyed by the peer's iroh key), bounds and ``mailbox-not-held`` rule of the HTTP routes. A
frame that is not one of the shapes above gets one response ``400`` ``mail-frame-invalid``
and the connection is closed with that code; nothing of it reaches the store.

The client side is an :class:`httpx.AsyncBaseTransport` (:class:`IrohMailTransport`) under a
:class:`node.community.client.CommunityClient` (:func:`mail_client`), so every caller of the
mailbox (``take_step``, ``leave_question``) and every error mapping is the HTTP one.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Awaitable, Callable

import anyio
import httpx

from node.common.errors import TransportError, UsageError
from node.community.requests import SIGNED_HEADERS
from node.trust.card import IROH_MAILBOX_RE, MAX_IROH_MAILBOX  # the one form of an iroh holder

#: The mailbox protocol's ALPN on a holder's iroh endpoint (beside knowledge-query's).
MAILBOX_ALPN = b"kith-mailbox/1"
#: The form of a holder reached over iroh in ``mailboxes`` and ``--holder``.
SCHEME = "iroh:"
#: Largest request frame (bytes): a put of the largest sealed body
#: (:data:`node.community.server.MAX_SEALED_BODY_BYTES`, 192 KiB) in base64, headers, room.
MAX_REQUEST_FRAME = 272 * 1024
#: Largest response frame (bytes): the client's cap on an HTTP answer and room.
MAX_RESPONSE_FRAME = (1 << 20) + 16 * 1024
#: Seconds a holder waits for the next request on an open connection before closing it.
IDLE_S = 30.0
#: Mailbox connections a holder serves at once; beyond, the one waiting longest is closed ``mail-busy`` (specs/sealed.md §7c).
MAX_CONNECTIONS = 32
#: op → the route it is (under /api/v1).
OPS = {"put": "/mailbox", "take": "/mailbox/take", "ack": "/mailbox/ack"}
_PATHS = {path: op for op, path in OPS.items()}
_API = "/api/v1"


def is_iroh_mailbox(url: str) -> bool:
    """True when ``url`` is the iroh form of a holder (``iroh:<ticket>``)."""
    return isinstance(url, str) and len(url) <= MAX_IROH_MAILBOX and IROH_MAILBOX_RE.fullmatch(url) is not None


def holder_key(url: str) -> str | None:
    """The endpoint id (the holder's device key, 64 hex) an ``iroh:<ticket>`` names, or None
    for another form or a ticket that does not parse."""
    if not is_iroh_mailbox(url):
        return None
    from node.transport.iroh import ticket_endpoint_id

    try:
        return ticket_endpoint_id(url[len(SCHEME):])
    except ValueError:
        return None


class MailFrameInvalid(Exception):
    """A frame that is not a request of the protocol (its message says why)."""


class _Lines:
    """Bounded lines from a :class:`node.transport.base.ByteStream`."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def line(self, max_bytes: int) -> bytes | None:
        """The next line without its ``\\n``; None at a clean EOF (nothing pending).

        Raises:
            MailFrameInvalid: longer than ``max_bytes``, or EOF inside a line.
        """
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                if end > max_bytes:
                    raise MailFrameInvalid(f"a frame is at most {max_bytes} bytes")
                out = bytes(self.buf[:end])
                del self.buf[:end + 1]
                return out
            if len(self.buf) > max_bytes:
                raise MailFrameInvalid(f"a frame is at most {max_bytes} bytes")
            data = await self.stream.receive()
            if not data:
                if self.buf:
                    raise MailFrameInvalid("the stream ended inside a frame")
                return None
            self.buf += data


def _frame(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def parse_request(line: bytes) -> tuple[str, dict[str, str], bytes]:
    """A request frame → ``(route path under /api/v1, the four signed headers, body bytes)``.

    Raises:
        MailFrameInvalid: not JSON, not exactly ``op`` / ``headers`` / ``body``, an unknown
            ``op``, headers other than the four ``X-Kith-*`` strings, a body not canonical
            base64.
    """
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise MailFrameInvalid("a request frame is one line of JSON") from None
    if not isinstance(obj, dict) or set(obj) != {"op", "headers", "body"}:
        raise MailFrameInvalid("a request frame has exactly op, headers and body")
    op, headers, body = obj["op"], obj["headers"], obj["body"]
    if op not in OPS:
        raise MailFrameInvalid(f"op is one of {sorted(OPS)}")
    if (not isinstance(headers, dict) or not set(headers) <= set(SIGNED_HEADERS)
            or any(not isinstance(v, str) or len(v) > 256 for v in headers.values())):
        raise MailFrameInvalid(f"headers are at most {list(SIGNED_HEADERS)}, each a string")
    if not isinstance(body, str):
        raise MailFrameInvalid("body is base64 text")
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise MailFrameInvalid("body is not base64") from None
    if base64.b64encode(raw).decode() != body:
        raise MailFrameInvalid("body is not canonical base64")
    return OPS[op], dict(headers), raw


async def serve_mail_stream(stream: Any, app: Any, remote: str, *, idle_s: float = IDLE_S,
                            waiting: Callable[[bool], None] | None = None) -> None:
    """Answer the request frames of one mailbox connection's stream with ``app`` until the
    peer ends the stream or is idle ``idle_s`` seconds.

    Args:
        stream: the connection's :class:`node.transport.base.ByteStream`.
        app: the holder's mailbox ASGI app (:func:`node.community.server.create_app`).
        remote: the peer's QUIC-authenticated key (64 hex): its requests count against the
            per-address bucket ``iroh:<first 16 hex>``.
        waiting: called with True while the connection waits for a whole request frame (idle,
            or a frame only partly sent) and False while one is answered: the holder closes
            the connection waiting longest when a new one finds every slot taken (§7c).

    Raises:
        MailFrameInvalid: after the ``400 mail-frame-invalid`` response was sent; the caller
            closes the connection with that code.
    """
    lines = _Lines(stream)
    asgi = httpx.ASGITransport(app=app, client=(f"iroh:{remote[:16]}", 0), raise_app_exceptions=False)
    client = httpx.AsyncClient(transport=asgi, base_url="http://holder")

    async def refuse(exc: MailFrameInvalid) -> None:
        await stream.send(_frame({"status": 400, "body": {"error": {"code": "mail-frame-invalid",
                                                                     "message": str(exc)}}}))

    try:
        while True:
            line: bytes | None = None
            if waiting is not None:
                waiting(True)
            with anyio.move_on_after(idle_s) as idle:
                try:
                    line = await lines.line(MAX_REQUEST_FRAME)
                except MailFrameInvalid as exc:
                    await refuse(exc)
                    raise
            if idle.cancelled_caught or line is None:
                return
            if waiting is not None:
                waiting(False)
            try:
                path, headers, body = parse_request(line)
            except MailFrameInvalid as exc:
                await refuse(exc)
                raise
            response = await client.post(_API + path, content=body,
                                         headers={**headers, "Content-Type": "application/json"})
            try:
                answer = response.json()
            except ValueError:
                answer = {"error": {"code": "server-error", "message": "the holder's answer was not JSON"}}
            await stream.send(_frame({"status": response.status_code, "body": answer}))
    finally:
        await client.aclose()


async def serve_mail_connection(listener: Any, conn: Any, app: Any,
                                waiting: Callable[[bool], None] | None = None) -> None:
    """Serve one incoming mailbox connection (the holder's accept loop, ALPN
    :data:`MAILBOX_ALPN`): accept its stream, answer its frames, close it — ``done`` after a
    clean end, ``mail-frame-invalid`` after a frame that is not a request. Never raises for
    what the peer sends or how its connection fails. ``waiting``: as for
    :func:`serve_mail_stream` (True until the stream is accepted)."""
    if waiting is not None:
        waiting(True)
    try:
        stream = await listener.accept_stream(conn)
    except TransportError:
        listener.close_connection(conn, b"mail-no-stream")
        return
    try:
        await serve_mail_stream(stream, app, listener.remote_of(conn), waiting=waiting)
    except MailFrameInvalid:  # the refusal frame acknowledged first (bounded), then closed with its code
        await stream.aclose(reason=b"mail-frame-invalid")
        return
    except TransportError:
        listener.close_connection(conn, b"transport-io")
        return
    await stream.aclose()


class IrohMailTransport(httpx.AsyncBaseTransport):
    """The client side: each mailbox request of a :class:`CommunityClient` sent as one frame
    to the holder ``ticket`` names, on one connection opened at the first request.

    Args:
        endpoint: async callable returning the :class:`node.transport.iroh.IrohNode` to dial
            from (the guest's pool endpoint, the host's listener), called at the first request.
        ticket: the holder's EndpointTicket (the text after ``iroh:``).
        connect_timeout_s: bound on the connection, seconds.
    """

    def __init__(self, endpoint: Callable[[], Awaitable[Any]], ticket: str, *, connect_timeout_s: float = 10.0) -> None:
        self._endpoint = endpoint
        self.ticket = ticket
        self.connect_timeout_s = connect_timeout_s
        self._stream: Any = None
        self._lines: _Lines | None = None
        self._lock = anyio.Lock()

    async def _open(self) -> None:
        node = await self._endpoint()
        conn = await node.connect(self.ticket, alpn=MAILBOX_ALPN, timeout_s=self.connect_timeout_s)
        self._stream = await node.open_stream(conn)
        self._lines = _Lines(self._stream)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` (a mailbox route) as a frame and return the holder's answer as an
        HTTP response. Raises :class:`httpx.ConnectError` (the client's
        ``server-unreachable``) when the holder cannot be reached or breaks the protocol."""
        path = request.url.path
        op = _PATHS.get(path[len(_API):]) if path.startswith(_API) else None
        if op is None or request.method != "POST":
            raise httpx.UnsupportedProtocol(f"a holder over iroh serves the mailbox routes only, not {path}")
        body = await request.aread()
        headers = {h: request.headers[h] for h in SIGNED_HEADERS if h in request.headers}
        async with self._lock:
            try:
                if self._stream is None:
                    await self._open()
                assert self._stream is not None and self._lines is not None
                await self._stream.send(_frame({"op": op, "headers": headers,
                                                "body": base64.b64encode(body).decode()}))
                line = await self._lines.line(MAX_RESPONSE_FRAME)
            except (TransportError, MailFrameInvalid) as exc:
                await self._drop()
                raise httpx.ConnectError(f"the holder over iroh: {exc}", request=request) from None
            try:
                answer = json.loads(line) if line is not None else None
            except (ValueError, RecursionError):
                answer = None
            if (not isinstance(answer, dict) or set(answer) != {"status", "body"}
                    or not isinstance(answer["status"], int) or isinstance(answer["status"], bool)
                    or not 100 <= answer["status"] <= 599):
                await self._drop()
                raise httpx.ConnectError("the holder over iroh did not answer with a response frame",
                                         request=request)
            return httpx.Response(answer["status"], content=json.dumps(answer["body"]).encode(),
                                  headers={"Content-Type": "application/json"}, request=request)

    async def _drop(self) -> None:
        stream, self._stream, self._lines = self._stream, None, None
        if stream is not None:
            with anyio.move_on_after(1):
                await stream.aclose()

    async def aclose(self) -> None:
        """End the stream and close the connection (``done``)."""
        await self._drop()


def mail_client(url: str, identity: Any, *, endpoint: Callable[[], Awaitable[Any]] | None = None,
                local_app: Any = None) -> Any:
    """The :class:`node.community.client.CommunityClient` of one holder, whatever its form:

    - ``local_app`` given (this device's own held mail): its ASGI app, called in-process;
    - ``iroh:<ticket>``: over iroh from ``endpoint()`` (:class:`IrohMailTransport`);
    - ``http(s)://...``: over HTTP, as a community server.

    Its ``base_url`` is ``url`` in every case (what a report or an outbox row names).

    Raises:
        UsageError: ``usage`` for an ``iroh:`` form without an endpoint to dial from, or a
            URL of neither form.
    """
    from node.common.names import holder_text
    from node.community.client import CommunityClient

    if local_app is not None:
        asgi = httpx.ASGITransport(app=local_app, raise_app_exceptions=False)  # a 500, not a raise
        client = CommunityClient("http://holder", identity, transport=asgi)
    elif url.startswith(SCHEME):
        if endpoint is None or not is_iroh_mailbox(url):
            raise UsageError("usage", "a holder over iroh (iroh:<ticket>) is dialled from an iroh endpoint")
        client = CommunityClient("http://holder", identity, transport=IrohMailTransport(endpoint, url[len(SCHEME):]))
    else:
        return CommunityClient(url, identity)
    client.base_url = url
    client.display_url = holder_text(url)
    client.party = "the device holding mail"  # not a community server: the person's own device
    return client


__all__ = ["IrohMailTransport", "MAILBOX_ALPN", "MAX_CONNECTIONS", "MAX_REQUEST_FRAME", "MAX_RESPONSE_FRAME",
           "MailFrameInvalid", "OPS", "SCHEME", "holder_key", "is_iroh_mailbox", "mail_client", "parse_request", "serve_mail_connection", "serve_mail_stream"]
