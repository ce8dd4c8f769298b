"""Ending a copy (issue 33 item 4; specs/copies.md §5, specs/session.md §4.2): the host's
``_session_proof`` carries the copy grant state to a guest that advertised ``copy_state_v1``
(the sans-I/O engine over an in-memory pipe); the guest deletes a copy no longer granted at
any session and syncs a changed one at the runner's next step; a copy past its ``until`` is
deleted by the peer's own node (``copy-expired``); ``kith peers remove`` and a revoked
device delete the copies held from that host."""

from __future__ import annotations

import json
import time

import anyio
import pytest

from node.common.errors import KithError
from node.common.grants import until_time
from node.engine.session import SessionClosed, SessionReady
from node.policy.store import Policy
from node.protocol.spec import load_spec
from node.guest.copies.lifecycle import end_copies, expire_copies, stale, take_copy_state
from node.guest.copies.search import search_copy
from node.guest.copies.store import CopyStore, list_copies, reindex_copies
from node.guest.copies.sync import sync_copy
from node.guest.copies.task import CopiesTask
from node.runtime.clock import ManualClock, rfc3339
from node.trust.peers import PeerRegistry

from support.cli import invoke
from support.engines import EnginePair
from support.homes import PROTOCOLS, node_home

from support.copies import copy_asker as _asker, copy_host, copy_server as _server

@pytest.fixture()
def host(tmp_path):
    """A copy-granting host home (:func:`support.copies.copy_host`)."""
    return copy_host(tmp_path)


STATE = {"granted": True, "stamp": "ab" * 16, "until": None}


@pytest.fixture(scope="module")
def kq():
    return load_spec(PROTOCOLS / "knowledge-query")


# --- the handshake field (engine, in memory) ----------------------------------------------

def _pair(spec, host_id, guest_id, *, want: bool, state=STATE, calls=None):
    pair = EnginePair(spec, host_id, guest_id)

    def copy_state(person_capable):
        if calls is not None:
            calls.append(person_capable)
        return state
    pair.host._hs.config.copy_state = copy_state
    pair.guest._hs.config.want_copy_state = want
    return pair


def test_the_proof_carries_the_copy_state_to_a_guest_that_asked(kq, host_id, guest_id):
    calls: list = []
    pair = _pair(kq, host_id, guest_id, want=True, calls=calls)
    pair.handshake()
    (ready,) = pair.of(pair.guest_events, SessionReady)
    assert ready.peer_copy_state == STATE and calls == [False]  # no person chain advertised
    assert "copy_state_v1" in pair.of(pair.host_events, SessionReady)[0].peer_capabilities


def test_a_guest_that_did_not_advertise_never_receives_it(kq, host_id, guest_id):
    calls: list = []
    pair = _pair(kq, host_id, guest_id, want=False, calls=calls)
    pair.guest.initiate()
    init = pair.guest.data_to_send()
    assert b"copy_state_v1" not in init
    pair.host_events += pair.host.receive_data(init)
    proof = pair.host.data_to_send()
    assert b"copy_state" not in proof and calls == []  # never asked, never decided
    pair.guest_events += pair.guest.receive_data(proof)
    pair.guest_events += pair.guest.confirm_ready()
    pair.pump()
    assert pair.of(pair.guest_events, SessionReady)[0].peer_copy_state is None


def test_a_copy_state_the_guest_did_not_ask_for_is_refused(kq, host_id, guest_id):
    pair = _pair(kq, host_id, guest_id, want=False)
    pair.guest.initiate()
    pair.host.receive_data(pair.guest.data_to_send())
    proof = json.loads(pair.host.data_to_send().decode().splitlines()[0])
    proof["copy_state"] = STATE  # a host (or a man in the middle of nothing: QUIC) adds it unasked
    pair.guest_events += pair.guest.receive_data((json.dumps(proof) + "\n").encode())
    (closed,) = pair.of(pair.guest_events, SessionClosed)
    assert closed.code == "handshake-malformed"


def test_a_host_that_cannot_tell_says_nothing(kq, host_id, guest_id):
    pair = _pair(kq, host_id, guest_id, want=True, state=None)
    pair.handshake()
    assert pair.of(pair.guest_events, SessionReady)[0].peer_copy_state is None


# --- the host's state --------------------------------------------------------------------

def test_the_state_changes_when_the_grant_or_a_tier_changes(host):
    home, _ = host
    p = Policy.load(home)
    first = p.copy_state("bea")
    assert first["granted"] is True and first["until"] is None and len(first["stamp"]) == 32
    assert Policy.load(home).copy_state("bea") == first  # stable while nothing changes
    assert p.copy_state(None)["granted"] is False and p.copy_state("cat")["granted"] is False
    p.set("/kb/deploy.md", "private")  # a tier narrows what may be kept
    narrowed = p.copy_state("bea")
    assert narrowed["granted"] is True and narrowed["stamp"] != first["stamp"]
    p.set_copy("/kb/sqlite.md", "bea", until="2030-01-01T00:00:00Z")
    assert p.copy_state("bea")["until"] is None  # /kb/** never ends: neither does the copy
    p.unset_copy("/kb/**", "bea")
    assert p.copy_state("bea")["until"] == "2030-01-01T00:00:00Z"
    p.set_copy("/kb/deploy.md", "bea", until="2031-01-01T00:00:00Z")
    assert p.copy_state("bea")["until"] == "2031-01-01T00:00:00Z"  # the latest end in force
    p.unset_copy("/kb/sqlite.md", "bea")
    p.unset_copy("/kb/deploy.md", "bea")
    assert p.copy_state("bea")["granted"] is False


def test_the_end_of_a_copy_is_the_earliest_end_of_what_admits_the_peer(host):
    """issue 42 item 3: an `until` on the group membership that grants the copy, or on a
    time-limited override that admits the peer, travels with the copy (it said "no end
    set"); the pin's own end is the host's bound (test below)."""
    home, _ = host
    p = Policy.load(home)
    p.unset_copy("/kb/**", "bea")
    p.add_members("team", ["bea"], until="2030-06-01T00:00:00Z")
    p.set_copy("/kb/**", "@team")  # the grant never ends; bea's membership does
    assert p.copy_state("bea")["until"] == "2030-06-01T00:00:00Z"
    p.set_copy("/kb/sqlite.md", "@team", until="2030-03-01T00:00:00Z")
    assert p.copy_state("bea")["until"] == "2030-06-01T00:00:00Z"  # the longest grant, bounded by the membership
    p.set("/kb/notes/**", "public", for_peer="bea", until="2029-01-01T00:00:00Z")  # an override that admits
    assert p.copy_state("bea")["until"] == "2029-01-01T00:00:00Z"
    p.set("/kb/ask.md", "private", for_peer="bea", until="2028-01-01T00:00:00Z")  # one that narrows: no bound
    assert p.copy_state("bea")["until"] == "2029-01-01T00:00:00Z"


def test_the_host_bounds_the_copy_by_the_pin_and_tells_a_removed_pin_it_is_not_granted(host):
    """The handshake's state for a pinned key ends no later than the pin (`kith peers add
    --until`); a key no longer pinned that shows a person chain was told nothing — every
    home has a person key — and kept its copy: it is told `granted: false` unless some
    person pin here holds a copy grant."""
    from types import SimpleNamespace

    from node.host.connection import Connection

    home, _ = host
    p = Policy.load(home)

    def state(pinned, persons=()):
        registry = SimpleNamespace(peers={r.name: r for r in persons})
        conn = SimpleNamespace(visit=SimpleNamespace(pinned=pinned, registry=registry),
                               answering=SimpleNamespace(copy_state=p.copy_state))
        return Connection.copy_state(conn, person_capable=pinned is None)

    bea = SimpleNamespace(name="bea", until="2027-01-01T00:00:00Z", devices=False)
    assert state(bea)["until"] == "2027-01-01T00:00:00Z" and state(bea)["granted"] is True
    assert state(SimpleNamespace(name="bea", until=None, devices=False))["until"] is None
    removed = state(None)
    assert removed is not None and removed["granted"] is False  # no person pin holds a grant here
    assert state(None, [SimpleNamespace(name="cat", devices=True)])["granted"] is False
    assert state(None, [SimpleNamespace(name="bea", devices=True)]) is None  # bea's person may be it


# --- the guest acts on it ----------------------------------------------------------------

def _synced(tmp_path, home, told=None):
    """bea's home with a synced copy of ``home`` under the name alice (told ``told`` by a
    handshake before the sync, as a pooled session's would)."""
    server, corpus, key = _server(home)
    guest = node_home(tmp_path, "bea")
    states: dict = {}  # the session pool's (SessionPool.copy_states)
    if told is not None:
        take_copy_state(guest, key, told, states=states)
    report = anyio.run(lambda: sync_copy(guest, "alice", _asker(server), key, told=states.get))
    corpus.close()
    assert report["status"] == "ok" and report["documents"] == 2
    return guest, key


def test_not_granted_in_a_handshake_deletes_the_copy_and_says_so(host, tmp_path, capsys):
    home, _ = host
    guest, key = _synced(tmp_path, home, told=STATE)
    assert CopyStore(guest, "alice").exists()
    take_copy_state(guest, "11" * 32, {**STATE, "granted": False})  # another host's word: nothing
    assert CopyStore(guest, "alice").exists()
    notices = take_copy_state(guest, key, {**STATE, "granted": False})
    assert not CopyStore(guest, "alice").dir.exists()
    assert [(n["peer"], n["removed"], n["via"]) for n in notices] == [("alice", 2, "handshake")]
    assert "alice's copy was deleted (2 document(s)): its host no longer grants it" in capsys.readouterr().err


def test_a_changed_stamp_makes_the_copy_stale_until_synced(host, tmp_path):
    home, _ = host
    guest, key = _synced(tmp_path, home, told=STATE)
    store = CopyStore(guest, "alice")
    assert store.load()["stamp"] == STATE["stamp"] and not stale(store)
    told: list = []
    states: dict = {}  # the session pool's, as its next handshake fills it
    take_copy_state(guest, key, {**STATE, "stamp": "cd" * 16}, notify=told.append, states=states)
    assert stale(store) and told == [{"peer": "alice", "kind": "changed"}]
    server, corpus, _ = _server(home)
    anyio.run(lambda: sync_copy(guest, "alice", _asker(server), key, told=states.get))
    corpus.close()
    assert not stale(store) and store.load()["stamp"] == "cd" * 16


def test_a_sync_over_an_older_session_keeps_the_newer_grant_another_process_was_told(host, tmp_path):
    """A sync records what its own session's handshake said of the grant; when another
    process's handshake told a newer stamp meanwhile (the owner narrowed the grant), that
    stamp stays in grant.json, so the copy is still stale and is synced again under it."""
    home, _ = host
    guest, key = _synced(tmp_path, home, told=STATE)
    store = CopyStore(guest, "alice")
    states: dict = {}  # the pool's session: its handshake a minute ago told the old stamp
    take_copy_state(guest, key, STATE, states=states, now=lambda: time.time() - 60)
    newer = {**STATE, "stamp": "cd" * 16}
    take_copy_state(guest, key, newer)  # another process's handshake, just now
    assert stale(store)
    server, corpus, _ = _server(home)
    anyio.run(lambda: sync_copy(guest, "alice", _asker(server), key, told=states.get))
    corpus.close()
    assert store.grant()["stamp"] == "cd" * 16  # the newer word is kept
    assert store.load()["stamp"] == STATE["stamp"] and stale(store)  # so the next step syncs it again
    # the next sync over a session told the newer stamp settles it
    take_copy_state(guest, key, newer, states=states)
    server, corpus, _ = _server(home)
    anyio.run(lambda: sync_copy(guest, "alice", _asker(server), key, told=states.get))
    corpus.close()
    assert not stale(store) and store.grant()["stamp"] == "cd" * 16


@pytest.mark.parametrize("bad", [None, [], {"granted": "yes", "stamp": "ab" * 16, "until": None},
                                 {"granted": True, "stamp": "AB" * 16, "until": None},
                                 {"granted": True, "stamp": "ab" * 16, "until": "tomorrow"},
                                 {**STATE, "extra": 1}])
def test_an_ill_formed_state_is_refused_with_a_code(tmp_path, bad):
    with pytest.raises(KithError) as exc:
        take_copy_state(tmp_path, "11" * 32, bad)
    assert exc.value.code == "copy-state-invalid"


class _Runner:
    def __init__(self):
        self.events, self.spawned, self.woken = [], [], 0

    def emit(self, ev):
        self.events.append(ev)

    def spawn(self, fn, *args):
        self.spawned.append(args[1])

    def wake(self):
        self.woken += 1


def test_until_passed_deletes_the_copy_without_the_host(host, tmp_path):
    home, _ = host
    guest, key = _synced(tmp_path, home, told={**STATE, "until": rfc3339(time.time() + 3600)})
    store = CopyStore(guest, "alice")
    assert store.load()["until"] == store.until() and list_copies(guest)[0]["until"] == store.until()
    listed = invoke(guest, "copies", "list")
    assert listed.exit_code == 0 and f"ends {store.until()}" in listed.stdout
    search_copy(guest, "alice", {"queries": ["WAL"]})  # in force: answers
    later = until_time(store.until()) + 1
    assert expire_copies(guest, now=later - 2) == [] and store.exists()
    store.write_grant({**STATE, "until": rfc3339(time.time() - 1)}, time.time())  # its end passed
    with pytest.raises(KithError) as exc:
        search_copy(guest, "alice", {"queries": ["WAL"]})
    assert exc.value.code == "copy-expired" and not store.dir.exists()


def test_the_runner_ends_an_expired_copy_and_syncs_a_stale_one(host, tmp_path):
    home, _ = host
    guest, key = _synced(tmp_path, home, told=STATE)
    task = CopiesTask(guest, clock=ManualClock())
    task._due["alice"] = 10_000.0  # synced a moment ago: not due
    runner = _Runner()
    anyio.run(task.step, runner)
    assert runner.spawned == []
    take_copy_state(guest, key, {**STATE, "stamp": "ef" * 16})  # the grant changed
    anyio.run(task.step, runner)
    assert runner.spawned == ["alice"]  # at its next step, not at the interval's end
    task._running.clear()
    CopyStore(guest, "alice").write_grant({**STATE, "until": rfc3339(time.time() - 5)}, time.time())
    anyio.run(task.step, runner)
    assert not CopyStore(guest, "alice").dir.exists()
    assert [(e["event"], e["peer"], e["removed"], e["via"]) for e in runner.events] == [
        ("copy-ended", "alice", 2, "expired")]


def test_the_runner_reads_a_copy_s_grant_again_only_when_it_changed(host, tmp_path):
    """Issue 42 review: each step of the home's runner (one a second) read every copy's
    grant.json (twice: for the stamp, and to see whether the copy is stale). Now it is read
    once, and again when a handshake rewrote it — and the changed grant still syncs the copy."""
    from support.opens import counting

    home, _ = host
    guest, key = _synced(tmp_path, home, told=STATE)
    task = CopiesTask(guest, clock=ManualClock())
    task._due["alice"] = 10_000.0  # synced a moment ago: not due
    runner = _Runner()
    with counting("grant.json") as opened:
        for _ in range(5):
            anyio.run(task.step, runner)
        assert opened["grant.json"] == 1 and runner.spawned == []
        take_copy_state(guest, key, {**STATE, "stamp": "ef" * 16})  # a handshake told another grant
        before = opened["grant.json"]
        for _ in range(5):
            anyio.run(task.step, runner)
        assert opened["grant.json"] == before + 1  # read again once: the file changed
    assert runner.spawned == ["alice"]  # and the copy made stale by it is synced


def test_the_runner_reads_a_copy_s_manifest_again_only_when_it_changed(host, tmp_path):
    """Review: each step of the home's runner (one a second) read every copy's manifest.json
    three times (its end, its row, whether it is stale) — a copy of thousands of documents
    parsed each second. Now once, and again when a sync committed a new one; the copy's
    state as the steps see it follows the commit."""
    from support.opens import counting

    home, _ = host
    guest, key = _synced(tmp_path, home, told=STATE)
    task = CopiesTask(guest, clock=ManualClock())
    task._due["alice"] = 10_000.0  # synced a moment ago: not due
    runner = _Runner()
    with counting("manifest.json") as opened:
        for _ in range(5):
            anyio.run(task.step, runner)
        assert opened["manifest.json"] == 1 and runner.spawned == []
        store = CopyStore(guest, "alice")
        state = store.load()
        state["stamp"] = "0" * 32  # another process committed the copy under another grant stamp
        store.commit(state)
        before = opened["manifest.json"]
        for _ in range(5):
            anyio.run(task.step, runner)
        assert opened["manifest.json"] == before + 1  # read again once: the file changed
    assert runner.spawned == ["alice"]  # and the steps saw it: stale under the grant told, synced


class _AwayRunner(_Runner):
    """A runner whose pool cannot reach the host (it is away)."""

    async def pool(self):
        from node.common.errors import TransportError

        raise TransportError("transport-connect-failed", "the host is not running")


def test_a_changed_grant_told_at_a_handshake_syncs_a_copy_whose_host_is_being_retried(host, tmp_path):
    """A copy whose last sync failed waits out a backoff (up to 10 minutes) before it is
    tried again; a handshake that tells a changed grant (the owner withdrew a source) syncs
    it at the runner's next step all the same, so the withdrawn source is not answered from
    the copy until then. Another failure under that grant waits again (no busy retry)."""
    home, _ = host
    guest, key = _synced(tmp_path, home, told=STATE)
    task = CopiesTask(guest, clock=ManualClock())
    away = _AwayRunner()
    anyio.run(task.step, away)  # its first step syncs it: the host is away
    assert away.spawned == ["alice"]
    anyio.run(task._sync, away, "alice")
    assert [e["event"] for e in away.events] == ["copy-failed"] and "alice" in task._backoff
    anyio.run(task.step, away)
    assert away.spawned == ["alice"]  # retried after its backoff, not at once
    told: list = []
    take_copy_state(guest, key, {**STATE, "stamp": "cd" * 16}, notify=told.append)  # another process's ask
    assert told == [{"peer": "alice", "kind": "changed"}]
    anyio.run(task.step, away)
    assert away.spawned == ["alice", "alice"]  # synced at once despite the backoff
    anyio.run(task._sync, away, "alice")  # the host went away again: wait out the backoff
    anyio.run(task.step, away)
    assert away.spawned == ["alice", "alice"]


def test_peers_remove_deletes_the_copy_and_says_so(host, tmp_path):
    home, _ = host
    guest, key = _synced(tmp_path, home)
    PeerRegistry.load(guest).add("alice", key)
    r = invoke(guest, "peers", "remove", "alice", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["copyRemoved"] == 2
    assert not CopyStore(guest, "alice").dir.exists()


def test_a_deletion_tells_the_sink_its_caller_passed_and_no_one_else(host, tmp_path, capsys):
    """Notices are an argument, not a process-wide stack: the caller's sink is told, stderr
    is not (it is told only when no sink is passed: the handshake test above)."""
    home, _ = host
    guest, key = _synced(tmp_path, home)
    capsys.readouterr()
    told: list = []
    end_copies(guest, host_key=key, via="device-revoked", notify=told.append)
    assert [(n["peer"], n["kind"], n["via"]) for n in told] == [("alice", "ended", "device-revoked")]
    assert "copy was deleted" not in capsys.readouterr().err


def test_a_revoked_device_s_copies_are_deleted(host, tmp_path):
    home, _ = host
    guest, key = _synced(tmp_path, home)
    ended = end_copies(guest, host_key="22" * 32, via="device-revoked")
    assert ended == [] and CopyStore(guest, "alice").exists()
    ended = end_copies(guest, host_key=key, via="device-revoked")
    assert [(n["peer"], n["via"]) for n in ended] == [("alice", "device-revoked")]
    assert not CopyStore(guest, "alice").dir.exists()



def test_the_owner_is_told_what_ending_does_and_cannot_undo(host):
    home, _ = host
    r = invoke(home, "policy", "set", "/kb/deploy.md", "private")
    assert r.exit_code == 0 and "copy grants follow tiers" in r.output and "keeps what it copied" in r.output
    r = invoke(home, "policy", "copy", "/kb/**", "--for", "bea", "--off", "--json")
    assert r.exit_code == 0
    warning = json.loads(r.stdout)["warning"]
    assert "next sync or handshake" in warning and "keeps what it copied" in warning
    assert "signatures prove what was shared" in warning
    r = invoke(home, "policy", "copy", "/kb/**", "--for", "bea", "--until", "30d")
    assert r.exit_code == 0 and "even if it never reaches this host again" in r.output


def test_a_damaged_copy_is_left_alone_by_the_runner_and_never_stops_the_others(host, tmp_path):
    home, _ = host
    guest, key = _synced(tmp_path, home, told=STATE)
    damaged = CopyStore(guest, "carl")
    damaged.dir.mkdir(parents=True)
    damaged.path.write_text("{not json")  # a hand-edited (or half-restored) manifest
    task = CopiesTask(guest, clock=ManualClock())
    runner = _Runner()
    anyio.run(task.step, runner)  # neither raises nor syncs the damaged copy
    assert runner.spawned == ["alice"]
    assert reindex_copies(guest) == [] and expire_copies(guest) == []
    assert damaged.path.read_text() == "{not json"  # kept for its owner to look at
