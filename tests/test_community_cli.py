"""``kith community serve`` as a user runs it: a real process, a real port, a real signal."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import pytest


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_prints_its_url_serves_and_stops_cleanly(tmp_path: Path, sig: int) -> None:
    proc = subprocess.Popen(kith(tmp_path, "community", "serve", "--port", "0", "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = readline(proc, 60)
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


@pytest.mark.parametrize("bound", ["--mailbox-per-sender", "--mailbox-per-recipient", "--mailbox-max-records",
                                   "--mailbox-max-mb"])
def test_serve_refuses_a_mailbox_bound_without_the_mailbox(tmp_path: Path, bound: str) -> None:
    """A mailbox bound without `--mailbox` would be a server with no mailbox that looks set
    up for one (the bound silently unused): refused `usage` before anything is created, as
    `kith host --mailbox` without `--server` is."""
    result = subprocess.run(kith(tmp_path, "community", "serve", "--port", "0", bound, "5"),
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    assert "error [usage]" in result.stderr and bound in result.stderr and "--mailbox" in result.stderr
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


# =============================================================================================
# Client commands (in process), --database-url, and the host republishing a consumed post
# (real processes over iroh on loopback).
# =============================================================================================
import asyncio  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from typer.testing import CliRunner  # noqa: E402

from node.cli import main as cli_main  # noqa: E402
from node.community.client import CommunityClient  # noqa: E402
from node.community.server import run_server_in_thread  # noqa: E402
from node.trust.identity import load_or_init_identity  # noqa: E402
from node.protocol.spec import load_spec, protocol_id_of  # noqa: E402

from support.cli import kith_argv as kith, readline  # noqa: E402
from support.community import (  # noqa: E402,F401
    NO_LIMITS,
    fresh_pg_database as _fresh_pg_database,
    invitation,
    pg_server,
    session_proof,
)
from support.homes import PROTOCOLS, initialized  # noqa: E402


@pytest.fixture
def server_url(tmp_path: Path):
    with run_server_in_thread(tmp_path / "srv" / "community.sqlite3",
                              rate_limits=NO_LIMITS) as url:
        yield url


@pytest.fixture
def cli():
    cli_main._register()
    runner = CliRunner()

    def run(home: Path, *args: str, env: dict | None = None):
        return runner.invoke(cli_main.app, ["--home", str(home), *args],
                             env={"KITH_SERVER": None, **(env or {})})

    return run


def code_of(result) -> str:
    exc = result.exception
    assert exc is not None and hasattr(exc, "code"), result.output
    return exc.code


def test_client_commands_round_trip(cli, tmp_path: Path, server_url: str) -> None:
    host_home, guest_home, stranger_home = tmp_path / "h", tmp_path / "g", initialized(tmp_path / "s")
    host_id = load_or_init_identity(host_home)
    guest_id = load_or_init_identity(guest_home)
    s = ("--server", server_url)

    r = cli(host_home, "community", "register", "--name", "Host H", "--about", "docs", *s, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["display_name"] == "Host H"
    r = cli(guest_home, "community", "identity", host_id.public_key, *s, "--json")
    assert json.loads(r.stdout)["public_key"] == host_id.public_key
    # protocols by content
    echo = load_spec(PROTOCOLS / "echo")
    r = cli(host_home, "community", "publish-protocol", str(PROTOCOLS / "echo"), *s, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["protocol_id"] == echo.protocol_id
    out = tmp_path / "fetched"
    r = cli(guest_home, "community", "fetch-protocol", echo.protocol_id, "--out", str(out), *s)
    assert r.exit_code == 0, r.output
    assert protocol_id_of(json.loads((out / "spec.json").read_text())) == echo.protocol_id
    r = cli(guest_home, "community", "fetch-protocol", echo.protocol_id, "--out", str(out), *s)
    assert code_of(r) == "usage"  # never overwrites
    # a post: browse, status, renew, withdraw
    tag = "cli" + os.urandom(3).hex()

    async def publish() -> str:
        async with CommunityClient(server_url, host_id) as client:
            return (await client.publish_invitation(invitation(host_id, tags=[tag]))).post_id

    post_id = asyncio.run(publish())
    r = cli(guest_home, "browse", "--tag", tag, *s, "--json")
    assert [p["post_id"] for p in json.loads(r.stdout)["invitations"]] == [post_id]
    r = cli(guest_home, "browse", "--tag", tag, "--protocol", "knowledge-query", *s)
    assert post_id in r.stdout and "Host H" in r.stdout
    r = cli(host_home, "community", "renew", post_id, "--ttl", "7200", *s, "--json")
    assert r.exit_code == 0, r.output
    renewed_expiry = json.loads(r.stdout)["expires_at"]
    r = cli(guest_home, "community", "status", post_id, *s, "--json")
    assert json.loads(r.stdout)["expires_at"] == renewed_expiry
    r = cli(guest_home, "community", "renew", post_id, *s)
    assert code_of(r) == "forbidden"
    # a session: status, close, feedback
    proof = session_proof(host_id, guest_id, post_id)

    async def submit() -> None:
        async with CommunityClient(server_url, guest_id) as client:
            await client.submit_session(proof)

    asyncio.run(submit())
    sid = proof["session_id"]
    r = cli(stranger_home, "community", "session", sid, *s, "--json")
    assert json.loads(r.stdout)["state"] == "open"
    r = cli(guest_home, "community", "close", sid, "--reason", "completed", *s, "--json")
    assert json.loads(r.stdout)["state"] == "closed"
    r = cli(guest_home, "feedback", sid, "--rating", "5", "--comment", "spot on", *s, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["feedback"][0]["rating"] == 5
    assert code_of(cli(guest_home, "feedback", sid, "--rating", "4", *s)) == "feedback-duplicate"
    assert code_of(cli(stranger_home, "feedback", sid, "--rating", "1", *s)) == "forbidden"
    assert cli(host_home, "feedback", sid, "--rating", "6", *s).exit_code == 2
    assert code_of(cli(host_home, "feedback", "0" * 64, "--rating", "3", *s)) == \
        "session-not-found"
    r = cli(host_home, "community", "withdraw", post_id, *s, "--json")
    assert json.loads(r.stdout)["state"] == "withdrawn"
    r = cli(guest_home, "browse", "--tag", tag, *s, "--json")
    assert json.loads(r.stdout)["invitations"] == []


def test_client_commands_need_a_server(cli, tmp_path: Path, server_url: str) -> None:
    assert code_of(cli(tmp_path, "browse")) == "no-server"
    assert code_of(cli(tmp_path, "feedback", "0" * 64, "--rating", "3")) == "no-server"
    r = cli(tmp_path, "browse", "--json", env={"KITH_SERVER": server_url})
    assert r.exit_code == 0 and json.loads(r.stdout)["next_cursor"] is None


def test_serve_refuses_a_bad_database_url(tmp_path: Path) -> None:
    result = subprocess.run(kith(tmp_path, "community", "serve", "--port", "0", "--json",
                                 "--database-url", "mysql://u@h/db"),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["code"] == "database-url-invalid"


def test_serve_on_postgresql(tmp_path: Path, pg_server: str) -> None:
    url = _fresh_pg_database(pg_server)
    proc = subprocess.Popen(kith(tmp_path, "community", "serve", "--port", "0", "--json",
                                 "--database-url", url),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(readline(proc, 60))
        assert first["database"] == "postgresql"
        assert httpx.get(f"{first['url']}/api/v1/health", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "PostgreSQL postgresql:///" in err
    assert not (tmp_path / "community").exists()  # nothing went to SQLite


# --- kith host republishes a consumed single-use post --------------------------------------------
class _Host:
    """A `kith host --json` process; a thread reads its stdout lines into a queue."""

    def __init__(self, home: Path, *args: str) -> None:
        import queue
        import threading

        self.proc = subprocess.Popen(kith(home, "host", "--local", "--json", *args),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []

        def pump() -> None:
            for line in self.proc.stdout:
                self.lines.put(line)

        threading.Thread(target=pump, daemon=True).start()

    def next_json(self, timeout: float) -> dict:
        import queue

        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"host printed nothing in time; before: {self.seen}") from None
        self.seen.append(line)
        return json.loads(line)

    def until(self, event: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next_json(max(0.1, deadline - time.monotonic()))
            if ev.get("event") == event:
                return ev

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("host did not stop within 20 s of SIGINT")
        return self.proc.returncode, self.proc.stderr.read()


@pytest.mark.iroh
def test_host_republishes_a_consumed_single_use_post(tmp_path: Path, server_url: str) -> None:
    host_home, guest_home = initialized(tmp_path / "host"), initialized(tmp_path / "guest")
    host = _Host(host_home, "--server", server_url, "--max-sessions", "1", "--tag", "single")
    try:
        first = host.next_json(60)
        assert first["max_sessions"] == 1
        def join(post_id: str) -> list[str]:
            return [*kith(guest_home, "join", post_id), "--server", server_url, "--local",
                    "--trust", "--query", "anything", "--json"]

        r = subprocess.run(join(first["post_id"]), capture_output=True, text=True,
                           timeout=90)
        # a host with no corpus answers index-unavailable: the session counts, the question
        # was not answered (exit 1, specs/exit-codes.md)
        assert r.returncode == 1 and "q1 index-unavailable" in r.stderr, r.stderr
        assert json.loads(r.stdout)["status"] == "index-unavailable"
        sid = next(line.split()[1] for line in r.stderr.splitlines()
                   if line.startswith("session "))
        ev = host.until("republished")
        assert ev["previous_post_id"] == first["post_id"] and ev["reason"] == "consumed"
        new_post = ev["post_id"]
        assert new_post != first["post_id"]
        # the consumed post can't be joined again...
        r = subprocess.run(join(first["post_id"]), capture_output=True, text=True,
                           timeout=90)
        assert r.returncode == 1
        assert json.loads(r.stdout.splitlines()[-1])["error"]["code"] == "invitation-consumed"
        # ...the new one can, and browse shows only it
        listed = httpx.get(f"{server_url}/api/v1/invitations", params={"tag": "single"}).json()
        assert [p["post_id"] for p in listed["invitations"]] == [new_post]
        r = subprocess.run(join(new_post), capture_output=True, text=True, timeout=90)
        assert r.returncode == 1 and "q1 index-unavailable" in r.stderr, r.stderr  # joined; no corpus
        # the first session is closed on the server and still takes feedback
        session = httpx.get(f"{server_url}/api/v1/sessions/{sid}").json()
        assert session["state"] == "closed" and session["close_reason"] == "completed"
        r = subprocess.run(kith(guest_home, "feedback", sid, "--rating", "4", "--server",
                                server_url, "--json"), capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
    finally:
        code, err = host.stop()
    assert code == 0, err
