"""Program actors and their registry: timers fire at their exact deadlines, in (deadline, token)
order; re-arming and cancelling replace timers; retiring ends the actor."""

from __future__ import annotations

import trio
import trio.testing

from actors.core.effects import ArmTimer, CancelTimer
from actors.core.events import TimerFired
from actors.program_registry import ProgramRegistry, run_program_registry


async def _collect(recv: trio.MemoryReceiveChannel[TimerFired], out: list[tuple[float, TimerFired]]) -> None:
    async for msg in recv:
        out.append((trio.current_time(), msg))


async def _start(nursery: trio.Nursery) -> tuple[ProgramRegistry, list[tuple[float, TimerFired]]]:
    fired_send, fired_recv = trio.open_memory_channel[TimerFired](8)  # test collector
    fired: list[tuple[float, TimerFired]] = []
    nursery.start_soon(_collect, fired_recv, fired)
    registry = await nursery.start(run_program_registry, fired_send)
    return registry, fired


async def test_program_actor_fires_ttl_at_exact_deadline(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        registry, fired = await _start(nursery)
        t0 = trio.current_time()
        registry.arm(ArmTimer("p1", "acting_ttl", t0 + 7.5, 1))
        registry.arm(ArmTimer("p1", "paused_retention", t0 + 1800.0, 2))
        await trio.sleep(2000)
        assert [(t - t0, m.kind, m.token) for t, m in fired] == [
            (7.5, "acting_ttl", 1),
            (1800.0, "paused_retention", 2),
        ]
        assert fired[0][1].program == "p1"
        assert fired[0][0] == t0 + 7.5
        nursery.cancel_scope.cancel()


async def test_program_actor_rearm_replaces_and_cancel_drops(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        registry, fired = await _start(nursery)
        t0 = trio.current_time()
        registry.arm(ArmTimer("p", "force_resume", t0 + 300.0, 1))
        await trio.sleep(100)
        registry.arm(ArmTimer("p", "force_resume", t0 + 150.0, 2))  # earlier deadline, new token
        registry.arm(ArmTimer("p", "acting_ttl", t0 + 120.0, 3))
        await trio.sleep(10)
        registry.cancel(CancelTimer("p", "acting_ttl"))
        await trio.sleep(500)
        assert [(t - t0, m.kind, m.token) for t, m in fired] == [(150.0, "force_resume", 2)]
        nursery.cancel_scope.cancel()


async def test_program_actor_due_timers_fire_in_deadline_token_order(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        registry, fired = await _start(nursery)
        t0 = trio.current_time()
        registry.arm(ArmTimer("p", "b", t0 + 5.0, 9))
        registry.arm(ArmTimer("p", "a", t0 + 5.0, 4))
        registry.arm(ArmTimer("p", "c", t0 + 4.0, 10))
        await trio.sleep(10)
        assert [(t - t0, m.kind) for t, m in fired] == [(4.0, "c"), (5.0, "a"), (5.0, "b")]
        nursery.cancel_scope.cancel()


async def test_program_registry_retire_ends_actor_and_drops_timers(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        registry, fired = await _start(nursery)
        t0 = trio.current_time()
        registry.arm(ArmTimer("p", "acting_ttl", t0 + 5.0, 1))
        registry.arm(ArmTimer("q", "acting_ttl", t0 + 6.0, 2))
        await trio.testing.wait_all_tasks_blocked()
        assert len(registry) == 2
        registry.retire("p")
        await trio.sleep(10)
        assert [(t - t0, m.program) for t, m in fired] == [(6.0, "q")]
        stats = registry.statistics()
        assert stats["live_program_actors"] == 1
        assert stats["spawned_total"] == 2
        assert stats["retired_total"] == 1
        nursery.cancel_scope.cancel()


async def test_program_actor_takes_every_queued_command_in_one_step(autojump_clock: trio.testing.MockClock) -> None:
    """Commands that queued while the actor did not run are all applied when it runs next.  A
    sender that sends two commands between its checkpoints (a request handled in its own task:
    an arm at its completion and a cancel at its Program's next submission, docs/architecture.md
    §3) would fill the bounded inbox if the actor took one command per step."""
    async with trio.open_nursery() as nursery:
        registry, fired = await _start(nursery)
        t0 = trio.current_time()
        for i in range(200):
            registry.arm(ArmTimer("p", "acting_ttl", t0 + 10.0, 2 * i))
            registry.cancel(CancelTimer("p", "acting_ttl"))
            await trio.lowlevel.checkpoint()
        registry.arm(ArmTimer("p", "force_resume", t0 + 5.0, 999))
        await trio.sleep(100)
        assert [(t - t0, m.kind, m.token) for t, m in fired] == [(5.0, "force_resume", 999)]
        nursery.cancel_scope.cancel()
