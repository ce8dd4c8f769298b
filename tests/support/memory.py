"""The real host (:class:`node.host.host.Host`) over memory pipes with a
:class:`node.runtime.clock.ManualClock`, run in the test's task group (:class:`MemoryHost`),
and a knowledge-query guest on the real engine and hooks (:class:`MemoryGuest`): admission,
expiry and eviction tested by advancing the clock, without iroh."""

from __future__ import annotations

import os
import queue
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from node.engine.session import GuestConfig, SessionEngine, SessionReady
from node.protocol.spec import load_spec
from node.runtime.clock import ManualClock
from node.runtime.driver import run_session
from node.runtime.hooks import HookContext, PeerInfo, load_hooks
from node.host.host import Host, HostOptions
from node.transport.memory import MemoryListener
from node.trust.identity import Identity, load_identity

from support.homes import KQ, public_host_home
from support.waits import until


def memory_host_home(tmp: Path) -> Path:
    """``tmp/host``: an identity, ``tmp/docs/alpha.md`` indexed, and ``/docs/**`` public."""
    return public_host_home(tmp, {"alpha.md": "# Alpha\n\nalpha beta gamma, the shared notes about alpha.\n"},
                            kb="docs")


class MemoryHost:
    """A Host on a MemoryListener with a ManualClock, run in the test's task group."""

    def __init__(self, home: Path, pdir: Path = KQ, **opts: Any) -> None:
        self.home = home
        self.clock = ManualClock()
        self.events: list[dict[str, Any]] = []
        self.invitation: dict[str, Any] = {}
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self.listener: MemoryListener | None = None
        self.spec = load_spec(pdir)
        self.pdir = pdir

        @asynccontextmanager
        async def bind(secret: bytes, _alpn: bytes):
            self.listener = MemoryListener(Identity(secret).public_key)
            try:
                yield self.listener
            finally:
                await self.listener.aclose()

        def published(inv: dict[str, Any]) -> None:
            self.invitation = inv
            self.ready.set()

        self.host = Host(home, HostOptions(protocol_dir=pdir, control=False, shutdown_grace_s=2.0, **opts),
                         load_identity(home), on_invitation=published, on_event=self.events.append,
                         warn=lambda _m: None, stop=self.stop, clock=self.clock, bind=bind)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    async def until(self, cond, timeout: float = 10.0, *, tick_s: float | None = None) -> None:
        """Wait (polling, bounded) until ``cond()`` holds; with ``tick_s``, advance the
        host's clock by that much at each poll (:func:`support.waits.until`)."""
        await until(cond, timeout, clock=self.clock, tick_s=tick_s)


class WireTap:
    """A stream end that keeps every byte it receives in :attr:`wire` (what the other end
    sent, exactly as it crossed the pipe); everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.wire = bytearray()

    async def receive(self, max_bytes: int | None = None) -> bytes:
        data = await self._stream.receive(max_bytes)
        self.wire += data
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class MemoryGuest:
    """A knowledge-query guest on the real engine and hooks that asks what it is given
    (:meth:`ask`) and stays connected, quiet, in between. :attr:`wire` holds every byte
    the host sent it (:class:`WireTap`)."""

    def __init__(self, host: MemoryHost, ident: Identity | None = None, chain: list | None = None,
                 revocation: dict | None = None, profile: dict | None = None) -> None:
        self.host = host
        self.ident = ident or Identity(os.urandom(32))
        self.chain = chain  # a binding chain to send (system frames v2), or None
        self.revocation = revocation  # a revocation list to send beside it, or None
        self.profile = profile or {}
        self.questions: queue.Queue[str | None] = queue.Queue()
        self.results: list[dict[str, Any]] = []
        self.outcome: Any = None
        self.ready = anyio.Event()
        self.wire = bytearray()

    def ask(self, text: str | None) -> None:
        """Queue a question (None: end the session)."""
        self.questions.put(text)

    async def run(self) -> None:
        inv = self.host.invitation
        stream = WireTap(await self.host.listener.connect(self.ident.public_key))
        self.wire = stream.wire
        engine = SessionEngine("guest", self.host.spec, public_key=self.ident.public_key, sign=self.ident.sign,
                               guest=GuestConfig(remote_id=inv["host_public_key"], post_id=inv["post_id"],
                                                 host_public_key=inv["host_public_key"], binding_chain=self.chain,
                                                 revocation_list=self.revocation, profile=self.profile))

        def next_question() -> str | None:
            try:
                return self.questions.get(timeout=20)
            except queue.Empty:
                return None

        def make(ev: SessionReady) -> HookContext:
            self.ready.set()
            return HookContext(role="guest", session_id=ev.session_id, peer=PeerInfo(ev.peer_public_key),
                               options={"queries": [], "ask": next_question, "on_results": self.results.append})

        try:
            self.outcome = await run_session(stream, engine, load_hooks(self.host.pdir), make_context=make)
        finally:
            self.ready.set()
            self.questions.put(None)  # a worker thread still waiting for a question returns

    async def answered(self, n: int, timeout: float = 10.0) -> None:
        with anyio.fail_after(timeout):
            while len(self.results) < n and self.outcome is None:
                await anyio.sleep(0.005)
        assert len(self.results) >= n, (self.outcome.reason, self.outcome.code) if self.outcome else "no answer"


async def connect_guest(tg, host: MemoryHost, ident: Identity | None = None, chain: list | None = None) -> MemoryGuest:
    """A :class:`MemoryGuest` started in ``tg`` and returned once its session is ready (10 s bound)."""
    guest = MemoryGuest(host, ident, chain)
    tg.start_soon(guest.run)
    with anyio.fail_after(10):
        await guest.ready.wait()
    return guest
