"""The relay process's end of the data plane (docs/operations.md §13).

A relay runs the HTTP edge and the proxy (:class:`~daemon.http.proxy.ProxyEngine`) on the shared
public listening socket.  What it cannot decide alone it asks the scheduler process over its
socket (:mod:`daemon.dataplane.wire` frames):

* :class:`RemoteProgramDispatcher` - the proxy's ``Dispatcher`` for Program, interactive and batch
  requests: ``lease(req)`` sends an ``Ask`` and waits for ``Grant`` (the ``Admitted`` value) or
  ``Refuse`` (the core's ``Rejection``); ``lease.finish(outcome)`` sends ``Finish`` at once;
  leaving the lease without ``finish`` sends ``Release`` (abandoned).  A Program request whose
  Program has a resume pass here (given with the Grant of its last request, dropped on a
  ``Revoke``) does not wait: its lease is the pass's target at once and its ``Ask`` says so
  (docs/architecture.md §9); not when that worker is out of the relay's rotation or is one the
  request could not reach (its failover, docs/operations.md §11.2): the pass is dropped and the
  request asks.  When the scheduler is gone every waiting and new request is refused
  with the 503 ``scheduler_unavailable``;
* :class:`SnapshotView` - the health view the relay's own
  :class:`~daemon.dispatch.NativeDispatcher` reads (native policies decide in the relay), the
  served models and the other processes' in-flight counts, from the scheduler's snapshots;
* :class:`RemoteOutcomes` - outcome reports of real traffic go to the scheduler's health board (a
  connect failure also takes the worker out of this relay's rotation at once; a connect timeout
  as a suspect, whose confirming probe the scheduler's health actor sends, docs/operations.md
  §11.3).

:class:`RelayApp` is the relay's ASGI app: the agent-facing POST routes run here
(:func:`~daemon.http.app.serve_proxy_asgi`); every other route (``/health``, ``/metrics``,
``/v1/models``, the Batch API, diagnostics, the dashboard) is forwarded to the scheduler process's
internal listener, so the answers are the scheduler's.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import trio

from actors.core.batch_class import MAX_PREEMPTIONS_PER_REQUEST
from actors.core.config import BackendTarget
from actors.messages import Admitted
from daemon.dataplane.link import Link, LinkClosed
from daemon.dataplane.wire import (
    Ask,
    Drop,
    Finish,
    Grant,
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
    WireRequest,
)
from daemon.dispatch import DispatchRejected, Outcome, ProxyRequest
from daemon.http.queue_eta import QueueWatch
from daemon.models import ModelDirectory
from daemon.pool_reaper import ReapedTransport
from daemon.program_dispatch import SCHEDULER_UNAVAILABLE, output_cap

if TYPE_CHECKING:
    from daemon.http.errors import ApiError

LOAD_SECONDS = 0.05  # how often the relay's own view (Load) goes to the scheduler (when changed)
MAX_PASSES = 4096  # resume passes kept per relay (the oldest is dropped first: it only costs a wait)


class SnapshotView:
    """Healthy targets as the scheduler last published them (minus workers this relay just saw
    refuse connections or time out at connect, until a snapshot that includes that report arrives;
    the ones that timed out stay when nothing else would, as the scheduler's board keeps suspects)."""

    def __init__(self, targets: Sequence[BackendTarget], models: ModelDirectory | None = None) -> None:
        self.targets = tuple(targets)
        self.models = models
        self.snapshot: Snapshot | None = None
        self.first = trio.Event()
        self._healthy: tuple[BackendTarget, ...] = ()
        self._healthy_urls: frozenset[str] = frozenset()
        self._published: tuple[BackendTarget, ...] = ()
        self.others_in_flight: list[int] = [0] * len(self.targets)
        self.ejected: dict[str, int] = {}  # worker URL -> the report number that ejected it here
        self.refused: dict[int, int] = {}  # target index -> the report number of its refused DP rank
        self.suspected: dict[str, int] = {}  # worker URL -> the report number that made it suspect here
        self.reports_sent = 0
        self._models_seen: tuple[Any, ...] = ()

    def apply(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        by_index = {t.index: t for t in self.targets}
        self._published = tuple(by_index[i] for i in snapshot.healthy if i in by_index)
        self.ejected = {u: n for u, n in self.ejected.items() if n > snapshot.reports_applied}
        self.suspected = {u: n for u, n in self.suspected.items() if n > snapshot.reports_applied}
        self.refused = {i: n for i, n in self.refused.items() if n > snapshot.reports_applied}
        self._refresh()
        counts = list(snapshot.others_in_flight[: len(self.targets)])
        self.others_in_flight[:] = counts + [0] * (len(self.targets) - len(counts))
        if self.models is not None and snapshot.models != self._models_seen:
            self._models_seen = snapshot.models
            for entry in snapshot.models:
                if entry.worker_url in self.models.models:
                    self.models.set_models(entry.worker_url, None if entry.models is None else frozenset(entry.models))
        self.first.set()

    def _refresh(self) -> None:
        ejected, suspected, refused = self.ejected, self.suspected, self.refused
        if not ejected and not suspected and not refused:
            self._healthy = self._published
        else:
            left = tuple(t for t in self._published if t.worker_url not in ejected)
            # refused DP ranks and suspects stay when they are all that is left (docs/operations.md §11.3)
            left = tuple(t for t in left if t.index not in refused) or left
            self._healthy = tuple(t for t in left if t.worker_url not in suspected) or left
        self._healthy_urls = frozenset(t.worker_url for t in self._healthy)

    def eject(self, url: str, report: int) -> None:
        self.ejected[url] = report
        self._refresh()

    def suspect(self, url: str, report: int) -> None:
        self.suspected[url] = report
        self._refresh()

    def refuse_rank(self, index: int, report: int) -> None:
        self.refused[index] = report
        self._refresh()

    def healthy_targets(self) -> tuple[BackendTarget, ...]:
        return self._healthy

    def in_rotation(self, url: str) -> bool:
        """Whether worker ``url`` is in this relay's rotation now (a resume pass to a worker out of
        it is not used, docs/operations.md §13.1)."""
        return url in self._healthy_urls

    def unhealthy_reason(self) -> str:
        if self.snapshot is None:
            return "the scheduler has not published worker health yet"
        if self.ejected:
            return f"ejected by this relay: {', '.join(sorted(self.ejected))}"
        return self.snapshot.unhealthy_reason or "no healthy targets"


class RemoteOutcomes:
    """The proxy's outcome reports, sent to the scheduler's health board."""

    def __init__(self, view: SnapshotView, link: Link) -> None:
        self.view = view
        self.link = link
        self.worker_urls: tuple[str, ...] = tuple(dict.fromkeys(t.worker_url for t in view.targets))
        self._failing: set[str] = set()

    def _send(self, report: Report) -> int:
        try:
            self.link.send(report)
        except LinkClosed:
            pass
        self.view.reports_sent += 1
        return self.view.reports_sent

    def report_success(self, url: str) -> None:
        if url in self._failing:  # the board's outlier count resets only on news (hot path: a set lookup)
            self._failing.discard(url)
            self._send(Report(url, True))

    @property
    def targets(self) -> tuple[BackendTarget, ...]:
        return self.view.targets

    def report_rank_refused(self, target: BackendTarget, detail: str) -> bool:
        """The worker refused ``target``'s DP rank: out of this relay's rotation at once, and the
        scheduler's board told (docs/operations.md §11.3)."""
        number = self._send(Report(target.worker_url, True, detail, refused_rank_target=target.index))
        if target in self.view.healthy_targets():
            self.view.refuse_rank(target.index, number)
            return True
        return False

    def report_failure(self, url: str, detail: str, *, eject_now: bool = False, suspect: bool = False) -> bool:
        self._failing.add(url)
        number = self._send(Report(url, False, detail, eject_now, suspect))
        if (eject_now or suspect) and any(t.worker_url == url for t in self.view.healthy_targets()):
            if eject_now:
                self.view.eject(url, number)
            else:
                self.view.suspect(url, number)
            return True
        return False


@attrs.define(eq=False)
class RemoteLease:
    """A lease granted by the scheduler (the proxy's ``Lease``)."""

    target: BackendTarget
    request_id: str
    program: str
    queue_seconds: float
    number: int
    link: Link
    attempt: int = 0
    wants_usage: bool = True  # usage drives Program accounting
    outcome: Outcome | None = None
    pending: _Pending | None = None  # its slot in the dispatcher (the relay's view of its leases)

    def finish(self, outcome: Outcome) -> None:
        if self.outcome is not None:
            raise RuntimeError(f"Program lease {self.request_id} finished twice")
        self.outcome = outcome
        if self.pending is not None:
            self.pending.held = False  # the scheduler lets it go when it reads the Finish
        try:
            self.link.send(Finish(self.number, outcome))
        except LinkClosed:
            pass  # the scheduler is gone: nothing left to account


@attrs.define(eq=False)
class _Pending:
    """A lease waiting for (or holding) the scheduler's answer.  A Program or interactive lease is
    answered once: ``answered`` and ``reply`` (None when the scheduler is gone); a batch lease
    may be admitted again after each preemption, so its answers queue in ``replies``."""

    replies: trio.MemorySendChannel[Grant | Refuse] | None = None
    answered: trio.Event = attrs.field(factory=trio.Event)
    reply: Grant | Refuse | None = None
    scope: trio.CancelScope | None = None  # the batch attempt being forwarded (preemptible)
    lease: RemoteLease | None = None
    key: tuple[str, str] | None = None  # a Program lease: (model pool, Program id)
    passed: bool = False  # forwarded under a resume pass, before the answer
    ended: bool = False  # (passed) the lease ended before its answer arrived: dropped with it
    # the scheduler holds it as far as the relay knows: asked, no Finish or Release sent, no Refuse
    # read (the relay's view in its Load frames, docs/architecture.md §9)
    held: bool = True
    since: float = attrs.field(factory=trio.current_time)  # when it was asked (this process's clock)
    watch: QueueWatch | None = None  # a streaming request's queue position for its SSE comments


@attrs.frozen
class _RelayPass:
    """A resume pass (docs/architecture.md §9): the Program's next request goes to ``target``."""

    number: int
    target: BackendTarget
    program: str  # the redacted Program id of the Grant it came with


@attrs.define
class RelayCounters:
    asked_count: int = 0
    granted_count: int = 0
    refused_count: int = 0
    finished_count: int = 0
    released_count: int = 0
    preempted_count: int = 0
    passes_received_count: int = 0  # Grants that carried a resume pass
    passes_revoked_count: int = 0  # Revoke frames that dropped a pass held here
    passed_count: int = 0  # Program requests forwarded under a pass (without waiting)
    passed_refused_count: int = 0  # ... that the scheduler refused afterwards (their target was gone)
    passes_dropped_count: int = 0  # passes dropped here without a Revoke (Drop frames sent)


class RemoteProgramDispatcher:
    """The relay's dispatcher for requests the scheduler decides (see the module doc)."""

    def __init__(self, link: Link, view: SnapshotView | None = None) -> None:
        self.link = link
        # the relay's rotation: a resume pass to a worker out of it is dropped, not used (None:
        # every pass is used, as a scripted test's relay does)
        self.rotation = view
        self.gone = False
        self._numbers = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self.counters = RelayCounters()
        self.interactive = _Kind(self, "interactive")
        self.passes: dict[tuple[str, str], _RelayPass] = {}  # Program -> its resume pass (bounded)

    # ---- frames from the scheduler (called by the relay's reader task) ----

    def on_reply(self, frame: Grant | Refuse) -> None:
        pending = self._pending.get(frame.lease)
        if pending is None:
            if type(frame) is Grant and frame.pass_number:
                self._drop(frame.pass_number)  # the lease was released meanwhile: nobody keeps its pass
            return
        if type(frame) is Refuse:
            pending.held = False  # the scheduler no longer has it
        if pending.replies is None:
            if not pending.answered.is_set():
                pending.reply = frame
                pending.answered.set()
            if type(frame) is Grant:
                if frame.pass_number:
                    if pending.key is not None:
                        self._keep_pass(pending.key, frame)
                    else:
                        self._drop(frame.pass_number)
            elif pending.passed:
                self.counters.passed_refused_count += 1  # (already forwarded: it fails upstream)
            if pending.ended:
                del self._pending[frame.lease]
            return
        try:
            pending.replies.send_nowait(frame)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _keep_pass(self, key: tuple[str, str], grant: Grant) -> None:
        passes = self.passes
        if key not in passes and len(passes) >= MAX_PASSES:
            self._drop(passes.pop(next(iter(passes))).number)
        passes[key] = _RelayPass(grant.pass_number, grant.admitted.target, grant.admitted.program)
        self.counters.passes_received_count += 1

    def _drop(self, number: int) -> None:
        """Tell the scheduler this relay no longer holds pass ``number`` (it was not revoked)."""
        self.counters.passes_dropped_count += 1
        try:
            self.link.send(Drop(number))
        except LinkClosed:
            pass

    def on_revoke(self, frame: Revoke) -> None:
        key = (frame.model_pool, frame.program_id)
        held = self.passes.get(key)
        if held is not None and held.number == frame.number:
            del self.passes[key]
            self.counters.passes_revoked_count += 1

    def on_queued(self, frame: Queued) -> None:
        pending = self._pending.get(frame.lease)
        if pending is not None and pending.watch is not None and not pending.answered.is_set():
            pending.watch.tell(frame.position, frame.eta_seconds, trio.current_time())

    def on_preempt(self, frame: Preempt) -> None:
        pending = self._pending.get(frame.lease)
        if pending is None or pending.scope is None:
            return
        if pending.lease is not None and pending.lease.outcome is None:
            self.counters.preempted_count += 1
            pending.scope.cancel()

    def scheduler_gone(self) -> None:
        """The scheduler's socket ended: refuse what waits and everything new (503)."""
        self.gone = True
        self.passes.clear()
        for number in [n for n, pending in self._pending.items() if pending.ended]:
            del self._pending[number]  # passed requests that ended: no answer will come
        for pending in self._pending.values():
            if pending.replies is None:
                pending.answered.set()  # no reply: refused as scheduler_unavailable
            else:
                pending.replies.close()

    def open_leases(self) -> int:
        return len(self._pending)

    def view(self) -> tuple[int, int, float | None]:
        """The relay's own view for its Load frame: the leases the scheduler holds as far as this
        relay knows, the passes it holds, and when its oldest open lease was asked (None: none)."""
        held = 0
        oldest: float | None = None
        for pending in self._pending.values():
            held += pending.held
            if oldest is None or pending.since < oldest:
                oldest = pending.since
        return held, len(self.passes), oldest

    # ---- the Dispatcher protocol ----

    def lease(self, req: ProxyRequest) -> AbstractAsyncContextManager[RemoteLease]:
        return self._lease(req, "program")

    def _usable(self, held: _RelayPass, req: ProxyRequest) -> bool:
        """Whether ``req`` may go to ``held``'s target at once: not when the request could not
        reach that worker before (a failover, whose pass came with the Grant of the attempt that
        failed to connect), nor when the worker is out of this relay's rotation (a refused or
        timed-out connect seen here, or the scheduler's last snapshot) - such a request asks the
        scheduler, whose board has the worker out of rotation by then (docs/operations.md §11.2)."""
        url = held.target.worker_url
        if url in req.avoid_workers:
            return False
        return self.rotation is None or self.rotation.in_rotation(url)

    def _ask(self, req: ProxyRequest, kind: str, pending: _Pending, held: _RelayPass | None = None) -> int:
        if self.gone:
            raise DispatchRejected(SCHEDULER_UNAVAILABLE)
        number = next(self._numbers)
        self._pending[number] = pending
        wire = WireRequest.of(req, output_cap(req.body))
        ask = Ask(number, kind, wire) if held is None else Ask(number, kind, wire, held.number, held.target.target_id)
        try:
            self.link.send(ask)
        except LinkClosed:
            del self._pending[number]
            raise DispatchRejected(SCHEDULER_UNAVAILABLE) from None
        self.counters.asked_count += 1
        return number

    async def _reply(self, recv: trio.MemoryReceiveChannel[Grant | Refuse]) -> Grant:
        try:
            reply = await recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise DispatchRejected(SCHEDULER_UNAVAILABLE) from None
        return self._granted(reply)

    def _granted(self, reply: Grant | Refuse | None) -> Grant:
        if reply is None:
            raise DispatchRejected(SCHEDULER_UNAVAILABLE)
        if isinstance(reply, Refuse):
            self.counters.refused_count += 1
            raise DispatchRejected(reply.rejection)
        self.counters.granted_count += 1
        return reply

    def _lease_of(self, number: int, grant: Grant, pending: _Pending) -> RemoteLease:
        a: Admitted = grant.admitted
        return RemoteLease(
            a.target, a.request_id, a.program, a.queue_seconds, number, self.link, grant.attempt, pending=pending
        )

    def _end(self, number: int, lease: RemoteLease | None, refused: bool) -> None:
        pending = self._pending.pop(number, None)
        outcome = None if lease is None else lease.outcome
        if outcome is not None and not outcome.success and pending is not None and pending.key is not None:
            dropped = self.passes.pop(pending.key, None)  # a failure pauses its Program: the pass would race the Revoke
            if dropped is not None:
                self._drop(dropped.number)
        if pending is not None and pending.passed:
            if not pending.answered.is_set():
                if outcome is not None:  # answered after its Finish (a Release is never answered)
                    pending.ended = True  # kept until then: the Grant may carry the next pass
                    self._pending[number] = pending
            elif type(pending.reply) is Refuse:
                refused = True  # the core dropped it: nothing to release
        if refused:
            return
        if lease is not None and lease.outcome is not None:
            self.counters.finished_count += 1  # Finish went out with lease.finish
            return
        self.counters.released_count += 1
        try:
            self.link.send(Release(number))
        except LinkClosed:
            pass

    @asynccontextmanager
    async def _lease(self, req: ProxyRequest, kind: str) -> AsyncIterator[RemoteLease]:
        pending = _Pending()  # answered once: an event and a slot, no channel (docs/benchmarks.md §10.3.1)
        held = None
        if kind == "program" and req.identity is not None:
            pending.key = (req.model_pool, req.identity.identity.program_id)
            if self.passes:
                held = self.passes.pop(pending.key, None)  # one request per pass
                if held is not None and not self._usable(held, req):
                    self._drop(held.number)  # the request asks the scheduler instead
                    held = None
        if held is not None:  # forwarded now; the answer arrives while (or after) it runs
            pending.passed = True
            number = self._ask(req, kind, pending, held)
            self.counters.passed_count += 1
            lease = RemoteLease(held.target, req.request_id, held.program, 0.0, number, self.link, pending=pending)
            try:
                yield lease
            finally:
                self._end(number, lease, False)
            return
        pending.watch = req.queue_watch
        number = self._ask(req, kind, pending)
        granted: RemoteLease | None = None
        refused = False
        try:
            try:
                try:
                    await pending.answered.wait()
                finally:
                    if pending.watch is not None:
                        pending.watch.done()
                grant = self._granted(pending.reply)
            except DispatchRejected:
                refused = True
                raise
            granted = self._lease_of(number, grant, pending)
            yield granted
        finally:
            self._end(number, granted, refused)

    async def serve(self, req: ProxyRequest, forward: Callable[[RemoteLease], Awaitable[object]]) -> None:
        """A batch-class request (the proxy's ``BatchServer``): ``forward`` runs once per admission;
        a ``Preempt`` from the scheduler cancels the attempt before anything reached the client."""
        send, recv = trio.open_memory_channel[Grant | Refuse](MAX_PREEMPTIONS_PER_REQUEST + 2)
        pending = _Pending(send)
        number = self._ask(req, "batch", pending)
        lease: RemoteLease | None = None
        refused = False
        try:
            with recv:
                while True:
                    try:
                        grant = await self._reply(recv)
                    except DispatchRejected:
                        refused = True
                        raise
                    lease = pending.lease = self._lease_of(number, grant, pending)
                    with trio.CancelScope() as scope:
                        pending.scope = scope
                        await forward(lease)
                    pending.scope = None
                    if scope.cancelled_caught and lease.outcome is None:
                        lease = pending.lease = None  # preempted: wait for the next admission
                        continue
                    return
        finally:
            self._end(number, lease, refused)


@attrs.frozen(eq=False)
class _Kind:
    """The interactive dispatcher of the relay (``InteractiveSubmitted`` on the scheduler side)."""

    remote: RemoteProgramDispatcher
    kind: str

    def lease(self, req: ProxyRequest) -> AbstractAsyncContextManager[RemoteLease]:
        return self.remote._lease(req, self.kind)


async def read_scheduler_frames(
    link: Link, remote: RemoteProgramDispatcher | None, view: SnapshotView, exposition: Callable[[], str]
) -> None:
    """Handle the scheduler's frames until its socket ends; then every waiting and new request of
    ``remote`` is refused (503 ``scheduler_unavailable``)."""
    try:
        async for frame in link.frames():
            if isinstance(frame, Grant | Refuse):
                if remote is not None:
                    remote.on_reply(frame)
            elif isinstance(frame, Queued):
                if remote is not None:
                    remote.on_queued(frame)
            elif isinstance(frame, Preempt):
                if remote is not None:
                    remote.on_preempt(frame)
            elif isinstance(frame, Revoke):
                if remote is not None:
                    remote.on_revoke(frame)
            elif isinstance(frame, Snapshot):
                view.apply(frame)
            elif isinstance(frame, MetricsAsk):
                try:
                    link.send(MetricsText(frame.token, exposition()))
                except LinkClosed:
                    pass
            else:
                raise ValueError(f"unexpected frame from the scheduler: {type(frame).__name__}")
    finally:
        if remote is not None:
            remote.scheduler_gone()


async def run_load_reports(
    link: Link, in_flight: Callable[[], Sequence[int]], remote: RemoteProgramDispatcher | None = None
) -> None:
    """Send the relay's own view (:class:`~daemon.dataplane.wire.Load`: native in-flight counts,
    the leases and passes of ``remote``, the age of its oldest open lease, the scheduler frames
    handled) every :data:`LOAD_SECONDS` when it changed.  The oldest lease's age is not part of
    what "changed" means (it grows by itself): the scheduler ages it from the frame's arrival."""
    last: tuple[Any, ...] | None = None
    while True:
        counts = tuple(in_flight())
        leases, passes, oldest = (0, 0, None) if remote is None else remote.view()
        read = link.frames_received
        key = (counts, leases, passes, oldest, read)
        if key != last:
            last = key
            age = None if oldest is None else trio.current_time() - oldest
            try:
                link.send(Load(counts, leases, passes, age, read))
            except LinkClosed:
                return
        await trio.sleep(LOAD_SECONDS)


# ------------------------------------------------------------------------------ the ASGI app

# The scheduler process's internal listener closes a connection idle for 75 s (its keep-alive
# timeout, daemon/http/serve.py): the relay closes its own idle ones first, this long after their
# last answer, and at once when the scheduler process closes one (docs/operations.md §13.1).
FORWARD_KEEPALIVE_SECONDS = 5.0


def forwarding_client() -> tuple[httpx.AsyncClient, ReapedTransport]:
    """The relay's client for :func:`forward_to_scheduler` and its transport, whose reaper
    (:meth:`~daemon.pool_reaper.ReapedTransport.run_reaper`) the relay runs: without it an idle
    connection stayed open until the next forwarded request, in CLOSE-WAIT after the scheduler's
    keep-alive timeout.  httpx's connection limits; loopback only (no proxy or ``.netrc`` from the
    environment)."""
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=FORWARD_KEEPALIVE_SECONDS)
    transport = ReapedTransport(limits=limits)
    client = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(None, connect=5.0), trust_env=False)
    return client, transport


HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer", "host"}
)


class _ClientLeft(Exception):
    """The client went away while its request body was being forwarded."""


class _BodyStalled(Exception):
    """The client's request body made no progress for ``limits.body_read_timeout_seconds``."""


async def _body_message(receive: Any, stall_seconds: float) -> dict[str, Any]:
    with trio.move_on_after(stall_seconds):
        message: dict[str, Any] = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientLeft
        return message
    raise _BodyStalled


async def _rest_of_body(first: bytes, receive: Any, stall_seconds: float) -> AsyncIterator[bytes]:
    """A body of several ASGI messages, passed on as it arrives (never held whole in the relay)."""
    if first:
        yield first
    while True:
        message = await _body_message(receive, stall_seconds)
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def forward_to_scheduler(
    client: httpx.AsyncClient,
    base_url: str,
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    *,
    stall_seconds: float,
) -> None:
    """Answer a non-proxy route with the scheduler process's answer (both ways streamed through).

    A body that came in one ASGI message is sent as it is; a longer one (a Batch API upload) is
    streamed to the scheduler process as it arrives, so the relay holds no more than a read of it
    and the scheduler's own limits apply.  A body that makes no progress for ``stall_seconds`` is a
    408 ``body_read_timeout``, as in one process; a client that leaves ends the forward
    (docs/operations.md §14)."""
    from daemon.http.app import AsgiSink
    from daemon.http.errors import ApiError
    from daemon.http.proxy import send_error

    try:
        first = await _body_message(receive, stall_seconds)
    except _ClientLeft:
        return
    except _BodyStalled:
        await send_error(AsgiSink(send), _stalled(stall_seconds))
        return
    body = bytes(first.get("body", b""))
    content: bytes | AsyncIterator[bytes] = body
    if first.get("more_body", False):
        content = _rest_of_body(body, receive, stall_seconds)
    headers = [(k, v) for k, v in scope["headers"] if k.decode("latin-1").lower() not in HOP_BY_HOP]
    path = literal_path(scope.get("raw_path") or scope["path"].encode())
    query = scope.get("query_string", b"")
    url = base_url + path + ("?" + query.decode("latin-1") if query else "")
    request = client.build_request(scope["method"], url, headers=headers, content=content)
    try:
        response = await client.send(request, stream=True)
    except _ClientLeft:
        return
    except _BodyStalled:
        await send_error(AsgiSink(send), _stalled(stall_seconds))
        return
    except httpx.HTTPError as exc:
        error = ApiError(
            503, f"the agentd scheduler process is unavailable: {type(exc).__name__}", code="scheduler_unavailable"
        )
        await send_error(AsgiSink(send), error)
        return
    try:
        out_headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in response.headers.multi_items()
            # the relay's own server writes `date` (hypercorn's protocol would send both); the
            # scheduler's content-length stays (the raw bytes pass unchanged): without it the
            # client would get a chunked answer (docs/operations.md §13.1)
            if k.lower() not in HOP_BY_HOP and k.lower() != "date"
        ]
        await send({"type": "http.response.start", "status": response.status_code, "headers": out_headers})
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await response.aclose()


def literal_path(raw: bytes) -> str:
    """The request target's path as the scheduler process must see it: as the client sent it.
    httpx resolves dot segments (``/v1/../metrics`` became ``/metrics``) and takes a ``#`` for
    the start of a fragment (``/v1/files/f#x`` became ``/v1/files/f``), which one process never
    does (docs/operations.md §14: ``..`` is not resolved).  So ``.`` and ``..`` segments and ``#``
    travel percent-encoded, which the scheduler process decodes back to the client's path."""
    segments = raw.decode("latin-1").replace("#", "%23").split("/")
    return "/".join(s.replace(".", "%2E") if s in (".", "..") else s for s in segments)


def _stalled(seconds: float) -> ApiError:
    from daemon.http.errors import ApiError

    return ApiError(
        408,
        f"the request body made no progress for limits.body_read_timeout_seconds ({seconds:g} s)",
        code="body_read_timeout",
    )
