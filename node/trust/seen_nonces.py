"""The Host's seen-nonce table (DESIGN §6): a replayed ``_session_init`` is refused
(``handshake-nonce-reused``) — by this host process, by the same host after a restart, and
for any other invitation of the same home.

Bounded while the host runs (issue 11), by two rules:

- **Recorded once it matters.** A nonce is *reserved* in memory while its handshake runs
  (so two concurrent ``_session_init`` with one nonce still cannot both pass) and written to
  ``<home>/seen-nonces.sqlite`` only when its session reaches READY — when a session proof
  signed by both sides exists for it. A handshake that never completes leaves no proof to
  replay (its session id binds a fresh host nonce the replayer cannot sign for), so a flood
  of ``_session_init``s that hang up after the proof adds no row; reservations are bounded by
  the host's session slots.
- **Purged by age and count.** A row lives until its invitation expires, at most
  :data:`MAX_AGE_S`; expired rows are purged when the file is first opened (at the first
  handshake, or the first purge) and every :data:`PURGE_INTERVAL_S` while the host runs
  (``serve_host``), and beyond :data:`MAX_ROWS` the rows closest to
  expiry are dropped at once. Forgetting an old nonce only lets its own guest (the QUIC key must match)
  re-send that init, which gets a fresh host nonce and so a different session.

Opened late: building the table only reads the file (:func:`node.common.home.probe_home_db`,
so a damaged one refuses the host's start), and the file is made, opened and purged when
first needed, so a ``kith host`` start refused for any reason leaves it as it was.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from node.common.home import open_home_db

FILE_NAME = "seen-nonces.sqlite"
#: Rows kept at most (about 220 bytes each: ~22 MB); beyond, those closest to expiry go.
MAX_ROWS = 100_000
#: A nonce is remembered until its invitation expires, but never longer than this (s).
MAX_AGE_S = 7 * 24 * 3600.0
#: How often a running host purges expired rows (s).
PURGE_INTERVAL_S = 60.0


#: What the nonce file holds, named when a damaged one is refused (its hint).
_HOLDS = "it holds the handshake nonces already seen (replay protection); a new file starts empty"


class SeenNonces:
    """A persistent set of guest nonces, plus the in-memory reservations of handshakes in
    progress (thread-safe).

    Args:
        home: the host's Kith home; the table lives in ``<home>/seen-nonces.sqlite`` (0600).
        clock: wall-clock seconds (Unix time), for expiry.
        max_rows: the row bound (:data:`MAX_ROWS`).
    """

    def __init__(self, home: Path, *, clock=time.time, max_rows: int = MAX_ROWS) -> None:  # type: ignore[no-untyped-def]
        self.path = Path(home) / FILE_NAME
        self._clock = clock
        self._max_rows = max_rows
        self._lock = threading.Lock()
        self._reserved: set[str] = set()
        # opened when first needed (_open): a refused host start writes nothing
        self._db: sqlite3.Connection | None = None
        self._rows = 0
        from node.common.dbfaults import probe_state_db

        probe_state_db(self.path, _HOLDS)  # a damaged file is refused now, writing nothing

    def _fault(self, exc: BaseException) -> BaseException:
        """The typed refusal of a failed SQLite call on the file (``disk-full``,
        ``io-error``, ``config-invalid``), or ``exc`` itself when it is no fault of the file."""
        from node.common.dbfaults import state_refusal

        return state_refusal(exc, self.path, _HOLDS)

    def _open(self) -> sqlite3.Connection:
        """The database, opened (made, then its expired rows purged) at the first call;
        call with the lock held."""
        if self._db is None:
            try:
                db = open_home_db(self.path)  # 0600, WAL
                db.execute("CREATE TABLE IF NOT EXISTS seen_nonce (nonce TEXT PRIMARY KEY, post_id TEXT NOT NULL,"
                           " expires_at REAL NOT NULL)")
                db.execute("CREATE INDEX IF NOT EXISTS seen_nonce_expiry ON seen_nonce (expires_at)")
                self._rows = db.execute("SELECT count(*) FROM seen_nonce").fetchone()[0]
                self._db = db
                self._purge()
            except (sqlite3.DatabaseError, OSError) as exc:
                self._db = None
                raise self._fault(exc) from None
        return self._db

    def purge(self) -> int:
        """Delete nonces whose invitation expired (or older than :data:`MAX_AGE_S`), and
        the oldest beyond ``max_rows``; returns how many rows were deleted."""
        with self._lock:
            if self._db is None:  # opening purges
                self._open()
                return self._purged
            return self._purge()

    _purged = 0

    def _purge(self) -> int:
        assert self._db is not None
        cur = self._db.execute("DELETE FROM seen_nonce WHERE expires_at < ?", (self._clock(),))
        self._rows = max(0, self._rows - cur.rowcount)
        self._purged = cur.rowcount + self._trim()
        return self._purged

    def _trim(self) -> int:
        if self._rows <= self._max_rows:
            return 0
        # down to 90 % of the bound, so a steady flood trims once per 10 % of it
        drop = self._rows - int(self._max_rows * 0.9)
        assert self._db is not None
        cur = self._db.execute("DELETE FROM seen_nonce WHERE rowid IN "
                               "(SELECT rowid FROM seen_nonce ORDER BY expires_at, rowid LIMIT ?)", (drop,))
        self._rows -= cur.rowcount
        return cur.rowcount

    def reserve(self, nonce: str) -> bool:
        """A ``_session_init`` carries ``nonce`` (64 hex, already checked): False when it was
        recorded before or another handshake holds it now (a replay), else it is held for
        this handshake until :meth:`commit` or :meth:`release`."""
        with self._lock:
            if nonce in self._reserved:
                return False
            if self._open().execute("SELECT 1 FROM seen_nonce WHERE nonce = ?", (nonce,)).fetchone() is not None:
                return False
            self._reserved.add(nonce)
            return True

    def commit(self, post_id: str, nonce: str, expires_at: float) -> bool:
        """The session of a reserved ``nonce`` reached READY: record it for ``post_id``
        until ``expires_at`` (Unix seconds; at most :data:`MAX_AGE_S` from now). Durable on
        return (one committed INSERT). Returns False when it was recorded already."""
        with self._lock:
            self._reserved.discard(nonce)
            return self._insert(post_id, nonce, expires_at)

    def release(self, nonce: str) -> None:
        """The handshake holding ``nonce`` ended without READY: drop the reservation."""
        with self._lock:
            self._reserved.discard(nonce)

    def record(self, post_id: str, nonce: str, expires_at: float) -> bool:
        """Record ``nonce`` at once (no reservation). Returns False when it was seen before."""
        with self._lock:
            if nonce in self._reserved:
                return False
            return self._insert(post_id, nonce, expires_at)

    def _insert(self, post_id: str, nonce: str, expires_at: float) -> bool:
        until = min(float(expires_at), self._clock() + MAX_AGE_S)
        db = self._open()
        try:
            cur = db.execute("INSERT OR IGNORE INTO seen_nonce (nonce, post_id, expires_at) VALUES (?, ?, ?)",
                             (nonce, post_id, until))
        except (sqlite3.DatabaseError, OSError) as exc:  # a full disk is disk-full, never a bare sqlite3 error
            raise self._fault(exc) from None
        if cur.rowcount != 1:
            return False
        self._rows += 1
        self._trim()
        return True

    def __len__(self) -> int:
        """Rows recorded now (reservations not counted)."""
        with self._lock:
            self._open()
            return self._rows

    @property
    def reserved(self) -> int:
        """Handshakes holding a reservation now."""
        with self._lock:
            return len(self._reserved)

    def __contains__(self, nonce: str) -> bool:
        with self._lock:
            return self._open().execute("SELECT 1 FROM seen_nonce WHERE nonce = ?", (nonce,)).fetchone() is not None

    def close(self) -> None:
        """Close the database, if it was opened (idempotent)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
