"""The source-id glob language (DESIGN §10, specs/policy.md §1): one matcher for the
egress policy's rules and the search request's ``sources`` filter.

* ``*`` and ``?`` never cross ``/``; ``**`` (a whole segment) matches zero or more whole
  segments; every other character is literal (no ``[...]`` classes, no escapes).
* A glob without any wildcard (``*``, ``?``) names a folder or file *and everything below
  it*: ``/odd`` (and ``/odd/``, the same canonical glob) matches ``/odd`` and
  ``/odd/x/y.txt`` — for policy rules of every tier and the search filter alike (issue 20:
  a folder rule must never silently cover nothing under the folder).
* Matching is linear in the id and glob sizes (no backtracking regex a peer could make
  explode with ``*?*?*?...``).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

from node.common.errors import PolicyError
from node.corpus import MAX_GLOB_CHARS  # stated at the package's root (the answer contract reads it)
from node.corpus.sources import lexical_form

#: Bounds on one glob (DESIGN §14): at most this many ``**`` segments; its characters:
#: :data:`MAX_GLOB_CHARS`.
MAX_DOUBLE_STARS = 8


def _glob_error(glob: object, why: str, where: str = "") -> PolicyError:
    return PolicyError("policy-bad-glob", f"{where}invalid glob {glob!r}: {why}")


def canonical_glob(glob: str, *, where: str = "") -> str:
    """Validate ``glob`` and return its canonical form (DESIGN §10).

    The glob is canonicalized like a source (:func:`node.corpus.sources.lexical_form`): NFC,
    ``\\`` → ``/``, repeated slashes collapsed, trailing slash dropped, ``C:\\x`` →
    ``/C:/x``, ``\\\\srv\\x`` → ``//srv/x``. Consecutive ``**`` segments collapse to one.

    Args:
        glob: the glob as written by the owner.
        where: a prefix for the error message (e.g. ``"policy.toml: rule #2: "``).

    Returns:
        The canonical glob (always starts with ``/``).

    Raises:
        PolicyError: ``policy-bad-glob`` when the glob is not a string, is empty, contains
            NUL or text that is not UTF-8 (a lone surrogate), is longer than :data:`MAX_GLOB_CHARS`, does not start with ``/`` (or a
            drive/UNC prefix), has a ``.``/``..`` segment, has ``**`` inside a segment, or
            more than :data:`MAX_DOUBLE_STARS` ``**`` segments.
    """
    if not isinstance(glob, str) or not glob:
        raise _glob_error(glob, "must be a non-empty string", where)
    if "\x00" in glob:
        raise _glob_error(glob, "contains NUL", where)
    try:
        glob.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 (lone surrogates): no source id has them
        raise _glob_error(glob, "is not valid UTF-8 text", where) from None
    if len(glob) > MAX_GLOB_CHARS:
        raise _glob_error(glob[:40] + "...", f"longer than {MAX_GLOB_CHARS} characters", where)
    canon = lexical_form(glob)
    if canon is None:
        s = unicodedata.normalize("NFC", glob).replace("\\", "/")
        if s.startswith("/") and any(seg in (".", "..") for seg in s.split("/")):
            raise _glob_error(glob, "'.' and '..' segments are not allowed", where)
        raise _glob_error(glob, "must be absolute: start with '/' (or C:/..., //server/...)", where)
    head = "/" if canon.startswith("//") else ""
    segments: list[str] = []
    for seg in canon[len(head) + 1:].split("/"):
        if "**" in seg and seg != "**":
            raise _glob_error(glob, "'**' must be a whole segment (use '*' inside a name)", where)
        if seg == "**" and segments and segments[-1] == "**":
            continue
        segments.append(seg)
    if segments.count("**") > MAX_DOUBLE_STARS:
        raise _glob_error(glob, f"more than {MAX_DOUBLE_STARS} '**' segments", where)
    return head + "/" + "/".join(segments)


def _piece(text: str) -> re.Pattern[str]:
    """Regex for a fixed-length piece of a segment: literal characters and ``?``."""
    return re.compile("".join("." if ch == "?" else re.escape(ch) for ch in text), re.DOTALL)


class _SegmentGlob:
    """One glob segment (no ``/``, not ``**``): literals, ``?`` and ``*``.

    ``a*b?*c`` is split at ``*`` into fixed-length pieces (``a``, ``b?``, ``c``) compiled to
    regexes: the first must match at the start, the last at the end, the middle ones are
    found left to right (leftmost placement is optimal for fixed-length pieces), so a match
    costs O(len(segment) * len(glob)) — no backtracking blow-up.
    """

    __slots__ = ("_fixed", "_first", "_last", "_middle", "_first_len", "_last_len")

    def __init__(self, glob: str) -> None:
        if "*" not in glob:
            self._fixed: re.Pattern[str] | None = _piece(glob)
            return
        self._fixed = None
        parts = glob.split("*")
        self._first, self._last = _piece(parts[0]), _piece(parts[-1])
        self._first_len, self._last_len = len(parts[0]), len(parts[-1])
        self._middle = [_piece(p) for p in parts[1:-1] if p]

    def match(self, segment: str) -> bool:
        if self._fixed is not None:
            return self._fixed.fullmatch(segment) is not None
        end = len(segment) - self._last_len
        if end < self._first_len:
            return False
        if self._first.match(segment) is None or self._last.fullmatch(segment, end) is None:
            return False
        pos = self._first_len
        for piece in self._middle:
            found = piece.search(segment, pos, end)
            if found is None:
                return False
            pos = found.end()
        return True


class GlobMatcher:
    """A compiled canonical glob (from :func:`canonical_glob`); :meth:`match` tests an id.

    The glob is split at ``**`` segments into groups of fixed length (in segments); the
    first group must match at the start, the last at the end, middle groups are placed
    leftmost in order. Each segment is matched by a :class:`_SegmentGlob`. This is the same
    language as the regex ``*`` → ``[^/]*``, ``?`` → ``[^/]``, ``/**`` → ``(?:/[^/]+)*``, but
    without the backtracking regex engines need for chained ``**``. A UNC glob
    (``//...``) matches only UNC ids and vice versa.
    """

    __slots__ = ("glob", "_unc", "_groups", "_head", "_tail", "_plain")

    def __init__(self, canon: str) -> None:
        self.glob = canon
        self._unc = canon.startswith("//")
        #: no wildcard: the id itself and every id below it (a folder rule)
        self._plain = "*" not in canon and "?" not in canon
        # cheap necessary conditions: the literal text before the first wildcard (up to its
        # last "/", which a zero-segment "**" may drop) and after the last wildcard
        first = min((i for i in (canon.find("*"), canon.find("?")) if i >= 0), default=len(canon))
        self._head = canon if first == len(canon) else canon[:canon.rfind("/", 0, first)]
        last = max(canon.rfind("*"), canon.rfind("?"))
        self._tail = canon[last + 1:] if last >= 0 else canon
        groups: list[list[_SegmentGlob]] = [[]]
        for seg in canon[2 if self._unc else 1:].split("/"):
            if seg == "**":
                groups.append([])
            else:
                groups[-1].append(_SegmentGlob(seg))
        self._groups = groups

    @staticmethod
    def _fits(group: list[_SegmentGlob], segments: list[str], at: int) -> bool:
        return all(g.match(segments[at + j]) for j, g in enumerate(group))

    def match(self, canonical: str) -> bool:
        """Whether canonical source id ``canonical`` matches the glob (a glob without
        wildcards: ``canonical`` is the glob or lies below it)."""
        if self._plain:
            return canonical == self.glob or canonical.startswith(self.glob + "/")
        if (canonical.startswith("//") != self._unc or not canonical.startswith(self._head)
                or not canonical.endswith(self._tail)):
            return False
        segments = canonical[2 if self._unc else 1:].split("/")
        groups = self._groups
        first, last = groups[0], groups[-1]
        if len(groups) == 1:
            return len(segments) == len(first) and self._fits(first, segments, 0)
        end = len(segments) - len(last)
        if end < len(first) or not self._fits(first, segments, 0) or not self._fits(last, segments, end):
            return False
        pos = len(first)
        for group in groups[1:-1]:
            while pos + len(group) <= end and not self._fits(group, segments, pos):
                pos += 1
            if pos + len(group) > end:
                return False
            pos += len(group)
        return True


    def covers_files_of(self, folder: str) -> bool | None:
        """Whether this glob matches every id directly inside the canonical ``folder``
        (``folder + "/" + name`` for any one-segment ``name``): True, none of them: False,
        or None when that depends on the name (then each id must be matched).

        Conservative: None is always a correct answer, True/False only when every name
        gives that result of :meth:`match`. Used to decide a whole folder at once
        (:meth:`node.policy.store.Policy.decide_folder`)."""
        if folder.startswith("//") != self._unc:
            return False
        if self._plain:  # the glob itself and everything below it
            glob = self.glob
            if folder == glob or folder.startswith(glob + "/"):
                return True
            return None if glob.startswith(folder + "/") else False
        head = self._head
        if len(head) <= len(folder):
            if not folder.startswith(head):
                return False
        elif not head.startswith(folder + "/"):
            return False
        else:
            return None  # the literal head reaches into the names
        groups = self._groups
        if len(groups) == 1:  # no "**": a fixed number of segments
            depth = folder.count("/") - (1 if self._unc else 0) + 1
            if depth != len(groups[0]):
                return False
        if (len(groups) == 2 and not groups[1] and self.glob == head + "/**"
                and (folder == head or folder.startswith(head + "/") or not head)):
            return True  # <literal folder>/**: everything below it
        return None


def folder_form(canon: str) -> str:
    """The ``/**`` spelling of a canonical glob: a glob without wildcards (a folder rule,
    ``/x``) → ``/x/**``, which names exactly the same ids (``**`` matches zero segments, so
    ``/x/**`` matches ``/x`` itself); any other glob unchanged. Two canonical globs with the
    same folder form name the same sources (specs/policy.md §1)."""
    if "*" in canon or "?" in canon:
        return canon
    return canon.rstrip("/") + "/**"


def specificity(canon: str) -> int:
    """Number of literal characters of a canonical glob (all but ``*`` and ``?``), counted
    on its :func:`folder_form`: ``/x`` and ``/x/**`` name the same sources and so are equally
    specific (a tie the policy breaks by the more restrictive tier, specs/policy.md §2)."""
    canon = folder_form(canon)
    return len(canon) - canon.count("*") - canon.count("?")


@functools.lru_cache(maxsize=512)
def source_glob(glob: str) -> Any:
    """The ``sources`` filter glob as a compiled matcher: the policy's glob language
    (``*``/``?`` within a segment, ``**`` a whole segment; a trailing ``/`` means everything
    below) and its linear-time :class:`GlobMatcher` — never a backtracking regex a peer
    could make explode. Here, not in node.corpus.search, so that the answer contract and
    an agent's scope check a glob without importing tantivy (issue 44: a guest that starts
    fast).

    Raises:
        PolicyError: ``policy-bad-glob`` for a glob outside that language.
    """
    return GlobMatcher(canonical_glob(glob + "**" if glob.endswith("/") else glob))
