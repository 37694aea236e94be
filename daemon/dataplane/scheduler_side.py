"""The scheduler process's end of the data plane (docs/operations.md §13).

:class:`DataPlaneHub` holds one :class:`RelayConnection` per live relay process.  A connection
reads its relay's frames.  A Program or interactive :class:`~daemon.dataplane.wire.Ask` becomes the
very ``Submission`` the in-process lease sends (``ProgramDispatcher.detached_submission``: the same
event builders), whose reply sink is the lease itself (:class:`_Detached`): the scheduler actor's
answer is written as ``Grant``/``Refuse`` while it routes the effect, and the relay's ``Finish`` /
``Release`` become the ``RequestCompleted`` / ``RequestAbandoned`` with the in-process lease's
accounting (``ProgramDispatcher.release_message``).  No task exists per such lease
(docs/benchmarks.md §10.3.1).  A batch ``Ask`` (preemptible, admitted again after a preemption)
runs in a task of its own inside ``BatchDispatcher.serve``, the in-process code path.

When a relay's socket ends (the process died, or exited), every open lease of that connection is
released as abandoned (the detached ones at once, the batch tasks by cancellation), so the
scheduler receives a ``RequestAbandoned`` for every open lease of that relay and no capacity leaks.

The hub also publishes a :class:`~daemon.dataplane.wire.Snapshot` to every relay every
:data:`SNAPSHOT_SECONDS` (and at once when a relay connects): the healthy target indices, the
workers' served models and, for load-aware native policies, the native in-flight counts of every
other process; it applies the relays' outcome reports to the health board and gathers their
``/metrics`` expositions on demand (:meth:`DataPlaneHub.relay_expositions`).

Each relay reports its own view (the ``Load`` frame: the leases and resume passes it holds, the age
of its oldest open lease); its connection compares it with what this side believes that relay
holds, whenever both describe the same instant, and a difference that lasts longer than
:data:`VIEW_MISMATCH_SECONDS` is a suspected leak: counted, logged once (``relay_view_mismatch``)
and shown in the ``data_plane`` diagnostics (docs/operations.md §13.3).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import attrs
import trio
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from actors.core.arrival import PASS_RACE_ADMIT
from actors.core.config import BackendTarget
from actors.core.errors import Rejection
from actors.core.ids import ProgramKey, ProgramRef, TargetId
from actors.core.model import ACTIVE
from actors.logevents import get_logger, log_event
from actors.messages import Admitted, QueuePosition, Reply, Submission
from daemon.dataplane.link import Link, LinkClosed
from daemon.dataplane.wire import (
    Ask,
    Drop,
    Finish,
    FrameError,
    Grant,
    Hello,
    Load,
    MetricsAsk,
    MetricsText,
    Preempt,
    Queued,
    Refuse,
    Release,
    Report,
    Revoke,
    Snapshot,
    WorkerModels,
)
from daemon.dispatch import DispatchRejected, HealthView, Outcome, ProxyRequest
from daemon.program_dispatch import SCHEDULER_UNAVAILABLE, PassCounters, ProgramDispatcher, ProgramLease

logger = get_logger("dataplane")
INTERNAL_ERROR = Rejection(reason="internal_error", status_hint=500, message="internal error in agentd (see the log)")
BATCH_DISABLED = Rejection(reason="batch_jobs_disabled", status_hint=503, message="[batch_jobs] is not enabled")
SNAPSHOT_SECONDS = 0.1  # how often the relays' view of health, models and load is refreshed
DETACHED_KINDS = ("program", "interactive")  # served without a task (batch leases keep one each)
METRICS_TIMEOUT_SECONDS = 2.0  # a relay that does not answer a scrape within this is left out
# a relay's own view that differs from this side's for this long (every comparison in between
# exact, none agreeing) is a suspected leak: ten of the relay's report periods
VIEW_MISMATCH_SECONDS = 0.5


class OutcomeBoard(HealthView, Protocol):
    """What the hub needs of the health board: the view plus the outcome reports."""

    def report_success(self, url: str) -> None: ...
    def report_failure(self, url: str, detail: str, *, eject_now: bool = False, suspect: bool = False) -> bool: ...
    def report_rank_refused(self, target: BackendTarget, detail: str) -> bool: ...


@attrs.define(eq=False)
class _Detached:
    """A relay's Program or interactive lease served without a task of its own (docs/architecture.md
    §9): it is the submission's reply sink, so the scheduler actor's answer becomes the relay's
    ``Grant`` or ``Refuse`` frame at once; the relay's ``Finish``/``Release`` become the request's
    completion or abandon, with the in-process lease's accounting
    (:meth:`~daemon.program_dispatch.ProgramDispatcher.release_message`)."""

    conn: RelayConnection
    number: int
    req: ProxyRequest
    admitted: bool = False
    answered: bool = False  # the final answer (Admitted or Rejection) was given
    left: bool = False  # the relay released it (or its socket ended) before that
    early: Outcome | None = None  # a Finish that arrived before the Grant (a passed request's)
    key: ProgramKey | None = None  # a Program lease: its Program (a resume pass may come with its Grant)
    passed_to: str | None = None  # forwarded under a resume pass to this target id

    # ---- the reply sink of the scheduler actor (actors.messages.ReplySink) ----

    def send_nowait(self, value: Reply, /) -> None:
        if self.left:
            raise trio.BrokenResourceError("the relay released the lease")
        if isinstance(value, QueuePosition):
            # (asked for by a streaming request with SSE keep-alive: its relay writes the comments)
            if not self.answered:
                self.conn.send_quiet(Queued(self.number, value.position, value.eta_seconds))
            return
        self.answered = True
        self.conn.answer(self, value)

    def close(self) -> None:
        if not self.answered and not self.left:  # the scheduler stops without an answer
            self.answered = True
            self.conn.unavailable(self)

    def statistics(self) -> Any:
        return _EMPTY


@attrs.frozen
class _EmptyBuffer:
    current_buffer_used: int = 0


_EMPTY = _EmptyBuffer()


@attrs.define(eq=False)
class _Served:
    """One relay lease being served on the scheduler side."""

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    forwarding: bool = False  # a Grant was sent and its Finish/Release not received yet
    ended: trio.Event = attrs.field(factory=trio.Event)
    outcome: Outcome | None = None


@attrs.frozen(eq=False)
class _Pass:
    """A resume pass the hub gave a relay (docs/architecture.md §9): Program ``ref`` is Active on
    ``target_id`` under placement ``epoch``."""

    conn: RelayConnection
    number: int
    ref: ProgramRef
    target_id: TargetId
    epoch: int


class ProtocolError(Exception):
    """A frame a relay must not send (the connection is closed: the relay drains and restarts)."""


def admitted_of(lease: ProgramLease) -> Admitted:
    return Admitted(
        request_id=lease.request_id, target=lease.target, program=lease.program, queue_seconds=lease.queue_seconds
    )


class RelayConnection:
    """The scheduler's side of one relay process's socket."""

    def __init__(self, hub: DataPlaneHub, index: int, link: Link) -> None:
        self.hub = hub
        self.index = index
        self.link = link
        self.pid: int | None = None
        self.hello = trio.Event()
        self.leases: dict[int, _Served] = {}  # batch leases (and any Ask without a scheduler)
        self.detached: dict[int, _Detached] = {}  # Program and interactive leases
        self.in_flight: tuple[int, ...] = ()
        self.reports_applied = 0
        self.asks_count = 0
        self.abandoned_on_close_count = 0
        self._metrics: dict[int, trio.MemorySendChannel[str]] = {}
        self._later: trio.Nursery | None = None  # releases that wait for room in the scheduler inbox
        self._last_snapshot: Snapshot | None = None
        self.pass_numbers: dict[int, ProgramKey] = {}  # the resume passes this relay holds (number -> Program)
        self.views = RelayViews()
        # the socket ended: its leases are being abandoned, its last report describes a relay that
        # is gone, so the views are no longer compared (until the connection is reaped)
        self.socket_ended = False

    def send_quiet(self, frame: Any) -> None:
        try:
            self.link.send(frame)
        except LinkClosed:
            pass

    async def serve(self) -> None:
        """Serve the relay until its socket ends; then abandon every lease still open."""
        try:
            await self._serve()
        finally:
            # the relay must see the connection end: one cut off for breaking the protocol would
            # otherwise keep sending work nobody reads; it sees EOF, refuses new work and drains
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.link.stream)

    async def _serve(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.link.run_writer)
            async with trio.open_nursery() as leases:
                self._later = leases
                try:
                    async for frame in self.link.frames():
                        submission = self._on_frame(frame, leases)
                        if submission is not None:
                            await self._submit(submission)
                except (FrameError, ProtocolError) as exc:  # a relay that breaks the protocol is cut off
                    log_event(
                        logger, logging.ERROR, "relay_protocol_error", relay=self.index, pid=self.pid, error=str(exc)
                    )
                self.socket_ended = True
                open_count = len(self.leases) + len(self.detached)
                self.abandoned_on_close_count += open_count
                if open_count:
                    log_event(
                        logger,
                        logging.WARNING,
                        "relay_leases_abandoned",
                        relay=self.index,
                        pid=self.pid,
                        leases=open_count,
                        message="the relay's socket ended with leases open: each is released as abandoned",
                    )
                self.hub.drop_passes(self)  # (their in-flight requests are among the leases below)
                for number in list(self.detached):
                    self._release_detached(number, None)
                leases.cancel_scope.cancel()  # every open lease leaves its context unfinished
            self.link.close()
            nursery.cancel_scope.cancel()

    def _on_frame(self, frame: Any, leases: trio.Nursery) -> Submission | None:
        if isinstance(frame, Ask):
            self.asks_count += 1
            self.views.changes += 1
            program = self.hub.program
            if program is not None and frame.kind in DETACHED_KINDS:
                req = frame.request.proxy_request()
                detached = _Detached(self, frame.lease, req)
                already_on = None
                if frame.kind == "program" and req.identity is not None:
                    detached.key = ProgramKey(req.model_pool, req.identity.identity.program_id)
                    if frame.pass_number:
                        already_on = self.hub.passed(self, detached.key, frame.pass_number, frame.pass_target)
                        detached.passed_to = frame.pass_target
                try:
                    submission = program.detached_submission(
                        req, frame.kind, detached, already_on=already_on, queue_updates=frame.request.queue_updates
                    )
                except Exception as exc:  # a bug: this request gets a 500, the scheduler keeps running
                    logger.error(
                        "relay lease failed",
                        exc_info=exc,
                        extra={"agentd_event": "internal_error", "agentd_fields": {"request_id": req.request_id}},
                    )
                    self.send_quiet(Refuse(frame.lease, INTERNAL_ERROR))
                    return None
                self.detached[frame.lease] = detached
                return submission
            fresh = self.leases[frame.lease] = _Served()
            leases.start_soon(self._serve_ask, frame, fresh)
        elif isinstance(frame, Finish | Release):
            outcome = frame.outcome if isinstance(frame, Finish) else None
            open_detached = self.detached.get(frame.lease)
            if open_detached is not None:
                if open_detached.early is None:
                    self.views.changes += 1
                if outcome is not None and not open_detached.admitted:
                    open_detached.early = outcome  # (only a passed request finishes before its Grant)
                else:
                    self._release_detached(frame.lease, outcome)
                return None
            served = self.leases.get(frame.lease)
            if served is None:
                return None  # already refused or ended
            if not served.ended.is_set():
                self.views.changes += 1
            served.outcome = outcome
            served.ended.set()
            if not served.forwarding and isinstance(frame, Release):
                served.scope.cancel()  # still waiting for admission: leave the queue (abandoned)
        elif isinstance(frame, Report):
            board = self.hub.board
            if frame.refused_rank_target >= 0:
                target = self.hub.target_at(frame.refused_rank_target)
                if target is not None:
                    board.report_rank_refused(target, frame.detail)
            elif frame.ok:
                board.report_success(frame.worker_url)
            else:
                board.report_failure(frame.worker_url, frame.detail, eject_now=frame.eject_now, suspect=frame.suspect)
            self.reports_applied += 1
        elif isinstance(frame, Load):
            self.in_flight = frame.in_flight
            self.views.reported(frame, trio.current_time())
            self.compare_views()
        elif isinstance(frame, Drop):
            if self.hub.dropped(self, frame.number):
                self.views.changes += 1
        elif isinstance(frame, MetricsText):
            waiter = self._metrics.pop(frame.token, None)
            if waiter is not None:
                waiter.send_nowait(frame.text)
        elif isinstance(frame, Hello):
            self.pid = frame.pid
            self.publish(force=True)
            self.hello.set()
        else:
            raise ProtocolError(f"unexpected frame from relay {self.index}: {type(frame).__name__}")
        return None

    # ---- detached leases ----

    async def _submit(self, submission: Submission) -> None:
        """Deliver a detached lease's submission (the relay's next frames wait while the inbox is
        full: the same back-pressure an in-process handler feels)."""
        program = self.hub.program
        assert program is not None
        scheduler = program.scheduler
        try:
            handled = scheduler.handle_now(submission)
        except Exception:  # the step failed: the actor raises it and stops the daemon (as in-process)
            self._refuse(submission, INTERNAL_ERROR)
            return
        if handled:  # stepped in this task: the Grant or Refuse is already written (docs/benchmarks.md §10.3.3)
            program.submitted()
            return
        inbox = scheduler.inbox.send
        try:
            try:
                inbox.send_nowait(submission)
            except trio.WouldBlock:
                await inbox.send(submission)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._refuse(submission, SCHEDULER_UNAVAILABLE)
            return
        program.submitted()

    def _refuse(self, submission: Submission, rejection: Rejection) -> None:
        """The submission never reached a step: its lease is refused (unless already answered)."""
        number = self._number_of(submission)
        detached = self.detached.get(number)
        if detached is not None and not detached.answered:
            del self.detached[number]
            detached.answered = True
            self.send_quiet(Refuse(number, rejection))

    def _number_of(self, submission: Submission) -> int:
        sink = submission.reply
        assert isinstance(sink, _Detached)
        return sink.number

    def answer(self, detached: _Detached, reply: Admitted | Rejection) -> None:
        """The scheduler actor's answer to a detached lease (called while it routes the effect)."""
        program = self.hub.program
        assert program is not None
        program.answered(reply)
        if detached.passed_to is not None and (
            isinstance(reply, Rejection) or reply.target.target_id != detached.passed_to
        ):
            self.hub.pass_counters.races_count += 1  # refused, or accounted where it does not run
        if isinstance(reply, Rejection):
            self.detached.pop(detached.number, None)
            self.send_quiet(Refuse(detached.number, program.explain(reply)))
            return
        detached.admitted = True
        key = detached.key
        number = 0 if key is None else self.hub.issue_pass(self, key, TargetId(reply.target.target_id))
        if detached.early is not None:  # a passed request that ended before its admission
            self._release_detached(detached.number, detached.early)
        self.send_quiet(Grant(detached.number, reply, 0, number))

    def unavailable(self, detached: _Detached) -> None:
        """The scheduler stopped before answering: the relay answers 503."""
        if self.detached.pop(detached.number, None) is not None:
            self.send_quiet(Refuse(detached.number, SCHEDULER_UNAVAILABLE))

    def _release_detached(self, number: int, outcome: Outcome | None) -> None:
        """The lease ended (``outcome``: completed) or was left (None: abandoned)."""
        detached = self.detached.pop(number, None)
        program = self.hub.program
        if detached is None or program is None:
            return
        if not detached.answered:
            detached.left = True  # still queued: the abandon takes it out; a late answer is dropped
        message = program.release_message(detached.req, outcome)
        if not program.deliver_nowait(message):
            assert self._later is not None  # (set while the connection is served)
            self._later.start_soon(program.deliver_shielded, message)

    async def _serve_ask(self, ask: Ask, served: _Served) -> None:
        program = self.hub.program
        req = ask.request.proxy_request()
        try:
            with served.scope:
                if program is None:
                    raise DispatchRejected(SCHEDULER_UNAVAILABLE)
                if ask.kind == "batch":
                    if program.batch is None:  # (the relay has the same configuration: unreachable)
                        raise DispatchRejected(BATCH_DISABLED)
                    await program.batch.serve(req, lambda lease: self._forward(ask.lease, served, lease))
                    return
                dispatcher = program if ask.kind == "program" else program.interactive
                async with dispatcher.lease(req) as lease:
                    await self._forward(ask.lease, served, lease)
        except DispatchRejected as rejected:
            self.send_quiet(Refuse(ask.lease, rejected.rejection))
        except Exception as exc:  # a bug: this request gets a 500, the scheduler keeps running
            logger.error(
                "relay lease failed",
                exc_info=exc,
                extra={"agentd_event": "internal_error", "agentd_fields": {"request_id": req.request_id}},
            )
            self.send_quiet(Refuse(ask.lease, INTERNAL_ERROR))
        finally:
            self.leases.pop(ask.lease, None)

    async def _forward(self, number: int, served: _Served, lease: ProgramLease) -> None:
        """One admission of a relay lease: tell the relay, wait for its end, finish the lease.

        A batch attempt preempted here (the scope cancelled by ``BatchDispatcher.preempt``) tells
        the relay, which cancels its upstream call; an end the relay reported after a preemption
        (the answer was complete) finishes the next admission at once."""
        if served.ended.is_set():
            if served.outcome is not None:
                lease.finish(served.outcome)
            return
        served.forwarding = True
        self.link.send(Grant(number, admitted_of(lease), lease.attempt))
        try:
            await served.ended.wait()
        except trio.Cancelled:
            if not served.ended.is_set() and not self.link.closed:
                self.send_quiet(Preempt(number))
            raise
        finally:
            served.forwarding = False
        if served.outcome is not None:
            lease.finish(served.outcome)

    def publish(self, *, force: bool = False) -> None:
        snapshot = self.hub.snapshot_for(self)
        if not force and snapshot == self._last_snapshot:
            return
        self._last_snapshot = snapshot
        self.send_quiet(attrs.evolve(snapshot, seq=self.hub.next_seq()))

    async def exposition(self, seconds: float) -> str | None:
        token = next(self.hub.tokens)
        send, recv = trio.open_memory_channel[str](1)
        self._metrics[token] = send
        try:
            self.link.send(MetricsAsk(token))
            with trio.move_on_after(seconds):
                return await recv.receive()
            return None
        except LinkClosed:
            return None
        finally:
            self._metrics.pop(token, None)

    # ---- the relay's own view against this side's (docs/operations.md §13.3) ----

    def scheduler_view(self) -> tuple[int, int]:
        """The leases and resume passes this side believes the relay holds: leases whose end
        (``Finish``/``Release``) has not arrived and that were not refused (a passed request that
        finished before its admission is the relay's no longer), and the passes given to it and
        neither revoked, used nor dropped."""
        leases = 0
        for detached in self.detached.values():
            leases += detached.early is None
        for served in self.leases.values():
            leases += not served.ended.is_set()
        return leases, len(self.pass_numbers)

    def compare_views(self) -> None:
        """Compare the relay's last report with this side's view, if both describe the same
        instant: the relay had handled every frame sent to it, and no frame read from it since
        the report changed this side's view.  Otherwise (frames crossing) nothing is concluded."""
        views = self.views
        load = views.load
        if self.socket_ended:
            return
        if load is None or load.frames_read != self.link.frames_sent or views.changes != views.changes_at_report:
            return
        now = trio.current_time()
        ours = self.scheduler_view()
        views.compared_count += 1
        views.compared_at = now
        if ours == (load.leases, load.passes):
            if views.suspected and views.mismatch_since is not None:
                log_event(
                    logger,
                    logging.INFO,
                    "relay_view_mismatch_cleared",
                    relay=self.index,
                    pid=self.pid,
                    leases=load.leases,
                    passes=load.passes,
                    mismatch_seconds=round(now - views.mismatch_since, 3),
                )
            views.mismatch_since = None
            views.suspected = False
            return
        views.differed_count += 1
        if views.mismatch_since is None:
            views.mismatch_since = now
        if views.suspected or now - views.mismatch_since < VIEW_MISMATCH_SECONDS:
            return
        views.suspected = True
        views.suspected_count += 1
        self.hub.view_mismatches_count += 1
        log_event(
            logger,
            logging.WARNING,
            "relay_view_mismatch",
            relay=self.index,
            pid=self.pid,
            scheduler_leases=ours[0],
            relay_leases=load.leases,
            scheduler_passes=ours[1],
            relay_passes=load.passes,
            relay_native_in_flight=sum(load.in_flight),
            oldest_lease_seconds=views.oldest_lease_seconds(now),
            mismatch_seconds=round(now - views.mismatch_since, 3),
            message="the relay's own count of its open leases or resume passes has differed from the "
            "scheduler's for longer than frames in flight explain: one side kept a lease or pass the other "
            "let go (docs/operations.md §13.3)",
        )

    def views_document(self, now: float) -> dict[str, Any]:
        views = self.views
        load = views.load
        leases, passes = self.scheduler_view()
        return {
            "scheduler": {"leases": leases, "passes": passes},
            "relay": None
            if load is None
            else {
                "leases": load.leases,
                "passes": load.passes,
                "native_in_flight": sum(load.in_flight),
                "oldest_lease_seconds": views.oldest_lease_seconds(now),
                "reported_seconds_ago": now - views.load_at,
            },
            "comparisons_count": views.compared_count,
            "differed_count": views.differed_count,
            "compared_seconds_ago": None if views.compared_at is None else now - views.compared_at,
            "mismatch_seconds": None if views.mismatch_since is None else now - views.mismatch_since,
            "suspected": views.suspected,
            "suspected_count": views.suspected_count,
        }

    def document(self) -> dict[str, Any]:
        return {
            "open_leases": len(self.leases) + len(self.detached),
            "asks_count": self.asks_count,
            "abandoned_on_close_count": self.abandoned_on_close_count,
            "native_in_flight": sum(self.in_flight),
            "frames_sent": self.link.frames_sent,
            "frames_received": self.link.frames_received,
            "views": self.views_document(trio.current_time()),
        }


@attrs.define
class RelayViews:
    """A relay's last report of its own view and the comparisons with the scheduler's."""

    load: Load | None = None
    load_at: float = 0.0  # when the report arrived (this process's clock)
    changes: int = 0  # frames read from the relay that changed this side's view of it
    changes_at_report: int = 0
    compared_count: int = 0  # exact comparisons made
    differed_count: int = 0  # ... that found the views different
    compared_at: float | None = None
    mismatch_since: float | None = None  # the first exact comparison of the current difference
    suspected: bool = False  # the difference has lasted VIEW_MISMATCH_SECONDS
    suspected_count: int = 0

    def reported(self, load: Load, now: float) -> None:
        self.load = load
        self.load_at = now
        self.changes_at_report = self.changes

    def oldest_lease_seconds(self, now: float) -> float | None:
        """The relay's oldest open lease's age now (its age when sent, aged since it arrived)."""
        load = self.load
        if load is None or load.oldest_lease_seconds is None:
            return None
        return load.oldest_lease_seconds + (now - self.load_at)


class DataPlaneHub:
    """Every relay connection of the scheduler process, and what they share."""

    def __init__(
        self,
        targets: Sequence[BackendTarget],
        board: OutcomeBoard,
        program: ProgramDispatcher | None,
        *,
        models: Callable[[], dict[str, frozenset[str] | None]] | None = None,
        own_in_flight: Callable[[], Sequence[int]] | None = None,
    ) -> None:
        self.targets = tuple(targets)
        self.board = board
        self.program = program
        self._models = models
        self._own_in_flight = own_in_flight
        self.connections: dict[int, RelayConnection] = {}
        self.tokens = itertools.count(1)
        self._seq = itertools.count(1)
        # resume passes (docs/architecture.md §9): Program -> the pass its last relay holds
        self.passes: dict[ProgramKey, _Pass] = {}
        # (the Program dispatcher's: /metrics exports them with one process too, at 0)
        self.pass_counters = program.pass_counters if program is not None else PassCounters()
        self._pass_numbers = itertools.count(1)
        self.passes_dropped_count = 0  # passes relays dropped on their own (Drop frames applied)
        self.view_mismatches_count = 0  # suspected mismatches of a relay's view and this side's
        if program is not None and program.scheduler.router is not None:
            program.scheduler.router.on_program_change = self.program_changed

    def next_seq(self) -> int:
        return next(self._seq)

    def target_at(self, index: int) -> BackendTarget | None:
        """The target of index ``index`` (a relay's frame names targets by index), if any."""
        return next((t for t in self.targets if t.index == index), None)

    # ---- resume passes (docs/architecture.md §9) ----

    def issue_pass(self, conn: RelayConnection, key: ProgramKey, target_id: TargetId) -> int:
        """The pass number for the Grant of a Program request just admitted on ``target_id`` (0:
        none: its Program is not Active there after the step, or will not stay Active once idle:
        marked to pause, to end, or its request said ``expected_resume: false``).  The Program's pass moves to
        ``conn``; another relay holding one is told to drop it."""
        program = self.program
        assert program is not None
        p = program.scheduler.state.programs.get(key)
        if p is None or p.state != ACTIVE or p.placement != target_id:
            return 0
        if p.pause_when_idle or p.terminate_when_idle or not p.expected_resume:
            return 0  # it stops being Active when idle: a pass would race its Revoke
        prior = self.passes.get(key)
        if prior is not None:
            del prior.conn.pass_numbers[prior.number]  # (on the same relay: replaced by the new one)
            if prior.conn is not conn:
                self._revoke(prior)
        number = next(self._pass_numbers)
        self.passes[key] = _Pass(conn, number, p.ref, target_id, p.placement_epoch)
        conn.pass_numbers[number] = key
        self.pass_counters.issued_count += 1
        return number

    def passed(self, conn: RelayConnection, key: ProgramKey, number: int, target: str) -> TargetId:
        """A relay forwarded a request under pass ``number`` (consumed): the target the core
        dispatches it on (``RequestSubmitted.already_on``).  A pass revoked before its Ask arrived
        is a race (counted; the core admits the request there as it stands)."""
        counters = self.pass_counters
        counters.passed_count += 1
        current = self.passes.get(key)
        if current is not None and current.conn is conn and current.number == number:
            self._forget(key)  # used: the relay dropped it (the Grant may carry the next one)
        else:
            counters.crossed_count += 1
        return TargetId(target)

    def program_changed(self, ref: ProgramRef, reason: str | None) -> None:
        """A Program's lifecycle moved (a ``Transition`` with its ``reason`` or a ``RetireProgram``
        effect, routed by the scheduler actor after its step): revoke its pass unless it is still
        Active on the pass's target under the same placement."""
        if reason == PASS_RACE_ADMIT:
            self.pass_counters.races_count += 1
        pas = self.passes.get(ref.key)
        if pas is None:
            return
        program = self.program
        p = None if program is None else program.scheduler.state.programs.get(ref.key)
        if (
            p is not None
            and p.ref == pas.ref
            and p.state == ACTIVE
            and p.placement == pas.target_id
            and p.placement_epoch == pas.epoch
        ):
            return
        self._forget(ref.key)
        self._revoke(pas)

    def _forget(self, key: ProgramKey) -> _Pass:
        pas = self.passes.pop(key)
        del pas.conn.pass_numbers[pas.number]
        return pas

    def dropped(self, conn: RelayConnection, number: int) -> bool:
        """Relay ``conn`` dropped pass ``number`` without a Revoke (``Drop``): forgotten, unless it
        was revoked or replaced meanwhile.  Whether this side's view changed."""
        key = conn.pass_numbers.get(number)
        if key is None:
            return False
        self._forget(key)
        self.passes_dropped_count += 1
        return True

    def _revoke(self, pas: _Pass) -> None:
        self.pass_counters.revoked_count += 1
        pas.conn.send_quiet(Revoke(pas.ref.model_pool, pas.ref.program_id, pas.number))

    def drop_passes(self, conn: RelayConnection) -> None:
        """The relay's socket ended: its passes go with it (nothing to tell)."""
        for key in list(conn.pass_numbers.values()):
            self._forget(key)

    def passes_document(self) -> dict[str, int]:
        return {
            "outstanding": len(self.passes),
            **attrs.asdict(self.pass_counters),
            "dropped_count": self.passes_dropped_count,
        }

    def connect(self, index: int, link: Link) -> RelayConnection:
        conn = RelayConnection(self, index, link)
        self.connections[index] = conn
        return conn

    def disconnect(self, conn: RelayConnection) -> None:
        if self.connections.get(conn.index) is conn:
            del self.connections[conn.index]

    def snapshot_for(self, conn: RelayConnection) -> Snapshot:
        n = len(self.targets)
        others = [0] * n
        own = self._own_in_flight() if self._own_in_flight is not None else ()
        for i, count in enumerate(own[:n]):
            others[i] += count
        for other in self.connections.values():
            if other is conn:
                continue
            for i, count in enumerate(other.in_flight[:n]):
                others[i] += count
        healthy = self.board.healthy_targets()
        models = self._models() if self._models is not None else {}
        return Snapshot(
            seq=0,
            healthy=tuple(t.index for t in healthy),
            unhealthy_reason="" if healthy else self.board.unhealthy_reason(),
            others_in_flight=tuple(others),
            models=tuple(
                WorkerModels(url, None if m is None else tuple(sorted(m))) for url, m in sorted(models.items())
            ),
            reports_applied=conn.reports_applied,
        )

    async def run_publisher(self) -> None:
        """Refresh every relay's snapshot every :data:`SNAPSHOT_SECONDS` (sent only when changed),
        and compare each relay's last report of its view with this side's (a relay that reports
        nothing new, at rest, is compared here)."""
        while True:
            await trio.sleep(SNAPSHOT_SECONDS)
            for conn in list(self.connections.values()):
                if conn.hello.is_set():
                    conn.compare_views()
                    conn.publish()

    async def relay_expositions(self, seconds: float = METRICS_TIMEOUT_SECONDS) -> list[str]:
        """Every connected relay's ``/metrics`` text (a relay that does not answer is left out)."""
        texts: list[str] = []

        async def one(conn: RelayConnection) -> None:
            text = await conn.exposition(seconds)
            if text is not None:
                texts.append(text)

        async with trio.open_nursery() as nursery:
            for conn in list(self.connections.values()):
                nursery.start_soon(one, conn)
        return texts

    def open_leases(self) -> int:
        return sum(len(c.leases) + len(c.detached) for c in self.connections.values())

    def native_in_flight(self) -> int:
        return sum(sum(c.in_flight) for c in self.connections.values())


class ViewCollector(Collector):
    """``agentd_data_plane_view_mismatches_total``, ``agentd_data_plane_relay_view_mismatch{relay}``,
    ``agentd_data_plane_relay_oldest_lease_seconds{relay}`` and
    ``agentd_data_plane_relay_restarts_total`` (``restarts``: the supervisor's count of relay
    processes started again after one exited) at scrape time (docs/operations.md §13.3); without
    relay processes (``hub`` None) the counters are 0 and the gauges have no sample."""

    def __init__(self, hub: DataPlaneHub | None, restarts: Callable[[], int] | None = None) -> None:
        self.hub = hub
        self.restarts = restarts

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        hub = self.hub
        yield CounterMetricFamily(
            "agentd_data_plane_view_mismatches",
            "Suspected leaks: a relay's own count of its open leases or resume passes differed from the "
            "scheduler's for longer than frames in flight explain.",
            value=0 if hub is None else hub.view_mismatches_count,
        )
        yield CounterMetricFamily(
            "agentd_data_plane_relay_restarts",
            "Relay processes started again after one exited (a crash, a kill, a lost scheduler connection).",
            value=0 if self.restarts is None else self.restarts(),
        )
        suspected = GaugeMetricFamily(
            "agentd_data_plane_relay_view_mismatch",
            "1 while a relay's view of its leases and passes is suspected to differ from the scheduler's.",
            labels=["relay"],
        )
        oldest = GaugeMetricFamily(
            "agentd_data_plane_relay_oldest_lease_seconds",
            "Age of the oldest lease a relay holds open, as it last reported (0 when none).",
            labels=["relay"],
        )
        connections = {} if hub is None else hub.connections
        now = trio.current_time() if connections else 0.0
        for index, conn in sorted(connections.items()):
            suspected.add_metric([str(index)], 1.0 if conn.views.suspected else 0.0)
            oldest.add_metric([str(index)], conn.views.oldest_lease_seconds(now) or 0.0)
        yield suspected
        yield oldest
