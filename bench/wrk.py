"""A load generator and a fake worker that leave the cores to the proxy: wrk and nginx.

``bench.proxy_overhead --harness native`` (docs/benchmarks.md §10.14).  The default harness is
Python (a Trio load generator and a Trio fake worker): on a 2-core machine, at a few thousand
requests/s, the two take 0.4-0.6 of a core between them (docs/benchmarks.md §10.9), so they compete with the proxy
they measure, and a proxy with a second relay process cannot show what that process buys.  wrk
(C, one event loop per thread) and nginx (C, one process, answering from memory) do the same
jobs for a small fraction of that CPU:

* the worker: nginx with ``master_process off``, one process, answering every path with the same
  bytes as the Python worker (the chat completion, the model list, one idle engine's metrics);
* the load generator: ``wrk -t N -c N`` (one connection per thread, so each virtual user keeps
  its own body, i.e. its own Program), its Lua script reading that body from a file and printing
  the run's counts and latency percentiles (microseconds) in one line at the end.

Both come from Debian (``apt-get install wrk nginx-light``).  Durations are whole seconds (wrk's).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.procs import client_ports, connection_owners, process_cpu, tree_pids

INSTALL_HINT = "apt-get install wrk nginx-light"
_MARK = "AGENTD-WRK"

# One thread per connection (wrk -t N -c N): ``id`` is the thread's number, so each virtual user
# sends its own body all run long.  ``done`` runs once, after every thread has stopped.
_SCRIPT = """\
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end
function init(args)
  local f = assert(io.open(args[1] .. "-" .. (id % tonumber(args[2])) .. ".json", "rb"))
  wrk.method = "POST"
  wrk.body = f:read("*a")
  f:close()
  wrk.headers["Content-Type"] = "application/json"
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("%s %d %d %d %d %d %d %d %.3f %d %d\\n", "MARK",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(99)))
end
""".replace("MARK", _MARK)


def tools() -> tuple[str, str] | None:
    """(wrk, nginx) executables, or None when either is missing."""
    wrk = shutil.which("wrk")
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    return None if wrk is None or nginx is None else (wrk, nginx)


def _nginx_string(data: bytes) -> str:
    """``data`` as an nginx single-quoted string (its parser turns ``\\n`` back into a newline)."""
    text = data.decode()
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def start_worker(
    nginx: str, port: int, workdir: Path, reply: bytes, models: bytes, metrics: bytes
) -> subprocess.Popen[bytes]:
    """nginx in one process on 127.0.0.1:``port``, answering like ``bench.proxy_overhead``'s
    worker: ``/v1/models``, ``/metrics``, ``/health`` and ``reply`` on every other path (request
    bodies read and dropped)."""
    workdir.mkdir(parents=True, exist_ok=True)
    temp = {name: workdir / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    config = f"""\
master_process off;
daemon off;
worker_processes 1;
pid {workdir / "nginx.pid"};
error_log {workdir / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 600s;
  client_max_body_size 0;
  client_body_temp_path {temp["body"]};
  proxy_temp_path {temp["proxy"]};
  fastcgi_temp_path {temp["fastcgi"]};
  uwsgi_temp_path {temp["uwsgi"]};
  scgi_temp_path {temp["scgi"]};
  server {{
    listen 127.0.0.1:{port};
    location = /v1/models {{ default_type application/json; return 200 {_nginx_string(models)}; }}
    location = /metrics {{ default_type "text/plain; version=0.0.4"; return 200 {_nginx_string(metrics)}; }}
    location = /health {{ default_type application/json; return 200 '{{}}'; }}
    location / {{ default_type application/json; return 200 {_nginx_string(reply)}; }}
  }}
}}
"""
    path = workdir / "nginx.conf"
    path.write_text(config)
    log = (workdir / "stderr.log").open("wb")
    try:
        return subprocess.Popen(
            [nginx, "-p", str(workdir), "-e", str(workdir / "error.log"), "-c", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    finally:
        log.close()


def write_bodies(workdir: Path, name: str, bodies: list[bytes]) -> str:
    """Write ``bodies`` as ``<prefix>-<i>.json``; return the prefix the script takes."""
    workdir.mkdir(parents=True, exist_ok=True)
    prefix = workdir / name
    for i, body in enumerate(bodies):
        Path(f"{prefix}-{i}.json").write_bytes(body)
    return str(prefix)


def _script(workdir: Path) -> Path:
    path = workdir / "agentd-bench.lua"
    if not path.exists():
        path.write_text(_SCRIPT)
    return path


def parse_done(stdout: str) -> dict[str, Any]:
    """The script's closing line: counts, errors and latency (microseconds)."""
    for line in stdout.splitlines():
        if line.startswith(_MARK + " "):
            fields = line.split()[1:]
            requests, duration_us, connect, read, write, status, timeout = (int(x) for x in fields[:7])
            return {
                "requests": requests,
                "duration_s": duration_us / 1e6,
                "errors": {"connect": connect, "read": read, "write": write, "status": status, "timeout": timeout},
                "mean_us": float(fields[7]),
                "p50_us": int(fields[8]),
                "p99_us": int(fields[9]),
            }
    raise SystemExit(f"wrk printed no summary line: {stdout[-500:]!r}")


def run(
    wrk: str,
    port: int,
    seconds: int,
    connections: int,
    prefix: str,
    count: int,
    workdir: Path,
    watch: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One wrk run: ``connections`` connections (one thread each) for ``seconds`` s, the i-th
    sending body ``i % count`` of ``prefix``.  With ``watch = (proxy pid, worker pid)``, also the
    CPU share (1.0 = one core) of the proxy's processes, the worker and wrk over the run, and which
    proxy process holds each of wrk's connections.  Any error (a non-2xx answer included) stops
    the bench, like the Python load generator's."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    cmd = [wrk, "-t", str(connections), "-c", str(connections), "-d", f"{seconds}s", "--timeout", "30s"]
    cmd += ["-s", str(_script(workdir)), url, "--", prefix, str(count)]
    pids = tree_pids(watch[0]) if watch else []
    cpu_before = {p: process_cpu(p) for p in [*pids, *(watch[1:] if watch else ())]}
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    owners: dict[int, int] = {}
    ports: list[int] = []
    if watch:
        # every connection is open once the run is under way: who holds the server end of each
        time.sleep(min(0.5, seconds / 4))
        ports = client_ports(proc.pid, port)
        owners = connection_owners(pids, port)
    stdout, stderr = proc.communicate()
    elapsed = time.perf_counter() - start
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"wrk exited {proc.returncode}: {stderr.strip()[-500:]}")
    result = parse_done(stdout)
    errors = {k: v for k, v in result["errors"].items() if v}
    if errors:
        raise SystemExit(f"wrk against port {port}: errors {errors} ({stdout.strip()[-300:]!r})")
    if watch:
        cpu = {p: (process_cpu(p) or 0.0) - (cpu_before[p] or 0.0) for p in cpu_before}
        loadgen = (
            children_after.ru_utime + children_after.ru_stime - children_before.ru_utime - children_before.ru_stime
        )
        result["cpu"] = cpu
        result["pids"] = pids
        result["loadgen_cpu_share"] = loadgen / elapsed
        result["worker_cpu_share"] = cpu[watch[1]] / result["duration_s"]
        result["connections"] = {p: sum(1 for c in ports if owners.get(c) == p) for p in pids}
        result["unattributed_connections"] = sum(1 for c in ports if c not in owners)
        result["client_connections"] = len(ports)
    return result
