"""The corpus record: SQLite (authoritative) plus the tantivy BM25 index derived from it.

Layout under ``<home>/corpus/`` (DESIGN §9, §13):

- ``corpus.sqlite3`` (WAL): ``roots``, ``documents`` (the tracking rows), ``chunks``,
  ``changes`` (the change log) and ``meta`` (``index_applied_seq``: the last change the
  tantivy index holds; ``last_sync``; schema versions);
- ``tantivy/``: the BM25 index, rebuildable from SQLite at any time;
- ``writer.lock``: held (``flock``) by the one process writing; names its owner.

Disagreement between the two is safe by construction (seed ``provider-origins``):
SQLite is written first and is authoritative; a tantivy hit whose chunk is not in
SQLite (or whose document is not ``done``) is ignored; chunk ids change when content
changes, so a stale tantivy document can never be mistaken for a current chunk; and
when a writer starts it replays every change after ``index_applied_seq`` (or rebuilds
the index when its document count disagrees with SQLite or its schema is older).

This module is the bottom of the corpus: it imports no other corpus module but
:mod:`node.corpus.search` (the index schema) and :mod:`node.corpus.types`. Sync
(:mod:`node.corpus.ingest`), retrieval, views and the dense pass work on a
:class:`Record`; :class:`node.corpus.store.Corpus` is the façade the rest of Kith uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import tantivy

from node.corpus import search
from node.corpus.types import Root
from node.common.errors import ConfigError, CorpusError
from node.common.home import (acquire_owner_lock, lock_owner, may_write, open_home_db_readonly_uri, read_regular,
                              release_owner_lock)


def index_meta_readable(index_dir: Path) -> bool:
    """False when tantivy's ``meta.json`` in ``index_dir`` is there but is not a regular
    file (a FIFO, socket, device or symlink loop): tantivy would block for ever opening a
    FIFO, so its index is damaged before tantivy is asked. True otherwise (missing is for
    tantivy to say)."""
    import stat

    try:
        return stat.S_ISREG(os.stat(index_dir / "meta.json").st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False

#: tantivy's lock files: never linked into a :class:`ReadingFolder` (tantivy makes its own there).
_TANTIVY_LOCKS = frozenset({".tantivy-meta.lock", ".tantivy-writer.lock"})


def permission_denied(exc: BaseException) -> bool:
    """True when tantivy's error (its ``PermissionDenied``, raised as a ValueError) or an
    OSError is the OS refusing a permission."""
    return isinstance(exc, PermissionError) or "PermissionDenied" in str(exc)


class ReadingFolder:
    """A private temporary folder of symbolic links to the files of a tantivy index folder
    the user may read but not write (a read-only copy, a chmod, a read-only mount).

    tantivy creates and locks ``.tantivy-meta.lock`` in the folder it opens, even only to
    read; opened here instead, it makes that file in this folder (which the user owns) and
    reads every index file through its link. Used only when opening the index folder
    itself was refused a permission: the writable path never makes one.

    Args:
        index_dir: the index folder (``<home>/corpus/tantivy``).

    Raises:
        OSError: the index folder cannot be listed, or the temporary folder not made.
    """

    def __init__(self, index_dir: Path) -> None:
        self.index_dir = Path(index_dir)
        #: the temporary folder (``$TMPDIR/kith-index-*``), removed by :meth:`remove`,
        #: when the object is collected, or at exit
        self.path = Path(tempfile.mkdtemp(prefix="kith-index-"))
        self._remove = weakref.finalize(self, shutil.rmtree, str(self.path), True)
        try:
            self.refresh()
        except BaseException:
            self.remove()
            raise

    def refresh(self) -> None:
        """Link the index folder's files that appeared since (a commit by a writer that
        may write it) and drop the links of those gone. ``meta.json`` is linked by name,
        so a new one renamed into place is read through the same link.

        Raises:
            OSError: the index folder cannot be listed.
        """
        names = set(os.listdir(self.index_dir)) - _TANTIVY_LOCKS
        have = set(os.listdir(self.path)) - _TANTIVY_LOCKS
        for name in names - have:
            os.symlink(self.index_dir / name, self.path / name)
        for name in have - names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path / name)

    def remove(self) -> None:
        """Delete the temporary folder (idempotent)."""
        self._remove()


def open_index_for_reading(index_dir: Path) -> tuple[Any, ReadingFolder | None]:
    """Open the tantivy index in ``index_dir`` to search it: the folder itself, or — when
    the OS refused that a permission (tantivy's lock file, written even to read, in a
    folder this user may read but not write) — through a :class:`ReadingFolder`.

    Returns:
        (the tantivy ``Index``, the reading folder it was opened through or None). The
        caller removes the reading folder once it drops the index.

    Raises:
        ValueError: tantivy's refusal (a damaged or missing index); a permission the
            reading folder does not get round (an unreadable file) is still tantivy's
            ``PermissionDenied``.
    """
    try:
        return tantivy.Index.open(str(index_dir)), None
    except ValueError as exc:
        if not permission_denied(exc):
            raise
        first = exc
    try:
        folder = ReadingFolder(index_dir)
    except OSError:
        raise first from None
    try:
        return tantivy.Index.open(str(folder.path)), folder
    except BaseException:
        folder.remove()
        raise


SCHEMA_VERSION = 2
#: Chunks between two progress reports of a rebuild (:meth:`Record.acquire_writer`).
REBUILD_STEP = 10_000
_WRITER_HEAP = 128_000_000
#: Indexing threads of the corpus writer: 0 = tantivy's default (one per core). One
#: thread was measured (issue 10 item 6, load average 6-9): Kith's schema alone on the
#: python-docs chunks took 1.62 s CPU / 2.45 s wall with one thread against 2.19 s /
#: 3.28 s with the default, but whole syncs interleaved were 6.3-7.1 s against 5.0-8.2 s
#: (2 of 3 pairs for one thread) — not shown better, and on a quiet machine one thread
#: would leave tantivy's share of a sync on a single core; the default is kept.
_WRITER_THREADS = 0

_DDL = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS roots(
    prefix TEXT PRIMARY KEY, path TEXT NOT NULL UNIQUE, chunker TEXT NOT NULL,
    chunk_size INTEGER NOT NULL, chunk_overlap INTEGER NOT NULL, added_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents(
    doc_id TEXT PRIMARY KEY, source_id TEXT NOT NULL UNIQUE,
    root_prefix TEXT NOT NULL, rel_path TEXT NOT NULL, kind TEXT,
    size INTEGER, mtime_ns INTEGER, content_hash TEXT,
    status TEXT NOT NULL CHECK (status IN ('processing', 'done', 'error')),
    chunk_count INTEGER NOT NULL DEFAULT 0, error_code TEXT, error_message TEXT,
    encoding TEXT, encoding_fallback INTEGER NOT NULL DEFAULT 0, chunker_sig TEXT,
    stale INTEGER NOT NULL DEFAULT 0, indexed_at TEXT, updated_at TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}', origin TEXT NOT NULL DEFAULT 'file',
    parent_doc_id TEXT, parse_notes TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS documents_root ON documents(root_prefix);
CREATE TABLE IF NOT EXISTS chunks(
    chunk_id TEXT PRIMARY KEY, doc_id TEXT NOT NULL, ordinal INTEGER NOT NULL,
    text TEXT NOT NULL, line_start INTEGER, line_end INTEGER,
    heading_path TEXT NOT NULL DEFAULT '[]', page_start INTEGER, page_end INTEGER,
    char_start INTEGER, char_end INTEGER, defines TEXT NOT NULL DEFAULT '[]');
CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_id);
CREATE TABLE IF NOT EXISTS removed_prefixes(prefix TEXT PRIMARY KEY, removed_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS changes(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, doc_id TEXT NOT NULL, op TEXT NOT NULL);
"""
# columns added after schema 1 (added in place on an older record; nothing is rewritten)
_ADDED_COLUMNS = {
    "documents": (("origin", "TEXT NOT NULL DEFAULT 'file'"), ("parent_doc_id", "TEXT"),
                  # how the file was read (parsers.ParsedDocument.notes), issue 20
                  ("parse_notes", "TEXT NOT NULL DEFAULT '{}'")),
    "chunks": (("page_start", "INTEGER"), ("page_end", "INTEGER"),
               # the chunk's offsets in the LF-normalised text (signed citations, issue 24)
               ("char_start", "INTEGER"), ("char_end", "INTEGER"),
               # what the chunk defines (chunking.Chunk.defines, a JSON list), issue 40
               ("defines", "TEXT NOT NULL DEFAULT '[]'")),
}
_POST_DDL = "CREATE INDEX IF NOT EXISTS documents_parent ON documents(parent_doc_id);"


class Record:
    """The SQLite connection, the tantivy index and writer, and the writer lock of one
    corpus folder.

    Args:
        dir: the corpus folder (``<home>/corpus``).
        readonly: never create files, never take the writer lock (the host's handle).

    Attributes:
        dir, db_path, index_dir, lock_path: the folder and its three entries.
        readonly: as given.
        db: the SQLite connection (``sqlite3.Row`` rows, autocommit; :meth:`tx` opens a
            transaction), or None when a read-only handle found no record or after
            :meth:`close`.
        index: the tantivy ``Index`` once opened (by :meth:`searcher` or the writer).
        writer: the tantivy ``IndexWriter`` while the writer is held, else None.
        held: True while :meth:`hold_writer` keeps the writer between operations.
        lock: the re-entrant lock every writer holds, and a reader only to publish an
            index generation or resolve a view (searches read a published generation
            without it, node/corpus/snapshot.py); SQLite and tantivy handles are shared
            by the threads of one process under it.
    """

    def __init__(self, dir: Path, *, readonly: bool = False) -> None:
        self.readonly = readonly
        self.held = False  # the writer is kept between calls (watch)
        self.writes = 0  # write operations of this process in progress (:meth:`writing`)
        self.dir = Path(dir)
        self.db_path = self.dir / "corpus.sqlite3"
        self.index_dir = self.dir / "tantivy"
        self.lock_path = self.dir / "writer.lock"
        self.lock = threading.RLock()
        self.db: sqlite3.Connection | None = None
        self.index: Any = None
        self.writer: Any = None
        self._wlock_fd: int | None = None
        #: the ``file:`` URI the record's other read-only connections open (the reading
        #: threads', views'): ``?mode=ro``, in a home the user may not write maybe
        #: ``&immutable=1`` (:func:`node.common.home.open_home_db_readonly_uri`)
        self.reading_uri = f"file:{self.db_path}?mode=ro"
        self._reader: tuple[Any, Any] | None = None  # (meta.json stamp, searcher)
        #: the private folder :attr:`index` was opened through (a folder the user may read
        #: but not write, :func:`open_index_for_reading`), else None
        self._reading: ReadingFolder | None = None
        self._segments: tuple[Any, int, int] | None = None  # (stamp, max_doc sum, deleted)
        if readonly and not self.db_path.exists():
            return
        if not readonly:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.faults():
            self._open(readonly)

    def _open(self, readonly: bool) -> None:
        if readonly and not may_write(self.db_path):
            # a home this user may read but not write: read without making the -shm file
            # SQLite would make beside a WAL record (open_home_db_readonly_uri)
            self.db, self.reading_uri = open_home_db_readonly_uri(self.db_path)
        else:
            self.db = sqlite3.connect(self.db_path, timeout=10.0, isolation_level=None,
                                      check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA busy_timeout=10000")
        # the header and the schema are read now: a file that is not a database, or
        # whose first pages are gone, is refused here (corpus-corrupt), not at a query
        self.db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        if readonly and self.get_meta("schema_version") != str(SCHEMA_VERSION):
            with contextlib.suppress(sqlite3.OperationalError):  # an older record: add the new columns
                self._migrate()
        if not readonly:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_DDL)
            self._migrate()
            if self.get_meta("schema_version") != str(SCHEMA_VERSION):
                self.set_meta("schema_version", str(SCHEMA_VERSION))

    def corrupt(self) -> CorpusError:
        """``corpus-corrupt``: ``corpus.sqlite3`` is not a (whole) SQLite database. It is
        the authority (the roots, the documents, their chunks): the index is rebuilt from
        it, not it from anything, so its repair is to move it aside and add the folders
        again."""
        return CorpusError(
            "corpus-corrupt", f"{self.db_path} is not a readable corpus database (damaged or not SQLite)",
            hint=f"move it aside (mv {self.db_path} {self.db_path}.bad), then add your folders again "
                 "(`kith index add FOLDER`) and run `kith index sync`; policy, peers and the rest of the "
                 "home are kept")

    @contextlib.contextmanager
    def faults(self) -> Iterator[None]:
        """Turn a SQLite failure of ``corpus.sqlite3`` inside the block into its refusal
        (:func:`node.common.dbfaults.sqlite_fault`): ``corpus-corrupt``, ``disk-full``,
        ``io-error``; any other exception passes unchanged."""
        from node.common.dbfaults import sqlite_fault

        try:
            yield
        except (sqlite3.DatabaseError, OSError) as exc:
            refusal = sqlite_fault(exc, self.db_path, self.corrupt) if isinstance(exc, sqlite3.DatabaseError) \
                else None
            if refusal is None:
                raise
            if self.db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self.db.close()
                self.db = None
            raise refusal from None

    # -- plumbing ---------------------------------------------------------------------
    def _migrate(self) -> None:
        """Add the columns newer schemas have to an older record (idempotent)."""
        db = self.db
        assert db is not None
        for table, cols in _ADDED_COLUMNS.items():
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for name, decl in cols:
                if name not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
        db.executescript(_POST_DDL)

    def close(self) -> None:
        """Release the writer (if held) and close SQLite. Idempotent."""
        with self.lock:
            self.release_writer()
            self._drop_index()
            if self.db is not None:
                self.db.close()
                self.db = None

    def _drop_index(self) -> None:
        """Forget the opened index (and its searcher), removing the reading folder it was
        opened through, if any."""
        self.index, self._reader = None, None
        if self._reading is not None:
            reading, self._reading = self._reading, None
            reading.remove()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction on :attr:`db`: committed when the block
        ends, rolled back (and the exception re-raised) when it raises. Yields the
        connection. Callers hold :attr:`lock`; not re-entrant (use a savepoint inside,
        as :class:`node.corpus.ingest.Writer` does)."""
        assert self.db is not None
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def get_meta(self, key: str) -> str | None:
        """The ``meta`` value of ``key`` (``schema_version``, ``index_schema_version``,
        ``index_applied_seq``, ``last_sync``, ``dense_enabled``, ``dense_model``…), or
        None when unset, when there is no record, or when the table is missing."""
        if self.db is None:
            return None
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        except sqlite3.OperationalError:
            return None
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        """Set the ``meta`` value of ``key`` in its own transaction (:meth:`tx`).

        Raises:
            sqlite3.Error: the record is read-only on disk or busy past the timeout.
        """
        with self.tx():
            self.db.execute(  # type: ignore[union-attr]
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    def require_writable(self) -> sqlite3.Connection:
        """:attr:`db`, when this handle may write.

        Raises:
            CorpusError: ``corpus-readonly`` (a read-only handle, or no record).
        """
        if self.readonly or self.db is None:
            raise CorpusError("corpus-readonly")
        return self.db

    def roots(self) -> list[Root]:
        """The registered roots, in the order they were added."""
        with self.lock:
            if self.db is None:
                return []
            try:
                rows = self.db.execute(
                    "SELECT prefix, path, chunker, chunk_size, chunk_overlap FROM roots "
                    "ORDER BY rowid").fetchall()
            except sqlite3.OperationalError:
                return []
            return [Root(prefix=r[0], path=r[1], chunker=r[2], chunk_size=r[3],
                         chunk_overlap=r[4]) for r in rows]

    # -- the writer -----------------------------------------------------------------------
    def _owner_text(self) -> str:
        return lock_owner(self.lock_path)

    def _locked(self) -> CorpusError:
        return CorpusError(
            "index-locked",
            f"Another process is writing this corpus index ({self._owner_text()}).",
            hint="Wait for that sync to finish (or stop it), then run the command again.")

    def acquire_writer(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Take the writer lock, open/create the index, and repair it from SQLite
        (replay the change log, or rebuild when the schema or document count disagree;
        ``progress(done, total)`` chunks during a rebuild, every :data:`REBUILD_STEP`).

        Raises:
            CorpusError: ``index-locked`` (another process holds ``writer.lock`` or the
                tantivy writer; the message names the owner), ``io-error`` (an index folder
                tantivy cannot write even once rebuilt). A writer tantivy refuses otherwise
                (its lock file damaged) rebuilds the index from the sources.
        """
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = acquire_owner_lock(self.lock_path, " ".join(["kith", *sys.argv[1:3]]))
        if fd is None:
            raise self._locked()
        self._wlock_fd = fd
        try:
            rebuild = self.get_meta("index_schema_version") != str(search.INDEX_SCHEMA_VERSION)
            index = None
            if not rebuild and not index_meta_readable(self.index_dir):
                rebuild = True
            if not rebuild and self.index_dir.is_dir() and tantivy.Index.exists(str(self.index_dir)):
                try:
                    index = tantivy.Index.open(str(self.index_dir))
                except ValueError:
                    rebuild = True
            if index is None:
                index, rebuild = self._new_index(), True
            search.register_analyzers(index)
            try:
                self.writer = index.writer(_WRITER_HEAP, _WRITER_THREADS)
            except ValueError as exc:
                if "LockBusy" in str(exc):
                    raise self._locked() from None
                # this process holds writer.lock, so no other Kith writes this index: a
                # writer tantivy cannot take (its lock file replaced by a folder, say) is a
                # damaged index, rebuilt from the sources as a missing one is
                index, rebuild = self._new_index(), True
                search.register_analyzers(index)
                try:
                    self.writer = index.writer(_WRITER_HEAP, _WRITER_THREADS)
                except ValueError as again:
                    raise ConfigError("io-error", f"the corpus index ({self.index_dir}) cannot be "
                                      f"written: {again}",
                                      hint=f"check that {self.index_dir} is a folder this user can write, "
                                           "then run `kith index sync`") from None
            self._drop_index()
            self.index = index
            self._repair(full=rebuild, progress=progress)
        except BaseException:
            self.release_writer()
            raise

    def _new_index(self) -> Any:
        """An empty index in :attr:`index_dir`, whatever was there deleted first (callers
        hold ``writer.lock`` and rebuild it from the sources)."""
        if self.index_dir.is_symlink() or self.index_dir.is_file():
            self.index_dir.unlink()
        elif self.index_dir.exists():
            shutil.rmtree(self.index_dir)
        self.index_dir.mkdir(parents=True)
        return tantivy.Index(search.build_schema(), path=str(self.index_dir))

    def release_writer(self) -> None:
        """Drop the tantivy writer (rolling back what it did not commit) and release
        ``writer.lock``; also ends :meth:`hold_writer`. Idempotent."""
        self.held = False
        if self.writer is not None:
            writer, self.writer = self.writer, None
            with contextlib.suppress(Exception):
                writer.rollback()
            with contextlib.suppress(Exception):
                writer.wait_merging_threads()
            del writer
        if self._wlock_fd is not None:
            fd, self._wlock_fd = self._wlock_fd, None
            release_owner_lock(fd)

    def commit_index(self) -> None:
        """Commit tantivy, then record the last applied change in SQLite."""
        db = self.db
        assert db is not None and self.writer is not None
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
        self.writer.commit()
        with self.tx():
            db.execute("INSERT INTO meta(key, value) VALUES ('index_applied_seq', ?) "
                       "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (str(seq),))
            db.execute("DELETE FROM changes WHERE seq <= ?", (seq,))

    def _repair(self, *, full: bool, progress: Callable[[int, int], None] | None = None) -> None:
        """Bring tantivy in line with SQLite (replay the change log, or rebuild)."""
        db = self.db
        assert db is not None and self.writer is not None and self.index is not None
        w = self.writer
        if not full:
            applied = int(self.get_meta("index_applied_seq") or 0)
            pending = [r[0] for r in db.execute(
                "SELECT DISTINCT doc_id FROM changes WHERE seq > ?", (applied,))]
            if pending:
                for doc_id in pending:
                    w.delete_documents_by_term("doc_id", doc_id)
                for cid, did, text, title, defines in iter_chunks_for_index(db, pending):
                    w.add_document(search.make_document(cid, did, text, title, defines))
                self.commit_index()
            self.index.reload()
            expected = db.execute("SELECT COUNT(*) FROM chunks c JOIN documents d "
                                  "ON d.doc_id = c.doc_id WHERE d.status='done'").fetchone()[0]
            full = self.index.searcher().num_docs != expected
        if full:
            w.delete_all_documents()
            total = db.execute("SELECT COUNT(*) FROM chunks c JOIN documents d "
                               "ON d.doc_id = c.doc_id WHERE d.status='done'").fetchone()[0] if progress else 0
            for n, (cid, did, text, title, defines) in enumerate(iter_chunks_for_index(db), 1):
                w.add_document(search.make_document(cid, did, text, title, defines))
                if progress is not None and n % REBUILD_STEP == 0:
                    progress(n, total)
            if progress is not None:
                progress(total, total)
            self.commit_index()
            self.set_meta("index_schema_version", str(search.INDEX_SCHEMA_VERSION))

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the writer for one operation (or reuse the one :meth:`hold_writer` keeps);
        :attr:`writes` counts it meanwhile (a search that finds the lock busy keeps its
        generation only while a write runs: :meth:`node.corpus.snapshot.Snapshots.take`)."""
        self.require_writable()
        if self.held:
            self.writes += 1
            try:
                yield
            except BaseException:
                with contextlib.suppress(Exception):
                    self.commit_index()
                raise
            finally:
                self.writes -= 1
            return
        self.acquire_writer()
        self.writes += 1
        try:
            yield
        except BaseException:
            # what SQLite already holds must reach the index (or be replayed later)
            with contextlib.suppress(Exception):
                self.commit_index()
            raise
        finally:
            self.writes -= 1
            self.release_writer()

    def hold_writer(self) -> None:
        """Take the writer lock now and keep it until :meth:`close` (``kith index watch``,
        ``kith host --watch``); start-up repair of the index runs here.

        Raises:
            CorpusError: ``index-locked`` (naming the owner), ``corpus-readonly``.
        """
        with self.lock:
            self.require_writable()
            if not self.held:
                self.acquire_writer()
                self.held = True

    def settings_changed(self) -> None:
        """Make every reader's published generation out of date, so the next search of
        each process (a running ``kith host``, ``api serve``, ``mcp``) publishes a new one
        and reads the corpus's search settings again (the dense switch,
        :attr:`node.corpus.snapshot.Generation.dense_on`): tantivy's ``meta.json`` — the
        one file every search ``stat``s — gets a new mtime, its content unchanged. Nothing
        without an index (no generation is published before one exists); never raises."""
        path = self.index_dir / "meta.json"
        with contextlib.suppress(OSError):
            st = os.stat(path)  # a new mtime even within the clock's tick
            os.utime(path, ns=(st.st_atime_ns, max(time.time_ns(), st.st_mtime_ns + 1)))

    # -- search -----------------------------------------------------------------------------
    def searcher(self, *, _again: bool = False) -> Any:
        """The main index's searcher, reloaded only when tantivy's ``meta.json`` changed
        (a commit by any process). Callers hold :attr:`lock`.

        Raises:
            CorpusError: ``index-unavailable`` (no record, no index yet, an index of an
                older schema, or an unreadable one).
        """
        if self.db is None or self.get_meta("index_schema_version") != str(
                search.INDEX_SCHEMA_VERSION):
            raise CorpusError("index-unavailable",
                              "The corpus index is missing or out of date; run `kith index sync`.")
        if self.index is None:
            try:
                if not index_meta_readable(self.index_dir):
                    raise ValueError("meta.json is not a regular file")
                index, reading = open_index_for_reading(self.index_dir)
            except ValueError:
                raise CorpusError("index-unavailable",
                                  "The corpus index is unreadable; run `kith index sync`.") from None
            search.register_analyzers(index)
            self._drop_index()
            self.index, self._reading = index, reading
        # tantivy rewrites meta.json (a new file, renamed into place) at every commit: the
        # reader is reloaded only when it changed (one stat instead of a reload per search)
        try:
            st = os.stat(self.index_dir / "meta.json")
            stamp: tuple[int, ...] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        if self._reader is None or stamp is None or self._reader[0] != stamp:
            try:
                if self._reading is not None:
                    self._reading.refresh()  # the segment files a commit added
                self.index.reload()
                self._reader = (stamp, self.index.searcher())
            except (ValueError, OSError) as exc:
                # the folder deleted or a file of it damaged under a long-running reader
                # (`kith host`): unavailable until `kith index sync` rebuilds it, then the
                # next search opens the new index; made one the user may not write (a chmod
                # under a running server): the next search opens it through a reading folder
                if self.writer is None:
                    through_folder = self._reading is not None
                    self._drop_index()
                    if permission_denied(exc) and not through_folder and not _again:
                        return self.searcher(_again=True)
                raise CorpusError("index-unavailable",
                                  "The corpus index is unreadable; run `kith index sync`.") from None
        return self._reader[1]

    def main_searcher_for(self, chunks: int) -> Any | None:
        """The main index's searcher when it holds exactly ``chunks`` live documents,
        none deleted-but-counted and no change pending (``index_lag`` 0), else None —
        then a view seeing every ``done`` document ranks exactly as on its own index
        (:mod:`node.corpus.views`). Reads ``meta.json`` once per index generation."""
        searcher = self.searcher()
        if self.index_lag():
            return None
        stamp = self._reader[0] if self._reader is not None else None
        if stamp is None:
            return None
        if self._segments is None or self._segments[0] != stamp:
            try:
                meta = json.loads(read_regular(self.index_dir / "meta.json"))
                segs = meta.get("segments", [])
                live = sum(int(sg.get("max_doc", 0)) for sg in segs)
                deleted = sum(int((sg.get("deletes") or {}).get("num_deleted_docs", 0))
                              for sg in segs)
            except (OSError, ValueError, TypeError, AttributeError):
                return None
            self._segments = (stamp, live, deleted)
        _, live, deleted = self._segments
        if deleted or live != chunks or searcher.num_docs != chunks:
            return None
        return searcher

    def flag_stale(self, doc_ids: list[str]) -> None:
        """Mark the documents ``doc_ids`` ``stale`` (their files changed or left their
        root since indexing); best effort with a 200 ms busy timeout, so a busy writer
        never fails a search. Never raises."""
        if not doc_ids or self.db is None:
            return
        try:  # best effort: a busy writer must not fail a search
            self.db.execute("PRAGMA busy_timeout=200")
            with self.tx():
                self.db.executemany("UPDATE documents SET stale=1 WHERE doc_id=?",
                                     [(d,) for d in doc_ids])
        except sqlite3.Error:
            pass
        finally:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("PRAGMA busy_timeout=10000")

    def index_lag(self) -> int:
        """Changes the record holds that the tantivy index does not (0 when current or
        when there is no corpus). Cheap: two reads of ``meta`` and ``changes``' key."""
        with self.lock:
            if self.db is None:
                return 0
            try:
                applied = int(self.get_meta("index_applied_seq") or 0)
                top = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
            except sqlite3.Error:
                return 0
            return max(0, top - applied)


def iter_chunks_for_index(db: Any, doc_ids: list[str] | None = None,
                          ) -> Iterator[tuple[str, str, str, tuple[str, str], list[str]]]:
    """Yield ``(chunk_id, doc_id, text, (page title, section), defines)`` of ``done``
    documents (all, or ``doc_ids``; :func:`node.corpus.search.index_title`; ``defines``:
    the ``defines`` field's tokens, :func:`node.corpus.search.definition_terms` of what
    the chunk defines, :attr:`node.corpus.chunking.Chunk.defines`)."""
    sql = ("SELECT c.chunk_id, c.doc_id, c.text, c.heading_path, d.source_id, c.defines "
           "FROM chunks c JOIN documents d ON d.doc_id = c.doc_id WHERE d.status = 'done'")
    if doc_ids is None:
        batches: list[tuple[str, tuple[Any, ...]]] = [(sql, ())]
    else:
        batches = []
        for i in range(0, len(doc_ids), 500):
            part = doc_ids[i:i + 500]
            batches.append((sql + f" AND c.doc_id IN ({','.join('?' * len(part))})", tuple(part)))
    for q, params in batches:
        for cid, did, text, hp, sid, defines in db.execute(q, params):
            path = json.loads(hp)
            yield (cid, did, text, search.index_title(sid, path),
                   search.definition_terms(json.loads(defines), path) if defines != "[]" else [])
