"""What a sync never reads: default excludes and a root's ``.kithignore`` (issue 12).

A folder someone points Kith at often holds far more than documents: version control,
virtual environments, package caches. :class:`RootFilter` decides, for a path relative to
a root, whether the walk skips it:

* **default excludes** (always on): folders named in :data:`DEFAULT_EXCLUDED_DIRS`
  (``node_modules``, ``__pycache__``, ``venv``, ``site-packages``, …) and any folder holding
  a ``pyvenv.cfg`` (a Python virtual environment, whatever its name). Hidden names (``.git``,
  ``.venv``, ``.cache``…) are already skipped by the walk itself, and Kith homes by
  :func:`node.corpus.ingest.is_kith_home`.
* ``<root>/.kithignore``: gitignore syntax (``*.log``, ``build/``, ``!keep.md``, ``/top-only``,
  ``**/drafts``), matched with the `pathspec` library's :class:`pathspec.GitIgnoreSpec` — the
  same rules as git, including "a file under an excluded folder cannot be re-included".
  Only the file at the root is read (patterns are relative to the root); at most
  :data:`MAX_IGNORE_BYTES` bytes.

The filter is built once per root per sync (:meth:`RootFilter.for_root`) and is pure after
that: no I/O except the ``pyvenv.cfg`` check of a folder about to be entered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pathspec
from node.common.kept import keep

#: The ignore file read at the top of each root.
IGNORE_FILE = ".kithignore"
#: A larger .kithignore is read only up to this many bytes (bounded work per sync).
MAX_IGNORE_BYTES = 256 * 1024
#: Folder names never entered, wherever they are (generated or third-party content).
DEFAULT_EXCLUDED_DIRS = frozenset({
    "node_modules", "__pycache__", "venv", "site-packages", "dist-packages", "__pypackages__",
    "bower_components",
})
#: A folder holding this file is a Python virtual environment (PEP 405).
VENV_MARKER = "pyvenv.cfg"


@dataclass
class RootFilter:
    """The exclusion rules of one root.

    Attributes:
        spec: the root's ``.kithignore`` patterns (None: no file, or an empty one).
        patterns: how many patterns it holds (for the sync report).
    """

    spec: pathspec.PathSpec | None = None
    patterns: int = 0
    _dir_cache: dict[str, str | None] = field(default_factory=dict, repr=False)

    @classmethod
    def for_root(cls, base: Path) -> RootFilter:
        """Read ``<base>/.kithignore`` (if any) into a filter.

        Args:
            base: the root folder (resolved).

        Returns:
            The filter; an unreadable or non-UTF-8 ignore file counts as absent (the
            default excludes still apply) — it is the owner's own file, and a sync must
            not fail on it.
        """
        try:
            with open(base / IGNORE_FILE, "rb") as fh:
                raw = fh.read(MAX_IGNORE_BYTES)
        except OSError:
            return cls()
        lines = raw.decode("utf-8", "replace").splitlines()
        spec = pathspec.GitIgnoreSpec.from_lines(lines)
        count = sum(1 for ln in lines if ln.strip() and not ln.lstrip().startswith("#"))
        return cls(spec if count else None, count)

    def dir_reason(self, rel: str, full: Path) -> str | None:
        """Why the folder ``rel`` (``/``-separated, relative to the root) is not entered:
        ``"default-exclude"``, ``"virtualenv"``, ``"kithignore"``, or None to enter it."""
        name = rel.rsplit("/", 1)[-1]
        if name in DEFAULT_EXCLUDED_DIRS:
            return "default-exclude"
        try:
            if (full / VENV_MARKER).is_file():
                return "virtualenv"
        except OSError:
            pass
        if self.spec is not None and self.spec.match_file(rel + "/"):
            return "kithignore"
        return None

    def file_ignored(self, rel: str) -> bool:
        """True when the file ``rel`` matches the root's ``.kithignore``."""
        return self.spec is not None and self.spec.match_file(rel)

    def path_reason(self, rel: str, base: Path) -> str | None:
        """Why a single path (a watched change) is excluded: any folder on its way from
        the root, or the file itself; None when it is not. Folder answers are cached."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            sub = "/".join(parts[:i])
            if sub not in self._dir_cache:
                keep(self._dir_cache, sub, self.dir_reason(sub, base / sub), 4096)
            if self._dir_cache[sub] is not None:
                return self._dir_cache[sub]
        if os.path.isdir(base / rel):
            return self.dir_reason(rel, base / rel)
        return "kithignore" if self.file_ignored(rel) else None
