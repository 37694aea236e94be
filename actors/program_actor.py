"""One Program actor per live Program generation: its timers.

A Program generation has at most four timers, one per kind: the acting TTL, the force-resume
deadline, the paused-retention TTL and its queued requests' timeout (the kinds are the core's
strings; this module does not interpret them).  The actor holds ``kind -> (deadline, token)`` and loops::

    with trio.CancelScope(deadline=min(armed deadlines)) as scope:
        while True:
            command = await inbox.receive()  # ArmTimer replaces a kind, CancelTimer drops it
            scope.deadline = min(armed deadlines)

When the cancel scope expires, every due timer fires, in ``(deadline, token)`` order, as
``TimerFired(program, kind, token)`` to the scheduler.  Re-arming is just a new
deadline in the dict.  Tokens come from the core's monotonic counter; a firing whose token no
longer matches the Program's record (a timer re-armed or cancelled after the firing was sent) is
dropped by the core, so a race between a firing and a re-arm is harmless.

Retirement: the registry closes the actor's inbox; the actor sees ``EndOfChannel`` and returns,
discarding its timers.  The actor never decides anything: it reports facts.
"""

from __future__ import annotations

import math
from typing import Any

import trio

from actors.core.effects import ArmTimer, CancelTimer
from actors.core.events import TimerFired
from actors.messages import ProgramCommand


async def run_program_actor(
    program: Any,
    inbox: trio.MemoryReceiveChannel[ProgramCommand],
    fired_send: trio.MemorySendChannel[TimerFired],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the timers of ``program`` (a ProgramRef) until the inbox is closed."""
    timers: dict[str, tuple[float, int]] = {}
    async with inbox, fired_send:
        task_status.started()
        while True:
            # one cancel scope until a timer fires: a command only moves its deadline (cheaper than
            # a scope per command; the deadline is the same min over the armed timers)
            with trio.CancelScope(deadline=min((d for d, _ in timers.values()), default=math.inf)) as scope:
                while True:
                    try:
                        command = await inbox.receive()
                        while True:  # every queued command, without a checkpoint per command
                            _apply(timers, command)
                            command = inbox.receive_nowait()
                    except trio.WouldBlock:
                        pass
                    except trio.EndOfChannel:
                        return
                    scope.deadline = min((d for d, _ in timers.values()), default=math.inf)
            # the inner loop leaves only by return or by the deadline: some timer is due
            now = trio.current_time()
            due = sorted((d, tok, kind) for kind, (d, tok) in timers.items() if d <= now)
            for _deadline, token, kind in due:
                del timers[kind]
                await fired_send.send(TimerFired(program=program, kind=kind, token=token))


def _apply(timers: dict[str, tuple[float, int]], command: ProgramCommand) -> None:
    if isinstance(command, ArmTimer):
        timers[command.kind] = (command.deadline, command.token)
    elif isinstance(command, CancelTimer):
        timers.pop(command.kind, None)
    else:  # pragma: no cover - the registry only sends the two commands
        raise TypeError(f"unexpected Program actor command {command!r}")
