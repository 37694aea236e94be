"""Structured log events: one line per event, keyed by a stable event name.

Every component logs through :func:`log_event` with a stable ``event`` name (``program_admit``,
``health_change``, ``daemon_listening`` ...) and flat key/value fields.  Fields travel on the
``LogRecord`` (``record.agentd_event`` / ``record.agentd_fields``), so the formatter the daemon
installs (docs/operations.md §7), not the call site, decides the wire format.  ``log_event``
checks ``isEnabledFor`` first, so debug events on the request hot path cost one comparison when
debug is off.  All loggers live under ``agentd``.
"""

from __future__ import annotations

import logging
from typing import Any

ROOT_LOGGER = "agentd"


def get_logger(component: str) -> logging.Logger:
    """Logger ``agentd.<component>``."""
    return logging.getLogger(f"{ROOT_LOGGER}.{component}")


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Emit one structured line ``event=<event> k=v ...`` (or JSON) when ``level`` is enabled."""
    if not logger.isEnabledFor(level):
        return
    logger.log(level, event, extra={"agentd_event": event, "agentd_fields": fields})
