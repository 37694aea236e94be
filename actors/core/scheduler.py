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

from typing import Any

from attrs import frozen

from actors.core.effects import ArmTimer, CancelTimer, Effect
from actors.core.events import (
    ACTING_TTL,
    FORCE_RESUME,
    PAUSED_RETENTION,
    QUEUE_TIMEOUT,
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
from actors.core.ids import ProgramKey, ProgramRef, RequestId, SeqCounter, TargetId
from actors.core.model import ACTING, ACTIVE, PAUSED, DeadlineHeap, Dispatch, Lineage, Program, RankState
from actors.core.placement import Binder
from actors.core.queue import RequestPool
from actors.core.stats import ProgressTtlFactors, ResumeHitWindow


class SchedulerState:
    """All scheduling state (one writer: the scheduler actor)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.now = 0.0
        self.programs: dict[ProgramKey, Program] = {}
        self.pool = RequestPool()
        self.in_flight: dict[RequestId, Dispatch] = {}
        self.ranks: dict[TargetId, RankState] = {}
        self.pools: dict[str, tuple[TargetId, ...]] = {}
        self.pool_signatures: dict[str, tuple[tuple[object, ...], ...]] = {}
        self.revision = 0
        self.rank_queues: dict[TargetId, dict[ProgramRef, None]] = {}
        self.global_queues: dict[str, dict[ProgramRef, None]] = {}
        self.last_generations: dict[ProgramKey, int] = {}
        self.released_at: dict[ProgramKey, float] = {}
        self.epochs = SeqCounter()
        self.timer_tokens = SeqCounter()
        self.request_seq = SeqCounter()
        self.binder = Binder(cfg.binding_strategy, cfg.hash_virtual_nodes)
        self.lineage = Lineage()
        self.ttl_heap = DeadlineHeap()
        self.retention_heap = DeadlineHeap()
        self.queue_heap = DeadlineHeap()
        self.prune_heap = DeadlineHeap()
        self.dirty_ranks: dict[TargetId, None] = {}
        # request intervals of every rank: the TTL fit of a rank whose own window is not full yet
        self.warm_factors = ProgressTtlFactors(cfg.stats_window_size)
        # engine cache kept across pauses: scales the cache-miss impact in the TTL fit
        self.resume_hits = ResumeHitWindow(cfg.stats_window_size)
        self.forced_admissions = 0
        # per-step scratch
        self.effects: list[Effect] = []
        self.touched: dict[ProgramRef, Program] = {}


@frozen(slots=False)  # built once per event: a dict-backed frozen init is cheaper (see effects)
class Step:
    state: SchedulerState
    effects: tuple[Effect, ...]


def initial_state(cfg: Any) -> SchedulerState:
    return SchedulerState(cfg)


_HANDLERS: dict[type, Any] = {}


def _handlers() -> dict[type, Any]:
    """Event type -> handler, built on first use (``handlers`` imports this module's types)."""
    if not _HANDLERS:
        from actors.core import handlers as h
        from actors.core import topology as t

        def targets_changed(s: SchedulerState, ev: TargetsChanged) -> None:
            t.sync_targets(s, ev.model_pool, ev.targets)
            t.schedule_after_change(s)

        _HANDLERS.update(
            {
                RequestSubmitted: h.on_submit,
                RequestCompleted: h.on_complete,
                RequestAbandoned: h.on_abandon,
                TimerFired: h.on_timer,
                RepairTick: lambda s, ev: t.on_tick(s),
                ObservationStarted: t.on_observation_started,
                ObservationReceived: t.on_observation,
                ObservationStale: t.on_observation_stale,
                TargetsChanged: targets_changed,
                "sweep": h.sweep_queue_timeouts,  # type: ignore[dict-item]
            }
        )
    return _HANDLERS


def step(state: SchedulerState, event: object, *, now: float, cfg: Any) -> Step:
    """Apply one event at time ``now``; returns the (same, updated) state and the effects."""
    table = _HANDLERS or _handlers()
    handler = table.get(type(event))
    if handler is None:
        raise TypeError(f"unknown event type {type(event).__name__}")
    s = state
    s.cfg = cfg
    s.now = now
    s.effects = []
    s.touched = {}
    handler(s, event)
    table["sweep"](s)  # type: ignore[index]
    _sync_timers(s)
    effects = tuple(s.effects)
    s.effects = []
    s.touched = {}
    return Step(s, effects)


def wanted_timers(s: SchedulerState, p: Program) -> dict[str, float]:
    now = s.now
    out: dict[str, float] = {}
    waiting = s.pool.program_len(p.ref)
    if p.state == ACTIVE and p.status == ACTING and p.ttl_deadline is not None and p.ttl_deadline > now:
        out[ACTING_TTL] = p.ttl_deadline
    if p.state == PAUSED and waiting:
        if p.force_resume_deadline is not None and p.force_resume_deadline > now:
            out[FORCE_RESUME] = p.force_resume_deadline
        front = s.pool.front(p.ref)
        if front is not None:
            out[QUEUE_TIMEOUT] = min(r.queue_deadline for r in s.pool.requests(p.ref))
    if p.state == PAUSED and p.status == ACTING and p.in_flight == 0 and not waiting:
        out[PAUSED_RETENTION] = p.paused_at + s.cfg.paused_retention_ttl_seconds
    return out


def _sync_timers(s: SchedulerState) -> None:
    programs, effects = s.programs, s.effects
    for ref, p in s.touched.items():
        if programs.get(ref[:2]) is not p:
            continue
        want = wanted_timers(s, p)
        have = p.timers
        if have is None:
            if not want:
                continue  # nothing armed, nothing wanted
            have = {}
        else:
            for kind in [k for k in have if k not in want]:  # armed order
                del have[kind]
                effects.append(CancelTimer(ref, kind))
        for kind, deadline in want.items():
            cur = have.get(kind)
            if cur is None or cur[0] != deadline:
                token = s.timer_tokens.next()
                have[kind] = (deadline, token)
                effects.append(ArmTimer(ref, kind, deadline, token))
        p.timers = have or None
