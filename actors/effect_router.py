"""How the scheduler actor carries out one step's effects (docs/architecture.md §3).

The pure core returns an ordered tuple of effects; :class:`EffectRouter` performs each one, in
order, through a static table ``effect type -> method``:

* ``Admit`` / ``Reject`` -> the waiting handler's one-shot reply channel (``send_nowait``; a
  handler that already left is followed by its ``RequestAbandoned``, which the core handles);
* ``ArmTimer`` / ``CancelTimer`` / ``RetireProgram`` -> the Program actors, through the
  :class:`~actors.program_registry.ProgramRegistry` (never awaited, so no cycle between the
  scheduler inbox and the Program inboxes can deadlock);
* ``Transition`` and the observation facts -> INFO/DEBUG log events and the
  ``vllm_router_agent_aware_*`` metrics (docs/operations.md).

An effect type missing from the table is a bug and raises ``TypeError`` (the daemon stops).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from actors.batch_metrics import BatchMetrics
from actors.core import effects as fx
from actors.core.config import BackendTarget, ProgramSchedulingConfig
from actors.core.errors import Rejection
from actors.core.events import RequestCompleted
from actors.core.ids import ProgramRef, redacted_id
from actors.dashboard_feed import DashboardFeed
from actors.logevents import get_logger, log_event
from actors.messages import Admitted, QueuePosition, Reply, ReplySink
from actors.program_metrics import ProgramMetrics
from actors.program_registry import ProgramRegistry

logger = get_logger("program.scheduler")


class _Children(dict[Any, Any]):
    """A metric's labelled children by label value (a tuple for several labels), resolved once:
    ``labels()`` validates and locks on every call, a dict hit does not (docs/benchmarks.md
    §10.3.1).  Children are never removed from these metrics, so a cached child stays the one
    ``/metrics`` renders."""

    def __init__(self, metric: Any) -> None:
        super().__init__()
        self.metric = metric

    def __missing__(self, key: Any) -> Any:
        child = self[key] = self.metric.labels(*key) if isinstance(key, tuple) else self.metric.labels(key)
        return child


PAUSED_STATE = "paused"
ACTIVE_STATE = "active"
ADMIT_REASONS = ("program_admit", "batch_gain_admit", "force_resume", "pass_race_admit")
REDACTED_KEPT = 4096


class EffectRouter:
    """Performs the effects of the scheduler's steps (the scheduler actor's I/O side)."""

    def __init__(
        self,
        cfg: ProgramSchedulingConfig,
        targets_by_id: dict[str, BackendTarget],
        metrics: ProgramMetrics,
        registry: ProgramRegistry,
        feed: DashboardFeed | None = None,
        batch_metrics: BatchMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.batch_metrics = batch_metrics
        self.feed = feed  # the dashboard's bounded event ring and tick history
        self.targets_by_id = targets_by_id
        self.metrics = metrics
        self.registry = registry
        self.replies: dict[str, ReplySink] = {}
        # requests whose handler wants QueuePosition notices while they wait (docs/program-scheduling.md §13)
        self.queue_updates: set[str] = set()
        # request id -> redacted Program id of admitted requests, for completion logs
        self.admitted: dict[str, str] = {}
        self.completing: RequestCompleted | None = None  # the completion being stepped, if any
        # the batch dispatcher's preemption hook (cancels the request's forward), when batch is on
        self.on_preempt: Callable[[str], None] | None = None
        # the Program dispatcher's hook for a long prefill asked back (docs/priority.md §3): it
        # aborts the request's forward when nothing of its answer reached the client yet and
        # returns an outcome of ``REQUEUE_OUTCOMES``
        self.on_requeue: Callable[[str], str] | None = None
        # the data-plane hub's hook for a Program whose lifecycle moved (a Transition or its
        # retirement): it revokes the Program's resume pass when it stopped being Active where the
        # pass sends its requests (docs/architecture.md §9); None with one process and in the simulator
        # (called with the Transition's reason, None for a retirement)
        self.on_program_change: Callable[[ProgramRef, str | None], None] | None = None
        self._transitions = _Children(metrics.transitions)
        self._admission_children = tuple((field, _Children(h)) for field, h in metrics.admission)
        self._queue_wait_children = _Children(metrics.queue_wait_seconds)
        self._interval_children = _Children(metrics.request_interval_seconds)
        self._impact_children = _Children(metrics.cache_miss_impact_seconds)
        self._ttl_children = _Children(metrics.armed_ttl_seconds)
        self._prompt_tokens = _Children(metrics.program_prompt_tokens)
        self._recomputed_tokens = _Children(metrics.program_recomputed_tokens)
        self._recompute_seconds = _Children(metrics.program_recompute_seconds)
        self._shared_prefix_children = _Children(metrics.shared_prefix_observed_tokens)
        # the event metrics' updates, applied in bulk before every scrape and at every tick
        # (actors/metric_batch.py; docs/benchmarks.md §10.2.6)
        self.batch = metrics.batch
        self._redacted: dict[ProgramRef, str] = {}  # Program -> its redacted id (at most REDACTED_KEPT)

    def expect_reply(self, request_id: str, reply: ReplySink, *, queue_updates: bool = False) -> None:
        self.replies[request_id] = reply
        if queue_updates:
            self.queue_updates.add(request_id)

    def forget(self, request_id: str) -> None:
        """The request left (completed or abandoned): drop what was kept for it, including the reply
        channel of a request abandoned while it still waited (the handler is gone)."""
        self.admitted.pop(request_id, None)
        self.queue_updates.discard(request_id)
        channel = self.replies.pop(request_id, None)
        if channel is not None:
            channel.close()

    def close_replies(self) -> None:
        """Shutting down: every waiting handler sees its reply channel close (``ActorGone``)."""
        for channel in self.replies.values():
            channel.close()
        self.replies.clear()
        self.queue_updates.clear()

    def route(self, effects: Sequence[Any]) -> None:
        routes = _ROUTES
        for e in effects:
            perform = routes.get(type(e))
            if perform is None:
                raise TypeError(f"scheduler actor cannot route effect {e!r}")
            perform(self, e)

    # ---- replies -----------------------------------------------------------------------------

    def _reply(self, request_id: str, value: Reply) -> None:
        self.queue_updates.discard(request_id)
        channel = self.replies.pop(request_id, None)
        if channel is not None:  # answered exactly once, then closed (a handler already gone: dropped)
            try:
                channel.send_nowait(value)
            except trio.BrokenResourceError:
                pass
            finally:
                channel.close()

    def _queue_eta_told(self, e: fx.QueueEtaTold) -> None:
        """A notice to a waiting handler that asked for them; dropped when the previous one is
        still unread, so the room of the final reply is never taken (docs/program-scheduling.md §13)."""
        if e.request_id not in self.queue_updates:
            return
        channel = self.replies.get(e.request_id)
        if channel is None or channel.statistics().current_buffer_used > 0:
            return
        try:
            channel.send_nowait(QueuePosition(request_id=e.request_id, position=e.position, eta_seconds=e.eta_seconds))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the handler left (its RequestAbandoned follows) or has not read: nothing to do

    def _queue_eta_observed(self, e: fx.QueueEtaObserved) -> None:
        self.batch.observe(self.metrics.queue_eta_relative_error, e.relative_error)
        log_event(
            logger,
            logging.DEBUG,
            "queue_eta_observed",
            target=e.target_id,
            eta_seconds=round(e.eta_seconds, 6),
            wait_seconds=round(e.wait_seconds, 6),
            relative_error=round(e.relative_error, 6),
        )

    def _admit(self, e: fx.Admit) -> None:
        program = self._redacted.get(e.program)
        if program is None:  # (a hash per Program, not per admission; bounded)
            if len(self._redacted) >= REDACTED_KEPT:
                self._redacted.clear()
            program = self._redacted[e.program] = redacted_id(e.program)
        if _debug():
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
        self.admitted[e.request_id] = program
        admitted = Admitted(
            request_id=e.request_id,
            target=self.targets_by_id[e.target_id],
            program=program,
            queue_seconds=e.queue_wait_seconds,
            requeueable=e.requeueable,
        )
        self._reply(e.request_id, admitted)
        # the queue wait of every Program admission (was an effect of its own after the Admit)
        self.batch.observe(self._queue_wait_children[e.target_id], e.queue_wait_seconds)
        if self.feed is not None:
            self.feed.queue_wait(e.queue_wait_seconds)

    def _requeue_prefill(self, e: fx.RequeuePrefill) -> None:
        """A long prefill blocks a light tenant (docs/priority.md §3): the Program dispatcher takes
        it back if its answer has not started (the request then sends ``RequestRequeued``)."""
        outcome = self.on_requeue(e.request_id) if self.on_requeue is not None else "not_requeueable"
        self.metrics.prefill_requeues.labels(outcome).inc()
        log_event(
            logger,
            logging.INFO,
            "prefill_requeue",
            program=redacted_id(e.program),
            target=e.target_id,
            tenant=e.tenant,
            light_tenants=",".join(e.light_tenants),
            estimated_prefill_end=round(e.estimated_prefill_end, 6),
            outcome=outcome,
        )

    def _admit_batch(self, e: fx.AdmitBatch) -> None:
        log_event(
            logger,
            logging.DEBUG,
            "batch_dispatch",
            job=e.job,
            target=e.target_id,
            router_queue_seconds=round(e.queue_wait_seconds, 6),
            predicted_decode_tokens=e.predicted_decode_tokens,
            charged_tokens=e.charged_tokens,
            starvation_escape=e.starvation_escape,
        )
        if self.batch_metrics is not None:
            self.batch_metrics.admitted.labels("true" if e.starvation_escape else "false").inc()
            self.batch_metrics.queue_wait_seconds.observe(e.queue_wait_seconds)
        admitted = Admitted(
            request_id=e.request_id,
            target=self.targets_by_id[e.target_id],
            program=f"batch:{e.job}",
            queue_seconds=e.queue_wait_seconds,
        )
        # the channel stays open: a preempted batch request is admitted again on it; it is
        # closed when the request completes or is abandoned (``forget``)
        channel = self.replies.get(e.request_id)
        if channel is not None:
            try:
                channel.send_nowait(admitted)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.replies.pop(e.request_id, None)  # the handler left; its RequestAbandoned follows

    def _admit_interactive(self, e: fx.AdmitInteractive) -> None:
        log_event(
            logger,
            logging.DEBUG,
            "interactive_dispatch",
            target=e.target_id,
            router_queue_seconds=round(e.queue_wait_seconds, 6),
            priority=e.priority,
            charged_tokens=e.charged_tokens,
        )
        admitted = Admitted(
            request_id=e.request_id,
            target=self.targets_by_id[e.target_id],
            program="interactive",
            queue_seconds=e.queue_wait_seconds,
        )
        self._reply(e.request_id, admitted)

    def _preempt_batch(self, e: fx.PreemptBatch) -> None:
        log_event(logger, logging.DEBUG, "batch_preempted", job=e.job, target=e.target_id, freed_tokens=e.freed_tokens)
        if self.batch_metrics is not None:
            self.batch_metrics.preempted.inc()
        if self.on_preempt is not None:
            self.on_preempt(e.request_id)

    def _batch_completed(self, e: fx.BatchCompleted) -> None:
        if self.batch_metrics is None:
            return
        self.batch_metrics.completed.labels("success" if e.success else "failure").inc()
        if e.observed_decode_tokens is not None and e.predicted_decode_tokens > 0:
            self.batch_metrics.decode_ratio.observe(e.observed_decode_tokens / e.predicted_decode_tokens)

    def _batch_job_created(self, e: fx.BatchJobCreated) -> None:
        log_event(logger, logging.INFO, "batch_job_created", job=e.job)
        if self.batch_metrics is not None:
            self.batch_metrics.jobs_created.inc()

    def _batch_job_evicted(self, e: fx.BatchJobEvicted) -> None:
        log_event(logger, logging.INFO, "batch_job_evicted", job=e.job, reason="max_jobs")
        if self.batch_metrics is not None:
            self.batch_metrics.jobs_evicted.inc()

    def _reject(self, e: fx.Reject) -> None:
        retry_after = e.retry_after_seconds
        if retry_after is None and e.status_hint == 429:
            retry_after = self.cfg.metrics_interval_seconds
        rejection = Rejection(
            reason=e.reason, status_hint=e.status_hint, message=e.message, retry_after_seconds=retry_after
        )
        self._reply(e.request_id, rejection)

    # ---- Program actors ------------------------------------------------------------------------

    def _spawn(self, e: fx.SpawnProgram) -> None:
        """Nothing to do: a Program's actor starts on its first timer command (most need none)."""

    def _arm(self, e: fx.ArmTimer) -> None:
        self.registry.arm(e)

    def _cancel(self, e: fx.CancelTimer) -> None:
        self.registry.cancel(e)

    def _retire(self, e: fx.RetireProgram) -> None:
        self.registry.retire(e.program)
        if self.on_program_change is not None:
            self.on_program_change(e.program, None)

    # ---- logs and metrics ----------------------------------------------------------------------

    def _transition(self, e: fx.Transition) -> None:
        if self.on_program_change is not None:
            self.on_program_change(e.program, e.reason)
        if e.counted and e.target_id is not None:
            self.batch.inc(self._transitions[e.target_id, e.reason])
        if self.feed is not None:
            self.feed.transition(e, trio.current_time())
        admit = e.reason in ADMIT_REASONS
        pause = not admit and e.from_state.startswith(ACTIVE_STATE) and e.to_state.startswith(PAUSED_STATE)
        if not logger.isEnabledFor(logging.INFO if admit or pause else logging.DEBUG):
            return  # (before the Program's id is hashed for a line nobody writes)
        program = redacted_id(e.program)
        if admit:
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
        elif pause:
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
        target = e.target_id
        observe = self.batch.observe
        for field, children in self._admission_children:
            value = getattr(e, field)
            if value is not None:
                observe(children[target], value)

    def _interval(self, e: fx.RequestIntervalObserved) -> None:
        self.batch.observe(self._interval_children[e.target_id], e.seconds)
        if _debug():
            log_event(
                logger, logging.DEBUG, "continuity_sample", target=e.target_id, interval_seconds=round(e.seconds, 6)
            )

    def _impact(self, e: fx.CacheMissImpactObserved) -> None:
        self.batch.observe(self._impact_children[e.target_id], e.seconds)
        done = self.completing
        if done is None or not _debug():
            return
        prompt, cached = done.usage.prompt_tokens, done.usage.cached_prompt_tokens
        log_event(
            logger,
            logging.DEBUG,
            "cache_observation",
            program=self.admitted.get(done.request_id),
            target=e.target_id,
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            uncached_prompt_tokens=None if prompt is None or cached is None else max(0, prompt - cached),
            cache_miss_impact_seconds=round(e.seconds, 6),
        )

    def _ttl_armed(self, e: fx.TtlArmed) -> None:
        self.batch.observe(self._ttl_children[e.target_id, e.source], e.ttl_seconds)
        if not _debug():
            return
        log_event(
            logger,
            logging.DEBUG,
            "ttl_armed",
            program=redacted_id(e.program),
            target=e.target_id,
            request_ttl_seconds=e.ttl_seconds,
            source=e.source,
            tool=e.tool,
        )

    def _time_attributed(self, e: fx.TimeAttributed) -> None:
        m = self.metrics
        inc = self.batch.inc
        queue, prefill, recompute, decode, between = m.time_parts
        if e.queue_seconds > 0:
            inc(queue, e.queue_seconds)
        if e.prefill_seconds > 0:
            inc(prefill, e.prefill_seconds)
        if e.recompute_seconds > 0:
            inc(recompute, e.recompute_seconds)
        if e.decode_seconds > 0:
            inc(decode, e.decode_seconds)
        if e.between_turns_seconds > 0:
            inc(between, e.between_turns_seconds)
        if not e.completed:
            return
        prompt_tokens = self._prompt_tokens
        if e.cached_tokens:
            inc(prompt_tokens["cached"], e.cached_tokens)
        if e.new_tokens:
            inc(prompt_tokens["new"], e.new_tokens)
        if e.recomputed_tokens and e.cause is not None:
            inc(prompt_tokens["recomputed"], e.recomputed_tokens)
            inc(self._recomputed_tokens[e.cause], e.recomputed_tokens)
            if e.recompute_seconds > 0:
                inc(self._recompute_seconds[e.cause], e.recompute_seconds)
        if e.estimated_split:
            inc(m.program_split_estimated)

    def _shared_prefix(self, e: fx.SharedPrefixObserved) -> None:
        self.batch.observe(self._shared_prefix_children[e.target_id], e.tokens)

    def _discontinuity(self, e: fx.CacheDiscontinuity) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return  # (before the Program's id is hashed for a line nobody writes)
        previous = e.previous_context_tokens
        log_event(
            logger,
            logging.INFO,
            "unexpected_cache_discontinuity",
            program=redacted_id(e.program),
            target=e.target_id,
            prompt_tokens=e.prompt_tokens,
            cached_prompt_tokens=e.cached_prompt_tokens,
            previous_context_tokens=previous,
            cache_hit_vs_previous_context=round(e.cached_prompt_tokens / previous, 6) if previous else None,
            uncached_prompt_tokens=e.uncached_prompt_tokens,
            cache_miss_impact_seconds=round(e.cache_miss_impact_seconds, 6),
            segment_served_rounds=e.segment_served_rounds,
            placement_start_request=False,
        )

    def _source_changed(self, e: fx.CapacitySourceChanged) -> None:
        fields: dict[str, Any] = {
            "target": e.target_id,
            "previous_capacity_accounting_source": e.previous_source,
            "capacity_accounting_source": e.source,
            "observation_age_seconds": None
            if e.observation_age_seconds is None
            else round(e.observation_age_seconds, 6),
        }
        if e.source == "backend_observation":
            log_event(logger, logging.INFO, "capacity_observation_recovered", **fields)
        else:
            fields["freshness_threshold_seconds"] = e.freshness_threshold_seconds
            log_event(logger, logging.WARNING, "capacity_observation_fallback", **fields)

    def _stale_dropped(self, e: fx.StaleObservationDropped) -> None:
        log_event(
            logger,
            logging.WARNING,
            "stale_capacity_observation_dropped",
            target=e.target_id,
            epoch_revision=e.epoch_revision,
            current_revision=e.current_revision,
        )

    def _completion_ignored(self, e: fx.CompletionIgnored) -> None:
        log_event(logger, logging.DEBUG, "completion_ignored", reason=e.reason)


_ROUTES: dict[type, Callable[[EffectRouter, Any], None]] = {
    fx.Admit: EffectRouter._admit,
    fx.Reject: EffectRouter._reject,
    fx.AdmitBatch: EffectRouter._admit_batch,
    fx.AdmitInteractive: EffectRouter._admit_interactive,
    fx.PreemptBatch: EffectRouter._preempt_batch,
    fx.RequeuePrefill: EffectRouter._requeue_prefill,
    fx.BatchCompleted: EffectRouter._batch_completed,
    fx.BatchJobCreated: EffectRouter._batch_job_created,
    fx.BatchJobEvicted: EffectRouter._batch_job_evicted,
    fx.SpawnProgram: EffectRouter._spawn,
    fx.ArmTimer: EffectRouter._arm,
    fx.CancelTimer: EffectRouter._cancel,
    fx.RetireProgram: EffectRouter._retire,
    fx.Transition: EffectRouter._transition,
    fx.AdmissionCapacitySnapshot: EffectRouter._admission,
    fx.QueueEtaTold: EffectRouter._queue_eta_told,
    fx.QueueEtaObserved: EffectRouter._queue_eta_observed,
    fx.RequestIntervalObserved: EffectRouter._interval,
    fx.CacheMissImpactObserved: EffectRouter._impact,
    fx.TtlArmed: EffectRouter._ttl_armed,
    fx.TimeAttributed: EffectRouter._time_attributed,
    fx.SharedPrefixObserved: EffectRouter._shared_prefix,
    fx.CacheDiscontinuity: EffectRouter._discontinuity,
    fx.CapacitySourceChanged: EffectRouter._source_changed,
    fx.StaleObservationDropped: EffectRouter._stale_dropped,
    fx.CompletionIgnored: EffectRouter._completion_ignored,
}


def _debug() -> bool:
    """Whether DEBUG log events are on (checked before their fields are built: the hot path)."""
    return logger.isEnabledFor(logging.DEBUG)


def _num(x: float | None) -> float | int | None:
    if x is None:
        return None
    return int(x) if float(x).is_integer() else round(x, 3)
