"""Who answers for a name (node/guest/asker.py; specs/ask.md §4): the asker above the pool
turns a pinned name into a target — the saved one, or the community server's newer one when
the saved address did not answer — and hands the pool targets only. Driven with a pool that
records what it was handed and a resolver that hands out made-up targets: no network."""

from __future__ import annotations

import os
from types import SimpleNamespace

import anyio
import pytest

import node.guest.asker as asker_mod
from node.common.errors import KithError, TransportError
from node.guest.asker import Asker
from node.guest.peerview import PeerView
from node.guest.targets import PeerGone
from node.runtime.driver import SessionOutcome
from node.trust.peers import PeerRegistry

KEY = os.urandom(32).hex()


def _target(ticket: str) -> SimpleNamespace:
    return SimpleNamespace(invitation=SimpleNamespace(host_public_key=KEY, transport_info=SimpleNamespace(ticket=ticket)))


class Pool:
    """A pool that knows targets only: each ask is recorded; ``fail`` says how a ticket's
    session ends unanswered."""

    def __init__(self, home, fail: dict[str, PeerGone] | None = None) -> None:
        self.home = home
        self.peers = PeerView(home)
        self.on_copy_notice = None
        self.sessions: dict = {}
        self.fail = fail or {}
        self.asked: list[tuple[str, bool]] = []

    def warm(self, key: str):
        return None

    async def ask(self, target, request, *, renew: bool = True):
        assert not isinstance(target, str), "the pool is handed targets, never names"
        ticket = target.invitation.transport_info.ticket
        self.asked.append((ticket, renew))
        if ticket in self.fail:
            raise self.fail[ticket]
        return {"status": "ok", "from": ticket}


@pytest.fixture
def resolved(monkeypatch):
    calls: list[bool] = []

    async def resolve_peer(name, home, *, skip_saved=False, registry=None):
        calls.append(skip_saved)
        return _target("server" if skip_saved else "saved")
    monkeypatch.setattr(asker_mod, "resolve_peer", resolve_peer)
    return calls


def test_a_target_goes_to_the_pool_as_it_is(tmp_path):
    pool = Pool(tmp_path)
    got = anyio.run(lambda: Asker(pool).ask(_target("given"), {"query": "x"}))
    assert got["from"] == "given" and pool.asked == [("given", True)]


def test_an_unknown_name_is_peer_not_found_and_nothing_is_dialled(tmp_path):
    pool = Pool(tmp_path)
    with pytest.raises(KithError) as exc:
        anyio.run(lambda: Asker(pool).ask("nobody", {"query": "x"}))
    assert exc.value.code == "peer-not-found" and pool.asked == []


def test_a_saved_address_that_does_not_answer_makes_the_asker_take_the_servers_newer_one(tmp_path, resolved):
    PeerRegistry.load(tmp_path).add("alice", KEY, server="https://community.example")
    down = PeerGone(None, TransportError("transport-connect-failed", "no answer"), False)
    pool = Pool(tmp_path, fail={"saved": down})
    got = anyio.run(lambda: Asker(pool).ask("alice", {"query": "x"}))
    assert got["from"] == "server" and resolved == [False, True]
    assert pool.asked == [("saved", False), ("server", False)]  # the asker, not the pool, decides to renew


def test_without_a_server_the_saved_address_failing_is_the_answer(tmp_path, resolved):
    PeerRegistry.load(tmp_path).add("alice", KEY)
    down = PeerGone(None, TransportError("transport-connect-failed", "no answer"), False)
    pool = Pool(tmp_path, fail={"saved": down})
    with pytest.raises(PeerGone):
        anyio.run(lambda: Asker(pool).ask("alice", {"query": "x"}))
    assert resolved == [False] and pool.asked == [("saved", False)]


def test_a_host_that_went_silent_with_the_question_out_is_not_dialled_again(tmp_path, resolved):
    PeerRegistry.load(tmp_path).add("alice", KEY, server="https://community.example")
    silent = PeerGone(SessionOutcome(session_id="ab" * 32, reason="aborted", code="peer-unresponsive"), None, True)
    pool = Pool(tmp_path, fail={"saved": silent})
    with pytest.raises(PeerGone):
        anyio.run(lambda: Asker(pool).ask("alice", {"query": "x"}))
    assert pool.asked == [("saved", False)]


def test_the_registry_is_read_once_per_change_however_many_questions(tmp_path, resolved):
    PeerRegistry.load(tmp_path).add("alice", KEY)
    pool = Pool(tmp_path)
    asker = Asker(pool)

    async def three():
        for _ in range(3):
            await asker.ask("alice", {"query": "x"})
    anyio.run(three)
    assert pool.peers.loads == 1
    PeerRegistry.load(tmp_path).add("bob", os.urandom(32).hex())  # changed meanwhile: read at the next question
    anyio.run(lambda: Asker(pool).ask("alice", {"query": "x"}))
    assert pool.peers.loads == 2


class DevicesPool(Pool):
    """A pool of a person's devices: the ``empty`` ticket answers ``no-verified-results`` at
    once; the ``holder`` ticket answers ``ok`` only once the empty answer is in (it is the
    slower one); ``down`` tickets never answer until cancelled."""

    def __init__(self, home) -> None:
        super().__init__(home)
        self.empty_in = anyio.Event()
        self.cleared: list[str] = []

    def clear_down(self, target) -> None:
        self.cleared.append(target.invitation.transport_info.ticket)

    async def ask(self, target, request, *, renew: bool = True):
        ticket = target.invitation.transport_info.ticket
        self.asked.append((ticket, renew))
        if ticket == "empty":
            self.empty_in.set()
            return {"status": "no-verified-results", "envelope": {"results": []}}
        await self.empty_in.wait()
        if ticket == "down":
            await anyio.sleep_forever()
        return {"status": "ok", "envelope": {"results": [{"title": "x"}]}}


def _devices(*tickets: str) -> list:
    return [({"key": t.ljust(64, "0"), "name": t}, _target(t)) for t in tickets]


def test_a_devices_empty_answer_never_cancels_another_devices_ok(tmp_path):
    """issue 42 item 4: a person's devices hold different corpora; the one that holds nothing
    answers first — the one holding the answer is not cancelled, its ok wins."""
    pool = DevicesPool(tmp_path)
    provisional: list[dict] = []
    rec = SimpleNamespace(name="alice", public_key=KEY)
    answer = anyio.run(lambda: Asker(pool, on_provisional=provisional.append).ask_devices(
        rec, _devices("empty", "holder"), {"query": "x"}))
    assert answer["status"] == "ok" and answer["device"]["name"] == "holder"
    assert [p["device"]["name"] for p in provisional] == ["empty"]  # the caller's deadline could settle on it


def test_a_devices_empty_answer_stands_when_no_other_device_answers_ok(tmp_path):
    rec = SimpleNamespace(name="alice", public_key=KEY)

    async def main():
        return await Asker(pool).ask_devices(rec, _devices("empty", "gone"), {"query": "x"})

    class Failing(DevicesPool):
        async def ask(self, target, request, *, renew: bool = True):
            if target.invitation.transport_info.ticket == "gone":
                await self.empty_in.wait()
                raise PeerGone(None, None, False)
            return await super().ask(target, request, renew=renew)

    pool = Failing(tmp_path)
    answer = anyio.run(main)
    assert answer["status"] == "no-verified-results" and answer["device"]["name"] == "empty"


def test_at_the_deadline_a_persons_empty_answer_is_the_row_not_a_timeout(tmp_path, monkeypatch):
    """The fan-out's deadline comes while a device that may hold the answer is still out:
    the row is the empty answer that came in, not ``peer-timeout``."""
    from node.guest import fanout

    PeerRegistry.load(tmp_path).add("alice", KEY)
    pool = DevicesPool(tmp_path)

    async def ask(self, name, request):
        return await self.ask_devices(SimpleNamespace(name=name, public_key=KEY), _devices("empty", "down"), request)

    pool.path_of = lambda key: None
    monkeypatch.setattr(asker_mod.Asker, "ask", ask)
    envelope = anyio.run(lambda: fanout.fan_out(pool, {"query": "x", "topK": 5}, ["alice"], timeout_s=0.5))
    row = envelope["peers"][0]
    assert row["status"] == "no-verified-results", row
