"""Ending a copy between real processes over iroh on loopback (issue 33 item 4;
specs/copies.md §5): the host's owner ends the grant and bea's next *ordinary* `kith ask
--peer alice` (no sync) deletes the copy, saying so on stderr — the handshake told it;
`kith peers remove alice` deletes the copy; a grant whose `--until` passed is deleted by
bea's own node without reaching the host (`copy-expired`)."""

from __future__ import annotations

import json
import time

import pytest

from node.common.grants import until_time
from node.guest.copies.store import CopyStore

from support.cli import kith
from support.copies import kb_host_and_bea
from support.homes import pin_host
from support.hosts import HostProcess

pytestmark = pytest.mark.iroh


def _listed(bea) -> list:
    return json.loads(kith(bea, "copies", "list", "--json").stdout)["copies"]


def test_an_ordinary_ask_deletes_a_copy_whose_grant_ended_and_peers_remove_deletes_one(tmp_path):
    host, bea = kb_host_and_bea(tmp_path, grant=None)
    assert kith(host, "policy", "copy", "/kb/**", "--for", "bea").returncode == 0
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        assert kith(bea, "copies", "sync", "alice", timeout=180).returncode == 0
        assert [c["documents"] for c in _listed(bea)] == [3]
        off = kith(host, "policy", "copy", "/kb/**", "--for", "bea", "--off")
        assert off.returncode == 0
        assert "next sync or handshake" in off.stderr and "keeps what it copied" in off.stderr
        # no sync: an ordinary question to the live host; its handshake says the grant ended
        r = kith(bea, "ask", "journal mode WAL", "--peer", "alice", "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["peers"][0].get("fromCopy") is None  # the live host answered
        assert "alice's copy was deleted (3 document(s)): its host no longer grants it" in r.stderr
        assert _listed(bea) == [] and not CopyStore(bea, "alice").dir.exists()

        assert kith(host, "policy", "copy", "/kb/**", "--for", "bea").returncode == 0
        assert kith(bea, "copies", "sync", "alice", timeout=180).returncode == 0
        assert [c["documents"] for c in _listed(bea)] == [3]
    finally:
        h.stop()
    removed = kith(bea, "peers", "remove", "alice")
    assert removed.returncode == 0, removed.stderr
    assert "alice's copy was deleted (3 document(s)): its host was removed from the peer registry" in removed.stderr
    assert _listed(bea) == []


def test_a_copy_past_its_until_is_deleted_without_the_host(tmp_path):
    host, bea = kb_host_and_bea(tmp_path, grant=None)
    granted = kith(host, "policy", "copy", "/kb/**", "--for", "bea", "--until", "45s")
    assert granted.returncode == 0 and "even if it never reaches this host again" in granted.stderr
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        assert kith(bea, "copies", "sync", "alice", timeout=180).returncode == 0
    finally:
        h.stop()  # the host is never reached again
    (row,) = _listed(bea)
    assert row["documents"] == 3 and row["until"]
    wait = until_time(row["until"]) - time.time() + 1
    assert 0 < wait < 60
    # kept: until the copy's `until` (the grant's 45 s) has passed on
    # the wall clock the next `kith` process reads; no clock of this test reaches it
    time.sleep(wait)
    r = kith(bea, "ask", "journal mode WAL", "--peer", "alice", "--copy", "--json", timeout=120)
    assert r.returncode == 1
    assert json.loads(r.stdout)["peers"][0]["code"] == "copy-expired"
    assert "alice's copy was deleted (3 document(s)): its grant's end has passed" in r.stderr
    assert _listed(bea) == [] and not CopyStore(bea, "alice").dir.exists()
