"""The core's modules import each other in one direction only (no cycle, no deferred import)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "actors" / "core"
PACKAGE = "actors.core"


def core_modules() -> dict[str, Path]:
    return {f"{PACKAGE}.{path.stem}": path for path in sorted(CORE.glob("*.py")) if path.stem != "__init__"}


def core_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The core modules ``tree`` imports anywhere (top level, under TYPE_CHECKING or in a function)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module in modules:
                found.add(node.module)
            elif node.module == PACKAGE:  # ``from actors.core import handlers``
                found.update(f"{PACKAGE}.{alias.name}" for alias in node.names if f"{PACKAGE}.{alias.name}" in modules)
    return found


def deferred_imports(tree: ast.Module) -> list[int]:
    """Line numbers of imports that do not run at import time (inside a def or an ``if``)."""
    lines: list[int] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and nested:
                lines.append(child.lineno)
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.Try))
            visit(child, inner)

    visit(tree, False)
    return lines


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    done: set[str] = set()
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            cycle = walk(nxt)
            if cycle is not None:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = walk(start)
        if cycle is not None:
            return cycle
    return None


def test_find_cycle_reports_a_cycle_and_accepts_a_chain() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_core_modules_import_without_cycle() -> None:
    modules = core_modules()
    graph = {name: core_imports(ast.parse(path.read_text(), str(path)), set(modules)) for name, path in modules.items()}
    assert find_cycle(graph) is None


def test_core_modules_import_everything_at_import_time() -> None:
    deferred = {
        name: lines
        for name, path in core_modules().items()
        if (lines := deferred_imports(ast.parse(path.read_text(), str(path))))
    }
    assert deferred == {}


def test_core_layers_import_leftwards() -> None:
    # state <- lifecycle <- resume, repair <- binding <- topology <- timers <- sequences
    #   <- arrival, completion <- handlers <- scheduler
    order = [
        "state",
        "lifecycle",
        "resume",
        "repair",
        "binding",
        "topology",
        "timers",
        "sequences",
        "arrival",
        "completion",
        "handlers",
        "scheduler",
    ]
    modules = core_modules()
    for i, name in enumerate(order):
        imported = core_imports(ast.parse(modules[f"{PACKAGE}.{name}"].read_text()), set(modules))
        later = {f"{PACKAGE}.{n}" for n in order[i + 1 :]}
        assert imported & later == set(), f"{name} imports a later layer: {sorted(imported & later)}"
