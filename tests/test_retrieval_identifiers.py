"""Whole identifiers, page titles and odd queries in retrieval (issue 10, item 2).

Real files, real SQLite, real tantivy in tmp_path; no mocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node.answer.service import answer_local
from node.common.errors import CorpusError
from node.corpus import search
from node.corpus.store import Corpus

FILES = {
    # defines the names, once each
    "reference.md": "# Reference\n\nCall os.path.join to build a path. Every class may define "
                    "__init__ to set attributes. The setting max_connections caps sessions. "
                    "Python 3.11 added tomllib.\n",
    # uses the parts again and again, never the whole names
    "chatter.md": "# Chatter\n\n" + ("The os module, a path, join the team, init scripts, "
                                    "max speed, connections, version 3 and 11 items. ") * 6,
    "guide.md": "# Walrus guide\n\nHow a walrus sleeps.\n\n## Json\n\nThe walrus format.\n",
    "json.md": "# Json\n\nThe json format of walrus records.\n",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("idents")
    root = base / "kb"
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(text)
    c = Corpus(base / "home")
    c.add_root(root)
    c.sync()
    yield c
    c.close()


def test_identifiers_are_kept_whole_and_their_dotted_suffixes() -> None:
    got = search.identifiers("Use os.path.join() and __init__, max_connections, 3.11, 1,000; "
                             "e.g. i.e. _ ___")
    assert got == ["os.path.join", "path.join", "__init__", "max_connections", "3.11", "1,000"]


@pytest.mark.parametrize("query", ["os.path.join", "__init__", "max_connections", "3.11",
                                   "what does os.path.join do"])
def test_the_page_defining_a_name_beats_pages_using_its_parts(corpus, query: str) -> None:
    hits, _ctl = corpus.search_hits(query, limit=3)
    assert hits[0].source_id.endswith("/reference.md"), [h.source_id for h in hits]


def test_split_parts_still_match(corpus) -> None:
    # the whole name is one extra term: its parts are searched as before
    hits, _ctl = corpus.search_hits("join", limit=5)
    assert {h.source_id.rsplit("/", 1)[-1] for h in hits} >= {"reference.md", "chatter.md"}


def test_a_page_titled_after_the_query_beats_a_section_of_another_page(corpus) -> None:
    hits, _ctl = corpus.search_hits("json", limit=3)
    assert hits[0].source_id.endswith("/json.md")
    assert search.index_title("/kb/guide.md", ["Walrus guide", "Json"]) == (
        "Walrus guide / guide", "Json")


def test_an_index_of_an_older_schema_is_refused_then_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    (root / "reference.md").write_text(FILES["reference.md"])
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        c.record.set_meta("index_schema_version", str(search.INDEX_SCHEMA_VERSION - 1))
    with Corpus(home, readonly=True) as r:
        with pytest.raises(CorpusError) as e:
            r.search_hits("os.path.join", limit=3)
        assert e.value.code == "index-unavailable"
    with Corpus(home) as c:
        c.sync()  # the writer rebuilds the index with this version's schema
        assert c.record.get_meta("index_schema_version") == str(search.INDEX_SCHEMA_VERSION)
        hits, _ctl = c.search_hits("os.path.join", limit=3)
        assert hits and hits[0].score_components.get("bm25", 0) > 0


ODD = ["the of and what is", "?!.,;:", "...", "a" * 2000, ("walrus 故 " * 300)[:2000],
       "故", "故乡 walrus", "🐙", "🐙 walrus", '"unbalanced walrus', 'walrus "', "AND OR NOT",
       "walrus AND NOT json", "title:x", "title:walrus", "*", "~", "walrus~2", "__", "_._",
       "os.", ".path", "1,", "1e-5", "\\", "((("]


@pytest.mark.parametrize("query", ODD)
def test_odd_queries_never_raise_nor_return_zero_scores(corpus, query: str) -> None:
    hits, ctl = corpus.search_hits(query, limit=10)
    assert all(h.score > 0 for h in hits)
    assert ctl["passes"][0]["status"] == "ran"
    answer = answer_local(corpus, {"query": query, "topK": 5, "remainingBudgetMs": 5000})
    assert answer["status"] != "error", answer
    assert all(r["score"] > 0 for r in answer["envelope"].get("results", []))


@pytest.mark.parametrize("text", ["café noir", "résumé été", "Grüße"])
def test_a_short_cp1252_note_decodes_as_cp1252(text: str) -> None:
    from node.corpus.parsers import decode_text

    assert decode_text(text.encode("cp1252"))[:3] == (text, "cp1252", True)


def test_mostly_high_byte_text_keeps_the_detectors_guess() -> None:
    from node.corpus.parsers import decode_text

    text = "Καλημέρα κόσμε, τι κάνεις σήμερα; Ο καιρός είναι καλός."
    decoded, encoding = decode_text(text.encode("cp1253"))[:2]
    assert decoded == text and encoding in ("cp1253", "iso8859-7")  # same Greek letters


def test_a_two_word_cp1252_note_is_found_by_its_accented_word(tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "note.txt").write_bytes("café noir\n".encode("cp1252"))
    with Corpus(tmp_path / "home") as c:
        c.add_root(root)
        c.sync()
        hits, _ctl = c.search_hits("café", limit=3)
        assert [h.source_id for h in hits] == ["/notes/note.txt"]
        assert "café" in hits[0].text
        row = c.record.db.execute("SELECT encoding FROM documents").fetchone()
        assert row[0] == "cp1252"


def test_identifier_scan_finds_exactly_what_the_whole_text_scan_finds() -> None:
    """The per-token scan (speed, issue 10 item 6) keeps every match of the one regex over
    the whole text: same words, same order — on seeded random text over the characters
    the pattern and its look-arounds care about, and on real prose."""
    import random

    rnd = random.Random(10)
    alphabet = "ab_Z.,:-eE019 é\u00a0x(\n\t\u2028\x1c)é_"
    samples = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40)))
               for _ in range(20_000)]
    samples += [FILES["reference.md"], "see os.path.join(a, b). 1,000 items, 1e-5 or 2-3; "
                "e.g. __init__ and max_connections at 10:30 in 3.11.", "end.", "a.b.", "x_"]
    for text in samples:
        assert [m.group(0) for m in search._whole_matches(text)] == \
            [m.group(0) for m in search._WHOLE.finditer(text)], repr(text)
