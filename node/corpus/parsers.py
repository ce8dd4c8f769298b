"""Parsers: turn one file's bytes into text plus what the chunker needs (DESIGN §9).

Kinds and the library behind each (all imported lazily, inside the parser, so the CLI
starts fast):

| kind | suffixes | library |
|---|---|---|
| ``text`` | ``.txt`` ``.text`` ``.log`` | stdlib codecs + ``charset-normalizer`` for non-UTF-8 |
| ``markdown`` | ``.md`` ``.markdown`` | as text; headings recognised by the chunker |
| ``rst`` | ``.rst`` ``.rst.txt`` | as text; titles recognised by the chunker |
| ``html`` | ``.html`` ``.htm`` ``.xhtml`` | ``beautifulsoup4`` with the ``lxml`` parser: main text only |
| ``json`` | ``.json`` ``.jsonl`` ``.ndjson`` | stdlib ``json``: one ``path: value`` line per scalar |
| ``csv`` | ``.csv`` ``.tsv`` | stdlib ``csv`` (dialect sniffed): one ``column: value`` line per row |
| ``pdf`` | ``.pdf`` | ``pypdf``: the text layer, page by page (page numbers kept) |
| ``docx`` | ``.docx`` | ``python-docx``: paragraphs, headings (as Markdown ``#``), tables |

Decoding of text kinds: UTF-8 (BOM stripped), UTF-16 with a BOM; otherwise, when the
text is mostly ASCII (under :data:`SPARSE_NON_ASCII` high bytes) and cp1252 reads its
high bytes as Latin letters, cp1252 — a detector cannot tell a code page from a few
accented letters; otherwise
``charset-normalizer`` is asked: cp1252 (the Windows default) is taken whenever it is
among its candidates and as plausible as the best one — short Western text is where
detectors guess cp1250/mac-roman wrong — otherwise its best guess is kept when it
recognises a language (cp1251 Russian, cp932 Japanese, GB18030...), else cp1252. Either way ``fallback`` is recorded on the tracking row; undefined bytes
become U+FFFD (``replaced``) — never a crash.

A parser never writes a file. Refusals are :class:`Unsupported` with a stable reason.
"""

from __future__ import annotations

import codecs
import io
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Largest text-like file read (bytes); bigger files get reason ``too-large``.
MAX_TEXT_BYTES = 20 * 1024 * 1024
#: Largest PDF/DOCX file read (bytes).
MAX_BINARY_DOC_BYTES = 50 * 1024 * 1024
#: Most PDF pages read; the rest is left out (the text ends with a note).
MAX_PDF_PAGES = 2000
#: Most characters of extracted text kept per document.
MAX_EXTRACTED_CHARS = 20_000_000

_SUFFIX_KIND = {
    ".txt": "text", ".text": "text", ".log": "text",
    ".md": "markdown", ".markdown": "markdown",
    ".rst": "rst",
    ".html": "html", ".htm": "html", ".xhtml": "html",
    ".json": "json", ".jsonl": "json", ".ndjson": "json",
    ".csv": "csv", ".tsv": "csv",
    ".pdf": "pdf",
    ".docx": "docx",
}
#: Heading structure the chunker should look for, per kind.
STRUCTURE = {"markdown": "markdown", "html": "atx", "docx": "atx", "rst": "rst"}

_LANGUAGE_AGNOSTIC = {"Unknown", ""}
#: Below this share of non-ASCII bytes (of the non-blank bytes), when every non-ASCII
#: character cp1252 reads is a Latin letter, a text is Western text with accented letters
#: — where a detector's guess from a handful of high bytes is noise (a two-word cp1252
#: note was read as cp1006, its ``é`` an Arabic-script letter). Cyrillic, Greek and CJK
#: text is (nearly) all high bytes, cp1250 text read as cp1252 shows symbols (``¿ ³ ¹``):
#: those keep the detector's guess (issue 10 "Bad input").
SPARSE_NON_ASCII = 0.6
_CP1252_UNDEFINED = frozenset(b"\x81\x8d\x8f\x90\x9d")


class Unsupported(Exception):
    """The file cannot be indexed; ``reason`` is a stable kebab-case code.

    Reasons: ``unsupported-type``, ``binary`` (NUL bytes in a text file), ``too-large``,
    ``encrypted`` (a password-protected PDF/DOCX), ``not-a-document`` (the bytes are not
    the format the name says), ``archive-refused`` (a DOCX whose zip breaks the archive
    rules), ``no-text-layer`` (a PDF with pages but no extractable text: a scan).
    ``detail`` is a short, path-free explanation for the tracking row.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ParsedDocument:
    """A decoded document.

    Attributes:
        text: the text (newlines untouched for text kinds; LF for extracted kinds).
        kind: the parser kind (see the module table).
        encoding: codec that decoded it (``utf-8``, ``cp1252``, ...), or the format for
            extracted kinds (``pdf``, ``docx``).
        fallback: True when the bytes were not UTF-8 and a detected/fallback codec was used.
        replaced: True when some bytes were undecodable and became U+FFFD.
        page_starts: for PDFs, the offset in ``text`` where each page starts (page
            ``i + 1`` starts at ``page_starts[i]``); empty otherwise.
        structure: heading structure for the chunker: ``markdown``, ``atx`` (ATX headings
            only: HTML, DOCX), ``rst`` or ``plain``.
        title: a PDF's document title from its metadata (:func:`pdf_title`), else ``""``;
            the chunker puts it at the root of the heading path of chunks without one.
    """

    text: str
    kind: str
    encoding: str
    fallback: bool = False
    replaced: bool = False
    page_starts: tuple[int, ...] = ()
    structure: str = "plain"
    title: str = ""


def kind_for(name: str) -> str | None:
    """Return the parser kind for a file name, or ``None`` when no parser reads it.

    ``name.rst.txt`` (Sphinx ``_sources`` as in the python-docs corpus) is RST.
    """
    low = name.lower()
    if low.endswith(".rst.txt"):
        return "rst"
    dot = low.rfind(".")
    if dot <= 0:
        return None
    return _SUFFIX_KIND.get(low[dot:])


def size_limit(kind: str) -> int:
    """Largest file (bytes) read for ``kind``."""
    return MAX_BINARY_DOC_BYTES if kind in ("pdf", "docx") else MAX_TEXT_BYTES


# --- decoding -------------------------------------------------------------------------


def decode_text(data: bytes) -> tuple[str, str, bool, bool]:
    """Decode bytes as text: ``(text, encoding, fallback, replaced)``.

    Raises:
        Unsupported: ``binary`` when the bytes contain NUL and no UTF-16 BOM.
    """
    if data.startswith(codecs.BOM_UTF8):
        try:
            return data[len(codecs.BOM_UTF8):].decode("utf-8"), "utf-8-sig", False, False
        except UnicodeDecodeError:
            pass
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16"), "utf-16", False, False
        except UnicodeDecodeError as exc:
            raise Unsupported("binary", "undecodable UTF-16") from exc
    if b"\x00" in data:
        raise Unsupported("binary", "the file contains NUL bytes and is not text")
    try:
        return data.decode("utf-8"), "utf-8", False, False
    except UnicodeDecodeError:
        pass
    encoding = "cp1252"
    sample = data[:262_144]
    solid = len(sample) - sum(sample.count(c) for c in b" \t\r\n")
    high = sum(1 for b in sample if b >= 0x80)
    if high <= SPARSE_NON_ASCII * max(solid, 1) and not _CP1252_UNDEFINED & set(sample):
        western = data.decode("cp1252")
        if all("LATIN" in unicodedata.name(ch, "") for ch in set(western) if ord(ch) >= 0x80):
            return western, "cp1252", True, False  # the detector would guess: the common one
    try:
        import charset_normalizer

        matches = list(charset_normalizer.from_bytes(data[:262_144]))
        best = matches[0] if matches else None
        western = next((m for m in matches if m.encoding == "cp1252"), None)
        if western is not None and best is not None and western.chaos <= best.chaos + 0.01:
            encoding = "cp1252"  # as plausible as the best guess: the Windows default wins
        elif best is not None and (best.language or "") not in _LANGUAGE_AGNOSTIC:
            encoding = best.encoding
    except Exception:  # detection is advice; cp1252 is the recorded fallback
        encoding = "cp1252"
    try:
        return data.decode(encoding), encoding, True, False
    except (UnicodeDecodeError, LookupError):
        pass
    if encoding != "cp1252":
        try:
            return data.decode("cp1252"), "cp1252", True, False
        except UnicodeDecodeError:
            pass
    return data.decode("cp1252", errors="replace"), "cp1252", True, True


# --- extracted kinds ------------------------------------------------------------------

_BLOCK_TAGS = frozenset(("p", "div", "section", "article", "main", "li", "pre", "blockquote",
                         "tr", "table", "dl", "dt", "dd", "figcaption", "br", "hr", "ul", "ol",
                         "td", "th"))
#: Block elements that open with one newline (the others open a paragraph: two).
_LINE_TAGS = frozenset(("li", "tr", "br", "dt", "dd"))
#: Elements whose strings are never text (code, styling, widgets, the ``<head>``).
_NEVER_TEXT_TAGS = frozenset(("script", "style", "noscript", "template", "svg", "canvas",
                              "iframe", "form", "button", "select", "head", "object"))
#: ``<nav>`` is furniture anywhere; ``<header>``/``<footer>``/``<aside>`` only outside
#: :data:`_SECTIONING`: in HTML5 a header or footer inside an article or section belongs
#: to it (its title, its byline) and an aside inside one is its note or pull quote; only
#: the page's own banner, footer and sidebar are furniture.
_PAGE_LEVEL_TAGS = frozenset(("header", "footer", "aside"))
_SECTIONING = frozenset(("article", "section", "main"))
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_WS = re.compile(r"[ \t\u00a0]+")
#: ARIA landmark roles of page furniture, not content (dropped like ``<nav>``).
_DROP_ROLES = frozenset(("navigation", "banner", "contentinfo", "search", "complementary"))
#: Class words of navigation and page furniture in generated documentation sites —
#: DocBook's ``navheader``/``navfooter`` (prev/up/next links and the neighbouring pages'
#: titles), Sphinx's ``related``/``sphinxsidebar``, breadcrumbs, skip links, site headers
#: and footers — and ``toc`` link lists. Indexed as body they put the neighbours' titles
#: on every page and a tiny title-only chunk before every real one. A page's own section
#: headings stay indexed where they stand; a chapter page's list of other pages' titles
#: is not its content (dropping ``toc`` took scripts/eval --split dev postgresql kith
#: nDCG@10 0.667 → 0.674). Not a plain ``sidebar``: DocBook's sidebar is content.
#: Matched per class word, case-insensitively — never ``id``: Sphinx makes section ids
#: from headings, so ``<section id="navigation">`` is a section titled "Navigation".
_DROP_CLASSES = frozenset((
    "navheader", "navfooter", "navbar", "navigation", "nav", "breadcrumb", "breadcrumbs",
    "sphinxsidebar", "related", "skip-link", "skiplink", "site-header",
    "site-footer", "footer", "header-nav", "headerlink", "toc-sidebar", "toc"))


#: Class words of admonition boxes (DocBook ``note``/``tip``/``warning``…, Sphinx
#: ``admonition``): the title of one ("Note", "Tip") is a label, not a section heading —
#: as a heading it became the section of every chunk after the box up to the next real
#: heading (13 % of the PostgreSQL manual's chunks).
_ADMONITION_CLASSES = frozenset(("note", "tip", "warning", "caution", "important",
                                 "admonition", "hint", "attention", "danger", "seealso"))
#: Most characters of a heading kept (a title or heading is a label, not a paragraph).
MAX_LABEL_CHARS = 200


def _class_words(tag: object) -> list[str]:
    words = (getattr(tag, "attrs", None) or {}).get("class") or []
    if isinstance(words, str):
        words = words.split()
    return [w.lower() for w in words if isinstance(w, str)]


def _is_admonition(tag: object) -> bool:
    """True when ``tag`` itself is an admonition box (:data:`_ADMONITION_CLASSES`)."""
    return any(w in _ADMONITION_CLASSES for w in _class_words(tag))


def _in_admonition(tag: object) -> bool:
    """True when ``tag`` sits inside an admonition box (:data:`_ADMONITION_CLASSES`).

    One walk up the parents (O(depth)); :func:`_html` calls it once per page, not per
    heading (the walk down carries the state)."""
    return any(_is_admonition(parent) for parent in getattr(tag, "parents", ()))


def _is_furniture(tag: object) -> bool:
    """True for an element that is page navigation/furniture by its attributes: an ARIA
    role in :data:`_DROP_ROLES` or a word of its ``class`` in :data:`_DROP_CLASSES`
    (not its ``id``: Sphinx builds section ids from headings). ``<nav>`` and page-level
    ``<header>``/``<footer>``/``<aside>`` are decided by :func:`_html`'s walk."""
    attrs = getattr(tag, "attrs", None)
    if not attrs:
        return False
    role = attrs.get("role")
    if isinstance(role, str) and role.lower() in _DROP_ROLES:
        return True
    return any(w in _DROP_CLASSES for w in _class_words(tag))


def label_text(value: str, limit: int = MAX_LABEL_CHARS) -> str:
    """``value`` as a one-line label (a title or heading from a file, shown to peers in a
    ``headingPath``): control (Unicode ``Cc``) and format (``Cf``: bidirectional
    overrides, zero-width characters) characters removed, white space collapsed, cut to
    ``limit`` characters (``limit`` 0: no cut)."""
    kept = "".join(ch if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf") else ""
                   for ch in value)
    text = " ".join(kept.split())
    return text[:limit] if limit else text


def _walk(root: object, furniture: bool, sectioned: bool) -> Iterator[tuple[Any, bool | None, bool]]:
    """Document-order events under ``root`` (not ``root`` itself), without recursion:
    ``(tag, True, sectioned)`` when a kept element opens, ``(tag, False, sectioned)``
    when it closes, ``(string, None, sectioned)`` for a text string (NavigableString or
    CData: no comments, doctype or ruby text — what bs4's ``get_text`` reads). Subtrees
    of :data:`_NEVER_TEXT_TAGS` and, with ``furniture``, of page furniture are skipped.
    ``sectioned``: whether ``root`` is inside article/section/main (the third item is
    the same for the element's own position)."""
    from bs4 import CData, NavigableString

    text_types = (NavigableString, CData)
    stack: list[tuple[object, bool, bool]] = [
        (child, True, sectioned) for child in reversed(getattr(root, "contents", []))]
    while stack:
        node, opening, inside = stack.pop()
        if not opening:
            yield node, False, inside
            continue
        if isinstance(node, NavigableString):
            if type(node) in text_types:
                yield node, None, inside
            continue
        name = getattr(node, "name", None)
        if name is None or name in _NEVER_TEXT_TAGS:
            continue
        if furniture and (name == "nav" or (name in _PAGE_LEVEL_TAGS and not inside)
                          or _is_furniture(node)):
            continue
        yield node, True, inside
        stack.append((node, False, inside))
        below = inside or name in _SECTIONING
        stack.extend((child, True, below) for child in reversed(node.contents))


def _raw_text(main: object, furniture: bool, sectioned: bool, admonition: bool) -> str:
    """The text under ``main`` with block boundaries as newlines, headings marked
    ``\\x00#…`` and ``<pre>`` fenced: one linear walk, the tree is not modified."""
    out: list[str] = []
    boxes = 1 if admonition else 0  # admonition boxes open around the current node
    # the open <pre>/heading whose strings are being collected: (name, element, in a box,
    # strings); its replacement text is emitted when it closes
    capture: list[tuple[str, object, bool, list[str]]] = []
    for node, opening, _inside in _walk(main, furniture, sectioned):
        if opening is None:
            (capture[-1][3] if capture else out).append(str(node))
            continue
        name = node.name
        if opening:
            in_box = boxes > 0
            if _is_admonition(node):
                boxes += 1
            if capture and capture[-1][0] == "pre":
                continue  # a pre's text is all its strings, markup ignored
            if name == "pre" or (name in _HEADINGS and not capture):
                capture.append((name, node, in_box, []))
                continue
            if capture:
                continue  # inside a heading: its strings only
            if name in _BLOCK_TAGS:
                out.append("\n" if name in _LINE_TAGS else "\n\n")
            continue
        if _is_admonition(node):
            boxes -= 1
        if capture and capture[-1][1] is node:
            kind, _, in_box, parts = capture.pop()
            target = capture[-1][3] if capture else out
            if kind == "pre":
                code = "".join(parts).replace("\r", "\n").strip("\n")
                fence = "~~~" if "```" in code else "```"
                target.append(f"\n\n{fence}\n{code}\n{fence}\n\n" if code.strip() else "")
            else:
                text = label_text(" ".join(parts), 0)
                if text and in_box:  # a box's label stays text
                    target.append(f"\n\n{text}\n\n")
                else:
                    target.append(f"\n\n\x00{'#' * _HEADINGS[kind]} {text}\n\n" if text else "")
            continue
        if capture:
            continue
        if name in ("td", "th"):
            out.append("\t")
        if name in _BLOCK_TAGS:
            out.append("\n")
    return "".join(out)


def _html_text(soup: object, furniture: bool) -> str:
    """The page's main text (:func:`_html`), with or without the furniture filter."""
    main = body = article = role_main = None
    for node, opening, _inside in _walk(soup, furniture, False):
        if not opening:
            continue
        name = node.name
        if name == "main":
            main = node
            break
        if name == "article" and article is None:
            article = node
        elif name == "body" and body is None:
            body = node
        if role_main is None and node.attrs.get("role") == "main":
            role_main = node
    root = main or article or role_main or body or soup
    sectioned = getattr(root, "name", None) in _SECTIONING or any(
        p.name in _SECTIONING for p in getattr(root, "parents", ()))
    raw = _raw_text(root, furniture, sectioned, _in_admonition(root) or _is_admonition(root))
    lines = []
    fence = ""
    for line in raw.replace("\r", "\n").split("\n"):
        line = _WS.sub(" ", line).strip()
        if line in ("```", "~~~") and (not fence or line == fence):
            fence = "" if fence else line
        elif line.startswith("\x00"):  # a real heading (marked above)
            line = line[1:]
        elif line.startswith("#") and not fence:  # e.g. the '#' operator in a table cell
            line = "\\" + line
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _html(data: bytes) -> ParsedDocument:
    """HTML main text: drop scripts/styles, navigation and page furniture
    (``<nav>``, page-level ``<header>``/``<footer>``/``<aside>``, :func:`_is_furniture`),
    keep headings as Markdown ``#`` (not an admonition box's title,
    :data:`_ADMONITION_CLASSES`) and ``<pre>`` blocks as fenced code (their lines are
    never headings); the ``<title>`` becomes the level-1 heading at the root of every
    heading path unless the text starts with its own. When dropping furniture would leave
    no text at all (a page whose whole content sits in a ``<nav>`` or a ``toc`` list),
    the page is read without the furniture filter rather than indexed as its title alone.
    A page that keeps a heading of its own outside the furniture is not: a generated
    manual's chapter page (a title and a ``toc`` of other pages' titles, prev/next boxes)
    is its title. Titles and headings pass through :func:`label_text`. Linear time in the
    page size (one walk, the tree is never modified)."""
    import warnings

    from bs4 import BeautifulSoup, XMLParsedAsHTMLWarning

    with warnings.catch_warnings():  # XHTML pages (an <?xml header) are read as HTML on purpose
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(data, "lxml")
    encoding = (soup.original_encoding or "utf-8").lower()
    title = label_text(soup.title.get_text(" ", strip=True), 0) if soup.title else ""
    text = _html_text(soup, furniture=True) or _html_text(soup, furniture=False)
    first = re.match(r"(#{2,6}) (.*)", text)
    if title and first and first.group(2) == title:  # the page's own title heading
        text = "#" + text[len(first.group(1)):]  # at the root, without a title-only chunk
    elif title and not text.startswith("# "):
        text = f"# {title}\n\n{text}" if text else f"# {title}"
    return ParsedDocument(text=text, kind="html", encoding=encoding,
                          fallback=encoding not in ("utf-8", "ascii", "utf-8-sig"),
                          structure="atx")


def _json_lines(value: object, path: str, out: list[str]) -> None:
    if isinstance(value, dict):
        if not value:
            out.append(f"{path or '.'}: {{}}")
        for k, v in value.items():
            _json_lines(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list):
        if not value:
            out.append(f"{path or '.'}: []")
        for i, v in enumerate(value):
            _json_lines(v, f"{path}[{i}]", out)
    elif isinstance(value, str):
        out.append(f"{path or '.'}: {' '.join(value.split())}")
    else:
        out.append(f"{path or '.'}: {'null' if value is None else value}")


def _json(data: bytes, name_is_lines: bool) -> ParsedDocument:
    """JSON (or JSON Lines): one ``path: value`` line per scalar; top-level array items
    and JSONL records are separated by a blank line (paragraphs for the chunker)."""
    import json

    text, encoding, fallback, replaced = decode_text(data)
    blocks: list[str] = []
    if name_is_lines:
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                out: list[str] = []
                _json_lines(json.loads(line), f"[{n}]", out)
                blocks.append("\n".join(out))
    else:
        value = json.loads(text)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            out = []
            _json_lines(item, f"[{i}]" if isinstance(value, list) else "", out)
            blocks.append("\n".join(out))
    return ParsedDocument(text="\n\n".join(blocks), kind="json", encoding=encoding,
                          fallback=fallback, replaced=replaced)


def _csv(data: bytes, tab: bool) -> ParsedDocument:
    """CSV/TSV: the header line, then one ``column: value | ...`` line per row (line N of
    the text is row N of the file for single-line records)."""
    import csv

    text, encoding, fallback, replaced = decode_text(data)
    sample = text[:65536]
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(
            sample, delimiters="\t" if tab else ",;\t|")
    except csv.Error:
        dialect = csv.excel_tab if tab else csv.excel
    csv.field_size_limit(MAX_TEXT_BYTES)
    rows = csv.reader(io.StringIO(text, newline=""), dialect)
    header: list[str] | None = None
    lines: list[str] = []
    for row in rows:
        cells = [" ".join(c.split()) for c in row]
        if header is None:
            header = cells
            lines.append(" | ".join(cells))
            continue
        named = [f"{header[i] if i < len(header) and header[i] else f'column {i + 1}'}: {c}"
                 for i, c in enumerate(cells) if c]
        lines.append(" | ".join(named))
    return ParsedDocument(text="\n".join(lines), kind="csv", encoding=encoding,
                          fallback=fallback, replaced=replaced)


def _pdf(data: bytes) -> ParsedDocument:
    """PDF text layer with page starts; encrypted PDFs are refused."""
    import logging

    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            raise Unsupported("encrypted", "the PDF is password-protected")
        pages = reader.pages
        count = len(pages)
    except PdfReadError as exc:
        raise Unsupported("not-a-document", "the bytes are not a readable PDF") from exc
    parts: list[str] = []
    starts: list[int] = []
    pos = 0
    for i in range(min(count, MAX_PDF_PAGES)):
        page_text = (pages[i].extract_text() or "").replace("\r\n", "\n").replace("\r", "\n")
        page_text = page_text.replace("\x00", "").strip("\n")
        starts.append(pos)
        parts.append(page_text)
        pos += len(page_text) + 2  # the "\n\n" between pages
        if pos > MAX_EXTRACTED_CHARS:
            break
    text = "\n\n".join(parts)
    if count and not text.strip():
        raise Unsupported("no-text-layer", "the PDF has no text layer (a scan?)")
    try:
        meta = reader.metadata
        title = pdf_title(meta.title if meta is not None else None)
    except Exception:  # a damaged info dictionary only costs the title
        title = ""
    return ParsedDocument(text=text, kind="pdf", encoding="pdf", page_starts=tuple(starts),
                          title=title)


#: Metadata titles that name a tool or a file rather than the document.
_JUNK_TITLE = re.compile(r"^(untitled|document\d*|microsoft (word|powerpoint|excel)\b.*|"
                         r".*\.(docx?|pdf|odt|rtf|tex|dvi|pptx?|xlsx?|txt|indd|qxd))$", re.I)


def pdf_title(value: object) -> str:
    """A PDF's ``/Title`` as a heading (:func:`label_text`: control and format
    characters — BEL, ESC, U+202E… — removed, whitespace collapsed, at most
    :data:`MAX_LABEL_CHARS` characters); ``""`` when missing, not text, without a letter,
    or a tool's placeholder (``Untitled``, ``Microsoft Word - report.docx``, a file
    name)."""
    if not isinstance(value, str):
        return ""
    title = label_text(value)
    if not any(ch.isalpha() for ch in title) or _JUNK_TITLE.match(title):
        return ""
    return title


def _docx(data: bytes) -> ParsedDocument:
    """DOCX body in order: headings as Markdown ``#``, paragraphs, tables (tab-separated).

    The zip is checked against the archive rules first (python-docx inflates it whole).
    """
    from node.corpus import archives

    try:
        archives.check_zip_bytes(data)
    except archives.ArchiveRefused as exc:
        reason = {"encrypted": "encrypted", "not-an-archive": "not-a-document"}.get(
            exc.reason, "archive-refused")
        raise Unsupported(reason, exc.detail) from exc
    import docx
    from docx.oxml.ns import qn
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx raises several types for a bad package
        raise Unsupported("not-a-document", "the bytes are not a readable DOCX") from exc
    blocks: list[str] = []
    body = document.element.body
    for child in body.iterchildren():
        if child.tag == qn("w:p"):
            para = Paragraph(child, document)
            text = " ".join(para.text.split())
            if not text:
                continue
            style = (para.style.name if para.style is not None else "") or ""
            m = re.match(r"Heading (\d)", style)
            if style == "Title":
                blocks.append(f"# {text}")
            elif m:
                blocks.append(f"{'#' * min(6, int(m.group(1)) + 1)} {text}")
            else:
                blocks.append(text)
        elif child.tag == qn("w:tbl"):
            table = Table(child, document)
            rows = ["\t".join(" ".join(c.text.split()) for c in row.cells) for row in table.rows]
            if rows:
                blocks.append("\n".join(rows))
    return ParsedDocument(text="\n\n".join(blocks), kind="docx", encoding="docx",
                          structure="atx")


def parse_bytes(data: bytes, kind: str, name: str = "") -> ParsedDocument:
    """Parse one file's bytes of a known ``kind`` (see :func:`kind_for`).

    Args:
        data: the whole file.
        kind: a kind from :func:`kind_for`.
        name: the file name (decides JSON vs JSON Lines, CSV vs TSV); never stored.

    Raises:
        Unsupported: ``too-large``, ``binary``, ``unsupported-type``, ``encrypted``,
            ``not-a-document``, ``archive-refused``, ``no-text-layer``.
        Exception: any parser exception (the caller records its type, never its text).
    """
    if kind not in set(_SUFFIX_KIND.values()):
        raise Unsupported("unsupported-type")
    if len(data) > size_limit(kind):
        raise Unsupported("too-large")
    low = name.lower()
    if kind == "html":
        return _html(data)
    if kind == "json":
        return _json(data, low.endswith((".jsonl", ".ndjson")))
    if kind == "csv":
        return _csv(data, low.endswith(".tsv"))
    if kind == "pdf":
        return _pdf(data)
    if kind == "docx":
        return _docx(data)
    text, encoding, fallback, replaced = decode_text(data)
    return ParsedDocument(text=text, kind=kind, encoding=encoding, fallback=fallback,
                          replaced=replaced, structure=STRUCTURE.get(kind, "plain"))
