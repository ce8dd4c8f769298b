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

    async def resolve_peer(name, home, *, skip_saved=False):
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
