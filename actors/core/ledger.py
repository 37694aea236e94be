"""Logical occupancy ("ledger"), backend observations and the admission plan (docs/program-scheduling.md §2, §3).

Private tokens of a Program (what it occupies on its rank)::

    private_tokens = max(0, estimated_context - shared_prefix)
                     + (out if given else output_token_reservation or decode_buffer_tokens)

Each rank keeps two incremental figures, both changed only through :func:`charge`:

* ``fallback_tokens`` = sum of ``charged_tokens`` over the Active Programs placed on it (the
  Router-ledger value; ``invariants.check`` recomputes it from scratch);
* ``delta_tokens`` = signed change since the last applied observation checkpoint.

``target_usage`` is ``max(0, estimated_active_program_tokens + delta)`` when the rank's
observation is fresh (``now - observed_at <= 3 * metrics_interval``) and carries a token
estimate, else ``fallback_tokens``.  Unlike the reference (bug B3), every change of an Active
Program's private tokens is charged, up and down, so ledger and delta are always exact.

``admission_plan`` runs the reference checks in order: preconditions, forced tier, waiting
gate (a forced resume goes through it: agentd's fix of the reference, docs/program-scheduling.md
§10), Program-count guard, token capacity at the low watermark,
growth reserve, batch-gain admission (bypasses only the reserve).
"""

from __future__ import annotations

import math

from attrs import frozen

from actors.core.config import ProgramSchedulingConfig
from actors.core.costs import cache_miss_impact_seconds
from actors.core.model import ACTING, ACTIVE, PAUSED, REASONING, ObservationCheckpoint, Program, RankState
from actors.core.stats import ProgressTtlFactors, continuous_growth_reserve, decode_throughput

BACKEND_OBSERVATION = "backend_observation"
MISSING_OBSERVATION = "router_ledger_missing_observation"
STALE_OBSERVATION = "router_ledger_stale_observation"
MISSING_TOKEN_ESTIMATE = "router_ledger_missing_token_estimate"
FRESHNESS_INTERVALS = 3.0


def private_tokens(p: Program, decode_buffer_tokens: int, out: int | None = None) -> float:
    ctx = p.estimated_context_tokens - p.shared_prefix_tokens
    if ctx < 0:
        ctx = 0
    if out is None:
        out = p.output_token_reservation if p.output_token_reservation is not None else decode_buffer_tokens
    return float(ctx + out)


def charge(rank: RankState, delta: float) -> None:
    """Add ``delta`` private tokens to the rank's ledger and to its observation delta."""
    rank.fallback_tokens += delta
    rank.delta_tokens += delta


def charge_batch(rank: RankState, delta: float, requests: int) -> None:
    """Add ``delta`` batch tokens (and ``requests`` running batch requests) to the rank (docs/batch.md §2).

    Batch tokens join the observation delta like Program tokens, so a fresh observation (which
    already sees the batch KV the engine holds) plus the delta stays exact; the stale-observation
    fallback adds them to the Programs' ledger.
    """
    rank.batch_tokens += delta
    rank.batch_requests += requests
    rank.delta_tokens += delta


def resync(p: Program, rank: RankState | None, decode_buffer_tokens: int) -> float:
    """Re-charge an Active Program after its private-token inputs changed; returns the change."""
    if rank is None or p.state != ACTIVE:
        return 0.0
    now_tokens = private_tokens(p, decode_buffer_tokens)
    diff = now_tokens - p.charged_tokens
    if diff:
        charge(rank, diff)
        p.charged_tokens = now_tokens
    return diff


def observation_fresh(rank: RankState, now: float, metrics_interval_seconds: float) -> bool:
    return rank.observed_at is not None and now - rank.observed_at <= FRESHNESS_INTERVALS * metrics_interval_seconds


def capacity_accounting_source(rank: RankState | None, now: float, metrics_interval_seconds: float) -> str:
    if rank is None or rank.observed_at is None:
        return MISSING_OBSERVATION
    if not observation_fresh(rank, now, metrics_interval_seconds):
        return STALE_OBSERVATION
    if rank.estimated_active_program_tokens is None:
        return MISSING_TOKEN_ESTIMATE
    return BACKEND_OBSERVATION


def target_usage(rank: RankState, now: float, metrics_interval_seconds: float) -> float:
    if rank.estimated_active_program_tokens is not None and observation_fresh(rank, now, metrics_interval_seconds):
        v = rank.estimated_active_program_tokens + rank.delta_tokens
        return v if v > 0 else 0.0
    return rank.fallback_tokens + rank.batch_tokens + rank.interactive_tokens


def fresh_waiting(rank: RankState, now: float, metrics_interval_seconds: float) -> int | None:
    """Backend waiting-request count from a fresh observation (None if stale or missing)."""
    if rank.waiting_requests is not None and observation_fresh(rank, now, metrics_interval_seconds):
        return rank.waiting_requests
    return None


def waiting_gate_shut(rank: RankState, now: float, cfg: ProgramSchedulingConfig) -> bool:
    """The waiting gate of Program admission (docs/program-scheduling.md §3): the rank's fresh
    observation shows at least ``admission_waiting_request_threshold`` requests waiting in the
    engine (0 turns the gate off).  agentd difference: once nothing agentd dispatched to the rank
    is in flight any more, the Program requests that completed there since that observation
    arrived are counted out of it (the scrape saw them queued; they ran and finished).  The
    reference holds the gate shut until the next scrape, so on an idle cluster a request arriving
    just after another one finished waited up to an interval, and ``x-agentd-max-queue-seconds: 0``
    refused it.  Under load something is always in flight and the gate is the reference's.  Batch
    dispatch and the queue ETA read the same gate."""
    threshold = cfg.admission_waiting_request_threshold
    if threshold <= 0:
        return False
    waiting = fresh_waiting(rank, now, cfg.metrics_interval_seconds)
    if waiting is None:
        return False
    if rank.completed_since_observation and drained(rank):
        waiting -= rank.completed_since_observation
    return waiting >= threshold


def drained(rank: RankState) -> bool:
    """Nothing agentd dispatched to the rank is in flight: no Program request (a stale placement's
    included: the engine still runs it), no batch or interactive request."""
    return not (rank.dispatched or rank.batch_requests or rank.interactive_requests)


def apply_observation(
    rank: RankState,
    checkpoint: ObservationCheckpoint,
    kv_cache_usage: float | None,
    running: int | None,
    waiting: int | None,
    observed_at: float,
    capacity: int | None,
) -> None:
    """Store a scrape result and rebase the delta on ``checkpoint`` (docs/program-scheduling.md §2)."""
    native = kv_cache_usage * capacity if kv_cache_usage is not None and capacity is not None else None
    if native is not None:
        if running is not None and running > 0:
            est_reasoning = native * max(checkpoint.active_reasoning_programs, running) / running
        elif checkpoint.active_reasoning_programs > 0:
            est_reasoning = checkpoint.active_reasoning_private_tokens
        else:
            est_reasoning = native
        rank.estimated_active_reasoning_tokens = est_reasoning
        rank.estimated_active_program_tokens = est_reasoning + checkpoint.active_acting_private_tokens
    else:
        rank.estimated_active_reasoning_tokens = None
        rank.estimated_active_program_tokens = None
    rank.delta_tokens -= checkpoint.ledger_checkpoint
    rank.kv_cache_usage = kv_cache_usage
    rank.running_requests = running
    rank.waiting_requests = waiting
    rank.completed_since_observation = 0
    rank.observed_router_active_reasoning_programs = checkpoint.active_reasoning_programs
    rank.observed_router_active_reasoning_requests = checkpoint.active_reasoning_requests
    rank.observed_at = observed_at


@frozen(slots=False)  # transient, built per admission check: cheaper dict-backed init
class Plan:
    used_tokens: float
    required_tokens: float
    reserve_tokens: float
    capacity_tokens: int | None
    forced: bool
    batch_gain: bool


@frozen
class BatchGain:
    gain_seconds: float
    candidate_recovery_seconds: float
    continuity_loss_seconds: float
    admits: bool


def _plan(
    used: float,
    required: float,
    reserve: float,
    capacity: int | None,
    *,
    forced: bool = False,
    batch_gain: bool = False,
) -> Plan:
    return Plan(
        used_tokens=used,
        required_tokens=required,
        reserve_tokens=reserve,
        capacity_tokens=capacity,
        forced=forced,
        batch_gain=batch_gain,
    )


DISABLED_GAIN = BatchGain(gain_seconds=0.0, candidate_recovery_seconds=0.0, continuity_loss_seconds=0.0, admits=False)


def estimate_batch_gain(
    cfg: ProgramSchedulingConfig,
    factors: ProgressTtlFactors | None,
    candidate: Program,
    running_count: int,
    running_context_tokens: float,
    protected: list[tuple[int, float]],
    used: float,
    required: float,
    target_rounds: int,
) -> BatchGain:
    """Decode batch gain of admitting ``candidate`` vs recovery and continuity loss (docs/program-scheduling.md §3)."""
    capacity = cfg.token_capacity_per_dp_rank
    if capacity is None or not cfg.enable_batch_gain_admission or factors is None:
        return DISABLED_GAIN
    if not factors.request_window_complete or running_count == 0:
        return DISABLED_GAIN
    model = cfg.decode_throughput_model
    thr_before = decode_throughput(running_count, running_context_tokens, model)
    if thr_before <= 0:
        return DISABLED_GAIN
    thr_after = decode_throughput(running_count + 1, running_context_tokens + candidate.estimated_context_tokens, model)
    rel_gain = max(0.0, thr_after / thr_before - 1.0)
    avg_decode = factors.mean_decode_seconds()
    if avg_decode is None:
        avg_decode = running_count * factors.mean_completion_tokens() / thr_before
    if not math.isfinite(avg_decode) or avg_decode <= 0:
        return DISABLED_GAIN
    gain = avg_decode * rel_gain
    uncached = max(0, candidate.estimated_context_tokens - candidate.shared_prefix_tokens)
    recovery = cache_miss_impact_seconds(uncached, cfg.prefill_cost_model)
    loss = continuity_loss_seconds(
        factors.mean_context_growth_tokens(),
        protected,
        capacity * cfg.low_watermark_ratio,
        used,
        required,
        target_rounds,
    )
    return BatchGain(
        gain_seconds=gain,
        candidate_recovery_seconds=recovery,
        continuity_loss_seconds=loss,
        admits=gain >= recovery + loss,
    )


def continuity_loss_seconds(
    g: float,
    protected: list[tuple[int, float]],
    low_tokens: float,
    used: float,
    required: float,
    target_rounds: int,
) -> float:
    """Protected rounds lost by admitting, times the mean protected cache-miss cost (docs/program-scheduling.md §3)."""
    if g <= 0:
        return 0.0
    total = sum(r for r, _ in protected)
    free = max(0.0, low_tokens - used)
    before = min(total, free / g)
    after = min(total, max(0.0, free - required - g * target_rounds) / g)
    eps = 2.220446049250313e-16
    if before > 0 and after <= eps:
        return math.inf
    if not protected or after <= eps:
        return 0.0
    mean_cost = sum(c for _, c in protected) / len(protected)
    return (max(0.0, before - after) / after) * mean_cost


def admission_plan(
    p: Program,
    rank: RankState,
    now: float,
    cfg: ProgramSchedulingConfig,
    *,
    front_output: int | None,
    global_mode: bool,
) -> Plan | None:
    """The admission/resume plan of Program ``p`` on ``rank`` at ``now``, or None (docs/program-scheduling.md §3)."""
    if not global_mode and p.last_target != rank.target_id:
        return None
    if p.state != PAUSED or p.status != REASONING:
        return None
    forced = p.force_resume_deadline is not None and p.force_resume_deadline <= now
    interval = cfg.metrics_interval_seconds
    # agentd difference (D6 fix): a due force-resume deadline goes through the waiting gate,
    # so it is honoured within one tick whatever the engine queue shows
    # (docs/program-scheduling.md §3, §10)
    # a light tenant's Program on a rank kept for it (docs/priority.md §3) is not held either:
    # no heavy work can be admitted ahead of it there, so holding it only delays it
    if waiting_gate_shut(rank, now, cfg) and not forced and p.tenant not in rank.isolated_for:
        return None
    # lower classes leave the claims of waiting higher ones (docs/batch.md §2, docs/priority.md §2)
    used = target_usage(rank, now, interval) + rank.batch_claim_tokens + rank.interactive_claim_tokens
    active_count = len(rank.active)
    required = private_tokens(p, cfg.decode_buffer_tokens, front_output)
    count_fits = active_count + 1 <= cfg.max_active_programs_per_target
    capacity = cfg.token_capacity_per_dp_rank
    if capacity is None:
        if not forced and not count_fits:
            return None
        return _plan(used, required, 0.0, None, forced=forced)
    low = capacity * cfg.low_watermark_ratio
    immediate_fits = used + required <= low
    factors = rank.factors
    reserve = 0.0
    rounds = factors.target_rounds(cfg.max_segment_rounds)
    if rounds > 0:
        remaining = [max(0, rounds - a.rounds_since_activation) for a in rank.active.values()]
        reserve = continuous_growth_reserve(factors, rounds, remaining)
    reserve_fits = used + required + reserve <= low
    if forced or (count_fits and immediate_fits and reserve_fits):
        return _plan(used, required, reserve, capacity, forced=forced)
    if not rank.active and required + reserve > low:
        # agentd difference: a Program that can never fit runs alone on an idle rank (the engine
        # chunks and, if it must, preempts it) instead of waiting for its force-resume deadline;
        # with no active Program the reserve is its own growth, so one that can never pass the
        # reserve fit either is alike (docs/program-scheduling.md §10)
        return _plan(used, required, reserve, capacity)
    if not count_fits or not immediate_fits:
        return None
    running = [a for a in rank.active.values() if a.status == REASONING]
    ctx_before = float(sum(a.estimated_context_tokens for a in running))
    protected = []
    for a in rank.active.values():
        rem = max(0, rounds - a.rounds_since_activation)
        if rem > 0:
            protected.append((rem, a.last_cache_miss_impact_seconds))
    gain = estimate_batch_gain(cfg, factors, p, len(running), ctx_before, protected, used, required, rounds)
    if gain.admits:
        return _plan(used, required, reserve, capacity, batch_gain=True)
    return None


def rank_counts(rank: RankState) -> tuple[int, int, float, float]:
    """(active reasoning programs, their in-flight requests, their private tokens, acting private tokens)."""
    rp = rr = 0
    rt = at = 0.0
    for a in rank.active.values():
        if a.status == REASONING:
            rp += 1
            rr += a.in_flight
            rt += a.charged_tokens
        elif a.status == ACTING:
            at += a.charged_tokens
    return rp, rr, rt, at
