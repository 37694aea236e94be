"""Hypothesis strategies over the scheduling core's inputs (bounded, explicit ranges).

Configs are small on purpose: 1-3 ranks, 1-4 active Programs per rank, statistics windows of
2-5 samples so that the fitted TTL, growth reserve, batch gain, force-resume estimate and
cross-rank resume all become active within a few dozen steps.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from actors.core.config import MOVE_COSTS, BackendTarget, ProgramSchedulingConfig
from daemon.http.identity import parse_identity

CTX = "vllm_xargs.agentic_context"
METRICS_INTERVAL_SECONDS = 5.0
PROGRAM_COUNT = 6


@st.composite
def scheduling_configs(draw: st.DrawFn) -> ProgramSchedulingConfig:
    capacity = draw(st.none() | st.sampled_from([1500, 4000, 12_000]))
    strategies = ["consistent_hash", "program_round_robin", "least_program_count", "cache_aware"]
    if capacity is not None:
        strategies.append("reasoning_token_balance")
    low = draw(st.sampled_from([0.6, 0.8, 1.0]))
    high = draw(st.sampled_from([r for r in (0.6, 0.8, 1.0) if r >= low]))
    queue_timeout = draw(st.sampled_from([40.0, 120.0]))
    return ProgramSchedulingConfig(
        binding_only=draw(st.integers(min_value=0, max_value=9)) == 0,
        global_queue=draw(st.booleans()),
        resume_order=draw(st.sampled_from(["mru", "fcfs", "las"])),
        cross_rank_headroom_ratio=draw(st.sampled_from([1.0, 1.2])),
        cross_rank_move_cost=draw(st.sampled_from(list(MOVE_COSTS))),
        binding_strategy=draw(st.sampled_from(strategies)),
        hash_virtual_nodes=8,
        token_capacity_per_dp_rank=capacity,
        max_active_programs_per_target=draw(st.integers(min_value=1, max_value=4)),
        metrics_interval_seconds=METRICS_INTERVAL_SECONDS,
        admission_waiting_request_threshold=draw(st.integers(min_value=0, max_value=2)),
        queue_timeout_seconds=queue_timeout,
        force_resume_timeout_seconds=draw(st.sampled_from([10.0, 30.0])),
        paused_retention_ttl_seconds=draw(st.sampled_from([20.0, 90.0])),
        # the bound on idle paused Programs (docs/program-scheduling.md §1): small ones make the
        # machine's Programs hit it; 20,000 (the default) never binds here
        max_idle_paused_programs=draw(st.sampled_from([1, 3, 20_000])),
        shared_prefix_freshness_warmup_seconds=30.0,
        decode_buffer_tokens=draw(st.sampled_from([0, 100])),
        max_acting_ttl_seconds=draw(st.sampled_from([0.0, 10.0])),
        high_watermark_ratio=high,
        low_watermark_ratio=low,
        max_segment_rounds=draw(st.integers(min_value=1, max_value=4)),
        stats_window_size=draw(st.integers(min_value=2, max_value=5)),
        enable_batch_gain_admission=draw(st.booleans()),
    )


def make_targets(count: int) -> tuple[BackendTarget, ...]:
    return tuple(BackendTarget(f"http://w{i}:8000", 0, f"http://w{i}:8000@0", i) for i in range(count))


def program_body(index: int, scope: dict[str, Any]) -> dict[str, Any]:
    """Canonical metadata of Program ``index``: leads, explicit ids and blocking subagents."""
    if index % 3 == 0:
        ctx: dict[str, Any] = {"program_id": f"prog-{index}"}
    elif index % 3 == 1:
        ctx = {"task_id": f"task-{index // 3}", "agent_id": "lead"}
    else:
        ctx = {"task_id": f"task-{index // 3}", "agent_id": f"worker-{index}"}
    return {"vllm_xargs": {"agentic_context": {**ctx, **scope}}}


request_scopes = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.integers(min_value=-2, max_value=2),
        "deadline_seconds": st.sampled_from([0.0, 3.0, 12.0, 50.0]),
        "expected_output_length": st.integers(min_value=10, max_value=600),
        "kv_retention_ttl_seconds": st.sampled_from([0.0, 2.0, 8.0]),
    },
)

identity_free_requests = st.tuples(
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.just("m"),
            "session_params": st.fixed_dictionaries({"session_id": st.text(min_size=1, max_size=8)}),
            "user": st.text(max_size=8),
            "session_id": st.text(max_size=8),
            "vllm_xargs": st.fixed_dictionaries({}, optional={"agentic_context": st.none(), "top_k": st.just(3)}),
        },
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "x-request-id": st.text(alphabet="abc123", min_size=1, max_size=8),
            "x-trace-id": st.text(alphabet="abc123", min_size=1, max_size=8),
            "x-user-id": st.text(alphabet="abc123", min_size=1, max_size=8),
        },
    ),
    st.sampled_from([CTX, "auto"]),
)


def parse_program_request(index: int, scope: dict[str, Any]) -> Any:
    parsed = parse_identity(program_body(index, scope), {}, CTX)
    assert parsed is not None
    return parsed


usage_shapes = st.fixed_dictionaries(
    {
        "growth_tokens": st.none() | st.integers(min_value=-200, max_value=1500),
        "cached_ratio": st.none() | st.sampled_from([0.0, 0.5, 0.95, 1.0]),
        "completion_tokens": st.none() | st.integers(min_value=0, max_value=400),
        "decode_seconds": st.none() | st.sampled_from([0.5, 2.0]),
    }
)
