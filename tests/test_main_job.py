"""The main job end to end, through the real `kith` command: host → invitation → join →
handshake → validated query → gated answer, over iroh on loopback (relay disabled)."""

from __future__ import annotations

import json
import shutil

import pytest

from node.community.server import run_server_in_thread

from support.cli import assert_no_real_paths, json_lines, kith
from support.homes import FIXTURE, initialized
from support.hosts import HostProcess as Host, prepare_host

pytestmark = pytest.mark.iroh


@pytest.fixture
def server(tmp_path):
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3") as url:
        yield url


def test_join_by_post_id_gets_gated_cited_answers(tmp_path, server):
    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURE, corpus)
    home = prepare_host(tmp_path, corpus, ("/corpus/*.md", "public"))  # notes/ stays private
    host = Host(home, "--server", server)
    try:
        post_id = host.invitation["post_id"]
        r = kith(initialized(tmp_path / "guest"), "join", post_id, "--server", server, "--local", "--trust",
                 "--query", "temporary directory deleted automatically", "--query", "salary bands bonus pool",
                 "--json")
        assert r.returncode == 0, r.stderr
        msgs = json_lines(r.stdout)
        assert [m["query_id"] for m in msgs] == ["q1", "q2"]
        assert msgs[0]["status"] == "ok"
        sources = [res["source"] for res in msgs[0]["envelope"]["results"]]
        assert "/corpus/tempfiles.md" in sources
        assert msgs[0]["envelope"]["citationPack"]
        # the private note matched the words but must not be revealed
        assert msgs[1]["status"] == "no-verified-results" and msgs[1]["envelope"]["results"] == []
        # ...and the answer is exactly what a query with no match at all gets (no oracle)
        from node.answer.envelope import empty_envelope
        from node.answer.contract import validate as validate_search_request
        req = validate_search_request({"query": "salary bands bonus pool", "topK": 5})
        assert msgs[1]["envelope"] == json.loads(json.dumps(empty_envelope("no-verified-results", req)))
        assert "Bonus pool" not in r.stdout and "confidential" not in r.stdout
        assert_no_real_paths(r.stdout + r.stderr, corpus, home)
    finally:
        code, out, err = host.stop()
    assert code == 0, err
    events = json_lines(out)
    assert [e["event"] for e in events] == ["session-started", "session-ended"]
    assert events[1]["reason"] == "completed"


def test_file_mode_and_tampered_ticket(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURE, corpus)
    home = prepare_host(tmp_path, corpus)
    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    try:
        assert json.loads(invite.read_text()) == host.invitation
        r = kith(initialized(tmp_path / "guest"), "join", str(invite), "--local", "--trust", "--query", "WAL readers", "--json")
        assert r.returncode == 0, r.stderr
        assert json_lines(r.stdout)[0]["envelope"]["results"][0]["source"] == "/corpus/sqlite.md"

        doc = json.loads(invite.read_text())
        t = doc["transport_info"]["ticket"]
        i = len(t) - 10
        doc["transport_info"]["ticket"] = doc["iroh_ticket"] = t[:i] + ("q" if t[i] != "q" else "r") + t[i + 1:]
        bad = tmp_path / "tampered.json"
        bad.write_text(json.dumps(doc))
        r = kith(initialized(tmp_path / "guest"), "join", str(bad), "--local", "--trust", "--query", "x", "--json")
        assert r.returncode == 1
        assert "invitation-bad-signature" in r.stderr
        assert json.loads(r.stdout)["error"]["code"] == "invitation-bad-signature"
    finally:
        host.stop()


def test_unknown_host_needs_trust_and_post_id_needs_server(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURE, corpus)
    home = prepare_host(tmp_path, corpus)
    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    try:
        r = kith(initialized(tmp_path / "guest"), "join", str(invite), "--local", "--query", "x", input="")
        assert r.returncode == 1 and "host-not-trusted" in r.stderr
        assert "SHA256:" in r.stderr  # the fingerprint is shown
        # the words can be compared before trusting: the host prints them only once a
        # session starts, so the guest names the command its owner runs (issue 32)
        import re

        guest_key = json.loads(kith(tmp_path / "guest", "status", "--json").stdout)["identity"]["key"]
        words = re.search(r"pairing code: (\w+ \w+ \w+ \w+ \w+) ", r.stderr).group(1)
        assert f"`kith peers code {guest_key}`" in r.stderr, r.stderr
        on_host = kith(home, "peers", "code", guest_key)
        assert on_host.returncode == 0 and on_host.stdout.strip() == words, (on_host.stdout, words)
        r = kith(initialized(tmp_path / "guest"), "join", host.invitation["post_id"], "--local", "--trust", "--query", "x")
        assert r.returncode == 1 and "no-server" in r.stderr
    finally:
        host.stop()


@pytest.mark.shared
@pytest.mark.slow
def test_python_docs_tempfile_question(tmp_path, server, pydocs):
    home = prepare_host(tmp_path, pydocs)
    host = Host(home, "--server", server)
    try:
        r = kith(initialized(tmp_path / "guest"), "join", host.invitation["post_id"], "--server", server, "--local", "--trust",
                 "--query", "temporary directory that is deleted automatically", "--json")
        assert r.returncode == 0, r.stderr
        msg = json_lines(r.stdout)[0]
        sources = [res["source"] for res in msg["envelope"]["results"]]
        assert "/python-docs-3.11/library/tempfile.rst.txt" in sources
        assert_no_real_paths(r.stdout, pydocs, home)
    finally:
        host.stop()


def test_single_use_invitation_is_refused_by_the_host_itself(tmp_path):
    """max_sessions is enforced by the host, not only by the community server: a guest
    that never submits its proof still cannot join a consumed invitation again."""
    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURE, corpus)
    home = prepare_host(tmp_path, corpus)
    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite), "--max-sessions", "1")
    try:
        first = kith(initialized(tmp_path / "guest"), "join", str(invite), "--local", "--trust", "--query", "WAL", "--json")
        assert first.returncode == 0, first.stderr
        second = kith(initialized(tmp_path / "guest2"), "join", str(invite), "--local", "--trust", "--query", "WAL", "--json")
        assert second.returncode == 1
        err = json.loads(second.stdout.splitlines()[-1])["error"]
        assert err["code"] == "invitation-gone" and "handshake-unknown-post" in err["message"]
    finally:
        host.stop()
