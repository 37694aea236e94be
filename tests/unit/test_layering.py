"""Layering guard: actors/core stays pure; our top-level packages are the repo's own."""

from __future__ import annotations

import ast
from pathlib import Path

import actors
import daemon

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "actors" / "core"
FORBIDDEN = frozenset(
    {"trio", "httpx", "quart", "quart_trio", "hypercorn", "prometheus_client", "time", "logging", "random"}
)


def forbidden_imports(source: str, filename: str = "<src>") -> list[str]:
    """Every import of a forbidden top-level module (or one of its submodules)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{filename}:{node.lineno}: {name}" for name in names if name.split(".")[0] in FORBIDDEN]
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


def test_top_level_packages_come_from_this_repo() -> None:
    # PyPI has unrelated "daemon" and "actors" distributions; make sure they do not shadow ours.
    assert Path(daemon.__file__).resolve().is_relative_to(REPO)
    assert Path(actors.__file__).resolve().is_relative_to(REPO)
