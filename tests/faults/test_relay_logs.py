"""A relay process that fails, in ``log_format = "json"`` (docs/operations.md §7, §13.2).

``agentd start`` in json mode turns an uncaught exception into one ``daemon_crashed`` JSON line; a
relay process printed a raw Python traceback into the same JSON stream instead (every line of it
unparseable for a log pipeline).  Now it writes one ``relay_crashed`` line and exits 1.  The relay is
a real ``python -P -m daemon.dataplane.relay_main`` process given a specification whose inherited
file descriptors do not exist."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

from daemon.config import AgentdConfig, RoutingConfig, ServerConfig
from daemon.dataplane.processes import RelaySpec

MISSING_FD = 999  # not open in the child (only 0-2 are inherited)


def _run(log_format: str) -> subprocess.CompletedProcess[bytes]:
    cfg = AgentdConfig(
        server=ServerConfig(host="127.0.0.1", port=0, data_plane_processes=2, log_format=log_format),
        routing=RoutingConfig(worker_urls=("http://127.0.0.1:9",)),
    )
    spec = RelaySpec(cfg, 0, MISSING_FD, MISSING_FD, "http://127.0.0.1:9", MISSING_FD, 2)
    return subprocess.run(
        [sys.executable, "-P", "-m", "daemon.dataplane.relay_main"],
        input=pickle.dumps(spec),
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_a_crashed_relay_writes_one_json_line_in_json_mode() -> None:
    done = _run("json")
    assert done.returncode == 1
    lines = [line for line in done.stderr.decode().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is JSON
    [crash] = [r for r in records if r.get("event") == "relay_crashed"]
    assert crash["level"] == "critical" and crash["relay"] == 0
    assert "OSError" in crash["error"] and "Traceback" in crash["traceback"]


def test_in_kv_mode_the_traceback_is_printed_as_before() -> None:
    done = _run("kv")
    assert done.returncode == 1
    assert b"Traceback" in done.stderr and b"relay_crashed" not in done.stderr
