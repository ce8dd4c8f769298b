"""The Host role: bind iroh, publish (or write) an invitation, serve guests until cancelled.

``serve_host`` is transport orchestration only; every protocol rule lives in the engine,
every content rule in the knowledge handle and egress gate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio

from node.driver import run_session
from node.engine.session import HostConfig, SessionEngine, SessionReady
from node.errors import KithError, SpecError
from node.home import atomic_write
from node.hooks import HookContext, PeerInfo, load_hooks
from node.identity import load_or_init_identity
from node.invitation import DEFAULT_TTL_S, Invitation, create_invitation
from node.peers import PeerRegistry
from node.spec import find_protocol_dir, load_spec

log = logging.getLogger("kith.host")

MAX_CONCURRENT_SESSIONS = 64


@dataclass
class HostOptions:
    """How to host.

    Attributes:
        protocol: protocol name (looked up in ``<home>/protocols`` then the bundled ones).
        server_url: community server to publish to, or None.
        invite_file: where to write the invitation in file mode (no server), or None.
        local: iroh local mode (relay disabled, loopback, offline).
        ttl_s: invitation lifetime in seconds.
        message / tags: shown to guests browsing invitations.
        max_sessions: concurrent sessions served at once.
    """

    protocol: str = "knowledge-query"
    server_url: str | None = None
    invite_file: Path | None = None
    local: bool = False
    ttl_s: int = DEFAULT_TTL_S
    message: str | None = None
    tags: list[str] = field(default_factory=list)
    max_sessions: int = MAX_CONCURRENT_SESSIONS


class _EmptyKnowledge:
    """Stand-in handle when this home has no corpus yet: answers like an empty index."""

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        from node.corpus.envelope import empty_envelope, validate_search_request

        try:
            req = validate_search_request(request)
        except KithError:
            return {"status": "invalid-request", "envelope": empty_envelope("invalid-request", None)}
        return {"status": "no-verified-results", "envelope": empty_envelope("no-verified-results", req)}


@dataclass
class Knowledge:
    """The host's view of its corpus.

    Attributes:
        handle_for: ``peer_name | None`` → a peer-scoped knowledge handle for ``ctx.knowledge``.
        egress_check: the gate's last check on every outgoing business frame (raises
            ``EgressRefused`` when a real root or home path is in it), or None.
        close: releases the corpus.
    """

    handle_for: Callable[[str | None], Any]
    egress_check: Callable[[bytes], None] | None
    close: Callable[[], None]


def open_knowledge(home: Path, warn: Callable[[str], None]) -> Knowledge:
    """Open the corpus read-only with its policy and gate.

    Warns (via ``warn``) when the index is empty or not ready, or when no policy rule
    shares anything (DESIGN §10).
    """
    from node.corpus.store import Corpus
    from node.policy.gate import EgressGate
    from node.policy.knowledge import KnowledgeHandle
    from node.policy.store import Policy

    policy = Policy.load(home)
    try:
        corpus = Corpus(home, readonly=True)
    except KithError as exc:
        warn(f"the index is not available ({exc.code}); guests will get no results. "
             "Run `kith index add PATH` and `kith index sync`.")
        gate = EgressGate([], policy, home)
        return Knowledge(lambda peer: _EmptyKnowledge(), gate.check_outgoing, lambda: None)
    stats = corpus.stats()
    if not stats.get("chunks"):
        warn("the index is empty; guests will get no results. Run `kith index add PATH` and `kith index sync`.")
    elif stats.get("failed"):
        warn(f"{stats['failed']} document(s) failed to index; see `kith index status`.")
    if not policy.rules:
        warn("no policy rules: everything is private and guests will get no results. "
             "Share with e.g. `kith policy set '/<root>/**' public`.")
    gate = EgressGate(corpus.roots(), policy, home)
    return Knowledge(lambda peer: KnowledgeHandle(corpus, gate, peer), gate.check_outgoing, corpus.close)


async def serve_host(home: Path, opts: HostOptions, *, on_invitation: Callable[[dict[str, Any]], None],
                     on_event: Callable[[dict[str, Any]], None], warn: Callable[[str], None]) -> None:
    """Serve guests until cancelled (SIGINT/SIGTERM handling is the caller's).

    Args:
        on_invitation: called once with the published/written invitation dict.
        on_event: called with one dict per session event (``session-started``,
            ``session-ended``).
        warn: prints a warning for the owner (stderr).

    Raises:
        KithError: protocol not found/invalid, bind failure, server refusal.
    """
    from node.transport.iroh import bind_node

    identity = load_or_init_identity(home)
    pdir = find_protocol_dir(opts.protocol, home)
    if pdir is None:
        raise SpecError("protocol-not-found", f"no protocol named {opts.protocol!r}")
    spec = load_spec(pdir)
    hooks = load_hooks(pdir)
    knowledge = open_knowledge(home, warn)
    registry = PeerRegistry.load(home)
    seen_nonces: set[str] = set()
    limiter = anyio.CapacityLimiter(opts.max_sessions)

    try:
        async with bind_node(identity.secret, spec.alpn, local=opts.local) as node:
            if not await node.wait_online():
                warn("the iroh endpoint is not online yet (no relay); guests may not reach it")
            inv = create_invitation(identity, protocol_name=spec.name, protocol_version=spec.version,
                                    protocol_id=spec.protocol_id, ticket=node.ticket(), ttl_s=opts.ttl_s,
                                    message=opts.message, tags=opts.tags)
            if opts.server_url:
                from node.community.client import CommunityClient

                async with CommunityClient(opts.server_url, identity) as client:
                    inv = await client.publish_invitation(inv)
            if opts.invite_file is not None:
                atomic_write(Path(opts.invite_file), _json(inv.to_dict()), mode=0o644)
            on_invitation(inv.to_dict())
            live = {inv.post_id: spec.protocol_id}

            def nonce_unseen(nonce: str) -> bool:
                if nonce in seen_nonces:
                    return False
                seen_nonces.add(nonce)
                return True

            async def serve_connection(conn: Any) -> None:
                async with limiter:
                    try:
                        stream = await node.accept_stream(conn)
                    except KithError:
                        return
                    remote = stream.remote_id or ""
                    engine = SessionEngine(
                        "host", spec, public_key=identity.public_key, sign=identity.sign,
                        host=HostConfig(remote_id=remote, post_protocol=live.get, nonce_unseen=nonce_unseen),
                        egress_check=knowledge.egress_check)

                    def make_context(ev: SessionReady) -> HookContext:
                        rec = registry.by_key(ev.peer_public_key)
                        name = rec.name if rec else None
                        on_event({"event": "session-started", "session_id": ev.session_id,
                                  "peer": ev.peer_public_key, "peer_name": name})
                        return HookContext(role="host", session_id=ev.session_id,
                                           peer=PeerInfo(ev.peer_public_key, name, ev.peer_profile),
                                           knowledge=knowledge.handle_for(name),
                                           logger=logging.getLogger("kith.hooks." + spec.name))

                    outcome = await run_session(stream, engine, hooks, make_context=make_context)
                    on_event({"event": "session-ended", "session_id": outcome.session_id, "peer": remote,
                              "reason": outcome.reason, "code": outcome.code})

            async with anyio.create_task_group() as tg:
                while True:
                    conn = await node.accept()
                    if conn is None:
                        break
                    tg.start_soon(serve_connection, conn)
    finally:
        knowledge.close()


def _json(obj: Any) -> bytes:
    import json

    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


__all__ = ["HostOptions", "Invitation", "serve_host", "open_knowledge"]
