"""The Host role: bind an endpoint, publish (or write) an invitation, serve guests until stopped.

:class:`Host` builds the host's small machines once and wires them in one place: the
session table (node/host/sessions.py: who is connected), the doorkeeper
(node/host/doorkeeper.py: who may come in), the posts (node/host/posts.py: what may be
joined), one :class:`node.host.connection.Connection` per accepted connection (given its
collaborators, never the host), the audit tap, the peers watcher and the knowledge behind the
egress gate. It takes an injectable clock and endpoint, so ``kith protocol test`` and the
tests run this same host over memory pipes. :func:`serve_host` is what ``kith host`` calls.
Every protocol rule lives in the engine, every content rule in the answer service
(node/answer/service.py) and the egress gate.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio

from node.common.dbfaults import refusal_of
from node.common.errors import ConfigError, KithError, SpecError
from node.common.home import acquire_owner_lock, lock_owner, release_owner_lock, remove_owner_lock
from node.common.host_events import PostRestored, checked as checked_event
from node.engine.session import HostConfig, SessionEngine
from node.runtime.clock import SYSTEM_CLOCK, Clock, rfc3339
from node.host.connection import FIRST_STREAM_TIMEOUT_S, Answering, Connection, SessionSetup, Wiring
from node.transport.modes import RELAY_CHECK_S
from node.runtime.hooks import load_hooks
from node.host.posts import Posts
from node.host.sessions import EVICT_IDLE_AFTER_S, FAILURE_COOLDOWN_S, MAX_CONCURRENT_SESSIONS, \
    MAX_FAILED_HANDSHAKES, MAX_SESSIONS_PER_PEER, AdmissionLimits, SessionTable
from node.trust.identity import load_identity
from node.trust.invitation import DEFAULT_TTL_S, Invitation, create_invitation
from node.trust.peers import PeerRegistry, load_own_profile
from node.protocol.spec import find_protocol_dir, load_spec

log = logging.getLogger("kith.host")


class _MailSlot:
    """One mailbox connection served now (:meth:`Host._mail_connection`): its connection,
    the cancel scope that ends its task, and since when it waits for a whole request frame
    (an ordering tick; None while a frame is answered)."""

    __slots__ = ("conn", "scope", "waiting_since")

    def __init__(self, conn: Any, scope: anyio.CancelScope) -> None:
        self.conn = conn
        self.scope = scope
        self.waiting_since: int | None = None

SHUTDOWN_GRACE_S = 10.0
#: The lock a serving ``kith host`` holds in its home (a second one gets ``home-in-use``).
HOST_LOCK_FILE = "host.lock"


@dataclass
class HostOptions:
    """How to host.

    Attributes:
        protocol: protocol name (looked up in ``<home>/protocols`` then the bundled ones).
        server_url: community server to publish to, or None.
        invite_file: where to write the invitation in file mode (no server), or None.
        local: offline mode (relay disabled, loopback); used when ``transport`` is None.
        transport: the :class:`node.transport.modes.TransportMode` (``--relay``,
            ``--relay-only``, ``--lan``, ``--discovery``, ``--offline``; specs/transport.md),
            or None for ``local``'s.
        presence: ``"open"`` or ``"granted"`` (``--presence``; node/host/grants.py):
            under ``granted`` a peer holding no grant gets the unknown-post refusal.
        unlisted: publish the post unlisted (reachable by ``post_id``, absent from browse).
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
            long (s) may be evicted (``session-evicted``) for *any* newcomer
            (``--evict-idle-after``); a newcomer that holds no session yet evicts a quiet
            one at once (:meth:`node.host.sessions.SessionTable.open_session`).
        new_invitation: file mode: the posts of earlier runs (``<home>/posts.json``) are no
            longer honoured and a new invitation is signed (``--new-invitation``); without
            it they are honoured until their own expiry or use count, and the last one is
            written again when it still describes the endpoint (node/host/posts.py).
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
        protocol_dir: a protocol folder used as is instead of looking ``protocol`` up
            (``kith protocol test DIR``), or None.
        hook_options: ``ctx.options`` of the host's hooks (``host_options`` of a protocol
            test script); empty for ``kith host``.
        control: serve the owner's control channel (``<home>/run/control.sock``); off
            only for ``kith protocol test``'s throwaway home.
        sign_citations: sign a citation for each result a guest asked ``citations: true``
            for (``--sign-citations``; node/answer/citation.py). Off: such a query gets
            its results unsigned, marked ``citations: "signing-off"``. A signed answer
            cannot be denied later.
        mailbox: take the sealed questions left for this device at ``server_url``'s
            mailbox at start and every few seconds, answer each as a live one and leave the
            sealed answer (``--mailbox``; node/host/sealed_host.py, specs/sealed.md);
            this device's card says so (card format 2, in the handshake and on the server:
            one card per ``seq``, so a guest never holds two that disagree).
        holders: base URLs of holders a device of this home's person runs (``--holder``,
            ``kith host --hold-mail`` there): taken from as the server's mailbox is, and
            named in the card (specs/sealed.md §7b).
        hold_mail: ``HOST:PORT`` where this device holds mail for its person's devices
            (``--hold-mail``; :func:`node.host.sealed_host.hold_mail`), or None.
    """

    protocol: str = "knowledge-query"
    server_url: str | None = None
    invite_file: Path | None = None
    local: bool = False
    transport: Any = None
    presence: str = "open"
    unlisted: bool = False
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
    protocol_dir: Path | None = None
    hook_options: dict[str, Any] = field(default_factory=dict)
    control: bool = True
    mailbox: bool = False
    holders: list[str] = field(default_factory=list)
    hold_mail: str | None = None
    sign_citations: bool = False
    new_invitation: bool = False


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
        evidence: ``[chunk ids] → {chunk id: (content hash, char_start, char_end, stored id)}`` — what
            a signed citation needs of served chunks (:meth:`node.corpus.store.Corpus.chunk_evidence`).
        warmer: the :class:`node.host.warm.ViewWarmer` a running host starts (its
            ``pinned`` set by the host), or None without a corpus.
    """

    handle_for: Callable[[str | None, str | None], Any]
    egress_check: Callable[[Any], None] | None
    close: Callable[[], None]
    service: Any = None
    quota_left: Callable[[str | None, str], dict[str, Any]] | None = None
    index: Callable[[], dict[str, Any]] = lambda: {"ready": False, "warmed": False, "roots": [],
                                                   "documents": 0, "chunks": 0}
    evidence: Callable[[list[str]], dict[str, Any]] = lambda ids: {}
    warmer: Any = None
    #: ``()`` → ``{"rules", "groups"}`` of the policy the next query is answered under (the
    #: last good one when policy.toml became invalid meanwhile; specs/control.md)
    policy: Callable[[], dict[str, Any]] | None = None


def open_knowledge(home: Path, warn: Callable[[str], None], now: Callable[[], float] | None = None, *,
                   version_key: bytes | None = None, copy_secret: bytes | None = None) -> Knowledge:
    """Open the corpus read-only with its policy and gate, behind one
    :class:`node.answer.service.AnswerService` (a home without a corpus answers every
    query ``index-unavailable``). ``now`` (Unix s; default the wall clock) is what the
    ends of grants (``until``) are compared with. ``version_key``: the document-version
    secret the service answers ``check`` messages with
    (:func:`node.answer.citation.load_version_key`). ``copy_secret``: the host identity's
    seed, which signs the documents of copies peers may keep (node/answer/copies.py); None:
    no copies are served.

    Warns (via ``warn``) when the index is empty or not ready, or when no policy rule
    shares anything (DESIGN §10).
    """
    from node.answer.service import AnswerService, PeerView
    from node.corpus.store import Corpus
    from node.policy.approvals import Approvals
    from node.policy.gate import EgressGate
    from node.policy.quota import RateLimiter
    from node.policy.store import Policy
    from node.host.warm import ViewWarmer

    policy = Policy.load(home)
    if now is not None:
        policy.now = now
    # one per host process, kept in <home>/quota.sqlite: neither a new session nor a restart refills a bucket
    limiter = RateLimiter.persistent(home)
    try:
        corpus = Corpus(home, readonly=True)
    except KithError as exc:
        warn(f"the index is not available ({exc.code}); guests will get no results. "
             + (f"{exc.message}: {exc.hint}" if exc.hint else "Run `kith index add PATH` and `kith index sync`."))
        gate = EgressGate([], policy, home)
        service = AnswerService(None, gate, limiter=limiter, version_key=version_key)
        return Knowledge(lambda peer, key=None: service.knowledge_for(PeerView(peer, key)),
                         gate.check_frame, limiter.close, service, _quota_left(gate, limiter))
    # a crash between SQLite and tantivy leaves the index behind its record: catch up now
    # when no other process is writing (never waits for the lock)
    if corpus.repair_lag(warn) == "locked":  # also rebuilds an index of an older schema, saying so
        warn("the index is behind its record and another process is writing it; "
             "guests may miss documents until that sync finishes.")
    stats = corpus.stats()
    if stats.get("index_missing"):
        warn("the search index (corpus/tantivy) is missing; guests get index-unavailable until "
             "`kith index sync` rebuilds it from the corpus record.")
    elif not stats.get("chunks"):
        warn("the index is empty; guests will get no results. Run `kith index add PATH` and `kith index sync`.")
    elif stats.get("failed"):
        warn(f"{stats['failed']} document(s) failed to index; see `kith index status`.")
    if not policy.rules:
        warn("no policy rules: everything is private and guests will get no results. "
             "Share with e.g. `kith policy set '/<root>/**' public`.")
    gate = EgressGate(corpus.roots(), policy, home, approvals=Approvals(home))
    copier = None
    if copy_secret is not None:
        import time

        from node.answer.copies import CopyServer

        clock = now if now is not None else time.time
        copier = CopyServer(corpus, gate, home, copy_secret, lambda: rfc3339(clock()))
    service = AnswerService(corpus, gate, limiter=limiter, version_key=version_key, copier=copier)
    warmer = ViewWarmer(service, gate, corpus, lambda: [])  # run by Host.run (node/host/warm.py)

    def close() -> None:
        corpus.close()
        limiter.close()

    def index() -> dict[str, Any]:
        now = corpus.stats()
        warm = warmer.is_warm()
        return {"ready": bool(now.get("ready")) and warm, "warmed": warm,
                "roots": [f"/{r.prefix}/" for r in corpus.roots()],
                "documents": now.get("documents", 0), "chunks": now.get("chunks", 0)}

    def in_force() -> dict[str, Any]:
        now_policy = gate.current_policy()
        return {"rules": len(now_policy.rules), "groups": len(now_policy.groups)}

    return Knowledge(lambda peer, key=None: service.knowledge_for(PeerView(peer, key)),
                     gate.check_frame, close, service, _quota_left(gate, limiter), index,
                     corpus.chunk_evidence, warmer, in_force)


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
                     stop: anyio.Event | None = None, clock: Clock = SYSTEM_CLOCK,
                     on_devices_revoked: Callable[[list[str]], None] | None = None) -> None:
    """Serve guests until ``stop`` is set (or until cancelled), as one :class:`Host` over iroh.

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
    ``handshake-host-busy`` to make room before a new guest is refused, and a newcomer that
    holds no session yet evicts a quiet anonymous session at once
    (:meth:`node.host.sessions.SessionTable.open_session`).

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
        clock: the host's clock (tests pass a :class:`node.runtime.clock.ManualClock`).
        on_devices_revoked: told the keys of devices whose person revoked them, after their
            sessions ended (``kith host`` ends the copies this home keeps of them here,
            specs/copies.md §5; the host itself never touches ``copies/``), or None.

    One ``kith host`` serves a home at a time: it holds ``<home>/host.lock`` (``flock``,
    naming its pid) while serving. While it serves, its owner's control channel listens on
    ``<home>/run/control.sock`` (live sessions, posts, index readiness, approvals; ending a
    session with ``session-ended-by-owner``): :mod:`node.host.control`, specs/control.md;
    ``on_invitation`` is called once that channel answers.

    A start refused for any reason (``home-in-use``, a damaged file, a port or index
    refusal) writes none of the host's state files: the seen nonces and quota buckets are
    only read at start and made at first use, ``audit.key`` and the control folder
    ``<home>/run`` just before publishing (specs/session.md §8.1), and a ``host.lock`` and a
    held mail's ``mailbox.sqlite3`` (``--hold-mail``) this start made are removed again.

    Raises:
        KithError: ``home-in-use`` (another process serves this home), ``control-dir-unsafe``
            (``<home>/run`` is not a 0700 folder of this user), protocol not
            found/invalid, bind failure, server refusal.
    """
    identity = load_identity(home)  # never created here: a typo in --home is refused
    lock_path = home / HOST_LOCK_FILE
    lock_was_there = lock_path.exists()
    from node.host.sealed_host import HELD_MAIL_FILE, forget_unserved_mail

    mail_was_there = os.path.lexists(home / HELD_MAIL_FILE)
    host_lock = acquire_owner_lock(lock_path, "kith host")
    if host_lock is None:
        raise ConfigError("home-in-use", f"Another `kith host` is serving this home ({lock_owner(lock_path)}).",
                          hint="Stop it first, or host from another home (--home DIR).")
    started = []

    def invitation(inv: dict[str, Any]) -> None:
        started.append(True)
        on_invitation(inv)
    try:
        await Host(home, opts, identity, on_invitation=invitation, on_event=on_event, warn=warn,
                   stop=stop, clock=clock, on_devices_revoked=on_devices_revoked).run()
    finally:
        if started or lock_was_there:
            release_owner_lock(host_lock)
        else:  # a refused start leaves no lock file it made
            remove_owner_lock(lock_path, host_lock)
        if not started and not mail_was_there and opts.hold_mail is not None:
            forget_unserved_mail(home)  # nor the held mail's file (--hold-mail), made empty before the refusal


class Host:
    """One host process's serving machinery, built once and wired in one place.

    A ``Host`` owns a :class:`node.host.sessions.SessionTable` (who is connected),
    :class:`node.host.posts.Posts` (what may be joined), the audit tap, the peers
    watcher and the knowledge behind the egress gate; each accepted connection is a
    :class:`node.host.connection.Connection`. Every event goes through :meth:`emit`
    (the audit log, then the owner's ``on_event``, then the post keeper), fixed when the
    host is built. Time comes from ``clock`` and the endpoint from ``bind``, so the same
    host runs over iroh (``kith host``) and over memory pipes (``kith protocol test``,
    tests), and tests drive eviction and expiry by advancing a
    :class:`node.runtime.clock.ManualClock`.

    Args:
        home: the node home (holds the identity; never created here).
        opts: :class:`HostOptions`.
        identity: the host's :class:`node.trust.identity.Identity`.
        on_invitation / on_event / warn / stop: as :func:`serve_host`.
        clock: the host's clock (default: the system clock).
        bind: ``(secret, alpn) -> async context manager`` yielding the endpoint (the
            listener shape of :class:`node.transport.iroh.IrohNode`; see
            :class:`node.transport.memory.MemoryListener`); default: iroh, bound with
            ``opts.local``.
        on_devices_revoked: as :func:`serve_host`.
    """

    def __init__(self, home: Path, opts: HostOptions, identity: Any, *,
                 on_invitation: Callable[[dict[str, Any]], None], on_event: Callable[[dict[str, Any]], None],
                 warn: Callable[[str], None], stop: anyio.Event | None = None, clock: Clock = SYSTEM_CLOCK,
                 bind: Callable[[bytes, bytes], Any] | None = None,
                 on_devices_revoked: Callable[[list[str]], None] | None = None) -> None:
        self.home = Path(home)
        self.opts = opts
        self.identity = identity
        self.on_invitation = on_invitation
        self.on_event = on_event
        self.warn = warn
        self.stop = stop
        self.clock = clock
        self.bind = bind or self._bind_iroh
        self.on_devices_revoked = on_devices_revoked
        self.first_stream_timeout_s = FIRST_STREAM_TIMEOUT_S
        self.session_stop = anyio.Event()
        self.listener: Any = None
        self._running = 0  # connection tasks not finished yet
        self._all_done = anyio.Event()
        self._all_done.set()
        self._card: dict[str, Any] | None = None  # this device's card for its newest live post
        self._card_v1: dict[str, Any] | None = None  # the same card in format 1, for older guests
        self._held_url: str | None = None  # where this device holds mail (--hold-mail), once served
        #: the mail this device holds (--hold-mail; node.host.sealed_host.HeldMail), once served
        self.held_mail: Any = None
        #: mailbox connections served now (node/community/iroh_mail.py): id → _MailSlot
        self._mail_conns: dict[int, _MailSlot] = {}
        self._mail_ticks = itertools.count()  # orders the slots by when they began to wait
        self._sealed_seen: Any = None  # DurableSeen, opened when first needed (sealed_seen)
        self._seq: int | None = None  # the first card's sequence number, taken before publishing
        self._card_changed = anyio.Event()

    def _bind_iroh(self, secret: bytes, alpn: bytes) -> Any:
        from node.transport.iroh import bind_node
        from node.transport.modes import DEFAULT, OFFLINE
        from node.transport.port import PORT_FILE, keeps_port, load_port, port_file_damaged

        mode = self.opts.transport or (OFFLINE if self.opts.local else DEFAULT)
        port = load_port(self.home) if keeps_port(mode) else None  # where this home's host was
        if keeps_port(mode) and port_file_damaged(self.home):
            if self._restored:  # their tickets name a port this start cannot know
                raise ConfigError(
                    "config-invalid", f"{PORT_FILE}: not a kept port ({{\"version\": 1, \"port\": N}}), yet "
                    f"{len(self._restored)} invitation(s) kept from the last run name that port: binding a new "
                    "one would strand their guests",
                    hint="`kith host --new-invitation` binds a new port and signs a new invitation (the old ones "
                         f"are no longer honoured); or put back {PORT_FILE} with the last run's port")
            self.warn(f"{PORT_FILE} was unreadable: the port of the last run is unknown; a new port is bound and "
                      "kept from now on (no invitation of an earlier run is honoured)")
        return bind_node(secret, alpn, local=self.opts.local, mode=self.opts.transport, port=port)

    def _keep_port(self, listener: Any) -> None:
        """Keep the bound port for the next start in the modes that keep one. When the kept
        one stayed taken (node/transport/iroh.py tried it again first), the port bound is
        this run's only: the kept one is not replaced, and the warning says so
        (node/transport/port.py, specs/transport.md §7)."""
        from node.transport.port import keeps_port, save_port

        mode, port = getattr(listener, "mode", None), getattr(listener, "bound_port", None)
        if mode is None or port is None or not keeps_port(mode):
            return
        taken = getattr(listener, "port_taken", None)
        if taken:  # a clash may be one-off: the kept port stays, the next start tries it again
            from node.transport.iroh import KEPT_PORT_RETRY_S

            self.warn(f"UDP port {taken}, where this home's host was before, is taken (tried for "
                      f"{KEPT_PORT_RETRY_S:g} s): this run is on port {port} only, and {taken} stays kept for the "
                      "next start; until then invitations of earlier runs do not reach this host (their guests "
                      "need this run's invitation), and they work again once it is back on its port")
            if (self._held_url or "").startswith("iroh:"):  # --hold-mail iroh: its ticket names the port too
                self.warn("the mail this device holds (--hold-mail iroh) is at another iroh: ticket for this run "
                          "only: the other devices' --holder iroh:... of earlier runs do not reach it until it is "
                          "back on its port (keep their --holder as it is; give this run's only to reach it now)")
            self._restored = []  # kept in posts.json for the next start; not said to keep working now
            return
        save_port(self.home, port)

    # ------------------------------------------------------------ building
    def _build(self) -> None:
        """Load the protocol, knowledge and trust records; make the table and posts.

        Raises:
            KithError: protocol not found/invalid, broken ``peers.json``, ...
        """
        from node.host.audit import HostAudit
        from node.host.revocation import PeersWatcher
        from node.trust.audit_log import AuditLog
        from node.trust.seen_nonces import SeenNonces

        opts = self.opts
        pdir = Path(opts.protocol_dir) if opts.protocol_dir is not None else find_protocol_dir(opts.protocol, self.home)
        if pdir is None:
            raise SpecError("protocol-not-found", f"no protocol named {opts.protocol!r}")
        self.spec = load_spec(pdir)
        hooks = load_hooks(pdir)
        from node.answer.citation import CitationSigner, load_version_key

        # kept when signing is off too: the host can still say whether a version is current
        version_key = load_version_key(self.home, create=opts.sign_citations)
        self.knowledge = open_knowledge(self.home, self.warn, self.clock.time, version_key=version_key,
                                        copy_secret=self.identity.secret)
        self.citations = CitationSigner(self.identity.secret if opts.sign_citations else None, version_key,
                                        self.knowledge.evidence, lambda: rfc3339(self.clock.time()),
                                        enabled=opts.sign_citations,
                                        versions_for=getattr(self.knowledge.service, "versions_for", None))
        self._closers: list[Callable[[], None]] = [self.knowledge.close]
        registry = PeerRegistry.load(self.home)  # a broken registry fails here, before binding
        audit_log = AuditLog(self.home, audit_queries=opts.audit_queries)
        replaced = audit_log.check_key()  # an unreadable audit.key too (it failed every guest query); made in run()
        if replaced:
            self.warn(replaced)
        if opts.presence == "granted":
            from node.host.grants import unseen_person_pins

            for name in unseen_person_pins(registry):
                self.warn(f"presence granted: no device of person pin {name!r} has joined yet, so each of its "
                          "devices is refused as an unknown post until one joins once under --presence open "
                          "(or is pinned by its own key)")
        self.own_profile = load_own_profile(self.home)
        self.ui_bundle = None
        if opts.share_ui:
            from node.runtime.ui_artifacts import load_bundle

            self.ui_bundle = load_bundle(pdir)
        self.seen_nonces = SeenNonces(self.home)
        if self.opts.mailbox or self.opts.holders or self.opts.hold_mail is not None:
            from node.trust.sealed_seen import DurableSeen

            self._sealed_seen = DurableSeen(self.home)  # probed now: a damaged file refuses the start
            self._closers.append(self._sealed_seen.close)
        self._closers.append(self.seen_nonces.close)
        self.audit = HostAudit(audit_log)
        self._closers.append(self.audit.close)
        self._emit = self.audit.observe(self.on_event)
        self.hooks = self.audit.wrap_hooks(hooks)
        self.table = SessionTable(AdmissionLimits(max_sessions=opts.max_sessions,
                                                  max_sessions_per_peer=opts.max_sessions_per_peer,
                                                  post_max_sessions=opts.post_max_sessions,
                                                  anonymous_sessions=opts.anonymous_sessions,
                                                  evict_idle_after_s=opts.evict_idle_after_s,
                                                  max_failures=opts.max_failed_handshakes,
                                                  failure_cooldown_s=opts.failure_cooldown_s),
                                  on_event=self.emit, clock=self.clock)
        self.posts = Posts(self.spec.protocol_id, server_url=opts.server_url, identity=self.identity,
                           invite_file=opts.invite_file, emit=self.emit, warn=self.warn, clock=self.clock,
                           max_failures=opts.max_failed_handshakes,
                           # a public multi-use post must never be rotatable by strangers
                           retire_on_failures=not opts.server_url or opts.post_max_sessions == 1,
                           unlisted=opts.unlisted,
                           # file mode: live posts outlive a restart (a server's are withdrawn at exit)
                           keep_in=None if opts.server_url else self.home)
        self.posts.on_live = self._new_card
        # file mode: the posts of earlier runs (a bad posts.json fails here, before binding)
        self._restored: list[dict[str, Any]] = []
        if not opts.server_url:
            try:
                self._restored = self.posts.restore(self.table, self.identity.public_key)
            except KithError as exc:
                if not opts.new_invitation or exc.code != "config-invalid":
                    raise
                # --new-invitation forgets the kept posts anyway: an unreadable file is what
                # it replaces, not a reason to refuse (the flag is its way out)
                self.warn(f"--new-invitation: {exc.message}; it is replaced, no invitation of an earlier run "
                          "is honoured")
            if opts.new_invitation:
                gone = self.posts.forget_kept()
                self._restored = []
                if gone:
                    self.warn(f"--new-invitation: {len(gone)} invitation(s) of earlier runs are no longer "
                              "honoured; their guests are told to ask for a new one")
        from node.trust.person import load_person

        person = load_person(self.home)
        self.peers_watcher = PeersWatcher(self.home, self.table, on_event=self.emit, clock=self.clock,
                                          own_person=person.person_key if person else None,
                                          on_devices_revoked=self.on_devices_revoked)
        from node.host.grants import GrantWatcher
        from node.trust.rotation import RotationLedger

        self.grant_watcher = GrantWatcher(self.home, self.table, self.clock, on_event=self.emit)
        warmer = self.knowledge.warmer
        if warmer is not None:  # the pinned peers' views too (a person pin's devices share its name)
            warmer.pinned = lambda: list(self.peers_watcher.known().peers)
            warmer.anonymous = not (opts.peers_only or opts.presence == "granted")  # none is answered
        self.rotations = RotationLedger.load(self.home)  # the person-key rotations this host followed
        from node.host.doorkeeper import Doorkeeper

        # every admission decision (slots, cool-downs, grants, presence, person checks)
        self.door = Doorkeeper(table=self.table, peers=self.peers_watcher, rotations=self.rotations,
                               presence=opts.presence, peers_only=opts.peers_only,
                               closing=self.session_stop.is_set, emit=self.emit)

    def _wiring(self) -> Wiring:
        """What a :class:`Connection` uses — the host's collaborators as they are now, never the
        host itself (built per accepted connection, after the endpoint is bound)."""
        opts = self.opts
        setup = SessionSetup(spec=self.spec, identity=self.identity, hooks=self.hooks, profile=self.own_profile,
                             ui_bundle=self.ui_bundle, heartbeat=opts.heartbeat, stop=self.session_stop,
                             hook_options=opts.hook_options, ttl_s=opts.ttl_s,
                             first_stream_timeout_s=self.first_stream_timeout_s, reject_frame=self.reject_frame,
                             pairing_code=self.pairing_code, card=self.current_card,
                             card_v1=self.current_card_v1)
        service = getattr(self.knowledge, "service", None)
        answering = Answering(tap=self.audit.tap, rewrite=self.citations.rewrite,
                              check=self.knowledge.egress_check, knowledge_for=self.knowledge.handle_for,
                              copy_state=getattr(service, "copy_state", None) or (lambda _name: None),
                              answered=self.answered_live)
        return Wiring(door=self.door, table=self.table, posts=self.posts, nonces=self.seen_nonces,
                      listener=self.listener, emit=self.emit, clock=self.clock, setup=setup, answering=answering)

    def emit(self, ev: dict[str, Any]) -> None:
        """Report one host event — a dict built from the table in
        node/common/host_events.py (checked against it: specs/host-events.md) — to the
        audit log and the owner's ``on_event``, then to the post keeper (which closes
        ended sessions on the server)."""
        self._emit(checked_event(ev))
        keeper = self.posts.keeper
        if keeper is not None:
            keeper.observe(ev)

    def pairing_code(self, peer_key: str) -> str:
        """The pairing words this host and ``peer_key`` both see (node/trust/pairing.py)."""
        from node.trust.pairing import pairing_code

        return pairing_code(self.identity.public_key, peer_key)

    def reject_frame(self, code: str, message: str | None = None) -> bytes:
        """One ``_session_reject`` frame: the engine's own, or with ``message`` (a refusal
        whose peer message carries a number, such as the cool-down left)."""
        if message is not None:
            return _reject_frame(code, message)
        engine = SessionEngine("host", self.spec, public_key=self.identity.public_key, sign=self.identity.sign,
                               host=HostConfig(remote_id="", post_protocol=lambda _p: None,
                                               nonce_unseen=lambda _n: False))
        engine.abort(code)
        return engine.data_to_send()

    # ------------------------------------------------------------ running
    async def run(self) -> None:
        """Serve until ``stop`` is set or the task is cancelled (see :func:`serve_host`)."""
        from node.host.control import check_run_dir, control_socket_path

        started_at = self.clock.time()
        run_dir = control_socket_path(self.home).parent
        if self.opts.control and os.path.lexists(run_dir):  # control-dir-unsafe before anything is written
            check_run_dir(run_dir, create=False)
        self._build()
        self._batch_audit()
        watcher = None
        try:
            if self.opts.hold_mail is not None:  # before the card that names it (specs/sealed.md §7b)
                from node.host.sealed_host import hold_mail

                held = contextlib.ExitStack()
                self._closers.insert(0, held.close)
                self.held_mail = held.enter_context(hold_mail(self.home, self.opts.hold_mail))
                self._held_url = self.held_mail.url  # None: over iroh only, named once the endpoint is bound
            if self.opts.watch:  # take the index writer before publishing: index-locked fails fast
                from node.corpus.watch import host_watcher

                watcher = await anyio.to_thread.run_sync(host_watcher, self.home, self.emit, self.warn)
                self._closers.insert(0, watcher.close)
            async with self.bind(self.identity.secret, self.spec.alpn) as listener:
                self.listener = listener
                if self.held_mail is not None and hasattr(listener, "accept_alpns"):
                    from node.community.iroh_mail import MAILBOX_ALPN, SCHEME

                    listener.accept_alpns(MAILBOX_ALPN)  # the mailbox beside knowledge-query (specs/sealed.md §7b)
                    if self._held_url is None:
                        self._held_url = SCHEME + listener.ticket()
                # the host's state files are written only now that no refusal of the start is left
                # (the seen nonces and quota buckets at first use): a refused start writes nothing,
                # and card-seq is refused before any invitation is written or printed
                from node.host.card import first_seq

                self._seq = first_seq(self.home, self.identity)
                if self.opts.control:  # made (0700) only now, still before publishing
                    check_run_dir(run_dir, create=True)
                self.audit.log.make_key()
                self._keep_port(listener)
                await self._check_relays(listener)
                inv = await self._publish()
                keeper = self.posts.keep(inv, self._new_invitation)
                async with anyio.create_task_group() as tg:
                    if self.opts.control:
                        from node.host.control import HostControl, serve_control

                        # the owner's control channel (<home>/run/control.sock; node/host/control.py)
                        await tg.start(serve_control, HostControl(self.home, self.identity, self.table,
                                                                  self.posts.listing, self.knowledge.index,
                                                                  self.knowledge.quota_left, started_at=started_at,
                                                                  transport=self._transport_status,
                                                                  policy=self.knowledge.policy))
                    self.on_invitation(inv.to_dict())  # once `kith status` can see this host
                    for kept in self._restored:  # posts of an earlier run honoured again
                        self.emit(PostRestored(**kept, current=kept["post_id"] == inv.post_id).to_dict())
                    if keeper is not None:
                        tg.start_soon(keeper.run)
                    if watcher is not None:
                        tg.start_soon(watcher.arun)
                    tg.start_soon(self.posts.watch_expiry)
                    tg.start_soon(self._purge_nonces)
                    tg.start_soon(self.peers_watcher.run)  # peers.json / policy.toml by stat
                    tg.start_soon(self.grant_watcher.run)  # grants whose `until` passes end their sessions
                    if self.knowledge.warmer is not None:  # views built before the first question
                        tg.start_soon(self.knowledge.warmer.run, self.clock)
                    if self.opts.server_url:  # the person pins' revocation lists (specs/peers.md §10)
                        tg.start_soon(self.peers_watcher.watch_server, self.opts.server_url, self.identity)
                        tg.start_soon(self._publish_cards)  # this device's card (specs/peers.md §13)
                    if self.mail_urls():  # sealed questions left with a holder (specs/sealed.md)
                        from node.host.sealed_host import take_sealed_questions

                        tg.start_soon(take_sealed_questions, self)
                    async with anyio.create_task_group() as accepting:
                        if self.stop is not None:
                            accepting.start_soon(self._stop_watch, accepting.cancel_scope)
                        await self._accept_loop(tg)
                        accepting.cancel_scope.cancel()
                    # stopped (or the endpoint closed): sessions end cleanly, then the rest is cancelled
                    self.session_stop.set()
                    if keeper is not None:
                        keeper.retire()  # no republish from now on
                    await self.posts.withdraw()
                    with anyio.move_on_after(self.opts.shutdown_grace_s):
                        await self._all_done.wait()
                    if keeper is not None:
                        keeper.stop()
                    tg.cancel_scope.cancel()
        finally:
            if not self.posts.withdrawn:  # cancelled before the clean stop (a second Ctrl-C)
                with anyio.CancelScope(shield=True):
                    await self.posts.withdraw()
            for close in self._closers:
                close()

    def _batch_audit(self) -> None:
        """Write the audit log in batches on this host's event loop (one lock and one write
        per :data:`node.trust.audit_log.BATCH_S` tick; the closers write what is left at
        exit). Under a loop that is not asyncio's, records are written one at a time."""
        import asyncio

        from node.trust.audit_log import loop_schedule

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.audit.log.start_batching(loop_schedule(loop))

    async def _check_relays(self, listener: Any) -> None:
        """Wait (bounded, :data:`node.transport.iroh.RELAY_CHECK_S`) for a home relay in
        the modes that have relays and say so when none answered: the relays named are
        the only ones used, none is put in their place (specs/transport.md §1)."""
        mode = getattr(listener, "mode", None)
        if mode is None or not mode.relays:
            await listener.wait_online()
            return
        if await listener.wait_online():
            return
        named = "the n0 relays" if mode.uses_n0 else "relay " + ", ".join(mode.relays)
        then = ("no guest can reach this host until one answers (--relay-only)" if mode.relay_only
                else "guests can reach this host only by a direct path")
        self.warn(f"{named} could not be reached within {RELAY_CHECK_S:.0f} s; {then}; no other relay is used")

    def _warn_private(self, inv: Invitation) -> None:
        """A public post (community server) whose ticket carries private, link-local,
        loopback or CGNAT addresses: tell the owner, once (specs/transport.md §5). Not in
        offline mode (``--offline``): its ticket can only carry loopback addresses, which
        describe no network, and ``--relay-only`` is no way out there."""
        from node.transport.hygiene import private_addresses, ticket_addresses

        mode = self.opts.transport
        if getattr(self, "_warned_private", False) or (mode.offline if mode is not None else self.opts.local):
            return
        try:
            _relay, direct = ticket_addresses(inv.transport_info.ticket)
        except ValueError:
            return
        private = private_addresses(direct)
        if private:
            self._warned_private = True
            self.warn(f"the public post's ticket carries {len(private)} private or link-local address(es) "
                      f"({', '.join(private[:4])}): they describe your network to every reader and mean "
                      "nothing outside it; use --relay-only to publish none")

    def _transport_status(self) -> dict[str, Any]:
        """The ``transport`` entry of the control state (specs/control.md)."""
        status = getattr(self.listener, "status", None)
        out = status() if status is not None else {"mode": "memory"}
        out["relayReachable"] = bool(out.get("homeRelay")) if out.get("relays") else None
        out["presence"] = self.opts.presence
        return out

    # ------------------------------------------------------------ device card (specs/peers.md §13)
    def _new_card(self, inv: Invitation) -> None:
        """Sign this device's card for ``inv``, the post that just became live (none when the
        home's person has not bound this device)."""
        from node.host.card import own_card

        seq, self._seq = self._seq, None  # the number taken before publishing, for the first card
        try:
            self._card = self._card_v1 = own_card(self.home, self.identity, inv.to_dict(), seq)
            if self._card is not None and self.mail_urls():
                from node.host.card import with_mailboxes  # card format 2 (specs/sealed.md §6)

                self._card = with_mailboxes(self.identity, self._card, self.mail_urls())
        except (KithError, OSError) as exc:  # a person record that does not load, card-seq unwritable: no card
            self._card = self._card_v1 = None
            code = refusal_of(exc).code  # type: ignore[union-attr]  # KithError or OSError: never None
            self.warn(f"no device card is published ({code}): guests reach this device only by its invitation")
        if self._card is not None:
            self._card_changed.set()

    def sealed_seen(self) -> Any:
        """The sealed questions this host acted on, kept in ``<home>/sealed-seen.sqlite``
        (:class:`node.trust.sealed_seen.DurableSeen`: probed when the host is built with a
        mailbox, ``--holder`` or ``--hold-mail``; opened at the first use)."""
        if self._sealed_seen is None:
            from node.trust.sealed_seen import DurableSeen

            self._sealed_seen = DurableSeen(self.home)
        return self._sealed_seen

    def answered_live(self, peer: str, message: Any) -> None:
        """A live ``results`` frame to an outbox question (``query_id`` ``outbox:<id>``)
        that answers it (status ``ok`` or ``no-verified-results``: what closes the asker's
        row, specs/outbox.md §3) is queued to ``peer``: when this host takes sealed
        questions, the same question from that device key is not answered again sealed
        (specs/sealed.md §5). Nothing happens for other frames or a host without a mailbox."""
        from node.trust.sealed import MAX_LIFETIME_S, QUERY_ID_PREFIX

        if not isinstance(message, dict) or message.get("action") != "results":
            return
        query_id = message.get("query_id")  # the cheap tests first: most answers are not an outbox's
        if not isinstance(query_id, str) or not query_id.startswith(QUERY_ID_PREFIX) \
                or message.get("status") not in ("ok", "no-verified-results") or not self.mail_urls():
            return
        now = self.clock.time()
        try:
            self.sealed_seen().mark("question", peer, query_id[len(QUERY_ID_PREFIX):], until=now + MAX_LIFETIME_S,
                                    now=now)
        except KithError:
            pass  # marked already (sealed-replayed), or the file failed: the live answer goes out regardless

    def mail_urls(self) -> list[str]:
        """The holders this device takes its sealed questions from, which its card names:
        the mail it holds itself (``--hold-mail``), the ``--holder`` URLs, then the server's
        mailbox (``--mailbox``); distinct, at most 4 (specs/sealed.md §6, §7b)."""
        urls = [u for u in (self._held_url, *self.opts.holders,
                            self.opts.server_url if self.opts.mailbox else None) if u]
        return list(dict.fromkeys(urls))[:4]

    def current_card(self) -> dict[str, Any] | None:
        """This device's card for its newest live post, or None (sent in the handshake)."""
        return self._card

    def current_card_v1(self) -> dict[str, Any] | None:
        """That card in format 1 (no ``mailboxes``, the same ``seq``), or None: sent in the
        handshake to a guest that reads format 1 only (specs/sealed.md §6)."""
        return self._card_v1

    async def _publish_cards(self) -> None:
        """Post each new card of this device on the community server (``POST
        /api/v1/cards``); a refusal is said once and the host serves on."""
        from node.community.client import CommunityClient

        said = False
        while True:
            await self._card_changed.wait()
            self._card_changed = anyio.Event()
            card = self._card
            if card is None:
                continue
            try:
                async with CommunityClient(self.opts.server_url, self.identity) as client:
                    await client.publish_card(card)
            except KithError as exc:
                if not said:
                    said = True
                    self.warn(f"the community server did not take this device's card ({exc.code}); "
                              "guests reach this device only by its invitation")

    def _new_invitation(self) -> Invitation:
        """A new signed invitation for this endpoint, created and expiring on the host's own
        clock — the one its expiry watch (:meth:`node.host.posts.Posts.watch_expiry`) and
        handshakes read; on the system clock, a host on a test's clock saw its post expire
        late by however long it took to start."""
        from datetime import datetime, timezone

        opts = self.opts
        return create_invitation(self.identity, protocol_name=self.spec.name, protocol_version=self.spec.version,
                                 protocol_id=self.spec.protocol_id, ticket=self.listener.ticket(), ttl_s=opts.ttl_s,
                                 message=opts.message, tags=opts.tags, max_sessions=opts.post_max_sessions,
                                 now=datetime.fromtimestamp(self.clock.time(), timezone.utc))

    async def _publish(self) -> Invitation:
        """The invitation this run writes or publishes. File mode: the posts of earlier
        runs are honoured again (or withdrawn with ``new_invitation``) and the last one is
        written again when it still describes this endpoint — never re-signed."""
        inv = self._new_invitation()
        if not self.opts.server_url:
            kept = self.posts.reusable(inv)
            if kept is not None:
                self.posts.reuse(kept)
                return kept
        if self.opts.server_url:
            self._warn_private(inv)
            from node.community.client import CommunityClient

            async with CommunityClient(self.opts.server_url, self.identity) as client:
                inv = await client.publish_invitation(inv, unlisted=self.opts.unlisted)
        self.posts.add(inv)
        return inv

    async def _accept_loop(self, tg: Any) -> None:
        token = 0
        listener = self.listener
        async with listener.connections() as incoming:  # QUIC handshakes complete concurrently
            async for conn in incoming:
                if self.held_mail is not None and self._mail_connection(tg, conn):
                    continue
                token += 1
                scope = anyio.CancelScope()

                def evict(conn: Any = conn, scope: anyio.CancelScope = scope) -> None:
                    scope.cancel()
                    listener.close_connection(conn, b"handshake-host-busy")

                self.table.connection_arrived(token, listener.remote_of(conn), evict)
                tg.start_soon(self._serve_one, Connection(self._wiring(), conn, token, scope))

    def _mail_connection(self, tg: Any, conn: Any) -> bool:
        """Serve ``conn`` as a mailbox connection when it came with the mailbox ALPN (a
        device that holds mail: specs/sealed.md §7c) — no session slot, at most
        :data:`node.community.iroh_mail.MAX_CONNECTIONS` at once. When every slot is taken the
        connection that has waited longest for a whole request frame is closed ``mail-busy``
        to make room (a peer holding idle or half-sent connections cannot lock the person's
        devices out); with every slot answering a frame the new one is closed ``mail-busy``.
        False for any other connection."""
        from node.community.iroh_mail import MAILBOX_ALPN, MAX_CONNECTIONS, serve_mail_connection

        listener = self.listener
        alpn_of = getattr(listener, "alpn_of", None)
        if alpn_of is None or alpn_of(conn) != MAILBOX_ALPN:
            return False
        if len(self._mail_conns) >= MAX_CONNECTIONS:
            waiting = [s for s in self._mail_conns.values() if s.waiting_since is not None]
            if not waiting:
                listener.close_connection(conn, b"mail-busy")
                return True
            oldest = min(waiting, key=lambda s: s.waiting_since)
            del self._mail_conns[id(oldest)]  # counted free now: the next arrival cannot take it twice
            oldest.scope.cancel()
            listener.close_connection(oldest.conn, b"mail-busy")
        slot = _MailSlot(conn, anyio.CancelScope())
        self._mail_conns[id(slot)] = slot  # counted before it runs: a burst cannot pass the cap

        def waiting_now(waits: bool) -> None:
            slot.waiting_since = next(self._mail_ticks) if waits else None

        async def serve() -> None:
            try:
                with slot.scope:
                    await serve_mail_connection(listener, conn, self.held_mail.app, waiting_now)
            except Exception:  # noqa: BLE001 - one mailbox connection's fault never ends the host
                log.exception("a mailbox connection failed")
                listener.close_connection(conn, b"internal-error")
            finally:
                self._mail_conns.pop(id(slot), None)

        tg.start_soon(serve)
        return True

    @property
    def held_url(self) -> str | None:
        """Where this device holds mail (``--hold-mail``): ``http://HOST:PORT`` or
        ``iroh:<ticket>``; None without ``--hold-mail`` or before it is served."""
        return self._held_url

    #: the last fault of the home a connection ended with (logged once until it changes)
    _told_fault: tuple[str, str] | None = None

    async def _serve_one(self, connection: Connection) -> None:
        """Run one connection; an exception inside it ends that connection only."""
        self._running += 1
        self._all_done = anyio.Event() if self._running == 1 else self._all_done
        try:
            await connection.serve()
        except Exception as exc:  # noqa: BLE001 - one connection's fault must never reach another
            who = connection.remote[:16] or "an unknown peer"
            refusal = refusal_of(exc)
            if refusal is None:
                log.exception("a connection of %s failed", who)
            elif self._told_fault != (refusal.code, refusal.message):  # a fault of the home: once, until it changes
                self._told_fault = (refusal.code, refusal.message)
                log.warning("a connection of %s failed: error [%s]: %s%s (said once; quiet until it changes)", who,
                            refusal.code, refusal.message, f" — hint: {refusal.hint}" if refusal.hint else "")
            self.listener.close_connection(connection.conn, b"internal-error")
        finally:
            self._running -= 1
            if self._running == 0:
                self._all_done.set()

    async def _stop_watch(self, accepting: anyio.CancelScope) -> None:
        assert self.stop is not None
        await self.stop.wait()
        accepting.cancel()

    async def _purge_nonces(self) -> None:
        """Keep the seen-nonce table bounded while hosting (expired rows go)."""
        from node.trust.seen_nonces import PURGE_INTERVAL_S

        while True:
            await self.clock.sleep(PURGE_INTERVAL_S)
            await anyio.to_thread.run_sync(self.seen_nonces.purge)


def _reject_frame(code: str, message: str) -> bytes:
    """One ``_session_reject`` frame (the engine's own encoding of it)."""
    import msgspec

    from node.engine.frames import SessionReject

    return msgspec.json.encode(SessionReject(code=code, message=message[:500])) + b"\n"


__all__ = ["Host", "HostOptions", "Invitation", "Knowledge", "serve_host", "open_knowledge"]
