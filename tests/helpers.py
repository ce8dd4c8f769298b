"""A ConnectionPair-style helper: two engines wired back to back in memory (h11's habit).

No driver, no hooks, no event loop: bytes one engine queues are fed to the other, so
tests read like the protocol.
"""

from __future__ import annotations

from typing import Any

from node.engine.session import Event, GuestConfig, HostConfig, SessionEngine
from node.trust.identity import Identity
from node.protocol.spec import ProtocolSpec

POST_ID = "post-0001"


class EnginePair:
    """A guest engine and a host engine that exchange bytes on :meth:`pump`."""

    def __init__(self, spec: ProtocolSpec, host: Identity, guest: Identity, *, post_id: str = POST_ID,
                 claimed_guest_key: str | None = None, host_remote_id: str | None = None,
                 guest_expects_host: str | None = None, seen: set[str] | None = None,
                 guest_chain: list[dict[str, Any]] | None = None,
                 guest_revocation: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.seen = seen if seen is not None else set()

        def unseen(nonce: str) -> bool:
            ok = nonce not in self.seen
            self.seen.add(nonce)
            return ok

        self.host = SessionEngine("host", spec, public_key=host.public_key, sign=host.sign,
                                  host=HostConfig(remote_id=host_remote_id or guest.public_key,
                                                  post_protocol={POST_ID: spec.protocol_id}.get,
                                                  nonce_unseen=unseen))
        self.guest = SessionEngine("guest", spec, public_key=claimed_guest_key or guest.public_key, sign=guest.sign,
                                   guest=GuestConfig(remote_id=host.public_key, post_id=post_id,
                                                     host_public_key=guest_expects_host or host.public_key,
                                                     binding_chain=guest_chain,
                                                     revocation_list=guest_revocation))
        self.host_events: list[Event] = []
        self.guest_events: list[Event] = []

    def pump(self) -> None:
        """Move bytes both ways until neither side has anything queued."""
        for _ in range(100):
            g = self.guest.data_to_send()
            h = self.host.data_to_send()
            if not g and not h:
                return
            if g:
                self.host_events += self.host.receive_data(g)
            if h:
                self.guest_events += self.guest.receive_data(h)
        raise AssertionError("pump did not settle")

    def handshake(self) -> None:
        """Run the whole handshake (guest confirms right after the proof verifies)."""
        self.guest.initiate()
        self.pump()
        if self.guest.state.value == "await-confirm":
            self.guest_events += self.guest.confirm_ready()
            self.pump()

    def of(self, events: list[Event], kind: type) -> list[Any]:
        return [e for e in events if isinstance(e, kind)]
