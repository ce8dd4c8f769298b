"""Source identifiers: the single normalization point (DESIGN §1, §10; seed p2p-path-standard).

Every source that policy, the egress gate or the wire sees goes through
:func:`normalize_source` first. It returns a *canonical source id* or ``None``; it never
raises and never hands back a real path of a root.

Canonical forms (all start with ``/``, use ``/`` only, are NFC, have no empty, ``.`` or
``..`` segment and no trailing slash):

* virtual id ``/<root-prefix>/<relative path>`` — a file inside a source root;
* datasource id ``/<kind>/<instance>/...`` — passes through unchanged;
* an absolute path outside every root, as itself with ``\\`` turned into ``/``;
  a Windows drive path ``c:\\x\\y`` becomes ``/C:/x/y`` (drive letter upper-cased, leading
  ``/`` so that every canonical id starts with ``/``) and a UNC path ``\\\\srv\\share\\x``
  becomes ``//srv/share/x`` (exactly two leading slashes), on every host.

The full input → output table is in ``specs/policy.md``.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from node.corpus.types import Hit, Root
from node.common.kept import keep

#: Longest accepted source (characters, after NFC); longer input normalizes to ``None``.
MAX_SOURCE_CHARS = 4096

_DRIVE = re.compile(r"^([A-Za-z]):[\\/]")
_SEPS = "/\\"
_MULTI_SLASH = re.compile(r"/{2,}")
_CANON_DRIVE = re.compile(r"^/[A-Z]:(/|$)")
_SURROGATE = re.compile("[\ud800-\udfff]")  # undecodable file-name bytes: not UTF-8 on the wire


_O_PATH = getattr(os, "O_PATH", 0)
_PROC_FD = Path("/proc/self/fd")


def resolve_file(path: str) -> tuple[str, os.stat_result]:
    """``(real path, stat)`` of an existing file, every symlink resolved (the serve-time
    resolver: :meth:`SourceNormalizer.served_file`).

    On Linux the kernel resolves the path once (``O_PATH`` open, the descriptor's
    ``/proc/self/fd`` link, ``fstat`` on the same descriptor: a few syscalls, and the
    path checked is the file stat'ed); elsewhere, or without ``/proc``,
    ``os.path.realpath(strict=True)`` then ``os.stat``.

    Raises:
        OSError: the path does not exist or cannot be resolved.
    """
    if _O_PATH:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC)
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
            if real.startswith("/") and not real.endswith(" (deleted)"):
                return real, os.fstat(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
    real = os.path.realpath(path, strict=True)
    return real, os.stat(real)


def lexical_form(source: object) -> str | None:
    """Canonicalize ``source`` without touching the file system (no roots involved).

    This is the purely textual half of :func:`normalize_source`; policy globs use the same
    canonicalization (``node.policy.store``).

    Returns the canonical absolute form (see module docstring) or ``None`` for anything
    that is not an absolute path / id: empty, NUL, lone surrogates (undecodable file-name
    bytes), too long, URL or ``kind:`` scheme, relative path (with or without backslashes),
    drive-relative ``C:x``, a lone leading backslash, ``.``/``..`` segments, or a path with
    no segment at all (``/``).
    """
    if not isinstance(source, str) or not source or "\x00" in source:
        return None
    s = unicodedata.normalize("NFC", source)
    if len(s) > MAX_SOURCE_CHARS or (not s.isascii() and _SURROGATE.search(s)):
        return None
    m = _DRIVE.match(s)
    if m:
        head, body = f"/{m.group(1).upper()}:", s[2:]
    elif len(s) > 2 and s[0] in _SEPS and s[1] in _SEPS and s[2] not in _SEPS:
        head, body = "/", s[1:]  # UNC: keep exactly two leading slashes
    elif s[0] == "/":
        head, body = "", s
    else:
        # relative path, scheme (http:, file:, kind:rest), C:x, or a lone leading "\"
        return None
    body = body.replace("\\", "/")
    if "//" in body:
        body = _MULTI_SLASH.sub("/", body)
    body = body.rstrip("/")
    if not body:
        return None
    if "/." in body:  # only then can a segment be "." or ".."
        segments = body.split("/")[1:]
        if "." in segments or ".." in segments:
            return None
    return head + body


def _plain_name(name: str) -> bool:
    """Whether ``name`` (one path segment) is its own :func:`lexical_form` spelling: what
    :meth:`SourceNormalizer.folder_files` may append to a canonical folder id."""
    if not name or name in (".", "..") or "\\" in name or "/" in name or "\x00" in name:
        return False
    return name.isascii() or (unicodedata.is_normalized("NFC", name)
                              and _SURROGATE.search(name) is None)


def _first_segment(canon: str) -> str | None:
    """Return the first segment of a canonical id (``None`` for a UNC id)."""
    if canon.startswith("//"):
        return None
    return canon[1:].split("/", 1)[0]


def _native(canon: str) -> str | None:
    """This host's spelling of canonical absolute ``canon``, or ``None`` if foreign.

    On POSIX, drive (``/C:/...``) and UNC (``//srv/...``) ids are foreign; on Windows,
    ``/C:/x`` is ``C:/x`` and POSIX-style ids are foreign.
    """
    drive = _CANON_DRIVE.match(canon) is not None
    if os.name == "nt":
        if drive:
            return canon[1:]
        return canon if canon.startswith("//") else None
    if drive or canon.startswith("//"):
        return None
    return canon


_scan = threading.local()


@contextlib.contextmanager
def folders_resolved_once() -> Iterator[None]:
    """Within this block, in this thread, :func:`_realpath` resolves each folder once: a
    path's real path is its folder's real path (looked up once, kept until the block
    ends) joined with its last segment, resolved again only when that segment is itself
    a symlink — the same answer as :func:`os.path.realpath` (it resolves segment by
    segment, left to right), with one ``lstat`` per path instead of one per segment.
    For scans that normalize every document of a corpus
    (:meth:`node.corpus.views.Views.visible_docs`); nestable."""
    outer = getattr(_scan, "folders", None)
    if outer is None:
        _scan.folders = {}
    try:
        yield
    finally:
        if outer is None:
            _scan.folders = None


def _realpath(path: str) -> str | None:
    try:
        folders = getattr(_scan, "folders", None)
        if folders is None:
            return os.path.realpath(path)
        head, tail = os.path.split(path)
        if not head or not tail or tail in (".", "..") or not os.path.isabs(path):
            return os.path.realpath(path)
        real = folders.get(head)
        if real is None:
            real = folders[head] = os.path.realpath(head)
        joined = os.path.join(real, tail)
        return os.path.realpath(joined) if os.path.islink(joined) else joined
    except (OSError, ValueError, RuntimeError):
        return None


def inside(path: str, folder: str) -> str | None:
    """The one containment test of the corpus: ``path`` relative to ``folder`` ('' for the
    folder itself), or ``None`` when it is not inside.

    Both are absolute paths in the same spelling (resolved, when symlinks matter);
    segments are compared whole (``/a/bc`` is not inside ``/a/b``), exactly and
    lexically — no file-system access. Used by the normalizer, the serve-time origin check
    (:meth:`SourceNormalizer.served_file`) and the sync's walk (:mod:`node.corpus.ingest`).
    """
    if path == folder:
        return ""
    base = folder if folder.endswith(os.sep) else folder + os.sep
    if path.startswith(base):
        return path[len(base):]
    return None


def _fold(name: str) -> str:
    """The comparison key of a file name on a case-insensitive file system (NFC + casefold)."""
    return unicodedata.normalize("NFC", name).casefold()


def _inside_folded(path: str, folder: str) -> str | None:
    """:func:`inside`, comparing whole segments case-insensitively (NFC + casefold).

    Returns the relative part spelled as in ``path`` (its case is corrected later).
    """
    exact = inside(path, folder)
    if exact is not None:
        return exact
    parts = [p for p in path.split(os.sep) if p]
    fparts = [p for p in folder.split(os.sep) if p]
    if len(parts) < len(fparts) or not path.startswith(os.sep):
        return None
    if any(_fold(a) != _fold(b) for a, b in zip(parts, fparts)):
        return None
    return os.sep.join(parts[len(fparts):])


def plan_root_prefixes(paths: Iterable[str | os.PathLike[str]],
                       taken: Iterable[str] = ()) -> list[str]:
    """Virtual prefixes for roots added in the order given (DESIGN §10).

    A root's prefix is its folder's basename (``root`` for ``/``); when that prefix is
    already taken (by ``taken`` — the persisted prefixes — or an earlier path of this
    call) it becomes ``<basename>-2``, ``-3``… The order is the order of addition, so a
    later root never renames an earlier one.

    Args:
        paths: root folders in the order they are added (only their basenames are used).
        taken: prefixes already persisted.

    Returns:
        One prefix per path, same order.
    """
    used = set(taken)
    out: list[str] = []
    for path in paths:
        base = Path(os.fspath(path)).name or "root"
        prefix, n = base, 1
        while prefix in used:
            n += 1
            prefix = f"{base}-{n}"
        used.add(prefix)
        out.append(prefix)
    return out


def detect_case_insensitive(folder: str) -> bool:
    """Whether the file system holding ``folder`` ignores case (macOS, Windows defaults).

    Probes the folder's own path with its letters' case swapped: the same file → case
    insensitive. A path with no cased letter, or any ``OSError``, counts as sensitive.
    """
    swapped = folder.swapcase()
    if swapped == folder:
        return False
    try:
        return os.path.samefile(swapped, folder)
    except (OSError, ValueError):
        return False


#: Canonical ids of real paths a :class:`SourceNormalizer` keeps (case-sensitive file
#: systems only; ~200 bytes each).
VIRTUAL_KEPT = 65_536


class SourceNormalizer:
    """:func:`normalize_source` / :func:`resolve_source_id` with the roots prepared once.

    The roots' real paths (symlinks resolved) are computed at construction; build a new
    normalizer when the roots change. Instances are immutable (but for a cache of the
    canonical ids they computed, a pure function of the roots) and thread-safe.

    Args:
        roots: the registered source roots (prefix + real absolute folder).
        case_insensitive: whether the roots live on a case-insensitive file system; ``None``
            (default) probes the first root with :func:`detect_case_insensitive`. When true,
            a path inside a root is compared with the root case-insensitively and each
            segment that exists on disk is rewritten to its on-disk spelling before policy
            sees it (so ``/docs/SECRET/x`` is ``/docs/secret/x`` and a deny glob on
            ``/docs/secret/**`` still applies). Globs themselves are never case-folded.
        listdir: lists a folder's entry names (default :func:`os.listdir`; tests inject a
            case-folding view to simulate a case-insensitive file system).
    """

    def __init__(self, roots: Sequence[Root], *, case_insensitive: bool | None = None,
                 listdir: Callable[[str], Iterable[str]] = os.listdir) -> None:
        self.roots: tuple[Root, ...] = tuple(roots)
        self._by_prefix: dict[str, Root] = {}
        for root in self.roots:
            self._by_prefix.setdefault(root.prefix, root)
        # (real folder, root), longest first: the longest containing root wins
        real = [(_realpath(r.path), r) for r in self.roots]
        self._real: list[tuple[str, Root]] = sorted(
            ((p, r) for p, r in real if p), key=lambda pr: len(pr[0]), reverse=True)
        self._real_of: dict[str, str] = {}
        for p, r in real:
            if p:
                self._real_of.setdefault(r.prefix, p)
        self._names: set[str] = {r.path.rstrip(_SEPS) or "/" for r in self.roots}
        self._names.update(p for p, _ in self._real)
        if case_insensitive is None:
            case_insensitive = bool(self._real) and detect_case_insensitive(self._real[0][0])
        self.case_insensitive = case_insensitive
        self._listdir = listdir
        self._contains = _inside_folded if case_insensitive else inside
        #: ``{real path: canonical id}`` given by :meth:`_virtual_of` on a case-sensitive
        #: file system, where it is a pure function of the path and the roots (no disk
        #: access): the serve-time origin check (:meth:`served_file`) asks it for every
        #: hit of every answer. At most :data:`VIRTUAL_KEPT` kept (emptied when full).
        self._virtual_kept: dict[str, str | None] = {}

    def _on_disk(self, folder: str, rel: str) -> str | None:
        """``rel`` (inside ``folder``) with each existing segment in its on-disk case.

        Segments from the first one that does not exist on are kept as written. Two
        entries that differ only by case (possible when the "insensitive" view is wrong)
        → ``None``: fail closed rather than pick one.
        """
        parts = [p for p in rel.split(os.sep) if p]
        cur = folder
        out: list[str] = []
        for i, part in enumerate(parts):
            try:
                entries = list(self._listdir(cur))
            except (OSError, ValueError):
                out.extend(parts[i:])
                break
            if part in entries:
                name = part
            else:
                key = _fold(part)
                found = [e for e in entries if _fold(e) == key]
                if len(found) > 1:
                    return None
                if not found:
                    out.extend(parts[i:])
                    break
                name = found[0]
            out.append(name)
            cur = os.path.join(cur, name)
        return os.sep.join(out)

    def _virtual_of(self, real: str, depth: int = 0) -> str | None:
        if self.case_insensitive:  # reads the disk (on-disk case): never kept
            return self._virtual_of_disk(real, depth)
        kept = self._virtual_kept
        if real in kept:
            return kept[real]
        found = self._virtual_of_disk(real, depth)
        return keep(kept, real, found, VIRTUAL_KEPT)

    def _virtual_of_disk(self, real: str, depth: int = 0) -> str | None:
        for folder, root in self._real:
            rel = self._contains(real, folder)
            if rel is None:
                continue
            if self.case_insensitive and rel:
                fixed = self._on_disk(folder, rel)
                if fixed is None:
                    return None
                if fixed != rel:
                    # the on-disk spelling may name a symlink the first resolution did not
                    # see: resolve again and re-check containment (bounded)
                    again = _realpath(os.path.join(folder, fixed))
                    if again is None or depth >= 4:
                        return None
                    if again != os.path.join(folder, fixed):
                        return self._virtual_of(again, depth + 1)
                    rel = fixed
            rel = unicodedata.normalize("NFC", rel.replace("\\", "/")).strip("/")
            return lexical_form(f"/{root.prefix}/{rel}" if rel else f"/{root.prefix}")
        return None

    def _target(self, canon: str) -> tuple[Root, str | None] | None:
        first = _first_segment(canon)
        root = self._by_prefix.get(first) if first is not None else None
        if root is None:
            return None
        rel = canon[len(root.prefix) + 2:]
        return root, _realpath(os.path.join(root.path, *rel.split("/")) if rel else root.path)

    def __call__(self, source: str) -> str | None:
        """Return the canonical id of ``source`` or ``None``; see :func:`normalize_source`."""
        canon = lexical_form(source)
        if canon is None or not self.roots:
            return canon
        virtual = self._target(canon)
        if virtual is not None:
            target = virtual[1]
            return self._virtual_of(target) if target is not None else None
        native = _native(canon)
        if native is None:
            return canon  # another host's path form (drive/UNC on POSIX): never a root here
        resolved = _realpath(native)
        if resolved is None:
            return None
        found = self._virtual_of(resolved)
        if found is not None:
            return found
        if any(self._contains(native, name) is not None for name in self._names):
            return None  # inside a root by name, outside every root after symlinks
        return canon

    def folder_files(self, folder: str) -> tuple[str, set[str]] | None:
        """The canonical id of the folder a virtual id ``folder`` names and the names in
        it whose canonical id is that id + ``"/"`` + the name — what :meth:`__call__`
        gives ``folder + "/" + name`` — read with one ``os.scandir`` of the folder.

        A name is listed only when that holds without resolving it: a regular entry (not
        a symlink, which may lead anywhere), not the real folder of a root (a nested root
        wins), spelled canonically (NFC, no ``\\``, no lone surrogate, not ``.``/``..``).
        Any other name — and every name when this returns None — must go through
        :meth:`__call__`.

        Returns:
            ``(canonical folder id, names)``, or None when the shortcut does not apply: a
            case-insensitive file system (names are rewritten to their on-disk case), an
            id that is not under a root prefix, a folder that resolves outside every root
            or cannot be listed.
        """
        if self.case_insensitive:
            return None
        canon = lexical_form(folder)
        virtual = self._target(canon) if canon is not None else None
        if virtual is None or virtual[1] is None:
            return None
        real = virtual[1]
        canonical = self._virtual_of(real)
        if canonical is None:
            return None
        try:
            with os.scandir(real) as entries:
                names = {e.name for e in entries if not e.is_symlink()}
        except (OSError, ValueError):
            return None
        for root_real, _root in self._real:  # a root's own folder: its id is its prefix
            head, tail = os.path.split(root_real)
            if head == real:
                names.discard(tail)
        room = MAX_SOURCE_CHARS - len(canonical) - 1
        return canonical, {n for n in names if _plain_name(n) and len(n) <= room}

    def served_file(self, prefix: str, rel_path: str
                    ) -> tuple[str, os.stat_result, str | None] | None:
        """Resolve the file ``rel_path`` of the root ``prefix`` once, for serving it
        (DESIGN §9 serve-time origin, seed ``provider-origins``; run once per document per
        answer by :mod:`node.corpus.retrieval`).

        Args:
            prefix: the document's root prefix (its tracking row's ``root_prefix``).
            rel_path: its path relative to the root, ``/``-separated, on-disk spelling.

        Returns:
            ``(real path, stat of that file, canonical id)`` when the file exists and its
            real path (every symlink resolved, :func:`resolve_file`) lies inside its own
            root's real folder (:func:`inside`); the canonical id is the one
            :meth:`__call__` gives the file (the longest containing root wins, on-disk case
            on a case-insensitive file system), or None when it has none. ``None`` when the
            prefix is unknown, the file is gone, or it resolves outside its root. Never
            raises.
        """
        folder = self._real_of.get(prefix)
        if folder is None:
            return None
        try:
            real, st = resolve_file(os.path.join(folder, rel_path))
        except (OSError, ValueError):
            return None
        if inside(real, folder) is None:
            return None
        return real, st, self._virtual_of(real)

    def resolve(self, source_id: str) -> Path | None:
        """Return the real path of virtual id ``source_id``; see :func:`resolve_source_id`."""
        canon = lexical_form(source_id)
        virtual = self._target(canon) if canon is not None else None
        if virtual is None or virtual[1] is None:
            return None
        root, target = virtual
        real_root = _realpath(root.path)
        if real_root is None or inside(target, real_root) is None:
            return None
        return Path(target)


def normalize_source(source: str, roots: Sequence[Root]) -> str | None:
    """Return the canonical source id of ``source`` or ``None`` (DESIGN §10).

    Args:
        source: a virtual id, a datasource id, or an OS-absolute path (any host's form).
        roots: the registered source roots (prefix + real folder).

    Returns:
        * first segment names a root prefix (a virtual id; seed rule 1) → the virtual id of
          the file it resolves to: itself normally, the nested root's id when a longer root
          contains it, ``None`` when symlinks take it outside every root;
        * a real path inside a root, symlinks resolved before the containment test, the
          longest containing root winning (seed rule 2) → ``/<prefix>/<rel>``;
        * any other absolute path or datasource id (seed rules 3, 4) → itself, canonicalized
          (``\\`` → ``/``, repeated slashes collapsed, trailing slash dropped, NFC) — except a
          path that lies inside a root by name but outside every root after symlinks →
          ``None``;
        * anything else (``.``/``..`` segments, URL or ``kind:`` schemes, relative paths,
          NUL, empty, longer than :data:`MAX_SOURCE_CHARS`) → ``None``.

        Never raises; never returns a root's real path. With no roots only the lexical
        rules apply (no file-system access).
    """
    if not roots:  # what SourceNormalizer(()) answers, without building one
        return lexical_form(source)
    return SourceNormalizer(roots)(source)


def resolve_source_id(source_id: str, roots: Sequence[Root]) -> Path | None:
    """Map virtual id ``/<prefix>/<rel>`` to the real file inside its root.

    Args:
        source_id: a virtual id (non-canonical spellings such as doubled slashes are
            accepted; real paths and datasource ids are not virtual ids).
        roots: the registered source roots.

    Returns:
        The symlink-resolved real path, or ``None`` when the id is invalid, names no known
        root, or resolves outside its own root (symlink escape). Never raises.
    """
    return SourceNormalizer(roots).resolve(source_id)


def carried_id(hit: Hit) -> str | None:
    """The canonical id resolved for ``hit`` when it was served (``Hit.origin_id``), if it
    still belongs to the hit's source id — then the gate and the owner's view use it
    instead of resolving the source again; None otherwise (normalize ``hit.source_id``).

    It belongs when the source id is the hit's own origin as recorded:
    ``/<root_prefix>/<rel_path>`` (as written or in NFC, what the record stores) for a file
    or archive member; for a datasource record (no root), when it is the lexical form of
    the source id. A hit whose source id was changed after it was served, or that was
    built without one, gets None.
    """
    oid = hit.origin_id
    if oid is None:
        return None
    if hit.root_prefix is None:
        return oid if lexical_form(hit.source_id) == oid else None
    textual = f"/{hit.root_prefix}/{hit.rel_path}" if hit.rel_path else f"/{hit.root_prefix}"
    if hit.source_id == textual or hit.source_id == unicodedata.normalize("NFC", textual):
        return oid
    return None
