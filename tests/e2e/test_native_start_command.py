"""``agentd start`` as a real process: banner, serving, SIGTERM -> exit 0; bad config -> exit 2."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from native_fakes import read_line, reap, stop_process

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
        with trio.fail_after(180):
            line = await read_line(proc.stdout)
        match = re.fullmatch(r"agentd listening on (http://127\.0\.0\.1:(\d+))\n", line)
        assert match, line
        assert match.group(2) != "0"
        async with httpx.AsyncClient(base_url=match.group(1), timeout=30) as client:
            response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": True})
        assert response.status_code == 200 and response.content.endswith(b"data: [DONE]\n\n")
        assert await stop_process(proc) == 0
        assert await proc.stdout.receive_some(65536) == b""  # exactly one line on stdout
    finally:
        await reap(proc)


def test_native_start_command_bad_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[server]\nport = "x"\nbogus = 1\n')
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "start", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "server.port" in done.stderr and "server.bogus" in done.stderr


def _start_beside_a_busy_port(
    extra_args: list[str], config_text: str, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``agentd start`` while another socket listens on the port it is told to use (``{port}`` in
    ``extra_args`` and ``config_text``)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = tmp_path / "agentd.toml"
        config.write_text(config_text.format(port=port))
        args = [arg.format(port=port) for arg in extra_args]
        done = subprocess.run(
            [sys.executable, "-m", "daemon", "start", "--config", str(config), "--log-level", "warning", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    return done, port


@pytest.mark.parametrize(
    ("args", "section", "field"),
    [
        (["--port", "{port}"], "", "server.port"),
        ([], "[server]\nport = 0\n[prometheus]\nport = {port}\n", "prometheus.port"),
        ([], "[server]\nport = 0\n[admin]\nport = {port}\n", "admin.port"),
    ],
)
def test_start_on_a_port_in_use_exits_2_naming_the_field(
    tmp_path: Path, args: list[str], section: str, field: str
) -> None:
    done, port = _start_beside_a_busy_port(args, "[embedded]\ndp_size = 1\n" + section, tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{field}: cannot listen on 127.0.0.1:{port}: Address already in use (errno 98)" in done.stderr
    assert "Traceback" not in done.stderr
    assert "agentd listening" not in done.stdout


def test_start_on_a_port_in_use_json_logs_one_config_error_line(tmp_path: Path) -> None:
    text = '[embedded]\ndp_size = 1\n[server]\nport = 0\nlog_format = "json"\n[prometheus]\nport = {port}\n'
    done, port = _start_beside_a_busy_port([], text, tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [json.loads(line) for line in done.stderr.splitlines() if '"config_error"' in line]
    assert len(errors) == 1
    expected = f"prometheus.port: cannot listen on 127.0.0.1:{port}: Address already in use (errno 98)"
    assert errors[0]["lines"] == [expected]
