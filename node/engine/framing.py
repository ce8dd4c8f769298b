"""JSON-Lines framing (DESIGN §3, §7): UTF-8, one JSON object per line, ``\\n``-terminated,
bounded line size. No I/O: bytes in, lines/objects out.
"""

from __future__ import annotations

from typing import Any

import msgspec

from node.common.errors import ProtocolViolation

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


class LineFramer:
    """Split a byte stream into lines of at most ``max_line_bytes`` (excluding ``\\n``).

    Feed it whatever chunks the transport delivers; it returns complete lines in order.

    Raises (from :meth:`feed` / :meth:`eof`):
        ProtocolViolation: ``frame-too-large`` as soon as a line exceeds the limit (before
            buffering more of it); ``frame-truncated`` at EOF with a partial line.
    """

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Append ``data``; return the complete lines it finished (without ``\\n``)."""
        lines: list[bytes] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            piece = data[start:nl]
            if len(self._buf) + len(piece) > self.max_line_bytes:
                self._buf.clear()
                raise ProtocolViolation("frame-too-large",
                                        f"a line is longer than {self.max_line_bytes} bytes")
            if self._buf:
                self._buf += piece
                lines.append(bytes(self._buf))
                self._buf.clear()
            else:
                lines.append(piece)
            start = nl + 1
        rest = data[start:]
        if len(self._buf) + len(rest) > self.max_line_bytes:
            self._buf.clear()
            raise ProtocolViolation("frame-too-large", f"a line is longer than {self.max_line_bytes} bytes")
        self._buf += rest
        return lines

    def eof(self) -> None:
        """Signal end of stream.

        Raises:
            ProtocolViolation: ``frame-truncated`` if a partial line is buffered.
        """
        if self._buf:
            self._buf.clear()
            raise ProtocolViolation("frame-truncated")

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line currently held."""
        return len(self._buf)


def encode_frame(obj: dict[str, Any]) -> bytes:
    """Encode one frame as compact JSON + ``\\n`` (UTF-8)."""
    return _encoder.encode(obj) + b"\n"


def decode_frame(line: bytes) -> dict[str, Any]:
    """Decode one line into a JSON object with a string ``action``.

    Raises:
        ProtocolViolation: ``frame-invalid-utf8``, ``frame-invalid-json`` (including a
            non-object), ``frame-missing-action``.
    """
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolViolation("frame-invalid-utf8") from None
    try:
        obj = _decoder.decode(line)
    except (msgspec.DecodeError, RecursionError, ValueError):
        # RecursionError: deeply nested arrays/objects (a few KB of "[[[[…") must be a
        # refusal, never a crash of the session task
        raise ProtocolViolation("frame-invalid-json") from None
    if not isinstance(obj, dict):
        raise ProtocolViolation("frame-invalid-json", "a frame must be a JSON object")
    if not isinstance(obj.get("action"), str) or not obj["action"]:
        raise ProtocolViolation("frame-missing-action")
    return obj
