"""Per-view indexes: the index a peer's search runs on (issue 9 item 3; specs/policy.md
"What a peer's scores are computed over").

A peer may only be ranked against what it may see. Filtering the whole-corpus tantivy
index is not enough: tantivy's BM25 carries statistics of the *whole* index (the number
of chunks ``N``, each term's document frequency ``n`` per field, each field's average
length ``avgdl``, deleted chunks included until a merge), so a hidden chunk that contains
a query word would still move the score — and, across fields, the order — of a visible
one. A view's search therefore runs on a tantivy index in RAM holding exactly the chunks
of the documents the view may see (same schema, same analyzers, built from the SQLite
record): every statistic tantivy uses is a statistic *of the view*, so nothing hidden can
move what the peer receives — for single-word and multi-word queries alike.

A view is named by a lens (:class:`node.corpus.lens.Lens`: the source ids it may see or be
asked about, and the scrub kinds per source; the egress gate makes it, the corpus never
asks the policy). Its visible document set is evaluated once per (lens key, corpus
generation) — the generation is the change log's sequence, so a sync, a watch batch or an
import makes it current again — and view indexes are shared by every lens that sees the
same set (all anonymous guests share one). At most
:data:`MAX_VIEWS` indexes are kept (least recently used evicted). When the set or the
documents changed, the nearest kept index is brought up to date by document (delete a
changed or removed document, add a changed or new one) instead of being rebuilt, so a
watch batch costs what it changes. Documents deleted that way stay in the view's tantivy
statistics until a merge, exactly like the main index — they are documents the view could
see, never hidden ones.

A scrubbed view (issue 24 item 3; specs/policy.md §9): when the lens scrubs kinds
(:data:`node.common.scrub.KINDS`) from a document (:meth:`Lens.kinds
<node.corpus.lens.Lens.kinds>`), that document's chunks are indexed over their *scrubbed*
text and title (:func:`node.common.scrub.scrub`), so a query for a scrubbed value finds nothing and
nothing scrubbed moves a score. The kinds are part of the document's signature, so a
changed ``[scrub]`` table re-indexes exactly the documents it changes; a chunk whose
scrubbing fails is left out of the view (fail closed). A scrubbed view is never served
by the main index.

Cost: building a view copies its chunks into RAM once (about as fast as ``kith index
sync``'s tantivy part; ``scripts/bench_search`` prints it); a search on it costs what a
search on the main index costs. A view that needs a new index is built *outside* the
corpus lock, on a SQLite connection of its own (:meth:`Views.prepare`, called by
:meth:`Corpus.warm_view <node.corpus.store.Corpus.warm_view>` and before every lens
search), so the owner's and other peers' searches are not held up by it; a host builds
its guests' views before they ask (node/host/warm.py).

A view that sees the whole corpus (every ``done`` document) is served from the main
on-disk index instead, when that index holds exactly the record's chunks: no change
waiting to be applied, no deleted document still counted (tantivy's ``meta.json``), and
as many documents as the record's ``done`` chunks. Its BM25 statistics are then those
the view's own index would have, so nothing changes for the peer (tests/
test_answer_noninterference.py), and a host serving a million chunks to peers that see
everything holds no copy of them in RAM (issue 10 item 5). Otherwise the view gets its
RAM index as above.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tantivy

from node.common.scrub import ScrubFailed, scrub, scrub_cached
from node.corpus import search
from node.corpus.lens import Lens
from node.corpus.record import iter_chunks_for_index

#: View indexes kept per corpus handle (least recently used evicted).
MAX_VIEWS = 4
#: tantivy writer heap for a view index update, bytes (tantivy's floor is 15 MB/thread).
VIEW_WRITER_HEAP = 64_000_000
#: Update a kept view in place when at least this share of its documents survive;
#: otherwise build a new one.
REUSE_OVERLAP = 0.5
#: visible-document sets kept (one per lens key, least recently used dropped).
MAX_LENSES = 32


class _Docs(dict):  # type: ignore[type-arg]
    """A view's ``{doc_id: signature}``; ``whole`` is True when it holds every ``done``
    document of the record at its generation (the view sees the whole corpus);
    ``chunks`` is the sum of its documents' chunk counts; ``scrubbed`` is True when some
    document's signature carries scrub kinds (its 4th item, :func:`scrub_kinds`)."""

    whole = False
    chunks = 0
    scrubbed = False
    key: frozenset[Any] | None = None  # :func:`_view_key`, computed once


def scrub_kinds(signature: tuple[Any, ...] | None) -> frozenset[str]:
    """The scrub kinds a view's document signature carries (empty: indexed as stored)."""
    if signature is None or len(signature) < 4:
        return frozenset()
    return signature[3]


@dataclass
class ViewIndex:
    """One view's RAM index.

    Attributes:
        index: the tantivy index (schema :func:`node.corpus.search.build_schema`).
        docs: ``{doc_id: signature}`` of the documents it holds.
        chunk_ids: the chunk ids it holds (for the dense pass's mask), or None until
            asked for.
        masks: dense-pass masks per vector matrix (``id(matrix) -> (matrix ids, numpy
            bool array)``).
    """

    index: Any
    docs: dict[str, tuple[Any, ...]]
    chunk_ids: set[str] | None = None
    masks: dict[int, Any] = field(default_factory=dict)
    _searcher: Any = None
    #: True when this view is served by the main on-disk index (``index`` is None)
    on_main: bool = False
    #: True when some document of the view is indexed over scrubbed text (module docstring)
    scrubbed: bool = False

    def searcher(self) -> Any:
        """A searcher over the view's current state (made again after each update)."""
        if self._searcher is None:
            self._searcher = self.index.searcher()
        return self._searcher


def generation(db: sqlite3.Connection) -> int:
    """The corpus generation: the last sequence number the change log handed out (every
    indexed, updated or removed document appends to it; it never goes back)."""
    try:
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name='changes'").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row else 0


class Views:
    """The view indexes of one :class:`node.corpus.store.Corpus` handle.

    :meth:`visible_docs`, :meth:`index_for` and :meth:`install` run under the corpus lock
    (``record.lock``); :meth:`prepare` is called *without* it and builds a view that
    needs a new index outside it (on a connection of its own), so other views' searches
    go on meanwhile. One build runs at a time (:attr:`build_lock`)."""

    def __init__(self) -> None:
        #: ``lens key -> (generation, visible docs)`` (at most :data:`MAX_LENSES`, of the
        #: current generation only)
        self._sets: OrderedDict[Any, tuple[int, _Docs]] = OrderedDict()
        self._indexes: OrderedDict[frozenset[Any], ViewIndex] = OrderedDict()
        #: (the visible-docs dict last served, its view): same dict object → same view
        self._last: tuple[dict[str, tuple[Any, ...]], ViewIndex] | None = None
        self._main: ViewIndex | None = None  # the view served by the main index
        #: held while a view index is built outside the corpus lock (one build at a time)
        self.build_lock = threading.Lock()
        #: view indexes built from scratch so far (:meth:`prepare` and :meth:`index_for`)
        self.builds = 0

    def visible_docs(self, db: sqlite3.Connection, lens: Lens) -> dict[str, tuple[Any, ...]]:
        """``{doc_id: signature}`` of the ``done`` documents ``lens`` lets the view see,
        each scrubbed document's signature carrying its kinds (cached per lens key and
        corpus generation: a document indexed after the lens was made is not in it)."""
        gen = generation(db)
        cached = self._sets.get(lens.key)
        if cached is not None and cached[0] == gen:
            self._sets.move_to_end(lens.key)
            return cached[1]
        docs: _Docs = _Docs()
        total = 0
        visible, kinds_of = lens.visible, lens.kinds
        for doc_id, source_id, content_hash, indexed_at, chunks in db.execute(
                "SELECT doc_id, source_id, content_hash, indexed_at, chunk_count FROM "
                "documents WHERE status = 'done' AND chunk_count > 0"):
            total += 1
            if source_id not in visible:
                continue
            kinds = kinds_of(source_id)
            if kinds:
                docs[doc_id] = (content_hash, indexed_at, chunks, kinds)
                docs.scrubbed = True
            else:
                docs[doc_id] = (content_hash, indexed_at, chunks)
            docs.chunks += chunks
        docs.whole = len(docs) == total
        for old in [k for k, (g, _d) in self._sets.items() if g < gen]:
            del self._sets[old]  # sets of an older generation are not served again
        self._sets[lens.key] = (gen, docs)
        while len(self._sets) > MAX_LENSES:
            self._sets.popitem(last=False)
        return docs

    def served(self, docs: _Docs, main: Callable[[int], Any] | None) -> ViewIndex | None:
        """The view of ``docs`` when it needs no index work: the main index (a view of
        every document, unscrubbed), the last one served, or a kept one holding exactly
        ``docs``; else None."""
        if main is not None and docs.whole and not docs.scrubbed:
            searcher = main(docs.chunks)
            if searcher is not None:
                view = self._main
                if view is None or view.docs is not docs or view._searcher is not searcher:
                    view = self._main = ViewIndex(index=None, docs=docs, _searcher=searcher,
                                                  on_main=True)
                return view
        if self._last is not None and self._last[0] is docs:  # the common case: nothing moved
            return self._last[1]
        view = self._indexes.get(_view_key(docs))
        if view is not None and view.docs == docs:
            self._indexes.move_to_end(_view_key(docs))
            self._last = (docs, view)
            return view
        return None

    def index_for(self, db: sqlite3.Connection, lens: Lens,
                  main: Callable[[int], Any] | None = None) -> ViewIndex:
        """The view index holding exactly the chunks ``lens`` may see, current with the
        SQLite record (brought up to date or built here, under the corpus lock, when
        :meth:`prepare` did not already).

        Args:
            main: ``main(chunks) -> searcher | None``: the main index's searcher when it
                holds exactly ``chunks`` live documents and nothing deleted or pending
                (:meth:`node.corpus.record.Record.main_searcher_for`); asked only when
                the view sees every ``done`` document. A view it answers is served from
                the main index (:attr:`ViewIndex.on_main`), not copied into RAM.
        """
        docs = self.visible_docs(db, lens)
        view = self.served(docs, main)
        if view is None:
            view = self._ram_view(db, docs)
        return view

    def prepare(self, record: Any, lens: Lens) -> bool:
        """Make the view of ``lens`` ready before its search takes the corpus lock: a view
        that needs a new index (no kept one holds enough of its documents to be updated)
        is built here *outside* the lock, on a connection of its own, then kept
        (:meth:`install`). Call without holding ``record.lock``.

        Returns:
            True when an index was built here (False: it was ready, or is an update the
            search makes under the lock).

        Raises:
            CorpusError: ``index-unavailable``.
        """
        def needs_build() -> _Docs | None:
            with record.lock:
                record.searcher()  # the same availability rules as a search
                docs = self.visible_docs(record.db, lens)
                if (self.served(docs, record.main_searcher_for) is not None
                        or self._nearest(record.db, docs) is not None):
                    return None  # ready, or an update (proportional to the change) the search makes
                return docs

        if needs_build() is None:  # the common case: no build, and no wait for one
            return False
        with self.build_lock:
            docs = needs_build()  # another thread may have built it meanwhile
            if docs is None:
                return False
            db = sqlite3.connect(record.reading_uri, uri=True, timeout=10.0,
                                 check_same_thread=False)
            try:
                db.execute("PRAGMA busy_timeout=10000")
                view = _build(db, docs)
            finally:
                db.close()
            with record.lock:
                self.builds += 1
                self.install(docs, view)
            return True

    def install(self, docs: _Docs, view: ViewIndex) -> None:
        """Keep ``view``, built for ``docs``, as that visible set's index (under the lock)."""
        key = _view_key(docs)
        self._indexes[key] = view
        self._indexes.move_to_end(key)
        while len(self._indexes) > MAX_VIEWS:
            self._indexes.popitem(last=False)

    def _nearest(self, db: sqlite3.Connection, docs: _Docs) -> frozenset[Any] | None:
        """The key of the kept index sharing the most of its documents with ``docs`` (at
        least :data:`REUSE_OVERLAP`) that may be updated into ``docs``, or None: not one
        that would keep counting a document the view may no longer see (:func:`_would_keep_hidden`)."""
        key = _view_key(docs)
        shares = sorted(((len(k & key) / max(1, len(k | key)), i, k)
                         for i, k in enumerate(self._indexes)), reverse=True)
        for share, _i, k in shares:
            if share < REUSE_OVERLAP:
                break
            if not _would_keep_hidden(db, self._indexes[k].docs, docs):
                return k
        return None

    def _ram_view(self, db: sqlite3.Connection, docs: _Docs) -> ViewIndex:
        """The RAM index of ``docs``: kept, updated from the nearest kept one, or built."""
        key = _view_key(docs)
        view = self._indexes.get(key)
        if view is not None:
            self._indexes.move_to_end(key)
            if view.docs != docs:
                _update(db, view, docs)
        else:
            nearest = self._nearest(db, docs)
            if nearest is not None:
                view = self._indexes.pop(nearest)
                _update(db, view, docs)
            else:
                view = _build(db, docs)
                self.builds += 1
            self.install(docs, view)
        self._last = (docs, view)
        return view

    def __len__(self) -> int:
        """The number of RAM view indexes kept (at most :data:`MAX_VIEWS`; a view served
        by the main index is not counted)."""
        return len(self._indexes)

    def clear(self) -> None:
        """Forget every view (the corpus is closing)."""
        self._indexes.clear()
        self._last = None
        self._main = None
        self._sets.clear()


def _view_key(docs: _Docs) -> frozenset[Any]:
    """The key a view index is kept under: its document ids, a scrubbed document's paired
    with its kinds (views that scrub differently never share, nor take turns updating,
    one index). Computed once per visible-docs object (peers alternating between views
    do not pay for it per query)."""
    key = docs.key
    if key is None:
        key = docs.key = (frozenset((d, scrub_kinds(sig)) if len(sig) > 3 else d
                                    for d, sig in docs.items())
                          if docs.scrubbed else frozenset(docs))
    return key


def _would_keep_hidden(db: sqlite3.Connection, held: dict[str, tuple[Any, ...]],
                       docs: dict[str, tuple[Any, ...]]) -> bool:
    """Would updating an index holding ``held`` into ``docs`` keep counting what the view
    may not see? tantivy counts a deleted document in its statistics until a merge, so an
    update may only delete documents the record itself removed or changed: not one the
    lens now hides (still ``done`` in the record), nor one whose scrub kinds changed (its
    old text held values now scrubbed). Then the view gets a new index instead."""
    leaving = [d for d in held if d not in docs]
    if any(scrub_kinds(held[d]) != scrub_kinds(sig) for d, sig in docs.items() if d in held):
        return True
    for i in range(0, len(leaving), 500):
        part = leaving[i:i + 500]
        row = db.execute("SELECT 1 FROM documents WHERE status = 'done' AND chunk_count > 0 "
                         f"AND doc_id IN ({','.join('?' * len(part))}) LIMIT 1", part).fetchone()
        if row is not None:
            return True
    return False


def _new_index() -> Any:
    index = tantivy.Index(search.build_schema())
    search.register_analyzers(index)
    return index


def _add(writer: Any, db: sqlite3.Connection, doc_ids: list[str],
         docs: dict[str, tuple[Any, ...]]) -> None:
    """Index the chunks of ``doc_ids``; a document whose signature in ``docs`` carries
    scrub kinds is indexed over its scrubbed text and title (a chunk whose scrubbing
    fails is left out: fail closed)."""
    for cid, did, text, title, defines in iter_chunks_for_index(db, sorted(doc_ids)):
        kinds = scrub_kinds(docs.get(did))
        if kinds:
            try:
                text = scrub_cached(cid, text, kinds)  # kept: the answers reuse it
                title = (scrub(title[0], kinds), scrub(title[1], kinds))
                defines = [scrub(d, kinds) for d in defines]
            except ScrubFailed:
                continue
        writer.add_document(search.make_document(cid, did, text, title, defines))


def _build(db: sqlite3.Connection, docs: _Docs) -> ViewIndex:
    index = _new_index()
    writer = index.writer(VIEW_WRITER_HEAP, 1)
    _add(writer, db, list(docs), docs)
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return ViewIndex(index=index, docs=dict(docs), scrubbed=docs.scrubbed)


def _update(db: sqlite3.Connection, view: ViewIndex, docs: _Docs) -> None:
    gone = [d for d in view.docs if docs.get(d) != view.docs[d]]
    new = [d for d in docs if view.docs.get(d) != docs[d]]
    view.scrubbed = docs.scrubbed
    if not gone and not new:
        view.docs = dict(docs)
        return
    writer = view.index.writer(VIEW_WRITER_HEAP, 1)
    for doc_id in gone:
        writer.delete_documents_by_term("doc_id", doc_id)
    _add(writer, db, new, docs)
    writer.commit()
    writer.wait_merging_threads()
    view.index.reload()
    view._searcher = None
    view.docs = dict(docs)
    view.chunk_ids = None
    view.masks.clear()
