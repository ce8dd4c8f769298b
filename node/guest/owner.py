"""The asking side's one owner per process (issue 39 item 4), as :class:`node.host.host.Host`
is the host's.

A :class:`Guest` is built once by every command that asks a peer — ``kith ask``, ``kith
join``, ``kith copies sync``, ``kith outbox run``, ``kith verify --against-host``, ``kith
mcp``, ``kith api serve`` and the home's background runner beside ``kith host`` — and is
the only place they take the asking side's parts from:

- the identity, loaded on first use and kept;
- one view of the peer registry (:class:`node.guest.peerview.PeerView`), of the person
  record (:attr:`Guest.person`) and of each home file read on every question
  (:meth:`Guest.home_file`): ``peers.json`` and ``person.json`` are read once per process
  per change, whichever command, pool, asker, session or task reads them;
- the session pools (:meth:`Guest.session_pool`), wired to that identity and those views;
- the asker over a pool (:meth:`Guest.asker`);
- the home's runner (:meth:`Guest.runner`, :meth:`Guest.run_background`; one per home
  across processes, by its lock) and the copy notice sink (:attr:`Guest.notices`).

Parts are made on first use, so a plain ``kith join`` loads no pool, runner or copies
module it does not need.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

from node.guest.peerview import FileView, PeerView
from node.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("kith.runner")  # the runner's own logger: its failures read as the runner's


class Guest:
    """The asking side of one process: identity, registry view, pools, asker, runner.

    Args:
        home: the node home.
        identity: this node's :class:`node.trust.identity.Identity`, or None: loaded from
            ``home`` on first use (:func:`node.trust.identity.load_identity`; its refusals
            are raised then).
        local: offline mode (relay disabled, loopback) of the pools, when ``mode`` is None.
        mode: the :class:`node.transport.modes.TransportMode` of the pools (``--relay``,
            ...), or None: the home's ``[transport]`` table (see
            :class:`node.guest.pool.SessionPool`).
        clock: the :class:`node.runtime.clock.Clock` the runner reads and sleeps on (the
            host's when it runs beside one).
        notices: the copy notice sink (:data:`node.guest.copies.lifecycle.Notify`) of the
            pools it makes, or None: stderr. The runner's own pool tells the runner.
    """

    def __init__(self, home: Path, *, identity: Any = None, local: bool = False, mode: Any = None,
                 clock: Clock = SYSTEM_CLOCK, notices: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.home = Path(home)
        self.local = local
        self.mode = mode
        self.clock = clock
        self.notices = notices
        #: the one view of ``peers.json`` of this process (``loads`` counts its reads)
        self.peers = PeerView(self.home)
        self._identity = identity
        self._files: dict[str, FileView] = {}
        self._runner: Any = None

    @classmethod
    def of(cls, home: Path, *, local: bool = False, pool: Any = None) -> "Guest":
        """The guest of ``pool`` (the server's warm pool: its owner), or when there is none
        (an in-process call: tests, tools) a new one for ``home`` and ``local``."""
        owner = getattr(pool, "owner", None)
        return owner if owner is not None else cls(home, local=local)

    @property
    def identity(self) -> Any:
        """This node's identity, loaded once.

        Raises:
            ConfigError: as :func:`node.trust.identity.load_identity` (no or bad key).
        """
        if self._identity is None:
            from node.trust.identity import load_identity

            self._identity = load_identity(self.home)
        return self._identity

    def load(self) -> Any:
        """Load this home's identity now (once: later calls and :attr:`identity` return it),
        so a command refuses a home without one, or with a damaged key, before it resolves,
        gates or dials anything.

        Returns:
            The :class:`node.trust.identity.Identity`.

        Raises:
            KithError: as :func:`node.trust.identity.load_identity` (``home-not-initialized``,
                ``identity-corrupt``, ``io-error``).
        """
        return self.identity

    @property
    def person(self) -> FileView:
        """This process's one view of ``person.json`` (:meth:`home_file`, loaded with
        :func:`node.trust.person.load_person`): ``now()`` is this home's
        :class:`node.trust.person.PersonRecord`, or None when the home has no person, read
        again only when the file changed. ``kith join`` and every pool's sessions
        (:attr:`node.guest.pool.SessionPool.person`) read it here, so a run reads the file
        once and each handshake carries the chain and revocation list of the record read
        last.

        ``now()`` raises as :func:`~node.trust.person.load_person` does (``config-invalid``
        for a damaged record), each time it is asked, until the file is fixed.
        """
        from node.trust.person import PERSON_FILE, load_person

        return self.home_file(PERSON_FILE, load_person)

    def home_file(self, name: str, load: Callable[[Path], Any]) -> FileView:
        """This process's view of ``<home>/name`` loaded with ``load`` (made on first use):
        read again only when the file changed (the kept cards and revocation lists the
        asker reads at each question)."""
        view = self._files.get(name)
        if view is None:
            view = self._files[name] = FileView(self.home, name, load)
        return view

    def session_pool(self, **options: Any) -> Any:
        """A new, not yet entered :class:`node.guest.pool.SessionPool` of this guest: its
        identity, transport, registry views and notice sink.

        Args:
            options: further :class:`~node.guest.pool.SessionPool` fields (``end_wait_s``,
                ``down_s``, ``on_copy_notice``, ``max_sessions``, ...), overriding these.

        Returns:
            The pool; use it as ``async with guest.session_pool() as pool``.
        """
        from node.guest.pool import SessionPool

        fields: dict[str, Any] = {"local": self.local, "mode": self.mode, "on_copy_notice": self.notices}
        fields.update(options)
        return SessionPool(self.home, self.identity, owner=self, **fields)

    def asker(self, pool: Any, on_provisional: Callable[[dict[str, Any]], None] | None = None) -> Any:
        """The :class:`node.guest.asker.Asker` that decides who answers for a name, over
        ``pool`` (one of :meth:`session_pool`'s)."""
        from node.guest.asker import Asker

        return Asker(pool, on_provisional=on_provisional)

    def runner(self, *, command: str, tasks: list[Any] | None = None,
               pool: Callable[[], Awaitable[Any]] | None = None,
               on_event: Callable[[dict[str, Any]], None] | None = None) -> Any:
        """The home's :class:`node.guest.runner.Runner` in this process, made once (a second
        call returns the first). Only one process of a home drives it at a time (its lock,
        specs/outbox.md §5).

        Args:
            command: what the process is, written into the lock file (``kith host``).
            tasks: the task list, or None: :func:`node.guest.runner.default_tasks` on this
                guest's clock.
            pool: an async callable returning the process's warm pool to share, or None:
                the runner enters its own (:meth:`session_pool` with ``down_s=0``).
            on_event: called with each event a task reports.
        """
        if self._runner is None:
            from node.guest.runner import Runner, default_tasks

            self._runner = Runner(self, default_tasks(self.home, self.clock) if tasks is None else tasks,
                                  pool=pool, command=command, on_event=on_event)
        return self._runner

    async def run_background(self, *, command: str, pool: Callable[[], Awaitable[Any]] | None = None,
                             on_event: Callable[[dict[str, Any]], None] | None = None,
                             task_status: Any = None) -> None:
        """Run :meth:`runner` (:func:`node.guest.runner.default_tasks` on this guest's
        clock) until cancelled: what ``kith host``, ``kith api serve`` and ``kith mcp`` run
        on their event loop beside their work (specs/outbox.md §5). A home without an
        identity runs nothing, nor does a home this user may read but not write (one
        warning says so: the runner's lock, the outbox and the copies are all writes); a
        runner that fails is logged and ends, never the process around it (``kith host``
        keeps serving). A ``pool`` handed in is started first, so
        a home it cannot start in stops the runner at once with the pool's refusal, as
        the runner's own pool does when it enters it.

        Args:
            command, pool, on_event: as :meth:`runner`.
            task_status: anyio's, for ``tg.start`` (started once the runner waits for its lock).
        """
        import anyio

        from node.trust.identity import key_path

        status = anyio.TASK_STATUS_IGNORED if task_status is None else task_status
        if not key_path(self.home).is_file():  # no identity: nothing can have been queued here
            status.started()
            return
        from node.common.home import may_write
        from node.guest.runner import LOCK_FILE

        if not may_write(self.home / LOCK_FILE):  # its lock, the outbox, the copies: it only writes
            log.warning("this home is read-only for you: its background runner does not run in this process "
                        "(kept questions are not sent and copies not re-synced from here; a kith process that may "
                        "write the home does that)")
            status.started()
            return
        runner = self.runner(command=command, pool=pool, on_event=on_event)
        try:
            if pool is not None:  # the process's pool, started now: a home it cannot start in (a damaged
                await pool()  # key, a bad [transport] table) stops the runner here, as its own pool does
            await runner.run(task_status=status)
        except Exception as exc:  # noqa: BLE001 - the background work never ends the process it runs in
            from node.common.dbfaults import refusal_of

            refusal = refusal_of(exc)
            if refusal is None:
                log.warning("the home's background runner stopped", exc_info=True)
            else:  # a fault of the home: one line with its code and way out, never a traceback
                log.warning("the home's background runner stopped: [%s] %s%s (kept questions and copies wait until "
                            "this is fixed and the process restarted)", refusal.code, refusal.message,
                            f" — hint: {refusal.hint}" if refusal.hint else "")


__all__ = ["Guest"]
