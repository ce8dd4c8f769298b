"""The outbox's questions left with a holder (issue 43 item 4; specs/sealed.md §7,
specs/outbox.md §5): a task of the home's runner beside the live delivery.

Each step, for every open outbox row whose peer is a person pin (``--devices``) with a
kept card of format 2 (``mailboxes``, specs/sealed.md §6), or a device pin whose own card
(kept from its handshake, :func:`node.guest.cards.accept_card`) is of format 2, the answers
waiting are taken first (2.), then the rows still open are left (1.): a run killed between
leaving a question and recording where it left it finds the answer, if one came, instead
of leaving an answered question again.

1. once the live delivery tried the row and could not reach its host (``waiting``, an
   attempt made, a code other than ``rate-limited`` / ``pending-approval``: a host that
   answers live is never asked twice), the question is **left** (once: the row records the
   holder, ``leftWith``, which ``kith outbox`` shows) with the first mailbox that person's
   cards name, sealed to every device of the person this home keeps a card of (a device
   pin: to that device), with the
   row's question id, request and expiry — it also stays in the outbox and is still
   delivered live when the host comes up: whichever answer comes first closes the row,
   the other changes nothing. Before it is sealed the question passes the one outbound
   gate (:func:`node.policy.outbound.gate`, actor ``outbox``, as the live delivery), which
   logs it in ``kith sent``;
2. the answers waiting at each such mailbox — and at each holder a question still
   unexpired was left with, even one answered since (a run killed between storing an
   answer and its ack: the next run acks it, storing nothing twice) — are **taken** and
   stored into their rows (:func:`node.guest.sealed_answers.store_sealed_answer`: only from the
   pinned person's devices, once), then acked. Questions left for this device (when it
   also hosts with ``--mailbox``) are left at the holder for ``kith host``.

A peer with no format-2 card kept (a person whose cards name no mailbox, a device pin never
met live since it named one) is delivered live only, as before.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from node.common.errors import KithError

log = logging.getLogger("kith.sealed")

#: Seconds between two steps (the runner honours at most 1 s; this task needs less often).
STEP_EVERY_S = 5.0


def mailboxes_of(home: Path, person_key: str) -> tuple[list[str], list[str]]:
    """``(mailbox URLs, device keys)`` of a pinned person — or device, by its own kept card —
    from the cards kept here: the URLs named by its format-2 cards (first seen first) and
    every device with a kept card.

    Raises:
        ConfigError: ``config-invalid`` when ``cards.json`` is not a valid store.
    """
    from node.trust.card import CardStore, check_card

    urls: list[str] = []
    devices: list[str] = []
    for device, entry in CardStore.load(home).devices_of(person_key).items():
        try:
            card = check_card(entry.card)
        except KithError:
            continue
        devices.append(device)
        urls.extend(u for u in card.mailboxes if u not in urls)
    return urls, devices


async def withdraw_left(home: Path, identity: Any, store: Any, *, endpoint: Any = None,
                        say: Any = None, pending: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Withdraw at their holders the sealed copies of removed questions
    (:meth:`node.guest.outbox.OutboxStore.withdrawals`; specs/sealed.md §10): an ack signed
    by this device, the records' sender, which the holder takes as a withdrawal
    (specs/community-api.md, ``/mailbox/ack``). Each one done — withdrawn, or no longer
    there — is forgotten; one that fails stays for a later try (the home's runner tries at
    each take, every 5 s) until its question would have expired.

    Args:
        identity: this device's :class:`~node.trust.identity.Identity` (the sender).
        store: the home's open :class:`~node.guest.outbox.OutboxStore`.
        endpoint: ``async () -> endpoint`` an ``iroh:`` holder is dialled from (the runner's
            session pool); None: such a holder is left for the runner (``pending``, no code).
        say: ``(holder, KithError) -> None`` for a holder that fails; None: nothing said.
        pending: the withdrawals to make, as ``store.withdrawals()`` just returned them (a
            caller that read them already; each read is a write transaction); None: read
            here.

    Returns:
        ``[{"id", "holder", "state", "code"}]`` per copy: ``state`` ``withdrawn`` (the holder
        removed it: its host never takes it), ``gone`` (the holder no longer had it: its
        host took it already, or the holder predates withdrawals — an answer that comes is
        not stored, no row is open for it) or ``pending`` (``code`` the failure's, or None
        for an ``iroh:`` holder without an endpoint).
    """
    from node.community.iroh_mail import SCHEME, mail_client
    from node.trust.sealed import record_id

    out: list[dict[str, Any]] = []
    for w in store.withdrawals() if pending is None else pending:
        holder, qid = w["holder"], w["questionId"]
        if holder.startswith(SCHEME) and endpoint is None:
            out.append({"id": qid, "holder": holder, "state": "pending", "code": None})
            continue
        rid = w["recordId"]
        try:
            if rid is None:  # left before its id was recorded: the id the kept cards give now
                rid = record_id("question", qid, identity.public_key, mailboxes_of(home, w["peerKey"])[1])
            async with mail_client(holder, identity, endpoint=endpoint) as client:
                removed = await client.ack_sealed([(identity.public_key, rid)])
        except KithError as exc:
            if say is not None:
                say(holder, exc)
            out.append({"id": qid, "holder": holder, "state": "pending", "code": exc.code})
            continue
        store.withdrawn(holder, qid, w["peerKey"])
        out.append({"id": qid, "holder": holder, "state": "withdrawn" if removed else "gone", "code": None})
    return out


class SealedOutboxTask:
    """The runner task (``name`` ``sealed-outbox``; :func:`node.guest.runner.default_tasks`)."""

    name = "sealed-outbox"

    def __init__(self, home: Path, *, clock: Any = None, every_s: float = STEP_EVERY_S) -> None:
        """Args: home: the asking home. clock: the runner's :class:`node.runtime.clock.Clock`
        (wall time seals and expires; monotonic time spaces the steps). every_s: seconds
        between two steps that do work (the runner steps every second)."""
        from node.runtime.clock import SYSTEM_CLOCK

        self.home = Path(home)
        self.clock = clock if clock is not None else SYSTEM_CLOCK
        self.every_s = every_s
        self._said: set[str] = set()
        self._last = float("-inf")  # monotonic time of the last step that took
        #: an open row with a mailbox was neither left nor tried live at the last step: the
        #: next step (the runner's wake when a delivery job ends) leaves it once the live
        #: delivery could not reach its host, without waiting for the next take
        self._untried = False

    async def step(self, runner: Any = None) -> float:
        """Leave the open rows' questions with their peers' mailboxes and take the answers
        waiting there (module docstring). Returns the seconds until the next step.

        Takes happen at most every ``every_s``; a step in between (the runner steps every
        task when a delivery job ends) only leaves, and only while a row with a mailbox
        waited for its live try at the last step: a question is left as soon as the live
        delivery could not reach its host, not up to ``every_s`` later."""
        from node.community.inbox import leave_question, take_step
        from node.community.iroh_mail import mail_client
        from node.guest.outbox import OutboxStore
        from node.guest.sealed_answers import TrustView, store_sealed_answer
        from node.policy.outbound import gate
        from node.trust.identity import load_identity
        from node.trust.person import own_chain

        def report(question_id: str, peer: str, state: str, results: Any) -> None:
            """A sealed answer stored: said as a live one is (``kith outbox run``'s lines, --json)."""
            from node.common.host_events import OutboxAnswered, OutboxPending

            if runner is None:
                return
            if state == "answered":
                runner.emit(OutboxAnswered(id=question_id, peer=peer, status=results.get("status")).to_dict())
            else:
                runner.emit(OutboxPending(id=question_id, peer=peer,
                                          approval_id=results.get("approval_id")).to_dict())

        now = self.clock.monotonic()
        if not (self.home / "outbox.sqlite").exists():
            return self.every_s  # nothing was ever queued here: look again a step later, not at once
        gated = now - self._last < self.every_s  # took less than every_s ago: only leave what is due
        if gated and not self._untried:
            return self.every_s - (now - self._last)
        if not gated:
            self._last = now
        identity = load_identity(self.home)

        async def endpoint() -> Any:
            """The runner's pool endpoint: a holder over iroh (``iroh:<ticket>``) is dialled
            from it (specs/sealed.md §7b)."""
            if runner is None:
                from node.common.errors import UsageError

                raise UsageError("usage", "a holder over iroh is reached from the runner's session pool")
            return await (await runner.pool()).endpoint()

        chain = own_chain(self.home, identity.public_key)
        with OutboxStore(self.home, clock=self.clock.time) as store:
            rows = store.open_deliveries()
            records = store.records()
            expiry = {r["id"]: r["expiresAt"] for r in records}
            tried = _tried(records)
            left = {(r["id"], p["key"]): p["leftWith"] for r in records for p in r["peers"] if p.get("leftWith")}
            # a holder a question was left with is read until that question expires, answered or
            # not: an answer stored by a run killed before its ack is acked by the next one
            # (stored once) instead of waiting at the holder until it expires
            boxes: set[str] = {url for (qid, _peer), url in left.items()
                               if (_unix(expiry.get(qid)) or 0) > self.clock.time()}
            known: dict[str, tuple[list[str], list[str]]] = {}
            for row in rows:
                if row.peer_key not in known:  # cards.json read once per peer per step
                    known[row.peer_key] = mailboxes_of(self.home, row.peer_key)
                boxes.update(known[row.peer_key][0])
            # taken before anything is left: a run killed between leaving a question and
            # recording where (``leftWith``) finds its answer first, if one came, and does not
            # leave an answered question again
            open_rows: dict[str, list[Any]] = {}
            for row in rows:
                open_rows.setdefault(row.question_id, []).append(row)

            view = TrustView(self.home)  # peers.json and revocation lists: read once per step, not per answer

            def on_answer(opened: Any, url: str) -> bool:
                # the holder an answer came from is recorded on its row before it is stored:
                # a run killed after storing it but before its ack (or one that left the
                # question without recording where) reads that holder again next time, and
                # acks the answer there instead of leaving it until it expires
                for row in open_rows.get(opened.question_id, ()):
                    if (row.question_id, row.peer_key) not in left and url in known[row.peer_key][0]:
                        store.mark_left(row.question_id, row.peer_key, url)
                return store_sealed_answer(store, opened, on_stored=report, view=view)

            for url in (sorted(boxes) if not gated else ()):
                try:
                    async with mail_client(url, identity, endpoint=endpoint) as client:
                        await take_step(client, identity, chain, clock=self.clock.time,
                                        on_answer=lambda op, url=url: on_answer(op, url))
                except KithError as exc:
                    self._say(url, exc)
            untried = False
            for row in store.open_deliveries():  # the rows a take just answered are closed
                urls, devices = known.get(row.peer_key) or mailboxes_of(self.home, row.peer_key)  # a row queued meanwhile
                if not urls or not devices:
                    continue
                if left.get((row.question_id, row.peer_key)) == urls[0]:
                    continue
                if (row.question_id, row.peer_key) not in tried:
                    untried = True  # left at the step after the live delivery could not reach its host
                    continue
                try:
                    # the one outbound gate before the question is sealed (specs/agents.md), logged
                    # as the live delivery's is (the agent's rule decided when it was kept)
                    ticket = gate(self.home, row.request, [row.peer_name], actor="outbox", rule="allow")
                    async with mail_client(urls[0], identity, endpoint=endpoint) as client:
                        record = await leave_question(client, identity, chain, question_id=row.question_id,
                                                      request=row.request, peer=row.peer_key, recipients=devices,
                                                      expires=_unix(expiry.get(row.question_id))
                                                      or self.clock.time() + 3600, clock=self.clock.time)
                    store.mark_left(row.question_id, row.peer_key, urls[0], record["id"])
                    if runner is not None:
                        from node.common.host_events import OutboxLeft

                        runner.emit(OutboxLeft(id=row.question_id, peer=row.peer_name, holder=urls[0]).to_dict())
                    ticket.done(f"left-with-holder {urls[0]}")
                except KithError as exc:
                    self._say(urls[0], exc)
            self._untried = untried
            if not gated:  # the copies of questions removed since (kith outbox remove): withdrawn
                await withdraw_left(self.home, identity, store, endpoint=endpoint, say=self._say)
        return self.every_s - (self.clock.monotonic() - self._last) if gated else self.every_s

    def _say(self, url: str, exc: KithError) -> None:
        if url not in self._said:
            self._said.add(url)
            log.warning("the mailbox at %s: %s (%s)", url, exc.message, exc.code)


#: Row codes that say the host was reached (it answers live; nothing is left with a holder).
REACHED_CODES = frozenset({"rate-limited", "pending-approval"})


def _tried(records: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The ``(question id, peer key)`` rows the live delivery tried and could not get an
    answer for: a row :func:`_unreached` itself, or an open ``waiting`` row of a peer whose
    last failed try (on any of its rows) came at or after the row was kept. The delivery tries
    a peer that cannot be reached on its oldest open question only (it stops at the first
    that cannot reach it), so a newer question of a sleeping peer is never tried by itself.

    Args:
        records: :meth:`node.guest.outbox.OutboxStore.records` (``createdAt`` and
            ``lastAttemptAt`` are RFC 3339 UTC seconds, so they compare as text).
    """
    last_failed: dict[str, str] = {}  # peer key -> its latest failed try, on any row
    out: set[tuple[str, str]] = set()
    for r in records:
        for p in r["peers"]:
            if _unreached(p):
                out.add((r["id"], p["key"]))
                if isinstance(p.get("lastAttemptAt"), str):
                    last_failed[p["key"]] = max(last_failed.get(p["key"], ""), p["lastAttemptAt"])
    for r in records:
        for p in r["peers"]:
            failed = last_failed.get(p["key"])
            if (p.get("state") == "waiting" and failed is not None and isinstance(r.get("createdAt"), str)
                    and failed >= r["createdAt"]):
                out.add((r["id"], p["key"]))
    return out


def _unreached(peer: dict[str, Any]) -> bool:
    """A row the live delivery tried and could not get an answer from (its host asleep):
    ``waiting``, at least one attempt, and a code other than a reached host's."""
    return (peer.get("state") == "waiting" and (peer.get("attempts") or 0) >= 1
            and peer.get("code") is not None and peer.get("code") not in REACHED_CODES)


def _unix(stamp: Any) -> float | None:
    from node.trust.invitation import parse_rfc3339

    try:
        return parse_rfc3339(stamp).timestamp() if isinstance(stamp, str) else None
    except (ValueError, TypeError):
        return None


__all__ = ["STEP_EVERY_S", "SealedOutboxTask", "mailboxes_of", "withdraw_left"]
