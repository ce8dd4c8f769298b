"""The community server's mailbox (issue 43 item 2a; specs/community-api.md "Mailbox",
specs/sealed.md): off by default; signed put / take / ack of sealed records on SQLite and
PostgreSQL behind a real HTTP server; idempotent by record id; bounded per sender, per
recipient and in total; expired records never handed out; no plaintext in the database."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from node.community.client import CommunityClient
from node.community.ratelimit import RateLimit, RateLimits
from node.community.requests import signed_headers
from node.community.server import run_server_in_thread
from node.community.store import MailboxLimits, open_store
from node.common.errors import CommunityError, KithError
from node.trust.binding import device_link
from node.trust.identity import Identity
from node.trust.sealed import open_sealed, seal

from support.community import (  # noqa: F401 (pg_server: a fixture)
    NO_LIMITS,
    error_of,
    fresh_pg_database as _fresh_pg_database,
    mailbox_server,
    pg_server,
)
from support.homes import new_identity

QUESTION = "which valve feeds the greenhouse sprinkler line"
ANSWER_TEXT = "the second brass valve left of the rain barrel"
QID = "5f" * 16


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path: Path) -> str | Path:
    if request.param == "sqlite":
        return tmp_path / "community.sqlite3"
    return _fresh_pg_database(request.getfixturevalue("pg_server"))


def chain_of(device: Identity) -> list:
    return [device_link(os.urandom(32), device.public_key, "laptop", "2026-01-01T00:00:00Z", 0)]


def question(asker: Identity, *hosts: Identity, qid: str = QID, now: float | None = None, ttl: float = 3600,
             text: str = QUESTION) -> dict:
    now = time.time() if now is None else now
    return seal(asker.secret, chain_of(asker), kind="question", question_id=qid,
                body={"request": {"query": text, "topK": 5}, "peer": hosts[0].public_key,
                      "reply_to": {"keys": [asker.public_key], "holders": []}},
                recipients=[h.public_key for h in hosts], now=now, expires=now + ttl)


def put(http: httpx.Client, record: dict, signer: Identity, clock: float | None = None) -> httpx.Response:
    body = json.dumps(record).encode()
    return http.post("/api/v1/mailbox", content=body,
                     headers=signed_headers(signer, "POST", "/api/v1/mailbox", body, now=clock))


def take(http: httpx.Client, signer: Identity, limit: int = 20, clock: float | None = None,
         **extra: object) -> httpx.Response:
    body = json.dumps({"limit": limit, **extra}).encode()
    return http.post("/api/v1/mailbox/take", content=body,
                     headers=signed_headers(signer, "POST", "/api/v1/mailbox/take", body, now=clock))


def put_questions(http: httpx.Client, host: Identity, n: int) -> list[dict]:
    """``n`` questions for ``host``, each from a new asker (ids 1..n), put in order: the
    records as put, oldest first."""
    sent = []
    for i in range(n):
        sender = new_identity()
        rec = question(sender, host, qid=f"{i + 1:032x}")
        assert put(http, rec, sender).status_code == 201
        sent.append(rec)
    return sent


def ack(http: httpx.Client, records: list[dict], signer: Identity) -> httpx.Response:
    body = json.dumps({"records": [{"sender": r["sender"], "id": r["id"]} for r in records]}).encode()
    return http.post("/api/v1/mailbox/ack", content=body,
                     headers=signed_headers(signer, "POST", "/api/v1/mailbox/ack", body))


@pytest.fixture
def served(database) -> Iterator[tuple[str, object]]:
    with mailbox_server(database) as (store, url):
        yield url, store


def test_the_mailbox_is_off_by_default(tmp_path: Path) -> None:
    asker, host = new_identity(), new_identity()
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        for response in (put(http, question(asker, host), asker), take(http, host), 
                         ack(http, [{"sender": "cd" * 32, "id": "ab" * 16}], host)):
            assert response.status_code == 404 and error_of(response) == "mailbox-off"


def test_the_sender_withdraws_its_own_record_and_nobody_else_s_on_each_store(served) -> None:
    """An ack signed by a record's sender withdraws it (``kith outbox remove`` of a question
    left here, specs/sealed.md §10): the host's take no longer hands it out and the totals
    drop. A stranger's ack of it, or the sender's ack of another sender's record under the
    same id, removes nothing (on main the sender's ack was ignored: removed 0, the question
    stayed for the host to answer)."""
    url, store = served
    asker, squatter, host, stranger = new_identity(), new_identity(), new_identity(), new_identity()

    async def scenario() -> None:
        async with CommunityClient(url, asker) as a, CommunityClient(url, squatter) as q, \
                CommunityClient(url, host) as h, CommunityClient(url, stranger) as s:
            rec = question(asker, host)
            squat = question(squatter, host)
            squat["id"] = rec["id"]  # the same outer id, another sender: a record of its own
            await a.put_sealed(rec)
            await q.put_sealed(squat)  # the holder cannot check an id: kept as the squatter's own
            assert await s.ack_sealed([(rec["sender"], rec["id"])]) == 0  # not its record
            assert await q.ack_sealed([(rec["sender"], rec["id"])]) == 0  # nor the squatter's
            assert await a.ack_sealed([(squat["sender"], squat["id"])]) == 0  # nor the asker's, the squat
            assert store.mailbox_usage()["records"] == 2
            assert await a.ack_sealed([(rec["sender"], rec["id"])]) == 1  # withdrawn by its sender
            assert [r["sender"] for r in (await h.take_sealed_page())[0]] == [squatter.public_key]
            assert store.mailbox_usage() == store.mailbox_totals() == {"records": 1, "bytes": squat["bucket"]}
            assert await a.ack_sealed([(rec["sender"], rec["id"])]) == 0  # withdrawn again: harmless

    asyncio.run(scenario())


def test_a_question_and_its_answer_through_the_mailbox_on_each_store(served) -> None:
    """The asker leaves a question sealed to two devices of the host; the host takes it,
    opens it, acks it (once for both devices), and leaves its answer; the asker takes that."""
    url, store = served
    asker, laptop, desktop, stranger = new_identity(), new_identity(), new_identity(), new_identity()

    async def scenario() -> None:
        async with CommunityClient(url, asker) as a, CommunityClient(url, laptop) as h1, \
                CommunityClient(url, desktop) as h2, CommunityClient(url, stranger) as s:
            rec = question(asker, laptop, desktop)
            assert (await a.put_sealed(rec))["stored"] is True
            assert (await a.put_sealed(rec))["stored"] is False  # given twice: stored once
            assert store.mailbox_usage()["records"] == 1
            assert await s.take_sealed_page() == ([], False, None)
            for client, me in ((h1, laptop), (h2, desktop)):
                records, more, _next = await client.take_sealed_page()
                assert [r["id"] for r in records] == [rec["id"]] and not more
                assert records[0] == rec  # handed out exactly as put
                opened = open_sealed(records[0], me.secret, now=time.time())
                assert opened.body["request"]["query"] == QUESTION
            assert await s.ack_sealed([(rec["sender"], rec["id"])]) == 0  # not its record: nothing happens
            assert await h2.ack_sealed([(rec["sender"], rec["id"])]) == 1  # one device acks for both
            assert await h1.take_sealed_page() == ([], False, None)
            assert await h1.ack_sealed([(rec["sender"], rec["id"])]) == 0  # acked again: harmless
            answer = seal(laptop.secret, chain_of(laptop), kind="answer", question_id=opened.question_id,
                          body={"results": {"action": "results", "status": "ok", "text": ANSWER_TEXT}},
                          recipients=opened.body["reply_to"]["keys"], now=time.time(), expires=time.time() + 600)
            assert (await h1.put_sealed(answer))["stored"] is True
            records, _more, _next = await a.take_sealed_page()
            got = open_sealed(records[0], asker.secret, now=time.time())
            assert got.kind == "answer" and got.question_id == QID and got.body["results"]["text"] == ANSWER_TEXT
            assert await a.ack_sealed([(records[0]["sender"], records[0]["id"])]) == 1
            assert store.mailbox_usage() == {"records": 0, "bytes": 0} == store.mailbox_totals()

    asyncio.run(scenario())


def test_refusals_store_nothing_on_each_store(served) -> None:
    url, store = served
    asker, host, mallory = new_identity(), new_identity(), new_identity()
    rec = question(asker, host)
    with httpx.Client(base_url=url, timeout=20) as http:
        r = put(http, rec, mallory)  # only the sender leaves its record
        assert r.status_code == 403 and error_of(r) == "forbidden"
        r = put(http, {**rec, "bucket": 1000}, asker)
        assert r.status_code == 400 and error_of(r) == "sealed-wrong-size"
        box = base64.b64decode(rec["box"])
        r = put(http, {**rec, "box": base64.b64encode(box[:-1]).decode()}, asker)
        assert r.status_code == 400 and error_of(r) == "sealed-wrong-size"
        r = put(http, question(asker, host, now=time.time() - 7200), asker)
        assert r.status_code == 400 and error_of(r) == "sealed-expired"
        r = put(http, {**rec, "type": "card"}, asker)
        assert r.status_code == 400 and error_of(r) == "sealed-malformed"
        r = http.post("/api/v1/mailbox", content=b"[]", headers=signed_headers(asker, "POST", "/api/v1/mailbox", b"[]"))
        assert r.status_code == 400 and error_of(r) == "request-invalid"
        assert store.mailbox_usage()["records"] == 0
        assert put(http, rec, asker).status_code == 201
        # the same question sealed again has other bytes under the same id: refused, the first stays
        r = put(http, question(asker, host), asker)
        assert r.status_code == 409 and error_of(r) == "mailbox-conflict"
        records = take(http, host).json()["records"]
        assert records == [rec]
        for bad in ({"records": []}, {"records": [{"sender": asker.public_key, "id": "X" * 32}]},
                    {"records": [{"sender": "ab", "id": rec["id"]}]}, {"records": [{"id": rec["id"]}]},
                    {"ids": [rec["id"]]}, {"records": "ab"}, {"limit": 5}):
            body = json.dumps(bad).encode()
            r = http.post("/api/v1/mailbox/ack", content=body,
                          headers=signed_headers(host, "POST", "/api/v1/mailbox/ack", body))
            assert r.status_code == 400 and error_of(r) == "request-invalid"
        for limit in (0, 101, True):
            body = json.dumps({"limit": limit}).encode()
            r = http.post("/api/v1/mailbox/take", content=body,
                          headers=signed_headers(host, "POST", "/api/v1/mailbox/take", body))
            assert r.status_code == 400 and error_of(r) == "request-invalid"
        unsigned = http.post("/api/v1/mailbox/take", content=b"{}")
        assert unsigned.status_code == 401 and error_of(unsigned) == "request-unsigned"


def test_bounds_per_sender_per_recipient_and_in_total_on_each_store(database) -> None:
    limits = MailboxLimits(per_sender=2, per_recipient=3, max_records=5, max_bytes=1 << 20)
    flooder, host, others = new_identity(), new_identity(), [new_identity() for _ in range(6)]
    with run_server_in_thread(database, rate_limits=NO_LIMITS, mailbox=limits) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        def qid(i: int) -> str:
            return f"{i:032x}"
        assert put(http, question(flooder, host, qid=qid(1)), flooder).status_code == 201
        assert put(http, question(flooder, host, qid=qid(2)), flooder).status_code == 201
        r = put(http, question(flooder, host, qid=qid(3)), flooder)  # a flood from one sender
        assert r.status_code == 429 and error_of(r) == "mailbox-sender-full"
        assert put(http, question(others[0], host, qid=qid(4)), others[0]).status_code == 201
        r = put(http, question(others[1], host, qid=qid(5)), others[1])  # the host has 3 waiting
        assert r.status_code == 507 and error_of(r) == "mailbox-recipient-full"
        assert put(http, question(others[1], others[2], qid=qid(6)), others[1]).status_code == 201
        assert put(http, question(others[3], others[4], qid=qid(7)), others[3]).status_code == 201
        r = put(http, question(others[5], others[4], qid=qid(8)), others[5])  # 5 in total
        assert r.status_code == 507 and error_of(r) == "mailbox-full"
        # an ack frees room at once
        kept = take(http, host).json()["records"]
        assert len(kept) == 3 and ack(http, kept[:1], host).json() == {"removed": 1}
        assert put(http, question(others[5], others[4], qid=qid(8)), others[5]).status_code == 201
    store = open_store(database)
    try:  # the totals the bounds read are the tables' own
        assert store.mailbox_totals() == store.mailbox_usage() == {"records": 5, "bytes": 5 * 2048}
    finally:
        store.close()


def test_total_bytes_bound(tmp_path: Path) -> None:
    limits = MailboxLimits(max_bytes=4096)  # two 2 KiB buckets
    a, b, c, host = new_identity(), new_identity(), new_identity(), new_identity()
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=limits) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        assert put(http, question(a, host), a).status_code == 201
        assert put(http, question(b, host, qid="1" * 32), b).status_code == 201
        r = put(http, question(c, host, qid="2" * 32), c)
        assert r.status_code == 507 and error_of(r) == "mailbox-full"


def test_expired_records_are_never_handed_out_and_are_removed(tmp_path: Path) -> None:
    now = [time.time()]
    asker, host = new_identity(), new_identity()
    store = open_store(tmp_path / "c.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits(),
                                  clock=lambda: now[0]) as url, httpx.Client(base_url=url, timeout=20) as http:
            assert put(http, question(asker, host, ttl=60), asker, clock=now[0]).status_code == 201
            now[0] += 61
            assert take(http, host, clock=now[0]).json() == {"records": [], "more": False}
            assert store.mailbox_usage()["records"] == 1  # until the next put
            assert put(http, question(asker, host, qid="7" * 32, now=now[0]), asker, clock=now[0]).status_code == 201
            assert store.mailbox_usage()["records"] == 1 and store.mailbox_totals() == store.mailbox_usage()
    finally:
        store.close()


def test_take_pages_and_reports_more(tmp_path: Path) -> None:
    host = new_identity()
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        sent = put_questions(http, host, 5)
        first = take(http, host, limit=3).json()
        assert first["records"] == sent[:3] and first["more"] is True
        ack(http, sent[:3], host)
        rest = take(http, host, limit=3).json()
        assert rest["records"] == sent[3:] and rest["more"] is False


def test_a_record_put_after_a_take_is_after_its_cursor_when_the_clock_steps_back(database) -> None:
    """A holder pages on with the take's ``next``; a record put after that take is handed
    out by the next take from that cursor even when the server's clock stepped back between
    the two puts (stored times only grow: specs/community-api.md "Mailbox"), on each store."""
    now = [time.time()]
    host, early, late = new_identity(), new_identity(), new_identity()
    if isinstance(database, Path):
        database.parent.mkdir(parents=True, exist_ok=True)
    store = open_store(database)
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits(),
                                  clock=lambda: now[0]) as url, httpx.Client(base_url=url, timeout=20) as http:
            first = question(early, host, now=now[0])
            assert put(http, first, early, clock=now[0]).status_code == 201
            page = take(http, host, limit=1, clock=now[0]).json()
            assert page["records"] == [first] and page["more"] is False
            now[0] -= 30  # the server's clock steps back (an NTP step, a VM restored)
            second = question(late, host, qid="5" * 32, now=now[0])
            assert put(http, second, late, clock=now[0]).status_code == 201
            after = take(http, host, limit=5, clock=now[0], after=page["next"]).json()
            assert after["records"] == [second]  # not passed over by the kept cursor
            assert take(http, host, limit=5, clock=now[0]).json()["records"] == [first, second]
    finally:
        store.close()


def test_a_take_pages_on_from_its_cursor_on_each_store(served) -> None:
    """The take's cursor (specs/community-api.md "Mailbox"): a recipient that leaves records
    at the holder pages past them with ``after`` = the last take's ``next``, over the same
    records in the same order, none skipped or given twice; a cursor a take did not give is
    ``400 take-cursor-invalid`` (a bad limit stays ``request-invalid``) and the client raises
    that code; a take without one starts from the oldest, as before."""
    url, store = served
    host = new_identity()
    with httpx.Client(base_url=url, timeout=20) as http:
        sent = put_questions(http, host, 7)
        pages, after = [], None
        while True:
            page = take(http, host, limit=3, **({} if after is None else {"after": after})).json()
            pages.append(page["records"])
            after = page["next"]
            if not page["more"]:
                break
        assert pages == [sent[0:3], sent[3:6], sent[6:7]]  # nothing acked: paged past, in order
        assert take(http, host, limit=3, after=after).json() == {"records": [], "more": False}  # no next
        assert take(http, host, limit=3).json()["records"] == sent[:3]  # no cursor: from the oldest
        first = take(http, host, limit=2).json()["next"]
        ack(http, sent[:3], host)  # acked meanwhile: the cursor still pages on
        assert take(http, host, limit=2, after=first).json()["records"] == sent[3:5]
        stored, sender_key, record_id = first.rsplit(".", 2)
        for bad in ("", "x", 5, ["a"], first + "0", first.upper(), f"inf.{sender_key}.{record_id}",
                    f"{stored}.{sender_key[:-1]}.{record_id}", f"1.5.{sender_key}.{record_id}", "0x1.0p+0." * 30):
            response = take(http, host, after=bad)
            assert response.status_code == 400 and error_of(response) == "take-cursor-invalid", bad
        response = take(http, host, limit=0, after=first)
        assert response.status_code == 400 and error_of(response) == "request-invalid"
        assert store.mailbox_usage()["records"] == 4  # a take, with or without a cursor, removes nothing

    async def client_take(after: str) -> CommunityError:
        async with CommunityClient(url, host) as client:
            with pytest.raises(CommunityError) as refused:
                await client.take_sealed_page(3, after)
        return refused.value

    refused = asyncio.run(client_take(first + "0"))  # what a caller of the client sees
    assert refused.code == "take-cursor-invalid" and refused.status == 400, refused


def test_the_key_rate_limit_applies_to_the_mailbox(tmp_path: Path) -> None:
    asker, host = new_identity(), new_identity()
    limits = RateLimits(per_key=RateLimit(0.001, 2), per_address=RateLimit(0, 1))
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=limits, mailbox=MailboxLimits()) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        assert put(http, question(asker, host), asker).status_code == 201
        assert put(http, question(asker, host, qid="1" * 32), asker).status_code == 201
        r = put(http, question(asker, host, qid="2" * 32), asker)
        assert r.status_code == 429 and error_of(r) == "rate-limited" and "Retry-After" in r.headers


def test_racing_puts_on_two_instances_keep_the_total_bound(pg_server) -> None:
    """Two server processes' worth of instances on one PostgreSQL database: 12 senders race
    for a mailbox of 5; exactly 5 are kept."""
    database = _fresh_pg_database(pg_server)
    host = new_identity()
    senders = [new_identity() for _ in range(12)]
    limits = MailboxLimits(max_records=5)
    with run_server_in_thread(database, rate_limits=NO_LIMITS, mailbox=limits) as url1, \
            run_server_in_thread(database, rate_limits=NO_LIMITS, mailbox=limits) as url2:
        async def race() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as client:
                async def one(i: int, s: Identity) -> int:
                    body = json.dumps(question(s, host, qid=f"{i + 1:032x}")).encode()
                    url = (url1, url2)[i % 2]
                    return (await client.post(url + "/api/v1/mailbox", content=body, headers=signed_headers(
                        s, "POST", "/api/v1/mailbox", body))).status_code
                return await asyncio.gather(*(one(i, s) for i, s in enumerate(senders)))

        codes = asyncio.run(race())
    assert sorted(codes) == [201] * 5 + [507] * 7
    store = open_store(database)
    try:
        assert store.mailbox_usage()["records"] == 5 and store.mailbox_totals() == store.mailbox_usage()
    finally:
        store.close()


def test_the_database_file_holds_no_plaintext(tmp_path: Path) -> None:
    """Greps the SQLite file (and its WAL) for the question, the answer, the question id and
    the asker's chain: none is there — only keys, times, buckets and ciphertext."""
    db = tmp_path / "community.sqlite3"
    asker, host = new_identity(), new_identity()
    with run_server_in_thread(db, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        assert put(http, question(asker, host), asker).status_code == 201
        answer = seal(host.secret, None, kind="answer", question_id=QID,
                      body={"results": {"status": "ok", "text": ANSWER_TEXT}}, recipients=[asker.public_key],
                      now=time.time(), expires=time.time() + 600)
        assert put(http, answer, host).status_code == 201
        raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("community.sqlite3"))
        assert asker.public_key.encode() in raw  # the metadata is there...
        for secret in (QUESTION, ANSWER_TEXT, "greenhouse", "brass valve", QID, "laptop", '"query"'):
            assert secret.encode() not in raw, secret  # ...the plaintext is not
            assert secret.encode("utf-16-le") not in raw


def test_a_holder_cannot_make_a_record_open(served) -> None:
    """A record altered at the holder (a flipped byte of the stored box) is refused by the
    recipient as sealed-forged; the holder cannot pass it off as the sender's."""
    url, store = served
    asker, host = new_identity(), new_identity()
    rec = question(asker, host)
    with httpx.Client(base_url=url, timeout=20) as http:
        assert put(http, rec, asker).status_code == 201
        got = take(http, host).json()["records"][0]
    box = bytearray(base64.b64decode(got["box"]))
    box[100] ^= 0x40
    with pytest.raises(KithError) as err:
        open_sealed({**got, "box": base64.b64encode(bytes(box)).decode()}, host.secret, now=time.time())
    assert err.value.code == "sealed-forged"


def answer_to(host: Identity, asker: Identity, qid: str) -> dict:
    now = time.time()
    return seal(host.secret, chain_of(host), kind="answer", question_id=qid,
                body={"results": {"action": "results", "status": "ok", "text": ANSWER_TEXT}},
                recipients=[asker.public_key], now=now, expires=now + 600)


def test_one_askers_questions_cannot_crowd_out_the_answers_owed_to_others_on_each_store(database) -> None:
    """A host's answer is put while the question it answers waits (the host acks after), so
    the holder counts it against the bound of the asker it goes to: an asker that fills its
    own bound with questions fills the host's answers to *it*, never the answers owed to
    another asker, nor the host's own questions."""
    limits = MailboxLimits(per_sender=2)
    flooder, other, host, third = new_identity(), new_identity(), new_identity(), new_identity()
    with run_server_in_thread(database, rate_limits=NO_LIMITS, mailbox=limits) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        def qid(i: int) -> str:
            return f"{i:032x}"
        for i in (1, 2):
            assert put(http, question(flooder, host, qid=qid(i)), flooder).status_code == 201
        for i in (1, 2):  # both answered; the questions acked once the answers are kept
            assert put(http, answer_to(host, flooder, qid(i)), host).status_code == 201
        assert ack(http, take(http, host).json()["records"], host).json() == {"removed": 2}
        assert put(http, question(flooder, host, qid=qid(3)), flooder).status_code == 201
        r = put(http, answer_to(host, flooder, qid(3)), host)  # 2 answers wait for the flooder
        assert r.status_code == 429 and error_of(r) == "mailbox-sender-full"
        assert put(http, question(other, host, qid=qid(4)), other).status_code == 201
        assert put(http, answer_to(host, other, qid(4)), host).status_code == 201  # owed to another asker
        assert put(http, question(host, third, qid=qid(5)), host).status_code == 201  # the host's own question
        assert put(http, question(host, third, qid=qid(6)), host).status_code == 201
        r = put(http, question(host, third, qid=qid(7)), host)  # its own questions keep their bound
        assert r.status_code == 429 and error_of(r) == "mailbox-sender-full"


def test_a_question_to_a_host_whose_card_does_not_opt_in_is_refused_on_each_store(served) -> None:
    """The server keeps hosts' cards: a record to a device whose kept card names no
    mailboxes (card format 1) and to no device whose card does is refused
    `403 mailbox-not-accepted` and nothing is kept; a device with a format-2 card, or one the
    server keeps no card of, is not refused, nor is the answer to an asker that asked here."""
    url, store = served
    asker, plain, opted, unknown = new_identity(), new_identity(), new_identity(), new_identity()
    person = new_identity().public_key
    for device, doc in ((plain, {"seq": 1}), (opted, {"seq": 1, "mailboxes": [url]})):
        assert store.put_card(device.public_key, person, 1, doc, expires_unix=time.time() + 3600,
                              now=time.time()) == "new"
    with httpx.Client(base_url=url, timeout=20) as http:
        r = put(http, question(asker, plain, qid="1" * 32), asker)
        assert r.status_code == 403 and error_of(r) == "mailbox-not-accepted"
        r = put(http, question(asker, plain, unknown, qid="1" * 32), asker)  # an unknown key does not open it
        assert r.status_code == 403 and error_of(r) == "mailbox-not-accepted"
        assert store.mailbox_usage()["records"] == 0
        assert put(http, question(asker, plain, opted, qid="2" * 32), asker).status_code == 201
        assert put(http, question(asker, unknown, qid="3" * 32), asker).status_code == 201
        # the asker's own card does not opt in: a host's answer to its question waiting here is kept
        assert store.put_card(asker.public_key, person, 1, {"seq": 1}, expires_unix=time.time() + 3600,
                              now=time.time()) == "new"
        assert put(http, answer_to(unknown, asker, "3" * 32), unknown).status_code == 201
        stranger = new_identity()
        r = put(http, question(stranger, asker, qid="5" * 32), stranger)  # but not another's question to it
        assert r.status_code == 403 and error_of(r) == "mailbox-not-accepted"


def test_a_client_that_hangs_up_mid_body_is_a_quiet_close(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """A client that sends a mailbox request's head and part of its body, then closes its
    socket (a `kith outbox run` stopped mid-ack): the server drops that request quietly — no
    `ClientDisconnect` traceback on stderr or in the log — keeps nothing, and goes on
    serving. The server is stopped before the check: uvicorn's shutdown waits for the
    hung-up request's handler, so it has run to its end."""
    import logging
    import socket
    from urllib.parse import urlsplit

    caplog.set_level(logging.WARNING)
    asker, host = new_identity(), new_identity()
    record = seal(asker.secret, None, kind="question", question_id=QID, body={"q": QUESTION},
                  recipients=[host.public_key], now=time.time(), expires=time.time() + 600)
    body = json.dumps(record).encode()
    with mailbox_server(tmp_path / "c.sqlite3") as (store, url):
        where = urlsplit(url)
        for path in ("/api/v1/mailbox", "/api/v1/mailbox/ack"):
            headers = signed_headers(asker, "POST", path, body)
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n{head}\r\n".encode() + body[: len(body) // 2])
            # a socket closed mid-body: the server may still be reading it; the next client is served
            with httpx.Client(base_url=url, trust_env=False) as http:
                assert http.get("/api/v1/health").status_code == 200
        with store._read() as conn:
            assert conn.execute("SELECT count(*) FROM mailbox").fetchone()[0] == 0
    # the server stopped: every handler (the hung-up ones too) ran to its end
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ClientDisconnect" not in err, err
