"""`kith protocol test DIR --adversarial`: every malformed variant of every guest→host
message is refused with its stable code before hooks, for both shipped protocols; a lax
protocol fails the table."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import anyio
import pytest

from node.devtools.adversarial import build_variants, run_adversarial
from node.protocol.spec import load_spec

from support.homes import PROTOCOLS, REPO

ISSUE_VARIANTS = {"unknown-field", "missing-field", "wrong-type", "out-of-range", "undeclared-action",
                  "wrong-direction", "system-frame-mid-session", "oversize-line", "invalid-utf8", "invalid-json"}


@pytest.mark.parametrize("name", ["knowledge-query", "echo"])
def test_shipped_protocols_refuse_every_variant_before_hooks(name):
    report = anyio.run(run_adversarial, PROTOCOLS / name, backend="asyncio")
    assert report.passed, [r for r in report.rows if not r.passed]
    assert ISSUE_VARIANTS <= {r.variant for r in report.rows}
    assert not any(r.reached_hook for r in report.rows)
    applicable = [r for r in report.rows if r.got is not None]
    assert len(applicable) >= 14
    # every guest→host message got its own four variants
    spec = load_spec(PROTOCOLS / name)
    for action, m in spec.messages.items():
        if m.allowed_from("guest"):
            assert {r.variant for r in report.rows if r.message == action} >= {"unknown-field", "missing-field",
                                                                                 "wrong-type"}


def test_cli_prints_the_table_and_json():
    proc = subprocess.run([sys.executable, "-m", "node.cli.main", "protocol", "test",
                           str(PROTOCOLS / "knowledge-query"), "--adversarial", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["passed"] and doc["adversarial"]["passed"]
    rows = {(r["variant"], r["message"]): r["got"] for r in doc["adversarial"]["rows"]}
    assert rows[("out-of-range", "query")] == "message-schema-invalid"
    assert rows[("invalid-utf8", "-")] == "frame-invalid-utf8"
    assert rows[("oversize-line", "-")] == "frame-too-large"
    assert rows[("wrong-direction", "results")] == "message-wrong-direction"


def test_a_lax_schema_fails_the_table(tmp_path):
    lax = tmp_path / "lax"
    shutil.copytree(PROTOCOLS / "echo", lax)
    spec = json.loads((lax / "spec.json").read_text())
    spec["name"] = "lax"
    spec["messages"]["say"]["schema"]["additionalProperties"] = True  # unknown fields slip through
    (lax / "spec.json").write_text(json.dumps(spec))
    report = anyio.run(run_adversarial, lax, backend="asyncio")
    bad = [r for r in report.rows if not r.passed]
    assert [(r.variant, r.message) for r in bad] == [("unknown-field", "say")]
    assert bad[0].reached_hook and bad[0].got is None
    proc = subprocess.run([sys.executable, "-m", "node.cli.main", "protocol", "test", str(lax), "--adversarial"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1 and "NOT REFUSED" in proc.stdout


def test_variants_are_built_from_the_schema():
    spec = load_spec(PROTOCOLS / "knowledge-query")
    by = {(v.name, v.message): v for v in build_variants(spec)}
    topk = json.loads(by[("out-of-range", "query")].line)
    assert topk["topK"] == 21
    assert len(by[("oversize-line", "-")].line) > spec.limits.max_message_bytes
