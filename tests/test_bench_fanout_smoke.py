"""``scripts/bench_fanout`` runs end to end at a tiny size and prints every phase (it
checks that the benchmark runs over real iroh on loopback, never its timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_CORPUS = ROOT / "protocols" / "knowledge-query" / "test" / "corpus"

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def test_bench_fanout_prints_every_phase() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_fanout"), "--hosts", "2", "--questions", "2",
                           "--cold", "1", "--timeout", "5", "--corpus", str(FIXTURE_CORPUS), "--json"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    labels = [p["label"] for p in report["phases"]]
    assert labels == ["warm 1-peer", "warm 2-peer", "2-peer, h1 killed at q1", "cold 1-peer", "cold 1-peer"]
    killed = report["phases"][2]["after_kill"]
    assert killed["asks"] == 1 and set(killed["dead_reported_as"]) <= {"peer-timeout", "unreachable"}
    assert report["pool"]["endpoints"] == 1
