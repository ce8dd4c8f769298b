"""Screening an answer's hits: what of a search may be shown, and as what (issue 29 item 3).

The answer service (:mod:`node.answer.service`) searches, then hands the hits here; what
comes back is what its envelope is built from. For a peer (:func:`for_peer`), in this order:

1. **the gate, copy by copy** (:func:`gate_copies`): the egress gate's screen
   (:meth:`node.policy.gate.EgressGate.screen`) of every hit and of its collapsed
   copies (``Hit.duplicates``), regrouped so a copy the peer may not see is never listed
   and never hides one it may;
2. **pending** (:func:`pending_sources`, :func:`request_approval`): the undecided ``ask``
   sources among the top results, recorded for the owner, when the best hit waits
   (``pending-approval``);
3. **scrub** (:func:`scrub_hits`): the spans of the kinds the peer's lens scrubs
   (:meth:`node.corpus.lens.Lens.kinds`, specs/policy.md §9) replaced in everything the
   envelope is built from;
4. **ids and hashes** (:func:`unhashed`, :func:`gated_controller`): no document's bare
   content hash, and no count taken before the gate.

For the owner only the ids are screened (:func:`owner_ids`: canonical NFC ids, as the
gate gives peers). :func:`check_versions` (with :func:`shown_sources`) is the same
screening for a version check (``kith verify --against-host``; specs/citations.md §5).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from node.common.scrub import PLACEHOLDER, ScrubFailed, scrub, scrub_cached, scrub_fields
from node.corpus.lens import Lens
from node.corpus.sources import carried_id, folders_resolved_once
from node.corpus.types import Hit
from node.policy.gate import PENDING, VISIBLE

log = logging.getLogger("kith.answer")

MAX_CANDIDATES = 100  # the corpus search's own bound on ``limit``
#: hits asked of a view's own search per requested result when the first search (for
#: exactly ``topK``, ranked as the owner's search of the same view would be) came back
#: full but the gate left fewer than ``topK`` to show: the view already holds only
#: sources the peer may see or ask about; the margin covers ``ask`` sources the owner
#: denied or nobody decided yet and hits the gate's origin check drops. (Asking for
#: ``2 × topK`` every time cost a peer 1.1-1.4× the owner's answer, and ranked worse: the
#: top 10 of a 20-hit search differ from a 10-hit search's in 49 of 53 eval questions at
#: 93k chunks; scripts/eval --split dev python-docs nDCG@10 0.687 against 0.703.)
VIEW_CANDIDATES_PER_RESULT = 2
#: scrubbed-id memos kept for version checks (one per lens key, :func:`check_versions`)
MAX_MEMOS = 64
_memos: OrderedDict[Any, dict[str, Any]] = OrderedDict()
_memos_lock = threading.Lock()


@dataclass
class Screened:
    """A peer's hits as :func:`for_peer` lets them be shown.

    Attributes:
        top: at most ``topK`` hits, best first: canonical ids, scrubbed, no content hash.
        controller: the controller report as the peer may see it (:func:`gated_controller`).
        waiting: the undecided ``ask`` sources among the top results when the best hit
            waits for the owner (:func:`pending_sources`), else None.
        scrubbed: spans scrubbed per kind (and ``refused``) when the lens scrubs, else None.
        approval_id: the approval request recorded for ``waiting`` (:func:`request_approval`),
            or None.
    """

    top: list[Hit]
    controller: dict[str, Any]
    waiting: list[str] | None = None
    scrubbed: dict[str, int] | None = None
    approval_id: str | None = None


def for_peer(gate: Any, policy: Any, peer_name: str | None, peer_key: str | None, query: str,
             lens: Lens | None, top_k: int, hits: list[Hit], controller: dict[str, Any],
             deeper: Callable[[int], Any]) -> Screened | dict[str, Any]:
    """The screen of one peer's search (module docstring, steps 1-4).

    Args:
        gate: the :class:`node.policy.gate.EgressGate`; ``policy`` the query's policy.
        peer_name, peer_key: the peer (approvals are per key and ``query``).
        lens: the peer's lens (its scrub kinds), or None.
        top_k: results wanted.
        hits, controller: the search's.
        deeper: ``deeper(limit)`` searches the view again for ``limit`` hits: ``(hits,
            controller)``, an answer (a failed search, returned as is) or None (no time
            left). Asked once, for :data:`VIEW_CANDIDATES_PER_RESULT` × ``top_k``, when a
            full first search left fewer than ``top_k`` to show.

    Returns:
        :class:`Screened`, or the answer ``deeper`` returned.
    """
    def gated(hits: list[Hit]) -> list[tuple[Hit, str]]:
        return gate.screen(hits, peer_name, peer_key, query, policy=policy)

    screened = gate_copies(gated, hits)
    wider = min(MAX_CANDIDATES, top_k * VIEW_CANDIDATES_PER_RESULT)
    if len(hits) >= top_k and wider > top_k and shown_count(screened) < top_k:
        found = deeper(wider)  # the gate held some back and the view may hold more
        if isinstance(found, dict):
            return found
        if found is not None:
            hits, controller = found
            screened = gate_copies(gated, hits)
    shown = [hit for hit, state in screened if state != PENDING]
    scrubbed = None
    if lens is not None and lens.scrubs:  # after the policy, before the envelope
        def now(source_id: str) -> frozenset[str]:
            return gate.scrub_kinds(source_id, peer_name, policy)

        shown, scrubbed = scrub_hits(shown, lens_kinds(lens, now))
    waiting = pending_sources(screened, top_k)
    approval_id = (request_approval(gate.approvals, peer_key, peer_name, query, waiting)
                   if waiting is not None else None)
    return Screened([unhashed(h) for h in shown[:top_k]], gated_controller(controller, len(shown)),
                    waiting, scrubbed, approval_id)


def with_copies(hit: Hit, copies: list[Hit]) -> Hit:
    """``hit`` with ``duplicates`` set to ``copies`` (a new Hit; ``hit`` is unchanged)."""
    return dataclasses.replace(hit, duplicates=copies)


def gate_copies(screen: Callable[[list[Hit]], list[tuple[Hit, str]]],
                hits: list[Hit]) -> list[tuple[Hit, str]]:
    """``screen`` (the gate's screen for one peer and query) of ``hits`` and of their
    collapsed copies (``Hit.duplicates``, issue 20 item 6), regrouped: each group of
    identical texts becomes one ``(hit, state)`` — its first visible member, else its
    first pending one — whose ``duplicates`` are the group's other *visible* members
    (canonical ids). A copy the peer may not see is never listed, and never hides a copy
    it may: the group is decided member by member, so the answer depends only on what
    the gate lets this peer see or ask about."""
    flat: list[Hit] = []
    group_of: list[int] = []
    for g, hit in enumerate(hits):
        for member in (hit, *hit.duplicates):
            flat.append(member)
            group_of.append(g)
    if len(flat) == len(hits):  # nothing collapsed: the plain screen
        return screen(hits)
    # the gate drops what it withholds and keeps order: walk both lists together
    members: dict[int, list[tuple[Hit, str]]] = {}
    i = 0
    for hit, state in screen(flat):
        while flat[i].chunk_id != hit.chunk_id:
            i += 1
        members.setdefault(group_of[i], []).append((hit, state))
        i += 1
    out: list[tuple[Hit, str]] = []
    for g in sorted(members):
        group = members[g]
        seen = [h for h, st in group if st == VISIBLE]
        if seen:
            out.append((with_copies(seen[0], seen[1:]), VISIBLE))
        else:
            out.append((with_copies(group[0][0], []), group[0][1]))
    return out


def shown_count(screened: list[tuple[Hit, str]]) -> int:
    """How many screened hits may be shown now (not pending)."""
    return sum(state != PENDING for _, state in screened)


def pending_sources(screened: list[tuple[Hit, str]], top_k: int) -> list[str] | None:
    """The undecided ``ask`` sources among the first ``top_k`` screened hits (in order,
    once each) when the best hit waits for an approval; else None."""
    if not screened or screened[0][1] != PENDING:
        return None
    return list(dict.fromkeys(hit.source_id for hit, state in screened[:top_k] if state == PENDING))


def request_approval(approvals: Any, peer_key: str | None, peer_name: str | None, query: str,
                     sources: list[str]) -> str | None:
    """Record that ``peer_key`` waits for the owner on ``sources`` for ``query``
    (:meth:`node.policy.approvals.Approvals.request`); the request's id, or None (no
    approvals, no key, too many open requests, or the file could not be written)."""
    if approvals is None or peer_key is None:
        return None
    try:
        record = approvals.request(peer_key, peer_name, query, sources)
    except OSError:
        log.error("could not write an approval request")
        return None
    if record is None:
        log.warning("too many open approval requests; not recording another")
        return None
    log.warning("approval request %s waits for `kith approvals approve|deny`", record.id)
    return record.id


def scrub_hits(hits: list[Hit], kinds_of: Callable[[str], frozenset[str]]
               ) -> tuple[list[Hit], dict[str, int]]:
    """The scrubbing gate (issue 24 item 3; specs/policy.md §9): each hit with every span
    of the kinds ``kinds_of(source id)`` names replaced by its placeholder
    (:func:`node.common.scrub.scrub`) in what the envelope is built from — text (hence
    previews, excerpts and synthesis), source id, heading path, metadata strings — and in
    its collapsed copies' source ids (each with its own source's kinds).

    Args:
        hits: screened hits (canonical ids), best first.
        kinds_of: ``canonical source id -> frozenset`` of kinds to scrub (the peer's
            lens, :meth:`node.corpus.lens.Lens.kinds`).

    Returns:
        ``(hits, counts)``: the hits in order (unchanged objects where nothing applies;
        a hit whose scrubbing failed is left out — fail closed), and the spans replaced
        per kind plus ``refused``, the hits left out (only kinds with a count; never a
        value). What the audit records for the answer.
    """
    counts: dict[str, int] = {}
    out: list[Hit] = []
    known: dict[str, frozenset[str]] = {}  # one decision per source per answer

    def one(hit: Hit, text: bool) -> Hit:
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


def lens_kinds(lens: Lens, fallback: Callable[[str], frozenset[str]]) -> Callable[[str], frozenset[str]]:
    """``canonical id -> kinds`` for :func:`scrub_hits`: the lens's kinds of a source it
    holds, else ``fallback`` (the gate's decision now: a source indexed after the lens was
    made; never "nothing" by default)."""
    def kinds_of(source_id: str) -> frozenset[str]:
        return lens.kinds(source_id) if lens.sees(source_id) else fallback(source_id)
    return kinds_of


def unhashed(hit: Hit) -> Hit:
    """``hit`` (and its copies) without its document's content hash: a peer's envelope says
    ``contentHash: ""``, so a guest can neither confirm a guess of a whole document by
    hashing it nor watch its edits (the keyed version of a signed citation is the only
    version a peer sees; specs/citations.md §2)."""
    if not hit.content_hash and not hit.duplicates:
        return hit
    return dataclasses.replace(hit, content_hash="", duplicates=[unhashed(d) for d in hit.duplicates])


def gated_controller(controller: dict[str, Any], allowed: int) -> dict[str, Any]:
    """The controller report as a peer may see it: which passes ran and how they were
    fused, but never a count taken before the gate (that would reveal how much policy
    withheld)."""
    keep = ("mode", "fusion", "maxPerDocument", "earlyStop", "stopReason")
    out: dict[str, Any] = {k: controller[k] for k in keep if k in controller}
    out["passes"] = [{k: v for k, v in p.items() if k in ("name", "status", "field", "reason")}
                     for p in controller.get("passes") or [] if isinstance(p, dict)]
    out["candidates"] = allowed
    return out


def owner_ids(hits: list[Hit], canonical: Callable[[str], str],
              names: Mapping[str, str] | None = None) -> list[Hit]:
    """The owner's hits with canonical (NFC) ids — the same wire ids the gate gives peers:
    the id each hit carries from the corpus (:func:`node.corpus.sources.carried_id`),
    else ``canonical(source id)`` (each source once); then, with ``names``, an id it maps
    is replaced by its value (a copy's local id by the host's: specs/copies.md §6)."""
    known: dict[str, str] = {}

    def owned(h: Hit) -> Hit:
        sid = carried_id(h) or known.get(h.source_id)
        if sid is None:
            sid = known[h.source_id] = canonical(h.source_id)
        if names is not None:
            sid = names.get(sid, sid)
        return h if sid == h.source_id else dataclasses.replace(h, source_id=sid)

    with folders_resolved_once():  # only for hits without a carried id
        return [with_copies(owned(h), [owned(d) for d in h.duplicates]) if h.duplicates
                else owned(h) for h in hits]


def shown_sources(lens: Lens, asked: Iterable[str], memo: dict[str, Any]) -> dict[str, list[str]]:
    """``{asked id: [stored source ids this peer is shown under that id]}`` for a version
    check. Without scrubbing, an id the lens sees is shown as itself. For a scrubbed peer
    (specs/policy.md §9) a source is shown under its *scrubbed* id: an asked id holding a
    placeholder is matched against the scrubbed ids of the sources the lens sees (several
    sources may share one), and an id holding a value the peer's scrub removes matches
    nothing — a check is no oracle for a scrubbed value. A source whose scrubbing fails is
    left out (fail closed).

    Args:
        lens: the asking peer's lens.
        asked: the ids asked about.
        memo: kept by the caller per lens key: the scrubbed id of each source
            (``"shown"``) and the map of scrubbed ids to sources (``"by_shown"``), so a
            check costs a scrub per source once per lens, not once per check.
    """
    shown: dict[str, str | None] = memo.setdefault("shown", {})

    def shown_as(source_id: str) -> str | None:
        kinds = lens.kinds(source_id)
        if not kinds:
            return source_id
        if source_id not in shown:
            try:
                shown[source_id] = scrub(source_id, kinds)
            except ScrubFailed:
                return None  # not kept: it fails closed again next time
        return shown[source_id]

    asked = set(asked)
    out: dict[str, list[str]] = {s: [s] for s in asked if lens.sees(s) and shown_as(s) == s}
    if lens.scrubs and any(p in s for s in asked for p in PLACEHOLDER.values()):
        by_shown: dict[str, list[str]] | None = memo.get("by_shown")
        if by_shown is None:
            by_shown = memo["by_shown"] = {}
            for source_id in sorted(lens.scrub):
                as_shown = shown_as(source_id)
                if as_shown is not None and as_shown != source_id:
                    by_shown.setdefault(as_shown, []).append(source_id)
        for wire in asked:
            if by_shown.get(wire):
                out.setdefault(wire, []).extend(by_shown[wire])
    return out


def check_versions(items: Any, corpus: Any, versions: Any, lens: Lens | None) -> dict[str, Any]:
    """Are these cited document versions still current? (``kith verify --against-host``,
    the knowledge-query ``check`` message; specs/citations.md §5.)

    Args:
        items: ``[{"source": str, "version": 64 hex}]`` (at most
            :data:`node.answer.contract.MAX_CHECK_ITEMS`; malformed items are ``unknown``).
        corpus: the corpus (its content hashes).
        versions: the host's :class:`node.answer.citation.PeerVersions` (the version this
            peer is given of each document: over the text scrubbed for it when its lens
            scrubs some kind from it); None (no version secret) → ``unavailable``.
        lens: the asking peer's lens (None → ``unavailable``): a source it does not see
            is ``unknown``, exactly as one that does not exist (no oracle; :func:`shown_sources`,
            its memo kept per lens key, at most :data:`MAX_MEMOS`).

    Returns:
        ``{"status": "ok" | "unavailable", "versions": [{"source", "version", "state":
        "current" | "stale" | "unknown"}]}`` in the order asked (every state ``unknown``
        when ``unavailable``).
    """
    from node.answer.contract import MAX_CHECK_ITEMS

    asked = [i for i in items if isinstance(i, dict)][:MAX_CHECK_ITEMS] if isinstance(items, list) else []
    pairs = [(i.get("source") if isinstance(i.get("source"), str) else "",
              i.get("version") if isinstance(i.get("version"), str) else "") for i in asked]
    if versions is None or corpus is None or lens is None:
        return {"status": "unavailable",
                "versions": [{"source": s, "version": v, "state": "unknown"} for s, v in pairs]}
    with _memos_lock:
        memo = _memos.setdefault(lens.key, {})
        _memos.move_to_end(lens.key)
        while len(_memos) > MAX_MEMOS:
            _memos.popitem(last=False)
    shown = shown_sources(lens, {s for s, _ in pairs if s}, memo)
    hashes = corpus.content_hashes(sorted({r for ids in shown.values() for r in ids}))
    out = []
    for source, version in pairs:
        keyed = {versions.version(r, hashes[r], lens.kinds(r)) for r in shown.get(source, ()) if r in hashes}
        keyed.discard(None)  # a version that cannot be said is not current
        state = "unknown" if not keyed else "current" if version in keyed else "stale"
        out.append({"source": source, "version": version, "state": state})
    return {"status": "ok", "versions": out}


__all__ = ["MAX_CANDIDATES", "Screened", "VIEW_CANDIDATES_PER_RESULT", "check_versions", "for_peer", "request_approval", "gate_copies", "gated_controller", "lens_kinds", "owner_ids",
           "pending_sources", "scrub_hits", "shown_count", "shown_sources", "unhashed", "with_copies"]
