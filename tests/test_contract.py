"""The search request contract is stated once (node/answer/contract.py): the protocol's
``query`` schema and the local API's ``SearchRequest`` are that one definition, and what
the schemas accept is exactly what the answer service accepts (issue 9, item 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from node.answer import contract
from node.common.errors import CorpusError
from node.corpus import globs
from node.local.api import openapi_document
from node.protocol.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
KQ = REPO / "protocols" / "knowledge-query"


def test_protocol_query_schema_is_the_contract() -> None:
    raw = json.loads((KQ / "spec.json").read_text())
    assert raw["messages"]["query"]["schema"] == contract.query_message_schema()


def test_openapi_request_is_the_contract_core() -> None:
    served = openapi_document()["components"]["schemas"]["SearchRequest"]
    on_disk = json.loads((REPO / "specs" / "openapi.json").read_text())
    core = contract.core_schema()
    for doc in (served, on_disk["components"]["schemas"]["SearchRequest"]):
        assert doc["additionalProperties"] is False and doc["required"] == ["query"]
        for name, prop in core["properties"].items():  # local-only fields may be added on top
            assert doc["properties"][name] == prop, name


def test_glob_limit_is_the_glob_languages() -> None:
    assert contract.MAX_GLOB_CHARS == globs.MAX_GLOB_CHARS
    item = contract.core_schema()["properties"]["sources"]["oneOf"][0]
    assert item["maxLength"] == globs.MAX_GLOB_CHARS


def _boundary_requests() -> list[dict[str, Any]]:
    """Requests at, below and just over every size limit and shape rule."""
    n, chars = contract.MAX_FILTER_VALUES, contract.MAX_FILTER_VALUE_CHARS
    glob_max = "/" + "a" * (contract.MAX_GLOB_CHARS - 1)
    out: list[dict[str, Any]] = [
        {"query": "x"}, {"query": ""}, {"query": "   "}, {"query": "a\x00b"}, {"query": 7},
        {"query": "q" * contract.MAX_QUERY_CHARS}, {"query": "q" * (contract.MAX_QUERY_CHARS + 1)},
        {"query": " " + "q" * (contract.MAX_QUERY_CHARS - 1)},
        {"query": " " + "q" * contract.MAX_QUERY_CHARS},
        {"topK": 0}, {"topK": 1}, {"topK": contract.TOP_K_MAX}, {"topK": contract.TOP_K_MAX + 1},
        {"topK": 5.0}, {"topK": 5.5}, {"topK": True}, {"topK": "5"},
        {"remainingBudgetMs": -1}, {"remainingBudgetMs": 0},
        {"remainingBudgetMs": contract.MAX_REQUEST_BUDGET_MS},
        {"remainingBudgetMs": contract.MAX_REQUEST_BUDGET_MS + 1},
        {"dedupe": "chunk"}, {"dedupe": "document"}, {"dedupe": "paragraph"}, {"dedupe": 1},
        {"unknown": 1},
        {"date": "2024-03-01"}, {"date": ["2024-03-01", "2024-03-02"]}, {"date": "2024-3-1"},
        {"date": []}, {"date": ["2024-03-01"] * (n + 1)}, {"date": ["2024-03-01"] * n},
        {"dateRange": {}}, {"dateRange": {"from": "2024-03-01"}},
        {"dateRange": {"from": "2024-03-01", "to": "2024-03-02"}},
        {"dateRange": {"since": "2024-03-01"}}, {"dateRange": "2024-03-01"},
        {"sources": glob_max}, {"sources": glob_max + "a"}, {"sources": [glob_max] * n},
        {"sources": ["/a"] * (n + 1)}, {"sources": "relative/x"}, {"sources": "/a\x00"},
    ]
    for key in contract.LIST_FILTERS:
        out += [
            {key: "v"}, {key: ["v"]}, {key: []}, {key: [""]}, {key: "  "}, {key: ["a\x00"]},
            {key: "t" * chars}, {key: ["t" * (chars + 1)]}, {key: ["t" * 230]},
            {key: [f"t{i}" for i in range(n)]}, {key: [f"t{i}" for i in range(n + 1)]},
            {key: [f"t{i}" for i in range(40)]}, {key: 3}, {key: [3]}, {key: {"a": 1}},
        ]
    return [{"query": "alpha", **r} if "query" not in r else r for r in out]


def _contract_accepts(body: dict[str, Any]) -> bool:
    try:
        contract.validate(body)
    except CorpusError as exc:
        assert exc.code == "query-invalid"
        return False
    return True


@pytest.mark.parametrize("body", _boundary_requests(), ids=lambda b: json.dumps(b)[:60])
def test_schema_acceptance_equals_contract_acceptance(body: dict[str, Any]) -> None:
    engine = load_spec(KQ).messages["query"].validator  # the validator the engine runs
    api = jsonschema.Draft202012Validator(openapi_document()["components"]["schemas"]["SearchRequest"])
    message = {"action": "query", "query_id": "q1", **body}
    by_engine = engine.is_valid(message)
    assert by_engine == api.is_valid(body) == _contract_accepts(body)


def test_rules_beyond_the_schema_are_refused_with_a_named_field() -> None:
    """Only these non-size rules are left to the contract (listed in specs/local-api.md)."""
    for body, field in (({"query": "q", "date": "2024-02-30"}, "date"),
                        ({"query": "q", "dateRange": {"from": "2024-03-02", "to": "2024-03-01"}},
                         "dateRange"),
                        ({"query": "q", "sources": "/a/../b"}, "sources"),
                        ({"query": "q", "sources": "/a**b"}, "sources")):
        with pytest.raises(CorpusError) as err:
            contract.validate(body)
        assert f"'{field}" in err.value.message


def test_normalized_request() -> None:
    req = contract.validate({"query": "  q  ", "topK": 3.0, "tags": ["a", "a", "b"], "project": "p"})
    assert req == {"query": "q", "topK": 3, "filters": {"tags": ["a", "b"], "project": ["p"]},
                   "remainingBudgetMs": None, "dedupe": "chunk"}
