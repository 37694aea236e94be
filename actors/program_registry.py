"""Spawns and retires Program actors in the dedicated programs nursery.

Besides the supervisor this is the only module that touches a nursery.  The scheduler actor owns
the :class:`ProgramRegistry` handle and calls it synchronously while routing the core's effects:

* :meth:`ProgramRegistry.arm` / :meth:`ProgramRegistry.cancel` deliver a timer command to the
  Program's actor, spawning the actor on first use (a Program generation without timers needs no
  task);
* :meth:`ProgramRegistry.retire` closes the actor's inbox; the actor returns and its timers die
  with it.

Deadlock freedom: the scheduler never awaits a Program actor.  Commands are delivered with
``send_nowait`` into a small bounded inbox; the Program actor only ever blocks while sending a
``TimerFired`` into the scheduler inbox, which the scheduler drains without awaiting anything
else.  A full Program inbox therefore means a bug (the scheduler sent far more than the four
live timers need) and raises :class:`ProgramInboxOverflow`, which stops the daemon
(one-cancels-all) instead of silently dropping a timer.
"""

from __future__ import annotations

from typing import Any

import trio

from actors.core.effects import ArmTimer, CancelTimer
from actors.core.events import TimerFired
from actors.mailbox import channel_statistics
from actors.messages import ProgramCommand
from actors.program_actor import run_program_actor

# Per-Program inbox.  At most four timer kinds are live; a scheduler step emits at most one
# command per kind (arm or cancel), and the actor drains its inbox whenever it is not handing a
# firing to the scheduler.  32 leaves ample room for bursts of steps during such a hand-over.
PROGRAM_INBOX_SIZE = 32


class ProgramInboxOverflow(RuntimeError):
    """A Program actor's inbox was full: the scheduler emitted an unbounded stream of commands."""


class ProgramRegistry:
    """Handle used by the scheduler actor (its only caller) to drive Program actors."""

    def __init__(self, nursery: trio.Nursery, fired_send: trio.MemorySendChannel[TimerFired]) -> None:
        self._nursery = nursery
        self._fired_send = fired_send
        self._inboxes: dict[Any, trio.MemorySendChannel[ProgramCommand]] = {}
        self.spawned_count = 0
        self.retired_count = 0

    def __contains__(self, program: Any) -> bool:
        return program in self._inboxes

    def __len__(self) -> int:
        return len(self._inboxes)

    def _inbox(self, program: Any) -> trio.MemorySendChannel[ProgramCommand]:
        send = self._inboxes.get(program)
        if send is None:
            # See PROGRAM_INBOX_SIZE for the bound.
            send, recv = trio.open_memory_channel[ProgramCommand](PROGRAM_INBOX_SIZE)
            self._inboxes[program] = send
            self._nursery.start_soon(run_program_actor, program, recv, self._fired_send.clone())
            self.spawned_count += 1
        return send

    def _deliver(self, program: Any, command: ProgramCommand) -> None:
        try:
            self._inbox(program).send_nowait(command)
        except trio.WouldBlock:
            raise ProgramInboxOverflow(f"Program actor inbox full ({PROGRAM_INBOX_SIZE} commands pending)") from None

    def arm(self, command: ArmTimer) -> None:
        self._deliver(command.program, command)

    def cancel(self, command: CancelTimer) -> None:
        if command.program in self._inboxes:
            self._deliver(command.program, command)

    def retire(self, program: Any) -> None:
        send = self._inboxes.pop(program, None)
        if send is not None:
            send.close()
            self.retired_count += 1

    def retire_all(self) -> None:
        for program in list(self._inboxes):
            self.retire(program)

    def statistics(self) -> dict[str, Any]:
        """Aggregate inbox statistics of the live Program actors (for diagnostics)."""
        used = [s.statistics().current_buffer_used for s in self._inboxes.values()]
        return {
            "name": "program_actors",
            "live_program_actors": len(self._inboxes),
            "spawned_total": self.spawned_count,
            "retired_total": self.retired_count,
            "max_buffer_size": PROGRAM_INBOX_SIZE,
            "current_buffer_used_total": sum(used),
            "current_buffer_used_max": max(used, default=0),
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
