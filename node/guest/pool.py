"""Warm connections to pinned peers: one iroh endpoint, one live session per peer, bounded.

A long-running caller (``kith mcp``, the local API, ``kith ask``) asks peers through a
:class:`SessionPool`, which knows only targets (:class:`~node.guest.targets.Target`: a
verified invitation); who answers for a name is decided above it
(:class:`node.guest.asker.Asker`). The first question to a target opens one
knowledge-query session on the pool's endpoint and keeps it; the next question to that host
goes over the same session (one round trip, no handshake). Rules (specs/ask.md §4, DESIGN §3):

- **No session is ever resumed.** When the host ended a session (``end``, shutdown,
  ``session-evicted``, restart, heartbeat loss) the pool forgets it; the next question
  (the asker re-resolving a name first) opens a new session, or the peer is ``unreachable``. A host
  that went silent with the question out (``peer-unresponsive``, 4 s: specs/session.md
  §7.2) is ``unreachable`` at once; it is not dialled again for that question.
- A question that is not answered by its deadline poisons its session (a late answer
  must never be taken for the next question's): the session is cancelled and forgotten.
- Bounded: at most ``max_sessions`` sessions (least recently used idle one closed for a
  newcomer; ``ask-pool-full`` when every one is busy); a session idle for ``idle_s``
  seconds is ended cleanly with ``end``.
- One question at a time per session (the protocol is request/response).

``kith mcp`` and the local API enter one pool in their server's lifespan (same event
loop as their requests: iroh's callbacks go to one loop per process).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AsyncExitStack
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from node.answer.contract import TOP_K_DEFAULT
from node.common.errors import InvitationError, KithError, SessionAborted, TransportError
from node.guest.guest import join_session
from node.guest.targets import PeerGone, Target
from node.trust.identity import Identity
from node.common.kept import keep

log = logging.getLogger("kith.pool")

#: The protocol every pooled session speaks (its ALPN is the endpoint's).
PROTOCOL = "knowledge-query"
#: Default bound on live sessions (one per peer); ≥ :data:`node.guest.fanout.MAX_PEERS`
#: so one fan-out always fits, and below anyio's 40 worker threads (each live session's
#: guest hook waits for its next question in one).
MAX_SESSIONS = 24
#: Default idle time (seconds) after which a pooled session is ended with ``end``.
IDLE_S = 120.0
#: Default bound (seconds) on a pool's exit waiting for its live sessions to end cleanly.
END_WAIT_S = 3.0
#: Seconds an address whose new session never came up is not tried again (its peer is
#: ``unreachable`` at once meanwhile, instead of costing every ask its whole deadline).
DOWN_S = 15.0
#: True in the home runner's tasks (:meth:`node.guest.runner.Runner.run` sets it for its
#: task group): they keep their own backoff per peer (node/guest/outbox_task.py), so an
#: address marked down (:data:`DOWN_S`) is dialled for them anyway. The runner of ``kith
#: api serve`` and ``kith mcp`` asks through the server's one pool, whose mark still spares
#: the agents' questions; a failed dial of the runner's marks the address for them too.
OWN_BACKOFF: ContextVar[bool] = ContextVar("kith_pool_own_backoff", default=False)


@dataclass
class PoolStats:
    """Counters a test or benchmark reads (no timing).

    Attributes:
        sessions_opened: sessions (= iroh connections: one per session) opened so far.
        reused: questions sent over a session that had answered before.
        endpoints: iroh endpoints bound (1 for a pool's life).
        down_skips: questions answered ``unreachable`` at once (address down, :data:`DOWN_S`).
    """

    sessions_opened: int = 0
    reused: int = 0
    endpoints: int = 0
    down_skips: int = 0


class _NextQuestion:
    """The next question of a session's queue, taken only when awaited."""

    __slots__ = ("queue",)

    def __init__(self, queue: "asyncio.Queue[dict[str, Any] | None]") -> None:
        self.queue = queue

    def __await__(self) -> Any:
        return self.queue.get().__await__()


class PeerSession:
    """One live knowledge-query session of the pool (internal; use :meth:`SessionPool.ask`)."""

    def __init__(self, pool: "SessionPool", key: str, target: Target) -> None:
        self.pool = pool
        self.key = key
        self.target = target
        self.questions: "asyncio.Queue[dict[str, Any] | None]" = asyncio.Queue()
        self.lock = anyio.Lock()
        self.ready = anyio.Event()
        self.closed = anyio.Event()
        self.session_id: str | None = None
        self.outcome: Any = None
        self.error: KithError | None = None
        self.path: Any = None  # node.transport.paths.PathInfo once the stream opened
        self.answered = 0
        self.last_used = time.monotonic()
        self._waiter: asyncio.Future[dict[str, Any]] | None = None
        self._scope: anyio.CancelScope | None = None
        self._loop = asyncio.get_running_loop()

    # --- hook side (on the event loop; a worker thread when the hook is not inline) ----
    def _next_question(self) -> Any:
        """The hooks' ``ask``: an awaitable of the next question (None ends the session),
        so the hook waits for it without holding a thread (protocols/knowledge-query).
        Not a coroutine: one a worker thread made and the driver then abandoned (the
        caller's deadline) is dropped without a "never awaited" warning."""
        return _NextQuestion(self.questions)

    def _on_results(self, message: dict[str, Any]) -> None:
        from node.answer.fence import screen_answer

        refused: KithError | None = None
        try:  # the guest's own marks (never the host's); too large to screen: refused unread
            screen_answer(message)
        except ValueError as exc:
            from node.common.errors import error_for

            refused = error_for("peer-answer-invalid", f"the host's answer was refused by this guest: {exc}")

        def deliver() -> None:
            if self._waiter is not None and not self._waiter.done():
                if refused is not None:
                    self._waiter.set_exception(refused)
                else:
                    self._waiter.set_result(message)
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:  # a worker thread (a long answer, or inline hooks off)
            on_loop = False
        if on_loop:
            deliver()
        else:
            self._loop.call_soon_threadsafe(deliver)

    def _on_refused(self, code: str, message: str) -> None:
        """The host sent a message this guest's engine refused (``message-schema-invalid``,
        …): the question waiting for it fails now with ``peer-answer-invalid`` instead of
        waiting for a valid answer that may never come (the session is then cancelled:
        the turn is the host's, it cannot carry another question)."""
        from node.common.errors import error_for

        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error_for("peer-answer-invalid",
                                                 f"the host's answer was refused by this guest: {code}: {message[:200]}"))

    def _on_path(self, now: Any, _previous: Any) -> None:
        self.path = now

    def _on_ready(self, session_id: str) -> None:
        self.session_id = session_id
        self._loop.call_soon_threadsafe(self.ready.set)

    # --- event loop side --------------------------------------------------------------
    async def run(self) -> None:
        """The session task: join, serve questions from :attr:`questions`, then mark closed."""
        # inline: ask and on_results never block, so an answer of bounded size is taken on
        # the event loop, without a worker thread's hop (protocols/knowledge-query/hooks.py)
        options = {"queries": [], "topK": TOP_K_DEFAULT, "filters": {}, "ask": self._next_question,
                   "on_results": self._on_results, "inline": True}
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                self.outcome = await join_session(
                    self.pool.home, self.pool.identity, self.target.invitation, self.target.protocol_dir,
                    self.target.spec, local=self.pool.local, mode=self.pool.mode, server_url=None, options=options,
                    interactive=True, on_ready=self._on_ready, heartbeat=self.pool.heartbeat,
                    node=self.pool.node, connect_timeout_s=self.pool.connect_timeout_s,
                    on_path=self._on_path, on_refused=self._on_refused,
                    on_copy_notice=self.pool.on_copy_notice, copy_states=self.pool.copy_states,
                    peers=self.pool.peers, person=self.pool.person.now)
        except KithError as exc:
            self.error = exc
            if isinstance(exc, TransportError) and self.session_id is None:
                self.pool.mark_down(self)
        except Exception as exc:  # noqa: BLE001 - a session's crash must not end the pool
            log.warning("pooled session to %s… failed: %s", self.key[:12], type(exc).__name__)
            self.error = KithError("internal-error", "the session failed")
        finally:
            self.closed.set()
            self.ready.set()
            self.questions.put_nowait(None)  # release a hook still waiting for a question
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(PeerGone(self.outcome, self.error, self.session_id is not None))
            self.pool._forget(self)

    def close(self, *, clean: bool) -> None:
        """End the session: ``clean`` sends ``end`` (the hook gets None), otherwise cancel."""
        if clean and not self.lock.locked():
            self.questions.put_nowait(None)
        elif self._scope is not None:
            self._scope.cancel()
        else:
            self.questions.put_nowait(None)

    async def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one flat request and wait for its ``results`` message (the caller bounds
        the wait). A wait that is cancelled poisons the session (it is cancelled).

        Raises:
            PeerGone: the session ended before answering.
        """
        async with self.lock:
            if self.closed.is_set():
                raise PeerGone(self.outcome, self.error, self.session_id is not None)
            self._waiter = self._loop.create_future()
            if self.answered:
                self.pool.stats.reused += 1
            self.questions.put_nowait(dict(request))
            try:
                message = await self._waiter
            except PeerGone:
                raise
            except BaseException:  # the caller's deadline (cancelled): never reuse this session
                if self.session_id is None:  # not even the handshake came back
                    self.pool.mark_down(self)
                self.close(clean=False)
                raise
            finally:
                self.last_used = time.monotonic()
            self.answered += 1
            return message


@dataclass
class SessionPool:
    """One iroh endpoint and at most ``max_sessions`` warm sessions, keyed by host key.

    Use as ``async with SessionPool(home, identity, local=...) as pool``; on exit every
    session is ended with ``end`` (bounded wait) and the endpoint closed.

    Attributes:
        home, identity: this node's home and identity.
        local: offline mode (relay disabled, loopback), when ``mode`` is None.
        mode: the :class:`node.transport.modes.TransportMode` of the one endpoint (``kith
            ask --relay ...``), or None: the home's ``[transport]`` table in
            ``config.toml`` (:func:`node.transport.modes.mode_from`; ``local`` is
            ``--offline``), so ``kith mcp`` and ``kith api`` peer searches never use a relay
            the owner did not choose. A bad table raises ``transport-mode-invalid`` on entry.
        max_sessions: bound on live sessions. idle_s: idle close, seconds.
        heartbeat: ``(ping_interval_s, unresponsive_s)`` or ``"default"``.
        connect_timeout_s: bound on one connection attempt, seconds (shorter than
            ``kith join``'s 15 s: a saved address that does not answer leaves time for the
            community server's newer invitation within one ask's deadline).
        end_wait_s: on exit, how long live sessions may take to end cleanly (their
            ``end`` acknowledged) before they are cancelled, seconds. The endpoint is then
            closed under :data:`node.transport.iroh.GUEST_CLOSE_TIMEOUT_S`.
        down_s: seconds an address whose new session never came up is not tried again
            (:data:`DOWN_S`; the home's background runner passes 0: it keeps its own
            backoff per peer, node/guest/outbox_task.py).
        on_copy_notice: told of each copy this pool's sessions end or find changed
            (:data:`node.guest.copies.lifecycle.Notify`; the home runner's), or None:
            stderr.
        owner: the process's :class:`node.guest.owner.Guest` that made the pool
            (:meth:`~node.guest.owner.Guest.session_pool`): its registry views are the
            pool's, so every pool of a process reads ``peers.json`` through one view. None
            (a pool built alone, tests and benchmarks): views of its own.
    """

    home: Path
    identity: Identity
    local: bool = False
    mode: Any = None
    max_sessions: int = MAX_SESSIONS
    idle_s: float = IDLE_S
    heartbeat: Any = "default"
    connect_timeout_s: float = 5.0
    end_wait_s: float = END_WAIT_S
    down_s: float = DOWN_S
    on_copy_notice: Any = None
    owner: Any = None
    stats: PoolStats = field(default_factory=PoolStats)

    def __post_init__(self) -> None:
        self.sessions: dict[str, PeerSession] = {}
        self.node: Any = None
        self._stack: AsyncExitStack | None = None
        self._tg: Any = None
        self._bind_lock = anyio.Lock()
        self._down: dict[tuple[str, str], float] = {}
        self._copies: Any = None
        self._peers: Any = None
        self._files: dict[str, Any] = {}
        #: person key → when its revocation list was last read from its server (monotonic;
        #: :func:`node.guest.cards.refresh_revocation`, at most once a minute per person)
        self.revocation_reads: dict[str, float] = {}
        #: what its sessions' handshakes last told of each host's copy grant
        #: (:data:`node.guest.copies.lifecycle.CopyStates`; a sync over this pool records it)
        self.copy_states: dict[str, dict[str, Any]] = {}

    @property
    def peers(self) -> Any:
        """This process's view of ``peers.json`` (:class:`node.guest.peerview.PeerView`: the
        owner's, or one made on first use): read again only when the file changed."""
        if self.owner is not None:
            return self.owner.peers
        if self._peers is None:
            from node.guest.peerview import PeerView

            self._peers = PeerView(self.home)
        return self._peers

    @property
    def person(self) -> Any:
        """This process's view of ``person.json``: the owner's (:attr:`node.guest.owner.Guest.person`),
        or for a pool built alone one of its own (:meth:`home_file`, loaded with
        :func:`node.trust.person.load_person`). Each session's handshake carries the chain
        and revocation list of the record read last, read again only when the file changed."""
        if self.owner is not None:
            return self.owner.person
        from node.trust.person import PERSON_FILE, load_person

        return self.home_file(PERSON_FILE, load_person)

    def home_file(self, name: str, load: Any) -> Any:
        """This process's view of ``<home>/name`` loaded with ``load``
        (:class:`node.guest.peerview.FileView`, made on first use): read again only when the
        file changed (the kept cards and revocation lists the asker reads at each question).
        The owner's view when the pool has one."""
        if self.owner is not None:
            return self.owner.home_file(name, load)
        view = self._files.get(name)
        if view is None:
            from node.guest.peerview import FileView

            view = self._files[name] = FileView(self.home, name, load)
        return view

    @property
    def copies(self) -> Any:
        """The copies this process searches, held open between questions
        (:class:`node.guest.copies.store.OpenCopies`, made on first use; closed with the
        pool)."""
        if self._copies is None:
            from node.guest.copies.store import OpenCopies

            self._copies = OpenCopies()
        return self._copies

    async def __aenter__(self) -> "SessionPool":
        from node.protocol.spec import find_protocol_dir, load_spec

        pdir = find_protocol_dir(PROTOCOL, self.home)
        if pdir is None:
            raise InvitationError("invitation-unknown-protocol", f"protocol {PROTOCOL!r} is not installed here")
        self.spec = load_spec(pdir)
        if self.mode is None:  # `kith mcp`, `kith api`: the home's [transport] table, as `kith ask` reads it
            from node.transport.modes import mode_from

            self.mode = mode_from(offline=self.local, home=self.home)
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            self._tg.start_soon(self._sweep)
        except BaseException:
            await stack.__aexit__(None, None, None)
            raise
        self._stack = stack
        return self

    async def _ensure_node(self) -> None:
        """Bind the pool's one endpoint on first use (a caller that never asks a peer
        binds nothing)."""
        from node.transport.iroh import GUEST_CLOSE_TIMEOUT_S, bind_node

        async with self._bind_lock:
            if self.node is None:
                assert self._stack is not None
                self.node = await self._stack.enter_async_context(
                    bind_node(self.identity.secret, self.spec.alpn, local=self.local, mode=self.mode,
                              close_timeout_s=GUEST_CLOSE_TIMEOUT_S))
                self.stats.endpoints += 1

    async def endpoint(self) -> Any:
        """The pool's one iroh endpoint (:class:`node.transport.iroh.IrohNode`), bound on
        first use: a holder over iroh (``iroh:<ticket>``, specs/sealed.md §7b) is dialled
        from it with the mailbox ALPN, beside the pool's knowledge-query sessions."""
        await self._ensure_node()
        return self.node

    async def __aexit__(self, *exc: Any) -> None:
        # Also when the owner was cancelled (the home's runner stopped by SIGTERM): the wait
        # for clean ends is shielded and bounded (end_wait_s), and the task group and the
        # endpoint are always exited — left open, anyio refuses to exit the owner's scope.
        try:
            for s in list(self.sessions.values()):
                s.close(clean=True)
            with anyio.move_on_after(self.end_wait_s, shield=True):
                for s in list(self.sessions.values()):
                    await s.closed.wait()
        finally:
            for s in list(self.sessions.values()):
                s.close(clean=False)
            self._tg.cancel_scope.cancel()
            assert self._stack is not None
            try:
                await self._stack.__aexit__(None, None, None)
            finally:
                self.node = None
                if self._copies is not None:  # the copies its searches held open
                    self._copies.close()

    def _forget(self, s: PeerSession) -> None:
        if self.sessions.get(s.key) is s:
            del self.sessions[s.key]

    async def _sweep(self) -> None:
        while True:
            await anyio.sleep(max(0.05, min(self.idle_s / 4, 5.0)))
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if not s.lock.locked() and now - s.last_used >= self.idle_s:
                    s.close(clean=True)

    def live(self) -> int:
        """Sessions open now."""
        return len(self.sessions)

    def _session_for(self, target: Target) -> PeerSession:
        """The live session to ``target``'s host, or a new one (no await: atomic).

        Raises:
            PeerGone: the host's address did not answer a new session within the last
                :data:`DOWN_S` seconds (``transport-connect-failed``; no new attempt yet),
                unless the caller keeps its own backoff (:data:`OWN_BACKOFF`).
        """
        key = target.invitation.host_public_key
        session = self.sessions.get(key)
        if session is None or session.closed.is_set():
            until = self._down.get((key, target.invitation.transport_info.ticket))
            if until is not None and not OWN_BACKOFF.get() and time.monotonic() < until:
                self.stats.down_skips += 1
                raise PeerGone(None, TransportError("transport-connect-failed",
                                                    "the host did not answer a new session moments ago"), False)
            session = self._open(key, target)
        return session

    def clear_down(self, target: Target) -> None:
        """Forget the down mark of ``target``'s address: its session was cancelled because
        another device of its person answered first (node/guest/cards.py), not because
        it did not answer, so the next question may dial it at once."""
        self._down.pop((target.invitation.host_public_key, target.invitation.transport_info.ticket), None)

    def mark_down(self, s: PeerSession) -> None:
        """Remember that ``s`` never came up (connect failed, or no handshake by its
        question's deadline): the same address is not tried again for :data:`DOWN_S` s."""
        if self.down_s > 0:
            keep(self._down, (s.key, s.target.invitation.transport_info.ticket), time.monotonic() + self.down_s,
                 4 * self.max_sessions)

    def _open(self, key: str, target: Target) -> PeerSession:
        if target.spec.name != PROTOCOL or target.spec.alpn != self.spec.alpn:
            raise InvitationError("ask-protocol-unsupported",
                                  f"that peer's invitation is for {target.spec.name!r}; only "
                                  f"{PROTOCOL} hosts can be asked")
        if len(self.sessions) >= self.max_sessions:
            idle = [s for s in self.sessions.values() if not s.lock.locked()]
            if not idle:
                raise SessionAborted("ask-pool-full", f"all {self.max_sessions} pooled sessions are busy")
            victim = min(idle, key=lambda s: s.last_used)
            self._forget(victim)
            victim.close(clean=True)
        s = PeerSession(self, key, target)
        self.sessions[key] = s
        self.stats.sessions_opened += 1
        self._tg.start_soon(s.run)
        return s

    def path_of(self, key: str | None) -> dict[str, Any] | None:
        """The path of the live session to host ``key``: ``{"kind", "relayUrl"}``
        (specs/transport.md §3), or None when there is none."""
        s = self.sessions.get(key or "")
        if s is None or s.path is None:
            return None
        return {"kind": s.path.kind, "relayUrl": s.path.relay_url}

    def warm(self, key: str) -> PeerSession | None:
        """The live session to host ``key``, or None (none, or it ended)."""
        s = self.sessions.get(key)
        return None if s is None or s.closed.is_set() else s

    async def ask(self, target: Target, request: dict[str, Any], *, renew: bool = True) -> dict[str, Any]:
        """Ask ``target`` one flat request (``query``, ``topK``, filters; the one request
        contract, already validated) over its warm session, opening one when needed. Who
        answers for a name — the saved host, or every awake device of a person — is decided
        above the pool (:class:`node.guest.asker.Asker`).

        Args:
            target: a verified :class:`Target` (resolved or pinned by the caller).
            request: the flat request.
            renew: when a warm session (one that had answered) ends unanswered, ask once more
                over a new session (the host ended it: restart, eviction); False lets the
                caller decide (the asker re-resolves the name first).

        Returns:
            The host's ``results`` message (``status``, ``envelope``, ``retry_after_s`` /
            ``approval_id``); the caller bounds the wait (cancel = poisoned session).

        Raises:
            PeerGone: the session ended (or never came up) before answering; ``reached``
                says whether its handshake had completed. A host that went silent with the
                question out (``peer-unresponsive``) is never asked again for it.
            KithError: ``ask-protocol-unsupported``, ``ask-pool-full``.
        """
        await self._ensure_node()
        retried = not renew
        while True:
            session = self._session_for(target)
            warm_before = session.answered > 0
            try:
                message = await session.ask(request)
            except PeerGone as gone:
                if getattr(gone.outcome, "code", None) == "peer-unresponsive":
                    raise  # went silent with the question out: gone, not a session to renew
                if warm_before and not retried:
                    retried = True  # the host ended a warm session: a new session
                    continue
                raise
            message.pop("device", None)  # named by this guest only (node/guest/asker.py)
            return message

__all__ = ["SessionPool", "PoolStats"]
