"""The relay's remote dispatcher against the scheduler's hub over a real Unix socket pair, in one
process under virtual time: the scheduler side runs the real ProgramDispatcher and actors (only the
workers are faked, at the HTTP boundary), the relay side is what a relay process runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from program_fakes import FakeHealth, daemon_config, ok, program_request, program_scheduling

from actors.core.config import BackendTarget, BatchJobsConfig
from actors.core.events import RequestAbandoned
from actors.core.ids import RequestId
from daemon.config import AgentdConfig
from daemon.dataplane.link import Link
from daemon.dataplane.relay import (
    RemoteOutcomes,
    RemoteProgramDispatcher,
    SnapshotView,
    read_scheduler_frames,
    run_load_reports,
)
from daemon.dataplane.scheduler_side import SNAPSHOT_SECONDS, DataPlaneHub, RelayConnection
from daemon.dataplane.wire import Hello, Load, Snapshot
from daemon.dispatch import DispatchRejected, NativeDispatcher, ProxyRequest
from daemon.http.priority import PriorityInfo
from daemon.http.queue_eta import QueueWatch
from daemon.http.requests import PromptSize
from daemon.program_dispatch import ProgramDispatcher


@attrs.define
class Board(FakeHealth):
    """The scheduler's health board as the hub uses it: a view plus the outcome reports."""

    reports: list[tuple[str, bool, bool]] = attrs.field(factory=list)

    def report_success(self, url: str) -> None:
        self.reports.append((url, True, False))

    def report_failure(self, url: str, detail: str, *, eject_now: bool = False, suspect: bool = False) -> bool:
        self.reports.append((url, False, eject_now))
        if eject_now:
            self.unhealthy_urls.add(url)
        return eject_now


@attrs.define(eq=False)
class Plane:
    dispatcher: ProgramDispatcher | None
    hub: DataPlaneHub
    conn: RelayConnection
    remote: RemoteProgramDispatcher
    view: SnapshotView
    board: Board
    relay_link: Link
    nursery: trio.Nursery


@asynccontextmanager
async def _connected(
    targets: tuple[BackendTarget, ...],
    board: Board,
    program: ProgramDispatcher | None,
    *,
    hub: DataPlaneHub | None = None,
    index: int = 0,
    reports: bool = False,
) -> AsyncIterator[Plane]:
    """A relay connected to ``hub`` (a new one over ``program`` unless given: a second relay);
    ``reports``: the relay sends its own view (Load frames) as a relay process does."""
    own_hub = hub is None
    if hub is None:
        hub = DataPlaneHub(targets, board, program)
    left, right = trio.socket.socketpair()
    conn = hub.connect(index, Link(trio.SocketStream(left)))
    relay_link = Link(trio.SocketStream(right))
    view = SnapshotView(targets)
    remote = RemoteProgramDispatcher(relay_link, view)  # (its rotation, as a relay process's)
    async with trio.open_nursery() as nursery:
        if own_hub:
            nursery.start_soon(hub.run_publisher)
        nursery.start_soon(conn.serve)
        nursery.start_soon(relay_link.run_writer)
        nursery.start_soon(read_scheduler_frames, relay_link, remote, view, lambda: "relay_only_total 3.0\n")
        relay_link.send(Hello(index, 4242))
        await view.first.wait()
        if reports:
            nursery.start_soon(run_load_reports, relay_link, lambda: (0,) * len(targets), remote)
        try:
            yield Plane(program, hub, conn, remote, view, board, relay_link, nursery)
        finally:
            # shielded: in a cancelled nursery the close's checkpoint raises Cancelled, which would
            # replace the body's own exception and be caught by that nursery: a failing assertion
            # in a test would pass
            with trio.CancelScope(shield=True):
                for link in (conn.link, relay_link):
                    await trio.aclose_forcefully(link.stream)
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def plane(cfg: AgentdConfig, *, program: bool = True) -> AsyncIterator[Plane]:
    targets = cfg.targets()
    board = Board(targets)
    async with program_scheduling(cfg, health=board) as (dispatcher, _, _):
        async with _connected(targets, board, dispatcher if program else None) as p:
            yield p


async def _settled(p: Plane, predicate: Any) -> dict[str, Any]:
    assert p.dispatcher is not None
    return await p.dispatcher.wait_diagnostics(predicate)


async def test_a_remote_lease_is_admitted_and_completed_through_the_program_dispatcher(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000)) as p:
        assert p.conn.pid == 4242
        req = program_request("task:lead", tokens=100)
        async with p.remote.lease(req) as lease:
            assert lease.target in p.board.targets
            assert (lease.request_id, lease.queue_seconds, lease.attempt, lease.wants_usage) == (
                req.request_id,
                0,
                0,
                True,
            )
            assert p.hub.open_leases() == 1
            lease.finish(ok(prompt=200))
        doc = await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        assert doc["dispatcher"] == {
            "submitted_count": 1,
            "admitted_count": 1,
            "rejected_count": 0,
            "completed_count": 1,
            "abandoned_count": 0,
            "release_waits_count": 0,
            "requeued_count": 0,
        }
        # the scheduler's estimator learnt from the relay's usage: the in-process path ran
        assert doc["token_estimation"] == [{"model_pool": "default", "endpoint": "chat", "tokens_per_byte": 0.275}]
        assert p.hub.open_leases() == 0
        assert p.remote.counters.finished_count == 1 and p.remote.open_leases() == 0
        assert trio.current_time() == 0.0  # the socket costs no virtual time


async def test_a_relay_ask_is_stepped_in_the_connection_task_when_the_scheduler_actor_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """docs/benchmarks.md §10.3.3: with the scheduler actor waiting on its empty inbox, the
    connection's reader steps a relay's submission itself (``SchedulerHandle.handle_now``), so the
    Grant is written in the run-loop turn the Ask was read; the Finish is stepped there too.

    The counts are exact: each lease starts with every task blocked, so the actor waits on its empty
    inbox, and the relay's Ask (written by ``Link.send`` itself) makes only the scheduler's reader
    runnable; the socket costs no virtual time, so no timer can fire in between.  The first
    Program request is left out of the counts: it starts the backend polling, whose first round
    reaches the actor at that same instant, so whether that request's completion found the actor
    waiting or busy with the round depends on Trio's shuffled wake order (the next round is a poll
    interval later in virtual time, after these leases)."""
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000)) as p:
        assert p.dispatcher is not None
        scheduler = p.dispatcher.scheduler
        async with p.remote.lease(program_request("first")) as lease:
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        before = scheduler.direct_count
        for i in range(5):
            await trio.testing.wait_all_tasks_blocked()
            direct, steps = scheduler.direct_count, scheduler.steps_count
            async with p.remote.lease(program_request(f"p{i}")) as lease:
                assert (scheduler.direct_count, scheduler.steps_count) == (direct + 1, steps + 1)
                lease.finish(ok())
            await _settled(p, lambda d, i=i: d["dispatcher"]["completed_count"] == i + 2)
            assert (scheduler.direct_count, scheduler.steps_count) == (direct + 2, steps + 2)
        doc = await _settled(p, lambda d: True)
        assert doc["scheduler"]["handled_in_sender_count"] == before + 10
        assert {k: doc["dispatcher"][k] for k in ("submitted_count", "admitted_count", "completed_count")} == {
            "submitted_count": 6,
            "admitted_count": 6,
            "completed_count": 6,
        }
        assert p.hub.open_leases() == 0
        assert trio.current_time() == 0.0


async def test_a_relay_ask_behind_a_backlog_is_handled_after_it(autojump_clock: trio.testing.MockClock) -> None:
    """A message already waiting for the scheduler actor is handled before a relay's submission
    that arrives after it, whoever steps the submission.

    Which task runs the submission's step is not fixed here, on purpose: the message wakes the actor
    and the Ask wakes the connection's reader into the same batch of Trio's run loop, whose order
    Trio shuffles at random. If the reader runs first it sees the backlog and hands the submission
    to the inbox, behind the message; if the actor runs first it drains the message and waits, and
    the reader steps the submission itself. A count of the steps run in the reader would differ
    from run to run; the order the core sees is the same in both, and that is what is asserted."""
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000)) as p:
        assert p.dispatcher is not None
        scheduler = p.dispatcher.scheduler
        async with p.remote.lease(program_request("first")) as lease:  # starts the backend polling
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        await trio.testing.wait_all_tasks_blocked()
        order: list[str] = []
        original = scheduler.receive

        def spy(item: Any, now: float) -> None:
            order.append(type(item).__name__)
            original(item, now)

        scheduler.receive = spy  # type: ignore[method-assign]
        scheduler.inbox.send.send_nowait(RequestAbandoned(request_id=RequestId("nobody")))
        async with p.remote.lease(program_request("p1")) as lease:  # (no checkpoint before the Ask)
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 2)
        assert order == ["RequestAbandoned", "Submission", "RequestCompleted"]


async def test_a_step_that_fails_in_the_connection_task_refuses_the_lease_and_stops_scheduling(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A relay's submission whose step raises in the connection's task: the relay's lease gets the
    500 ``internal_error`` and the actor raises the step's exception, which stops Program
    scheduling at once (as when the actor itself steps)."""
    refused: list[DispatchRejected] = []
    with pytest.raises(BaseExceptionGroup) as info:
        async with plane(daemon_config(token_capacity_per_dp_rank=10_000)) as p:
            assert p.dispatcher is not None
            await trio.testing.wait_all_tasks_blocked()

            def broken(event: Any, now: float) -> None:
                raise RuntimeError("broken step")

            p.dispatcher.scheduler.apply = broken  # type: ignore[method-assign]
            try:
                async with p.remote.lease(program_request("p1")):
                    raise AssertionError("granted")
            except DispatchRejected as exc:
                refused.append(exc)
            await trio.sleep(3600)
    assert [(r.rejection.status_hint, r.rejection.reason) for r in refused] == [(500, "internal_error")]
    assert info.group_contains(RuntimeError, match="broken step", depth=None)
    assert trio.current_time() < 3600


async def test_leaving_a_remote_lease_unfinished_abandons_it(autojump_clock: trio.testing.MockClock) -> None:
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000)) as p:
        with pytest.raises(RuntimeError, match="client gone"):
            async with p.remote.lease(program_request("p")):
                raise RuntimeError("client gone")
        doc = await _settled(p, lambda d: d["dispatcher"]["abandoned_count"] == 1)
        assert doc["dispatcher"]["completed_count"] == 0
        assert p.dispatcher is not None and not p.dispatcher.scheduler.state.in_flight
        assert p.remote.counters.released_count == 1


async def test_a_request_cancelled_while_queued_leaves_the_scheduler_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with plane(daemon_config(dp=1, token_capacity_per_dp_rank=150)) as p:
        assert p.dispatcher is not None
        scheduler = p.dispatcher.scheduler
        release_first = trio.Event()
        first_admitted = trio.Event()

        async def first() -> None:
            async with p.remote.lease(program_request("a", tokens=100)) as lease:
                first_admitted.set()
                await release_first.wait()
                lease.finish(ok())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await first_admitted.wait()
            t0 = trio.current_time()
            with trio.move_on_after(3.0):  # queued: no room; then the client goes away
                async with p.remote.lease(program_request("b", tokens=100)):
                    raise AssertionError("admitted although the rank is full")
            assert trio.current_time() - t0 == 3.0
            doc = await _settled(p, lambda d: d["scheduler"]["pending_replies_count"] == 0)
            assert doc["dispatcher"]["abandoned_count"] == 1
            assert len(scheduler.state.pool) == 0
            assert p.hub.open_leases() == 1  # the first one
            release_first.set()
        doc = await _settled(p, lambda d: not scheduler.state.in_flight)
        assert doc["dispatcher"]["completed_count"] == 1
        assert p.hub.open_leases() == 0


async def test_a_relay_socket_that_ends_abandons_every_open_lease(autojump_clock: trio.testing.MockClock) -> None:
    """A relay process dying: its socket ends; the scheduler releases its leases (admitted and
    queued alike), so the capacity is back at once.  (The queue deadlines are far away: the
    autojump clock moves while the socket's end is in flight in the kernel, and at the force-resume
    deadline, 300 s by default, the queued lease would be admitted.)"""
    cfg = daemon_config(
        dp=1, token_capacity_per_dp_rank=150, queue_timeout_seconds=1e9, force_resume_timeout_seconds=1e9
    )
    async with plane(cfg) as p:
        assert p.dispatcher is not None
        scheduler = p.dispatcher.scheduler
        admitted = trio.Event()

        async def holder() -> None:
            async with p.remote.lease(program_request("a", tokens=100)):
                admitted.set()
                await trio.sleep_forever()

        refusals: list[DispatchRejected] = []
        waited = trio.Event()

        async def waiter() -> None:
            try:
                async with p.remote.lease(program_request("b", tokens=100)):
                    raise AssertionError("admitted although the rank is full")
            except DispatchRejected as exc:
                refusals.append(exc)
            finally:
                waited.set()

        async with trio.open_nursery() as relay_tasks:
            relay_tasks.start_soon(holder)
            await admitted.wait()
            relay_tasks.start_soon(waiter)
            await _settled(p, lambda d: len(scheduler.state.pool) == 1)
            assert p.hub.open_leases() == 2
            await p.relay_link.stream.aclose()  # the relay is gone (what SIGKILL does to its socket)
            # the two sides see the socket's end each in its own task: wait for both
            doc = await _settled(
                p,
                lambda d: d["dispatcher"]["abandoned_count"] == 2 and d["scheduler"]["pending_replies_count"] == 0,
            )
            await waited.wait()
            relay_tasks.cancel_scope.cancel()
        [refused] = refusals
        assert refused.rejection.reason == "scheduler_unavailable"
        assert not scheduler.state.in_flight and len(scheduler.state.pool) == 0
        assert doc["scheduler"]["pending_replies_count"] == 0
        assert p.conn.abandoned_on_close_count == 2
        assert p.hub.open_leases() == 0


async def test_when_the_scheduler_is_gone_the_relay_refuses_with_503(autojump_clock: trio.testing.MockClock) -> None:
    async with plane(daemon_config(dp=1, token_capacity_per_dp_rank=150)) as p:
        admitted = trio.Event()

        async def holder() -> None:
            async with p.remote.lease(program_request("a", tokens=100)):
                admitted.set()
                await trio.sleep_forever()

        waiting: list[DispatchRejected] = []
        refused_now = trio.Event()

        async def waiter() -> None:
            try:
                async with p.remote.lease(program_request("b", tokens=100)):
                    raise AssertionError("admitted although the rank is full")
            except DispatchRejected as exc:
                waiting.append(exc)
                refused_now.set()

        async with trio.open_nursery() as relay_tasks:
            relay_tasks.start_soon(holder)
            await admitted.wait()
            relay_tasks.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            await p.conn.link.stream.aclose()  # the scheduler's end closes
            t0 = trio.current_time()
            await refused_now.wait()
            assert trio.current_time() == t0  # at once, not after a timeout
            relay_tasks.cancel_scope.cancel()
        [refused] = waiting
        assert (refused.rejection.reason, refused.rejection.status_hint) == ("scheduler_unavailable", 503)
        assert p.remote.gone
        with pytest.raises(DispatchRejected):
            async with p.remote.lease(program_request("c")):
                pass


async def test_a_refusal_of_the_scheduler_reaches_the_relay_unchanged(autojump_clock: trio.testing.MockClock) -> None:
    cfg = daemon_config()
    board = Board(cfg.targets())
    async with _connected(cfg.targets(), board, None) as p:  # no Program scheduling behind the hub
        with pytest.raises(DispatchRejected) as refused:
            async with p.remote.lease(program_request("p")):
                raise AssertionError("granted")
        assert refused.value.rejection.reason == "scheduler_unavailable"
        assert p.remote.counters.refused_count == 1 and p.hub.open_leases() == 0


async def test_a_no_targets_refusal_reaches_the_relay_naming_each_workers_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every worker out of rotation: the relay's 503 ``no_targets`` names the health board's
    reasons, as the native ``no_healthy_target`` does (docs/operations.md §11.3)."""
    async with plane(daemon_config()) as p:
        p.board.unhealthy_urls.add("http://w0:8000")
        with pytest.raises(DispatchRejected) as refused:
            async with p.remote.lease(program_request("p")):
                raise AssertionError("granted")
        rejection = refused.value.rejection
        assert (rejection.reason, rejection.status_hint) == ("no_targets", 503)
        assert rejection.message == "no healthy DP targets are available: http://w0:8000"
        assert p.remote.counters.refused_count == 1 and p.hub.open_leases() == 0


async def test_a_relay_lease_waiting_past_its_queue_deadline_is_force_admitted_at_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A relay's queued Program lease is answered by the scheduler actor straight into its Grant
    frame when its queue deadline comes: the core admits it by force at
    ``min(force_resume_timeout_seconds, queue_timeout_seconds)`` (docs/program-scheduling.md), here
    2 s, although the rank is still full, and counts the forced admission."""
    async with plane(daemon_config(dp=1, token_capacity_per_dp_rank=150, queue_timeout_seconds=2.0)) as p:
        admitted = trio.Event()
        release = trio.Event()

        async def holder() -> None:
            async with p.remote.lease(program_request("a", tokens=100)) as lease:
                admitted.set()
                await release.wait()
                lease.finish(ok())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            await admitted.wait()
            t0 = trio.current_time()
            async with p.remote.lease(program_request("b", tokens=100)) as lease:
                assert trio.current_time() - t0 == 2.0
                lease.finish(ok())
            release.set()
        doc = await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 2)
        assert doc["forced_admissions"] == 1
        assert {k: doc["dispatcher"][k] for k in ("submitted_count", "admitted_count", "rejected_count")} == {
            "submitted_count": 2,
            "admitted_count": 2,
            "rejected_count": 0,
        }
        assert p.hub.open_leases() == 0


async def test_a_scheduler_that_stops_before_answering_refuses_the_waiting_relay_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The scheduler actor closes every waiting reply when it stops: a relay's waiting lease gets
    the 503 ``scheduler_unavailable`` at once (not a hang)."""
    async with plane(daemon_config(dp=1, token_capacity_per_dp_rank=150)) as p:
        assert p.dispatcher is not None
        router = p.dispatcher.scheduler.router
        assert router is not None
        admitted = trio.Event()

        async def holder() -> None:
            async with p.remote.lease(program_request("a", tokens=100)):
                admitted.set()
                await trio.sleep_forever()

        scheduler = p.dispatcher.scheduler

        async def stop_when_queued() -> None:
            await _settled(p, lambda d: len(scheduler.state.pool) == 1)
            router.close_replies()  # what the actor does when it stops

        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            await admitted.wait()
            nursery.start_soon(stop_when_queued)
            t0 = trio.current_time()
            with pytest.raises(DispatchRejected) as refused:
                async with p.remote.lease(program_request("b", tokens=100)):
                    raise AssertionError("admitted although the rank is full")
            assert trio.current_time() == t0
            nursery.cancel_scope.cancel()
        assert refused.value.rejection.reason == "scheduler_unavailable"


async def test_a_lease_the_scheduler_cannot_build_is_refused_with_500_and_the_relay_keeps_serving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000)) as p:
        with pytest.raises(DispatchRejected) as refused:  # (a relay never asks so: no identity)
            async with p.remote.lease(attrs.evolve(program_request("p"), identity=None)):
                raise AssertionError("granted")
        assert (refused.value.rejection.status_hint, refused.value.rejection.reason) == (500, "internal_error")
        async with p.remote.lease(program_request("p")) as lease:
            lease.finish(ok())
        doc = await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        assert doc["dispatcher"]["submitted_count"] == 1 and p.hub.open_leases() == 0


async def test_snapshots_carry_health_and_the_other_processes_load(autojump_clock: trio.testing.MockClock) -> None:
    cfg = daemon_config(workers=("http://w0:8000", "http://w1:8000"), dp=1)
    targets = cfg.targets()
    board = Board(targets)
    async with _connected(targets, board, None) as p:
        assert p.view.healthy_targets() == targets
        other_left, other_right = trio.socket.socketpair()
        other_right.close()
        other = p.hub.connect(1, Link(trio.SocketStream(other_left)))  # a second relay reports its load
        p.hub._own_in_flight = lambda: [1, 0]
        other._on_frame(Load((2, 5)), p.nursery)
        board.unhealthy_urls.add("http://w1:8000")
        t0 = trio.current_time()
        await trio.sleep(SNAPSHOT_SECONDS)
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() - t0 == SNAPSHOT_SECONDS
        assert p.view.healthy_targets() == (targets[0],)
        assert p.view.others_in_flight == [3, 5]
        native = NativeDispatcher(targets, "power_of_two", p.view, __import__("random").Random(0))
        native.others_in_flight = p.view.others_in_flight
        # w1 is out; of the healthy ones only w0 is left whatever the load
        assert native.pick(program_request("x")).worker_url == "http://w0:8000"
        other_left.close()


async def test_a_connect_failure_ejects_at_once_here_and_reaches_the_board(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = daemon_config(workers=("http://w0:8000", "http://w1:8000"), dp=1)
    targets = cfg.targets()
    board = Board(targets)
    async with _connected(targets, board, None) as p:
        outcomes = RemoteOutcomes(p.view, p.relay_link)
        assert outcomes.report_failure("http://w0:8000", "refused", eject_now=True) is True
        assert [t.worker_url for t in p.view.healthy_targets()] == ["http://w1:8000"]  # before any round trip
        outcomes.report_success("http://w1:8000")  # nothing to reset: not sent
        assert outcomes.report_failure("http://w1:8000", "timeout") is False
        outcomes.report_success("http://w1:8000")  # resets the board's outlier count: sent
        await trio.sleep(SNAPSHOT_SECONDS)
        await trio.testing.wait_all_tasks_blocked()
        assert board.reports == [
            ("http://w0:8000", False, True),
            ("http://w1:8000", False, False),
            ("http://w1:8000", True, False),
        ]
        # the board ejected w0 too; the relay follows the board from the snapshot on
        assert p.view.ejected == {} and [t.worker_url for t in p.view.healthy_targets()] == ["http://w1:8000"]


async def test_the_hub_collects_each_relays_exposition(autojump_clock: trio.testing.MockClock) -> None:
    cfg = daemon_config()
    async with _connected(cfg.targets(), Board(cfg.targets()), None) as p:
        assert await p.hub.relay_expositions() == ["relay_only_total 3.0\n"]


def _batch_request(request_id: str) -> ProxyRequest:
    return ProxyRequest(
        request_id=request_id,
        endpoint="chat",
        body={"max_tokens": 8},
        headers={},
        model="m",
        stream=False,
        prompt=PromptSize(text_bytes=400),
        routing_text="x",
        batch_job="eval",
        prio=PriorityInfo(request_class="batch"),
    )


async def test_a_batch_request_is_served_and_a_preemption_cancels_the_relays_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = attrs.evolve(daemon_config(token_capacity_per_dp_rank=10_000), batch_jobs=BatchJobsConfig(enabled=True))
    async with plane(cfg) as p:
        assert p.dispatcher is not None and p.dispatcher.batch is not None
        attempts: list[int] = []

        async def complete(lease: Any) -> None:
            attempts.append(lease.attempt)
            lease.finish(ok())

        await p.remote.serve(_batch_request("agentd-b1"), complete)
        doc = await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        assert attempts == [0] and doc["batch"]["running"] == 0

        # the scheduler preempts the running attempt: the relay's forward is cancelled at once
        started = trio.Event()
        cancelled: list[float] = []

        async def forever(lease: Any) -> None:
            started.set()
            try:
                await trio.sleep_forever()
            finally:
                cancelled.append(trio.current_time())

        async with trio.open_nursery() as relay_tasks:
            relay_tasks.start_soon(p.remote.serve, _batch_request("agentd-b2"), forever)
            await started.wait()
            t0 = trio.current_time()
            p.dispatcher.batch.preempt("agentd-b2")  # what the PreemptBatch effect does
            await trio.testing.wait_all_tasks_blocked()
            assert cancelled == [t0] and p.remote.counters.preempted_count == 1
            assert p.hub.open_leases() == 1  # still waiting for its next admission
            relay_tasks.cancel_scope.cancel()  # the client goes away meanwhile
        doc = await _settled(p, lambda d: d["dispatcher"]["abandoned_count"] == 1)
        assert p.hub.open_leases() == 0 and p.remote.open_leases() == 0


async def test_a_relay_that_breaks_the_protocol_is_cut_off_and_its_leases_released(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000)) as p:
        admitted = trio.Event()

        async def holder() -> None:
            with pytest.raises(trio.Cancelled):
                async with p.remote.lease(program_request("a")):
                    admitted.set()
                    await trio.sleep_forever()

        async with trio.open_nursery() as relay_tasks:
            relay_tasks.start_soon(holder)
            await admitted.wait()
            p.relay_link.send(Snapshot(1, (), "", ()))  # a scheduler-only frame from a relay
            doc = await _settled(p, lambda d: d["dispatcher"]["abandoned_count"] == 1)
            await trio.testing.wait_all_tasks_blocked()
            assert p.remote.gone  # the relay sees its socket end: it refuses new work and drains
            relay_tasks.cancel_scope.cancel()
        assert doc["dispatcher"]["completed_count"] == 0
        assert p.conn.abandoned_on_close_count == 1


@attrs.define(eq=False)
class _RecordingWatch(QueueWatch):
    """A request's queue watch that records every notice the relay passes on."""

    told: list[tuple[int, float, float]] = attrs.field(factory=list)
    notice: trio.Event = attrs.field(factory=trio.Event)

    def tell(self, position: int, eta_seconds: float, now: float) -> None:
        super().tell(position, eta_seconds, now)
        self.told.append((position, eta_seconds, now))
        self.notice.set()
        self.notice = trio.Event()


async def _holding_the_rank(p: Plane, nursery: trio.Nursery, release: trio.Event) -> None:
    """Program ``a`` admitted on the one rank (150 tokens) and held there until ``release``."""
    admitted = trio.Event()

    async def holder() -> None:
        async with p.remote.lease(program_request("a", tokens=100)) as lease:
            admitted.set()
            await release.wait()
            lease.finish(ok())

    nursery.start_soon(holder)
    await admitted.wait()


async def test_a_relay_request_that_asked_not_to_queue_is_refused_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``x-agentd-max-queue-seconds: 0`` through a relay (docs/program-scheduling.md §13): the
    scheduler refuses at once with 429 ``queue_wait_exceeds_bound``, as with one process.  Before
    session 31 the relay's ask dropped the bound and the request waited in the queue."""
    async with plane(daemon_config(dp=1, token_capacity_per_dp_rank=150)) as p, trio.open_nursery() as nursery:
        release = trio.Event()
        await _holding_the_rank(p, nursery, release)
        t0 = trio.current_time()
        req = attrs.evolve(program_request("b", tokens=100), max_queue_seconds=0.0)
        with pytest.raises(DispatchRejected) as refused:
            async with p.remote.lease(req):
                raise AssertionError("admitted although the rank is full")
        assert trio.current_time() == t0
        assert refused.value.rejection.reason == "queue_wait_exceeds_bound"
        assert refused.value.rejection.status_hint == 429
        assert "x-agentd-max-queue-seconds=0" in refused.value.rejection.message
        release.set()


async def test_a_waiting_relay_request_hears_its_queue_position_for_its_sse_comments(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A streaming request with SSE keep-alive waiting through a relay learns its position and ETA
    (the ``: queued position=P eta=E`` comments, docs/program-scheduling.md §13) when it is queued
    and at every tick, and stops waiting at its admission.  Before session 31 a relay's submission
    asked for no queue notices: its comments were plain ``: keep-alive``."""
    async with plane(daemon_config(dp=1, token_capacity_per_dp_rank=150)) as p, trio.open_nursery() as nursery:
        release = trio.Event()
        await _holding_the_rank(p, nursery, release)
        watch = _RecordingWatch()
        admitted = trio.Event()

        async def waiter() -> None:
            async with p.remote.lease(attrs.evolve(program_request("b", tokens=100), queue_watch=watch)) as lease:
                assert not watch.waiting and watch.comment() is None
                admitted.set()
                lease.finish(ok())

        nursery.start_soon(waiter)
        with trio.fail_after(30):  # virtual seconds: the ticks are 1 s apart, the force-resume far
            while len(watch.told) < 3:  # queued, then re-told at the ticks
                await watch.notice.wait()
                comment = watch.comment()
                assert comment is not None and comment.startswith(b": queued position=1 eta=")
        assert [position for position, _, _ in watch.told] == [1, 1, 1]
        assert watch.told[-1][2] > watch.told[0][2]  # told again at a later tick
        assert not admitted.is_set()
        release.set()
        await admitted.wait()
        doc = await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 2)
        assert doc["dispatcher"]["rejected_count"] == 0 and p.hub.open_leases() == 0
