"""How a copy ends (specs/copies.md §5): a handshake says the grant ended, the grant's end
passes, the owner removes the peer or a device is revoked; each deletion says so."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from node.common.errors import KithError
from node.guest.copies.checks import check_copy_state
from node.guest.copies.store import CopyStore, list_copies
from node.common.kept import keep

#: The most hosts a :data:`CopyStates` remembers (cleared when full).
STATES_MAX = 1024
#: What the handshakes of one session pool last told of each host's copy grant: host key →
#: the checked state and ``seenAt``, the time (epoch seconds) that handshake told it
#: (:attr:`node.guest.pool.SessionPool.copy_states`, its owner). A first sync's handshake
#: comes before its copy folder exists, so the sync reads it here.
CopyStates = dict[str, dict[str, Any]]


#: Who is told of a copy this node deletes because it may no longer hold it, passed by the
#: caller (the home runner's :meth:`node.guest.copies.task.CopiesTask.listener`, a command
#: collecting what it prints): ``notice`` is ``{"peer", "kind": "ended", "removed"
#: (documents), "via": "handshake" | "expired" | "peer-removed" | "device-revoked",
#: "text"}``, or ``{"peer", "kind": "changed"}`` when a handshake told a new grant stamp
#: (the copy is :func:`stale`). Without one, an ``ended`` notice goes to stderr and a
#: ``changed`` one to no one. The runner turns ``ended`` into ``copy-ended`` events and wakes
#: for ``changed`` (specs/copies.md §7).
Notify = Callable[[dict[str, Any]], None]


def _tell(notify: Notify | None, notice: dict[str, Any]) -> None:
    if notify is None:
        if notice.get("kind") == "ended":
            import sys

            print(f"kith: {notice['text']}", file=sys.stderr)
        return
    try:
        notify(notice)
    except Exception:  # noqa: BLE001 - a listener's fault never undoes the deletion
        pass


_WHY = {"handshake": "its host no longer grants it (told in the handshake)",
        "expired": "its grant's end has passed",
        "peer-removed": "its host was removed from the peer registry",
        "device-revoked": "its host's device was revoked"}


def _ended_copy(store: CopyStore, via: str, notify: Notify | None = None) -> dict[str, Any] | None:
    """Delete ``store``'s copy and tell ``notify`` (stderr without one, :data:`Notify`); the notice."""
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
    _tell(notify, notice)
    return notice


def copies_of_key(home: Path, host_key: str) -> list[CopyStore]:
    """The copies of ``home`` held from the host key ``host_key`` (the ``hostKey`` their
    sync verified every document against)."""
    return [CopyStore(home, row["peer"]) for row in list_copies(home) if row.get("hostKey") == host_key]


def take_copy_state(home: Path, host_key: str, raw: Any, *, now: Callable[[], float] = time.time,
                    notify: Notify | None = None, states: CopyStates | None = None) -> list[dict[str, Any]]:
    """Act on the ``copy_state`` the host ``host_key`` sent in its ``_session_proof`` (the
    guest's runtime calls it at every ready session: ``kith ask``, an outbox delivery, a
    sync). Not granted → every copy held from that key is deleted now
    (told to ``notify``, :data:`Notify`); granted → its ``stamp`` and ``until`` are recorded in each
    copy's ``grant.json`` (a stamp that differs from the one the copy was last synced under
    makes the runner's :class:`CopiesTask` sync it at its next step; an ``until`` is the
    copy's end, :func:`expire_copies`). Only the host's own handshake counts: ``host_key``
    is the key the session's proof verified. With ``states`` (the session pool's
    :data:`CopyStates`) the state is remembered there for a sync over that pool.

    Returns:
        The notices of the copies deleted.

    Raises:
        ProtocolViolation: ``copy-state-invalid`` (:func:`check_copy_state`).
    """
    state = check_copy_state(raw)
    if states is not None:
        keep(states, host_key, {**state, "seenAt": now()}, STATES_MAX)
    notices = []
    for store in copies_of_key(home, host_key):
        if not state["granted"]:
            got = _ended_copy(store, "handshake", notify)
            if got is not None:
                notices.append(got)
        else:
            told = store.grant() or {}
            if (told.get("stamp"), told.get("until")) != (state["stamp"], state["until"]):
                store.write_grant(state, now())
            if stale(store) and notify is not None:  # the runner syncs it at its next step: wake it
                _tell(notify, {"peer": store.peer, "kind": "changed"})
    return notices


def stale(store: CopyStore) -> bool:
    """True when the host's last handshake told a grant stamp other than the one the copy
    was last synced under: the grants or the policy for this peer changed since."""
    grant = store.grant()
    if grant is None:
        return False
    try:
        synced = store.committed().get("stamp")
    except KithError:
        return True
    return grant.get("stamp") != synced


def expire_copies(home: Path, now: float | None = None, *, notify: Notify | None = None,
                  cache: Any = None) -> list[dict[str, Any]]:
    """Delete every copy of ``home`` whose end (:meth:`CopyStore.until`) has passed, without
    asking its host (specs/copies.md §5: this relies on this node doing so); the notices.
    ``cache``: the caller's :class:`node.guest.copies.store.OpenCopies` (what it last read
    of each copy: the runner's steps read a grant.json again only when it changed), or None."""
    t = time.time() if now is None else now
    out = []
    for row in list_copies(home, cache=cache):
        store = CopyStore(home, row["peer"], cache=cache)
        if "error" not in row and store.expired(t):
            got = _ended_copy(store, "expired", notify)
            if got is not None:
                out.append(got)
    return out


def end_copies(home: Path, *, peer: str | None = None, host_key: str | None = None, via: str,
               notify: Notify | None = None) -> list[dict[str, Any]]:
    """Delete the copy kept under the registry name ``peer`` and/or every copy held from
    ``host_key`` (``kith peers remove``: ``peer-removed``; a revoked device:
    ``device-revoked``); the notices, each told to ``notify`` (:data:`Notify`)."""
    stores = [CopyStore(home, peer)] if peer is not None else []
    if host_key is not None:
        stores += [s for s in copies_of_key(home, host_key) if s.peer != peer]
    return [n for n in (_ended_copy(s, via, notify) for s in stores) if n is not None]


# --- what a handshake said was withdrawn, before the next sync (specs/copies.md §5.1) -----

#: ``<copy>/withdrawn.json``: ``{"sources": [...]}``, the sources the host's manifest no
#: longer lists, recorded by a process that runs no sync (``kith ask``); a search of the copy
#: leaves them out at once, and the next sync (which deletes them) removes the file.
WITHDRAWN_FILE = "withdrawn.json"


def withdrawn_sources(store: CopyStore) -> set[str]:
    """The sources recorded as withdrawn for ``store`` (:data:`WITHDRAWN_FILE`); empty when
    none, or the file cannot be read (the next sync deletes what the host withdrew anyway)."""
    from node.common.errors import ConfigError
    from node.common.home import read_json_state

    try:
        data = read_json_state(store.dir / WITHDRAWN_FILE)
    except (OSError, ConfigError):
        return set()
    got = data.get("sources") if isinstance(data, dict) else None
    return {s for s in got if isinstance(s, str)} if isinstance(got, list) else set()


def record_withdrawn(store: CopyStore, reply: Any, notify: Notify | None = None) -> list[str]:
    """Record what ``reply`` (the host's ``copy_manifest``) no longer lists of ``store``'s
    copy as withdrawn (:data:`WITHDRAWN_FILE`), or end the copy when it says
    ``copy-not-granted``; the sources recorded. Nothing is deleted from ``docs/`` or the
    index here: that is the next sync's, under the copy's lock."""
    import json

    from node.common.home import atomic_write
    from node.guest.copies.checks import check_manifest

    if not isinstance(reply, dict) or reply.get("action") != "copy_manifest":
        return []
    if reply.get("status") == "copy-not-granted":
        _ended_copy(store, "handshake", notify)
        return []
    try:
        listed = check_manifest(reply, check_budget=False)
        held = store.load()["documents"]
    except KithError:
        return []
    if reply.get("truncated"):  # a manifest cut at its bound does not say what is gone
        return []
    gone = sorted(s for s in held if s not in listed)
    if gone or (store.dir / WITHDRAWN_FILE).exists():
        atomic_write(store.dir / WITHDRAWN_FILE, (json.dumps({"sources": gone}) + "\n").encode())
    return gone
