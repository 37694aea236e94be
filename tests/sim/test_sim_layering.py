"""Layering: the simulator imports, of this repository, only itself and the pure core."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = frozenset({"actors", "daemon", "sim", "bench"})


def imported_modules(source: str) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every absolute import, wherever it stands (functions, ``if`` blocks)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def first_party_imports(source: str) -> list[tuple[int, str]]:
    return [(line, m) for line, m in imported_modules(source) if m.split(".")[0] in FIRST_PARTY]


def allowed(module: str) -> bool:
    return module == "sim" or module.startswith("sim.") or module == "actors.core" or module.startswith("actors.core.")


def test_guard_sees_every_import_form() -> None:
    source = "import daemon.config\nfrom actors import logevents\nfrom actors.core.config import X\nfrom . import kv\n"
    source += "def f():\n    from bench.bench import ClusterSpec\nif True:\n    import sim.kv, actors.core\n"
    hits = first_party_imports(source)
    assert [m for _, m in hits if not allowed(m)] == ["daemon.config", "actors", "bench.bench"]
    assert [m for _, m in hits if allowed(m)] == ["actors.core.config", "sim.kv", "actors.core"]


def test_sim_imports_only_itself_and_the_pure_core() -> None:
    files = sorted((REPO / "sim").rglob("*.py"))
    assert REPO / "sim" / "__init__.py" in files
    violations = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in files
        for line, module in first_party_imports(path.read_text())
        if not allowed(module)
    ]
    assert violations == []
