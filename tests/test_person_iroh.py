"""Person and device over real iroh on loopback, through real `kith` processes (issue 22
item 1): a guest home made by `kith init` joins and the host's `session-started` event names
its person and device; a home from before person keys (only `identity.key`) joins as
before, device-key-only, and after `kith init` migrates it keeps its device key and gains a
person the host then sees."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.cli import kith
from support.homes import FIXTURE, pin_host
from support.hosts import HostProcess as Host, prepare_host

pytestmark = pytest.mark.iroh


def _started(host: Host, peer: str) -> dict:
    """Read host events until the ``session-started`` of ``peer`` (bounded by readline)."""
    for _ in range(50):
        ev = json.loads(host.readline(60))
        if ev.get("event") == "session-started" and ev.get("peer") == peer:
            return ev
    raise AssertionError("no session-started for the guest")


def test_the_host_sees_person_and_device_of_real_guests_and_an_old_home_joins_as_before(tmp_path: Path):
    home = prepare_host(tmp_path, FIXTURE)
    invite = tmp_path / "invite.json"
    new_home, old_home = tmp_path / "new", tmp_path / "old"
    made = json.loads(kith(new_home, "init", "--json", "--device-name", "laptop").stdout)
    assert made["person_created"] and len(made["recovery_words"].split()) == 24
    old_home.mkdir(mode=0o700)
    (old_home / "identity.key").write_text(os.urandom(32).hex() + "\n")
    (old_home / "identity.key").chmod(0o600)
    host = Host(home, "--invite-file", str(invite))
    try:
        r = kith(new_home, "join", str(invite), "--local", "--trust", "--query", "installing")
        assert r.returncode in (0, 3), r.stderr  # answered (3: no results is fine too)
        ev = _started(host, made["public_key"])
        assert ev["person"] == made["person_key"] and ev["device_name"] == "laptop"

        r = kith(old_home, "join", str(invite), "--local", "--trust", "--query", "installing")
        assert r.returncode in (0, 3), r.stderr
        old_key = json.loads(kith(old_home, "status", "--json").stdout)["identity"]["key"]
        ev = _started(host, old_key)
        assert ev["person"] is None and ev["device_name"] is None  # device-key-only, exactly as before

        migrated = json.loads(kith(old_home, "init", "--json", "--device-name", "old box").stdout)
        assert migrated["public_key"] == old_key and migrated["person_created"]
        r = kith(old_home, "join", str(invite), "--local", "--trust", "--query", "installing")
        assert r.returncode in (0, 3), r.stderr
        ev = _started(host, old_key)
        assert ev["person"] == migrated["person_key"] and ev["device_name"] == "old box"
    finally:
        host.stop()
    listed = json.loads(kith(old_home, "device", "list", "--json").stdout)
    assert listed["person_key"] == migrated["person_key"] and listed["holds_person_key"]
    assert [(d["name"], d["key"], d["this"]) for d in listed["devices"]] == [("old box", old_key, True)]
    audited = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    started = [(r["peer"], r.get("person"), r.get("device_name")) for r in audited if r["event"] == "session-started"]
    assert started == [(made["public_key"], made["person_key"], "laptop"), (old_key, None, None),
                       (old_key, migrated["person_key"], "old box")]
    status = json.loads(kith(old_home, "status", "--json").stdout)
    assert status["identity"] == {**status["identity"], "key": old_key, "person": migrated["person_key"]}


#: a `kith` process that says on stderr each time it opens person.json (a Python audit
#: hook: the real process, nothing replaced; written at once, as `kith join` may end with
#: os._exit, which runs no atexit)
_COUNTING = """
import os, sys
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and os.fsdecode(args[0]).endswith("person.json"):
        os.write(2, b"\\n[test] person.json opened\\n")
sys.addaudithook(hook)
from node.cli.main import main
main(sys.argv[1:])
"""


def _opens_of_person(home: Path, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """``kith --home HOME ARGS`` as :data:`_COUNTING`: its result and how many times it
    opened person.json."""
    import sys

    r = subprocess.run([sys.executable, "-c", _COUNTING, "--home", str(home), *args], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    return r, r.stderr.count("[test] person.json opened")


def test_ask_and_join_read_the_person_record_once(tmp_path: Path):
    """Issue 42 review: `kith ask` and `kith join` read person.json to fail early on a
    damaged one, then again for each session's handshake (its chain, then its revocation
    list): three opens for one peer. Now the record read first is the one the handshake
    carries (`kith ask`: the session pool's view of the file)."""
    home = prepare_host(tmp_path, FIXTURE)
    invite = tmp_path / "invite.json"
    guest = tmp_path / "guest"
    made = json.loads(kith(guest, "init", "--json").stdout)
    host = Host(home, "--invite-file", str(invite))
    try:
        pin_host(guest, "kb", invite)
        r, opens = _opens_of_person(guest, "join", str(invite), "--local", "--trust", "--query", "installing")
        assert r.returncode in (0, 3), r.stderr  # answered (3: no results is fine too)
        assert _started(host, made["public_key"])["person"] == made["person_key"]  # the chain was carried
        assert opens == 1
        r, opens = _opens_of_person(guest, "ask", "installing", "--peer", "kb", "--offline", "--json")
        row = json.loads(r.stdout)["peers"][0]
        assert row["status"] in ("ok", "no-verified-results"), r.stdout  # answered (no result is fine too)
        assert _started(host, made["public_key"])["person"] == made["person_key"]
        assert opens == 1
    finally:
        host.stop()
