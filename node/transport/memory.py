"""An in-memory byte pipe (two connected :class:`MemoryStream` ends) for engine tests and
``kith protocol test``. Same contract as the iroh stream (``node.transport.base``);
:class:`MemoryListener` is a host endpoint made of such pipes."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from node.common.errors import TransportError
from node.transport.base import DEFAULT_RECEIVE_BYTES, ByteStream


class MemoryStream(ByteStream):
    """One end of a memory pipe. ``remote_id`` is set by :func:`memory_pipe`."""

    def __init__(self, send: MemoryObjectSendStream[bytes], recv: MemoryObjectReceiveStream[bytes],
                 remote_id: str | None) -> None:
        self._send = send
        self._recv = recv
        self._pending = b""
        self.remote_id = remote_id

    async def receive(self, max_bytes: int | None = None) -> bytes:
        """Return up to ``max_bytes`` bytes (None: :data:`DEFAULT_RECEIVE_BYTES`), or ``b""``
        once the peer sent EOF."""
        if max_bytes is None:
            max_bytes = DEFAULT_RECEIVE_BYTES
        if not self._pending:
            try:
                self._pending = await self._recv.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return b""
        data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    async def send(self, data: bytes) -> None:
        """Send ``data`` (empty data is a no-op)."""
        if not data:
            return
        try:
            await self._send.send(bytes(data))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise TransportError("transport-io", "the peer closed the pipe") from None

    async def send_eof(self) -> None:
        """Close our sending side."""
        await self._send.aclose()

    async def aclose(self) -> None:
        """Close both directions."""
        await self._send.aclose()
        await self._recv.aclose()


def memory_pipe(a_id: str | None = None, b_id: str | None = None,
                buffer: int = 64) -> tuple[MemoryStream, MemoryStream]:
    """Return two connected streams ``(a, b)``; ``a.remote_id == b_id`` and vice versa.

    ``buffer`` is the number of chunks either direction holds before ``send`` waits.
    """
    a_to_b_send, a_to_b_recv = anyio.create_memory_object_stream[bytes](buffer)
    b_to_a_send, b_to_a_recv = anyio.create_memory_object_stream[bytes](buffer)
    return (MemoryStream(a_to_b_send, b_to_a_recv, b_id),
            MemoryStream(b_to_a_send, a_to_b_recv, a_id))


class MemoryConnection:
    """One guest's connection to a :class:`MemoryListener`: the host's end of its pipe."""

    def __init__(self, stream: MemoryStream) -> None:
        self.stream = stream
        self.closed: bytes | None = None


class MemoryListener:
    """A host endpoint over memory pipes, with the listener shape the host uses of
    :class:`node.transport.iroh.IrohNode` (``ticket``, ``wait_online``, ``connections``,
    ``accept_stream``, ``close_connection``, ``remote_of``): ``kith protocol test`` and
    the host tests run the real :class:`node.host.host.Host` on it, no iroh needed.

    Args:
        endpoint_id: the host's key (64 hex), what a guest's stream names as its remote.
        backlog: connections queued before :meth:`connect` waits.
    """

    def __init__(self, endpoint_id: str, backlog: int = 64) -> None:
        self.endpoint_id = endpoint_id
        self._send, self._recv = anyio.create_memory_object_stream[MemoryConnection](backlog)

    def ticket(self) -> str:
        """``memory:<endpoint id>`` (no address: only this process can connect)."""
        return f"memory:{self.endpoint_id}"

    async def wait_online(self) -> bool:
        """Always True: a memory endpoint is online once made."""
        return True

    async def connect(self, guest_id: str) -> MemoryStream:
        """Connect as the guest whose key is ``guest_id``; returns the guest's end (its
        ``remote_id`` is the host's key, as QUIC would authenticate it).

        Raises:
            TransportError: ``transport-connect-failed`` once the listener closed.
        """
        guest_end, host_end = memory_pipe(guest_id, self.endpoint_id)
        try:
            await self._send.send(MemoryConnection(host_end))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise TransportError("transport-connect-failed", "the memory host is closed") from None
        return guest_end

    @asynccontextmanager
    async def connections(self) -> AsyncIterator[MemoryObjectReceiveStream[MemoryConnection]]:
        """The connections guests make, for a ``with`` block (it ends when :meth:`aclose`
        was called)."""
        yield self._recv

    @staticmethod
    async def accept_stream(conn: MemoryConnection, *, timeout_s: float = 10.0) -> MemoryStream:
        """The connection's one stream (opened with it)."""
        return conn.stream

    @staticmethod
    def close_connection(conn: MemoryConnection, reason: bytes) -> None:
        """Mark ``conn`` closed with ``reason``; the pipe closes with its stream."""
        conn.closed = reason

    @staticmethod
    def remote_of(conn: MemoryConnection) -> str:
        """The guest key the connection was made with."""
        return conn.stream.remote_id or ""

    async def aclose(self) -> None:
        """No more connections: :meth:`connections` ends."""
        await self._send.aclose()
