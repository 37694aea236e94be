"""The scheduler core: ``step(state, event, *, now, cfg) -> Step(state, effects)``.

One ``SchedulerState`` (``state``) holds every Program, the RequestPool, the per-rank ledgers and
queues.  ``step`` handles one event atomically (the reference's "one lock section"), mutates the
state in place for speed and returns it with the ordered effects.  It reads no clock, does no
I/O, logs nothing and uses no randomness: the same events at the same ``now`` give the same
effects.  ``HANDLERS`` maps each event type to its handler (``arrival``, ``completion``, ``handlers``, ``topology``).

Decision sequences (the order matters):

* arrival: the arrival's own bookkeeping -> capacity repair -> schedule waiting;
* completion: statistics, acting TTL or pause -> segment yield -> a TTL of 0 pauses the
  Program now (``ttl_expired``; there is nothing to wait for, so no timer) -> (unless
  binding_only) capacity repair -> schedule waiting;
* timer firings, each acting on its own Program's deadline first:
  acting TTL -> pause ``ttl_expired``; paused retention -> release; queue timeout -> reject
  (429) the Program's requests whose queue deadline passed; force resume -> nothing.  Then
  acting TTL and retention run the completion's sequence (repair -> schedule), queue timeout
  and force resume the arrival's (not in binding_only);
* tick: forget old generation histories -> (unless binding_only) repair on every rank ->
  schedule waiting -> report capacity-source changes;
* cancellation, observation, target change: schedule waiting only;
* every step ends, after its Program decisions, with the batch class's dispatch
  (``batch_class.dispatch_batch``, docs/batch.md §2) when batch requests wait.

Deadlines live in exactly one place.  The core keeps their values on its records
(``Program.ttl_deadline``, ``force_resume_deadline``, ``paused_at`` + retention,
``PendingRequest.queue_deadline``) and the waiting is done by the Program actors: every step ends
with the timer sync (``timers.sync_timers``), which diffs the timers wanted by every Program the
step touched with the armed ones and emits ``ArmTimer``/``CancelTimer``.  A deadline is acted on
only when its ``TimerFired`` arrives with the armed token; a stale token is dropped, and an early
firing is re-armed.  Pruning released generation histories is not a Program deadline (the
Program is gone): the tick does it (``sequences.prune_released_generations``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import frozen

from actors.core import arrival, batch_class, completion, eta_queue, fairness_sync, handlers, interactive, topology
from actors.core.config import BatchJobsConfig, PriorityConfig, ProgramSchedulingConfig
from actors.core.effects import Effect
from actors.core.events import (
    BatchSubmitted,
    InteractiveSubmitted,
    ObservationReceived,
    ObservationStale,
    ObservationStarted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestRequeued,
    RequestSubmitted,
    TargetsChanged,
    TimerFired,
)
from actors.core.state import SchedulerState
from actors.core.timeline import sync_touched
from actors.core.timers import sync_timers

__all__ = ["SchedulerState", "Step", "initial_state", "step"]


@frozen(slots=False)  # built once per event: a dict-backed frozen init is cheaper (see effects)
class Step:
    state: SchedulerState
    effects: tuple[Effect, ...]


def initial_state(
    cfg: ProgramSchedulingConfig, batch: BatchJobsConfig | None = None, priority: PriorityConfig | None = None
) -> SchedulerState:
    return SchedulerState(cfg, batch, priority)


# Event type -> handler.  Every handler takes (state, event of that type) and appends its effects
# to ``state.effects``; the event parameter is ``Any`` here because each handler takes its own type.
HANDLERS: dict[type, Callable[[SchedulerState, Any], None]] = {
    RequestSubmitted: arrival.on_submit,
    InteractiveSubmitted: handlers.on_interactive,
    BatchSubmitted: batch_class.on_batch_submit,
    RequestCompleted: completion.on_complete,
    RequestAbandoned: handlers.on_abandon,
    RequestRequeued: handlers.on_requeued,
    TimerFired: handlers.on_timer,
    RepairTick: handlers.on_tick,
    ObservationStarted: topology.on_observation_started,
    ObservationReceived: topology.on_observation,
    ObservationStale: topology.on_observation_stale,
    TargetsChanged: topology.on_targets_changed,
}


def step(state: SchedulerState, event: object, *, now: float, cfg: ProgramSchedulingConfig) -> Step:
    """Apply one event at time ``now``; returns the (same, updated) state and the effects."""
    handler = HANDLERS.get(type(event))
    if handler is None:
        raise TypeError(f"unknown event type {type(event).__name__}")
    s = state
    s.cfg = cfg
    s.now = now
    s.effects = []
    s.touched = {}
    handler(s, event)
    if isinstance(event, RequestSubmitted):  # a request left waiting is told its ETA (docs/program-scheduling.md §13)
        eta_queue.after_submit(s, event)
    if s.batch is not None:
        batch_class.after_step(s)  # after the step's Program decisions: Programs first
    if s.interactive.pending or s.interactive.claimed:
        # the events that ran no admission pass, and the room the batch pass left; clears the
        # claims of requests that left (docs/priority.md §2)
        interactive.dispatch_interactive(s)
    fairness_sync.sync_rent(s)
    sync_touched(s)  # each touched Program's time account enters its new phase (docs/program-scheduling.md §14)
    sync_timers(s)
    effects = tuple(s.effects)
    s.effects = []
    s.touched = {}
    return Step(s, effects)
