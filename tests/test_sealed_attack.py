"""Sealed questions under attack (issue 43 items 4-5): a host whose answers cannot be left
at the holder — its per-sender bound filled by one asker's unread answers — answers each
question once and only retries leaving it, instead of re-running the search, the quota and
the audit on every take. Real host home, real community server on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from node.community.client import CommunityClient
from node.community.inbox import leave_question, take_step
from node.community.server import run_server_in_thread
from node.community.store import MailboxLimits
from node.trust.identity import load_identity
from node.trust.sealed import SeenRecords

from support.community import NO_LIMITS
from support.homes import new_identity
from support.hosts import NOTES_QUESTION as QUESTION, notes_host, sealed_answerer


@pytest.fixture(scope="module")
def host_home(tmp_path_factory) -> Path:
    return notes_host(tmp_path_factory.mktemp("sealed-attack-host"))


def test_an_answer_that_cannot_be_left_is_answered_once(tmp_path: Path, host_home: Path) -> None:
    """An asker that never takes its answers fills the host's answers owed to it (1 here,
    200 by default): its next question is answered, that answer refused
    ``mailbox-sender-full`` and kept; three more takes must not query the corpus, charge the
    quota or write the audit again — and once the asker takes, the very answer computed
    first is left. Meanwhile another asker's question is answered at once: the hog fills
    only the answers owed to it (specs/sealed.md §5b)."""
    host = load_identity(host_home)
    hog, asker = new_identity(), new_identity()
    q_first, q_hog, q_asker = "c0" * 16, "c1" * 16, "c2" * 16
    got: dict[str, list] = {hog.public_key: [], asker.public_key: []}

    async def ask(url: str, who, qid: str) -> None:
        async with CommunityClient(url, who) as c:
            await leave_question(c, who, None, question_id=qid, request={"query": QUESTION, "topK": 3},
                                 peer=host.public_key, recipients=[host.public_key], expires=time.time() + 3600)

    async def take_answers(url: str, who) -> None:
        async with CommunityClient(url, who) as c:
            await take_step(c, who, None, on_answer=lambda op: got[who.public_key].append(op.body["results"]) is None)

    async def run() -> list:
        with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS,
                                  mailbox=MailboxLimits(per_sender=1)) as url:
            seen = SeenRecords()
            reports = []
            with sealed_answerer(host_home) as on_q:
                async with CommunityClient(url, host) as h:
                    await ask(url, hog, q_first)
                    reports.append(await take_step(h, host, None, on_question=on_q, seen=seen))
                    await ask(url, hog, q_hog)  # its first answer still waits at the holder
                    await ask(url, asker, q_asker)
                    for _ in range(4):
                        reports.append(await take_step(h, host, None, on_question=on_q, seen=seen))
                    await take_answers(url, hog)  # the hog takes its first answer: room again
                    reports.append(await take_step(h, host, None, on_question=on_q, seen=seen))
            await take_answers(url, hog)
            await take_answers(url, asker)
            return reports

    reports = asyncio.run(run())
    assert reports[0].answered == [q_first]
    assert reports[1].answered == [q_asker] and len(reports[1].kept) == 1  # the other asker is not held up
    assert all(len(r.kept) == 1 and not r.answered for r in reports[2:5])
    assert reports[5].answered == [q_hog]
    lines = [json.loads(x) for x in (host_home / "audit.jsonl").read_text().splitlines()]
    queried = [x for x in lines if x.get("peer") == hog.public_key and x["event"] == "query"]
    assert len(queried) == 2  # each question answered once, however often its answer had to wait
    assert [r["query_id"] for r in got[hog.public_key]] == [f"outbox:{q_first}", f"outbox:{q_hog}"]
    assert [r["query_id"] for r in got[asker.public_key]] == [f"outbox:{q_asker}"]


@pytest.mark.parametrize("address", ["0.0.0.0:0", "[::]:0"])
def test_hold_mail_refuses_an_address_no_asker_can_dial(tmp_path: Path, address: str) -> None:
    """`--hold-mail 0.0.0.0:8740` (the natural way to "serve the LAN") would put
    `http://0.0.0.0:8740` in this device's card: every asker reading it dials its own machine.
    It is refused before anything starts, saying what to give instead."""
    from support.cli import kith

    home = tmp_path / "h"
    assert kith(home, "init").returncode == 0
    r = kith(home, "host", "--offline", "--invite-file", str(tmp_path / "inv"), "--hold-mail", address, timeout=30)
    assert r.returncode == 2 and "error [usage]" in r.stderr and "LAN address" in r.stderr, r.stderr
    assert not (home / "mailbox.sqlite3").exists() and not (tmp_path / "inv").exists()


def test_one_question_for_two_peers_through_one_mailbox_reaches_both(tmp_path: Path, host_home: Path,
                                                                     tmp_path_factory) -> None:
    """`kith ask Q --peer bea --peer carl --later`: one outbox question id, kept for two peers
    (specs/outbox.md §3). When both sleep and both cards name the same mailbox, the question
    is sealed once to each — and each host gets its own, and answers it; the asker gets both
    answers. (The outer id was derived from the question id alone: the second record and the
    second answer were refused `mailbox-conflict`, taken as "kept already", and lost.)"""
    bea, carl_home = host_home, notes_host(tmp_path_factory.mktemp("sealed-attack-carl"))
    asker = new_identity()
    qid = "c3" * 16
    answers: list = []

    async def run() -> dict:
        with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            for home in (bea, carl_home):
                peer = load_identity(home)
                async with CommunityClient(url, asker) as c:
                    await leave_question(c, asker, None, question_id=qid, request={"query": QUESTION, "topK": 3},
                                         peer=peer.public_key, recipients=[peer.public_key],
                                         expires=time.time() + 3600)
            reports = {}
            for home in (bea, carl_home):
                me = load_identity(home)
                with sealed_answerer(home) as on_q:
                    async with CommunityClient(url, me) as h:
                        reports[me.public_key] = await take_step(h, me, None, on_question=on_q)
            async with CommunityClient(url, asker) as c:
                await take_step(c, asker, None, on_answer=lambda op: answers.append(op.sender) is None)
            return reports

    reports = asyncio.run(run())
    hosts = sorted(load_identity(h).public_key for h in (bea, carl_home))
    assert {k: r.answered for k, r in reports.items()} == {k: [qid] for k in hosts}
    assert sorted(answers) == hosts


def _answer_from(sender, chain, asker, qid: str, text: str):
    from node.guest.outbox import query_id_of
    from node.trust.sealed import open_sealed, seal

    now = time.time()
    body = {"action": "results", "query_id": query_id_of(qid), "status": "ok",
            "envelope": {"results": [{"id": "c1", "source": "/docs/notes.md", "textPreview": text}]}}
    rec = seal(sender.secret, chain, kind="answer", question_id=qid, body={"results": body},
               recipients=[asker.public_key], now=now, expires=now + 600)
    return open_sealed(rec, asker.secret, now=now)


def test_a_revoked_or_blocked_device_of_the_person_cannot_answer(tmp_path: Path) -> None:
    """The live path drops the answer of a device its person revoked (a list kept here) or
    that this home blocked (`kith peers block KEY`); a sealed answer from it — a stolen
    laptop still holding its seed and chain — must not be stored as the person's answer
    either. A device still in good standing answers as before."""
    import os

    from node.guest.outbox import OutboxStore
    from node.guest.sealed_answers import store_sealed_answer
    from node.trust.binding import device_link
    from node.trust.revocation_list import RevocationStore, check_list, make_list
    from node.trust.signing import public_key_of

    from support.cli import kith

    home = tmp_path / "ada"
    assert kith(home, "init").returncode == 0
    person = os.urandom(32)
    asker, stolen, blocked, good = new_identity(), new_identity(), new_identity(), new_identity()
    chain = {d.public_key: [device_link(person, d.public_key, n, "2026-01-01T00:00:00Z", 0)]
             for d, n in ((stolen, "stolen"), (blocked, "old"), (good, "desk"))}
    RevocationStore.load(home).offer(check_list(make_list(person, [stolen.public_key], 0, "2026-02-01T00:00:00Z")),
                                     via="import", now="2026-02-01T00:00:00Z")
    assert kith(home, "peers", "block", blocked.public_key).returncode == 0
    with OutboxStore(home) as store:
        qid = store.add({"query": "when", "topK": 5}, [("bea", public_key_of(person))])["id"]
        for device in (stolen, blocked):
            assert not store_sealed_answer(store, _answer_from(device, chain[device.public_key], asker, qid, "forged"))
            assert store.get(qid)["peers"][0]["state"] == "waiting"
        assert store_sealed_answer(store, _answer_from(good, chain[good.public_key], asker, qid, "at noon"))
        record = store.get(qid)
    assert record["_answers"][0]["envelope"]["results"][0]["textPreview"] == "at noon"


def test_another_senders_record_under_the_answers_id_neither_swallows_nor_delays_the_answer(
        tmp_path: Path, host_home: Path) -> None:
    """A peer asked the same question live (`--peer bea --peer carl`) learns its id
    (`outbox:ID`), so it can compute bea's answer's outer id and put a record of its own under
    it first. The holder keeps records by (sender, id): the squat fills only carl's own
    space, bea's answer is kept at the first take (not refused, not taken for "kept
    already"), the asker stores bea's answer and drops carl's record (its id is not carl's:
    `sealed-forged`), and acking it leaves bea's record alone."""
    from node.trust.sealed import record_id, seal

    host = load_identity(host_home)
    asker, carl = new_identity(), new_identity()
    qid = "c4" * 16
    got: list = []

    async def run() -> tuple:
        with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            async with CommunityClient(url, asker) as c:
                await leave_question(c, asker, None, question_id=qid, request={"query": QUESTION, "topK": 3},
                                     peer=host.public_key, recipients=[host.public_key], expires=time.time() + 3600)
            squat = seal(carl.secret, None, kind="answer", question_id=qid, body={"results": {}},
                         recipients=[asker.public_key], now=time.time(), expires=time.time() + 3600)
            squat["id"] = record_id("answer", qid, host.public_key, [asker.public_key])
            async with CommunityClient(url, carl) as c:
                await c.put_sealed(squat)
            with sealed_answerer(host_home) as on_q:
                async with CommunityClient(url, host) as h:
                    first = await take_step(h, host, None, on_question=on_q, seen=SeenRecords())
            async with CommunityClient(url, asker) as c:
                took = await take_step(c, asker, None, on_answer=lambda op: got.append(op.sender) is None)
                left, _more, _next = await c.take_sealed_page()
            return first, took, left

    first, took, left = asyncio.run(run())
    assert first.answered == [qid] and first.kept == [] and first.acked == 1
    assert got == [host.public_key] and took.refused == {"sealed-forged": 1} and took.acked == 2
    assert left == []


def test_an_answer_is_sealed_only_to_keys_tied_to_the_asker(tmp_path: Path, host_home: Path) -> None:
    """A sealed question names the keys its answer is sealed to (`reply_to.keys`). The host
    answers only when each is the asker's own device key or a device its person bound by a
    chain the question carries: mallory cannot get an answer sealed to ada's key (the holder
    would hand it to ada's key, and mallory learns what the host answers ada's questions
    from), nor name a device of another person — refused `sealed-reply-foreign`, not searched,
    nothing left. A device of the asker's own person with its chain is answered."""
    import os

    from node.trust.binding import device_link
    from node.trust.sealed import open_sealed, seal

    host = load_identity(host_home)
    mallory, ada, phone, strangers_device = new_identity(), new_identity(), new_identity(), new_identity()
    person, stranger = os.urandom(32), os.urandom(32)

    def link(secret: bytes, device, name: str) -> list:
        return [device_link(secret, device.public_key, name, "2026-01-01T00:00:00Z", 0)]

    def question(sender, chain, qid: str, keys: list[str], chains: dict | None = None) -> dict:
        reply = {"keys": keys, "holders": [], **({"chains": chains} if chains is not None else {})}
        return seal(sender.secret, chain, kind="question", question_id=qid,
                    body={"request": {"query": QUESTION, "topK": 3}, "peer": host.public_key, "reply_to": reply},
                    recipients=[host.public_key], now=time.time(), expires=time.time() + 3600)

    asks = [
        (mallory, question(mallory, None, "d1" * 16, [ada.public_key])),  # another's key
        (mallory, question(mallory, None, "d2" * 16, [mallory.public_key, ada.public_key])),
        (mallory, question(mallory, link(person, mallory, "m"), "d3" * 16, [strangers_device.public_key],
                           {strangers_device.public_key: link(stranger, strangers_device, "s")})),  # another person's
        (ada, question(ada, link(person, ada, "laptop"), "d4" * 16, [ada.public_key, phone.public_key],
                       {phone.public_key: link(person, phone, "phone")})),  # her own person's phone
    ]

    async def run() -> tuple:
        with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            for who, record in asks:
                async with CommunityClient(url, who) as c:
                    await c.put_sealed(record)
            with sealed_answerer(host_home) as on_q:
                async with CommunityClient(url, host) as h:
                    report = await take_step(h, host, None, on_question=on_q, seen=SeenRecords())
            left = {}
            for who in (ada, phone, mallory, strangers_device):
                async with CommunityClient(url, who) as c:
                    left[who.public_key] = (await c.take_sealed_page())[0]
            return report, left

    report, left = asyncio.run(run())
    assert report.refused == {"sealed-reply-foreign": 3} and report.answered == ["d4" * 16] and report.acked == 4
    assert left[mallory.public_key] == [] and left[strangers_device.public_key] == []
    assert left[ada.public_key] == left[phone.public_key] and len(left[ada.public_key]) == 1
    opened = open_sealed(left[phone.public_key][0], phone.secret, now=time.time())
    assert opened.kind == "answer" and opened.question_id == "d4" * 16
    lines = [json.loads(x) for x in (host_home / "audit.jsonl").read_text().splitlines()]
    assert not [x for x in lines if x.get("peer") == mallory.public_key and x["event"] == "query"]
