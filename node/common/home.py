"""The node home: where identity, policy, peers, corpus and protocols live (DESIGN §13)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


#: The file ``kith init`` writes: a folder holding it is an initialised node home.
IDENTITY_FILE = "identity.key"
#: The folder ``kith community serve`` keeps its default SQLite database in: a folder
#: holding it is an initialised community-server home.
COMMUNITY_DIR = "community"
#: The node's settings file, ``<home>/config.toml``.
CONFIG_FILE = "config.toml"
#: The agents file in a home (node/local/agents.py, specs/agents.md); here so a command can
#: see it exists without importing the agents module.
AGENTS_FILE = "agents.json"
#: ``<home>/copies/``: the copies of peers' corpora a guest keeps (node/guest/copies/); never
#: a source root of this node's own corpus (node/corpus/store.py, specs/copies.md §2).
COPIES_DIR = "copies"
#: Its tables and each table's keys (one place: a key or table not named here is a typo,
#: refused rather than silently ignored — specs/transport.md §1, §4).
CONFIG_TABLES: dict[str, tuple[str, ...]] = {
    "transport": ("relay", "relay_only", "lan", "discovery"),  # node/transport/modes.py
    "host": ("presence",),  # node/host/grants.py
}


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The node home's path, absolute and user-expanded; nothing is created or checked
    (see :func:`require_home` and :func:`create_home`).

    Order: ``explicit`` (the ``--home`` option), then ``$KITH_HOME``, then
    ``platformdirs.user_data_dir("kith")`` (platformdirs is imported only then: a command
    given its home never loads it, issue 44).
    """
    raw = explicit or os.environ.get("KITH_HOME")
    if not raw:
        import platformdirs

        raw = platformdirs.user_data_dir("kith")
    return Path(raw).expanduser().resolve()


def _blocking_file(home: Path) -> Path | None:
    """The path itself or the nearest existing folder above it when that is not a folder
    (``FILE`` for ``FILE/sub``: nothing can ever be created there), else None."""
    for path in (home, *home.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def _not_a_folder(home: Path, file: Path) -> Any:
    from node.common.errors import ConfigError

    where = "is a file" if file == home else f"is under {file}, which is a file"
    return ConfigError("home-not-a-folder", f"The Kith home {home} {where}, not a folder.",
                       hint="give --home (or $KITH_HOME) the path of a folder")


def create_home(home: Path) -> Path:
    """Create the home folder (mode 0700, parents as needed) if missing — only
    ``kith init`` and ``kith community serve`` do this (issue 20).

    Raises:
        ConfigError: ``home-not-a-folder`` when ``home``, or the nearest existing path
            above it, is not a folder (``FILE/sub``).
    """
    file = _blocking_file(home)
    if file is not None:
        raise _not_a_folder(home, file)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def home_initialized(home: Path, *, server: bool = False) -> bool:
    """Whether ``home`` is a folder ``kith init`` initialised (it holds
    :data:`IDENTITY_FILE`) — or, with ``server``, one ``kith community serve`` made (it
    holds :data:`COMMUNITY_DIR`) or ``init`` did."""
    if (home / IDENTITY_FILE).is_file():
        return True
    return server and (home / COMMUNITY_DIR).is_dir()


def require_home(home: Path, *, server: bool = False) -> Path:
    """Check that ``home`` is an initialised home (:func:`home_initialized`); nothing is
    created either way, so a typo in ``--home`` is refused instead of becoming a new,
    empty home (issue 20).

    Raises:
        ConfigError: ``home-not-a-folder`` when ``home`` is a file (or anything but a
            folder), or lies under one (``FILE/sub``, named in the message);
            ``home-not-initialized`` naming ``home`` otherwise, with the
            ``kith --home DIR init`` hint (``community serve`` for a server home).
    """
    from node.common.errors import ConfigError

    file = _blocking_file(home)
    if file is not None:
        raise _not_a_folder(home, file)
    if home_initialized(home, server=server):
        return home
    what = "is not a Kith home yet" if not home.exists() else "has no identity yet"
    raise ConfigError("home-not-initialized", f"The Kith home {home} {what}.",
                      hint=init_hint(home, server=server))


def init_hint(home: Path, *, server: bool = False) -> str:
    """The advice for a path that is not an initialised home: create one there (``kith
    init``; ``kith community serve`` for a server home), or fix the path."""
    made_by = f"kith --home {home} community serve" if server else f"kith --home {home} init"
    return f"run `{made_by}` to create one there, or check --home / $KITH_HOME for a typo"


class NotRegularFile(OSError):
    """A FIFO, socket or device where a home file should be (``errno`` EINVAL, ``strerror``
    "not a regular file"): raised by :func:`open_regular`, :func:`open_append` and
    :func:`probe_home_db` instead of blocking in ``open()``; an :class:`OSError`, so a
    caller that says unreadable files as ``io-error`` says it so too."""

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> "NotRegularFile":
        """The error for ``path`` (its ``filename``)."""
        import errno

        return cls(errno.EINVAL, "not a regular file", os.fspath(path))


def open_regular(path: str | os.PathLike[str]) -> int:
    """Open the home file ``path`` to read, without blocking: a FIFO, socket or device in
    its place (a damaged or tampered home) is refused at once instead of hanging the
    command in ``open()`` until a writer comes, which never does.

    Args:
        path: the file (a symlink to a regular file is followed).

    Returns:
        A read-only file descriptor (close-on-exec) of a regular file; the caller closes it.

    Raises:
        FileNotFoundError: there is no file.
        IsADirectoryError: a folder is in its place (as ``Path.read_bytes`` says it).
        NotRegularFile: a FIFO, socket or device in its place.
        OSError: any other failure to open it (permission denied, a symlink loop).
    """
    import errno
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if not stat.S_ISREG(mode):
            raise NotRegularFile.at(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """Open the home log ``path`` to append (created ``mode`` when missing), without
    blocking: a FIFO in its place would block ``open()`` until a reader came.

    Returns:
        A write-only, append, close-on-exec file descriptor of a regular file.

    Raises:
        NotRegularFile: a FIFO, socket or device in its place.
        OSError: ``EISDIR``, or any other failure to open it.
    """
    import errno
    import stat

    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0), mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO no one reads: said as what it is
            raise NotRegularFile.at(path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFile.at(path)
    return fd


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the home file ``path``, read as :func:`open_regular` opens it (never
    blocks on a FIFO): the one way a home file is read whole.

    Args:
        path: the file.
        limit: read at most this many bytes (callers pass their bound + 1 to tell a file
            over it); None reads it all.

    Returns:
        The file's bytes.

    Raises:
        FileNotFoundError, IsADirectoryError, OSError: as :func:`open_regular`, or a read
            that fails.
    """
    with os.fdopen(open_regular(path), "rb") as fh:
        return fh.read() if limit is None else fh.read(limit)


def read_json_state(path: Path, *, hint: str | None = None, data: bytes | str | None = None) -> Any:
    """The JSON value of the state file ``path`` (one :func:`atomic_write` wrote): the one
    reader of a home's JSON files, so every way one can be damaged (not UTF-8, not JSON,
    nested deeper than Python's json reads — ``[[[[…``, a RecursionError) is the same typed
    refusal, never a traceback (issue 42).

    Args:
        path: the file; its name is the one the refusal says.
        hint: the way out the refusal gives.
        data: the file's bytes or text when the caller read them itself (a size bound, an
            owner check, or an unreadable file said as ``io-error``, not invalid): only
            decoded here.

    Raises:
        FileNotFoundError: when there is no file (callers start empty).
        ConfigError: ``config-invalid`` "<name> is not valid JSON" (with ``hint``) when it
            cannot be read, is not UTF-8, not JSON, or nested too deep to parse.
    """
    import json

    from node.common.errors import ConfigError

    try:
        if data is None:
            data = read_regular(path)
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        raise ConfigError("config-invalid", f"{Path(path).name} is not valid JSON", hint=hint) from None


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same folder, fsync, rename.

    The file gets ``mode`` (default 0600) before it becomes visible, so a crash leaves
    either the old file or the new one, never a half-written or world-readable one.
    """
    with atomic_writer(path, mode) as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_writer(path: Path, mode: int = 0o600) -> Iterator[BinaryIO]:
    """:func:`atomic_write` for a file written in parts: yields the temp file (binary,
    open for writing) and, when the ``with`` block ends without an exception, fsyncs it
    and renames it to ``path``; an exception removes the temp file and leaves ``path`` as
    it was (the old file or none).

    Raises:
        OSError: the folder cannot be written, or ``path`` cannot be replaced (the error
            names ``path``, never the temp file beside it).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.replace(tmp, path)
        except OSError as exc:  # name the file (a folder in its place), never the temp beside it
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
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

    A lock taken on a file its holder removed meanwhile (:func:`remove_owner_lock`) is
    dropped and the lock taken again on the file now at ``path``, so two processes never
    both hold "the" lock.
    """
    import json
    import time

    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return -1
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        held = os.fstat(fd)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # its holder removed that file before we locked it: lock the one there now
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


def remove_owner_lock(path: Path, fd: int | None) -> None:
    """Remove the lock file ``path`` while still holding it, then release ``fd``: for a
    command refused before it started, that created the file (a refused ``kith host``
    start leaves the home's file list as it was). A process that opened the file before
    it went takes the lock again on a new one (:func:`acquire_owner_lock`)."""
    if fd is None or fd < 0:
        return
    try:
        os.unlink(path)
    except OSError:
        pass
    release_owner_lock(fd)


def _lock_info(path: Path) -> dict[str, Any] | None:
    """The owner text :func:`acquire_owner_lock` wrote into ``path`` (``{}`` once released),
    or None when it cannot be read or parsed."""
    from node.common.errors import ConfigError

    try:
        info = read_json_state(path, data=read_regular(path) or b"{}")
    except (OSError, ConfigError):
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


def _sqlite_may_open(path: Path) -> None:
    """Refuse, before SQLite opens ``path``, what its open would block on: a FIFO, socket
    or device (:class:`NotRegularFile`). A file or a folder passes (SQLite says what is
    wrong with a folder). Raises OSError when ``path`` cannot be stat'ed (a symlink loop)."""
    import stat

    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise NotRegularFile.at(path)


def probe_home_db(path: Path) -> None:
    """Read a state file :func:`open_home_db` opens, writing nothing: no file is created,
    no WAL, journal or shared-memory file is made, nothing is purged. ``kith host`` refuses
    a damaged state file at start this way, and opens it for writing only when it first
    needs it, so a refused start leaves the home as it was (issue 42).

    A missing file passes (it is made empty when first needed). The read is SQLite's
    ``immutable`` mode, so what only a crashed process's WAL holds is not looked at.

    Raises:
        sqlite3.DatabaseError, OSError: as opening the file would (not a database, no
            permission, a folder in its place; :class:`NotRegularFile` for a FIFO, socket
            or device, which SQLite's open would block on); callers map them with
            :func:`node.common.dbfaults.state_fault`.
    """
    import sqlite3

    if not os.path.lexists(path):
        return
    _sqlite_may_open(path)
    db = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    finally:
        db.close()


def may_write(path: Path) -> bool:
    """Whether this process may write the state file ``path`` of the home — or make it,
    when there is none yet — and make the files beside it (SQLite's ``-wal``, ``-shm``,
    ``-journal``; :func:`atomic_write`'s temporary file): the file, when there is one, and
    its folder are writable for it (``os.access``: the user's permissions and
    capabilities, a read-only mount). False for a home the user may read but not write."""
    path = Path(path)
    return (os.access(path, os.W_OK) or not os.path.lexists(path)) and os.access(path.parent, os.W_OK)


def open_home_db_readonly(path: Path) -> Any:
    """Open a state file :func:`open_home_db` made, to read only, writing nothing: for a
    home this process may read but not write (:func:`may_write`). Reading a WAL database
    needs its ``-shm`` file, which SQLite makes beside it; in a folder it may not write,
    with no ``-shm`` (no process has the file open) and no ``-wal`` holding transactions,
    the file is read as it is on disk (SQLite's ``immutable`` mode) — never when a
    ``-wal`` holds some: then what SQLite said is raised.

    Returns:
        A read-only :class:`sqlite3.Connection` (autocommit, usable from any thread).

    Raises:
        sqlite3.DatabaseError, OSError: as opening the file would (not a database, no
            permission; :class:`NotRegularFile` for a FIFO, socket or device, which SQLite's
            open would block on); callers map them with
            :func:`node.common.dbfaults.sqlite_fault`.
    """
    return open_home_db_readonly_uri(path)[0]


def open_home_db_readonly_uri(path: Path) -> tuple[Any, str]:
    """:func:`open_home_db_readonly`, with the URI it opened the file by: more read-only
    connections to the file (other threads) open the same way.

    Returns:
        (the connection, its ``file:`` URI: ``?mode=ro``, or ``?mode=ro&immutable=1``).

    Raises:
        sqlite3.DatabaseError, OSError: as :func:`open_home_db_readonly`.
    """
    import sqlite3

    _sqlite_may_open(path)
    uri = f"{Path(path).absolute().as_uri()}?mode=ro"
    db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db, uri
    except sqlite3.OperationalError as exc:
        db.close()
        wal = f"{path}-wal"
        if not (getattr(exc, "sqlite_errorname", "") or "").startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")) \
                or os.path.lexists(f"{path}-shm") or (os.path.lexists(wal) and os.stat(wal).st_size > 0):
            raise
    uri += "&immutable=1"
    db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # not a database: raised here
    except BaseException:
        db.close()
        raise
    return db, uri


#: the way out of a bad ``config.toml``: it only holds defaults a command line can give
_CONFIG_HINT = ("fix <home>/config.toml (UTF-8 TOML: [transport], [host]; specs/transport.md §1), or move it "
                "aside: every setting then has its default")


def config_table(home: Path | None, table: str, code: str) -> dict[str, Any]:
    """The ``[table]`` of ``<home>/config.toml`` (``{}`` without the file or the table).

    Args:
        home: the node home (None: no file). table: a key of :data:`CONFIG_TABLES`.
        code: the stable code of the refusal (the reader's own: ``transport-mode-invalid``,
            ``presence-invalid``).

    Raises:
        UsageError: ``code`` (exit 2) when the file is not valid TOML, has a table or a key
            in ``table`` that :data:`CONFIG_TABLES` does not name (a typo such as
            ``presense`` must not leave a privacy setting at its default), or ``table`` is
            not a table.
    """
    from node.common.errors import UsageError

    if home is None:
        return {}
    try:
        text = read_regular(Path(home) / CONFIG_FILE).decode("utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(code, f"{CONFIG_FILE} cannot be read ({type(exc).__name__})", hint=_CONFIG_HINT) from None
    import tomllib  # only for a home that has the file

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(code, f"{CONFIG_FILE} cannot be read ({type(exc).__name__})", hint=_CONFIG_HINT) from None
    unknown = sorted(set(data) - set(CONFIG_TABLES))
    if unknown:
        raise UsageError(code, f"{CONFIG_FILE}: unknown table [{unknown[0][:40]}] (known: "
                         + ", ".join(f"[{t}]" for t in CONFIG_TABLES) + ")", hint=_CONFIG_HINT)
    found = data.get(table, {})
    if not isinstance(found, dict):
        raise UsageError(code, f"{CONFIG_FILE}: [{table}] must be a table", hint=_CONFIG_HINT)
    unknown = sorted(set(found) - set(CONFIG_TABLES[table]))
    if unknown:
        raise UsageError(code, f"{CONFIG_FILE}: unknown [{table}] key {unknown[0][:40]!r} (known: "
                         + ", ".join(CONFIG_TABLES[table]) + ")", hint=_CONFIG_HINT)
    return found
