"""Event handlers of ``scheduler.step`` that the other modules do not own: cancellation, timer
firings and the tick.  Arrival is ``arrival.on_submit``, completion ``completion.on_complete``;
the decision sequences are in ``sequences``; targets and observations in ``topology``.
"""

from __future__ import annotations

from actors.core import eta_queue, fairness, fairness_requeue
from actors.core.batch_class import on_batch_abandon
from actors.core.completion import on_complete
from actors.core.errors import InvalidEvent, Rejection
from actors.core.events import (
    ACTING_TTL,
    FORCE_RESUME,
    PAUSED_RETENTION,
    InteractiveSubmitted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestRequeued,
    TimerFired,
)
from actors.core.events import QUEUE_TIMEOUT as QUEUE_TIMEOUT_TIMER
from actors.core.interactive import on_interactive_abandon, on_interactive_submit, reject_timed_out_interactive
from actors.core.lifecycle import (
    reject,
    touch,
)
from actors.core.resume import schedule_after_change, set_force_resume_deadline
from actors.core.sequences import (
    arrival_sequence,
    cancel_request,
    expire_acting_ttl,
    periodic_sequence,
    prune_released_generations,
    reject_timed_out,
    release_idle_over_cap,
    release_retained,
)
from actors.core.state import SchedulerState, live_program
from actors.core.topology import report_capacity_sources, sync_targets

# ---- cancellation -------------------------------------------------------------------------------


def on_interactive(s: SchedulerState, ev: InteractiveSubmitted) -> None:
    """An interactive request (docs/priority.md §2): sync the pool's targets, queue it, run the
    admission pass (it goes first: ``resume.schedule_waiting``)."""
    if ev.targets is not None:
        sync_targets(s, ev.model_pool, ev.targets)
    on_interactive_submit(s, ev)
    schedule_after_change(s)


def on_abandon(s: SchedulerState, ev: RequestAbandoned) -> None:
    if on_interactive_abandon(s, ev.request_id):
        periodic_sequence(s)
        return
    if on_batch_abandon(s, ev.request_id):
        periodic_sequence(s)
        return
    if s.pool.get(ev.request_id) is not None:
        cancel_request(s, ev.request_id)
    elif ev.request_id in s.in_flight:
        on_complete(s, RequestCompleted(ev.request_id, False))


REQUEUE_LOST = Rejection(
    reason="requeue_lost",
    status_hint=503,
    message="the request was taken back for re-dispatch but its Program's placement had changed meanwhile",
)


def on_requeued(s: SchedulerState, ev: RequestRequeued) -> None:
    """The shell took a long prefill back before its first token (docs/priority.md §3,
    "Re-queueing a blocking long prefill"): it waits in the RequestPool again and a later
    admission pass dispatches it anew (an ``Admit`` on the same request id).

    The handler waits for that answer, so every case answers: a request the core no longer has
    in flight as its Program's only live dispatch (its placement was invalidated meanwhile) ends
    as a failed completion and is refused (503 ``requeue_lost``).  A request the core never asked
    for is a shell bug (``InvalidEvent``)."""
    rid = ev.request_id
    d = s.in_flight.get(rid)
    if d is None:
        if s.pool.get(rid) is None:
            s.effects.append(reject(rid, REQUEUE_LOST))
        return  # already waiting again: its Admit comes with an admission pass
    if not d.requeue_asked:
        raise InvalidEvent(f"request {rid!r} was re-queued but the core never asked for it")
    p = live_program(s, d.ref)
    if p is None or p.placement != d.target_id or p.placement_epoch != d.placement_epoch or p.in_flight != 1:
        on_complete(s, RequestCompleted(rid, False))
        s.effects.append(reject(rid, REQUEUE_LOST))
        return
    fairness_requeue.requeue(s, d, p)
    set_force_resume_deadline(s, p)  # the agent class's starvation bound holds for it (docs/priority.md §4)
    periodic_sequence(s)


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
    # the queue ETA counts to the next tick's admission pass (docs/program-scheduling.md §13)
    s.eta.last_tick_at = s.now
    release_idle_over_cap(s)
    prune_released_generations(s)
    fairness.prune(s.fair, s.prio, s.now)
    if s.interactive.pending:
        reject_timed_out_interactive(s)
    for t in s.ranks:
        s.dirty_ranks[t] = None
    periodic_sequence(s)
    report_capacity_sources(s)
    eta_queue.tell_all(s)  # every waiting request learns its position and ETA again (docs/program-scheduling.md §13)
