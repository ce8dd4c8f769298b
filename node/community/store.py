"""The community server's store: SQLite by default, PostgreSQL for a deployment (DESIGN §12, §13).

It holds only small public records: identities (key + profile), published protocol specs,
invitations (+ their tags), session proofs (+ close status), feedback ratings and the
request nonces seen in the replay window — and, with the mailbox on, opaque sealed records
(specs/sealed.md): keys, times, a size bucket and ciphertext. There is no table or column
for a plaintext query, answer or corpus data — the server never sees one (DESIGN §12; a
test checks the schema, another greps the database file for a sealed question).

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
import fcntl
import json
import logging
import math
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from node.common.errors import CommunityError, UsageError
from node.community.defaults import DEFAULT_POOL_SIZE  # there, so --help shows it without this module

#: The schema this code reads and writes; :data:`MIGRATIONS` lead up to it.
SCHEMA_VERSION = 8
DB_DIR = "community"
DB_FILE = "community.sqlite3"
#: How long a connection waits for another writer (SQLite) or for a pooled connection
#: (PostgreSQL) before failing, in seconds.
BUSY_TIMEOUT_S = 10.0

#: The session-proof fields stored (plus ``created_at`` and the close status).
SESSION_FIELDS = ("session_id", "post_id", "protocol_id", "host_public_key",
                  "guest_public_key", "guest_nonce", "host_nonce", "host_signature",
                  "guest_signature")

#: Longest a single SQL statement may run before it is cancelled (a ``503
#: database-timeout`` answer), in seconds; ``statement_timeout`` on PostgreSQL, a progress
#: handler on SQLite.
STATEMENT_TIMEOUT_S = 5.0
#: How often a store forgets refilled rate-limit buckets, in seconds (one DELETE each time).
RATE_PRUNE_EVERY_S = 30.0

#: Tables of the schema, for tests and stats; nothing else is ever created.
TABLES = ("meta", "schema_migrations", "identities", "identity_skeletons", "protocols",
          "invitations", "invitation_tags", "sessions", "feedback", "request_nonces",
          "rate_limits", "revocations", "device_cards", "mailbox", "mailbox_recipients")
#: The mailbox's tables (specs/community-api.md, "Mailbox"): sealed bytes and metadata only.
MAILBOX_TABLES = ("mailbox", "mailbox_recipients")

# Schema version 2 (the base every migration starts from), one text for both dialects;
# {AUTO_PK} and {REAL} differ.
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

# Version 4: persons' device revocation lists (specs/peers.md §10): the newest list of each
# person key (signed by it, at most 4 KiB; the server checks it like every node does).
_MIGRATION_4 = """
CREATE TABLE IF NOT EXISTS revocations (
    person_key   TEXT PRIMARY KEY,
    seq          BIGINT NOT NULL,
    list         TEXT NOT NULL,          -- the signed list (compact JSON)
    published_by TEXT NOT NULL,          -- the key that signed the request
    updated_unix {REAL} NOT NULL
);
"""

# Version 3: stateless instances. Liveness leases on invitations (NULL: a post published
# before leases, listed until it expires), rate-limit buckets shared by every instance
# (GCRA: one "theoretical arrival time" per bucket), and the look-alike skeletons of display
# names (one owner per skeleton, enforced by the primary key).
_MIGRATION_3 = """
ALTER TABLE invitations ADD COLUMN lease_unix {REAL};
CREATE TABLE IF NOT EXISTS rate_limits (
    bucket  TEXT PRIMARY KEY,        -- "key:<hex>" or "addr:<ip>"
    tat     {REAL} NOT NULL,         -- when the bucket is full again (Unix s)
    granted INTEGER NOT NULL         -- did the last take succeed (1) or not (0)
);
CREATE TABLE IF NOT EXISTS identity_skeletons (
    skeleton   TEXT PRIMARY KEY,
    public_key TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS identity_skeletons_key ON identity_skeletons (public_key)
"""

_SCHEMA_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version      INTEGER PRIMARY KEY,
    name         TEXT NOT NULL,
    applied_unix {REAL} NOT NULL
)
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
        lease_unix: until when the host's liveness lease holds (Unix s), or None for a
            post published before leases existed (its liveness is unknown).
    """

    document: dict[str, Any]
    expires_unix: float
    created_unix: float
    max_sessions: int | None
    sessions_count: int
    withdrawn_unix: float | None
    host_display_name: str | None = None
    seq: int = 0
    lease_unix: float | None = None

    def state(self, now: float) -> str:
        """``withdrawn`` > ``consumed`` > ``expired`` > ``offline`` (the liveness lease
        lapsed) > ``live`` (first that holds)."""
        if self.withdrawn_unix is not None:
            return "withdrawn"
        if self.max_sessions is not None and self.sessions_count >= self.max_sessions:
            return "consumed"
        if self.expires_unix <= now:
            return "expired"
        if self.lease_unix is not None and self.lease_unix <= now:
            return "offline"
        return "live"


class _Conn(Protocol):  # the part of a DB-API connection the store uses
    def execute(self, sql: str, params: tuple[Any, ...] = ...) -> Any: ...


@dataclass(frozen=True)
class MailboxLimits:
    """The mailbox's bounds (``kith community serve --mailbox``; specs/community-api.md).

    Attributes:
        per_sender: records one sender key may have waiting. per_recipient: records waiting
            for one recipient key. max_records: records in total. max_bytes: the sum of
            their size buckets, in bytes.
    """

    per_sender: int = 200
    per_recipient: int = 2000
    max_records: int = 100_000
    max_bytes: int = 512 << 20


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

    # --- schema versions and migrations ----------------------------------------------------
    _greatest = "max"  # the two-argument maximum: max() in SQLite, greatest() in PostgreSQL

    def _sql(self, template: str) -> str:
        """A dialect's text of a schema template ({AUTO_PK}, {REAL})."""
        raise NotImplementedError

    def _has_table(self, conn: _Conn, name: str) -> bool:
        raise NotImplementedError

    def _has_column(self, conn: _Conn, table: str, column: str) -> bool:
        raise NotImplementedError

    def _has_any_table(self, conn: _Conn) -> bool:
        """Whether the database (PostgreSQL: its current schema) holds any table."""
        raise NotImplementedError

    def _run_script(self, conn: _Conn, template: str) -> None:
        for statement in self._sql(template).split(";"):
            if statement.strip():
                conn.execute(statement)

    def _version(self, conn: _Conn) -> int:
        """The schema version of the open database: the highest row of
        ``schema_migrations``, else ``meta.schema_version`` (versions 1-2 kept it there),
        else 1 for a first-cut file with tables but no ``meta``, else 0 (empty)."""
        if self._has_table(conn, "schema_migrations"):
            row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
            if row is not None and row[0] is not None:
                return int(row[0])
        if self._has_table(conn, "meta"):
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is not None and str(row[0]).isdigit():
                return int(row[0])
        return 1 if self._has_table(conn, "invitations") else 0

    def schema_version(self) -> int:
        """The database's schema version (0: empty)."""
        with self._read() as conn:
            return self._version(conn)

    def _migrate(self, conn: _Conn, *, now: float) -> list[int]:
        """Apply every migration the open database lacks, in order, in the caller's
        transaction (all or nothing). Returns the versions applied."""
        version = self._version(conn)
        if version > SCHEMA_VERSION:
            raise _schema_newer(version)
        applied = []
        for target, name, step in MIGRATIONS:
            if version < target:
                step(self, conn, version)
                self._run_script(conn, _SCHEMA_MIGRATIONS_TABLE)
                conn.execute("INSERT INTO schema_migrations (version, name, applied_unix) "
                             "VALUES (?, ?, ?) ON CONFLICT (version) DO NOTHING",
                             (target, name, now))
                conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                             "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                             (str(target),))
                applied.append(target)
                version = target
        return applied

    def _open_schema(self, conn: _Conn, *, migrate: bool) -> list[int]:
        """At open: create an empty database at :data:`SCHEMA_VERSION`; with ``migrate``
        bring an older one forward; otherwise refuse an older or a newer one.

        Raises:
            CommunityError: ``database-schema-newer``, ``database-schema-old`` (without
                ``migrate``), ``database-foreign`` (tables but no Kith schema version:
                another application's database, never written into).
        """
        version = self._version(conn)
        if version == SCHEMA_VERSION:
            return []
        if version > SCHEMA_VERSION:
            raise _schema_newer(version)
        if version == 0 and self._has_any_table(conn):
            raise CommunityError("database-foreign", f"{self.describe()} holds tables but no Kith community "
                                 "schema version: not a Kith community database", status=0)
        if version == 0 or migrate:
            return self._migrate(conn, now=time.time())
        raise CommunityError(
            "database-schema-old",
            f"the community database is at schema version {version}; this server needs "
            f"version {SCHEMA_VERSION}: stop the servers, back it up, then run "
            "`kith community migrate` with the same --database-url", status=0)

    # --- introspection (tests) ------------------------------------------------------------
    def columns(self) -> dict[str, list[str]]:
        """``table → column names`` of the live schema (tests assert what is stored)."""
        raise NotImplementedError

    def column_types(self, table: str) -> dict[str, str]:
        """``column → declared type`` (lower case: ``text``, ``blob``/``bytea``, ``integer``,
        ``bigint``, ``real``/``double precision``) of one table (tests assert what the
        mailbox can hold)."""
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

    # --- rate limits --------------------------------------------------------------------
    def take_token(self, bucket: str, *, rate_per_s: float, burst: int, now: float) -> float:
        """Take one token from a bucket shared by every server instance on this database.

        The bucket is GCRA (a token bucket kept as one number): ``tat`` is when the bucket
        would be full again; a take moves it ``1/rate_per_s`` later and is granted while
        that stays at most ``burst/rate_per_s`` after ``now``. One UPSERT per call (the row
        lock serialises instances); every :data:`RATE_PRUNE_EVERY_S` seconds one DELETE
        forgets buckets that are full again, so the table holds only buckets used within
        their refill time.

        Args:
            bucket: the bucket's name (``key:<hex>``, ``addr:<ip>``).
            rate_per_s: tokens per second (> 0). burst: bucket size (>= 1).
            now: Unix seconds.

        Returns:
            0.0 if the token was taken, else the seconds until one is available.

        Raises:
            CommunityError: ``database-unavailable`` / ``database-timeout`` (503).
        """
        interval = 1.0 / rate_per_s
        tolerance = burst * interval + 1e-9
        g = self._greatest
        with self._write() as conn:
            if now - self._last_rate_prune >= RATE_PRUNE_EVERY_S:
                self._last_rate_prune = now
                conn.execute("DELETE FROM rate_limits WHERE tat < ?", (now,))
            row = conn.execute(
                "INSERT INTO rate_limits (bucket, tat, granted) VALUES (?, ?, 1) "
                "ON CONFLICT (bucket) DO UPDATE SET "
                f"granted = CASE WHEN {g}(rate_limits.tat, ?) + ? - ? <= ? THEN 1 ELSE 0 END, "
                f"tat = CASE WHEN {g}(rate_limits.tat, ?) + ? - ? <= ? "
                f"THEN {g}(rate_limits.tat, ?) + ? ELSE rate_limits.tat END "
                "RETURNING granted, tat",
                (bucket, now + interval, now, interval, now, tolerance,
                 now, interval, now, tolerance, now, interval)).fetchone()
        granted, tat = int(row[0]), float(row[1])
        if granted:
            return 0.0
        return max(1e-3, max(tat, now) + interval - now - tolerance)

    _last_rate_prune = 0.0

    # --- identities -----------------------------------------------------------------------
    def upsert_identity(self, public_key: str, *, display_name: str, about: str,
                        now: float, skeletons: frozenset[str] = frozenset()) -> bool | None:
        """Register ``public_key`` with a profile, or replace its profile.

        Args:
            skeletons: the look-alike forms of ``display_name``
                (:func:`node.trust.peers.name_skeletons`); each may belong to one key only.

        Returns:
            True if the identity was created, False if an existing profile was replaced,
            None if another key's display name looks like this one (nothing stored).
        """
        try:
            with self._write() as conn:
                return self._upsert_identity(conn, public_key, display_name, about, now,
                                             skeletons)
        except _NameTaken:
            return None

    @staticmethod
    def _upsert_identity(conn: _Conn, public_key: str, display_name: str, about: str,
                         now: float, skeletons: frozenset[str]) -> bool:
        conn.execute("DELETE FROM identity_skeletons WHERE public_key = ?", (public_key,))
        for skeleton in sorted(skeletons):
            # the primary key decides between racing instances: the loser's insert does
            # nothing, it sees the other owner and its whole transaction rolls back
            conn.execute("INSERT INTO identity_skeletons (skeleton, public_key) VALUES (?, ?) "
                         "ON CONFLICT (skeleton) DO NOTHING", (skeleton, public_key))
            owner = conn.execute("SELECT public_key FROM identity_skeletons WHERE skeleton = ?",
                                 (skeleton,)).fetchone()[0]
            if owner != public_key:
                raise _NameTaken
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

    # --- revocation lists (specs/peers.md §10) ----------------------------------------------
    def put_revocation(self, person_key: str, seq: int, doc: dict[str, Any], *, published_by: str,
                       now: float) -> str:
        """Keep ``doc`` (a verified revocation list of ``person_key``) when its ``seq`` is
        larger than the one kept. Returns ``new``, ``same`` (that seq is kept) or ``stale``
        (a larger seq is kept; nothing changes)."""
        with self._write() as conn:
            kept = _kept_order(conn, "revocations", "person_key", person_key, seq)
            if kept in ("stale", "same"):
                return kept
            if kept == "older":
                conn.execute("UPDATE revocations SET seq = ?, list = ?, published_by = ?, updated_unix = ? "
                             "WHERE person_key = ? AND seq < ?",
                             (seq, _dumps(doc), published_by, now, person_key, seq))
                return "new"
            conn.execute("INSERT INTO revocations (person_key, seq, list, published_by, updated_unix) "
                         "VALUES (?, ?, ?, ?, ?) ON CONFLICT (person_key) DO NOTHING",
                         (person_key, seq, _dumps(doc), published_by, now))
            return "new"

    def get_revocation(self, person_key: str) -> dict[str, Any] | None:
        """The newest revocation list kept for ``person_key`` (wire shape), or None."""
        with self._read() as conn:
            row = conn.execute("SELECT list FROM revocations WHERE person_key = ?", (person_key,)).fetchone()
        return None if row is None else json.loads(row[0])

    # --- device cards (specs/peers.md §13) ---------------------------------------------------
    #: Most devices of one person whose cards are kept (the oldest updated goes first).
    MAX_CARDS_PER_PERSON = 16

    def put_card(self, device_key: str, person_key: str, seq: int, doc: dict[str, Any], *,
                 expires_unix: float, now: float) -> str:
        """Keep ``doc`` (a verified card of ``device_key``, bound by ``person_key``) when its
        ``seq`` is larger than the one kept for that device. Returns ``new``, ``same`` (that
        seq is kept) or ``stale`` (a larger seq is kept; nothing changes). At most
        :attr:`MAX_CARDS_PER_PERSON` devices per person are kept."""
        with self._write() as conn:
            kept = _kept_order(conn, "device_cards", "device_key", device_key, seq)
            if kept in ("stale", "same"):
                return kept
            if kept == "older":
                conn.execute("UPDATE device_cards SET person_key = ?, seq = ?, card = ?, expires_unix = ?, "
                             "updated_unix = ? WHERE device_key = ? AND seq < ?",
                             (person_key, seq, _dumps(doc), expires_unix, now, device_key, seq))
                return "new"
            conn.execute("INSERT INTO device_cards (device_key, person_key, seq, card, expires_unix, updated_unix) "
                         "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (device_key) DO NOTHING",
                         (device_key, person_key, seq, _dumps(doc), expires_unix, now))
            extra = conn.execute("SELECT device_key FROM device_cards WHERE person_key = ? "
                                 "ORDER BY updated_unix DESC, device_key", (person_key,)).fetchall()
            for (old,) in extra[self.MAX_CARDS_PER_PERSON:]:
                conn.execute("DELETE FROM device_cards WHERE device_key = ?", (old,))
            return "new"

    def get_cards(self, person_key: str, *, now: float) -> list[dict[str, Any]]:
        """The cards kept for ``person_key`` whose invitation has not expired, newest first."""
        with self._read() as conn:
            rows = conn.execute("SELECT card FROM device_cards WHERE person_key = ? AND expires_unix > ? "
                                "ORDER BY updated_unix DESC, device_key", (person_key, now)).fetchall()
        return [json.loads(r[0]) for r in rows]

    # --- the mailbox of sealed records (specs/sealed.md, specs/community-api.md "Mailbox") ----
    def _mailbox_lock(self, conn: _Conn) -> None:
        """Serialise mailbox writes across instances, so the bounds hold exactly (SQLite's
        ``BEGIN IMMEDIATE`` already does; PostgreSQL takes a transaction advisory lock)."""

    def _mailbox_totals(self, conn: _Conn) -> tuple[int, int]:
        """``(records, bytes)`` kept, from two ``meta`` rows kept exact under the mailbox
        lock (counted from the tables once when absent), so a put costs the same at 10 or
        100,000 records."""
        rows = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('mailbox_records', 'mailbox_bytes')")
                    .fetchall())
        if len(rows) == 2:
            return int(rows["mailbox_records"]), int(rows["mailbox_bytes"])
        count, total = conn.execute("SELECT count(*), coalesce(sum(bucket), 0) FROM mailbox").fetchone()
        self._set_mailbox_totals(conn, int(count), int(total))
        return int(count), int(total)

    @staticmethod
    def _set_mailbox_totals(conn: _Conn, count: int, total: int) -> None:
        for key, value in (("mailbox_records", count), ("mailbox_bytes", total)):
            conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, str(value)))

    @staticmethod
    def _next_stored(conn: _Conn, now: float) -> float:
        """The ``stored_unix`` of a record put now: ``now``, or just after the last record's
        when that is later (the server's clock stepped back, or two puts in one tick), kept in
        the ``meta`` row ``mailbox_last_stored`` under the mailbox lock.

        Stored times only grow, so a record put after a take is always after that take's
        cursor (``(stored_unix, sender, id)``, :meth:`take_sealed`): a holder that pages on
        with ``after`` never passes over a newer record. Called only under the mailbox lock.
        """
        row = conn.execute("SELECT value FROM meta WHERE key = 'mailbox_last_stored'").fetchone()
        if row is None:  # a store from before this row: the newest record kept, once
            row = conn.execute("SELECT max(stored_unix) FROM mailbox").fetchone()
        last = float(row[0]) if row is not None and row[0] is not None else float("-inf")
        stored = float(now) if now > last else math.nextafter(last, math.inf)
        conn.execute("INSERT INTO meta (key, value) VALUES ('mailbox_last_stored', ?) "
                     "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (repr(stored),))
        return stored

    def _remove_sealed(self, conn: _Conn, sender: str, record_id: str) -> int:
        """Delete one record and its recipients, keeping the totals; returns 1 or 0."""
        key = (sender, record_id)
        row = conn.execute("SELECT bucket FROM mailbox WHERE sender_key = ? AND record_id = ?", key).fetchone()
        conn.execute("DELETE FROM mailbox_recipients WHERE sender_key = ? AND record_id = ?", key)
        if row is None:
            return 0
        conn.execute("DELETE FROM mailbox WHERE sender_key = ? AND record_id = ?", key)
        count, total = self._mailbox_totals(conn)
        self._set_mailbox_totals(conn, max(0, count - 1), max(0, total - int(row[0])))
        return 1

    def _prune_mailbox(self, conn: _Conn, now: float) -> int:
        gone = conn.execute("SELECT sender_key, record_id FROM mailbox WHERE expires_unix <= ? LIMIT 1000",
                            (now,)).fetchall()
        for sender, record_id in gone:
            self._remove_sealed(conn, sender, record_id)
        return len(gone)

    @staticmethod
    def _owed_to(conn: _Conn, sender: str, recipients: list[str]) -> str | None:
        """The asker a record from ``sender`` replies to: the lowest recipient key that has a
        record waiting here for ``sender`` (a host leaves its answer before it acks the
        question), else None."""
        marks = ", ".join("?" for _ in recipients)
        row = conn.execute(f"SELECT sender_key FROM mailbox_recipients WHERE recipient_key = ? "
                           f"AND sender_key IN ({marks}) ORDER BY sender_key LIMIT 1",
                           (sender, *recipients)).fetchone()
        return None if row is None else str(row[0])

    @staticmethod
    def _refuses_sealed(conn: _Conn, recipients: list[str], now: float) -> bool:
        """True when this server keeps a live card of at least one recipient and none of the
        recipients' kept cards names a mailbox (card format 2, specs/sealed.md §6): the host
        did not opt in to sealed questions. Recipients without a card here are not judged."""
        marks = ", ".join("?" for _ in recipients)
        rows = conn.execute(f"SELECT card FROM device_cards WHERE device_key IN ({marks}) AND expires_unix > ?",
                            (*recipients, now)).fetchall()
        if not rows:
            return False
        return not any(isinstance(json.loads(r[0]).get("mailboxes"), list) for r in rows)

    def put_sealed(self, *, record_id: str, sender: str, recipients: dict[str, bytes], bucket: int, box: bytes,
                   created_unix: float, expires_unix: float, limits: "MailboxLimits", now: float) -> str:
        """Keep one sealed record (already shape-checked by
        :func:`node.trust.sealed.check_envelope`), once per ``(sender, record_id)``: a record
        of another sender under the same id is another record (a squat fills only its
        sender's own space, issue 43).

        Expired records are removed first (at most 1000 per call). Then, under one lock: a
        record is a **reply** when one of its recipients has a record waiting here for its
        sender (the question a host answers stays until the host acks it, after the answer
        is left); a reply counts against the bound of the asker it goes to — ``per_sender``
        records from this sender owed to that asker — so one asker's many questions cannot
        crowd out the answers owed to others; any other record counts against its sender's
        ``per_sender`` and is refused when this server keeps a card of a recipient and no
        recipient's card opts in (``mailboxes``, specs/sealed.md §6). Then each recipient's
        bound, the total count and bytes.

        Args:
            recipients: recipient key → its wrapped content key (80 bytes).
            limits: the :class:`MailboxLimits`. now: Unix seconds.

        Returns:
            ``new`` (kept) or ``same`` (this very record is kept already: nothing changes).

        Raises:
            CommunityError: ``mailbox-conflict`` (409: another record of this sender under
                that id), ``mailbox-not-accepted`` (403: no recipient's card here opts in),
                ``mailbox-sender-full`` (429), ``mailbox-recipient-full`` (507),
                ``mailbox-full`` (507), ``database-unavailable`` / ``database-timeout`` (503).
        """
        keys = sorted(recipients)
        with self._write() as conn:
            self._mailbox_lock(conn)
            self._prune_mailbox(conn, now)
            row = conn.execute("SELECT sealed_box FROM mailbox WHERE sender_key = ? AND record_id = ?",
                               (sender, record_id)).fetchone()
            if row is not None:
                kept = {r[0]: bytes(r[1]) for r in conn.execute(
                    "SELECT recipient_key, wrapped_key FROM mailbox_recipients WHERE sender_key = ? "
                    "AND record_id = ?", (sender, record_id)).fetchall()}
                if bytes(row[0]) == box and kept == recipients:
                    return "same"
                raise CommunityError("mailbox-conflict", "another sealed record of this sender with that id is "
                                     "kept here", status=409)
            owed_to = self._owed_to(conn, sender, keys)
            if owed_to is None:
                if self._refuses_sealed(conn, keys, now):
                    raise CommunityError("mailbox-not-accepted", "no recipient's card here says it takes sealed "
                                         "questions (its card names no mailboxes)", status=403)
                waiting = conn.execute("SELECT count(*) FROM mailbox WHERE sender_key = ? AND owed_to IS NULL",
                                       (sender,)).fetchone()[0]
            else:
                waiting = conn.execute("SELECT count(*) FROM mailbox WHERE owed_to = ? AND sender_key = ?",
                                       (owed_to, sender)).fetchone()[0]
            if waiting >= limits.per_sender:
                whose = "this sender has" if owed_to is None else "this sender's replies to that asker are"
                raise CommunityError("mailbox-sender-full", f"{whose} {limits.per_sender} sealed records "
                                     "waiting here; wait until they are taken or expire", status=429)
            for key in keys:
                waiting = conn.execute("SELECT count(*) FROM mailbox_recipients WHERE recipient_key = ?",
                                       (key,)).fetchone()[0]
                if waiting >= limits.per_recipient:
                    raise CommunityError("mailbox-recipient-full", f"a recipient has {limits.per_recipient} "
                                         "sealed records waiting here", status=507)
            count, total = self._mailbox_totals(conn)
            if count >= limits.max_records or total + bucket > limits.max_bytes:
                raise CommunityError("mailbox-full", "the mailbox is full", status=507)
            stored = self._next_stored(conn, now)
            conn.execute("INSERT INTO mailbox (sender_key, record_id, owed_to, bucket, sealed_box, created_unix, "
                         "expires_unix, stored_unix) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (sender, record_id, owed_to, bucket, box, created_unix, expires_unix, stored))
            for key in keys:
                conn.execute("INSERT INTO mailbox_recipients (recipient_key, sender_key, record_id, wrapped_key, "
                             "stored_unix) VALUES (?, ?, ?, ?, ?)", (key, sender, record_id, recipients[key], stored))
            self._set_mailbox_totals(conn, count + 1, total + bucket)
            return "new"

    def take_sealed(self, recipient: str, *, limit: int, max_bytes: int, now: float,
                    after: tuple[float, str, str] | None = None) -> tuple[list[dict[str, Any]], bool]:
        """The records waiting for ``recipient`` that have not expired, oldest first (they
        stay until acked), in the order ``(stored_unix, sender, id)`` of this recipient's row.

        Args:
            limit: most records. max_bytes: stop before the buckets pass this (at least one
                record is returned). now: Unix seconds. after: a record's
                ``(stored_unix, sender, id)`` (its ``"position"``): only records after it
                (the take's cursor, specs/community-api.md "Mailbox"); None: from the oldest.

        Returns:
            ``(records, more)``: each record ``{"id", "sender", "recipients": {key: wrapped},
            "bucket", "box", "created_unix", "expires_unix", "position"}``; ``more`` when
            records were left for a next take.
        """
        where, args = "", ()
        if after is not None:
            where = " AND (r.stored_unix, r.sender_key, r.record_id) > (?, ?, ?)"
            args = (float(after[0]), after[1], after[2])
        with self._read() as conn:
            rows = conn.execute(
                "SELECT m.record_id, m.sender_key, m.bucket, m.sealed_box, m.created_unix, m.expires_unix, "
                "r.stored_unix FROM mailbox_recipients r JOIN mailbox m ON m.sender_key = r.sender_key "
                "AND m.record_id = r.record_id WHERE r.recipient_key = ? AND m.expires_unix > ?" + where +
                " ORDER BY r.stored_unix, r.sender_key, r.record_id LIMIT ?",
                (recipient, now, *args, limit + 1)).fetchall()
            out: list[dict[str, Any]] = []
            used = 0
            more = len(rows) > limit
            for row in rows[:limit]:
                if out and used + row[2] > max_bytes:
                    more = True
                    break
                used += row[2]
                out.append({"id": row[0], "sender": row[1], "bucket": int(row[2]), "box": bytes(row[3]),
                            "created_unix": float(row[4]), "expires_unix": float(row[5]), "recipients": {},
                            "position": (float(row[6]), row[1], row[0])})
            if out:  # every recipient of the records taken, in one statement
                by_key = {(r["sender"], r["id"]): r for r in out}
                ids = sorted({i for _, i in by_key})
                marks = ", ".join("?" for _ in ids)
                for sender, record_id, key, wrapped in conn.execute(
                        "SELECT sender_key, record_id, recipient_key, wrapped_key FROM mailbox_recipients "
                        f"WHERE record_id IN ({marks}) ORDER BY recipient_key", tuple(ids)).fetchall():
                    if (sender, record_id) in by_key:
                        by_key[(sender, record_id)]["recipients"][key] = bytes(wrapped)
        return out, more

    def ack_sealed(self, signer: str, records: list[tuple[str, str]]) -> int:
        """Remove the records among ``records`` (``(sender key, record id)`` pairs) that
        ``signer`` is a recipient of (for every recipient: one device of a person answering
        is enough) or the sender of (a withdrawal: ``kith outbox remove`` of a question
        left here, specs/sealed.md §10). Unknown records, or records of others, are left
        alone.

        Returns:
            how many records were removed.
        """
        removed = 0
        with self._write() as conn:
            self._mailbox_lock(conn)
            for sender, record_id in dict.fromkeys(records):
                mine = sender == signer or conn.execute(
                    "SELECT 1 FROM mailbox_recipients WHERE recipient_key = ? AND sender_key = ? AND record_id = ?",
                    (signer, sender, record_id)).fetchone() is not None
                if not mine:
                    continue
                removed += self._remove_sealed(conn, sender, record_id)
        return removed

    def mailbox_usage(self) -> dict[str, int]:
        """``{"records", "bytes"}`` kept in the mailbox, counted from the tables (for stats
        and tests; they check the kept totals against it)."""
        with self._read() as conn:
            count, total = conn.execute("SELECT count(*), coalesce(sum(bucket), 0) FROM mailbox").fetchone()
        return {"records": int(count), "bytes": int(total)}

    def mailbox_totals(self) -> dict[str, int]:
        """The totals the bounds are checked against (``meta``; see :meth:`_mailbox_totals`)."""
        with self._write() as conn:
            self._mailbox_lock(conn)
            count, total = self._mailbox_totals(conn)
        return {"records": count, "bytes": total}

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
                          max_sessions: int | None, tags: list[str], now: float,
                          lease_unix: float | None = None, unlisted: bool = False) -> bool:
        """Store an invitation (and its lower-cased tags) under ``post_id``; False if that
        id is taken. ``lease_unix``: the first liveness lease's end (Unix s); ``unlisted``:
        absent from browse unless browsed by its host key."""
        with self._write() as conn:
            return self._insert_invitation(
                conn, post_id=post_id, host_public_key=host_public_key,
                protocol_id=protocol_id, protocol_name=protocol_name, document=document,
                expires_unix=expires_unix, max_sessions=max_sessions, tags=tags, now=now,
                lease_unix=lease_unix, unlisted=unlisted)

    @staticmethod
    def _insert_invitation(conn: _Conn, *, post_id: str, host_public_key: str,
                           protocol_id: str, protocol_name: str, document: dict[str, Any],
                           expires_unix: float, max_sessions: int | None, tags: list[str],
                           now: float, lease_unix: float | None, unlisted: bool = False) -> bool:
        """:meth:`insert_invitation` inside the caller's transaction (bulk seeding)."""
        cur = conn.execute(
            "INSERT INTO invitations (post_id, host_public_key, protocol_id, protocol_name, "
            "document, expires_unix, created_unix, max_sessions, lease_unix, unlisted) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (post_id) DO NOTHING",
            (post_id, host_public_key, protocol_id, protocol_name, _dumps(document),
             expires_unix, now, max_sessions, lease_unix, 1 if unlisted else 0))
        if cur.rowcount != 1:
            return False
        for tag in sorted({t.lower() for t in tags}):
            conn.execute("INSERT INTO invitation_tags (post_id, tag) VALUES (?, ?)",
                         (post_id, tag))
        return True

    _INVITATION_COLS = ("i.document, i.expires_unix, i.created_unix, i.max_sessions, "
                        "i.sessions_count, i.withdrawn_unix, d.display_name, i.seq, "
                        "i.lease_unix")

    @staticmethod
    def _invitation_row(row: Any) -> InvitationRow:
        return InvitationRow(document=json.loads(row[0]), expires_unix=row[1],
                             created_unix=row[2], max_sessions=row[3],
                             sessions_count=int(row[4]), withdrawn_unix=row[5],
                             host_display_name=row[6], seq=int(row[7]), lease_unix=row[8])

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
        """Live invitations (not withdrawn, not consumed, not expired, lease not lapsed),
        newest first. Unlisted posts are left out unless ``host_public_key`` is given (who
        knows the host's key may find its posts; a stranger browsing does not see them).

        Args:
            now: Unix seconds. limit: at most this many rows.
            protocol_id / protocol_name / tag (matched lower-cased) / host_public_key:
                optional exact filters. before_seq: return only rows published before this
                sequence number (the cursor of the previous page).
        """
        where = ["i.withdrawn_unix IS NULL", "i.expires_unix > ?",
                 "(i.lease_unix IS NULL OR i.lease_unix > ?)",
                 "(i.max_sessions IS NULL OR i.sessions_count < i.max_sessions)"]
        params: list[Any] = [now, now]
        if protocol_id is not None:
            where.append("i.protocol_id = ?")
            params.append(protocol_id)
        if protocol_name is not None:
            where.append("i.protocol_name = ?")
            params.append(protocol_name)
        if host_public_key is not None:
            where.append("i.host_public_key = ?")
            params.append(host_public_key)
        else:
            where.append("i.unlisted = 0")
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
                         expires_unix: float, lease_unix: float | None = None) -> bool:
        """Replace a live-or-expired invitation's document and expiry (a renew, which also
        refreshes the lease to ``lease_unix`` when given); False if it is unknown,
        withdrawn or consumed (checked again under the write lock)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE invitations SET document = ?, expires_unix = ?, "
                "lease_unix = coalesce(?, lease_unix) WHERE post_id = ? "
                "AND withdrawn_unix IS NULL "
                "AND (max_sessions IS NULL OR sessions_count < max_sessions)",
                (_dumps(document), expires_unix, lease_unix, post_id))
            return cur.rowcount == 1

    def refresh_lease(self, post_id: str, *, lease_unix: float, now: float) -> None:
        """Extend a post's liveness lease to ``lease_unix`` (Unix s) unless it is withdrawn,
        consumed or expired. A refresh that would move the lease by less than a second
        writes nothing, so a storm of refreshes costs reads, not writes."""
        with self._write() as conn:
            conn.execute(
                "UPDATE invitations SET lease_unix = ? WHERE post_id = ? "
                "AND withdrawn_unix IS NULL AND expires_unix > ? "
                "AND (max_sessions IS NULL OR sessions_count < max_sessions) "
                "AND (lease_unix IS NULL OR lease_unix < ?)",
                (lease_unix, post_id, now, lease_unix - 1.0))

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


def _kept_order(conn: sqlite3.Connection, table: str, key_column: str, key: str, seq: int) -> str:
    """How the row kept under ``key`` in ``table`` (one of this module's seq-numbered tables,
    never input) orders against a new ``seq``: ``none`` (no row), ``older`` (a smaller seq,
    to be replaced), ``same`` or ``stale`` (a larger seq: the new one is dropped)."""
    row = conn.execute(f"SELECT seq FROM {table} WHERE {key_column} = ?", (key,)).fetchone()
    if row is None:
        return "none"
    return "stale" if seq < row[0] else "same" if seq == row[0] else "older"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class _NameTaken(Exception):
    """Inside a write: another key owns a skeleton of this display name (roll back)."""


def _schema_newer(version: int) -> CommunityError:
    return CommunityError(
        "database-schema-newer",
        f"the community database is at schema version {version}, newer than this server's "
        f"{SCHEMA_VERSION}: upgrade kith-node on every instance (or restore a backup)",
        status=0)


# --- migrations -------------------------------------------------------------------------------
def _to_v2(store: CommunityStore, conn: _Conn, from_version: int) -> None:
    """The base schema; a first-cut (version 1) SQLite file is rebuilt keeping its rows."""
    if from_version == 1:
        if store.dialect != "sqlite":
            raise CommunityError("database-schema-old", "a schema-1 database exists only on "
                                 "SQLite; this PostgreSQL database cannot be migrated", status=0)
        SqliteStore._migrate_v1(conn)  # type: ignore[arg-type]
    store._run_script(conn, _SCHEMA_TEMPLATE)


# Version 5: unlisted posts (reachable by post_id and a host-key lookup, absent from browse).
_MIGRATION_5 = """
ALTER TABLE invitations ADD COLUMN unlisted INTEGER NOT NULL DEFAULT 0
"""


def _to_v5(store: CommunityStore, conn: _Conn, from_version: int) -> None:
    """The ``unlisted`` flag of invitations (existing posts stay listed)."""
    if not store._has_column(conn, "invitations", "unlisted"):
        store._run_script(conn, _MIGRATION_5)


def _to_v3(store: CommunityStore, conn: _Conn, from_version: int) -> None:
    """Leases, shared rate limits, display-name skeletons (existing names keep their
    skeletons; of two existing look-alikes the older registration keeps it)."""
    from node.common.names import name_skeletons  # the node's look-alike fold, shared (not copied)

    if not store._has_column(conn, "invitations", "lease_unix"):
        store._run_script(conn, _MIGRATION_3)
    rows = conn.execute("SELECT public_key, display_name FROM identities "
                        "ORDER BY created_unix, public_key").fetchall()
    for public_key, display_name in rows:
        for skeleton in sorted(name_skeletons(display_name)):
            conn.execute("INSERT INTO identity_skeletons (skeleton, public_key) VALUES (?, ?) "
                         "ON CONFLICT (skeleton) DO NOTHING", (skeleton, public_key))


# Version 6: hosting devices' cards (specs/peers.md §13): the newest card of each device key,
# found by its person key (signed by the device, its chain by the person; at most 16 KiB).
_MIGRATION_6 = """
CREATE TABLE IF NOT EXISTS device_cards (
    device_key   TEXT PRIMARY KEY,
    person_key   TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    card         TEXT NOT NULL,          -- the signed card (compact JSON)
    expires_unix {REAL} NOT NULL,        -- its invitation's expires_at
    updated_unix {REAL} NOT NULL
);
CREATE INDEX IF NOT EXISTS device_cards_person ON device_cards (person_key);
"""


def _to_v6(store: CommunityStore, conn: _Conn, from_version: int) -> None:
    """Hosting devices' cards (one row per device key)."""
    store._run_script(conn, _MIGRATION_6)


# Version 7: the mailbox (specs/sealed.md, specs/community-api.md "Mailbox"): sealed records
# left for recipients. One row per record (its sender, bucket, times and the ciphertext),
# one row per recipient (its key and the content key wrapped for it). Nothing here is text.
_MIGRATION_7 = """
CREATE TABLE IF NOT EXISTS mailbox (
    record_id    TEXT PRIMARY KEY,       -- the outer id (32 hex, a hash: not the question id)
    sender_key   TEXT NOT NULL,
    bucket       INTEGER NOT NULL,       -- the padded size (bytes)
    sealed_box   {BLOB} NOT NULL,        -- ciphertext only (XSalsa20-Poly1305)
    created_unix {REAL} NOT NULL,
    expires_unix {REAL} NOT NULL,
    stored_unix  {REAL} NOT NULL
);
CREATE INDEX IF NOT EXISTS mailbox_sender ON mailbox (sender_key);
CREATE INDEX IF NOT EXISTS mailbox_expires ON mailbox (expires_unix);
CREATE TABLE IF NOT EXISTS mailbox_recipients (
    recipient_key TEXT NOT NULL,
    record_id     TEXT NOT NULL,
    wrapped_key   {BLOB} NOT NULL,       -- the record's content key sealed to this recipient
    stored_unix   {REAL} NOT NULL,
    PRIMARY KEY (recipient_key, record_id)
);
CREATE INDEX IF NOT EXISTS mailbox_recipients_record ON mailbox_recipients (record_id);
CREATE INDEX IF NOT EXISTS mailbox_recipients_order ON mailbox_recipients (recipient_key, stored_unix)
"""


def _to_v7(store: CommunityStore, conn: _Conn, from_version: int) -> None:
    """The mailbox of sealed records (two tables)."""
    store._run_script(conn, _MIGRATION_7)


# Version 8: the mailbox keyed by (sender, record id) (issue 43: a squat only squats its own
# space: another sender's record under an id never blocks the record its sender makes), and
# each record says whose bound it counts against: ``owed_to`` is the asker a reply goes to
# (a record put while a record from one of its recipients to its sender waits here), NULL
# for a record counted against its sender.
_MIGRATION_8 = """
CREATE TABLE mailbox_v8 (
    sender_key   TEXT NOT NULL,
    record_id    TEXT NOT NULL,          -- the outer id (32 hex, a hash: not the question id)
    owed_to      TEXT,                   -- a reply: the asker key whose bound it counts against
    bucket       INTEGER NOT NULL,       -- the padded size (bytes)
    sealed_box   {BLOB} NOT NULL,        -- ciphertext only (XSalsa20-Poly1305)
    created_unix {REAL} NOT NULL,
    expires_unix {REAL} NOT NULL,
    stored_unix  {REAL} NOT NULL,
    PRIMARY KEY (sender_key, record_id)
);
INSERT INTO mailbox_v8 (sender_key, record_id, owed_to, bucket, sealed_box, created_unix, expires_unix,
                        stored_unix)
    SELECT sender_key, record_id, NULL, bucket, sealed_box, created_unix, expires_unix, stored_unix FROM mailbox;
CREATE TABLE mailbox_recipients_v8 (
    recipient_key TEXT NOT NULL,
    sender_key    TEXT NOT NULL,
    record_id     TEXT NOT NULL,
    wrapped_key   {BLOB} NOT NULL,       -- the record's content key sealed to this recipient
    stored_unix   {REAL} NOT NULL,
    PRIMARY KEY (recipient_key, sender_key, record_id)
);
INSERT INTO mailbox_recipients_v8 (recipient_key, sender_key, record_id, wrapped_key, stored_unix)
    SELECT r.recipient_key, m.sender_key, r.record_id, r.wrapped_key, r.stored_unix
    FROM mailbox_recipients r JOIN mailbox m ON m.record_id = r.record_id;
DROP TABLE mailbox_recipients;
DROP TABLE mailbox;
ALTER TABLE mailbox_v8 RENAME TO mailbox;
ALTER TABLE mailbox_recipients_v8 RENAME TO mailbox_recipients;
CREATE INDEX mailbox_sender ON mailbox (sender_key, owed_to);
CREATE INDEX mailbox_owed ON mailbox (owed_to, sender_key);
CREATE INDEX mailbox_expires ON mailbox (expires_unix);
CREATE INDEX mailbox_recipients_record ON mailbox_recipients (record_id, sender_key);
CREATE INDEX mailbox_recipients_order ON mailbox_recipients (recipient_key, stored_unix)
"""


def _to_v8(store: CommunityStore, conn: _Conn, from_version: int) -> None:
    """The mailbox keyed by (sender, record id), with the asker a reply is owed to."""
    store._run_script(conn, _MIGRATION_8)


def _to_v4(store: CommunityStore, conn: _Conn, from_version: int) -> None:
    """Persons' revocation lists (one row per person key)."""
    store._run_script(conn, _MIGRATION_4)


#: ``(version, name, step)`` in order; ``step(store, conn, from_version)`` brings the
#: database from the previous version to ``version`` inside the migration's transaction.
MIGRATIONS: tuple[tuple[int, str, Callable[[CommunityStore, _Conn, int], None]], ...] = (
    (2, "base schema: identities, protocols, invitations, sessions, feedback, nonces", _to_v2),
    (3, "stateless instances: liveness leases, shared rate limits, name skeletons", _to_v3),
    (4, "persons' device revocation lists", _to_v4),
    (5, "unlisted posts", _to_v5),
    (6, "hosting devices' cards", _to_v6),
    (7, "the mailbox of sealed records", _to_v7),
    (8, "the mailbox keyed by (sender, record id); replies counted against their asker", _to_v8),
)


# --- SQLite ---------------------------------------------------------------------------------
#: Statement time allowed to a migration or a backup, in seconds.
_MAINTENANCE_TIMEOUT_S = 3600.0
_SQLITE_TYPES = {"AUTO_PK": "INTEGER PRIMARY KEY AUTOINCREMENT", "REAL": "REAL", "BLOB": "BLOB"}


def _sqlite_unavailable(exc: sqlite3.Error) -> CommunityError:
    if "interrupted" in str(exc):
        return CommunityError("database-timeout", "a database statement took longer than "
                              f"{STATEMENT_TIMEOUT_S:g} s and was cancelled; retry later",
                              status=503)
    return CommunityError("database-unavailable",
                          "the community database is unavailable; retry later", status=503)


class SqliteStore(CommunityStore):
    """The default store: one SQLite file in WAL mode, for one server process.

    Args:
        db_path: the SQLite file; its folder is created (mode 0700). An empty file gets the
            current schema; an older one is refused unless ``migrate`` (see
            :meth:`CommunityStore._open_schema`).
        migrate: bring an older schema forward (``kith community migrate``).
        statement_timeout_s: a statement running longer is interrupted (503
            ``database-timeout``), in seconds.

    Raises:
        CommunityError: ``database-unavailable`` if the file cannot be opened or is not a
            Kith community database; ``database-schema-old`` / ``database-schema-newer``.
    """

    dialect = "sqlite"

    def __init__(self, db_path: Path, *, migrate: bool = False,
                 statement_timeout_s: float = STATEMENT_TIMEOUT_S) -> None:
        self.db_path = Path(db_path)
        self.statement_timeout_s = statement_timeout_s
        self.applied: list[int] = []
        self._lock_fd: int | None = None
        self._local = threading.local()  # this thread's kept connection (see _connect)
        self._kept: list[sqlite3.Connection] = []
        self._kept_lock = threading.Lock()
        self._generation = 0  # close() moves it on: a thread's kept connection of before is not used
        try:
            self.db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with self._connect(timeout_s=_MAINTENANCE_TIMEOUT_S) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("BEGIN IMMEDIATE")
                try:
                    self.applied = self._open_schema(conn, migrate=migrate)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
        except (sqlite3.Error, OSError):
            raise CommunityError("database-unavailable",
                                 f"cannot open the community database {self.db_path.name} "
                                 "(unreadable, locked or not a Kith community database)",
                                 status=0) from None

    def describe(self) -> str:
        return f"SQLite {self.db_path}"

    def _sql(self, template: str) -> str:
        return template.format(**_SQLITE_TYPES)

    def _has_table(self, conn: _Conn, name: str) -> bool:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                            (name,)).fetchone() is not None

    def _has_any_table(self, conn: _Conn) -> bool:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite!_%' "
                            "ESCAPE '!' LIMIT 1").fetchone() is not None

    def _has_column(self, conn: _Conn, table: str, column: str) -> bool:
        return column in [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]

    def lock_single_writer(self) -> None:
        """Hold ``<db>.lock`` (an exclusive ``flock``) until :meth:`close`: SQLite serves
        one server process; several instances need PostgreSQL.

        Raises:
            CommunityError: ``database-in-use`` if another process holds it.
        """
        path = self.db_path.with_name(self.db_path.name + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise CommunityError(
                "database-in-use",
                f"another kith community server is using {self.db_path.name}; SQLite serves "
                "one process — run several instances on PostgreSQL (--database-url)",
                status=0) from None
        self._lock_fd = fd

    def close(self) -> None:
        """Release the single-writer lock and close the kept connections (a later call opens
        new ones)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        with self._kept_lock:
            kept, self._kept = self._kept, []
            self._generation += 1
        for conn in kept:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def backup(self, target: Path) -> int:
        """Copy the database to ``target`` with SQLite's online backup API (consistent even
        while a server writes); written to a temporary file beside ``target`` and renamed
        into place, so ``target`` is never half-written.

        Returns:
            The size of the copy in bytes.

        Raises:
            UsageError: ``usage`` if ``target`` exists.
            CommunityError: ``database-unavailable`` if the copy fails.
        """
        target = Path(target)
        if target.exists():
            raise UsageError("usage", f"{target} exists; back up to a new file")
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with self._connect(timeout_s=_MAINTENANCE_TIMEOUT_S) as src:
                dst = sqlite3.connect(tmp)
                try:
                    src.backup(dst, pages=1024)
                finally:
                    dst.close()
            os.replace(tmp, target)
        except (sqlite3.Error, OSError):
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise CommunityError("database-unavailable",
                                 f"could not back up {self.db_path.name} to {target.name}",
                                 status=0) from None
        return target.stat().st_size

    @staticmethod
    def _migrate_v1(conn: sqlite3.Connection) -> None:
        """Bring a first-cut (schema version 1) database to version 2, keeping its rows."""
        cols = [r[1] for r in conn.execute("PRAGMA table_info(invitations)")]
        if not cols or "seq" in cols:
            return
        conn.execute("ALTER TABLE invitations RENAME TO invitations_v1")
        conn.execute("DROP INDEX IF EXISTS invitations_host")
        for statement in _SCHEMA_TEMPLATE.format(**_SQLITE_TYPES).split(";"):
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

    def _open_connection(self) -> tuple[sqlite3.Connection, list[float]]:
        """A new connection whose statements are each interrupted once they run longer than
        ``limit[0]`` seconds (the returned list: ``[limit, deadline]``)."""
        conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            timing = [self.statement_timeout_s, 0.0]

            def over_time() -> int:  # checked every 10,000 VM steps: 1 interrupts
                return 1 if time.monotonic() > timing[1] else 0

            def statement_starts(_sql: str) -> None:  # each statement gets its own deadline
                timing[1] = time.monotonic() + timing[0]

            conn.set_trace_callback(statement_starts)
            conn.set_progress_handler(over_time, 10_000)
        except BaseException:
            conn.close()
            raise
        return conn, timing

    @contextlib.contextmanager
    def _connect(self, timeout_s: float | None = None) -> Iterator[sqlite3.Connection]:
        """A connection whose statements are each interrupted after ``timeout_s`` seconds
        (default: the store's statement timeout).

        A route's connection (no ``timeout_s``) is this thread's kept one: opening and
        closing one per operation made every write cost a WAL checkpoint and the WAL file's
        re-creation when the last connection closed (~20 ms a signed request at load; issue
        43's mailbox take target). It is opened again when the file at ``db_path`` is not
        the one it was opened on (replaced or removed: a damaged home is seen as before),
        and dropped when an error left it inside a transaction. Maintenance (``timeout_s``
        given: schema, backup) uses a connection of its own, closed after.
        """
        if timeout_s is not None:
            conn, timing = self._open_connection()
            try:
                timing[0] = timeout_s
                timing[1] = time.monotonic() + timeout_s
                yield conn
            finally:
                conn.close()
            return
        conn, timing = self._thread_connection()
        timing[0] = self.statement_timeout_s
        timing[1] = time.monotonic() + timing[0]
        try:
            yield conn
        finally:
            if conn.in_transaction:  # a failed ROLLBACK: never reuse it
                self._forget_connection(conn)

    def _thread_connection(self) -> tuple[sqlite3.Connection, list[float]]:
        """This thread's kept connection, opened again when the database file changed."""
        try:
            st = os.stat(self.db_path)
            stamp: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            stamp = None
        kept = getattr(self._local, "conn", None)
        if kept is not None and stamp is not None and kept[2] == stamp and kept[3] == self._generation:
            return kept[0], kept[1]
        if kept is not None:
            self._forget_connection(kept[0])
        conn, timing = self._open_connection()
        if stamp is None:  # connect created the file: stamp what is there now
            with contextlib.suppress(OSError):
                st = os.stat(self.db_path)
                stamp = (st.st_dev, st.st_ino)
        with self._kept_lock:
            self._local.conn = (conn, timing, stamp, self._generation)
            self._kept.append(conn)
        return conn, timing

    def _forget_connection(self, conn: sqlite3.Connection) -> None:
        kept = getattr(self._local, "conn", None)
        if kept is not None and kept[0] is conn:
            self._local.conn = None
        with self._kept_lock:
            if conn in self._kept:
                self._kept.remove(conn)
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        try:
            with self._connect() as conn:
                yield conn
        except sqlite3.Error as exc:
            raise _sqlite_unavailable(exc) from None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error."""
        try:
            with self._connect() as conn:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _sqlite_unavailable(exc) from None

    def columns(self) -> dict[str, list[str]]:
        with self._read() as conn:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%'")]
            return {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}

    def column_types(self, table: str) -> dict[str, str]:
        if table not in TABLES:
            raise ValueError(f"not a community table: {table}")
        with self._read() as conn:
            return {r[1]: str(r[2]).lower() for r in conn.execute(f"PRAGMA table_info({table})")}


# --- PostgreSQL -----------------------------------------------------------------------------
_PG_TYPES = {"AUTO_PK": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
             "REAL": "DOUBLE PRECISION", "BLOB": "BYTEA"}
#: An advisory lock key: one migrator at a time across instances.
_MIGRATION_LOCK = 7464327
#: An advisory lock key: mailbox writes one at a time across instances (exact bounds).
_MAILBOX_LOCK = 7464328


class _PgConn:
    """Adapts a psycopg connection to the ``?`` placeholders the shared SQL uses."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self._conn.execute(sql.replace("?", "%s"), params)


class PostgresStore(CommunityStore):
    """The deployment store: PostgreSQL through psycopg 3 and a capped connection pool;
    any number of server processes may share one database.

    Args:
        url: ``postgresql://user:password@host:port/dbname`` (or ``postgres://``; libpq
            query options such as ``?host=/run/postgresql`` work).
        pool_size: connections this process keeps at most (default
            :data:`DEFAULT_POOL_SIZE`; one is opened at start, more on demand). A request
            waits up to :data:`BUSY_TIMEOUT_S` for a free one, then answers 503
            ``database-unavailable``.
        connect_timeout_s: how long to keep trying to connect at start, in seconds.
        statement_timeout_s: PostgreSQL's ``statement_timeout`` for every connection, in
            seconds (a statement cancelled by it answers 503 ``database-timeout``).
        migrate: bring an older schema forward (``kith community migrate``).
        pool_timeout_s: how long a request waits for a pooled connection before it answers
            503 ``database-unavailable``, in seconds.

    Raises:
        ConfigError: ``database-driver-missing`` when psycopg is not installed (install
            ``kith-node[postgres]``).
        UsageError: ``database-url-invalid`` when libpq cannot parse the URL (the URL is
            not repeated).
        CommunityError: ``database-unavailable`` when no connection can be made within
            ``connect_timeout_s`` (the message never contains the password);
            ``database-schema-old`` / ``database-schema-newer``.
    """

    dialect = "postgresql"
    _for_update = " FOR UPDATE"
    _greatest = "greatest"

    def _mailbox_lock(self, conn: _Conn) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(?)", (_MAILBOX_LOCK,))

    def __init__(self, url: str, *, pool_size: int = DEFAULT_POOL_SIZE,
                 connect_timeout_s: float = BUSY_TIMEOUT_S,
                 statement_timeout_s: float = STATEMENT_TIMEOUT_S,
                 migrate: bool = False, pool_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise CommunityError("database-driver-missing",
                                 "a postgresql:// database needs psycopg 3") from None
        try:
            params = psycopg.conninfo.conninfo_to_dict(url)
            ports = str(params.get("port") or "0").split(",")
            if not all(p.strip().isdigit() for p in ports):
                raise psycopg.ProgrammingError("port")
        except psycopg.Error:
            raise CommunityError("database-url-invalid",
                                 "the postgresql:// database URL cannot be parsed (not repeated "
                                 "here: it may hold a password)", exit_code=2) from None
        # the pool's own warnings name hosts and sockets on each failed try; the server
        # reports an unavailable database itself (503s, the start-up retry lines)
        pool_log = logging.getLogger("psycopg.pool")
        if not pool_log.handlers:
            pool_log.addHandler(logging.NullHandler())
        self._display = display_database_url(url)
        self.applied: list[int] = []
        timeout_ms = max(1, int(statement_timeout_s * 1000))

        def configure(conn: Any) -> None:
            conn.execute(f"SET statement_timeout = {timeout_ms}")
            conn.commit()

        self._pool = ConnectionPool(url, min_size=1, max_size=max(1, pool_size), open=False,
                                    timeout=pool_timeout_s, name="kith-community",
                                    configure=configure, check=ConnectionPool.check_connection,
                                    kwargs={"connect_timeout": max(1, int(connect_timeout_s))})
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
            with self._pool.connection() as raw:
                conn = _PgConn(raw)
                conn.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
                self.applied = self._open_schema(conn, migrate=migrate)
        except CommunityError:
            self._pool.close()
            raise
        except Exception:
            self._pool.close()
            raise CommunityError("database-unavailable",
                                 f"cannot use the PostgreSQL database {self._display}",
                                 status=0) from None

    def describe(self) -> str:
        return f"PostgreSQL {self._display}"

    def _sql(self, template: str) -> str:
        return template.format(**_PG_TYPES)

    def _has_table(self, conn: _Conn, name: str) -> bool:
        return conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = "
                            "current_schema() AND table_name = ?", (name,)).fetchone() is not None

    def _has_any_table(self, conn: _Conn) -> bool:
        return conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = "
                            "current_schema() LIMIT 1").fetchone() is not None

    def _has_column(self, conn: _Conn, table: str, column: str) -> bool:
        return conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = "
                            "current_schema() AND table_name = ? AND column_name = ?",
                            (table, column)).fetchone() is not None

    @contextlib.contextmanager
    def _connection(self) -> Iterator[_PgConn]:
        """A pooled connection in one transaction (committed on success, rolled back on
        error); a lost server or an exhausted pool answers 503."""
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            with self._pool.connection() as conn:
                yield _PgConn(conn)
        except psycopg.errors.QueryCanceled:
            raise CommunityError("database-timeout", "a database statement took longer than "
                                 "the statement timeout and was cancelled; retry later",
                                 status=503) from None
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout):
            raise CommunityError("database-unavailable",
                                 "the community database is unavailable; retry later",
                                 status=503) from None

    _read = _connection
    _write = _connection

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

    def column_types(self, table: str) -> dict[str, str]:
        with self._read() as conn:
            rows = conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = ?", (table,)).fetchall()
        return {c: str(t).lower() for c, t in rows}


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


def open_store(target: Path | str, *, migrate: bool = False,
               pool_size: int = DEFAULT_POOL_SIZE,
               connect_timeout_s: float = BUSY_TIMEOUT_S,
               statement_timeout_s: float = STATEMENT_TIMEOUT_S,
               existing: bool = False) -> CommunityStore:
    """Open the store named by a path or a database URL.

    Args:
        target: a filesystem path (SQLite), ``sqlite:///ABSOLUTE/PATH`` or
            ``postgresql://...`` / ``postgres://...``.
        migrate: apply pending migrations (else an older schema is refused; an empty
            database always gets the current schema).
        pool_size, connect_timeout_s: PostgreSQL only (see :class:`PostgresStore`).
        statement_timeout_s: longest statement, in seconds.
        existing: open only a SQLite database that is there (``kith community migrate``
            and ``backup``): a missing file — a typo in the URL, a node's home — is
            refused, never created empty and reported migrated or backed up.

    Raises:
        UsageError: ``database-url-invalid`` for any other URL scheme, an empty path or a
            URL libpq cannot parse.
        ConfigError: ``database-driver-missing`` (PostgreSQL without psycopg).
        CommunityError: ``database-unavailable`` (also a missing SQLite file with
            ``existing``), ``database-schema-old``, ``database-schema-newer``.
    """
    if isinstance(target, Path):
        return _sqlite_store(target, migrate=migrate, statement_timeout_s=statement_timeout_s,
                             existing=existing)
    scheme = target.split(":", 1)[0].lower() if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:",
                                                          target) else ""
    if scheme in _PG_SCHEMES:
        return PostgresStore(target, migrate=migrate, pool_size=pool_size,
                             connect_timeout_s=connect_timeout_s,
                             statement_timeout_s=statement_timeout_s)
    if scheme == "sqlite":
        path = target[len("sqlite://"):] if target.startswith("sqlite://") else ""
        if not path.startswith("/") or path == "/":
            raise CommunityError("database-url-invalid",
                                 "a SQLite database URL is sqlite:///ABSOLUTE/PATH", exit_code=2)
        return _sqlite_store(Path(path), migrate=migrate, statement_timeout_s=statement_timeout_s,
                             existing=existing)
    raise CommunityError("database-url-invalid",
                         "the database URL must start with postgresql://, postgres:// or sqlite:///",
                         exit_code=2)


def _sqlite_store(path: Path, *, migrate: bool, statement_timeout_s: float, existing: bool) -> SqliteStore:
    """:class:`SqliteStore` on ``path``; with ``existing``, ``database-unavailable`` when
    there is no file there (see :func:`open_store`)."""
    if existing and not path.exists():
        raise CommunityError("database-unavailable", f"there is no community database at {path}",
                             hint="check --home / --database-url for a typo: `kith community serve` creates "
                                  "the database; migrate and backup never do")
    return SqliteStore(path, migrate=migrate, statement_timeout_s=statement_timeout_s)
