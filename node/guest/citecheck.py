"""``kith verify --against-host``: ask each citation's host whether its document version is
still current (specs/citations.md §5), over a knowledge-query session like ``kith ask``'s.

One ``check`` message per host (at most :data:`node.answer.contract.MAX_CHECK_ITEMS`
versions each, more in further messages of the same session) through a pool of the
process's :class:`node.guest.owner.Guest`; only hosts pinned in this home's registry are
asked (a key nobody pinned has no invitation to join).
"""

from __future__ import annotations

from typing import Any

import anyio

from node.answer.citation import RESULTS, Row
from node.answer.contract import MAX_CHECK_ITEMS
from node.common.errors import KithError

#: Rows a host is asked about: the signature and text verified.
CHECKABLE = frozenset({"genuine", "unpinned-key"})
#: Seconds one host may take to answer all its checks.
CHECK_TIMEOUT_S = 30.0


async def against_hosts(guest: Any, rows: list[Row], *, timeout_s: float = CHECK_TIMEOUT_S) -> list[Row]:
    """``rows`` with each verified one judged by its host: ``stale`` when the host says
    the version is no longer current (or it no longer serves the source to this peer),
    ``unchecked`` when the host is not pinned, not reached or keeps no versions; a current
    one keeps its result with ``, current on the host`` in its detail. Never raises for a
    host that fails; the order of ``rows`` is kept.

    Args:
        guest: the process's :class:`node.guest.owner.Guest` (its registry view, identity
            and transport). timeout_s: bound on one host's checks, seconds.
    """
    registry = guest.peers.now()
    by_host: dict[str, list[int]] = {}
    out = list(rows)
    for i, r in enumerate(rows):
        if r.result in CHECKABLE and r.host_key:
            by_host.setdefault(r.host_key, []).append(i)
    if not by_host:
        return out
    async with guest.session_pool() as pool:
        for key, idxs in by_host.items():
            rec = registry.by_key(key)
            if rec is None or registry.is_blocked(key):
                for i in idxs:
                    out[i] = out[i]._replace(result="unchecked", detail="the host is not a pinned peer: "
                                             "nothing to join to ask it")
                continue
            states: dict[tuple[str, str], str] = {}
            failed: str | None = None
            asked = list(dict.fromkeys((rows[i].source or "", rows[i].version or "") for i in idxs))
            try:
                with anyio.fail_after(timeout_s):
                    for start in range(0, len(asked), MAX_CHECK_ITEMS):
                        part = asked[start:start + MAX_CHECK_ITEMS]
                        reply = await guest.asker(pool).ask(rec.name, {"action": "check", "versions": [
                            {"source": s, "version": v} for s, v in part]})
                        if reply.get("action") != "checked" or reply.get("status") != "ok":
                            failed = "the host keeps no document versions to check against"
                            break
                        for item in reply.get("versions") or []:
                            states[(item.get("source"), item.get("version"))] = item.get("state")
            except TimeoutError:
                failed = f"the host did not answer within {timeout_s:.0f} s"
            except KithError as exc:
                failed = f"the host could not be asked ({exc.code})"
                if exc.code == "invitation-not-found":
                    failed += (": this home keeps no invitation of it to join; pin it with `kith join "
                               "--pin NAME` or `kith peers add NAME KEY --invite FILE|POST_ID`")
            except Exception as exc:  # noqa: BLE001 - e.g. PeerGone: the session ended first
                failed = f"the host could not be asked ({type(exc).__name__})"
            for i in idxs:
                r = out[i]
                state = states.get((r.source or "", r.version or ""))
                if failed is not None or state is None:
                    out[i] = r._replace(result="unchecked", detail=failed or "the host did not answer for it")
                elif state == "current":
                    out[i] = r._replace(detail=f"{r.detail}; current on the host")
                elif state == "stale":
                    out[i] = r._replace(result="stale", detail=RESULTS["stale"])
                else:
                    out[i] = r._replace(result="stale", detail="the host no longer serves this source "
                                                              "to you (removed, or not shared any more)")
    return out


__all__ = ["CHECKABLE", "CHECK_TIMEOUT_S", "against_hosts"]
