"""Ctrl-C for the ``python -m bench.<module>`` tools: exit 130 with one line, no traceback.

A bench that the user stops has nothing to report; Python's default (a ``KeyboardInterrupt``
traceback, inside a Trio exception group for the Trio tools, exit 1) looked like a crash.  Reports
are written atomically at the end (``bench.output.write_atomic``), so an interrupted run leaves the
previous report or none, never half of one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


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
