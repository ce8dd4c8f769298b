"""The answer service: the ONE place a search is answered (DESIGN §8, §10, §11; issues 9, 29).

Every entry point hands a request and a view to :meth:`AnswerService.answer` and only adapts
input and output: the owner's (:data:`OWNER`: ``kith search``, ``POST /search``, MCP — every
tier, no quota, no approvals) or a peer's (:class:`PeerView`, through ``ctx.knowledge``: the
policy per (peer, source), its quota, ``ask`` approvals, its ``max_message_bytes``, the
no-oracle time floor :data:`NO_RESULT_FLOOR_S`). An answer runs four stages, each
returning its own early statuses:

1. **admit** (:meth:`AnswerService._admit`): the peer's quota under the query's one policy,
   the request (:func:`node.answer.contract.validate`), ``remainingBudgetMs`` 0;
2. **search** (:meth:`AnswerService._search`): ``Corpus.search_hits`` with the budget's
   deadline, the request's ``dedupe`` and a peer's lens (:class:`node.corpus.lens.Lens`,
   made by the gate): a peer is ranked on its own view (:mod:`node.corpus.views`);
3. **screen** (:mod:`node.answer.screen`): the gate per hit and copy, a deeper search when
   it held back too many, pending approvals, scrubbing, canonical ids, no content hash;
4. **render** (:mod:`node.answer.render`): the envelope (``indexSyncing`` while the index
   lags), a peer's byte limit, or the answer with nothing to show.

The leak scan is not here: it is the gate seam every outgoing frame passes once
(:meth:`node.policy.gate.EgressGate.check_frame`). Statuses: ``ok``,
``no-verified-results``, ``invalid-request`` (plus ``error``: ``{"code", "message"}``),
``budget-exhausted``, ``index-syncing``, ``index-unavailable``, ``pending-approval`` (plus
``approval_id`` when a request was recorded; the envelope holds what the peer may see now),
``rate-limited`` (plus ``retry_after_s``, whole seconds), ``policy-denied``. A scrubbed
peer's answer also carries ``scrubbed`` (counts per kind, for the host's audit; never sent).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from node.answer import contract, render, screen
from node.answer.citation import PeerVersions
from node.answer.inline import InlineCosts
from node.answer.knowledge import OWNER, Handle, Knowledge, OwnerView, PeerView, View
from node.common.errors import CorpusError
from node.corpus.lens import Lens
from node.corpus.retrieval import make_plan

log = logging.getLogger("kith.answer")

#: seconds a peer's answer with nothing to show takes at least, from the request, so
#: "nothing matched" and "only private sources matched" take the same time (the gap
#: measured over iroh: 4.6 ms vs 1.8 ms; every empty answer pays it).
NO_RESULT_FLOOR_S = 0.010
#: bytes of the ``results`` message outside the envelope (action, query_id ≤ 64, status,
#: retry/approval fields), counted against ``max_message_bytes``.
MESSAGE_OVERHEAD_BYTES = 256
#: A ``copy_fetch`` answer costs one query of the peer's quota plus one per this many
#: bytes of document text it sends (specs/copies.md §3).
COPY_BYTES_PER_QUERY = 256 * 1024


@dataclass
class _Query:
    """One answer in progress: what the stages pass on."""

    req: dict[str, Any]
    plan: Any
    started: float
    peer: PeerView | None = None
    policy: Any = None
    lens: Lens | None = None
    deadline: float | None = None
    timings: dict[str, float] | None = None
    marks: dict[str, float] = field(default_factory=dict)  # perf_counter per stage start
    #: an agent's ``sources`` globs (node/local/agents.py), ANDed with the request's filters
    scope_sources: tuple[str, ...] | None = None


class AnswerService:
    """Answers every search of one node (module docstring).

    Args:
        corpus: a :class:`node.corpus.store.Corpus` (usually read-only), or None when the
            home has no corpus yet (every search answers ``index-unavailable``).
        gate: the :class:`node.policy.gate.EgressGate` applying the policy for peer views;
            None when only the owner's view is answered (local tools).
        limiter: a shared :class:`node.policy.quota.RateLimiter`, or None (no rate limit).
        version_key: the host's document-version secret
            (:func:`node.answer.citation.load_version_key`), or None: then
            :meth:`check_versions` can say nothing (``unavailable``).
        copier: the :class:`node.answer.copies.CopyServer` answering copy requests, or None.
        source_names: ``{source id: id to show}`` applied to the owner view's hits before
            the envelope is built (a copy's local ids → its host's,
            :func:`node.guest.copies.search.search_copy`), or None.

    ``inline`` (:class:`node.answer.inline.InlineCosts`) says which peer answers are small.
    """

    def __init__(self, corpus: Any, gate: Any = None, *, limiter: Any = None,
                 version_key: bytes | None = None, copier: Any = None,
                 source_names: dict[str, str] | None = None) -> None:
        self._corpus = corpus
        #: the owner view's ids renamed (a copy's local ids → the host's, node/guest/copies/search.py),
        #: so the envelope is built with them; None: the corpus's own
        self._source_names = source_names
        #: the :class:`node.answer.copies.CopyServer` answering copy requests, or None
        #: (this node serves no copies: ``copy-not-granted``)
        self.copier = copier
        self._gate = gate
        self._limiter = limiter
        self._version_key = version_key
        #: the versions each peer is given (node/answer/citation.py), or None without a key or corpus
        self.versions = (PeerVersions(version_key, self._document_text)
                         if version_key is not None and corpus is not None else None)
        self._normalize: Any = None
        self._syncing = render.Syncing(corpus)  # marks shown answers ``indexSyncing``
        self.inline = InlineCosts(corpus, gate)  # which answers are small (node/answer/inline.py)

    def knowledge_for(self, view: PeerView) -> Knowledge:
        """The ``ctx.knowledge`` handle answering as ``view`` (see :class:`Knowledge`)."""
        return Handle(self, view)

    def lens_for(self, view: PeerView, policy: Any = None) -> Lens:
        """The lens ``view`` is answered through (:meth:`node.policy.gate.EgressGate.lens_for`
        under ``policy``, default the current one). Raises CorpusError ``index-unavailable``."""
        return self._gate.lens_for(self._corpus, view.name, policy)

    def warm(self, view: PeerView) -> int:
        """Build the index ``view`` searches on now, outside the corpus lock
        (:meth:`node.corpus.store.Corpus.warm_view`; node/host/warm.py): the number of
        documents it holds (0 without a corpus). Raises CorpusError ``index-unavailable``."""
        if self._corpus is None:
            return 0
        return self._corpus.warm_view(self.lens_for(view))

    def search_args(self, top_k: int, view: View, policy: Any = None) -> dict[str, Any]:
        """The ``Corpus.search_hits`` arguments an answer for ``view`` starts with besides
        the request's own: ``limit`` and, for a peer, ``lens`` (:meth:`lens_for` under
        ``policy``). ``scripts/bench`` measures its baseline with the same."""
        if not isinstance(view, PeerView):
            return {"limit": top_k}
        return {"limit": top_k, "lens": self.lens_for(view, policy)}

    # --- the answer ---------------------------------------------------------------------
    def answer(self, body: Any, view: View = OWNER, *,
               timings: dict[str, float] | None = None,
               scope_sources: tuple[str, ...] | None = None) -> dict[str, Any]:
        """Answer one search request as ``view``: admit → search → screen → render.

        Args:
            body: the flat request body (:mod:`node.answer.contract`), unvalidated.
            view: :data:`OWNER` or a :class:`PeerView`.
            timings: when given, filled with the seconds spent per stage — ``search``,
                ``gate`` (the screen) and ``envelope`` — for ``scripts/bench``'s profile.
            scope_sources: an agent's ``sources`` globs (:meth:`node.local.agents.Scope.source_filter`):
                only sources matching one of them are searched, besides the request's
                own filters (which are echoed unchanged). None: no narrowing.

        Returns:
            ``{"status": str, "envelope": dict}`` plus ``error`` / ``approval_id`` /
            ``retry_after_s`` / ``scrubbed`` by status (module docstring). Never raises
            for bad input; never carries a path or exception text.

        A peer view's answer also keeps its CPU time, with the lens key it was made under,
        in :attr:`inline` (what :meth:`node.answer.knowledge.Handle.small` reads).
        """
        if not isinstance(view, PeerView):
            return self._answer(body, view, timings, scope_sources)[1]
        cpu = time.thread_time()
        q, out = self._answer(body, view, timings, scope_sources)
        # the lens the answer searched through is keyed by what its cost depends on
        # (policy stamp, grants, peer, generation): no second read of the policy and index
        made_under = q.lens.key if q is not None and q.lens is not None else None
        self.inline.answered(view, time.thread_time() - cpu, made_under)
        return out

    def _answer(self, body: Any, view: View, timings: dict[str, float] | None,
                scope_sources: tuple[str, ...] | None) -> tuple[_Query | None, dict[str, Any]]:
        """:meth:`answer`'s stages: ``(the query once admitted or None, the answer)``."""
        q = self._admit(body, view, timings)
        if isinstance(q, dict):
            return None, q
        q.scope_sources = scope_sources
        found = self._search(q, q.req["topK"])
        if isinstance(found, dict):
            return q, found
        hits, controller = found
        if not hits and controller.get("stopReason") == "budget-exhausted" and not any(
                p.get("status") == "ran" for p in controller.get("passes", [])):
            return q, render.empty("budget-exhausted", q.req, q.plan)  # not one pass could run
        shown = self._screen(q, hits, controller)
        if isinstance(shown, dict):
            return q, shown
        return q, self._render(q, shown)

    def _admit(self, body: Any, view: View, timings: dict[str, float] | None
               ) -> _Query | dict[str, Any]:
        """Stage 1: the quota (a peer's), the request, the budget; a :class:`_Query`, or the
        answer (``rate-limited``, ``policy-denied``, ``invalid-request``,
        ``budget-exhausted``, ``index-unavailable``)."""
        started = time.monotonic()
        peer = view if isinstance(view, PeerView) else None
        policy = refused = None
        if peer is not None:
            if self._gate is None:
                raise ValueError("a peer view needs a gate")
            policy = self._gate.current_policy()  # one policy for the whole query (DESIGN §10)
            refused = self._charge(peer, policy)
        try:
            req = contract.validate(body)
        except CorpusError as exc:
            if refused is not None:
                return {**refused, **render.empty(refused["status"], None)}
            return render.invalid(exc)
        plan = make_plan(req["query"])  # the one plan: the search's (cached) and the envelope's
        if refused is not None:
            return {**refused, **render.empty(refused["status"], req, plan)}
        if req["remainingBudgetMs"] == 0:
            return render.empty("budget-exhausted", req, plan)
        q = _Query(req, plan, started, peer, policy, timings=timings,
                   deadline=contract.server_deadline(req, started))
        if self._corpus is None:
            return self._nothing("index-unavailable", q)
        return q

    def _search(self, q: _Query, limit: int) -> tuple[list[Any], dict[str, Any]] | dict[str, Any]:
        """Stage 2: ``Corpus.search_hits`` for ``limit`` hits through the peer's lens;
        ``(hits, controller)``, or the answer (``invalid-request``, ``index-unavailable``,
        ``index-syncing``). A peer's search that fails is logged (``kith.answer``): its
        reason goes to the peer, and the log is how the host's owner hears of it; the
        owner's own (``kith search``, the local API, MCP) is not — its caller says the reason
        once (``error [index-unavailable]``)."""
        q.marks.setdefault("search", time.perf_counter())
        req = q.req
        try:
            if q.peer is not None and q.lens is None:
                q.lens = self.lens_for(q.peer, q.policy)
            filters = req["filters"] or None
            if q.scope_sources is not None:  # an agent's scope: ANDed, never echoed
                filters = {**(filters or {}), "scopeSources": list(q.scope_sources)}
            hits, controller = self._corpus.search_hits(
                req["query"], limit=limit, filters=filters, deadline=q.deadline,
                max_per_document=contract.DEDUPE_LEVELS[req["dedupe"]], lens=q.lens)
        except CorpusError as exc:
            if exc.code == "query-invalid":  # e.g. a query of stop words only
                return render.invalid(exc, req)
            if q.peer is not None:
                log.warning("search failed: %s", exc.code)
            return self._nothing(render.unavailable_reason(self._corpus), q)
        return hits, controller

    def _screen(self, q: _Query, hits: list[Any], controller: dict[str, Any]
                ) -> screen.Screened | dict[str, Any]:
        """Stage 3 (rules in :mod:`node.answer.screen`): what may be shown, best first; or
        the answer of a deeper search that failed. The owner's hits only get canonical ids."""
        q.marks["gate"] = time.perf_counter()
        top_k, peer = q.req["topK"], q.peer
        if peer is None:
            return screen.Screened(screen.owner_ids(hits, self._canonical, self._source_names)[:top_k], controller)

        def deeper(limit: int) -> tuple[list[Any], dict[str, Any]] | dict[str, Any] | None:
            if q.deadline is not None and time.monotonic() >= q.deadline:
                return None
            return self._search(q, limit)

        return screen.for_peer(self._gate, q.policy, peer.name, peer.key, q.req["query"], q.lens,
                               top_k, hits, controller, deeper)

    def _render(self, q: _Query, shown: screen.Screened) -> dict[str, Any]:
        """Stage 4 (:func:`node.answer.render.render`): the envelope, or the answer with
        nothing to show."""
        t_envelope = time.perf_counter()
        if q.timings is not None:
            q.timings.update(search=q.marks["gate"] - q.marks["search"],
                             gate=t_envelope - q.marks["gate"])
        limit = None
        if q.peer is not None and q.peer.key is not None:
            limit = q.policy.quota_for(q.peer.name).max_message_bytes - MESSAGE_OVERHEAD_BYTES
        answer = render.render(q.req, q.plan, shown, limit=limit, syncing=self._syncing,
                               nothing=lambda: self._nothing(None, q))
        if q.timings is not None and answer["envelope"]["results"]:
            q.timings["envelope"] = time.perf_counter() - t_envelope
        return answer

    # --- the stages' helpers ------------------------------------------------------------
    def _charge(self, peer: PeerView, policy: Any) -> dict[str, Any] | None:
        """Charge one query to the peer's quota (under ``policy``); the refusal, or None."""
        if self._limiter is None or peer.key is None:
            return None
        shared = policy.anonymous_quota() if peer.name is None else None
        verdict = self._limiter.take(peer.key, policy.quota_for(peer.name), shared)
        if verdict.ok:
            return None
        if verdict.denied:
            return {"status": "policy-denied"}
        return {"status": "rate-limited", "retry_after_s": verdict.retry_after_s}

    def _nothing(self, reason: str | None, q: _Query) -> dict[str, Any]:
        """:func:`node.answer.render.nothing` for ``q`` (a peer's after the time floor)."""
        floor = q.started + NO_RESULT_FLOOR_S if q.peer is not None else None
        return render.nothing(reason, self._corpus, q.req, q.plan, until=floor)

    def _canonical(self, source_id: str) -> str:
        """The owner view's wire id of a source: the same NFC id the gate gives peers."""
        if self._normalize is None:
            from node.corpus.sources import SourceNormalizer

            self._normalize = SourceNormalizer(self._corpus.roots())
        return self._normalize(source_id) or source_id

    def check_versions(self, items: Any, view: PeerView) -> dict[str, Any]:
        """Are these cited document versions still current, as ``view`` may know?
        (:func:`node.answer.screen.check_versions`: ``unavailable`` without a version
        secret, a corpus or a gate.)"""
        lens = None
        if self.versions is not None and self._gate is not None:
            try:
                lens = self.lens_for(view)
            except CorpusError:
                pass
        return screen.check_versions(items, self._corpus, self.versions, lens)

    def _document_text(self, source_id: str) -> tuple[str, str] | None:
        """:meth:`node.corpus.store.Corpus.document_text` of a stored id, or of its NFD form
        (a canonical id differs from the stored one only in Unicode normalisation)."""
        import unicodedata

        found = self._corpus.document_text(source_id)
        nfd = unicodedata.normalize("NFD", source_id)
        return found if found is not None or nfd == source_id else self._corpus.document_text(nfd)

    def versions_for(self, peer_name: str | None) -> Callable[[str | None, str], str | None] | None:
        """How the versions ``peer_name`` (None: anonymous) is given are made, for its signed
        citations (:class:`node.answer.citation.CitationSigner`; specs/citations.md §2):
        None when the current policy scrubs nothing for it (every version is
        :func:`node.answer.citation.keyed_version` of the content hash), else ``(stored
        source id | None, content hash) → version | None`` — :class:`PeerVersions` under
        the kinds its lens scrubs from that document; None for a document its lens does
        not hold, and for every document when there is no version key, corpus or record
        (no citation then: fail closed)."""
        if self._gate is None or not self._gate.current_policy().scrubs_for(peer_name):
            return None
        versions = self.versions
        try:
            lens = self.lens_for(PeerView(peer_name)) if versions is not None else None
        except CorpusError:
            lens = None
        if versions is None or lens is None:
            return lambda stored, content_hash: None

        def version(stored: str | None, content_hash: str) -> str | None:
            if stored is None or not lens.sees(stored):
                return None
            return versions.version(stored, content_hash, lens.kinds(stored))
        return version


    def copy_manifest(self, view: PeerView) -> dict[str, Any]:
        """What ``view`` may keep a copy of (:meth:`node.answer.copies.CopyServer.manifest`;
        ``copy-not-granted`` when this node serves no copies). Charged one query to the
        peer's quota (specs/copies.md §3): refused, it is ``{"refused": "copy-rate-limited",
        "retry_after_s"}`` (the hooks answer that request rate-limited; the session goes on). Never raises for
        peer input."""
        if self.copier is None or view.key is None and view.name is None:
            return {"status": "copy-not-granted", "maxBytes": None, "bytes": 0, "documents": [], "truncated": False}
        refused = self._charge_copy(view, 1)
        return refused if refused is not None else self.copier.manifest(view.name)

    def _charge_copy(self, view: PeerView, cost: int) -> dict[str, Any] | None:
        """Charge a copy request of ``cost`` queries to ``view``'s quota (:meth:`_charge`'s
        buckets); the refusal the hooks turn into ``copy-rate-limited``, or None."""
        if self._limiter is None or view.key is None or self._gate is None:
            return None
        policy = self._gate.current_policy()
        shared = policy.anonymous_quota() if view.name is None else None
        verdict = self._limiter.take(view.key, policy.quota_for(view.name), shared, cost=cost)
        if verdict.ok:
            return None
        return {"refused": "copy-rate-limited", "retry_after_s": verdict.retry_after_s}

    def copy_state(self, peer_name: str | None) -> dict[str, Any] | None:
        """The copy grant state a handshake tells ``peer_name`` (None: anonymous)
        (:meth:`node.answer.copies.CopyServer.state`), or None when this node serves no
        copies (the handshake then says nothing)."""
        return None if self.copier is None else self.copier.state(peer_name)

    def copy_documents(self, sources: Any, view: PeerView,
                       scrubbed: dict[str, int] | None = None) -> dict[str, Any]:
        """The signed, scrubbed documents ``view`` may keep among ``sources``
        (:meth:`node.answer.copies.CopyServer.documents`, ``scrubbed`` its counts); all
        ``refused`` without a copier. Charged to the peer's quota by bytes: one query, plus
        one per :data:`COPY_BYTES_PER_QUERY` of text sent (at most the quota's burst);
        refused, nothing is sent: ``{"refused": "copy-rate-limited", "retry_after_s"}``."""
        wanted = [s for s in sources if isinstance(s, str)] if isinstance(sources, list) else []
        if self.copier is None:
            return {"documents": [], "refused": wanted, "more": [], "tooLarge": []}
        counts: dict[str, int] = {}
        out = self.copier.documents(view.name, wanted, counts)
        sent = sum(len(d["text"].encode("utf-8", "surrogatepass")) for d in out.get("documents") or []
                   if isinstance(d, dict) and isinstance(d.get("text"), str))
        refused = self._charge_copy(view, 1 + sent // COPY_BYTES_PER_QUERY)
        if refused is not None:
            return refused
        if scrubbed is not None:
            for kind, n in counts.items():
                scrubbed[kind] = scrubbed.get(kind, 0) + n
        return out


def peer_knowledge(corpus: Any, gate: Any, peer_name: str | None, *, peer_key: str | None = None,
                   limiter: Any = None) -> Knowledge:
    """Shorthand: ``AnswerService(corpus, gate, limiter=limiter).knowledge_for(
    PeerView(peer_name, peer_key))`` (tools and tests answering as one peer)."""
    return AnswerService(corpus, gate, limiter=limiter).knowledge_for(PeerView(peer_name, peer_key))


_local_services: weakref.WeakKeyDictionary[Any, AnswerService] = weakref.WeakKeyDictionary()
_local_lock = threading.Lock()


def answer_local(corpus: Any, body: Any, *, scope_sources: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Answer ``body`` over ``corpus`` (or None: no corpus yet) as the owner
    (:data:`OWNER`) — ``kith search``, ``POST /search``, MCP's local search; an agent's
    ``scope_sources`` narrow it (:meth:`AnswerService.answer`). One service per corpus
    object is kept while the corpus lives."""
    if corpus is None:
        return AnswerService(None).answer(body, OWNER, scope_sources=scope_sources)
    with _local_lock:
        service = _local_services.get(corpus)
        if service is None:
            service = _local_services[corpus] = AnswerService(corpus)
    return service.answer(body, OWNER, scope_sources=scope_sources)


__all__ = ["AnswerService", "Knowledge", "MESSAGE_OVERHEAD_BYTES", "NO_RESULT_FLOOR_S", "OWNER",
           "OwnerView", "PeerView", "View", "answer_local", "peer_knowledge"]
