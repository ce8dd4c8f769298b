"""The host's audit tap: a running host's activity as records of ``<home>/audit.jsonl``.

The log itself (its writer :class:`node.trust.audit_log.AuditLog`, rotation, keyed query
hashes and the reader) lives with the other on-disk trust records in
node/trust/audit_log.py (specs/peers.md §7); this module only decides *what* a host
records: session events, incoming queries and the outgoing ``results`` frames.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any, Callable

import msgspec

from node.common.host_events import (BY_KIND, DeviceRevoked, EventPath, GrantExpired, HostEvent, PeerRevoked,
                                     PersonDeviceNew, PersonRotated, PolicyReloaded, Republished, SessionEnded,
                                     SessionPathChanged, SessionRefused, SessionStarted)
from node.trust.audit_log import MAX_SOURCES, AuditLog


class _SessionTap:
    """What the audit knows about one connection: its peer, then its session id and name."""

    def __init__(self, audit: "HostAudit", peer: str) -> None:
        self.audit = audit
        self.peer = peer
        self.session_id: str | None = None
        self.peer_name: str | None = None
        #: the scrubbing gate's counts of the answer being sent (one question at a time)
        self._scrubbed: dict[str, int] | None = None

    def ready(self, session_id: str, peer_name: str | None) -> None:
        """The session became ready (called from the host's ``make_context``)."""
        self.session_id, self.peer_name = session_id, peer_name
        self.audit._taps[session_id] = self

    def answered(self, answer: dict[str, Any]) -> None:
        """The answer service answered this session's query: keep its ``scrubbed`` counts
        (spans per kind, ``refused`` results; never values) for the ``results`` record of
        the frame that carries it (the knowledge-query hooks never send them)."""
        got = answer.get("scrubbed")
        self._scrubbed = ({str(k)[:16]: int(v) for k, v in got.items() if isinstance(v, int)}
                          if isinstance(got, dict) else None)

    def outgoing(self, frame: Any) -> None:
        """An outgoing business frame passed the egress gate and is queued for sending:
        a ``results`` frame is recorded with its status and source ids (never text), and
        — for a scrubbed peer — ``scrubbed``, the counts per kind (:meth:`answered`).

        Args:
            frame: the engine's :class:`node.engine.session.OutgoingFrame`; the record is
                read from ``frame.message``, the object ``frame.data`` (the bytes that
                leave) is the encoding of — nothing is decoded again.
        """
        msg = frame.message
        if isinstance(msg, dict) and msg.get("action") == "copy_docs":
            self._copy_sent(msg)
            return
        if not isinstance(msg, dict) or msg.get("action") != "results":
            return
        env = msg.get("envelope") if isinstance(msg.get("envelope"), dict) else {}
        results = env.get("results") if isinstance(env.get("results"), list) else []
        sources = list(dict.fromkeys(str(r.get("source")) for r in results
                                     if isinstance(r, dict) and r.get("source") is not None))[:MAX_SOURCES]
        base = {"session_id": self.session_id, "peer": self.peer, "peer_name": self.peer_name}
        approval = msg.get("approval_id") if isinstance(msg.get("approval_id"), str) else None
        scrubbed, self._scrubbed = self._scrubbed, None
        self.audit.log.record("results", **base, query_id=str(msg.get("query_id"))[:64],
                              status=str(msg.get("status"))[:64], sources=sources, approval_id=approval,
                              scrubbed=scrubbed)
        if approval is not None and msg.get("status") == "pending-approval":
            self.audit.log.record("approval-created", **base, approval_id=approval[:64])


    def _copy_sent(self, msg: dict[str, Any]) -> None:
        """A ``copy_docs`` frame leaves: ``copy-sent`` with the source ids and versions of
        the documents it carries (never text), the spans scrubbed per kind and how many
        asked were refused or too large — what the owner can never take back."""
        docs = [d for d in msg.get("documents") or [] if isinstance(d, dict)]
        scrubbed, self._scrubbed = self._scrubbed, None
        if not docs:
            return
        self.audit.log.record("copy-sent", session_id=self.session_id, peer=self.peer, peer_name=self.peer_name,
                              query_id=str(msg.get("query_id"))[:64],
                              sources=[str(d.get("source"))[:1024] for d in docs],
                              versions=[str(d.get("version"))[:64] for d in docs],
                              documents=len(docs), scrubbed=scrubbed or None,
                              refused=len(msg.get("refused") or []) + len(msg.get("tooLarge") or []))


def _path_kind(path: EventPath) -> str:
    """An event's path as the audit records it: ``direct``, ``relayed <url>`` or
    ``unknown`` (never the peer's IP address: the log is often shown to others)."""
    kind = (path.kind or "unknown")[:16]
    return f"{kind} {path.relay_url[:200]}" if kind == "relayed" and path.relay_url else kind


class HostAudit:
    """Feeds a running host's activity into an :class:`AuditLog`.

    Hooked at the host level (node/host/host.py), independent of the answer path:
    ``observe`` wraps the host's ``on_event`` (session started/ended, refused
    handshakes, revocations, policy reloads); ``wrap_hooks`` wraps the protocol's
    ``on_message`` to record each incoming message with a ``query`` string; ``tap`` gives
    a per-connection object whose ``outgoing`` the host calls from its egress check with
    the engine's :class:`node.engine.session.OutgoingFrame`, i.e. for exactly the frames
    the engine queues to send, after the gate passed them.
    """

    def __init__(self, log: AuditLog) -> None:
        self.log = log
        self._taps: dict[str, _SessionTap] = {}
        self._names: dict[str, str | None] = {}

    def tap(self, peer: str) -> _SessionTap:
        """A new connection from ``peer`` (its key)."""
        return _SessionTap(self, peer)

    def observe(self, on_event: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        """``on_event`` that also records the event (the original is called first)."""

        def observed(ev: dict[str, Any]) -> None:
            on_event(ev)
            self.event(ev)

        return observed

    def event(self, ev: dict[str, Any]) -> None:
        """Record one host event: read as its typed event (node/common/host_events.py) and
        handed to the one function :data:`AUDITED` holds for its type (the other kinds, and
        a dict the table does not describe, are not audited)."""
        kind = BY_KIND.get(ev.get("event"))  # type: ignore[arg-type]
        record = AUDITED.get(kind) if kind is not None else None
        if record is None:
            return
        try:
            event = msgspec.convert(ev, kind)
        except (msgspec.ValidationError, TypeError):
            return
        record(self, event)

    def _session_started(self, ev: SessionStarted) -> None:
        self._names[ev.session_id] = ev.peer_name
        self.log.record("session-started", session_id=ev.session_id, peer=ev.peer, peer_name=ev.peer_name,
                        post_id=ev.post_id, pairing_code=ev.pairing_code, person=ev.person,
                        device_name=ev.device_name, path=_path_kind(ev.path), via_person=ev.via_person or None)

    def _session_path_changed(self, ev: SessionPathChanged) -> None:
        self.log.record("session-path-changed", session_id=ev.session_id, peer=ev.peer,
                        peer_name=self._names.get(ev.session_id), path=_path_kind(ev.path),
                        previous=_path_kind(ev.previous))

    def _session_ended(self, ev: SessionEnded) -> None:
        if ev.reason == "rejected" and not ev.session_id:
            # refused in the handshake (blocked, not admitted, bad proof, ...): no session existed
            self.log.record("handshake-refused", peer=ev.peer or None, code=ev.code)
            return
        sid = ev.session_id or ""
        self._taps.pop(sid, None)
        self.log.record("session-ended", sync=True, session_id=ev.session_id, peer=ev.peer,
                        peer_name=self._names.pop(sid, None), reason=ev.reason, code=ev.code)

    def _session_refused(self, ev: SessionRefused) -> None:
        self.log.record("handshake-refused", peer=ev.peer or None, code=ev.code, reason=ev.reason)

    def _as_is(self, ev: HostEvent) -> None:
        """Kinds recorded under their own name with every field."""
        fields = msgspec.to_builtins(ev)
        kind = fields.pop("event")
        self.log.record(kind, **fields)

    def incoming(self, session_id: str, peer: str, message: dict[str, Any]) -> None:
        """A validated business message from the peer: recorded when it has a ``query``
        string (its keyed hash, or its text with ``--audit-queries``)."""
        text = message.get("query") if isinstance(message, dict) else None
        if not isinstance(text, str):
            return
        tap = self._taps.get(session_id)
        self.log.record("query", session_id=session_id, peer=peer, peer_name=tap.peer_name if tap else None,
                        action=str(message.get("action"))[:64], query_id=str(message.get("query_id"))[:64],
                        **self.log.query_fields(text))

    def wrap_hooks(self, hooks: Any) -> Any:
        """The protocol's hooks with ``on_message`` recording each incoming query first
        (sync hooks stay sync — the driver runs them in a worker thread, or on the event
        loop when their ``inline`` predicate, kept on the wrapper, says so — async stay
        async)."""
        inner = hooks.on_message
        if inner is None:
            return hooks
        if inspect.iscoroutinefunction(inner):
            async def on_message(ctx: Any, message: Any) -> Any:
                if ctx.role == "host":
                    self.incoming(ctx.session_id, ctx.peer.public_key, message)
                return await inner(ctx, message)
        else:
            def on_message(ctx: Any, message: Any) -> Any:  # type: ignore[misc]
                if ctx.role == "host":
                    self.incoming(ctx.session_id, ctx.peer.public_key, message)
                return inner(ctx, message)
        on_message.__name__ = getattr(inner, "__name__", "on_message")
        if getattr(inner, "inline", None) is not None:  # the hook's word on its size (node/runtime/hooks.py)
            on_message.inline = inner.inline  # type: ignore[attr-defined]
        return replace(hooks, on_message=on_message)

    def close(self) -> None:
        """fsync and close the log."""
        self.log.close()


#: the table: each audited host event type -> the one method that records it (the other
#: kinds — posts, evictions, index updates, ... — are not audited)
AUDITED: dict[type[HostEvent], Callable[[HostAudit, Any], None]] = {
    SessionStarted: HostAudit._session_started, SessionPathChanged: HostAudit._session_path_changed,
    SessionEnded: HostAudit._session_ended, SessionRefused: HostAudit._session_refused,
    **dict.fromkeys((PeerRevoked, PolicyReloaded, Republished, GrantExpired, PersonRotated, DeviceRevoked,
                     PersonDeviceNew), HostAudit._as_is),
}

__all__ = ["HostAudit", "AUDITED"]
