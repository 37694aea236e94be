"""The global-queue scheduler actor: the only writer of the Program-scheduling state.

It owns the core's ``SchedulerState`` and feeds every fact it receives, one message at a time,
to the pure ``actors.core.scheduler.step(state, event, now=trio.current_time(), cfg=cfg)``.
``step`` is synchronous, so each decision is atomic under Trio's cooperative scheduling and no
lock exists anywhere.  The actor then *routes* the step's effects, in order:

* ``Admit`` / ``Reject``  -> the waiting handler's one-shot reply channel (``send_nowait``; a
  handler that already left is followed by its ``Abandoned``, which the core handles);
* ``SpawnProgram`` / ``ArmTimer`` / ``CancelTimer`` / ``RetireProgram`` -> the Program actors,
  through :class:`~actors.program_registry.ProgramRegistry` (never awaited, so no cycle between
  the scheduler inbox and the Program inboxes can deadlock);
* ``Transition`` and the observation facts -> INFO/DEBUG log events and the
  ``vllm_router_agent_aware_*`` metrics.

After every ``RepairTick`` it calls ``on_tick`` (the service publishes the gauge snapshot for
``/metrics`` there).  Diagnostics read
:attr:`SchedulerHandle.state` (the latest state reference) between steps: because steps never
await, a reader always sees a consistent state.

The actor's inbox is bounded (see ``SCHEDULER_INBOX_SIZE``); the actor itself never awaits
anything but its inbox, so producers (HTTP handlers, the rank actor, Program actors) are only
ever delayed by the actor's own processing rate.  An exception in ``step`` or in routing
propagates and stops the daemon (one-cancels-all): no restart loop hides a broken invariant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from actors.core import effects as fx
from actors.core import events as ev
from actors.core.config import BackendTarget, ProgramSchedulingConfig
from actors.core.ids import DEFAULT_MODEL_POOL, RequestId, TargetId, redacted_id
from actors.core.model import RequestHints, Usage
from actors.core.scheduler import initial_state, step
from actors.core.state import SchedulerState
from actors.logevents import get_logger, log_event
from actors.mailbox import Mailbox, open_mailbox, reply_nowait
from actors.messages import (
    Abandoned,
    Admitted,
    Completed,
    ObservationReceived,
    ObservationStarted,
    Rejected,
    RepairTick,
    Reply,
    SchedulerMessage,
    Submit,
    TimerFired,
)
from actors.program_metrics import ProgramMetrics, RankGauges
from actors.program_registry import ProgramRegistry, run_program_registry

# Scheduler inbox.  Producers: one Submit + one Completed/Abandoned per Program request, one
# message per target per tick from the rank actor, one TimerFired per due timer.  A step costs
# tens of microseconds, so 1024 absorbs bursts of ~1000 simultaneous arrivals without making
# handlers wait, while bounding memory.
SCHEDULER_INBOX_SIZE = 1024

logger = get_logger("program.scheduler")

PAUSED_STATE = "paused"
ACTIVE_STATE = "active"
ADMIT_REASONS = ("program_admit", "batch_gain_admit", "force_resume")


class HealthyTargets(Protocol):
    """Where the scheduler reads which targets are healthy (the daemon's health board)."""

    def healthy_targets(self) -> tuple[BackendTarget, ...]: ...


class SchedulerHandle:
    """What the service and diagnostics see of the scheduler actor."""

    def __init__(
        self,
        cfg: ProgramSchedulingConfig,
        targets: Sequence[BackendTarget],
        inbox: Mailbox[SchedulerMessage],
        state: SchedulerState,
    ) -> None:
        self.cfg = cfg
        self.targets = tuple(targets)
        self.targets_by_id = {t.target_id: t for t in self.targets}
        self.inbox = inbox
        self.state = state
        self.registry: ProgramRegistry | None = None
        self.health: HealthyTargets | None = None
        self.synced_target_ids: tuple[str, ...] = ()
        self.steps_count = 0
        self.last_step_at: float | None = None
        self.pending_replies_count = 0
        self._changed = trio.Event()

    def notify_stepped(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Return after the next step (for ``wait_<condition>`` helpers; never polls)."""
        await self._changed.wait()

    def statistics(self) -> list[dict[str, Any]]:
        out = [self.inbox.statistics()]
        if self.registry is not None:
            out.append(self.registry.statistics())
        return out


class _Router:
    """Routes one step's effects (the scheduler actor's I/O side)."""

    def __init__(self, handle: SchedulerHandle, metrics: ProgramMetrics, registry: ProgramRegistry) -> None:
        self.handle = handle
        self.metrics = metrics
        self.registry = registry
        self.replies: dict[str, trio.MemorySendChannel[Reply]] = {}
        # request id -> (redacted Program id, target id) of admitted requests, for completion logs
        self.admitted: dict[str, tuple[str, str]] = {}
        self.completing: Completed | None = None  # the Completed message being stepped, if any

    def reply(self, request_id: str, value: Reply) -> None:
        channel = self.replies.pop(request_id, None)
        self.handle.pending_replies_count = len(self.replies)
        if channel is not None:
            reply_nowait(channel, value)

    def route(self, effects: Sequence[Any], now: float) -> None:
        m = self.metrics
        for e in effects:
            if isinstance(e, fx.Admit):
                target = self.handle.targets_by_id[e.target_id]
                program = redacted_id(e.program)
                log_event(
                    logger,
                    logging.DEBUG,
                    "request_dispatch",
                    program=program,
                    target=e.target_id,
                    router_queue_seconds=round(e.queue_wait_seconds, 6),
                    estimated_context_tokens=e.estimated_context_tokens,
                    placement_epoch=e.placement_epoch,
                    placement_start_request=e.placement_start_request,
                )
                self.admitted[e.request_id] = (program, e.target_id)
                self.reply(
                    e.request_id,
                    Admitted(
                        request_id=e.request_id, target=target, program=program, queue_seconds=e.queue_wait_seconds
                    ),
                )
            elif isinstance(e, fx.Reject):
                self.reply(
                    e.request_id,
                    Rejected(
                        request_id=e.request_id,
                        reason=e.reason,
                        status=e.status_hint,
                        message=e.message,
                        retry_after_seconds=self.handle.cfg.metrics_interval_seconds if e.status_hint == 429 else None,
                    ),
                )
            elif isinstance(e, fx.SpawnProgram):
                pass  # the actor is spawned on its first timer command (a Program without timers needs no task)
            elif isinstance(e, fx.ArmTimer):
                self.registry.arm(e.program, e.kind, e.deadline, e.token)
            elif isinstance(e, fx.CancelTimer):
                self.registry.cancel(e.program, e.kind)
            elif isinstance(e, fx.RetireProgram):
                self.registry.retire(e.program)
            elif isinstance(e, fx.Transition):
                self._transition(e)
            elif isinstance(e, fx.AdmissionCapacitySnapshot):
                self._admission(e)
            elif isinstance(e, fx.QueueWaitObserved):
                m.queue_wait_seconds.labels(e.target_id).observe(e.seconds)
            elif isinstance(e, fx.RequestIntervalObserved):
                m.request_interval_seconds.labels(e.target_id).observe(e.seconds)
                log_event(
                    logger, logging.DEBUG, "continuity_sample", target=e.target_id, interval_seconds=round(e.seconds, 6)
                )
            elif isinstance(e, fx.CacheMissImpactObserved):
                m.cache_miss_impact_seconds.labels(e.target_id).observe(e.seconds)
                self._cache_observation(e)
            elif isinstance(e, fx.TtlArmed):
                m.armed_ttl_seconds.labels(e.target_id, e.source).observe(e.ttl_seconds)
                log_event(
                    logger,
                    logging.DEBUG,
                    "ttl_armed",
                    program=redacted_id(e.program),
                    target=e.target_id,
                    request_ttl_seconds=e.ttl_seconds,
                    source=e.source,
                )
            elif isinstance(e, fx.SharedPrefixObserved):
                m.shared_prefix_observed_tokens.labels(e.target_id).observe(e.tokens)
            elif isinstance(e, fx.CacheDiscontinuity):
                log_event(
                    logger,
                    logging.INFO,
                    "unexpected_cache_discontinuity",
                    program=redacted_id(e.program),
                    target=e.target_id,
                    prompt_tokens=e.prompt_tokens,
                    cached_prompt_tokens=e.cached_prompt_tokens,
                    previous_context_tokens=e.previous_context_tokens,
                    cache_hit_vs_previous_context=round(e.cached_prompt_tokens / e.previous_context_tokens, 6)
                    if e.previous_context_tokens
                    else None,
                    uncached_prompt_tokens=e.uncached_prompt_tokens,
                    cache_miss_impact_seconds=round(e.cache_miss_impact_seconds, 6),
                    segment_served_rounds=e.segment_served_rounds,
                    placement_start_request=False,
                )
            elif isinstance(e, fx.CapacitySourceChanged):
                self._source_changed(e)
            elif isinstance(e, fx.StaleObservationDropped):
                log_event(
                    logger,
                    logging.WARNING,
                    "stale_capacity_observation_dropped",
                    target=e.target_id,
                    epoch_revision=e.epoch_revision,
                    current_revision=e.current_revision,
                )
            elif isinstance(e, fx.CompletionIgnored):
                log_event(logger, logging.DEBUG, "completion_ignored", reason=e.reason)
            else:
                raise TypeError(f"scheduler actor cannot route effect {e!r}")

    def _cache_observation(self, e: fx.CacheMissImpactObserved) -> None:
        msg = self.completing
        if msg is None:
            return
        program = self.admitted.get(msg.request_id, (None, None))[0]
        prompt, cached = msg.prompt_tokens, msg.cached_tokens
        log_event(
            logger,
            logging.DEBUG,
            "cache_observation",
            program=program,
            target=e.target_id,
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            uncached_prompt_tokens=None if prompt is None or cached is None else max(0, prompt - cached),
            cache_miss_impact_seconds=round(e.seconds, 6),
        )

    def _transition(self, e: fx.Transition) -> None:
        if e.counted and e.target_id is not None:
            self.metrics.transitions.labels(e.target_id, e.reason).inc()
        program = redacted_id(e.program)
        if e.reason in ADMIT_REASONS:
            log_event(
                logger,
                logging.INFO,
                "program_admit",
                program=program,
                target=e.target_id,
                forced=e.forced,
                batch_gain=e.batch_gain,
                used_tokens=_num(e.used_tokens),
                required_tokens=_num(e.required_tokens),
                reserve_tokens=_num(e.reserve_tokens),
                capacity_tokens=e.capacity_tokens,
            )
        elif e.from_state.startswith(ACTIVE_STATE) and e.to_state.startswith(PAUSED_STATE):
            log_event(
                logger,
                logging.INFO,
                "program_pause",
                program=program,
                target=e.target_id,
                reason=e.reason,
                released_private_tokens=_num(e.released_private_tokens),
            )
        else:
            log_event(
                logger,
                logging.DEBUG,
                "program_transition",
                program=program,
                target=e.target_id,
                from_state=e.from_state,
                to_state=e.to_state,
                reason=e.reason,
            )

    def _admission(self, e: fx.AdmissionCapacitySnapshot) -> None:
        m, t = self.metrics, e.target_id
        m.admission_used_tokens.labels(t).observe(e.used_tokens)
        m.admission_required_tokens.labels(t).observe(e.required_tokens)
        m.admission_growth_reserve_tokens.labels(t).observe(e.growth_reserve_tokens)
        if e.capacity_pressure_ratio is not None:
            m.admission_capacity_pressure_ratio.labels(t).observe(e.capacity_pressure_ratio)
        if e.projected_pressure_ratio is not None:
            m.admission_projected_pressure_ratio.labels(t).observe(e.projected_pressure_ratio)
        if e.backend_kv_usage_ratio is not None:
            m.admission_backend_kv_usage_ratio.labels(t).observe(e.backend_kv_usage_ratio)
        if e.backend_running_requests is not None:
            m.admission_backend_running_requests.labels(t).observe(e.backend_running_requests)
        if e.backend_waiting_requests is not None:
            m.admission_backend_waiting_requests.labels(t).observe(e.backend_waiting_requests)
        if e.observation_age_seconds is not None:
            m.admission_capacity_observation_age_seconds.labels(t).observe(e.observation_age_seconds)

    def _source_changed(self, e: fx.CapacitySourceChanged) -> None:
        age = None if e.observation_age_seconds is None else round(e.observation_age_seconds, 6)
        if e.source == "backend_observation":
            log_event(
                logger,
                logging.INFO,
                "capacity_observation_recovered",
                target=e.target_id,
                previous_capacity_accounting_source=e.previous_source,
                capacity_accounting_source=e.source,
                observation_age_seconds=age,
            )
        else:
            log_event(
                logger,
                logging.WARNING,
                "capacity_observation_fallback",
                target=e.target_id,
                previous_capacity_accounting_source=e.previous_source,
                capacity_accounting_source=e.source,
                observation_age_seconds=age,
                freshness_threshold_seconds=e.freshness_threshold_seconds,
            )


def _num(x: float | None) -> float | int | None:
    if x is None:
        return None
    return int(x) if float(x).is_integer() else round(x, 3)


def _hints(scope: Any) -> RequestHints:
    return RequestHints(
        request_id=scope.request_id,
        priority=scope.priority,
        deadline_seconds=scope.deadline_seconds,
        expected_output_length=scope.expected_output_length,
        kv_retention_ttl_seconds=scope.kv_retention_ttl_seconds,
    )


def to_core_events(msg: SchedulerMessage) -> list[ev.Event]:
    """Translate one inbox message into the core's input facts (one, or one per target)."""
    if isinstance(msg, ObservationStarted):
        return [ev.ObservationStarted(target_id=TargetId(t), epoch=msg.epoch) for t in msg.target_ids]
    return [to_core_event(msg)]


def to_core_event(msg: SchedulerMessage) -> ev.Event:
    """Translate one inbox message into the core's input fact."""
    if isinstance(msg, Submit):
        return ev.RequestSubmitted(
            request_id=RequestId(msg.request_id),
            identity=msg.parsed_identity.identity,
            estimated_prompt_tokens=msg.estimated_prompt_tokens,
            hints=_hints(msg.parsed_identity.scope),
            model_pool=DEFAULT_MODEL_POOL,
            routing_text=msg.routing_text,
        )
    if isinstance(msg, Completed):
        return ev.RequestCompleted(
            request_id=RequestId(msg.request_id),
            success=msg.success,
            usage=Usage(
                prompt_tokens=msg.prompt_tokens,
                cached_prompt_tokens=msg.cached_tokens,
                completion_tokens=msg.completion_tokens,
            ),
            decode_seconds=msg.decode_seconds,
        )
    if isinstance(msg, Abandoned):
        return ev.RequestAbandoned(request_id=RequestId(msg.request_id))
    if isinstance(msg, TimerFired):
        return ev.TimerFired(program=msg.program, kind=msg.kind, token=msg.token)
    if isinstance(msg, ObservationReceived):
        s = msg.sample
        return ev.ObservationReceived(
            target_id=TargetId(msg.target_id),
            epoch=msg.epoch,
            kv_cache_usage=None if s is None else s.kv_cache_usage,
            running_requests=None if s is None else s.running_requests,
            waiting_requests=None if s is None else s.waiting_requests,
            observed_at=msg.observed_at,
        )
    if isinstance(msg, RepairTick):
        return ev.RepairTick()
    raise TypeError(f"no core event for {msg!r}")


async def run_scheduler_actor(
    cfg: ProgramSchedulingConfig,
    targets: Sequence[BackendTarget],
    metrics: ProgramMetrics,
    *,
    on_tick: Callable[[SchedulerHandle, float], None] | None = None,
    health: HealthyTargets | None = None,
    task_status: trio.TaskStatus[SchedulerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Own the scheduler state; run until cancelled (or until a step raises, which stops the daemon).

    With ``health``, the targets given to the core are the healthy ones, re-synced at every tick
    and arrival: an unhealthy worker's ranks leave Program scheduling (their Programs fail over).
    """
    # See SCHEDULER_INBOX_SIZE for the bound.
    inbox: Mailbox[SchedulerMessage] = open_mailbox("scheduler_inbox", SCHEDULER_INBOX_SIZE)
    handle = SchedulerHandle(cfg, targets, inbox, initial_state(cfg))
    async with inbox.recv, trio.open_nursery() as nursery:
        registry: ProgramRegistry = await nursery.start(run_program_registry, inbox.send.clone())
        handle.registry = registry
        router = _Router(handle, metrics, registry)
        # The configured targets are known from the start (no Program state, no polling): the
        # diagnostics list every concrete DP rank before the first Program request.
        handle.health = health
        _sync_targets(handle, router, trio.current_time(), force=True)
        task_status.started(handle)
        try:
            async for msg in inbox.recv:
                now = trio.current_time()
                if isinstance(msg, (Submit, RepairTick)):
                    _sync_targets(handle, router, now)
                if isinstance(msg, Submit):
                    router.replies[msg.request_id] = msg.reply
                    handle.pending_replies_count = len(router.replies)
                elif isinstance(msg, ObservationReceived):
                    _log_capacity_observation(cfg, msg)
                events = to_core_events(msg)
                if isinstance(msg, (ObservationStarted, ObservationReceived)):
                    # ranks of workers the health board took out are still scraped: not news to the core
                    live = handle.synced_target_ids
                    events = [e for e in events if e.target_id in live]  # type: ignore[union-attr]
                router.completing = msg if isinstance(msg, Completed) else None
                for event in events:
                    result = step(handle.state, event, now=now, cfg=cfg)
                    handle.state = result.state
                    handle.steps_count += 1
                    handle.last_step_at = now
                    router.route(result.effects, now)
                if isinstance(msg, (Completed, Abandoned)):
                    router.admitted.pop(msg.request_id, None)
                router.completing = None
                handle.notify_stepped()
                if isinstance(msg, RepairTick) and on_tick is not None:
                    on_tick(handle, now)
        finally:
            for channel in router.replies.values():
                channel.close()
            nursery.cancel_scope.cancel()


def _sync_targets(handle: SchedulerHandle, router: _Router, now: float, *, force: bool = False) -> None:
    """Give the core the current (healthy) target list when it changed."""
    targets = (
        handle.targets
        if handle.health is None
        else tuple(sorted(handle.health.healthy_targets(), key=lambda t: t.index))
    )
    ids = tuple(t.target_id for t in targets)
    if ids == handle.synced_target_ids and not force:
        return
    handle.synced_target_ids = ids
    result = step(handle.state, ev.TargetsChanged(DEFAULT_MODEL_POOL, targets), now=now, cfg=handle.cfg)
    handle.state = result.state
    handle.steps_count += 1
    router.route(result.effects, now)


def _log_capacity_observation(cfg: ProgramSchedulingConfig, msg: ObservationReceived) -> None:
    s = msg.sample
    if s is None:
        return
    capacity = cfg.token_capacity_per_dp_rank
    native_used = None if capacity is None or s.kv_cache_usage is None else round(s.kv_cache_usage * capacity)
    log_event(
        logger,
        logging.DEBUG,
        "capacity_observation",
        target=msg.target_id,
        kv_cache_usage=s.kv_cache_usage,
        native_used_tokens=native_used,
        vllm_running_requests=s.running_requests,
        vllm_waiting_requests=s.waiting_requests,
        capacity_tokens=capacity,
        backend_kv_capacity_tokens=s.kv_capacity_tokens,
    )


# ---------------------------------------------------------------------------------------------
# Snapshots for /metrics and /scheduling/diagnostics (read between steps; never mutate)
# ---------------------------------------------------------------------------------------------


def diagnostics_snapshot(handle: SchedulerHandle, now: float) -> dict[str, Any]:
    """The core's diagnostics document (rendered from its frozen snapshot) plus a configuration summary."""
    from attrs import asdict

    from actors.core.snapshot import diagnostics_document, snapshot

    doc = diagnostics_document(snapshot(handle.state, handle.cfg, now))
    summary = asdict(handle.cfg, filter=lambda a, _v: a.name not in ("explicit_coefficients", "deprecated_inputs"))
    doc["configuration"] = summary
    doc["scheduler"] = {
        "steps_count": handle.steps_count,
        "last_step_at": handle.last_step_at,
        "pending_replies_count": handle.pending_replies_count,
    }
    return doc


def rank_gauges(handle: SchedulerHandle, now: float) -> tuple[RankGauges, ...]:
    """Gauge values per target (published at each tick), read from the core's frozen snapshot."""
    from actors.core.snapshot import snapshot

    return tuple(
        RankGauges(
            target_id=r.target_id,
            queue_size=r.queue_size,
            active_programs=r.active_programs,
            fitted_ttl_seconds=r.fitted_ttl_seconds,
            context_growth_tokens=r.context_growth_tokens,
            request_samples=r.request_samples,
            continuity_samples=r.continuity_samples,
            cache_miss_impact_rolling_mean_seconds=r.cache_miss_impact_rolling_mean_seconds,
            observation_fresh=r.observation_fresh,
        )
        for r in snapshot(handle.state, handle.cfg, now, include_programs=False).ranks
    )
