"""Parsers: turn one file's bytes into text plus what the chunker needs (DESIGN §9).

Kinds and the library behind each (all imported lazily, inside the parser, so the CLI
starts fast):

| kind | suffixes | library |
|---|---|---|
| ``text`` | ``.txt`` ``.text`` ``.log`` | stdlib codecs + ``chardet`` for non-UTF-8 (:func:`decode`) |
| ``markdown`` | ``.md`` ``.markdown`` | as text; headings recognised by the chunker; front matter (:func:`front_matter`) with ``PyYAML`` / ``tomllib`` |
| ``rst`` | ``.rst`` ``.rst.txt`` | as text; titles recognised by the chunker |
| ``html`` | ``.html`` ``.htm`` ``.xhtml`` | ``beautifulsoup4`` with the ``lxml`` parser: main text only |
| ``json`` | ``.json`` ``.jsonl`` ``.ndjson`` | stdlib ``json``: one ``path: value`` line per scalar |
| ``csv`` | ``.csv`` ``.tsv`` | stdlib ``csv`` (dialect sniffed): one ``column: value`` line per row |
| ``pdf`` | ``.pdf`` | ``pypdf``: the text layer, page by page (page numbers kept) |
| ``docx`` | ``.docx`` | ``python-docx``: paragraphs, headings (as Markdown ``#``), tables at every depth |

Decoding of text kinds (:func:`decode`): a BOM; UTF-8; UTF-8 with a few invalid bytes
replaced; else a legacy code page ranked by ``chardet`` with cp1252 preferred unless the
bytes clearly say otherwise (:func:`_legacy`). ``fallback`` and the decoder's choice and
confidence are recorded on the tracking row; undefined bytes become U+FFFD
(``replaced``) — never a crash.

A parser never writes a file. Refusals are :class:`Unsupported` with a stable reason.
"""

from __future__ import annotations

import codecs
import io
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
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

#: Below this share of non-ASCII bytes (of the non-blank bytes) a text is mostly ASCII:
#: its few high bytes are accented letters and symbols, and only detector guesses that
#: read them as Latin script are kept (a two-word cp1252 note was read as cp1006, its
#: ``é`` an Arabic-script letter). Cyrillic, Greek and CJK text is (nearly) all high
#: bytes; Polish, Czech or Hungarian text about 4-12 %.
SPARSE_NON_ASCII = 0.3
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
        title: a PDF's document title from its metadata (:func:`pdf_title`) or a
            Markdown file's front-matter ``title``, else ``""``; the chunker puts it at
            the root of the heading path of chunks without one. A Markdown file with a
            title and no body has the title as its text (``# title``: one chunk, found
            by its title, not an ``empty-document``).
        metadata: document metadata read from the file (Markdown front matter:
            ``date``, ``tags`` and the other :data:`node.corpus.datasource.META_KEYS`),
            stored like a datasource record's so search filters see it.
        notes: how the file was read, for ``kith index status --json``: ``decoder``
            and ``confidence`` (:class:`Decoded`), ``replacedBytes`` when bytes became
            U+FFFD, ``frontMatter`` (``yaml``/``toml``) when front matter was read,
            ``frontMatterIgnored`` (a reason of :func:`front_matter`) when a block
            was read as text, ``frontMatterDropped`` (keys with unusable values).
        definitions: ``(offset in text, name)`` of what the document defines beyond its
            headings: an HTML page's ``<dt>`` terms (:func:`_defined_terms`); the chunker
            adds them to the chunks' ``defines``.
    """

    text: str
    kind: str
    encoding: str
    fallback: bool = False
    replaced: bool = False
    page_starts: tuple[int, ...] = ()
    structure: str = "plain"
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    definitions: tuple[tuple[int, str], ...] = ()


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


@dataclass(frozen=True)
class Decoded:
    """What :func:`decode` made of a text file's bytes.

    Attributes:
        text: the decoded text.
        encoding: the Python codec name used (``utf-8``, ``utf-8-sig``, ``utf-16``,
            ``cp1252``, ``cp1250``…).
        fallback: True when the bytes were not clean UTF-8 (a BOM'd UTF-16 file is not a
            fallback).
        replaced: True when some bytes were undecodable and became U+FFFD.
        confidence: how sure the choice is, 0..1: 1.0 for clean UTF-8 or a BOM; for UTF-8
            with invalid bytes the share of valid multi-byte sequences among valid and
            invalid ones; for a mostly-Latin note its Latin-letter score
            (:func:`_latin_score`); otherwise the detector's (``chardet``) confidence of
            the chosen code page (small numbers are normal for short texts: it is a
            relative score).
        method: ``bom``, ``utf-8``, ``utf-8-replaced``, ``cp1252-prior`` (cp1252 kept as
            plausible as the best Latin page or the detector's best), ``latin-score``
            (another Latin code page read the letters of a mostly-Latin note better),
            ``detector`` (the detector's best guess taken) or ``cp1252-default`` (no
            usable guess).
        replaced_bytes: invalid byte sequences replaced (0 unless ``replaced``).
    """

    text: str
    encoding: str
    fallback: bool = False
    replaced: bool = False
    confidence: float = 1.0
    method: str = "utf-8"
    replaced_bytes: int = 0


def decode(data: bytes) -> Decoded:
    """Decode a text file's bytes, preferring the obvious reading (issue 20 item 3).

    Order: a UTF-8 BOM (stripped) or UTF-16 BOM; NUL bytes refuse the file; strict
    UTF-8; UTF-8 with U+FFFD for invalid bytes when the valid multi-byte sequences are at
    least :data:`UTF8_VALID_PER_INVALID` times the invalid ones (a UTF-8 file with a few
    bad bytes, never a legacy note, which has no or only accidental multi-byte
    sequences); else a legacy code page from :func:`_legacy`.

    Raises:
        Unsupported: ``binary`` when the bytes contain NUL and no UTF-16 BOM.
    """
    if data.startswith(codecs.BOM_UTF8):
        try:
            return Decoded(data[len(codecs.BOM_UTF8):].decode("utf-8"), "utf-8-sig", method="bom")
        except UnicodeDecodeError:
            data = data[len(codecs.BOM_UTF8):]
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return Decoded(data.decode("utf-16"), "utf-16", method="bom")
        except UnicodeDecodeError as exc:
            raise Unsupported("binary", "undecodable UTF-16") from exc
    if b"\x00" in data:
        raise Unsupported("binary", "the file contains NUL bytes and is not text")
    try:
        return Decoded(data.decode("utf-8"), "utf-8")
    except UnicodeDecodeError:
        pass
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - data.count(b"\xef\xbf\xbd")  # minus genuine U+FFFD
    multi = len(text) - len(text.encode("ascii", "ignore")) - bad  # valid multi-byte chars
    if multi >= UTF8_VALID_PER_INVALID * bad:
        return Decoded(text, "utf-8", True, True, round(multi / (multi + bad), 3),
                       "utf-8-replaced", bad)
    return _legacy(data)


#: UTF-8 with invalid bytes is still UTF-8 when its valid multi-byte sequences are at
#: least this many times the invalid ones. Legacy text has accidental valid pairs
#: (cp1250 ``ÓŁ`` is the bytes of UTF-8 ``ӣ``) but many more invalid high bytes.
UTF8_VALID_PER_INVALID = 2
#: cp1252 is kept while the detector rates it at least this share of its best guess
#: (Western notes: 0.9-1.0 on the test sentences; Central European cp1250 notes rate
#: cp1252 at 0.23-0.54 of cp1250; tests/test_corpus_decoding.py).
CP1252_PRIOR = 0.75
#: Below this detector confidence a guess is no evidence against cp1252 on its own (a
#: one-line cp1252 note with ``½`` rated cp720 at 0.045; the shortest cp1250 test
#: sentence rated cp1250 at 0.097 — and it also shows :data:`_MISREAD_SYMBOL`).
CLEAR_CONFIDENCE = 0.1
#: A symbol glued inside a word in the cp1252 reading (``Za¿ó³æ``, ``£ódŸ``): the bytes
#: are letters of another code page (cp1250 ``ż ł ą Ł ź``). Apostrophes, the soft hyphen
#: and the Catalan middle dot are at home inside words and do not count.
_MISREAD_SYMBOL = re.compile(
    r"(?<=[^\W\d_])[^\w\s\u2018\u2019\u00ad\u00b7'`´\x00-\x7f](?=[^\W\d_])"
    r"|(?<![^\W\d_])[£¥ª¼½¾¹²³¿¤](?=[a-zß-ÿ])")
#: The same text as cp1252 where both decode (ISO-8859-1 differs only in the C1 range).
_CP1252_NAMES = frozenset(("cp1252", "iso8859-1"))


def _latin_reading(text: str) -> bool:
    """True when every non-ASCII letter of ``text`` is a Latin-script letter (the
    Latin-1 signs ``µ ª º`` count as Latin: they are how Western notes write units and
    ordinals)."""
    return all("LATIN" in unicodedata.name(ch, "") for ch in set(text)
               if ord(ch) >= 0x80 and ch.isalpha() and ch not in "µªº")


# --- Latin-script legacy notes ----------------------------------------------------------

#: Latin-script code pages tried for a mostly-Latin note, in tie-break order: cp1252 (the
#: Windows default) first, so it wins whenever no other page reads the letters better.
_LATIN_PAGES = ("cp1252", "cp1250", "cp1257", "cp1254", "iso8859-2")
#: Non-ASCII letters of the languages the pages above serve (lower case). A reading whose
#: accented letters all belong to one language is more plausible than one that mixes
#: Polish ``ż`` with Spanish ``é`` (``Ñandú ¿qué?`` read as cp1250 is ``Ńandú żqué?``).
_LANGUAGE_LETTERS = tuple(frozenset(s) for s in (
    "àâæçéèêëîïôœùûüÿ",  # French
    "äöüßé",  # German (and loan words)
    "áéíóúüñ",  # Spanish
    "áâãàçéêíóôõú",  # Portuguese
    "àèéìíîòóùú",  # Italian
    "àçèéíïòóúü",  # Catalan
    "éëïóöüèáàíúêâôû",  # Dutch
    "åäöé",  # Swedish
    "æøåé",  # Danish, Norwegian
    "áðéíóúýþæö",  # Icelandic
    "äöåšž",  # Finnish
    "äöõüšž",  # Estonian
    "ąćęłńóśźż",  # Polish
    "áčďéěíňóřšťúůýž",  # Czech
    "áäčďéíĺľňóôŕšťúýž",  # Slovak
    "áéíóöőúüű",  # Hungarian
    "čšž",  # Slovenian
    "čćđšž",  # Croatian, Bosnian
    "ăâîşţșț",  # Romanian
    "çğıöşüâî",  # Turkish
    "ąčęėįšųūž",  # Lithuanian
    "āčēģīķļņšūž",  # Latvian
))
#: A symbol between two letters (``Za¿ó³æ`` is cp1250 ``Zażółć`` read as cp1252).
#: Apostrophes, the soft hyphen and the Catalan middle dot are at home inside words.
#: So is a pound, yen or fraction sign opening a lower-case word (``£ukasz`` is cp1250
#: ``Łukasz``) — not ``¿``, which opens Spanish questions.
_GLUED_SYMBOL = re.compile(
    r"(?<=[^\W\d_])(?:[^\w\s\u2018\u2019\u00ad\u00b7'`´\x00-\x7f]|[¹²³])(?=[^\W\d_])"
    r"|(?<![^\W\d_])[£¥¼½¾¹²³¤](?=[a-zß-ÿ])")
#: A reading is Latin text when at least this share of its words with accented letters
#: also hold an ASCII letter (Cyrillic, Greek, Hebrew or Arabic bytes read as cp1252 are
#: words of accented letters only: ``Ìîñêâà``) ...
LATIN_MIXED_WORDS = 0.75
#: ... and at least this share of its non-ASCII characters inside words are letters
#: (CJK double bytes read as cp1252 are half symbols: ``“ú–{‚Ì``).
LATIN_LETTER_SHARE = 0.85


def _mostly_latin(reading: str) -> bool:
    """True when ``reading`` looks like Latin-script text with some accented letters."""
    words = [w for w in reading.split() if sum(c.isalpha() for c in w) >= 2
             and any(c.isalpha() and ord(c) >= 0x80 for c in w)]
    if not words or not _latin_reading(reading):
        return False
    mixed = sum(any("a" <= c.lower() <= "z" for c in w) for w in words)
    high = [c for w in words for c in w.strip(".,;:!?()[]\"'«»“”„‘’…—–-")
            if ord(c) >= 0x80]
    letters = sum(c.isalpha() for c in high)
    return mixed >= LATIN_MIXED_WORDS * len(words) and letters >= LATIN_LETTER_SHARE * len(high)


def _latin_score(reading: str) -> float:
    """How plausible ``reading`` is as Latin-script text, at most 1.0.

    The share of its accented letters that one language of :data:`_LANGUAGE_LETTERS`
    holds, less the share of its non-ASCII characters that are symbols glued inside
    words (:data:`_GLUED_SYMBOL`). ``-1.0`` for a reading with C1 control characters
    (ISO-8859 pages leave 0x80-0x9F to controls no note holds).
    """
    if any("\x80" <= c <= "\x9f" for c in reading):
        return -1.0
    accented = [c.lower() for c in reading if ord(c) >= 0x80 and c.isalpha()]
    high = sum(ord(c) >= 0x80 for c in reading)
    cover = max((sum(c in lang for c in accented) for lang in _LANGUAGE_LETTERS),
                default=0) / max(len(accented), 1) if accented else 1.0
    return cover - len(_GLUED_SYMBOL.findall(reading)) / max(high, 1)


def _detector_tiebreak(sample: bytes, name: str, tied: list[str]) -> str:
    """``name`` (cp1252) unless ``chardet`` rates one of ``tied`` clearly better: at
    least :data:`CLEAR_CONFIDENCE` and cp1252 under :data:`CP1252_PRIOR` of it (a
    Slovenian ``čez`` reads ``èez`` as cp1252: both are one language's letters)."""
    try:
        import chardet

        found = chardet.detect_all(sample, ignore_threshold=True)
    except Exception:  # detection is advice
        return name
    conf: dict[str, float] = {}
    for guess in found:
        try:
            key = codecs.lookup(guess.get("encoding") or "").name
        except LookupError:
            continue
        conf.setdefault(key, float(guess.get("confidence") or 0.0))
    best = max(tied, key=lambda n: conf.get(n, 0.0))
    western = max(conf.get("cp1252", 0.0), conf.get("iso8859-1", 0.0))
    if conf.get(best, 0.0) >= CLEAR_CONFIDENCE and western < CP1252_PRIOR * conf[best]:
        return best
    return name


def _latin(data: bytes) -> Decoded | None:
    """The best Latin code page for a mostly-Latin note, or None when it is not one.

    Issue 20's rule: among legacy single-byte code pages, Western text is read as cp1252
    unless the bytes clearly say otherwise. When the cp1252 or cp1250 reading of the
    sample is Latin text (:func:`_mostly_latin`), only :data:`_LATIN_PAGES` compete
    (a short note gives a statistical detector too little to tell ``Größe 5 µm`` from
    Korean johab) and the highest :func:`_latin_score` wins, cp1252 on ties.
    """
    sample = data[:DETECT_BYTES]
    readings: dict[str, str] = {}
    for name in _LATIN_PAGES:
        try:
            readings[name] = sample.decode(name)
        except UnicodeDecodeError:
            continue
    gate = [readings[n] for n in ("cp1252", "cp1250") if n in readings]
    if "cp1252" not in readings:
        gate.append(sample.decode("latin-1"))
    if not any(_mostly_latin(r) for r in gate):
        return None
    scores = {n: _latin_score(r) for n, r in readings.items()}
    if "cp1252" not in readings:
        scores["iso8859-1"] = _latin_score(sample.decode("latin-1"))
    name = max(scores, key=lambda n: scores[n])  # first of the best: cp1252 on ties
    tied = [n for n in scores if n != name and scores[n] == scores[name]
            and readings.get(n) != readings.get(name)]
    if name == "cp1252" and tied:  # the letters cannot tell: ask the detector
        name = _detector_tiebreak(sample, name, tied)
    if scores[name] < 0:
        return None
    try:
        text = data.decode(name)
    except UnicodeDecodeError:  # the sample decoded, the rest does not
        return None
    method = "cp1252-prior" if name == "cp1252" else "latin-score"
    return Decoded(text, "latin-1" if name == "iso8859-1" else name, True, False,
                   round(max(scores[name], 0.0), 3), method)


def _legacy(data: bytes) -> Decoded:
    """A single- or multi-byte legacy code page for bytes that are not UTF-8.

    A mostly-Latin note is decided among the Latin code pages by :func:`_latin`; the
    rest as follows.

    ``chardet`` ranks the candidates (all of them, its threshold ignored, on the first
    :data:`DETECT_BYTES` bytes). A mostly-ASCII text (high bytes under
    :data:`SPARSE_NON_ASCII` of the non-blank bytes) keeps only the candidates that read
    its letters as Latin script: a few high bytes are accented letters, not Cyrillic or
    Arabic words (a cp1252 note was read as cp1006). cp1252 — the Windows default, whose
    curly quotes, dashes, ``€`` and symbols are what Western notes hold — is taken when it
    decodes the bytes and is rated at least :data:`CP1252_PRIOR` of the best candidate;
    otherwise the best candidate. Undecodable bytes become U+FFFD under cp1252.
    """
    latin = _latin(data)
    if latin is not None:
        return latin
    sample = data[:DETECT_BYTES]
    solid = len(sample) - sum(sample.count(c) for c in b" \t\r\n")
    high = len(sample) - len(sample.decode("latin-1").encode("ascii", "ignore"))
    sparse = high < SPARSE_NON_ASCII * max(solid, 1)
    try:
        import chardet

        found = chardet.detect_all(sample, ignore_threshold=True)
    except Exception:  # detection is advice; cp1252 is the recorded default
        found = []
    ranked: list[tuple[str, float]] = []
    for guess in found[:_MAX_CANDIDATES]:
        try:
            name = codecs.lookup(guess.get("encoding") or "").name
            reading = sample.decode(name)
        except (LookupError, UnicodeDecodeError):
            continue
        if sparse and not _latin_reading(reading):
            continue
        ranked.append((name, float(guess.get("confidence") or 0.0)))
    cp1252_ok = not _CP1252_UNDEFINED & set(data)
    if cp1252_ok and ranked:
        western = max((c for n, c in ranked if n in _CP1252_NAMES), default=0.0)
        best_name, best = ranked[0]
        reading = sample.decode("cp1252")
        if (western >= CP1252_PRIOR * best or sample.decode(best_name) == reading
                or (best < CLEAR_CONFIDENCE and _latin_reading(reading)
                    and not _MISREAD_SYMBOL.search(reading))):
            return Decoded(data.decode("cp1252"), "cp1252", True, False, round(western, 3),
                           "cp1252-prior")
    for name, conf in ranked:
        if name in _CP1252_NAMES and not cp1252_ok:
            name = "iso8859-1"
        try:
            return Decoded(data.decode(name), "latin-1" if name == "iso8859-1" else name,
                           True, False, round(conf, 3), "detector")
        except UnicodeDecodeError:  # the sample decoded, the rest does not
            continue
    if cp1252_ok:
        return Decoded(data.decode("cp1252"), "cp1252", True, False, 0.0, "cp1252-default")
    return Decoded(data.decode("cp1252", errors="replace"), "cp1252", True, True, 0.0,
                   "cp1252-default", sum(data.count(b) for b in _CP1252_UNDEFINED))


#: Bytes given to the detector (its own default reading limit).
DETECT_BYTES = 200_000
#: Most detector candidates looked at (ranked best first).
_MAX_CANDIDATES = 12


def decode_text(data: bytes) -> tuple[str, str, bool, bool]:
    """:func:`decode` as ``(text, encoding, fallback, replaced)``.

    Raises:
        Unsupported: ``binary`` (see :func:`decode`).
    """
    d = decode(data)
    return d.text, d.encoding, d.fallback, d.replaced


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
#: Marks the start of a ``<dt>`` line while a page is rendered (never left in the text).
_TERM_MARK = "\x01"
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
            if name == "li":  # a list item keeps its bullet: one item per line on display
                out.append("- ")
            elif name == "dt":  # a defined term: marked, recorded and unmarked by _html
                out.append(_TERM_MARK)
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
    bullet = False  # an <li> whose text starts in a block of its own (<li><p>…)
    for raw_line in raw.replace("\r", "\n").split("\n"):
        line = _WS.sub(" ", raw_line).strip()
        if not fence and line == "-":
            bullet = True
            continue
        if bullet and line and not fence:
            bullet = False
            if (line not in ("```", "~~~") and not line.startswith(("\x00", "- "))):
                line = "- " + line
        if line in ("```", "~~~") and (not fence or line == fence):
            fence = "" if fence else line
        elif fence:  # a <pre> line keeps its indentation and inner spacing
            line = raw_line.rstrip()
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
    never headings and keep their indentation and spacing); the ``<title>`` becomes the level-1 heading at the root of every
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
    text, terms = _defined_terms(text)
    return ParsedDocument(text=text, kind="html", encoding=encoding,
                          fallback=encoding not in ("utf-8", "ascii", "utf-8-sig"),
                          structure="atx", definitions=terms)


def _defined_terms(text: str) -> tuple[str, tuple[tuple[int, str], ...]]:
    """``text`` without its ``<dt>`` marks, and ``(offset, name)`` of each marked line: the
    line up to a parenthesis or a dash (``work_mem (integer)`` → ``work_mem``), when that
    is at most 6 words."""
    if _TERM_MARK not in text:
        return text, ()
    out: list[str] = []
    terms: list[tuple[int, str]] = []
    pos = 0
    for part in text.split(_TERM_MARK):
        if out:  # a marked line starts here
            line = part.split("\n", 1)[0]
            name = re.split(r"\s+[(\[—–]|\s+-\s", line, maxsplit=1)[0].strip()
            if name and len(name.split()) <= 6:
                terms.append((pos, name))
        out.append(part)
        pos += len(part)
    return "".join(out), tuple(terms)


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

    d = decode(data)
    text = d.text
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
    return ParsedDocument(text="\n\n".join(blocks), kind="json", encoding=d.encoding,
                          fallback=d.fallback, replaced=d.replaced, notes=_decoder_notes(d))


def _csv(data: bytes, tab: bool) -> ParsedDocument:
    """CSV/TSV: the header line, then one ``column: value | ...`` line per row (line N of
    the text is row N of the file for single-line records)."""
    import csv

    d = decode(data)
    text = d.text
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
    return ParsedDocument(text="\n".join(lines), kind="csv", encoding=d.encoding,
                          fallback=d.fallback, replaced=d.replaced, notes=_decoder_notes(d))


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


#: Deepest nesting of tables and content controls read in a DOCX (Word itself nests a
#: few levels; a crafted file cannot make the walk recurse without end).
MAX_DOCX_DEPTH = 32


def _docx(data: bytes) -> ParsedDocument:
    """DOCX body in order: headings as Markdown ``#``, paragraphs, tables.

    A table row is one line of its cells, tab-separated; a table nested in a cell is read
    cell by cell too, its rows as lines where it stands in the cell (document order: the
    row's text before it, its rows, the row's text after it), at every depth (to
    :data:`MAX_DOCX_DEPTH`). Content controls (``w:sdt``: a cover page, a
    table of contents, a form field) are read like the body around them, in place, and
    text boxes after the paragraph they are anchored in (:func:`_docx_text_boxes`).
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

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx raises several types for a bad package
        raise Unsupported("not-a-document", "the bytes are not a readable DOCX") from exc
    tags = {"p": qn("w:p"), "tbl": qn("w:tbl"), "sdt": qn("w:sdt"),
            "content": qn("w:sdtContent"), "tr": qn("w:tr"), "tc": qn("w:tc")}
    blocks: list[str] = []
    _docx_blocks(document, document.element.body, tags, blocks, 0)
    return ParsedDocument(text="\n\n".join(blocks), kind="docx", encoding="docx",
                          structure="atx")


def _docx_children(element: Any, tags: dict[str, str]) -> Iterator[Any]:
    """Block children of ``element`` in order, content controls opened in place."""
    for child in element.iterchildren():
        if child.tag == tags["sdt"]:
            for content in child.iterchildren(tags["content"]):
                yield from _docx_children(content, tags)
        else:
            yield child


def _docx_blocks(document: Any, element: Any, tags: dict[str, str], blocks: list[str],
                 depth: int) -> None:
    """Append the blocks (heading, paragraph or table text) under ``element``."""
    from docx.text.paragraph import Paragraph

    for child in _docx_children(element, tags):
        if child.tag == tags["p"]:
            para = Paragraph(child, document)
            text = " ".join(para.text.split())
            style = (para.style.name if para.style is not None else "") or ""
            m = re.match(r"Heading (\d)", style)
            if not text:
                pass
            elif style == "Title":
                blocks.append(f"# {text}")
            elif m:
                blocks.append(f"{'#' * min(6, int(m.group(1)) + 1)} {text}")
            elif text:
                blocks.append(text)
            if depth < MAX_DOCX_DEPTH:  # text boxes anchored in the paragraph
                for box in _docx_text_boxes(child):
                    _docx_blocks(document, box, tags, blocks, depth + 1)
        elif child.tag == tags["tbl"] and depth < MAX_DOCX_DEPTH:
            rows: list[str] = []
            _docx_table(document, child, tags, rows, depth + 1)
            if rows:
                blocks.append("\n".join(rows))


_W_TXBX = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}txbxContent"
_MC_FALLBACK = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"


def _docx_text_boxes(paragraph: Any) -> list[Any]:
    """The outermost text boxes (``w:txbxContent``) anchored in a paragraph's runs —
    python-docx's paragraph text leaves them out — except the legacy VML copy Word
    writes as the ``mc:Fallback`` of the same box."""
    boxes = []
    for box in paragraph.iter(_W_TXBX):
        up = box.getparent()
        outer = True
        while up is not None and up is not paragraph:
            if up.tag in (_MC_FALLBACK, _W_TXBX):
                outer = False
                break
            up = up.getparent()
        if outer:
            boxes.append(box)
    return boxes


def _docx_table(document: Any, tbl: Any, tags: dict[str, str], rows: list[str],
                depth: int) -> None:
    """Append one line per row of ``tbl`` (cells tab-separated, a cell's paragraphs
    joined by a space), in document order: a table nested in a cell ends the line there
    (the cells so far, the cell's text before the table), its rows follow, and the rest
    of the row (the cell's text after the table, the next cells) goes on a new line."""
    from docx.text.paragraph import Paragraph

    for tr in _docx_children(tbl, tags):
        if tr.tag != tags["tr"]:
            continue
        cells: list[str] = []
        split = False  # a nested table cut the row: its pieces lose their empty ends
        for tc in _docx_children(tr, tags):
            if tc.tag != tags["tc"]:
                continue
            words: list[str] = []
            for child in _docx_children(tc, tags):
                if child.tag == tags["p"]:
                    words.extend(Paragraph(child, document).text.split())
                elif child.tag == tags["tbl"] and depth < MAX_DOCX_DEPTH:
                    cells.append(" ".join(words))
                    if any(cells):
                        rows.append("\t".join(cells).strip("\t"))
                    cells, words, split = [], [], True
                    _docx_table(document, child, tags, rows, depth + 1)
            cells.append(" ".join(words))
        if any(cells):
            line = "\t".join(cells)
            rows.append(line.strip("\t") if split else line)


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
    d = decode(data)
    notes = _decoder_notes(d)
    text, title, metadata = d.text, "", {}
    if kind == "markdown":
        text, title, metadata, fm_notes = front_matter(text)
        notes.update(fm_notes)
        if title and not text.strip():  # only front matter: the title is the text
            text = f"{text}# {title}"
    return ParsedDocument(text=text, kind=kind, encoding=d.encoding, fallback=d.fallback,
                          replaced=d.replaced, structure=STRUCTURE.get(kind, "plain"),
                          title=title, metadata=metadata, notes=notes)


def _decoder_notes(d: Decoded) -> dict[str, Any]:
    """The :attr:`ParsedDocument.notes` of a decoding."""
    notes: dict[str, Any] = {"decoder": d.method, "confidence": d.confidence}
    if d.replaced_bytes:
        notes["replacedBytes"] = d.replaced_bytes
    return notes


# --- Markdown front matter ------------------------------------------------------------

#: Largest front-matter block read as metadata (bytes, UTF-8); a bigger one is text.
MAX_FRONT_MATTER_BYTES = 64 * 1024
#: Opening line -> (format, closing-line pattern). YAML may also close with ``...``.
_FRONT_MATTER = {
    "---": ("yaml", re.compile(r"^(?:---|\.\.\.)[ \t]*\r?$", re.M)),
    "+++": ("toml", re.compile(r"^\+\+\+[ \t]*\r?$", re.M)),
}


def front_matter(text: str) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """Read Markdown front matter: YAML between ``---`` lines or TOML between ``+++``
    lines, opening on the first line (issue 20 item 4).

    A block read as metadata is blanked in the text (its lines become empty lines, so
    line numbers of the body stay those of the file): it is never body text or a
    heading. ``title`` becomes the document title, ``date`` (a YAML/TOML date or an ISO
    8601 string) and ``tags`` (a list, or one comma-separated string) and the other
    :data:`node.corpus.datasource.META_KEYS` become metadata, checked as a datasource
    record's are (a bad value is dropped and named in ``frontMatterDropped``).

    A block that is unclosed (``front-matter-unclosed``), over
    :data:`MAX_FRONT_MATTER_BYTES` (``front-matter-too-large``), not valid YAML/TOML
    or not a mapping (``front-matter-invalid``) leaves the text as it is, with the
    reason in ``frontMatterIgnored`` — never a failed document.

    Returns:
        ``(text, title, metadata, notes)``.
    """
    nl = text.find("\n")
    opening = text[:nl if nl >= 0 else len(text)].rstrip("\r").rstrip(" \t")
    if nl < 0 or opening not in _FRONT_MATTER:
        return text, "", {}, {}
    fmt, closing = _FRONT_MATTER[opening]
    close = closing.search(text, nl + 1)
    if close is None:
        return text, "", {}, {"frontMatterIgnored": "front-matter-unclosed"}
    block = text[nl + 1:close.start()]
    if len(block.encode("utf-8", "surrogatepass")) > MAX_FRONT_MATTER_BYTES:
        return text, "", {}, {"frontMatterIgnored": "front-matter-too-large"}
    try:
        if fmt == "yaml":
            import yaml

            value = yaml.safe_load(block)
            if value is None:
                value = {}
        else:
            import tomllib

            value = tomllib.loads(block.replace("\r\n", "\n"))
    except Exception:  # YAMLError, TOMLDecodeError, RecursionError...: ordinary text
        return text, "", {}, {"frontMatterIgnored": "front-matter-invalid"}
    if not isinstance(value, dict):
        return text, "", {}, {"frontMatterIgnored": "front-matter-invalid"}
    end = text.find("\n", close.end())
    end = len(text) if end < 0 else end
    body = "\n" * text.count("\n", 0, end) + text[end:]
    title = value.get("title")
    title = label_text(str(title)) if isinstance(title, (str, int, float)) else ""
    metadata, dropped = _front_matter_metadata(value)
    notes: dict[str, Any] = {"frontMatter": fmt}
    if dropped:
        notes["frontMatterDropped"] = dropped
    return body, title, metadata, notes


def _front_matter_metadata(value: dict[Any, Any]) -> tuple[dict[str, Any], list[str]]:
    """Front-matter keys of :data:`~node.corpus.datasource.META_KEYS` as checked
    metadata, and the keys dropped for an unusable value."""
    import datetime as dt

    from node.corpus import datasource

    meta: dict[str, Any] = {}
    dropped: list[str] = []
    for key in datasource.META_KEYS:
        raw = value.get(key)
        if raw is None:
            continue
        if key == "date" and isinstance(raw, (dt.date, dt.datetime)):
            raw = raw.isoformat()
        elif key == "tags":
            if isinstance(raw, str):
                raw = [t for t in (p.strip() for p in raw.split(",")) if t]
            elif isinstance(raw, list):
                raw = [str(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else t
                       for t in raw]
        try:
            meta.update(datasource.check_metadata({key: raw}))
        except datasource.MetadataInvalid:
            dropped.append(key)
    return meta, dropped
