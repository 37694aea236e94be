"""Session 35: a user's walk of ``agentd check-fairness`` (docs/priority.md §6).

- ``--out`` defaulted to ``./check-fairness-out`` without ``--help`` or the docs saying so.
- ``--scale`` was in neither the verdict table's header nor verdicts.json: a ``--scale 0.001``
  pass looked like a full-size one.  Both have it now, and the result line flags a scale other
  than 1.
- ``--scenarios flood,,hogs`` was read as ``flood,hogs`` and ``flood,flood`` ran the flood scenario
  twice: both are an exit 2 naming ``--scenarios`` and the problem, as an unknown scenario is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_walk30_cli import QUICKSTART

from bench.commands.check_fairness import DEFAULT_OUT
from bench.fairness.check import CheckOptions, CheckResult, render, scale_note, verdicts_json
from bench.fairness.properties import Measure
from bench.fairness.scenarios import ClusterSize
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


def test_scale_is_in_the_header_the_result_and_verdicts_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``--scale 0.001`` pass looked like a full-size one: the header and verdicts.json had the
    budget and the seed but not the scale."""
    out = tmp_path / "out"
    argv = ["check-fairness", "--config", str(QUICKSTART), "--out", str(out), "--no-progress"]
    assert cli.main([*argv, "--scenarios", "flood", "--no-machines", "--scale", "0.001"]) == 0
    captured = capsys.readouterr()
    header = captured.out.splitlines()[0]
    assert ", budget 1, seed 0, scale 0.001, " in header, header
    assert "result: PASS (2 checks; scale 0.001: scenarios reduced, not the full check)" in captured.out
    assert "scenario flood seed 0 (2 ranks x 65,536 KV tokens, scale 0.001)" in captured.err
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert (verdicts["budget"], verdicts["seed"], verdicts["scale"]) == (1, 0, 0.001)
    assert verdicts["scale_note"] == "scale 0.001: scenarios reduced, not the full check"


@pytest.mark.parametrize(
    ("scale", "kinds", "note"),
    [
        (1.0, ("flood",), None),
        (2.0, ("flood",), "scale 2: scenarios enlarged beyond the default size"),
        (0.5, (), None),  # --scenarios none: nothing was scaled
    ],
)
def test_scale_note(scale: float, kinds: tuple[str, ...], note: str | None) -> None:
    opts = CheckOptions(config_path="c.toml", out_dir=Path("o"), kinds=kinds, scale=scale)
    result = CheckResult(
        measures=(Measure("tenant-isolation", "flood seed 0", 1.0, 1.25, True),),
        violations=(),
        skipped=(),
        wall_seconds=1.0,
    )
    assert scale_note(opts) == note
    text = render(result, opts, ClusterSize(2, 65_536))
    assert f", seed 0, scale {scale:g}, 1.0 s" in text.splitlines()[0]
    assert text.splitlines()[-1] == (f"result: PASS (1 checks; {note})" if note else "result: PASS (1 checks)")
    assert verdicts_json(result, opts)["scale"] == scale


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("flood,,hogs", "an empty item"),
        ("flood,", "an empty item"),
        (",flood", "an empty item"),
        ("", "an empty item"),
        ("flood,flood", "flood listed twice"),
        ("hogs, flood,hogs", "hogs listed twice"),
        ("flood,typo", "unknown: typo"),
    ],
)
def test_scenarios_with_an_empty_or_repeated_item_exit_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], value: str, problem: str
) -> None:
    """``--scenarios flood,,hogs`` ran flood and hogs as if the empty item were not there, and
    ``flood,flood`` ran the flood scenario twice (each check listed twice)."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(["check-fairness", "--config", str(QUICKSTART), "--scenarios", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    rule = "must be all, none or a comma-separated list of flood, hogs, priority-flood, interactive-under-batch"
    assert f"agentd check-fairness: error: argument --scenarios: {rule}, got {value!r} ({problem})" in err, err
