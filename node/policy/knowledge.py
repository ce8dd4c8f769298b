"""The peer-scoped knowledge handle: the only way a Host's hooks reach the corpus (DESIGN §10).

search → normalize → tier per (peer, source) → drop what the peer may not see → map to
wire ids → envelope → leak scan. Hooks get a :class:`KnowledgeHandle` in
``ctx.knowledge``; it holds the corpus and gate privately and exposes one method,
:meth:`KnowledgeHandle.search`.

No oracle: when policy drops every match, the answer is ``no-verified-results`` with the
very same envelope as when nothing matched at all (it depends only on the request).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from node.corpus.envelope import build_envelope, empty_envelope, validate_search_request
from node.errors import CorpusError, EgressRefused

log = logging.getLogger("kith.knowledge")

#: candidates fetched before the gate, per requested result (bounded).
CANDIDATES_PER_RESULT = 10
MIN_CANDIDATES = 50


class KnowledgeHandle:
    """Search the corpus as one peer may see it.

    Args:
        corpus: a :class:`node.corpus.store.Corpus` (opened read-only by the host).
        gate: a :class:`node.policy.gate.EgressGate`.
        peer_name: the peer's registry name, or None for an anonymous peer (sees ``public``
            sources only).
    """

    __slots__ = ("__corpus", "__gate", "peer_name")

    def __init__(self, corpus: Any, gate: Any, peer_name: str | None) -> None:
        self.__corpus = corpus
        self.__gate = gate
        self.peer_name = peer_name

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one search request (the flat body of DESIGN §8 without ``action``).

        Returns:
            ``{"status": <status>, "envelope": <envelope>}`` with status one of ``ok``,
            ``no-verified-results``, ``invalid-request``, ``budget-exhausted``,
            ``internal-error``. Never raises for bad input; error text never carries
            exception messages, keys or real paths.
        """
        try:
            req = validate_search_request(request)
        except CorpusError as exc:
            env = empty_envelope("invalid-request", None)
            env["reason"] = "invalid-request"
            return {"status": "invalid-request", "envelope": env}
        budget = req.get("remainingBudgetMs")
        if budget == 0:
            return {"status": "budget-exhausted", "envelope": empty_envelope("budget-exhausted", req)}
        deadline = time.monotonic() + budget / 1000.0 if budget else None
        limit = max(MIN_CANDIDATES, req["topK"] * CANDIDATES_PER_RESULT)
        try:
            hits, controller = self.__corpus.search_hits(req["query"], limit=limit, filters=req.get("filters") or None,
                                                        deadline=deadline)
        except CorpusError as exc:
            log.warning("search failed: %s", exc.code)
            return {"status": "internal-error", "envelope": empty_envelope("index-unavailable", req)}
        allowed = self.__gate.filter_hits(hits, self.peer_name)
        if not allowed:
            return {"status": "no-verified-results", "envelope": empty_envelope("no-verified-results", req)}
        top = allowed[: req["topK"]]
        envelope = build_envelope(req, top, _gated_controller(controller, len(allowed), len(top)))
        try:
            self.__gate.check_outgoing(_dumps(envelope))
        except EgressRefused:
            log.error("egress gate refused an envelope (a real path was about to leave)")
            return {"status": "internal-error", "envelope": empty_envelope("internal-error", req)}
        return {"status": "ok", "envelope": envelope}


def _gated_controller(controller: dict[str, Any], allowed: int, returned: int) -> dict[str, Any]:
    """The controller report as a peer may see it: which passes ran and how they were
    fused, but never a count taken before the gate (that would reveal how much policy
    withheld). Candidate counts become the allowed count; other raw counts are dropped."""
    keep = ("mode", "fusion", "maxPerDocument", "earlyStop", "stopReason")
    out: dict[str, Any] = {k: controller[k] for k in keep if k in controller}
    passes = []
    for p in controller.get("passes") or []:
        if isinstance(p, dict):
            passes.append({k: v for k, v in p.items() if k in ("name", "status", "field", "reason")})
    out["passes"] = passes
    out["candidates"] = allowed
    out["returned"] = returned
    return out


def _dumps(obj: Any) -> bytes:
    import msgspec

    return msgspec.json.encode(obj)
