"""The runner task re-syncing every copy kept in the home (specs/copies.md §7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from node.common.errors import ConfigError, KithError
from node.guest.copies.lifecycle import expire_copies, stale
from node.guest.copies.store import CopyStore, OpenCopies, list_copies
from node.guest.copies.sync import sync_with_pool
from node.runtime.clock import SYSTEM_CLOCK, Clock

#: Seconds between two re-syncs of one copy that synced; after a failure (the host is away)
#: the next try comes after :data:`RETRY_FIRST_S`, doubling to :data:`RESYNC_S`.
RESYNC_S = 600.0
RETRY_FIRST_S = 5.0
#: Bound on one copy's sync in the background, seconds (what was committed is kept).
SYNC_TIMEOUT_S = 600.0


class CopiesTask:
    """The runner task re-syncing every copy kept in the home (specs/copies.md §7): each
    copy is synced once when the runner starts, then every :data:`RESYNC_S`; a host that
    cannot be reached is tried again after a backoff (from :data:`RETRY_FIRST_S`), and a
    host the runner reaches again (:meth:`node.guest.runner.Runner.peer_back`: the
    outbox delivered it a question) is re-synced at once, and so is a copy a handshake (of
    any process of the home) found :func:`stale` under a grant stamp it was not last tried
    under — even while its host is retried after a failure, so a withdrawn source is not
    answered from the copy for the rest of a backoff. One sync at a time per copy;
    each reports a ``copy-synced`` / ``copy-ended`` / ``copy-failed`` event; a sync that
    succeeds after a failed one sends ``peer_back`` itself (the outbox delivers at once).

    Args:
        home: the node home.
        clock: the :class:`node.runtime.clock.Clock` its schedule reads (monotonic).
    """

    name = "copies"

    def __init__(self, home: Path, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.home = Path(home)
        self.clock = clock
        self._due: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._running: set[str] = set()
        #: peers whose host came back (``peer_back``) while their sync was running: that
        #: sync may be a retry still dialling the host while it was away, so one more is due
        #: when it ends (the signal is not lost)
        self._back_while_running: set[str] = set()
        #: peer -> the grant stamp its handshakes had told (``grant.json``) when its last
        #: sync started: a stale copy whose host is being retried waits only while it is that
        self._tried: dict[str, Any] = {}
        #: what the steps last read of each copy's grant.json (:attr:`OpenCopies.grants`):
        #: read again only when the file changed, not at every step for every copy
        self._read = OpenCopies()

    async def step(self, runner: Any) -> float:
        """Delete the copies past their end (:func:`expire_copies`, a ``copy-ended`` event
        each), then start the syncs that are due — and those a handshake found
        :func:`stale`, unless their host is being retried and no handshake told another
        grant since that try — (:meth:`node.guest.runner.Runner.spawn`); the seconds until
        the next is."""
        expire_copies(self.home, notify=self.listener(runner), cache=self._read)
        now = self.clock.monotonic()
        for row in list_copies(self.home, cache=self._read):
            peer = row["peer"]
            if peer in self._running or "error" in row:
                continue  # a damaged copy waits for `kith copies remove` (its row says so)
            store = CopyStore(self.home, peer, cache=self._read)
            told = (store.grant() or {}).get("stamp")
            if self._due.get(peer, 0.0) > now and (
                    not stale(store) or peer in self._backoff and self._tried.get(peer) == told):
                continue  # a stale copy is synced now, unless its host is retried under that grant
            self._tried[peer] = told
            self._running.add(peer)
            runner.spawn(self._sync, runner, peer)
        return min([d - now for d in self._due.values() if d > now], default=RESYNC_S)

    def on_peer_back(self, runner: Any, key: str) -> None:
        """:meth:`node.guest.runner.Runner.peer_back`: every copy of the host ``key``
        (its pinned key, the manifest's ``hostKey``) is due now; one syncing now is due
        again at once if that sync fails (it may have been dialling the host while away)."""
        for row in list_copies(self.home):
            if row.get("hostKey") != key:
                continue
            if row["peer"] in self._running:
                self._back_while_running.add(row["peer"])
            else:
                self._due[row["peer"]] = 0.0

    @staticmethod
    def listener(runner: Any) -> Callable[[dict[str, Any]], None]:
        """The copy notices' listener (:data:`node.guest.copies.lifecycle.Notify`) of
        ``runner`` — its own steps and its pool's sessions pass it: a deleted copy is a
        ``copy-ended`` event (``via`` why), a changed grant wakes the runner."""
        from node.common.host_events import CopyEnded

        def tell(notice: dict[str, Any]) -> None:
            if notice.get("kind") == "changed":
                runner.wake()
            else:
                runner.emit(CopyEnded(peer=notice["peer"], fetched=0, removed=notice["removed"],
                                      via=notice["via"]).to_dict())
        return tell

    def _failed(self, runner: Any, peer: str, exc: BaseException) -> None:
        """A sync of ``peer`` failed with ``exc``: the next try after a doubling backoff
        (:data:`RETRY_FIRST_S` … :data:`RESYNC_S`), a ``copy-failed`` event with its code."""
        from node.common.host_events import CopyFailed
        from node.guest.targets import PeerGone, classify_gone

        code = (classify_gone(exc)[1] if isinstance(exc, PeerGone) else
                exc.code if isinstance(exc, KithError) else "peer-timeout" if isinstance(exc, TimeoutError)
                else "internal-error")
        wait = min(RESYNC_S, self._backoff.get(peer, RETRY_FIRST_S / 2) * 2)
        self._backoff[peer] = wait
        self._due[peer] = self.clock.monotonic() + wait
        runner.emit(CopyFailed(peer=peer, code=code or "peer-disconnected").to_dict())

    async def _sync(self, runner: Any, peer: str) -> None:
        import anyio

        from node.common.host_events import CopyEnded, CopySynced

        try:
            pool = await runner.pool()
            with anyio.fail_after(SYNC_TIMEOUT_S):
                report = await sync_with_pool(pool, peer, holder="a running node's background re-sync")
        except ConfigError as exc:
            if exc.code != "copy-sync-running":
                self._failed(runner, peer, exc)
            else:  # another process of this home syncs it now (kith copies sync): look again soon
                self._due[peer] = self.clock.monotonic() + RETRY_FIRST_S
        except Exception as exc:  # noqa: BLE001 - the host is away, or refused: try again later
            self._failed(runner, peer, exc)
        else:
            was_away = self._backoff.pop(peer, None) is not None
            self._due[peer] = self.clock.monotonic() + RESYNC_S
            if report["status"] == "ended":
                runner.emit(CopyEnded(peer=peer, fetched=report["fetched"], removed=report["removed"],
                                      via="sync").to_dict())
            else:
                runner.emit(CopySynced(peer=peer, fetched=report["fetched"], removed=report["removed"]).to_dict())
            if was_away and report["status"] == "ok":  # still running: its own hook leaves this copy be
                key = CopyStore(self.home, peer).load().get("hostKey")
                if isinstance(key, str):
                    runner.peer_back(key)
            self._back_while_running.discard(peer)  # it reached the host: a peer-back meanwhile is met
        finally:
            self._running.discard(peer)
            if peer in self._back_while_running:  # failed, and its host came back meanwhile: once more, now
                self._back_while_running.discard(peer)
                self._due[peer] = 0.0
                runner.wake()
