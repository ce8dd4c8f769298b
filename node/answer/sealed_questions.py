"""A host answering a sealed question at answer time, as it answers a live one (issue 43
item 3; specs/sealed.md §4, §10).

:func:`host_answerer` builds the answer function for one host home. Given an opened question
and the name its asker was admitted under — by the host's doorkeeper, the one admission check
of a live handshake (:meth:`node.host.doorkeeper.Doorkeeper.sealed_name`, which this layer
may not import; node/host/sealed_host.py joins the two) — it:

1. answers through the **one answer path**: the peer's knowledge handle
   (:meth:`node.host.host.Knowledge.handle_for` → :class:`node.answer.service.AnswerService`:
   its policy, quota, ``ask``-tier approvals, scrubbing, citations as configured) with the
   message the knowledge-query hook builds (:func:`node.community.inbox.results_for`);
2. passes the ``results`` message through the **egress gate seam** (``egress_check``), with
   the question as the message it answers, exactly as the engine does for a live frame;
3. records ``query`` and ``results`` in the **audit log** (keyed hash of the question by
   default), with ``via: "sealed"`` and no session id — the ``results`` record written at
   once with the fsync (``sync=True``, not left in the running host's 50 ms batch), before
   the answer is sealed, left with the holder and the question acked: a host killed
   (SIGKILL) after its ack never lost the audit of what it sent (specs/sealed.md §5).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from node.trust.sealed import Opened


def host_answerer(knowledge: Any, *, audit: Any = None) -> Callable[[Opened, str | None], dict[str, Any]]:
    """This host's answer to an admitted sealed question.

    Args:
        knowledge: the host's :class:`node.host.host.Knowledge` (``open_knowledge``).
        audit: the host's :class:`node.trust.audit_log.AuditLog`, or None (nothing recorded).

    Returns:
        ``(opened, name) → results message``, ``name`` being the registry name the asker was
        admitted under (None: anonymous); raises :class:`KithError` (``egress-leak``) to drop
        a question this host must not answer.
    """
    from node.community.inbox import results_for
    from node.engine.session import OutgoingFrame

    def answer(opened: Opened, name: str | None) -> dict[str, Any]:
        handle = knowledge.handle_for(name, opened.sender)
        query_id = f"outbox:{opened.question_id}"
        request = opened.body.get("request") if isinstance(opened.body.get("request"), dict) else {}
        if audit is not None and isinstance(request.get("query"), str):
            audit.record("query", peer=opened.sender, peer_name=name, action="query", query_id=query_id,
                         via="sealed", **audit.query_fields(request["query"]))
        results = results_for(handle, opened)
        if knowledge.egress_check is not None:
            data = (json.dumps(results, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
            knowledge.egress_check(OutgoingFrame(results, data, {"action": "query", "query_id": query_id, **request}))
        if audit is not None:
            sources = [r.get("source") for r in (results.get("envelope") or {}).get("results", [])
                       if isinstance(r, dict) and isinstance(r.get("source"), str)][:50]
            audit.record("results", peer=opened.sender, peer_name=name, query_id=query_id,
                         status=results["status"], sources=sources, approval_id=results.get("approval_id"),
                         via="sealed", sync=True)  # durable before the answer leaves and the question is acked
        return results

    return answer


__all__ = ["host_answerer"]
