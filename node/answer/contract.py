"""The search request contract: every field and limit of a search request, stated ONCE.

DESIGN §8 / §11 and seed ``rag-external-agent-contract``. Every entry point takes this
request — a peer's ``query`` message (``protocols/knowledge-query/spec.json``), ``POST
/search`` on the local API (``specs/openapi.json``), the MCP ``search`` tool and ``kith
search`` — and two things are derived from the constants below:

* :func:`core_schema` — the JSON Schema of the request's fields. The ``query`` message's
  schema is ``{action, query_id}`` + these properties (:func:`query_message_schema`), the
  local API's ``SearchRequest`` is these properties plus local-only fields on top
  (:func:`node.local.api.openapi_document`); ``tests/test_contract.py`` checks both
  documents against it, so a limit cannot be changed in one place only.
* :func:`validate` — the check and normalization the answer service runs. It accepts
  exactly what :func:`core_schema` accepts, plus the few rules JSON Schema cannot state
  (they are listed in ``specs/local-api.md`` "The request"): a date must be a real
  calendar day, ``dateRange.from`` <= ``to``, and a ``sources`` glob must be in the glob
  language of ``node.corpus.globs`` (``*``/``?`` within a segment, ``**`` as a whole
  segment, no ``.``/``..`` segment, at most :data:`node.corpus.globs.MAX_DOUBLE_STARS`
  ``**``). Every *size* limit is in the schema: a message the engine accepted is never
  refused afterwards for a length or a count.
"""

from __future__ import annotations

import copy
import re
from datetime import date as _date
from functools import lru_cache
from typing import Any

from node.common.errors import CorpusError, KithError
from node.corpus import MAX_GLOB_CHARS as _GLOB_CHARS, MAX_PER_DOCUMENT

#: ``query``: characters, counted before surrounding whitespace is stripped.
MAX_QUERY_CHARS = 2000
TOP_K_DEFAULT = 5
TOP_K_MAX = 20
#: Values of one list filter (``tags``, ``project``, ``sources``…).
MAX_FILTER_VALUES = 32
#: Characters of one filter value (``sources`` globs: :data:`MAX_GLOB_CHARS`).
MAX_FILTER_VALUE_CHARS = 256
#: Characters of one ``sources`` glob: the glob language's own bound (one number).
MAX_GLOB_CHARS = _GLOB_CHARS
#: Largest ``remainingBudgetMs`` a request may state (ms); the server then clamps its
#: own search time to :data:`MAX_SERVER_BUDGET_MS`.
MAX_REQUEST_BUDGET_MS = 600_000
#: Server-side cap of one search's budget (ms); a larger remainingBudgetMs is clamped.
MAX_SERVER_BUDGET_MS = 60_000
#: ``dedupe`` values → chunks allowed per document in the results (``chunk``: distinct
#: chunks, at most 2 per document; ``document``: one per document). Documents with the
#: same content share one cap, and a chunk text found in several documents is always one
#: result listing the others in ``alsoIn`` (issue 20 item 6), at either level.
DEDUPE_LEVELS = {"chunk": MAX_PER_DOCUMENT, "document": 1}

#: Filter fields that take a string or a non-empty list of strings.
LIST_FILTERS = ("project", "tags", "sourceSets", "lifecycle", "workType")
#: Every filter field, in the order the normalized request lists them.
FILTER_KEYS = ("date", "dateRange", *LIST_FILTERS, "sources")
#: Every field of the request (a protocol adds its envelope fields, an entry point its
#: local-only fields, on top).
FIELDS = ("query", "topK", "remainingBudgetMs", "dedupe", *FILTER_KEYS)

# JSON Schema patterns (ECMA-262 and Python ``re`` read them alike):
_TEXT = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"  # not blank, no NUL
_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_GLOB = r"^/[^\u0000]*$"
_TEXT_RE = re.compile(_TEXT)
_DATE_RE = re.compile(_DATE)
_GLOB_RE = re.compile(_GLOB)


def _text_item(max_chars: int, pattern: str = _TEXT) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_chars, "pattern": pattern}


def _one_or_list(item: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [item, {"type": "array", "minItems": 1, "maxItems": MAX_FILTER_VALUES,
                             "items": item}]}


@lru_cache(maxsize=1)
def _core() -> dict[str, Any]:
    date_item = {"type": "string", "pattern": _DATE}
    props: dict[str, Any] = {
        "query": _text_item(MAX_QUERY_CHARS),
        "topK": {"type": "integer", "minimum": 1, "maximum": TOP_K_MAX, "default": TOP_K_DEFAULT},
        "remainingBudgetMs": {"type": "integer", "minimum": 0, "maximum": MAX_REQUEST_BUDGET_MS},
        "dedupe": {"enum": list(DEDUPE_LEVELS), "default": "chunk"},
        "date": _one_or_list(date_item),
        "dateRange": {"type": "object", "additionalProperties": False, "minProperties": 1,
                      "properties": {"from": date_item, "to": date_item}},
    }
    for key in LIST_FILTERS:
        props[key] = _one_or_list(_text_item(MAX_FILTER_VALUE_CHARS))
    props["sources"] = _one_or_list(_text_item(MAX_GLOB_CHARS, _GLOB))
    return {"type": "object", "additionalProperties": False, "required": ["query"],
            "properties": props}


def core_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12 subset) of a search request: ``{"type": "object",
    "additionalProperties": false, "required": ["query"], "properties": {...}}`` with one
    property per :data:`FIELDS`. A fresh copy each call (callers may extend it)."""
    return copy.deepcopy(_core())


#: The knowledge-query ``query`` message's own fields (DESIGN §8).
QUERY_ID = {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"}


#: The ``query`` message's ``citations`` field (knowledge-query 1.2.0): ask the host to
#: sign a citation for each result (node/answer/citation.py; the host may refuse to sign).
CITATIONS_FIELD = {"type": "boolean", "default": False}
#: ``results.citations``: what became of ``citations: true`` (absent when not asked).
CITATIONS_MARKER = {"enum": ["signed", "signing-off"]}
#: Versions one ``check`` may ask about (``kith verify --against-host``, specs/citations.md §5).
MAX_CHECK_ITEMS = 100
_VERSION_ITEM = {"type": "object", "additionalProperties": False, "required": ["source", "version"],
                 "properties": {"source": {"type": "string", "minLength": 1, "maxLength": 1024},
                                "version": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}}


def query_message_schema() -> dict[str, Any]:
    """The knowledge-query protocol's ``query`` message schema: ``action`` ``"query"``,
    ``query_id``, ``citations`` (:data:`CITATIONS_FIELD`) and the :func:`core_schema`
    fields flat beside them. ``spec.json`` holds exactly this (``tests/test_contract.py``)."""
    core = core_schema()
    return {"type": "object", "additionalProperties": False,
            "required": ["action", "query_id", "query"],
            "properties": {"action": {"const": "query"}, "query_id": dict(QUERY_ID),
                           "citations": dict(CITATIONS_FIELD), **core["properties"]}}


def check_message_schema() -> dict[str, Any]:
    """The knowledge-query ``check`` message (guest → host, 1.2.0): are these cited
    document versions still current? ``versions``: 1–:data:`MAX_CHECK_ITEMS` of
    ``{source, version}`` (``kith verify --against-host``, specs/citations.md §5)."""
    return {"type": "object", "additionalProperties": False,
            "required": ["action", "query_id", "versions"],
            "properties": {"action": {"const": "check"}, "query_id": dict(QUERY_ID),
                           "versions": {"type": "array", "minItems": 1, "maxItems": MAX_CHECK_ITEMS,
                                        "items": copy.deepcopy(_VERSION_ITEM)}}}


def checked_message_schema() -> dict[str, Any]:
    """The host's answer to ``check``: ``status`` ``ok`` | ``unavailable`` and one
    ``{source, version, state}`` per version asked, ``state`` ``current`` | ``stale`` |
    ``unknown`` (a source the peer may not see is ``unknown``, as one that does not exist)."""
    item = copy.deepcopy(_VERSION_ITEM)
    item["required"].append("state")
    item["properties"]["state"] = {"enum": ["current", "stale", "unknown"]}
    item["properties"]["version"] = {"type": "string", "maxLength": 64}
    item["properties"]["source"] = {"type": "string", "maxLength": 1024}
    return {"type": "object", "additionalProperties": False,
            "required": ["action", "query_id", "status", "versions"],
            "properties": {"action": {"const": "checked"}, "query_id": dict(QUERY_ID),
                           "status": {"enum": ["ok", "unavailable"]},
                           "versions": {"type": "array", "maxItems": MAX_CHECK_ITEMS, "items": item}}}


# --- validation ----------------------------------------------------------------------

def _bad(field: str, rule: str) -> CorpusError:
    return CorpusError("query-invalid", f"The field '{field}' {rule}.")


def _encodable(field: str, v: str) -> str:
    """``v`` when it is text UTF-8 can carry; a string holding a lone surrogate (what
    Python makes of bytes that are not UTF-8 in an argument, a file name or stdin, by
    ``surrogateescape``) is refused as ``query-invalid`` before it reaches the index, a
    JSON encoder or a peer."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(field, "must be valid UTF-8 text (it holds bytes that are not UTF-8, "
                          "or a lone surrogate)") from None
    return v


def _int(field: str, v: Any, lo: int, hi: int) -> int:
    """An integer in [lo, hi]; a float with an integral value counts (JSON Schema's
    ``integer``), a bool does not."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(field, f"must be an integer from {lo} to {hi}")
    return v


def _check_date(field: str, v: Any) -> str:
    if not isinstance(v, str) or not _DATE_RE.match(v):
        raise _bad(field, "must be a date as YYYY-MM-DD")
    try:
        _date.fromisoformat(v)
    except ValueError:
        raise _bad(field, "must be a real calendar date as YYYY-MM-DD") from None
    return v


def _string_list(field: str, v: Any, *, max_chars: int, pattern: re.Pattern[str] = _TEXT_RE,
                 rule: str = "") -> list[str]:
    values = [v] if isinstance(v, str) else v
    if not isinstance(values, list):
        raise _bad(field, "must be a string or a list of strings")
    if not values:
        raise _bad(field, "must not be an empty list (omit the filter to match everything)")
    if len(values) > MAX_FILTER_VALUES:
        raise _bad(field, f"must have at most {MAX_FILTER_VALUES} values")
    out: list[str] = []
    for item in values:
        if not isinstance(item, str) or not item:
            raise _bad(field, "must contain only non-empty strings")
        if len(item) > max_chars:
            raise _bad(field, f"values must be at most {max_chars} characters")
        _encodable(field, item)
        if not pattern.match(item):
            raise _bad(field, rule or "values must not be blank or contain NUL")
        if item not in out:
            out.append(item)
    return out


def validate(body: Any) -> dict[str, Any]:
    """Validate and normalize a search request (the flat body of DESIGN §8).

    Args:
        body: the JSON object with the :data:`FIELDS` (protocol envelope fields such as
            ``action``/``query_id`` and local-only fields must be removed by the caller):
            ``query`` (required; 1–:data:`MAX_QUERY_CHARS` characters, not blank, no NUL,
            valid UTF-8: no lone surrogate, which is what undecodable bytes become),
            ``topK`` (integer 1–:data:`TOP_K_MAX`, default :data:`TOP_K_DEFAULT`),
            ``remainingBudgetMs`` (integer 0–:data:`MAX_REQUEST_BUDGET_MS`, ms),
            ``dedupe`` (``"chunk"`` default, or ``"document"``), filters ``date``
            (YYYY-MM-DD or a list), ``dateRange`` ({``from``, ``to``}: at least one,
            from <= to), ``project``/``tags``/``sourceSets``/``lifecycle``/``workType``
            (a string or 1–:data:`MAX_FILTER_VALUES` strings of 1–
            :data:`MAX_FILTER_VALUE_CHARS` characters), ``sources`` (1–
            :data:`MAX_FILTER_VALUES` globs of at most :data:`MAX_GLOB_CHARS` characters
            starting with ``/``, in the glob language of :mod:`node.corpus.globs`).

    Returns:
        ``{"query": str (stripped), "topK": int, "filters": {name: normalized value},
        "remainingBudgetMs": int | None, "dedupe": "chunk" | "document"}``; list filters
        are deduplicated lists.

    Raises:
        CorpusError: ``query-invalid`` with a message naming the offending field (unknown
            fields and empty filter lists are refused).
    """
    if not isinstance(body, dict):
        raise CorpusError("query-invalid", "The search request must be a JSON object.")
    props = _core()["properties"]
    for k in body:
        if k not in props:
            raise CorpusError("query-invalid",
                              f"The field '{str(k)[:40]}' is not part of a search request.")
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise _bad("query", "must be a non-empty string")
    if len(query) > MAX_QUERY_CHARS:
        raise _bad("query", f"must be at most {MAX_QUERY_CHARS} characters")
    if not _TEXT_RE.match(query):
        raise _bad("query", "must not be blank or contain NUL characters")
    _encodable("query", query)
    top_k = _int("topK", body.get("topK", TOP_K_DEFAULT), 1, TOP_K_MAX)
    budget = body.get("remainingBudgetMs")
    if budget is not None:
        budget = _int("remainingBudgetMs", budget, 0, MAX_REQUEST_BUDGET_MS)
    filters: dict[str, Any] = {}
    for key in FILTER_KEYS:
        if key not in body:
            continue
        v = body[key]
        if key == "date":
            filters[key] = [_check_date(key, d)
                            for d in _string_list(key, v, max_chars=10, pattern=_DATE_RE,
                                                  rule="must be a date as YYYY-MM-DD")]
        elif key == "dateRange":
            if not isinstance(v, dict) or not v or set(v) - {"from", "to"}:
                raise _bad(key, "must be an object with 'from' and/or 'to' dates")
            rng = {k: _check_date(f"{key}.{k}", v[k]) for k in ("from", "to") if k in v}
            if "from" in rng and "to" in rng and rng["from"] > rng["to"]:
                raise _bad(key, "must have 'from' on or before 'to'")
            filters[key] = rng
        elif key == "sources":
            found = _string_list(key, v, max_chars=MAX_GLOB_CHARS, pattern=_GLOB_RE,
                                 rule="globs must start with '/' (they match source ids)")
            from node.corpus import globs  # here: a request without sources never loads it

            for g in found:
                try:
                    globs.source_glob(g)  # the policy's glob language and linear matcher
                except KithError:
                    raise _bad(key, "globs use '*', '?' within a segment and '**' as a whole "
                                    "segment, without '.' or '..' segments") from None
            filters[key] = found
        else:
            filters[key] = _string_list(key, v, max_chars=MAX_FILTER_VALUE_CHARS)
    dedupe = body.get("dedupe", "chunk")
    if not isinstance(dedupe, str) or dedupe not in DEDUPE_LEVELS:
        raise _bad("dedupe", "must be 'chunk' or 'document'")
    return {"query": query.strip(), "topK": top_k, "filters": filters,
            "remainingBudgetMs": budget, "dedupe": dedupe}


def server_deadline(request: dict[str, Any], now: float | None = None) -> float:
    """The ``time.monotonic()`` instant after which no search pass may start, from the
    normalized request's ``remainingBudgetMs`` (clamped to :data:`MAX_SERVER_BUDGET_MS`;
    no budget → the cap alone)."""
    import time

    now = time.monotonic() if now is None else now
    budget = request.get("remainingBudgetMs")
    ms = MAX_SERVER_BUDGET_MS if budget is None else min(budget, MAX_SERVER_BUDGET_MS)
    return now + ms / 1000.0


__all__ = ["DEDUPE_LEVELS", "FIELDS", "FILTER_KEYS", "MAX_FILTER_VALUES",
           "MAX_FILTER_VALUE_CHARS", "MAX_GLOB_CHARS", "MAX_QUERY_CHARS",
           "MAX_REQUEST_BUDGET_MS", "MAX_SERVER_BUDGET_MS", "TOP_K_DEFAULT", "TOP_K_MAX",
           "CITATIONS_FIELD", "CITATIONS_MARKER", "MAX_CHECK_ITEMS", "check_message_schema",
           "checked_message_schema", "core_schema", "query_message_schema", "server_deadline", "validate"]
