"""The byte-stream contract every transport implements (anyio's stream habit).

``receive(max_bytes)`` returns at least one byte, or ``b""`` at EOF; ``send(data)`` writes
all of ``data``; ``send_eof()`` closes our sending side; ``aclose()`` releases everything.
Both transports (:class:`node.transport.memory.MemoryStream`,
:class:`node.transport.iroh.IrohStream`) subclass :class:`ByteStream`, and
:func:`node.runtime.driver.run_session` takes nothing else; ``tests/test_transport.py``
runs both through the same contract check.
Transport failures surface as :class:`node.common.errors.TransportError` (``transport-io``),
translated in one place per transport.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

DEFAULT_RECEIVE_BYTES = 65536


@runtime_checkable
class ByteStream(Protocol):
    """A reliable, ordered, bidirectional byte stream.

    Attributes:
        remote_id: the authenticated peer id (64 hex) when the transport proves one, else None.
    """

    remote_id: str | None

    async def receive(self, max_bytes: int | None = None) -> bytes:
        """Return 1..max_bytes bytes, or ``b""`` at EOF. Raises TransportError.

        ``max_bytes`` None lets the transport choose (the memory pipe:
        :data:`DEFAULT_RECEIVE_BYTES`; iroh: an adaptive read size)."""
        ...

    async def send(self, data: bytes) -> None:
        """Send all of ``data``. Raises TransportError."""
        ...

    async def send_eof(self) -> None:
        """Finish our sending side (the peer then reads EOF)."""
        ...

    async def aclose(self) -> None:
        """Close the stream in both directions (idempotent)."""
        ...
