"""Tables kept in memory that start over when full.

The caches of the answer path (parts, stems, pass queries, decisions, scrubbed texts, ...)
keep what a later call may ask again and hold no order worth an eviction policy: when a
table is full it is emptied and refilled by the calls that follow. Emptying, never
iterating, so another thread reading or writing the table at the same time cannot upset
it (each ``dict`` operation is atomic under the GIL). One place for that rule, so every
such table is bounded the same way.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def keep(table: MutableMapping[K, V], key: K, value: V, limit: int) -> V:
    """Put ``key: value`` into ``table`` and return ``value``. When ``table`` already
    holds ``limit`` entries or more and ``key`` is not one of them, it is emptied first,
    so it never holds more than ``limit`` (``limit`` >= 1)."""
    if len(table) >= limit and key not in table:
        table.clear()
    table[key] = value
    return value


def make_room(table: MutableMapping[Any, Any], incoming: int, limit: int) -> None:
    """Empty ``table`` when ``incoming`` new entries would take it past ``limit``: call
    before adding a batch (``table.update(batch)``)."""
    if len(table) + incoming > limit:
        table.clear()
