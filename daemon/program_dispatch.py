"""Program scheduling as a daemon service: the :class:`ProgramDispatcher` and its actors.

``run_program_scheduling(cfg, client, registry, *, task_status)`` is started by the supervisor
(``nursery.start``) when ``cfg.program_scheduling`` is set.  It starts the scheduler actor (which
owns the Program actors' nursery through its registry), registers the
``vllm_router_agent_aware_*`` metrics on the daemon's registry, and hands back a
:class:`ProgramDispatcher`.  The rank actors and their observation pacer (backend ``/metrics``
polling and the periodic tick) start *lazily*, when the first request carrying Program identity
arrives: identity-free traffic creates no Program state and triggers no backend polling.

:class:`ProgramDispatcher` implements the proxy's ``Dispatcher`` protocol:

* ``lease(req)`` sends the core's ``RequestSubmitted`` (with the prompt-token estimate of
  :class:`TokenEstimator`) to the scheduler actor and waits for ``Admitted`` (the request was
  retained in the RequestPool until then) or a ``Rejection`` (queue timeout -> 429 with
  ``Retry-After``; no targets -> 503);
* ``lease.finish(outcome)`` reports ``RequestCompleted`` with the usage exactly once;
* leaving the lease without ``finish`` (client gone, cancellation) sends ``RequestAbandoned`` from
  a shielded ``finally``, so a disconnect never leaks ledger capacity.  That send is never given
  up: it waits, shielded, for room in the scheduler inbox (which the scheduler never stops
  draining) and ends only when delivered or when the scheduler is gone; each release that had to
  wait is counted (``release_waits_count``, docs/operations.md §11).

``diagnostics()`` renders the ``/scheduling/diagnostics`` document (docs/operations.md,
Reference) from the latest scheduler state, the rank actors' published snapshots and each
channel's statistics.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs
import httpx
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from actors.batch_metrics import BatchGaugeCollector, BatchMetrics
from actors.core import fairness
from actors.core.batch_class import MAX_PREEMPTIONS_PER_REQUEST, batch_diagnostics
from actors.core.config import BackendTarget, ProgramSchedulingConfig
from actors.core.errors import NO_TARGETS, Rejection
from actors.core.events import (
    BatchSubmitted,
    InteractiveSubmitted,
    RequestAbandoned,
    RequestCompleted,
    RequestRequeued,
    RequestSubmitted,
)
from actors.core.ids import RequestId, TargetId
from actors.core.model import NO_USAGE
from actors.dashboard_feed import DashboardFeed
from actors.dashboard_view import dashboard_document
from actors.logevents import get_logger
from actors.mailbox import ActorGone, ReplySlot
from actors.messages import Admitted, QueuePosition, Reply, ReplySink, Submission
from actors.metric_children import Children
from actors.program_metrics import GaugeSnapshot, ProgramMetrics, TokenEstimateGauge
from actors.rank_registry import RankRegistry, run_rank_registry
from actors.scheduler_actor import SchedulerHandle, diagnostics_snapshot, rank_gauges, run_scheduler_actor
from daemon.config import AgentdConfig
from daemon.dispatch import DispatchRejected, HealthView, Outcome, ProxyRequest, Requeued
from daemon.health import HealthBoard

DEFAULT_TOKENS_PER_BYTE = 0.25  # the estimator's starting coefficient (about 4 UTF-8 bytes per token)
SCHEDULER_UNAVAILABLE = Rejection(
    reason="scheduler_unavailable", status_hint=503, message="Program scheduling is shutting down"
)
logger = get_logger("program.service")


class TokenEstimator:
    """The prompt-token estimate, made in this one place (docs/architecture.md §4).

    A prompt given as token ids counts exactly.  Otherwise the estimate is
    ``max(1, ceil(text_bytes * coef))`` with one momentum coefficient per (model pool, endpoint),
    starting at ``DEFAULT_TOKENS_PER_BYTE`` and refined from the prompt token counts the workers
    report: ``coef = 0.9 * coef + 0.1 * clamp(prompt / bytes, 0.01, 4)`` (the reference router's
    estimator, docs/program-scheduling.md §2).

    With ``clock`` (deterministic virtual time, ``agentd simulate``) the feedback of one instant is
    held and applied, sorted by its content, once the clock has moved on: the handlers report
    same-instant completions in task wake order, and the momentum is order-dependent, so applying
    them as they come would make estimates (and every decision using them) depend on that order.
    Estimates made at an instant see the coefficients of the instants before it.
    """

    def __init__(self, metrics: ProgramMetrics, *, clock: Callable[[], float] | None = None) -> None:
        self.coefficients: dict[tuple[str, str], float] = {}
        self._metrics = metrics
        self._feedback = Children(metrics.token_estimate_feedback)  # (pool, endpoint, kind) -> child
        self._batch = metrics.batch  # applied before every scrape (actors/metric_batch.py)
        self._clock = clock
        self._held: list[tuple[tuple[str, str], float]] = []  # (key, observed) of the instant _held_at
        self._held_at = -math.inf

    def _apply_held(self) -> None:
        """Apply the held feedback once the clock has left its instant (see the class docstring)."""
        if self._held and self._clock is not None and self._clock() > self._held_at:
            held, self._held = sorted(self._held), []
            for key, observed in held:
                self._update(key, observed)

    def _update(self, key: tuple[str, str], observed: float) -> None:
        old = self.coefficients.get(key, DEFAULT_TOKENS_PER_BYTE)
        self.coefficients[key] = 0.9 * old + 0.1 * observed

    def estimate(self, pool: str, req: ProxyRequest) -> int:
        exact = req.prompt.exact_tokens
        if exact is not None:
            return max(1, exact)
        self._apply_held()
        coef = self.coefficients.get((pool, req.endpoint), DEFAULT_TOKENS_PER_BYTE)
        return max(1, math.ceil(req.prompt.text_bytes * coef))

    def feedback(self, pool: str, req: ProxyRequest, prompt_tokens: int | None) -> None:
        key = (pool, req.endpoint)
        if prompt_tokens is None:
            self._batch.inc(self._feedback.get(pool, req.endpoint, "missing"))
            return
        self._batch.inc(self._feedback.get(pool, req.endpoint, "observed"))
        nbytes = req.prompt.text_bytes
        if req.prompt.exact_tokens is not None or nbytes <= 0 or prompt_tokens <= 0:
            return  # token-id prompts say nothing about tokens per byte
        observed = min(4.0, max(0.01, prompt_tokens / nbytes))
        if self._clock is None:
            self._update(key, observed)
            return
        self._apply_held()
        self._held.append((key, observed))
        self._held_at = self._clock()

    def gauges(self) -> tuple[TokenEstimateGauge, ...]:
        self._apply_held()
        return tuple(TokenEstimateGauge(p, e, c) for (p, e), c in sorted(self.coefficients.items()))


@attrs.define(eq=False)
class ProgramLease:
    """A dispatch decision for one request (the proxy's ``Lease``)."""

    target: BackendTarget
    request_id: str
    program: str
    queue_seconds: float
    wants_usage: bool = True  # usage drives Program accounting: the proxy must obtain it
    attempt: int = 0  # > 0: a preempted batch request (or a re-queued long prefill) sent again
    outcome: Outcome | None = None
    reported: bool = False
    _send: trio.MemorySendChannel[Any] | None = None
    # a long prefill the scheduler may take back before its first token (docs/priority.md §3,
    # "Re-queueing a blocking long prefill"): the forward that runs now, registered with the
    # dispatcher (``ProgramDispatcher.requeue``), and whether the scheduler took it back
    requeueable: bool = False
    requeue_requested: bool = False
    # report the completion when the lease is left (after the answer's last write, in the request's
    # task when the scheduler is idle) instead of from ``finish``: a real clock only
    # (docs/architecture.md §3, "Handled in the sender's task")
    report_on_exit: bool = False
    dropped: bool = False  # refused while it waited again: the core no longer has the request
    _runs: dict[str, _RequeueRun] | None = None
    # the dispatcher's wording of a refusal (``ProgramDispatcher.explain``): a re-admission refused
    # for ``no_targets`` names each worker's reason as the first admission's refusal does
    _explain: Callable[[Rejection], Rejection] | None = None

    def attempt_scope(self, committed: Callable[[], bool]) -> trio.CancelScope:
        """Register the forward about to run (``committed()``: a byte of its answer reached the
        client); the returned scope is cancelled when the scheduler takes the request back."""
        scope = trio.CancelScope()
        if self._runs is not None:
            self._runs[self.request_id] = _RequeueRun(self, scope, committed)
        return scope

    def attempt_done(self) -> None:
        if self._runs is not None:
            self._runs.pop(self.request_id, None)

    async def readmit(self) -> None:
        """The request was taken back: tell the scheduler (``RequestRequeued``) and wait for its
        next admission; ``DispatchRejected`` when it is refused instead (the core dropped it)."""
        if self._send is None:
            raise RuntimeError(f"Program lease {self.request_id} cannot be re-admitted")
        self.requeue_requested = False
        reply_send, reply_recv = trio.open_memory_channel[Reply](1)  # one final reply, no notices
        with reply_recv:
            with reply_send:
                event = RequestRequeued(request_id=RequestId(self.request_id))
                await self._send.send(Submission(event=event, reply=reply_send.clone()))
            try:
                reply = await reply_recv.receive()
            except trio.EndOfChannel:
                raise DispatchRejected(SCHEDULER_UNAVAILABLE) from None
        if isinstance(reply, Rejection):
            self.dropped = True
            raise DispatchRejected(reply if self._explain is None else self._explain(reply))
        assert isinstance(reply, Admitted)
        self.target = reply.target
        self.queue_seconds += reply.queue_seconds
        self.requeueable = reply.requeueable
        self.attempt += 1

    def finish(self, outcome: Outcome) -> None:
        if self.requeue_requested:
            raise Requeued(self.request_id)  # taken back: this attempt's answer goes nowhere
        if self.outcome is not None:
            raise RuntimeError(f"Program lease {self.request_id} finished twice")
        self.outcome = outcome
        if self._send is not None and not self.report_on_exit:
            try:
                self._send.send_nowait(completed_message(self.request_id, outcome))
                self.reported = True
            except trio.WouldBlock:
                pass  # reported (awaiting) when the lease context exits
            except trio.BrokenResourceError:
                self.reported = True  # the scheduler is gone: nothing left to account


@attrs.define(eq=False)
class _RequeueRun:
    """The forward of a requeueable Program request that runs now (``ProgramLease.attempt_scope``)."""

    lease: ProgramLease
    scope: trio.CancelScope
    committed: Callable[[], bool]


def output_cap(body: dict[str, Any]) -> int | None:
    """The request's output-token cap (``max_completion_tokens``, ``max_tokens`` or the Responses
    API's ``max_output_tokens``), when it set a positive integer one."""
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def completed_message(request_id: str, outcome: Outcome) -> RequestCompleted:
    return RequestCompleted(
        request_id=RequestId(request_id),
        success=outcome.success,
        usage=NO_USAGE if outcome.usage is None else outcome.usage,
        decode_seconds=outcome.decode_seconds,
        finish_reason=outcome.finish_reason,
        tool_names=outcome.tool_names,
    )


@attrs.define
class PassCounters:
    """The resume passes of relay processes (docs/architecture.md §9; the ``data_plane``
    diagnostics' ``passes``, docs/operations.md §13.3); always 0 with one process."""

    issued_count: int = 0  # Grants that carried a pass
    revoked_count: int = 0  # Revoke frames sent
    passed_count: int = 0  # requests a relay forwarded under a pass (their Asks)
    crossed_count: int = 0  # ... whose pass had been revoked when their Ask arrived
    # ... that the core could not dispatch as one process would have: admitted where they were
    # (``pass_race_admit``), dispatched on another placement, or refused (their target was gone)
    races_count: int = 0


class PassCollector(Collector):
    """``agentd_data_plane_passed_requests_total`` and ``agentd_data_plane_pass_races_total`` from
    the counters at scrape time (docs/operations.md §13.3)."""

    def __init__(self, counters: PassCounters) -> None:
        self.counters = counters

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = self.counters
        yield CounterMetricFamily(
            "agentd_data_plane_passed_requests",
            "Program requests a relay forwarded under a resume pass, without waiting for the scheduler.",
            value=c.passed_count,
        )
        yield CounterMetricFamily(
            "agentd_data_plane_pass_races",
            "Passed requests the scheduler could not dispatch as one process would: admitted where they "
            "were (pass_race_admit), accounted on another placement, or refused.",
            value=c.races_count,
        )


@attrs.define
class DispatcherCounters:
    submitted_count: int = 0
    admitted_count: int = 0
    rejected_count: int = 0
    completed_count: int = 0
    abandoned_count: int = 0
    # long prefills taken back before their first token (docs/priority.md §3)
    requeued_count: int = 0
    # releases (completion or abandon) that found the scheduler inbox full and waited for room
    release_waits_count: int = 0

    def open_leases(self) -> int:
        """Requests submitted and not yet answered by a rejection, a completion or an abandon."""
        return self.submitted_count - self.rejected_count - self.completed_count - self.abandoned_count


@attrs.frozen(eq=False)
class InteractiveDispatcher:
    """The proxy's dispatcher for identity-free interactive requests when ``[priority]
    interactive_scheduling`` is on (docs/priority.md §5.5): they wait in the scheduler, which
    admits them ahead of queued Programs and batch work, and end like Program requests."""

    program: ProgramDispatcher

    def lease(self, req: ProxyRequest) -> AbstractAsyncContextManager[ProgramLease]:
        return self.program.lease_interactive(req)


@attrs.frozen(eq=False)
class BatchDispatcher:
    """The proxy's dispatcher for batch-class requests (docs/batch.md §2).

    ``serve(req, forward)`` submits the request to the scheduler's batch queue and runs
    ``forward(lease)`` each time it is admitted.  A non-streaming request is preemptible: when the
    scheduler preempts it (:meth:`preempt`, called by the scheduler actor while it routes the
    ``PreemptBatch`` effect), its forward is cancelled -- the upstream call closes, nothing has
    reached the client -- and it waits for its next admission on the same reply channel.  Once
    the answer is complete (``lease.finish`` ran) a preemption no longer cancels anything; the
    scheduler then counts the late completion.
    """

    program: ProgramDispatcher
    runs: dict[str, _BatchRun] = attrs.field(factory=dict)

    def preempt(self, request_id: str) -> None:
        run = self.runs.get(request_id)
        if run is None:
            return
        run.preempted += 1
        if run.scope is not None and (run.lease is None or run.lease.outcome is None):
            run.scope.cancel()

    async def serve(self, req: ProxyRequest, forward: Callable[[ProgramLease], Awaitable[object]]) -> None:
        program = self.program
        if req.batch_job is None:
            raise ValueError("BatchDispatcher.serve needs a batch-class request")
        program._polling_needed.set()
        inbox = program.scheduler.inbox.send
        event = BatchSubmitted(
            request_id=RequestId(req.request_id),
            job=req.batch_job,
            estimated_prompt_tokens=program.estimator.estimate(req.model_pool, req),
            max_tokens=output_cap(req.body),
            model_pool=req.model_pool,
            targets=program.pool_targets(req),
            preemptible=not req.stream,
            tenant=req.prio.tenant,
            priority=req.prio.priority,
        )
        run = self.runs[req.request_id] = _BatchRun()
        submitted = False
        lease: ProgramLease | None = None
        try:
            # one admission per preemption at most, plus the first: they never block the scheduler
            reply_send, reply_recv = trio.open_memory_channel[Reply](MAX_PREEMPTIONS_PER_REQUEST + 1)
            with reply_recv:
                with reply_send:
                    await inbox.send(Submission(event=event, reply=reply_send.clone()))
                    submitted = True
                    program.counters.submitted_count += 1
                admissions = 0
                while True:
                    try:
                        reply = await reply_recv.receive()
                    except trio.EndOfChannel:
                        raise ActorGone("scheduler actor stopped") from None
                    if isinstance(reply, QueuePosition):
                        continue  # batch submissions do not ask for queue notices
                    if isinstance(reply, Rejection):
                        submitted = False  # the core already dropped the request
                        program.counters.rejected_count += 1
                        raise DispatchRejected(program.explain(reply))
                    admissions += 1
                    if admissions <= run.preempted:
                        continue  # preempted before this admission's forward started
                    program.counters.admitted_count += 1
                    lease = ProgramLease(
                        target=reply.target,
                        request_id=req.request_id,
                        program=reply.program,
                        queue_seconds=reply.queue_seconds,
                        attempt=run.preempted,
                        send=inbox,
                    )
                    run.lease = lease
                    with trio.CancelScope() as scope:
                        run.scope = scope
                        await forward(lease)
                    run.scope = None
                    if scope.cancelled_caught and lease.outcome is None:
                        lease = None  # preempted: wait for the next admission
                        continue
                    return
        except ActorGone:
            submitted = False
            raise DispatchRejected(SCHEDULER_UNAVAILABLE) from None
        finally:
            del self.runs[req.request_id]
            if submitted:
                await program.release_shielded(req, lease, inbox)


@attrs.define(eq=False)
class _BatchRun:
    """One batch request being served: its preemptions and the forward that runs now."""

    preempted: int = 0
    scope: trio.CancelScope | None = None
    lease: ProgramLease | None = None


class _LeaseContext:
    """``async with dispatcher.lease(req) as lease``: the admission on entry; on exit (however it is
    left) the request's end reported exactly once, shielded (``ProgramDispatcher.release_shielded``).
    A class, not a generator-based context manager: one object per request instead of a generator
    and its wrapper (docs/benchmarks.md §10.2.5)."""

    __slots__ = ("dispatcher", "req", "event", "inbox", "submitted", "lease")

    def __init__(
        self, dispatcher: ProgramDispatcher, req: ProxyRequest, event: RequestSubmitted | InteractiveSubmitted
    ) -> None:
        self.dispatcher = dispatcher
        self.req = req
        self.event = event
        self.inbox = dispatcher.scheduler.inbox.send
        self.submitted = False
        self.lease: ProgramLease | None = None

    async def __aenter__(self) -> ProgramLease:
        try:
            self.lease = await self.dispatcher._admission(self)
        except ActorGone:
            self.submitted = False
            raise DispatchRejected(SCHEDULER_UNAVAILABLE) from None
        except BaseException:
            if self.submitted:  # cancelled (client gone) while it waited: abandoned
                await self.dispatcher.release_shielded(self.req, None, self.inbox)
            raise
        return self.lease

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc_type is not None and issubclass(exc_type, ActorGone):
                self.submitted = False
                raise DispatchRejected(SCHEDULER_UNAVAILABLE) from None
        finally:
            if self.submitted:
                await self.dispatcher.release_shielded(self.req, self.lease, self.inbox)


class ProgramDispatcher:
    """The proxy's dispatcher for requests that carry Program identity."""

    def __init__(
        self,
        cfg: ProgramSchedulingConfig,
        scheduler: SchedulerHandle,
        observers: RankRegistry,
        estimator: TokenEstimator,
        polling_needed: trio.Event,
        feed: DashboardFeed | None = None,
    ) -> None:
        self.cfg = cfg
        self.feed = feed if feed is not None else DashboardFeed()
        self.scheduler = scheduler
        self.observers = observers
        self.estimator = estimator
        self._polling_needed = polling_needed
        self.counters = DispatcherCounters()
        self.pass_counters = PassCounters()  # kept by the data-plane hub (relay processes only)
        self.batch: BatchDispatcher | None = None  # with [batch_jobs] enabled
        self.interactive = InteractiveDispatcher(self)
        # the forward of each requeueable request that runs now (docs/priority.md §3)
        self.requeue_runs: dict[str, _RequeueRun] = {}
        self.health: HealthView | None = None  # the health board (run_program_scheduling)

    def explain(self, rejection: Rejection) -> Rejection:
        """A ``no_targets`` refusal names each worker's reason, as the native path's
        ``no_healthy_target`` does (docs/operations.md §11.3); other refusals are unchanged."""
        if rejection.reason != NO_TARGETS.reason or self.health is None:
            return rejection
        return attrs.evolve(rejection, message=f"{rejection.message}: {self.health.unhealthy_reason()}")

    def requeue(self, request_id: str) -> str:
        """The scheduler asks for a long prefill back (the ``RequeuePrefill`` effect, called while
        the scheduler actor routes it): cancel its forward when no byte of its answer reached the
        client, and say what happened (``actors.program_metrics.REQUEUE_OUTCOMES``).  The request
        then tells the scheduler itself (``ProgramLease.readmit``)."""
        run = self.requeue_runs.get(request_id)
        if run is None:
            return "not_requeueable"
        if run.lease.outcome is not None or run.committed():
            return "too_late"
        run.lease.requeue_requested = True
        run.scope.cancel()
        self.counters.requeued_count += 1
        return "requeued"

    def pool_targets(self, req: ProxyRequest) -> tuple[BackendTarget, ...] | None:
        """The current (healthy) targets of a model pool other than the default one, sent with each
        of its arrivals (the scheduler actor re-syncs only the default pool by itself); None for
        the default pool (daemon/models.py)."""
        if req.pool_targets is None:
            return None
        handle = self.scheduler
        handle.model_pools.setdefault(req.model_pool, req.pool_targets)  # re-synced on health changes
        live = handle.targets if handle.health is None else handle.health.healthy_targets()
        return tuple(sorted((t for t in live if t.index in req.pool_targets), key=lambda t: t.index))

    def lease(self, req: ProxyRequest) -> AbstractAsyncContextManager[ProgramLease]:
        return self._lease(req, self.program_event(req))

    def lease_interactive(self, req: ProxyRequest) -> AbstractAsyncContextManager[ProgramLease]:
        """An identity-free interactive request queued by the scheduler ahead of the classes below
        it (docs/priority.md §2, §5.5): ``InteractiveSubmitted``, answered like a Program request."""
        return self._lease(req, self.interactive_event(req))

    def program_event(self, req: ProxyRequest, already_on: TargetId | None = None) -> RequestSubmitted:
        """The core's ``RequestSubmitted`` of a request with Program identity (``already_on``: a
        relay forwarded it there under a resume pass, docs/architecture.md §9)."""
        if req.identity is None:
            raise ValueError("ProgramDispatcher.lease needs a request with Program identity")
        estimate = self.estimator.estimate(req.model_pool, req)
        hints = req.identity.hints
        if hints.priority != req.prio.priority:  # the edge's priority after both conventions and the rules
            hints = attrs.evolve(hints, priority=req.prio.priority)
        return RequestSubmitted(
            request_id=RequestId(req.request_id),
            identity=req.identity.identity,
            estimated_prompt_tokens=estimate,
            hints=hints,
            model_pool=req.model_pool,
            targets=self.pool_targets(req),
            routing_text=req.routing_text,
            tenant=req.prio.tenant,
            max_queue_seconds=req.max_queue_seconds,
            already_on=already_on,
            # a failover: the workers it could not reach (docs/program-scheduling.md §9.1)
            avoid_workers=req.avoid_workers,
        )

    def interactive_event(self, req: ProxyRequest) -> InteractiveSubmitted:
        """The core's ``InteractiveSubmitted`` of an identity-free interactive request."""
        return InteractiveSubmitted(
            request_id=RequestId(req.request_id),
            estimated_prompt_tokens=self.estimator.estimate(req.model_pool, req),
            tenant=req.prio.tenant,
            priority=req.prio.priority,
            max_tokens=output_cap(req.body),
            model_pool=req.model_pool,
            targets=self.pool_targets(req),
            avoid_workers=req.avoid_workers,  # a failover (docs/program-scheduling.md §9.1)
        )

    # ---- detached leases: a relay's request served without a task (docs/architecture.md §9) ----

    def detached_submission(
        self,
        req: ProxyRequest,
        kind: str,
        sink: ReplySink,
        *,
        already_on: TargetId | None = None,
        queue_updates: bool = False,
    ) -> Submission:
        """The submission of a relay's ``program`` or ``interactive`` lease whose answer goes to
        ``sink``; the caller delivers it to ``scheduler.inbox`` and then calls :meth:`submitted`.
        ``already_on``: the relay already forwarded the Program request there (a resume pass);
        ``queue_updates``: ``sink`` also gets the ``QueuePosition`` notices while it waits."""
        self._polling_needed.set()
        event = self.program_event(req, already_on) if kind == "program" else self.interactive_event(req)
        return Submission(event=event, reply=sink, queue_updates=queue_updates)

    def submitted(self) -> None:
        self.counters.submitted_count += 1

    def answered(self, reply: Admitted | Rejection) -> None:
        """A detached lease's answer (counted as the in-process lease counts it)."""
        if isinstance(reply, Rejection):
            self.counters.rejected_count += 1
        else:
            self.counters.admitted_count += 1

    def release_message(self, req: ProxyRequest, outcome: Outcome | None) -> RequestCompleted | RequestAbandoned:
        """The end of an admitted or waiting request, accounted (counters, the estimator's
        feedback): its ``RequestCompleted`` with ``outcome``, else its ``RequestAbandoned``."""
        if outcome is not None:
            self.counters.completed_count += 1
            if outcome.success:
                usage = outcome.usage
                self.estimator.feedback(req.model_pool, req, None if usage is None else usage.prompt_tokens)
            return completed_message(req.request_id, outcome)
        self.counters.abandoned_count += 1
        return RequestAbandoned(request_id=RequestId(req.request_id))

    def deliver_nowait(self, message: RequestCompleted | RequestAbandoned) -> bool:
        """Deliver a release to the scheduler inbox now; False when the inbox is full (then
        :meth:`deliver_shielded` must carry it)."""
        if self.scheduler.handle_now(message):
            return True
        try:
            self.scheduler.inbox.send.send_nowait(message)
        except trio.WouldBlock:
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the scheduler is gone: nothing left to account
        return True

    async def deliver_shielded(self, message: RequestCompleted | RequestAbandoned) -> None:
        """A release the full inbox refused: wait for room, shielded and never given up."""
        with trio.CancelScope(shield=True):
            await self._deliver(self.scheduler.inbox.send, message)

    def _lease(self, req: ProxyRequest, event: RequestSubmitted | InteractiveSubmitted) -> _LeaseContext:
        return _LeaseContext(self, req, event)

    async def _admission(self, ctx: _LeaseContext) -> ProgramLease:
        """Submit ``ctx``'s event and wait for its answer: the lease, or ``DispatchRejected``."""
        self._polling_needed.set()  # lazily start backend polling on the first scheduled request
        inbox = ctx.inbox
        watch = ctx.req.queue_watch
        # The scheduler answers exactly once with send_nowait (buffer 1); a request that wants
        # its queue position while it waits (a streaming one with SSE keep-alive) gets
        # QueuePosition notices first, which never take the final reply's room (buffer 2).
        # A reply slot, not a channel pair per request (docs/benchmarks.md §10.4.1).
        # (annotated, not ``ReplySlot[Reply](...)``: calling a subscripted generic goes through
        # typing's alias and its failed ``__orig_class__`` write on a slotted object, per request)
        slot: ReplySlot[Reply] = ReplySlot(1 if watch is None else 2)
        try:
            submission = Submission(event=ctx.event, reply=slot, queue_updates=watch is not None)
            # handled in this task when the scheduler actor waits on its empty inbox (the order
            # it would handle it in, without the two task hops; docs/architecture.md §3)
            await trio.lowlevel.checkpoint_if_cancelled()
            direct = self.scheduler.handle_now(submission)
            if not direct:
                await inbox.send(submission)
            ctx.submitted = True
            self.counters.submitted_count += 1
            while True:
                try:
                    reply = slot.receive_nowait() if direct else await slot.receive()
                except trio.WouldBlock:
                    direct = False  # waiting in the queue: the answer comes from a later step
                    continue
                except trio.EndOfChannel:
                    raise ActorGone("scheduler actor stopped") from None
                if not isinstance(reply, QueuePosition):
                    break
                if watch is not None:
                    watch.tell(reply.position, reply.eta_seconds, trio.current_time())
        finally:
            slot.leave()  # a later answer (to a handler that left) is dropped by the router
        if watch is not None:
            watch.done()
        if isinstance(reply, Rejection):
            ctx.submitted = False  # the core already dropped the request
            self.counters.rejected_count += 1
            raise DispatchRejected(self.explain(reply))
        assert isinstance(reply, Admitted)
        self.counters.admitted_count += 1
        return ProgramLease(
            target=reply.target,
            request_id=ctx.req.request_id,
            program=reply.program,
            queue_seconds=reply.queue_seconds,
            send=inbox,
            requeueable=reply.requeueable,
            runs=self.requeue_runs,
            report_on_exit=self.scheduler.direct,
            explain=self.explain,
        )

    async def release_shielded(
        self, req: ProxyRequest, lease: ProgramLease | None, inbox: trio.MemorySendChannel[Any]
    ) -> None:
        """Report the request's end (completed or abandoned) from a ``finally``, shielded and
        never given up: a completion or an abandon that were dropped would hold the request's
        capacity for good.  The scheduler never stops draining its inbox, so the wait is bounded
        by its processing rate; when the scheduler is gone there is nothing left to account."""
        message = self._release_now(req, lease, inbox)
        if message is not None:  # the inbox is full: wait for room (no scope when nothing waits)
            with trio.CancelScope(shield=True):
                await self._deliver(inbox, message)

    async def _deliver(self, inbox: trio.MemorySendChannel[Any], message: Any) -> None:
        if inbox is self.scheduler.inbox.send and self.scheduler.handle_now(message):
            return  # handled in this task (docs/architecture.md §3)
        try:
            inbox.send_nowait(message)
            return
        except trio.WouldBlock:
            self.counters.release_waits_count += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the scheduler is gone: nothing left to account
        try:
            await inbox.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _release_now(
        self, req: ProxyRequest, lease: ProgramLease | None, inbox: trio.MemorySendChannel[Any]
    ) -> RequestCompleted | RequestAbandoned | None:
        """Account the request's end and deliver it without waiting (handled in this task when
        the scheduler is idle, else queued); the message when the full inbox refused it."""
        if lease is not None and lease.dropped:
            self.counters.rejected_count += 1  # refused while it waited again: nothing to release
            return None
        outcome = None if lease is None else lease.outcome
        message = self.release_message(req, outcome)
        if lease is not None and outcome is not None:
            if lease.reported:
                return None  # ``finish`` delivered the completion
            lease.reported = True
        if inbox is self.scheduler.inbox.send and self.scheduler.handle_now(message):
            return None  # handled in this task (docs/architecture.md §3)
        try:
            inbox.send_nowait(message)
        except trio.WouldBlock:
            return message
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the scheduler is gone: nothing left to account
        return None

    async def wait_diagnostics(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Wait until ``predicate(diagnostics())`` holds, re-checking after every scheduler step.

        No checkpoint separates the check from subscribing to the next step, so no change is missed.
        """
        while True:
            doc = self.diagnostics()
            if predicate(doc):
                return doc
            await self.scheduler.wait_changed()

    def fairness_view(self) -> dict[str, Any]:
        """The core's tenant accounts now (docs/priority.md §3): counter (VTC, rent included),
        tokens charged, KV token-seconds of rent, waiting requests; rendered by label in the
        ``fairness`` diagnostics section and ``agentd_tenant_virtual_counter``."""
        state = self.scheduler.state
        now = trio.current_time()
        accounts = {
            tenant: {
                "counter": fairness.counter(state.fair, state.prio, tenant, now),
                "input_tokens": a.input_tokens,
                "output_tokens": a.output_tokens,
                "kv_token_seconds": fairness.total_kv_token_seconds(a, now),
                "waiting": a.waiting,
                "dispatched": a.dispatched,
                "lifts": a.lifts,
            }
            for tenant, a in state.fair.accounts.items()
        }
        return {"accounts": accounts}

    def dashboard(
        self,
        *,
        page: int = 1,
        state: str = "all",
        sort: str = "program",
        proxy_classes: Mapping[str, Mapping[str, Any]] | None = None,
        proxy_tenants: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The compact live document of ``/scheduling/dashboard.json`` (actors/dashboard_view.py)."""
        return dashboard_document(
            self.scheduler,
            self.feed,
            trio.current_time(),
            page=page,
            state=state,
            sort=sort,
            proxy_classes=proxy_classes,
            proxy_tenants=proxy_tenants,
        )

    def diagnostics(self) -> dict[str, Any]:
        now = trio.current_time()
        doc = diagnostics_snapshot(self.scheduler, now)
        backend = self.observers.snapshots()  # the frozen values the rank actors published
        for rank in doc["ranks"]:
            b = backend.get(rank["target_id"])
            if b is not None:
                rank["vllm_kv_capacity_tokens"] = b.kv_capacity_tokens
                rank["last_scrape_error"] = b.last_error
                rank["scrape_failures_count"] = b.failures_count
        doc["token_estimation"] = [
            {"model_pool": p, "endpoint": e, "tokens_per_byte": c}
            for (p, e), c in sorted(self.estimator.coefficients.items())
        ]
        doc["dispatcher"] = attrs.asdict(self.counters)
        doc["backend_polling_started"] = self.observers.started
        doc["channels"] = [*self.scheduler.statistics(), self.observers.statistics()]
        return doc


async def run_program_scheduling(
    cfg: AgentdConfig,
    client: httpx.AsyncClient,
    registry: CollectorRegistry,
    *,
    health: HealthView | None = None,
    settle: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[ProgramDispatcher] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run Program scheduling until cancelled; ``task_status.started(ProgramDispatcher)``.

    ``health`` (the supervisor's health board) restricts Program targets to healthy workers;
    without it every configured target is used.  ``settle``: the scheduler actor's idle wait in
    deterministic virtual time (``actors.scheduler_actor``: same-instant messages in an explicit order).
    """
    ps = cfg.program_scheduling
    if ps is None:
        raise ValueError("run_program_scheduling needs cfg.program_scheduling (enable_program_scheduling)")
    targets = cfg.targets()
    metrics = ProgramMetrics(registry)
    batch = cfg.batch_jobs if cfg.batch_jobs.enabled else None
    batch_metrics = BatchMetrics(registry) if batch is not None else None
    estimator = TokenEstimator(metrics, clock=trio.current_time if settle is not None else None)
    # a rank whose engine is missing from its worker's /metrics leaves rotation (docs/operations.md §11.3)
    engine_hook = health.set_engine_missing if isinstance(health, HealthBoard) else None
    observers = RankRegistry(targets, on_engine_missing=engine_hook)
    feed = DashboardFeed()

    def on_tick(handle: SchedulerHandle, now: float) -> None:
        gauges = rank_gauges(handle, now)
        metrics.publish(GaugeSnapshot(ranks=gauges, token_estimates=estimator.gauges()))
        impact = sum(g.cache_miss_impact_rolling_mean_seconds for g in gauges) / len(gauges) if gauges else 0.0
        feed.close_tick(now, handle.state.resume_hits.miss_ratio(), impact)

    async with trio.open_nursery() as nursery:
        scheduler: SchedulerHandle = await nursery.start(
            lambda task_status: run_scheduler_actor(
                ps,
                targets,
                metrics,
                on_tick=on_tick,
                health=health,
                feed=feed,
                batch=batch,
                batch_metrics=batch_metrics,
                priority=cfg.priority.core(),
                settle=settle,
                task_status=task_status,
            )
        )
        if batch is not None:
            registry.register(BatchGaugeCollector(lambda: batch_diagnostics(scheduler.state)))
        polling_needed = trio.Event()
        dispatcher = ProgramDispatcher(ps, scheduler, observers, estimator, polling_needed, feed)
        registry.register(PassCollector(dispatcher.pass_counters))
        dispatcher.health = health
        if batch is not None:
            dispatcher.batch = BatchDispatcher(dispatcher)
            assert scheduler.router is not None
            scheduler.router.on_preempt = dispatcher.batch.preempt
        assert scheduler.router is not None
        scheduler.router.on_requeue = dispatcher.requeue

        async def start_polling_when_needed() -> None:
            await polling_needed.wait()
            await nursery.start(run_rank_registry, ps, client, observers, scheduler.inbox.send.clone())

        nursery.start_soon(start_polling_when_needed)
        task_status.started(dispatcher)
