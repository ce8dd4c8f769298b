"""The bounded multi-pass retrieval controller (DESIGN §9 "Search", issue 4).

One search runs at most four passes over the tantivy index, fuses them with weighted
reciprocal-rank fusion (RRF), dedupes by chunk and caps chunks per document (copies of
one text in several documents collapse into one hit, ``Hit.duplicates``), and reports
what it did in the ``retrievalController`` report:

1. ``baseline-bm25`` — always: OR of the query's stemmed, folded, stopword-free terms over
   the chunk body plus the heading path / file name (``title``, boosted by
   :data:`node.corpus.search.TITLE_BOOST`). Stopword-only queries fall back to the
   unstemmed ``exact`` field.
2. ``exact-entity`` — when the query has quoted phrases or identifier-like tokens
   (``os.path.join``, ``E1234``, ``8080``, ``2024-03-01``, ``deploy.sh``): phrase/term
   queries on the unstemmed ``exact`` field, so ``"deleted automatically"`` means those
   words in that order.
3. ``rewrite-expanded`` — a field-aware, expanded rewrite of the query: every query stem
   plus plain-language → documentation-vocabulary expansions from :data:`LEXICON`
   (``folder`` → ``directory``, ``fake`` → ``mock``…; weighted below the user's own
   words), each searched in ``body`` and with a stronger boost in ``title``. (Adjacent
   key-term pairs as sloppy phrases were tried and are off — :data:`PROXIMITY_PAIRS`:
   on ``scripts/eval`` they cost nDCG@10/MRR@10 and took half of the pass's time.)
4. ``expansion`` — the :data:`LEXICON` expansions of the query words the searched index
   hardly uses (:data:`EXPANSION_SHARE`, :func:`scarce_expansions`) in a pass of their
   own, beside the query's own stems and at their weight, fused at
   ``PASS_WEIGHTS["expansion"]``: a bridge the rewrite pass's low weight could not carry
   to the top (issue 40). Skipped (``no-scarce-word``) when every expanded word is
   common there.

Fusion (:data:`FUSION`, per dense tier, chosen on the dev split) is weighted RRF for the
lexical passes alone and with the static dense pass, and the weighted sum of per-query
normalised scores with the full model's (:func:`weighted_sum`; BM25 passes by their best
score, the dense pass min-max, at weight 4: dense-led, issue 40). RRF weights
(:data:`PASS_WEIGHTS`: the baseline at 1.0, the two near-identical
keyword passes at 0.3, the expansion pass at 0.8), then document-level aggregation of chunk scores
(:func:`aggregate_documents`; with the full model a page's further chunks support it
whatever their BM25, :data:`DENSE_SUPPORT_POWER`). The baseline also matches whole identifiers
(``os.path.join``, ``__init__``, ``max_connections``, ``3.11``) on the ``ident`` field
(:func:`node.corpus.search.identifiers`); a page title (``title``) counts, a section
heading (``section``) only in the rewrite pass.

Early stop: when the baseline pass is already strong — each of its top two chunks
contains every key term and the query has no expansion — the other passes are skipped
(``stopReason`` ``baseline-strong``). A deadline (``time.monotonic()`` instant) is checked
before every pass; a pass that would start after it is ``skipped`` and the controller
reports ``budget-exhausted``.

Candidate pools are widened (×4, up to 2000) only when filters, stale-file withholding or
the per-document cap starved the result list and a pass was saturated.

A search with a lens (:class:`node.corpus.lens.Lens`, a peer's view) runs every pass on the view's
own index (:mod:`node.corpus.views`), so candidates, early stop, fusion and scores depend
only on the documents the view may see (specs/policy.md §6.1).

With a dense pass, a chunk only it found never outranks the best chunk holding a rare
query word the model cannot read whole (:func:`guard_rare_terms`, applied after document
support, issue 40), and when no lexical pass found anything
(no word of the question is in the searched index) the dense pass's list is dropped
(its entry says ``reason: no-lexical-match``): the search answers nothing.

The per-pass raw scores of every returned hit are in ``Hit.score_components``
(``bm25``, ``exact``, ``rewrite``, ``expansion``, ``dense``, ``rrf``; 0.0 when a pass ran and did not
find the chunk; absent when the pass did not run).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import tantivy

from node.common.errors import CorpusError
from node.common.scrub import ScrubFailed, scrub_cached, scrub_fields, scrub_many
from node.corpus import search, sources, views
from node.corpus.lens import Lens
from node.corpus.snapshot import DocEntry, Generation
from node.corpus.types import Hit
from node.common.kept import keep, make_room

#: RRF weight per pass (a pass's contribution is ``weight / (RRF_K + rank)``). The exact
#: and rewrite passes are near-identical keyword searches of the baseline's terms: at equal
#: weight their agreement on a distractor turned the baseline's clear margin into a
#: near-tie; at 0.3 they still add the candidates only they find and break ties
#: (scripts/eval --split dev, kith nDCG@10 python-docs / postgresql / generated:
#: 1,1,1 → 0.608 / 0.613 / 0.934; 1,.3,.3 → 0.617 / 0.613 / 0.948; score-normalized
#: fusion instead of RRF was lower (0.610 / 0.594 / 0.947), RRF k 10/20 mixed. Dropping
#: the rewrite pass loses 0.04 on postgresql; the exact pass is neutral on dev (its
#: questions are plain language; w 0 / 0.15 / 0.3 score the same, 0.5 +0.005 on
#: postgresql) and stays for what only it does: quoted phrases in order.
PASS_WEIGHTS = {"baseline-bm25": 1.0, "exact-entity": 0.3, "rewrite-expanded": 0.3,
                "expansion": 0.8, "dense": 0.5}  # dense: dev split, python-docs + postgresql (specs/corpus.md)
#: How passes are fused, per dense tier (issue 21 item 1; "" = no dense pass ran), each
#: the best on the dev split (scripts/tune_fusion, pooled dev nDCG@10 over python-docs,
#: postgresql, generated; specs/corpus.md): ``weighted-sum`` — each pass's scores
#: normalised per query over its own ranked list (:data:`NORMALISATION`,
#: :func:`normalised`), times its weight, summed; ``rrf`` — weighted reciprocal-rank
#: fusion (k = :data:`node.corpus.search.RRF_K`). Lexical only: rrf 0.720, weighted sum
#: 0.716 (0.722 with its knobs re-tuned); + static: rrf 0.730, weighted sum <= 0.725 (max,
#: min-max, mean normalisations, ranx's optimum, an rrf + score blend 0.730); + minilm:
#: rrf 0.783 (dense weight 3.0), weighted sum 0.790 (max-normalised, dense 2.5).
#: Issue 40 (dense-led fusion of the full model, dev split python-docs / python-plain /
#: python-plain-2, kith+minilm nDCG@10, scripts/eval_data/results-issue40-fusion-dev.txt):
#: the dense pass min-max normalised (:data:`NORMALISATION`) at weight 4 and a page's
#: further chunks supporting it whatever their BM25 (:data:`DENSE_SUPPORT_POWER`) —
#: 0.749 / 0.595 / 0.518 → 0.772 / 0.636 / 0.688 (MiniLM cosine alone 0.712 / 0.522 /
#: 0.624, the flat RRF hybrid 0.763 / 0.556 / 0.525).
FUSION = {"": "rrf", "static": "rrf", "minilm": "weighted-sum"}
#: Per-pass normalisation of the weighted sum: the BM25 passes by their own list's best
#: score (BM25's least possible score is 0), the dense pass min-max over its list (its
#: cosines sit in a narrow band well above 0, so by the best alone its 100th candidate
#: scored nearly as its first; issue 40 dev, with :data:`DENSE_SUPPORT_POWER`: max
#: 0.788 / 0.618 / 0.625, min-max 0.772 / 0.636 / 0.688 — python-docs / python-plain /
#: python-plain-2; issue 21's pooled dev, before: min-max 0.789 vs max 0.790).
NORMALISATION = {"baseline-bm25": "max", "exact-entity": "max", "rewrite-expanded": "max",
                 "expansion": "max", "dense": "minmax"}
#: The dense pass's weight per tier (``kith index config --dense-model``), chosen on the
#: dev split with that tier's method: static 0.5 in RRF (0.3-0.6 within 0.001), minilm 4
#: in the weighted sum, min-max normalised (issue 40 dev, python-docs / python-plain /
#: python-plain-2: 2.5 0.779 / 0.638 / 0.654, 4 0.772 / 0.636 / 0.688, 6 0.776 / 0.626
#: / 0.680, 10 0.766 / 0.622 / 0.691; issue 21's max-normalised 2.5 before).
DENSE_WEIGHTS = {"static": 0.5, "minilm": 4.0}


def fusion_method(tier: str | None) -> str:
    """The fusion method for a search whose dense pass ran with ``tier`` (None: no dense
    pass; :data:`FUSION`)."""
    return FUSION.get(tier or "", FUSION[""])


#: Score-component key per pass.
COMPONENT = {"baseline-bm25": "bm25", "exact-entity": "exact", "rewrite-expanded": "rewrite",
             "expansion": "expansion", "dense": "dense"}
#: The ``expansion`` pass (issue 40): a query word's :data:`LEXICON` expansions searched in
#: a pass of their own, beside the query's own stems, at :data:`EXPANSION_BOOST` × the
#: user's words' weight — only for a word the searched index hardly uses (at most
#: EXPANSION_SHARE of its chunks hold it, none included: a word the corpus uses freely
#: needs no bridge, and expanding it on questions worded like the docs was the loss
#: measured). Fused at ``PASS_WEIGHTS["expansion"]`` (0.8), max-normalised in the
#: weighted sum. Dev split nDCG@10, python-docs / python-plain / python-plain-2 /
#: postgresql / postgresql-plain, against 0.706 / 0.493 / 0.318 / 0.688 / 0.188 (the
#: expansions only in the rewrite pass): this setting 0.707 / 0.513 / 0.326 / 0.695 /
#: 0.199; boost 1.5 0.707 / 0.507 / 0.339 / 0.696 / 0.207, 2 0.693 / 0.519 / 0.339 /
#: 0.693 / 0.206; every word expanded (weight 0.3) 0.681 / 0.494 / 0.310 / 0.684 / 0.201;
#: share 0.05 or 0.1, weight 0.45 or 1.0, the expansions out of the rewrite pass, or the
#: pass without the query's own stems: lower on python-docs
#: (scripts/eval_data/results-issue40-lexpass-dev.txt).
EXPANSION_SHARE = 0.02
#: The fewest chunks the limit above allows, whatever the index's size: a word one chunk
#: holds is scarce in a home under 50 chunks too, where 2 % is less than one chunk and the
#: pass never ran. Indexes of 50 chunks or more are unaffected.
EXPANSION_FLOOR = 1
EXPANSION_BOOST = 1.0
#: Boost of an expansion term relative to the user's own term.
EXPANSION_WEIGHT = 0.7
#: Boost of a page-title (first heading / file name) match and of a section-heading match
#: in the rewrite pass.
REWRITE_TITLE_BOOST = 1.5
REWRITE_SECTION_BOOST = 1.5
#: Adjacent key-term pairs as sloppy phrases in the rewrite pass (boost, slop). Off:
#: measured with scripts/eval (53 questions, python-docs) they LOWER quality (nDCG@10
#: 0.684 → 0.668, MRR@10 0.729 → 0.687; Recall@10 0.821 → 0.830) while the phrase
#: queries cost about as much as the rest of the rewrite pass (positions are read).
PROXIMITY_PAIRS = False
PAIR_BOOST = 0.5
PAIR_SLOP = 2
#: Run the passes of one search concurrently (tantivy releases the GIL while it searches):
#: the other passes start beside the baseline when the plan proves they will run — when
#: the early-stop rule cannot fire (:func:`may_stop_early`). When it may fire, the baseline
#: runs alone first and the others only when it was not strong (issue 31: a pass started
#: beside it and then dropped was work a loaded host paid for nothing — 2.17 passes per
#: query, most of the dropped ones on such queries). The same passes, results and report
#: either way. Uses at most :data:`PASS_WORKERS` extra threads per process.
#: ``scripts/bench_search --sequential`` measures without it.
#:
#: ``"auto"`` (the default): concurrently only while the process runs no other search and
#: the machine has an idle core now (:func:`_run_beside`, :func:`_idle_core`). A pass handed to a thread costs
#: CPU — the hand-off and the two threads taking turns at the GIL: about 0.15-0.3 ms more
#: process CPU per search than the same passes one after another (scripts/bench_search's
#: corpus, 97.6k chunks) — which buys a shorter wait only when a core is free for it. A
#: host answering many guests, or any search on a busy machine, runs them one after
#: another (same passes, results and report). True: always concurrently (what the
#: equivalence tests pin), False: never.
PARALLEL_PASSES: bool | str = "auto"
PASS_WORKERS = 2
#: Document-level aggregation (:func:`aggregate_documents`): a document's further chunks
#: are scored at SECOND_CHUNK_FACTOR × their fused score (a page's second chunk no longer
#: pushes another page out of the top k), and its best chunk gains DOC_SUPPORT × the
#: fused score of each of its next DOC_SUPPORT_CHUNKS chunks × (that chunk's baseline BM25
#: / the best baseline BM25) ** SUPPORT_POWER — a page about the question usually matches
#: in more than one section, a release note or FAQ entry in one; the BM25 ratio keeps a
#: weak second match (RRF flattens it to a near-equal rank score) from outvoting a strong
#: single match. Applied to the top ``AGGREGATE_WINDOW × limit`` fused candidates.
#: scripts/eval --split dev nDCG@10 python-docs / postgresql / generated (weights above):
#: off 0.617 / 0.613 / 0.948; factor 0.5 alone 0.639 / 0.632 / 0.948; + support 0.5
#: (power 0) 0.678 / 0.672 / 0.880; support 1.0, power 3 0.683 / 0.683 / 0.934 (pooled
#: 0.655 → 0.713); support over 2-3 chunks, factor 0.3/0.7, power 1/2/4 were no better.
#: Re-measured once the HTML manual's heading paths were clean (page furniture and tables
#: of contents out, the page title at the root of every chunk, node/corpus/parsers.py):
#: support over 1 chunk 0.683 / 0.674 / 0.934 (legacy set 0.694), over 2 chunks 0.703 /
#: 0.681 / 0.934 (legacy 0.707), over 3 0.711 / 0.680 / 0.934 (legacy 0.698); factor
#: 0.3/0.7 and power 2/4 with 2 chunks no better.
SECOND_CHUNK_FACTOR = 0.5
DOC_SUPPORT = 1.0
DOC_SUPPORT_CHUNKS = 2
AGGREGATE_WINDOW = 8
SUPPORT_POWER = 3.0
#: The support power per dense tier where it differs from :data:`SUPPORT_POWER`: with the
#: full model a page's further chunks support it by their fused score whatever their
#: BM25 (power 0: a chunk only the dense pass found counts too), so a page the model
#: finds in several places beats one lexical mention (issue 40 dev, kith+minilm,
#: python-docs / python-plain / python-plain-2: power 3 0.761 / 0.570 / 0.599, 1 0.753 /
#: 0.568 / 0.584, 0.25 0.745 / 0.571 / 0.583, 0 0.772 / 0.636 / 0.688). The static
#: tier keeps power 3 (0: 0.710 / 0.533 / 0.317 → 0.703 / 0.511 / 0.435).
DENSE_SUPPORT_POWER = {"minilm": 0.0}


def support_power(tier: str | None) -> float:
    """The document-support power (:func:`aggregate_documents`) of a search whose dense
    pass ran with ``tier`` (None: none ran): :data:`DENSE_SUPPORT_POWER` or
    :data:`SUPPORT_POWER`."""
    return DENSE_SUPPORT_POWER.get(tier or "", SUPPORT_POWER)
#: (Pseudo-relevance feedback — the best 5 idf-weighted stems of the baseline's top 5
#: chunks added at 0.3 to the baseline query, fused as a pass at 0.5 — was measured and
#: left out: dev nDCG@10 0.703 / 0.681 / 0.934 → 0.710 / 0.668 / 0.949, 18 questions
#: better and 18 worse, at +2 ms p50 for its sequential pass.)
#: Largest candidate pool per pass when widening.
MAX_DEPTH = 2000
# Plain-language words users type → the vocabulary technical documentation uses.
# Generic software vocabulary (not tied to one corpus); keys and values are plain words,
# analyzed with the index's own analyzer at first use. Expansions are weighted below the
# user's own words (EXPANSION_WEIGHT) and only ever ADD candidates to a separate pass.
LEXICON: dict[str, tuple[str, ...]] = {
    "folder": ("directory",), "folders": ("directories",), "subfolder": ("subdirectory",),
    "subfolders": ("subdirectories",), "dir": ("directory",),
    "program": ("process", "command"), "app": ("application", "program"),
    "crash": ("exception", "error"), "crashes": ("exception", "error"),
    "error": ("exception",), "errors": ("exceptions",), "fail": ("exception", "error"),
    "fake": ("mock",), "stub": ("mock",), "dummy": ("mock",), "double": ("mock",),
    "slow": ("performance", "profile"), "slower": ("performance",), "speed": ("performance",),
    "website": ("url", "http"), "webpage": ("url", "http", "html"), "web": ("url", "http"),
    "page": ("html",), "link": ("url",), "address": ("url",), "download": ("fetch", "url"),
    "internet": ("network",), "online": ("network",),
    "clean": ("remove", "delete", "cleanup"), "cleans": ("removed", "deleted", "cleanup"),
    "erase": ("delete", "remove"), "wipe": ("delete", "remove"),
    "temp": ("temporary",), "tmp": ("temporary",),
    "save": ("write", "serialize", "store"), "store": ("write", "serialize"),
    "load": ("read", "deserialize"),
    "text": ("string", "str"), "texts": ("strings",), "word": ("string", "token"),
    "words": ("strings", "tokens"), "number": ("integer", "int", "float"),
    "numbers": ("integers", "floats"),
    "check": ("test", "validate", "verify"), "pattern": ("regular", "expression", "regex"),
    "wildcard": ("glob", "pattern"), "wildcards": ("glob", "patterns"),
    "spreadsheet": ("csv", "excel"), "settings": ("configuration", "config"),
    "config": ("configuration",), "flags": ("options", "arguments"), "flag": ("option", "argument"),
    "parallel": ("concurrent", "processes"), "cores": ("processors", "processes"),
    "cpu": ("processor",), "simultaneously": ("concurrently",),
    "unzip": ("extract", "zip"), "unpack": ("extract",), "shrink": ("compress", "compression"),
    "smaller": ("compress",), "checksum": ("hash", "digest"), "fingerprint": ("hash", "digest"),
    "timezone": ("tzinfo", "zone"), "combination": ("combinations", "permutations", "product"),
    "combinations": ("permutations", "product"), "pair": ("tuple", "combinations"),
    "pairs": ("tuples", "combinations"), "count": ("counter", "tally"),
    "remember": ("cache", "memoize"), "memoize": ("cache",), "cache": ("memoize",),
    "quit": ("exit", "signal"), "terminate": ("signal", "exit"), "kill": ("signal",),
    "ctrl": ("keyboardinterrupt", "sigint"), "dictionary": ("dict", "mapping"),
    "dictionaries": ("dicts", "mappings"), "bug": ("debugger", "debug"),
    "bugs": ("debugger", "debug"), "step": ("breakpoint", "debugger"),
    "changed": ("diff", "differences"), "changes": ("diff", "differences"),
    "difference": ("diff",), "differences": ("diff",), "compare": ("diff", "comparison"),
    "readable": ("pretty", "format"), "pretty": ("pprint", "format"),
    "wrap": ("fill", "width"), "columns": ("width",), "fit": ("width",),
    "install": ("pip", "installation"), "package": ("module", "library", "distribution"),
    "packages": ("modules", "libraries", "distributions"), "isolated": ("virtual",),
    "environment": ("virtual", "venv"), "share": ("serve", "server"),
    "email": ("smtp", "mail", "message"), "mail": ("smtp", "email"),
    "database": ("sql", "db"), "javascript": ("json",), "js": ("json",),
    "constants": ("enumeration", "enum"), "constant": ("enumeration", "enum"),
    "thread": ("threading",), "threads": ("threading",), "lock": ("mutex",),
    "hash": ("digest",), "password": ("secure", "token"), "passwords": ("secure", "tokens"),
    "leak": ("allocation",), "timer": ("timing",), "measure": ("timing", "benchmark"),
}


@lru_cache(maxsize=1)
def _lexicon_stems() -> dict[str, tuple[str, ...]]:
    """LEXICON keyed and valued by analyzed stems (computed once)."""
    out: dict[str, list[str]] = {}
    for word, targets in LEXICON.items():
        keys = search.query_terms(word) or search.exact_terms(word)
        stems = [s for t in targets for s in (search.query_terms(t) or search.exact_terms(t))]
        for k in keys:
            bucket = out.setdefault(k, [])
            for s in stems:
                if s != k and s not in bucket:
                    bucket.append(s)
    return {k: tuple(v) for k, v in out.items()}


def expansion_sources(query: str) -> list[tuple[str, tuple[str, ...]]]:
    """``[(the query word's stem, its expansion stems)]`` for each word of ``query`` that
    :data:`LEXICON` expands, in query order; an expansion already among the query's own
    stems is left out (pure: no index access)."""
    own = search.query_terms(query)
    lex = _lexicon_stems()
    out: list[tuple[str, tuple[str, ...]]] = []
    for raw in search.exact_terms(query):
        stem = next(iter(search.query_terms(raw)), "")
        targets = tuple(dict.fromkeys(t for t in lex.get(raw, ()) + lex.get(stem, ())
                                      if t not in own))
        if targets:
            out.append((stem or raw, targets))
    return out


def expansions(query: str) -> list[str]:
    """Expansion stems for ``query`` (not already among its own stems), in query order
    (:func:`expansion_sources`, flattened, each once)."""
    return _flattened(expansion_sources(query))


def _flattened(sources: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """The expansion stems of :func:`expansion_sources`' ``sources``, each once, in order."""
    return list(dict.fromkeys(t for _src, targets in sources for t in targets))


@dataclass
class Plan:
    """What the controller will try for one query (request-only; no index access).

    Attributes:
        query: the user text. stems: its analyzed terms (``kith_en``). key_terms: folded
        unstemmed key words. exact_units: exact-pass phrases. expansions: rewrite stems.
        pairs: adjacent key-term pairs (exact terms) for proximity phrases (empty
        unless :data:`PROXIMITY_PAIRS`). sources: the expanded words and their
        expansions (:func:`expansion_sources`), which the ``expansion`` pass keeps only
        for words the searched index hardly uses (:func:`scarce_expansions`).
    """

    query: str
    stems: list[str]
    key_terms: list[str]
    exact_units: list[list[str]]
    expansions: list[str]
    pairs: list[list[str]] = field(default_factory=list)
    sources: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    @property
    def passes(self) -> list[str]:
        """Pass names that may run, in order."""
        out = ["baseline-bm25"]
        if self.exact_units:
            out.append("exact-entity")
        if self.stems and (self.expansions or self.pairs or len(self.stems) > 1):
            out.append("rewrite-expanded")
        if self.stems and self.expansions:
            out.append("expansion")
        return out

    def subqueries(self) -> list[dict[str, Any]]:
        """The subqueries as a caller may see them (``queryPlan.subqueries``)."""
        subs: list[dict[str, Any]] = [{"pass": "baseline-bm25", "terms": list(self.stems),
                                       "fields": ["body", "title"]}]
        if self.exact_units:
            subs.append({"pass": "exact-entity", "phrases": [" ".join(u) for u in self.exact_units],
                         "fields": ["exact"]})
        if "rewrite-expanded" in self.passes:
            subs.append({"pass": "rewrite-expanded", "terms": list(self.stems),
                         "expansions": list(self.expansions),
                         "proximityPairs": [" ".join(p) for p in self.pairs],
                         "fields": ["body", "title", "exact"]})
        if "expansion" in self.passes:
            subs.append({"pass": "expansion", "terms": list(self.stems),
                         "expansions": list(self.expansions), "fields": ["body", "title"]})
        return subs


def make_plan(query: str) -> Plan:
    """Analyze ``query`` into a :class:`Plan` (pure: no index access; cached per query
    and :data:`PROXIMITY_PAIRS` — callers must not mutate the returned plan)."""
    return _make_plan(query, PROXIMITY_PAIRS)


@lru_cache(maxsize=512)
def _make_plan(query: str, proximity_pairs: bool) -> Plan:
    """:func:`make_plan` with the switch it reads as an argument (the cache's key)."""
    keys = search.key_terms(query)
    words = [k for k in keys if not k.isdigit()]
    pairs = [[a, b] for a, b in zip(words, words[1:])] if proximity_pairs else []
    sources = expansion_sources(query)  # once: the expansions are its flattening
    return Plan(query=query, stems=search.query_terms(query), key_terms=keys,
                exact_units=search.exact_units(query), expansions=_flattened(sources),
                pairs=pairs, sources=sources)


def _should(subs: Iterable[Any]) -> Any:
    return tantivy.Query.boolean_query([(tantivy.Occur.Should, q) for q in subs])


def rewrite_query(schema: Any, plan: Plan) -> Any | None:
    """The ``rewrite-expanded`` query: own stems (body + boosted title), expansion stems
    at :data:`EXPANSION_WEIGHT`, sloppy phrases of adjacent key-term pairs, and what the
    query may name on ``defines`` (:func:`node.corpus.search.definition_query_terms`)."""
    Q = tantivy.Query
    subs = []
    for t in plan.stems:
        subs.append(Q.term_query(schema, "body", t))
        if not t.isdigit():  # "3" in a question must not pick "whatsnew/3.1" by its name
            subs.append(Q.boost_query(Q.term_query(schema, "title", t), REWRITE_TITLE_BOOST))
            if REWRITE_SECTION_BOOST:
                subs.append(Q.boost_query(Q.term_query(schema, "section", t),
                                          REWRITE_SECTION_BOOST))
    for t in plan.expansions:
        subs.append(Q.boost_query(Q.term_query(schema, "body", t), EXPANSION_WEIGHT))
        subs.append(Q.boost_query(Q.term_query(schema, "title", t),
                                  EXPANSION_WEIGHT * REWRITE_TITLE_BOOST))
        if REWRITE_SECTION_BOOST:
            subs.append(Q.boost_query(Q.term_query(schema, "section", t),
                                      EXPANSION_WEIGHT * REWRITE_SECTION_BOOST))
    for a, b in plan.pairs:
        subs.append(Q.boost_query(Q.phrase_query(schema, "exact", [a, b], PAIR_SLOP), PAIR_BOOST))
    if subs and search.DEFINES_BOOST:  # the defining chunk, as in the baseline
        for t in search.definition_query_terms(plan.query):
            subs.append(Q.boost_query(Q.term_query(schema, "defines", t), search.DEFINES_BOOST))
    return _should(subs) if subs else None


def scarce_expansions(searcher: Any, plan: Plan) -> list[str]:
    """The expansion stems the ``expansion`` pass searches in ``searcher``'s index: those
    of the query words held by at most max(:data:`EXPANSION_FLOOR`, :data:`EXPANSION_SHARE`
    × its chunks) chunks (a word absent from it included), each once. One ``doc_freq`` per
    expanded word (specs/corpus.md, the ``expansion`` pass)."""
    limit = max(EXPANSION_FLOOR, EXPANSION_SHARE * searcher.num_docs)
    out: dict[str, None] = {}
    for src, targets in plan.sources:
        if searcher.doc_freq("body", src) <= limit:
            out.update(dict.fromkeys(targets))
    return list(out)


def expansion_query(schema: Any, plan: Plan, kept: Sequence[str]) -> Any | None:
    """The ``expansion`` query: the query's own stems (body + title at
    :data:`REWRITE_TITLE_BOOST`) and the ``kept`` expansion stems
    (:func:`scarce_expansions`) the same way, at the same weight; None when none is kept
    (the pass is skipped)."""
    if not kept:
        return None
    Q = tantivy.Query
    subs = []
    for t, boost in [*((t, 1.0) for t in plan.stems), *((t, EXPANSION_BOOST) for t in kept)]:
        subs.append(Q.boost_query(Q.term_query(schema, "body", t), boost))
        if not t.isdigit():
            subs.append(Q.boost_query(Q.term_query(schema, "title", t),
                                      boost * REWRITE_TITLE_BOOST))
    return _should(subs)


#: Addresses whose ids :class:`StoredIds` keeps per searcher across requests (about
#: 0.3 KB each; the map is emptied when full). A searcher's segments never change, so an
#: address names the same chunk for as long as that searcher is used.
IDS_KEPT = 20_000
#: ``id(owner) -> (a weak reference to the owner (the record or a view index), its
#: searcher, {address: ids})``: the map of the owner's current searcher only (a new
#: searcher replaces it, releasing the old one; the entry goes with its owner).
_kept_ids: dict[int, tuple[Any, Any, dict[tuple[int, int], tuple[str, str]]]] = {}
_kept_lock = threading.Lock()


def _kept_for(owner: Any, searcher: Any) -> dict[tuple[int, int], tuple[str, str]]:
    """The ids kept for ``searcher`` of ``owner`` (a new, empty map for a new searcher)."""
    key = id(owner)
    with _kept_lock:
        entry = _kept_ids.get(key)
        if entry is None or entry[0]() is not owner or entry[1] is not searcher:
            def forget(_ref: Any, key: int = key) -> None:
                with _kept_lock:
                    if _kept_ids.get(key, (None,))[0] is _ref:
                        del _kept_ids[key]

            entry = _kept_ids[key] = (weakref.ref(owner, forget), searcher, {})
        return entry[2]


class StoredIds:
    """``(segment, doc)`` address → ``(chunk_id, doc_id)``, read from the index's id fast
    fields (:data:`node.corpus.search.ID_FAST_FIELDS`: one columnar read per field for a
    whole pass's hits, :meth:`prefetch`), and from tantivy's doc store only for a chunk
    without them. ``ids`` holds the addresses ONE request used (its passes share one
    searcher, so an address means the same document). Passes rank and fuse by address;
    with ``owner`` (the record or view index the searcher belongs to) an address read once
    is kept for later requests on the same searcher (at most :data:`IDS_KEPT`).
    Thread-safe enough for the pass threads (dict writes under the GIL; a race reads an
    address twice, with the same answer)."""

    __slots__ = ("searcher", "ids", "kept")

    def __init__(self, searcher: Any, owner: Any = None) -> None:
        self.searcher = searcher
        self.ids: dict[tuple[int, int], tuple[str, str]] = {}
        self.kept = _kept_for(owner, searcher) if owner is not None else {}

    def __call__(self, key: tuple[int, int]) -> tuple[str, str]:
        ids = self.ids.get(key)
        if ids is None:
            ids = self.kept.get(key)
            if ids is None:
                self.prefetch([key])
                return self.ids[key]
            self.ids[key] = ids
        return ids

    def prefetch(self, keys: Iterable[Any]) -> None:
        """Read the ids of every address in ``keys`` not known yet (chunk-id strings are
        skipped): one fast-field read per id field for all of them, a stored-document
        read for each one without fast ids."""
        ids, kept = self.ids, self.kept
        todo = []
        for key in keys:
            if isinstance(key, str) or key in ids:
                continue
            got = kept.get(key)
            if got is not None:
                ids[key] = got
            else:
                todo.append(key)
        if not todo:
            return
        addrs = [tantivy.DocAddress(k[0], k[1]) for k in todo]
        try:
            columns = [self.searcher.fast_field_values(name, addrs) for name in search.ID_FAST_FIELDS]
        except ValueError:  # an index without the fields (a searcher of an older schema)
            columns = [[None] * len(addrs)] * len(search.ID_FAST_FIELDS)
        make_room(kept, len(todo), IDS_KEPT)
        for i, key in enumerate(todo):
            got = search.unpack_ids(columns[0][i], columns[1][i], columns[2][i], columns[3][i])
            if got is None:
                doc = self.searcher.doc(addrs[i])
                got = (doc.get_first("chunk_id"), doc.get_first("doc_id"))
            kept[key] = ids[key] = got

    def cid(self, key: Any) -> str:
        """The chunk id of ``key`` (an address, or a chunk id already)."""
        return key if isinstance(key, str) else self(key)[0]


def _tie_sorted(items: list[tuple[Any, float]], cid: Callable[[Any], str]) -> list[tuple[Any, float]]:
    """``items`` sorted by (−score, chunk id), reading chunk ids only inside runs of equal
    scores (a run of one needs none)."""
    items.sort(key=lambda x: -x[1])
    out: list[tuple[Any, float]] = []
    i, n = 0, len(items)
    while i < n:
        j = i + 1
        while j < n and items[j][1] == items[i][1]:
            j += 1
        if j - i > 1:
            out.extend(sorted(items[i:j], key=lambda x: cid(x[0])))
        else:
            out.append(items[i])
        i = j
    return out


def run_pass(searcher: Any, query: Any, depth: int, ids: StoredIds,
             ) -> tuple[list[tuple[tuple[int, int], float]], bool]:
    """Run one pass: ``([(address, score)] best first, saturated)``.

    Zero-score hits are dropped (never evidence); ties sort by chunk id (read through
    ``ids`` only for tied hits); no total count is collected (``count=False``: it costs
    time and nothing uses it).
    """
    result = searcher.search(query, depth, count=False).hits
    out = [((addr.segment_ord, addr.doc), float(score)) for score, addr in result if score > 0]
    ids.prefetch(k for k, _ in out)  # the hits' ids in one columnar read (ties, fusion, walk)
    return _tie_sorted(out, ids.cid), len(result) >= depth


class _Order:
    """The fused candidate order as chunk ids — (−score, chunk id) — resolved as it is read
    (what :func:`_materialize` walks): items are sorted by score
    alone up front, and a run of equal scores is put in chunk-id order (reading its ids)
    only when a position inside it is first read. Fills ``doc_of`` and ``key_of`` (chunk
    id → fusion key) for every id it hands out."""

    def __init__(self, fused: dict[Any, float], ids: StoredIds, doc_of: dict[str, str],
                 key_of: dict[str, Any]) -> None:
        self.keys = sorted(fused, key=lambda k: -fused[k])
        self._fused, self._ids, self.doc_of, self.key_of = fused, ids, doc_of, key_of
        self._done = 0  # keys[:_done] are in their final order

    def __len__(self) -> int:
        return len(self.keys)

    def _settle(self, upto: int) -> None:
        """Put ``keys[:upto]`` (and the rest of the run of ties it ends in) in final order."""
        keys, fused, n = self.keys, self._fused, len(self.keys)
        while self._done < min(upto, n):
            i = self._done
            j = i + 1
            while j < n and fused[keys[j]] == fused[keys[i]]:
                j += 1
            if j - i > 1:
                keys[i:j] = sorted(keys[i:j], key=self._ids.cid)
            self._done = j

    def _one(self, key: Any) -> str:
        if isinstance(key, str):
            self.key_of[key] = key
            return key
        cid, did = self._ids(key)
        self.doc_of[cid] = did
        self.key_of[cid] = key
        return cid

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, _ = i.indices(len(self.keys))
            self._settle(stop)
            return [self._one(k) for k in self.keys[start:stop]]
        self._settle(i + 1)
        return self._one(self.keys[i])


def normalised(hits: list[tuple[Any, float]], how: str) -> list[tuple[Any, float]]:
    """One pass's scores normalised over that pass's own ranked list (best first) for one
    query: ``max`` — score / the list's best (BM25's least possible score is 0); ``minmax``
    — (score − the list's lowest) / (best − lowest), all 1.0 when they are equal (a
    cosine list sits in a narrow band well above 0). The list is the pass's, run on the
    searcher's own index — for a peer its view's — so nothing outside it counts."""
    if not hits:
        return []
    top = hits[0][1]
    if how == "minmax":
        low = min(sc for _k, sc in hits)
        span = top - low
        return [(k, (sc - low) / span if span > 0 else 1.0) for k, sc in hits]
    return [(k, sc / top if top > 0 else 0.0) for k, sc in hits]


def pass_weight(name: str, tier: str | None = None) -> float:
    """The fusion weight of a pass (:data:`PASS_WEIGHTS`; the dense pass's per tier,
    :data:`DENSE_WEIGHTS`)."""
    if name == "dense" and tier in DENSE_WEIGHTS:
        return DENSE_WEIGHTS[tier]
    return PASS_WEIGHTS.get(name, 1.0)


def weighted_sum(ranked: dict[str, list[tuple[Any, float]]],
                 weights: dict[str, float] | None = None) -> dict[Any, float]:
    """The fusion (:data:`FUSION` ``weighted-sum``): ``{key: sum over passes of weight ×
    normalised score}`` (:func:`normalised` with :data:`NORMALISATION`; a pass that did
    not find a key adds 0). ``weights`` default to :func:`pass_weight`."""
    fused: dict[Any, float] = {}
    for name, hits in ranked.items():
        w = (weights or {}).get(name, pass_weight(name))
        if w <= 0:
            continue
        for key, sc in normalised(hits, NORMALISATION.get(name, "max")):
            fused[key] = fused.get(key, 0.0) + w * sc
    for name, hits in ranked.items():  # a key only a zero-weight pass found still counts
        for key, _sc in hits:
            fused.setdefault(key, 0.0)
    return fused


def fuse(ranked: dict[str, list[tuple[Any, float]]],
         weights: dict[str, float] | None = None, method: str = "rrf") -> dict[Any, float]:
    """Fuse the passes' ranked lists with ``method`` (``rrf`` | ``weighted-sum``)."""
    if method == "rrf":
        return weighted_rrf(ranked, weights=weights)
    return weighted_sum(ranked, weights)


def weighted_rrf(ranked: dict[str, list[tuple[Any, float]]],
                 k: int = search.RRF_K, weights: dict[str, float] | None = None,
                 ) -> dict[Any, float]:
    """Weighted RRF: ``{key: sum over passes of weight/(k + rank)}`` (a key names one
    chunk: its chunk id, or its tantivy address within one request)."""
    fused: dict[Any, float] = {}
    for name, hits in ranked.items():
        w = (weights or {}).get(name, PASS_WEIGHTS.get(name, 1.0))
        for rank, (cid, _s) in enumerate(hits, start=1):
            fused[cid] = fused.get(cid, 0.0) + w / (k + rank)
    return fused


def aggregate_documents(fused: dict[Any, float], doc_key: Callable[[Any], str | None],
                        window: int, strength: Callable[[Any], float] | None = None,
                        ) -> dict[Any, float]:
    """Document-level aggregation of chunk scores over the top ``window`` fused candidates
    (candidates below the window keep their fused score).

    A document's best chunk gets ``best + DOC_SUPPORT * sum(strength(c) * c)`` over its
    next :data:`DOC_SUPPORT_CHUNKS` chunks in the window (a page with two or three strong
    chunks beats a page with one); each further chunk of the same
    document gets ``SECOND_CHUNK_FACTOR * its score``, so a page's second chunk only takes
    a place above another page's best chunk when it is clearly stronger. ``doc_key(key)``
    names a candidate's document (None: unknown, left alone); ``strength(key)`` in 0..1
    (None: 1) — :func:`run_search` passes (baseline BM25 / best baseline BM25) **
    :data:`SUPPORT_POWER` (:func:`support_power`; with power 0 it passes None). Returns a new dict; cost: ``doc_key`` once per candidate in
    the window (in :func:`run_search` a stored-document read the first time the searcher
    meets that candidate, :class:`StoredIds`).
    """
    if SECOND_CHUNK_FACTOR == 1.0 and DOC_SUPPORT == 0.0:
        return fused
    top = sorted(fused, key=lambda k: -fused[k])[:window]
    out = dict(fused)
    best: dict[str, Any] = {}
    seconds: dict[Any, int] = {}
    for k in top:
        d = doc_key(k)
        if d is None:
            continue
        first = best.get(d)
        if first is None:
            best[d] = k
            continue
        n = seconds.get(first, 0)
        if n < DOC_SUPPORT_CHUNKS:
            seconds[first] = n + 1
            out[first] += DOC_SUPPORT * fused[k] * (1.0 if strength is None else strength(k))
        out[k] = fused[k] * SECOND_CHUNK_FACTOR
    return out


#: Lexical corroboration of the dense pass (issue 40): a chunk only the dense pass found
#: never outranks the best chunk that holds a rare query term (:func:`guard_rare_terms`).
RARE_TERM_GUARD = True
#: A query stem is rare when at most this share of the searched index's chunks hold it
#: (and at least one does); never fewer than :data:`RARE_MIN_DF` chunks.
RARE_SHARE = 0.001
RARE_MIN_DF = 1
#: Guard only the rare words the model cannot read whole (:func:`unread_stems`): an
#: everyday word (``pretend``, ``tucking``) is one WordPiece token, which the dense pass
#: understands, and a chunk that merely holds it is no stronger evidence than the meaning
#: match; a word outside the vocabulary (``zorblax``, ``E1234``, ``zoneinfo``) reaches the
#: model as fragments, so only its exact match can stand for it. Dev split, kith+minilm
#: nDCG@10 python-docs / python-plain / python-plain-2: every rare stem guarded 0.749 /
#: 0.595 / 0.482, only the unread ones 0.749 / 0.595 / 0.518 (no guard at all: the same).
RARE_UNREAD_ONLY = True


def unread_stems(plan: Plan) -> set[str]:
    """The stems of the query's key words the dense model cannot read whole (each word
    outside :func:`node.corpus.dense.model_words`; the standard library reads the
    tokenizer Kith ships once)."""
    from node.corpus import dense

    known = dense.model_words()
    return {t for w in plan.key_terms if w not in known for t in search.query_terms(w)}


def guard_rare_terms(fused: dict[Any, float], ranked: dict[str, list[tuple[Any, float]]],
                     searcher: Any, schema: Any, plan: Plan, ids: StoredIds,
                     ) -> dict[Any, float]:
    """Cap the chunks only the dense pass found below the best fused chunk that holds a
    rare query term (:data:`RARE_SHARE`) that the model cannot read whole
    (:data:`RARE_UNREAD_ONLY`, :func:`unread_stems`): a near miss by meaning never
    outranks an exact match on a rare word (an error code, a product name). Their order among themselves is
    kept; nothing changes when the query has no rare term in the index. Keys are chunk
    ids (with a dense pass every list names chunks); one extra term query of the rare
    stems, only when the dense pass ran and the query has one."""
    limit = max(RARE_MIN_DF, RARE_SHARE * searcher.num_docs)
    guarded = unread_stems(plan) if RARE_UNREAD_ONLY else set(plan.stems)
    rare = [t for t in plan.stems
            if t in guarded and 0 < searcher.doc_freq("body", t) <= limit]
    if not rare:
        return fused
    lexical = {k for name, hits in ranked.items() if name != "dense" for k, _s in hits}
    dense_only = [k for k, _s in ranked["dense"] if k not in lexical]
    if not dense_only:
        return fused
    Q = tantivy.Query
    q = Q.boolean_query([(tantivy.Occur.Should, Q.term_query(schema, "body", t)) for t in rare])
    found = searcher.search(q, int(limit) * len(rare) + 1, count=False).hits
    ids.prefetch((a.segment_ord, a.doc) for _s, a in found)
    with_rare = [c for c in (ids.cid((a.segment_ord, a.doc)) for _s, a in found) if c in fused]
    if not with_rare:
        return fused
    floor = max(fused[k] for k in with_rare)
    over = [k for k in dense_only if fused.get(k, 0.0) >= floor]
    if not over:
        return fused
    out = dict(fused)
    top = max(fused[k] for k in over)
    for k in over:  # just below the floor, in their own order
        out[k] = floor * 0.999 * fused[k] / top
    return out


#: Chunks whose stems :func:`_covers_all` keeps (then emptied): a chunk id names one text
#: and heading path for as long as it exists (specs/corpus.md, "Generations").
STEMS_KEPT = 8192
_stems_kept: dict[tuple[str, frozenset[str]], set[str]] = {}


def _covers_all(corpus: Any, chunk_ids: list[str], stems: list[str], view: Any = None) -> bool:
    """True when every chunk in ``chunk_ids`` contains every stem (body or heading); for a
    document a scrubbed ``view`` scrubs (:mod:`node.corpus.views`), in its scrubbed text —
    what the view's index holds — so a scrubbed value never decides the early stop."""
    if not chunk_ids or not stems:
        return False
    entries = corpus.snapshots.chunks.get_many(chunk_ids)
    if len(entries) < len(set(chunk_ids)):
        return False
    want = set(stems)
    for cid, entry in entries.items():
        text, headings, doc_id = entry.text, entry.headings, entry.doc_id
        kinds = views.scrub_kinds(view.docs.get(doc_id)) if view is not None else frozenset()
        have = _stems_kept.get((cid, kinds))
        if have is None:
            if kinds:
                try:  # the chunk's text was scrubbed (and kept) when the view was built
                    text = scrub_cached(cid, text, kinds)
                    headings = scrub_many([h for h in headings if isinstance(h, str)], kinds)
                except ScrubFailed:
                    return False  # not strong: the other passes run (their index is scrubbed)
            have = search.text_stems(text + " " + " ".join(headings))
            keep(_stems_kept, (cid, kinds), have, STEMS_KEPT)
        if not want <= have:
            return False
    return True


def may_stop_early(plan: Plan) -> bool:
    """True when :func:`baseline_strong` can fire for ``plan``: no exact units (the exact
    pass must run for them) and no expansion (only the rewrite pass searches them)."""
    return not plan.exact_units and not plan.expansions


def baseline_strong(corpus: Any, plan: Plan, ranked: list[tuple[str, float]],
                    view: Any = None) -> bool:
    """The early-stop rule: True when the baseline pass alone is strong enough — the query
    may stop early (:func:`may_stop_early`) and each of the baseline's top two chunks
    contains every query stem (body or heading path; scrubbed for a scrubbed ``view``)."""
    return may_stop_early(plan) and _covers_all(corpus, [c for c, _ in ranked[:2]], plan.stems, view)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
class _PassLoad:
    """What :func:`_run_beside` reads to decide whether a search's passes may run side by
    side: how many searches of this process are running their passes (counted by
    :func:`_counted`, under ``_pool_lock``), and the machine's last idle-core reading
    (:func:`_idle_core`, taken at most once a second).

    Attributes:
        in_flight: searches of this process running their passes now (0 when none).
        read_at: the :func:`time.monotonic` second of the last idle-core reading (-1.0:
            never read).
        idle: that reading (True: a core was idle).
    """

    __slots__ = ("in_flight", "read_at", "idle")

    def __init__(self) -> None:
        self.in_flight = 0
        self.read_at = -1.0
        self.idle = False


#: The process's one :class:`_PassLoad`.
_load = _PassLoad()


@contextlib.contextmanager
def _counted() -> Iterator[None]:
    """Count a search in :attr:`_PassLoad.in_flight` while it runs."""
    with _pool_lock:
        _load.in_flight += 1
    try:
        yield
    finally:
        with _pool_lock:
            _load.in_flight -= 1


def _idle_core() -> bool:
    """True when a core is left for a pass thread beside this search: the threads running
    on the machine now, this one among them (``/proc/loadavg``'s fourth field), are fewer
    than its cores; where that cannot be read, the 1-minute load average is below the core
    count minus one (it lags: a machine busy a minute ago reads busy); True where neither
    can be read. Read at most once a second (kept in :data:`_load`)."""
    now = time.monotonic()
    if now - _load.read_at >= 1.0:
        cores = os.cpu_count() or 1
        try:
            with open("/proc/loadavg", "rb") as fh:
                idle = int(fh.read().split()[3].split(b"/")[0]) < cores
        except (OSError, ValueError, IndexError):
            try:
                idle = os.getloadavg()[0] < cores - 1
            except OSError:
                idle = True
        _load.read_at, _load.idle = now, idle
    return _load.idle


def _run_beside() -> bool:
    """Whether a search's passes may run concurrently (:data:`PARALLEL_PASSES`): its value
    when True or False; with ``"auto"`` only when no other search of this process is in
    flight (the caller counted) and the machine has an idle core (:func:`_idle_core`)."""
    if PARALLEL_PASSES == "auto":
        return _load.in_flight <= 1 and _idle_core()
    return bool(PARALLEL_PASSES)


def _executor() -> ThreadPoolExecutor:
    """The process's pass executor (created on first use, recreated after a fork)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=PASS_WORKERS, thread_name_prefix="kith-pass")
        return _pool


def _forget_pool() -> None:  # a forked child has the pool object but not its threads
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


#: Built pass queries kept per generation (and per view of one), by question and tunables.
QUERIES_KEPT = 256


def pass_queries(holder: Any, searcher: Any, schema: Any, query: str, plan: Plan
                 ) -> tuple[dict[str, Any], str]:
    """``({pass name: tantivy query}, baseline field)`` of ``query`` on ``searcher``: built
    once per question and kept on ``holder`` (the :class:`~node.corpus.snapshot.Generation`
    searched, or the :class:`~node.corpus.snapshot.ViewAt` of a peer's view: the
    expansion's scarce words are counted in that index), at most :data:`QUERIES_KEPT`
    (then emptied). What a pass query is depends only on the question and the index
    it searches, both fixed for ``holder``; tantivy queries are immutable, so a kept one
    searches exactly as a new one. The plan's passes and key-term pairs
    (:data:`PROXIMITY_PAIRS`) and the tunables the builders read (boosts, the
    expansion's share and floor) are part of the key, so a tuning run that changes one
    between searches gets queries built with it. Callers must not mutate the dict."""
    key = (query, tuple(plan.passes), tuple(map(tuple, plan.pairs)), EXPANSION_SHARE, EXPANSION_FLOOR,
           EXPANSION_WEIGHT, EXPANSION_BOOST, PAIR_BOOST, PAIR_SLOP, REWRITE_SECTION_BOOST, REWRITE_TITLE_BOOST,
           IDS_KEPT, search.TITLE_BOOST, search.SECTION_BOOST, search.IDENT_BOOST, search.EXACT_FORM_BOOST,
           search.DEFINES_BOOST)
    kept = holder.queries.get(key)
    if kept is not None:
        return kept
    bq, field_used = search.baseline_query(schema, query)
    queries: dict[str, Any] = {"baseline-bm25": bq}
    if "exact-entity" in plan.passes:
        queries["exact-entity"] = search.exact_query(schema, query)
    if "rewrite-expanded" in plan.passes:
        queries["rewrite-expanded"] = rewrite_query(schema, plan)
    if "expansion" in plan.passes:
        queries["expansion"] = expansion_query(schema, plan, scarce_expansions(searcher, plan))
    return keep(holder.queries, key, (queries, field_used), QUERIES_KEPT)


def run_search(corpus: Any, query: str, *, limit: int, filters: dict[str, Any] | None = None,
               deadline: float | None = None,
               max_per_document: int = search.MAX_PER_DOCUMENT,
               extra_passes: dict[str, list[tuple[str, float]]] | None = None,
               lens: Lens | None = None,
               ) -> tuple[list[Hit], dict[str, Any]]:
    """Run the controller on ``corpus`` (a :class:`node.corpus.store.Corpus`).

    Args:
        corpus: the corpus (its SQLite record and tantivy index).
        query: user text (never parsed by tantivy's query parser).
        limit: hits wanted, 1–100.
        filters: normalized filters (:func:`node.answer.contract.validate`); fail closed.
        deadline: ``time.monotonic()`` instant; no pass starts after it.
        max_per_document: chunks allowed per document (2 = chunk-level dedupe,
            1 = document-level).
        extra_passes: ranked lists from outside tantivy (``{"dense": [(chunk_id, score)]}``,
            the optional hybrid extra) fused like any pass.
        lens: the view (:class:`node.corpus.lens.Lens`: the sources it may see or be
            asked about — the ``ask`` tier — and their scrub kinds). None = the owner's
            view (everything, on the whole-corpus index). A view that needs a new index
            is built outside the corpus lock (:meth:`Corpus.prepare_view
            <node.corpus.store.Corpus.prepare_view>`) before it is resolved for the
            search's generation (:meth:`node.corpus.snapshot.Snapshots.view_at`). The
            search reads one generation (:meth:`Corpus.snapshot
            <node.corpus.store.Corpus.snapshot>`) and never takes the corpus lock once
            its view is resolved. With a lens every pass runs on
            the view's own index (:mod:`node.corpus.views`): candidates, early stop,
            fusion, ``Hit.score`` and ``Hit.score_components`` (BM25 with the view's
            statistics, ranks over the view's lists) depend only on documents the view
            may see. ``extra_passes`` given by a caller are restricted to those too.

    Returns:
        ``(hits, controller)`` as documented on ``Corpus.search_hits``; ``controller``
        also has ``plan`` (the :class:`Plan` subqueries) and per-pass ``candidates``.

    Raises:
        CorpusError: ``query-invalid``, ``index-unavailable``.
    """
    if not isinstance(query, str) or not query.strip():
        raise CorpusError("query-invalid", "The field 'query' must be a non-empty string.")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
        raise CorpusError("query-invalid", "The limit must be an integer from 1 to 100.")
    if (isinstance(max_per_document, bool) or not isinstance(max_per_document, int)
            or max_per_document < 1):
        raise CorpusError("query-invalid", "maxPerDocument must be an integer >= 1.")
    filters = filters or {}
    plan = make_plan(query)
    controller: dict[str, Any] = {
        "mode": "bounded-multi-pass", "passes": [],
        "fusion": fusion_report(plan.passes),
        "maxPerDocument": max_per_document, "candidates": 0, "orphaned": 0,
        "filteredOut": 0, "withheldStale": 0, "dedupedPerDocument": 0,
        "collapsedDuplicates": 0, "returned": 0, "rounds": 0, "earlyStop": False, "stopReason": None,
        "indexLag": 0, "subqueries": plan.subqueries(),
    }

    def expired() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    # one generation, taken now, is all the search reads (node/corpus/snapshot.py): no lock
    gen = corpus.snapshot()
    if lens is not None and lens.key not in gen.views and not expired():
        corpus.prepare_view(lens)  # a new view index is built outside the lock
    with _counted():  # other searches of this process see this one (_run_beside)
        if expired():
            controller.update(earlyStop=True, stopReason="budget-exhausted")
            controller["passes"] = [{"name": p, "status": "skipped", "candidates": 0}
                                    for p in plan.passes]
            return [], controller
        view = None
        if lens is None:
            searcher = gen.searcher
        else:
            gen, view = corpus.snapshots.view_at(gen, lens, corpus)
            searcher = view.searcher()
        schema = gen.schema
        queries, field_used = pass_queries(view if view is not None else gen, searcher, schema, query, plan)
        depth = max(limit * 4, 40)
        dense_entry: dict[str, Any] | None = None
        if extra_passes is None:  # the optional dense pass (only when the owner turned it on)
            from node.corpus import dense

            if view is not None and view.scrubbed:
                # vectors are of the stored text: a scrubbed view never ranks by them
                extra_passes = None
                if gen.dense_on:
                    dense_entry = {"name": dense.PASS_NAME, "status": "skipped", "candidates": 0,
                                   "reason": "scrubbed-view"}
            else:
                extra_passes, dense_entry = dense.auto_pass(corpus, query, k=depth,
                                                            deadline=deadline, view=view,
                                                            gen=gen)
        hits: list[Hit] = []
        order: list[str] = []
        counts: dict[str, int] = {}
        ids = StoredIds(searcher, view.index if view is not None else corpus.record)
        while True:
            controller["rounds"] += 1
            doc_of: dict[str, str] = {}
            ranked: dict[str, list[tuple[Any, float]]] = {}
            passes: list[dict[str, Any]] = []
            saturated = False
            stop: str | None = None
            ahead: dict[str, Future[tuple[list[tuple[Any, float]], bool]]] = {}
            if not (controller["rounds"] == 1 and may_stop_early(plan)) and _run_beside():
                # start the other passes now, beside the baseline: the early stop cannot
                # fire (only in round 1, for a plan that may stop), so every one will run
                for name in plan.passes[1:]:
                    if queries.get(name) is not None and not expired():
                        ahead[name] = _executor().submit(run_pass, searcher, queries[name],
                                                         depth, ids)
            for name in plan.passes:
                if stop is not None:
                    if name in ahead:  # started beside the baseline; the early stop drops it
                        fut = ahead.pop(name)
                        fut.cancel() or fut.exception()
                    passes.append({"name": name, "status": "skipped", "candidates": 0,
                                   "reason": stop})
                    continue
                if name != "baseline-bm25" and name not in ahead and expired():
                    stop = "budget-exhausted"
                    passes.append({"name": name, "status": "skipped", "candidates": 0,
                                   "reason": stop})
                    continue
                q = queries.get(name)
                if q is None and name == "expansion":  # every expanded word is common there
                    passes.append({"name": name, "status": "skipped", "candidates": 0,
                                   "reason": "no-scarce-word"})
                    continue
                if q is None:  # nothing searchable (e.g. only punctuation): ran, found nothing
                    passes.append({"name": name, "status": "ran", "candidates": 0})
                    continue
                if name in ahead:
                    ranked[name], sat = ahead[name].result()
                else:
                    try:
                        ranked[name], sat = run_pass(searcher, q, depth, ids)
                    except BaseException:
                        for fut in ahead.values():  # never leave a pass running unowned
                            fut.cancel() or fut.exception()
                        raise
                saturated |= sat
                entry = {"name": name, "status": "ran", "candidates": len(ranked[name])}
                if name == "baseline-bm25":
                    entry["field"] = field_used
                passes.append(entry)
                if (name == "baseline-bm25" and controller["rounds"] == 1
                        and may_stop_early(plan)
                        and baseline_strong(corpus, plan,
                                            [(ids.cid(k), sc) for k, sc in ranked[name][:2]],
                                            view)):
                    stop = "baseline-strong"
            for fut in ahead.values():  # all started passes are finished before fusion
                fut.exception()
            if extra_passes:
                # lists from outside tantivy name chunks: fuse everything by chunk id
                for name in list(ranked):
                    ranked[name] = [(ids.cid(k), sc) for k, sc in ranked[name]]
                doc_of.update(ids.ids.values())
                # lexical corroboration (issue 40): when no word of the question is in the
                # searched index, the dense pass's nearest chunks are near misses, not
                # answers — the search answers nothing (no-verified-results)
                unmatched = not any(ranked.values())
                for name, extra in extra_passes.items():
                    known = [] if unmatched else [
                        (c, s) for c, s in extra
                        if (c in doc_of or _doc_of(corpus, c, doc_of))
                        and (view is None or doc_of[c] in view.docs)]
                    ranked[name] = known
                    passes.append({**(dense_entry or {}), "name": name, "status": "ran",
                                   "candidates": len(known),
                                   **({"reason": "no-lexical-match"} if unmatched else {})})
                    tier = (dense_entry or {}).get("tier")
                    controller["fusion"] = fusion_report(
                        [*controller["fusion"]["weights"], *extra_passes], tier)
            elif dense_entry is not None:  # dense on but skipped: say why
                passes.append(dict(dense_entry))
            if stop is not None:
                controller.update(earlyStop=True, stopReason=stop)
            fused = fuse(ranked, controller["fusion"]["weights"], controller["fusion"]["method"])
            base = ranked.get("baseline-bm25") or []
            top_bm25 = base[0][1] if base else 0.0
            bm25_of = dict(base)
            power = support_power((dense_entry or {}).get("tier") if ranked.get("dense")
                                  else None)

            def strength(k: Any) -> float:  # 0 when the baseline did not find the chunk
                if top_bm25 <= 0:
                    return 0.0
                return (bm25_of.get(k, 0.0) / top_bm25) ** power

            fused = aggregate_documents(
                fused, lambda k: (ids(k)[1] if not isinstance(k, str)
                                  else doc_of.get(k)), AGGREGATE_WINDOW * limit,
                strength if power else None)
            if ranked.get("dense") and RARE_TERM_GUARD:  # after the support: none lifts past it
                fused = guard_rare_terms(fused, ranked, searcher, schema, plan, ids)
            key_of: dict[str, Any] = {}
            order = _Order(fused, ids, doc_of, key_of)
            counts = {k: 0 for k in ("orphaned", "filteredOut", "withheldStale",
                                     "dedupedPerDocument", "collapsedDuplicates")}
            hits = _materialize(corpus, gen, order, doc_of, lambda c: fused[key_of[c]], filters,
                                limit, max_per_document, counts, view)
            if len(hits) >= limit or not saturated or depth >= MAX_DEPTH or expired():
                break
            depth = min(depth * 4, MAX_DEPTH)
        raw = {name: dict(h) for name, h in ranked.items()}
        for h in hits:  # each hit's dict is its own (made empty by _materialize)
            h.score_components.update(_components(key_of[h.chunk_id], raw, fused))
        controller["passes"] = passes
        controller["candidates"] = len(order)
        controller.update(counts)
        controller["indexLag"] = gen.chunks.index_lag()  # the record's now, not the generation's
        controller["returned"] = len(hits)
        return hits, controller


def fusion_report(passes: Iterable[str], tier: str | None = None) -> dict[str, Any]:
    """The controller's ``fusion`` block for ``passes`` fused with a dense pass of
    ``tier`` (None: none ran): ``{"method", "weights"}`` plus ``k`` for RRF or
    ``normalisation`` for the weighted sum (:func:`fusion_method`)."""
    weights = {p: pass_weight(p, tier) for p in passes}
    method = fusion_method(tier)
    if method == "rrf":
        return {"method": "rrf", "k": search.RRF_K, "weights": weights}
    return {"method": method, "normalisation": {p: NORMALISATION.get(p, "max") for p in weights},
            "weights": weights}


def _components(cid: Any, raw: dict[str, dict[Any, float]], fused: dict[Any, float]
                ) -> dict[str, float]:
    out = {COMPONENT.get(name, name): round(scores.get(cid, 0.0), 6) for name, scores in raw.items()}
    out.setdefault("bm25", 0.0)
    out["rrf"] = round(fused[cid], 6)
    return out


def _doc_of(corpus: Any, cid: str, doc_of: dict[str, str]) -> bool:
    entry = corpus.snapshots.chunks.get_many([cid]).get(cid)
    if entry is None:
        return False
    doc_of[cid] = entry.doc_id
    return True


def _served(docs: dict[str, DocEntry], doc: DocEntry, origins: sources.SourceNormalizer
            ) -> tuple[bool, str | None]:
    """Serve-time origin check (DESIGN §9, seed ``provider-origins``): ``(served,
    canonical id of the origin)``, the file resolved once
    (:meth:`node.corpus.sources.SourceNormalizer.served_file`).

    A file chunk is served only while its file is still inside its (resolved) root
    — symlinks resolved — and unchanged: same size and mtime, or same size and
    SHA-256. An archive member is checked through its archive's row the same way.
    A datasource record's origin is its record id: it is served while its row is
    ``done`` (the caller only passes ``done`` rows). The id is what
    :class:`node.corpus.sources.SourceNormalizer` gives the document's source (None
    when it has none); a document not served gets ``(False, None)``.
    """
    origin = doc.origin
    if origin == "record":
        return True, origins(doc.source_id)
    if origin == "member":
        parent = docs.get(doc.parent_doc_id or "")
        if parent is None or parent.origin != "archive" or not _served(docs, parent, origins)[0]:
            return False, None
        return True, origins(doc.source_id)
    found = origins.served_file(doc.root_prefix, doc.rel_path)
    if found is None:
        return False, None
    real, st, canonical = found
    if not stat.S_ISREG(st.st_mode) or st.st_size != doc.size:
        return False, None
    if st.st_mtime_ns == doc.mtime_ns:
        return True, canonical
    try:
        with open(real, "rb") as fh:
            same = hashlib.file_digest(fh, "sha256").hexdigest() == doc.content_hash
    except (OSError, ValueError):
        return False, None
    return (True, canonical) if same else (False, None)


def _filtered_as(view: Any, doc_id: str, source_id: str, metadata: dict[str, Any]
                 ) -> tuple[str, dict[str, Any]]:
    """The source id and metadata a request's filters are matched against: for a document
    a scrubbed ``view`` scrubs, as the peer receives them (node/common/scrub.py), so a
    ``sources`` glob naming a scrubbed value is no oracle on it; a scrubbing failure
    matches nothing (fail closed)."""
    kinds = views.scrub_kinds(view.docs.get(doc_id)) if view is not None else frozenset()
    if not kinds:
        return source_id, metadata
    try:
        sid, _, meta = scrub_fields(source_id, [], metadata, kinds)
    except ScrubFailed:
        return "", {"\x00": None}
    return sid, meta


def _materialize(corpus: Any, gen: Generation, order: Sequence[str], doc_of: dict[str, str],
                 score_of: Callable[[str], float], filters: dict[str, Any], limit: int,
                 max_per_document: int, counts: dict[str, int], view: Any = None) -> list[Hit]:
    """Turn fused candidates into hits: document checks first (the generation's
    document entry, filters, per-document cap, serve-time origin), then chunk entries
    (:class:`node.corpus.snapshot.ChunkTable`) for the survivors only. A candidate whose
    document is not ``done`` in the generation, or whose chunk is not in the record or
    was read under another content hash than the generation's, is ignored (the record is
    authoritative; a hit never mixes two versions of a document).

    ``order`` is read front to back (it may resolve chunk ids as it is read, filling
    ``doc_of`` for each id it hands out); ``score_of(chunk_id)`` is the fused score.
    Hits carry no ``score_components`` (the controller adds them).

    Duplicates collapse (issue 20 item 6): a chunk whose text is exactly that of a hit
    already kept, from another document, is not a hit of its own but one of that hit's
    ``duplicates`` (counted in ``collapsedDuplicates``, not towards ``limit``); a
    repeat inside the same document is dropped (``dedupedPerDocument``). Documents
    with the same ``content_hash`` share one per-document cap, so ``max_per_document``
    1 gives one result per distinct content. For a scrubbed ``view`` the filters see each
    scrubbed document's source id and metadata as the peer does (:func:`_filtered_as`).
    Only candidates of this search take part
    — for a peer, its view's (its lens's) — so a copy outside the view never changes
    what the view receives."""
    docs = gen.docs
    origins = gen.origins  # the roots' real folders: resolved once per generation

    serve: dict[str, bool] = {}
    origin_of: dict[str, str | None] = {}  # doc_id -> canonical id of its served origin
    meta_of: dict[str, dict[str, Any]] = {}
    per_doc: dict[str, int] = {}
    per_content: dict[str, int] = {}  # kept hits per document content (content_hash)
    first_of: dict[str, Hit] = {}  # chunk text -> the kept hit with that text
    stale: list[str] = []
    hits: list[Hit] = []
    i = 0
    while len(hits) < limit and i < len(order):
        batch: list[str] = []
        while i < len(order) and len(hits) + len(batch) < limit:
            cid = order[i]
            i += 1
            did = doc_of[cid]
            drow = docs.get(did)
            if drow is None:
                counts["orphaned"] += 1
                continue
            if did not in meta_of:  # the hit's own copy: the answer may change it
                meta_of[did] = dict(drow.metadata)
            if filters and not search.passes_filters(*_filtered_as(view, did, drow.source_id, meta_of[did]),
                                                     filters):
                counts["filteredOut"] += 1
                continue
            if per_doc.get(did, 0) >= max_per_document:
                counts["dedupedPerDocument"] += 1
                continue
            if did not in serve:
                serve[did], origin_of[did] = _served(docs, drow, origins())
                if not serve[did]:
                    stale.append(did)
            if not serve[did]:
                counts["withheldStale"] += 1
                continue
            per_doc[did] = per_doc.get(did, 0) + 1
            batch.append(cid)
        if not batch:
            break
        rows = gen.chunks.get_many(batch)
        for cid in batch:
            row = rows.get(cid)
            did = doc_of[cid]
            drow = docs[did]
            if row is None or row.doc_id != did or row.content_hash != drow.content_hash:
                counts["orphaned"] += 1
                per_doc[did] -= 1
                continue
            loc = row.location
            hit = Hit(
                chunk_id=cid, source_id=drow.source_id, text=row.text,
                score=score_of(cid),
                location={**loc, "headingPath": list(loc["headingPath"])},
                content_hash=drow.content_hash or "", indexed_at=drow.indexed_at or "",
                root_prefix=None if drow.origin == "record" else drow.root_prefix,
                rel_path=None if drow.origin == "record" else drow.rel_path,
                metadata=meta_of[did], origin_id=origin_of[did],
            )
            same = first_of.get(hit.text)
            content = hit.content_hash or did
            if same is not None or per_content.get(content, 0) >= max_per_document:
                per_doc[did] -= 1
                if same is not None and doc_of[same.chunk_id] != did:
                    same.duplicates.append(hit)
                    counts["collapsedDuplicates"] += 1
                else:  # a repeat inside one document, or a copy's cap is spent
                    counts["dedupedPerDocument"] += 1
                continue
            per_content[content] = per_content.get(content, 0) + 1
            first_of[hit.text] = hit
            hits.append(hit)
    if stale and corpus.record.lock.acquire(blocking=False):  # best effort: never wait
        try:
            corpus.record.flag_stale(stale)
        finally:
            corpus.record.lock.release()
    return hits
