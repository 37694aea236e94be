"""Re-queueing a long prefill that blocks a light tenant (docs/priority.md §3, "Re-queueing a
blocking long prefill").

The isolation of light tenants (``fairness_isolation``) keeps a heavy tenant's *new* work off a
rank a light tenant uses, and one long prefill at a time (``fairness_prefill``) bounds how much of
it can already run there; what neither can touch is the long prefill that was admitted before
the light tenant came (``D`` in docs/priority.md §4).  A non-preemptive engine finishes it before
anything that arrives behind it, so the light tenant's first request on the rank waits seconds
for it.  Until its first token nothing of that request has reached its client, so it can be
taken back for free: aborted upstream and admitted again later, the engine keeping what it
computed so far in its prefix cache.

With ``requeue_long_prefills`` (and the isolation and ``long_prefill_seconds`` on), at the end of
every admission pass, for each rank kept for a light tenant (``RankState.isolated_for``) whose
long prefill in flight (its ``long_prefill`` marker, before its estimated end) belongs to a heavy
tenant of the pass's view, when a light tenant the rank is kept for has a request in flight on
it or a Program waiting for it, the core asks the shell to take that prefill back
(``RequeuePrefill``).  The shell does it only while no byte of the answer went to the client, and
answers ``RequestRequeued`` (:func:`requeue`); otherwise the request runs on and nothing changes.

Bounds: a request is asked at most once per dispatch and re-queued at most
``MAX_PREFILL_REQUEUES`` (2) times in its life: its second dispatch is asked again when a light
tenant comes back to the rank while it prefills (it was dispatched once the light tenant's window
had passed), its third never, so no request can be taken back forever; a dispatch of a forced
resume is never asked (the agent class's starvation bound stays, docs/priority.md §4); only a
Program's only request in flight is asked (the Program pauses when it goes back).
"""

from __future__ import annotations

from actors.core import fairness, fairness_prefill
from actors.core.effects import RequeuePrefill
from actors.core.fairness_isolation import IsolationView
from actors.core.fairness_isolation import enabled as isolation_enabled
from actors.core.ids import TargetId
from actors.core.lifecycle import is_waiting_candidate, requeue_pause
from actors.core.model import MAX_PREFILL_REQUEUES, PREFILL_REQUEUE, Dispatch, PendingRequest, Program, RankState
from actors.core.state import SchedulerState, live_program, queue_timeout


def enabled(s: SchedulerState) -> bool:
    return s.prio.requeue_long_prefills and s.prio.long_prefill_seconds > 0 and isolation_enabled(s)


def _blocked(s: SchedulerState, rank: RankState) -> tuple[str, ...]:
    """The light tenants the rank is kept for that have a request in flight on it or a Program
    waiting for it: the requests a long prefill running there holds back."""
    light = rank.isolated_for
    found = {a.tenant for a in rank.active.values() if a.in_flight > 0 and a.tenant in light}
    target = rank.target_id
    if s.cfg.global_queue:
        pools = [pool for pool, targets in s.pools.items() if target in targets]
        refs = [ref for pool in pools for ref in s.global_queues.get(pool, ())]
    else:
        refs = list(s.rank_queues.get(target, ()))
    for ref in refs:
        p = live_program(s, ref)
        if p is not None and p.tenant in light and p.last_target == target and is_waiting_candidate(s, p):
            found.add(p.tenant)
    return tuple(sorted(found))


def _candidate(s: SchedulerState, rank: RankState, heavy: frozenset[str]) -> tuple[Dispatch, Program] | None:
    """The rank's long prefill in flight when the core may ask for it back, else None."""
    marker = rank.long_prefill
    if marker is None or not fairness_prefill.busy(s, rank):
        return None
    d = s.in_flight.get(marker[0])
    if d is None or d.target_id != rank.target_id or d.requeue_asked or d.requeues >= MAX_PREFILL_REQUEUES or d.forced:
        return None
    if d.tenant not in heavy or d.tenant in rank.isolated_for:
        return None
    p = live_program(s, d.ref)
    if p is None or p.placement != rank.target_id or p.placement_epoch != d.placement_epoch or p.in_flight != 1:
        return None
    return d, p


def ask(s: SchedulerState, view: IsolationView) -> None:
    """End of an admission pass: ask for the long prefills that block a light tenant (module docstring)."""
    if not view or not enabled(s):
        return
    for target in sorted(view):
        rank = s.ranks.get(TargetId(target))
        if rank is None or not rank.isolated_for:
            continue
        found = _candidate(s, rank, view[target])
        if found is None:
            continue
        blocked = _blocked(s, rank)
        if not blocked:
            continue
        d, p = found
        d.requeue_asked = True
        marker = rank.long_prefill
        assert marker is not None
        s.effects.append(
            RequeuePrefill(
                request_id=d.request_id,
                target_id=rank.target_id,
                program=p.ref,
                tenant=d.tenant,
                light_tenants=blocked,
                estimated_prefill_end=marker[1],
            )
        )


def requeue(s: SchedulerState, d: Dispatch, p: Program) -> None:
    """The shell took request ``d`` back before its first token (``RequestRequeued``): it leaves
    the rank's ledger and the long-prefill marker, its tenant gets its input charge back (it is
    charged again when dispatched anew), and it goes back to the front of its Program's FIFO with
    its arrival time and a fresh queue deadline; the Program pauses (``prefill_requeue``) and
    waits in its queue.  The caller has checked that ``d`` is ``p``'s only live dispatch."""
    del s.in_flight[d.request_id]
    rank = s.ranks[d.target_id]
    rank.dispatched -= 1
    fairness_prefill.on_complete(rank, d.request_id)
    fairness.charge(s.fair, s.prio, d.tenant, input_tokens=-d.input_charge)
    fairness.arrive(s.fair, s.prio, d.tenant, s.now)
    p.in_flight -= 1
    s.pool.retain_front(
        PendingRequest(
            request_id=d.request_id,
            ref=p.ref,
            seq=d.queue_seq,
            arrived_at=d.arrived_at,
            estimated_context_tokens=d.estimated_context_tokens,
            hints=d.hints,
            routing_text=d.routing_text,
            queue_deadline=s.now + queue_timeout(s, d.hints),
            tenant=d.tenant,
            requeues=d.requeues + 1,
        )
    )
    p.queued_at = d.arrived_at  # it keeps its place in the resume order (FCFS and MRU tie-break)
    requeue_pause(s, p, PREFILL_REQUEUE)
