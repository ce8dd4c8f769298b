"""``scripts/bench`` runs end to end with tiny parameters and prints all three sections.

This checks that the benchmark runs (real iroh on loopback, local mode), never timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench"
FIXTURE_CORPUS = ROOT / "protocols" / "knowledge-query" / "test" / "corpus"
TINY = ["--queries", "5", "--joins", "1", "--throughput-mib", "2", "--corpus", str(FIXTURE_CORPUS), "--timeout", "60"]

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def _run(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *TINY, *extra], capture_output=True, text=True,
                          timeout=90, cwd=ROOT)


def test_bench_prints_the_three_sections() -> None:
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "1. join→first answer" in out
    assert "2. warm query p50" in out and "warm query p99" in out
    assert "3. iroh send 2 MiB" in out and "14 KB answer" in out
    assert "section 2 statuses:" in out and "ok" in out


def test_bench_json_has_every_section() -> None:
    proc = _run("--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) >= {"index", "join", "query", "throughput"}
    assert result["query"]["queries"] == 5
    assert {"patched", "unpatched"} <= set(result["throughput"])
    assert result["index"]["chunks"] > 0


def test_bench_refuses_a_missing_corpus(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--corpus", str(tmp_path / "absent")],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert proc.returncode == 2
    assert "not a directory" in proc.stderr
