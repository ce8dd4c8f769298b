"""The local read-only API (DESIGN §11): a real uvicorn server on 127.0.0.1, real corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import jsonschema
import pytest

from node.local.api import create_app, openapi_document, run_api_in_thread, search_via_api
from node.answer.envelope import ENVELOPE_KEYS, SearchBudget
from node.corpus.store import Corpus
from node.common.errors import CorpusError

from support.agents import api_headers

REPO = Path(__file__).resolve().parents[1]
#: every request of these tests carries an agent's token (specs/agents.md); set per server
API = httpx.Client()
SERVED_AUTH: dict[str, str] = {}
SCHEMA = json.loads((REPO / "specs" / "search-envelope.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _valid(env: dict) -> None:
    errors = sorted(VALIDATOR.iter_errors(env), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    assert tuple(env) == ENVELOPE_KEYS


def _snapshot(home: Path) -> dict[str, tuple[int, int]]:
    """Every file under the home with its size and mtime (to prove nothing changed)."""
    out = {}
    for p in sorted(home.rglob("*")):
        if p.is_file() and not p.name.endswith(("-wal", "-shm")):
            st = p.stat()
            out[str(p.relative_to(home))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("api")
    root = base / "kb"
    root.mkdir()
    (root / "deploy.md").write_text("# Deploy\n\nThe staging server is deleted automatically "
                                    "every night.\n")
    (root / "notes.txt").write_text("Temporary directories are removed on exit.\n")
    home = base / "home"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
    SERVED_AUTH.update(api_headers(home))
    with run_api_in_thread(home, max_body_bytes=4096) as url:
        yield url, home, root


@pytest.fixture(autouse=True)
def _served_credential() -> None:
    """Each test starts with the module server's credential (a test with its own home sets
    its own)."""
    API.headers.update(SERVED_AUTH)


def test_read_routes_answer(served) -> None:
    url, home, root = served
    h = API.get(url + "/health").json()
    assert h["status"] == "ok" and h["available"] is True and h["readOnly"] is True
    assert h["externalAgentContract"]["readOnly"] is True
    s = API.get(url + "/stats").json()
    assert s["done"] == 2 and s["ready"] is True
    c = API.get(url + "/contract").json()
    assert c["routes"] == {"GET": ["/health", "/stats", "/contract", "/openapi.json", "/outbox"],
                           "POST": ["/search", "/verify", "/outbox"]}
    assert list(c["writes"]) == ["POST /outbox"]  # the one write, named (specs/outbox.md)
    # the contract allows exactly the routes served (POST /verify was missing, issue 32)
    allowed = h["externalAgentContract"]["allowedOperations"]
    assert sorted(allowed) == sorted(f"{m} {p}" for m, paths in c["routes"].items() for p in paths)
    assert "POST /verify" in h["externalAgentContract"]["refusedOperations"][-1]
    for r in (h, s, c):
        assert str(root) not in json.dumps(r) and str(home) not in json.dumps(r)


def test_served_openapi_equals_the_spec_file(served) -> None:
    url, _, _ = served
    served_doc = API.get(url + "/openapi.json").json()
    on_disk = json.loads((REPO / "specs" / "openapi.json").read_text())
    assert served_doc == on_disk == json.loads(json.dumps(openapi_document()))
    assert set(served_doc["paths"]) == {"/health", "/stats", "/contract", "/openapi.json", "/search", "/verify",
                                        "/outbox"}


def test_search_returns_a_valid_envelope(served) -> None:
    url, _, root = served
    r = API.post(url + "/search", json={"query": "staging server deleted", "topK": 3})
    assert r.status_code == 200 and r.headers["x-kith-status"] == "ok"
    env = r.json()
    _valid(env)
    assert env["results"][0]["source"] == "/kb/deploy.md"
    assert str(root) not in r.text


@pytest.mark.parametrize("body, reason", [
    ({"query": "zzzqqqxx", "topK": 3}, "no-verified-results"),
    ({"query": "staging", "remainingBudgetMs": 0}, "budget-exhausted"),
])
def test_search_without_results_keeps_every_key(served, body: dict, reason: str) -> None:
    url, _, _ = served
    r = API.post(url + "/search", json=body)
    assert r.status_code == 200
    env = r.json()
    _valid(env)
    assert env["reason"] == reason and env["results"] == []


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"query": "q", "topK": 21}',
                                     b'{"query": "q", "tags": []}'])
def test_bad_search_bodies_are_400_with_a_code(served, content: bytes) -> None:
    url, _, _ = served
    r = API.post(url + "/search", content=content,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "query-invalid"


@pytest.mark.parametrize("method, path", [
    ("POST", "/index"), ("POST", "/index/run"), ("POST", "/index/rebuild"), ("POST", "/sync"),
    ("PUT", "/settings"), ("PATCH", "/settings"), ("POST", "/memory/write"), ("POST", "/memories"),
    ("POST", "/server/start"), ("POST", "/server/stop"), ("POST", "/source/create"),
    ("DELETE", "/search"), ("PUT", "/search"), ("PATCH", "/search"), ("POST", "/health"),
    ("DELETE", "/stats"), ("POST", "/contract"), ("OPTIONS", "/search"), ("POST", "/search/"),
    ("DELETE", "/"), ("POST", "/search%2F..%2Findex"),
])
def test_every_mutation_is_403_and_changes_nothing(served, method: str, path: str) -> None:
    url, home, _ = served
    before = _snapshot(home)
    r = API.request(method, url + path, json={"query": "x", "root": "/etc"})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "api-read-only"
    assert _snapshot(home) == before


def test_unknown_get_is_404(served) -> None:
    url, _, _ = served
    r = API.get(url + "/index")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not-found"


def test_body_over_the_limit_is_413(served) -> None:
    url, _, _ = served
    big = json.dumps({"query": "q" * 5000}).encode()
    r = API.post(url + "/search", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request-too-large"

    def chunks():  # no Content-Length: cut off while reading
        for _ in range(10):
            yield b" " * 1000
    r = API.post(url + "/search", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_non_loopback_client_is_403(served) -> None:
    _, home, _ = served
    app = create_app(home)
    transport = httpx.ASGITransport(app=app, client=("192.0.2.7", 40000))
    import anyio

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=transport, base_url="http://kith") as client:
            return [await client.get("/health"),
                    await client.post("/search", json={"query": "staging"})]

    for r in anyio.run(go):
        assert r.status_code == 403 and r.json()["error"]["code"] == "api-loopback-only"
    app.holder.close()


def test_non_loopback_bind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CorpusError) as e:
        with run_api_in_thread(tmp_path, host="0.0.0.0"):
            pass
    assert e.value.code == "api-loopback-only"


def test_api_without_a_corpus_is_unavailable_not_an_error(tmp_path: Path) -> None:
    API.headers.update(api_headers(tmp_path / "fresh-home"))
    with run_api_in_thread(tmp_path / "fresh-home") as url:
        h = API.get(url + "/health").json()
        assert h["available"] is False and h["status"] == "unavailable"
        assert h["peers"] == {"available": False, "pinned": 0, "error": None}  # no identity, nobody pinned
        env = API.post(url + "/search", json={"query": "anything"}).json()
        _valid(env)
        assert env["available"] is False and env["reason"] == "index-unavailable"
    assert not (tmp_path / "fresh-home" / "corpus").exists()  # the API created nothing


def test_health_names_a_damaged_peers_json_and_its_code(tmp_path: Path) -> None:
    """A peers.json that does not read: /health said only ``pinned: 0``, as if nobody were
    pinned; it names the file and the code `kith peers list` refuses it with, and says
    it again once the file is fixed."""
    from node.trust.identity import load_or_init_identity
    from node.trust.peers import PeerRegistry

    home = tmp_path / "home"
    load_or_init_identity(home)
    API.headers.update(api_headers(home))
    (home / "peers.json").write_text("{not json")
    with run_api_in_thread(home) as url:
        broken = API.get(url + "/health").json()["peers"]
        (home / "peers.json").unlink()
        PeerRegistry.load(home).add("alice", "ab" * 32)
        fixed = API.get(url + "/health").json()["peers"]
    assert broken["available"] is False and broken["pinned"] == 0
    assert broken["error"]["file"] == "peers.json" and broken["error"]["code"] == "config-invalid", broken
    assert "peers.json" in broken["error"]["message"] and broken["error"]["hint"], broken
    assert fixed == {"available": True, "pinned": 1, "error": None}


def test_client_budget_spans_retries(served) -> None:
    url, _, _ = served
    token = API.headers["Authorization"].split()[1]
    budget = SearchBudget(90)
    sent = []
    for _ in range(3):
        env = search_via_api(url, {"query": "staging", "topK": 2}, budget, token=token)
        _valid(env)
        sent.append(budget._last_ms)
    assert sent == sorted(sent, reverse=True)
    with pytest.raises(CorpusError) as e:
        search_via_api(url, {"query": "staging"}, budget, token=token)
    assert e.value.code == "budget-exhausted"


def test_the_outbox_routes_answer_a_damaged_file_with_500_and_an_empty_one_with_zero_usage(tmp_path: Path) -> None:
    """``GET /outbox`` of a home that never kept anything has the same ``usage`` as ``kith
    outbox list --json`` (zeros, the bounds); a damaged ``outbox.sqlite`` is the node's own
    fault: 500 ``outbox-corrupt``, and ``POST /outbox`` asks nobody."""
    from node.local.api import run_api_in_thread
    from node.guest.outbox import MAX_BYTES, MAX_QUESTIONS
    from node.trust.identity import load_or_init_identity

    load_or_init_identity(tmp_path)
    API.headers.update(api_headers(tmp_path))
    with run_api_in_thread(tmp_path, offline=True) as url:
        empty = API.get(url + "/outbox", timeout=30)
        (tmp_path / "outbox.sqlite").write_bytes(b"not a database" * 50)
        got = API.get(url + "/outbox", timeout=30)
        posted = API.post(url + "/outbox", json={"query": "x", "peers": ["alice"]}, timeout=30)
    assert empty.status_code == 200 and empty.json() == {"questions": [], "usage": {
        "questions": 0, "open": 0, "bytes": 0, "maxQuestions": MAX_QUESTIONS, "maxBytes": MAX_BYTES}}
    assert got.status_code == 500 and got.json()["error"]["code"] == "outbox-corrupt"
    assert posted.status_code == 500 and posted.json()["error"]["code"] == "outbox-corrupt"


def test_api_holds_no_writer_lock(served) -> None:
    _, home, _ = served
    # a writer can sync while the API is serving (the API opened the corpus read-only)
    with Corpus(home) as c:
        rep = c.sync()
    assert rep["failed"] == 0
    assert os.path.exists(home / "corpus" / "corpus.sqlite3")


def test_get_outbox_reads_a_home_this_user_may_read_but_not_write(tmp_path: Path) -> None:
    """`kith api serve` on a home the user may read but not write (a chmod; a real process
    without root's DAC capabilities): ``GET /outbox`` lists the kept question and ``?id=``
    shows it — both refused ``io-error``, the outbox being opened for writing — and
    nothing in the home changes (specs/outbox.md §2)."""
    from node.guest.outbox import OutboxStore
    from support.cli import KITH, serving, without_root_reads
    from support.homes import files_of, node_home, read_only

    prefix = without_root_reads()
    home = node_home(tmp_path, "ro")
    headers = api_headers(home)
    with OutboxStore(home) as store:
        qid = store.add({"query": "where is the walrus", "topK": 3}, [("alice", "ab" * 32)])["id"]
    with read_only(home) as before:
        with serving([*prefix, *KITH, "--home", str(home), "api", "serve", "--port", "0", "--json",
                      "--offline"]) as (info, ended):
            listed = httpx.get(info["url"] + "/outbox", headers=headers, timeout=30)
            shown = httpx.get(info["url"] + "/outbox", params={"id": qid[:8]}, headers=headers, timeout=30)
        err = ended["stderr"]
        after = files_of(home)
    assert listed.status_code == 200, listed.text
    assert [q["id"] for q in listed.json()["questions"]] == [qid]
    assert shown.status_code == 200 and shown.json()["query"] == "where is the walrus", shown.text
    assert after == before
    assert "Traceback" not in err, err[-3000:]


def test_api_serve_searches_a_home_this_user_may_read_but_not_write(tmp_path: Path) -> None:
    """`kith api serve` (a real process without root's DAC capabilities) on an indexed home
    the user may read but not write (a chmod): ``POST /search`` answered ``available:
    false`` (tantivy's lock file) and the home's background runner stopped with an
    ``[io-error]`` line (its ``runner.lock``). The search answers; one line says the runner
    does not run on a read-only home; nothing in the home changes."""
    from support.cli import KITH, serving, without_root_reads
    from support.homes import files_of, indexed_docs, node_home, read_only

    prefix = without_root_reads()
    node_home(tmp_path, "home")  # the node's identity; indexed_docs indexes into the same home
    home, _kb = indexed_docs(tmp_path, {"deploy.md": "# Deploy\n\nThe staging server is deleted automatically "
                                                     "every night.\n"}, folder="kb")
    headers = api_headers(home)
    with read_only(home) as before:
        with serving([*prefix, *KITH, "--home", str(home), "api", "serve", "--port", "0", "--json",
                      "--offline"]) as (info, ended):
            found = httpx.post(info["url"] + "/search", json={"query": "staging server"}, headers=headers,
                               timeout=30)
        err = ended["stderr"]
        after = files_of(home)
    assert found.status_code == 200, found.text
    assert found.json()["available"] is True and found.json()["results"][0]["source"] == "/kb/deploy.md", found.text
    assert "[io-error]" not in err and "runner stopped" not in err and "Traceback" not in err, err[-3000:]
    assert "read-only for you: its background runner does not run" in err, err
    assert after == before
