"""Sync: walk the source roots and bring SQLite (the record) and tantivy up to date.

Called by :meth:`node.corpus.store.Corpus.sync` with the tantivy writer already held
(one writer per index, DESIGN §9). Per file, in this order:

1. unchanged (same size + mtime, same chunker settings, status ``done``/``error``):
   skipped, no write at all;
2. same bytes (SHA-256) despite a new mtime: only the tracking row's size/mtime are
   refreshed, no chunk or index write;
3. otherwise the tracking row is opened as ``processing`` first (so a crash leaves a
   visible ``processing`` row, never an untracked indexed file), the file is parsed and
   chunked, and ONE SQLite transaction inserts the new chunks, deletes the old ones,
   marks the row ``done`` and appends to the ``changes`` log; tantivy then gets the
   delete-by-``doc_id`` and the new chunk documents in the same (atomic) commit.

A file that fails (unreadable, not text, empty, …) gets status ``error`` and an
``error_message`` of *stage: ExceptionType - advice* (never exception text), and the
batch goes on. Files gone from a root that could be listed completely are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.corpus import chunking, parsers, search
from node.corpus.types import Root

if TYPE_CHECKING:  # pragma: no cover
    from node.corpus.store import Corpus

#: tantivy commit every this many added chunks (bounds memory and the repair window).
COMMIT_EVERY_CHUNKS = 20_000

_ADVICE = {
    "read": "the file could not be read; check its permissions and sync again",
    "parse": "the file could not be decoded as text; convert it to UTF-8 and sync again",
    "chunk": "the file could not be split into chunks; report this with the file type",
    "record": "the result could not be recorded; check free disk space and sync again",
}
_REASON_MESSAGE = {
    "unsupported-type": "parse: unsupported-type - this file type is not indexed yet",
    "binary": "parse: binary - the file contains NUL bytes and is not text; remove it "
              "from the root or ignore the error",
    "too-large": "parse: too-large - the file is larger than the text size limit; split it",
    "empty-document": "chunk: empty-document - the file has no text to index; add content "
                      "or remove it",
}


def now_rfc3339() -> str:
    """Current UTC time as RFC 3339 with second precision (``2026-01-02T03:04:05Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def doc_id_for(source_id: str) -> str:
    """Stable document id: ``d`` + 24 hex of SHA-256(source id)."""
    return "d" + hashlib.sha256(source_id.encode("utf-8")).hexdigest()[:24]


def chunker_signature(root: Root) -> str:
    """Chunker identity stored per document; a change re-chunks the document."""
    return f"{root.chunker}:v{chunking.CHUNKER_VERSION}:{root.chunk_size}:{root.chunk_overlap}"


def chunk_id_for(source_id: str, content_hash: str, sig: str, ordinal: int) -> str:
    """Stable chunk id: 32 hex of SHA-256(source id, content hash, chunker, ordinal).

    The same bytes chunked the same way always get the same ids; changed bytes get new
    ids, so new chunks can be inserted before the old ones are deleted.
    """
    raw = f"{source_id}\0{content_hash}\0{sig}\0{ordinal}".encode("utf-8")
    return hashlib.sha256(raw).hexdigest()[:32]


def error_message(stage: str, exc: BaseException) -> str:
    """``stage: ExceptionType - advice`` (DESIGN §9: never the exception's own text)."""
    return f"{stage}: {type(exc).__name__} - {_ADVICE.get(stage, 'sync again')}"


def walk_root(root_path: Path) -> tuple[list[tuple[str, Path]], bool]:
    """List the candidate files of a root: ``([(rel_path, real_path)], complete)``.

    Hidden files and folders (name starting with ``.``) are skipped; folder symlinks
    are not followed; a file symlink is kept only when it resolves to a regular file
    inside the (resolved) root. ``complete`` is False when some folder could not be
    listed, in which case nothing of that root may be removed as gone.
    """
    base = root_path.resolve()
    out: list[tuple[str, Path]] = []
    complete = True

    def _onerror(_exc: OSError) -> None:
        nonlocal complete
        complete = False

    for dirpath, dirnames, filenames in os.walk(base, onerror=_onerror, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            full = Path(dirpath) / name
            try:
                if full.is_symlink():
                    target = full.resolve()
                    if not target.is_relative_to(base) or not target.is_file():
                        continue
                elif not full.is_file():
                    continue
            except OSError:
                continue
            rel = full.relative_to(base).as_posix()
            out.append((rel, full))
    out.sort(key=lambda x: x[0])
    return out, complete


class _Sync:
    """One sync run (internal); see the module docstring for the per-file rules."""

    def __init__(self, corpus: Corpus, progress: Callable[[int, int, str], None] | None):
        self.c = corpus
        self.db = corpus._db
        self.writer = corpus._writer
        self.progress = progress
        self.report: dict[str, Any] = {
            "indexed": 0, "updated": 0, "skipped": 0, "removed": 0, "failed": 0,
            "empty": 0, "chunks": 0, "errors": [],
            "skippedReasons": {"unchanged": 0, "unsupported-type": 0},
        }
        self.pending_chunks = 0
        self.dirty = False  # any index operation since the last tantivy commit

    # -- helpers --------------------------------------------------------------------
    def _log_change(self, doc_id: str, op: str) -> None:
        self.dirty = True
        self.db.execute("INSERT INTO changes(doc_id, op) VALUES (?, ?)", (doc_id, op))

    def _fail(self, source_id: str, doc_id: str, root: Root, rel: str, st: os.stat_result | None,
              code: str, message: str, *, content_hash: str | None, empty: bool = False) -> None:
        with self.c._tx():
            had = self.db.execute("SELECT COUNT(*) FROM chunks WHERE doc_id=?", (doc_id,)).fetchone()[0]
            if had:
                self.db.execute("DELETE FROM chunks WHERE doc_id=?", (doc_id,))
                self._log_change(doc_id, "remove")
            self.db.execute(
                """INSERT INTO documents(doc_id, source_id, root_prefix, rel_path, size, mtime_ns,
                       content_hash, status, chunk_count, error_code, error_message, chunker_sig,
                       stale, updated_at)
                   VALUES (?,?,?,?,?,?,?, 'error', 0, ?, ?, ?, 0, ?)
                   ON CONFLICT(doc_id) DO UPDATE SET size=excluded.size, mtime_ns=excluded.mtime_ns,
                       content_hash=excluded.content_hash, status='error', chunk_count=0,
                       error_code=excluded.error_code, error_message=excluded.error_message,
                       chunker_sig=excluded.chunker_sig, stale=0, updated_at=excluded.updated_at""",
                (doc_id, source_id, root.prefix, rel, st.st_size if st else None,
                 st.st_mtime_ns if st else None, content_hash, code, message,
                 chunker_signature(root), now_rfc3339()))
        if had:
            self.writer.delete_documents_by_term("doc_id", doc_id)
        if empty:
            self.report["empty"] += 1
        else:
            self.report["failed"] += 1
        self.report["errors"].append({"source": source_id, "code": code, "message": message})

    def _maybe_commit(self, force: bool = False) -> None:
        if self.dirty and (force or self.pending_chunks >= COMMIT_EVERY_CHUNKS):
            self.c._commit_index()
            self.pending_chunks = 0
            self.dirty = False

    # -- one file -------------------------------------------------------------------
    def file(self, root: Root, rel: str, real: Path, row: Any | None) -> None:
        source_id = f"/{root.prefix}/{rel}"
        doc_id = doc_id_for(source_id)
        sig = chunker_signature(root)
        try:
            st = os.stat(real)
        except OSError as exc:
            self._fail(source_id, doc_id, root, rel, None, "read-failed",
                       error_message("read", exc), content_hash=None)
            return
        if (row is not None and row["status"] in ("done", "error")
                and row["size"] == st.st_size and row["mtime_ns"] == st.st_mtime_ns
                and row["chunker_sig"] == sig):
            if row["stale"]:
                with self.c._tx():
                    self.db.execute("UPDATE documents SET stale=0 WHERE doc_id=?", (doc_id,))
            self.report["skipped"] += 1
            self.report["skippedReasons"]["unchanged"] += 1
            return
        kind = parsers.kind_for(rel.rsplit("/", 1)[-1])
        if kind is None:
            self.report["skipped"] += 1
            self.report["skippedReasons"]["unsupported-type"] += 1
            return
        if st.st_size > parsers.MAX_TEXT_BYTES:
            self._fail(source_id, doc_id, root, rel, st, "too-large",
                       _REASON_MESSAGE["too-large"], content_hash=None)
            return
        try:
            data = real.read_bytes()
        except OSError as exc:
            self._fail(source_id, doc_id, root, rel, st, "read-failed",
                       error_message("read", exc), content_hash=None)
            return
        content_hash = hashlib.sha256(data).hexdigest()
        if (row is not None and row["status"] == "done" and row["content_hash"] == content_hash
                and row["chunker_sig"] == sig):
            with self.c._tx():
                self.db.execute("UPDATE documents SET size=?, mtime_ns=?, stale=0 WHERE doc_id=?",
                                (st.st_size, st.st_mtime_ns, doc_id))
            self.report["skipped"] += 1
            self.report["skippedReasons"]["unchanged"] += 1
            return
        # open the tracking row before indexing (a crash leaves "processing", never a gap)
        with self.c._tx():
            self.db.execute(
                """INSERT INTO documents(doc_id, source_id, root_prefix, rel_path, kind, status,
                       updated_at) VALUES (?,?,?,?,?, 'processing', ?)
                   ON CONFLICT(doc_id) DO UPDATE SET status='processing', kind=excluded.kind,
                       updated_at=excluded.updated_at""",
                (doc_id, source_id, root.prefix, rel, kind, now_rfc3339()))
        try:
            parsed = parsers.parse_bytes(data, kind)
        except parsers.Unsupported as exc:
            self._fail(source_id, doc_id, root, rel, st, exc.reason,
                       _REASON_MESSAGE.get(exc.reason, f"parse: {exc.reason}"),
                       content_hash=content_hash)
            return
        except Exception as exc:  # a bad file never stops the batch
            self._fail(source_id, doc_id, root, rel, st, "parse-failed",
                       error_message("parse", exc), content_hash=content_hash)
            return
        try:
            chunks = chunking.chunk_text(parsed.text, kind=parsed.kind,
                                         chunk_size=root.chunk_size,
                                         chunk_overlap=root.chunk_overlap)
        except Exception as exc:
            self._fail(source_id, doc_id, root, rel, st, "chunk-failed",
                       error_message("chunk", exc), content_hash=content_hash)
            return
        if not chunks:
            self._fail(source_id, doc_id, root, rel, st, "empty-document",
                       _REASON_MESSAGE["empty-document"], content_hash=content_hash, empty=True)
            return
        ids = [chunk_id_for(source_id, content_hash, sig, ch.ordinal) for ch in chunks]
        indexed_at = now_rfc3339()
        with self.c._tx():
            # insert the new chunks before deleting the old ones (same transaction)
            self.db.executemany(
                """INSERT OR REPLACE INTO chunks(chunk_id, doc_id, ordinal, text, line_start,
                       line_end, heading_path) VALUES (?,?,?,?,?,?,?)""",
                [(cid, doc_id, ch.ordinal, ch.text, ch.line_start, ch.line_end,
                  json.dumps(list(ch.heading_path), ensure_ascii=False))
                 for cid, ch in zip(ids, chunks)])
            self.db.execute(
                f"DELETE FROM chunks WHERE doc_id=? AND chunk_id NOT IN ({','.join('?' * len(ids))})",
                (doc_id, *ids))
            self.db.execute(
                """UPDATE documents SET kind=?, size=?, mtime_ns=?, content_hash=?, status='done',
                       chunk_count=?, error_code=NULL, error_message=NULL, encoding=?,
                       encoding_fallback=?, chunker_sig=?, stale=0, indexed_at=?, updated_at=?
                   WHERE doc_id=?""",
                (parsed.kind, st.st_size, st.st_mtime_ns, content_hash, len(chunks),
                 parsed.encoding, 1 if parsed.fallback else 0, sig, indexed_at, indexed_at,
                 doc_id))
            self._log_change(doc_id, "upsert")
        # tantivy: one atomic commit holds the delete of the old and the add of the new
        self.writer.delete_documents_by_term("doc_id", doc_id)
        for cid, ch in zip(ids, chunks):
            self.writer.add_document(search.make_document(
                cid, doc_id, ch.text, search.title_text(source_id, ch.heading_path)))
        self.pending_chunks += len(chunks)
        self.report["chunks"] += len(chunks)
        self.report["updated" if row is not None else "indexed"] += 1
        self._maybe_commit()

    def remove(self, doc_id: str, source_id: str) -> None:
        with self.c._tx():
            self.db.execute("DELETE FROM chunks WHERE doc_id=?", (doc_id,))
            self.db.execute("DELETE FROM documents WHERE doc_id=?", (doc_id,))
            self._log_change(doc_id, "remove")
        self.writer.delete_documents_by_term("doc_id", doc_id)
        self.report["removed"] += 1

    # -- the run ----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        plan: list[tuple[Root, str, Path]] = []
        listed: dict[str, set[str] | None] = {}
        for root in self.c.roots():
            rp = Path(root.path)
            if not rp.is_dir():
                listed[root.prefix] = None
                self.report["errors"].append({
                    "source": f"/{root.prefix}", "code": "root-not-found",
                    "message": "sync: root-not-found - the folder is missing; its documents "
                               "are kept until it is back or removed"})
                continue
            files, complete = walk_root(rp)
            listed[root.prefix] = {rel for rel, _ in files} if complete else None
            plan.extend((root, rel, real) for rel, real in files)
        rows = {r["source_id"]: r for r in self.db.execute(
            "SELECT doc_id, source_id, root_prefix, rel_path, status, size, mtime_ns, "
            "content_hash, chunker_sig, stale FROM documents")}
        total = len(plan)
        for i, (root, rel, real) in enumerate(plan):
            source_id = f"/{root.prefix}/{rel}"
            if self.progress:
                self.progress(i, total, source_id)
            self.file(root, rel, real, rows.get(source_id))
        for source_id, row in rows.items():
            seen = listed.get(row["root_prefix"], set())
            if seen is None:
                continue  # root missing or not completely listed: remove nothing
            if row["rel_path"] not in seen:
                self.remove(row["doc_id"], source_id)
        if self.progress:
            self.progress(total, total, "")
        self._maybe_commit(force=True)
        self.c._set_meta("last_sync", now_rfc3339())
        self.report["seconds"] = round(time.monotonic() - started, 3)
        return self.report


def run_sync(corpus: Corpus, progress: Callable[[int, int, str], None] | None) -> dict[str, Any]:
    """Run one sync with the writer held by ``corpus``; returns the sync report."""
    return _Sync(corpus, progress).run()


def iter_chunks_for_index(db: Any, doc_ids: list[str] | None = None) -> Iterator[tuple[str, str, str, str]]:
    """Yield ``(chunk_id, doc_id, text, title)`` of ``done`` documents (all, or ``doc_ids``)."""
    sql = ("SELECT c.chunk_id, c.doc_id, c.text, c.heading_path, d.source_id FROM chunks c "
           "JOIN documents d ON d.doc_id = c.doc_id WHERE d.status = 'done'")
    if doc_ids is None:
        batches: list[tuple[str, tuple[Any, ...]]] = [(sql, ())]
    else:
        batches = []
        for i in range(0, len(doc_ids), 500):
            part = doc_ids[i:i + 500]
            batches.append((sql + f" AND c.doc_id IN ({','.join('?' * len(part))})", tuple(part)))
    for q, params in batches:
        for cid, did, text, hp, sid in db.execute(q, params):
            yield cid, did, text, search.title_text(sid, json.loads(hp))
