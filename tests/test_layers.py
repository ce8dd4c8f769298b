"""The layer order of the ``node`` packages (specs/corpus.md "Layers"): no import runs up.

``common`` < ``corpus`` < ``trust`` < ``policy`` < ``answer`` < ``runtime`` < ``cli``: a package
imports only packages below it (and itself) — at the top of a module or inside a function
alike. The policy decides what a peer may see and hands the corpus a lens
(node/corpus/lens.py); the corpus never asks the policy.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

NODE = Path(__file__).resolve().parent.parent / "node"
ORDER = ["common", "corpus", "trust", "policy", "answer", "runtime", "cli"]


def _imports(package: str) -> list[tuple[str, int, str]]:
    """``(file, line, imported node package)`` of every ``node.*`` import in ``package``."""
    out = []
    for path in sorted((NODE / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "node" and len(parts) > 1:
                    out.append((path.relative_to(NODE).as_posix(), node.lineno, parts[1]))
    return out


@pytest.mark.parametrize("package", ORDER[:-1])
def test_no_import_runs_up(package: str) -> None:
    above = set(ORDER[ORDER.index(package) + 1:])
    upward = sorted({(f, line, p) for f, line, p in _imports(package) if p in above})
    assert upward == [], f"{package} imports from a layer above it: {upward}"
