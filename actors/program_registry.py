"""Spawns and retires Program actors in the dedicated programs nursery.

Besides the supervisor this is the only module that touches a nursery.  The scheduler actor owns
the :class:`ProgramRegistry` handle and calls it synchronously while routing the core's effects:

* :meth:`ProgramRegistry.arm` / :meth:`ProgramRegistry.cancel` apply a timer command to the
  Program actor's timer table (:class:`~actors.program_actor.ProgramTimers`), spawning the actor
  on first use (a Program generation without timers needs no task);
* :meth:`ProgramRegistry.retire` closes the table; the actor returns and its timers die with it.

Deadlock freedom: the scheduler never awaits a Program actor (a command is a synchronous write of
at most one table entry per timer kind, bounded by construction); the Program actor only ever
blocks while sending a ``TimerFired`` into the scheduler inbox, which the scheduler drains without
awaiting anything else.
"""

from __future__ import annotations

from typing import Any

import trio

from actors.core.effects import ArmTimer, CancelTimer
from actors.core.events import TimerFired
from actors.mailbox import channel_statistics
from actors.program_actor import ProgramTimers, run_program_actor

# A Program actor's timer table holds at most one entry per timer kind (the core has four).
PROGRAM_TIMER_KINDS = 4


class ProgramRegistry:
    """Handle used by the scheduler actor (its only caller) to drive Program actors."""

    def __init__(self, nursery: trio.Nursery, fired_send: trio.MemorySendChannel[TimerFired]) -> None:
        self._nursery = nursery
        self._fired_send = fired_send
        self._actors: dict[Any, ProgramTimers] = {}
        self.spawned_count = 0
        self.retired_count = 0

    def __contains__(self, program: Any) -> bool:
        return program in self._actors

    def __len__(self) -> int:
        return len(self._actors)

    def arm(self, command: ArmTimer) -> None:
        timers = self._actors.get(command.program)
        if timers is None:
            timers = self._actors[command.program] = ProgramTimers(command.program)
            self._nursery.start_soon(run_program_actor, timers, self._fired_send.clone())
            self.spawned_count += 1
        timers.arm(command)

    def cancel(self, command: CancelTimer) -> None:
        timers = self._actors.get(command.program)
        if timers is not None:
            timers.cancel(command)

    def retire(self, program: Any) -> None:
        timers = self._actors.pop(program, None)
        if timers is not None:
            timers.close()
            self.retired_count += 1

    def retire_all(self) -> None:
        for program in list(self._actors):
            self.retire(program)

    def statistics(self) -> dict[str, Any]:
        """Aggregate inbox statistics of the live Program actors (for diagnostics)."""
        armed = [len(t.table) for t in self._actors.values()]
        return {
            "name": "program_actors",
            "live_program_actors": len(self._actors),
            "spawned_total": self.spawned_count,
            "retired_total": self.retired_count,
            "max_buffer_size": PROGRAM_TIMER_KINDS,  # a timer table's bound: one entry per kind
            "current_buffer_used_total": sum(armed),  # armed timers
            "current_buffer_used_max": max(armed, default=0),
            "timer_fired_channel": channel_statistics("timer_fired", self._fired_send),
        }


async def run_program_registry(
    fired_send: trio.MemorySendChannel[TimerFired],
    *,
    task_status: trio.TaskStatus[ProgramRegistry] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Own the programs nursery; hand the registry to the caller; run until cancelled."""
    async with fired_send:
        async with trio.open_nursery() as nursery:
            registry = ProgramRegistry(nursery, fired_send)
            task_status.started(registry)
            try:
                await trio.sleep_forever()
            finally:
                registry.retire_all()
