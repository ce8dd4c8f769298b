"""UI artifact rules (DESIGN §6, optional UI branch). No I/O: paths, manifests and bytes
in, verdicts out. The Host's bundle loader and the Guest's installer
(``node/runtime/ui_artifacts.py``) do the file work around these checks.

A bundle is a flat list of regular files with relative POSIX paths; ``index.html`` must be
among them. The Guest refuses, with a stable code (``_ui_artifact_error``):

- ``ui-path-invalid``: empty, absolute (``/x``), drive (``C:x``), UNC or backslash paths,
  ``.``/``..``/empty segments, control characters, over :data:`MAX_PATH_CHARS`, or two
  paths equal ignoring case;
- ``ui-link-refused``: an entry whose ``type`` is not ``file`` (links, devices, dirs);
- ``ui-too-large``: more than :data:`MAX_FILES` files, a file over
  :data:`MAX_FILE_BYTES`, or a total over :data:`MAX_TOTAL_BYTES`;
- ``ui-manifest-mismatch``: ``total_bytes`` ≠ the sum of sizes, a malformed SHA-256, file
  data out of manifest order, at the wrong offset, beyond the declared size, or missing at
  ``_ui_artifact_end``;
- ``ui-hash-mismatch``: a file whose bytes do not hash to its manifest SHA-256;
- ``ui-no-index``: no ``index.html`` at the bundle's top level.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field

from node.common.errors import HandshakeError

MAX_FILES = 256
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_TOTAL_BYTES = 16 * 1024 * 1024
MAX_PATH_CHARS = 200
#: Raw bytes per ``_ui_artifact_file`` frame (base64 makes the line ≈ 4/3 of this).
CHUNK_BYTES = 512 * 1024
#: The Guest's line limit while it receives a bundle it asked for (covers one chunk).
UI_LINE_BYTES = 1024 * 1024
CAPABILITY = "p2p_ui_v1"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SEGMENT_BAD = re.compile(r"[\x00-\x1f\x7f\\:*?\"<>|]")


def check_path(path: object) -> str:
    """Check one bundle path (see the module docstring) and return it.

    Raises:
        HandshakeError: ``ui-path-invalid``.
    """
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
        raise HandshakeError("ui-path-invalid", "a UI path is empty or too long")
    if path.startswith("/") or "\\" in path or re.match(r"^[A-Za-z]:", path):
        raise HandshakeError("ui-path-invalid", "a UI path is absolute or names a drive")
    for seg in path.split("/"):
        if seg in ("", ".", "..") or _SEGMENT_BAD.search(seg) or seg != seg.strip():
            raise HandshakeError("ui-path-invalid", "a UI path has an empty, '.', '..' or unsafe segment")
        if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in seg):
            raise HandshakeError("ui-path-invalid", "a UI path has control or format characters")
    return path


@dataclass(frozen=True)
class FileEntry:
    """One manifest line: ``path`` (relative POSIX), ``size`` (bytes), ``sha256`` (hex)."""

    path: str
    size: int
    sha256: str


def check_manifest(files: list[FileEntry], total_bytes: int, types: list[str] | None = None) -> None:
    """Check a whole manifest before any file data is accepted.

    Args:
        files: the entries in transfer order.
        total_bytes: the declared total (bytes).
        types: each entry's ``type`` (``file`` only is accepted); None = all files.

    Raises:
        HandshakeError: ``ui-path-invalid``, ``ui-link-refused``, ``ui-too-large``,
            ``ui-manifest-mismatch`` or ``ui-no-index``.
    """
    if len(files) > MAX_FILES:
        raise HandshakeError("ui-too-large", f"a UI bundle may have at most {MAX_FILES} files")
    if types is not None and any(t != "file" for t in types):
        raise HandshakeError("ui-link-refused", "a UI bundle may only contain regular files")
    seen: set[str] = set()
    total = 0
    for f in files:
        check_path(f.path)
        folded = unicodedata.normalize("NFC", f.path).casefold()
        if folded in seen:
            raise HandshakeError("ui-path-invalid", "two UI paths differ only by case or normalisation")
        seen.add(folded)
        if not isinstance(f.size, int) or f.size < 0:
            raise HandshakeError("ui-manifest-mismatch", "a UI file size is negative")
        if f.size > MAX_FILE_BYTES:
            raise HandshakeError("ui-too-large", f"a UI file is larger than {MAX_FILE_BYTES} bytes")
        if not _SHA256.fullmatch(f.sha256):
            raise HandshakeError("ui-manifest-mismatch", "a UI file SHA-256 is not 64 lowercase hex")
        total += f.size
    if total > MAX_TOTAL_BYTES or total_bytes > MAX_TOTAL_BYTES:
        raise HandshakeError("ui-too-large", f"a UI bundle may be at most {MAX_TOTAL_BYTES} bytes")
    if total != total_bytes:
        raise HandshakeError("ui-manifest-mismatch", "total_bytes differs from the sum of the file sizes")
    if "index.html" not in {f.path for f in files}:
        raise HandshakeError("ui-no-index", "the UI bundle has no top-level index.html")


@dataclass
class BundleReceiver:
    """Assembles a bundle from ``_ui_artifact_file`` chunks, checking as it goes.

    Files must arrive in manifest order, each chunk at the offset where the previous one
    stopped; a file is hashed as soon as its last byte arrives.
    """

    files: list[FileEntry]
    total_bytes: int
    received: dict[str, bytes] = field(default_factory=dict)
    _index: int = 0
    _buf: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self._finish_empty_files()

    def _finish_empty_files(self) -> None:
        while self._index < len(self.files) and self.files[self._index].size == 0 and not self._buf:
            self._complete(self.files[self._index])

    def _complete(self, entry: FileEntry) -> None:
        data = bytes(self._buf)
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise HandshakeError("ui-hash-mismatch", "a UI file does not match its SHA-256")
        self.received[entry.path] = data
        self._buf.clear()
        self._index += 1

    def add(self, path: str, offset: int, data: bytes) -> None:
        """Accept one chunk.

        Raises:
            HandshakeError: ``ui-manifest-mismatch`` or ``ui-hash-mismatch``.
        """
        if self._index >= len(self.files):
            raise HandshakeError("ui-manifest-mismatch", "UI file data after the last manifest file")
        entry = self.files[self._index]
        if path != entry.path or offset != len(self._buf):
            raise HandshakeError("ui-manifest-mismatch", "UI file data out of manifest order or offset")
        if len(self._buf) + len(data) > entry.size:
            raise HandshakeError("ui-manifest-mismatch", "UI file data beyond the declared size")
        self._buf += data
        if len(self._buf) == entry.size:
            self._complete(entry)
            self._finish_empty_files()

    def finish(self) -> dict[str, bytes]:
        """At ``_ui_artifact_end``: every file must be complete.

        Returns:
            path → bytes, in manifest order.

        Raises:
            HandshakeError: ``ui-manifest-mismatch``.
        """
        if self._index != len(self.files):
            raise HandshakeError("ui-manifest-mismatch", "the UI transfer ended before every file arrived")
        return dict(self.received)


@dataclass(frozen=True)
class Bundle:
    """A Host's loaded UI bundle: manifest entries and their bytes (in memory)."""

    files: tuple[FileEntry, ...]
    data: dict[str, bytes]

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes (bytes)."""
        return sum(f.size for f in self.files)

    @classmethod
    def from_files(cls, files: dict[str, bytes]) -> "Bundle":
        """Build and check a bundle from ``path → bytes`` (sorted by path).

        Raises:
            HandshakeError: any manifest refusal (the Host refuses to share such a bundle).
        """
        entries = tuple(FileEntry(p, len(b), hashlib.sha256(b).hexdigest()) for p, b in sorted(files.items()))
        check_manifest(list(entries), sum(e.size for e in entries))
        return cls(entries, dict(files))
