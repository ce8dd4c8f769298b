"""Device pairing through real `kith device add` / `kith device join` processes over iroh on
loopback (:class:`Offer`, :func:`join_offer`, :func:`pair_device`), and reading what a
`kith join --json` printed (:func:`result_sources`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support.cli import KITH, kith, next_line, pending, readline


class Offer:
    """A `kith device add --local --json --yes-words` process; its first line is the code."""

    def __init__(self, home: Path) -> None:
        self.proc = subprocess.Popen([*KITH, "--home", str(home), "device", "add", "--local", "--json", "--yes-words"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.code = json.loads(self.line(30))["code"]

    def line(self, timeout: float) -> str:
        line = next_line(self.proc.stdout, timeout)
        if line is None:
            self.proc.kill()
            raise AssertionError(f"device add printed nothing in {timeout}s: {self.proc.stderr.read()}")
        return line

    def answer(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("device add did not exit")
        return self.proc.returncode, pending(self.proc.stdout) + out, err


def join_offer(home: Path, code: str, name: str = "laptop") -> subprocess.Popen:
    """A `kith device join CODE --local --json` process for ``home`` (device name ``name``)."""
    return subprocess.Popen([*KITH, "--home", str(home), "device", "join", code, "--local", "--json",
                             "--device-name", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def pair_device(holder: Path, new_home: Path, name: str = "laptop") -> str:
    """Pair ``new_home`` as a device of the person whose key ``holder`` keeps, through real
    `kith device add` / `kith device join` processes (words confirmed); returns the new
    device's key."""
    offer = Offer(holder)
    joiner = join_offer(new_home, offer.code, name=name)
    assert json.loads(readline(joiner, 60))["event"] == "pairing-words"
    offer.answer("yes")
    _out, err = joiner.communicate(timeout=30)
    assert joiner.returncode == 0, err
    assert offer.finish()[0] == 0
    return json.loads(kith(new_home, "status", "--json").stdout)["identity"]["key"]


def result_sources(stdout: str) -> set[str]:
    """Every source named by the ``results`` lines of a `kith join --json` run."""
    out: set[str] = set()
    for line in stdout.splitlines():
        msg = json.loads(line)
        if msg.get("action") == "results":
            out |= {r["source"] for r in msg["envelope"]["results"]}
    return out
