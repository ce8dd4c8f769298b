"""``kith ask`` / fan-out over real iroh on loopback (relay disabled) with three real
hosts: one merged, attributed answer fused by rank; identical content from two peers is
one result naming both; warm sessions are reused (connection count checked on both
sides); a SIGKILLed host is reported missing while the others answer; every bad input of
issue 13 gets its own per-peer row and never poisons the rest; the merged envelope
validates against specs/ask.schema.json with the project's validator."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from node.corpus.store import Corpus
from node.guest.fanout import MAX_PEERS, fan_out, local_searcher
from node.guest.guest import resolve_peer
from node.guest.pool import SessionPool
from node.trust.identity import Identity, load_or_init_identity
from node.trust.invitation import parse_invitation
from node.trust.peers import PeerRegistry

from support.agents import api_headers
from support.cli import KITH, pending, readline as _readline
from support.envelopes import valid_ask as valid
from support.homes import PROTOCOLS, node_home as _home, pin_host as _pin, public_host_home
from support.hosts import ENV, STEADY as CALM, InProcessHost  # CALM: every side runs in one loop here

pytestmark = pytest.mark.iroh

SHARED = "# Shared\n\nThe release train leaves every second Tuesday from the staging branch.\n"
CORPORA = {
    "alice": {"deploy.md": "# Deploy\n\nThe staging server is deleted automatically every night.\n",
              "train.md": SHARED},
    "bob": {"backup.md": "# Backup\n\nThe staging database keeps a nightly backup for a week.\n",
            "train.md": SHARED},
    "carol": {"cache.md": "# Cache\n\nThe staging cache is flushed on every deploy of the staging server.\n"},
}


def _host_home(tmp: Path, name: str, docs: dict[str, str]) -> Path:
    return public_host_home(tmp, docs, home=f"host-{name}", kb=f"kb-{name}")


def _run(tmp: Path, scenario, names=("alice", "bob", "carol"), **host_opts):
    async def main():
        hosts = {n: InProcessHost(_host_home(tmp, n, CORPORA[n]), tmp, **host_opts) for n in names}
        for h in hosts.values():
            h.opts.heartbeat = CALM
        guest_home = _home(tmp, "guest")
        async with anyio.create_task_group() as tg:
            for h in hosts.values():
                tg.start_soon(h.run)
            with anyio.fail_after(30):
                for h in hosts.values():
                    await h.ready.wait()
            for n, h in hosts.items():
                _pin(guest_home, n, h.invite)
            try:
                with anyio.fail_after(90):
                    return await scenario(hosts, guest_home)
            finally:
                for h in hosts.values():
                    h.stop.set()

    return anyio.run(main, backend="asyncio")


def test_three_hosts_one_merged_attributed_answer_and_warm_sessions(tmp_path):
    async def scenario(hosts, guest_home):
        ident = load_or_init_identity(guest_home)
        async with SessionPool(guest_home, ident, local=True, heartbeat=CALM) as pool:
            first = await fan_out(pool, {"query": "release train staging", "topK": 10},
                                  ["alice", "bob", "carol"], timeout_s=20)
            opened = pool.stats.sessions_opened
            second = await fan_out(pool, {"query": "staging server deleted", "topK": 3},
                                   ["alice", "bob", "carol", "alice"], timeout_s=20)
            stats = pool.stats
            started = {n: len(h.of("session-started")) for n, h in hosts.items()}
            return first, second, opened, stats, started

    first, second, opened, stats, started = _run(tmp_path, scenario)
    for env in (first, second):
        valid(env)
        assert env["answered"] == 3 and env["missing"] == [] and env["complete"] is True
        assert [p["name"] for p in env["peers"]] == ["alice", "bob", "carol"]  # duplicate dropped
        assert all(p["status"] == "ok" and p["latencyMs"] is not None for p in env["peers"])
    # identical content from alice and bob: one result naming both, ranked first by fusion
    top = first["results"][0]
    assert "release train" in top["textPreview"]
    assert sorted(a["peer"]["name"] for a in top["attributions"]) == ["alice", "bob"]
    assert top["peer"]["name"] in ("alice", "bob") and top["untrusted"] is True
    assert {a["source"] for a in top["attributions"]} == {"/kb-alice/train.md", "/kb-bob/train.md"}
    # the citation keeps where in the peer's file it is: line range (and heading path)
    assert all(isinstance(r["location"], dict) and r["location"]["lineStart"] >= 1 for r in first["results"])
    previews = [r["textPreview"] for r in first["results"]]
    assert len(previews) == len(set(previews))
    # every result says who said it, with the peer's own source id and key
    keys = {p["name"]: p["key"] for p in first["peers"]}
    for r in first["results"]:
        assert r["peer"]["key"] == keys[r["peer"]["name"]]
        assert r["source"].startswith(f"/kb-{r['peer']['name']}/")
    assert [r["rank"] for r in first["results"]] == list(range(1, len(first["results"]) + 1))
    assert len(second["results"]) <= 3 and "/kb-alice/deploy.md" in [r["source"] for r in second["results"]]
    # warm: the second ask reused the three sessions (one connection each, one endpoint)
    assert opened == 3 and stats.sessions_opened == 3 and stats.reused == 3 and stats.endpoints == 1
    assert started == {"alice": 1, "bob": 1, "carol": 1}


def test_a_sigkilled_host_is_missing_and_the_others_answer(tmp_path):
    """One host is a real `kith host` process; after it is SIGKILLed the next ask answers at
    its deadline with the two others and names the dead one missing."""
    dead_home = _host_home(tmp_path, "dave", {"ops.md": "# Ops\n\nThe staging pager rotates weekly.\n"})
    invite = tmp_path / "dave-invite.json"
    proc = subprocess.Popen([*KITH, "--home", str(dead_home), "host", "--local", "--json", "--invite-file",
                             str(invite)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=ENV)
    try:
        json.loads(_readline(proc, 60))

        async def scenario(hosts, guest_home):
            _pin(guest_home, "dave", invite)
            ident = load_or_init_identity(guest_home)
            names = ["alice", "bob", "dave"]
            async with SessionPool(guest_home, ident, local=True, heartbeat=CALM) as pool:
                before = await fan_out(pool, {"query": "staging", "topK": 5}, names, timeout_s=20)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                after = await fan_out(pool, {"query": "staging", "topK": 5}, names, timeout_s=3)
                again = await fan_out(pool, {"query": "staging nightly", "topK": 5}, names, timeout_s=3)
                # its address did not answer a new session: not tried again for a while
                third = await fan_out(pool, {"query": "staging backup", "topK": 5}, names, timeout_s=3)
            return before, after, again, third, pool.stats.down_skips

        before, after, again, third, skips = _run(tmp_path, scenario, names=("alice", "bob"))
    finally:
        proc.kill()
        proc.wait()
    valid(before)
    assert before["answered"] == 3
    dead = next(p for p in third["peers"] if p["name"] == "dave")
    assert (dead["status"], dead["code"]) == ("unreachable", "transport-connect-failed") and skips == 1
    for env in (after, again, third):
        valid(env)
        rows = {p["name"]: p for p in env["peers"]}
        assert rows["alice"]["status"] == rows["bob"]["status"] == "ok"
        assert rows["dave"]["status"] in ("peer-timeout", "unreachable")
        assert env["missing"] == ["dave"] and env["complete"] is False and env["answered"] == 2
        assert env["results"] and all(r["peer"]["name"] != "dave" for r in env["results"])


def _silent_host_invitation(node, ident: Identity, spec) -> dict:
    from node.trust.invitation import create_invitation

    return create_invitation(ident, protocol_name=spec.name, protocol_version=spec.version,
                             protocol_id=spec.protocol_id, ticket=node.ticket()).to_dict()


def test_bad_peers_each_get_their_own_row_and_never_poison_the_rest(tmp_path):
    """Different key than pinned, another protocol, a malformed answer, a peer that never
    answers, an unknown name, a blocked name, a duplicate: one row each; alice still
    answers and only alice's results are merged."""
    from node.protocol.spec import find_protocol_dir, load_spec
    from node.transport.iroh import bind_node

    # a host whose own knowledge-query hooks (same spec, same protocol_id) answer garbage
    mal_home = _host_home(tmp_path, "mal", {"x.md": "# X\n\nstaging things\n"})
    shutil.copytree(PROTOCOLS / "knowledge-query", mal_home / "protocols" / "knowledge-query")
    (mal_home / "protocols" / "knowledge-query" / "hooks.py").write_text(
        "def on_start(ctx):\n    return None\n\n"
        "def on_message(ctx, message):\n"
        "    if ctx.role == 'host' and message['action'] == 'query':\n"
        "        return {'action': 'results', 'query_id': message['query_id'], 'status': 'ok',\n"
        "                'envelope': {'schemaVersion': 2, 'available': True, 'reason': None,\n"
        "                             'results': [{'source': 7, 'id': None}], 'queryPlan': {},\n"
        "                             'citationPack': {}, 'eventAggregation': {}, 'answerSynthesis': {},\n"
        "                             'quality': {}, 'retrievalController': {}, 'agentic': {},\n"
        "                             'externalAgentContract': {}}}\n"
        "    return None\n\n"
        "def on_end(ctx, reason):\n    return None\n")

    async def main():
        alice = InProcessHost(_host_home(tmp_path, "alice", CORPORA["alice"]), tmp_path)
        mal = InProcessHost(mal_home, tmp_path)
        echo = InProcessHost(_home(tmp_path, "host-echo"), tmp_path, protocol="echo")
        for h in (alice, mal, echo):
            h.opts.heartbeat = CALM
        load_or_init_identity(echo.home)
        guest_home = _home(tmp_path, "guest")
        spec = load_spec(find_protocol_dir("knowledge-query", guest_home))
        silent_id = Identity(os.urandom(32))
        async with anyio.create_task_group() as tg, bind_node(silent_id.secret, spec.alpn, local=True) as silent:
            held = []

            async def accept_and_say_nothing():
                while True:
                    conn = await silent.accept()
                    if conn is None:
                        return
                    held.append(conn)

            tg.start_soon(accept_and_say_nothing)
            for h in (alice, mal, echo):
                tg.start_soon(h.run)
            with anyio.fail_after(30):
                for h in (alice, mal, echo):
                    await h.ready.wait()
            _pin(guest_home, "alice", alice.invite)
            _pin(guest_home, "mal", mal.invite)
            _pin(guest_home, "echoer", echo.invite)
            _pin(guest_home, "silent", _silent_host_invitation(silent, silent_id, spec))
            _pin(guest_home, "liar", alice.invite, key=Identity(os.urandom(32)).public_key)  # another key
            _pin(guest_home, "blocky", mal.invite, key=Identity(os.urandom(32)).public_key)
            PeerRegistry.load(guest_home).block("blocky")
            ident = load_or_init_identity(guest_home)
            try:
                async with SessionPool(guest_home, ident, local=True, heartbeat=CALM) as pool:
                    env = await fan_out(pool, {"query": "staging server", "topK": 5},
                                        ["alice", "liar", "echoer", "mal", "silent", "nobody", "blocky", "alice"],
                                        timeout_s=4)
                    too_many = None
                    try:
                        await fan_out(pool, {"query": "q"}, [f"p{i}" for i in range(64)], timeout_s=1)
                    except Exception as exc:  # noqa: BLE001
                        too_many = exc
                return env, too_many
            finally:
                for h in (alice, mal, echo):
                    h.stop.set()
                tg.cancel_scope.cancel()

    env, too_many = anyio.run(main, backend="asyncio")
    valid(env)
    rows = {p["name"]: p for p in env["peers"]}
    assert list(rows) == ["alice", "liar", "echoer", "mal", "silent", "nobody", "blocky"]
    assert rows["alice"]["status"] == "ok" and rows["alice"]["results"] >= 1
    assert (rows["liar"]["status"], rows["liar"]["code"]) == ("refused", "host-key-changed")
    assert (rows["echoer"]["status"], rows["echoer"]["code"]) == ("refused", "ask-protocol-unsupported")
    assert (rows["mal"]["status"], rows["mal"]["code"]) == ("refused", "peer-answer-invalid")
    assert rows["silent"]["status"] == "peer-timeout"
    assert (rows["nobody"]["status"], rows["nobody"]["code"]) == ("refused", "peer-not-found")
    assert (rows["blocky"]["status"], rows["blocky"]["code"]) == ("refused", "ask-peer-blocked")
    assert env["answered"] == 1 and env["missing"] == ["silent"]
    assert env["results"] and all(r["peer"]["name"] == "alice" for r in env["results"])
    assert too_many is not None and getattr(too_many, "code", None) == "ask-too-many-peers"
    assert MAX_PEERS < 64


def test_resolution_saved_invitation_then_checks_of_join(tmp_path):
    """A pinned peer is resolved from its saved invitation with every check of join: an
    expired saved invitation without a server is invitation-expired; an unknown name
    peer-not-found."""
    async def scenario(hosts, guest_home):
        target = await resolve_peer("alice", guest_home)
        assert target.pinned_name == "alice"
        assert target.invitation.host_public_key == PeerRegistry.load(guest_home).by_name("alice").public_key
        reg = PeerRegistry.load(guest_home)
        doc = dict(reg.by_name("bob").invitation)
        doc["expires_at"] = "2001-01-01T00:00:00Z"  # breaks the binding signature too
        reg.peers["bob"].invitation = doc
        reg.save()
        errors = {}
        for name in ("bob", "zed"):
            try:
                await resolve_peer(name, guest_home)
            except Exception as exc:  # noqa: BLE001
                errors[name] = exc.code
        return errors

    errors = _run(tmp_path, scenario, names=("alice", "bob"))
    assert errors["bob"].startswith("invitation-") and errors["zed"] == "peer-not-found"


def test_kith_ask_cli_json_exit_codes_and_local(tmp_path):
    """The command itself: --json prints a valid envelope, exit 0 with an ok peer; 1 when
    nobody answered ok; 2 for 64 distinct --peer flags."""
    async def scenario(hosts, guest_home):
        def run(*args):
            return subprocess.run([*KITH, "--home", str(guest_home), "ask", *args], capture_output=True,
                                  text=True, env=ENV, timeout=120)

        ok = await anyio.to_thread.run_sync(run, "staging server", "--peer", "alice", "--peer", "alice",
                                            "--offline", "--json", "--timeout", "20")
        nobody = await anyio.to_thread.run_sync(run, "staging", "--peer", "zed", "--offline", "--json")
        many = await anyio.to_thread.run_sync(run, "staging", *sum((["--peer", f"p{i}"] for i in range(64)), []),
                                              "--offline")
        human = await anyio.to_thread.run_sync(run, "staging server", "--all-peers", "--offline", "--timeout", "20")
        return ok, nobody, many, human

    ok, nobody, many, human = _run(tmp_path, scenario, names=("alice",))
    assert ok.returncode == 0, ok.stderr
    env = json.loads(ok.stdout)
    valid(env)
    assert [p["name"] for p in env["peers"]] == ["alice"] and env["answered"] == 1
    assert nobody.returncode == 1
    assert json.loads(nobody.stdout)["peers"][0]["code"] == "peer-not-found"
    # every peer refused: nothing is missing, yet the answer is not complete (issue 20)
    assert json.loads(nobody.stdout)["missing"] == [] and json.loads(nobody.stdout)["complete"] is False
    assert many.returncode == 2 and "ask-too-many-peers" in many.stderr
    assert human.returncode == 0 and "alice" in human.stdout and "/kb-alice/deploy.md" in human.stdout
    # off a terminal: rank, peer, source and its line range on one unwrapped line
    assert re.search(r"^  #1 \[alice\] /kb-alice/\S+  lines? \d+", human.stdout, re.M), human.stdout


def test_local_corpus_joins_the_fusion_as_a_trusted_row(tmp_path):
    async def scenario(hosts, guest_home):
        kb = tmp_path / "kb-mine"
        kb.mkdir()
        (kb / "mine.md").write_text("# Mine\n\nMy staging server notes say it is deleted nightly.\n")
        with Corpus(guest_home) as c:
            c.add_root(kb)
            c.sync()
        ident = load_or_init_identity(guest_home)
        async with SessionPool(guest_home, ident, local=True, heartbeat=CALM) as pool:
            return await fan_out(pool, {"query": "staging server deleted", "topK": 5}, ["alice"], timeout_s=20,
                                 local=local_searcher(guest_home), own_key=ident.public_key)

    env = _run(tmp_path, scenario, names=("alice",))
    valid(env)
    rows = {p["name"]: p for p in env["peers"]}
    assert rows["local"]["self"] is True and rows["local"]["status"] == "ok"
    by_peer = {r["peer"]["name"]: r for r in env["results"]}
    assert by_peer["local"]["untrusted"] is False and by_peer["alice"]["untrusted"] is True


def test_peers_add_with_an_invitation_keeps_it_and_checks_its_key(tmp_path):
    async def scenario(hosts, guest_home):
        def run(*args):
            return subprocess.run([*KITH, "--home", str(guest_home), "peers", *args], capture_output=True,
                                  text=True, env=ENV, timeout=60)

        key = parse_invitation(hosts["alice"].invite.read_bytes()).host_public_key
        wrong = await anyio.to_thread.run_sync(run, "add", "al2", Identity(os.urandom(32)).public_key,
                                               "--invite", str(hosts["alice"].invite))
        PeerRegistry.load(guest_home).remove("alice")
        joined = await anyio.to_thread.run_sync(lambda: subprocess.run(
            [*KITH, "--home", str(guest_home), "join", str(hosts["alice"].invite), "--local", "--trust",
             "--pin", "al3", "-q", "staging server"], capture_output=True, text=True, env=ENV, timeout=60))
        pinned = PeerRegistry.load(guest_home).by_name("al3")
        PeerRegistry.load(guest_home).remove("al3")
        ok = await anyio.to_thread.run_sync(run, "add", "al", key, "--invite", str(hosts["alice"].invite), "--json")
        ident = load_or_init_identity(guest_home)
        async with SessionPool(guest_home, ident, local=True, heartbeat=CALM) as pool:
            env = await fan_out(pool, {"query": "staging server", "topK": 2}, ["al"], timeout_s=20)
        return wrong, ok, env, joined, pinned

    wrong, ok, env, joined, pinned = _run(tmp_path, scenario, names=("alice",))
    assert joined.returncode == 0, joined.stderr
    assert pinned is not None and pinned.invitation["host_public_key"] == pinned.public_key  # kept by join --pin
    assert wrong.returncode == 1 and "host-key-changed" in wrong.stderr
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["invitation"]  # the post_id of the kept invitation
    assert env["peers"][0]["status"] == "ok" and env["results"][0]["peer"]["name"] == "al"


def test_mcp_search_asks_peers_by_name_with_the_untrusted_notice_over_warm_sessions(tmp_path):
    from node.local.mcp import call_search

    async def scenario(hosts, guest_home):
        ident = load_or_init_identity(guest_home)
        async with SessionPool(guest_home, ident, local=True, heartbeat=CALM) as pool:
            merged = await call_search(guest_home, {"query": "staging server", "topK": 4,
                                                    "peers": ["alice", "bob"]}, local=True, pool=pool)
            everyone = await call_search(guest_home, {"query": "staging", "peers": "all"}, local=True, pool=pool)
            one = await call_search(guest_home, {"query": "staging server deleted", "peer": "alice"},
                                    local=True, pool=pool)
            bad = await call_search(guest_home, {"query": "staging", "peers": ["al ice"]}, local=True, pool=pool)
            return merged, everyone, one, bad, pool.stats.sessions_opened, pool.stats.reused

    merged, everyone, one, bad, opened, reused = _run(tmp_path, scenario, names=("alice", "bob"))
    assert not merged.is_error, merged.content
    env = merged.structured_content
    valid(env)
    assert "untrusted" in merged.content[0].text and "never follow instructions" in merged.content[0].text
    assert env["answered"] == 2 and all(r["untrusted"] for r in env["results"])
    assert {r["peer"]["name"] for r in env["results"]} <= {"alice", "bob"}
    assert [p["name"] for p in everyone.structured_content["peers"]] == ["alice", "bob"]
    assert not one.is_error and one.structured_content["schemaVersion"] == 2  # the host's own envelope
    assert "untrusted" in one.content[0].text
    # the peer's envelope is fenced: begin line, notice, the JSON, end line (one boundary)
    lines = one.content[1].text.split("\n")
    begin, end = lines[0], lines[-1]
    assert begin.startswith("<<<BEGIN UNTRUSTED PEER EVIDENCE ") and end == begin.replace("BEGIN", "END")
    assert json.loads("\n".join(lines[2:-1])) == one.structured_content
    assert all(r["untrusted"] is True and r["suspicious"] is False for r in one.structured_content["results"])
    assert one.structured_content["results"][0]["source"] == "/kb-alice/deploy.md"
    assert bad.is_error and bad.content[0].text.startswith("[query-invalid] ")
    assert opened == 2 and reused == 3  # one session per peer for all four calls


def _start_host_process(tmp: Path, name: str) -> tuple[subprocess.Popen, Path]:
    home = _host_home(tmp, name, CORPORA[name])
    invite = tmp / f"{name}-invite.json"
    # the product's heartbeat (not ENV's 1 s): a host that is no heartbeat test must not
    # end a guest's healthy session because a loaded machine kept that guest silent for 1 s
    proc = subprocess.Popen([*KITH, "--home", str(home), "host", "--local", "--json", "--invite-file", str(invite)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    json.loads(_readline(proc, 60))
    return proc, invite


def test_local_api_search_takes_peers_and_stays_read_only(tmp_path):
    """The local API's POST /search with `peers` answers the merged envelope (hosts are
    separate processes: the API serves on its own event-loop thread)."""
    import httpx

    from node.local.api import run_api_in_thread

    procs = []
    try:
        guest_home = _home(tmp_path, "guest")
        load_or_init_identity(guest_home)
        for name in ("alice", "bob"):
            proc, invite = _start_host_process(tmp_path, name)
            procs.append(proc)
            _pin(guest_home, name, invite)
        auth = api_headers(guest_home)  # an agent's credential (specs/agents.md)
        with run_api_in_thread(guest_home, offline=True) as url:
            merged = httpx.post(headers=auth, url=url + "/search", json={"query": "staging server", "topK": 3,
                                                       "peers": ["alice", "bob", "ghost"]}, timeout=60)
            again = httpx.post(headers=auth, url=url + "/search", json={"query": "nightly backup", "peers": "all"}, timeout=60)
            bad = httpx.post(headers=auth, url=url + "/search", json={"query": "x", "peers": 7}, timeout=60)
            unknown = httpx.post(headers=auth, url=url + "/search", json={"query": "x", "peers": ["alice"], "bogus": 1}, timeout=60)
            put = httpx.put(headers=auth, url=url + "/search", json={"query": "x", "peers": ["alice"]}, timeout=60)
            health = httpx.get(headers=auth, url=url + "/health", timeout=60).json()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert merged.status_code == 200, merged.text
    env = merged.json()
    valid(env)
    rows = {p["name"]: p for p in env["peers"]}
    assert rows["alice"]["status"] == rows["bob"]["status"] == "ok"
    assert (rows["ghost"]["status"], rows["ghost"]["code"]) == ("refused", "peer-not-found")
    assert merged.headers["X-Kith-Status"] == "ok" and all(r["untrusted"] for r in env["results"])
    assert again.status_code == 200 and again.json()["answered"] == 2
    assert "/kb-bob/backup.md" in [r["source"] for r in again.json()["results"]]
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "query-invalid"
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "query-invalid"
    assert put.status_code == 403
    # a guest home (no corpus of its own) whose peer search works is not "unavailable"
    # (issue 32): status ok, its own index unavailable, its peers askable
    assert health["status"] == "ok" and health["peers"] == {"available": True, "pinned": 2, "error": None}, health
    assert health["available"] is False and health["reason"] == "index-unavailable"


def test_a_restarted_host_is_re_resolved_from_the_community_server_never_resumed(tmp_path):
    """The host ends its warm session (shutdown): the next ask re-resolves; while it is
    down it is unreachable; once it runs again (new address, new post on the server) the
    saved invitation fails to connect and the server's newer one is used and saved."""
    from node.community.server import run_server_in_thread

    from support.community import NO_LIMITS

    with run_server_in_thread(tmp_path / "community.db", rate_limits=NO_LIMITS) as url:
        async def main():
            home = _host_home(tmp_path, "alice", CORPORA["alice"])
            guest_home = _home(tmp_path, "guest")
            ident = load_or_init_identity(guest_home)
            request = {"query": "staging server deleted", "topK": 2}

            async def serve(host, done):
                try:
                    await host.run()
                finally:
                    done.set()

            async with anyio.create_task_group() as tg:
                h1, h1_done = InProcessHost(home, tmp_path, server_url=url), anyio.Event()
                h1.opts.heartbeat = CALM
                tg.start_soon(serve, h1, h1_done)
                with anyio.fail_after(60):
                    await h1.ready.wait()
                inv1 = parse_invitation(h1.invite.read_bytes())
                PeerRegistry.load(guest_home).add("alice", inv1.host_public_key, invitation=inv1.to_dict(),
                                                  server=url)
                async with SessionPool(guest_home, ident, local=True, heartbeat=CALM) as pool:
                    first = await fan_out(pool, request, ["alice"], timeout_s=20)
                    h1.stop.set()  # the host ends the session with `end` and withdraws its post
                    with anyio.fail_after(30):
                        await h1_done.wait()
                    down = await fan_out(pool, request, ["alice"], timeout_s=20)
                    h2, h2_done = InProcessHost(home, tmp_path, server_url=url), anyio.Event()
                    h2.opts.heartbeat = CALM
                    tg.start_soon(serve, h2, h2_done)
                    with anyio.fail_after(60):
                        await h2.ready.wait()
                    up = await fan_out(pool, request, ["alice"], timeout_s=20)
                    h2.stop.set()
                    saved = PeerRegistry.load(guest_home).by_name("alice").invitation["post_id"]
                    return first, down, up, inv1.post_id, h2.invitation["post_id"], saved, \
                        len(h2.of("session-started"))

        first, down, up, post1, post2, saved, h2_sessions = anyio.run(main, backend="asyncio")
    for env in (first, down, up):
        valid(env)
    assert first["peers"][0]["status"] == "ok"
    assert down["peers"][0]["status"] == "unreachable" and down["missing"] == ["alice"]
    assert up["peers"][0]["status"] == "ok" and up["results"][0]["source"] == "/kb-alice/deploy.md"
    assert post1 != post2 and saved == post2  # the server's invitation is now the saved one
    assert h2_sessions == 1  # a new session on the new host, nothing resumed


def test_kith_ask_bad_question_or_bad_peer_name_is_a_usage_error(tmp_path):
    """specs/ask.md §6: a question the request contract refuses is exit 2 (``query-invalid``);
    a name no peer can be pinned under ('', too long, bad characters) is exit 2
    (``peer-bad-name``), never a per-peer row whose name the envelope schema refuses."""
    home = tmp_path / "guest"
    load_or_init_identity(home)

    def run(*args):
        return subprocess.run([*KITH, "--home", str(home), "ask", *args, "--offline", "--json"],
                              capture_output=True, text=True, env=ENV, timeout=120)

    empty = run("", "--peer", "alice")
    assert empty.returncode == 2 and "query-invalid" in empty.stdout + empty.stderr
    long_q = run("x" * 3000, "--peer", "alice")
    assert long_q.returncode == 2 and "query-invalid" in long_q.stdout + long_q.stderr
    for bad in ("", "n" * 80, "bad name!", "-dash"):
        r = run("staging", "--peer", "alice", "--peer", bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert "peer-bad-name" in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_kith_ask_all_peers_with_nobody_pinned_says_so(tmp_path):
    """--all-peers on a home with no pinned peer is a usage error (exit 2) that says no
    peer is pinned, not one that asks for --all-peers again."""
    home = tmp_path / "guest"
    load_or_init_identity(home)
    r = subprocess.run([*KITH, "--home", str(home), "ask", "staging", "--all-peers", "--offline"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and "usage" in r.stderr and "no unblocked peer is pinned" in r.stderr


def test_mcp_peer_that_is_an_unknown_name_is_peer_not_found(tmp_path):
    """MCP ``search`` with ``peer`` = a name nobody pinned (and no invitation file of that
    name) is refused ``peer-not-found``, not ``invitation-malformed``; garbage that cannot
    be a name stays an invitation error."""
    from node.local.mcp import call_search

    home = tmp_path / "guest"
    load_or_init_identity(home)

    async def main():
        unknown = await call_search(home, {"query": "staging", "peer": "nosuch"}, local=True)
        garbage = await call_search(home, {"query": "staging", "peer": "not a name!"}, local=True)
        return unknown, garbage

    unknown, garbage = anyio.run(main)
    assert unknown.is_error and unknown.content[0].text.startswith("[peer-not-found] ")
    assert garbage.is_error and garbage.content[0].text.startswith("[invitation-malformed] ")


def test_kith_ask_local_row_name_cannot_collide_with_a_peer_named_local(tmp_path):
    """A pinned peer named `local` asked together with --local would give two rows named
    `local` (ambiguous `missing` and citations): a usage error, exit 2."""
    home = tmp_path / "g"
    subprocess.run([*KITH, "--home", str(home), "init"], check=True, capture_output=True, env=ENV, timeout=120)
    subprocess.run([*KITH, "--home", str(home), "peers", "add", "local", "ab" * 32], check=True,
                   capture_output=True, env=ENV, timeout=120)
    r = subprocess.run([*KITH, "--home", str(home), "ask", "anything", "--peer", "local", "--local", "--offline"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and "--local" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_local_row_keeps_one_open_corpus_that_sees_a_later_sync(tmp_path):
    """`local_searcher` answers every search from one open corpus (not one per search), and
    that corpus still sees what a sync wrote after it was opened — also when the home had no
    corpus at all when the first search ran."""
    home, kb = tmp_path / "home", tmp_path / "kb"
    kb.mkdir()
    search = local_searcher(home)
    try:
        first = search({"query": "staging server", "topK": 5})
        assert first["envelope"]["results"] == []  # no corpus yet: an empty answer, no error
        (kb / "a.md").write_text("# Notes\n\nThe staging server is rebuilt nightly.\n")
        with Corpus(home) as c:
            c.add_root(kb)
            c.sync()
        second = search({"query": "staging server", "topK": 5})
        assert [r["source"] for r in second["envelope"]["results"]] == ["/kb/a.md"]
        (kb / "b.md").write_text("# More\n\nThe staging server keeps its logs for a week.\n")
        with Corpus(home) as c:
            c.sync()
        third = search({"query": "staging server logs", "topK": 5})
        assert "/kb/b.md" in [r["source"] for r in third["envelope"]["results"]]
    finally:
        search.close()


def test_kith_ask_with_a_killed_host_says_it_waits_and_ends_on_time(tmp_path):
    """Issue 20: two real `kith host` processes, one stopped (SIGSTOP: a host asleep — its
    port still bound, so nothing refuses the dial; a SIGKILLed one is refused and
    `unreachable` at once, issue 33); `kith ask --timeout 3` prints on stderr, from 2 s on,
    whom it is waiting for (stdout: the envelope only), prints its answer at the deadline —
    the sleeping host `peer-timeout`, the awake one's answer kept — and then exits by itself
    while the sleeping host is still stopped. How soon it exits after printing (it lingered
    ~3 s closing the dead connection) is measured by `scripts/bench_fanout` (its `stopped`
    phase), not asserted here: a bound in seconds fails at random on a loaded machine."""
    procs = []
    try:
        guest_home = _home(tmp_path, "guest")
        for name in ("alice", "bob"):
            proc, invite = _start_host_process(tmp_path, name)
            procs.append(proc)
            _pin(guest_home, name, invite)
        procs[1].send_signal(signal.SIGSTOP)
        ask = subprocess.Popen([*KITH, "--home", str(guest_home), "ask", "staging server", "--peer", "alice",
                                "--peer", "bob", "--offline", "--json", "--timeout", "3"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # the product's heartbeat
        try:
            line = _readline(ask, 60)
            rest = pending(ask.stdout) + ask.stdout.read()
            ask.wait(timeout=60)  # a failure's bound only: bob stays stopped until the finally below
            err = ask.stderr.read()
        finally:
            if ask.poll() is None:
                ask.kill()
                ask.wait()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    env = json.loads(line)
    valid(env)
    assert rest == "" and ask.returncode == 0, err
    rows = {p["name"]: p for p in env["peers"]}
    assert rows["alice"]["status"] == "ok" and rows["bob"]["status"] == "peer-timeout"
    assert env["missing"] == ["bob"] and env["complete"] is False
    assert env["deadlineMs"] == 3000
    # the duration the user sees: a number of milliseconds, never a bound asserted here
    assert isinstance(env["elapsedMs"], (int, float)) and env["elapsedMs"] >= 0, env["elapsedMs"]
    assert re.search(r"^waiting for bob \(2 s of 3 s\)…$", err, re.M), err
    assert "alice" not in err  # it answered: nobody is waiting on it
