"""Kill tests with real processes (issue 43 item 4, "exactly once, nothing lost"): the
question id is the idempotency key end to end, whichever end dies.

- `kith host --mailbox` killed (SIGKILL) after it left its answer but before its ack of
  the question reached the holder: a new `kith host` takes the question again and, from its
  durable record of the questions it answered (`<home>/sealed-seen.sqlite`), does not
  answer it again — it acks it (`sealed-replayed`); the audit has one query and one results
  record, on disk before the killed host's ack left; the holder one answer;
- `kith outbox run` killed (SIGKILL) right after it left the question, and again after it
  stored the answer but before its ack reached the holder: the next run stores nothing
  twice — one answer in the row — and the holder is emptied.

The holder is a real community server with `--mailbox` in this process; the "before the
ack reached it" moment is made by holding the ack request of one key at the holder's store
(its real `ack_sealed` is never run for it) until the process that sent it was killed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path

from node.common.errors import CommunityError
from node.guest.outbox import OutboxStore

from support.cli import ask_later, kith, kith_argv, outbox_run_until
from support.community import mailbox_server
from support.waits import wait_for
from support.hosts import HostProcess, card_posted, notes_host

QUESTION = "when does the staging server restart"


class AckGate:
    """Holds the holder's acks signed by ``key`` until :meth:`refuse` (then they fail with
    503, as if the sender had died before the holder removed anything); other keys' acks
    pass. ``hit`` is set once such an ack arrived."""

    def __init__(self, store, key: str) -> None:
        self.store, self.key = store, key
        self.hit, self.release = threading.Event(), threading.Event()
        self.real = store.ack_sealed
        store.ack_sealed = self.ack

    def ack(self, recipient: str, records: list[tuple[str, str]]) -> int:
        if recipient != self.key:
            return self.real(recipient, records)
        self.hit.set()
        self.release.wait(60)
        raise CommunityError("database-unavailable", "the ack never reached the holder", status=503)

    def refuse(self) -> None:
        self.release.set()

    def remove(self) -> None:
        self.store.ack_sealed = self.real


def _senders(store) -> list[str]:
    with store._read() as conn:
        return sorted(r[0] for r in conn.execute("SELECT sender_key FROM mailbox").fetchall())


def _key(home: Path) -> str:
    return json.loads(kith(home, "status", "--json").stdout)["identity"]["key"]


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=20)


def _ask_later(guest: Path, person: str, url: str) -> str:
    r = kith(guest, "peers", "add", "bea", person, "--devices", "--server", url)
    assert r.returncode == 0, r.stderr
    return ask_later(guest, QUESTION, "bea")


def _homes(tmp_path: Path, url: str) -> tuple[Path, str, str, Path, str]:
    """The host home (its card, naming the mailbox, posted once), its person and device key,
    and a guest home with its key."""
    host_home = notes_host(tmp_path)
    person = card_posted(host_home, url)
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    return host_home, person, _key(host_home), guest, _key(guest)


def _answers(guest: Path, qid: str) -> list:
    with OutboxStore(guest) as outbox:
        record = outbox.get(qid)
    assert record["state"] == "answered", record["state"]
    return record["_answers"]


def _queries(host_home: Path, qid: str) -> list:
    lines = [json.loads(x) for x in (host_home / "audit.jsonl").read_text().splitlines()]
    return [x for x in lines if x["event"] == "query" and x.get("query_id") == f"outbox:{qid}"]


def test_a_host_killed_before_its_ack_answers_once_and_the_asker_keeps_one(tmp_path: Path) -> None:
    with mailbox_server(tmp_path / "c.sqlite3") as (store, url):
        host_home, person, device, guest, asker = _homes(tmp_path, url)
        qid = _ask_later(guest, person, url)
        outbox_run_until(guest, "the question at the mailbox", lambda: _senders(store) == [asker])
        gate = AckGate(store, device)
        host = HostProcess(host_home, "--server", url, "--mailbox")
        try:
            assert gate.hit.wait(60), "the host never acked"
            assert sorted(_senders(store)) == sorted([asker, device])  # its answer left, the question kept
            _kill(host.proc)  # killed between leaving the answer and the holder's ack
        finally:
            gate.refuse()
            if host.proc.poll() is None:
                host.stop()
        gate.remove()
        # its ack had left: the audit of what it sent was on its disk before, not in the batch
        # the SIGKILL threw away
        audited = [x for x in map(json.loads, (host_home / "audit.jsonl").read_text().splitlines())
                   if x.get("query_id") == f"outbox:{qid}"]
        assert [(x["event"], x["via"]) for x in audited] == [("query", "sealed"), ("results", "sealed")]
        assert sorted(_senders(store)) == sorted([asker, device])  # nothing lost
        again = HostProcess(host_home, "--server", url, "--mailbox")
        try:  # taken again, acked as answered already: one answer kept
            wait_for("the question acked", lambda: _senders(store) == [device], timeout_s=60, every_s=0.05)
        finally:
            _rc, out, _err = again.stop()
        taken = [e for e in map(json.loads, out.splitlines()) if e.get("event") == "sealed-taken"]
        # not searched, charged or audited again: dropped as answered before
        assert _queries(host_home, qid) == audited[:1]
        assert taken == [{"event": "sealed-taken", "holder": url, "answered": 0,
                          "dropped": {"sealed-replayed": 1}}]
        outbox_run_until(guest, "the answer in the outbox", lambda: _senders(store) == [])
    answers = _answers(guest, qid)
    assert len(answers) == 1 and "noon" in answers[0]["envelope"]["results"][0]["textPreview"]


def test_an_asker_killed_after_leaving_and_after_storing_stores_one_answer(tmp_path: Path) -> None:
    with mailbox_server(tmp_path / "c.sqlite3") as (store, url):
        host_home, person, device, guest, asker = _homes(tmp_path, url)
        qid = _ask_later(guest, person, url)
        # killed as soon as the question is at the holder (before its answer could come)
        run = subprocess.Popen(kith_argv(guest, "outbox", "run", "--offline"), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            wait_for("the question at the mailbox", lambda: _senders(store) == [asker], timeout_s=90)
        finally:
            _kill(run)
        host = HostProcess(host_home, "--server", url, "--mailbox")
        try:
            wait_for("the answer at the holder", lambda: _senders(store) == [device], timeout_s=60, every_s=0.05)
        finally:
            host.stop()
        # killed after it stored the answer, before the holder removed it
        gate = AckGate(store, asker)
        run = subprocess.Popen(kith_argv(guest, "outbox", "run", "--offline"), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            assert gate.hit.wait(90), "the asker never acked"
            _kill(run)
        finally:
            gate.refuse()
            if run.poll() is None:
                _kill(run)
        gate.remove()
        assert _senders(store) == [device]  # still at the holder
        outbox_run_until(guest, "the answer taken again and acked", lambda: _senders(store) == [])
    answers = _answers(guest, qid)
    assert len(answers) == 1 and "noon" in answers[0]["envelope"]["results"][0]["textPreview"]


def test_a_question_answered_live_is_not_answered_again_when_also_left_sealed(tmp_path: Path) -> None:
    """The asker's outbox reaches `kith host --mailbox` live and is answered; the same
    question (same id, same device key) is also left sealed at the mailbox. The host takes
    it, knows it answered it (`<home>/sealed-seen.sqlite`, marked as the live answer left)
    and acks it without a second answer: one query in the audit, nothing left for the
    asker at the holder."""
    import asyncio
    import time

    import httpx

    from node.community.client import CommunityClient
    from node.community.inbox import leave_question
    from node.trust.identity import load_identity

    with mailbox_server(tmp_path / "c.sqlite3") as (store, url):
        host_home, person, device, guest, asker = _homes(tmp_path, url)
        host = HostProcess(host_home, "--server", url, "--mailbox")
        try:
            post = host.invitation["post_id"]
            wait_for("this run's card on the server", lambda: post in json.dumps(
                httpx.get(f"{url}/api/v1/cards/{person}", timeout=10).json()), timeout_s=30)
            r = kith(guest, "peers", "add", "bea", person, "--devices", "--server", url)
            assert r.returncode == 0, r.stderr
            with OutboxStore(guest) as outbox:  # kept for bea (as `ask --later` keeps it), then run
                qid = outbox.add({"query": QUESTION, "topK": 5}, [("bea", person)])["id"]

            def answered() -> bool:
                with OutboxStore(guest) as outbox:
                    return outbox.get(qid)["state"] == "answered"
            outbox_run_until(guest, "the question answered live", answered)
            assert _senders(store) == []  # live: nothing was left at the holder

            async def leave() -> None:
                me = load_identity(guest)
                async with CommunityClient(url, me) as client:
                    await leave_question(client, me, None, question_id=qid,
                                         request={"query": QUESTION, "topK": 5}, peer=device,
                                         recipients=[device], expires=time.time() + 3600)
            asyncio.run(leave())
            assert _senders(store) == [asker]
            wait_for("the sealed twin acked unanswered", lambda: _senders(store) == [], timeout_s=60,
                     every_s=0.05)
        finally:
            _rc, out, _err = host.stop()
    assert [q.get("via") for q in _queries(host_home, qid)] == [None]  # one query, the live one
    taken = [e for e in map(json.loads, out.splitlines()) if e.get("event") == "sealed-taken"]
    assert [(e["answered"], e["dropped"]) for e in taken] == [(0, {"sealed-replayed": 1})]
