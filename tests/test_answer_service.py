"""One answer service behind every entry point (issue 9, item 1): the same requests sent
through a peer's ``query`` (engine over the in-memory pipe, the knowledge-query hooks,
``ctx.knowledge``), ``kith search --json``, the local API over real HTTP on 127.0.0.1 and
the MCP tool function get the same answers; and one source id everywhere for a file whose
name is stored decomposed (NFD)."""

from __future__ import annotations

import functools
import json
import os
import unicodedata
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import typer
from typer.testing import CliRunner

from support.agents import api_headers
from support.homes import indexed_docs, initialized, public_host_home
from node.answer.service import answer_local
from node.cli import main as cli_main
from node.cli.index_cmd import search_cmd
from node.corpus.store import Corpus
from node.engine.session import GuestConfig, HostConfig, SessionEngine, SessionReady
from node.local.api import run_api_in_thread
from node.local.mcp import call_search
from node.protocol.spec import load_spec
from node.runtime.driver import run_session
from node.runtime.hooks import HookContext, PeerInfo, load_hooks
from node.host.host import open_knowledge
from node.transport.memory import memory_pipe
from node.trust.identity import Identity

KQ = Path(__file__).resolve().parents[1] / "protocols" / "knowledge-query"
NFD_NAME = unicodedata.normalize("NFD", "café-menu.md")
NFC_ID = unicodedata.normalize("NFC", "/kb/café-menu.md")
POST = "answer-service-post"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("answers")
    root = base / "kb"
    root.mkdir()
    (root / "deploy.md").write_text("# Deploy\n\nThe staging server is deleted automatically "
                                    "every night.\n\n## Rollback\n\nRun deploy.sh to restore "
                                    "the staging server.\n")
    (root / "notes.txt").write_text("Temporary directories are removed on exit. The staging "
                                    "area is kept.\n")
    (root / NFD_NAME).write_text("The cafe menu lists espresso and the staging kitchen.\n")
    home = base / "home"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
    (home / "policy.toml").write_text('[[rule]]\nglob = "/kb/**"\ntier = "public"\n')
    os.chmod(home / "policy.toml", 0o600)
    return home


def _peer(home: Path, request: dict[str, Any]) -> dict[str, Any]:
    """One knowledge-query session over the memory pipe; the ``results`` message."""
    spec, hooks = load_spec(KQ), load_hooks(KQ)
    knowledge = open_knowledge(home, lambda _m: None)
    host_id, guest_id = Identity(os.urandom(32)), Identity(os.urandom(32))
    got: list[dict[str, Any]] = []
    options = {"queries": [request["query"]], "topK": request.get("topK", 5),
               "filters": {k: v for k, v in request.items() if k not in ("query", "topK")},
               "on_results": got.append}
    seen: set[str] = set()

    def unseen(nonce: str) -> bool:
        ok = nonce not in seen
        seen.add(nonce)
        return ok

    host = SessionEngine("host", spec, public_key=host_id.public_key, sign=host_id.sign,
                         host=HostConfig(remote_id=guest_id.public_key,
                                         post_protocol={POST: spec.protocol_id}.get,
                                         nonce_unseen=unseen),
                         egress_check=knowledge.egress_check)
    guest = SessionEngine("guest", spec, public_key=guest_id.public_key, sign=guest_id.sign,
                          guest=GuestConfig(remote_id=host_id.public_key, post_id=POST,
                                            host_public_key=host_id.public_key))

    def ctx(role: str):
        def make(ev: SessionReady) -> HookContext:
            return HookContext(role=role, session_id=ev.session_id, peer=PeerInfo(ev.peer_public_key),
                               options=options if role == "guest" else {},
                               knowledge=knowledge.handle_for(None, ev.peer_public_key)
                               if role == "host" else None)
        return make

    async def main() -> None:
        g, h = memory_pipe(guest_id.public_key, host_id.public_key)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(run_session, h, host, hooks, make_context=ctx("host")))
                await run_session(g, guest, hooks, make_context=ctx("guest"))

    try:
        anyio.run(main)
    finally:
        knowledge.close()
    assert len(got) == 1
    return got[0]


def _cli(home: Path, request: dict[str, Any]) -> dict[str, Any]:
    app = typer.Typer()
    app.callback()(cli_main._root)  # the real --home callback
    app.command("search")(search_cmd)
    args = ["--home", str(initialized(home)), "search", request["query"], "--json",
            "--top-k", str(request.get("topK", 5)), "--dedupe", request.get("dedupe", "chunk")]
    if "remainingBudgetMs" in request:
        args += ["--budget-ms", str(request["remainingBudgetMs"])]
    for glob in request.get("sources", []):
        args += ["--source", glob]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _mcp(home: Path, request: dict[str, Any]) -> dict[str, Any]:
    result = anyio.run(call_search, home, dict(request))
    assert not result.is_error
    return result.structured_content


REQUESTS = [
    {"query": "staging server", "topK": 3},
    {"query": "staging", "topK": 5, "dedupe": "document"},
    {"query": "staging", "topK": 5, "sources": ["/kb/*.md"]},
    {"query": "espresso menu", "topK": 2, "sources": [NFC_ID]},
    {"query": "zzqqx nothing like this", "topK": 5},
    {"query": "staging server", "topK": 3, "remainingBudgetMs": 0},
]


def _comparable(env: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(env))
    out.pop("externalAgentContract")  # names the local API's routes; same object everywhere
    # the one difference a peer sees: never the document's bare hash (specs/citations.md §2)
    for r in out["results"]:
        r["provenance"]["contentHash"] = ""
    for c in out["citationPack"]["citations"]:
        c["provenance"]["contentHash"] = ""
    return out


def test_every_entry_point_gives_the_same_answer(home: Path) -> None:
    from node.answer.contract import core_schema

    auth = api_headers(home)  # an agent's credential (specs/agents.md)
    with run_api_in_thread(home) as url:
        for request in REQUESTS:
            assert set(request) <= set(core_schema()["properties"])
            api = httpx.post(headers=auth, url=url + "/search", json=request)
            assert api.status_code == 200
            envelopes = {"api": api.json(), "cli": _cli(home, request), "mcp": _mcp(home, request)}
            peer = _peer(home, request)
            envelopes["peer"] = peer["envelope"]
            assert all(r["provenance"]["contentHash"] == "" for r in peer["envelope"]["results"])
            status = api.headers["x-kith-status"]
            assert peer["status"] == status, request
            first = _comparable(envelopes["api"])
            for name, env in envelopes.items():
                assert _comparable(env) == first, (name, request)
            if request["query"].startswith("zz"):
                assert status == "no-verified-results"
            elif request.get("remainingBudgetMs") == 0:
                assert status == "budget-exhausted"
            else:
                assert status == "ok" and first["results"], request
            if request.get("dedupe") == "document":
                sources = [r["source"] for r in first["results"]]
                assert len(sources) == len(set(sources))


def test_refused_the_same_way_everywhere(home: Path) -> None:
    """A request over a limit: the local entry points answer invalid-request; the peer's
    engine refuses the message against the same schema before any hook runs."""
    request = {"query": "staging", "tags": [f"t{i}" for i in range(40)]}
    local = answer_local(Corpus(home, readonly=True), request)
    assert local["status"] == "invalid-request" and local["error"]["code"] == "query-invalid"
    result = anyio.run(call_search, home, dict(request))
    assert result.is_error and "[query-invalid]" in result.content[0].text
    auth = api_headers(home)  # an agent's credential (specs/agents.md)
    with run_api_in_thread(home) as url:
        assert httpx.post(headers=auth, url=url + "/search", json=request).status_code == 400
    spec = load_spec(KQ)
    assert not spec.messages["query"].validator.is_valid(
        {"action": "query", "query_id": "q1", **request})


def test_one_source_id_for_a_decomposed_file_name(home: Path) -> None:
    with Corpus(home, readonly=True) as corpus:
        listed = [r[0] for r in corpus.record.db.execute("SELECT source_id FROM documents")]
        local = answer_local(corpus, {"query": "espresso", "topK": 3})
    assert NFC_ID in listed and unicodedata.normalize("NFD", NFC_ID) not in listed
    assert [r["source"] for r in local["envelope"]["results"]] == [NFC_ID]
    peer = _peer(home, {"query": "espresso", "topK": 3, "sources": [NFC_ID]})
    assert [r["source"] for r in peer["envelope"]["results"]] == [NFC_ID]


def test_an_old_decomposed_id_is_replaced_at_the_next_sync(tmp_path: Path, monkeypatch) -> None:
    from node.corpus import ingest

    root = tmp_path / "kb"
    root.mkdir()
    (root / NFD_NAME).write_text("espresso\n")
    home = tmp_path / "home"
    with Corpus(home) as c:
        c.add_root(root)
        with monkeypatch.context() as m:  # an index written before source ids were NFC
            m.setattr(ingest, "source_id_of", lambda prefix, rel: f"/{prefix}/{rel}")
            c.sync()
        before = [r[0] for r in c.record.db.execute("SELECT source_id FROM documents")]
        c.sync()
        ids = [r[0] for r in c.record.db.execute("SELECT source_id FROM documents")]
        found = answer_local(c, {"query": "espresso"})["envelope"]["results"]
    assert before == [unicodedata.normalize("NFD", NFC_ID)]
    assert ids == [NFC_ID] and [r["source"] for r in found] == [NFC_ID]


def test_a_peer_lens_follows_the_gate_and_is_one_value_per_key(home: Path) -> None:
    """The lens a peer's search is ranked on: the gate's decision per source, one frozen
    value per (policy stamp, peer, generation) — the same lens for every key of one peer
    name, another for another peer — and immutable."""
    from node.answer.service import PeerView
    from node.corpus.lens import Lens

    knowledge = open_knowledge(home, lambda _m: None)
    try:
        service = knowledge.service
        policy = service._gate.current_policy()
        lens = service.lens_for(PeerView(None), policy)
        assert isinstance(lens, Lens)
        assert service.lens_for(PeerView(None, "ab" * 32), policy) is lens
        assert service.lens_for(PeerView("alice"), policy).key != lens.key
        assert lens.sees("/kb/deploy.md") and lens.sees(NFC_ID)
        assert not lens.sees("/elsewhere/x.md") and not lens.sees("/kb/../etc/passwd")
        with pytest.raises(AttributeError):
            lens.visible = frozenset()  # type: ignore[misc]
    finally:
        knowledge.close()


def test_a_peer_whose_best_matches_wait_for_approval_still_gets_top_k(tmp_path: Path) -> None:
    """A peer's search asks for ``topK`` hits; when the gate holds some back (``ask``
    sources nobody decided yet), the view is searched deeper, so the peer still sees
    ``topK`` results it may see beside the pending status."""
    from node.answer.service import peer_knowledge
    from node.policy.gate import EgressGate
    from node.policy.store import Policy

    root = tmp_path / "kb"
    (root / "ask").mkdir(parents=True)
    (root / "pub").mkdir()
    for i in range(6):  # the strongest matches, all waiting for approval
        (root / "ask" / f"a{i}.md").write_text(f"# Otter {i}\n\notter otter otter otter\n")
    for i in range(14):
        (root / "pub" / f"p{i}.md").write_text(
            f"# Note {i}\n\nAn otter was seen near the river bank on day {i} of the survey.\n")
    with Corpus(tmp_path / "home") as corpus:
        corpus.add_root(root)
        corpus.sync()
        prefix = corpus.roots()[0].prefix
        policy = Policy()
        policy.set(f"/{prefix}/**", "public")
        policy.set(f"/{prefix}/ask/**", "ask")
        gate = EgressGate(corpus.roots(), policy, tmp_path / "home")
        answer = peer_knowledge(corpus, gate, None).search({"query": "otter", "topK": 10})
        owner = [h.source_id for h in corpus.search_hits("otter", limit=10)[0]]
    assert all("/ask/" in s for s in owner[:6])  # the held-back sources rank first
    assert answer["status"] == "pending-approval"
    shown = [r["source"] for r in answer["envelope"]["results"]]
    assert len(shown) == 10 and all("/pub/" in s for s in shown)


def test_a_warm_plain_query_is_answered_on_the_event_loop_with_the_same_answer(tmp_path: Path) -> None:
    """issue 31 item 1: the knowledge-query host answers a query on the event loop (no
    worker thread) once the peer's view answered cheaply at the same corpus generation and
    policy; the first answer, a filtered request, and the first answer after a policy
    change or a sync go to the hook threads — and every answer is the same either way."""
    import threading

    home = public_host_home(tmp_path, {"a.md": "# Staging\n\nThe staging server is rebuilt every night.\n"},
                            home="home")
    root = tmp_path / "kb"
    spec, hooks = load_spec(KQ), load_hooks(KQ)
    knowledge = open_knowledge(home, lambda _m: None)
    handle = knowledge.handle_for(None, "c" * 64)
    where: list[bool] = []  # True: answered on the event loop's thread
    real = handle.search
    on_message = hooks.on_message

    class Spy:  # the real handle; records the thread each search ran in
        def __getattr__(self, name: str) -> Any:
            return getattr(handle, name)

        def search(self, request: Any) -> Any:
            where.append(threading.current_thread() is threading.main_thread())
            return real(request)

    queries = ["staging server", "staging server", {"query": "staging server", "sources": ["/kb/**"]},
               "staging server"]
    got: list[dict[str, Any]] = []

    def session() -> None:
        host_id, guest_id = Identity(os.urandom(32)), Identity(os.urandom(32))
        options = {"queries": list(queries), "topK": 3, "on_results": got.append}
        host = SessionEngine("host", spec, public_key=host_id.public_key, sign=host_id.sign,
                             host=HostConfig(remote_id=guest_id.public_key, post_protocol={POST: spec.protocol_id}.get,
                                             nonce_unseen=lambda _n: True), egress_check=knowledge.egress_check)
        guest = SessionEngine("guest", spec, public_key=guest_id.public_key, sign=guest_id.sign,
                              guest=GuestConfig(remote_id=host_id.public_key, post_id=POST,
                                                host_public_key=host_id.public_key))

        def ctx(role: str):
            def make(ev: SessionReady) -> HookContext:
                return HookContext(role=role, session_id=ev.session_id, peer=PeerInfo(ev.peer_public_key),
                                   options=options if role == "guest" else {},
                                   knowledge=Spy() if role == "host" else None)
            return make

        async def main() -> None:
            g, h = memory_pipe(guest_id.public_key, host_id.public_key)
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(functools.partial(run_session, h, host, hooks, make_context=ctx("host")))
                    await run_session(g, guest, hooks, make_context=ctx("guest"))

        anyio.run(main)

    try:
        assert on_message.inline is not None
        session()
        # first: not known yet; second: warm; filtered: never small; then warm again
        assert where == [False, True, False, True]
        assert [r["status"] for r in got] == ["ok"] * 4
        assert _comparable(got[0]["envelope"]) == _comparable(got[1]["envelope"]) == _comparable(got[3]["envelope"])
        (home / "policy.toml").write_text('[[rule]]\nglob = "/kb/**"\ntier = "public"\n# changed\n')
        assert not handle.small({"query": "staging server"})  # a new policy: not known to be small
        handle.search({"query": "staging server", "topK": 3})
        assert handle.small({"query": "staging server"})
        (root / "b.md").write_text("# Other\n\nAnother staging note.\n")
        with Corpus(home) as c:
            c.sync()
        assert not handle.small({"query": "staging server"})  # a sync moved the generation
    finally:
        knowledge.close()


def test_a_grant_that_ends_makes_the_next_query_not_small(tmp_path: Path) -> None:
    """issue 31 item 1 on the lens (issue 29): whether a query is small is kept per lens
    key, so an override that ends (the same policy object, a new lens) makes the peer's
    next query go to the hook threads again, as a policy change or a sync does."""
    from node.answer.service import AnswerService, PeerView
    from node.policy.gate import EgressGate
    from node.policy.store import Policy

    home, _kb = indexed_docs(tmp_path, {"a.md": "# Staging\n\nThe staging server is rebuilt every night.\n"},
                             folder="kb")
    policy = Policy.from_toml('[[override]]\npeer = "alice"\nglob = "/kb/**"\ntier = "public"\n'
                              'until = "2027-01-01T00:00:00Z"\n')
    now = [1798761600.0 - 3600]  # an hour before the override ends
    policy.now = lambda: now[0]
    with Corpus(home, readonly=True) as corpus:
        handle = AnswerService(corpus, EgressGate(corpus.roots(), policy, home)).knowledge_for(
            PeerView("alice"))
        request = {"query": "staging server", "topK": 3}
        for _ in range(3):  # the first answer builds alice's view; the next ones are warm
            assert handle.search(request)["status"] == "ok"
        assert handle.small(request)
        assert not handle.small({**request, "sources": ["/kb/**"]})  # filtered: never small
        now[0] += 7200  # the override has ended: a new lens
        assert not handle.small(request)
        assert handle.search(request)["status"] != "ok"  # alice sees nothing now


def test_a_long_query_is_never_small_after_a_short_one(tmp_path: Path) -> None:
    """A peer that warms its view with a short question may not then have a long query
    answered on the host's event loop (attack49: a 2,000-character query of many words cost
    16-23 ms of CPU over the Python docs, run on the loop that serves every other guest):
    a query over INLINE_QUERY_CHARS is not small, whatever the view's last answer cost."""
    from node.answer.inline import INLINE_QUERY_CHARS
    from node.answer.service import AnswerService, PeerView
    from node.policy.gate import EgressGate
    from node.policy.store import Policy

    home, _kb = indexed_docs(tmp_path, {"a.md": "# Staging\n\nThe staging server is rebuilt every night.\n"},
                             folder="kb")
    policy = Policy.from_toml('[[rule]]\nglob = "/kb/**"\ntier = "public"\n')
    with Corpus(home, readonly=True) as corpus:
        handle = AnswerService(corpus, EgressGate(corpus.roots(), policy, home)).knowledge_for(
            PeerView("alice"))
        short = {"query": "staging server", "topK": 3}
        for _ in range(3):  # warm
            assert handle.search(short)["status"] == "ok"
        assert handle.small(short)
        at_bound = {"query": ("staging server " * 40)[:INLINE_QUERY_CHARS]}
        over = {"query": ("staging server " * 200)[:INLINE_QUERY_CHARS + 1]}
        assert handle.small(at_bound)
        assert not handle.small(over)
        assert not handle.small({"query": ("word " * 400)[:2000], "topK": 3})
        assert handle.search(over)["status"] == "ok"  # where it runs, never what it says
        assert handle.small(short)


def test_a_peers_failing_search_is_logged_and_the_owners_is_not(tmp_path: Path, caplog) -> None:
    """An index that cannot answer: a peer's search is logged (``search failed:
    index-unavailable`` on ``kith.answer``; the host's owner hears of it only there), the
    owner's own is not — ``kith search``, the API and MCP say its reason to their caller,
    once."""
    import logging
    import shutil

    from node.answer.service import OWNER, AnswerService, PeerView
    from node.policy.gate import EgressGate
    from node.policy.store import Policy

    home, _kb = indexed_docs(tmp_path, {"a.md": "# Staging\n\nThe staging server is rebuilt every night.\n"},
                             folder="kb")
    policy = Policy.from_toml('[[rule]]\nglob = "/kb/**"\ntier = "public"\n')
    request = {"query": "staging server", "topK": 3}
    with Corpus(home, readonly=True) as corpus:
        shutil.rmtree(home / "corpus" / "tantivy")
        service = AnswerService(corpus, EgressGate(corpus.roots(), policy, home))
        with caplog.at_level(logging.WARNING, logger="kith.answer"):
            owner = service.answer(request, OWNER)
            owners_lines = [r.getMessage() for r in caplog.records]
            caplog.clear()
            peer = service.answer(request, PeerView("alice"))
            peers_lines = [r.getMessage() for r in caplog.records]
    assert owner["status"] == peer["status"] == "index-unavailable"
    assert owners_lines == []
    assert peers_lines == ["search failed: index-unavailable"]
