"""The chunkers ``recursive``, ``markdown`` and ``fixed`` (DESIGN §9).

- ``recursive`` (default): cut at the headings the parser reports (Markdown, RST, and the
  Markdown-style headings that HTML/DOCX are rendered with), then split as below.
- ``markdown``: like ``recursive`` but every document is read as Markdown (``#``/setext
  headings are recognised even in ``.txt``; RST keeps its titles): a chunk never
  crosses a heading and the heading stays with its section.
- ``fixed``: no headings, no paragraphs — lines are packed up to ``chunk_size``; a line
  longer than ``chunk_size`` is cut by characters.


Text is first cut into *sections* at headings (Markdown ATX/setext, reStructuredText
over/underlined titles), so a heading stays with its section and every chunk knows its
heading path. Each section is then split recursively on the coarsest separator that
works — paragraphs, then lines, then sentences, then words, then characters — and the
pieces are packed greedily into chunks of at most ``chunk_size`` characters. A new chunk
starts by repeating whole trailing pieces of the previous one, up to ``chunk_overlap``
characters: the overlap is a ceiling, not a guarantee.

Before packing (``recursive``, ``markdown``), paragraphs are joined into *units* a chunk
keeps whole when they fit (:func:`_units`): a reST directive and its indented body, a
definition-list entry, a ``::`` paragraph and its literal block, a fenced code block.
Every chunk records what it *defines* (:func:`definitions`, ``Chunk.defines``): the
headings and the reST/Sphinx object directives (with their module: ``textwrap.dedent``)
that start in it, and the terms the parser found (HTML ``<dt>``); ``fixed`` records none.

CRLF and lone CR are normalised to LF before anything else, so a CRLF file yields exactly
the chunks (text, offsets, line ranges) of its LF twin. Every chunk is an exact slice of
the normalised text (leading/trailing whitespace trimmed) and carries its 1-based line
range.

Defaults (``chunk_size`` 1200, ``chunk_overlap`` 150; see specs/corpus.md): about one
documentation subsection or 3–6 paragraphs, i.e. ~250 English tokens — small enough for
BM25 length normalisation to favour the focused passage over a whole page, big enough
that a citation excerpt still reads as context.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import re
from dataclasses import dataclass

DEFAULT_CHUNK_SIZE = 1200
DEFAULT_CHUNK_OVERLAP = 150
#: Bumped whenever the chunker's output changes for the same input (part of chunk ids).
CHUNKER_VERSION = 6
# 6 (issue 40): a chunk records what it defines (headings, reST/Sphinx object directives
# with their module), and a directive block, a definition-list entry or a code block is
# one unit of the split whenever it fits (a signature and its description share a chunk).
# 5 (issue 29): no line or word cut between two groups of a grouped value (a card, an
# IBAN, a phone number), so no chunk holds a fragment of one that scrubbing cannot see.
# 4 (issue 20): Markdown front matter is metadata (its lines blanked), the text decoder
# prefers UTF-8 with a few bad bytes and cp1252 for Western notes, DOCX tables nested in
# cells and content controls are read — the same bytes can give other text.
# 2 (issue 10): HTML/DOCX headings are ATX only (``atx``), and the HTML parser drops page
# furniture and fences <pre> blocks — every document is re-chunked once.
# 3 (issue 10 review): the HTML parser keeps sections whose id (not class) names
# furniture, an article's own <header>/<footer>/<aside>, and the text of a page that is all
# navigation; HTML/PDF titles and headings lose control and format characters.

# paragraphs -> lines -> sentences -> words -> characters. A line break or a space between
# two groups of a grouped value (``4111 1111 …``, ``DE89 3704 …``, ``GB82 WEST …``, ``+44 20
# …``, ``(212) 555-0134``: a digit or capital letter, or a parenthesis, on each side) is no
# cut: a chunk cut there would hold a fragment no scrub detector recognises (specs/policy.md
# §9.1), and a scrubbed peer would be sent the value in two pieces.
_LEFT_OF_GROUP = r"(?<![0-9A-Z)])"
_RIGHT_OF_GROUP = r"(?![0-9A-Z(+])"
_SEPARATORS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\n[ \t]*\n\s*"),
    re.compile(rf"{_LEFT_OF_GROUP}\n|\n{_RIGHT_OF_GROUP}"),
    re.compile(r"(?<=[.!?;:。！？])\s+"),
    re.compile(rf"{_LEFT_OF_GROUP}\s+|\s+{_RIGHT_OF_GROUP}"),
)


@dataclass(frozen=True)
class Chunk:
    """One chunk of a document.

    Attributes:
        ordinal: 0-based position in the document.
        text: the chunk text (an exact, trimmed slice of the LF-normalised text).
        char_start / char_end: offsets of ``text`` in the LF-normalised text.
        line_start / line_end: 1-based inclusive line range.
        heading_path: titles of the enclosing headings, outermost first (empty for text).
        page_start / page_end: 1-based page range (PDF), else ``None``.
        defines: what the chunk defines (:func:`definitions`): the titles of the headings
            and the names of the reST/Sphinx object directives that start inside it, a
            directive's name with its module (and class) when it has one
            (``textwrap.dedent``), in document order.
    """

    ordinal: int
    text: str
    char_start: int
    char_end: int
    line_start: int
    line_end: int
    heading_path: tuple[str, ...] = ()
    page_start: int | None = None
    page_end: int | None = None
    defines: tuple[str, ...] = ()


def normalize_newlines(text: str) -> str:
    """Return ``text`` with CRLF and lone CR turned into LF."""
    if "\r" not in text:  # the common case, checked at C speed
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


CHUNKERS = ("recursive", "markdown", "fixed")
#: Largest accepted ``chunk_size`` (characters).
MAX_CHUNK_SIZE = 1_000_000


def validate_params(chunk_size: int, chunk_overlap: int, chunker: str = "recursive") -> None:
    """Check a chunker configuration (called when a root is configured, DESIGN §9).

    Raises:
        ValueError: unknown ``chunker``; ``chunk_size`` not an integer in
            1..:data:`MAX_CHUNK_SIZE`; ``chunk_overlap`` not an integer with
            ``0 <= chunk_overlap < chunk_size``. The message names the setting.
    """
    if chunker not in CHUNKERS:
        raise ValueError(f"chunker must be one of {', '.join(CHUNKERS)}")
    if (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
            or not 1 <= chunk_size <= MAX_CHUNK_SIZE):
        raise ValueError(f"chunk_size must be an integer from 1 to {MAX_CHUNK_SIZE}")
    if isinstance(chunk_overlap, bool) or not isinstance(chunk_overlap, int) or chunk_overlap < 0:
        raise ValueError("chunk_overlap must be an integer >= 0")
    if chunk_overlap >= chunk_size:
        raise ValueError("chunk_overlap must be smaller than chunk_size")


# --- sections --------------------------------------------------------------------------

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_RST_ADORN = re.compile(r"^([=\-`:'\"~^_*+#<>.!$%&(),/;?@\[\\\]{|}])\1{2,}[ \t]*$")
#: An adornment line after a newline (the first line is never an underline: no title
#: above it). The leading ``\n`` is a literal prefix ``re`` searches for at C speed; a
#: ``^`` with ``re.M`` made the scan try the whole pattern at every character.
_RST_ADORN_ML = re.compile(r"\n([=\-`:'\"~^_*+#<>.!$%&(),/;?@\[\\\]{|}])\1{2,}[ \t]*$", re.M)
_RST_ROLE = re.compile(r":[\w.+:-]+:`([^`<]*?)(?:\s*<[^>]*>)?`")
_RST_LITERAL = re.compile(r"``([^`]*)``")


def _clean_title(title: str) -> str:
    title = _RST_ROLE.sub(r"\1", title)
    title = _RST_LITERAL.sub(r"\1", title)
    return " ".join(title.replace("`", "").split())


def _line_offsets(text: str, lines: list[str] | None = None) -> list[int]:
    """Offset where each line starts (line ``i + 1`` starts at ``out[i]``); ``lines``:
    ``text.split("\\n")`` when the caller has it already."""
    if lines is None:
        lines = text.split("\n")
    out = [0]  # each line's length + 1 (its newline), summed at C speed
    out.extend(itertools.accumulate(map(operator.add, map(len, lines),
                                        itertools.repeat(1))))
    out.pop()
    return out


def _markdown_headings(lines: list[str], setext: bool = True) -> list[tuple[int, int, str]]:
    """Return (line index where the section starts, level, title) for Markdown (ATX
    headings; setext ones too unless ``setext`` is False)."""
    out: list[tuple[int, int, str]] = []
    fence: str | None = None
    prev_blank = True
    skip = _front_matter_end(lines)
    for i, line in enumerate(lines):
        if i < skip:
            continue
        m = _FENCE.match(line)
        if m:
            marker = m.group(1)[0] * 3
            if fence is None:
                fence = marker
            elif marker == fence:
                fence = None
            prev_blank = False
            continue
        if fence is not None:
            continue
        m = _ATX.match(line)
        if m:
            out.append((i, len(m.group(1)), _clean_title(m.group(2) or "")))
            prev_blank = False
            continue
        m = _SETEXT.match(line) if setext else None
        if (m and i > 0 and not prev_blank and lines[i - 1].strip()
                and not (out and out[-1][0] == i - 1)):
            level = 1 if m.group(1)[0] == "=" else 2
            # a setext title is one line here (multi-line paragraphs rarely end in ===)
            out.append((i - 1, level, _clean_title(lines[i - 1])))
            prev_blank = False
            continue
        prev_blank = not line.strip()
    return out


def _front_matter_end(lines: list[str]) -> int:
    """Index of the line after a front-matter block the parser left as text (unclosed
    blocks have none; invalid or oversized ones do): its ``---`` closing line is not a
    setext underline of the line above. 0 when there is no such block."""
    if not lines or lines[0].rstrip() not in ("---", "+++"):
        return 0
    closers = ("---", "...") if lines[0].rstrip() == "---" else ("+++",)
    for i in range(1, len(lines)):
        if lines[i].rstrip() in closers:
            return i + 1
    return 0


def _rst_headings(lines: list[str], text: str, offsets: list[int]) -> list[tuple[int, int, str]]:
    """Return (line index where the section starts, level, title) for RST.

    Only lines that are adornments (found with one multi-line regex over ``text``) are
    looked at, so the cost is per heading, not per line.
    """
    out: list[tuple[int, int, str]] = []
    styles: dict[tuple[str, bool], int] = {}
    n = len(lines)
    skip_until = 0
    for am in _RST_ADORN_ML.finditer(text):
        k = bisect.bisect_right(offsets, am.start() + 1) - 1  # the adornment's line
        i = k - 1  # the title candidate
        if i < skip_until or k >= n:
            continue
        title = lines[i]
        under = lines[k]
        m = _RST_ADORN.match(under)
        if m is None:
            continue
        over = i > 0 and lines[i - 1].rstrip() == under.rstrip()
        if (title.strip() and (over or not title[:1].isspace())
                and not _RST_ADORN.match(title)
                and len(under.rstrip()) >= min(len(title.rstrip()), 3)):
            before = i - 2 if over else i - 1
            if before < 0 or not lines[before].strip():
                style = (m.group(1), over)
                level = styles.setdefault(style, len(styles) + 1)
                out.append((i - 1 if over else i, level, _clean_title(title)))
                skip_until = i + 2
    return out


def _headings(text: str, structure: str, offsets: list[int], lines: list[str]
              ) -> list[tuple[int, int, str]]:
    """(line index where the section starts, level, title) of every heading."""
    if structure not in ("markdown", "atx", "rst"):
        return []
    return (_rst_headings(lines, text, offsets) if structure == "rst"
            else _markdown_headings(lines, setext=structure == "markdown"))


def _sections(text: str, structure: str, offsets: list[int] | None = None,
              lines: list[str] | None = None,
              heads: list[tuple[int, int, str]] | None = None,
              ) -> list[tuple[int, int, tuple[str, ...]]]:
    """Split text into (start, end, heading_path) sections covering all of it
    (``offsets``/``lines``/``heads``: :func:`_line_offsets`, the lines and
    :func:`_headings`, when known). A Markdown or ATX heading with no text before its
    first subheading starts that subsection's section instead of a section of its own."""
    if structure not in ("markdown", "atx", "rst"):
        return [(0, len(text), ())]
    if lines is None:
        lines = text.split("\n")
    if offsets is None:
        offsets = _line_offsets(text, lines)
    if heads is None:
        heads = _headings(text, structure, offsets, lines)
    if not heads:
        return [(0, len(text), ())]
    out: list[tuple[int, int, tuple[str, ...]]] = []
    stack: list[tuple[int, str]] = []
    first = offsets[heads[0][0]]
    if first > 0:
        out.append((0, first, ()))
    carry: int | None = None  # start of a heading-only parent section held for its child
    for idx, (line_no, level, title) in enumerate(heads):
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        start = offsets[line_no] if carry is None else carry
        carry = None
        end = offsets[heads[idx + 1][0]] if idx + 1 < len(heads) else len(text)
        if (structure != "rst" and idx + 1 < len(heads) and heads[idx + 1][1] > level
                and not text[offsets[line_no + 1]:end].strip()):
            # a Markdown/ATX heading right before its first subsection: it goes with the
            # subsection's text (a chunk of nothing but a title is no evidence, and its
            # shortness made it outscore the page's real text on a title word)
            carry = start
            continue
        out.append((start, end, tuple(t for _, t in stack if t)))
    return out


# --- definitions ---------------------------------------------------------------------

#: reST/Sphinx directives that define an object (with or without a domain: ``py:``,
#: ``c:``…). ``module`` also sets the current module; ``currentmodule`` only sets it.
OBJECT_DIRECTIVES = frozenset("""
function class method attribute data exception module option cmdoption envvar decorator
decoratormethod classmethod staticmethod abstractmethod coroutinefunction coroutinemethod
property describe object opcode pdbcommand type member macro var enum enumerator struct
union
""".split())
#: Object kinds whose name lives in the current module (and class): ``textwrap.dedent``.
_PY_MEMBERS = frozenset("""
function class method attribute data exception decorator decoratormethod classmethod
staticmethod abstractmethod coroutinefunction coroutinemethod property
""".split())
_CLASSLIKE = frozenset(("class", "exception"))
#: ``.. [domain:]name:: argument`` — found by its literal ``..`` (the line start is
#: checked after): a ``^`` with ``re.M`` would try the pattern at every character.
_DIRECTIVE = re.compile(r"\.\.[ \t]+(?:(\w+):)?([a-z]+)::[ \t]*([^\n]*)")
_C_NAME = re.compile(r"([A-Za-z_][\w.]*)[ \t]*(?:\(|$)")


def _directive_names(domain: str | None, kind: str, arg: str) -> list[str]:
    """The bare names one object directive defines (``dedent(text)`` → ``dedent``; an
    option ``-h, --help`` → ``-h``, ``--help``)."""
    arg = arg.strip().rstrip("\\").strip()
    if not arg:
        return []
    if domain in ("c", "cpp"):
        m = _C_NAME.search(arg.split("(", 1)[0].strip() + "(")
        return [m.group(1)] if m else []
    if kind in ("option", "cmdoption"):
        return [o.split()[0].split("=", 1)[0].split("[", 1)[0]
                for o in arg.split(", ") if o.strip()]
    if kind in ("describe", "object"):
        return [" ".join(arg.split())[:80]]
    for prefix in ("async ", "await ", "class ", "abstract "):
        if arg.startswith(prefix):
            arg = arg[len(prefix):].lstrip()
    name = re.split(r"[\s(\[:]", arg, maxsplit=1)[0].strip(",")
    return [name] if name else []


def definitions(text: str, structure: str, offsets: list[int] | None = None,
                lines: list[str] | None = None,
                heads: list[tuple[int, int, str]] | None = None) -> list[tuple[int, str]]:
    """Where ``text`` (LF-normalised) defines something: ``(offset, name)`` in document
    order.

    - every heading the chunker cuts at (Markdown, reST, the ATX headings HTML and DOCX
      are rendered with): its title, at the heading's line;
    - with ``structure`` ``rst``, every object directive (:data:`OBJECT_DIRECTIVES`):
      its name, qualified with the current module (``.. module::`` /
      ``.. currentmodule::``) and the enclosing ``class``/``exception`` directive for
      Python objects, so ``.. function:: dedent(text)`` under ``.. module:: textwrap`` is
      ``textwrap.dedent`` and a ``.. method:: wrap`` nested in ``.. class:: TextWrapper``
      there is ``textwrap.TextWrapper.wrap``.
    """
    if lines is None:
        lines = text.split("\n")
    if offsets is None:
        offsets = _line_offsets(text, lines)
    if heads is None:
        heads = _headings(text, structure, offsets, lines)
    out = [(offsets[line] + len(lines[line]) - len(lines[line].lstrip()), title)
           for line, _level, title in heads if title]
    if structure != "rst":
        return out
    found: list[tuple[int, str]] = []
    module = ""
    classes: list[tuple[int, str]] = []  # (indent, qualified name) of open class blocks
    for m in _DIRECTIVE.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        lead = text[start:m.start()]
        if lead.strip(" \t"):
            continue  # not at the start of a line
        domain, kind, arg = m.group(1), m.group(2), m.group(3)
        if domain not in (None, "py", "c", "cpp", "std", "js", "rst"):
            continue
        indent = len(lead.expandtabs())
        while classes and classes[-1][0] >= indent:
            classes.pop()
        if kind in ("module", "currentmodule") and domain in (None, "py"):
            module = arg.strip()
            classes.clear()
            if kind == "module" and module:
                found.append((m.start(), module))
            continue
        if kind not in OBJECT_DIRECTIVES:
            continue
        for name in _directive_names(domain, kind, arg):
            full = name
            if domain in (None, "py") and kind in _PY_MEMBERS:
                owner = classes[-1][1] if classes else module
                if owner and not (full == owner or full.startswith(owner + ".")
                                  or (module and full.startswith(module + "."))):
                    full = f"{owner}.{full}"
            found.append((m.start(), full))
            if kind in _CLASSLIKE and domain in (None, "py"):
                classes.append((indent, full))
    if not out:
        return found
    return sorted(out + found, key=operator.itemgetter(0))


# --- units ---------------------------------------------------------------------------

_FENCE_LINE = re.compile(r"^ {0,3}(?:`{3,}|~{3,})", re.M)


def _indent(text: str, start: int) -> int | None:
    """Indentation of the line ``start`` is on, or None when ``start`` is not at that
    line's first non-blank character (a piece cut inside a line)."""
    line = text.rfind("\n", 0, start) + 1
    lead = text[line:start]
    if lead.strip(" \t"):
        return None
    return len(lead.expandtabs())


def _units(text: str, spans: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Join paragraph pieces into the units a chunk keeps whole when they fit: a block
    and the pieces indented deeper than its first line (a reST directive and its body, a
    definition-list entry's further paragraphs, a ``::`` paragraph and its literal
    block), and a fenced code block's pieces from its opening fence to its closing one.
    A unit that does not fit keeps as many of its leading pieces as fit (a signature and
    its first paragraph), and the rest form units of their own."""
    n = len(spans)
    if n < 2:
        return spans
    indents = [_indent(text, s) for s, _e in spans]
    fences = [("```" in text[s:e] or "~~~" in text[s:e])  # the regex only where needed
              and len(_FENCE_LINE.findall(text, text.rfind("\n", 0, s) + 1, e)) % 2 == 1
              for s, e in spans]
    out: list[tuple[int, int]] = []
    i = 0
    while i < n:
        head = indents[i]
        open_fence = fences[i]
        j = i + 1
        while j < n and spans[j][1] - spans[i][0] <= size:
            if open_fence:
                open_fence = not fences[j]
            elif head is None or indents[j] is None or indents[j] <= head:
                break
            j += 1
        out.append((spans[i][0], spans[j - 1][1]))
        i = j
    return out


# --- recursive split -----------------------------------------------------------------


_END = re.Match.end  # each match's end, taken at C speed by map()


def _split(text: str, start: int, end: int, size: int, level: int) -> list[tuple[int, int]]:
    """Split [start, end) into contiguous spans each <= size characters."""
    if end - start <= size:
        return [(start, end)]
    if level >= len(_SEPARATORS):
        return [(s, min(s + size, end)) for s in range(start, end, size)]
    pattern = _SEPARATORS[level]
    cuts = [c for c in map(_END, pattern.finditer(text, start, end)) if start < c < end]
    if not cuts:
        return _split(text, start, end, size, level + 1)
    spans: list[tuple[int, int]] = []
    prev = start
    for cut in [*cuts, end]:
        if cut <= prev:
            continue
        if cut - prev > size:
            spans.extend(_split(text, prev, cut, size, level + 1))
        else:
            spans.append((prev, cut))
        prev = cut
    return _units(text, spans, size) if level == 0 else spans


def _pack(pieces: list[tuple[int, int]], size: int, overlap: int) -> list[tuple[int, int]]:
    """Greedily pack contiguous pieces into spans <= size, repeating <= overlap chars."""
    out: list[tuple[int, int]] = []
    n = len(pieces)
    i = 0
    while i < n:
        j = i + 1
        while j < n and pieces[j][1] - pieces[i][0] <= size:
            j += 1
        out.append((pieces[i][0], pieces[j - 1][1]))
        if j >= n:
            break
        k = j
        while k - 1 > i and pieces[j - 1][1] - pieces[k - 1][0] <= overlap:
            k -= 1
        while k < j and pieces[j][1] - pieces[k][0] > size:
            k += 1
        i = k
    return out


def _fixed_spans(text: str, size: int) -> list[tuple[int, int]]:
    """Lines (each with its newline) as pieces; a line over ``size`` cut by characters."""
    spans: list[tuple[int, int]] = []
    start = 0
    n = len(text)
    while start < n:
        nl = text.find("\n", start)
        end = n if nl == -1 else nl + 1
        for s in range(start, end, size):
            spans.append((s, min(s + size, end)))
        start = end
    return spans


def structure_for(kind: str) -> str:
    """Heading structure of a parser kind: ``markdown``, ``atx`` (the ATX ``#`` headings
    HTML and DOCX are rendered with: a ``---``/``===`` line from a table cell or an
    operator is not a setext heading there), ``rst`` or ``plain``."""
    return {"markdown": "markdown", "html": "atx", "docx": "atx",
            "rst": "rst"}.get(kind, "plain")


def chunk_text(text: str, *, kind: str = "text", chunk_size: int = DEFAULT_CHUNK_SIZE,
               chunk_overlap: int = DEFAULT_CHUNK_OVERLAP, chunker: str = "recursive",
               structure: str | None = None, page_starts: tuple[int, ...] = (),
               title: str = "", parsed_definitions: tuple[tuple[int, str], ...] = (),
               ) -> list[Chunk]:
    """Chunk a document.

    Args:
        text: decoded text (any newline convention).
        kind: parser kind; decides the heading structure unless ``structure`` is given.
        chunk_size: maximum characters per chunk (1..:data:`MAX_CHUNK_SIZE`).
        chunk_overlap: maximum characters repeated from the previous chunk (< chunk_size).
        chunker: ``recursive``, ``markdown`` or ``fixed`` (see the module docstring).
        structure: ``markdown``, ``atx``, ``rst`` or ``plain`` (default: from ``kind``).
        page_starts: offsets where pages start (PDF); chunks then carry page numbers.
        title: the document's title from its metadata (a PDF's ``/Title``), or ``""``:
            the heading path of every chunk that has none (a PDF has no headings).
        parsed_definitions: ``(offset, name)`` the parser found defined beyond the headings (an
            HTML page's ``<dt>`` terms, offsets in the LF-normalised ``text``), added to
            what :func:`definitions` finds.

    Returns:
        The chunks in document order; empty when the text is only whitespace.

    Raises:
        ValueError: on an invalid configuration (see :func:`validate_params`).
    """
    validate_params(chunk_size, chunk_overlap, chunker)
    text = normalize_newlines(text)
    lines = text.split("\n")  # split once: line offsets and heading scan share it
    line_starts = _line_offsets(text, lines)
    structure = structure or structure_for(kind)
    if chunker == "markdown" and structure == "plain":
        structure = "markdown"
    if chunker == "fixed":
        sections: list[tuple[int, int, tuple[str, ...]]] = [(0, len(text), ())]
        defs: list[tuple[int, str]] = []
    else:
        heads = _headings(text, structure, line_starts, lines)
        sections = _sections(text, structure, line_starts, lines, heads)
        defs = definitions(text, structure, line_starts, lines, heads)
        if parsed_definitions:
            defs = sorted(defs + list(parsed_definitions), key=operator.itemgetter(0))
    def_at = [o for o, _n in defs]
    chunks: list[Chunk] = []
    for sec_start, sec_end, path in sections:
        if not path and title:
            path = (title,)
        if chunker == "fixed":
            pieces = _fixed_spans(text, chunk_size)
        else:
            pieces = _split(text, sec_start, sec_end, chunk_size, 0)
        for s, e in _pack(pieces, chunk_size, chunk_overlap):
            raw = text[s:e]
            stripped = raw.strip()
            if not stripped:
                continue
            s2 = s + (len(raw) - len(raw.lstrip()))
            e2 = s2 + len(stripped)
            page_start = page_end = None
            if page_starts:
                page_start = bisect.bisect_right(page_starts, s2)
                page_end = bisect.bisect_right(page_starts, e2 - 1)
            chunks.append(Chunk(
                ordinal=len(chunks), text=stripped, char_start=s2, char_end=e2,
                line_start=bisect.bisect_right(line_starts, s2),
                line_end=bisect.bisect_right(line_starts, e2 - 1),
                heading_path=path, page_start=page_start, page_end=page_end,
                defines=tuple(dict.fromkeys(
                    n for _o, n in defs[bisect.bisect_left(def_at, s2):
                                        bisect.bisect_left(def_at, e2)])),
            ))
    return chunks
