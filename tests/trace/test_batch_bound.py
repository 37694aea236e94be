"""The order-independent makespan floor of a batch-only trace (bench/batch_bound.py, docs/batch.md §5.4)."""

from __future__ import annotations

import json

import attrs
import pytest

from actors.core.config import DecodeThroughputModel, PrefillCostModel
from bench.batch_bound import main, makespan_bound
from bench.bench import ClusterSpec
from bench.calibrate import config_for
from bench.replay import ReplayOptions
from bench.simulate import run_simulation
from bench.trace.format import TraceRecord, save_trace
from bench.trace.synth import Knobs, synthesize

# 1 s per prompt token, no quadratic term; decode step = 1 + 0.5 n + 0.01 context
PREFILL = PrefillCostModel(
    intercept_seconds=0.0, linear_seconds_per_1k_tokens=1000.0, quadratic_seconds_per_1k_tokens_squared=0.0
)
DECODE = DecodeThroughputModel(
    fixed_step_seconds=1.0, batch_step_seconds_per_request=0.5, context_step_seconds_per_token=0.01
)
RECORDS = (
    # 100 own prompt tokens, 3 output tokens: 2 decode steps at contexts 101, 102
    TraceRecord(session_id="a", turn=0, input_delta=100, output_length=3, input_length=100, job="j"),
    # 50 own tokens after a 20-token shared prefix, 5 output tokens: 4 decode steps at 71..74
    TraceRecord(
        session_id="b",
        turn=0,
        input_delta=50,
        output_length=5,
        input_length=70,
        job="j",
        shared_prefix_id="p",
        shared_prefix_tokens=20,
    ),
)


def test_floor_parts_on_one_rank_worked_numbers() -> None:
    b = makespan_bound(RECORDS, ranks=1, kv_tokens_per_rank=100, prefill=PREFILL, decode=DECODE)
    assert b.prefill_seconds == pytest.approx(100 + 50 + 20)  # own prompts, the shared prefix once
    assert b.per_request_seconds == pytest.approx(0.5 * (2 + 4))
    assert b.context_seconds == pytest.approx(0.01 * (101 + 102 + 71 + 72 + 73 + 74))
    # private KV held per decode step: 101 + 102 + 51 + 52 + 53 + 54 = 413 token-steps over 100 tokens
    assert b.decode_steps == pytest.approx(4.13)
    assert b.fixed_seconds == pytest.approx(4.13)
    assert b.makespan_seconds == pytest.approx(170 + 3 + 4.93 + 4.13)


def test_on_two_ranks_the_longest_request_bounds_the_steps() -> None:
    b = makespan_bound(RECORDS, ranks=2, kv_tokens_per_rank=100, prefill=PREFILL, decode=DECODE)
    assert b.decode_steps == 4.0  # 413 / 200 < 4 decode steps of the longest request
    assert b.makespan_seconds == pytest.approx(85 + 1.5 + 2.465 + 4.0)
    with pytest.raises(ValueError, match="ranks and kv_tokens_per_rank"):
        makespan_bound(RECORDS, ranks=0, kv_tokens_per_rank=100)


def test_cli_prints_the_floor_and_its_ratio_to_reports(tmp_path, capsys) -> None:
    trace = tmp_path / "batch.jsonl"
    save_trace(synthesize("batch", 8, seed=1), str(trace))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[embedded]\nnum_workers = 1\ndp_size = 2\nnum_gpu_blocks = 100\nblock_size = 16\n")
    floor = makespan_bound(synthesize("batch", 8, seed=1).records, ranks=2, kv_tokens_per_rank=1600).makespan_seconds
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"batch": {"makespan_seconds": floor * 2}}))
    assert main(["--trace", str(trace), "--config", str(cfg), "--report", f"fcfs={report}"]) == 0
    out = capsys.readouterr().out
    assert f"makespan floor for any order: {floor:.2f} s per rank (2 ranks x 1600 KV tokens)" in out
    assert "floor / fcfs makespan" in out and out.rstrip().endswith(": 0.500")
    assert main(["--trace", str(trace), "--config", str(cfg), "--report", "nolabel"]) == 2
    assert "--report: expected LABEL=REPORT.json" in capsys.readouterr().err
    agents = tmp_path / "agents.jsonl"
    save_trace(synthesize("swe-short", 1, seed=1), str(agents))
    assert main(["--trace", str(agents), "--config", str(cfg)]) == 2
    assert "batch-only traces" in capsys.readouterr().err
    # a missing config was a ConfigError traceback (found by the session-25 walk)
    assert main(["--trace", str(trace), "--config", str(tmp_path / "missing.toml")]) == 2
    assert capsys.readouterr().err.startswith("batch_bound: --config: config: cannot read ")


@pytest.mark.parametrize(("blocks", "dp_size"), [(120, 1), (120, 2), (2_000, 1)])
def test_no_simulated_order_beats_the_floor(blocks: int, dp_size: int) -> None:
    """The floor is a floor: every system the batch benchmark compares (FCFS dispatch, the seed's
    engine policy, agentd's batch class) takes at least as long on the simulated engines, under
    KV pressure (120 blocks of 16 per rank) and without it (2,000 blocks)."""
    trace = synthesize("batch", 24, seed=5, knobs=Knobs(input_scale=0.2, output_scale=0.2))
    makespans = {}
    for system, policy in (("fcfs", "fcfs"), ("engine-bja", "batch_job_aware"), ("agentd", "fcfs")):
        cluster = ClusterSpec(workers=1, dp_size=dp_size, num_gpu_blocks=blocks, scheduling_policy=policy, seed=1)
        cfg = config_for(cluster, "agentd" if system == "agentd" else "native")
        if system == "agentd":
            cfg = attrs.evolve(cfg, batch_jobs=attrs.evolve(cfg.batch_jobs, enabled=True))
        report = run_simulation(cfg, trace, ReplayOptions())
        assert report["batch"]["failed"] == 0
        makespans[system] = report["batch"]["makespan_seconds"]
    floor = makespan_bound(trace.records, ranks=dp_size, kv_tokens_per_rank=blocks * 16)
    assert all(floor.makespan_seconds <= m for m in makespans.values()), (floor, makespans)
