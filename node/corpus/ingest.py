"""Sync: bring SQLite (the record) and tantivy up to date with the roots (DESIGN §9).

Called by :class:`node.corpus.store.Corpus` with the tantivy writer already held (one
writer per index). Modes (``new_only`` default, ``update_only``, ``full``):

| mode | new file | changed file | unchanged file | file gone (complete listing) |
|---|---|---|---|---|
| ``new_only`` | index | replace | skip | remove |
| ``update_only`` | ignore | replace | skip | remove |
| ``full`` | index | replace | re-index | remove |

Per file, in this order:

1. unchanged (same size + mtime, same chunker settings, status ``done``/``error``):
   skipped, no write at all (``full`` re-indexes);
2. same bytes (SHA-256) despite a new mtime: only the tracking row's size/mtime are
   refreshed, no chunk or index write;
3. otherwise the tracking row is opened as ``processing`` first, the file is parsed and
   chunked, and the record *inserts the new chunks, then deletes the old ones*, marks
   the row ``done`` and appends to the ``changes`` log — one savepoint per file, so a
   file is recorded whole or not at all; tantivy then gets the delete-by-``doc_id`` and
   the new chunk documents in the same (atomic) commit.

Files share one SQLite transaction (a batch, :data:`BATCH_CHUNKS` / :data:`BATCH_SECONDS`)
— per-file transactions were a large part of a full sync (issue 10 item 6). The batch
commits before every tantivy commit (the index never holds what the record does not). A
kill loses the open batch: its files are untracked and unindexed, so the next sync
indexes them (never an untracked indexed file, never a gap); an exception or interrupt
commits the batch, so a file cut off mid-parse leaves a visible ``processing`` row.

A file that fails gets status ``error`` and an ``error_message`` of
*stage: ExceptionType-or-reason - advice* (never exception text, never a path) and the
batch goes on; a file yielding no chunk is ``error``/``empty-document``, not ``done``.
Archives (``.zip``, ``.tar.gz``) are scanned whole under :mod:`node.corpus.archives` and
their members become documents ``/<root>/<archive path>/<member path>``; a refused
archive indexes nothing. Files gone from a root that could be listed completely are
removed (with an archive, its members).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.corpus import archives, chunking, parsers, search, sources
from node.corpus.ignore import RootFilter
from node.corpus.types import Root

if TYPE_CHECKING:  # pragma: no cover
    from node.corpus.store import Corpus

#: tantivy commit every this many added chunks (bounds memory and the repair window).
COMMIT_EVERY_CHUNKS = 20_000
#: Files of a sync share one SQLite transaction until it holds this many chunks or has
#: been open this long (seconds): each file's writes stay all-or-nothing (a savepoint),
#: a kill loses at most the open batch — files neither recorded nor indexed, so the next
#: sync indexes them — and another writer of the record waits at most about this long.
BATCH_CHUNKS = 2_000
BATCH_SECONDS = 0.25
#: Stages of :attr:`Writer.stages` (seconds spent in each during one run).
STAGES = ("walk", "read", "parse", "chunk", "record", "index", "commit")
MODES = ("new_only", "update_only", "full")

#: ``progress(done_files, total_files, source_id, done_bytes, total_bytes)``
Progress = Callable[[int, int, str, int, int], None]

_ADVICE = {
    "read": "the file could not be read; check its permissions and sync again",
    "parse": "the file could not be parsed; check that it opens in its usual program, "
             "or convert it, and sync again",
    "chunk": "the file could not be split into chunks; report this with the file type",
    "record": "the result could not be recorded; check free disk space and sync again",
}
_REASON_MESSAGE = {
    "unsupported-type": "parse: unsupported-type - this file type is not indexed",
    "binary": "parse: binary - the file contains NUL bytes and is not text; remove it "
              "from the root or ignore the error",
    "too-large": "parse: too-large - the file is larger than the size limit; split it",
    "encrypted": "parse: encrypted - the document is password-protected; save an "
                 "unprotected copy to index it",
    "not-a-document": "parse: not-a-document - the bytes are not the format the file name "
                      "says; rename or re-export it",
    "archive-refused": "parse: archive-refused - the document's zip container breaks the "
                       "archive rules (size, ratio, entries); re-save it",
    "no-text-layer": "parse: no-text-layer - the PDF has no text layer (a scan?); run OCR "
                     "on it to index it",
    "empty-document": "chunk: empty-document - the file has no text to index; add content "
                      "or remove it",
    "empty-archive": "chunk: empty-document - the archive holds no file type that is "
                     "indexed",
}


def now_rfc3339() -> str:
    """Current UTC time as RFC 3339 with second precision (``2026-01-02T03:04:05Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def doc_id_for(source_id: str) -> str:
    """Stable document id: ``d`` + 24 hex of SHA-256(source id)."""
    return "d" + hashlib.sha256(source_id.encode("utf-8")).hexdigest()[:24]


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


def too_large_message(size: int, limit: int, kind: str) -> str:
    """Tracking-row message of a file over its kind's size limit, naming both sizes."""
    return (f"parse: too-large - the file is {size:,} bytes, over the {limit:,}-byte limit "
            f"for {kind} files; split it")


def archive_message(reason: str) -> str:
    """Tracking-row message of a refused archive (path-free; member names never appear)."""
    detail = archives.ArchiveRefused(reason).detail
    return (f"archive: {reason} - {detail}; nothing from this archive is indexed - repack "
            "it without that and sync again")


def hidden(rel: str) -> bool:
    """True when any segment of a ``/``-separated relative path starts with ``.``."""
    return any(part.startswith(".") for part in rel.split("/"))


def _inside(path: Path, base: Path) -> bool:
    """``path`` is ``base`` or below it (:func:`node.corpus.sources.inside`, the corpus's
    one containment test; both absolute, in the same spelling)."""
    return sources.inside(os.fspath(path), os.fspath(base)) is not None


#: A folder holding this file is a Kith node home (identity, peers, policy, approvals):
#: never indexed, wherever it lies (DESIGN §9, §13).
HOME_MARKER = "identity.key"


def is_kith_home(folder: Path, own_home: Path | None = None) -> bool:
    """True when ``folder`` is the node's own home (``own_home``; both paths resolved —
    the walk lists real folders only) or any Kith home (it holds :data:`HOME_MARKER`)."""
    try:
        if own_home is not None and folder == own_home:
            return True
        return (folder / HOME_MARKER).exists()
    except OSError:
        return False


def _in_kith_home(path: Path, base: Path, own_home: Path | None) -> bool:
    """True when a folder between ``base`` (included) and ``path`` (excluded) is a Kith
    home — for a symlink's target or a watched path (a walk prunes homes itself)."""
    try:
        rel = path.relative_to(base)
    except ValueError:
        return False
    folder = base
    if is_kith_home(folder, own_home):
        return True
    for part in rel.parts[:-1]:
        folder = folder / part
        if is_kith_home(folder, own_home):
            return True
    return False


def accept_file(full: Path, base: Path, exclude: Path | None = None,
                own_home: Path | None = None) -> bool:
    """True when ``full`` is a regular file to index: not a symlink leaving ``base``
    (resolved) or pointing into a Kith home, not inside ``exclude`` (the node's own
    corpus folder)."""
    try:
        if full.is_symlink():
            target = full.resolve()
            if not _inside(target, base) or not target.is_file():
                return False
            if _in_kith_home(target, base, own_home):
                return False
        elif not full.is_file():
            return False
        if exclude is not None and _inside(full.resolve(), exclude):
            return False
    except OSError:
        return False
    return True


def _utf8_name(name: str) -> bool:
    """False for a file or folder name whose bytes are not UTF-8 (Python spells them as
    lone surrogates): no source id, policy glob or peer's citation can name it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def walk_root(root_path: Path, exclude: Path | None = None, *, own_home: Path | None = None,
              skipped: list[str] | None = None, filt: RootFilter | None = None,
              rel_prefix: str = "", ignored: dict[str, int] | None = None,
              unreadable: list[tuple[str, str]] | None = None,
              ) -> tuple[list[tuple[str, Path]], bool]:
    """List the candidate files of a root: ``([(rel_path, path)], complete)``.

    Hidden files and folders (name starting with ``.``) are skipped; folder symlinks
    are not followed; a file symlink is kept only when it resolves to a regular file
    inside the (resolved) root and outside any Kith home; anything inside ``exclude`` is
    skipped. A folder that is a Kith home — ``own_home`` (the node's own, resolved) or
    any folder holding :data:`HOME_MARKER` — is never entered (the root itself included:
    then nothing is listed); its path relative to the root (``""`` for the root) is
    appended to ``skipped``. ``filt`` (:class:`node.corpus.ignore.RootFilter`) prunes the
    default excludes and the root's ``.kithignore``; each folder or file it drops adds 1
    to ``ignored[reason]``, as each one whose name is not UTF-8 adds 1 to
    ``ignored["name-not-utf8"]`` (never entered or read). ``rel_prefix``: where ``root_path`` lies inside its root
    (``""`` for the root itself; the watcher walks sub-folders), for matching.
    ``complete`` is False when some folder could not be listed: nothing of that root may
    then be removed as gone (a skipped home does not make a listing incomplete: what was
    indexed from it before is removed); each such folder is appended to ``unreadable``
    as ``(rel_path, reason)`` (``reason``: the OS's words, e.g. ``Permission denied``).
    """
    base = root_path.resolve()
    out: list[tuple[str, Path]] = []
    complete = True
    lead = f"{rel_prefix}/" if rel_prefix else ""

    def _count(reason: str) -> None:
        if ignored is not None:
            ignored[reason] = ignored.get(reason, 0) + 1

    def _onerror(exc: OSError) -> None:
        nonlocal complete
        complete = False
        if unreadable is not None:
            where = Path(exc.filename) if exc.filename else base
            try:
                rel = where.relative_to(base).as_posix()
            except ValueError:
                rel = ""
            rel = lead + rel if rel != "." else rel_prefix
            unreadable.append((rel.rstrip("/"), exc.strerror or type(exc).__name__))

    if is_kith_home(base, own_home):
        if skipped is not None:
            skipped.append("")
        return out, True
    for dirpath, dirnames, filenames in os.walk(base, onerror=_onerror, followlinks=False):
        here = Path(dirpath)
        here_rel = here.relative_to(base).as_posix()
        here_rel = lead + ("" if here_rel == "." else here_rel)
        if here_rel.endswith("/"):
            here_rel = here_rel[:-1]
        keep = []
        for d in sorted(dirnames):
            if d.startswith("."):
                continue
            if not _utf8_name(d):
                _count("name-not-utf8")
                continue
            if is_kith_home(here / d, own_home):
                if skipped is not None:
                    skipped.append((here / d).relative_to(base).as_posix())
                continue
            if filt is not None:
                why = filt.dir_reason(f"{here_rel}/{d}" if here_rel else d, here / d)
                if why is not None:
                    _count(why)
                    continue
            keep.append(d)
        dirnames[:] = keep
        if exclude is not None and _inside(here, exclude):
            dirnames[:] = []
            continue
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            if not _utf8_name(name):  # a source id is UTF-8 text: it cannot name this file
                _count("name-not-utf8")
                continue
            if filt is not None and filt.file_ignored(f"{here_rel}/{name}" if here_rel else name):
                _count("kithignore")
                continue
            full = here / name
            if not accept_file(full, base, exclude, own_home):
                continue
            out.append((full.relative_to(base).as_posix(), full))
    out.sort(key=lambda x: x[0])
    return out, complete


@dataclass(frozen=True)
class DocRef:
    """Where a document lives: ids, origin and the chunker settings it is cut with."""

    source_id: str
    root_prefix: str
    rel_path: str
    origin: str  # "file" | "archive" | "member" | "record"
    chunker: str
    chunk_size: int
    chunk_overlap: int
    parent_doc_id: str | None = None

    @property
    def doc_id(self) -> str:
        return doc_id_for(self.source_id)

    @property
    def sig(self) -> str:
        return (f"{self.chunker}:v{chunking.CHUNKER_VERSION}:{self.chunk_size}:"
                f"{self.chunk_overlap}")


def source_id_of(prefix: str, rel: str) -> str:
    """The source id of the file at ``rel`` (its on-disk spelling) in the root ``prefix``:
    ``/<prefix>/<rel>`` in NFC, so a name stored decomposed (NFD) has the same id in the
    index listing, local search, filters and peer answers (the gate's canonical form,
    :mod:`node.corpus.sources`). ``rel_path`` keeps the on-disk spelling."""
    return unicodedata.normalize("NFC", f"/{prefix}/{rel}" if rel else f"/{prefix}")


#: Files a sync lists by name as skipped (not unchanged) at most.
MAX_SKIPPED_LISTED = 1000


def file_ref(root: Root, rel: str, origin: str = "file") -> DocRef:
    """The :class:`DocRef` of a file (or archive) at ``rel`` in ``root``."""
    return DocRef(source_id_of(root.prefix, rel), root.prefix, rel, origin, root.chunker,
                  root.chunk_size, root.chunk_overlap)


_ROW_COLUMNS = ("doc_id, source_id, root_prefix, rel_path, status, size, mtime_ns, "
                "content_hash, chunker_sig, stale, origin, parent_doc_id")


class Writer:
    """SQLite + tantivy writing primitives shared by sync, watch and datasource import.

    ``report`` accumulates the counts of one run (see :meth:`Corpus.sync`).
    """

    def __init__(self, corpus: Corpus) -> None:
        self.c = corpus
        self.db = corpus.record.db
        self.writer = corpus.record.writer
        self.report: dict[str, Any] = {
            "indexed": 0, "updated": 0, "skipped": 0, "removed": 0, "failed": 0,
            "empty": 0, "chunks": 0, "files": 0, "bytes": 0, "errors": [],
            "skippedReasons": {"unchanged": 0, "unsupported-type": 0, "new-ignored": 0},
            "skippedSources": [],
            "archives": {"indexed": 0, "refused": 0},
        }
        self.pending_chunks = 0
        self.files_done = 0  # files of this run finished (SyncInterrupted.done)
        self.dirty = False  # any index operation since the last tantivy commit
        #: when a list: each document written, failed or removed is noted in it (the
        #: watcher's log names the files it touched), at most MAX_NOTED entries
        self.changes: list[dict[str, str]] | None = None
        #: seconds spent per stage (:data:`STAGES`) in this run (``scripts/bench_corpus.py
        #: --breakdown``): walk (list the roots, stat), read (bytes + SHA-256), parse
        #: (decode + parse), chunk, record (SQLite), index (tantivy documents), commit
        self.stages: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self._batch: tuple[float, int] | None = None  # (opened at, chunks) of the open batch

    # -- transactions -------------------------------------------------------------------
    @contextlib.contextmanager
    def tx(self) -> Iterator[None]:
        """One all-or-nothing group of writes: a savepoint inside the open batch
        (:meth:`begin_batch`), else its own ``BEGIN IMMEDIATE`` transaction."""
        if self._batch is None:
            with self.c.record.tx():
                yield
            return
        self.db.execute("SAVEPOINT w")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK TO w")
            self.db.execute("RELEASE w")
            raise
        self.db.execute("RELEASE w")

    def begin_batch(self) -> None:
        """Open the batch transaction the next files share (no-op when one is open)."""
        if self._batch is None:
            self.db.execute("BEGIN IMMEDIATE")
            self._batch = (time.monotonic(), 0)

    def end_batch(self, *, force: bool = False) -> None:
        """Commit the open batch when it is full (:data:`BATCH_CHUNKS`,
        :data:`BATCH_SECONDS`) or ``force``."""
        if self._batch is None:
            return
        opened, chunks = self._batch
        if force or chunks >= BATCH_CHUNKS or time.monotonic() - opened >= BATCH_SECONDS:
            self._batch = None
            t0 = time.perf_counter()
            self.db.execute("COMMIT")
            self.stages["record"] += time.perf_counter() - t0

    def abort_batch(self) -> None:
        """After an exception between files: keep what the batch holds (every file in it
        is whole: each was one savepoint), or roll it back when it cannot commit."""
        if self._batch is None:
            return
        self._batch = None
        try:
            self.db.execute("COMMIT")
        except Exception:
            with contextlib.suppress(Exception):
                self.db.execute("ROLLBACK")

    #: Most ``changes`` entries one report lists (the rest are counted in ``changesMore``).
    MAX_NOTED = 50

    def note(self, source_id: str, op: str) -> None:
        """Note ``op`` (``indexed``, ``updated``, ``failed``, ``empty``, ``removed``) on
        ``source_id`` in ``report["changes"]`` when the run lists its changes."""
        if self.changes is None:
            return
        if len(self.changes) < self.MAX_NOTED:
            self.changes.append({"source": source_id, "op": op})
        else:
            self.report["changesMore"] = self.report.get("changesMore", 0) + 1

    # -- helpers --------------------------------------------------------------------
    def log_change(self, doc_id: str, op: str) -> None:
        self.dirty = True
        self.db.execute("INSERT INTO changes(doc_id, op) VALUES (?, ?)", (doc_id, op))

    def row(self, source_id: str) -> Any | None:
        return self.db.execute(f"SELECT {_ROW_COLUMNS} FROM documents WHERE source_id=?",
                               (source_id,)).fetchone()

    def skip(self, reason: str, source: str | None = None) -> None:
        """Count a file not indexed; one that is not merely ``unchanged`` is also listed
        in ``skippedSources`` (at most :data:`MAX_SKIPPED_LISTED`), so `kith index sync`
        and `kith index status` can say which (issue 20)."""
        self.report["skipped"] += 1
        self.report["skippedReasons"][reason] = self.report["skippedReasons"].get(reason, 0) + 1
        listed = self.report.setdefault("skippedSources", [])
        if source is not None and reason != "unchanged" and len(listed) < MAX_SKIPPED_LISTED:
            listed.append({"source": source, "reason": reason})

    def fail(self, doc: DocRef, size: int | None, mtime_ns: int | None, code: str, message: str,
             *, content_hash: str | None, empty: bool = False, reason: str | None = None,
             kind: str | None = None) -> None:
        """Record an ``error`` row (dropping any chunks the document had) and report it."""
        doc_id = doc.doc_id
        with self.tx():
            had = self.db.execute("SELECT COUNT(*) FROM chunks WHERE doc_id=?", (doc_id,)).fetchone()[0]
            if had:
                self.db.execute("DELETE FROM chunks WHERE doc_id=?", (doc_id,))
                self.log_change(doc_id, "remove")
            self.db.execute(
                """INSERT INTO documents(doc_id, source_id, root_prefix, rel_path, kind, size,
                       mtime_ns, content_hash, status, chunk_count, error_code, error_message,
                       chunker_sig, stale, updated_at, origin, parent_doc_id)
                   VALUES (?,?,?,?,?,?,?,?, 'error', 0, ?, ?, ?, 0, ?, ?, ?)
                   ON CONFLICT(doc_id) DO UPDATE SET size=excluded.size, mtime_ns=excluded.mtime_ns,
                       kind=COALESCE(excluded.kind, kind),
                       content_hash=excluded.content_hash, status='error', chunk_count=0,
                       error_code=excluded.error_code, error_message=excluded.error_message,
                       chunker_sig=excluded.chunker_sig, stale=0, updated_at=excluded.updated_at,
                       origin=excluded.origin, parent_doc_id=excluded.parent_doc_id""",
                (doc_id, doc.source_id, doc.root_prefix, doc.rel_path, kind, size, mtime_ns,
                 content_hash, code, message, doc.sig, now_rfc3339(), doc.origin,
                 doc.parent_doc_id))
        if had:
            self.writer.delete_documents_by_term("doc_id", doc_id)
        self.report["empty" if empty else "failed"] += 1
        self.note(doc.source_id, "empty" if empty else "failed")
        entry = {"source": doc.source_id, "code": code, "message": message}
        if reason:
            entry["reason"] = reason
        self.report["errors"].append(entry)

    def open_row(self, doc: DocRef, kind: str | None) -> None:
        """Open (or re-open) the tracking row as ``processing`` before any indexing (its
        status before is remembered, see :meth:`Sync._settle_opened`)."""
        opened = getattr(self, "_opened", None)
        if opened is not None and doc.doc_id not in opened:
            opened[doc.doc_id] = self.db.execute(
                "SELECT status, kind FROM documents WHERE doc_id=?", (doc.doc_id,)).fetchone()
        with self.tx():
            self.db.execute(
                """INSERT INTO documents(doc_id, source_id, root_prefix, rel_path, kind, status,
                       updated_at, origin, parent_doc_id) VALUES (?,?,?,?,?, 'processing', ?, ?, ?)
                   ON CONFLICT(doc_id) DO UPDATE SET status='processing', kind=excluded.kind,
                       updated_at=excluded.updated_at, origin=excluded.origin,
                       parent_doc_id=excluded.parent_doc_id""",
                (doc.doc_id, doc.source_id, doc.root_prefix, doc.rel_path, kind, now_rfc3339(),
                 doc.origin, doc.parent_doc_id))

    def refresh_stat(self, doc_id: str, size: int | None, mtime_ns: int | None) -> None:
        with self.tx():
            self.db.execute("UPDATE documents SET size=?, mtime_ns=?, stale=0 WHERE doc_id=?",
                            (size, mtime_ns, doc_id))

    def maybe_commit(self, force: bool = False) -> None:
        """Commit tantivy every :data:`COMMIT_EVERY_CHUNKS` (or now, ``force``) — the
        open SQLite batch first: the index never holds what the record does not."""
        if self.dirty and (force or self.pending_chunks >= COMMIT_EVERY_CHUNKS):
            self.end_batch(force=True)
            t0 = time.perf_counter()
            self.c.record.commit_index()
            self.stages["commit"] += time.perf_counter() - t0
            self.pending_chunks = 0
            self.dirty = False

    # -- one document ------------------------------------------------------------------
    def index(self, doc: DocRef, *, kind: str, size: int | None, mtime_ns: int | None,
              content_hash: str, existed: bool, parse: Callable[[], parsers.ParsedDocument],
              metadata: dict[str, Any] | None = None) -> str:
        """Open the row, parse, chunk and write one document (insert before delete).

        Returns:
            ``indexed``/``updated`` (written), ``failed`` or ``empty``.
        """
        doc_id = doc.doc_id
        stages = self.stages
        t0 = time.perf_counter()
        self.open_row(doc, kind)
        t1 = time.perf_counter()
        stages["record"] += t1 - t0
        try:
            parsed = parse()
        except parsers.Unsupported as exc:
            self.fail(doc, size, mtime_ns, exc.reason,
                      _REASON_MESSAGE.get(exc.reason, f"parse: {exc.reason} - sync again"),
                      content_hash=content_hash, kind=kind)
            return "failed"
        except Exception as exc:  # a bad file never stops the batch
            self.fail(doc, size, mtime_ns, "parse-failed", error_message("parse", exc),
                      content_hash=content_hash, kind=kind)
            return "failed"
        t2 = time.perf_counter()
        stages["parse"] += t2 - t1
        try:
            chunks = chunking.chunk_text(parsed.text, kind=parsed.kind, structure=parsed.structure,
                                         chunker=doc.chunker, chunk_size=doc.chunk_size,
                                         chunk_overlap=doc.chunk_overlap,
                                         page_starts=parsed.page_starts, title=parsed.title,
                                         parsed_definitions=parsed.definitions)
        except Exception as exc:
            self.fail(doc, size, mtime_ns, "chunk-failed", error_message("chunk", exc),
                      content_hash=content_hash, kind=kind)
            return "failed"
        t3 = time.perf_counter()
        stages["chunk"] += t3 - t2
        if not chunks:
            self.fail(doc, size, mtime_ns, "empty-document", _REASON_MESSAGE["empty-document"],
                      content_hash=content_hash, empty=True, kind=kind)
            return "empty"
        sig = doc.sig
        ids = [chunk_id_for(doc.source_id, content_hash, sig, ch.ordinal) for ch in chunks]
        indexed_at = now_rfc3339()
        paths: dict[tuple[str, ...], str] = {}  # chunks of a section share a heading path
        for ch in chunks:
            if ch.heading_path not in paths:
                paths[ch.heading_path] = json.dumps(list(ch.heading_path), ensure_ascii=False)
        with self.tx():
            # insert the new chunks BEFORE deleting the old ones (DESIGN §9): a crash
            # between the two can only leave a duplicate, never a gap
            self.db.executemany(
                """INSERT OR REPLACE INTO chunks(chunk_id, doc_id, ordinal, text, line_start,
                       line_end, heading_path, page_start, page_end, char_start, char_end,
                       defines)
                   VALUES (?,?,?,?,?,?,?,?,?,?,?,?)""",
                [(cid, doc_id, ch.ordinal, ch.text, ch.line_start, ch.line_end,
                  paths[ch.heading_path], ch.page_start, ch.page_end, ch.char_start, ch.char_end,
                  json.dumps(list(ch.defines), ensure_ascii=False) if ch.defines else "[]")
                 for cid, ch in zip(ids, chunks)])
            if existed:
                self.db.execute(
                    f"DELETE FROM chunks WHERE doc_id=? AND chunk_id NOT IN ({','.join('?' * len(ids))})",
                    (doc_id, *ids))
            self.db.execute(
                """UPDATE documents SET kind=?, size=?, mtime_ns=?, content_hash=?, status='done',
                       chunk_count=?, error_code=NULL, error_message=NULL, encoding=?,
                       encoding_fallback=?, chunker_sig=?, stale=0, indexed_at=?, updated_at=?,
                       metadata=?, parse_notes=? WHERE doc_id=?""",
                (parsed.kind, size, mtime_ns, content_hash, len(chunks), parsed.encoding,
                 1 if parsed.fallback else 0, sig, indexed_at, indexed_at,
                 json.dumps(metadata or parsed.metadata, ensure_ascii=False, sort_keys=True),
                 json.dumps(parsed.notes, ensure_ascii=False, sort_keys=True), doc_id))
            self.log_change(doc_id, "upsert")
        t4 = time.perf_counter()
        stages["record"] += t4 - t3
        # tantivy: one atomic commit holds the delete of the old and the add of the new
        if existed:
            self.writer.delete_documents_by_term("doc_id", doc_id)
        add, make = self.writer.add_document, search.make_document
        titles: dict[tuple[str, ...], tuple[str, str]] = {}
        for cid, ch in zip(ids, chunks):
            hp = ch.heading_path
            title = titles.get(hp)
            if title is None:
                title = titles[hp] = search.index_title(doc.source_id, hp)
            add(make(cid, doc_id, ch.text, title,
                     search.definition_terms(ch.defines, hp) if ch.defines else ()))
        stages["index"] += time.perf_counter() - t4
        if self._batch is not None:
            self._batch = (self._batch[0], self._batch[1] + len(chunks))
        self.pending_chunks += len(chunks)
        self.report["chunks"] += len(chunks)
        outcome = "updated" if existed else "indexed"
        self.report[outcome] += 1
        self.note(doc.source_id, outcome)
        self.maybe_commit()
        return outcome

    def remove(self, doc_id: str, *, count: bool = True) -> None:
        """Remove a document (and, for an archive, its members) from both stores."""
        children = [r[0] for r in self.db.execute(
            "SELECT doc_id FROM documents WHERE parent_doc_id=?", (doc_id,))]
        for child in children:
            self.remove(child, count=count)
        if self.changes is not None:
            sid = self.db.execute("SELECT source_id FROM documents WHERE doc_id=?", (doc_id,)).fetchone()
            if sid is not None:
                self.note(sid[0], "removed")
        with self.tx():
            self.db.execute("DELETE FROM chunks WHERE doc_id=?", (doc_id,))
            self.db.execute("DELETE FROM documents WHERE doc_id=?", (doc_id,))
            self.log_change(doc_id, "remove")
        self.writer.delete_documents_by_term("doc_id", doc_id)
        if count:
            self.report["removed"] += 1


class SyncInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped a sync between or during files; what was done is kept and
    committed, the file being worked on is put back as it was.

    Attributes:
        done: files of the run finished before the interrupt.
        total: files the run had listed.
    """

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"stopped after {done} files")
        self.done = done
        self.total = total


class Sync(Writer):
    """One sync run over the roots (full walk) or over a set of changed paths (watch)."""

    def __init__(self, corpus: Corpus, progress: Progress | None = None, mode: str = "new_only",
                 limits: archives.ArchiveLimits = archives.DEFAULT_LIMITS) -> None:
        super().__init__(corpus)
        self.progress = progress
        self.mode = mode
        self.limits = limits
        self.report["mode"] = mode
        self.report["skippedFolders"] = []
        #: folders and files not read because of the default excludes or .kithignore
        self.report["ignored"] = {}
        self._opened: dict[str, Any] = {}
        self.exclude = corpus.dir.resolve() if corpus.dir.exists() else None
        try:
            self.own_home: Path | None = corpus.home.resolve()
        except OSError:  # pragma: no cover
            self.own_home = None

    def _skipped_homes(self, root: Root, rels: list[str]) -> None:
        """Report folders not entered because they are Kith homes (source ids only)."""
        for rel in rels:
            source = source_id_of(root.prefix, rel)
            self.report["skippedFolders"].append({"source": source, "reason": "kith-home"})
            self.report["skippedReasons"]["kith-home"] = (
                self.report["skippedReasons"].get("kith-home", 0) + 1)

    def _unreadable(self, root: Root, folders: list[tuple[str, str]]) -> None:
        """Report folders that could not be listed, with the OS's reason (issue 12)."""
        for rel, why in folders:
            self.report["errors"].append({
                "source": source_id_of(root.prefix, rel), "code": "folder-unreadable",
                "message": f"sync: folder-unreadable - {why}; its files are not indexed, and "
                           "nothing of this root is removed until every folder can be read"})

    # -- one file -------------------------------------------------------------------
    def file(self, root: Root, rel: str, real: Path, row: Any | None) -> None:
        """Sync one file of ``root`` (``row``: its tracking row, or None)."""
        akind = archives.archive_kind(rel.rsplit("/", 1)[-1])
        doc = file_ref(root, rel, "archive" if akind else "file")
        if row is None and self.mode == "update_only":
            self.skip("new-ignored", doc.source_id)
            return
        try:
            st = os.stat(real)
        except OSError as exc:
            self.fail(doc, None, None, "read-failed", error_message("read", exc), content_hash=None)
            return
        if (row is not None and self.mode != "full" and row["status"] in ("done", "error")
                and row["size"] == st.st_size and row["mtime_ns"] == st.st_mtime_ns
                and row["chunker_sig"] == doc.sig):
            if row["stale"]:
                with self.tx():
                    self.db.execute("UPDATE documents SET stale=0 WHERE doc_id=?", (doc.doc_id,))
            self.skip("unchanged")
            return
        if akind:
            self.archive(root, rel, real, row, st, akind)
            return
        kind = parsers.kind_for(rel.rsplit("/", 1)[-1])
        if kind is None:
            self.skip("unsupported-type", doc.source_id)
            return
        if st.st_size > parsers.size_limit(kind):
            self.fail(doc, st.st_size, st.st_mtime_ns, "too-large",
                      too_large_message(st.st_size, parsers.size_limit(kind), kind),
                      content_hash=None, kind=kind)
            return
        t0 = time.perf_counter()
        try:
            data = real.read_bytes()
        except OSError as exc:
            self.fail(doc, st.st_size, st.st_mtime_ns, "read-failed", error_message("read", exc),
                      content_hash=None, kind=kind)
            return
        self.report["bytes"] += len(data)
        content_hash = hashlib.sha256(data).hexdigest()
        self.stages["read"] += time.perf_counter() - t0
        if (row is not None and self.mode != "full" and row["status"] == "done"
                and row["content_hash"] == content_hash and row["chunker_sig"] == doc.sig):
            self.refresh_stat(doc.doc_id, st.st_size, st.st_mtime_ns)
            self.skip("unchanged")
            return
        name = rel.rsplit("/", 1)[-1]
        self.index(doc, kind=kind, size=st.st_size, mtime_ns=st.st_mtime_ns,
                   content_hash=content_hash, existed=row is not None,
                   parse=lambda: parsers.parse_bytes(data, kind, name))

    # -- archives ---------------------------------------------------------------------
    def archive(self, root: Root, rel: str, real: Path, row: Any | None, st: os.stat_result,
                akind: str) -> None:
        """Sync an archive: scan it whole, then index its members (all or nothing)."""
        doc = file_ref(root, rel, "archive")
        doc_id = doc.doc_id
        if st.st_size > self.limits.max_archive_bytes:
            self._refuse_archive(doc, st, None, "archive-too-large")
            return
        try:
            data = real.read_bytes()
        except OSError as exc:
            self.fail(doc, st.st_size, st.st_mtime_ns, "read-failed", error_message("read", exc),
                      content_hash=None, kind="archive")
            return
        self.report["bytes"] += len(data)
        content_hash = hashlib.sha256(data).hexdigest()
        if (row is not None and self.mode != "full" and row["status"] in ("done", "error")
                and row["content_hash"] == content_hash and row["chunker_sig"] == doc.sig):
            self.refresh_stat(doc_id, st.st_size, st.st_mtime_ns)
            self.skip("unchanged")
            return
        self.open_row(doc, "archive")
        try:
            members = archives.scan(data, akind, self.limits)
        except archives.ArchiveRefused as exc:
            self._refuse_archive(doc, st, content_hash, exc.reason)
            return
        wanted: dict[str, tuple[archives.MemberInfo, str]] = {}
        for info in members:
            name = info.path.rsplit("/", 1)[-1]
            kind = parsers.kind_for(name)
            if hidden(info.path) or kind is None or archives.archive_kind(name):
                self.skip("unsupported-type", f"{doc.source_id}/{info.path}")
                continue
            wanted[info.path] = (info, kind)
        old = {r["rel_path"]: r for r in self.db.execute(
            f"SELECT {_ROW_COLUMNS} FROM documents WHERE parent_doc_id=?", (doc_id,))}
        for rel_member, mrow in old.items():
            if rel_member[len(rel) + 1:] not in wanted:
                self.remove(mrow["doc_id"])
        todo: set[str] = set()
        for mpath, (info, _kind) in wanted.items():
            mrow = old.get(f"{rel}/{mpath}")
            if (mrow is not None and self.mode != "full" and mrow["status"] in ("done", "error")
                    and mrow["content_hash"] == info.sha256 and mrow["chunker_sig"] == doc.sig):
                self.skip("unchanged")
                continue
            todo.add(mpath)
        total = 0
        try:
            for info, body in archives.read_members(data, akind, todo, self.limits):
                kind = wanted[info.path][1]
                mdoc = DocRef(f"{doc.source_id}/{info.path}", root.prefix, f"{rel}/{info.path}",
                              "member", root.chunker, root.chunk_size, root.chunk_overlap,
                              parent_doc_id=doc_id)
                mname = info.path.rsplit("/", 1)[-1]
                self.index(mdoc, kind=kind, size=info.size, mtime_ns=None,
                           content_hash=info.sha256, existed=f"{rel}/{info.path}" in old,
                           parse=lambda body=body, kind=kind, mname=mname:
                           parsers.parse_bytes(body, kind, mname))
        except archives.ArchiveRefused as exc:  # pragma: no cover - scan() saw the same bytes
            self._refuse_archive(doc, st, content_hash, exc.reason)
            return
        total = self.db.execute(
            "SELECT COALESCE(SUM(chunk_count), 0) FROM documents WHERE parent_doc_id=? "
            "AND status='done'", (doc_id,)).fetchone()[0]
        if not total:
            self.fail(doc, st.st_size, st.st_mtime_ns, "empty-document",
                      _REASON_MESSAGE["empty-archive"], content_hash=content_hash, empty=True,
                      kind="archive")
            return
        now = now_rfc3339()
        with self.tx():
            self.db.execute(
                """UPDATE documents SET kind='archive', size=?, mtime_ns=?, content_hash=?,
                       status='done', chunk_count=?, error_code=NULL, error_message=NULL,
                       chunker_sig=?, stale=0, indexed_at=?, updated_at=? WHERE doc_id=?""",
                (st.st_size, st.st_mtime_ns, content_hash, total, doc.sig, now, now, doc_id))
        self.report["archives"]["indexed"] += 1

    def _refuse_archive(self, doc: DocRef, st: os.stat_result, content_hash: str | None,
                        reason: str) -> None:
        for (child,) in self.db.execute("SELECT doc_id FROM documents WHERE parent_doc_id=?",
                                        (doc.doc_id,)).fetchall():
            self.remove(child)
        self.fail(doc, st.st_size, st.st_mtime_ns, "archive-refused", archive_message(reason),
                  content_hash=content_hash, reason=reason, kind="archive")
        self.report["archives"]["refused"] += 1

    # -- runs ----------------------------------------------------------------------------
    def _tracked(self, where: str = "", params: Iterable[Any] = ()) -> dict[str, Any]:
        return {r["source_id"]: r for r in self.db.execute(
            f"SELECT {_ROW_COLUMNS} FROM documents WHERE origin IN ('file', 'archive') {where}",
            tuple(params))}

    def _emit(self, done: int, total: int, source: str, done_bytes: int, total_bytes: int) -> None:
        if self.progress:
            self.progress(done, total, source, done_bytes, total_bytes)

    def _process(self, plan: list[tuple[Root, str, Path, int]], rows: dict[str, Any]) -> None:
        total = len(plan)
        total_bytes = sum(p[3] for p in plan)
        done_bytes = 0
        self.report["files"] += total
        try:
            for i, (root, rel, real, size) in enumerate(plan):
                source_id = source_id_of(root.prefix, rel)
                try:
                    self.end_batch()
                    self._emit(i, total, source_id, done_bytes, total_bytes)
                    self.begin_batch()
                    self.file(root, rel, real, rows.get(source_id))
                except KeyboardInterrupt:
                    self.abort_batch()  # every file in the batch is whole: keep them
                    self._settle_opened()
                    self.maybe_commit(force=True)
                    raise SyncInterrupted(i, total) from None
                self._opened.clear()
                done_bytes += size
                self.files_done += 1
        except BaseException:
            self.abort_batch()
            raise
        self.end_batch(force=True)
        self._emit(total, total, "", done_bytes, total_bytes)

    def _settle_opened(self) -> None:
        """After an interrupt: put every row this file opened as ``processing`` back as it
        was (a new one is dropped), so ``index status`` stays true — the file's old chunks
        are still there, and its changed size/mtime makes the next sync redo it."""
        for doc_id, before in reversed(list(self._opened.items())):
            with self.tx():
                now = self.db.execute("SELECT status FROM documents WHERE doc_id=?",
                                      (doc_id,)).fetchone()
                if now is None or now[0] != "processing":
                    continue
                if before is None:
                    self.db.execute("DELETE FROM chunks WHERE doc_id=?", (doc_id,))
                    self.db.execute("DELETE FROM documents WHERE doc_id=?", (doc_id,))
                    self.log_change(doc_id, "remove")
                else:
                    self.db.execute("UPDATE documents SET status=?, kind=? WHERE doc_id=?",
                                    (before[0], before[1], doc_id))
        self._opened.clear()

    def run(self) -> dict[str, Any]:
        """Walk every root; see the module docstring.

        Raises:
            SyncInterrupted: Ctrl-C at any point of the run — while listing the roots,
                between or inside files, or while removing what is gone and committing
                at the end (what was done is kept and committed either way).
        """
        try:
            return self._run()
        except SyncInterrupted:
            raise
        except KeyboardInterrupt:  # outside the files: listing, removals, the last commit
            self.abort_batch()
            self.maybe_commit(force=True)
            raise SyncInterrupted(self.files_done, self.report["files"]) from None

    def _run(self) -> dict[str, Any]:
        started = time.monotonic()
        t_walk = time.perf_counter()
        plan: list[tuple[Root, str, Path, int]] = []
        listed: dict[str, set[str] | None] = {}
        for root in self.c.roots():
            rp = Path(root.path)
            if not rp.is_dir():
                listed[root.prefix] = None
                self.report["errors"].append({
                    "source": f"/{root.prefix}", "code": "root-not-found",
                    "message": f"sync: root-not-found - the folder {root.path} is missing or not "
                               "a folder; its documents are kept until it is back or the root "
                               f"is removed (`kith index remove {root.prefix}`)"})
                continue
            homes: list[str] = []
            unreadable: list[tuple[str, str]] = []
            files, complete = walk_root(rp, self.exclude, own_home=self.own_home,
                                        skipped=homes, filt=RootFilter.for_root(rp.resolve()),
                                        ignored=self.report["ignored"], unreadable=unreadable)
            self._skipped_homes(root, homes)
            self._unreadable(root, unreadable)
            listed[root.prefix] = {rel for rel, _ in files} if complete else None
            for rel, real in files:
                try:
                    size = real.stat().st_size
                except OSError:
                    size = 0
                plan.append((root, rel, real, size))
        rows = self._tracked()
        self.stages["walk"] += time.perf_counter() - t_walk
        self._process(plan, rows)
        for row in rows.values():
            seen = listed.get(row["root_prefix"], set())
            if seen is None:
                continue  # root missing or not completely listed: remove nothing
            if row["rel_path"] not in seen or (  # an id from before ids were NFC: replaced
                    row["source_id"] != source_id_of(row["root_prefix"], row["rel_path"])):
                self.remove(row["doc_id"])
        self.maybe_commit(force=True)
        self.c.record.set_meta("last_sync", now_rfc3339())
        self.report["seconds"] = round(time.monotonic() - started, 3)
        return self.report

    def run_paths(self, paths: Iterable[str | Path]) -> dict[str, Any]:
        """Sync only ``paths`` (absolute; files or folders, present or deleted) — the
        watcher's batch. A present folder is walked; a missing path removes its
        document, or every document below it. The report also lists the documents
        touched: ``"changes": [{"source", "op"}]`` (at most :attr:`MAX_NOTED`; more are
        counted in ``"changesMore"``)."""
        started = time.monotonic()
        self.changes = self.report["changes"] = []
        bases: list[tuple[Root, Path]] = []
        for root in self.c.roots():
            try:
                bases.append((root, Path(root.path).resolve(strict=True)))
            except OSError:
                continue
        plan: dict[str, tuple[Root, str, Path, int]] = {}
        gone: list[tuple[Root, str]] = []
        filters: dict[str, RootFilter] = {}
        for raw in paths:
            p = Path(os.path.abspath(raw))
            for root, base in bases:
                if not _inside(p, base) or p == base:
                    continue
                rel = p.relative_to(base).as_posix()
                if hidden(rel) or (self.exclude is not None and _inside(p, self.exclude)):
                    break
                if _in_kith_home(p, base, self.own_home):
                    break  # inside a Kith home: never indexed
                filt = filters.get(root.prefix)
                if filt is None:
                    filt = filters[root.prefix] = RootFilter.for_root(base)
                if filt.path_reason(rel, base) is not None:
                    break  # default exclude or .kithignore: never indexed
                if p.is_dir() and not p.is_symlink():
                    homes: list[str] = []
                    unreadable: list[tuple[str, str]] = []
                    files, _ = walk_root(p, self.exclude, own_home=self.own_home,
                                         skipped=homes, filt=filt, rel_prefix=rel,
                                         ignored=self.report["ignored"], unreadable=unreadable)
                    self._skipped_homes(root, [f"{rel}/{h}" if h else rel for h in homes])
                    self._unreadable(root, unreadable)
                    for sub, real in files:
                        r = f"{rel}/{sub}"
                        plan[source_id_of(root.prefix, r)] = (root, r, real, _size(real))
                    gone.append((root, rel + "/"))  # documents below that are gone
                elif accept_file(p, base, self.exclude, self.own_home):
                    plan[source_id_of(root.prefix, rel)] = (root, rel, p, _size(p))
                else:
                    gone.append((root, rel))
                    gone.append((root, rel + "/"))
                break
        ids = list(plan)
        rows: dict[str, Any] = {}
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            rows.update(self._tracked(f"AND source_id IN ({','.join('?' * len(part))})", part))
        self._process(sorted(plan.values(), key=lambda p: (p[0].prefix, p[1])), rows)
        for root, rel in gone:
            if rel.endswith("/"):
                cands = self.db.execute(
                    "SELECT doc_id, source_id FROM documents WHERE origin IN ('file', 'archive') "
                    "AND root_prefix=? AND substr(rel_path, 1, ?)=?",
                    (root.prefix, len(rel), rel)).fetchall()
            else:
                cands = self.db.execute(
                    "SELECT doc_id, source_id FROM documents WHERE origin IN ('file', 'archive') "
                    "AND root_prefix=? AND rel_path=?", (root.prefix, rel)).fetchall()
            for doc_id, source_id in cands:
                if source_id not in plan:
                    self.remove(doc_id)
        self.maybe_commit(force=True)
        self.report["seconds"] = round(time.monotonic() - started, 3)
        return self.report


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def run_sync(corpus: Corpus, progress: Progress | None, mode: str = "new_only",
             limits: archives.ArchiveLimits = archives.DEFAULT_LIMITS,
             timings: dict[str, float] | None = None) -> dict[str, Any]:
    """Run one sync with the writer held by ``corpus``; returns the sync report
    (``timings``, when given, gets :attr:`Writer.stages`, also when the run fails)."""
    run = Sync(corpus, progress, mode, limits)
    try:
        return run.run()
    finally:
        if timings is not None:
            timings.update(run.stages)
