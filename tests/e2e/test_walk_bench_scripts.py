"""The bench shell scripts on a fresh checkout (found by the session-26 walk).

README.md says ``bench/default_bench.sh``; after ``./scripts/run.sh`` agentd is in the checkout's
``.venv/bin``, not on PATH.  default_bench.sh then failed with "agentd: command not found", and
batch_bench.sh and fairness_bench.sh exited 1 without a word (``head`` of an empty path under
``set -e``).  Now each finds ``.venv/bin/agentd`` of its checkout, or exits 2 saying how to get
one.  A stand-in agentd records what the script runs, so no bench runs here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("default_bench.sh", "fairness_bench.sh", "batch_bench.sh")
# PATH without any agentd (the system's tools only)
BARE_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}


def checkout(tmp_path: Path) -> Path:
    """A copy of the checkout's bench/*.sh (what the scripts need of it besides agentd)."""
    root = tmp_path / "checkout"
    (root / "bench").mkdir(parents=True)
    for script in (*SCRIPTS, "agentd_env.sh"):
        shutil.copy(ROOT / "bench" / script, root / "bench" / script)
    return root


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_agentd_the_script_exits_2_saying_how_to_get_one(tmp_path: Path, script: str) -> None:
    root = checkout(tmp_path)
    done = subprocess.run(
        ["bash", f"bench/{script}", str(tmp_path / "out")], cwd=root, env=BARE_ENV, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"{script}: no agentd: not on PATH and no {root}/.venv/bin/agentd; run ./scripts/run.sh "
        "(or ./scripts/test.sh) once, or set AGENTD=/path/to/agentd\n"
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_checkouts_venv_agentd_is_used_when_none_is_on_path(tmp_path: Path, script: str) -> None:
    root = checkout(tmp_path)
    calls = tmp_path / "calls"
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    # a stand-in interpreter and agentd entry point (#! names the interpreter, as pip writes it);
    # the first call fails, so the script stops there
    python = bin_dir / "python3"
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 7\n')
    agentd = bin_dir / "agentd"
    agentd.write_text(f"#!{python}\n")
    for exe in (python, agentd):
        exe.chmod(0o755)
    done = subprocess.run(
        ["bash", f"bench/{script}", str(tmp_path / "out")], cwd=root, env=BARE_ENV, capture_output=True, text=True
    )
    assert done.returncode == 7, done.stderr
    first = calls.read_text()
    if script == "fairness_bench.sh":  # its first step is python -m bench.fairness.scenarios, with agentd's python
        assert first.startswith("-m bench.fairness.scenarios ")
    else:
        assert first.startswith(f"{agentd} trace synth ")
