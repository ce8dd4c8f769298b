"""`scripts/test --quick` (issue 32): the curated subset in tests/quick.txt still covers
every package of node/ — each one is imported by at least one listed test file — and
every listed file exists (a renamed test file must be renamed in the list too)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _listed() -> list[Path]:
    lines = (REPO / "tests" / "quick.txt").read_text(encoding="utf-8").splitlines()
    return [REPO / ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def test_every_listed_file_exists_once():
    listed = _listed()
    missing = [str(p.relative_to(REPO)) for p in listed if not p.is_file()]
    assert not missing, f"tests/quick.txt lists files that do not exist: {missing}"
    assert len(set(listed)) == len(listed)
    assert REPO / "tests" / "test_quick.py" in listed


def test_the_quick_subset_covers_every_package_of_node():
    """Every package, subpackages too (the dashboard is a room of its own), imported by a
    listed file other than this one."""
    packages = sorted(".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "node").rglob("__init__.py")
                      if p.parent != REPO / "node")
    text = "\n".join(p.read_text(encoding="utf-8") for p in _listed() if p.is_file() and p.name != "test_quick.py")
    # an import of the package or a module of it (a name in prose or a docstring is not one)
    uncovered = [pkg for pkg in packages
                 if not re.search(rf"^\s*(from|import)\s+{re.escape(pkg)}\b", text, re.MULTILINE)]
    assert not uncovered, f"no test in tests/quick.txt imports {uncovered}: add one of its test files"


def test_scripts_test_runs_the_list_with_quick():
    script = (REPO / "scripts" / "test").read_text(encoding="utf-8")
    assert "--quick" in script and "tests/quick.txt" in script
