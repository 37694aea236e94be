"""How the daemon renders structured log events (``actors.logevents.log_event``).

The rendering is chosen once by :func:`configure_logging`:

* ``kv``   -> ``ts=2026-01-01T00:00:00.000Z level=info logger=agentd.proxy event=x k=v k2="a b"``
* ``json`` -> one JSON object per line with the same keys.

Fields travel on the ``LogRecord`` (``record.agentd_event`` / ``record.agentd_fields``) so the
formatter, not the call site, decides the wire format.  ``log_event`` checks ``isEnabledFor``
first, so debug events on the request hot path cost one comparison when debug is off.
All loggers live under ``agentd`` and only that logger gets a handler: the root logger and the
global logging state of embedding programs (tests) are left alone.

``agentd start --log-format json`` owns its process, so it also calls :func:`capture_process_output`:
a JSON handler on the named library loggers (:data:`LIBRARY_LOGGERS`, ``propagate`` off so a line is
never written twice; their levels are left alone, so the same records as before come out, only
formatted), Python warnings through ``logging.captureWarnings`` (event ``python_warning``) and
"Exception ignored in ..." reports through ``sys.unraisablehook`` (event ``unraisable_exception``).
The root logger is still not touched.  :func:`banner_line` renders the start-up banner for either
format and :func:`event_line` any one-off event (``config_error``) before logging is configured.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import traceback
from datetime import UTC, datetime
from typing import Any, TextIO

from actors.logevents import ROOT_LOGGER
from daemon.config import LOG_FORMATS
from daemon.redact import redact

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_HANDLER_MARK = "_agentd_handler"
# Loggers of the libraries on the daemon's run path (hypercorn's own loggers are used when its
# config names none; agentd routes its error log to ``agentd.hypercorn``).
LIBRARY_LOGGERS = ("hypercorn", "quart", "trio", "httpx", "httpcore", "asyncio")
WARNINGS_LOGGER = "py.warnings"


# Characters a log line must never carry raw (docs/operations.md §10): C0 and C1 controls, DEL
# and the Unicode line/paragraph separators - a client-chosen value could otherwise forge lines
# or terminal escapes.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NEEDS_QUOTES = re.compile('[ "=\\\\\x00-\x1f\x7f-\x9f\u2028\u2029]')


def _escape_control(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _quoted(text: str) -> str:
    """A JSON string literal of ``text`` with every control character escaped."""
    return _CONTROL.sub(_escape_control, json.dumps(text, ensure_ascii=False))


def _kv_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = redact(value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str))
    if text == "" or _NEEDS_QUOTES.search(text):
        return _quoted(text)
    return text


def _safe(value: Any) -> Any:
    """A field value for the JSON formatter: strings redacted (json.dumps escapes controls)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict | list):
        return _deep(value)
    return value


def _deep(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return redact(value) if isinstance(value, str) else value


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def _record_fields(record: logging.LogRecord, plain_event: str = "message") -> tuple[str, dict[str, Any]]:
    event = getattr(record, "agentd_event", None)
    fields = getattr(record, "agentd_fields", None)
    if event is None:  # a plain logger.info("...") call: keep the text as a field
        return plain_event, {"text": record.getMessage()}
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
    """One JSON object per line: ts, level, logger, event, then the fields.

    A record without an agentd event (a library's plain ``logger.warning("...")``) gets the event
    ``plain_event`` and its text in ``text``."""

    def __init__(self, plain_event: str = "message") -> None:
        super().__init__()
        self.plain_event = plain_event

    def format(self, record: logging.LogRecord) -> str:
        event, fields = _record_fields(record, self.plain_event)
        payload: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": event,
        }
        for key, value in fields.items():
            payload.setdefault(key, _safe(value))
        if record.exc_info:
            payload["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> logging.Logger:
    """Install one handler on the ``agentd`` logger (replacing a previous agentd handler).

    ``level`` is one of :data:`LEVELS`; ``fmt`` is ``"kv"`` or ``"json"``.  Output goes to
    ``stream`` (default: stderr, so stdout keeps only the ``agentd listening on`` banner).
    """
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {sorted(LEVELS)}, got {level!r}")
    if fmt not in LOG_FORMATS:
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


def _json_handler(stream: TextIO | None, plain_event: str) -> logging.Handler:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(JsonFormatter(plain_event))
    return handler


def _own_handler(name: str, handler: logging.Handler) -> None:
    logger = logging.getLogger(name)
    for old in list(logger.handlers):
        if getattr(old, _HANDLER_MARK, False):
            logger.removeHandler(old)
    logger.addHandler(handler)
    logger.propagate = False


def capture_process_output(stream: TextIO | None = None) -> None:
    """JSON mode of ``agentd start``: library logs, warnings and unraisable exceptions as JSON lines.

    Each logger of :data:`LIBRARY_LOGGERS` gets a JSON handler (event ``library_log``) and stops
    propagating; ``py.warnings`` gets one (event ``python_warning``) and ``logging.captureWarnings``
    is switched on; ``sys.unraisablehook`` logs ``unraisable_exception``.  Levels and the root
    logger are left as they are.  Call it once, after :func:`configure_logging`.
    """
    for name in LIBRARY_LOGGERS:
        _own_handler(name, _json_handler(stream, "library_log"))
    _own_handler(WARNINGS_LOGGER, _json_handler(stream, "python_warning"))
    logging.captureWarnings(True)
    unraisable_logger = logging.getLogger(f"{ROOT_LOGGER}.unraisable")

    def unraisable_hook(info: Any) -> None:
        lines = traceback.format_exception(info.exc_type, info.exc_value, info.exc_traceback)
        unraisable_logger.error(
            "unraisable_exception",
            extra={
                "agentd_event": "unraisable_exception",
                "agentd_fields": {
                    "message": info.err_msg or "Exception ignored in",
                    "object": repr(info.object),
                    "traceback": "".join(lines),
                },
            },
        )

    sys.unraisablehook = unraisable_hook


def event_line(fmt: str, logger_name: str, level: int, event: str, **fields: Any) -> str:
    """One event rendered as a line of ``fmt`` without going through a handler (no newline)."""
    record = logging.makeLogRecord(
        {
            "name": logger_name,
            "levelno": level,
            "levelname": logging.getLevelName(level),
            "msg": event,
            "agentd_event": event,
            "agentd_fields": fields,
        }
    )
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else KeyValueFormatter()
    return formatter.format(record)


def banner_line(fmt: str, url: str, metrics_url: str | None) -> str:
    """The start-up banner on stdout: ``agentd listening on URL`` (kv, unchanged for scripts that
    read it) or the JSON event ``daemon_listening`` with ``url`` and ``metrics_url``."""
    if fmt != "json":
        return f"agentd listening on {url}"
    return event_line(fmt, f"{ROOT_LOGGER}.start", logging.INFO, "daemon_listening", url=url, metrics_url=metrics_url)
