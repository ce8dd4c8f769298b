"""The real host over iroh on loopback (relay disabled): :class:`InProcessHost` runs
:class:`node.host.host.Host` in the test's event loop with a ManualClock,
:class:`HostProcess` runs ``kith host --local --json`` as a process; :func:`raw_guest` is a
guest on the real engine that the test steers (ends at once, claims another key, names
another post, hangs up after the proof)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator

import anyio

from node.engine.session import GuestConfig, SessionEngine, State
from node.runtime.clock import ManualClock
from node.runtime.driver import run_session
from node.runtime.hooks import HookContext, Hooks, PeerInfo
from node.host.host import Host, HostOptions
from node.transport.iroh import bind_node
from node.trust.identity import Identity, load_identity

from support.cli import KITH, kith, next_line, pending
from support.waits import answered_and_acked, until, wait_for

#: heartbeat (ping every 0.2 s, unresponsive after 1 s) for tests about the heartbeat
FAST = (0.2, 1.0)
#: For tests that are not about the heartbeat: a loaded machine can starve one event loop
#: for more than FAST's 1 s, which would end a healthy session as peer-unresponsive.
STEADY = (1.0, 15.0)
#: the environment of a `kith` process that should use FAST's heartbeat
ENV = {**os.environ, "KITH_TEST_HEARTBEAT": "0.2,1.0"}
#: How long (s) a wait on a host may take before the test fails: the bound a 2-core machine
#: at load 6-9 (the suite beside other work) stays under, where 15-30 s did not. A bound is
#: a failure's time, never a passing test's: it costs nothing while the host is on time.
WAIT_S = 60.0


class InProcessHost:
    """The real :class:`node.host.host.Host` in this event loop, over iroh on loopback,
    with a :class:`node.runtime.clock.ManualClock` the test advances (``clock``; pass
    ``clock=SYSTEM_CLOCK`` for real time); ``events`` collects what it reports and
    ``host`` is the running Host (its session table, posts). Its sessions' heartbeat is
    :data:`STEADY` (they run on the real clock); a test about the heartbeat passes
    ``heartbeat=FAST``."""

    def __init__(self, home: Path, tmp: Path, clock: Any = None, **opts: Any) -> None:
        self.home = home
        self.clock = clock if clock is not None else ManualClock()
        self.invite = tmp / f"invite-{os.urandom(3).hex()}.json"
        self.opts = HostOptions(**{"local": True, "invite_file": self.invite, "heartbeat": STEADY,
                                   **opts})
        self.events: list[dict] = []
        self.stop = anyio.Event()
        self.ready = anyio.Event()
        self.invitation: dict = {}

    async def run(self) -> None:
        def on_inv(inv):
            self.invitation = inv
            self.ready.set()

        self.host = Host(self.home, self.opts, load_identity(self.home), on_invitation=on_inv,
                         on_event=self.events.append, warn=lambda _m: None, stop=self.stop, clock=self.clock)
        await self.host.run()

    async def joinable(self, guest_home: Path) -> tuple[Any, Path, Any]:
        """Once the host is ready (:data:`WAIT_S` at most), its invitation as the guest at
        ``guest_home`` reads and checks it: ``(invitation, protocol folder, spec)``, what
        :func:`node.guest.guest.join_session` takes."""
        from node.guest.targets import check_invitation
        from node.trust.invitation import parse_invitation

        with anyio.fail_after(WAIT_S):
            await self.ready.wait()
        inv = parse_invitation(self.invitation)
        pdir, spec = check_invitation(inv, guest_home)
        return inv, pdir, spec

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def ended(self) -> list[dict]:
        return self.of("session-ended")

    async def until(self, cond, timeout: float = WAIT_S, *, tick_s: float | None = None) -> None:
        """Wait (polling, bounded) until ``cond()`` holds: a condition, not a fixed sleep.
        With ``tick_s``, the host's ManualClock is advanced by that much at each poll, so
        the host's background machines (peers watcher, view warmer, …) run again
        (:func:`support.waits.until`)."""
        await until(cond, timeout, clock=self.clock, tick_s=tick_s, every_s=0.01)

    async def wait_for(self, pred, timeout: float = WAIT_S) -> dict:
        with anyio.fail_after(timeout):
            while True:
                for e in self.events:
                    if pred(e):
                        return e
                await anyio.sleep(0.02)


class HostProcess:
    """A `kith host --local --json` subprocess; its first stdout line is the invitation
    (``invitation``). Raises AssertionError when it does not start."""

    def __init__(self, home: Path, *args: str) -> None:
        self.proc = subprocess.Popen([*KITH, "--home", str(home), "host", "--local", "--json", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL)
        first = json.loads(self.readline(WAIT_S))
        if "post_id" not in first:  # e.g. {"error": {"code": "home-in-use", ...}}
            self.proc.kill()
            raise AssertionError(f"kith host did not start: {first}")
        self.invitation = first

    def readline(self, timeout: float) -> str:
        """The host's next stdout line (kills it and fails when none comes in ``timeout`` s
        or it exited)."""
        line = next_line(self.proc.stdout, timeout)
        if line is None:
            self.proc.kill()
            raise AssertionError(f"host printed nothing in {timeout}s; stderr: {self.proc.stderr.read()}")
        assert line, f"host exited: {self.proc.stderr.read()}"
        return line

    def stop(self) -> tuple[int, str, str]:
        """SIGINT, then ``(returncode, stdout, stderr)`` (stdout from the first line not yet
        read by :meth:`readline`); fails when it takes over :data:`WAIT_S`."""
        self.proc.send_signal(signal.SIGINT)
        try:
            out, err = self.proc.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"host did not stop within {WAIT_S:g} s of SIGINT")
        return self.proc.returncode, pending(self.proc.stdout) + out, err


def prepare_host(tmp: Path, corpus: Path, glob_tier: tuple[str, str] | None = None, *, name: str = "host-home",
                 rules: tuple[tuple[str, ...], ...] = ()) -> Path:
    """``tmp/<name>`` initialised, ``corpus`` indexed and synced, and one policy rule
    (``/<corpus name>/**`` public unless ``glob_tier`` says otherwise), then each of
    ``rules`` (the arguments of one more ``kith policy set``), all through `kith`."""
    home = tmp / name
    assert kith(home, "init").returncode == 0
    glob, tier = glob_tier or (f"/{corpus.name}/**", "public")
    for args in (("index", "add", str(corpus)), ("index", "sync"), ("policy", "set", glob, tier),
                 *(("policy", "set", *rule) for rule in rules)):
        r = kith(home, *args, timeout=600)
        assert r.returncode == 0, (args, r.stderr)
    return home


#: a question :func:`notes_host` answers with its one result
NOTES_QUESTION = "when does the staging server restart"


def notes_host(tmp: Path) -> Path:
    """:func:`prepare_host` with a one-file corpus (``/docs/notes.md``: "The staging server
    restarts at noon."), shared public: a host whose every answer is one known result."""
    docs = tmp / "docs"
    docs.mkdir()
    (docs / "notes.md").write_text("# Notes\n\nThe staging server restarts at noon.\n")
    return prepare_host(tmp, docs)


def card_posted(home: Path, url: str) -> str:
    """``kith host --server URL --mailbox`` for ``home``, run until its person's card (naming
    the mailbox) is on the server at ``url`` (30 s at most), then stopped: a host that was up
    once. Returns the person key."""
    import httpx

    person = json.loads(kith(home, "device", "list", "--json").stdout)["person_key"]
    first = HostProcess(home, "--server", url, "--mailbox")
    try:
        wait_for("the host's card", lambda: httpx.get(f"{url}/api/v1/cards/{person}", timeout=10)
                 .status_code == 200, timeout_s=30)
    finally:
        first.stop()
    return person


def woken_to_answer(home: Path, url: str, held: Any) -> float:
    """``kith host --server URL --mailbox`` for ``home``, run until it answered and acked the
    questions the holder at ``url`` keeps now (:func:`support.waits.answered_and_acked`: an
    answer kept, none of those ids left; 60 s at most), then stopped.

    Args:
        held: ``() -> [record id]`` the holder keeps (:func:`support.community.record_ids`).

    Returns:
        seconds from the host's start to its answer at the holder.
    """
    import time

    question_ids = held()
    t0 = time.monotonic()
    host = HostProcess(home, "--server", url, "--mailbox")
    try:  # the question acked after its answer was left: one record, another id
        wait_for("the sealed answer", answered_and_acked(held, question_ids), timeout_s=60, every_s=0.05)
        return time.monotonic() - t0
    finally:
        host.stop()


@contextlib.contextmanager
def sealed_answerer(home: Path, **door: Any) -> Iterator[Any]:
    """The ``on_question`` a host at ``home`` takes sealed questions with
    (:func:`node.host.sealed_host.sealed_on_question`: admitted by :func:`home_door` with
    ``door``'s options, answered from its knowledge, written to its audit log), both opened
    here and closed at exit."""
    from node.host.host import open_knowledge
    from node.host.sealed_host import sealed_on_question
    from node.trust.audit_log import AuditLog

    knowledge = open_knowledge(home, lambda _: None)
    audit = AuditLog(home)
    try:
        yield sealed_on_question(home_door(home, **door), knowledge, audit=audit)
    finally:
        audit.close()
        knowledge.close()


def home_door(home: Path, *, peers_only: bool = False, presence: str = "open") -> Any:
    """The :class:`node.host.doorkeeper.Doorkeeper` `kith host` builds for ``home`` (no
    sessions: a sealed question takes no slot), as the sealed tests admit askers with."""
    from node.host.doorkeeper import Doorkeeper
    from node.host.revocation import PeersWatcher
    from node.trust.rotation import RotationLedger

    return Doorkeeper(table=None, peers=PeersWatcher(home, None, on_event=lambda _ev: None),
                      rotations=RotationLedger.load(home), presence=presence, peers_only=peers_only)


async def raw_guest(inv, spec, ident: Identity, *, claimed: Identity | None = None, post_id: str | None = None,
                    on_proof=None, hang_up_after_proof: bool = False):
    """A guest on the real engine over iroh that ends with ``end`` at once (returns the
    :class:`~node.runtime.driver.SessionOutcome`), or hangs up right after the host's proof,
    never sending ``_session_ready`` (returns the engine's :class:`State`).

    Args:
        inv: the parsed invitation; spec: its protocol spec.
        ident: the QUIC key; claimed: the key it says it has in ``_session_init`` (≠ its
            QUIC key → a failed handshake); post_id: the post it names (the invitation's).
    """
    claimed = claimed or ident
    async with bind_node(ident.secret, spec.alpn, local=True) as node:
        stream = await node.open_stream(await node.connect(inv.transport_info.ticket))
        engine = SessionEngine("guest", spec, public_key=claimed.public_key, sign=claimed.sign,
                               guest=GuestConfig(remote_id=stream.remote_id, post_id=post_id or inv.post_id,
                                                 host_public_key=inv.host_public_key))
        if hang_up_after_proof:
            engine.initiate()
            await stream.send(engine.data_to_send())
            with anyio.fail_after(10):
                while engine.state is State.HANDSHAKE:
                    data = await stream.receive()
                    if not data:
                        break
                    engine.receive_data(data)
            state = engine.state
            await stream.aclose()
            return state
        return await run_session(stream, engine, Hooks(on_start=lambda ctx: {"action": "end"}),
                                 make_context=lambda ev: HookContext(role="guest", session_id=ev.session_id,
                                                                     peer=PeerInfo(ev.peer_public_key)),
                                 on_proof=on_proof, heartbeat=STEADY)
