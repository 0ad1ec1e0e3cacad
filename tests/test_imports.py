"""The modules of wagma_bench import one another without a cycle (read statically with ast): a cycle makes the
import order matter and hides which layer depends on which. Imports inside functions count too: deferring an
import (to keep start-up fast or an optional package optional) hides a cycle from Python, not from a
reader."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "wagma_bench"

# Known cycles, each to be broken by a change in flight; remove an entry once it has landed.
EXPECTED_TO_BE_FIXED: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def module_imports() -> dict[str, set[str]]:
    """Each module -> the wagma_bench modules it imports anywhere in its body, counting ``from package import
    name`` as an import of ``package.name`` when that is a module."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, node, path.name == "__init__.py")
                deps.add(target)
                deps |= {f"{target}.{alias.name}" for alias in node.names}
        graph[module] = {d for d in deps if d in files and d != module}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_sees_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_the_modules():
    graph = module_imports()
    for importer, imported in EXPECTED_TO_BE_FIXED:
        graph[importer].discard(imported)
    assert find_cycles(graph) == []


def test_config_and_workloads_do_not_import_each_other():
    graph = module_imports()
    assert "wagma_bench.config.schema" not in set().union(
        *(graph[m] for m in graph if m.startswith("wagma_bench.workloads"))
    )
