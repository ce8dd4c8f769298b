"""What a guest may dial, and why a dial ended — the foot of the asking wing.

A :class:`Target` is a host to ask: a verified invitation, the local protocol it names and
the name pinned to its key. The pool (node/guest/pool.py) keeps sessions to targets and
nothing else; who answers for a name is decided above it (node/guest/asker.py). When a
session ends unanswered, :class:`PeerGone` says how, and :func:`classify_gone` turns it into
the per-peer status and code of specs/ask.md §3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.common.errors import KithError, TransportError
from node.protocol.spec import ProtocolSpec
from node.trust.invitation import Invitation


@dataclass(frozen=True)
class Target:
    """A Host to ask: its verified invitation, the local protocol it names, and the
    registry name pinned to its key (None for a host never pinned)."""

    invitation: Invitation
    protocol_dir: Path
    spec: ProtocolSpec
    pinned_name: str | None


#: The host's refusals that mean the invitation itself is gone there — it restarted
#: without it, withdrew it (``kith host --new-invitation``), used it up or it expired
#: there; under ``--presence granted`` also "you hold no grant", on purpose the same — for
#: which the guest says ``invitation-gone`` (issue 30; specs/invitation.md).
GONE_CODES = ("handshake-unknown-post", "handshake-post-expired")


class PeerGone(Exception):
    """The session ended before answering (``outcome`` says how; ``reached`` is True when
    it had completed its handshake, i.e. the host was reachable)."""

    def __init__(self, outcome: Any, error: KithError | None, reached: bool) -> None:
        super().__init__("session ended")
        self.outcome = outcome
        self.error = error
        self.reached = reached


def connect_failed(gone: PeerGone) -> bool:
    return isinstance(gone.error, TransportError)


def post_gone(gone: PeerGone) -> bool:
    """The host refused the post itself (:data:`GONE_CODES`)."""
    out = gone.outcome
    return out is not None and getattr(out, "reason", None) == "rejected" and out.code in GONE_CODES


def classify_gone(gone: PeerGone) -> tuple[str, str | None]:
    """``(status, code)`` of the per-peer table for a session that ended unanswered
    (specs/ask.md §3): a refused handshake is ``refused`` with its code; a failed
    connection or a session the host dropped is ``unreachable``."""
    out = gone.outcome
    if gone.error is not None:
        if isinstance(gone.error, TransportError):
            return "unreachable", gone.error.code
        return "refused", gone.error.code
    if post_gone(gone):
        return "refused", "invitation-gone"  # the host no longer honours the saved invitation (issue 30)
    if out is not None and getattr(out, "reason", None) == "rejected":
        return "refused", out.code or "handshake-rejected"
    if out is not None and out.remote_errors:
        code = out.remote_errors[-1][0]
        if code not in ("session-evicted", "session-shutdown"):
            return "refused", code
    if out is not None and out.code:
        return "unreachable", out.code
    if out is not None and isinstance(out.peer_end, dict):
        return "unreachable", "session-shutdown" if out.peer_end.get("reason") == "shutdown" else "peer-disconnected"
    return "unreachable", "peer-disconnected"


__all__ = ["GONE_CODES", "PeerGone", "Target", "classify_gone"]
