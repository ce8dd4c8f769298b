"""How many times this process opens a file, seen by a Python audit hook (``open`` events:
the real reads, nothing replaced). A test that says a file is read once, or again only when
it changed, counts with :func:`counting`."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

#: the counters :func:`counting` holds open: file name → opens seen
_ACTIVE: list[dict[str, int]] = []
_INSTALLED = False


def _hook(event: str, args: tuple) -> None:
    if event != "open" or not _ACTIVE or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    name = os.path.basename(os.fsdecode(args[0]))
    for counts in _ACTIVE:
        if name in counts:
            counts[name] += 1


@contextlib.contextmanager
def counting(*names: str) -> Iterator[dict[str, int]]:
    """Count this process's opens of files named ``names`` (base names, e.g.
    ``"grant.json"``) inside the ``with`` block; yields ``{name: opens}``, updated as they
    happen. The hook is installed once per process (audit hooks cannot be removed) and does
    nothing outside a block."""
    global _INSTALLED
    if not _INSTALLED:
        sys.addaudithook(_hook)
        _INSTALLED = True
    counts = {n: 0 for n in names}
    _ACTIVE.append(counts)
    try:
        yield counts
    finally:
        _ACTIVE.remove(counts)
