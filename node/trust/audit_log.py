"""The audit log ``<home>/audit.jsonl``: its writer and reader (specs/peers.md §7).

Append-only JSON Lines, one record per line, mode 0600: who connected, what they asked,
what they were served (source ids only, never chunk text), approvals, revocations, blocks,
policy reloads and refused handshakes. Size-rotated: when a write would take the file past
:data:`MAX_AUDIT_BYTES` it becomes ``audit.jsonl.1`` (``.1`` → ``.2`` … up to
:data:`AUDIT_KEEP` files; the oldest is dropped). Records are written whole lines at a
time on an ``O_APPEND`` descriptor under an ``flock`` on ``audit.jsonl.lock``, so the
host and ``kith peers``/``kith approvals`` in other processes never interleave or lose a
rotation; the file is fsync'ed when a session ends (and on close).

The owner's commands write each record at once. A running host *batches*
(:meth:`AuditLog.start_batching`): its records wait in memory and are appended together —
one lock and one ``write`` per batch — at most :data:`BATCH_S` after the first of them, or
as soon as :data:`BATCH_RECORDS` records / :data:`BATCH_BYTES` bytes are waiting, when a
session ends (with the fsync) and when the host exits; a crash of the host loses at most
the batch not yet written (specs/peers.md §7). A record written with ``sync=True`` (a
session's end, a sealed answer's ``results``) writes the batch at once with the fsync.

Queries are recorded as a keyed hash by default (HMAC-SHA-256 with ``<home>/audit.key``,
32 random bytes, 0600, made on first use, first 32 hex kept): equal queries of a peer are
recognisable, the text is not readable from the log, and a copied log alone cannot be
checked against guessed queries. ``kith host --audit-queries`` records the text instead.

:class:`AuditLog` writes; :func:`read_audit` reads (a corrupt or truncated line is
reported as ``audit-line-invalid`` and skipped, never fatal). The host's tap that turns its
events, incoming queries and outgoing ``results`` frames into records is
:class:`node.host.audit.HostAudit`; the owner's commands (``kith peers``, ``kith
approvals``) write through :class:`AuditLog` directly.
"""

from __future__ import annotations

import fcntl
import hmac
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec

from node.common.home import open_append, open_regular, read_regular

log = logging.getLogger("kith.audit")

AUDIT_FILE = "audit.jsonl"
AUDIT_KEY_FILE = "audit.key"
#: Size (bytes) past which the log is rotated.
MAX_AUDIT_BYTES = 8 << 20
#: Rotated files kept (``audit.jsonl.1`` newest … ``audit.jsonl.<AUDIT_KEEP>`` oldest).
AUDIT_KEEP = 3
#: Longest query text recorded with ``--audit-queries`` (characters; the wire allows 2000).
MAX_QUERY_CHARS = 2000
#: Source ids recorded per ``results`` record (a results frame carries at most 20).
MAX_SOURCES = 50
#: A line longer than this (bytes) is not a record (the reader's bound).
MAX_LINE_BYTES = 64 << 10
#: Longest a batched record waits in memory before it is written (seconds).
BATCH_S = 0.05
#: Records / bytes waiting that are written at once, without waiting for :data:`BATCH_S`.
BATCH_RECORDS = 64
BATCH_BYTES = 64 << 10


#: The last whole second :func:`now_stamp` formatted and its text up to the seconds (one
#: tuple, replaced whole: a thread reads a matching pair; a race formats a second twice).
_second: tuple[int, str] = (-1, "")


def now_stamp() -> str:
    """RFC 3339 UTC with milliseconds, truncated (not rounded), e.g.
    ``2026-12-01T09:00:00.123Z``. The date and time up to the second are formatted once per
    second (two records per answer made them ~5 µs each, specs/peers.md §7)."""
    global _second
    now = time.time()
    sec = int(now)
    last = _second
    if last[0] != sec:
        last = _second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return f"{last[1]}.{int((now - sec) * 1000):03d}Z"


#: One record's JSON: compact, UTF-8 (not ``\\u`` escapes), a value JSON has no type for
#: written as its ``str()`` (a path, an id object).
_encoder = msgspec.json.Encoder(enc_hook=str)


def _encode_line(rec: dict[str, Any]) -> bytes:
    """``rec`` as one audit line: compact JSON and a newline (UTF-8 bytes). A string that
    is not UTF-8 text (a lone surrogate) cannot be written raw: then the whole line is
    written with ``\\u`` escapes (valid JSON, read back as it was), never an error."""
    try:
        return _encoder.encode(rec) + b"\n"
    except UnicodeEncodeError:
        return (json.dumps(_finite(rec), separators=(",", ":"), default=str, allow_nan=False)
                + "\n").encode("ascii")


def _finite(value: Any) -> Any:
    """``value`` with each float that is not finite as None (what the msgspec encoder
    writes; ``json.dumps`` would write ``NaN``, which is not JSON) and each mapping's keys as
    strings, for :func:`_encode_line`'s escaped line."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_finite(v) for v in value]
    return value


class AuditLog:
    """Append records to ``<home>/audit.jsonl``. Safe to share between threads.

    Args:
        home: the node home.
        audit_queries: record query text (``kith host --audit-queries``) instead of its
            keyed hash.
        max_bytes / keep: rotation bounds (:data:`MAX_AUDIT_BYTES`, :data:`AUDIT_KEEP`).

    Writing never raises: an ``OSError`` (disk full, read-only home) is logged once as a
    warning and the record is lost, so the audit log cannot stop a host from serving.
    Records are written at once unless :meth:`start_batching` was called.
    """

    def __init__(self, home: Path, *, audit_queries: bool = False, max_bytes: int = MAX_AUDIT_BYTES,
                 keep: int = AUDIT_KEEP) -> None:
        self.home = Path(home)
        self.path = self.home / AUDIT_FILE
        self.audit_queries = audit_queries
        self.max_bytes = max_bytes
        self.keep = keep
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._lock_fd: int | None = None  # <home>/audit.jsonl.lock, flocked per record
        self._key: bytes | None = None
        self._warned = False
        #: batching (start_batching): lines waiting, their bytes, and whether a flush is armed
        self._schedule: Callable[[Callable[[], None]], None] | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._armed = False

    def start_batching(self, schedule: Callable[[Callable[[], None]], None]) -> None:
        """Batch records from now on: ``schedule(flush)`` is called when the first record
        of a batch is waiting and must arrange for ``flush`` to be called within
        :data:`BATCH_S` (the host uses its event loop: :func:`loop_schedule`). Records are
        also written at once when :data:`BATCH_RECORDS` / :data:`BATCH_BYTES` are waiting,
        with ``sync`` (session end), and by :meth:`flush` / :meth:`close`."""
        with self._lock:
            self._schedule = schedule

    def stop_batching(self) -> None:
        """Write what is waiting and write each record at once from now on."""
        with self._lock:
            self._schedule = None
            self._write_pending(False)

    def flush(self) -> None:
        """Write the records waiting in the batch (one lock, one write; nothing when none)."""
        with self._lock:
            self._write_pending(False)

    # --- writing ------------------------------------------------------------------------
    def record(self, event: str, *, sync: bool = False, **fields: Any) -> None:
        """Append ``{"ts", "event", **fields}`` (fields that are None are left out).

        Args:
            event: the record kind (specs/peers.md §7 lists them).
            sync: fsync after the write (session end).
        """
        rec = {"ts": now_stamp(), "event": event, **{k: v for k, v in fields.items() if v is not None}}
        line = _encode_line(rec)
        if len(line) > MAX_LINE_BYTES:  # never write a line the reader would refuse
            rec = {"ts": rec["ts"], "event": event, "truncated": True,
                   **{k: rec[k] for k in ("session_id", "peer", "peer_name") if k in rec}}
            line = _encode_line(rec)
        arm = None
        with self._lock:
            self._pending.append(line)
            self._pending_bytes += len(line)
            if sync or self._schedule is None or len(self._pending) >= BATCH_RECORDS \
                    or self._pending_bytes >= BATCH_BYTES:
                self._write_pending(sync)
            elif not self._armed:
                self._armed = True
                arm = self._schedule
        if arm is not None:
            try:
                arm(self.flush)
            except RuntimeError:  # the loop is gone (the host is exiting): write now
                self.flush()

    def _write_pending(self, sync: bool) -> None:
        """Write the waiting lines (caller holds ``self._lock``); never raises."""
        lines, self._pending, self._pending_bytes, self._armed = self._pending, [], 0, False
        if not lines:
            return
        try:
            try:
                self._write(lines, sync)
            except FileNotFoundError:  # the home (or the lock file) went away: start over
                self._drop_lock_fd()
                self._write(lines, sync)
        except OSError as exc:
            self._drop_lock_fd()
            if not self._warned:
                self._warned = True
                log.warning("could not write the audit log (%s); records are being lost", exc.strerror)

    def _write(self, lines: list[bytes], sync: bool) -> None:
        # the lock file stays open between batches (one flock/unlock pair per batch, not
        # mkdir + open + close); it is reopened after an error
        lock_fd = self._lock_fd
        if lock_fd is None:
            self.home.mkdir(parents=True, exist_ok=True)
            lock_fd = self._lock_fd = os.open(self.home / (AUDIT_FILE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            fd = self._current_fd()
            size = os.fstat(fd).st_size
            start = 0
            while start < len(lines):
                # as many whole lines as fit before the rotation bound (at least one)
                end, room = start, self.max_bytes - size
                while end < len(lines) and (end == start or len(lines[end]) <= room):
                    room -= len(lines[end])
                    end += 1
                chunk = b"".join(lines[start:end]) if end - start > 1 else lines[start]
                if size and size + len(chunk) > self.max_bytes:
                    self._rotate()
                    fd = self._current_fd()
                    size = 0
                    continue  # refit the lines into the new, empty file
                _write_all(fd, chunk)
                size += len(chunk)
                start = end
            if sync:
                os.fsync(fd)
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def _drop_lock_fd(self) -> None:
        if self._lock_fd is not None:
            try:
                os.close(self._lock_fd)
            except OSError:
                pass
            self._lock_fd = None

    def _current_fd(self) -> int:
        """The descriptor of the *current* ``audit.jsonl`` (reopened when another process
        rotated it); a file left ending mid-line (a crash) gets a newline first, so the
        next record is never glued to the broken one."""
        if self._fd is not None:
            try:
                same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return self._fd
            os.close(self._fd)
            self._fd = None
        fd = open_append(self.path)  # a FIFO in its place: refused, never a host hung at its first line
        os.fchmod(fd, 0o600)
        size = os.fstat(fd).st_size
        if size:
            with open(self.path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    os.write(fd, b"\n")
        self._fd = fd
        return fd

    def _rotate(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        for i in range(self.keep, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{AUDIT_FILE}.{i - 1}")
            try:
                os.replace(src, self.path.with_name(f"{AUDIT_FILE}.{i}"))
            except FileNotFoundError:
                pass
        if self.keep < 1:
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Write what is waiting, fsync and close the log (idempotent; batching stops)."""
        with self._lock:
            self._schedule = None
            self._write_pending(False)
            if self._fd is not None:
                try:
                    os.fsync(self._fd)
                except OSError:
                    pass
                os.close(self._fd)
                self._fd = None
            self._drop_lock_fd()

    # --- queries --------------------------------------------------------------------------
    def query_fields(self, text: str) -> dict[str, str]:
        """``{"query": text}`` with ``audit_queries``, else ``{"query_hmac": <32 hex>}``."""
        if self.audit_queries:
            return {"query": text[:MAX_QUERY_CHARS]}
        # surrogatepass: a lone surrogate is hashed, not raised (the same bytes for UTF-8 text)
        return {"query_hmac": hmac.digest(self._hmac_key(), text.encode("utf-8", "surrogatepass"),
                                          "sha256").hex()[:32]}

    def check_key(self) -> str | None:
        """Read the key of the query hashes now, writing nothing — ``kith host`` calls it at
        start when queries are hashed, so a key that cannot be read refuses the start instead
        of failing every guest query. A missing or damaged key is made when the first query
        is hashed, so a start refused later leaves the home as it was.

        Returns:
            A warning to show when the key is damaged (not 32 bytes: a new one will be
            made), else None.

        Raises:
            ConfigError: ``io-error`` naming ``audit.key`` and the way out.
        """
        if self.audit_queries:
            return None
        key = self._read_key()
        if key and len(key) != 32:  # damaged: said once, never replaced without a word
            return (f"{self.home / AUDIT_KEY_FILE} was not a 32-byte key ({len(key)} bytes): a new one is made; "
                    "query hashes recorded before it no longer match new ones")
        return None

    def _read_key(self) -> bytes:
        """The bytes of ``audit.key`` (empty when it does not exist).

        Raises:
            ConfigError: ``io-error`` when it cannot be read.
        """
        path = self.home / AUDIT_KEY_FILE
        try:
            return read_regular(path)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            from node.common.errors import ConfigError

            raise ConfigError(
                "io-error", f"the audit's query key cannot be read: {exc.strerror or type(exc).__name__} ({path})",
                hint=f"move it aside (`mv {path} {path}.bad`): a new key is made at the next start; query "
                     "hashes recorded before it can no longer be matched to new ones (or start with "
                     "--audit-queries, which records the text instead)") from None

    def make_key(self) -> None:
        """Make the key of the query hashes now when it is missing or damaged (``kith host``
        calls it once every refusal of its start is behind it, before it publishes). A no-op
        when queries are recorded as text.

        Raises:
            ConfigError: ``io-error`` when it cannot be read; ``OSError`` when it cannot be written.
        """
        if not self.audit_queries:
            self._hmac_key()

    def _hmac_key(self) -> bytes:
        if self._key is None:
            key = self._read_key()
            if len(key) != 32:  # missing, or damaged (check_key said so at the host's start)
                from node.common.home import atomic_write

                key = os.urandom(32)
                atomic_write(self.home / AUDIT_KEY_FILE, key)
            self._key = key
        return self._key


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a regular file takes it whole; a
    short write, e.g. a signal, continues where it stopped)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def loop_schedule(loop: Any) -> Callable[[Callable[[], None]], None]:
    """A :meth:`AuditLog.start_batching` scheduler on an asyncio ``loop``: ``fn`` runs on
    the loop :data:`BATCH_S` later; callable from the loop's thread and from worker
    threads (raises ``RuntimeError`` once the loop is closed)."""
    owner = threading.get_ident()

    def schedule(fn: Callable[[], None]) -> None:
        if threading.get_ident() == owner:
            loop.call_later(BATCH_S, fn)
        else:
            loop.call_soon_threadsafe(loop.call_later, BATCH_S, fn)

    return schedule


# ------------------------------------------------------------------------------- reading
@dataclass
class AuditProblem:
    """A line of the log that is not a record (``audit-line-invalid``)."""

    file: str
    line: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        """``{"code": "audit-line-invalid", "file", "line", "message"}``."""
        return {"code": "audit-line-invalid", "file": self.file, "line": self.line, "message": self.message}


def audit_files(home: Path) -> list[Path]:
    """The log's files, oldest first (``audit.jsonl.<n>`` … ``audit.jsonl.1``, ``audit.jsonl``)."""
    base = Path(home) / AUDIT_FILE
    rotated = []
    for p in base.parent.glob(AUDIT_FILE + ".*"):
        suffix = p.name[len(AUDIT_FILE) + 1:]
        if suffix.isdigit():
            rotated.append((int(suffix), p))
    out = [p for _, p in sorted(rotated, reverse=True)]
    if base.exists():
        out.append(base)
    return out


def read_audit(home: Path, problems: list[AuditProblem]) -> Iterator[dict[str, Any]]:
    """Yield every record of the log, oldest first.

    A line that is not a JSON object with string ``ts`` and ``event`` (bad JSON, a
    truncated last line without its newline, longer than :data:`MAX_LINE_BYTES`, not
    UTF-8) is appended to ``problems`` and skipped; an unreadable file likewise.
    """
    for path in audit_files(home):
        try:
            fh = os.fdopen(open_regular(path), "rb")
        except OSError as exc:
            problems.append(AuditProblem(path.name, 0, f"cannot be read ({exc.strerror})"))
            continue
        with fh:
            n = 0
            while True:
                raw = fh.readline(MAX_LINE_BYTES + 1)  # bounded: never a whole corrupt file at once
                if not raw:
                    break
                n += 1
                if len(raw) > MAX_LINE_BYTES:
                    while raw and not raw.endswith(b"\n"):  # skip the rest of the overlong line
                        raw = fh.readline(MAX_LINE_BYTES + 1)
                    problems.append(AuditProblem(path.name, n, "longer than a record may be"))
                    continue
                if not raw.endswith(b"\n"):
                    problems.append(AuditProblem(path.name, n, "truncated (no end of line)"))
                    break
                if raw.strip() == b"":
                    continue
                try:
                    rec = _loads(raw)
                except (UnicodeDecodeError, ValueError):
                    problems.append(AuditProblem(path.name, n, "not valid JSON"))
                    continue
                if not isinstance(rec, dict) or not isinstance(rec.get("ts"), str) \
                        or not isinstance(rec.get("event"), str):
                    problems.append(AuditProblem(path.name, n, "not an audit record (no ts/event)"))
                    continue
                yield rec


#: Bytes read per step when the log is read from its end (:func:`read_audit_tail`).
TAIL_BLOCK_BYTES = 64 << 10


def _loads(raw: bytes) -> Any:
    """One line's JSON as values every reader can print: ``NaN``/``Infinity`` (an older
    writer's, not JSON) read as None, and a lone surrogate that a ``\\u`` escape spells
    (:func:`_encode_line`'s escaped line) as U+FFFD — printing it raised UnicodeEncodeError.

    Raises:
        UnicodeDecodeError, ValueError: the line is not UTF-8 JSON.
    """
    value = json.loads(raw.decode("utf-8"), parse_constant=lambda _name: None)
    return _text_only(value) if b"\\u" in raw else value


def _text_only(value: Any) -> Any:
    """``value`` with each string's lone surrogates replaced by U+FFFD (pairs are kept)."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_text_only(k): _text_only(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text_only(v) for v in value]
    return value


def _record(raw: bytes) -> dict[str, Any] | None:
    """The record of one line (without its newline), or None when it is not one."""
    try:
        rec = _loads(raw)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("ts"), str) or not isinstance(rec.get("event"), str):
        return None
    return rec


def read_audit_tail(home: Path, max_bytes: int, block: int = TAIL_BLOCK_BYTES) -> Iterator[dict[str, Any]]:
    """Yield the records of the log's last ``max_bytes`` bytes, newest first — what a view
    of recent activity needs (``kith status``), never the whole log (up to
    (:data:`AUDIT_KEEP` + 1) × :data:`MAX_AUDIT_BYTES`). Files are read backwards in
    :data:`TAIL_BLOCK_BYTES` steps, the current file first, then the rotated ones. A line
    cut by the bound, longer than :data:`MAX_LINE_BYTES`, left without its newline (a
    crash) or not a record is skipped silently (``kith audit`` reports such lines); an
    unreadable file ends the read.

    Args:
        home: the node home. max_bytes: the most bytes read, over every file.
        block: bytes read per step (:data:`TAIL_BLOCK_BYTES`).
    """
    budget = max(0, int(max_bytes))
    for path in reversed(audit_files(home)):
        if budget <= 0:
            return
        try:
            fh = os.fdopen(open_regular(path), "rb")
        except OSError:
            return
        with fh:
            try:
                pos = fh.seek(0, os.SEEK_END)
            except OSError:
                return
            carry = b""  # the start of a line whose beginning is not read yet
            tail = True  # the bytes after the file's last newline: a line cut by a crash
            while pos > 0 and budget > 0:
                step = min(block, pos, budget)
                pos -= step
                budget -= step
                fh.seek(pos)
                lines = (fh.read(step) + carry).split(b"\n")
                carry = lines.pop(0)  # incomplete until the byte before it is read
                if len(carry) > MAX_LINE_BYTES:
                    carry = b"\xff" * (MAX_LINE_BYTES + 1)  # never a record: kept short, skipped at the end
                if tail:  # what follows the file's last newline (empty when it ends with one): never a record
                    if not lines:
                        continue  # no newline in this block yet: all of it is that tail
                    lines.pop()
                    tail = False
                for raw in reversed(lines):
                    rec = _record(raw) if raw.strip() and len(raw) <= MAX_LINE_BYTES else None
                    if rec is not None:
                        yield rec
            if pos == 0 and not tail and carry.strip() and len(carry) <= MAX_LINE_BYTES:
                rec = _record(carry)  # the file's first line, whole
                if rec is not None:
                    yield rec


def audit_size(home: Path) -> int:
    """Bytes the log holds now, over its files (0 when a file cannot be read)."""
    total = 0
    for path in audit_files(home):
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total


__all__ = ["AUDIT_FILE", "AuditLog", "AuditProblem", "audit_files", "audit_size", "loop_schedule", "read_audit",
           "read_audit_tail"]
