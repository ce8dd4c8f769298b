"""Issue 20 item 9, the owner's side: every line the CLI prints is true and reads like a
sentence, through real `kith` processes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import initialized
from node.community.server import run_server_in_thread
from test_main_job import Host


def test_the_host_log_names_its_server_and_post_not_placeholders(tmp_path: Path) -> None:
    """`could not refresh post <hex> on the server: ... at http://<host>` was a template,
    not a log line: the URL the owner gave is shown as typed, a post id by its prefix."""
    home = initialized(tmp_path / "host")
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3", lease_ttl_s=3.0) as url:
        host = Host(home, "--server", url)
        post_id = host.invitation["post_id"]
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:  # the server is gone: the next refresh fails
            line = host.proc.stderr.readline()
            if "could not refresh" in line:
                break
        else:
            raise AssertionError("no refresh failure logged in 30 s")
    finally:
        host.proc.kill()
        host.proc.wait(10)
    assert "<host>" not in line and "<hex>" not in line, line
    assert f"at {url}" in line and f"post {post_id[:8]}…" in line and post_id not in line, line
