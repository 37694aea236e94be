"""No leaks in Program dispatch (docs/operations.md §11): a completion or abandon is never given
up, and a request abandoned while queued leaves nothing in the scheduler's reply table."""

from __future__ import annotations

import trio
import trio.testing
from program_fakes import daemon_config, ok, program_request, program_scheduling

from actors.core.events import RequestAbandoned


async def test_release_waits_for_room_however_long_and_is_counted(autojump_clock: trio.testing.MockClock) -> None:
    """The scheduler inbox is full for 60 s: the abandon waits (shielded, even though its caller
    is cancelled) and is delivered; the wait is counted.  (It used to be dropped after 5 s.)"""
    async with program_scheduling(daemon_config(token_capacity_per_dp_rank=10_000)) as (dispatcher, _, _):
        send, recv = trio.open_memory_channel[object](0)  # no room until someone receives
        received: list[tuple[float, object]] = []

        async def drain_late() -> None:
            await trio.sleep(60.0)
            received.append((trio.current_time(), await recv.receive()))

        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_late)
            with trio.CancelScope() as scope:
                scope.cancel()  # the handler is being cancelled (client gone) while it releases
                await dispatcher.release_shielded(program_request("p"), None, send)  # type: ignore[arg-type]
        [(at, message)] = received
        assert at - t0 == 60.0
        assert isinstance(message, RequestAbandoned)
        assert dispatcher.counters.release_waits_count == 1
        assert dispatcher.counters.abandoned_count == 1


async def test_request_abandoned_while_queued_leaves_no_reply_channel(autojump_clock: trio.testing.MockClock) -> None:
    cfg = daemon_config(dp=1, token_capacity_per_dp_rank=150)
    async with program_scheduling(cfg) as (dispatcher, _, _):
        scheduler = dispatcher.scheduler
        first_admitted = trio.Event()
        release_first = trio.Event()

        async def first() -> None:
            async with dispatcher.lease(program_request("a", tokens=100)) as lease:
                first_admitted.set()
                await release_first.wait()
                lease.finish(ok())

        async def second() -> None:
            async with dispatcher.lease(program_request("b", tokens=100)):
                raise AssertionError("admitted although the rank is full")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await first_admitted.wait()
            with trio.move_on_after(3.0):  # queued (no room), then the client goes away
                await second()
            # the abandon reaches the scheduler, which drops the waiting request and its reply channel
            doc = await dispatcher.wait_diagnostics(lambda d: d["scheduler"]["pending_replies_count"] == 0)
            assert doc["dispatcher"]["abandoned_count"] == 1
            assert len(scheduler.state.pool) == 0
            release_first.set()
        doc = await dispatcher.wait_diagnostics(lambda d: not scheduler.state.in_flight)
        assert doc["scheduler"]["pending_replies_count"] == 0
        assert doc["dispatcher"]["completed_count"] == 1
        assert dispatcher.counters.open_leases() == 0
