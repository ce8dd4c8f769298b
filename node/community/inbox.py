"""Taking sealed records from a holder and acting on them once (specs/sealed.md §5, §7).

One step of a device's mailbox: take the records waiting for its key, open each, hand a
question to the host's answer function and leave the sealed answer with the asker's holder,
hand an answer to the asker's store — then ack. The order makes every crash safe:

1. take (nothing changes at the holder);
2. open (:func:`node.trust.sealed.open_sealed`); a record that does not open or verify is
   acked and counted under its code — it never will, and nothing of it is kept;
3. a record already acted on (:class:`node.trust.sealed.SeenRecords`, keyed by kind, sender
   and question id; a host's is durable, :class:`node.trust.sealed_seen.DurableSeen`) is
   acked again, never answered twice (a holder that hands out a question twice, or a host
   restarted before its ack, gives one answer);
4. a question: ``reply_to`` checked (:func:`reply_of`) → ``on_question(opened)`` → the
   ``results`` message (the one answer path, as for a live question) → sealed to the
   asker's ``reply_to.keys`` with the same question id and kept in ``seen``
   (:meth:`SeenRecords.keep_unsent`) → put with the holder the question came from
   (``mailbox-conflict`` there means that answer is kept already; the asker's
   ``reply_to.holders`` is never dialled: a host never requests an address an asker
   chose); an answer: ``on_answer(opened)`` stores it (the outbox stores only into an open
   row: one stored answer per question);
5. then the record is admitted to ``seen`` (which forgets the kept answer in the same
   write), and only then acked. A process killed before its answer was kept answers again
   with the same id (the asker keeps one answer); killed after, it leaves the very answer
   it kept — not searched, charged or audited again — as does a step whose answer the
   holder had no room for yet (its bounds full).

The answer function and the asker's store are given by the caller (the host's
``Knowledge`` and admission, the guest's outbox): this module does the mailbox part only.
"""

from __future__ import annotations

import inspect
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from node.common.errors import CommunityError, KithError
from node.community.client import CommunityClient
from node.trust.binding import verify_chain
from node.trust.identity import Identity
from node.trust.sealed import MAX_RECIPIENTS, Opened, SeenRecords, open_sealed, seal

#: Most records one take (a page) gives.
TAKE_LIMIT = 20
#: Most pages one step takes: it pages on past a page holding records it leaves for the
#: other part of this device (2000 records: a holder's bound per recipient).
TAKE_PAGES = 100
_HEX64 = re.compile(r"[0-9a-f]{64}")
_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?")


@dataclass
class InboxReport:
    """What one :func:`take_step` did.

    Attributes:
        answered: question ids whose sealed answer was left with the asker's holder.
        stored: question ids of answers handed to ``on_answer`` that it stored.
        refused: refusal code → how many records were dropped with it (``sealed-*``, or a
            code ``on_question`` raised, e.g. a revoked asker).
        kept: record ids left at the holder: the answer could not be left (the asker's
            holder unreachable or full: a later step tries again), or a kind this step
            does not take (a host's step leaves answers, an asker's leaves questions).
        acked: how many records the holder removed. more: others wait after the last page
            taken.
        next: the take cursor to start the following step from (its ``after``): past every
            page this step dealt with whole — each record acked, or left for the other part
            of this device — and never past a page holding an answer not left or an ack that
            failed (those records are taken again); the ``after`` the step was given when it
            settled no page with a cursor; None: from the oldest.
    """

    answered: list[str] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    acked: int = 0
    more: bool = False
    next: str | None = None

    def refuse(self, code: str) -> None:
        """Count one dropped record under ``code``."""
        self.refused[code] = self.refused.get(code, 0) + 1


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    out = fn(*args)
    return await out if inspect.isawaitable(out) else out


def reply_of(opened: Opened) -> tuple[list[str], list[str]]:
    """A question's ``reply_to``: ``(keys, holders)`` — the asker's device keys (1-16, hex)
    and the holders' URLs (0-4, http(s)) — once every key is tied to the asker
    (specs/sealed.md §4, step 11): the question's sender itself, or a device bound to the
    sender's person by a binding chain the question carries in ``reply_to.chains``
    (``{device key: chain}``, verified by :func:`node.trust.binding.verify_chain`; only for a
    sender whose own chain proved its person). So no one gets an answer sealed to someone
    else's keys, nor to its own keys for a question another signed.

    Raises:
        KithError: ``sealed-malformed`` when the question does not say where its answer goes;
            ``sealed-reply-foreign`` when a key is not tied to the asker.
    """
    reply = opened.body.get("reply_to")
    keys = reply.get("keys") if isinstance(reply, dict) else None
    holders = reply.get("holders", []) if isinstance(reply, dict) else None
    chains = reply.get("chains", {}) if isinstance(reply, dict) else None
    if (not isinstance(keys, list) or not 1 <= len(keys) <= MAX_RECIPIENTS
            or any(not isinstance(k, str) or _HEX64.fullmatch(k) is None for k in keys)
            or len(set(keys)) != len(keys)
            or not isinstance(holders, list) or len(holders) > 4
            or any(not isinstance(h, str) or len(h) > 200 or _URL.fullmatch(h) is None for h in holders)
            or not isinstance(chains, dict) or set(reply) - {"keys", "holders", "chains"}):
        raise KithError("sealed-malformed", "the question's reply_to is not 1-16 distinct device keys, 0-4 holder "
                        "URLs and their chains")
    for key in keys:
        if key != opened.sender and not _bound_to_asker(opened, key, chains.get(key)):
            raise KithError("sealed-reply-foreign", "the question asks for its answer to be sealed to a key that "
                            "is not the asker's device nor bound to the asker's person by a chain it carries")
    return list(keys), list(holders)


def _bound_to_asker(opened: Opened, key: str, chain: object) -> bool:
    """True when ``chain`` binds ``key`` to the person the question's own chain proved."""
    if opened.identity is None or chain is None:
        return False
    try:
        return verify_chain(chain, key).person == opened.identity.person
    except KithError:
        return False


async def take_step(client: CommunityClient, identity: Identity, chain: list[dict[str, Any]] | None, *,
                    on_question: Callable[[Opened], Any] | None = None,
                    on_answer: Callable[[Opened], Any] | None = None,
                    seen: SeenRecords | None = None,
                    clock: Callable[[], float] = time.time,
                    after: str | None = None) -> InboxReport:
    """Take the records waiting at ``client``'s holder for ``identity`` and act on each once.

    A step takes a page of :data:`TAKE_LIMIT` records; while a page held records it left
    for the other part of this device (a kind it does not take) and more wait, it takes the
    page after it (the take's cursor), up to :data:`TAKE_PAGES` pages — so a part's own
    records are not stuck behind the other part's. A page where an answer could not be left
    (the holder full or unreachable) ends the step: the next pages would fail alike. A
    holder that gives no cursor (an older one) gets one take per step, as before.

    A caller that steps again and again (the host's loop,
    :func:`node.host.sealed_host.take_sealed_questions`) passes the last report's ``next``
    as ``after``, so it does not read again the records it left for the other part: a record
    put later is stored later, after the cursor. A cursor the holder refuses
    (``take-cursor-invalid``: another holder, its file replaced) is dropped and the step
    takes from the oldest.

    Args:
        client: a :class:`CommunityClient` of the holder, signing as ``identity``.
        identity: this device (its key opens the records; it signs the answers).
        chain: this device's binding chain, carried in its sealed answers (None: none).
        on_question: ``Opened → results message`` (sync or async): the host's one answer
            path for this asker at answer time; may raise :class:`KithError` to drop the
            question with that code (a revoked or blocked asker); None: questions are left
            at the holder (``kept``) for the part of this device that answers.
        on_answer: ``Opened → bool`` (sync or async): store an answer (True: stored, False:
            nothing was open for it); None: answers are left at the holder (``kept``).
        seen: the records this process acted on (:class:`SeenRecords`; a new one when None).
        clock: Unix seconds.
        after: the take cursor to start from (a previous step's ``InboxReport.next`` at the
            same holder); None: from the oldest.

    Returns:
        the :class:`InboxReport`.

    Raises:
        CommunityError: from the take itself (``mailbox-off``, ``server-unreachable``, …);
            a failing put or ack leaves its record for a later step instead.
        KithError: a fault of ``seen``'s file (:class:`node.trust.sealed_seen.DurableSeen`:
            ``config-invalid``, ``io-error``, ``disk-full``): the record is left at the holder,
            never dropped as if it were at fault.
    """
    seen = seen if seen is not None else SeenRecords()
    report = InboxReport(next=after)
    settled = True  # every page so far dealt with whole: the kept cursor may move on
    for _ in range(TAKE_PAGES):
        try:
            records, report.more, cursor = await client.take_sealed_page(TAKE_LIMIT, after)
        except CommunityError as exc:
            if exc.code != "take-cursor-invalid" or after is None:
                raise
            after = report.next = None  # a cursor this holder did not give: from the oldest
            records, report.more, cursor = await client.take_sealed_page(TAKE_LIMIT, after)
        left_for_other, unsent, acked_all = await _act_on_page(client, identity, chain, records, report, on_question,
                                                               on_answer, seen, clock)
        settled = settled and not unsent and acked_all
        if settled and cursor is not None:
            report.next = cursor
        after = cursor
        if not (report.more and after is not None and left_for_other and not unsent):
            break
    return report


async def _act_on_page(client: CommunityClient, identity: Identity, chain: list[dict[str, Any]] | None,
                       records: list[dict[str, Any]], report: InboxReport, on_question: Callable[[Opened], Any] | None,
                       on_answer: Callable[[Opened], Any] | None, seen: SeenRecords,
                       clock: Callable[[], float]) -> tuple[int, int, bool]:
    """Act once on one taken page of ``records`` (:func:`take_step`'s steps 2-5), adding to
    ``report``, then ack the records dealt with.

    Returns:
        ``(left for the other part, answers not left, acked)``: records of a kind this step
        does not take, questions whose answer the holder did not keep (both in ``kept``),
        and False when the ack of the records dealt with failed (they are taken again).
    """
    done: list[tuple[str, str]] = []  # (sender, id): the holder keeps records by both
    left_for_other = unsent = 0
    for record in records:
        rid = record.get("id") if isinstance(record.get("id"), str) else None
        sender = record.get("sender") if isinstance(record.get("sender"), str) else None
        try:
            opened = open_sealed(record, identity.secret, now=clock())
        except KithError as exc:
            report.refuse(exc.code)
            if rid is not None and sender is not None:
                done.append((sender, rid))
            continue
        seen_before = seen.seen(opened, now=clock())  # a fault of the local file is raised: the record stays
        if seen_before:
            report.refuse("sealed-replayed")
            done.append((opened.sender, opened.id))
            continue
        if (on_question if opened.kind == "question" else on_answer) is None:
            report.kept.append(opened.id)  # another part of this device takes that kind
            left_for_other += 1
            continue
        try:
            if opened.kind == "question":
                assert on_question is not None
                if not await _leave_answer(client, identity, chain, opened, on_question, clock, seen):
                    report.kept.append(opened.id)
                    unsent += 1
                    continue
                report.answered.append(opened.question_id)
            else:
                assert on_answer is not None
                if await _call(on_answer, opened):
                    report.stored.append(opened.question_id)
        except KithError as exc:
            report.refuse(exc.code)
        seen.admit(opened, now=clock())
        done.append((opened.sender, opened.id))
    if done:
        try:
            report.acked += await client.ack_sealed(done)
        except CommunityError:
            return left_for_other, unsent, False  # taken again: the seen ids (or the asker's one row) keep it once
    return left_for_other, unsent, True


async def _leave_answer(client: CommunityClient, identity: Identity, chain: list[dict[str, Any]] | None,
                        opened: Opened, on_question: Callable[[Opened], Any], clock: Callable[[], float],
                        seen: SeenRecords) -> bool:
    """Answer ``opened`` and leave the sealed answer with the holder the question came from.
    True when that holder keeps it; False to try again later — with the answer already
    made (``seen``'s unsent replies): a question whose answer waits for room at the holder
    (its bounds full) is answered once, not searched, charged and audited on every take.

    The question's ``reply_to.holders`` is checked but never dialled: a host would otherwise
    POST signed requests to any address an asker names (its own network included). The
    asker left the question here, so it takes its answer here.

    Raises:
        KithError: ``sealed-malformed`` (no valid ``reply_to``), ``sealed-reply-foreign`` (a
            key not tied to the asker), ``mailbox-not-accepted`` (the question was withdrawn
            meanwhile and the holder keeps nothing more for the asker: never kept on a later
            try), or what ``on_question`` raised.
    """
    keys, _holders = reply_of(opened)
    answer = seen.unsent(opened, now=clock())
    if answer is None:
        results = await _call(on_question, opened)
        now = clock()
        answer = seal(identity.secret, chain, kind="answer", question_id=opened.question_id,
                      body={"results": results}, recipients=keys, now=now,
                      expires=max(opened.expires_unix, int(now) + 60))
        seen.keep_unsent(opened, answer, now=clock())  # before the put: a kill then leaves this very answer
    try:
        await client.put_sealed(answer)
    except CommunityError as exc:
        if exc.code == "mailbox-not-accepted":
            # the holder no longer counts it a reply — the asker withdrew the question
            # (``kith outbox remove``, specs/sealed.md §10) after this host took it — and
            # the asker's card there takes no sealed records: no later try can be kept, so
            # the answer is dropped with that code (the caller records the question done)
            raise
        # mailbox-conflict: an answer to this question is kept there already; the caller's
        # admit forgets the kept answer in the same write that records the question done
        return exc.code == "mailbox-conflict"
    return True


def results_for(handle: Any, opened: Opened) -> dict[str, Any]:
    """The ``results`` message for a sealed question, exactly as the knowledge-query host
    hook builds it for a live ``query`` (protocols/knowledge-query/hooks.py): the request
    answered by ``handle`` (the peer's ``ctx.knowledge``, :meth:`Knowledge.search`), the
    query id ``outbox:<question id>`` (specs/outbox.md §3), the status and envelope, and
    ``retry_after_s`` / ``approval_id`` when given.

    Raises:
        KithError: ``sealed-malformed`` when the question carries no request object.
    """
    request = opened.body.get("request")
    if not isinstance(request, dict):
        raise KithError("sealed-malformed", "the question carries no request object")
    answer = handle.search(request)
    reply = {"action": "results", "query_id": f"outbox:{opened.question_id}", "status": answer["status"],
             "envelope": answer["envelope"]}
    for key in ("retry_after_s", "approval_id"):
        if answer.get(key) is not None:
            reply[key] = answer[key]
    return reply


async def leave_question(client: CommunityClient, identity: Identity, chain: list[dict[str, Any]] | None, *,
                         question_id: str, request: dict[str, Any], peer: str, recipients: list[str],
                         holders: list[str] | None = None, expires: float,
                         clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Seal a question to the host's device keys and leave it with ``client``'s holder (the
    guest's ``--later`` when the host is unreachable and its card names a mailbox).

    Args:
        question_id: the outbox id (32 hex; the idempotency key). request: the flat request.
        peer: the host key asked. recipients: the host's device keys (its cards').
        holders: where the answer should go (default: this holder); only http(s) URLs are
            carried (``reply_to.holders``, never dialled: a holder over iroh is left out).
            expires: Unix seconds.

    Returns:
        the sealed record left (its ``id`` is what the holder keeps).

    Raises:
        KithError: ``sealed-*`` from :func:`node.trust.sealed.seal`; CommunityError from the put
            (``mailbox-off``, ``mailbox-*-full``, ``server-unreachable``…).
    """
    record = seal(identity.secret, chain, kind="question", question_id=question_id,
                  body={"request": request, "peer": peer,
                        "reply_to": {"keys": [identity.public_key],
                                     "holders": [h for h in (holders or [client.base_url]) if _URL.fullmatch(h)]}},
                  recipients=recipients, now=clock(), expires=expires)
    try:
        await client.put_sealed(record)
    except CommunityError as exc:
        if exc.code != "mailbox-conflict":
            raise
    return record


__all__ = ["InboxReport", "TAKE_LIMIT", "TAKE_PAGES", "leave_question", "reply_of", "results_for", "take_step"]
