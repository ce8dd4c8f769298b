"""An interactive `kith join` whose idle anonymous session the host evicts for a newcomer
says `session-evicted` with its way out (join again; a pinned peer is never evicted), and
exits 1 at once — never a bare `peer-disconnected` (issue 42)."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

import pytest

from support.cli import kith, kith_init, lines_until
from support.hosts import HostProcess
from support.terminal import drain, end_pty_join, join_on_pty, read_until

pytestmark = pytest.mark.iroh

ENV = {**os.environ, "KITH_OFFLINE": "1"}


def test_an_evicted_interactive_join_says_session_evicted(tmp_path: Path) -> None:
    host_home, alice, bob = tmp_path / "host", tmp_path / "alice", tmp_path / "bob"
    for home in (host_home, alice, bob):
        kith_init(home)
    invite = tmp_path / "invite.json"
    host = HostProcess(host_home, "--invite-file", str(invite), "--anonymous-slots", "1")
    pid, master, err_r = join_on_pty(alice, invite, "--offline", env=ENV)  # alice's join: the ask> prompt
    buf = bytearray()
    code = None
    try:
        read_until(err_r, b"\nask> ", 60, buf)
        seen = lines_until(host.proc, host.proc.stdout, lambda line: '"session-started"' in line, 30)
        assert seen and '"session-started"' in seen[-1], seen
        # bob holds no session: once alice's has been quiet for 2 s it is evicted for him;
        # until then he is refused handshake-host-busy and tries again (bounded)
        deadline = time.monotonic() + 60
        while True:
            r = kith(bob, "join", str(invite), "--offline", "--trust", "--query", "hello", timeout=60, env=ENV)
            if "handshake-host-busy" not in r.stderr:
                break
            assert time.monotonic() < deadline, r.stderr
        deadline = time.monotonic() + 10
        while code is None and time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
            elif select.select([err_r], [], [], 0.1)[0]:
                chunk = os.read(err_r, 65536)
                buf += chunk
        drain(err_r, buf)
    finally:
        end_pty_join(pid, code, master, err_r)
        host.stop()
    text = bytes(buf).decode("utf-8", "replace")
    assert code == 1, (code, text)
    assert "error [session-evicted]" in text and "join again" in text, text
    assert "peer-disconnected" not in text, text
