"""``daemon.logs.capture_process_output``: library logs, Python warnings and unraisable exceptions
become JSON lines.  It changes process-wide state, so it runs in a child interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from daemon.logs import banner_line, event_line

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import gc, logging, warnings
from daemon.logs import capture_process_output, configure_logging
configure_logging("info", "json")
capture_process_output()
logging.getLogger("hypercorn.error").warning("bind %s", "busy")
logging.getLogger("quart.app").error("boom")
logging.getLogger("hypercorn.access").info("below the root's WARNING: dropped as before")
warnings.warn("old thing", UserWarning)
class Broken:
    def __del__(self):
        raise RuntimeError("in __del__")
Broken()
gc.collect()
"""


def test_library_logs_warnings_and_unraisable_are_json_lines() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=180, check=True
    )
    assert done.stdout == ""
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(r["event"], r["logger"], r["level"]) for r in records] == [
        ("library_log", "hypercorn.error", "warning"),
        ("library_log", "quart.app", "error"),
        ("python_warning", "py.warnings", "warning"),
        ("unraisable_exception", "agentd.unraisable", "error"),
    ]
    assert records[0]["text"] == "bind busy"
    assert "UserWarning: old thing" in records[2]["text"]
    assert "RuntimeError: in __del__" in records[3]["traceback"]


def test_banner_line_kv_is_the_plain_banner_and_json_is_an_event() -> None:
    assert banner_line("kv", "http://127.0.0.1:3001", None) == "agentd listening on http://127.0.0.1:3001"
    record = json.loads(banner_line("json", "http://127.0.0.1:3001", "http://0.0.0.0:29000"))
    assert record["event"] == "daemon_listening" and record["logger"] == "agentd.start"
    assert record["url"] == "http://127.0.0.1:3001" and record["metrics_url"] == "http://0.0.0.0:29000"


def test_event_line_renders_both_formats() -> None:
    assert json.loads(event_line("json", "agentd.start", 40, "config_error", lines=["a b"]))["lines"] == ["a b"]
    assert event_line("kv", "agentd.start", 40, "config_error", n=1).endswith(
        "level=error logger=agentd.start event=config_error n=1"
    )
