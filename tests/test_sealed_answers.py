"""A sealed answer goes into the outbox row it answers, once, and only from the peer the row
was kept for (node/guest/sealed_answers.py; issue 43 item 4). Then the whole way round on
a real server: the asker's outbox row is answered by a host that was never up with it."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from node.community.client import CommunityClient
from node.community.inbox import leave_question, take_step
from node.community.server import run_server_in_thread
from node.community.store import MailboxLimits
from node.guest.outbox import OutboxStore, query_id_of
from node.guest.sealed_answers import store_sealed_answer
from node.trust.binding import device_link
from node.trust.identity import Identity
from node.trust.sealed import open_sealed, seal
from node.trust.signing import public_key_of

from support.community import NO_LIMITS
from support.homes import new_identity

NOW = time.time()


def results(qid: str, status: str = "ok", text: str = "at noon") -> dict:
    return {"action": "results", "query_id": query_id_of(qid), "status": status,
            "envelope": {"results": [{"id": "c1", "source": "/docs/notes.md", "textPreview": text}]}}


def answer_from(sender: Identity, chain: list | None, asker: Identity, qid: str, body: dict):
    rec = seal(sender.secret, chain, kind="answer", question_id=qid, body={"results": body},
               recipients=[asker.public_key], now=NOW, expires=NOW + 600)
    return open_sealed(rec, asker.secret, now=NOW)


def test_stored_once_and_only_from_the_pinned_peer(tmp_path: Path) -> None:
    asker, host, other = new_identity(), new_identity(), new_identity()
    with OutboxStore(tmp_path) as store:
        qid = store.add({"query": "when", "topK": 5}, [("ada", host.public_key)])["id"]
        assert not store_sealed_answer(store, answer_from(other, None, asker, qid, results(qid)))  # not ada
        assert not store_sealed_answer(store, answer_from(host, None, asker, "f" * 32, results("f" * 32)))
        assert not store_sealed_answer(store, answer_from(host, None, asker, qid, results("e" * 32)))  # wrong id
        assert store.get(qid)["peers"][0]["state"] == "waiting"
        assert store_sealed_answer(store, answer_from(host, None, asker, qid, results(qid)))
        assert not store_sealed_answer(store, answer_from(host, None, asker, qid, results(qid, text="again")))
        record = store.get(qid)
    assert record["peers"][0]["state"] == "answered"
    assert record["_answers"][0]["envelope"]["results"][0]["textPreview"] == "at noon"


def test_a_person_pin_takes_the_answer_of_any_of_its_devices(tmp_path: Path) -> None:
    person = os.urandom(32)
    asker, laptop = new_identity(), new_identity()
    chain = [device_link(person, laptop.public_key, "laptop", "2026-01-01T00:00:00Z", 0)]
    stranger_chain = [device_link(os.urandom(32), laptop.public_key, "laptop", "2026-01-01T00:00:00Z", 0)]
    with OutboxStore(tmp_path) as store:
        qid = store.add({"query": "when"}, [("bea", public_key_of(person))])["id"]
        assert not store_sealed_answer(store, answer_from(laptop, stranger_chain, asker, qid, results(qid)))
        assert not store_sealed_answer(store, answer_from(laptop, chain, asker, qid, results(qid, "rate-limited")))
        assert store.get(qid)["peers"][0]["code"] == "rate-limited"  # recorded; the row stays open
        assert store_sealed_answer(store, answer_from(laptop, chain, asker, qid, results(qid)))
        assert store.get(qid)["peers"][0]["state"] == "answered"


def test_an_outbox_question_answered_through_the_mailbox(tmp_path: Path) -> None:
    """The asker's `--later` question (an outbox row) left sealed with the holder, taken and
    answered by the host while the asker is away, and stored in the row when it wakes."""
    asker, host = new_identity(), new_identity()
    home = tmp_path / "asker"
    home.mkdir()

    async def scenario(url: str) -> None:
        with OutboxStore(home) as store:
            record = store.add({"query": "when does it restart", "topK": 3}, [("ada", host.public_key)])
        async with CommunityClient(url, asker) as a:
            await leave_question(a, asker, None, question_id=record["id"], request=record["request"],
                                 peer=host.public_key, recipients=[host.public_key], expires=time.time() + 3600)
        async with CommunityClient(url, host) as h:
            done = await take_step(h, host, None, on_question=lambda op: results(op.question_id))
        assert done.answered == [record["id"]]
        with OutboxStore(home) as store:
            async with CommunityClient(url, asker) as a:
                got = await take_step(a, asker, None, on_answer=lambda op: store_sealed_answer(store, op))
            assert got.stored == [record["id"]] and got.acked == 1
            assert store.get(record["id"])["state"] == "answered"

    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(scenario(url))


def test_the_host_part_pages_past_the_answers_it_leaves_for_the_asker_part(tmp_path: Path) -> None:
    """specs/sealed.md §11, the take's cursor: 25 answers for `dev`'s asker part (more than a
    take's 20) wait ahead of one question for its host part, and only the host part runs. Its
    step takes the first page (all answers: left), pages on past them, answers the question
    and acks it alone; the 25 answers stay for the asker part, which takes them all later."""
    from node.community.store import open_store

    from support.community import record_ids

    dev, ada, bea = new_identity(), new_identity(), new_identity()
    store = open_store(tmp_path / "c.sqlite3")

    async def scenario(url: str) -> None:
        async with CommunityClient(url, ada) as a:
            for i in range(25):
                rec = seal(ada.secret, None, kind="answer", question_id=f"{i + 1:032x}",
                           body={"results": results(f"{i + 1:032x}")}, recipients=[dev.public_key],
                           now=time.time(), expires=time.time() + 600)
                assert (await a.put_sealed(rec))["stored"] is True
        async with CommunityClient(url, bea) as b:
            question = await leave_question(b, bea, None, question_id="b" * 32, request={"query": "where is the key"},
                                            peer=dev.public_key, recipients=[dev.public_key],
                                            expires=time.time() + 3600)
        answers = [r for r in record_ids(store) if r != question["id"]]
        async with CommunityClient(url, dev) as d:
            got = await take_step(d, dev, None, on_question=lambda op: results(op.question_id, text="under the pot"))
        assert got.answered == ["b" * 32] and got.acked == 1 and got.refused == {} and not got.more
        assert sorted(got.kept) == sorted(answers)  # the asker part's, left at the holder
        assert set(answers) <= set(record_ids(store)) and question["id"] not in record_ids(store)
        async with CommunityClient(url, bea) as b:  # bea's answer is there
            taken: list[dict] = []
            done = await take_step(b, bea, None, on_answer=lambda op: taken.append(op.body["results"]) is None)
        assert done.stored == ["b" * 32] and taken[0]["envelope"]["results"][0]["textPreview"] == "under the pot"
        async with CommunityClient(url, dev) as d:  # the asker part, later: every answer, none lost
            stored: list[str] = []
            got = await take_step(d, dev, None, on_answer=lambda op: stored.append(op.question_id) is None)
            got2 = await take_step(d, dev, None, on_answer=lambda op: stored.append(op.question_id) is None)
        assert sorted(stored) == [f"{i + 1:032x}" for i in range(25)] and got.acked + got2.acked == 25
        assert record_ids(store) == []

    try:
        with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            asyncio.run(scenario(url))
    finally:
        store.close()


def test_the_hosts_loop_keeps_its_cursor_and_reads_the_asker_parts_answers_once(tmp_path: Path) -> None:
    """specs/sealed.md §11: a `kith host --mailbox` whose holder keeps 25 answers for this
    device's asker part (more than a take's 20) passes over them once; a question left
    after that is taken by a later round of its loop from the cursor it kept — the server
    hands out each of the 25 once in the whole run (it handed all 25 out again every 5 s)."""
    from node.trust.identity import load_identity

    from support.community import mailbox_server, record_ids
    from support.hosts import HostProcess, notes_host
    from support.waits import answered_and_acked, wait_for

    host_home = notes_host(tmp_path)
    dev, ada, bea = load_identity(host_home), new_identity(), new_identity()
    with mailbox_server(tmp_path / "server" / "c.sqlite3") as (store, url):
        given: list[str] = []  # every record id the server handed out to the host's takes
        take = store.take_sealed

        def counted_take(recipient: str, **kw):
            rows, more = take(recipient, **kw)
            if recipient == dev.public_key:
                given.extend(r["id"] for r in rows)
            return rows, more

        store.take_sealed = counted_take  # the server's own store, counting what it hands out

        async def leave_answers() -> list[str]:
            async with CommunityClient(url, ada) as a:
                return [(await a.put_sealed(seal(ada.secret, None, kind="answer", question_id=f"{i + 1:032x}",
                                                 body={"results": results(f"{i + 1:032x}")},
                                                 recipients=[dev.public_key], now=time.time(),
                                                 expires=time.time() + 600)))["id"] for i in range(25)]

        async def leave_one_question() -> None:
            async with CommunityClient(url, bea) as b:
                await leave_question(b, bea, None, question_id="b" * 32, request={"query": "staging server"},
                                     peer=dev.public_key, recipients=[dev.public_key], expires=time.time() + 3600)

        answers = asyncio.run(leave_answers())
        host = HostProcess(host_home, "--server", url, "--mailbox")
        try:
            wait_for("the host's first round over the 25 answers", lambda: set(answers) <= set(given), timeout_s=60)
            asyncio.run(leave_one_question())
            question_ids = [r for r in record_ids(store) if r not in answers]
            wait_for("the question answered and acked", answered_and_acked(lambda: record_ids(store), question_ids),
                     timeout_s=60, every_s=0.05)
        finally:
            code, _out, err = host.stop()
        assert code == 0, err
        assert set(answers) <= set(record_ids(store))  # still there for the asker part
    assert len(question_ids) == 1 and question_ids[0] in given
    assert sorted(given.count(a) for a in answers) == [1] * 25, given  # passed over once, never again


def test_a_step_from_a_cursor_the_holder_refuses_takes_from_the_oldest(tmp_path: Path) -> None:
    """A kept cursor the holder refuses (``take-cursor-invalid``: another holder, its file
    replaced) is dropped: the step takes from the oldest and answers what waits; its report's
    ``next`` is the new holder's cursor, and a step from it reads nothing again."""
    dev, bea = new_identity(), new_identity()

    async def scenario(url: str) -> None:
        async with CommunityClient(url, bea) as b:
            await leave_question(b, bea, None, question_id="b" * 32, request={"query": "where is the key"},
                                 peer=dev.public_key, recipients=[dev.public_key], expires=time.time() + 3600)
        async with CommunityClient(url, dev) as d:
            got = await take_step(d, dev, None, on_question=lambda op: results(op.question_id), after="not-a-cursor")
            assert got.answered == ["b" * 32] and got.acked == 1 and got.next not in (None, "not-a-cursor")
            again = await take_step(d, dev, None, on_question=lambda op: results(op.question_id), after=got.next)
            assert again.answered == [] and again.kept == [] and again.next == got.next  # an empty page keeps it

    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        asyncio.run(scenario(url))


@pytest.mark.parametrize("first", ["asker", "host"])
def test_a_device_both_asker_and_host_leaves_each_kind_to_its_own_part(tmp_path: Path, first: str) -> None:
    """specs/sealed.md §3/§5b: the holder cannot tell a question from an answer, so a device
    that both asks and hosts is handed both kinds on every take. Here `dev` asked `ada` (its
    outbox row, id Q) and `bea` asked `dev` a question under the very same id Q: the asker's
    part (its runner's on_answer) stores ada's answer and leaves bea's question at the holder
    (``kept``, not acked, not stored as an answer); the host's part answers bea's question
    and leaves ada's answer there — whichever part wakes first. Nothing is lost or refused."""
    from node.community.store import open_store

    from support.community import record_ids

    dev, ada, bea = new_identity(), new_identity(), new_identity()
    home = tmp_path / "dev"
    home.mkdir()
    store = open_store(tmp_path / "c.sqlite3")

    async def scenario(url: str) -> None:
        with OutboxStore(home) as outbox:
            qid = outbox.add({"query": "when does it restart", "topK": 3}, [("ada", ada.public_key)])["id"]
        async with CommunityClient(url, dev) as d:
            await leave_question(d, dev, None, question_id=qid, request={"query": "when does it restart"},
                                 peer=ada.public_key, recipients=[ada.public_key], expires=time.time() + 3600)
        async with CommunityClient(url, bea) as b:  # a question where dev expects an answer: the same id
            question = await leave_question(b, bea, None, question_id=qid, request={"query": "where is the key"},
                                            peer=dev.public_key, recipients=[dev.public_key],
                                            expires=time.time() + 3600)
        async with CommunityClient(url, ada) as a:  # ada wakes and answers dev
            assert (await take_step(a, ada, None, on_question=lambda op: results(op.question_id))).answered == [qid]
        ada_answer = [r for r in record_ids(store) if r != question["id"]]
        assert len(ada_answer) == 1  # at the holder for dev: bea's question and ada's answer

        async def asker_part() -> None:
            with OutboxStore(home) as outbox:
                async with CommunityClient(url, dev) as d:
                    got = await take_step(d, dev, None, on_answer=lambda op: store_sealed_answer(outbox, op))
                row = outbox.get(qid)
            assert got.stored == [qid] and got.refused == {} and got.acked == 1
            assert got.kept == ([question["id"]] if first == "asker" else [])  # left for the host part
            assert row["state"] == "answered" and len(row["_answers"]) == 1
            assert row["_answers"][0]["envelope"]["results"][0]["textPreview"] == "at noon"

        async def host_part() -> None:
            async with CommunityClient(url, dev) as d:
                got = await take_step(d, dev, None, on_question=lambda op: results(op.question_id, text="under the pot"))
            assert got.answered == [qid] and got.refused == {} and got.acked == 1
            assert got.kept == (ada_answer if first == "host" else [])  # left for the asker part

        for part in ((asker_part, host_part) if first == "asker" else (host_part, asker_part)):
            await part()
        async with CommunityClient(url, bea) as b:  # bea's answer came from dev's host part, once
            answers: list[dict] = []
            got = await take_step(b, bea, None, on_answer=lambda op: answers.append(op.body["results"]) is None)
        assert got.stored == [qid] and answers[0]["envelope"]["results"][0]["textPreview"] == "under the pot"
        assert record_ids(store) == []

    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            asyncio.run(scenario(url))
    finally:
        store.close()
