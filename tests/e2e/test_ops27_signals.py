"""Ctrl-C on ``agentd start`` with relay processes, as a terminal sends it (docs/operations.md §13.2).

A terminal's Ctrl-C is a SIGINT to the whole foreground process group.  The relay processes were in
the scheduler's group: a Ctrl-C while they were still booting (a relay needs seconds of imports on
a loaded machine) killed them with ``KeyboardInterrupt`` tracebacks and the daemon exited 1 with an
exception group ("relay process 0 did not start: killed by SIGINT").  Now each relay has a process
group of its own, the scheduler process stops them, and the daemon exits 0 without a traceback,
during start-up as after it.  The daemon is a real ``agentd start`` process here; the worker is
down (a closed port): agentd starts without it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

BUDGET_SECONDS = 240.0  # two relay processes boot in seconds idle, in tens of seconds on a loaded box


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "agentd.toml"
    path.write_text(
        "enable_program_scheduling = true\n"
        '[server]\nhost = "127.0.0.1"\nport = 0\ndata_plane_processes = 2\nshutdown_grace_seconds = 1.0\n'
        f'[routing]\nworker_urls = ["http://127.0.0.1:{_closed_port()}"]\n'
        "[batch_api]\nenabled = false\n"
        "[program_scheduling]\ntoken_capacity_per_dp_rank = 100000\n"
    )
    return path


def _relay_pids(text: str) -> list[int]:
    return [int(line.split(" pid=")[1].split()[0]) for line in text.splitlines() if "event=relay_started" in line]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _ctrl_c(tmp_path: Path, after: str) -> tuple[int, str, list[int]]:
    """Start ``agentd start`` in a process group of its own (as a shell does for a foreground job),
    SIGINT the group as soon as its output shows ``after``; its exit code, output and relay pids."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "daemon", "start", "--config", str(_config(tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        process_group=0,
    )
    assert process.stdout is not None
    output = b""
    sent = False
    relays: list[int] = []
    try:
        with trio.fail_after(BUDGET_SECONDS):
            async for chunk in process.stdout:
                output += chunk
                text = output.decode(errors="replace")
                relays = _relay_pids(text)
                if not sent and after in text:
                    os.killpg(process.pid, signal.SIGINT)
                    sent = True
            code = await process.wait()
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    assert sent, output.decode(errors="replace")[-2000:]
    return code, output.decode(errors="replace"), relays


@pytest.mark.parametrize("moment", ["event=relay_started", "agentd listening on"])
async def test_ctrl_c_stops_the_daemon_and_its_relays_with_exit_0(tmp_path: Path, moment: str) -> None:
    code, output, relays = await _ctrl_c(tmp_path, moment)
    assert code == 0, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert len(relays) == 2
    assert not any(_alive(pid) for pid in relays)  # the scheduler waited for its relays' exit
    assert "event=daemon_stopped" in output
