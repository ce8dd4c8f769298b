"""A copy on disk (:class:`CopyStore`: manifest, ``docs/``, ``grant.json``, its own index,
the sync lock and the removal mark) and the copies a search holds open (package docstring;
specs/copies.md §2)."""

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
from typing import Any

from node.common.errors import ConfigError, KithError, PolicyError
from node.common.home import COPIES_DIR, atomic_write, read_json_state
from node.common.kept import keep

#: ``<home>/copies/`` (:data:`node.common.home.COPIES_DIR`): every copy this node keeps, one
#: folder per pinned peer name.
MANIFEST_FILE = "manifest.json"
#: The host's last word on the grant (``{"stamp", "until", "seenAt"}``), from a handshake.
GRANT_FILE = "grant.json"
DOCS_DIR = "docs"
#: The prefix of the copy's one root in its own index (its local source ids are ``/copy/...``).
ROOT_NAME = "copy"
#: The copy's index as searches open it: ``<copy>/corpus``, a symbolic link to the last
#: whole build (:meth:`CopyStore.swap_index`; a folder in copies an older Kith made).
INDEX_LINK = "corpus"
#: Builds of the copy's index live in ``<copy>/.index-<n>/corpus`` (:meth:`CopyStore.build_index`).
BUILD_PREFIX = ".index-"

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
        from node.common.dbfaults import folder_blocked_hint

        raise ConfigError("io-error", f"copies/{peer}: {what}: {reason}", hint=folder_blocked_hint(exc)) from None
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


def copies_root(home: Path) -> Path:
    """``<home>/copies``."""
    return Path(home) / COPIES_DIR


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class CopyStore:
    """One peer's copy on disk (module docstring).

    Args:
        home: this node's home.
        peer: the pinned peer's registry name (:data:`node.trust.peers.NAME_RE`: a safe
            folder name).
        cache: the process's :class:`OpenCopies` (what it holds open and last read of each
            copy; its owner is the process's session pool), or None: nothing is kept
            between calls.

    Raises:
        PolicyError: ``peer-bad-name`` for a name that is not a registry name.
    """

    def __init__(self, home: Path, peer: str, *, cache: "OpenCopies | None" = None) -> None:
        from node.trust.peers import NAME_RE

        if not isinstance(peer, str) or NAME_RE.fullmatch(peer) is None:
            raise PolicyError("peer-bad-name", f"{str(peer)[:80]!a} is not a registry name")
        self.home = Path(home)
        self.peer = peer
        self.dir = copies_root(home) / peer
        self.docs = self.dir / DOCS_DIR
        self.path = self.dir / MANIFEST_FILE
        self.cache = cache

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
        return self._read_manifest()

    def committed(self) -> dict[str, Any]:
        """:meth:`load` for a reader that changes nothing (the runner's steps: each copy's
        end, whether it is stale, its row): with a ``cache``, the manifest is read again only
        when the file's inode, modification time or size changed (every commit renames a
        new file into place; :class:`OpenCopies` keeps the
        :class:`node.guest.peerview.FileView` of each copy's manifest), so the caller must
        not change the state returned; without one, :meth:`load`.

        Raises:
            ConfigError: ``config-invalid`` as :meth:`load` (each time asked, until fixed).
        """
        if self.cache is None:
            return self.load()
        views = self.cache.manifests
        view = views.get(self.path)
        if view is None:
            from node.guest.peerview import FileView

            view = keep(views, self.path,
                        FileView(self.dir, MANIFEST_FILE, lambda _folder, read=self._read_manifest: read()), 256)
        return view.now()

    def _read_manifest(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {"v": 1, "peer": self.peer, "hostKey": None, "syncedAt": None, "maxBytes": None,
                    "documents": {}}
        try:
            state = read_json_state(self.path)
        except (OSError, ConfigError):
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

    def index(self, changed: list[str] | None = None, *, fresh: bool = False) -> dict[str, Any]:
        """Bring the copy's own index in line with ``docs/`` (the owner's corpus code), aside
        from the one searches use, then swap it in (:meth:`build_index`,
        :meth:`swap_index`): a search of the copy answers from the last whole index until
        the new one is whole, never from one half-written. The sync report.

        Args:
            changed: the file names written or deleted, when only those need indexing
                (:meth:`node.corpus.store.Corpus.sync_paths`); None: the whole folder
                (:meth:`node.corpus.store.Corpus.sync`, which also rebuilds an index of an
                older schema and re-chunks what an older chunker made).
            fresh: build from nothing instead of from the live index (a damaged one).

        Raises:
            ConfigError: ``copy-disk-full``, ``io-error`` (as :meth:`commit`): the live
                index is then the last whole one (the manifest says ``indexed: false``;
                the next sync indexes the whole folder).
            CorpusError: ``index-locked`` (another process writes this copy's index).
        """
        build, report = self.build_index(changed, fresh=fresh)
        self.swap_index(build)
        return report

    def build_index(self, changed: list[str] | None = None, *,
                    fresh: bool = False) -> tuple[Path, dict[str, Any]]:
        """Build the copy's next index aside, in ``.index-<n>/corpus`` of the copy's folder: a
        copy of the live index (unless ``fresh`` or there is none) brought up to date with
        ``docs/`` as :meth:`index` says. Searches never see it until :meth:`swap_index`.
        Call with the copy's sync lock held.

        Returns:
            ``(the built index folder, the sync report)``.

        Raises:
            As :meth:`index`; a failed build is deleted and the live index is untouched.
        """
        from node.corpus.store import Corpus

        live = self.dir / INDEX_LINK
        with _disk(self.peer, "indexing"):
            self.docs.mkdir(parents=True, exist_ok=True)
            build = self.dir / f"{BUILD_PREFIX}{time.time_ns():x}"
            build.mkdir()
            try:
                if not fresh and live.is_dir():  # the last whole index, copied (not the writer's lock)
                    shutil.copytree(live, build / INDEX_LINK, ignore=shutil.ignore_patterns("writer.lock"))
                else:
                    changed = None
                with Corpus(build) as corpus:
                    if not any(r.prefix == ROOT_NAME for r in corpus.roots()):
                        corpus.add_root(self.docs, name=ROOT_NAME)
                        changed = None
                    if changed is not None:
                        report = corpus.sync_paths([self.docs / n for n in dict.fromkeys(changed)])
                    else:
                        report = corpus.sync()
            except BaseException:
                shutil.rmtree(build, ignore_errors=True)
                raise
        return build / INDEX_LINK, report

    def swap_index(self, built: Path) -> None:
        """Make ``built`` (:meth:`build_index`) the index searches open, atomically: the
        copy's ``corpus`` is a symbolic link to it, replaced by a rename (a search that
        opened the index before goes on with it). A ``corpus`` folder of an older Kith is
        moved aside first. The builds before the one replaced are deleted (that one is
        kept: a search may be opening it now).

        Raises:
            ConfigError: ``copy-disk-full``, ``io-error``.
        """
        import secrets

        live = self.dir / INDEX_LINK
        with _disk(self.peer, "switching to the new index"):
            try:
                before = live.resolve().parent if live.is_symlink() else None
            except OSError:
                before = None
            if live.is_dir() and not live.is_symlink():  # an older Kith's index folder: moved aside once
                before = self.dir / f"{BUILD_PREFIX}0-{secrets.token_hex(4)}"
                before.mkdir()
                live.rename(before / INDEX_LINK)
            link = self.dir / f".{INDEX_LINK}-{secrets.token_hex(8)}"
            os.symlink(os.path.relpath(built, self.dir), link)
            try:
                os.replace(link, live)
            except BaseException:
                link.unlink(missing_ok=True)
                raise
        keep = {built.parent, before}
        for old in self.dir.glob(BUILD_PREFIX + "*"):
            if old not in keep:
                shutil.rmtree(old, ignore_errors=True)

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
        current = self.cache.current if self.cache is not None else {}
        if not force and current.get(self.dir) == stamp and index_dir.is_dir():
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
            current[self.dir] = stamp
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
                if damaged and self.cache is not None:  # a search holding the broken index open lets go of it
                    self.cache.drop(self.dir)
                self.index(None, fresh=damaged)  # a damaged one is replaced by one built from docs/
            except CorpusError as exc:
                if exc.code == "index-locked":
                    return False
                raise
        finally:
            release_owner_lock(fd)
        current[self.dir] = stamp
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
        if self.cache is not None:  # a copy its searches hold open is closed (by its last search)
            self.cache.drop(self.dir)
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
        ``{"code", "message", "hint"}`` (one damaged copy never hides the others). Read
        through :meth:`committed`."""
        try:
            state = self.committed()
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
        copy asks for its end, the runner's every step; :class:`OpenCopies` keeps the
        :class:`node.guest.peerview.FileView` of each copy's file)."""
        if self.cache is None:
            got = _read_grant(self.dir)
        else:
            grants = self.cache.grants
            path = self.dir / GRANT_FILE
            view = grants.get(path)
            if view is None:
                from node.guest.peerview import FileView

                view = keep(grants, path, FileView(self.dir, GRANT_FILE, _read_grant), 256)
            got = view.now()
        return dict(got) if got is not None else None

    def write_grant(self, state: dict[str, Any], now: float) -> None:
        """Record a checked copy grant state (:func:`check_copy_state`) as ``grant.json``,
        told at ``now`` (epoch seconds)."""
        atomic_write(self.dir / GRANT_FILE, json.dumps(
            {"stamp": state["stamp"], "until": state["until"], "seenAt": _rfc3339(now)},
            sort_keys=True).encode("utf-8"))

    def grant_newer_than(self, told_at: float) -> bool:
        """True when ``grant.json`` records a handshake's word told at or after ``told_at``
        (epoch seconds; ``seenAt`` is kept to the second, so one of the same second counts
        as newer): a sync over an older session must not replace it (specs/copies.md §5.1).
        False when there is none or it cannot be read."""
        from node.common.grants import until_time

        seen = (self.grant() or {}).get("seenAt")
        try:
            return isinstance(seen, str) and until_time(seen) >= int(told_at)
        except KithError:
            return False

    def until(self, state: dict[str, Any] | None = None) -> str | None:
        """When this copy ends (RFC 3339 UTC) or None (never said): the host's last
        handshake's ``until`` (``grant.json``) when one was recorded, else the one of the
        last sync (``manifest.json``)."""
        grant = self.grant()
        if grant is not None:
            return grant.get("until")
        return (state if state is not None else self.committed()).get("until")

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


def list_copies(home: Path, *, cache: "OpenCopies | None" = None) -> list[dict[str, Any]]:
    """Every copy of ``home`` (:meth:`CopyStore.summary`), by peer name; a damaged one is a
    row with ``error`` that the background tasks (expiry, re-sync, re-index) leave alone.
    ``cache``: as :class:`CopyStore`'s (the runner's: each grant.json read once until it changes)."""
    from node.trust.peers import NAME_RE

    root = copies_root(home)
    if not root.is_dir():
        return []
    return [CopyStore(home, d.name, cache=cache).summary() for d in sorted(root.iterdir())
            if d.is_dir() and NAME_RE.fullmatch(d.name) and (d / MANIFEST_FILE).is_file()]


#: The most copies one :class:`OpenCopies` keeps open at once (least recently used closed first).
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


def _read_grant(folder: Path) -> dict[str, Any] | None:
    """What ``folder``'s ``grant.json`` holds, or None (none, or unreadable)."""
    try:
        got = read_json_state(folder / GRANT_FILE)
    except (OSError, ConfigError):
        return None
    return got if isinstance(got, dict) else None


class OpenCopies:
    """What one process keeps of the copies it searches: the copies held open (their index,
    manifest and id maps; at most ``max_open``, least recently used closed first), when each
    copy's index was last found current, and the ``grant.json`` each last read. Its owner
    is the process's session pool (:attr:`node.guest.pool.SessionPool.copies`), closed with
    it; a caller without one opens a copy for one search. Thread-safe."""

    def __init__(self, max_open: int = OPEN_COPIES_MAX) -> None:
        self.max_open = max_open
        self._open: dict[Path, _OpenCopy] = {}
        self._lock = threading.Lock()
        #: copy folder → the manifest's mtime_ns when its index was last found current
        #: (:meth:`CopyStore.reindex_if_outdated`; the code's schema cannot change within a process)
        self.current: dict[Path, int] = {}
        #: grant.json path → its view, read again only when the file changed
        #: (:class:`node.guest.peerview.FileView`; :meth:`CopyStore.grant`)
        self.grants: dict[Path, Any] = {}
        #: manifest.json path → its view, read again only when the file changed
        #: (:meth:`CopyStore.committed`: the runner's steps, which change nothing)
        self.manifests: dict[Path, Any] = {}

    def held(self, folder: Path) -> "_OpenCopy | None":
        """The copy held open for ``folder``, or None."""
        with self._lock:
            return self._open.get(folder)

    def __len__(self) -> int:
        return len(self._open)

    def drop(self, folder: Path) -> None:
        """Forget ``folder``'s copy: closed now, or by its last search (removed, damaged)."""
        self.current.pop(folder, None)
        with self._lock:
            held = self._open.pop(folder, None)
            if held is not None:
                _retire(held)

    def acquire(self, store: CopyStore) -> "_OpenCopy":
        """The copy held open at its committed state, opened (again) when the manifest
        changed since (a sync committed; the copy was removed and made anew); its ``users``
        counted up.

        Raises:
            ConfigError: ``copy-not-found`` (no index, or the manifest went); ``config-invalid``.
        """
        from node.corpus.store import Corpus

        try:
            st = store.path.stat()
        except OSError:
            st = None
        if st is None or not (store.dir / "corpus").is_dir():
            self.drop(store.dir)
            raise ConfigError("copy-not-found", f"no copy of {store.peer} is kept here (`kith copies sync {store.peer}`)")
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            entry = self._open.get(store.dir)
            if entry is not None and entry.key == key:
                entry.users += 1
                self._open[store.dir] = self._open.pop(store.dir)  # most recently used last
                return entry
        fresh = _OpenCopy(key, Corpus(store.dir, readonly=True), store.load())
        fresh.users = 1
        with self._lock:
            old = self._open.pop(store.dir, None)
            if old is not None:
                _retire(old)
            self._open[store.dir] = fresh
            while len(self._open) > self.max_open:
                _retire(self._open.pop(next(iter(self._open))))
        return fresh

    def release(self, entry: "_OpenCopy") -> None:
        """One search on ``entry`` ended: closed when it was retired and was the last."""
        with self._lock:
            entry.users -= 1
            if entry.retired and entry.users == 0:
                entry.corpus.close()

    def close(self) -> None:
        """Close every copy held open (searches running finish on theirs first)."""
        with self._lock:
            while self._open:
                _retire(self._open.popitem()[1])
        self.current.clear()
        self.grants.clear()


def _retire(entry: _OpenCopy) -> None:
    """Close ``entry`` now, or when its last search ends (call with the lock held)."""
    entry.retired = True
    if entry.users == 0:
        entry.corpus.close()
