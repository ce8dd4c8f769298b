"""Live re-indexing: ``kith index watch`` and ``kith host --watch`` (DESIGN §9).

Built on ``watchfiles`` (Rust ``notify`` underneath: inotify/FSEvents/ReadDirectoryChangesW,
with polling as the fallback), which batches file-system events and debounces them. On
start the watcher takes the index writer lock and keeps it (one writer at a time; a
``kith index sync`` meanwhile gets ``index-locked`` naming this process), runs one
``new_only`` sync to catch up with what changed while nobody watched, then applies each
debounced batch with :meth:`node.corpus.store.Corpus.sync_paths` — only the paths in the
batch are looked at, never the whole tree.

Ignored: paths with a hidden segment (``.git/...``, ``.notes.swp``), the node's own
corpus folder when it lies inside a root. Roots added while watching are picked up by
the next start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from node.common.host_events import IndexChange, IndexUpdated
from node.corpus import ingest
from node.corpus.store import Corpus

#: Debounce window (ms): changes within it are applied as one batch.
DEFAULT_DEBOUNCE_MS = 400


class CorpusWatcher:
    """Watch every root of ``home``'s corpus and keep the index current.

    Args:
        home: the node home.
        debounce_ms: batching window in milliseconds.
        on_report: called with each batch's sync report (see ``Corpus.sync``), plus
            ``"paths"``: how many changed paths the batch held.
        force_polling: use polling instead of OS notifications (network shares).

    Use :meth:`start` (takes the writer, catches up), then :meth:`run` (blocking) or
    :meth:`arun` (async), and :meth:`close`. Thread-safe :meth:`stop`.
    """

    def __init__(self, home: Path | str, *, debounce_ms: int = DEFAULT_DEBOUNCE_MS,
                 on_report: Callable[[dict[str, Any]], None] | None = None,
                 force_polling: bool | None = None) -> None:
        self.home = Path(home)
        self.debounce_ms = debounce_ms
        self.on_report = on_report
        self.force_polling = force_polling
        self.corpus: Corpus | None = None
        self._stop = threading.Event()
        self._astop: Any = None
        self._exclude: Path | None = None
        self._bases: list[Path] = []

    def start(self) -> dict[str, Any]:
        """Take the writer lock (kept until :meth:`close`), repair the index, and run a
        catch-up sync.

        Returns:
            The catch-up sync report.

        Raises:
            CorpusError: ``index-locked`` when another process writes the index.
        """
        corpus = Corpus(self.home)
        try:
            corpus.hold_writer()
            report = corpus.sync()
        except BaseException:
            corpus.close()
            raise
        self.corpus = corpus
        self._exclude = corpus.dir.resolve()
        self._bases = []
        for root in corpus.roots():
            try:
                self._bases.append(Path(root.path).resolve(strict=True))
            except OSError:
                continue
        return report

    def paths(self) -> list[str]:
        """The folders being watched (resolved roots that exist)."""
        return [str(b) for b in self._bases]

    def _filter(self, _change: Any, path: str) -> bool:
        p = Path(path)
        if self._exclude is not None and p.is_relative_to(self._exclude):
            return False
        for base in self._bases:
            if p.is_relative_to(base):
                # hidden paths, and names that are not UTF-8 (the walk never reads them)
                return not any(part.startswith(".") or not ingest._utf8_name(part)
                               for part in p.relative_to(base).parts)
        return False

    def apply(self, changes: Iterable[tuple[Any, str]]) -> dict[str, Any] | None:
        """Apply one batch of ``(change, path)`` pairs; returns its report (None when
        the batch held nothing to look at)."""
        assert self.corpus is not None, "start() first"
        paths = sorted({p for _, p in changes if self._filter(None, p)})
        if not paths:
            return None
        report = self.corpus.sync_paths(paths)
        report["paths"] = len(paths)
        if self.on_report is not None:
            self.on_report(report)
        return report

    def run(self) -> None:
        """Block, applying batches, until :meth:`stop` (or KeyboardInterrupt)."""
        import watchfiles

        if not self._bases:
            self._stop.wait()
            return
        for changes in watchfiles.watch(*self._bases, watch_filter=self._filter,
                                        debounce=self.debounce_ms, step=50,
                                        stop_event=self._stop, rust_timeout=500,
                                        yield_on_timeout=False, raise_interrupt=True,
                                        force_polling=self.force_polling):
            self.apply(changes)

    async def arun(self) -> None:
        """Async :meth:`run` (the host's task group); batches are applied in a worker
        thread so sessions keep being served."""
        import anyio
        import watchfiles

        self._astop = anyio.Event()
        if self._stop.is_set():
            return
        if not self._bases:
            await self._astop.wait()
            return
        async for changes in watchfiles.awatch(*self._bases, watch_filter=self._filter,
                                               debounce=self.debounce_ms, step=50,
                                               stop_event=self._astop,
                                               force_polling=self.force_polling):
            await anyio.to_thread.run_sync(self.apply, changes)

    def stop(self) -> None:
        """Ask :meth:`run`/:meth:`arun` to return (from any thread of the host's loop)."""
        self._stop.set()
        if self._astop is not None:
            self._astop.set()

    def close(self) -> None:
        """Stop and release the writer lock. Idempotent."""
        self.stop()
        if self.corpus is not None:
            self.corpus.close()
            self.corpus = None


def host_watcher(home: Path | str, on_event: Callable[[dict[str, Any]], None],
                 warn: Callable[[str], None]) -> CorpusWatcher:
    """Start the watcher of ``kith host --watch``: takes the writer lock and catches up
    (warning about failed files), then reports each batch as an ``index-updated`` event
    ``{"event", "indexed", "updated", "removed", "failed", "empty", "chunks", "changes":
    [{"source", "op"}]}`` (the documents touched, at most 50, see
    :meth:`node.corpus.ingest.Sync.run_paths`).

    Raises:
        CorpusError: ``index-locked`` when another process writes the index.
    """
    keys = ("indexed", "updated", "removed", "failed", "empty", "chunks")

    def on_report(report: dict[str, Any]) -> None:
        on_event(IndexUpdated(**{k: report[k] for k in keys},
                              changes=[IndexChange(**c) for c in report.get("changes") or []]).to_dict())

    watcher = CorpusWatcher(home, on_report=on_report)
    report = watcher.start()
    if report["failed"] or report["empty"]:
        warn(f"{report['failed'] + report['empty']} document(s) could not be indexed; "
             "see `kith index status`.")
    return watcher
