"""``agentd start`` under an open-file limit too small for its connection caps: it says so at start
(WARN ``open_file_limit_low``, docs/operations.md §7.1) instead of stalling later, when accepting
fails with EMFILE below ``[limits] max_connections`` (found by the session-44 security audit: under
``prlimit --nofile=200`` a flood of 400 connections hung ``/health``)."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import trio
from native_fakes import read_line

from daemon.commands.start import OTHER_FILES, open_file_limit_warning
from daemon.config import AgentdConfig, LimitsConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_warning_names_the_limit_and_what_the_caps_need() -> None:
    cfg = AgentdConfig(limits=LimitsConfig(max_connections=1000, max_in_flight_requests=500))
    needed = 1000 + 500 + OTHER_FILES
    assert open_file_limit_warning(cfg, needed) is None
    assert open_file_limit_warning(cfg, None) is None  # unlimited
    warning = open_file_limit_warning(cfg, needed - 1)
    assert warning is not None and warning.event == "open_file_limit_low"
    assert dict(warning.fields) == {"open_file_limit": needed - 1, "needed": needed}
    assert "limits.max_connections" in warning.message and "limits.max_in_flight_requests" in warning.message


async def _run_under(limit: int, tmp_path: Path) -> str:
    config = tmp_path / "c.toml"
    config.write_text(f'[batch_api]\ndatabase_path = "{tmp_path / "b.sqlite3"}"\n')

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    cmd = [sys.executable, "-m", "daemon", "start", "--config", str(config), "--port", "0"]
    proc = await trio.lowlevel.open_process(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=cap
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        with trio.fail_after(180):
            await read_line(proc.stdout)  # the banner: listening
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(180):
            await proc.wait()
        with trio.fail_after(10):
            err = b""
            while chunk := await proc.stderr.receive_some(65536):
                err += chunk
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return err.decode()


async def test_start_warns_under_a_small_hard_limit_and_not_under_a_large_one(tmp_path: Path) -> None:
    small = await _run_under(1024, tmp_path)  # the defaults need 8192 + 4096 + 64
    line = next(line for line in small.splitlines() if "event=open_file_limit_low" in line)
    assert line.endswith("open_file_limit=1024 needed=12352") and "level=warning" in line, line
    large = await _run_under(12352, tmp_path)
    assert "open_file_limit_low" not in large, large
