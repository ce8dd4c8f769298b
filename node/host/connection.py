"""One accepted connection of a host, from its first stream to its end.

:class:`Connection` is what ``serve_host`` used to keep as nested closures: it waits for
the guest's stream, takes a slot in the host's :class:`node.host.sessions.SessionTable`,
builds the host-side :class:`node.engine.session.SessionEngine` with the host's posts,
nonces, admission predicate and egress seam, runs the session with
:func:`node.runtime.driver.run_session`, reports how it ended and always gives its slot,
its post reservation and its nonce back. Who may come in is asked of the host's
:class:`node.host.doorkeeper.Doorkeeper`, step by step. What it shares with other
connections is given at construction as one :class:`Wiring` the host builds once — the
doorkeeper, the table, the posts, the nonce table, the listener, the event sink, the clock,
the session setup and the answering seams — never the host itself; an exception inside one
connection ends that connection only (the host logs it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio

from node.common.errors import KithError
from node.common.host_events import (EventPath, PersonDeviceNew, SessionEnded, SessionPathChanged, SessionRefused,
                                     SessionStarted)
from node.engine.framing import encode_frame
from node.engine.session import HostConfig, OutgoingFrame, SessionEngine, SessionReady
from node.host.doorkeeper import Admitted, Arrival, Doorkeeper, Visit, engine_seams
from node.runtime.driver import run_session
from node.runtime.hooks import HookContext, PeerInfo
from node.host.sessions import ActivityTracked
from node.trust.peers import note_device

log = logging.getLogger("kith.host")

#: How long an accepted connection may take to open its session stream (s). An honest
#: guest opens it within milliseconds; a silent one is closed after this.
FIRST_STREAM_TIMEOUT_S = 3.0
#: How long sending a refusal may take before the stream is closed anyway (s).
REFUSE_SEND_S = 2.0


@dataclass(frozen=True)
class SessionSetup:
    """How the host's sessions are made and run (the same for every connection).

    Attributes:
        spec: the protocol's :class:`node.protocol.spec.ProtocolSpec`.
        identity: the host's :class:`node.trust.identity.Identity` (``public_key``, ``sign``).
        hooks: the host's (audited) protocol hooks.
        profile: what the host shares of itself in the handshake.
        ui_bundle: the UI bundle offered (``--share-ui``), or None.
        heartbeat: ``(ping_interval_s, unresponsive_s)`` or ``"default"``.
        stop: set when the host stops (live sessions end cleanly).
        hook_options: the host hooks' ``ctx.options``.
        ttl_s: how long a nonce is remembered when its post names no end (s).
        first_stream_timeout_s: how long a connection may take to open its stream (s).
        reject_frame: ``(code, message | None)`` → one ``_session_reject`` frame.
        pairing_code: ``peer_key`` → the pairing words both sides see.
        card: ``()`` → this hosting device's card for its newest post, or None
            (sent to a guest that asks for it; specs/peers.md §13).
        card_v1: ``()`` → that card in format 1 (same ``seq``), sent to a guest that reads
            format 1 only, or None (``card`` is sent; specs/sealed.md §6).
    """

    spec: Any
    identity: Any
    hooks: Any
    profile: dict[str, Any]
    ui_bundle: Any
    heartbeat: Any
    stop: Any
    hook_options: dict[str, Any]
    ttl_s: float
    first_stream_timeout_s: float
    reject_frame: Callable[[str, str | None], bytes]
    pairing_code: Callable[[str], str]
    card: Callable[[], dict[str, Any] | None] = lambda: None
    card_v1: Callable[[], dict[str, Any] | None] | None = None


@dataclass(frozen=True)
class Answering:
    """The seams between a session and the host's knowledge.

    Attributes:
        tap: ``peer_key`` → the audit tap of one session (:meth:`node.host.audit.HostAudit.tap`).
        rewrite: ``(message, replying_to, peer_name | None)`` → the message with its signed
            citations (each version the one that peer is given), or None
            (:meth:`node.answer.citation.CitationSigner.rewrite`).
        check: the egress gate's check of one outgoing frame (raises ``EgressRefused``), or None.
        knowledge_for: ``(peer_name | None, grant_key)`` → the peer's knowledge handle.
        copy_state: ``peer_name | None`` → the copy grant state the handshake tells that
            peer (:meth:`node.answer.service.AnswerService.copy_state`), or None (say nothing).
        answered: ``(peer_key, message)`` for every outgoing message queued to send, after
            the gate and the audit (:meth:`node.host.host.Host.answered_live`: a question
            answered live is not answered again when it is also taken sealed).
    """

    tap: Callable[[str], Any]
    rewrite: Callable[[Any, Any, str | None], Any]
    check: Callable[[Any], None] | None
    knowledge_for: Callable[[str | None, str | None], Any]
    copy_state: Callable[[str | None], Any] = lambda name: None
    answered: Callable[[str, Any], None] = lambda peer, message: None


@dataclass(frozen=True)
class Wiring:
    """Everything a :class:`Connection` uses, built once by the host.

    Attributes:
        door: the :class:`node.host.doorkeeper.Doorkeeper` (every admission decision).
        table: the :class:`node.host.sessions.SessionTable` (slots, activity, failures).
        posts: the :class:`node.host.posts.Posts` (what may be joined; its keeper).
        nonces: the :class:`node.trust.seen_nonces.SeenNonces` table.
        listener: the endpoint (``accept_stream``, ``close_connection``).
        emit: reports one host event.
        clock: the host's :class:`node.runtime.clock.Clock`.
        setup: :class:`SessionSetup`. answering: :class:`Answering`.
    """

    door: Doorkeeper
    table: Any
    posts: Any
    nonces: Any
    listener: Any
    emit: Callable[[dict[str, Any]], None]
    clock: Any
    setup: SessionSetup
    answering: Answering = field(repr=False)


class Connection:
    """Serve one accepted connection (:meth:`serve`).

    Args:
        wiring: what the host's connections share (:class:`Wiring`).
        conn: the transport's connection object (``wiring.listener`` knows how to use it).
        token: the host's number for it (also the session table's key).
        scope: cancelled when the connection is evicted from the pending pool.
    """

    def __init__(self, wiring: Wiring, conn: Any, token: int, scope: anyio.CancelScope) -> None:
        self.door = wiring.door
        self.table = wiring.table
        self.posts = wiring.posts
        self.nonces = wiring.nonces
        self.listener = wiring.listener
        self.emit = wiring.emit
        self.clock = wiring.clock
        self.setup = wiring.setup
        self.answering = wiring.answering
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
        self.visit: Visit | None = None  # what the doorkeeper knows of this guest, once admitted at the door
        self.path: Any = None  # the stream's node.transport.paths.PathInfo, once it opened
        self.session_id: str | None = None
        self.peer_name: str | None = None  # the pinned name it answers as, once ready (None: anonymous)

    # ------------------------------------------------------------ the whole life
    async def serve(self) -> None:
        """Accept the stream, run the session, report its end; never raises."""
        try:
            with self.pending_scope:  # cancelled when evicted from the pending pool
                self.stream = await self.listener.accept_stream(self.conn, timeout_s=self.setup.first_stream_timeout_s)
        except KithError:
            pass
        finally:
            self.table.connection_done(self.token)
        if self.stream is None:
            self.listener.close_connection(self.conn, b"no-stream")
            return
        self.remote = self.stream.remote_id or ""
        verdict = self.door.admit(Arrival(self.remote, self.token, self.end,
                                          alive=lambda: not (self.engine is not None and self.engine.closed)))
        if not isinstance(verdict, Admitted):
            await self.refuse(verdict.code, verdict.message, reason=verdict.reason)
            return
        self.visit = verdict.visit
        from node.transport.paths import watch

        self.path = watch(self.stream, self._path_changed)
        self.table.set_path(self.token, self.path.to_dict())
        try:
            await self._run()
        finally:
            self.table.close_session(self.token)
            for nonce in self.held:
                self.nonces.release(nonce)

    async def _run(self) -> None:
        setup, identity = self.setup, self.setup.identity
        self.tap = self.answering.tap(self.remote)  # records the results frames queued to send
        self.engine = SessionEngine(
            "host", setup.spec, public_key=identity.public_key, sign=identity.sign,
            host=HostConfig(remote_id=self.remote, post_protocol=self.post_protocol, nonce_unseen=self.nonce_unseen,
                            profile=setup.profile, ui_bundle=setup.ui_bundle, named_post=self.named_post,
                            card=setup.card, card_v1=setup.card_v1, copy_state=self.copy_state, **self._seams()),
            egress_check=self.egress)
        with self.session_scope:  # cancelled when ended from outside (evicted, revoked, the owner)
            outcome = await run_session(self.stream, self.engine, setup.hooks, make_context=self.make_context,
                                        heartbeat=setup.heartbeat, stop=setup.stop)
        if self.session_scope.cancelled_caught:
            ended = self.table.ended(self.token)
            if ended is None or (ended.cause == "evicted" and not ended.ready):
                return  # evicted in the handshake: reported as session-refused already
            cut = self.engine.close_event
            if ended.cause == "evicted":  # ended from outside once ready (session-evicted)
                self.emit(self._ended(self.engine.session_id, cut.reason if cut else "aborted",
                                      cut.code if cut else ended.code, self.clock.time()))
                return
            # revoked (`kith peers remove|block`) or ended by the owner (`kith sessions end`)
            self.emit(self._ended(self.engine.session_id, cut.reason if cut else "aborted", ended.code, ended.at))
            return
        if self.named is not None and outcome.session_id is None:  # named a live post, never became ready
            self.table.record_failure(self.remote, outcome.code or "")
            self.posts.record_failure(self.named, outcome.code or "")
        self.emit(self._ended(outcome.session_id, outcome.reason, outcome.code, outcome.ended_at,
                              refused=list(outcome.refused)[:32]))

    def _seams(self) -> dict[str, Any]:
        """The doorkeeper's admission seams for this visit, its ``admit_person`` telling the
        table the admitted person in the same step as the verdict (no await between them:
        a revocation the host takes before :meth:`make_context` still finds the session,
        specs/peers.md §5)."""
        seams = engine_seams(self.door, self.visit)
        judge = seams["admit_person"]

        def admit_person(person: Any, revocation: Any, deferred: str | None) -> None:
            judge(person, revocation, deferred)  # raises HandshakeError for a refusal
            pin = self.visit.pin if self.visit is not None else None
            self.table.session_admitted(self.token, _person_record(person),
                                        via_person=(pin.name, pin.public_key) if pin else None)

        seams["admit_person"] = admit_person
        return seams

    def _ended(self, session_id: str | None, reason: str, code: str | None, at: float, *,
               refused: list[str] | None = None) -> dict[str, Any]:
        """The one ``session-ended`` event of this connection, however it ended
        (node/common/host_events.py): ``session_id`` null when refused in the handshake,
        ``at`` Unix s, ``refused`` the codes of guest messages the engine refused before
        the hooks."""
        return SessionEnded(session_id=session_id, peer=self.remote, reason=reason, code=code, ended_at=at,
                            ui_bytes_sent=self.engine.ui_bytes_sent, refused=refused or []).to_dict()

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
        data = self.setup.reject_frame(code, message)
        with anyio.move_on_after(REFUSE_SEND_S):
            try:
                await self.stream.send(data)
            except KithError:
                pass
            await self.stream.aclose()
        self.emit(SessionRefused(peer=self.stream.remote_id, code=code, reason=reason).to_dict())

    def _path_changed(self, previous: Any, now: Any) -> None:
        """iroh selected another path (direct ↔ relayed, another relay or address): the
        table lists it, and once the session is ready a ``session-path-changed`` event
        (audited) says so (specs/transport.md §3)."""
        self.path = now
        self.table.set_path(self.token, now.to_dict())
        if self.session_id is not None:
            self.emit(SessionPathChanged(session_id=self.session_id, peer=self.remote,
                                         path=EventPath.of(now), previous=EventPath.of(previous)).to_dict())

    # ------------------------------------------------------------ the engine's questions
    def named_post(self, post_id: str) -> None:
        """The guest's ``_session_init`` named ``post_id`` (counted for failures if live)."""
        if self.posts.joinable(post_id):
            self.named = post_id

    def post_protocol(self, post_id: str) -> str | None:
        """The protocol a guest naming ``post_id`` must speak, or None; reserves one use
        of the post for this session (``HostConfig.post_protocol``).

        Raises:
            HandshakeError: ``handshake-post-expired``.
        """
        protocol = self.posts.protocol_for(post_id)
        if protocol is None or not self.table.claim_post(self.token, post_id):
            return None
        return protocol

    def nonce_unseen(self, nonce: str) -> bool:
        """Reserve the guest's nonce (recorded for good once the session is ready)."""
        if not self.nonces.reserve(nonce):
            return False
        self.held.add(nonce)
        return True

    def egress(self, frame: Any) -> Any:
        """The engine's egress seam, called once per outgoing business frame with a
        :class:`node.engine.session.OutgoingFrame` (the message, its exact bytes, the
        peer message it answers). The last rewrite comes first: a ``results`` frame
        answering ``citations: true`` gets its signed citations (or the ``signing-off``
        marker, :class:`node.answer.citation.CitationSigner`) over the evidence text
        exactly as it leaves; then the gate scans the final bytes (raises
        ``EgressRefused``), and the audit tap records the final message as queued to send
        (nothing is decoded again). Returns the rewritten frame, or None when unchanged."""
        rewritten = self.answering.rewrite(frame.message, frame.replying_to, self.peer_name)
        if rewritten is not None:
            frame = OutgoingFrame(rewritten, encode_frame(rewritten), frame.replying_to)
        check = self.answering.check
        if check is not None:
            check(frame)  # EgressGate.check_frame
        self.tap.outgoing(frame)
        self.answering.answered(self.remote, frame.message)
        return frame if rewritten is not None else None

    def copy_state(self, person_capable: bool) -> dict[str, Any] | None:
        """The engine's ``HostConfig.copy_state``: what this guest is told of its copy in
        ``_session_proof`` (specs/copies.md §5). A pinned device key → its name's state,
        its ``until`` bounded by the pin's own end; an unpinned key that advertised a person
        chain → None while some person pin here holds a copy grant (its person, and so its
        grants, is only known at ``_session_ready``: say nothing rather than end a copy it
        holds), else not granted; any other key is anonymous (never granted)."""
        visit = self.visit
        pinned = visit.pinned if visit is not None else None
        try:
            if pinned is None and person_capable:
                # its person may be a person pin with a grant (known only at _session_ready):
                # say nothing then; when no person pin here holds one, nothing can be granted
                # to it — a removed pin's copy ends at this handshake (issue 42 item 3)
                registry = getattr(visit, "registry", None)
                persons = [r.name for r in registry.peers.values() if r.devices] if registry is not None else None
                if persons is None or any((self.answering.copy_state(n) or {}).get("granted") for n in persons):
                    return None
                return self.answering.copy_state(None)
            state = self.answering.copy_state(pinned.name if pinned is not None else None)
            if state is not None and pinned is not None and pinned.until is not None and state.get("granted"):
                from node.common.grants import until_time  # the pin's own end bounds the copy's

                if state.get("until") is None or until_time(pinned.until) < until_time(state["until"]):
                    state = {**state, "until": pinned.until}
            return state
        except Exception:  # noqa: BLE001 - the handshake never fails for it: say nothing
            logging.getLogger("kith.copies").warning("the copy state for a guest could not be decided")
            return None

    def make_context(self, ev: SessionReady) -> HookContext:
        """The session is ready: record its proof and nonce, tell the table and the
        owner, and build the hooks' context with the peer's knowledge handle."""
        visit = self.visit
        assert visit is not None  # admitted at the door before the engine was built
        registry = visit.registry
        pin = visit.pin  # a person pin's grants (specs/peers.md §10), or None
        grant_key = pin.public_key if pin else ev.peer_public_key  # quota, approvals: one per person
        rec = registry.merge_profile(grant_key, ev.peer_profile) or registry.by_key(grant_key)
        name = rec.name if rec else None
        code = self.setup.pairing_code(ev.peer_public_key)
        pid = ev.peer_person  # the verified binding chain's PersonIdentity, or None (v1 guest)
        used_up = self.table.session_ready(self.token, ev.session_id, code)  # its person: at admit_person
        self.table.succeeded(self.remote)
        post = ev.proof.get("post_id", "")
        self.posts.used(post)  # kept at once: a restart goes on counting (file mode)
        for nonce in self.held:  # a proof signed by both sides exists now: remember it
            self.nonces.commit(post, nonce, self.posts.expires_at(post) or self.clock.time() + self.setup.ttl_s)
        self.held.clear()
        keeper = self.posts.keeper
        if keeper is not None:  # the guest may have joined by file: record the proof here
            keeper.record_proof(ev.proof, used_up=used_up)
        self.tap.ready(ev.session_id, name)
        self.session_id = ev.session_id
        self.peer_name = name
        if pin is not None and pid is not None and note_device(registry, pin, pid.device, pid.device_name):
            self.emit(PersonDeviceNew(peer_name=pin.name, person=pin.public_key, device=pid.device,
                                      device_name=pid.device_name).to_dict())
        self.emit(SessionStarted(session_id=ev.session_id, peer=ev.peer_public_key, peer_name=name, post_id=post,
                                 pairing_code=code, person=pid.person if pid else None,
                                 device_name=pid.device_name if pid else None, via_person=pin is not None,
                                 path=EventPath.of(self.path)).to_dict())
        token, table = self.token, self.table
        return HookContext(role="host", session_id=ev.session_id,
                           peer=PeerInfo(ev.peer_public_key, name, ev.peer_profile,
                                         person=pid.person if pid else None,
                                         device_name=pid.device_name if pid else None),
                           options=dict(self.setup.hook_options),
                           knowledge=ActivityTracked(self.answering.knowledge_for(name, grant_key),
                                                     lambda: table.begin_query(token),
                                                     lambda status: table.activity(token, status),
                                                     self.tap.answered),
                           logger=logging.getLogger("kith.hooks." + self.setup.spec.name))


def _person_record(pid: Any) -> dict[str, Any] | None:
    """The session table's record of a verified ``PersonIdentity`` (``{"key", "deviceName",
    "earlier"}``), or None for a guest without a chain."""
    return None if pid is None else {"key": pid.person, "deviceName": pid.device_name, "earlier": list(pid.earlier)}


__all__ = ["Answering", "Connection", "FIRST_STREAM_TIMEOUT_S", "SessionSetup", "Wiring"]
