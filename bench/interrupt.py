"""Ctrl-C for the ``python -m bench.<module>`` tools: exit 130 with one line, no traceback.

A bench that the user stops has nothing to report; Python's default (a ``KeyboardInterrupt``
traceback, inside a Trio exception group for the Trio tools, exit 1) looked like a crash.  Reports
are written atomically at the end (``bench.output.write_atomic``), so an interrupted run leaves the
previous report or none, never half of one.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

R = TypeVar("R")


def only_keyboard_interrupts(group: BaseExceptionGroup[BaseException]) -> bool:
    _, rest = group.split(KeyboardInterrupt)
    return rest is None


def run_main(main: Callable[[], int], prog: str) -> int:
    """``main()``; Ctrl-C (also inside a Trio exception group) -> ``prog: interrupted``, 130."""
    try:
        return main()
    except KeyboardInterrupt:
        pass
    except BaseExceptionGroup as group:
        if not only_keyboard_interrupts(group):
            raise
    print(f"\n{prog}: interrupted", file=sys.stderr)
    return 130


def not_a_command(module: str, command: str) -> int:
    """What ``python -m <module>`` does for a library module behind an ``agentd`` command: say so
    and exit 2 (it ran the module's imports and exited 0 without a word, even with ``--help``)."""
    print(
        f"python -m {module}: not a command; it is the library behind `{command}` (see `{command} --help`)",
        file=sys.stderr,
    )
    return 2


def run_interruptible(fn: Callable[[], Awaitable[R]], *, clock: trio.abc.Clock | None = None) -> R:
    """``trio.run(fn, clock=clock)``, where Ctrl-C (SIGINT) cancels ``fn`` like any cancellation -
    its ``finally`` blocks end the progress line, its clients close and its processes stop, nothing
    half-done is left - and then raises ``KeyboardInterrupt`` (``daemon.cli`` exits 130, no
    traceback).  Trio's default raises it wherever the task happens to be, even inside a library's
    lock or Trio's own nursery exit (a "please file a bug" TrioInternalError).  A second Ctrl-C
    during that clean-up interrupts at once.

    Where Ctrl-C is not Python's ``KeyboardInterrupt`` - ignored (``bench.tool_bench``'s pool
    workers), another handler, or a thread other than the main one - it is left as it is, as
    ``trio.run`` itself does: a plain run."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return trio.run(fn, clock=clock)

    async def main() -> R:
        scope = trio.CancelScope()
        interrupted = finished = False
        with contextlib.ExitStack() as handler:
            # installed before ``fn`` runs its first line: no moment where Trio's default applies
            signals = handler.enter_context(trio.open_signal_receiver(signal.SIGINT))

            async def watch() -> None:
                nonlocal interrupted
                if finished:  # fn ended before this task first ran: the receiver is closed
                    return
                async for _ in signals:
                    interrupted = True
                    scope.cancel()
                    handler.close()  # Python's handler again: a second Ctrl-C interrupts at once
                    return

            trio.lowlevel.spawn_system_task(watch)
            try:
                with scope:
                    result = await fn()
            finally:
                finished = True
        # only the watcher cancels the scope; an ``fn`` that finished its clean-up and returned
        # (a partial report) after the cancellation was still interrupted
        if interrupted:
            raise KeyboardInterrupt
        return result

    return trio.run(main, clock=clock)
