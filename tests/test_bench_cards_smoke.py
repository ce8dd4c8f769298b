"""``scripts/bench_cards`` runs end to end at a tiny size (real iroh on loopback) and reports
both phases; it checks the benchmark runs and that the asleep device never answers, never
its timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def test_bench_cards_reports_both_phases() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_cards"), "--rounds", "1", "--questions", "1",
                           "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["answered_by"] == ["desk"]  # the laptop sleeps
    for phase in ("cold", "warm"):
        assert set(report[phase]) == {"awake device alone", "person, one asleep", "ratio_p50", "target_met"}
