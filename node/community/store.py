"""The community server's SQLite store (DESIGN §12, §13).

One database file, ``<home>/community/community.sqlite3``, in WAL mode. It holds only
small public records: published invitations, session proofs and the request nonces seen
in the replay window. There is no table for a query, an answer or corpus data — the server
never receives one (DESIGN §12).

Every method opens its own short-lived connection (``busy_timeout`` bounded), runs one
transaction and closes it, so the store is safe to call from many worker threads at once
(the ASGI app calls it through ``anyio.to_thread.run_sync``) and from several processes.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
DB_DIR = "community"
DB_FILE = "community.sqlite3"
#: How long a connection waits for another writer before failing, in seconds.
BUSY_TIMEOUT_S = 10.0

#: The session-proof fields stored (plus ``created_at``); nothing else is kept.
SESSION_FIELDS = ("session_id", "post_id", "protocol_id", "host_public_key",
                  "guest_public_key", "guest_nonce", "host_nonce", "host_signature",
                  "guest_signature")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS invitations (
    post_id         TEXT PRIMARY KEY,
    host_public_key TEXT NOT NULL,
    protocol_id     TEXT NOT NULL,
    document        TEXT NOT NULL,   -- the invitation JSON, with the server's post_id
    expires_unix    REAL NOT NULL,
    created_unix    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS invitations_host ON invitations (host_public_key);
CREATE TABLE IF NOT EXISTS sessions (
    session_id       TEXT PRIMARY KEY,
    post_id          TEXT NOT NULL,
    protocol_id      TEXT NOT NULL,
    host_public_key  TEXT NOT NULL,
    guest_public_key TEXT NOT NULL,
    guest_nonce      TEXT NOT NULL,
    host_nonce       TEXT NOT NULL,
    host_signature   TEXT NOT NULL,
    guest_signature  TEXT NOT NULL,
    created_at       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_post ON sessions (post_id);
CREATE TABLE IF NOT EXISTS request_nonces (
    nonce      TEXT PRIMARY KEY,
    public_key TEXT NOT NULL,
    timestamp  INTEGER NOT NULL,     -- the signed request time (Unix s)
    seen_unix  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS request_nonces_time ON request_nonces (timestamp);
"""


def default_db_path(home: Path) -> Path:
    """``<home>/community/community.sqlite3`` (DESIGN §13)."""
    return home / DB_DIR / DB_FILE


class CommunityStore:
    """Synchronous access to the community database.

    Args:
        db_path: the SQLite file; its folder is created (mode 0700) and the schema applied
            on construction.

    Raises:
        sqlite3.Error: if the file cannot be opened or is not a Kith community database.
    """

    def __init__(self, db_path: Path) -> None:
        self.db_path = Path(db_path)
        self.db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # --- request nonces -------------------------------------------------------------------
    def remember_nonce(self, nonce: str, public_key: str, timestamp: int, *, now: float,
                       window_s: int) -> bool:
        """Record a request nonce; return False if it was already recorded (a replay).

        Also prunes nonces whose signed timestamp is older than ``now - window_s``: a
        request carrying such a timestamp is refused as stale anyway, so forgetting them
        keeps the table bounded by the traffic of one window.

        Args:
            nonce: 64 lowercase hex. timestamp: the signed Unix seconds.
            now: current Unix time (s). window_s: the accepted skew (s).
        """
        with self._write() as conn:
            conn.execute("DELETE FROM request_nonces WHERE timestamp < ?", (int(now) - window_s,))
            cur = conn.execute(
                "INSERT OR IGNORE INTO request_nonces (nonce, public_key, timestamp, seen_unix) "
                "VALUES (?, ?, ?, ?)", (nonce, public_key, timestamp, now))
            return cur.rowcount == 1

    def nonce_count(self) -> int:
        """How many nonces are remembered (for tests and stats)."""
        with self._connect() as conn:
            return conn.execute("SELECT count(*) FROM request_nonces").fetchone()[0]

    # --- invitations ----------------------------------------------------------------------
    def insert_invitation(self, *, post_id: str, host_public_key: str, protocol_id: str,
                          document: dict[str, Any], expires_unix: float, now: float) -> bool:
        """Store an invitation under ``post_id``; return False if that id is taken.

        ``document`` is the full invitation JSON object (already carrying ``post_id``).
        """
        with self._write() as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO invitations (post_id, host_public_key, protocol_id, "
                "document, expires_unix, created_unix) VALUES (?, ?, ?, ?, ?, ?)",
                (post_id, host_public_key, protocol_id,
                 json.dumps(document, ensure_ascii=False, separators=(",", ":")),
                 expires_unix, now))
            return cur.rowcount == 1

    def get_invitation(self, post_id: str) -> tuple[dict[str, Any], float] | None:
        """Return ``(invitation JSON object, expires_at as Unix s)`` or None if unknown."""
        with self._connect() as conn:
            row = conn.execute("SELECT document, expires_unix FROM invitations WHERE post_id = ?",
                               (post_id,)).fetchone()
        if row is None:
            return None
        return json.loads(row[0]), row[1]

    # --- sessions -------------------------------------------------------------------------
    def insert_session(self, record: dict[str, str]) -> bool:
        """Store a verified session proof; return False if ``session_id`` is already stored.

        Args:
            record: the :data:`SESSION_FIELDS` plus ``created_at`` (RFC 3339 UTC); other
                keys are ignored.
        """
        cols = SESSION_FIELDS + ("created_at",)
        with self._write() as conn:
            cur = conn.execute(
                f"INSERT OR IGNORE INTO sessions ({', '.join(cols)}) "
                f"VALUES ({', '.join('?' for _ in cols)})",
                tuple(record[c] for c in cols))
            return cur.rowcount == 1

    def get_session(self, session_id: str) -> dict[str, str] | None:
        """Return the stored session record (fields + ``created_at``) or None."""
        cols = SESSION_FIELDS + ("created_at",)
        with self._connect() as conn:
            row = conn.execute(f"SELECT {', '.join(cols)} FROM sessions WHERE session_id = ?",
                               (session_id,)).fetchone()
        return None if row is None else dict(zip(cols, row))
