"""The real host (:class:`node.host.host.Host`) over memory pipes, its time driven by a
:class:`node.runtime.clock.ManualClock`: fair admission without a wait, expiry on the
host's clock, a clock that jumps, a connection that dies, a failing connection that stays
its own. No iroh and no sleeps to wait out bounds (the same rules over real iroh are in
tests/test_host_admission.py and tests/test_host_serving.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any

import anyio
import pytest

from node.engine.session import GuestConfig, SessionEngine
from node.runtime.driver import run_session
from node.runtime.hooks import HookContext, PeerInfo, load_hooks
from node.host.sessions import QUIET_AFTER_S
from node.trust.identity import Identity
from node.trust.peers import PeerRegistry

from support.homes import PROTOCOLS
from support.memory import MemoryGuest as Guest, MemoryHost, connect_guest as _connect, memory_host_home as _host_home


def test_a_full_host_serves_a_fresh_guest_and_a_pinned_one_without_a_timer(tmp_path):
    """Every slot is held by quiet sessions of two throw-away keys; --evict-idle-after is
    300 s. Once those sessions are quiet (QUIET_AFTER_S on the host's clock), a fresh
    anonymous key and a pinned guest are both served at once; the evicted sessions are
    the key holding the most, and its guest is told ``session-evicted``."""
    home = _host_home(tmp_path)
    friend = Identity(os.urandom(32))
    PeerRegistry.load(home).add("friend", friend.public_key)

    async def scenario():
        host = MemoryHost(home, max_sessions=4, max_sessions_per_peer=3, anonymous_sessions=4,
                          evict_idle_after_s=300)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            big, small = Identity(os.urandom(32)), Identity(os.urandom(32))
            squatters = [await _connect(tg, host, big) for _ in range(3)] + [await _connect(tg, host, small)]
            assert host.host.table.sessions == 4
            early = await _connect(tg, host)
            assert early.outcome is not None and early.outcome.code == "handshake-host-busy"  # nobody quiet yet
            host.clock.advance(QUIET_AFTER_S)
            fresh = await _connect(tg, host)
            fresh.ask("alpha")
            await fresh.answered(1)
            pinned = await _connect(tg, host, friend)
            pinned.ask("alpha")
            await pinned.answered(1)
            await host.until(lambda: sum(s.outcome is not None for s in squatters) == 2)
            for g in [fresh, pinned, *squatters]:
                g.ask(None)
            host.stop.set()
        return host, squatters, fresh, pinned, big

    host, squatters, fresh, pinned, big = anyio.run(scenario, backend="asyncio")
    assert fresh.results[0]["status"] == "ok" and pinned.results[0]["status"] == "ok"
    evicted = [g for g in squatters if "session-evicted" in [c for c, _m in g.outcome.remote_errors]]
    assert len(evicted) == 2 and {g.ident.public_key for g in evicted} == {big.public_key}
    assert [e["peer"] for e in host.of("session-evicted")] == [big.public_key] * 2


def test_an_invitation_expires_on_the_host_clock(tmp_path):
    home = _host_home(tmp_path)

    async def scenario():
        host = MemoryHost(home, ttl_s=120)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            before = await _connect(tg, host)
            before.ask("alpha")
            await before.answered(1)
            host.clock.advance(121)
            await host.until(lambda: host.of("post-expired"))
            after = await _connect(tg, host)
            await host.until(lambda: after.outcome is not None)
            before.ask("alpha")  # an admitted session is not ended by its post's expiry
            await before.answered(2)
            before.ask(None)
            host.stop.set()
        return host, before, after

    host, before, after = anyio.run(scenario, backend="asyncio")
    assert (after.outcome.reason, after.outcome.code) == ("rejected", "handshake-post-expired")
    assert before.outcome.ok and [r["status"] for r in before.results] == ["ok", "ok"]
    assert host.of("post-expired")[0]["post_id"] == host.invitation["post_id"]


@pytest.mark.parametrize("jump", [-86400.0, 3 * 86400.0])
def test_a_wall_clock_jump_does_not_end_a_healthy_session(tmp_path, jump):
    """The wall reading jumps a day back or three days ahead (past the invitation's
    expiry): the session keeps being answered and is still listed; idle measures run on
    the monotonic reading, which did not move."""
    home = _host_home(tmp_path)

    async def scenario():
        host = MemoryHost(home, max_sessions=1, anonymous_sessions=1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            guest = await _connect(tg, host)
            guest.ask("alpha")
            await guest.answered(1)
            host.clock.jump_wall(jump)
            guest.ask("beta")
            await guest.answered(2)
            listed = host.host.table.listing()
            newcomer = await _connect(tg, host)  # the slot is still held: not idle, not evicted
            guest.ask(None)
            host.stop.set()
        return host, guest, listed, newcomer

    host, guest, listed, newcomer = anyio.run(scenario, backend="asyncio")
    assert guest.outcome.ok, (guest.outcome.reason, guest.outcome.code)
    assert len(listed) == 1 and listed[0]["queries"] == 2
    assert newcomer.outcome.code == "handshake-host-busy"
    assert not host.of("session-evicted")


def test_a_connection_that_dies_at_any_point_releases_its_slot(tmp_path):
    """One slot: a guest that hangs up before its first frame, one that hangs up
    mid-handshake and one that vanishes once ready each give the slot back; an honest
    guest is served after them."""
    from node.engine.framing import LineFramer

    home = _host_home(tmp_path)

    async def scenario():
        host = MemoryHost(home, max_sessions=1, anonymous_sessions=1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            table = host.host.table
            # 1. connects and closes at once
            stream = await host.listener.connect(Identity(os.urandom(32)).public_key)
            await stream.aclose()
            await host.until(lambda: table.connections == 0)
            # 2. sends its _session_init, reads the host's proof, hangs up
            ident = Identity(os.urandom(32))
            inv = host.invitation
            engine = SessionEngine("guest", host.spec, public_key=ident.public_key, sign=ident.sign,
                                   guest=GuestConfig(remote_id=inv["host_public_key"], post_id=inv["post_id"],
                                                     host_public_key=inv["host_public_key"]))
            stream = await host.listener.connect(ident.public_key)
            engine.initiate()
            await stream.send(engine.data_to_send())
            framer = LineFramer(1 << 20)
            with anyio.fail_after(10):
                while not framer.feed(await stream.receive()):
                    pass
            await stream.aclose()
            await host.until(lambda: table.connections == 0)
            # 3. ready, then gone without a word
            ready = Guest(host)
            async with anyio.create_task_group() as one:
                one.start_soon(ready.run)
                with anyio.fail_after(60):
                    await ready.ready.wait()
                one.cancel_scope.cancel()
            await host.until(lambda: table.connections == 0)
            honest = await _connect(tg, host)
            honest.ask("alpha")
            await honest.answered(1)
            honest.ask(None)
            host.stop.set()
        return host, honest

    host, honest = anyio.run(scenario, backend="asyncio")
    assert honest.outcome.ok and honest.results[0]["status"] == "ok"
    assert host.host.table.connections == 0 and host.host.table.sessions == 0


def test_a_failing_connection_stays_its_own(tmp_path):
    """A protocol whose hook raises for one message: that session ends with
    ``hook-failed``; a second session served at the same time is answered throughout."""
    home = _host_home(tmp_path)
    pdir = tmp_path / "echo-boom"
    shutil.copytree(PROTOCOLS / "echo", pdir)
    hooks = pdir / "hooks.py"
    text = hooks.read_text()
    hooks.write_text(text + '''

_original_on_message = on_message


def on_message(ctx, message):  # noqa: F811 - the test's failing variant
    if ctx.role == "host" and message.get("text") == "boom":
        raise RuntimeError("boom")
    return _original_on_message(ctx, message)
''')

    async def scenario():
        host = MemoryHost(home, pdir=pdir)
        outcomes: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            inv = host.invitation

            async def echo(name: str, texts: list[str]) -> None:
                ident = Identity(os.urandom(32))
                stream = await host.listener.connect(ident.public_key)
                engine = SessionEngine("guest", host.spec, public_key=ident.public_key, sign=ident.sign,
                                       guest=GuestConfig(remote_id=inv["host_public_key"], post_id=inv["post_id"],
                                                         host_public_key=inv["host_public_key"]))
                outcomes[name] = await run_session(
                    stream, engine, load_hooks(pdir),
                    make_context=lambda ev: HookContext(role="guest", session_id=ev.session_id,
                                                        peer=PeerInfo(ev.peer_public_key),
                                                        options={"texts": texts}))

            async with anyio.create_task_group() as both:
                both.start_soon(echo, "bad", ["boom"])
                both.start_soon(echo, "good", ["one", "two", "three"])
            host.stop.set()
        return host, outcomes

    host, outcomes = anyio.run(scenario, backend="asyncio")
    assert outcomes["good"].ok, (outcomes["good"].reason, outcomes["good"].code)
    assert not outcomes["bad"].ok
    assert [code for code, _m in outcomes["bad"].remote_errors] == ["hook-failed"]  # told why
    assert sorted((e["reason"], e["code"]) for e in host.of("session-ended")) == \
        [("aborted", "hook-failed"), ("completed", None)]


def test_the_host_sees_the_person_and_device_of_a_guest_with_a_chain_and_serves_an_old_guest_as_before(tmp_path):
    """Issue 22 item 1 over the real Host: a guest sending its binding chain is listed with
    its person and device name (session table listing, ``session-started``); a guest without
    one is served as today (``person`` null); a forged chain is refused before anything is
    served and counted as a failed handshake."""
    from node.trust.binding import device_link

    home = _host_home(tmp_path)
    person = os.urandom(32)
    alice_desk = Identity(os.urandom(32))
    chain = [device_link(person, alice_desk.public_key, "desk", "2026-12-01T10:00:00Z", 3)]
    forged = [{**chain[0], "device_key": Identity(os.urandom(32)).public_key}]

    peers_seen: list[PeerInfo] = []

    async def scenario():
        host = MemoryHost(home)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            real_on_start = host.host.hooks.on_start

            def on_start(ctx):  # the real hook runs; the test keeps what it was told about the peer
                peers_seen.append(ctx.peer)
                return real_on_start(ctx) if real_on_start else None

            host.host.hooks = dataclasses.replace(host.host.hooks, on_start=on_start)
            new = await _connect(tg, host, alice_desk, chain)
            new.ask("alpha")
            await new.answered(1)
            old = await _connect(tg, host)
            old.ask("alpha")
            await old.answered(1)
            listing = host.host.table.listing()
            thief = Identity(os.urandom(32))
            bad = await _connect(tg, host, thief, [{**forged[0], "device_key": thief.public_key}])
            await host.until(lambda: bad.outcome is not None)
            for g in (new, old):
                g.ask(None)
            host.stop.set()
        return host, listing, new, old, bad

    host, listing, new, old, bad = anyio.run(scenario, backend="asyncio")
    from node.trust.signing import public_key_of

    rows = {r["peer"]["key"]: r for r in listing}
    assert rows[alice_desk.public_key]["peer"]["person"] == {"key": public_key_of(person), "deviceName": "desk",
                                                             "earlier": []}
    assert rows[old.ident.public_key]["peer"]["person"] is None
    started = {e["peer"]: e for e in host.of("session-started")}
    assert started[alice_desk.public_key]["person"] == public_key_of(person)
    assert started[alice_desk.public_key]["device_name"] == "desk"
    assert started[old.ident.public_key]["person"] is None and new.results[0]["status"] == "ok"
    hooks_saw = {p.public_key: (p.person, p.device_name) for p in peers_seen}
    assert hooks_saw == {alice_desk.public_key: (public_key_of(person), "desk"), old.ident.public_key: (None, None)}
    refused = [e for e in host.of("session-ended") if e["peer"] == bad.ident.public_key]
    assert [(e["reason"], e["code"]) for e in refused] == [("rejected", "handshake-binding-forged")]
    assert not bad.results
    assert bad.ident.public_key not in started
    assert host.host.table._failures[bad.ident.public_key][0] == 1  # counted like any failed verification


def test_the_peers_watcher_polls_only_when_the_hosts_clock_reaches_its_period(tmp_path):
    """The peers watcher sleeps on the host's clock (issue 39 item 5): a pin removed while it
    sleeps is seen at its next poll — once the clock has moved a period, never before —
    and a sleep cancelled before its time is no longer counted as a sleeper."""
    from node.host.revocation import POLL_INTERVAL_S, PeersWatcher
    from node.host.sessions import SessionTable
    from node.runtime.clock import ManualClock

    key = Identity(os.urandom(32)).public_key
    PeerRegistry.load(tmp_path).add("alice", key)
    clock, events = ManualClock(), []
    watcher = PeersWatcher(tmp_path, SessionTable(), on_event=events.append, clock=clock)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher.run)
            with anyio.fail_after(10):
                while clock.sleepers() == 0:
                    await anyio.sleep(0.005)
            PeerRegistry.load(tmp_path).remove("alice")
            clock.advance(POLL_INTERVAL_S / 2)
            for _ in range(20):  # the watcher can only wake from the clock: nothing yet
                await anyio.lowlevel.checkpoint()
            assert events == []
            clock.advance(POLL_INTERVAL_S / 2)
            with anyio.fail_after(10):
                while not events:
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
        assert clock.sleepers() == 0  # the watcher's sleep, cancelled with it

    anyio.run(main, backend="asyncio")
    assert [(e["event"], e["peer"], e["cause"]) for e in events] == [("peer-revoked", key, "removed")]
