"""Session 33: ``agentd check-fairness --scale`` had no upper bound (``--scale 1e9`` built scenarios
until memory ran out); it is now ``0 < X <= 50``, an exit 2 naming the flag otherwise
(docs/priority.md §6.3)."""

from __future__ import annotations

import pytest
from test_walk30_cli import QUICKSTART

from bench.commands.check_fairness import MAX_SCALE
from daemon import cli


@pytest.mark.parametrize("value", ["1e9", "50.5", "0", "-1", "nan", "inf", "x"])
def test_check_fairness_scale_is_bounded(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["check-fairness", "--config", str(QUICKSTART), "--scale", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --scale: must be a number > 0 and <= {MAX_SCALE:g}, got '{value}'" in err, err
