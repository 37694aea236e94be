"""What the session-26 walk found in the ``agentd`` commands (the options session 25 did not try).

Each test runs the command in this process through ``daemon.cli.main``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon import cli

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml")


def test_simulate_says_why_it_exits_1(tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--model`` other than the one ``[embedded]`` serves: every request a 404, and exit 1 with
    nothing on stderr (as replay before session 25)."""
    report = tmp_path / "sim.json"
    argv = ["simulate", "--config", QUICKSTART, "--trace", trace, "--model", "other-model", "--out", str(report)]
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    requests = json.loads(report.read_text())["requests"]
    assert requests["failed"] == 2 and requests["completed"] == 0
    assert out == ""
    planned = requests["planned"]
    assert err.strip() == f"agentd simulate: 2 of {planned} planned requests failed (http_404: 2); 0 completed"


def test_check_fairness_with_nothing_to_check_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed "result: PASS (0 checks)" and exited 0: a verdict on nothing."""
    out = tmp_path / "cf"
    argv = ["check-fairness", "--config", QUICKSTART, "--out", str(out), "--scenarios", "none", "--no-machines"]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "agentd check-fairness: --scenarios none with --no-machines leaves nothing to check\n"
    assert not out.exists()
