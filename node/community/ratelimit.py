"""Token-bucket rate limits for the community server (DESIGN §12: per-key rate limits).

Each bucket holds at most ``burst`` tokens and refills at ``rate_per_s`` tokens per second;
a request takes one token or is refused with the number of seconds until one is available
(the server answers ``429 rate-limited`` with ``Retry-After``). The server keeps two
families of buckets: one per signing key (every signed request, after its signature
verified, so nobody can drain another key's bucket) and one per client address (every
request, before its body is read).

Buckets live in memory, per server process (a deployment with several processes behind a
load balancer gets one set per process). The table is bounded: past ``max_buckets`` the
least recently used bucket is forgotten (its owner starts again with a full bucket).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RateLimit:
    """One bucket shape: ``rate_per_s`` tokens per second, at most ``burst`` tokens.

    ``rate_per_s`` 0 disables the limit.
    """

    rate_per_s: float
    burst: int

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0


@dataclass(frozen=True)
class RateLimits:
    """The server's limits: per signing key and per client address.

    Defaults: a key may send 5 signed requests per second with bursts of 30; an address may
    send 50 requests per second with bursts of 200.
    """

    per_key: RateLimit = RateLimit(5.0, 30)
    per_address: RateLimit = RateLimit(50.0, 200)


class TokenBuckets:
    """A bounded table of token buckets sharing one :class:`RateLimit`.

    Args:
        limit: the bucket shape.
        max_buckets: how many buckets are remembered (least recently used forgotten first).
        clock: monotonic seconds (tests inject one).

    Not thread-safe: the server calls it from its event loop only.
    """

    def __init__(self, limit: RateLimit, *, max_buckets: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.max_buckets = max_buckets
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> float:
        """Take one token from ``key``'s bucket.

        Returns:
            0.0 if the request may proceed, else the seconds until a token is available
            (the request must be refused).
        """
        if not self.limit.enabled:
            return 0.0
        now = self.clock()
        tokens, last = self._buckets.pop(key, (float(self.limit.burst), now))
        tokens = min(float(self.limit.burst), tokens + (now - last) * self.limit.rate_per_s)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[key] = (tokens, now)
            wait = (1.0 - tokens) / self.limit.rate_per_s
        while len(self._buckets) > self.max_buckets:
            self._buckets.popitem(last=False)
        return wait

    def __len__(self) -> int:
        return len(self._buckets)


def retry_after_header(wait_s: float) -> str:
    """``Retry-After`` value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(wait_s)))
