"""Event handlers of ``scheduler.step``: arrival, completion, cancellation, timers and the tick,
plus the decision sequences they end with (targets and observations are in ``topology``).  See
``scheduler`` for the decision sequences and docs/program-scheduling.md for the behaviour and the
deviations from the reference.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from actors.core import program as lc
from actors.core.binding import bind
from actors.core.costs import cache_miss_impact_seconds
from actors.core.effects import (
    CacheDiscontinuity,
    CacheMissImpactObserved,
    CompletionIgnored,
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
    reject,
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
    Dispatch,
    PendingRequest,
    Program,
    ProgramIdentity,
    RankState,
    RequestHints,
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
    if rank is not None:
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
        s.effects.append(reject(req.request_id, QUEUE_TIMEOUT))
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
    """A request with Program identity arrived (docs/program-scheduling.md §1, §3, §5).

    The steps, in order: sync the pool's targets if the shell sent them; validate; find the live
    generation or create one; sample the request interval of an idle Program; retain the request;
    refresh the Program's metadata and context estimate (a new generation is bound to its home
    rank); dispatch it at once when the Program is active, else queue the Program; the arrival
    sequence; finally freeze the workload-derived force-resume deadline.
    """
    pool = ev.model_pool
    if ev.targets is not None:
        sync_targets(s, pool, ev.targets)
    rid = ev.request_id
    if s.pool.get(rid) is not None or rid in s.in_flight:
        raise InvalidEvent(f"request_id {rid!r} is already live")
    if not s.pools.get(pool):
        s.effects.append(reject(rid, NO_TARGETS))
        return
    est = int(ev.estimated_prompt_tokens)
    if est < 0:
        raise InvalidEvent(f"estimated_prompt_tokens must be >= 0 (got {est})")
    key = ProgramKey(pool, ev.identity.program_id)
    p = s.programs.get(key)
    existed = p is not None
    if p is None:
        p = create_generation(s, key, est)
    else:
        sample_request_interval(s, p)
    retain_request(s, p, ev, est)
    refresh_program(s, p, ev, est, existed)
    touch(s, p)
    if not place_arrival(s, p, rid, ev.hints):
        return
    if s.cfg.binding_only:
        if p.state != ACTIVE and p.last_target is not None:
            commit_admission(s, p, s.ranks[p.last_target], None)
        return
    arrival_sequence(s)
    freeze_force_resume_deadline(s, p)


def create_generation(s: SchedulerState, key: ProgramKey, est: int) -> Program:
    """A new generation of ``key`` (one more than the last remembered one), Paused/Reasoning."""
    now = s.now
    gen = s.last_generations.get(key, -1) + 1
    p = Program(ref=ProgramRef(key.model_pool, key.program_id, gen), created_at=now)
    s.programs[key] = p
    s.last_generations[key] = gen
    s.released_at.pop(key, None)
    p.paused_at = now
    p.shared_prefix_freshness_anchor_at = now
    p.estimated_context_tokens = est
    s.effects.append(SpawnProgram(program=p.ref))
    return p


def sample_request_interval(s: SchedulerState, p: Program) -> None:
    """Completion -> this arrival of an idle Program: one continuity sample per idle period (B9)."""
    if (
        p.in_flight == 0
        and p.last_request_finished_at is not None
        and p.last_target is not None
        and p.continuity_sampled_at != p.last_request_finished_at
    ):
        interval = max(0.0, s.now - p.last_request_finished_at)
        rank = s.ranks.get(p.last_target)
        if rank is not None and math.isfinite(interval):
            rank.factors.push_continuity(interval, p.last_cache_miss_impact_seconds)
            s.warm_factors.push_continuity(interval, p.last_cache_miss_impact_seconds)
            p.continuity_sampled_at = p.last_request_finished_at
            s.effects.append(RequestIntervalObserved(target_id=rank.target_id, seconds=interval))


def retain_request(s: SchedulerState, p: Program, ev: RequestSubmitted, est: int) -> None:
    """The request joins its Program's FIFO; an acting Program stops its acting period.

    Its queue deadline is ``arrival + min(queue_timeout_seconds, deadline_seconds)`` (D1).
    """
    now = s.now
    from_state = p.lifecycle
    lc.apply(p, lc.ARRIVE)
    if from_state == lc.ACTIVE_ACTING:
        p.acting_since = p.ttl_deadline = None
    p.expected_resume = bool(ev.identity.expected_resume)
    hints = ev.hints
    timeout = s.cfg.queue_timeout_seconds
    if hints.deadline_seconds is not None:
        timeout = min(timeout, hints.deadline_seconds)
    s.pool.retain(
        PendingRequest(
            request_id=ev.request_id,
            ref=p.ref,
            seq=s.request_seq.next(),
            arrived_at=now,
            estimated_context_tokens=est,
            hints=hints,
            routing_text=ev.routing_text,
            queue_deadline=now + timeout,
        )
    )


def refresh_program(s: SchedulerState, p: Program, ev: RequestSubmitted, est: int, existed: bool) -> None:
    """Lineage, identity metadata, output allowance and context estimate; binds a new generation."""
    ident = ev.identity
    s.lineage.observe(ev.model_pool, ident.program_id, ident.parent_program_id, ident.root_program_id)
    _refresh_metadata(p, ident, existed)
    p.output_token_reservation = ev.hints.expected_output_length
    if existed:
        if est >= p.estimated_context_tokens:
            p.estimated_context_tokens = est
            p.context_shrink_observations = 0
    else:
        bound = bind(s, p, ev.routing_text)
        p.home_target = p.last_target = bound


def place_arrival(s: SchedulerState, p: Program, rid: RequestId, hints: RequestHints) -> bool:
    """Dispatch the request of an active Program at once, or queue its paused Program.

    Returns False when the request was rejected because its Program has no rank (B2).  A deadline
    hint on this request sets the force-resume deadline now (it may be due at once); so does
    binding_only.
    """
    if p.state == ACTIVE:
        assert p.placement is not None
        resync(p, s.ranks.get(p.placement), s.cfg.decode_buffer_tokens)
        mark_dirty(s, p.placement)
        dispatch_ready(s, p)
        return True
    if p.last_target is None:  # B2 fix: never leave a retained request behind
        s.effects.append(reject(rid, NO_TARGETS))
        cancel_waiting(s, rid)
        return False
    enqueue(s, p)
    if hints.deadline_seconds is not None or s.cfg.binding_only:
        set_force_resume_deadline(s, p)
    return True


def freeze_force_resume_deadline(s: SchedulerState, p: Program) -> None:
    """Set the workload-derived force-resume deadline of a Program still waiting after the pass.

    It is frozen once the arrival's admission pass is over (a hint deadline, which can be due at
    once, was set before it): Programs admitted in this very pass no longer count as "ahead", and
    an admitted Program needs none.  A deadline that is already due triggers one more pass.
    """
    if live_program(s, p.ref) is None or p.state != PAUSED or p.status != REASONING or not s.pool.program_len(p.ref):
        return
    set_force_resume_deadline(s, p)
    if p.state == PAUSED and p.force_resume_deadline is not None and p.force_resume_deadline <= s.now:
        schedule_waiting(s)


def _refresh_metadata(p: Program, ident: ProgramIdentity, existed: bool) -> None:
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
    """Remove a waiting request (docs/program-scheduling.md §1), then run an admission pass."""
    cancel_waiting(s, rid)
    schedule_after_change(s)


def on_abandon(s: SchedulerState, ev: RequestAbandoned) -> None:
    if s.pool.get(ev.request_id) is not None:
        cancel_request(s, ev.request_id)
    elif ev.request_id in s.in_flight:
        on_complete(s, RequestCompleted(ev.request_id, False))


# ---- completion -------------------------------------------------------------------------------------

TERMINATE = "terminate"
KEEP_FOR_TTL = "ttl"


class ObservedUsage(NamedTuple):
    """What one completion tells about its Program's context (``observe_usage``)."""

    prompt_tokens: int  # reported prompt tokens, else the dispatch's estimate
    cached_tokens: int  # reported cached tokens, else the rank's mean (a cost estimate only)
    reported_cached_tokens: int  # reported cached tokens, else 0 (the only shared-prefix evidence)
    cache_miss_impact_seconds: float  # recomputing the prompt beyond the shared prefix


def on_complete(s: SchedulerState, ev: RequestCompleted) -> None:
    """A dispatched request finished (docs/program-scheduling.md §1, §2.2, §4).

    The steps, in order: fence the dispatch; observe usage and cache; count the completion and
    choose what the Program does if it became idle; on success update the segment and the shared
    prefix, then record the statistics sample; update the context estimate; arm the acting TTL;
    re-charge the ledger; apply the idle action (pause or release, after the statistics: B7);
    segment yield; a TTL of 0 pauses now; then the periodic decision sequence.
    """
    found = fenced_dispatch(s, ev)
    if found is None:
        return
    d, p = found
    rank = s.ranks[d.target_id]
    usage = observe_usage(s, p, d, rank, ev.usage)
    # shared-prefix freshness is evaluated now, before this completion changes the state
    freshness = shared_prefix_freshness(s, rank) if d.placement_start_request else 0.0
    action = count_completion(s, p, ev)
    if ev.success:
        continuous = update_segment(s, p, d, rank, ev.usage, usage, freshness)
        record_request_sample(s, p, d, rank, ev, usage, continuous)
    _observe_context(p, ev.usage.prompt_tokens, d.estimated_context_tokens)
    p.output_token_reservation = None
    if action == KEEP_FOR_TTL:
        arm_acting_ttl(s, p, rank, usage.cache_miss_impact_seconds, d.hints.kv_retention_ttl_seconds)
    resync(p, rank, s.cfg.decode_buffer_tokens)
    mark_dirty(s, rank.target_id)
    touch(s, p)
    apply_idle_action(s, p, action)
    if not s.cfg.binding_only and live_program(s, d.ref) is not None:
        yield_completed_segment(s, p)
    if action == KEEP_FOR_TTL and p.ttl_deadline is not None and p.ttl_deadline <= s.now:
        expire_acting_ttl(s, p)  # a TTL of 0 holds nothing: the Program pauses now, no timer
    periodic_sequence(s)


def fenced_dispatch(s: SchedulerState, ev: RequestCompleted) -> tuple[Dispatch, Program] | None:
    """The dispatch and live Program the completion belongs to, or None (``CompletionIgnored``).

    The dispatch is consumed either way.  A completion of an older generation, or of a placement
    that was invalidated since (the placement epoch changed), changes nothing.
    """
    d = s.in_flight.pop(ev.request_id, None)
    if d is None:
        s.effects.append(CompletionIgnored(request_id=ev.request_id, reason="unknown_request"))
        return None
    p = live_program(s, d.ref)
    if p is None:
        s.effects.append(CompletionIgnored(request_id=ev.request_id, reason="stale_generation"))
        return None
    if p.placement != d.target_id or p.placement_epoch != d.placement_epoch or p.in_flight <= 0:
        s.effects.append(CompletionIgnored(request_id=ev.request_id, reason="stale_placement"))
        return None
    return d, p


def observe_usage(s: SchedulerState, p: Program, d: Dispatch, rank: RankState, usage: Usage) -> ObservedUsage:
    """Prompt and cached tokens of the completion (reported, else estimated) and its miss cost."""
    prompt = usage.prompt_tokens if usage.prompt_tokens is not None else d.estimated_context_tokens
    if usage.cached_prompt_tokens is not None:
        cached = reported = min(usage.cached_prompt_tokens, prompt)
    else:  # the rank average is a cost estimate only, never shared-prefix evidence
        fac = rank.factors
        cached = min(round(fac.mean_cached_prompt_tokens()) if len(fac.requests) else 0, prompt)
        reported = 0
    impact = cache_miss_impact_seconds(prompt - min(p.shared_prefix_tokens, prompt), s.cfg.prefill_cost_model)
    return ObservedUsage(
        prompt_tokens=prompt,
        cached_tokens=cached,
        reported_cached_tokens=reported,
        cache_miss_impact_seconds=impact,
    )


def count_completion(s: SchedulerState, p: Program, ev: RequestCompleted) -> str | None:
    """One request fewer in flight; returns what the Program does if it is now idle, else None.

    Idle actions, first match: ``terminate`` (the shell asked for it), ``capacity_repair`` (repair
    marked it), ``request_failed``, else keep the capacity for the acting TTL (``ttl``).
    """
    p.in_flight -= 1
    waiting = s.pool.program_len(p.ref)
    idle = p.in_flight == 0 and waiting == 0
    lc.apply(p, lc.COMPLETE_IDLE if idle else lc.COMPLETE_BUSY)
    if p.in_flight == 0 and waiting > 0:
        p.pause_when_idle = False
    p.terminate_when_idle = p.terminate_when_idle or ev.terminate
    if not idle:
        return None
    if p.terminate_when_idle:
        return TERMINATE
    if p.pause_when_idle:
        return CAPACITY_REPAIR
    if not ev.success:
        return REQUEST_FAILED
    return KEEP_FOR_TTL


def update_segment(
    s: SchedulerState,
    p: Program,
    d: Dispatch,
    rank: RankState,
    reported: Usage,
    usage: ObservedUsage,
    freshness: float,
) -> bool:
    """Segment and shared prefix after a successful completion; returns whether the cache held.

    The cache held (the round is *continuous*) when at least ``CACHE_CONTINUITY_HIT_RATIO`` of
    the previous context was cached.  The first request of a placement whose cache did not hold
    starts a new segment and, once the previous measurement is stale, measures the shared prefix
    (docs/program-scheduling.md §2.2).  A break inside one placement is reported
    (``CacheDiscontinuity``).  The resume hit window learns from every placement start.
    """
    now = s.now
    prev_ctx = p.last_context_tokens
    if d.placement_start_request and prev_ctx and reported.cached_prompt_tokens is not None:
        s.resume_hits.push(usage.reported_cached_tokens, prev_ctx)
    continuous = prev_ctx is None or usage.cached_tokens >= CACHE_CONTINUITY_HIT_RATIO * prev_ctx
    if d.placement_start_request and (prev_ctx is None or not continuous):
        p.segment_served_rounds = 0
        p.ttl_pause_sampled_segment_rounds = 0
        p.segment_started_at = d.dispatched_at
        due = not p.shared_prefix_observed or p.shared_prefix_fresh_until is None or now >= p.shared_prefix_fresh_until
        if due:
            p.shared_prefix_tokens = usage.reported_cached_tokens
            p.shared_prefix_observed = True
            p.shared_prefix_fresh_until = p.shared_prefix_freshness_anchor_at + freshness
            if reported.cached_prompt_tokens is not None:
                s.effects.append(SharedPrefixObserved(target_id=rank.target_id, tokens=usage.reported_cached_tokens))
    if (
        reported.cached_prompt_tokens is not None
        and prev_ctx is not None
        and not d.placement_start_request
        and not continuous
    ):
        s.effects.append(
            CacheDiscontinuity(
                program=p.ref,
                target_id=rank.target_id,
                prompt_tokens=usage.prompt_tokens,
                cached_prompt_tokens=usage.cached_tokens,
                previous_context_tokens=prev_ctx,
                uncached_prompt_tokens=usage.prompt_tokens - usage.cached_tokens,
                cache_miss_impact_seconds=usage.cache_miss_impact_seconds,
                segment_served_rounds=p.segment_served_rounds,
            )
        )
    return continuous


def record_request_sample(
    s: SchedulerState,
    p: Program,
    d: Dispatch,
    rank: RankState,
    ev: RequestCompleted,
    usage: ObservedUsage,
    continuous: bool,
) -> None:
    """Round counters of the Program, and one statistics sample in the rank's request window.

    Only a continuous round counts towards ``rounds_since_activation`` / ``_since_ttl_pause``.
    The context growth is sampled only when it is plausible (0 < growth < previous context).
    """
    now = s.now
    prev_ctx = p.last_context_tokens
    growth = usage.prompt_tokens - prev_ctx if prev_ctx is not None and prev_ctx > 0 else None
    if growth is not None and prev_ctx is not None and not 0 < growth < prev_ctx:
        growth = None
    completion = ev.usage.completion_tokens or 0
    p.completed_requests += 1
    p.segment_served_rounds += 1
    p.rounds_since_activation += int(continuous)
    p.rounds_since_ttl_pause += int(continuous)
    p.last_context_tokens = usage.prompt_tokens
    p.last_completion_tokens = completion
    p.lifetime_generated_tokens += completion
    p.last_request_finished_at = now
    p.last_cache_miss_impact_seconds = usage.cache_miss_impact_seconds
    s.effects.append(CacheMissImpactObserved(target_id=rank.target_id, seconds=usage.cache_miss_impact_seconds))
    rank.factors.push_request(
        RequestSample(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=completion,
            cached_prompt_tokens=usage.cached_tokens,
            context_growth_tokens=growth,
            e2e_seconds=now - d.arrived_at,
            decode_seconds=ev.decode_seconds,
            queue_seconds=d.dispatched_at - d.arrived_at,
            rounds_since_ttl_pause=p.rounds_since_ttl_pause,
            finished_at=now,
        )
    )


def arm_acting_ttl(s: SchedulerState, p: Program, rank: RankState, impact: float, hint_ttl: float | None) -> None:
    """The idle Program keeps its capacity for the acting TTL: the request's hint, else the fit.

    The fit prices a cache miss at this request's impact times the measured resume miss ratio
    (docs/program-scheduling.md §4); it uses the continuity window as it was before this
    completion (completions add request samples, not continuity samples).
    """
    if hint_ttl is not None:
        ttl, source = hint_ttl, "request_hint"
    else:
        fit = acting_ttl_factors(rank.factors, s.warm_factors)
        ttl = fit.fitted_acting_ttl(impact * s.resume_hits.miss_ratio(), s.cfg.max_acting_ttl_seconds)
        source = "fitted"
    p.acting_since = s.now
    p.ttl_deadline = s.now + ttl
    s.effects.append(TtlArmed(program=p.ref, target_id=rank.target_id, ttl_seconds=ttl, source=source))


def apply_idle_action(s: SchedulerState, p: Program, action: str | None) -> None:
    """Pause a Program that repair marked or whose request failed; release a terminated one."""
    if action is not None and action in (CAPACITY_REPAIR, REQUEST_FAILED):
        pause(s, p, action)  # B7 fix: after the statistics
    elif action == TERMINATE:
        release(s, p, "program_release")


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
    if not fac.request_window_complete or cap is None:
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
