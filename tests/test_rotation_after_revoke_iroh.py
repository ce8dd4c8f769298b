"""A rotation after a stolen device was revoked (issue 22 items 3 and 4; specs/peers.md §10,
§11), through real `kith` processes and real iroh on loopback.

The owner revokes the stolen laptop, then rotates the person key (as the README suggests
after a theft). The rotation must not re-bind the revoked laptop (nor tell the owner to copy
the new record onto it), `kith device list` must still mark it revoked, and the revocation
must keep travelling: a host that pinned the person's *old* key and never saw the list learns
it from the desk's next handshake after the rotation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.trust.revocation_list import RevocationStore

from support.cli import kith
from support.devices import pair_device
from support.homes import FIXTURE
from support.hosts import HostProcess as Host, prepare_host

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def test_a_rotation_leaves_a_revoked_device_out_and_its_revocation_keeps_travelling(tmp_path: Path):
    desk, laptop = tmp_path / "desk", tmp_path / "laptop"
    made = json.loads(kith(desk, "init", "--json", "--device-name", "desk").stdout)
    laptop_key = pair_device(desk, laptop)

    r = kith(desk, "device", "revoke", "laptop", "--json")
    assert r.returncode == 0, r.stderr
    r = kith(desk, "person", "rotate", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    rotated = json.loads(r.stdout)
    assert (rotated["devices"], rotated["dropped"]) == (["desk"], ["laptop"])
    r = kith(desk, "person", "rotate", "--yes")  # a second rotation: the laptop stays out, and is not named
    assert r.returncode == 0, r.stderr
    assert "laptop" not in r.stdout, r.stdout
    listed = json.loads(kith(desk, "device", "list", "--json").stdout)["devices"]
    assert ("laptop", False) not in [(d["name"], d["revoked"]) for d in listed]  # revoked, or not bound any more
    assert ("desk", False) in [(d["name"], d["revoked"]) for d in listed]
    assert kith(desk, "person", "show", "--json").returncode == 0

    # a host that pinned the old person key and never saw the list
    home = prepare_host(tmp_path, FIXTURE, ("/corpus/*.md", "public"))
    assert kith(home, "peers", "add", "alice", made["person_key"], "--devices").returncode == 0
    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    try:
        r = kith(desk, "join", str(invite), "--local", "--trust", "--json", "--query", "alpha")
        assert r.returncode == 0, r.stderr
        r = kith(laptop, "join", str(invite), "--local", "--trust", "--json", "--query", "alpha")
        assert r.returncode == 1, r.stdout
    finally:
        _rc, host_out, _err = host.stop()
    events = [json.loads(line) for line in host_out.splitlines() if line.strip()]
    assert [(e["peer_name"], e["devices"]) for e in events if e["event"] == "device-revoked"] == [
        ("alice", [laptop_key])]
    kept = RevocationStore.load(home)
    assert kept.revokes(laptop_key, kept.persons) is not None
