"""The house rule docs/ARCHITECTURE.md draws: imports between edge_agent's packages run one way,
so no package imports one that imports it back, however far round. Three such cycles grew
unnoticed (a helper borrowed from a package above) until the map was drawn."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import edge_agent

ROOT = Path(edge_agent.__file__).parent


def _unit(path: Path) -> str:
    """The package, or top-level module, a file belongs to."""
    first = path.relative_to(ROOT).parts[0]
    return first.removesuffix(".py")


def _imports() -> dict[str, set[str]]:
    units = {_unit(p) for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        source = _unit(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                inside = parts[0] == "edge_agent" and len(parts) > 1 and parts[1] in units
                if inside and parts[1] != source:
                    edges[source].add(parts[1])
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_package_imports_one_that_imports_it_back() -> None:
    edges = _imports()
    assert "store" in edges["agent"]  # the scan sees imports at all
    assert _cycles(edges) == []


def test_the_scan_finds_a_cycle_when_there_is_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
