"""The Host's seen-nonce table (DESIGN §6): every guest nonce of a ``_session_init`` is
recorded, persisted in ``<home>/seen-nonces.sqlite`` for the lifetime of the invitation it
was used with, so a replayed ``_session_init`` is refused (``handshake-nonce-reused``) —
by this host process, by the same host after a restart, and for any other invitation of
the same home. Rows are purged once their invitation has expired.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

FILE_NAME = "seen-nonces.sqlite"


class SeenNonces:
    """A persistent set of guest nonces.

    Args:
        home: the host's Kith home; the table lives in ``<home>/seen-nonces.sqlite`` (0600).
        clock: wall-clock seconds (Unix time), for expiry.
    """

    def __init__(self, home: Path, *, clock=time.time) -> None:  # type: ignore[no-untyped-def]
        self.path = Path(home) / FILE_NAME
        self._clock = clock
        self._lock = threading.Lock()
        fresh = not self.path.exists()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if fresh:
            os.chmod(self.path, 0o600)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS seen_nonce (nonce TEXT PRIMARY KEY, post_id TEXT NOT NULL,"
                         " expires_at REAL NOT NULL)")
        self.purge()

    def purge(self) -> int:
        """Delete nonces whose invitation expired; returns how many."""
        with self._lock:
            cur = self._db.execute("DELETE FROM seen_nonce WHERE expires_at < ?", (self._clock(),))
            return cur.rowcount

    def record(self, post_id: str, nonce: str, expires_at: float) -> bool:
        """Record ``nonce`` (64 hex, already checked) for ``post_id`` until ``expires_at``
        (Unix seconds). Returns False when it was seen before (a replay). Durable on return
        (one committed INSERT)."""
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO seen_nonce (nonce, post_id, expires_at) VALUES (?, ?, ?)",
                                   (nonce, post_id, float(expires_at)))
            return cur.rowcount == 1

    def __contains__(self, nonce: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM seen_nonce WHERE nonce = ?", (nonce,)).fetchone() is not None

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            self._db.close()
