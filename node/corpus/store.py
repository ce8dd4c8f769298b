"""The corpus store: SQLite (the record) plus a tantivy BM25 index derived from it.

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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sqlite3
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import tantivy

from node.corpus import archives, chunking, ingest, search
from node.corpus.types import Hit, Root
from node.common.errors import CorpusError
from node.common.home import acquire_owner_lock, lock_active, lock_owner, release_owner_lock

SCHEMA_VERSION = 2
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
    heading_path TEXT NOT NULL DEFAULT '[]', page_start INTEGER, page_end INTEGER);
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
    "chunks": (("page_start", "INTEGER"), ("page_end", "INTEGER")),
}
_POST_DDL = "CREATE INDEX IF NOT EXISTS documents_parent ON documents(parent_doc_id);"


def _location(row: sqlite3.Row) -> dict[str, Any]:
    """Citation location of a chunk row: line range, heading path, and the page range
    for a PDF (``page``/``pageEnd``, 1-based)."""
    loc: dict[str, Any] = {"lineStart": row["line_start"], "lineEnd": row["line_end"],
                           "headingPath": json.loads(row["heading_path"])}
    if row["page_start"] is not None:
        loc["page"] = row["page_start"]
        loc["pageEnd"] = row["page_end"]
    return loc


_O_PATH = getattr(os, "O_PATH", 0)
_PROC_FD = Path("/proc/self/fd")


def _resolve(path: str) -> tuple[str, os.stat_result]:
    """``(real path, stat)`` of an existing file, every symlink resolved.

    On Linux the kernel resolves the path once (``O_PATH`` open, the descriptor's
    ``/proc/self/fd`` link, ``fstat`` on the same descriptor: a few syscalls, and the
    path checked is the file stat'ed); elsewhere, or without ``/proc``,
    ``os.path.realpath(strict=True)`` then ``os.stat``.

    Raises:
        OSError: the path does not exist or cannot be resolved.
    """
    if _O_PATH:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC)
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
            if real.startswith("/") and not real.endswith(" (deleted)"):
                return real, os.fstat(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
    real = os.path.realpath(path, strict=True)
    return real, os.stat(real)


#: ``kith index add --name``: what a chosen prefix may be (one path segment, no markup).
PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def too_broad(real: Path) -> str | None:
    """Why indexing the folder ``real`` (resolved) would read far more than documents:
    ``"the filesystem root"``, ``"your home directory"`` or ``"a folder holding your home
    directory"``; None when it is a normal folder (``kith index add`` refuses these
    without ``--force``, issue 12)."""
    if real == Path(real.anchor):
        return "the filesystem root"
    try:
        home = Path.home().resolve()
    except (RuntimeError, OSError):  # pragma: no cover - no home directory known
        return None
    if real == home:
        return "your home directory"
    if home.is_relative_to(real):
        return "a folder holding your home directory"
    return None


def _check_chunking(chunker: str, chunk_size: int, chunk_overlap: int) -> None:
    try:
        chunking.validate_params(chunk_size, chunk_overlap, chunker)
    except ValueError as exc:
        raise CorpusError("chunking-invalid", f"Invalid chunking: {exc}.") from None


class Corpus:
    """The local corpus: roots, sync and search.

    Args:
        home: the node home; data lives in ``<home>/corpus/``.
        readonly: search-only handle (the host's): never creates files, never takes the
            writer lock; :meth:`add_root` and :meth:`sync` raise ``corpus-readonly``.
        archive_limits: bounds on archives in roots (DESIGN §9; defaults from seed
            ``file-processing``).

    Usable as a context manager; thread-safe (one internal lock).
    """

    def __init__(self, home: Path | str, *, readonly: bool = False,
                 archive_limits: archives.ArchiveLimits = archives.DEFAULT_LIMITS) -> None:
        self.home = Path(home)
        self.readonly = readonly
        self.archive_limits = archive_limits
        self._held = False  # the writer is kept between calls (watch)
        self.dir = self.home / "corpus"
        self.db_path = self.dir / "corpus.sqlite3"
        self.index_dir = self.dir / "tantivy"
        self.lock_path = self.dir / "writer.lock"
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._index: Any = None
        self._writer: Any = None
        self._wlock_fd: int | None = None
        self._views: Any = None  # node.corpus.views.Views, made at a view's first search
        self._reader: tuple[Any, Any] | None = None  # (meta.json stamp, searcher)
        self._segments: tuple[Any, int, int] | None = None  # (stamp, max_doc sum, deleted)
        if readonly and not self.db_path.exists():
            return
        if not readonly:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._db = sqlite3.connect(self.db_path, timeout=10.0, isolation_level=None,
                                   check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA busy_timeout=10000")
        if readonly and self._get_meta("schema_version") != str(SCHEMA_VERSION):
            with contextlib.suppress(sqlite3.Error):  # an older record: add the new columns
                self._migrate()
        if not readonly:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_DDL)
            self._migrate()
            if self._get_meta("schema_version") != str(SCHEMA_VERSION):
                self._set_meta("schema_version", str(SCHEMA_VERSION))

    # -- plumbing ---------------------------------------------------------------------
    def _migrate(self) -> None:
        """Add the columns newer schemas have to an older record (idempotent)."""
        db = self._db
        assert db is not None
        for table, cols in _ADDED_COLUMNS.items():
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for name, decl in cols:
                if name not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
        db.executescript(_POST_DDL)

    def __enter__(self) -> Corpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the writer (if held) and close SQLite. Idempotent."""
        with self._lock:
            self._release_writer()
            self._index = None
            if self._views is not None:
                self._views.clear()
            if self._db is not None:
                self._db.close()
                self._db = None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        assert self._db is not None
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _get_meta(self, key: str) -> str | None:
        if self._db is None:
            return None
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        except sqlite3.OperationalError:
            return None
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        with self._tx():
            self._db.execute(  # type: ignore[union-attr]
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    def _require_writable(self) -> sqlite3.Connection:
        if self.readonly or self._db is None:
            raise CorpusError("corpus-readonly")
        return self._db

    # -- roots --------------------------------------------------------------------------
    def add_root(self, path: str | Path, *, chunker: str = "recursive",
                 chunk_size: int = chunking.DEFAULT_CHUNK_SIZE,
                 chunk_overlap: int = chunking.DEFAULT_CHUNK_OVERLAP,
                 name: str | None = None, force: bool = False) -> Root:
        """Register a folder as a source root (DESIGN §1, §9).

        Args:
            path: an existing directory (``~`` expanded, resolved to an absolute path).
            chunker: ``recursive`` (default), ``markdown`` or ``fixed``.
            chunk_size: characters per chunk (ceiling), 1..1 000 000.
            chunk_overlap: characters repeated from the previous chunk (ceiling),
                ``0 <= overlap < chunk_size``.
            name: the prefix to use (:data:`PREFIX_RE`) instead of the basename.
            force: accept a folder :func:`too_broad` refuses (``/``, the home directory).

        Returns:
            The persisted :class:`Root`; its prefix is ``name``, else the folder's
            basename, then ``-2``, ``-3``… when taken — by a root, a datasource kind, or a
            root removed before (a removed prefix is never reused: policy rules and
            peers' citations naming it must not point at another folder).

        Raises:
            CorpusError: ``chunking-invalid`` (checked first, before anything is stored),
                ``root-not-found`` (missing or not a directory; names the path),
                ``root-too-broad`` (without ``force``), ``root-name-invalid``,
                ``root-name-taken`` (``name`` in use or used before), ``root-exists`` (same
                resolved folder already registered), ``corpus-readonly``.
        """
        _check_chunking(chunker, chunk_size, chunk_overlap)
        if name is not None and not PREFIX_RE.fullmatch(name):
            raise CorpusError("root-name-invalid",
                              f"--name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -, starting with a "
                              "letter or digit.")
        with self._lock:
            db = self._require_writable()
            p = Path(path).expanduser()
            if not p.is_dir():
                raise CorpusError("root-not-found",
                                  f"{os.path.abspath(p)} does not exist or is not a folder.")
            real = p.resolve()
            broad = too_broad(real)
            if broad is not None and not force:
                raise CorpusError("root-too-broad", f"{real} is {broad}: indexing it would read "
                                  "everything below it (virtualenvs, caches, other people's files).")
            base = real.name or "root"
            with self._tx():
                if db.execute("SELECT 1 FROM roots WHERE path=?", (str(real),)).fetchone():
                    raise CorpusError("root-exists", f"{real} is already a source root.")
                taken = {r[0] for r in db.execute("SELECT prefix FROM roots")}
                taken |= {r[0].split("/")[1] for r in db.execute(
                    "SELECT source_id FROM documents WHERE origin='record'")}
                taken |= {r[0] for r in db.execute("SELECT prefix FROM removed_prefixes")}
                if name is not None:
                    if name in taken:
                        raise CorpusError("root-name-taken",
                                          f"The prefix /{name}/ is in use or was used by a removed "
                                          "root; choose another --name.")
                    base = name
                prefix, n = base, 1
                while prefix in taken:
                    n += 1
                    prefix = f"{base}-{n}"
                root = Root(prefix=prefix, path=str(real), chunker=chunker,
                            chunk_size=chunk_size, chunk_overlap=chunk_overlap)
                db.execute(
                    "INSERT INTO roots(prefix, path, chunker, chunk_size, chunk_overlap, added_at)"
                    " VALUES (?,?,?,?,?,?)",
                    (root.prefix, root.path, root.chunker, root.chunk_size, root.chunk_overlap,
                     ingest.now_rfc3339()))
            return root

    def overlapping(self, path: str | Path) -> list[Root]:
        """The registered roots that contain the folder ``path`` or lie inside it (the
        same files would be indexed twice under two prefixes); ``path`` itself excluded."""
        real = Path(path).expanduser().resolve()
        out = []
        for r in self.roots():
            other = Path(r.path)
            if other != real and (real.is_relative_to(other) or other.is_relative_to(real)):
                out.append(r)
        return out

    def remove_root(self, prefix: str) -> dict[str, Any]:
        """Remove a source root and every document (archive members too) and chunk indexed
        from it, from SQLite and the index in one writer session (the folder on disk is not
        touched). The prefix is retired (table ``removed_prefixes``): a later root with the
        same folder name gets ``NAME-2``…, so an old source id (and a policy rule naming it)
        never points at other files (``kith index remove``; the dashboard calls this too).

        Args:
            prefix: the root's prefix, with or without slashes (``docs`` or ``/docs/``).

        Returns:
            ``{"prefix", "path", "documents": int, "chunks": int}`` removed.

        Raises:
            CorpusError: ``root-unknown``, ``index-locked``, ``corpus-readonly``.
        """
        prefix = prefix.strip("/")
        with self._lock:
            db = self._require_writable()
            root = next((r for r in self.roots() if r.prefix == prefix), None)
            if root is None:
                raise CorpusError("root-unknown", f"No source root has the prefix /{prefix}/.",
                                  hint="`kith index status` lists the roots")
            with self._writing():
                rows = db.execute("SELECT doc_id, chunk_count FROM documents WHERE root_prefix=? "
                                  "AND origin != 'record'", (prefix,)).fetchall()
                chunks = db.execute("SELECT COUNT(*) FROM chunks c JOIN documents d ON "
                                    "d.doc_id = c.doc_id WHERE d.root_prefix=? AND d.origin != 'record'",
                                    (prefix,)).fetchone()[0]
                with self._tx():
                    for (doc_id, _n) in rows:
                        db.execute("DELETE FROM chunks WHERE doc_id=?", (doc_id,))
                        db.execute("DELETE FROM documents WHERE doc_id=?", (doc_id,))
                        db.execute("INSERT INTO changes(doc_id, op) VALUES (?, 'remove')", (doc_id,))
                    db.execute("DELETE FROM roots WHERE prefix=?", (prefix,))
                    db.execute("INSERT OR REPLACE INTO removed_prefixes(prefix, removed_at) VALUES (?, ?)",
                               (prefix, ingest.now_rfc3339()))
                assert self._writer is not None
                for (doc_id, _n) in rows:
                    self._writer.delete_documents_by_term("doc_id", doc_id)
                self._commit_index()
            if self._views is not None:
                self._views.clear()
            return {"prefix": prefix, "path": root.path, "documents": len(rows), "chunks": chunks}

    def configure_root(self, prefix: str, *, chunker: str | None = None,
                       chunk_size: int | None = None, chunk_overlap: int | None = None) -> Root:
        """Change a root's chunker settings; its documents are re-chunked by the next sync.

        The merged settings are checked as a pair (an overlap legal alone may not be
        legal with the root's size), before anything is stored.

        Raises:
            CorpusError: ``root-unknown``, ``chunking-invalid``, ``corpus-readonly``.
        """
        with self._lock:
            db = self._require_writable()
            current = next((r for r in self.roots() if r.prefix == prefix), None)
            if current is None:
                raise CorpusError("root-unknown", "No source root has that prefix.")
            new = Root(prefix=current.prefix, path=current.path,
                       chunker=current.chunker if chunker is None else chunker,
                       chunk_size=current.chunk_size if chunk_size is None else chunk_size,
                       chunk_overlap=(current.chunk_overlap if chunk_overlap is None
                                      else chunk_overlap))
            _check_chunking(new.chunker, new.chunk_size, new.chunk_overlap)
            with self._tx():
                db.execute("UPDATE roots SET chunker=?, chunk_size=?, chunk_overlap=? WHERE prefix=?",
                           (new.chunker, new.chunk_size, new.chunk_overlap, prefix))
            return new

    def roots(self) -> list[Root]:
        """The registered roots, in the order they were added."""
        with self._lock:
            if self._db is None:
                return []
            try:
                rows = self._db.execute(
                    "SELECT prefix, path, chunker, chunk_size, chunk_overlap FROM roots "
                    "ORDER BY rowid").fetchall()
            except sqlite3.OperationalError:
                return []
            return [Root(prefix=r[0], path=r[1], chunker=r[2], chunk_size=r[3],
                         chunk_overlap=r[4]) for r in rows]

    def source_ids(self) -> list[str]:
        """The canonical source id of every document in the record (any status; archive
        members included), sorted — what ``kith policy set|check`` measure a rule against.
        ``[]`` when there is no corpus yet."""
        with self._lock:
            if self._db is None:
                return []
            try:
                return [r[0] for r in self._db.execute("SELECT source_id FROM documents ORDER BY source_id")]
            except sqlite3.OperationalError:
                return []

    # -- the writer -----------------------------------------------------------------------
    def _owner_text(self) -> str:
        return lock_owner(self.lock_path)

    def _locked(self) -> CorpusError:
        return CorpusError(
            "index-locked",
            f"Another process is writing this corpus index ({self._owner_text()}).",
            hint="Wait for that sync to finish (or stop it), then run the command again.")

    def _acquire_writer(self) -> None:
        """Take the writer lock, open/create the index, and repair it from SQLite."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = acquire_owner_lock(self.lock_path, " ".join(["kith", *sys.argv[1:3]]))
        if fd is None:
            raise self._locked()
        self._wlock_fd = fd
        try:
            rebuild = self._get_meta("index_schema_version") != str(search.INDEX_SCHEMA_VERSION)
            index = None
            if not rebuild and tantivy.Index.exists(str(self.index_dir)):
                try:
                    index = tantivy.Index.open(str(self.index_dir))
                except ValueError:
                    rebuild = True
            if index is None:
                if self.index_dir.exists():
                    shutil.rmtree(self.index_dir)
                self.index_dir.mkdir(parents=True)
                index = tantivy.Index(search.build_schema(), path=str(self.index_dir))
                rebuild = True
            search.register_analyzers(index)
            try:
                self._writer = index.writer(_WRITER_HEAP, _WRITER_THREADS)
            except ValueError as exc:
                if "LockBusy" in str(exc):
                    raise self._locked() from None
                raise
            self._index = index
            self._reader = None
            self._repair(full=rebuild)
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        self._held = False
        if self._writer is not None:
            writer, self._writer = self._writer, None
            with contextlib.suppress(Exception):
                writer.rollback()
            with contextlib.suppress(Exception):
                writer.wait_merging_threads()
            del writer
        if self._wlock_fd is not None:
            fd, self._wlock_fd = self._wlock_fd, None
            release_owner_lock(fd)

    def _commit_index(self) -> None:
        """Commit tantivy, then record the last applied change in SQLite."""
        db = self._db
        assert db is not None and self._writer is not None
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
        self._writer.commit()
        with self._tx():
            db.execute("INSERT INTO meta(key, value) VALUES ('index_applied_seq', ?) "
                       "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (str(seq),))
            db.execute("DELETE FROM changes WHERE seq <= ?", (seq,))

    def _repair(self, *, full: bool) -> None:
        """Bring tantivy in line with SQLite (replay the change log, or rebuild)."""
        db = self._db
        assert db is not None and self._writer is not None and self._index is not None
        w = self._writer
        if not full:
            applied = int(self._get_meta("index_applied_seq") or 0)
            pending = [r[0] for r in db.execute(
                "SELECT DISTINCT doc_id FROM changes WHERE seq > ?", (applied,))]
            if pending:
                for doc_id in pending:
                    w.delete_documents_by_term("doc_id", doc_id)
                for cid, did, text, title in ingest.iter_chunks_for_index(db, pending):
                    w.add_document(search.make_document(cid, did, text, title))
                self._commit_index()
            self._index.reload()
            expected = db.execute("SELECT COUNT(*) FROM chunks c JOIN documents d "
                                  "ON d.doc_id = c.doc_id WHERE d.status='done'").fetchone()[0]
            full = self._index.searcher().num_docs != expected
        if full:
            w.delete_all_documents()
            for cid, did, text, title in ingest.iter_chunks_for_index(db):
                w.add_document(search.make_document(cid, did, text, title))
            self._commit_index()
            self._set_meta("index_schema_version", str(search.INDEX_SCHEMA_VERSION))

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Hold the writer for one operation (or reuse the one :meth:`hold_writer` keeps)."""
        self._require_writable()
        if self._held:
            try:
                yield
            except BaseException:
                with contextlib.suppress(Exception):
                    self._commit_index()
                raise
            return
        self._acquire_writer()
        try:
            yield
        except BaseException:
            # what SQLite already holds must reach the index (or be replayed later)
            with contextlib.suppress(Exception):
                self._commit_index()
            raise
        finally:
            self._release_writer()

    def hold_writer(self) -> None:
        """Take the writer lock now and keep it until :meth:`close` (``kith index watch``,
        ``kith host --watch``); start-up repair of the index runs here.

        Raises:
            CorpusError: ``index-locked`` (naming the owner), ``corpus-readonly``.
        """
        with self._lock:
            self._require_writable()
            if not self._held:
                self._acquire_writer()
                self._held = True

    # -- sync -------------------------------------------------------------------------------
    def sync(self, *, progress: ingest.Progress | None = None,
             mode: str = "new_only", timings: dict[str, float] | None = None) -> dict[str, Any]:
        """Walk every root and update the record and the index (DESIGN §9).

        Args:
            progress: called as ``progress(done_files, total_files, source_id,
                done_bytes, total_bytes)`` before each file and once with
                ``done_files == total_files`` at the end.
            mode: ``new_only`` (default), ``update_only`` or ``full`` (the table in
                :mod:`node.corpus.ingest`).
            timings: when given, filled with the seconds spent per stage
                (:data:`node.corpus.ingest.STAGES`: walk, read, parse, chunk, record,
                index, commit) — ``scripts/bench_corpus.py --breakdown``.

        Returns:
            ``{"mode", "indexed", "updated", "skipped", "removed", "failed", "empty",
            "chunks", "files", "bytes": int, "skippedReasons": {reason: int},
            "skippedFolders": [{"source", "reason": "kith-home"}], "skippedSources":
            [{"source", "reason"}] (files not indexed for a reason other than ``unchanged``:
            ``unsupported-type``, ``new-ignored``; kept for :meth:`status_report`),
            "archives": {"indexed", "refused"}, "errors": [{"source", "code", "message"
            [, "reason"]}], "seconds": float}``. ``failed`` files and ``empty`` ones
            have an ``error`` tracking row; neither stops the batch. Folders that are a
            Kith home (this node's, or any holding ``identity.key``) are never entered
            (``skippedFolders``; ``skippedReasons["kith-home"]`` counts them).

        Raises:
            CorpusError: ``sync-mode-invalid``; ``index-locked`` when another process
                holds the writer; ``corpus-readonly`` on a read-only handle.
        """
        if mode not in ingest.MODES:
            raise CorpusError("sync-mode-invalid",
                              f"The sync mode must be one of {', '.join(ingest.MODES)}.")
        with self._lock, self._writing():
            report = ingest.run_sync(self, progress, mode, self.archive_limits, timings)
            # what the last sync did not index, and why: `kith index status` lists it
            skipped = [*report.get("skippedSources", []), *report.get("skippedFolders", [])]
            self._set_meta("last_sync_skipped", json.dumps(skipped[:ingest.MAX_SKIPPED_LISTED]))
            return report

    def sync_paths(self, paths: Iterable[str | Path]) -> dict[str, Any]:
        """Sync only the given absolute paths (the watcher's debounced batch): changed
        or added files are indexed, a deleted file or folder removes its documents; no
        other part of any root is listed.

        Returns:
            The sync report (as :meth:`sync`, mode ``new_only``, without ``last_sync``).

        Raises:
            CorpusError: ``index-locked``, ``corpus-readonly``.
        """
        with self._lock, self._writing():
            return ingest.Sync(self, None, "new_only", self.archive_limits).run_paths(paths)

    def import_records(self, path: str | Path, *, kind: str, instance: str,
                       replace: bool = False) -> dict[str, Any]:
        """Import datasource records from a JSON Lines file (DESIGN §9); see
        :func:`node.corpus.datasource.import_jsonl` for the record rules.

        Raises:
            CorpusError: ``import-invalid``, ``import-not-found``, ``index-locked``,
                ``corpus-readonly``.
        """
        from node.corpus import datasource

        with self._lock:
            self._require_writable()
            datasource.check_names(kind, instance, {r.prefix for r in self.roots()})
            with self._writing():
                return datasource.import_jsonl(self, Path(path), kind=kind, instance=instance,
                                               replace=replace)

    # -- search -----------------------------------------------------------------------------
    def _searcher(self) -> Any:
        if self._db is None or self._get_meta("index_schema_version") != str(
                search.INDEX_SCHEMA_VERSION):
            raise CorpusError("index-unavailable",
                              "The corpus index is missing or out of date; run `kith index sync`.")
        if self._index is None:
            try:
                index = tantivy.Index.open(str(self.index_dir))
            except ValueError:
                raise CorpusError("index-unavailable",
                                  "The corpus index is unreadable; run `kith index sync`.") from None
            search.register_analyzers(index)
            self._index = index
            self._reader = None
        # tantivy rewrites meta.json (a new file, renamed into place) at every commit: the
        # reader is reloaded only when it changed (one stat instead of a reload per search)
        try:
            st = os.stat(self.index_dir / "meta.json")
            stamp: tuple[int, ...] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        if self._reader is None or stamp is None or self._reader[0] != stamp:
            self._index.reload()
            self._reader = (stamp, self._index.searcher())
        return self._reader[1]

    def warm_view(self, visible: Any) -> int:
        """Build (or bring up to date) the index of the view ``visible`` now, so its first
        search does not pay for it (a host can warm the anonymous view at start).

        Args:
            visible: the view predicate, as for :meth:`search_hits`.

        Returns:
            The number of documents in the view.

        Raises:
            CorpusError: ``index-unavailable`` (no corpus or no index yet).
        """
        with self._lock:
            self._searcher()
            return len(self._view(visible).docs)

    def _view(self, visible: Any) -> Any:
        """The :class:`node.corpus.views.ViewIndex` of the documents ``visible`` lets a view
        see, current with the record (callers hold :attr:`_lock`)."""
        from node.corpus import views

        if self._views is None:
            self._views = views.Views()
        assert self._db is not None
        return self._views.index_for(self._db, visible, self._main_searcher_for)

    def _main_searcher_for(self, chunks: int) -> Any | None:
        """The main index's searcher when it holds exactly ``chunks`` live documents,
        none deleted-but-counted and no change pending (``index_lag`` 0), else None —
        then a view seeing every ``done`` document ranks exactly as on its own index
        (:mod:`node.corpus.views`). Reads ``meta.json`` once per index generation."""
        searcher = self._searcher()
        if self.index_lag():
            return None
        stamp = self._reader[0] if self._reader is not None else None
        if stamp is None:
            return None
        if self._segments is None or self._segments[0] != stamp:
            try:
                meta = json.loads((self.index_dir / "meta.json").read_text("utf-8"))
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

    def _serve_ok(self, row: sqlite3.Row, base: str | None) -> bool:
        """Serve-time origin check (DESIGN §9, seed ``provider-origins``).

        A file chunk is served only while its file is still inside its (resolved) root
        — symlinks resolved — and unchanged: same size and mtime, or same size and
        SHA-256. An archive member is checked through its archive's row the same way.
        A datasource record's origin is its record id: it is served while its row is
        ``done`` (the caller only passes ``done`` rows).
        """
        keys = row.keys()
        origin = row["origin"] if "origin" in keys else "file"
        if origin == "record":
            return True
        if origin == "member":
            parent = self._db.execute(  # type: ignore[union-attr]
                "SELECT rel_path, size, mtime_ns, content_hash, origin FROM documents "
                "WHERE doc_id=? AND status='done' AND origin='archive'",
                (row["parent_doc_id"],)).fetchone()
            return parent is not None and self._serve_ok(parent, base)
        if base is None:
            return False
        try:
            real, st = _resolve(os.path.join(base, row["rel_path"]))
            # both are absolute and normalized (resolved): inside = equal or below base
            if real != base and not real.startswith(base.rstrip(os.sep) + os.sep):
                return False
            if not stat.S_ISREG(st.st_mode) or st.st_size != row["size"]:
                return False
            if st.st_mtime_ns == row["mtime_ns"]:
                return True
            with open(real, "rb") as fh:
                return hashlib.file_digest(fh, "sha256").hexdigest() == row["content_hash"]
        except (OSError, ValueError):
            return False

    def _flag_stale(self, doc_ids: list[str]) -> None:
        if not doc_ids or self._db is None:
            return
        try:  # best effort: a busy writer must not fail a search
            self._db.execute("PRAGMA busy_timeout=200")
            with self._tx():
                self._db.executemany("UPDATE documents SET stale=1 WHERE doc_id=?",
                                     [(d,) for d in doc_ids])
        except sqlite3.Error:
            pass
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA busy_timeout=10000")

    def search_hits(self, query: str, *, limit: int, filters: dict[str, Any] | None = None,
                    deadline: float | None = None,
                    max_per_document: int = search.MAX_PER_DOCUMENT,
                    visible: Any = None,
                    ) -> tuple[list[Hit], dict[str, Any]]:
        """Search the corpus as one view sees it (no policy here: the caller builds the
        view's predicate and the egress gate screens the hits).

        Args:
            query: user text (any characters; never parsed by tantivy's query parser).
            limit: number of hits wanted (1–100).
            filters: normalized filters from :func:`node.answer.contract.validate`
                (``sources`` globs; metadata filters fail closed, DESIGN §9).
            deadline: ``time.monotonic()`` instant after which no further pass starts.
            max_per_document: document-level dedup cap (default 2).
            visible: ``Callable[[str], bool] | None`` — the view (``visible(source_id)``
                True when it may see the document or be asked about it, the ``ask``
                tier); None = the owner's view. See
                :func:`node.corpus.retrieval.run_search`: with a predicate the search runs
                on the view's own index, so candidates and scores depend only on the
                documents the view may see.

        Returns:
            ``(hits, controller)``: hits best first, sorted by (−score, chunk_id), every
            score > 0 (score = reciprocal-rank-fusion value; raw per-pass scores in
            ``score_components``). ``controller`` is the local ``retrievalController``
            report: ``mode``, ``passes`` [{name, status, candidates}], ``fusion``,
            ``maxPerDocument``, counts (``candidates``, ``orphaned``, ``filteredOut``,
            ``withheldStale``, ``dedupedPerDocument``, ``returned``), ``rounds``,
            ``earlyStop``, ``stopReason``, ``indexLag``, ``subqueries``. Its counts are
            for local diagnostics only (envelope.py copies none of them). The passes,
            fusion and early stop are :func:`node.corpus.retrieval.run_search`'s.

        Raises:
            CorpusError: ``query-invalid`` (empty query / bad limit), ``index-unavailable``.
        """
        from node.corpus import retrieval  # the multi-pass controller (issue 4)

        return retrieval.run_search(self, query, limit=limit, filters=filters,
                                    deadline=deadline, max_per_document=max_per_document,
                                    visible=visible)

    def _materialize(self, order: Sequence[str], doc_of: dict[str, str],
                     score_of: Callable[[str], float], filters: dict[str, Any], limit: int,
                     max_per_document: int, counts: dict[str, int]) -> list[Hit]:
        """Turn fused candidates into hits: document checks first (SQLite row, filters,
        per-document cap, serve-time origin), then chunk rows for the survivors only.
        A candidate whose document or chunk is not in SQLite is ignored (authoritative).

        ``order`` is read front to back (it may resolve chunk ids as it is read, filling
        ``doc_of`` for each id it hands out); ``score_of(chunk_id)`` is the fused score.
        Hits carry no ``score_components`` (the controller adds them)."""
        db = self._db
        assert db is not None
        docs: dict[str, sqlite3.Row] = {}
        looked: set[str] = set()
        window = max(2 * limit, 20)  # document rows are read for this many candidates at a time
        seen_to = 0

        def load_docs(upto: int) -> None:
            nonlocal seen_to
            want = [d for d in dict.fromkeys(doc_of[c] for c in order[seen_to:upto])
                    if d not in looked]
            seen_to = max(seen_to, upto)
            looked.update(want)
            for j in range(0, len(want), 500):
                part = want[j:j + 500]
                for r in db.execute(
                        "SELECT doc_id, source_id, root_prefix, rel_path, size, mtime_ns, "
                        "content_hash, indexed_at, metadata, origin, parent_doc_id FROM "
                        "documents WHERE status = 'done' "
                        f"AND doc_id IN ({','.join('?' * len(part))})", part):
                    docs[r["doc_id"]] = r

        bases_cache: dict[str, str | None] | None = None

        def bases() -> dict[str, str | None]:
            nonlocal bases_cache
            if bases_cache is None:
                bases_cache = {}
                for r in self.roots():
                    try:
                        bases_cache[r.prefix] = os.path.realpath(r.path, strict=True)
                    except OSError:
                        bases_cache[r.prefix] = None
            return bases_cache

        serve: dict[str, bool] = {}
        meta_of: dict[str, dict[str, Any]] = {}
        per_doc: dict[str, int] = {}
        stale: list[str] = []
        hits: list[Hit] = []
        i = 0
        while len(hits) < limit and i < len(order):
            batch: list[str] = []
            while i < len(order) and len(hits) + len(batch) < limit:
                if i >= seen_to:
                    load_docs(i + window)
                cid = order[i]
                i += 1
                did = doc_of[cid]
                drow = docs.get(did)
                if drow is None:
                    counts["orphaned"] += 1
                    continue
                if did not in meta_of:
                    meta_of[did] = json.loads(drow["metadata"] or "{}")
                if filters and not search.passes_filters(drow["source_id"], meta_of[did], filters):
                    counts["filteredOut"] += 1
                    continue
                if per_doc.get(did, 0) >= max_per_document:
                    counts["dedupedPerDocument"] += 1
                    continue
                if did not in serve:
                    serve[did] = (drow["origin"] == "record"
                                  or self._serve_ok(drow, bases().get(drow["root_prefix"])))
                    if not serve[did]:
                        stale.append(did)
                if not serve[did]:
                    counts["withheldStale"] += 1
                    continue
                per_doc[did] = per_doc.get(did, 0) + 1
                batch.append(cid)
            if not batch:
                break
            rows = {r["chunk_id"]: r for r in db.execute(
                "SELECT chunk_id, doc_id, text, line_start, line_end, heading_path, page_start, "
                "page_end FROM chunks "
                f"WHERE chunk_id IN ({','.join('?' * len(batch))})", batch)}
            for cid in batch:
                row = rows.get(cid)
                did = doc_of[cid]
                if row is None or row["doc_id"] != did:
                    counts["orphaned"] += 1
                    per_doc[did] -= 1
                    continue
                drow = docs[did]
                hits.append(Hit(
                    chunk_id=cid, source_id=drow["source_id"], text=row["text"],
                    score=score_of(cid),
                    location=_location(row),
                    content_hash=drow["content_hash"] or "", indexed_at=drow["indexed_at"] or "",
                    root_prefix=None if drow["origin"] == "record" else drow["root_prefix"],
                    rel_path=None if drow["origin"] == "record" else drow["rel_path"],
                    metadata=meta_of[did],
                ))
        self._flag_stale(stale)
        return hits

    # -- stats ------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counts and readiness.

        Returns:
            ``{"roots", "documents", "done", "chunks", "failed", "empty", "processing",
            "stale": int, "ready": bool, "last_sync": str | None, "index_lag": int,
            "sync_running": bool, "interrupted": bool}``;
            ``ready`` is True when a sync has completed, the index is present and of
            the current schema, and it holds every change of the record
            (``index_lag`` 0: false while a sync is writing or after a crash left
            tantivy behind SQLite). ``sync_running``: a live process holds the writer
            lock (:func:`node.common.home.lock_active`, a probe that never takes it).
            ``interrupted``: no writer is running yet documents are still
            ``processing``, the index lags the record, or documents exist and no sync
            ever completed — a sync was killed; the next ``kith index sync`` finishes
            it. Never raises for a missing corpus (all zero, not ready).
        """
        with self._lock:
            out: dict[str, Any] = {"roots": 0, "documents": 0, "done": 0, "chunks": 0,
                                   "failed": 0, "empty": 0, "processing": 0, "stale": 0,
                                   "ready": False, "last_sync": None, "index_lag": 0,
                                   "sync_running": False, "interrupted": False}
            if self._db is None:
                return out
            db = self._db
            try:
                out["roots"] = db.execute("SELECT COUNT(*) FROM roots").fetchone()[0]
                for status, code, stale, n, chunks in db.execute(
                        "SELECT status, error_code = 'empty-document', stale, COUNT(*), "
                        "SUM(CASE WHEN origin = 'archive' THEN 0 ELSE chunk_count END) "
                        "FROM documents GROUP BY 1, 2, 3"):
                    out["documents"] += n
                    if status == "done":
                        out["done"] += n
                        out["chunks"] += chunks or 0
                    elif status == "processing":
                        out["processing"] += n
                    elif code:
                        out["empty"] += n
                    else:
                        out["failed"] += n
                    if stale:
                        out["stale"] += n
                applied = int(self._get_meta("index_applied_seq") or 0)
                top = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
                out["index_lag"] = max(0, top - applied)
            except sqlite3.OperationalError:
                return out
            out["last_sync"] = self._get_meta("last_sync")
            out["ready"] = bool(
                out["last_sync"] and not out["index_lag"]
                and self._get_meta("index_schema_version") == str(search.INDEX_SCHEMA_VERSION)
                and tantivy.Index.exists(str(self.index_dir)))
            out["sync_running"] = self._writer is not None or lock_active(self.lock_path)
            out["interrupted"] = not out["sync_running"] and bool(
                out["processing"] or out["index_lag"]
                or (out["documents"] and not out["last_sync"]))
            return out

    def index_lag(self) -> int:
        """Changes the record holds that the tantivy index does not (0 when current or
        when there is no corpus). Cheap: two reads of ``meta`` and ``changes``' key."""
        with self._lock:
            if self._db is None:
                return 0
            try:
                applied = int(self._get_meta("index_applied_seq") or 0)
                top = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
            except sqlite3.Error:
                return 0
            return max(0, top - applied)

    def index_syncing(self) -> bool:
        """True while the index is not settled: no sync has completed yet (a first sync
        may be running) or the index lags the record (:meth:`index_lag` > 0: a sync is
        writing, or a crash left changes to replay). Depends on index state only."""
        with self._lock:
            if self._db is None:
                return False
            return self._get_meta("last_sync") is None or self.index_lag() > 0

    def repair_lag(self) -> str:
        """Replay the changes the index lacks now, if the writer lock is free — without
        waiting for it (DESIGN §9 start-up repair, for read-only openers: the host,
        ``kith api serve``, ``kith mcp``). The handle stays read-only for everything else.

        Returns:
            ``"current"`` (nothing to repair), ``"repaired"``, ``"locked"`` (another
            process holds the writer; it replays the changes itself — callers warn), or
            ``"unavailable"`` (no corpus).

        Raises:
            CorpusError: only for a corrupt index the writer cannot open.
        """
        with self._lock:
            if self._db is None:
                return "unavailable"
            if self._writer is not None or self.index_lag() == 0:
                return "current"
            if self._get_meta("index_schema_version") is None:
                return "current"  # never indexed: `kith index sync` builds it
            try:
                self._acquire_writer()  # non-blocking flock; replays the change log
            except CorpusError as exc:
                if exc.code == "index-locked":
                    return "locked"
                raise
            self._release_writer()
            self._index = None  # reopened (and reloaded) by the next search
            return "repaired" if self.index_lag() == 0 else "locked"

    def status_report(self, *, max_listed: int = 1000) -> dict[str, Any]:
        """What ``kith index status`` shows (DESIGN §9 tracking).

        Args:
            max_listed: most entries in each of ``failedDocuments``, ``staleDocuments``,
                ``processingDocuments``.

        Returns:
            :meth:`stats` plus ``"byStatus": {"processing", "done", "error": int}``,
            ``"rootList": [{"prefix", "path", "chunker", "chunkSize", "chunkOverlap",
            "documents", "chunks", "stale", "failed", "empty", "byStatus": {...}}]`` (``failed``
            and ``empty`` split ``byStatus["error"]`` as :meth:`stats` does: an
            ``empty-document`` error is empty, any other error failed), ``"datasources":
            [{"kind", "instance", "documents", "chunks"}]``, ``"failedDocuments":
            [{"source", "status", "code", "message"}]`` (errors and empty documents,
            with their reasons), ``"staleDocuments": [source]``,
            ``"processingDocuments": [source]``, ``"readNotes": [{"source", "encoding",
            "fallback", "decoder", "confidence", ...}]`` (documents not read as clean
            UTF-8, or whose front matter was read or ignored: the decoder's choice and
            confidence and the other :attr:`node.corpus.parsers.ParsedDocument.notes`),
            ``"skippedSources": [{"source", "reason"}]`` (what the last full sync did not
            index and why: ``unsupported-type``, ``new-ignored``, ``kith-home``). Never
            raises for a missing corpus.
        """
        out = self.stats()
        out.update(byStatus={"processing": 0, "done": 0, "error": 0}, rootList=[],
                   datasources=[], failedDocuments=[], staleDocuments=[],
                   processingDocuments=[], readNotes=[], skippedSources=[])
        with self._lock:
            db = self._db
            if db is None:
                return out
            try:
                per_root: dict[str, dict[str, Any]] = {}
                for r in self.roots():
                    per_root[r.prefix] = {
                        "prefix": r.prefix, "path": r.path, "chunker": r.chunker,
                        "chunkSize": r.chunk_size, "chunkOverlap": r.chunk_overlap,
                        "documents": 0, "chunks": 0, "stale": 0, "failed": 0, "empty": 0,
                        "byStatus": {"processing": 0, "done": 0, "error": 0}}
                ds: dict[str, dict[str, Any]] = {}
                for prefix, origin, sid, status, stale, empty, n, chunks in db.execute(
                        "SELECT root_prefix, origin, CASE WHEN origin='record' THEN source_id "
                        "ELSE '' END, status, stale, COALESCE(error_code = 'empty-document', 0), "
                        "COUNT(*), SUM(CASE WHEN origin='archive' THEN 0 ELSE chunk_count END) "
                        "FROM documents GROUP BY 1, 2, 3, 4, 5, 6"):
                    out["byStatus"][status] = out["byStatus"].get(status, 0) + n
                    if origin == "record":
                        _, kind, instance = sid.split("/", 3)[:3]
                        d = ds.setdefault(f"{kind}/{instance}", {
                            "kind": kind, "instance": instance, "documents": 0, "chunks": 0})
                        d["documents"] += n
                        d["chunks"] += (chunks or 0) if status == "done" else 0
                        continue
                    entry = per_root.get(prefix)
                    if entry is None:
                        continue
                    entry["documents"] += n
                    entry["byStatus"][status] = entry["byStatus"].get(status, 0) + n
                    if status == "done":
                        entry["chunks"] += chunks or 0
                    elif status == "error":
                        entry["empty" if empty else "failed"] += n
                    if stale:
                        entry["stale"] += n
                out["rootList"] = list(per_root.values())
                out["datasources"] = sorted(ds.values(), key=lambda d: (d["kind"], d["instance"]))
                out["failedDocuments"] = [
                    {"source": r[0], "status": r[1], "code": r[2], "message": r[3]}
                    for r in db.execute(
                        "SELECT source_id, status, error_code, error_message FROM documents "
                        "WHERE status='error' ORDER BY source_id LIMIT ?", (max_listed,))]
                out["staleDocuments"] = [r[0] for r in db.execute(
                    "SELECT source_id FROM documents WHERE stale=1 ORDER BY source_id LIMIT ?",
                    (max_listed,))]
                out["processingDocuments"] = [r[0] for r in db.execute(
                    "SELECT source_id FROM documents WHERE status='processing' "
                    "ORDER BY source_id LIMIT ?", (max_listed,))]
                out["readNotes"] = [
                    {"source": r[0], "encoding": r[1], "fallback": bool(r[2]),
                     **json.loads(r[3] or "{}")}
                    for r in db.execute(
                        "SELECT source_id, encoding, encoding_fallback, parse_notes FROM "
                        "documents WHERE status='done' AND (encoding_fallback=1 OR "
                        "parse_notes LIKE '%frontMatter%') ORDER BY source_id LIMIT ?",
                        (max_listed,))]
                try:
                    out["skippedSources"] = json.loads(self._get_meta("last_sync_skipped") or "[]")[:max_listed]
                except ValueError:
                    out["skippedSources"] = []
            except sqlite3.OperationalError:
                return out
        return out
