"""The policy / peers / approvals layer as a running host and the CLI apply it.

1. a running host applies the *current* policy.toml to every query (rules and quotas);
2. peer-supplied text printed by `kith approvals list` / `kith peers list` carries no
   terminal escapes (table cells included);
3. `kith policy set --for/--peer` refuse names that can never be registry names;
4. `deny|approve --remember` settles the peer's other pending requests for those sources;
5. the `ask` probe and the request-file caps are documented (specs) and the caps hold;
6. a claimed displayName that only *looks* like a pinned name (Cyrillic е) is refused.

Real corpus (SQLite + tantivy), real files, real iroh on loopback for (1); no mocks.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from support.cli import invoke, readline
from support.homes import indexed_docs
from node.cli.common import _UntrustedConsole
from node.answer.envelope import empty_envelope
from node.answer.contract import validate as validate_search_request
from node.corpus.store import Corpus
from node.common.errors import PolicyError
from node.trust.peers import PeerRegistry
from node.policy.approvals import MAX_PENDING_PER_PEER, MAX_PENDING_TOTAL, Approvals
from node.policy.gate import EgressGate
from node.answer.service import peer_knowledge
from node.policy.quota import RateLimiter
from node.policy.store import Policy

ALICE, BOB = "a1" * 32, "b2" * 32
ROOT = Path(__file__).resolve().parents[1]

DOCS = {
    "public/intro.md": "# Intro\n\nHow the temporary directory cleanup works in our tools.\n",
    "ask/salary.md": "# Salary review\n\nThe salary bands for next year and the bonus pool.\n",
    "ask/bonus.md": "# Bonus\n\nThe bonus pool rules and the payout calendar.\n",
}
Q = "temporary directory cleanup"
#: every byte a terminal would act on: CSI, OSC 8 hyperlink (ESC and BEL), C1 CSI, bidi
#: override/isolate, backspace/CR; plus rich markup and an emoji code that must stay text
HOSTILE = ("[link=http://e.x]hi[/link] :smile: sal\x1b[2J\x1b]8;;http://e/\x07c\x1b]8;;\x07"
           "\x9b31m\u202eev\u202c\u2066x\u2069\b\r end")
BAD_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def cli():
    return lambda home, *args, env=None: invoke(home, *args, env={"COLUMNS": "300", **(env or {})})


def _write_policy(home: Path, text: str) -> None:
    """Replace policy.toml the way an editor or `kith policy set` does (new file, rename)."""
    tmp = home / "policy.toml.tmp"
    tmp.write_text(text)
    os.replace(tmp, home / "policy.toml")


# --- 1. the current policy applies to every query (in process, real corpus) ----------------------


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return indexed_docs(tmp_path_factory.mktemp("rf"), DOCS)


@pytest.fixture
def live(indexed):
    """A gate over the shared index whose policy.toml the test may rewrite."""
    home, _ = indexed
    _write_policy(home, "[[rule]]\nglob = '/docs/**'\ntier = 'public'\n")
    corpus = Corpus(home, readonly=True)
    gate = EgressGate(corpus.roots(), Policy.load(home), home)
    yield home, corpus, gate
    corpus.close()
    (home / "policy.toml").unlink(missing_ok=True)


def _expected(status: str, query: str = Q) -> dict:
    return empty_envelope(status, validate_search_request({"query": query, "topK": 5}))


def test_tightened_policy_applies_to_the_next_query_of_the_same_handle(live) -> None:
    home, corpus, gate = live
    handle = peer_knowledge(corpus, gate, "alice", peer_key=ALICE, limiter=RateLimiter())
    first = handle.search({"query": Q, "topK": 5})
    assert first["status"] == "ok" and first["envelope"]["results"][0]["source"] == "/docs/public/intro.md"
    policy = Policy.load(home)
    policy.set("/docs/public/intro.md", "never")
    policy.save()
    assert handle.search({"query": Q, "topK": 5}) == {"status": "no-verified-results",
                                                      "envelope": _expected("no-verified-results")}
    # loosening applies the same way, and deleting the file means "everything private"
    policy.unset("/docs/public/intro.md")
    policy.save()
    assert handle.search({"query": Q, "topK": 5})["status"] == "ok"
    (home / "policy.toml").unlink()
    assert handle.search({"query": Q, "topK": 5})["status"] == "no-verified-results"


def test_broken_policy_file_keeps_the_last_good_policy_and_warns_once(live, caplog) -> None:
    home, corpus, gate = live
    _write_policy(home, "[[rule]]\nglob = '/docs/public/**'\ntier = 'never'\n")
    handle = peer_knowledge(corpus, gate, None, peer_key=BOB)
    assert handle.search({"query": Q, "topK": 5})["status"] == "no-verified-results"
    _write_policy(home, "[[rule]]\nglob = '/docs/**'\ntier = 'public'\nthis is not toml\n")
    with caplog.at_level(logging.WARNING, logger="kith.policy"):
        for _ in range(3):
            assert handle.search({"query": Q, "topK": 5})["status"] == "no-verified-results"
    warnings = [r for r in caplog.records if r.name == "kith.policy" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "last good policy" in warnings[0].getMessage()
    _write_policy(home, "[[rule]]\nglob = '/docs/**'\ntier = 'public'\n")  # fixed → applied
    assert handle.search({"query": Q, "topK": 5})["status"] == "ok"


def test_quota_changes_apply_without_a_restart(live) -> None:
    home, corpus, gate = live
    limiter = RateLimiter()
    handle = peer_knowledge(corpus, gate, "alice", peer_key=ALICE, limiter=limiter)
    assert handle.search({"query": Q, "topK": 5})["status"] == "ok"
    _write_policy(home, "[[rule]]\nglob = '/docs/**'\ntier = 'public'\n"
                        "[quota.peer.alice]\nqueries_per_hour = 0\n")
    assert handle.search({"query": Q, "topK": 5})["status"] == "policy-denied"
    # another peer is unaffected by alice's quota
    assert peer_knowledge(corpus, gate, "bob", peer_key=BOB, limiter=limiter).search(
        {"query": Q, "topK": 5})["status"] == "ok"


def test_in_memory_policy_edits_are_not_replaced_by_an_unchanged_file(live) -> None:
    """Only a change of the file reloads it (one stat per query, no re-parse)."""
    home, corpus, gate = live
    gate.policy.set("/docs/public/**", "never")  # in memory only
    assert peer_knowledge(corpus, gate, None).search({"query": Q, "topK": 5})["status"] == "no-verified-results"
    assert gate.current_policy() is gate.policy


def test_policy_set_says_a_running_host_applies_it(cli, tmp_path: Path) -> None:
    r = cli(tmp_path, "policy", "set", "/docs/**", "never")
    assert r.exit_code == 0, r.output
    assert "running `kith host` applies this from its next query" in r.stderr
    r = cli(tmp_path, "policy", "unset", "/docs/**")
    assert r.exit_code == 0 and "next query" in r.stderr


# --- 1. over real iroh, through the `kith` command ----------------------------------------------


@pytest.mark.iroh
@pytest.mark.slow
def test_running_host_applies_policy_set_never_to_same_and_new_sessions(tmp_path: Path) -> None:
    from support.cli import KITH, json_lines, kith
    from support.hosts import HostProcess as Host

    docs = tmp_path / "docs"
    for rel, text in DOCS.items():
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(text)
    home, guest = tmp_path / "host", tmp_path / "guest"
    for args in (("init",), ("index", "add", str(docs)), ("index", "sync"), ("policy", "set", "/docs/**", "public")):
        r = kith(home, *args, timeout=300)
        assert r.returncode == 0, (args, r.stderr)
    assert kith(guest, "init").returncode == 0
    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    join = [*KITH, "--home", str(guest), "join", str(invite), "--local", "--trust", "--json"]
    proc = subprocess.Popen(join, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(Q + "\n")
        proc.stdin.flush()
        first = json.loads(readline(proc, 60))
        assert first["status"] == "ok" and first["envelope"]["results"][0]["source"] == "/docs/public/intro.md"
        set_never = kith(home, "policy", "set", "/docs/public/intro.md", "never")
        assert set_never.returncode == 0, set_never.stderr
        # the same session, right away
        proc.stdin.write(Q + "\n")
        proc.stdin.flush()
        second = json.loads(readline(proc, 60))
        assert second["status"] == "no-verified-results"
        assert second["envelope"] == json.loads(json.dumps(_expected("no-verified-results")))
        out, err = proc.communicate("\n", timeout=30)
        assert proc.returncode == 0, err
        assert "cleanup works" not in out
        # a new session
        r = kith(guest, "join", str(invite), "--local", "--trust", "--json", "--query", Q)
        assert r.returncode == 0, r.stderr
        [msg] = json_lines(r.stdout)
        assert msg["status"] == "no-verified-results" and "intro.md" not in r.stdout
        # and the host never restarted; `policy set` said it would apply this way
        assert host.proc.poll() is None
        assert "next query" in set_never.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        host.stop()


# --- 2. no terminal escapes from peer-supplied text ----------------------------------------------


def _hostile_request(home: Path, rid: str = "0123456789abcdef", *, query: str = HOSTILE) -> None:
    folder = home / "approvals" / "requests"
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"id": rid, "peer": {"key": ALICE, "name": "al\x1b[31mice"}, "query": query,
           "sources": ["/docs/ask/\x1b]0;pwned\x07x.md", "/docs/ask/\u202etxt.exe"],
           "createdAt": "2026-01-01T00:00:00Z"}
    (folder / f"{rid}.json").write_text(json.dumps(doc))


def test_approvals_list_prints_no_escape_bidi_or_markup(cli, tmp_path: Path) -> None:
    _hostile_request(tmp_path)
    for extra in ((), ("--all",)):
        r = cli(tmp_path, "approvals", "list", *extra)
        assert r.exit_code == 0, r.output
        assert not BAD_CHARS.search(r.stdout), repr(r.stdout)
        assert "0123456789abcdef" in r.stdout and "sal" in r.stdout
        # markup and emoji codes are shown as the peer typed them, never interpreted
        assert "[link=http://e.x]hi[/link]" in r.stdout and ":smile:" in r.stdout
    # --json keeps the exact text (JSON escapes it)
    raw = json.loads(cli(tmp_path, "approvals", "list", "--json").stdout)["requests"][0]["query"]
    assert raw == HOSTILE


def test_untrusted_console_on_a_colour_terminal_only_emits_its_own_styles() -> None:
    """On a real (forced) terminal rich emits SGR for our own styles; nothing else."""
    from rich.table import Table
    from rich.text import Text

    buf = io.StringIO()
    console = _UntrustedConsole(file=buf, force_terminal=True, color_system="truecolor", width=300)
    table = Table("query", "text", header_style="bold")
    table.add_row(HOSTILE, Text("t\x1b]8;;http://evil\x07x\x9b2J"))
    console.print(table)
    console.print(HOSTILE, Text(HOSTILE))
    out = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())  # our own SGR styles
    assert not BAD_CHARS.search(out), repr(out)
    assert "[link=http://e.x]hi[/link]" in out and "\x1b]8" not in buf.getvalue()


def test_peers_list_sanitizes_note_and_profile(cli, tmp_path: Path) -> None:
    registry = PeerRegistry.load(tmp_path)
    registry.add("alice", ALICE)
    raw = json.loads((tmp_path / "peers.json").read_text())
    raw["peers"]["alice"]["note"] = HOSTILE  # a hand-edited file is not cleaned on load
    raw["peers"]["alice"]["profile"] = {"displayName": "A\x1b[2J\u202eB"}
    (tmp_path / "peers.json").write_text(json.dumps(raw))
    for args in (("peers", "list"), ("peers", "list", "--rank", "sal")):
        r = cli(tmp_path, *args)
        assert r.exit_code == 0, r.output
        assert "alice" in r.stdout and not BAD_CHARS.search(r.stdout), repr(r.stdout)


def test_policy_list_shows_a_bracket_glob_verbatim(cli, tmp_path: Path) -> None:
    """'[' is a literal in globs; the table must not read it as markup."""
    assert cli(tmp_path, "policy", "set", "/docs/[bold]draft[/bold]/**", "never").exit_code == 0
    r = cli(tmp_path, "policy", "list")
    assert "/docs/[bold]draft[/bold]/**" in r.stdout
    r = cli(tmp_path, "policy", "unset", "/docs/[red]x")
    assert "no rule for '/docs/[red]x'" in r.stderr


# --- 3. peer names in policy rules ----------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("set", "/docs/**", "public", "--for", "bad name!"),
    ("set", "/docs/**", "public", "--for", "-alice"),
    ("set", "/docs/**", "public", "--for", "a" * 65),
    ("set", "/docs/**", "public", "--for", "al\x1bice"),
    ("set", "/docs/**", "peers", "--peer", "alice", "--peer", "bob smith"),
    ("set", "/docs/**", "peers", "--peer", "ａlice"),  # full-width a
    ("unset", "/docs/**", "--for", "bad name!"),
    ("explain", "/docs/a.md", "--peer", "bad name!"),
])
def test_policy_refuses_names_that_are_not_registry_names(cli, tmp_path: Path, args) -> None:
    r = cli(tmp_path, "policy", *args, "--json")
    assert r.exit_code != 0
    assert isinstance(r.exception, PolicyError) and r.exception.code == "peer-bad-name"
    assert not (tmp_path / "policy.toml").exists()
    assert "\x1b" not in r.output


def test_policy_accepts_registry_names_and_file_names_are_checked_too(cli, tmp_path: Path) -> None:
    assert cli(tmp_path, "policy", "set", "/docs/**", "public", "--for", "alice.b-2_x").exit_code == 0
    assert cli(tmp_path, "policy", "set", "/t/**", "peers", "--peer", "alice", "--peer", "Bob9").exit_code == 0
    for text in ("[[override]]\npeer = 'bad name'\nglob = '/a'\ntier = 'never'\n",
                 "[[rule]]\nglob = '/a'\ntier = 'peers'\npeers = ['ok', 'not ok']\n",
                 "[quota.peer.'bad name']\nburst = 1\n"):
        with pytest.raises(PolicyError) as exc:
            Policy.from_toml(text)
        assert exc.value.code == "policy-invalid"
    with pytest.raises(PolicyError) as exc:
        Policy().set("/a/**", "never", for_peer="x y")
    assert exc.value.code == "peer-bad-name"


# --- 4. remembered decisions settle the peer's other pending requests -----------------------------


def _req(approvals: Approvals, key: str, query: str, sources: list[str]) -> str:
    rec = approvals.request(key, "alice" if key == ALICE else None, query, sources)
    assert rec is not None
    return rec.id


@pytest.mark.parametrize("approve", [False, True])
def test_remembered_decision_settles_other_pending_requests_for_those_sources(tmp_path: Path, approve) -> None:
    approvals = Approvals(tmp_path)
    salary, bonus = "/docs/ask/salary.md", "/docs/ask/bonus.md"
    first = _req(approvals, ALICE, "salary bands", [salary])
    same = _req(approvals, ALICE, "next year salary", [salary])            # only that source
    wider = _req(approvals, ALICE, "salary and bonus", [salary, bonus])    # also an undecided one
    other_peer = _req(approvals, BOB, "salary bands", [salary])             # another key
    approvals.decide(first, approve, remember=True)
    pending = {r.id for r in Approvals(tmp_path).pending()}
    assert pending == {wider, other_peer}
    settled = Approvals(tmp_path).get(same)
    assert settled.decision == ("approved" if approve else "denied")
    assert settled.via == first and settled.remember
    doc = json.loads((tmp_path / "approvals" / "decisions" / f"{same}.json").read_text())
    assert doc["via"] == first
    with pytest.raises(PolicyError) as exc:
        approvals.decide(same, not approve)
    assert exc.value.code == "approval-decided"


def test_deny_remember_cli_hides_the_peers_other_requests(cli, tmp_path: Path) -> None:
    approvals = Approvals(tmp_path)
    first = _req(approvals, ALICE, "salary bands", ["/docs/ask/salary.md"])
    second = _req(approvals, ALICE, "bonus pool", ["/docs/ask/salary.md"])
    r = cli(tmp_path, "approvals", "deny", first, "--remember")
    assert r.exit_code == 0, r.output
    assert "also denied 1 other pending request(s)" in r.stdout and second in r.stdout
    r = cli(tmp_path, "approvals", "list", "--json")
    assert json.loads(r.stdout)["requests"] == []
    rows = json.loads(cli(tmp_path, "approvals", "list", "--all", "--json").stdout)["requests"]
    assert {(x["id"], x["status"], x.get("via")) for x in rows} == {(first, "denied", None),
                                                                   (second, "denied", first)}
    assert f"denied (with {first})" in cli(tmp_path, "approvals", "list", "--all").stdout


def test_later_remembered_approval_overrides_an_earlier_remembered_denial(indexed, tmp_path: Path) -> None:
    home, _ = indexed
    approvals = Approvals(tmp_path)
    q1, salary = "salary bands next year", "/docs/ask/salary.md"
    rid = _req(approvals, ALICE, q1, [salary])
    approvals.decide(rid, False, remember=True)
    assert approvals.verdicts(ALICE, q1).deny == {salary}
    # the owner changes their mind via another request for the same source
    rid2 = _req(approvals, ALICE, "salary review", [salary])
    approvals.decide(rid2, True, remember=True)
    assert approvals.verdicts(ALICE, q1).allow == {salary}
    with Corpus(home, readonly=True) as corpus:
        policy = Policy()
        policy.set("/docs/ask/**", "ask")
        gate = EgressGate(corpus.roots(), policy, home, approvals=approvals)
        answer = peer_knowledge(corpus, gate, "alice", peer_key=ALICE).search({"query": q1, "topK": 5})
    assert answer["status"] == "ok" and answer["envelope"]["results"][0]["source"] == salary


# --- 5. the ask probe: bounded files, documented ----------------------------------------------------


def test_ask_probe_writes_bounded_request_files_and_is_documented(indexed, tmp_path: Path) -> None:
    home, _ = indexed
    corpus = Corpus(home, readonly=True)
    policy = Policy()
    policy.set("/docs/ask/**", "ask")
    gate = EgressGate(corpus.roots(), policy, home, approvals=Approvals(tmp_path))
    handle = peer_knowledge(corpus, gate, None, peer_key=BOB)
    statuses = [handle.search({"query": f"bonus pool {w}", "topK": 5})
                for w in [f"w{i}" for i in range(MAX_PENDING_PER_PEER + 5)]]
    # the probe is real (documented): a word in an ask source answers pending-approval ...
    assert {a["status"] for a in statuses} == {"pending-approval"}
    assert handle.search({"query": "zanzibar quokka", "topK": 5})["status"] == "no-verified-results"
    # ... but files stay capped per peer
    assert len(list((tmp_path / "approvals" / "requests").glob("*.json"))) == MAX_PENDING_PER_PEER
    assert sum("approval_id" in a for a in statuses) == MAX_PENDING_PER_PEER
    corpus.close()
    for spec in ("policy.md", "approvals.md"):
        text = (ROOT / "specs" / spec).read_text()
        assert "probe" in text and str(MAX_PENDING_PER_PEER) in text, spec
    assert str(MAX_PENDING_TOTAL) in (ROOT / "specs" / "approvals.md").read_text()


# --- 6. look-alike names ------------------------------------------------------------------------


def test_claimed_name_with_confusable_letters_is_caught(tmp_path: Path) -> None:
    registry = PeerRegistry.load(tmp_path)
    registry.add("guest", ALICE)
    registry.add("alice", BOB, profile={"displayName": "Alice Smith"})
    other = "c3" * 32
    for claim in ("guеst",            # Cyrillic е
                  "GUEST", "ｇｕｅｓｔ",  # case, full width
                  "gu\u200best",      # zero-width space (dropped by the profile cleaner)
                  "aIice",            # capital I for l
                  "Αlice Smith",      # Greek Alpha
                  "alícé"):           # accents
        assert registry.claimed_by_other(other, {"displayName": claim}) is not None, claim
    for fine in ("guests", "ali", "Bob", "gust"):
        assert registry.claimed_by_other(other, {"displayName": fine}) is None, fine
    # the pinned key itself may use any display name
    assert registry.claimed_by_other(ALICE, {"displayName": "guеst"}) is None
    from node.trust.peers import name_skeletons

    assert name_skeletons("ALICE") & name_skeletons("alice")
    assert not name_skeletons("ali") & name_skeletons("all")


def test_unchanged_policy_file_is_not_parsed_again(live) -> None:
    """An unchanged file: the very same Policy object every query (one stat, no parse)."""
    home, corpus, gate = live
    before = gate.current_policy()
    for _ in range(100):
        assert gate.current_policy() is before
