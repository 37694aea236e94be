"""Processes for the load and soak runs: ``agentd start`` and the fast fake worker, their RSS.

Each runs in its own process so that the proxy under test, the worker and the load generator
compete for the cores the way separate deployments would; :func:`rss_bytes` reads a process's
resident set from ``/proc`` (Linux).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import trio

from bench.harness import daemon_env

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
    # every process gets its own state directory (an agentd's Batch API database, docs/batch.md §4)
    proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, env=daemon_env())
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


# ----------------------------------------------------------------------------- per-process accounting
# What a multi-process daemon's benchmark needs to show where its CPU and its connections went
# (docs/benchmarks.md §10.3): every process of a tree with its role, its CPU, and which of the
# load generator's connections it serves.  Linux /proc only.


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its live descendants, parents first."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop(0)
        try:
            children: list[int] = []
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children", encoding="ascii") as fh:
                    children.extend(int(c) for c in fh.read().split())
        except OSError:
            continue  # exited meanwhile
        out.append(p)
        todo.extend(children)
    return out


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of one process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_role(pid: int) -> str:
    """``relay`` for an agentd relay process, else ``main`` (the process that was started)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return "gone"
    return "relay" if b"daemon.dataplane.relay_main" in argv else "main"


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp_sockets() -> dict[int, tuple[int, int]]:
    """inode -> (local port, remote port) of every TCP socket in this network namespace."""
    out: dict[int, tuple[int, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], int(fields[9])
            if inode:
                out[inode] = (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16))
    return out


def connection_owners(pids: list[int], server_port: int) -> dict[int, int]:
    """client port -> pid of the process holding the server end of that connection to ``server_port``
    (a connection held by several processes, e.g. across a fork, is attributed to the first)."""
    sockets = _tcp_sockets()
    owners: dict[int, int] = {}
    for pid in pids:
        for inode in _socket_inodes(pid):
            ports = sockets.get(inode)
            if ports is not None and ports[0] == server_port and ports[1] != 0:
                owners.setdefault(ports[1], pid)
    return owners


def client_ports(pid: int, server_port: int) -> list[int]:
    """The local ports of process ``pid``'s connections to ``server_port`` (a load generator's)."""
    sockets = _tcp_sockets()
    return [sockets[i][0] for i in _socket_inodes(pid) if i in sockets and sockets[i][1] == server_port]
