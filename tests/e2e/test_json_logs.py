"""``agentd start --log-format json`` as a real process: every line on stdout and stderr is one
JSON object with an ``event`` (banner, config errors, crashes, library logs, warnings); kv mode keeps
the plain ``agentd listening on`` banner."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import trio
from native_fakes import read_line

ROOT = Path(__file__).resolve().parents[2]
AGENTD = [sys.executable, "-m", "daemon", "start"]


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object with an event name (fails naming the first bad line)."""
    records = []
    for line in text.splitlines():
        record = json.loads(line)
        assert isinstance(record, dict), line
        assert isinstance(record.get("event"), str) and record["event"], line
        assert {"ts", "level", "logger"} <= record.keys(), line
        records.append(record)
    return records


async def _drain(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
    while chunk := await stream.receive_some(65536):
        into.extend(chunk)


async def test_json_mode_every_line_is_a_json_event() -> None:
    cmd = [*AGENTD, "--config", "configs/quickstart.toml", "--log-format", "json", "--port", "0"]
    proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr = bytearray()
    try:
        assert proc.stdout is not None and proc.stderr is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, proc.stderr, stderr)
            with trio.fail_after(180):
                banner_text = await read_line(proc.stdout)
            banner = _json_lines(banner_text)[0]
            assert banner["event"] == "daemon_listening" and banner["metrics_url"] is None
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+", banner["url"]) and not banner["url"].endswith(":0")
            async with httpx.AsyncClient(base_url=banner["url"], timeout=30) as client:
                good = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "agentd-sim",
                        "messages": [{"role": "user", "content": "Plan the refactor."}],
                        "max_tokens": 4,
                        "vllm_xargs": {"agentic_context": {"program_id": "task-a:lead", "task_id": "task-a"}},
                    },
                )
                bad = await client.post(
                    "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
                )
            assert good.status_code == 200, good.text
            assert bad.status_code == 400, bad.text
            proc.send_signal(signal.SIGINT)
            with trio.fail_after(180):
                code = await proc.wait()
            rest = bytearray()
            with trio.fail_after(10):
                await _drain(proc.stdout, rest)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0, stderr.decode()
    assert rest == b""  # the banner is the only line on stdout
    events = [r["event"] for r in _json_lines(stderr.decode())]
    # the quickstart leaves the coefficients at default, but its embedded ranks run that very cost model
    assert "program_scheduling_reference_calibration" not in events
    assert {"daemon_listening", "shutdown_requested", "daemon_stopped"} <= set(events), events


async def test_kv_mode_banner_is_unchanged() -> None:
    cmd = [*AGENTD, "--config", "configs/quickstart.toml", "--port", "0", "--log-level", "info"]
    proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr = bytearray()
    try:
        assert proc.stdout is not None and proc.stderr is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, proc.stderr, stderr)
            with trio.fail_after(180):
                line = await read_line(proc.stdout)
            assert re.fullmatch(r"agentd listening on http://127\.0\.0\.1:\d+\n", line), line
            proc.send_signal(signal.SIGINT)
            with trio.fail_after(180):
                code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0
    text = stderr.decode()
    assert text.startswith("ts=") and "event=daemon_listening" in text
    assert all(line.startswith("ts=") for line in text.splitlines())


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENTD, *args], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)


def test_json_mode_config_error_is_one_line_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[server]\nport = "x"\nlog_format = "json"\nbogus = 1\n')
    done = _run(["--config", str(config)])
    assert done.returncode == 2 and done.stdout == ""
    [record] = _json_lines(done.stderr)
    assert record["event"] == "config_error" and record["level"] == "error"
    assert any("server.port" in line for line in record["lines"])
    assert any("server.bogus" in line for line in record["lines"])


def test_bad_log_format_exits_2_naming_the_field() -> None:
    done = _run(["--log-format", "yaml", "--port", "0"])
    assert done.returncode == 2 and done.stdout == ""
    assert "server.log_format" in done.stderr and "yaml" in done.stderr


# an unexpected failure inside the running daemon: run_daemon replaced by one that raises (the
# crash path is for what agentd does not anticipate; a port in use is a configuration error now)
_CRASHING = (
    "import sys\n"
    "import daemon.supervisor\n"
    "async def crashing(*args, **kwargs):\n"
    "    raise RuntimeError('injected crash')\n"
    "daemon.supervisor.run_daemon = crashing\n"
    "from daemon.cli import main\n"
    "sys.exit(main(['start', *sys.argv[1:]]))\n"
)


def test_json_mode_crash_is_one_daemon_crashed_line(tmp_path: Path) -> None:
    config = tmp_path / "agentd.toml"
    config.write_text("[embedded]\ntime_scale = 100.0\n")
    args = ["--config", str(config), "--port", "0", "--log-format", "json", "--log-level", "warning"]
    done = subprocess.run(
        [sys.executable, "-c", _CRASHING, *args], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 1 and done.stdout == ""
    records = _json_lines(done.stderr)
    crashed = [r for r in records if r["event"] == "daemon_crashed"]
    assert len(crashed) == 1 and crashed[0]["level"] == "critical"
    assert "Traceback" in crashed[0]["traceback"] and "RuntimeError: injected crash" in crashed[0]["error"]


def test_json_mode_port_in_use_is_one_config_error_line_exit_2() -> None:
    with socket.socket() as taken:  # the port is bound: the listener cannot open
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run(["--port", str(port), "--log-format", "json", "--log-level", "warning"])
    assert done.returncode == 2 and done.stdout == ""
    errors = [r for r in _json_lines(done.stderr) if r["event"] == "config_error"]
    assert len(errors) == 1 and errors[0]["level"] == "error"
    assert errors[0]["lines"] == [f"server.port: cannot listen on 127.0.0.1:{port}: Address already in use (errno 98)"]
    assert not [r for r in _json_lines(done.stderr) if r["event"] == "daemon_crashed"]
