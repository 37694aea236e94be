"""Plots without matplotlib (found by the session-26 walk).

``agentd bench --out DIR`` promises "reports, report.md, plots, logs"; without the optional
matplotlib it wrote no plot and said nothing, and ``python -m bench.plots`` told the user to
``pip install 'agentd[plots]'``: "agentd" on PyPI is another project (this distribution is
agentd-scheduler), so that command installs someone else's package.  Both now name the checkout's
extra, ``agentd bench`` says it on stderr and in report.md, and ``bench.plots`` leaves no empty
output directory behind.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import plots


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)


def test_the_missing_extra_is_named_with_the_right_install_command(no_matplotlib: None) -> None:
    message = plots.missing_plots()
    assert message is not None
    assert "pip install -e '.[plots]'" in message
    assert "agentd[" not in message


def test_bench_plots_without_matplotlib_exits_1_naming_it_and_makes_no_directory(
    no_matplotlib: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "native.json"
    report.write_text(json.dumps({"samples": {"jct_seconds": [1.0, 2.0]}}))
    out = tmp_path / "plots"
    assert plots.main(["--out", str(out), f"native={report}"]) == 1
    assert capsys.readouterr().err == f"python -m bench.plots: {plots.NO_MATPLOTLIB}\n"
    assert not out.exists()
