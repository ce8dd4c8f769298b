"""Copies over iroh on loopback between real processes (issue 33; specs/copies.md): the
host grants bea a copy (`kith policy copy`), bea pulls it (`kith copies sync`), the host is
stopped, and `kith ask --peer NAME` answers from the copy, marked ``fromCopy`` /
``copyAsOf`` in JSON and "from alice's copy of …" in text; `--copy` answers from the copy
only; the copy is never served on to a third node asking bea's own host; ending the grant
deletes the copy at the next sync and says so."""

from __future__ import annotations

import json

import pytest

from node.trust.identity import load_identity

from support.agents import api_headers
from support.cli import kith
from support.copies import alice_for_bea, events_of, kb_host_and_bea, runner_in
from support.envelopes import valid_ask
from support.homes import node_home, pin_host
from support.hosts import HostProcess

pytestmark = pytest.mark.iroh


def test_grant_sync_host_stopped_ask_answers_from_the_copy(tmp_path):
    host, bea = kb_host_and_bea(tmp_path, grant=None)
    assert kith(host, "policy", "set", "/kb/notes/**", "private").returncode == 0
    granted = kith(host, "policy", "copy", "/kb/**", "--for", "bea")
    assert granted.returncode == 0 and "keeps what it copied" in granted.stderr
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        r = kith(bea, "copies", "sync", "alice", "--json", timeout=180)
        assert r.returncode == 0, r.stderr
        (report,) = json.loads(r.stdout)["copies"]
        assert report["status"] == "ok" and report["fetched"] == 2  # notes/ is private: never copied
        again = json.loads(kith(bea, "copies", "sync", "alice", "--json", timeout=180).stdout)["copies"][0]
        assert (again["fetched"], again["unchanged"]) == (0, 2)
    finally:
        h.stop()
    # the host sleeps: its copy answers, marked
    r = kith(bea, "ask", "journal mode WAL", "--peer", "alice", "--json", "--timeout", "4", timeout=120)
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)
    valid_ask(env)
    (row,) = env["peers"]
    assert row["status"] == "ok" and row["fromCopy"] is True and row["copyAsOf"]
    assert env["results"][0]["source"] == "/kb/sqlite.md"
    text = kith(bea, "ask", "journal mode WAL", "--peer", "alice", "--timeout", "4", timeout=120)
    assert text.returncode == 0 and "from alice's copy of" in text.stdout
    only = json.loads(kith(bea, "ask", "salary", "--peer", "alice", "--copy", "--json").stdout)
    assert only["peers"][0]["fromCopy"] is True and only["results"] == []  # private notes were never copied
    listed = json.loads(kith(bea, "copies", "list", "--json").stdout)["copies"]
    assert [(c["peer"], c["documents"]) for c in listed] == [("alice", 2)]

    # a copy is never served on: a third node asking bea's own host gets nothing of alice's
    bea_kb = tmp_path / "bea-kb"
    bea_kb.mkdir()
    (bea_kb / "garden.md").write_text("# Garden\n\nTomatoes need sun.\n")
    assert kith(bea, "index", "add", str(bea_kb)).returncode == 0
    assert kith(bea, "index", "sync").returncode == 0
    assert kith(bea, "policy", "set", "/**", "public").returncode == 0
    cat = node_home(tmp_path, "cat")
    bh = HostProcess(bea, "--invite-file", str(tmp_path / "bea-inv.json"))
    try:
        pin_host(cat, "bea", bh.invitation)
        asked = json.loads(kith(cat, "ask", "journal mode WAL", "--peer", "bea", "--json", timeout=120).stdout)
        assert asked["peers"][0]["status"] in ("ok", "no-verified-results") and "fromCopy" not in asked["peers"][0]
        assert not any("sqlite" in r["source"] for r in asked["results"])
    finally:
        bh.stop()


def test_ending_the_grant_deletes_the_copy_at_the_next_sync(tmp_path):
    host, bea = kb_host_and_bea(tmp_path)
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        assert kith(bea, "copies", "sync", "alice", timeout=180).returncode == 0
        assert kith(host, "policy", "copy", "/kb/sqlite.md", "--for", "bea").returncode == 0
        assert kith(host, "policy", "copy", "/kb/**", "--for", "bea", "--off").returncode == 0  # narrowed
        r = kith(bea, "copies", "sync", "alice", timeout=180)
        assert r.returncode == 0, r.stderr
        assert "deleted 2 (no longer granted)" in r.stdout
        assert kith(host, "policy", "copy", "/kb/sqlite.md", "--for", "bea", "--off").returncode == 0  # ended
        r = kith(bea, "copies", "sync", "alice", timeout=180)
        assert r.returncode == 0 and "no longer grants a copy: deleted 1 document(s)" in r.stderr
        assert json.loads(kith(bea, "copies", "list", "--json").stdout)["copies"] == []
        assert kith(bea, "ask", "WAL", "--peer", "alice", "--copy").returncode == 1  # copy-not-found row
    finally:
        h.stop()


def test_the_home_runner_re_syncs_a_copy_in_the_background(tmp_path):
    import anyio

    from node.guest.copies.store import CopyStore
    from node.guest.owner import Guest
    from node.guest.runner import Runner, default_tasks

    host, bea = kb_host_and_bea(tmp_path, "/kb/sqlite.md")
    store = CopyStore(bea, "alice")
    store.commit(store.load())  # bea keeps a copy of alice (nothing in it yet)
    events: list[dict] = []

    async def main():
        # the process's own pool (as `kith api serve` / `kith mcp` pass theirs), bound here:
        # a pool bound inside a runner job cannot be exited by the runner (see the report)
        async with alice_for_bea(host, bea, tmp_path) as (_h, pool), anyio.create_task_group() as tg:
            await pool._ensure_node()

            async def own_pool():
                return pool
            stop_runner = runner_in(tg, Runner(Guest(bea), default_tasks(bea), pool=own_pool, command="test",
                                               on_event=events.append))
            await events_of(events, "copy-synced")
            stop_runner.cancel()

    anyio.run(main)
    synced = next(e for e in events if e["event"] == "copy-synced")
    assert synced == {"event": "copy-synced", "peer": "alice", "fetched": 1, "removed": 0}
    assert list(store.load()["documents"]) == ["/kb/sqlite.md"]


def test_kith_verify_accepts_each_result_of_an_answer_from_a_copy_as_the_hosts(tmp_path):
    """The host is stopped after bea synced its copy; `kith ask --peer alice --json` answers
    from the copy and `kith verify` of that saved output accepts every result as alice's,
    from a copy (the host's signature over each whole document, checked against bea's copy
    document); so do MCP `search`/`verify` and `POST /search`/`POST /verify`; one copied
    document changed on disk is refused (`text-changed`)."""
    import anyio
    import httpx

    from node.local.api import run_api_in_thread
    from node.local.mcp import call_search, call_verify
    from node.guest.copies.store import CopyStore

    host, bea = kb_host_and_bea(tmp_path)
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        r = kith(bea, "copies", "sync", "alice", timeout=180)
        assert r.returncode == 0, r.stderr
    finally:
        h.stop()
    r = kith(bea, "ask", "file", "--peer", "alice", "--json", "--timeout", "4", timeout=120)
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)
    valid_ask(env)
    assert env["peers"][0]["fromCopy"] is True and len({x["source"] for x in env["results"]}) == 2
    assert all(x["fromCopy"] and x["copyCitation"] and x["copySpan"] for x in env["results"])
    saved = tmp_path / "answer.json"
    saved.write_text(r.stdout)
    v = kith(bea, "verify", str(saved), "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    report = json.loads(v.stdout)
    key = load_identity(host).public_key
    assert report["ok"] and len(report["rows"]) == len(env["results"])
    assert all(row["result"] == "genuine" and row["fromCopy"] and row["peer"] == "alice" and row["hostKey"] == key
               and "that host's, from a copy of" in row["detail"] for row in report["rows"])
    # MCP `search` and `POST /search` with `peers` answer from the copy the same way (one
    # envelope, node/guest/fanout.py), and their answers verify as alice's too
    found = anyio.run(lambda: call_search(bea, {"query": "file", "peers": ["alice"]}, local=True))
    assert not found.is_error and found.structured_content["results"]
    assert all(x["fromCopy"] and x["copySpan"] for x in found.structured_content["results"])
    as_saved = {"content": [{"type": "text", "text": c.text} for c in found.content]}  # as an agent keeps it
    mcp_report = call_verify(bea, {"answer": as_saved}).structured_content
    assert mcp_report["ok"] and all(row["fromCopy"] for row in mcp_report["rows"])
    with run_api_in_thread(bea, offline=True) as url, httpx.Client(timeout=90, headers=api_headers(bea)) as http:
        merged = http.post(f"{url}/search", json={"query": "file", "peers": ["alice"]}).json()
        api_report = http.post(f"{url}/verify", json={"answer": merged}).json()
    valid_ask(merged)
    assert merged["results"] and all(x["fromCopy"] and x["copyCitation"] for x in merged["results"])
    assert api_report["ok"] and all(row["fromCopy"] for row in api_report["rows"])
    # one copied document changed on disk: its result is refused, the others still hold
    store = CopyStore(bea, "alice")
    first = env["results"][0]["source"]
    doc = store.docs / store.load()["documents"][first]["file"]
    doc.write_text(doc.read_text() + "\nA line the host never signed.\n")
    v = kith(bea, "verify", str(saved), "--json")
    report = json.loads(v.stdout)
    assert v.returncode == 1 and report["ok"] is False
    refused = [row for row in report["rows"] if row["source"] == first]
    assert refused and all(row["result"] == "text-changed" for row in refused)
    assert all(row["result"] == "genuine" for row in report["rows"] if row["source"] != first)


def test_copy_requests_are_charged_to_the_peers_quota_and_each_batch_sent_is_audited(tmp_path):
    """issue 42 item 3: a peer whose queries are refused rate-limited still pulled manifests
    and whole signed documents, and no audit record named what a copy sent. A copy_list is
    one query of the peer's quota and a copy_fetch one plus one per 256 KiB sent; refused,
    the session ends copy-rate-limited and nothing is sent. Each copy_docs that leaves is a
    copy-sent record (source ids, versions, scrub counts), shown by kith audit."""
    host, bea = kb_host_and_bea(tmp_path)
    (tmp_path / "kb" / "deploy.md").write_text("# Deploy\n\nMail ops@example.com when the nightly rebuild fails.\n")
    assert kith(host, "index", "sync").returncode == 0
    assert kith(host, "policy", "set", "/kb/notes/**", "private").returncode == 0
    assert kith(host, "policy", "scrub", "email", "--for", "bea", "--yes").returncode == 0
    assert kith(host, "policy", "quota", "--for", "bea", "--per-hour", "1", "--burst", "2").returncode == 0
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        first = kith(bea, "copies", "sync", "alice", "--json", timeout=180)  # copy_list + one copy_fetch: 2
        second = kith(bea, "copies", "sync", "alice", "--json", timeout=180)  # the bucket is empty
    finally:
        h.stop()
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["copies"][0]["fetched"] == 3
    assert second.returncode == 1
    row = json.loads(second.stdout)["copies"][0]
    assert (row["status"], row["code"]) == ("refused", "copy-rate-limited"), row
    records = [json.loads(line) for line in (host / "audit.jsonl").read_text().splitlines()]
    (sent,) = [r for r in records if r["event"] == "copy-sent"]
    assert sent["peer_name"] == "bea"
    assert sorted(sent["sources"]) == ["/kb/deploy.md", "/kb/sqlite.md", "/kb/tempfiles.md"]
    assert sent["documents"] == 3 and len(sent["versions"]) == 3 and all(len(v) == 64 for v in sent["versions"])
    assert sent["scrubbed"] == {"email": 1}  # deploy.md's address, a count and never the value
    shown = kith(host, "audit", "--peer", "bea")
    assert shown.returncode == 0 and "copy-sent" in shown.stdout and "documents=3" in shown.stdout


def test_a_narrowed_grant_told_in_a_one_shot_asks_handshake_is_filtered_from_the_copy_at_once(tmp_path):
    """issue 42 item 3: narrowing a grant only marked the copy stale at a handshake, so a
    peer that runs no background node kept answering the withdrawn source from its copy.
    A `kith ask` whose handshake tells another stamp asks the manifest within its deadline
    and records what the host no longer lists; the copy never answers it again, and the
    next sync deletes it."""
    host, bea = kb_host_and_bea(tmp_path)
    assert kith(host, "policy", "set", "/kb/notes/**", "private").returncode == 0
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        assert kith(bea, "copies", "sync", "alice", timeout=180).returncode == 0
        before = json.loads(kith(bea, "ask", "temporary files", "--peer", "alice", "--copy", "--json").stdout)
        assert "/kb/tempfiles.md" in {r["source"] for r in before["results"]}
        assert kith(host, "policy", "copy", "/kb/sqlite.md", "--for", "bea").returncode == 0
        assert kith(host, "policy", "copy", "/kb/**", "--for", "bea", "--off").returncode == 0  # narrowed
        live = kith(bea, "ask", "journal mode WAL", "--peer", "alice", "--json", timeout=120)
        assert live.returncode == 0, live.stderr
    finally:
        h.stop()
    assert json.loads((bea / "copies" / "alice" / "withdrawn.json").read_text()) == {"sources": ["/kb/tempfiles.md"]}
    after = json.loads(kith(bea, "ask", "temporary files", "--peer", "alice", "--copy", "--json").stdout)
    assert "/kb/tempfiles.md" not in {r["source"] for r in after["results"]}
    kept = json.loads(kith(bea, "ask", "journal mode WAL", "--peer", "alice", "--copy", "--json").stdout)
    assert "/kb/sqlite.md" in {r["source"] for r in kept["results"]}  # what is still granted still answers


def test_a_narrowed_grant_told_in_a_join_is_filtered_from_the_copy_at_once(tmp_path):
    """The same through `kith join --peer`: after its questions, a session whose handshake
    told another stamp asks the manifest and records what the host withdrew."""
    host, bea = kb_host_and_bea(tmp_path)
    assert kith(host, "policy", "set", "/kb/notes/**", "private").returncode == 0
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        assert kith(bea, "copies", "sync", "alice", timeout=180).returncode == 0
        unchanged = kith(bea, "join", "--peer", "alice", "--offline", "--query", "WAL", "--json", timeout=120)
        assert unchanged.returncode == 0, unchanged.stderr
        assert not (bea / "copies" / "alice" / "withdrawn.json").exists()  # nothing changed: nothing asked
        assert kith(host, "policy", "copy", "/kb/sqlite.md", "--for", "bea").returncode == 0
        assert kith(host, "policy", "copy", "/kb/**", "--for", "bea", "--off").returncode == 0  # narrowed
        joined = kith(bea, "join", "--peer", "alice", "--offline", "--query", "WAL", "--json", timeout=120)
    finally:
        h.stop()
    assert joined.returncode == 0, joined.stderr
    assert [json.loads(line)["action"] for line in joined.stdout.splitlines()] == ["results"]  # the manifest is not shown
    assert json.loads((bea / "copies" / "alice" / "withdrawn.json").read_text()) == {"sources": ["/kb/tempfiles.md"]}
    after = json.loads(kith(bea, "ask", "temporary files", "--peer", "alice", "--copy", "--json").stdout)
    assert "/kb/tempfiles.md" not in {r["source"] for r in after["results"]}


def test_a_copy_request_the_quota_cannot_pay_is_refused_alone_and_the_warm_session_goes_on(tmp_path):
    """issue 42: a copy request the peer's quota could not pay ended the whole session with
    copy-rate-limited, so a warm session (`kith api serve`, `kith mcp`, the home runner's
    pool) lost its questions too. Now that request alone is refused — the sync reports
    copy-rate-limited and keeps the copy as it was — and the same session answers the
    next question: one session started, none ended."""
    import anyio

    from node.common.errors import KithError
    from node.guest.asker import Asker
    from node.guest.copies.store import CopyStore
    from node.guest.copies.sync import sync_with_pool

    host, bea = kb_host_and_bea(tmp_path)
    assert kith(host, "policy", "quota", "--for", "bea", "--per-hour", "1", "--burst", "2").returncode == 0
    out: dict = {}

    async def main():
        async with alice_for_bea(host, bea, tmp_path) as (h, pool):
            with anyio.fail_after(120):
                out["first"] = await sync_with_pool(pool, "alice")  # copy_list + one copy_fetch: 2
                try:
                    await sync_with_pool(pool, "alice")  # the bucket is empty
                except KithError as exc:
                    out["refused"] = exc.code
                out["answer"] = await Asker(pool).ask("alice", {"query": "temporary files", "topK": 3})
            out["reused"] = pool.stats.reused
            out["started"] = len(h.of("session-started"))
            out["ended"] = [e.get("code") or e.get("reason") for e in h.ended()]  # before the pool ends it

    anyio.run(main)
    assert out["first"]["fetched"] == 3
    assert out["refused"] == "copy-rate-limited"
    assert out["answer"]["action"] == "results" and out["answer"]["status"] == "rate-limited"  # the same session
    assert out["answer"]["retry_after_s"] >= 1
    assert out["started"] == 1 and out["reused"] >= 2, out
    assert out["ended"] == [], out
    assert len(CopyStore(bea, "alice").load()["documents"]) == 3  # the copy stays as last committed
