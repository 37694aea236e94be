"""The Program timers: every live Program generation's armed deadlines, waited for by one task.

A Program generation has at most four timers, one per kind: the acting TTL, the force-resume
deadline, the paused-retention TTL and its queued requests' timeout (the kinds are the core's
strings; this module does not interpret them).  The scheduler actor owns the
:class:`ProgramRegistry` handle and calls it synchronously while routing the core's effects:

* :meth:`ProgramRegistry.arm` sets a Program's timer of one kind (``ArmTimer`` replaces the kind's
  deadline and token), :meth:`ProgramRegistry.cancel` drops it (``CancelTimer``);
* :meth:`ProgramRegistry.retire` forgets the Program generation and its timers (``RetireProgram``).

Each is a dictionary update and, for an arm, a push on one deadline heap: nothing wakes per
command.  One task (:func:`run_program_registry`) sleeps until the earliest armed deadline (an arm
that is earlier than the one it sleeps for moves its wake-up forward) and then fires every due
timer, in ``(deadline, token)`` order, as ``TimerFired(program, kind, token)`` to the scheduler.
Heap entries of timers that were re-armed, cancelled or retired since are skipped when they come
up.  Tokens come from the core's monotonic counter; a firing whose token no longer matches the
Program's record (a timer re-armed or cancelled after the firing was sent) is dropped by the core,
so a race between a firing and a re-arm is harmless.

Until session 24 every Program generation had an actor task of its own with a small inbox; a
request's submission (which cancels the acting TTL) and completion (which arms it) then woke that
task twice, about a tenth of the scheduler process's CPU with relay processes (docs/benchmarks.md
§10.3.1).  The deadlines, their order and the instants they fire at are the same.

Deadlock freedom: the scheduler never awaits the timer task.  The task only ever blocks while
sending a ``TimerFired`` into the scheduler inbox, which the scheduler drains without awaiting
anything else.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import trio

from actors.core.effects import ArmTimer, CancelTimer
from actors.core.events import TimerFired
from actors.mailbox import channel_statistics

# The heap keeps the entries of cancelled and re-armed timers until they come up; it is rebuilt from
# the armed timers once it holds more than COMPACT_RATIO entries per live Program (at most four are
# armed each) and more than COMPACT_MIN_ENTRIES in all.
COMPACT_RATIO = 8
COMPACT_MIN_ENTRIES = 1024


class ProgramRegistry:
    """Handle used by the scheduler actor (its only caller) to set and drop Program timers."""

    def __init__(self, fired_send: trio.MemorySendChannel[TimerFired]) -> None:
        self._fired_send = fired_send
        # live Program generation -> kind -> (deadline, token); a generation is live from its first
        # armed timer until it is retired (most Programs never need a timer)
        self._timers: dict[Any, dict[str, tuple[float, int]]] = {}
        self._heap: list[tuple[float, int, str, Any]] = []  # (deadline, token, kind, program)
        self._sleep: trio.CancelScope | None = None  # the timer task's wait for the next deadline
        self.spawned_count = 0
        self.retired_count = 0
        self.fired_count = 0
        self.compactions_count = 0

    def __contains__(self, program: Any) -> bool:
        return program in self._timers

    def __len__(self) -> int:
        return len(self._timers)

    def arm(self, command: ArmTimer) -> None:
        timers = self._timers.get(command.program)
        if timers is None:
            timers = self._timers[command.program] = {}
            self.spawned_count += 1
        deadline = command.deadline
        timers[command.kind] = (deadline, command.token)
        heap = self._heap
        heapq.heappush(heap, (deadline, command.token, command.kind, command.program))
        if len(heap) > COMPACT_MIN_ENTRIES and len(heap) > COMPACT_RATIO * len(self._timers):
            self._compact()
        sleep = self._sleep
        if sleep is not None and deadline < sleep.deadline:
            sleep.deadline = deadline  # wake earlier

    def _compact(self) -> None:
        """Rebuild the heap from the armed timers: drops the entries of timers cancelled or re-armed
        since (a request cancels its Program's acting TTL at every turn), so memory stays
        proportional to the live Programs; amortised O(1) per arm."""
        self._heap = [
            (deadline, token, kind, program)
            for program, timers in self._timers.items()
            for kind, (deadline, token) in timers.items()
        ]
        heapq.heapify(self._heap)
        self.compactions_count += 1

    def cancel(self, command: CancelTimer) -> None:
        timers = self._timers.get(command.program)
        if timers is not None:
            timers.pop(command.kind, None)  # its heap entry is skipped when it comes up

    def retire(self, program: Any) -> None:
        if self._timers.pop(program, None) is not None:
            self.retired_count += 1

    def retire_all(self) -> None:
        for program in list(self._timers):
            self.retire(program)

    def _due(self, now: float) -> list[TimerFired]:
        """Every armed timer whose deadline has come, removed, in ``(deadline, token)`` order."""
        heap, due = self._heap, []
        while heap and heap[0][0] <= now:
            deadline, token, kind, program = heapq.heappop(heap)
            timers = self._timers.get(program)
            if timers is None or timers.get(kind) != (deadline, token):
                continue  # re-armed, cancelled or retired since
            del timers[kind]
            due.append(TimerFired(program=program, kind=kind, token=token))
        return due

    def _next_deadline(self) -> float:
        """The earliest live deadline (stale heap entries at the top are dropped on the way)."""
        heap = self._heap
        while heap:
            deadline, token, kind, program = heap[0]
            timers = self._timers.get(program)
            if timers is not None and timers.get(kind) == (deadline, token):
                return deadline
            heapq.heappop(heap)
        return math.inf

    async def run(self) -> None:
        """Fire the timers as they come due (the registry's one task)."""
        while True:
            with trio.CancelScope(deadline=self._next_deadline()) as sleep:
                self._sleep = sleep
                await trio.sleep_forever()
            self._sleep = None
            for fired in self._due(trio.current_time()):
                self.fired_count += 1
                await self._fired_send.send(fired)

    def statistics(self) -> dict[str, Any]:
        """The timers' state (for diagnostics)."""
        return {
            "name": "program_timers",
            "live_programs": len(self._timers),
            "armed_timers": sum(len(t) for t in self._timers.values()),
            "heap_entries": len(self._heap),
            "spawned_total": self.spawned_count,
            "retired_total": self.retired_count,
            "fired_total": self.fired_count,
            "compactions_total": self.compactions_count,
            "timer_fired_channel": channel_statistics("timer_fired", self._fired_send),
        }


async def run_program_registry(
    fired_send: trio.MemorySendChannel[TimerFired],
    *,
    task_status: trio.TaskStatus[ProgramRegistry] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the Program timers until cancelled; hand the registry to the caller."""
    async with fired_send:
        registry = ProgramRegistry(fired_send)
        task_status.started(registry)
        try:
            await registry.run()
        finally:
            registry.retire_all()
