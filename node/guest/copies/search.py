"""Answering a question from a copy (``kith ask --peer NAME --copy``, the fallback when the
host is unreachable) and the copy texts ``kith verify`` reads (specs/copies.md §6,
specs/citations.md §7). A copy is never served to anyone else."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

from node.common.errors import CorpusError, KithError, PolicyError
from node.guest.copies.lifecycle import Notify, _ended_copy, withdrawn_sources
from node.guest.copies.store import CopyStore, OpenCopies, copies_root
from node.common.kept import keep

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


def search_copy(home: Path, peer: str, request: dict[str, Any], *, notify: Notify | None = None,
                copies: OpenCopies | None = None) -> dict[str, Any]:
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

    With ``copies`` (the process's :class:`node.guest.copies.store.OpenCopies`, its session
    pool's) the copy's index, manifest and id maps stay open between questions (at most
    :data:`node.guest.copies.store.OPEN_COPIES_MAX` copies) and are opened again when the
    manifest file changes, so a long-running process (``kith api serve``, ``kith mcp``)
    answers a copy at the cost of the owner's own search (specs/copies.md §6); without, the
    copy is opened for this search and closed. Thread-safe.

    Raises:
        ConfigError: ``copy-not-found`` when no copy of ``peer`` was ever synced;
            ``config-invalid`` when its ``manifest.json`` cannot be read.
        CorpusError: ``index-unavailable`` when the copy's index is damaged (not SQLite).
        PolicyError: ``copy-expired`` when the copy's end (:meth:`CopyStore.until`) has
            passed: the copy is deleted (specs/copies.md §5), told to ``notify``
            (:data:`node.guest.copies.lifecycle.Notify`; stderr without one).
    """
    own = copies is None
    cache = OpenCopies() if copies is None else copies
    try:
        return _search(CopyStore(home, peer, cache=cache), request, notify)
    finally:
        if own:
            cache.close()


def _search(store: CopyStore, request: dict[str, Any], notify: Notify | None) -> dict[str, Any]:
    """:func:`search_copy` with the copy's cache in ``store.cache``."""
    cache, peer = store.cache, store.peer
    assert cache is not None
    if store.exists() and store.expired(time.time()):  # past its grant's end: deleted, never answered from
        until = store.until()
        _ended_copy(store, "expired", notify)
        raise PolicyError("copy-expired", f"{peer}'s copy ended at {until}; it was deleted")
    try:
        store.reindex_if_outdated()  # an index of an older schema answers nothing: rebuilt first
        entry = cache.acquire(store)
        try:
            answer = entry.service.answer({k: v for k, v in request.items() if k != "citations"})
            env = answer.get("envelope") or {}
            spans = entry.corpus.chunk_evidence([r.get("id") for r in env.get("results") or []])
        finally:
            cache.release(entry)
    except sqlite3.DatabaseError as exc:  # damaged while held open: refused now, rebuilt by the next use
        cache.current.pop(store.dir, None)
        raise CorpusError(
            "index-unavailable",
            f"the index of {peer}'s copy cannot be read ({exc}); the next search of it, "
            f"`kith copies sync {peer}` or `kith index sync` rebuilds it from the copy's documents") from None
    held = entry.state["documents"]  # the envelope names the host's ids (AnswerService source_names)
    gone = withdrawn_sources(store)  # told withdrawn by its host since the last sync: never answered
    kept = []
    for r in env.get("results") or []:
        src = r.get("source")
        d = held.get(src) if isinstance(src, str) and src not in gone else None
        if d is None:  # a file the manifest does not list (a killed sync's), or withdrawn: dropped
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
            keep(read, (host_key, source), _read(host_key, source), 32)
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
