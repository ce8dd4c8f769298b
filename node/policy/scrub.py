"""The scrubbing gate: span-level screening of what a peer receives (issue 24 item 3;
specs/policy.md §9). Not :mod:`node.policy.redact`, which rewrites *logs*.

Deterministic detectors, one per kind (:data:`KINDS`), each finding spans in a text:

* ``email`` — ``local@domain.tld`` (ASCII local part ``[A-Za-z0-9._%+-]``, a domain of
  dot-separated labels, a letter-only TLD of 2-24 characters).
* ``phone`` — numbers in international form (``+`` or ``00`` and a country code, spaces,
  dots, hyphens, parentheses between digits) and the North American form with its area
  code in parentheses (``(212) 555-0134``); each candidate must be a *valid* number for
  its country per Google's libphonenumber metadata (the ``phonenumberslite`` package).
  National forms of other countries (``020 7946 0958``) are not recognised.
* ``card`` — 13-19 digits starting with a major network's digit (2-6), unseparated or
  grouped as cards print them (4-4-4-4, 4-4-4-4-3, 4-6-5, 4-6-4, one kind of separator:
  a space or a hyphen), passing the Luhn check (``python-stdnum``).
* ``iban`` — two letters, two check digits, 11-30 letters/digits (in groups of four or
  not), with its country's length and the ISO 13616 mod-97 check (``python-stdnum``).
* ``secret`` — PEM private-key blocks (``-----BEGIN … PRIVATE KEY-----`` to its END line,
  or to the end of the text when the chunk was cut inside it), and common API-key shapes:
  AWS access key ids, GitHub, GitLab, Slack, Stripe, Google and OpenAI-style keys, JWTs.

:func:`scrub` replaces each span by its typed placeholder (:data:`PLACEHOLDER`,
``[email]`` …) and returns how many of each kind it replaced — never the values. A
detector that raises makes :func:`scrub` raise :class:`ScrubFailed` (the caller refuses
that result: fail closed). The placeholders match no detector, so scrubbing twice
changes nothing.

Cost: every detector is led by a cheap test (``@`` present, a regex of literal prefixes,
a digit run) evaluated at C speed, so text without candidates costs one or two scans;
libphonenumber is only asked about candidates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache

from node.common.errors import PolicyError

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

_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@"
                    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![A-Za-z0-9-])")


def _email(text: str) -> list[tuple[int, int]]:
    if "@" not in text:
        return []
    return [m.span() for m in _EMAIL.finditer(text)]


#: international: + or 00, a country code, then digits with single separators
_PHONE_INTL = re.compile(r"(?<![\w+])(?:\+|\b00)[1-9]\d{0,2}(?:[ .\-]?\(?\d{1,5}\)?){2,6}(?![\w])")
#: North American with the area code in parentheses: (212) 555-0134
_PHONE_NANP = re.compile(r"(?<![\w)])\(\d{3}\) ?\d{3}[ .\-]\d{4}(?![\w])")


@lru_cache(maxsize=1)
def _phonenumbers():  # type: ignore[no-untyped-def]
    import phonenumbers  # late: ~30 ms to import, only a scrubbed peer pays it

    return phonenumbers


def _valid_phone(candidate: str, region: str | None) -> bool:
    pn = _phonenumbers()
    if candidate.startswith("00"):
        candidate = "+" + candidate[2:]
    try:
        number = pn.parse(candidate, region)
    except pn.NumberParseException:
        return False
    return bool(pn.is_valid_number(number))


def _phone(text: str) -> list[tuple[int, int]]:
    out = []
    if "+" in text or "00" in text:
        out += [m.span() for m in _PHONE_INTL.finditer(text) if _valid_phone(m.group(0), None)]
    if "(" in text:
        out += [m.span() for m in _PHONE_NANP.finditer(text) if _valid_phone(m.group(0), "US")]
    return out


_CARD = re.compile(r"(?<![\d-])[2-6]\d{3}(?:[ \-]?\d){9,15}(?![\d])")
_CARD_GROUPS = re.compile(r"\d{4}([ \-])\d{4}\1\d{4}\1\d{4}(?:\1\d{3})?|\d{4}([ \-])\d{6}\2\d{4,5}")


def _card(text: str) -> list[tuple[int, int]]:
    from stdnum import luhn

    out = []
    for m in _CARD.finditer(text):
        raw = m.group(0)
        digits = raw.replace(" ", "").replace("-", "")
        if not 13 <= len(digits) <= 19:
            continue
        if raw != digits and not _CARD_GROUPS.fullmatch(raw):
            continue  # separated, but not as cards print: 4-4-4-4(-3), 4-6-5, 4-6-4
        if luhn.is_valid(digits):
            out.append(m.span())
    return out


_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![A-Za-z0-9])")


def _iban(text: str) -> list[tuple[int, int]]:
    from stdnum import iban

    out = []
    for m in _IBAN.finditer(text):
        raw = m.group(0).rstrip()
        if iban.is_valid(raw.replace(" ", "")):
            out.append((m.start(), m.start() + len(raw)))
    return out


_SECRET_LEAD = re.compile(r"-----BEGIN|AKIA|ASIA|gh[pousr]_|github_pat_|glpat-|xox[abposr]-|[sr]k_(?:live|test)_"
                          r"|AIza|sk-|eyJ")
_SECRETS = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|.*\Z)"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{36,255}\b"
    r"|\bgithub_pat_[A-Za-z0-9_]{22,255}\b"
    r"|\bglpat-[A-Za-z0-9_\-]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}\b"
    r"|\bAIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"
    r"|\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{32,}"
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    re.DOTALL)
#: the tail of a PEM block whose BEGIN line is in an earlier chunk
_PEM_TAIL = re.compile(r"\A(?:.*?)-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----", re.DOTALL)


def _secret(text: str) -> list[tuple[int, int]]:
    out = []
    if _SECRET_LEAD.search(text) is not None:
        out = [m.span() for m in _SECRETS.finditer(text)]
    if "PRIVATE KEY-----" in text:
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


__all__ = ["DETECTORS", "KINDS", "PLACEHOLDER", "ScrubFailed", "check_kinds", "find", "scrub"]
