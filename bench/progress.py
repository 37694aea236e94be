"""A one-line live progress bar on a text stream (stderr), throttled to a few updates a second."""

from __future__ import annotations

import contextlib
import sys
import threading
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
    """A live bar for a run's progress callback.  Updates closer together than
    ``min_interval_seconds`` are not drawn at once; a ticker thread draws the latest state once that
    interval has passed (and redraws the elapsed time every second of a quiet stretch).  Updates were
    dropped before: the state reached just before a tool or human gap (the request that completed)
    and the elapsed time stayed frozen until the next event, minutes later in a replay of
    ``chat-human``, a stale bar that looked hung.  The thread touches no Trio state, so a simulation
    in virtual time runs exactly as without a bar."""

    def __init__(
        self,
        stream: Writable,
        *,
        label: str = "",
        width: int = 30,
        min_interval_seconds: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        ticker: bool = True,
    ):
        self._stream = stream
        self._label = label
        self._width = width
        self._min_interval = min_interval_seconds
        self._clock = clock
        self._t0 = clock()
        self._last = self._t0 - min_interval_seconds  # the first update is drawn
        self._state: dict[str, Any] = {}
        self._pending = False  # an update not drawn yet
        self._lock = threading.Lock()  # the caller's thread and the ticker draw
        self._closed = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._wants_ticker = ticker and min_interval_seconds > 0  # at 0 every update is drawn

    def update(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._state = state
            now = self._clock()
            if now - self._last >= self._min_interval or state.get("done_requests") == state.get("total_requests"):
                self._draw(now)
            else:
                self._pending = True
        if self._wants_ticker and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="progress-line", daemon=True)
            self._ticker.start()

    def refresh(self) -> None:
        """Draw an update that came too soon after the previous draw, once the interval has passed,
        and the elapsed time once a second while nothing happens (the ticker calls it)."""
        with self._lock:
            if self._closed or not self._state:
                return
            now = self._clock()
            quiet = max(self._min_interval, 1.0)
            if now - self._last >= (self._min_interval if self._pending else quiet):
                self._draw(now)

    def _tick(self) -> None:
        while not self._stop.wait(self._min_interval):
            self.refresh()

    def _draw(self, now: float) -> None:
        self._last = now
        self._pending = False
        s = self._state
        total = max(1, int(s.get("total_requests", 0)))
        done = int(s.get("done_requests", 0))
        filled = int(self._width * done / total)
        bar = "#" * filled + "-" * (self._width - filled)
        line = (
            f"\r{self._label} [{bar}] {done}/{total} req  {s.get('done_tasks', 0)}/{s.get('total_tasks', 0)} "
            f"tasks  in-flight {s.get('in_flight', 0)}  failed {s.get('failed_requests', 0)}  "
            f"{now - self._t0:.1f}s"
        )
        self._stream.write(line)
        self._stream.flush()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._state:
                self._draw(self._clock())
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
