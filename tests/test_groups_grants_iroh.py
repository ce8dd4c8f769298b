"""Issue 22 items 4–5 over real iroh on loopback (relay disabled), through the real `kith`
command: a group grant reaches a member and only a member; a pin given an end while the
host runs ends on time and the peer is a stranger after it; a person rotated between two
joins is followed by the host (``person-rotated``) and keeps being served."""

from __future__ import annotations

import json

import pytest

from support.cli import json_lines, kith, kith_init
from support.hosts import HostProcess as Host

pytestmark = [pytest.mark.iroh, pytest.mark.slow]

TEXT = "the migration plan for the storage cluster and its rollback steps"


_init = kith_init


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("g22")
    docs = tmp / "docs"
    (docs / "project").mkdir(parents=True)
    (docs / "project" / "plan.md").write_text(f"# Plan\n\nThis is {TEXT}.\n")
    home = tmp / "host"
    _init(home)
    keys = {who: _init(tmp / who) for who in ("alice", "bob")}
    for args in (("index", "add", str(docs)), ("index", "sync"),
                 ("policy", "set", "/docs/**", "private"),
                 ("peers", "add", "alice", keys["alice"]), ("peers", "add", "bob", keys["bob"]),
                 ("peers", "group", "add", "team", "alice"),
                 ("policy", "set", "/docs/project/**", "public", "--for", "@team")):
        r = kith(home, *args, timeout=300)
        assert r.returncode == 0, (args, r.stderr)
    invite = tmp / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    try:
        yield {"tmp": tmp, "home": home, "invite": invite, "host": host}
    finally:
        host.stop()


def _ask(world, who: str) -> dict:
    r = kith(world["tmp"] / who, "join", str(world["invite"]), "--local", "--trust", "--json", "--query", TEXT)
    assert r.returncode in (0, 1), r.stderr
    [msg] = json_lines(r.stdout)
    return msg


def _audited(world, kind: str, timeout: float = 60.0) -> dict:
    """The first ``kind`` record in the host's audit log, waiting (polling, bounded) for it."""
    import time

    from node.trust.audit_log import read_audit

    deadline = time.monotonic() + timeout
    while True:
        found = [rec for rec in read_audit(world["home"], []) if rec.get("event") == kind]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no {kind} record within {timeout} s"
        time.sleep(0.05)


def test_a_group_grant_reaches_its_member_only(world) -> None:
    alice, bob = _ask(world, "alice"), _ask(world, "bob")
    assert alice["status"] == "ok" and alice["envelope"]["results"][0]["source"] == "/docs/project/plan.md"
    assert bob["status"] == "no-verified-results" and not bob["envelope"]["results"]
    assert "plan.md" not in json.dumps(bob)


def test_a_rotated_person_is_followed_and_still_served(world) -> None:
    before = json.loads(kith(world["tmp"] / "alice", "person", "show", "--json").stdout)["person_key"]
    r = kith(world["tmp"] / "alice", "person", "rotate", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    after = json.loads(r.stdout)["person_key"]
    msg = _ask(world, "alice")
    assert msg["status"] == "ok" and msg["envelope"]["results"]
    ev = _audited(world, "person-rotated")
    assert (ev["old_person"], ev["person"], ev["via"]) == (before, after, "person")


def test_a_pin_given_an_end_while_the_host_runs_ends_and_the_peer_is_a_stranger_after(world) -> None:
    first = _ask(world, "alice")
    assert first.get("envelope", {}).get("results"), first
    r = kith(world["home"], "peers", "until", "alice", "3s")
    assert r.returncode == 0, r.stderr
    ev = _audited(world, "grant-expired")
    assert (ev["kind"], ev["peer_name"], ev["code"]) == ("pin", "alice", "session-grant-expired")
    msg = _ask(world, "alice")
    assert msg["status"] == "no-verified-results" and not msg["envelope"]["results"]
    shown = json.loads(kith(world["home"], "status", "--json").stdout)["grants"]
    assert [(g["kind"], g["peer_name"], g["ended"]) for g in shown] == [("pin", "alice", True)]
