"""Two homes that are never up at the same time exchange a question and its answer through
the community server's mailbox (issue 43 items 2a, 3, 4; node/community/inbox.py): the
asker leaves a sealed question and goes away; the host wakes, takes it, answers it through
its answer service (its policy at answer time), leaves the sealed answer and goes away; the
asker wakes and takes its answer. Killed between answering and acking, the host answers
again with the same id and the asker keeps one answer; a question handed out twice is
answered once; a forged record is dropped with its code."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from pathlib import Path

import pytest

from node.community.client import CommunityClient
from node.community.inbox import leave_question, results_for, take_step
from node.community.server import run_server_in_thread
from node.community.store import MailboxLimits, open_store
from node.trust.binding import device_link
from node.trust.identity import Identity
from node.trust.sealed import SeenRecords, seal

from support.community import NO_LIMITS
from support.homes import new_identity
from support.hosts import notes_host

QID = "c0ffee" + "0" * 26
QUESTION = "when does the staging server restart"


def chain_of(device: Identity) -> list:
    return [device_link(os.urandom(32), device.public_key, "phone", "2026-01-01T00:00:00Z", 0)]


class Killed(BaseException):
    """Stands for a kill -9 at one step (never caught by the code under test)."""


def fixed_answer(text: str):
    def answer(opened) -> dict:
        return {"action": "results", "query_id": f"outbox:{opened.question_id}", "status": "ok",
                "envelope": {"results": [{"textPreview": text}]}}
    return answer


def test_two_homes_never_up_together_through_the_mailbox(tmp_path: Path) -> None:
    from node.host.host import open_knowledge

    host_home = notes_host(tmp_path)
    from node.trust.identity import load_identity

    host = load_identity(host_home)
    asker = new_identity()
    db = tmp_path / "community.sqlite3"
    stored: dict[str, dict] = {}

    async def asker_asks(url: str) -> None:
        async with CommunityClient(url, asker) as c:
            await leave_question(c, asker, chain_of(asker), question_id=QID, request={"query": QUESTION, "topK": 3},
                                 peer=host.public_key, recipients=[host.public_key], expires=time.time() + 3600)

    async def host_wakes(url: str) -> None:
        knowledge = open_knowledge(host_home, lambda _: None)
        try:
            async with CommunityClient(url, host) as c:
                report = await take_step(c, host, None, on_question=lambda op: results_for(
                    knowledge.handle_for(None, op.sender), op))
        finally:
            knowledge.close()
        assert report.answered == [QID] and report.acked == 1 and not report.refused

    async def asker_wakes(url: str) -> None:
        async with CommunityClient(url, asker) as c:
            report = await take_step(c, asker, None, on_answer=lambda op: stored.setdefault(
                op.question_id, op.body["results"]) is not None)
        assert report.stored == [QID] and report.acked == 1

    with run_server_in_thread(db, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(asker_asks(url))   # the asker is up alone, then sleeps
        asyncio.run(host_wakes(url))   # the host is up alone, then sleeps
        asyncio.run(asker_wakes(url))  # the asker wakes
        raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("community.sqlite3"))
    results = stored[QID]
    assert results["status"] == "ok" and results["query_id"] == f"outbox:{QID}"
    assert "noon" in results["envelope"]["results"][0]["textPreview"]
    for plain in (QUESTION, "staging server", "noon", QID):  # the holder never saw either
        assert plain.encode() not in raw, plain


def test_killed_before_the_ack_answers_again_and_the_asker_keeps_one(tmp_path: Path) -> None:
    host, asker = new_identity(), new_identity()
    store = open_store(tmp_path / "c.sqlite3")
    calls = [0]

    def kill_at_the_ack() -> float:
        # node.community.inbox reads the clock: 1 open, 2 seen, 3 an answer kept unsent, 4 seal
        # the answer, 5 keep it as sent (after the put), 6 record the question as done (admit)
        calls[0] += 1
        if calls[0] == 6:
            raise Killed()
        return time.time()

    async def scenario(url: str) -> None:
        async with CommunityClient(url, asker) as a, CommunityClient(url, host) as h:
            await leave_question(a, asker, None, question_id=QID, request={"query": QUESTION}, peer=host.public_key,
                                 recipients=[host.public_key], expires=time.time() + 3600)
            with pytest.raises(Killed):
                await take_step(h, host, None, on_question=fixed_answer("first"), clock=kill_at_the_ack)
            assert store.mailbox_usage()["records"] == 2  # the question (not acked) and the answer
            again = await take_step(h, host, None, on_question=fixed_answer("second"))  # a new process
            assert again.answered == [QID] and again.acked == 1
            assert store.mailbox_usage()["records"] == 1  # one answer: the second was the same id
            kept: list[str] = []
            got = await take_step(a, asker, None, on_answer=lambda op: kept.append(
                op.body["results"]["envelope"]["results"][0]["textPreview"]) is None)
            assert got.stored == [QID] and kept == ["first"]

    with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(scenario(url))
    store.close()


def test_an_answer_to_a_question_withdrawn_while_it_was_answered_is_dropped_not_retried(tmp_path: Path) -> None:
    """The asker withdraws its question (``kith outbox remove``: an ack signed by the
    sender) while the host is answering it. The holder no longer counts the answer a reply,
    and the asker's card there takes no sealed records, so the put is refused
    ``mailbox-not-accepted`` — for good. The host records the question done and drops the
    answer with that code; its next take neither answers it again nor keeps trying."""
    host, asker = new_identity(), new_identity()
    store = open_store(tmp_path / "c.sqlite3")
    store.put_card(asker.public_key, asker.public_key, 1, {"device": asker.public_key},  # no "mailboxes"
                   expires_unix=time.time() + 3600, now=time.time())
    answered: list[str] = []

    async def scenario(url: str) -> None:
        async with CommunityClient(url, asker) as a, CommunityClient(url, host) as h:
            await leave_question(a, asker, None, question_id=QID, request={"query": QUESTION}, peer=host.public_key,
                                 recipients=[host.public_key], expires=time.time() + 3600)
            records, _more, _next = await h.take_sealed_page()
            record_id = records[0]["id"]

            async def withdraw_then_answer(opened) -> dict:
                assert await a.ack_sealed([(asker.public_key, record_id)]) == 1  # the withdrawal
                answered.append(opened.question_id)
                return fixed_answer("late")(opened)

            seen = SeenRecords()
            report = await take_step(h, host, None, on_question=withdraw_then_answer, seen=seen)
            assert report.refused == {"mailbox-not-accepted": 1} and not report.answered and not report.kept
            again = await take_step(h, host, None, on_question=withdraw_then_answer, seen=seen)
            assert not again.kept and not again.answered and answered == [QID]
            assert store.mailbox_usage()["records"] == 0  # nothing waits at the holder

    with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(scenario(url))
    store.close()


def test_a_question_handed_out_twice_is_answered_once(tmp_path: Path) -> None:
    host, asker = new_identity(), new_identity()
    store = open_store(tmp_path / "c.sqlite3")
    seen = SeenRecords()
    answered: list[str] = []

    def answer(opened) -> dict:
        answered.append(opened.question_id)
        return fixed_answer("once")(opened)

    async def scenario(url: str) -> None:
        async with CommunityClient(url, asker) as a, CommunityClient(url, host) as h:
            for _ in range(2):  # the same question left again (a holder replaying it)
                await leave_question(a, asker, None, question_id=QID, request={"query": QUESTION},
                                     peer=host.public_key, recipients=[host.public_key], expires=time.time() + 3600)
                report = await take_step(h, host, None, on_question=answer, seen=seen)
            assert report.refused == {"sealed-replayed": 1} and report.acked == 1
            assert answered == [QID]
            records, _more, _next = await a.take_sealed_page()
            assert len(records) == 1

    with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(scenario(url))
    store.close()


def test_records_that_do_not_open_are_dropped_with_their_code(tmp_path: Path) -> None:
    host, asker, other = new_identity(), new_identity(), new_identity()
    store = open_store(tmp_path / "c.sqlite3")

    async def scenario(url: str) -> None:
        async with CommunityClient(url, asker) as a, CommunityClient(url, host) as h:
            now = time.time()
            good = seal(asker.secret, None, kind="question", question_id=QID, body={"request": {"query": "q"},
                        "peer": host.public_key, "reply_to": {"keys": [asker.public_key], "holders": []}},
                        recipients=[host.public_key, other.public_key], now=now, expires=now + 600)
            box = bytearray(base64.b64decode(good["box"]))
            box[50] ^= 1
            await a.put_sealed({**good, "box": base64.b64encode(bytes(box)).decode()})  # the holder cannot tell
            no_reply = seal(asker.secret, None, kind="question", question_id="1" * 32, body={"request": {}},
                            recipients=[host.public_key], now=now, expires=now + 600)
            await a.put_sealed(no_reply)
            report = await take_step(h, host, None, on_question=fixed_answer("x"))
            assert report.refused == {"sealed-forged": 1, "sealed-malformed": 1} and report.acked == 2
            assert report.answered == [] and store.mailbox_usage()["records"] == 0

    with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(scenario(url))
    store.close()


def test_the_host_never_dials_a_holder_the_asker_names(tmp_path: Path) -> None:
    """reply_to.holders naming another server (it could be any address on the host's
    network): the answer goes to the holder the question came from, the other gets nothing."""
    host, asker = new_identity(), new_identity()
    own, other = open_store(tmp_path / "own.sqlite3"), open_store(tmp_path / "other.sqlite3")

    async def scenario(url: str, elsewhere: str) -> None:
        async with CommunityClient(url, asker) as a, CommunityClient(url, host) as h:
            await leave_question(a, asker, None, question_id=QID, request={"query": QUESTION}, peer=host.public_key,
                                 recipients=[host.public_key], holders=[elsewhere], expires=time.time() + 3600)
            report = await take_step(h, host, None, on_question=fixed_answer("here"))
            assert report.answered == [QID]
            records, _more, _next = await a.take_sealed_page()
            assert len(records) == 1

    try:
        with run_server_in_thread(own, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url, \
                run_server_in_thread(other, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as elsewhere:
            asyncio.run(scenario(url, elsewhere))
        assert other.mailbox_usage()["records"] == 0 and other.nonce_count() == 0  # never requested
    finally:
        own.close()
        other.close()


def test_the_asker_killed_before_its_ack_keeps_one_answer(tmp_path: Path) -> None:
    """The asker stores the answer, then dies before acking it: the next step finds the row
    closed (nothing stored twice) and acks the record."""
    host, asker = new_identity(), new_identity()
    store = open_store(tmp_path / "c.sqlite3")
    kept: list[str] = []
    calls = [0]

    def kill_after_storing() -> float:  # 1 open, 2 seen, 3 record it as done (after on_answer)
        calls[0] += 1
        if calls[0] == 3:
            raise Killed()
        return time.time()

    def store_once(opened) -> bool:  # the outbox's rule: only into an open row
        if opened.question_id in kept:
            return False
        kept.append(opened.question_id)
        return True

    async def scenario(url: str) -> None:
        async with CommunityClient(url, asker) as a, CommunityClient(url, host) as h:
            await leave_question(a, asker, None, question_id=QID, request={"query": QUESTION}, peer=host.public_key,
                                 recipients=[host.public_key], expires=time.time() + 3600)
            await take_step(h, host, None, on_question=fixed_answer("x"))
            with pytest.raises(Killed):
                await take_step(a, asker, None, on_answer=store_once, clock=kill_after_storing)
            again = await take_step(a, asker, None, on_answer=store_once)
            assert again.stored == [] and again.acked == 1 and kept == [QID]
            assert store.mailbox_usage()["records"] == 0

    with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(scenario(url))
    store.close()


def test_a_seen_file_that_goes_bad_while_the_host_runs_is_named_and_the_question_stays(tmp_path: Path) -> None:
    """``<home>/sealed-seen.sqlite`` read fine at start and damaged after: the take loop said
    "the mailbox at URL could not be read", blaming the holder, and the question was dropped
    (acked) as if it were at fault. It names the local file and its code, and the question
    stays at the holder for the take after the file is fixed."""
    import anyio

    from node.host.sealed_host import take_sealed_questions
    from node.runtime.clock import ManualClock
    from node.trust.identity import init_identity
    from node.trust.sealed_seen import FILE_NAME, DurableSeen

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    host, asker = init_identity(home)[0], new_identity()
    seen = DurableSeen(home)  # probed at start: no file yet, fine
    (home / FILE_NAME).write_bytes(os.urandom(4096))  # then it goes bad
    store = open_store(tmp_path / "c.sqlite3")
    said: list[str] = []

    class RunningHost:  # the parts of node.host.host.Host the take loop reads
        def __init__(self, url: str) -> None:
            self.home, self.identity, self.clock = home, host, ManualClock()
            self.door = self.knowledge = self.audit = None
            self.held_mail = self.held_url = self.listener = None  # no mail held, no iroh holder
            self.url = url

        def mail_urls(self) -> list[str]:
            return [self.url]

        def sealed_seen(self) -> DurableSeen:
            return seen

        def warn(self, line: str) -> None:
            said.append(line)

        def emit(self, ev: dict) -> None:
            raise AssertionError(f"nothing is taken while the file is bad: {ev}")

    async def scenario(url: str) -> None:
        async with CommunityClient(url, asker) as a:
            await leave_question(a, asker, None, question_id=QID, request={"query": QUESTION}, peer=host.public_key,
                                 recipients=[host.public_key], expires=time.time() + 3600)
        async with anyio.create_task_group() as tg:
            tg.start_soon(take_sealed_questions, RunningHost(url))
            with anyio.fail_after(30):
                while not said:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(scenario(url))
        assert store.mailbox_usage()["records"] == 1  # the question is still there, not acked
    store.close()
    assert len(said) == 1 and "could not be read" not in said[0], said
    assert f"[config-invalid] {FILE_NAME} is not a readable database" in said[0] and f"mv {home / FILE_NAME}" in said[0]
