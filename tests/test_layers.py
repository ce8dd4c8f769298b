"""The layer order of the ``node`` packages (specs/corpus.md "Layers"): no import runs up.

``common`` < ``corpus`` < ``trust`` < ``policy`` < ``answer`` < ``runtime`` < ``host``, ``guest`` < ``cli``: a package
imports only packages below it (and itself) — at the top of a module or inside a function
alike, absolute or relative. The policy decides what a peer may see and hands the corpus a
lens (node/corpus/lens.py); the corpus never asks the policy. The packages beside that
stack (the wire ``protocol``, the ``transport``, the sans-I/O ``engine``, the ``community``
server and client, the ``local`` API/MCP front ends, the ``devtools``) have their place in
the same order, and a package the order does not name fails (a new package is placed, not
left unchecked).

The two wings above ``runtime`` — ``host`` (serving) and ``guest`` (asking) — share no arrow:
neither imports the other, in either direction (the command that runs both roles wires a
callback where one must reach the other). Their place in ORDER is only the order checked.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

NODE = Path(__file__).resolve().parent.parent / "node"
ORDER = ["common", "protocol", "transport", "corpus", "trust", "engine", "community", "policy",
         "answer", "runtime", "host", "guest", "local", "devtools", "cli"]


def _imports(package: str) -> list[tuple[str, int, str]]:
    """``(file, line, imported node package)`` of every ``node.*`` import in ``package``."""
    out = []
    for path in sorted((NODE / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level > 0:  # relative: resolved
                here = ["node", *path.relative_to(NODE).parent.parts]
                base = here[:len(here) - (node.level - 1)] if node.level <= len(here) else []
                module = ".".join(base + ([node.module] if node.module else []))
                names = [module] + [f"{module}.{a.name}" for a in node.names]
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


#: The most import circles ``node/`` may hold (issue 39: 4 before the asking side got its wing).
MAX_CIRCLES = 2


def _module_graph() -> dict[str, set[str]]:
    """``module → modules of node/ it imports``: at the top, inside functions and under
    ``TYPE_CHECKING`` alike, absolute or relative; a package's ``__init__`` left out (an
    import of ``node.x.y`` that names a module counts as that module)."""
    mods = {".".join(("node", *p.relative_to(NODE).with_suffix("").parts)): p
            for p in NODE.rglob("*.py") if p.name != "__init__.py"}

    def module_of(name: str) -> str | None:
        parts = name.split(".")
        for i in range(len(parts), 1, -1):
            if ".".join(parts[:i]) in mods:
                return ".".join(parts[:i])
        return None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = mod.split(".")[:-node.level] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                names = [module] + [f"{module}.{a.name}" for a in node.names]
            for name in names:
                target = module_of(name) if name.startswith("node.") else None
                if target is not None and target != mod:
                    graph[mod].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def test_the_import_graph_holds_at_most_two_circles_and_none_in_a_wing() -> None:
    circles = _circles(_module_graph())
    assert len(circles) <= MAX_CIRCLES, f"import circles in node/: {circles}"
    winged = [c for c in circles if any(m.startswith(("node.host.", "node.guest.")) for m in c)]
    assert winged == [], f"a wing holds an import circle: {winged}"


def test_circles_are_found_by_the_counter() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


#: Packages that never import each other, either way (ORDER alone checks one direction).
WINGS = ("host", "guest")


def test_the_host_and_guest_wings_share_no_arrow() -> None:
    for wing in WINGS:
        others = set(WINGS) - {wing}
        across = sorted({(f, line, p) for f, line, p in _imports(wing) if p in others})
        assert across == [], f"{wing} imports from the other wing: {across}"


def test_every_package_is_placed() -> None:
    packages = {p.name for p in NODE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert sorted(packages - set(ORDER)) == [], "place the new package in ORDER (and specs/corpus.md)"


def test_relative_imports_are_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "x.py").write_text("from ..policy import gate\nfrom . import store\n")
    monkeypatch.setattr(sys.modules[__name__], "NODE", tmp_path)
    assert _imports("corpus") == [("corpus/x.py", 1, "policy"), ("corpus/x.py", 1, "policy"),
                                  ("corpus/x.py", 2, "corpus"), ("corpus/x.py", 2, "corpus")]
