"""A copy of a person pinned with --devices (specs/copies.md §4.1), over real iroh on
loopback (relays off) through real `kith` processes: a person with two hosting devices,
each granting the guest a copy; the guest syncs `bea` while one device sleeps and gets the
awake device's copy, signed by that device's key (a device of the person), which
`kith ask --copy` answers from and `kith verify` accepts as the person's; a live answer of
that device, signed, verifies the same way (the signer is the device the answer names)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from node.guest.copies.store import CopyStore
from node.trust.identity import load_identity
from support.cli import KITH, kith
from support.devices import pair_device
from support.homes import FIXTURE
from support.hosts import HostProcess as Host, prepare_host

pytestmark = pytest.mark.iroh


def _hosting_device(home: Path, guest_key: str, *, index: bool = True) -> None:
    steps = [("index", "add", str(FIXTURE)), ("index", "sync")] if index else []
    for args in (*steps, ("policy", "set", f"/{FIXTURE.name}/**", "public"),
                 ("peers", "add", "gus", guest_key), ("policy", "copy", f"/{FIXTURE.name}/**", "--for", "gus")):
        r = kith(home, *args, timeout=600)
        assert r.returncode == 0, r.stderr


def _sync(guest: Path) -> tuple[int, dict]:
    r = subprocess.run([*KITH, "--home", str(guest), "copies", "sync", "bea", "--offline", "--json"],
                       capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    return r.returncode, json.loads(r.stdout)["copies"][0]


def test_a_copy_of_a_person_comes_from_an_awake_device_and_verifies_as_that_device(tmp_path: Path):
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    guest_key = load_identity(guest).public_key
    desk = prepare_host(tmp_path, FIXTURE)  # the person key lives here
    _hosting_device(desk, guest_key, index=False)
    laptop = tmp_path / "laptop"
    pair_device(desk, laptop, name="laptop")
    _hosting_device(laptop, guest_key)
    person = json.loads(kith(desk, "device", "list", "--json").stdout)
    desk_key = next(d["key"] for d in person["devices"] if d["this"])
    assert kith(guest, "peers", "add", "bea", person["person_key"], "--devices").returncode == 0

    desk_host = Host(desk, "--invite-file", str(tmp_path / "desk.json"), "--sign-citations")
    laptop_host = Host(laptop, "--invite-file", str(tmp_path / "laptop.json"))
    try:
        for invite in ("desk.json", "laptop.json"):  # each device hands over its card in the handshake
            r = kith(guest, "join", str(tmp_path / invite), "--local", "--trust", "--query", "installing")
            assert r.returncode in (0, 3), r.stderr
        laptop_host.stop()  # the laptop sleeps: the desk answers
        rc, report = _sync(guest)
        assert (rc, report["status"]) == (0, "ok"), report
        assert report["documents"] > 0 and report["fetched"] == report["documents"]
        state = CopyStore(guest, "bea").load()
        assert state["hostKey"] == desk_key  # the device that signed every document
        assert {d["citation"]["hostKey"] for d in state["documents"].values()} == {desk_key}
        rc, again = _sync(guest)
        assert (rc, again["fetched"], again["unchanged"]) == (0, 0, report["documents"])
        live = _ask(guest, tmp_path / "live.json", "--citations")
        assert live["peers"][0]["device"]["key"] == desk_key and not live["peers"][0].get("fromCopy")
        _verified_as_bea(guest, tmp_path / "live.json", person["person_key"])
    finally:
        desk_host.stop()
        if laptop_host.proc.poll() is None:
            laptop_host.stop()
    # the person is asleep: the copy answers, naming the desk; each result verifies as bea's
    env = _ask(guest, tmp_path / "copy.json", "--copy")
    assert env["peers"][0]["fromCopy"] is True and env["peers"][0]["device"]["key"] == desk_key
    _verified_as_bea(guest, tmp_path / "copy.json", person["person_key"])


def _ask(guest: Path, saved: Path, *args: str) -> dict:
    r = subprocess.run([*KITH, "--home", str(guest), "ask", "sqlite write-ahead log", "--peer", "bea", "--offline",
                        "--json", *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    saved.write_text(r.stdout)
    env = json.loads(r.stdout)
    assert env["results"], env
    return env


def _verified_as_bea(guest: Path, saved: Path, person_key: str) -> None:
    v = kith(guest, "verify", str(saved), "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    rows = json.loads(v.stdout)["rows"]
    assert rows and all(r["result"] == "genuine" and r["peer"] == "bea" and r["person"] == person_key for r in rows)
