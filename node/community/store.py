"""The community server's store: SQLite by default, PostgreSQL for a deployment (DESIGN §12, §13).

It holds only small public records: identities (key + profile), published protocol specs,
invitations (+ their tags), session proofs (+ close status), feedback ratings and the
request nonces seen in the replay window. There is no table or column for a query, an
answer or corpus data — the server never receives one (DESIGN §12; a test checks the
schema).

Both backends run the same SQL (written with ``?`` placeholders; the PostgreSQL backend
rewrites them to ``%s``) behind one interface, :class:`CommunityStore`:

- :class:`SqliteStore` — ``<home>/community/community.sqlite3`` in WAL mode; every method
  opens its own short-lived connection (bounded ``busy_timeout``) and runs one
  transaction, so it is safe from many worker threads and several processes;
- :class:`PostgresStore` — ``postgresql://...`` through psycopg 3 and a
  ``psycopg_pool.ConnectionPool`` (optional extra ``kith-node[postgres]``); a write that
  must count before it inserts (a session proof against ``max_sessions``) locks the
  invitation row with ``SELECT ... FOR UPDATE``.

Open either with :func:`open_store` (a path or a database URL).
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from node.common.errors import CommunityError

SCHEMA_VERSION = 2
DB_DIR = "community"
DB_FILE = "community.sqlite3"
#: How long a connection waits for another writer (SQLite) or for a pooled connection
#: (PostgreSQL) before failing, in seconds.
BUSY_TIMEOUT_S = 10.0

#: The session-proof fields stored (plus ``created_at`` and the close status).
SESSION_FIELDS = ("session_id", "post_id", "protocol_id", "host_public_key",
                  "guest_public_key", "guest_nonce", "host_nonce", "host_signature",
                  "guest_signature")

#: Tables of the schema, for tests and stats; nothing else is ever created.
TABLES = ("meta", "identities", "protocols", "invitations", "invitation_tags", "sessions",
          "feedback", "request_nonces")

# One schema for both dialects; {AUTO_PK}, {REAL} and {TEXT_PK} differ.
_SCHEMA_TEMPLATE = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS identities (
    public_key    TEXT PRIMARY KEY,
    display_name  TEXT NOT NULL,
    about         TEXT NOT NULL,
    created_unix  {REAL} NOT NULL,
    updated_unix  {REAL} NOT NULL
);
CREATE TABLE IF NOT EXISTS protocols (
    protocol_id   TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    spec          TEXT NOT NULL,   -- the spec.json object (a protocol contract, not content)
    published_by  TEXT NOT NULL,
    created_unix  {REAL} NOT NULL
);
CREATE INDEX IF NOT EXISTS protocols_name ON protocols (name);
CREATE TABLE IF NOT EXISTS invitations (
    seq             {AUTO_PK},
    post_id         TEXT NOT NULL UNIQUE,
    host_public_key TEXT NOT NULL,
    protocol_id     TEXT NOT NULL,
    protocol_name   TEXT NOT NULL,
    document        TEXT NOT NULL,   -- the invitation JSON, with the server's post_id
    expires_unix    {REAL} NOT NULL,
    created_unix    {REAL} NOT NULL,
    max_sessions    INTEGER,
    sessions_count  INTEGER NOT NULL DEFAULT 0,
    withdrawn_unix  {REAL}
);
CREATE INDEX IF NOT EXISTS invitations_host ON invitations (host_public_key);
CREATE INDEX IF NOT EXISTS invitations_protocol ON invitations (protocol_id);
CREATE INDEX IF NOT EXISTS invitations_protocol_name ON invitations (protocol_name);
CREATE TABLE IF NOT EXISTS invitation_tags (
    post_id TEXT NOT NULL,
    tag     TEXT NOT NULL,           -- lower-cased
    PRIMARY KEY (post_id, tag)
);
CREATE INDEX IF NOT EXISTS invitation_tags_tag ON invitation_tags (tag);
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
    created_at       TEXT NOT NULL,
    closed_unix      {REAL},
    closed_by        TEXT,
    close_reason     TEXT
);
CREATE INDEX IF NOT EXISTS sessions_post ON sessions (post_id);
CREATE TABLE IF NOT EXISTS feedback (
    session_id         TEXT NOT NULL,
    rater_public_key   TEXT NOT NULL,
    subject_public_key TEXT NOT NULL,
    rater_role         TEXT NOT NULL,   -- host | guest
    rating             INTEGER NOT NULL,
    comment            TEXT,
    created_unix       {REAL} NOT NULL,
    PRIMARY KEY (session_id, rater_public_key)
);
CREATE INDEX IF NOT EXISTS feedback_subject ON feedback (subject_public_key);
CREATE TABLE IF NOT EXISTS request_nonces (
    nonce      TEXT PRIMARY KEY,
    public_key TEXT NOT NULL,
    timestamp  BIGINT NOT NULL,      -- the signed request time (Unix s)
    seen_unix  {REAL} NOT NULL
);
CREATE INDEX IF NOT EXISTS request_nonces_time ON request_nonces (timestamp);
"""


def default_db_path(home: Path) -> Path:
    """``<home>/community/community.sqlite3`` (DESIGN §13)."""
    return home / DB_DIR / DB_FILE


@dataclass(frozen=True)
class InvitationRow:
    """A stored invitation and its server-side state.

    Attributes:
        document: the invitation JSON object (with the server's ``post_id``).
        expires_unix: ``expires_at`` as Unix seconds. created_unix: publish time (s).
        max_sessions: the invitation's ``max_sessions`` or None (unlimited).
        sessions_count: session proofs recorded for this post.
        withdrawn_unix: when the host withdrew it (Unix s) or None.
        host_display_name: the host identity's registered display name, or None.
        seq: the server's publish sequence number (browse cursor).
    """

    document: dict[str, Any]
    expires_unix: float
    created_unix: float
    max_sessions: int | None
    sessions_count: int
    withdrawn_unix: float | None
    host_display_name: str | None = None
    seq: int = 0

    def state(self, now: float) -> str:
        """``withdrawn`` > ``consumed`` > ``expired`` > ``live`` (first that holds)."""
        if self.withdrawn_unix is not None:
            return "withdrawn"
        if self.max_sessions is not None and self.sessions_count >= self.max_sessions:
            return "consumed"
        if self.expires_unix <= now:
            return "expired"
        return "live"


class _Conn(Protocol):  # the part of a DB-API connection the store uses
    def execute(self, sql: str, params: tuple[Any, ...] = ...) -> Any: ...


class CommunityStore:
    """The community database behind one interface; subclasses supply connections.

    All methods are synchronous and thread-safe; the ASGI app calls them through
    ``anyio.to_thread.run_sync``. Times are Unix seconds (float) unless named ``*_at``.
    """

    dialect = "sqlite"
    #: appended to the SELECT that locks an invitation row before counting its sessions
    _for_update = ""

    # --- connections (per backend) ----------------------------------------------------------
    @contextlib.contextmanager
    def _read(self) -> Iterator[_Conn]:
        raise NotImplementedError

    @contextlib.contextmanager
    def _write(self) -> Iterator[_Conn]:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (a no-op for SQLite)."""

    def describe(self) -> str:
        """A one-line description safe to print (no password, no real path for SQLite
        beyond what the operator gave)."""
        raise NotImplementedError

    def _apply_schema(self, conn: _Conn) -> None:
        for statement in self._schema_sql().split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                     "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                     (str(SCHEMA_VERSION),))

    def _schema_sql(self) -> str:
        raise NotImplementedError

    # --- introspection (tests) ------------------------------------------------------------
    def columns(self) -> dict[str, list[str]]:
        """``table → column names`` of the live schema (tests assert what is stored)."""
        raise NotImplementedError

    # --- request nonces -------------------------------------------------------------------
    def remember_nonce(self, nonce: str, public_key: str, timestamp: int, *, now: float,
                       window_s: int) -> bool:
        """Record a request nonce; return False if it was already recorded (a replay).

        Also prunes nonces whose signed timestamp is older than ``now - window_s``: a
        request carrying such a timestamp is refused as stale anyway, so forgetting them
        keeps the table bounded by the traffic of one window.
        """
        with self._write() as conn:
            conn.execute("DELETE FROM request_nonces WHERE timestamp < ?", (int(now) - window_s,))
            cur = conn.execute(
                "INSERT INTO request_nonces (nonce, public_key, timestamp, seen_unix) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (nonce) DO NOTHING",
                (nonce, public_key, timestamp, now))
            return cur.rowcount == 1

    def nonce_count(self) -> int:
        """How many nonces are remembered (for tests and stats)."""
        with self._read() as conn:
            return int(conn.execute("SELECT count(*) FROM request_nonces").fetchone()[0])

    # --- identities -----------------------------------------------------------------------
    def upsert_identity(self, public_key: str, *, display_name: str, about: str,
                        now: float) -> bool:
        """Register ``public_key`` with a profile, or replace its profile.

        Returns:
            True if the identity was created, False if an existing profile was replaced.
        """
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO identities (public_key, display_name, about, created_unix, "
                "updated_unix) VALUES (?, ?, ?, ?, ?) ON CONFLICT (public_key) DO NOTHING",
                (public_key, display_name, about, now, now))
            if cur.rowcount == 1:
                return True
            conn.execute("UPDATE identities SET display_name = ?, about = ?, updated_unix = ? "
                         "WHERE public_key = ?", (display_name, about, now, public_key))
            return False

    def get_identity(self, public_key: str) -> dict[str, Any] | None:
        """Return ``{public_key, display_name, about, created_unix, updated_unix,
        ratings_count, ratings_sum}`` (ratings this key received) or None."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT public_key, display_name, about, created_unix, updated_unix "
                "FROM identities WHERE public_key = ?", (public_key,)).fetchone()
            if row is None:
                return None
            count, total = conn.execute(
                "SELECT count(*), coalesce(sum(rating), 0) FROM feedback "
                "WHERE subject_public_key = ?", (public_key,)).fetchone()
        return {"public_key": row[0], "display_name": row[1], "about": row[2],
                "created_unix": row[3], "updated_unix": row[4],
                "ratings_count": int(count), "ratings_sum": int(total)}

    # --- protocols ------------------------------------------------------------------------
    def insert_protocol(self, *, protocol_id: str, name: str, version: str, spec: dict[str, Any],
                        published_by: str, now: float) -> bool:
        """Store a protocol spec under its ``protocol_id``; False if it was already stored
        (the first publisher is kept: content-addressed, so the spec is the same)."""
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO protocols (protocol_id, name, version, spec, published_by, "
                "created_unix) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (protocol_id) DO NOTHING",
                (protocol_id, name, version, _dumps(spec), published_by, now))
            return cur.rowcount == 1

    def get_protocol(self, protocol_id: str) -> dict[str, Any] | None:
        """Return ``{protocol_id, name, version, spec, published_by, created_unix}`` or None."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT protocol_id, name, version, spec, published_by, created_unix "
                "FROM protocols WHERE protocol_id = ?", (protocol_id,)).fetchone()
        if row is None:
            return None
        return {"protocol_id": row[0], "name": row[1], "version": row[2],
                "spec": json.loads(row[3]), "published_by": row[4], "created_unix": row[5]}

    # --- invitations ----------------------------------------------------------------------
    def insert_invitation(self, *, post_id: str, host_public_key: str, protocol_id: str,
                          protocol_name: str, document: dict[str, Any], expires_unix: float,
                          max_sessions: int | None, tags: list[str], now: float) -> bool:
        """Store an invitation (and its lower-cased tags) under ``post_id``; False if that
        id is taken."""
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO invitations (post_id, host_public_key, protocol_id, protocol_name, "
                "document, expires_unix, created_unix, max_sessions) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (post_id) DO NOTHING",
                (post_id, host_public_key, protocol_id, protocol_name, _dumps(document),
                 expires_unix, now, max_sessions))
            if cur.rowcount != 1:
                return False
            for tag in sorted({t.lower() for t in tags}):
                conn.execute("INSERT INTO invitation_tags (post_id, tag) VALUES (?, ?)",
                             (post_id, tag))
            return True

    _INVITATION_COLS = ("i.document, i.expires_unix, i.created_unix, i.max_sessions, "
                        "i.sessions_count, i.withdrawn_unix, d.display_name, i.seq")

    @staticmethod
    def _invitation_row(row: Any) -> InvitationRow:
        return InvitationRow(document=json.loads(row[0]), expires_unix=row[1],
                             created_unix=row[2], max_sessions=row[3],
                             sessions_count=int(row[4]), withdrawn_unix=row[5],
                             host_display_name=row[6], seq=int(row[7]))

    def get_invitation(self, post_id: str) -> InvitationRow | None:
        """Return the stored invitation with its state fields, or None if unknown."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {self._INVITATION_COLS} FROM invitations i LEFT JOIN identities d "
                "ON d.public_key = i.host_public_key WHERE i.post_id = ?", (post_id,)).fetchone()
        return None if row is None else self._invitation_row(row)

    def browse_invitations(self, *, now: float, limit: int, protocol_id: str | None = None,
                           protocol_name: str | None = None, tag: str | None = None,
                           host_public_key: str | None = None,
                           before_seq: int | None = None) -> list[InvitationRow]:
        """Live invitations (not withdrawn, not consumed, not expired), newest first.

        Args:
            now: Unix seconds. limit: at most this many rows.
            protocol_id / protocol_name / tag (matched lower-cased) / host_public_key:
                optional exact filters. before_seq: return only rows published before this
                sequence number (the cursor of the previous page).
        """
        where = ["i.withdrawn_unix IS NULL", "i.expires_unix > ?",
                 "(i.max_sessions IS NULL OR i.sessions_count < i.max_sessions)"]
        params: list[Any] = [now]
        if protocol_id is not None:
            where.append("i.protocol_id = ?")
            params.append(protocol_id)
        if protocol_name is not None:
            where.append("i.protocol_name = ?")
            params.append(protocol_name)
        if host_public_key is not None:
            where.append("i.host_public_key = ?")
            params.append(host_public_key)
        if tag is not None:
            where.append("EXISTS (SELECT 1 FROM invitation_tags t WHERE t.post_id = i.post_id "
                         "AND t.tag = ?)")
            params.append(tag.lower())
        if before_seq is not None:
            where.append("i.seq < ?")
            params.append(before_seq)
        params.append(limit)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {self._INVITATION_COLS} FROM invitations i LEFT JOIN identities d "
                f"ON d.public_key = i.host_public_key WHERE {' AND '.join(where)} "
                "ORDER BY i.seq DESC LIMIT ?", tuple(params)).fetchall()
        return [self._invitation_row(r) for r in rows]

    def renew_invitation(self, post_id: str, *, document: dict[str, Any],
                         expires_unix: float) -> bool:
        """Replace a live-or-expired invitation's document and expiry (a renew); False if
        it is unknown, withdrawn or consumed (checked again under the write lock)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE invitations SET document = ?, expires_unix = ? WHERE post_id = ? "
                "AND withdrawn_unix IS NULL "
                "AND (max_sessions IS NULL OR sessions_count < max_sessions)",
                (_dumps(document), expires_unix, post_id))
            return cur.rowcount == 1

    def withdraw_invitation(self, post_id: str, *, now: float) -> float | None:
        """Mark an invitation withdrawn (idempotent); return when it was withdrawn, or
        None if ``post_id`` is unknown."""
        with self._write() as conn:
            conn.execute("UPDATE invitations SET withdrawn_unix = ? WHERE post_id = ? "
                         "AND withdrawn_unix IS NULL", (now, post_id))
            row = conn.execute("SELECT withdrawn_unix FROM invitations WHERE post_id = ?",
                               (post_id,)).fetchone()
        return None if row is None else row[0]

    # --- sessions -------------------------------------------------------------------------
    def insert_session(self, record: dict[str, str]) -> str:
        """Store a verified session proof, counting it against its invitation, atomically.

        The invitation row is locked (``BEGIN IMMEDIATE`` / ``FOR UPDATE``) while the proof
        is checked against it, so two proofs racing for the last session of a
        ``max_sessions`` invitation cannot both land.

        Args:
            record: the :data:`SESSION_FIELDS` plus ``created_at`` (RFC 3339 UTC).

        Returns:
            ``"ok"``; ``"duplicate"`` (that ``session_id`` is stored); ``"no-invitation"``;
            ``"withdrawn"``; ``"consumed"`` (``max_sessions`` proofs already recorded).
        """
        cols = SESSION_FIELDS + ("created_at",)
        with self._write() as conn:
            inv = conn.execute(
                "SELECT max_sessions, sessions_count, withdrawn_unix FROM invitations "
                f"WHERE post_id = ?{self._for_update}", (record["post_id"],)).fetchone()
            if inv is None:
                return "no-invitation"
            if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?",
                            (record["session_id"],)).fetchone() is not None:
                return "duplicate"
            max_sessions, count, withdrawn = inv
            if withdrawn is not None:
                return "withdrawn"
            if max_sessions is not None and count >= max_sessions:
                return "consumed"
            conn.execute(
                f"INSERT INTO sessions ({', '.join(cols)}) "
                f"VALUES ({', '.join('?' for _ in cols)})", tuple(record[c] for c in cols))
            conn.execute("UPDATE invitations SET sessions_count = sessions_count + 1 "
                         "WHERE post_id = ?", (record["post_id"],))
            return "ok"

    _SESSION_COLS = SESSION_FIELDS + ("created_at", "closed_unix", "closed_by", "close_reason")

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        """Return the stored session (proof fields, ``created_at``, ``closed_unix``,
        ``closed_by``, ``close_reason``) or None."""
        with self._read() as conn:
            row = conn.execute(f"SELECT {', '.join(self._SESSION_COLS)} FROM sessions "
                               "WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else dict(zip(self._SESSION_COLS, row))

    def close_session(self, session_id: str, *, closed_by: str, reason: str,
                      now: float) -> bool:
        """Mark an open session closed; False if it was already closed (or is unknown)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE sessions SET closed_unix = ?, closed_by = ?, close_reason = ? "
                "WHERE session_id = ? AND closed_unix IS NULL",
                (now, closed_by, reason, session_id))
            return cur.rowcount == 1

    # --- feedback -------------------------------------------------------------------------
    def insert_feedback(self, *, session_id: str, rater_public_key: str,
                        subject_public_key: str, rater_role: str, rating: int,
                        comment: str | None, now: float) -> bool:
        """Store one participant's rating of a session; False if that participant already
        rated it (one rating per participant per session, DESIGN §12)."""
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO feedback (session_id, rater_public_key, subject_public_key, "
                "rater_role, rating, comment, created_unix) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (session_id, rater_public_key) DO NOTHING",
                (session_id, rater_public_key, subject_public_key, rater_role, rating, comment,
                 now))
            return cur.rowcount == 1

    def list_feedback(self, session_id: str) -> list[dict[str, Any]]:
        """The ratings of one session, oldest first: ``{rater_public_key,
        subject_public_key, rater_role, rating, comment, created_unix}``."""
        cols = ("rater_public_key", "subject_public_key", "rater_role", "rating", "comment",
                "created_unix")
        with self._read() as conn:
            rows = conn.execute(f"SELECT {', '.join(cols)} FROM feedback WHERE session_id = ? "
                                "ORDER BY created_unix, rater_public_key",
                                (session_id,)).fetchall()
        return [dict(zip(cols, r)) for r in rows]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# --- SQLite ---------------------------------------------------------------------------------
class SqliteStore(CommunityStore):
    """The default store: one SQLite file in WAL mode.

    Args:
        db_path: the SQLite file; its folder is created (mode 0700) and the schema applied
            (or a first-cut schema version 1 migrated) on construction.

    Raises:
        CommunityError: ``database-unavailable`` if the file cannot be opened or is not a
            Kith community database.
    """

    dialect = "sqlite"

    def __init__(self, db_path: Path) -> None:
        self.db_path = Path(db_path)
        try:
            self.db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with self._connect() as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("BEGIN IMMEDIATE")
                self._migrate_v1(conn)
                self._apply_schema(conn)
                conn.execute("COMMIT")
        except (sqlite3.Error, OSError):
            raise CommunityError("database-unavailable",
                                 f"cannot open the community database {self.db_path.name} "
                                 "(unreadable, locked or not a Kith community database)",
                                 status=0) from None

    def describe(self) -> str:
        return f"SQLite {self.db_path}"

    def _schema_sql(self) -> str:
        return _SCHEMA_TEMPLATE.format(AUTO_PK="INTEGER PRIMARY KEY AUTOINCREMENT", REAL="REAL")

    @staticmethod
    def _migrate_v1(conn: sqlite3.Connection) -> None:
        """Bring a first-cut (schema version 1) database to version 2, keeping its rows."""
        cols = [r[1] for r in conn.execute("PRAGMA table_info(invitations)")]
        if not cols or "seq" in cols:
            return
        conn.execute("ALTER TABLE invitations RENAME TO invitations_v1")
        conn.execute("DROP INDEX IF EXISTS invitations_host")
        for statement in SqliteStore._schema_sql(None).split(";"):  # type: ignore[arg-type]
            if "invitations (" in statement and "CREATE TABLE" in statement:
                conn.execute(statement)
        conn.execute(
            "INSERT INTO invitations (post_id, host_public_key, protocol_id, protocol_name, "
            "document, expires_unix, created_unix) SELECT post_id, host_public_key, protocol_id, "
            "coalesce(json_extract(document, '$.protocol.name'), ''), document, expires_unix, "
            "created_unix FROM invitations_v1 ORDER BY created_unix")
        conn.execute("DROP TABLE invitations_v1")
        session_cols = [r[1] for r in conn.execute("PRAGMA table_info(sessions)")]
        if session_cols and "closed_unix" not in session_cols:
            for col in ("closed_unix REAL", "closed_by TEXT", "close_reason TEXT"):
                conn.execute(f"ALTER TABLE sessions ADD COLUMN {col}")
        conn.execute("UPDATE invitations SET sessions_count = (SELECT count(*) FROM sessions s "
                     "WHERE s.post_id = invitations.post_id)")

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as conn:
            yield conn

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

    def columns(self) -> dict[str, list[str]]:
        with self._read() as conn:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%'")]
            return {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}


# --- PostgreSQL -----------------------------------------------------------------------------
class _PgConn:
    """Adapts a psycopg connection to the ``?`` placeholders the shared SQL uses."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self._conn.execute(sql.replace("?", "%s"), params)


class PostgresStore(CommunityStore):
    """The deployment store: PostgreSQL through psycopg 3 and a connection pool.

    Args:
        url: ``postgresql://user:password@host:port/dbname`` (or ``postgres://``; libpq
            query options such as ``?host=/run/postgresql`` work).
        min_size / max_size: pooled connections.
        connect_timeout_s: how long to keep trying to connect at start, in seconds.

    Raises:
        ConfigError: ``database-driver-missing`` when psycopg is not installed (install
            ``kith-node[postgres]``).
        CommunityError: ``database-unavailable`` when no connection can be made within
            :data:`BUSY_TIMEOUT_S` (the message never contains the password or host).
    """

    dialect = "postgresql"
    _for_update = " FOR UPDATE"

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10,
                 connect_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        try:
            import psycopg  # noqa: F401
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise CommunityError("database-driver-missing",
                                 "a postgresql:// database needs psycopg 3") from None
        self._display = display_database_url(url)
        self._pool = ConnectionPool(url, min_size=min_size, max_size=max_size, open=False,
                                    timeout=BUSY_TIMEOUT_S, name="kith-community")
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
            with self._write() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(7464327)")  # one migrator at a time
                self._apply_schema(conn)
        except Exception:
            self._pool.close()
            raise CommunityError("database-unavailable",
                                 f"cannot use the PostgreSQL database {self._display}",
                                 status=0) from None

    def describe(self) -> str:
        return f"PostgreSQL {self._display}"

    def _schema_sql(self) -> str:
        return _SCHEMA_TEMPLATE.format(
            AUTO_PK="BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            REAL="DOUBLE PRECISION")

    @contextlib.contextmanager
    def _read(self) -> Iterator[_PgConn]:
        with self._pool.connection() as conn:
            yield _PgConn(conn)

    @contextlib.contextmanager
    def _write(self) -> Iterator[_PgConn]:
        """One transaction per call: the pool commits on success and rolls back on error."""
        with self._pool.connection() as conn:
            yield _PgConn(conn)

    def close(self) -> None:
        self._pool.close()

    def columns(self) -> dict[str, list[str]]:
        with self._read() as conn:
            rows = conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
            ).fetchall()
        out: dict[str, list[str]] = {}
        for table, column in rows:
            out.setdefault(table, []).append(column)
        return out


# --- opening --------------------------------------------------------------------------------
_PG_SCHEMES = ("postgresql", "postgres")


def display_database_url(url: str) -> str:
    """The database URL without a password (safe to print): ``postgresql://user@host/db``."""
    try:
        parts = urlsplit(url)
        netloc = parts.hostname or ""
        if parts.port is not None:
            netloc = f"{netloc}:{parts.port}"
        if parts.username:
            netloc = f"{parts.username}@{netloc}"
    except ValueError:
        return "(unparsable URL)"
    return f"{parts.scheme}://{netloc}{parts.path}"


def open_store(target: Path | str) -> CommunityStore:
    """Open the store named by a path or a database URL.

    Args:
        target: a filesystem path (SQLite), ``sqlite:///ABSOLUTE/PATH`` or
            ``postgresql://...`` / ``postgres://...``.

    Raises:
        UsageError: ``database-url-invalid`` for any other URL scheme or an empty path.
        ConfigError: ``database-driver-missing`` (PostgreSQL without psycopg).
        CommunityError: ``database-unavailable``.
    """
    if isinstance(target, Path):
        return SqliteStore(target)
    scheme = target.split(":", 1)[0].lower() if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:",
                                                          target) else ""
    if scheme in _PG_SCHEMES:
        return PostgresStore(target)
    if scheme == "sqlite":
        path = target[len("sqlite://"):] if target.startswith("sqlite://") else ""
        if not path.startswith("/") or path == "/":
            raise CommunityError("database-url-invalid",
                                 "a SQLite database URL is sqlite:///ABSOLUTE/PATH", exit_code=2)
        return SqliteStore(Path(path))
    raise CommunityError("database-url-invalid",
                         "the database URL must start with postgresql://, postgres:// or sqlite:///",
                         exit_code=2)
