"""Per-peer query quotas: token buckets in the Host process (DESIGN §10).

Each peer (by public key) has a bucket of ``burst`` tokens refilled at
``queries_per_hour / 3600`` tokens per second; a query takes one token. Anonymous peers
(not in the registry) additionally draw from one shared bucket
(:meth:`node.policy.store.Policy.anonymous_quota`), so rotating keys does not multiply
a quota. That pool is shared fairly (:class:`_FairShare`): a key that has drawn more from
it recently than another anonymous key may not take the tokens that other key (or a
newcomer) still needs, so one stranger with many keys cannot starve every other anonymous
guest (issue 20, specs/policy.md §6). Over quota → the answer is ``rate-limited`` with ``retry_after_s`` (whole
seconds until a token is back).

The host's limiter (:meth:`RateLimiter.persistent`) also keeps its buckets in
``<home>/quota.sqlite`` (:class:`QuotaStore`, 0600), so a host restart does not refill them
(issue 11). Buckets changed are written at most every :data:`FLUSH_INTERVAL_S` (on the next
token taken after it) and on close: a host killed outright loses at most that much. A bucket not used for
:data:`QuotaStore.MAX_AGE_S` is forgotten (counted full again).
"""

from __future__ import annotations

import bisect
import math
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node.common.home import open_home_db
from node.policy.store import Quota

#: Buckets kept at once; the least recently used is dropped beyond (bounded memory).
MAX_BUCKETS = 4096
ANONYMOUS = "\x00anonymous"
#: Changed buckets are written to the store at most this often (s): one SQLite write per
#: query would cost about 0.2 ms on the answer path.
FLUSH_INTERVAL_S = 1.0


#: What the quota file holds, named when a damaged one is refused (its hint).
_HOLDS = "it holds the peers' quota buckets; a new file starts with every bucket full"


class QuotaStore:
    """Token buckets on disk: ``<home>/quota.sqlite`` (0600), one row per peer key (and one
    for the shared anonymous bucket): ``(key, tokens, stamp)`` with ``stamp`` in Unix seconds.

    Opened late: building it only reads the file (:func:`node.common.home.probe_home_db`: a
    damaged one is refused then); it is made and opened at the first load or save, so a
    host start refused for any reason writes nothing. Bounded: at open, rows older than
    :data:`MAX_AGE_S` are deleted and at most
    :data:`MAX_ROWS` are kept (the most recently used).

    Args:
        home: the Kith home.
        clock: wall-clock seconds (Unix time).
    """

    FILE_NAME = "quota.sqlite"
    #: A bucket untouched this long (s) is forgotten: it is full again for any sane quota.
    MAX_AGE_S = 7 * 24 * 3600.0
    #: Rows kept at most.
    MAX_ROWS = 65_536

    def __init__(self, home: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(home) / self.FILE_NAME
        self._clock = clock
        self._db: sqlite3.Connection | None = None  # opened when first needed: a refused start writes nothing
        from node.common.dbfaults import probe_state_db

        probe_state_db(self.path, _HOLDS)  # a damaged file is refused now, writing nothing

    def _fault(self, exc: BaseException) -> BaseException:
        """The typed refusal of a failed SQLite call on the file (``disk-full``,
        ``io-error``, ``config-invalid``), or ``exc`` itself when it is no fault of the file."""
        from node.common.dbfaults import state_refusal

        return state_refusal(exc, self.path, _HOLDS)

    def _open(self) -> sqlite3.Connection:
        """The database, made and trimmed (:data:`MAX_AGE_S`, :data:`MAX_ROWS`) at the first call."""
        if self._db is None:
            try:
                db = open_home_db(self.path)  # 0600, WAL
                db.execute("CREATE TABLE IF NOT EXISTS bucket (key TEXT PRIMARY KEY, tokens REAL NOT NULL,"
                           " stamp REAL NOT NULL)")
                db.execute("DELETE FROM bucket WHERE stamp < ?", (self._clock() - self.MAX_AGE_S,))
                db.execute("DELETE FROM bucket WHERE key NOT IN (SELECT key FROM bucket ORDER BY stamp DESC "
                           "LIMIT ?)", (self.MAX_ROWS,))
            except (sqlite3.DatabaseError, OSError) as exc:
                raise self._fault(exc) from None
            self._db = db
        return self._db

    def load(self, key: str) -> tuple[float, float] | None:
        """``(tokens, stamp)`` of ``key``'s bucket, or None when none is stored."""
        row = self._open().execute("SELECT tokens, stamp FROM bucket WHERE key = ?", (key,)).fetchone()
        return (float(row[0]), float(row[1])) if row else None

    def save(self, rows: list[tuple[str, float, float]]) -> None:
        """Store ``(key, tokens, stamp)`` rows in one transaction.

        Raises:
            ConfigError: ``disk-full`` / ``io-error`` naming the file (node.common.dbfaults).
        """
        db = self._open()
        try:
            with db:
                db.execute("BEGIN")
                db.executemany("INSERT INTO bucket (key, tokens, stamp) VALUES (?, ?, ?) ON CONFLICT(key) "
                               "DO UPDATE SET tokens = excluded.tokens, stamp = excluded.stamp", rows)
        except (sqlite3.DatabaseError, OSError) as exc:  # a full disk is disk-full, never a bare sqlite3 error
            raise self._fault(exc) from None

    def close(self) -> None:
        """Close the database, if it was opened (idempotent)."""
        if self._db is not None:
            self._db.close()


#: Time constant (s) of the anonymous keys' recent use of the shared pool (an
#: exponentially decaying count of the tokens each took) and how long a key that asked
#: stays among the keys the pool is shared by.
FAIR_WINDOW_S = 300.0
#: Keys tracked for the fair share at most (the least recently seen are dropped).
MAX_FAIR_KEYS = 4096


class _FairShare:
    """Who has been using the shared anonymous pool, for sharing it fairly.

    Each anonymous key that asked within :data:`FAIR_WINDOW_S` is *active* and has a
    recent use ``u`` (tokens it took from the pool, decaying with that time constant).
    A key may take a pool token only while the pool keeps, after it, one token for every
    active key that used the pool *less* than it (strictly) plus, once it has used a token
    itself, one for a newcomer — so a heavy key never takes the token a lighter key (an
    honest guest asking now and then, a first-time guest) is owed, while the pool stays one
    fixed budget (every answer still takes a pool token: more keys never buy more answers).
    The reserve is capped at the pool's burst minus one, so a full pool serves anyone.

    Every key decays at the same rate, so the order of two keys' uses never changes with
    time: each key is kept as ``L = ln(u) + t/τ`` (time-invariant; ``-inf`` for a key that
    took nothing) in a sorted list, and "how many are lighter" is one bisection —
    O(log n) per query plus a list insertion, about as cheap for 4,096 keys as for 48.
    Memory only: a restarted host starts with nobody active. Not thread-safe (the
    :class:`RateLimiter` lock guards it).
    """

    def __init__(self) -> None:
        self._used: dict[str, tuple[float, float]] = {}  # key -> (L, last seen), oldest first
        self._order: list[float] = []  # the L of every tracked key, sorted

    @staticmethod
    def _level(used: float, now: float) -> float:
        return math.log(used) + now / FAIR_WINDOW_S if used > 0 else -math.inf

    def _use(self, key: str, now: float) -> float:
        entry = self._used.get(key)
        if entry is None or entry[0] == -math.inf:
            return 0.0
        return math.exp(entry[0] - now / FAIR_WINDOW_S)

    def _drop(self, key: str) -> None:
        level, _ = self._used.pop(key)
        del self._order[bisect.bisect_left(self._order, level)]

    def _expire(self, now: float) -> None:
        horizon = now - FAIR_WINDOW_S
        while self._used:
            oldest = next(iter(self._used))
            if len(self._used) <= MAX_FAIR_KEYS and self._used[oldest][1] >= horizon:
                break
            self._drop(oldest)

    def reserve(self, key: str, now: float, burst: int) -> int:
        """Pool tokens ``key`` must leave to others now (0 … ``burst`` - 1)."""
        self._expire(now)
        mine = self._used.get(key, (-math.inf, now))[0]
        lighter = bisect.bisect_left(self._order, mine - 1e-9) if mine != -math.inf else 0
        newcomer = 1 if self._use(key, now) >= 0.5 else 0
        return max(0, min(lighter + newcomer, max(burst, 1) - 1))

    def seen(self, key: str, now: float, took: bool) -> None:
        """Record that ``key`` asked at ``now`` (and took a pool token when ``took``)."""
        used = self._use(key, now) + (1.0 if took else 0.0)
        if key in self._used:
            self._drop(key)
        level = self._level(used, now)
        self._used[key] = (level, now)  # most recently seen last
        bisect.insort(self._order, level)
        self._expire(now)


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass(frozen=True)
class Admission:
    """The outcome of :meth:`RateLimiter.take`.

    Attributes:
        ok: the query may run.
        retry_after_s: whole seconds (≥ 1) until it may, when not ``ok``; 0 when ``ok``.
        denied: the quota is zero (the peer may not query at all → ``policy-denied``).
    """

    ok: bool
    retry_after_s: int = 0
    denied: bool = False


class RateLimiter:
    """Token buckets keyed by peer key (thread-safe; hooks run in worker threads).

    Args:
        clock: seconds (monotonic by default; injectable for tests). With a ``store`` it
            must be wall-clock Unix time, as the stored stamps are.
        store: where buckets survive a restart (:class:`QuotaStore`), or None (memory only).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, store: QuotaStore | None = None) -> None:
        self._clock = clock
        self._store = store
        self._buckets: dict[str, _Bucket] = {}
        self._dirty: set[str] = set()
        self._flushed = clock()
        self._lock = threading.Lock()
        self._fair = _FairShare()

    @classmethod
    def persistent(cls, home: Path, *, clock: Callable[[], float] = time.time) -> "RateLimiter":
        """The host's limiter: buckets kept in ``<home>/quota.sqlite`` across restarts."""
        return cls(clock, QuotaStore(home, clock=clock))

    def close(self) -> None:
        """Write the changed buckets and close the store, if any (idempotent)."""
        if self._store is not None:
            with self._lock:
                self._flush()
                self._store.close()

    def _flush(self) -> None:
        assert self._store is not None
        rows = [(k, self._buckets[k].tokens, self._buckets[k].stamp) for k in self._dirty if k in self._buckets]
        if rows:
            self._store.save(rows)
        self._dirty.clear()
        self._flushed = self._clock()

    def _state(self, key: str, quota: Quota, now: float) -> _Bucket:
        bucket = self._buckets.pop(key, None)
        if bucket is None and self._store is not None:
            stored = self._store.load(key)
            if stored is not None:
                bucket = _Bucket(*stored)
        if bucket is None:
            bucket = _Bucket(float(max(quota.burst, 1)), now)
        else:
            rate = quota.queries_per_hour / 3600.0
            elapsed = max(0.0, now - bucket.stamp)  # a wall clock set back refills nothing
            bucket.tokens = min(float(max(quota.burst, 1)), bucket.tokens + elapsed * rate)
            bucket.stamp = now
        self._buckets[key] = bucket  # re-insert: most recently used last
        while len(self._buckets) > MAX_BUCKETS:
            dropped = next(iter(self._buckets))
            if dropped in self._dirty and self._store is not None:  # keep what it took
                b = self._buckets[dropped]
                self._store.save([(dropped, b.tokens, b.stamp)])
                self._dirty.discard(dropped)
            self._buckets.pop(dropped)
        return bucket

    @staticmethod
    def _wait(bucket: _Bucket, quota: Quota, need: float = 1.0) -> int:
        """Whole seconds (≥ 1) until ``bucket`` holds ``need`` tokens."""
        rate = quota.queries_per_hour / 3600.0
        return max(1, math.ceil((need - bucket.tokens) / rate))

    def left(self, peer_key: str, quota: Quota, shared: Quota | None = None) -> int:
        """Whole queries ``peer_key`` may ask now under ``quota`` (and the shared anonymous
        bucket under ``shared``): the smaller bucket's tokens, rounded down. Reads only —
        nothing is taken, nothing is stored (the owner's view, specs/control.md)."""
        if quota.queries_per_hour <= 0 or (shared is not None and shared.queries_per_hour <= 0):
            return 0
        with self._lock:
            now = self._clock()
            tokens = [self._peek(peer_key, quota, now)]
            if shared is not None:
                tokens.append(self._peek(ANONYMOUS, shared, now))
        return max(0, math.floor(min(tokens) + 1e-9))

    def _peek(self, key: str, quota: Quota, now: float) -> float:
        bucket = self._buckets.get(key)
        if bucket is None and self._store is not None:
            stored = self._store.load(key)
            if stored is not None:
                bucket = _Bucket(*stored)
        full = float(max(quota.burst, 1))
        if bucket is None:
            return full
        return min(full, bucket.tokens + max(0.0, now - bucket.stamp) * quota.queries_per_hour / 3600.0)

    def take(self, peer_key: str, quota: Quota, shared: Quota | None = None, cost: int = 1) -> Admission:
        """Take ``cost`` tokens (one query; a copy request may cost more, specs/copies.md §3:
        never more than the bucket's ``burst``, so it can always be paid in time) from
        ``peer_key``'s bucket (and from the shared anonymous bucket when ``shared`` is
        given, within ``peer_key``'s fair share of it, :class:`_FairShare`); both must have
        them, else nothing is taken.

        Returns:
            :class:`Admission`: ``ok``, or ``retry_after_s`` — whole seconds until the
            bucket that refused holds what this key needs.
        """
        if quota.queries_per_hour <= 0 or (shared is not None and shared.queries_per_hour <= 0):
            return Admission(False, 0, denied=True)
        with self._lock:
            now = self._clock()
            own = self._state(peer_key, quota, now)
            pool = self._state(ANONYMOUS, shared, now) if shared is not None else None
            waits = []
            cost_f = float(max(1, min(int(cost), quota.burst)))
            if own.tokens < cost_f:
                waits.append(self._wait(own, quota, cost_f))
            if pool is not None and shared is not None:
                # the fair share: leave the tokens lighter keys (and a newcomer) are owed
                cost_f = min(cost_f, float(max(1, shared.burst)))
                need = cost_f + self._fair.reserve(peer_key, now, shared.burst)
                if pool.tokens < need:
                    waits.append(self._wait(pool, shared, need))
            if waits:
                if pool is not None:
                    self._fair.seen(peer_key, now, took=False)
                return Admission(False, max(waits))
            own.tokens -= cost_f
            if pool is not None:
                pool.tokens -= cost_f
                self._fair.seen(peer_key, now, took=True)
            if self._store is not None:  # a restart keeps what was taken
                self._dirty.add(peer_key)
                if pool is not None:
                    self._dirty.add(ANONYMOUS)
                if now - self._flushed >= FLUSH_INTERVAL_S or now < self._flushed:
                    self._flush()
            return Admission(True)
