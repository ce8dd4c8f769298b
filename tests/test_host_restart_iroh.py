"""A host comes back where it was (issue 30 item 1), over real ``kith host`` processes on
loopback (iroh, relays off): a restarted or killed-and-restarted host of the same home
binds the port it had (``<home>/endpoint.json``) and honours its live invitation
(``<home>/posts.json``) until its own expiry or use count, writing the same signed document
again, so a pinned guest's saved invitation keeps working (``kith ask --peer``, ``kith
join --peer``); a taken port is tried again, then said at start and used for that run only
(the kept one stays); ``--new-invitation`` withdraws the old ones
and their guests get ``invitation-gone`` with what to do; re-joining with the new one
refreshes the pin and says so."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from node.trust.peers import PeerRegistry

from support.cli import kith
from support.hosts import HostProcess as Host, notes_host as _host_home

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def _events(host: Host) -> list[dict]:
    """Stop ``host`` (SIGINT) and return the JSON event lines it printed after the invitation
    (what :meth:`HostProcess.stop` returns after the lines already read)."""
    _code, out, _err = host.stop()
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _kill(host: Host) -> None:
    host.proc.send_signal(signal.SIGKILL)
    host.proc.communicate(timeout=30)


def _port(inv: dict) -> int:
    from node.transport.hygiene import ticket_addresses

    _relay, direct = ticket_addresses(inv["transport_info"]["ticket"])
    return int(direct[0].rsplit(":", 1)[1])


def test_a_restarted_host_keeps_its_port_and_its_invitation(tmp_path: Path) -> None:
    home = _host_home(tmp_path)
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    invite = tmp_path / "invite.json"
    first = Host(home, "--invite-file", str(invite), "--max-sessions", "20")
    try:
        r = kith(guest, "join", str(invite), "--offline", "--trust", "--pin", "h", "--query", "staging")
        assert r.returncode == 0, r.stderr
    finally:
        _events(first)
    saved = PeerRegistry.load(guest).by_name("h").invitation
    assert saved["post_id"] == first.invitation["post_id"]

    # a clean restart: the same port, the same signed invitation written again
    second = Host(home, "--invite-file", str(invite), "--max-sessions", "20")
    try:
        assert second.invitation == first.invitation
        assert json.loads(invite.read_text()) == first.invitation
        ask = kith(guest, "ask", "staging", "--peer", "h", "--offline", "--json", timeout=90)
        assert ask.returncode == 0, ask.stderr
        assert json.loads(ask.stdout)["peers"][0]["status"] == "ok"
        joined = kith(guest, "join", "--peer", "h", "--offline", "--query", "staging", timeout=90)
        assert joined.returncode == 0, joined.stderr
        assert "saved this invitation" not in joined.stderr  # nothing changed: nothing to say
    finally:
        events = _events(second)
    restored = [e for e in events if e["event"] == "post-restored"]
    assert restored and restored[0]["post_id"] == first.invitation["post_id"] and restored[0]["current"] is True
    assert restored[0]["uses"] == 1 and restored[0]["max_sessions"] == 20  # the use of the first run

    # killed (kill -9), then started again: still the same post, its uses counted on
    third = Host(home, "--invite-file", str(invite), "--max-sessions", "20")
    _kill(third)
    fourth = Host(home, "--invite-file", str(invite), "--max-sessions", "20")
    try:
        assert fourth.invitation == first.invitation
        assert kith(guest, "ask", "staging", "--peer", "h", "--offline", timeout=90).returncode == 0
    finally:
        _events(fourth)
    kept = json.loads((home / "posts.json").read_text())
    assert [p["uses"] for p in kept["posts"]] == [4]  # join --pin, ask, join --peer, ask

    # the kept port is taken by someone else for the whole start: another port for this run
    # only, said at start (and nothing says the old invitations keep working); a new invitation
    port = _port(first.invitation)
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    squatter.bind(("127.0.0.1", port))
    try:
        fifth = Host(home, "--invite-file", str(invite), "--max-sessions", "20")
        _code, out, err = fifth.stop()
    finally:
        squatter.close()
    assert f"UDP port {port}, where this home's host was before, is taken" in err
    assert f"this run is on port {_port(fifth.invitation)} only, and {port} stays kept for the next start" in err
    assert _port(fifth.invitation) != port and fifth.invitation["post_id"] != first.invitation["post_id"]
    assert "post-restored" not in out  # its guests cannot reach this run: not said to keep working
    assert json.loads((home / "endpoint.json").read_text())["port"] == port  # not replaced

    # the clash is over: the next start is back on the kept port, and the pinned guest's
    # saved invitation works again (the clash never stranded it)
    sixth = Host(home, "--invite-file", str(invite), "--max-sessions", "20")
    try:
        assert _port(sixth.invitation) == port and sixth.invitation == first.invitation
        ask = kith(guest, "ask", "staging", "--peer", "h", "--offline", "--json", timeout=90)
    finally:
        _events(sixth)
    assert ask.returncode == 0, ask.stderr
    assert json.loads(ask.stdout)["peers"][0]["status"] == "ok"


def test_new_invitation_withdraws_the_old_one_and_its_guest_is_told_what_to_do(tmp_path: Path) -> None:
    home = _host_home(tmp_path)
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    invite = tmp_path / "invite.json"
    first = Host(home, "--invite-file", str(invite))
    try:
        assert kith(guest, "join", str(invite), "--offline", "--trust", "--pin", "h", "--query", "x").returncode == 0
    finally:
        _events(first)
    fresh = tmp_path / "fresh.json"
    second = Host(home, "--invite-file", str(fresh), "--new-invitation")
    try:
        assert second.invitation["post_id"] != first.invitation["post_id"]
        old = kith(guest, "join", "--peer", "h", "--offline", "--query", "staging", "--json", timeout=90)
        ask = kith(guest, "ask", "staging", "--peer", "h", "--offline", "--json", timeout=90)
        rejoin = kith(guest, "join", str(fresh), "--offline", "--query", "staging", timeout=90)
        after = kith(guest, "ask", "staging", "--peer", "h", "--offline", "--json", timeout=90)
    finally:
        _code, _out, host_err = second.stop()
    assert "--new-invitation: 1 invitation(s) of earlier runs are no longer honoured" in host_err
    assert old.returncode == 1
    err = json.loads(old.stdout.splitlines()[-1])["error"]
    assert err["code"] == "invitation-gone" and first.invitation["post_id"] in err["message"]
    assert "ask h's owner for a new invitation and join it once" in err["hint"]
    row = json.loads(ask.stdout)["peers"][0]
    assert (row["status"], row["code"]) == ("refused", "invitation-gone")
    assert rejoin.returncode == 0, rejoin.stderr
    assert f"saved this invitation (post {second.invitation['post_id']}" in rejoin.stderr
    assert f"it replaces post {first.invitation['post_id']}" in rejoin.stderr
    assert json.loads(after.stdout)["peers"][0]["status"] == "ok"


def _back_on_its_port(home: Path, port: int, *args: str, tries: int = 3) -> Host:
    """Start the host of ``home`` again, on its kept ``port``: a start that found the port
    taken past its retries (another process's socket; it is not this test's to hold) says so
    and keeps the port for the next start — which this tries, up to ``tries`` starts."""
    for _ in range(tries):
        host = Host(home, *args)
        if _port(host.invitation) == port:
            return host
        _code, _out, err = host.stop()
        assert f"{port} stays kept for the next start" in err, err
        assert json.loads((home / "endpoint.json").read_text())["port"] == port
    raise AssertionError(f"port {port} stayed taken for {tries} starts")


def test_join_peer_follows_a_server_hosts_new_post_after_a_restart(tmp_path: Path) -> None:
    """A community-server post is withdrawn at every clean exit; a pin made from it keeps
    working: the restarted host (same port) refuses the old post, and ``kith join --peer``
    joins the newest post of its key on the pin's server instead, and says so."""
    from node.community.server import run_server_in_thread

    home = _host_home(tmp_path)
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    with run_server_in_thread(tmp_path / "srv" / "community.sqlite3") as url:
        first = Host(home, "--server", url)
        try:
            r = kith(guest, "join", first.invitation["post_id"], "--server", url, "--offline", "--trust",
                     "--pin", "h", "--query", "staging")
            assert r.returncode == 0, r.stderr
        finally:
            _events(first)
        second = _back_on_its_port(home, _port(first.invitation), "--server", url)
        try:
            assert second.invitation["post_id"] != first.invitation["post_id"]
            joined = kith(guest, "join", "--peer", "h", "--offline", "--query", "staging", timeout=90)
        finally:
            _events(second)
    assert joined.returncode == 0, joined.stderr
    assert "the host no longer honours 'h''s saved invitation (handshake-unknown-post)" in joined.stderr
    assert f"joining its newest post on {url}, {second.invitation['post_id']}" in joined.stderr
    assert PeerRegistry.load(guest).by_name("h").invitation["post_id"] == second.invitation["post_id"]
