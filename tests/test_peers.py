"""Trusted peers, profiles in the handshake, approvals CLI, leak-free diagnostics (issue 5)."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import pytest

from node.engine.session import SessionReady
from node.common.errors import CODES, KithError, PolicyError
from node.host.sessions import admission
from node.trust.peers import PeerRegistry, clean_profile, load_own_profile, save_own_profile
from node.policy.approvals import Approvals
from node.policy.redact import RedactingFilter, redact
from node.protocol.spec import load_spec

from support.cli import invoke
from support.engines import EnginePair
from support.homes import PROTOCOLS, new_identity

ALICE, BOB, EVE = "a1" * 32, "b2" * 32, "e5" * 32


@pytest.fixture(scope="module")
def kith():
    return lambda home, *args: invoke(home, *args, env={"COLUMNS": "250"})


# --- registry ------------------------------------------------------------------------------------


def test_add_list_rank_remove(tmp_path: Path) -> None:
    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", ALICE, "works on storage engines")
    reg.add("bob", BOB, "frontend", profile={"displayName": "Bobby", "shortDescr": "SQLite fan"})
    assert stat.S_IMODE((tmp_path / "peers.json").stat().st_mode) == 0o600
    again = PeerRegistry.load(tmp_path)
    assert again.by_key(BOB).profile == {"displayName": "Bobby", "shortDescr": "SQLite fan"}
    assert again.by_key(BOB).profile_synced_at
    assert [r.name for _, r in again.rank("sqlite")] == ["bob"]          # shared profile
    assert [r.name for _, r in again.rank("storage")] == ["alice"]      # own note
    assert [r.name for _, r in again.rank("ali")] == ["alice"]          # local name
    assert again.rank("nothing-like-it") == []
    for call, code in ((lambda: again.add("alice", EVE), "peer-exists"),
                       (lambda: again.add("carol", ALICE), "peer-key-pinned"),
                       (lambda: again.add("-bad", EVE), "peer-bad-name"),
                       (lambda: again.add("x" * 65, EVE), "peer-bad-name"),
                       (lambda: again.remove("carol"), "peer-not-found")):
        with pytest.raises(KithError) as exc:
            call()
        assert exc.value.code == code
    with pytest.raises(KithError) as exc:
        again.add("carol", "A1" * 32)
    assert exc.value.code == "bad-hex"
    again.remove("alice")
    assert PeerRegistry.load(tmp_path).by_name("alice") is None


def test_broken_registry_is_a_typed_error(tmp_path: Path) -> None:
    for text in ("{not json", '{"peers": {"../x": {"publicKey": "%s"}}}' % ALICE,
                 '{"peers": {"a": {"publicKey": "%s"}, "b": {"publicKey": "%s"}}}' % (ALICE, ALICE)):
        (tmp_path / "peers.json").write_text(text)
        with pytest.raises(KithError) as exc:
            PeerRegistry.load(tmp_path)
        assert exc.value.code == "config-invalid" and "peers.json" in exc.value.message


def test_profiles_are_cleaned_and_merged_only_for_known_peers(tmp_path: Path) -> None:
    hostile = {"displayName": "Al\u202eice\u200b\x1b[31m", "fullName": "A" * 500, "role": "admin",
               "description": "line1\nline2", "shortDescr": 42}
    clean = clean_profile(hostile)
    assert clean == {"displayName": "Alice [31m", "fullName": "A" * 128, "description": "line1\nline2"}
    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", ALICE)
    assert reg.merge_profile(EVE, {"displayName": "Eve"}) is None          # unknown: never added
    assert reg.merge_profile(ALICE, {}) is None                           # nothing shared: no change
    rec = reg.merge_profile(ALICE, hostile)
    assert rec.profile == clean and rec.profile_synced_at
    loaded = PeerRegistry.load(tmp_path)
    assert set(loaded.peers) == {"alice"} and loaded.by_key(ALICE).profile == clean


def test_claimed_pinned_name_with_other_key(tmp_path: Path) -> None:
    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", ALICE, profile={"displayName": "Ally"})
    assert reg.claimed_by_other(EVE, {"displayName": "ALICE"}).name == "alice"
    assert reg.claimed_by_other(EVE, {"displayName": "ally"}).name == "alice"
    assert reg.claimed_by_other(EVE, {"displayName": "Eve"}) is None
    assert reg.claimed_by_other(ALICE, {"displayName": "alice"}) is None  # the pinned key itself
    admit = admission(reg, peers_only=False)
    assert admit(EVE, {}) is True
    with pytest.raises(KithError) as exc:
        admit(EVE, {"displayName": "alice"})
    assert exc.value.code == "peer-key-changed"
    only = admission(reg, peers_only=True)
    assert only(ALICE, {}) is True and only(EVE, {}) is False


def test_own_profile_round_trip(tmp_path: Path) -> None:
    assert load_own_profile(tmp_path) == {}
    save_own_profile(tmp_path, {"displayName": "Host", "extra": 1})
    assert load_own_profile(tmp_path) == {"displayName": "Host"}
    assert stat.S_IMODE((tmp_path / "profile.json").stat().st_mode) == 0o600


# --- profiles travel in the handshake (engine, memory) -------------------------------------------


def test_profiles_travel_both_ways_in_the_handshake() -> None:
    spec = load_spec(PROTOCOLS / "echo")
    host, guest = new_identity(), new_identity()
    pair = EnginePair(spec, host, guest)
    pair.host._host.profile = {"displayName": "Host H"}
    pair.guest._guest.profile = {"displayName": "Guest G"}
    pair.handshake()
    [h_ready] = pair.of(pair.host_events, SessionReady)
    [g_ready] = pair.of(pair.guest_events, SessionReady)
    assert h_ready.peer_profile == {"displayName": "Guest G"}
    assert g_ready.peer_profile == {"displayName": "Host H"}


def test_guest_refuses_a_host_claiming_a_pinned_name() -> None:
    from node.common.errors import HandshakeError

    spec = load_spec(PROTOCOLS / "echo")
    host, guest = new_identity(), new_identity()
    pair = EnginePair(spec, host, guest)
    pair.host._host.profile = {"displayName": "alice"}

    def admit_host(key, profile):
        raise HandshakeError("host-key-changed", "'alice' is pinned to " + ALICE)

    pair.guest._guest.admit_host = admit_host
    pair.handshake()
    assert pair.guest.close_event.code == "host-key-changed"
    assert pair.host.close_event.code == "host-key-changed"
    # the host learns only the code and its fixed text, never the guest's local message
    assert pair.host.close_event.message == CODES["host-key-changed"][1]


# --- leaks: peers get fixed messages; logs are redacted ------------------------------------------


def test_peer_sees_code_and_fixed_message_only() -> None:
    from node.common.errors import HandshakeError

    spec = load_spec(PROTOCOLS / "echo")
    host, guest = new_identity(), new_identity()
    pair = EnginePair(spec, host, guest)

    def admit(key, profile):
        raise HandshakeError("handshake-not-admitted", "/home/owner/secret at 10.0.0.5:4433 key " + ALICE)

    pair.host._host.admit = admit
    pair.handshake()
    assert pair.host.close_event.message.startswith("/home/owner")  # the local outcome keeps detail
    assert pair.guest.close_event.code == "handshake-not-admitted"
    assert pair.guest.close_event.message == CODES["handshake-not-admitted"][1]


def test_redact() -> None:
    text = (f"failed reading /home/owner/docs/notes/a.md for {ALICE} via "
            "https://kith.example.org:8443/api/v1/sessions?token=abc&x=1 from 192.168.1.20:51000 "
            "and [fe80::1]:443 and relay.example.net:3340 and C:\\Users\\me\\x.txt")
    out = redact(text, ["/home/owner/docs"])
    for secret in ("/home/owner", ALICE, "kith.example.org", "token=abc", "192.168.1.20", "fe80::1",
                   "relay.example.net", "Users\\me"):
        assert secret not in out, secret
    assert "https://<host>/api/v1/sessions?<redacted>" in out
    assert redact("code handshake-not-admitted: ok") == "code handshake-not-admitted: ok"


def test_redacting_filter_on_a_handler(tmp_path: Path) -> None:
    import io

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(RedactingFilter([str(tmp_path)]))
    log = logging.getLogger("kith.test.redact")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("cannot open %s (peer %s)", tmp_path / "x.md", ALICE)
    finally:
        log.removeHandler(handler)
    assert str(tmp_path) not in buf.getvalue() and ALICE not in buf.getvalue()
    assert "cannot open <path>" in buf.getvalue()


# --- CLI: kith peers, kith approvals, kith policy --for ----------------------------------------------


def test_peers_cli(kith, tmp_path: Path) -> None:
    r = kith(tmp_path, "peers", "add", "alice", ALICE, "--note", "storage team", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["publicKey"] == ALICE
    assert kith(tmp_path, "peers", "add", "bob", BOB).exit_code == 0
    r = kith(tmp_path, "peers", "add", "alice", EVE)
    assert r.exit_code == 1 and r.exception.code == "peer-exists"
    listed = json.loads(kith(tmp_path, "peers", "list", "--json").stdout)["peers"]
    assert [p["name"] for p in listed] == ["alice", "bob"]
    ranked = json.loads(kith(tmp_path, "peers", "list", "--rank", "storage", "--json").stdout)["peers"]
    assert [p["name"] for p in ranked] == ["alice"] and ranked[0]["score"] > 0
    assert "alice" in kith(tmp_path, "peers", "list").stdout
    assert kith(tmp_path, "peers", "remove", "bob").exit_code == 0
    r = kith(tmp_path, "peers", "remove", "bob")
    assert r.exit_code == 1 and r.exception.code == "peer-not-found"
    r = kith(tmp_path, "peers", "profile", "--display-name", "Me", "--json")
    assert json.loads(r.stdout) == {"displayName": "Me"}


def test_approvals_cli(kith, tmp_path: Path) -> None:
    store = Approvals(tmp_path)
    req = store.request(ALICE, "alice", "salary bands", ["/docs/ask/salary.md"])
    other = store.request(BOB, None, "roadmap", ["/docs/ask/roadmap.md"])
    listed = json.loads(kith(tmp_path, "approvals", "list", "--json").stdout)["requests"]
    assert sorted((r["id"], r["status"]) for r in listed) == sorted([(req.id, "pending"), (other.id, "pending")])
    assert req.id in kith(tmp_path, "approvals", "list").stdout
    r = kith(tmp_path, "approvals", "approve", req.id, "--remember", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["status"] == "approved"
    assert kith(tmp_path, "approvals", "deny", other.id).exit_code == 0
    assert json.loads(kith(tmp_path, "approvals", "list", "--json").stdout)["requests"] == []
    everything = json.loads(kith(tmp_path, "approvals", "list", "--all", "--json").stdout)["requests"]
    assert {r["status"] for r in everything} == {"approved", "denied"}
    r = kith(tmp_path, "approvals", "approve", req.id)
    assert r.exit_code == 1 and r.exception.code == "approval-decided"
    r = kith(tmp_path, "approvals", "approve", "../../peers")
    assert r.exit_code == 1 and r.exception.code == "approval-not-found"
    assert Approvals(tmp_path).promoted(ALICE).allow == {"/docs/ask/salary.md"}


def test_policy_for_override_cli(kith, tmp_path: Path) -> None:
    assert kith(tmp_path, "policy", "set", "/docs/**", "private").exit_code == 0
    r = kith(tmp_path, "policy", "set", "/docs/**", "public", "--for", "alice", "--json")
    out = json.loads(r.stdout)
    assert {k: out[k] for k in ("glob", "tier", "peers", "for")} == {"glob": "/docs/**", "tier": "public",
                                                                     "peers": [], "for": "alice"}
    assert (out["matches"], out["decides"]) == (0, 0)  # nothing indexed in this home
    r = kith(tmp_path, "policy", "explain", "/docs/a.md", "--peer", "alice", "--json")
    assert json.loads(r.stdout) == {"canonical": "/docs/a.md", "tier": "public", "allowed": True,
                                    "matched": "/docs/**", "override": "alice"}
    r = kith(tmp_path, "policy", "explain", "/docs/a.md", "--peer", "bob", "--json")
    assert json.loads(r.stdout)["allowed"] is False
    assert kith(tmp_path, "policy", "set", "/docs/**", "peers", "--for", "alice").exception.code == "usage"
    listed = json.loads(kith(tmp_path, "policy", "list", "--json").stdout)
    assert listed["overrides"] == [{"glob": "/docs/**", "tier": "public", "peers": [], "for": "alice"}]
    assert json.loads(kith(tmp_path, "policy", "unset", "/docs/**", "--for", "alice", "--json").stdout)["removed"]
    assert json.loads(kith(tmp_path, "policy", "list", "--json").stdout)["rules"] == [
        {"glob": "/docs/**", "tier": "private", "peers": []}]


def test_policy_error_is_a_policy_error() -> None:
    assert issubclass(PolicyError, KithError)


def test_peers_code_of_a_person_pin_gives_each_devices_words(tmp_path: Path) -> None:
    """A person pin's key is a person key, which no device's words are made of: `kith
    peers code` showed words nobody compares (issue 32). It gives those of each device
    seen, the words that device and this node see in a session."""
    import os
    import subprocess
    import sys

    from node.trust.identity import load_identity
    from node.trust.pairing import pairing_code
    from node.trust.peers import PeerRegistry, note_device
    from node.trust.signing import public_key_of

    home = tmp_path / "home"

    def kith(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "node.cli.main", "--home", str(home), *args],
                              capture_output=True, text=True, timeout=120)

    assert kith("init").returncode == 0
    person = public_key_of(os.urandom(32))
    assert kith("peers", "add", "alice", person, "--devices").returncode == 0
    none_yet = kith("peers", "code", "alice")
    assert none_yet.returncode == 0 and "none of its devices has joined yet" in none_yet.stdout, none_yet.stdout
    own = load_identity(home).public_key
    assert pairing_code(own, person) not in none_yet.stdout
    laptop = os.urandom(32).hex()
    registry = PeerRegistry.load(home)
    note_device(registry, registry.peers["alice"], laptop, "laptop")
    got = json.loads(kith("peers", "code", "alice", "--json").stdout)
    assert got["pairing_code"] is None
    assert got["devices"] == [{"key": laptop, "name": "laptop", "pairing_code": pairing_code(own, laptop)}]
    text = kith("peers", "code", "alice").stdout
    assert f"laptop ({laptop[:16]}…): {pairing_code(own, laptop)}" in text, text


@pytest.mark.parametrize("cmd", ["code", "block", "unblock"])
def test_an_unknown_peer_name_hints_at_the_names_and_keys_of_that_command(tmp_path: Path, cmd: str) -> None:
    """`kith peers code|block|unblock NAME` of a name that is not pinned (a real process):
    the hint names where the pinned names are and that a key is taken too — never "to
    block a key" for a command that does not block."""
    from support.cli import kith as run_kith

    r = run_kith(tmp_path / "home", "peers", cmd, "zz", init=True)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "error [peer-not-found]" in r.stderr and "kith peers list" in r.stderr, r.stderr
    if cmd != "block":
        assert "to block" not in r.stderr, r.stderr
