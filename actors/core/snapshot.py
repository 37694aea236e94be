"""Diagnostics snapshot of the scheduler (periphery spec 6), as a plain JSON-ready dict.

``snapshot(state, cfg, now)`` is pure and never mutates the state; the shell calls it on
demand (``GET /scheduling/diagnostics``) or after steps to publish gauges.  Program ids are
redacted; ranks are sorted by target id and Programs by redacted id.
"""

from __future__ import annotations

from typing import Any

from actors.core.ids import redacted_id
from actors.core.ledger import (
    FRESHNESS_INTERVALS,
    capacity_accounting_source,
    observation_fresh,
    private_tokens,
    target_usage,
)
from actors.core.model import ACTING, ACTIVE, PAUSED, REASONING, Program, RankState
from actors.core.stats import peek_acting_ttl


def _opt_round(x: float | None) -> int | None:
    return None if x is None else round(x)


def _rolling(state: Any, rank: RankState, cfg: Any) -> dict[str, Any]:
    f = rank.factors
    return {
        "request_samples": len(f.requests),
        "continuity_samples": len(f.continuities),
        "ttl_pause_samples": len(f.ttl_pause_rounds),
        "request_window_complete": f.request_window_complete,
        "continuity_window_complete": f.continuity_window_complete,
        "avg_prompt_tokens": f.mean_prompt_tokens(),
        "avg_completion_tokens": f.mean_completion_tokens(),
        "avg_cached_prompt_tokens": f.mean_cached_prompt_tokens(),
        "avg_cached_prompt_ratio": f.cached_prompt_ratio(),
        "avg_context_growth_tokens": f.mean_context_growth_tokens(),
        "avg_e2e_seconds": f.mean_e2e_seconds(),
        "avg_decode_seconds": f.mean_decode_seconds(),
        "avg_router_queue_seconds": f.mean_queue_seconds(),
        "avg_rounds_since_ttl_pause": f.mean_rounds_since_ttl_pause(),
        "request_throughput_per_second": f.request_throughput_per_second(),
        "fitted_acting_ttl_seconds": peek_acting_ttl(
            f, state.warm_factors, state.resume_hits.miss_ratio(), cfg.max_acting_ttl_seconds
        ),
        "acting_ttl_fit_window": "rank" if f.continuity_window_complete else "cluster",
    }


def program_view(state: Any, p: Program, cfg: Any, now: float) -> dict[str, Any]:
    front = state.pool.front(p.ref)
    h = front.hints if front is not None else None
    buf = cfg.decode_buffer_tokens
    fresh_left = p.shared_prefix_fresh_until - now if p.shared_prefix_fresh_until is not None else None
    return {
        "program": redacted_id(p.ref),
        "generation": p.ref.generation,
        "state": p.state,
        "status": p.status,
        "expected_resume": p.expected_resume,
        "task_id": p.task_id,
        "session_id": p.session_id,
        "agent_id": p.agent_id,
        "parent_program_id": p.parent_program_id,
        "root_program_id": state.lineage.root(p.ref.model_pool, p.ref.program_id),
        "blocks_parent": p.blocks_parent,
        "agent_role": p.agent_role,
        "spawn_reason": p.spawn_reason,
        "step_id": p.step_id,
        "request_id": h.request_id if h is not None else None,
        "request_priority": h.priority if h is not None else 0,
        "request_deadline_seconds": h.deadline_seconds if h is not None else None,
        "kv_retention_ttl_seconds": h.kv_retention_ttl_seconds if h is not None else None,
        "expected_output_tokens": (
            h.expected_output_length
            if h is not None and h.expected_output_length is not None
            else p.output_token_reservation
        ),
        "home_target": p.home_target,
        "last_target": p.last_target,
        "placement": p.placement,
        "estimated_context_tokens": p.estimated_context_tokens,
        "shared_prefix_tokens": p.shared_prefix_tokens,
        "shared_prefix_freshness_remaining_seconds": fresh_left,
        "logical_tokens": p.estimated_context_tokens + buf,
        "private_tokens": round(private_tokens(p, buf)),
        "in_flight_requests": p.in_flight,
        "waiting_requests": state.pool.program_len(p.ref),
        "segment_served_rounds": p.segment_served_rounds,
        "rounds_since_activation": p.rounds_since_activation,
        "rounds_since_ttl_pause": p.rounds_since_ttl_pause,
        "pause_when_idle": p.pause_when_idle,
        "pause_reason": p.last_pause_reason,
        "acting_seconds": now - p.acting_since if p.acting_since is not None else None,
        "queued_seconds": now - p.queued_at if p.queued_at is not None else None,
        "ttl_remaining_seconds": (
            max(0.0, p.ttl_deadline - now)
            if p.ttl_deadline is not None and p.state == ACTIVE and p.status == ACTING
            else None
        ),
        "force_resume_remaining_seconds": (
            max(0.0, p.force_resume_deadline - now) if p.force_resume_deadline is not None else None
        ),
        "force_resume_timeout_seconds": p.force_resume_timeout_seconds,
        "force_resume_active_remaining_rounds": p.force_resume_active_remaining_rounds,
        "force_resume_pool_remaining_rounds": p.force_resume_pool_remaining_rounds,
        "force_resume_request_throughput_per_second": p.force_resume_request_throughput_per_second,
        "force_resume_waiting_gate_blocked_at": p.force_gate_blocked_at,
    }


def rank_view(state: Any, rank: RankState, cfg: Any, now: float) -> dict[str, Any]:
    cap = cfg.token_capacity_per_dp_rank
    interval = cfg.metrics_interval_seconds
    used = round(max(0.0, target_usage(rank, now, interval)))
    scaled = round(rank.kv_cache_usage * cap) if rank.kv_cache_usage is not None and cap is not None else None
    programs = [p for p in state.programs.values() if p.last_target == rank.target_id]
    active = [p for p in programs if p.state == ACTIVE and p.placement == rank.target_id]
    reasoning = [p for p in active if p.status == REASONING]
    acting = [p for p in active if p.status == ACTING]
    paused_r = [p for p in programs if p.state == PAUSED and p.status == REASONING]
    paused_a = [p for p in programs if p.state == PAUSED and p.status == ACTING]
    buf = cfg.decode_buffer_tokens
    return {
        "target_id": rank.target_id,
        "base_url": rank.worker_url,
        "dp_rank": rank.dp_rank,
        "configured_token_capacity": cap,
        "router_estimated_used_tokens": used,
        "router_estimated_headroom_tokens": max(0, cap - used) if cap is not None else None,
        "vllm_usage_scaled_tokens": scaled,
        "observed_active_reasoning_tokens": _opt_round(rank.estimated_active_reasoning_tokens),
        "observed_active_program_tokens": _opt_round(rank.estimated_active_program_tokens),
        "tracked_active_reasoning_requests": sum(p.in_flight for p in reasoning),
        "observed_router_active_reasoning_programs": rank.observed_router_active_reasoning_programs,
        "observed_router_active_reasoning_requests": rank.observed_router_active_reasoning_requests,
        "active_program_token_delta_since_observation": rank.delta_tokens,
        "future_pause_relief_tokens": round(sum(private_tokens(p, buf) for p in reasoning if p.pause_when_idle)),
        "active_acting_private_tokens": round(sum(private_tokens(p, buf) for p in acting)),
        "router_minus_vllm_used_tokens": used - scaled if scaled is not None else None,
        "router_active_programs": len(active),
        "router_active_reasoning_programs": len(reasoning),
        "router_active_acting_programs": len(acting),
        "router_paused_reasoning_programs": len(paused_r),
        "router_paused_acting_programs": len(paused_a),
        "router_in_flight_requests": sum(p.in_flight for p in active),
        "router_queued_programs": sum(1 for p in paused_r if state.pool.program_len(p.ref)),
        "router_queued_requests": sum(state.pool.program_len(p.ref) for p in paused_r),
        "vllm_kv_cache_usage": rank.kv_cache_usage,
        "vllm_running_requests": rank.running_requests,
        "vllm_waiting_requests": rank.waiting_requests,
        "observation_age_seconds": now - rank.observed_at if rank.observed_at is not None else None,
        "observation_fresh": observation_fresh(rank, now, interval),
        "capacity_accounting_source": capacity_accounting_source(rank, now, interval),
        "freshness_threshold_seconds": FRESHNESS_INTERVALS * interval,
        "rolling": _rolling(state, rank, cfg),
        "programs": sorted((program_view(state, p, cfg, now) for p in programs), key=lambda v: v["program"]),
    }


def snapshot(state: Any, cfg: Any, now: float) -> dict[str, Any]:
    """The ``/scheduling/diagnostics`` body (without the shell's ``token_estimation``)."""
    return {
        "enabled": True,
        "binding_only": cfg.binding_only,
        "global_queue": cfg.global_queue,
        "resume_order": cfg.resume_order,
        "cross_rank_headroom_ratio": cfg.cross_rank_headroom_ratio,
        "retained_requests": len(state.pool),
        "cluster_continuity_samples": len(state.warm_factors.continuities),
        "resume_samples": len(state.resume_hits.samples),
        "resume_cache_miss_ratio": state.resume_hits.miss_ratio(),
        "in_flight_requests": len(state.in_flight),
        "live_programs": len(state.programs),
        "forced_admissions": state.forced_admissions,
        "ranks": [rank_view(state, state.ranks[t], cfg, now) for t in sorted(state.ranks)],
    }
