"""The peer side of copies a peer may keep (issue 33; specs/copies.md is normative).

``<home>/copies/<peer>/`` holds one host's copy:

- ``manifest.json`` — the copy's committed state, written atomically (0600):
  ``{"v": 1, "peer", "hostKey", "syncedAt" (the last complete sync, RFC 3339 UTC or null),
  "maxBytes", "indexed" (the copy's index holds every document listed), "documents": {source: {"version", "bytes", "textSha256", "file", "citation", "mtimeNs"}}}``;
- ``docs/`` — one file per document, named by the peer (``<sha256(source)[:32]>-<version[:12]>``
  and ``.md``/``.rst``/``.txt``), never by anything the host sent, so a hostile host cannot
  write outside the folder; a file not in the manifest (a sync killed before its commit) is
  deleted by the next sync and never answered from;
- ``grant.json`` — the host's last handshake's word on the grant (``{"stamp", "until",
  "seenAt"}``, :func:`take_copy_state`);
- ``corpus/`` — the copy's own index, made by the same corpus code as the owner's
  (:class:`node.corpus.store.Corpus` with ``docs/`` as its one root): the peer's own
  corpus is another record and is never touched.

:func:`sync_copy` pulls over a pooled knowledge-query session (iroh, handshake, quotas,
audit: the host's ordinary path): ``copy_list`` → the manifest; what the manifest no longer
lists is deleted at once (the grant narrowed or ended; ``copy-not-granted`` deletes the
whole copy); then ``copy_fetch`` batches of what changed. Each document is checked before
it is written — in the batch asked, its version and text hash those of the manifest, its
``kith-citation-v1`` citation over the whole text verified as the host's
(:func:`node.answer.citation.verify_citation`) — and the manifest is committed after each
batch, so a killed sync resumes where it stopped and the previous copy stays whole. Any
fault aborts with a code and leaves the last committed copy.

Ending a copy (specs/copies.md §5.1): every session's handshake tells the grant's state
(:func:`take_copy_state`: not granted → the copy is deleted now; a new stamp → the runner
re-syncs it), a copy past its ``until`` is deleted by this node without asking
(:func:`expire_copies`, :func:`search_copy`), and ``kith peers remove`` / a revoked device
delete the copies held from that host (:func:`end_copies`); each says so
(:class:`copy_notices`, stderr by default).

:func:`search_copy` answers a question from a copy (``kith ask --peer NAME --copy``, and
the fallback when the host is unreachable): the same answer service as the owner's own
search, the copy's results named by the host's source ids. A copy is never served to
anyone else: nothing here is reachable from a session this node hosts.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from node.common.errors import ConfigError, CorpusError, KithError, PolicyError, ProtocolViolation, SigningError
from node.common.home import atomic_write

#: ``<home>/copies/``: every copy this node keeps, one folder per pinned peer name.
COPIES_DIR = "copies"
MANIFEST_FILE = "manifest.json"
#: The host's last word on the grant (``{"stamp", "until", "seenAt"}``), from a handshake.
GRANT_FILE = "grant.json"
DOCS_DIR = "docs"
#: The prefix of the copy's one root in its own index (its local source ids are ``/copy/...``).
ROOT_NAME = "copy"
#: Documents asked per ``copy_fetch`` (spec.json's bound).
FETCH_BATCH = 64
#: The most bytes one copy may hold whatever the host says (a host with no budget).
MAX_LOCAL_BYTES = 4 << 30
#: Longest source id kept (the citation's bound).
MAX_SOURCE_CHARS = 1024
_HEX = frozenset("0123456789abcdef")
#: verify_citation results that are a fault of the signature (the rest: the text).
_BAD_SIGNATURE = frozenset({"malformed", "unknown-version", "wrong-host", "span-mismatch", "wrong-domain",
                            "signed-json", "bad-signature"})


#: errno values that mean the disk, the user's quota or the process's file-size limit is
#: full: a write refused so is ``copy-disk-full``; any other OSError is ``io-error``.
_DISK_FULL = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG) if e is not None)
#: How those read in an error that is not an OSError (tantivy's, SQLite's "disk is full").
_DISK_FULL_TEXT = tuple(os.strerror(e) for e in _DISK_FULL) + ("database or disk is full",)


@contextlib.contextmanager
def _disk(peer: str, what: str) -> Iterator[None]:
    """Turn a local write failure while ``what`` (a few words) in ``peer``'s copy into its
    refusal (specs/copies.md §9): the disk, quota or file size full → ``copy-disk-full``,
    any other OSError (or a read-only SQLite) → ``io-error``. Other errors pass."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if exc.errno in _DISK_FULL:
            raise ConfigError("copy-disk-full", f"copies/{peer}: {what}: {reason}") from None
        raise ConfigError("io-error", f"copies/{peer}: {what}: {reason}") from None
    except (sqlite3.Error, ValueError, RuntimeError) as exc:  # SQLite's and tantivy's own
        text = str(exc)
        if any(t in text for t in _DISK_FULL_TEXT):
            raise ConfigError("copy-disk-full", f"copies/{peer}: {what}: the disk is full") from None
        if isinstance(exc, sqlite3.OperationalError) and "readonly" in text:
            raise ConfigError("io-error", f"copies/{peer}: {what}: the copy's index is read-only") from None
        if "FileDoesNotExist" in text:  # tantivy: the index's files went away under this write
            raise ConfigError("io-error", f"copies/{peer}: {what}: the index's files went away while it was "
                              "written", hint=f"`kith copies sync {peer}` indexes the copy again") from None
        raise


#: grant.json path -> ((inode, mtime_ns, size), what it held) as :meth:`CopyStore.grant` last read it
_GRANTS: dict[Path, tuple[tuple[int, int, int], dict[str, Any] | None]] = {}
#: (copy folder) -> the manifest's mtime_ns when :meth:`CopyStore.reindex_if_outdated`
#: last found its index current (the code's schema cannot change within a process).
_CURRENT: dict[Path, int] = {}


def copies_root(home: Path) -> Path:
    """``<home>/copies``."""
    return Path(home) / COPIES_DIR


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


class CopyStore:
    """One peer's copy on disk (module docstring).

    Args:
        home: this node's home.
        peer: the pinned peer's registry name (:data:`node.trust.peers.NAME_RE`: a safe
            folder name).

    Raises:
        PolicyError: ``peer-bad-name`` for a name that is not a registry name.
    """

    def __init__(self, home: Path, peer: str) -> None:
        from node.trust.peers import NAME_RE

        if not isinstance(peer, str) or NAME_RE.fullmatch(peer) is None:
            raise PolicyError("peer-bad-name", f"{str(peer)[:80]!a} is not a registry name")
        self.home = Path(home)
        self.peer = peer
        self.dir = copies_root(home) / peer
        self.docs = self.dir / DOCS_DIR
        self.path = self.dir / MANIFEST_FILE

    def exists(self) -> bool:
        """True when a manifest was ever committed here."""
        return self.path.is_file()

    @property
    def _remake_hint(self) -> str:
        return f"`kith copies remove {self.peer}` deletes this copy; `kith copies sync {self.peer}` then makes it again"

    def load(self) -> dict[str, Any]:
        """The committed state (an empty one when there is none).

        Raises:
            ConfigError: ``config-invalid`` when ``manifest.json`` cannot be read.
        """
        if not self.path.is_file():
            return {"v": 1, "peer": self.peer, "hostKey": None, "syncedAt": None, "maxBytes": None,
                    "documents": {}}
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ConfigError("config-invalid", f"copies/{self.peer}/{MANIFEST_FILE} cannot be read",
                              hint=self._remake_hint) from None
        if not isinstance(state, dict) or not isinstance(state.get("documents"), dict):
            raise ConfigError("config-invalid", f"copies/{self.peer}/{MANIFEST_FILE} is not a copy manifest",
                              hint=self._remake_hint)
        return state

    def commit(self, state: dict[str, Any]) -> None:
        """Write ``state`` as the copy's manifest atomically (0600): a temp file in the
        copy's folder, fsync, rename (:func:`node.common.home.atomic_write`); on a failure
        the temp file is removed and the manifest is the one committed before.

        Raises:
            ConfigError: ``copy-disk-full`` (ENOSPC, EDQUOT, EFBIG), ``io-error`` (any
                other OSError).
        """
        with _disk(self.peer, "writing the manifest"):
            atomic_write(self.path, json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8"))

    @staticmethod
    def file_for(source: str, version: str, text_sha256: str = "") -> str:
        """The file name a document of ``source`` at ``version`` with text hash
        ``text_sha256`` is kept under: ``<sha256(source)[:32]>-<version[:12]>-<text_sha256[:12]>``
        and ``.md``/``.rst``/``.txt`` — chosen here, never by the host (only hex and a
        fixed suffix), and another name for another text of the same version (a scrub
        changed), so a write never replaces a committed document's file."""
        from node.corpus.parsers import kind_for

        kind = kind_for(source.rsplit("/", 1)[-1])
        suffix = {"markdown": ".md", "rst": ".rst"}.get(kind or "", ".txt")
        digest = f"-{text_sha256[:12]}" if text_sha256 else ""
        return (f"{hashlib.sha256(source.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}-{version[:12]}"
                f"{digest}{suffix}")

    def write_doc(self, name: str, text: str) -> None:
        """Write one document file into ``docs/`` atomically (temp file, fsync, rename;
        the temp file removed on a failure); a folder in its place (made on this machine)
        is deleted first — ``docs/`` holds only the copy's own files.

        Raises:
            ConfigError: ``copy-disk-full``, ``io-error`` (as :meth:`commit`).
        """
        path = self.docs / name
        with _disk(self.peer, f"writing document {name}"):
            if path.is_dir() and not path.is_symlink():  # a folder made in its place here: the copy's own
                shutil.rmtree(path)
            atomic_write(path, text.encode("utf-8", "surrogatepass"))

    def intact(self, entry: dict[str, Any]) -> bool:
        """True when the file of the committed document ``entry`` (a manifest row) is in
        ``docs/`` with the size and text hash the host signed; False when it is gone or
        changed on this machine (hand-edited, truncated, half-restored from a backup), so
        the next sync fetches it again (specs/copies.md §4, step 3). A file whose size and
        modification time (ns) are the ones ``entry["mtimeNs"]`` recorded when it was
        written or last hashed is not read again; one hashed and found whole gets its
        time recorded in ``entry`` (committed with the manifest). Never raises."""
        try:
            path = self.docs / Path(str(entry.get("file"))).name
            st = path.stat()
            if st.st_size != entry.get("bytes"):
                return False
            if entry.get("mtimeNs") == st.st_mtime_ns:
                return True
            if hashlib.sha256(path.read_bytes()).hexdigest() != entry.get("textSha256"):
                return False
            entry["mtimeNs"] = st.st_mtime_ns
            return True
        except (OSError, ValueError):
            return False

    def mtime_ns(self, name: str) -> int | None:
        """The modification time (ns) of ``docs/<name>``, or None when it cannot be read."""
        try:
            return (self.docs / name).stat().st_mtime_ns
        except OSError:
            return None

    def check_own_folders(self) -> None:
        """Refuse to work in a copy whose folder or ``docs/`` is a symbolic link: a sync
        deletes the files of ``docs/`` its manifest does not list, so a link (a folder moved
        to another disk and linked back) would make it delete someone else's files.

        Raises:
            ConfigError: ``io-error`` naming the link.
        """
        for path, what in ((self.dir, f"copies/{self.peer}"), (self.docs, f"copies/{self.peer}/{DOCS_DIR}")):
            if path.is_symlink():
                raise ConfigError("io-error", f"{what} is a symbolic link: a copy is written and tidied only in "
                                  "its own folders, never through a link",
                                  hint=f"move the link away; `kith copies sync {self.peer}` then makes the copy again")

    def tidy(self, state: dict[str, Any]) -> list[str]:
        """Delete every file of ``docs/`` that ``state`` does not list (a killed or failed
        sync's, a replaced version's, a temp file left by a crash); the names deleted.

        Raises:
            ConfigError: ``io-error`` (a file cannot be deleted; the copy's folder or
                ``docs/`` is a symbolic link, :meth:`check_own_folders`).
        """
        self.check_own_folders()
        keep = {d.get("file") for d in state["documents"].values()}
        gone: list[str] = []
        with _disk(self.peer, "deleting a document"):
            if self.docs.is_dir():
                for f in self.docs.iterdir():
                    if f.name not in keep and f.is_file():
                        f.unlink(missing_ok=True)
                        gone.append(f.name)
        return gone

    def index(self, changed: list[str] | None = None) -> dict[str, Any]:
        """Bring the copy's own index in line with ``docs/`` (the owner's corpus code):
        only the files ``changed`` (names written or deleted) when given and the index
        exists (:meth:`node.corpus.store.Corpus.sync_paths`), else the whole folder
        (:meth:`node.corpus.store.Corpus.sync`, which also rebuilds an index of an older
        schema and re-chunks what an older chunker made); the sync report.

        Raises:
            ConfigError: ``copy-disk-full``, ``io-error`` (as :meth:`commit`): the index
                may then lag ``docs/`` (the manifest says ``indexed: false``; the next
                sync indexes the whole folder).
            CorpusError: ``index-locked`` (another process writes this copy's index).
        """
        from node.corpus.store import Corpus

        with _disk(self.peer, "indexing"):
            self.docs.mkdir(parents=True, exist_ok=True)
            with Corpus(self.dir) as corpus:
                if not any(r.prefix == ROOT_NAME for r in corpus.roots()):
                    corpus.add_root(self.docs, name=ROOT_NAME)
                    changed = None
                if changed is not None:
                    return corpus.sync_paths([self.docs / n for n in dict.fromkeys(changed)])
                return corpus.sync()

    def reindex_if_outdated(self, *, force: bool = False, locked: bool = False) -> bool:
        """Rebuild the copy's index from its ``docs/`` — locally, asking no one — when it
        was built under another index schema or chunker than this code's
        (:meth:`node.corpus.store.Corpus.index_outdated`, the owner's own test), so a copy
        is re-indexed with the owner's corpus when the schema changes (specs/copies.md
        §5); also when it is gone or cannot be read (deleted or damaged on this machine:
        its text is still in ``docs/``). Called at the start of every sync (:func:`sync_copy`), by ``kith index sync``
        (:func:`reindex_copies`) and before a search of the copy. A copy found current is
        not opened again until its manifest changes (one ``stat``), unless ``force``
        (``kith index sync``). A rebuild runs only under the copy's sync lock (``locked``:
        the caller, a sync, holds it): while another process syncs the copy, its index is
        left to that sync — an index being written is never taken for a damaged one.

        Returns:
            True when the index was rebuilt; False when it was current, there is no copy
            or index yet, or another process holds the copy's writer (that process's
            sync rebuilds it).

        Raises:
            ConfigError: ``copy-disk-full``, ``io-error`` (as :meth:`index`).
        """
        from node.common.errors import CorpusError
        from node.corpus.store import Corpus

        try:
            stamp = self.path.stat().st_mtime_ns
        except OSError:
            return False
        index_dir = self.dir / "corpus"
        if not force and _CURRENT.get(self.dir) == stamp and index_dir.is_dir():
            return False
        damaged = False
        if not index_dir.is_dir():  # lost (deleted by hand): rebuilt when docs/ holds the text
            try:
                outdated = self.docs.is_dir() and any(f.is_file() for f in self.docs.iterdir())
            except OSError:
                outdated = False
        else:
            try:
                with Corpus(self.dir, readonly=True) as corpus:
                    outdated = corpus.index_outdated()
            except sqlite3.OperationalError:  # locked, busy, cannot open now: not damaged
                return False
            except (sqlite3.DatabaseError, ValueError, CorpusError) as exc:
                if isinstance(exc, CorpusError) and exc.code == "index-locked":
                    return False
                outdated = damaged = True  # not an index this code can read: rebuilt from docs/
        if not outdated:
            _CURRENT[self.dir] = stamp
            return False
        from node.common.home import acquire_owner_lock, release_owner_lock

        fd = None
        if not locked:
            with _disk(self.peer, "taking the sync lock"):
                fd = acquire_owner_lock(self.sync_lock, "a rebuild of the copy's index")
            if fd is None:  # a sync runs now: it indexes the copy itself
                return False
        try:
            try:
                if damaged:
                    with _open_lock:  # a search holding the broken index open lets go of it
                        held = _open_copies.pop(self.dir, None)
                        if held is not None:
                            _retire(held)
                    with _disk(self.peer, "deleting the damaged index"):
                        shutil.rmtree(index_dir)
                self.index(None)
            except CorpusError as exc:
                if exc.code == "index-locked":
                    return False
                raise
        finally:
            release_owner_lock(fd)
        _CURRENT[self.dir] = stamp
        return True

    @property
    def sync_lock(self) -> Path:
        """``copies/.<peer>.sync.lock``: held (``flock``) by the one process syncing this
        copy or rebuilding its index (:func:`sync_copy`)."""
        return copies_root(self.home) / f".{self.peer}.sync.lock"

    @property
    def _removal_marker(self) -> Path:
        return copies_root(self.home) / f".{self.peer}.removed"

    def removal_mark(self) -> tuple[int, int] | None:
        """The (inode, mtime ns) of ``copies/.<peer>.removed``, rewritten by every
        :meth:`remove` (None: never removed): a sync running in another process compares it
        before each commit and stops (``copy-removed``) when it changed."""
        try:
            st = self._removal_marker.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def remove(self, *, mark: bool = True) -> bool:
        """Delete the whole copy; False when there was none. The folder is first renamed
        away (``copies/.gone-…``, atomic: no reader sees half a copy, and a search running
        on it meanwhile cannot make the deletion fail), then deleted, with any such folder
        an earlier removal left behind. With ``mark`` (every removal but a sync's own) the
        removal marker (:meth:`removal_mark`) is rewritten first, so a sync running now
        does not make the copy again.

        Raises:
            ConfigError: ``io-error`` (the folder cannot be renamed away).
        """
        import secrets

        if mark and copies_root(self.home).is_dir():
            with _disk(self.peer, "marking the removal"):
                atomic_write(self._removal_marker, _rfc3339(time.time()).encode())
        if not self.dir.exists():
            return False
        _CURRENT.pop(self.dir, None)
        with _open_lock:  # a copy search_copy holds open is closed (by its last search)
            held = _open_copies.pop(self.dir, None)
            if held is not None:
                _retire(held)
        gone = self.dir.with_name(f".gone-{secrets.token_hex(8)}")
        try:
            with _disk(self.peer, "deleting the copy"):
                self.dir.rename(gone)
        except FileNotFoundError:
            return False
        for old in self.dir.parent.glob(".gone-*"):
            shutil.rmtree(old, ignore_errors=True)
        return True

    def summary(self) -> dict[str, Any]:
        """``{"peer", "hostKey", "syncedAt", "documents", "bytes", "maxBytes", "until"}`` of
        the committed copy (``kith copies list``; ``until``: :meth:`until`). A copy whose
        manifest cannot be read is one row of its own: the same keys empty, and ``error``
        ``{"code", "message", "hint"}`` (one damaged copy never hides the others)."""
        try:
            state = self.load()
            docs = state["documents"]
            return {"peer": self.peer, "hostKey": state.get("hostKey"), "syncedAt": state.get("syncedAt"),
                    "documents": len(docs), "bytes": sum(int(d.get("bytes") or 0) for d in docs.values()
                                                         if isinstance(d, dict) and isinstance(d.get("bytes"), int)),
                    "maxBytes": state.get("maxBytes"), "until": self.until(state)}
        except KithError as exc:
            return {"peer": self.peer, "hostKey": None, "syncedAt": None, "documents": 0, "bytes": 0,
                    "maxBytes": None, "until": None,
                    "error": {"code": exc.code, "message": exc.message, "hint": exc.hint}}

    # --- the host's last word on the grant (specs/copies.md §5) --------------------------
    def grant(self) -> dict[str, Any] | None:
        """``grant.json``: the copy grant state the host's last handshake told this node
        (``{"stamp", "until", "seenAt"}``), or None (never told, or unreadable). Read again
        only when the file's inode, modification time or size changed (every search of a
        copy asks for its end)."""
        path = self.dir / GRANT_FILE
        try:
            st = path.stat()
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            seen = _GRANTS.get(path)
            if seen is not None and seen[0] == key:
                return dict(seen[1]) if seen[1] is not None else None
            got = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        got = got if isinstance(got, dict) else None
        if len(_GRANTS) >= 256:
            _GRANTS.clear()
        _GRANTS[path] = (key, got)
        return dict(got) if got is not None else None

    def write_grant(self, state: dict[str, Any], now: float) -> None:
        """Record a checked copy grant state (:func:`check_copy_state`) as ``grant.json``."""
        atomic_write(self.dir / GRANT_FILE, json.dumps(
            {"stamp": state["stamp"], "until": state["until"], "seenAt": _rfc3339(now)},
            sort_keys=True).encode("utf-8"))

    def until(self, state: dict[str, Any] | None = None) -> str | None:
        """When this copy ends (RFC 3339 UTC) or None (never said): the host's last
        handshake's ``until`` (``grant.json``) when one was recorded, else the one of the
        last sync (``manifest.json``)."""
        grant = self.grant()
        if grant is not None:
            return grant.get("until")
        return (state if state is not None else self.load()).get("until")

    def expired(self, now: float) -> bool:
        """True once :meth:`until` has passed (an ill-formed one counts as passed)."""
        from node.common.grants import ended

        until = self.until()
        if until is None:
            return False
        try:
            return ended(until, now)
        except KithError:
            return True


def reindex_copies(home: Path) -> list[str]:
    """:meth:`CopyStore.reindex_if_outdated` of every copy of ``home`` (``kith index
    sync``: a copy is re-indexed with the owner's corpus when the schema changes); the
    peers whose copy was rebuilt.

    Raises:
        ConfigError: ``copy-disk-full``, ``io-error``.
    """
    return [row["peer"] for row in list_copies(home)
            if "error" not in row and CopyStore(home, row["peer"]).reindex_if_outdated(force=True)]


def list_copies(home: Path) -> list[dict[str, Any]]:
    """Every copy of ``home`` (:meth:`CopyStore.summary`), by peer name; a damaged one is a
    row with ``error`` that the background tasks (expiry, re-sync, re-index) leave alone."""
    from node.trust.peers import NAME_RE

    root = copies_root(home)
    if not root.is_dir():
        return []
    return [CopyStore(home, d.name).summary() for d in sorted(root.iterdir())
            if d.is_dir() and NAME_RE.fullmatch(d.name) and (d / MANIFEST_FILE).is_file()]


# --- checking what the host sent ---------------------------------------------------------

def check_manifest(message: Any, *, check_budget: bool = True) -> dict[str, dict[str, Any]]:
    """The manifest's entries ``{source: {"version", "bytes", "textSha256"}}``; with
    ``check_budget`` False the entries are checked but not their sum (what an over-budget
    manifest still lists: :func:`sync_copy` deletes what it no longer lists).

    Raises:
        ProtocolViolation: ``copy-manifest-invalid`` (a duplicate or ill-formed entry; a
            source that is not its own canonical id,
            :func:`node.corpus.sources.lexical_form`: relative, ``.``/``..`` segments,
            NUL, a backslash or doubled slash, over 1024 characters, a newline).
        PolicyError: ``copy-over-budget`` (the entries' bytes exceed the grant's
            ``maxBytes``, or :data:`MAX_LOCAL_BYTES`).
    """
    from node.corpus.sources import lexical_form

    docs = message.get("documents") if isinstance(message, dict) else None
    if not isinstance(docs, list):
        raise ProtocolViolation("copy-manifest-invalid", "the manifest has no document list")
    out: dict[str, dict[str, Any]] = {}
    total = 0
    for d in docs:
        src = d.get("source") if isinstance(d, dict) else None
        if (not isinstance(src, str) or len(src) > MAX_SOURCE_CHARS or lexical_form(src) != src
                or "\n" in src or src in out or not _is_hex64(d.get("version"))
                or not _is_hex64(d.get("textSha256"))
                or isinstance(d.get("bytes"), bool) or not isinstance(d.get("bytes"), int) or d["bytes"] < 0):
            raise ProtocolViolation("copy-manifest-invalid", "a manifest entry is ill-formed or repeated")
        out[src] = {"version": d["version"], "bytes": d["bytes"], "textSha256": d["textSha256"]}
        total += d["bytes"]
    budget = message.get("maxBytes")
    limit = min(budget, MAX_LOCAL_BYTES) if isinstance(budget, int) and not isinstance(budget, bool) else MAX_LOCAL_BYTES
    if check_budget and total > limit:
        raise PolicyError("copy-over-budget", f"the copy would hold {total:,} bytes, over its budget of {limit:,}")
    return out


def check_document(doc: Any, wanted: dict[str, dict[str, Any]], host_key: str) -> tuple[str, str, dict[str, Any]]:
    """``(source, text, citation)`` of one document the host sent, checked against the
    manifest entries asked for (``wanted``) and the host's key (specs/copies.md §3).

    Raises:
        SigningError: ``copy-outside-grant`` (a source not asked for / not in the
            manifest), ``copy-bad-signature`` (the citation does not verify as
            ``host_key``'s over this source and the whole text), ``copy-version-mismatch``
            (its version, text hash or size is not the manifest's, or its text is not the
            text signed).
    """
    from node.answer.citation import text_digest, verify_citation

    src = doc.get("source") if isinstance(doc, dict) else None
    if not isinstance(src, str) or src not in wanted:
        raise SigningError("copy-outside-grant", "the host sent a document the manifest does not list for this copy")
    entry = wanted[src]
    text, citation = doc.get("text"), doc.get("citation")
    if not isinstance(text, str) or not isinstance(citation, dict):
        raise SigningError("copy-bad-signature", f"{src[:200]}: no text or no citation")
    row = verify_citation(citation, text=text, shown_sources=(src,), expected_host=host_key)
    if row.result in _BAD_SIGNATURE:
        raise SigningError("copy-bad-signature", f"{src[:200]}: {row.result}: {row.detail}")
    if row.result == "text-changed":
        raise SigningError("copy-version-mismatch", f"{src[:200]}: the text is not the text the host signed")
    span = citation.get("span") or {}
    if span.get("chars") != [0, len(text)] or span.get("lines") is not None or span.get("pages") is not None:
        raise SigningError("copy-bad-signature", f"{src[:200]}: the signature is not over the whole document")
    if (doc.get("version") != entry["version"] or citation.get("version") != entry["version"]
            or text_digest(text) != entry["textSha256"]
            or len(text.encode("utf-8", "surrogatepass")) != entry["bytes"]):
        raise SigningError("copy-version-mismatch", f"{src[:200]}: its version or text is not the manifest's")
    return src, text, citation


# --- syncing -------------------------------------------------------------------------------

def _strings(value: Any) -> list[str]:
    """The strings of a list the host sent (anything else: none)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


Ask = Callable[[dict[str, Any]], Any]  # async (message request) -> the host's reply


async def sync_copy(home: Path, peer: str, ask: Ask, host_key: str, *,
                    progress: Callable[[int, int], None] | None = None,
                    now: Callable[[], float] = time.time, holder: str = "kith copies sync") -> dict[str, Any]:
    """Pull ``peer``'s copy over a session (module docstring; specs/copies.md §4), holding
    ``<home>/copies/.<peer>.sync.lock`` (an exclusive ``flock``) throughout: one sync of a
    copy at a time across this home's processes (a `kith copies sync` beside a running
    host's background re-sync), since each deletes the files the manifest it committed does
    not list.

    Args:
        home: this node's home.
        peer: the pinned peer's registry name.
        ask: ``await ask(request)`` sends one knowledge-query request (``{"action":
            "copy_list"}`` / ``{"action": "copy_fetch", "sources": [...]}``) and returns
            the host's reply (:meth:`node.guest.pool.SessionPool.ask` bound to ``peer``).
        host_key: the peer's pinned key: every document must be signed by it.
        progress: ``(documents done, documents to fetch)`` after each batch.
        holder: what this process is, for a second sync refused while this one runs.

    Returns:
        ``{"peer", "status": "ok" | "ended", "fetched", "removed", "unchanged",
        "repaired", "tooLarge", "refused", "documents", "bytes", "syncedAt"}``
        (``repaired``: of ``fetched``, the documents fetched again because their file
        here was gone or changed).

    Raises:
        KithError: ``copy-sync-running`` (another process of this home syncs this copy
            now; nothing was asked or changed), ``copy-removed`` (the copy was removed —
            ``kith copies remove``, ``kith peers remove``, its end — while this sync ran:
            what it wrote is deleted too), ``io-error`` for a copy folder or ``docs/`` that
            is a symbolic link, ``copy-over-budget``,
            ``copy-manifest-invalid``, ``copy-outside-grant``,
            ``copy-bad-signature``, ``copy-version-mismatch``, ``copy-disk-full``,
            ``io-error``, or the session's own errors — the copy is then the last one
            committed (each batch is): its manifest, its files (what the failed batch
            wrote is deleted) and what its index answers (specs/copies.md §9).
    """
    from node.common.home import acquire_owner_lock, lock_owner, release_owner_lock

    store = CopyStore(home, peer)  # peer-bad-name before any file is named after it
    with _disk(peer, "taking the sync lock"):
        fd = acquire_owner_lock(store.sync_lock, holder)
    if fd is None:
        raise ConfigError("copy-sync-running", f"another process is syncing {peer}'s copy now "
                          f"({lock_owner(store.sync_lock)})",
                          hint=f"wait for it to end; `kith copies list` then shows {peer}'s copy as it synced")
    mark = store.removal_mark()  # a removal by anyone else from now on stops this sync
    try:
        return await _sync_copy(store, ask, host_key, mark, progress=progress, now=now)
    except Exception as exc:
        # removed while this sync ran — the failure may be a write into the folder the
        # removal took away: what this sync wrote after the removal goes too
        removed = isinstance(exc, ConfigError) and exc.code == "copy-removed"
        if removed or store.removal_mark() != mark:
            store.remove(mark=False)
            if removed:
                raise
            raise _removed(peer) from None
        raise
    finally:
        release_owner_lock(fd)


def _removed(peer: str) -> ConfigError:
    """``copy-removed``: ``peer``'s copy was removed while a sync of it ran."""
    return ConfigError("copy-removed", f"{peer}'s copy was removed while this sync ran "
                       "(`kith copies remove`, `kith peers remove`, its grant's end); nothing of it is kept")


async def _sync_copy(store: CopyStore, ask: Ask, host_key: str, mark: tuple[int, int] | None, *,
                     progress: Callable[[int, int], None] | None, now: Callable[[], float]) -> dict[str, Any]:
    """:func:`sync_copy`'s work, under its lock; ``mark`` is the removal mark
    (:meth:`CopyStore.removal_mark`) when the sync began."""
    home, peer = store.home, store.peer
    store.check_own_folders()

    def commit(state: dict[str, Any]) -> None:  # never a copy someone removed meanwhile
        if store.removal_mark() != mark:
            raise _removed(peer)
        store.commit(state)

    state = store.load()
    replaced = 0
    if state.get("hostKey") not in (None, host_key):  # the name now names another key (or device)
        replaced = len(state["documents"])
        store.remove(mark=False)
        state = CopyStore(home, peer).load()
    store.reindex_if_outdated(locked=True)  # an index of an older schema, lost or damaged: rebuilt from docs/
    reply = await ask({"action": "copy_list"})
    if not isinstance(reply, dict) or reply.get("action") != "copy_manifest":
        raise ProtocolViolation("copy-manifest-invalid", "the host did not answer with a manifest")
    report: dict[str, Any] = {"peer": peer, "status": "ok", "fetched": 0, "removed": replaced, "unchanged": 0,
                              "repaired": 0, "tooLarge": [], "refused": []}
    if reply.get("status") == "copy-not-granted":  # the grant ended: delete what it held
        report["removed"] += len(state["documents"])
        store.remove(mark=False)
        report.update(status="ended", documents=0, bytes=0, syncedAt=None)
        return report
    held: dict[str, Any] = state["documents"]
    over: PolicyError | None = None
    if reply.get("status") == "copy-over-budget":
        over = PolicyError("copy-over-budget", f"the host says the copy is over its budget of {reply.get('maxBytes')} bytes")
    else:
        try:
            check_manifest(reply)
        except PolicyError as exc:
            over = exc
    if over is not None:  # nothing is fetched; what the host no longer lists still goes
        listed = check_manifest(reply, check_budget=False) if reply.get("documents") else None
        gone = [s for s in held if listed is not None and s not in listed]
        if gone:  # the grant narrowed as its budget shrank: deleted, the rest kept as it was
            for s in gone:
                del held[s]
            state["indexed"] = False
            commit(state)
            store.tidy(state)
            store.index(None)
            state["indexed"] = True
            commit(state)
        raise over
    manifest = check_manifest(reply)
    gone = [s for s in held if s not in manifest]
    for s in gone:  # no longer granted: deleted now, before anything new is fetched
        del held[s]
    report["removed"] += len(gone)
    todo = [s for s, e in manifest.items()
            if s not in held or (held[s]["version"], held[s]["textSha256"]) != (e["version"], e["textSha256"])]
    # a committed document whose file was lost or changed here is fetched again (same name)
    outdated = set(todo)
    damaged = [s for s in manifest if s in held and s not in outdated and not store.intact(held[s])]
    todo += damaged
    report["repaired"] = len(damaged)
    state.update(hostKey=host_key, maxBytes=reply.get("maxBytes"))
    complete = state.get("indexed") is True  # the index held every listed document before this sync
    if gone:  # the index lags the manifest from the first change committed to its index step
        state["indexed"] = False
    commit(state)
    changed = store.tidy(state)
    report["unchanged"] = len(manifest) - len(todo)
    done = 0
    queue = list(todo)
    try:
        while queue:
            batch, queue = queue[:FETCH_BATCH], queue[FETCH_BATCH:]
            reply = await ask({"action": "copy_fetch", "sources": batch})
            if not isinstance(reply, dict) or reply.get("action") != "copy_docs":
                raise ProtocolViolation("copy-manifest-invalid", "the host did not answer with documents")
            wanted = {s: manifest[s] for s in batch}
            docs = reply.get("documents") or []
            if not isinstance(docs, list):
                raise ProtocolViolation("copy-manifest-invalid", "the host's documents are not a list")
            fetched: dict[str, dict[str, Any]] = {}
            for doc in docs:  # every document of the batch checked before any is written
                src, text, citation = check_document(doc, wanted, host_key)
                del wanted[src]  # each at most once
                entry = manifest[src]
                fetched[src] = {**entry, "file": store.file_for(src, entry["version"], entry["textSha256"]),
                                "citation": citation, "text": text}
            for src, row in fetched.items():
                store.write_doc(row["file"], row.pop("text"))
                row["mtimeNs"] = store.mtime_ns(row["file"])
                changed.append(row["file"])
            more = [s for s in _strings(reply.get("more")) if s in wanted]
            report["tooLarge"] += [s for s in _strings(reply.get("tooLarge")) if s in wanted]
            report["refused"] += [s for s in _strings(reply.get("refused")) if s in wanted]
            if not docs and more:
                raise ProtocolViolation("copy-manifest-invalid", "the host sent no document and asked to ask again")
            queue = more + queue
            if fetched:
                held.update(fetched)
                done += len(fetched)
                state["indexed"] = False
                commit(state)  # this batch is the copy now: a kill after it resumes from here
            changed += store.tidy(state)
            if progress is not None:
                progress(done, len(todo))
    except BaseException as exc:
        if (isinstance(exc, ConfigError) and exc.code == "copy-removed") or store.removal_mark() != mark:
            raise  # removed meanwhile (a write may have failed for it first): sync_copy deletes what is left
        # a fault, a lost host, a full disk: what this batch wrote is not the copy
        with contextlib.suppress(Exception):
            store.tidy(store.load())
        if done and isinstance(exc, Exception):  # the batches committed answer a search now
            with contextlib.suppress(Exception):
                store.index(changed if complete else None)
                kept = store.load()
                kept["indexed"] = True
                commit(kept)
        raise
    report["fetched"] = done
    if not state.get("indexed") or not (store.dir / "corpus").is_dir():  # else the index is current
        store.index(changed if complete else None)  # after a killed sync: the whole folder
        state["indexed"] = True
    state["syncedAt"] = _rfc3339(now())  # only a sync that completed, its index included
    told = seen_state(home, host_key)  # what this session's handshake said of the grant
    if told is not None:
        state.update(until=told["until"], stamp=told["stamp"])
        store.write_grant(told, now())
    commit(state)
    summary = store.summary()
    report.update(documents=summary["documents"], bytes=summary["bytes"], syncedAt=state["syncedAt"])
    return report


async def sync_with_pool(pool: Any, peer: str, *, progress: Callable[[int, int], None] | None = None,
                         holder: str = "kith copies sync") -> dict[str, Any]:
    """:func:`sync_copy` over ``pool`` (a :class:`node.guest.pool.SessionPool`) to the
    pinned ``peer``.

    A person pin (``--devices``, specs/peers.md §13) is asked like any question to it —
    the device whose copy is kept here first, when it is awake — and its device that
    answers ``copy_list`` is the host of this sync — every later
    batch must come from that device, and every document must be signed by that device's
    key (the key this guest dialled, never one a host names) — so the copy is one device's
    (specs/copies.md §4.1).

    Raises:
        KithError: ``peer-not-found`` for a name not pinned; ``copy-device-changed``
            when another device of the person answers a later batch; as :func:`sync_copy`.
    """
    from node.trust.peers import PeerRegistry

    rec = PeerRegistry.load(pool.home).by_name(peer)
    if rec is None:
        raise PolicyError("peer-not-found", f"no pinned peer is named {peer!r}")
    if not rec.devices:
        async def ask(request: dict[str, Any]) -> Any:
            return await pool.ask(peer, request)

        return await sync_copy(pool.home, peer, ask, rec.public_key, progress=progress, holder=holder)

    first = device_key = None
    try:
        held = CopyStore(pool.home, peer).load().get("hostKey")
    except KithError:
        held = None
    if _is_hex64(held):  # the device whose copy is kept here is asked first: no switch while it is awake
        from node.guest.cards import device_targets
        from node.guest.pool import PeerGone

        target = next((t for d, t in device_targets(pool.home, rec) if d["key"] == held), None)
        if target is not None:
            try:
                first, device_key = await pool.ask(target, {"action": "copy_list"}), held
            except (PeerGone, KithError):  # asleep, or refused: any awake device of the person
                first = None
    if first is None:
        first = await pool.ask(peer, {"action": "copy_list"})
        device = first.get("device") if isinstance(first, dict) else None
        device_key = device.get("key") if isinstance(device, dict) else None
    if not _is_hex64(device_key):  # an answer not from a device (a person pin with no card)
        raise ProtocolViolation("copy-manifest-invalid", f"{peer}'s answer names no device of the person")
    told = [first]

    async def ask_device(request: dict[str, Any]) -> Any:
        if told and request == {"action": "copy_list"}:
            return told.pop()
        reply = await pool.ask(peer, request)
        got = reply.get("device") if isinstance(reply, dict) else None
        if not isinstance(got, dict) or got.get("key") != device_key:
            raise ProtocolViolation("copy-device-changed",
                                    f"another device of {peer} answered in the middle of the sync")
        return reply

    return await sync_copy(pool.home, peer, ask_device, device_key, progress=progress, holder=holder)


# --- ending a copy (specs/copies.md §5) -------------------------------------------------------

#: What this process's handshakes last told of each host's copy grant: (home, host key) →
#: the checked state. A first sync's handshake comes before its copy folder exists.
_SEEN: dict[tuple[str, str], dict[str, Any]] = {}
_SEEN_MAX = 1024
#: Who is told that a copy was deleted (:func:`copy_notices`); the innermost one only.
_LISTENERS: list[Callable[[dict[str, Any]], None]] = []


def check_copy_state(raw: Any) -> dict[str, Any]:
    """The ``copy_state`` of a host's ``_session_proof`` (specs/session.md §4.2), checked:
    ``{"granted": bool, "stamp": 32 lowercase hex, "until": RFC 3339 UTC | None}``.

    Raises:
        ProtocolViolation: ``copy-state-invalid`` for any other shape (the session goes on;
            the state is ignored).
    """
    from node.common.grants import until_time

    if (not isinstance(raw, dict) or set(raw) != {"granted", "stamp", "until"}
            or not isinstance(raw["granted"], bool) or not isinstance(raw["stamp"], str)
            or len(raw["stamp"]) != 32 or not set(raw["stamp"]) <= _HEX):
        raise ProtocolViolation("copy-state-invalid", "the host's copy_state is not {granted, stamp, until}")
    if raw["until"] is not None:
        try:
            until_time(raw["until"])
        except KithError:
            raise ProtocolViolation("copy-state-invalid", "the host's copy_state has a bad until") from None
    return {"granted": raw["granted"], "stamp": raw["stamp"], "until": raw["until"]}


def seen_state(home: Path, host_key: str) -> dict[str, Any] | None:
    """The copy grant state the last handshake with ``host_key`` in this process told, or None."""
    return _SEEN.get((str(Path(home).resolve()), host_key))


class copy_notices:  # noqa: N801 - a context manager used as a statement
    """``with copy_notices(fn):`` — ``fn(notice)`` is told of every copy this process deletes
    because it may no longer hold it (instead of stderr, the default), innermost first:
    ``notice`` is ``{"peer", "kind": "ended", "removed" (documents), "via": "handshake" |
    "expired" | "peer-removed" | "device-revoked", "text"}``, or ``{"peer", "kind":
    "changed"}`` when a handshake told a new grant stamp (the copy is :func:`stale`; stderr
    is not told of those). The home runner turns ``ended`` into ``copy-ended`` events and
    wakes for ``changed`` (specs/copies.md §7)."""

    def __init__(self, fn: Callable[[dict[str, Any]], None]) -> None:
        self.fn = fn

    def __enter__(self) -> "copy_notices":
        _LISTENERS.append(self.fn)
        return self

    def __exit__(self, *_exc: Any) -> None:
        if self.fn in _LISTENERS:
            _LISTENERS.remove(self.fn)


_WHY = {"handshake": "its host no longer grants it (told in the handshake)",
        "expired": "its grant's end has passed",
        "peer-removed": "its host was removed from the peer registry",
        "device-revoked": "its host's device was revoked"}


def _ended_copy(store: CopyStore, via: str) -> dict[str, Any] | None:
    """Delete ``store``'s copy and tell the innermost listener (stderr without one); the notice."""
    if not store.dir.exists():
        store.remove()  # none yet: a first sync running now still must not make one
        return None
    try:
        removed = len(store.load()["documents"])
    except KithError:
        removed = 0
    store.remove()
    notice = {"peer": store.peer, "kind": "ended", "removed": removed, "via": via,
              "text": f"{store.peer}'s copy was deleted ({removed} document(s)): {_WHY[via]}"}
    if _LISTENERS:
        try:
            _LISTENERS[-1](notice)
        except Exception:  # noqa: BLE001 - a listener's fault never undoes the deletion
            pass
    else:
        import sys

        print(f"kith: {notice['text']}", file=sys.stderr)
    return notice


def copies_of_key(home: Path, host_key: str) -> list[CopyStore]:
    """The copies of ``home`` held from the host key ``host_key`` (the ``hostKey`` their
    sync verified every document against)."""
    return [CopyStore(home, row["peer"]) for row in list_copies(home) if row.get("hostKey") == host_key]


def take_copy_state(home: Path, host_key: str, raw: Any, *, now: Callable[[], float] = time.time
                    ) -> list[dict[str, Any]]:
    """Act on the ``copy_state`` the host ``host_key`` sent in its ``_session_proof`` (the
    guest's runtime calls it at every ready session: ``kith ask``, an outbox delivery, a
    sync). Not granted → every copy held from that key is deleted now
    (:func:`copy_notices`); granted → its ``stamp`` and ``until`` are recorded in each
    copy's ``grant.json`` (a stamp that differs from the one the copy was last synced under
    makes the runner's :class:`CopiesTask` sync it at its next step; an ``until`` is the
    copy's end, :func:`expire_copies`). Only the host's own handshake counts: ``host_key``
    is the key the session's proof verified.

    Returns:
        The notices of the copies deleted.

    Raises:
        ProtocolViolation: ``copy-state-invalid`` (:func:`check_copy_state`).
    """
    state = check_copy_state(raw)
    seen_key = (str(Path(home).resolve()), host_key)
    if len(_SEEN) >= _SEEN_MAX and seen_key not in _SEEN:
        _SEEN.clear()
    _SEEN[seen_key] = state
    notices = []
    for store in copies_of_key(home, host_key):
        if not state["granted"]:
            got = _ended_copy(store, "handshake")
            if got is not None:
                notices.append(got)
        else:
            told = store.grant() or {}
            if (told.get("stamp"), told.get("until")) != (state["stamp"], state["until"]):
                store.write_grant(state, now())
            if stale(store) and _LISTENERS:  # the runner syncs it at its next step: wake it
                try:
                    _LISTENERS[-1]({"peer": store.peer, "kind": "changed"})
                except Exception:  # noqa: BLE001
                    pass
    return notices


def stale(store: CopyStore) -> bool:
    """True when the host's last handshake told a grant stamp other than the one the copy
    was last synced under: the grants or the policy for this peer changed since."""
    grant = store.grant()
    if grant is None:
        return False
    try:
        synced = store.load().get("stamp")
    except KithError:
        return True
    return grant.get("stamp") != synced


def expire_copies(home: Path, now: float | None = None) -> list[dict[str, Any]]:
    """Delete every copy of ``home`` whose end (:meth:`CopyStore.until`) has passed, without
    asking its host (specs/copies.md §5: this relies on this node doing so); the notices."""
    t = time.time() if now is None else now
    out = []
    for row in list_copies(home):
        store = CopyStore(home, row["peer"])
        if "error" not in row and store.expired(t):
            got = _ended_copy(store, "expired")
            if got is not None:
                out.append(got)
    return out


def end_copies(home: Path, *, peer: str | None = None, host_key: str | None = None, via: str
               ) -> list[dict[str, Any]]:
    """Delete the copy kept under the registry name ``peer`` and/or every copy held from
    ``host_key`` (``kith peers remove``: ``peer-removed``; a revoked device:
    ``device-revoked``); the notices."""
    stores = [CopyStore(home, peer)] if peer is not None else []
    if host_key is not None:
        stores += [s for s in copies_of_key(home, host_key) if s.peer != peer]
    return [n for n in (_ended_copy(s, via) for s in stores) if n is not None]


# --- answering from a copy ------------------------------------------------------------------

def _age(synced_at: str | None, now: float) -> str:
    from node.common.grants import until_time

    if not synced_at:
        return "unknown age"
    try:
        s = max(0, int(now - until_time(synced_at)))
    except KithError:
        return "unknown age"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s // size} {unit} ago"
    return f"{s} s ago"


def copy_age_text(peer: str, synced_at: str | None, now: float | None = None) -> str:
    """"from bea's copy of 2 h ago" (what text output says of an answer from a copy)."""
    return f"from {peer}'s copy of {_age(synced_at, time.time() if now is None else now)}"


#: The most copies :func:`search_copy` keeps open at once (least recently used closed first).
OPEN_COPIES_MAX = 8


class _OpenCopy:
    """One copy held open for search: its committed state as of ``key`` (the manifest
    file's inode, mtime and size), its index and the maps from its local ids to the host's.
    ``users`` counts searches running on it; one retired while in use is closed by the
    last of them."""

    __slots__ = ("key", "corpus", "state", "names", "service", "users", "retired")

    def __init__(self, key: tuple[int, int, int], corpus: Any, state: dict[str, Any]) -> None:
        from node.answer.service import AnswerService

        self.key = key
        self.corpus = corpus
        self.state = state
        #: local source id (``/copy/<file>``) → the host's source id
        self.names = {f"/{ROOT_NAME}/{d['file']}": s for s, d in state["documents"].items()}
        #: the owner's answer service over the copy's index, its hits named by the host's ids
        self.service = AnswerService(corpus, source_names=self.names)
        self.users = 0
        self.retired = False


_open_copies: dict[Path, _OpenCopy] = {}
_open_lock = threading.Lock()


def _retire(entry: _OpenCopy) -> None:
    """Close ``entry`` now, or when its last search ends (call with the lock held)."""
    entry.retired = True
    if entry.users == 0:
        entry.corpus.close()


def _acquire(store: CopyStore) -> _OpenCopy:
    """The copy held open at its committed state, opened (again) when the manifest changed
    since (a sync committed; the copy was removed and made anew); its ``users`` counted up.

    Raises:
        ConfigError: ``copy-not-found`` (no index, or the manifest went); ``config-invalid``.
    """
    from node.corpus.store import Corpus

    try:
        st = store.path.stat()
    except OSError:
        st = None
    if st is None or not (store.dir / "corpus").is_dir():
        with _open_lock:
            gone = _open_copies.pop(store.dir, None)
            if gone is not None:
                _retire(gone)
        raise ConfigError("copy-not-found", f"no copy of {store.peer} is kept here (`kith copies sync {store.peer}`)")
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    with _open_lock:
        entry = _open_copies.get(store.dir)
        if entry is not None and entry.key == key:
            entry.users += 1
            _open_copies[store.dir] = _open_copies.pop(store.dir)  # most recently used last
            return entry
    fresh = _OpenCopy(key, Corpus(store.dir, readonly=True), store.load())
    fresh.users = 1
    with _open_lock:
        old = _open_copies.pop(store.dir, None)
        if old is not None:
            _retire(old)
        _open_copies[store.dir] = fresh
        while len(_open_copies) > OPEN_COPIES_MAX:
            _retire(_open_copies.pop(next(iter(_open_copies))))
    return fresh


def _release(entry: _OpenCopy) -> None:
    with _open_lock:
        entry.users -= 1
        if entry.retired and entry.users == 0:
            entry.corpus.close()


def close_open_copies() -> None:
    """Close every copy :func:`search_copy` holds open (tests; a process about to remove
    copies wholesale). Searches running finish on theirs first."""
    with _open_lock:
        while _open_copies:
            _retire(_open_copies.popitem()[1])


def search_copy(home: Path, peer: str, request: dict[str, Any]) -> dict[str, Any]:
    """Answer the flat ``request`` from ``peer``'s copy: ``{"status", "envelope",
    "copyAsOf", "hostKey"}`` (``hostKey``: the key that signed the copy — a device's for
    a person pin, specs/copies.md §4.1) — the owner's answer service over the copy's index
    (:class:`node.answer.service.AnswerService`, its hits named by the host's ids before
    the envelope is built), each result's ``source`` (and
    ``provenance.sourceId``) the host's source id, ``copyCitation`` the host's
    signature over that whole document and ``copySpan`` ``[start, end)`` the chunk's
    character offsets in that signed text (None on a record without offsets), so
    ``kith verify`` can check the result's text is in it there (specs/citations.md §7).
    Results of a file the manifest does not list are dropped (a killed sync's).

    The copy's index, manifest and id maps stay open between questions (at most
    :data:`OPEN_COPIES_MAX` copies) and are opened again when the manifest file changes, so
    a long-running process (``kith api serve``, ``kith mcp``) answers a copy at the cost of
    the owner's own search (specs/copies.md §6). Thread-safe.

    Raises:
        ConfigError: ``copy-not-found`` when no copy of ``peer`` was ever synced;
            ``config-invalid`` when its ``manifest.json`` cannot be read.
        CorpusError: ``index-unavailable`` when the copy's index is damaged (not SQLite).
        PolicyError: ``copy-expired`` when the copy's end (:meth:`CopyStore.until`) has
            passed: the copy is deleted (specs/copies.md §5).
    """
    store = CopyStore(home, peer)
    if store.exists() and store.expired(time.time()):  # past its grant's end: deleted, never answered from
        until = store.until()
        _ended_copy(store, "expired")
        raise PolicyError("copy-expired", f"{peer}'s copy ended at {until}; it was deleted")
    try:
        store.reindex_if_outdated()  # an index of an older schema answers nothing: rebuilt first
        entry = _acquire(store)
        try:
            answer = entry.service.answer({k: v for k, v in request.items() if k != "citations"})
            env = answer.get("envelope") or {}
            spans = entry.corpus.chunk_evidence([r.get("id") for r in env.get("results") or []])
        finally:
            _release(entry)
    except sqlite3.DatabaseError as exc:  # damaged while held open: refused now, rebuilt by the next use
        _CURRENT.pop(store.dir, None)
        raise CorpusError(
            "index-unavailable",
            f"the index of {peer}'s copy cannot be read ({exc}); the next search of it, "
            f"`kith copies sync {peer}` or `kith index sync` rebuilds it from the copy's documents") from None
    held = entry.state["documents"]  # the envelope names the host's ids (AnswerService source_names)
    kept = []
    for r in env.get("results") or []:
        src = r.get("source")
        d = held.get(src) if isinstance(src, str) else None
        if d is None:  # a file the manifest does not list (a killed sync's): dropped
            continue
        prov = r.get("provenance")
        if isinstance(prov, dict):
            prov.pop("contentHash", None)
        r["alsoIn"] = [a for a in r.get("alsoIn") or [] if a.get("source") in held]
        r["copyCitation"] = d.get("citation")
        ev = spans.get(r.get("id"))
        r["copySpan"] = [ev[1], ev[2]] if ev and isinstance(ev[1], int) and isinstance(ev[2], int) else None
        kept.append(r)
    env["results"] = kept
    return {"status": answer.get("status") if kept or answer.get("status") != "ok" else "no-verified-results",
            "envelope": env, "copyAsOf": entry.state.get("syncedAt"), "hostKey": entry.state.get("hostKey")}


def copy_texts(home: Path) -> Callable[[str, str], tuple[str, str] | None]:
    """The copy documents ``home`` keeps, for ``kith verify`` of a result from a copy
    (:func:`node.answer.citation.verify_copy_result`; specs/citations.md §7).

    Returns:
        ``lookup(host key, source id) → (text, textSha256) | None``: the text of the
        document the copy of the peer pinned under that key holds for that source (read
        from ``docs/`` as it is on disk now, undecodable bytes replaced, so a changed file
        fails the host's signature) and the text hash its manifest lists; None when no
        copy of that key lists the source or its file is gone. The manifests are read
        once, at the first lookup; an unreadable one holds nothing. Never raises.
    """
    states: list[tuple[CopyStore, dict[str, Any]]] | None = None
    read: dict[tuple[str, str], tuple[str, str] | None] = {}  # the last documents read (≤ 32)

    def lookup(host_key: str, source: str) -> tuple[str, str] | None:
        if (host_key, source) not in read:
            if len(read) >= 32:
                read.clear()
            read[(host_key, source)] = _read(host_key, source)
        return read[(host_key, source)]

    def _read(host_key: str, source: str) -> tuple[str, str] | None:
        nonlocal states
        if states is None:
            states = []
            root = copies_root(home)
            for folder in sorted(root.iterdir()) if root.is_dir() else []:
                try:
                    store = CopyStore(home, folder.name)
                    if store.exists():
                        states.append((store, store.load()))
                except KithError:  # not a registry name, an unreadable manifest
                    continue
        for store, state in states:
            entry = state["documents"].get(source) if state.get("hostKey") == host_key else None
            if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
                continue
            try:
                data = (store.docs / Path(entry["file"]).name).read_bytes()
            except OSError:
                return None
            try:
                text = data.decode("utf-8", "surrogatepass")  # as written (CopyStore.write_doc)
            except UnicodeDecodeError:
                text = data.decode("utf-8", "replace")
            return text, str(entry.get("textSha256"))
        return None

    return lookup


__all__ = ["COPIES_DIR", "CopyStore", "check_copy_state", "check_document", "check_manifest", "close_open_copies",
           "copies_of_key", "copies_root", "copy_age_text", "copy_notices", "copy_texts", "end_copies",
           "expire_copies", "list_copies", "reindex_copies", "search_copy", "seen_state", "stale", "sync_copy",
           "sync_with_pool", "take_copy_state"]


# --- the background re-sync (node/guest/runner.py) -----------------------------------------

#: Seconds between two re-syncs of one copy that synced; after a failure (the host is away)
#: the next try comes after :data:`RETRY_FIRST_S`, doubling to :data:`RESYNC_S`.
RESYNC_S = 600.0
RETRY_FIRST_S = 5.0
#: Bound on one copy's sync in the background, seconds (what was committed is kept).
SYNC_TIMEOUT_S = 600.0


class CopiesTask:
    """The runner task re-syncing every copy kept in the home (specs/copies.md §7): each
    copy is synced once when the runner starts, then every :data:`RESYNC_S`; a host that
    cannot be reached is tried again after a backoff (from :data:`RETRY_FIRST_S`), and a
    host the runner reaches again (:meth:`node.guest.runner.Runner.peer_back`: the
    outbox delivered it a question) is re-synced at once. One sync at a time per copy;
    each reports a ``copy-synced`` / ``copy-ended`` / ``copy-failed`` event; a sync that
    succeeds after a failed one sends ``peer_back`` itself (the outbox delivers at once).

    Args:
        home: the node home.
        clock: monotonic seconds.
    """

    name = "copies"

    def __init__(self, home: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.home = Path(home)
        self.clock = clock
        self._due: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._running: set[str] = set()

    async def step(self, runner: Any) -> float:
        """Delete the copies past their end (:func:`expire_copies`, a ``copy-ended`` event
        each), then start the syncs that are due — and those a handshake found
        :func:`stale` — (:meth:`node.guest.runner.Runner.spawn`); the seconds until the
        next is."""
        with copy_notices(self.listener(runner)):
            expire_copies(self.home)
        now = self.clock()
        for row in list_copies(self.home):
            peer = row["peer"]
            if peer in self._running or "error" in row:
                continue  # a damaged copy waits for `kith copies remove` (its row says so)
            if self._due.get(peer, 0.0) > now and (peer in self._backoff or not stale(CopyStore(self.home, peer))):
                continue  # a stale copy is synced now, unless its host is being retried
            self._running.add(peer)
            runner.spawn(self._sync, runner, peer)
        return min([d - now for d in self._due.values() if d > now], default=RESYNC_S)

    def on_peer_back(self, runner: Any, key: str) -> None:
        """:meth:`node.guest.runner.Runner.peer_back`: every copy of the host ``key``
        (its pinned key, the manifest's ``hostKey``) not syncing now is due now."""
        for row in list_copies(self.home):
            if row.get("hostKey") == key and row["peer"] not in self._running:
                self._due[row["peer"]] = 0.0

    @staticmethod
    def listener(runner: Any) -> Callable[[dict[str, Any]], None]:
        """The :func:`copy_notices` listener of ``runner``'s process: a deleted copy is a
        ``copy-ended`` event (``via`` why), a changed grant wakes the runner."""
        from node.common.host_events import CopyEnded

        def tell(notice: dict[str, Any]) -> None:
            if notice.get("kind") == "changed":
                runner.wake()
            else:
                runner.emit(CopyEnded(peer=notice["peer"], fetched=0, removed=notice["removed"],
                                      via=notice["via"]).to_dict())
        return tell

    def _failed(self, runner: Any, peer: str, exc: BaseException) -> None:
        """A sync of ``peer`` failed with ``exc``: the next try after a doubling backoff
        (:data:`RETRY_FIRST_S` … :data:`RESYNC_S`), a ``copy-failed`` event with its code."""
        from node.common.host_events import CopyFailed
        from node.guest.pool import PeerGone, classify_gone

        code = (classify_gone(exc)[1] if isinstance(exc, PeerGone) else
                exc.code if isinstance(exc, KithError) else "peer-timeout" if isinstance(exc, TimeoutError)
                else "internal-error")
        wait = min(RESYNC_S, self._backoff.get(peer, RETRY_FIRST_S / 2) * 2)
        self._backoff[peer] = wait
        self._due[peer] = self.clock() + wait
        runner.emit(CopyFailed(peer=peer, code=code or "peer-disconnected").to_dict())

    async def _sync(self, runner: Any, peer: str) -> None:
        import anyio

        from node.common.host_events import CopyEnded, CopySynced

        try:
            pool = await runner.pool()
            with anyio.fail_after(SYNC_TIMEOUT_S):
                report = await sync_with_pool(pool, peer, holder="a running node's background re-sync")
        except ConfigError as exc:
            if exc.code != "copy-sync-running":
                self._failed(runner, peer, exc)
            else:  # another process of this home syncs it now (kith copies sync): look again soon
                self._due[peer] = self.clock() + RETRY_FIRST_S
        except Exception as exc:  # noqa: BLE001 - the host is away, or refused: try again later
            self._failed(runner, peer, exc)
        else:
            was_away = self._backoff.pop(peer, None) is not None
            self._due[peer] = self.clock() + RESYNC_S
            if report["status"] == "ended":
                runner.emit(CopyEnded(peer=peer, fetched=report["fetched"], removed=report["removed"],
                                      via="sync").to_dict())
            else:
                runner.emit(CopySynced(peer=peer, fetched=report["fetched"], removed=report["removed"]).to_dict())
            if was_away and report["status"] == "ok":  # still running: its own hook leaves this copy be
                key = CopyStore(self.home, peer).load().get("hostKey")
                if isinstance(key, str):
                    runner.peer_back(key)
        finally:
            self._running.discard(peer)
