"""A device of the host's person holds mail over iroh (issue 43 item 2b; specs/sealed.md §7b):
`kith host --hold-mail iroh` serves the mailbox on its own ALPN beside knowledge-query, on the
endpoint it already runs — no HTTP listener. Real `kith` processes and real iroh endpoints on
loopback with relays disabled (`--offline`).

1. two homes never up at the same time complete a question and an answer through the
   always-on device: the laptop takes from it with `--holder iroh:TICKET` (from its own host
   endpoint), the guest's runner leaves the question and takes the answer from its session
   pool's endpoint;
2. a peer that opens the mailbox ALPN with junk gets one typed refusal frame
   (`mail-frame-invalid`) and its connection is closed with that code; the holder serves on;
3. a record neither from nor to the person's devices is refused `mailbox-not-held` over
   iroh, through the one rule of the HTTP routes, and nothing of it is kept;
4. a holder over iroh that cannot be reached is named a device holding mail;
5. the take's cursor pages over the frames unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from node.common.errors import CommunityError
from node.common.names import holder_text
from node.community.iroh_mail import MAILBOX_ALPN, MAX_CONNECTIONS, mail_client
from node.community.store import open_store
from node.transport.iroh import bind_node
from node.trust.identity import Identity
from node.trust.sealed import seal

from support.cli import kith
from support.community import NO_LIMITS
from support.held_mail import held_ids, never_up_together_through_a_holder
from support.hosts import HostProcess, notes_host


def _holder(home: Path, tmp: Path, how: str = "iroh") -> tuple[HostProcess, str]:
    """`kith host --hold-mail HOW` for ``home`` and the holder's ``iroh:<ticket>`` (its
    invitation's ticket: the endpoint the mailbox ALPN is served on, with ``iroh`` and with
    ``HOST:PORT`` alike)."""
    proc = HostProcess(home, "--invite-file", str(tmp / f"{home.name}.inv"), "--hold-mail", how)
    return proc, "iroh:" + proc.invitation["transport_info"]["ticket"]


@asynccontextmanager
async def app_held_over_iroh(app, secret: bytes):
    """The mailbox ``app`` served over iroh on loopback by a holder endpoint of its own,
    and a node endpoint of ``secret`` to dial it from: yields ``(url, endpoint)`` — the
    holder's ``iroh:`` URL and the ``async () -> node`` that ``mail_client`` dials from.
    The holder stops serving on exit."""
    from node.community.iroh_mail import serve_mail_connection

    async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as holder, \
            bind_node(secret, MAILBOX_ALPN, local=True) as node:
        async def serve() -> None:
            while (conn := await holder.accept()) is not None:
                await serve_mail_connection(holder, conn, app)

        async def endpoint():
            return node

        task = asyncio.create_task(serve())
        try:
            yield "iroh:" + holder.ticket(), endpoint
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def test_two_homes_never_up_together_through_a_device_holding_mail_over_iroh(tmp_path: Path) -> None:
    def text_cuts_the_ticket(guest: Path, qid: str, holder_url: str) -> None:
        listed = kith(guest, "outbox", "list").stdout  # text shows the ticket cut; --json keeps it whole
        assert holder_url not in listed and "…]" in listed, listed  # (the table folds the cell)
        shown_left = kith(guest, "outbox", "show", qid).stdout
        assert f"left sealed with {holder_text(holder_url)}:" in shown_left, shown_left

    trip = never_up_together_through_a_holder(tmp_path, lambda always_on: _holder(always_on, tmp_path),
                                              on_left=text_cuts_the_ticket)
    taken = [json.loads(line) for line in trip.woken_out.splitlines() if '"sealed-taken"' in line]
    assert taken and taken[0]["holder"] == trip.holder_url, trip.woken_out  # --json: the whole ticket
    print(f"answer at the always-on device over iroh {trip.took_s:.2f} s after the laptop's `kith host` started")


async def _junk_then_close(ticket: str, junk: bytes) -> tuple[dict, str]:
    """Open the mailbox ALPN at ``ticket``, send ``junk``; the response frame and the
    reason the holder closed the connection with."""
    async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as node:
        conn = await node.connect(ticket, alpn=MAILBOX_ALPN)
        stream = await node.open_stream(conn)
        await stream.send(junk)
        raw = b""
        while not raw.endswith(b"\n"):
            data = await stream.receive()
            assert data, f"the holder ended the stream without a response frame: {raw!r}"
            raw += data
        with pytest.raises(Exception) as closed:  # iroh raises its own error type on a closed connection
            await stream.receive()
            await conn.closed()
            raise AssertionError("the connection stayed open")
        return json.loads(raw), f"{closed.value!r} {conn.close_reason()!r}"


def test_junk_on_the_mailbox_alpn_gets_a_typed_refusal_and_a_closed_connection(tmp_path: Path) -> None:
    (tmp_path / "l").mkdir()
    laptop = notes_host(tmp_path / "l")
    holder, url = _holder(laptop, tmp_path)
    try:
        for junk in (b"GET / HTTP/1.1 not a frame\n",  # not JSON
                     b'{"op": "put", "headers": {}, "body": "not base64!"}\n',  # a frame's shape, a bad body
                     b"x" * (300 * 1024)):  # over the request frame's bound, no end of line
            answer, reason = asyncio.run(_junk_then_close(url.removeprefix("iroh:"), junk))
            assert answer["status"] == 400 and answer["body"]["error"]["code"] == "mail-frame-invalid", answer
            assert "mail-frame-invalid" in reason, reason
        assert held_ids(laptop) == []

        async def still_serves() -> tuple[list, bool, str | None]:  # the holder serves on: a signed take is answered
            async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as node:
                async def endpoint():
                    return node
                async with mail_client(url, Identity(os.urandom(32)), endpoint=endpoint) as client:
                    return await client.take_sealed_page(5)

        assert asyncio.run(still_serves()) == ([], False, None)
    finally:
        code, _out, err = holder.stop()
    assert code == 0, err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("how", ["iroh", "127.0.0.1:0"])  # iroh only; HTTP and iroh
def test_a_record_of_strangers_is_refused_mailbox_not_held_over_iroh(tmp_path: Path, how: str) -> None:
    (tmp_path / "l").mkdir()
    laptop = notes_host(tmp_path / "l")
    laptop_key = json.loads(kith(laptop, "status", "--json").stdout)["identity"]["key"]
    stranger, other = Identity(os.urandom(32)), Identity(os.urandom(32))

    def record(to: str, qid: str) -> dict:
        return seal(stranger.secret, None, kind="question", question_id=qid, body={"request": {"query": "q"}},
                    recipients=[to], now=time.time(), expires=time.time() + 600)

    async def scenario(url: str) -> None:
        async with bind_node(stranger.secret, MAILBOX_ALPN, local=True) as node:
            async def endpoint():
                return node
            async with mail_client(url, stranger, endpoint=endpoint) as client:
                with pytest.raises(CommunityError) as refused:  # a stranger to a stranger: no relay
                    await client.put_sealed(record(other.public_key, "1" * 32))
                assert refused.value.code == "mailbox-not-held" and refused.value.status == 403
                assert (await client.put_sealed(record(laptop_key, "2" * 32)))["stored"] is True  # to the person

    holder, url = _holder(laptop, tmp_path, how)
    try:
        asyncio.run(scenario(url))
        assert len(held_ids(laptop)) == 1
    finally:
        code, _out, err = holder.stop()
    assert code == 0, err


def test_a_peer_holding_every_mailbox_slot_idle_does_not_lock_the_person_out(tmp_path: Path) -> None:
    """A stranger fills all 32 mailbox slots with connections that sent one frame and then
    half of the next (a slow-loris): a device's take is still answered — the connection that
    waited longest is closed mail-busy to make room (specs/sealed.md §7c). It was refused
    mail-busy (server-unreachable) until the stranger's connections idled out."""
    (tmp_path / "l").mkdir()
    laptop = notes_host(tmp_path / "l")
    holder, url = _holder(laptop, tmp_path)
    ticket = url.removeprefix("iroh:")
    frame = b'{"op":"take","headers":{},"body":""}\n'

    async def scenario() -> tuple[list, str]:
        async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as flood:
            held = []
            for _ in range(MAX_CONNECTIONS):  # each answered once (so served), then left half-sent
                conn = await flood.connect(ticket, alpn=MAILBOX_ALPN)
                stream = await flood.open_stream(conn)
                await stream.send(frame)
                raw = b""
                while not raw.endswith(b"\n"):
                    data = await stream.receive()
                    assert data, "the holder ended a flood connection before answering its frame"
                    raw += data
                await stream.send(frame[:12])
                held.append((conn, stream))
            async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as node:
                async def endpoint():
                    return node
                async with mail_client(url, Identity(os.urandom(32)), endpoint=endpoint) as client:
                    taken = await client.take_sealed_page(5)
            oldest_conn, oldest = held[0]
            with pytest.raises(Exception):  # iroh's own error type on a closed connection
                await oldest.receive()
                await oldest_conn.closed()
            return taken, repr(oldest_conn.close_reason())

    try:
        taken, reason = asyncio.run(scenario())
        assert taken == ([], False, None)
        assert "mail-busy" in reason, reason
    finally:
        code, _out, err = holder.stop()
    assert code == 0, err
    assert "Traceback" not in err, err


def test_a_holder_back_on_its_kept_port_keeps_its_ticket_and_a_clash_is_said(tmp_path: Path) -> None:
    """`kith host --hold-mail iroh` killed (kill -9) and started again names the same
    iroh: ticket (its port kept), so the other devices' --holder stays right. When the kept
    port is taken for a run, the start says the held mail is at another ticket for this run
    only — it said only that invitations of earlier runs do not reach the host."""
    import signal
    import socket

    (tmp_path / "l").mkdir()
    laptop = notes_host(tmp_path / "l")
    first, url = _holder(laptop, tmp_path)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=30)
    again, url_again = _holder(laptop, tmp_path)
    code, _out, err = again.stop()
    assert code == 0, err
    assert url_again == url
    assert "another iroh: ticket" not in err, err
    port = json.loads((laptop / "endpoint.json").read_text())["port"]
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    squatter.bind(("127.0.0.1", port))
    try:
        clash, url_clash = _holder(laptop, tmp_path)
        code, _out, err = clash.stop()
    finally:
        squatter.close()
    assert code == 0, err
    assert url_clash != url
    assert "the mail this device holds (--hold-mail iroh) is at another iroh: ticket for this run only" in err, err


def test_a_holder_over_iroh_that_cannot_be_reached_is_named_a_device_holding_mail() -> None:
    """A `--holder iroh:…` whose endpoint is gone is `server-unreachable` (the code callers
    map), said as what it is: a device holding mail, not a community server."""
    async def scenario() -> CommunityError:
        async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as gone:
            url = "iroh:" + gone.ticket()
        async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as node:
            async def endpoint():
                return node
            async with mail_client(url, Identity(os.urandom(32)), endpoint=endpoint) as client:
                with pytest.raises(CommunityError) as refused:
                    await client.take_sealed_page(5)
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.code == "server-unreachable" and refused.status == 0
    # "cannot reach …" or "… did not answer within 10 s": the dial fails or times out
    assert "the device holding mail at iroh:" in str(refused.message), refused.message
    assert "community server" not in str(refused.message)


def test_the_take_cursor_pages_over_iroh_frames(tmp_path: Path) -> None:
    """The take's cursor (specs/community-api.md "Mailbox") works over `kith-mailbox/1`
    unchanged: the frame carries the very signed body, so `after` and `next` pass through
    the holder's one mailbox app (specs/sealed.md §7c)."""
    from node.community.server import create_app
    from node.community.store import MailboxLimits

    me, sender = Identity(os.urandom(32)), Identity(os.urandom(32))
    store = open_store(tmp_path / "held.sqlite3")
    app = create_app(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits())
    sent = [seal(sender.secret, None, kind="question", question_id=f"{i + 1:032x}", body={"request": {"query": "q"}},
                 recipients=[me.public_key], now=time.time(), expires=time.time() + 600) for i in range(5)]

    async def scenario() -> list[list[str]]:
        async with app_held_over_iroh(app, os.urandom(32)) as (url, endpoint):
            async with mail_client(url, sender, endpoint=endpoint) as put_client:
                for rec in sent:
                    assert (await put_client.put_sealed(rec))["stored"] is True
            pages, after = [], None
            async with mail_client(url, me, endpoint=endpoint) as client:
                while True:
                    records, more, after = await client.take_sealed_page(2, after)
                    pages.append([r["id"] for r in records])
                    if not more:
                        return pages

    try:
        pages = asyncio.run(scenario())
    finally:
        store.close()
    assert pages == [[sent[0]["id"], sent[1]["id"]], [sent[2]["id"], sent[3]["id"]], [sent[4]["id"]]]


def test_the_hosts_sealed_line_shows_an_iroh_holder_cut(capsys: pytest.CaptureFixture[str]) -> None:
    """`kith host`'s text line for a take (not `--json`) shows `iroh:` and the ticket's first
    24 characters, not the whole ~90 (node.common.names.holder_text)."""
    from node.cli.host_render import HostEventPrinter
    from node.common.host_events import SealedTaken

    url = "iroh:endpoint" + "a" * 80
    HostEventPrinter(json_out=False, server=None)(SealedTaken(holder=url, answered=2, dropped={}).to_dict())
    said = capsys.readouterr().err
    assert f"sealed questions at iroh:endpoint{'a' * 16}…: answered 2" in said and url not in said, said
    HostEventPrinter(json_out=True, server=None)(SealedTaken(holder=url, answered=2, dropped={}).to_dict())
    assert json.loads(capsys.readouterr().out)["holder"] == url


def test_the_hosts_warning_for_an_unreachable_iroh_holder_shows_the_ticket_cut(tmp_path: Path) -> None:
    """The host's take loop says once that a holder over iroh cannot be read, naming it as
    text output does (node.common.names.holder_text): `iroh:` and the ticket's first 24
    characters, never the whole ticket."""
    import anyio

    from node.host.sealed_host import take_sealed_questions
    from node.runtime.clock import ManualClock
    from node.trust.identity import init_identity
    from node.trust.sealed_seen import DurableSeen

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    identity = init_identity(home)[0]
    said: list[str] = []

    class RunningHost:  # the parts of node.host.host.Host the take loop reads
        def __init__(self, url: str, listener) -> None:
            self.home, self.identity, self.clock, self.listener = home, identity, ManualClock(), listener
            self.door = self.knowledge = self.audit = None
            self.held_mail = self.held_url = None
            self.url = url

        def mail_urls(self) -> list[str]:
            return [self.url]

        def sealed_seen(self) -> DurableSeen:
            return DurableSeen(home)

        def warn(self, line: str) -> None:
            said.append(line)

        def emit(self, ev: dict) -> None:
            raise AssertionError(f"nothing is taken from a holder that is gone: {ev}")

    async def scenario() -> str:
        async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as gone:
            url = "iroh:" + gone.ticket()
        async with bind_node(os.urandom(32), MAILBOX_ALPN, local=True) as node:
            async with anyio.create_task_group() as tg:
                tg.start_soon(take_sealed_questions, RunningHost(url, node))
                with anyio.fail_after(60):
                    while not said:
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        return url

    url = asyncio.run(scenario())
    assert len(said) == 1 and f"the mailbox at {holder_text(url)} could not be read (server-unreachable)" in said[0], said
    assert url not in said[0], said


def test_a_question_left_over_iroh_is_withdrawn_by_the_runner_not_by_the_command(tmp_path: Path) -> None:
    """``kith outbox remove`` of a question left with a holder over iroh (``iroh:<ticket>``)
    says it is still there and that the home's runner withdraws it (the command binds no
    endpoint); the withdrawal from an endpoint (the runner's pool's) is the same signed ack
    as over HTTP, through the holder's one mailbox app (specs/sealed.md §7c, §10)."""
    from node.community.inbox import leave_question
    from node.community.server import create_app
    from node.community.store import MailboxLimits
    from node.guest.outbox import OutboxStore
    from node.guest.sealed_outbox import withdraw_left
    from node.trust.identity import load_identity

    from support.homes import node_home

    asker_home = node_home(tmp_path, "asker")
    asker = load_identity(asker_home)
    host = Identity(os.urandom(32))
    store = open_store(tmp_path / "held.sqlite3")
    app = create_app(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits())

    async def scenario() -> tuple[list, list, str]:
        async with app_held_over_iroh(app, asker.secret) as (url, endpoint):
            with OutboxStore(asker_home) as outbox:
                qid = outbox.add({"query": "where is the key", "topK": 3}, [("bea", host.public_key)])["id"]
                async with mail_client(url, asker, endpoint=endpoint) as client:
                    record = await leave_question(client, asker, None, question_id=qid,
                                                  request={"query": "where is the key", "topK": 3},
                                                  peer=host.public_key, recipients=[host.public_key],
                                                  expires=time.time() + 600)
                outbox.mark_left(qid, host.public_key, url, record["id"])
            r = await asyncio.to_thread(kith, asker_home, "outbox", "remove", qid[:8], timeout=120)
            assert r.returncode == 0, r.stderr
            assert f"outbox {qid[:12]}: still at {holder_text(url)}, it is reached over iroh: this home's " \
                   "runner withdraws it" in r.stdout, r.stdout
            assert store.mailbox_usage()["records"] == 1
            with OutboxStore(asker_home) as outbox:
                done = await withdraw_left(asker_home, asker, outbox, endpoint=endpoint)
                after = outbox.withdrawals()
            return done, after, url

    try:
        done, after, url = asyncio.run(scenario())
        assert store.mailbox_usage()["records"] == 0
    finally:
        store.close()
    assert [(w["holder"], w["state"]) for w in done] == [(url, "withdrawn")] and after == []
