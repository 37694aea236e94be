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
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

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


@contextlib.contextmanager
def noticing_interrupts() -> Iterator[None]:
    """A Ctrl-C (SIGINT) during the block interrupts it even where the ``KeyboardInterrupt`` is
    lost: the block's end raises it again.

    Hypothesis loses them: one raised while its gc callback runs (a signal arriving during a
    garbage collection is handled there) is printed as "Exception ignored" and the test goes on,
    and one landing in its engine's bookkeeping can come out as the test's ``AssertionError``.  So
    ``agentd check-fairness`` went on after a Ctrl-C in a core machine, and reported the machine as
    passed or as violated.  The handler here raises ``KeyboardInterrupt`` as Python's does and
    remembers that it did.

    Only where Python's own handler is installed, in the main thread (as ``run_interruptible``);
    elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    received = False

    def handler(signum: int, frame: object) -> None:
        nonlocal received
        received = True
        raise KeyboardInterrupt

    previous_hook = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not (received and unraisable.exc_type is KeyboardInterrupt):
            previous_hook(unraisable)  # a lost Ctrl-C is raised below, not printed as ignored

    signal.signal(signal.SIGINT, handler)
    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if received:
        raise KeyboardInterrupt


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
