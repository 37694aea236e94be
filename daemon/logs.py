"""How the daemon renders structured log events (``actors.logevents.log_event``).

The rendering is chosen once by :func:`configure_logging`:

* ``kv``   -> ``ts=2026-01-01T00:00:00.000Z level=info logger=agentd.proxy event=x k=v k2="a b"``
* ``json`` -> one JSON object per line with the same keys.

Fields travel on the ``LogRecord`` (``record.agentd_event`` / ``record.agentd_fields``) so the
formatter, not the call site, decides the wire format.  ``log_event`` checks ``isEnabledFor``
first, so debug events on the request hot path cost one comparison when debug is off.
All loggers live under ``agentd`` and only that logger gets a handler: the root logger and the
global logging state of embedding programs (tests) are left alone.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from actors.logevents import ROOT_LOGGER

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_HANDLER_MARK = "_agentd_handler"


def _kv_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if text == "" or any(c in text for c in ' "=\\\n\r\t'):
        return json.dumps(text)
    return text


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def _record_fields(record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    event = getattr(record, "agentd_event", None)
    fields = getattr(record, "agentd_fields", None)
    if event is None:  # a plain logger.info("...") call: keep the text as a field
        return "message", {"text": record.getMessage()}
    return str(event), dict(fields or {})


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... event=... k=v`` with values quoted when needed."""

    def format(self, record: logging.LogRecord) -> str:
        event, fields = _record_fields(record)
        parts = [
            f"ts={_timestamp(record)}",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"event={_kv_value(event)}",
        ]
        parts.extend(f"{key}={_kv_value(value)}" for key, value in fields.items())
        if record.exc_info:
            parts.append(f"exception={_kv_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        event, fields = _record_fields(record)
        payload: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": event,
        }
        for key, value in fields.items():
            payload.setdefault(key, value)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> logging.Logger:
    """Install one handler on the ``agentd`` logger (replacing a previous agentd handler).

    ``level`` is one of :data:`LEVELS`; ``fmt`` is ``"kv"`` or ``"json"``.  Output goes to
    ``stream`` (default: stderr, so stdout keeps only the ``agentd listening on`` banner).
    """
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {sorted(LEVELS)}, got {level!r}")
    if fmt not in ("kv", "json"):
        raise ValueError(f"log format must be 'kv' or 'json', got {fmt!r}")
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in list(logger.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(KeyValueFormatter() if fmt == "kv" else JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(LEVELS[level])
    logger.propagate = False
    return logger
