"""``agentd check-fairness`` into a reused ``--out`` (docs/priority.md §6.2): the directory holds this
run's results for the checks it repeats, never an earlier run's violation beside a passing verdict."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from bench.commands.check_fairness import clear_earlier_results
from daemon.cli import main

CONFIG = """
[server]
log_level = "warning"

[embedded]
num_workers = 1
dp_size = 2
num_gpu_blocks = 1024
block_size = 16
"""

SCENARIO_FILES = {
    kind: [
        f"violation-{prop}-{kind}-seed3{suffix}"
        for suffix in (".jsonl", ".alone.jsonl", ".report.json", ".alone.report.json")
    ]
    for kind, prop in (
        ("flood", "tenant-isolation"),
        ("hogs", "tenant-isolation"),
        ("priority-flood", "no-starvation"),
        ("interactive-under-batch", "interactive-ttft"),
    )
}
NOT_OURS = ["notes.txt", "violation-notes.md", "machine-learning.txt.bak", "verdicts.old.json"]


def _machine(limit: int) -> Callable[[object], type]:
    """A machine factory (called with the configuration) whose counter must stay below ``limit``."""
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

    class CounterMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.value = 0

        @rule()
        def step(self) -> None:
            self.value += 1

        @invariant()
        def bounded(self) -> None:
            assert self.value < limit, f"counter {self.value} > bound {limit - 1}"

    return lambda cfg: CounterMachine


def _populate(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in [n for names in SCENARIO_FILES.values() for n in names] + NOT_OURS:
        (out / name).write_text("stale")


def test_only_the_repeated_checks_files_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _populate(out)
    (out / "machine-vtc_bound.txt").write_text("stale")
    removed = clear_earlier_results(out, ("flood", "interactive-under-batch"), machines=False)
    # "flood" does not take the priority flood's files, whose names also end in "-flood-seed3"
    assert sorted(p.name for p in removed) == sorted(
        SCENARIO_FILES["flood"] + SCENARIO_FILES["interactive-under-batch"]
    )
    left = {p.name for p in out.iterdir()}
    assert left == set(SCENARIO_FILES["hogs"] + SCENARIO_FILES["priority-flood"] + NOT_OURS + ["machine-vtc_bound.txt"])
    assert [p.name for p in clear_earlier_results(out, (), machines=True)] == ["machine-vtc_bound.txt"]
    assert clear_earlier_results(tmp_path / "missing", ("hogs",), machines=True) == []


def test_a_passing_run_into_a_reused_out_leaves_no_earlier_violation(tmp_path: Path, capsys, monkeypatch) -> None:
    from bench.fairness import check, machines

    config = tmp_path / "agentd.toml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    argv = ["check-fairness", "--config", str(config), "--out", str(out), "--scenarios", "none", "--no-progress"]

    monkeypatch.setattr(machines, "available_machines", lambda: (("small", _machine(5)),))
    assert main(argv) == 1
    assert (out / "machine-small.txt").exists()
    _populate(out)
    capsys.readouterr()

    def interrupted(self: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:  # Ctrl-C during the run: no verdicts naming removed files
        m.setattr(check.Checker, "run", interrupted)
        assert main(argv) == 130
    assert not (out / "machine-small.txt").exists() and not (out / "verdicts.json").exists()
    (out / "machine-small.txt").write_text("stale")

    monkeypatch.setattr(machines, "available_machines", lambda: (("small", _machine(10**9)),))
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "result: PASS (1 checks)" in captured.out
    assert f"removed 1 file(s) an earlier run wrote for these checks from {out}" in captured.err
    assert not (out / "machine-small.txt").exists()
    # the scenarios were not checked again: their earlier traces stay, as does everything else
    left = {p.name for p in out.iterdir()}
    assert left == {"verdicts.json", *NOT_OURS, *(n for names in SCENARIO_FILES.values() for n in names)}
    assert json.loads((out / "verdicts.json").read_text())["ok"] is True
