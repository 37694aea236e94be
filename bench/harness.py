"""Processes, ports and CPU accounting shared by the socket benchmarks (proxy_overhead, relay_cpu)
and the bench driver.

The socket benchmarks run three processes on one machine: a fake worker (the benchmark module
itself, re-run with ``python -m bench.<name> --serve-worker PORT``), ``agentd start`` in front of
it, and the load generator.  CPU accounting reads ``/proc`` (Linux).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]  # the repository (agentd runs from here)


def free_port() -> int:
    """A loopback port that was free a moment ago (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux ``/proc``; ``OSError`` elsewhere)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    # after the command name: state is field 3, utime 14 and stime 15 (1-based, man 5 proc)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (Linux ``/proc``)."""
    total = 0.0
    todo = [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children", encoding="ascii") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue  # exited meanwhile
    return total


def python_speed_probe_us() -> float:
    """Best-of-5 time of ``sum(range(1000))`` in microseconds: about 8-10 us on an idle modern
    core; much more means the machine is contended and every number below is inflated."""
    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


async def read_request(stream: trio.SocketStream, buf: bytearray) -> bytes | None:
    """The next request head on a keep-alive connection (its body is consumed); None at EOF."""
    while b"\r\n\r\n" not in buf:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buf += data
    end = buf.index(b"\r\n\r\n")
    head = bytes(buf[:end])
    del buf[: end + 4]
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buf) < length:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buf += data
    del buf[:length]
    return head


def request_path(head: bytes) -> bytes:
    """The path of a request head (``POST /v1/chat/completions HTTP/1.1`` -> ``/v1/chat/completions``)."""
    return head.split(b" ", 2)[1]


def daemon_env(state_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The environment of an agentd the bench starts: its own state directory (``XDG_STATE_HOME``),
    so that its Batch API database is neither the user's nor another bench daemon's (an agentd
    refuses to start on a database another one holds, docs/batch.md §4).  Without ``state_dir``,
    a fresh temporary directory removed when the bench exits."""
    if state_dir is None:
        state_dir = tempfile.mkdtemp(prefix="agentd-bench-state-")
        atexit.register(shutil.rmtree, state_dir, True)
    path = os.path.abspath(state_dir)
    os.makedirs(path, exist_ok=True)
    return dict(os.environ, XDG_STATE_HOME=path)


def spawn_module(
    module: str,
    *args: str,
    stdout: int | None = None,
    stderr: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m module args...`` with this interpreter, from the repository root."""
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdout=stdout, stderr=stderr, env=env)


def start_agentd(port: int, worker_port: int, policy: str) -> subprocess.Popen[bytes]:
    """``agentd start`` on ``port`` in front of the one worker at ``worker_port`` (stdout discarded)."""
    args = ["--port", str(port), "--log-level", "warning"]
    args += ["--worker-urls", f"http://127.0.0.1:{worker_port}", "--policy", policy]
    return spawn_module("daemon", "start", *args, stdout=subprocess.DEVNULL, env=daemon_env())


def wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not start listening on port {port}")


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate the helper processes, newest first; kill any that ignores it for 30 s."""
    for proc in reversed(procs):
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
