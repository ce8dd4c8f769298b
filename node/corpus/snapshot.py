"""Index generations: what one search reads, immutable, taken at its start (issue 44).

A :class:`Generation` is a tantivy searcher of the main index (a point-in-time view of its
segments) plus the ``done`` documents of the SQLite record as they were when the
generation was published: everything a hit needs of its document (source id, root and
relative path, the recorded size, mtime and content hash, indexing time, metadata,
origin) is read from it, not from SQLite. A chunk's own fields (text, line and page span,
heading path, what it defines) live in the :class:`ChunkTable`: a chunk id is derived from
its document's source id, content hash and chunker signature
(:func:`node.corpus.ingest.chunk_id_for`), so a chunk row never changes while it exists
and an entry read once is good for every later generation; each entry also carries the
content hash of its document when it was read, and a hit is served only when that hash
is the generation's (never the text of one version under the hash of another).

A search takes :meth:`node.corpus.store.Corpus.snapshot` once and reads only it: it never
takes the corpus lock (the writer's, ``Record.lock``), so searches of many guests run at
once and none waits for a sync. Writers publish: a sync, a watch batch, an import or a
root's removal in this process builds the next generation when it is done and swaps it
in with one assignment (:meth:`Snapshots.publish`); a commit by another process (``kith
index sync`` beside ``kith host``) is noticed by the next search from tantivy's
``meta.json`` (one ``stat``) and published by that search when no writer of this process
holds the lock — while one does, searches keep the generation they have. A peer's view
(:mod:`node.corpus.views`) is resolved once per (lens, generation) under the lock and
kept in the generation (:meth:`Snapshots.view_at`); its searcher and visible documents
are captured then, so an in-place update of its RAM index by a later generation never
reaches a search running on this one.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable
from typing import Any, NamedTuple
from node.common.kept import make_room

#: Chunk entries kept by a :class:`ChunkTable` (about 1-2 KB each: the chunk's text);
#: the table is emptied when full. A chunk not kept is read from SQLite in one batch
#: with the other chunks of the answer that are not.
CHUNKS_KEPT = 20_000


class DocEntry(NamedTuple):
    """A ``done`` document as a generation holds it (its ``documents`` row)."""

    source_id: str
    root_prefix: str
    rel_path: str
    size: int | None
    mtime_ns: int | None
    content_hash: str | None
    indexed_at: str | None
    metadata: dict[str, Any]
    origin: str
    parent_doc_id: str | None
    chunk_count: int


class ChunkEntry(NamedTuple):
    """A chunk as the :class:`ChunkTable` holds it: ``location`` is the citation location
    (``lineStart``, ``lineEnd``, ``headingPath`` [+ ``page``, ``pageEnd``]; treat as
    read-only), ``headings`` the stored heading path, ``content_hash`` its document's
    content hash when the row was read."""

    doc_id: str
    text: str
    location: dict[str, Any]
    headings: list[str]
    content_hash: str | None


def location_of(line_start: Any, line_end: Any, heading_path: str, page_start: Any,
                page_end: Any, defines: str | None) -> tuple[dict[str, Any], list[str]]:
    """``(citation location, stored heading path)`` of a chunk row: line range, heading
    path, and the page range for a PDF (``page``/``pageEnd``, 1-based). A chunk that
    defines a named object (a reST/Sphinx directive, :attr:`node.corpus.chunking.Chunk.defines`)
    shows the first one at the end of its heading path (``[..., "textwrap.dedent"]``)."""
    headings = json.loads(heading_path or "[]")
    path = list(headings)
    named = [d for d in json.loads(defines or "[]") if d not in path]
    if named:
        path.append(named[0])
    loc: dict[str, Any] = {"lineStart": line_start, "lineEnd": line_end, "headingPath": path}
    if page_start is not None:
        loc["page"] = page_start
        loc["pageEnd"] = page_end
    return loc, headings


class ChunkTable:
    """Chunk entries by chunk id, read through from the record on a read-only SQLite
    connection of the reading thread (WAL: never blocked by a writer, never inside a
    writer's transaction); at most :data:`CHUNKS_KEPT` kept. Thread-safe; :meth:`close`
    closes every thread's connection."""

    def __init__(self, uri: str) -> None:
        self.uri = uri  # the record's reading_uri
        self._kept: dict[str, ChunkEntry] = {}
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.uri, uri=True, timeout=10.0,
                                 check_same_thread=False)  # closed by close(), from any thread
            db.execute("PRAGMA busy_timeout=10000")
            self._local.db = db
            with self._lock:
                self._opened.append(db)
        return db

    def index_lag(self) -> int:
        """Changes the record holds that the tantivy index does not, now (read on this
        thread's own connection, never under the corpus lock; 0 when unreadable). What
        marks an answer ``indexSyncing`` while a writer is at work. The two key lookups
        run only when SQLite's ``PRAGMA data_version`` says another connection committed
        since this thread last read them (one pragma instead of two queries per answer)."""
        try:
            db = self._db()
            version = db.execute("PRAGMA data_version").fetchone()[0]
            kept = getattr(self._local, "lag", None)
            if kept is not None and kept[0] == version:
                return kept[1]
            row = db.execute("SELECT value FROM meta WHERE key = 'index_applied_seq'").fetchone()
            top = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
        except sqlite3.Error:
            return 0
        lag = max(0, int(top) - int(row[0] if row else 0))
        self._local.lag = (version, lag)
        return lag

    def close(self) -> None:
        """Close the connections of every thread and forget the entries (the corpus is
        closing; a later read opens a connection again). Idempotent."""
        with self._lock:
            opened, self._opened = self._opened, []
            self._local = threading.local()
        for db in opened:
            db.close()
        self._kept = {}

    def get_many(self, chunk_ids: Iterable[str]) -> dict[str, ChunkEntry]:
        """``{chunk id: entry}`` for the ids that are in the record (missing ids left
        out)."""
        kept = self._kept
        out: dict[str, ChunkEntry] = {}
        todo = []
        for cid in chunk_ids:
            entry = kept.get(cid)
            if entry is None:
                todo.append(cid)
            else:
                out[cid] = entry
        if not todo:
            return out
        read: dict[str, ChunkEntry] = {}
        db = self._db()
        for i in range(0, len(todo), 500):
            part = todo[i:i + 500]
            for (cid, did, text, ls, le, hp, ps, pe, defines, chash) in db.execute(
                    "SELECT c.chunk_id, c.doc_id, c.text, c.line_start, c.line_end, "
                    "c.heading_path, c.page_start, c.page_end, c.defines, d.content_hash "
                    "FROM chunks c JOIN documents d ON d.doc_id = c.doc_id "
                    f"WHERE c.chunk_id IN ({','.join('?' * len(part))})", part):
                loc, headings = location_of(ls, le, hp, ps, pe, defines)
                read[cid] = ChunkEntry(did, text, loc, headings, chash)
        make_room(kept, len(read), CHUNKS_KEPT)
        kept.update(read)
        out.update(read)
        return out


class ViewAt:
    """A peer's view as the searches of one generation see it: the searcher and visible
    documents captured when it was resolved (``index``: the
    :class:`node.corpus.views.ViewIndex`; the dense pass's mask cache is its)."""

    __slots__ = ("index", "docs", "scrubbed", "_searcher", "queries")

    def __init__(self, index: Any) -> None:
        self.index = index
        self.docs = index.docs
        self.scrubbed = index.scrubbed
        self._searcher = index.searcher()
        #: pass queries built for this view's searcher (:func:`node.corpus.retrieval.pass_queries`)
        self.queries: dict[tuple[Any, ...], Any] = {}

    def searcher(self) -> Any:
        """The view's searcher at this generation."""
        return self._searcher

    @property
    def chunk_ids(self) -> Any:
        return self.index.chunk_ids

    @chunk_ids.setter
    def chunk_ids(self, value: Any) -> None:
        self.index.chunk_ids = value

    @property
    def masks(self) -> Any:
        return self.index.masks

    @masks.setter
    def masks(self, value: Any) -> None:
        self.index.masks = value


class Generation:
    """One published index generation (immutable once published; module docstring).

    Attributes:
        stamp: tantivy's ``meta.json`` ``(inode, size, mtime_ns)`` the searcher was
            opened at (None when it could not be read).
        searcher: the main index's searcher. schema: its schema.
        number: the record's generation (:func:`node.corpus.views.generation`).
        index_lag: changes the record held that the index did not (at publication).
        docs: ``{doc_id: DocEntry}`` of every ``done`` document.
        roots: the registered roots (:class:`node.corpus.types.Root`).
        chunks: the corpus's :class:`ChunkTable` (shared by its generations).
        views: ``{lens key: ViewAt}`` resolved for this generation.
        dense_on: the owner's ``dense_enabled`` switch when it was published
            (:func:`node.corpus.dense.enabled`; a switch by any process makes the next
            search publish a new generation: :meth:`node.corpus.record.Record.settings_changed`).
        lens_ids: the source ids of its ``done`` documents holding chunks, once asked
            (:meth:`node.corpus.store.Corpus.lens_basis`).
        queries: the pass queries built for its searcher, by question and tunables
            (:func:`node.corpus.retrieval.pass_queries`).
    """

    __slots__ = ("stamp", "searcher", "schema", "number", "index_lag", "docs", "roots",
                 "chunks", "views", "dense_on", "lens_ids", "_origins", "queries")

    def __init__(self, stamp: Any, searcher: Any, schema: Any, number: int, index_lag: int,
                 docs: dict[str, DocEntry], roots: list[Any], chunks: ChunkTable,
                 dense_on: bool = False) -> None:
        self.stamp, self.searcher, self.schema = stamp, searcher, schema
        self.number, self.index_lag, self.docs, self.roots = number, index_lag, docs, roots
        self.chunks, self.dense_on = chunks, dense_on
        self.views: dict[Any, ViewAt] = {}
        self.lens_ids: list[str] | None = None
        self._origins: Any = None
        self.queries: dict[tuple[Any, ...], Any] = {}

    def origins(self) -> Any:
        """The :class:`node.corpus.sources.SourceNormalizer` of the generation's roots,
        their real folders resolved once per generation (the serve-time origin check
        joins a document's relative path to its root's real folder as resolved then: a
        root whose folder was moved, or replaced by a link to another, serves nothing of
        its old documents until the next generation)."""
        if self._origins is None:
            from node.corpus import sources

            self._origins = sources.SourceNormalizer(self.roots)
        return self._origins


def read_docs(db: sqlite3.Connection) -> dict[str, DocEntry]:
    """``{doc_id: DocEntry}`` of every ``done`` document of the record."""
    out: dict[str, DocEntry] = {}
    for (did, sid, prefix, rel, size, mtime, chash, at, meta, origin, parent, n) in db.execute(
            "SELECT doc_id, source_id, root_prefix, rel_path, size, mtime_ns, content_hash, "
            "indexed_at, metadata, origin, parent_doc_id, chunk_count FROM documents "
            "WHERE status = 'done'"):
        out[did] = DocEntry(sid, prefix, rel, size, mtime, chash, at,
                            json.loads(meta or "{}"), origin, parent, n)
    return out


def _stamp(record: Any, path: str | None = None) -> tuple[int, ...] | None:
    """tantivy's ``meta.json`` ``(inode, size, mtime_ns)`` (``path``: its path when the
    caller has it as a string, saving the join), or None when it cannot be read."""
    try:
        st = os.stat(path or (record.index_dir / "meta.json"))
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class Snapshots:
    """The generations of one :class:`node.corpus.store.Corpus` handle: the current one,
    replaced by one assignment (module docstring)."""

    def __init__(self, record: Any) -> None:
        self.record = record
        self.chunks = ChunkTable(record.reading_uri)
        self.current: Generation | None = None
        self._meta = os.fspath(record.index_dir / "meta.json")  # stat'ed by every search

    def publish(self) -> Generation:
        """Build the generation of the record and index as they are now and make it the
        current one. Callers hold ``record.lock``.

        Raises:
            CorpusError: ``index-unavailable`` (:meth:`Record.searcher
                <node.corpus.record.Record.searcher>`'s rules).
        """
        from node.corpus import dense, views

        record = self.record
        searcher = record.searcher()  # the index first: the record holds at least its chunks
        db = record.db
        assert db is not None
        db.execute("BEGIN")  # one read transaction: the documents, the lag and the number agree
        try:
            docs = read_docs(db)
            number = views.generation(db)
            lag = record.index_lag()
            roots = record.roots()
            dense_on = dense.enabled_in(record)
        finally:
            db.execute("COMMIT")
        stamp = record._reader[0] if record._reader is not None else None
        gen = Generation(stamp, searcher, record.index.schema, number, lag, docs, roots,
                         self.chunks, dense_on)
        self.current = gen
        return gen

    def take(self, wait: bool = True) -> Generation | None:
        """The generation a search starts from: the current one, or a new one when the
        index was committed since (by another process) and no writer of this process
        writes (while one does, the current one is kept: the writer publishes when it is
        done). Waits for the lock when there is no generation yet, or — with ``wait`` —
        while what holds it is not a write (``stats()``, a view warmed: brief): the
        current generation may hold what the other process removed (a root, an ignored
        file), whose unchanged files its origin check would serve. Without ``wait`` the
        lock is only tried: the current generation (None: none published yet) while
        it is busy.

        Raises:
            CorpusError: ``index-unavailable``.
        """
        gen = self.current
        if gen is not None and gen.stamp is not None \
                and gen.stamp == _stamp(self.record, self._meta):
            return gen
        if not self._acquire(gen is None, wait):
            return gen  # a writer of this process is busy (None: none published yet)
        try:
            if self.current is not gen and self.current is not None:
                return self.current  # published meanwhile
            return self.publish()
        finally:
            self.record.lock.release()

    def _acquire(self, first: bool, wait: bool) -> bool:
        """Take ``record.lock`` for publishing: with ``wait``, waiting while no write of
        this process runs (checked every 10 ms, so a write that starts meanwhile is never
        waited for) — or, for the ``first`` generation, for as long as it takes."""
        lock = self.record.lock
        if not wait or first:
            return lock.acquire(blocking=wait)
        while True:
            if lock.acquire(blocking=False):
                return True
            if self.record.writes:
                return False
            if lock.acquire(timeout=0.01):
                return True

    def view_at(self, gen: Generation, lens: Any, corpus: Any) -> tuple[Generation, ViewAt]:
        """``(generation, view)`` for a search through ``lens``: the view resolved for
        ``gen``, or resolved now under the lock (once per lens and generation; when the
        index moved since ``gen`` the search moves to a newly published generation, so the
        view and the documents are of one generation).

        Raises:
            CorpusError: ``index-unavailable``.
        """
        view = gen.views.get(lens.key)
        if view is not None:
            return gen, view
        with self.record.lock:
            current = self.current
            if current is None or current.stamp is None \
                    or current.stamp != _stamp(self.record, self._meta) \
                    or current.index_lag != self.record.index_lag():
                current = self.publish()
            view = current.views.get(lens.key)
            if view is None:
                view = current.views[lens.key] = ViewAt(corpus.view(lens))
            return current, view

