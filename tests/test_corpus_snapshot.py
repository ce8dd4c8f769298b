"""Searches read one immutable index generation (issue 44 item 1, specs/corpus.md
"Generations"): a search takes the current generation at its start, never waits for the
writer's lock, and answers from that one generation while a sync publishes the next.
Real SQLite and tantivy; the sync and the searches run on real threads."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from node.corpus import ingest
from node.corpus.snapshot import _stamp
from node.corpus.store import Corpus

VERSIONS = 6  # syncs per test, alternating the changing file's text


def _text(name: str, version: int) -> str:
    # paragraphs the 200-character chunker keeps apart: every chunk names its version
    return "".join(f"# {name} part {p}\n\nzebra crossing {name} marker{version} paragraph "
                   f"{p} {'filler words ' * 8}\n\n" for p in range(4))


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture()
def notes(tmp_path: Path):
    root = tmp_path / "notes"
    root.mkdir()
    (root / "keep.md").write_text(_text("keep", 0))
    (root / "moving.md").write_text(_text("moving", 0))
    with Corpus(tmp_path / "home") as c:
        c.add_root(root, chunk_size=200, chunk_overlap=0)
        c.sync()
    return tmp_path / "home", root


def _consistent(hits) -> set[str]:
    """Every hit's text is of the version its content hash names, and all hits of one
    document are of one version; returns the content hashes seen."""
    seen: dict[str, str] = {}
    for h in hits:
        name = h.source_id.rsplit("/", 1)[-1].removesuffix(".md")
        versions = [v for v in range(VERSIONS + 1) if f"marker{v} " in h.text]
        assert len(versions) == 1, h.text
        assert h.content_hash == _hash(_text(name, versions[0])), (h.source_id, versions)
        assert seen.setdefault(h.source_id, h.content_hash) == h.content_hash
    return set(seen.values())


def _search_in_thread(c: Corpus) -> list:
    """Run a search on another thread and wait for it (bounded): it must finish while the
    caller's thread holds the writer's lock."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(
        c.search_hits("zebra crossing", limit=20, max_per_document=10)[0]), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "a search waited for the writer's lock"
    return out[0]


def test_a_search_during_a_sync_of_the_same_handle_answers_from_the_generation_before_it(
        notes, monkeypatch):
    home, root = notes
    monkeypatch.setattr(ingest, "COMMIT_EVERY_CHUNKS", 1)  # tantivy commits mid-sync too
    with Corpus(home) as c:
        before = c.search_hits("zebra crossing", limit=20, max_per_document=10)[0]
        assert {h.source_id.split("/")[-1] for h in before} == {"keep.md", "moving.md"}
        _consistent(before)
        for v in range(1, VERSIONS + 1):
            (root / "moving.md").write_text(_text("moving", v))
            (root / "other.md").write_text(_text("other", v))  # synced after moving.md
            during: list[list] = []
            published = c.snapshot()
            committed = []

            def progress(done: int, total: int, *_rest: object) -> None:
                if done < total:  # the writer holds the lock here, mid-sync
                    assert c.record.lock._is_owned()
                    committed.append(published.stamp != _stamp(c.record))  # meta.json moved
                    during.append(_search_in_thread(c))

            c.sync(progress=progress)
            assert during and any(committed)  # the index moved while the searches ran
            for hits in during:
                _consistent(hits)
                # the file changed on disk is withheld (origin check); nothing of the new
                # version is served before the sync has published it
                assert {h.chunk_id for h in hits} <= {h.chunk_id for h in before}
                assert all("keep.md" in h.source_id for h in hits)
            after = c.search_hits("zebra crossing", limit=20, max_per_document=10)[0]
            assert _hash(_text("moving", v)) in _consistent(after)
            assert {h.source_id.split("/")[-1] for h in after} == {"keep.md", "moving.md", "other.md"}
            before = after


def test_a_reader_handle_never_mixes_versions_while_another_handle_syncs(notes, monkeypatch):
    home, root = notes
    monkeypatch.setattr(ingest, "COMMIT_EVERY_CHUNKS", 1)  # tantivy commits after each file
    reader = Corpus(home, readonly=True)
    try:
        _consistent(reader.search_hits("zebra crossing", limit=20, max_per_document=10)[0])
        with Corpus(home) as writer:
            for v in range(1, VERSIONS + 1):
                (root / "moving.md").write_text(_text("moving", v))
                (root / "keep.md").write_text(_text("keep", v))
                answers: list[list] = []

                def progress(done: int, total: int, *_rest: object) -> None:
                    answers.append(_search_in_thread(reader))

                writer.sync(progress=progress)
                assert len(answers) >= 2
                for hits in answers:
                    _consistent(hits)
                final = reader.search_hits("zebra crossing", limit=20, max_per_document=10)[0]
                assert _consistent(final) == {_hash(_text("keep", v)), _hash(_text("moving", v))}
    finally:
        reader.close()


def test_the_generation_is_read_without_the_writers_lock(notes):
    """``Corpus.generation()`` (what the lens keys of the gate, the warm views, the inline
    answer costs and the copy decisions are keyed on) is the published generation's
    number: read while a writer of this process holds the lock, even by an event loop
    that never waits (``wait=False``), and it moves only when the sync publishes."""
    home, root = notes
    with Corpus(home) as c:
        c.search_hits("zebra crossing", limit=5)
        number = c.generation(wait=False)
        assert number == c.snapshot().number and number > 0
        (root / "moving.md").write_text(_text("moving", 1))
        seen: list = []

        def progress(done: int, total: int, *_rest: object) -> None:
            assert c.record.lock._is_owned()
            t = threading.Thread(target=lambda: seen.append((c.generation(wait=False),
                                                             c.generation())), daemon=True)
            t.start()
            t.join(60)
            assert not t.is_alive(), "the generation waited for the writer's lock"

        c.sync(progress=progress)
        assert seen and all(pair == (number, number) for pair in seen)
        assert c.generation(wait=False) == c.snapshot().number > number


def test_a_root_another_process_removed_is_never_served_while_this_process_holds_the_lock_for_a_read(notes):
    """A root removed by another process (``kith index remove``) while a reader holds this process's corpus
    lock for something that is not a write — ``stats()``, a host warming a peer's view,
    ``index_syncing()``: the next search waits for the lock and answers from the index
    without the root. It once kept the generation before the removal ("a writer holds the
    lock"), whose roots still held the folder, and served the removed root's files (their
    origin check passes: they are unchanged on disk) — seen on a running ``kith host``,
    whose first answer after the removal sent every removed source to a peer. A search
    during a *write* of this process still keeps its generation without waiting (above)."""
    home, _root = notes
    reader = Corpus(home, readonly=True)
    try:
        assert {h.source_id for h in reader.search_hits("zebra crossing", limit=5)[0]}
        with Corpus(home) as other:  # another handle: another process's, as far as generations go
            assert other.remove_root("notes")["documents"] == 2
        held, release = threading.Event(), threading.Event()

        def read_under_the_lock() -> None:
            with reader.record.lock:
                held.set()
                release.wait(10)

        t = threading.Thread(target=read_under_the_lock, daemon=True)
        t.start()
        held.wait(10)
        threading.Timer(0.3, release.set).start()  # the read ends a moment later
        hits = reader.search_hits("zebra crossing", limit=5)[0]
        t.join(10)
        assert [h.source_id for h in hits] == []
    finally:
        reader.close()
