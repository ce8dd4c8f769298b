"""An interactive `kith join` whose idle anonymous session the host evicts for a newcomer
says `session-evicted` with its way out (join again; a pinned peer is never evicted), and
exits 1 at once — never a bare `peer-disconnected` (issue 42)."""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from support.cli import KITH, kith, kith_init, lines_until
from support.hosts import HostProcess

pytestmark = pytest.mark.iroh

ENV = {**os.environ, "KITH_OFFLINE": "1"}


def _read_until(fd: int, needle: bytes, timeout: float, buf: bytearray) -> None:
    """Read the raw pipe ``fd`` (unbuffered: select on it is sound) until ``needle``."""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} not seen; got {bytes(buf)!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"EOF before {needle!r}; got {bytes(buf)!r}"
            buf += chunk


def test_an_evicted_interactive_join_says_session_evicted(tmp_path: Path) -> None:
    host_home, alice, bob = tmp_path / "host", tmp_path / "alice", tmp_path / "bob"
    for home in (host_home, alice, bob):
        kith_init(home)
    invite = tmp_path / "invite.json"
    host = HostProcess(host_home, "--invite-file", str(invite), "--anonymous-slots", "1")
    err_r, err_w = os.pipe()
    pid, master = pty.fork()  # alice's join on a terminal: the ask> prompt
    if pid == 0:
        os.dup2(err_w, 2)
        os.execvpe(sys.executable, [*KITH, "--home", str(alice), "join", str(invite), "--offline", "--trust"], ENV)
    os.close(err_w)
    buf = bytearray()
    code = None
    try:
        _read_until(err_r, b"\nask> ", 60, buf)
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
        while select.select([err_r], [], [], 0.2)[0]:
            chunk = os.read(err_r, 65536)
            if not chunk:
                break
            buf += chunk
    finally:
        if code is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(master)
        os.close(err_r)
        host.stop()
    text = bytes(buf).decode("utf-8", "replace")
    assert code == 1, (code, text)
    assert "error [session-evicted]" in text and "join again" in text, text
    assert "peer-disconnected" not in text, text
