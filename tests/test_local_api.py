"""The local API's boundary (and the MCP tool and corpus rules it relies on).

Real uvicorn servers on 127.0.0.1, real MCP stdio, real SQLite/tantivy in tmp_path; no
mocks. The sections:

1. DNS rebinding (Host / Origin / Content-Type) — 2. slowloris bounds — 3. deep JSON —
4. MCP arguments — 5. Kith homes inside a root — 6. index readiness honesty —
7. the quality gate.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from pathlib import Path

import httpx
import iroh
import jsonschema
import pytest

import node.common.http as httpbounds
from node.answer.service import answer_local
from node.local.api import run_api_in_thread
from node.answer.envelope import ENVELOPE_KEYS, build_envelope, empty_envelope
from node.answer.contract import validate as validate_search_request
from node.corpus.store import Corpus

try:
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

from support.agents import api_headers, mcp_session
from support.homes import indexed_docs
from support.waits import wait_for

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "specs" / "search-envelope.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

FILES = {
    "deploy.md": "# Deploy\n\nThe staging server is deleted automatically every night.\n",
    "notes.txt": "Temporary directories are removed on exit. The walrus note is here.\n",
    "ports.txt": "The server listens on port 8080 by default.\n",
    "dates.txt": "In 2024 we shipped 03 parsers, and on day 01 the build server.\n",
}


#: one client for the whole module (a new httpx client per call costs ~0.1 s of set-up)
HTTP = httpx.Client(timeout=30)
#: the module server's credential (specs/agents.md); a test with its own home sets its own
SERVED_AUTH: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _served_credential() -> None:
    HTTP.headers.update(SERVED_AUTH)


def _valid(env: dict) -> None:
    errors = sorted(VALIDATOR.iter_errors(env), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    assert tuple(env) == ENVELOPE_KEYS


def _make_corpus(base: Path) -> tuple[Path, Path]:
    return indexed_docs(base, FILES, folder="kb")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    home, root = _make_corpus(tmp_path_factory.mktemp("review-api"))
    SERVED_AUTH.update(api_headers(home))
    with run_api_in_thread(home) as url:
        yield url, home, root


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# --- 1. DNS rebinding ------------------------------------------------------------------

def test_rebinding_attack_request_gets_nothing(served) -> None:
    url, _, root = served
    r = HTTP.post(url + "/search", content=b'{"query": "staging server"}', headers={
        "Host": "attacker.example", "Origin": "http://attacker.example",
        "Content-Type": "text/plain"})
    assert r.status_code == 403
    assert r.json() == {"error": {"code": "api-bad-host", "message": r.json()["error"]["message"]}}
    assert "staging" not in r.text and str(root) not in r.text


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:{port}",
                                  "127.0.0.1:1", "localhost:{port}0", "127.0.0.1.nip.io:{port}",
                                  "[::2]:{port}", "localhost:{port}@evil"])
def test_foreign_host_header_is_403_on_every_route(served, host: str) -> None:
    url, _, _ = served
    host = host.format(port=_port(url))
    for r in (HTTP.get(url + "/stats", headers={"Host": host}),
              HTTP.get(url + "/health", headers={"Host": host}),
              HTTP.post(url + "/search", json={"query": "staging"}, headers={"Host": host})):
        assert r.status_code == 403 and r.json()["error"]["code"] == "api-bad-host"


@pytest.mark.parametrize("origin", ["http://attacker.example", "null", "https://127.0.0.1:{port}",
                                    "http://127.0.0.1:{port}.evil.example",
                                    "http://localhost:1", "file://"])
def test_foreign_origin_is_403(served, origin: str) -> None:
    url, _, _ = served
    origin = origin.format(port=_port(url))
    r = HTTP.post(url + "/search", json={"query": "staging"}, headers={"Origin": origin})
    assert r.status_code == 403 and r.json()["error"]["code"] == "api-bad-host"


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]"])
def test_loopback_host_and_origin_are_served(served, name: str) -> None:
    url, _, _ = served
    authority = f"{name}:{_port(url)}"
    r = HTTP.post(url + "/search", json={"query": "staging server"},
                   headers={"Host": authority, "Origin": f"http://{authority}"})
    assert r.status_code == 200 and r.json()["results"][0]["source"] == "/kb/deploy.md"


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/jsonx"])
def test_search_needs_a_json_content_type(served, ctype: str | None) -> None:
    url, _, _ = served
    headers = {} if ctype is None else {"Content-Type": ctype}
    r = HTTP.post(url + "/search", content=b'{"query": "staging"}', headers=headers)
    assert r.status_code == 415 and r.json()["error"]["code"] == "api-content-type"
    ok = HTTP.post(url + "/search", content=b'{"query": "staging"}',
                    headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert ok.status_code == 200


# --- 2. slowloris ------------------------------------------------------------------------

def _state(sock: socket.socket, wait: float) -> str:
    """``open`` (nothing to read within ``wait`` s) or ``closed`` (EOF or reset)."""
    sock.settimeout(wait)
    try:
        return "closed" if sock.recv(1024) == b"" else "data"
    except socket.timeout:
        return "open"
    except ConnectionResetError:
        return "closed"


def test_connections_that_never_finish_headers_are_bounded_and_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpbounds, "HEADER_TIMEOUT_S", 600.0)  # read at each connection
    monkeypatch.setattr(httpbounds, "MAX_CONNECTIONS", 20)
    HTTP.headers.update(api_headers(tmp_path / "home"))

    def headless(n: int) -> list[socket.socket]:  # clients that never finish their request head
        out = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", _port(url)))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            out.append(s)
        return out

    def health() -> bool:
        try:
            return HTTP.get(url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    with run_api_in_thread(tmp_path / "home") as url:
        socks = []
        try:
            socks += headless(60)
            # the cap: 40 are closed at once, while no head deadline (600 s) can have closed any
            states = wait_for("the connections beyond the cap closed",
                              lambda: (got := [_state(s, 0.02) for s in socks]).count("closed") >= 40 and got,
                              timeout_s=30)
            assert states.count("open") == 20 and states.count("closed") == 40
            for s in socks:
                s.close()
            monkeypatch.setattr(httpbounds, "HEADER_TIMEOUT_S", 1.0)
            wait_for("the closed connections leaving the cap", health, timeout_s=30)
            late = headless(5)
            socks += late
            wait_for("the head deadline closing every head-less connection",  # bounded
                     lambda: all(_state(s, 0.02) == "closed" for s in late), timeout_s=30)
            # dribbling bytes does not extend the deadline
            d = socket.create_connection(("127.0.0.1", _port(url)))
            socks.append(d)
            assert _closed_while_dribbling(d, b"X")
            assert HTTP.get(url + "/health").status_code == 200  # still serving
        finally:
            for s in socks:
                s.close()


def _closed_while_dribbling(sock: socket.socket, byte: bytes) -> bool:
    """Send ``byte`` at most every 0.2 s until the server closes ``sock``: True once it
    did, False after 300 bytes (~60 s: a failure's bound; the deadlines tested are 1 s)."""
    for _ in range(300):
        try:
            sock.sendall(byte)
        except OSError:
            return True
        if _state(sock, 0.2) == "closed":
            return True
    return False


def test_a_request_whose_body_never_comes_is_closed_at_the_body_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Headers with a Content-Length, then nothing (or a byte now and then): the body
    deadline (BODY_TIMEOUT_S, read when the head has come; 1 s here) closes the connection
    — it stayed open for good once its head had come. The head deadline is set far out so
    only the body's can close it; a request whose body follows its head is still answered."""
    monkeypatch.setattr(httpbounds, "HEADER_TIMEOUT_S", 600.0)
    monkeypatch.setattr(httpbounds, "BODY_TIMEOUT_S", 1.0)
    auth = api_headers(tmp_path / "home")["Authorization"]
    with run_api_in_thread(tmp_path / "home") as url:
        head = (f"POST /search HTTP/1.1\r\nHost: 127.0.0.1:{_port(url)}\r\nContent-Type: application/json\r\n"
                f"Authorization: {auth}\r\nContent-Length: {{n}}\r\n\r\n")
        socks = []
        try:
            silent = socket.create_connection(("127.0.0.1", _port(url)))
            socks.append(silent)
            silent.sendall(head.format(n=1000).encode())
            wait_for("the body deadline closing a connection whose body never comes",
                     lambda: _state(silent, 0.05) == "closed", timeout_s=30)
            dribbling = socket.create_connection(("127.0.0.1", _port(url)))
            socks.append(dribbling)
            dribbling.sendall(head.format(n=1000).encode())
            assert _closed_while_dribbling(dribbling, b" ")
            body = json.dumps({"query": "staging server"}).encode()
            whole = socket.create_connection(("127.0.0.1", _port(url)))
            socks.append(whole)
            whole.sendall(head.format(n=len(body)).encode())
            whole.sendall(body)  # its own segment, after the head
            whole.settimeout(30)
            assert whole.recv(1024).startswith(b"HTTP/1.1 200 ")
        finally:
            for s in socks:
                s.close()


def test_both_servers_run_with_the_bounds() -> None:
    from starlette.applications import Starlette

    from node.common.http import _config

    cfg = _config(Starlette(), access_log=False)
    assert cfg.http is httpbounds.BoundedH11Protocol
    assert cfg.limit_concurrency == httpbounds.LIMIT_CONCURRENCY
    assert cfg.timeout_keep_alive == httpbounds.KEEP_ALIVE_S


# --- 3. deep JSON / 400 bodies -----------------------------------------------------------

@pytest.mark.parametrize("content", [
    b'{"query": "k", "tags": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"query": "k", "dateRange": ' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"}",
    b"{not json", b"\xff\xfe", b"", b'"just a string"',
])
def test_malformed_or_deep_bodies_are_400_with_the_envelope(served, content: bytes) -> None:
    url, _, _ = served
    r = HTTP.post(url + "/search", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    body = r.json()
    assert body["error"]["code"] == "query-invalid" and "\n" not in body["error"]["message"]
    _valid(body["envelope"])
    assert body["envelope"]["reason"] == "invalid-request"


# --- 4. MCP ---------------------------------------------------------------------------

_mcp = mcp_session


def _invitation() -> dict:
    from node.trust.identity import Identity
    from node.trust.invitation import create_invitation
    from node.protocol.spec import bundled_protocols_dir, load_spec

    host = Identity(os.urandom(32))
    spec = load_spec(bundled_protocols_dir() / "knowledge-query")
    addr = iroh.EndpointAddr(iroh.EndpointId.from_string(host.public_key), None, ["127.0.0.1:4433"])
    inv = create_invitation(host, protocol_name=spec.name, protocol_version=spec.version,
                            protocol_id=spec.protocol_id,
                            ticket=str(iroh.EndpointTicket.from_addr(addr)))
    import msgspec

    return json.loads(msgspec.json.encode(inv))


def test_mcp_arguments_are_validated_like_the_api(tmp_path: Path) -> None:
    home, _ = _make_corpus(tmp_path)
    from node.trust.identity import init_identity

    init_identity(home)  # peer calls sign with the home's identity (`kith init`)
    invitation = _invitation()

    async def calls(s):
        out = {}
        out["ok"] = await s.call_tool("search", {"query": "staging server", "topK": 2})
        out["str-topk"] = await s.call_tool("search", {"query": "staging", "topK": "5"})
        out["bool-topk"] = await s.call_tool("search", {"query": "staging", "topK": True})
        out["big-topk"] = await s.call_tool("search", {"query": "staging", "topK": 50})
        out["unknown"] = await s.call_tool("search", {"query": "staging", "limit": 3})
        out["empty"] = await s.call_tool("search", {"query": "   "})
        out["server-alone"] = await s.call_tool("search", {"query": "staging",
                                                           "server": "http://127.0.0.1:1"})
        # invitation JSON as a string (the SDK pre-parses it into an object) and as an object
        out["peer-json"] = await s.call_tool("search", {"query": "staging",
                                                        "peer": json.dumps(invitation)})
        out["peer-object"] = await s.call_tool("search", {"query": "staging", "peer": invitation})
        out["peer-number"] = await s.call_tool("search", {"query": "staging", "peer": 7})
        out["peer-bad-topk"] = await s.call_tool("search", {"query": "staging", "topK": "5",
                                                            "peer": invitation})
        return out

    out = _mcp(home, calls)
    assert not out["ok"].is_error
    assert out["ok"].structured_content["results"][0]["source"] == "/kb/deploy.md"
    for name, field in (("str-topk", "topK"), ("bool-topk", "topK"), ("big-topk", "topK"),
                        ("unknown", "limit"), ("empty", "query"), ("server-alone", "server"),
                        ("peer-number", "peer"), ("peer-bad-topk", "topK")):
        res = out[name]
        text = res.content[0].text
        assert res.is_error, name
        assert text.startswith("[query-invalid] ") and f"'{field}'" in text, (name, text)
        _valid(res.structured_content)
        assert res.structured_content["reason"] == "invalid-request"
    for name in ("peer-json", "peer-object"):
        res = out[name]
        # accepted as an invitation: verified, then refused only because it is not pinned
        assert res.is_error and res.content[0].text.startswith("[host-not-trusted] "), (
            name, res.content[0].text)
        assert str(home) not in res.content[0].text


# --- 5. Kith homes inside a root -----------------------------------------------------

def test_a_kith_home_inside_a_root_is_never_indexed(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    (root / "public.md").write_text("Zebracorn sightings are public knowledge.\n")
    home = root / "node-home"  # the node's own home, inside the indexed root
    other = root / "sub" / "other-node"  # another node's home (holds identity.key)
    other.mkdir(parents=True)
    (other / "policy.toml").write_text('# zebracorn secret policy note\n[rules]\n')
    (other / "notes.txt").write_text("zebracorn private notes of the other node\n")
    with Corpus(home) as c:
        c.add_root(root)
        home.mkdir(exist_ok=True)
        (home / "peers.json").write_text(json.dumps({"alice": {"note": "zebracorn peer"}}))
        (home / "approvals").mkdir()
        (home / "approvals" / "a1.json").write_text('{"why": "zebracorn approval"}')
        (root / "link.txt").symlink_to(home / "peers.json")
        # first sync: the other folder is not a home yet -> indexed (as before the fix)
        c.sync()
        assert "/kb/sub/other-node/notes.txt" in _sources(c, "zebracorn")
        (other / "identity.key").write_text("00" * 32)
        rep = c.sync()
        assert _sources(c, "zebracorn") == ["/kb/public.md"]  # and the old leak is removed
        assert {"source": "/kb/node-home", "reason": "kith-home"} in rep["skippedFolders"]
        assert {"source": "/kb/sub/other-node", "reason": "kith-home"} in rep["skippedFolders"]
        assert rep["skippedReasons"]["kith-home"] == 2
        assert str(tmp_path) not in json.dumps(rep["skippedFolders"])
        # the watcher's path batch refuses them too
        rep = c.sync_paths([home / "peers.json", home / "approvals", other / "notes.txt", other])
        assert rep["indexed"] == 0
        assert _sources(c, "zebracorn") == ["/kb/public.md"]


def test_a_root_that_is_a_kith_home_indexes_nothing(tmp_path: Path) -> None:
    other = tmp_path / "other-home"
    other.mkdir()
    (other / "identity.key").write_text("00" * 32)
    (other / "peers.json").write_text('{"zebracorn": 1}')
    with Corpus(tmp_path / "home") as c:
        c.add_root(other)
        rep = c.sync()
        assert rep["files"] == 0 and rep["skippedFolders"] == [
            {"source": "/other-home", "reason": "kith-home"}]


def _sources(c: Corpus, q: str) -> list[str]:
    hits, _ = c.search_hits(q, limit=10)
    return sorted({h.source_id for h in hits})


# --- 6. index readiness honesty ----------------------------------------------------------

def _crash_behind(home: Path, root: Path) -> None:
    """A new file reaches SQLite but not tantivy, as a crash between the two commits
    leaves it: the record has the document and a pending change, the index lacks it."""
    (root / "late.txt").write_text("The narwhal migration report arrived late.\n")
    with Corpus(home) as c:
        c.sync()
        c.hold_writer()
        did = c.record.db.execute("SELECT doc_id FROM documents WHERE source_id='/kb/late.txt'"
                            ).fetchone()[0]
        c.record.writer.delete_documents_by_term("doc_id", did)
        c.record.writer.commit()
        applied = int(c.record.get_meta("index_applied_seq") or 0)
    db = sqlite3.connect(home / "corpus" / "corpus.sqlite3")
    db.execute("INSERT INTO changes(doc_id, op) VALUES (?, 'upsert')", (did,))
    db.commit()
    db.close()
    with Corpus(home, readonly=True) as ro:
        assert ro.index_lag() > 0 and int(ro.record.get_meta("index_applied_seq")) == applied


def test_a_lagging_index_is_reported_not_hidden(tmp_path: Path) -> None:
    home, root = _make_corpus(tmp_path)
    _crash_behind(home, root)
    HTTP.headers.update(api_headers(home))
    with Corpus(home, readonly=True) as ro:
        st = ro.stats()
        assert st["index_lag"] > 0 and st["ready"] is False
        missing = answer_local(ro, {"query": "narwhal migration"})
        assert missing["status"] == "index-syncing"
        env = missing["envelope"]
        _valid(env)
        assert env["available"] is False and env["reason"] == "index-syncing"
        # the reason is the index state's, not the content's: a query matching nothing
        # anywhere gets the same envelope shape and reason
        nothing = answer_local(ro, {"query": "narwhal migration"})
        assert nothing == missing
        found = answer_local(ro, {"query": "staging server"})
        assert found["status"] == "ok"
        _valid(found["envelope"])
        assert found["envelope"]["quality"]["flags"]["indexSyncing"] is True
        assert "retry-after-index-sync" in found["envelope"]["quality"]["recommendations"]


@pytest.mark.skipif(fcntl is None, reason="needs POSIX flock")
def test_api_start_repairs_the_lag_or_warns_when_locked(tmp_path: Path) -> None:
    home, root = _make_corpus(tmp_path)
    _crash_behind(home, root)
    HTTP.headers.update(api_headers(home))
    # another process holds the writer: the API does not wait, it warns and says syncing
    fd = os.open(home / "corpus" / "writer.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    warnings: list[str] = []
    try:
        with run_api_in_thread(home, warn=warnings.append) as url:
            h = HTTP.get(url + "/health").json()
            assert h["available"] is False and h["reason"] == "index-syncing"
            r = HTTP.post(url + "/search", json={"query": "narwhal migration"})
            assert r.headers["x-kith-status"] == "index-syncing"
            assert r.json()["reason"] == "index-syncing"
    finally:
        os.close(fd)
    assert len(warnings) == 1 and "\n" not in warnings[0] and str(home) not in warnings[0]
    # the lock is free: start-up replays the change log
    warnings.clear()
    with run_api_in_thread(home, warn=warnings.append) as url:
        assert HTTP.get(url + "/stats").json()["index_lag"] == 0
        assert HTTP.get(url + "/health").json()["available"] is True
        env = HTTP.post(url + "/search", json={"query": "narwhal migration"}).json()
        assert env["results"][0]["source"] == "/kb/late.txt"
        assert "indexSyncing" not in env["quality"]["flags"]
    assert warnings == []


def test_first_sync_not_finished_is_syncing(tmp_path: Path) -> None:
    home, _ = _make_corpus(tmp_path)
    db = sqlite3.connect(home / "corpus" / "corpus.sqlite3")
    db.execute("DELETE FROM meta WHERE key='last_sync'")  # as while a first sync runs
    db.commit()
    db.close()
    with Corpus(home, readonly=True) as ro:
        assert ro.stats()["ready"] is False
        assert answer_local(ro, {"query": "zzzqqq"})["status"] == "index-syncing"


# --- 7. the quality gate ------------------------------------------------------------------

@pytest.fixture(scope="module")
def quality_corpus(tmp_path_factory: pytest.TempPathFactory):
    home, _ = _make_corpus(tmp_path_factory.mktemp("review-quality"))
    c = Corpus(home, readonly=True)
    yield c
    c.close()


def _quality(c: Corpus, query: str) -> dict:
    answer = answer_local(c, {"query": query, "topK": 10})
    assert answer["status"] == "ok", answer["status"]
    _valid(answer["envelope"])
    return answer["envelope"]["quality"]


def test_stop_words_only_is_never_strong(quality_corpus: Corpus) -> None:
    q = _quality(quality_corpus, "the the the")
    assert q["keyTermCoverage"]["terms"] == []
    assert q["keyTermCoverage"]["ratio"] == 0.0 and q["keyTermCoverage"]["topResultRatio"] == 0.0
    assert q["status"] == "weak" and q["needsMoreEvidence"] is True
    assert "retry-with-rewrite-pass" in q["recommendations"]
    assert q["flags"]["hasNonMetaExactEvidence"] is False


@pytest.mark.parametrize("query", ['"server staging"', '"night every" staging server',
                                   "2024-03-01", "build server 2024-03-01"])
def test_exact_unit_not_matched_is_not_strong(quality_corpus: Corpus, query: str) -> None:
    q = _quality(quality_corpus, query)
    assert q["flags"]["exactPassMatched"] is False
    assert q["flags"]["hasNonMetaExactEvidence"] is False  # consistent with the exact pass
    assert q["status"] == "weak" and q["needsMoreEvidence"] is True
    assert q["recommendations"][0] == "retry-with-exact-pass"


def test_exact_unit_matched_can_be_strong(quality_corpus: Corpus) -> None:
    q = _quality(quality_corpus, '"deleted automatically" staging server')
    assert q["flags"]["exactPassMatched"] is True and q["flags"]["hasNonMetaExactEvidence"] is True
    assert q["status"] == "strong" and q["needsMoreEvidence"] is False
    q = _quality(quality_corpus, "server port 8080")
    assert q["flags"]["exactPassMatched"] is True and q["status"] == "strong"


def test_no_hits_envelope_is_still_the_empty_one() -> None:
    req = validate_search_request({"query": "the the the"})
    assert build_envelope(req, []) == empty_envelope("no-verified-results", req)


def test_a_server_bound_to_another_loopback_address_answers_its_own_name(tmp_path: Path) -> None:
    HTTP.headers.update(api_headers(tmp_path / "home"))
    try:
        ctx = run_api_in_thread(tmp_path / "home", host="127.0.0.2")
        url = ctx.__enter__()
    except Exception as exc:  # noqa: BLE001 - not every system routes all of 127/8
        pytest.skip(f"127.0.0.2 cannot be bound here ({type(exc).__name__})")
    try:
        assert HTTP.get(url + "/health").status_code == 200  # Host: 127.0.0.2:PORT
        r = HTTP.get(url + "/health", headers={"Host": f"127.0.0.3:{_port(url)}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "api-bad-host"
    finally:
        ctx.__exit__(None, None, None)


def test_api_serve_help_names_every_route_it_serves(tmp_path) -> None:
    """``kith api serve --help`` names each route the API answers (POST /verify included),
    so an agent's author learns them from the CLI."""
    import subprocess

    from node.local.api import create_app

    from support.cli import KITH
    from support.hosts import ENV

    paths = {r.path for r in create_app(tmp_path).app.routes}
    out = subprocess.run([*KITH, "api", "serve", "--help"], capture_output=True, text=True, env=ENV,
                         timeout=60).stdout
    assert paths and all(p in out for p in paths), (paths, out)
