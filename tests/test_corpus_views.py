"""View indexes (node.corpus.views): a view's search sees exactly its documents, stays
current when they change, and shares or bounds its indexes (specs/corpus.md "Views")."""

from __future__ import annotations

from pathlib import Path

from node.corpus import views
from node.corpus.lens import lens_of
from node.corpus.store import Corpus


def _corpus(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    root, home = tmp_path / "notes", tmp_path / "home"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    with Corpus(home) as writer:
        writer.add_root(root)
        writer.sync()
    return root, home


def _resync(home: Path) -> None:
    with Corpus(home) as writer:
        writer.sync()


def public(source_id: str) -> bool:
    return source_id.startswith("/notes/pub/")


def test_a_view_sees_only_its_documents_and_the_owner_sees_all(tmp_path):
    _, home = _corpus(tmp_path, {"pub/a.md": "walrus notes\n", "priv/b.md": "walrus secret\n"})
    with Corpus(home, readonly=True) as corpus:
        assert corpus.warm_view(lens_of(corpus, public)) == 1
        owner, _ = corpus.search_hits("walrus", limit=5)
        peer, ctl = corpus.search_hits("walrus", limit=5, lens=lens_of(corpus, public))
        assert {h.source_id for h in owner} == {"/notes/pub/a.md", "/notes/priv/b.md"}
        assert [h.source_id for h in peer] == ["/notes/pub/a.md"]
        assert ctl["candidates"] == 1  # the hidden chunk was never a candidate


def test_a_kept_view_follows_changed_added_and_removed_visible_documents(tmp_path):
    root, home = _corpus(tmp_path, {"pub/a.md": "walrus one\n", "pub/b.md": "otter two\n"})
    with Corpus(home, readonly=True) as corpus:
        assert [h.source_id for h in corpus.search_hits("walrus", limit=5, lens=lens_of(corpus, public))[0]] == [
            "/notes/pub/a.md"]
        (root / "pub" / "a.md").write_text("otter now\n", encoding="utf-8")
        (root / "pub" / "c.md").write_text("walrus three\n", encoding="utf-8")
        (root / "pub" / "b.md").unlink()
        _resync(home)
        hits, _ = corpus.search_hits("walrus", limit=5, lens=lens_of(corpus, public))
        assert [h.source_id for h in hits] == ["/notes/pub/c.md"]
        otters, _ = corpus.search_hits("otter", limit=5, lens=lens_of(corpus, public))
        assert [(h.source_id, h.text.strip()) for h in otters] == [("/notes/pub/a.md", "otter now")]
        with Corpus(home, readonly=True) as fresh:  # a view built from scratch agrees
            again, _ = fresh.search_hits("otter", limit=5, lens=lens_of(fresh, public))
            assert [(h.source_id, h.score, h.score_components) for h in again] == [
                (h.source_id, h.score, h.score_components) for h in otters]


def test_lenses_with_the_same_documents_share_one_index_and_at_most_max_views_are_kept(
        tmp_path):
    _, home = _corpus(tmp_path, {f"d{i}/x.md": f"walrus {i}\n" for i in range(views.MAX_VIEWS + 2)})
    with Corpus(home, readonly=True) as corpus:
        corpus.search_hits("walrus", limit=5, lens=lens_of(corpus, lambda s: s.startswith("/notes/d0/")))
        corpus.search_hits("walrus", limit=5, lens=lens_of(corpus, lambda s: s.startswith("/notes/d0")))
        assert len(corpus.views) == 1
        for i in range(views.MAX_VIEWS + 2):
            def only(s: str, i: int = i) -> bool:
                return s.startswith(f"/notes/d{i}/")

            hits, _ = corpus.search_hits("walrus", limit=5, lens=lens_of(corpus, only))
            assert [h.source_id for h in hits] == [f"/notes/d{i}/x.md"]
        assert len(corpus.views) == views.MAX_VIEWS


def test_a_policy_change_reaches_the_next_query_of_a_peer(tmp_path):
    from node.answer.service import peer_knowledge
    from node.policy.gate import EgressGate
    from node.policy.store import Policy

    _, home = _corpus(tmp_path, {"pub/a.md": "walrus notes\n", "priv/b.md": "walrus more\n"})
    with Corpus(home, readonly=True) as corpus:
        policy = Policy()
        policy.set("/notes/pub/**", "public")
        gate = EgressGate(corpus.roots(), policy, home)
        first = peer_knowledge(corpus, gate, None).search({"query": "walrus", "topK": 5})
        assert [r["source"] for r in first["envelope"]["results"]] == ["/notes/pub/a.md"]
        wider = Policy()
        wider.set("/notes/**", "public")
        gate.policy = wider  # what current_policy() does when policy.toml changed
        second = peer_knowledge(corpus, gate, None).search({"query": "walrus", "topK": 5})
        assert sorted(r["source"] for r in second["envelope"]["results"]) == [
            "/notes/priv/b.md", "/notes/pub/a.md"]


def everything(source_id: str) -> bool:
    return True


def _ranked(corpus: Corpus, query: str, visible) -> list[tuple[str, float, object]]:
    hits, _ = corpus.search_hits(query, limit=10, lens=lens_of(corpus, visible))
    return [(h.source_id, h.score, h.score_components) for h in hits]


def _deleted_in_main(home: Path) -> int:
    import json

    meta = json.loads((home / "corpus" / "tantivy" / "meta.json").read_text())
    return sum((sg.get("deletes") or {}).get("num_deleted_docs", 0) for sg in meta["segments"])


def test_a_view_seeing_everything_is_served_from_the_main_index_with_the_same_ranking(
        tmp_path, monkeypatch):
    """A view that sees every document, on an index holding exactly the record, runs on
    the main on-disk index (no RAM copy, issue 10 item 5) and ranks exactly as its own
    RAM index would; while the main index counts a deleted document (a removed private
    file, until a merge drops it) or lags the record, the view gets its own index; a
    view that does not see everything never runs on the main index."""
    import sqlite3

    root, home = _corpus(tmp_path, {
        "pub/a.md": "# Walrus\n\nwalrus walrus tusk\n", "pub/b.md": "walrus and otter\n",
        "priv/c.md": "walrus secret otter otter\n"})

    def both(public_is_partial: bool) -> list:
        with Corpus(home, readonly=True) as corpus:
            corpus.record.searcher()
            view = corpus.view(lens_of(corpus, everything))
            assert view.on_main == (_deleted_in_main(home) == 0)
            if public_is_partial:
                assert not corpus.view(lens_of(corpus, public)).on_main
            served = _ranked(corpus, "walrus otter", everything)
        with Corpus(home, readonly=True) as corpus:  # the same view on its own RAM index
            monkeypatch.setattr(corpus.record, "main_searcher_for", lambda chunks: None)
            corpus.record.searcher()
            assert not corpus.view(lens_of(corpus, everything)).on_main
            assert _ranked(corpus, "walrus otter", everything) == served
        return served

    assert _deleted_in_main(home) == 0
    assert [s for s, _, _ in both(True)] == ["/notes/priv/c.md", "/notes/pub/b.md",
                                         "/notes/pub/a.md"]
    (root / "priv" / "c.md").unlink()  # deleted in the main index until a merge
    _resync(home)
    # the public view now sees everything too
    assert [s for s, _, _ in both(False)] == ["/notes/pub/b.md", "/notes/pub/a.md"]
    db = sqlite3.connect(home / "corpus" / "corpus.sqlite3")  # a change not yet applied
    db.execute("INSERT INTO changes(doc_id, op) SELECT doc_id, 'upsert' FROM documents")
    db.commit()
    db.close()
    with Corpus(home, readonly=True) as corpus:
        corpus.record.searcher()
        assert not corpus.view(lens_of(corpus, everything)).on_main


def test_a_view_whose_lens_hides_a_document_no_longer_counts_it(tmp_path):
    """A lens that hides a document the kept view holds (a policy change) gets a view that
    ranks exactly like one built from scratch: tantivy would count a deleted document in
    its statistics until a merge, so such a view is not updated in place (issue 29)."""
    _, home = _corpus(tmp_path, {"pub/a.md": "walrus tusk\n", "pub/b.md": "walrus walrus walrus otter\n",
                                 "pub/c.md": "walrus otter notes here\n", "priv/d.md": "walrus\n"})

    def no_b(s: str) -> bool:
        return public(s) and s != "/notes/pub/b.md"

    with Corpus(home, readonly=True) as corpus:
        corpus.search_hits("walrus otter", limit=5, lens=lens_of(corpus, public))  # kept
        builds = corpus.view_builds()
        after = _ranked(corpus, "walrus otter", no_b)
        assert corpus.view_builds() == builds + 1  # a new index, not the kept one updated
    with Corpus(home, readonly=True) as fresh:
        assert _ranked(fresh, "walrus otter", no_b) == after
    assert [s for s, _, _ in after] == ["/notes/pub/c.md", "/notes/pub/a.md"]


def test_a_view_is_built_outside_the_corpus_lock(tmp_path, monkeypatch):
    """While a new view's index is being built (a peer's first question, the host's
    warmer), the owner's search — which takes the corpus lock — still answers (issue 29
    item 4). The build is held at its start until the owner's search has answered."""
    import threading

    _, home = _corpus(tmp_path, {"pub/a.md": "walrus notes\n", "priv/b.md": "walrus secret\n"})
    started, release = threading.Event(), threading.Event()
    build = views._build

    def held_build(db, docs):
        started.set()
        assert release.wait(60), "the owner's search never answered"
        return build(db, docs)

    monkeypatch.setattr(views, "_build", held_build)
    with Corpus(home, readonly=True) as corpus:
        lens = lens_of(corpus, public)
        peer = threading.Thread(target=corpus.warm_view, args=(lens,))
        peer.start()
        assert started.wait(60)
        owner, _ = corpus.search_hits("walrus", limit=5)  # not held up by the build
        release.set()
        peer.join(60)
        assert len(owner) == 2 and not peer.is_alive()
        assert corpus.view_ready(lens) and corpus.view_builds() == 1
