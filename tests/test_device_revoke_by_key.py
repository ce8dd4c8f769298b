"""`kith device revoke` when two devices of one person share a name (issue 22 item 3): the
default device name is the machine's host name, so two homes on one machine — or a new
device named like the first — are both called the same. The owner must still be able to
revoke the other one: by its key (or a unique prefix of 8+ hex, as `kith device list` shows
it), while the shared name alone refuses with a hint naming the way out. Real processes,
real iroh on loopback (the pairing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import kith
from support.devices import pair_device

pytestmark = [pytest.mark.iroh]


def test_a_device_sharing_this_devices_name_is_revoked_by_its_key(tmp_path: Path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert kith(first, "init", "--device-name", "box").returncode == 0
    other = pair_device(first, second, name="box")

    r = kith(first, "device", "revoke", "box")
    assert r.returncode == 1 and "error [device-revoke-this]" in r.stderr, r.stderr
    assert "by its key" in r.stderr, r.stderr  # the hint says how to name the other one
    r = kith(first, "device", "revoke", "0123abcd")  # a prefix of no bound key
    assert r.returncode == 1 and "error [device-not-found]" in r.stderr, r.stderr
    r = kith(first, "device", "revoke", other[:12], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["newly_revoked"] == [other]
    listed = json.loads(kith(first, "device", "list", "--json").stdout)["devices"]
    assert sorted((d["key"] == other, d["revoked"]) for d in listed) == [(False, False), (True, True)]
    # every view of this person's devices says it (`device list` did, `person show` and
    # `status` did not: issue 32), from one function (revocation_list.own_devices)
    shown = json.loads(kith(first, "person", "show", "--json").stdout)["devices"]
    status = json.loads(kith(first, "status", "--json").stdout)["identity"]["devices"]
    for rows in (shown, status):
        assert sorted((d["key"] == other, d["revoked"]) for d in rows) == [(False, False), (True, True)], rows
    text = kith(first, "device", "list").stdout
    assert f"{other[:16]}…" in text and text.count("REVOKED") == 1, text
    text = kith(first, "person", "show").stdout
    assert [ln for ln in text.splitlines() if "REVOKED" in ln] == \
        [ln for ln in text.splitlines() if f"{other[:16]}…" in ln], text
    assert "box REVOKED" in kith(first, "status").stdout


def test_a_rotation_leaves_out_a_device_sharing_this_devices_name_by_its_key(tmp_path: Path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert kith(first, "init", "--device-name", "box").returncode == 0
    other = pair_device(first, second, name="box")

    r = kith(first, "person", "rotate", "--yes", "--without", "box")
    assert r.returncode == 1 and "error [person-last-device]" in r.stderr and "by its key" in r.stderr, r.stderr
    r = kith(first, "person", "rotate", "--yes", "--without", other[:10], "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["devices"], got["dropped"]) == (["box"], ["box"])
    listed = json.loads(kith(first, "device", "list", "--json").stdout)["devices"]
    assert [d["key"] == other for d in listed] == [False]
