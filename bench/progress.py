"""A one-line live progress bar on a text stream (stderr), throttled to a few updates a second."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol


class Writable(Protocol):
    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class LineTracker:
    """A text stream that remembers whether what was last written to it ended a line, so that a
    message after a live progress line (``\r``-redrawn, no newline until it closes) - an
    interruption's - can start on a line of its own."""

    def __init__(self, stream: Writable):
        self._stream = stream
        self.at_line_start = True

    def write(self, text: str, /) -> int:
        written = self._stream.write(text)
        if text:
            self.at_line_start = text.endswith("\n")
        return written

    def flush(self) -> None:
        self._stream.flush()

    def end_line(self) -> None:
        """A newline if a line is open."""
        if not self.at_line_start:
            self.write("\n")
            self.flush()


class ProgressLine:
    def __init__(self, stream: Writable, *, label: str = "", width: int = 30, min_interval_seconds: float = 0.25):
        self._stream = stream
        self._label = label
        self._width = width
        self._min_interval = min_interval_seconds
        self._last = 0.0
        self._t0 = time.monotonic()
        self._state: dict[str, Any] = {}

    def update(self, state: dict[str, Any]) -> None:
        self._state = state
        now = time.monotonic()
        if now - self._last >= self._min_interval or state.get("done_requests") == state.get("total_requests"):
            self._last = now
            self._draw()

    def _draw(self) -> None:
        s = self._state
        total = max(1, int(s.get("total_requests", 0)))
        done = int(s.get("done_requests", 0))
        filled = int(self._width * done / total)
        bar = "#" * filled + "-" * (self._width - filled)
        line = (
            f"\r{self._label} [{bar}] {done}/{total} req  {s.get('done_tasks', 0)}/{s.get('total_tasks', 0)} "
            f"tasks  in-flight {s.get('in_flight', 0)}  failed {s.get('failed_requests', 0)}  "
            f"{time.monotonic() - self._t0:.1f}s"
        )
        self._stream.write(line)
        self._stream.flush()

    def close(self) -> None:
        if self._state:
            self._draw()
        self._stream.write("\n")
        self._stream.flush()


@contextlib.contextmanager
def progress_line(enabled: bool, label: str) -> Iterator[Callable[[dict[str, Any]], None] | None]:
    """A ``ProgressLine`` on stderr for the replay's ``progress`` callback (``None`` when disabled),
    closed with its final state when the block ends."""
    if not enabled:
        yield None
        return
    line = ProgressLine(sys.stderr, label=label)
    try:
        yield line.update
    finally:
        line.close()
