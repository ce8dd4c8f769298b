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

import re
from collections.abc import Container, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import tantivy

from node.corpus.globs import source_glob
# the dedupe cap lives beside the result types, so that the answer contract reads it without
# importing tantivy; store and retrieval read it here as search.MAX_PER_DOCUMENT
from node.corpus.types import MAX_PER_DOCUMENT  # noqa: F401

#: Bump when the schema or analyzers change: an index of another version is rebuilt by
#: the next writer (``kith index sync``, start-up repair) and refused with
#: ``index-unavailable`` by a reader until then (node/corpus/store.py). 3 (issue 10): the
#: ``title`` field holds the page title only, section headings moved to ``section``, and
#: the ``ident`` field holds whole identifiers. 4 (issue 31): the chunk and document ids
#: are also u64 fast fields (:data:`ID_FAST_FIELDS`), read per candidate in one columnar
#: batch instead of a stored-document fetch each.
INDEX_SCHEMA_VERSION = 5
# 5 (issue 40): the ``defines`` field (what a chunk defines: headings, object directives
# with their module, :func:`definition_terms`).
RRF_K = 60
#: Boost of a page-title match (the document's first heading and its file name's words)
#: relative to body matches, and of a section-heading match (the rest of the heading
#: path). A release note, tutorial or FAQ *section* titled after a module no longer
#: scores like the module's own page. scripts/eval --split dev nDCG@10 python-docs /
#: postgresql (with the retrieval weights and document aggregation of issue 10): one
#: field for the whole path at 0.3 → 0.678 / 0.672; page 0.3 + section 0.3 → 0.661 /
#: 0.682; page 0.3 + section 0.1 → 0.677 / 0.674; page 0.3 + section 0 → 0.679 / 0.674;
#: page 0.6 or 1.0 lower on both. Section headings still count in the rewrite pass.
TITLE_BOOST = 0.3
SECTION_BOOST = 0.0
#: Boost of a whole-identifier match (``ident`` field: ``os.path.join``, ``__init__``,
#: ``max_connections``, ``3.11``) on top of the split parts' body matches. The dev split
#: has almost no identifier questions (0.5, 1 and 2 score the same there); 2 is what makes
#: the defining page beat a page repeating the parts (tests/test_retrieval_identifiers.py).
IDENT_BOOST = 2.0
#: Boost of a match on the user's unstemmed word form (``exact`` field) in the baseline:
#: stemming conflates ``prints`` with the ubiquitous ``print``; the exact form keeps the
#: user's precision (measured with scripts/eval).
EXACT_FORM_BOOST = 1.0
#: Boost of a match on what a chunk *defines* (``defines`` field,
#: :func:`definition_terms`): a query naming ``textwrap.dedent`` finds the chunk of its
#: ``.. function:: dedent`` under ``.. module:: textwrap`` above release notes and
#: tutorials that spell the dotted name (``ident``, :data:`IDENT_BOOST`) and mention it.
DEFINES_BOOST = 4.0
#: Bare query words (``dedent``) are matched against the defined names only in a query
#: of at most this many key words (a name looked up); longer queries match whole
#: identifiers (``textwrap.dedent``, ``max_connections``) and the whole query (a heading
#: typed as it is) only. Bare words in every query cost the plain-language sets, whose
#: everyday words (``read``, ``open``, ``copy``) are the names of many methods:
#: scripts/eval python-docs dev nDCG@10 0.706 → 0.691, legacy 0.698 → 0.594 (boost 4;
#: boost 1: 0.711 / 0.691); at most 2 key words: unchanged on both.
DEFINES_BARE_WORDS = 2

# CJK Unified Ideographs (+ext A), Hiragana, Katakana, Hangul syllables.
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]{2,}")
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”")
#: A whole identifier: a dotted name (``os.path.join``, ``pg_stat_activity.query``), a
#: name with underscores (``__init__``, ``max_connections``, ``PYTHON_GIL``), a number with
#: separators (``3.11``, ``1,000``, ``1e-5``) — what the simple tokenizer splits.
_WHOLE = re.compile(r"(?<![\w.])(?:_*[A-Za-z][\w]*(?:\.\w+)+|\w*_\w*|\d+(?:[.,:eE-]\d+)+)(?![\w])")
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


_DIGIT_SEP = re.compile(r"\d[,:eE-]\d")
#: Where a whitespace-separated token can hold a :data:`_WHOLE` match: a ``_``, a ``.``
#: before another character of the token, or a digit-separator-digit. Led by one
#: character class, which ``re`` scans for at C speed (an alternation is tried whole at
#: every character); ASCII digits for ASCII text, Unicode ``\d`` (what :data:`_WHOLE`
#: and :data:`_DIGIT_SEP` mean) otherwise.
_CANDIDATE_ASCII = re.compile(r"[_.0-9](?:(?<=_)|(?<=\.)\S|(?<=[0-9])[,:eE-][0-9])")
_CANDIDATE = re.compile(r"[_.\d](?:(?<=_)|(?<=\.)\S|(?<=\d)[,:eE-]\d)")
_RUN = re.compile(r"\S*")


def _candidate_tokens(text: str) -> Iterator[str]:
    """The whitespace-separated tokens of ``text`` (``str.split()``'s) that contain a
    :data:`_CANDIDATE`, in order, each once.

    Found from the candidates outwards (``\\S`` is ``str.split()``'s whitespace test,
    ``Py_UNICODE_ISSPACE``): the text is scanned once at C speed and only the few tokens
    that can hold an identifier are looked at in Python, instead of every token."""
    search = (_CANDIDATE_ASCII if text.isascii() else _CANDIDATE).search
    hit = search(text)
    if hit is None:
        return
    run = _RUN.match
    rev = text[::-1]
    last = len(text) - 1
    while hit is not None:
        p = hit.start()
        start = p + 1 - (run(rev, last - p).end() - (last - p))
        end = run(text, p).end()
        yield text[start:end]
        hit = search(text, end)


def _whole_matches(text: str) -> Iterator[re.Match[str]]:
    """The matches of :data:`_WHOLE` in ``text``, in order: one scan over its candidate
    tokens joined by spaces (positions are in that string; the words are those of
    ``_WHOLE.finditer(text)``, see :func:`identifiers`)."""
    return _WHOLE.finditer(" ".join(_candidate_tokens(text)))


@lru_cache(maxsize=65_536)
def _word_identifiers(whole: str) -> tuple[str, ...]:
    """What one :data:`_WHOLE` match adds to :func:`identifiers` (cached: names repeat)."""
    word = whole.lower().strip(".,:-")
    if not word.strip("_") or len(word) > 64 or (
            "." in word and max(map(len, word.split("."))) < 2):  # e.g, i.e
        return ()
    if "." in word and not word[0].isdigit():
        parts = word.split(".")
        return (word, *(".".join(parts[i:]) for i in range(1, len(parts) - 1)))
    return (word,)


def identifiers(text: str) -> list[str]:
    """The whole identifiers of ``text`` (:data:`_WHOLE`), lowercased, in order, for the
    ``ident`` field; a dotted name also yields each of its dotted suffixes
    (``os.path.join`` → ``os.path.join``, ``path.join``), so ``path.join`` finds it.
    Pure underscores and identifiers over 64 characters are skipped.

    A match consists of ``[\\w.,:-]`` only, so it never spans whitespace, and whitespace
    satisfies both of its look-arounds: scanning only the whitespace-separated tokens that
    can hold one (:func:`_candidate_tokens`), joined by single spaces, gives exactly the
    matches of the whole text. Python's ``re`` with Unicode ``\\w`` costs ~100 ns per
    character of a scan, which made this the largest part of a full sync (issue 10 item
    6)."""
    out: list[str] = []
    for m in _whole_matches(text):
        out.extend(_word_identifiers(m.group(0)))
    return out


#: The index's fields in schema order, ``(name, tokenizer, index option, stored)``:
#: ``chunk_id`` and ``doc_id`` (raw, stored), ``body``, ``title`` (page title) and
#: ``section`` (section headings) with ``kith_en``, ``ident`` (raw, one token per whole
#: identifier), ``exact`` (``kith_exact`` with positions), ``defines`` (raw, what the chunk
#: defines: :func:`definition_terms`). ``scripts/bench_corpus.py --ablation`` builds its
#: variants from this table.
SCHEMA_FIELDS: tuple[tuple[str, str, str, bool], ...] = (
    ("chunk_id", "raw", "position", True),
    ("doc_id", "raw", "basic", True),
    ("body", "kith_en", "freq", False),
    ("title", "kith_en", "freq", False),
    ("section", "kith_en", "freq", False),
    ("ident", "raw", "freq", False),
    ("exact", "kith_exact", "position", False),
    ("defines", "raw", "freq", False),
)


#: The ids as u64 fast fields (columnar, not indexed, not stored): a chunk id's 32 hex
#: digits as two 64-bit halves, a document id's ``d`` + 24 hex digits as its first 64 bits
#: and its last 32 bits plus :data:`_PACKED` (so a present value is never 0). A chunk
#: whose ids are not of that shape has none of them and is read from the doc store.
ID_FAST_FIELDS = ("chunk_hi", "chunk_lo", "doc_hi", "doc_lo")
_PACKED = 1 << 32
_HEX = frozenset("0123456789abcdef")


def build_schema(fields: Iterable[tuple[str, str, str, bool]] = SCHEMA_FIELDS) -> Any:
    """The tantivy schema of ``fields`` (default :data:`SCHEMA_FIELDS`, the product's),
    always with the :data:`ID_FAST_FIELDS`."""
    sb = tantivy.SchemaBuilder()
    for name, tokenizer, option, stored in fields:
        sb.add_text_field(name, stored=stored, tokenizer_name=tokenizer, index_option=option)
    for name in ID_FAST_FIELDS:
        sb.add_unsigned_field(name, fast=True)
    return sb.build()


def pack_ids(chunk_id: str, doc_id: str) -> tuple[int, int, int, int] | None:
    """The :data:`ID_FAST_FIELDS` values of a chunk, or None when its ids are not a
    32-hex chunk id and a ``d`` + 24-hex document id (node/corpus/ingest.py's shapes)."""
    if len(chunk_id) != 32 or len(doc_id) != 25 or doc_id[0] != "d" \
            or not _HEX.issuperset(chunk_id) or not _HEX.issuperset(doc_id[1:]):
        return None
    return (int(chunk_id[:16], 16), int(chunk_id[16:], 16), int(doc_id[1:17], 16),
            int(doc_id[17:], 16) | _PACKED)


def unpack_ids(chunk_hi: Any, chunk_lo: Any, doc_hi: Any, doc_lo: Any) -> tuple[str, str] | None:
    """``(chunk_id, doc_id)`` from :func:`pack_ids`' values, or None when absent (a value
    None: the chunk has no fast ids, or its segment predates them)."""
    if doc_lo is None or chunk_hi is None or chunk_lo is None or doc_hi is None or doc_lo < _PACKED:
        return None
    return f"{chunk_hi:016x}{chunk_lo:016x}", f"d{doc_hi:016x}{doc_lo - _PACKED:08x}"


def register_analyzers(index: Any) -> None:
    """Register both analyzers on an index handle (needed again after ``Index.open``)."""
    en, exact = analyzers()
    index.register_tokenizer("kith_en", en)
    index.register_tokenizer("kith_exact", exact)


def title_text(source_id: str, heading_path: Sequence[str]) -> str:
    """A chunk's title as one line: heading path plus the file name's words (what the
    dense pass embeds; the index splits it, :func:`index_title`)."""
    return " / ".join([*heading_path, _name_words(source_id)])


def index_title(source_id: str, heading_path: Sequence[str]) -> tuple[str, str]:
    """``(page, section)`` text of a chunk's ``title`` and ``section`` fields: the page's
    first heading plus the file name's words, and the rest of the heading path (a
    heading repeating the page title is dropped)."""
    page = [*heading_path[:1], _name_words(source_id)]
    rest = [h for h in heading_path[1:] if h not in heading_path[:1]]
    return " / ".join(page), " / ".join(rest)


def _name_words(source_id: str) -> str:
    name = source_id.rsplit("/", 1)[-1]
    for suffix in (".rst.txt", ".markdown", ".md", ".rst", ".txt", ".text", ".html", ".htm",
                   ".pdf", ".docx", ".json", ".jsonl", ".csv", ".tsv"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name.replace("_", " ").replace("-", " ")


_CALL_SUFFIX = re.compile(r"\s*\(\s*\)\s*$")


def _name_key(name: str) -> str:
    """A defined name or a query as one ``defines`` token: folded like the ``exact``
    field (lowercase, ASCII folding), whitespace collapsed, a trailing ``()`` dropped."""
    folded = " ".join(exact_terms(name)) if not name.isascii() else name.lower()
    return " ".join(_CALL_SUFFIX.sub("", folded).split())


def definition_terms(defines: Iterable[str], headings: Iterable[str] = ()) -> list[str]:
    """The ``defines`` field's tokens for what a chunk defines (``headings``: its heading
    path; a defined name that is one of them is a heading).

    A named object (a directive's name): the name whole (folded, :func:`_name_key`) and,
    when dotted, each dotted suffix down to its last part (``textwrap.TextWrapper.wrap``
    → ``textwrap.textwrapper.wrap``, ``textwrapper.wrap``, ``wrap``). A heading: ``#``
    and its whole folded title (matched only by a query that is that title), and the
    whole identifiers it holds (:func:`identifiers`) — a heading's ordinary words are
    no name, so a query word meets them in ``title``/``section`` only."""
    heads = set(headings)
    out: list[str] = []
    for name in defines:
        key = _name_key(name)
        if not key or len(key) > 200:
            continue
        if name in heads:
            out.append("#" + key)
            out.extend(identifiers(name))
            continue
        out.append(key)
        if "." in key.strip("."):
            parts = [p for p in key.split(".") if p]
            out.extend(".".join(parts[i:]) for i in range(1, len(parts)))
    return _unique(out)


def definition_query_terms(query: str) -> list[str]:
    """The ``defines`` tokens a query may match: its whole identifiers (with their dotted
    suffixes), its unstemmed key words when it has at most :data:`DEFINES_BARE_WORDS`
    of them, and the whole
    query as a name and as a heading (``#`` + the folded query)."""
    terms = [*identifiers(query)]
    keys = key_terms(query)
    if len(keys) <= DEFINES_BARE_WORDS:
        terms.extend(keys)
    whole = _name_key(query)
    if whole:
        terms.extend((whole, "#" + whole))
    return _unique(terms)


def document_fields(chunk_id: str, doc_id: str, text: str, title: tuple[str, str],
                    fields: Container[str] | None = None,
                    defines: Sequence[str] = ()) -> dict[str, Any]:
    """The field values of one chunk's tantivy document (``title``: :func:`index_title`;
    ``defines``: the ``defines`` tokens, :func:`definition_terms`);
    ``ident`` and ``defines`` only when there are any. ``fields`` (default all) limits
    which optional fields are computed — ``scripts/bench_corpus.py --ablation`` times the
    sync without one; ``chunk_id``, ``doc_id`` and ``body`` are always there."""
    body = cjk_bigrams(text)
    page, section = title
    out: dict[str, Any] = {"chunk_id": chunk_id, "doc_id": doc_id, "body": body}
    if fields is None or "title" in fields:
        out["title"] = cjk_bigrams(page)
    if fields is None or "section" in fields:
        out["section"] = cjk_bigrams(section)
    if fields is None or "exact" in fields:
        out["exact"] = body
    if fields is None or "ident" in fields:
        idents = identifiers(text)
        if idents:  # a list is one value per item, as add_text("ident", word) each
            out["ident"] = idents
    if defines and (fields is None or "defines" in fields):
        out["defines"] = list(defines)
    return out


def make_document(chunk_id: str, doc_id: str, text: str, title: tuple[str, str],
                  defines: Sequence[str] = ()) -> Any:
    """Build the tantivy document for one chunk (``title``: :func:`index_title`;
    ``defines``: its :func:`definition_terms`), with its ids as fast fields when they pack
    (:func:`pack_ids`; added as unsigned values: a keyword argument above 2**63 would
    become a float)."""
    doc = tantivy.Document(**document_fields(chunk_id, doc_id, text, title, defines=defines))
    packed = pack_ids(chunk_id, doc_id)
    if packed is not None:
        for name, value in zip(ID_FAST_FIELDS, packed):
            doc.add_unsigned(name, value)
    return doc


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


#: Distinct strings whose analysis :func:`key_terms`, :func:`query_terms` and
#: :func:`exact_terms` each keep (least recently used dropped). One search analyses its
#: question, and each of its words, about 80 times across its plan and passes
#: (``scripts/bench_search``); the analysis is a pure function of the string.
TERMS_CACHE = 4096


def key_terms(query: str) -> list[str]:
    """The user's key terms, for display and coverage: folded words that survive both the
    analyzer's stopword filter and :data:`QUERY_STOPWORDS`, in query order (unstemmed).
    A new list each call (the analysis is kept, :data:`TERMS_CACHE`)."""
    return list(_key_terms(query))


@lru_cache(maxsize=TERMS_CACHE)
def _key_terms(query: str) -> tuple[str, ...]:
    en, exact = analyzers()
    out = []
    for word in exact.analyze(cjk_bigrams(query)):
        if word not in QUERY_STOPWORDS and en.analyze(word):
            out.append(word)
    return tuple(_unique(out))


#: An English contraction or possessive ending after a word (``user's``, ``don't``,
#: ``we'll``): the simple tokenizer splits it off as a word of its own (``s``, ``t``…).
_CONTRACTION = re.compile(r"(?<=\w)['’](?:s|t|d|ll|re|ve|m)\b", re.IGNORECASE)


def query_terms(query: str) -> list[str]:
    """Stemmed, folded, stopword-free terms of ``query`` (dedup, in query order).

    Contraction and possessive endings are not terms (:data:`_CONTRACTION`): ``the
    current user's home directory`` searches *current, user, home, directori*, not also
    ``s``, a stem of a quarter of the Python docs' chunks and of every "What's New" page
    title. The user's word forms (:func:`key_terms`, the ``exact`` clauses) keep them.
    A new list each call (the analysis is kept, :data:`TERMS_CACHE`)."""
    return list(_query_terms(query))


@lru_cache(maxsize=TERMS_CACHE)
def _query_terms(query: str) -> tuple[str, ...]:
    en = analyzers()[0]
    return tuple(_unique(t for w in _key_terms(_CONTRACTION.sub("", query)) for t in en.analyze(w)))


def exact_terms(text: str) -> list[str]:
    """Folded terms without stemming or stopword removal (positions kept, not dedup). A
    new list each call (the analysis is kept, :data:`TERMS_CACHE`)."""
    return list(_exact_terms(text))


@lru_cache(maxsize=TERMS_CACHE)
def _exact_terms(text: str) -> tuple[str, ...]:
    return tuple(analyzers()[1].analyze(cjk_bigrams(text)))


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
    :data:`EXACT_FORM_BOOST`) plus the whole identifiers on ``ident``
    (:data:`IDENT_BOOST`) plus what the query may name on ``defines``
    (:func:`definition_query_terms`, :data:`DEFINES_BOOST`). A query of stopwords only
    falls back to the ``exact`` field.
    """
    terms, idents, keys, named, fallback = _baseline_terms(query)
    Q = tantivy.Query
    if terms:
        subs = []
        for t in terms:
            subs.append((tantivy.Occur.Should, Q.term_query(schema, "body", t)))
            subs.append((tantivy.Occur.Should,
                         Q.boost_query(Q.term_query(schema, "title", t), TITLE_BOOST)))
            if SECTION_BOOST:
                subs.append((tantivy.Occur.Should,
                             Q.boost_query(Q.term_query(schema, "section", t), SECTION_BOOST)))
        for t in idents:  # the whole name on top of its parts
            subs.append((tantivy.Occur.Should,
                         Q.boost_query(Q.term_query(schema, "ident", t), IDENT_BOOST)))
        for t in keys:  # the user's exact word form scores on top of its stem
            subs.append((tantivy.Occur.Should,
                         Q.boost_query(Q.term_query(schema, "exact", t), EXACT_FORM_BOOST)))
        if DEFINES_BOOST:  # the chunk that defines a name above those that mention it
            for t in named:
                subs.append((tantivy.Occur.Should,
                             Q.boost_query(Q.term_query(schema, "defines", t), DEFINES_BOOST)))
        return Q.boolean_query(subs), "body"
    if not fallback:
        return None, "none"
    return Q.boolean_query([(tantivy.Occur.Should, Q.term_query(schema, "exact", t))
                            for t in fallback]), "exact"


@lru_cache(maxsize=512)
def _baseline_terms(query: str) -> tuple[tuple[str, ...], ...]:
    """The terms :func:`baseline_query` builds its clauses from, made once per query text
    (pure: the analyzers are fixed; cached like :func:`node.corpus.retrieval.make_plan`,
    since a host is asked the same questions again): ``(stems, whole identifiers, key
    words, defines terms, exact fallback terms)``; the fallback is only made when there
    are no stems."""
    terms = query_terms(query)
    if not terms:
        return (), (), (), (), tuple(_unique(exact_terms(query)))
    return (tuple(terms), tuple(_unique(identifiers(query))), tuple(key_terms(query)),
            tuple(definition_query_terms(query)), ())


def exact_query(schema: Any, query: str) -> Any | None:
    """Build the exact-entity query (OR of phrase/term queries on ``exact``, and of the
    query's whole identifiers on ``defines`` boosted by :data:`DEFINES_BOOST`: the chunk
    that defines ``textwrap.dedent`` is an exact match for it even where the text never
    spells it), or None."""
    Q = tantivy.Query
    subs = []
    for unit in exact_units(query):
        q = (Q.term_query(schema, "exact", unit[0]) if len(unit) == 1
             else Q.phrase_query(schema, "exact", unit))
        subs.append((tantivy.Occur.Should, q))
    if subs and DEFINES_BOOST:
        for t in _unique(identifiers(query)):
            subs.append((tantivy.Occur.Should,
                         Q.boost_query(Q.term_query(schema, "defines", t), DEFINES_BOOST)))
    return Q.boolean_query(subs) if subs else None


# --- filters -------------------------------------------------------------------------

_META_KEYS = {"project": "project", "lifecycle": "lifecycle", "workType": "workType",
              "tags": "tags", "sourceSets": "sourceSet"}


def passes_filters(source_id: str, metadata: dict[str, Any], filters: dict[str, Any]) -> bool:
    """True when a document satisfies every filter (OR within a field, AND across).

    Fails closed: a filter on a value the document does not have excludes it
    (DESIGN §9). File documents carry no metadata in this cut, so only ``sources``
    can select them. ``scopeSources`` (an agent's scope, added by the answer service after
    the request was checked) matches as ``sources`` does, ANDed with it.
    """
    for key, want in filters.items():
        if key in ("sources", "scopeSources"):  # scopeSources: an agent's (never a request's)
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
