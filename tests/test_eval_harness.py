"""scripts/eval's harness (issue 10, item 1): the metric functions on hand-made rankings with
known values, the committed dev/test split (disjoint, complete, reproducible from its seed,
no tuned-on question in it), the question-set loader's refusals, and the generated PDF/DOCX
documents. No network, no big corpus.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "scripts" / "eval_data"
sys.path.insert(0, str(REPO / "scripts"))

import eval_harness as H  # noqa: E402


def _grades(**kw: int) -> dict[str, int]:
    return dict(kw)


# --- metrics ------------------------------------------------------------------------------
def test_ndcg_mrr_recall_hit_on_a_hand_computed_ranking() -> None:
    # judged: a (grade 2), b (grade 1); ranking x, a, b
    # DCG  = (2^2-1)/log2(3) + (2^1-1)/log2(4) = 3/1.58496 + 0.5 = 2.39279
    # IDCG = 3/log2(2) + 1/log2(3) = 3 + 0.63093 = 3.63093  -> nDCG = 0.65900
    m = H.metrics(["x", "a", "b"], _grades(a=2, b=1), answer_grade=2, recall_grade=1)
    assert m["ndcg"] == pytest.approx(0.65900, abs=1e-5)
    assert m["mrr"] == pytest.approx(0.5)
    assert m["recall"] == 1.0 and m["hit"] == 1.0


def test_perfect_and_empty_rankings() -> None:
    g = _grades(a=2, b=1, c=1)
    assert H.metrics(["a", "b", "c"], g, answer_grade=2, recall_grade=1)["ndcg"] == 1.0
    none = H.metrics(["x", "y"], g, answer_grade=2, recall_grade=1)
    assert none == {"ndcg": 0.0, "recall": 0.0, "mrr": 0.0, "hit": 0.0}
    assert H.metrics([], g, answer_grade=2, recall_grade=1)["ndcg"] == 0.0


def test_partial_document_only_is_not_a_hit_and_recall_counts_its_grade() -> None:
    # only the grade-1 document b is found, at rank 1
    m = H.metrics(["b", "x"], _grades(a=2, b=1), answer_grade=2, recall_grade=1)
    assert m["mrr"] == 0.0 and m["hit"] == 0.0 and m["recall"] == 0.5
    assert m["ndcg"] == pytest.approx(1 / (3 + 1 / math.log2(3)))
    # with recall_grade 2 the grade-1 document does not count for recall
    assert H.metrics(["b"], _grades(a=2, b=1), answer_grade=2, recall_grade=2)["recall"] == 0.0


def test_only_the_top_ten_count_and_repeats_gain_nothing() -> None:
    ranked = H.doc_ranking(["x"] * 3 + ["a", "a"] + [f"y{i}" for i in range(10)] + ["b"])
    assert ranked[:5] == ["x", None, None, "a", None] and len(ranked) == 10
    m = H.metrics(ranked, _grades(a=2, b=2), answer_grade=2, recall_grade=1)
    assert m["mrr"] == pytest.approx(1 / 4)  # a at position 4, b beyond the cut
    assert m["recall"] == 0.5
    # the repeat of a at position 5 adds nothing: same DCG as a alone at position 4
    assert m["ndcg"] == pytest.approx((3 / math.log2(5)) / (3 + 3 / math.log2(3)))


def test_percentile_interpolates() -> None:
    assert H.percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert H.percentile([7.0], 50) == 7.0
    assert H.percentile([1.0, 2.0, 3.0], 100) == 3.0


def test_paired_bootstrap_is_deterministic_and_brackets_the_difference() -> None:
    a = [0.9, 0.1, 0.5, 0.7, 0.3, 1.0, 0.0, 0.6]
    b = [0.8, 0.3, 0.5, 0.2, 0.3, 0.9, 0.1, 0.4]
    one = H.paired_bootstrap(a, b, resamples=2000)
    assert one == H.paired_bootstrap(a, b, resamples=2000)
    assert one["diff"] == pytest.approx(sum(a) / 8 - sum(b) / 8)
    assert one["lo"] <= one["diff"] <= one["hi"] and one["lo"] < one["hi"]
    const = H.paired_bootstrap([x + 0.1 for x in b], b, resamples=500)
    assert const["lo"] == pytest.approx(0.1) and const["hi"] == pytest.approx(0.1)
    with pytest.raises(ValueError):
        H.paired_bootstrap([1.0], [1.0, 2.0])


# --- the committed split -------------------------------------------------------------------
def _all_questions() -> dict[str, list[H.Question]]:
    out: dict[str, list[H.Question]] = {}
    for p in sorted(DATA.glob("*.json")):
        spec = json.loads(p.read_text(encoding="utf-8"))
        if "queries" in spec:
            out[spec["corpus"]] = H.load_questions(p)
    return out


def test_split_is_disjoint_complete_and_reproducible_from_its_seed() -> None:
    committed = json.loads((DATA / "split.json").read_text(encoding="utf-8"))
    split = H.load_split(DATA / "split.json")
    assert not split["dev"] & split["test"]
    qs = _all_questions()
    assert set(qs) >= {"python-docs", "postgresql", "generated"}
    ids = {c: [q.id for q in v] for c, v in qs.items()}
    every = {i for v in ids.values() for i in v}
    assert len(every) == sum(len(v) for v in ids.values()), "ids must be unique over sets"
    assert split["dev"] | split["test"] == every
    # reproducible: the same function and seed give the committed split, twice
    assert committed["seed"] == H.SPLIT_SEED
    again = H.make_split(ids, committed["seed"])
    assert again == H.make_split(ids, committed["seed"])
    assert again == {"dev": committed["dev"], "test": committed["test"]}
    assert len(every) >= 200 and len(split["test"]) >= 100
    for corpus, v in ids.items():  # every corpus has about half of its questions in test
        share = len(set(v) & split["test"]) / len(v)
        assert 0.45 <= share <= 0.55, (corpus, share)


def test_the_tuned_on_legacy_set_is_never_in_dev_or_test() -> None:
    legacy = H.load_questions(REPO / "scripts" / "eval_queries.json", legacy=True)
    assert len(legacy) == 53
    split = H.load_split(DATA / "split.json")
    assert all(H.split_of(q, split) == "legacy" for q in legacy)
    assert not {q.id for q in legacy} & (split["dev"] | split["test"])


def test_the_loaders_take_a_str_path_as_a_path() -> None:
    """A caller may name the split and a question set by a str (it raised AttributeError)."""
    split = H.load_split(str(DATA / "split.json"))
    assert split == H.load_split(DATA / "split.json") and split["dev"]
    path = REPO / "scripts" / "eval_queries.json"
    assert H.load_questions(str(path), legacy=True) == H.load_questions(path, legacy=True)


def test_every_judgment_has_a_reason_and_every_question_an_answer() -> None:
    for corpus, qs in _all_questions().items():
        for q in qs:
            assert q.query.strip() and q.reasons.keys() == q.grades.keys(), q.id
            assert max(q.grades.values()) >= q.answer_grade, q.id


def test_loader_refuses_a_judgment_without_reason_and_duplicate_ids(tmp_path: Path) -> None:
    base = {"corpus": "x", "grades": {"2": "answers", "1": "partly"}, "answerGrade": 2}
    p = tmp_path / "q.json"
    p.write_text(json.dumps({**base, "queries": [
        {"id": "x1", "query": "q", "judgments": {"a.txt": {"grade": 2, "reason": " "}}}]}))
    with pytest.raises(ValueError, match="no reason"):
        H.load_questions(p)
    p.write_text(json.dumps({**base, "queries": [
        {"id": "x1", "query": "q", "judgments": {"a.txt": {"grade": 2, "reason": "r"}}}] * 2}))
    with pytest.raises(ValueError, match="duplicate"):
        H.load_questions(p)
    p.write_text(json.dumps({**base, "queries": [
        {"id": "x1", "query": "q", "judgments": {"a.txt": {"grade": 1, "reason": "r"}}}]}))
    with pytest.raises(ValueError, match="no answering"):
        H.load_questions(p)


def test_write_split_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "split.json"
    out.write_text("{}")
    with pytest.raises(FileExistsError):
        H.write_split(DATA, out)


def _eval_script(name: str) -> Any:
    """``scripts/eval`` loaded as the module ``name`` (it has no ``.py`` suffix)."""
    loader = importlib.machinery.SourceFileLoader(name, str(REPO / "scripts" / "eval"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_the_index_key_counts_every_file_of_the_indexing_code(tmp_path: Path) -> None:
    """scripts/eval reuses a cached index only for the same code and data: a change to
    any file under the code folder (a data file the indexer reads, not only .py/.json/.txt)
    gives a new key; a query-only module or a bytecode cache does not."""
    mod = _eval_script("kith_scripts_eval_key")
    code, root = tmp_path / "corpus", tmp_path / "kb"
    (code / "data").mkdir(parents=True)
    root.mkdir()
    (code / "chunking.py").write_text("X = 1\n")
    (code / "data" / "stoplist.bin").write_bytes(b"a")
    key = mod.index_key(root, code)
    (code / "data" / "stoplist.bin").write_bytes(b"b")
    assert mod.index_key(root, code) != key
    key = mod.index_key(root, code)
    (code / "retrieval.py").write_text("Y = 2\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "chunking.cpython-311.pyc").write_bytes(b"\0")
    assert mod.index_key(root, code) == key
    assert mod.index_key(tmp_path, code) != key


# --- the generated PDF/DOCX corpus ------------------------------------------------------------
def test_generated_documents_are_written_and_hold_their_text(tmp_path: Path) -> None:
    pytest.importorskip("fpdf")
    from docx import Document
    from pypdf import PdfReader

    mod = _eval_script("kith_scripts_eval")
    out = tmp_path / "gen"
    mod.generate_documents(DATA / "generated_docs.json", out)
    docs = json.loads((DATA / "generated_docs.json").read_text())["documents"]
    judged = {rel for q in _all_questions()["generated"] for rel in q.grades}
    assert judged <= {d["path"] for d in docs}
    for d in docs:
        path = out / d["path"]
        first = d["sections"][0]["paragraphs"][0]
        if path.suffix == ".pdf":
            reader = PdfReader(path)
            text = " ".join(page.extract_text() for page in reader.pages)
            assert len(reader.pages) >= 1 + any(s.get("newPage") for s in d["sections"])
        else:
            text = " ".join(p.text for p in Document(str(path)).paragraphs)
        assert " ".join(first.split()[:6]) in " ".join(text.split()), d["path"]
