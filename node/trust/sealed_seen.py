"""The host's durable record of the sealed questions it acted on (issue 43; specs/sealed.md §5).

:class:`node.trust.sealed.SeenRecords` kept in ``<home>/sealed-seen.sqlite`` (0600, WAL), so
that "answered once" holds across a restart: a host killed after leaving an answer but before
its ack takes the question again and refuses it ``sealed-replayed`` (the ack is sent again);
a host killed after sealing its answer but before leaving it leaves *that* answer (kept here,
not searched, charged or audited again); and a question the host answered live (its
``outbox:<question id>`` from the same device key) is not answered again when it is also
taken sealed.

Opened late, like the seen-nonce table: building it only reads the file (a damaged one
refuses the host's start, writing nothing); the file is made and read at the first use.

Bounded like the in-memory set: rows live until their record expires (at most 30 days,
specs/sealed.md §1) and at most ``max_ids`` are kept (the ones closest to expiry go first).
Every change is one autocommitted statement, durable on return against a killed process.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from node.common.home import open_home_db
from node.trust.sealed import SeenRecords

FILE_NAME = "sealed-seen.sqlite"
#: What the file holds, named when a damaged one is refused (its hint).
_HOLDS = ("it holds the sealed questions this host answered (so each is answered once); a new file starts "
          "empty: a question answered before may be answered again")


class DurableSeen(SeenRecords):
    """:class:`SeenRecords` written through to ``<home>/sealed-seen.sqlite``.

    Args:
        home: the host's Kith home. max_ids, max_unsent: as :class:`SeenRecords`.
        clock: Unix seconds, for the rows expired at open.

    Raises:
        ConfigError: ``config-invalid`` (a damaged file, with the ``mv`` that moves it
            aside), ``io-error``, ``disk-full`` — at open and on any later write
            (:func:`node.common.dbfaults.state_refusal`).
    """

    def __init__(self, home: Path, *, max_ids: int = 100_000, max_unsent: int = 2_000,
                 clock: Any = time.time) -> None:
        super().__init__(max_ids=max_ids, max_unsent=max_unsent)
        from node.common.dbfaults import probe_state_db

        self.path = Path(home) / FILE_NAME
        self._clock = clock
        self._db: sqlite3.Connection | None = None
        probe_state_db(self.path, _HOLDS)  # a damaged file is refused now, writing nothing

    def _ready(self) -> None:
        """Open the file at the first use (made 0600, its expired rows removed, the rest read)."""
        if self._db is not None:
            return
        try:
            db = open_home_db(self.path)
            db.execute("CREATE TABLE IF NOT EXISTS sealed_seen (key TEXT PRIMARY KEY, until INTEGER NOT NULL, "
                       "reply TEXT, done INTEGER NOT NULL)")
            db.execute("DELETE FROM sealed_seen WHERE until <= ?", (self._clock(),))
            for key, until, reply, done in db.execute("SELECT key, until, reply, done FROM sealed_seen"):
                self._rows[key] = (int(until), json.loads(reply) if reply else None, bool(done))
        except (sqlite3.DatabaseError, OSError, ValueError) as exc:
            raise self._fault(exc) from None
        self._db = db
        self._bound()

    def _fault(self, exc: BaseException) -> BaseException:
        from node.common.dbfaults import state_refusal

        return state_refusal(exc, self.path, _HOLDS)

    def _put(self, key: str, row: tuple[int, dict[str, Any] | None, bool]) -> None:
        until, reply, done = row
        assert self._db is not None
        try:
            self._db.execute("INSERT INTO sealed_seen (key, until, reply, done) VALUES (?, ?, ?, ?) "
                             "ON CONFLICT (key) DO UPDATE SET until = excluded.until, reply = excluded.reply, "
                             "done = excluded.done",
                             (key, until, None if reply is None else json.dumps(reply, separators=(",", ":")),
                              int(done)))
        except (sqlite3.DatabaseError, OSError) as exc:
            raise self._fault(exc) from None
        super()._put(key, row)

    def _drop(self, keys: list[str]) -> None:
        assert self._db is not None
        try:
            self._db.executemany("DELETE FROM sealed_seen WHERE key = ?", [(k,) for k in keys])
        except (sqlite3.DatabaseError, OSError) as exc:
            raise self._fault(exc) from None
        super()._drop(keys)

    def close(self) -> None:
        """Close the file (the set stays readable in memory)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


__all__ = ["DurableSeen", "FILE_NAME"]
