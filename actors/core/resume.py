"""Admission/resume scheduling, force-resume deadlines and segment yield (docs/program-scheduling.md §3, §5, §7).

* :func:`schedule_waiting` serves the queues: rank-local mode walks every non-empty rank queue
  in target-id order (B11: the reference used hash-map order) and commits the first candidate,
  in ``resume_key`` order, whose plan on that rank succeeds, until none fits.  Global mode does,
  per model pool in name order, phase A (cache-affine resume on ``last_target``) and phase B
  (cross-rank escape, FCFS, for Programs that were paused at least once).
* :func:`set_force_resume_deadline` freezes the force-resume deadline of a queued Program:
  ``arrival + min(front deadline hint or the workload estimate, queue_timeout)`` where the
  estimate is ``clamp(3 * (active_remaining + pool_remaining) / throughput, min(30, F), F)``
  (F = force_resume_timeout) once the rank's request window is mature, else F.  Unlike the
  reference (B10) a later arrival can only move the deadline earlier.
* :func:`yield_completed_segment` pauses an idle Program that served ``max_segment_rounds``
  cache-continuous rounds when a waiter on its rank needs more than the relief already promised.
"""

from __future__ import annotations

from collections.abc import Iterable

from actors.core import fairness, fairness_isolation, fairness_requeue
from actors.core.cache_residency import move_cost_seconds
from actors.core.failover import allowed_targets, avoided_by_waiters
from actors.core.ids import ProgramRef, TargetId
from actors.core.interactive import dispatch_interactive
from actors.core.ledger import Plan, admission_plan, fresh_waiting, private_tokens, target_usage
from actors.core.lifecycle import commit_admission, is_waiting_candidate, mark_pause_when_idle, pause
from actors.core.model import (
    ACTING,
    ACTIVE,
    AGENT,
    INTERACTIVE,
    MAX_SEGMENT_YIELD,
    PRIORITY_PREEMPTION,
    REASONING,
    Program,
    RankState,
)
from actors.core.queue import resume_key
from actors.core.state import SchedulerState, live_program


def _front_output(s: SchedulerState, p: Program) -> int | None:
    front = s.pool.front(p.ref)
    return front.hints.expected_output_length if front is not None else None


def plan_for(s: SchedulerState, p: Program, rank: RankState) -> Plan | None:
    plan = admission_plan(p, rank, s.now, s.cfg, front_output=_front_output(s, p), global_mode=s.cfg.global_queue)
    if plan is None or not agent_caps_allow(s, rank, plan) or not tenant_share_allows(s, p, rank, plan):
        return None
    if not fairness_isolation.allows(s, p, rank, plan):
        return None
    return plan


def tenant_share_allows(s: SchedulerState, p: Program, rank: RankState, plan: Plan) -> bool:
    """Fair-share admission (docs/priority.md §3, "Pausing for fairness"): while another tenant has
    work (Programs active on ``rank`` or requests waiting), a tenant's Programs on the rank hold at
    most its weighted share of the rank's capacity.  A forced resume overrides it."""
    capacity = s.cfg.token_capacity_per_dp_rank
    if not s.prio.tenant_pause_share or s.prio.fairness == "off" or capacity is None or plan.forced:
        return True
    tenant = p.tenant
    held = 0.0
    tenants = {tenant}
    for a in rank.active.values():
        tenants.add(a.tenant)
        if a.tenant == tenant:
            held += a.charged_tokens
    for name, acc in s.fair.accounts.items():
        if acc.waiting > 0:
            tenants.add(name)
    if len(tenants) < 2:
        return True
    share = capacity * s.prio.weight(tenant) / sum(s.prio.weight(name) for name in tenants)
    return held + plan.required_tokens <= share


def agent_caps_allow(s: SchedulerState, rank: RankState, plan: Plan) -> bool:
    """The ``agent`` class caps (docs/priority.md §2): active Programs per rank and their share of
    the rank's capacity.  A forced resume overrides them, as it overrides the count guard."""
    limits = s.prio.agent
    if plan.forced:
        return True
    if limits.max_running_per_rank is not None and len(rank.active) + 1 > limits.max_running_per_rank:
        return False
    capacity = s.cfg.token_capacity_per_dp_rank
    if capacity is not None and limits.max_kv_share < 1.0 and rank.active:
        return rank.fallback_tokens + plan.required_tokens <= limits.max_kv_share * capacity
    return True


def ordered(s: SchedulerState, refs: Iterable[ProgramRef], *, cross_rank: bool = False) -> list[Program]:
    """The Paused/Reasoning/waiting Programs of a queue, in local (or cross-rank) resume order."""
    out = []
    for ref in refs:
        p = live_program(s, ref)
        if p is not None and is_waiting_candidate(s, p):
            out.append(p)
    if len(out) < 2:
        return out
    now, order = s.now, "fcfs" if cross_rank else s.cfg.resume_order
    counters: dict[str, float] = {}
    attained = s.attained if order == "las" else None

    def key(p: Program) -> tuple[object, ...]:
        front = s.pool.front(p.ref)
        c = 0.0
        if front is not None:
            c = counters.get(front.tenant, -1.0)
            if c < 0:
                c = counters[front.tenant] = fairness.counter(s.fair, s.prio, front.tenant, now)
        if attained is None:
            return resume_key(p, front, now, order, c)
        served = attained.of(p.ref.key)
        return resume_key(p, front, now, order, c, served)

    out.sort(key=key)
    return out


def schedule_waiting(s: SchedulerState) -> None:
    """The admission pass: the interactive class first when it is above ``agent`` in
    ``class_order`` (docs/priority.md §2), then the Programs' queues, then interactive otherwise."""
    first = s.prio.class_rank(INTERACTIVE) < s.prio.class_rank(AGENT)
    st = s.interactive
    if first and (st.pending or st.claimed):
        dispatch_interactive(s)
    if not s.cfg.binding_only:
        _schedule_programs(s)
    if not first and (st.pending or st.claimed):
        dispatch_interactive(s)


def _schedule_programs(s: SchedulerState) -> None:
    view: fairness_isolation.IsolationView = {}
    if fairness_isolation.enabled(s):  # docs/priority.md §3, "Isolating light tenants"
        s.isolation = view = fairness_isolation.compute(s)
        s.isolation_last = (s.now, view)
        if view:
            fairness_isolation.enforce(s, view)
    try:
        if s.cfg.global_queue:
            for pool in sorted(s.global_queues):
                _schedule_global(s, pool)
        else:
            for target in sorted(s.rank_queues):
                _schedule_rank(s, target)
    finally:
        s.isolation = None
    fairness_requeue.ask(s, view)  # docs/priority.md §3, "Re-queueing a blocking long prefill"


def schedule_after_change(s: SchedulerState) -> None:
    """Admission pass after a cancellation, an observation or a target change."""
    if not s.cfg.binding_only:
        schedule_waiting(s)


def _schedule_rank(s: SchedulerState, target: TargetId) -> None:
    rank = s.ranks.get(target)
    if rank is None:
        return
    while True:
        q = s.rank_queues.get(target)
        if not q:
            return
        waiters = ordered(s, list(q))
        for p in waiters:
            plan = plan_for(s, p, rank)
            if plan is not None:
                commit_admission(s, p, rank, plan)
                break
        else:
            if not waiters or not preempt_lower_programs(s, waiters[0], rank):
                return


def _schedule_global(s: SchedulerState, pool: str) -> None:
    while True:  # phase A: resume on the previous rank
        q = s.global_queues.get(pool)
        if not q:
            return
        waiters = ordered(s, list(q))
        for p in waiters:
            rank = s.ranks.get(p.last_target) if p.last_target is not None else None
            plan = plan_for(s, p, rank) if rank is not None else None
            if plan is not None and rank is not None:
                commit_admission(s, p, rank, plan)
                break
        else:
            head = waiters[0] if waiters else None
            home = s.ranks.get(head.last_target) if head is not None and head.last_target is not None else None
            if head is None or home is None or not preempt_lower_programs(s, head, home):
                break
    while True:  # phase B: cross-rank escape, FCFS
        q = s.global_queues.get(pool)
        if not q:
            return
        for p in ordered(s, [r for r in q if _has_pause_reason(s, r)], cross_rank=True):
            choice = select_cross_rank(s, p)
            if choice is not None:
                commit_admission(s, p, choice[0], choice[1])
                break
        else:
            return


def preempt_lower_programs(s: SchedulerState, p: Program, rank: RankState) -> bool:
    """Make room on ``rank`` for the first waiter ``p`` by pausing Programs of strictly lower
    priority (docs/priority.md §1), and with ``tenant_pause_share`` those of equal priority of
    tenants above their fair share of the rank (:func:`overserved_tenants`, docs/priority.md §3): idle (Acting)
    ones now, lowest priority first, then the most-served tenant, then the largest; busy ones are
    marked to pause when idle.  Acting
    Programs are paused only when that makes ``p`` admissible now; True when ``p`` can be
    admitted after the pauses (the caller's loop admits it)."""
    if s.cfg.token_capacity_per_dp_rank is None or p.last_target != rank.target_id and not s.cfg.global_queue:
        return False
    if s.interactive.pending and s.prio.class_rank(INTERACTIVE) < s.prio.class_rank(AGENT):
        return False  # room freed now belongs to the waiting interactive requests first
    front = s.pool.front(p.ref)
    prio = front.hints.priority if front is not None else 0
    now = s.now
    over = overserved_tenants(s, p, front.tenant if front is not None else p.tenant, rank)
    lower = [a for a in rank.active.values() if a.priority < prio or (a.tenant in over and a.priority == prio)]
    if not lower:
        return False

    def victim_key(a: Program) -> tuple[object, ...]:
        return (a.priority, -fairness.counter(s.fair, s.prio, a.tenant, now), -a.charged_tokens, a.ref.program_id)

    idle = sorted((a for a in lower if a.status == ACTING and a.in_flight == 0), key=victim_key)
    busy = sorted(
        (a for a in lower if a.status == REASONING and a.in_flight > 0 and not a.pause_when_idle), key=victim_key
    )
    capacity = s.cfg.token_capacity_per_dp_rank
    free = capacity * s.cfg.low_watermark_ratio - (
        target_usage(rank, now, s.cfg.metrics_interval_seconds)
        + rank.batch_claim_tokens
        + rank.interactive_claim_tokens
    )
    need = private_tokens(p, s.cfg.decode_buffer_tokens, _front_output(s, p))
    relief_now = sum(a.charged_tokens for a in idle)
    if idle and free + relief_now >= need:
        for a in idle:
            pause(s, a, PRIORITY_PREEMPTION)
            if plan_for(s, p, rank) is not None:
                return True
        return False
    room = free + sum(a.charged_tokens for a in rank.active.values() if a.pause_when_idle)
    for a in busy:
        if room >= need:
            break
        mark_pause_when_idle(s, a, PRIORITY_PREEMPTION)
        room += a.charged_tokens
    return False


def overserved_tenants(s: SchedulerState, p: Program, tenant: str, rank: RankState) -> set[str]:
    """The tenants whose idle (acting) Programs of the waiter's priority may be paused on ``rank``
    for the waiting Program ``p`` of ``tenant`` (docs/priority.md §3, "Pausing for fairness"):
    those holding more than their weighted fair share of the rank's capacity (shared among the
    tenants with Programs there and ``tenant``) and more, per weight, than ``tenant`` would hold
    with ``p`` admitted.  Empty when the rule is off (``tenant_pause_share = false``), with VTC off,
    or when no other tenant holds Programs on the rank (single-tenant decisions are unchanged)."""
    capacity = s.cfg.token_capacity_per_dp_rank
    if not s.prio.tenant_pause_share or s.prio.fairness == "off" or capacity is None:
        return set()
    held: dict[str, float] = {}
    for a in rank.active.values():
        held[a.tenant] = held.get(a.tenant, 0.0) + a.charged_tokens
    if not held or set(held) == {tenant}:
        return set()
    weights = {name: s.prio.weight(name) for name in held}
    weights[tenant] = s.prio.weight(tenant)
    unit = capacity / sum(weights.values())  # fair share per unit of weight
    mine = (held.get(tenant, 0.0) + private_tokens(p, s.cfg.decode_buffer_tokens, _front_output(s, p))) / weights[
        tenant
    ]
    return {
        name for name, h in held.items() if name != tenant and h / weights[name] > unit and h / weights[name] > mine
    }


def _has_pause_reason(s: SchedulerState, ref: ProgramRef) -> bool:
    p = s.programs.get(ref.key)
    return p is not None and p.last_pause_reason is not None


def move_destination_allows(
    s: SchedulerState, p: Program, source: RankState, dest: RankState, *, patient: bool, source_mature: bool
) -> bool:
    """The maturity and headroom conditions a cross-rank destination must meet before the
    admission check (docs/program-scheduling.md §7): one rule for the pass and the queue ETA's
    move term (§13).  A patient Program skips both; an idle destination waives the maturity gate."""
    if not (patient or (source_mature and dest.factors.request_window_complete)) and dest.active:
        return False
    capacity = s.cfg.token_capacity_per_dp_rank
    if capacity is None or patient:
        return True
    cfg, now, interval = s.cfg, s.now, s.cfg.metrics_interval_seconds
    low = capacity * cfg.low_watermark_ratio
    free_dest = max(0.0, low - target_usage(dest, now, interval))
    free_src = max(0.0, low - target_usage(source, now, interval))
    return free_dest >= free_src + cfg.cross_rank_headroom_ratio * p.estimated_context_tokens


def select_cross_rank(s: SchedulerState, p: Program) -> tuple[RankState, Plan] | None:
    """The destination of a cross-rank resume, or None (docs/program-scheduling.md §7)."""
    cfg, now = s.cfg, s.now
    source_id = p.last_target
    if p.last_pause_reason is None or source_id is None:
        return None
    source = s.ranks.get(source_id)
    pool = p.ref.model_pool
    waiters = ordered(s, list(s.global_queues.get(pool, {})))
    interval = cfg.metrics_interval_seconds
    if source is None:
        return None
    # agentd difference: the maturity gate (both request windows full) is waived for an idle
    # destination (no active Program): waiting behind a busy rank while another one idles costs
    # more than the recomputation a move implies (docs/program-scheduling.md §7, §10)
    source_mature = source.factors.request_window_complete
    if p.queued_at is None or now - p.queued_at < interval:
        return None
    threshold = cfg.admission_waiting_request_threshold
    if threshold == 0:
        pressure = True
    else:
        w = fresh_waiting(source, now, interval)
        pressure = w is not None and w >= threshold
        if not pressure:
            for other in waiters:
                if other is p:
                    break
                if other.last_target == source_id and other.queued_at is not None and now - other.queued_at >= interval:
                    pressure = True
                    break
    # agentd difference (ski rental): a Program that has waited for its source rank at least as
    # long as recomputing its private context elsewhere would take moves to any rank that can
    # admit it, without the headroom margin (the reference needs backend waiting requests, which
    # a rank that is full in the ledger but not in the batch never shows).  Waiting, then moving,
    # costs at most twice the better of the two choices (docs/program-scheduling.md §7, §10).
    # cross_rank_move_cost = "resident" prices the move at the part of the context the source
    # probably still caches (docs/program-scheduling.md §12.1); the default at all of it
    patient = now - p.queued_at >= max(interval, move_cost_seconds(s, p))
    if not (pressure or patient):
        return None
    capacity = cfg.token_capacity_per_dp_rank
    waiting_targets = {o.last_target for o in waiters if o is not p}
    # not to a worker a waiting request of it could not reach (a failover's exclusion, docs/program-scheduling.md §9.1)
    avoid = avoided_by_waiters(s, p)
    allowed = allowed_targets(s, pool, avoid) if avoid else None
    best: tuple[tuple[object, ...], RankState, Plan] | None = None
    for dest_id in s.pools.get(pool, ()):
        if dest_id == source_id or dest_id in waiting_targets or allowed is not None and dest_id not in allowed:
            continue
        dest = s.ranks[dest_id]
        if not move_destination_allows(s, p, source, dest, patient=patient, source_mature=source_mature):
            continue
        plan = admission_plan(p, dest, now, cfg, front_output=_front_output(s, p), global_mode=True)
        if plan is None or not agent_caps_allow(s, dest, plan) or not fairness_isolation.allows(s, p, dest, plan):
            continue
        if capacity is not None:
            pr = (plan.used_tokens + plan.required_tokens + plan.reserve_tokens) / max(1, capacity)
        else:
            pr = (len(dest.active) + 1) / max(1, cfg.max_active_programs_per_target)
        key = (fresh_waiting(dest, now, interval) or 0, pr, len(dest.active), dest_id)
        if best is None or key < best[0]:
            best = (key, dest, plan)
    return (best[1], best[2]) if best is not None else None


# ---- force-resume deadline -------------------------------------------------------------------


def _remaining_rounds(rank: RankState, rounds: int) -> int:
    total = 0
    for a in rank.active.values():
        floor = 1 if a.status == REASONING else 0
        total += max(floor, rounds - a.rounds_since_activation)
    return total


def force_resume_estimate(s: SchedulerState, p: Program) -> tuple[float, float, float, float]:
    """(timeout, active remaining rounds, pool remaining rounds, throughput) of the force-resume
    deadline (docs/program-scheduling.md §5)."""
    cfg = s.cfg
    f = cfg.force_resume_timeout_seconds
    lo = min(30.0, f)
    if cfg.global_queue:
        targets = s.pools.get(p.ref.model_pool, ())
        if not targets:
            return f, 0.0, 0.0, 0.0
        rounds_by: dict[str, int] = {}
        agg = 0.0
        active = 0
        for t in targets:
            fac = s.ranks[t].factors
            r = fac.target_rounds(cfg.max_segment_rounds)
            thr = fac.request_throughput_per_second()
            if r <= 0 or thr <= 0:
                return f, 0.0, 0.0, 0.0
            rounds_by[t] = r
            agg += thr
            active += _remaining_rounds(s.ranks[t], r)
        fallback = sum(rounds_by.values()) / len(rounds_by)
        pool_rem = 0.0
        for o in ordered(s, list(s.global_queues.get(p.ref.model_pool, {}))):
            if o is p:
                break
            pool_rem += max(1.0, rounds_by.get(o.last_target, fallback) if o.last_target else fallback)
        timeout = min(f, max(lo, 3.0 * (active + pool_rem) / agg))
        return timeout, float(active), pool_rem, agg
    rank = s.ranks.get(p.last_target) if p.last_target is not None else None
    if rank is None:
        return f, 0.0, 0.0, 0.0
    fac = rank.factors
    thr = fac.request_throughput_per_second()
    r = fac.target_rounds(cfg.max_segment_rounds)
    if thr <= 0 or r <= 0:
        return f, 0.0, 0.0, 0.0
    active = _remaining_rounds(rank, r)
    queue = [o for o in ordered(s, list(s.rank_queues.get(rank.target_id, {}))) if o.last_target == rank.target_id]
    ahead = next((i for i, o in enumerate(queue) if o is p), len(queue))
    pool_rem = float(ahead * max(1, r))
    timeout = min(f, max(lo, 3.0 * (active + pool_rem) / thr))
    return timeout, float(active), pool_rem, thr


def set_force_resume_deadline(s: SchedulerState, p: Program) -> None:
    cfg = s.cfg
    timeout, active, pool_rem, thr = force_resume_estimate(s, p)
    front = s.pool.front(p.ref)
    hint = front.hints.deadline_seconds if front is not None else None
    chosen = min(hint if hint is not None else timeout, cfg.queue_timeout_seconds)
    deadline = s.now + chosen
    if p.force_resume_deadline is not None and p.force_resume_deadline <= deadline:
        return  # B10 fix: a later arrival never postpones the force-resume deadline
    p.force_resume_deadline = deadline
    p.force_resume_timeout_seconds = chosen
    p.force_resume_active_remaining_rounds = active
    p.force_resume_pool_remaining_rounds = pool_rem
    p.force_resume_request_throughput_per_second = thr


# ---- segment yield ----------------------------------------------------------------------------


def yield_completed_segment(s: SchedulerState, p: Program) -> None:
    cfg = s.cfg
    if p.state != ACTIVE or p.status != ACTING or p.rounds_since_activation < cfg.max_segment_rounds:
        return
    target = p.placement
    if target is None:
        return
    if cfg.global_queue:
        refs = list(s.global_queues.get(p.ref.model_pool, {}))
        waiters = [o for o in ordered(s, refs) if o.last_target == target]
    else:
        waiters = ordered(s, list(s.rank_queues.get(target, {})))
    waiter = next((o for o in waiters if o is not p), None)
    if waiter is None:
        return
    rank = s.ranks[target]
    relief = sum(a.charged_tokens for a in rank.active.values() if a.status == REASONING and a.pause_when_idle)
    if private_tokens(waiter, cfg.decode_buffer_tokens) > relief:
        pause(s, p, MAX_SEGMENT_YIELD)
