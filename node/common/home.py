"""The node home: where identity, policy, peers, corpus and protocols live (DESIGN §13)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import platformdirs


def resolve_home(explicit: str | os.PathLike[str] | None = None, *, create: bool = True) -> Path:
    """Return the node home directory (created with mode 0700 if missing, unless
    ``create`` is False).

    Order: ``explicit`` (the ``--home`` option), then ``$KITH_HOME``, then
    ``platformdirs.user_data_dir("kith")``.
    """
    raw = explicit or os.environ.get("KITH_HOME") or platformdirs.user_data_dir("kith")
    home = Path(raw).expanduser().resolve()
    if create:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same folder, fsync, rename.

    The file gets ``mode`` (default 0600) before it becomes visible, so a crash leaves
    either the old file or the new one, never a half-written or world-readable one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def acquire_owner_lock(path: Path, command: str) -> int | None:
    """Take an exclusive, non-blocking ``flock`` on ``path`` (created 0600) and write the
    owner into it: ``{"pid", "command", "since"}`` (JSON), so a refused second process can
    say who holds it (:func:`lock_owner`). The lock lives as long as the returned file
    descriptor: close it (:func:`release_owner_lock`) or exit to release it — a crashed
    owner never leaves a stale lock.

    Args:
        path: the lock file (e.g. ``<home>/host.lock``).
        command: what the owner runs, shown to a refused process (e.g. ``"kith host"``).

    Returns:
        The descriptor holding the lock, or None when another process holds it. On a
        platform without ``fcntl`` no lock is taken and ``-1`` is returned.
    """
    import json
    import time

    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return -1
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    os.write(fd, json.dumps({"pid": os.getpid(), "command": command[:200], "since": since}).encode())
    return fd


def release_owner_lock(fd: int | None) -> None:
    """Release a lock taken by :func:`acquire_owner_lock` (its owner text is cleared)."""
    if fd is None or fd < 0:
        return
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass
    os.close(fd)  # closing releases the flock


def _lock_info(path: Path) -> dict[str, Any] | None:
    """The owner text :func:`acquire_owner_lock` wrote into ``path`` (``{}`` once released),
    or None when it cannot be read or parsed."""
    import json

    try:
        info = json.loads(path.read_text("utf-8") or "{}")
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def lock_owner(path: Path) -> str:
    """Who holds the lock at ``path``, for an error message: ``"pid N, COMMAND, since T"``
    (``"owner unknown"`` when the file cannot be read)."""
    info = _lock_info(path)
    try:
        return (f"pid {int(info.get('pid', 0))}, {str(info.get('command', '?'))[:60]}, "
                f"since {str(info.get('since', '?'))[:20]}")
    except (ValueError, TypeError, AttributeError):
        return "owner unknown"


def lock_active(path: Path) -> bool:
    """True when the owner recorded in the lock at ``path`` (:func:`acquire_owner_lock`) is
    a live process — without taking the lock, so a probe never refuses a starting owner.
    A released lock has no owner text; a killed owner's text names a dead pid (False).
    A pid reused by an unrelated process after a crash reads as active: callers only use
    this for hints, never to decide who may write."""
    try:
        pid = int((_lock_info(path) or {}).get("pid", 0))
    except (ValueError, TypeError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def open_home_db(path: Path) -> Any:
    """Open (or create) a small SQLite file of the home the way Kith keeps its state files:
    0600 from creation, autocommit (``isolation_level=None``), WAL journal, synchronous
    NORMAL, usable from any thread (callers serialise access themselves). Used by the
    seen-nonce table and the quota buckets.

    Returns:
        The :class:`sqlite3.Connection`.
    """
    import sqlite3

    fresh = not path.exists()
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    if fresh:
        os.chmod(path, 0o600)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db
