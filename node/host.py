"""The Host role: bind iroh, publish (or write) an invitation, serve guests until cancelled.

``serve_host`` is transport orchestration only; every protocol rule lives in the engine,
every content rule in the knowledge handle and egress gate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio

from node.driver import run_session
from node.engine.session import HostConfig, SessionEngine, SessionReady
from node.errors import KithError, SpecError
from node.home import atomic_write
from node.hooks import HookContext, PeerInfo, load_hooks
from node.identity import load_or_init_identity
from node.invitation import DEFAULT_TTL_S, Invitation, create_invitation
from node.peers import PeerRegistry, load_own_profile
from node.spec import find_protocol_dir, load_spec

log = logging.getLogger("kith.host")

MAX_CONCURRENT_SESSIONS = 64
MAX_SESSIONS_PER_PEER = 4
SHUTDOWN_GRACE_S = 10.0
#: How long an accepted connection may take to open its session stream (s). An honest
#: guest opens it within milliseconds; a silent one is closed after this.
FIRST_STREAM_TIMEOUT_S = 3.0
#: On SIGINT/SIGTERM, how long withdrawing the host's posts on the server may take (s).
WITHDRAW_TIMEOUT_S = 3.0


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
    share_ui: bool = False
    heartbeat: Any = "default"
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    watch: bool = False


class _EmptyKnowledge:
    """Stand-in handle when this home has no corpus yet: answers like an empty index."""

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        from node.corpus.envelope import empty_envelope, validate_search_request

        try:
            req = validate_search_request(request)
        except KithError:
            return {"status": "invalid-request", "envelope": empty_envelope("invalid-request", None)}
        return {"status": "no-verified-results", "envelope": empty_envelope("no-verified-results", req)}


@dataclass
class Knowledge:
    """The host's view of its corpus.

    Attributes:
        handle_for: ``(peer_name | None, peer_key)`` → a peer-scoped knowledge handle for
            ``ctx.knowledge`` (quotas and approvals are per key).
        egress_check: the gate's last check on every outgoing business frame (raises
            ``EgressRefused`` when a real root or home path is in it), or None. Called as
            ``egress_check(data, echoes)`` with the session's peer-request strings.
        close: releases the corpus.
    """

    handle_for: Callable[[str | None, str | None], Any]
    egress_check: Callable[..., None] | None
    close: Callable[[], None]


def open_knowledge(home: Path, warn: Callable[[str], None]) -> Knowledge:
    """Open the corpus read-only with its policy and gate.

    Warns (via ``warn``) when the index is empty or not ready, or when no policy rule
    shares anything (DESIGN §10).
    """
    from node.corpus.store import Corpus
    from node.policy.gate import EgressGate
    from node.policy.knowledge import KnowledgeHandle
    from node.policy.store import Policy

    policy = Policy.load(home)
    try:
        corpus = Corpus(home, readonly=True)
    except KithError as exc:
        warn(f"the index is not available ({exc.code}); guests will get no results. "
             "Run `kith index add PATH` and `kith index sync`.")
        gate = EgressGate([], policy, home)
        return Knowledge(lambda peer, key=None, echoes=None: _EmptyKnowledge(), gate.check_outgoing, lambda: None)
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
    from node.policy.approvals import Approvals
    from node.policy.quota import RateLimiter

    gate = EgressGate(corpus.roots(), policy, home, approvals=Approvals(home))
    limiter = RateLimiter()  # one per host process: a new session does not refill a bucket
    return Knowledge(lambda peer, key=None, echoes=None: KnowledgeHandle(corpus, gate, peer, peer_key=key,
                                                                        limiter=limiter, echoes=echoes),
                     gate.check_outgoing, corpus.close)


def admission(registry: PeerRegistry, peers_only: bool) -> Callable[[str, dict[str, Any]], bool]:
    """The host's ``HostConfig.admit`` (DESIGN §6, §10).

    Refuses (``peer-key-changed``) a guest whose key is not pinned but whose shared
    ``displayName`` claims a pinned name; with ``peers_only``, refuses every guest whose
    key is not in the registry (``handshake-not-admitted``).
    """
    from node.errors import HandshakeError

    def admit(key: str, profile: dict[str, Any]) -> bool:
        if registry.claimed_by_other(key, profile) is not None:
            raise HandshakeError("peer-key-changed", "a pinned peer name with a different key")
        return not peers_only or registry.by_key(key) is not None

    return admit


async def serve_host(home: Path, opts: HostOptions, *, on_invitation: Callable[[dict[str, Any]], None],
                     on_event: Callable[[dict[str, Any]], None], warn: Callable[[str], None],
                     stop: anyio.Event | None = None) -> None:
    """Serve guests until ``stop`` is set (or until cancelled).

    On ``stop`` (the CLI sets it on SIGINT/SIGTERM): no new connection is accepted, every
    live session ends cleanly after its current hook (the protocol's terminal ``end``, or
    ``_error session-shutdown``), sessions still running after ``opts.shutdown_grace_s``
    are cancelled, and the endpoint is closed under a timeout (DESIGN §3). Each guest
    nonce is committed to ``<home>/seen-nonces.sqlite`` before the proof is sent
    (:class:`node.seen_nonces.SeenNonces`), so replay protection survives restarts.
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

    Raises:
        KithError: protocol not found/invalid, bind failure, server refusal.
    """
    from node.transport.iroh import bind_node

    identity = load_or_init_identity(home)
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
        from node.ui_artifacts import load_bundle

        ui_bundle = load_bundle(pdir)
    from node.seen_nonces import SeenNonces

    seen_nonces = SeenNonces(home)
    active: dict[str, int] = {}  # peer key -> live sessions
    # connections accepted whose stream is not open yet, oldest first: token -> (conn, scope)
    pending: dict[int, tuple[Any, anyio.CancelScope]] = {}
    session_stop = anyio.Event()
    watcher = None
    live: dict[str, str] = {}  # post_id -> protocol_id of the posts guests may join
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
            on_invitation(inv.to_dict())
            live[inv.post_id] = spec.protocol_id
            keeper = None
            if opts.server_url:  # republish a consumed/expired post; close ended sessions
                from node.community.keeper import PostKeeper

                emit_event = on_event

                def republished(previous: str, reason: str, fresh: Invitation) -> None:
                    live.pop(previous, None)  # a consumed/expired post is not joinable here either
                    live[fresh.post_id] = spec.protocol_id
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
            # post_id -> sessions admitted (reserved at _session_init, kept once ready)
            claimed: dict[str, int] = {}

            async def refuse(stream: Any, code: str) -> None:
                engine = SessionEngine("host", spec, public_key=identity.public_key, sign=identity.sign,
                                       host=HostConfig(remote_id="", post_protocol=lambda _p: None,
                                                       nonce_unseen=lambda _n: False))
                engine.abort(code)
                with anyio.move_on_after(2):
                    try:
                        await stream.send(engine.data_to_send())
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
                    pending.pop(token, None)
                if stream is None:
                    _close_quietly(conn, b"no-stream")
                    return
                remote = stream.remote_id or ""
                if session_stop.is_set():
                    await refuse(stream, "session-shutdown")
                    return
                if sum(active.values()) >= opts.max_sessions and not evict_oldest_handshake():
                    await refuse(stream, "handshake-host-busy")
                    return
                if active.get(remote, 0) >= opts.max_sessions_per_peer:
                    await refuse(stream, "handshake-peer-busy")
                    return
                active[remote] = active.get(remote, 0) + 1
                reserved: list[str] = []  # the post this connection's _session_init took a slot of
                ready = [False]

                def post_protocol(post_id: str) -> str | None:
                    protocol = live.get(post_id)
                    if protocol is None or reserved:
                        return None
                    if opts.post_max_sessions is not None and claimed.get(post_id, 0) >= opts.post_max_sessions:
                        return None  # used up here: the host enforces max_sessions itself, not only the server
                    claimed[post_id] = claimed.get(post_id, 0) + 1  # reserved now, released if never ready
                    reserved.append(post_id)
                    return protocol

                def nonce_unseen(nonce: str) -> bool:
                    post_id = reserved[0] if reserved else ""
                    return seen_nonces.record(post_id, nonce, expiry.get(post_id) or _now() + opts.ttl_s)

                try:
                    registry = PeerRegistry.load(home)  # re-read: `kith peers` may have changed it
                    admit = admission(registry, opts.peers_only)
                    echoes: set[bytes] = set()  # the peer's own request strings (not a leak when echoed)
                    check = knowledge.egress_check
                    engine = SessionEngine(
                        "host", spec, public_key=identity.public_key, sign=identity.sign,
                        host=HostConfig(remote_id=remote, post_protocol=post_protocol, nonce_unseen=nonce_unseen,
                                        admit=admit, profile=own_profile, ui_bundle=ui_bundle),
                        egress_check=(lambda data: check(data, echoes)) if check is not None else None)
                    session_scope = anyio.CancelScope()
                    handshaking[token] = (engine, session_scope, remote)

                    def make_context(ev: SessionReady) -> HookContext:
                        rec = registry.merge_profile(ev.peer_public_key, ev.peer_profile) or \
                            registry.by_key(ev.peer_public_key)
                        name = rec.name if rec else None
                        ready[0] = True
                        handshaking.pop(token, None)
                        post = ev.proof.get("post_id", "")
                        if keeper is not None:  # the guest may have joined by file: record the proof here
                            used_up = opts.post_max_sessions is not None and \
                                claimed.get(post, 0) >= opts.post_max_sessions
                            keeper.record_proof(ev.proof, used_up=used_up)
                        on_event({"event": "session-started", "session_id": ev.session_id,
                                  "peer": ev.peer_public_key, "peer_name": name})
                        return HookContext(role="host", session_id=ev.session_id,
                                           peer=PeerInfo(ev.peer_public_key, name, ev.peer_profile),
                                           knowledge=knowledge.handle_for(name, ev.peer_public_key, echoes),
                                           logger=logging.getLogger("kith.hooks." + spec.name))

                    with session_scope:  # cancelled when evicted while still in the handshake
                        outcome = await run_session(stream, engine, hooks, make_context=make_context,
                                                    heartbeat=opts.heartbeat, stop=session_stop)
                    if session_scope.cancelled_caught:
                        return  # evicted: reported as session-refused already
                    ended: dict[str, Any] = {"event": "session-ended", "session_id": outcome.session_id,
                                             "peer": remote, "reason": outcome.reason, "code": outcome.code,
                                             "ended_at": outcome.ended_at}
                    if engine.ui_bytes_sent:
                        ended["ui_bytes_sent"] = engine.ui_bytes_sent
                    on_event(ended)
                finally:
                    handshaking.pop(token, None)
                    active[remote] -= 1
                    if not active[remote]:
                        del active[remote]
                    if reserved and not ready[0]:  # admitted, but the session never became ready
                        claimed[reserved[0]] -= 1

            # sessions still in the handshake, oldest first: token -> (engine, scope, peer key)
            handshaking: dict[int, tuple[SessionEngine, anyio.CancelScope, str]] = {}

            def evict_oldest_handshake() -> bool:
                """Every session slot is taken: end the oldest session still in its handshake
                (an honest one takes milliseconds) with ``handshake-host-busy``. False: all
                slots hold ready sessions."""
                while handshaking:
                    oldest = next(iter(handshaking))
                    engine, scope, peer = handshaking.pop(oldest)
                    if engine.closed:
                        continue
                    engine.abort("handshake-host-busy", "evicted: the host is full and this handshake is the oldest")
                    scope.cancel()  # run_session's cleanup still sends the queued _session_reject
                    on_event({"event": "session-refused", "peer": peer, "code": "handshake-host-busy",
                              "reason": "evicted"})
                    return True
                return False

            async def accept_loop(tg: Any) -> None:
                token = 0
                async with node.connections() as incoming:  # QUIC handshakes complete concurrently
                    async for conn in incoming:
                        if len(pending) >= opts.max_sessions:  # evict the oldest connection without a stream
                            oldest = next(iter(pending))
                            old_conn, old_scope = pending.pop(oldest)
                            old_scope.cancel()
                            _close_quietly(old_conn, b"handshake-host-busy")
                            on_event({"event": "session-refused", "peer": _remote_of(old_conn),
                                      "code": "handshake-host-busy", "reason": "evicted"})
                        token += 1
                        scope = anyio.CancelScope()
                        pending[token] = (conn, scope)
                        tg.start_soon(serve_connection, conn, token, scope)

            async def stop_watch(accepting: anyio.CancelScope) -> None:
                assert stop is not None
                await stop.wait()
                accepting.cancel()

            async with anyio.create_task_group() as tg:
                if keeper is not None:
                    tg.start_soon(keeper.run)
                if watcher is not None:
                    tg.start_soon(watcher.arun)
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
                    while active:
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


def _now() -> float:
    import time

    return time.time()


def _json(obj: Any) -> bytes:
    import json

    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


__all__ = ["HostOptions", "Invitation", "serve_host", "open_knowledge"]
