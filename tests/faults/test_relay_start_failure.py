"""A relay process that cannot start: ``agentd start`` says so in one line and exits 1 (docs/operations.md
§13.2).  Before, the kv-mode daemon ended in an exception-group traceback.

The relay is made to fail the way a broken installation would, before it reads anything: a
``sitecustomize`` module on ``PYTHONPATH`` (the relays inherit it) exits the relay's interpreter."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

SITECUSTOMIZE = """
import os
import sys
if "daemon.dataplane.relay_main" in sys.orig_argv:
    sys.stderr.write("relay refused to start (test)\\n")
    sys.stderr.flush()
    os._exit(3)
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_relay_that_does_not_start_is_one_line_and_exit_1(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    config = tmp_path / "agentd.toml"
    config.write_text(
        "enable_program_scheduling = true\n"
        '[server]\nhost = "127.0.0.1"\nport = 0\ndata_plane_processes = 2\n'
        f'[routing]\nworker_urls = ["http://127.0.0.1:{_closed_port()}"]\n'
        "[batch_api]\nenabled = false\n"
        "[program_scheduling]\ntoken_capacity_per_dp_rank = 100000\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "start", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "relay refused to start (test)" in output  # the relay's own words reach the operator
    assert "Traceback" not in output
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("agentd start: relay process ") and "did not start: exit status 3" in last, last
