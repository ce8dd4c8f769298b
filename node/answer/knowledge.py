"""The peer-scoped knowledge handle: the only way a Host's hooks reach the corpus (DESIGN §10).

search → normalize → tier per (peer, source) → drop what the peer may not see → map to
wire ids → envelope → leak scan. Hooks get a :class:`KnowledgeHandle` in
``ctx.knowledge``; it holds the corpus and gate privately and exposes one method,
:meth:`KnowledgeHandle.search`.

No oracle: when policy drops every match, the answer is ``no-verified-results`` with the
very same envelope as when nothing matched at all (it depends only on the request).

Every query applies the current ``policy.toml`` (the gate re-reads it when the file
changed, :meth:`node.policy.gate.EgressGate.current_policy`). Before searching, the peer's quota is charged (``node.policy.quota``): over it →
``rate-limited`` with ``retry_after_s``; a zero quota → ``policy-denied``. When the best
evidence the peer could see is an ``ask`` source nobody decided yet, the answer is
``pending-approval`` with an ``approval_id`` and ``approvals/requests/<id>.json`` is
written (``node.policy.approvals``); once the owner approves, the same query gets the
evidence. Answers are trimmed (lowest results first) to the peer's ``max_message_bytes``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from node.answer.envelope import build_envelope, empty_envelope, validate_search_request
from node.common.errors import CorpusError, EgressRefused

log = logging.getLogger("kith.knowledge")

#: hits asked of the view's search per requested result (bounded): the view already holds
#: only sources the peer may see or ask about; the margin covers ``ask`` sources the owner
#: denied and hits the gate's origin check drops.
CANDIDATES_PER_RESULT = 2
MAX_CANDIDATES = 100  # the corpus search's own bound on ``limit``
#: (policy, peer name) -> visible predicate, so repeated queries share one view (bounded).
_PREDICATES: dict[tuple[int, str | None], tuple[Any, Any, Any]] = {}
_PREDICATES_MAX = 256
#: seconds a ``no-verified-results`` answer takes at least, counted from the request: the
#: search plus the gate's work on withheld candidates (≈0.1 ms each, at most 100) stays
#: under it on a typical corpus, so "nothing matched" and "only private sources matched"
#: take the same time. A larger floor hides more but every empty answer pays it (the load
#: benchmark: 30 ms cost join→first-answer 16 → 49 ms); 10 ms covers the measured gap
#: (private match 4.6 ms vs no match 1.8 ms over iroh).
NO_RESULT_FLOOR_S = 0.010
#: bytes of the ``results`` message outside the envelope (action, query_id ≤ 64, status,
#: retry/approval fields), counted against ``max_message_bytes``.
MESSAGE_OVERHEAD_BYTES = 256


class KnowledgeHandle:
    """Search the corpus as one peer may see it.

    Args:
        corpus: a :class:`node.corpus.store.Corpus` (opened read-only by the host).
        gate: a :class:`node.policy.gate.EgressGate`.
        peer_name: the peer's registry name, or None for an anonymous peer (sees ``public``
            sources only).
        peer_key: the peer's public key (64 hex): quotas and approvals are per key. None
            (tests, local tools) → no quota and no approvals.
        limiter: a shared :class:`node.policy.quota.RateLimiter` (one per Host process),
            or None for no rate limit.
        echoes: a per-session set this handle adds the peer's request strings to (see
            :func:`node.policy.gate.echoes_of`); the Host's frame-level egress check
            exempts them. None → a private set.
    """

    __slots__ = ("__corpus", "__gate", "__limiter", "__echoes", "peer_name", "peer_key")

    def __init__(self, corpus: Any, gate: Any, peer_name: str | None, *, peer_key: str | None = None,
                 limiter: Any = None, echoes: set[bytes] | None = None) -> None:
        self.__corpus = corpus
        self.__gate = gate
        self.__limiter = limiter
        self.__echoes = echoes if echoes is not None else set()
        self.peer_name = peer_name
        self.peer_key = peer_key

    def _admit(self, policy: Any) -> dict[str, Any] | None:
        """Charge one query to the peer's quota (under ``policy``); an answer when
        refused, else None."""
        if self.__limiter is None or self.peer_key is None:
            return None
        shared = policy.anonymous_quota() if self.peer_name is None else None
        verdict = self.__limiter.take(self.peer_key, policy.quota_for(self.peer_name), shared)
        if verdict.ok:
            return None
        if verdict.denied:
            return {"status": "policy-denied", "envelope": None}
        return {"status": "rate-limited", "envelope": None, "retry_after_s": verdict.retry_after_s}

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one search request (the flat body of DESIGN §8 without ``action``).

        Returns:
            ``{"status": <status>, "envelope": <envelope>}`` with status one of ``ok``,
            ``no-verified-results``, ``pending-approval`` (plus ``approval_id`` when a
            request file was written), ``rate-limited`` (plus ``retry_after_s``, whole
            seconds), ``policy-denied``, ``invalid-request``, ``budget-exhausted``,
            ``internal-error``. Never raises for bad input; error text never carries
            exception messages, keys or real paths.
        """
        from node.policy.gate import echoes_of

        started = time.monotonic()
        # one policy for the whole query, re-read when policy.toml changed (DESIGN §10)
        policy = self.__gate.current_policy()
        refused = self._admit(policy)
        self.__echoes.update(echoes_of(request))
        try:
            req = validate_search_request(request)
        except CorpusError:
            status = refused["status"] if refused else "invalid-request"
            env = empty_envelope(status, None)
            return {**(refused or {}), "status": status, "envelope": env}
        if refused is not None:
            return {**refused, "envelope": empty_envelope(refused["status"], req)}
        budget = req.get("remainingBudgetMs")
        if budget == 0:
            return {"status": "budget-exhausted", "envelope": empty_envelope("budget-exhausted", req)}
        deadline = time.monotonic() + budget / 1000.0 if budget else None
        # the search runs on the peer's view (never/private sources are not candidates,
        # scores use the view's statistics); the gate still screens every hit
        limit = min(MAX_CANDIDATES, req["topK"] * CANDIDATES_PER_RESULT)
        try:
            hits, controller = self.__corpus.search_hits(req["query"], limit=limit, filters=req.get("filters") or None,
                                                        deadline=deadline,
                                                        visible=visible_for(self.__gate, policy, self.peer_name))
        except CorpusError as exc:
            if exc.code == "query-invalid":  # e.g. a query of stop words only
                return {"status": "invalid-request", "envelope": empty_envelope("invalid-request", req)}
            log.warning("search failed: %s", exc.code)
            return {"status": "internal-error", "envelope": empty_envelope("index-unavailable", req)}
        from node.policy.gate import PENDING

        screened = self.__gate.screen(hits, self.peer_name, self.peer_key, req["query"], policy=policy)
        if screened and screened[0][1] == PENDING:
            return self._pending(req, screened)
        allowed = [hit for hit, state in screened if state != PENDING]
        if not allowed:
            # same time floor whether nothing matched or policy withheld every match, so
            # the answer's timing is no oracle either (DESIGN §8)
            _wait_until(started + NO_RESULT_FLOOR_S)
            return {"status": "no-verified-results", "envelope": empty_envelope("no-verified-results", req)}
        top = allowed[: req["topK"]]
        limit = None
        if self.peer_key is not None:
            limit = policy.quota_for(self.peer_name).max_message_bytes - MESSAGE_OVERHEAD_BYTES
        while True:
            envelope = build_envelope(req, top, _gated_controller(controller, len(allowed), len(top)))
            data = _dumps(envelope)
            if limit is None or len(data) <= limit or not top:
                break
            top = top[:-1]  # drop the lowest-ranked result until the answer fits
        if not top:
            return {"status": "no-verified-results", "envelope": empty_envelope("no-verified-results", req)}
        try:
            self.__gate.check_outgoing(data, self.__echoes)
        except EgressRefused:
            log.error("egress gate refused an envelope (a real path was about to leave)")
            return {"status": "internal-error", "envelope": empty_envelope("internal-error", req)}
        return {"status": "ok", "envelope": envelope}

    def _pending(self, req: dict[str, Any], screened: list[tuple[Any, str]]) -> dict[str, Any]:
        """``pending-approval``: record the undecided ``ask`` sources among the top results."""
        from node.policy.gate import PENDING

        answer: dict[str, Any] = {"status": "pending-approval",
                                  "envelope": empty_envelope("pending-approval", req)}
        approvals = self.__gate.approvals
        if approvals is None or self.peer_key is None:
            return answer
        sources = list(dict.fromkeys(hit.source_id for hit, state in screened[: req["topK"]] if state == PENDING))
        try:
            record = approvals.request(self.peer_key, self.peer_name, req["query"], sources)
        except OSError:
            log.error("could not write an approval request")
            return answer
        if record is None:
            log.warning("too many open approval requests; not recording another")
        else:
            answer["approval_id"] = record.id
            log.warning("approval request %s waits for `kith approvals approve|deny`", record.id)
        return answer


def visible_for(gate: Any, policy: Any, peer_name: str | None) -> Any:
    """The view predicate of ``peer_name`` under ``policy``: ``visible(source_id)`` is True
    when the gate's decision for that source lets the peer see it (``public``, ``peers``
    listing it) or ask about it (``ask``); ``never``, ``private``, unlisted ``peers`` and
    invalid ids are False. The same predicate object is returned for the same (gate,
    policy, peer) so the corpus's per-view caches apply (:mod:`node.corpus.views`)."""
    key = (id(policy), peer_name)
    entry = _PREDICATES.get(key)
    if entry is not None and entry[0] is policy and entry[1] is gate:
        return entry[2]

    def visible(source_id: str) -> bool:
        decision = gate.decide(source_id, peer_name, policy=policy)
        return decision.allowed or (decision.tier == "ask" and decision.canonical is not None)

    if len(_PREDICATES) >= _PREDICATES_MAX:
        _PREDICATES.pop(next(iter(_PREDICATES)))
    _PREDICATES[key] = (policy, gate, visible)
    return visible


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


def _wait_until(when: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``when`` (no-op when already past)."""
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _dumps(obj: Any) -> bytes:
    import msgspec

    return msgspec.json.encode(obj)
