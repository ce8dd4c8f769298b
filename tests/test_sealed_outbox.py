"""`--later` through a holder (node/guest/sealed_outbox.py; issue 43 item 4): an outbox row
for a person pin whose card names a mailbox is left there sealed to the person's devices;
a device of that person, never up with the asker, answers it; the asker's runner task takes
the answer into the row. A peer with no such card is delivered live only, as before."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from node.community.client import CommunityClient
from node.community.inbox import take_step
from node.community.server import run_server_in_thread
from node.community.store import MailboxLimits, open_store
from node.guest.cards import accept_card
from node.guest.outbox import OutboxStore, query_id_of
from node.guest.sealed_outbox import SealedOutboxTask, mailboxes_of
from node.trust.binding import device_link
from node.trust.card import make_card
from node.trust.identity import Identity
from node.trust.invitation import create_invitation
from node.trust.peers import PeerRegistry, pin_person
from node.trust.signing import public_key_of

from support.community import NO_LIMITS
from support.homes import new_identity, node_home


def test_a_later_question_answered_through_the_persons_mailbox(tmp_path: Path) -> None:
    asker_home = node_home(tmp_path, "asker")
    person = os.urandom(32)
    laptop = Identity(os.urandom(32))
    chain = [device_link(person, laptop.public_key, "laptop", "2026-01-01T00:00:00Z", 0)]
    pin_person(PeerRegistry.load(asker_home), "bea", public_key_of(person))
    store = open_store(tmp_path / "c.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            inv = create_invitation(laptop, protocol_name="knowledge-query", protocol_version="1",
                                    protocol_id="a" * 64, ticket="endpointticket")
            card = make_card(laptop.secret, chain, inv.to_dict(), documents=1, chunks=1,
                             created="2026-12-01T00:00:00Z", seq=1, mailboxes=[url])
            accept_card(asker_home, card, via="server")
            assert mailboxes_of(asker_home, public_key_of(person)) == ([url], [laptop.public_key])
            with OutboxStore(asker_home) as outbox:
                qid = outbox.add({"query": "where is the key", "topK": 3}, [("bea", public_key_of(person))])["id"]
            task = SealedOutboxTask(asker_home, every_s=0)

            async def scenario() -> None:
                await task.step(None)  # not tried live yet: nothing is left
                assert store.mailbox_usage()["records"] == 0
                with OutboxStore(asker_home) as outbox:  # the live delivery could not reach bea
                    outbox.record_attempt(qid, public_key_of(person), None, code="transport-connect-failed")
                await task.step(None)  # the asker's runner: left with bea's mailbox
                assert store.mailbox_usage()["records"] == 1
                with OutboxStore(asker_home) as outbox:  # kith outbox shows where it waits
                    assert outbox.get(qid)["peers"][0]["leftWith"] == url
                await SealedOutboxTask(asker_home, every_s=0).step(None)  # a restarted runner: not left again
                assert store.mailbox_usage()["records"] == 1 and store.nonce_count() == 4
                async with CommunityClient(url, laptop) as h:  # bea's laptop wakes alone
                    done = await take_step(h, laptop, chain, on_question=lambda op: {
                        "action": "results", "query_id": query_id_of(op.question_id), "status": "ok",
                        "envelope": {"results": [{"id": "c1", "source": "/home/keys.md",
                                                  "textPreview": "under the blue pot"}]}})
                assert done.answered == [qid]
                await task.step(None)  # the asker's runner again: the answer is taken into the row
                assert store.mailbox_usage()["records"] == 0

            asyncio.run(scenario())
    finally:
        store.close()
    with OutboxStore(asker_home) as outbox:
        record = outbox.get(qid)
    assert record["state"] == "answered"
    # the question passed the outbound gate before it was sealed, and kith sent shows it
    sent = [json.loads(line) for line in (asker_home / "sent.jsonl").read_text().splitlines()]
    mine = [e for e in sent if e.get("agent") == "outbox" and "where is the key" in e.get("text", "")]
    assert len(mine) == 1 and mine[0]["decision"] == "sent"
    assert record["_answers"][0]["envelope"]["results"][0]["textPreview"] == "under the blue pot"


def test_a_host_reached_live_is_not_asked_again_through_the_mailbox(tmp_path: Path) -> None:
    from node.guest.sealed_outbox import _unreached

    base = {"state": "waiting", "attempts": 1, "code": "transport-connect-failed"}
    assert _unreached(base)
    assert not _unreached({**base, "attempts": 0})
    assert not _unreached({**base, "code": "rate-limited"})
    assert not _unreached({**base, "state": "pending-approval", "code": "pending-approval"})
    assert not _unreached({**base, "state": "answered"})


def test_a_peer_without_a_mailbox_card_is_left_nowhere(tmp_path: Path) -> None:
    asker_home = node_home(tmp_path, "asker")
    host = Identity(os.urandom(32))
    with OutboxStore(asker_home) as outbox:
        outbox.add({"query": "q"}, [("ada", host.public_key)])
    assert mailboxes_of(asker_home, host.public_key) == ([], [])
    assert asyncio.run(SealedOutboxTask(asker_home).step(None)) > 0  # nothing dialled, nothing raised


def _bea_with_a_mailbox(asker_home: Path, url: str) -> tuple[Identity, list, str]:
    """bea (a person pin of ``asker_home``) whose laptop's kept card names the mailbox at
    ``url``: (the laptop, its chain, bea's person key)."""
    person = os.urandom(32)
    laptop = Identity(os.urandom(32))
    chain = [device_link(person, laptop.public_key, "laptop", "2026-01-01T00:00:00Z", 0)]
    pin_person(PeerRegistry.load(asker_home), "bea", public_key_of(person))
    inv = create_invitation(laptop, protocol_name="knowledge-query", protocol_version="1",
                            protocol_id="a" * 64, ticket="endpointticket")
    accept_card(asker_home, make_card(laptop.secret, chain, inv.to_dict(), documents=1, chunks=1,
                                      created="2026-12-01T00:00:00Z", seq=1, mailboxes=[url]), via="server")
    return laptop, chain, public_key_of(person)


def test_a_question_is_left_at_the_step_after_its_live_try_failed_not_at_the_next_take(tmp_path: Path) -> None:
    """Takes are every 5 s (on the runner's clock); a question whose live try failed is left
    at the very next step — the runner steps every task when a delivery job ends — not up to
    5 s later (a `kith outbox run` waited out those seconds, an endpoint bound, before it
    left anything), and that step takes nothing."""
    from node.runtime.clock import ManualClock

    asker_home = node_home(tmp_path, "asker")
    store = open_store(tmp_path / "c.sqlite3")
    clock = ManualClock()
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            _laptop, _chain, bea = _bea_with_a_mailbox(asker_home, url)
            with OutboxStore(asker_home) as outbox:
                qid = outbox.add({"query": "where is the key", "topK": 3}, [("bea", bea)])["id"]
            task = SealedOutboxTask(asker_home, clock=clock)

            async def scenario() -> None:
                assert await task.step(None) == 5.0  # a take (nothing waits); not tried live: nothing left
                assert store.mailbox_usage()["records"] == 0 and store.nonce_count() == 1
                with OutboxStore(asker_home) as outbox:  # the live delivery could not reach bea
                    outbox.record_attempt(qid, bea, None, code="transport-connect-failed")
                assert await task.step(None) == 5.0  # the same instant: left, not taken again
                assert store.mailbox_usage()["records"] == 1 and store.nonce_count() == 2
                with OutboxStore(asker_home) as outbox:
                    assert outbox.get(qid)["peers"][0]["leftWith"] == url
                clock.advance(1.0)
                assert await task.step(None) == 4.0  # nothing untried any more: a step does nothing
                assert store.nonce_count() == 2

            asyncio.run(scenario())
    finally:
        store.close()


def test_a_runner_with_only_answers_to_take_never_opens_its_pool(tmp_path: Path) -> None:
    """The runner a `kith outbox run` drives, on a home whose one open question has its
    answer waiting at the holder: the sealed task steps first and takes it, the row is
    answered, and the live delivery finds nothing open — the runner never opens its session
    pool (no iroh endpoint bound, no host dialled)."""
    import anyio

    from node.guest.owner import Guest
    from node.guest.runner import Runner, default_tasks

    asker_home = node_home(tmp_path, "asker")
    store = open_store(tmp_path / "c.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            laptop, chain, bea = _bea_with_a_mailbox(asker_home, url)
            with OutboxStore(asker_home) as outbox:
                qid = outbox.add({"query": "where is the key", "topK": 3}, [("bea", bea)])["id"]
                outbox.record_attempt(qid, bea, None, code="transport-connect-failed")

            async def scenario() -> None:
                await SealedOutboxTask(asker_home, every_s=0).step(None)  # left by an earlier run
                async with CommunityClient(url, laptop) as h:  # bea's laptop wakes alone and answers
                    done = await take_step(h, laptop, chain, on_question=lambda op: {
                        "action": "results", "query_id": query_id_of(op.question_id), "status": "ok",
                        "envelope": {"results": [{"id": "c1", "source": "/home/keys.md",
                                                  "textPreview": "under the blue pot"}]}})
                assert done.answered == [qid]
                guest = Guest(asker_home)
                opened: list[object] = []
                real = guest.session_pool
                guest.session_pool = lambda **kw: opened.append(kw) or real(**kw)  # type: ignore[method-assign]
                answered, looked = anyio.Event(), anyio.Event()
                tasks = default_tasks(asker_home)
                delivery = next(t for t in tasks if t.name == "outbox")
                delivery_step = delivery.step

                async def step(runner: Runner) -> float:  # the delivery's step, seen once after the answer
                    wait = await delivery_step(runner)
                    if answered.is_set():
                        looked.set()
                    return wait

                delivery.step = step  # type: ignore[method-assign]
                runner = Runner(guest, tasks, command="test", on_event=lambda e: answered.set()
                                if e.get("event") == "outbox-answered" else None)
                async with anyio.create_task_group() as tg:
                    await tg.start(runner.run)
                    with anyio.fail_after(30):
                        await looked.wait()  # answered, and the delivery looked for open rows after
                    tg.cancel_scope.cancel()
                assert opened == []

            asyncio.run(scenario())
    finally:
        store.close()
    with OutboxStore(asker_home) as outbox:
        assert outbox.get(qid)["state"] == "answered"


def test_a_holder_is_shown_without_its_password_or_whole_ticket() -> None:
    """Every text line naming a holder (outbox list/show/run, the host's sealed lines, the
    client's messages) goes through one display form: a URL's ``user:password@``, query and
    fragment never print, an ``iroh:`` ticket is cut; ``--json`` keeps the stored value."""
    from node.common.names import HOLDER_SHOWN_CHARS, holder_text
    from node.community.client import CommunityClient

    assert holder_text("http://bea:s3cret@127.0.0.1:8080/base?token=s3cret#x") == "http://127.0.0.1:8080/base"
    assert holder_text("https://[::1]:8443/") == "https://[::1]:8443/"
    ticket = "iroh:" + "a" * 200
    assert holder_text(ticket) == ticket[:HOLDER_SHOWN_CHARS] + "…"
    assert "s3cret" not in holder_text("http://s3cret@127.0.0.1:1/")
    client = CommunityClient("http://bea:s3cret@127.0.0.1:8080/base", new_identity())
    assert client.display_url == "http://127.0.0.1:8080/base"  # the client's messages use the same form


def _left_with(asker_home: Path, bea: str, url: str, query: str) -> str:
    """A question for bea (:func:`_bea_with_a_mailbox`) whose live try failed, left sealed at
    ``url`` by the asker's runner task: its id."""
    with OutboxStore(asker_home) as outbox:
        qid = outbox.add({"query": query, "topK": 3}, [("bea", bea)])["id"]
        outbox.record_attempt(qid, bea, None, code="transport-connect-failed")
    asyncio.run(SealedOutboxTask(asker_home, every_s=0).step(None))
    with OutboxStore(asker_home) as outbox:
        assert outbox.get(qid)["peers"][0]["leftWith"] == url
    return qid


def _answers(url: str, laptop: Identity, chain: list) -> list[str]:
    """bea's laptop wakes alone and takes its questions at ``url``: the ids it answered."""
    async def wake() -> list[str]:
        async with CommunityClient(url, laptop) as h:
            done = await take_step(h, laptop, chain, on_question=lambda op: {
                "action": "results", "query_id": query_id_of(op.question_id), "status": "ok",
                "envelope": {"results": [{"id": "c1", "source": "/home/keys.md", "textPreview": "under the pot"}]}})
        return list(done.answered)

    return asyncio.run(wake())


def test_kith_outbox_remove_withdraws_a_question_left_at_a_holder(tmp_path: Path) -> None:
    """``kith outbox remove ID`` (a real process) of a question left sealed at bea's mailbox
    withdraws it there (an ack signed by its sender, specs/sealed.md §10): the holder keeps
    nothing, bea's laptop waking later has nothing to answer, and the command says so
    (``withdrawn``, in text and ``--json``). On main the row went and the question stayed:
    bea's laptop answered it, and the answer waited at the holder until it expired."""
    from support.cli import kith

    asker_home = node_home(tmp_path, "asker")
    store = open_store(tmp_path / "c.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            laptop, chain, bea = _bea_with_a_mailbox(asker_home, url)
            qid = _left_with(asker_home, bea, url, "where is the key")
            assert store.mailbox_usage()["records"] == 1
            r = kith(asker_home, "outbox", "remove", qid[:8], "--json", timeout=120)
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout) == {"removed": [qid], "withdrawals": [
                {"id": qid, "holder": url, "state": "withdrawn", "code": None}]}
            assert store.mailbox_usage()["records"] == 0
            assert _answers(url, laptop, chain) == []  # the host never sees it
            again = _left_with(asker_home, bea, url, "where is the spare key")
            r = kith(asker_home, "outbox", "remove", again[:8], timeout=120)
            assert r.returncode == 0, r.stderr
            assert r.stdout.splitlines()[1:] == [f"outbox {again[:12]}: withdrawn from {url}; its host will not see it"]
            assert store.mailbox_usage()["records"] == 0
    finally:
        store.close()
    with OutboxStore(asker_home) as outbox:
        assert outbox.withdrawals() == [] and outbox.list() == []


def test_a_withdrawal_the_holder_cannot_take_now_is_said_and_done_by_the_runner_later(tmp_path: Path) -> None:
    """The holder is down when the question is removed: ``kith outbox remove`` says the
    question is still there, why, and who withdraws it (``pending``, its code); once the
    holder is back, the runner's next step withdraws it and forgets the withdrawal."""
    from support.cli import kith

    asker_home = node_home(tmp_path, "asker")
    store = open_store(tmp_path / "c.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            laptop, chain, bea = _bea_with_a_mailbox(asker_home, url)
            qid = _left_with(asker_home, bea, url, "where is the key")
        r = kith(asker_home, "outbox", "remove", qid, "--json", timeout=120)  # the holder is down
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"removed": [qid], "withdrawals": [
            {"id": qid, "holder": url, "state": "pending", "code": "server-unreachable"}]}
        text = kith(asker_home, "outbox", "remove", "--done", timeout=120).stdout  # said again, still pending
        assert f"outbox {qid[:12]}: still at {url}, cannot reach it now (server-unreachable)" in text, text
        port = int(url.rsplit(":", 1)[1])
        with run_server_in_thread(store, port=port, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as back:
            assert back == url and store.mailbox_usage()["records"] == 1
            asyncio.run(SealedOutboxTask(asker_home, every_s=0).step(None))  # the home's runner
            assert store.mailbox_usage()["records"] == 0
            assert _answers(url, laptop, chain) == []
    finally:
        store.close()
    with OutboxStore(asker_home) as outbox:
        assert outbox.withdrawals() == []


def test_a_question_left_before_its_record_id_was_kept_is_withdrawn_by_the_id_its_cards_give(tmp_path: Path) -> None:
    """A row an older version left (``left_with`` set, no ``left_record``): the withdrawal
    names the id the kept cards give now (the devices it was sealed to), and the holder
    removes it."""
    from support.cli import kith

    asker_home = node_home(tmp_path, "asker")
    store = open_store(tmp_path / "c.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            laptop, chain, bea = _bea_with_a_mailbox(asker_home, url)
            qid = _left_with(asker_home, bea, url, "where is the key")
            with OutboxStore(asker_home) as outbox, outbox._tx() as db:  # as an older version left it
                db.execute("UPDATE deliveries SET left_record = NULL")
            r = kith(asker_home, "outbox", "remove", qid, "--json", timeout=120)
            assert json.loads(r.stdout)["withdrawals"] == [{"id": qid, "holder": url, "state": "withdrawn",
                                                            "code": None}], r.stdout + r.stderr
            assert store.mailbox_usage()["records"] == 0 and _answers(url, laptop, chain) == []
    finally:
        store.close()


def test_a_question_removed_while_the_runner_leaves_it_is_withdrawn_all_the_same(tmp_path: Path) -> None:
    """``kith outbox remove`` lands while the runner's step is putting the question at the
    holder (here: during the put, from the holder's admission hook): the removal found no
    copy recorded yet, so the step, finding the question gone when it records the copy,
    keeps its withdrawal and withdraws it in the same step — the host never sees it."""
    asker_home = node_home(tmp_path, "asker")
    store = open_store(tmp_path / "c.sqlite3")
    removed: list[bool] = []

    def admits(_sender: str, _recipients: tuple[str, ...]) -> bool:
        with OutboxStore(asker_home) as outbox:  # the user's removal, mid-put
            removed.append(outbox.remove(qid))
        return True

    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits(),
                                  mailbox_admits=admits) as url:
            laptop, chain, bea = _bea_with_a_mailbox(asker_home, url)
            with OutboxStore(asker_home) as outbox:
                qid = outbox.add({"query": "where is the key", "topK": 3}, [("bea", bea)])["id"]
                outbox.record_attempt(qid, bea, None, code="transport-connect-failed")
            asyncio.run(SealedOutboxTask(asker_home, every_s=0).step(None))
            assert removed == [True]
            assert store.mailbox_usage()["records"] == 0 and _answers(url, laptop, chain) == []
    finally:
        store.close()
    with OutboxStore(asker_home) as outbox:
        assert outbox.withdrawals() == [] and outbox.list() == []
