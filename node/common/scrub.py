"""The scrub detectors: span-level screening of what a peer receives (issue 24 item 3;
specs/policy.md §9). Not :mod:`node.policy.redact`, which rewrites *logs*.

Pure code below the policy and the corpus (issue 29): the policy decides *which* kinds
are scrubbed for a (peer, source) and packages them in a :class:`node.corpus.lens.Lens`;
the corpus (a scrubbed view's index) and the answer service (the envelope's text) call
the detectors here. Nothing here imports the corpus or the policy.

Deterministic detectors, one per kind (:data:`KINDS`), each finding spans in a text:

* ``email`` — ``local@domain.tld`` (ASCII local part ``[A-Za-z0-9._%+-]``, a domain of
  dot-separated labels, a letter-only TLD of 2-24 characters).
* ``phone`` — numbers in international form (``+`` or ``00`` and a country code, spaces,
  dots, hyphens, parentheses between digits) and the North American form with its area
  code in parentheses (``(212) 555-0134``); a candidate's longest prefix that is a
  *valid* number for its country per Google's libphonenumber metadata (the
  ``phonenumberslite`` package) is the value.
  National forms of other countries (``020 7946 0958``) are not recognised.
* ``card`` — 13-19 digits with a major network's prefix and length (:func:`_card_network`),
  unseparated or grouped as cards print them (4-4-4-4, 4-4-4-4-3, 4-6-5, 4-6-4, one kind
  of separator: a space or a hyphen), passing the Luhn check (``python-stdnum``).
* ``iban`` — two letters, two check digits, 11-30 letters/digits (in groups of four or
  not), with its country's length and the ISO 13616 mod-97 check (``python-stdnum``).

For phone, card and IBAN, a "space" is any one whitespace character (a no-break space, a
line break of wrapped text), and a value followed by more words or digits (``… 00 BIC``,
a card's ``12/27``) is found as the longest valid prefix of what its pattern took
(:func:`_valid_prefix`; for IBANs :func:`_mod97_ends` finds the prefixes passing mod 97
in one pass; a phone candidate gets at most three libphonenumber parses).
* ``secret`` — PEM private-key blocks (``-----BEGIN … PRIVATE KEY-----`` to its END line,
  or to the end of the text when the chunk was cut inside it), and common API-key shapes:
  AWS access key ids, GitHub, GitLab, Slack, Stripe, Google and OpenAI-style keys, JWTs.

:func:`scrub` replaces each span by its typed placeholder (:data:`PLACEHOLDER`,
``[email]`` …) and returns how many of each kind it replaced — never the values. A
detector that raises makes :func:`scrub` raise :class:`ScrubFailed` (the caller refuses
that result: fail closed). The placeholders match no detector, so scrubbing twice
changes nothing.

Cost: every pattern is led by a literal or a narrow class (``re`` searches those at C
speed) and libphonenumber is only asked about candidates: about 0.04-0.06 ms per KB of
text (the Python docs, 2 shared cores). :func:`scrub_cached` keeps results, so a chunk
scrubbed when its view index was built costs an answer a dictionary lookup.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from node.common.errors import PolicyError
from node.common.kept import keep

#: The kinds `kith policy scrub` accepts, in display order.
KINDS: tuple[str, ...] = ("email", "phone", "card", "iban", "secret")
#: The placeholder that replaces a span of each kind.
PLACEHOLDER = {kind: f"[{kind}]" for kind in KINDS}


class ScrubFailed(Exception):
    """A detector raised: the text it was scanning must not leave (fail closed).

    Attributes:
        kind: the detector's kind.
    """

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def check_kinds(kinds: Iterable[str], where: str = "") -> tuple[str, ...]:
    """``kinds`` checked, deduplicated and in :data:`KINDS` order.

    Raises:
        PolicyError: ``scrub-bad-kind`` naming the first unknown kind (``where`` prefixes
            the message: the file and table).
    """
    kinds = list(kinds)
    for kind in kinds:
        if not isinstance(kind, str) or kind not in KINDS:
            raise PolicyError("scrub-bad-kind", f"{where}{str(kind)[:40]!r} is not a scrub kind "
                              f"(one of {', '.join(KINDS)})")
    return tuple(k for k in KINDS if k in kinds)


# --- detectors: each returns [(start, end)] ----------------------------------------------
# Speed (CPython's ``re``): a pattern led by a literal is searched for at C speed, one led
# by a look-behind or an alternation is tried at every character; so each pattern below
# starts with a literal or a narrow class, and the boundary on its left is checked in
# Python for the few candidates found.

_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


#: What separates the groups of a phone, card or IBAN number besides its own marks: any
#: one whitespace character — a space, a no-break space (HTML ``&nbsp;``, PDFs, word
#: processors; a preview shows it as a space) or the line break of hard-wrapped text.
_SPACE = re.compile(r"\s")


def _valid_prefix(raw: str, valid: Callable[[str], bool], separators: str) -> int:
    """The length of the longest prefix of the candidate ``raw`` that ``valid`` accepts
    and that ends where a group ends (``raw`` itself, or a cut just before one of
    ``separators`` or whitespace); 0 when none does. A candidate pattern is greedy, so
    it takes the words or numbers after a value too (``DE89 … 00 BIC``, ``+44 20 7946
    0958 2 times``, a card's ``12/27``): the value is the valid prefix."""
    for end in range(len(raw), 0, -1):
        if end < len(raw) and not (raw[end] in separators or raw[end].isspace()):
            continue
        if end < len(raw) and (raw[end - 1] in separators or raw[end - 1].isspace()):
            continue
        if valid(raw[:end]):
            return end
    return 0


def _free_left(text: str, at: int, also: str = "") -> bool:
    """True when the character before ``at`` is no word character (nor one of ``also``)."""
    return at == 0 or (text[at - 1] not in _WORD and text[at - 1] not in also)


_EMAIL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@"
                    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![A-Za-z0-9-])")


def _email(text: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    at = text.find("@")
    while at != -1:  # only a window around each "@" is matched
        lo = max(0, at - 65)
        m = _EMAIL.search(text, lo, at + 256)
        while m is not None and m.end() <= at:  # a match wholly before this "@"
            m = _EMAIL.search(text, m.end(), at + 256)
        if m is not None and m.start() <= at:
            start = m.start()
            if _free_left(text, start, "._%+-"):  # else a local part over 64 characters
                out.append((start, m.end()))
            at = text.find("@", m.end())
        else:
            at = text.find("@", at + 1)
    return out


#: international: + or 00, a country code, then digits with single separators
_PHONE_LEAD = re.compile(r"\+[1-9]|00[1-9]")
_PHONE_INTL = re.compile(r"(?:\+|00)[1-9]\d{0,2}(?:[\s.\-]?\(?\d{1,5}\)?){2,6}(?![\w])")
#: North American with the area code in parentheses: (212) 555-0134
_PHONE_NANP = re.compile(r"\(\d{3}\)\s?\d{3}[\s.\-]\d{4}(?![\w])")


@lru_cache(maxsize=1)
def _phonenumbers():  # type: ignore[no-untyped-def]
    import phonenumbers  # late: ~30 ms to import, only a scrubbed peer pays it

    return phonenumbers


def _phone_length(candidate: str) -> bool:
    """True when ``candidate`` holds 7-15 digits besides a ``00`` prefix: E.164 numbers
    hold at most 15, and none that is valid has fewer than 7 (no parse needed)."""
    digits = sum(c.isdigit() for c in candidate) - (2 if candidate.startswith("00") else 0)
    return 7 <= digits <= 15


def _valid_phone(candidate: str, region: str | None) -> bool:
    if not _phone_length(candidate):
        return False
    pn = _phonenumbers()
    candidate = _SPACE.sub(" ", candidate)
    if candidate.startswith("00"):
        candidate = "+" + candidate[2:]
    try:
        number = pn.parse(candidate, region)
    except pn.NumberParseException:
        return False
    return bool(pn.is_valid_number(number))


def _phone(text: str) -> list[tuple[int, int]]:
    out = []
    for lead in _PHONE_LEAD.finditer(text):
        at = lead.start()
        if not _free_left(text, at, "+"):
            continue
        m = _PHONE_INTL.match(text, at)
        if m is None or (out and at < out[-1][1]):
            continue
        parses = [0]

        def valid(candidate: str) -> bool:  # a candidate's three longest plausible prefixes
            if not _phone_length(candidate):
                return False
            parses[0] += 1
            return parses[0] <= 3 and _valid_phone(candidate, None)

        end = _valid_prefix(m.group(0), valid, ".-(")
        if end:
            out.append((at, at + end))
    if "(" in text:
        out += [m.span() for m in _PHONE_NANP.finditer(text)
                if _free_left(text, m.start(), ")") and _valid_phone(m.group(0), "US")]
    return out


_CARD = re.compile(r"[2-6]\d{3}(?:[\s\-]?\d){9,15}(?![\d])")
#: the separator before a card candidate's next group (:func:`_grouped_values`)
_CARD_REGROUP = re.compile(r"[\s\-](?=\d)")
_CARD_GROUPS = re.compile(r"\d{4}([ \-])\d{4}\1\d{4}\1\d{4}(?:\1\d{3})?|\d{4}([ \-])\d{6}\2\d{4,5}")


def _card_network(digits: str) -> bool:
    """True when ``digits`` has the prefix and length of a major card network's numbers:
    Visa 4 (13, 16, 19), Mastercard 51-55 and 2221-2720 (16), American Express 34/37 (15),
    Diners 300-305/36/38 (14), Discover 6011/644-649/65, JCB 3528-3589, UnionPay 62
    (16-19). Without it, one long number in a hundred thousand that passes Luhn would
    be taken for a card (measured on the Python docs: specs/policy.md §9.4)."""
    n, p2, p3, p4 = len(digits), int(digits[:2]), int(digits[:3]), int(digits[:4])
    if digits[0] == "4":
        return n in (13, 16, 19)
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16
    if p2 in (34, 37):
        return n == 15
    if p2 in (36, 38) or 300 <= p3 <= 305:
        return n == 14
    if p4 == 6011 or p2 in (62, 65) or 644 <= p3 <= 649 or 3528 <= p4 <= 3589:
        return 16 <= n <= 19
    return False


def _is_card(raw: str) -> bool:
    from stdnum import luhn

    spaced = _SPACE.sub(" ", raw)
    digits = spaced.replace(" ", "").replace("-", "")
    if not 13 <= len(digits) <= 19 or not _card_network(digits):
        return False
    if spaced != digits and not _CARD_GROUPS.fullmatch(spaced):
        return False  # separated, but not as cards print: 4-4-4-4(-3), 4-6-5, 4-6-4
    return bool(luhn.is_valid(digits))


def _grouped_values(pattern: re.Pattern[str], text: str, left_ok: Callable[[int], bool],
                    value_end: Callable[[str], int], regroup: re.Pattern[str]) -> list[tuple[int, int]]:
    """Spans of the values of a greedy grouped ``pattern`` (cards, IBANs) in ``text``.

    A candidate may hold more than the value on either side: the number or code just
    before it (``order 12 4111 …``, ``ref DE12 DE89 …``) and the one after it. So when no
    prefix of a candidate is a value (``value_end`` → 0), it is tried again from its next
    group (where ``regroup`` matches the separator before it; that start needs no ``left_ok``),
    and after a value the scan goes on right after it (a second value in the same
    candidate is found too)."""
    out: list[tuple[int, int]] = []
    pos = again = 0
    while (m := pattern.search(text, pos)) is not None:
        start = m.start()
        if start != again and not left_ok(start):
            pos = start + 1
            continue
        end = value_end(m.group(0))
        if end:
            out.append((start, start + end))
            pos = start + end
            continue
        nxt = regroup.search(text, start + 1, m.end())
        pos = again = nxt.start() + 1 if nxt is not None else m.end()
    return out


def _card(text: str) -> list[tuple[int, int]]:
    return _grouped_values(_CARD, text, lambda at: at == 0 or text[at - 1] not in "0123456789-",
                           lambda raw: _valid_prefix(raw, _is_card, "-"), _CARD_REGROUP)


def _mod97_ends(raw: str) -> list[int]:
    """The ends of the prefixes of an IBAN candidate ``raw`` (letters, digits, single
    whitespace) that end where a group ends and pass the ISO 13616 mod-97 check, longest
    first — in one pass over ``raw`` (the remainder of the part after the first four
    characters grows one character at a time), so a long candidate costs no more than
    a short one before ``stdnum``'s full check of the few that pass."""
    head = "".join(str(int(c, 36)) for c in raw[:4])
    shift, tail = 10 ** len(head), int(head)
    ends: list[int] = []
    r, n = 0, 4
    for i in range(4, len(raw)):
        c = raw[i]
        if c.isspace():
            continue
        r = (r * (100 if c.isalpha() else 10) + int(c, 36)) % 97
        n += 1
        if 15 <= n <= 34 and (i + 1 == len(raw) or raw[i + 1].isspace()) and (r * shift + tail) % 97 == 1:
            ends.append(i + 1)
    return ends[::-1]


_IBAN = re.compile(r"[A-Z]{2}\d{2}(?:\s?[A-Z0-9]){11,30}(?![A-Za-z0-9])")
_IBAN_REGROUP = re.compile(r"\s(?=[A-Z0-9])")


def _iban(text: str) -> list[tuple[int, int]]:
    if _IBAN.search(text) is None:  # no candidate: stdnum (~50 ms to import) is not loaded
        return []
    from stdnum import iban

    return _grouped_values(_IBAN, text, lambda at: _free_left(text, at),
                           lambda raw: next((e for e in _mod97_ends(raw) if iban.is_valid(_SPACE.sub("", raw[:e]))), 0),
                           _IBAN_REGROUP)


#: key shapes, each led by its literal prefix (its left boundary checked in Python)
_SECRET_SHAPES = tuple(re.compile(p) for p in (
    r"AKIA[0-9A-Z]{16}(?![0-9A-Za-z])", r"ASIA[0-9A-Z]{16}(?![0-9A-Za-z])",
    r"gh[pousr]_[A-Za-z0-9]{36,255}(?![A-Za-z0-9])",
    r"github_pat_[A-Za-z0-9_]{22,255}(?![A-Za-z0-9_])",
    r"glpat-[A-Za-z0-9_\-]{20,}",
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",
    r"sk_(?:live|test)_[A-Za-z0-9]{16,}(?![A-Za-z0-9])", r"rk_(?:live|test)_[A-Za-z0-9]{16,}(?![A-Za-z0-9])",
    r"AIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])",
    r"sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{32,}",
    r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
))
#: a block never crosses a NUL (:func:`scrub_many` joins texts with one)
_PEM = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
                  r"(?:[^\x00]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|[^\x00]*(?=\x00|\Z))")
#: the tail of a PEM block whose BEGIN line is in an earlier chunk
_PEM_TAIL = re.compile(r"\A[^\x00]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----")


def _secret(text: str) -> list[tuple[int, int]]:
    out = [m.span() for shape in _SECRET_SHAPES for m in shape.finditer(text) if _free_left(text, m.start())]
    if "PRIVATE KEY-----" in text:
        out += [m.span() for m in _PEM.finditer(text)]
        tail = _PEM_TAIL.match(text)
        if tail is not None and "-----BEGIN" not in tail.group(0):
            out.append(tail.span())
    return out


#: kind -> detector (tests replace one to check that a failure refuses the result)
DETECTORS: dict[str, Callable[[str], list[tuple[int, int]]]] = {
    "email": _email, "phone": _phone, "card": _card, "iban": _iban, "secret": _secret}


def find(text: str, kinds: Iterable[str]) -> list[tuple[int, int, str]]:
    """The spans of ``kinds`` in ``text``: ``[(start, end, kind)]`` sorted, without
    overlaps (of two overlapping spans the one starting first — then the longer — stays).

    Raises:
        ScrubFailed: a detector raised.
    """
    spans: list[tuple[int, int, str]] = []
    for kind in kinds:
        try:
            found = DETECTORS[kind](text)
        except Exception as exc:  # noqa: BLE001 - any detector failure fails closed
            raise ScrubFailed(kind) from exc
        spans += [(s, e, kind) for s, e in found if e > s]
    if len(spans) < 2:
        return spans
    spans.sort(key=lambda s: (s[0], -s[1]))
    out = [spans[0]]
    for span in spans[1:]:
        if span[0] >= out[-1][1]:
            out.append(span)
    return out


def scrub(text: str, kinds: Iterable[str], counts: dict[str, int] | None = None) -> str:
    """``text`` with every span of ``kinds`` replaced by its :data:`PLACEHOLDER`.

    Args:
        text: any text (a chunk, a heading, a source id).
        kinds: kinds from :data:`KINDS` (empty: ``text`` unchanged, nothing scanned).
        counts: when given, ``counts[kind]`` is increased by the spans replaced.

    Returns:
        The scrubbed text.

    Raises:
        ScrubFailed: a detector raised (``counts`` is then left unchanged).
    """
    if not kinds or not text:
        return text
    spans = find(text, kinds)
    if not spans:
        return text
    parts: list[str] = []
    at = 0
    for start, end, kind in spans:
        parts += [text[at:start], PLACEHOLDER[kind]]
        at = end
        if counts is not None:
            counts[kind] = counts.get(kind, 0) + 1
    parts.append(text[at:])
    return "".join(parts)


def scrub_many(texts: list[str], kinds: Iterable[str], counts: dict[str, int] | None = None) -> list[str]:
    """:func:`scrub` of each of ``texts`` (same order), in one pass over them joined by
    NUL — no detector's span crosses a NUL — so short fields (a source id, headings)
    pay the detectors' fixed cost once, not once each. Texts holding a NUL themselves are
    scrubbed one by one.

    Raises:
        ScrubFailed: a detector raised (``counts`` is then left unchanged).
    """
    kinds = tuple(kinds)
    if not kinds or not texts:
        return list(texts)
    if len(texts) == 1 or any("\x00" in t for t in texts):
        got: dict[str, int] = {}
        out = [scrub(t, kinds, got) for t in texts]
    else:
        got = {}
        joined = "\x00".join(texts)
        out = scrub_cached("\x00fields", joined, frozenset(kinds), got).split("\x00")
    if counts is not None:
        for kind, n in got.items():
            counts[kind] = counts.get(kind, 0) + n
    return out


def scrub_fields(source_id: str, heading: list[Any], metadata: dict[str, Any], kinds: frozenset[str],
                 counts: dict[str, int] | None = None) -> tuple[str, list[Any], dict[str, Any]]:
    """A hit's short fields scrubbed in one pass (:func:`scrub_many`): its source id, the
    strings of its heading path, and its metadata's string values and strings in list
    values (anything else is kept as is). The inputs are not changed.

    Returns:
        ``(source_id, heading path, metadata)``, new objects.

    Raises:
        ScrubFailed: a detector raised.
    """
    heading = list(heading)
    meta = dict(metadata)
    h_at = [i for i, h in enumerate(heading) if isinstance(h, str)]
    m_str = [k for k, v in meta.items() if isinstance(v, str)]
    m_list = {k: [i for i, x in enumerate(v) if isinstance(x, str)] for k, v in meta.items() if isinstance(v, list)}
    fields = ([source_id] + [heading[i] for i in h_at] + [meta[k] for k in m_str]
              + [meta[k][i] for k, at in m_list.items() for i in at])
    done = iter(scrub_many(fields, kinds, counts))
    source = next(done)
    for i in h_at:
        heading[i] = next(done)
    for k in m_str:
        meta[k] = next(done)
    for k, at in m_list.items():
        meta[k] = values = list(meta[k])
        for i in at:
            values[i] = next(done)
    return source, heading, meta


#: results kept by :func:`scrub_cached` (emptied when full); a text nothing was found in
#: costs one small entry, so a whole view's chunks fit
CACHE_ENTRIES = 200_000
_cache: dict[tuple[Any, int, frozenset[str]], tuple[str | None, tuple[tuple[str, int], ...]]] = {}


def scrub_cached(key: Any, text: str, kinds: frozenset[str], counts: dict[str, int] | None = None) -> str:
    """:func:`scrub` with its result kept under (``key``, the text's hash, ``kinds``):
    a view index scrubs every chunk once when it is built (``key`` = the chunk id), and
    an answer then finds the result of each hit's text instead of scanning it again.
    Kept: the scrubbed text only when it differs, and the counts; at most
    :data:`CACHE_ENTRIES` (the cache is emptied when full). A detector failure is never
    kept (it raises again next time).

    Raises:
        ScrubFailed: a detector raised.
    """
    if not kinds or not text:
        return text
    entry = (key, hash(text), kinds)
    got = _cache.get(entry)
    if got is None:
        found: dict[str, int] = {}
        out = scrub(text, kinds, found)
        got = keep(_cache, entry, (None if out == text else out, tuple(found.items())), CACHE_ENTRIES)
    if counts is not None:
        for kind, n in got[1]:
            counts[kind] = counts.get(kind, 0) + n
    return text if got[0] is None else got[0]


__all__ = ["CACHE_ENTRIES", "DETECTORS", "KINDS", "PLACEHOLDER", "ScrubFailed", "check_kinds", "find", "scrub",
           "scrub_cached", "scrub_fields", "scrub_many"]
