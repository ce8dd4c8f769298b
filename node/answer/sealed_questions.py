"""A host answering a sealed question at answer time, as it answers a live one (issue 43
item 3; specs/sealed.md §4, §10).

:func:`host_answerer` builds the ``on_question`` of :func:`node.community.inbox.take_step`
for one host home. For each opened question it:

1. **admits** the asker as a handshake would (:func:`judge_sealed`): a revoked device, a
   blocked key or person, and — with ``peers_only`` — a device neither pinned nor of a
   person pinned with ``--devices`` are refused with the handshake's own codes; a pinned
   device answers under its name, a device of a person pin under the pin's name, any other
   as an anonymous peer (``public`` sources only);
2. answers through the **one answer path**: the peer's knowledge handle
   (:meth:`node.host.host.Knowledge.handle_for` → :class:`node.answer.service.AnswerService`:
   its policy, quota, ``ask``-tier approvals, scrubbing, citations as configured) with the
   message the knowledge-query hook builds (:func:`node.community.inbox.results_for`);
3. passes the ``results`` message through the **egress gate seam** (``egress_check``), with
   the question as the message it answers, exactly as the engine does for a live frame;
4. records ``query`` and ``results`` in the **audit log** (keyed hash of the question by
   default), with ``via: "sealed"`` and no session id.

Simplifications against the live doorkeeper (node/host/doorkeeper.py, which this layer
may not import; its rules are restated here, not shared): a pin on any key of the chain's
lineage counts, without the host's rotation ledger (specs/peers.md §11); there is no
profile, so no look-alike-name check; ``presence = granted`` is not applied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from node.common.errors import error_for
from node.trust.sealed import Opened


def judge_sealed(home: Path, opened: Opened, *, peers_only: bool = False) -> str | None:
    """Who the sealed question's asker is to this host, now (re-read files, as a host does
    for every connection).

    Returns:
        the registry name it is answered under, or None (an anonymous peer).

    Raises:
        KithError: ``handshake-device-revoked`` (a revocation list kept here revokes the
            device for its person or a person pin that has seen it), ``handshake-peer-blocked``
            (the device or its person is blocked), ``handshake-not-admitted`` /
            ``handshake-person-not-pinned`` (``peers_only`` and not pinned).
    """
    from node.trust.peers import PeerRegistry, persons_of_device
    from node.trust.revocation_list import RevocationStore

    registry = PeerRegistry.load(home)
    revocations = RevocationStore.load(home)
    key = opened.sender
    # the key-level rules of the handshake's _session_init (node/host/doorkeeper.judge_init)
    if revocations.revokes(key, persons_of_device(registry, key)) is not None:
        raise error_for("handshake-device-revoked", "this device was revoked by its person")
    if registry.is_blocked(key):
        raise error_for("handshake-peer-blocked", "this key is blocked")
    deferred = "handshake-not-admitted" if peers_only and registry.by_key(key) is None else None
    person = opened.identity
    if person is None:
        if revocations.revokes(key, list(revocations.persons)) is not None:
            raise error_for("handshake-device-revoked", "this device was revoked by its person")
        if deferred is not None:
            raise error_for(deferred)
        rec = registry.by_key(key)
        return rec.name if rec is not None else None
    lineage = [person.person, *person.earlier]
    if revocations.revokes(key, lineage) is not None:
        raise error_for("handshake-device-revoked", "this device was revoked by its person")
    if any(registry.is_blocked(p) for p in lineage):
        raise error_for("handshake-peer-blocked", "this device's person key is blocked")
    rec = registry.by_key(key)
    if rec is not None:
        return rec.name
    for p in lineage:
        pin = registry.by_key(p)
        if pin is not None and pin.devices:
            return pin.name
    if deferred is not None:
        raise error_for("handshake-person-not-pinned")
    return None


def host_answerer(home: Path, knowledge: Any, *, peers_only: bool = False,
                  audit: Any = None) -> Callable[[Opened], dict[str, Any]]:
    """The ``on_question`` of :func:`node.community.inbox.take_step` for this host.

    Args:
        home: the host's home (peers, revocation lists re-read per question).
        knowledge: the host's :class:`node.host.host.Knowledge` (``open_knowledge``).
        peers_only: as ``kith host --peers-only``.
        audit: the host's :class:`node.trust.audit_log.AuditLog`, or None (nothing recorded).

    Returns:
        ``Opened → results message``; raises :class:`KithError` (a handshake code, or
        ``egress-leak``) to drop a question this host must not answer.
    """
    from node.community.inbox import results_for
    from node.engine.session import OutgoingFrame

    def answer(opened: Opened) -> dict[str, Any]:
        name = judge_sealed(home, opened, peers_only=peers_only)
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
                         via="sealed")
        return results

    return answer


__all__ = ["host_answerer", "judge_sealed"]
