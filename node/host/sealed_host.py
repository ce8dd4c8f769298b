"""``kith host --server URL --mailbox``: the host takes the sealed questions left for it when
it wakes, and every few seconds while it runs (issue 43 items 2a, 3; specs/sealed.md).

One loop per host (started in the host's task group): a step of
:func:`node.community.inbox.take_step` against the server's mailbox, with the host's own
answer function (:func:`node.answer.sealed_questions.host_answerer`: admission as a
handshake, the one answer path, the egress gate seam, the audit) run in a worker thread
like every other answer; repeated at once while the server says more wait, then after
:data:`TAKE_EVERY_S`. A failing take is said once on stderr and tried again; the host
serves on.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.to_thread

from node.common.errors import KithError

log = logging.getLogger("kith.sealed")

#: Seconds between two takes while the host runs (the first is at start).
TAKE_EVERY_S = 5.0


async def take_sealed_questions(host: Any, *, every_s: float = TAKE_EVERY_S) -> None:
    """Take and answer this host's sealed questions until cancelled.

    Args:
        host: the running :class:`node.host.host.Host` (its ``home``, ``identity``,
            ``opts.server_url`` / ``opts.peers_only``, ``knowledge``, ``audit``, ``warn``).
        every_s: seconds between takes.
    """
    from node.answer.sealed_questions import host_answerer
    from node.community.client import CommunityClient
    from node.community.inbox import take_step
    from node.trust.person import own_chain
    from node.trust.sealed import SeenRecords

    answer = host_answerer(host.home, host.knowledge, peers_only=host.opts.peers_only,
                           audit=getattr(host.audit, "log", None))

    async def on_question(opened: Any) -> Any:
        return await anyio.to_thread.run_sync(answer, opened)

    seen = SeenRecords()
    said = False
    while True:
        try:
            chain = own_chain(host.home, host.identity.public_key)
            async with CommunityClient(host.opts.server_url, host.identity) as client:
                while True:
                    report = await take_step(client, host.identity, chain, on_question=on_question, seen=seen)
                    if report.answered or report.refused:
                        log.info("sealed questions: answered %d, dropped %s", len(report.answered), report.refused)
                    if not report.more or not (report.answered or report.refused):
                        break
            said = False
        except KithError as exc:
            if not said:
                said = True
                host.warn(f"the community server's mailbox could not be read ({exc.code}); "
                          f"sealed questions wait there until it can")
        await anyio.sleep(every_s)


__all__ = ["TAKE_EVERY_S", "take_sealed_questions"]
