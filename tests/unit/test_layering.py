"""Layering guard (docs/architecture.md §1).

* The packages point one way: ``bench -> daemon -> actors -> actors.core``; ``daemon`` and
  ``bench`` may use ``sim``; ``sim`` uses at most the pure ``actors.core``; ``actors.core``
  imports nothing of ours outside itself.  Imports under ``if TYPE_CHECKING:`` and inside
  functions count like any other.
* No import cycle anywhere in the tree.
* ``actors.core`` stays pure: no trio, httpx, quart, hypercorn, prometheus_client, time, logging
  or random.
* Nobody imports trio's private modules.
* Our top-level packages are the repository's own (PyPI has unrelated ``daemon``/``actors``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import actors
import bench
import daemon
import sim

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("actors", "daemon", "sim", "bench")
CORE = REPO / "actors" / "core"
FORBIDDEN_IN_CORE = frozenset(
    {"trio", "httpx", "quart", "quart_trio", "hypercorn", "prometheus_client", "time", "logging", "random"}
)
# layer -> the layers it may import
ALLOWED = {
    "core": {"core"},
    "sim": {"sim", "core"},
    "actors": {"actors", "core"},
    "daemon": {"daemon", "actors", "core", "sim"},
    "bench": {"bench", "daemon", "actors", "core", "sim"},
}


def layer_of(module: str) -> str | None:
    if module == "actors.core" or module.startswith("actors.core."):
        return "core"
    top = module.split(".")[0]
    return top if top in ALLOWED else None


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import; ``from a import b`` yields ``a.b`` when that is a
    module of ours, else ``a``; relative imports are resolved against ``module``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield node.lineno, candidate if _is_our_module(candidate) else base


def _is_our_module(module: str) -> bool:
    path = REPO.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in source_files():
        name = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        deps = graph.setdefault(name, set())
        for _, imported in imported_modules(tree, name, path.name == "__init__.py"):
            if layer_of(imported) is not None and _is_our_module(imported) and imported != name:
                deps.add(imported)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def arrow_violations() -> list[str]:
    out = []
    for path in source_files():
        name = module_name(path)
        src = layer_of(name)
        assert src is not None
        tree = ast.parse(path.read_text(), str(path))
        for line, imported in imported_modules(tree, name, path.name == "__init__.py"):
            dst = layer_of(imported)
            if dst is not None and dst not in ALLOWED[src]:
                out.append(f"{path.relative_to(REPO)}:{line}: {src} imports {imported} ({dst})")
    return out


def forbidden_imports(source: str, filename: str = "<src>") -> list[str]:
    """Every import of a module the pure core must not use (or one of its submodules)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{filename}:{node.lineno}: {name}" for name in names if name.split(".")[0] in FORBIDDEN_IN_CORE]
    return found


def test_layering_guard_detects_every_import_form() -> None:
    source = "\n".join(
        [
            "import trio",
            "import trio.lowlevel as ll",
            "from time import monotonic",
            "from prometheus_client.core import GaugeMetricFamily",
            "import os, logging",
            "if True:\n    import random",
            "def f():\n    from quart_trio import QuartTrio",
            "import timeit",
            "from . import time",
            "import attrs",
        ]
    )
    hits = [hit.split(": ", 1)[1] for hit in forbidden_imports(source)]
    assert hits == ["trio", "trio.lowlevel", "time", "prometheus_client.core", "logging", "random", "quart_trio"]


def test_actors_core_imports_nothing_impure() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert CORE / "__init__.py" in files
    violations = [hit for path in files for hit in forbidden_imports(path.read_text(), str(path.relative_to(REPO)))]
    assert violations == []


def test_package_arrows_point_one_way() -> None:
    assert arrow_violations() == []


def test_the_arrow_check_sees_type_checking_function_level_and_relative_imports() -> None:
    source = "\n".join(
        [
            "from typing import TYPE_CHECKING",
            "if TYPE_CHECKING:\n    from daemon.config import AgentdConfig",
            "def f():\n    import bench.replay",
            "from .. import messages",
            "from . import costs",
        ]
    )
    found = [m for _, m in imported_modules(ast.parse(source), "actors.core.ledger", False)]
    assert sorted(str(layer_of(m)) for m in found if layer_of(m)) == ["actors", "bench", "core", "daemon"]
    assert "actors.messages" in found and "actors.core.costs" in found


def test_no_import_cycles_anywhere() -> None:
    graph = import_graph()
    assert "actors.core.scheduler" in graph and "bench.simulate" in graph
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_of_trio_private_modules() -> None:
    hits = []
    for path in [
        *source_files(),
        *sorted((REPO / "tests").rglob("*.py")),
        *sorted((REPO / "property_tests").rglob("*.py")),
    ]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            hits += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.startswith("trio._")]
    assert hits == []


def test_top_level_packages_come_from_this_repo() -> None:
    # PyPI has unrelated "daemon" and "actors" distributions; make sure they do not shadow ours.
    for package in (actors, daemon, sim, bench):
        assert Path(package.__file__ or "").resolve().is_relative_to(REPO)


def test_daemon_and_relay_processes_do_not_import_the_test_tools() -> None:
    """``agentd start`` and a relay process import neither pytest nor trio.testing (which imports
    pytest when it is installed): start-up time every process pays, and a production install has
    no test extras. The simulator imports trio.testing only in deterministic runs."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import daemon.cli, daemon.commands.start, daemon.supervisor, daemon.dataplane.relay_main\n"
        "print(sorted(m for m in ('pytest', 'trio.testing') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
