"""The iroh QUIC transport (DESIGN §3): endpoint bound with the identity secret, one
bi-stream per session, errors translated to :mod:`node.common.errors` in this one module.

``local=True`` (``--local`` / ``KITH_OFFLINE=1``) means relay disabled, loopback bind,
minimal preset: fully offline, for tests and loopback demos. Otherwise the public n0
preset with relays is used. Importing this module applies the version-gated send-path
patch (:mod:`node.transport.iroh_patch`).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio
import anyio.abc
import iroh
from iroh import iroh_ffi

from node.common.errors import TransportError
from node.transport import iroh_patch
from node.transport.base import ByteStream

iroh_patch.apply()

CLOSE_TIMEOUT_S = 5.0
#: A guest's bound on closing its endpoint (s). Its sessions have ended first (each
#: stream's last frame acknowledged, :meth:`IrohStream.aclose`); what is left is QUIC
#: draining connections that never came up — for a killed host 3×PTO, measured 3.0 s
#: after ``kith ask`` had printed its answer — which no peer will ever receive.
GUEST_CLOSE_TIMEOUT_S = 0.1
#: seconds an incoming QUIC handshake may take before the connection is dropped
QUIC_HANDSHAKE_TIMEOUT_S = 5.0
#: incoming QUIC handshakes completed at once by :meth:`IrohNode.connections`
MAX_CONCURRENT_QUIC_HANDSHAKES = 128
#: Adaptive read size (bytes): each ``read`` crosses the FFI, so during a bulk transfer (a
#: UI bundle) reads grow up to MAX while they come back full, and shrink back when small
#: frames are flowing (a large request allocates that much on the Rust side).
MIN_READ_BYTES = 64 * 1024
MAX_READ_BYTES = 1024 * 1024
#: Large sends go out in pieces of this size: one ``write_all`` of many MiB is several times
#: slower through the FFI than 256 KiB writes (measured 27 vs 83 MB/s for 16 MiB, both ends
#: in one process).
MAX_WRITE_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 15.0
#: On close, how long a stream waits for the peer to acknowledge every byte sent (s)
#: before the connection is closed anyway. The last frame before a close (a refusal, the
#: terminal ``end``) must reach the peer: closing the connection first discards what is
#: still in flight, so this bound is generous; an acknowledged stream closes at once.
DRAIN_TIMEOUT_S = 5.0


def _io_error(what: str) -> TransportError:
    return TransportError("transport-io", f"the connection failed while {what}")


def ticket_endpoint_id(ticket: str) -> str:
    """Parse an iroh ``EndpointTicket`` string and return its endpoint id (64 hex).

    Raises:
        ValueError: if the ticket cannot be parsed.
    """
    if not isinstance(ticket, str) or len(ticket) > 8192:
        raise ValueError("bad ticket")
    try:
        return str(iroh.EndpointTicket.from_string(ticket).endpoint_addr().id())
    except Exception:  # noqa: BLE001 - iroh raises its own error type; translated here
        raise ValueError("bad ticket") from None


async def _complete(incoming: iroh.Incoming, timeout_s: float) -> iroh.Connection | None:
    """Finish one incoming QUIC handshake; None if it fails or takes over ``timeout_s`` s."""
    try:
        with anyio.fail_after(timeout_s):
            accepting = await incoming.accept()
            return await accepting.connect()
    except (iroh.IrohError, TimeoutError):
        return None


class IrohStream(ByteStream):
    """One QUIC bi-stream as a :class:`node.transport.base.ByteStream`.

    Attributes:
        drain_timeout_s: :meth:`aclose`'s bound on waiting for the peer's acknowledgement
            (s; :data:`DRAIN_TIMEOUT_S` unless set on the class or the instance).
    """

    drain_timeout_s: float = DRAIN_TIMEOUT_S

    def __init__(self, conn: iroh.Connection, bi: iroh.BiStream) -> None:
        self._conn = conn
        self._send = bi.send()
        self._recv = bi.recv()
        self.remote_id: str | None = str(conn.remote_id())
        self._eof_sent = False
        self._read_size = MIN_READ_BYTES

    async def receive(self, max_bytes: int | None = None) -> bytes:
        """Return 1..max_bytes bytes, ``b""`` at EOF. Raises TransportError.

        Without ``max_bytes`` the read size adapts between :data:`MIN_READ_BYTES` and
        :data:`MAX_READ_BYTES` (bulk transfers need large reads: measured 36 → 68 MB/s
        for 64 KiB → 1 MiB reads with both ends in one process).
        """
        size = max_bytes if max_bytes is not None else self._read_size
        try:
            data = await self._recv.read(size)
        except iroh.IrohError:
            raise _io_error("receiving") from None
        if max_bytes is None:
            if len(data) * 2 > size:
                self._read_size = min(size * 2, MAX_READ_BYTES)
            elif len(data) * 8 < size:
                self._read_size = max(size // 2, MIN_READ_BYTES)
        return data

    async def send(self, data: bytes) -> None:
        """Send all bytes. Raises TransportError."""
        if not data:
            return
        try:
            if len(data) <= MAX_WRITE_BYTES:
                await self._send.write_all(data)
                return
            view = memoryview(data)
            for i in range(0, len(data), MAX_WRITE_BYTES):
                await self._send.write_all(bytes(view[i:i + MAX_WRITE_BYTES]))
        except iroh.IrohError:
            raise _io_error("sending") from None

    async def send_eof(self) -> None:
        """Finish the send side (idempotent; errors ignored: the peer may be gone)."""
        if self._eof_sent:
            return
        self._eof_sent = True
        try:
            await self._send.finish()
        except iroh.IrohError:
            pass

    async def aclose(self) -> None:
        """Finish sending and close the connection (the peer sees EOF, then close).

        The connection is closed only once the peer acknowledged every byte sent (QUIC's
        ``stopped()``: all data acknowledged, or the peer stopped the stream), or after
        :attr:`drain_timeout_s` — so the last frame is not lost to a close under load."""
        await self.send_eof()
        try:
            with anyio.move_on_after(self.drain_timeout_s):
                await self._send.stopped()
        except iroh.IrohError:
            pass
        try:
            self._conn.close(0, b"done")
        except iroh.IrohError:
            pass


class IrohNode:
    """An iroh endpoint bound with the node identity.

    Use :func:`bind_node` (an async context manager) to create one; it is closed under a
    timeout on exit.
    """

    def __init__(self, endpoint: iroh.Endpoint, alpn: bytes, local: bool,
                 close_timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        self.endpoint = endpoint
        self.alpn = alpn
        self.local = local
        self.close_timeout_s = close_timeout_s

    @property
    def endpoint_id(self) -> str:
        """Our endpoint id (= identity public key, 64 hex)."""
        return str(self.endpoint.id())

    def ticket(self) -> str:
        """An ``EndpointTicket`` string for our current address."""
        return str(iroh.EndpointTicket.from_addr(self.endpoint.addr()))

    async def wait_online(self, timeout_s: float = 10.0) -> bool:
        """Wait for relay/home addresses (non-local mode only). Never waits unbounded
        (offline, ``online()`` never returns — DESIGN §3). Returns True if online."""
        if self.local:
            return True
        with anyio.move_on_after(timeout_s):
            await self.endpoint.online()
            return True
        return False

    async def connect(self, ticket: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> iroh.Connection:
        """Connect to the endpoint in ``ticket``.

        Raises:
            TransportError: ``transport-connect-failed`` (unreachable, refused, timeout).
        """
        try:
            addr = iroh.EndpointTicket.from_string(ticket).endpoint_addr()
        except iroh.IrohError:
            raise TransportError("transport-connect-failed", "the iroh ticket cannot be parsed") from None
        try:
            with anyio.fail_after(timeout_s):
                return await self.endpoint.connect(addr, self.alpn)
        except TimeoutError:
            raise TransportError("transport-connect-failed", f"no answer from the host within {timeout_s:.0f} s") from None
        except iroh.IrohError:
            raise TransportError("transport-connect-failed", "the host refused or could not be reached") from None

    async def open_stream(self, conn: iroh.Connection) -> IrohStream:
        """Open the session's bi-stream on ``conn``."""
        try:
            return IrohStream(conn, await conn.open_bi())
        except iroh.IrohError:
            raise TransportError("transport-connect-failed", "could not open a stream to the host") from None

    async def accept(self, *, handshake_timeout_s: float = QUIC_HANDSHAKE_TIMEOUT_S) -> iroh.Connection | None:
        """Wait for the next incoming connection (None when the endpoint closed).

        One at a time (tests, simple servers); a host uses :meth:`connections`, which
        completes QUIC handshakes concurrently. A handshake that fails or does not finish
        within ``handshake_timeout_s`` seconds is skipped, not raised.
        """
        while True:
            try:
                incoming = await self.endpoint.accept_next()
            except iroh.IrohError:
                return None
            if incoming is None:
                return None
            conn = await _complete(incoming, handshake_timeout_s)
            if conn is not None:
                return conn

    @asynccontextmanager
    async def connections(self, *, handshake_timeout_s: float = QUIC_HANDSHAKE_TIMEOUT_S,
                          max_handshakes: int = MAX_CONCURRENT_QUIC_HANDSHAKES
                          ) -> AsyncIterator[anyio.abc.ObjectReceiveStream[iroh.Connection]]:
        """Accept incoming connections in the background for a ``with`` block; yields a
        receive stream of established connections (it ends when the endpoint closes).

        Each QUIC handshake completes in its own task under ``handshake_timeout_s``
        seconds, at most ``max_handshakes`` at once: a peer that starts a handshake and
        stalls delays nobody else (the sequential :meth:`accept` would wait for it).
        """
        send, recv = anyio.create_memory_object_stream[iroh.Connection](max_handshakes)
        limiter = anyio.CapacityLimiter(max_handshakes)

        async def complete(incoming: iroh.Incoming) -> None:
            try:
                conn = await _complete(incoming, handshake_timeout_s)
                if conn is not None:
                    try:
                        await send.send(conn)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        pass
            finally:
                limiter.release_on_behalf_of(incoming)

        async def acceptor(tg: anyio.abc.TaskGroup) -> None:
            while True:
                token = object()
                await limiter.acquire_on_behalf_of(token)
                try:
                    incoming = await self.endpoint.accept_next()
                except iroh.IrohError:
                    incoming = None
                limiter.release_on_behalf_of(token)
                if incoming is None:
                    send.close()
                    return
                await limiter.acquire_on_behalf_of(incoming)
                tg.start_soon(complete, incoming)

        async with anyio.create_task_group() as tg:
            tg.start_soon(acceptor, tg)
            try:
                yield recv
            finally:
                tg.cancel_scope.cancel()
                send.close()

    @staticmethod
    async def accept_stream(conn: iroh.Connection, *, timeout_s: float = 10.0) -> IrohStream:
        """Accept the session's bi-stream on an incoming connection.

        Raises:
            TransportError: ``transport-io`` if none arrives within ``timeout_s``.
        """
        try:
            with anyio.fail_after(timeout_s):
                return IrohStream(conn, await conn.accept_bi())
        except TimeoutError:
            raise TransportError("transport-io", "the peer opened no stream in time") from None
        except iroh.IrohError:
            raise _io_error("accepting a stream") from None

    @staticmethod
    def close_connection(conn: iroh.Connection, reason: bytes) -> None:
        """Close ``conn`` at once with QUIC application code 1 and ``reason`` (a stable
        code such as ``b"handshake-host-busy"``); errors of an already-closed connection
        are ignored."""
        try:
            conn.close(1, reason)
        except Exception:  # noqa: BLE001 - iroh error on an already-closed connection
            pass

    @staticmethod
    def remote_of(conn: iroh.Connection) -> str:
        """The QUIC-authenticated peer key of ``conn`` (64 hex), or "" once it closed."""
        try:
            return str(conn.remote_id())
        except Exception:  # noqa: BLE001 - iroh error on a closed connection
            return ""

    async def aclose(self) -> None:
        """Close the endpoint under ``close_timeout_s`` seconds (:func:`bind_node`'s;
        DESIGN §3)."""
        with anyio.move_on_after(self.close_timeout_s):
            try:
                await self.endpoint.close()
            except iroh.IrohError:
                pass


@asynccontextmanager
async def bind_node(secret: bytes, alpn: bytes, *, local: bool,
                    close_timeout_s: float = CLOSE_TIMEOUT_S) -> AsyncIterator[IrohNode]:
    """Bind an iroh endpoint with the 32-byte identity ``secret`` for ``alpn``.

    Args:
        local: relay disabled + ``127.0.0.1:0`` + minimal preset (offline) when True;
            the n0 preset with relays otherwise.
        close_timeout_s: bound on closing the endpoint on exit, seconds
            (:data:`CLOSE_TIMEOUT_S` for a host; guests pass :data:`GUEST_CLOSE_TIMEOUT_S`).

    Raises:
        TransportError: ``transport-bind-failed``.
    """
    iroh_ffi.uniffi_set_event_loop(asyncio.get_running_loop())
    if local:
        opts = iroh.EndpointOptions(preset=iroh.preset_minimal(), relay_mode=iroh.RelayMode.disabled(),
                                    bind_addr="127.0.0.1:0", secret_key=secret, alpns=[alpn])
    else:
        opts = iroh.EndpointOptions(preset=iroh.preset_n0(), secret_key=secret, alpns=[alpn])
    try:
        endpoint = await iroh.Endpoint.bind(opts)
    except iroh.IrohError:
        raise TransportError("transport-bind-failed") from None
    node = IrohNode(endpoint, alpn, local, close_timeout_s)
    try:
        yield node
    finally:
        # shielded: on Ctrl-C the surrounding scope is cancelled, and an unshielded close
        # would be cancelled too, leaving peers to wait for QUIC's idle timeout
        with anyio.CancelScope(shield=True):
            await node.aclose()
