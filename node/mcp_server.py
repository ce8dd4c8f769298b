"""``kith mcp``: the read-only search as an MCP tool over stdio (DESIGN §11).

Built on the official MCP Python SDK 2.x (``mcp.server.mcpserver.MCPServer``,
``@app.tool()``, ``app.run("stdio")``). One tool, ``search``, returning the
``schemaVersion`` 2 envelope (as structured content):

- without ``peer``: the node's own corpus, exactly as ``POST /search`` answers
  (:func:`node.corpus.retrieval.local_search`);
- with ``peer`` (an invitation file, an invitation JSON string, or a ``post_id`` with
  ``server``): one knowledge-query session with that Host via
  :func:`node.guest.join_session` — the Host's policy decides what comes back. Only
  peers the user has joined and pinned (``kith join … --pin NAME``) are searched; any
  other Host is refused with ``host-not-trusted`` (an agent must not open sessions to
  strangers). The answer is the Host's envelope plus nothing else.

Read-only: the tool never indexes, syncs, writes settings or memory, or starts servers;
its annotations say so (``readOnlyHint``). Bad input gets the same typed refusal as the
API (an ``invalid-request`` envelope; tool errors carry a code and one line, never a
path or exception text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.corpus import envelope as env_mod
from node.corpus import retrieval
from node.errors import CorpusError, KithError

#: Seconds a peer search may take end to end (connect + handshake + one answer).
PEER_TIMEOUT_S = 30.0

TOOL_DESCRIPTION = (
    "Search indexed knowledge (read-only). Without 'peer' it searches this node's own "
    "corpus; with 'peer' (an invitation file, invitation JSON, or a post_id plus 'server') "
    "it asks that Host, which must be a peer the user has joined and pinned. Returns the "
    "Kith schemaVersion 2 evidence envelope: cite citationPack citation ids; if available "
    "is false or quality.needsMoreEvidence is true, at most two follow-up searches within "
    "one 90-second budget, then report that no reliable evidence was found. "
    + env_mod.USAGE_PROMPT
)


def _local(home: Path, body: dict[str, Any]) -> dict[str, Any]:
    from node.corpus.store import Corpus

    corpus = Corpus(home, readonly=True)
    try:
        answer = retrieval.local_search(corpus, body)
    finally:
        corpus.close()
    return answer


async def peer_search(home: Path, peer: str, body: dict[str, Any], *,
                      server: str | None = None, local: bool = False,
                      timeout_s: float = PEER_TIMEOUT_S) -> dict[str, Any]:
    """Ask a joined peer one question over a knowledge-query session.

    Args:
        home: the node home (identity, peers registry). peer: invitation file / JSON /
            ``post_id``. body: the validated flat request. server: community server URL
            (needed for a ``post_id``). local: iroh local mode (tests, offline).
        timeout_s: end-to-end limit in seconds (also bounded by ``remainingBudgetMs``).

    Returns:
        ``{"status": <host status>, "envelope": <host envelope>}``.

    Raises:
        KithError: ``host-not-trusted`` (not a pinned peer), invitation errors,
            ``peer-search-failed`` (no answer in time / session failed).
    """
    import anyio

    from node.errors import InvitationError
    from node.guest import check_invitation, join_session, resolve_invitation, trust_status
    from node.identity import load_or_init_identity

    identity = load_or_init_identity(home)
    inv = await resolve_invitation(peer, server_url=server)
    pdir, spec = check_invitation(inv, home)
    if trust_status(inv, home) is None:
        raise InvitationError("host-not-trusted",
                              "that host is not a pinned peer; join it with `kith join "
                              "--pin NAME` first")
    answers: list[dict[str, Any]] = []
    filters = {k: v for k, v in body.items() if k not in ("query", "topK", "dedupe")}
    options: dict[str, Any] = {"queries": [body["query"]], "topK": body.get("topK", 5),
                               "filters": filters, "on_results": answers.append}
    budget = body.get("remainingBudgetMs")
    limit = timeout_s if budget is None else min(timeout_s, budget / 1000.0)
    outcome = None
    with anyio.move_on_after(limit):
        outcome = await join_session(home, identity, inv, pdir, spec, local=local,
                                     server_url=server, options=options)
    if not answers:
        code = getattr(outcome, "code", None) or "timeout"
        raise CorpusError("peer-search-failed",
                          f"the peer gave no answer ({code if isinstance(code, str) else 'failed'})")
    msg = answers[-1]
    return {"status": str(msg.get("status")), "envelope": msg.get("envelope")}


def build_server(home: Path | str, *, local: bool = False) -> Any:
    """Build the MCP server (``MCPServer`` named ``kith``) with its ``search`` tool.

    Args:
        home: the node home. local: iroh local mode for peer searches.

    Returns:
        An ``mcp.server.mcpserver.MCPServer``; ``run("stdio")`` serves it.
    """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    home = Path(home)
    app = MCPServer(name="kith", instructions=env_mod.USAGE_PROMPT)

    @app.tool(name="search", description=TOOL_DESCRIPTION,
              annotations=ToolAnnotations(title="Kith search (read-only)", readOnlyHint=True,
                                          destructiveHint=False, idempotentHint=True,
                                          openWorldHint=False))
    async def search(query: str, topK: int = 5, tags: list[str] | None = None,  # noqa: N803
                     project: list[str] | None = None, sourceSets: list[str] | None = None,  # noqa: N803
                     lifecycle: list[str] | None = None, workType: list[str] | None = None,  # noqa: N803
                     date: list[str] | None = None, dateRange: dict[str, str] | None = None,  # noqa: N803
                     sources: list[str] | None = None, remainingBudgetMs: int | None = None,  # noqa: N803
                     dedupe: str = "chunk", peer: str | None = None,
                     server: str | None = None) -> dict[str, Any]:
        """Search the local corpus or a joined peer; returns the evidence envelope."""
        import anyio

        body: dict[str, Any] = {"query": query, "topK": topK}
        for key, value in (("tags", tags), ("project", project), ("sourceSets", sourceSets),
                           ("lifecycle", lifecycle), ("workType", workType), ("date", date),
                           ("dateRange", dateRange), ("sources", sources),
                           ("remainingBudgetMs", remainingBudgetMs)):
            if value is not None:
                body[key] = value
        if dedupe != "chunk":
            body["dedupe"] = dedupe
        if peer is None:
            answer = await anyio.to_thread.run_sync(_local, home, body)
            return answer["envelope"]
        try:
            env_mod.validate_search_request(body)
        except CorpusError:
            return env_mod.empty_envelope("invalid-request")
        try:
            answer = await peer_search(home, peer, body, server=server, local=local)
        except KithError as exc:
            raise ToolError(f"[{exc.code}] {exc.message}") from None
        envelope = answer["envelope"]
        if not isinstance(envelope, dict):
            return env_mod.empty_envelope(answer["status"] if answer["status"] else "internal-error")
        return envelope

    return app


def run_stdio(home: Path | str, *, local: bool = False) -> None:
    """Serve the MCP tool over stdio until the client closes it."""
    build_server(home, local=local).run("stdio")
