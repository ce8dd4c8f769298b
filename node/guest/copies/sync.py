"""Pulling a copy over a session (package docstring; specs/copies.md §4): one sync of a copy
at a time across the home's processes, the removal mark checked before each commit, every
document of a batch checked before any is written."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable

from node.common.errors import ConfigError, KithError, PolicyError, ProtocolViolation
from node.guest.copies.checks import _is_hex64, check_document, check_manifest
from node.guest.copies.store import CopyStore, _disk, _rfc3339

#: Documents asked per ``copy_fetch`` (spec.json's bound).
FETCH_BATCH = 64


def _strings(value: Any) -> list[str]:
    """The strings of a list the host sent (anything else: none)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


Ask = Callable[[dict[str, Any]], Any]  # async (message request) -> the host's reply

#: :func:`sync_copy`'s ``mark`` when the caller took none: taken under the sync lock.
_NOW = object()


async def sync_copy(home: Path, peer: str, ask: Ask, host_key: str, *,
                    progress: Callable[[int, int], None] | None = None,
                    now: Callable[[], float] = time.time, holder: str = "kith copies sync",
                    told: Callable[[str], dict[str, Any] | None] | None = None,
                    mark: Any = _NOW) -> dict[str, Any]:
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
            the host's reply (:meth:`node.guest.asker.Asker.ask` bound to ``peer``).
        host_key: the peer's pinned key: every document must be signed by it.
        progress: ``(documents done, documents to fetch)`` after each batch.
        holder: what this process is, for a second sync refused while this one runs.
        told: ``told(host_key)`` → the copy grant state the session's handshake told and
            when (``seenAt``, epoch seconds; :data:`node.guest.copies.lifecycle.CopyStates`,
            ``.get`` of the pool's), or None: written to ``grant.json`` (the copy's end) once
            the manifest is accepted, before any document is fetched, unless that holds a
            handshake's word told since (:meth:`CopyStore.grant_newer_than`: never replaced by
            an older one); recorded as the manifest's ``until`` and ``stamp`` once the sync
            completes.
        mark: the removal mark (:meth:`CopyStore.removal_mark`) the caller took before it
            first dialled the peer (:func:`sync_with_pool`): a removal made while that dial
            was out stops this sync too. By default it is taken here, under the lock.

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
    if mark is _NOW:
        mark = store.removal_mark()  # a removal by anyone else from now on stops this sync
    elif store.removal_mark() != mark:  # removed while the caller dialled: nothing is asked or made
        release_owner_lock(fd)
        raise _removed(peer)
    try:
        return await _sync_copy(store, ask, host_key, mark, progress=progress, now=now, told=told)
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


def _expect(reply: Any, action: str, what: str) -> dict[str, Any]:
    """``reply`` when it is the host's ``action`` message. A ``results`` message with status
    ``rate-limited`` answers a copy request the peer's quota could not pay (specs/copies.md
    §3; the host sent nothing of it and the session goes on).

    Raises:
        PolicyError: ``copy-rate-limited`` naming when to ask again.
        ProtocolViolation: ``copy-manifest-invalid`` for any other reply (``what`` says
            what was expected).
    """
    if isinstance(reply, dict) and reply.get("action") == "results" and reply.get("status") == "rate-limited":
        wait = reply.get("retry_after_s")
        raise PolicyError("copy-rate-limited", "the host's quota for this peer cannot pay this copy request now"
                          + (f"; ask again in {wait} s" if isinstance(wait, int) else ""))
    if not isinstance(reply, dict) or reply.get("action") != action:
        raise ProtocolViolation("copy-manifest-invalid", f"the host did not answer with {what}")
    return reply


async def _sync_copy(store: CopyStore, ask: Ask, host_key: str, mark: tuple[int, int] | None, *,
                     progress: Callable[[int, int], None] | None, now: Callable[[], float],
                     told: Callable[[str], dict[str, Any] | None] | None) -> dict[str, Any]:
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
    reply = _expect(await ask({"action": "copy_list"}), "copy_manifest", "a manifest")
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
    said = told(host_key) if told is not None else None  # what this session's handshake said of the grant
    told_at = said.get("seenAt") if said is not None else None
    told_at = told_at if isinstance(told_at, (int, float)) else now()
    if said is not None and not store.grant_newer_than(told_at):  # the end is known before the first
        store.write_grant(said, told_at)  # document lands: a sync killed after a batch still ends then
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
            reply = _expect(await ask({"action": "copy_fetch", "sources": batch}), "copy_docs", "documents")
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
    if said is not None:
        state.update(until=said["until"], stamp=said["stamp"])
        if not store.grant_newer_than(told_at):  # a newer handshake's (another process's) is kept:
            store.write_grant(said, told_at)  # its stamp, when another, leaves the copy stale
    commit(state)
    from node.guest.copies.lifecycle import WITHDRAWN_FILE

    with contextlib.suppress(OSError):  # what a handshake said was withdrawn is deleted now
        (store.dir / WITHDRAWN_FILE).unlink()
    summary = store.summary()
    report.update(documents=summary["documents"], bytes=summary["bytes"], syncedAt=state["syncedAt"])
    return report


async def sync_with_pool(pool: Any, peer: str, *, progress: Callable[[int, int], None] | None = None,
                         holder: str = "kith copies sync") -> dict[str, Any]:
    """:func:`sync_copy` over ``pool`` (a :class:`node.guest.pool.SessionPool`) to the
    pinned ``peer``. The copy's removal mark is taken before the first dial, so a removal
    made while it is out (an asleep device dialled) stops the sync (``copy-removed``).

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
    from node.guest.asker import Asker

    asker = Asker(pool)  # who answers for the name: the saved host, or a device of the person
    rec = pool.peers.now().by_name(peer)
    if rec is None:
        raise PolicyError("peer-not-found", f"no pinned peer is named {peer!r}")
    # before the first dial: a removal made while an asleep device is dialled sticks
    mark = CopyStore(pool.home, peer).removal_mark()
    if not rec.devices:
        async def ask(request: dict[str, Any]) -> Any:
            return await asker.ask(peer, request)

        return await sync_copy(pool.home, peer, ask, rec.public_key, progress=progress, holder=holder,
                               told=pool.copy_states.get, mark=mark)

    first = device_key = None
    try:
        held = CopyStore(pool.home, peer).load().get("hostKey")
    except KithError:
        held = None
    if _is_hex64(held):  # the device whose copy is kept here is asked first: no switch while it is awake
        from node.guest.cards import device_targets
        from node.guest.targets import PeerGone

        target = next((t for d, t in device_targets(pool.home, rec) if d["key"] == held), None)
        if target is not None:
            try:
                first, device_key = await pool.ask(target, {"action": "copy_list"}), held
            except (PeerGone, KithError):  # asleep, or refused: any awake device of the person
                first = None
    if first is None:
        first = await asker.ask(peer, {"action": "copy_list"})
        device = first.get("device") if isinstance(first, dict) else None
        device_key = device.get("key") if isinstance(device, dict) else None
    if not _is_hex64(device_key):  # an answer not from a device (a person pin with no card)
        raise ProtocolViolation("copy-manifest-invalid", f"{peer}'s answer names no device of the person")
    told = [first]

    async def ask_device(request: dict[str, Any]) -> Any:
        if told and request == {"action": "copy_list"}:
            return told.pop()
        reply = await asker.ask(peer, request)
        got = reply.get("device") if isinstance(reply, dict) else None
        if not isinstance(got, dict) or got.get("key") != device_key:
            raise ProtocolViolation("copy-device-changed",
                                    f"another device of {peer} answered in the middle of the sync")
        return reply

    return await sync_copy(pool.home, peer, ask_device, device_key, progress=progress, holder=holder,
                           told=pool.copy_states.get, mark=mark)


async def note_withdrawn(pool: Any, names: list[str], notify: Any = None) -> dict[str, list[str]]:
    """For each name in ``names`` whose copy is stale (:func:`node.guest.copies.lifecycle.stale`: the handshake of this
    process told another grant stamp than the copy was synced under), ask its host for the
    manifest over ``pool`` and record what it no longer lists (:func:`node.guest.copies.lifecycle.record_withdrawn`), so
    a one-shot process (``kith ask``) that runs no sync filters it out of searches of the
    copy at once. The caller bounds the time. ``{name: sources recorded}``."""
    from node.guest.asker import Asker
    from node.guest.copies.lifecycle import record_withdrawn, stale

    out: dict[str, list[str]] = {}
    for name in names:
        try:
            store = CopyStore(pool.home, name)
            if not store.exists() or not stale(store):
                continue
            host_key = store.load().get("hostKey")
            reply = await Asker(pool).ask(name, {"action": "copy_list"})
        except Exception:  # noqa: BLE001 - the host went away: the next sync does it
            continue
        device = reply.get("device") if isinstance(reply, dict) else None
        if isinstance(device, dict) and device.get("key") != host_key:
            continue  # another device of the person: its manifest is not this copy's
        out[name] = record_withdrawn(store, reply, notify)
    return out
