"""Event handlers of ``scheduler.step``: arrival, completion, cancellation, timers and the tick,
plus the decision sequences they end with (targets and observations are in ``topology``).  See
``scheduler`` for the decision sequences and docs/program-scheduling.md for the behaviour and the
deviations from the reference.
"""

from __future__ import annotations

import math
from typing import Any

from actors.core import program as lc
from actors.core.binding import bind
from actors.core.costs import cache_miss_impact_seconds
from actors.core.effects import (
    CacheDiscontinuity,
    CacheMissImpactObserved,
    CompletionIgnored,
    Reject,
    RequestIntervalObserved,
    SharedPrefixObserved,
    SpawnProgram,
    TtlArmed,
)
from actors.core.errors import NO_TARGETS, QUEUE_TIMEOUT, InvalidEvent
from actors.core.events import (
    ACTING_TTL,
    FORCE_RESUME,
    PAUSED_RETENTION,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestSubmitted,
    TimerFired,
)
from actors.core.events import QUEUE_TIMEOUT as QUEUE_TIMEOUT_TIMER
from actors.core.ids import ProgramKey, ProgramRef, RequestId
from actors.core.ledger import resync
from actors.core.lifecycle import (
    cancel_waiting,
    commit_admission,
    dispatch_ready,
    enqueue,
    mark_dirty,
    pause,
    release,
    touch,
)
from actors.core.model import (
    ACTING,
    ACTIVE,
    CAPACITY_REPAIR,
    PAUSED,
    REASONING,
    REQUEST_FAILED,
    TTL_EXPIRED,
    PendingRequest,
    Program,
    RankState,
    Usage,
)
from actors.core.repair import repair_capacity
from actors.core.resume import (
    schedule_after_change,
    schedule_waiting,
    set_force_resume_deadline,
    yield_completed_segment,
)
from actors.core.state import SchedulerState, live_program
from actors.core.stats import CACHE_CONTINUITY_HIT_RATIO, RequestSample, acting_ttl_factors
from actors.core.topology import report_capacity_sources, sync_targets

SHRINK_CONFIRMATIONS = 2


# ---- decision sequences ------------------------------------------------------------------------


def arrival_sequence(s: SchedulerState) -> None:
    """After an arrival, a force-resume or a queue timeout: capacity repair, then admission."""
    repair_capacity(s)
    schedule_waiting(s)


def periodic_sequence(s: SchedulerState) -> None:
    """After a completion, an acting-TTL or retention timer and at every tick (not in binding_only)."""
    if not s.cfg.binding_only:
        repair_capacity(s)
        schedule_waiting(s)


# ---- deadlines (each acted on when its Program actor's timer fires) ------------------------------


def expire_acting_ttl(s: SchedulerState, p: Program) -> None:
    """The acting TTL of ``p`` is over: pause it (``ttl_expired``) and sample its served rounds."""
    if p.state != ACTIVE or p.status != ACTING or p.in_flight or p.ttl_deadline is None or p.ttl_deadline > s.now:
        return
    rounds = max(0, p.segment_served_rounds - p.ttl_pause_sampled_segment_rounds)
    pause(s, p, TTL_EXPIRED)
    p.ttl_pause_sampled_segment_rounds = p.segment_served_rounds
    p.rounds_since_ttl_pause = 0
    rank = s.ranks.get(p.last_target) if p.last_target is not None else None
    if rank is not None and rank.factors is not None:
        rank.factors.push_ttl_pause_rounds(rounds)


def release_retained(s: SchedulerState, p: Program) -> None:
    """``p`` stayed idle and paused for ``paused_retention_ttl_seconds``: release the generation."""
    if p.state != PAUSED or p.status != ACTING or p.in_flight or s.pool.program_len(p.ref):
        return
    if p.paused_at + s.cfg.paused_retention_ttl_seconds > s.now:
        return
    release(s, p, "paused_retention_release")


def reject_timed_out(s: SchedulerState, p: Program) -> None:
    """Reject (429) every waiting request of ``p`` whose queue deadline has passed, earliest first.

    Each rejection is a cancellation followed by an admission pass, which may dispatch the
    Program's other requests; those are then no longer waiting and are not rejected.
    """
    now = s.now
    due = sorted(
        (r for r in s.pool.requests(p.ref) if r.queue_deadline <= now), key=lambda r: (r.queue_deadline, r.seq)
    )
    for req in due:
        if s.pool.get(req.request_id) is not req:
            continue
        s.effects.append(Reject(req.request_id, QUEUE_TIMEOUT.reason, QUEUE_TIMEOUT.status_hint, QUEUE_TIMEOUT.message))
        cancel_request(s, req.request_id)


def prune_released_generations(s: SchedulerState) -> None:
    """Forget the generation history of Programs released at least ``max(retention, 60 s)`` ago.

    Not a Program deadline (the Program is gone, and so is its actor): the tick does it, taking
    entries from the front of ``released_at``, which is kept in release order.  This bounds the
    memory of generation numbers and lineage nodes (B14).
    """
    keep = max(s.cfg.paused_retention_ttl_seconds, 60.0)
    released = s.released_at
    while released:
        key, at = next(iter(released.items()))
        if at + keep > s.now:
            return
        del released[key]
        s.last_generations.pop(key, None)
        s.lineage.forget(key.model_pool, key.program_id)


# ---- arrival ---------------------------------------------------------------------------------------


def on_submit(s: SchedulerState, ev: RequestSubmitted) -> None:
    cfg, now = s.cfg, s.now
    pool = ev.model_pool
    if ev.targets is not None:
        sync_targets(s, pool, ev.targets)
    rid = ev.request_id
    if s.pool.get(rid) is not None or rid in s.in_flight:
        raise InvalidEvent(f"request_id {rid!r} is already live")
    if not s.pools.get(pool):
        s.effects.append(Reject(rid, NO_TARGETS.reason, NO_TARGETS.status_hint, NO_TARGETS.message))
        return
    ident = ev.identity
    hints = ev.hints
    p = s.programs.get((pool, ident.program_id))  # type: ignore[call-overload]
    est = int(ev.estimated_prompt_tokens)
    if est < 0:
        raise InvalidEvent(f"estimated_prompt_tokens must be >= 0 (got {est})")
    existed = p is not None
    if p is None:
        key = ProgramKey(pool, ident.program_id)
        gen = s.last_generations.get(key, -1) + 1
        p = Program(ProgramRef(pool, ident.program_id, gen), now)
        s.programs[key] = p
        s.last_generations[key] = gen
        s.released_at.pop(key, None)
        p.paused_at = now
        p.shared_prefix_freshness_anchor_at = now
        p.estimated_context_tokens = est
        s.effects.append(SpawnProgram(p.ref))
    # continuity sample (B9 fix: at most one per idle period)
    if (
        existed
        and p.in_flight == 0
        and p.last_request_finished_at is not None
        and p.last_target is not None
        and p.continuity_sampled_at != p.last_request_finished_at
    ):
        interval = max(0.0, now - p.last_request_finished_at)
        rank = s.ranks.get(p.last_target)
        if rank is not None and math.isfinite(interval):
            rank.factors.push_continuity(interval, p.last_cache_miss_impact_seconds)
            s.warm_factors.push_continuity(interval, p.last_cache_miss_impact_seconds)
            p.continuity_sampled_at = p.last_request_finished_at
            s.effects.append(RequestIntervalObserved(rank.target_id, interval))
    from_state = p.lifecycle
    lc.apply(p, lc.ARRIVE)
    if from_state == lc.ACTIVE_ACTING:
        p.acting_since = p.ttl_deadline = None
    p.expected_resume = bool(ident.expected_resume)
    deadline_hint = hints.deadline_seconds
    timeout = cfg.queue_timeout_seconds if deadline_hint is None else min(cfg.queue_timeout_seconds, deadline_hint)
    req = PendingRequest(rid, p.ref, s.request_seq.next(), now, est, hints, ev.routing_text, now + timeout)
    s.pool.retain(req)
    s.lineage.observe(pool, ident.program_id, ident.parent_program_id, ident.root_program_id)
    _refresh_metadata(p, ident, existed)
    p.output_token_reservation = hints.expected_output_length
    if existed:
        if est >= p.estimated_context_tokens:
            p.estimated_context_tokens = est
            p.context_shrink_observations = 0
    else:
        bound = bind(s, p, ev.routing_text)
        p.home_target = p.last_target = bound
    touch(s, p)
    if p.state == ACTIVE:
        resync(p, s.ranks.get(p.placement), cfg.decode_buffer_tokens)  # type: ignore[arg-type]
        mark_dirty(s, p.placement)
        dispatch_ready(s, p)
    else:
        if p.last_target is None:  # B2 fix: never leave a retained request behind
            s.effects.append(Reject(rid, NO_TARGETS.reason, NO_TARGETS.status_hint, NO_TARGETS.message))
            cancel_waiting(s, rid)
            return
        enqueue(s, p)
        if hints.deadline_seconds is not None or cfg.binding_only:
            set_force_resume_deadline(s, p)
    if cfg.binding_only:
        if p.state != ACTIVE and p.last_target is not None:
            commit_admission(s, p, s.ranks[p.last_target], None)
        return
    arrival_sequence(s)
    # The workload-derived force-resume deadline is frozen once the arrival's admission pass is
    # over (a hint deadline, which can be due at once, was set before it): Programs admitted
    # in this very pass no longer count as "ahead", and an admitted Program needs none.
    if p.ref[:2] in s.programs and p.state == PAUSED and p.status == REASONING and s.pool.program_len(p.ref):
        set_force_resume_deadline(s, p)
        if p.state == PAUSED and p.force_resume_deadline is not None and p.force_resume_deadline <= now:
            schedule_waiting(s)


def _refresh_metadata(p: Program, ident: Any, existed: bool) -> None:
    p.placement_key = ident.placement_key
    p.placement_hash_key = ident.placement_hash_key
    p.task_id = ident.task_id
    p.session_id = ident.session_id
    p.agent_id = ident.agent_id
    p.parent_program_id = ident.parent_program_id
    p.root_program_id = ident.root_program_id
    p.blocks_parent = bool(ident.blocks_parent)
    p.agent_role = ident.agent_role
    p.spawn_reason = ident.spawn_reason
    if ident.step_id is not None:
        p.step_id = int(ident.step_id)
    elif existed:
        p.step_id = min(p.step_id + 1, 2**64 - 1)
    else:
        p.step_id = 0


# ---- cancellation -------------------------------------------------------------------------------


def cancel_request(s: SchedulerState, rid: RequestId) -> None:
    """Remove a waiting request (core spec 4.4), then run an admission pass."""
    cancel_waiting(s, rid)
    schedule_after_change(s)


def on_abandon(s: SchedulerState, ev: RequestAbandoned) -> None:
    if s.pool.get(ev.request_id) is not None:
        cancel_request(s, ev.request_id)
    elif ev.request_id in s.in_flight:
        on_complete(s, RequestCompleted(ev.request_id, False))


# ---- completion -------------------------------------------------------------------------------------


def on_complete(s: SchedulerState, ev: RequestCompleted) -> None:
    cfg, now = s.cfg, s.now
    d = s.in_flight.pop(ev.request_id, None)
    if d is None:
        s.effects.append(CompletionIgnored(ev.request_id, "unknown_request"))
        return
    p = live_program(s, d.ref)
    if p is None:
        s.effects.append(CompletionIgnored(ev.request_id, "stale_generation"))
        return
    if p.placement != d.target_id or p.placement_epoch != d.placement_epoch or p.in_flight <= 0:
        s.effects.append(CompletionIgnored(ev.request_id, "stale_placement"))
        return
    rank = s.ranks[d.target_id]
    fac = rank.factors
    usage: Usage = ev.usage
    obs_prompt = usage.prompt_tokens if usage.prompt_tokens is not None else d.estimated_context_tokens
    if usage.cached_prompt_tokens is not None:
        cached = explicit_cached = min(usage.cached_prompt_tokens, obs_prompt)
    else:  # the rank average is a cost estimate only, never shared-prefix evidence
        cached = min(round(fac.mean_cached_prompt_tokens()) if len(fac.requests) else 0, obs_prompt)
        explicit_cached = 0
    impact = cache_miss_impact_seconds(obs_prompt - min(p.shared_prefix_tokens, obs_prompt), cfg.prefill_cost_model)
    hint_ttl = d.hints.kv_retention_ttl_seconds
    # shared-prefix freshness is evaluated now, before this completion changes the state
    freshness = shared_prefix_freshness(s, rank) if d.placement_start_request else 0.0
    p.in_flight -= 1
    waiting = s.pool.program_len(p.ref)
    idle = p.in_flight == 0 and waiting == 0
    lc.apply(p, lc.COMPLETE_IDLE if idle else lc.COMPLETE_BUSY)
    if p.in_flight == 0 and waiting > 0:
        p.pause_when_idle = False
    p.terminate_when_idle = p.terminate_when_idle or ev.terminate
    action = None
    if idle:
        if p.terminate_when_idle:
            action = "terminate"
        elif p.pause_when_idle:
            action = CAPACITY_REPAIR
        elif not ev.success:
            action = REQUEST_FAILED
        else:
            action = "ttl"
    prev_ctx = p.last_context_tokens
    if ev.success and d.placement_start_request and prev_ctx and usage.cached_prompt_tokens is not None:
        s.resume_hits.push(explicit_cached, prev_ctx)
    if ev.success:
        continuous = prev_ctx is None or cached >= CACHE_CONTINUITY_HIT_RATIO * prev_ctx
        new_segment = d.placement_start_request and (prev_ctx is None or not continuous)
        if new_segment:
            p.segment_served_rounds = 0
            p.ttl_pause_sampled_segment_rounds = 0
            p.segment_started_at = d.dispatched_at
            due = (
                not p.shared_prefix_observed
                or p.shared_prefix_fresh_until is None
                or now >= p.shared_prefix_fresh_until
            )
            if due:
                p.shared_prefix_tokens = explicit_cached
                p.shared_prefix_observed = True
                p.shared_prefix_fresh_until = p.shared_prefix_freshness_anchor_at + freshness
                if usage.cached_prompt_tokens is not None:
                    s.effects.append(SharedPrefixObserved(rank.target_id, explicit_cached))
        if (
            usage.cached_prompt_tokens is not None
            and prev_ctx is not None
            and not d.placement_start_request
            and not continuous
        ):
            s.effects.append(
                CacheDiscontinuity(
                    p.ref,
                    rank.target_id,
                    obs_prompt,
                    cached,
                    prev_ctx,
                    obs_prompt - cached,
                    impact,
                    p.segment_served_rounds,
                )
            )
        growth = obs_prompt - prev_ctx if prev_ctx is not None and prev_ctx > 0 else None
        if growth is not None and not 0 < growth < prev_ctx:  # type: ignore[operator]
            growth = None
        completion = usage.completion_tokens or 0
        p.completed_requests += 1
        p.segment_served_rounds += 1
        p.rounds_since_activation += int(continuous)
        p.rounds_since_ttl_pause += int(continuous)
        p.last_context_tokens = obs_prompt
        p.last_completion_tokens = completion
        p.lifetime_generated_tokens += completion
        p.last_request_finished_at = now
        p.last_cache_miss_impact_seconds = impact
        s.effects.append(CacheMissImpactObserved(rank.target_id, impact))
        fac.push_request(
            RequestSample(
                obs_prompt,
                completion,
                cached,
                growth,
                now - d.arrived_at,
                ev.decode_seconds,
                d.dispatched_at - d.arrived_at,
                p.rounds_since_ttl_pause,
                now,
            )
        )
    _observe_context(p, usage.prompt_tokens, d.estimated_context_tokens)
    p.output_token_reservation = None
    if action == "ttl":
        # the fitted TTL uses the continuity window as it was before this completion's samples
        ttl = (
            hint_ttl
            if hint_ttl is not None
            else acting_ttl_factors(fac, s.warm_factors).fitted_acting_ttl(
                impact * s.resume_hits.miss_ratio(), cfg.max_acting_ttl_seconds
            )
        )
        p.acting_since = now
        p.ttl_deadline = now + ttl
        s.effects.append(TtlArmed(p.ref, rank.target_id, ttl, "request_hint" if hint_ttl is not None else "fitted"))
    resync(p, rank, cfg.decode_buffer_tokens)
    mark_dirty(s, rank.target_id)
    touch(s, p)
    if action in (CAPACITY_REPAIR, REQUEST_FAILED):
        pause(s, p, action)  # B7 fix: after the statistics
    elif action == "terminate":
        release(s, p, "program_release")
    if not cfg.binding_only and live_program(s, d.ref) is not None:
        yield_completed_segment(s, p)
    if action == "ttl" and p.ttl_deadline is not None and p.ttl_deadline <= now:
        expire_acting_ttl(s, p)  # a TTL of 0 holds nothing: the Program pauses now, no timer
    periodic_sequence(s)


def _observe_context(p: Program, prompt_tokens: int | None, dispatch_est: int) -> None:
    if prompt_tokens is None:
        if dispatch_est > p.estimated_context_tokens:
            p.estimated_context_tokens = dispatch_est
            p.context_shrink_observations = 0
        return
    if prompt_tokens >= p.estimated_context_tokens:
        p.estimated_context_tokens = prompt_tokens
        p.context_shrink_observations = 0
        return
    p.context_shrink_observations += 1
    if p.context_shrink_observations >= SHRINK_CONFIRMATIONS:
        p.estimated_context_tokens = prompt_tokens
        p.context_shrink_observations = 0


def shared_prefix_freshness(s: SchedulerState, rank: RankState) -> float:
    cfg = s.cfg
    warm = cfg.shared_prefix_freshness_warmup_seconds
    fac = rank.factors
    cap = cfg.token_capacity_per_dp_rank
    if fac is None or not fac.request_window_complete or cap is None:
        return warm
    a = sum(1 for o in rank.active.values() if o.status == REASONING)
    u = fac.mean_uncached_prompt_tokens()
    e2e = fac.mean_e2e_seconds()
    if a == 0 or u <= 0 or e2e <= 0:
        return warm
    seconds = cfg.shared_prefix_freshness_kv_turnovers * cap * e2e / a / u
    return seconds if math.isfinite(seconds) and seconds >= 0 else warm


# ---- timers and ticks ----------------------------------------------------------------------------


def on_timer(s: SchedulerState, ev: TimerFired) -> None:
    """A Program actor's timer fired: act on that deadline, then run the kind's decision sequence.

    A firing whose token is not the armed one is dropped.  A valid firing consumes the timer;
    one delivered before its deadline acts on nothing, and the end-of-step timer sync re-arms it.
    """
    p = live_program(s, ev.program)
    if p is None or p.timers is None:
        return
    cur = p.timers.get(ev.kind)
    if cur is None or cur[1] != ev.token:
        return  # stale token: dropped
    del p.timers[ev.kind]
    touch(s, p)
    if ev.kind == ACTING_TTL:
        expire_acting_ttl(s, p)
        periodic_sequence(s)
    elif ev.kind == PAUSED_RETENTION:
        release_retained(s, p)
        periodic_sequence(s)
    elif ev.kind == QUEUE_TIMEOUT_TIMER:
        reject_timed_out(s, p)
        if not s.cfg.binding_only:
            arrival_sequence(s)
    elif ev.kind == FORCE_RESUME:
        if not s.cfg.binding_only:
            arrival_sequence(s)
    else:
        raise InvalidEvent(f"unknown timer kind {ev.kind!r}")


def on_tick(s: SchedulerState, ev: RepairTick) -> None:
    """The periodic tick: forget old generation histories, re-examine every rank, report sources."""
    prune_released_generations(s)
    for t in s.ranks:
        s.dirty_ranks[t] = None
    periodic_sequence(s)
    report_capacity_sources(s)
