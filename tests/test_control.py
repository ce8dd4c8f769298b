"""Issue 12 items 1-2: the owner's control channel (<home>/run/control.sock), `kith status`
and `kith sessions [end]`, over real iroh on loopback (relay disabled) with a real
`kith join` process. Changes are awaited with bounded deadlines, never timed."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import httpx
import pytest

from support.cli import KITH, kith, kith_init, readline as _readline, wait_exit
from support.homes import FIXTURE
from support.hosts import InProcessHost, prepare_host

from node.common.errors import KithError
from node.host.control import ControlClient, control_socket_path, resolve_id, short_ids

#: Only a deadline (s) for a change to show; never asserted as a speed.
DEADLINE_S = 20.0
REPO = Path(__file__).resolve().parent.parent


_init = kith_init  # the product's heartbeat throughout: no heartbeat test here (ENV's 1 s can end a healthy join under load)


@pytest.fixture
def homes(tmp_path):
    """A host sharing the fixture corpus publicly, and an anonymous guest's home."""
    host, guest = prepare_host(tmp_path, FIXTURE, name="host"), tmp_path / "guest"
    key = _init(guest)
    person = json.loads(kith(guest, "init", "--json").stdout)["person_key"]
    return {"tmp": tmp_path, "host": host, "guest": guest, "key": key, "person": person}


async def _poll_state(home: Path, pred, timeout: float = DEADLINE_S) -> dict:
    """The first state document (read through ControlClient) for which ``pred`` holds."""
    with anyio.fail_after(timeout):
        while True:
            state = await anyio.to_thread.run_sync(ControlClient(home).state)
            if pred(state):
                return state
            await anyio.sleep(0.05)


# ------------------------------------------------------------------------ no host
def test_status_without_a_host_says_not_running_and_sessions_refuses(tmp_path):
    home = tmp_path / "h"
    _init(home)
    r = kith(home, "status")
    assert r.returncode == 0, r.stderr
    assert "host: not running" in r.stdout and "identity: SHA256:" in r.stdout
    r = kith(home, "status", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["host"] is None and report["identity"]["fingerprint"].startswith("SHA256:")
    assert report["index"]["roots"] == [] and report["approvals"] == []
    for args in (("sessions",), ("sessions", "end", "abcd1234")):
        r = kith(home, *args)
        assert r.returncode == 1 and "error [host-not-running]" in r.stderr, (args, r.stderr)

    # a stale socket a killed host left: nothing listens on it -> the same code
    run = home / "run"
    run.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(control_socket_path(home)))
    stale.close()
    with pytest.raises(KithError) as err:
        ControlClient(home).state()
    assert err.value.code == "host-not-running"
    assert "host: not running" in kith(home, "status").stdout

    # a new host replaces the stale socket, and removes its own on stop
    async def restart() -> dict:
        host = InProcessHost(home, tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            state = await _poll_state(home, lambda s: True)
            host.stop.set()
        return state

    assert anyio.run(restart, backend="asyncio")["node"]["pid"] == os.getpid()
    assert not control_socket_path(home).exists()


def test_session_ids_resolve_by_unique_prefix():
    a, b, c = "abcd" + "0" * 60, "abcd" + "1" * 60, "ef01" + "2" * 60
    assert resolve_id([a, b, c], a) == a
    assert resolve_id([a, b, c], "ef01") == c
    assert resolve_id([a, b, c], "ABCD1") == b
    for given, code in (("abcd", "live-session-ambiguous"), ("9999", "live-session-not-found"),
                        ("ab", "usage"), ("xyz1", "usage"), ("a" * 65, "usage")):
        with pytest.raises(KithError) as err:
            resolve_id([a, b, c], given)
        assert err.value.code == code, given
    # the client checks before sending: a long argument is a usage error, not the
    # channel's request-too-large (review of #12: `kith sessions end <5000 hex digits>`)
    with pytest.raises(KithError) as err:
        ControlClient(Path("/nonexistent-kith-home")).end_session("a" * 5000)
    assert err.value.code == "usage"
    d, e = "abcdabcd0" + "3" * 55, "abcdabcd1" + "3" * 55
    shown = short_ids([c, d, e])
    assert shown == {c: c[:8], d: d[:9], e: e[:9]}


# ------------------------------------------------------------------------ live host
def test_status_and_sessions_show_a_live_guest_and_sessions_end_tells_the_guest(homes):
    async def scenario():
        host = InProcessHost(homes["host"], homes["tmp"])
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            # the host's state before any guest: its post, its index, no session
            before = await _poll_state(homes["host"], lambda s: s["index"]["ready"])
            proc = subprocess.Popen([*KITH, "--home", str(homes["guest"]), "join", str(host.invite), "--local",
                                     "--trust", "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            try:
                proc.stdin.write("what is in the corpus\n")
                proc.stdin.flush()
                first = json.loads(await anyio.to_thread.run_sync(_readline, proc, 60))
                live = await _poll_state(homes["host"], lambda s: s["sessions"] and s["sessions"][0]["queries"])
                status = await anyio.to_thread.run_sync(lambda: kith(homes["host"], "status", "--json"))
                human = await anyio.to_thread.run_sync(lambda: kith(homes["host"], "status"))
                listed = await anyio.to_thread.run_sync(lambda: kith(homes["host"], "sessions", "--json"))
                lines = await anyio.to_thread.run_sync(lambda: kith(homes["host"], "sessions"))
                sid = live["sessions"][0]["id"]
                bad = await anyio.to_thread.run_sync(lambda: kith(homes["host"], "sessions", "end", "0000000"))
                ended = await anyio.to_thread.run_sync(
                    lambda: kith(homes["host"], "sessions", "end", sid[:8], "--json"))
                after = await _poll_state(homes["host"], lambda s: not s["sessions"])
                rc, _out, err = await wait_exit(proc, DEADLINE_S)
                event = await host.wait_for(lambda e: e["event"] == "session-ended")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            host.stop.set()
        return host, before, first, live, status, human, listed, lines, bad, ended, after, rc, err, event

    (host, before, first, live, status, human, listed, lines, bad, ended, after, rc, err,
     event) = anyio.run(scenario, backend="asyncio")
    post_id = host.invitation["post_id"]
    assert before["sessions"] == [] and before["posts"] == [
        {"postId": post_id, "server": None, "expiresAt": host.invitation["expires_at"]}]
    assert before["node"]["key"] == host.invitation["host_public_key"] and before["node"]["pid"] == os.getpid()
    assert before["index"]["roots"] == ["/corpus/"] and before["index"]["chunks"] > 0
    assert first["action"] == "results"

    (session,) = live["sessions"]
    # the guest's home has a person (`kith init`): its binding chain names the person and device
    person = {"key": homes["person"], "deviceName": session["peer"]["person"]["deviceName"], "earlier": []}
    assert session["peer"] == {"name": None, "key": homes["key"], "person": person, "viaPerson": False}
    assert session["tier"] == "anonymous"
    assert session["queries"] == 1 and session["statuses"] == {first["status"]: 1}
    quota = session["quotaLeft"]
    assert quota["burst"] >= 1 and 0 <= quota["queries"] < quota["burst"]  # the query took a token
    assert len(session["pairingCode"]) > 0 and session["since"].endswith("Z")

    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert [s["id"] for s in report["host"]["sessions"]] == [session["id"]]
    assert report["identity"]["key"] == before["node"]["key"] and report["index"]["roots"] == ["/corpus/"]
    assert human.returncode == 0 and "host: running" in human.stdout and post_id in human.stdout
    assert session["id"][:8] in human.stdout and "sessions: 1" in human.stdout
    assert listed.returncode == 0 and [s["id"] for s in json.loads(listed.stdout)["sessions"]] == [session["id"]]
    assert lines.returncode == 0 and session["id"][:8] in lines.stdout and "anonymous" in lines.stdout
    assert f"person {homes['person'][:16]}" in lines.stdout  # `kith sessions` names the person
    assert report["host"]["sessions"][0]["peer"]["person"]["key"] == homes["person"]

    assert bad.returncode == 1 and "error [live-session-not-found]" in bad.stderr, bad.stderr
    assert ended.returncode == 0, ended.stderr
    assert json.loads(ended.stdout) == {"ended": session["id"], "peer": session["peer"]}
    assert after["sessions"] == []
    assert rc == 1 and "error [session-ended-by-owner]" in err, err
    assert (event["session_id"], event["code"]) == (session["id"], "session-ended-by-owner")
    # the host removed its socket on stop
    assert not control_socket_path(homes["host"]).exists()


# ------------------------------------------------------------------------ refusals
def _raw_request(path: Path, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(path))
    with httpx.Client(transport=transport, base_url="http://localhost", timeout=5) as client:
        return client.get("/v1/state", headers=headers)


def _nobody() -> tuple[int, int]:
    import pwd

    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no `nobody` user on this machine")
    return pw.pw_uid, pw.pw_gid


def _as_nobody(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a Python that starts as root (so it can import the repo and the
    standard library under /root) and then drops to ``nobody`` where the snippet says so
    (``drop()``); what it needs later must be imported before."""
    uid, gid = _nobody()
    prelude = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        def drop():
            os.setgroups([])
            os.setgid({gid})
            os.setuid({uid})
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, cwd="/")


def test_control_channel_refuses_a_foreign_host_header_an_origin_and_another_user(tmp_path):
    home = tmp_path / "h"
    _init(home)
    path = control_socket_path(home)

    async def scenario():
        host = InProcessHost(home, tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            mode_dir = stat.S_IMODE(os.stat(path.parent).st_mode)
            mode_sock = stat.S_IMODE(os.stat(path).st_mode)
            ok = await anyio.to_thread.run_sync(_raw_request, path, {})
            foreign = await anyio.to_thread.run_sync(_raw_request, path, {"Host": "evil.example"})
            rebound = await anyio.to_thread.run_sync(_raw_request, path, {"Host": "127.0.0.1.evil.example:80"})
            origin = await anyio.to_thread.run_sync(_raw_request, path, {"Origin": "http://localhost:8080"})
            others = None
            if os.geteuid() == 0:
                others = await anyio.to_thread.run_sync(_other_user_attempts, home, path)
            host.stop.set()
        return mode_dir, mode_sock, ok, foreign, rebound, origin, others

    mode_dir, mode_sock, ok, foreign, rebound, origin, others = anyio.run(scenario, backend="asyncio")
    assert (mode_dir, mode_sock) == (0o700, 0o600)
    assert ok.status_code == 200 and ok.json()["node"]["pid"] == os.getpid()
    for response in (foreign, rebound, origin):
        assert response.status_code == 403 and response.json()["error"]["code"] == "control-forbidden"
    if others is None:
        pytest.skip("refusing another user needs root here (to run a client as `nobody`)")
    client, peercred = others
    # with the folder as the host made it, `nobody` cannot even reach the socket
    assert client.returncode == 0, client.stderr
    assert client.stdout.strip() == "control-forbidden", client.stdout
    # with the folder and socket opened up by hand, SO_PEERCRED still refuses it
    assert peercred.returncode == 0, peercred.stderr
    status, body = peercred.stdout.strip().split(" ", 1)
    assert status == "403" and json.loads(body)["error"]["code"] == "control-forbidden"


def _other_user_attempts(home: Path, path: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    client = _as_nobody(f"""
        import httpx, httpx._transports.default  # noqa: F401  (imported while /root is readable)
        from node.common.errors import KithError
        from node.host.control import ControlClient
        ControlClient({str(home)!r})  # warm every import
        drop()
        try:
            ControlClient({str(home)!r}).state()
            print("answered")
        except KithError as exc:
            print(exc.code)
    """)
    # open the way to the socket for everyone: only the peer-uid check is left
    os.chmod(path.parent, 0o711)
    os.chmod(path, 0o666)
    try:
        peercred = _as_nobody(f"""
            import socket
            fd = os.open({str(path.parent)!r}, os.O_PATH)  # as root: a handle on the folder
            drop()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(f"/proc/self/fd/{{fd}}/control.sock")
            s.sendall(b"GET /v1/state HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            head, _, body = data.partition(b"\\r\\n\\r\\n")
            print(head.split()[1].decode(), body.decode())
        """)
    finally:
        os.chmod(path, 0o600)
        os.chmod(path.parent, 0o700)
    return client, peercred


def test_host_and_client_refuse_a_control_folder_open_to_others(tmp_path):
    home = tmp_path / "h"
    _init(home)
    run = home / "run"
    run.mkdir(mode=0o700)
    os.chmod(run, 0o755)

    async def start() -> None:
        await InProcessHost(home, tmp_path).run()

    with pytest.raises(KithError) as err:
        anyio.run(start, backend="asyncio")
    assert err.value.code == "control-dir-unsafe" and "0755" in err.value.message
    with pytest.raises(KithError) as err:
        ControlClient(home).state()
    assert err.value.code == "control-dir-unsafe"
    r = kith(home, "status")
    assert r.returncode == 1 and "error [control-dir-unsafe]" in r.stderr, r.stderr
    if os.geteuid() == 0:  # a folder of another owner, even 0700
        uid, gid = _nobody()
        os.chmod(run, 0o700)
        os.chown(run, uid, gid)
        with pytest.raises(KithError) as err:
            ControlClient(home).state()
        assert err.value.code == "control-dir-unsafe" and "owned by uid" in err.value.message


def test_quota_left_reads_a_bucket_without_taking_from_it():
    from node.policy.quota import RateLimiter
    from node.policy.store import Quota

    now = [1000.0]
    limiter = RateLimiter(clock=lambda: now[0])
    own, shared = Quota(3600, 3, 65536), Quota(3600, 2, 65536)
    key = "a" * 64
    assert limiter.left(key, own) == 3 and limiter.left(key, own) == 3  # reading takes nothing
    assert limiter.take(key, own).ok
    assert limiter.left(key, own) == 2
    assert limiter.left(key, own, shared) == 2  # the shared anonymous bucket is still full (2)
    assert limiter.take(key, own, shared).ok
    assert limiter.left(key, own, shared) == 1 and limiter.left("b" * 64, own, shared) == 1
    now[0] += 1.0  # one token back per second at 3600/h
    assert limiter.left(key, own) == 2
    assert limiter.left(key, Quota(0, 3, 65536)) == 0


def test_status_says_policy_toml_is_broken_and_what_the_host_does(homes):
    """`kith status` was silent about a policy.toml that does not load (issue 32): it says
    so, and what the host does then — a running host keeps its last good policy, a host
    not running refuses to start."""
    host_home = homes["host"]

    async def main() -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
        host = InProcessHost(host_home, homes["tmp"])
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            (host_home / "policy.toml").write_text("[[rule]\n")  # half-edited
            text = await anyio.to_thread.run_sync(lambda: kith(host_home, "status"))
            data = await anyio.to_thread.run_sync(lambda: kith(host_home, "status", "--json"))
            host.stop.set()
        return text, data

    text, data = anyio.run(main, backend="asyncio")
    assert text.returncode == 0, text.stderr
    assert "policy: policy.toml is not valid (policy-invalid: " in text.stdout, text.stdout
    assert "the running host keeps the last good policy it read (1 rule(s), 0 group(s))" in text.stdout
    policy = json.loads(data.stdout)["policy"]
    assert (policy["ok"], policy["code"], policy["inForce"]) == (False, "policy-invalid", {"rules": 1, "groups": 0})
    stopped = kith(host_home, "status")
    assert "`kith host` refuses to start until it is fixed" in stopped.stdout, stopped.stdout
    (host_home / "policy.toml").unlink()
    assert "policy: 0 rule(s), 0 group(s)" in kith(host_home, "status").stdout
