"""``kith policy set|unset|list|explain`` (DESIGN §10, §13)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import invoke
from support.homes import initialized

KITH = Path(sys.executable).with_name("kith")


@pytest.fixture(scope="module")
def kith():
    return lambda home, *args: invoke(home, "policy", *args)


def _json(result) -> object:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_set_list_explain_unset_round_trip(kith, tmp_path: Path) -> None:
    assert kith(tmp_path, "set", "/docs/**", "public").exit_code == 0
    out = _json(kith(tmp_path, "set", "/docs/team/**", "peers", "--peer", "alice",
                     "--peer", "bob", "--json"))
    assert out == {"glob": "/docs/team/**", "tier": "peers", "peers": ["alice", "bob"], "matches": 0,
                   "decides": 0, "decidedElsewhere": [], "suggestions": [],
                   "replaced": None, "sameSources": [], "unpinnedPeers": ["alice", "bob"],
                   "warning": "/docs/team/** matches no indexed source: nothing is indexed yet "
                              "(kith index add PATH, then kith index sync); the rule is kept"}
    policy_file = tmp_path / "policy.toml"
    assert stat.S_IMODE(policy_file.stat().st_mode) == 0o600

    listed = _json(kith(tmp_path, "list", "--json"))
    assert listed["rules"] == [
        {"glob": "/docs/**", "tier": "public", "peers": []},
        {"glob": "/docs/team/**", "tier": "peers", "peers": ["alice", "bob"]},
    ]
    human = kith(tmp_path, "list")
    assert "/docs/team/**" in human.stdout and "alice, bob" in human.stdout

    assert _json(kith(tmp_path, "explain", "/docs/team/plan.md", "--json")) == {
        "canonical": "/docs/team/plan.md", "tier": "peers", "allowed": False,
        "matched": "/docs/team/**"}
    assert _json(kith(tmp_path, "explain", "/docs/team/plan.md", "--peer", "alice", "--json"))[
        "allowed"] is True
    assert _json(kith(tmp_path, "explain", "/elsewhere/x", "--json")) == {
        "canonical": "/elsewhere/x", "tier": "private", "allowed": False, "matched": None}
    assert _json(kith(tmp_path, "explain", "/docs/../etc/passwd", "--json")) == {
        "canonical": None, "tier": "private", "allowed": False, "matched": None}
    human = kith(tmp_path, "explain", "/docs//a.md", "--peer", "bob")
    assert human.exit_code == 0
    assert "canonical: /docs/a.md" in human.stdout and "matched:   /docs/**" in human.stdout

    assert _json(kith(tmp_path, "unset", "/docs/team/**", "--json")) == {
        "glob": "/docs/team/**", "removed": True}
    assert _json(kith(tmp_path, "unset", "/docs/team/**", "--json"))["removed"] is False
    assert [r["glob"] for r in _json(kith(tmp_path, "list", "--json"))["rules"]] == ["/docs/**"]


def test_usage_errors(kith, tmp_path: Path) -> None:
    assert kith(tmp_path, "set", "/x/**", "secret").exit_code == 2       # not a tier choice
    for args in (("set", "/x/**", "peers"), ("set", "/x/**", "public", "--peer", "a")):
        result = kith(tmp_path, *args)
        assert result.exit_code != 0
        assert getattr(result.exception, "code", None) == "usage"
    assert not (tmp_path / "policy.toml").exists()


def _kith(*args: str) -> subprocess.CompletedProcess[str]:
    initialized(Path(args[1]))  # args: --home DIR ...
    return subprocess.run([str(KITH), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not KITH.exists(), reason="the kith console script is not installed in this venv")
def test_errors_through_the_real_dispatcher(tmp_path: Path) -> None:
    proc = _kith("--home", str(tmp_path), "policy", "set", "/x/**", "peers")
    assert proc.returncode == 2
    proc = _kith("--home", str(tmp_path), "policy", "set", "docs/**", "public", "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error"]["code"] == "policy-bad-glob"
    (tmp_path / "policy.toml").write_text("[[rule]]\nglob = '/a'\ntier = 'open'\n")
    proc = _kith("--home", str(tmp_path), "policy", "list", "--json")
    assert proc.returncode == 1
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "policy-bad-tier" and "#1" in error["message"]


def test_explain_maps_real_paths_through_the_corpus_roots(kith, tmp_path: Path) -> None:
    store = pytest.importorskip("node.corpus.store", reason="corpus store not available")
    home, docs = tmp_path / "home", tmp_path / "docs"
    docs.mkdir()
    with store.Corpus(home) as corpus:
        corpus.add_root(docs)
    assert kith(home, "set", "/docs/**", "public").exit_code == 0
    assert _json(kith(home, "explain", str(docs / "guide.md"), "--json")) == {
        "canonical": "/docs/guide.md", "tier": "public", "allowed": True, "matched": "/docs/**"}
    # no corpus at all: explain still answers, textual rules only
    other = tmp_path / "bare"
    assert _json(kith(other, "explain", "/docs/x.md", "--json"))["canonical"] == "/docs/x.md"


def test_check_flags_rules_and_groups_naming_a_peer_no_longer_pinned(tmp_path: Path) -> None:
    """`kith policy check` said nothing of a rule or group naming a peer removed from
    peers.json (issue 32): such a name grants nothing, and the check lists it."""
    import os

    home = initialized(tmp_path / "home")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([str(KITH), "--home", str(home), *args], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, (args, r.stderr)
        return r

    for name in ("alice", "bob"):
        run("peers", "add", name, os.urandom(32).hex())
    run("policy", "set", "/docs/team/**", "peers", "--peer", "alice", "--peer", "bob")
    run("policy", "set", "/docs/bob/**", "public", "--for", "bob")
    run("peers", "group", "add", "team", "alice", "bob")
    clean = json.loads(run("policy", "check", "--json").stdout)
    assert clean["notPinned"] == []
    assert "every peer the rules and groups name is pinned" in run("policy", "check").stdout
    run("peers", "remove", "bob")
    got = json.loads(run("policy", "check", "--json").stdout)["notPinned"]
    assert {(n["where"], n["name"]) for n in got} == {
        ("/docs/team/** → peers", "bob"), ("/docs/bob/** → public (override for bob)", "bob"), ("@team", "bob")}, got
    text = run("policy", "check").stdout
    assert "rules and groups naming a peer that is not pinned" in text and "  @team: bob" in text, text
