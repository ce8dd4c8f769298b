"""Presence follows grants (issue 23 §4, specs/transport.md §4), real iroh on loopback:
under ``presence = granted`` a blocked, removed or never-pinned key gets exactly the
refusal of an unknown post and never holds a slot (so it is never pinged); a pinned key
is served; ``open`` keeps the distinct codes."""

from __future__ import annotations

import os

import anyio
import pytest

from node.engine.session import GuestConfig, SessionEngine
from node.host.grants import has_grant, presence_from, refusal_code
from node.transport.iroh import bind_node
from node.trust.identity import Identity
from node.trust.peers import PeerRegistry

from support.homes import node_home as _home
from support.hosts import InProcessHost, raw_guest as _guest

pytestmark = pytest.mark.iroh


def test_the_grant_decision_and_the_collapsed_codes(tmp_path):
    reg = PeerRegistry.load(tmp_path)
    a, b = Identity(os.urandom(32)).public_key, Identity(os.urandom(32)).public_key
    reg.add("alice", a)
    reg.add("bob", b)
    reg.block("bob")
    reg = PeerRegistry.load(tmp_path)
    assert has_grant(reg, a) and not has_grant(reg, b) and not has_grant(reg, "0" * 64)
    assert refusal_code("granted", "handshake-peer-blocked", granted=False) == "handshake-unknown-post"
    assert refusal_code("granted", "handshake-host-busy", granted=False) == "handshake-unknown-post"
    assert refusal_code("granted", "handshake-host-busy", granted=True) == "handshake-host-busy"
    assert refusal_code("open", "handshake-peer-blocked", granted=False) == "handshake-peer-blocked"
    (tmp_path / "config.toml").write_text('[host]\npresence = "granted"\n')
    assert presence_from(None, tmp_path) == "granted" and presence_from("open", tmp_path) == "open"
    (tmp_path / "config.toml").write_text('[host]\npresence = "hidden"\n')
    with pytest.raises(Exception) as err:  # refused even when the flag overrides it
        presence_from("granted", tmp_path)
    assert err.value.code == "presence-invalid"


def _run(tmp_path, presence: str):
    host_home = _home(tmp_path, "host")
    pinned, blocked, removed, stranger = (Identity(os.urandom(32)) for _ in range(4))
    reg = PeerRegistry.load(host_home)
    reg.add("pinned", pinned.public_key)
    reg.add("blocked", blocked.public_key)
    reg.add("removed", removed.public_key)
    reg.block("blocked")
    reg.remove("removed")

    async def scenario():
        host = InProcessHost(host_home, tmp_path, presence=presence)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            inv, _pdir, spec = await host.joinable(_home(tmp_path, "guest"))
            out = {"unknown-post": await _guest(inv, spec, pinned, post_id="0" * 32)}
            for name, who in (("blocked", blocked), ("removed", removed), ("stranger", stranger),
                              ("pinned", pinned)):
                out[name] = await _guest(inv, spec, who)
            host.stop.set()
        return host, out

    return anyio.run(scenario, backend="asyncio")


def test_under_granted_a_peer_without_a_grant_is_told_what_an_unknown_post_is(tmp_path):
    host, out = _run(tmp_path, "granted")
    unknown = out["unknown-post"]
    assert (unknown.reason, unknown.code) == ("rejected", "handshake-unknown-post")
    for name in ("blocked", "removed", "stranger"):
        o = out[name]
        assert (o.reason, o.code, o.message) == (unknown.reason, unknown.code, unknown.message), name
        assert o.session_id is None
    assert out["pinned"].ok, (out["pinned"].reason, out["pinned"].code)
    refused = [e for e in host.of("session-refused") if e.get("reason") == "no-grant"]
    assert len(refused) == 3 and {e["code"] for e in refused} == {"handshake-unknown-post"}
    assert len(host.of("session-started")) == 1  # only the pinned guest ever held a session


async def _raw(inv, spec, who: Identity, post_id: str, before_stream=None) -> bytes:
    """Every byte the host sends a guest whose real engine opened with ``_session_init``
    naming ``post_id``, until the host closes the stream (bounded). ``before_stream``: an
    async callable run between the QUIC connection and the stream (the host is waiting)."""
    async with bind_node(who.secret, spec.alpn, local=True) as node:
        conn = await node.connect(inv.transport_info.ticket)
        if before_stream is not None:
            await before_stream()
        stream = await node.open_stream(conn)
        engine = SessionEngine("guest", spec, public_key=who.public_key, sign=who.sign,
                               guest=GuestConfig(remote_id=stream.remote_id, post_id=post_id,
                                                 host_public_key=inv.host_public_key))
        engine.initiate()
        await stream.send(engine.data_to_send())
        got = b""
        with anyio.fail_after(10):
            while chunk := await stream.receive():
                got += chunk
        return got


def _granted_host(tmp_path):
    host_home = _home(tmp_path, "host")
    pinned, blocked = Identity(os.urandom(32)), Identity(os.urandom(32))
    reg = PeerRegistry.load(host_home)
    reg.add("pinned", pinned.public_key)
    reg.add("blocked", blocked.public_key)
    reg.block("blocked")
    return InProcessHost(host_home, tmp_path, presence="granted"), pinned, blocked


def test_a_blocked_peer_gets_the_unknown_post_bytes_exactly_and_nothing_else(tmp_path):
    """On the wire, not just the parsed code: what a blocked key and a stranger naming the
    live post receive is byte for byte what a pinned key naming a post that does not exist
    receives from the engine — one ``_session_reject`` frame, then the end of the stream (no
    ``_ping``, no other frame)."""
    host, pinned, blocked = _granted_host(tmp_path)

    async def scenario():
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            inv, _pdir, spec = await host.joinable(_home(tmp_path, "guest"))
            out = (await _raw(inv, spec, pinned, "0" * 32), await _raw(inv, spec, blocked, inv.post_id),
                   await _raw(inv, spec, Identity(os.urandom(32)), inv.post_id))
            host.stop.set()
        return out

    unknown, blocked_got, stranger_got = anyio.run(scenario, backend="asyncio")
    assert blocked_got == stranger_got == unknown
    assert unknown.count(b"\n") == 1 and b'"_session_reject"' in unknown and b'"handshake-unknown-post"' in unknown
    assert b"_ping" not in blocked_got


def test_a_blocked_peer_reaching_a_stopping_host_still_gets_the_unknown_post_refusal(tmp_path):
    """A blocked key whose stream arrives while the host is shutting down is told what an
    unknown post is told, not ``session-shutdown`` (which says the host is there and
    stopping)."""
    host, _pinned, blocked = _granted_host(tmp_path)

    async def scenario():
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            inv, _pdir, spec = await host.joinable(_home(tmp_path, "guest"))

            async def stop_host():  # the connection is accepted; the host stops before the stream
                await host.until(lambda: host.host.table.pending >= 1, timeout=10)
                host.stop.set()
                await host.until(lambda: host.host.session_stop.is_set(), timeout=10)

            return await _raw(inv, spec, blocked, inv.post_id, before_stream=stop_host)

    got = anyio.run(scenario, backend="asyncio")
    assert b'"handshake-unknown-post"' in got and b"session-shutdown" not in got, got


def test_open_presence_keeps_the_distinct_codes(tmp_path):
    _host, out = _run(tmp_path, "open")
    assert out["blocked"].code == "handshake-peer-blocked"
    assert out["removed"].ok and out["stranger"].ok and out["pinned"].ok


def test_an_unlisted_post_is_fetchable_and_found_by_host_key_but_not_browsed(tmp_path):
    """`kith host --unlisted`'s publish (``listed=false``) on a real community server:
    `get` by post_id works, a browse by the host's key finds it (a pinned peer's lookup),
    a plain browse, by protocol or by tag does not; a listed post of the same host is."""
    from node.community.client import CommunityClient
    from node.community.ratelimit import RateLimit, RateLimits
    from node.community.server import run_server_in_thread

    from support.community import invitation

    host = Identity(os.urandom(32))
    limits = RateLimits(per_key=RateLimit(0, 1), per_address=RateLimit(0, 1))

    async def scenario(url: str):
        async with CommunityClient(url, host) as client:
            hidden = await client.publish_invitation(invitation(host, tags=["kith"]), unlisted=True)
            shown = await client.publish_invitation(invitation(host, tags=["kith"]))
            got = await client.get_invitation(hidden.post_id)
            ids = lambda page: [p["post_id"] for p in page["invitations"]]  # noqa: E731
            return (hidden, shown, got, ids(await client.browse()), ids(await client.browse(tag="kith")),
                    ids(await client.browse(protocol="knowledge-query")), ids(await client.browse(host=host.public_key)))

    with run_server_in_thread(tmp_path / "srv" / "community.sqlite3", rate_limits=limits) as url:
        hidden, shown, got, plain, by_tag, by_protocol, by_host = anyio.run(scenario, url, backend="asyncio")
    assert got.post_id == hidden.post_id
    assert plain == by_tag == by_protocol == [shown.post_id]
    assert set(by_host) == {hidden.post_id, shown.post_id}


@pytest.mark.iroh
def test_kith_host_under_granted_warns_of_a_person_pin_none_of_whose_devices_it_has_seen(tmp_path):
    """A new user pins a person with ``--devices`` and hosts with ``--presence granted``:
    every device of that person is refused as an unknown post until one has joined once
    (specs/transport.md §4). The host says so at start, naming the pin, and does not name
    a person pin whose device it has seen."""
    import subprocess

    from node.trust.peers import note_device

    from support.cli import KITH, lines_until as _lines_until, stop as _stop
    from support.hosts import ENV

    home = _home(tmp_path, "host")
    for name in ("alice", "bob"):
        subprocess.run([*KITH, "--home", str(home), "peers", "add", name, Identity(os.urandom(32)).public_key, "--devices"],
                       env=ENV, check=True, capture_output=True, timeout=60)
    registry = PeerRegistry.load(home)
    note_device(registry, registry.peers["bob"], Identity(os.urandom(32)).public_key, "desk")
    proc = subprocess.Popen([*KITH, "--home", str(home), "host", "--offline", "--presence", "granted",
                             "--invite-file", str(tmp_path / "inv.json")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        # the first line only: the warnings come before it (before binding), and a pipe read
        # by readline may buffer later lines where select no longer sees them
        started = _lines_until(proc, proc.stdout, lambda line: line.startswith("Hosting"), 60)
    finally:
        _stop(proc)
    err = proc.stderr.read()
    assert started[-1].startswith("Hosting")
    assert "person pin 'alice'" in err and "--presence open" in err and "Traceback" not in err
    assert "'bob'" not in err


@pytest.mark.iroh
def test_the_owner_reads_why_a_guest_without_a_grant_was_refused(tmp_path):
    """Under ``--presence granted`` a stranger is told the unknown-post refusal; the host's
    owner reads that code and why (no grant), not an unknown post alone."""
    import subprocess

    from support.cli import KITH, lines_until as _lines_until, stop as _stop
    from support.hosts import ENV

    home, guest = _home(tmp_path, "host"), _home(tmp_path, "guest")
    invite = tmp_path / "inv.json"
    proc = subprocess.Popen([*KITH, "--home", str(home), "host", "--offline", "--presence", "granted",
                             "--invite-file", str(invite)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        _lines_until(proc, proc.stdout, lambda line: line.startswith("Hosting"), 60)
        joined = subprocess.run([*KITH, "--home", str(guest), "join", str(invite), "--offline", "--trust",
                                 "--query", "hello"], capture_output=True, text=True, env=ENV, timeout=120)
    finally:
        _stop(proc)
    # the refusal is reported before the guest hears it; read what the host printed, once stopped
    refused = next(line for line in proc.stderr.read().splitlines() if line.startswith("refused a session"))
    assert joined.returncode == 1 and "error [invitation-gone]" in joined.stderr  # as for any post gone
    assert "the host said handshake-unknown-post" in joined.stderr
    assert "handshake-unknown-post" in refused and "no grant" in refused and "--presence granted" in refused
