"""The outbox (specs/outbox.md): questions kept for peers that are offline, delivered by the
home's background runner when the peer is back, answers kept until removed.

Real processes over iroh on loopback (relays off) with a real community server in a
thread: a question queued while the host is down is answered after it starts; a guest
runner killed with SIGKILL between delivery and storing the answer loses nothing and stores
the answer once; a full outbox refuses with ``outbox-full``; a question expires. The store's
rules (exactly once, a lying host, bounds, expiry on the wall clock) are also checked
directly on a real SQLite file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from node.guest.outbox import MAX_QUESTIONS, OutboxStore, classify, merged_answer, parse_keep, query_id_of
from node.trust.identity import load_or_init_identity
from node.trust.invitation import parse_invitation
from node.trust.peers import PeerRegistry

from support.agents import api_headers
from support.cli import KITH, readline as _readline
from support.community import NO_LIMITS
from support.envelopes import valid_ask as valid
from support.homes import node_home as _home, public_host_home
from support.hosts import ENV
from support.waits import wait_for

KEY = "ab" * 32
DEPLOY = "# Deploy\n\nThe staging server is deleted automatically every night.\n"


def _host_home(tmp: Path, name: str) -> Path:
    """``name``'s home: one indexed note, shared as ``/kb-<name>/**`` public."""
    return public_host_home(tmp, {"deploy.md": DEPLOY}, home=f"host-{name}", kb=f"kb-{name}")
REQUEST = {"query": "staging server", "topK": 3}


class WallClock:
    """A wall clock the test sets (seconds)."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _answer(qid: str, status: str = "ok", **extra) -> dict:
    result = {"source": "/kb/a.md", "id": "c1", "textPreview": "The staging server is deleted nightly."}
    return {"action": "results", "query_id": query_id_of(qid), "status": status,
            "envelope": {"results": [result] if status == "ok" else []}, **extra}


# --------------------------------------------------------------------------- the store
def test_an_answer_is_stored_once_and_a_second_one_changes_nothing(tmp_path):
    with OutboxStore(tmp_path) as store:
        rec = store.add(REQUEST, [("alice", KEY)])
        qid = rec["id"]
        first = _answer(qid)
        assert store.record_attempt(qid, KEY, classify(first, query_id_of(qid)), message=first)
        second = _answer(qid)
        second["envelope"]["results"][0]["textPreview"] = "something else"
        assert not store.record_attempt(qid, KEY, classify(second, query_id_of(qid)), message=second)
        got = store.get(qid)
        assert store.open_deliveries() == []
    assert got["state"] == "answered" and got["peers"][0]["attempts"] == 1
    assert merged_answer(got)["results"][0]["textPreview"] == "The staging server is deleted nightly."


@pytest.mark.parametrize("lie", [
    {"status": "already-answered", "envelope": {"results": []}},  # "I answered before"
    {"status": "ok", "envelope": {"results": [{"source": "", "id": "x", "textPreview": "t"}]}},  # malformed
    {"status": "ok", "envelope": None},
    {"status": "ok", "query_id": "outbox:" + "0" * 32},  # an answer to another question
    {"status": "rate-limited", "retry_after_s": 30},
])
def test_a_host_that_does_not_answer_cannot_close_the_question(tmp_path, lie):
    """Only a complete answer (ok / no-verified-results, well-formed, this query_id) closes
    a row: anything a host claims instead leaves the question open, to be asked again."""
    with OutboxStore(tmp_path) as store:
        qid = store.add(REQUEST, [("alice", KEY)])["id"]
        message = {**_answer(qid), **lie}
        outcome = classify(message, query_id_of(qid))
        assert outcome.state is None
        assert store.record_attempt(qid, KEY, outcome, message=message)
        got = store.get(qid)
        assert got["state"] == "waiting" and got["peers"][0]["answeredAt"] is None
        assert [d.question_id for d in store.open_deliveries()] == [qid]


def test_pending_approval_keeps_the_interim_answer_and_the_question_open(tmp_path):
    with OutboxStore(tmp_path) as store:
        qid = store.add(REQUEST, [("alice", KEY)])["id"]
        pending = _answer(qid, "pending-approval", approval_id="0123456789abcdef")
        store.record_attempt(qid, KEY, classify(pending, query_id_of(qid)), message=pending)
        got = store.get(qid)
        assert got["state"] == "waiting" and got["peers"][0]["state"] == "pending-approval"
        assert got["peers"][0]["approvalId"] == "0123456789abcdef"
        assert len(store.open_deliveries()) == 1
        final = _answer(qid)
        store.record_attempt(qid, KEY, classify(final, query_id_of(qid)), message=final)
        assert store.get(qid)["state"] == "answered"


def test_expiry_follows_the_wall_clock_and_never_drops_an_answer(tmp_path):
    clock = WallClock()
    with OutboxStore(tmp_path, clock=clock) as store:
        open_q = store.add(REQUEST, [("alice", KEY)], keep_s=parse_keep("1h"))["id"]
        done_q = store.add(REQUEST, [("alice", KEY)], keep_s=parse_keep("1h"))["id"]
        answer = _answer(done_q)
        store.record_attempt(done_q, KEY, classify(answer, query_id_of(done_q)), message=answer)
        clock.t -= 86_400  # the clock set back a day: nothing expires, nothing is resent
        assert store.expire() == 0
        clock.t += 86_400 + 3599
        assert store.expire() == 0
        clock.t += 1
        assert store.expire() == 1
        assert store.get(open_q)["state"] == "expired" and store.get(open_q)["peers"][0]["code"] == "outbox-expired"
        assert store.get(done_q)["state"] == "answered"
        assert store.open_deliveries() == []
        assert store.remove_done() and store.list() == []


def test_an_expiry_pass_with_no_open_row_to_expire_takes_no_write_lock(tmp_path):
    """Answered questions past their expiry stay until removed; the runner's pass every
    second must not take the write lock for them (another process may hold it)."""
    import sqlite3

    clock = WallClock()
    with OutboxStore(tmp_path, clock=clock) as store:
        qid = store.add(REQUEST, [("alice", KEY)], keep_s=60)["id"]
        answer = _answer(qid)
        store.record_attempt(qid, KEY, classify(answer, query_id_of(qid)), message=answer)
        clock.t += 3600
        other = sqlite3.connect(tmp_path / "outbox.sqlite", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process writes
        try:
            store.db.execute("PRAGMA busy_timeout=0")
            assert store.expire() == 0
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert store.get(qid)["state"] == "answered"


def test_the_outbox_is_bounded_in_questions(tmp_path):
    from node.common.errors import ConfigError

    with OutboxStore(tmp_path) as store:
        with store._tx() as db:  # fill it the fast way: the same rows add() writes
            db.executemany("INSERT INTO questions(id, request, created_at, expires_at, bytes) VALUES (?,?,?,?,?)",
                           [(f"{i:032x}", json.dumps(REQUEST), 0.0, 9e9, 40) for i in range(MAX_QUESTIONS)])
        with pytest.raises(ConfigError) as exc:
            store.add(REQUEST, [("alice", KEY)])
        assert exc.value.code == "outbox-full"
        assert store.usage()["questions"] == MAX_QUESTIONS


def test_the_room_checked_before_asking_is_the_room_the_question_takes(tmp_path):
    """``kith ask --later`` / ``POST /outbox`` / ``ask_later`` check the room before anyone
    is asked: a question that :meth:`add` would refuse is refused by that check too (the
    same bytes are counted), so nobody is asked for a question that cannot be kept."""
    from node.common.errors import ConfigError
    from node.guest.outbox import MAX_BYTES, request_body

    request = {"query": "when is the staging server deleted?", "topK": 5, "citations": True}
    size = len(request_body(request))
    with OutboxStore(tmp_path) as store:
        with store._tx() as db:
            db.execute("INSERT INTO questions(id, request, created_at, expires_at, bytes) VALUES (?,?,?,?,?)",
                       ("0" * 32, json.dumps(REQUEST), 0.0, 9e9, MAX_BYTES - size + 1))
        with pytest.raises(ConfigError) as before:
            store.check_room(request)
        with pytest.raises(ConfigError) as after:
            store.add(request, [("alice", KEY)])
        assert before.value.code == after.value.code == "outbox-full"
        with store._tx() as db:
            db.execute("UPDATE questions SET bytes = ?", (MAX_BYTES - size,))
        store.check_room(request)
        assert store.add(request, [("alice", KEY)])["request"] == request


def test_reading_an_outbox_that_never_kept_anything_creates_nothing(tmp_path):
    home = _home(tmp_path, "fresh")
    listed = _kith(home, "outbox", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["questions"] == []
    shown = _kith(home, "outbox", "show", "abcd", "--json")
    assert shown.returncode == 1 and json.loads(shown.stdout)["error"]["code"] == "outbox-not-found"
    assert not (home / "outbox.sqlite").exists()
    usage = _kith(home, "ask", "x", "--peer", "alice", "--keep", "1h")
    assert usage.returncode == 2 and "--keep is for --later" in usage.stderr
    bad_keep = _kith(home, "ask", "x", "--peer", "alice", "--later", "--keep", "9y")
    assert bad_keep.returncode == 2 and "outbox-keep-invalid" in bad_keep.stderr


def test_a_damaged_question_is_closed_and_the_others_are_still_listed_and_delivered(tmp_path):
    """A hand-edited row whose request is not a JSON object neither hides the outbox nor
    stops delivery: it is listed (query null, no answer) and its row closed
    ``outbox-corrupt``; the other questions are listed and delivered."""
    with OutboxStore(tmp_path) as store:
        bad = store.add(REQUEST, [("alice", KEY)])["id"]
        good = store.add({"query": "other", "topK": 3}, [("alice", KEY)])["id"]
        with store._tx() as db:
            db.execute("UPDATE questions SET request='{not json' WHERE id=?", (bad,))
        assert [d.question_id for d in store.open_deliveries(peer_key=KEY)] == [good]
        listed = {r["id"]: r for r in store.list()}
        assert listed[bad]["query"] is None and listed[bad]["state"] == "failed"
        assert listed[bad]["peers"][0]["code"] == "outbox-corrupt"
        assert listed[good]["state"] == "waiting"
        with store._tx() as db:  # a damaged stored answer counts as none
            db.execute("UPDATE deliveries SET answer='[1', state='answered' WHERE question_id=?", (good,))
        from node.guest.outbox import public_record

        assert public_record(store.get(good))["answer"] is None and public_record(store.get(bad))["answer"] is None
        assert store.remove_done() and store.list() == []


@pytest.mark.parametrize("content", [b"garbage" * 100, b""])
def test_an_outbox_file_that_is_not_an_outbox_is_refused_with_a_code(tmp_path, content):
    import sqlite3

    home = _home(tmp_path, "damaged")
    if content:
        (home / "outbox.sqlite").write_bytes(content)
    else:  # a SQLite file whose `questions` table is another one
        db = sqlite3.connect(home / "outbox.sqlite")
        db.execute("CREATE TABLE questions(x)")
        db.commit()
        db.close()
    for args in (("outbox", "list", "--json"), ("outbox", "show", "abcd", "--json")):
        got = _kith(home, *args)
        assert got.returncode == 1, got.stderr
        assert json.loads(got.stdout)["error"]["code"] == "outbox-corrupt", got.stdout
    asked = _kith(home, "ask", "x", "--peer", "alice", "--later", "--offline")
    assert asked.returncode == 1 and "outbox-corrupt" in asked.stderr and "Traceback" not in asked.stderr


@pytest.mark.parametrize("bad", ["", "7 days", "0", "59", "31d", "-1h", "1y"])
def test_a_bad_keep_is_refused(bad):
    from node.common.errors import UsageError

    with pytest.raises(UsageError) as exc:
        parse_keep(bad)
    assert exc.value.code == "outbox-keep-invalid" and exc.value.exit_code == 2


def test_ids_resolve_by_prefix(tmp_path):
    from node.common.errors import ConfigError

    with OutboxStore(tmp_path) as store:
        qid = store.add(REQUEST, [("alice", KEY)])["id"]
        assert store.resolve(qid[:6].upper()) == qid
        for bad in ("zz", "abc", "0000" if not qid.startswith("0000") else "ffff"):
            with pytest.raises(ConfigError) as exc:
                store.resolve(bad)
            assert exc.value.code == "outbox-not-found"


@pytest.mark.parametrize("change", ["blocked", "removed"])
def test_a_question_for_a_peer_blocked_or_removed_since_fails_with_an_event(tmp_path, change):
    """A kept question whose peer was blocked (or unpinned) since it was queued is closed
    with its code and reported as an ``outbox-failed`` event — a blocked peer's used to be
    closed without one, so `kith outbox run` said nothing of it (specs/outbox.md §5)."""
    import anyio

    from node.guest.outbox_task import OutboxTask
    from node.guest.owner import Guest
    from node.guest.runner import Runner

    home = _home(tmp_path, "guest")
    registry = PeerRegistry.load(home)
    registry.pin("alice", KEY)
    registry.save()
    with OutboxStore(home) as store:
        qid = store.add(REQUEST, [("alice", KEY)])["id"]
    registry = PeerRegistry.load(home)
    if change == "blocked":
        registry.block("alice")
    else:
        registry.remove("alice")
    registry.save()
    seen: list[dict] = []

    async def main():
        runner = Runner(Guest(home), [OutboxTask(home)], on_event=seen.append, command="test")
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            with anyio.fail_after(60):
                while not seen:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    anyio.run(main)
    code = "ask-peer-blocked" if change == "blocked" else "peer-not-found"
    assert seen == [{"event": "outbox-failed", "id": qid, "peer": "alice", "code": code}]
    with OutboxStore(home) as store:
        assert store.get(qid)["peers"][0]["code"] == code


# --------------------------------------------------------------------------- real processes
def _kith(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*KITH, "--home", str(home), *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _start_host(home: Path, server: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([*KITH, "--home", str(home), "host", "--offline", "--json", "--server", server],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env=ENV)
    return proc, json.loads(_readline(proc, 90))


def _start_runner(home: Path) -> subprocess.Popen:
    proc = subprocess.Popen([*KITH, "--home", str(home), "outbox", "run", "--offline", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env=ENV)
    assert json.loads(_readline(proc, 90))["event"] == "outbox-runner-started"
    return proc


def _event(proc: subprocess.Popen, name: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = _readline(proc, max(1.0, deadline - time.monotonic()))
        assert line, f"the process ended before {name}: {proc.stderr.read() if proc.poll() is not None else ''}"
        ev = json.loads(line)
        if ev.get("event") == name:
            return ev
    raise AssertionError(f"no {name} event in {timeout} s")


def _keep_for_alice(home: Path, request: dict | None = None, **opts: Any) -> str:
    """Keep ``request`` (default: "staging server deleted", topK 3) in ``home``'s outbox
    for its pinned peer alice (``opts``: :meth:`OutboxStore.add`'s); returns its id."""
    alice = PeerRegistry.load(home).by_name("alice")
    with OutboxStore(home) as store:
        return store.add(request or {"query": "staging server deleted", "topK": 3}, [("alice", alice.public_key)],
                         **opts)["id"]


def _row(home: Path, qid: str) -> dict:
    """The outbox's record of question ``qid`` at ``home`` now."""
    with OutboxStore(home) as store:
        return store.get(qid)


def _stop(*procs: subprocess.Popen | None) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=30)


@pytest.fixture
def world(tmp_path):
    """A community server, alice's host home (pinned by the guest with the server, then
    stopped: she is asleep) and the guest's home."""
    from node.community.server import run_server_in_thread

    with run_server_in_thread(tmp_path / "community.db", rate_limits=NO_LIMITS) as url:
        host_home = _host_home(tmp_path, "alice")
        guest_home = _home(tmp_path, "guest")
        load_or_init_identity(guest_home)
        proc, inv = _start_host(host_home, url)
        parsed = parse_invitation(json.dumps(inv))
        PeerRegistry.load(guest_home).add("alice", parsed.host_public_key, invitation=parsed.to_dict(), server=url)
        proc.send_signal(signal.SIGTERM)  # a clean stop: the post is withdrawn
        proc.wait(timeout=60)
        yield url, host_home, guest_home


@pytest.mark.iroh
def test_a_question_queued_while_the_host_is_down_is_answered_after_it_starts(world):
    url, host_home, guest_home = world
    asked = _kith(guest_home, "ask", "staging server deleted", "--peer", "alice", "--later", "--offline",
                  "--timeout", "8", "--json")
    assert asked.returncode == 0, asked.stderr
    env = json.loads(asked.stdout)
    valid(env)
    assert env["peers"][0]["status"] == "unreachable" and env["outbox"]["peers"] == ["alice"]
    qid = env["outbox"]["id"]
    assert "kept in the outbox" in asked.stderr
    listed = json.loads(_kith(guest_home, "outbox", "list", "--json").stdout)
    assert [(q["id"], q["state"]) for q in listed["questions"]] == [(qid, "waiting")]
    runner = host = None
    try:
        runner = _start_runner(guest_home)
        host, _inv = _start_host(host_home, url)
        ev = _event(runner, "outbox-answered")
        assert (ev["id"], ev["peer"], ev["status"]) == (qid, "alice", "ok")
        # the host writes its audit in batches and is SIGKILLed below: wait (bounded) for the record
        wait_for("the host's audit record of the answer", lambda: _answered_in_audit(host_home, qid)[0])
        runner.send_signal(signal.SIGTERM)  # a runner that delivered stops cleanly
        assert runner.wait(timeout=60) == 0, runner.stderr.read()[-3000:]
    finally:
        _stop(runner, host)
    shown = _kith(guest_home, "outbox", "show", qid[:8], "--json")
    assert shown.returncode == 0, shown.stderr
    rec = json.loads(shown.stdout)
    assert rec["state"] == "answered" and rec["peers"][0]["state"] == "answered"
    valid(rec["answer"])
    assert rec["answer"]["results"][0]["source"] == "/kb-alice/deploy.md"
    assert rec["answer"]["results"][0]["untrusted"] is True
    # the host answered an ordinary query with the outbox's query id (its audit says so)
    audit = json.loads(_kith(host_home, "audit", "--json").stdout)["records"]
    assert [r["status"] for r in audit if r.get("event") == "results" and r["query_id"] == query_id_of(qid)] == ["ok"]
    text = _kith(guest_home, "outbox", "show", qid[:8])
    assert text.returncode == 0 and "deploy.md" in text.stdout
    assert json.loads(_kith(guest_home, "outbox", "list", "--json").stdout)["questions"][0]["unread"] is False
    gone = _kith(guest_home, "outbox", "remove", qid, "--json")
    assert json.loads(gone.stdout) == {"removed": [qid], "withdrawals": []}
    missing = _kith(guest_home, "outbox", "show", qid, "--json")
    assert missing.returncode == 1 and "outbox-not-found" in missing.stdout


@pytest.mark.iroh
def test_an_expired_question_is_not_delivered(world, tmp_path):
    url, host_home, guest_home = world
    qid = _keep_for_alice(guest_home, REQUEST, keep_s=60)
    with OutboxStore(guest_home) as store, store._tx() as db:  # its week went by while every process of the home was off
        db.execute("UPDATE questions SET expires_at = ? WHERE id = ?", (time.time() - 1, qid))
    runner = host = None
    try:
        host, _inv = _start_host(host_home, url)
        runner = _start_runner(guest_home)
        ev = _event(runner, "outbox-expired")
        assert ev["rows"] == 1
    finally:
        _stop(runner, host)
    got = json.loads(_kith(guest_home, "outbox", "show", qid, "--json").stdout)
    assert got["state"] == "expired" and got["peers"][0]["attempts"] == 0 and got["answer"] is None


@pytest.mark.iroh
def test_a_full_outbox_refuses_with_a_code_before_anyone_is_asked(world):
    url, host_home, guest_home = world
    with OutboxStore(guest_home) as store:
        with store._tx() as db:
            db.executemany("INSERT INTO questions(id, request, created_at, expires_at, bytes) VALUES (?,?,?,?,?)",
                           [(f"{i:032x}", json.dumps(REQUEST), 0.0, 9e9, 40) for i in range(MAX_QUESTIONS)])
    asked = _kith(guest_home, "ask", "staging", "--peer", "alice", "--later", "--offline", "--timeout", "5", "--json")
    assert asked.returncode == 1
    assert "outbox-full" in asked.stderr and "kith outbox remove --done" in asked.stderr
    with OutboxStore(guest_home) as store:
        assert store.usage()["questions"] == MAX_QUESTIONS and store.usage()["open"] == 0


@pytest.mark.iroh
def test_a_guest_killed_between_delivery_and_storing_loses_nothing_and_stores_once(world):
    """The runner is SIGKILLed after the host answered and before the answer was stored:
    the question is still open; the next runner resends it with the same query id and the
    host answers that resend as an ordinary query (its audit shows the one id twice); the
    answer is stored once."""
    url, host_home, guest_home = world
    qid = _keep_for_alice(guest_home)
    host = runner = None
    try:
        host, _inv = _start_host(host_home, url)
        doomed = subprocess.Popen([*KITH, "--home", str(guest_home), "outbox", "run", "--offline", "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  stdin=subprocess.DEVNULL, env={**ENV, "KITH_TEST_OUTBOX_KILL_BEFORE_STORE": "1"})
        assert doomed.wait(timeout=120) == -signal.SIGKILL
        doomed.stdout.close()
        doomed.stderr.close()
        with OutboxStore(guest_home) as store:
            kept = store.get(qid)
        assert kept["state"] == "waiting" and kept["peers"][0]["attempts"] == 0  # nothing half-written
        runner = _start_runner(guest_home)
        ev = _event(runner, "outbox-answered")
        assert ev["id"] == qid
        # a running host writes its audit in batches (a tick of its event loop, specs/peers.md
        # §7) and is SIGKILLed below: wait (bounded) until the resend's record is written
        wait_for("the host's audit record of the resend", lambda: len(_answered_in_audit(host_home, qid)[0]) >= 2)
    finally:
        _stop(runner, host)
    with OutboxStore(guest_home) as store:
        got = store.get(qid)
    assert got["state"] == "answered" and got["peers"][0]["attempts"] == 1
    assert merged_answer(got)["results"][0]["source"] == "/kb-alice/deploy.md"
    answered, text = _answered_in_audit(host_home, qid)
    assert len(answered) == 2 and {r["status"] for r in answered} == {"ok"}, text[-2000:]


def _answered_in_audit(host_home: Path, qid: str) -> tuple[list[dict], str]:
    """The host audit's ``results`` records of outbox question ``qid``, and the audit text."""
    audit = _kith(host_home, "audit", "--json")
    assert audit.returncode == 0, audit.stderr
    return [r for r in _json_lines(audit.stdout) if r.get("event") == "results"
            and r.get("query_id") == query_id_of(qid)], audit.stdout


def _json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.extend(value.get("records", [value]) if "records" in value else [value])
    return out


@pytest.mark.iroh
def test_the_local_api_queues_by_name_and_its_runner_delivers(world):
    """``POST /outbox`` (the API's one write) asks now and keeps the question for the peer
    that is down; the API's own runner delivers it once the host is up; ``GET /outbox``
    reads it and changes nothing. The runner asks through the API's one pool: an agent's
    next question to that peer goes over the session the delivery opened (the host sees
    one session; it saw two when the runner kept a pool of its own)."""
    import httpx

    from node.local.api import run_api_in_thread

    url, host_home, guest_home = world
    host = None
    try:
        auth = api_headers(guest_home)  # an agent's credential (specs/agents.md)
        with run_api_in_thread(guest_home, offline=True, background=True) as api:
            bad = httpx.post(headers=auth, url=api + "/outbox", json={"query": "staging", "peers": ["alice"], "keep": "7 days"},
                             timeout=60)
            no_peers = httpx.post(headers=auth, url=api + "/outbox", json={"query": "staging"}, timeout=60)
            queued = httpx.post(headers=auth, url=api + "/outbox", json={"query": "staging server deleted", "peers": ["alice"],
                                                       "keep": "2h"}, timeout=120)
            assert queued.status_code == 200, queued.text
            env = queued.json()
            valid(env)
            qid = env["outbox"]["id"]
            host, _inv = _start_host(host_home, url)
            record = wait_for("the kept question answered", lambda: (r := httpx.get(
                headers=auth, url=api + "/outbox", params={"id": qid[:10]}, timeout=30).json())["state"] == "answered"
                and r, timeout_s=120, every_s=0.1)
            listing = httpx.get(headers=auth, url=api + "/outbox", timeout=30).json()
            missing = httpx.get(headers=auth, url=api + "/outbox", params={"id": "ffff0000"}, timeout=30)
            put = httpx.put(headers=auth, url=api + "/outbox", json={}, timeout=30)
            warm = httpx.post(headers=auth, url=api + "/search", json={"query": "staging server", "peers": ["alice"]},
                              timeout=120)
    finally:
        _stop(host)
    assert warm.status_code == 200 and warm.json()["answered"] == 1, warm.text
    audit = _kith(host_home, "audit", "--json")
    assert audit.returncode == 0, audit.stderr
    answered = [r for r in _json_lines(audit.stdout) if r.get("event") == "results"]
    assert len(answered) == 2 and len({r["session_id"] for r in answered}) == 1, answered
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "outbox-keep-invalid"
    assert no_peers.status_code == 400 and no_peers.json()["error"]["code"] == "query-invalid"
    assert record is not None and record["state"] == "answered", record
    valid(record["answer"])
    assert record["answer"]["results"][0]["source"] == "/kb-alice/deploy.md"
    assert record["peers"][0]["readAt"] is None  # GET marks nothing
    assert [q["id"] for q in listing["questions"]] == [qid] and listing["usage"]["questions"] == 1
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "outbox-not-found"
    assert put.status_code == 403


@pytest.mark.iroh
def test_mcp_ask_later_keeps_the_question_and_the_outbox_tool_reads_it(world):
    import anyio

    from node.local.mcp import call_ask_later, call_outbox

    _url, _host_home, guest_home = world

    async def main():
        keep_bad = await call_ask_later(guest_home, {"query": "staging", "peers": ["alice"], "keep": True}, local=True)
        no_peers = await call_ask_later(guest_home, {"query": "staging"}, local=True)
        queued = await call_ask_later(guest_home, {"query": "staging", "peers": ["alice"], "keep": 3600}, local=True)
        return keep_bad, no_peers, queued

    keep_bad, no_peers, queued = anyio.run(main)
    assert keep_bad.is_error and keep_bad.content[0].text.startswith("[query-invalid] ")
    assert no_peers.is_error and "'peers' is required" in no_peers.content[0].text
    assert not queued.is_error
    env = queued.structured_content
    valid(env)
    assert env["peers"][0]["status"] == "unreachable" and env["outbox"]["peers"] == ["alice"]
    listed = call_outbox(guest_home, {})
    assert [q["id"] for q in listed.structured_content["questions"]] == [env["outbox"]["id"]]
    one = call_outbox(guest_home, {"id": env["outbox"]["id"][:8]})
    assert one.structured_content["state"] == "waiting" and one.structured_content["answer"] is None
    nope = call_outbox(guest_home, {"id": "zz"})
    assert nope.is_error and nope.content[0].text.startswith("[outbox-not-found] ")


@pytest.mark.iroh
def test_kith_host_of_the_guest_home_delivers_its_outbox(world, tmp_path):
    """A guest that also hosts: its `kith host` runs the home's runner and delivers."""
    url, host_home, guest_home = world
    qid = _keep_for_alice(guest_home)
    alice = guest_host = None
    try:
        alice, _inv = _start_host(host_home, url)
        guest_host = subprocess.Popen([*KITH, "--home", str(guest_home), "host", "--offline", "--json",
                                       "--invite-file", str(tmp_path / "guest-invite.json")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      stdin=subprocess.DEVNULL, env=ENV)
        json.loads(_readline(guest_host, 90))
        wait_for("the kept question answered", lambda: _row(guest_home, qid)["state"] == "answered", timeout_s=120)
    finally:
        _stop(alice, guest_host)


@pytest.mark.iroh
def test_an_ask_tier_answer_waits_pending_and_the_final_answer_arrives_once_approved(world):
    """Delivery is an ordinary query at the host: an `ask`-tier source answers
    pending-approval (the row stays open, its approval id kept), and once the owner approves
    the runner's next ask brings the final answer."""
    from node.policy.store import Policy

    url, host_home, guest_home = world
    policy = Policy.load(host_home)
    policy.set("/kb-alice/**", "ask")
    policy.save()
    qid = _keep_for_alice(guest_home)
    host = runner = None
    try:
        host, _inv = _start_host(host_home, url)
        runner = _start_runner(guest_home)
        pending = _event(runner, "outbox-pending")
        assert pending["id"] == qid and pending["approval_id"]
        with OutboxStore(guest_home) as store:
            waiting = store.get(qid)
        assert waiting["state"] == "waiting" and waiting["peers"][0]["state"] == "pending-approval"
        approved = _kith(host_home, "approvals", "approve", pending["approval_id"])
        assert approved.returncode == 0, approved.stderr
        ev = _event(runner, "outbox-answered")
        assert ev["id"] == qid and ev["status"] == "ok"
    finally:
        _stop(runner, host)
    with OutboxStore(guest_home) as store:
        got = store.get(qid)
    assert got["state"] == "answered" and got["peers"][0]["attempts"] >= 2
    assert merged_answer(got)["results"][0]["source"] == "/kb-alice/deploy.md"


@pytest.mark.iroh
def test_a_rate_limited_answer_holds_every_question_for_that_peer_until_the_host_allows(world):
    """The host's quota is per peer: once it answers ``rate-limited`` the runner asks none
    of that peer's other kept questions before ``retry_after_s`` (an hour here) — the host
    sees one query answered and one refused, not one per kept question."""
    url, host_home, guest_home = world
    quota = _kith(host_home, "policy", "quota", "--per-hour", "1", "--burst", "1")
    assert quota.returncode == 0, quota.stderr
    with OutboxStore(guest_home) as store:
        key = PeerRegistry.load(guest_home).by_name("alice").public_key
        qids = [store.add({"query": f"staging server deleted {i}", "topK": 3}, [("alice", key)])["id"]
                for i in range(4)]
    host = runner = None
    try:
        host, _inv = _start_host(host_home, url)
        runner = _start_runner(guest_home)
        assert _event(runner, "outbox-answered")["id"] == qids[0]
        second = wait_for("the second question tried", lambda: (p := _row(guest_home, qids[1])["peers"][0])["attempts"]
                          and p, timeout_s=120)
        assert second["code"] == "rate-limited" and second["state"] == "waiting"
        # kept fixed wait: what is asserted is that nothing happens over the runner's next
        # steps (every second at most), and the runner reports no step to wait on
        time.sleep(3)
    finally:
        _stop(runner, host)
    with OutboxStore(guest_home) as store:
        attempts = [store.get(q)["peers"][0]["attempts"] for q in qids]
    assert attempts == [1, 1, 0, 0]


def test_remove_with_both_ids_and_done_is_a_usage_error_that_removes_nothing(tmp_path):
    """``kith outbox remove --done ID`` is refused (exit 2, one line saying to give one or
    the other), and removes nothing: it used to remove ID (an open question too) and every
    done one, said only as ``removed N question(s)``."""
    home = _home(tmp_path, "both")
    with OutboxStore(home) as store:
        done = store.add(REQUEST, [("alice", KEY)])["id"]
        store.fail(done, KEY, "peer-not-found")
        still_open = store.add(REQUEST, [("alice", KEY)])["id"]
    for args in (("--done", still_open[:8]), (still_open[:8], "--done", "--json"), ()):
        r = _kith(home, "outbox", "remove", *args)
        assert r.returncode == 2, (r.stdout, r.stderr)
        told = [line for line in r.stderr.splitlines() if line.startswith("error [usage]")]
        assert len(told) == 1 and "ID..." in told[0] and "--done" in told[0], r.stderr
        assert "Traceback" not in r.stderr
        listed = json.loads(_kith(home, "outbox", "list", "--json").stdout)["questions"]
        assert sorted(q["id"] for q in listed) == sorted([done, still_open])


@pytest.mark.parametrize("held_open", [False, True], ids=["closed", "held-open-by-a-writer"])
def test_list_and_show_read_a_home_this_user_may_read_but_not_write(tmp_path, held_open):
    """A home folder the user may read but not write (a read-only copy, a chmod): `kith
    outbox list` and `show` read it — `show` without marking the answer read — and only a
    writing command (`remove`) refuses, with `io-error`; nothing in the home changes.
    ``held-open-by-a-writer``: the owner's process has the file open meanwhile (its
    ``-wal``/``-shm`` beside it); ``closed``: no one has (SQLite would need to make them)."""
    from node.local.agents import ensure_default_agent
    from support.cli import without_root_reads
    from support.homes import files_of, read_only

    prefix = without_root_reads()
    home = _home(tmp_path, "ro")
    ensure_default_agent(home)  # as `kith init` leaves it: nothing for a first command to make
    with OutboxStore(home) as store:
        answered = store.add(REQUEST, [("alice", KEY)])["id"]
        message = _answer(answered)
        assert store.record_attempt(answered, KEY, classify(message, query_id_of(answered)), message=message)
        waiting = store.add({"query": "where is the walrus", "topK": 3}, [("alice", KEY)])["id"]
    owner = OutboxStore(home) if held_open else None  # leaves -wal and -shm beside the file

    def kith_ro(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, *KITH, "--home", str(home), *args], capture_output=True, text=True,
                              env=ENV, timeout=120, stdin=subprocess.DEVNULL)

    try:
        with read_only(home) as before:
            r = kith_ro("outbox", "list", "--json")
            assert r.returncode == 0, r.stderr
            listed = {q["id"]: q for q in json.loads(r.stdout)["questions"]}
            assert set(listed) == {answered, waiting} and listed[answered]["unread"] is True
            r = kith_ro("outbox", "list")
            assert r.returncode == 0 and "where is the walrus" in r.stdout, r.stderr
            r = kith_ro("outbox", "show", answered[:8], "--json")
            assert r.returncode == 0, r.stderr
            shown = json.loads(r.stdout)
            assert shown["id"] == answered and shown["answer"]["results"][0]["textPreview"].startswith("The staging")
            again = json.loads(kith_ro("outbox", "list", "--json").stdout)["questions"]
            assert [q["unread"] for q in again if q["id"] == answered] == [True]  # not marked: nothing written
            r = kith_ro("outbox", "remove", waiting[:8], "--json")
            assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == "io-error", (r.stdout, r.stderr)
            assert files_of(home) == before
    finally:
        if owner is not None:
            owner.close()


def test_remove_reads_the_withdrawals_once(tmp_path, monkeypatch):
    """`kith outbox remove ID` withdraws the sealed copy the question left with a holder,
    reading the withdrawals to make once (each read is a write transaction, and the home's
    runner reads them every 5 s too): it read them twice. An ``iroh:`` holder is left to the
    runner (``pending``, no code), so nothing is dialled here."""
    from support.cli import invoke

    home = _home(tmp_path, "withdraw")
    holder = "iroh:" + "a" * 52
    with OutboxStore(home) as store:
        qid = store.add(REQUEST, [("alice", KEY)])["id"]
        store.mark_left(qid, KEY, holder, "r" * 32)
    reads = []
    real = OutboxStore.withdrawals

    def counted(self):
        reads.append(1)
        return real(self)

    monkeypatch.setattr(OutboxStore, "withdrawals", counted)
    r = invoke(home, "outbox", "remove", qid[:8], "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"removed": [qid], "withdrawals": [
        {"id": qid, "holder": holder, "state": "pending", "code": None}]}
    assert len(reads) == 1
    monkeypatch.undo()
    with OutboxStore(home) as store:  # still kept for the runner to withdraw
        assert [(w["holder"], w["questionId"]) for w in store.withdrawals()] == [(holder, qid)]
