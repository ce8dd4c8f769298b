"""Agent credentials for tests that call the local doors (specs/agents.md): the local API
and ``kith mcp`` refuse every request without one."""

from __future__ import annotations

from pathlib import Path

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
