"""Parsers, first cut: plain text, Markdown and reStructuredText (DESIGN §9).

A parser turns a file's bytes into one text string plus what the chunker needs to know
(the ``kind`` decides whether headings are recognised). Decoding is UTF-8 (a BOM is
honoured, UTF-16 with a BOM too); bytes that are not UTF-8 fall back to cp1252 and the
fallback is recorded on the document's tracking row. Anything else is refused with a
:class:`Unsupported` reason, never a crash of the batch.

Later parsers (HTML, JSON/CSV, PDF, DOCX, archives) plug in by adding a kind to
:func:`kind_for` and a branch to :func:`parse_bytes`.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

#: Largest file read as text (bytes). Bigger files are skipped with reason ``too-large``.
MAX_TEXT_BYTES = 20 * 1024 * 1024

_SUFFIX_KIND = {
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".rst": "rst",
}


class Unsupported(Exception):
    """The file cannot be parsed by this cut; ``reason`` is a stable kebab-case code.

    Reasons: ``unsupported-type`` (extension not handled), ``binary`` (NUL bytes in a
    text file), ``too-large`` (over :data:`MAX_TEXT_BYTES`).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ParsedDocument:
    """A decoded document.

    Attributes:
        text: the decoded text (newlines untouched; the chunker normalises CRLF/CR).
        kind: ``text``, ``markdown`` or ``rst``.
        encoding: the codec that decoded it (``utf-8``, ``utf-8-sig``, ``utf-16``, ``cp1252``).
        fallback: True when UTF-8 failed and cp1252 was used.
        replaced: True when some bytes could not be decoded even by the fallback and were
            replaced with U+FFFD.
    """

    text: str
    kind: str
    encoding: str
    fallback: bool = False
    replaced: bool = False


def kind_for(name: str) -> str | None:
    """Return the parser kind for a file name, or ``None`` when this cut cannot read it.

    ``name.rst.txt`` (Sphinx ``_sources`` as in the python-docs corpus) is RST.
    """
    low = name.lower()
    if low.endswith(".rst.txt"):
        return "rst"
    dot = low.rfind(".")
    if dot <= 0:
        return None
    return _SUFFIX_KIND.get(low[dot:])


def decode_text(data: bytes) -> tuple[str, str, bool, bool]:
    """Decode bytes as text: ``(text, encoding, fallback, replaced)``.

    UTF-8 (BOM stripped), UTF-16 when a UTF-16 BOM is present, otherwise cp1252 with
    undefined bytes replaced (``replaced`` True then).

    Raises:
        Unsupported: ``binary`` when the bytes contain NUL and no UTF-16 BOM.
    """
    if data.startswith(codecs.BOM_UTF8):
        try:
            return data[len(codecs.BOM_UTF8):].decode("utf-8"), "utf-8-sig", False, False
        except UnicodeDecodeError:
            pass
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16"), "utf-16", False, False
        except UnicodeDecodeError as exc:
            raise Unsupported("binary") from exc
    if b"\x00" in data:
        raise Unsupported("binary")
    try:
        return data.decode("utf-8"), "utf-8", False, False
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252"), "cp1252", True, False
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace"), "cp1252", True, True


def parse_bytes(data: bytes, kind: str) -> ParsedDocument:
    """Parse one file's bytes of a known ``kind`` (see :func:`kind_for`).

    Raises:
        Unsupported: ``too-large``, ``binary`` or ``unsupported-type``.
    """
    if kind not in ("text", "markdown", "rst"):
        raise Unsupported("unsupported-type")
    if len(data) > MAX_TEXT_BYTES:
        raise Unsupported("too-large")
    text, encoding, fallback, replaced = decode_text(data)
    return ParsedDocument(text=text, kind=kind, encoding=encoding, fallback=fallback,
                          replaced=replaced)
