"""Per-peer query quotas: token buckets in the Host process (DESIGN §10).

Each peer (by public key) has a bucket of ``burst`` tokens refilled at
``queries_per_hour / 3600`` tokens per second; a query takes one token. Anonymous peers
(not in the registry) additionally draw from one shared bucket
(:meth:`node.policy.store.Policy.anonymous_quota`), so rotating keys does not multiply
a quota. Over quota → the answer is ``rate-limited`` with ``retry_after_s`` (whole
seconds until a token is back). Buckets live in memory: a restart refills them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from node.policy.store import Quota

#: Buckets kept at once; the least recently used is dropped beyond (bounded memory).
MAX_BUCKETS = 4096
ANONYMOUS = "\x00anonymous"


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
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def _state(self, key: str, quota: Quota, now: float) -> _Bucket:
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = _Bucket(float(max(quota.burst, 1)), now)
        else:
            rate = quota.queries_per_hour / 3600.0
            bucket.tokens = min(float(max(quota.burst, 1)), bucket.tokens + (now - bucket.stamp) * rate)
            bucket.stamp = now
        self._buckets[key] = bucket  # re-insert: most recently used last
        while len(self._buckets) > MAX_BUCKETS:
            self._buckets.pop(next(iter(self._buckets)))
        return bucket

    @staticmethod
    def _wait(bucket: _Bucket, quota: Quota) -> int:
        rate = quota.queries_per_hour / 3600.0
        return max(1, math.ceil((1.0 - bucket.tokens) / rate))

    def take(self, peer_key: str, quota: Quota, shared: Quota | None = None) -> Admission:
        """Take one token from ``peer_key``'s bucket (and from the shared anonymous bucket
        when ``shared`` is given); both must have one, else nothing is taken."""
        if quota.queries_per_hour <= 0 or (shared is not None and shared.queries_per_hour <= 0):
            return Admission(False, 0, denied=True)
        with self._lock:
            now = self._clock()
            own = self._state(peer_key, quota, now)
            pool = self._state(ANONYMOUS, shared, now) if shared is not None else None
            waits = []
            if own.tokens < 1.0:
                waits.append(self._wait(own, quota))
            if pool is not None and shared is not None and pool.tokens < 1.0:
                waits.append(self._wait(pool, shared))
            if waits:
                return Admission(False, max(waits))
            own.tokens -= 1.0
            if pool is not None:
                pool.tokens -= 1.0
            return Admission(True)
