"""``scripts/bench_restart`` runs end to end at a tiny size (one restart, one kill) and
reports both phases (it checks that the benchmark runs over real iroh on loopback and
that the restarted host kept its post, never its timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def test_bench_restart_reports_both_phases() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_restart"), "--restarts", "1", "--kills", "1", "--gone", "1",
                           "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["restart_same_post_id"] is True
    assert report["restart_first_answer_s"]["n"] == 1 and report["killed_known_from_kill_s"]["n"] == 1
    assert report["killed_codes"] == ["peer-unresponsive"] and report["gone_codes"] == ["invitation-gone"]
    assert len(report["load_average"]) == 3
