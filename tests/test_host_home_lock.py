"""One `kith host` per home (issue 11 "Bad input"): a second one is refused with
`home-in-use` naming the first one's pid, and the lock goes with its owner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.common.home import acquire_owner_lock, lock_owner, release_owner_lock

REPO = Path(__file__).resolve().parent.parent


def test_owner_lock_names_its_holder_and_is_released(tmp_path: Path) -> None:
    path = tmp_path / "host.lock"
    fd = acquire_owner_lock(path, "kith host")
    assert fd is not None
    assert acquire_owner_lock(path, "kith host") is None  # held (flock is per open file)
    assert lock_owner(path).startswith(f"pid {os.getpid()}, kith host, since ")
    release_owner_lock(fd)
    again = acquire_owner_lock(path, "kith host")
    assert again is not None
    release_owner_lock(again)


def test_a_second_kith_host_on_a_home_in_use_is_refused_with_the_pid(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "KITH_OFFLINE": "1"}
    kith = [sys.executable, "-m", "node.cli.main", "--home", str(home)]
    subprocess.run([*kith, "init"], check=True, capture_output=True, env=env, timeout=60)
    fd = acquire_owner_lock(home / "host.lock", "kith host")  # as a running host holds it
    try:
        proc = subprocess.run([*kith, "host", "--local", "--invite-file", str(tmp_path / "inv.json")],
                              capture_output=True, text=True, env=env, timeout=60, cwd=REPO)
    finally:
        release_owner_lock(fd)
    assert proc.returncode == 1, proc.stderr
    assert "error [home-in-use]" in proc.stderr
    assert f"pid {os.getpid()}" in proc.stderr
    assert not (tmp_path / "inv.json").exists()  # refused before publishing anything


def _files(home: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of ``home`` but the lock files (which name the process holding them):
    its bytes and modification time."""
    return {p.relative_to(home).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(home.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


@pytest.fixture(scope="module")
def served_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose `kith host` served once (posts.json, endpoint.json, card-seq, audit.key
    written), with an expired seen nonce and a forgotten quota bucket that the next open of
    either file purges; every file's time set in the past, so a rewrite shows."""
    import time

    from node.policy.quota import QuotaStore
    from node.trust.seen_nonces import SeenNonces
    from support.hosts import HostProcess

    home = tmp_path_factory.mktemp("served") / "home"
    env = {**os.environ, "KITH_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "node.cli.main", "--home", str(home), "init"], check=True,
                   capture_output=True, env=env, timeout=60)
    code, _, err = HostProcess(home, "--invite-file", str(home.parent / "inv.json")).stop()
    assert code == 0, err
    nonces = SeenNonces(home)
    nonces.record("p" * 32, "ab" * 32, time.time() - 60)  # expired: the next open purges it
    nonces.close()
    quota = QuotaStore(home)
    quota.save([("cd" * 32, 1.0, time.time() - 2 * QuotaStore.MAX_AGE_S)])  # forgotten at the next open
    quota.close()
    for p in home.rglob("*"):
        os.utime(p, ns=(1, 1))
    return home


@pytest.mark.parametrize("refusal", ["home-in-use", "posts.json", "card-seq"])
def test_a_refused_kith_host_start_writes_nothing(served_home: Path, tmp_path: Path, refusal: str) -> None:
    """A `kith host` start refused before serving — another host holds the home; a damaged
    posts.json (refused once the state files were read); a folder where card-seq should be
    (refused once the endpoint is bound) — prints no invitation, writes no invitation file,
    and leaves every file of the home as it was: the seen nonces and quota buckets, whose
    expired rows a start used to purge, posts.json, endpoint.json and audit.key are not
    rewritten, and no file is made."""
    import shutil

    home = tmp_path / "home"
    shutil.copytree(served_home, home, symlinks=True)
    (home / "audit.key").unlink()  # made only once a start is sure to serve
    if refusal == "posts.json":
        (home / "posts.json").write_text("{not json")
    elif refusal == "card-seq":
        (home / "card-seq").unlink()
        (home / "card-seq").mkdir()
    for p in home.rglob("*"):
        os.utime(p, ns=(1, 1))
    before = _files(home)
    fd = acquire_owner_lock(home / "host.lock", "kith host") if refusal == "home-in-use" else None
    try:
        proc = subprocess.run([sys.executable, "-m", "node.cli.main", "--home", str(home), "host", "--offline",
                               "--json", "--invite-file", str(tmp_path / "inv.json")],
                              capture_output=True, text=True, env={**os.environ, "KITH_OFFLINE": "1"}, timeout=60,
                              cwd=REPO, stdin=subprocess.DEVNULL)
    finally:
        if fd is not None:
            release_owner_lock(fd)
    assert proc.returncode == 1, proc.stderr
    code = {"home-in-use": "home-in-use", "posts.json": "config-invalid", "card-seq": "io-error"}[refusal]
    assert f"error [{code}]" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if refusal == "card-seq":  # told by `kith`'s one mapping (node.common.dbfaults.refusal_of)
        assert f"a folder is where Kith keeps a file ({home / 'card-seq'})" in proc.stderr, proc.stderr
        assert f"mv {home / 'card-seq'} {home / 'card-seq'}.bad" in proc.stderr, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [json.loads(proc.stdout)], proc.stdout
    assert "post_id" not in proc.stdout and json.loads(proc.stdout)["error"]["code"] == code  # no invitation printed
    assert not (tmp_path / "inv.json").exists()
    after = _files(home)
    assert sorted(after) == sorted(before), sorted(set(after) ^ set(before))
    assert [n for n in before if after[n] != before[n]] == []


def _entries(home: Path) -> list[str]:
    """Every file and folder of ``home``, lock files included."""
    return sorted(p.relative_to(home).as_posix() for p in home.rglob("*"))


@pytest.mark.parametrize("refusal", ["policy.toml", "--presence", "card-seq", "held-mail card-seq", "held-mail port"])
def test_a_refused_first_kith_host_start_leaves_the_home_file_list_unchanged(tmp_path: Path, refusal: str) -> None:
    """A home that never served, made before agents (no agents.json): a start refused by a
    damaged policy.toml, a bad flag value or a folder where card-seq should be (refused
    once the endpoint is bound) made the agent ``default``, ``run/``, ``host.lock`` and
    ``runner.lock`` (the runner started beside the host before it was refused); it now
    leaves the file list as it was. The start that serves makes them. With --hold-mail
    (iroh, refused at card-seq; HOST:PORT on a port in use) it left the empty held mail's
    mailbox.sqlite3 too."""
    import socket

    home = tmp_path / "home"
    env = {**os.environ, "KITH_OFFLINE": "1"}
    kith = [sys.executable, "-m", "node.cli.main", "--home", str(home)]
    subprocess.run([*kith, "init"], check=True, capture_output=True, env=env, timeout=60, cwd=REPO)
    (home / "agents.json").unlink()  # an older home: the first command makes it
    args = ["host", "--offline", "--invite-file", str(tmp_path / "inv.json")]
    if refusal == "policy.toml":
        (home / "policy.toml").write_text("not toml at all\n")
    elif refusal in ("card-seq", "held-mail card-seq"):
        (home / "card-seq").mkdir()
    elif refusal == "--presence":
        args += ["--presence", "sometimes"]
    squatter = socket.socket()  # a port in use for --hold-mail HOST:PORT
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    if refusal == "held-mail card-seq":
        args += ["--hold-mail", "iroh"]
    elif refusal == "held-mail port":
        args += ["--hold-mail", f"127.0.0.1:{squatter.getsockname()[1]}"]
    before = _entries(home)
    try:
        proc = subprocess.run([*kith, *args], capture_output=True, text=True, env=env, timeout=60, cwd=REPO,
                              stdin=subprocess.DEVNULL)
    finally:
        squatter.close()
    code = {"policy.toml": "policy-invalid", "--presence": "presence-invalid", "card-seq": "io-error",
            "held-mail card-seq": "io-error", "held-mail port": "server-start-failed"}[refusal]
    assert proc.returncode in (1, 2) and f"error [{code}]" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "inv.json").exists(), proc.stderr
    assert _entries(home) == before, sorted(set(_entries(home)) ^ set(before))


def test_a_lock_file_removed_by_its_holder_is_taken_again_on_the_new_file(tmp_path: Path) -> None:
    from node.common.home import remove_owner_lock

    path = tmp_path / "host.lock"
    fd = acquire_owner_lock(path, "kith host")
    remove_owner_lock(path, fd)
    assert not path.exists()
    again = acquire_owner_lock(path, "kith host")
    assert again is not None and path.exists() and lock_owner(path).startswith(f"pid {os.getpid()}")
    assert os.fstat(again).st_ino == path.stat().st_ino
    release_owner_lock(again)
