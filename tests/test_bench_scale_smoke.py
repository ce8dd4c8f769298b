"""``scripts/bench_scale`` runs end to end at a tiny size and reports every figure.

This checks that the benchmark runs (real ``kith index add``/``sync`` child processes, a
read-only serving child), never timing. Skips when the Python docs corpus is absent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpora" / "python-docs-3.11"

pytestmark = [pytest.mark.slow]


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpora/python-docs-3.11 is absent")
def test_bench_scale_reports_build_disk_rss_and_query_latencies(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_scale"), "--chunks",
                           "400", "--rounds", "1", "--json", "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["build"]["chunks"] > 0 and r["build"]["failed"] == 0
    assert r["build"]["peak_rss_mb"] > 0 and r["disk"]["tantivy_bytes"] > 0
    s = r["serve"]
    assert s["num_docs"] == r["build"]["chunks"]
    assert s["peer_view_on_main_index"] is True  # the peer sees everything: no RAM copy
    # a few hundred chunks cannot answer every question: none is refused, most are found
    assert set(s["peer_statuses"]) <= {"ok", "no-verified-results"}
    assert s["peer_statuses"].get("ok", 0) > s["queries"] // 2
    for key in ("raw", "owner", "peer"):
        assert s[f"{key}_p50_ms"] > 0 and s[f"{key}_p99_ms"] >= s[f"{key}_p50_ms"]
    assert s["peak_rss_mb"] > 0


def test_bench_scale_refuses_a_missing_corpus(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_scale"), "--corpus",
                           str(tmp_path / "absent")], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "not found" in proc.stderr
