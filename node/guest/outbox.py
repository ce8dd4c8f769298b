"""The outbox: questions kept for peers that are offline now, and their answers kept until
read (``kith ask --later``, local API ``POST /outbox``, MCP ``ask_later``).

specs/outbox.md is normative. One SQLite file per home, ``<home>/outbox.sqlite`` (0600,
WAL, ``synchronous=FULL``: every state change is one transaction, so a ``kill -9`` at any
point leaves each question either not queued or queued whole, and each answer either not
stored or stored whole). Two tables:

- ``questions``: one row per question — ``id`` (32 lowercase hex), the flat request as
  asked (``query``, ``topK``, filters), ``created_at`` / ``expires_at`` (wall-clock UTC
  seconds), ``bytes`` (the request's size as stored).
- ``deliveries``: one row per question and peer — the peer's registry name and pinned
  key, ``state`` (:data:`STATES`), ``attempts``, the last refusal ``code``, the host's
  ``approval_id`` while it waits for its owner, and once answered the host's ``results``
  message as received (``answer``), ``answered_at`` and ``read_at``; ``from_copy`` /
  ``copy_as_of`` when this node's copy of the peer answered the question meanwhile
  (specs/copies.md §6: the row still waits for the live host's answer).

Delivery is exactly once per question and peer: the question travels with
``query_id`` = :func:`query_id_of` (the idempotency key; a resend after a crash carries
the same id), and an answer is stored only into a row that is still open (``UPDATE …
WHERE state IN open``), so a second answer to the same question from the same peer is
never stored twice. Only a complete answer closes a row (:func:`classify`): a host cannot
make the guest drop a question unanswered by claiming it answered.

Bounded: at most :data:`MAX_QUESTIONS` questions and :data:`MAX_BYTES` bytes of requests
and answers (``outbox-full`` beyond; nothing is written). An answer that arrives is always
stored — the bound refuses new questions, never an answer already asked for.

Time: ``expires_at`` is wall-clock (the only use of wall time: a question kept for 7 days
means 7 calendar days, also across reboots); backoff between attempts is monotonic and
lives in the runner's memory (node/guest/runner.py), so a clock jump never causes or
skips an attempt. Expiry rule (specs/outbox.md §4): an open row expires at the first
runner pass whose wall clock reads ``>= expires_at``; a clock set back keeps it longer, a
clock set forward expires it sooner — neither resends or drops an answer already stored.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from node.common.errors import ConfigError, KithError, UsageError
from node.trust.sealed import QUERY_ID_PREFIX  # the wire's prefix, shared with the host

#: The file in the home.
OUTBOX_FILE = "outbox.sqlite"
#: Questions kept at most (every state counts until removed).
MAX_QUESTIONS = 2000
#: Bytes of stored requests and answers at most before new questions are refused.
MAX_BYTES = 32 * 1024 * 1024
#: Default and largest keep time, seconds.
DEFAULT_KEEP_S = 7 * 24 * 3600
MAX_KEEP_S = 30 * 24 * 3600
MIN_KEEP_S = 60
#: Row states. ``waiting``: not answered yet; ``pending-approval``: the host answered with
#: what its owner allows now and waits for an approval (asked again until it is decided);
#: ``answered``: a complete answer is stored; ``expired``: not answered in time;
#: ``failed``: can never be delivered (the peer was removed, blocked or re-pinned).
STATES = ("waiting", "pending-approval", "answered", "expired", "failed")
OPEN_STATES = ("waiting", "pending-approval")
ID_RE = re.compile(r"^[0-9a-f]{32}$")
PREFIX_RE = re.compile(r"^[0-9a-fA-F]{4,32}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS questions(
  id TEXT PRIMARY KEY,
  request TEXT NOT NULL,
  created_at REAL NOT NULL,
  expires_at REAL NOT NULL,
  bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS deliveries(
  question_id TEXT NOT NULL REFERENCES questions(id) ON DELETE CASCADE,
  peer_name TEXT NOT NULL,
  peer_key TEXT NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  code TEXT,
  last_attempt_at REAL,
  approval_id TEXT,
  answer TEXT,
  answer_bytes INTEGER NOT NULL DEFAULT 0,
  answered_at REAL,
  read_at REAL,
  from_copy INTEGER NOT NULL DEFAULT 0,
  copy_as_of TEXT,
  PRIMARY KEY(question_id, peer_key));
CREATE INDEX IF NOT EXISTS deliveries_state ON deliveries(state, peer_key);
CREATE INDEX IF NOT EXISTS questions_expiry ON questions(expires_at);
CREATE TABLE IF NOT EXISTS withdrawals(
  holder TEXT NOT NULL,
  question_id TEXT NOT NULL,
  peer_key TEXT NOT NULL,
  record_id TEXT,
  expires_at REAL NOT NULL,
  PRIMARY KEY(holder, question_id, peer_key));
"""


def query_id_of(question_id: str) -> str:
    """The ``query_id`` a question travels with (the idempotency key, specs/outbox.md §3):
    ``outbox:<id>`` (39 characters, within the protocol's ``[A-Za-z0-9_.:-]{1,64}``)."""
    return QUERY_ID_PREFIX + question_id


def parse_keep(text: str | int | float | None) -> int:
    """``--keep`` as seconds: a number of seconds, or a duration ``30m``, ``12h``, ``7d``,
    ``2w``; None → :data:`DEFAULT_KEEP_S`.

    Raises:
        UsageError: ``outbox-keep-invalid`` (exit 2) for anything else, or outside
            :data:`MIN_KEEP_S` … :data:`MAX_KEEP_S`.
    """
    if text is None:
        return DEFAULT_KEEP_S
    if isinstance(text, bool):
        raise UsageError("outbox-keep-invalid", "keep must be a duration such as 12h or 7d")
    if isinstance(text, (int, float)):
        seconds = int(text)
    else:
        m = re.fullmatch(r"\s*(\d{1,7})\s*([smhdw]?)\s*", str(text))
        if m is None:
            raise UsageError("outbox-keep-invalid", f"{str(text)[:40]!r} is not a duration (30m, 12h, 7d, 2w)")
        seconds = int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    if not MIN_KEEP_S <= seconds <= MAX_KEEP_S:
        raise UsageError("outbox-keep-invalid", f"keep must be between 1 minute and 30 days, not {seconds} s")
    return seconds


@dataclass(frozen=True)
class Outcome:
    """What one delivery attempt's answer means for its row (:func:`classify`).

    Attributes:
        state: the row's new state (``answered``, ``pending-approval``) or None: the row
            stays as it was and is asked again after the backoff.
        code: the code recorded on the row (the host's status when it is not an answer).
        retry_after_s: the host's ``retry_after_s`` (rate-limited), or None.
    """

    state: str | None
    code: str | None = None
    retry_after_s: float | None = None


def classify(message: Any, query_id: str) -> Outcome:
    """Judge a host's ``results`` message to an outbox question (specs/outbox.md §3).

    Only a complete answer closes the row: status ``ok`` or ``no-verified-results`` with a
    well-formed envelope (:func:`node.guest.peer_results.check_results`) small enough for
    the fence to screen (:func:`node.answer.fence.check_markable`) for this very
    ``query_id``. ``pending-approval`` (with its envelope) keeps the row open as
    ``pending-approval``. Anything else — ``rate-limited``, a refusal, a malformed
    envelope, an answer to another ``query_id``, a status claiming it answered before —
    changes nothing but the recorded code: the question is asked again.
    """
    from node.answer.fence import check_markable
    from node.guest.peer_results import check_results

    if not isinstance(message, dict):
        return Outcome(None, "peer-answer-invalid")
    if message.get("query_id") != query_id:
        return Outcome(None, "peer-answer-invalid")
    status = message.get("status")
    if status == "rate-limited":
        ra = message.get("retry_after_s")
        ok = isinstance(ra, (int, float)) and not isinstance(ra, bool) and 0 <= ra <= 86400
        return Outcome(None, "rate-limited", float(ra) if ok else None)
    try:
        check_results(message.get("envelope"))
        check_markable(message.get("envelope"))  # too large to screen: refused unread
    except ValueError:
        return Outcome(None, "peer-answer-invalid")
    if status in ("ok", "no-verified-results"):
        return Outcome("answered", None)
    if status == "pending-approval":
        return Outcome("pending-approval", "pending-approval")
    return Outcome(None, status[:64] if isinstance(status, str) and status else "peer-answer-invalid")


@dataclass(frozen=True)
class OpenDelivery:
    """An open row the runner delivers: the question's id, its ``query_id``, its request,
    the peer's name and pinned key, its state and whether this node's copy of the peer
    answered it meanwhile (``from_copy``)."""

    question_id: str
    query_id: str
    request: dict[str, Any]
    peer_name: str
    peer_key: str
    state: str
    from_copy: bool = False


class OutboxStore:
    """The home's outbox (``<home>/outbox.sqlite``; module docstring).

    Thread-safe (one connection, one lock); each method is one transaction. Several
    processes may open it at once (SQLite WAL; ``busy_timeout`` 10 s).

    Args:
        home: the node home. clock: wall-clock seconds (tests pass their own).
        readonly: open the existing file to read only, writing nothing
            (:func:`node.common.home.open_home_db_readonly`; :meth:`for_reading` picks it
            for a home this process may not write): no table is made or updated, and
            every writing method raises ``io-error`` (the database is read-only).

    Raises:
        ConfigError: ``outbox-corrupt`` when the file is not a SQLite database or its
            tables are not the outbox's; ``io-error`` / ``disk-full`` when it cannot be
            opened, read or made (:func:`_fault`), and read-only for a file an older Kith
            made (its newer columns only a writer adds).
    """

    def __init__(self, home: Path, *, clock: Any = time.time, readonly: bool = False) -> None:
        self.home = Path(home)
        self.path = self.home / OUTBOX_FILE
        self.clock = clock
        self.readonly = readonly
        self._lock = threading.Lock()
        self.db = _open_readonly(self.path) if readonly else open_home_db_checked(self.path)
        try:
            self.db.execute("PRAGMA busy_timeout=10000")
            if not readonly:
                self.db.execute("PRAGMA synchronous=FULL")
                self.db.execute("PRAGMA foreign_keys=ON")
            with self._lock:
                if not readonly:
                    self.db.executescript(_SCHEMA)
                    _add_copy_columns(self.db)
                elif _missing_columns(self.db):  # only a writer can bring an older file up to date
                    from node.common.dbfaults import io_error

                    self.db.close()
                    raise io_error(str(self.path), "an older Kith made this outbox, and reading it needs it "
                                                   "updated, which needs it writable")
                # a file of another schema (a hand-made or foreign table of that name)
                self.db.execute("SELECT id, request, created_at, expires_at, bytes FROM questions LIMIT 0")
                self.db.execute("SELECT question_id, peer_name, peer_key, state, attempts, code, last_attempt_at, "
                                "approval_id, answer, answer_bytes, answered_at, read_at, from_copy, copy_as_of "
                                "FROM deliveries LIMIT 0")
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise _fault(self.path, exc) from None

    @classmethod
    def for_reading(cls, home: Path, *, clock: Any = time.time) -> "OutboxStore":
        """The home's outbox opened to be read (``kith outbox list``, ``show``): as usual
        where this process may write the file (:func:`node.common.home.may_write`), else
        read-only (``readonly``; a home the user may read but not write) — reading never
        needs to write.

        Raises:
            as the constructor.
        """
        from node.common.home import may_write

        return cls(home, clock=clock, readonly=not may_write(Path(home) / OUTBOX_FILE))

    def close(self) -> None:
        """Close the connection."""
        self.db.close()

    def __enter__(self) -> "OutboxStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def _tx(self) -> Any:
        store = self

        class _Tx:
            def __enter__(self) -> Any:
                store._lock.acquire()
                store.db.execute("BEGIN IMMEDIATE")
                return store.db

            def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
                try:
                    try:
                        store.db.execute("COMMIT" if kind is None else "ROLLBACK")
                    except sqlite3.DatabaseError as failed:  # a full disk at COMMIT
                        if kind is None:
                            with contextlib.suppress(sqlite3.Error):
                                store.db.execute("ROLLBACK")
                            raise _fault(store.path, failed) from None
                finally:
                    store._lock.release()
                if isinstance(exc, sqlite3.DatabaseError):  # a full disk, a damaged page
                    raise _fault(store.path, exc) from None
        return _Tx()

    def add(self, request: dict[str, Any], peers: list[tuple[str, str]], *, keep_s: int = DEFAULT_KEEP_S,
            from_copy: dict[str, str | None] | None = None) -> dict[str, Any]:
        """Queue one question for ``peers`` (``(name, pinned key)`` pairs, at least one).

        Args:
            request: the flat request, already checked against the request contract.
            peers: the peers to deliver it to. keep_s: seconds to keep it (:func:`parse_keep`).
            from_copy: pinned key → ``copyAsOf`` (the copy's ``syncedAt``, or None) of the
                peers this node's copy answered meanwhile (specs/outbox.md §1): their rows
                say so (``fromCopy``, ``copyAsOf``) and wait for the live host as any other.

        Returns:
            The new record (:meth:`get`).

        Raises:
            ConfigError: ``outbox-full`` when :data:`MAX_QUESTIONS` questions are kept or
                the stored bytes reach :data:`MAX_BYTES` (nothing is written).
        """
        if not peers:
            raise ValueError("no peer to queue for")
        body = request_body(request)
        qid = secrets.token_hex(16)
        now = float(self.clock())
        with self._tx() as db:
            _check_room(db, len(body))
            db.execute("INSERT INTO questions(id, request, created_at, expires_at, bytes) VALUES (?,?,?,?,?)",
                       (qid, body, now, now + keep_s, len(body)))
            copied = from_copy or {}
            db.executemany("INSERT OR IGNORE INTO deliveries(question_id, peer_name, peer_key, state, from_copy, "
                           "copy_as_of) VALUES (?,?,?,?,?,?)",
                           [(qid, name, key, "waiting", int(key in copied), copied.get(key)) for name, key in peers])
        got = self.get(qid)
        assert got is not None
        return got

    def check_room(self, request: dict[str, Any]) -> None:
        """Refuse now when ``request`` (the flat request as it will be kept) would not fit:
        ``kith ask --later``, ``POST /outbox`` and MCP ``ask_later`` check before asking
        anyone, with the very bytes :meth:`add` counts when it checks again.

        Raises:
            ConfigError: ``outbox-full``.
        """
        with self._lock:
            _check_room(self.db, len(request_body(request)))

    def expire(self) -> int:
        """Mark every open row whose question's ``expires_at`` passed (wall clock) as
        ``expired`` (code ``outbox-expired``). Returns how many rows changed."""
        now = float(self.clock())
        with self._lock:  # a read first: a pass with nothing to expire writes nothing
            due = self.db.execute(
                "SELECT 1 FROM deliveries d JOIN questions q ON q.id = d.question_id "
                "WHERE d.state IN ('waiting','pending-approval') AND q.expires_at <= ? LIMIT 1", (now,)).fetchone()
        if due is None:
            return 0
        with self._tx() as db:
            cur = db.execute(
                "UPDATE deliveries SET state='expired', code='outbox-expired' WHERE state IN ('waiting','pending-approval') "
                "AND question_id IN (SELECT id FROM questions WHERE expires_at <= ?)", (now,))
            return cur.rowcount

    def record_attempt(self, question_id: str, peer_key: str, outcome: Outcome | None, *,
                       code: str | None = None, message: dict[str, Any] | None = None) -> bool:
        """Record one delivery attempt on an open row.

        Args:
            outcome: :func:`classify` of the host's answer, or None when no answer came
                (``code`` says why: ``transport-connect-failed``, ``peer-timeout``, …).
            message: the host's ``results`` message (stored when ``outcome.state`` is
                ``answered`` or ``pending-approval``).

        Returns:
            True when the row was open (the attempt counted); False when it had been
            closed meanwhile (answered, expired, removed): nothing changes — an answer
            is stored once.
        """
        now = float(self.clock())
        with self._tx() as db:
            row = db.execute("SELECT state FROM deliveries WHERE question_id=? AND peer_key=?",
                             (question_id, peer_key)).fetchone()
            if row is None or row[0] not in OPEN_STATES:
                return False
            if outcome is not None and outcome.state in ("answered", "pending-approval") and message is not None:
                text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
                aid = message.get("approval_id") if outcome.state == "pending-approval" else None
                db.execute("UPDATE deliveries SET state=?, attempts=attempts+1, code=?, last_attempt_at=?, answer=?, "
                           "answer_bytes=?, answered_at=?, approval_id=?, read_at=NULL WHERE question_id=? AND peer_key=?",
                           (outcome.state, outcome.code, now, text, len(text), now,
                            aid if isinstance(aid, str) else None, question_id, peer_key))
            else:
                db.execute("UPDATE deliveries SET attempts=attempts+1, code=?, last_attempt_at=? "
                           "WHERE question_id=? AND peer_key=?",
                           ((outcome.code if outcome is not None else code), now, question_id, peer_key))
            return True

    def mark_left(self, question_id: str, peer_key: str, holder: str, record_id: str | None = None) -> None:
        """Record that a sealed copy of this open row's question was left with ``holder`` (a
        community server's URL or ``iroh:<ticket>``; specs/sealed.md §10): ``kith outbox``
        shows it, it is not left again, and removing the question withdraws it there.
        ``record_id``: the sealed record's outer id (what the withdrawal names); None keeps
        the one recorded for that holder, if any. A closed row is not changed; a question
        removed meanwhile (``kith outbox remove`` while the copy was being left) with a
        ``record_id`` gets a withdrawal of that copy instead (:meth:`withdrawals`; kept at most
        :data:`MAX_KEEP_S`, the question's own expiry having gone with it)."""
        with self._tx() as db:
            db.execute("UPDATE deliveries SET left_record = CASE WHEN ? IS NOT NULL THEN ? "
                       "WHEN left_with = ? THEN left_record END, left_with=? WHERE question_id=? AND peer_key=? "
                       "AND state IN ('waiting','pending-approval')",
                       (record_id, record_id, holder, holder, question_id, peer_key))
            gone = db.execute("SELECT 1 FROM questions WHERE id=?", (question_id,)).fetchone() is None
            if gone and record_id is not None:  # removed while it was being left: withdrawn all the same
                db.execute("INSERT OR REPLACE INTO withdrawals (holder, question_id, peer_key, record_id, expires_at) "
                           "VALUES (?, ?, ?, ?, ?)", (holder, question_id, peer_key, record_id,
                                                      float(self.clock()) + MAX_KEEP_S))

    def fail(self, question_id: str, peer_key: str, code: str) -> None:
        """Close an open row as ``failed`` with ``code`` (it can never be delivered)."""
        with self._tx() as db:
            db.execute("UPDATE deliveries SET state='failed', code=? WHERE question_id=? AND peer_key=? "
                       "AND state IN ('waiting','pending-approval')", (code, question_id, peer_key))

    def remove(self, question_id: str) -> bool:
        """Delete a question and its rows (answers included); each sealed copy of it left
        with a holder and not expired is kept to be withdrawn there (:meth:`withdrawals`),
        in the same transaction. Returns True when it existed."""
        with self._tx() as db:
            self._keep_withdrawals(db, [question_id])
            db.execute("DELETE FROM deliveries WHERE question_id=?", (question_id,))
            return db.execute("DELETE FROM questions WHERE id=?", (question_id,)).rowcount > 0

    def _keep_withdrawals(self, db: Any, ids: list[str]) -> None:
        """Keep a withdrawal for every unexpired sealed copy the questions ``ids`` left with
        a holder (any row state: a question answered live may still wait sealed there)."""
        db.executemany("INSERT OR REPLACE INTO withdrawals (holder, question_id, peer_key, record_id, expires_at) "
                       "SELECT d.left_with, d.question_id, d.peer_key, d.left_record, q.expires_at "
                       "FROM deliveries d JOIN questions q ON q.id = d.question_id "
                       "WHERE d.question_id = ? AND d.left_with IS NOT NULL AND q.expires_at > ?",
                       [(i, float(self.clock())) for i in ids])

    def withdrawals(self) -> list[dict[str, Any]]:
        """The sealed copies of removed questions still to withdraw at their holders
        (specs/sealed.md §10), oldest expiry first; expired ones are forgotten first (the
        holder drops those itself).

        Returns:
            ``[{"holder", "questionId", "peerKey", "recordId", "expiresAt"}]``; ``recordId``
            None for a copy left before its id was recorded (the withdrawing side computes
            it from the kept cards).
        """
        with self._tx() as db:
            db.execute("DELETE FROM withdrawals WHERE expires_at <= ?", (float(self.clock()),))
            rows = db.execute("SELECT holder, question_id, peer_key, record_id, expires_at FROM withdrawals "
                              "ORDER BY expires_at, holder, question_id, peer_key").fetchall()
        return [{"holder": h, "questionId": q, "peerKey": p, "recordId": r, "expiresAt": _iso(e)}
                for h, q, p, r, e in rows]

    def withdrawn(self, holder: str, question_id: str, peer_key: str) -> None:
        """Forget one withdrawal: done at its holder (or nothing there to withdraw)."""
        with self._tx() as db:
            db.execute("DELETE FROM withdrawals WHERE holder=? AND question_id=? AND peer_key=?",
                       (holder, question_id, peer_key))

    def remove_done(self) -> list[str]:
        """Delete every question none of whose rows is open (answered, expired, failed);
        their sealed copies are kept to be withdrawn as :meth:`remove` does. Returns their
        ids."""
        with self._tx() as db:
            ids = [r[0] for r in db.execute(
                "SELECT id FROM questions WHERE id NOT IN (SELECT question_id FROM deliveries "
                "WHERE state IN ('waiting','pending-approval'))")]
            self._keep_withdrawals(db, ids)
            db.executemany("DELETE FROM deliveries WHERE question_id=?", [(i,) for i in ids])
            db.executemany("DELETE FROM questions WHERE id=?", [(i,) for i in ids])
            return ids

    def mark_read(self, question_id: str) -> None:
        """Set ``read_at`` on the question's answered rows that were unread."""
        now = float(self.clock())
        with self._tx() as db:
            db.execute("UPDATE deliveries SET read_at=? WHERE question_id=? AND answer IS NOT NULL AND read_at IS NULL",
                       (now, question_id))

    # ------------------------------------------------------------------ reading
    def open_deliveries(self, limit: int = 10_000, *, peer_key: str | None = None,
                        skip: frozenset[str] = frozenset()) -> list[OpenDelivery]:
        """The open rows, oldest question first (at most ``limit``); only ``peer_key``'s
        when given, leaving out the question ids in ``skip``."""
        where = "d.state IN ('waiting','pending-approval')" + (" AND d.peer_key = ?" if peer_key else "")
        args: tuple[Any, ...] = (peer_key,) if peer_key else ()
        with self._lock:
            rows = self.db.execute(
                "SELECT d.question_id, q.request, d.peer_name, d.peer_key, d.state, d.from_copy FROM deliveries d "
                f"JOIN questions q ON q.id = d.question_id WHERE {where} "
                "ORDER BY q.created_at, d.question_id LIMIT ?", (*args, limit + len(skip))).fetchall()
        out: list[OpenDelivery] = []
        bad: list[tuple[str, str]] = []
        for qid, req, name, key, state, copied in rows:
            request = _request_of(req)
            if request is None:  # never sent: the row is closed, the others are delivered
                bad.append((qid, key))
            elif qid not in skip:
                out.append(OpenDelivery(qid, query_id_of(qid), request, name, key, state, bool(copied)))
        for qid, key in bad:
            self.fail(qid, key, "outbox-corrupt")
        return out[:limit]

    def open_peers(self) -> list[str]:
        """The keys of the peers with at least one open row (one indexed read)."""
        with self._lock:
            return [r[0] for r in self.db.execute(
                "SELECT DISTINCT peer_key FROM deliveries WHERE state IN ('waiting','pending-approval')")]

    def resolve(self, prefix: str) -> str:
        """The question id that ``prefix`` (4-32 hex characters, any case) names.

        Raises:
            ConfigError: ``outbox-not-found`` (no such id, or not hex),
                ``outbox-id-ambiguous`` (several ids start with it).
        """
        if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):
            raise ConfigError("outbox-not-found", f"{str(prefix)[:40]!r} is not an outbox id (4-32 hex characters)")
        p = prefix.lower()
        with self._lock:
            found = [r[0] for r in self.db.execute(
                "SELECT id FROM questions WHERE substr(id, 1, ?) = ? LIMIT 5", (len(p), p))]
        if not found:
            raise ConfigError("outbox-not-found", f"no question in the outbox has the id {p}",
                              hint="`kith outbox list` shows the ids")
        if len(found) > 1:
            raise ConfigError("outbox-id-ambiguous", f"{p} starts several ids: " + ", ".join(found),
                              hint="give more characters of the id")
        return found[0]

    def get(self, question_id: str) -> dict[str, Any] | None:
        """The record of one question (specs/outbox.md §2), or None."""
        records = list(self._records("WHERE q.id = ?", (question_id,)))
        return records[0] if records else None

    def list(self, *, limit: int = MAX_QUESTIONS) -> list[dict[str, Any]]:
        """Every record, newest question first (answers left out: :meth:`get` has them)."""
        return [{k: v for k, v in r.items() if k != "_answers"}
                for r in self._records("", (), order="DESC", limit=limit)]

    def records(self, *, limit: int = MAX_QUESTIONS) -> list[dict[str, Any]]:
        """Every record with its stored answers (for :func:`public_record`), newest first."""
        return list(self._records("", (), order="DESC", limit=limit))

    def usage(self) -> dict[str, int]:
        """``{"questions", "open", "bytes", "maxQuestions", "maxBytes"}``."""
        with self._lock:
            count, used, open_ = self.db.execute(
                "SELECT (SELECT COUNT(*) FROM questions), "
                "(SELECT COALESCE(SUM(bytes), 0) FROM questions) + (SELECT COALESCE(SUM(answer_bytes), 0) FROM deliveries), "
                "(SELECT COUNT(*) FROM deliveries WHERE state IN ('waiting','pending-approval'))").fetchone()
        return {"questions": count, "open": open_, "bytes": used, "maxQuestions": MAX_QUESTIONS, "maxBytes": MAX_BYTES}

    def _records(self, where: str, args: tuple[Any, ...], *, order: str = "ASC",
                 limit: int = MAX_QUESTIONS) -> Iterator[dict[str, Any]]:
        try:
            qs, ds = self._rows(where, args, order, limit)
        except sqlite3.DatabaseError as exc:  # a damaged page read now, not at open
            raise _fault(self.path, exc) from None
        yield from _shaped(qs, ds)

    def _rows(self, where: str, args: tuple[Any, ...], order: str, limit: int) -> tuple[list[Any], dict[str, Any]]:
        with self._lock:
            qs = self.db.execute(f"SELECT q.id, q.request, q.created_at, q.expires_at FROM questions q {where} "
                                 f"ORDER BY q.created_at {order}, q.id LIMIT ?", (*args, limit)).fetchall()
            ds: dict[str, list[tuple[Any, ...]]] = {}
            for q in qs:
                ds[q[0]] = self.db.execute(
                    "SELECT peer_name, peer_key, state, attempts, code, last_attempt_at, approval_id, answer, "
                    "answered_at, read_at, from_copy, copy_as_of, left_with FROM deliveries WHERE question_id=? "
                    "ORDER BY rowid",
                    (q[0],)).fetchall()
        return qs, ds


def _shaped(qs: list[Any], ds: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The records of the rows :meth:`OutboxStore._rows` read."""
    for qid, req, created, expires in qs:
        request = _request_of(req)  # None: unreadable (outbox-corrupt), shown so it can be removed
        peers = []
        answers = []
        for name, key, state, attempts, code, last, aid, answer, answered, read, copied, as_of, left in ds[qid]:
            peers.append({"name": name, "key": key, "state": state, "attempts": attempts, "code": code,
                          "lastAttemptAt": _iso(last), "approvalId": aid, "answeredAt": _iso(answered),
                          "readAt": _iso(read), "fromCopy": bool(copied), "copyAsOf": as_of,
                          "leftWith": left})
            answers.append(_answer_of(answer) if request is not None else None)
        yield {"id": qid, "query": request.get("query") if request else None, "request": request, "createdAt": _iso(created),
               "expiresAt": _iso(expires), "state": overall_state([p["state"] for p in peers]),
               "unread": any(p["answeredAt"] and not p["readAt"] for p in peers),
               "peers": peers, "_answers": answers}


#: the ``deliveries`` columns added after the first outbox files (column -> its type)
_ADDED_COLUMNS = {"from_copy": "INTEGER NOT NULL DEFAULT 0", "copy_as_of": "TEXT",
                  "left_with": "TEXT",  # the holder a sealed copy was left with (specs/sealed.md)
                  "left_record": "TEXT"}  # that copy's record id: what a withdrawal names


def _missing_columns(db: Any) -> list[str]:
    """The :data:`_ADDED_COLUMNS` the file's ``deliveries`` table lacks (a file an older
    Kith made; none when the table itself is missing: the schema check refuses that)."""
    have = {r[1] for r in db.execute("PRAGMA table_info(deliveries)")}
    return [c for c in _ADDED_COLUMNS if have and c not in have]


def _add_copy_columns(db: Any) -> None:
    """Give a file made before copies (specs/copies.md §6) and sealed copies
    (specs/sealed.md) their :data:`_ADDED_COLUMNS` (an ``ALTER TABLE``; two processes racing
    to add them is harmless: the loser finds them there)."""
    for column in _missing_columns(db):
        try:
            db.execute(f"ALTER TABLE deliveries ADD COLUMN {column} {_ADDED_COLUMNS[column]}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):
                raise


def open_home_db_checked(path: Path) -> Any:
    """:func:`node.common.home.open_home_db` for the outbox, refusing a file that is not a
    SQLite database.

    Raises:
        ConfigError: ``outbox-corrupt``.
    """
    from node.common.home import open_home_db

    try:
        return open_home_db(path)
    except sqlite3.DatabaseError as exc:
        raise _fault(path, exc) from None


def _open_readonly(path: Path) -> Any:
    """:func:`node.common.home.open_home_db_readonly` for the outbox.

    Raises:
        KithError: ``outbox-corrupt``, ``io-error`` (:func:`_fault`).
    """
    from node.common.dbfaults import os_fault
    from node.common.home import open_home_db_readonly

    try:
        return open_home_db_readonly(path)
    except sqlite3.DatabaseError as exc:
        raise _fault(path, exc) from None
    except OSError as exc:
        raise os_fault(exc, str(path)) from None


def _fault(path: Path, exc: sqlite3.DatabaseError) -> KithError:
    """What a SQLite failure on the outbox file means (:func:`node.common.dbfaults.sqlite_fault`):
    ``disk-full`` or ``io-error`` — the file is intact, moving it aside would abandon its
    questions — and ``outbox-corrupt`` only for bytes that are not (the outbox's) SQLite."""
    from node.common.dbfaults import sqlite_fault

    return sqlite_fault(exc, path, lambda: _corrupt(path, exc)) or _corrupt(path, exc)


def _corrupt(path: Path, exc: Exception) -> ConfigError:
    return ConfigError("outbox-corrupt", f"{path} is not a readable outbox ({str(exc)[:80]})",
                       hint=f"move it aside (mv {path} {path}.bad); nothing else in the home depends on it",
                       status=500)


def empty_usage() -> dict[str, int]:
    """The ``usage`` of a home where nothing was ever kept (no file; reading creates none)."""
    return {"questions": 0, "open": 0, "bytes": 0, "maxQuestions": MAX_QUESTIONS, "maxBytes": MAX_BYTES}


def _request_of(text: Any) -> dict[str, Any] | None:
    """A stored request, or None when it is not a JSON object with a string ``query`` (a
    hand-edited or damaged row: specs/outbox.md §2, ``outbox-corrupt``)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("query"), str) else None


def _answer_of(text: Any) -> dict[str, Any] | None:
    """A stored answer (the host's ``results`` message), or None when there is none or it
    is not a JSON object (a damaged row counts as not answered in the merged answer)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def request_body(request: dict[str, Any]) -> str:
    """The stored form of a request (``questions.request``; its length is ``bytes``):
    compact, sorted JSON without a ``query_id`` (each delivery sets its own)."""
    return json.dumps({k: v for k, v in request.items() if k != "query_id"}, ensure_ascii=False,
                      separators=(",", ":"), sort_keys=True)


def _check_room(db: Any, request_bytes: int) -> None:
    count, used = db.execute(
        "SELECT (SELECT COUNT(*) FROM questions), (SELECT COALESCE(SUM(bytes), 0) FROM questions) + "
        "(SELECT COALESCE(SUM(answer_bytes), 0) FROM deliveries)").fetchone()
    if count >= MAX_QUESTIONS or used + request_bytes > MAX_BYTES:
        raise ConfigError("outbox-full", f"the outbox keeps {count} question(s) in {used / 2**20:.1f} MiB; it holds at most "
                          f"{MAX_QUESTIONS} questions and {MAX_BYTES // (1024 * 1024)} MiB")


def overall_state(states: list[str]) -> str:
    """A question's state from its rows' (specs/outbox.md §2): ``waiting`` while any row
    is open, else ``answered`` when every row was answered, ``partial`` when some were,
    else ``expired`` or ``failed``."""
    if any(s in OPEN_STATES for s in states):
        return "waiting"
    if states and all(s == "answered" for s in states):
        return "answered"
    if any(s == "answered" for s in states):
        return "partial"
    return "expired" if "expired" in states else "failed"


def merged_answer(record: dict[str, Any]) -> dict[str, Any]:
    """The merged, attributed envelope (``specs/ask.schema.json``) of a record's stored
    answers, as ``kith ask`` would have printed it had every peer answered at once: one row
    per peer (``ok`` / ``no-verified-results`` / ``pending-approval`` from its stored
    answer; ``unreachable`` with the row's code while it waits)."""
    from node.guest.fanout import PeerRow, _row_from_message, build_envelope

    rows: list[PeerRow] = []
    answers: dict[int, list[dict[str, Any]]] = {}
    for i, (peer, message) in enumerate(zip(record["peers"], record["_answers"])):
        row = PeerRow(peer["name"], peer["key"])
        if message is not None:
            answers[i] = _row_from_message(row, message)
        else:
            row.status, row.code = "unreachable", peer["code"] or "outbox-waiting"
        rows.append(row)
        row.path = None
    request = record["request"]
    top_k = int(request.get("topK", 5))
    return build_envelope(request, rows, answers, timeout_s=0, elapsed_ms=0, top_k=top_k)


def public_record(record: dict[str, Any], *, answer: bool = True) -> dict[str, Any]:
    """The record as ``kith outbox show --json`` and the API print it: without the stored
    messages, with ``answer`` (:func:`merged_answer`) when asked for and any row has one."""
    out = {k: v for k, v in record.items() if k != "_answers"}
    if answer:
        readable = record["request"] is not None and any(a is not None for a in record["_answers"])
        out["answer"] = merged_answer(record) if readable else None
    return out


#: The per-peer statuses of ``kith ask`` that ``--later`` keeps the question for: the peer
#: was not reached in time, or its answer is not complete yet (its owner's approval, its
#: quota).
LATER_STATUSES = ("unreachable", "peer-timeout", "pending-approval", "rate-limited")


def later_peers(envelope: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a merged envelope whose live host still owes its answer — what
    ``--later`` keeps the question for (specs/outbox.md §1): a status of
    :data:`LATER_STATUSES`; a row this node's copy answered (``fromCopy``: the host was
    not reached, or with ``--copy`` not asked); a ``--copy`` row with no copy
    (``copy-not-found``: the host was not asked). Never this node's own row, never a row
    without a pinned key."""
    return [p for p in envelope["peers"]
            if p["key"] and not p.get("self")
            and (p["status"] in LATER_STATUSES or p.get("fromCopy") or p["code"] == "copy-not-found")]


def keep_for_later(home: Path, request: dict[str, Any], envelope: dict[str, Any], *,
                   keep_s: int = DEFAULT_KEEP_S) -> dict[str, Any] | None:
    """Queue ``request`` for every peer of a ``kith ask`` envelope :func:`later_peers`
    names (the ``--later`` choice: MCP ``ask_later``, local API ``POST /outbox`` too), and
    say so in the envelope's ``outbox`` member. A row answered from a copy is kept too,
    marked ``fromCopy`` / ``copyAsOf`` in the record: the copy answered now, the live
    host's answer is delivered when it is back (specs/copies.md §6).

    Args:
        home: the node home. request: the flat request as asked (``citations`` included).
        envelope: the merged envelope (:func:`node.guest.fanout.fan_out`); its
            ``outbox`` is set to the result.
        keep_s: seconds to keep it.

    Returns:
        ``{"id", "peers": [names], "expiresAt"}`` or None when every peer answered (or
        was refused for good).

    Raises:
        ConfigError: ``outbox-full``.
    """
    rows = later_peers(envelope)
    info = None
    if rows:
        copied = {p["key"]: p.get("copyAsOf") for p in rows if p.get("fromCopy")}
        with OutboxStore(home) as store:
            rec = store.add({k: v for k, v in request.items() if k != "query_id"},
                            [(p["name"], p["key"]) for p in rows], keep_s=keep_s, from_copy=copied)
        info = {"id": rec["id"], "peers": [p["name"] for p in rows], "expiresAt": rec["expiresAt"]}
    envelope["outbox"] = info
    return info


def _iso(t: Any) -> str | None:
    """A stored time as RFC 3339 UTC; None when unset, or when the column holds something
    that is not a time (a hand-edited or damaged row: that row reads without it, the
    others are untouched)."""
    if t is None or isinstance(t, bool) or not isinstance(t, (int, float)):
        return None
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return None


__all__ = ["OutboxStore", "Outcome", "OpenDelivery", "classify", "merged_answer", "overall_state", "parse_keep",
           "public_record", "query_id_of", "keep_for_later", "later_peers", "LATER_STATUSES", "DEFAULT_KEEP_S", "MAX_QUESTIONS", "MAX_BYTES", "STATES"]
