"""Completion: a dispatched request ended (``RequestCompleted``).

``on_complete`` fences stale completions, observes the usage and the cache, counts the completion,
updates the segment and shared prefix, records the statistics sample, arms the acting TTL or
applies the idle action (pause, release), yields a long segment and runs the periodic sequence
(docs/program-scheduling.md §2, §4, §5).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import attrs

from actors.core import fairness, fairness_isolation, fairness_prefill
from actors.core import program as lc
from actors.core.batch_class import on_batch_complete
from actors.core.cache_residency import note_completion
from actors.core.costs import cache_miss_impact_seconds
from actors.core.effects import (
    CacheDiscontinuity,
    CacheMissImpactObserved,
    CompletionIgnored,
    SharedPrefixObserved,
    TtlArmed,
)
from actors.core.events import (
    RequestCompleted,
)
from actors.core.failover import give_back_unserved_move
from actors.core.interactive import on_interactive_complete
from actors.core.ledger import resync
from actors.core.lifecycle import (
    mark_dirty,
    pause,
    release,
    touch,
)
from actors.core.model import (
    CAPACITY_REPAIR,
    PRIORITY_PREEMPTION,
    REASONING,
    REQUEST_FAILED,
    TENANT_ISOLATION,
    Dispatch,
    Program,
    RankState,
    Usage,
)
from actors.core.resume import (
    yield_completed_segment,
)
from actors.core.sequences import expire_acting_ttl, periodic_sequence
from actors.core.state import SchedulerState, live_program
from actors.core.stats import CACHE_CONTINUITY_HIT_RATIO, RequestSample, acting_ttl_factors
from actors.core.timeline import on_completion
from actors.core.tool_retention import turn_keys

SHRINK_CONFIRMATIONS = 2


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
    if on_interactive_complete(s, ev):
        periodic_sequence(s)  # an interactive request (docs/priority.md §2): its capacity is free again
        return
    if on_batch_complete(s, ev):
        periodic_sequence(s)  # a batch request (docs/batch.md §2): its capacity is free for Programs
        return
    found = fenced_dispatch(s, ev)
    if found is None:
        return
    d, p = found
    ev = with_unreported_hits_as_zero(s.ranks[d.target_id], ev)
    s.attained.add(d.ref.key, s.now - d.dispatched_at)  # the las resume order (docs/program-scheduling.md §5.1)
    on_completion(s, p, d, ev)  # where the Program's time went (docs/program-scheduling.md §14)
    out = fairness.output_tokens(ev.usage.completion_tokens, d.reserved_output_tokens, ev.success)
    fairness.charge(s.fair, s.prio, d.tenant, output_tokens=out)  # docs/priority.md §3
    rank = s.ranks[d.target_id]
    rank.completed_since_observation += 1  # the waiting gate counts it (ledger.waiting_gate_shut)
    fairness_prefill.on_complete(rank, ev.request_id)
    usage = observe_usage(s, p, d, rank, ev.usage)
    # shared-prefix freshness is evaluated now, before this completion changes the state
    freshness = shared_prefix_freshness(s, rank) if d.placement_start_request else 0.0
    action = count_completion(s, p, ev)
    if ev.success:
        p.failover_from = None  # it ran on its rank: a failover's move stands (docs/program-scheduling.md §9.1)
        continuous = update_segment(s, p, d, rank, ev.usage, usage, freshness)
        record_request_sample(s, p, d, rank, ev, usage, continuous)
    _observe_context(p, ev.usage.prompt_tokens, d.estimated_context_tokens)
    p.output_token_reservation = None
    p.last_turn_keys = turn_keys(ev.tool_names, ev.finish_reason, s.cfg.tool_retention) if ev.success else ()
    fairness_isolation.observe_completion(s, p, d.target_id, ev.finish_reason, ev.success)  # docs/priority.md §3
    if action == KEEP_FOR_TTL:
        arm_acting_ttl(s, p, rank, usage.cache_miss_impact_seconds, d.hints.kv_retention_ttl_seconds)
    resync(p, rank, s.cfg.decode_buffer_tokens)
    mark_dirty(s, rank.target_id)
    touch(s, p)
    apply_idle_action(s, p, action)
    if not ev.success and p.failover_from is not None and live_program(s, d.ref) is not None:
        # the request a failover moved it for failed too (docs/program-scheduling.md §9.1)
        give_back_unserved_move(s, p)
    if not s.cfg.binding_only and live_program(s, d.ref) is not None:
        yield_completed_segment(s, p)
    if action == KEEP_FOR_TTL and p.ttl_deadline is not None and p.ttl_deadline <= s.now:
        expire_acting_ttl(s, p)  # a TTL of 0 holds nothing: the Program pauses now, no timer
    periodic_sequence(s)


def with_unreported_hits_as_zero(rank: RankState, ev: RequestCompleted) -> RequestCompleted:
    """The completion with ``cached_prompt_tokens`` 0 where its rank's worker reports cached tokens
    but this completion's usage has none: vLLM (with ``--enable-prompt-tokens-details``) leaves
    ``prompt_tokens_details`` out of a usage whose cached count is 0, so every full miss read as
    "not reported" and was estimated from the rank's mean hits (docs/program-scheduling.md §14).
    Until the rank's first report the usage stays as it came."""
    usage = ev.usage
    if usage.cached_prompt_tokens is not None:
        rank.reports_cached_tokens = True
        return ev
    if rank.reports_cached_tokens and usage.prompt_tokens is not None and ev.success:
        return attrs.evolve(ev, usage=attrs.evolve(usage, cached_prompt_tokens=0))
    return ev


def fenced_dispatch(s: SchedulerState, ev: RequestCompleted) -> tuple[Dispatch, Program] | None:
    """The dispatch and live Program the completion belongs to, or None (``CompletionIgnored``).

    The dispatch is consumed either way.  A completion of an older generation, or of a placement
    that was invalidated since (the placement epoch changed), changes nothing.
    """
    d = s.in_flight.pop(ev.request_id, None)
    if d is None:
        s.effects.append(CompletionIgnored(request_id=ev.request_id, reason="unknown_request"))
        return None
    left = s.ranks.get(d.target_id)
    if left is not None and left.dispatched > 0:
        left.dispatched -= 1
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

    Idle actions, first match: ``terminate`` (the shell asked for it, or the latest request said
    ``expected_resume: false``: docs/program-scheduling.md §1), ``capacity_repair`` (repair marked
    it), ``request_failed``, else keep the capacity for the acting TTL (``ttl``).
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
    if p.terminate_when_idle or not p.expected_resume:
        return TERMINATE
    if p.pause_when_idle:
        return p.pause_when_idle_reason
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
        # what the gap cost (docs/program-scheduling.md §12, "Diagnostics")
        lost = max(0, prev_ctx - usage.reported_cached_tokens)
        lost_s = cache_miss_impact_seconds(lost, s.cfg.prefill_cost_model) if lost else 0.0
        s.tools.observe_resume(p.ref.model_pool, p.last_turn_keys, lost, lost_s, prev_ctx)
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
    note_completion(s, p, rank, usage.prompt_tokens, usage.cached_tokens, completion)
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
    """The idle Program keeps its capacity for the acting TTL: the request's hint, else the
    per-tool decision on its last turn's keys (docs/program-scheduling.md §12), else the fit.

    Both price a cache miss at this request's impact times the measured resume miss ratio
    (docs/program-scheduling.md §4); the fit uses the continuity window as it was before this
    completion (completions add request samples, not continuity samples).
    """
    tool: str | None = None
    cost = impact * s.resume_hits.miss_ratio()
    decision = None
    p.tool_ttl_armed = None
    if hint_ttl is None:
        rent = tool_rent(s, p.ref.model_pool)
        max_ttl = s.cfg.max_acting_ttl_seconds
        decision = s.tools.decide(p.ref.model_pool, p.last_turn_keys, cost, max_ttl, rent, impact)
    if hint_ttl is not None:
        ttl, source = hint_ttl, "request_hint"
    elif decision is not None:
        ttl, source, tool = decision.ttl_seconds, decision.source, decision.key
        fitted = acting_ttl_factors(rank.factors, s.warm_factors).fitted_acting_ttl(cost, s.cfg.max_acting_ttl_seconds)
        if ttl > 0 and s.cfg.tool_retention.contention == "cap_at_fit" and pool_waiting(s, p.ref.model_pool):
            # requests wait for capacity: the tool may release sooner than the fit, never hold longer
            # (docs/program-scheduling.md §12)
            ttl = min(ttl, fitted)
        s.tools.note_armed(p.ref.model_pool, decision.key, ttl, fitted)
        p.tool_ttl_armed = (decision.key, ttl, fitted)
    else:
        fit = acting_ttl_factors(rank.factors, s.warm_factors)
        ttl = fit.fitted_acting_ttl(cost, s.cfg.max_acting_ttl_seconds)
        source = "fitted"
    p.acting_since = s.now
    p.ttl_deadline = s.now + ttl
    s.effects.append(TtlArmed(program=p.ref, target_id=rank.target_id, ttl_seconds=ttl, source=source, tool=tool))


def tool_rent(s: SchedulerState, pool: str) -> float:
    """What one second of holding costs a per-tool TTL (docs/program-scheduling.md §12): 1 (the
    holder's own second), plus, with ``contention = "rent"``, one second for each Program of the
    pool waiting for capacity per rank of the pool (each of them is delayed while it is held)."""
    if s.cfg.tool_retention.contention != "rent":
        return 1.0
    ranks = s.pools.get(pool, ())
    waiting = len(s.global_queues.get(pool, ()))
    rank_queues = s.rank_queues
    if rank_queues:  # (emptied queues are deleted: usually nothing to visit, per completion)
        waiting += sum(len(rank_queues.get(t, ())) for t in ranks)
    return 1.0 + waiting / max(1, len(ranks))


def pool_waiting(s: SchedulerState, pool: str) -> bool:
    """Whether a Program of model pool ``pool`` is queued for capacity (global queue or a rank queue)."""
    if s.global_queues.get(pool):
        return True
    rank_queues = s.rank_queues
    return bool(rank_queues) and any(rank_queues.get(t) for t in s.pools.get(pool, ()))


def apply_idle_action(s: SchedulerState, p: Program, action: str | None) -> None:
    """Pause a Program that repair marked or whose request failed; release a terminated one."""
    if action is not None and action in (CAPACITY_REPAIR, PRIORITY_PREEMPTION, TENANT_ISOLATION, REQUEST_FAILED):
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
