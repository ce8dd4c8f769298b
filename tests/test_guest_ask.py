"""One guest API (node.guest.guest.ask) for every caller that asks a Host: the MCP
server's peer search goes through it and gets the Host's policy-gated answer; a Host that
is not pinned is refused before any session; typed GuestOptions carry questions, topK and
filters to the Host. Real iroh on loopback, relay disabled."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest

from node.local.mcp import call_search
from node.guest.guest import GuestOptions, ask, open_target
from node.trust.identity import Identity
from node.trust.peers import PeerRegistry

from support.homes import node_home as _home, public_host_home
from support.hosts import STEADY, InProcessHost

pytestmark = pytest.mark.iroh

DOCS = {"deploy.md": "# Deploy\n\nThe staging server is deleted automatically every night.\n",
        "notes.md": "# Notes\n\nThe staging database keeps a nightly backup for a week.\n"}


def _host_home(tmp: Path) -> Path:
    return public_host_home(tmp, DOCS)


def _run_with_host(tmp: Path, scenario):
    """Serve a host with the two documents, run ``scenario(host, guest_home)``."""
    async def main():
        host = InProcessHost(_host_home(tmp), tmp)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            try:
                with anyio.fail_after(60):
                    return await scenario(host, _home(tmp, "guest"))
            finally:
                host.stop.set()

    return anyio.run(main, backend="asyncio")


def test_ask_carries_typed_options_and_returns_every_answer(tmp_path):
    seen: list[dict] = []

    async def scenario(host, guest_home):
        target = await open_target(str(host.invite), guest_home, server_url=None)
        assert target.pinned_name is None and target.spec.name == "knowledge-query"
        options = GuestOptions(queries=("staging server deleted", "nightly backup"), top_k=1,
                               filters={"sources": ["/kb/notes.md"]}, on_results=seen.append)
        return await ask(guest_home, Identity(os.urandom(32)), target, options, local=True, heartbeat=STEADY)

    result = _run_with_host(tmp_path, scenario)
    assert result.outcome is not None and result.outcome.ok
    assert [a["query_id"] for a in result.answers] == ["q1", "q2"]
    assert seen == result.answers  # the caller's callback saw the same answers, in order
    for answer in result.answers:  # topK and the sources filter reached the host
        sources = [r["source"] for r in answer["envelope"]["results"]]
        assert len(sources) <= 1 and set(sources) <= {"/kb/notes.md"}
    assert result.answers[1]["status"] == "ok"


def test_ask_past_its_time_bound_has_no_outcome_and_no_answers(tmp_path):
    typed = threading.Event()

    async def scenario(host, guest_home):
        target = await open_target(str(host.invite), guest_home, server_url=None)

        def never_answers() -> str | None:  # a user who types nothing until the test is over
            typed.wait(timeout=30)
            return None

        return await ask(guest_home, Identity(os.urandom(32)), target,
                         GuestOptions(next_question=never_answers), local=True, heartbeat=STEADY, timeout_s=0.5)

    try:
        result = _run_with_host(tmp_path, scenario)
    finally:
        typed.set()
    assert result.outcome is None and result.answers == []


def test_mcp_peer_search_asks_a_pinned_peer_and_refuses_a_stranger(tmp_path):
    async def scenario(host, guest_home):
        stranger = await call_search(guest_home, {"query": "staging", "peer": str(host.invite)}, local=True)
        target = await open_target(str(host.invite), guest_home, server_url=None)
        PeerRegistry.load(guest_home).add("hosty", target.invitation.host_public_key)
        pinned = await call_search(guest_home, {"query": "staging server deleted", "topK": 2,
                                                "peer": str(host.invite)}, local=True)
        return stranger, pinned

    stranger, pinned = _run_with_host(tmp_path, scenario)
    assert stranger.is_error and stranger.content[0].text.startswith("[host-not-trusted] ")
    assert not pinned.is_error, pinned.content
    env = pinned.structured_content
    assert env["schemaVersion"] == 2 and env["available"] is True
    assert [r["source"] for r in env["results"]][0] == "/kb/deploy.md"
    assert len(env["results"]) <= 2


def test_mcp_peer_search_carries_dedupe_and_budget_like_a_local_search(tmp_path):
    """MCP's peer search sends the whole request: ``dedupe`` reaches the host's answer
    service (its queryPlan says so) and ``remainingBudgetMs`` 0 is the host's
    ``budget-exhausted`` answer, not a session timeout."""
    async def scenario(host, guest_home):
        target = await open_target(str(host.invite), guest_home, server_url=None)
        PeerRegistry.load(guest_home).add("hosty", target.invitation.host_public_key)
        deduped = await call_search(guest_home, {"query": "staging server deleted", "dedupe": "document",
                                                 "peer": str(host.invite)}, local=True)
        spent = await call_search(guest_home, {"query": "staging server deleted", "remainingBudgetMs": 0,
                                               "peer": str(host.invite)}, local=True)
        return deduped, spent

    deduped, spent = _run_with_host(tmp_path, scenario)
    assert not deduped.is_error, deduped.content
    env = deduped.structured_content
    sources = [r["source"] for r in env["results"]]
    assert sources and len(sources) == len(set(sources))  # one result per document
    assert env["queryPlan"]["dedupe"] == "document"
    assert not spent.is_error, spent.content
    assert spent.structured_content["available"] is False
    assert spent.structured_content["reason"] == "budget-exhausted"
