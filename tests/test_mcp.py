"""``kith mcp``: the read-only search tool over real MCP stdio (official SDK 2.x client)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import jsonschema
import pytest
from mcp import StdioServerParameters

from node.corpus.store import Corpus

from support.homes import initialized

from support.agents import mcp_env, mcp_session

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "specs" / "search-envelope.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("mcp")
    root = base / "kb"
    root.mkdir()
    (root / "deploy.md").write_text("# Deploy\n\nThe staging server is deleted automatically "
                                    "every night.\n")
    h = initialized(base / "home")  # peer calls sign with the home's identity
    with Corpus(h) as c:
        c.add_root(root)
        c.sync()
    return h


_session = mcp_session


def _structured(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def test_one_read_only_search_tool_returning_the_envelope(home: Path) -> None:
    async def calls(s):
        tools = (await s.list_tools()).tools
        ok = await s.call_tool("search", {"query": "staging server deleted", "topK": 3})
        bad = await s.call_tool("search", {"query": "staging", "topK": 50})
        spent = await s.call_tool("search", {"query": "staging", "remainingBudgetMs": 0})
        return tools, ok, bad, spent

    tools, ok, bad, spent = _session(home, calls)
    assert [t.name for t in tools] == ["search", "verify", "ask_later", "outbox"]
    ann = tools[0].annotations
    assert ann.read_only_hint is True and ann.destructive_hint is False
    # queuing is its own named tool, the only one that writes (specs/outbox.md §6)
    assert [t.name for t in tools if not t.annotations.read_only_hint] == ["ask_later"]
    assert {"query", "topK", "tags", "dateRange", "peer", "server"} <= set(
        tools[0].input_schema["properties"])
    for res, reason in ((ok, None), (spent, "budget-exhausted")):
        env = _structured(res)
        VALIDATOR.validate(env)
        assert env["reason"] == reason
    # an invalid request is a tool error with the stable code (and the invalid-request envelope)
    assert bad.is_error and bad.content[0].text.startswith("[query-invalid] ")
    VALIDATOR.validate(bad.structured_content)
    assert bad.structured_content["reason"] == "invalid-request"
    assert _structured(ok)["results"][0]["source"] == "/kb/deploy.md"
    assert str(home) not in json.dumps(_structured(ok))


def test_peer_search_refuses_a_bad_invitation_without_connecting(home: Path) -> None:
    """A peer argument naming an invitation file that does not exist is refused at once
    (``file-not-found``), and a malformed one ``invitation-malformed``; neither connects."""
    async def calls(s):
        return (await s.call_tool("search", {"query": "staging", "peer": "/nonexistent/invite.json"}),
                await s.call_tool("search", {"query": "staging", "peer": "not an invitation"}))

    res, malformed = _session(home, calls)
    assert res.is_error and malformed.is_error
    assert "[invitation-malformed]" in malformed.content[0].text
    text = res.content[0].text
    assert "[file-not-found]" in text and "no such file" in text and str(home) not in text


@pytest.mark.parametrize("mode,era", [("legacy", "2025-11-25"), ("auto", "2026-07-28")])
def test_the_server_says_who_it_is_and_only_what_it_has_in_both_eras(home: Path, mode: str, era: str) -> None:
    """Issue 32: the official SDK's client, in the 2025-11-25 ``initialize`` era and the
    2026-07-28 ``server/discover`` era, sees Kith's version (it was empty), the ``tools``
    capability alone (prompts and resources were advertised but none exist, and
    list-changed notifications none are sent), and — where the revision has caching
    hints — a tool list it may not cache (``ttlMs: 0``:
    the list follows the agent's grant, test_agents' caching-client test)."""
    from mcp.client.client import Client
    from mcp.shared.exceptions import MCPError

    from node import __version__

    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", f"from node.local.mcp import run_stdio; run_stdio({str(home)!r})"],
        env=mcp_env(home),
        cwd=str(REPO))

    async def main():
        async with Client(params, mode=mode) as c:
            listed = await c.list_tools()
            found = await c.call_tool("search", {"query": "staging server deleted", "topK": 3})
            refused = []
            for call in (c.list_prompts, c.list_resources):
                try:
                    await call()
                except MCPError as exc:
                    refused.append(exc.error.code)
            return c.protocol_version, c.server_info, c.server_capabilities, listed, found, refused

    version, info, caps, listed, found, refused = anyio.run(main)
    assert version == era
    assert info.name == "kith" and info.version == __version__
    assert caps.tools is not None and caps.tools.list_changed is False
    assert caps.prompts is None and caps.resources is None
    assert refused == [-32601, -32601]  # method not found: nothing behind what is not advertised
    assert [t.name for t in listed.tools] == ["search", "verify", "ask_later", "outbox"]
    if era == "2026-07-28":
        assert listed.ttl_ms == 0 and listed.cache_scope == "private"  # it lists what the agent may use, now
    assert _structured(found)["results"][0]["source"] == "/kb/deploy.md"


def test_the_outbox_tool_reads_a_home_this_user_may_read_but_not_write(tmp_path: Path) -> None:
    """`kith mcp` (the stdio server, a real process without root's DAC capabilities) on a
    home the user may read but not write (a chmod): the ``outbox`` tool lists the kept
    question and shows it by id — it refused ``io-error``, the outbox being opened for
    writing — and nothing in the home changes (specs/outbox.md §2)."""
    from node.guest.outbox import OutboxStore
    from support.agents import mcp_env
    from support.cli import without_root_reads
    from support.homes import files_of, read_only

    prefix = without_root_reads()
    home = initialized(tmp_path / "ro")
    env = mcp_env(home)
    with OutboxStore(home) as store:
        qid = store.add({"query": "where is the walrus", "topK": 3}, [("alice", "ab" * 32)])["id"]

    async def calls(s):
        return await s.call_tool("outbox", {}), await s.call_tool("outbox", {"id": qid[:8]})

    with read_only(home) as before:
        listed, shown = _session(home, calls, env=env, prefix=prefix)
        after = files_of(home)
    assert [q["id"] for q in _structured(listed)["questions"]] == [qid]
    assert _structured(shown)["query"] == "where is the walrus"
    assert after == before


def test_the_search_tool_answers_on_a_home_this_user_may_read_but_not_write(tmp_path: Path) -> None:
    """`kith mcp` (the stdio server, a real process without root's DAC capabilities) on an
    indexed home the user may read but not write (a chmod): the ``search`` tool answered
    ``available: false`` (tantivy's lock file) and the home's background runner stopped
    with an ``[io-error]`` line (its ``runner.lock``). The search answers; one line says
    the runner does not run on a read-only home; nothing in the home changes."""
    from support.cli import without_root_reads
    from support.homes import files_of, indexed_docs, read_only

    prefix = without_root_reads()
    initialized(tmp_path / "home")  # the node's identity; indexed_docs indexes into the same home
    home, _kb = indexed_docs(tmp_path, {"deploy.md": "# Deploy\n\nThe staging server is deleted automatically "
                                                     "every night.\n"}, folder="kb")
    env = mcp_env(home)

    async def calls(s):
        return await s.call_tool("search", {"query": "staging server"})

    with read_only(home) as before, (tmp_path / "stderr.txt").open("w") as errlog:
        found = _session(home, calls, env=env, prefix=prefix, errlog=errlog)
        after = files_of(home)
    err = (tmp_path / "stderr.txt").read_text()
    env_out = _structured(found)
    assert env_out["available"] is True and env_out["results"][0]["source"] == "/kb/deploy.md", env_out
    assert "[io-error]" not in err and "runner stopped" not in err and "Traceback" not in err, err[-3000:]
    said = " ".join(err.split())  # the log line is wrapped
    assert "read-only for you" in said and "runner does not run" in said, err
    assert after == before
