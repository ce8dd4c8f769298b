"""Readable evidence: chunk text with its markup removed, and cuts at word boundaries.

Issue 10 item 4. Chunks are stored and indexed as the source wrote them (reST, Markdown,
HTML leftovers); what a person or an agent *reads* — ``textPreview``, citation
``excerpt`` and the extractive ``answerSynthesis`` of the envelope
(:mod:`node.answer.envelope`) — is the text after :func:`clean`. This module is the one
place that turns markup into plain text and the one place that shortens text for display
(:func:`cut`). Location (heading path, line range, page) is never taken from the text: it
stays in ``provenance.location``, so citations are unchanged by cleaning.

What :func:`clean` does (a display transform, not a parser; pure, deterministic, linear
in the text size):

- reST: roles (``:func:`os.path.join``` → ``os.path.join()``, ``:class:`~a.B``` → ``B``,
  ``:ref:`text <label>``` → ``text``, ``:pep:`8``` → ``PEP 8``), inline literals and
  interpreted text (````x```` / ```x```), hyperlinks (```text <url>`_`` → ``text``),
  footnote references, ``|substitutions|``, escapes; directives: admonitions become a
  label (``.. note::`` → ``Note:``, ``.. versionadded:: 3.2`` → ``New in version
  3.2.``), object directives keep their signature (``.. function:: f(x)`` → ``f(x)``),
  housekeeping directives (``index``, ``module``, ``highlight``, ``toctree``…), their
  options and comments are dropped; heading adornment lines and grid-table rules go;
  a paragraph-ending ``::`` becomes ``:`` (after a space it goes, as Sphinx renders it).
- Markdown: ``#`` headings, emphasis (``**x**``, ``*x*``, ``__x__``, ``_x_`` — never
  ``__dunder__`` names or ``snake_case``), links and images (``[text](url)`` →
  ``text``), reference definitions, code fences (the fence lines; code is kept),
  block quotes, table rules.
- HTML: entities decoded (``&amp;`` → ``&``), common tags and comments removed.

Paragraph breaks (blank lines) are kept so the envelope's sentence splitter still sees
paragraphs, and list bullets (``-``) so it keeps one list item per piece
(:data:`LIST_ITEM`); :func:`blocks` splits the envelope's text into code, list items
and prose for display.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache

#: The ellipsis that marks a cut (one character).
ELLIPSIS = "…"

# --- reST -----------------------------------------------------------------------------

#: Admonition-like directives and the label their body gets.
_LABELS = {
    "note": "Note:", "warning": "Warning:", "caution": "Caution:", "danger": "Danger:",
    "attention": "Attention:", "important": "Important:", "hint": "Hint:", "tip": "Tip:",
    "error": "Error:", "seealso": "See also:", "admonition": "", "impl-detail": "CPython "
    "implementation detail:", "availability": "Availability:", "rubric": "", "topic": "",
    "sidebar": "",
}
#: Version directives: ``.. versionadded:: 3.2`` → ``New in version 3.2.``
_VERSIONS = {"versionadded": "New in version {}.", "versionchanged": "Changed in version {}:",
             "deprecated": "Deprecated since version {}:",
             "deprecated-removed": "Deprecated since version {}, will be removed in version {}:"}
#: Directives whose argument is a language or file name (dropped; the body is kept).
_CODE = frozenset({"code-block", "sourcecode", "code", "doctest", "testcode", "testoutput",
                   "csv-table", "list-table", "table", "figure", "image", "math"})
#: Directives with nothing to read (argument, options and body dropped when indented).
_DROP = frozenset({
    "index", "module", "currentmodule", "highlight", "toctree", "include",
    "literalinclude", "sectionauthor", "moduleauthor", "tabularcolumns", "only",
    "raw", "contents", "sectnum", "meta", "default-role", "role", "testsetup",
    "testcleanup", "autosummary", "automodule", "autoclass", "autofunction", "py:module",
    "py:currentmodule", "c:namespace", "c:namespace-push", "c:namespace-pop",
    "cpp:namespace", "title", "centered", "hlist", "ifconfig", "sectionauthor",
})
_DIRECTIVE = re.compile(r"^([ \t]*)\.\.(?:[ \t]+([A-Za-z][\w.:+-]*?)::(?=[ \t]|$)[ \t]*(.*)"
                        r"|(?:[ \t].*)?)$")
_OPTION = re.compile(r"^[ \t]+:[\w -]+:(?:[ \t].*)?$")
_ROLE = re.compile(r":[A-Za-z][\w.+-]*(?::[A-Za-z][\w.+-]*)*:`((?:[^`\\]|\\.)+)`", re.DOTALL)
_TITLED = re.compile(r"^(.*?)\s*<([^<>]*)>$", re.DOTALL)
_LINK = re.compile(r"`([^`<>]+?)\s*<[^<>`]+>`__?")
_LINK_BARE = re.compile(r"`([^`]+)`__?(?!\w)")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_INTERPRETED = re.compile(r"`(?<![\w`]`)([^`\n]+)`(?![\w`])")
_FOOTNOTE = re.compile(r"\s?\[(?:#\w*|\*|\d+|[A-Za-z][\w-]*)\]_(?!\w)")
_SUBST = re.compile(r"\|([A-Za-z][\w -]*)\|(?:__?)?(?!\w)")
_ADORNMENT = re.compile(r"^[ \t]*([=\-~^\"'`#*+:.<>_])\1{2,}[ \t]*$|^[ \t]*\+(?:[-=]+\+)+[ \t]*$"
                        r"|^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)*\|?[ \t]*$"
                        r"|^[ \t]*(?:={3,}[ \t]+)+={3,}[ \t]*$")
_DC_ALONE = re.compile(r"^[ \t]*::[ \t]*$", re.MULTILINE)
_DC_END = re.compile(r"::[ \t]*$", re.MULTILINE)  # after _DC_ALONE: text precedes
_DC_SPACED = re.compile(r"[ \t]+::[ \t]*$", re.MULTILINE)  # "text ::" -> "text" (reST)
_FIELD = re.compile(r"^([ \t]*):([A-Za-z][\w .-]*):(?=[ \t]|$)", re.MULTILINE)

# --- Markdown -------------------------------------------------------------------------

_MD_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)
_MD_FENCE = re.compile(r"^[ \t]*(?:`{3,}|~{3,})[ \t]*[\w+#.-]*[^\n`]*$", re.MULTILINE)
_MD_IMAGE = re.compile(r"!\[([^\]\n]*)\]\([^)\n]*\)")
_MD_LINK = re.compile(r"\[([^\]\n]+)\]\((?:[^()\n]|\([^()\n]*\))*\)")
_MD_REFLINK = re.compile(r"\[([^\]\n]+)\]\[[^\]\n]*\]")
_MD_REFDEF = re.compile(r"^[ \t]{0,3}\[[^\]\n]+\]:[ \t]+\S+.*$", re.MULTILINE)
_MD_AUTOLINK = re.compile(r"<((?:https?|ftp|mailto):[^<>\s]+)>")
_MD_QUOTE = re.compile(r"^([ \t]*)>(?!>)[ \t]?", re.MULTILINE)
_MD_BULLET = re.compile(r"^([ \t]*)[*+][ \t]+", re.MULTILINE)
_STRONG = re.compile(r"\*\*(?<![\w*\\]\*\*)(?=\S)(.+?)(?<=\S)\*\*(?![\w*])", re.DOTALL)
_EMPH = re.compile(r"\*(?<![\w*\\]\*)(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![\w*])")
_USTRONG = re.compile(r"__(?<![\w\\]__)(?=\S)([^_\n]*\s[^_\n]*?)(?<=\S)__(?!\w)")
_UEMPH = re.compile(r"_(?<![\w\\]_)(?=[^\s_])([^_\n]*\s[^_\n]*?)(?<=[^\s_])_(?!\w)")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>:~ ])")

# --- HTML -----------------------------------------------------------------------------

_TAGS = ("a|abbr|b|big|blockquote|br|center|cite|code|dd|del|div|dl|dt|em|font|h[1-6]|hr|i|"
         "img|ins|kbd|li|mark|ol|p|pre|s|samp|small|span|strike|strong|sub|sup|table|tbody|"
         "td|tfoot|th|thead|tr|tt|u|ul|var|section|article|nav|header|footer|main|figure|"
         "figcaption|details|summary|caption|col|colgroup|wbr|picture|source")
_HTML_TAG = re.compile(rf"</?(?:{_TAGS})(?:\s+[^<>]*)?/?>", re.IGNORECASE)
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_ENTITY = re.compile(r"&(?:#\d{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")

_DASHES = re.compile(r"[ \t]+---[ \t]+")  # Sphinx's em dash in titles
_TABLE_ROW = re.compile(r"^[ \t]*\|.*\|[ \t]*$")
_SPACES = re.compile(r"[ \t]{2,}")


def _role(m: re.Match[str]) -> str:
    """One reST role → its display text (Sphinx's rendering, without the link)."""
    whole = m.group(0)
    name = whole[1:whole.index(":`")].split(":")[-1]
    body = m.group(1).replace("\\", "")
    titled = _TITLED.match(body)
    if titled and titled.group(1):
        return titled.group(1)
    if titled:
        body = titled.group(2)
    if name in ("pep", "rfc"):
        num = body.split("#")[0]
        return f"{name.upper()} {num}"
    if name in ("kbd", "guilabel", "menuselection"):
        return body.replace("-->", "->").replace("&", "")
    body = body.lstrip("!.")
    if body.startswith("~"):
        body = body[1:].rsplit(".", 1)[-1]
    if name in ("func", "meth") and not body.endswith(")"):
        body += "()"
    return body


def _directives(lines: list[str]) -> list[str]:
    """reST explicit markup lines → readable lines (see the module docstring)."""
    out: list[str] = []
    drop_indent: int | None = None  # dropping an indented block deeper than this
    in_header = False  # right after a kept directive line: its option lines go
    for line in lines:
        stripped = line.strip(" \t")
        indent = len(line) - len(line.lstrip(" \t"))
        if drop_indent is not None:
            if not stripped:
                out.append("")  # a paragraph break stays one
                continue
            if indent > drop_indent:
                continue
            drop_indent = None
        if in_header:
            if _OPTION.match(line):
                continue
            in_header = False
        m = _DIRECTIVE.match(line) if stripped.startswith("..") else None
        if m is None:
            out.append(line)
            continue
        lead, name, arg = m.group(1), m.group(2), m.group(3)
        if name is None:
            # a target (.. _x:), substitution definition, footnote, or comment: gone,
            # with its indented continuation (comment blocks, footnote bodies)
            drop_indent = indent
            continue
        base = name.split(":")[-1].lower()
        arg = (arg or "").strip()
        if name.lower() in _DROP or base in _DROP:
            drop_indent = indent
            continue
        if base in _VERSIONS:
            parts = arg.split(None, 2 if base == "deprecated-removed" else 1)
            nums = parts[:2] if base == "deprecated-removed" else parts[:1]
            rest = parts[len(nums)] if len(parts) > len(nums) else ""
            if len(nums) < _VERSIONS[base].count("{}"):
                nums = nums + ["?"] * (_VERSIONS[base].count("{}") - len(nums))
            label = _VERSIONS[base].format(*nums)
            out.append(f"{lead}{label} {rest}".rstrip())
        elif base in _LABELS:
            label = _LABELS[base]
            out.append(f"{lead}{label} {arg}".strip(" ") if (label or arg) else "")
            if out[-1]:
                out[-1] = lead + out[-1].lstrip(" \t")
        elif base == "audit-event":
            parts = arg.split()
            if parts:
                args = ", ".join(a for a in (parts[1] if len(parts) > 1 else "").split(",") if a)
                out.append(f"{lead}Raises an auditing event {parts[0]}"
                           + (f" with arguments {args}." if args else "."))
            else:
                out.append("")
        elif base in _CODE:
            out.append("")  # the argument is a language name; the code body stays
        else:  # object directives (the signature) and unknown ones (their argument)
            out.append(f"{lead}{arg}" if arg else "")
        in_header = True
    return out


def _row(line: str) -> str:
    """A table row (``| a | b |``) → its non-empty cells joined with ``; ``."""
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    return "; ".join(c for c in cells if c)


def _md_heading(m: re.Match[str]) -> str:
    return m.group(1)


#: The fence line around code in cleaned text (:func:`clean`, :func:`split_code`).
FENCE = "```"
_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})")
_LITERAL_INTRO = re.compile(r"::[ \t]*$")
_CODE_DIRECTIVE = re.compile(r"^[ \t]*\.\.[ \t]+(?:code-block|sourcecode|code|doctest|testcode|"
                             r"testoutput)::")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _code_blocks(lines: list[str]) -> list[tuple[int, int, int]]:
    """``(start, end, fenced)`` line ranges of code in ``lines``: Markdown fences
    (``fenced`` 1: the fence lines are in the range), reST literal blocks (the indented
    block after a paragraph ending in ``::`` or a ``code-block``/``doctest``… directive
    and its options) and doctest paragraphs (from a ``>>>`` line to the next blank
    line). One pass, linear in the lines."""
    out: list[tuple[int, int, int]] = []
    i, n = 0, len(lines)
    para_start = True
    while i < n:
        line = lines[i]
        m = _FENCE_OPEN.match(line)
        if m and not para_start and not line.strip(" \t").strip(m.group(1)[0]):
            m = None  # a bare ``~~~`` under a line of text is a reST title's underline
        if m:
            mark = m.group(1)
            j = i + 1
            while j < n and not lines[j].strip(" \t").startswith(mark[0] * len(mark)):
                j += 1
            out.append((i, min(j + 1, n), 1))
            i = j + 1
            para_start = True
            continue
        stripped = line.strip(" \t")
        if para_start and stripped.startswith(">>>"):
            j = i
            while j < n and lines[j].strip(" \t"):
                j += 1
            out.append((i, j, 0))
            i = j
            para_start = True
            continue
        directive = bool(_CODE_DIRECTIVE.match(line))
        if stripped and (directive or (_LITERAL_INTRO.search(line)
                                       and not stripped.startswith(".."))):
            base = _indent(line)
            j = i + 1
            if directive:
                while j < n and lines[j].strip(" \t").startswith(":") and _indent(lines[j]) > base:
                    j += 1  # the directive's options
            k = j
            while k < n and not lines[k].strip(" \t"):
                k += 1
            if (k > j or directive) and k < n and _indent(lines[k]) > base:
                # the block runs while lines are indented as its first line (the chunk's
                # first line is trimmed, so the intro's own indentation may be unknown)
                inner = _indent(lines[k])
                end = k
                while end < n and (not lines[end].strip(" \t") or _indent(lines[end]) >= inner):
                    end += 1
                while end > k and not lines[end - 1].strip(" \t"):
                    end -= 1
                if end > k:
                    out.append((k, end, 0))
                    i = end
                    para_start = False
                    continue
        para_start = not stripped
        i += 1
    return out


def _code_text(lines: list[str]) -> str:
    """Code lines as shown: tabs expanded, the common indentation removed, trailing
    spaces and surrounding blank lines dropped."""
    import textwrap

    return textwrap.dedent("\n".join(x.expandtabs(4).rstrip() for x in lines)).strip("\n")


#: A list item's first line in cleaned text: a bullet (``-``, ``*``, ``+``, ``•``; reST
#: and Markdown ``*``/``+`` bullets become ``-`` in :func:`clean`, the HTML parser writes
#: ``- `` for ``<li>``) or a number (``1.``, ``2)``, reST ``#.``), then a space and text.
LIST_ITEM = re.compile(r"[ \t]*(?:[-*+•]|\d{1,3}[.)]|#\.)[ \t]+(?=\S)")


def is_list_item(line: str) -> bool:
    """True when ``line`` starts a list item (:data:`LIST_ITEM`)."""
    return LIST_ITEM.match(line) is not None


def item_body(piece: str) -> str:
    """``piece`` without a leading list bullet (a quoted sentence is shown behind the
    answer block's own bullet); ``piece`` itself when it is no list item."""
    m = LIST_ITEM.match(piece)
    return piece[m.end():] if m else piece


def blocks(text: str) -> list[tuple[str, str]]:
    """Preview or excerpt text (the envelope's) as ``[(kind, part)]`` for display:
    ``code`` (the parts :func:`split_code` finds, lines kept), ``item`` (a list item: a
    line starting with :data:`LIST_ITEM`, shown on a line of its own as code keeps its
    lines) and ``prose`` (the lines between, to be wrapped as one paragraph). Blank
    parts are left out."""
    out: list[tuple[str, str]] = []
    for is_code, part in split_code(text):
        if is_code:
            out.append(("code", part))
            continue
        prose: list[str] = []
        for line in part.split("\n"):
            if is_list_item(line):
                if "".join(prose).strip():
                    out.append(("prose", "\n".join(prose)))
                prose = []
                out.append(("item", line.strip()))
            else:
                prose.append(line)
        if "".join(prose).strip():
            out.append(("prose", "\n".join(prose)))
    return out


def split_code(text: str) -> list[tuple[bool, str]]:
    """Text made by :func:`clean` (or cut from it) as ``[(is_code, part)]`` in order:
    the parts between :data:`FENCE` lines are code (line breaks and indentation as in
    the source); an unclosed fence (a cut preview) runs to the end. Blank prose parts
    are left out."""
    parts: list[tuple[bool, str]] = []
    buf: list[str] = []
    code = False
    for line in text.split("\n"):
        if line.strip() == FENCE:
            if buf and "".join(buf).strip():
                parts.append((code, "\n".join(buf)))
            buf, code = [], not code
            continue
        buf.append(line)
    if buf and "".join(buf).strip():
        parts.append((code, "\n".join(buf)))
    return parts


@lru_cache(maxsize=4096)
def clean(text: str) -> str:
    """``text`` as plain readable text: reST, Markdown and HTML markup removed, code kept.

    Code — Markdown fenced blocks, reST literal blocks (after ``::`` or a
    ``code-block``/``doctest`` directive) and doctest paragraphs (``>>>``) — is kept
    verbatim (line breaks, indentation relative to the block, no markup removed inside)
    between :data:`FENCE` lines of its own, so previews and excerpts show it as the
    source does (issue 20 item 5) and :func:`split_code` finds it.

    Args:
        text: a chunk's text as stored (any markup, ``\\n`` newlines).

    Returns:
        The text without markup; paragraph breaks (blank lines) kept, runs of spaces
        collapsed outside code, words and their order unchanged except for dropped
        markup-only lines (housekeeping directives, link targets, comments, adornments,
        the source's own fence lines). Never raises. Cached (the same chunks answer many
        queries).
    """
    if not text:
        return ""
    lines = text.split("\n")
    blocks = (_code_blocks(lines) if "::" in text or ">>>" in text or "```" in text
              or "~~~" in text else [])
    if not blocks:
        return _clean_prose(text)
    out: list[str] = []
    pos = 0
    for start, end, fenced in blocks:
        if start > pos:
            out.append(_clean_prose("\n".join(lines[pos:start])))
        body = lines[start + fenced:end]
        if fenced and body and _FENCE_OPEN.match(body[-1]):
            body = body[:-1]  # the closing fence (an unclosed one runs to the end)
        code = _code_text(body)
        if code.strip():
            out.append(f"\n{FENCE}\n{code}\n{FENCE}\n")
        pos = end
    if pos < len(lines):
        out.append(_clean_prose("\n".join(lines[pos:])))
    return "\n".join(out)


def _clean_prose(text: str) -> str:
    """:func:`clean` of text without code blocks."""
    if not text:
        return ""
    text = _HTML_COMMENT.sub(" ", text)
    lines = [("" if _ADORNMENT.match(x) else x) for x in text.split("\n")]
    if any(x.lstrip(" \t").startswith("..") for x in lines):
        lines = _directives(lines)
    text = "\n".join(lines)
    if "```" in text or "~~~" in text:
        text = _MD_FENCE.sub("", text)
    if "]:" in text:
        text = _MD_REFDEF.sub("", text)
    if "#" in text:
        text = _MD_HEADING.sub(_md_heading, text)
    if "::" in text:
        text = _DC_ALONE.sub("", text)
        text = _DC_SPACED.sub("", text)
        text = _DC_END.sub(":", text)
    if "`" in text:
        text = _ROLE.sub(_role, text)
        link = "`_" in text
        if link:
            text = _LINK.sub(r"\1", text)
        text = _LITERAL.sub(r"\1", text)
        if link:
            text = _LINK_BARE.sub(r"\1", text)
        text = _INTERPRETED.sub(r"\1", text)
    if "]" in text:
        text = _MD_IMAGE.sub(r"\1", text)
        text = _MD_LINK.sub(r"\1", text)
        text = _MD_REFLINK.sub(r"\1", text)
        if "]_" in text:
            text = _FOOTNOTE.sub("", text)
    if ":" in text:
        text = _FIELD.sub(r"\1\2:", text)
    if "|" in text:
        text = _SUBST.sub(r"\1", text)
    if "<" in text:
        text = _MD_AUTOLINK.sub(r"\1", text)
        text = _HTML_TAG.sub(" ", text)
    if "*" in text:
        text = _STRONG.sub(r"\1", text)
        text = _EMPH.sub(r"\1", text)
        if "* " in text or "+ " in text:
            text = _MD_BULLET.sub(r"\1- ", text)
    if "_" in text:
        text = _USTRONG.sub(r"\1", text)
        text = _UEMPH.sub(r"\1", text)
    if ">" in text:
        text = _MD_QUOTE.sub(r"\1", text)
    if "\\" in text:
        text = _ESCAPE.sub(lambda m: "" if m.group(1) == " " else m.group(1), text)
    if "&" in text:
        text = _ENTITY.sub(lambda m: html.unescape(m.group(0)), text)
    if "|" in text:
        text = "\n".join(_row(x) if _TABLE_ROW.match(x) else x for x in text.split("\n"))
    if "---" in text:
        text = _DASHES.sub(" - ", text)
    text = _SPACES.sub(" ", text)
    return text


def cut(text: str, limit: int) -> str:
    """``text`` shortened to at most ``limit`` characters (the ellipsis included) at a
    sentence end when one falls in the second half of the room, else at a word boundary,
    with :data:`ELLIPSIS` appended; ``text`` itself when it fits.

    Never cuts inside a word: the kept part ends where a whitespace character followed
    in ``text``. Only a single "word" longer than the room (a URL, a long identifier)
    is cut inside it, at its last punctuation character when it has one.

    Args:
        text: the text (whitespace already collapsed, or not).
        limit: the largest length of the answer in characters (>= 1).

    Returns:
        The shortened text.
    """
    if len(text) <= limit:
        return text
    room = max(1, limit - len(ELLIPSIS))
    head = text[:room + 1]  # +1: a space right after the room is a boundary
    best = -1
    for m in re.finditer(r"[.!?;:。！？](?=\s)", head):
        if m.end() <= room:
            best = m.end()
    if best >= room // 2 and best + 1 <= room:
        return text[:best].rstrip() + " " + ELLIPSIS
    space = head.rfind(" ")
    for ws in ("\n", "\t"):
        space = max(space, head.rfind(ws))
    if space > 0 and text[:space].strip():
        return text[:space].rstrip() + ELLIPSIS
    for i in range(room, 0, -1):  # one long "word": cut next to a punctuation character
        if not text[i].isalnum() or not text[i - 1].isalnum():
            return text[:i] + ELLIPSIS
    return text[:room] + ELLIPSIS


# --- the quoted answer ----------------------------------------------------------------

_QUOTE_WORD = re.compile(r"[^\W_]+")
#: Two quotes are near-identical when this share of the shorter one's words are in
#: the longer one (and the shorter has at least this share of the longer's words).
NEAR_IDENTICAL = 0.75


def required_terms(matched: int) -> int:
    """How many key terms a quoted sentence must cover, given ``matched``: the number of
    the question's key terms the shown results cover (what the ranking matched). All of
    them up to two; from three on, two thirds rounded up (a long question's words are
    rarely all in one sentence, one of them alone is no answer)."""
    if matched <= 2:
        return matched
    return -(-2 * matched // 3)


def _near_identical(a: frozenset[str], la: int, b: frozenset[str], lb: int) -> bool:
    if min(la, lb) < NEAR_IDENTICAL * max(la, lb):
        return False
    small, big = (a, b) if len(a) <= len(b) else (b, a)
    return bool(small) and len(small & big) >= NEAR_IDENTICAL * len(small)


#: Fewest words a quote holds beyond the question's own: a sentence made of the
#: question's words (a heading such as "Parse command line arguments?") answers nothing.
MIN_OWN_WORDS = 3


def quotes(candidates: list[tuple[int, int, int, str, str, str]], matched: int, *,
           limit: int, query: str = "", per_result: int = 2) -> list[tuple[str, str, str]]:
    """The sentences the answer block quotes (issue 20 item 5).

    Args:
        candidates: ``(covered key terms, result rank, position, sentence, citation id,
            source)``, best first (the envelope's order).
        matched: key terms of the question the shown results cover.
        limit: most sentences quoted.
        query: the question (its words do not count toward :data:`MIN_OWN_WORDS`).
        per_result: most sentences quoted from one result.

    Returns:
        ``[(sentence, citation id, source)]``: each sentence covers at least
        :func:`required_terms` of ``matched`` key terms, is not itself a question (ends
        with ``?``), has :data:`MIN_OWN_WORDS` words beyond the question's, and none
        repeats an earlier one
        (the same sentence, or near-identical words: :data:`NEAR_IDENTICAL`); empty when
        nothing qualifies — the block is then left out, not filled with weaker quotes.
    """
    need = required_terms(matched)
    if need <= 0:
        return []
    asked = frozenset(_QUOTE_WORD.findall(query.lower()))
    out: list[tuple[str, str, str]] = []
    seen: list[tuple[frozenset[str], int]] = []
    per: dict[int, int] = {}
    for covered, rank, _pos, sentence, cid, source in candidates:
        if len(out) >= limit:
            break
        if covered < need or per.get(rank, 0) >= per_result:
            continue
        if sentence.startswith(FENCE):
            continue  # code is shown in previews and excerpts, not quoted as a sentence
        words = _QUOTE_WORD.findall(sentence.lower())
        if (sentence.rstrip().endswith(("?", "？"))
                or sum(w not in asked for w in words) < MIN_OWN_WORDS):
            continue
        key = (frozenset(words), len(words))
        if any(_near_identical(key[0], key[1], w, n) for w, n in seen):
            continue
        seen.append(key)
        per[rank] = per.get(rank, 0) + 1
        out.append((sentence, cid, source))
    return out
