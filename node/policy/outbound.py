"""The outbound gate: what an agent (or the owner) sends to peers, seen before it leaves
(issue 41 items 3-4, specs/agents.md §5-§6).

Every question a local door sends to peers passes :func:`gate` before its first byte is
sent. The gate :func:`check`\\ s the text and holds it when it carries

- ``private-text``: a span of 12 or more consecutive words of this node's own text that a
  receiving peer may not see (the owner's policy: the source's tier hides it from that
  peer, and no source it may see holds the same span), matched after case, whitespace and
  punctuation are normalised (:func:`words`);
- a value the scrub detectors flag (``email``, ``phone``, ``card``, ``iban``;
  :mod:`node.common.scrub`);
- a ``secret`` (private-key blocks, common API-key shapes; the scrub's ``secret``).

The agent's rule then decides (:data:`node.local.agents.OUTBOUND_RULES`): ``allow`` sends
and logs it; ``block`` refuses it with ``outbound-held`` (naming the kinds and source ids,
never the text); ``ask`` asks the person — a ``confirm`` callback (a terminal prompt) when
the caller has one, else it is refused with ``outbound-needs-confirmation`` and an id that
``kith sent approve ID`` releases for one identical retry within
:data:`APPROVAL_TTL_S` (after which it is denied). ``yes`` (``--yes``) sends a held
question. A hold never sends a partial question: it is all or nothing.

Every decision is appended to ``<home>/sent.jsonl`` (0600, rotated at
:data:`MAX_LOG_BYTES` keeping :data:`LOG_KEEP` files, as the audit): the time, the agent
(or ``owner``), the peers, the text, the holds, the decision, and — in a second line with
the same id — what came back. ``kith sent`` reads it (:func:`read_log`).

**How private text is found.** At index time (and whenever the corpus generation moved
since) :func:`write_fingerprints` writes ``<home>/outbound.fp``: for every chunk, the
32-bit hashes of its 6-word shingles, winnowed with a window of 7 (so every run of 12 or
more words shared with a question contains at least one kept hash), with the chunk's row
id, sorted by hash. A check hashes every 6-word shingle of the question, looks them up,
and confirms each candidate chunk by reading that chunk's stored text from the corpus
record (one SQLite row per candidate, read-only) and finding a common run of 12 words;
the policy then says whether the chunk's source is hidden from each receiving peer. This
module imports neither the corpus package nor tantivy (guest commands stay light).
"""

from __future__ import annotations

import array
import bisect
import contextlib
import hashlib
import json
import mmap
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import unicodedata
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.common.errors import EgressRefused

#: Words in a span that may not leave (the issue's 12).
MIN_WORDS = 12
#: Words per shingle and the winnowing window: SHINGLE + WINDOW - 1 == MIN_WORDS, the
#: winnowing guarantee (any shared run of MIN_WORDS words shares a kept hash).
SHINGLE, WINDOW = 6, 7
#: Value kinds of the scrub that hold a question (``secret`` included).
VALUE_KINDS = ("email", "phone", "card", "iban", "secret")
FINGERPRINT_FILE = "outbound.fp"
#: Kept hashes :func:`write_fingerprints` sorts in memory at once (about 50 bytes each
#: while sorted, ~26 MB); the rest wait in sorted runs on disk. Writing the fingerprints
#: of any corpus holds at most about this many, not one per kept hash of the corpus.
SORT_RUN = 1 << 19
_U32 = 0xFFFFFFFF
LOG_FILE = "sent.jsonl"
APPROVALS_FILE = "sent-approvals.json"
#: Size (bytes) past which the log is rotated, and rotated files kept (as the audit).
MAX_LOG_BYTES = 8 << 20
LOG_KEEP = 3
#: Seconds a held question waits for ``kith sent approve``; then it is denied.
APPROVAL_TTL_S = 15 * 60
#: Seconds a terminal prompt waits for an answer; then the question is denied.
PROMPT_TIMEOUT_S = 60
#: The actor recorded for the owner at a terminal.
OWNER = "owner"
#: The fingerprint file's format (2: words without format characters and underscores).
_MAGIC = b"KITHFP2\n"
#: Letters and digits (an underscore, like any punctuation, separates words).
_WORD_RE = re.compile(r"[^\W_]+")
#: The invisible format characters (Unicode category Cf: soft hyphen, zero-width space and
#: joiners, bidi controls, word joiner, BOM, tags…): removed before words are split, so one
#: inside a word does not split it (a reader never sees it).
_FORMAT_RE = re.compile("[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
                        "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
                        "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
                        "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")


@dataclass(frozen=True)
class Hold:
    """One reason to hold a question: ``kind`` (``private-text`` or a value kind), the
    source id it came from (``private-text``), and the peer it is hidden from."""

    kind: str
    source: str | None = None
    peer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The hold as logged and reported (never the text)."""
        return {"kind": self.kind, "source": self.source, "peer": self.peer}


# --- normalisation and fingerprints ---------------------------------------------------------
#: ASCII text's fast path: every character that is not a word character becomes a space,
#: capitals become small (the same words as ``\w+`` over the case-folded text).
_ASCII_WORDS = {c: (chr(c).lower() if chr(c).isalnum() else " ") for c in range(128)}


def words(text: str) -> list[str]:
    """The words of ``text`` after normalisation: invisible format characters removed,
    NFKC, case folded, every run of punctuation (``_`` included) and whitespace (line
    breaks included) a separator."""
    if text.isascii():
        return text.translate(_ASCII_WORDS).split()
    return _WORD_RE.findall(unicodedata.normalize("NFKC", _FORMAT_RE.sub("", text)).casefold())


def _shingle_hashes(ws: Sequence[str]) -> list[int]:
    return [zlib.crc32(" ".join(ws[i:i + SHINGLE]).encode()) for i in range(len(ws) - SHINGLE + 1)]


def _winnow(hashes: list[int]) -> set[int]:
    """The winnowed hashes (the minimum of each window of :data:`WINDOW`)."""
    if len(hashes) <= WINDOW:
        return {min(hashes)} if hashes else set()
    return {min(hashes[i:i + WINDOW]) for i in range(len(hashes) - WINDOW + 1)}


def _corpus_db(home: Path) -> Path:
    return home / "corpus" / "corpus.sqlite3"


def _generation(db: sqlite3.Connection) -> int:
    try:
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name='changes'").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row else 0


def _connect(home: Path) -> sqlite3.Connection | None:
    path = _corpus_db(home)
    if not path.is_file():
        return None
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


def write_fingerprints(home: Path | str) -> dict[str, int]:
    """Write ``<home>/outbound.fp`` from the corpus record (every ``done`` document's
    chunks), atomically (0600). Called after a sync and whenever a check finds the file
    older than the corpus generation.

    Memory stays bounded whatever the corpus's size: the kept hashes are sorted
    :data:`SORT_RUN` at a time into runs in one temporary file in ``home`` (unnamed on
    POSIX: gone with the process, even a killed one), then merged in blocks (:func:`_merge_runs`)
    straight into the file — the same bytes as sorting them all at once (at 1M chunks that
    was ~27 M Python pairs, 3.4 GB of RSS in ``kith index sync``).

    Returns:
        ``{"generation", "chunks", "fingerprints", "bytes"}``.

    Raises:
        OSError: ``home`` cannot be written (the temporary runs or the file itself).
        OverflowError: a chunk's row id does not fit the file's 32 bits.
    """
    from node.common.home import atomic_writer

    home = Path(home)
    db = _connect(home)
    if db is None:
        return {"generation": 0, "chunks": 0, "fingerprints": 0, "bytes": 0}
    chunks = 0
    with tempfile.TemporaryFile(dir=home) as scratch:
        runs: list[tuple[int, int]] = []  # (byte offset in scratch, keys) of each sorted run
        keys: list[int] = []  # (hash << 32) | row id: sorting them sorts by (hash, row id)
        try:
            generation = _generation(db)
            rows = db.execute("SELECT c.rowid, c.text FROM chunks c JOIN documents d ON d.doc_id = c.doc_id "
                              "WHERE d.status = 'done'")
            for rowid, text in rows:
                chunks += 1
                if not 0 <= rowid <= _U32:
                    raise OverflowError(f"chunk row id {rowid} does not fit outbound.fp's 32 bits")
                keys.extend([(h << 32) | rowid for h in _winnow(_shingle_hashes(words(text)))])
                if len(keys) >= SORT_RUN:
                    runs.append(_spill(scratch, keys))
                    keys = []
        finally:
            db.close()
        if keys or not runs:
            runs.append(_spill(scratch, keys))
            keys = []
        count = sum(n for _, n in runs)
        header = _MAGIC + json.dumps({"generation": generation, "count": count}).encode() + b"\n"
        hi = 1 if sys.byteorder == "little" else 0  # the hash's half of a key's 8 bytes
        with atomic_writer(home / FINGERPRINT_FILE, 0o600) as out, \
                tempfile.TemporaryFile(dir=home) as rowids:
            out.write(header)  # then every hash in order, then every row id in the same order
            for block in _merge_runs(scratch, runs):
                halves = array.array("I")
                halves.frombytes(array.array("Q", block).tobytes())
                out.write(halves[hi::2].tobytes())
                rowids.write(halves[1 - hi::2].tobytes())
            rowids.seek(0)
            shutil.copyfileobj(rowids, out, 1 << 16)
    with _fp_lock:
        _fp_cache.pop(home, None)
    return {"generation": generation, "chunks": chunks, "fingerprints": count,
            "bytes": len(header) + 8 * count}


def _spill(scratch: Any, keys: list[int]) -> tuple[int, int]:
    """Sort ``keys`` and append them to ``scratch`` (8 bytes each, native order): returns
    the run's ``(byte offset, keys)``."""
    keys.sort()
    offset = scratch.seek(0, os.SEEK_END)
    scratch.write(array.array("Q", keys).tobytes())
    scratch.flush()
    return offset, len(keys)


def _merge_runs(scratch: Any, runs: list[tuple[int, int]]) -> Iterator[list[int]]:
    """The keys of the sorted ``runs`` (``(byte offset, keys)`` in the binary file
    ``scratch``, :func:`_spill`'s) in order, as sorted blocks; at most :data:`SORT_RUN`
    keys of all runs are read at once.

    Each round takes the smallest last key of the runs' current blocks as a bound: every
    key up to it that is still to come lies in those blocks, so they are cut there,
    sorted together and yielded, and each block used up is replaced by its run's next."""
    per_run = max(1, SORT_RUN // max(1, len(runs)))  # keys read ahead per run
    left = [n for _, n in runs]
    at = [offset for offset, _ in runs]

    def read(i: int) -> array.array:  # type: ignore[type-arg]
        n = min(per_run, left[i])
        block = array.array("Q")
        if n:
            scratch.seek(at[i])
            block.frombytes(scratch.read(8 * n))
            at[i] += 8 * n
            left[i] -= n
        return block

    blocks = [read(i) for i in range(len(runs))]
    pos = [0] * len(runs)
    while True:
        live = [i for i, b in enumerate(blocks) if pos[i] < len(b)]
        if not live:
            return
        bound = min(blocks[i][-1] for i in live)
        out: list[int] = []
        for i in live:
            block = blocks[i]
            cut = bisect.bisect_right(block, bound, pos[i])
            out.extend(block[pos[i]:cut])
            if cut == len(block):
                blocks[i], pos[i] = read(i), 0
            else:
                pos[i] = cut
        out.sort()
        yield out


@dataclass
class _Fingerprints:
    """The fingerprint file of one corpus generation, mapped read-only: ``hashes`` and
    ``rowids`` are ``uint32`` views of the file (sorted by hash, then row id), so a check
    reads only the pages its bisections touch, never the whole file (214 MB at 1M chunks)."""

    generation: int
    hashes: Sequence[int]
    rowids: Sequence[int]
    stamp: tuple[int, ...] = ()

    def lookup_all(self, wanted: Iterable[int]) -> set[int]:
        """The row ids of the chunks holding any of the hashes ``wanted``."""
        hashes, rowids, n = self.hashes, self.rowids, len(self.hashes)
        found: set[int] = set()
        left = bisect.bisect_left
        for h in wanted:
            i = left(hashes, h)
            while i < n and hashes[i] == h:
                found.add(rowids[i])
                i += 1
        return found


_fp_lock = threading.Lock()
_fp_cache: dict[Path, _Fingerprints] = {}


def _stat(path: Path) -> tuple[int, ...]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return (0,)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read_fingerprints(path: Path) -> _Fingerprints | None:
    """The fingerprint file at ``path`` mapped read-only (:class:`_Fingerprints`); None when
    it is absent, empty, cut short or not ours (the check then rewrites it). The map stays
    valid when the file is replaced (the old inode lives while mapped)."""
    from node.common.home import NotRegularFile, open_regular

    try:
        with os.fdopen(open_regular(path), "rb") as f:  # a FIFO: refused below, never a hang
            size = os.fstat(f.fileno()).st_size
            if size <= len(_MAGIC):
                return None
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        return None
    except NotRegularFile:
        return None  # a FIFO, socket or device in its place: not ours, the check rewrites it
    if mapped[:len(_MAGIC)] != _MAGIC:
        return None
    try:  # a file cut short or not ours reads as none: the check rewrites it
        end = mapped.find(b"\n", len(_MAGIC), len(_MAGIC) + 4096)
        if end < 0:
            return None
        meta = json.loads(mapped[len(_MAGIC):end])
        n = int(meta["count"])
        generation = int(meta["generation"])
        if n < 0 or size - (end + 1) != 8 * n:
            return None
        body = memoryview(mapped)[end + 1:]
        hashes = body[:4 * n].cast("I")
        rowids = body[4 * n:8 * n].cast("I")
    except (ValueError, TypeError, KeyError):
        return None
    return _Fingerprints(generation, hashes, rowids, _stat(path))


def fingerprints(home: Path | str, db: sqlite3.Connection | None = None) -> _Fingerprints | None:
    """The fingerprints of ``home``'s corpus, current with its generation (rebuilt when
    the corpus changed since they were written), kept in memory while the file is
    unchanged; None without a corpus."""
    home = Path(home)
    path = home / FINGERPRINT_FILE
    with _fp_lock:
        fp = _fp_cache.get(home)
        if fp is not None and fp.stamp != _stat(path):
            fp = None
    if fp is None:
        fp = _read_fingerprints(path)
    own = db is None
    db = _connect(home) if db is None else db
    if db is None:
        return fp
    try:
        generation = _generation(db)
    finally:
        if own:
            db.close()
    if fp is None or fp.generation != generation:
        fp = None  # the old map let go before the file is replaced (Windows keeps a mapped file)
        with _fp_lock:
            _fp_cache.pop(home, None)
        write_fingerprints(home)
        fp = _read_fingerprints(path)
    with _fp_lock:
        if fp is not None:
            _fp_cache[home] = fp
    return fp


# --- the check --------------------------------------------------------------------------------
def _shared_runs(question: dict[tuple[str, ...], int], firsts: set[str], ws: list[str]) -> set[int]:
    """The question's MIN_WORDS-word runs (by position) that ``ws`` contains; only the
    positions whose word is in ``firsts`` (the runs' first words) are tried."""
    found = set()
    for i in range(len(ws) - MIN_WORDS + 1):
        if ws[i] in firsts:
            at = question.get(tuple(ws[i:i + MIN_WORDS]))
            if at is not None:
                found.add(at)
    return found


def private_spans(home: Path | str, text: str, peers: Sequence[str | None]) -> list[Hold]:
    """``private-text`` holds: for each of ``peers`` (a name, or None: anonymous), every
    source whose tier hides it from that peer and that holds a run of :data:`MIN_WORDS`
    words of ``text`` which no source the peer may see also holds (text the peer can read
    anyway is not a leak).

    Reads the fingerprints (:func:`fingerprints`), then the stored text of each candidate
    chunk (one query per 500) and the policy (``<home>/policy.toml``).
    """
    holds = _private_spans(Path(home), words(text), peers)
    if not text.isascii() and _FORMAT_RE.search(text):  # an invisible character between words, too
        holds += [h for h in _private_spans(Path(home), words(_FORMAT_RE.sub(" ", text)), peers)
                  if h not in holds]
    return holds


def _private_spans(home: Path, ws: list[str], peers: Sequence[str | None]) -> list[Hold]:
    if len(ws) < MIN_WORDS:
        return []
    db = _connect(home)
    if db is None:
        return []
    try:
        fp = fingerprints(home, db)
        if fp is None:
            return []
        candidates = fp.lookup_all(set(_shingle_hashes(ws)))
        if not candidates:
            return []
        runs: dict[tuple[str, ...], int] = {}
        for i in range(len(ws) - MIN_WORDS + 1):
            runs.setdefault(tuple(ws[i:i + MIN_WORDS]), i)
        firsts = {run[0] for run in runs}
        found: dict[str, set[int]] = {}  # source id -> the question's runs it holds
        ids = sorted(candidates)
        for start in range(0, len(ids), 500):  # the candidates' stored text, in one query per 500
            part = ids[start:start + 500]
            rows = db.execute("SELECT c.text, d.source_id FROM chunks c JOIN documents d ON d.doc_id = c.doc_id "
                              f"WHERE c.rowid IN ({','.join('?' * len(part))})", part).fetchall()
            for text_, source in rows:
                shared = _shared_runs(runs, firsts, words(text_))
                if shared:
                    found.setdefault(source, set()).update(shared)
    finally:
        db.close()
    if not found:
        return []
    from node.policy.store import Policy

    policy = Policy.load(home)
    holds = []
    for peer in peers:
        hidden = {s: r for s, r in found.items() if not policy.decide_canonical(s, peer).allowed}
        seen = set().union(*(r for s, r in found.items() if s not in hidden))
        holds.extend(Hold("private-text", s, peer) for s, r in sorted(hidden.items()) if r - seen)
    return holds


def value_holds(text: str) -> list[Hold]:
    """Holds for the values the scrub detectors flag in ``text`` (one per kind)."""
    from node.common.scrub import find

    return [Hold(kind) for kind in sorted({k for _, _, k in find(text, VALUE_KINDS)})]


def check(home: Path | str, text: str, peers: Sequence[str | None]) -> list[Hold]:
    """Every reason to hold ``text`` on its way to ``peers`` (empty: it may leave).

    Args:
        home: the node home (fingerprints, corpus record, policy).
        text: everything the question carries (:func:`question_text`).
        peers: the receiving peers' registry names (None: a peer without one).
    """
    return value_holds(text) + private_spans(home, text, peers)


def question_text(body: Any) -> str:
    """The text a request carries to a peer: every string in it (the query, filters,
    tags…), one per line."""
    out: list[str] = []
    stack = [body]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
    return "\n".join(out)


# --- the gate -----------------------------------------------------------------------------------
def receiving_peers(home: Path | str, peers: Sequence[str] | str) -> list[str]:
    """The peers a question goes to: ``peers`` as named, or for ``"all"`` every pinned,
    unblocked peer (as the fan-out resolves it)."""
    if peers != "all":
        return list(peers)
    from node.trust.peers import PeerRegistry

    registry = PeerRegistry.load(Path(home))
    return sorted(n for n, r in registry.peers.items() if not registry.is_blocked(r.public_key))


def door_gate(home: Path | str, scope: Any, body: Any, peers: Sequence[str] | str) -> Ticket:
    """:func:`gate` as the local doors call it: the agent's name and rule from ``scope``
    (a :class:`node.local.agents.Scope`), or — in-process, without a scope — the owner's
    call logged under the rule ``allow``. Raises what :func:`gate` raises."""
    if scope is None:
        return gate(home, body, receiving_peers(home, peers), actor=OWNER, rule="allow")
    return gate(home, body, receiving_peers(home, peers), actor=scope.name, rule=scope.agent.outbound)


@dataclass
class Ticket:
    """A question the gate let through: :meth:`done` logs what came back."""

    home: Path
    id: str
    decision: str
    holds: list[Hold] = field(default_factory=list)

    def done(self, result: Any) -> None:
        """Append what came back (a merged envelope, a host envelope, or an error code) to
        the log under this question's id."""
        _append(self.home, {"id": self.id, "at": _now(), "result": _summary(result)})


def gate(home: Path | str, body: Any, peers: Sequence[str | None], *, actor: str, rule: str,
         confirm: Callable[[list[Hold]], bool | None] | None = None, yes: bool = False) -> Ticket:
    """The one outbound gate: check what ``body`` carries to ``peers`` and decide.

    Args:
        home: the node home. body: the request as sent (every string is checked).
        peers: the receiving peers (names, or None for one without a name).
        actor: the agent's name, or :data:`OWNER` at a terminal.
        rule: ``allow``, ``ask`` or ``block`` (the agent's ``--outbound``; the owner's is ``ask``).
        confirm: asks the person about the holds (a terminal prompt): True sends, False or
            None (no answer in time) denies. Without it ``ask`` refuses with an id.
        yes: send a held question (``--yes``).

    Returns:
        A :class:`Ticket` (call :meth:`Ticket.done` with what came back).

    Raises:
        EgressRefused: ``outbound-held`` (``block``, or denied), ``outbound-needs-confirmation``
            (``ask`` without a person to ask; the message carries the id ``kith sent
            approve`` takes). Nothing was sent.
    """
    home = Path(home)
    text = question_text(body)
    holds = check(home, text, peers)
    qid = _question_id(actor, peers, text)
    entry = {"id": qid, "at": _now(), "agent": actor, "peers": [p for p in peers], "text": text,
             "holds": [h.to_dict() for h in holds], "rule": rule}
    if not holds:
        decision = "sent"
    elif rule == "allow":
        decision = "allowed"
    elif rule == "block":
        _append(home, {**entry, "decision": "blocked"})
        raise EgressRefused("outbound-held", f"held ({_reasons(holds)}); agent {actor!r} may not send it", status=403)
    elif yes:
        decision = "confirmed"
    elif confirm is not None:
        answer = confirm(holds)
        if answer is not True:
            _append(home, {**entry, "decision": "denied" if answer is False else "denied-timeout"})
            raise EgressRefused("outbound-held", f"held ({_reasons(holds)}); not confirmed, nothing was sent",
                                status=403)
        decision = "confirmed"
    elif _take_approval(home, qid):
        decision = "approved"
    else:
        _ask_approval(home, qid, actor, peers, holds)
        _append(home, {**entry, "decision": "needs-confirmation"})
        raise EgressRefused("outbound-needs-confirmation",
                            f"held ({_reasons(holds)}); nothing was sent; id {qid}",
                            hint=f"`kith sent approve {qid}` lets the same question through once "
                                 f"(within {APPROVAL_TTL_S // 60} minutes)", status=403)
    _append(home, {**entry, "decision": decision})
    return Ticket(home, qid, decision, holds)


def _reasons(holds: Iterable[Hold]) -> str:
    kinds: dict[str, set[str]] = {}
    for h in holds:
        kinds.setdefault(h.kind, set())
        if h.source:
            kinds[h.kind].add(h.source)
    return "; ".join(k + (f" from {', '.join(sorted(s)[:3])}" if s else "") for k, s in sorted(kinds.items()))


def _question_id(actor: str, peers: Sequence[str | None], text: str) -> str:
    key = json.dumps([actor, sorted(p or "" for p in peers), text], ensure_ascii=False)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _summary(result: Any) -> dict[str, Any]:
    if isinstance(result, str):
        return {"error": result}
    if not isinstance(result, dict):
        return {}
    out: dict[str, Any] = {}
    if "peers" in result and isinstance(result["peers"], list):  # a merged envelope
        out["peers"] = {str(p.get("name")): p.get("status") for p in result["peers"] if isinstance(p, dict)}
    if "answered" in result:
        out["answered"] = result["answered"]
    results = result.get("results")
    if isinstance(results, list):
        out["results"] = len(results)
        out["sources"] = [r.get("source") for r in results[:20] if isinstance(r, dict)]
    if "status" in result:
        out["status"] = result["status"]
    return out


# --- the log ------------------------------------------------------------------------------------
_log_lock = threading.Lock()


@contextlib.contextmanager
def _flocked(home: Path, name: str) -> Iterator[None]:
    import fcntl

    fd = os.open(home / (name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _append(home: Path, record: dict[str, Any]) -> None:
    """Append one record (a whole line, 0600), rotating first when the file would pass
    :data:`MAX_LOG_BYTES`.

    Raises:
        KithError: ``io-error`` (a folder in the place of ``sent.jsonl``, a file this user
            may not write, ...) or ``disk-full``, naming the file
            (:func:`node.common.dbfaults.os_fault`): every caller — ``kith ask``, the
            runner's delivery, the local API, ``kith mcp`` — reports it as a refusal.
    """
    from node.common.dbfaults import os_fault

    try:
        _append_line(home, record)
    except OSError as exc:
        raise os_fault(exc, None if exc.filename else str(home / LOG_FILE)) from None


def _append_line(home: Path, record: dict[str, Any]) -> None:
    """:func:`_append` itself, its I/O failures raised as they are."""
    line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    path = home / LOG_FILE
    from node.common.home import open_append

    with _log_lock, _flocked(home, LOG_FILE):
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(line) > MAX_LOG_BYTES:
            for i in range(LOG_KEEP, 0, -1):
                src = path if i == 1 else path.with_name(f"{LOG_FILE}.{i - 1}")
                with contextlib.suppress(FileNotFoundError):
                    os.replace(src, path.with_name(f"{LOG_FILE}.{i}"))
        fd = open_append(path)  # a FIFO in its place: refused, never a command hung in open()
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, line)
        finally:
            os.close(fd)


def log_files(home: Path | str) -> list[Path]:
    """The log's files, oldest first (``sent.jsonl.3`` … ``sent.jsonl``)."""
    home = Path(home)
    rotated = [home / f"{LOG_FILE}.{i}" for i in range(LOG_KEEP, 0, -1)]
    return [p for p in (*rotated, home / LOG_FILE) if p.is_file()]


def read_log(home: Path | str, *, agent: str | None = None, peer: str | None = None,
             since: str | None = None) -> list[dict[str, Any]]:
    """The decisions of the log, oldest first, each with its ``result`` when one came back;
    filtered by ``agent``, a receiving ``peer`` and ``since`` (an RFC 3339 UTC time).
    Lines that are not records are skipped."""
    entries: dict[str, dict[str, Any]] = {}
    order: list[dict[str, Any]] = []
    waiting: dict[str, dict[str, Any]] = {}  # the last hold of each question still waiting for approval
    for path in log_files(home):
        for raw in path.read_text("utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(raw)
            except (ValueError, RecursionError):  # RecursionError: "[[[[…"
                continue
            if not isinstance(rec, dict) or "id" not in rec:
                continue
            if "decision" in rec:
                rec = {**rec, "result": None}
                entries[rec["id"]] = rec
                order.append(rec)
                if rec["decision"] != "needs-confirmation":  # a later decision on the same question
                    waiting.pop(rec["id"], None)
                else:
                    waiting[rec["id"]] = rec
            elif "result" in rec and rec["id"] in entries:
                entries[rec["id"]]["result"] = rec["result"]
            elif "deniedBy" in rec and rec["id"] in entries:  # a person said no, or nobody answered
                entries[rec["id"]]["decision"] = "denied-timeout" if rec["deniedBy"] == "timeout" else "denied"
                waiting.pop(rec["id"], None)
    # a hold that no retry followed within APPROVAL_TTL_S was denied then (nothing was sent)
    cutoff = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - APPROVAL_TTL_S))
    for rec in waiting.values():
        if str(rec.get("at", "")) <= cutoff:
            rec["decision"] = "denied-timeout"
    return [r for r in order
            if (agent is None or r.get("agent") == agent) and (peer is None or peer in (r.get("peers") or []))
            and (since is None or str(r.get("at", "")) >= since)]


# --- approvals ---------------------------------------------------------------------------------
def _approvals(home: Path, *, strict: bool = False) -> dict[str, Any]:
    """The held questions of ``sent-approvals.json`` (id → entry); {} when there is none.

    A damaged file reads as {} (a new hold then replaces it) unless ``strict``
    (``kith sent approve``): then it is refused, so "no held question is waiting" is never
    said of a file that could not be read.

    Raises:
        ConfigError: with ``strict`` only: ``config-invalid`` naming the file when it is not
            an approvals file (garbage, truncated, not an object of entries), with the ``mv``
            that moves it aside; a local I/O failure (unreadable, a folder in its place) as
            :func:`node.common.dbfaults.os_fault` says it.
    """
    from node.common.dbfaults import os_fault
    from node.common.errors import ConfigError
    from node.common.home import read_json_state, read_regular

    path = home / APPROVALS_FILE
    hint = (f"move it aside (`mv {path} {path}.bad`): the questions it held are no longer waiting; "
            "the agent asks again and is held again")
    try:
        doc = read_json_state(path, hint=hint, data=read_regular(path))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        if strict:
            raise os_fault(exc, str(path)) from None
        return {}
    except ConfigError:
        if strict:
            raise
        return {}
    if isinstance(doc, dict) and all(isinstance(v, dict) for v in doc.values()):
        return doc
    if strict:
        raise ConfigError("config-invalid", f"{APPROVALS_FILE} is not a file of held questions", hint=hint)
    return {}


def _save_approvals(home: Path, doc: dict[str, Any]) -> None:
    from node.common.home import atomic_write

    now = time.time()
    doc = {k: v for k, v in doc.items() if v.get("expires", 0) > now}
    atomic_write(home / APPROVALS_FILE, (json.dumps(doc, indent=1) + "\n").encode(), 0o600)


def _ask_approval(home: Path, qid: str, actor: str, peers: Sequence[str | None], holds: list[Hold]) -> None:
    with _flocked(home, APPROVALS_FILE):
        doc = _approvals(home)
        doc[qid] = {"agent": actor, "peers": list(peers), "holds": [h.to_dict() for h in holds],
                    "approved": False, "expires": time.time() + APPROVAL_TTL_S}
        _save_approvals(home, doc)


def _take_approval(home: Path, qid: str) -> bool:
    if not (home / APPROVALS_FILE).exists():
        return False
    with _flocked(home, APPROVALS_FILE):
        doc = _approvals(home)
        entry = doc.get(qid)
        if not entry or not entry.get("approved") or entry.get("expires", 0) <= time.time():
            return False
        del doc[qid]
        _save_approvals(home, doc)
    return True


def deny(home: Path | str, qid: str, *, timed_out: bool = False) -> None:
    """Deny the held question ``qid`` (a person said no, or did not answer in time): its
    pending entry is dropped and the decision logged."""
    home = Path(home)
    with _flocked(home, APPROVALS_FILE):
        doc = _approvals(home)
        if doc.pop(qid, None) is not None:
            _save_approvals(home, doc)
    _append(home, {"id": qid, "at": _now(), "deniedBy": "timeout" if timed_out else OWNER})


def approve(home: Path | str, qid: str, *, agent: str | None = None) -> dict[str, Any]:
    """Release the held question ``qid`` (``kith sent approve``): its identical retry by
    the same agent to the same peers is sent once, within :data:`APPROVAL_TTL_S` of the
    hold.

    Returns:
        The pending entry (agent, peers, holds, expires).

    Args:
        agent: when given, the held question must be this agent's (an MCP client confirming
            through its own server).

    Raises:
        EgressRefused: ``outbound-not-pending`` when no held question has that id (of
            ``agent``), or its time ran out (it was denied).
        ConfigError: ``config-invalid`` (with the ``mv`` that moves it aside) or
            ``io-error`` when ``sent-approvals.json`` is damaged or cannot be read.
    """
    home = Path(home)
    with _flocked(home, APPROVALS_FILE):
        doc = _approvals(home, strict=True)
        entry = doc.get(qid)
        if not entry or entry.get("expires", 0) <= time.time() or (agent is not None and entry.get("agent") != agent):
            raise EgressRefused("outbound-not-pending", f"no held question {qid[:32]!r} is waiting")
        entry["approved"] = True
        _save_approvals(home, doc)
    _append(home, {"id": qid, "at": _now(), "approvedBy": OWNER})
    return entry


__all__ = ["APPROVAL_TTL_S", "Hold", "MIN_WORDS", "OWNER", "Ticket", "approve", "check", "deny", "door_gate",
           "fingerprints", "gate", "receiving_peers", "log_files", "private_spans", "question_text", "read_log", "value_holds", "words",
           "write_fingerprints"]
