"""Lifecycle operations shared by the scheduler, resume and repair (docs/program-scheduling.md §1).

Every state change of a Program goes through ``program.apply`` (the transition table) and
every ledger change through ``ledger.charge``; these helpers add the side effects the
reference attaches to each transition and append the resulting effects to ``s.effects``.
They read ``s.cfg`` and ``s.now``, which ``scheduler.step`` sets for the duration of a step.
"""

from __future__ import annotations

from typing import TypeVar

from actors.core import fairness, fairness_prefill
from actors.core import program as lc
from actors.core.effects import (
    AdmissionCapacitySnapshot,
    Admit,
    QueueEtaObserved,
    Reject,
    RetireProgram,
    Transition,
)
from actors.core.errors import Rejection
from actors.core.failover import give_back_unserved_move
from actors.core.fairness_sync import settle_program
from actors.core.ids import ProgramRef, RequestId, TargetId
from actors.core.ledger import Plan, charge, private_tokens
from actors.core.model import (
    ACTIVE,
    GLOBAL_QUEUE,
    MAX_PREFILL_REQUEUES,
    PAUSED,
    RANK_QUEUE,
    REASONING,
    REQUEST_CANCELLED,
    Dispatch,
    Program,
    RankState,
)
from actors.core.state import SchedulerState, live_program
from actors.core.timeline import on_lost_placement, on_release

K = TypeVar("K", bound=str)


def reject(rid: RequestId, why: Rejection, retry_after_seconds: float | None = None) -> Reject:
    """The ``Reject`` effect refusing the retained request ``rid`` for reason ``why``."""
    return Reject(
        request_id=rid,
        reason=why.reason,
        status_hint=why.status_hint,
        message=why.message,
        retry_after_seconds=retry_after_seconds,
    )


def touch(s: SchedulerState, p: Program) -> None:
    s.touched.setdefault(p.ref, p)


def mark_dirty(s: SchedulerState, target: TargetId | None) -> None:
    if target is not None:
        s.dirty_ranks[target] = None


def restart_freshness_anchor(p: Program, now: float) -> None:
    if p.shared_prefix_fresh_until is not None:
        p.shared_prefix_fresh_until = now + (p.shared_prefix_fresh_until - p.shared_prefix_freshness_anchor_at)
    p.shared_prefix_freshness_anchor_at = now


def enqueue(s: SchedulerState, p: Program) -> None:
    """Put a Paused/Reasoning Program into its global or rank queue (once)."""
    if p.queued_in is not None:
        return
    if s.cfg.global_queue:
        where = (GLOBAL_QUEUE, p.ref.model_pool)
        q = s.global_queues.setdefault(p.ref.model_pool, {})
    else:
        assert p.last_target is not None
        where = (RANK_QUEUE, p.last_target)
        q = s.rank_queues.setdefault(p.last_target, {})
    q[p.ref] = None
    p.queued_in = where
    if p.queued_at is None:  # B8: a queued Program always has a queued_at
        p.queued_at = s.now


def dequeue(s: SchedulerState, p: Program) -> None:
    where = p.queued_in
    if where is None:
        return
    kind, name = where
    if kind == GLOBAL_QUEUE:
        _leave(s.global_queues, name, p.ref)
    else:
        _leave(s.rank_queues, TargetId(name), p.ref)
    p.queued_in = None


def _leave(table: dict[K, dict[ProgramRef, None]], name: K, ref: ProgramRef) -> None:
    """Remove ``ref`` from queue ``table[name]``; an emptied queue is deleted."""
    q = table.get(name)
    if q is not None:
        q.pop(ref, None)
        if not q:
            del table[name]


def reserved_output(p: Program, expected: int | None, decode_buffer_tokens: int) -> int:
    """The output tokens a Program request is expected to produce: what its completion is charged
    when it reports no usage (docs/priority.md §3)."""
    if expected is not None:
        return expected
    return p.output_token_reservation if p.output_token_reservation is not None else decode_buffer_tokens


def charge_dispatch(s: SchedulerState, p: Program, tenant: str, context_tokens: int) -> float:
    """The tenant pays for the prompt tokens the engine computes (the output at completion).

    Computed prompt tokens are estimated: beyond the previous context on the same placement (its
    KV is there), else beyond the shared prefix (docs/priority.md §3)."""
    if p.placement_start_pending or p.last_context_tokens is None:
        cached = p.shared_prefix_tokens
    else:
        cached = p.last_context_tokens
    computed = context_tokens - cached if context_tokens > cached else 0
    fairness.leave(s.fair, s.prio, tenant, s.now, dispatched=True)
    fairness.charge(s.fair, s.prio, tenant, input_tokens=computed)  # output: at completion
    return computed


def dispatch_ready(s: SchedulerState, p: Program, *, forced: bool = False) -> None:
    """Claim every waiting request of an Active Program, FIFO front first (docs/program-scheduling.md §1).

    ``forced``: the Program was just admitted by a forced resume; its first request is never
    re-queued (docs/priority.md §3, "Re-queueing a blocking long prefill")."""
    rank = s.ranks[p.placement] if p.placement is not None else None
    while p.state == ACTIVE and rank is not None:
        req = s.pool.take_front(p.ref)
        if req is None:
            return
        lc.apply(p, lc.DISPATCH)
        out = reserved_output(p, req.hints.expected_output_length, s.cfg.decode_buffer_tokens)
        fairness_prefill.on_dispatch(s, p, rank, req.request_id, req.estimated_context_tokens)
        computed = charge_dispatch(s, p, req.tenant, req.estimated_context_tokens)
        start = p.placement_start_pending
        p.placement_start_pending = False
        p.in_flight += 1
        d = Dispatch(
            request_id=req.request_id,
            ref=p.ref,
            target_id=rank.target_id,
            placement_epoch=p.placement_epoch,
            arrived_at=req.arrived_at,
            dispatched_at=s.now,
            estimated_context_tokens=req.estimated_context_tokens,
            placement_start_request=start,
            hints=req.hints,
            tenant=req.tenant,
            reserved_output_tokens=out,
            queue_seq=req.seq,
            routing_text=req.routing_text,
            input_charge=computed,
            forced=forced,
            requeues=req.requeues,
        )
        forced = False  # only the request the forced resume was for
        s.in_flight[req.request_id] = d
        rank.dispatched += 1
        marker = rank.long_prefill
        wait = max(0.0, s.now - req.arrived_at)
        s.effects.append(
            Admit(
                request_id=req.request_id,
                target_id=rank.target_id,
                program=p.ref,
                generation=p.ref.generation,
                placement_epoch=p.placement_epoch,
                placement_start_request=start,
                queue_wait_seconds=wait,
                estimated_context_tokens=p.estimated_context_tokens,
                requeueable=(
                    s.prio.requeue_long_prefills
                    and not d.forced
                    and d.requeues < MAX_PREFILL_REQUEUES
                    and marker is not None
                    and marker[0] == req.request_id
                ),
            )
        )
        if s.eta.first:
            told = s.eta.admitted(req.request_id, s.now)
            if told is not None:
                first, actual, err = told
                s.effects.append(
                    QueueEtaObserved(
                        target_id=rank.target_id, eta_seconds=first.eta_seconds, wait_seconds=actual, relative_error=err
                    )
                )
        s.binder.commit_placement(req.routing_text, rank.target_id)
        mark_dirty(s, rank.target_id)
        touch(s, p)


def commit_admission(
    s: SchedulerState, p: Program, rank: RankState, plan: Plan | None, *, reason: str | None = None
) -> None:
    """Paused/Reasoning -> Active/Reasoning on ``rank`` (docs/program-scheduling.md §3), then dispatch.

    ``reason`` overrides the Transition's reason (an admission without a plan: a passed request
    whose pass was revoked, ``pass_race_admit``, docs/program-scheduling.md §15)."""
    cfg = s.cfg
    front = s.pool.front(p.ref)
    # B4 fix: the Program is charged exactly the `required` the plan checked (front hint).
    p.output_token_reservation = front.hints.expected_output_length if front is not None else None
    frm, to = lc.apply(p, lc.ACTIVATE)
    p.placement = rank.target_id
    p.placement_epoch = s.epochs.next()
    p.placement_start_pending = True
    previous = p.last_target
    p.last_target = rank.target_id
    p.rounds_since_activation = 0
    p.acting_since = p.ttl_deadline = None
    p.last_pause_reason = None
    p.queued_at = None
    p.force_resume_deadline = p.force_resume_timeout_seconds = None
    p.force_gate_blocked_at = None
    p.pause_when_idle = False
    if p.segment_started_at is None:
        p.segment_started_at = s.now
    dequeue(s, p)
    tokens = private_tokens(p, cfg.decode_buffer_tokens)
    rank.active[p.ref] = p
    p.charged_tokens = tokens
    charge(rank, tokens)
    mark_dirty(s, rank.target_id)
    touch(s, p)
    capacity = cfg.token_capacity_per_dp_rank
    if plan is not None and not cfg.binding_only:
        used, required, reserve = plan.used_tokens, plan.required_tokens, plan.reserve_tokens
        age = s.now - rank.observed_at if rank.observed_at is not None else None
        s.effects.append(
            AdmissionCapacitySnapshot(
                target_id=rank.target_id,
                used_tokens=used,
                required_tokens=required,
                growth_reserve_tokens=reserve,
                capacity_tokens=capacity,
                capacity_pressure_ratio=used / capacity if capacity else None,
                projected_pressure_ratio=(used + required + reserve) / capacity if capacity else None,
                backend_kv_usage_ratio=rank.kv_cache_usage,
                backend_running_requests=rank.running_requests,
                backend_waiting_requests=rank.waiting_requests,
                observation_age_seconds=age,
            )
        )
    forced = plan is not None and plan.forced
    batch_gain = plan is not None and plan.batch_gain
    if reason is None:
        reason = "force_resume" if forced else "batch_gain_admit" if batch_gain else "program_admit"
    if forced:
        s.forced_admissions += 1
    s.effects.append(
        Transition(
            program=p.ref,
            from_state=frm,
            to_state=to,
            reason=reason,
            target_id=rank.target_id,
            counted=True,
            forced=forced,
            batch_gain=batch_gain,
            used_tokens=plan.used_tokens if plan else None,
            required_tokens=plan.required_tokens if plan else None,
            reserve_tokens=plan.reserve_tokens if plan else None,
            capacity_tokens=capacity,
        )
    )
    if previous is not None and previous != rank.target_id:
        s.effects.append(
            Transition(program=p.ref, from_state=frm, to_state=to, reason="cross_rank_resume", target_id=rank.target_id)
        )
    dispatch_ready(s, p, forced=forced)


def _unplace(s: SchedulerState, p: Program) -> tuple[TargetId | None, float]:
    """Remove an Active Program from its rank's ledger; returns (target, released tokens)."""
    target = p.placement
    tokens = p.charged_tokens
    if target is not None:
        rank = s.ranks.get(target)
        if rank is not None:
            rank.active.pop(p.ref, None)
            charge(rank, -tokens)
            mark_dirty(s, target)
    p.charged_tokens = 0.0
    p.placement = None
    return target, tokens


def pause(s: SchedulerState, p: Program, reason: str) -> None:
    """Active/Acting -> Paused/Acting with ``reason`` (the reference's pause wrapper)."""
    frm, to = lc.apply(p, lc.PAUSE)
    _unplace_paused(s, p, frm, to, reason, counted=True)


def requeue_pause(s: SchedulerState, p: Program, reason: str) -> None:
    """Active/Reasoning -> Paused/Reasoning: the Program's only request in flight went back to the
    front of its FIFO (docs/priority.md §3, "Re-queueing a blocking long prefill"); it releases
    its placement like a pause and waits in its queue."""
    frm, to = lc.apply(p, lc.REQUEUE)
    _unplace_paused(s, p, frm, to, reason, counted=True)
    enqueue(s, p)


def _unplace_paused(s: SchedulerState, p: Program, frm: str, to: str, reason: str, *, counted: bool) -> None:
    """A Program that just left Active: release its placement, reset it as paused, report it."""
    target, tokens = _unplace(s, p)
    _after_pause(s, p, reason)
    s.effects.append(
        Transition(
            program=p.ref,
            from_state=frm,
            to_state=to,
            reason=reason,
            target_id=target,
            counted=counted,
            released_private_tokens=tokens,
        )
    )


def _after_pause(s: SchedulerState, p: Program, reason: str) -> None:
    p.paused_at = s.now
    p.last_pause_reason = reason
    on_lost_placement(s, p, reason)  # the cause of its next recomputation (docs/program-scheduling.md §14)
    p.rounds_since_activation = 0
    p.acting_since = p.ttl_deadline = None
    p.pause_when_idle = False
    restart_freshness_anchor(p, s.now)
    touch(s, p)


def mark_pause_when_idle(s: SchedulerState, p: Program, reason: str) -> None:
    """A busy Program pauses (``reason``) when its in-flight requests end (docs/program-scheduling.md §6)."""
    p.pause_when_idle = True
    p.pause_when_idle_reason = reason
    touch(s, p)
    s.effects.append(
        Transition(
            program=p.ref,
            from_state=p.lifecycle,
            to_state=p.lifecycle,
            reason=f"{reason}_mark",
            target_id=p.placement,
        )
    )


def cancel_idle(s: SchedulerState, p: Program) -> None:
    """The last waiter was cancelled and nothing is in flight: the Program becomes Paused/Acting."""
    was_active = p.state == ACTIVE
    frm, to = lc.apply(p, lc.CANCEL_IDLE)
    if was_active:
        _unplace_paused(s, p, frm, to, REQUEST_CANCELLED, counted=False)
    else:
        p.paused_at = s.now
        touch(s, p)


def invalidate(s: SchedulerState, p: Program) -> None:
    """The placement target vanished: ``health_failover`` (docs/program-scheduling.md §1, with the B6 fix of §10)."""
    waiting = s.pool.program_len(p.ref)
    frm, to = lc.apply(p, lc.INVALIDATE_WAITING if waiting else lc.INVALIDATE_IDLE)
    target, tokens = _unplace(s, p)
    p.placement_epoch = s.epochs.next()
    p.placement_start_pending = False
    p.in_flight = 0
    on_lost_placement(s, p, "health_failover")
    s.effects.append(
        Transition(
            program=p.ref,
            from_state=frm,
            to_state=to,
            reason="health_failover",
            target_id=target,
            released_private_tokens=tokens,
        )
    )
    touch(s, p)


def release(s: SchedulerState, p: Program, reason: str) -> bool:
    """Terminal release of an idle Program generation (docs/program-scheduling.md §1)."""
    if p.in_flight or s.pool.program_len(p.ref):
        return False
    frm, to = lc.apply(p, lc.RELEASE)
    settle_program(s, p, 0.0)  # its KV rent ends here (it leaves the touched set)
    dequeue(s, p)
    target = p.placement
    if p.state == ACTIVE:
        _unplace(s, p)
    key = p.ref.key
    del s.programs[key]
    s.last_generations[key] = p.ref.generation
    s.released_at.pop(key, None)  # re-inserted at the end: the dict stays in release order
    s.released_at[key] = s.now
    s.binder.release(key)
    on_release(s, p)  # it leaves the touched set: close its time account now (docs/program-scheduling.md §14)
    s.touched.pop(p.ref, None)
    s.effects.append(
        Transition(
            program=p.ref,
            from_state=frm,
            to_state=to,
            reason=reason,
            target_id=target or p.last_target,
            counted=reason in ("paused_retention_release", "paused_capacity_release"),
        )
    )
    s.effects.append(RetireProgram(program=p.ref))
    return True


def is_waiting_candidate(s: SchedulerState, p: Program) -> bool:
    return p.state == PAUSED and p.status == REASONING and s.pool.program_len(p.ref) > 0


def cancel_waiting(s: SchedulerState, rid: RequestId) -> None:
    """Remove a waiting request (docs/program-scheduling.md §1); the caller runs the admission pass if it wants one."""
    found = s.pool.cancel(rid)
    if found is None:
        return
    req, _was_front = found
    s.eta.first.pop(rid, None)
    fairness.leave(s.fair, s.prio, req.tenant, s.now, dispatched=False)
    p = live_program(s, req.ref)
    if p is None:
        return
    waiting = s.pool.program_len(p.ref)
    if p.in_flight == 0 and waiting == 0:
        cancel_idle(s, p)
        give_back_unserved_move(s, p)  # a failover's request refused or abandoned (docs/program-scheduling.md §9.1)
    else:
        lc.apply(p, lc.CANCEL_BUSY)
    if waiting == 0:
        dequeue(s, p)
    touch(s, p)
    if p.in_flight == 0 and waiting == 0 and p.completed_requests == 0:
        release(s, p, "program_release")
