"""Issue 11 over real iroh on loopback (relay disabled), with a real `kith join` process:
`kith peers remove` / `kith peers block` on a *running* host end the peer's live session
with `session-revoked` (time measured and printed, bounded only by a deadline), a query in
flight when the block lands gets no evidence, a blocked key is refused until `unblock`, the
pairing code is equal on both sides and differs for a swapped invitation, and `kith audit`
lists the whole session."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import anyio
import pytest

from node.host.revocation import POLL_INTERVAL_S

from support.cli import KITH, kith, kith_init, readline as _readline, wait_exit
from support.homes import FIXTURE, PROTOCOLS
from support.hosts import InProcessHost, prepare_host

pytestmark = [pytest.mark.iroh, pytest.mark.slow]

#: Only a deadline (s): revocation is measured and printed, never asserted on speed.
DEADLINE_S = 20.0


_key = kith_init  # the product's heartbeat throughout: no heartbeat test here (ENV's 1 s can end a healthy join under load)


@pytest.fixture
def homes(tmp_path):
    """A host sharing the fixture corpus (`notes/` only with alice) and alice's home, pinned."""
    host = prepare_host(tmp_path, FIXTURE, ("/corpus/*.md", "public"), name="host",
                        rules=(("/corpus/notes/**", "peers", "--peer", "alice"),))
    guest = tmp_path / "alice"
    key = _key(guest)
    assert kith(host, "peers", "add", "alice", key).returncode == 0
    return {"tmp": tmp_path, "host": host, "guest": guest, "key": key}


def _interactive_join(guest: Path, invite: Path) -> subprocess.Popen:
    return subprocess.Popen([*KITH, "--home", str(guest), "join", str(invite), "--local", "--trust", "--json"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sources(msg: dict) -> list[str]:
    return [r["source"] for r in msg["envelope"]["results"]]


def _audit(home: Path, *args: str) -> list[dict]:
    r = kith(home, "audit", "--json", *args)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["skipped"] == []
    return out["records"]


async def _revoke(host: InProcessHost, homes: dict, proc: subprocess.Popen, *command: str) -> tuple:
    """``kith <command>`` at the host while ``proc`` (alice's join) is in a session, then
    wait (bounded) for the host to end that session — driving its peers watcher's polls on
    the host's ManualClock — and for ``proc`` to exit.

    Returns:
        (peers.json's mtime after the command, the host's ``session-ended`` event, seconds
        until it, ``(returncode, stdout, stderr)`` of ``proc``, seconds until it exited) —
        the times are printed, never asserted.
    """
    t0 = time.monotonic()
    r = await anyio.to_thread.run_sync(lambda: kith(homes["host"], *command))
    assert r.returncode == 0, r.stderr
    written = (homes["host"] / "peers.json").stat().st_mtime
    await host.until(host.ended, DEADLINE_S, tick_s=POLL_INTERVAL_S)  # the watcher's next poll
    ended = host.ended()[0]
    host_s = time.monotonic() - t0
    exited = await wait_exit(proc, DEADLINE_S)
    return written, ended, host_s, exited, time.monotonic() - t0


def test_peers_remove_ends_the_live_session_and_the_peer_rejoins_as_anonymous(homes):
    async def scenario():
        host = InProcessHost(homes["host"], homes["tmp"])
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            proc = _interactive_join(homes["guest"], host.invite)
            try:
                proc.stdin.write("salary bands bonus pool\n")
                proc.stdin.flush()
                first = json.loads(await anyio.to_thread.run_sync(_readline, proc, 60))
                started = await host.wait_for(lambda e: e["event"] == "session-started")
                written, ended, host_s, (rc, _out, err), guest_s = await _revoke(
                    host, homes, proc, "peers", "remove", "alice")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            # the peer may join again, but only as an anonymous peer: public sources only
            again = await anyio.to_thread.run_sync(lambda: kith(
                homes["guest"], "join", str(host.invite), "--local", "--trust", "--json",
                "--query", "salary bands bonus pool"))
            host.stop.set()
        return first, started, ended, rc, err, again, host_s, guest_s, host, written

    first, started, ended, rc, err, again, host_s, guest_s, host, written = anyio.run(scenario, backend="asyncio")
    print(f"\nkith peers remove: peers.json written -> session ended on the host in "
          f"{ended['ended_at'] - written:.2f} s; from starting the command: host {host_s:.2f} s, "
          f"guest exited {guest_s:.2f} s")
    assert started["peer_name"] == "alice" and "/corpus/notes/salary.md" in _sources(first)
    assert (ended["session_id"], ended["reason"], ended["code"]) == (started["session_id"], "aborted",
                                                                   "session-revoked")
    assert rc == 1 and "error [session-revoked]" in err, err
    (revoked,) = host.of("peer-revoked")
    assert (revoked["cause"], revoked["peer_name"], revoked["sessions_ended"]) == ("removed", "alice", 1)
    assert again.returncode == 0, again.stderr
    (msg,) = [m for m in map(json.loads, again.stdout.splitlines()) if m.get("action") == "results"]
    assert "/corpus/notes/salary.md" not in _sources(msg)
    assert host.of("session-started")[-1]["peer_name"] is None

    # the audit log lists the whole first session, with source ids and never chunk text
    sid = started["session_id"]
    recs = _audit(homes["host"], "--session", sid)
    kinds = [r["event"] for r in recs]
    assert kinds == ["session-started", "query", "results", "session-ended"], kinds
    assert recs[0]["peer"] == homes["key"] and recs[0]["peer_name"] == "alice"
    assert recs[0]["pairing_code"] == started["pairing_code"] and recs[0]["post_id"]
    assert "query" not in recs[1] and len(recs[1]["query_hmac"]) == 32
    assert recs[2]["status"] == "ok" and "/corpus/notes/salary.md" in recs[2]["sources"]
    assert (recs[3]["code"], recs[3]["peer_name"]) == ("session-revoked", "alice")
    raw = (homes["host"] / "audit.jsonl").read_text()
    assert "bonus pool" not in raw and "confidential" not in raw  # neither query nor chunk text
    everything = [r["event"] for r in _audit(homes["host"])]
    assert {"peer-removed", "peer-revoked"} <= set(everything)


SLOW_HOOKS = '''
import os, pathlib, time
exec(compile(pathlib.Path(__file__).with_name("hooks_orig.py").read_text(), "hooks_orig.py", "exec"))
_orig_on_message = on_message


def on_message(ctx, message):
    """The bundled hook, but a query containing SLOW waits (host side) until the test says
    go: the query is in flight while the peer is blocked."""
    flag = pathlib.Path(os.environ["KITH_TEST_INFLIGHT"])
    if ctx.role == "host" and "SLOW" in message.get("query", ""):
        (flag / "started").touch()
        deadline = time.monotonic() + 30
        while not (flag / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            return _orig_on_message(ctx, message)
        finally:
            (flag / "done").touch()
    return _orig_on_message(ctx, message)
'''


async def _until(path: Path, timeout: float) -> None:
    with anyio.fail_after(timeout):
        while not path.exists():
            await anyio.sleep(0.02)


def test_peers_block_cuts_a_query_in_flight_and_refuses_new_handshakes_until_unblock(homes, monkeypatch):
    # the host's own copy of knowledge-query (same spec, same protocol_id) with a slow hook
    proto = homes["host"] / "protocols" / "knowledge-query"
    shutil.copytree(PROTOCOLS / "knowledge-query", proto)
    (proto / "hooks.py").rename(proto / "hooks_orig.py")
    (proto / "hooks.py").write_text(SLOW_HOOKS)
    flag = homes["tmp"] / "inflight"
    flag.mkdir()
    monkeypatch.setenv("KITH_TEST_INFLIGHT", str(flag))

    async def scenario():
        host = InProcessHost(homes["host"], homes["tmp"])
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            proc = subprocess.Popen([*KITH, "--home", str(homes["guest"]), "join", str(host.invite), "--local",
                                     "--trust", "--json", "--query", "SLOW salary bands bonus pool"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            try:
                await _until(flag / "started", 60)  # the host is computing the answer now
                started = host.of("session-started")[0]
                written, ended, host_s, (rc, out, err), guest_s = await _revoke(
                    host, homes, proc, "peers", "block", "alice", "--note", "test")
            finally:
                (flag / "release").touch()  # let the hook finish: its answer must go nowhere
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            # the abandoned hook has returned; that nothing followed from it is read in the
            # host's audit once the host has stopped, two joins later
            await _until(flag / "done", DEADLINE_S)
            blocked = await anyio.to_thread.run_sync(lambda: kith(
                homes["guest"], "join", str(host.invite), "--local", "--trust", "--json", "--query", "sqlite"))
            r = await anyio.to_thread.run_sync(lambda: kith(homes["host"], "peers", "unblock", "alice"))
            assert r.returncode == 0, r.stderr
            after = await anyio.to_thread.run_sync(lambda: kith(
                homes["guest"], "join", str(host.invite), "--local", "--trust", "--json",
                "--query", "salary bands bonus pool"))
            host.stop.set()
        return started, ended, rc, out, err, blocked, after, host_s, guest_s, host, written

    started, ended, rc, out, err, blocked, after, host_s, guest_s, host, written = anyio.run(scenario,
                                                                                           backend="asyncio")
    print(f"\nkith peers block: peers.json written -> session ended on the host in "
          f"{ended['ended_at'] - written:.2f} s; from starting the command: host {host_s:.2f} s, "
          f"guest exited {guest_s:.2f} s")
    assert (ended["session_id"], ended["code"]) == (started["session_id"], "session-revoked")
    assert rc == 1 and "error [session-revoked]" in err, err
    assert not [line for line in out.splitlines() if '"results"' in line]  # no evidence reached the guest
    (revoked,) = host.of("peer-revoked")
    assert (revoked["cause"], revoked["sessions_ended"]) == ("blocked", 1)
    recs = _audit(homes["host"], "--session", started["session_id"])
    assert [r["event"] for r in recs] == ["session-started", "query", "session-ended"]  # no results queued
    # a blocked key's new handshake is refused; after unblock it is alice again (peers tier)
    assert blocked.returncode == 1 and "error [handshake-peer-blocked]" in blocked.stderr, blocked.stderr
    assert after.returncode == 0, after.stderr
    (msg,) = [m for m in map(json.loads, after.stdout.splitlines()) if m.get("action") == "results"]
    assert "/corpus/notes/salary.md" in _sources(msg)
    refused = [r for r in _audit(homes["host"]) if r["event"] == "handshake-refused"]
    assert [(r["peer"], r["code"]) for r in refused] == [(homes["key"], "handshake-peer-blocked")]


def test_pairing_code_is_equal_on_both_sides_and_differs_for_a_swapped_invitation(homes):
    other = homes["tmp"] / "other-host"  # someone else's host, whose invitation is handed over instead
    _key(other)
    stranger = homes["tmp"] / "stranger"  # a guest the host does not know
    stranger_key = _key(stranger)

    async def scenario():
        real = InProcessHost(homes["host"], homes["tmp"])
        swapped = InProcessHost(other, homes["tmp"])
        async with anyio.create_task_group() as tg:
            tg.start_soon(real.run)
            tg.start_soon(swapped.run)
            with anyio.fail_after(60):
                await real.ready.wait()
                await swapped.ready.wait()
            untrusted = [await anyio.to_thread.run_sync(lambda inv=inv: kith(
                stranger, "join", str(inv), "--local", "--json", "--query", "sqlite"))
                for inv in (real.invite, swapped.invite)]
            joined = await anyio.to_thread.run_sync(lambda: kith(
                stranger, "join", str(real.invite), "--local", "--trust", "--json", "--query", "sqlite"))
            real.stop.set()
            swapped.stop.set()
        return untrusted, joined, real

    untrusted, joined, real = anyio.run(scenario, backend="asyncio")
    shown = []
    for r in untrusted:  # not trusted: the code is shown (stdout event + stderr), nothing is sent
        assert r.returncode == 1 and "error [host-not-trusted]" in r.stderr
        (ev,) = [m for m in map(json.loads, r.stdout.splitlines()) if m.get("event") == "host-pairing-code"]
        assert f"pairing code: {ev['pairing_code']}" in r.stderr
        shown.append(ev["pairing_code"])
    assert joined.returncode == 0, joined.stderr
    started = real.of("session-started")[0]
    assert started["peer_name"] is None  # an unknown guest: the host's event carries the code
    host_side = json.loads(kith(homes["host"], "peers", "code", stranger_key, "--json").stdout)["pairing_code"]
    host_key = real.invitation["host_public_key"]
    guest_side = kith(stranger, "peers", "code", host_key).stdout.strip()
    assert shown[0] == started["pairing_code"] == host_side == guest_side
    assert shown[1] != host_side  # the swapped invitation reads differently aloud
    assert len(host_side.split()) == 5
