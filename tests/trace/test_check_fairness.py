"""``agentd check-fairness`` (docs/priority.md §6): bad input exits 2 naming the flag or field; an
unfair configuration fails with a shrunk violation whose written trace reproduces the measured
value under ``agentd simulate``; the verdict table and verdicts.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.fairness.check import CheckOptions, CheckResult, render
from bench.fairness.properties import Measure, ratio_measure, victim_figure
from bench.fairness.scenarios import ClusterSize
from daemon.cli import main

# native dispatch: no tenant fairness at all, so a flood slows the light tenant down
TINY_NATIVE = """
[server]
log_level = "warning"

[embedded]
num_workers = 1
dp_size = 2
num_gpu_blocks = 1024
block_size = 16
"""


def _config(tmp_path: Path, text: str = TINY_NATIVE) -> str:
    path = tmp_path / "agentd.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--budget", "0"], "argument --budget: must be an integer >= 1"),
        (["--scenarios", "flood,typo"], "argument --scenarios: must be all, none or a comma-separated list"),
        (["--shrink-probes", "-1"], "argument --shrink-probes: must be an integer >= 0"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path: Path, capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check-fairness", "--config", _config(tmp_path), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_configs_exit_2_naming_the_field(tmp_path: Path, capsys) -> None:
    assert main(["check-fairness", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = _config(tmp_path, TINY_NATIVE.replace("num_gpu_blocks = 1024", "num_gpu_blocks = 0"))
    assert main(["check-fairness", "--config", bad]) == 2
    assert "embedded.num_gpu_blocks" in capsys.readouterr().err
    remote = _config(tmp_path, '[routing]\nworker_urls = ["http://w:8000"]\n')
    assert main(["check-fairness", "--config", remote]) == 2
    assert "routing.worker_urls: must be empty" in capsys.readouterr().err
    out_file = tmp_path / "file"
    out_file.write_text("")
    assert main(["check-fairness", "--config", _config(tmp_path), "--out", str(out_file)]) == 2
    assert "--out" in capsys.readouterr().err


def test_an_unfair_config_fails_with_a_reproducible_shrunk_violation(tmp_path: Path, capsys) -> None:
    from bench.replay import ReplayOptions
    from bench.simulate import run_simulation
    from bench.trace.format import load_trace
    from daemon.config_loading import load_config

    config, out = _config(tmp_path), tmp_path / "out"
    argv = ["check-fairness", "--config", config, "--out", str(out), "--scenarios", "flood"]
    # scale 1: with the flood at t = 0 (agent roots in start order) a half-size flood on this tiny
    # cluster is over before most light Programs arrive
    argv += ["--no-machines", "--scale", "1", "--shrink-probes", "1", "--no-progress"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "scenario flood seed 0" in captured.err  # progress
    stdout = captured.out
    assert "tenant-isolation" in stdout and "FAIL" in stdout and "result: FAIL" in stdout
    stem = out / "violation-tenant-isolation-flood-seed0"
    command = f"agentd simulate --config {config} --trace {stem}.jsonl --out {stem}.report.json"
    assert command in stdout
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert verdicts["ok"] is False
    violation = verdicts["violations"][0]
    assert violation["property"] == "tenant-isolation" and violation["commands"][0] == command

    # the written traces reproduce the measured ratio exactly (virtual time, deterministic)
    cfg = load_config(config)
    opts = ReplayOptions(time_scale=cfg.embedded.time_scale, model=cfg.embedded.model)
    both = run_simulation(cfg, load_trace(f"{stem}.jsonl"), opts)
    alone = run_simulation(cfg, load_trace(f"{stem}.alone.jsonl"), opts)
    measured = ratio_measure("flood", "x", "light", both, alone)
    assert not measured.ok and measured.measured is not None and measured.measured > 1.25
    written = json.loads(Path(f"{stem}.report.json").read_text())
    assert victim_figure(written, "light", ("jct_seconds", "mean")) == victim_figure(
        both, "light", ("jct_seconds", "mean")
    )
    shrunk = [c for c in verdicts["checks"] if c["prop"] == "tenant-isolation"]
    assert shrunk and shrunk[0]["measured"] > 1.25


def test_render_a_passing_result() -> None:
    opts = CheckOptions(config_path="c.toml", out_dir=Path("o"))
    result = CheckResult(
        measures=(
            Measure("tenant-isolation", "flood seed 0", 1.031, 1.25, True),
            Measure("vtc-bound", "core machine (seed 0)", None, None, True, "no counterexample in 20 examples"),
        ),
        violations=(),
        skipped=(),
        wall_seconds=3.0,
    )
    text = render(result, opts, ClusterSize(2, 65_536))
    assert "2 ranks x 65,536 KV tokens" in text
    assert "1.031" in text and "<= 1.25" in text and "result: PASS (2 checks)" in text


def test_ratio_measure_without_victim_work_is_a_failure() -> None:
    m = ratio_measure("flood", "x", "light", {"tenants": {}}, {"tenants": {"light": {"jct_seconds": {"mean": 2.0}}}})
    assert not m.ok and m.measured is None and "no completed work" in m.detail


def test_the_unfair_example_config_is_valid_and_turns_the_protections_off() -> None:
    from daemon.config_loading import load_config

    cfg = load_config(str(Path(__file__).resolve().parents[2] / "configs" / "unfair-example.toml"))
    assert cfg.embedded_mode and cfg.program_scheduling is not None
    core = cfg.priority.core()
    assert core.fairness == "off" and core.class_order[-1] == "interactive"
    assert not core.interactive_preempts_batch and not core.interactive_pauses_agents
    assert not core.tenant_pause_share and core.heavy_tenant_max_active_per_rank is None


class _Counter:
    """A toy state machine factory: a counter that must stay below ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __call__(self, cfg: object) -> type:
        from hypothesis import strategies as st
        from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

        limit = self.limit

        class CounterMachine(RuleBasedStateMachine):
            def __init__(self) -> None:
                super().__init__()
                self.value = 0

            @rule(step=st.integers(min_value=0, max_value=3))
            def add(self, step: int) -> None:
                self.value += step

            @invariant()
            def below_limit(self) -> None:
                assert self.value < limit, f"counter {self.value} > bound {limit - 1}"

        return CounterMachine


def test_core_machines_pass_fail_and_write_the_shrunk_steps(tmp_path: Path, capsys, monkeypatch) -> None:
    from bench.fairness import machines

    monkeypatch.setattr(machines, "available_machines", lambda: (("never", _Counter(10**9)), ("small", _Counter(5))))
    config, out = _config(tmp_path), tmp_path / "out"
    argv = ["check-fairness", "--config", config, "--out", str(out), "--scenarios", "none", "--seed", "7"]
    assert main(argv) == 1
    stdout = capsys.readouterr().out
    assert "never                core machine (seed 7)" in stdout
    assert "small" in stdout and "FAIL" in stdout and "result: FAIL (1 of 2 checks)" in stdout
    failure = (out / "machine-small.txt").read_text()
    assert "counter" in failure and "> bound 4" in failure
    assert "--scenarios none" in failure.splitlines()[0]  # the reproduction command
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert [c["ok"] for c in verdicts["checks"]] == [True, False]


def test_without_core_machines_the_check_says_so(tmp_path: Path, capsys, monkeypatch) -> None:
    from bench.fairness import machines

    monkeypatch.setattr(machines, "available_machines", lambda: ())
    assert main(["check-fairness", "--config", _config(tmp_path), "--out", str(tmp_path), "--scenarios", "none"]) == 0
    assert "(skipped) core machines" in capsys.readouterr().out


def test_compare_tables(tmp_path: Path, capsys) -> None:
    from bench.fairness import compare

    def report(tenants: dict, tps: float, batch: dict | None = None) -> str:
        path = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        body: dict = {"tenants": tenants, "throughput": {"total_tokens_per_second": tps}, "requests": {"failed": 0}}
        if batch:
            body["batch"] = batch
        path.write_text(json.dumps(body))
        return str(path)

    light = {"light": {"jct_seconds": {"mean": 10.0}}}
    with_flood = {"light": {"jct_seconds": {"mean": 12.0}}, "flood": {"jct_seconds": {"mean": 30.0}}}
    a, b = report(light, 100.0), report(with_flood, 1000.0)
    c = report({"light": {"jct_seconds": {"mean": 30.0}}, "flood": {"jct_seconds": {"mean": 20.0}}}, 980.0)
    assert compare.main(["--kind", "noisy", "--title", "T", f"native={a},{c}", f"agentd={a},{b}"]) == 0
    text = capsys.readouterr().out
    assert "| native | 10.00 | 30.00 | 3.000 | 20.00 | 980 | 1.000 | 0 |" in text
    assert "| agentd | 10.00 | 12.00 | 1.200 | 30.00 | 1000 | 1.020 | 0 |" in text
    i_alone = report({"interactive": {"ttft_seconds": {"p90": 0.1, "p50": 0.1}}}, 1.0)
    i_with = report({"interactive": {"ttft_seconds": {"p90": 0.11, "p50": 0.1}}}, 1.0, {"makespan_seconds": 30.0})
    assert compare.main(["--kind", "interactive", "--title", "T", f"agentd={i_alone},{i_with}"]) == 0
    assert "| agentd | 0.100 | 0.110 | 1.100 | 0.100 | 30.00 | - | 0 |" in capsys.readouterr().out
    assert compare.main(["--kind", "noisy", "--title", "T", "agentd=only-one.json"]) == 2


def test_a_machine_may_publish_its_worst_case(tmp_path: Path) -> None:
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

    from bench.fairness.machines import run_machine

    class Gap(RuleBasedStateMachine):
        worst_case = (0.0, 10.0)

        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        @rule()
        def grow(self) -> None:
            self.n = min(self.n + 1, 7)

        @invariant()
        def bounded(self) -> None:
            cls = type(self)
            cls.worst_case = (max(cls.worst_case[0], float(self.n)), 10.0)
            assert self.n <= 10

    outcome = run_machine("gap", lambda cfg: Gap, None, budget=1, seed=0)
    assert outcome.measure.ok and outcome.measure.bound == 10.0
    assert outcome.measure.measured == 7.0
    assert Gap.worst_case == (0.0, 10.0)  # the core's class is left as it was


def test_priority_flood_is_held_to_the_starvation_bound() -> None:
    from bench.fairness.properties import scenario_measures, starvation_bound_seconds
    from daemon.config_loading import load_config

    cfg = load_config(str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"))
    bound = starvation_bound_seconds(cfg, 600.0)
    assert bound == 300.0 + 1.0  # force_resume_timeout_seconds + metrics_interval_seconds
    both = {"tenants": {"light": {"ttft_seconds": {"max": 9.0}, "jct_seconds": {"mean": 30.0}}}, "requests": {}}
    alone = {"tenants": {"light": {"jct_seconds": {"mean": 10.0}}}}
    m = scenario_measures("priority-flood", "x", "light", both, alone, bound)
    assert [(x.prop, x.measured, x.ok) for x in m] == [
        ("starvation-bound", 9.0, True),
        ("priority-cost", 3.0, True),
        ("no-starvation", 0.0, True),
    ]
    late = {"tenants": {"light": {"ttft_seconds": {"max": 302.0}}}, "requests": {}}
    assert not scenario_measures("priority-flood", "x", "light", late, alone, bound)[0].ok
