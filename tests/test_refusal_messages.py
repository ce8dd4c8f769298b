"""The one mapping of a failure to what the user is told (node.common.dbfaults.refusal_of,
used by `kith` itself, `kith host`'s connections and the home's runner; issue 42): each
user-visible message — a folder in a file's place, a full disk, a full or read-only SQLite
database, no permission — from the real exception, bare or inside an exception group as
anyio task groups raise it."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from node.common.dbfaults import SOME_DATABASE, refusal_of
from node.common.home import atomic_write


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the real exception is what is mapped
        return exc
    raise AssertionError("nothing was raised")


def _told(exc: BaseException) -> tuple[str, str, str]:
    """``(code, message, hint)`` the user is told for ``exc``, bare and in a group alike."""
    bare = refusal_of(exc)
    grouped = refusal_of(ExceptionGroup("unhandled errors in a TaskGroup", [ValueError("another task"), exc]))
    assert bare is not None and grouped is not None
    assert (grouped.code, grouped.message, grouped.hint) == (bare.code, bare.message, bare.hint)
    return bare.code, bare.message, bare.hint or ""


def test_a_folder_where_a_file_is_written_names_the_file_and_the_mv_that_moves_it(tmp_path: Path) -> None:
    target = tmp_path / "card-seq"
    target.mkdir()
    exc = _raised(lambda: atomic_write(target, b"1"))
    assert isinstance(exc, OSError) and exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    code, message, hint = _told(exc)
    assert code == "io-error"
    if exc.errno == errno.EISDIR:
        assert message == f"a folder is where Kith keeps a file ({target})"
        assert hint == f"move the folder aside (`mv {target} {target}.bad`) and run the command again"


def test_a_full_disk_is_disk_full_never_corrupt(tmp_path: Path) -> None:
    """A real write past this process's file-size limit (EFBIG), in a child process; write(2)
    names no file, so neither does the message."""
    target = tmp_path / "outbox.sqlite"
    script = (f"import resource, signal, sys; sys.path[:0] = {sys.path!r}\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
              "from node.common.dbfaults import refusal_of\n"
              "import os\n"
              f"fd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT, 0o600)\n"
              "try:\n"
              "    for _ in range(8):\n"
              "        os.write(fd, b'x' * 1024)\n"
              "except OSError as exc:\n"
              "    r = refusal_of(exc); print(r.code); print(r.message)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    code, message = out.stdout.splitlines()
    assert code == "disk-full"
    assert message == "writing the Kith home failed: the disk (or your quota, or this process's file-size limit) is full"


def test_a_full_sqlite_database_is_disk_full(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "x.sqlite", isolation_level=None)
    db.execute("CREATE TABLE t (v BLOB)")
    db.execute("PRAGMA max_page_count = 3")  # SQLite's own "database or disk is full"
    exc = _raised(lambda: [db.execute("INSERT INTO t VALUES (?)", (os.urandom(2048),)) for _ in range(16)])
    db.close()
    code, message, _ = _told(exc)
    assert (code, message) == ("disk-full", f"writing {SOME_DATABASE} failed: the disk (or your quota, or this "
                                            "process's file-size limit) is full")


def test_a_read_only_sqlite_database_is_an_io_error(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (v)").connection.close()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    exc = _raised(lambda: db.execute("INSERT INTO t VALUES (1)"))
    db.close()
    code, message, hint = _told(exc)
    assert (code, message) == ("io-error", f"the database is read-only ({SOME_DATABASE})")
    assert "writable by you" in hint


def test_no_permission_is_an_io_error_with_the_systems_reason(tmp_path: Path) -> None:
    target = tmp_path / "peers.json"
    target.write_text("{}")
    os.chmod(target, 0)
    try:
        if os.geteuid() == 0:  # root reads anything: the error open(2) gives any other user
            exc: BaseException = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))
        else:
            exc = _raised(lambda: target.read_text())
    finally:
        os.chmod(target, 0o600)
    code, message, hint = _told(exc)
    assert (code, message) == ("io-error", f"Permission denied ({target})")
    assert hint == ("check that the Kith home and the files named are readable and writable by you, and that "
                    "the disk works")


def test_what_is_not_a_fault_of_the_home_is_left_to_the_caller() -> None:
    assert refusal_of(ValueError("a bug")) is None
    assert refusal_of(ExceptionGroup("g", [ValueError("a bug")])) is None
    assert refusal_of(sqlite3.OperationalError("database is locked")) is None
