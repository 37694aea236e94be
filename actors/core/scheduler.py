"""The scheduler core: ``step(state, event, *, now, cfg) -> Step(state, effects)``.

One ``SchedulerState`` holds every Program, the RequestPool, the per-rank ledgers and queues.
``step`` handles one event atomically (the reference's "one lock section"), mutates the state
in place for speed and returns it with the ordered effects.  It reads no clock, does no I/O,
logs nothing and uses no randomness: the same events at the same ``now`` give the same effects.

Decision sequences (core spec 11; the order matters):

* arrival / force-resume or queue-timeout timer: release expired paused -> expire acting TTLs ->
  capacity repair -> schedule waiting;
* completion / acting-TTL or retention timer / tick: prune released generations -> expire TTLs
  -> release expired paused -> (unless binding_only) capacity repair -> schedule waiting;
* cancellation: schedule waiting only; observation: schedule waiting only.

Every step ends with the queue-timeout sweep (``Reject`` 429 for requests whose
``queue_deadline <= now``) and the timer sync: for every Program touched by the step, the
wanted timers (acting TTL, force resume, paused retention, queue timeout) are diffed with the
armed ones and ``ArmTimer``/``CancelTimer`` effects are emitted.  Expiry itself is driven by
deadline heaps, so a late or lost timer only delays a decision, it never changes it; a
``TimerFired`` whose token is not the armed one is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import frozen

from actors.core import handlers, topology
from actors.core.effects import Effect
from actors.core.events import (
    ObservationReceived,
    ObservationStale,
    ObservationStarted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestSubmitted,
    TargetsChanged,
    TimerFired,
)
from actors.core.state import SchedulerState
from actors.core.timers import sync_timers

__all__ = ["SchedulerState", "Step", "initial_state", "step"]


@frozen(slots=False)  # built once per event: a dict-backed frozen init is cheaper (see effects)
class Step:
    state: SchedulerState
    effects: tuple[Effect, ...]


def initial_state(cfg: Any) -> SchedulerState:
    return SchedulerState(cfg)


# Event type -> handler.  Every handler takes (state, event) and appends to ``state.effects``.
HANDLERS: dict[type, Callable[[SchedulerState, Any], None]] = {
    RequestSubmitted: handlers.on_submit,
    RequestCompleted: handlers.on_complete,
    RequestAbandoned: handlers.on_abandon,
    TimerFired: handlers.on_timer,
    RepairTick: handlers.on_tick,
    ObservationStarted: topology.on_observation_started,
    ObservationReceived: topology.on_observation,
    ObservationStale: topology.on_observation_stale,
    TargetsChanged: topology.on_targets_changed,
}


def step(state: SchedulerState, event: object, *, now: float, cfg: Any) -> Step:
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
    handlers.sweep_queue_timeouts(s)
    sync_timers(s)
    effects = tuple(s.effects)
    s.effects = []
    s.touched = {}
    return Step(s, effects)
