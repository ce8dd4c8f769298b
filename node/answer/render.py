"""Rendering an answer: the envelope of what the screen let through, or the answer with
nothing to show (issue 29 item 3; the last stage of :mod:`node.answer.service`).

No oracle (DESIGN §8): an answer with nothing to show is
:func:`node.answer.envelope.empty_envelope` of the reason and the request only, and for a
peer it is sent no sooner than its time floor, whether nothing matched or policy withheld
every match.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from node.answer import envelope as env
from node.answer.screen import Screened
from node.common.errors import CorpusError


def empty(reason: str, req: dict[str, Any] | None, plan: Any = None) -> dict[str, Any]:
    """``{"status": reason, "envelope": <the empty envelope of reason and req>}``."""
    return {"status": reason, "envelope": env.empty_envelope(reason, req, plan=plan)}


def invalid(exc: CorpusError, req: dict[str, Any] | None = None) -> dict[str, Any]:
    """``invalid-request`` with ``error`` ``{"code", "message"}`` of ``exc``; the envelope
    never echoes the request (there may be none)."""
    return {"status": "invalid-request", "envelope": env.empty_envelope("invalid-request"),
            "error": {"code": exc.code, "message": exc.message}}


def nothing(reason: str | None, corpus: Any, req: dict[str, Any], plan: Any, *,
            until: float | None = None) -> dict[str, Any]:
    """An answer with nothing to show: ``reason``, or ``index-syncing`` while the index
    lags its record, else ``no-verified-results``; returned no sooner than ``until``
    (``time.monotonic()``; a peer's time floor), when given."""
    if reason is None:
        reason = "index-syncing" if index_syncing(corpus) else "no-verified-results"
    if until is not None:
        delay = until - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    return empty(reason, req, plan)


def index_syncing(corpus: Any) -> bool:
    """True while the corpus index is not settled (:meth:`Corpus.index_syncing`)."""
    if corpus is None:
        return False
    try:
        return bool(corpus.index_syncing())
    except Exception:  # noqa: BLE001 - a store that cannot say is treated as settled
        return False


def unavailable_reason(corpus: Any) -> str:
    """``index-syncing`` while a sync is under way (rows ``processing``, or changes the
    index does not hold yet), else ``index-unavailable``."""
    try:
        st = corpus.stats()
    except Exception:  # noqa: BLE001 - a broken store is simply unavailable
        return "index-unavailable"
    return "index-syncing" if st.get("processing") or st.get("index_lag") else "index-unavailable"


class Syncing:
    """Whether a shown answer is marked ``indexSyncing``: the index lagged its record while
    searching (``indexLag``, read when the search ended), or no sync has completed
    yet. The latter is asked of the corpus only until it once says settled (``last_sync``,
    once written, is never removed), so afterwards an answer takes the corpus lock once."""

    def __init__(self, corpus: Any) -> None:
        self._corpus = corpus
        self._settled = False

    def __call__(self, controller: Mapping[str, Any]) -> bool:
        """``controller``: the search's report."""
        if controller.get("indexLag"):
            return True
        if self._settled:
            return False
        syncing = index_syncing(self._corpus)
        self._settled = not syncing
        return syncing


def render(req: dict[str, Any], plan: Any, shown: Screened, *, limit: int | None,
           syncing: Callable[[Mapping[str, Any]], bool],
           nothing: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The answer for what the screen let through.

    Args:
        req, plan: the validated request and the search's plan.
        shown: the screened hits (:class:`node.answer.screen.Screened`): ``top`` best
            first, the controller report as the receiver may see it, ``waiting`` /
            ``approval_id`` when the best hit waits for the owner, ``scrubbed`` counts.
        limit: the envelope's byte limit (a peer's ``max_message_bytes`` less the
            message's overhead), or None.
        syncing: ``controller -> bool``: mark the envelope ``indexSyncing`` (:class:`Syncing`).
        nothing: the answer with nothing to show (the caller's time floor).

    Returns:
        ``ok`` with the envelope, or ``pending-approval`` (plus ``approval_id``) with what
        the peer may see now (specs/approvals.md §1; its empty envelope when nothing fits),
        else ``nothing()`` when there is nothing to show or not one result fits ``limit``;
        plus ``scrubbed`` (counts per kind, for the audit) when the lens scrubbed.
    """
    pending = None
    if shown.waiting is not None:
        pending = empty("pending-approval", req, plan)
        if shown.approval_id is not None:
            pending["approval_id"] = shown.approval_id
    envelope = None
    if shown.top:
        envelope = env.build_envelope(req, shown.top, shown.controller, plan=plan)
        marked = syncing(shown.controller)
        if marked:  # before the size check: the flag is part of what is sent
            env.mark_index_syncing(envelope)
        if limit is not None:
            envelope = env.fit_to(limit, envelope, req, shown.top, shown.controller, plan=plan,
                                  syncing=marked)
    if envelope is None:
        answer = pending or nothing()
    else:
        answer = {**(pending or {"status": "ok"}), "envelope": envelope}
    if shown.scrubbed is not None:
        answer["scrubbed"] = dict(shown.scrubbed)
    return answer


__all__ = ["Syncing", "empty", "index_syncing", "invalid", "nothing", "render", "unavailable_reason"]
