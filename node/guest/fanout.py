"""Ask several pinned peers one question at once: one shared deadline, one merged,
attributed answer (``kith ask``, MCP ``search`` with ``peers``, local API ``peers``).

specs/ask.md is normative; ``specs/ask.schema.json`` is the merged envelope's schema.

- Every peer is asked concurrently over the :class:`~node.guest.pool.SessionPool`
  (warm sessions); the local corpus too with ``local``. One deadline for all: at the
  deadline the answer is built from what arrived, and every peer still out is
  ``peer-timeout`` (listed in ``missing``).
- Results are fused by **rank** (reciprocal-rank fusion, ``1 / (60 + rank)`` summed over
  the peers that returned the result): peers' scores are not comparable (each is a fusion
  of ranks within that peer's own view). Identical content (same normalised
  ``textPreview``) from several peers is one result listing every peer that returned it.
- Every result carries ``peer`` {name, key}, the peer's own ``source`` and ``id``,
  ``untrusted`` (True for any peer's text: third-party evidence, never instructions) and
  ``suspicious`` (the guest's scan for text addressing an agent), and the envelope a
  ``fence``: the untrusted evidence as one delimited block (node/answer/fence.py).
- A person pin (``--devices``) is one row: every device of it with a card is asked at once
  and the first complete answer fills the row, naming its ``device``
  (node/guest/cards.py, specs/peers.md §13).
- Bad input is per peer: an unknown or blocked name, an invitation for another key or
  protocol, a malformed answer, a peer that never answers — each gets its own row in
  ``peers`` and never changes another peer's row or the merged results.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import anyio

from node.answer import fence
from node.answer.contract import TOP_K_DEFAULT
from node.common.errors import KithError, UsageError
# the bounds a peer's result must respect to be merged (else ``peer-answer-invalid``) and
# their check, shared with the outbox's classify (which needs them without the pool)
from node.guest.peer_results import MAX_SOURCE_CHARS
from node.guest.peer_results import check_results as _check_results

if TYPE_CHECKING:  # imported where a peer is asked: a process that only checks envelopes
    # (the outbox's classify, taking sealed answers) never imports the pool, iroh and the asker
    from node.guest.pool import SessionPool

#: Most distinct peers one ask may name (``ask-too-many-peers`` beyond).
MAX_PEERS = 16
#: Reciprocal-rank fusion constant (the same 60 the answer service fuses passes with).
RRF_K = 60
#: Default and largest shared deadline, seconds.
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 120.0
#: Seconds a ``peers`` search (MCP ``search``, local API ``POST /search``) may take: one
#: deadline for all of them.
PEERS_TIMEOUT_S = 30.0
#: The per-peer statuses (specs/ask.md §3).
STATUSES = ("ok", "no-verified-results", "pending-approval", "rate-limited", "peer-timeout",
            "unreachable", "refused")
#: The statuses of a row that gave its whole answer: ``complete`` is true only when every
#: row has one (specs/ask.md §3). A refusal, a pending approval or a quota is not an answer.
COMPLETE_STATUSES = ("ok", "no-verified-results")
#: ``kith ask``'s bound (seconds) on its pool's exit waiting for the sessions that answered
#: to end cleanly: the process exits within its deadline + 0.5 s (specs/ask.md §6).
ASK_END_WAIT_S = 0.2
#: The name of this node's own corpus in the per-peer table (``--local``).
LOCAL_NAME = "local"
#: the merged envelope's ``notice`` (the guest's fences, node/answer/fence.py)
UNTRUSTED_NOTICE = fence.NOTICE


@dataclass
class PeerRow:
    """One row of the per-peer table (specs/ask.md §3)."""

    name: str
    key: str | None
    status: str = "peer-timeout"
    code: str | None = None
    approval_id: str | None = None
    retry_after_s: int | None = None
    latency_ms: float | None = None
    results: int = 0
    #: True for this node's own corpus (``--local``): its text is not third-party.
    own: bool = False
    #: the session's network path, ``{"kind", "relayUrl"}`` (specs/transport.md §3), or None
    path: dict[str, Any] | None = None
    #: RFC 3339 time of the peer's last frame, for a peer that went silent with the
    #: question out (``peer-unresponsive``), else None
    last_heard_at: str | None = None
    #: for a person pin: the device that gave the answer, ``{"key", "name"}`` (specs/peers.md §13)
    device: dict[str, str] | None = None
    #: the answer came from this node's copy of the peer (specs/copies.md §6), synced then
    from_copy: bool = False
    copy_as_of: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as the envelope carries it (``lastHeardAt`` and ``device`` only when known)."""
        out = {"name": self.name, "key": self.key, "status": self.status, "code": self.code,
               "approvalId": self.approval_id, "retryAfterS": self.retry_after_s,
               "latencyMs": None if self.latency_ms is None else round(self.latency_ms, 1),
               "results": self.results, "self": self.own, "path": self.path}
        if self.last_heard_at is not None:
            out["lastHeardAt"] = self.last_heard_at
        if self.device is not None:
            out["device"] = self.device
        if self.from_copy:  # specs/copies.md §6
            out.update(fromCopy=True, copyAsOf=self.copy_as_of)
        return out


def dedupe_names(names: list[str]) -> list[str]:
    """``names`` without repeats, first occurrence order.

    Raises:
        UsageError: ``ask-too-many-peers`` for more than :data:`MAX_PEERS` distinct names.
        PolicyError: ``peer-bad-name`` (exit 2) for a name no peer can be pinned under
            (``node.trust.peers.NAME_RE``): its row could not be reported (the envelope's
            names are 1-64 characters, specs/ask.schema.json).
    """
    from node.common.errors import PolicyError
    from node.trust.peers import NAME_RE

    for name in names:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise PolicyError("peer-bad-name", f"{str(name)[:80]!r} is not a peer name (1-64 of "
                              "[A-Za-z0-9_.-], starting alphanumeric)", exit_code=2)
    out = list(dict.fromkeys(names))
    if len(out) > MAX_PEERS:
        raise UsageError("ask-too-many-peers", f"{len(out)} peers named; one ask takes at most {MAX_PEERS}")
    return out


def check_peers_field(peers: Any) -> str | None:
    """The refusal message for a bad ``peers`` value (a list of 1-16 peer names, or the
    string ``"all"``), or None when it is valid."""
    from node.trust.peers import NAME_RE

    if peers == "all":
        return None
    if (not isinstance(peers, list) or not peers
            or not all(isinstance(n, str) and NAME_RE.fullmatch(n) for n in peers)):
        return ("The field 'peers' must be \"all\" or a list of pinned peer names "
                f"(1-{MAX_PEERS} of [A-Za-z0-9_.-]).")
    return None


def peers_request_refusal(peers: Any, request: dict[str, Any]) -> str | None:
    """The refusal message for a peers search (the local API's ``POST /search`` and ``POST
    /outbox``, ``kith mcp``'s ``search`` / ``ask_later``): a bad ``peers``
    (:func:`check_peers_field`), else ``request`` (the rest, ``peers`` taken off) breaking
    the one request contract (node/answer/contract.py); None when both are valid."""
    from node.answer import contract
    from node.common.errors import CorpusError

    bad = check_peers_field(peers)
    if bad is not None:
        return bad
    try:
        contract.validate(request)
    except CorpusError as exc:
        return exc.message
    return None


def _row_from_message(row: PeerRow, message: dict[str, Any]) -> list[dict[str, Any]]:
    """Fill ``row`` from a host's ``results`` message; return the results to merge."""
    status = message.get("status")
    try:
        results = _check_results(message.get("envelope"))
    except ValueError:
        row.status, row.code = "refused", "peer-answer-invalid"
        return []
    if status == "ok":
        row.status, row.results = "ok", len(results)
        return results
    if status == "no-verified-results":
        row.status = "no-verified-results"
    elif status == "pending-approval":
        row.status = "pending-approval"
        aid = message.get("approval_id")
        row.approval_id = aid if isinstance(aid, str) else None
    elif status == "rate-limited":
        row.status = "rate-limited"
        ra = message.get("retry_after_s")
        row.retry_after_s = ra if isinstance(ra, int) and not isinstance(ra, bool) else None
    else:
        row.status, row.code = "refused", status if isinstance(status, str) else "peer-answer-invalid"
    return []


def _location(result: dict[str, Any]) -> dict[str, Any] | None:
    """A peer result's ``provenance.location`` reduced to what a citation needs — heading
    path (≤ 16 strings of ≤ 200 characters), ``lineStart``/``lineEnd``, ``page``/``pageEnd``
    (positive integers) — or None when it has none of them (peer text is never trusted
    in shape)."""
    prov = result.get("provenance")
    loc = prov.get("location") if isinstance(prov, dict) else None
    if not isinstance(loc, dict):
        return None
    out: dict[str, Any] = {}
    path = loc.get("headingPath")
    if isinstance(path, list):
        heads = [h[:200] for h in path[:16] if isinstance(h, str)]
        if heads:
            out["headingPath"] = heads
    for k in ("lineStart", "lineEnd", "page", "pageEnd"):
        v = loc.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31:
            out[k] = v
    return out or None


#: copies named per attribution (a peer's ``alsoIn``, issue 20 item 6)
MAX_ALSO_IN = 16


def _also_in(result: dict[str, Any]) -> list[str]:
    """The sources a peer says also hold this result's text (its ``alsoIn``, computed in
    that peer's view of its host): at most :data:`MAX_ALSO_IN` source strings within
    the source bound; anything malformed is left out (an older peer sends none)."""
    also = result.get("alsoIn")
    if not isinstance(also, list):
        return []
    return [a["source"] for a in also[:MAX_ALSO_IN] if isinstance(a, dict)
            and isinstance(a.get("source"), str) and 0 < len(a["source"]) <= MAX_SOURCE_CHARS]


#: The fields a merged result answered from a copy carries (specs/copies.md §6,
#: specs/citations.md §7); they go with the peer the result names, as ``citation`` does.
COPY_FIELDS = ("fromCopy", "copyAsOf", "copyCitation", "copySpan")


def _copy_fields(row: PeerRow, result: dict[str, Any]) -> dict[str, Any]:
    """The :data:`COPY_FIELDS` of a result of ``row`` (``{}`` unless the row was answered
    from this node's copy): ``fromCopy`` true, ``copyAsOf`` the copy's last complete sync,
    ``copyCitation`` the host's signature over the whole copied document (an object as
    :func:`node.guest.copies.search.search_copy` read it from the copy's manifest, else None)
    and ``copySpan`` ``[start, end)``, where the result's chunk sits in that signed text
    (two integers ``0 <= start <= end``, else None)."""
    if not row.from_copy:
        return {}
    from node.answer.citation import char_range

    cite, span = result.get("copyCitation"), char_range(result.get("copySpan"))
    return {"fromCopy": True, "copyAsOf": row.copy_as_of, "copyCitation": cite if isinstance(cite, dict) else None,
            "copySpan": list(span) if span is not None else None}


def _content_key(text: str) -> str:
    return hashlib.sha256(" ".join(text.casefold().split()).encode("utf-8")).hexdigest()


def _who(peer: dict[str, Any]) -> tuple[Any, Any]:
    """An attribution's identity: the peer's key and, for a person pin, its device's key —
    two devices of one person that returned the same text are both attributed."""
    device = peer.get("device")
    return peer.get("key"), device.get("key") if isinstance(device, dict) else None


def fuse(per_peer: list[tuple[PeerRow, list[dict[str, Any]], bool]], top_k: int) -> list[dict[str, Any]]:
    """Reciprocal-rank fusion of each peer's ranked results (specs/ask.md §2).

    Args:
        per_peer: ``(row, results best first, untrusted)`` per answering peer, in the
            order the peers were named (ties go to the earlier peer).
        top_k: how many merged results to keep.

    Returns:
        Merged results, best first: ``rank``, ``fusedScore``, ``peer``, ``source``, ``id``,
        ``location`` (heading path and line range or page, or None), ``textPreview``, ``date``, ``tags``, ``peerScore``, ``untrusted``,
        ``citation`` (only when the named peer signed one: its object as sent, for ``kith verify``),
        ``fromCopy``/``copyAsOf``/``copyCitation``/``copySpan`` (only when the named peer's row
        was answered from this node's copy: :func:`_copy_fields`),
        ``suspicious`` (+ ``suspiciousReasons``: :func:`node.answer.fence.scan`), ``attributions`` (every peer that returned the same content, each with the
        ``alsoIn`` sources that peer collapsed into it).
    """
    merged: dict[str, dict[str, Any]] = {}
    for order, (row, results, untrusted) in enumerate(per_peer):
        for rank, r in enumerate(results, 1):
            text = r.get("textPreview") or ""
            ck = _content_key(text) if text.strip() else f"{row.key}\0{r['id']}"
            who = {"name": row.name, "key": row.key, **({"device": row.device} if row.device else {})}
            attribution = {"peer": who, "source": r["source"], "id": r["id"], "rank": rank,
                           "alsoIn": _also_in(r)}
            m = merged.get(ck)
            if m is None:
                score = r.get("score")
                tags = r.get("tags")
                merged[ck] = m = {
                    "fusedScore": 0.0, "peer": who, "source": r["source"], "id": r["id"],
                    "location": _location(r), "textPreview": text, "date": r.get("date") if isinstance(r.get("date"), str) else None,
                    "tags": [t for t in tags if isinstance(t, str)][:32] if isinstance(tags, list) else [],
                    "peerScore": score if isinstance(score, (int, float)) and not isinstance(score, bool) else None,
                    "untrusted": untrusted, "attributions": [], "_best": (rank, order)}
                if isinstance(r.get("citation"), dict):  # the host's signed citation, as sent
                    m["citation"] = r["citation"]
                m.update(_copy_fields(row, r))
            elif (rank, order) < m["_best"]:
                m.update(peer=who, source=r["source"], id=r["id"], location=_location(r),
                         _best=(rank, order))
                for k in ("citation", *COPY_FIELDS):  # they go with the peer the result names
                    m.pop(k, None)
                if isinstance(r.get("citation"), dict):
                    m["citation"] = r["citation"]
                m.update(_copy_fields(row, r))
            if all(_who(a["peer"]) != _who(who) for a in m["attributions"]):
                m["attributions"].append(attribution)
                m["fusedScore"] += 1.0 / (RRF_K + rank)
                m["untrusted"] = m["untrusted"] or untrusted
    ordered = sorted(merged.values(), key=lambda m: (-m["fusedScore"], m["_best"]))[:top_k]
    for i, m in enumerate(ordered, 1):
        del m["_best"]
        m["fusedScore"] = round(m["fusedScore"], 6)
        m["rank"] = i
        fence.mark_merged(m, m["untrusted"])  # decided here, never taken from a host
    return ordered


async def fan_out(pool: SessionPool, request: dict[str, Any], peers: list[str], *,
                  timeout_s: float = DEFAULT_TIMEOUT_S, local: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                  own_key: str | None = None,
                  on_waiting: tuple[float, float, Callable[[list[str], float], None]] | None = None,
                  copies: str | None = None) -> dict[str, Any]:
    """Ask every peer in ``peers`` (registry names) the flat ``request`` at once and merge.

    Args:
        pool: the session pool (warm sessions; opened by the caller).
        request: the flat search request (``query``, ``topK``, filters), already checked
            against the one request contract (node/answer/contract.py).
        peers: registry names (deduplicated here; more than :data:`MAX_PEERS` distinct
            names is ``ask-too-many-peers``).
        timeout_s: the one shared deadline, seconds.
        local: when given, ``local(request) → {"status", "envelope"}`` searches this
            node's own corpus (run in a worker thread; its row is named ``local``).
        own_key: this node's public key (the ``local`` row's key).
        on_waiting: ``(first_s, every_s, call)``: while rows are still out, ``call(names
            still out, seconds since the ask began)`` runs ``first_s`` seconds after the
            ask began and every ``every_s`` seconds after that, until the last row settles
            or the deadline (``kith ask``'s "waiting for …" line).
        copies: ``"fallback"`` — a peer that is unreachable is answered from this node's
            copy of it when one is kept (specs/copies.md §6); ``"only"`` — every peer is
            answered from its copy, none is asked (``copy-not-found`` rows for a peer
            without one); None — copies are never read. A row answered from a copy says
            ``fromCopy`` and ``copyAsOf``.

    Returns:
        The merged envelope (``specs/ask.schema.json``).

    Raises:
        UsageError: ``ask-too-many-peers``.
    """
    from node.guest.asker import Asker
    from node.guest.targets import PeerGone, classify_gone
    from node.trust.peers import PeerRegistry

    names = dedupe_names(list(peers))
    top_k = int(request.get("topK", TOP_K_DEFAULT))
    registry = pool.peers.now() if hasattr(pool, "peers") else PeerRegistry.load(pool.home)
    rows: list[PeerRow] = []
    answers: dict[int, list[dict[str, Any]]] = {}
    t0 = time.perf_counter()

    copied: dict[int, dict[str, Any]] = {}  # row index -> its copy's answer, ready (copies "fallback")
    provisional: dict[int, dict[str, Any]] = {}  # row index -> a person's device's empty answer, others still out

    async def copy_answer(name: str) -> dict[str, Any] | None:
        from node.guest.copies.search import search_copy
        from node.guest.copies.store import CopyStore

        if not CopyStore(pool.home, name).exists():
            return None
        try:
            find = partial(search_copy, pool.home, name, request, notify=getattr(pool, "on_copy_notice", None),
                           copies=getattr(pool, "copies", None))
            return await anyio.to_thread.run_sync(find, abandon_on_cancel=True)
        except KithError as exc:
            return {"error": exc.code}

    def apply_copy(i: int, row: PeerRow, answer: dict[str, Any]) -> None:
        if "error" in answer:
            row.status, row.code = "refused", answer["error"]
            return
        row.status, row.code = "ok", None
        row.from_copy, row.copy_as_of = True, answer.get("copyAsOf")
        host = answer.get("hostKey")
        if isinstance(host, str) and host != row.key:  # a person's copy is one device's (specs/copies.md §4.1)
            from node.trust.card import CardStore

            entry = CardStore.load(pool.home).devices_of(row.key).get(host)
            row.device = {"key": host, "name": str(entry.card.get("device_name", "")) if entry else ""}
        answers[i] = _row_from_message(row, {"status": answer.get("status"), "envelope": answer.get("envelope")})

    reading: set[int] = set()

    async def prepare_copy(i: int, name: str) -> None:
        reading.add(i)
        try:
            answer = await copy_answer(name)
        finally:
            reading.discard(i)
        if answer is not None and "error" not in answer:
            copied[i] = answer

    async def ask_one(i: int, row: PeerRow, name: str) -> None:
        start = time.perf_counter()
        if copies == "only":
            answer = await copy_answer(name)
            if answer is None:
                row.status, row.code = "refused", "copy-not-found"
            else:
                apply_copy(i, row, answer)
            row.latency_ms = (time.perf_counter() - start) * 1000
            return
        if copies == "fallback":  # ready before the deadline, used only if the host does not answer
            tg_copies.start_soon(prepare_copy, i, name)
        try:  # a person's device that holds nothing: the answer at the deadline, if no device's ok comes
            message = await Asker(pool, on_provisional=partial(provisional.__setitem__, i)).ask(name, request)
        except PeerGone as gone:
            row.status, row.code = classify_gone(gone)
            heard = getattr(gone.outcome, "last_heard_at", None)
            if row.code == "peer-unresponsive" and heard is not None:
                from node.runtime.clock import rfc3339

                row.last_heard_at = rfc3339(heard)
        except KithError as exc:
            from node.common.errors import CommunityError, TransportError

            row.status = "unreachable" if isinstance(exc, (TransportError, CommunityError)) else "refused"
            row.code = exc.code
        except Exception:  # noqa: BLE001 - one peer's failure never ends the others' asks
            row.status, row.code = "refused", "internal-error"
        else:
            device = message.get("device")  # set by the pool for a person pin, never by a host
            row.device = device if isinstance(device, dict) else None
            answers[i] = _row_from_message(row, message)
        row.latency_ms = (time.perf_counter() - start) * 1000
        row.path = pool.path_of(row.device["key"] if row.device else row.key)

    async def ask_local(i: int, row: PeerRow) -> None:
        start = time.perf_counter()
        assert local is not None
        try:
            own = {k: v for k, v in request.items() if k != "citations"}  # a peer's to sign, not ours
            answer = await anyio.to_thread.run_sync(local, own, abandon_on_cancel=True)
        except KithError as exc:  # e.g. no corpus here: this row only
            row.status, row.code = "refused", exc.code
        else:
            answers[i] = _row_from_message(row, {"status": answer.get("status"),
                                                 "envelope": answer.get("envelope")})
        row.latency_ms = (time.perf_counter() - start) * 1000

    asked: list[PeerRow] = []

    async def tell_waiting() -> None:
        assert on_waiting is not None
        first_s, every_s, call = on_waiting
        await anyio.sleep(first_s)
        while True:
            out = [r.name for r in asked if r.status == "peer-timeout" and r.latency_ms is None]
            if out:
                call(out, time.perf_counter() - t0)
            await anyio.sleep(every_s)

    with anyio.move_on_after(timeout_s), anyio.CancelScope() as notices:
        async with anyio.create_task_group() as outer:
            tg_copies = outer
            if on_waiting is not None:
                outer.start_soon(tell_waiting)
            await _ask_all(names, registry, rows, asked, ask_one, ask_local, local is not None, own_key)
            # a copy still being read for a host that did not answer: wait for it (deadline-bound)
            while any(i in reading and rows[i].status in ("peer-timeout", "unreachable") for i in range(len(rows))):
                await anyio.sleep(0.01)
            notices.cancel()  # every row settled before the deadline
    elapsed = (time.perf_counter() - t0) * 1000
    for i, row in enumerate(rows):  # a device said it holds nothing, the others gave no ok in time: that stands
        if row.status == "peer-timeout" and row.latency_ms is None and i in provisional:
            device = provisional[i].get("device")
            row.device = device if isinstance(device, dict) else None
            answers[i] = _row_from_message(row, provisional[i])
            row.latency_ms = elapsed
    for i, row in enumerate(rows):  # the host did not answer in time: its copy does (specs/copies.md §6)
        if row.status in ("peer-timeout", "unreachable") and i in copied:
            apply_copy(i, row, copied[i])
            row.latency_ms = elapsed
    for row in rows:  # asked, still out at the deadline: it took (at least) the whole time
        if row.status == "peer-timeout" and row.latency_ms is None:
            row.latency_ms = elapsed
    return build_envelope(request, rows, answers, timeout_s=timeout_s, elapsed_ms=elapsed, top_k=top_k)


async def _ask_all(names: list[str], registry: Any, rows: list[PeerRow], asked: list[PeerRow],
                   ask_one: Any, ask_local: Any, with_local: bool, own_key: str | None) -> None:
    """Add one row per name to ``rows`` (refusing unknown and blocked names at once) and
    ask the rest concurrently (``asked`` lists the rows being asked); returns when every
    one settled."""
    async with anyio.create_task_group() as tg:
        for name in names:
            rec = registry.by_name(name)
            row = PeerRow(name, rec.public_key if rec else None)
            rows.append(row)
            if rec is None:
                row.status, row.code = "refused", "peer-not-found"
            elif registry.is_blocked(rec.public_key):
                row.status, row.code = "refused", "ask-peer-blocked"
            else:
                asked.append(row)
                tg.start_soon(ask_one, len(rows) - 1, row, name)
        if with_local:
            rows.append(PeerRow(LOCAL_NAME, own_key, own=True))
            asked.append(rows[-1])
            tg.start_soon(ask_local, len(rows) - 1, rows[-1])


def build_envelope(request: dict[str, Any], rows: list[PeerRow], answers: dict[int, list[dict[str, Any]]], *,
                   timeout_s: float, elapsed_ms: float, top_k: int) -> dict[str, Any]:
    """The merged envelope (``specs/ask.schema.json``) from the rows and each answering
    row's results (``answers[row index]``)."""
    per_peer = [(rows[i], answers.get(i, []), not rows[i].own)
                for i in range(len(rows)) if rows[i].status == "ok"]
    results = fuse(per_peer, top_k)
    missing = [r.name for r in rows if r.status in ("peer-timeout", "unreachable")]
    answered = sum(r.status == "ok" for r in rows)
    complete = bool(rows) and all(r.status in COMPLETE_STATUSES for r in rows)
    return {"kind": "kith-ask", "version": 1, "query": request.get("query"), "topK": top_k,
            "deadlineMs": round(timeout_s * 1000), "elapsedMs": round(elapsed_ms, 1),
            "answered": answered, "complete": complete,
            "missing": missing, "fusion": {"method": "rrf", "k": RRF_K, "on": "rank"},
            "notice": UNTRUSTED_NOTICE, "fence": fence.merged_fence(results, UNTRUSTED_NOTICE),
            "results": results, "peers": [r.to_dict() for r in rows]}


def askable_peers(registry: Any) -> list[str]:
    """The names ``"all"`` / ``--all-peers`` ask: every pinned peer whose key is not
    blocked, sorted (a :class:`node.trust.peers.PeerRegistry`)."""
    return sorted(n for n, r in registry.peers.items() if not registry.is_blocked(r.public_key))


async def peers_search(guest: Any, peers: list[str] | str, body: dict[str, Any], *,
                       timeout_s: float = PEERS_TIMEOUT_S, pool: Any = None) -> dict[str, Any]:
    """Ask several pinned peers (names, or ``"all"``: every pinned, unblocked one) one
    question at once (:func:`fan_out`; an unreachable peer is answered from its copy when
    one is kept, specs/copies.md §6).

    Args:
        guest: the process's :class:`node.guest.owner.Guest` (its view of ``peers.json``
            resolves ``"all"``).
        pool: the server's warm pool (one of ``guest``'s), or None: a pool of ``guest``
            for this call.

    Returns:
        The merged envelope (``specs/ask.schema.json``).

    Raises:
        UsageError: ``ask-too-many-peers``.
    """
    names = askable_peers(guest.peers.now()) if peers == "all" else list(peers)
    request = {**body, "topK": body.get("topK", TOP_K_DEFAULT)}
    if pool is not None:
        return await fan_out(pool, request, names, timeout_s=timeout_s, copies="fallback")
    async with guest.session_pool() as own:
        return await fan_out(own, request, names, timeout_s=timeout_s, copies="fallback")


def local_searcher(home: Path, holder: Any = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A ``local`` callable for :func:`fan_out`: the node's own corpus, read-only, exactly
    as ``POST /search`` answers (:func:`node.answer.service.answer_local`).

    Args:
        home: the node home. holder: the open corpus to search
            (:class:`node.answer.holder.CorpusHolder`); None: one made here, opened at the
            first search and kept open for every later one (the callable's ``close()``
            closes it).
    """
    from node.answer.holder import CorpusHolder

    own = holder if holder is not None else CorpusHolder(home)

    def search(request: dict[str, Any]) -> dict[str, Any]:
        from node.answer.service import answer_local

        return answer_local(own.get(), request)

    search.close = own.close  # type: ignore[attr-defined]
    return search
