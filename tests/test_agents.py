"""Issue 41: agents act with the least authority the owner gives them (specs/agents.md).

Both local doors — a real uvicorn server on 127.0.0.1 and the real ``kith mcp`` stdio
server — require an agent's credential and hold it to its scope through the one check
(:func:`node.local.agents.authorize`); ``kith agent`` manages the credentials.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from node.corpus.store import Corpus
from node.local.agents import (API_OPERATIONS, TOKEN_ENV, TOOL_OPERATIONS, add_agent, authorize, ensure_default_agent, load_agents,
                               Operation, remove_agent, rotate_agent, set_agent)
from node.local.api import create_app, run_api_in_thread
from node.common.errors import AgentError

from support.agents import bearer, mcp_session
from support.cli import KITH
from support.homes import initialized, new_identity

HTTP = httpx.Client(timeout=30)
NOTE = "The staging server is deleted automatically every night by the cleanup job."
SECRET = "Payroll numbers for the quarter are kept in the locked cabinet."


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("agents")
    root = base / "kb"
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir()
    (root / "public" / "deploy.md").write_text(f"# Deploy\n\n{NOTE}\n")
    (root / "private" / "payroll.md").write_text(f"# Payroll\n\n{SECRET}\n")
    h = initialized(base / "home")
    ensure_default_agent(h)  # as `kith init` does
    with Corpus(h) as c:
        c.add_root(root)
        c.sync()
    from node.trust.peers import PeerRegistry

    PeerRegistry.load(h).add("alice", new_identity().public_key)  # pinned (never reached here)
    PeerRegistry.load(h).add("bob", new_identity().public_key)
    return h


@pytest.fixture(scope="module")
def api(home: Path):
    with run_api_in_thread(home, offline=True) as url:
        yield url


def _token(home: Path, name: str, **scope) -> str:
    if name in load_agents(home):
        remove_agent(home, name)
    return add_agent(home, name, **scope)[1]


#: every route of the local API, with a body for each POST
ROUTES = [("GET", "/health", None), ("GET", "/stats", None), ("GET", "/contract", None),
          ("GET", "/openapi.json", None), ("POST", "/search", {"query": "staging server"}),
          ("POST", "/search", {"query": "staging server", "peers": ["alice"]}),
          ("POST", "/search", {"query": "staging server", "peers": "all"}),
          ("POST", "/verify", {"answer": {}}), ("GET", "/outbox", None),
          ("POST", "/outbox", {"query": "staging server", "peers": ["alice"]})]
#: the routes that disclose nothing of the owner's (static documents, and health)
STATIC = {"/health", "/contract", "/openapi.json"}


def _call(url: str, method: str, path: str, body, headers=None) -> httpx.Response:
    return HTTP.request(method, url + path, json=body, headers=headers or {})


def test_the_route_table_and_the_tool_list_are_the_check_s_tables(home: Path) -> None:
    """Every route served (and, over stdio below, every tool listed) has its operation in
    the one table the check reads: a new route or tool without one fails here."""
    app = create_app(home)
    served = {(m, r.path) for r in app.app.routes for m in r.methods if m != "HEAD"}
    app.holder.close()
    assert served == set(API_OPERATIONS)
    assert {(m, p) for m, p, _ in ROUTES} == served
    # the tools: test_mcp_holds_every_tool_to_the_scope_and_sees_a_rotation_at_once


def test_no_credential_gets_nothing_but_up(home: Path, api: str) -> None:
    for method, path, body in ROUTES:
        r = _call(api, method, path, body)
        if path == "/health":
            assert r.status_code == 200 and r.json() == {"service": "kith-local-api", "status": "up"}
            continue
        assert r.status_code == 401, (method, path)
        assert r.json()["error"]["code"] == "agent-token-required"
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "staging" not in r.text.lower()
    token = _token(home, "full", sources=["**"], peers=["all"], queue=True)
    # a token anywhere but the Authorization header is never read
    assert HTTP.get(api + "/stats", params={"token": token}).status_code == 401
    assert HTTP.get(api + "/stats", params={"access_token": token}).status_code == 401
    assert HTTP.get(api + "/stats", headers={"Cookie": f"token={token}"}).status_code == 401
    assert HTTP.get(api + "/stats", headers={"Authorization": f"Basic {token}"}).status_code == 401
    wrong = HTTP.get(api + "/stats", headers=bearer(token[:-2] + "xx"))
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "agent-token-invalid"
    assert HTTP.get(api + "/stats", headers=bearer(token)).json()["done"] == 2


def test_another_process_without_a_token_is_refused(home: Path, api: str) -> None:
    """Another process (as uid ``nobody`` when this runs as root: another OS account)
    sends the request of the issue's report and gets nothing."""
    code = ("import json, urllib.request, urllib.error, sys\n"
            f"req = urllib.request.Request({api + '/search'!r}, data=json.dumps({{'query': 'staging server'}}).encode(),"
            " headers={'Content-Type': 'application/json'})\n"
            "try:\n    urllib.request.urlopen(req, timeout=30); print('200')\n"
            "except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode())\n")
    # stdlib only: another account may not be able to run this tree's interpreter
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable
    kwargs = {"user": "nobody"} if os.geteuid() == 0 and python != sys.executable else {}
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=60,
                         cwd="/", **kwargs)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("401 ") and "agent-token-required" in out.stdout
    assert "staging" not in out.stdout.split(" ", 1)[1].lower()


def test_an_out_of_scope_credential_gets_nothing_from_any_route(home: Path, api: str) -> None:
    token = _token(home, "nothing")  # no sources, no peers, no queue
    for method, path, body in ROUTES:
        r = _call(api, method, path, body, bearer(token))
        if path in STATIC:
            assert r.status_code == 200
            assert "staging" not in r.text.lower() and "payroll" not in r.text.lower()
            continue
        assert r.status_code == 403, (method, path, body, r.text)
        assert r.json()["error"]["code"] == "agent-scope"


def test_every_dimension_of_a_scope_on_the_api(home: Path, api: str) -> None:
    # sources: a local search sees only its globs, ANDed with the request's own filter
    public = bearer(_token(home, "public-only", sources=["/kb/public/**"]))
    found = HTTP.post(api + "/search", json={"query": "payroll numbers cabinet"}, headers=public).json()
    assert all(r["source"].startswith("/kb/public/") for r in found["results"])
    assert SECRET.split()[0] not in json.dumps(found["results"])
    asked = HTTP.post(api + "/search", json={"query": "payroll numbers cabinet", "sources": ["/kb/private/**"]},
                      headers=public).json()
    assert asked["results"] == []
    own = HTTP.post(api + "/search", json={"query": "staging server deleted"}, headers=public).json()
    assert own["results"][0]["source"] == "/kb/public/deploy.md"
    assert HTTP.get(api + "/stats", headers=public).json()["error"]["code"] == "agent-scope"  # counts: all sources
    # peers: a peer not named is refused; "all" narrows to the named ones
    only_bob = bearer(_token(home, "only-bob", peers=["bob"]))
    r = HTTP.post(api + "/search", json={"query": "x", "peers": ["alice"]}, headers=only_bob)
    assert r.status_code == 403 and "'alice'" in r.json()["error"]["message"]
    nobody = bearer(_token(home, "only-carol", peers=["carol"]))  # carol is not pinned
    r = HTTP.post(api + "/search", json={"query": "x", "peers": "all"}, headers=nobody)
    assert r.status_code == 403 and "none of the pinned" in r.json()["error"]["message"]
    r = HTTP.post(api + "/search", json={"query": "x"}, headers=only_bob)
    assert r.status_code == 403  # no sources: nothing of this node's own
    # verify needs some peer; with one it runs (a bad body is answer-invalid, not agent-scope)
    assert HTTP.post(api + "/verify", json={"answer": "nope"}, headers=only_bob).json()["error"]["code"] == "answer-invalid"
    # queue: the outbox needs --queue
    assert HTTP.get(api + "/outbox", headers=only_bob).status_code == 403
    queue = bearer(_token(home, "queue", peers=["bob"], queue=True))
    assert HTTP.get(api + "/outbox", headers=queue).status_code == 200
    r = HTTP.post(api + "/outbox", json={"query": "x", "peers": ["alice"]}, headers=queue)
    assert r.status_code == 403 and r.json()["error"]["code"] == "agent-scope"


def test_a_running_server_refuses_a_rotated_removed_or_expired_agent_at_once(home: Path, api: str) -> None:
    token = _token(home, "short", sources=["**"])
    assert HTTP.get(api + "/stats", headers=bearer(token)).status_code == 200
    _, new = rotate_agent(home, "short")
    assert HTTP.get(api + "/stats", headers=bearer(token)).json()["error"]["code"] == "agent-token-invalid"
    assert HTTP.get(api + "/stats", headers=bearer(new)).status_code == 200
    set_agent(home, "short", until="2020-01-01T00:00:00Z")
    r = HTTP.get(api + "/stats", headers=bearer(new))
    assert r.status_code == 401 and r.json()["error"]["code"] == "agent-expired"
    set_agent(home, "short", until=None)
    assert HTTP.get(api + "/stats", headers=bearer(new)).status_code == 200
    remove_agent(home, "short")
    assert HTTP.get(api + "/stats", headers=bearer(new)).json()["error"]["code"] == "agent-token-invalid"


def test_the_one_check_refuses_typed(home: Path) -> None:
    with pytest.raises(AgentError) as e:
        authorize(home, None, Operation("connect"))
    assert e.value.code == "agent-token-required" and e.value.status == 401
    token = _token(home, "named", sources=["**"])
    assert authorize(home, token, Operation("search")).name == "named"
    with pytest.raises(AgentError) as e:  # kith mcp --agent default with another agent's token
        authorize(home, token, Operation("connect"), agent="default")
    assert e.value.code == "agent-token-invalid"
    with pytest.raises(AgentError) as e:
        authorize(home, token, Operation("ask", ("alice",)))
    assert e.value.code == "agent-scope" and e.value.status == 403


# --- kith mcp ----------------------------------------------------------------------------
def _mcp(home: Path, calls, env: dict[str, str], agent: str | None = None):
    return mcp_session(home, calls, env=env, agent=agent)


#: one call of every tool, with the arguments that reach each dimension
TOOL_CALLS = [("search", {"query": "staging server"}), ("search", {"query": "staging", "peers": ["alice"]}),
              ("search", {"query": "staging", "peers": "all"}), ("search", {"query": "staging", "peer": "alice"}),
              ("verify", {"answer": {}}), ("outbox", {}), ("ask_later", {"query": "staging", "peers": ["alice"]})]


def test_mcp_refuses_to_start_without_a_token_and_with_another_agent_s(home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    out = subprocess.run([*KITH, "--home", str(home), "mcp"], capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, timeout=120)
    assert out.returncode == 1 and "agent-token-required" in out.stderr
    env[TOKEN_ENV] = _token(home, "other", sources=["**"])
    out = subprocess.run([*KITH, "--home", str(home), "mcp"], capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, timeout=120)
    assert out.returncode == 1 and "agent-token-invalid" in out.stderr  # not the default agent's
    out = subprocess.run([*KITH, "--home", str(home), "mcp", "--agent", "nosuch"], capture_output=True,
                         text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert out.returncode == 1 and "agent-not-found" in out.stderr


def test_mcp_holds_every_tool_to_the_scope_and_sees_a_rotation_at_once(home: Path) -> None:
    env = {**os.environ, TOKEN_ENV: _token(home, "mcp-nothing")}

    async def calls(s):
        tools = [t.name for t in (await s.list_tools()).tools]
        results = [await s.call_tool(name, args) for name, args in TOOL_CALLS]
        rotate_agent(home, "mcp-nothing")
        after = await s.call_tool("search", {"query": "staging server"})
        return tools, results, after

    tools, results, after = _mcp(home, calls, env)
    assert {name for name, _ in TOOL_CALLS} == set(TOOL_OPERATIONS)
    assert tools == []  # nothing is offered that it may not use (each call below stays refused)
    for (name, args), res in zip(TOOL_CALLS, results):
        assert res.is_error, (name, args)
        assert res.content[0].text.startswith("[agent-scope] "), (name, args, res.content[0].text)
    assert after.is_error and after.content[0].text.startswith("[agent-token-invalid] ")


def test_mcp_lists_only_the_tools_the_grant_allows_and_a_changed_grant_at_the_next_list(home: Path) -> None:
    """``tools/list`` over the real stdio server offers what the agent may call: its own
    sources only → ``search``; with peers → ``verify`` too; with ``--queue`` → ``ask_later``
    and ``outbox``. A tool it does not list stays refused, and a grant changed while the
    server runs shows at the next list."""
    env = {**os.environ, TOKEN_ENV: _token(home, "mcp-lister", sources=["/kb/public/**"])}

    async def calls(s):
        first = [t.name for t in (await s.list_tools()).tools]
        unlisted = await s.call_tool("outbox", {})
        set_agent(home, "mcp-lister", peers=["bob"])
        second = [t.name for t in (await s.list_tools()).tools]
        set_agent(home, "mcp-lister", queue=True)
        third = [t.name for t in (await s.list_tools()).tools]
        return first, unlisted, second, third

    first, unlisted, second, third = _mcp(home, calls, env, agent="mcp-lister")
    assert first == ["search"], first
    assert unlisted.is_error and unlisted.content[0].text.startswith("[agent-scope] "), unlisted.content
    assert second == ["search", "verify"], second
    assert third == ["search", "verify", "ask_later", "outbox"], third


def test_a_caching_mcp_client_sees_a_narrowed_grant_at_its_next_list(home: Path) -> None:
    """The SDK's own ``Client`` in the 2026-07-28 era honours a ``tools/list`` result's
    ``ttlMs`` (it keeps the list that long and does not ask again). Kith's list depends on
    the agent's grant, read at each list, and no ``list_changed`` notification is sent
    (``listChanged: false``), so the hint is ``ttlMs: 0``: a grant narrowed while the
    session runs shows at the client's next list. With the hour it had, the client kept
    offering ``verify`` and ``ask_later`` after the grant took the peers and the queue
    away (each call refused ``agent-scope``)."""
    import anyio
    from mcp import StdioServerParameters
    from mcp.client.client import Client

    from support.homes import REPO

    env = {**os.environ, TOKEN_ENV: _token(home, "mcp-cached", sources=["/kb/public/**"], peers=["bob"],
                                           queue=True)}
    params = StdioServerParameters(command=sys.executable, env=env, cwd=str(REPO), args=[
        "-c", f"from node.local.mcp import run_stdio; run_stdio({str(home)!r}, agent='mcp-cached')"])

    async def main():
        async with Client(params, mode="auto") as c:
            first = await c.list_tools()
            set_agent(home, "mcp-cached", peers=[], queue=False)
            second = await c.list_tools()
            return c.protocol_version, first, second

    era, first, second = anyio.run(main)
    assert era == "2026-07-28"
    assert [t.name for t in first.tools] == ["search", "verify", "ask_later", "outbox"]
    assert [t.name for t in second.tools] == ["search"], [t.name for t in second.tools]
    assert (first.ttl_ms, first.cache_scope) == (0, "private")


def test_mcp_narrows_a_search_to_the_agent_s_sources(home: Path) -> None:
    env = {**os.environ, TOKEN_ENV: _token(home, "mcp-public", sources=["/kb/public/**"], peers=["bob"])}

    async def calls(s):
        return (await s.call_tool("search", {"query": "payroll numbers cabinet"}),
                await s.call_tool("search", {"query": "staging server deleted"}),
                await s.call_tool("search", {"query": "x", "peers": ["alice"]}))

    hidden, shown, alice = _mcp(home, calls, env, agent="mcp-public")
    assert all(r["source"].startswith("/kb/public/") for r in hidden.structured_content["results"])
    assert shown.structured_content["results"][0]["source"] == "/kb/public/deploy.md"
    assert alice.is_error and alice.content[0].text.startswith("[agent-scope] ")


# --- kith agent --------------------------------------------------------------------------
def _kith(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*KITH, "--home", str(home), *args], capture_output=True, text=True, timeout=120)


def test_kith_agent_lifecycle_keeps_only_hashes(tmp_path: Path) -> None:
    h = tmp_path / "home"
    init = json.loads(_kith(h, "init", "--json").stdout)
    token = init["agent_token"]
    assert token.startswith("kith_agent_")
    path = h / "agents.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token not in path.read_text()
    listed = json.loads(_kith(h, "agent", "list", "--json").stdout)["agents"]
    assert listed == [{**listed[0], "name": "default", "sources": ["/**"], "peers": ["all"], "queue": True,
                       "outbound": "ask", "until": None, "expired": False}]
    added = json.loads(_kith(h, "agent", "add", "bot", "--sources", "/notes/**", "--peers", "@team",
                             "--until", "7d", "--json").stdout)
    assert added["peers"] == ["@team"] and added["token"] not in path.read_text()
    assert "token" not in _kith(h, "agent", "show", "bot", "--json").stdout
    again = _kith(h, "agent", "add", "bot", "--json")
    assert again.returncode == 1 and "agent-exists" in again.stdout + again.stderr
    bad = _kith(h, "agent", "add", "x", "--outbound", "maybe")
    assert bad.returncode == 2 and "agent-invalid" in bad.stderr
    changed = json.loads(_kith(h, "agent", "set", "bot", "--peers", "none", "--queue", "--json").stdout)
    assert changed["peers"] == ["none"] and changed["queue"] is True
    rotated = json.loads(_kith(h, "agent", "rotate", "bot", "--json").stdout)
    assert rotated["token"] != added["token"] and rotated["token"] not in path.read_text()
    assert json.loads(_kith(h, "agent", "remove", "bot", "--json").stdout) == {"removed": "bot"}
    gone = _kith(h, "agent", "show", "bot")
    assert gone.returncode == 1 and "agent-not-found" in gone.stderr


def test_the_first_command_in_an_older_home_creates_the_default_agent(tmp_path: Path) -> None:
    h = initialized(tmp_path / "older")  # a home made before agents: no agents.json
    out = _kith(h, "agent", "list", "--json")
    assert [a["name"] for a in json.loads(out.stdout)["agents"]] == ["default"]
    assert "kith agent rotate default" in out.stderr
    assert _kith(h, "agent", "list", "--json").stderr == ""  # once


def test_an_older_home_the_user_may_read_but_not_write_is_read_without_its_default_agent(tmp_path: Path) -> None:
    """A home made before agents (no ``agents.json``) that the user may read but not write
    (a chmod; real processes without root's DAC capabilities): every command refused
    ``io-error`` before doing anything, its home lookup making the agent ``default``. The
    reading commands now run and leave the home as it is; a command that writes the agents
    refuses ``io-error`` with its hint."""
    from node.trust.identity import load_or_init_identity
    from support.cli import without_root_reads
    from support.homes import files_of, read_only

    prefix = without_root_reads()
    h = initialized(tmp_path / "older")

    def kith_ro(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, *KITH, "--home", str(h), *args], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    with read_only(h) as before:
        status = kith_ro("status", "--json")
        peers = kith_ro("peers", "list", "--json")
        outbox = kith_ro("outbox", "list", "--json")
        agents = kith_ro("agent", "list", "--json")
        rotate = kith_ro("agent", "rotate", "default", "--json")
        after = files_of(h)
    for r in (status, peers, outbox, agents):
        assert r.returncode == 0 and r.stderr == "", (r.args, r.stdout, r.stderr)
    assert json.loads(status.stdout)["identity"]["key"] == load_or_init_identity(h).public_key
    assert json.loads(peers.stdout) == {"peers": [], "blocked": []}
    assert json.loads(outbox.stdout)["questions"] == [] and json.loads(agents.stdout)["agents"] == []
    assert rotate.returncode == 1, (rotate.stdout, rotate.stderr)
    error = json.loads(rotate.stdout)["error"]
    assert error["code"] == "io-error" and error["hint"] and "Traceback" not in rotate.stderr, error
    assert after == before and not (h / "agents.json").exists()


def test_an_older_home_the_user_may_read_but_not_write_says_why_no_token_works(tmp_path: Path) -> None:
    """A home made before agents (no ``agents.json``) that the user may read but not write
    (a chmod; real processes without root's DAC capabilities) has no agent and cannot get
    one: `kith mcp` refused ``agent-not-found`` (hint `kith agent list`, which lists none)
    and the local API every token ``agent-token-invalid``, its start-up line saying `kith
    agent add NAME` makes one — ways out that fail there. Both now refuse
    ``agents-read-only``, whose hint is a home the user may write; that hint works: once
    writable, `kith agent rotate default` prints a token the doors accept."""
    import signal

    from support.cli import readline, without_root_reads
    from support.homes import files_of, read_only

    prefix = without_root_reads()
    h = initialized(tmp_path / "older")
    env = {**os.environ, TOKEN_ENV: "kith_agent_" + "x" * 43}
    with read_only(h) as before:
        mcp = subprocess.run([*prefix, *KITH, "--home", str(h), "mcp"], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL, env=env)
        proc = subprocess.Popen([*prefix, *KITH, "--home", str(h), "api", "serve", "--port", "0", "--json",
                                 "--offline"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            url = json.loads(readline(proc, 60))["url"]
            refused = httpx.post(url + "/search", json={"query": "x"}, headers=bearer(env[TOKEN_ENV]), timeout=30)
        finally:
            proc.send_signal(signal.SIGINT)
            err = proc.communicate(timeout=30)[1]
        after = files_of(h)
    assert mcp.returncode == 1 and "error [agents-read-only]" in mcp.stderr, mcp.stderr
    assert "chmod -R u+w" in mcp.stderr and "Traceback" not in mcp.stderr, mcp.stderr
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "agents-read-only", refused.text
    assert "read-only for you" in err and "chmod -R u+w" in err and "kith agent add NAME" not in err, err
    assert after == before and not (h / "agents.json").exists()
    rotated = _kith(h, "agent", "rotate", "default", "--json")  # the hint, followed: the home writable again
    assert rotated.returncode == 0, rotated.stderr
    assert authorize(h, json.loads(rotated.stdout)["token"], Operation("connect"), agent="default").agent.name == \
        "default"


def test_mcp_holds_each_dimension_of_a_scope(home: Path) -> None:
    """Peers without the outbox: the outbox tools are refused, verify runs; then the same
    server refuses the agent once it has expired."""
    env = {**os.environ, TOKEN_ENV: _token(home, "mcp-peers", peers=["bob"])}

    async def calls(s):
        out = [await s.call_tool("outbox", {}),
               await s.call_tool("ask_later", {"query": "x", "peers": ["bob"]}),
               await s.call_tool("verify", {"answer": "nope"}),
               await s.call_tool("search", {"query": "x", "peers": ["alice"]}),
               await s.call_tool("search", {"query": "x", "peer": '{"not": "a pinned name"}'})]
        set_agent(home, "mcp-peers", until="2020-01-01T00:00:00Z")
        out.append(await s.call_tool("verify", {"answer": "nope"}))
        return out

    outbox, later, verify, alice, invitation, expired = _mcp(home, calls, env)
    for res in (outbox, later, alice, invitation):
        assert res.is_error and res.content[0].text.startswith("[agent-scope] "), res.content[0].text
    assert verify.is_error and verify.content[0].text.startswith("[answer-invalid] ")  # it ran
    assert expired.is_error and expired.content[0].text.startswith("[agent-expired] ")


def _raw_agent(name: str, token: str, **fields) -> dict:
    import hashlib

    return {"name": name, "tokenSha256": hashlib.sha256(token.encode()).hexdigest(), "sources": [],
            "peers": [], "queue": False, "outbound": "ask", "until": None, **fields}


@pytest.mark.parametrize("fields", [{"queue": "no"}, {"sources": "/kb/public/**"}, {"peers": "all"},
                                    {"until": 12}, {"until": "tomorrow"}, {"tokenSha256": "abc"}])
def test_a_hand_edited_agents_file_with_a_wrong_type_is_refused_not_misread(tmp_path: Path, fields: dict) -> None:
    """``"queue": "no"`` must not grant the outbox, nor ``"sources": "/kb/**"`` become the
    globs '/', 'k', 'b'... (the folder '/' is every source): a value of the wrong type makes
    the whole file ``agents-file-invalid``, on both the API and ``kith agent``."""
    h = initialized(tmp_path / "home")
    token = "kith_agent_" + "x" * 43
    doc = {"format": 1, "agents": [_raw_agent("edited", token, **fields)]}
    (h / "agents.json").write_text(json.dumps(doc))
    os.chmod(h / "agents.json", 0o600)
    with run_api_in_thread(h, offline=True) as url:
        r = HTTP.get(url + "/outbox", headers=bearer(token))
        assert r.status_code == 500 and r.json()["error"]["code"] == "agents-file-invalid", r.text
    out = _kith(h, "agent", "list", "--json")
    assert out.returncode == 1 and "agents-file-invalid" in out.stdout + out.stderr


def test_an_agents_file_other_accounts_may_write_is_refused_and_a_readable_one_tightened(tmp_path: Path) -> None:
    """Another account that can write ``agents.json`` could add its own token's hash: such a
    file is refused (``agents-file-invalid``) by a running server and by ``kith agent``; a
    file only readable by others is made 0600 again (as the identity key is)."""
    h = initialized(tmp_path / "home")
    token = add_agent(h, "bot", sources=["**"])[1]
    path = h / "agents.json"
    with run_api_in_thread(h, offline=True) as url:
        os.chmod(path, 0o666)
        r = HTTP.get(url + "/stats", headers=bearer(token))
        assert r.status_code == 500 and r.json()["error"]["code"] == "agents-file-invalid", r.text
        assert "other accounts" in r.json()["error"]["message"]
        out = _kith(h, "agent", "list")
        assert out.returncode == 1 and "agents-file-invalid" in out.stderr
        os.chmod(path, 0o644)
        assert HTTP.get(url + "/stats", headers=bearer(token)).status_code == 200
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["owner", "outbox", "OWNER"])
def test_an_agent_may_not_take_a_name_the_outbound_log_uses_for_someone_else(tmp_path: Path, name: str) -> None:
    """``kith sent`` records the owner at a terminal as ``owner`` and the outbox's later
    deliveries as ``outbox``: an agent of that name would be indistinguishable from them
    in the log (``kith sent --agent owner``) and would share the owner's held-question ids."""
    h = initialized(tmp_path / "home")
    out = _kith(h, "agent", "add", name, "--sources", "**")
    assert out.returncode == 2 and "agent-invalid" in out.stderr and "reserved" in out.stderr
    assert name not in [a["name"] for a in json.loads(_kith(h, "agent", "list", "--json").stdout)["agents"]]


def _serve_lines(home: Path, n: int) -> list[str]:
    """The first ``n`` stderr lines of a real ``kith api serve --port 0`` (then stopped),
    read as they come (at most 60 s)."""
    import selectors
    import time

    proc = subprocess.Popen([*KITH, "--home", str(home), "api", "serve", "--port", "0", "--offline"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    buf = b""
    deadline = time.monotonic() + 60
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    try:
        while buf.count(b"\n") < n and time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                chunk = os.read(proc.stderr.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
    finally:
        sel.close()
        proc.terminate()
        proc.wait(timeout=60)
    lines = buf.decode().splitlines()[:n]
    return lines + [""] * (n - len(lines))


def test_kith_api_serve_says_which_credential_it_wants(tmp_path: Path) -> None:
    """A new user who starts the API is told, where it says it listens, that requests need
    an agent's bearer token and how to get one — and warned when no agent could use it."""
    h = tmp_path / "home"
    assert _kith(h, "init").returncode == 0
    listening, how = _serve_lines(h, 2)
    assert "listening on http://127.0.0.1:" in listening
    assert "Authorization: Bearer" in how and "kith agent rotate default" in how and "1 agent" in how, how
    remove_agent(h, "default")
    listening, how = _serve_lines(h, 2)
    assert "no agent" in how and "kith agent add NAME" in how, how


def test_kith_mcp_names_the_agent_a_token_belongs_to_and_takes_it_with_a_trailing_newline(home: Path) -> None:
    """A valid token of another agent than the one ``kith mcp`` runs as is named as such
    (with the ``--agent`` to use), not called a token this home never issued; a token
    pasted into a client's config with a trailing newline or spaces works, as the API's
    ``Authorization`` header does."""
    token = _token(home, "reader", sources=["**"])
    env = {**os.environ, TOKEN_ENV: token}
    out = subprocess.run([*KITH, "--home", str(home), "mcp"], capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, timeout=120)
    assert out.returncode == 1 and "agent-token-invalid" in out.stderr
    assert "'reader'" in out.stderr and "kith mcp --agent reader" in out.stderr, out.stderr
    env[TOKEN_ENV] = f" {token}\n"

    async def calls(s):
        return await s.call_tool("search", {"query": "staging server"})

    res = _mcp(home, calls, env, agent="reader")
    assert not res.is_error, res.content[0].text
    assert [r["source"] for r in res.structured_content["results"]] == ["/kb/public/deploy.md"]


def test_kith_agent_add_and_set_warn_of_a_glob_or_peer_that_names_nothing(home: Path) -> None:
    """A typo in ``--sources`` (the agent then silently finds nothing) or a ``--peers`` name
    that is not pinned is kept — the corpus or the registry may catch up — but warned about."""
    for name in ("typo", "fine"):
        if name in load_agents(home):
            remove_agent(home, name)
    typo = _kith(home, "agent", "add", "typo", "--sources", "/kb/pubic/**", "--peers", "alcie")
    assert typo.returncode == 0, typo.stderr
    assert "warning: --sources /kb/pubic/** matches none of the 2 indexed sources" in typo.stderr, typo.stderr
    assert "warning: --peers alcie is not a pinned peer" in typo.stderr, typo.stderr
    fine = _kith(home, "agent", "add", "fine", "--sources", "/kb/public/**", "--peers", "alice")
    assert fine.returncode == 0 and "warning" not in fine.stderr, fine.stderr
    changed = _kith(home, "agent", "set", "fine", "--sources", "/kb/privte/**")
    assert changed.returncode == 0 and "warning: --sources /kb/privte/** matches none" in changed.stderr


def test_kith_agent_add_takes_sources_none_as_set_does(tmp_path: Path) -> None:
    """``--sources none`` is how ``kith agent set`` says "nothing of this node's own"; the
    same words on ``add`` (a peers-only agent, written as the user would) must not be
    refused as a glob."""
    h = initialized(tmp_path / "home")
    out = _kith(h, "agent", "add", "asker", "--sources", "none", "--peers", "all", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["sources"] == []


def test_the_outbox_shows_an_agent_only_questions_to_peers_it_may_ask(home: Path, api: str) -> None:
    """``--queue`` lets an agent read the outbox, not the questions (and the answers) of
    peers outside its ``--peers``: a question kept for bob (by the owner or another agent)
    is neither listed nor shown to an agent that may ask only alice, on both doors."""
    from node.guest.outbox import OutboxStore
    from node.trust.peers import PeerRegistry

    bob_key = PeerRegistry.load(home).by_name("bob").public_key
    alice_key = PeerRegistry.load(home).by_name("alice").public_key
    with OutboxStore(home) as store:
        to_bob = store.add({"query": "what did the payroll audit find", "topK": 5}, [("bob", bob_key)])["id"]
        to_alice = store.add({"query": "when is the staging server rebuilt", "topK": 5}, [("alice", alice_key)])["id"]
    token = _token(home, "alice-queue", peers=["alice"], queue=True)
    listed = HTTP.get(api + "/outbox", headers=bearer(token))
    assert listed.status_code == 200, listed.text
    ids = [q["id"] for q in listed.json()["questions"]]
    assert to_alice in ids and to_bob not in ids
    one = HTTP.get(api + "/outbox", params={"id": to_bob}, headers=bearer(token))
    assert one.status_code == 404 and one.json()["error"]["code"] == "outbox-not-found"
    assert HTTP.get(api + "/outbox", params={"id": to_alice}, headers=bearer(token)).status_code == 200
    everyone = _token(home, "all-queue", peers=["all"], queue=True)
    assert to_bob in [q["id"] for q in HTTP.get(api + "/outbox", headers=bearer(everyone)).json()["questions"]]

    env = {**os.environ, TOKEN_ENV: token}

    async def calls(s):
        return await s.call_tool("outbox", {}), await s.call_tool("outbox", {"id": to_bob})

    listed_mcp, one_mcp = _mcp(home, calls, env, agent="alice-queue")
    ids = [q["id"] for q in listed_mcp.structured_content["questions"]]
    assert to_alice in ids and to_bob not in ids
    assert one_mcp.is_error and one_mcp.content[0].text.startswith("[outbox-not-found] ")


def test_two_authorization_headers_are_refused_whichever_comes_first(home: Path, api: str) -> None:
    """A request carrying two ``Authorization`` headers is ambiguous (a proxy or another
    reader may take the other one): refused 401, not answered with the first one's scope."""
    token = _token(home, "twice", sources=["**"])
    for pair in ((token, "wrong"), ("wrong", token), (token, token)):
        r = HTTP.get(api + "/stats", headers=[("Authorization", f"Bearer {pair[0]}"),
                                              ("Authorization", f"Bearer {pair[1]}")])
        assert r.status_code == 401 and r.json()["error"]["code"] == "agent-token-invalid", (pair, r.text)
        assert "WWW-Authenticate" in r.headers
    assert HTTP.get(api + "/stats", headers=bearer(token)).status_code == 200


def test_kith_agent_add_warns_of_a_group_the_policy_does_not_have(home: Path) -> None:
    """``--peers @tema`` (a typo of @team) grants nothing until such a group exists: kept,
    but warned about like an unpinned name."""
    if "grouped" in load_agents(home):
        remove_agent(home, "grouped")
    out = _kith(home, "agent", "add", "grouped", "--peers", "@tema")
    assert out.returncode == 0, out.stderr
    assert "warning: --peers @tema is not a group" in out.stderr, out.stderr
    assert _kith(home, "peers", "group", "add", "crew", "alice").returncode == 0
    if "crewed" in load_agents(home):
        remove_agent(home, "crewed")
    known = _kith(home, "agent", "add", "crewed", "--peers", "@crew")
    assert known.returncode == 0 and "warning" not in known.stderr, known.stderr


def test_health_counts_only_the_peers_the_agent_may_ask(home: Path, api: str) -> None:
    """``/health``'s ``peers`` says whether ``POST /search`` with ``peers`` can ask someone:
    for an agent, ``"all"`` asks only its peers, so an agent that may ask no one is told
    ``available: false`` (and learns nothing of how many peers the owner pinned)."""
    counts = {}
    for name, peers in (("h-none", []), ("h-alice", ["alice"]), ("h-all", ["all"])):
        r = HTTP.get(api + "/health", headers=bearer(_token(home, name, peers=peers)))
        assert r.status_code == 200, r.text
        counts[name] = r.json()["peers"]
    assert counts == {"h-none": {"available": False, "pinned": 0, "error": None},
                      "h-alice": {"available": True, "pinned": 1, "error": None},
                      "h-all": {"available": True, "pinned": 2, "error": None}}
