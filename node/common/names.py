"""Look-alike folding of names (DESIGN §10, specs/peers.md §3): when two display or
registry names count as "the same name". Shared by the peer registry and the community
server, so both sides fold names the same way.
"""

from __future__ import annotations

import unicodedata


#: Look-alikes of Latin letters (a small subset of Unicode confusables, UTS #39), applied
#: before and after casefolding by :func:`name_skeleton`: Cyrillic and Greek letters that
#: render like Latin ones, and the digit/letter pairs l 1 | and O 0.
_CONFUSABLES = str.maketrans({
    # Cyrillic lower case
    "а": "a", "в": "b", "е": "e", "ё": "e", "һ": "h", "і": "i", "ї": "i", "ј": "j", "к": "k",
    "ӏ": "l", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c", "т": "t", "у": "y", "х": "x",
    "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ь": "b", "ѡ": "w", "г": "r",
    # Cyrillic upper case (before casefolding they look like these Latin capitals)
    "А": "a", "В": "b", "Е": "e", "Ё": "e", "Н": "h", "І": "i", "Ї": "i", "Ј": "j", "К": "k",
    "М": "m", "О": "o", "Р": "p", "С": "c", "Т": "t", "У": "y", "Х": "x", "Ѕ": "s", "Ԁ": "d",
    "Ԛ": "q", "Ԝ": "w", "Ӏ": "l",
    # Greek
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "ω": "w", "ϲ": "c", "ϳ": "j",
    "Α": "a", "Β": "b", "Ε": "e", "Ζ": "z", "Η": "h", "Ι": "i", "Κ": "k", "Μ": "m", "Ν": "n",
    "Ο": "o", "Ρ": "p", "Τ": "t", "Υ": "y", "Χ": "x", "Ϲ": "c",
    # Latin-script look-alikes
    "1": "l", "|": "l", "ı": "i", "ɩ": "i", "ɡ": "g", "ɑ": "a", "O": "o", "0": "o",
})
#: Capital I (Latin, Greek, Cyrillic) also looks like a lower-case l: the second skeleton.
_CAPITAL_I_AS_L = str.maketrans({"I": "l", "Ι": "l", "І": "l"})


def name_skeleton(text: str, *, capital_i_as_l: bool = False) -> str:
    """The form in which two names count as "the same name" for claim checks (DESIGN §10,
    specs/peers.md §3): NFKD with combining marks dropped (``é`` → ``e``; full-width and
    compatibility forms fold too), format characters and white space dropped, common
    Cyrillic/Greek look-alikes mapped to the Latin letter they look like (``е`` U+0435 →
    ``e``), ``1``/``|`` → ``l`` and ``0`` → ``o``, then casefolded. With
    ``capital_i_as_l``, a capital ``I`` first becomes ``l`` (``aIice`` looks like
    ``alice``; without it, ``ALICE`` is ``alice``)."""
    decomposed = unicodedata.normalize("NFKD", text)
    kept = "".join(ch for ch in decomposed
                   if not unicodedata.combining(ch) and unicodedata.category(ch) != "Cf" and not ch.isspace())
    if capital_i_as_l:
        kept = kept.translate(_CAPITAL_I_AS_L)
    return kept.translate(_CONFUSABLES).casefold().translate(_CONFUSABLES)


def name_skeletons(text: str) -> frozenset[str]:
    """Both :func:`name_skeleton` forms of ``text`` (capital I read as ``i`` and as ``l``);
    two names look alike when their sets intersect. Empty forms are left out."""
    return frozenset(f for f in (name_skeleton(text), name_skeleton(text, capital_i_as_l=True)) if f)


#: Characters of an ``iroh:<ticket>`` holder kept when it is shown to a person (the scheme
#: and the ticket's first 24: ``endpoint`` and 16 of the key's base32).
HOLDER_SHOWN_CHARS = len("iroh:") + 24


def holder_text(url: str) -> str:
    """How a community server or mailbox holder is shown in text output and messages: an
    ``iroh:<ticket>`` (~90 characters, specs/sealed.md §7b) cut to
    :data:`HOLDER_SHOWN_CHARS` and ``…``; an ``http(s)://`` URL without any
    ``user:password@`` part, query or fragment (safe to print). JSON output keeps the whole
    value."""
    if url.startswith("iroh:"):
        return url[:HOLDER_SHOWN_CHARS] + "…" if len(url) > HOLDER_SHOWN_CHARS else url
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        netloc = parts.hostname or ""
        if ":" in netloc:
            netloc = f"[{netloc}]"
        if parts.port is not None:
            netloc = f"{netloc}:{parts.port}"
    except ValueError:  # a port out of range, a bad IPv6 literal: show no part of it
        return "(an address that does not parse)"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
