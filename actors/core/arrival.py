"""Arrival: a request with Program identity enters the RequestPool (``RequestSubmitted``).

``on_submit`` runs the arrival's named steps in order: create or find the Program's generation,
sample the request interval, retain the request, refresh the Program's metadata, move it off the
workers a failover's request could not reach, place it (admit at once on an Active Program, queue
otherwise), the arrival's decision sequence, and the force-resume deadline
(docs/program-scheduling.md §3, §5, §9.1).
"""

from __future__ import annotations

import math

from actors.core import fairness, fairness_isolation
from actors.core import program as lc
from actors.core.binding import bind
from actors.core.effects import (
    RequestIntervalObserved,
    SpawnProgram,
)
from actors.core.errors import NO_TARGETS, InvalidEvent
from actors.core.events import (
    RequestSubmitted,
)
from actors.core.failover import allowed_targets
from actors.core.fairness_sync import settle_program
from actors.core.ids import ProgramKey, ProgramRef, RequestId, TargetId
from actors.core.ledger import resync
from actors.core.lifecycle import (
    cancel_waiting,
    commit_admission,
    dispatch_ready,
    enqueue,
    invalidate,
    mark_dirty,
    reject,
    touch,
)
from actors.core.model import (
    ACTIVE,
    PAUSED,
    REASONING,
    PendingRequest,
    Program,
    ProgramIdentity,
    RequestHints,
)
from actors.core.resume import (
    schedule_waiting,
    set_force_resume_deadline,
)
from actors.core.sequences import arrival_sequence
from actors.core.state import SchedulerState, live_program, queue_timeout
from actors.core.topology import rebind, sync_targets

PASS_RACE_ADMIT = "pass_race_admit"  # the Transition reason of ``admit_where_it_is``

# ---- arrival ---------------------------------------------------------------------------------------


def on_submit(s: SchedulerState, ev: RequestSubmitted) -> None:
    """A request with Program identity arrived (docs/program-scheduling.md §1, §3, §5).

    The steps, in order: sync the pool's targets if the shell sent them; validate; find the live
    generation or create one; sample the request interval of an idle Program; retain the request;
    refresh the Program's metadata and context estimate (a new generation is bound to its home
    rank); move the Program off a worker the request could not reach (a failover,
    docs/program-scheduling.md §9.1); dispatch it at once when the Program is active, else queue
    the Program; the arrival sequence; finally freeze the workload-derived force-resume deadline.
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
    bound = ev.max_queue_seconds
    if bound is not None and not (math.isfinite(bound) and bound >= 0):
        raise InvalidEvent(f"max_queue_seconds must be finite and >= 0 (got {bound!r})")
    key = ProgramKey(pool, ev.identity.program_id)
    p = s.programs.get(key)
    existed = p is not None
    if p is None:
        p = create_generation(s, key, est)
    else:
        fairness_isolation.observe_return(s, p)  # before anything moves its last request's end
        sample_request_interval(s, p)
    retain_request(s, p, ev, est)
    refresh_program(s, p, ev, est, existed)
    touch(s, p)
    if ev.avoid_workers and ev.already_on is None:
        steer_off(s, p, ev.avoid_workers, ev.routing_text)
    if not place_arrival(s, p, rid, ev.hints):
        return
    if ev.already_on is not None and not admit_where_it_is(s, p, rid, ev.already_on):
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
            # the gap after the last turn's tools (docs/program-scheduling.md §12)
            s.tools.observe(p.ref.model_pool, p.last_turn_keys, interval, p.tool_ttl_armed)
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
    timeout = queue_timeout(s, hints)
    fairness.arrive(s.fair, s.prio, ev.tenant, now)
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
            tenant=ev.tenant,
            avoid_workers=ev.avoid_workers,
        )
    )


def refresh_program(s: SchedulerState, p: Program, ev: RequestSubmitted, est: int, existed: bool) -> None:
    """Lineage, identity metadata, output allowance and context estimate; binds a new generation."""
    ident = ev.identity
    s.lineage.observe(ev.model_pool, ident.program_id, ident.parent_program_id, ident.root_program_id)
    _refresh_metadata(p, ident, existed)
    # its task's attained service (the las order, docs/program-scheduling.md §5.1)
    s.attained.join(p.ref.key, p.placement_key)
    if p.tenant != ev.tenant:  # the rent of what it holds so far stays with the previous tenant
        settle_program(s, p, 0.0)
        p.tenant = ev.tenant
    p.priority = ev.hints.priority
    p.output_token_reservation = ev.hints.expected_output_length
    if existed:
        if est >= p.estimated_context_tokens:
            p.estimated_context_tokens = est
            p.context_shrink_observations = 0
    else:
        bound = bind(s, p, ev.routing_text)
        p.home_target = p.last_target = bound


def steer_off(s: SchedulerState, p: Program, avoid: frozenset[str], text: str | None) -> None:
    """A failover's request avoids the workers of ``avoid`` (it could not reach them,
    docs/program-scheduling.md §9.1): when its Program's rank is on one of them and the pool has a
    target of another worker, the Program moves as it would if its rank had left the pool
    (``topology.sync_targets``): an Active one is invalidated (``health_failover``: its charge is
    released, what is in flight there no longer counts), then it is bound anew by the binding
    strategy among the allowed targets and the arrival queues it there.  The rank it left is
    remembered (``failover_from``, the first one when a second failover moves it again) and given
    back if nothing of it succeeds before it goes idle (``failover.give_back_unserved_move``).  When
    every target is on an avoided worker, nothing changes: the request is placed as without the
    exclusion."""
    current = p.placement if p.state == ACTIVE else p.last_target
    if current is None or s.ranks[current].worker_url not in avoid:
        return
    allowed = allowed_targets(s, p.ref.model_pool, avoid)
    if current in allowed:
        return  # every target is on an avoided worker
    if p.failover_from is None:
        p.failover_from = current
    if p.state == ACTIVE:
        invalidate(s, p)
    rebind(s, p, text, avoid, left_rank=True)


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


def admit_where_it_is(s: SchedulerState, p: Program, rid: RequestId, target: TargetId) -> bool:
    """A request a relay already forwarded to ``target`` under a resume pass (docs/program-scheduling.md
    §15).  An Active Program dispatched it in ``place_arrival`` (on ``target`` unless it moved since);
    a Program that stopped being Active there (its pass was revoked while the request was under way)
    is admitted on ``target`` as it stands, without a capacity plan (``pass_race_admit``: capacity
    repair deals with any excess).  Returns False when ``target`` is no longer a target of the
    Program's pool: the request is refused as having no target (B2's refusal)."""
    if p.state == ACTIVE:
        return True
    if target not in s.pools.get(p.ref.model_pool, ()):
        s.effects.append(reject(rid, NO_TARGETS))
        cancel_waiting(s, rid)
        return False
    commit_admission(s, p, s.ranks[target], None, reason=PASS_RACE_ADMIT)
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
