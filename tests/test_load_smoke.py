"""``scripts/load`` runs end to end with tiny parameters, stops by itself, and reports the
killed guest as ended by the heartbeat (``peer-unresponsive``) while the others were
answered. Never timing assertions: the ratios are for a human to read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def test_load_script_reports_every_section_and_the_killed_guest():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "load"), "--guests", "3", "--queries", "4",
                           "--joins", "1", "--ui-runs", "1", "--heartbeat", "0.3,1.2", "--timeout", "100", "--json"],
                          capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert r["kith"]["count"] == 12 and r["raw"]["count"] == 12 and r["http"]["count"] == 12
    assert r["http"]["server_cpu_ms_per_request"] > 0  # the plain HTTP baseline ran in its own process
    assert r["kith"]["outcomes"] == {"completed": 3}
    assert r["killed"]["detected"] and r["killed"]["code"] == "peer-unresponsive"
    assert r["killed"]["answers_to_others_meanwhile"] >= 1
    assert r["garbage"]["connections_refused"] >= 1
    assert r["ui"]["bundle_bytes"] > 10_000_000 and r["join"]["ours_ms"] > 0
