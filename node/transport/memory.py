"""An in-memory byte pipe (two connected :class:`MemoryStream` ends) for engine tests and
``kith protocol test``. Same contract as the iroh stream (``node.transport.base``)."""

from __future__ import annotations

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
