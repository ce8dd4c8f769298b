"""A copy's index is built aside and swapped in whole (issue 42): a search of a copy while
its sync indexes answers from the last whole index — never an empty answer or
index-syncing from one half-written (it did in 4 of 45 asks) — and the new one answers
once it is whole."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from node.guest.copies.search import search_copy
from node.guest.copies.store import BUILD_PREFIX, INDEX_LINK, CopyStore

from support.copies import copy_host, first_copy


def _sources(guest: Path, query: str) -> set[str]:
    answer = search_copy(guest, "alice", {"query": query, "topK": 5})
    assert answer["status"] in ("ok", "no-verified-results"), answer["status"]
    return {r["source"] for r in answer["envelope"]["results"]}


def test_a_search_while_the_copys_index_is_built_answers_from_the_last_whole_one(tmp_path: Path) -> None:
    home, _kb = copy_host(tmp_path)
    guest, _key = first_copy(home, tmp_path)
    store = CopyStore(guest, "alice")
    assert _sources(guest, "journal mode WAL readers") == {"/kb/sqlite.md"}
    # a rebuild from docs/ (a schema change, a damaged index, `kith index sync`): in place it
    # started from an empty index; aside, the last whole index answers until it is swapped in
    built, report = store.build_index(None, fresh=True)
    assert report["indexed"] == len(store.load()["documents"]), report
    live = (store.dir / INDEX_LINK).resolve()
    assert live != built.resolve()
    assert _sources(guest, "journal mode WAL readers") == {"/kb/sqlite.md"}  # mid-rebuild: the last whole one
    store.swap_index(built)
    assert (store.dir / INDEX_LINK).is_symlink() and (store.dir / INDEX_LINK).resolve() == built.resolve()
    assert _sources(guest, "journal mode WAL readers") == {"/kb/sqlite.md"}  # the new one, once whole
    # the build before it is kept (a search may be opening it), older ones are deleted
    assert len(list(store.dir.glob(BUILD_PREFIX + "*"))) == 2
    store.index([])
    assert len(list(store.dir.glob(BUILD_PREFIX + "*"))) == 2


def test_a_failed_build_leaves_the_live_index_as_it_was(tmp_path: Path) -> None:
    home, _kb = copy_host(tmp_path)
    guest, _key = first_copy(home, tmp_path)
    store = CopyStore(guest, "alice")
    live = (store.dir / INDEX_LINK).resolve()
    builds = sorted(store.dir.glob(BUILD_PREFIX + "*"))
    store.docs.rename(store.dir / "docs-away")  # a folder in docs/'s place: the build cannot index it
    (store.dir / "docs").write_text("not a folder")
    try:
        store.index(None)
    except Exception:  # noqa: BLE001 - whatever the corpus code refuses it with
        pass
    assert (store.dir / INDEX_LINK).resolve() == live
    assert sorted(store.dir.glob(BUILD_PREFIX + "*")) == builds  # the failed build is gone
    (store.dir / "docs").unlink()
    (store.dir / "docs-away").rename(store.docs)
    assert _sources(guest, "journal mode WAL readers") == {"/kb/sqlite.md"}


def test_the_index_folder_of_an_older_kith_is_moved_aside_at_the_next_build(tmp_path: Path) -> None:
    home, _kb = copy_host(tmp_path)
    guest, _key = first_copy(home, tmp_path)
    store = CopyStore(guest, "alice")
    link = store.dir / INDEX_LINK
    target = link.resolve()
    os.unlink(link)
    shutil.move(str(target), str(link))  # as an older Kith kept it: a real folder
    for old in store.dir.glob(BUILD_PREFIX + "*"):
        shutil.rmtree(old)
    assert _sources(guest, "journal mode WAL readers") == {"/kb/sqlite.md"}
    store.index(None)
    assert link.is_symlink()
    assert _sources(guest, "journal mode WAL readers") == {"/kb/sqlite.md"}
