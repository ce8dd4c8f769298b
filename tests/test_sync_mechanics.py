"""How a full sync does its work fast (issue 10 item 6) without changing what it indexes.

Pure functions against their plain definitions on seeded random text; no mocks.
"""

from __future__ import annotations

import random

from node.corpus import search


def _plain_identifiers(text: str) -> list[str]:
    """:func:`search.identifiers` by its definition: one scan of the whole text."""
    out: list[str] = []
    for m in search._WHOLE.finditer(text):
        word = m.group(0).lower().strip(".,:-")
        if not word.strip("_") or len(word) > 64 or (
                "." in word and max(map(len, word.split("."))) < 2):
            continue
        out.append(word)
        if "." in word and not word[0].isdigit():
            parts = word.split(".")
            out.extend(".".join(parts[i:]) for i in range(1, len(parts) - 1))
    return out


def test_identifiers_equal_the_whole_text_scan_on_ascii_and_unicode_text() -> None:
    # every kind of whitespace str.split() knows, Unicode digits (Arabic-Indic, full-width),
    # the characters the pattern and its look-arounds care about
    alphabet = ("ab_Z.,:-eE019 x(\n\t)" "\u00a0\u2028\x1c\x1f\x85\u3000" "é٣１"
                "OsPathJoin")
    rnd = random.Random(106)
    samples = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 50)))
               for _ in range(20_000)]
    samples += ["", " ", "os.path.join", "x_", "a.b.", "٣,٣ and 3,3 and ١,١", "e.g. __init__",
                "see os.path.join(a, b).\u3000max_connections 1e-5 10:30"]
    for text in samples:
        assert search.identifiers(text) == _plain_identifiers(text), repr(text)


def test_a_name_repeated_in_many_chunks_counts_in_each() -> None:
    # the per-word cache must not drop repeats: term frequency of the ident field
    text = "call os.path.join then os.path.join again; __init__ __init__"
    assert search.identifiers(text) == ["os.path.join", "path.join", "os.path.join",
                                        "path.join", "__init__", "__init__"]
    assert search.identifiers(text) == search.identifiers(text)
