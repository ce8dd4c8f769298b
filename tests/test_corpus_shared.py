"""Acceptance on the real python-docs-3.11 corpus (497 files), indexed once per session."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from node.answer.envelope import build_envelope
from node.answer.contract import validate as validate_search_request
from node.corpus.store import Corpus

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
PYDOCS = SHARED / "corpora" / "python-docs-3.11"

pytestmark = pytest.mark.shared


@pytest.fixture(scope="session")
def pydocs_corpus(tmp_path_factory: pytest.TempPathFactory):
    if not PYDOCS.is_dir():
        pytest.skip("../shared not present: the python-docs-3.11 corpus is needed")
    home = tmp_path_factory.mktemp("pydocs_corpus-home")
    corpus = Corpus(home)
    corpus.add_root(PYDOCS)
    report = corpus.sync()
    yield corpus, report
    corpus.close()


def test_full_sync_indexes_every_text_file(pydocs_corpus) -> None:
    corpus, report = pydocs_corpus
    assert report["indexed"] == 497 and report["failed"] == 0
    st = corpus.stats()
    assert st["ready"] and st["done"] == 497 and st["chunks"] == report["chunks"] > 5000


def test_resync_of_unchanged_corpus_writes_nothing(pydocs_corpus) -> None:
    corpus, _ = pydocs_corpus
    rep = corpus.sync()
    assert (rep["indexed"], rep["updated"], rep["removed"], rep["chunks"]) == (0, 0, 0, 0)
    assert rep["skippedReasons"]["unchanged"] == 497


def test_acceptance_tempfile_in_top_five(pydocs_corpus) -> None:
    corpus, _ = pydocs_corpus
    hits, ctl = corpus.search_hits("temporary directory that is deleted automatically", limit=10)
    top5 = [h.source_id for h in hits[:5]]
    assert "/python-docs-3.11/library/tempfile.rst.txt" in top5
    assert all(h.score > 0 for h in hits)
    assert ctl["passes"][0] == {"name": "baseline-bm25", "status": "ran", "field": "body",
                                "candidates": ctl["passes"][0]["candidates"]}


@pytest.mark.parametrize("query, expected", [
    ("how do I read a CSV file with a header row", "/python-docs-3.11/library/csv.rst.txt"),
    ("os.path.join", "/python-docs-3.11/library/os.path.rst.txt"),
    ('"context manager" that suppresses exceptions', "/python-docs-3.11/library/contextlib.rst.txt"),
])
def test_known_answers_rank_in_top_five(pydocs_corpus, query: str, expected: str) -> None:
    corpus, _ = pydocs_corpus
    hits, _ = corpus.search_hits(query, limit=10)
    assert expected in [h.source_id for h in hits[:5]]


def test_real_envelope_on_pydocs_validates(pydocs_corpus) -> None:
    corpus, _ = pydocs_corpus
    schema = json.loads((Path(__file__).resolve().parents[1] / "specs" /
                         "search-envelope.schema.json").read_text())
    req = validate_search_request({"query": "temporary directory that is deleted automatically",
                                   "topK": 20})
    env = build_envelope(req, *corpus.search_hits(req["query"], limit=20))
    jsonschema.validate(env, schema, cls=jsonschema.Draft202012Validator)
    assert len(env["results"]) == 20
    assert str(PYDOCS) not in json.dumps(env)
