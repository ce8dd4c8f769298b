"""``scripts/load`` runs end to end with tiny parameters, stops by itself, and reports the
killed guest as ended by the heartbeat (``peer-unresponsive``) while the others were
answered. Never timing assertions: the ratios are for a human to read."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def test_load_script_reports_every_section_and_the_killed_guest():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "load"), "--guests", "3", "--queries", "4",
                           "--joins", "1", "--ui-runs", "1", "--heartbeat", "0.3,1.2", "--timeout", "150", "--json"],
                          capture_output=True, text=True, timeout=160, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert r["kith"]["count"] == 12 and r["raw"]["count"] == 12 and r["http"]["count"] == 12
    assert r["http"]["server_cpu_ms_per_request"] > 0  # the plain HTTP baseline ran in its own process
    assert r["kith"]["outcomes"] == {"completed": 3}
    assert r["killed"]["detected"] and r["killed"]["code"] == "peer-unresponsive"
    assert r["killed"]["answers_to_others_meanwhile"] >= 1
    assert r["garbage"]["connections_refused"] >= 1
    assert r["ui"]["bundle_bytes"] > 10_000_000 and r["join"]["ours_ms"] > 0
    # the run where every guest asks different questions, alternated with the HTTP service's
    runs = r["distinct"]["runs"]
    assert len(runs) == 2
    for d in runs:
        assert d["kith"]["count"] == 12 and d["kith"]["outcomes"] == {"completed": 3}
        assert d["http"]["count"] == 12 and d["http"]["server_cpu_ms_per_request"] > 0
    # the inline / thread rounds alternated with the HTTP service's
    hop = r["hop"]
    assert len(hop["inline"]["rps_runs"]) == len(hop["thread"]["rps_runs"]) == len(hop["http"]["rps_runs"]) == 2
    assert all(c > 0 for c in hop["http"]["cpu_ms_runs"])


def test_every_guest_of_the_distinct_run_asks_questions_no_one_else_asks():
    loader = importlib.machinery.SourceFileLoader("kith_scripts_load", str(ROOT / "scripts" / "load"))
    load = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(load)
    a = load.parse_args(["--guests", "16", "--queries", "100"])
    a.distinct = True
    asked = [load.question(a, i, n) for i in range(16) for n in range(100)]
    assert len(set(asked)) == len(asked) == 1600
    a.distinct = False
    assert len({load.question(a, i, n) for i in range(16) for n in range(100)}) == len(load.QUERIES)
