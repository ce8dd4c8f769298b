"""``kith agent``: the credentials of the programs that act for the owner through the local
doors (the local API, ``kith mcp``), each with the least authority it needs (specs/agents.md)."""

from __future__ import annotations

from typing import Optional

import typer

from node.cli.common import console, emit_json, err_console, home_of, json_option

agent_app = typer.Typer(
    help=(
        "Agents are the programs that use this node through `kith mcp` or the local API. Each "
        "has a token (printed once; only its hash is kept) and a scope: the sources it may "
        "search, the peers it may ask, whether it may use the outbox, and what happens to a "
        "question that would carry private text to a peer. What a scope does not name is "
        "not granted."
    ),
    no_args_is_help=True,
)

_JSON = json_option()
_SOURCES_HELP = "A glob of this node's source ids it may search ('**': every source); repeat for more. None given, or 'none': it searches nothing of this node's own."
_PEERS_HELP = "A pinned peer it may ask: NAME, @GROUP, all or none; repeat for more. None given: it asks no one."
_OUTBOUND_HELP = "What the outbound gate does with a question that carries private text, a personal value or a secret: allow (send and log), ask (the owner confirms) or block."
_UNTIL_HELP = "When the credential ends: a duration (30m, 12h, 7d, 2w), a date (YYYY-MM-DD) or an RFC 3339 UTC time."


def _print_agent(row: dict, token: str | None = None) -> None:
    console.print(f"agent {row['name']}", highlight=False, markup=False)
    console.print(f"  sources:  {', '.join(row['sources']) or 'none'}", highlight=False, markup=False)
    console.print(f"  peers:    {', '.join(row['peers'])}", highlight=False, markup=False)
    console.print(f"  queue:    {'yes' if row['queue'] else 'no'}", highlight=False, markup=False)
    console.print(f"  outbound: {row['outbound']}", highlight=False, markup=False)
    until = row["until"] or "never"
    console.print(f"  until:    {until}{' (expired)' if row['expired'] else ''}", highlight=False, markup=False)
    if token is not None:
        console.print("token (shown once; give it to the agent as KITH_AGENT_TOKEN or "
                      "`Authorization: Bearer`):", highlight=False, markup=False)
        console.print(f"  {token}", highlight=False, markup=False)


def _warn_unmatched(home: object, row: dict, sources: bool, peers: bool) -> None:
    """Warn on stderr of a ``--sources`` glob that matches none of the indexed sources (the
    agent would find nothing there) and of a ``--peers`` name that is not pinned; both are
    kept: the corpus and the registry may catch up."""
    from pathlib import Path

    home = Path(str(home))
    if sources:
        from node.corpus.search import source_glob
        from node.policy.coverage import indexed_sources

        ids = indexed_sources(home)
        for glob in row["sources"]:
            if ids and glob != "/**" and not any(source_glob(glob).match(s) for s in ids):
                err_console.print(f"warning: --sources {glob} matches none of the {len(ids)} indexed sources "
                                  "(`kith index status` lists the roots)", highlight=False, markup=False)
    if peers:
        from node.common.errors import KithError
        from node.trust.peers import PeerRegistry

        try:
            pinned = set(PeerRegistry.load(home).peers)
        except KithError:
            return
        for name in row["peers"]:
            if name not in ("all", "none") and not name.startswith("@") and name not in pinned:
                err_console.print(f"warning: --peers {name} is not a pinned peer (`kith peers list`); "
                                  "the agent can ask it once it is", highlight=False, markup=False)
        wanted = [n for n in row["peers"] if n.startswith("@")]
        if wanted:
            from node.policy.store import Policy

            try:
                groups = set(Policy.load(home).groups)
            except KithError:
                return
            for name in wanted:
                if name[1:] not in groups:
                    err_console.print(f"warning: --peers {name} is not a group of the policy (`kith peers group`); "
                                      "the agent can ask its members once it is", highlight=False, markup=False)


def _until(value: Optional[str]) -> Optional[str]:
    from node.common.grants import parse_until

    return None if value is None else parse_until(value)


@agent_app.command("add")
def add_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME", help="The agent's name (1-64 of A-Z a-z 0-9 _ . -)."),
    sources: list[str] = typer.Option([], "--sources", metavar="GLOB", help=_SOURCES_HELP),
    peers: list[str] = typer.Option([], "--peers", metavar="NAME|@GROUP|all|none", help=_PEERS_HELP),
    queue: bool = typer.Option(False, "--queue", help="It may keep questions in the outbox (and read it)."),
    outbound: str = typer.Option("ask", "--outbound", metavar="allow|ask|block", help=_OUTBOUND_HELP),
    until: Optional[str] = typer.Option(None, "--until", metavar="WHEN", help=_UNTIL_HELP),
    as_json: bool = _JSON,
) -> None:
    """Add agent NAME and print its token once."""
    from node.local.agents import add_agent

    sources = [] if sources == ["none"] else sources  # as `kith agent set --sources none`
    agent, token = add_agent(home_of(ctx), name, sources=sources, peers=peers, queue=queue,
                             outbound=outbound, until=_until(until))
    _warn_unmatched(home_of(ctx), agent.public(), bool(sources), bool(peers))
    if as_json:
        emit_json({**agent.public(), "token": token})
    else:
        _print_agent(agent.public(), token)


@agent_app.command("list")
def list_cmd(ctx: typer.Context, as_json: bool = _JSON) -> None:
    """List the agents and their scopes (never a token)."""
    from node.local.agents import load_agents

    rows = [a.public() for a in sorted(load_agents(home_of(ctx)).values(), key=lambda a: a.name)]
    if as_json:
        emit_json({"agents": rows})
        return
    if not rows:
        console.print("no agents", highlight=False)
    for row in rows:
        _print_agent(row)


@agent_app.command("show")
def show_cmd(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME"), as_json: bool = _JSON) -> None:
    """Show agent NAME's scope (never its token)."""
    from node.local.agents import get_agent

    row = get_agent(home_of(ctx), name).public()
    if as_json:
        emit_json(row)
    else:
        _print_agent(row)


@agent_app.command("set")
def set_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME"),
    sources: Optional[list[str]] = typer.Option(None, "--sources", metavar="GLOB",
                                                help=_SOURCES_HELP + " Replaces the list; --sources none: nothing."),
    peers: Optional[list[str]] = typer.Option(None, "--peers", metavar="NAME|@GROUP|all|none",
                                              help=_PEERS_HELP + " Replaces the list."),
    queue: Optional[bool] = typer.Option(None, "--queue/--no-queue", help="May it use the outbox."),
    outbound: Optional[str] = typer.Option(None, "--outbound", metavar="allow|ask|block", help=_OUTBOUND_HELP),
    until: Optional[str] = typer.Option(None, "--until", metavar="WHEN", help=_UNTIL_HELP + " 'never': no end."),
    as_json: bool = _JSON,
) -> None:
    """Change agent NAME's scope; its token stays. A running server applies it to the next request."""
    from node.local.agents import set_agent

    changes: dict = {}
    if sources is not None:
        changes["sources"] = [] if sources == ["none"] else sources
    if peers is not None:
        changes["peers"] = peers
    if queue is not None:
        changes["queue"] = queue
    if outbound is not None:
        changes["outbound"] = outbound
    if until is not None:
        changes["until"] = None if until == "never" else _until(until)
    row = set_agent(home_of(ctx), name, **changes).public()
    _warn_unmatched(home_of(ctx), row, "sources" in changes, "peers" in changes)
    if as_json:
        emit_json(row)
    else:
        _print_agent(row)


@agent_app.command("rotate")
def rotate_cmd(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME"), as_json: bool = _JSON) -> None:
    """Give agent NAME a new token (printed once); the old one is refused at once, also by a running server."""
    from node.local.agents import rotate_agent

    agent, token = rotate_agent(home_of(ctx), name)
    if as_json:
        emit_json({**agent.public(), "token": token})
    else:
        _print_agent(agent.public(), token)


@agent_app.command("remove")
def remove_cmd(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME"), as_json: bool = _JSON) -> None:
    """Remove agent NAME; its token is refused at once, also by a running server."""
    from node.local.agents import remove_agent

    agent = remove_agent(home_of(ctx), name)
    if as_json:
        emit_json({"removed": agent.name})
    else:
        console.print(f"removed agent {agent.name}", highlight=False, markup=False)
