"""Log capture for tests: agentd's structured log events with the Trio time they were emitted."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio


class EventLog(logging.Handler):
    """Captures agentd log events with the trio virtual time at which they were emitted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.levels: list[int] = []  # the level of each entry of ``events``

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "agentd_event", None)
        if event is not None:
            self.events.append((trio.current_time(), event, dict(getattr(record, "agentd_fields", {}))))
            self.levels.append(record.levelno)

    def at_level(self, name: str, level: int) -> list[tuple[float, dict[str, Any]]]:
        """The events called ``name`` logged at exactly ``level``."""
        return [(t, f) for (t, e, f), lv in zip(self.events, self.levels, strict=True) if e == name and lv == level]

    def named(self, name: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, f) for t, e, f in self.events if e == name]


@contextmanager
def attached(handler: logging.Handler, logger_name: str, level: int) -> Iterator[logging.Handler]:
    """``handler`` on logger ``logger_name`` set to ``level`` for the block; the logger's level and
    handlers are restored after it."""
    logger = logging.getLogger(logger_name)
    old_level = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@pytest.fixture
def event_log() -> Iterator[EventLog]:
    """Every ``agentd.program.*`` log event (DEBUG and up) of the test, with its Trio time."""
    handler = EventLog()
    with attached(handler, "agentd.program", logging.DEBUG):
        yield handler
