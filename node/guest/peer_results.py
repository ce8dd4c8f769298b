"""The bounds a peer's ``results`` must respect before a guest merges or stores them, and
their check (specs/ask.md §3): shared by the fan-out (``kith ask``, node/guest/fanout.py)
and the outbox's :func:`node.guest.outbox.classify` (live and sealed answers). Imports
nothing heavy: a process that only takes sealed answers checks them without the session
pool, iroh or the asker.
"""

from __future__ import annotations

from typing import Any

#: Longest ``source`` of a result (characters).
MAX_SOURCE_CHARS = 1024
#: Longest ``textPreview`` of a result (characters).
MAX_PREVIEW_CHARS = 8000
#: Longest ``id`` of a result (characters).
MAX_ID_CHARS = 256


def check_results(envelope: Any) -> list[dict[str, Any]]:
    """The results of a peer's envelope (its ``results`` list, each an object with a
    ``source`` of 1-:data:`MAX_SOURCE_CHARS`, an ``id`` of 1-:data:`MAX_ID_CHARS` and a
    ``textPreview`` of at most :data:`MAX_PREVIEW_CHARS` characters).

    Raises:
        ValueError: the envelope or any result is malformed (the caller's
            ``peer-answer-invalid``).
    """
    if not isinstance(envelope, dict) or not isinstance(envelope.get("results"), list):
        raise ValueError("no results list")
    out = []
    for r in envelope["results"]:
        if not isinstance(r, dict):
            raise ValueError("a result is not an object")
        src, rid, text = r.get("source"), r.get("id"), r.get("textPreview")
        if not (isinstance(src, str) and 0 < len(src) <= MAX_SOURCE_CHARS):
            raise ValueError("bad source")
        if not (isinstance(rid, str) and 0 < len(rid) <= MAX_ID_CHARS):
            raise ValueError("bad id")
        if not (isinstance(text, str) and len(text) <= MAX_PREVIEW_CHARS):
            raise ValueError("bad textPreview")
        out.append(r)
    return out


__all__ = ["MAX_ID_CHARS", "MAX_PREVIEW_CHARS", "MAX_SOURCE_CHARS", "check_results"]
