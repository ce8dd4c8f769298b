"""The optional dense/hybrid pass (issue 4 item 7; specs/corpus.md "Dense/hybrid").

Everything here but the ``hybrid``-marked test runs WITHOUT the extra: the model is
replaced by :class:`ConceptEmbedder`, a tiny deterministic embedder passed in explicitly
(a test double for the optional model, which is out of CI's default run). The vector
table, the consistency rules, the brute-force ranking, the fusion with BM25, the
controller report and the CLI are the real code on a real SQLite/tantivy corpus.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from support.homes import initialized
import typer
from typer.testing import CliRunner

from node.cli import main as cli_main
from node.cli.index_cmd import index_app, search_cmd
from node.answer import contract, envelope
from node.corpus import dense, retrieval
from node.corpus.store import Corpus

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "specs" / "search-envelope.schema.json").read_text())

# words of one concept share one dimension: "automobile" lands on "car" with no shared
# word (and none of these pairs is in retrieval.LEXICON, so only the dense pass can link them)
CONCEPTS = {"automobile": "car", "vehicle": "car", "sedan": "car", "car": "car",
            "upkeep": "maintenance", "servicing": "maintenance", "maintenance": "maintenance",
            "feline": "cat", "kitten": "cat", "cat": "cat"}


class ConceptEmbedder:
    """Deterministic bag-of-concepts embedder (a stand-in for the optional model)."""

    dim = 1024

    def __init__(self, model_id: str = "test-concepts-v1") -> None:
        self.model_id = model_id
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in "".join(c.lower() if c.isalnum() else " " for c in text).split():
                concept = CONCEPTS.get(word, word)
                out[i, int(hashlib.sha256(concept.encode()).hexdigest(), 16) % self.dim] += 1.0
            n = np.linalg.norm(out[i])
            if n:
                out[i] /= n
        return out


@pytest.fixture()
def kb(tmp_path: Path):
    root = tmp_path / "kb"
    root.mkdir()
    (root / "car.md").write_text("# Car care\n\nChange the car engine oil and check the tyres "
                                 "every spring.\n")
    (root / "pets.md").write_text("# Pets\n\nA cat sleeps most of the day; feed it twice.\n")
    (root / "notes.md").write_text("# Notes\n\nThe staging server restarts every night.\n")
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
    return home, root


def _vector_ids(corpus: Corpus) -> set[str]:
    return {r[0] for r in corpus.record.db.execute("SELECT chunk_id FROM chunk_vectors")}


def _chunk_ids(corpus: Corpus, name: str) -> set[str]:
    return {r[0] for r in corpus.record.db.execute(
        "SELECT c.chunk_id FROM chunks c JOIN documents d ON d.doc_id = c.doc_id "
        "WHERE d.source_id = ?", (f"/kb/{name}",))}


# -- the vector table ---------------------------------------------------------------------
def test_embed_then_replace_and_remove_keep_vectors_consistent(kb) -> None:
    home, root = kb
    fake = ConceptEmbedder()
    with Corpus(home) as c:
        rep = dense.embed_missing(c, fake, batch_size=2)
        assert rep["embedded"] == 3 and rep["current"] == 0 and rep["model"] == fake.model_id
        assert _vector_ids(c) == _chunk_ids(c, "car.md") | _chunk_ids(c, "pets.md") | \
            _chunk_ids(c, "notes.md")
        assert dense.embed_missing(c, fake)["embedded"] == 0  # nothing to do twice
        old_car = _chunk_ids(c, "car.md")

        (root / "car.md").write_text("# Car care\n\nWash the sedan before winter.\n")
        (root / "notes.md").unlink()
        c.sync()
        # the replaced chunk's and the removed file's vectors went with their chunks
        assert not (_vector_ids(c) & old_car)
        assert _vector_ids(c) == _chunk_ids(c, "pets.md")
        rep = dense.embed_missing(c, fake)
        assert rep["embedded"] == 1 and rep["current"] == 1  # only the changed chunk
        assert _vector_ids(c) == _chunk_ids(c, "car.md") | _chunk_ids(c, "pets.md")


def test_stale_or_foreign_vectors_are_never_used(kb) -> None:
    home, _root = kb
    fake = ConceptEmbedder()
    with Corpus(home) as c:
        dense.embed_missing(c, fake)
        car = next(iter(_chunk_ids(c, "car.md")))
        assert dense.dense_rank(c, "automobile", fake, 5)[0][0] == car
        # a vector computed from other text (an older title/heading, say) is stale
        c.record.db.execute("UPDATE chunk_vectors SET text_hash = ? WHERE chunk_id = ?",
                      ("0" * 64, car))
        assert car not in {cid for cid, _ in dense.dense_rank(c, "automobile", fake, 5)}
        assert dense.embed_missing(c, fake)["embedded"] == 1  # and gets recomputed
        assert dense.dense_rank(c, "automobile", fake, 5)[0][0] == car
        # a broken row (truncated blob) is skipped, not a crash
        c.record.db.execute("UPDATE chunk_vectors SET vec = ? WHERE chunk_id = ?", (b"\x00" * 6, car))
        assert car not in {cid for cid, _ in dense.dense_rank(c, "automobile", fake, 5)}
        assert dense.embed_missing(c, fake)["embedded"] == 1  # and gets recomputed
        # a NaN row never poisons the ranking
        nan = np.full(fake.dim, np.nan, dtype=np.float32).tobytes()
        pets = next(iter(_chunk_ids(c, "pets.md")))
        c.record.db.execute("UPDATE chunk_vectors SET vec = ? WHERE chunk_id = ?", (nan, pets))
        assert [cid for cid, _ in dense.dense_rank(c, "automobile", fake, 1)] == [car]
        # vectors of another model are never compared with this one's
        other = ConceptEmbedder("test-concepts-v2")
        assert dense.dense_rank(c, "automobile", other, 5) == []
        rep = dense.embed_missing(c, other)
        assert rep["embedded"] == 3 and rep["pruned"] == 3  # the old model's rows go
        assert {r[0] for r in c.record.db.execute("SELECT DISTINCT model FROM chunk_vectors")} == {
            "test-concepts-v2"}


def test_dense_rank_is_cosine_top_k_above_the_floor(kb) -> None:
    home, _root = kb
    fake = ConceptEmbedder()
    with Corpus(home) as c:
        dense.embed_missing(c, fake)
        ranked = dense.dense_rank(c, "kitten feed sleeps", fake, 10)
        assert [cid for cid, _ in ranked] == list(_chunk_ids(c, "pets.md"))  # others: cosine 0
        assert dense.MIN_SIMILARITY < ranked[0][1] <= 1.0
        # one shared concept in a longer chunk (cosine 0.27) is under the floor: no candidate
        assert dense.dense_rank(c, "kitten", fake, 10) == []
        assert len(dense.dense_rank(c, "car cat oil", fake, 1)) == 1
        assert dense.dense_rank(c, "zzzz qqqq", fake, 10) == []


# -- fusion and the controller report ------------------------------------------------------
def test_dense_pass_fuses_with_bm25_and_is_reported(kb) -> None:
    home, _root = kb
    fake = ConceptEmbedder()
    with Corpus(home) as c:
        dense.embed_missing(c, fake)
    with Corpus(home, readonly=True) as c:
        hits, ctl = c.search_hits("automobile upkeep", limit=5)
        assert hits == []  # no shared word: BM25 alone finds nothing
        assert [p["name"] for p in ctl["passes"]] == ["baseline-bm25", "rewrite-expanded"]
        extra, entry = dense.auto_pass(c, "automobile upkeep", k=40, embedder=fake)
        assert extra is None and entry is None  # not turned on: nothing runs
    with Corpus(home) as c:
        c.record.set_meta(dense.META_ENABLED, "1")
    with Corpus(home, readonly=True) as c:
        # one word of the question ("night") is in the corpus, on another page: the dense
        # pass adds the page that shares none of its words
        q = "automobile upkeep at night"
        extra, entry = dense.auto_pass(c, q, k=40, embedder=fake)
        assert entry["status"] == "ran" and entry["vectors"] == 3 and entry["chunks"] == 3
        hits, ctl = retrieval.run_search(c, q, limit=5, extra_passes=extra)
        car = next(h for h in hits if h.source_id == "/kb/car.md")
        assert car.score_components["dense"] > 0 and car.score_components["bm25"] == 0
        assert {"name": "dense", "status": "ran"} in [
            {k: p[k] for k in ("name", "status")} for p in ctl["passes"]]
        assert ctl["fusion"]["weights"]["dense"] == retrieval.PASS_WEIGHTS["dense"]
        extra = dense.auto_pass(c, "automobile upkeep", k=40, embedder=fake)[0]
        # a query both passes answer: fused, the lexical evidence kept
        hits, _ = retrieval.run_search(c, "car oil", limit=5,
                                       extra_passes=dense.auto_pass(c, "car oil", k=40,
                                                                    embedder=fake)[0])
        assert hits[0].source_id == "/kb/car.md"
        assert hits[0].score_components["bm25"] > 0 and hits[0].score_components["dense"] > 0
        # the envelope reports it and validates
        req = contract.validate({"query": "automobile upkeep at night", "topK": 5})
        hits, ctl = retrieval.run_search(c, req["query"], limit=5,
                                         extra_passes=dense.auto_pass(c, req["query"], k=40,
                                                                      embedder=fake)[0])
        env = envelope.build_envelope(req, hits, ctl)
        jsonschema.Draft202012Validator(SCHEMA).validate(env)
        assert {"name": "dense", "status": "ran"} in env["retrievalController"]["passes"]
        # the budget: a deadline already passed skips the pass, and says so
        extra, entry = dense.auto_pass(c, "automobile", k=40, embedder=fake,
                                       deadline=time.monotonic() - 1)
        assert extra is None and entry["status"] == "skipped"
        assert entry["reason"] == "budget-exhausted"


def test_a_question_whose_words_are_nowhere_in_the_corpus_gets_no_results(kb) -> None:
    """Lexical corroboration (issue 40): "automobile upkeep" shares no word with any
    indexed page, so the dense pass's nearest page (car.md, by meaning) is a near miss,
    not an answer — the search returns nothing (``no-verified-results`` for a peer) and
    the dense entry says why; without the rule car.md would be returned."""
    home, _root = kb
    fake = ConceptEmbedder()
    with Corpus(home) as c:
        dense.embed_missing(c, fake, enable=True)
    with Corpus(home, readonly=True) as c:
        extra, entry = dense.auto_pass(c, "automobile upkeep", k=40, embedder=fake)
        assert entry["status"] == "ran" and extra["dense"][0][0] in _chunk_ids(c, "car.md")
        req = contract.validate({"query": "automobile upkeep", "topK": 5})
        hits, ctl = retrieval.run_search(c, req["query"], limit=5, extra_passes=extra)
        assert hits == []
        assert {"name": "dense", "status": "ran", "candidates": 0,
                "reason": "no-lexical-match"} in [
            {k: p[k] for k in ("name", "status", "candidates", "reason") if k in p}
            for p in ctl["passes"]]
        env = envelope.build_envelope(req, hits, ctl)
        jsonschema.Draft202012Validator(SCHEMA).validate(env)
        assert env["results"] == []
        # one word of it in the corpus ("spring", in car.md): answered as before
        hits, _ = retrieval.run_search(c, "automobile upkeep in spring", limit=5,
                                       extra_passes=dense.auto_pass(
                                           c, "automobile upkeep in spring", k=40,
                                           embedder=fake)[0])
        assert hits and hits[0].source_id == "/kb/car.md"


def test_on_but_not_runnable_is_skipped_with_a_reason_and_changes_nothing(kb) -> None:
    """The owner turned the pass on, but the real model is missing (CI) or has no vectors
    (only the test model's exist): results are exactly the lexical ones, and the
    controller says why the dense pass did not run."""
    home, _root = kb
    with Corpus(home) as c:
        before, _ = c.search_hits("car oil", limit=5)
        dense.embed_missing(c, ConceptEmbedder())
        c.record.set_meta(dense.META_ENABLED, "1")
    with Corpus(home, readonly=True) as c:
        hits, ctl = c.search_hits("car oil", limit=5)
        want = "no-vectors" if dense.extra_available() else "dense-extra-missing"
        assert ctl["passes"][-1] == {"name": "dense", "status": "skipped", "candidates": 0,
                                     "reason": want}
        assert [(h.chunk_id, h.score) for h in hits] == [(h.chunk_id, h.score) for h in before]
        env = envelope.build_envelope(
            contract.validate({"query": "car oil", "topK": 5}), hits, ctl)
        jsonschema.Draft202012Validator(SCHEMA).validate(env)
        assert env["retrievalController"]["passes"][-1] == {
            "name": "dense", "status": "skipped", "reason": want}


def test_the_switch_reaches_a_running_readers_next_search(kb) -> None:
    """A search reads the dense switch from its generation, not SQLite
    (``Generation.dense_on``); turning the pass on or off in another handle (``kith index
    embed`` / ``kith index config --dense`` beside a running host) still applies from the
    reader's next search."""
    home, _root = kb
    with Corpus(home, readonly=True) as reader:  # a running host's handle
        _hits, ctl = reader.search_hits("car oil", limit=3)
        assert "dense" not in [p["name"] for p in ctl["passes"]]
        with Corpus(home) as writer:
            dense.embed_missing(writer, ConceptEmbedder(), enable=True)
        _hits, ctl = reader.search_hits("car oil", limit=3)
        entry = next(p for p in ctl["passes"] if p["name"] == "dense")
        assert entry["status"] == "skipped"  # on: the real model or its vectors missing here
        with Corpus(home) as writer:
            dense.set_enabled(writer, False)
        _hits, ctl = reader.search_hits("car oil", limit=3)
        assert "dense" not in [p["name"] for p in ctl["passes"]]


def test_off_by_default_imports_nothing_heavy(kb) -> None:
    home, _root = kb
    code = ("import sys; from node.corpus.store import Corpus; import node.cli.main\n"
            f"c = Corpus({str(home)!r}, readonly=True)\n"
            "hits, ctl = c.search_hits('car oil', limit=5)\n"
            "assert hits and all(p['name'] != 'dense' for p in ctl['passes']), ctl\n"
            "print([m for m in ('numpy', 'onnxruntime', 'tokenizers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    with Corpus(home, readonly=True) as c:
        assert dense.status(c) == {"enabled": False, "installed": dense.extra_available(),
                                   "tier": "static", "model": dense.STATIC_MODEL_PREFIX,
                                   "vectors": 0,
                                   "chunks": 3, "missing": 3, "staticQueries": None}


def test_embed_refuses_bad_input_and_readonly(kb) -> None:
    home, _root = kb
    with Corpus(home, readonly=True) as c:
        with pytest.raises(Exception) as exc:
            dense.embed_missing(c, ConceptEmbedder())
        assert getattr(exc.value, "code", None) == "corpus-readonly"
    with Corpus(home) as c:
        for bad in (0, 2000, True, "8"):
            with pytest.raises(Exception) as exc:
                dense.embed_missing(c, ConceptEmbedder(), batch_size=bad)
            assert getattr(exc.value, "code", None) == "query-invalid"

        class Wrong(ConceptEmbedder):
            def embed(self, texts):
                return np.zeros((len(texts), 3), dtype=np.float32)

        with pytest.raises(Exception) as exc:
            dense.embed_missing(c, Wrong())
        assert getattr(exc.value, "code", None) == "dense-unavailable"


# -- the CLI -----------------------------------------------------------------------------------
def _cli(home: Path):
    app = typer.Typer()
    app.callback()(cli_main._root)
    app.add_typer(index_app, name="index")
    app.command("search")(search_cmd)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["--home", str(initialized(home)), *args])


def test_cli_config_dense_and_status(kb) -> None:
    home, _root = kb
    run = _cli(home)
    r = run("index", "config")
    assert r.exit_code == 2  # neither a prefix nor --dense
    r = run("index", "config", "kb", "--dense", "on")
    assert r.exit_code == 2  # --dense applies to the whole corpus
    r = run("index", "config", "--dense", "maybe")
    assert r.exit_code == 2
    r = run("index", "config", "--dense", "off", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["dense"]["enabled"] is False
    r = run("index", "status", "--json")
    assert json.loads(r.stdout)["dense"]["missing"] == 3
    r = run("index", "config", "--dense", "on", "--json")
    if dense.extra_available():
        assert r.exit_code == 0 and json.loads(r.stdout)["dense"]["enabled"] is True
        run("index", "config", "--dense", "off")
    else:
        assert r.exit_code == 1 and getattr(r.exception, "code", None) == "dense-unavailable"
        r = run("index", "embed", "--json")
        assert r.exit_code == 1 and getattr(r.exception, "code", None) == "dense-unavailable"
    with Corpus(home, readonly=True) as c:
        assert not dense.enabled(c)


def test_index_status_says_whether_the_static_table_reads_questions_in_context(kb) -> None:
    """A table distilled before its projection existed reads a question word by word; one
    with its projection reads it in context (issue 40 item 3). `kith index status` did not
    say which; its --json says ``staticQueries`` and its dense line says it in words. (No
    model is run: the files are written with their records as the distillation does.)"""
    from node.cli.index_cmd import _dense_line

    home, _root = kb
    run = _cli(home)

    def reading() -> dict:
        r = run("index", "status", "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["dense"]

    assert reading()["staticQueries"] is None  # no table distilled here
    emb = dense.StaticMiniLM(home)
    emb.path.parent.mkdir(parents=True, exist_ok=True)
    emb._save(emb.path, np.zeros((8, dense.STATIC_DIM), dtype=np.float16))  # an older table: no projection
    older = reading()
    assert older["staticQueries"] == "words"
    assert "questions read word by word" in _dense_line(older) and "kith index embed" in _dense_line(older)
    projection = np.zeros((dense.DIM + 1, dense.STATIC_DIM), dtype=np.float32)
    emb._save(emb.projection_path, projection, tableSha256="0" * 64)  # names another table
    assert reading()["staticQueries"] == "words"
    emb._save(emb.projection_path, projection, tableSha256=hashlib.sha256(emb.path.read_bytes()).hexdigest())
    now = reading()
    assert now["staticQueries"] == "context"
    assert "questions read in context" in _dense_line(now) and "word by word" not in _dense_line(now)
    emb.projection_path.write_bytes(b"damaged")  # fails its check: the table alone reads it
    assert reading()["staticQueries"] == "words"


# -- the real model (optional extra) ----------------------------------------------------------
@pytest.mark.hybrid
@pytest.mark.timeout(1200)  # distils the static table: ~1 min of CPU, minutes on shared cores
def test_real_model_embeds_and_fuses(kb) -> None:
    if not dense.extra_available():
        pytest.skip("kith-node[hybrid] is not installed (missing: "
                    f"{', '.join(dense.missing_modules())}); install it with scripts/setup --hybrid")
    home, _root = kb
    run = _cli(home)
    r = run("index", "embed", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    # kith index embed distils the static table from the installed model, then embeds
    assert rep["embedded"] == 3 and rep["enabled"] is True
    assert rep["model"].startswith(dense.STATIC_MODEL_PREFIX) and rep["distillSeconds"] > 0
    static = dense.static_embedder(home)
    sv = static.embed(["a car", "an automobile", "a kitten"])
    assert sv.shape == (3, dense.STATIC_DIM)
    model = dense.shared_embedder()
    v = model.embed(["a car", "an automobile", "a kitten"])
    assert v.shape == (3, 384) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])  # meaning, not spelling
    with Corpus(home, readonly=True) as c:
        # "night" is on another page (a question with no indexed word gets no results)
        hits, ctl = c.search_hits("how do I look after my automobile at night", limit=3)
        dense_entry = next(p for p in ctl["passes"] if p["name"] == "dense")
        assert dense_entry["status"] == "ran" and dense_entry["vectors"] == 3
        car = next(h for h in hits if h.source_id == "/kb/car.md")
        assert car.score_components["dense"] > 0 and car.score_components["bm25"] == 0


@pytest.mark.hybrid
@pytest.mark.timeout(1200)  # distils the static table: ~1 min of CPU, minutes on shared cores
def test_a_plain_words_question_finds_a_page_sharing_none_of_its_words(tmp_path: Path) -> None:
    """The vocabulary bridge (issue 40 item 3): "delay before drawing the windows" and
    "wait until the keys are pressed" share no word with the page about ``time.sleep``
    ("suspends execution ... seconds"), and one each with the curses page. The lexical
    passes find only the curses page; the static tier, reading the question in context
    (the full model's token outputs projected into the table's space,
    :meth:`StaticMiniLM.embed_query`), puts the sleep page right after it. (Read word by
    word from the table, the second question ranked the textwrap page above it.)"""
    _static_or_skip()
    root = tmp_path / "kb"
    root.mkdir()
    pages = {
        "textwrap.md": "# textwrap\n\nfill(text, width=70) wraps the single paragraph in text "
                       "so that every line is at most width characters long, and returns one "
                       "string holding the wrapped paragraph.\n",
        "curses.md": "# curses\n\nThe curses library draws windows and menus on terminal "
                     "screens and reads the keys pressed.\n",
        "shutil.md": "# shutil\n\nCopy and move files and whole directory trees; remove a "
                     "tree.\n",
        "time.md": "# time\n\nsleep(secs) suspends execution of the calling thread for the "
                   "given number of seconds.\n",
        "re.md": "# re\n\nRegular expression operations: match a pattern against a string "
                 "and find every occurrence.\n",
        "random.md": "# random\n\nshuffle(x) puts the items of a sequence in a random order, "
                     "in place.\n",
    }
    for name, text in pages.items():
        (root / name).write_text(text)
    home = tmp_path / "home"
    questions = ("delay before drawing the windows", "wait until the keys are pressed")
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        for q in questions:  # without the bridge: the sleep page is not found
            assert [h.source_id for h in c.search_hits(q, limit=5)[0]] == ["/kb/curses.md"]
        rep = dense.embed_missing(c, enable=True)  # distils the table and its projection
        assert rep["embedded"] == 6 and rep["distillSeconds"] > 0
    emb = dense.static_embedder(home)
    assert emb.projection_path.is_file() and emb.contextual_queries
    v = emb.embed_query(questions[0])
    assert v.shape == (1, dense.STATIC_DIM) and abs(float(np.linalg.norm(v)) - 1.0) < 1e-4
    with Corpus(home, readonly=True) as c:
        for q in questions:
            hits, ctl = c.search_hits(q, limit=5)
            got = [h.source_id for h in hits]
            assert got[:2] == ["/kb/curses.md", "/kb/time.md"], (q, got)
            assert hits[1].score_components["bm25"] == 0 and hits[1].score_components["dense"] > 0
            entry = next(p for p in ctl["passes"] if p["name"] == "dense")
            assert entry["status"] == "ran" and entry["tier"] == "static"


# -- the static table (issue 10 item 3) -------------------------------------------------------
def _static_or_skip():
    if not dense.extra_available():
        pytest.skip("kith-node[hybrid] is not installed (missing: "
                    f"{', '.join(dense.missing_modules())})")


def _seed_table(home: Path) -> Path:
    """A stored table (random rows; the distillation itself needs the real model and is
    covered by the hybrid-marked test): the checks, weights and search are real."""
    rng = np.random.default_rng(10)
    table = rng.normal(size=(30522, dense.STATIC_DIM)).astype(np.float16)
    emb = dense.StaticMiniLM(home)
    emb._save(emb.path, table)
    return emb.path


def test_static_embedder_fits_weights_embeds_and_fuses(kb) -> None:
    _static_or_skip()
    home, root = kb
    _seed_table(home)
    with Corpus(home) as c:
        rep = dense.embed_missing(c, enable=True)
        assert rep["embedded"] == 3 and rep["distillSeconds"] == 0.0  # the stored table
        assert rep["model"].startswith(dense.STATIC_MODEL_PREFIX + ":")
        again = dense.embed_missing(c)
        assert again["embedded"] == 0 and again["current"] == 3 and again["model"] == rep["model"]
        assert dense.status(c)["vectors"] == 3 and dense.status(c)["model"] == rep["model"]
    emb = dense.StaticMiniLM(home)
    vecs = emb.embed(["car oil", "", "car oil"])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(dense.TOKENIZER_PATH))
    tok.no_padding()
    tok.no_truncation()
    for text in ("Change the car's engine-oil: every spring (twice)!",
                 "os.path.join(a, b) → PYTHONPATH=__init__ 3.14e-2 naïve café 日本"):
        assert emb._ids(text) == tok.encode(text, add_special_tokens=False).ids
    assert np.allclose(np.linalg.norm(vecs[0]), 1.0, atol=1e-5) and not vecs[1].any()
    assert np.array_equal(vecs[0], vecs[2])
    assert not emb.needs_fit(3) and emb.needs_fit(4)  # 3 -> 4 chunks is over 20 %
    with Corpus(home, readonly=True) as c:
        hits, ctl = c.search_hits("car oil", limit=3)
        entry = next(p for p in ctl["passes"] if p["name"] == "dense")
        assert entry["status"] == "ran" and entry["vectors"] == 3


def test_static_table_that_fails_its_checksum_is_never_used(kb) -> None:
    _static_or_skip()
    home, _root = kb
    path = _seed_table(home)
    with Corpus(home) as c:
        dense.embed_missing(c, enable=True)
        before, _ = c.search_hits("car oil", limit=3)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    path.write_bytes(bytes(data))
    fresh = dense.StaticMiniLM(home)
    with pytest.raises(Exception) as exc:
        _ = fresh.model_id
    assert getattr(exc.value, "code", None) == "dense-unavailable"
    with Corpus(home, readonly=True) as c:
        extra, entry = dense.auto_pass(c, "car oil", k=5, embedder=fresh)
        assert extra is None and entry["reason"] == "dense-model-unavailable"
    with Corpus(home) as c:  # embed makes the table again (here: refuses the bad one)
        assert fresh.needs_fit(3) is False
        with pytest.raises(Exception):
            fresh._read(fresh.path)


class LeadingDimsEmbedder(ConceptEmbedder):
    """ConceptEmbedder in 256 dimensions whose mass is in the leading ones (as the static
    table's principal components are), allowed the two-stage search."""

    dim = 256

    def __init__(self, ordered: bool) -> None:
        super().__init__("test-leading-v1")
        self.ordered_dims = ordered

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = "".join(c.lower() if c.isalnum() else " " for c in text).split()
            for word in words:
                concept = CONCEPTS.get(word, word)
                h = int(hashlib.sha256(concept.encode()).hexdigest(), 16)
                out[i, h % dense.COARSE_DIM] += 1.0  # the leading dimensions carry it
                out[i, dense.COARSE_DIM + h % (self.dim - dense.COARSE_DIM)] += 0.25
            n = np.linalg.norm(out[i])
            if n:
                out[i] /= n
        return out


def test_two_stage_search_ranks_like_the_exact_pass(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    for i in range(40):
        extra = ("automobile upkeep, car maintenance, vehicle servicing" if i == 17
                 else f"ledger entry {i}")
        (root / f"n{i:02d}.md").write_text(f"# Note {i}\n\nA {extra} written on day {i}.\n")
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        dense.embed_missing(c, LeadingDimsEmbedder(False), enable=True)
    monkeypatch.setattr(dense, "COARSE_MIN_ROWS", 10)
    monkeypatch.setattr(dense, "COARSE_CANDIDATES", 5)  # 20 * k = 20 of 40 rows rescored
    with Corpus(home, readonly=True) as c:
        exact = dense.dense_rank(c, "car maintenance", LeadingDimsEmbedder(False), 1)
        assert dense.load_matrix(c, "test-leading-v1", 256).coarse is None
        two = dense.dense_rank(c, "car maintenance", LeadingDimsEmbedder(True), 1)
        assert dense.load_matrix(c, "test-leading-v1", 256).coarse is not None  # it ran
        assert two == exact and len(two) == 1
        (cid, score), = two
        doc = c.record.db.execute("SELECT d.rel_path FROM chunks k JOIN documents d "
                            "ON d.doc_id = k.doc_id WHERE k.chunk_id = ?", (cid,)).fetchone()[0]
        assert doc == "n17.md" and score > dense.MIN_SIMILARITY


# -- two tiers behind one switch (issue 21 item 2) ------------------------------------------------
class TierEmbedder(ConceptEmbedder):
    """ConceptEmbedder under a tier's model id (static prefix or the full model's id)."""

    def __init__(self, model_id: str, dim: int) -> None:
        super().__init__(model_id)
        self.dim = dim


STATIC_A = TierEmbedder(dense.STATIC_MODEL_PREFIX + ":aaaa:bbbb", 256)
STATIC_B = TierEmbedder(dense.STATIC_MODEL_PREFIX + ":cccc:dddd", 256)
MINILM = TierEmbedder(dense.MODEL_ID, dense.DIM)


def _models(c: Corpus) -> dict[str, int]:
    return dict(c.record.db.execute("SELECT model, COUNT(*) FROM chunk_vectors GROUP BY model"))


def test_tiers_keep_their_own_vectors_and_never_mix(kb) -> None:
    home, _root = kb
    with Corpus(home) as c:
        assert dense.tier(c) == "static"
        assert dense.embed_missing(c, STATIC_A)["embedded"] == 3
        rep = dense.embed_missing(c, MINILM)
        assert rep["embedded"] == 3 and rep["pruned"] == 0  # the static tier's rows stay
        assert _models(c) == {STATIC_A.model_id: 3, dense.MODEL_ID: 3}
        # each model ranks only its own vectors
        for model in (STATIC_A, MINILM):
            assert dense.load_matrix(c, model.model_id, model.dim).mat.shape == (3, model.dim)
        assert dense.dense_rank(c, "automobile", STATIC_B, 5) == []  # no vectors of its id
        # a new static table replaces the old static vectors, the full model's stay
        rep = dense.embed_missing(c, STATIC_B)
        assert rep["pruned"] == 3 and _models(c) == {STATIC_B.model_id: 3, dense.MODEL_ID: 3}
        # switching back to the full model needs no embedding
        assert dense.embed_missing(c, MINILM)["embedded"] == 0


def test_embed_killed_midway_resumes_without_redoing_finished_batches(kb) -> None:
    home, root = kb
    (root / "more.md").write_text("# More\n\n" + "\n\n".join(
        f"Paragraph {i} about the staging server." for i in range(4)) + "\n")
    with Corpus(home) as c:
        c.sync()
        total = c.stats()["chunks"]

        class Dies(ConceptEmbedder):
            def embed(self, texts):
                if self.calls >= 3:  # the load call, two batches, then killed in the third
                    raise KeyboardInterrupt
                return super().embed(texts)

        with pytest.raises(KeyboardInterrupt):
            dense.embed_missing(c, Dies(), batch_size=1)
        assert _models(c) == {"test-concepts-v1": 2}  # two batches were committed
        again = ConceptEmbedder()
        rep = dense.embed_missing(c, again, batch_size=1)
        assert rep["current"] == 2 and rep["embedded"] == total - 2


def test_cli_dense_model_switch_applies_from_the_next_query(kb) -> None:
    home, _root = kb
    run = _cli(home)
    assert run("index", "config", "--dense-model", "huge").exit_code == 2
    assert run("index", "config", "kb", "--dense-model", "minilm").exit_code == 2
    r = run("index", "config", "--dense-model", "minilm", "--json")
    if not dense.extra_available():
        assert r.exit_code == 1 and getattr(r.exception, "code", None) == "dense-unavailable"
        return
    assert r.exit_code == 0, r.output
    st = json.loads(r.stdout)["dense"]
    assert st["tier"] == "minilm" and st["model"] == dense.MODEL_ID and st["missing"] == 3
    with Corpus(home) as c:
        dense.embed_missing(c, STATIC_A)
        c.record.set_meta(dense.META_ENABLED, "1")
    with Corpus(home, readonly=True) as reader:  # a running host's handle
        _hits, ctl = reader.search_hits("car oil", limit=3)
        entry = next(p for p in ctl["passes"] if p["name"] == "dense")
        assert entry["status"] == "skipped" and entry["reason"] == "no-vectors"  # minilm's
        r = run("index", "config", "--dense-model", "static", "--json")
        assert r.exit_code == 0 and json.loads(r.stdout)["dense"]["tier"] == "static"
        assert dense.tier(reader) == "static"  # read per query: the next one uses it


def test_a_broken_full_model_skips_the_pass_and_bm25_still_answers(kb, monkeypatch) -> None:
    _static_or_skip()
    home, _root = kb
    with Corpus(home) as c:
        dense.embed_missing(c, MINILM)  # vectors in the full model's space
        dense.set_tier(c, "minilm")
        c.record.set_meta(dense.META_ENABLED, "1")
    broken = dense.OnnxMiniLM()
    monkeypatch.setattr(dense, "_SHARED", broken)
    monkeypatch.setattr(dense, "_sha256_file", lambda _p: "0" * 64)  # a corrupt model file
    with Corpus(home, readonly=True) as c:
        hits, ctl = c.search_hits("car oil", limit=3)
    assert hits and hits[0].source_id == "/kb/car.md"
    entry = next(p for p in ctl["passes"] if p["name"] == "dense")
    assert entry == {"name": "dense", "status": "skipped", "candidates": 0,
                     "reason": "dense-model-unavailable"}


@pytest.mark.hybrid
@pytest.mark.timeout(600)
def test_full_model_batches_match_one_text_at_a_time() -> None:
    """Length-bucketed, dynamically padded batches give each text the vector it gets
    alone (padding never leaks into the mean)."""
    if not dense.extra_available():
        pytest.skip("kith-node[hybrid] is not installed (missing: "
                    f"{', '.join(dense.missing_modules())}); install it with scripts/setup --hybrid")
    model = dense.OnnxMiniLM()
    texts = ["a car", "check the tyres every spring " * 3, "x", "the staging server restarts",
             "word " * 300]
    plan = model.batches(texts, budget=64)
    assert sorted(i for pos, _s in plan for i in pos) == list(range(len(texts)))
    for pos, seqs in plan:
        assert len(seqs) * max(map(len, seqs)) <= 64 or len(seqs) == 1
    assert max(len(s) for _p, ss in plan for s in ss) == dense.MAX_TOKENS  # cut at 256
    batched = {i: v for pos, seqs in plan for i, v in zip(pos, model.embed_ids(seqs))}
    for i, text in enumerate(texts):
        alone = model.embed_ids(model.tokenize([text]))[0]
        assert np.allclose(batched[i], alone, atol=1e-5)


def _read_with_minilm(home: Path, monkeypatch) -> None:
    """Embed ``home``'s corpus with the full model's tier and switch it on, the fake
    :data:`MINILM` standing in for the model and its extra (so no download runs here)."""
    with Corpus(home) as c:
        dense.embed_missing(c, MINILM)
        c.record.set_meta(dense.META_TIER, "minilm")
        c.record.set_meta(dense.META_ENABLED, "1")
    monkeypatch.setattr(dense, "corpus_embedder", lambda _c: MINILM)
    monkeypatch.setattr(dense, "missing_modules", lambda: ())  # the fake model stands in for the extra


def _minilm_kb(tmp_path: Path, monkeypatch, docs: dict[str, str]) -> Path:
    """A home whose root ``kb`` holds ``docs`` (file name → text) and three notes about the
    staging server (so no word is rare by accident), synced and read with the full model's
    tier (:func:`_read_with_minilm`). Returns the home."""
    root = tmp_path / "kb"
    root.mkdir()
    for name, text in docs.items():
        (root / name).write_text(text)
    for i in range(3):
        (root / f"n{i}.md").write_text(f"# Note {i}\n\nThe staging server restarts.\n")
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
    _read_with_minilm(home, monkeypatch)
    return home


def test_full_model_tier_is_fused_by_normalised_weighted_sum(kb, monkeypatch) -> None:
    """The minilm tier's dense pass is fused by the weighted sum of per-query
    max-normalised scores with its own weight (retrieval.FUSION); the envelope says so
    and validates."""
    home, _root = kb
    _read_with_minilm(home, monkeypatch)
    with Corpus(home, readonly=True) as c:
        hits, ctl = c.search_hits("car oil", limit=3)
        assert hits[0].source_id == "/kb/car.md" and hits[0].score_components["dense"] > 0
        assert ctl["fusion"]["method"] == retrieval.fusion_method("minilm") == "weighted-sum"
        assert ctl["fusion"]["weights"]["dense"] == retrieval.DENSE_WEIGHTS["minilm"]
        assert ctl["fusion"]["normalisation"]["dense"] == "minmax"
        req = contract.validate({"query": "car oil", "topK": 3})
        hits, ctl = c.search_hits(req["query"], limit=3)
        env = envelope.build_envelope(req, hits, ctl)
    jsonschema.Draft202012Validator(SCHEMA).validate(env)
    assert env["retrievalController"]["fusion"]["method"] == "weighted-sum"
    assert env["retrievalController"]["fusion"]["weights"]["dense"] == retrieval.DENSE_WEIGHTS["minilm"]


@pytest.mark.parametrize("word,read_whole,guarded,switch,unguarded", [
    # issue 40: a page only the dense pass finds (all about cats) never outranks the one
    # page holding the question's rare word, however close the meaning; without the
    # guard the dense page comes first
    ("zorblax", False, ["/kb/ops.md", "/kb/cats.md"], "RARE_TERM_GUARD", "/kb/cats.md"),
    # the guard covers only words the model cannot read whole: `pretend` is one WordPiece
    # token, so a page that merely holds it does not cap the page found by meaning (the
    # guard on every rare word put it first)
    ("pretend", True, ["/kb/cats.md"], "RARE_UNREAD_ONLY", "/kb/ops.md"),
])
def test_the_rare_term_guard_holds_only_for_words_the_model_cannot_read(
        tmp_path: Path, monkeypatch, word: str, read_whole: bool, guarded: list[str], switch: str,
        unguarded: str) -> None:
    """Lexical corroboration with the full model's tier (issue 40): a page about cats
    (found by meaning only) against the one page holding the question's rare ``word``.
    ``guarded``: the first results as shipped; with ``switch`` turned off,
    ``unguarded`` comes first (what the rule changes)."""
    assert (word in dense.model_words()) is read_whole
    home = _minilm_kb(tmp_path, monkeypatch, {
        "cats.md": "# Cat\n\nA cat. A kitten. A cat and a kitten.\n",
        "ops.md": f"# Operations\n\nThe {word} daemon restarts the staging "
                  "server every night and mails a report to the team.\n"})
    with Corpus(home, readonly=True) as c:
        hits, _ = c.search_hits(f"feline {word}", limit=3)
        assert [h.source_id for h in hits][:len(guarded)] == guarded, [h.source_id for h in hits]
        monkeypatch.setattr(retrieval, switch, False)
        hits, _ = c.search_hits(f"feline {word}", limit=3)
        assert hits[0].source_id == unguarded  # what the rule prevents


def test_a_page_the_model_finds_in_several_sections_beats_one_mention(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """Dense-led fusion of the full model (issue 40): a page whose every section is about
    the question (no word of it shared) outranks a one-line note that holds the question's
    everyday word, because a page's further chunks support it by their fused score
    whatever their BM25 (``retrieval.DENSE_SUPPORT_POWER``; with the lexical tiers'
    power 3 the note came first). The rare-term guard still has the last word: for a
    word the model cannot read whole (``upkeep``) the note stays first, support or not."""
    assert "care" in dense.model_words() and "upkeep" not in dense.model_words()

    def section(title: str) -> str:
        return f"## {title}\n\n" + "A kitten needs servicing. " * 60 + "\n\n"

    home = _minilm_kb(tmp_path, monkeypatch, {
        "kittens.md": "# Kittens\n\n" + section("Brushing") + section("Claws") + section("Teeth"),
        "notes.md": "# Notes\n\nThe upkeep of a cat needs care.\n"})
    with Corpus(home, readonly=True) as c:
        assert c.record.db.execute("SELECT COUNT(*) FROM chunks c JOIN documents d ON "
                                   "d.doc_id = c.doc_id WHERE d.rel_path = 'kittens.md'"
                                   ).fetchone()[0] >= 3
        hits, _ = c.search_hits("feline care", limit=3)
        assert [h.source_id for h in hits][:2] == ["/kb/kittens.md", "/kb/notes.md"]
        hits, _ = c.search_hits("feline upkeep", limit=3)
        assert hits[0].source_id == "/kb/notes.md", [h.source_id for h in hits]
        monkeypatch.setitem(retrieval.DENSE_SUPPORT_POWER, "minilm", retrieval.SUPPORT_POWER)
        hits, _ = c.search_hits("feline care", limit=3)
        assert hits[0].source_id == "/kb/notes.md"  # what the support power changes
