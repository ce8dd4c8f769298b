"""``kith api serve`` (the local read-only API) and ``kith mcp`` (the MCP tool), DESIGN §11."""

from __future__ import annotations

import logging
import sys

import typer

from node.cli.common import emit_json, err_console, home_of, host_option, port_option
from node.common.errors import CorpusError

api_app = typer.Typer(help="The local read-only API for agents on this machine (loopback only).",
                      no_args_is_help=True)


@api_app.command("serve")
def serve_cmd(
    ctx: typer.Context,
    host: str = host_option(),
    port: int = port_option(8765),
    json_out: bool = typer.Option(False, "--json", help='Print {"url": ...} on stdout once listening.'),
    access_log: bool = typer.Option(False, "--access-log", help="Log each request on stderr."),
    offline: bool = typer.Option(False, "--offline", envvar="KITH_OFFLINE", help="iroh local mode for `peers` searches (relay disabled, loopback)."),
) -> None:
    """Serve GET /health, /stats, /contract, /openapi.json, POST /search (this home's corpus
    or pinned peers) and POST /verify (a saved answer's citations) until Ctrl-C/SIGTERM. Every other method answers 403 and changes nothing; only a
    loopback Host/Origin with this port is answered. Every request but GET /health needs an
    agent's token (`Authorization: Bearer TOKEN`; `kith agent`) and is held to its scope. A lagging index is repaired at start
    when no other process is writing it (else a warning).

    The one write: POST /outbox asks pinned peers now and keeps the question for those that
    are offline in this home's outbox (GET /outbox reads it); while it serves, this process
    delivers the outbox when no other process of the home does (specs/outbox.md)."""
    from node.local.api import is_loopback, serve

    if not is_loopback(host):
        raise CorpusError("api-loopback-only",
                          f"refusing to serve the local API on non-loopback address {host}",
                          hint="use 127.0.0.1 or ::1; the API is for agents on this machine",
                          exit_code=2)
    if access_log:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")

    def listening(url: str) -> None:
        err_console.print(f"kith local API listening on {url} (read-only but POST /outbox; Ctrl-C to stop)",
                          highlight=False)
        err_console.print(_credential_line(home_of(ctx)), highlight=False, markup=False)
        if json_out:
            emit_json({"url": url})

    def warn(line: str) -> None:
        err_console.print(f"warning: {line}", highlight=False)

    serve(home_of(ctx), host, port, on_listening=listening, access_log=access_log, warn=warn, offline=offline)
    err_console.print("kith local API stopped", highlight=False)


def _credential_line(home: object) -> str:
    """What a client of the API must send: an agent's bearer token, how many agents this
    home has, and how to get a token (specs/agents.md)."""
    from node.common.errors import KithError
    from node.local.agents import load_agents

    try:
        n = len(load_agents(home))  # type: ignore[arg-type]
    except KithError as exc:
        return f"  warning: no request can be authorised: {exc.message}"
    if n == 0:
        from node.local.agents import agentless_read_only

        refusal = agentless_read_only(home)  # type: ignore[arg-type]
        if refusal is not None:
            return f"  warning: no agent can use it. {refusal.message}\n  hint: {refusal.hint}"
        return ("  warning: no agent can use it (every request but GET /health needs an agent's token): "
                "`kith agent add NAME` makes one")
    return (f"  every request but GET /health needs `Authorization: Bearer TOKEN` of one of this home's "
            f"{n} agent{'s' if n != 1 else ''} (`kith agent list`); `kith agent rotate default` prints a "
            "token of the default agent, `kith agent add NAME` makes a narrower one")


def mcp_cmd(
    ctx: typer.Context,
    local: bool = typer.Option(False, "--offline", "--local", envvar="KITH_OFFLINE",
                               help="Offline mode for peer searches: loopback only, relays off "
                                    "(--local: the old spelling, deprecated)."),
    agent: str = typer.Option("default", "--agent", metavar="NAME",
                              help="Serve as this agent (`kith agent`); its token is read from "
                                   "$KITH_AGENT_TOKEN, and every tool call is held to its scope."),
) -> None:
    """Serve the read-only `search` tool over MCP stdio (local corpus and joined peers), as
    the agent NAME whose token is in $KITH_AGENT_TOKEN (`kith agent rotate NAME` prints one)."""
    from node.local.mcp import run_stdio

    run_stdio(home_of(ctx), local=local, agent=agent)
