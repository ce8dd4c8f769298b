"""Signed citations and ``kith verify`` (issue 24 items 1-2): a guest saves an answer from a
real host over iroh on loopback, and ``kith verify`` in another home says which citations
are genuine, which were edited and which are stale; every bad input of the issue gets its
own verify result; a host without ``--sign-citations`` answers ``signing-off``."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from pathlib import Path

import anyio
import pytest

from node.answer import citation as C
from node.corpus.store import Corpus
from node.policy.store import Policy
from node.guest.guest import GuestOptions, ask, open_target
from node.trust import signing
from node.trust.identity import load_identity
from node.trust.invitation import parse_invitation
from node.trust.peers import PeerRegistry

from support.agents import api_headers, mcp_env
from support.cli import KITH
from support.homes import node_home as _home, public_host_home
from support.hosts import STEADY as CALM, InProcessHost
DOCS = {
    "deploy.md": "# Deploy\n\nThe staging server is deleted automatically every night at two.\n",
    "backup.md": "# Backup\n\nThe staging database keeps a nightly backup for a week.\n",
}


def _host_home(tmp: Path) -> tuple[Path, Path]:
    return public_host_home(tmp, DOCS), tmp / "kb"


async def _ask(host: InProcessHost, guest_home: Path, questions: list[str], *, citations: bool = True) -> list[dict]:
    target = await open_target(str(host.invite), guest_home, server_url=None)
    got: list[dict] = []
    options = GuestOptions(queries=tuple(questions), on_results=got.append, top_k=3,
                           filters={"citations": True} if citations else {})
    await ask(guest_home, load_identity(guest_home), target, options, local=True, heartbeat=CALM,
              timeout_s=60)
    key = target.invitation.host_public_key
    return [{**m, "peer": {"key": key, "name": None}} for m in got]  # as `kith join --json` saves it


def _verify(home: Path, answer: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run([*KITH, "--home", str(home), "verify", str(answer), "--json", *extra],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else {"stderr": proc.stderr})


def _save(path: Path, messages: list[dict]) -> Path:
    path.write_text("".join(json.dumps(m) + "\n" for m in messages))
    return path


def test_saved_answer_is_judged_genuine_edited_and_stale_in_another_home(tmp_path):
    host_home, kb = _host_home(tmp_path)
    guest_home = _home(tmp_path, "guest")
    checker = _home(tmp_path, "checker")

    async def scenario():
        host = InProcessHost(host_home, tmp_path, sign_citations=True, heartbeat=CALM)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            messages = await _ask(host, guest_home, ["when is the staging server deleted", "staging backup"])
            # the checker pins the host (and keeps its invitation, as `kith join --pin` does)
            inv = parse_invitation(host.invite.read_bytes())
            PeerRegistry.load(checker).add("docs", inv.host_public_key, invitation=inv.to_dict())
            answer = _save(tmp_path / "answer.jsonl", messages)
            code, report = await anyio.to_thread.run_sync(lambda: _verify(checker, answer))
            # one byte of one result's text changed → text-changed; the rest stay genuine
            edited = copy.deepcopy(messages)
            first = edited[0]["envelope"]["results"][0]
            first["textPreview"] = first["textPreview"].replace("night", "noon", 1)
            code_e, report_e = await anyio.to_thread.run_sync(
                lambda: _verify(checker, _save(tmp_path / "edited.jsonl", edited)))
            # the document changes on the host: its old citations are stale, not forged
            (kb / "deploy.md").write_text(DOCS["deploy.md"].replace("two", "three"))
            await anyio.to_thread.run_sync(lambda: Corpus(host_home).sync())
            code_s, report_s = await anyio.to_thread.run_sync(
                lambda: _verify(checker, answer, "--against-host", "--local"))
            host.stop.set()
        return messages, (code, report), (code_e, report_e), (code_s, report_s)

    messages, (code, report), (code_e, report_e), (code_s, report_s) = anyio.run(scenario, backend="asyncio")
    assert all(m["citations"] == "signed" for m in messages)
    results = [r for m in messages for r in m["envelope"]["results"]]
    assert results and all(r["citation"]["v"] == "kith-citation-v1" for r in results)
    cit = results[0]["citation"]
    assert cit["span"]["lines"] == [results[0]["provenance"]["location"]["lineStart"],
                                    results[0]["provenance"]["location"]["lineEnd"]]
    assert cit["span"]["chars"] is not None and cit["span"]["chars"][0] < cit["span"]["chars"][1]
    assert all(r["provenance"]["contentHash"] == "" for r in results)  # a guest never gets the bare hash
    # the version is the document's hash keyed with the host's secret, never the hash itself
    vkey = C.load_version_key(host_home, create=False)
    for r in results:
        doc = hashlib.sha256(DOCS[r["source"].rsplit("/", 1)[1]].encode()).hexdigest()
        assert r["citation"]["version"] == C.keyed_version(vkey, doc) != doc
    assert code == 0 and report["ok"] and {r["result"] for r in report["rows"]} == {"genuine"}
    assert all(r["peer"] == "docs" for r in report["rows"])
    assert code_e == 1 and [r["result"] for r in report_e["rows"]].count("text-changed") == 1
    assert report_e["counts"]["genuine"] == len(results) - 1
    assert code_s == 1
    by_source = {}
    for r in report_s["rows"]:
        by_source.setdefault(r["source"], set()).add(r["result"])
    assert by_source == {"/kb/deploy.md": {"stale"}, "/kb/backup.md": {"genuine"}}
    # a stale row says why, not what it said before the host was asked
    assert {r["detail"] for r in report_s["rows"] if r["result"] == "stale"} == {C.RESULTS["stale"]}


def test_a_host_without_sign_citations_answers_signing_off(tmp_path):
    host_home, _kb = _host_home(tmp_path)
    guest_home = _home(tmp_path, "guest")

    async def scenario():
        host = InProcessHost(host_home, tmp_path, heartbeat=CALM)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            asked = await _ask(host, guest_home, ["staging server"])
            plain = await _ask(host, guest_home, ["staging server"], citations=False)
            host.stop.set()
        return asked, plain

    asked, plain = anyio.run(scenario, backend="asyncio")
    assert asked[0]["status"] == "ok" and asked[0]["citations"] == "signing-off"
    assert asked[0]["envelope"]["results"] and all("citation" not in r for r in asked[0]["envelope"]["results"])
    assert "citations" not in plain[0]  # not asked: nothing said
    assert not (host_home / C.KEY_FILE).exists()  # no secret made for a host that never signs


# --- every bad input gets its own result (no session needed: the signer is the host's) ----

SEED = bytes([1]) * 32
OTHER = bytes([3]) * 32
VKEY = bytes([7]) * 32


def _signed(seed: bytes = SEED) -> dict:
    signer = C.CitationSigner(seed, VKEY, lambda ids: {i: C.Evidence("ab" * 32, 100, 180) for i in ids},
                              lambda: "2026-12-01T23:00:00Z")
    result = {"id": "c1", "source": "/kb/deploy.md", "textPreview": "The staging server is deleted.",
              "provenance": {"location": {"lineStart": 3, "lineEnd": 4, "headingPath": ["Deploy"]}}}
    out = signer.rewrite({"action": "results", "query_id": "q1", "status": "ok",
                          "envelope": {"results": [result]}}, {"action": "query", "citations": True})
    return out["envelope"]["results"][0]


def _judge(result: dict, expected: str | None = None, pinned: bool = True) -> str:
    host = signing.public_key_of(SEED)
    known = (lambda k: ("docs", None) if k == host else None) if pinned else None
    return C.verify_answer({"peer": {"key": expected or host}, "results": [result]}, known=known)[0].result


def _resign(result: dict, message: bytes, seed: bytes = SEED) -> dict:
    result["citation"]["signature"] = signing.sign(seed, message)
    return result


def test_each_bad_citation_has_its_own_result():
    good = _signed()
    assert _judge(copy.deepcopy(good)) == "genuine"
    assert _judge(copy.deepcopy(good), pinned=False) == "unpinned-key"
    bad_sig = copy.deepcopy(good)
    bad_sig["citation"]["signature"] = ("0" if good["citation"]["signature"][0] != "0" else "1") + good["citation"]["signature"][1:]
    assert _judge(bad_sig) == "bad-signature"
    changed = copy.deepcopy(good)
    changed["textPreview"] = changed["textPreview"].replace("d.", "d!")
    assert _judge(changed) == "text-changed"
    # another host signed it (its own key, its own valid signature): not the host the answer names
    other = _signed(OTHER)
    assert _judge(other) == "wrong-host"
    truncated = copy.deepcopy(good)
    truncated["provenance"]["location"]["lineEnd"] = 3  # the quote claims fewer lines than signed
    assert _judge(truncated) == "span-mismatch"
    moved = copy.deepcopy(good)  # the signed quote shown under another document's name
    moved["source"] = "/kb/other.md"
    assert _judge(moved) == "span-mismatch"
    cut = copy.deepcopy(good)
    cut["citation"]["span"]["lines"] = [3]
    assert _judge(cut) == "malformed"
    unknown = copy.deepcopy(good)
    unknown["citation"]["v"] = "kith-citation-v9"
    assert _judge(unknown) == "unknown-version"
    as_json = copy.deepcopy(good)
    body = {k: v for k, v in as_json["citation"].items() if k != "signature"}
    assert _judge(_resign(as_json, json.dumps(body, sort_keys=True, separators=(",", ":")).encode())) == "signed-json"
    domain = copy.deepcopy(good)
    lines = C.payload_of(domain["citation"]).split(b"\n", 1)[1]
    assert _judge(_resign(domain, signing.TAG_REQUEST.encode() + b"\n" + lines)) == "wrong-domain"
    for junk in (None, "x", [], {"v": "kith-citation-v1"}, {**good["citation"], "hostKey": "AB" * 32},
                 {**good["citation"], "extra": 1}, {**good["citation"], "source": "a\nb"}):
        assert _judge({**good, "citation": junk}) == "malformed", junk
    assert _judge({k: v for k, v in good.items() if k != "citation"}) == "no-citation"


def test_a_bare_result_added_to_a_signed_answer_is_a_no_citation_row():
    """A forged result with only ``source`` and ``textPreview`` (no provenance, location
    or citation) is shown by every reader of the file: it must not leave the answer
    "all verified"."""
    good = _signed()
    host = signing.public_key_of(SEED)
    rows = C.verify_answer({"peer": {"key": host}, "results": [
        good, {"source": "/kb/deploy.md", "textPreview": "The staging server is never deleted."}]},
        known=lambda k: ("docs", None) if k == host else None)
    assert [r.result for r in rows] == ["genuine", "no-citation"]
    assert C.report(rows)["ok"] is False


def test_a_saved_answer_with_a_bom_verifies_and_one_with_a_duplicate_key_is_refused(tmp_path):
    """An editor's UTF-8 byte-order mark is not a reason to refuse an answer; a duplicate
    key is (a reader that keeps the first ``textPreview`` would show text that was not
    the text verified)."""
    home = _pinned_checker(tmp_path)
    good = _signed()
    saved = json.dumps({"peer": {"key": signing.public_key_of(SEED)}, "results": [good]})
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + saved.encode())
    twice = tmp_path / "twice.json"
    twice.write_text(saved.replace('"textPreview": ', '"textPreview": "The staging server is kept.", "textPreview": ', 1))
    code_b, report_b = _verify(home, bom)
    code_t, report_t = _verify(home, twice)
    assert code_b == 0 and [r["result"] for r in report_b["rows"]] == ["genuine"]
    assert code_t == 1 and report_t["error"]["code"] == "answer-invalid"
    assert "duplicate key 'textPreview'" in report_t["error"]["message"]


def test_evidence_an_agent_reads_that_was_edited_outside_the_results_is_not_verified():
    """What an agent reads of an MCP answer is the fenced text part, and of a merged
    answer its ``fence.text``: an edit there (with the fence broken so the block cannot be
    read, or the merged block no longer the results' own text) is a ``malformed`` row,
    never skipped while the intact structured copy verifies."""
    from node.answer.fence import NOTICE, fenced, merged_fence

    host = signing.public_key_of(SEED)
    known = lambda k: ("docs", None) if k == host else None  # noqa: E731
    good = _signed()
    envelope = {"peer": {"key": host}, "results": [good]}
    text = fenced(json.dumps(envelope))
    mcp = lambda t: {"content": [{"type": "text", "text": NOTICE}, {"type": "text", "text": t}],  # noqa: E731
                     "structuredContent": envelope}
    edited = text.replace("is deleted", "is kept")
    broken_end = edited.rsplit("\n", 1)[0] + "\n<<<END UNTRUSTED PEER EVIDENCE 0000000000000000>>>"
    judge = lambda answer: sorted(r.result for r in C.verify_answer(answer, known=known))  # noqa: E731
    assert judge(mcp(text)) == ["genuine", "genuine"]
    assert judge(mcp(broken_end)) == ["genuine", "malformed"]
    assert judge(mcp(edited.rsplit("\n", 1)[0])) == ["genuine", "malformed"]  # no END line at all
    assert judge(mcp(text.replace('"results"', '"res', 1))) == ["genuine", "malformed"]  # not JSON inside
    merged = [{**good, "rank": 1, "peer": {"key": host, "name": "docs"}, "untrusted": True, "suspicious": False}]
    ask = {"kind": "kith-ask", "results": merged, "fence": merged_fence(merged)}
    assert judge(ask) == ["genuine"]
    forged = copy.deepcopy(ask)
    forged["fence"]["text"] = forged["fence"]["text"].replace("is deleted", "is kept")
    rows = C.verify_answer(forged, known=known)
    assert [r.result for r in rows] == ["genuine", "malformed"] and rows[1].where == "fence"
    assert C.report(rows)["ok"] is False


def test_results_beyond_the_limits_are_not_judged_and_the_answer_is_not_verified():
    """A file padded with copies of a genuine result past the row limit, or nesting one
    deeper than the walk goes, must not hide a forged result: the answer is not
    verified, and a row says why."""
    good = _signed()
    host = signing.public_key_of(SEED)
    forged = {**good, "textPreview": "The staging server is never deleted."}
    rows = C.verify_answer({"peer": {"key": host}, "results": [good] * C.MAX_CITATIONS + [forged]},
                           known=lambda k: ("docs", None) if k == host else None)
    assert len(rows) == C.MAX_CITATIONS + 1 and C.report(rows)["ok"] is False
    assert rows[-1].result == "malformed" and "not judged" in rows[-1].detail
    # nor can a forged result hide deeper than the walk goes
    deep: dict = {"source": "/kb/deploy.md", "textPreview": "The staging server is never deleted."}
    for _ in range(70):
        deep = {"more": deep}
    rows = C.verify_answer({"peer": {"key": host}, "results": [good], "extra": deep},
                           known=lambda k: ("docs", None) if k == host else None)
    assert [r.result for r in rows] == ["genuine", "malformed"] and C.report(rows)["ok"] is False


@pytest.mark.parametrize("offline", ["--offline", "--local"])
def test_against_host_says_how_to_pin_a_host_whose_invitation_is_not_kept(tmp_path, offline):
    """A host pinned by its key alone cannot be joined to ask: the row says so and how
    to pin it with its invitation (a new user pins with `kith peers add NAME KEY`).
    Offline mode is spelt ``--offline`` as on every other command (``--local`` still works)."""
    home = _pinned_checker(tmp_path)  # pinned by key, no invitation
    answer = tmp_path / "a.json"
    answer.write_text(json.dumps({"peer": {"key": signing.public_key_of(SEED)}, "results": [_signed()]}))
    code, report = _verify(home, answer, "--against-host", offline)
    assert code == 1 and [r["result"] for r in report["rows"]] == ["unchecked"]
    assert "--invite" in report["rows"][0]["detail"] and "kith join --pin" in report["rows"][0]["detail"]


def test_a_result_that_cannot_be_cited_leaves_uncited_and_the_rest_signed():
    signer = C.CitationSigner(SEED, VKEY, lambda ids: {i: ("ab" * 32, None, None) for i in ids if i != "gone"},
                              lambda: "2026-12-01T23:00:00Z")
    results = [{"id": i, "source": src, "textPreview": "t", "provenance": {"location": {}}}
               for i, src in (("c1", "/kb/a\nb.md"), ("gone", "/kb/b.md"), ("c3", "/kb/c.md"))]
    out = signer.rewrite({"action": "results", "query_id": "q1", "status": "ok", "envelope": {"results": results}},
                         {"action": "query", "citations": True})
    assert ["citation" in r for r in out["envelope"]["results"]] == [False, False, True]
    assert out["envelope"]["results"][2]["citation"]["span"] == {"lines": None, "pages": None, "chars": None}
    assert "citation" not in results[2]  # the hook's message is never modified


def test_the_payload_is_the_documented_lines():
    c = _signed()["citation"]
    payload = C.payload_of(c).decode()
    assert payload.split("\n") == [
        "kith-citation-v1", f"host_public_key:{signing.public_key_of(SEED)}", "source:/kb/deploy.md",
        f"version:{C.keyed_version(VKEY, 'ab' * 32)}", "span:lines=3-4 pages=- chars=100-180",
        f"text_sha256:{signing.sha256_hex(b'The staging server is deleted.')}", "signed_at:2026-12-01T23:00:00Z"]
    signing.verify(c["hostKey"], payload.encode(), c["signature"])


@pytest.mark.parametrize("content", [b"", b"not json {", b"\xff\xfe", b"[" * 100_000, b"{}\n{oops\n"])
def test_malformed_answer_files_exit_1_with_a_clear_error(tmp_path, content):
    home = _home(tmp_path, "checker")
    answer = tmp_path / "a.json"
    answer.write_bytes(content)
    proc = subprocess.run([*KITH, "--home", str(home), "verify", str(answer)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "answer-invalid" in proc.stderr and "Traceback" not in proc.stderr


def test_oversized_and_missing_files_exit_1_and_usage_exits_2(tmp_path):
    home = _home(tmp_path, "checker")
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(C.MAX_ANSWER_BYTES + 1)
    run = lambda *a: subprocess.run([*KITH, "--home", str(home), "verify", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=60)
    proc = run(str(big))
    assert proc.returncode == 1 and "answer-invalid" in proc.stderr and "8 MiB" in proc.stderr
    proc = run(str(tmp_path / "nope.json"))
    assert proc.returncode == 1 and "file-not-found" in proc.stderr
    assert run().returncode == 2
    empty = tmp_path / "empty.json"
    empty.write_text('{"results": []}')
    proc = run(str(empty))
    assert proc.returncode == 1 and "no results with citations" in proc.stdout


# --- the same verdicts from the local API and the MCP tool --------------------------------

def _pinned_checker(tmp_path: Path) -> Path:
    home = _home(tmp_path, "checker")
    PeerRegistry.load(home).add("docs", signing.public_key_of(SEED))
    return home


def _answer_with_one_edit() -> dict:
    good, edited = _signed(), _signed()
    edited["textPreview"] += " (edited)"
    return {"kind": "kith-ask", "results": [{**good, "peer": {"key": good["citation"]["hostKey"]}},
                                            {**edited, "peer": {"key": good["citation"]["hostKey"]}}]}


def test_post_verify_on_the_local_api(tmp_path):
    import httpx

    from node.local.api import run_api_in_thread

    home = _pinned_checker(tmp_path)
    answer = _answer_with_one_edit()
    with run_api_in_thread(home) as url, httpx.Client(timeout=30, headers=api_headers(home)) as http:
        ok = http.post(f"{url}/verify", json={"answer": answer})
        as_lines = http.post(f"{url}/verify", json={"answer": json.dumps(answer) + "\n"})
        bad = http.post(f"{url}/verify", json={"nope": 1})
        not_json = http.post(f"{url}/verify", content=b"{", headers={"content-type": "application/json"})
        plain = http.post(f"{url}/verify", content=b"{}", headers={"content-type": "text/plain"})
        put = http.put(f"{url}/verify", json={"answer": answer})
    assert ok.status_code == 200 and ok.json() == as_lines.json()
    assert [r["result"] for r in ok.json()["rows"]] == ["genuine", "text-changed"] and ok.json()["ok"] is False
    assert ok.json()["rows"][0]["peer"] == "docs"
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "answer-invalid"
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "answer-invalid"
    assert plain.status_code == 415 and put.status_code == 403


def test_mcp_verify_tool(tmp_path):
    import sys

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    home = _pinned_checker(tmp_path)
    answer = _answer_with_one_edit()
    params = StdioServerParameters(command=sys.executable, args=[
        "-c", f"from node.local.mcp import run_stdio; run_stdio({str(home)!r})"], env=mcp_env(home),
        cwd=str(Path(__file__).resolve().parents[1]))

    async def main():
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                tools = (await s.list_tools()).tools
                ok = await s.call_tool("verify", {"answer": answer})
                bad = await s.call_tool("verify", {"answer": "not json"})
                return tools, ok, bad

    tools, ok, bad = anyio.run(main)
    tool = next(t for t in tools if t.name == "verify")
    assert tool.annotations.read_only_hint is True
    assert not ok.is_error and [r["result"] for r in ok.structured_content["rows"]] == ["genuine", "text-changed"]
    assert bad.is_error and bad.content[0].text.startswith("[answer-invalid] ")


def test_kith_ask_keeps_each_peers_citation_for_verify(tmp_path):
    from node.guest.fanout import fan_out
    from node.guest.pool import SessionPool

    host_home, _kb = _host_home(tmp_path)
    guest = _home(tmp_path, "guest")

    async def scenario():
        host = InProcessHost(host_home, tmp_path, sign_citations=True, heartbeat=CALM)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            inv = parse_invitation(host.invite.read_bytes())
            PeerRegistry.load(guest).add("docs", inv.host_public_key, invitation=inv.to_dict())
            async with SessionPool(guest, load_identity(guest), local=True, heartbeat=CALM) as pool:
                env = await fan_out(pool, {"query": "staging server", "topK": 3, "citations": True}, ["docs"],
                                    timeout_s=30)
            host.stop.set()
        return env

    env = anyio.run(scenario, backend="asyncio")
    assert env["results"] and all("citation" in r for r in env["results"])
    rows = C.verify_answer(env, known=C.known_keys(guest))
    assert {r.result for r in rows} == {"genuine"}


def test_kith_join_json_lines_are_a_saved_answer_kith_verify_reads(tmp_path):
    host_home, _kb = _host_home(tmp_path)
    guest = _home(tmp_path, "guest")

    async def scenario():
        host = InProcessHost(host_home, tmp_path, sign_citations=True, heartbeat=CALM)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            proc = await anyio.to_thread.run_sync(lambda: subprocess.run(
                [*KITH, "--home", str(guest), "join", str(host.invite), "--local", "--trust", "--json",
                 "--citations", "--pin", "docs", "-q", "staging server deleted", "-q", "nightly backup"],
                capture_output=True, text=True, timeout=120))
            host.stop.set()
        return proc

    proc = anyio.run(scenario, backend="asyncio")
    assert proc.returncode == 0, proc.stderr
    saved = tmp_path / "answer.jsonl"
    saved.write_text(proc.stdout)
    code, report = _verify(guest, saved)  # the guest pinned the host with --pin
    assert code == 0 and report["ok"] and report["counts"]["genuine"] >= 2, report
    # the same file in a home that never pinned that host: the signatures hold, the key is unknown
    code, report = _verify(_home(tmp_path, "stranger"), saved)
    assert code == 1 and set(report["counts"]) == {"unpinned-key"}


def test_check_versions_says_current_stale_or_unknown_and_is_no_oracle(tmp_path):
    from node.host.host import open_knowledge

    host_home, kb = _host_home(tmp_path)
    (kb / "private").mkdir()
    (kb / "private" / "salary.md").write_text("# Salary\n\nThe secret figure.\n")
    with Corpus(host_home) as c:
        c.sync()
    policy = Policy.load(host_home)
    policy.set("/kb/private/**", "private")
    policy.save()
    vkey = C.load_version_key(host_home, create=True)
    digest = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in DOCS.items()}
    digest["salary.md"] = hashlib.sha256(b"# Salary\n\nThe secret figure.\n").hexdigest()
    knowledge = open_knowledge(host_home, lambda _m: None, version_key=vkey)
    try:
        handle = knowledge.handle_for(None, "b" * 64)
        answer = handle.check_versions([
            {"source": "/kb/deploy.md", "version": C.keyed_version(vkey, digest["deploy.md"])},
            {"source": "/kb/backup.md", "version": "0" * 64},
            {"source": "/kb/private/salary.md", "version": C.keyed_version(vkey, digest["salary.md"])},
            {"source": "/kb/nothing.md", "version": "0" * 64}])
        without_key = open_knowledge(host_home, lambda _m: None)
        try:
            off = without_key.handle_for(None, "b" * 64).check_versions([{"source": "/kb/deploy.md",
                                                                            "version": "0" * 64}])
        finally:
            without_key.close()
    finally:
        knowledge.close()
    assert answer["status"] == "ok"
    # a private document's true version and a document that does not exist: the same answer
    assert [v["state"] for v in answer["versions"]] == ["current", "stale", "unknown", "unknown"]
    assert off == {"status": "unavailable", "versions": [{"source": "/kb/deploy.md", "version": "0" * 64,
                                                          "state": "unknown"}]}


def test_check_versions_of_a_scrubbed_source_id_is_current_and_no_oracle_for_the_value(tmp_path):
    """A scrubbed peer is cited under the scrubbed source id (``/kb/[email]/notes.md``):
    asked about it, the host says ``current``, not ``stale``; asked about the id with the
    real value in it, it says ``unknown`` (as for a value that is not there), so a check
    cannot confirm a guessed e-mail address."""
    from node.host.host import open_knowledge

    host_home, kb = _host_home(tmp_path)
    text = "# Notes\n\nThe staging notes of the team.\n"
    (kb / "alice.smith@example.org").mkdir()
    (kb / "alice.smith@example.org" / "notes.md").write_text(text)
    with Corpus(host_home) as c:
        c.sync()
    policy = Policy.load(host_home)
    policy.set_scrub("public", ["email"])
    policy.save()
    vkey = C.load_version_key(host_home, create=True)
    with Corpus(host_home, readonly=True) as c:
        indexed = c.document_text("/kb/alice.smith@example.org/notes.md")
    assert indexed is not None
    # the version a scrubbed peer is given is over the text it receives (§2), not the content hash
    true = C.scrubbed_version(vkey, C.text_digest(indexed[1]))
    saved = C.keyed_version(vkey, hashlib.sha256(text.encode()).hexdigest())  # a citation saved before: stale
    knowledge = open_knowledge(host_home, lambda _m: None, version_key=vkey)
    try:
        shown = knowledge.handle_for(None, "b" * 64).search(
            {"query": "staging notes team", "topK": 5})["envelope"]["results"]
        answer = knowledge.handle_for(None, "b" * 64).check_versions([
            {"source": "/kb/[email]/notes.md", "version": true},
            {"source": "/kb/[email]/notes.md", "version": saved},
            {"source": "/kb/alice.smith@example.org/notes.md", "version": "0" * 64},
            {"source": "/kb/bob@example.org/notes.md", "version": "0" * 64},
            {"source": "/kb/deploy.md", "version": "0" * 64}])
    finally:
        knowledge.close()
    assert "/kb/[email]/notes.md" in [r["source"] for r in shown]  # what the peer is cited under
    assert [v["state"] for v in answer["versions"]] == ["current", "stale", "unknown", "unknown", "stale"]


def test_mcp_search_of_a_peer_with_citations_gives_an_answer_verify_accepts(tmp_path):
    from node.local.mcp import call_search, call_verify

    host_home, _kb = _host_home(tmp_path)
    guest = _home(tmp_path, "guest")

    async def scenario():
        host = InProcessHost(host_home, tmp_path, sign_citations=True, heartbeat=CALM)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            inv = parse_invitation(host.invite.read_bytes())
            PeerRegistry.load(guest).add("docs", inv.host_public_key, invitation=inv.to_dict())
            signed = await call_search(guest, {"query": "staging server", "topK": 3, "peer": "docs",
                                               "citations": True}, local=True)
            own = await call_search(guest, {"query": "staging server", "citations": True}, local=True)
            bad = await call_search(guest, {"query": "staging server", "peer": "docs", "citations": "yes"},
                                    local=True)
            host.stop.set()
        return signed, own, bad

    signed, own, bad = anyio.run(scenario, backend="asyncio")
    assert not signed.is_error and signed.structured_content["results"]
    # the tool answer as an agent would save it: its text contents, JSON inside
    saved = {"content": [{"type": "text", "text": c.text} for c in signed.content]}
    report = call_verify(guest, {"answer": saved}).structured_content
    assert report["ok"] and set(report["counts"]) == {"genuine"}
    assert own.is_error and own.content[0].text.startswith("[query-invalid] ")
    assert bad.is_error and "citations" in bad.content[0].text


def test_a_scrubbed_peers_citation_keeps_its_version_when_only_a_scrubbed_value_is_edited(tmp_path):
    """Over a real host (iroh, loopback): a pinned peer whose lens scrubs e-mail addresses is
    cited with the version of the text it receives (specs/citations.md §2), so an edit of
    the address alone gives the same version again, and an edit of text it sees another."""
    docs = {"mail.md": "# Mail\n\nWhen the staging server fails, mail ops@example.com at once.\n"}
    host_home = public_host_home(tmp_path, docs)
    kb = tmp_path / "kb"
    guest_home = _home(tmp_path, "guest")
    PeerRegistry.load(host_home).add("bea", load_identity(guest_home).public_key)  # scrubbed for bea by name
    policy = Policy.load(host_home)
    policy.set_scrub("bea", ["email"])
    policy.save()

    async def edit(old: str, new: str) -> None:
        path = kb / "mail.md"
        path.write_text(path.read_text().replace(old, new))
        await anyio.to_thread.run_sync(lambda: Corpus(host_home).sync())

    async def cited() -> dict:
        (message,) = await _ask(host, guest_home, ["when the staging server fails"])
        (result,) = [r for r in message["envelope"]["results"] if r["source"] == "/kb/mail.md"]
        assert "@example" not in result["textPreview"]
        return result["citation"]

    async def scenario():
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            first = await cited()
            await edit("ops@example.com", "night-desk@example.org")
            same = await cited()
            await edit("at once", "within the hour")
            other = await cited()
            host.stop.set()
        return first, same, other

    host = InProcessHost(host_home, tmp_path, sign_citations=True, heartbeat=CALM)
    first, same, other = anyio.run(scenario, backend="asyncio")
    vkey = C.load_version_key(host_home, create=False)
    assert vkey is not None
    with Corpus(host_home, readonly=True) as c:
        indexed = c.document_text("/kb/mail.md")
    assert indexed is not None
    from node.common.scrub import scrub
    assert other["version"] == C.scrubbed_version(vkey, C.text_digest(scrub(indexed[1], ["email"])))
    assert first["version"] == same["version"] != other["version"]
    raw = hashlib.sha256((kb / "mail.md").read_bytes()).hexdigest()
    assert other["version"] != C.keyed_version(vkey, raw)
