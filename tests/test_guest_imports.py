"""A guest that asks a live peer loads neither tantivy, nor the corpus's search and store, nor
the host's modules (issue 44, "a guest that starts fast"): `kith join --query`, `kith ask
--peer` and `kith verify` are real processes here, run with ``python -X importtime`` against a
real `kith host` on loopback, and every module they imported is read from that report.

Allowed from the corpus package: the package itself (the two bounds the answer contract
states, node/corpus/__init__.py) — not even its pure modules (``globs``, loaded only to check
a request's ``sources`` filter; ``sources``; ``types``). The outbound gate
(node.policy.outbound) reads its small fingerprint file, never the corpus package. Nor
platformdirs (the home is given) nor tomllib (the home has no config.toml).
Nor does it load the agents module (node.local.agents) when the home's agents.json exists:
only the first command of a home made before agents creates the agent ``default``.

Nor rich where nothing is rendered with it (node/cli/common.py's consoles are built on first
use): `kith join` of a paired host printing its answer to a pipe, `kith ask --json`, `kith verify --json`. A
table (`kith verify` as text) does load it, which shows the check can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node.local.agents import ensure_default_agent
from support.cli import kith
from support.homes import node_home, pin_host
from support.hosts import HostProcess, prepare_host

pytestmark = pytest.mark.iroh

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "demo" / "corpus" / "python-docs-sample"
#: corpus modules a guest may load: the package (its two bounds), nothing else
PURE_CORPUS = {"node.corpus"}
#: loaded only when needed: the default home's folder (``--home`` given), the TOML parser
#: (a home with a config.toml)
UNNEEDED = {"platformdirs", "tomllib"}


def _imported(home: Path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``kith --home HOME ARGS`` under ``-X importtime``: (the process, the modules it imported)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "node.cli.main", "--home", str(home), *args],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    modules = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "node.cli.main" in modules, r.stderr[-2000:]  # the report was read
    return r, modules


def _rich(modules: set[str]) -> list[str]:
    """The rich modules among ``modules``."""
    return sorted(m for m in modules if m == "rich" or m.startswith("rich."))


def _forbidden(modules: set[str]) -> list[str]:
    return sorted(m for m in modules
                  if m == "tantivy" or m.startswith("tantivy.") or m.startswith("node.host")
                  or m == "node.local.agents" or m in UNNEEDED
                  or (m.startswith("node.corpus") and m not in PURE_CORPUS))


def test_join_ask_and_verify_of_a_live_peer_load_no_tantivy_corpus_or_host_module(tmp_path):
    host = prepare_host(tmp_path, SAMPLE)
    guest = node_home(tmp_path, "guest")
    ensure_default_agent(guest)  # as `kith init` does: the home has its agents.json
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        r, modules = _imported(guest, "join", str(tmp_path / "inv.json"), "--local", "--trust", "--query",
                               "run a command and capture its output")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "subprocess" in r.stdout  # a real answer came back
        assert _forbidden(modules) == []

        pin_host(guest, "alice", h.invitation)
        r, modules = _imported(guest, "join", "--peer", "alice", "--local", "--query",
                               "run a command and capture its output")  # a paired host, its answer to a pipe
        assert r.returncode == 0, r.stderr[-2000:]
        assert "subprocess" in r.stdout
        assert "path: direct" in r.stderr and "session " in r.stderr  # its lines on stderr, written plain
        assert _forbidden(modules) == []
        assert _rich(modules) == []
        r, modules = _imported(guest, "ask", "run a command and capture its output", "--peer", "alice",
                               "--json", "--citations")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "/python-docs-sample/subprocess.rst.txt" in r.stdout
        assert _forbidden(modules) == []
        assert _rich(modules) == []
        (tmp_path / "answer.json").write_text(r.stdout)
    finally:
        h.stop()
    r, modules = _imported(guest, "verify", str(tmp_path / "answer.json"), "--json")
    assert r.returncode in (0, 1), r.stderr[-2000:]  # a verdict, whatever it is, without the corpus
    assert "counts" in r.stdout
    assert _forbidden(modules) == []
    assert _rich(modules) == []
    r, modules = _imported(guest, "verify", str(tmp_path / "answer.json"))
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert "result" in r.stdout  # the table's header: rendered by rich
    assert _forbidden(modules) == []
    assert "rich.table" in _rich(modules)  # the check can see rich


def test_the_check_sees_a_forbidden_module(tmp_path):
    """The check itself: `kith search` (the owner's own corpus) does load tantivy and the
    corpus's search, so the rule above could fail."""
    home = node_home(tmp_path, "owner")
    assert kith(home, "index", "add", str(SAMPLE)).returncode == 0
    assert kith(home, "index", "sync").returncode == 0
    r, modules = _imported(home, "search", "capture output", "--top-k", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tantivy" in _forbidden(modules) and "node.corpus.search" in _forbidden(modules)
