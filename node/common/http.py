"""Bounds on the HTTP connections of Kith's uvicorn servers (the community server and the
local read-only API, DESIGN §11/§12): a slow or idle client cannot pin the process.

uvicorn bounds *requests* (``limit_concurrency`` answers 503 beyond it) and idle
keep-alive connections (``timeout_keep_alive``), but has no option bounding how long a
request may take to *arrive*: a connection that never finishes its request head
(slowloris), or whose head announces a body that never comes, stays open forever and
counts against ``limit_concurrency``. The protocol here adds three rules to uvicorn's h11
protocol:

- **head deadline**: a connection must deliver a complete request head within
  :data:`HEADER_TIMEOUT_S` seconds of opening (and of the previous response on a
  keep-alive connection), else it is closed — dribbling bytes does not extend it;
- **body deadline**: once the head has come, the whole body it announces must arrive
  within :data:`BODY_TIMEOUT_S` seconds, else the connection is closed (the handler
  reading it sees the client gone: a quiet close) — dribbling does not extend it either;
- **connection cap**: beyond :data:`MAX_CONNECTIONS` open connections a new one is closed
  at once (before it can use memory), so the file descriptors the process holds stay
  bounded.

Used through :data:`UVICORN_LIMITS` (``uvicorn.Config(..., **UVICORN_LIMITS)``) by :func:`_config`, which both servers use.
The module also holds the plumbing both servers share: body reading, the error shape,
socket binding and uvicorn in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from node.common.errors import CommunityError

#: Deepest nesting of objects/arrays a JSON request body may have.
MAX_JSON_DEPTH = 32

#: Seconds a connection may take to send a complete request head.
HEADER_TIMEOUT_S = 10.0
#: Seconds a request's body may take to arrive whole once its head has come (the largest
#: body a server takes, 8 MiB for the local API's POST /verify, in 30 s is ~280 KB/s).
BODY_TIMEOUT_S = 30.0
#: Open connections beyond which a new connection is closed immediately.
MAX_CONNECTIONS = 512
#: Requests (and connections) in flight beyond which uvicorn answers 503.
LIMIT_CONCURRENCY = 256
#: Seconds an idle keep-alive connection is kept after a response.
KEEP_ALIVE_S = 5


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline, a request-body deadline and a
    connection cap (reads :data:`HEADER_TIMEOUT_S`, :data:`BODY_TIMEOUT_S` and
    :data:`MAX_CONNECTIONS` when it arms a deadline or takes a connection). One timer at a
    time: the head's until a head has come, then the body's until the body has ended."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()  # connection_lost() removes it from the set
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        cycle = self.cycle
        if cycle is None:
            return
        if cycle is not before and cycle.more_body:  # a complete request head: now its body, in time
            self._arm(BODY_TIMEOUT_S)
        elif cycle is not before or (self._awaiting_body and not cycle.more_body):
            self._disarm()  # a request without a body, or the body ended

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm()  # the next request's head must come in time too
        super().on_response_complete()

    _awaiting_body = False

    def _arm(self, seconds: float | None = None) -> None:
        """Close the connection unless disarmed within ``seconds`` (None: the head deadline,
        :data:`HEADER_TIMEOUT_S`; else a body's)."""
        self._disarm()
        self._awaiting_body = seconds is not None
        self._head_timer = self.loop.call_later(HEADER_TIMEOUT_S if seconds is None else seconds,
                                                self._head_timeout)

    def _disarm(self) -> None:
        self._awaiting_body = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


#: Keyword arguments for ``uvicorn.Config``: the bounded protocol, 503 beyond
#: :data:`LIMIT_CONCURRENCY`, idle keep-alive connections closed after :data:`KEEP_ALIVE_S`.
UVICORN_LIMITS: dict[str, Any] = {"http": BoundedH11Protocol,
                                  "limit_concurrency": LIMIT_CONCURRENCY,
                                  "timeout_keep_alive": KEEP_ALIVE_S}

async def read_body(request: Request, cap: int) -> bytes:
    """Read at most ``cap`` bytes of a Starlette request body (shared by the community server
    and the local API).

    Raises:
        CommunityError: ``request-too-large`` (413) beyond ``cap``, ``request-invalid``
            (400) for a Content-Length that is not a number, or when the client hung up
            before its body ended (Starlette's ``ClientDisconnect``: the server's error
            answer then goes nowhere — uvicorn drops a response to a closed connection —
            so a hang-up mid-request is a quiet close, not a logged traceback).
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise CommunityError("request-invalid", "Content-Length is not a number", status=400)
        if int(declared) > cap:
            raise CommunityError("request-too-large", f"the body is larger than {cap} bytes",
                                 status=413)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise CommunityError("request-too-large", f"the body is larger than {cap} bytes",
                                     status=413)
            chunks.append(chunk)
    except ClientDisconnect:
        raise CommunityError("request-invalid", "the client hung up before its request body ended",
                             status=400) from None
    return b"".join(chunks)


def error_response(code: str, message: str, status: int,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape: ``{"error": {"code": code, "message": message}}``."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True if ``value`` nests objects/arrays deeper than ``limit`` (iterative)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


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
    (so ``kith community serve`` exits 0 after a clean shutdown), and runs ``on_loop()``
    (an async callable: the home's background runner, node/guest/runner.py) as a task
    on its event loop from start-up to shutdown."""

    def __init__(self, config: uvicorn.Config, on_loop: Any = None) -> None:
        super().__init__(config)
        self.on_loop = on_loop
        self._background: Any = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.on_loop is not None:
            self._background = asyncio.get_running_loop().create_task(self.on_loop())

    async def shutdown(self, sockets: Any = None) -> None:
        if self._background is not None:
            self._background.cancel()
            with contextlib.suppress(BaseException):
                await self._background
        await super().shutdown(sockets=sockets)

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


def _config(app: Starlette, *, access_log: bool, trust_proxy: list[str] | None = None) -> uvicorn.Config:
    # log_config=None: leave the embedding process's logging alone (uvicorn's default config
    # would send access lines to stdout, which must carry only JSON in --json mode).
    # proxy_headers: uvicorn trusts X-Forwarded-For/-Proto from 127.0.0.1 by default, which
    # lets any local client pick its "address" (issue 11): off unless proxies are named.
    proxies = {"proxy_headers": True, "forwarded_allow_ips": list(trust_proxy)} if trust_proxy else \
        {"proxy_headers": False}
    return uvicorn.Config(app, lifespan="off", log_config=None, access_log=access_log,
                          server_header=False, timeout_graceful_shutdown=5, **proxies, **UVICORN_LIMITS)


def parse_trust_proxy(values: list[str]) -> list[str]:
    """Check ``--trust-proxy`` values: each an IP address or CIDR network (``10.0.0.0/8``,
    ``::1``). Returns them normalised (``10.0.0.0/8``).

    Raises:
        UsageError: ``usage`` for a value that is neither.
    """
    import ipaddress

    from node.common.errors import UsageError

    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            raise UsageError("usage", f"--trust-proxy: {value!r} is not an IP address or CIDR network") from None
    return out


def serve_forever(app: Starlette, sock: socket.socket, *, access_log: bool = False,
                  trust_proxy: list[str] | None = None, on_loop: Any = None) -> None:
    """Serve ``app`` on the bound ``sock`` in this (main) thread until SIGINT/SIGTERM.

    ``trust_proxy``: addresses/CIDR networks of reverse proxies whose ``X-Forwarded-For``
    names the client; None or empty = the header is ignored (the TCP peer is the client).
    ``on_loop``: an async callable run as a task on the server's loop while it serves."""
    server = _Server(_config(app, access_log=access_log, trust_proxy=trust_proxy), on_loop)
    server.run(sockets=[sock])


@contextlib.contextmanager
def serve_app_in_thread(app: Any, sock: socket.socket, *, what: str,
                        startup_timeout_s: float = 10.0, trust_proxy: list[str] | None = None,
                        on_loop: Any = None) -> Iterator[str]:
    """Serve an ASGI ``app`` on an already bound ``sock`` with uvicorn in a daemon thread
    for a ``with`` block; the socket is closed on exit. Used by the community server and
    the local read-only API.

    Args:
        what: how to name the server in an error, e.g. ``"the local API"``.
        startup_timeout_s: how long to wait for uvicorn to start, in seconds.
        trust_proxy: as :func:`serve_forever` (default: ``X-Forwarded-For`` ignored).
        on_loop: as :func:`serve_forever`.

    Yields:
        The base URL, e.g. ``"http://127.0.0.1:41234"``.

    Raises:
        CommunityError: ``server-start-failed`` if it does not start in time.
    """
    url = base_url_of(sock)
    server = _Server(_config(app, access_log=False, trust_proxy=trust_proxy), on_loop)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"kith {url}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise CommunityError("server-start-failed", f"{what} at {url} did not start", status=0)
            time.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


__all__ = ["BODY_TIMEOUT_S", "BoundedH11Protocol", "HEADER_TIMEOUT_S", "KEEP_ALIVE_S", "LIMIT_CONCURRENCY",
           "MAX_CONNECTIONS", "MAX_JSON_DEPTH", "UVICORN_LIMITS", "base_url_of", "bind_socket",
           "error_response", "is_loopback", "parse_trust_proxy", "read_body", "serve_app_in_thread", "serve_forever",
           "too_deep"]
