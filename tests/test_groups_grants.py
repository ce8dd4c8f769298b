"""Groups and grants that end (issue 22 item 5; specs/policy.md §8, specs/peers.md §12):
how ``@group`` rules decide (the most specific glob still decides; at equal specificity
deny beats allow across a peer's groups and its own overrides), ``--until`` on a pin, an
override and a membership, the CLI, and a real Host over memory pipes ending the sessions
of a grant that ends on its clock — the pin's and a group membership's — and auditing it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import anyio
import pytest

from support.cli import invoke
from support.homes import initialized
from support.memory import MemoryHost, connect_guest as _connect, memory_host_home as _host_home
from node.common.errors import UsageError
from node.common.grants import parse_until, until_time
from node.policy.store import Policy
from node.trust.identity import Identity
from node.trust.peers import PeerRegistry, pins_in_force, set_pin_until


NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _policy(text: str, now: float = NOW) -> Policy:
    policy = Policy.from_toml(text)
    policy.now = lambda: now
    return policy


GROUPS = """
[[rule]]
glob = "/docs/**"
tier = "private"

[group.team]
members = ["alice", "bob"]

[group.contractors]
members = ["bob"]
until = { bob = "2027-02-01T00:00:00Z" }

[[override]]
peer = "@team"
glob = "/docs/**"
tier = "public"

[[override]]
peer = "@contractors"
glob = "/docs/**"
tier = "never"

[[override]]
peer = "bob"
glob = "/docs/bob/**"
tier = "public"
"""


def test_a_group_override_applies_to_its_members_and_deny_beats_allow_across_groups():
    p = _policy(GROUPS)
    assert p.decide("/docs/a.md", "alice").allowed  # @team: public
    assert not p.decide("/docs/a.md", "carol").allowed  # in no group: the rule (private)
    bob = p.decide("/docs/a.md", "bob")  # @team public and @contractors never, equally specific
    assert (bob.tier, bob.allowed, bob.override) == ("never", False, "@contractors")
    # the most specific glob still decides: bob's own override on /docs/bob/** beats both groups
    assert p.decide("/docs/bob/x.md", "bob").allowed
    # once bob's membership in @contractors ends, @team's allow is all that is left
    later = _policy(GROUPS, now=until_time("2027-02-01T00:00:00Z"))
    assert later.decide("/docs/a.md", "bob").allowed


def test_a_peer_named_directly_and_through_a_group_at_equal_specificity_gets_the_deny():
    p = _policy('[[override]]\npeer = "alice"\nglob = "/x/**"\ntier = "public"\n'
                '[[override]]\npeer = "@team"\nglob = "/x/**"\ntier = "private"\n'
                '[group.team]\nmembers = ["alice"]\n')
    assert p.decide("/x/a", "alice").tier == "private"
    flipped = _policy('[[override]]\npeer = "alice"\nglob = "/x/**"\ntier = "never"\n'
                      '[[override]]\npeer = "@team"\nglob = "/x/**"\ntier = "public"\n'
                      '[group.team]\nmembers = ["alice"]\n')
    assert flipped.decide("/x/a", "alice").tier == "never"


def test_peers_rules_and_quotas_take_a_group():
    p = _policy('[[rule]]\nglob = "/t/**"\ntier = "peers"\npeers = ["@team"]\n'
                '[group.team]\nmembers = ["alice", "bob"]\n[group.slow]\nmembers = ["bob"]\n'
                '[quota]\nqueries_per_hour = 600\n'
                '[quota.peer."@team"]\nqueries_per_hour = 100\nburst = 10\n'
                '[quota.peer."@slow"]\nqueries_per_hour = 5\n'
                '[quota.peer.alice]\nburst = 50\n')
    assert p.decide("/t/a", "alice").allowed and not p.decide("/t/a", "carol").allowed
    assert (p.quota_for("alice").queries_per_hour, p.quota_for("alice").burst) == (100, 50)  # her own over @team
    assert (p.quota_for("bob").queries_per_hour, p.quota_for("bob").burst) == (5, 10)  # the smaller of two groups
    assert p.quota_for("carol").queries_per_hour == 600
    assert "@team" in Policy.from_toml(p.to_toml()).to_toml()  # round trip


def test_an_override_that_ends_is_ignored_from_then_on():
    text = '[[override]]\npeer = "alice"\nglob = "/x/**"\ntier = "public"\nuntil = "2027-01-01T00:00:00Z"\n'
    end = until_time("2027-01-01T00:00:00Z")
    assert _policy(text, end - 1).decide("/x/a", "alice").allowed
    assert not _policy(text, end).decide("/x/a", "alice").allowed
    with pytest.raises(Exception) as exc:
        Policy.from_toml(text.replace("2027-01-01T00:00:00Z", "next week"))
    assert exc.value.code == "policy-invalid"


def test_until_reads_durations_dates_and_times_and_refuses_the_rest():
    assert parse_until("90s", NOW) == "2027-01-15T08:01:30Z"
    assert until_time(parse_until("2w", NOW)) == NOW + 14 * 86400
    assert parse_until("2030-05-01", NOW) == "2030-05-01T00:00:00Z"
    assert parse_until("2030-05-01T18:00:00Z", NOW) == "2030-05-01T18:00:00Z"
    for bad in ("yesterday", "0d", "-3h", "2020-01-01", "2040-01-01", "12 h", "2030-02-30"):
        with pytest.raises(UsageError) as exc:
            parse_until(bad, NOW)
        assert exc.value.code == "grant-bad-until"


def test_a_pin_that_ends_is_a_stranger_to_the_host_but_stays_in_the_file(tmp_path):
    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", "ab" * 32)
    reg.add("bob", "cd" * 32)
    set_pin_until(reg, "alice", "2027-01-01T00:00:00Z")
    view = pins_in_force(PeerRegistry.load(tmp_path), until_time("2027-01-01T00:00:00Z"))
    assert view.by_key("ab" * 32) is None and view.by_name("bob") is not None
    view.merge_profile("cd" * 32, {"displayName": "Bob"})  # a save through the view keeps the ended pin
    again = PeerRegistry.load(tmp_path)
    assert again.by_name("alice").until == "2027-01-01T00:00:00Z"
    assert again.to_json(again.by_name("bob"))["until"] is None


# ----------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def kith():
    return invoke


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_owner_sees_groups_and_when_each_grant_ends(kith, tmp_path):
    assert kith(tmp_path, "peers", "add", "alice", "ab" * 32, "--until", "7d").exit_code == 0
    assert kith(tmp_path, "peers", "add", "bob", "cd" * 32).exit_code == 0
    out = _json(kith(tmp_path, "peers", "group", "add", "team", "alice", "bob", "--until", "2030-01-01", "--json"))
    assert out["members"] == [{"name": "alice", "until": "2030-01-01T00:00:00Z"},
                              {"name": "bob", "until": "2030-01-01T00:00:00Z"}] and out["unpinnedPeers"] == []
    rule = _json(kith(tmp_path, "policy", "set", "/docs/**", "public", "--for", "@team", "--until", "3d", "--json"))
    assert rule["for"] == "@team" and rule["until"].endswith("Z")
    listed = {p["name"]: p for p in _json(kith(tmp_path, "peers", "list", "--json"))["peers"]}
    assert listed["alice"]["until"] is not None and listed["bob"]["until"] is None
    assert listed["bob"]["groups"] == [{"group": "team", "until": "2030-01-01T00:00:00Z"}]
    text = kith(tmp_path, "peers", "list").stdout
    assert "@team (until 2030-01-01T00:00:00Z)" in text
    assert _json(kith(tmp_path, "policy", "list", "--json"))["overrides"][0]["until"] == rule["until"]
    assert _json(kith(tmp_path, "peers", "group", "remove", "team", "bob", "--json"))["members"] == \
        [{"name": "alice", "until": "2030-01-01T00:00:00Z"}]
    assert _json(kith(tmp_path, "peers", "group", "list", "--json"))["groups"][0]["group"] == "team"
    missing = kith(tmp_path, "peers", "group", "remove", "nope")
    assert missing.exit_code == 1 and missing.exception.code == "group-not-found"


def test_a_bad_until_writes_nothing(kith, tmp_path):
    before = (initialized(tmp_path) / "policy.toml").exists()
    for args in (("peers", "add", "carol", "ef" * 32, "--until", "soon"),
                 ("peers", "group", "add", "team", "carol", "--until", "2001-01-01"),
                 ("policy", "set", "/x/**", "public", "--for", "carol", "--until", "0h")):
        r = kith(tmp_path, *args)
        assert getattr(r.exception, "code", None) == "grant-bad-until", r.output
    assert PeerRegistry.load(tmp_path).by_name("carol") is None
    assert (tmp_path / "policy.toml").exists() == before
    r = kith(tmp_path, "policy", "set", "/x/**", "public", "--until", "3d")
    assert r.exception.code == "usage"  # --until without --for


# ----------------------------------------------------------------------------- a real host
def _hits(message) -> list:
    return message["envelope"]["results"]


def _ended_codes(guest) -> list[str]:
    return [c for c, _m in guest.outcome.remote_errors] if guest.outcome else []


def _across_the_end(home: Path, alice: Identity, prepare, advance_s: float) -> tuple:
    """A MemoryHost for ``home`` (``prepare(host)`` sets the grant's end on its clock before it
    runs): alice connects and asks "alpha", the clock moves ``advance_s`` past the end, her
    session ends; she connects again and asks again. Returns ``(host, first, again)``."""
    async def scenario():
        host = MemoryHost(home)
        prepare(host)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            first = await _connect(tg, host, alice)
            first.ask("alpha")
            await first.answered(1)
            host.clock.advance(advance_s)
            await host.until(lambda: first.outcome is not None)
            again = await _connect(tg, host, alice)
            again.ask("alpha")
            await again.answered(1)
            again.ask(None)
            host.stop.set()
        return host, first, again

    return anyio.run(scenario, backend="asyncio")


def test_a_pin_that_ends_mid_session_ends_the_session_and_the_peer_returns_a_stranger(tmp_path):
    home = _host_home(tmp_path)
    (home / "policy.toml").write_text('[[rule]]\nglob = "/docs/**"\ntier = "private"\n'
                                      '[[override]]\npeer = "alice"\nglob = "/docs/**"\ntier = "public"\n')
    alice = Identity(os.urandom(32))
    reg = PeerRegistry.load(home)
    reg.add("alice", alice.public_key)

    def prepare(host: MemoryHost) -> None:
        set_pin_until(PeerRegistry.load(home), "alice", time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                       time.gmtime(host.clock.time() + 60)))

    host, first, again = _across_the_end(home, alice, prepare, 61)
    assert _hits(first.results[0]) and "session-grant-expired" in _ended_codes(first)
    [ev] = host.of("grant-expired")
    assert (ev["kind"], ev["peer_name"], ev["sessions_ended"]) == ("pin", "alice", 1)
    started = host.of("session-started")
    assert [e["peer_name"] for e in started] == ["alice", None]  # a stranger the second time
    assert again.results[0]["status"] == "no-verified-results" and not _hits(again.results[0])  # nothing served
    audit = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    assert any(a.get("event") == "grant-expired" and a.get("peer_name") == "alice" for a in audit)


@pytest.mark.parametrize("ends", ["membership", "override"])
def test_a_group_grant_that_ends_mid_session_is_taken_away(tmp_path, ends):
    """The membership in @team ends, or @team's override does: alice's session ends and,
    still pinned, she is served nothing the group gave her."""
    home = _host_home(tmp_path)
    alice = Identity(os.urandom(32))
    PeerRegistry.load(home).add("alice", alice.public_key)

    def prepare(host: MemoryHost) -> None:
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(host.clock.time() + 30))
        member_end = f'until = {{ alice = "{end}" }}\n' if ends == "membership" else ""
        override_end = f'until = "{end}"\n' if ends == "override" else ""
        (home / "policy.toml").write_text(
            '[[rule]]\nglob = "/docs/**"\ntier = "private"\n'
            f'[[override]]\npeer = "@team"\nglob = "/docs/**"\ntier = "public"\n{override_end}'
            f'[group.team]\nmembers = ["alice"]\n{member_end}')

    host, first, again = _across_the_end(home, alice, prepare, 31)
    assert _hits(first.results[0]) and "session-grant-expired" in _ended_codes(first)
    [ev] = host.of("grant-expired")
    if ends == "membership":
        assert (ev["kind"], ev["group"], ev["peer_name"], ev["sessions_ended"]) == ("group", "team", "alice", 1)
    else:
        assert (ev["kind"], ev["peer_name"], ev["glob"], ev["sessions_ended"]) == ("override", "@team", "/docs/**", 1)
    assert [e["peer_name"] for e in host.of("session-started")] == ["alice", "alice"]  # still pinned
    assert not _hits(again.results[0])  # but the group's grant is gone


def test_the_dashboard_shows_groups_and_when_each_grant_ends(kith, tmp_path):
    from node.local.dashboard.app import run_dashboard_in_thread

    from support.dashboard import logged_in as _logged_in

    home = initialized(tmp_path)
    assert kith(home, "peers", "add", "alice", "ab" * 32, "--until", "2030-01-01").exit_code == 0
    assert kith(home, "peers", "group", "add", "team", "alice", "--until", "2029-06-01").exit_code == 0
    assert kith(home, "policy", "set", "/docs/**", "public", "--for", "@team", "--until", "2029-07-01").exit_code == 0
    with run_dashboard_in_thread(home) as (base, login):
        client = _logged_in(base, login)
        peers, policy = client.get("/peers").text, client.get("/policy").text
    row = peers.split('data-name="alice"', 1)[1].split("</tr>", 1)[0]
    assert "@team" in row and "until 2029-06-01T00:00:00Z" in row and "2030-01-01T00:00:00Z" in row
    assert 'data-group="team"' in peers
    assert "@team" in policy and "2029-07-01T00:00:00Z" in policy


def test_status_lists_every_grant_that_ends_soonest_first(kith, tmp_path):
    home = initialized(tmp_path)
    kith(home, "peers", "add", "alice", "ab" * 32, "--until", "2030-01-01")
    kith(home, "peers", "group", "add", "team", "alice", "--until", "2029-06-01")
    out = _json(kith(home, "status", "--json"))
    assert [(g["kind"], g["peer_name"], g["until"]) for g in out["grants"]] == \
        [("group", "alice", "2029-06-01T00:00:00Z"), ("pin", "alice", "2030-01-01T00:00:00Z")]
    text = kith(home, "status").stdout
    assert "grants that end: 2" in text and "alice in @team until 2029-06-01T00:00:00Z" in text


def test_status_shows_this_homes_person_its_devices_and_rotations(kith, tmp_path):
    from node.trust.identity import load_identity
    from node.trust.person import init_person

    home = initialized(tmp_path)
    rec, _ = init_person(home, load_identity(home), "laptop")
    assert kith(home, "person", "rotate", "--yes").exit_code == 0
    ident = _json(kith(home, "status", "--json"))["identity"]
    assert ident["person"] != rec.person_key and ident["rotations"] == 1
    assert ident["devices"] == [{"name": "laptop", "key": load_identity(home).public_key, "this": True,
                                 "revoked": False}]
    assert "devices: laptop (this device)  rotated 1 time(s)" in kith(home, "status").stdout


def test_kith_person_rotate_show_and_import_through_the_cli(kith, tmp_path):
    from node.trust.person import bind_device, load_person, load_person_secret, save_person
    from node.trust.identity import init_identity

    from node.trust.identity import load_identity
    from node.trust.person import init_person

    home = initialized(tmp_path / "laptop")
    init_person(home, load_identity(home), "laptop")
    (tmp_path / "desk").mkdir()
    desk, _ = init_identity(tmp_path / "desk")
    rec = load_person(home)
    bind_device(rec, load_person_secret(home), desk.public_key, "desk")
    save_person(home, rec)
    save_person(tmp_path / "desk", load_person(home))
    before = _json(kith(home, "person", "show", "--json"))
    got = _json(kith(home, "person", "rotate", "--yes", "--json"))
    assert got["old_person_key"] == before["person_key"] and got["words"] != got["old_words"]
    assert sorted(got["devices"]) == sorted(d["name"] for d in before["devices"]) and got["via"] == "person"
    shown = kith(home, "person", "show", "--json")
    (tmp_path / "rotated.json").write_text(shown.stdout)
    after = json.loads(shown.stdout)
    assert after["rotations"][0]["from"] == before["person_key"] and after["words"] == got["words"]
    imported = _json(kith(tmp_path / "desk", "person", "import", str(tmp_path / "rotated.json"), "--json"))
    assert imported["person_key"] == got["person_key"]
    again = kith(tmp_path / "desk", "person", "import", str(tmp_path / "rotated.json"))
    assert again.exception.code == "person-not-successor"
    lost = kith(tmp_path / "desk", "person", "rotate", "--yes")  # the desk never held the person key
    assert lost.exception.code == "device-no-person-key"


def test_a_peers_only_host_refuses_a_pin_that_ended(tmp_path):
    home = _host_home(tmp_path)
    alice, bob = Identity(os.urandom(32)), Identity(os.urandom(32))
    reg = PeerRegistry.load(home)
    reg.add("alice", alice.public_key)
    reg.add("bob", bob.public_key)

    async def scenario():
        host = MemoryHost(home, peers_only=True)
        set_pin_until(PeerRegistry.load(home), "alice", time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                       time.gmtime(host.clock.time() - 1)))
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            ended = await _connect(tg, host, alice)
            await host.until(lambda: ended.outcome is not None)
            still = await _connect(tg, host, bob)
            still.ask("alpha")
            await still.answered(1)
            still.ask(None)
            host.stop.set()
        return host, ended, still

    host, ended, still = anyio.run(scenario, backend="asyncio")
    assert ended.outcome.code == "handshake-not-admitted" and not ended.results
    assert still.results[0]["status"] == "ok"
    assert not host.of("grant-expired")  # it ended before the host started: nothing to end


def test_a_grant_that_ended_reads_ended_everywhere_the_owner_looks(kith, tmp_path):
    """A pin, a membership and an override whose end passed (the host is told, the files
    keep them) read ``ended <end>`` in `kith peers list`, `kith policy list` and the
    dashboard's Peers and Policy pages, as in `kith status` and `kith peers group list`;
    one still in force reads its end alone (``until``)."""
    from node.local.dashboard.app import run_dashboard_in_thread

    from support.dashboard import logged_in as _logged_in

    home = initialized(tmp_path)
    assert kith(home, "peers", "add", "alice", "ab" * 32, "--until", "2030-01-01").exit_code == 0
    assert kith(home, "peers", "add", "bob", "cd" * 32).exit_code == 0
    assert kith(home, "peers", "group", "add", "team", "alice", "--until", "2030-01-01").exit_code == 0
    assert kith(home, "peers", "group", "add", "team", "bob", "--until", "2031-01-01").exit_code == 0
    assert kith(home, "policy", "set", "/docs/**", "public", "--for", "@team", "--until", "2030-01-01").exit_code == 0
    for name in ("peers.json", "policy.toml"):  # those ends pass (bob's membership stays)
        (home / name).write_text((home / name).read_text().replace("2030-01-01", "2020-01-01"))
    past = "2020-01-01T00:00:00Z"
    peers_text = kith(home, "peers", "list").stdout
    alice = next(line for line in peers_text.splitlines() if line.strip().startswith("alice"))
    bob = next(line for line in peers_text.splitlines() if line.strip().startswith("bob"))
    assert f"@team (ended {past})" in alice and f"ended {past}" in alice.split(f"@team (ended {past})")[1]
    assert "@team (until 2031-01-01T00:00:00Z)" in bob
    assert f"ended {past}" in kith(home, "policy", "list").stdout
    with run_dashboard_in_thread(home) as (base, login):
        client = _logged_in(base, login)
        peers, policy = client.get("/peers").text, client.get("/policy").text
    row = peers.split('data-name="alice"', 1)[1].split("</tr>", 1)[0]
    assert row.count(f"ended {past}") == 2 and "until 2020" not in row
    groups = peers.split('data-group="team"', 1)[1].split("</tr>", 1)[0]
    assert f"ended {past}" in groups and "until 2031-01-01T00:00:00Z" in groups
    assert f"ended {past}" in policy


def test_every_view_reads_ended_and_revoked_from_one_function() -> None:
    """Issue 32: no view computes "ended" or "revoked" its own way. The CLI and the
    dashboard word a grant's end with node.common.grants.until_text / ended, and a device's
    revocation with node.trust.revocation_list (own_devices, revoked_seen_devices)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    views = [*(repo / "node" / "cli").glob("*.py"), *(repo / "node" / "local" / "dashboard").rglob("*.py"),
             *(repo / "node" / "local" / "dashboard").rglob("*.html")]
    own_way = []
    for path in views:
        text = path.read_text(encoding="utf-8")
        if re.search(r"\bin_force\(", text) or ".revokes(" in text:
            own_way.append(str(path.relative_to(repo)))
    assert own_way == [], own_way
