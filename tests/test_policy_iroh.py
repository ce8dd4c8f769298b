"""Issue 5 over real iroh on loopback (relay disabled), through the real `kith` command:
who may see what (peers, ask → approve → re-query, never), `--peers-only`, pinned names,
profiles in the handshake, and a deny glob that no spelling gets around."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import unicodedata
from pathlib import Path

import anyio
import pytest

from node.answer.envelope import empty_envelope
from node.answer.contract import validate as validate_search_request
from node.common.errors import KithError

from support.cli import KITH, assert_no_real_paths, json_lines, kith, readline
from support.hosts import HostProcess as Host

pytestmark = [pytest.mark.iroh, pytest.mark.slow]

SECRET_TEXT = "zebra launch codes for the orbital platform"
DOCS = {
    "public/intro.md": "# Intro\n\nHow the temporary directory cleanup works in our tools.\n",
    "team/roadmap.md": "# Roadmap\n\nThe quarterly roadmap milestones for the platform team.\n",
    "ask/salary.md": "# Salary review\n\nThe salary bands for next year and the bonus pool.\n",
    "secret/launch.md": f"# Launch\n\nThe {SECRET_TEXT} are kept here.\n",
    "secret/deep/more.md": f"# More\n\nDeeper {SECRET_TEXT}.\n",
}


def _init(home: Path, display_name: str | None = None) -> str:
    r = kith(home, "init", "--json")
    assert r.returncode == 0, r.stderr
    if display_name:
        assert kith(home, "peers", "profile", "--display-name", display_name).returncode == 0
    return json.loads(r.stdout)["public_key"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """One host (invite file) with a policy covering every tier, and three guests."""
    tmp = tmp_path_factory.mktemp("p5")
    docs = tmp / "docs"
    for rel, text in DOCS.items():
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(text)
    (docs / "public" / "alias.md").symlink_to(docs / "secret" / "launch.md")  # file symlink into the denied folder
    (docs / "public" / "sec-dir").symlink_to(docs / "secret")                  # folder symlink (never walked)
    home = tmp / "host"
    _init(home, "Host H")
    for args in (("index", "add", str(docs)), ("index", "sync"),
                 ("policy", "set", "/docs/**", "public"),          # broad allow ...
                 ("policy", "set", "/docs/secret/**", "never"),    # ... and a deny glob on a folder
                 ("policy", "set", "/docs/team/**", "peers", "--peer", "alice"),
                 ("policy", "set", "/docs/ask/**", "ask")):
        r = kith(home, *args, timeout=300)
        assert r.returncode == 0, (args, r.stderr)
    with (home / "policy.toml").open("a") as fh:  # generous defaults; carol gets a tight quota
        fh.write("\n[quota]\nqueries_per_hour = 100000\nburst = 1000\n"
                 "[quota.peer.carol]\nqueries_per_hour = 1\nburst = 2\n")
    guests = {"alice": tmp / "alice", "bob": tmp / "bob", "eve": tmp / "eve", "carol": tmp / "carol"}
    keys = {"alice": _init(guests["alice"], "Alice A"), "bob": _init(guests["bob"]),
            "eve": _init(guests["eve"], "alice"),  # eve claims alice's name with her own key
            "carol": _init(guests["carol"])}
    assert kith(home, "peers", "add", "alice", keys["alice"]).returncode == 0
    assert kith(home, "peers", "add", "carol", keys["carol"]).returncode == 0
    invite = tmp / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    try:
        yield {"tmp": tmp, "docs": docs, "home": home, "guests": guests, "keys": keys, "invite": invite,
               "host": host}
    finally:
        host.stop()


def join(world, who: str, *queries: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    args = ["join", str(world["invite"]), "--local", "--trust", "--json", *extra]
    for q in queries:
        args += ["--query", q]
    return kith(world["guests"][who], *args)


def _expected(query: str, status: str, **filters) -> dict:
    req = validate_search_request({"query": query, "topK": 5, **filters})
    return json.loads(json.dumps(empty_envelope(status, req)))


def test_peers_source_only_for_listed_peer_and_profile_merge(world) -> None:
    q = "quarterly roadmap milestones"
    r = join(world, "alice", q)
    assert r.returncode == 0, r.stderr
    [msg] = json_lines(r.stdout)
    assert msg["status"] == "ok" and msg["envelope"]["results"][0]["source"] == "/docs/team/roadmap.md"
    r = join(world, "bob", q)
    assert r.returncode == 0, r.stderr
    [msg] = json_lines(r.stdout)
    assert msg["status"] == "no-verified-results" and msg["envelope"] == _expected(q, "no-verified-results")
    assert "milestones for the platform team" not in r.stdout
    # alice is known: the profile she shared was merged into the host's record; bob was not added
    peers = json.loads(kith(world["home"], "peers", "list", "--json").stdout)["peers"]
    assert [(p["name"], p["profile"].get("displayName")) for p in peers] == [("alice", "Alice A"), ("carol", None)]
    assert peers[0]["profileSyncedAt"]


def test_ask_source_approve_then_requery_gets_evidence(world) -> None:
    q = "salary bands bonus pool"
    r = join(world, "alice", q)
    assert r.returncode == 1, r.stderr  # pending-approval did not answer (specs/exit-codes.md)
    assert "error [questions-unanswered]" in r.stderr
    [msg] = json_lines(r.stdout)  # --json: no {"error"} line added
    assert msg["status"] == "pending-approval" and msg["envelope"] == _expected(q, "pending-approval")
    rid = msg["approval_id"]
    assert "salary.md" not in r.stdout  # the pending answer names no source
    listed = json.loads(kith(world["home"], "approvals", "list", "--json").stdout)["requests"]
    mine = [x for x in listed if x["id"] == rid]
    assert mine and mine[0]["peer"]["name"] == "alice" and mine[0]["sources"] == ["/docs/ask/salary.md"]
    # before a decision, asking again keeps the same request
    assert json_lines(join(world, "alice", q).stdout)[0]["approval_id"] == rid
    r = kith(world["home"], "approvals", "approve", rid)
    assert r.returncode == 0, r.stderr
    # a new session, same query → the evidence
    r = join(world, "alice", q)
    [msg] = json_lines(r.stdout)
    assert msg["status"] == "ok" and msg["envelope"]["results"][0]["source"] == "/docs/ask/salary.md"
    # bob asking the same query still waits on his own decision
    assert json_lines(join(world, "bob", q).stdout)[0]["status"] == "pending-approval"


def test_quota_rate_limited_with_retry_after(world) -> None:
    r = join(world, "carol", "temporary directory", "temporary directory", "temporary directory")
    assert r.returncode == 1, r.stderr  # a rate-limited answer fails the run (specs/exit-codes.md)
    assert "q3 rate-limited (retry in" in r.stderr
    msgs = json_lines(r.stdout)
    assert [m["status"] for m in msgs] == ["ok", "ok", "rate-limited"]
    assert msgs[2]["retry_after_s"] >= 3000  # 1 query per hour: about an hour
    assert msgs[2]["envelope"] == _expected("temporary directory", "rate-limited")
    # a new session does not refill the bucket
    assert json_lines(join(world, "carol", "temporary directory").stdout)[0]["status"] == "rate-limited"


def test_ask_approved_within_the_same_session(world) -> None:
    """Interactive guest (questions on stdin): pending → owner approves → same query, same session."""
    q = "bonus pool for next year salary"
    proc = subprocess.Popen([*KITH, "--home", str(world["guests"]["alice"]), "join", str(world["invite"]),
                             "--local", "--trust", "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(q + "\n")
        proc.stdin.flush()
        first = json.loads(readline(proc, 60))
        assert first["status"] == "pending-approval"
        assert kith(world["home"], "approvals", "approve", first["approval_id"]).returncode == 0
        proc.stdin.write(q + "\n")
        proc.stdin.flush()
        second = json.loads(readline(proc, 60))
        assert second["status"] == "ok"
        assert second["envelope"]["results"][0]["source"] == "/docs/ask/salary.md"
        out, err = proc.communicate("\n", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err  # the first answer was pending-approval (specs/exit-codes.md)
    assert "1 of 2 question(s) not answered: q1 pending-approval" in err


def _spellings(docs: Path) -> list[str]:
    real = str(docs / "secret" / "launch.md")
    nfd = unicodedata.normalize("NFD", "/docs/secret/launch.md")  # (ASCII: NFD is the same text)
    return [
        "/docs/secret/**", "/docs/secret/launch.md", "/docs/secret/*", "/docs/secret/deep/more.md",
        "/docs//secret/launch.md", "/docs/secret//launch.md", "/docs/secret/launch.md/",
        "/docs/./secret/launch.md", "/docs/public/../secret/launch.md", "/docs/secret/deep/../launch.md",
        "/docs/SECRET/launch.md", "/docs/Secret/**", "/DOCS/secret/launch.md",
        "/docs/secret%2Flaunch.md", "/docs%2Fsecret%2Flaunch.md",
        "\\docs\\secret\\launch.md", "/docs\\secret\\launch.md", "docs/secret/launch.md",
        "secret/launch.md", "./docs/secret/launch.md",
        "file://" + real, "file:/docs/secret/launch.md", "docs:secret/launch.md",
        real, real.replace("/", "//"), os.path.dirname(real) + "/./launch.md",
        "/docs/public/alias.md", "/docs/public/sec-dir/launch.md", "/docs/public/sec-dir/**",
        "/docs/secret\u200b/launch.md", "/docs/secret /launch.md", "/docs/secret/launch.md\x00.txt",
        nfd, "/docs/**/launch.md", "/**/launch.md", "/**", "/docs/s?cret/*.md", "/docs/*/launch.md",
    ]


def test_deny_glob_on_a_folder_is_not_bypassed_by_any_spelling(world) -> None:
    """Every spelling rides in the query's `sources` filter (and, where it is text, as the
    query itself); the answer never carries the secret, and equals byte for byte what a
    request for a source that does not exist gets (only the request shapes the envelope)."""
    from node.guest.guest import join_session, resolve_invitation
    from node.guest.targets import check_invitation
    from node.trust.identity import load_or_init_identity

    home = world["guests"]["alice"]  # the most trusted guest: public + peers + approvals
    identity = load_or_init_identity(home)
    spellings = _spellings(world["docs"])
    results: list[tuple[str, dict]] = []

    async def main() -> None:
        inv = await resolve_invitation(str(world["invite"]), server_url=None)
        pdir, spec = check_invitation(inv, home)
        for spelling in spellings:
            got: list[dict] = []
            options = {"queries": [SECRET_TEXT], "topK": 5, "on_results": got.append,
                       "filters": {"sources": [spelling]}}
            outcome = await join_session(home, identity, inv, pdir, spec, local=True, server_url=None,
                                         options=options)
            if got:
                results.append((spelling, got[0]))
            else:  # the engine refused the message before hooks (schema: e.g. NUL is fine, length is not)
                results.append((spelling, {"refused": outcome.refused or [outcome.code]}))
        got = []
        await join_session(home, identity, inv, pdir, spec, local=True, server_url=None,
                           options={"queries": [SECRET_TEXT, "zebra launch", "orbital platform codes"],
                                    "topK": 20, "on_results": got.append})
        results.extend(("(query text)", g) for g in got)

    anyio.run(main, backend="asyncio")
    assert len(results) == len(spellings) + 3
    for spelling, msg in results:
        for res in msg.get("envelope", {}).get("results", []):
            assert not res["source"].startswith("/docs/secret"), (spelling, res["source"])
            assert res["source"] != "/docs/public/alias.md", spelling  # the symlink into secret/
            assert "zebra" not in json.dumps(res), spelling
        if "refused" in msg or spelling in ("(query text)", "/**"):  # /** also matches public files
            continue
        try:
            expected = _expected(SECRET_TEXT, "no-verified-results", sources=[spelling])
            status = "no-verified-results"
        except KithError:
            expected, status = json.loads(json.dumps(empty_envelope("invalid-request", None))), "invalid-request"
        assert msg["status"] == status, (spelling, msg["status"])
        assert msg["envelope"] == expected, spelling
    text_answers = [m for s, m in results if s == "(query text)"]
    assert all(m["status"] in ("no-verified-results", "ok") for m in text_answers)
    assert all(not any(r["source"].startswith("/docs/secret") for r in m["envelope"]["results"])
               for m in text_answers)


def test_peers_only_and_pinned_names(world) -> None:
    tmp = world["tmp"]
    # --peers-only: the registry is the allowlist
    invite2 = tmp / "invite-peers-only.json"
    # a second host of the same identity, registry and corpus: one `kith host` per home
    # (home-in-use), so it serves a copy of the home
    home2 = tmp / "host-peers-only"
    if not home2.exists():
        shutil.copytree(world["home"], home2, ignore=shutil.ignore_patterns("host.lock", "*.lock", "run"))
    host2 = Host(home2, "--invite-file", str(invite2), "--peers-only")
    try:
        r = kith(world["guests"]["bob"], "join", str(invite2), "--local", "--trust", "--query", "roadmap", "--json")
        # bob's home has a person key, so its chain is judged at _session_ready: a device of
        # a person nobody pinned (specs/peers.md §10)
        assert r.returncode == 1 and "handshake-person-not-pinned" in r.stderr
        assert json.loads(r.stdout)["error"]["code"] == "handshake-person-not-pinned"
        r = kith(world["guests"]["alice"], "join", str(invite2), "--local", "--trust", "--query", "roadmap", "--json")
        assert r.returncode == 0, r.stderr
    finally:
        host2.stop()
    # host side: eve presents the pinned name "alice" with another key → refused
    r = join(world, "eve", "roadmap")
    assert r.returncode == 1 and "peer-key-changed" in r.stderr
    assert_no_real_paths(r.stdout + r.stderr, world["docs"], world["home"])


def test_join_pins_the_host_and_refuses_a_changed_key(world) -> None:
    tmp = world["tmp"]
    bob = world["guests"]["bob"]
    host_key = json.loads(kith(world["home"], "init", "--json").stdout)["public_key"]
    r = join(world, "bob", "temporary directory", extra=("--pin", "hosty"))
    assert r.returncode == 0, r.stderr
    assert "pinned the host as 'hosty'" in r.stderr
    [rec] = json.loads(kith(bob, "peers", "list", "--json").stdout)["peers"]
    assert (rec["name"], rec["publicKey"], rec["profile"]) == ("hosty", host_key, {"displayName": "Host H"})
    assert rec["profileSyncedAt"]
    # without --pin and without a TTY, join only says how to pin
    r = join(world, "alice", "temporary directory")
    assert r.returncode == 0 and "kith peers add NAME" in r.stderr

    # another host (another key) that calls itself "hosty"
    other = tmp / "other-host"
    _init(other, "hosty")
    corpus = tmp / "other-docs"
    corpus.mkdir()
    (corpus / "x.md").write_text("# X\n\nTemporary directory notes.\n")
    for args in (("index", "add", str(corpus)), ("index", "sync"), ("policy", "set", "/other-docs/**", "public")):
        assert kith(other, *args).returncode == 0
    invite3 = tmp / "invite-other.json"
    host3 = Host(other, "--invite-file", str(invite3))
    try:
        # --pin with a name pinned to another key: refused before connecting, as a name taken
        r = kith(bob, "join", str(invite3), "--local", "--trust", "--pin", "hosty", "--query", "x", "--json")
        assert r.returncode == 2 and json.loads(r.stdout)["error"]["code"] == "pin-name-taken"
        # connecting anyway: the host claims "hosty" in its profile → the guest refuses
        r = kith(bob, "join", str(invite3), "--local", "--trust", "--query", "temporary", "--json")
        assert r.returncode == 1 and "host-key-changed" in r.stderr
        # a guest that never pinned "hosty" talks to it fine
        r = kith(world["guests"]["eve"], "join", str(invite3), "--local", "--trust", "--query", "temporary", "--json")
        assert r.returncode == 0, r.stderr
    finally:
        host3.stop()
