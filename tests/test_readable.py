"""Readable evidence (issue 10 item 4): previews, excerpts and the extractive synthesis
show text without reST/Markdown/HTML markup, cut at sentence or word boundaries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.answer import readable
from node.answer.contract import validate
from node.answer.envelope import EXCERPT_CHARS, PREVIEW_CHARS, SYNTHESIS_CHARS, build_envelope
from node.corpus.types import Hit

#: Markup that must never reach a reader.
MARKUP = re.compile(
    r":[a-z][\w:.-]*:`|``|`|\*\*|(?:^|\s)\.\. |::|\]\(|!\[|&(?:amp|lt|gt|quot|#\d+);|"
    r"</?(?:b|i|em|strong|p|br|code|a|span|div)\b[^>]*>|```|~~~|^\s*#{1,6}\s|"
    r"^\s*([=\-~^*+#])\1{2,}\s*$|<https?:", re.MULTILINE)

WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12)
PHRASE = st.lists(WORDS, min_size=1, max_size=6).map(" ".join)


def _sentence(words: list[str]) -> str:
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


@st.composite
def rest_document(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A generated reST chunk and the words a reader must still see, in order."""
    parts: list[str] = []
    words: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["para", "role", "literal", "emph", "heading", "note",
                                     "version", "index", "function", "link", "target",
                                     "comment", "field"]))
        w = draw(st.lists(WORDS, min_size=2, max_size=8))
        if kind == "para":
            parts.append(_sentence(w))
            words += w
        elif kind == "role":
            role = draw(st.sampled_from(["func", "class", "mod", "meth", "data", "attr",
                                         "exc", "envvar", "file", "py:func", "const"]))
            parts.append(f"{_sentence(w)[:-1]} :{role}:`{w[0]}.{w[1]}` end.")
            words += w + [w[0], w[1], "end"]
        elif kind == "literal":
            parts.append(f"Use ``{w[0]}`` and `{w[1]}` here.")
            words += ["Use", w[0], "and", w[1], "here"]
        elif kind == "emph":
            parts.append(f"A **{w[0]} {w[1]}** and *{w[0]}* text.")
            words += ["A", w[0], w[1], "and", w[0], "text"]
        elif kind == "heading":
            title = " ".join(w)
            parts.append(f"{title}\n{draw(st.sampled_from('=-~^*'))* max(3, len(title))}")
            words += w
        elif kind == "note":
            name = draw(st.sampled_from(["note", "warning", "seealso", "tip"]))
            parts.append(f".. {name}::\n\n   {_sentence(w)}")
            words += w
        elif kind == "version":
            parts.append(f".. versionadded:: 3.{len(w)}\n   {_sentence(w)}")
            words += w
        elif kind == "index":
            parts.append(f".. index::\n   single: {w[0]}\n   pair: {w[1]}; {w[0]}")
        elif kind == "function":
            parts.append(f".. function:: {w[0]}({w[1]})\n   :noindex:\n\n   {_sentence(w)}")
            words += [w[0]] + w
        elif kind == "link":
            parts.append(f"See `{w[0]} {w[1]} <https://example.org/{w[0]}>`_ now.")
            words += ["See", w[0], w[1], "now"]
        elif kind == "target":
            parts.append(f".. _{w[0]}-{w[1]}:")
        elif kind == "comment":
            parts.append(f".. {w[0]} {w[1]}\n   {w[0]}")
        else:
            parts.append(f":{w[0]}: {_sentence(w)}")
            words += w
    return "\n\n".join(parts), words


@st.composite
def markdown_document(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A generated Markdown (with some HTML) chunk and the words a reader must see."""
    parts: list[str] = []
    words: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["para", "heading", "emph", "link", "image", "fence",
                                     "code", "html", "entity", "list", "quote", "refdef"]))
        w = draw(st.lists(WORDS, min_size=2, max_size=8))
        if kind == "para":
            parts.append(_sentence(w))
            words += w
        elif kind == "heading":
            parts.append("#" * draw(st.integers(1, 6)) + " " + " ".join(w))
            words += w
        elif kind == "emph":
            parts.append(f"Some **{w[0]}** and *{w[1]}* and _{w[0]} {w[1]}_ too.")
            words += ["Some", w[0], "and", w[1], "and", w[0], w[1], "too"]
        elif kind == "link":
            parts.append(f"Read [{w[0]} {w[1]}](https://example.org/{w[0]}?a=1) or "
                         f"[{w[1]}][ref] or <https://example.org/{w[1]}>.")
            words += ["Read", w[0], w[1], "or", w[1], "or"]
        elif kind == "image":
            parts.append(f"![{w[0]}](img/{w[1]}.png) {_sentence(w)}")
            words += [w[0]] + w
        elif kind == "fence":
            lang = draw(st.sampled_from(["", "python", "sh"]))
            parts.append(f"```{lang}\n{w[0]} = {w[1]}\n```")
            words += [w[0], w[1]]
        elif kind == "code":
            parts.append(f"Call `{w[0]}` first.")
            words += ["Call", w[0], "first"]
        elif kind == "html":
            parts.append(f"<p>{w[0]} <b>{w[1]}</b><br/>end</p>")
            words += [w[0], w[1], "end"]
        elif kind == "entity":
            parts.append(f"{w[0]} &amp; {w[1]} &lt;x&gt; &#233;t&eacute;.")
            words += [w[0], "&", w[1], "<x>", "été"]
        elif kind == "list":
            parts.append("\n".join(f"* {x}" for x in w))
            words += w
        elif kind == "quote":
            parts.append(f"> {_sentence(w)}")
            words += w
        else:
            parts.append(f"[{w[0]}]: https://example.org/{w[1]}")
    return "\n\n".join(parts), words


def _prose(text: str) -> str:
    """``text`` without its code blocks (kept verbatim between fence lines, issue 20)."""
    return "\n".join(part for code, part in readable.split_code(text) if not code)


def _in_order(expected: list[str], text: str) -> bool:
    """Every expected word occurs in ``text`` as a whole token, in order."""
    tokens = re.findall(r"[\w&<>é]+", text.lower())
    i = 0
    for tok in tokens:
        if i < len(expected) and tok == re.sub(r"[^\w&<>é]", "", expected[i].lower()):
            i += 1
    return i == len(expected)


@settings(max_examples=300, deadline=None)
@given(rest_document())
def test_clean_rest_removes_markup_and_keeps_the_words(doc: tuple[str, list[str]]) -> None:
    text, words = doc
    out = readable.clean(text)
    assert not MARKUP.search(_prose(out)), (text, out)
    assert _in_order(words, out), (text, out)


@settings(max_examples=300, deadline=None)
@given(markdown_document())
def test_clean_markdown_and_html_removes_markup_and_keeps_the_words(
        doc: tuple[str, list[str]]) -> None:
    text, words = doc
    out = readable.clean(text)
    assert not MARKUP.search(_prose(out)), (text, out)
    assert _in_order(words, out), (text, out)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(WORDS, st.sampled_from([" ", " ", " ", ". ", ", ", "\n", "  "])),
                min_size=1, max_size=80), st.integers(min_value=14, max_value=300))
def test_cut_never_cuts_inside_a_word(pieces: list[tuple[str, str]], limit: int) -> None:
    text = "".join(w + sep for w, sep in pieces).rstrip()
    out = readable.cut(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
        return
    assert out.endswith(readable.ELLIPSIS)
    kept = out[:-len(readable.ELLIPSIS)].rstrip()
    assert text.startswith(kept)
    # the kept part ends where the text had a boundary: whitespace follows it (every
    # generated word is at most 12 letters, so a boundary always fits)
    assert text[len(kept)].isspace() or text[len(kept) - 1] in ".,", (text, out)


def _hit(text: str, n: int = 0) -> Hit:
    return Hit(chunk_id=f"c{n}", source_id=f"/docs/page{n}.rst", text=text, score=1.0 - n / 100,
               location={"lineStart": 3 + n, "lineEnd": 9 + n, "headingPath": ["Top", f"Sec {n}"]},
               content_hash="0" * 64, indexed_at="2026-01-01T00:00:00Z")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(rest_document(), markdown_document()), st.data())
def test_envelope_evidence_is_clean_and_cut_at_words(doc: tuple[str, list[str]],
                                                     data: st.DataObject) -> None:
    """textPreview, excerpt and synthesis sentences never carry markup, keep the limits
    and never end (or start) with part of a word; the location stays for citation."""
    text, words = doc
    query_words = data.draw(st.lists(st.sampled_from(words), min_size=1, max_size=3)) \
        if words else ["anything"]
    req = validate({"query": " ".join(query_words)})
    env = build_envelope(req, [_hit(text), _hit("\n\n".join([text] * 3), 1)])
    clean_tokens = set(readable.clean(text).split())
    shown: list[tuple[str, int]] = []
    for res, cite in zip(env["results"], env["citationPack"]["citations"]):
        shown += [(res["textPreview"], PREVIEW_CHARS), (cite["excerpt"], EXCERPT_CHARS)]
        assert res["provenance"]["location"]["headingPath"] == cite["location"]["headingPath"]
        assert "lineStart" in res["provenance"]["location"]
    shown += [(s["text"], SYNTHESIS_CHARS) for s in env["answerSynthesis"]["sentences"]]
    for shown_text, limit in shown:
        assert len(shown_text) <= limit
        assert not MARKUP.search(_prose(shown_text)), (text, shown_text)
        body = shown_text.strip(readable.ELLIPSIS + " \n")
        for tok in body.split():
            if tok not in ("-", readable.FENCE):  # " - " joins a heading/list item to what follows
                assert tok in clean_tokens, (tok, text, shown_text)


# --- concrete cases --------------------------------------------------------------------

@pytest.mark.parametrize("raw, clean", [
    (":func:`os.path.join` joins", "os.path.join() joins"),
    (":class:`~collections.OrderedDict` keeps", "OrderedDict keeps"),
    (":ref:`the tutorial <tut-intro>` says", "the tutorial says"),
    (":pep:`8` and :rfc:`2616#section-1`", "PEP 8 and RFC 2616"),
    (":meth:`!str.join` and :class:`.HTMLParser`", "str.join() and HTMLParser"),
    ("Use ``None`` or `x`.", "Use None or x."),
    ("see `Python <https://python.org>`_ and `foo`_", "see Python and foo"),
    ("A footnote [#]_ and [1]_ here.", "A footnote and here."),
    ("Example::\n\n   x = 1", "Example:\n\n\n```\nx = 1\n```\n"),
    (".. note::\n\n   Be careful.", "Note:\n\n Be careful."),
    (".. versionadded:: 3.2\n   The *key* argument.", "New in version 3.2.\n The key argument."),
    (".. deprecated-removed:: 3.11 3.13", "Deprecated since version 3.11, will be removed in "
                                          "version 3.13:"),
    (".. index:: single: foo\n   pair: a; b\n\nText.", "\nText."),
    (".. function:: f(x, *args, **kwargs)\n   :noindex:\n\n   Does f.",
     "f(x, *args, **kwargs)\n\n Does f."),
    (".. audit-event:: os.open path,mode os.open", "Raises an auditing event os.open with "
                                                   "arguments path, mode."),
    (":mod:`os` --- Misc\n==========\n\nBody", "os - Misc\n\n\nBody"),
    ("# Title\n\nSome **bold** and _two words_ and __init__ and snake_case_name.",
     "Title\n\nSome bold and two words and __init__ and snake_case_name."),
    ("[text](https://x.org/a_(b)) ![alt](i.png) <https://y.org>", "text alt https://y.org"),
    ("```python\nprint(1)\n```", "\n```\nprint(1)\n```\n"),
    ("Failure will propagate. ::\n\n    import os", "Failure will propagate.\n\n\n```\nimport os\n```\n"),
    ("AT&amp;T &lt;tag&gt; caf&eacute; <b>bold</b><br>", "AT&T <tag> café bold "),
    ("f(*args, **kwargs) and 2 * 3 * 4", "f(*args, **kwargs) and 2 * 3 * 4"),
    (">>> print('a')\na", "\n```\n>>> print('a')\na\n```\n"),
    ("| a | b |\n+---+---+\n| c |   |", "a; b\n\nc"),
])
def test_clean_concrete(raw: str, clean: str) -> None:
    assert readable.clean(raw) == clean


def test_cut_prefers_a_sentence_end_and_never_splits_a_word() -> None:
    text = "The first sentence is here. The second one is rather longer than the room."
    assert readable.cut(text, 50) == "The first sentence is here. …"
    assert readable.cut("alpha beta gamma delta", 15) == "alpha beta…"
    assert readable.cut("short", 10) == "short"
    assert readable.cut("https://example.org/a/very/long/path", 20) == "https://example.org…"


def test_python_docs_preview_reads_cleanly() -> None:
    """A real chunk: getpass's reference (reST with module/author directives and roles)."""
    root = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "python-docs-3.11"
    page = root / "library" / "getpass.rst.txt"
    if not page.is_file():
        pytest.skip(f"the python-docs corpus is not at {root}")
    text = page.read_text(encoding="utf-8")[:1500]
    env = build_envelope(validate({"query": "read a password without echoing"}), [_hit(text)])
    preview = env["results"][0]["textPreview"]
    assert "Prompt the user for a password without echoing." in preview
    assert not MARKUP.search(preview) and "moduleauthor" not in preview
    assert env["answerSynthesis"]["sentences"][0]["text"] == (
        "Prompt the user for a password without echoing.")


def _page_hit(text: str, heading_path: list[str]) -> Hit:
    return Hit(chunk_id="p0", source_id="/pg/protocol-replication.html", text=text, score=1.0,
               location={"lineStart": 1, "lineEnd": 7, "headingPath": heading_path},
               content_hash="0" * 64, indexed_at="2026-01-01T00:00:00Z")


def test_preview_skips_heading_lines_and_marks_only_real_cuts() -> None:
    """A chunk that starts at its section: the preview does not repeat the heading (shown as
    the heading path), and starts without an ellipsis, since no text was left out before
    it (the heading lines and a section number like "55.4." are not left-out text); when
    a prose sentence is skipped the ellipsis says so."""
    title = "PostgreSQL: Documentation: 16: 55.4. Streaming Replication Protocol"
    text = (f"# {title}\n\n## 55.4. Streaming Replication Protocol\n\nTo initiate streaming "
            "replication, the frontend sends the replication parameter in the startup message.\n")
    path = [title, "55.4. Streaming Replication Protocol"]
    for query in ("streaming replication protocol", "initiate replication frontend"):
        env = build_envelope(validate({"query": query}), [_page_hit(text, path)])
        preview = env["results"][0]["textPreview"]
        assert preview.startswith("To initiate streaming replication, the frontend"), (query, preview)
        assert env["citationPack"]["citations"][0]["excerpt"].startswith("To initiate"), query
    # a Markdown section: "## Pads" is the heading path's last entry; "Pads wear." is prose
    md = "# Brakes\n\n## Pads\n\nPads wear out on long descents. Replace brake pads when the lining is thin.\n"
    env = build_envelope(validate({"query": "replace brake lining"}), [_page_hit(md, ["Brakes", "Pads"])])
    assert env["results"][0]["textPreview"] == readable.ELLIPSIS + "Replace brake pads when the lining is thin."
    env = build_envelope(validate({"query": "pads wear descents"}), [_page_hit(md, ["Brakes", "Pads"])])
    assert env["results"][0]["textPreview"] == "Pads wear out on long descents. Replace brake pads when the lining is thin."
    # without a heading path nothing counts as a heading: skipped lines are a cut
    env = build_envelope(validate({"query": "replace brake lining"}), [_page_hit(md, [])])
    assert env["results"][0]["textPreview"].startswith(readable.ELLIPSIS + "Replace")


# --- the quoted answer (issue 20 item 5) ------------------------------------------------


def _quoted(query: str, texts: list[str]) -> list[str]:
    env = build_envelope(validate({"query": query}), [_hit(t, i) for i, t in enumerate(texts)])
    return [s["text"] for s in env["answerSynthesis"]["sentences"]]


def test_quoted_sentences_carry_the_questions_key_terms() -> None:
    texts = ["Compiled files are written to a temporary location. The tempfile module "
             "creates a temporary directory that is removed when the context ends.",
             "A *.pyc file is a temporary artefact of the import system and is safe to delete."]
    quoted = _quoted("temporary directory", texts)
    assert quoted == ["The tempfile module creates a temporary directory that is removed "
                      "when the context ends."]


def test_a_sentence_is_never_quoted_twice_even_in_near_identical_words() -> None:
    texts = ["The argparse module parses command line arguments with subcommands easily.",
             "The argparse module parses the command line arguments with subcommands easily!",
             "Subcommands of argparse parse command line arguments for each verb."]
    quoted = _quoted("parse command line arguments with subcommands", texts)
    assert quoted[0].startswith("The argparse module parses command line")
    assert not any(q.startswith("The argparse module parses the") for q in quoted)
    assert len(quoted) == 2


def test_the_answer_block_is_left_out_when_no_sentence_qualifies() -> None:
    texts = ["Parse command line arguments?", "Subcommands are described elsewhere in detail."]
    env = build_envelope(validate({"query": "parse command line arguments with subcommands"}),
                         [_hit(t, i) for i, t in enumerate(texts)])
    assert env["answerSynthesis"]["sentences"] == []
    from node.cli.render import answer_lines

    lines = answer_lines({"type": "answer", "status": "ok", "envelope": env})
    assert not any("answer (sentences copied" in line.text for line in lines)


# --- code reads like its source (issue 20 item 5) --------------------------------------

TEMPFILE_EXAMPLE = """Here are some examples of typical usage of the :mod:`tempfile` module::

    # create a temporary directory using the context manager
    >>> with tempfile.TemporaryDirectory() as tmpdirname:
    ...     print('created temporary directory', tmpdirname)
    >>> # directory and contents have been removed
"""
CODE_LINES = ["# create a temporary directory using the context manager",
              ">>> with tempfile.TemporaryDirectory() as tmpdirname:",
              "...     print('created temporary directory', tmpdirname)",
              ">>> # directory and contents have been removed"]


def test_code_keeps_its_line_breaks_and_indentation_in_previews_and_excerpts() -> None:
    env = build_envelope(validate({"query": "temporary directory"}), [_hit(TEMPFILE_EXAMPLE)])
    shown = [env["results"][0]["textPreview"], env["citationPack"]["citations"][0]["excerpt"]]
    for text in shown:
        assert " - " not in text
        code = [part for is_code, part in readable.split_code(text) if is_code]
        assert code and code[0].split("\n") == CODE_LINES, text
    # code is evidence to read, not a sentence to quote
    assert all(not s["text"].startswith(readable.FENCE)
               for s in env["answerSynthesis"]["sentences"])


def test_the_cli_prints_code_line_by_line_behind_a_gutter() -> None:
    from node.cli.render import CODE_GUTTER, answer_lines, format_lines

    env = build_envelope(validate({"query": "temporary directory"}), [_hit(TEMPFILE_EXAMPLE)])
    printed = format_lines(answer_lines({"type": "answer", "status": "ok", "envelope": env}), 60)
    code = [line.strip()[len(CODE_GUTTER):] for line in printed
            if line.strip().startswith(CODE_GUTTER)]
    assert code == CODE_LINES  # never re-wrapped, indentation inside the block kept
    assert not any(readable.FENCE in line for line in printed)


def test_a_preview_of_a_chunk_that_starts_mid_sentence_says_so() -> None:
    text = "and the directory is removed with everything in it. The tempfile module cleans up."
    env = build_envelope(validate({"query": "directory removed"}), [_hit(text)])
    assert env["results"][0]["textPreview"].startswith(readable.ELLIPSIS + "and the directory")


def test_an_html_pre_block_keeps_its_indentation_in_the_cli() -> None:
    """``<pre>`` code shows as a Markdown fence does: its indentation kept."""
    from node.cli.render import CODE_GUTTER, answer_lines, format_lines
    from node.corpus.parsers import parse_bytes

    page = b"<html><body><p>The quux helper:</p><pre>def quux():\n    return 42</pre></body></html>"
    text = parse_bytes(page, "html", "q.html").text
    env = build_envelope(validate({"query": "quux helper"}), [_hit(text)])
    printed = format_lines(answer_lines({"type": "answer", "status": "ok", "envelope": env}), 60)
    code = [line.strip()[len(CODE_GUTTER):] for line in printed
            if line.strip().startswith(CODE_GUTTER)]
    assert code == ["def quux():", "    return 42"]



# --- lists keep one item per line -------------------------------------------------------

ARGPARSE_LIST = """Description of parameters:

   * title - title for the sub-parser group in help output; by default
     "subcommands" if description is provided

   * description - description for the sub-parser group in help output, by
     default ``None``

   * prog - usage information that will be displayed with sub-command help
"""


def test_a_list_keeps_one_item_per_line_in_previews_excerpts_and_the_cli() -> None:
    from node.cli.render import answer_lines, format_lines

    env = build_envelope(validate({"query": "sub-parser group help"}), [_hit(ARGPARSE_LIST)])
    for text in (env["results"][0]["textPreview"], env["citationPack"]["citations"][0]["excerpt"]):
        assert " - - " not in text and "default None - " not in text, text
        assert [b for b in readable.blocks(text) if b[0] == "item"][:2] == [
            ("item", '- title - title for the sub-parser group in help output; by default '
                     '"subcommands" if description is provided'),
            ("item", "- description - description for the sub-parser group in help output, "
                     "by default None")], text
    printed = format_lines(answer_lines({"type": "answer", "status": "ok", "envelope": env}), 100)
    assert any(line.strip().startswith("- description - description") for line in printed)
    # a quoted item is shown behind the answer block's bullet only, not two
    assert not any(line.strip().startswith("- - ") for line in printed), printed
    assert all(not s["text"].startswith("- ") for s in env["answerSynthesis"]["sentences"])


def test_an_html_list_in_a_table_cell_keeps_its_items_apart() -> None:
    from node.corpus.parsers import parse_bytes

    page = (b"<html><body><p>The walrus flags:</p><table><tr><td>walrus modes</td>"
            b"<td><ul><li>fast walrus</li><li>slow walrus</li></ul></td></tr></table></body></html>")
    text = parse_bytes(page, "html", "w.html").text
    env = build_envelope(validate({"query": "walrus modes"}), [_hit(text)])
    preview = env["results"][0]["textPreview"]
    assert [p for k, p in readable.blocks(preview) if k == "item"] == [
        "- fast walrus", "- slow walrus"], preview
