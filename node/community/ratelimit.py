"""Rate limits for the community server, shared by every instance (DESIGN §12: per-key
rate limits).

Each bucket holds at most ``burst`` tokens and refills at ``rate_per_s`` tokens per second;
a request takes one token or is refused with the number of seconds until one is available
(the server answers ``429 rate-limited`` with ``Retry-After``). The server keeps two
families of buckets: one per signing key (every signed request, after its signature
verified, so nobody can drain another key's bucket) and one per client address (every
request, before its body is read).

Buckets live in the database (:meth:`node.community.store.CommunityStore.take_token`, GCRA:
one number per bucket, one UPSERT per take), so any number of server processes on one
PostgreSQL database enforce one limit together — a client that spreads its requests over
the instances gets the configured rate, not N times it. The table is bounded: buckets that
are full again are pruned every 30 s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import anyio.to_thread

from node.community.store import CommunityStore


@dataclass(frozen=True)
class RateLimit:
    """One bucket shape: ``rate_per_s`` tokens per second, at most ``burst`` tokens.

    ``rate_per_s`` 0 disables the limit (and its database cost).
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


class SharedBuckets:
    """One family of buckets (``prefix``) in the store, all of one :class:`RateLimit`.

    Args:
        store: the community store (its ``rate_limits`` table).
        limit: the bucket shape.
        prefix: the family's name in the table (``key``, ``addr``).
        clock: Unix seconds (the server's clock; tests inject one).
    """

    def __init__(self, store: CommunityStore, limit: RateLimit, prefix: str, *,
                 clock: Callable[[], float]) -> None:
        self.store = store
        self.limit = limit
        self.prefix = prefix
        self.clock = clock

    async def take(self, key: str) -> float:
        """Take one token from ``key``'s bucket (in a worker thread: it is a database write).

        Returns:
            0.0 if the request may proceed, else the seconds until a token is available
            (the request must be refused).

        Raises:
            CommunityError: 503 ``database-unavailable`` / ``database-timeout``.
        """
        if not self.limit.enabled:
            return 0.0
        return await anyio.to_thread.run_sync(functools.partial(
            self.store.take_token, f"{self.prefix}:{key}", rate_per_s=self.limit.rate_per_s,
            burst=self.limit.burst, now=self.clock()))


def retry_after_header(wait_s: float) -> str:
    """``Retry-After`` value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(wait_s)))
