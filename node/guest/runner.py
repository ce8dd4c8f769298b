"""The home's background runner: one owner of the work a long-running Kith process does
for its home while it runs (specs/outbox.md §5).

``kith host``, ``kith api serve``, ``kith mcp`` and ``kith outbox run`` each start one
:class:`Runner` on their event loop; only one process of a home drives the tasks at a
time — the one holding ``<home>/runner.lock`` (``flock``; released when that process
ends, however it ends). The others wait and take over within
:data:`LOCK_RETRY_S` seconds of it going away.

The runner drives a task list. A task is any object with a ``name`` and
``async step(runner) -> float`` (:class:`RunnerTask`): ``step`` does the work that is due
and returns the seconds until it wants to be stepped again (it is stepped sooner when
:meth:`Runner.wake` is called). Tasks share the runner's warm session pool
(:meth:`Runner.pool`, opened on first use) and start long work with :meth:`Runner.spawn`.
The tasks (:func:`default_tasks`): the outbox's questions left with a holder
(:class:`node.guest.sealed_outbox.SealedOutboxTask`) first, then the outbox's delivery
(:class:`node.guest.outbox_task.OutboxTask`) and the copies' re-sync
(:class:`node.guest.copies.task.CopiesTask`).

Time here is the runner's :class:`node.runtime.clock.Clock` (its monotonic reading, and its
sleep): a wall-clock jump never makes a task run sooner or later, and a test drives the
runner by advancing a :class:`node.runtime.clock.ManualClock` instead of sleeping.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

import anyio

from node.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("kith.runner")

#: The lock file one runner of a home holds.
LOCK_FILE = "runner.lock"
#: Seconds between attempts to take the lock while another process holds it.
LOCK_RETRY_S = 2.0
#: Longest sleep between two steps of a task, seconds (new work written by another
#: process — `kith ask --later` — is seen within this time).
MAX_SLEEP_S = 1.0
#: Errors in a row after which a task's step waits this long (s) before the next try.
ERROR_BACKOFF_S = 5.0


class RunnerTask(Protocol):
    """One task of the runner's list."""

    name: str

    async def step(self, runner: "Runner") -> float:
        """Do what is due now; return seconds until the next step (≤ ``MAX_SLEEP_S`` is
        honoured as given, larger values are cut to it)."""
        ...


class Runner:
    """Drive ``tasks`` for the guest's home while this process holds the home's runner lock.

    Made once per process by :meth:`node.guest.owner.Guest.runner`.

    Args:
        guest: the process's :class:`node.guest.owner.Guest`: its home, its clock (the
            host's when it runs beside one; what the runner reads and sleeps on), and the
            pool the runner opens when none is handed in.
        tasks: the task list (:func:`default_tasks`).
        pool: an async callable returning the process's warm
            :class:`~node.guest.pool.SessionPool` (``kith api serve`` and ``kith mcp``
            hand theirs in: one pool, one iroh endpoint per process), or None: the runner
            opens one itself on first use (``kith host``, ``kith outbox run``):
            :meth:`node.guest.owner.Guest.session_pool` with ``down_s=0`` (:meth:`pool`).
            Either way its tasks dial an address the pool marked down
            (:data:`node.guest.pool.OWN_BACKOFF`): they keep their own backoff.
        command: what the process is, written into the lock file (``kith host``).
        on_event: called with one dict per event a task reports (``outbox-answered``, …).
    """

    def __init__(self, guest: Any, tasks: list[Any], *, pool: Callable[[], Awaitable[Any]] | None = None,
                 command: str = "kith", on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.guest = guest
        self.home = Path(guest.home)
        self.tasks = list(tasks)
        self._pool_getter = pool
        self.command = command
        self.on_event = on_event
        self.clock: Clock = guest.clock
        self.holding = anyio.Event()  # set once this process holds the lock
        self._wake = anyio.Event()
        self._own_pool: Any = None
        self._pool_ready: anyio.Event | None = None  # set once the own pool is entered (or failed)
        self._pool_error: BaseException | None = None
        self._pool_release = anyio.Event()  # set once every job is done: the own pool may close
        self._keep_tg: Any = None  # the task group of the own pool's keeper (outlives the jobs)
        self._tg: Any = None
        self._job_told: dict[int, tuple[str, str]] = {}  # a spawned job → the fault last logged for it

    def now(self) -> float:
        """Monotonic seconds on the runner's clock (what tasks schedule by)."""
        return self.clock.monotonic()

    def wake(self) -> None:
        """Step every task now (new work was queued in this process)."""
        self._wake.set()

    def peer_back(self, key: str) -> None:
        """A host the runner's tasks could not reach answered again — the one "peer is back"
        signal of the home (specs/outbox.md §5, specs/copies.md §7). The outbox's delivery
        sends it when a peer it had failed to reach answers a question; the copies' re-sync
        when a copy whose last sync failed syncs. Every task with an ``on_peer_back(runner,
        key)`` method is told (the outbox delivers that peer's questions now, the copy of
        that host is re-synced now), then every task is stepped.

        Args:
            key: the host's pinned public key.
        """
        for task in self.tasks:
            hook = getattr(task, "on_peer_back", None)
            if hook is None:
                continue
            try:
                hook(self, key)
            except Exception:  # noqa: BLE001 - one task's hook never stops the others
                log.warning("runner task %s: peer-back hook failed", task.name, exc_info=True)
        self.wake()

    def emit(self, event: dict[str, Any]) -> None:
        """Report a task's event (to ``on_event``), checked against the table in
        node/common/host_events.py (specs/host-events.md): outside tests a mismatch is
        logged and the event sent on, with ``KITH_STRICT_EVENTS`` it raises
        :class:`msgspec.ValidationError`; a failing ``on_event`` never raises."""
        from node.common.host_events import checked

        checked(event, command=True)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # noqa: BLE001 - a printing failure must not stop delivery
                log.warning("runner event handler failed", exc_info=True)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the runner's task group (cancelled when the runner stops).

        A job that fails is told as a task's step fault is (:meth:`_tell`): once — a
        refusal as one line with its code and hint, anything else with its traceback —
        then quiet while the same job (``fn`` and its string arguments: the peer it works
        for) fails the same way, and ``runner job NAME works again`` once it ends well."""
        assert self._tg is not None, "the runner is not running"
        name = getattr(fn, "__name__", "?")
        key = hash((name, *(a for a in args if isinstance(a, str))))

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception as exc:  # noqa: BLE001 - one job's failure never ends the runner
                self._tell(name, exc, self._job_told, key, kind="job")
            else:
                if self._job_told.pop(key, None) is not None:
                    log.warning("runner job %s works again", name)
        self._tg.start_soon(guarded)

    def copy_notice(self, notice: dict[str, Any]) -> None:
        """The copy notices of this runner's pool and tasks
        (:data:`node.guest.copies.lifecycle.Notify`): a deleted copy is a ``copy-ended``
        event, a changed grant wakes the runner
        (:meth:`node.guest.copies.task.CopiesTask.listener`)."""
        from node.guest.copies.task import CopiesTask

        CopiesTask.listener(self)(notice)

    async def pool(self) -> Any:
        """The warm session pool the tasks ask peers through (a pool handed in that tells
        no one of the copies its sessions end tells this runner).

        The runner's own pool (none handed in) is opened on the first call — a run that
        never asks a peer (one that only takes sealed answers) never imports the pool nor
        binds an endpoint — by a keeper task that enters it and closes it once every job of
        the runner is done.

        Raises:
            KithError: the pool could not be opened (``invitation-unknown-protocol``, ...);
                the next call tries again.
        """
        if self._pool_getter is not None:
            pool = await self._pool_getter()
            if getattr(pool, "on_copy_notice", None) is None:
                pool.on_copy_notice = self.copy_notice
            return pool
        assert self._keep_tg is not None, "the runner is not running"
        if self._own_pool is None:
            if self._pool_ready is None:
                self._pool_ready = anyio.Event()
                self._pool_error = None
                self._keep_tg.start_soon(self._keep_pool, self._pool_ready)
            ready = self._pool_ready
            await ready.wait()
            if self._own_pool is None:
                error = self._pool_error
                if self._pool_ready is ready:
                    self._pool_ready = None  # the next call tries again
                if error is None:  # closed as it opened: the runner is stopping
                    await anyio.lowlevel.checkpoint()
                    from node.common.errors import TransportError

                    raise TransportError("transport-bind-failed", "the runner stopped before its endpoint was bound")
                raise error
        return self._own_pool

    async def _keep_pool(self, ready: anyio.Event) -> None:
        """Enter the runner's own pool (:meth:`node.guest.owner.Guest.session_pool` with
        ``down_s=0``; a session of it that learns a copy ended tells the runner), hand it
        out, and close it in this task once the runner's jobs are done."""
        try:
            async with self.guest.session_pool(down_s=0.0, on_copy_notice=self.copy_notice) as pool:
                self._own_pool = pool
                ready.set()
                with anyio.CancelScope(shield=True):  # closed after the jobs, not beside them
                    await self._pool_release.wait()
        except Exception as exc:  # noqa: BLE001 - told to the callers of pool(), not the task group
            self._pool_error = exc
        finally:
            self._own_pool = None
            ready.set()

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled: wait for the lock, then step the tasks."""
        from node.common.home import acquire_owner_lock, release_owner_lock
        from node.guest.pool import OWN_BACKOFF

        own_backoff = OWN_BACKOFF.set(True)  # this task's context, copied into every task and job below
        task_status.started()
        fd = None
        try:
            while fd is None:
                fd = acquire_owner_lock(self.home / LOCK_FILE, self.command)
                if fd is None:
                    await self.clock.sleep(LOCK_RETRY_S)
            self.holding.set()
            self._pool_release = anyio.Event()
            async with anyio.create_task_group() as keep:  # the own pool's keeper, opened on first use
                self._keep_tg = keep
                try:
                    async with anyio.create_task_group() as tg:
                        self._tg = tg
                        await self._loop()
                finally:
                    self._pool_release.set()  # every job is done: the pool closes
        finally:
            self._own_pool = None
            self._pool_ready = None
            self._keep_tg = None
            self._tg = None
            release_owner_lock(fd)
            OWN_BACKOFF.reset(own_backoff)

    async def _loop(self) -> None:
        due = {id(t): 0.0 for t in self.tasks}
        errors = {id(t): 0 for t in self.tasks}
        told: dict[int, tuple[str, str]] = {}  # task → the fault last logged for it
        while True:
            now = self.now()
            for task in self.tasks:
                if due[id(task)] > now and not self._wake.is_set():
                    continue
                try:
                    wait = await task.step(self)
                    errors[id(task)] = 0
                    if told.pop(id(task), None) is not None:
                        log.warning("runner task %s works again", task.name)
                except Exception as exc:  # noqa: BLE001 - one task's failure never stops the others
                    errors[id(task)] += 1
                    self._tell(task.name, exc, told, id(task))
                    wait = ERROR_BACKOFF_S if errors[id(task)] > 2 else MAX_SLEEP_S
                due[id(task)] = self.now() + max(0.0, min(float(wait), MAX_SLEEP_S))
            self._wake = anyio.Event()
            sleep = max(0.0, min(due.values()) - self.now()) if due else MAX_SLEEP_S
            await self._until_woken(sleep)

    async def _until_woken(self, seconds: float) -> None:
        """Wait ``seconds`` on the runner's clock, or less when :meth:`wake` is called."""
        async with anyio.create_task_group() as tg:
            async def alarm() -> None:
                await self.clock.sleep(seconds)
                tg.cancel_scope.cancel()
            tg.start_soon(alarm)
            await self._wake.wait()
            tg.cancel_scope.cancel()

    @staticmethod
    def _tell(name: str, exc: Exception, told: dict[int, tuple[str, str]], key: int, *,
              kind: str = "task") -> None:
        """Log a task's fault once — a refusal (:func:`node.common.dbfaults.refusal_of`: a
        ``KithError``, or a local I/O failure as :func:`~node.common.dbfaults.os_fault`
        maps it, with its ``mv`` hint for a folder in a file's place) as one line with its
        code and hint, anything else with its traceback — then stay quiet while the same
        fault repeats, until it changes or the task works again (issue 42: a damaged outbox
        was a traceback every second). ``kind`` is what failed: a ``task``'s step or a
        spawned ``job`` (:meth:`spawn`)."""
        from node.common.dbfaults import refusal_of

        refusal = refusal_of(exc)  # the one mapping (a folder in a file's place gets its `mv`)
        fault = (refusal.code, refusal.message) if refusal is not None else (type(exc).__name__, str(exc))
        if told.get(key) == fault:
            return
        told[key] = fault
        if refusal is not None:
            log.warning("runner %s %s failed: [%s] %s%s (said once; quiet until it changes)", kind, name, refusal.code,
                        refusal.message, f" — hint: {refusal.hint}" if refusal.hint else "")
        else:
            log.warning("runner %s %s failed (said once; quiet until it changes)", kind, name, exc_info=exc)


def default_tasks(home: Path, clock: Clock = SYSTEM_CLOCK) -> list[Any]:
    """The task list every long-running process of a home drives, in the order each loop
    steps them: the outbox's questions left with a holder (node/guest/sealed_outbox.py,
    specs/sealed.md), the outbox's delivery, and the re-sync of the copies it keeps
    (node/guest/copies/task.py, specs/copies.md §7), on ``clock``.

    The holder's task steps first: its step awaits its takes, so an answer waiting at a
    holder closes its row before the delivery's first step looks for open rows — a run that
    only has answers to take never binds an iroh endpoint nor dials the sleeping host
    (issue 43's asker CPU). The delivery's first ask waits for those takes (one HTTP
    request per holder)."""
    from node.guest.copies.task import CopiesTask
    from node.guest.outbox_task import OutboxTask
    from node.guest.sealed_outbox import SealedOutboxTask  # questions left with a holder (specs/sealed.md)

    return [SealedOutboxTask(home, clock=clock), OutboxTask(home), CopiesTask(home, clock=clock)]


__all__ = ["Runner", "RunnerTask", "default_tasks", "LOCK_FILE"]
