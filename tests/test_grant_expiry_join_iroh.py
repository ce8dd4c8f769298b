"""A grant that ends under a live `kith join` (issue 22 item 5; specs/error-codes.md):
the guest exits 1 with the host's own code, `error [session-grant-expired]` (and that code in
its `--json` error line), like `session-revoked` and `session-device-revoked` — not a generic
`remote-error`. Real `kith` processes, real iroh on loopback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.cli import KITH, kith, readline as _readline
from support.homes import FIXTURE
from support.hosts import HostProcess as Host, prepare_host

pytestmark = [pytest.mark.iroh, pytest.mark.slow]

#: Only a deadline (s) for the session to end once the pin's `until` passed.
DEADLINE_S = 30.0


def test_a_pin_ending_under_a_live_join_exits_with_session_grant_expired(tmp_path: Path):
    guest = tmp_path / "carol"
    r = kith(guest, "init", "--json")
    assert r.returncode == 0, r.stderr
    key = json.loads(r.stdout)["public_key"]
    home = prepare_host(tmp_path, FIXTURE, ("/corpus/*.md", "public"))
    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    proc = None
    try:
        assert kith(home, "peers", "add", "carol", key).returncode == 0
        proc = subprocess.Popen([*KITH, "--home", str(guest), "join", str(invite), "--local", "--trust", "--json"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdin.write("alpha\n")
        proc.stdin.flush()
        assert json.loads(_readline(proc, 60)).get("action") == "results"
        r = kith(home, "peers", "until", "carol", "2s")
        assert r.returncode == 0, r.stderr
        proc.wait(timeout=DEADLINE_S)  # stdin stays open: only the host can end the session
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        host.stop()
    assert proc.returncode == 1, err
    assert "error [session-grant-expired]" in err, err
    errors = [json.loads(line)["error"] for line in out.splitlines() if line.startswith('{"error"')]
    assert [e["code"] for e in errors] == ["session-grant-expired"], out
