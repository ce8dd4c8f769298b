"""The search request contract and the schemaVersion 2 envelope (DESIGN §8, §11)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from node.answer.envelope import ENVELOPE_KEYS, build_envelope, empty_envelope
from node.answer.contract import validate as validate_search_request
from node.corpus.store import Corpus
from node.common.errors import CorpusError

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[1] / "specs" / "search-envelope.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _valid(env: dict) -> None:
    errors = sorted(VALIDATOR.iter_errors(env), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    assert tuple(env) == ENVELOPE_KEYS


def _keys(obj: object) -> list[str]:
    if isinstance(obj, dict):
        return [*obj, *(k for v in obj.values() for k in _keys(v))]
    if isinstance(obj, list):
        return [k for v in obj for k in _keys(v)]
    return []


def test_schema_is_valid_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


# --- request validation --------------------------------------------------------------


def test_request_defaults_and_normalization() -> None:
    req = validate_search_request({"query": "  deploy  "})
    assert req == {"query": "deploy", "topK": 5, "filters": {}, "remainingBudgetMs": None,
                   "dedupe": "chunk"}
    req = validate_search_request({"query": "q", "topK": 20, "tags": "ops", "project": ["a", "a"],
                                   "sources": ["/notes/**"], "dateRange": {"from": "2026-01-01"},
                                   "date": "2026-06-05", "remainingBudgetMs": 0})
    assert req["filters"] == {"date": ["2026-06-05"], "dateRange": {"from": "2026-01-01"},
                              "project": ["a"], "tags": ["ops"], "sources": ["/notes/**"]}
    assert req["remainingBudgetMs"] == 0


@pytest.mark.parametrize("body, field", [
    ({}, "query"),
    ({"query": ""}, "query"),
    ({"query": "   "}, "query"),
    ({"query": 3}, "query"),
    ({"query": "x" * 2001}, "query"),
    ({"query": "a\x00b"}, "query"),
    ({"query": "q", "topK": True}, "topK"),
    ({"query": "q", "topK": 0}, "topK"),
    ({"query": "q", "topK": 21}, "topK"),
    ({"query": "q", "topK": 5.5}, "topK"),
    ({"query": "q", "tags": []}, "tags"),
    ({"query": "q", "sources": []}, "sources"),
    ({"query": "q", "sources": ["notes/*"]}, "sources"),
    ({"query": "q", "project": [""]}, "project"),
    ({"query": "q", "date": "2026-02-30"}, "date"),
    ({"query": "q", "dateRange": {"from": "2026-02-01", "to": "2026-01-01"}}, "dateRange"),
    ({"query": "q", "dateRange": {"since": "2026-02-01"}}, "dateRange"),
    ({"query": "q", "remainingBudgetMs": -1}, "remainingBudgetMs"),
    ({"query": "q", "remainingBudgetMs": False}, "remainingBudgetMs"),
    ({"query": "q", "role": "codex"}, "role"),
    ({"query": "q", "action": "query"}, "action"),
])
def test_request_refusals_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(CorpusError) as e:
        validate_search_request(body)
    assert e.value.code == "query-invalid"
    assert f"'{field}" in e.value.message


def test_request_must_be_an_object() -> None:
    with pytest.raises(CorpusError):
        validate_search_request(["query"])


# --- envelopes -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("env")
    root = base / "kb"
    root.mkdir()
    (root / "deploy.md").write_text(
        "# Deploy\n\nThe staging server is deleted automatically every night. "
        "Backups are kept for seven days.\n\n## Rollback\n\nUse the rollback script "
        "`deploy.sh --undo` to restore the previous release.\n")
    (root / "notes.txt").write_text("Staging costs money. The night job deletes it.\n")
    c = Corpus(base / "home")
    c.add_root(root)
    c.sync()
    yield c, root
    c.close()


def test_real_envelope_validates_and_cites(corpus) -> None:
    c, root = corpus
    req = validate_search_request({"query": "staging server deleted at night", "topK": 5})
    hits, ctl = c.search_hits(req["query"], limit=req["topK"], filters=req["filters"])
    env = build_envelope(req, hits, ctl)
    _valid(env)
    assert env["available"] is True and env["reason"] is None
    assert env["results"][0]["source"] == "/kb/deploy.md"
    cites = {ci["citationId"] for ci in env["citationPack"]["citations"]}
    assert len(cites) == len(env["results"])
    texts = " ".join(h.text for h in hits)
    for s in env["answerSynthesis"]["sentences"]:
        assert s["citationId"] in cites
        assert " ".join(s["text"].split()) in " ".join(texts.split())
    assert env["quality"]["keyTermCoverage"]["terms"] == ["staging", "server", "deleted", "night"]
    dumped = json.dumps(env)
    assert str(root) not in dumped
    assert not [k for k in _keys(env) if k.endswith("Ms") or k in ("took", "elapsed", "seconds")]
    # stable citation ids across calls
    env2 = build_envelope(req, *c.search_hits(req["query"], limit=5))
    assert env2 == env


def test_no_results_is_byte_identical_to_everything_dropped(corpus) -> None:
    c, _ = corpus
    req = validate_search_request({"query": "staging server", "topK": 3})
    hits, ctl = c.search_hits(req["query"], limit=3)
    assert hits  # matches existed…
    dropped = build_envelope(req, [], ctl)  # …but policy dropped them all
    nothing = empty_envelope("no-verified-results", req)
    miss_hits, miss_ctl = c.search_hits("zzzqqq", limit=3)
    assert miss_hits == []
    unmatched = build_envelope(validate_search_request({"query": "staging server", "topK": 3}),
                               miss_hits, miss_ctl)
    a, b, d = (json.dumps(x, sort_keys=False) for x in (dropped, nothing, unmatched))
    assert a == b == d
    _valid(nothing)
    assert nothing["available"] is True and nothing["reason"] == "no-verified-results"
    assert nothing["queryPlan"]["query"] == "staging server" and nothing["queryPlan"]["topK"] == 3


@pytest.mark.parametrize("reason", ["index-unavailable", "budget-exhausted", "invalid-request",
                                    "policy-denied", "internal-error"])
def test_unavailable_envelopes_keep_every_key(reason: str) -> None:
    req = None if reason == "invalid-request" else validate_search_request({"query": "x y"})
    env = empty_envelope(reason, req)
    _valid(env)
    assert env["available"] is False and env["reason"] == reason and env["results"] == []
    assert env["quality"]["needsMoreEvidence"] is True
    assert env == empty_envelope(reason, req)


def test_weak_evidence_recommends_follow_up(corpus) -> None:
    c, _ = corpus
    req = validate_search_request({"query": "staging kubernetes helm terraform"})
    env = build_envelope(req, *c.search_hits(req["query"], limit=5))
    _valid(env)
    q = env["quality"]
    assert q["needsMoreEvidence"] is True and "kubernetes" in q["keyTermCoverage"]["missing"]
    assert "retry-with-exact-pass" in q["recommendations"]


def test_exact_pass_reported_in_envelope(corpus) -> None:
    c, _ = corpus
    req = validate_search_request({"query": 'rollback "deploy.sh"'})
    hits, ctl = c.search_hits(req["query"], limit=5)
    env = build_envelope(req, hits, ctl)
    _valid(env)
    assert [p["name"] for p in env["retrievalController"]["passes"]][:2] == \
        ["baseline-bm25", "exact-entity"]
    assert env["quality"]["flags"]["exactPassMatched"] is True
    assert env["results"][0]["provenance"]["location"]["headingPath"] == ["Deploy", "Rollback"]


def test_sentences_split_at_blank_lines_adornments_and_sentence_ends() -> None:
    """The synthesis/preview sentence splitter (envelope._sentences, rewritten line by line
    for speed) keeps the paragraph rules: blank lines (spaces/tabs only) and RST heading
    adornments end a paragraph and adornments vanish; other whitespace-only lines do not
    split; whitespace collapses; a sentence ends at . ! ? (or 。！？) + whitespace."""
    from node.answer.envelope import _sentences

    text = ("Title\n=====\nFirst  line\ncontinues here. Second sentence!\n \t\n"
            "Third? Yes\n\x0c\nsame paragraph 。 end\n---\n\n   \n")
    assert _sentences(text) == ["Title", "First line continues here.", "Second sentence!",
                                "Third?", "Yes same paragraph 。", "end"]
    assert _sentences("Use e.g. the os module. By Fred L. Drake. See foo. bar too.") == [
        "Use e.g. the os module.", "By Fred L. Drake.", "See foo. bar too."]
    assert _sentences("a\r\n\r\nb") == ["a b"]  # CR is not a blank line (chunks are LF)
    assert _sentences("") == [] and _sentences("===\n \n") == []


def test_an_envelope_from_kept_parts_is_the_envelope_made_afresh(tmp_path: Path, monkeypatch) -> None:
    """Envelopes from parts (issue 44 item 4): a chunk's first answers match its text
    with the key matcher; from the STEMS_AFTER-th on they read the word stems kept in its
    parts; a query asked again reads the analysis its parts kept (ANALYSES_KEPT). All give
    the same envelope, byte for byte, for queries whose key stems do and do not start
    their words ("try" -> "tri"), with underscores, code and headings."""
    from node.answer import envelope as env_mod

    root = tmp_path / "notes"
    root.mkdir()
    (root / "errors.md").write_text(
        "# Handling errors\n\nWrap the call in a try block. Trying twice is fine; tries cost "
        "little.\n\n## The row_factory hook\n\nSet conn.row_factory to sqlite3.Row for rows by "
        "name. The factories in the sqlite3 module.\n\n```\ntry:\n    conn.execute(sql)\nexcept "
        "sqlite3.Error:\n    pass\n```\n")
    (root / "files.md").write_text("# Temporary files\n\nUse tempfile.mkstemp to make a "
                                   "temporary file; delete it when done. Files are closed.\n")
    with Corpus(tmp_path / "home") as corpus:
        corpus.add_root(root, chunk_size=200, chunk_overlap=0)
        corpus.sync()
        queries = ["try block errors", "row factory sqlite3 rows", "delete a temporary file",
                   "\"row_factory\" hook", "tries trying", "what is it"]
        for q in queries:
            req = validate_search_request({"query": q, "topK": 5})
            hits, ctl = corpus.search_hits(q, limit=5)
            env_mod._PARTS.clear()
            monkeypatch.setattr(env_mod, "ANALYSES_KEPT", 0)  # every answer analyses again
            made = [env_mod._encode(build_envelope(req, hits, ctl))
                    for _ in range(env_mod.STEMS_AFTER + 1)]
            if req["query"] != "what is it":  # stop words only: no key terms to look up
                assert all(env_mod.chunk_parts(h.text, " ".join(h.location["headingPath"])).stems
                           is not None for h in hits)  # the last envelopes read the kept stems
            monkeypatch.undo()
            env_mod._PARTS.clear()
            kept = [env_mod._encode(build_envelope(req, hits, ctl)) for _ in range(2)]
            assert made[0] == made[1] == made[-1] == kept[0] == kept[1], q
