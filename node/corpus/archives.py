"""Archives in a source root: ``.zip``, ``.tar.gz``/``.tgz`` read member by member (DESIGN §9,
seed ``file-processing`` § Archives).

Nothing is ever extracted to disk: the archive's bytes are read into memory (bounded by
:attr:`ArchiveLimits.max_archive_bytes`) and each member is inflated into memory, one at a
time, for the parser. An archive is first *scanned whole* (:func:`scan`); it is refused —
and nothing of it is indexed — when:

- a member path leads outside the archive (``..``), is absolute (``/x``), starts at a
  drive (``C:``) or is UNC (``//srv``, ``\\\\srv``), contains a backslash or a control
  character (``unsafe-path``); ``.`` and empty segments are dropped (``./a.txt`` is
  ``a.txt``);
- a member is a symlink or hard link (``link-member``), a device, FIFO or socket
  (``special-member``), or any other non-file, non-folder type (``special-member``);
- the same path is in it twice, or as both a file and a folder (``duplicate-member``);
- a member is encrypted (``encrypted``), or the bytes are not the archive the name says
  (``not-an-archive``);
- it holds more than ``max_entries`` files and folders (``too-many-entries``), unpacks to
  more than ``max_bytes`` (``too-large``), to more than ``max_ratio`` times its own size
  once at least ``ratio_floor_bytes`` are unpacked (``ratio-exceeded``: a decompression
  bomb), one member unpacks to more than ``max_member_bytes`` (``member-too-large``), or
  the archive file itself is over ``max_archive_bytes`` (``archive-too-large``).

Sizes are counted on the bytes actually inflated while reading — for a tar.gz on the
whole decompressed stream, headers included — never taken from the archive's headers.
"""

from __future__ import annotations

import hashlib
import io
import re
import stat
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

_READ = 64 * 1024
_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

#: Stable refusal reasons (see the module docstring).
REASONS = ("unsafe-path", "link-member", "special-member", "duplicate-member", "encrypted",
           "not-an-archive", "too-many-entries", "too-large", "ratio-exceeded",
           "member-too-large", "archive-too-large")

_ADVICE = {
    "unsafe-path": "a member path leaves the archive or is not a plain relative path",
    "link-member": "a member is a symlink or hard link",
    "special-member": "a member is a device, FIFO or other special file",
    "duplicate-member": "a path is in the archive twice, or as both a file and a folder",
    "encrypted": "a member is encrypted",
    "not-an-archive": "the bytes are not the archive the name says",
    "too-many-entries": "the archive holds too many files and folders",
    "too-large": "the archive unpacks to more bytes than allowed",
    "ratio-exceeded": "the archive unpacks to too many times its own size (a decompression bomb)",
    "member-too-large": "one member unpacks to more bytes than allowed",
    "archive-too-large": "the archive file is larger than allowed",
}


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on one archive (defaults from seed ``file-processing``).

    Attributes:
        max_entries: files and folders (5000).
        max_bytes: total unpacked bytes (200 MiB).
        max_ratio: unpacked bytes / archive bytes (100), applied once
            ``ratio_floor_bytes`` (1 MiB) are unpacked so small, very compressible text
            archives are not refused.
        max_member_bytes: one member unpacked (50 MiB; one member is held in memory).
        max_archive_bytes: the archive file itself (100 MiB; it is held in memory).
    """

    max_entries: int = 5000
    max_bytes: int = 200 * 1024 * 1024
    max_ratio: float = 100.0
    ratio_floor_bytes: int = 1024 * 1024
    max_member_bytes: int = 50 * 1024 * 1024
    max_archive_bytes: int = 100 * 1024 * 1024


DEFAULT_LIMITS = ArchiveLimits()


class ArchiveRefused(Exception):
    """The archive breaks a rule; ``reason`` is one of :data:`REASONS`.

    ``detail`` is a path-free sentence (member names are attacker-chosen and never
    repeated).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = _ADVICE.get(reason, reason)


@dataclass(frozen=True)
class MemberInfo:
    """A file member that passed the scan: normalized ``path``, ``size`` (bytes actually
    inflated) and ``sha256`` (hex of its bytes)."""

    path: str
    size: int
    sha256: str


def archive_kind(name: str) -> str | None:
    """``zip`` for ``.zip``, ``tar.gz`` for ``.tar.gz``/``.tgz``, else ``None``."""
    low = name.lower()
    if low.endswith(".zip"):
        return "zip"
    if low.endswith((".tar.gz", ".tgz")):
        return "tar.gz"
    return None


def safe_member_path(name: str) -> str:
    """Return the normalized member path (NFC, ``/``-separated, no trailing ``/``; ``""``
    for the archive's own root folder).

    Raises:
        ArchiveRefused: ``unsafe-path``.
    """
    if (not isinstance(name, str) or len(name) > 4096 or "\\" in name or _CONTROL.search(name)
            or name.startswith("/") or _DRIVE.match(name)):
        raise ArchiveRefused("unsafe-path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveRefused("unsafe-path")
    return unicodedata.normalize("NFC", "/".join(parts))


class _Counter:
    """Running totals of inflated bytes; raises as soon as a bound is crossed."""

    def __init__(self, archive_size: int, limits: ArchiveLimits) -> None:
        self.total = 0
        self.entries = 0
        self.archive_size = max(1, archive_size)
        self.limits = limits

    def entry(self) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise ArchiveRefused("too-many-entries")

    def add(self, n: int) -> None:
        self.total += n
        lim = self.limits
        if self.total > lim.max_bytes:
            raise ArchiveRefused("too-large")
        if (self.total >= lim.ratio_floor_bytes
                and self.total > lim.max_ratio * self.archive_size):
            raise ArchiveRefused("ratio-exceeded")


class _CountingReader(io.RawIOBase):
    """A readable stream that reports every byte it hands out to a :class:`_Counter`."""

    def __init__(self, inner: io.BufferedIOBase, counter: _Counter) -> None:
        self.inner = inner
        self.counter = counter

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size if size is not None and size >= 0 else _READ)
        self.counter.add(len(data))
        return data

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


class _Tracker:
    """Duplicate and file-vs-folder detection over normalized paths."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = set()
        self.explicit_dirs: set[str] = set()

    def add(self, path: str, is_dir: bool) -> None:
        if not path:
            return
        if is_dir:
            if path in self.explicit_dirs or path in self.files:
                raise ArchiveRefused("duplicate-member")
            self.explicit_dirs.add(path)
            self.dirs.add(path)
        else:
            if path in self.files or path in self.dirs:
                raise ArchiveRefused("duplicate-member")
            self.files.add(path)
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in self.files:
                raise ArchiveRefused("duplicate-member")
            self.dirs.add(parent)


def _read_member(fh: io.BufferedIOBase, counter: _Counter | None, limits: ArchiveLimits,
                 keep: bool) -> tuple[int, str, bytes | None]:
    h = hashlib.sha256()
    size = 0
    kept: list[bytes] = []
    while True:
        block = fh.read(_READ)
        if not block:
            break
        size += len(block)
        if size > limits.max_member_bytes:
            raise ArchiveRefused("member-too-large")
        if counter is not None:
            counter.add(len(block))
        h.update(block)
        if keep:
            kept.append(block)
    return size, h.hexdigest(), b"".join(kept) if keep else None


def _zip_walk(data: bytes, limits: ArchiveLimits, want: set[str] | None
              ) -> Iterator[tuple[MemberInfo, bytes | None]]:
    import zipfile
    import zlib

    counter = _Counter(len(data), limits)
    tracker = _Tracker()
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise ArchiveRefused("not-an-archive") from exc
    if len(infos) > limits.max_entries:
        raise ArchiveRefused("too-many-entries")
    with zf:
        for info in infos:
            counter.entry()
            path = safe_member_path(info.orig_filename)
            if info.flag_bits & 0x1:
                raise ArchiveRefused("encrypted")
            mode = info.external_attr >> 16
            is_dir = info.orig_filename.endswith("/")
            if stat.S_IFMT(mode) and info.create_system == 3:  # no type bits: a plain file
                if stat.S_ISLNK(mode):
                    raise ArchiveRefused("link-member")
                if stat.S_ISDIR(mode):
                    is_dir = True
                elif not stat.S_ISREG(mode):
                    raise ArchiveRefused("special-member")
            tracker.add(path, is_dir)
            if is_dir:
                continue
            keep = want is not None and path in want
            try:
                with zf.open(info) as fh:
                    size, digest, body = _read_member(fh, counter, limits, keep)
            except ArchiveRefused:
                raise
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError,
                    NotImplementedError, RuntimeError) as exc:
                raise ArchiveRefused("not-an-archive") from exc
            yield MemberInfo(path, size, digest), body


def _tar_walk(data: bytes, limits: ArchiveLimits, want: set[str] | None
              ) -> Iterator[tuple[MemberInfo, bytes | None]]:
    import gzip
    import tarfile
    import zlib

    counter = _Counter(len(data), limits)
    tracker = _Tracker()
    stream = _CountingReader(gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"), counter)
    try:
        tar = tarfile.open(fileobj=io.BufferedReader(stream, _READ), mode="r|")
        with tar:
            for member in tar:
                counter.entry()
                path = safe_member_path(member.name)
                if member.issym() or member.islnk():
                    raise ArchiveRefused("link-member")
                if member.isdir():
                    tracker.add(path, True)
                    continue
                if not member.isreg():
                    raise ArchiveRefused("special-member")
                tracker.add(path, False)
                fh = tar.extractfile(member)
                if fh is None:  # pragma: no cover - isreg() members always have data
                    raise ArchiveRefused("special-member")
                keep = want is not None and path in want
                # the stream counter already counts these bytes (and the headers)
                size, digest, body = _read_member(fh, None, limits, keep)
                yield MemberInfo(path, size, digest), body
    except ArchiveRefused:
        raise
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError, OSError, ValueError,
            UnicodeError) as exc:
        raise ArchiveRefused("not-an-archive") from exc


def _walk(data: bytes, kind: str, limits: ArchiveLimits, want: set[str] | None
          ) -> Iterator[tuple[MemberInfo, bytes | None]]:
    if len(data) > limits.max_archive_bytes:
        raise ArchiveRefused("archive-too-large")
    if kind == "zip":
        return _zip_walk(data, limits, want)
    if kind == "tar.gz":
        return _tar_walk(data, limits, want)
    raise ArchiveRefused("not-an-archive")


def scan(data: bytes, kind: str, limits: ArchiveLimits = DEFAULT_LIMITS) -> list[MemberInfo]:
    """Read the whole archive under the rules; return its file members (folders left out).

    Args:
        data: the archive's bytes.
        kind: ``zip`` or ``tar.gz`` (see :func:`archive_kind`).
        limits: the bounds.

    Raises:
        ArchiveRefused: on the first broken rule (nothing is returned then).
    """
    return [info for info, _ in _walk(data, kind, limits, None)]


def read_members(data: bytes, kind: str, paths: set[str],
                 limits: ArchiveLimits = DEFAULT_LIMITS) -> Iterator[tuple[MemberInfo, bytes]]:
    """Yield ``(info, bytes)`` for the members in ``paths``, one at a time, re-checking
    every rule on the way (call :func:`scan` first: an archive is all or nothing).

    Raises:
        ArchiveRefused: as :func:`scan`.
    """
    for info, body in _walk(data, kind, limits, paths):
        if body is not None:
            yield info, body


def check_zip_bytes(data: bytes, limits: ArchiveLimits = DEFAULT_LIMITS) -> None:
    """Check a zip-based document (DOCX) against the archive rules before a library
    inflates it whole.

    Raises:
        ArchiveRefused: as :func:`scan`.
    """
    scan(data, "zip", limits)
