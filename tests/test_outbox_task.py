"""The outbox's delivery task (node/guest/outbox_task.py; specs/outbox.md §3, §5): before
each attempt the peer name is looked up again, and a question that can never be delivered
(name removed, re-pinned to another key, blocked) is closed, reported, and never sent.

A real :class:`~node.guest.runner.Runner` drives a real :class:`OutboxTask` over a real
outbox file and peer registry; its session pool is one that fails the test if it is ever
used (no question may be sent).
"""

from __future__ import annotations

from pathlib import Path

import anyio

from node.guest.outbox import OutboxStore
from node.guest.outbox_task import OutboxTask
from node.guest.owner import Guest
from node.guest.runner import Runner
from node.trust.identity import load_or_init_identity
from node.trust.peers import PeerRegistry

REQUEST = {"query": "staging server", "topK": 3}


async def _never_pool() -> object:
    raise AssertionError("a question that can never be delivered was about to be sent")


def test_a_question_for_a_peer_removed_repinned_or_blocked_is_failed_and_reported(tmp_path: Path) -> None:
    load_or_init_identity(tmp_path)
    keys = {name: f"{i:x}" * 64 for i, name in enumerate(("bob", "carol", "dave"), start=1)}
    registry = PeerRegistry.load(tmp_path)
    for name, key in keys.items():
        registry.add(name, key)
    with OutboxStore(tmp_path) as store:
        qids = {name: store.add(REQUEST, [(name, key)])["id"] for name, key in keys.items()}
    registry = PeerRegistry.load(tmp_path)
    registry.remove("bob")
    registry.remove("carol")
    registry.add("carol", "e" * 64)  # the name now names another key
    registry.block("dave")  # still pinned, blocked
    events: list[dict] = []

    async def main() -> None:
        runner = Runner(Guest(tmp_path), [OutboxTask(tmp_path)], pool=_never_pool, on_event=events.append)
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            with anyio.fail_after(60):
                while len([e for e in events if e["event"] == "outbox-failed"]) < 3:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")
    failed = {e["peer"]: (e["id"], e["code"]) for e in events if e["event"] == "outbox-failed"}
    assert failed == {"bob": (qids["bob"], "peer-not-found"), "carol": (qids["carol"], "outbox-peer-changed"),
                      "dave": (qids["dave"], "ask-peer-blocked")}
    with OutboxStore(tmp_path) as store:
        rows = {r["peers"][0]["name"]: (r["state"], r["peers"][0]["code"], r["peers"][0]["attempts"])
                for r in store.list()}
    assert rows == {"bob": ("failed", "peer-not-found", 0), "carol": ("failed", "outbox-peer-changed", 0),
                    "dave": ("failed", "ask-peer-blocked", 0)}
