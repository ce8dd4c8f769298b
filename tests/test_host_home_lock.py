"""One `kith host` per home (issue 11 "Bad input"): a second one is refused with
`home-in-use` naming the first one's pid, and the lock goes with its owner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
