"""The home's background runner (node/guest/runner.py; specs/outbox.md §5): it drives a
task list, only one process (lock holder) of a home drives it at a time and the next takes
over when it stops, a failing task or job never stops the others, and ``wake`` steps the
tasks at once."""

from __future__ import annotations

from pathlib import Path

import anyio

from node.guest.owner import Guest
from node.guest.runner import LOCK_RETRY_S, Runner
from node.runtime.clock import ManualClock
from node.trust.identity import load_or_init_identity

from support.copies import runner_in


class Counting:
    """A task that counts its steps and sets ``stepped`` at each."""

    def __init__(self, name: str, wait: float = 60.0, fail: bool = False) -> None:
        self.name = name
        self.wait = wait
        self.fail = fail
        self.steps = 0
        self.stepped = anyio.Event()

    async def step(self, runner: Runner) -> float:
        self.steps += 1
        self.stepped.set()
        self.stepped = anyio.Event()
        if self.fail:
            raise RuntimeError("boom")
        return self.wait


def test_one_runner_per_home_drives_the_tasks_and_the_next_takes_over(tmp_path: Path) -> None:
    """The second runner waits for the lock on its clock: the test advances that clock to
    make it try again, instead of sleeping while it might."""
    load_or_init_identity(tmp_path)

    async def asleep(clock: ManualClock) -> None:
        with anyio.fail_after(30):
            while clock.sleepers() == 0:
                await anyio.sleep(0.01)

    async def main():
        first, second = Counting("a"), Counting("b")
        waiting = ManualClock()
        r1 = Runner(Guest(tmp_path), [first], command="one")
        r2 = Runner(Guest(tmp_path, clock=waiting), [second], command="two")
        async with anyio.create_task_group() as tg:
            scope1 = runner_in(tg, r1)
            with anyio.fail_after(30):
                await r1.holding.wait()
            tg.start_soon(r2.run)
            with anyio.fail_after(30):
                while first.steps == 0:
                    await anyio.sleep(0.01)
            await asleep(waiting)  # r2 found the lock held and waits to try again
            waiting.advance(LOCK_RETRY_S)
            await asleep(waiting)  # it tried again: still held, so it waits again
            assert not r2.holding.is_set() and second.steps == 0
            scope1.cancel()  # the first process stops: its lock is released
            with anyio.fail_after(30):
                while not r2.holding.is_set():
                    await asleep(waiting)
                    waiting.advance(LOCK_RETRY_S)
                    await anyio.sleep(0.01)
                while second.steps == 0:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")


def test_a_task_is_stepped_again_when_the_runners_clock_reaches_its_wait(tmp_path: Path) -> None:
    load_or_init_identity(tmp_path)

    async def main():
        clock = ManualClock()
        task = Counting("t", wait=0.5)
        runner = Runner(Guest(tmp_path, clock=clock), [task], pool=_no_pool)
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            with anyio.fail_after(30):
                while task.steps == 0 or clock.sleepers() == 0:
                    await anyio.sleep(0.01)
            stepped = task.stepped
            clock.advance(0.4)  # not yet due
            await anyio.sleep(0.01)
            assert task.steps == 1
            clock.advance(0.1)
            with anyio.fail_after(30):
                await stepped.wait()
            assert task.steps == 2
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")


async def _no_pool():
    return None


def test_a_failing_task_or_job_never_stops_the_others_and_wake_steps_at_once(tmp_path: Path) -> None:
    load_or_init_identity(tmp_path)

    async def main():
        bad, good = Counting("bad", fail=True), Counting("good", wait=600.0)
        runner = Runner(Guest(tmp_path), [bad, good])
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            with anyio.fail_after(30):
                await runner.holding.wait()
                while good.steps == 0:
                    await anyio.sleep(0.01)

            async def failing_job():
                raise RuntimeError("a job failed")
            runner.spawn(failing_job)
            seen = good.steps
            stepped = good.stepped
            runner.wake()  # its 600 s wait is cut short
            with anyio.fail_after(30):
                await stepped.wait()
            assert good.steps > seen and bad.steps >= 1
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")


def test_an_idle_home_runner_waits_between_steps_instead_of_spinning(tmp_path: Path) -> None:
    """A home with nothing queued (no outbox, no copies): every task of the runner that
    `kith host`, `api serve` and `mcp` start asks for a wait before its next step. A task
    that answered 0 there made the runner step it again at once, for ever — an idle
    `kith host --server` burned a whole core (the sealed outbox's step, before its file
    existed)."""
    from node.guest.runner import default_tasks

    home = tmp_path / "home"
    load_or_init_identity(home)
    clock = ManualClock()
    tasks = default_tasks(home, clock)
    runner = Runner(Guest(home, clock=clock), tasks)

    async def waits() -> dict[str, float]:
        return {task.name: await task.step(runner) for task in tasks}

    first = anyio.run(waits)
    again = anyio.run(waits)  # and on the next step too (nothing was done in between)
    assert all(w >= 1.0 for w in first.values()), first
    assert all(w >= 1.0 for w in again.values()), again
