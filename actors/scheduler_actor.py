"""The global-queue scheduler actor: the only writer of the Program-scheduling state.

It owns the core's ``SchedulerState`` and feeds every fact it receives, one message at a time,
to the pure ``actors.core.scheduler.step(state, event, now=trio.current_time(), cfg=cfg)``.
``step`` is synchronous, so each decision is atomic under Trio's cooperative scheduling and no
lock exists anywhere.  The actor then hands the step's effects, in order, to its
:class:`~actors.effect_router.EffectRouter` (replies, Program-actor timers, logs, metrics).

The messages it receives are the core's own input events (docs/architecture.md §3); only the
round-start message of the observation pacer is turned into core events here (one per target), and
observations of targets the health board took out are not news to the core.

After every ``RepairTick`` it calls ``on_tick`` (the dispatcher publishes the gauge snapshot for
``/metrics`` there).  Diagnostics read :attr:`SchedulerHandle.state` (the latest state reference)
between steps: because steps never await, a reader always sees a consistent state.

Same-instant inputs (``settle``, deterministic virtual-time runs only): Trio wakes the tasks that
become runnable together in a random order, so messages sent at one instant (completions,
observations, submissions) would reach the inbox, and so the core, in task wake order; decisions
such as batch dispatch depend on that order.  With ``settle`` (``agentd simulate`` passes the
simulator's idle wait) the actor, after its first message, waits until every task is blocked,
takes everything in the inbox and handles it sorted by :meth:`SchedulerHandle.inbox_order_key`,
an explicit key made of the message's content and the actor's own submission sequence, never its
arrival order (docs/architecture.md §7).  Without it (the daemon on a real clock) messages are
handled as they arrive.  (An instant with more messages than the inbox holds is split where the
inbox filled, which wake order decides: deterministic runs keep below ``SCHEDULER_INBOX_SIZE``
same-instant messages.)

The actor's inbox is bounded (see ``SCHEDULER_INBOX_SIZE``); the actor itself never awaits
anything but its inbox (and ``settle``), so producers (HTTP handlers, the rank actors, the Program
timers) are only ever delayed by the actor's own processing rate.  An exception in ``step`` or in routing
propagates and stops the daemon (one-cancels-all): no restart loop hides a broken invariant.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

import attrs
import trio
from attrs import asdict

from actors.batch_metrics import BatchMetrics
from actors.core import eta_queue
from actors.core import events as ev
from actors.core.batch_class import batch_diagnostics
from actors.core.config import BackendTarget, BatchJobsConfig, PriorityConfig, ProgramSchedulingConfig
from actors.core.ids import DEFAULT_MODEL_POOL, TargetId
from actors.core.scheduler import initial_state, step
from actors.core.snapshot import diagnostics_document, snapshot
from actors.core.state import SchedulerState
from actors.dashboard_feed import DashboardFeed
from actors.effect_router import EffectRouter, logger
from actors.logevents import log_event
from actors.mailbox import Mailbox, open_mailbox
from actors.messages import ObservationRoundStarted, SchedulerInboxItem, SchedulerMessage, Submission
from actors.program_metrics import ProgramMetrics, RankGauges
from actors.program_registry import ProgramRegistry, run_program_registry

# Scheduler inbox.  Producers: one Submission + one RequestCompleted/RequestAbandoned per Program
# request, one message per target per tick from the rank actors, one TimerFired per due timer.  A
# step costs tens of microseconds, so 1024 absorbs bursts of ~1000 simultaneous arrivals without
# making handlers wait, while bounding memory.
SCHEDULER_INBOX_SIZE = 1024


class HealthyTargets(Protocol):
    """Where the scheduler reads which targets are healthy (the daemon's health board)."""

    def healthy_targets(self) -> tuple[BackendTarget, ...]: ...


class SchedulerHandle:
    """What the dispatcher and diagnostics see of the scheduler actor."""

    def __init__(
        self,
        cfg: ProgramSchedulingConfig,
        targets: Sequence[BackendTarget],
        inbox: Mailbox[SchedulerInboxItem],
        state: SchedulerState,
    ) -> None:
        self.cfg = cfg
        self.targets = tuple(targets)
        self.targets_by_id = {t.target_id: t for t in self.targets}
        self.inbox = inbox
        self.state = state
        self.registry: ProgramRegistry | None = None
        self.router: EffectRouter | None = None
        self.health: HealthyTargets | None = None
        self.synced_target_ids: tuple[str, ...] = ()
        # the target tuple the last sync read (the health board keeps one tuple until health
        # changes): the same object again means the same targets, nothing to compare
        self._synced_source: tuple[BackendTarget, ...] | None = None
        # model pools other than the default one (daemon/models.py): name -> member target indices,
        # registered by the dispatcher at a pool's first arrival and re-synced with the default pool
        self.model_pools: dict[str, frozenset[int]] = {}
        self.steps_count = 0
        self.last_step_at: float | None = None
        # request id -> its Submission's position in the order the actor handled submissions: the
        # explicit ordering key of the request's completion among same-instant messages
        self.submitted_seq: dict[str, int] = {}
        self._submissions = 0
        self._changed: trio.Event | None = None
        # the caller-task path (:meth:`handle_now`): on with a real clock (no ``settle``), while a
        # message is handled, and what a message handled that way raised (the actor re-raises it)
        self.direct = False
        self._stepping = False
        self._failure: Exception | None = None
        self.direct_count = 0

    @property
    def pending_replies_count(self) -> int:
        return 0 if self.router is None else len(self.router.replies)

    def notify_stepped(self) -> None:
        changed = self._changed
        if changed is not None:  # (an event only while someone waits: no allocation per step)
            self._changed = None
            changed.set()

    async def wait_changed(self) -> None:
        """Return after the next step (for ``wait_<condition>`` helpers; never polls)."""
        changed = self._changed
        if changed is None:
            changed = self._changed = trio.Event()
        await changed.wait()

    def statistics(self) -> list[dict[str, Any]]:
        out = [self.inbox.statistics()]
        if self.registry is not None:
            out.append(self.registry.statistics())
        return out

    def handle_now(self, item: SchedulerInboxItem) -> bool:
        """Handle ``item`` in the caller's task, now, if that is exactly when and in what order the
        actor would handle it: the actor waits on its empty inbox, so ``item`` would be the next
        message it takes, and nothing can come between (``step`` never awaits; docs/architecture.md
        §3, "Handled in the sender's task").  True when handled (its reply is in the reply sink);
        False when the caller must send it to the inbox as before: a backlog or a message in
        transit, the actor busy, deterministic virtual time (``settle`` orders same-instant
        messages), or a call from inside a step.

        Same decisions, one hop less: the request's task does not wait for the actor's turn and the
        actor's to hand the reply back (docs/benchmarks.md §10.2.5).  An exception of the step is
        the actor's failure: it is handed to the actor, which raises it (the daemon stops, as when
        the actor itself steps), and raised to the caller too."""
        if not self.direct or self._stepping:
            return False
        st = self.inbox.recv.statistics()
        if st.current_buffer_used or st.tasks_waiting_receive != 1:
            return False
        self._stepping = True
        try:
            _handle(self, item, None)  # (senders' messages: never the tick that ``on_tick`` follows)
        except Exception as exc:
            self._failure = exc
            self.inbox.send.send_nowait(cast(SchedulerInboxItem, _FAILED))  # the actor waits: it fits
            raise
        finally:
            self._stepping = False
        self.direct_count += 1
        return True

    # ---- the actor's steps (called only by run_scheduler_actor and handle_now) --------------------

    def apply(self, event: ev.Event, now: float) -> None:
        """One core step, its effects performed in order."""
        assert self.router is not None
        result = step(self.state, event, now=now, cfg=self.cfg)
        self.state = result.state
        self.steps_count += 1
        self.last_step_at = now
        self.router.route(result.effects)

    def sync_targets(self, now: float, *, force: bool = False) -> None:
        """Give the core the current (healthy) target list when it changed."""
        source = self.targets if self.health is None else self.health.healthy_targets()
        if source is self._synced_source and not force:
            return
        self._synced_source = source
        targets = source if self.health is None else tuple(sorted(source, key=lambda t: t.index))
        ids = tuple(t.target_id for t in targets)
        if ids == self.synced_target_ids and not force:
            return
        self.synced_target_ids = ids
        self.apply(ev.TargetsChanged(DEFAULT_MODEL_POOL, targets), now)
        for pool, members in self.model_pools.items():
            self.apply(ev.TargetsChanged(pool, tuple(t for t in targets if t.index in members)), now)

    def receive(self, item: SchedulerInboxItem, now: float) -> None:
        """Handle one inbox item: targets first where they may have changed, then the core."""
        assert self.router is not None
        if isinstance(item, Submission):
            self.submitted_seq[item.event.request_id] = self._submissions
            self._submissions += 1
            self.sync_targets(now)
            self.router.expect_reply(item.event.request_id, item.reply, queue_updates=item.queue_updates)
            self.apply(item.event, now)
            return
        if isinstance(item, ev.RepairTick):
            self.sync_targets(now)
        for event in self.core_events(item):
            self.router.completing = event if isinstance(event, ev.RequestCompleted) else None
            self.apply(event, now)
        self.router.completing = None
        if isinstance(item, (ev.RequestCompleted, ev.RequestAbandoned)):
            self.router.forget(item.request_id)
            self.submitted_seq.pop(item.request_id, None)

    def inbox_order_key(self, item: SchedulerInboxItem) -> tuple[Any, ...]:
        """The explicit order of same-instant messages (module docstring): by kind, then by content.

        Kinds: observations (the round's start first), completions (what they release is free for
        the same instant's arrivals), submissions, abandons (after the submissions, so one sent at
        the instant of its own submission finds it), timers (a request arriving at its Program's
        TTL deadline is in time), repair ticks.  A completion or abandon is ordered by its request's
        submission sequence (request ids are drawn in task wake order, so they are no key); a
        submission by its event's content without the request id."""
        if isinstance(item, Submission):
            fields = attrs.asdict(item.event, recurse=False)
            del fields["request_id"]
            return (_SUBMISSION_KIND, type(item.event).__name__, repr(sorted(fields.items())), item.event.request_id)
        kind = _MESSAGE_KIND.get(type(item), _OTHER_KIND)
        if isinstance(item, (ev.RequestCompleted, ev.RequestAbandoned)):
            return (kind, self.submitted_seq.get(item.request_id, -1), repr(item))
        return (kind, repr(item))

    def core_events(self, msg: SchedulerMessage) -> list[ev.Event]:
        """The core events of one message: itself, or one per live target for observations."""
        if isinstance(msg, ObservationRoundStarted):
            live = self.synced_target_ids
            return [ev.ObservationStarted(target_id=TargetId(t), epoch=msg.epoch) for t in msg.target_ids if t in live]
        if isinstance(msg, ev.ObservationReceived):
            _log_capacity_observation(self.cfg, msg)
            if msg.target_id not in self.synced_target_ids:
                return []  # scraped, but the health board took its worker out: not news to the core
        return [msg]


async def run_scheduler_actor(
    cfg: ProgramSchedulingConfig,
    targets: Sequence[BackendTarget],
    metrics: ProgramMetrics,
    *,
    on_tick: Callable[[SchedulerHandle, float], None] | None = None,
    health: HealthyTargets | None = None,
    feed: DashboardFeed | None = None,
    batch: BatchJobsConfig | None = None,
    batch_metrics: BatchMetrics | None = None,
    priority: PriorityConfig | None = None,
    settle: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[SchedulerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Own the scheduler state; run until cancelled (or until a step raises, which stops the daemon).

    With ``health``, the targets given to the core are the healthy ones, re-synced at every tick
    and arrival: an unhealthy worker's ranks leave Program scheduling (their Programs fail over).
    ``settle`` (deterministic virtual time only) returns once every task is blocked: the actor then
    handles same-instant messages in :meth:`SchedulerHandle.inbox_order_key` order.
    """
    # See SCHEDULER_INBOX_SIZE for the bound.
    inbox: Mailbox[SchedulerInboxItem] = open_mailbox("scheduler_inbox", SCHEDULER_INBOX_SIZE)
    handle = SchedulerHandle(cfg, targets, inbox, initial_state(cfg, batch, priority))
    async with inbox.recv, trio.open_nursery() as nursery:
        registry: ProgramRegistry = await nursery.start(run_program_registry, inbox.send.clone())
        handle.registry = registry
        handle.router = EffectRouter(cfg, handle.targets_by_id, metrics, registry, feed, batch_metrics)
        handle.health = health
        # The configured targets are known from the start (no Program state, no polling): the
        # diagnostics list every concrete DP rank before the first Program request.
        handle.sync_targets(trio.current_time(), force=True)
        handle.direct = settle is None
        task_status.started(handle)
        try:
            receive_nowait = inbox.recv.receive_nowait
            async for first in inbox.recv:
                items = [first]
                if settle is not None:
                    # deterministic virtual time: every same-instant message, in an explicit order
                    await settle()
                    while True:
                        try:
                            items.append(receive_nowait())
                        except trio.WouldBlock:
                            break
                    items.sort(key=handle.inbox_order_key)
                for item in items:
                    _handle(handle, item, on_tick)
                if settle is None:
                    # a real clock: what queued meanwhile is handled in arrival order without a
                    # checkpoint per message (the inbox only drains while the actor runs, so this
                    # ends with the backlog; docs/benchmarks.md §10.3.1)
                    while True:
                        try:
                            item = receive_nowait()
                        except trio.WouldBlock:
                            break
                        _handle(handle, item, on_tick)
        finally:
            handle.router.batch.flush()
            handle.router.close_replies()
            nursery.cancel_scope.cancel()


def _handle(
    handle: SchedulerHandle, item: SchedulerInboxItem, on_tick: Callable[[SchedulerHandle, float], None] | None
) -> None:
    if item is _FAILED:
        assert handle._failure is not None
        raise handle._failure  # a step run by ``handle_now`` raised: the actor fails with it
    now = trio.current_time()
    handle.receive(item, now)
    handle.notify_stepped()
    if isinstance(item, ev.RepairTick):
        assert handle.router is not None
        handle.router.batch.flush()  # the tick's metric updates applied (scrapes flush too)
        if on_tick is not None:
            on_tick(handle, now)


# the inbox item that makes the actor raise what a ``handle_now`` step raised
_FAILED = object()

# kind order of same-instant messages (SchedulerHandle.inbox_order_key)
_SUBMISSION_KIND = 3
_MESSAGE_KIND: dict[type, int] = {
    ObservationRoundStarted: 0,
    ev.ObservationReceived: 1,
    ev.RequestCompleted: 2,
    ev.RequestAbandoned: 4,
    ev.TimerFired: 5,
    ev.RepairTick: 6,
}
_OTHER_KIND = 7


def _log_capacity_observation(cfg: ProgramSchedulingConfig, msg: ev.ObservationReceived) -> None:
    capacity = cfg.token_capacity_per_dp_rank
    usage = msg.kv_cache_usage
    native_used = None if capacity is None or usage is None else round(usage * capacity)
    log_event(
        logger,
        logging.DEBUG,
        "capacity_observation",
        target=msg.target_id,
        kv_cache_usage=usage,
        native_used_tokens=native_used,
        vllm_running_requests=msg.running_requests,
        vllm_waiting_requests=msg.waiting_requests,
        capacity_tokens=capacity,
        backend_kv_capacity_tokens=msg.kv_capacity_tokens,
    )


# ---------------------------------------------------------------------------------------------
# Snapshots for /metrics and /scheduling/diagnostics (read between steps; never mutate)
# ---------------------------------------------------------------------------------------------


def diagnostics_snapshot(handle: SchedulerHandle, now: float) -> dict[str, Any]:
    """The core's diagnostics document (rendered from its frozen snapshot) plus a configuration summary."""
    doc = diagnostics_document(snapshot(handle.state, handle.cfg, now))
    summary = asdict(handle.cfg, filter=lambda a, _v: a.name not in ("explicit_coefficients", "deprecated_inputs"))
    doc["configuration"] = summary
    doc["batch"] = batch_diagnostics(handle.state)
    doc["queue_eta"] = eta_queue.diagnostics(handle.state)
    doc["scheduler"] = {
        "steps_count": handle.steps_count,
        "handled_in_sender_count": handle.direct_count,
        "last_step_at": handle.last_step_at,
        "pending_replies_count": handle.pending_replies_count,
    }
    return doc


def rank_gauges(handle: SchedulerHandle, now: float) -> tuple[RankGauges, ...]:
    """Gauge values per target (published at each tick), read from the core's frozen snapshot."""
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
