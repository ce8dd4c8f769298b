"""A long-running process (`kith host`, `kith api serve`, `kith mcp`) stops answering from a
copy what its host withdrew soon after a handshake of another pool of the home told the grant
changed (issue 42): that pool wakes no runner, yet the home's runner (which they all run)
steps its copies task at least every second (node.guest.runner.MAX_SLEEP_S), finds the copy
stale and syncs it, which deletes what the host no longer lists."""

from __future__ import annotations

import pytest

from node.trust.identity import load_identity

from support.cli import kith
from support.copies import kb_host_and_bea
from support.homes import pin_host

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
    from support.hosts import STEADY, InProcessHost

    host, bea = kb_host_and_bea(tmp_path)
    assert kith(host, "policy", "set", "/kb/notes/**", "private").returncode == 0
    store = CopyStore(bea, "alice")
    store.commit(store.load())  # bea keeps a copy of alice (nothing in it yet): the runner syncs it
    events: list[dict] = []

    async def main():
        h = InProcessHost(host, tmp_path, clock=SYSTEM_CLOCK, heartbeat=STEADY)
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.run)
            with anyio.fail_after(60):
                await h.ready.wait()
            pin_host(bea, "alice", h.invite)
            async with SessionPool(bea, load_identity(bea), local=True) as pool:
                async def own_pool():
                    return pool
                runner = Runner(Guest(bea), default_tasks(bea), pool=own_pool, command="test", on_event=events.append)
                stop_runner = anyio.CancelScope()

                async def run_runner():
                    with stop_runner:
                        await runner.run()
                tg.start_soon(run_runner)
                with anyio.fail_after(120):
                    while not any(e["event"] == "copy-synced" for e in events):
                        await anyio.sleep(0.05)
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
                with anyio.fail_after(60):  # the runner's next step, not its 10-minute re-sync
                    while sum(e["event"] == "copy-synced" for e in events) == synced:
                        await anyio.sleep(0.05)
                stop_runner.cancel()
            h.stop.set()

    anyio.run(main)
    assert list(store.load()["documents"]) == ["/kb/sqlite.md"]  # what the host withdrew is gone
