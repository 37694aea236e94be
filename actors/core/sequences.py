"""The decision sequences of ``scheduler.step`` and the deadline actions.

A sequence is the order in which one kind of event re-examines the state (docs/program-scheduling.md
§3-§7): an arrival repairs capacity and schedules; completions, TTL expiry and retention run the
periodic sequence.  The deadline actions act on one Program when its Program actor's timer fired
(``handlers.on_timer``); pruning released generations runs on the tick.
"""

from __future__ import annotations

from actors.core import eta_queue
from actors.core.errors import QUEUE_TIMEOUT
from actors.core.ids import RequestId
from actors.core.lifecycle import (
    cancel_waiting,
    pause,
    reject,
    release,
)
from actors.core.model import (
    ACTING,
    ACTIVE,
    PAUSED,
    TTL_EXPIRED,
    Program,
)
from actors.core.repair import repair_capacity
from actors.core.resume import (
    schedule_after_change,
    schedule_waiting,
)
from actors.core.state import SchedulerState

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
    if not _idle_paused(s, p):
        return
    if p.paused_at + s.cfg.paused_retention_ttl_seconds > s.now:
        return
    _observe_last_gap(s, p)
    release(s, p, "paused_retention_release")


def release_idle_over_cap(s: SchedulerState) -> None:
    """More than ``max_idle_paused_programs`` Programs idle and paused: release the ones paused
    longest ago (then by key), as ``paused_retention_release`` would later (docs/program-scheduling.md
    §1).  A client minting Program ids otherwise grows the scheduler by one Program, and the actors
    by one Program actor, per id for ``paused_retention_ttl_seconds``.  Free below the cap: the
    count of live Programs is checked first."""
    cap = s.cfg.max_idle_paused_programs
    if not cap or len(s.programs) <= cap:
        return
    idle = [p for p in s.programs.values() if _idle_paused(s, p)]
    if len(idle) <= cap:
        return
    idle.sort(key=lambda p: (p.paused_at, p.ref.model_pool, p.ref.program_id))
    for p in idle[: len(idle) - cap]:
        _observe_last_gap(s, p)
        release(s, p, "paused_capacity_release")


def _idle_paused(s: SchedulerState, p: Program) -> bool:
    return p.state == PAUSED and p.status == ACTING and not p.in_flight and not s.pool.program_len(p.ref)


def _observe_last_gap(s: SchedulerState, p: Program) -> None:
    if p.last_request_finished_at is not None and p.continuity_sampled_at != p.last_request_finished_at:
        # the Program never came back: one long gap for its last turn's tools (docs/program-scheduling.md §12)
        s.tools.observe(p.ref.model_pool, p.last_turn_keys, s.now - p.last_request_finished_at, p.tool_ttl_armed)


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
        # Retry-After from the Program's queue ETA (docs/program-scheduling.md §13)
        s.effects.append(reject(req.request_id, QUEUE_TIMEOUT, eta_queue.retry_after(s, p)))
        cancel_request(s, req.request_id)


def prune_released_generations(s: SchedulerState) -> None:
    """Forget the generation history of Programs released at least ``max(retention, 60 s)`` ago.

    Not a Program deadline (the Program is gone, and so is its actor): the tick does it, taking
    entries from the front of ``released_at``, which is kept in release order.  This bounds the
    memory of generation numbers and lineage nodes (B14).
    """
    keep = max(s.cfg.paused_retention_ttl_seconds, 60.0)
    cap = s.cfg.max_idle_paused_programs  # with it, histories older than 60 s beyond the cap go too
    released = s.released_at
    while released:
        key, at = next(iter(released.items()))
        if at + keep > s.now and not (cap and len(released) > cap and at + 60.0 <= s.now):
            return
        del released[key]
        s.last_generations.pop(key, None)
        s.lineage.forget(key.model_pool, key.program_id)
        s.times.forget(key)
        s.attained.forget(key)


def cancel_request(s: SchedulerState, rid: RequestId) -> None:
    """Remove a waiting request (docs/program-scheduling.md §1), then run an admission pass."""
    cancel_waiting(s, rid)
    schedule_after_change(s)
