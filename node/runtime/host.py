"""The Host role: bind iroh, publish (or write) an invitation, serve guests until cancelled.

``serve_host`` is transport orchestration only; every protocol rule lives in the engine,
every content rule in the answer service (node/answer/service.py) and the egress gate.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio

from node.runtime.admission import EVICT_IDLE_AFTER_S, FAILURE_COOLDOWN_S, MAX_CONCURRENT_SESSIONS, \
    MAX_FAILED_HANDSHAKES, MAX_SESSIONS_PER_PEER, ActivityTracked, Admission, AdmissionLimits, admission
from node.runtime.driver import run_session
from node.engine.session import HostConfig, SessionEngine, SessionReady
from node.common.errors import ConfigError, HandshakeError, KithError, SpecError
from node.common.home import acquire_owner_lock, atomic_write, lock_owner, release_owner_lock
from node.runtime.hooks import HookContext, PeerInfo, load_hooks
from node.trust.identity import load_identity
from node.trust.invitation import DEFAULT_TTL_S, Invitation, create_invitation
from node.trust.peers import PeerRegistry, load_own_profile
from node.protocol.spec import find_protocol_dir, load_spec

log = logging.getLogger("kith.host")

SHUTDOWN_GRACE_S = 10.0
#: How long an accepted connection may take to open its session stream (s). An honest
#: guest opens it within milliseconds; a silent one is closed after this.
FIRST_STREAM_TIMEOUT_S = 3.0
#: On SIGINT/SIGTERM, how long withdrawing the host's posts on the server may take (s).
WITHDRAW_TIMEOUT_S = 3.0
#: The lock a serving ``kith host`` holds in its home (a second one gets ``home-in-use``).
HOST_LOCK_FILE = "host.lock"
#: Expired-and-republished post ids remembered to answer ``handshake-post-expired``.
MAX_EXPIRED_POSTS = 1024


@dataclass
class HostOptions:
    """How to host.

    Attributes:
        protocol: protocol name (looked up in ``<home>/protocols`` then the bundled ones).
        server_url: community server to publish to, or None.
        invite_file: where to write the invitation in file mode (no server), or None.
        local: iroh local mode (relay disabled, loopback, offline).
        ttl_s: invitation lifetime in seconds.
        message / tags: shown to guests browsing invitations.
        max_sessions: concurrent sessions served at once.
        post_max_sessions: the invitation's ``max_sessions`` — sessions the community
            server records for one ``post_id`` (1 = single-use); None = unlimited. With a
            server, a consumed or expired post is republished under a new ``post_id``
            (a ``republished`` event; :class:`node.community.keeper.PostKeeper`).
        peers_only: admit only guests whose key is in the peer registry (``--peers-only``).
        max_sessions_per_peer: concurrent sessions of one peer key (more →
            ``handshake-peer-busy``; more than ``max_sessions`` → ``handshake-host-busy``).
        anonymous_sessions: session slots anonymous peers (keys not in the registry) may
            hold together (``--anonymous-slots``); None = 3/4 of ``max_sessions``.
        evict_idle_after_s: a READY anonymous session that answered no query for this
            long (s) may be evicted (``session-evicted``) for a newcomer
            (``--evict-idle-after``); :class:`node.runtime.admission.Admission`.
        max_failed_handshakes / failure_cooldown_s: after that many failed handshakes a
            key is refused for that long (``handshake-too-many-failures``); a single-use
            or file-mode post with that many failures from any keys is retired
            (``--max-failed-handshakes``, ``--failure-cooldown``).
        audit_queries: record query text in ``<home>/audit.jsonl`` instead of its keyed
            hash (``--audit-queries``; node/trust/audit_log.py).
        share_ui: offer the protocol's ``ui/`` bundle to guests that advertise
            ``p2p_ui_v1`` (``--share-ui``, DESIGN §6).
        heartbeat: ``(ping_interval_s, unresponsive_s)``, or ``"default"`` (10, 30).
        shutdown_grace_s: on stop, how long live sessions get to end cleanly (s).
        watch: re-index the corpus live while hosting (``--watch``); the host then holds
            the index writer lock (DESIGN §9) and emits ``index-updated`` events.
    """

    protocol: str = "knowledge-query"
    server_url: str | None = None
    invite_file: Path | None = None
    local: bool = False
    ttl_s: int = DEFAULT_TTL_S
    message: str | None = None
    tags: list[str] = field(default_factory=list)
    max_sessions: int = MAX_CONCURRENT_SESSIONS
    post_max_sessions: int | None = None
    peers_only: bool = False
    max_sessions_per_peer: int = MAX_SESSIONS_PER_PEER
    anonymous_sessions: int | None = None
    evict_idle_after_s: float = EVICT_IDLE_AFTER_S
    max_failed_handshakes: int = MAX_FAILED_HANDSHAKES
    failure_cooldown_s: float = FAILURE_COOLDOWN_S
    audit_queries: bool = False
    share_ui: bool = False
    heartbeat: Any = "default"
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    watch: bool = False


@dataclass
class Knowledge:
    """The host's view of its corpus.

    Attributes:
        handle_for: ``(peer_name | None, peer_key)`` → the peer's ``ctx.knowledge``
            (:class:`node.answer.service.Knowledge`; quotas and approvals are per key).
        egress_check: the gate seam every outgoing business frame passes once, as a
            :class:`node.engine.session.OutgoingFrame` (message + its bytes + the peer
            message it answers): :meth:`node.policy.gate.EgressGate.check_frame`, raises
            ``EgressRefused`` when a real root or home path is in the bytes.
        close: releases the corpus.
        service: the :class:`node.answer.service.AnswerService` behind ``handle_for``.
        quota_left: ``(peer_name | None, peer_key)`` → ``{"queries", "burst",
            "queriesPerHour"}``: what that peer may still ask now under the current policy
            (nothing is taken; specs/control.md).
        index: ``()`` → ``{"ready", "warmed", "roots", "documents", "chunks"}`` (reads the
            corpus; call it from a worker thread).
    """

    handle_for: Callable[[str | None, str | None], Any]
    egress_check: Callable[[Any], None] | None
    close: Callable[[], None]
    service: Any = None
    quota_left: Callable[[str | None, str], dict[str, Any]] | None = None
    index: Callable[[], dict[str, Any]] = lambda: {"ready": False, "warmed": False, "roots": [],
                                                   "documents": 0, "chunks": 0}


def open_knowledge(home: Path, warn: Callable[[str], None]) -> Knowledge:
    """Open the corpus read-only with its policy and gate, behind one
    :class:`node.answer.service.AnswerService` (a home without a corpus answers every
    query ``index-unavailable``).

    Warns (via ``warn``) when the index is empty or not ready, or when no policy rule
    shares anything (DESIGN §10).
    """
    from node.answer.service import AnswerService, PeerView
    from node.corpus.store import Corpus
    from node.policy.approvals import Approvals
    from node.policy.gate import EgressGate
    from node.policy.quota import RateLimiter
    from node.policy.store import Policy

    policy = Policy.load(home)
    # one per host process, kept in <home>/quota.sqlite: neither a new session nor a restart refills a bucket
    limiter = RateLimiter.persistent(home)
    try:
        corpus = Corpus(home, readonly=True)
    except KithError as exc:
        warn(f"the index is not available ({exc.code}); guests will get no results. "
             "Run `kith index add PATH` and `kith index sync`.")
        gate = EgressGate([], policy, home)
        service = AnswerService(None, gate, limiter=limiter)
        return Knowledge(lambda peer, key=None: service.knowledge_for(PeerView(peer, key)),
                         gate.check_frame, limiter.close, service, _quota_left(gate, limiter))
    # a crash between SQLite and tantivy leaves the index behind its record: catch up now
    # when no other process is writing (never waits for the lock)
    if corpus.repair_lag() == "locked":
        warn("the index is behind its record and another process is writing it; "
             "guests may miss documents until that sync finishes.")
    stats = corpus.stats()
    if not stats.get("chunks"):
        warn("the index is empty; guests will get no results. Run `kith index add PATH` and `kith index sync`.")
    elif stats.get("failed"):
        warn(f"{stats['failed']} document(s) failed to index; see `kith index status`.")
    if not policy.rules:
        warn("no policy rules: everything is private and guests will get no results. "
             "Share with e.g. `kith policy set '/<root>/**' public`.")
    gate = EgressGate(corpus.roots(), policy, home, approvals=Approvals(home))
    service = AnswerService(corpus, gate, limiter=limiter)
    warmed = _warm_in_background(service)

    def close() -> None:
        corpus.close()
        limiter.close()

    def index() -> dict[str, Any]:
        now = corpus.stats()
        return {"ready": bool(now.get("ready")) and warmed.is_set(), "warmed": warmed.is_set(),
                "roots": [f"/{r.prefix}/" for r in corpus.roots()],
                "documents": now.get("documents", 0), "chunks": now.get("chunks", 0)}

    return Knowledge(lambda peer, key=None: service.knowledge_for(PeerView(peer, key)),
                     gate.check_frame, close, service, _quota_left(gate, limiter), index)


def _quota_left(gate: Any, limiter: Any) -> Callable[[str | None, str], dict[str, Any]]:
    """:attr:`Knowledge.quota_left` for ``gate``'s current policy and the host's limiter."""

    def left(name: str | None, key: str) -> dict[str, Any]:
        policy = gate.current_policy()
        quota = policy.quota_for(name)
        shared = policy.anonymous_quota() if name is None else None
        return {"queries": limiter.left(key, quota, shared), "burst": quota.burst,
                "queriesPerHour": quota.queries_per_hour}

    return left


async def serve_host(home: Path, opts: HostOptions, *, on_invitation: Callable[[dict[str, Any]], None],
                     on_event: Callable[[dict[str, Any]], None], warn: Callable[[str], None],
                     stop: anyio.Event | None = None) -> None:
    """Serve guests until ``stop`` is set (or until cancelled).

    On ``stop`` (the CLI sets it on SIGINT/SIGTERM): no new connection is accepted, every
    live session ends cleanly after its current hook (the protocol's terminal ``end``, or
    ``_error session-shutdown``), sessions still running after ``opts.shutdown_grace_s``
    are cancelled, and the endpoint is closed under a timeout (DESIGN §3). Each guest
    nonce is reserved when its ``_session_init`` is read and committed to
    ``<home>/seen-nonces.sqlite`` once the session is ready
    (:class:`node.trust.seen_nonces.SeenNonces`, purged every minute), so replay
    protection survives restarts and the table stays bounded.
    Concurrency is bounded overall (``opts.max_sessions``) and per peer key
    (``opts.max_sessions_per_peer``); a guest over a bound gets ``_session_reject``
    ``handshake-host-busy`` / ``handshake-peer-busy`` at once. Connections that have not
    opened their stream yet are bounded too (``opts.max_sessions`` of them, each for at
    most :data:`FIRST_STREAM_TIMEOUT_S`): when that pool is full the *oldest* is closed
    (QUIC reason ``handshake-host-busy``; a ``session-refused`` event with ``reason``
    ``evicted``), so idle connections cannot lock honest guests out. Likewise, when every
    session slot is taken, the oldest session still in its handshake is ended with
    ``handshake-host-busy`` to make room before a new guest is refused.

    A post with ``opts.post_max_sessions`` admits that many handshakes: a slot is reserved
    when ``_session_init`` is accepted and given back if that session never becomes
    ready, so concurrent handshakes cannot overshoot it. With a server, the host records
    each session proof itself (a guest that joined by file records nothing) and, once a
    post is used up here, the :class:`node.community.keeper.PostKeeper` republishes it;
    on stop the host's posts are withdrawn (bounded by :data:`WITHDRAW_TIMEOUT_S`).

    Args:
        on_invitation: called once with the published/written invitation dict.
        on_event: called with one dict per session event (``session-started``,
            ``session-ended`` with ``reason``/``code``, ``session-refused`` with ``code``
            and, for an evicted idle connection or stalled handshake, ``reason: "evicted"``).
        warn: prints a warning for the owner (stderr).
        stop: set it to shut down cleanly.

    One ``kith host`` serves a home at a time: it holds ``<home>/host.lock`` (``flock``,
    naming its pid) while serving. While it serves, its owner's control channel listens on
    ``<home>/run/control.sock`` (live sessions, posts, index readiness, approvals; ending a
    session with ``session-ended-by-owner``): :mod:`node.runtime.control`, specs/control.md;
    ``on_invitation`` is called once that channel answers.

    Raises:
        KithError: ``home-in-use`` (another process serves this home), ``control-dir-unsafe``
            (``<home>/run`` is not a 0700 folder of this user), protocol not
            found/invalid, bind failure, server refusal.
    """
    identity = load_identity(home)  # never created here: a typo in --home is refused
    host_lock = acquire_owner_lock(home / HOST_LOCK_FILE, "kith host")
    if host_lock is None:
        raise ConfigError("home-in-use", f"Another `kith host` is serving this home ({lock_owner(home / HOST_LOCK_FILE)}).",
                          hint="Stop it first, or host from another home (--home DIR).")
    try:
        await _serve(home, opts, identity, on_invitation=on_invitation, on_event=on_event, warn=warn, stop=stop)
    finally:
        release_owner_lock(host_lock)


async def _serve(home: Path, opts: HostOptions, identity: Any, *, on_invitation: Callable[[dict[str, Any]], None],
                 on_event: Callable[[dict[str, Any]], None], warn: Callable[[str], None],
                 stop: anyio.Event | None) -> None:
    """:func:`serve_host` once this process holds the home's host lock."""
    from node.transport.iroh import bind_node

    started_at = _now()
    from node.runtime.control import check_run_dir, control_socket_path

    check_run_dir(control_socket_path(home).parent, create=True)  # control-dir-unsafe before publishing
    pdir = find_protocol_dir(opts.protocol, home)
    if pdir is None:
        raise SpecError("protocol-not-found", f"no protocol named {opts.protocol!r}")
    spec = load_spec(pdir)
    hooks = load_hooks(pdir)
    knowledge = open_knowledge(home, warn)
    PeerRegistry.load(home)  # a broken registry fails here, before binding
    own_profile = load_own_profile(home)
    ui_bundle = None
    if opts.share_ui:
        from node.runtime.ui_artifacts import load_bundle

        ui_bundle = load_bundle(pdir)
    from node.trust.seen_nonces import SeenNonces

    seen_nonces = SeenNonces(home)
    # audit log and live revocation (issue 11: node/runtime/audit.py, revocation.py)
    from node.runtime.audit import HostAudit
    from node.trust.audit_log import AuditLog
    from node.runtime.revocation import LiveSessions, PeersWatcher
    from node.trust.pairing import pairing_code

    audit = HostAudit(AuditLog(home, audit_queries=opts.audit_queries))
    on_event = audit.observe(on_event)
    hooks = audit.wrap_hooks(hooks)
    live_sessions = LiveSessions()
    peers_watcher = PeersWatcher(home, live_sessions, on_event=on_event)
    session_stop = anyio.Event()
    watcher = None
    live: dict[str, str] = {}  # post_id -> protocol_id of the posts guests may join
    expired_posts: set[str] = set()  # posts that expired and were republished (bounded)
    withdrawn = [not opts.server_url]  # the posts were withdrawn on stop (or there is no server)

    async def withdraw_posts() -> None:
        """Withdraw this host's posts on the server, bounded; failures are only logged."""
        if withdrawn[0]:
            return
        withdrawn[0] = True
        from node.community.keeper import withdraw_posts as withdraw

        assert opts.server_url is not None
        await withdraw(opts.server_url, identity, list(live), timeout_s=WITHDRAW_TIMEOUT_S)

    try:
        if opts.watch:  # take the index writer before publishing: index-locked fails fast
            from node.corpus.watch import host_watcher

            watcher = await anyio.to_thread.run_sync(host_watcher, home, on_event, warn)
        async with bind_node(identity.secret, spec.alpn, local=opts.local) as node:
            if not await node.wait_online():
                warn("the iroh endpoint is not online yet (no relay); guests may not reach it")
            def new_invitation() -> Invitation:
                return create_invitation(identity, protocol_name=spec.name, protocol_version=spec.version,
                                         protocol_id=spec.protocol_id, ticket=node.ticket(), ttl_s=opts.ttl_s,
                                         message=opts.message, tags=opts.tags,
                                         max_sessions=opts.post_max_sessions)

            inv = new_invitation()
            if opts.server_url:
                from node.community.client import CommunityClient

                async with CommunityClient(opts.server_url, identity) as client:
                    inv = await client.publish_invitation(inv)
            if opts.invite_file is not None:
                atomic_write(Path(opts.invite_file), _json(inv.to_dict()), mode=0o644)
            live[inv.post_id] = spec.protocol_id
            keeper = None
            if opts.server_url:  # republish a consumed/expired post; close ended sessions
                from node.community.keeper import PostKeeper

                emit_event = on_event

                def republished(previous: str, reason: str, fresh: Invitation) -> None:
                    live.pop(previous, None)  # a consumed/expired post is not joinable here either
                    if reason == "expired" and len(expired_posts) < MAX_EXPIRED_POSTS:
                        expired_posts.add(previous)  # still refused as expired, not as unknown
                    live[fresh.post_id] = spec.protocol_id
                    expiry[fresh.post_id] = _unix(fresh.expires_at)
                    if opts.invite_file is not None:
                        atomic_write(Path(opts.invite_file), _json(fresh.to_dict()), mode=0o644)
                    emit_event({"event": "republished", "post_id": fresh.post_id, "previous_post_id": previous,
                                "reason": reason, "expires_at": fresh.expires_at})

                def noticed(ev: dict[str, Any]) -> None:  # the server's word on the post
                    if ev["event"] == "post-renewed":  # renewed elsewhere: follow its expiry
                        expiry[ev["post_id"]] = _unix(ev["expires_at"])
                    elif ev["event"] == "post-ended" and not ev["republish"]:
                        live.pop(ev["post_id"], None)  # withdrawn: nobody can join it
                    emit_event(ev)

                keeper = PostKeeper(opts.server_url, identity, inv, make_invitation=new_invitation,
                                    on_republished=republished, on_notice=noticed)

                def on_event(ev: dict[str, Any]) -> None:
                    emit_event(ev)
                    keeper.observe(ev)

            expiry = {inv.post_id: _unix(inv.expires_at)}
            slots = Admission(AdmissionLimits(max_sessions=opts.max_sessions,
                                              max_sessions_per_peer=opts.max_sessions_per_peer,
                                              post_max_sessions=opts.post_max_sessions,
                                              anonymous_sessions=opts.anonymous_sessions,
                                              evict_idle_after_s=opts.evict_idle_after_s,
                                              max_failures=opts.max_failed_handshakes,
                                              failure_cooldown_s=opts.failure_cooldown_s,
                                              # a public multi-use post must never be rotatable by strangers
                                              retire_on_failures=not opts.server_url or opts.post_max_sessions == 1),
                              on_event=lambda ev: on_event(ev))  # late-bound: the keeper wraps on_event

            async def refuse(stream: Any, code: str, message: str | None = None) -> None:
                if message is None:
                    engine = SessionEngine("host", spec, public_key=identity.public_key, sign=identity.sign,
                                           host=HostConfig(remote_id="", post_protocol=lambda _p: None,
                                                           nonce_unseen=lambda _n: False))
                    engine.abort(code)
                    data = engine.data_to_send()
                else:  # a refusal whose peer message carries a number (the cool-down left)
                    data = _reject_frame(code, message)
                with anyio.move_on_after(2):
                    try:
                        await stream.send(data)
                    except KithError:
                        pass
                    await stream.aclose()
                on_event({"event": "session-refused", "peer": stream.remote_id, "code": code})

            async def serve_connection(conn: Any, token: int, scope: anyio.CancelScope) -> None:
                stream = None
                try:
                    with scope:  # cancelled when evicted from the pending pool
                        stream = await node.accept_stream(conn, timeout_s=FIRST_STREAM_TIMEOUT_S)
                except KithError:
                    pass
                finally:
                    slots.connection_done(token)
                if stream is None:
                    _close_quietly(conn, b"no-stream")
                    return
                remote = stream.remote_id or ""
                if session_stop.is_set():
                    await refuse(stream, "session-shutdown")
                    return
                session_scope = anyio.CancelScope()
                engine_cell: list[SessionEngine] = []

                def end(code: str, message: str) -> None:
                    # evicted (or revoked): run_session's cleanup still sends the queued
                    # _session_reject (in the handshake) or _error (once ready)
                    if engine_cell and not engine_cell[0].closed:
                        engine_cell[0].abort(code, message or None)
                    session_scope.cancel()

                registry = peers_watcher.current()  # re-read: `kith peers` may have changed it
                refusal = slots.open_session(token, remote, end,
                                             alive=lambda: not (engine_cell and engine_cell[0].closed),
                                             anonymous=registry.by_key(remote) is None)
                if refusal == "handshake-too-many-failures":
                    left = max(1, math.ceil(slots.cooldown_left(remote)))
                    await refuse(stream, refusal, f"Too many failed handshakes from this key; try again in {left} s.")
                    return
                if refusal is not None:
                    await refuse(stream, refusal)
                    return
                named: list[str] = []  # the live post this connection's _session_init named

                def named_post(post_id: str) -> None:
                    if post_id in live and not slots.retired(post_id):
                        named.append(post_id)

                def post_protocol(post_id: str) -> str | None:
                    protocol = live.get(post_id)
                    if protocol is None and post_id in expired_posts:  # expired, then republished
                        raise HandshakeError("handshake-post-expired", "the invitation expired on this host")
                    if protocol is None or slots.retired(post_id):
                        return None
                    if expiry.get(post_id, math.inf) <= _now():
                        raise HandshakeError("handshake-post-expired", "the invitation expired on this host")
                    if not slots.claim_post(token, post_id):
                        return None
                    return protocol

                held: set[str] = set()  # the guest nonce this handshake reserved

                def nonce_unseen(nonce: str) -> bool:
                    if not seen_nonces.reserve(nonce):  # recorded for good once the session is ready
                        return False
                    held.add(nonce)
                    return True

                try:
                    admit = admission(registry, opts.peers_only)
                    check = knowledge.egress_check
                    tap = audit.tap(remote)  # records the results frames queued to send (audit log)

                    def egress(frame: Any) -> None:  # frame: node.engine.session.OutgoingFrame
                        if check is not None:
                            check(frame)  # the gate seam (EgressGate.check_frame): scans frame.data
                        tap.outgoing(frame)  # records from frame.message: nothing is decoded again

                    engine = SessionEngine(
                        "host", spec, public_key=identity.public_key, sign=identity.sign,
                        host=HostConfig(remote_id=remote, post_protocol=post_protocol, nonce_unseen=nonce_unseen,
                                        admit=admit, profile=own_profile, ui_bundle=ui_bundle,
                                        named_post=named_post),
                        egress_check=egress)
                    engine_cell.append(engine)
                    admitted = registry.by_key(remote)  # revocable until the session ends
                    live_sessions.add(token, engine, session_scope, remote, admitted.name if admitted else None)

                    def make_context(ev: SessionReady) -> HookContext:
                        rec = registry.merge_profile(ev.peer_public_key, ev.peer_profile) or \
                            registry.by_key(ev.peer_public_key)
                        name = rec.name if rec else None
                        used_up = slots.session_ready(token)
                        slots.succeeded(remote)
                        post = ev.proof.get("post_id", "")
                        for nonce in held:  # a proof signed by both sides exists now: remember it
                            seen_nonces.commit(post, nonce, expiry.get(post) or _now() + opts.ttl_s)
                        held.clear()
                        if keeper is not None:  # the guest may have joined by file: record the proof here
                            keeper.record_proof(ev.proof, used_up=used_up)
                        code = pairing_code(identity.public_key, ev.peer_public_key)
                        live_sessions.ready(token, ev.session_id, code)
                        tap.ready(ev.session_id, name)
                        on_event({"event": "session-started", "session_id": ev.session_id,
                                  "peer": ev.peer_public_key, "peer_name": name, "post_id": post,
                                  "pairing_code": code})
                        return HookContext(role="host", session_id=ev.session_id,
                                           peer=PeerInfo(ev.peer_public_key, name, ev.peer_profile),
                                           knowledge=ActivityTracked(
                                               knowledge.handle_for(name, ev.peer_public_key),
                                               lambda: slots.note_activity(token),
                                               lambda status: live_sessions.count(token, status)),
                                           logger=logging.getLogger("kith.hooks." + spec.name))

                    with session_scope:  # cancelled when evicted while still in the handshake
                        outcome = await run_session(stream, engine, hooks, make_context=make_context,
                                                    heartbeat=opts.heartbeat, stop=session_stop)
                    if session_scope.cancelled_caught:
                        revoked = live_sessions.revoked_outcome(token)  # `kith peers remove|block`
                        if revoked is not None:
                            outcome = revoked
                        else:
                            cut = engine.close_event
                            if cut is None or cut.reason != "aborted":
                                return  # evicted in the handshake: reported as session-refused already
                            # ended from outside once ready (session-evicted)
                            on_event({"event": "session-ended", "session_id": engine.session_id, "peer": remote,
                                      "reason": cut.reason, "code": cut.code, "ended_at": _now()})
                            return
                    if named and outcome.session_id is None:  # named a live post, never became ready
                        failed_post(remote, named[0], outcome.code or "")
                    ended: dict[str, Any] = {"event": "session-ended", "session_id": outcome.session_id,
                                             "peer": remote, "reason": outcome.reason, "code": outcome.code,
                                             "ended_at": outcome.ended_at}
                    if engine.ui_bytes_sent:
                        ended["ui_bytes_sent"] = engine.ui_bytes_sent
                    on_event(ended)
                finally:
                    slots.close_session(token)
                    live_sessions.discard(token)
                    for nonce in held:
                        seen_nonces.release(nonce)

            def failed_post(peer: str, post_id: str, code: str) -> None:
                """Count a failed handshake; retire the post when it collected too many."""
                retired = slots.record_failure(peer, post_id, code)
                if retired is None:
                    return
                live.pop(retired, None)
                on_event({"event": "post-retired", "post_id": retired, "reason": "too-many-failures"})
                if keeper is not None:
                    keeper.replace(retired, "too-many-failures")  # withdrawn, then republished
                else:
                    warn(f"post {retired} had {opts.max_failed_handshakes} failed handshakes and is no longer "
                         "honoured; restart `kith host` for a new invitation")

            async def watch_expiry() -> None:
                """Say so when a post expires: with a server the keeper republishes it; in file
                mode no new guest can join any more (refused with handshake-post-expired)."""
                told: set[str] = set()
                while True:
                    now = _now()
                    for post_id, at in list(expiry.items()):
                        if post_id in live and post_id not in told and at <= now:
                            told.add(post_id)
                            on_event({"event": "post-expired", "post_id": post_id,
                                      "expires_at": _rfc3339(at)})
                            if keeper is None and not any(expiry.get(p, 0) > now for p in live):
                                warn("the invitation expired: no new guest can join; restart `kith host` "
                                     "for a new one")
                    upcoming = [at - now for p, at in expiry.items() if p in live and p not in told]
                    await anyio.sleep(min([60.0] + [max(0.05, t) for t in upcoming]))

            async def purge_nonces() -> None:
                """Keep the seen-nonce table bounded while hosting (expired rows go)."""
                from node.trust.seen_nonces import PURGE_INTERVAL_S

                while True:
                    await anyio.sleep(PURGE_INTERVAL_S)
                    await anyio.to_thread.run_sync(seen_nonces.purge)

            async def accept_loop(tg: Any) -> None:
                token = 0
                async with node.connections() as incoming:  # QUIC handshakes complete concurrently
                    async for conn in incoming:
                        token += 1
                        scope = anyio.CancelScope()

                        def evict(conn: Any = conn, scope: anyio.CancelScope = scope) -> None:
                            scope.cancel()
                            _close_quietly(conn, b"handshake-host-busy")

                        slots.connection_arrived(token, _remote_of(conn), evict)
                        tg.start_soon(serve_connection, conn, token, scope)

            async def stop_watch(accepting: anyio.CancelScope) -> None:
                assert stop is not None
                await stop.wait()
                accepting.cancel()

            async with anyio.create_task_group() as tg:
                from node.runtime.control import HostControl, serve_control

                def posts() -> list[dict[str, Any]]:
                    return [{"postId": p, "server": opts.server_url,
                             "expiresAt": _rfc3339(expiry[p]) if p in expiry else None}
                            for p in live if not slots.retired(p)]

                # the owner's control channel (<home>/run/control.sock; node/runtime/control.py)
                await tg.start(serve_control, HostControl(home, identity, live_sessions, posts, knowledge.index,
                                                          knowledge.quota_left, started_at=started_at))
                on_invitation(inv.to_dict())  # once `kith status` can see this host
                if keeper is not None:
                    tg.start_soon(keeper.run)
                if watcher is not None:
                    tg.start_soon(watcher.arun)
                tg.start_soon(watch_expiry)
                tg.start_soon(purge_nonces)
                tg.start_soon(peers_watcher.run)  # peers.json / policy.toml by stat
                async with anyio.create_task_group() as accepting:
                    if stop is not None:
                        accepting.start_soon(stop_watch, accepting.cancel_scope)
                    await accept_loop(tg)
                    accepting.cancel_scope.cancel()
                # stopped (or the endpoint closed): sessions end cleanly, then the rest is cancelled
                session_stop.set()
                if keeper is not None:
                    keeper.retire()  # no republish from now on
                await withdraw_posts()
                with anyio.move_on_after(opts.shutdown_grace_s):
                    while slots.sessions:
                        await anyio.sleep(0.02)
                if keeper is not None:
                    keeper.stop()
                tg.cancel_scope.cancel()
    finally:
        if not withdrawn[0] and live:  # cancelled before the clean stop (a second Ctrl-C)
            with anyio.CancelScope(shield=True):
                await withdraw_posts()
        if watcher is not None:
            watcher.close()
        knowledge.close()
        seen_nonces.close()
        audit.close()


def _warm_in_background(service: Any) -> Any:
    """Build the anonymous guests' view index in a daemon thread (a peer is ranked on its
    own view, node/corpus/views.py): the first guest then does not wait for it. A failure
    (no index yet, the corpus closed by a quick stop) is only logged.

    Returns:
        A :class:`threading.Event` set once the view is built (not set if warming failed).
    """
    import threading

    from node.answer.service import PeerView

    done = threading.Event()

    def run() -> None:
        try:
            service.warm(PeerView(None, None))
        except Exception as exc:  # noqa: BLE001 - warming is an optimisation only
            log.debug("could not warm the anonymous view: %s", type(exc).__name__)
        else:
            done.set()

    threading.Thread(target=run, name="kith-warm-view", daemon=True).start()
    return done


def _close_quietly(conn: Any, reason: bytes) -> None:
    """Close an iroh connection with a QUIC application ``reason`` (a stable code)."""
    try:
        conn.close(1, reason)
    except Exception:  # noqa: BLE001 - iroh error on an already-closed connection
        pass


def _remote_of(conn: Any) -> str:
    try:
        return str(conn.remote_id())
    except Exception:  # noqa: BLE001 - iroh error on a closed connection
        return ""


def _unix(rfc3339: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return 0.0


def _rfc3339(unix: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(unix, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reject_frame(code: str, message: str) -> bytes:
    """One ``_session_reject`` frame (the engine's own encoding of it)."""
    import msgspec

    from node.engine.frames import SessionReject

    return msgspec.json.encode(SessionReject(code=code, message=message[:500])) + b"\n"


def _now() -> float:
    import time

    return time.time()


def _json(obj: Any) -> bytes:
    import json

    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


__all__ = ["HostOptions", "Invitation", "serve_host", "open_knowledge"]
