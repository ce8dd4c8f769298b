"""The answer service: the ONE place a search is answered (DESIGN §8, §10, §11; issue 9).

Every entry point hands a request and a *view* to :meth:`AnswerService.answer` and only
adapts input and output:

* the owner's view (:data:`OWNER`) — ``kith search``, the local API's ``POST /search``,
  MCP's local search: sees every tier, no quota, no approvals;
* a peer's view (:class:`PeerView`: key + registry name) — the knowledge-query ``query``
  through ``ctx.knowledge`` (:meth:`AnswerService.knowledge_for`): the current policy per
  (peer, source), the peer's quota, ``ask`` approvals, answers trimmed to the peer's
  ``max_message_bytes``, and the no-oracle time floor.

The same steps run for both, in this order: charge the quota (peers) → validate the
request (:func:`node.answer.contract.validate`) → ``remainingBudgetMs`` 0 answers
``budget-exhausted`` without touching the index → search with the budget's deadline and
the request's ``dedupe`` → the view's gate (peers: :meth:`node.policy.gate.EgressGate.screen`)
→ canonical (NFC) source ids → the envelope, built from the plan the search made →
``index-syncing`` when nothing may be shown while the index lags its record, or
``quality.flags.indexSyncing`` on a non-empty answer. A peer's results never carry the
document's bare content hash (``provenance.contentHash`` is ``""``). The leak scan is NOT here: it is the
gate seam every outgoing frame passes once (:meth:`node.policy.gate.EgressGate.check_frame`,
called by the session engine with the encoded frame).

No oracle: an answer with nothing to show is :func:`node.answer.envelope.empty_envelope`
of the reason and the request only; for a peer it also takes at least
:data:`NO_RESULT_FLOOR_S` from the request, whether nothing matched or policy withheld
every match.

Statuses: ``ok``, ``no-verified-results``, ``invalid-request`` (plus ``error``:
``{"code", "message"}``), ``budget-exhausted``, ``index-syncing``, ``index-unavailable``,
``pending-approval`` (plus ``approval_id`` when a request file was written; the envelope
holds the results the peer may see now, empty when there are none),
``rate-limited`` (plus ``retry_after_s``, whole seconds), ``policy-denied``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from node.answer import contract
from node.answer import envelope as env
from node.common.errors import CorpusError
from node.corpus.retrieval import make_plan
from node.corpus.sources import carried_id, folders_resolved_once

log = logging.getLogger("kith.answer")

MAX_CANDIDATES = 100  # the corpus search's own bound on ``limit``
#: hits asked of a view's own search per requested result when the first search, for
#: exactly ``topK`` (ranked as the owner's search of the same view would be), came back
#: full but the gate left fewer than ``topK`` to show: the view already holds only
#: sources the peer may see or ask about; the margin covers ``ask`` sources the owner
#: denied or nobody decided yet and hits the gate's origin check drops. (Asking for
#: ``2 × topK`` every time cost a peer 1.1-1.4× the owner's answer, and ranked worse:
#: the top 10 of a 20-hit search differ from a 10-hit search's — its pools are twice as
#: deep — in 49 of 53 eval questions at 93k chunks; scripts/eval --split dev python-docs
#: nDCG@10 0.687 against 0.703 for the ``topK`` search kith@view measures.)
VIEW_CANDIDATES_PER_RESULT = 2
#: view predicates kept (one per (gate, policy, peer name)).
MAX_PREDICATES = 256
_predicates: dict[tuple[int, int, str | None], tuple[Any, Any, Callable[[str], bool]]] = {}
_predicates_lock = threading.Lock()
#: seconds a peer's answer with nothing to show takes at least, counted from the request:
#: the search plus the gate's work on withheld candidates (≈0.1 ms each, at most 100) stays
#: under it on a typical corpus, so "nothing matched" and "only private sources matched"
#: take the same time. A larger floor hides more but every empty answer pays it (the load
#: benchmark: 30 ms cost join→first-answer 16 → 49 ms); 10 ms covers the measured gap
#: (private match 4.6 ms vs no match 1.8 ms over iroh).
NO_RESULT_FLOOR_S = 0.010
#: bytes of the ``results`` message outside the envelope (action, query_id ≤ 64, status,
#: retry/approval fields), counted against ``max_message_bytes``.
MESSAGE_OVERHEAD_BYTES = 256

_encode = msgspec.json.Encoder().encode


class Knowledge(Protocol):
    """What a Host's hooks get in ``HookContext.knowledge`` (DESIGN §10): the corpus as
    one peer may see it, and nothing else."""

    def search(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one search request (the flat body of DESIGN §8 without ``action`` /
        ``query_id``): ``{"status": str, "envelope": dict, ...}`` (module docstring).
        Never raises for bad input."""
        ...

    def small(self, request: Mapping[str, Any]) -> bool:
        """True when answering ``request`` is known to be small work — the hooks may then
        answer on the host's event loop (node/runtime/hooks.py ``inline``): see
        :meth:`AnswerService.small`. Cheap, never blocks, never raises."""
        ...


@dataclass(frozen=True)
class OwnerView:
    """The node owner's own view: every tier, no quota, no approvals."""


#: The owner's view (one instance; views are compared by type).
OWNER = OwnerView()


@dataclass(frozen=True)
class PeerView:
    """One peer's view.

    Attributes:
        name: the peer's registry name, or None for an anonymous peer (sees ``public``
            sources only).
        key: the peer's public key (64 hex): quotas and approvals are per key. None
            (tests, tools) → no quota and no approvals.
    """

    name: str | None
    key: str | None = None


View = OwnerView | PeerView


#: The most CPU time (s) the last answer of a peer view may have cost for the next one
#: of the same shape to count as small (:meth:`AnswerService.small`; issue 31).
INLINE_CPU_S = 0.010
#: Request fields a small answer may have: no filters (a filtered search may go several
#: rounds deeper), no budget or dedupe changes.
_INLINE_FIELDS = frozenset({"query", "topK"})
#: Peer views whose last answer's cost is kept (oldest dropped).
MAX_WARM_VIEWS = 1024


class AnswerService:
    """Answers every search of one node (module docstring).

    Args:
        corpus: a :class:`node.corpus.store.Corpus` (usually read-only), or None when the
            home has no corpus yet (every search answers ``index-unavailable``).
        gate: the :class:`node.policy.gate.EgressGate` applying the policy for peer views;
            None when only the owner's view is answered (local tools).
        limiter: a shared :class:`node.policy.quota.RateLimiter` (one per Host process),
            or None for no rate limit.
        version_key: the host's document-version secret
            (:func:`node.answer.citation.load_version_key`), or None: then
            :meth:`check_versions` can say nothing (``unavailable``).
    """

    def __init__(self, corpus: Any, gate: Any = None, *, limiter: Any = None,
                 version_key: bytes | None = None) -> None:
        self._corpus = corpus
        self._gate = gate
        self._limiter = limiter
        self._version_key = version_key
        self._normalize: Callable[[str], str | None] | None = None
        self._synced_once = False  # a sync of this corpus has completed (``last_sync`` is set)
        #: view -> (state token, CPU seconds) of its last answer (:meth:`small`)
        self._costs: dict[PeerView, tuple[Any, float]] = {}

    # --- small answers -----------------------------------------------------------------
    def _state(self, wait: bool = False) -> Any:
        """What a view's answer cost depends on besides the request: the corpus's change
        generation and the policy object; None when the corpus is busy (its lock is held
        by a search or a sync) and ``wait`` is False — an event loop never waits for it."""
        policy = id(self._gate.current_policy()) if self._gate is not None else None
        corpus = self._corpus
        if corpus is None:
            return (None, policy)
        record = corpus.record
        if not record.lock.acquire(blocking=wait):
            return None
        try:
            from node.corpus.views import generation

            return (generation(record.db) if record.db is not None else None, policy)
        except Exception:  # a closed or broken record: not known to be small
            return None
        finally:
            record.lock.release()

    def small(self, body: Any, view: PeerView) -> bool:
        """True when answering ``body`` as ``view`` is known to be small work: a plain
        request (``query`` and ``topK`` only), and the view's last answer cost at most
        :data:`INLINE_CPU_S` of CPU with the same corpus generation and policy (so the
        view's index is built and current: a first answer, a sync or a policy change since
        is not small). Only *where* the answer runs depends on it, never what it says.
        Cheap, never blocks (a busy corpus is not small), never raises."""
        try:
            if not isinstance(body, Mapping) or not _INLINE_FIELDS.issuperset(body):
                return False
            last = self._costs.get(view)
            if last is None or last[1] > INLINE_CPU_S:
                return False
            state = self._state()
            return state is not None and state == last[0]
        except Exception:
            return False

    def _answered(self, view: PeerView, cpu_s: float) -> None:
        """Keep the CPU time of ``view``'s last answer and the state it was made in (a
        worker thread waits for the corpus lock; the event loop does not)."""
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        state = self._state(wait=not on_loop)
        if state is None:
            self._costs.pop(view, None)
            return
        if view not in self._costs and len(self._costs) >= MAX_WARM_VIEWS:
            self._costs.pop(next(iter(self._costs)))
        self._costs[view] = (state, cpu_s)

    # --- views --------------------------------------------------------------------------
    def knowledge_for(self, view: PeerView) -> Knowledge:
        """The ``ctx.knowledge`` handle answering as ``view`` (see :class:`Knowledge`)."""
        return _Handle(self, view)

    def _canonical(self, source_id: str) -> str:
        """The owner view's wire id of a source: the same NFC id the gate gives peers."""
        if self._normalize is None:
            from node.corpus.sources import SourceNormalizer

            self._normalize = SourceNormalizer(self._corpus.roots())
        return self._normalize(source_id) or source_id

    def _visible(self, view: PeerView, policy: Any) -> Callable[[str], bool]:
        """``source_id → may this peer see it or be asked about it (ask tier)``, from the
        gate's per-source decision under ``policy``. The same predicate object is returned
        for the same (gate, policy, peer name) — across services too — so the corpus's
        per-view caches apply; at most :data:`MAX_PREDICATES` are kept (oldest dropped).
        The predicate carries ``many`` (a list of source ids → the same answers, in
        order, decided per folder where the policy allows:
        :meth:`node.policy.gate.EgressGate.decide_many`), which a view's first visible
        set uses (:meth:`node.corpus.views.Views.visible_docs`).

        When ``policy`` scrubs anything for this peer (``[scrub]``, specs/policy.md §9)
        the predicate also carries ``scrub`` (``source_id → frozenset`` of the kinds
        scrubbed from that source for this peer: its view is indexed over the scrubbed
        text, node/corpus/views.py), ``scrub_many`` (the same for a list of source ids,
        per folder) and ``scrub_memo`` (the same per canonical id, kept for
        :meth:`answer`)."""
        gate, name = self._gate, view.name
        key = (id(gate), id(policy), name)
        with _predicates_lock:
            entry = _predicates.get(key)
            if entry is not None and entry[0] is gate and entry[1] is policy:
                return entry[2]

            def visible(source_id: str) -> bool:
                d = gate.decide(source_id, name, policy=policy)
                return bool(d.allowed or (d.tier == "ask" and d.canonical is not None))

            def many(source_ids: list[str]) -> list[bool]:
                # the same answers, decided per folder where the policy allows
                return [bool(d.allowed or (d.tier == "ask" and d.canonical is not None))
                        for d in gate.decide_many(source_ids, name, policy=policy)]

            visible.many = many  # type: ignore[attr-defined]  # node/corpus/views.py

            if policy.scrubs_for(name):
                def kinds_of(source_id: str) -> frozenset[str]:
                    return policy.scrub_kinds(gate.decide(source_id, name, policy=policy).canonical, name)

                # the view's index is built over the scrubbed text (node/corpus/views.py)
                def kinds_many(source_ids: list[str]) -> list[frozenset[str]]:
                    return [policy.scrub_kinds(d.canonical, name)
                            for d in gate.decide_many(source_ids, name, policy=policy)]

                visible.scrub = kinds_of  # type: ignore[attr-defined]
                visible.scrub_many = kinds_many  # type: ignore[attr-defined]
                visible.scrub_memo = {}  # type: ignore[attr-defined]  # canonical id -> kinds
                visible.scrub_shown = {}  # type: ignore[attr-defined]  # source id -> its scrubbed id (check_versions)

            if len(_predicates) >= MAX_PREDICATES:
                _predicates.pop(next(iter(_predicates)))
            _predicates[key] = (gate, policy, visible)
            return visible

    # --- the answer ---------------------------------------------------------------------
    def answer(self, body: Any, view: View = OWNER, *,
               timings: dict[str, float] | None = None) -> dict[str, Any]:
        """Answer one search request as ``view``.

        Args:
            body: the flat request body (:mod:`node.answer.contract`), unvalidated.
            view: :data:`OWNER` or a :class:`PeerView`.
            timings: when given, filled with the seconds the answer spent per stage —
                ``search`` (``Corpus.search_hits``), ``gate`` (the view's screen / the
                owner's id normalization) and ``envelope`` (build, index-syncing mark,
                trim) — for ``scripts/bench``'s profile; never part of the answer.

        Returns:
            ``{"status": str, "envelope": dict}`` plus ``error`` / ``approval_id`` /
            ``retry_after_s`` by status (module docstring). Never raises for bad input;
            never carries a path or exception text.
        """
        started = time.monotonic()
        peer = view if isinstance(view, PeerView) else None
        policy = refused = None
        if peer is not None:
            if self._gate is None:
                raise ValueError("a peer view needs a gate")
            policy = self._gate.current_policy()  # one policy for the whole query (DESIGN §10)
            refused = self._admit(peer, policy)
        try:
            req = contract.validate(body)
        except CorpusError as exc:
            if refused is not None:
                return {**refused, "envelope": env.empty_envelope(refused["status"], None)}
            return _invalid(exc)
        plan = make_plan(req["query"])  # the one plan: the search's (cached) and the envelope's
        if refused is not None:
            return {**refused, "envelope": env.empty_envelope(refused["status"], req, plan=plan)}
        if req["remainingBudgetMs"] == 0:
            return _empty("budget-exhausted", req, plan)
        corpus = self._corpus
        if corpus is None:
            return self._nothing("index-unavailable", req, plan, peer, started)
        t_search = time.perf_counter()
        args = self.search_args(req["topK"], view, policy)
        deadline = contract.server_deadline(req, started)

        def search(limit: int) -> tuple[list[Any], dict[str, Any]]:
            return corpus.search_hits(
                req["query"], filters=req["filters"] or None, deadline=deadline,
                max_per_document=contract.DEDUPE_LEVELS[req["dedupe"]], **{**args, "limit": limit})

        try:
            hits, controller = search(args["limit"])
        except CorpusError as exc:
            if exc.code == "query-invalid":  # e.g. a query of stop words only
                return _invalid(exc, req)
            log.warning("search failed: %s", exc.code)
            return self._nothing(_unavailable_reason(corpus), req, plan, peer, started)
        if not hits and controller.get("stopReason") == "budget-exhausted" and not any(
                p.get("status") == "ran" for p in controller.get("passes", [])):
            return _empty("budget-exhausted", req, plan)
        t_gate = time.perf_counter()
        pending: dict[str, Any] | None = None  # the pending-approval answer, when the best hit waits
        scrubbed: dict[str, int] | None = None  # spans scrubbed per kind (a scrubbed peer only)
        if peer is not None:
            from node.policy.gate import PENDING

            with folders_resolved_once():  # the hits' folders are resolved once per answer
                screened = _screen_copies(self._gate, hits, peer, req["query"], policy)
                wider = min(MAX_CANDIDATES, req["topK"] * VIEW_CANDIDATES_PER_RESULT)
                if (len(hits) >= args["limit"] and wider > args["limit"]
                        and (deadline is None or time.monotonic() < deadline)
                        and sum(state != PENDING for _, state in screened) < req["topK"]):
                    # the gate held some back and the view may hold more: search deeper
                    try:
                        hits, controller = search(wider)
                    except CorpusError as exc:
                        if exc.code == "query-invalid":
                            return _invalid(exc, req)
                        log.warning("search failed: %s", exc.code)
                        return self._nothing(_unavailable_reason(corpus), req, plan, peer,
                                             started)
                    screened = _screen_copies(self._gate, hits, peer, req["query"], policy)
            if screened and screened[0][1] == PENDING:
                pending = self._pending(peer, req, plan, screened)
            shown = [hit for hit, state in screened if state != PENDING]
            memo = getattr(args["visible"], "scrub_memo", None)
            if memo is not None:
                # the scrubbing gate, after policy, before the envelope; the screened ids
                # are canonical already, so the policy decides them without the roots
                # (kept per predicate: one (policy, peer), so a reload starts afresh)
                def kinds_of(source_id: str) -> frozenset[str]:
                    kinds = memo.get(source_id)
                    if kinds is None:
                        if len(memo) >= 100_000:
                            memo.clear()
                        kinds = memo[source_id] = policy.scrub_kinds(source_id, peer.name)
                    return kinds

                shown, scrubbed = scrub_hits(shown, kinds_of)
            controller = _gated_controller(controller, len(shown))
        else:
            canonical: dict[str, str] = {}  # one normalization per source per answer

            def owned(h: Any) -> Any:
                return _with_id(h, carried_id(h) or canonical.get(h.source_id)
                                or canonical.setdefault(h.source_id, self._canonical(h.source_id)))

            with folders_resolved_once():  # only for hits without a carried id
                shown = [_with_copies(owned(h), [owned(d) for d in h.duplicates])
                         if h.duplicates else owned(h) for h in hits]
        top = shown[: req["topK"]]
        if peer is not None:  # a guest never gets a document's bare hash (specs/citations.md §2)
            top = [_unhashed(h) for h in top]
        t_envelope = time.perf_counter()
        if timings is not None:
            timings.update(search=t_gate - t_search, gate=t_envelope - t_gate)
        if not top:
            return _counted(pending or self._nothing(None, req, plan, peer, started), scrubbed)
        envelope = env.build_envelope(req, top, controller, plan=plan)
        syncing = self._syncing_while(controller)
        if syncing:  # before the size check: the flag is part of what is sent
            env.mark_index_syncing(envelope)
        if peer is not None:
            envelope = self._fit(envelope, req, plan, top, controller, peer, policy, syncing)
            if envelope is None:
                return _counted(pending or self._nothing(None, req, plan, peer, started), scrubbed)
        if timings is not None:
            timings["envelope"] = time.perf_counter() - t_envelope
        if pending is not None:
            # what the peer may see now goes with the pending status (specs/approvals.md §1)
            return _counted({**pending, "envelope": envelope}, scrubbed)
        return _counted({"status": "ok", "envelope": envelope}, scrubbed)

    def check_versions(self, items: Any, view: PeerView) -> dict[str, Any]:
        """Are these cited document versions still current? (``kith verify
        --against-host``, the knowledge-query ``check`` message; specs/citations.md §5.)

        Args:
            items: ``[{"source": str, "version": 64 hex}]`` (at most
                :data:`node.answer.contract.MAX_CHECK_ITEMS`; malformed items are
                ``unknown``).
            view: the asking peer: a source it may not see is ``unknown``, exactly as one
                that does not exist (no oracle).

        Returns:
            ``{"status": "ok" | "unavailable", "versions": [{"source", "version",
            "state": "current" | "stale" | "unknown"}]}`` in the order asked;
            ``unavailable`` (every state ``unknown``) when this host keeps no version
            secret or has no corpus.
        """
        from node.answer.citation import keyed_version
        from node.answer.contract import MAX_CHECK_ITEMS

        asked = [i for i in items if isinstance(i, dict)][:MAX_CHECK_ITEMS] if isinstance(items, list) else []
        pairs = [(i.get("source") if isinstance(i.get("source"), str) else "",
                  i.get("version") if isinstance(i.get("version"), str) else "") for i in asked]
        if self._version_key is None or self._corpus is None or self._gate is None:
            return {"status": "unavailable",
                    "versions": [{"source": s, "version": v, "state": "unknown"} for s, v in pairs]}
        visible = self._visible(view, self._gate.current_policy())
        shown = self._shown_sources(visible, {s for s, _ in pairs if s})
        hashes = self._corpus.content_hashes(sorted({r for ids in shown.values() for r in ids}))
        out = []
        for source, version in pairs:
            keyed = {keyed_version(self._version_key, hashes[r]) for r in shown.get(source, ()) if r in hashes}
            state = "unknown" if not keyed else "current" if version in keyed else "stale"
            out.append({"source": source, "version": version, "state": state})
        return {"status": "ok", "versions": out}

    def _shown_sources(self, visible: Callable[[str], bool], asked: set[str]) -> dict[str, list[str]]:
        """``{asked id: [stored source ids this peer is shown under that id]}`` for
        :meth:`check_versions`. Without scrubbing, an id the peer may see is shown as
        itself. For a scrubbed peer (``visible.scrub``, specs/policy.md §9) a source is
        shown under its *scrubbed* id: an asked id holding a placeholder is matched
        against the scrubbed ids of the sources it may see (several sources may share
        one), and an id holding a value the peer's scrub removes matches nothing — a
        check is no oracle for a scrubbed value. A source whose scrubbing fails is left
        out (fail closed). The scrubbed ids are kept on the predicate (``scrub_shown``
        per source, ``scrub_by_shown`` per record state, one policy's kinds), so a check
        costs one read of the record's source ids and the visibility of the candidates,
        not a scrub and a policy decision per document."""
        from node.policy.scrub import PLACEHOLDER, ScrubFailed, scrub

        kinds_of = getattr(visible, "scrub", None)
        memo: dict[str, str | None] = getattr(visible, "scrub_shown", {})  # source id -> shown id

        def shown_as(source_id: str) -> str | None:
            if kinds_of is None:
                return source_id
            if source_id not in memo:
                try:
                    memo[source_id] = scrub(source_id, kinds_of(source_id))
                except ScrubFailed:
                    return None  # not kept: it fails closed again next time
            return memo[source_id]

        out: dict[str, list[str]] = {s: [s] for s in asked if visible(s) and shown_as(s) == s}
        if kinds_of is not None and any(p in s for s in asked for p in PLACEHOLDER.values()):
            assert self._corpus is not None
            ids = self._corpus.source_ids()
            stamp = (len(ids), hash(tuple(ids)))
            kept = getattr(visible, "scrub_by_shown", None)
            if kept is None or kept[0] != stamp:  # the record's documents changed
                by_shown: dict[str, list[str]] = {}
                for source_id in ids:
                    as_shown = shown_as(source_id)
                    if as_shown is not None and as_shown != source_id:
                        by_shown.setdefault(as_shown, []).append(source_id)
                kept = (stamp, by_shown)
                try:
                    visible.scrub_by_shown = kept  # type: ignore[attr-defined]
                except AttributeError:
                    pass
            for shown in asked:
                found = [r for r in kept[1].get(shown, ()) if visible(r)]
                if found:
                    out.setdefault(shown, []).extend(found)
        return out

    def warm(self, view: PeerView) -> int:
        """Build the index ``view`` searches on now (:meth:`node.corpus.store.Corpus.warm_view`),
        so its first query does not pay for it: a host warms the anonymous view at start
        (about 1.6 s for the 13,003 chunks of python-docs-3.11 on 2 cores).

        Returns:
            The number of documents the view holds (0 without a corpus).

        Raises:
            CorpusError: ``index-unavailable``.
        """
        if self._corpus is None:
            return 0
        return self._corpus.warm_view(self.search_args(1, view)["visible"])

    def search_args(self, top_k: int, view: View, policy: Any = None) -> dict[str, Any]:
        """The ``Corpus.search_hits`` arguments an answer for ``view`` uses besides the
        request's own: ``limit`` (hits asked for) and, for a peer, ``visible`` (its
        predicate under ``policy``, default the gate's current policy): a peer is ranked
        on its own view (post-gate ranking, :mod:`node.corpus.views`). ``scripts/bench``
        measures its baseline with the same. A peer's search asks for ``top_k`` too;
        :meth:`answer` searches again for :data:`VIEW_CANDIDATES_PER_RESULT` × ``top_k``
        only when the gate left fewer than ``top_k`` to show."""
        if not isinstance(view, PeerView):
            return {"limit": top_k}
        policy = policy if policy is not None else self._gate.current_policy()
        return {"limit": top_k, "visible": self._visible(view, policy)}

    def _fit(self, envelope: dict[str, Any], req: dict[str, Any], plan: Any, top: list[Any],
             controller: dict[str, Any], peer: PeerView, policy: Any,
             syncing: bool) -> dict[str, Any] | None:
        """The envelope cut to the peer's ``max_message_bytes`` (quota, less
        :data:`MESSAGE_OVERHEAD_BYTES`): the lowest-ranked results are dropped; None when
        not even one result fits.

        One encode measures the envelope; when it is too large, each result's own bytes
        (its ``results`` and ``citationPack`` entries, :func:`node.answer.envelope.result_sizes`)
        say how many to drop, and the envelope is rebuilt once for the kept prefix (and
        measured again: synthesis and coverage change with the results, so the estimate is
        checked; a still-too-large envelope drops one more result per rebuild).
        ``syncing``: mark each rebuilt envelope ``indexSyncing`` before it is measured."""
        if peer.key is None:
            return envelope
        limit = policy.quota_for(peer.name).max_message_bytes - MESSAGE_OVERHEAD_BYTES
        size = len(_encode(envelope))
        while size > limit:
            if len(top) == 1:
                return None
            sizes = env.result_sizes(envelope)
            keep = len(top)
            while keep > 1 and size > limit:  # at least one is always dropped
                keep -= 1
                size -= sizes[keep]
            top = top[:keep]
            envelope = env.build_envelope(req, top, controller, plan=plan)
            if syncing:
                env.mark_index_syncing(envelope)
            size = len(_encode(envelope))
        return envelope

    def _syncing_while(self, controller: Mapping[str, Any]) -> bool:
        """Whether a shown answer is marked ``indexSyncing``: the index lagged its record
        while searching (``indexLag``, which the search measured under the corpus lock),
        or no sync has completed yet. The latter is asked of the corpus
        (:meth:`Corpus.index_syncing`) only until it once says settled: ``last_sync``,
        once written, is never removed, so afterwards the search's own lag is the whole
        answer and an answer takes the corpus lock once, not twice."""
        if controller.get("indexLag"):
            return True
        if self._synced_once:
            return False
        syncing = _syncing(self._corpus)
        self._synced_once = not syncing
        return syncing

    def _nothing(self, reason: str | None, req: dict[str, Any], plan: Any,
                 peer: PeerView | None, started: float) -> dict[str, Any]:
        """An answer with nothing to show: ``reason``, or ``index-syncing`` while the index
        lags its record, else ``no-verified-results``; for a peer after the time floor."""
        if reason is None:
            reason = "index-syncing" if _syncing(self._corpus) else "no-verified-results"
        if peer is not None:
            # same time floor whether nothing matched or policy withheld every match, so
            # the answer's timing is no oracle either (DESIGN §8)
            _wait_until(started + NO_RESULT_FLOOR_S)
        return _empty(reason, req, plan)

    def _admit(self, peer: PeerView, policy: Any) -> dict[str, Any] | None:
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

    def _pending(self, peer: PeerView, req: dict[str, Any], plan: Any,
                 screened: list[tuple[Any, str]]) -> dict[str, Any]:
        """``pending-approval`` with the empty envelope (:meth:`answer` puts the visible
        results in it when there are any): record the undecided ``ask`` sources among the
        top results and name the request in ``approval_id``."""
        from node.policy.gate import PENDING

        answer = _empty("pending-approval", req, plan)
        approvals = self._gate.approvals
        if approvals is None or peer.key is None:
            return answer
        sources = list(dict.fromkeys(hit.source_id for hit, state in screened[: req["topK"]]
                                     if state == PENDING))
        try:
            record = approvals.request(peer.key, peer.name, req["query"], sources)
        except OSError:
            log.error("could not write an approval request")
            return answer
        if record is None:
            log.warning("too many open approval requests; not recording another")
        else:
            answer["approval_id"] = record.id
            log.warning("approval request %s waits for `kith approvals approve|deny`", record.id)
        return answer


class _Handle:
    """:class:`Knowledge` for one peer view (holds the service privately)."""

    __slots__ = ("__service", "__view")

    def __init__(self, service: AnswerService, view: PeerView) -> None:
        self.__service = service
        self.__view = view

    @property
    def peer_name(self) -> str | None:
        """The peer's registry name (None: anonymous)."""
        return self.__view.name

    @property
    def peer_key(self) -> str | None:
        """The peer's public key (64 hex), or None."""
        return self.__view.key

    def search(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`Knowledge.search` as this peer (its CPU time is kept for :meth:`small`)."""
        cpu = time.thread_time()
        answer = self.__service.answer(request, self.__view)
        self.__service._answered(self.__view, time.thread_time() - cpu)
        return answer

    def small(self, request: Mapping[str, Any]) -> bool:
        """:meth:`AnswerService.small` as this peer."""
        return self.__service.small(request, self.__view)

    def check_versions(self, items: Any) -> dict[str, Any]:
        """:meth:`AnswerService.check_versions` as this peer."""
        return self.__service.check_versions(items, self.__view)


def peer_knowledge(corpus: Any, gate: Any, peer_name: str | None, *, peer_key: str | None = None,
                   limiter: Any = None) -> Knowledge:
    """Shorthand: ``AnswerService(corpus, gate, limiter=limiter).knowledge_for(
    PeerView(peer_name, peer_key))`` (tools and tests answering as one peer)."""
    return AnswerService(corpus, gate, limiter=limiter).knowledge_for(PeerView(peer_name, peer_key))


_local_services: weakref.WeakKeyDictionary[Any, AnswerService] = weakref.WeakKeyDictionary()
_local_lock = threading.Lock()


def answer_local(corpus: Any, body: Any) -> dict[str, Any]:
    """Answer ``body`` over ``corpus`` (or None: no corpus yet) as the owner
    (:data:`OWNER`) — ``kith search``, ``POST /search``, MCP's local search. One service
    per corpus object is kept while the corpus lives."""
    if corpus is None:
        return AnswerService(None).answer(body, OWNER)
    with _local_lock:
        service = _local_services.get(corpus)
        if service is None:
            service = _local_services[corpus] = AnswerService(corpus)
    return service.answer(body, OWNER)


# --- helpers -------------------------------------------------------------------------------

def _empty(reason: str, req: dict[str, Any] | None, plan: Any = None) -> dict[str, Any]:
    return {"status": reason, "envelope": env.empty_envelope(reason, req, plan=plan)}


def _invalid(exc: CorpusError, req: dict[str, Any] | None = None) -> dict[str, Any]:
    # the invalid-request envelope never echoes the request (there may be none)
    return {"status": "invalid-request", "envelope": env.empty_envelope("invalid-request"),
            "error": {"code": exc.code, "message": exc.message}}


def _with_copies(hit: Any, copies: list[Any]) -> Any:
    """``hit`` with ``duplicates`` set to ``copies`` (a new Hit; ``hit`` is unchanged)."""
    import dataclasses

    return dataclasses.replace(hit, duplicates=copies)


def _screen_copies(gate: Any, hits: list[Any], peer: PeerView, query: str,
                   policy: Any) -> list[tuple[Any, str]]:
    """The gate's screen (:meth:`node.policy.gate.EgressGate.screen`) of ``hits`` and of
    their collapsed copies (``Hit.duplicates``, issue 20 item 6), regrouped: each group of
    identical texts becomes one ``(hit, state)`` — its first visible member, else its
    first pending one — whose ``duplicates`` are the group's other *visible* members
    (canonical ids). A copy the peer may not see is never listed, and never hides a copy
    it may: the group is decided member by member, so the answer depends only on what
    the gate lets this peer see or ask about."""
    from node.policy.gate import VISIBLE

    flat: list[Any] = []
    group_of: list[int] = []
    for g, hit in enumerate(hits):
        for member in (hit, *hit.duplicates):
            flat.append(member)
            group_of.append(g)
    if len(flat) == len(hits):  # nothing collapsed: the plain screen
        return gate.screen(hits, peer.name, peer.key, query, policy=policy)
    # the gate drops what it withholds; match its output back to the members by identity
    # of (chunk id, position order): screen keeps order, so walk both lists together
    screened = gate.screen(flat, peer.name, peer.key, query, policy=policy)
    members: dict[int, list[tuple[Any, str]]] = {}
    i = 0
    for hit, state in screened:
        while flat[i].chunk_id != hit.chunk_id:
            i += 1
        members.setdefault(group_of[i], []).append((hit, state))
        i += 1
    out: list[tuple[Any, str]] = []
    for g in sorted(members):
        group = members[g]
        seen = [h for h, st in group if st == VISIBLE]
        if seen:
            out.append((_with_copies(seen[0], seen[1:]), VISIBLE))
        else:
            out.append((_with_copies(group[0][0], []), group[0][1]))
    return out


def _unhashed(hit: Any) -> Any:
    """``hit`` (and its copies) without its document's content hash: a peer's envelope says
    ``contentHash: ""``, so a guest can neither confirm a guess of a whole document by
    hashing it nor watch its edits (the keyed version of a signed citation is the only
    version a peer sees)."""
    import dataclasses

    if not hit.content_hash and not hit.duplicates:
        return hit
    return dataclasses.replace(hit, content_hash="", duplicates=[_unhashed(d) for d in hit.duplicates])


def scrub_hits(hits: list[Any], kinds_of: Callable[[str], frozenset[str]]
               ) -> tuple[list[Any], dict[str, int]]:
    """The scrubbing gate (issue 24 item 3; specs/policy.md §9): each hit with every span
    of the kinds ``kinds_of(source id)`` names replaced by its placeholder
    (:func:`node.policy.scrub.scrub`) in what the envelope is built from — text (hence
    previews, excerpts and synthesis), source id, heading path, metadata strings — and in
    its collapsed copies' source ids (each with its own source's kinds).

    Args:
        hits: screened hits (canonical ids), best first.
        kinds_of: ``canonical source id -> frozenset`` of kinds to scrub
            (:meth:`node.policy.store.Policy.scrub_kinds` of that source for this peer).

    Returns:
        ``(hits, counts)``: the hits in order (unchanged objects where nothing applies;
        a hit whose scrubbing failed is left out — fail closed), and the spans replaced
        per kind plus ``refused``, the hits left out (only kinds with a count; never a
        value). What the audit records for the answer.
    """
    import dataclasses

    from node.policy.scrub import ScrubFailed, scrub_cached, scrub_fields

    counts: dict[str, int] = {}
    out: list[Any] = []
    known: dict[str, frozenset[str]] = {}  # one decision per source per answer

    def one(hit: Any, text: bool) -> Any:
        kinds = known.get(hit.source_id)
        if kinds is None:
            kinds = known[hit.source_id] = kinds_of(hit.source_id)
        if not kinds:
            return hit
        loc = dict(hit.location)
        source, heading, meta = scrub_fields(hit.source_id, loc.get("headingPath") or [],
                                             hit.metadata or {}, kinds, counts)
        if "headingPath" in loc:
            loc["headingPath"] = heading
        body = scrub_cached(hit.chunk_id, hit.text, kinds, counts) if text else hit.text
        return dataclasses.replace(hit, source_id=source, text=body, location=loc, metadata=meta)

    for hit in hits:
        before = dict(counts)
        try:
            new = one(hit, True)
            if hit.duplicates:
                new = dataclasses.replace(new, duplicates=[one(d, False) for d in hit.duplicates])
        except ScrubFailed as exc:
            counts.clear()
            counts.update(before)  # the refused hit's spans never left: not counted
            counts["refused"] = counts.get("refused", 0) + 1
            log.warning("scrub-failed: the %s detector failed; that result is withheld", exc.kind)
            continue
        out.append(new)
    return out, counts


def _counted(answer: dict[str, Any], scrubbed: dict[str, int] | None) -> dict[str, Any]:
    """``answer`` with ``scrubbed`` (counts per kind, for the host's audit; the
    knowledge-query hooks never send it) when the scrubbing gate ran."""
    if scrubbed is not None:
        answer["scrubbed"] = dict(scrubbed)
    return answer


def _with_id(hit: Any, source_id: str) -> Any:
    if source_id == hit.source_id:
        return hit
    import dataclasses

    return dataclasses.replace(hit, source_id=source_id)


def _gated_controller(controller: dict[str, Any], allowed: int) -> dict[str, Any]:
    """The controller report as a peer may see it: which passes ran and how they were
    fused, but never a count taken before the gate (that would reveal how much policy
    withheld)."""
    keep = ("mode", "fusion", "maxPerDocument", "earlyStop", "stopReason")
    out: dict[str, Any] = {k: controller[k] for k in keep if k in controller}
    out["passes"] = [{k: v for k, v in p.items() if k in ("name", "status", "field", "reason")}
                     for p in controller.get("passes") or [] if isinstance(p, dict)]
    out["candidates"] = allowed
    return out


def _wait_until(when: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``when`` (no-op when already past)."""
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _syncing(corpus: Any) -> bool:
    """True while the corpus index is not settled (:meth:`Corpus.index_syncing`)."""
    if corpus is None:
        return False
    try:
        return bool(corpus.index_syncing())
    except Exception:  # noqa: BLE001 - a store that cannot say is treated as settled
        return False


def _unavailable_reason(corpus: Any) -> str:
    """``index-syncing`` while a sync is under way (rows ``processing``, or changes the
    index does not hold yet), else ``index-unavailable``."""
    try:
        st = corpus.stats()
    except Exception:  # noqa: BLE001 - a broken store is simply unavailable
        return "index-unavailable"
    return "index-syncing" if st.get("processing") or st.get("index_lag") else "index-unavailable"


__all__ = ["AnswerService", "Knowledge", "MESSAGE_OVERHEAD_BYTES", "NO_RESULT_FLOOR_S", "OWNER",
           "OwnerView", "PeerView", "View", "answer_local", "peer_knowledge"]
