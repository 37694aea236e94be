"""Every log event the daemon can write is listed in docs/operations.md §7 (session-26 walk).

The walk found 20 events an operator could see in the logs (``client_gone``, ``daemon_stopped``,
``shutdown_requested``, ``listener_closed``, the ``relay_*`` lifecycle, ...) that no page named, so a
log shipper's alert or a grep had nothing to start from.  The event names are read from the source:
the literal third argument of each ``log_event(logger, level, "name", ...)`` call, the
``agentd_event`` of records logged with ``extra=``, and the configuration warnings' ``event=``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("actors", "daemon", "sim", "bench")


def emitted_events() -> dict[str, str]:
    events: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name == "log_event" and len(node.args) >= 3 and isinstance(node.args[2], ast.Constant):
                    events.setdefault(str(node.args[2].value), str(path.relative_to(ROOT)))
                if name == "ConfigWarning":
                    for arg in node.args[:1]:
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                            events.setdefault(arg.value, str(path.relative_to(ROOT)))
                for kw in node.keywords:
                    if kw.arg == "event" and name == "ConfigWarning" and isinstance(kw.value, ast.Constant):
                        events.setdefault(str(kw.value.value), str(path.relative_to(ROOT)))
            for match in re.finditer(r'"agentd_event": "([a-z_]+)"', path.read_text()):
                events.setdefault(match.group(1), str(path.relative_to(ROOT)))
    return events


def section_7() -> str:
    """docs/operations.md §7: the json-mode table of §7 and the table of every event in §7.1."""
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("## 7. Log formats")
    return text[start : text.index("\n## 8.", start)]


def test_the_scan_finds_the_events_it_should() -> None:
    events = emitted_events()
    # one of each kind of source: log_event, extra=agentd_event, a configuration warning
    assert {"daemon_listening", "internal_error", "program_scheduling_reference_calibration"} <= set(events)
    assert len(events) >= 60


def test_every_emitted_event_is_in_operations_7() -> None:
    listed = set(re.findall(r"`([a-z_]+)`", section_7()))
    missing = {event: where for event, where in emitted_events().items() if event not in listed}
    assert missing == {}
