"""The corpus façade: roots, sync, search and status over one corpus record (DESIGN §9).

:class:`Corpus` is what the rest of Kith opens. The record itself — SQLite, the tantivy
index and writer, the writer lock, transactions and metadata — is
:class:`node.corpus.record.Record` (its module docstring describes the layout under
``<home>/corpus/`` and why SQLite and tantivy may disagree safely); sync is
:mod:`node.corpus.ingest`, the multi-pass search :mod:`node.corpus.retrieval`, a peer's
view index :mod:`node.corpus.views`.
"""

from __future__ import annotations

import os
import re
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

import tantivy

from node.corpus import archives, chunking, ingest, search
from node.corpus.record import Record, index_meta_readable, open_index_for_reading, permission_denied
from node.corpus.snapshot import Generation, Snapshots
from node.corpus.lens import Lens
from node.corpus.types import Hit, Root
from node.common.errors import ConfigError, CorpusError
from node.common.home import lock_active


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



def _index_present(index_dir: Path) -> bool:
    """True when ``index_dir`` holds a tantivy index (its meta.json). A folder that cannot
    be read is ``io-error`` naming it — tantivy says so as a ValueError.

    Raises:
        ConfigError: ``io-error`` (permission denied, or another read failure).
    """
    try:
        return index_dir.is_dir() and tantivy.Index.exists(str(index_dir))
    except (ValueError, OSError) as exc:
        from node.common.dbfaults import io_error

        why = "permission denied" if permission_denied(exc) else "the index folder cannot be read"
        raise io_error(str(index_dir), why) from None


def _denied(index_dir: Path) -> ConfigError:
    """``io-error`` naming ``index_dir`` when the OS refused tantivy a file of it."""
    from node.common.dbfaults import io_error

    return io_error(str(index_dir), "permission denied: a file of the index cannot be read")


def _index_opens(index_dir: Path) -> bool:
    """True when tantivy opens the index in ``index_dir`` (its meta.json and every segment
    it names are readable) — in a folder this user may read but not write, through a
    private reading folder (:func:`node.corpus.record.open_index_for_reading`); False for
    a damaged one.

    Raises:
        ConfigError: ``io-error`` naming the folder when the OS refused tantivy a file:
            a permission, not a damage a rebuild repairs.
    """
    if not index_meta_readable(index_dir):
        return False
    try:
        index, reading = open_index_for_reading(index_dir)  # tantivy opens every segment
        del index
        if reading is not None:
            reading.remove()
    except (ValueError, OSError) as exc:
        if permission_denied(exc):
            raise _denied(index_dir) from None
        return False
    return True


def index_denied(index_dir: Path) -> ConfigError | None:
    """Why the index in ``index_dir`` cannot be searched when it is a permission (the
    ``io-error`` of :func:`_index_opens`), else None (missing, damaged or fine: a search
    says ``index-unavailable`` and ``kith index sync`` rebuilds it)."""
    try:
        _index_opens(index_dir)
    except ConfigError as exc:
        return exc
    return None

class Corpus:
    """The local corpus: roots, sync and search.

    Args:
        home: the node home; data lives in ``<home>/corpus/``.
        readonly: search-only handle (the host's): never creates files, never takes the
            writer lock; :meth:`add_root` and :meth:`sync` raise ``corpus-readonly``.
        archive_limits: bounds on archives in roots (DESIGN §9; defaults from seed
            ``file-processing``).

    Usable as a context manager; thread-safe (one internal lock, which searches do not
    take: they read a published generation, :meth:`snapshot`).
    """

    def __init__(self, home: Path | str, *, readonly: bool = False,
                 archive_limits: archives.ArchiveLimits = archives.DEFAULT_LIMITS) -> None:
        self.home = Path(home)
        self.archive_limits = archive_limits
        #: the record: SQLite, the tantivy index and writer, the writer lock (its lock
        #: guards every read and write; sync, retrieval, views and dense work on it)
        self.record = Record(self.home / "corpus", readonly=readonly)
        self.readonly = readonly
        self.dir = self.record.dir
        self.db_path = self.record.db_path
        self.index_dir = self.record.index_dir
        self.lock_path = self.record.lock_path
        #: the peers' view indexes (:class:`node.corpus.views.Views`), made at a view's
        #: first search
        self.views: Any = None
        self._lens_basis: tuple[int, list[str]] | None = None  # :meth:`lens_basis`, per generation
        #: the published index generations searches read (:mod:`node.corpus.snapshot`)
        self.snapshots = Snapshots(self.record)

    def __enter__(self) -> Corpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the writer (if held) and close SQLite. Idempotent."""
        with self.record.lock:
            if self.views is not None:
                self.views.clear()
            self.snapshots.current = None
            self.snapshots.chunks.close()
            self.record.close()

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
                ``root-not-found`` (missing, not a directory, or an empty ``path``; names the path),
                ``root-path-invalid`` (its resolved path is not UTF-8),
                ``root-is-copy`` (it lies in ``<home>/copies/``, even with ``force``), ``root-too-broad`` (without ``force``), ``root-name-invalid``,
                ``root-name-taken`` (``name`` in use or used before), ``root-exists`` (same
                resolved folder already registered), ``corpus-readonly``.
        """
        _check_chunking(chunker, chunk_size, chunk_overlap)
        if name is not None and not PREFIX_RE.fullmatch(name):
            raise CorpusError("root-name-invalid",
                              f"--name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -, starting with a "
                              "letter or digit.")
        with self.record.lock:
            db = self.record.require_writable()
            if str(path) == "":  # Path("") is ".": an empty argument must not add the working folder
                raise CorpusError("root-not-found", "an empty path names no folder.",
                                  hint="give the folder to index, e.g. `kith index add ~/notes`")
            p = Path(path).expanduser()
            if not p.is_dir():
                raise CorpusError("root-not-found",
                                  f"{os.path.abspath(p)} does not exist or is not a folder.")
            real = p.resolve()
            if not ingest._utf8_name(str(real)):
                raise CorpusError("root-path-invalid", f"{ascii(str(real))[1:-1]}: its path holds bytes that "
                                  "are not UTF-8, which no source id can carry.")
            broad = too_broad(real)
            if broad is not None and not force:
                raise CorpusError("root-too-broad", f"{real} is {broad}: indexing it would read "
                                  "everything below it (virtualenvs, caches, other people's files).")
            copies = self._copies_dir()
            if real.is_relative_to(copies):  # a folder holding it holds a Kith home, which a sync skips
                raise CorpusError("root-is-copy", f"{real} is in {copies}, where this node keeps its copies of peers' corpora: a copy is never "
                                  "this node's own corpus (it would be shared onward)",
                                  hint="add the folder your own files are in; a peer's copy is searched with "
                                       "`kith ask --peer NAME --copy`")
            base = real.name or "root"
            with self.record.tx():
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

    def _copies_dir(self) -> Path:
        """``<home>/copies/`` resolved (it need not exist): no root lies in it."""
        from node.common.home import COPIES_DIR

        return (self.home / COPIES_DIR).resolve()

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
        with self.record.lock:
            db = self.record.require_writable()
            root = next((r for r in self.roots() if r.prefix == prefix), None)
            if root is None:
                raise CorpusError("root-unknown", f"No source root has the prefix /{prefix}/.",
                                  hint="`kith index status` lists the roots")
            with self.record.writing():
                rows = db.execute("SELECT doc_id, chunk_count FROM documents WHERE root_prefix=? "
                                  "AND origin != 'record'", (prefix,)).fetchall()
                chunks = db.execute("SELECT COUNT(*) FROM chunks c JOIN documents d ON "
                                    "d.doc_id = c.doc_id WHERE d.root_prefix=? AND d.origin != 'record'",
                                    (prefix,)).fetchone()[0]
                with self.record.tx():
                    for (doc_id, _n) in rows:
                        db.execute("DELETE FROM chunks WHERE doc_id=?", (doc_id,))
                        db.execute("DELETE FROM documents WHERE doc_id=?", (doc_id,))
                        db.execute("INSERT INTO changes(doc_id, op) VALUES (?, 'remove')", (doc_id,))
                    db.execute("DELETE FROM roots WHERE prefix=?", (prefix,))
                    db.execute("INSERT OR REPLACE INTO removed_prefixes(prefix, removed_at) VALUES (?, ?)",
                               (prefix, ingest.now_rfc3339()))
                assert self.record.writer is not None
                for (doc_id, _n) in rows:
                    self.record.writer.delete_documents_by_term("doc_id", doc_id)
                self.record.commit_index()
            if self.views is not None:
                self.views.clear()
            self._publish()
            return {"prefix": prefix, "path": root.path, "documents": len(rows), "chunks": chunks}

    def configure_root(self, prefix: str, *, chunker: str | None = None,
                       chunk_size: int | None = None, chunk_overlap: int | None = None) -> Root:
        """Change a root's chunker settings; its documents are re-chunked by the next sync.

        The merged settings are checked as a pair (an overlap legal alone may not be
        legal with the root's size), before anything is stored.

        Raises:
            CorpusError: ``root-unknown``, ``chunking-invalid``, ``corpus-readonly``.
        """
        with self.record.lock:
            db = self.record.require_writable()
            current = next((r for r in self.roots() if r.prefix == prefix), None)
            if current is None:
                raise CorpusError("root-unknown", f"No source root has the prefix /{prefix}/.",
                                  hint="`kith index status` lists the roots")
            new = Root(prefix=current.prefix, path=current.path,
                       chunker=current.chunker if chunker is None else chunker,
                       chunk_size=current.chunk_size if chunk_size is None else chunk_size,
                       chunk_overlap=(current.chunk_overlap if chunk_overlap is None
                                      else chunk_overlap))
            _check_chunking(new.chunker, new.chunk_size, new.chunk_overlap)
            with self.record.tx():
                db.execute("UPDATE roots SET chunker=?, chunk_size=?, chunk_overlap=? WHERE prefix=?",
                           (new.chunker, new.chunk_size, new.chunk_overlap, prefix))
            return new

    def roots(self) -> list[Root]:
        """The registered roots, in the order they were added (:meth:`Record.roots
        <node.corpus.record.Record.roots>`)."""
        return self.record.roots()

    def source_ids(self) -> list[str]:
        """The canonical source id of every document in the record (any status; archive
        members included), sorted — what ``kith policy set|check`` measure a rule against.
        ``[]`` when there is no corpus yet."""
        with self.record.lock:
            if self.record.db is None:
                return []
            try:
                return [r[0] for r in self.record.db.execute("SELECT source_id FROM documents ORDER BY source_id")]
            except sqlite3.OperationalError:
                return []

    def hold_writer(self) -> None:
        """Take the writer lock now and keep it until :meth:`close` (``kith index watch``,
        ``kith host --watch``); start-up repair of the index runs here.

        Raises:
            CorpusError: ``index-locked`` (naming the owner), ``corpus-readonly``.
        """
        self.record.hold_writer()

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
        with self.record.lock:
            with self.record.writing():
                report = ingest.run_sync(self, progress, mode, self.archive_limits, timings)
                # what the last sync did not index, and why: `kith index status` lists it
                skipped = [*report.get("skippedSources", []), *report.get("skippedFolders", [])]
                self.record.set_meta("last_sync_skipped", json.dumps(skipped[:ingest.MAX_SKIPPED_LISTED]))
            self._publish()
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
        with self.record.lock:
            with self.record.writing():
                report = ingest.Sync(self, None, "new_only", self.archive_limits).run_paths(paths)
            self._publish()
            return report

    def import_records(self, path: str | Path, *, kind: str, instance: str,
                       replace: bool = False) -> dict[str, Any]:
        """Import datasource records from a JSON Lines file (DESIGN §9); see
        :func:`node.corpus.datasource.import_jsonl` for the record rules.

        Raises:
            CorpusError: ``import-invalid``, ``import-not-found``, ``index-locked``,
                ``corpus-readonly``.
        """
        from node.corpus import datasource

        with self.record.lock:
            self.record.require_writable()
            datasource.check_names(kind, instance, {r.prefix for r in self.roots()})
            with self.record.writing():
                report = datasource.import_jsonl(self, Path(path), kind=kind, instance=instance,
                                                 replace=replace)
            self._publish()
            return report

    # -- search -----------------------------------------------------------------------------
    def _publish(self) -> None:
        """Publish the generation a write just made, when this handle has searched (a
        ``kith index sync`` never builds one). Callers hold the lock; a writer that left no
        readable index leaves none: the next search says ``index-unavailable``."""
        if self.snapshots.current is None:
            return
        try:
            self.snapshots.publish()
        except CorpusError:
            self.snapshots.current = None

    def snapshot(self) -> Generation:
        """The index generation a search reads (:meth:`node.corpus.snapshot.Snapshots.take`):
        taken without waiting for a writer of this process, except when there is none yet.

        Raises:
            CorpusError: ``index-unavailable``.
        """
        gen = self.snapshots.take()
        assert gen is not None  # taken with wait: a generation, or CorpusError
        return gen

    def lens_basis(self) -> tuple[int, list[str]]:
        """What a :class:`node.corpus.lens.Lens` is decided over: ``(generation, source
        ids)`` of the ``done`` documents holding chunks, at the published index
        generation searches read (:meth:`snapshot`; its ids listed once per generation,
        without the lock), or — when no index can be searched yet — at the record's
        current generation (:func:`node.corpus.views.generation`, read under the lock;
        kept until it moves).

        Raises:
            CorpusError: ``index-unavailable`` (no record).
        """
        from node.corpus import views

        try:
            gen = self.snapshot()
        except CorpusError:
            gen = None
        if gen is not None:
            ids = gen.lens_ids
            if ids is None:
                ids = gen.lens_ids = [d.source_id for d in gen.docs.values() if d.chunk_count > 0]
            return gen.number, ids
        with self.record.lock:
            db = self.record.db
            if db is None:
                raise CorpusError("index-unavailable", "The index is not available yet.")
            gen = views.generation(db)
            kept = self._lens_basis
            if kept is None or kept[0] != gen:
                ids = [r[0] for r in db.execute(
                    "SELECT source_id FROM documents WHERE status = 'done' AND chunk_count > 0")]
                kept = self._lens_basis = (gen, ids)
            return kept

    def generation(self, wait: bool = True) -> int | None:
        """The generation searches read now: the number of the published index generation
        (:attr:`node.corpus.snapshot.Generation.number`, taken like a search takes it,
        without the corpus lock once one is published), or — when no index can be searched
        yet — the record's current generation (:func:`node.corpus.views.generation`, read
        under the lock; 0 without a record). With ``wait`` False the lock is only tried
        (an event loop never waits for a sync holding it): None when it is busy."""
        from node.corpus import views

        try:
            gen = self.snapshots.take(wait)
        except CorpusError:
            gen = None
        else:
            if gen is None:
                return None  # none published yet, and a writer of this process is busy
        if gen is not None:
            return gen.number
        if not self.record.lock.acquire(blocking=wait):
            return None
        try:
            return views.generation(self.record.db) if self.record.db is not None else 0
        finally:
            self.record.lock.release()

    def warm_view(self, lens: Lens) -> int:
        """Build (or bring up to date) the index of the view ``lens`` now, so its first
        search does not pay for it (a host warms its guests' views at start and after
        each change, node/host/warm.py). A view that needs a new index is built
        outside the corpus lock (:meth:`node.corpus.views.Views.prepare`): searches of
        other views go on meanwhile.

        Returns:
            The number of documents in the view.

        Raises:
            CorpusError: ``index-unavailable`` (no corpus or no index yet).
        """
        self.prepare_view(lens)
        with self.record.lock:
            return len(self.view(lens).docs)

    def prepare_view(self, lens: Lens) -> bool:
        """Build the view of ``lens`` outside the corpus lock when it needs a new index
        (:meth:`node.corpus.views.Views.prepare`; every lens search calls it before taking
        the lock). Returns True when an index was built.

        Raises:
            CorpusError: ``index-unavailable``.
        """
        return self._views().prepare(self.record, lens)

    def view_ready(self, lens: Lens) -> bool:
        """Is the view of ``lens`` served now without building or updating an index (the
        main index, or a kept view index current with the record)? Nothing is built."""
        with self.record.lock:
            if self.record.db is None:
                return False
            views = self._views()
            return views.served(views.visible_docs(self.record.db, lens),
                                self.record.main_searcher_for) is not None

    def view_builds(self) -> int:
        """How many view indexes this handle has built from scratch (not counting updates
        of a kept one): what shows that a view was warmed before its first question."""
        with self.record.lock:
            return self.views.builds if self.views is not None else 0

    def _views(self) -> Any:
        from node.corpus import views

        with self.record.lock:
            if self.views is None:
                self.views = views.Views()
            return self.views

    def view(self, lens: Lens) -> Any:
        """The :class:`node.corpus.views.ViewIndex` of the documents ``lens`` lets a view
        see, current with the record (callers hold ``record.lock``; what is not built yet
        is built here, under it: call :meth:`warm_view` first to build outside it).

        Raises:
            CorpusError: ``index-unavailable`` (from :meth:`Record.searcher
                <node.corpus.record.Record.searcher>`, when the view sees the whole corpus
                and is served by the main index).
        """
        assert self.record.db is not None
        return self._views().index_for(self.record.db, lens, self.record.main_searcher_for)

    def chunk_evidence(self, chunk_ids: list[str]) -> dict[str, Any]:
        """What a signed citation needs of served chunks (node/answer/citation.py):
        ``{chunk id: (content hash of its document as indexed, char_start, char_end,
        its document's source id as stored)}`` for the ids of ``done`` documents (offsets
        None on a record indexed before they were kept). Missing ids are left out; ``{}``
        without a record. At most 100 ids."""
        ids = [c for c in dict.fromkeys(chunk_ids) if isinstance(c, str)][:100]
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        with self.record.lock:
            if self.record.db is None:
                return {}
            try:
                rows = self.record.db.execute(
                    "SELECT c.chunk_id, c.char_start, c.char_end, d.content_hash, d.source_id FROM chunks c "
                    f"JOIN documents d ON d.doc_id = c.doc_id WHERE c.chunk_id IN ({marks}) "
                    "AND d.status = 'done'", ids).fetchall()
            except sqlite3.OperationalError:  # an older record without the offset columns
                rows = [(r[0], None, None, r[1], r[2]) for r in self.record.db.execute(
                    "SELECT c.chunk_id, d.content_hash, d.source_id FROM chunks c JOIN documents d "
                    f"ON d.doc_id = c.doc_id WHERE c.chunk_id IN ({marks}) AND d.status = 'done'",
                    ids)]
        return {r[0]: (r[3], r[1], r[2], r[4]) for r in rows if r[3]}

    def done_documents(self) -> list[tuple[str, str]]:
        """``(source id as stored, content hash)`` of every ``done`` document holding
        chunks, by source id (a copy's manifest, node/answer/copies.py). ``[]`` without a
        record."""
        with self.record.lock:
            if self.record.db is None:
                return []
            rows = self.record.db.execute(
                "SELECT source_id, content_hash FROM documents WHERE status = 'done' "
                "AND chunk_count > 0 AND content_hash IS NOT NULL ORDER BY source_id").fetchall()
        return [(r[0], r[1]) for r in rows]

    def document_text(self, source_id: str) -> tuple[str, str] | None:
        """``(content hash, text)`` of one ``done`` document as indexed: its chunks put back
        at their character offsets in the normalised text (overlaps written once), or
        joined by blank lines on a record without offsets. None when it is not ``done``."""
        with self.record.lock:
            if self.record.db is None:
                return None
            row = self.record.db.execute(
                "SELECT doc_id, content_hash FROM documents WHERE source_id = ? AND status = 'done'",
                (source_id,)).fetchone()
            if row is None or not row[1]:
                return None
            chunks = self.record.db.execute(
                "SELECT text, char_start, char_end FROM chunks WHERE doc_id = ? ORDER BY ordinal",
                (row[0],)).fetchall()
        if not chunks:
            return None
        if all(isinstance(c[1], int) and isinstance(c[2], int) and c[2] - c[1] == len(c[0]) for c in chunks):
            parts: list[str] = []
            end = 0
            for text, start, stop in sorted(chunks, key=lambda c: c[1]):
                if stop <= end:
                    continue
                if start > end:
                    parts.append("\n" * min(start - end, 2))
                    end = start
                parts.append(text[end - start:])
                end = stop
            return row[1], "".join(parts)
        return row[1], "\n\n".join(c[0] for c in chunks)

    def content_hashes(self, source_ids: list[str]) -> dict[str, str]:
        """``{source id: content hash as indexed}`` of the ``done`` documents among
        ``source_ids`` (stored ids; a canonical id differs only in Unicode normalisation,
        so both NFC and the id as given are looked up). ``{}`` without a record."""
        import unicodedata

        wanted: dict[str, str] = {}
        for sid in source_ids[:256]:
            if isinstance(sid, str):
                wanted.setdefault(sid, sid)
                wanted.setdefault(unicodedata.normalize("NFD", sid), sid)
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        with self.record.lock:
            if self.record.db is None:
                return {}
            rows = self.record.db.execute(
                f"SELECT source_id, content_hash FROM documents WHERE source_id IN ({marks}) "
                "AND status = 'done'", list(wanted)).fetchall()
        return {wanted[r[0]]: r[1] for r in rows if r[1]}

    def search_hits(self, query: str, *, limit: int, filters: dict[str, Any] | None = None,
                    deadline: float | None = None,
                    max_per_document: int = search.MAX_PER_DOCUMENT,
                    lens: Lens | None = None,
                    ) -> tuple[list[Hit], dict[str, Any]]:
        """Search the corpus as one view sees it (no policy here: the gate makes the
        view's lens and screens the hits).

        Args:
            query: user text (any characters; never parsed by tantivy's query parser).
            limit: number of hits wanted (1–100).
            filters: normalized filters from :func:`node.answer.contract.validate`
                (``sources`` globs; metadata filters fail closed, DESIGN §9).
            deadline: ``time.monotonic()`` instant after which no further pass starts.
            max_per_document: document-level dedup cap (default 2).
            lens: the view (:class:`node.corpus.lens.Lens`: the sources it may see or
                be asked about, the ``ask`` tier, and their scrub kinds); None = the
                owner's view. See :func:`node.corpus.retrieval.run_search`: with a lens
                the search runs on the view's own index, so candidates and scores depend
                only on the documents the view may see.

        Returns:
            ``(hits, controller)``: hits best first, sorted by (−score, chunk_id), every
            score > 0 (score = reciprocal-rank-fusion value; raw per-pass scores in
            ``score_components``). ``controller`` is the local ``retrievalController``
            report: ``mode``, ``passes`` [{name, status, candidates}], ``fusion``,
            ``maxPerDocument``, counts (``candidates``, ``orphaned``, ``filteredOut``,
            ``withheldStale``, ``dedupedPerDocument``, ``collapsedDuplicates``,
            ``returned``), ``rounds``,
            ``earlyStop``, ``stopReason``, ``indexLag``, ``subqueries``. Its counts are
            for local diagnostics only (envelope.py copies none of them). The passes,
            fusion and early stop are :func:`node.corpus.retrieval.run_search`'s.

        Raises:
            CorpusError: ``query-invalid`` (empty query / bad limit), ``index-unavailable``.
        """
        from node.corpus import retrieval  # the multi-pass controller (issue 4)

        return retrieval.run_search(self, query, limit=limit, filters=filters,
                                    deadline=deadline, max_per_document=max_per_document,
                                    lens=lens)

    # -- stats ------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counts and readiness.

        Returns:
            ``{"roots", "documents", "done", "chunks", "failed", "empty", "processing",
            "stale": int, "ready": bool, "last_sync": str | None, "index_lag": int,
            "sync_running": bool, "interrupted": bool, "index_missing": bool,
            "index_unreadable": bool, "record_lost": bool}``;
            ``ready`` is True when a sync has completed, the index is present and of
            the current schema, and it holds every change of the record
            (``index_lag`` 0: false while a sync is writing or after a crash left
            tantivy behind SQLite). ``sync_running``: a live process holds the writer
            lock (:func:`node.common.home.lock_active`, a probe that never takes it).
            ``interrupted``: no writer is running yet documents are still
            ``processing``, the index lags the record, or documents exist and no sync
            ever completed — a sync was killed; the next ``kith index sync`` finishes
            it. ``index_missing``: a sync completed but the tantivy folder is gone (or
            holds no index: emptied, recreated by hand) —
            ``kith index sync`` rebuilds it from the record; ``index_unreadable``: the folder
            holds an index tantivy cannot open (a damaged ``meta.json`` or segment file),
            ``index_missing`` then too. ``record_lost``: no record
            (``corpus.sqlite3`` deleted or empty) beside an index built from one — its
            folders and documents are lost; they are added again. Never raises for a missing
            corpus (all zero, not ready).
        """
        with self.record.lock:
            out: dict[str, Any] = {"roots": 0, "documents": 0, "done": 0, "chunks": 0,
                                   "failed": 0, "empty": 0, "processing": 0, "stale": 0,
                                   "ready": False, "last_sync": None, "index_lag": 0,
                                   "sync_running": False, "interrupted": False, "index_missing": False,
                                   "index_unreadable": False, "record_lost": False}
            # the record deleted or emptied while the index built from it is still here: its
            # roots and documents are gone (nothing rebuilds them), said by `kith index status`
            out["record_lost"] = self.record.get_meta("schema_version") is None and \
                _index_present(self.index_dir)
            if self.record.db is None:
                return out
            db = self.record.db
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
                applied = int(self.record.get_meta("index_applied_seq") or 0)
                top = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
                out["index_lag"] = max(0, top - applied)
            except sqlite3.OperationalError:
                return out
            out["last_sync"] = self.record.get_meta("last_sync")
            present = _index_present(self.index_dir)
            # a file of the index that is garbage (meta.json, a segment): tantivy cannot open
            # it, search is index-unavailable, and the next writer rebuilds it
            out["index_unreadable"] = present and not _index_opens(self.index_dir)
            out["ready"] = bool(
                out["last_sync"] and not out["index_lag"]
                and self.record.get_meta("index_schema_version") == str(search.INDEX_SCHEMA_VERSION)
                and present and not out["index_unreadable"])
            # a record that was synced but whose tantivy folder is gone (or cannot be read):
            # `kith index sync` rebuilds it from the record (nothing is read from the sources again)
            out["index_missing"] = bool(out["last_sync"]) and not (present and not out["index_unreadable"])
            out["sync_running"] = self.record.writer is not None or lock_active(self.lock_path)
            out["interrupted"] = not out["sync_running"] and bool(
                out["processing"] or out["index_lag"]
                or (out["documents"] and not out["last_sync"]))
            return out

    def index_lag(self) -> int:
        """Changes the record holds that the tantivy index does not (0 when current or
        when there is no corpus; :meth:`Record.index_lag <node.corpus.record.Record.index_lag>`)."""
        return self.record.index_lag()

    def index_outdated(self) -> bool:
        """True when the index was built by another Kith than this one and a sync would
        rebuild it: the tantivy index is of another
        :data:`node.corpus.search.INDEX_SCHEMA_VERSION` (what :meth:`repair_lag` and every
        writer rebuild from the record), or a ``done`` document was chunked under another
        chunker signature than its root's now (:attr:`node.corpus.ingest.DocRef.sig`: the
        chunker, :data:`node.corpus.chunking.CHUNKER_VERSION` and the root's chunk sizes —
        what :meth:`sync` re-chunks). False for a corpus never indexed (a lag, not an old
        index) and when there is no corpus. Never raises for a missing or unreadable record.
        """
        with self.record.lock:
            if self.record.db is None:
                return False
            try:
                built = self.record.get_meta("index_schema_version")
                if built is not None and built != str(search.INDEX_SCHEMA_VERSION):
                    return True
                for root in self.roots():
                    sig = ingest.file_ref(root, "").sig
                    if self.record.db.execute(
                            "SELECT 1 FROM documents WHERE root_prefix = ? AND status = 'done' "
                            "AND chunker_sig IS NOT ? LIMIT 1", (root.prefix, sig)).fetchone():
                        return True
            except sqlite3.Error:
                return False
            return False

    def index_syncing(self) -> bool:
        """True while the index is not settled: no sync has completed yet (a first sync
        may be running) or the index lags the record (:meth:`index_lag` > 0: a sync is
        writing, or a crash left changes to replay). Depends on index state only."""
        with self.record.lock:
            if self.record.db is None:
                return False
            return self.record.get_meta("last_sync") is None or self.index_lag() > 0

    def repair_lag(self, say: Callable[[str], None] | None = None) -> str:
        """Replay the changes the index lacks now, if the writer lock is free — without
        waiting for it (DESIGN §9 start-up repair, for read-only openers: the host,
        ``kith api serve``, ``kith mcp``) — and rebuild an index of an older
        :data:`node.corpus.search.INDEX_SCHEMA_VERSION` from the record (``say(line)``:
        once that it does, then its progress every
        :data:`node.corpus.record.REBUILD_STEP` chunks). The handle stays read-only for
        everything else.

        Returns:
            ``"current"`` (nothing to repair), ``"repaired"`` (replayed or rebuilt),
            ``"locked"`` (another process holds the writer; it replays the changes
            itself — callers warn), or ``"unavailable"`` (no corpus).

        Raises:
            CorpusError: only for a corrupt index the writer cannot open.
        """
        with self.record.lock:
            if self.record.db is None:
                return "unavailable"
            built = self.record.get_meta("index_schema_version")
            old = built is not None and built != str(search.INDEX_SCHEMA_VERSION)
            if self.record.writer is not None or (self.index_lag() == 0 and not old):
                return "current"
            if built is None:
                return "current"  # never indexed: `kith index sync` builds it
            progress = None
            if old and say is not None:
                say(f"the corpus index was built by an older Kith (index schema {built}); rebuilding it "
                    f"for schema {search.INDEX_SCHEMA_VERSION} from the record")

                def progress(done: int, total: int) -> None:
                    say(f"rebuilding the corpus index: {done:,}/{total:,} chunks")
            try:
                # non-blocking flock; replays the change log, or rebuilds an older schema
                self.record.acquire_writer(progress)
            except CorpusError as exc:
                if exc.code == "index-locked":
                    return "locked"
                raise
            self.record.release_writer()
            self.record.index = None  # reopened (and reloaded) by the next search
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
        with self.record.lock:
            db = self.record.db
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
                    out["skippedSources"] = json.loads(self.record.get_meta("last_sync_skipped") or "[]")[:max_listed]
                except ValueError:
                    out["skippedSources"] = []
            except sqlite3.OperationalError:
                return out
        return out
