"""A long-running process (`kith host`, `kith api serve`, `kith mcp`) stops answering from a
copy what its host withdrew soon after a handshake of another pool of the home told the grant
changed (issue 42): that pool wakes no runner, yet the home's runner (which they all run)
steps its copies task at least every second (node.guest.runner.MAX_SLEEP_S), finds the copy
stale and syncs it, which deletes what the host no longer lists."""

from __future__ import annotations

import pytest

from node.trust.identity import load_identity

from support.cli import kith
from support.copies import alice_for_bea, events_of, kb_host_and_bea, runner_in

pytestmark = pytest.mark.iroh


def test_a_grant_narrowed_while_a_node_runs_is_applied_by_its_runner_without_a_wake(tmp_path):
    import anyio

    from node.guest.asker import Asker
    from node.guest.copies.lifecycle import stale
    from node.guest.copies.store import CopyStore
    from node.guest.pool import SessionPool
    from node.guest.owner import Guest
    from node.guest.runner import Runner, default_tasks
    from node.runtime.clock import SYSTEM_CLOCK

    host, bea = kb_host_and_bea(tmp_path)
    assert kith(host, "policy", "set", "/kb/notes/**", "private").returncode == 0
    store = CopyStore(bea, "alice")
    store.commit(store.load())  # bea keeps a copy of alice (nothing in it yet): the runner syncs it
    events: list[dict] = []

    async def main():
        async with alice_for_bea(host, bea, tmp_path, clock=SYSTEM_CLOCK) as (_h, pool), \
                anyio.create_task_group() as tg:
            async def own_pool():
                return pool
            stop_runner = runner_in(tg, Runner(Guest(bea), default_tasks(bea), pool=own_pool, command="test",
                                               on_event=events.append))
            await events_of(events, "copy-synced")
            assert "/kb/tempfiles.md" in store.load()["documents"]
            # the owner narrows bea's grant while both run
            assert kith(host, "policy", "copy", "/kb/sqlite.md", "--for", "bea").returncode == 0
            assert kith(host, "policy", "copy", "/kb/**", "--for", "bea", "--off").returncode == 0
            # a question of another pool of the home (as `kith api serve`'s): its handshake
            # tells the new grant; it wakes no runner
            with anyio.fail_after(60):
                while not stale(CopyStore(bea, "alice")):
                    async with SessionPool(bea, load_identity(bea), local=True) as questions:
                        await Asker(questions).ask("alice", {"query": "journal mode WAL", "topK": 3})
            synced = sum(e["event"] == "copy-synced" for e in events)
            # the runner's next step, not its 10-minute re-sync
            await events_of(events, "copy-synced", synced, timeout=60)
            stop_runner.cancel()

    anyio.run(main)
    assert list(store.load()["documents"]) == ["/kb/sqlite.md"]  # what the host withdrew is gone
