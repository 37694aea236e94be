"""Progress of ``agentd batch`` on stderr: a live bar on a terminal, a plain line now and then otherwise.

The bar (redrawn every 0.25 s) shows answered/total, failed, requests in flight, completion tokens per
second of this run and the ETA; messages (malformed lines) are printed above it.  Without a terminal
(a log file, CI) one plain line every 10 s.  Time is ``trio.current_time()`` (virtual in tests).
"""

from __future__ import annotations

from typing import Protocol, TextIO

import trio

TTY_INTERVAL_SECONDS = 0.25
PLAIN_INTERVAL_SECONDS = 10.0
BAR_WIDTH = 24
_CLEAR = "\r\x1b[K"


class Counts(Protocol):
    """What the bar reads of ``daemon.batch_runner.BatchSummary``."""

    total: int
    ok: int
    failed: int
    malformed: int
    prior_failed: int
    completion_tokens: int

    @property
    def answered(self) -> int: ...


class Source(Protocol):
    """What the bar reads of ``daemon.batch_runner.BatchRunner``."""

    @property
    def summary(self) -> Counts: ...

    @property
    def in_flight(self) -> int: ...


def duration(seconds: float) -> str:
    """``42s``, ``3m07s``, ``2h05m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class BatchProgress:
    def __init__(self, runner: Source, stream: TextIO, *, tty: bool, interval: float | None) -> None:
        self._runner = runner
        self._stream = stream
        self._tty = tty
        self._interval = interval if interval is not None else (TTY_INTERVAL_SECONDS if tty else PLAIN_INTERVAL_SECONDS)
        self._start: float | None = None
        self._drawn = False

    def line(self) -> str:
        """The current progress text (without the bar)."""
        s = self._runner.summary
        now = trio.current_time()
        elapsed = now - self._start if self._start is not None else 0.0
        answered_now = s.ok + s.failed + s.malformed
        remaining = max(0, s.total - s.answered)
        rate = s.completion_tokens / elapsed if elapsed > 0 else 0.0
        if remaining == 0:
            eta = "0s"
        elif answered_now > 0 and elapsed > 0:
            eta = duration(remaining * elapsed / answered_now)
        else:
            eta = "?"
        return (
            f"{s.answered}/{s.total} answered  failed {s.failed + s.prior_failed}  in flight "
            f"{self._runner.in_flight}  {rate:.0f} tok/s  ETA {eta}"
        )

    def _draw(self) -> None:
        s = self._runner.summary
        if self._tty:
            filled = BAR_WIDTH * s.answered // s.total if s.total else BAR_WIDTH
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            self._stream.write(f"{_CLEAR}[{bar}] {self.line()}")
            self._drawn = True
        else:
            self._stream.write(f"agentd batch: {self.line()}\n")
        self._stream.flush()

    async def run(self) -> None:
        self._start = trio.current_time()
        while True:
            if self._tty:
                self._draw()
            await trio.sleep(self._interval)
            if not self._tty:
                self._draw()

    def message(self, text: str) -> None:
        """A line above the bar (the bar is redrawn at its next tick)."""
        if self._tty and self._drawn:
            self._stream.write(_CLEAR)
            self._drawn = False
        self._stream.write(text + "\n")
        self._stream.flush()

    def finish(self) -> None:
        """The final state: the bar left in place with a newline (terminal); nothing more otherwise."""
        if self._tty:
            self._draw()
            self._stream.write("\n")
            self._stream.flush()
