"""A revocation list revokes only its own person's devices (specs/peers.md §10), over real
iroh on loopback through real `kith` processes.

A hostile peer the host pinned as a person (`kith peers add mallory KEY --devices`) signs a
revocation list with its own person key that names *alice's* device and *bob's* key, and
carries it in its handshake. The host keeps it (it is mallory's, validly signed), but it must
not end alice's live session, nor refuse alice's next handshake or bob's: a list signed by
one person says nothing about another person's devices."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from node.trust.revocation_list import RevocationStore, check_list, make_list

from support.cli import KITH, kith, readline as _readline
from support.devices import result_sources as _sources
from support.homes import FIXTURE
from support.hosts import HostProcess as Host, prepare_host

pytestmark = [pytest.mark.iroh, pytest.mark.slow]

QUERY = "salary bands bonus pool"
SECRET_SOURCE = "/corpus/notes/salary.md"


def _init(home: Path, name: str) -> dict:
    r = kith(home, "init", "--json", "--device-name", name)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_pinned_persons_revocation_list_cannot_revoke_another_persons_device(tmp_path: Path):
    alice, mallory, bob = (_init(tmp_path / n, n) for n in ("alice", "mallory", "bob"))
    home = prepare_host(tmp_path, FIXTURE, ("/corpus/*.md", "public"))
    for args in (("alice", alice["person_key"], "--devices"), ("mallory", mallory["person_key"], "--devices"),
                 ("bob", bob["public_key"])):
        r = kith(home, "peers", "add", *args)
        assert r.returncode == 0, r.stderr
    r = kith(home, "policy", "set", "/corpus/notes/**", "peers", "--peer", "alice", "--peer", "bob")
    assert r.returncode == 0, r.stderr

    # mallory's own list, signed by mallory's person key, naming alice's device and bob's key
    secret = bytes.fromhex((tmp_path / "mallory" / "person.key").read_text().strip())
    doc = make_list(secret, [alice["public_key"], bob["public_key"]], 0, "2026-12-02T04:20:00Z")
    RevocationStore.load(tmp_path / "mallory").offer(check_list(doc), via="own", now=doc["created"])

    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    proc = None
    try:
        proc = subprocess.Popen([*KITH, "--home", str(tmp_path / "alice"), "join", str(invite), "--local", "--trust",
                                 "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        proc.stdin.write(QUERY + "\n")
        proc.stdin.flush()
        first = json.loads(_readline(proc, 60))
        assert SECRET_SOURCE in {r["source"] for r in first["envelope"]["results"]}

        r = kith(tmp_path / "mallory", "join", str(invite), "--local", "--trust", "--json", "--query", QUERY)
        assert r.returncode == 0, r.stderr  # mallory carried the list
        assert SECRET_SOURCE not in _sources(r.stdout)

        # alice's live session still answers, with alice's tier
        proc.stdin.write(QUERY + "\n")
        proc.stdin.flush()
        second = json.loads(_readline(proc, 30))
        assert second.get("action") == "results", second
        assert SECRET_SOURCE in {r["source"] for r in second["envelope"]["results"]}

        for who in ("alice", "bob"):
            r = kith(tmp_path / who, "join", str(invite), "--local", "--trust", "--json", "--query", QUERY)
            assert r.returncode == 0, f"{who}: {r.stdout} {r.stderr}"
            assert SECRET_SOURCE in _sources(r.stdout), who
    finally:
        if proc is not None and proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _rc, host_out, _err = host.stop()
    events = [json.loads(line) for line in host_out.splitlines() if line.strip()]
    assert not [e for e in events if e["event"] == "device-revoked" and e["sessions_ended"]]
    refused = [e for e in events if e["event"] == "session-refused"]
    assert not refused, refused
