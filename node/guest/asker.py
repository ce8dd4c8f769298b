"""Who answers for a name — the layer above the pool (specs/ask.md §4, specs/peers.md §13).

The pool (node/guest/pool.py) keeps sessions to targets and nothing else. An :class:`Asker`
turns a registry name into the target that answers for it: the saved host of a plain pin
(re-checked against the registry on every question, its server asked for a newer invitation
when the saved one does not answer), or every awake device of a person pinned with
``--devices`` at once — its warm device first and hedged, the person's revocation list read
beside each ask, a revoked device's answer dropped.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import anyio

from node.common.errors import KithError
from node.guest.cards import (COMPLETE, _mark_now, device_targets, fetch_cards, is_revoked, mark_answered,
                              refresh_revocation)
from node.guest.guest import resolve_peer
from node.guest.targets import PeerGone, Target, connect_failed, post_gone
from node.trust.card import CARDS_FILE, CardStore
from node.trust.revocation_list import REVOCATIONS_FILE, RevocationStore

if TYPE_CHECKING:
    from node.guest.pool import SessionPool
    from node.trust.peers import PeerRecord

log = logging.getLogger("kith.asker")

#: A device's complete answer that holds nothing: it never wins over another device's ``ok``.
EMPTY = "no-verified-results"

#: Seconds a person's warm device may take before its other devices are asked too
#: (:meth:`Asker._ask_warm_device`; specs/peers.md §13).
WARM_HEDGE_S = 2.0


class Asker:
    """Asks a name over ``pool`` (a :class:`node.guest.pool.SessionPool`); holds nothing
    but the pool (and an optional ``on_provisional`` callback), so one may be made wherever
    a pool is at hand."""

    def __init__(self, pool: "SessionPool", on_provisional: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.pool = pool
        #: called with a person's device's empty answer (``no-verified-results``) while its
        #: other devices are still out: the caller's deadline may settle on it (specs/peers.md §13)
        self.on_provisional = on_provisional

    async def ask(self, peer: str | Target, request: dict[str, Any]) -> dict[str, Any]:
        """Ask ``peer`` one flat request (``query``, ``topK``, filters; the one request
        contract, already validated) — over the pool's warm session to whoever answers for it.

        Args:
            peer: a registry name (resolved with :func:`resolve_peer`, re-checked against
                the registry on every question: a removed or blocked name is refused even
                with a warm session) or a verified :class:`Target` (pinned by the caller).
                A person pin (``--devices``) with device cards is asked on every device at
                once, the first ``ok`` winning (an empty answer never cancels another
                device's; :meth:`ask_devices`;
                its pin's server is asked for cards when none is usable or every device
                failed, and for the person's revocation list beside every ask, at most once
                a minute: a revoked device's answer is dropped; specs/peers.md §13); the
                answer then carries ``device``.
            request: the flat request.

        Returns:
            The host's ``results`` message (``status``, ``envelope``, ``retry_after_s`` /
            ``approval_id``); the caller bounds the wait (cancel = poisoned session).

        Raises:
            PeerGone: the session ended (or never came up) before answering; ``reached``
                says whether its handshake had completed.
            KithError: resolution refusals (``peer-not-found``, ``ask-peer-blocked``,
                ``host-key-changed``, ``invitation-*``, ``ask-protocol-unsupported``,
                community errors), ``ask-pool-full``.
        """
        if not isinstance(peer, str):  # a target the caller verified
            return await self.pool.ask(peer, request)
        name = peer
        home = self.pool.home
        peers = self.pool.peers  # read again only when peers.json changed
        registry = peers.now()
        person = registry.by_name(name)
        if person is not None and person.devices and not registry.is_blocked(person.public_key):
            answer = await self._ask_person_checked(person, name, request)
            if answer is not None:  # a person pin: every device it has a card of, at once (specs/peers.md §13)
                return answer
        rec = None
        skip_saved = retried_warm = False
        last_gone: PeerGone | None = None
        while True:
            warm_before = False
            try:
                registry = peers.now()
                rec = registry.by_name(name)
                warm = self.pool.warm(rec.public_key) if rec is not None else None
                if warm is not None and not registry.is_blocked(rec.public_key):
                    target = warm.target
                elif skip_saved:
                    try:
                        target = await resolve_peer(name, home, skip_saved=True, registry=peers.now())
                    except KithError:  # the server has nothing newer: the host is unreachable
                        assert last_gone is not None
                        raise last_gone from None
                else:
                    target = await resolve_peer(name, home, registry=registry)
                live = self.pool.warm(target.invitation.host_public_key)
                warm_before = live is not None and live.answered > 0
                return await self.pool.ask(target, request, renew=False)
            except PeerGone as gone:
                if skip_saved and gone is last_gone:
                    raise
                last_gone = gone
                if getattr(gone.outcome, "code", None) == "peer-unresponsive":
                    raise  # went silent with the question out: gone, not a session to renew
                if warm_before and not retried_warm:
                    retried_warm = True  # the host ended a warm session: re-resolve, new session
                    continue
                if (not skip_saved and not gone.reached
                        and (connect_failed(gone) or post_gone(gone)) and rec is not None and rec.server):
                    skip_saved = True  # the saved invitation's address did not answer, or its post is gone there
                    continue
                raise

    async def _ask_person_checked(self, person: Any, name: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """:meth:`_ask_person`, with the person's revocation list read from its pin's
        server beside it (:func:`node.guest.cards.refresh_revocation`, at most once a
        minute): an answer from a device that list revokes is dropped and the person asked
        again without it (specs/peers.md §13)."""
        if not person.server:
            return await self._ask_person(person, name, request)
        got: list[Any] = []
        failed: list[BaseException] = []

        async def race() -> None:
            try:
                got.append(await self._ask_person(person, name, request))
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(refresh_revocation, self.pool.home, person, notify=self.pool.on_copy_notice,
                                  last_read=self.pool.revocation_reads))
            await race()
        if failed:
            raise failed[0]
        answer = got[0]
        device = (answer or {}).get("device")
        if isinstance(device, dict) and is_revoked(self.pool.home, person, str(device.get("key"))):
            log.warning("%s: device %s answered but its person revoked it; asking the others", name,
                        str(device.get("key"))[:16])
            return await self._ask_person(person, name, request)
        return answer

    async def _ask_warm_device(self, person: Any, warm: tuple[dict[str, str], Any],
                               request: dict[str, Any]) -> dict[str, Any] | None:
        """Ask the person's device with a warm session; when it has not answered within
        :data:`WARM_HEDGE_S` (it may have gone to sleep: a stopped host sends nothing, and
        its session ends only when the keep-alive gives up), ask its other dialable devices
        too, the warm one still running; the first ``ok`` of either wins. An empty answer
        (``no-verified-results``) never cancels the others: the warm one's is handed to
        ``on_provisional`` and its other devices are asked, and it stands only when none of
        them answers ``ok``. None when the warm session ended unanswered first, or every
        device did (the caller races them all)."""
        got: list[dict[str, Any]] = []
        later: list[dict[str, Any]] = []  # the others' answer that was not ok, while the warm one was out
        warm_done = anyio.Event()

        empty: list[dict[str, Any]] = []

        async def ask_warm(tg: Any) -> None:
            try:
                message = await warm[1].ask(request)
            except PeerGone:
                warm_done.set()
                return
            mark_answered(self.pool.home_file(CARDS_FILE, CardStore.load).now(), person, warm[0]["key"])
            answer = {**message, "device": dict(warm[0])}
            if answer.get("status") == EMPTY:  # another device may hold what this one does not
                empty.append(answer)
                warm_done.set()
                return
            got.append(answer)
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask_warm, tg)
            with anyio.move_on_after(WARM_HEDGE_S):
                await warm_done.wait()
            others = [(d, t) for d, t in device_targets(self.pool.home, person, registry=self.pool.peers.now()) if d["key"] != warm[0]["key"]]
            if empty:  # it holds nothing for this: its other devices are asked before that answer stands
                if self.on_provisional is not None:
                    self.on_provisional(empty[0])
                if not others:
                    return empty[0]
                try:
                    answer = await self.ask_devices(person, others, request)
                except PeerGone:
                    return empty[0]
                return answer if answer.get("status") == "ok" else empty[0]
            if warm_done.is_set():  # its session ended unanswered: the caller races every device, it too
                return None
            if others:
                log.info("%s: the warm device %s has not answered in %.1f s; asking %d other device(s)",
                         person.name, warm[0]["key"][:16], WARM_HEDGE_S, len(others))
                try:
                    answer = await self.ask_devices(person, others, request)
                except PeerGone:
                    pass  # the warm one may still answer
                else:
                    if answer.get("status") == "ok":
                        got.append(answer)
                        tg.cancel_scope.cancel()
                    else:  # the others hold nothing (or refused): the warm one may still answer ok
                        later.append(answer)
            await warm_done.wait()
        if got:
            return got[0]
        return empty[0] if empty else (later[0] if later else None)

    async def _ask_person(self, person: Any, name: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """Ask every device of the person pin ``person`` with a usable card at once
        (:meth:`ask_devices`), its warm device first; the server's cards
        when none is usable or every device failed. None when no device can be dialled (the
        caller resolves the pin as one host)."""
        warm = self.warm_device(person)
        if warm is not None:  # a device that answered over this session is awake: ask it first
            answer = await self._ask_warm_device(person, warm, request)
            if answer is not None:
                return answer
        targets = device_targets(self.pool.home, person, registry=self.pool.peers.now())
        if not targets and person.server:
            await fetch_cards(self.pool.home, person, notify=self.pool.on_copy_notice, peers=self.pool.peers)
            person = self.pool.peers.now().by_name(name) or person  # its new seenDevices
            targets = device_targets(self.pool.home, person, registry=self.pool.peers.now())
        if targets:
            try:
                return await self.ask_devices(person, targets, request)
            except PeerGone:
                if not person.server:
                    raise
                # every device it knew is down: the server may hold newer cards
                before = {t.invitation.transport_info.ticket for _, t in targets}
                await fetch_cards(self.pool.home, person, notify=self.pool.on_copy_notice, peers=self.pool.peers)
                person = self.pool.peers.now().by_name(name) or person
                targets = [(d, t) for d, t in device_targets(self.pool.home, person, registry=self.pool.peers.now())
                           if t.invitation.transport_info.ticket not in before]
                if not targets:
                    raise
                return await self.ask_devices(person, targets, request)
        return None

    def warm_device(self, rec: "PeerRecord") -> tuple[dict[str, str], Any] | None:
        """A live, ready pooled session to a device of the person pin ``rec`` that is not
        revoked nor blocked here, as ``({"key", "name"}, session)``, or None. A device that
        answered over it is awake: the next question goes there first (no dial of the others)."""
        cards = self.pool.home_file(CARDS_FILE, CardStore.load).now().devices_of(rec.public_key)
        registry = self.pool.peers.now()
        for key, seen in rec.seen_devices.items():  # every device a card was taken of is seen
            live = self.pool.sessions.get(key)
            if (live is None or live.closed.is_set() or live.session_id is None or not live.answered
                    or registry.is_blocked(key)):  # only a session that answered: a race's loser is not warm
                continue
            person = cards[key].card.get("person_key", "") if key in cards else ""
            if self.pool.home_file(REVOCATIONS_FILE, RevocationStore.load).now().revokes(key, [rec.public_key, person]):
                continue
            return {"key": key, "name": seen["name"]}, live
        return None

    async def ask_devices(self, rec: "PeerRecord", targets: list[tuple[dict[str, str], Any]],
                          request: dict[str, Any]) -> dict[str, Any]:
        """Ask every device in ``targets`` the same request at once; the first ``ok`` wins and
        the others are cancelled. An empty answer (``no-verified-results``: that device holds
        nothing for the question, another may) cancels nothing: it is handed to
        ``on_provisional`` (for a caller whose deadline comes first) and stands only when every
        other device has ended without an ``ok``.

        Returns:
            that answer, with ``device`` ``{"key", "name"}`` set by this guest (never taken from
            a host). When no device answers ``ok``, the first empty answer; else the first
            incomplete answer (pending approval, rate-limited, a refusal) if any.

        Raises:
            PeerGone: every device's session ended unanswered (the last one's).
        """
        store_marks: list[tuple[str, bool]] = []
        winner: list[dict[str, Any]] = []
        empty: list[dict[str, Any]] = []
        incomplete: list[dict[str, Any]] = []
        gone: list[BaseException] = []
        pending = {device["key"] for device, _ in targets}

        async def one(device: dict[str, str], target: Any, tg: Any) -> None:
            try:
                message = await self.pool.ask(target, request)
            except (PeerGone, KithError) as exc:
                gone.append(exc)
                store_marks.append((device["key"], False))
                pending.discard(device["key"])
                return
            pending.discard(device["key"])
            store_marks.append((device["key"], True))
            answer = {**message, "device": dict(device)}
            if answer.get("status") == EMPTY:  # it holds nothing for this: another device may
                if not empty and self.on_provisional is not None and pending:
                    self.on_provisional(answer)
                empty.append(answer)
            elif answer.get("status") in COMPLETE:
                if not winner:
                    winner.append(answer)
                    # a device that has not even finished its handshake by now is not up: it
                    # failed this ask (an awake one that is only slower has, and is not marked)
                    for key in pending:
                        live = self.pool.sessions.get(key)
                        if live is None or live.session_id is None:
                            store_marks.append((key, False))
                    tg.cancel_scope.cancel()
            else:
                incomplete.append(answer)

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for device, target in targets:
                tg.start_soon(one, device, target, tg)
        if winner:  # the ones still out were cancelled because another answered: not down
            for device, target in targets:
                if device["key"] in pending:
                    self.pool.clear_down(target)
        log.debug("person %s: %d device(s) asked in %.3f s", rec.name, len(targets), time.monotonic() - started)
        if store_marks:
            store = CardStore.load(self.pool.home)
            now = _mark_now()
            for key, ok in store_marks:
                store.mark(rec.public_key, key, ok=ok, now=now)
        if winner:
            return winner[0]
        if empty:
            return empty[0]
        if incomplete:
            return incomplete[0]
        last = gone[-1] if gone else None
        if isinstance(last, PeerGone):
            raise last
        if isinstance(last, KithError):
            raise last
        raise PeerGone(None, None, False)


__all__ = ["Asker", "WARM_HEDGE_S"]
