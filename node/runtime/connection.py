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

from node.common.errors import HandshakeError, KithError
from node.engine.framing import encode_frame
from node.engine.session import HostConfig, OutgoingFrame, SessionEngine, SessionReady
from node.runtime.driver import run_session
from node.runtime.grants import has_grant, refusal_code
from node.runtime.hooks import HookContext, PeerInfo
from node.runtime.sessions import DEFERRABLE_CODES, ActivityTracked, admission
from node.trust.peers import note_device
from node.trust.rotation import pinned_in_lineage

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
        self.pinned: Any = None  # the registry record of this device key, or None
        self.person_pin: Any = None  # the person pin whose grants this device holds, or None
        self.profile: dict[str, Any] = {}  # what a deferred guest shared (its claim is judged at ready)
        self.path: Any = None  # the stream's node.transport.paths.PathInfo, once it opened
        self.session_id: str | None = None

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
        # re-read once per connection: `kith peers` may have changed it
        self.registry = registry = host.peers_watcher.current()
        if host.opts.presence == "granted" and not has_grant(registry, self.remote, host.peers_watcher.revocations()):
            # first, before any other refusal (a shutting-down host's session-shutdown included):
            # no slot, nonce or post use is taken, no heartbeat is ever sent (node/runtime/grants.py)
            await self.refuse(refusal_code("granted", "handshake-not-admitted", granted=False), reason="no-grant")
            return
        if host.session_stop.is_set():
            await self.refuse("session-shutdown")
            return
        self.pinned = pinned = registry.by_key(self.remote)
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
        from node.transport.paths import watch

        self.path = watch(self.stream, self._path_changed)
        host.table.set_path(self.token, self.path.to_dict())
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
                            admit=admission(self.registry, host.opts.peers_only, host.peers_watcher.revocations(),
                                            host.opts.presence),
                            profile=host.own_profile, ui_bundle=host.ui_bundle, named_post=self.named_post,
                            check_person=self.check_person, defer=self.defer, admit_person=self.admit_person),
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

    async def refuse(self, code: str, message: str | None = None, reason: str | None = None) -> None:
        """Send ``_session_reject code`` on the open stream, close it and report a
        ``session-refused`` event (sending is bounded by :data:`REFUSE_SEND_S`; ``reason``,
        e.g. ``no-grant``, is for the owner's event only)."""
        data = self.host.reject_frame(code, message)
        with anyio.move_on_after(REFUSE_SEND_S):
            try:
                await self.stream.send(data)
            except KithError:
                pass
            await self.stream.aclose()
        ev = {"event": "session-refused", "peer": self.stream.remote_id, "code": code}
        if reason is not None:
            ev["reason"] = reason
        self.host.emit(ev)

    def _path_changed(self, previous: Any, now: Any) -> None:
        """iroh selected another path (direct ↔ relayed, another relay or address): the
        table lists it, and once the session is ready a ``session-path-changed`` event
        (audited) says so (specs/transport.md §3)."""
        self.path = now
        self.host.table.set_path(self.token, now.to_dict())
        if self.session_id is not None:
            self.host.emit({"event": "session-path-changed", "session_id": self.session_id, "peer": self.remote,
                            "path": now.to_dict(), "previous": previous.to_dict()})

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

    def check_person(self, pid: Any) -> None:
        """The engine's ``HostConfig.check_person``: judge the chain by the host's rotation
        ledger (node/trust/rotation.py; raises :class:`HandshakeError` for a rotation it
        refuses). Rotations are *recorded* (and the owner told, ``person-rotated``) only
        for a peer the registry knows — its device key, or a key of its lineage, is pinned
        — so strangers cannot grow the ledger, push pinned people's entries out of it, or
        make the host write for every handshake."""
        host = self.host
        registry = self.registry
        known = registry.by_key(self.remote) is not None or pinned_in_lineage(registry, host.rotations, pid) is not None
        if not known:
            host.rotations.check(pid)
            return
        for old, new, via in host.rotations.follow(pid):
            host.emit({"event": "person-rotated", "old_person": old, "person": new, "via": via,
                       "peer": self.remote, "device_name": pid.device_name})

    def defer(self, key: str, profile: dict[str, Any], code: str) -> bool:
        """``HostConfig.defer``: a device key that is not pinned itself, refused at
        ``_session_init`` only for not being pinned (``--peers-only``) or for claiming a
        pinned name, is judged again by its person at ``_session_ready``
        (:meth:`admit_person`; specs/peers.md §10)."""
        if self.pinned is not None or code not in DEFERRABLE_CODES:
            return False
        self.profile = dict(profile)
        return True

    def admit_person(self, person: Any, revocation: Any, deferred: str | None) -> None:
        """``HostConfig.admit_person``, at ``_session_ready`` once the chain and the
        revocation list verified (specs/peers.md §10):

        1. a revocation list is taken (kept when its person is pinned with ``--devices``
           and it is newer; the newly revoked devices' live sessions end at once);
        2. a device that a kept list of its own person (a key of the chain's lineage)
           revokes, or a guest sending no chain whose key any kept list names →
           ``handshake-device-revoked`` (a list speaks only for its own person's devices:
           another person's list never refuses a device whose chain names its person); a blocked person
           key → ``handshake-peer-blocked``;
        3. a device not pinned by its own key whose person is pinned with ``--devices``
           holds that pin's grants; a deferred guest without such a pin is refused with the
           deferred ``peer-key-changed``, ``handshake-person-not-pinned`` (a chain to a person
           not pinned with ``--devices``) or ``handshake-not-admitted`` (no chain).

        Raises:
            HandshakeError: as above.
        """
        watcher = self.host.peers_watcher
        if revocation is not None:
            # judged on the newest registry read; a pin on a key the chain rotated from counts
            watcher.apply_list(revocation, via="handshake", lineage=self.host.rotations.lineage(person))
        kept = watcher.revocations()
        if person is None:
            # a key that names no person cannot contest a kept list that names it
            if kept.revokes(self.remote, kept.persons) is not None:
                raise HandshakeError("handshake-device-revoked", "this device was revoked by its person")
            if deferred is not None:
                raise HandshakeError(deferred)
            return
        if kept.revokes(person.device, self.host.rotations.lineage(person)) is not None:
            raise HandshakeError("handshake-device-revoked", "this device was revoked by its person")
        known = watcher.known()  # the newest registry the host read: a pin removed meanwhile grants nothing
        if known.is_blocked(person.person):
            raise HandshakeError("handshake-peer-blocked", "this device's person key is blocked")
        # a pin on this person key, or on a key it rotated from (specs/peers.md §11)
        pin = None
        if self.pinned is None:  # a pin on this person key, or on a key it rotated from (specs/peers.md §11)
            rec = pinned_in_lineage(known, self.host.rotations, person)
            pin = rec if rec is not None and rec.devices else None
        if deferred == "peer-key-changed" and (pin is None or known.claimed_by_other(
                self.remote, self.profile) not in (None, pin)):
            raise HandshakeError("peer-key-changed", "a pinned peer name with a different key")
        if deferred == "handshake-not-admitted" and pin is None:
            raise HandshakeError("handshake-person-not-pinned")
        self.person_pin = pin
        if pin is not None:
            self.registry = known  # the record the session's grants and seenDevices come from

    def egress(self, frame: Any) -> Any:
        """The engine's egress seam, called once per outgoing business frame with a
        :class:`node.engine.session.OutgoingFrame` (the message, its exact bytes, the
        peer message it answers). The last rewrite comes first: a ``results`` frame
        answering ``citations: true`` gets its signed citations (or the ``signing-off``
        marker, :class:`node.answer.citation.CitationSigner`) over the evidence text
        exactly as it leaves; then the gate scans the final bytes (raises
        ``EgressRefused``), and the audit tap records the final message as queued to send
        (nothing is decoded again). Returns the rewritten frame, or None when unchanged."""
        rewritten = self.host.citations.rewrite(frame.message, frame.replying_to)
        if rewritten is not None:
            frame = OutgoingFrame(rewritten, encode_frame(rewritten), frame.replying_to)
        check = self.host.knowledge.egress_check
        if check is not None:
            check(frame)  # EgressGate.check_frame
        self.tap.outgoing(frame)
        return frame if rewritten is not None else None

    def make_context(self, ev: SessionReady) -> HookContext:
        """The session is ready: record its proof and nonce, tell the table and the
        owner, and build the hooks' context with the peer's knowledge handle."""
        host = self.host
        registry = self.registry
        pin = self.person_pin  # a person pin's grants (specs/peers.md §10), or None
        grant_key = pin.public_key if pin else ev.peer_public_key  # quota, approvals: one per person
        rec = registry.merge_profile(grant_key, ev.peer_profile) or registry.by_key(grant_key)
        name = rec.name if rec else None
        code = host.pairing_code(ev.peer_public_key)
        pid = ev.peer_person  # the verified binding chain's PersonIdentity, or None (v1 guest)
        person = None if pid is None else {"key": pid.person, "deviceName": pid.device_name,
                                           "earlier": list(pid.earlier)}
        used_up = host.table.session_ready(self.token, ev.session_id, code, person,
                                           via_person=(pin.name, pin.public_key) if pin else None)
        host.table.succeeded(self.remote)
        post = ev.proof.get("post_id", "")
        host.posts.used(post)  # kept at once: a restart goes on counting (file mode)
        for nonce in self.held:  # a proof signed by both sides exists now: remember it
            host.seen_nonces.commit(post, nonce, host.posts.expires_at(post) or host.clock.time() + host.opts.ttl_s)
        self.held.clear()
        if host.posts.keeper is not None:  # the guest may have joined by file: record the proof here
            host.posts.keeper.record_proof(ev.proof, used_up=used_up)
        self.tap.ready(ev.session_id, name)
        self.session_id = ev.session_id
        if pin is not None and pid is not None and note_device(registry, pin, pid.device, pid.device_name):
            host.emit({"event": "person-device-new", "peer_name": pin.name, "person": pin.public_key,
                       "device": pid.device, "device_name": pid.device_name})
        host.emit({"event": "session-started", "session_id": ev.session_id, "peer": ev.peer_public_key,
                   "peer_name": name, "post_id": post, "pairing_code": code,
                   "person": pid.person if pid else None, "device_name": pid.device_name if pid else None,
                   "via_person": pin is not None, "path": self.path.to_dict()})
        token = self.token
        return HookContext(role="host", session_id=ev.session_id,
                           peer=PeerInfo(ev.peer_public_key, name, ev.peer_profile,
                                         person=pid.person if pid else None,
                                         device_name=pid.device_name if pid else None),
                           options=dict(host.opts.hook_options),
                           knowledge=ActivityTracked(host.knowledge.handle_for(name, grant_key),
                                                     lambda: host.table.begin_query(token),
                                                     lambda status: host.table.activity(token, status),
                                                     self.tap.answered),
                           logger=logging.getLogger("kith.hooks." + host.spec.name))


__all__ = ["Connection", "FIRST_STREAM_TIMEOUT_S"]
