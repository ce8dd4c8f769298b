"""``kith community serve`` as a user runs it: a real process, a real port, a real signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest


def kith(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "node.cli.main", "--home", str(home), *args]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_prints_its_url_serves_and_stops_cleanly(tmp_path: Path, sig: int) -> None:
    proc = subprocess.Popen(kith(tmp_path, "community", "serve", "--port", "0", "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = json.loads(line)["url"]
        assert url.startswith("http://127.0.0.1:")
        response = httpx.get(f"{url}/api/v1/health", timeout=10)
        assert response.status_code == 200 and response.json()["service"] == "kith-community"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out == ""  # stdout carried only the one JSON line
    assert "listening on" in err and "stopped" in err
    assert (tmp_path / "community" / "community.sqlite3").is_file()


def test_serve_refuses_a_public_address_without_public(tmp_path: Path) -> None:
    result = subprocess.run(kith(tmp_path, "community", "serve", "--host", "0.0.0.0", "--json"),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["code"] == "server-not-public"
    assert "--public" in result.stderr
    assert not (tmp_path / "community").exists()


def test_serve_reports_a_busy_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = subprocess.run(
            kith(tmp_path, "community", "serve", "--port", str(port), "--json"),
            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["code"] == "server-start-failed"
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
