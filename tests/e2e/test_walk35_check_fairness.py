"""Session 35: a user's walk of ``agentd check-fairness`` (docs/priority.md §6).

- ``--out`` defaulted to ``./check-fairness-out`` without ``--help`` or the docs saying so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.commands.check_fairness import DEFAULT_OUT
from daemon import cli

ROOT = Path(__file__).resolve().parents[2]


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["check-fairness", "--help"])
    assert stopped.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps the help text


def test_out_default_is_in_the_help_and_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert DEFAULT_OUT == "check-fairness-out"
    text = _help(capsys)
    out_help = re.search(r"--out DIR (.*?) --scenarios", text)
    assert out_help is not None, text
    assert "(default ./check-fairness-out)" in out_help[1]
    section = (ROOT / "docs" / "priority.md").read_text().split("## 6. ")[1].split("### 6.1")[0]
    assert "`./check-fairness-out`" in section
