"""One `kith host` per home (issue 11 "Bad input"): a second one is refused with
`home-in-use` naming the first one's pid, and the lock goes with its owner."""

from __future__ import annotations

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


@pytest.mark.parametrize("refusal", ["home-in-use", "posts.json"])
def test_a_refused_kith_host_start_writes_nothing(tmp_path: Path, refusal: str) -> None:
    """A `kith host` start refused before serving (another host holds the home; a damaged
    posts.json, refused after the host read its state files) leaves every file of the home
    as it was: the seen nonces and quota buckets, whose expired rows a start used to purge,
    are not rewritten, and no audit.key, seen-nonces.sqlite or quota.sqlite is made."""
    import time

    from node.policy.quota import QuotaStore
    from node.trust.seen_nonces import SeenNonces

    home = tmp_path / "home"
    env = {**os.environ, "KITH_OFFLINE": "1"}
    kith = [sys.executable, "-m", "node.cli.main", "--home", str(home)]
    subprocess.run([*kith, "init"], check=True, capture_output=True, env=env, timeout=60)
    nonces = SeenNonces(home)
    nonces.record("p" * 32, "ab" * 32, time.time() - 60)  # expired: the next open purges it
    nonces.close()
    quota = QuotaStore(home)
    quota.save([("cd" * 32, 1.0, time.time() - 2 * QuotaStore.MAX_AGE_S)])  # forgotten at the next open
    quota.close()
    os.utime(home / "seen-nonces.sqlite", ns=(1, 1))  # an old time: a rewrite in this same tick still shows
    os.utime(home / "quota.sqlite", ns=(1, 1))
    if refusal == "posts.json":
        (home / "posts.json").write_text("{not json")
    before = _files(home)
    assert "audit.key" not in before
    fd = acquire_owner_lock(home / "host.lock", "kith host") if refusal == "home-in-use" else None
    try:
        proc = subprocess.run([*kith, "host", "--offline", "--invite-file", str(tmp_path / "inv.json")],
                              capture_output=True, text=True, env=env, timeout=60, cwd=REPO,
                              stdin=subprocess.DEVNULL)
    finally:
        if fd is not None:
            release_owner_lock(fd)
    assert proc.returncode == 1, proc.stderr
    assert ("error [home-in-use]" if refusal == "home-in-use" else "error [config-invalid]") in proc.stderr
    assert "Traceback" not in proc.stderr
    after = _files(home)
    assert sorted(after) == sorted(before), sorted(set(after) ^ set(before))
    assert [n for n in before if after[n] != before[n]] == []
    assert not (tmp_path / "inv.json").exists()
