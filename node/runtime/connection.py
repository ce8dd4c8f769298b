"""One accepted connection of a host, from its first stream to its end.

:class:`Connection` is what ``serve_host`` used to keep as nested closures: it waits for
the guest's stream, takes a slot in the host's :class:`node.runtime.sessions.SessionTable`,
builds the host-side :class:`node.engine.session.SessionEngine` with the host's posts,
nonces, admission predicate and egress seam, runs the session with
:func:`node.runtime.driver.run_session`, reports how it ended and always gives its slot,
its post reservation and its nonce back. Everything it shares with other connections is
reached through the :class:`node.runtime.host.Host` that made it; an exception inside one
connection ends that connection only (the host logs it).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import anyio

from node.common.errors import KithError
from node.engine.session import HostConfig, SessionEngine, SessionReady
from node.runtime.driver import run_session
from node.runtime.hooks import HookContext, PeerInfo
from node.runtime.sessions import ActivityTracked, admission

if TYPE_CHECKING:
    from node.runtime.host import Host

log = logging.getLogger("kith.host")

#: How long an accepted connection may take to open its session stream (s). An honest
#: guest opens it within milliseconds; a silent one is closed after this.
FIRST_STREAM_TIMEOUT_S = 3.0
#: How long sending a refusal may take before the stream is closed anyway (s).
REFUSE_SEND_S = 2.0


class Connection:
    """Serve one accepted connection (:meth:`serve`).

    Args:
        host: the host that accepted it (its table, posts, engine inputs and events).
        conn: the transport's connection object (``host.listener`` knows how to use it).
        token: the host's number for it (also the session table's key).
        scope: cancelled when the connection is evicted from the pending pool.
    """

    def __init__(self, host: "Host", conn: Any, token: int, scope: anyio.CancelScope) -> None:
        self.host = host
        self.conn = conn
        self.token = token
        self.pending_scope = scope
        self.session_scope = anyio.CancelScope()
        self.engine: SessionEngine | None = None
        self.stream: Any = None
        self.remote = ""
        self.named: str | None = None  # the live post its _session_init named
        self.held: set[str] = set()  # the guest nonce this handshake reserved
        self.tap: Any = None
        self.registry: Any = None  # the peer registry as read when the stream opened

    # ------------------------------------------------------------ the whole life
    async def serve(self) -> None:
        """Accept the stream, run the session, report its end; never raises."""
        host = self.host
        try:
            with self.pending_scope:  # cancelled when evicted from the pending pool
                self.stream = await host.listener.accept_stream(self.conn, timeout_s=host.first_stream_timeout_s)
        except KithError:
            pass
        finally:
            host.table.connection_done(self.token)
        if self.stream is None:
            host.listener.close_connection(self.conn, b"no-stream")
            return
        self.remote = self.stream.remote_id or ""
        if host.session_stop.is_set():
            await self.refuse("session-shutdown")
            return
        # re-read once per connection: `kith peers` may have changed it
        self.registry = registry = host.peers_watcher.current()
        pinned = registry.by_key(self.remote)
        refusal = host.table.open_session(self.token, self.remote, self.end,
                                          alive=lambda: not (self.engine is not None and self.engine.closed),
                                          anonymous=pinned is None, name=pinned.name if pinned else None)
        if refusal == "handshake-too-many-failures":
            left = max(1, math.ceil(host.table.cooldown_left(self.remote)))
            await self.refuse(refusal, f"Too many failed handshakes from this key; try again in {left} s.")
            return
        if refusal is not None:
            await self.refuse(refusal)
            return
        try:
            await self._run()
        finally:
            host.table.close_session(self.token)
            for nonce in self.held:
                host.seen_nonces.release(nonce)

    async def _run(self) -> None:
        host = self.host
        self.tap = host.audit.tap(self.remote)  # records the results frames queued to send
        self.engine = SessionEngine(
            "host", host.spec, public_key=host.identity.public_key, sign=host.identity.sign,
            host=HostConfig(remote_id=self.remote, post_protocol=self.post_protocol, nonce_unseen=self.nonce_unseen,
                            admit=admission(self.registry, host.opts.peers_only), profile=host.own_profile,
                            ui_bundle=host.ui_bundle, named_post=self.named_post),
            egress_check=self.egress)
        with self.session_scope:  # cancelled when ended from outside (evicted, revoked, the owner)
            outcome = await run_session(self.stream, self.engine, host.hooks, make_context=self.make_context,
                                        heartbeat=host.opts.heartbeat, stop=host.session_stop)
        if self.session_scope.cancelled_caught:
            ended = host.table.ended(self.token)
            if ended is None or (ended.cause == "evicted" and not ended.ready):
                return  # evicted in the handshake: reported as session-refused already
            cut = self.engine.close_event
            if ended.cause == "evicted":  # ended from outside once ready (session-evicted)
                host.emit({"event": "session-ended", "session_id": self.engine.session_id, "peer": self.remote,
                           "reason": cut.reason if cut else "aborted", "code": cut.code if cut else ended.code,
                           "ended_at": host.clock.time()})
                return
            # revoked (`kith peers remove|block`) or ended by the owner (`kith sessions end`)
            host.emit({"event": "session-ended", "session_id": self.engine.session_id, "peer": self.remote,
                       "reason": cut.reason if cut else "aborted", "code": ended.code, "ended_at": ended.at})
            return
        if self.named is not None and outcome.session_id is None:  # named a live post, never became ready
            host.table.record_failure(self.remote, outcome.code or "")
            host.posts.record_failure(self.named, outcome.code or "")
        ev: dict[str, Any] = {"event": "session-ended", "session_id": outcome.session_id, "peer": self.remote,
                              "reason": outcome.reason, "code": outcome.code, "ended_at": outcome.ended_at}
        if self.engine.ui_bytes_sent:
            ev["ui_bytes_sent"] = self.engine.ui_bytes_sent
        if outcome.refused:  # codes of the guest's messages the engine refused before hooks
            ev["refused"] = list(outcome.refused)[:32]
        host.emit(ev)

    # ------------------------------------------------------------ ending and refusing
    def end(self, code: str, message: str) -> None:
        """End this session now (the session table's ``end`` callback): the engine queues
        ``_session_reject`` (in the handshake) or ``_error`` (once ready), which
        run_session's cleanup still sends, and the session is cancelled."""
        if self.engine is not None and not self.engine.closed:
            self.engine.abort(code, message or None)
        self.session_scope.cancel()

    async def refuse(self, code: str, message: str | None = None) -> None:
        """Send ``_session_reject code`` on the open stream, close it and report a
        ``session-refused`` event (sending is bounded by :data:`REFUSE_SEND_S`)."""
        data = self.host.reject_frame(code, message)
        with anyio.move_on_after(REFUSE_SEND_S):
            try:
                await self.stream.send(data)
            except KithError:
                pass
            await self.stream.aclose()
        self.host.emit({"event": "session-refused", "peer": self.stream.remote_id, "code": code})

    # ------------------------------------------------------------ the engine's questions
    def named_post(self, post_id: str) -> None:
        """The guest's ``_session_init`` named ``post_id`` (counted for failures if live)."""
        if self.host.posts.joinable(post_id):
            self.named = post_id

    def post_protocol(self, post_id: str) -> str | None:
        """The protocol a guest naming ``post_id`` must speak, or None; reserves one use
        of the post for this session (``HostConfig.post_protocol``).

        Raises:
            HandshakeError: ``handshake-post-expired``.
        """
        protocol = self.host.posts.protocol_for(post_id)
        if protocol is None or not self.host.table.claim_post(self.token, post_id):
            return None
        return protocol

    def nonce_unseen(self, nonce: str) -> bool:
        """Reserve the guest's nonce (recorded for good once the session is ready)."""
        if not self.host.seen_nonces.reserve(nonce):
            return False
        self.held.add(nonce)
        return True

    def egress(self, frame: Any) -> None:
        """The engine's egress seam, called once per outgoing business frame with a
        :class:`node.engine.session.OutgoingFrame` (the message, its exact bytes, the
        peer message it answers): the gate scans ``frame.data`` (raises
        ``EgressRefused``), then the audit tap records ``frame.message`` as queued to send
        (nothing is decoded again)."""
        check = self.host.knowledge.egress_check
        if check is not None:
            check(frame)  # EgressGate.check_frame
        self.tap.outgoing(frame)

    def make_context(self, ev: SessionReady) -> HookContext:
        """The session is ready: record its proof and nonce, tell the table and the
        owner, and build the hooks' context with the peer's knowledge handle."""
        host = self.host
        registry = self.registry
        rec = registry.merge_profile(ev.peer_public_key, ev.peer_profile) or registry.by_key(ev.peer_public_key)
        name = rec.name if rec else None
        code = host.pairing_code(ev.peer_public_key)
        pid = ev.peer_person  # the verified binding chain's PersonIdentity, or None (v1 guest)
        person = None if pid is None else {"key": pid.person, "deviceName": pid.device_name,
                                           "earlier": list(pid.earlier)}
        used_up = host.table.session_ready(self.token, ev.session_id, code, person)
        host.table.succeeded(self.remote)
        post = ev.proof.get("post_id", "")
        for nonce in self.held:  # a proof signed by both sides exists now: remember it
            host.seen_nonces.commit(post, nonce, host.posts.expires_at(post) or host.clock.time() + host.opts.ttl_s)
        self.held.clear()
        if host.posts.keeper is not None:  # the guest may have joined by file: record the proof here
            host.posts.keeper.record_proof(ev.proof, used_up=used_up)
        self.tap.ready(ev.session_id, name)
        host.emit({"event": "session-started", "session_id": ev.session_id, "peer": ev.peer_public_key,
                   "peer_name": name, "post_id": post, "pairing_code": code,
                   "person": pid.person if pid else None, "device_name": pid.device_name if pid else None})
        token = self.token
        return HookContext(role="host", session_id=ev.session_id,
                           peer=PeerInfo(ev.peer_public_key, name, ev.peer_profile,
                                         person=pid.person if pid else None,
                                         device_name=pid.device_name if pid else None),
                           options=dict(host.opts.hook_options),
                           knowledge=ActivityTracked(host.knowledge.handle_for(name, ev.peer_public_key),
                                                     lambda: host.table.begin_query(token),
                                                     lambda status: host.table.activity(token, status),
                                                     self.tap.answered),
                           logger=logging.getLogger("kith.hooks." + host.spec.name))


__all__ = ["Connection", "FIRST_STREAM_TIMEOUT_S"]
