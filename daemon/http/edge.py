"""Request-level limits and the graceful drain of the agent-facing routes (docs/operations.md §10).

:class:`Edge` is owned by the HTTP app and is the single writer of its counters:

* **in-flight cap and edge queue** (:meth:`Edge.slot`): at most ``max_in_flight_requests``
  agent-facing requests are worked on at once (a request waiting in a scheduler's own queue
  counts); up to ``max_queued_requests`` more wait here in FIFO order, each at most
  ``queue_timeout_seconds`` (then a JSON 503 ``queue_timeout``); one more is refused at once
  with a JSON 429 ``too_many_requests``.  Both carry ``Retry-After``.
* **drain** (:meth:`Edge.begin_drain`, F9 of issue 14): from SIGTERM on, a new request gets a
  JSON 503 ``server_shutting_down`` + ``Retry-After`` (hypercorn closes its connection after the
  answer), requests waiting in the edge queue get the same answer at once (they have no slot
  and would only wait out the grace), and everything admitted keeps running.  At the deadline
  (``shutdown_grace_seconds`` after the signal) every request still running is cancelled and
  answered by its handler (:func:`drained_answer`): a JSON 503 when nothing was sent yet, an
  error event and ``data: [DONE]`` for a stream.  No request ends with a bare connection close.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from daemon.config import LimitsConfig
from daemon.http.errors import ApiError, error_dict, sse_error_tail

DRAINING_MESSAGE = "agentd is shutting down; retry on another replica or after Retry-After"


@attrs.define(eq=False)
class Ticket:
    """One agent-facing request between its body read and its last byte."""

    scope: trio.CancelScope | None = None
    queued: bool = False
    drained: bool = False  # cancelled by the drain: the handler must answer 503 / end the stream
    refused: ApiError | None = None  # why a queued request was turned away
    large_body_bytes: int = 0  # its share of limits.max_large_body_bytes_in_flight, given back at its close


@attrs.define(eq=False)
class EdgeStatistics:
    in_flight: int
    queued: int
    admitted_count: int
    refused_queue_full_count: int
    refused_queue_timeout_count: int
    refused_draining_count: int
    drained_count: int
    draining: bool
    large_body_bytes_in_flight: int = 0
    large_body_waiting: int = 0
    refused_large_body_timeout_count: int = 0


# A parsed JSON body lives as long as its request and takes up to about 20x the body's size in
# memory (a million small members in 12 MB: 300 MB): the bytes of bodies above this size that are
# held at once are bounded by limits.max_large_body_bytes_in_flight (docs/operations.md §14).
LARGE_BODY_BYTES = 1024 * 1024


@attrs.define(eq=False)
class _LargeWaiter:
    weight: int
    granted: trio.Event = attrs.field(factory=trio.Event)
    refused: ApiError | None = None


class LargeBodies:
    """The per-process budget of large request bodies (over :data:`LARGE_BODY_BYTES`) held at once,
    from before the parse to the request's end; a body that does not fit waits in FIFO order (a
    large waiter is not overtaken by smaller ones).  A body larger than the whole budget takes all
    of it: it waits until nothing else is held."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self._waiting: list[_LargeWaiter] = []
        self.refused_timeout_count = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def take(self, size: int, timeout_seconds: float, retry_after: tuple[tuple[str, str], ...] = ()) -> int:
        """Hold ``size`` bytes of the budget (returns the weight to :meth:`give_back`); a JSON 503
        ``queue_timeout`` when it did not fit within ``timeout_seconds``."""
        weight = min(size, self.budget)
        if not self._waiting and self.held + weight <= self.budget:
            self.held += weight
            return weight
        waiter = _LargeWaiter(weight)
        self._waiting.append(waiter)
        try:
            with trio.move_on_after(timeout_seconds):
                await waiter.granted.wait()
        except BaseException:  # cancelled (client gone, drain): never keep bytes handed over
            if waiter.granted.is_set() and waiter.refused is None:
                self.give_back(weight)
            raise
        finally:
            if not waiter.granted.is_set():
                self._waiting.remove(waiter)
                self._grant()  # a large waiter that leaves may unblock smaller ones behind it
        if waiter.refused is not None:
            raise waiter.refused
        if not waiter.granted.is_set():
            self.refused_timeout_count += 1
            raise ApiError(
                503,
                f"request bodies over {LARGE_BODY_BYTES} bytes are at their limit "
                f"(limits.max_large_body_bytes_in_flight = {self.budget}) and none ended within "
                f"limits.queue_timeout_seconds ({timeout_seconds:g} s); retry after Retry-After",
                code="queue_timeout",
                headers=retry_after,
            )
        return weight

    def give_back(self, weight: int) -> None:
        self.held -= weight
        self._grant()

    def refuse_waiters(self, error: Callable[[], ApiError]) -> None:
        """Turn every waiter away now (the drain)."""
        for waiter in self._waiting:
            waiter.refused = error()
            waiter.granted.set()
        self._waiting.clear()

    def _grant(self) -> None:
        while self._waiting and self.held + self._waiting[0].weight <= self.budget:
            waiter = self._waiting.pop(0)
            self.held += waiter.weight
            waiter.granted.set()


class Edge:
    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits
        self.retry_after = (("retry-after", str(limits.retry_after_seconds)),)
        self.in_flight = 0
        self._waiting: list[tuple[Ticket, trio.Event]] = []  # FIFO
        self._tickets: set[Ticket] = set()
        self.draining = False
        self.drain_deadline = math.inf
        self._admitted = 0
        self._refused_full = 0
        self._refused_timeout = 0
        self._refused_draining = 0
        self._drained = 0
        self._idle = trio.Event()  # set once the drain began and no ticket is open
        # request bodies over LARGE_BODY_BYTES held at once (docs/operations.md §14)
        self.large_bodies = LargeBodies(limits.max_large_body_bytes_in_flight)
        self.shutdown_at: float | None = None  # when the signal arrived (the grace counts from it)

    # ----------------------------------------------------------------------------- statistics

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        """Tickets open (queued or admitted): zero when the edge is idle."""
        return len(self._tickets)

    def statistics(self) -> EdgeStatistics:
        return EdgeStatistics(
            self.in_flight,
            self.queued,
            self._admitted,
            self._refused_full,
            self._refused_timeout,
            self._refused_draining,
            self._drained,
            self.draining,
            self.large_bodies.held,
            self.large_bodies.waiting,
            self.large_bodies.refused_timeout_count,
        )

    # ----------------------------------------------------------------------------- errors

    def draining_error(self) -> ApiError:
        self._refused_draining += 1
        return ApiError(503, DRAINING_MESSAGE, code="server_shutting_down", headers=self.retry_after)

    # ----------------------------------------------------------------------------- slots

    def open_ticket(self) -> Ticket:
        """Register a request (raises the draining 503 once the drain began)."""
        if self.draining:
            raise self.draining_error()
        ticket = Ticket()
        self._tickets.add(ticket)
        return ticket

    async def hold_large_body(self, ticket: Ticket, size: int) -> None:
        """The ticket's large body takes its share of the budget until the ticket closes."""
        if self.draining:
            raise self.draining_error()
        limits = self.limits
        ticket.large_body_bytes = await self.large_bodies.take(size, limits.queue_timeout_seconds, self.retry_after)

    def close_ticket(self, ticket: Ticket) -> None:
        if ticket.large_body_bytes:
            self.large_bodies.give_back(ticket.large_body_bytes)
            ticket.large_body_bytes = 0
        self._tickets.discard(ticket)
        if self.draining and not self._tickets:
            self._idle.set()

    def slot(self, ticket: Ticket) -> _Slot:
        """An in-flight slot for the ticket's request (waits in the edge queue when all are taken);
        an async context manager (a class: no async generator per request, docs/benchmarks.md §10.2.4)."""
        return _Slot(self, ticket)

    async def _take(self, ticket: Ticket) -> None:
        if self.in_flight >= self.limits.max_in_flight_requests or self._waiting:
            await self._wait(ticket)
        else:
            self.in_flight += 1
        self._admitted += 1

    async def _wait(self, ticket: Ticket) -> None:
        if len(self._waiting) >= self.limits.max_queued_requests:
            self._refused_full += 1
            raise ApiError(
                429,
                f"agentd is at its request limit ({self.limits.max_in_flight_requests} in flight, "
                f"{self.limits.max_queued_requests} queued: limits.max_queued_requests); retry after Retry-After",
                code="too_many_requests",
                headers=self.retry_after,
            )
        granted = trio.Event()
        entry = (ticket, granted)
        self._waiting.append(entry)
        ticket.queued = True
        try:
            with trio.move_on_after(self.limits.queue_timeout_seconds):
                await granted.wait()
        except BaseException:  # cancelled (client gone, drain deadline): never keep a handed-over slot
            if granted.is_set() and ticket.refused is None:
                self._release()
            raise
        finally:
            ticket.queued = False
            if not granted.is_set():
                self._waiting.remove(entry)
        if ticket.refused is not None:
            raise ticket.refused
        if not granted.is_set():
            self._refused_timeout += 1
            raise ApiError(
                503,
                f"no request slot became free within limits.queue_timeout_seconds "
                f"({self.limits.queue_timeout_seconds:g} s); retry after Retry-After",
                code="queue_timeout",
                headers=self.retry_after,
            )

    def _release(self) -> None:
        while self._waiting:
            ticket, granted = self._waiting.pop(0)
            if ticket.refused is None:
                granted.set()  # the slot passes straight to the next waiter
                return
        self.in_flight -= 1

    # ----------------------------------------------------------------------------- drain

    def note_shutdown(self) -> None:
        """The shutdown was requested now (called by the signal handler before it wakes anyone)."""
        if self.shutdown_at is None:
            self.shutdown_at = trio.current_time()

    def begin_drain(self, grace_seconds: float) -> None:
        """Stop taking requests; turn the edge queue away now; the rest by the deadline, counted
        from the signal (a loaded machine may run this task a little later)."""
        if self.draining:
            return
        self.draining = True
        start = self.shutdown_at if self.shutdown_at is not None else trio.current_time()
        self.drain_deadline = start + grace_seconds
        for ticket, granted in list(self._waiting):
            ticket.refused = self.draining_error()
            granted.set()
        self._waiting.clear()
        self.large_bodies.refuse_waiters(self.draining_error)
        if not self._tickets:
            self._idle.set()

    def expire(self) -> int:
        """The drain deadline: cancel every request still running; each handler answers it."""
        count = 0
        for ticket in list(self._tickets):
            if ticket.scope is not None and not ticket.drained:
                ticket.drained = True
                ticket.scope.cancel()
                count += 1
        self._drained += count
        return count

    async def run_drain(self, shutdown: trio.Event, grace_seconds: float) -> None:
        """Wait for ``shutdown``, drain, and expire the stragglers at the deadline."""
        await shutdown.wait()
        self.begin_drain(grace_seconds)
        with trio.move_on_at(self.drain_deadline):
            await self._idle.wait()
            return
        self.expire()


def sse_error_event(message: str, code: str) -> bytes:
    """An OpenAI-shaped error as one SSE event, followed by ``data: [DONE]``."""
    return sse_error_tail(error_dict(message, "server_error", None, code))


DRAINED_STREAM_MESSAGE = "agentd shut down before this response finished (shutdown_grace_seconds ran out)"


class _Slot:
    """:meth:`Edge.slot`: the slot is taken on entry and released on exit (not when taking it failed)."""

    __slots__ = ("_edge", "_ticket")

    def __init__(self, edge: Edge, ticket: Ticket) -> None:
        self._edge = edge
        self._ticket = ticket

    async def __aenter__(self) -> None:
        await self._edge._take(self._ticket)

    async def __aexit__(self, *exc: object) -> None:
        self._edge._release()


class EdgeCollector(Collector):
    """The edge's limits and the listener's connection cap on ``/metrics`` (docs/operations.md
    §10.3), read at scrape time from :meth:`Edge.statistics` and the listener's ``ServerState``.
    Every process that serves clients registers one, so with relay processes the refusals of
    every relay add up on the scheduler's ``/metrics`` (before session 31 they were only in the
    diagnostics of the process that refused, and a relay's diagnostics are not served)."""

    def __init__(self, edge: Edge, state: Callable[[], Any] | None = None) -> None:
        self._edge = edge
        self._state = state

    def collect(self) -> Iterator[Metric]:
        s = self._edge.statistics()
        yield GaugeMetricFamily(
            "agentd_edge_in_flight_requests",
            "Requests to the agent and forwarded routes holding an edge slot (limits.max_in_flight_requests).",
            value=s.in_flight,
        )
        yield GaugeMetricFamily(
            "agentd_edge_queued_requests",
            "Requests waiting in the edge queue for a slot (limits.max_queued_requests).",
            value=s.queued,
        )
        yield CounterMetricFamily(
            "agentd_edge_admitted_requests", "Requests that got an edge slot.", value=s.admitted_count
        )
        yield GaugeMetricFamily(
            "agentd_edge_large_body_bytes",
            "Bytes of request bodies over 1 MiB held by requests (limits.max_large_body_bytes_in_flight).",
            value=s.large_body_bytes_in_flight,
        )
        refused = CounterMetricFamily(
            "agentd_edge_refused_requests",
            "Requests the edge refused, by reason: queue_full (429 too_many_requests), queue_timeout "
            "(503 queue_timeout), draining (503 server_shutting_down), large_body_timeout (503 queue_timeout: "
            "limits.max_large_body_bytes_in_flight).",
            labels=["reason"],
        )
        refused.add_metric(["queue_full"], s.refused_queue_full_count)
        refused.add_metric(["queue_timeout"], s.refused_queue_timeout_count)
        refused.add_metric(["draining"], s.refused_draining_count)
        refused.add_metric(["large_body_timeout"], s.refused_large_body_timeout_count)
        yield refused
        yield CounterMetricFamily(
            "agentd_edge_drained_requests",
            "Requests cut at the drain's deadline (request_drained).",
            value=s.drained_count,
        )
        state = None if self._state is None else self._state()
        if state is not None:
            yield GaugeMetricFamily("agentd_connections_open", "Open client connections.", value=state.open_connections)
            yield CounterMetricFamily(
                "agentd_connections_rejected",
                "Connections refused over limits.max_connections (503 too_many_connections).",
                value=state.rejected_connections,
            )
            yield CounterMetricFamily(
                "agentd_client_connections_rejected",
                "Connections refused over limits.max_connections_per_client (429 too_many_client_connections).",
                value=state.rejected_client_connections,
            )
            yield CounterMetricFamily(
                "agentd_connections_write_timeouts",
                "Connections closed after a write blocked for limits.client_write_timeout_seconds.",
                value=state.write_timeouts,
            )
