"""The ``schemaVersion`` 2 search envelope (the request is :mod:`node.answer.contract`).

DESIGN §8 / §11 and seed ``rag-external-agent-contract``. The same envelope answers
``kith search --json``, ``POST /search`` on the local API, the MCP tool and the
knowledge-query protocol's ``results`` message. Whatever the outcome, an envelope has
the same keys (:data:`ENVELOPE_KEYS`); ``specs/search-envelope.schema.json`` is its
JSON Schema.

No-oracle rule: an envelope with no results is built by :func:`empty_envelope` from the
reason and the normalized request ONLY — never from hits, candidate counts or timing —
so "nothing matched" and "matches existed but policy dropped them all" are
byte-identical. No envelope ever carries a timing. The local controller report's counts
(candidates, withheld, deduped…) are not copied into envelopes either.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import msgspec

from node.answer import readable
from node.answer.contract import DEDUPE_LEVELS, MAX_SERVER_BUDGET_MS
from node.corpus import search
from node.corpus.types import Hit
from node.common.errors import CorpusError
from node.common.kept import keep

SCHEMA_VERSION = 2
#: Longest ``textPreview`` / citation ``excerpt`` / synthesis sentence, in characters
#: (ellipses included): what the byte fit in :mod:`node.answer.service` counts on.
PREVIEW_CHARS = 280
EXCERPT_CHARS = 600
SYNTHESIS_CHARS = 400
MAX_SYNTHESIS_SENTENCES = 5

#: ``lifecycle`` values that count as authoritative evidence (quality flag).
AUTHORITATIVE_LIFECYCLES = frozenset({"current-state", "canonical", "authoritative"})

ENVELOPE_KEYS = (
    "schemaVersion", "available", "reason", "results", "queryPlan", "citationPack",
    "eventAggregation", "answerSynthesis", "quality", "retrievalController", "agentic",
    "externalAgentContract",
)
#: Reasons whose empty envelope still says ``available: true`` (the backend answered).
AVAILABLE_REASONS = frozenset({"no-verified-results"})
#: Reason codes this module knows; others (kebab-case) are accepted as given.
KNOWN_REASONS = (
    "no-verified-results", "index-unavailable", "index-syncing", "budget-exhausted", "invalid-request",
    "policy-denied", "pending-approval", "rate-limited", "timeout", "internal-error",
)

#: The client-side loop: at most this many searches inside one deadline (seconds).
MAX_SEARCH_CALLS = 3
CLIENT_DEADLINE_S = 90
_KEBAB = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*\Z")
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")

USAGE_PROMPT = (
    "Kith search is auxiliary, read-only memory from a peer's or your own indexed "
    "folders. Use evidence in this order: (1) the current conversation, user-provided "
    "material and local authoritative files; (2) the host agent runtime's own memory or "
    "history retrieval; (3) Kith search only when those are not enough, or when the user "
    "explicitly asks for it. Treat results as evidence, not authority; cite "
    "citationPack citation ids; when available is false or quality.needsMoreEvidence is "
    "true after at most three searches in one 90-second budget, report that Kith did not "
    "provide reliable evidence instead of inventing facts."
)


class SearchBudget:
    """The client side of the budget rule (seed rag-external-agent-contract): ONE
    monotonic deadline across every search of a follow-up loop, at most
    :data:`MAX_SEARCH_CALLS` attempts; ``remainingBudgetMs`` only goes down.

    Args:
        seconds: the whole loop's wall-clock budget (default 90 s).
        max_calls: attempts allowed (default 3).
        clock: a monotonic clock in seconds (tests inject one).

    Use :meth:`next_request` before each call: it returns the body with the current
    ``remainingBudgetMs`` or raises ``CorpusError("budget-exhausted")`` when the deadline
    passed or the calls are used up (the caller reports that, it does not reset).
    """

    def __init__(self, seconds: float = CLIENT_DEADLINE_S, *, max_calls: int = MAX_SEARCH_CALLS,
                 clock: Any = None) -> None:
        import time

        self._clock = clock or time.monotonic
        self.deadline = self._clock() + seconds
        self.max_calls = max_calls
        self.calls = 0
        self._last_ms: int | None = None

    def remaining_ms(self) -> int:
        """Milliseconds left (>= 0), never more than the previous answer."""
        ms = max(0, int((self.deadline - self._clock()) * 1000))
        if self._last_ms is not None:
            ms = min(ms, self._last_ms)
        self._last_ms = ms
        return ms

    def next_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` plus ``remainingBudgetMs`` for the next attempt (counts the attempt).

        Raises:
            CorpusError: ``budget-exhausted`` when no time or no attempt is left.
        """
        ms = self.remaining_ms()
        if ms <= 0 or self.calls >= self.max_calls:
            raise CorpusError("budget-exhausted",
                              "The search budget is used up (time or number of searches).")
        self.calls += 1
        return {**body, "remainingBudgetMs": ms}


# --- envelope parts ------------------------------------------------------------------

@lru_cache(maxsize=16384)
def _citation_id(chunk_id: str) -> str:
    return "kc-" + hashlib.sha256(f"cite\0{chunk_id}".encode()).hexdigest()[:12]


def _squash(text: str) -> str:
    return " ".join(text.split())


_PARAGRAPH = re.compile(r"\n[ \t]*\n|\n(?=[=\-~^\"'`#*+:.]{3,}[ \t]*(?:\n|$))|^[=\-~^\"'`#*+:.]{3,}[ \t]*$",
                        re.MULTILINE)


def _sentences(text: str) -> list[str]:
    """Sentences of a chunk: paragraphs (blank lines, heading adornments) then sentence
    ends; whitespace collapsed. A code block (:data:`readable.FENCE`) is one piece with
    its lines; a list item (:func:`readable.is_list_item`, with its continuation lines)
    is one piece, not split at its sentence ends.

    Works line by line (the same paragraphs as splitting with :data:`_PARAGRAPH`, whose
    matches fall exactly between two content lines separated by at least one blank
    (spaces/tabs only) or adornment line, and which always removes adornment lines); each
    paragraph is collapsed once and then split at "end mark + space" (the same sentences
    as splitting at "end mark + whitespace run" and collapsing each piece: ``str.split()``
    and ``\\s`` agree on what whitespace is).
    """
    out: list[str] = []
    group: list[str] = []
    item = False  # the open group is a list item: one piece, not split into sentences
    code: list[str] | None = None  # lines of an open code block (readable.FENCE)

    def flush() -> None:
        if not group:
            return
        if item:
            out.append(" ".join(" ".join(group).split()))
        else:
            _split_paragraph(" ".join(group), out)
        group.clear()

    for line in text.split("\n"):
        if code is not None:
            if line == readable.FENCE:
                out.append(f"{readable.FENCE}\n" + "\n".join(code) + f"\n{readable.FENCE}")
                code = None
            else:
                code.append(line)
            continue
        if line == readable.FENCE:  # code is one piece, its lines kept (issue 20 item 5)
            flush()
            code = []
            continue
        if not line.strip(" \t") or (line[0] in _ADORN_CHARS and _ADORN_LINE.fullmatch(line)):
            flush()
        elif readable.is_list_item(line):  # a list item is one piece of its own
            flush()
            item = True
            group.append(line)
        else:
            if not group:
                item = False
            group.append(line)
    flush()
    if code:
        out.append(f"{readable.FENCE}\n" + "\n".join(code) + f"\n{readable.FENCE}")
    return out


_ADORN_CHARS = frozenset("=-~^\"'`#*+:.")
_ADORN_LINE = re.compile(r"[=\-~^\"'`#*+:.]{3,}[ \t]*")
#: A sentence ends at an end mark and a space, unless a lower-case letter follows ("e.g.
#: the", "(see foo. bar)" go on) or the mark ends an initial or a short abbreviation
#: ("Fred L. Drake", "e.g. The", "vs. Python"). The mark comes first and the look-behinds
#: look back over it: the same matches as testing them before the mark, but the regex
#: engine scans for the mark's characters instead of trying both look-behinds at every
#: position (2.5x faster on chunk text).
_SENTENCE_END = re.compile(r"[.!?](?<![.\s][a-zA-Z][.!?])(?<!\b(?:vs|cf|Mr|Dr|St)[.!?]) (?![a-z])"
                           r"|[。！？] ")


def _split_paragraph(para: str, out: list[str]) -> None:
    """Append the sentences of one paragraph (collapsed first) to ``out``."""
    para = " ".join(para.split())
    start = 0
    for m in _SENTENCE_END.finditer(para):
        out.append(para[start:m.start() + 1])
        start = m.end()
    if start < len(para):
        out.append(para[start:])


_WORD = re.compile(r"[^\W_]+")
_NON_ASCII_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


@lru_cache(maxsize=65536)
def _word_stems(word: str) -> tuple[str, ...]:
    return tuple(search.text_stems(word))


def _stems(text: str) -> set[str]:
    """The analyzer's stems of ``text`` (word by word through a cache: the envelope
    analyzes every sentence of every result, and words repeat)."""
    if _NON_ASCII_CJK.search(text):
        return search.text_stems(text)
    out: set[str] = set()
    for w in _WORD.findall(text):
        out.update(_word_stems(w))
    return out


@lru_cache(maxsize=512)
def _query_keys(key_terms: tuple[str, ...]) -> tuple[list[tuple[str, set[str]]], KeyMatcher | None,
                                                     tuple[str, ...]]:
    """Per-query analysis reused by every envelope for a query with these key terms (the
    plan's, :attr:`node.corpus.retrieval.Plan.key_terms`; pure; cached — callers must not
    mutate it): ``(key stems, key matcher, matcher prefixes)``, the key stems being
    ``(key term, its stems)`` pairs for the coverage checks."""
    keys = [(t, _stems(t)) for t in key_terms]
    matcher = _key_matcher(keys)
    return keys, matcher, matcher.prefixes if matcher is not None else ()


def _key_prefixes(keys: list[tuple[str, set[str]]]) -> tuple[str, ...]:
    return tuple(sorted({st[:max(3, len(st) - 1)] for _, ss in keys for st in ss}))


#: The words a key matcher (:func:`_key_matcher`) can find: a run of letters and digits
#: starting at a word boundary (after ``_`` there is none).
_MATCHABLE = re.compile(r"\b[^\W_]+")


class KeyMatcher:
    """Finds, in lower-cased ASCII text, the words that may carry a key stem: each run of
    letters and digits that starts at a word boundary (:data:`_MATCHABLE`: not after an
    underscore) and starts with one of the query's stem ``prefixes``. Each found word is
    then checked with the analyzer, so the matcher only saves time, never changes results.

    The same words as the alternation regex ``\\b(?:prefix|…)[^\\W_]*`` it replaces, with
    one regex compiled once instead of one per query: compiling that alternation cost
    about 0.3 ms of every answer to a question not asked before.

    Args:
        prefixes: the stem prefixes (:func:`_key_prefixes`), not empty.
    """

    __slots__ = ("prefixes",)

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes

    def findall(self, text: str) -> list[str]:
        """The words of ``text`` that start with a prefix, in order (repeats kept)."""
        prefixes = self.prefixes
        return [w for w in _MATCHABLE.findall(text) if w.startswith(prefixes)]

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        """Their matches (``start()``, ``group()``), in order."""
        prefixes = self.prefixes
        return (m for m in _MATCHABLE.finditer(text) if m.group().startswith(prefixes))


def _key_matcher(keys: list[tuple[str, set[str]]]) -> KeyMatcher | None:
    """The :class:`KeyMatcher` of ``keys``' stem prefixes, or None when there are none."""
    prefixes = _key_prefixes(keys)
    if not prefixes:
        return None
    return KeyMatcher(prefixes)


def _text_coverage(text: str, keys: list[tuple[str, set[str]]],
                   matcher: KeyMatcher | None) -> list[str]:
    """Key terms whose stems all occur in ``text``."""
    if matcher is None:
        return []
    if not text.isascii():
        return _coverage(keys, _stems(text))
    stems: set[str] = set()
    for w in set(matcher.findall(text.lower())):
        stems.update(_word_stems(w))
    return _coverage(keys, stems)


def _coverage(keys: list[tuple[str, set[str]]], stems: set[str]) -> list[str]:
    return [t for t, s in keys if s and s <= stems]


def _preview(text: str, keys: list[tuple[str, set[str]]], limit: int,
             analyzed: list[tuple[str, int]] | None = None, heading: str = "") -> str:
    """The chunk from its best-covering sentence on, cut to ``limit`` characters.
    ``analyzed`` is ``[(sentence, covered key terms)]`` when already computed;
    ``heading`` is the chunk's heading path joined (:func:`_previews`)."""
    if analyzed is None:
        m = _key_matcher(keys)
        analyzed = [(x, len(_text_coverage(x, keys, m))) for x in _sentences(text)]
    return _previews(analyzed, (limit,), heading)[0]


_HEAD_WORD = re.compile(r"\w+")


def _heading_only(sentence: str, heading_words: frozenset[str]) -> bool:
    """True when ``sentence`` holds no word outside the heading path (``heading_words``,
    lower-cased): a heading line or a section number such as ``55.4.``, which the reader
    already sees as ``provenance.location.headingPath``."""
    words = _HEAD_WORD.findall(sentence.lower())
    return bool(heading_words) and all(w in heading_words for w in words)


def _previews(analyzed: list[tuple[str, int]], limits: tuple[int, ...], heading: str = "") -> list[str]:
    """:func:`_preview` for several limits from one ``analyzed`` list (one join).

    The preview starts at the first sentence covering the most key terms; heading lines
    at that start (sentences whose words are all in ``heading``, the joined heading path,
    shown next to the preview) are skipped, so the preview does not repeat the heading.
    A leading :data:`readable.ELLIPSIS` means text was left out before the shown part:
    it is written only when a skipped sentence is not a heading line (a chunk shown from
    its first prose sentence on has none), or when the chunk itself starts inside a
    sentence. A code block (between :data:`readable.FENCE` lines) is one piece, shown
    with its line breaks and indentation; a preview starting at one starts at its first
    line (the ellipsis then on a line of its own)."""
    if not analyzed:
        return ["" for _ in limits]
    words = frozenset(_HEAD_WORD.findall(heading.lower()))
    flags = tuple(_heading_only(x, words) for x, _ in analyzed)
    return _cut_from([x for x, _ in analyzed], flags, _start(analyzed, flags), limits)


def _start(analyzed: list[tuple[str, int]], heading_only: tuple[bool, ...]) -> int:
    """Where a preview starts (:func:`_previews`): the first sentence covering the most
    key terms, past the heading lines there (``heading_only``: one flag per sentence,
    :func:`_heading_only`). ``analyzed`` is non-empty."""
    best = 0
    for i in range(1, len(analyzed)):  # first sentence with the most covered key terms
        if analyzed[i][1] > analyzed[best][1]:
            best = i
    while best + 1 < len(analyzed) and heading_only[best]:
        best += 1
    return best


def _cut_from(sentences: Any, heading_only: tuple[bool, ...], best: int,
              limits: tuple[int, ...]) -> list[str]:
    """The previews of ``sentences`` shown from sentence ``best`` on, one per limit
    (:func:`_previews`; query-independent: a chunk's previews from each start are parts
    of it, :class:`ChunkParts`)."""
    # text left out before the start, or a chunk that starts mid-sentence (its first
    # piece begins with a lower-case letter): the reader is told with a leading ellipsis
    cut_before = (not all(heading_only[:best])
                  or (best == 0 and sentences[0][:1].islower()))
    size = max(limits) + 1
    parts: list[str] = []
    for x in sentences[best:]:  # only what the longest cut can show (+1: cut sees the overflow)
        parts.append(x)
        size -= len(x) + 3
        if size < 0:
            break
    whole = _join(parts)
    out = []
    # the leading ellipsis counts toward the limit; before code it is a line of its own
    lead = readable.ELLIPSIS + ("\n" if whole.startswith(readable.FENCE)
                                or readable.is_list_item(whole) else "")
    for limit in limits:
        if cut_before:
            out.append(lead + readable.cut(whole, limit - len(lead)))
        else:
            out.append(readable.cut(whole, limit))
    return out


def _whole_sentence(sent: str) -> bool:
    """A complete prose sentence: starts with a capital, digit or quote, ends with an end
    mark and fits :data:`SYNTHESIS_CHARS` (so the synthesis shows it uncut)."""
    return (len(sent) <= SYNTHESIS_CHARS and sent[-1:] in ".!?。！？"
            and (sent[:1].isupper() or sent[:1].isdigit() or sent[:1] in "\"'(“"))


def _join(parts: list[str]) -> str:
    """Sentences joined for reading: a space after a sentence end, " - " after a piece
    that ends without one (a heading, a signature), a line break before and after a code
    block (a piece between :data:`readable.FENCE` lines) and a list item (one item per
    line, :func:`readable.is_list_item`)."""
    out: list[str] = []
    for i, x in enumerate(parts):
        if i:
            if (x.startswith(readable.FENCE) or parts[i - 1].endswith(readable.FENCE)
                    or readable.is_list_item(x) or readable.is_list_item(parts[i - 1])):
                out.append("\n")
            else:
                out.append(" " if parts[i - 1][-1:] in _SENTENCE_MARKS else " - ")
        out.append(x)
    return "".join(out)


#: Characters after which the next sentence follows with a plain space.
_SENTENCE_MARKS = frozenset(".!?:;…,。！？")


@lru_cache(maxsize=4096)
def _split_text(text: str) -> tuple[tuple[str, ...], str, tuple[int, ...],
                                    tuple[tuple[str, int], ...]]:
    """The query-independent part of a result's analysis, once per chunk text (cached
    like :func:`node.answer.readable.clean`: the same chunks answer many queries):
    ``(sentences, the sentences joined by "\\n" and lower-cased, each sentence's start
    offset in that string, [(sentence, 0)] for each sentence)``. A ``\\n`` holds no word character, so a word match in the
    joined string never spans two sentences and finds exactly the words a match in each
    sentence would. Callers must not mutate the tuples."""
    sentences = tuple(_sentences(text))
    starts: list[int] = []
    at = 0
    for x in sentences:
        starts.append(at)
        at += len(x) + 1
    return (sentences, "\n".join(sentences).lower(), tuple(starts),
            tuple((x, 0) for x in sentences))


def _analyze_hit(parts: ChunkParts, keys: list[tuple[str, set[str]]],
                 matcher: KeyMatcher | None, prefixes: tuple[str, ...],
                 key_union: frozenset[str]) -> tuple[list[str], list[tuple[str, int]]]:
    """Analyze one result for a query: ``(key terms covered by text + heading,
    [(sentence, covered key terms, 0 under 20 characters)])``.

    The key matcher's answers (:func:`_key_matcher`: a word counts when it starts with
    one of the query's stem ``prefixes``; its stems through the analyzer). Once a chunk's
    parts have been analyzed for :data:`STEMS_AFTER` answers they are read from its
    parts instead of matching its text again: for ASCII text and heading,
    :attr:`ChunkParts.stems` maps each stem of each sentence to the words that carry it
    (the words the matcher can find: runs of letters and digits starting at a word
    boundary), so a query looks up only its own key stems (``key_union``) and credits
    one when a word carrying it starts with a prefix — the stems the matcher's words
    give, key stems among them. Non-ASCII text takes the general path, unchanged.
    """
    zeros = parts.zeros
    if matcher is None:
        return [], list(zeros)
    if not parts.ascii:
        return _analyze_general(parts.text, parts.heading, parts.sentences, keys, matcher)
    stems = parts.stems
    if stems is None:
        parts.shown += 1
        if parts.shown < STEMS_AFTER:
            return _analyze_matched(parts, keys, matcher, prefixes)
        parts.make_stems()
        stems = parts.stems
        assert stems is not None
    whole = _credited(parts.all_stems, key_union, prefixes)
    if not whole:
        return [], list(zeros)
    analyzed = list(zeros)  # a sentence without a key word covers nothing
    sentences = parts.sentences
    for i, own in enumerate(stems):
        if whole.isdisjoint(own):  # most sentences: no credited key stem at all
            continue
        x = sentences[i]
        if len(x) >= 20:
            found = _credited(own, whole, prefixes)
            if found:
                analyzed[i] = (x, len(_coverage(keys, found)))
    return _coverage(keys, whole), analyzed


def _analyze_matched(parts: ChunkParts, keys: list[tuple[str, set[str]]],
                     matcher: KeyMatcher, prefixes: tuple[str, ...],
                     ) -> tuple[list[str], list[tuple[str, int]]]:
    """:func:`_analyze_hit` by running the key matcher once over the joined sentences
    (ASCII text and heading; a chunk whose stems are not made yet): the whole text's
    words are exactly its sentences' words (sentences split only at whitespace and at
    adornment lines, which hold no word character), so the whole coverage is the union
    of the sentences' stems; each match is credited to the sentence it falls in."""
    low, starts, sentences = parts.low, parts.starts, parts.sentences
    head = parts.heading.lower()
    if not any(p in low for p in prefixes) and not any(p in head for p in prefixes):
        return [], list(parts.zeros)
    words: dict[int, set[str]] = {}
    for m in matcher.finditer(low):
        words.setdefault(bisect_right(starts, m.start()) - 1, set()).add(m.group())
    union: set[str] = set()
    analyzed = list(parts.zeros)  # a sentence without a key word covers nothing
    for i, found in words.items():
        stems: set[str] = set()
        for w in found:
            stems.update(_word_stems(w))
        union |= stems
        x = sentences[i]
        if len(x) >= 20:
            analyzed[i] = (x, len(_coverage(keys, stems)))
    for w in set(matcher.findall(head)):
        union.update(_word_stems(w))
    return _coverage(keys, union), analyzed


def _credited(words_of: dict[str, tuple[str, ...]], key_union: frozenset[str],
              prefixes: tuple[str, ...]) -> set[str]:
    """The key stems of ``key_union`` that a word of ``words_of`` (stem -> words carrying
    it) starting with one of ``prefixes`` carries. Plain loops, no generator: called for
    every sentence of every result holding a key stem (~55 times an answer), the
    comprehension with ``any()`` cost ~0.2 ms an answer, this ~0.1 ms."""
    out: set[str] = set()
    for st in key_union:
        words = words_of.get(st)
        if words is not None:
            for w in words:
                if w.startswith(prefixes):
                    out.add(st)
                    break
    return out


def _analyze_general(text: str, heading: str, sentences: tuple[str, ...],
                     keys: list[tuple[str, set[str]]], matcher: KeyMatcher,
                     ) -> tuple[list[str], list[tuple[str, int]]]:
    """:func:`_analyze_hit` for text or a heading with non-ASCII characters: each
    sentence analyzed on its own (the analyzer's stems for a non-ASCII sentence)."""
    analyzed: list[tuple[str, int]] = []
    for x in sentences:
        if x.isascii():
            stems: set[str] = set()
            for w in set(matcher.findall(x.lower())):
                stems.update(_word_stems(w))
        else:
            stems = _stems(x)
        analyzed.append((x, len(_coverage(keys, stems)) if len(x) >= 20 else 0))
    return _text_coverage(text + " " + heading, keys, matcher), analyzed


#: Chunk parts kept (:func:`chunk_parts`); the table is emptied when full. Measured on
#: python-docs chunks (812 characters on average): about 15 KB each with their stems,
#: so at most about 30 MB.
PARTS_KEPT = 2048
#: A chunk's word stems (:attr:`ChunkParts.stems`) are made when its parts are analyzed
#: for this many answers: making them costs about what the key matcher costs over the
#: text for two queries, so a chunk shown once never pays for them.
STEMS_AFTER = 2


class ChunkParts:
    """What a result needs of its chunk that no query changes, made once per chunk and
    reused by every envelope that shows it (issue 44 item 4; specs/corpus.md "Envelopes
    from parts"): the readable text, its sentences (:func:`_split_text`), which of them
    are heading lines, the ``dedupeKey``, and the preview and excerpt from each start
    sentence once one was shown (:meth:`previews`). The per-query numbers — key-term
    coverage, which sentence a preview starts at, scores — are not parts.

    Parts are keyed by the very values they are made of (:func:`chunk_parts`: the text
    and the heading path as the envelope receives them, after the lens's scrub), never
    by a chunk id alone: a peer whose lens scrubs a value gets the parts of the scrubbed
    text and heading, and the owner's parts of the same chunk are another entry. Treat
    as read-only."""

    __slots__ = ("text", "heading", "sentences", "low", "starts", "zeros", "heading_only", "ascii",
                 "shown", "stems", "all_stems", "dedupe_key", "whole", "_cuts", "analyses")

    def __init__(self, raw: str, heading: str) -> None:
        self.text = text = readable.clean(raw)
        self.heading = heading
        self.sentences, self.low, self.starts, self.zeros = _split_text(text)
        words = frozenset(_HEAD_WORD.findall(heading.lower()))
        self.heading_only = tuple(_heading_only(x, words) for x in self.sentences)
        #: per sentence, whether it is a whole sentence (:func:`_whole_sentence`: the
        #: synthesis prefers those)
        self.whole = tuple(_whole_sentence(x) for x in self.sentences)
        self.ascii = text.isascii() and heading.isascii()
        #: answers that analyzed the chunk before its stems were made (:data:`STEMS_AFTER`)
        self.shown = 0
        #: per sentence, ``{stem: the words carrying it}`` of the words a key matcher can
        #: find (ASCII text and heading), made by :meth:`make_stems`; None until then.
        #: ``all_stems``: the same for the whole text and the heading.
        self.stems: tuple[dict[str, tuple[str, ...]], ...] | None = None
        self.all_stems: dict[str, tuple[str, ...]] = {}
        self.dedupe_key = hashlib.sha256(_squash(raw).encode()).hexdigest()[:16]
        self._cuts: dict[int, tuple[str, str]] = {}
        #: :func:`_analyze_hit`'s answer per query's key terms (at most
        #: :data:`ANALYSES_KEPT`, then emptied): a pure function of the parts and the keys
        self.analyses: dict[tuple[str, ...], tuple[list[str], list[tuple[str, int]]]] = {}

    def make_stems(self) -> None:
        """Make :attr:`stems` (ASCII text and heading only; :attr:`all_stems` first, so a
        reader that sees :attr:`stems` set sees both)."""
        self.all_stems = _words_by_stem("\n".join((*self.sentences, self.heading)).lower())
        self.stems = tuple(_words_by_stem(x.lower()) for x in self.sentences)

    def previews(self, analyzed: list[tuple[str, int]]) -> tuple[str, str]:
        """``(textPreview, excerpt)`` for this query's ``analyzed`` sentences (the
        chunk's own, with the key terms each covers: :func:`_analyze_hit`): cut once per
        start sentence, the same strings :func:`_previews` makes."""
        if not analyzed:
            return "", ""
        best = _start(analyzed, self.heading_only)
        cut = self._cuts.get(best)
        if cut is None:
            preview, excerpt = _cut_from(self.sentences, self.heading_only, best,
                                         (PREVIEW_CHARS, EXCERPT_CHARS))
            cut = self._cuts[best] = (preview, excerpt)
        return cut


_PARTS: dict[tuple[str, str], ChunkParts] = {}
#: Queries (by key terms) whose analysis of one chunk its parts keep (0: none).
ANALYSES_KEPT = 16


def _words_by_stem(low: str) -> dict[str, tuple[str, ...]]:
    """``{stem: words}`` of the words of ``low`` (lower-cased ASCII) a key matcher can
    find, each through the analyzer (:func:`_word_stems`)."""
    out: dict[str, list[str]] = {}
    for w in set(_MATCHABLE.findall(low)):
        for st in _word_stems(w):
            out.setdefault(st, []).append(w)
    return {st: tuple(ws) for st, ws in out.items()}


def chunk_parts(text: str, heading: str) -> ChunkParts:
    """The :class:`ChunkParts` of a result whose chunk text is ``text`` (as stored, or as
    scrubbed for the receiver) under the joined heading path ``heading`` (likewise):
    made on first use, then kept (at most :data:`PARTS_KEPT`; thread-safe: two threads
    may make the same parts, either is kept)."""
    key = (text, heading)
    parts = _PARTS.get(key)
    if parts is None:
        parts = keep(_PARTS, key, ChunkParts(text, heading), PARTS_KEPT)
    return parts


def _plan(request: dict[str, Any], plan: Any = None) -> Any:
    """The query plan of ``request``: ``plan`` when the caller has it (the search made it,
    :func:`node.corpus.retrieval.make_plan`), else made (cached) here."""
    if plan is not None:
        return plan
    from node.corpus import retrieval

    return retrieval.make_plan(request["query"])


def _interpretation(plan: Any) -> str:
    parts = ["keywords"] if plan.stems else ["stopwords-only"]
    if plan.exact_units:
        parts.append("exact-entities")
    if plan.expansions:
        parts.append("expanded")
    return "+".join(parts)


def _query_plan(request: dict[str, Any] | None, plan: Any = None) -> dict[str, Any]:
    """``queryPlan``: how the server read the request (depends on the request only)."""
    if request is None:
        return {"query": None, "topK": None, "filters": {}, "dedupe": None, "keyTerms": [],
                "analyzedTerms": [], "exactUnits": [], "expansions": [], "stages": [],
                "subqueries": [], "interpretation": "invalid-request"}
    plan = _plan(request, plan)
    return {
        "query": request["query"],
        "topK": request["topK"],
        "filters": request.get("filters") or {},
        "dedupe": request.get("dedupe", "chunk"),
        "keyTerms": plan.key_terms,
        "analyzedTerms": plan.stems,
        "exactUnits": [" ".join(u) for u in plan.exact_units],
        "expansions": plan.expansions,
        "stages": plan.passes,
        "subqueries": plan.subqueries(),
        "interpretation": _interpretation(plan),
    }


_PASS_STATUSES = ("ran", "skipped", "not-run")


def _controller(request: dict[str, Any] | None, reason: str | None,
                controller: dict[str, Any] | None, returned: int, plan: Any = None) -> dict[str, Any]:
    """``retrievalController``: passes run and fused. Copies only pass names/statuses/skip
    reasons, fusion and the early-stop flag — never a count taken before the gate."""
    from node.corpus import retrieval

    level = (request or {}).get("dedupe", "chunk")
    planned = _plan(request, plan).passes if request else []
    ran = (controller or {}).get("fusion") or {}
    tier = next((p.get("tier") for p in (controller or {}).get("passes", [])
                 if p.get("name") == "dense" and p.get("status") == "ran"), None)
    base = {"mode": "bounded-multi-pass",
            "fusion": retrieval.fusion_report(planned, tier if isinstance(tier, str) else None),
            "dedupe": {"level": level, "maxPerDocument": DEDUPE_LEVELS.get(level, 2)}}
    ran_with = ran.get("weights") or {}
    if controller is not None:
        passes = []
        for p in controller.get("passes", []):
            status = str(p.get("status"))
            entry = {"name": str(p.get("name")),
                     "status": status if status in _PASS_STATUSES else "ran"}
            if p.get("reason") and _KEBAB.match(str(p["reason"])):
                entry["reason"] = str(p["reason"])
            passes.append(entry)
            if entry["name"] not in base["fusion"]["weights"]:
                w = ran_with.get(entry["name"])
                base["fusion"]["weights"][entry["name"]] = (
                    float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0
                    else retrieval.pass_weight(entry["name"]))
                if "normalisation" in base["fusion"]:
                    base["fusion"]["normalisation"][entry["name"]] = \
                        retrieval.NORMALISATION.get(entry["name"], "max")
        md = controller.get("maxPerDocument")
        if isinstance(md, int) and not isinstance(md, bool) and md >= 1:
            base["dedupe"]["maxPerDocument"] = md
        stop = controller.get("stopReason")
        return {**base, "passes": passes, "passesRun": sum(p["status"] == "ran" for p in passes),
                "fusedResults": returned, "earlyStop": bool(controller.get("earlyStop")),
                "stopReason": str(stop) if controller.get("earlyStop") and stop else None}
    status = "ran" if reason == "no-verified-results" else "not-run"
    if reason == "budget-exhausted":
        status = "skipped"
    passes = [{"name": p, "status": status} for p in planned]
    if status == "skipped":
        for p in passes:
            p["reason"] = "budget-exhausted"
    return {**base, "passes": passes, "passesRun": sum(p["status"] == "ran" for p in passes),
            "fusedResults": 0,
            "earlyStop": reason == "budget-exhausted",
            "stopReason": "budget-exhausted" if reason == "budget-exhausted" else None}


#: The local API's routes, all read-only but ``POST /outbox``, its one write (it keeps a
#: question in this node's own outbox; specs/outbox.md) (node/local/api.py serves exactly these;
#: ``allowedOperations`` below lists them): method -> paths.
API_ROUTES: dict[str, tuple[str, ...]] = {"GET": ("/health", "/stats", "/contract", "/openapi.json", "/outbox"),
                                          "POST": ("/search", "/verify", "/outbox")}


def _external_contract() -> dict[str, Any]:
    return {
        "name": "kith-read-only-search",
        "schemaVersion": SCHEMA_VERSION,
        "readOnly": True,
        "usagePrompt": USAGE_PROMPT,
        "recallPriority": ["conversation-and-local-files", "agent-runtime-memory", "kith-search"],
        "allowedOperations": [f"{m} {p}" for m, paths in API_ROUTES.items() for p in paths],
        "citeWith": "citationPack.citations[].citationId",
        "refusedOperations": ["POST /index", "POST /sync", "PUT /settings", "POST /memory",
                              "POST /server/stop", "DELETE *", "any method but GET, except "
                              + " and ".join(f"POST {p}" for p in API_ROUTES["POST"])],
        "maxSearchCalls": MAX_SEARCH_CALLS,
        "clientDeadlineSeconds": CLIENT_DEADLINE_S,
        "serverBudgetCapSeconds": MAX_SERVER_BUDGET_MS // 1000,
        "budgetRule": "one monotonic client deadline across retries; remainingBudgetMs only "
                      "goes down; 0 answers budget-exhausted without searching",
    }


def _agentic(status: str, recommendations: list[str]) -> dict[str, Any]:
    return {
        "readOnly": True,
        "evidenceStatus": status,
        "followUpOptions": ["exact-pass", "rewrite-pass", "filtered-pass"],
        "recommendedNext": recommendations[0] if recommendations else None,
        "maxSearchCalls": 3,
        "mutations": [],
    }


def empty_envelope(reason: str, request: dict[str, Any] | None = None, *,
                   plan: Any = None) -> dict[str, Any]:
    """An envelope with no results; depends ONLY on ``reason`` and ``request``.

    Args:
        reason: a kebab-case reason code: ``no-verified-results`` (``available`` stays
            true: the search ran and nothing may be shown), or ``index-unavailable``,
            ``budget-exhausted``, ``invalid-request``, ``policy-denied``,
            ``pending-approval``, ``rate-limited``, ``timeout``, ``internal-error``…
            (``available`` false).
        request: the normalized request (from :func:`node.answer.contract.validate`), or None
            when there is none (e.g. ``invalid-request``).
        plan: the request's query plan when the caller already has it
            (:func:`node.corpus.retrieval.make_plan`; it depends on the query only).

    Returns:
        A dict with exactly :data:`ENVELOPE_KEYS`, stable defaults and no timing.

    Raises:
        ValueError: if ``reason`` is not kebab-case (a programming error).
    """
    if not isinstance(reason, str) or not _KEBAB.match(reason):
        raise ValueError("reason must be a kebab-case code")
    available = reason in AVAILABLE_REASONS
    evidence = "no-evidence" if available else reason
    recs = ["report-no-evidence"] if available else ["report-unavailable"]
    keys = list(_plan(request, plan).key_terms) if request else []
    return {
        "schemaVersion": SCHEMA_VERSION,
        "available": available,
        "reason": reason,
        "results": [],
        "queryPlan": _query_plan(request, plan),
        "citationPack": {"citations": [], "count": 0},
        "eventAggregation": {"method": "by-source", "groups": [], "groupCount": 0},
        "answerSynthesis": {"mode": "extractive", "status": evidence, "sentences": [],
                            "note": "No evidence to summarize."},
        "quality": {
            "status": "none" if available else "unavailable",
            "keyTermCoverage": {"terms": keys, "covered": [], "missing": keys,
                                "ratio": 0.0, "topResultRatio": 0.0},
            "needsMoreEvidence": True,
            "flags": {"metaDiscussionTop": False, "hasNonMetaExactEvidence": False,
                      "hasAuthoritativeEvidence": False, "exactPassMatched": False},
            "recommendations": recs,
        },
        "retrievalController": _controller(request, reason, None, 0, plan),
        "agentic": _agentic(evidence, recs),
        "externalAgentContract": _external_contract(),
    }


_encode = msgspec.json.Encoder().encode


def result_sizes(envelope: dict[str, Any]) -> list[int]:
    """Bytes each result adds to the encoded envelope (compact JSON, as the wire frames
    it): its ``results`` entry, its ``citationPack`` entry, the commas between them and its
    citation id in its ``eventAggregation`` group. Its synthesis sentences are not
    counted (a rebuild without it may pick other results' sentences instead), so the sum
    is what dropping results saves at least in the common case; the caller measures the
    rebuilt envelope.

    Args:
        envelope: an envelope from :func:`build_envelope`.

    Returns:
        One size per result, in result order (``[]`` for an empty envelope).
    """
    cites = envelope["citationPack"]["citations"]
    return [len(_encode(res)) + len(_encode(cit)) + 2 + len(res["provenance"]["citationId"]) + 3
            for res, cit in zip(envelope["results"], cites)]


def fit_to(limit: int, envelope: dict[str, Any], request: dict[str, Any], hits: list[Hit],
           controller: dict[str, Any] | None, *, plan: Any = None,
           syncing: bool = False) -> dict[str, Any] | None:
    """``envelope`` (built from ``hits``) cut to ``limit`` encoded bytes: the
    lowest-ranked results are dropped; None when not even one result fits (a peer's
    ``max_message_bytes``, :mod:`node.answer.service`).

    One encode measures the envelope; when it is too large, each result's own bytes
    (:func:`result_sizes`) say how many to drop, and the envelope is rebuilt once for the
    kept prefix (and measured again: synthesis and coverage change with the results, so
    the estimate is checked; a still-too-large envelope drops one more result per
    rebuild). ``syncing``: mark each rebuilt envelope ``indexSyncing``
    (:func:`mark_index_syncing`) before it is measured."""
    size = len(_encode(envelope))
    while size > limit:
        if len(hits) == 1:
            return None
        sizes = result_sizes(envelope)
        keep = len(hits)
        while keep > 1 and size > limit:  # at least one is always dropped
            keep -= 1
            size -= sizes[keep]
        hits = hits[:keep]
        envelope = build_envelope(request, hits, controller, plan=plan)
        if syncing:
            mark_index_syncing(envelope)
        size = len(_encode(envelope))
    return envelope


#: ``quality.flags`` key set (true) when the index was behind its record while searching.
INDEX_SYNCING_FLAG = "indexSyncing"
#: Recommendation added to an envelope served while the index is syncing.
RETRY_AFTER_SYNC = "retry-after-index-sync"


def mark_index_syncing(envelope: dict[str, Any]) -> dict[str, Any]:
    """Mark an envelope served while the index lags its SQLite record (a sync running or
    a crash not yet replayed): ``quality.flags.indexSyncing`` true and the recommendation
    ``retry-after-index-sync`` appended (some documents may not be searchable yet; the
    shown results are still verified against the record). Depends on the index state
    only, never on content. Returns ``envelope`` (changed in place)."""
    quality = envelope["quality"]
    quality["flags"][INDEX_SYNCING_FLAG] = True
    if RETRY_AFTER_SYNC not in quality["recommendations"]:
        quality["recommendations"].append(RETRY_AFTER_SYNC)
    envelope["agentic"]["recommendedNext"] = quality["recommendations"][0]
    return envelope


def build_envelope(request: dict[str, Any], hits: list[Hit],
                   controller: dict[str, Any] | None = None, *, plan: Any = None) -> dict[str, Any]:
    """Build the ``schemaVersion`` 2 envelope for hits that may be shown.

    Args:
        request: the normalized request (:func:`node.answer.contract.validate`).
        hits: the hits to show, best first (already through the egress gate when they
            go to a peer). Only source ids, previews, locations and provenance are
            copied — never ``root_prefix``/``rel_path`` beyond the source id, never a
            real path. Each hit's ``duplicates`` become its result's ``alsoIn``
            (``[{"id": chunk id, "source": source id}]``): the caller leaves there only
            copies the receiver may see.
        controller: the controller report from ``Corpus.search_hits``; only pass names
            and statuses, the fusion method and the early-stop flag are copied.
        plan: the query plan the search made (:func:`node.corpus.retrieval.make_plan`),
            or None to make (cached) it here.

    Returns:
        The envelope (keys :data:`ENVELOPE_KEYS`). With no hits it is exactly
        ``empty_envelope("no-verified-results", request)`` whatever the controller says.

    Each result is assembled from its chunk's :class:`ChunkParts` (made once per chunk
    text and heading as given here, so after the lens's scrub) plus the query's numbers.

    Quality gate (``quality``): ``strong`` only when the query has key terms, at least
    75 % of them are covered by the results and half by the top result, and — when the
    query names an exact unit (quoted phrase, identifier, date, number) — the exact pass
    matched a shown result. A query without key terms (stop words only) has coverage
    ratios 0.0 and ``needsMoreEvidence`` true (``retry-with-rewrite-pass``); an exact unit
    not matched adds ``retry-with-exact-pass``. ``hasNonMetaExactEvidence`` is the exact
    pass's match when an exact unit was asked for, else "a result covers every key term".
    """
    if not hits:
        return empty_envelope("no-verified-results", request, plan=plan)
    plan = _plan(request, plan)
    key_terms = tuple(plan.key_terms)
    keys, matcher, prefixes = _query_keys(key_terms)  # the plan's: never re-derived
    key_union = frozenset().union(*(st for _, st in keys))
    key_names = [t for t, _ in keys]
    results: list[dict[str, Any]] = []
    citations: list[dict[str, Any]] = []
    covered_all: set[str] = set()
    top_ratio = 0.0
    exact_matched = False
    candidates: list[tuple[int, int, int, str, str, str]] = []
    whole_of: list[tuple[bool, ...]] = []  # per result, its parts' whole-sentence flags
    whole = False  # some result covers every key term (never true without key terms)
    authoritative = False
    for rank, hit in enumerate(hits):
        cid = _citation_id(hit.chunk_id)
        meta = hit.metadata or {}
        parts = chunk_parts(hit.text, " ".join(hit.location.get("headingPath") or []))
        # what is read (previews, excerpts, synthesis, coverage) is the text without
        # markup; the dedupe key and the location stay those of the stored chunk
        kept = parts.analyses.get(key_terms)  # the same keys ask the same of the same parts
        if kept is None:
            kept = _analyze_hit(parts, keys, matcher, prefixes, key_union)
            if ANALYSES_KEPT:
                keep(parts.analyses, key_terms, kept, ANALYSES_KEPT)
        cov, analyzed = kept
        whole_of.append(parts.whole)
        covered_all.update(cov)
        whole = whole or (bool(keys) and len(cov) == len(keys))
        if str(meta.get("lifecycle")) in AUTHORITATIVE_LIFECYCLES:
            authoritative = True
        if rank == 0:
            top_ratio = len(cov) / len(keys) if keys else 0.0
        comps = {k: round(float(v), 6) for k, v in (hit.score_components or {}).items()}
        if comps.get("exact", 0.0) > 0:
            exact_matched = True
        provenance = {
            "sourceId": hit.source_id,
            "location": dict(hit.location),
            "contentHash": hit.content_hash,
            "indexedAt": hit.indexed_at,
            "dedupeKey": parts.dedupe_key,
            "citationId": cid,
        }
        tags = meta.get("tags") or []
        preview, excerpt = parts.previews(analyzed)
        results.append({
            "id": hit.chunk_id,
            "score": round(float(hit.score), 6),
            "scoreComponents": comps,
            "source": hit.source_id,
            "date": meta.get("date"),
            "agent": meta.get("agent"),
            "project": meta.get("project"),
            "tags": list(tags) if isinstance(tags, (list, tuple)) else [tags],
            "workType": meta.get("workType"),
            "textPreview": preview,
            "provenance": provenance,
            # the other sources holding this very text, collapsed into this result
            "alsoIn": [{"id": d.chunk_id, "source": d.source_id} for d in hit.duplicates],
        })
        citations.append({
            "citationId": cid,
            "resultId": hit.chunk_id,
            "source": hit.source_id,
            "location": dict(hit.location),
            "excerpt": excerpt,
            "scoreComponents": comps,
            "provenance": provenance,
        })
        for pos, (sent, n) in enumerate(analyzed):
            if n:
                candidates.append((n, rank, pos, sent, cid, hit.source_id))
    # extractive synthesis: best-covering sentences, at most 2 per result; among equal
    # coverage a whole sentence (ends with an end mark, fits SYNTHESIS_CHARS) goes first
    candidates.sort(key=lambda c: (-c[0], not whole_of[c[1]][c[2]], c[1], c[2]))
    # only sentences with the question's key terms, never a repeat (readable.quotes)
    sentences = [{"text": readable.cut(readable.item_body(sent), SYNTHESIS_CHARS),
                  "citationId": cid,
                  "source": source}
                 for sent, cid, source in readable.quotes(
                     candidates, len(covered_all), limit=MAX_SYNTHESIS_SENTENCES, query=request["query"])]
    # event aggregation: group by source
    groups: dict[str, dict[str, Any]] = {}
    for res in results:
        g = groups.setdefault(res["source"], {"key": res["source"], "source": res["source"],
                                              "citationIds": [], "count": 0, "headingPaths": []})
        g["citationIds"].append(res["provenance"]["citationId"])
        g["count"] += 1
        hp = res["provenance"]["location"].get("headingPath")
        if hp and hp not in g["headingPaths"]:
            g["headingPaths"].append(hp)
    covered = [t for t in key_names if t in covered_all]
    missing = [t for t in key_names if t not in covered_all]
    ratio = len(covered) / len(key_names) if key_names else 0.0
    exact_wanted = bool(plan.exact_units)
    # strong needs key terms to measure (a stop-word-only query matches arbitrary chunks),
    # and, when the query named an exact unit (quoted phrase, identifier, date, number),
    # a result the exact pass matched.
    strong = (bool(key_names) and ratio >= 0.75 and top_ratio >= 0.5
              and (exact_matched or not exact_wanted))
    recs: list[str] = []
    if missing or (exact_wanted and not exact_matched):
        recs.append("retry-with-exact-pass")
    if not strong:
        recs.append("retry-with-rewrite-pass")
    if not authoritative and any((h.metadata or {}).get("lifecycle") for h in hits):
        recs.append("retry-with-authoritative-source-pass")
    status = "evidence" if strong else "weak-evidence"
    return {
        "schemaVersion": SCHEMA_VERSION,
        "available": True,
        "reason": None,
        "results": results,
        "queryPlan": _query_plan(request, plan),
        "citationPack": {"citations": citations, "count": len(citations)},
        "eventAggregation": {"method": "by-source", "groups": list(groups.values()),
                             "groupCount": len(groups)},
        "answerSynthesis": {
            "mode": "extractive", "status": status, "sentences": sentences,
            "note": "Sentences are copied from the cited results; this is not a generated "
                    "answer.",
        },
        "quality": {
            "status": "strong" if strong else "weak",
            "keyTermCoverage": {"terms": key_names, "covered": covered, "missing": missing,
                                "ratio": round(ratio, 4), "topResultRatio": round(top_ratio, 4)},
            "needsMoreEvidence": not strong,
            "flags": {"metaDiscussionTop": False,
                      "hasNonMetaExactEvidence": bool(exact_matched if exact_wanted
                                                      else whole),
                      "hasAuthoritativeEvidence": authoritative,
                      "exactPassMatched": exact_matched},
            "recommendations": recs,
        },
        "retrievalController": _controller(request, None, controller or {"passes": []},
                                           len(results), plan),
        "agentic": _agentic(status, recs),
        "externalAgentContract": _external_contract(),
    }
