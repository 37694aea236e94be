"""One Program actor per live Program generation: its timers.

A Program generation has at most four timers, one per kind: the acting TTL, the force-resume
deadline, the paused-retention TTL and its queued requests' timeout (the kinds are the core's
strings; this module does not interpret them).  The actor's timer table, :class:`ProgramTimers`,
holds ``kind -> (deadline, token)``; the actor task waits for its earliest deadline::

    with trio.CancelScope(deadline=min(armed deadlines)) as scope:
        await trio.sleep_forever()

When the deadline passes, every due timer fires, in ``(deadline, token)`` order, as
``TimerFired(program, kind, token)`` to the scheduler.  The scheduler's timer commands reach the
table synchronously, in the order the core emitted them (:meth:`ProgramTimers.arm`,
:meth:`ProgramTimers.cancel`, called by the registry while the scheduler routes a step's
effects): an ``ArmTimer`` replaces its kind, a ``CancelTimer`` drops it, and the waiting scope's
deadline moves earlier when an armed deadline is earlier (never later: a wait that ends at a
deadline no longer armed just waits again), so a command costs no task switch
(docs/architecture.md §3; docs/benchmarks.md §10.2.5).  The table holds at
most one entry per kind, so it is bounded by construction.  Tokens come from the core's
monotonic counter; a firing whose token no longer matches the Program's record (a timer re-armed
or cancelled after the firing was sent) is dropped by the core, so a race between a firing and a
re-arm is harmless.

Retirement: the registry closes the table (:meth:`ProgramTimers.close`), which cancels the wait;
the actor returns, discarding its timers.  The actor never decides anything: it reports facts.
"""

from __future__ import annotations

import math
from typing import Any

import trio

from actors.core.effects import ArmTimer, CancelTimer
from actors.core.events import TimerFired


class ProgramTimers:
    """A Program actor's timers: ``kind -> (deadline, token)``, the scope its actor waits in."""

    __slots__ = ("program", "table", "closed", "_scope")

    def __init__(self, program: Any) -> None:
        self.program = program
        self.table: dict[str, tuple[float, int]] = {}
        self.closed = False
        self._scope: trio.CancelScope | None = None  # while the actor waits for the next deadline

    def next_deadline(self) -> float:
        return min((d for d, _ in self.table.values()), default=math.inf)

    def arm(self, command: ArmTimer) -> None:
        self.table[command.kind] = (command.deadline, command.token)
        scope = self._scope
        if scope is not None and command.deadline < scope.deadline:
            scope.deadline = command.deadline  # only ever earlier: see ``cancel``

    def cancel(self, command: CancelTimer) -> None:
        # The wait's deadline stays where it is even when this was the earliest timer: the actor
        # then wakes at it, finds nothing due and waits for the next one.  Moving a cancel scope's
        # deadline costs more than that wake-up, and a Program's acting TTL is cancelled and armed
        # again at every turn, at most once per TTL (docs/benchmarks.md §10.2.5).
        self.table.pop(command.kind, None)

    def close(self) -> None:
        self.closed = True
        self.table.clear()
        if self._scope is not None:
            self._scope.cancel()


async def run_program_actor(
    timers: ProgramTimers,
    fired_send: trio.MemorySendChannel[TimerFired],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the timers of ``timers.program`` (a ProgramRef) until they are closed."""
    table = timers.table
    async with fired_send:
        task_status.started()
        while not timers.closed:
            with trio.CancelScope(deadline=timers.next_deadline()) as scope:
                timers._scope = scope
                try:
                    await trio.sleep_forever()
                finally:
                    timers._scope = None
            if timers.closed:
                return
            # the scope's deadline passed: the timers due now (none when that deadline's timer
            # was cancelled or armed later meanwhile, see ``ProgramTimers.cancel``)
            now = trio.current_time()
            due = sorted((d, tok, kind) for kind, (d, tok) in table.items() if d <= now)
            for deadline, token, kind in due:
                if table.get(kind) == (deadline, token):  # (a command while a firing waited may have replaced it)
                    del table[kind]
                await fired_send.send(TimerFired(program=timers.program, kind=kind, token=token))
