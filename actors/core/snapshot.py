"""A frozen snapshot of the scheduler, and the ``/scheduling/diagnostics`` document rendered from it.

``snapshot(state, cfg, now)`` reads the state once and returns a :class:`SchedulerSnapshot`: frozen
values only, so the shell can keep, publish or render it after the state has moved on.  It never
mutates the state.  :func:`diagnostics_document` renders a snapshot as the JSON-ready diagnostics
body (without the shell's additions: configuration, scheduler counters, backend scrape facts,
token estimation, channels); the ``/metrics`` gauges read the same :class:`RankSnapshot` values.

Program ids are redacted; ranks are sorted by target id and Programs by redacted id.  The
attribute names and order of :class:`ProgramSnapshot`, :class:`RollingSnapshot`,
:class:`RankSnapshot` and :class:`SchedulerSnapshot` are the document's keys and key order; the
attributes marked ``gauge_only`` are not rendered.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import field, frozen

from actors.core import fairness
from actors.core.attribution import TimeSplitSnapshot, time_split_snapshot
from actors.core.config import ProgramSchedulingConfig
from actors.core.ids import TargetId, redacted_id
from actors.core.interactive import reserved_ranks
from actors.core.ledger import (
    FRESHNESS_INTERVALS,
    capacity_accounting_source,
    observation_fresh,
    private_tokens,
    target_usage,
    waiting_gate_shut,
)
from actors.core.model import ACTING, ACTIVE, AGENT, BATCH, INTERACTIVE, PAUSED, REASONING, Program, RankState
from actors.core.state import SchedulerState
from actors.core.stats import ProgressTtlFactors, peek_acting_ttl
from actors.core.tool_retention import ToolSnapshot

GAUGE_ONLY = {"gauge_only": True}


@frozen
class ProgramSnapshot:
    """One live Program generation as the diagnostics show it."""

    program: str  # redacted id
    generation: int
    state: str
    status: str
    expected_resume: bool
    task_id: str | None
    session_id: str | None
    agent_id: str | None
    parent_program_id: str | None
    root_program_id: str
    blocks_parent: bool
    agent_role: str | None
    spawn_reason: str | None
    step_id: int
    request_id: str | None
    request_priority: int
    request_deadline_seconds: float | None
    kv_retention_ttl_seconds: float | None
    expected_output_tokens: int | None
    home_target: TargetId | None
    last_target: TargetId | None
    placement: TargetId | None
    estimated_context_tokens: int
    shared_prefix_tokens: int
    shared_prefix_freshness_remaining_seconds: float | None
    logical_tokens: int
    private_tokens: int
    in_flight_requests: int
    waiting_requests: int
    segment_served_rounds: int
    rounds_since_activation: int
    rounds_since_ttl_pause: int
    pause_when_idle: bool
    pause_reason: str | None
    acting_seconds: float | None
    queued_seconds: float | None
    ttl_remaining_seconds: float | None
    force_resume_remaining_seconds: float | None
    force_resume_timeout_seconds: float | None
    force_resume_active_remaining_rounds: float
    force_resume_pool_remaining_rounds: float
    force_resume_request_throughput_per_second: float
    force_resume_waiting_gate_blocked_at: float | None
    tenant: str = "default"
    priority: int = 0  # of its latest request (larger first)


@frozen
class RollingSnapshot:
    """The rolling statistics of one rank and the acting TTL they fit now."""

    request_samples: int
    continuity_samples: int
    ttl_pause_samples: int
    request_window_complete: bool
    continuity_window_complete: bool
    avg_prompt_tokens: float
    avg_completion_tokens: float
    avg_cached_prompt_tokens: float
    avg_cached_prompt_ratio: float
    avg_context_growth_tokens: float
    avg_e2e_seconds: float
    avg_decode_seconds: float | None
    avg_router_queue_seconds: float
    avg_rounds_since_ttl_pause: float
    request_throughput_per_second: float
    fitted_acting_ttl_seconds: float
    acting_ttl_fit_window: str  # "rank" | "cluster"


@frozen
class RankSnapshot:
    """One DP rank: ledger, backend observation, Program counts, statistics and its Programs."""

    target_id: TargetId
    base_url: str
    dp_rank: int | None
    configured_token_capacity: int | None
    router_estimated_used_tokens: int
    router_estimated_headroom_tokens: int | None
    vllm_usage_scaled_tokens: int | None
    observed_active_reasoning_tokens: int | None
    observed_active_program_tokens: int | None
    tracked_active_reasoning_requests: int
    observed_router_active_reasoning_programs: int
    observed_router_active_reasoning_requests: int
    active_program_token_delta_since_observation: float
    future_pause_relief_tokens: int
    active_acting_private_tokens: int
    router_minus_vllm_used_tokens: int | None
    router_active_programs: int
    router_active_reasoning_programs: int
    router_active_acting_programs: int
    router_paused_reasoning_programs: int
    router_paused_acting_programs: int
    router_in_flight_requests: int
    router_queued_programs: int
    router_queued_requests: int
    vllm_kv_cache_usage: float | None
    vllm_running_requests: int | None
    vllm_waiting_requests: int | None
    # Program requests completed here since that observation; the waiting gate counts them out of
    # vllm_waiting_requests once nothing dispatched here runs on (docs/program-scheduling.md §3)
    completed_since_observation: int
    waiting_gate_shut: bool  # ordinary Program admission held by the engine's queue (docs/program-scheduling.md §3)
    observation_age_seconds: float | None
    observation_fresh: bool
    capacity_accounting_source: str
    freshness_threshold_seconds: float
    rolling: RollingSnapshot
    programs: tuple[ProgramSnapshot, ...]  # empty when the snapshot was taken without Programs
    # gauges only (the diagnostics show the same facts under their own keys)
    queue_size: int = field(metadata=GAUGE_ONLY)  # paused Programs last on this rank with waiters
    active_programs: int = field(metadata=GAUGE_ONLY)  # Programs in the rank's ledger
    cache_miss_impact_rolling_mean_seconds: float = field(metadata=GAUGE_ONLY)

    @property
    def fitted_ttl_seconds(self) -> float:
        return self.rolling.fitted_acting_ttl_seconds

    @property
    def context_growth_tokens(self) -> float:
        return self.rolling.avg_context_growth_tokens

    @property
    def request_samples(self) -> int:
        return self.rolling.request_samples

    @property
    def continuity_samples(self) -> int:
        return self.rolling.continuity_samples


@frozen
class ClassSnapshot:
    """One request class (docs/priority.md §2): its band, queue, running work and caps."""

    request_class: str
    band: int  # position in class_order (0 = served first)
    waiting_requests: int
    running_requests: int  # for agent: Program requests in flight
    active_programs: int | None  # agent only
    charged_tokens: float  # on the ranks' ledgers
    oldest_wait_seconds: float | None
    max_running_per_rank: int | None
    max_kv_share: float


@frozen
class TenantSnapshot:
    """One tenant's fairness account (docs/priority.md §3)."""

    tenant: str
    weight: float
    counter: float  # virtual token counter, rent to now included
    waiting_requests: int
    dispatched_requests: int
    input_tokens: float
    output_tokens: float
    kv_token_seconds: float  # rent to now included
    held_kv_tokens: float  # held now by its idle Programs
    lifts: int


@frozen
class PrioritySnapshot:
    """Classes and tenants at one instant (the ``priority`` section of the diagnostics)."""

    class_order: tuple[str, ...]
    fairness: str
    classes: tuple[ClassSnapshot, ...]
    tenants: tuple[TenantSnapshot, ...]  # most waiting first, then counter, name; ``MAX_TENANTS_SHOWN`` at most
    tenants_total: int
    interactive_admitted: int
    interactive_rejected: int
    interactive_batch_preemptions: int
    interactive_program_pauses: int
    # ranks reserved for interactive now (``interactive_reserved_ranks``, docs/priority.md §2)
    interactive_reserved_ranks: tuple[str, ...] = ()


MAX_TENANTS_SHOWN = 100


@frozen
class SchedulerSnapshot:
    """The whole scheduler at one instant."""

    enabled: bool
    binding_only: bool
    global_queue: bool
    resume_order: str
    cross_rank_headroom_ratio: float
    retained_requests: int
    cluster_continuity_samples: int
    resume_samples: int
    resume_cache_miss_ratio: float
    in_flight_requests: int
    live_programs: int
    forced_admissions: int
    ranks: tuple[RankSnapshot, ...]
    priority: PrioritySnapshot | None = None  # None: taken for the gauges only
    # per (model pool, tool) gap windows and decisions (docs/program-scheduling.md §12)
    tools: tuple[ToolSnapshot, ...] = ()
    # where the Programs' time goes: totals and the longest live Programs (docs/program-scheduling.md §14)
    time_split: TimeSplitSnapshot | None = None


def snapshot(
    state: SchedulerState, cfg: ProgramSchedulingConfig, now: float, *, include_programs: bool = True
) -> SchedulerSnapshot:
    """The frozen snapshot of ``state`` at ``now`` (``include_programs=False``: ranks only, for gauges).

    One pass over the Programs groups them by their last rank, so the cost is linear in Programs
    plus ranks (it runs at every tick for the gauges)."""
    by_rank: dict[str, list[Program]] = {t: [] for t in state.ranks}
    for p in state.programs.values():
        if p.last_target is not None and p.last_target in by_rank:
            by_rank[p.last_target].append(p)
    return SchedulerSnapshot(
        enabled=True,
        binding_only=cfg.binding_only,
        global_queue=cfg.global_queue,
        resume_order=cfg.resume_order,
        cross_rank_headroom_ratio=cfg.cross_rank_headroom_ratio,
        retained_requests=len(state.pool),
        cluster_continuity_samples=len(state.warm_factors.continuities),
        resume_samples=len(state.resume_hits.samples),
        resume_cache_miss_ratio=state.resume_hits.miss_ratio(),
        in_flight_requests=len(state.in_flight),
        live_programs=len(state.programs),
        forced_admissions=state.forced_admissions,
        ranks=tuple(
            rank_snapshot(state, state.ranks[t], by_rank[t], cfg, now, include_programs) for t in sorted(state.ranks)
        ),
        priority=priority_snapshot(state, now) if include_programs else None,
        tools=state.tools.snapshot() if include_programs else (),
        time_split=(
            time_split_snapshot(state.times, (p.ref for p in state.programs.values()), now)
            if include_programs
            else None
        ),
    )


def diagnostics_document(snap: SchedulerSnapshot) -> dict[str, Any]:
    """The ``/scheduling/diagnostics`` body of ``snap``: fresh JSON-ready dicts and lists (the caller
    may extend them), keys in attribute order, gauge-only attributes left out."""
    doc = _document(snap)
    doc["ranks"] = [_rank_document(r) for r in snap.ranks]
    if snap.priority is None:
        doc.pop("priority", None)
    else:
        doc["priority"] = priority_document(snap.priority)
    doc["tools"] = [attrs.asdict(t) for t in snap.tools]
    if snap.time_split is None:
        doc.pop("time_split", None)
    else:
        doc["time_split"] = attrs.asdict(snap.time_split, recurse=True)
    return doc


def priority_document(p: PrioritySnapshot) -> dict[str, Any]:
    doc = attrs.asdict(p, recurse=True)
    doc["class_order"] = list(p.class_order)
    return doc


def priority_snapshot(state: SchedulerState, now: float) -> PrioritySnapshot:
    """Per-class and per-tenant facts (docs/priority.md §2, §3); linear in requests and Programs."""
    s = state
    prio = s.prio
    waits: dict[str, list[float]] = {INTERACTIVE: [], AGENT: [], BATCH: []}
    for ref in list(s.pool.refs()):
        waits[AGENT].extend(r.arrived_at for r in s.pool.requests(ref))
    waits[INTERACTIVE].extend(p.arrived_at for p in s.interactive.pending.values())
    if s.batch is not None:
        waits[BATCH].extend(p.arrived_at for p in s.batch.pending.values())
    running = {
        INTERACTIVE: len(s.interactive.running),
        AGENT: len(s.in_flight),
        BATCH: len(s.batch.running) if s.batch is not None else 0,
    }
    charged = {
        INTERACTIVE: sum(r.interactive_tokens for r in s.ranks.values()),
        AGENT: sum(r.fallback_tokens for r in s.ranks.values()),
        BATCH: sum(r.batch_tokens for r in s.ranks.values()),
    }
    classes = []
    for name in prio.class_order:
        limits = prio.limits(name)
        w = waits[name]
        classes.append(
            ClassSnapshot(
                request_class=name,
                band=prio.class_rank(name),
                waiting_requests=len(w),
                running_requests=running[name],
                active_programs=sum(len(r.active) for r in s.ranks.values()) if name == AGENT else None,
                charged_tokens=charged[name],
                oldest_wait_seconds=now - min(w) if w else None,
                max_running_per_rank=limits.max_running_per_rank,
                max_kv_share=limits.max_kv_share,
            )
        )
    tenants = [tenant_snapshot(s, name, now) for name in s.fair.accounts]
    tenants.sort(key=lambda t: (-t.waiting_requests, t.counter, t.tenant))
    st = s.interactive
    return PrioritySnapshot(
        class_order=prio.class_order,
        fairness=prio.fairness,
        classes=tuple(classes),
        tenants=tuple(tenants[:MAX_TENANTS_SHOWN]),
        tenants_total=len(tenants),
        interactive_admitted=st.admitted_count,
        interactive_rejected=st.rejected_count,
        interactive_batch_preemptions=st.batch_preemptions,
        interactive_program_pauses=st.program_pauses,
        interactive_reserved_ranks=tuple(sorted({str(t) for pool in st.reserved for t in reserved_ranks(s, pool)})),
    )


def tenant_snapshot(state: SchedulerState, name: str, now: float) -> TenantSnapshot:
    """One tenant's account at ``now`` (docs/priority.md §3); ``name`` must have an account."""
    a = state.fair.accounts[name]
    return TenantSnapshot(
        tenant=name,
        weight=state.prio.weight(name),
        counter=fairness.counter(state.fair, state.prio, name, now),
        waiting_requests=a.waiting,
        dispatched_requests=a.dispatched,
        input_tokens=a.input_tokens,
        output_tokens=a.output_tokens,
        kv_token_seconds=fairness.total_kv_token_seconds(a, now),
        held_kv_tokens=a.held_tokens,
        lifts=a.lifts,
    )


def _rank_document(rank: RankSnapshot) -> dict[str, Any]:
    doc = _document(rank)
    doc["rolling"] = _document(rank.rolling)
    doc["programs"] = [_document(p) for p in rank.programs]
    return doc


def _document(value: SchedulerSnapshot | RankSnapshot | RollingSnapshot | ProgramSnapshot) -> dict[str, Any]:
    """The rendered attributes of one snapshot value (nested values are rendered by the caller)."""
    return {a.name: getattr(value, a.name) for a in attrs.fields(type(value)) if not a.metadata.get("gauge_only")}


def _opt_round(x: float | None) -> int | None:
    return None if x is None else round(x)


def rolling_snapshot(state: SchedulerState, f: ProgressTtlFactors, cfg: ProgramSchedulingConfig) -> RollingSnapshot:
    return RollingSnapshot(
        request_samples=len(f.requests),
        continuity_samples=len(f.continuities),
        ttl_pause_samples=len(f.ttl_pause_rounds),
        request_window_complete=f.request_window_complete,
        continuity_window_complete=f.continuity_window_complete,
        avg_prompt_tokens=f.mean_prompt_tokens(),
        avg_completion_tokens=f.mean_completion_tokens(),
        avg_cached_prompt_tokens=f.mean_cached_prompt_tokens(),
        avg_cached_prompt_ratio=f.cached_prompt_ratio(),
        avg_context_growth_tokens=f.mean_context_growth_tokens(),
        avg_e2e_seconds=f.mean_e2e_seconds(),
        avg_decode_seconds=f.mean_decode_seconds(),
        avg_router_queue_seconds=f.mean_queue_seconds(),
        avg_rounds_since_ttl_pause=f.mean_rounds_since_ttl_pause(),
        request_throughput_per_second=f.request_throughput_per_second(),
        fitted_acting_ttl_seconds=peek_acting_ttl(
            f, state.warm_factors, state.resume_hits.miss_ratio(), cfg.max_acting_ttl_seconds
        ),
        acting_ttl_fit_window="rank" if f.continuity_window_complete else "cluster",
    )


def program_snapshot(state: SchedulerState, p: Program, cfg: ProgramSchedulingConfig, now: float) -> ProgramSnapshot:
    front = state.pool.front(p.ref)
    h = front.hints if front is not None else None
    buf = cfg.decode_buffer_tokens
    fresh_left = p.shared_prefix_fresh_until - now if p.shared_prefix_fresh_until is not None else None
    return ProgramSnapshot(
        program=redacted_id(p.ref),
        generation=p.ref.generation,
        state=p.state,
        status=p.status,
        expected_resume=p.expected_resume,
        task_id=p.task_id,
        session_id=p.session_id,
        agent_id=p.agent_id,
        parent_program_id=p.parent_program_id,
        root_program_id=state.lineage.root(p.ref.model_pool, p.ref.program_id),
        blocks_parent=p.blocks_parent,
        agent_role=p.agent_role,
        spawn_reason=p.spawn_reason,
        step_id=p.step_id,
        request_id=h.request_id if h is not None else None,
        request_priority=h.priority if h is not None else 0,
        request_deadline_seconds=h.deadline_seconds if h is not None else None,
        kv_retention_ttl_seconds=h.kv_retention_ttl_seconds if h is not None else None,
        expected_output_tokens=(
            h.expected_output_length
            if h is not None and h.expected_output_length is not None
            else p.output_token_reservation
        ),
        home_target=p.home_target,
        last_target=p.last_target,
        placement=p.placement,
        estimated_context_tokens=p.estimated_context_tokens,
        shared_prefix_tokens=p.shared_prefix_tokens,
        shared_prefix_freshness_remaining_seconds=fresh_left,
        logical_tokens=p.estimated_context_tokens + buf,
        private_tokens=round(private_tokens(p, buf)),
        in_flight_requests=p.in_flight,
        waiting_requests=state.pool.program_len(p.ref),
        segment_served_rounds=p.segment_served_rounds,
        rounds_since_activation=p.rounds_since_activation,
        rounds_since_ttl_pause=p.rounds_since_ttl_pause,
        pause_when_idle=p.pause_when_idle,
        pause_reason=p.last_pause_reason,
        acting_seconds=now - p.acting_since if p.acting_since is not None else None,
        queued_seconds=now - p.queued_at if p.queued_at is not None else None,
        ttl_remaining_seconds=(
            max(0.0, p.ttl_deadline - now)
            if p.ttl_deadline is not None and p.state == ACTIVE and p.status == ACTING
            else None
        ),
        force_resume_remaining_seconds=(
            max(0.0, p.force_resume_deadline - now) if p.force_resume_deadline is not None else None
        ),
        force_resume_timeout_seconds=p.force_resume_timeout_seconds,
        force_resume_active_remaining_rounds=p.force_resume_active_remaining_rounds,
        force_resume_pool_remaining_rounds=p.force_resume_pool_remaining_rounds,
        force_resume_request_throughput_per_second=p.force_resume_request_throughput_per_second,
        force_resume_waiting_gate_blocked_at=p.force_gate_blocked_at,
        tenant=p.tenant,
        priority=p.priority,
    )


def rank_snapshot(
    state: SchedulerState,
    rank: RankState,
    programs: list[Program],
    cfg: ProgramSchedulingConfig,
    now: float,
    include_programs: bool,
) -> RankSnapshot:
    """One rank's snapshot; ``programs`` are the live Programs whose last rank it is (state order)."""
    cap = cfg.token_capacity_per_dp_rank
    interval = cfg.metrics_interval_seconds
    used = round(max(0.0, target_usage(rank, now, interval)))
    scaled = round(rank.kv_cache_usage * cap) if rank.kv_cache_usage is not None and cap is not None else None
    active = [p for p in programs if p.state == ACTIVE and p.placement == rank.target_id]
    reasoning = [p for p in active if p.status == REASONING]
    acting = [p for p in active if p.status == ACTING]
    paused_r = [p for p in programs if p.state == PAUSED and p.status == REASONING]
    paused_a = [p for p in programs if p.state == PAUSED and p.status == ACTING]
    buf = cfg.decode_buffer_tokens
    f = rank.factors
    views = (
        tuple(sorted((program_snapshot(state, p, cfg, now) for p in programs), key=lambda v: v.program))
        if include_programs
        else ()
    )
    return RankSnapshot(
        target_id=rank.target_id,
        base_url=rank.worker_url,
        dp_rank=rank.dp_rank,
        configured_token_capacity=cap,
        router_estimated_used_tokens=used,
        router_estimated_headroom_tokens=max(0, cap - used) if cap is not None else None,
        vllm_usage_scaled_tokens=scaled,
        observed_active_reasoning_tokens=_opt_round(rank.estimated_active_reasoning_tokens),
        observed_active_program_tokens=_opt_round(rank.estimated_active_program_tokens),
        tracked_active_reasoning_requests=sum(p.in_flight for p in reasoning),
        observed_router_active_reasoning_programs=rank.observed_router_active_reasoning_programs,
        observed_router_active_reasoning_requests=rank.observed_router_active_reasoning_requests,
        active_program_token_delta_since_observation=rank.delta_tokens,
        future_pause_relief_tokens=round(sum(private_tokens(p, buf) for p in reasoning if p.pause_when_idle)),
        active_acting_private_tokens=round(sum(private_tokens(p, buf) for p in acting)),
        router_minus_vllm_used_tokens=used - scaled if scaled is not None else None,
        router_active_programs=len(active),
        router_active_reasoning_programs=len(reasoning),
        router_active_acting_programs=len(acting),
        router_paused_reasoning_programs=len(paused_r),
        router_paused_acting_programs=len(paused_a),
        router_in_flight_requests=sum(p.in_flight for p in active),
        router_queued_programs=sum(1 for p in paused_r if state.pool.program_len(p.ref)),
        router_queued_requests=sum(state.pool.program_len(p.ref) for p in paused_r),
        vllm_kv_cache_usage=rank.kv_cache_usage,
        vllm_running_requests=rank.running_requests,
        vllm_waiting_requests=rank.waiting_requests,
        completed_since_observation=rank.completed_since_observation,
        waiting_gate_shut=waiting_gate_shut(rank, now, cfg),
        observation_age_seconds=now - rank.observed_at if rank.observed_at is not None else None,
        observation_fresh=observation_fresh(rank, now, interval),
        capacity_accounting_source=capacity_accounting_source(rank, now, interval),
        freshness_threshold_seconds=FRESHNESS_INTERVALS * interval,
        rolling=rolling_snapshot(state, f, cfg),
        programs=views,
        queue_size=sum(1 for p in programs if p.state == PAUSED and state.pool.program_len(p.ref) > 0),
        active_programs=len(rank.active),
        cache_miss_impact_rolling_mean_seconds=f.mean_continuity_impact_seconds(),
    )
