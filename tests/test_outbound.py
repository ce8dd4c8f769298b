"""Issue 41 items 3-4: the outbound gate sees what leaves before it leaves
(node/policy/outbound.py, specs/agents.md §5-§6).

Through a real HTTP server on 127.0.0.1 and the real ``kith mcp`` stdio server: an agent's
question to a peer that carries 12+ words of a source hidden from that peer, a personal
value or a secret is held, and the agent's rule decides (allow / ask / block); every
decision, and what came back, is in the 0600 outbound log ``kith sent`` reads. The peer
``alice`` is pinned under a key nobody holds: a question that passes the gate is sent and
refused there at once, one that is held never reaches the fan-out.
"""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import StdioServerParameters

from node.common.errors import EgressRefused
from node.corpus.store import Corpus
from node.local.agents import TOKEN_ENV
from node.local.api import run_api_in_thread
from node.policy import outbound

from support.agents import agent_token, bearer, mcp_session
from support.cli import KITH
from support.homes import initialized, new_identity

REPO = Path(__file__).resolve().parents[1]
HTTP = httpx.Client(timeout=60)
PLANS = ("The merger with the northern cooperative will be announced to staff only after the board "
         "signs the final agreement in March, and until then nobody outside the finance group may hear of it.")
HANDBOOK = ("Visitors sign in at the front desk and wear the green badge for the whole visit, even in the "
            "canteen and the car park, and return it at the desk when they leave the building.")
#: 14 words of PLANS with case, punctuation and a line break changed
QUOTE_PRIVATE = "Did you hear?  THE merger, with the Northern\ncooperative — will be announced to staff only after the board..."
#: 14 words of HANDBOOK (public for everyone)
QUOTE_PUBLIC = "Is it true that visitors sign in at the front desk and wear the green badge for the whole visit?"
#: 10 words of PLANS: under the span
QUOTE_SHORT = "what does 'announced to staff only after the board signs the final' mean"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("outbound")
    root = base / "kb"
    (root / "private").mkdir(parents=True)
    (root / "public").mkdir()
    (root / "private" / "plans.md").write_text(f"# Plans\n\n{PLANS}\n")
    (root / "public" / "handbook.md").write_text(f"# Handbook\n\n{HANDBOOK}\n")
    h = initialized(base / "home")
    with Corpus(h) as c:
        c.add_root(root)
        c.sync()
    out = subprocess.run([*KITH, "--home", str(h), "policy", "set", "/kb/public/**", "public", "--yes"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    from node.trust.peers import PeerRegistry

    PeerRegistry.load(h).add("alice", new_identity().public_key)
    return h


@pytest.fixture(scope="module")
def api(home: Path):
    with run_api_in_thread(home, offline=True) as url:
        yield url


def _ask(url: str, token: str, query: str) -> httpx.Response:
    return HTTP.post(url + "/search", json={"query": query, "peers": ["alice"]}, headers=bearer(token))


def _last(home: Path, agent: str) -> dict:
    return outbound.read_log(home, agent=agent)[-1]


def test_block_holds_private_text_values_and_secrets_and_names_no_text(home: Path, api: str) -> None:
    token = agent_token(home, "blocker", peers=("alice",), outbound="block")
    held = _ask(api, token, QUOTE_PRIVATE)
    assert held.status_code == 403
    err = held.json()["error"]
    assert err["code"] == "outbound-held" and "/kb/private/plans.md" in err["message"]
    assert "merger" not in err["message"].lower() and "cooperative" not in err["message"].lower()
    row = _last(home, "blocker")
    assert row["decision"] == "blocked" and row["holds"] == [
        {"kind": "private-text", "source": "/kb/private/plans.md", "peer": "alice"}]
    assert row["result"] is None  # nothing was sent, nothing came back
    for query, kind in (("mail me at jo.smith@example.org about the plan", "email"),
                        ("is AKIAIOSFODNN7EXAMPLE still the key we use", "secret")):
        r = _ask(api, token, query)
        assert r.status_code == 403 and kind in r.json()["error"]["message"]
    # what may leave does: public text, a short quote, a plain question
    for query in (QUOTE_PUBLIC, QUOTE_SHORT, "when is the staff meeting"):
        r = _ask(api, token, query)
        assert r.status_code == 200, (query, r.text)
        row = _last(home, "blocker")
        assert row["decision"] == "sent" and row["holds"] == [] and row["result"]["peers"] == {"alice": "refused"}


def test_ask_needs_the_owner_and_approve_releases_one_identical_retry(home: Path, api: str) -> None:
    token = agent_token(home, "asker", peers=("alice",), outbound="ask")
    first = _ask(api, token, QUOTE_PRIVATE)
    assert first.status_code == 403 and first.json()["error"]["code"] == "outbound-needs-confirmation"
    qid = first.json()["error"]["message"].rsplit("id ", 1)[1]
    other = _ask(api, token, QUOTE_PRIVATE + " Really?")  # another question is not released
    out = subprocess.run([*KITH, "--home", str(home), "sent", "approve", qid, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["approved"] == qid
    assert other.json()["error"]["code"] == "outbound-needs-confirmation"
    again = _ask(api, token, QUOTE_PRIVATE)
    assert again.status_code == 200, again.text
    row = _last(home, "asker")
    assert row["id"] == qid and row["decision"] == "approved" and row["result"]["peers"] == {"alice": "refused"}
    assert _ask(api, token, QUOTE_PRIVATE).json()["error"]["code"] == "outbound-needs-confirmation"  # once
    gone = subprocess.run([*KITH, "--home", str(home), "sent", "approve", "0123456789abcdef"],
                          capture_output=True, text=True, timeout=120)
    assert gone.returncode == 1 and "outbound-not-pending" in gone.stderr


def test_allow_sends_and_logs_the_hold(home: Path, api: str) -> None:
    token = agent_token(home, "allower", peers=("alice",), outbound="allow")
    assert _ask(api, token, QUOTE_PRIVATE).status_code == 200
    row = _last(home, "allower")
    assert row["decision"] == "allowed" and row["holds"][0]["source"] == "/kb/private/plans.md"
    assert row["text"] == QUOTE_PRIVATE and row["peers"] == ["alice"]
    assert stat.S_IMODE((home / "sent.jsonl").stat().st_mode) == 0o600
    listed = subprocess.run([*KITH, "--home", str(home), "sent", "--agent", "allower", "--peer", "alice", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert [r["decision"] for r in json.loads(listed.stdout)["sent"]] == ["allowed"]


def test_a_terminal_prompt_that_gets_no_answer_denies(home: Path) -> None:
    with pytest.raises(EgressRefused) as e:
        outbound.gate(home, {"query": QUOTE_PRIVATE}, ["alice"], actor=outbound.OWNER, rule="ask",
                      confirm=lambda holds: None)
    assert e.value.code == "outbound-held"
    assert _last(home, outbound.OWNER)["decision"] == "denied-timeout"
    ticket = outbound.gate(home, {"query": QUOTE_PRIVATE}, ["alice"], actor=outbound.OWNER, rule="ask",
                           confirm=lambda holds: True)
    assert ticket.decision == "confirmed"


def test_mcp_tools_pass_the_same_gate(home: Path) -> None:
    env = {**os.environ, TOKEN_ENV: agent_token(home, "mcp-asker", peers=("alice",), queue=True, outbound="ask")}

    async def calls(s):
        return [await s.call_tool("search", {"query": QUOTE_PRIVATE, "peers": ["alice"]}),
                await s.call_tool("search", {"query": QUOTE_PRIVATE, "peer": "alice"}),
                await s.call_tool("ask_later", {"query": QUOTE_PRIVATE, "peers": ["alice"]})]

    for res in mcp_session(home, calls, env=env):
        assert res.is_error and res.content[0].text.startswith("[outbound-needs-confirmation] ")
    assert [r["decision"] for r in outbound.read_log(home, agent="mcp-asker")] == ["needs-confirmation"] * 3


def test_kith_ask_without_a_terminal_needs_yes(home: Path) -> None:
    argv = [*KITH, "--home", str(home), "ask", QUOTE_PRIVATE, "--peer", "alice", "--offline", "--timeout", "2"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "outbound-needs-confirmation" in out.stderr and "kith sent approve" in out.stderr
    assert _last(home, outbound.OWNER)["decision"] == "needs-confirmation"
    out = subprocess.run([*argv, "--yes"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    row = _last(home, outbound.OWNER)
    assert row["decision"] == "confirmed" and row["result"] is not None, out.stderr


def test_every_sender_of_the_doors_and_the_cli_passes_the_gate() -> None:
    """A function of node/local or node/cli that sends a question to peers (the fan-out,
    one peer's search, a guest session) must also call the gate: a new sender without it
    fails here."""
    senders = {"peers_search", "peer_search", "fan_out", "ask"}
    gates = {"gate", "door_gate"}
    missing = []
    for folder in ("local", "cli"):
        for path in sorted((REPO / "node" / folder).glob("*.py")):
            tree = ast.parse(path.read_text())
            for fn in [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]:
                called = {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                          for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))}
                defined = {d.name for d in ast.walk(fn) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
                named = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}  # run_sync(door_gate, ...)
                sends = (called & senders) - defined
                if sends and not (called | named) & gates and fn.name not in ("peer_search",):
                    missing.append(f"{path.name}:{fn.name} calls {sorted(sends)}")
    assert not missing, missing
    # the outbox's later delivery (node/guest: one call site) logs through the same gate
    deliver = next(n for n in ast.walk(ast.parse((REPO / "node" / "guest" / "outbox_task.py").read_text()))
                   if isinstance(n, ast.AsyncFunctionDef) and n.name == "_deliver")
    assert {c.func.id for c in ast.walk(deliver) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)} >= {"gate"}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_mcp_asks_the_person_through_elicitation_when_the_client_can(home: Path, mode: str) -> None:
    """Under ``ask``, a client that declares elicitation is asked (2026-07-28:
    ``input_required``; 2025-11-25: ``elicitation/create``): declined, nothing is sent;
    accepted, the question is sent once."""
    from mcp import types
    from mcp.client.client import Client

    agent = f"mcp-elicit-{mode}"
    env = {**os.environ, TOKEN_ENV: agent_token(home, agent, peers=("alice",), outbound="ask")}
    params = StdioServerParameters(command=sys.executable, cwd=str(REPO), env=env,
                                   args=["-c", f"from node.local.mcp import run_stdio; run_stdio({str(home)!r})"])
    answers = iter([False, True])
    asked: list[str] = []

    async def elicit(_context, p):
        asked.append(p.message)
        return types.ElicitResult(action="accept", content={"send": next(answers)})

    async def main():
        async with Client(params, mode=mode, elicitation_callback=elicit) as c:
            return [await c.call_tool("search", {"query": QUOTE_PRIVATE + f" ({mode})", "peers": ["alice"]}),
                    await c.call_tool("search", {"query": QUOTE_PRIVATE + f" ({mode})", "peers": ["alice"]})]

    declined, accepted = anyio.run(main)
    assert len(asked) == 2 and "/kb/private/plans.md" in asked[0] and "merger" not in asked[0].lower()
    assert declined.is_error and declined.content[0].text.startswith("[outbound-held] ")
    assert not accepted.is_error, accepted.content
    decisions = [r["decision"] for r in outbound.read_log(home, agent=agent)]
    assert decisions == ["denied", "needs-confirmation", "approved"], decisions  # held, asked, released
    assert outbound.read_log(home, agent=agent)[-1]["result"]["peers"] == {"alice": "refused"}


@pytest.mark.parametrize("reply, decision", [("n\n", "denied"), ("y\n", "confirmed")])
def test_kith_ask_at_a_terminal_asks_the_owner(home: Path, reply: str, decision: str) -> None:
    """On a pseudo-terminal the owner is asked ``[y/N]``, told the kinds and sources (never
    the text): no sends nothing (exit 1, ``outbound-held``), yes sends it."""
    from support.terminal import in_pty

    question = QUOTE_PRIVATE + f" [{decision}]"
    out, code = in_pty([*KITH, "--home", str(home), "ask", question, "--peer", "alice", "--offline",
                        "--timeout", "2"], columns=120, replies=[("send it anyway? [y/N]", reply)])
    assert "private-text from /kb/private/plans.md" in out and "send it anyway? [y/N]" in out
    row = _last(home, outbound.OWNER)
    assert row["text"] == question and row["decision"] == decision
    if decision == "denied":
        assert code == 1 and "outbound-held" in out and row["result"] is None
    else:
        assert row["result"] is not None  # sent; alice (a key nobody holds) refused it


def test_the_log_rotates_as_the_audit_and_reads_across_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbound, "MAX_LOG_BYTES", 2000)
    h = tmp_path / "h"
    h.mkdir()
    for i in range(80):
        outbound.gate(h, {"query": f"question number {i} about the weather"}, ["alice"], actor="bot", rule="allow")
    files = outbound.log_files(h)
    assert [p.name for p in files] == ["sent.jsonl.3", "sent.jsonl.2", "sent.jsonl.1", "sent.jsonl"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 and p.stat().st_size <= 2000 for p in files)
    rows = outbound.read_log(h, agent="bot")
    assert rows[-1]["text"] == "question number 79 about the weather" and len(rows) < 80  # the oldest dropped
    assert outbound.read_log(h, since="2999-01-01") == [] and outbound.read_log(h, peer="bob") == []
    out = subprocess.run([*KITH, "--home", str(initialized(tmp_path / "k")), "sent", "--since", "1h", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout) == {"sent": []}


def test_kith_join_gates_each_query_before_connecting(home: Path, tmp_path: Path) -> None:
    """``kith join --query``: without a terminal and ``--yes`` a held question is refused
    before anything is sent; with ``--yes`` it is sent and what came back is logged."""
    from support.cli import readline
    from support.homes import pin_host, public_host_home

    host_home = public_host_home(tmp_path, {"weather.md": "# Weather\n\nIt rains on Tuesdays in the valley.\n"},
                                 kb="kb-host")
    invite = tmp_path / "invite.json"
    proc = subprocess.Popen([*KITH, "--home", str(host_home), "host", "--local", "--json", "--invite-file", str(invite)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        json.loads(readline(proc, 60))
        pin_host(home, "valley", invite)
        argv = [*KITH, "--home", str(home), "join", "--peer", "valley", "--query", QUOTE_PRIVATE + " (join)", "--offline"]
        held = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert held.returncode == 1 and "outbound-needs-confirmation" in held.stderr, held.stderr
        row = _last(home, outbound.OWNER)
        assert row["decision"] == "needs-confirmation" and row["peers"] == ["valley"] and row["result"] is None
        sent = subprocess.run([*argv, "--yes"], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        assert sent.returncode == 0, sent.stderr
        row = _last(home, outbound.OWNER)
        assert row["decision"] == "confirmed" and row["result"]["status"] in ("ok", "no-verified-results"), row
    finally:
        proc.kill()
        proc.wait()


def _disguised(text: str, joiner: str) -> str:
    """``text`` with ``joiner`` inside every word longer than three letters."""
    return " ".join(w[:2] + joiner + w[2:] if len(w) > 3 else w for w in text.split())


@pytest.mark.parametrize("how", ["zero-width space", "soft hyphen", "word joiner", "byte order mark",
                                 "underscores"])
def test_invisible_characters_or_underscores_do_not_smuggle_private_text_past_the_check(
        home: Path, api: str, how: str) -> None:
    """Words are compared with punctuation as a separator: an invisible format character
    (U+200B, U+00AD, U+2060, U+FEFF) inside each word — which a reader never sees — or
    words joined by underscores must not hide 12+ words of a private note from the check."""
    token = agent_token(home, "smuggler", peers=("alice",), outbound="block")
    quote = PLANS.split(", and until")[0]  # 23 words of the private note
    query = {"zero-width space": _disguised(quote, "\u200b"), "soft hyphen": _disguised(quote, "\u00ad"),
             "word joiner": _disguised(quote, "\u2060"), "byte order mark": _disguised(quote, "\ufeff"),
             "underscores": quote.replace(" ", "_")}[how]
    r = _ask(api, token, query)
    assert r.status_code == 403 and r.json()["error"]["code"] == "outbound-held", r.text
    assert "/kb/private/plans.md" in r.json()["error"]["message"]
    # the same words with ordinary spaces and an identifier of a public page still pass
    assert _ask(api, token, "what does snake_case_name mean in the handbook").status_code == 200


def test_private_text_in_the_mcp_peer_or_server_field_is_gated_before_any_request(home: Path) -> None:
    """``search`` with ``peer`` (a post_id) and ``server``: the server URL is fetched before
    the peer is reached, so 12+ words of a private note put into its path (or into an
    invitation given as ``peer``) would leave this node ungated and unlogged. The gate reads
    them: held under ``block``, and the listener at that URL gets no request at all."""
    import http.server
    import threading

    seen: list[str] = []

    class Record(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.path)
            self.send_error(404)

        def log_message(self, *args) -> None:
            pass

    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Record)
    thread = threading.Thread(target=listener.serve_forever, daemon=True)
    thread.start()
    words = "-".join(PLANS.split()[:16]).strip(",.")
    server = f"http://127.0.0.1:{listener.server_address[1]}/{words}"
    invitation = {"v": 1, "post_id": "ab" * 16, "server": server, "note": PLANS}
    env = {**os.environ, TOKEN_ENV: agent_token(home, "mcp-url", peers=("all",), outbound="block")}

    async def calls(s):
        return [await s.call_tool("search", {"query": "hello", "peer": "ab" * 16, "server": server}),
                await s.call_tool("search", {"query": "hello", "peer": invitation})]

    try:
        results = mcp_session(home, calls, env=env)
    finally:
        listener.shutdown()
        listener.server_close()
    for res in results:
        assert res.is_error and res.content[0].text.startswith("[outbound-held] "), res.content[0].text
        assert "/kb/private/plans.md" in res.content[0].text
    assert seen == []
    assert [r["decision"] for r in outbound.read_log(home, agent="mcp-url")] == ["blocked", "blocked"]


def test_a_hold_nobody_approved_in_time_reads_as_denied_in_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ask`` without a person: the held question waits :data:`APPROVAL_TTL_S` for ``kith
    sent approve``, then it is denied — and ``kith sent`` must say so, not show it waiting
    forever; one that was approved and retried is not called denied."""
    h = tmp_path / "h"
    h.mkdir()
    secret = {"query": "mail jo.smith@example.org the minutes"}
    released = {"query": "mail ann.lee@example.org the minutes"}
    for body in (secret, released):
        with pytest.raises(EgressRefused):
            outbound.gate(h, body, ["alice"], actor="bot", rule="ask")
    qid = outbound.read_log(h)[-1]["id"]
    outbound.approve(h, qid)
    assert outbound.gate(h, released, ["alice"], actor="bot", rule="ask").decision == "approved"
    assert [r["decision"] for r in outbound.read_log(h)] == ["needs-confirmation", "needs-confirmation", "approved"]
    monkeypatch.setattr(outbound, "APPROVAL_TTL_S", 0)  # the 15 minutes have passed
    assert [r["decision"] for r in outbound.read_log(h)] == ["denied-timeout", "needs-confirmation", "approved"]


@pytest.mark.parametrize("damage", [b"KITHFP2\n{\"generation\": 1, \"count\": 99999}\nxx", b"KITHFP2\nnot json",
                                    b"KITHFP2\n[1]\n", b""])
def test_a_damaged_fingerprint_file_is_rewritten_not_an_error_on_every_question(
        home: Path, api: str, damage: bytes) -> None:
    """``outbound.fp`` cut short, or not ours (a copied home, a disk error): the check
    rewrites it from the corpus, as it does an outdated one, and still holds private text —
    instead of answering every question to a peer with a 500 until the next sync."""
    token = agent_token(home, "after-damage", peers=("alice",), outbound="block")
    (home / outbound.FINGERPRINT_FILE).write_bytes(damage)
    r = _ask(api, token, QUOTE_PRIVATE)
    assert r.status_code == 403 and r.json()["error"]["code"] == "outbound-held", r.text
    assert _ask(api, token, "when is the staff meeting").status_code == 200


@pytest.mark.parametrize("since", ["2026-13-45", "2026-02-30T25:61:00Z"])
def test_kith_sent_refuses_a_since_that_is_no_real_date(tmp_path: Path, since: str) -> None:
    """``--since 2026-13-45`` used to filter by string comparison and print "nothing was
    sent" — a typo read as an empty log."""
    out = subprocess.run([*KITH, "--home", str(initialized(tmp_path / "k")), "sent", "--since", since],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--since" in out.stderr and "nothing was sent" not in out.stdout, out


def _notes(folder: Path, files: int, seed: int) -> None:
    """``files`` notes of ~30 random words a line, 60 lines each (a few chunks per file)."""
    import random

    rnd = random.Random(seed)
    vocab = [f"w{i}" for i in range(4000)]
    folder.mkdir(parents=True)
    for f in range(files):
        lines = [" ".join(rnd.choices(vocab, k=30)) for _ in range(60)]
        (folder / f"n{f}.txt").write_text("\n".join(lines) + "\n")


def _written(home: Path) -> tuple[bytes, int]:
    """``(outbound.fp's bytes, peak bytes Python allocated while writing it)``."""
    import tracemalloc

    tracemalloc.start()
    try:
        outbound.write_fingerprints(home)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (home / outbound.FINGERPRINT_FILE).read_bytes(), peak


def test_fingerprints_of_a_corpus_four_times_larger_take_no_more_memory_and_hold_its_text(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprints were one Python pair per kept hash, all in memory until written:
    3.49 GB of RSS in `kith index sync` at 1M chunks. Sorted a run at a time and merged,
    writing them holds about one run whatever the corpus's size, and the file is the same
    bytes as one sort of everything — the check still holds a private page's text."""
    h = initialized(tmp_path / "home")
    _notes(tmp_path / "kb" / "a", 20, seed=1)
    with Corpus(h) as c:
        c.add_root(tmp_path / "kb")
        c.sync()
    monkeypatch.setattr(outbound, "SORT_RUN", 2048)
    small, small_peak = _written(h)
    _notes(tmp_path / "kb" / "b", 60, seed=2)
    with Corpus(h) as c:
        c.sync()
    monkeypatch.setattr(outbound, "SORT_RUN", 1 << 30)  # one run: everything sorted at once
    whole, _ = _written(h)
    monkeypatch.setattr(outbound, "SORT_RUN", 2048)
    runs, large_peak = _written(h)
    assert runs == whole
    count = json.loads(runs[len(b"KITHFP2\n"):runs.index(b"\n", 8)])["count"]
    assert count > 8 * outbound.SORT_RUN  # many runs merged
    assert len(small) < len(runs) / 3
    # about one run's keys held, not the corpus's: less than even 8 bytes per kept hash
    assert large_peak < 1.25 * small_peak and large_peak < 8 * count, (small_peak, large_peak, count)
    text = (tmp_path / "kb" / "b" / "n59.txt").read_text().splitlines()[-1]
    holds = outbound.check(h, text, [None])
    assert [(x.kind, x.source) for x in holds] == [("private-text", "/kb/b/n59.txt")]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not-an-object", "folder", "unreadable"])
def test_approve_on_a_damaged_approvals_file_names_the_damage_and_its_way_out(tmp_path: Path, damage: str) -> None:
    """`kith sent approve ID` over a ``sent-approvals.json`` that does not read is refused
    with the damage named (``config-invalid``, or ``io-error`` for a folder in its place or
    a file it may not read) and the ``mv`` that moves it aside — never "no held question is
    waiting" — and the file is left as it was; once moved aside, approve answers as usual."""
    home = initialized(tmp_path / "home")
    path = home / outbound.APPROVALS_FILE
    whole = json.dumps({"ab" * 8: {"agent": "asker", "peers": ["alice"], "holds": [], "approved": False,
                                   "expires": 4102444800}}).encode()
    if damage == "garbage":
        path.write_bytes(bytes((i * 97 + 13) % 256 for i in range(500)))
    elif damage == "truncated":
        path.write_bytes(whole[: len(whole) // 2])
    elif damage == "not-an-object":
        path.write_text('["ab", 1]\n')
    elif damage == "folder":
        path.mkdir()
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads a file whatever its mode")
        path.write_bytes(whole)
        path.chmod(0)
    before = path.read_bytes() if path.is_file() and damage != "unreadable" else None
    r = subprocess.run([*KITH, "--home", str(home), "sent", "approve", "ab" * 8], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "outbound-not-pending" not in r.stderr, r.stderr
    code = "io-error" if damage in ("folder", "unreadable") else "config-invalid"
    assert f"error [{code}]" in r.stderr and "sent-approvals.json" in r.stderr, r.stderr
    if damage != "unreadable":  # unreadable is not damaged: never moved aside
        assert f"`mv {path} {path}.bad`" in r.stderr, r.stderr
        assert before is None or path.read_bytes() == before
        path.rename(path.with_name(path.name + ".bad"))
        r = subprocess.run([*KITH, "--home", str(home), "sent", "approve", "ab" * 8], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 1 and "error [outbound-not-pending]" in r.stderr, r.stderr
