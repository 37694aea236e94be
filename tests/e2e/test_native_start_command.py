"""``agentd start`` as a real process: banner, serving, SIGTERM -> exit 0; bad config -> exit 2."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio
from native_fakes import read_line

ROOT = Path(__file__).resolve().parents[2]


async def test_native_start_command_banner_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "agentd.toml"
    config.write_text("[server]\nport = 3999\n[embedded]\ndp_size = 2\ntime_scale = 100.0\n")
    cmd = [
        sys.executable,
        "-m",
        "daemon",
        "start",
        "--config",
        str(config),
        "--port",
        "0",
        "--policy",
        "round_robin",
        "--log-level",
        "warning",
    ]
    proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        with trio.fail_after(60):
            line = await read_line(proc.stdout)
        match = re.fullmatch(r"agentd listening on (http://127\.0\.0\.1:(\d+))\n", line)
        assert match, line
        assert match.group(2) != "0"
        async with httpx.AsyncClient(base_url=match.group(1), timeout=30) as client:
            response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": True})
        assert response.status_code == 200 and response.content.endswith(b"data: [DONE]\n\n")
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(60):
            code = await proc.wait()
        assert code == 0
        assert await proc.stdout.receive_some(65536) == b""  # exactly one line on stdout
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_native_start_command_bad_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[server]\nport = "x"\nbogus = 1\n')
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "start", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "server.port" in done.stderr and "server.bogus" in done.stderr
