"""What a failed SQLite call on a file of the home means, as a typed refusal: one table
for every database Kith keeps in a home (the corpus record, the outbox, ...).

SQLite reports the cause in ``sqlite_errorname`` (Python 3.11+):

- ``SQLITE_FULL`` — the disk, the user's quota or the process's file-size limit is full
  (SQLite's "database or disk is full"; a write that fails with ENOSPC, EDQUOT or EFBIG
  partway) → ``disk-full``: never "corrupt", the file is intact; so is an ``SQLITE_IOERR``
  when the disk has less than 1 MiB free or the file reached ``RLIMIT_FSIZE`` (a write
  that failed at once: SQLite then reports an I/O error, not a full disk);
- a folder in the place of the file (SQLite says only "disk I/O error" or "unable to open")
  → ``io-error`` whose hint is the ``mv`` that moves the folder aside (:func:`os_fault`);
- ``SQLITE_IOERR*``, ``SQLITE_READONLY*``, ``SQLITE_CANTOPEN*``, ``SQLITE_PERM``,
  ``SQLITE_AUTH`` — the file cannot be read or written (no permission, a failing disk, a
  write past a file-size limit) → ``io-error``;
- ``SQLITE_CORRUPT*``, ``SQLITE_NOTADB`` — the bytes are not a (whole) database → the
  caller's own "corrupt" refusal, which names its repair;
- anything else (``SQLITE_BUSY``, ``SQLITE_LOCKED``, a programming error) → None: not a
  fault of the file, the caller decides.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Callable

from node.common.errors import ConfigError, KithError

#: errnos of a full disk, quota or file-size limit
DISK_FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG)
                             if e is not None)


def disk_full(where: str) -> ConfigError:
    """``disk-full`` for a write to ``where`` (a path of the home, or what was written)."""
    return ConfigError("disk-full", f"writing {where} failed: the disk (or your quota, or this process's "
                       "file-size limit) is full")


def io_error(where: str, why: str) -> ConfigError:
    """``io-error`` for ``where`` that cannot be read or written (``why``: the cause)."""
    return ConfigError("io-error", f"{why} ({where})",
                       hint="check that the Kith home and the files named are readable and writable by you, "
                            "and that the disk works")


#: free bytes below which a failed write counts as a full disk
LOW_SPACE_BYTES = 1 << 20


def _looks_full(path: Path) -> bool:
    """Whether a write error on the database ``path`` (SQLite says only
    ``SQLITE_IOERR_WRITE`` when write(2) failed with EFBIG or ENOSPC at once) came from a
    full disk: the file system has less than :data:`LOW_SPACE_BYTES` free, or the file, its
    WAL or its journal reached this process's file-size limit (``RLIMIT_FSIZE``)."""
    try:
        st = os.statvfs(path.parent)
        if st.f_bavail * st.f_frsize < LOW_SPACE_BYTES:
            return True
    except OSError:
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return False
    if soft == resource.RLIM_INFINITY:
        return False
    for suffix in ("", "-wal", "-journal"):
        try:
            if os.path.getsize(f"{path}{suffix}") + 64 * 1024 >= soft:
                return True
        except OSError:
            continue
    return False


#: what a refusal names when the database that failed is not known
SOME_DATABASE = "a database in the Kith home"


def sqlite_fault(exc: BaseException, path: Path | None, corrupt: Callable[[], KithError]) -> KithError | None:
    """The refusal for ``exc`` raised by SQLite on the database ``path`` (module docstring),
    or None when it is not a fault of the file (busy, locked, a bug).

    Args:
        exc: the exception caught (an ``OSError`` of a full disk counts too).
        path: the database file (named in the message), or None when the caller does not
            know it (:func:`refusal_of`: named :data:`SOME_DATABASE`).
        corrupt: makes the caller's refusal for a file that is not a whole database.
    """
    where = SOME_DATABASE if path is None else str(path)
    if isinstance(exc, OSError):
        return os_fault(exc, where)
    if not isinstance(exc, sqlite3.DatabaseError):
        return None
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    if name == "SQLITE_FULL" or "database or disk is full" in text:
        return disk_full(where)
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "file is not a database" in text \
            or "malformed" in text:
        return corrupt()
    if path is not None and os.path.isdir(path):  # SQLite says only "disk I/O error" / "unable to open"
        return os_fault(IsADirectoryError(errno.EISDIR, "Is a directory"), where)
    if name.startswith("SQLITE_IOERR") and path is not None and _looks_full(path):
        return disk_full(where)
    if name.startswith(("SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")) \
            or "readonly database" in text:
        base = "_".join(name.split("_")[:2])  # SQLITE_READONLY_DBMOVED -> SQLITE_READONLY
        if "readonly database" in text:
            base = "SQLITE_READONLY"
        why = {"SQLITE_READONLY": "the database is read-only", "SQLITE_CANTOPEN": "the database cannot be opened",
               "SQLITE_PERM": "permission denied"}.get(base, f"the database cannot be read or written: {text[:80]}")
        return io_error(where, why)
    return None


def state_fault(exc: BaseException, path: Path, holds: str) -> KithError | None:
    """:func:`sqlite_fault` for a small state database of the home (the quota buckets, the
    seen nonces): damage is ``config-invalid``, whose hint is to move the file aside —
    ``holds`` says what is lost then (it is derived state, rebuilt empty)."""
    return sqlite_fault(exc, path, lambda: ConfigError(
        "config-invalid", f"{path.name} is not a readable database (damaged or not SQLite)",
        hint=f"move it aside (mv {path} {path}.bad): {holds}"))


def state_refusal(exc: BaseException, path: Path, holds: str) -> BaseException:
    """:func:`state_fault` of ``exc`` on the state database ``path``, or ``exc`` itself when
    it is no fault of the file (what the caller raises either way)."""
    refusal = state_fault(exc, path, holds)
    return exc if refusal is None else refusal


def probe_state_db(path: Path, holds: str) -> None:
    """Read the small state database ``path`` writing nothing
    (:func:`node.common.home.probe_home_db`), so a damaged one is refused at start.

    Raises:
        KithError: ``config-invalid`` (damaged: the hint names what ``holds`` loses),
            ``disk-full``, ``io-error``; any other error of the read as it is.
    """
    from node.common.home import probe_home_db

    try:
        probe_home_db(path)
    except (sqlite3.DatabaseError, OSError) as exc:
        raise state_refusal(exc, path, holds) from None

def os_fault(exc: OSError, where: str | None = None) -> ConfigError:
    """The refusal for a local I/O failure on ``where`` (default: the file the error names,
    else "the Kith home"): ``disk-full`` for a full disk, quota or file-size limit (never
    "corrupt"); ``io-error`` naming a folder in the place of a file, with the ``mv`` that
    moves it aside; else ``io-error`` with the system's reason (permission denied, a
    read-only file system, ...)."""
    named = str(exc.filename) if getattr(exc, "filename", None) else None
    where = where or named or "the Kith home"
    if exc.errno in DISK_FULL_ERRNOS:
        return disk_full(where)
    if exc.errno == errno.EISDIR and (where != "the Kith home"):
        return ConfigError("io-error", f"a folder is where Kith keeps a file ({where})",
                           hint=f"move the folder aside (`mv {where} {where}.bad`) and run the command again")
    refusal = io_error(where, exc.strerror or type(exc).__name__)
    return ConfigError(refusal.code, refusal.message, hint=folder_blocked_hint(exc) or refusal.hint)


def folder_blocked_hint(exc: OSError) -> str | None:
    """The way out when a file stands where Kith keeps a folder (``ENOTDIR`` / ``EEXIST``
    on a path under it): ``mv`` of that file aside, found by walking up from the path the
    error names; None for any other error, or when no such file is found."""
    if exc.errno not in (errno.ENOTDIR, errno.EEXIST) or not getattr(exc, "filename", None):
        return None
    from pathlib import Path

    path = Path(str(exc.filename))
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            return f"a file is where Kith keeps a folder: move it aside (`mv {p} {p}.bad`) and run the command again"
        if p.is_dir():
            return None
    return None


def refusal_of(exc: BaseException) -> KithError | None:
    """The one mapping of what a command or a background piece ended with to the refusal
    the user is told: a :class:`KithError` itself (the first one inside an exception group,
    as anyio task groups wrap it), a local I/O failure (:func:`os_fault`), or an SQLite
    error raised where no caller named its file (:func:`sqlite_fault` for "a database in
    the Kith home"); None for anything else (a bug: re-raised or logged with its
    traceback). ``kith`` (node/cli/main.py), the connections of ``kith host`` and the
    home's runner all report through it.

    Returns:
        The :class:`KithError` to report, or None.
    """
    if isinstance(exc, KithError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = refusal_of(inner)
            if found is not None:
                return found
        return None
    if isinstance(exc, OSError):
        return os_fault(exc)
    if isinstance(exc, sqlite3.DatabaseError):
        return sqlite_fault(exc, None, lambda: ConfigError(
            "config-invalid", f"{SOME_DATABASE} is damaged (not a whole SQLite file)",
            hint="run the command again with --debug to see which one, then move it aside or restore it"))
    return None


__all__ = ["DISK_FULL_ERRNOS", "SOME_DATABASE", "disk_full", "io_error", "os_fault", "refusal_of", "sqlite_fault",
           "state_fault"]
