"""Processes for the load and soak runs: ``agentd start`` and the fast fake worker, their RSS.

Each runs in its own process so that the proxy under test, the worker and the load generator
compete for the cores the way separate deployments would; :func:`rss_bytes` reads a process's
resident set from ``/proc`` (Linux).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import trio

ROOT = Path(__file__).resolve().parents[1]
BANNER = re.compile(r".*listening on (http://[\w.\[\]:-]+)\s*$")


async def _read_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        data += chunk
    return data.decode()


@asynccontextmanager
async def running(
    cmd: list[str], stderr: IO[bytes] | int = subprocess.DEVNULL
) -> AsyncIterator[tuple[trio.Process, str]]:
    """Start ``cmd``, read its ``... listening on URL`` banner, yield (process, URL); SIGTERM at exit."""
    proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr)
    try:
        assert proc.stdout is not None
        with trio.fail_after(120):
            line = await _read_line(proc.stdout)
        match = BANNER.match(line)
        if match is None:
            raise RuntimeError(f"{cmd[:4]} did not start: {line!r}")
        yield proc, match.group(1)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(30):
                await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def agentd_cmd(config: Path) -> list[str]:
    return [sys.executable, "-m", "daemon", "start", "--config", str(config)]


def fakeworker_cmd(**shape: object) -> list[str]:
    cmd = [sys.executable, "-m", "bench.fakeworker", "--port", "0"]
    for key, value in shape.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))
    return ordered[index]
