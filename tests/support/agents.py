"""Agent credentials for tests that call the local doors (specs/agents.md): the local API
and ``kith mcp`` refuse every request without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.local.agents import TOKEN_ENV, add_agent, load_agents, rotate_agent

#: The agent the tests' doors run as unless a test makes its own: the default agent's scope
#: with the outbound gate set to allow (tests that test the gate make their own agents).
TEST_AGENT = "tests"


def agent_token(home: Path | str, name: str = TEST_AGENT, *, sources: tuple[str, ...] = ("**",),
                peers: tuple[str, ...] = ("all",), queue: bool = True, outbound: str = "allow",
                until: str | None = None) -> str:
    """A token of agent ``name`` in ``home`` (added with the scope given, or rotated when
    it exists already: the old token stops working)."""
    Path(home).mkdir(parents=True, exist_ok=True)
    if name in load_agents(home):
        return rotate_agent(home, name)[1]
    return add_agent(home, name, sources=sources, peers=peers, queue=queue, outbound=outbound,
                     until=until)[1]


def bearer(token: str) -> dict[str, str]:
    """The local API's credential header."""
    return {"Authorization": f"Bearer {token}"}


def api_headers(home: Path | str, name: str = TEST_AGENT) -> dict[str, str]:
    """``Authorization: Bearer`` with a fresh token of the tests' agent of ``home``."""
    return bearer(agent_token(home, name))


def mcp_env(home: Path | str, name: str = TEST_AGENT, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a ``kith mcp`` child process: ``base`` (default: this process's)
    plus ``KITH_AGENT_TOKEN`` of the tests' agent of ``home``."""
    import os

    env = dict(os.environ if base is None else base)
    env[TOKEN_ENV] = agent_token(home, name)
    return env


def mcp_session(home: Path, calls, *, env: dict[str, str] | None = None, agent: str | None = None,
                prefix: tuple[str, ...] | list[str] = (), errlog: Any = None):
    """``run_stdio(home)`` (``kith mcp``; with ``agent``, ``run_stdio(home, agent=AGENT)``)
    as a child process over stdio, and ``await calls(session)`` against it once the client
    session is initialised: its result.

    Args:
        env: the child's environment (default: :func:`mcp_env` of ``home``).
        prefix: an argv prefix the child runs under (:func:`support.cli.without_root_reads`).
        errlog: a file the child's stderr goes to (default: this process's stderr).
    """
    import sys

    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from support.homes import REPO

    args = f"run_stdio({str(home)!r}" + (f", agent={agent!r})" if agent else ")")
    argv = [*prefix, sys.executable, "-c", f"from node.local.mcp import run_stdio; {args}"]
    params = StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(REPO),
                                   env=env if env is not None else mcp_env(home))

    async def main():
        async with stdio_client(params, **({} if errlog is None else {"errlog": errlog})) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                return await calls(s)

    return anyio.run(main)
