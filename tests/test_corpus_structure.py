"""Document structure kept and the way each file was read recorded (issue 20 items 3-4):
Markdown front matter is metadata, never text or a heading; a broken block is text with
its reason; DOCX tables nested in cells, content controls and text boxes are read; the
decoder's choice and confidence show in ``kith index status --json``. Real files, real
SQLite and tantivy, the real CLI app."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from node.corpus.parsers import MAX_FRONT_MATTER_BYTES, parse_bytes
from node.corpus.store import Corpus

YAML_NOTE = """---
title: Trip to Lisbon
tags: [travel, portugal]
date: 2024-05-01
---
Wanted
======

We took the tram to the castle and ate custard tarts by the river.
"""
TOML_NOTE = """+++
title = "Garden log"
tags = "roses, compost"
date = 2023-09-12
+++
The compost heap reached sixty degrees after the rain.
"""


def _cli(home: Path, *args: str):
    """``kith --home HOME ARGS`` in process (the home gets an identity first: every
    command but init refuses a home that was never initialised)."""
    from support.homes import initialized
    from node.cli import main as cli_main

    if not (Path(home) / "identity.key").exists():
        initialized(home)
    from node.cli.index_cmd import index_app

    import typer

    app = typer.Typer()
    app.callback()(cli_main._root)
    app.add_typer(index_app, name="index")
    return CliRunner().invoke(app, ["--home", str(home), *args])


def test_yaml_front_matter_is_metadata_not_text_or_a_heading(tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "lisbon.md").write_text(YAML_NOTE)
    with Corpus(tmp_path / "home") as c:
        c.add_root(root)
        c.sync()
        hits, _ = c.search_hits("custard tarts", limit=5)
        assert [h.source_id for h in hits] == ["/notes/lisbon.md"]
        hit = hits[0]
        assert "title:" not in hit.text and "tags:" not in hit.text and "---" not in hit.text
        assert hit.location["headingPath"] == ["Wanted"]  # the closing --- made no heading
        assert hit.location["lineStart"] == 6  # line numbers are the file's
        assert hit.metadata == {"date": "2024-05-01", "tags": ["travel", "portugal"]}
        # front matter is not body text: a word only there finds nothing
        assert c.search_hits("portugal", limit=5)[0] == []
        tagged, _ = c.search_hits("tram", limit=5, filters={"tags": ["travel"]})
        assert [h.source_id for h in tagged] == ["/notes/lisbon.md"]



def test_a_note_of_only_front_matter_is_found_by_its_title(tmp_path: Path) -> None:
    """A title and no body is one chunk (the title), not an ``empty-document``."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "only.md").write_text("---\ntitle: Only Front Matter Marmot\ntags: [x]\n---\n")
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert (rep["indexed"], rep["failed"]) == (1, 0)
        hits, _ = c.search_hits("marmot", limit=5)
        assert [h.source_id for h in hits] == ["/notes/only.md"]
        assert hits[0].location["headingPath"] == ["Only Front Matter Marmot"]
        assert hits[0].metadata == {"tags": ["x"]}
    st = json.loads(_cli(home, "index", "status", "--json").stdout)
    assert st["failedDocuments"] == []

def test_toml_front_matter_title_tags_and_date() -> None:
    doc = parse_bytes(TOML_NOTE.encode(), "markdown", "garden.md")
    assert doc.title == "Garden log"
    assert doc.metadata == {"date": "2023-09-12", "tags": ["roses", "compost"]}
    assert doc.text.strip() == "The compost heap reached sixty degrees after the rain."
    assert doc.text.count("\n") == TOML_NOTE.count("\n")
    assert doc.notes["frontMatter"] == "toml"


@pytest.mark.parametrize(("note", "reason"), [
    ("---\ntitle: open\nNo closing line, just text about otters.\n", "front-matter-unclosed"),
    ("---\ntitle: [not closed\n---\nText about otters.\n", "front-matter-invalid"),
    ("+++\ntitle = \n+++\nText about otters.\n", "front-matter-invalid"),
    ("---\n- a list\n- not a mapping\n---\nText about otters.\n", "front-matter-invalid"),
    ("---\nbig: " + "x" * (MAX_FRONT_MATTER_BYTES + 1) + "\n---\nText about otters.\n",
     "front-matter-too-large"),
])
def test_a_broken_front_matter_block_is_ordinary_text_with_its_reason(
        tmp_path: Path, note: str, reason: str) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "n.md").write_text(note)
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["indexed"] == 1 and rep["failed"] == 0
        hit = c.search_hits("otters", limit=5)[0][0]
        assert hit.metadata == {} and hit.location["headingPath"] == []
    st = json.loads(_cli(home, "index", "status", "--json").stdout)
    assert [(n["source"], n["frontMatterIgnored"]) for n in st["readNotes"]] == [
        ("/notes/n.md", reason)]


def test_a_bad_front_matter_value_is_dropped_and_named() -> None:
    doc = parse_bytes(b"---\ndate: next tuesday\ntags: [ok]\n---\nBody.\n", "markdown", "x.md")
    assert doc.metadata == {"tags": ["ok"]} and doc.notes["frontMatterDropped"] == ["date"]


def _nested_docx() -> bytes:
    import docx
    from docx.oxml import parse_xml

    d = docx.Document()
    d.add_paragraph("Budget overview.")
    outer = d.add_table(rows=1, cols=3)
    outer.cell(0, 0).text = "region"
    outer.cell(0, 2).text = "quoll total"  # the sibling cell after the nested table
    inner = outer.cell(0, 1).add_table(rows=2, cols=2)
    inner.cell(0, 0).text, inner.cell(1, 1).text = "aardvark office", "wombat cost"
    deepest = inner.cell(1, 0).add_table(rows=1, cols=1)
    deepest.cell(0, 0).text = "okapi reserve"
    ns = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    d.element.body.insert(0, parse_xml(
        f'<w:sdt {ns}><w:sdtContent><w:p><w:r><w:t>pangolin cover page</w:t></w:r></w:p>'
        f'</w:sdtContent></w:sdt>'))
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def test_docx_tables_nested_in_cells_are_read_at_every_depth(tmp_path: Path) -> None:
    root = tmp_path / "office"
    root.mkdir()
    (root / "budget.docx").write_bytes(_nested_docx())
    with Corpus(tmp_path / "home") as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["indexed"] == 1
        for word in ("aardvark", "wombat", "okapi", "pangolin", "region", "quoll"):
            assert [h.source_id for h in c.search_hits(word, limit=5)[0]] == [
                "/office/budget.docx"], word
    text = parse_bytes(_nested_docx(), "docx", "b.docx").text
    assert text.index("pangolin") < text.index("Budget") < text.index("region")
    assert text.index("region") < text.index("aardvark") < text.index("okapi")
    # document order: the nested table's text before the next cell's, not after
    assert text.index("wombat") < text.index("quoll")


def test_index_status_json_names_the_decoders_choice_and_confidence(tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "western.txt").write_bytes(
        "“The deadline is Friday” — don’t be late; the fee is €120.".encode("cp1252"))
    (root / "broken.txt").write_bytes("Résumé naïve café".encode() + b"\xff" + b" end")
    (root / "clean.txt").write_text("Nothing unusual here.")
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        assert [h.source_id for h in c.search_hits("résumé naïve", limit=5)[0]] == [
            "/notes/broken.txt"]
    r = _cli(home, "index", "status", "--json")
    assert r.exit_code == 0, r.output
    notes = {n["source"]: n for n in json.loads(r.stdout)["readNotes"]}
    assert set(notes) == {"/notes/western.txt", "/notes/broken.txt"}  # clean UTF-8 omitted
    w, b = notes["/notes/western.txt"], notes["/notes/broken.txt"]
    assert (w["encoding"], w["fallback"], w["decoder"]) == ("cp1252", True, "cp1252-prior")
    assert (b["encoding"], b["decoder"], b["replacedBytes"]) == ("utf-8", "utf-8-replaced", 1)
    assert 0 < b["confidence"] < 1 and isinstance(w["confidence"], float)
