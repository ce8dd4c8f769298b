"""``scripts/load_community`` runs end to end with tiny parameters on its own throwaway
PostgreSQL, stops by itself and reports every section with only successful answers. Never
timing assertions: the numbers are for a human to read (the rate-limit and lease figures
are checked only for being measured)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.iroh, pytest.mark.slow]


def test_load_community_reports_every_section() -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    pytest.importorskip("psycopg_pool")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "load_community"), "--posts",
                           "200", "--hosts", "20", "--duration", "1", "--writes", "10",
                           "--rate-seconds", "2", "--lease-ttl", "4", "--json"],
                          capture_output=True, text=True, timeout=400, cwd=ROOT)
    if proc.returncode == 2 and "PostgreSQL server binaries" in proc.stderr:
        pytest.skip("PostgreSQL server binaries are not installed")
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    r = json.loads(proc.stdout)
    assert set(r["read"]) == set(r["write"]) == {"SQLite x1", "PostgreSQL x1", "PostgreSQL x2"}
    for label in r["read"]:
        for scenario in r["read"][label].values():
            assert scenario["requests"] > 0
            assert scenario["non_2xx"] == 0 and scenario["socket_errors"] == 0
        for scenario in r["write"][label].values():
            assert scenario["requests"] == 10 and scenario["failures"] == {}
    assert r["rate_limit"]["granted"] >= r["rate_limit"]["burst"] and r["rate_limit"]["refused"] > 0
    assert r["lease"]["killed_to_gone_s"] > 0
