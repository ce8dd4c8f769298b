"""The outbox's delivery: the runner task that brings each kept question to its peer once
the peer is reachable, and stores its answer (specs/outbox.md §3-§5).

Each step: open rows past their expiry are closed (``expired``), then every peer with open
rows that is due and not being asked already gets one delivery job (:meth:`OutboxTask._deliver`),
at most :data:`MAX_PARALLEL` at a time. A job asks that peer its open questions, oldest
first, over the runner's warm pool (one session; each question under
:data:`ATTEMPT_TIMEOUT_S`), and stores each outcome (:func:`node.guest.outbox.classify`)
before it asks the next. When the peer cannot be reached the job ends and the peer is due
again after a backoff: :data:`BACKOFF_FIRST_S` doubling to :data:`BACKOFF_CAP_S`
(monotonic, in memory: a new runner tries every peer at once). A ``pending-approval``
row is asked again after :data:`PENDING_RETRY_S`, doubling to :data:`PENDING_RETRY_CAP_S`;
a ``rate-limited`` answer ends the job and none of that peer's questions is asked before
the host's ``retry_after_s``; a row whose answer was not an
answer after :data:`REFUSED_RETRY_S`, doubling to :data:`REFUSED_RETRY_CAP_S`.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import anyio

from node.common.errors import KithError
from node.common.host_events import OutboxAnswered, OutboxExpired, OutboxFailed, OutboxPending
from node.guest.outbox import OpenDelivery, OutboxStore, classify
from node.common.kept import keep

log = logging.getLogger("kith.outbox")

#: First wait after a peer could not be reached, and its cap, seconds: a peer that comes
#: up is asked within about this much (speed target: answered ≤ 3 s after the host is up).
BACKOFF_FIRST_S = 0.5
BACKOFF_CAP_S = 2.0
#: Bound on one question's round trip (connect, handshake, answer), seconds.
ATTEMPT_TIMEOUT_S = 20.0
#: Peers asked at once.
MAX_PARALLEL = 8
#: Seconds before a question the host's owner has not approved yet is asked again: the
#: first wait, doubling at each pending answer up to the cap (each ask is a query the host
#: counts against its quota and audits).
PENDING_RETRY_S = 10.0
PENDING_RETRY_CAP_S = 300.0
#: Seconds a row waits after an answer that is not one (a refusal, a malformed answer):
#: the first wait, doubling up to the cap.
REFUSED_RETRY_S = 30.0
REFUSED_RETRY_CAP_S = 1800.0
#: Test-only: when set, the process kills itself (SIGKILL) after a host answered and
#: before the answer is stored (tests/test_outbox.py: nothing is lost, stored once).
KILL_BEFORE_STORE_ENV = "KITH_TEST_OUTBOX_KILL_BEFORE_STORE"
#: Open rows of one peer read for one delivery job (the next job reads the next ones).
BATCH_ROWS = 50
#: Bound on the rows whose waits are remembered.
STEP_ROWS = 5000


class OutboxTask:
    """The delivery task (:class:`node.guest.runner.RunnerTask`).

    Args:
        home: the node home. store: the outbox (None: opened on first step).
    """

    name = "outbox"

    def __init__(self, home: Path, store: OutboxStore | None = None) -> None:
        self.home = Path(home)
        self.store = store
        self._busy: set[str] = set()  # peer keys with a delivery job running
        self._peer_due: dict[str, float] = {}  # peer key → monotonic time it is due again
        self._failures: dict[str, int] = {}
        self._away: set[str] = set()  # peer keys whose last attempt could not reach them
        self._row_due: dict[tuple[str, str], float] = {}  # (question id, peer key) → due again
        self._row_tries: dict[tuple[str, str], int] = {}  # answers that were not complete, per row
        self._told: dict[int, tuple[str, str]] = {}  # the home fault a delivery last told (Runner._tell)

    def _open_store(self) -> OutboxStore:
        if self.store is None:
            self.store = OutboxStore(self.home)
        return self.store

    async def step(self, runner: Any) -> float:
        """Expire, then start a delivery job for every due peer; returns the seconds until
        the next peer or row is due (at most the runner's poll).

        Raises:
            KithError: the outbox or, while a question waits, ``peers.json`` does not load
                (``config-invalid``, ``io-error``, ...): the runner tells it once and backs off.
        """
        from node.guest.outbox import OUTBOX_FILE

        if self.store is None and not (self.home / OUTBOX_FILE).exists():
            return 1.0  # nothing was ever queued here: no file is created
        store = await anyio.to_thread.run_sync(self._open_store)
        expired = await anyio.to_thread.run_sync(store.expire)
        if expired:
            runner.emit(OutboxExpired(rows=expired).to_dict())
        peers = await anyio.to_thread.run_sync(store.open_peers)
        if peers:  # a peers.json that does not load is this step's fault, told once by the runner
            runner.guest.peers.now()
        now = runner.now()
        nxt = 1.0
        for key in peers:
            if key in self._busy:
                continue
            due = self._peer_due.get(key, 0.0)
            if due > now:
                nxt = min(nxt, due - now)
                continue
            if len(self._busy) >= MAX_PARALLEL:
                break
            waiting = frozenset(q for (q, k), t in self._row_due.items() if k == key and t > now)
            # a peer that is down costs one row's read: the job stops at the first unreachable ask
            limit = BATCH_ROWS if key not in self._failures else 1
            items = await anyio.to_thread.run_sync(
                lambda: store.open_deliveries(limit, peer_key=key, skip=waiting))
            if not items:
                continue
            self._busy.add(key)
            runner.spawn(self._deliver, runner, key, items)
        return max(0.05, nxt)

    async def _deliver(self, runner: Any, key: str, items: list[OpenDelivery]) -> None:
        """Ask one peer its open questions in order; stop at the first that cannot reach it."""
        from node.guest.asker import Asker
        from node.guest.targets import PeerGone, classify_gone

        peers = runner.guest.peers  # the process's view of peers.json (node/guest/owner.py)
        store = self.store
        assert store is not None
        try:
            for item in items:
                try:
                    registry = peers.now()  # read again only when peers.json changed
                except KithError:
                    return  # damaged since the step read it: the next step says so (not a traceback per job)
                rec = registry.by_name(item.peer_name)
                if rec is None or rec.public_key != item.peer_key:
                    code = "peer-not-found" if rec is None else "outbox-peer-changed"
                    await anyio.to_thread.run_sync(store.fail, item.question_id, key, code)
                    runner.emit(OutboxFailed(id=item.question_id, peer=item.peer_name, code=code).to_dict())
                    continue
                if registry.is_blocked(rec.public_key):
                    await anyio.to_thread.run_sync(store.fail, item.question_id, key, "ask-peer-blocked")
                    runner.emit(OutboxFailed(id=item.question_id, peer=item.peer_name, code="ask-peer-blocked").to_dict())
                    continue
                request = {**item.request, "query_id": item.query_id}
                message = None
                code = None
                refused = False  # reached, but the host (or this node) refused: back off longer
                try:
                    from node.policy.outbound import gate  # logged (the agent's rule decided when it was kept)

                    ticket = await anyio.to_thread.run_sync(
                        lambda: gate(self.home, item.request, [item.peer_name], actor="outbox", rule="allow"))
                    pool = await runner.pool()
                    with anyio.fail_after(ATTEMPT_TIMEOUT_S):
                        message = await Asker(pool).ask(item.peer_name, request)
                    await anyio.to_thread.run_sync(ticket.done, message)
                except TimeoutError:
                    code = "peer-timeout"
                except PeerGone as gone:
                    status, code = classify_gone(gone)
                    code = code or "peer-disconnected"
                    refused = status == "refused"
                except KithError as exc:
                    from node.common.errors import CommunityError, ConfigError, TransportError

                    code = exc.code
                    refused = not isinstance(exc, (TransportError, CommunityError))
                    if isinstance(exc, ConfigError):  # a fault of this home (sent.jsonl, ...): told once,
                        runner._tell(self.name, exc, self._told, 0)  # as the runner tells a step's fault
                if message is None:  # not answered: back off this peer, keep the row as it is
                    await anyio.to_thread.run_sync(lambda: store.record_attempt(item.question_id, key, None, code=code))
                    self._back_off(runner, key, refused=refused)
                    return
                if os.environ.get(KILL_BEFORE_STORE_ENV):  # tests: killed between delivery and storing
                    os.kill(os.getpid(), signal.SIGKILL)
                self._told.clear()  # a later fault of the home is told again
                was_away = key in self._away
                self._failures.pop(key, None)
                self._away.discard(key)
                self._peer_due.pop(key, None)
                if was_away or item.from_copy:
                    # the host is back (it could not be reached, or its copy answered this
                    # question in its stead): the home's other tasks hear it — its copy re-syncs
                    runner.peer_back(key)
                outcome = classify(message, item.query_id)
                stored = await anyio.to_thread.run_sync(
                    lambda: store.record_attempt(item.question_id, key, outcome, message=message))
                now = runner.now()
                if outcome.state == "answered":
                    self._row_due.pop((item.question_id, key), None)
                    self._row_tries.pop((item.question_id, key), None)
                    if stored:
                        runner.emit(OutboxAnswered(id=item.question_id, peer=item.peer_name,
                                                    status=message.get("status")).to_dict())
                elif outcome.state == "pending-approval":
                    self._row_due[(item.question_id, key)] = now + self._row_wait(item, key, PENDING_RETRY_S,
                                                                                  PENDING_RETRY_CAP_S)
                    runner.emit(OutboxPending(id=item.question_id, peer=item.peer_name,
                                              approval_id=message.get("approval_id")).to_dict())
                elif outcome.code == "rate-limited":
                    # the host's quota is the peer's, not the question's: none of this peer's
                    # questions is asked before it lets us (each ask would be refused and counted)
                    wait = (max(1.0, outcome.retry_after_s) if outcome.retry_after_s is not None
                            else self._row_wait(item, key, REFUSED_RETRY_S, REFUSED_RETRY_CAP_S))
                    self._row_due[(item.question_id, key)] = now + wait
                    self._peer_due[key] = now + wait
                    return
                else:
                    self._row_due[(item.question_id, key)] = now + self._row_wait(item, key, REFUSED_RETRY_S,
                                                                                  REFUSED_RETRY_CAP_S)
                if len(self._row_due) > 4 * STEP_ROWS:  # bounded: forget the oldest waits
                    for k in list(self._row_due)[: len(self._row_due) - 2 * STEP_ROWS]:
                        del self._row_due[k]
        finally:
            self._busy.discard(key)
            runner.wake()

    def _row_wait(self, item: OpenDelivery, key: str, first: float, cap: float) -> float:
        """The wait before a row that got no complete answer is asked again: ``first``,
        doubling at each such answer, at most ``cap`` (bounded memory: at most
        4 × :data:`STEP_ROWS` rows remembered)."""
        k = (item.question_id, key)
        n = self._row_tries.get(k, 0)
        keep(self._row_tries, k, n + 1, 4 * STEP_ROWS)
        return min(cap, first * (2 ** min(n, 20)))

    def on_peer_back(self, runner: Any, key: str) -> None:
        """:meth:`node.guest.runner.Runner.peer_back`: a peer another task reached again
        is due now when its last delivery could not reach it (not when it refused)."""
        if key in self._away:
            self._peer_due.pop(key, None)

    def _back_off(self, runner: Any, key: str, *, refused: bool = False) -> None:
        """The peer is due again after :data:`BACKOFF_FIRST_S` doubling to
        :data:`BACKOFF_CAP_S` while it cannot be reached, or — when it was reached and the
        session refused (a handshake refusal, an invitation this node refuses) — after
        :data:`REFUSED_RETRY_S` doubling to :data:`REFUSED_RETRY_CAP_S`: a host that says
        no is not asked every 2 s for a week."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        if refused:
            self._away.discard(key)
        else:
            self._away.add(key)
        first, cap = (REFUSED_RETRY_S, REFUSED_RETRY_CAP_S) if refused else (BACKOFF_FIRST_S, BACKOFF_CAP_S)
        self._peer_due[key] = runner.now() + min(cap, first * (2 ** min(n, 20)))


__all__ = ["OutboxTask", "BACKOFF_FIRST_S", "BACKOFF_CAP_S", "ATTEMPT_TIMEOUT_S"]
