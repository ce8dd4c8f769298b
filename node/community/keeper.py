"""Keep a Host's post live on the community server while ``kith host`` runs (DESIGN §5, §12).

A post stops being joinable when it is *consumed* (its ``max_sessions`` session proofs were
recorded — a single-use invitation after one session) or *expired*. The
:class:`PostKeeper` notices either and publishes a fresh invitation for the same endpoint,
so the Host keeps serving under a new ``post_id`` (the seeds' "the Host republishes the
Invitation"). It also closes each session on the server when the Host sees it end, so its
status reads ``closed`` even when the Guest was killed (the ``session_id`` stays valid for
feedback).

Each check refreshes the post's liveness lease (``POST .../lease``; the server lists a post
only while its host keeps refreshing, so a crashed Host's post leaves browse within the
lease time) and reads the post's state from the answer. It checks when nudged (after each
session starts — the Guest records its proof before ``_session_ready``, and the Host
records it too (:meth:`PostKeeper.record_proof`: a Guest that joined by file has no
server), so the count is up to date), when the post expires, and every ``refresh_s``
seconds otherwise (the server says how often; 30 s by default). What the answer says:

- ``live`` with another ``expires_at`` (a ``kith community renew`` elsewhere): the Host
  follows it (a ``post-renewed`` notice);
- ``consumed`` / ``expired``: a ``post-ended`` notice, then a fresh invitation is published
  (``on_republished``). A post the Host used up itself (:meth:`PostKeeper.consumed_here`)
  is republished even if the server still lists it as live (the old one is withdrawn);
- ``invitation-not-found`` (the server lost the post, e.g. a restored database):
  ``post-ended`` with reason ``lost``, then republished;
- ``withdrawn``: ``post-ended`` and the keeper stops — the owner withdrew it on purpose.

Server trouble is logged and retried at the next check; it never stops the Host. On
shutdown the Host calls :meth:`PostKeeper.retire` (no more republishing) and
:func:`withdraw_posts`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from node.community.client import CommunityClient
from node.common.errors import KithError
from node.common.host_events import PostEnded, PostRenewed
from node.trust.identity import Identity
from node.trust.invitation import Invitation, parse_invitation, parse_rfc3339

log = logging.getLogger("kith.community.keeper")

#: Seconds between status checks when nothing nudges the keeper (an upper bound: the
#: lease refresh interval the server asks for is used when shorter).
DEFAULT_POLL_S = 60.0
#: Lease refresh interval until the server has said its own, in seconds.
DEFAULT_REFRESH_S = 30.0
#: Bounds on the refresh interval a server may ask for, in seconds.
MIN_REFRESH_S, MAX_REFRESH_S = 0.2, 3600.0
#: How many pending nudges/closes are queued at most (more are dropped, with a log line).
QUEUE_SIZE = 1024


class PostKeeper:
    """Watch one Host's current post and republish it when it is consumed or expired.

    Args:
        server_url: the community server. identity: the Host identity (signs everything).
        current: the invitation as published (with the server's ``post_id``).
        make_invitation: builds a fresh signed invitation for the same endpoint (called on
            republish; its ``post_id`` is replaced by the server's).
        on_republished: called with ``(previous_post_id, reason, new_invitation)`` after a
            republish; ``reason`` is ``consumed``, ``expired``, ``lost`` or ``too-many-failures``.
        on_notice: called with a host event dict: ``{"event": "post-ended", "post_id",
            "reason": "withdrawn"|"consumed"|"expired"|"lost", "republish": bool}`` when the
            server says the post ended, ``{"event": "post-renewed", "post_id",
            "expires_at"}`` when its expiry moved (the Host's own expiry check follows).
        poll_s: longest wait between checks when nothing nudges (default 60; the server's
            lease refresh interval when shorter).
        clock: Unix seconds (the host's ``Clock.time``; tests inject one).
        sleep: waits the given seconds — every wait between checks and after a failed
            refresh goes through it (the host's ``Clock.sleep``,
            :mod:`node.runtime.clock`, so a test's ManualClock drives the checks; this
            package sits below ``runtime`` and takes the two readings, not the object).

    Run :meth:`run` in a task group for the Host's lifetime; feed it session events with
    :meth:`observe` (it never blocks the caller).
    """

    def __init__(self, server_url: str, identity: Identity, current: Invitation, *,
                 make_invitation: Callable[[], Invitation],
                 on_republished: Callable[[str, str, Invitation], None],
                 on_notice: Callable[[dict[str, Any]], None] = lambda _ev: None,
                 poll_s: float = DEFAULT_POLL_S,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = anyio.sleep, unlisted: bool = False) -> None:
        self.server_url = server_url
        self.unlisted = unlisted  # republished posts stay unlisted (absent from browse)
        self.identity = identity
        self.current = current
        self.make_invitation = make_invitation
        self.on_republished = on_republished
        self.on_notice = on_notice
        self.poll_s = poll_s
        self.refresh_s = DEFAULT_REFRESH_S
        self.clock = clock
        self.sleep = sleep
        self.stopped_reason: str | None = None
        self._replace: dict[str, str] = {}  # post_id -> why the host gave it up (consumed, too-many-failures)
        self._announced: set[str] = set()  # post ids whose post-ended was emitted
        self._retiring = False
        self._scope = anyio.CancelScope()
        self._send, self._receive = anyio.create_memory_object_stream[tuple[str, Any]](
            QUEUE_SIZE)

    def observe(self, event: dict[str, Any]) -> None:
        """Feed one host event (``serve_host``'s ``on_event`` dicts).

        ``session-started`` nudges a status check; ``session-ended`` with a
        ``session_id`` queues a close of that session on the server (reason: the end
        code, else the end reason).
        """
        kind = event.get("event")
        try:
            if kind == "session-started":
                self._send.send_nowait(("check", None))
            elif kind == "session-ended" and event.get("session_id"):
                reason = str(event.get("code") or event.get("reason") or "closed")
                self._send.send_nowait(("close", (event["session_id"], reason)))
        except anyio.WouldBlock:
            log.warning("community keeper queue full; dropped a %s event", kind)

    def record_proof(self, proof: dict[str, Any], *, used_up: bool = False) -> None:
        """Queue ``POST /api/v1/sessions`` of a ready session's proof, signed by the Host
        (a ``session-duplicate`` answer — the Guest recorded it first — is normal).

        Call it before the ``session-started`` event is observed, so the status check that
        event nudges sees the new count. ``used_up``: the Host admitted the last session
        its post allows (see :meth:`consumed_here`).
        """
        try:
            self._send.send_nowait(("proof", dict(proof)))
        except anyio.WouldBlock:
            log.warning("community keeper queue full; a session proof was not recorded")
        if used_up and proof.get("post_id"):
            self.consumed_here(str(proof["post_id"]))

    def consumed_here(self, post_id: str) -> None:
        """The Host admitted the last session ``post_id`` allows: republish it at the next
        check even if the server still counts it live (the proof may not have reached it)."""
        self.replace(post_id, "consumed")

    def replace(self, post_id: str, reason: str) -> None:
        """The Host gave ``post_id`` up (``consumed``, or ``too-many-failures``: a single-use
        post that collected too many failed handshakes): at the next check it is withdrawn
        and republished under a new ``post_id`` (``on_republished`` gets ``reason``)."""
        self._replace.setdefault(post_id, reason)
        try:
            self._send.send_nowait(("check", None))
        except anyio.WouldBlock:
            log.warning("community keeper queue full; dropped a check")

    def retire(self) -> None:
        """The Host is stopping: never republish from now on (a republish in flight is
        withdrawn again instead of reported). Closing sessions goes on until :meth:`stop`."""
        self._retiring = True

    def _seconds_to_expiry(self) -> float:
        try:
            expires = parse_rfc3339(self.current.expires_at).timestamp()
        except ValueError:
            return 0.0
        return max(0.0, expires - self.clock())

    def stop(self) -> None:
        """Make :meth:`run` return soon (the Host stopped accepting)."""
        self._scope.cancel()

    async def run(self) -> None:
        """Watch until :meth:`stop`, cancellation, or the post is withdrawn."""
        with self._scope:
            await self._run()

    async def _run(self) -> None:
        async with CommunityClient(self.server_url, self.identity) as client:
            # refresh at once: the answer says how often this server wants it (its lease
            # may be shorter than the default interval)
            if not await self._check(client):
                return
            while True:
                timeout = min(self.poll_s, self.refresh_s, self._seconds_to_expiry() + 0.5)
                item = await self._next(max(MIN_REFRESH_S, timeout))
                if item[0] == "close":
                    await self._close(client, *item[1])
                    continue
                if item[0] == "proof":
                    await self._submit(client, item[1])
                    continue
                if not await self._check(client):
                    return

    async def _next(self, timeout_s: float) -> tuple[str, Any]:
        """The next queued item, or ``("check", None)`` once ``timeout_s`` has passed on
        :attr:`sleep`'s clock with none."""
        item: tuple[str, Any] = ("check", None)
        async with anyio.create_task_group() as tg:
            async def timer() -> None:
                await self.sleep(timeout_s)
                tg.cancel_scope.cancel()

            tg.start_soon(timer)
            item = await self._receive.receive()
            tg.cancel_scope.cancel()
        return item

    async def _close(self, client: CommunityClient, session_id: str, reason: str) -> None:
        reason = "".join(c if c.isalnum() or c == "-" else "-" for c in reason.lower())[:64]
        try:
            await client.close_session(session_id, reason=reason.strip("-") or "closed")
        except KithError as exc:
            # session-closed: the guest closed it first; session-not-found: no proof
            # was recorded (a guest without a server) — both are normal.
            if exc.code not in ("session-closed", "session-not-found"):
                log.warning("could not close session %s on the server: %s", session_id[:12],
                            exc.message)

    async def _submit(self, client: CommunityClient, proof: dict[str, Any]) -> None:
        try:
            await client.submit_session(proof)
        except KithError as exc:
            # session-duplicate: the guest recorded it first; invitation-consumed: counted
            # already (the republish check follows) — both are normal.
            if exc.code not in ("session-duplicate", "invitation-consumed"):
                log.warning("could not record session %s on the server: %s",
                            str(proof.get("session_id", ""))[:12], exc.message)

    async def _check(self, client: CommunityClient) -> bool:
        """Refresh the current post's lease and act on its state. False → stop."""
        if self._retiring:
            return True
        post_id = self.current.post_id
        # what the host gave up BEFORE this check: a post given up while the refresh is in
        # flight is acted on by the check queued behind its proof, so the proof reaches the
        # server before the post is withdrawn
        given_up = dict(self._replace)
        try:
            post = await client.refresh_lease(post_id)
        except KithError as exc:
            if exc.code != "invitation-not-found":
                log.warning("could not refresh post %s on the server: %s", post_id, exc.message)
                await self.sleep(min(5.0, self.poll_s, self.refresh_s))
                return True
            state = "lost"  # the server no longer knows it (a restored or reset database)
        else:
            self.refresh_s = min(MAX_REFRESH_S, max(MIN_REFRESH_S,
                                                    float(post["lease"]["refresh_s"])))
            state = post["state"]
            self._follow_renewal(post)
        if state == "live" and post_id in given_up:
            state = given_up[post_id]  # given up here; the server did not count it (yet)
            try:
                await client.withdraw_invitation(post_id)  # browse stops listing it
            except KithError as exc:
                log.warning("could not withdraw used-up post %s: %s", post_id, exc.message)
        elif state == "withdrawn":
            log.warning("post %s was withdrawn; not republishing", post_id)
            self.stopped_reason = "withdrawn"
            self.on_notice(PostEnded(post_id=post_id, reason="withdrawn", republish=False).to_dict())
            return False
        if state not in ("consumed", "expired", "lost") and post_id not in given_up:
            return True
        if post_id not in self._announced:
            self._announced.add(post_id)
            self.on_notice(PostEnded(post_id=post_id, reason=state, republish=True).to_dict())
        try:
            fresh = await client.publish_invitation(self.make_invitation(), unlisted=self.unlisted)
        except KithError as exc:
            log.warning("could not republish post %s: %s", post_id, exc.message)
            await self.sleep(min(5.0, self.poll_s, self.refresh_s))
            return True
        if self._retiring:  # the Host stopped while this was being published
            await withdraw_posts(self.server_url, self.identity, [fresh.post_id])
            return True
        self.current = fresh
        self.on_republished(post_id, state, fresh)
        return True

    def _follow_renewal(self, post: dict[str, Any]) -> None:
        """Adopt the server's document when its ``expires_at`` moved (a renew elsewhere)."""
        doc = post.get("invitation")
        if post.get("state") != "live" or not isinstance(doc, dict) or \
                doc.get("expires_at") == self.current.expires_at:
            return
        try:
            renewed = parse_invitation(doc)
            parse_rfc3339(renewed.expires_at)
        except (KithError, ValueError):
            log.warning("the server answered post %s with an invalid invitation", post["post_id"])
            return
        if renewed.post_id != self.current.post_id or \
                renewed.host_public_key != self.current.host_public_key:
            return
        self.current = renewed
        self.on_notice(PostRenewed(post_id=renewed.post_id, expires_at=renewed.expires_at).to_dict())


async def withdraw_posts(server_url: str, identity: Identity, post_ids: list[str], *,
                         timeout_s: float = 3.0) -> list[str]:
    """Withdraw ``post_ids`` on the server (the Host is stopping: a later ``kith join
    <post_id>`` is refused at once instead of waiting for a dead Host).

    Bounded by ``timeout_s`` seconds in all; failures are logged, never raised.

    Returns:
        The post ids the server confirmed withdrawn.
    """
    done: list[str] = []
    with anyio.move_on_after(timeout_s):
        async with CommunityClient(server_url, identity, timeout_s=timeout_s) as client:
            for post_id in post_ids:
                try:
                    await client.withdraw_invitation(post_id)
                    done.append(post_id)
                except KithError as exc:
                    log.warning("could not withdraw post %s: %s", post_id, exc.message)
    if len(done) < len(post_ids):
        log.warning("%d post(s) were not withdrawn on the server", len(post_ids) - len(done))
    return done

