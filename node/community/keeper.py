"""Keep a Host's post live on the community server while ``kith host`` runs (DESIGN §5, §12).

A post stops being joinable when it is *consumed* (its ``max_sessions`` session proofs were
recorded — a single-use invitation after one session) or *expired*. The
:class:`PostKeeper` notices either and publishes a fresh invitation for the same endpoint,
so the Host keeps serving under a new ``post_id`` (the seeds' "the Host republishes the
Invitation"). It also closes each session on the server when the Host sees it end, so its
status reads ``closed`` even when the Guest was killed (the ``session_id`` stays valid for
feedback).

It checks the post's status when nudged (after each session starts — the Guest records
its proof before ``_session_ready``, so the count is already up to date), when the post
expires, and every ``poll_s`` seconds otherwise. A withdrawn post is not republished: the
owner withdrew it on purpose. Server trouble is logged and retried at the next check; it
never stops the Host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio

from node.community.client import CommunityClient
from node.errors import KithError
from node.identity import Identity
from node.invitation import Invitation, parse_rfc3339

log = logging.getLogger("kith.community.keeper")

#: Seconds between status checks when nothing nudges the keeper.
DEFAULT_POLL_S = 60.0
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
            republish; ``reason`` is ``consumed`` or ``expired``.
        poll_s: seconds between checks when nothing nudges (default 60).
        clock: Unix seconds (tests inject one).

    Run :meth:`run` in a task group for the Host's lifetime; feed it session events with
    :meth:`observe` (it never blocks the caller).
    """

    def __init__(self, server_url: str, identity: Identity, current: Invitation, *,
                 make_invitation: Callable[[], Invitation],
                 on_republished: Callable[[str, str, Invitation], None],
                 poll_s: float = DEFAULT_POLL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.server_url = server_url
        self.identity = identity
        self.current = current
        self.make_invitation = make_invitation
        self.on_republished = on_republished
        self.poll_s = poll_s
        self.clock = clock
        self.stopped_reason: str | None = None
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
            while True:
                timeout = min(self.poll_s, self._seconds_to_expiry() + 0.5)
                item: tuple[str, Any] = ("check", None)
                with anyio.move_on_after(max(1.0, timeout)):
                    item = await self._receive.receive()
                if item[0] == "close":
                    await self._close(client, *item[1])
                    continue
                if not await self._check(client):
                    return

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

    async def _check(self, client: CommunityClient) -> bool:
        """Check the current post; republish if consumed or expired. False → stop."""
        try:
            post = await client.invitation_status(self.current.post_id)
        except KithError as exc:
            log.warning("could not check post %s on the server: %s", self.current.post_id,
                        exc.message)
            await anyio.sleep(min(5.0, self.poll_s))
            return True
        state = post["state"]
        if state == "withdrawn":
            log.warning("post %s was withdrawn; not republishing", self.current.post_id)
            self.stopped_reason = "withdrawn"
            return False
        if state not in ("consumed", "expired"):
            return True
        previous = self.current.post_id
        try:
            fresh = await client.publish_invitation(self.make_invitation())
        except KithError as exc:
            log.warning("could not republish post %s: %s", previous, exc.message)
            await anyio.sleep(min(5.0, self.poll_s))
            return True
        self.current = fresh
        self.on_republished(previous, state, fresh)
        return True

