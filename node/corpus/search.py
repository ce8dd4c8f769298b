"""Retrieval core: analyzers, the tantivy schema, query construction, filters, fusion.

Nothing here parses user text with tantivy's query parser: queries are built term by
term from the analyzer's own output, so no user input can raise a query-parser error
(DESIGN §9). Two analyzers are registered on every index handle:

- ``kith_en`` (fields ``body``, ``title``): simple tokenizer, long-token removal,
  lowercase, ASCII folding (``cafe`` finds ``café``), English stopwords removed (so
  "the"/"that" never dominate a query), English Snowball stemming (``deleted`` finds
  ``delete``).
- ``kith_exact`` (field ``exact``, with positions): the same without stopwords and
  stemming; used by the exact pass for quoted phrases and identifier-like tokens, and
  as the fallback when a query is made only of stopwords.

CJK runs are pre-split in Python into overlapping bigrams (``故乡`` stays ``故乡``,
``低头思故乡`` becomes ``低头 头思 思故 故乡``) before either analyzer sees the text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import tantivy

#: Bump when the schema or analyzers change: an index of another version is rebuilt.
INDEX_SCHEMA_VERSION = 2
RRF_K = 60
#: Default cap of chunks per document in one result list (document-level dedup).
MAX_PER_DOCUMENT = 2
#: Boost of heading-path/file-name matches relative to body matches (scripts/eval).
TITLE_BOOST = 0.3
#: Boost of a match on the user's unstemmed word form (``exact`` field) in the baseline:
#: stemming conflates ``prints`` with the ubiquitous ``print``; the exact form keeps the
#: user's precision (measured with scripts/eval).
EXACT_FORM_BOOST = 1.0

# CJK Unified Ideographs (+ext A), Hiragana, Katakana, Hangul syllables.
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]{2,}")
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”")
_IDENT = re.compile(r"(?<![\w.])(?:[A-Za-z_]\w*(?:[.:/_-]\w+)+|\w*\d\w*(?:[.:/_-]\w+)*)(?![\w])")


def cjk_bigrams(text: str) -> str:
    """Replace each run of >= 2 CJK characters with its space-separated bigrams."""
    if text.isascii():  # the common case, checked at C speed
        return text

    def _bi(m: re.Match[str]) -> str:
        run = m.group(0)
        return " " + " ".join(run[i:i + 2] for i in range(len(run) - 1)) + " "
    return _CJK_RUN.sub(_bi, text)


@lru_cache(maxsize=1)
def analyzers() -> tuple[Any, Any]:
    """Return ``(kith_en, kith_exact)`` :class:`tantivy.TextAnalyzer` objects (cached)."""
    en = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
          .filter(tantivy.Filter.remove_long(64))
          .filter(tantivy.Filter.lowercase())
          .filter(tantivy.Filter.ascii_fold())
          .filter(tantivy.Filter.stopword("english"))
          .filter(tantivy.Filter.stemmer("english"))
          .build())
    exact = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
             .filter(tantivy.Filter.remove_long(64))
             .filter(tantivy.Filter.lowercase())
             .filter(tantivy.Filter.ascii_fold())
             .build())
    return en, exact


def build_schema() -> Any:
    """The tantivy schema: ``chunk_id`` and ``doc_id`` (raw, stored), ``body`` and
    ``title`` (``kith_en``), ``exact`` (``kith_exact`` with positions)."""
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("chunk_id", stored=True, tokenizer_name="raw")
    sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("body", tokenizer_name="kith_en", index_option="freq")
    sb.add_text_field("title", tokenizer_name="kith_en", index_option="freq")
    sb.add_text_field("exact", tokenizer_name="kith_exact", index_option="position")
    return sb.build()


def register_analyzers(index: Any) -> None:
    """Register both analyzers on an index handle (needed again after ``Index.open``)."""
    en, exact = analyzers()
    index.register_tokenizer("kith_en", en)
    index.register_tokenizer("kith_exact", exact)


def title_text(source_id: str, heading_path: Sequence[str]) -> str:
    """Text of the ``title`` field: heading path plus the file name's words."""
    name = source_id.rsplit("/", 1)[-1]
    for suffix in (".rst.txt", ".markdown", ".md", ".rst", ".txt", ".text", ".html", ".htm",
                   ".pdf", ".docx", ".json", ".jsonl", ".csv", ".tsv"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return " / ".join([*heading_path, name.replace("_", " ").replace("-", " ")])


def make_document(chunk_id: str, doc_id: str, text: str, title: str) -> Any:
    """Build the tantivy document for one chunk."""
    body = cjk_bigrams(text)
    return tantivy.Document(chunk_id=chunk_id, doc_id=doc_id, body=body,
                            title=cjk_bigrams(title), exact=body)


def _unique(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out


#: Query-side stopwords (folded): the question and function words people type in plain
#: requests ("how do I…", "what is my…") on top of the index analyzer's short list. They
#: are dropped from queries only (the index keeps them, so the exact pass and phrase
#: matching still see them); a query made only of them falls back to its exact words.
QUERY_STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before
being below between both but by can could did do does doing done down during each else
ever every few for from further get gets getting got had has have having he her here
hers herself him himself his how i if in into is it its itself just let lets like make
makes making me more most much must my myself need needs no nor not now of off on once
one only or other our ours ourselves out over own same shall she should so some such
than that the their theirs them themselves then there these they this those through to
too under until up upon us use used using very want wants was way we were what when
where whether which while who whom why will with within without would you your yours
yourself yourselves
""".split())


def text_stems(text: str) -> set[str]:
    """Every stemmed, folded term of a text (the index analyzer's view; for coverage)."""
    return set(analyzers()[0].analyze(cjk_bigrams(text)))


def key_terms(query: str) -> list[str]:
    """The user's key terms, for display and coverage: folded words that survive both the
    analyzer's stopword filter and :data:`QUERY_STOPWORDS`, in query order (unstemmed)."""
    en, exact = analyzers()
    out = []
    for word in exact.analyze(cjk_bigrams(query)):
        if word not in QUERY_STOPWORDS and en.analyze(word):
            out.append(word)
    return _unique(out)


def query_terms(query: str) -> list[str]:
    """Stemmed, folded, stopword-free terms of ``query`` (dedup, in query order)."""
    en = analyzers()[0]
    return _unique(t for w in key_terms(query) for t in en.analyze(w))


def exact_terms(text: str) -> list[str]:
    """Folded terms without stemming or stopword removal (positions kept, not dedup)."""
    return list(analyzers()[1].analyze(cjk_bigrams(text)))


def exact_units(query: str) -> list[list[str]]:
    """Phrases for the exact pass: each quoted phrase and each identifier-like token
    (``os.path.join``, ``E1234``, ``8080``) as its list of exact terms."""
    units: list[list[str]] = []
    for m in _QUOTED.finditer(query):
        terms = exact_terms(m.group(1) or m.group(2) or "")
        if terms:
            units.append(terms)
    unquoted = _QUOTED.sub(" ", query)
    for m in _IDENT.finditer(unquoted):
        terms = exact_terms(m.group(0))
        if terms:
            units.append(terms)
    out: list[list[str]] = []
    for u in units:
        if u not in out:
            out.append(u)
    return out


def baseline_query(schema: Any, query: str) -> tuple[Any | None, str]:
    """Build the baseline BM25 query: ``(query or None, field_used)``.

    OR of the stemmed terms over ``body`` plus ``title`` (boosted by
    :data:`TITLE_BOOST`) plus the unstemmed key words on ``exact`` (boosted by
    :data:`EXACT_FORM_BOOST`). A query of stopwords only falls back to the ``exact`` field.
    """
    terms = query_terms(query)
    Q = tantivy.Query
    if terms:
        subs = []
        for t in terms:
            subs.append((tantivy.Occur.Should, Q.term_query(schema, "body", t)))
            subs.append((tantivy.Occur.Should,
                         Q.boost_query(Q.term_query(schema, "title", t), TITLE_BOOST)))
        for t in key_terms(query):  # the user's exact word form scores on top of its stem
            subs.append((tantivy.Occur.Should,
                         Q.boost_query(Q.term_query(schema, "exact", t), EXACT_FORM_BOOST)))
        return Q.boolean_query(subs), "body"
    fallback = _unique(exact_terms(query))
    if not fallback:
        return None, "none"
    return Q.boolean_query([(tantivy.Occur.Should, Q.term_query(schema, "exact", t))
                            for t in fallback]), "exact"


def exact_query(schema: Any, query: str) -> Any | None:
    """Build the exact-entity query (OR of phrase/term queries on ``exact``), or None."""
    Q = tantivy.Query
    subs = []
    for unit in exact_units(query):
        q = (Q.term_query(schema, "exact", unit[0]) if len(unit) == 1
             else Q.phrase_query(schema, "exact", unit))
        subs.append((tantivy.Occur.Should, q))
    return Q.boolean_query(subs) if subs else None


# --- filters -------------------------------------------------------------------------

@lru_cache(maxsize=256)
@functools.lru_cache(maxsize=512)
def source_glob(glob: str) -> Any:
    """The ``sources`` filter glob as a compiled matcher: the policy's glob language
    (``*``/``?`` within a segment, ``**`` a whole segment; a trailing ``/`` means everything
    below) and its linear-time :class:`node.corpus.globs.GlobMatcher` — never a
    backtracking regex a peer could make explode.

    Raises:
        PolicyError: ``policy-bad-glob`` for a glob outside that language.
    """
    from node.corpus.globs import GlobMatcher, canonical_glob

    return GlobMatcher(canonical_glob(glob + "**" if glob.endswith("/") else glob))


_META_KEYS = {"project": "project", "lifecycle": "lifecycle", "workType": "workType",
              "tags": "tags", "sourceSets": "sourceSet"}


def passes_filters(source_id: str, metadata: dict[str, Any], filters: dict[str, Any]) -> bool:
    """True when a document satisfies every filter (OR within a field, AND across).

    Fails closed: a filter on a value the document does not have excludes it
    (DESIGN §9). File documents carry no metadata in this cut, so only ``sources``
    can select them.
    """
    for key, want in filters.items():
        if key == "sources":
            if not any(source_glob(g).match(source_id) for g in want):
                return False
        elif key in _META_KEYS:
            have = metadata.get(_META_KEYS[key])
            if have is None:
                return False
            have_set = set(have) if isinstance(have, (list, tuple)) else {have}
            if not have_set & set(want):
                return False
        elif key == "date":
            if metadata.get("date") is None or str(metadata["date"])[:10] not in want:
                return False
        elif key == "dateRange":
            d = metadata.get("date")
            if d is None:
                return False
            d = str(d)[:10]
            if ("from" in want and d < want["from"]) or ("to" in want and d > want["to"]):
                return False
        else:  # unknown filter key: fail closed
            return False
    return True
