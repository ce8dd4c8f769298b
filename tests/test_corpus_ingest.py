"""Ingestion (issue 3, DESIGN §9): parsers, chunkers, tracking, sync modes, datasource
records, status, analyzer, serve-time origins. Real files (PDF/DOCX built at test time
with fpdf2/python-docx), real SQLite, real tantivy; no mocks."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from node.corpus import parsers
from node.corpus.chunking import chunk_text
from node.corpus.store import Corpus
from node.common.errors import CorpusError

# --- fixtures ---------------------------------------------------------------------------


def make_pdf(path: Path, pages: list[str], *, password: str | None = None,
             title: str | None = None) -> Path:
    """A real PDF with a text layer, one string per page (fpdf2); ``title``: its /Title."""
    from fpdf import FPDF

    pdf = FPDF()
    if title is not None:
        pdf.set_title(title)
    pdf.set_font("Helvetica", size=12)
    for text in pages:
        pdf.add_page()
        if text:
            pdf.multi_cell(0, 8, text)
        else:
            pdf.rect(10, 10, 50, 50)  # a page with a drawing and no text (a "scan")
    if password:
        pdf.set_encryption(owner_password=password + "-owner", user_password=password)
    pdf.output(str(path))
    return path


def make_docx(path: Path) -> Path:
    import docx

    d = docx.Document()
    d.add_heading("Quarterly plan", 1)
    d.add_paragraph("The pangolin project ships in May.")
    d.add_heading("Risks", 2)
    d.add_paragraph("Budget overrun on the axolotl tank.")
    t = d.add_table(rows=2, cols=2)
    t.cell(0, 0).text, t.cell(0, 1).text = "owner", "status"
    t.cell(1, 0).text, t.cell(1, 1).text = "Ana", "chartreuse"
    d.save(str(path))
    return path


HTML = """<!doctype html><html><head><title>Guide</title>
<script>var leak = "scriptonlyword";</script><style>.x{color:red}</style></head>
<body><nav>navonlyword menu</nav><header>headeronlyword</header>
<main><h1>Install</h1><p>Run the <b>wombat</b> installer.</p>
<h2>Configure</h2><p>Set the narwhal flag.</p><ul><li>first item</li></ul></main>
<footer>footeronlyword</footer></body></html>"""


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _sources(c: Corpus, q: str, **kw) -> list[str]:
    hits, _ = c.search_hits(q, limit=kw.pop("limit", 10), **kw)
    return [h.source_id for h in hits]


def _hits(c: Corpus, q: str, **kw):
    return c.search_hits(q, limit=kw.pop("limit", 10), **kw)[0]


def _rows(c: Corpus) -> dict[str, tuple]:
    db = sqlite3.connect(c.db_path)
    try:
        return {r[0]: r[1:] for r in db.execute(
            "SELECT source_id, status, error_code, error_message, chunk_count, encoding, "
            "encoding_fallback FROM documents")}
    finally:
        db.close()


# --- parsers ----------------------------------------------------------------------------


def test_pdf_text_layer_with_page_numbers(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    make_pdf(root / "report.pdf", ["Page one talks about the aurora borealis over Tromso.",
                                   "Page two explains the quokka habitat on Rottnest Island."])
    with Corpus(home) as c:
        c.add_root(root, chunk_size=70, chunk_overlap=0)
        rep = c.sync()
        assert rep["indexed"] == 1 and rep["failed"] == 0
        q1 = _hits(c, "aurora borealis")[0]
        q2 = _hits(c, "quokka habitat")[0]
        assert q1.source_id == q2.source_id == "/docs/report.pdf"
        assert (q1.location["page"], q1.location["pageEnd"]) == (1, 1)
        assert (q2.location["page"], q2.location["pageEnd"]) == (2, 2)


def test_pdf_metadata_title_heads_its_chunks(home: Path, tmp_path: Path) -> None:
    """A PDF has no headings: its /Title is the heading path of its chunks (cited with the
    hit, and a page-title match for search); a tool's placeholder title is not."""
    root = tmp_path / "docs"
    root.mkdir()
    make_pdf(root / "leave.pdf", ["Sixteen weeks for the birth parent."], title="Parental Leave")
    make_pdf(root / "scan.pdf", ["Eight weeks for the second parent."],
             title="Microsoft Word - leave_v2.docx")
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        hit = _hits(c, "parental leave")[0]
        assert hit.source_id == "/docs/leave.pdf"
        assert list(hit.location["headingPath"]) == ["Parental Leave"]
        other = _hits(c, "second parent")[0]
        assert other.source_id == "/docs/scan.pdf" and not other.location["headingPath"]
    assert parsers.pdf_title("  Travel \n and  Expenses ") == "Travel and Expenses"
    assert parsers.pdf_title("untitled") == parsers.pdf_title("report.pdf") == ""
    assert parsers.pdf_title(None) == parsers.pdf_title("12 / 34") == ""


def test_pdf_refusals_encrypted_scanned_and_fake(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    make_pdf(root / "locked.pdf", ["hidden ocelot text"], password="pw")
    make_pdf(root / "scan.pdf", [""])
    (root / "fake.pdf").write_text("this is plain text pretending to be a PDF")
    (root / "fake.docx").write_text("plain text pretending to be a DOCX")
    make_pdf(root / "ok.pdf", ["a fine lemur report"])
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        codes = {e["source"]: e["code"] for e in rep["errors"]}
        assert codes == {"/docs/locked.pdf": "encrypted", "/docs/scan.pdf": "no-text-layer",
                         "/docs/fake.pdf": "not-a-document", "/docs/fake.docx": "not-a-document"}
        assert rep["indexed"] == 1 and _sources(c, "lemur") == ["/docs/ok.pdf"]
        assert _sources(c, "ocelot") == []
        for e in rep["errors"]:
            assert e["message"].startswith("parse: ") and str(root) not in e["message"]


def test_docx_headings_paragraphs_and_tables(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "office"
    root.mkdir()
    make_docx(root / "plan.docx")
    with Corpus(home) as c:
        c.add_root(root, chunk_size=60, chunk_overlap=0)
        c.sync()
        hit = _hits(c, "axolotl budget")[0]
        assert hit.location["headingPath"] == ["Quarterly plan", "Risks"]
        assert "axolotl" in hit.text
        assert _sources(c, "chartreuse") == ["/office/plan.docx"]  # table cell text


def test_html_main_text_not_markup(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "site"
    root.mkdir()
    (root / "guide.html").write_text(HTML, "utf-8")
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        hit = _hits(c, "wombat installer")[0]
        assert hit.source_id == "/site/guide.html"
        assert "<" not in hit.text and "wombat" in hit.text
        for word in ("scriptonlyword", "navonlyword", "headeronlyword", "footeronlyword",
                     "color"):
            assert _sources(c, word) == [], word
    parsed = parsers.parse_bytes(HTML.encode(), "html", "guide.html")
    assert parsed.text.startswith("# Install") and "## Configure" in parsed.text


#: A generated manual page in DocBook's layout (the PostgreSQL HTML manual): prev/up/next
#: navigation with the neighbouring pages' titles above and below the content, a section
#: heading that repeats the <title>, a shell example whose comment lines start with '#',
#: psql output with a '----' rule, a table cell holding the '#' operator, and a note box
#: whose title "Note" is a label, not a section.
DOCBOOK = """<html><head><title>20.4.\u00a0Resource Consumption</title></head><body>
<div class="navheader"><table><tr><th>20.4. Resource Consumption</th></tr><tr>
<td><a accesskey="p" href="a.html" title="20.3. Connections and Authentication">Prev</a></td>
<th>Chapter 20. Server Configuration</th><td><a href="b.html">Next</a></td></tr></table></div>
<div class="sect1"><h2 class="title">20.4. Resource Consumption</h2>
<div class="toc"><dl class="toc"><dt><a href="#m">20.4.1. Memory numbatlink</a></dt></dl></div>
<div class="sect2"><h3 class="title">20.4.1. Memory</h3><p>The quokka buffers setting.</p>
<pre class="screen"># restart the quokka server
# so the setting counts
sysctl -w kern.quokka=1</pre>
<pre>  name  | value
--------+-------
 quokka | 1</pre>
<table><tr><td>bit</td></tr><tr><td>#</td><td>xor of the quokka bits</td></tr></table>
<div class="note"><h3 class="title">Note</h3><p>Quokka buffers are shared.</p></div>
<p>More about the quokka buffers.</p></div></div>
<div class="navfooter"><table><tr><td>20.3. Connections and Authentication</td>
<td>20.5. Write Ahead Log wallabyfooter</td></tr></table></div></body></html>"""


def test_html_page_furniture_and_code_are_not_headings(home: Path, tmp_path: Path) -> None:
    """Navigation boxes and link lists (a table of contents) are not indexed (a page does
    not match its neighbours' titles);
    the page title heads every chunk's heading path, never a '#' line of a code example,
    a '---' rule of psql output or a '#' table cell, and a note box's title is no section."""
    parsed = parsers.parse_bytes(DOCBOOK.encode(), "html", "runtime-config-resource.html")
    assert "Prev" not in parsed.text and "wallabyfooter" not in parsed.text
    assert "Chapter 20" not in parsed.text and "\nNote\n" in parsed.text
    chunks = chunk_text(parsed.text, kind="html", structure=parsed.structure, chunk_size=120,
                        chunk_overlap=0)
    assert len(chunks) >= 3
    for ch in chunks:
        assert ch.heading_path[0] == "20.4. Resource Consumption", ch
        assert set(ch.heading_path) <= {"20.4. Resource Consumption", "20.4.1. Memory"}, ch
    # the title heading goes with the first section's text: no chunk of only a title
    assert all(ch.text.strip("#\n ") != "20.4. Resource Consumption" for ch in chunks)
    root = tmp_path / "manual"
    root.mkdir()
    (root / "runtime-config-resource.html").write_text(DOCBOOK, "utf-8")
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        assert _sources(c, "quokka") == ["/manual/runtime-config-resource.html"]
        for word in ("wallabyfooter", "Write Ahead Log", "Connections Authentication",
                     "numbatlink"):
            assert _sources(c, word) == [], word


def test_html_many_paragraphs_and_deep_nesting_parse_whole() -> None:
    """A long page is read whole in one pass (it used to take quadratic time: 10,000
    paragraphs took 51 s and a 20 MB page stalled a sync), and a deeply nested one
    neither overflows the stack nor loses its text."""
    many = "".join(f"<p>kudu{i} grazes</p>" for i in range(20_000))
    parsed = parsers.parse_bytes(f"<html><body>{many}</body></html>".encode(), "html", "a.html")
    paragraphs = parsed.text.split("\n\n")
    assert paragraphs == [f"kudu{i} grazes" for i in range(20_000)]
    deep = "<div><section>" * 10_000 + "<p>the eland sleeps</p>" + "</section></div>" * 10_000
    parsed = parsers.parse_bytes(f"<html><body><h1>Deep</h1>{deep}</body></html>".encode(),
                                 "html", "deep.html")
    assert parsed.text == "# Deep\n\nthe eland sleeps"


def test_html_content_named_like_furniture_is_kept() -> None:
    """Sphinx's section ids come from headings: a section titled "Navigation" or "Footer"
    is content (only class words and ARIA roles mark furniture); an article's own
    <header> (its title) and <aside> (its note) are the article's, while the page's
    banner, footer and <nav> are not."""
    page = """<html><head><title>Help</title></head><body>
    <header>siteheaderword</header><nav>navmenuword</nav>
    <section id="navigation"><h2>Navigation</h2><p>Press the arrow keys to move.</p></section>
    <section id="footer"><h2>Footer</h2><p>The footer shows the page number.</p></section>
    <div id="toc"><p>Toc is a small dog.</p></div>
    <div class="related" role="navigation"><a href="x">relatedlinkword</a></div>
    <article><header><h1>Why sourdough rises</h1><p>by Ana</p></header>
    <p>Yeast eats sugar.</p>
    <aside><p>Important: keep the starter at 24 degrees.</p></aside>
    <footer><p>Filed under baking.</p></footer></article>
    <footer>sitefooterword</footer></body></html>"""
    text = parsers.parse_bytes(page.encode(), "html", "help.html").text
    # <article> is the main content: its header, aside and footer are all there
    assert text == ("# Why sourdough rises\n\nby Ana\n\nYeast eats sugar.\n\n"
                    "Important: keep the starter at 24 degrees.\n\nFiled under baking.")
    body = page.replace("<article>", "<div>").replace("</article>", "</div>")
    text = parsers.parse_bytes(body.encode(), "html", "help.html").text
    assert "## Navigation\n\nPress the arrow keys to move." in text
    assert "## Footer\n\nThe footer shows the page number." in text
    assert "Toc is a small dog." in text
    for word in ("siteheaderword", "navmenuword", "relatedlinkword", "sitefooterword",
                 "Why sourdough", "keep the starter", "Filed under"):
        assert word not in text, word  # page-level header/aside/footer (outside a section)


def test_html_page_that_is_all_navigation_keeps_its_words() -> None:
    """A page whose whole content is a <nav> or a table of contents is indexed as it is
    (not silently as its title alone)."""
    page = ("<html><head><title>Links</title></head><body><nav><ul>"
            "<li><a href='a'>Gazelle care</a></li><li>Oryx feeding times</li></ul></nav>"
            "</body></html>")
    text = parsers.parse_bytes(page.encode(), "html", "links.html").text
    assert text == "# Links\n\n- Gazelle care\n\n- Oryx feeding times"  # list items keep a bullet
    toc = "<html><head><title>Zoo</title></head><body><div class='toc'>Ibis pond</div></body></html>"
    assert parsers.parse_bytes(toc.encode(), "html", "z.html").text == "# Zoo\n\nIbis pond"


def test_titles_and_headings_lose_control_and_format_characters(tmp_path: Path) -> None:
    """A hostile /Title or <title>/heading cannot put terminal escapes, a bell or a
    right-to-left override into the headingPath sent to peers."""
    hostile = "Pay\u202eroll\x07 \x1b[31mreport\x08\u200b 2026"
    assert parsers.pdf_title(hostile) == "Payroll [31mreport 2026"
    assert parsers.pdf_title("x" * 300 + "\u202e") == "x" * 200
    make_pdf(tmp_path / "h.pdf", ["Body text of the salary report."], title=hostile)
    assert parsers.parse_bytes((tmp_path / "h.pdf").read_bytes(), "pdf", "h.pdf").title \
        == "Payroll [31mreport 2026"
    page = (f"<html><head><title>{hostile}</title></head><body><h2>Sec\u202etion\x1b</h2>"
            "<p>text</p></body></html>")
    text = parsers.parse_bytes(page.encode(), "html", "h.html").text
    assert text == "# Payroll [31mreport 2026\n\n## Section\n\ntext"


def test_heading_only_section_goes_with_its_first_subsection() -> None:
    """A Markdown title directly followed by a subheading is not a chunk of its own (a
    title-only chunk is no evidence); a title with text of its own still is."""
    chunks = chunk_text("# Guide\n\n## Setup\n\nInstall it.\n\n## Use\n\nRun it.\n",
                        kind="markdown")
    assert [(c.heading_path, c.text) for c in chunks] == [
        (("Guide", "Setup"), "# Guide\n\n## Setup\n\nInstall it."),
        (("Guide", "Use"), "## Use\n\nRun it.")]
    assert chunks[0].line_start == 1
    chunks = chunk_text("# Guide\n\nIntro.\n\n## Setup\n\nInstall it.\n", kind="markdown")
    assert [c.heading_path for c in chunks] == [("Guide",), ("Guide", "Setup")]


def test_json_jsonl_and_csv(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "items.json").write_text(json.dumps([{"name": "alpha", "desc": "the ibex item"},
                                                 {"name": "beta", "tags": ["gnu"]}]))
    (root / "chat.jsonl").write_text('{"from": "ana", "msg": "the okapi meeting"}\n'
                                     '{"from": "bo", "msg": "fine"}\n')
    (root / "zoo.csv").write_text("city,animal\r\nLima,llama\r\nOslo,moose\r\n")
    (root / "broken.json").write_text('{"unterminated": ')
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["indexed"] == 3
        assert _sources(c, "ibex") == ["/data/items.json"]
        assert _sources(c, "okapi") == ["/data/chat.jsonl"]
        hit = _hits(c, "moose")[0]
        assert "animal: moose" in hit.text and "city: Oslo" in hit.text
        (err,) = rep["errors"]
        # stage + exception type + advice, never the exception's own text
        assert err["source"] == "/data/broken.json" and err["code"] == "parse-failed"
        assert err["message"].startswith("parse: JSONDecodeError - ")
        assert "Expecting" not in err["message"] and "char" not in err["message"]


def test_non_utf8_text_decodes_with_recorded_fallback(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "enc"
    root.mkdir()
    (root / "latin.txt").write_bytes("Le café et le résumé du jour, naïve façade.\n".encode("cp1252"))
    russian = ("Привет! Это длинный русский текст о погоде в Москве. Сегодня идёт снег, "
               "и все жители города надевают тёплые шапки и шарфы.\n") * 3
    (root / "cyrillic.txt").write_bytes(russian.encode("cp1251"))
    (root / "undefined.txt").write_bytes(b"bytes \x81\x8d\x8f\x90\x9d with holes and tapir\n")
    (root / "utf16.txt").write_bytes("tapir in utf sixteen\n".encode("utf-16"))
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["indexed"] == 4 and rep["failed"] == 0
        rows = _rows(c)
        assert rows["/enc/latin.txt"][4:] == ("cp1252", 1)
        assert rows["/enc/cyrillic.txt"][4] == "cp1251" and rows["/enc/cyrillic.txt"][5] == 1
        assert rows["/enc/utf16.txt"][4:] == ("utf-16", 0)
        assert _sources(c, "resume cafe") == ["/enc/latin.txt"]
        assert _sources(c, "погоде") == ["/enc/cyrillic.txt"]
        assert set(_sources(c, "tapir")) == {"/enc/undefined.txt", "/enc/utf16.txt"}


def test_unknown_types_are_skipped_with_a_reason(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (root / "Makefile").write_text("all:\n")
    (root / "note.md").write_text("# Note\n\nhello gecko\n")
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["indexed"] == 1 and rep["skippedReasons"]["unsupported-type"] == 2
        assert set(_rows(c)) == {"/mixed/note.md"}  # unknown types get no tracking row


# --- chunkers -----------------------------------------------------------------------------


@pytest.mark.parametrize("size, overlap", [(0, 0), (-5, 0), (100, -1), (100, 100), (100, 150)])
def test_bad_chunk_settings_are_refused_at_configuration(home: Path, tmp_path: Path,
                                                        size: int, overlap: int) -> None:
    with Corpus(home) as c:
        with pytest.raises(CorpusError) as e:
            c.add_root(tmp_path, chunk_size=size, chunk_overlap=overlap)
        assert e.value.code == "chunking-invalid"
        assert c.roots() == []  # nothing stored
    with pytest.raises(ValueError):
        chunk_text("abc", chunk_size=size, chunk_overlap=overlap)


def test_chunker_name_and_merged_config_are_checked(home: Path, tmp_path: Path) -> None:
    with Corpus(home) as c:
        with pytest.raises(CorpusError) as e:
            c.add_root(tmp_path, chunker="semantic")
        assert e.value.code == "chunking-invalid"
        root = c.add_root(tmp_path, chunker="fixed", chunk_size=500, chunk_overlap=100)
        assert (root.chunker, root.chunk_size, root.chunk_overlap) == ("fixed", 500, 100)
        with pytest.raises(CorpusError) as e:  # legal alone, illegal with size 500
            c.configure_root(root.prefix, chunk_overlap=600)
        assert e.value.code == "chunking-invalid"
        with pytest.raises(CorpusError) as e:
            c.configure_root("nope", chunk_size=10)
        assert e.value.code == "root-unknown"
        assert c.roots()[0].chunk_overlap == 100


@pytest.mark.parametrize("chunker", ["recursive", "markdown", "fixed"])
def test_crlf_paragraphs_chunk_exactly_like_lf(chunker: str) -> None:
    crlf = chunk_text("A\r\n\r\nB\r\n\r\nC", chunk_size=3, chunk_overlap=0, chunker=chunker)
    assert [c.text for c in crlf] == ["A", "B", "C"]
    assert crlf == chunk_text("A\n\nB\n\nC", chunk_size=3, chunk_overlap=0, chunker=chunker)
    assert [(c.line_start, c.line_end) for c in crlf] == [(1, 1), (3, 3), (5, 5)]
    long = ("para one line\r\nstill one\r\n\r\n" + "word " * 300 + "\r\n\r\n# H\r\n\r\nend\r\n")
    assert chunk_text(long, kind="markdown", chunk_size=200, chunk_overlap=40, chunker=chunker) == \
        chunk_text(long.replace("\r\n", "\n"), kind="markdown", chunk_size=200,
                   chunk_overlap=40, chunker=chunker)


def test_markdown_keeps_headings_with_sections_and_never_crosses_one() -> None:
    md = ("# Alpha\n\nshort alpha text.\n\n## Beta\n\n" + "beta words here. " * 30 +
          "\n\n## Gamma\n\n" + "g" * 250 + "\n")
    chunks = chunk_text(md, chunk_size=120, chunk_overlap=30, chunker="markdown")
    heads = ("# Alpha", "## Beta", "## Gamma")
    for ch in chunks:
        assert sum(h in ch.text for h in heads) <= 1  # never crosses a heading
        assert len(ch.text) <= 120
    by_head = {h: next(c for c in chunks if h in c.text) for h in heads}
    assert by_head["## Beta"].text.startswith("## Beta\n\nbeta words")  # heading with its text
    assert by_head["## Beta"].heading_path == ("Alpha", "Beta")
    gamma = [c for c in chunks if c.heading_path == ("Alpha", "Gamma")]
    assert max(len(c.text) for c in gamma) <= 120 and "".join(
        c.text for c in gamma).count("g") >= 250  # a separator-less run cut by characters
    # the markdown chunker finds headings even in a .txt; recursive does not
    assert chunk_text("# T\n\nx\n", kind="text", chunker="markdown")[0].heading_path == ("T",)
    assert chunk_text("# T\n\nx\n", kind="text", chunker="recursive")[0].heading_path == ()


def test_fixed_chunker_packs_lines_and_cuts_long_ones() -> None:
    text = "\n".join(f"line {i:03d}" for i in range(40))
    chunks = chunk_text(text, chunk_size=50, chunk_overlap=9, chunker="fixed")
    for a, b in zip(chunks, chunks[1:]):
        assert a.char_end - b.char_start <= 9
        assert b.text.startswith("line ")  # whole lines only
    assert all(len(c.text) <= 50 for c in chunks)
    cut = chunk_text("z" * 130, chunk_size=50, chunk_overlap=0, chunker="fixed")
    assert [len(c.text) for c in cut] == [50, 50, 30]


def test_overlap_is_a_ceiling_and_chunks_cover_the_text() -> None:
    rnd = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta.", "eps", "\n", "\n\n", "zeta;", "x" * 30]
    for trial in range(60):
        text = " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 300)))
        size = rnd.randint(5, 200)
        overlap = rnd.randint(0, size - 1)
        for chunker in ("recursive", "markdown", "fixed"):
            chunks = chunk_text(text, chunk_size=size, chunk_overlap=overlap, chunker=chunker)
            covered = set()
            for ch in chunks:
                assert len(ch.text) <= size, (trial, chunker)
                assert text.replace("\r", "")[ch.char_start:ch.char_end] == ch.text
                covered.update(range(ch.char_start, ch.char_end))
            for a, b in zip(chunks, chunks[1:]):
                assert max(0, a.char_end - b.char_start) <= overlap, (trial, chunker)
            assert all(i in covered for i, c in enumerate(text) if not c.isspace())


def test_100kb_single_line_file_is_bounded(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    (root / "one-line.txt").write_text(("kinkajou" + "abcdefgh" * 12_800)[:102_400])
    with Corpus(home) as c:
        c.add_root(root, chunk_size=1000, chunk_overlap=100)
        rep = c.sync()
        assert rep["indexed"] == 1 and rep["chunks"] >= 100
        db = sqlite3.connect(c.db_path)
        assert db.execute("SELECT MAX(LENGTH(text)) FROM chunks").fetchone()[0] <= 1000
        db.close()


def test_root_chunker_change_rechunks_on_next_sync(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "a.txt").write_text("\n\n".join(f"paragraph {i} " + "w " * 40 for i in range(20)))
    with Corpus(home) as c:
        prefix = c.add_root(root).prefix
        first = c.sync()["chunks"]
        assert c.sync()["chunks"] == 0
        c.configure_root(prefix, chunker="fixed", chunk_size=200, chunk_overlap=0)
        rep = c.sync()
        assert rep["updated"] == 1 and rep["chunks"] > first


# --- tracking -------------------------------------------------------------------------------


def test_row_opened_before_indexing_and_insert_before_delete(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    f = root / "doc.md"
    f.write_text("# Doc\n\nfirst version about lynx\n")
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        f.write_text("# Doc\n\nsecond version about serval\n")
        os.utime(f, ns=(1, 1))
        trace: list[str] = []
        c.record.db.set_trace_callback(trace.append)
        c.sync()
        c.record.db.set_trace_callback(None)

        def first(prefix: str, needle: str = "") -> int:
            return next(i for i, s in enumerate(trace)
                        if s.lstrip().startswith(prefix) and needle in s)

        opened = first("INSERT INTO documents", "'processing'")
        inserted = first("INSERT OR REPLACE INTO chunks")
        deleted = first("DELETE FROM chunks", "AND chunk_id NOT IN")
        done = first("UPDATE documents SET", "status='done'")
        assert opened < inserted < deleted < done
        assert _sources(c, "serval") == ["/t/doc.md"] and _sources(c, "lynx") == []


def test_interrupted_processing_row_is_visible_and_redone(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    (root / "a.md").write_text("# A\n\nmarmot notes\n")
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        db = sqlite3.connect(c.db_path)
        db.execute("UPDATE documents SET status='processing'")  # as a crash would leave it
        db.commit()
        db.close()
        st = c.status_report()
        assert st["processingDocuments"] == ["/t/a.md"] and st["byStatus"]["processing"] == 1
        rep = c.sync()
        assert rep["updated"] == 1 and _rows(c)["/t/a.md"][0] == "done"


def test_empty_files_are_recorded_not_done(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "e"
    root.mkdir()
    (root / "empty.txt").write_bytes(b"")
    (root / "blank.md").write_text(" \n\t\n\r\n")
    (root / "ok.txt").write_text("a real kiwi\n")
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["empty"] == 2 and rep["indexed"] == 1
        rows = _rows(c)
        for s in ("/e/empty.txt", "/e/blank.md"):
            status, code, message, count = rows[s][:4]
            assert (status, code, count) == ("error", "empty-document", 0)
            assert message.startswith("chunk: empty-document - ")
        assert c.sync()["empty"] == 0  # recorded: not retried while unchanged


def test_status_per_root_per_status_stale_and_failed(home: Path, tmp_path: Path) -> None:
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x.md").write_text("# X\n\nwalrus\n")
    (a / "bad.txt").write_bytes(b"\x00\x01")
    (b / "y.txt").write_text("pelican\n")
    with Corpus(home) as c:
        c.add_root(a)
        c.add_root(b, chunker="fixed", chunk_size=300, chunk_overlap=0)
        c.sync()
        (b / "y.txt").write_text("pelican changed\n")
        assert _sources(c, "pelican") == []  # withheld, flagged stale
        st = c.status_report()
    roots = {r["prefix"]: r for r in st["rootList"]}
    assert roots["a"]["byStatus"] == {"processing": 0, "done": 1, "error": 1}
    assert roots["b"]["chunker"] == "fixed" and roots["b"]["stale"] == 1
    assert st["byStatus"] == {"processing": 0, "done": 2, "error": 1}
    assert st["staleDocuments"] == ["/b/y.txt"]
    (failed,) = st["failedDocuments"]
    assert failed["source"] == "/a/bad.txt" and failed["code"] == "binary"
    assert failed["message"].startswith("parse: binary - ")


# --- sync modes -------------------------------------------------------------------------------


def _mode_fixture(home: Path, tmp_path: Path) -> tuple[Corpus, Path]:
    root = tmp_path / "m"
    root.mkdir()
    (root / "keep.txt").write_text("unchanged heron\n")
    (root / "edit.txt").write_text("old egret\n")
    (root / "gone.txt").write_text("doomed ibis\n")
    c = Corpus(home)
    c.add_root(root)
    c.sync()
    (root / "edit.txt").write_text("new egret stork\n")
    os.utime(root / "edit.txt", ns=(3, 3))
    (root / "gone.txt").unlink()
    (root / "new.txt").write_text("fresh crane\n")
    return c, root


@pytest.mark.parametrize("mode, expect", [
    ("new_only", {"indexed": 1, "updated": 1, "removed": 1, "unchanged": 1, "new-ignored": 0}),
    ("update_only", {"indexed": 0, "updated": 1, "removed": 1, "unchanged": 1, "new-ignored": 1}),
    ("full", {"indexed": 1, "updated": 2, "removed": 1, "unchanged": 0, "new-ignored": 0}),
])
def test_sync_modes_follow_the_table(home: Path, tmp_path: Path, mode: str, expect: dict) -> None:
    c, _root = _mode_fixture(home, tmp_path)
    with c:
        rep = c.sync(mode=mode)
        got = {"indexed": rep["indexed"], "updated": rep["updated"], "removed": rep["removed"],
               "unchanged": rep["skippedReasons"]["unchanged"],
               "new-ignored": rep["skippedReasons"]["new-ignored"]}
        assert got == expect
        assert _sources(c, "stork") == ["/m/edit.txt"] and _sources(c, "ibis") == []
        assert _sources(c, "heron") == ["/m/keep.txt"]
        assert _sources(c, "crane") == ([] if mode == "update_only" else ["/m/new.txt"])
        with pytest.raises(CorpusError) as e:
            c.sync(mode="everything")
        assert e.value.code == "sync-mode-invalid"


def test_full_resync_rewrites_the_same_chunk_ids(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "f"
    root.mkdir()
    (root / "a.md").write_text("# A\n\n" + "\n\n".join(f"para {i} finch" for i in range(30)))
    with Corpus(home) as c:
        c.add_root(root, chunk_size=60, chunk_overlap=0)
        c.sync()
        db = sqlite3.connect(c.db_path)
        before = db.execute("SELECT chunk_id FROM chunks ORDER BY 1").fetchall()
        rep = c.sync(mode="full")
        assert rep["updated"] == 1 and rep["chunks"] == len(before)
        assert db.execute("SELECT chunk_id FROM chunks ORDER BY 1").fetchall() == before
        db.close()
        assert len(_hits(c, "finch", limit=50)) == 2  # per-document cap, no duplicates


def test_same_name_in_two_folders_are_two_documents(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "n"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "readme.md").write_text("# Readme\n\nthe alpaca folder\n")
    (root / "b" / "readme.md").write_text("# Readme\n\nthe vicuna folder\n")
    with Corpus(home) as c:
        c.add_root(root)
        assert c.sync()["indexed"] == 2
        assert _sources(c, "alpaca") == ["/n/a/readme.md"]
        assert _sources(c, "vicuna") == ["/n/b/readme.md"]
        (root / "b" / "readme.md").unlink()
        assert c.sync()["removed"] == 1
        assert _sources(c, "alpaca") == ["/n/a/readme.md"]


def test_unchanged_resync_writes_nothing_in_any_store(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "u"
    root.mkdir()
    make_pdf(root / "p.pdf", ["static tortoise page"])
    make_docx(root / "d.docx")
    (root / "h.html").write_text(HTML)
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        snapshot = {p: p.stat().st_mtime_ns for p in (home / "corpus" / "tantivy").iterdir()}
        db = sqlite3.connect(c.db_path)
        before = db.execute("SELECT * FROM documents ORDER BY 1").fetchall()
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()
        rep = c.sync()
        assert (rep["indexed"], rep["updated"], rep["chunks"], rep["bytes"]) == (0, 0, 0, 0)
        assert db.execute("SELECT * FROM documents ORDER BY 1").fetchall() == before
        assert db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone() == seq
        assert {p: p.stat().st_mtime_ns for p in (home / "corpus" / "tantivy").iterdir()} == snapshot
        db.close()


# --- progress ---------------------------------------------------------------------------------


def test_progress_reports_files_and_bytes(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    for i in range(5):
        (root / f"{i}.txt").write_text(f"file {i} " * (i + 1) * 10)
    total = sum(p.stat().st_size for p in root.iterdir())
    calls: list[tuple[int, int, str, int, int]] = []
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync(progress=lambda *a: calls.append(a))
    assert calls[0][:2] == (0, 5) and calls[-1] == (5, 5, "", total, total)
    assert [c[3] for c in calls] == sorted(c[3] for c in calls)  # bytes only grow
    assert rep["files"] == 5 and rep["bytes"] == total


# --- datasource records --------------------------------------------------------------------------


RECORDS = [
    {"id": "T-1", "text": "The flamingo outage was caused by DNS.", "date": "2024-03-01",
     "tags": ["ops", "dns"], "project": "kith", "workType": "incident", "lifecycle": "closed",
     "sourceSet": "tickets", "extra": "ignored"},
    {"id": "T-2", "text": "Plan the toucan migration.", "project": "other"},
    {"id": "deep/path/T-3", "text": "Nested id about a hornbill."},
]


def _jsonl(path: Path, records: list, junk: list[str] = ()) -> Path:
    path.write_text("\n".join([*(json.dumps(r) for r in records), *junk]) + "\n", "utf-8")
    return path


def test_import_records_ids_metadata_and_idempotence(home: Path, tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "t.jsonl", RECORDS, ['{"id": "T-9"}', "not json", '[1, 2]',
                                               '{"id": "../x", "text": "t"}',
                                               '{"id": "T-1", "text": "dup"}',
                                               '{"id": "T-8", "text": "x", "tags": "ops"}'])
    with Corpus(home) as c:
        rep = c.import_records(f, kind="tickets", instance="acme")
        assert (rep["records"], rep["indexed"]) == (3, 3)
        assert [(e["line"], e["code"]) for e in rep["errors"]] == [
            (4, "text-invalid"), (5, "not-json"), (6, "not-an-object"), (7, "id-invalid"),
            (8, "duplicate-id"), (9, "metadata-invalid")]
        assert rep["ignoredKeys"] == ["extra"]
        hit = _hits(c, "flamingo outage")[0]
        assert hit.source_id == "/tickets/acme/T-1"
        assert hit.metadata == {"date": "2024-03-01", "tags": ["ops", "dns"], "project": "kith",
                                "workType": "incident", "lifecycle": "closed",
                                "sourceSet": "tickets"}
        assert hit.root_prefix is None and hit.rel_path is None
        assert _sources(c, "hornbill") == ["/tickets/acme/deep/path/T-3"]
        assert _sources(c, "flamingo toucan", filters={"project": ["kith"]}) == ["/tickets/acme/T-1"]
        db = sqlite3.connect(c.db_path)
        before = db.execute("SELECT * FROM documents ORDER BY 1").fetchall()
        again = c.import_records(f, kind="tickets", instance="acme")
        assert (again["indexed"], again["updated"], again["skipped"], again["chunks"]) == (0, 0, 3, 0)
        assert db.execute("SELECT * FROM documents ORDER BY 1").fetchall() == before
        changed = [dict(RECORDS[0], text="The flamingo outage was caused by BGP."), RECORDS[1]]
        rep = c.import_records(_jsonl(tmp_path / "t2.jsonl", changed), kind="tickets",
                               instance="acme", replace=True)
        assert (rep["updated"], rep["skipped"], rep["removed"]) == (1, 1, 1)
        assert _sources(c, "hornbill") == [] and _sources(c, "bgp") == ["/tickets/acme/T-1"]
        db.close()
        c.sync()  # a sync never touches records
        assert _sources(c, "toucan") == ["/tickets/acme/T-2"]


def test_import_refusals(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    f = _jsonl(tmp_path / "r.jsonl", RECORDS[:1])
    with Corpus(home) as c:
        c.add_root(root)
        for kind, instance in (("Bad Kind", "x"), ("ok", "../up"), ("notes", "x"), ("", "x")):
            with pytest.raises(CorpusError) as e:
                c.import_records(f, kind=kind, instance=instance)
            assert e.value.code == "import-invalid", (kind, instance)
        with pytest.raises(CorpusError) as e:
            c.import_records(tmp_path / "missing.jsonl", kind="k", instance="i")
        assert e.value.code == "import-not-found"
        with pytest.raises(CorpusError) as e:
            c.import_records(tmp_path, kind="k", instance="i")
        assert e.value.code == "import-not-found"
        junk = tmp_path / "junk.jsonl"
        junk.write_bytes(b"\xff\xfe garbage\n{not json}\n")
        with pytest.raises(CorpusError) as e:
            c.import_records(junk, kind="k", instance="i")
        assert e.value.code == "import-invalid" and "line 1" in e.value.message
        c.import_records(f, kind="tickets", instance="i")
        other = tmp_path / "tickets"
        other.mkdir()
        assert c.add_root(other).prefix == "tickets-2"  # never shadows a datasource kind


# --- analyzer ----------------------------------------------------------------------------------


def test_cjk_bigrams_and_folding(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "poems"
    root.mkdir()
    (root / "a.txt").write_text("床前明月光\n")
    (root / "b.txt").write_text("低头思故乡\n")
    (root / "c.txt").write_text("Un résumé au café.\n")
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        hits = _hits(c, "故乡")
        assert hits[0].source_id == "/poems/b.txt" and hits[0].score > 0
        assert "/poems/a.txt" not in [h.source_id for h in hits]
        assert _sources(c, "cafe") == ["/poems/c.txt"] and _sources(c, "resume") == ["/poems/c.txt"]
        assert _sources(c, "RÉSUMÉ") == ["/poems/c.txt"]
        for q in ("故", "乡", "明月", "zzzz", "的"):
            assert all(h.score > 0 for h in _hits(c, q))


# --- origins / serve-time gate -----------------------------------------------------------------


def test_folder_swapped_for_a_symlink_outside_is_withheld(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "g"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "n.txt").write_text("the capybara note\n")
    outside = tmp_path / "elsewhere"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        assert _sources(c, "capybara") == ["/g/sub/n.txt"]
        shutil.copytree(root / "sub", outside, copy_function=shutil.copy2)
        shutil.rmtree(root / "sub")
        (root / "sub").symlink_to(outside, target_is_directory=True)
        hits, ctl = c.search_hits("capybara", limit=5)
        assert hits == [] and ctl["withheldStale"] == 1
        c.sync()  # the symlinked folder is not followed: the document is removed
        assert c.status_report()["documents"] == 0


def test_old_schema_record_is_upgraded_in_place(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    (root / "a.txt").write_text("dodo\n")
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
    db = sqlite3.connect(home / "corpus" / "corpus.sqlite3")
    db.execute("ALTER TABLE chunks DROP COLUMN page_start")
    db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    db.commit()
    db.close()
    with Corpus(home, readonly=True) as ro:
        assert _sources(ro, "dodo") == ["/old/a.txt"]
    with Corpus(home) as c:
        assert c.sync()["chunks"] == 0 and _sources(c, "dodo") == ["/old/a.txt"]


def test_fifo_and_own_home_inside_a_root_are_never_read(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "note.txt").write_text("the genet note\n")
    os.mkfifo(root / "pipe.txt")  # reading it would block the sync forever
    home = root / "kith-home"  # the node's own home inside its root
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["indexed"] == 1 and rep["failed"] == 0
        assert set(_rows(c)) == {"/r/note.txt"}  # not tantivy's meta.json, not the pipe
        rep = c.sync_paths([home / "corpus" / "tantivy" / "meta.json", root / "pipe.txt"])
        assert (rep["indexed"], rep["failed"]) == (0, 0)


_KILL_CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[3])
from node.corpus.store import Corpus

def progress(done, total, source, *_):
    if done == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)  # mid-batch: files before it are in the open batch

c = Corpus(sys.argv[1])
c.sync(progress=progress)
"""


@pytest.mark.parametrize("kill_at", [1, 7, 23])
def test_a_kill_mid_batch_loses_nothing_and_half_writes_nothing(tmp_path: Path,
                                                                 kill_at: int) -> None:
    """A sync killed (SIGKILL) while files share an open SQLite batch: the record holds
    only whole files, the index nothing the record lacks, and the next sync makes both
    complete — every file searchable once, no ``processing`` row left behind."""
    import subprocess
    import sys

    root = tmp_path / "kb"
    root.mkdir()
    for i in range(30):
        (root / f"n{i:02d}.md").write_text(f"# Note {i}\n\nkillword{i} appears here.\n\n"
                                           + "filler text for the chunker. " * 40)
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _KILL_CHILD, str(home), str(kill_at), str(repo)],
                         capture_output=True, timeout=120)
    assert out.returncode == -9
    with Corpus(home) as c:
        db = sqlite3.connect(c.db_path)
        try:  # whatever the killed run recorded is whole: done rows have all their chunks
            for doc_id, n in db.execute("SELECT doc_id, chunk_count FROM documents "
                                        "WHERE status='done'"):
                assert db.execute("SELECT COUNT(*) FROM chunks WHERE doc_id=?",
                                  (doc_id,)).fetchone()[0] == n
        finally:
            db.close()
        rep = c.sync()
        assert rep["failed"] == 0
        st = c.status_report()
        assert st["byStatus"] == {"processing": 0, "done": 30, "error": 0}
        assert c.stats()["index_lag"] == 0
        for i in range(30):
            assert _sources(c, f"killword{i}") == [f"/kb/n{i:02d}.md"]


def test_an_xhtml_page_parses_without_a_warning_on_stderr() -> None:
    """The PostgreSQL manual's pages start with ``<?xml``: they are read as HTML on
    purpose, and the user's sync output carries no bs4 XMLParsedAsHTMLWarning."""
    import warnings

    from node.corpus.parsers import parse_bytes

    page = (b'<?xml version="1.0" encoding="UTF-8"?>\n<html><head><title>Vacuum</title></head>'
            b"<body><p>VACUUM reclaims storage.</p></body></html>")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parsed = parse_bytes(page, "html", "vacuum.html")
    assert parsed.text == "# Vacuum\n\nVACUUM reclaims storage."
