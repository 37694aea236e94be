"""Session 35: a user's walk of ``agentd check-fairness`` (docs/priority.md §6).

- ``--out`` defaulted to ``./check-fairness-out`` without ``--help`` or the docs saying so.
- ``--scale`` was in neither the verdict table's header nor verdicts.json: a ``--scale 0.001``
  pass looked like a full-size one.  Both have it now, and the result line flags a scale other
  than 1.
- ``--scenarios flood,,hogs`` was read as ``flood,hogs`` and ``flood,flood`` ran the flood scenario
  twice: both are an exit 2 naming ``--scenarios`` and the problem, as an unknown scenario is.
- Ctrl-C exited 130 without a word (on a terminal, after the echoed ``^C`` on the progress
  line).  It now ends the line and says that no verdict table and no verdicts.json were written,
  and which files were.  A Ctrl-C during a core machine was worse: Hypothesis could lose it, and
  the run went on, reporting the interrupted machine as passed or as violated.
- docs/priority.md §6.2 and §6.3 quoted the unfair example's figures of before the waiting gate's
  change of sessions 33-34.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis.stateful import RuleBasedStateMachine, rule
from test_walk30_cli import QUICKSTART

from bench.commands.check_fairness import DEFAULT_OUT, interrupted_message
from bench.fairness.check import CheckOptions, CheckResult, render, scale_note, verdicts_json
from bench.fairness.machines import run_machine
from bench.fairness.properties import Measure
from bench.fairness.scenarios import ClusterSize
from bench.interrupt import noticing_interrupts
from bench.progress import LineTracker, ProgressLine
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


def test_ctrl_c_during_a_simulation_ends_the_line_says_what_was_not_written_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C exited 130 without a word: nothing said that no verdicts were written (and an
    earlier run's verdicts.json in --out looked like this run's)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "verdicts.json").write_text("{}\n")  # an earlier passing run's: no violation files to remove
    argv = ["check-fairness", "--config", str(QUICKSTART), "--out", str(out), "--scenarios", "flood", "--no-machines"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        bufsize=0,
    )
    try:
        assert proc.stderr is not None
        seen = b""
        while b"light alone [" not in seen:  # the first simulation's live progress line is drawn
            char = proc.stderr.read(1)
            assert char, seen
            seen += char
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group gets SIGINT
        stdout, err = proc.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = (seen + err).decode()
    assert proc.returncode == 130, text
    assert stdout == b""
    assert "Traceback" not in text
    *before, message, last = text.split("\n")
    assert last == ""
    assert message == (
        f"agentd check-fairness: interrupted; no verdict table and no {out}/verdicts.json written "
        "(the one there is an earlier run's)"
    )
    assert before[-1].startswith("\r  flood seed 0: light "), before  # the progress line, ended
    assert (out / "verdicts.json").read_text() == "{}\n"
    assert [p.name for p in out.iterdir()] == ["verdicts.json"]


def test_the_message_starts_on_a_line_of_its_own_after_an_open_progress_line() -> None:
    stream = io.StringIO()
    tracker = LineTracker(stream)
    line = ProgressLine(tracker, label="  flood seed 0: light alone", min_interval_seconds=0)
    line.update({"done_requests": 1, "total_requests": 16})
    assert not tracker.at_line_start  # interrupted before the line closed
    tracker.end_line()
    tracker.end_line()  # once
    drawn = stream.getvalue()
    assert drawn.startswith("\r  flood seed 0: light alone [") and " 1/16 req " in drawn
    assert drawn.endswith("s\n") and drawn.count("\n") == 1


def test_interrupted_message(tmp_path: Path) -> None:
    written = [tmp_path / "machine-vtc_bound.txt"]
    assert interrupted_message("agentd check-fairness", tmp_path, written) == (
        f"agentd check-fairness: interrupted; no verdict table and no {tmp_path}/verdicts.json written; "
        f"1 violation file(s) of this run are in {tmp_path}"
    )


class _LosesTheInterrupt(RuleBasedStateMachine):
    """Ctrl-C in a step that Hypothesis loses: printed as ignored in its gc callback and the
    machine goes on (``passes``), or turned into an ``AssertionError`` in its bookkeeping."""

    passes = True

    @rule()
    def step(self) -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        assert type(self).passes


@pytest.mark.parametrize("passes", [True, False])
def test_ctrl_c_lost_inside_a_core_machine_still_interrupts(passes: bool) -> None:
    """A Ctrl-C during a core machine was reported as the machine passing or failing (a
    ``machine-<name>.txt`` "AssertionError" written as a violation) and the run went on."""
    machine = type("Machine", (_LosesTheInterrupt,), {"passes": passes})
    with pytest.raises(KeyboardInterrupt):
        run_machine("starvation", lambda cfg: machine, None, budget=1, seed=0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_noticing_interrupts_leaves_a_run_without_ctrl_c_alone() -> None:
    with noticing_interrupts():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_unfair_examples_documented_figures_are_todays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/priority.md §6.2 and §6.3 quoted flood 3.726 and hogs 3.296 for the unfair example; the
    waiting gate's change of sessions 33-34 had moved them to 3.794 and 3.357 (deterministic:
    virtual time).  The quick part of the documented run, compared with the docs."""
    out = tmp_path / "out"
    argv = ["check-fairness", "--config", str(ROOT / "configs" / "unfair-example.toml"), "--out", str(out)]
    argv += ["--scenarios", "flood,hogs", "--no-machines", "--shrink-probes", "0", "--no-progress"]
    assert cli.main(argv) == 1
    capsys.readouterr()
    checks = json.loads((out / "verdicts.json").read_text())["checks"]
    measured = {c["scenario"]: f"{c['measured']:.3f}" for c in checks if c["prop"] == "tenant-isolation"}
    docs = (ROOT / "docs" / "priority.md").read_text()
    reading = docs.split("### 6.2 Reading the output")[1].split("### 6.3")[0]
    table = re.search(r"^tenant-isolation +flood seed 0 +([\d.]+) ", reading, re.MULTILINE)
    assert table is not None and table[1] == measured["flood seed 0"], measured
    unfair = docs.split("### 6.3 The unfair example")[1].split("Every violation's commands")[0]
    for kind in ("flood", "hogs"):
        listed = re.search(rf"`tenant-isolation` \({kind}\): ([\d.]+)×", unfair)
        assert listed is not None and listed[1] == measured[f"{kind} seed 0"], (kind, measured)
