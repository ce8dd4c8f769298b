"""Definitions over mentions, entries kept whole (issue 40, items 1 and 2).

Real files, real SQLite, real tantivy in tmp_path; no mocks.
"""

from __future__ import annotations

import pytest

from node.corpus import search
from node.corpus.chunking import chunk_text
from node.corpus.store import Corpus

REFERENCE = """\
:mod:`textwrap` --- Text wrapping and filling
=============================================

.. module:: textwrap
   :synopsis: Text wrapping and filling

The module offers a few convenience functions and a class that does the work.

.. function:: dedent(text)

   Remove any common leading whitespace from every line in *text*.

.. class:: TextWrapper(**kwargs)

   The class that does the work.

   .. method:: wrap(text)

      Wraps the single paragraph in *text*.

.. currentmodule:: textwrap.shims

.. data:: LIMIT

   The largest width.
"""

WHATSNEW = """\
What's new
==========

The function textwrap.dedent now keeps tabs. textwrap.dedent was rewritten in C and
textwrap.dedent is faster; see textwrap.dedent for details. Earlier releases of
textwrap.dedent dropped trailing spaces, and the tutorial uses textwrap.dedent too.
"""

TUTORIAL = """\
Tutorial
========

Strings in source code are often indented: call dedent on them, dedent them again,
dedent is short for de-indent and textwrap.dedent is where dedent lives.
"""


def test_chunks_record_what_they_define_with_the_current_module() -> None:
    chunks = chunk_text(REFERENCE, kind="rst", chunk_size=200, chunk_overlap=0)
    defined = [d for c in chunks for d in c.defines]
    assert defined == ["textwrap --- Text wrapping and filling", "textwrap",
                       "textwrap.dedent", "textwrap.TextWrapper", "textwrap.TextWrapper.wrap",
                       "textwrap.shims.LIMIT"]
    dedent = next(c for c in chunks if "textwrap.dedent" in c.defines)
    assert ".. function:: dedent(text)\n\n   Remove any common" in dedent.text


def test_markdown_and_docx_style_headings_are_definitions() -> None:
    chunks = chunk_text("# Install\n\nRun it.\n\n## Upgrade\n\nRun it again.\n",
                        kind="markdown")
    assert [c.defines for c in chunks] == [("Install",), ("Upgrade",)]
    chunks = chunk_text("# Report\n\nBody text.\n", kind="docx")
    assert chunks[0].defines == ("Report",)


def test_a_dotted_name_is_searchable_by_each_suffix() -> None:
    assert search.definition_terms(["textwrap.TextWrapper.wrap"]) == [
        "textwrap.textwrapper.wrap", "textwrapper.wrap", "wrap"]
    # a heading is matched whole (a query that is the title), not word by word
    assert search.definition_terms(["Walrus care"], ["Walrus care"]) == ["#walrus care"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("defs")
    root = base / "docs"
    (root / "library").mkdir(parents=True)
    (root / "library" / "textwrap.rst").write_text(REFERENCE)
    (root / "whatsnew.rst").write_text(WHATSNEW)
    (root / "tutorial.rst").write_text(TUTORIAL)
    c = Corpus(base / "home")
    c.add_root(root, chunk_size=200, chunk_overlap=0)  # an entry or two per chunk
    c.sync()
    yield c
    c.close()


@pytest.mark.parametrize("query", ["textwrap.dedent", "dedent", "TextWrapper.wrap",
                                   "what does textwrap.dedent do"])
def test_a_directive_defined_name_ranks_its_definition_first(corpus, query: str) -> None:
    """The reference page never spells ``textwrap.dedent``; the pages that do, and
    repeat it, only mention it."""
    hits, _ctl = corpus.search_hits(query, limit=3)
    assert hits[0].source_id.endswith("/library/textwrap.rst"), [h.source_id for h in hits]


def test_the_heading_path_shows_the_definition(corpus) -> None:
    hits, _ctl = corpus.search_hits("textwrap.dedent", limit=1)
    assert hits[0].location["headingPath"] == ["textwrap --- Text wrapping and filling",
                                               "textwrap.dedent"]


def test_mentions_are_still_found(corpus) -> None:
    hits, _ctl = corpus.search_hits("textwrap.dedent", limit=5)
    assert {h.source_id.rsplit("/", 1)[-1] for h in hits} >= {"textwrap.rst", "whatsnew.rst"}


FILLER = "Some words about the module that fill up the chunk nicely here. " * 4


def test_a_signature_and_its_first_paragraph_share_a_chunk() -> None:
    text = (f"Title\n=====\n\n{FILLER}\n\n.. function:: fill(text, width=70)\n\n"
            "   Wraps the single paragraph in *text*, and returns one string.\n\n"
            "   Keyword arguments are those of the class.\n")
    chunks = chunk_text(text, kind="rst", chunk_size=400, chunk_overlap=0)
    sig = next(c for c in chunks if ".. function:: fill" in c.text)
    assert "Wraps the single paragraph" in sig.text
    assert "textwrap" not in sig.defines and sig.defines == ("fill",)


def test_a_fenced_code_block_with_blank_lines_stays_whole() -> None:
    code = "```python\nimport os\n\n\ndef main():\n    return os.getcwd()\n\n\nmain()\n```"
    text = f"# Run\n\n{FILLER}\n\n{code}\n\nAfter the code.\n"
    chunks = chunk_text(text, kind="markdown", chunk_size=300, chunk_overlap=0)
    assert any(code in c.text for c in chunks), [c.text for c in chunks]


def test_a_definition_list_entry_stays_whole() -> None:
    entry = ("verbose\n   Print every step.\n\n   The steps are those of the build, one a "
             "line.")
    text = f"Options\n=======\n\n{FILLER}\n\n{entry}\n\nquiet\n   Print nothing.\n"
    chunks = chunk_text(text, kind="rst", chunk_size=320, chunk_overlap=0)
    assert any(entry in c.text for c in chunks), [c.text for c in chunks]


def test_an_entry_too_big_for_one_chunk_is_still_cut() -> None:
    body = "\n\n".join(f"   Paragraph {i} of a long description." for i in range(30))
    text = f".. function:: big()\n\n{body}\n"
    chunks = chunk_text(text, kind="rst", chunk_size=200, chunk_overlap=0)
    assert len(chunks) > 3 and all(len(c.text) <= 200 for c in chunks)
    assert "Paragraph 0" in chunks[0].text


def test_html_headings_and_dt_terms_are_definitions() -> None:
    from node.corpus.parsers import parse_bytes

    page = (b"<html><head><title>Resource Consumption</title></head><body><main>"
            b"<h2>Memory</h2><dl><dt>work_mem (integer)</dt><dd><p>Sets the base maximum "
            b"amount of memory to be used by a query operation.</p></dd>"
            b"<dt>maintenance_work_mem (integer)</dt><dd><p>Memory for VACUUM.</p></dd></dl>"
            b"</main></body></html>")
    parsed = parse_bytes(page, "html", "runtime-config-resource.html")
    assert "\x01" not in parsed.text
    assert [n for _o, n in parsed.definitions] == ["work_mem", "maintenance_work_mem"]
    assert all(parsed.text[o:].startswith(n) for o, n in parsed.definitions)
    chunks = chunk_text(parsed.text, kind="html", parsed_definitions=parsed.definitions)
    assert [d for c in chunks for d in c.defines] == [
        "Resource Consumption", "Memory", "work_mem", "maintenance_work_mem"]
