"""The test tree's one rule for shared code: a test file imports what it shares with other
files from tests/support (fixtures come from tests/conftest.py by name), never from another
test module, so a newcomer finds every harness and helper in one place."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, at any depth (a test's local imports too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _test_module(name: str) -> bool:
    top = name.split(".")[0]
    return top.startswith("test_") or top in {"conftest", "helpers"} or name.startswith("tests.test_")


def test_no_test_module_imports_another_test_module():
    offenders = [f"{path.name}:{line}: imports {module}"
                 for path in sorted(TESTS.glob("test_*.py")) + sorted((TESTS / "support").glob("*.py"))
                 for line, module in _imported_modules(path) if _test_module(module)]
    assert offenders == [], "move what is shared into tests/support:\n" + "\n".join(offenders)


def test_the_rule_sees_an_import_inside_a_test(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("def test_x():\n    from test_transport_session import _home\n    import conftest\n")
    assert [m for _line, m in _imported_modules(sample) if _test_module(m)] == ["test_transport_session", "conftest"]
