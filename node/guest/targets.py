"""What a guest may dial, and why a dial ended — the foot of the asking wing.

A :class:`Target` is a host to ask: a verified invitation (:func:`check_invitation`, and
:func:`pinned_target` for a pinned name), the local protocol it names and the name pinned
to its key. The pool (node/guest/pool.py) keeps sessions to targets and
nothing else; who answers for a name is decided above it (node/guest/asker.py). When a
session ends unanswered, :class:`PeerGone` says how, and :func:`classify_gone` turns it into
the per-peer status and code of specs/ask.md §3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.common.errors import HandshakeError, KithError, TransportError
from node.protocol.spec import ProtocolSpec, find_protocol_dir, load_spec
from node.trust.invitation import Invitation, verify_invitation


@dataclass(frozen=True)
class Target:
    """A Host to ask: its verified invitation, the local protocol it names, and the
    registry name pinned to its key (None for a host never pinned)."""

    invitation: Invitation
    protocol_dir: Path
    spec: ProtocolSpec
    pinned_name: str | None


def protocol_cache() -> dict[str, tuple[Path | None, ProtocolSpec | None]]:
    """An empty cache for :func:`check_invitation`'s ``protocols`` (protocol name →
    ``(protocol_dir, spec)``): one caller checking several invitations loads each protocol once."""
    return {}


def check_invitation(inv: Invitation, home: Path, *,
                     protocols: dict[str, tuple[Path | None, ProtocolSpec | None]] | None = None
                     ) -> tuple[Path, ProtocolSpec]:
    """Every check of DESIGN §5 before connecting, plus the pinned-key check.

    Args:
        protocols: a :func:`protocol_cache` to read and fill (None: load the protocol now).

    Returns:
        ``(protocol_dir, spec)`` of the local protocol the invitation names.

    Raises:
        InvitationError: any ``invitation-*`` code.
    """
    from node.transport.iroh import ticket_endpoint_id

    found = protocols.get(inv.protocol.name) if protocols is not None else None
    if found is None:
        pdir = find_protocol_dir(inv.protocol.name, home)
        found = (pdir, load_spec(pdir) if pdir is not None else None)
        if protocols is not None:
            protocols[inv.protocol.name] = found
    pdir, spec = found
    verify_invitation(inv, ticket_endpoint_id=ticket_endpoint_id,
                      local_protocol_id=spec.protocol_id if spec else None)
    assert pdir is not None and spec is not None
    return pdir, spec


def pinned_target(inv: Invitation, rec: Any, home: Path, *, protocols: Any = None) -> Target:
    """Every check of ``kith join`` on ``inv`` (:func:`check_invitation`, ``protocols`` its
    cache), plus: its host key is the key pinned for ``rec``, or — for a person pin — a
    device this home knows that person bound (:func:`node.trust.peers.known_device_of`;
    ``host-key-changed`` otherwise)."""
    from node.trust.peers import known_device_of

    if inv.host_public_key != rec.public_key and not (
            rec.devices and known_device_of(home, rec.public_key, inv.host_public_key, rec)):
        raise HandshakeError("host-key-changed",
                             f"the invitation for {rec.name!r} names another host key than the pinned one")
    pdir, spec = check_invitation(inv, home, protocols=protocols)
    return Target(inv, pdir, spec, rec.name)


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


__all__ = ["GONE_CODES", "PeerGone", "Target", "check_invitation", "classify_gone", "pinned_target", "protocol_cache"]
