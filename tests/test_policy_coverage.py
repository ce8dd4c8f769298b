"""Issue 20 item 2: a policy rule says what it covers among the indexed sources — through
real `kith` processes (and the dashboard's policy page over real HTTP)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from support.cli import kith

FILES = {
    "odd/latin1.txt": "Caf\u00e9 notes from the odd folder.\n",
    "odd/sub/deep.md": "# Deep\n\nA note two folders down.\n",
    "notes/plan.md": "# Plan\n\nThe plan for the week.\n",
    "notes/keep/kept.md": "# Kept\n\nKept apart from the plan.\n",
}


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with two roots, /odd and /notes, synced."""
    base = tmp_path_factory.mktemp("cov")
    for rel, text in FILES.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text, "utf-8")
    home = base / "home"
    ok(kith(home, "init"))
    ok(kith(home, "index", "add", str(base / "odd")))
    ok(kith(home, "index", "add", str(base / "notes")))
    ok(kith(home, "index", "sync"))
    return home


@pytest.fixture
def home(indexed: Path) -> Path:
    (indexed / "policy.toml").unlink(missing_ok=True)
    return indexed


def tier_of(home: Path, source: str) -> str:
    return json.loads(ok(kith(home, "policy", "explain", source, "--json")).stdout)["tier"]


@pytest.mark.parametrize("tier", ["never", "private", "ask", "public"])
@pytest.mark.parametrize("glob", ["/odd", "/odd/"])
def test_a_folder_without_a_glob_covers_everything_below_it(home: Path, glob: str, tier: str) -> None:
    r = ok(kith(home, "policy", "set", glob, tier))
    assert "decides 2 indexed sources" in r.stdout, r.stdout
    assert "matches no indexed source" not in r.stderr
    for source in ("/odd/latin1.txt", "/odd/sub/deep.md"):
        assert tier_of(home, source) == tier
    assert tier_of(home, "/notes/plan.md") == "private"  # not a prefix match on text: /odd ≠ /oddx


def test_a_peers_folder_rule_covers_everything_below_it(home: Path) -> None:
    r = ok(kith(home, "policy", "set", "/notes", "peers", "--peer", "alice", "--json"))
    out = json.loads(r.stdout)
    assert (out["glob"], out["matches"], out["decides"], out["warning"]) == ("/notes", 2, 2, None)
    assert tier_of(home, "/notes/keep/kept.md") == "peers"


def test_a_typo_is_kept_but_warned_about_naming_the_closest_folder(home: Path) -> None:
    r = ok(kith(home, "policy", "set", "/oddd/**", "private"))
    assert "warning: /oddd/** matches no indexed source; the rule is kept (did you mean /odd/**?)" in r.stderr, r.stderr
    assert [x["glob"] for x in json.loads(ok(kith(home, "policy", "list", "--json")).stdout)["rules"]] == ["/oddd/**"]
    out = json.loads(ok(kith(home, "policy", "set", "/nots/**", "never", "--json")).stdout)
    assert out["matches"] == 0 and out["suggestions"] == ["/notes/**"] and "did you mean /notes/**?" in out["warning"]


def test_set_names_the_rules_that_still_decide_some_of_its_sources(home: Path) -> None:
    ok(kith(home, "policy", "set", "/notes/keep/**", "never"))
    r = ok(kith(home, "policy", "set", "/notes/**", "public"))
    assert "decides 1 indexed source" in r.stdout
    assert "1 of the sources it matches is still decided by /notes/keep/** → never: /notes/keep/kept.md" in r.stdout
    out = json.loads(ok(kith(home, "policy", "set", "/**", "public", "--json")).stdout)
    assert out["matches"] == 4 and out["decides"] == 2
    assert {(d["glob"], tuple(d["sources"])) for d in out["decidedElsewhere"]} == {
        ("/notes/**", ("/notes/plan.md",)), ("/notes/keep/**", ("/notes/keep/kept.md",))}


def test_check_lists_rules_matching_nothing_and_sources_no_rule_decides(home: Path) -> None:
    ok(kith(home, "policy", "set", "/oddd/**", "never"))
    ok(kith(home, "policy", "set", "/notes/*.md", "public"))
    r = ok(kith(home, "policy", "check"))
    assert "/oddd/** → never  (did you mean /odd/**?)" in r.stdout, r.stdout
    assert "sources no rule decides (3; private by default):" in r.stdout
    for sid in ("/odd/latin1.txt", "/odd/sub/deep.md", "/notes/keep/kept.md"):
        assert f"  {sid}" in r.stdout
    out = json.loads(ok(kith(home, "policy", "check", "--json")).stdout)
    assert out["sources"] == 4
    assert out["unmatchedRules"] == [{"glob": "/oddd/**", "tier": "never", "suggestions": ["/odd/**"]}]
    assert out["undecided"] == {"count": 3, "sources": ["/notes/keep/kept.md", "/odd/latin1.txt", "/odd/sub/deep.md"]}
    assert [(x["glob"], x["matches"], x["decides"]) for x in out["rules"]] == [("/oddd/**", 0, 0), ("/notes/*.md", 1, 1)]


def test_a_refused_set_leaves_policy_toml_as_it_was(home: Path) -> None:
    ok(kith(home, "policy", "set", "/notes/**", "public"))
    before = (home / "policy.toml").read_bytes()
    for args, code in ((("docs/**", "public"), 1), (("/x/**", "peers"), 2), (("/x/**", "opened"), 2),
                       (("/x/**", "public", "--for", "not a name"), 1), (("/a/b**", "never"), 1)):
        r = kith(home, "policy", "set", *args)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert (home / "policy.toml").read_bytes() == before, args


def test_the_dashboard_policy_page_shows_the_same_counts(home: Path) -> None:
    from node.local.dashboard.app import run_dashboard_in_thread

    ok(kith(home, "policy", "set", "/oddd/**", "never"))
    ok(kith(home, "policy", "set", "/notes/**", "public"))
    ok(kith(home, "policy", "set", "/notes/keep", "never"))
    with run_dashboard_in_thread(home) as (base, login):
        with httpx.Client(base_url=base, timeout=30, follow_redirects=False) as client:
            assert client.get(login).status_code == 303
            page = client.get("/policy").text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
            said = client.post("/policy/set", data={"csrf": csrf, "glob": "/nots/**", "tier": "private"},
                               follow_redirects=True).text
            page = client.get("/policy").text
    text = re.sub(r"<[^>]+>", "", page)
    assert "4 indexed source(s)" in text and "2 source(s) no rule decides" in text
    assert "1 of 2 matched; 1 still decided by /notes/keep → never" in text
    assert "matches no indexed source (did you mean /odd/**?)" in text
    assert "/nots/** matches no indexed source; the rule is kept (did you mean /notes/**?)" in re.sub(r"<[^>]+>", "", said)


@pytest.mark.parametrize("folder", ["/odd", "/odd/"])
def test_a_folder_rule_ties_with_its_double_star_spelling_and_the_stricter_tier_decides(home: Path, folder: str) -> None:
    """`/odd` names the same sources as `/odd/**`: it used to be less specific, so
    `policy set /odd never` over `/odd/** public` decided nothing and a guest was served."""
    ok(kith(home, "policy", "set", "/odd/**", "public"))
    r = ok(kith(home, "policy", "set", folder, "never"))
    assert "overrides /odd/** → public: it names the same sources" in r.stdout, r.stdout
    assert "decides 2 indexed sources" in r.stdout, r.stdout
    assert tier_of(home, "/odd/sub/deep.md") == "never"
    # the other way round the stricter rule stays in force, and set says so
    out = json.loads(ok(kith(home, "policy", "set", "/odd/**", "private", "--json")).stdout)
    assert out["decides"] == 0 and out["replaced"]["tier"] == "public"
    assert out["sameSources"] == [{"glob": "/odd", "tier": "never", "peers": [], "stillDecides": True}]
    assert tier_of(home, "/odd/latin1.txt") == "never"


def test_set_names_the_tier_it_replaced(home: Path) -> None:
    ok(kith(home, "policy", "set", "/notes/**", "never"))
    r = ok(kith(home, "policy", "set", "/notes/**", "private"))
    assert "replaced never → private" in r.stdout, r.stdout
    assert "unchanged: /notes/** was already private" in ok(kith(home, "policy", "set", "/notes/**", "private")).stdout


def test_names_that_are_no_pinned_peer_are_warned_about(home: Path) -> None:
    ok(kith(home, "policy", "set", "/notes/**", "public"))
    r = ok(kith(home, "policy", "set", "/notes/**", "peers", "--peer", "nobody"))
    assert "replaced public → peers (nobody)" in r.stdout, r.stdout
    assert "warning: --peer nobody: no pinned peer has that name" in r.stderr and "kith peers list" in r.stderr
    r = ok(kith(home, "policy", "set", "/notes/**", "never", "--for", "nobody", "--json"))
    assert json.loads(r.stdout)["unpinnedPeers"] == ["nobody"] and "warning: --for nobody:" in r.stderr
    r = ok(kith(home, "policy", "quota", "--for", "nobody", "--burst", "3"))
    assert "warning: --for nobody: no pinned peer has that name" in r.stderr, r.stderr
    ok(kith(home, "peers", "add", "pinned", "ab" * 32))
    r = ok(kith(home, "policy", "set", "/notes/**", "peers", "--peer", "pinned"))
    assert "warning" not in r.stderr, r.stderr
