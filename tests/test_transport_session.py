"""Sessions over real iroh (loopback, relay disabled) with real processes: a SIGKILLed
`kith join` is detected by the host's heartbeat; a SIGKILLed `kith host` by the guest's;
SIGTERM on `kith host` ends live sessions with `end`; concurrency bounds per peer and
overall; the seen-nonce table survives a host restart; a hostile guest does not stall
others; the UI bundle reaches a guest without a local UI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from node.engine.session import GuestConfig, SessionEngine
from node.runtime.driver import run_session
from node.guest.guest import join_session
from node.guest.targets import check_invitation
from node.runtime.hooks import Hooks
from node.trust.identity import Identity
from node.trust.invitation import parse_invitation

from support.cli import KITH, readline as _readline
from support.homes import PROTOCOLS, node_home as _home
from support.hosts import ENV, FAST, STEADY, InProcessHost

pytestmark = pytest.mark.iroh


def test_sigkilled_join_is_detected_by_the_host_heartbeat(tmp_path):
    async def scenario():
        host = InProcessHost(_home(tmp_path, "host"), tmp_path, heartbeat=FAST)  # the subject: the host's heartbeat
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            guest_home = _home(tmp_path, "guest")
            proc = subprocess.Popen([*KITH, "--home", str(guest_home), "join", str(host.invite), "--local", "--trust",
                                     "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=ENV)
            try:
                proc.stdin.write("what is in the corpus\n")
                proc.stdin.flush()
                line = await anyio.to_thread.run_sync(_readline, proc, 30)
                assert '"action":"results"' in line.replace(" ", "")
                started = await host.wait_for(lambda e: e["event"] == "session-started")
                proc.kill()  # SIGKILL: no FIN, no QUIC close, nothing
                t_kill = time.monotonic()
                ended = await host.wait_for(lambda e: e["event"] == "session-ended", timeout=20)
                detect = time.monotonic() - t_kill
            finally:
                proc.kill()
                proc.wait()
            host.stop.set()
        return started, ended, detect

    started, ended, detect = anyio.run(scenario, backend="asyncio")
    print(f"the host's heartbeat ended the killed guest's session {detect:.2f} s after SIGKILL")
    assert ended["session_id"] == started["session_id"]
    # peer-unresponsive is the heartbeat's own code (the engine's timers): QUIC's ≈35 s idle
    # timeout would end it as a transport failure, so the code says who found it — a time
    # bound said the same and failed on a loaded machine
    assert (ended["reason"], ended["code"]) == ("aborted", "peer-unresponsive")


def test_sigkilled_host_is_detected_by_the_guest_and_sigterm_ends_sessions_cleanly(tmp_path):
    host_home = _home(tmp_path, "host")
    invite = tmp_path / "invite.json"

    def start_host() -> subprocess.Popen:
        if invite.exists():
            invite.unlink()
        proc = subprocess.Popen([*KITH, "--home", str(host_home), "host", "--local", "--json", "--invite-file",
                                 str(invite)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=ENV)
        json.loads(_readline(proc, 30))
        return proc

    async def one_guest(host_proc: subprocess.Popen, action: str):
        guest_home = tmp_path / f"guest-{action}"
        guest_home.mkdir(exist_ok=True)
        inv = parse_invitation(invite.read_text())
        pdir, spec = check_invitation(inv, guest_home)
        asked = []
        over = threading.Event()

        def ask():
            asked.append(1)
            if len(asked) == 1:
                return "first question"
            # after the first answer: do something to the host, then type nothing more until
            # the session has ended (bounded), as a user who is thinking would
            host_proc.send_signal(signal.SIGKILL if action == "kill" else signal.SIGTERM)
            over.wait(timeout=30)
            return None

        t0 = time.monotonic()
        try:
            out = await join_session(guest_home, Identity(os.urandom(32)), inv, pdir, spec, local=True,
                                     server_url=None, options={"queries": [], "ask": ask}, interactive=True,
                                     heartbeat=FAST)
        finally:
            over.set()
        return out, time.monotonic() - t0

    proc = start_host()
    try:
        out, took = anyio.run(one_guest, proc, "kill", backend="asyncio")
    finally:
        proc.kill()
        proc.wait()
    print(f"the guest's heartbeat found the SIGKILLed host in {took:.2f} s")
    assert (out.reason, out.code) == ("aborted", "peer-unresponsive")  # the heartbeat's code, not QUIC's

    proc = start_host()
    try:
        out, took = anyio.run(one_guest, proc, "term", backend="asyncio")
        rc = proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    print(f"SIGTERM on the host ended the guest's session in {took:.2f} s")
    assert out.ok, (out.reason, out.code)  # the guest received `end`, not a hang-up
    assert out.peer_end is not None and out.peer_end.get("action") == "end", out.peer_end
    assert rc == 0


def test_concurrency_bounds_per_peer_and_overall(tmp_path):
    async def scenario():
        host = InProcessHost(_home(tmp_path, "host"), tmp_path, max_sessions=3, max_sessions_per_peer=2,
                             anonymous_sessions=3)  # every guest here is anonymous
        results: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            guest_home = _home(tmp_path, "guest")
            inv, pdir, spec = await host.joinable(guest_home)
            release = anyio.Event()
            same = Identity(os.urandom(32))

            async def hold(name: str, ident: Identity):
                def ask():
                    anyio.from_thread.run(release.wait)
                    return None

                results[name] = await join_session(guest_home, ident, inv, pdir, spec, local=True, server_url=None,
                                                   options={"queries": [], "ask": ask}, interactive=True,
                                                   heartbeat=STEADY)

            async with anyio.create_task_group() as guests:
                guests.start_soon(hold, "a1", same)
                await host.wait_for(lambda e: len(host.of("session-started")) == 1)
                guests.start_soon(hold, "a2", same)
                await host.wait_for(lambda e: len(host.of("session-started")) == 2)
                # a third session of the same key: its least recently answered idle
                # session (a1, both waiting on their user) makes room at once
                results["a3"] = await join_session(guest_home, same, inv, pdir, spec, local=True, server_url=None,
                                                   options={"queries": []}, heartbeat=STEADY)
                guests.start_soon(hold, "b1", Identity(os.urandom(32)))
                guests.start_soon(hold, "d1", Identity(os.urandom(32)))
                await host.wait_for(lambda e: len(host.of("session-started")) == 5)
                await hold("c1", Identity(os.urandom(32)))  # a fourth live session overall (a2, b1, d1)
                release.set()
            host.stop.set()
        return results

    r = anyio.run(scenario, backend="asyncio")
    assert r["a3"].ok, (r["a3"].reason, r["a3"].code)
    assert not r["a1"].ok and "session-evicted" in [c for c, _m in r["a1"].remote_errors], r["a1"]
    assert (r["c1"].reason, r["c1"].code) == ("rejected", "handshake-host-busy")
    assert all(r[k].ok for k in ("a2", "b1", "d1")), {k: (v.reason, v.code) for k, v in r.items()}


def test_replayed_session_init_is_refused_even_after_a_host_restart(tmp_path):
    host_home = _home(tmp_path, "host")
    guest = Identity(os.urandom(32))
    fixed = bytes(range(32))

    async def join_with_fixed_nonce(host: InProcessHost):
        """A guest whose _session_init carries the same nonce every time (a replay)."""
        from node.transport.iroh import bind_node

        inv = parse_invitation(host.invitation)
        guest_home = tmp_path / "guest"
        guest_home.mkdir(exist_ok=True)
        _pdir, spec = check_invitation(inv, guest_home)
        async with bind_node(guest.secret, spec.alpn, local=True) as node:
            stream = await node.open_stream(await node.connect(inv.transport_info.ticket))
            engine = SessionEngine("guest", spec, public_key=guest.public_key, sign=guest.sign,
                                   random_bytes=lambda n: fixed[:n],
                                   guest=GuestConfig(remote_id=stream.remote_id, post_id=inv.post_id,
                                                     host_public_key=inv.host_public_key))
            return await run_session(stream, engine, Hooks(on_start=lambda ctx: {"action": "end"}),
                                     make_context=lambda ev: __import__("node.runtime.hooks").runtime.hooks.HookContext(
                                         role="guest", session_id=ev.session_id,
                                         peer=__import__("node.runtime.hooks").runtime.hooks.PeerInfo(ev.peer_public_key)),
                                     heartbeat=STEADY)

    async def run_host_and(fn):
        host = InProcessHost(host_home, tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            out = await fn(host)
            host.stop.set()
        return out

    async def twice(host):
        return await join_with_fixed_nonce(host), await join_with_fixed_nonce(host)

    first, second = anyio.run(run_host_and, twice, backend="asyncio")
    assert first.ok
    assert (second.reason, second.code) == ("rejected", "handshake-nonce-reused")
    # a new host process on the same home (a new invitation): the nonce is still known
    third = anyio.run(run_host_and, join_with_fixed_nonce, backend="asyncio")
    assert (third.reason, third.code) == ("rejected", "handshake-nonce-reused")
    assert oct((host_home / "seen-nonces.sqlite").stat().st_mode & 0o777) == "0o600"


def test_hostile_guests_do_not_stall_an_honest_one(tmp_path):
    """A garbage-sending guest, a silent guest and a frozen guest connect first; an honest
    guest still gets its answer while they are dealt with."""
    from node.transport.iroh import bind_node

    async def scenario():
        host = InProcessHost(_home(tmp_path, "host"), tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            guest_home = _home(tmp_path, "guest")
            inv, pdir, spec = await host.joinable(guest_home)

            connected: list[str] = []
            honest_done = anyio.Event()

            async def stay_until_the_honest_guest_is_done(name: str) -> None:
                connected.append(name)
                with anyio.move_on_after(30):
                    await honest_done.wait()

            async def garbage():
                async with bind_node(os.urandom(32), spec.alpn, local=True) as node:
                    stream = await node.open_stream(await node.connect(inv.transport_info.ticket))
                    await stream.send(b"\xff\xfe not json at all\n" + b"A" * 200_000)
                    await stay_until_the_honest_guest_is_done("garbage")

            async def silent():
                async with bind_node(os.urandom(32), spec.alpn, local=True) as node:
                    await node.open_stream(await node.connect(inv.transport_info.ticket))
                    await stay_until_the_honest_guest_is_done("silent")

            async with anyio.create_task_group() as bad:
                bad.start_soon(garbage)
                bad.start_soon(silent)
                await host.until(lambda: len(connected) == 2, timeout=30)  # both hostile peers are in
                got = []
                t0 = time.monotonic()
                try:
                    honest = await join_session(guest_home, Identity(os.urandom(32)), inv, pdir, spec, local=True,
                                                server_url=None, heartbeat=STEADY,
                                                options={"queries": ["one", "two"], "on_results": got.append})
                    # what the host had ended when the honest guest was done: a time bound
                    # said "not stalled" and failed on a loaded machine; this says it
                    ended_then = [e.get("code") for e in host.ended()]
                finally:
                    honest_done.set()
                took = time.monotonic() - t0
            host.stop.set()
        return honest, got, took, host, ended_then

    honest, got, took, host, ended_then = anyio.run(scenario, backend="asyncio")
    print(f"the honest guest was served in {took:.2f} s beside the hostile ones")
    assert honest.ok and len(got) == 2
    # not stalled behind the silent peer: when the honest guest was done, the host had not
    # timed that peer's handshake out (the timer runs on the host's ManualClock, which nobody
    # advances) — the honest guest waited out no timer; a time bound said so and failed on
    # a loaded machine
    assert "handshake-timeout" not in ended_then, ended_then
    codes = {e.get("code") for e in host.ended()}
    assert "frame-invalid-utf8" in codes or "handshake-malformed" in codes or "handshake-first-frame" in codes


def test_host_ui_reaches_a_guest_without_a_local_ui(tmp_path):
    async def scenario():
        host = InProcessHost(_home(tmp_path, "host"), tmp_path, share_ui=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            inv = parse_invitation(host.invitation)
            # the guest installed the protocol from its spec only (no ui/): same protocol_id
            guest_home = _home(tmp_path, "guest")
            mine = guest_home / "protocols" / "knowledge-query"
            mine.mkdir(parents=True)
            for f in ("spec.json", "hooks.py"):
                shutil.copy(PROTOCOLS / "knowledge-query" / f, mine / f)
            pdir, spec = check_invitation(inv, guest_home)
            assert pdir == mine
            with_ui = await join_session(guest_home, Identity(os.urandom(32)), inv, pdir, spec, local=True,
                                         server_url=None, options={"queries": ["x"]}, accept_host_ui=True,
                                         heartbeat=STEADY)
            without_flag = await join_session(guest_home, Identity(os.urandom(32)), inv, pdir, spec, local=True,
                                              server_url=None, options={"queries": ["x"]}, heartbeat=STEADY)
            shipped = PROTOCOLS / "knowledge-query"
            with_local_ui = await join_session(guest_home, Identity(os.urandom(32)), inv, shipped, spec,
                                               local=True, server_url=None, options={"queries": ["x"]},
                                               accept_host_ui=True, heartbeat=STEADY)
            host.stop.set()
        return with_ui, without_flag, with_local_ui, guest_home, host

    with_ui, without_flag, with_local_ui, guest_home, host = anyio.run(scenario, backend="asyncio")
    assert with_ui.ok and with_ui.ui_path is not None
    index = Path(with_ui.ui_path)
    assert index == guest_home / "ui" / "sessions" / with_ui.session_id / "index.html"
    ui_src = PROTOCOLS / "knowledge-query" / "ui"
    for f in ui_src.iterdir():
        assert (index.parent / f.name).read_bytes() == f.read_bytes()
    assert without_flag.ok and without_flag.ui_path is None and without_flag.ui_received == 0
    assert with_local_ui.ok and with_local_ui.ui_received == 0  # it has its own UI: nothing asked
    sent = [e.get("ui_bytes_sent", 0) for e in host.ended()]
    assert sorted(sent) == [0, 0, sum(f.stat().st_size for f in ui_src.iterdir())]
