"""Live re-indexing (issue 3 rule 7): `kith index watch` / `kith host --watch` pick up added,
changed and deleted files through watchfiles, debounced, one path batch at a time, while
holding the one index writer. Real file-system events, real SQLite/tantivy."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from node.corpus.store import Corpus
from node.corpus.watch import CorpusWatcher, host_watcher
from node.common.errors import CorpusError


def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _sources(c: Corpus, q: str) -> list[str]:
    return [h.source_id for h in c.search_hits(q, limit=10)[0]]


@pytest.fixture()
def setup(tmp_path: Path):
    home = tmp_path / "home"
    root = tmp_path / "notes"
    (root / "sub").mkdir(parents=True)
    (root / "a.md").write_text("# A\n\nthe first jackal note\n")
    for i in range(30):  # a tree the watcher must not rescan per change
        (root / "sub" / f"f{i}.txt").write_text(f"filler file {i}\n")
    with Corpus(home) as c:
        c.add_root(root)
    return home, root


def test_watch_applies_added_changed_and_deleted_files(setup) -> None:
    home, root = setup
    reports: list[dict] = []
    watcher = CorpusWatcher(home, debounce_ms=100, on_report=reports.append)
    first = watcher.start()  # catch-up sync
    assert first["indexed"] == 31
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    ro = Corpus(home, readonly=True)
    try:
        # one writer at a time: a sync meanwhile is refused, naming the watcher
        with Corpus(home) as other, pytest.raises(CorpusError) as e:
            other.sync()
        assert e.value.code == "index-locked" and "pid" in e.value.message

        # the OS watch is set up some time after run() starts: write until it is seen
        # (rewriting the same file is idempotent), instead of sleeping a guessed time
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            (root / "new.md").write_text("# New\n\na narwhal appears\n")
            if wait_for(lambda: _sources(ro, "narwhal") == ["/notes/new.md"], timeout=1.0):
                break
        assert _sources(ro, "narwhal") == ["/notes/new.md"]
        (root / "a.md").write_text("# A\n\nthe jackal became a dingo\n")
        assert wait_for(lambda: _sources(ro, "dingo") == ["/notes/a.md"])
        (root / "sub" / "f3.txt").unlink()
        # The serve-time check hides a deleted file at once, before the watcher sees the
        # event, so the search alone cannot tell that the watcher applied the deletion:
        # wait for the watcher's report (a report lands after its batch's commit).
        assert wait_for(lambda: sum(r["removed"] for r in reports) >= 1), reports
        assert "/notes/sub/f3.txt" not in _sources(ro, "filler 3")
        (root / ".hidden.md").write_text("secret ocelot\n")  # ignored
        (root / "sub2").mkdir()
        (root / "sub2" / "moved.txt").write_text("a moved margay\n")
        assert wait_for(lambda: _sources(ro, "margay") == ["/notes/sub2/moved.txt"])
        assert wait_for(lambda: sum(r["indexed"] for r in reports) >= 2), reports
        assert _sources(ro, "ocelot") == []
        assert all(r["files"] <= 2 for r in reports), reports  # batches, not rescans
    finally:
        ro.close()
        watcher.stop()
        thread.join(10)
        watcher.close()
    assert not thread.is_alive()
    with Corpus(home) as c:  # the lock is released on close
        assert c.sync()["indexed"] == 0


def test_host_watcher_holds_the_writer_and_reports_events(setup) -> None:
    home, root = setup
    events: list[dict] = []
    warnings: list[str] = []
    (root / "bad.txt").write_bytes(b"\x00\x01")
    watcher = host_watcher(home, events.append, warnings.append)
    try:
        assert warnings and "could not be indexed" in warnings[0]
        with Corpus(home) as other, pytest.raises(CorpusError) as e:
            other.import_records(root / "a.md", kind="k", instance="i")
        assert e.value.code == "index-locked"
        watcher.apply([(None, str(root / "a.md"))])  # what a batch from awatch does
        assert events == [{"event": "index-updated", "indexed": 0, "updated": 0, "removed": 0,
                           "failed": 0, "empty": 0, "chunks": 0, "changes": []}]
    finally:
        watcher.close()
    with Corpus(home) as c:
        c.sync()


def test_second_watcher_is_refused(setup) -> None:
    home, _root = setup
    one = CorpusWatcher(home)
    one.start()
    try:
        with pytest.raises(CorpusError) as e:
            CorpusWatcher(home).start()
        assert e.value.code == "index-locked"
    finally:
        one.close()
