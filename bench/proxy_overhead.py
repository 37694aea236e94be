"""Proxy overhead benchmark: direct to a zero-delay worker vs through agentd vs vllm-router.

Usage (from the repository root)::

    python -m bench.proxy_overhead [--seconds 3] [--concurrency 32] [--bodies 1,64,256]
        [--identity free,program] [--processes 1[,2]] [--http1 agentd,hypercorn] [--vllm-router PATH]
        [--harness python|native] [--json out.json]

Processes on one machine: a zero-delay fake worker (raw Trio sockets, HTTP/1.1 keep-alive, a
fixed chat-completion body), ``agentd start --worker-urls <worker> --policy round_robin`` (with
``--enable-program-scheduling`` for the Program-identity rows), vllm-router 0.1.17 with the same
flags when it is installed (``--vllm-router PATH``, else ``vllm-router`` on PATH; its rows are
skipped without it) and this load generator (raw keep-alive sockets, so the client costs little
CPU).  docs/benchmarks.md §10.2 records runs.  ``--harness native`` replaces the fake worker with
nginx and the load generator with wrk (bench/wrk.py, docs/benchmarks.md §10.14): at a few thousand
requests/s the Python pair takes 0.4-0.6 of a core, which a 2-core machine cannot spare when the
proxy runs two relay processes.

Requests are agent chat bodies of about 1, 64 and 256 KB (``--bodies``): a system prompt, tool
schemas and a long conversation of user/assistant/tool messages with code, quotes, escapes and
non-ASCII text, JSON-encoded the way httpx sends it (compact, UTF-8).  ``--identity``:

* ``free``: identity-free requests; agentd and vllm-router run plain ``round_robin``;
* ``program``: every virtual user is one Program (``vllm_xargs.agentic_context`` with its own
  ``session_id``, docs/program-scheduling.md §0); both systems run with Program scheduling on and a
  token capacity far above the load (admission never waits, the per-request path is measured).

Cells, for each body size and identity mode: p50/p99 latency at concurrency 1 (added = minus the
direct path with the same bodies), requests/s at concurrency ``--concurrency`` (closed loop, one
connection per virtual user) and the proxy's CPU per request during that run (user + system, the
whole process tree, so ``--processes 2`` counts every relay process).  For every c=N run the
bench also prints where the CPU and the connections went (``bench/procs.py``, Linux ``/proc``):
each proxy process's CPU share (1.00 = one core), the load generator's connections it holds and
its share of the requests, and the fake worker's and the load generator's own CPU shares, so an
uneven spread over relay processes or a saturated load generator shows in the output.

``--processes N[,M...]`` runs one agentd column per N with ``[server] data_plane_processes = N``
(docs/operations.md §13); an agentd without that setting runs only N = 1 and any other N exits 2
naming the option. Cells are measured once every relay process accepts connections.
``--http1 agentd,hypercorn`` adds one agentd column per HTTP/1.1 protocol (``[server]
http1_implementation``, docs/config.md), labelled ``h1`` (agentd's) and ``h11`` (hypercorn's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.bench import find_vllm_router
from bench.harness import (
    ROOT,
    daemon_env,
    free_port,
    python_speed_probe_us,
    read_request,
    request_path,
    spawn_module,
    stop_all,
    wait_listening,
)
from bench.interrupt import run_interruptible, run_main
from bench.output import write_atomic
from bench.procs import connection_owners, process_cpu, process_role, tree_pids
from bench.wrk import INSTALL_HINT, start_worker, tools, write_bodies
from bench.wrk import run as wrk_run
from daemon.commands.argtypes import positive_int_list

MODULE = "bench.proxy_overhead"  # re-run as the fake worker and the naive proxy
REPLY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
    }
).encode()
MODELS = b'{"object":"list","data":[{"id":"fake-model","object":"model","owned_by":"bench"}]}'
# what both routers' metrics pollers read from a vLLM worker: one idle engine
WORKER_METRICS = (
    b'vllm:num_requests_running{engine="0",model_name="fake-model"} 0.0\n'
    b'vllm:num_requests_waiting{engine="0",model_name="fake-model"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0",model_name="fake-model"} 0.0\n'
)
# far above anything the bench holds: admission never waits, the per-request path is measured
PROGRAM_CONFIG = {"token_capacity_per_dp_rank": 100_000_000, "max_active_programs_per_target": 10_000}
IDENTITY_MODES = ("free", "program")
HARNESSES = ("python", "native")


@attrs.frozen
class NativeHarness:
    """``--harness native``: wrk's executable, whole seconds per run, a directory for its files."""

    wrk: str
    seconds: int
    workdir: Path


# ----------------------------------------------------------------------------- request bodies
_TEXT = (
    "the function returns a list of results for each file in the repository and the tests check "
    "that every path is normalised before it is compared with the expected value so a missing "
    "import or an off-by-one in the loop shows up as a failing assertion déjà vu naïve café "
    "größe 日本語 テスト 中文 ✓ →"
)
_WORDS = _TEXT.split()
_CODE = (
    'def load(path: str) -> dict[str, "Any"]:\n'
    '    """Read the JSON file at `path`; raise ValueError naming it."""\n'
    "    with open(path, encoding='utf-8') as fh:\n"
    "        data = json.load(fh)\n"
    '    if not isinstance(data, dict):\n        raise ValueError(f"{path}: expected an object\\n")\n'
    '    return data  # tab:\there, backslash: \\\\ quote: " end\n'
)
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} in the workspace; returns its output as text",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "a path relative to the repository root"},
                    "pattern": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1},
                },
                "required": ["path"],
            },
        },
    }
    for name in ("read_file", "search_code", "run_tests", "edit_file")
]


def _prose(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        word = rng.choice(_WORDS)
        out.append(word)
        n += len(word) + 1
    return " ".join(out)


def agent_body(kb: int, identity: dict[str, Any] | None, seed: int = 0) -> bytes:
    """A chat-completions body of about ``kb`` KiB, as an agent sends it (httpx's JSON encoding)."""
    rng = random.Random(seed * 1000 + kb)
    target = kb * 1024
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + _prose(rng, min(2000, target // 4))},
    ]
    body: dict[str, Any] = {"model": "fake-model", "messages": messages, "max_tokens": 8, "temperature": 0.2}
    if kb > 1:
        body["tools"] = _TOOLS
    if identity is not None:
        body["vllm_xargs"] = {"agentic_context": identity}

    def size() -> int:
        return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())

    turn = 0
    while size() < target:
        turn += 1
        room = target - size()
        if turn % 3 == 1:
            messages.append({"role": "user", "content": _prose(rng, min(room, 600))})
        elif turn % 3 == 2:
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{turn}",
                            "type": "function",
                            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{turn}.py"})},
                        }
                    ],
                }
            )
        else:
            text = (_CODE * (1 + min(room, 4000) // len(_CODE)))[: max(1, min(room, 4000))]
            messages.append({"role": "tool", "tool_call_id": f"call_{turn - 1}", "content": text})
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def program_context(user: int) -> dict[str, Any]:
    """One Program per virtual user: a lead agent of its own session."""
    return {"session_id": f"bench-session-{user}", "agent_id": "lead", "expected_resume": True}


# ----------------------------------------------------------------------------- fake worker
def _response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
        f"connection: keep-alive\r\n\r\n"
    ).encode() + body


async def _worker_conn(stream: trio.SocketStream) -> None:
    buf = bytearray()
    try:
        while (head := await read_request(stream, buf)) is not None:
            path = request_path(head)
            if path == b"/health":
                await stream.send_all(_response("200 OK", b"{}"))
            elif path == b"/v1/models":
                await stream.send_all(_response("200 OK", MODELS))
            elif path == b"/metrics":
                await stream.send_all(_response("200 OK", WORKER_METRICS, "text/plain; version=0.0.4"))
            else:
                await stream.send_all(_response("200 OK", REPLY))
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        return


def serve_worker(port: int) -> None:
    async def main() -> None:
        await trio.serve_tcp(_worker_conn, port, host="127.0.0.1")

    run_interruptible(main)


# ----------------------------------------------------------------------------- naive baseline
def serve_naive_proxy(port: int, worker_port: int) -> None:
    """Reference point: the smallest hypercorn + httpx proxy (no validation, routing, metrics)."""
    # imported here: only this helper process needs hypercorn and httpx
    import httpx
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

    upstream = f"http://127.0.0.1:{worker_port}"

    async def main() -> None:
        async with httpx.AsyncClient() as client:

            async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
                if scope["type"] == "lifespan":
                    while True:
                        message = await receive()
                        if message["type"] == "lifespan.shutdown":
                            await send({"type": "lifespan.shutdown.complete"})
                            return
                        await send({"type": "lifespan.startup.complete"})
                body = b""
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client went away
                    body += message["body"]
                    if not message["more_body"]:
                        break
                response = await client.post(upstream + scope["path"], content=body)
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": response.content, "more_body": False})

            config = Config()
            config.bind = [f"127.0.0.1:{port}"]
            config.accesslog = None
            await serve(app, config)

    run_interruptible(main)


# ----------------------------------------------------------------------------- load generator
class Conn:
    def __init__(self, stream: trio.SocketStream, host_port: str, path: str, body: bytes) -> None:
        self.stream = stream
        self.request = (
            f"POST {path} HTTP/1.1\r\nhost: {host_port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.buf = b""

    async def _more(self, data: bytes) -> bytes:
        chunk = await self.stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        return data + chunk

    async def roundtrip(self) -> int:
        await self.stream.send_all(self.request)
        while b"\r\n\r\n" not in self.buf:
            self.buf = await self._more(self.buf)
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = None
        chunked = False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            while b"0\r\n\r\n" not in rest:
                rest = await self._more(rest)
            self.buf = rest.split(b"0\r\n\r\n", 1)[1]
        else:
            assert length is not None
            while len(rest) < length:
                rest = await self._more(rest)
            self.buf = rest[length:]
        if status != 200:
            raise SystemExit(f"HTTP {status}: {rest[:300]!r}")
        return status


async def connect(port: int, body: bytes) -> Conn:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Conn(stream, f"127.0.0.1:{port}", "/v1/chat/completions", body)


async def latency_run(port: int, seconds: float, body: bytes) -> list[float]:
    conn = await connect(port, body)
    for _ in range(30):  # warm-up
        await conn.roundtrip()
    samples: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        await conn.roundtrip()
        samples.append(time.perf_counter() - t0)
    await conn.stream.aclose()
    return samples


async def throughput_run(port: int, seconds: float, bodies: list[bytes], pid: int, worker_pid: int) -> dict[str, Any]:
    """A closed loop, one connection per body: requests/s, the proxy's CPU per request (its whole
    process tree) and where the CPU and the connections went (:func:`breakdown`)."""
    conns = [await connect(port, body) for body in bodies]
    counts = [0] * len(conns)
    end = 0.0

    async def user(i: int) -> None:
        while time.perf_counter() < end:
            await conns[i].roundtrip()
            counts[i] += 1

    end = time.perf_counter() + min(1.0, seconds / 3)  # warm-up
    async with trio.open_nursery() as nursery:
        for i in range(len(conns)):
            nursery.start_soon(user, i)
    pids = tree_pids(pid)
    owners = connection_owners(pids, port)  # every connection has been accepted by now
    counts = [0] * len(conns)
    cpu_before = {p: process_cpu(p) for p in [*pids, worker_pid]}
    self_before = os.times()
    start = time.perf_counter()
    end = start + seconds
    async with trio.open_nursery() as nursery:
        for i in range(len(conns)):
            nursery.start_soon(user, i)
    elapsed = time.perf_counter() - start
    self_after = os.times()
    cpu_after = {p: process_cpu(p) for p in cpu_before}
    cpu = {p: (cpu_after[p] or 0.0) - (cpu_before[p] or 0.0) for p in cpu_before}
    client_ports = [conn.stream.socket.getsockname()[1] for conn in conns]
    for conn in conns:
        await conn.stream.aclose()
    done = sum(counts)
    processes = []
    for p in pids:
        mine = [i for i, cport in enumerate(client_ports) if owners.get(cport) == p]
        processes.append(
            {
                "pid": p,
                "role": process_role(p),
                "cpu_share": cpu[p] / elapsed,
                "connections": len(mine),
                "requests": sum(counts[i] for i in mine),
            }
        )
    loadgen = (self_after.user + self_after.system - self_before.user - self_before.system) / elapsed
    return {
        "rps": done / elapsed,
        "cpu_s_per_request": sum(cpu[p] for p in pids) / max(1, done),
        "processes": processes,
        "worker_cpu_share": cpu[worker_pid] / elapsed,
        "loadgen_cpu_share": loadgen,
        "unattributed_connections": sum(1 for cport in client_ports if cport not in owners),
    }


def breakdown(run: dict[str, Any]) -> str:
    """One line: each proxy process's CPU share (1.0 = one core), connections and share of the
    requests, then the fake worker's and the load generator's CPU share."""
    total = max(1, sum(p["requests"] or 0 for p in run["processes"]))
    parts = []
    for p in run["processes"]:
        text = f"{p['role']} {p['cpu_share']:.2f} cpu"
        if p["connections"]:
            text += f" {p['connections']} conn"
            if p["requests"] is not None:  # wrk does not count per connection
                text += f" {p['requests'] / total:.0%} req"
        parts.append(text)
    parts.append(f"worker {run['worker_cpu_share']:.2f} cpu")
    parts.append(f"loadgen {run['loadgen_cpu_share']:.2f} cpu")
    if run["unattributed_connections"]:
        parts.append(f"{run['unattributed_connections']} conn unattributed")
    return " | ".join(parts)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ----------------------------------------------------------------------------- processes
def supports_processes() -> bool:
    """Whether this agentd has ``[server] data_plane_processes`` (docs/operations.md §13)."""
    from daemon.config import ServerConfig

    return any(field.name == "data_plane_processes" for field in ServerConfig.__attrs_attrs__)


def supports_http1() -> bool:
    """Whether this agentd has ``[server] http1_implementation`` (docs/config.md)."""
    from daemon.config import ServerConfig

    return any(field.name == "http1_implementation" for field in ServerConfig.__attrs_attrs__)


def agentd_command(port: int, worker_port: int, policy: str, program: bool, config: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "daemon", "start", "--port", str(port), "--log-level", "warning"]
    cmd += ["--worker-urls", f"http://127.0.0.1:{worker_port}", "--policy", policy]
    if config is not None:
        cmd += ["--config", str(config)]
    if program:
        cmd += ["--enable-program-scheduling", "--program-scheduling-config-json", json.dumps(PROGRAM_CONFIG)]
    return cmd


def router_command(router: str, port: int, worker_port: int, policy: str, program: bool, log_dir: str) -> list[str]:
    cmd = [router, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--worker-urls", f"http://127.0.0.1:{worker_port}", "--policy", policy]
    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    cmd += ["--log-level", "warning", "--log-dir", log_dir]
    if program:
        cmd += ["--enable-program-scheduling", "--program-scheduling-config-json", json.dumps(PROGRAM_CONFIG)]
    return cmd


def wait_serving(port: int, proc: subprocess.Popen[bytes], what: str, body: bytes) -> None:
    """Listening, then one request answered 200 (a router may listen before its workers are up)."""
    wait_listening(port, proc, what)
    deadline = time.monotonic() + 60
    while True:
        try:
            run_interruptible(partial(_one_request, port, body))
            return
        except (OSError, SystemExit, ConnectionError) as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} does not answer requests: {exc}") from None
            time.sleep(0.2)


def wait_relays(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    """With relay processes, until every relay accepts connections (the public port listens from
    the moment the scheduler process binds it, relays boot after that: a cell measured before the
    last one accepts would run on fewer processes)."""
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/scheduling/diagnostics", timeout=30) as response:
            plane = json.load(response).get("data_plane")
        relays = [] if plane is None else plane["relays"]
        if all(relay.get("accepting", relay["alive"]) for relay in relays):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what}: not every relay process accepts connections: {relays}")
        time.sleep(0.2)


async def _one_request(port: int, body: bytes) -> None:
    conn = await connect(port, body)
    try:
        await conn.roundtrip()
    finally:
        await conn.stream.aclose()


# ----------------------------------------------------------------------------- main
def _modes(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in IDENTITY_MODES]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"--identity: comma-separated from {', '.join(IDENTITY_MODES)}, got {text!r}")
    return values


HTTP1_LABELS = {"agentd": "h1", "hypercorn": "h11", None: ""}


def _http1(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in ("agentd", "hypercorn")]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"--http1: comma-separated from agentd, hypercorn, got {text!r}")
    return values


def measure_native(
    name: str,
    port: int,
    pid: int,
    worker_pid: int,
    native: NativeHarness,
    concurrency: int,
    prefix: str,
    count: int,
) -> dict[str, Any]:
    """:func:`measure` with wrk as the load generator (``--harness native``, bench/wrk.py)."""
    seconds, workdir = native.seconds, native.workdir
    wrk_run(native.wrk, port, 1, 1, prefix, count, workdir)  # warm-up
    c1 = wrk_run(native.wrk, port, seconds, 1, prefix, count, workdir)
    wrk_run(native.wrk, port, 1, concurrency, prefix, count, workdir)
    cn = wrk_run(native.wrk, port, seconds, concurrency, prefix, count, workdir, watch=(pid, worker_pid))
    done, duration = cn["requests"], cn["duration_s"]
    processes = [
        {
            "pid": p,
            "role": process_role(p),
            "cpu_share": cn["cpu"][p] / duration,
            "connections": cn["connections"][p],
            "requests": None,
        }
        for p in cn["pids"]
    ]
    run = {
        "rps": done / duration,
        "cpu_s_per_request": sum(cn["cpu"][p] for p in cn["pids"]) / max(1, done),
        "processes": processes,
        "worker_cpu_share": cn["worker_cpu_share"],
        "loadgen_cpu_share": cn["loadgen_cpu_share"],
        "unattributed_connections": cn["unattributed_connections"],
    }
    return _cell(name, concurrency, c1["requests"], c1["p50_us"] / 1000, c1["p99_us"] / 1000, c1["mean_us"] / 1000, run)


def measure(
    name: str,
    port: int,
    pid: int,
    worker_pid: int,
    seconds: float,
    concurrency: int,
    body1: bytes,
    bodies: list[bytes],
) -> dict[str, Any]:
    samples = run_interruptible(partial(latency_run, port, seconds, body1))
    run = run_interruptible(partial(throughput_run, port, seconds, bodies, pid, worker_pid))
    return _cell(
        name,
        concurrency,
        len(samples),
        percentile(samples, 0.50) * 1000,
        percentile(samples, 0.99) * 1000,
        statistics.fmean(samples) * 1000,
        run,
    )


def _cell(
    name: str, concurrency: int, c1_requests: int, p50_ms: float, p99_ms: float, mean_ms: float, run: dict[str, Any]
) -> dict[str, Any]:
    rps, cpu_s = run["rps"], run["cpu_s_per_request"]
    result: dict[str, Any] = {
        "c1_requests": c1_requests,
        "c1_p50_ms": p50_ms,
        "c1_p99_ms": p99_ms,
        "c1_mean_ms": mean_ms,
        f"c{concurrency}_rps": rps,
        "cpu_us_per_request": cpu_s * 1e6,
        f"c{concurrency}_processes": run["processes"],
        f"c{concurrency}_worker_cpu_share": run["worker_cpu_share"],
        f"c{concurrency}_loadgen_cpu_share": run["loadgen_cpu_share"],
        f"c{concurrency}_unattributed_connections": run["unattributed_connections"],
    }
    print(
        f"  {name:14} c=1 p50 {result['c1_p50_ms']:7.3f} ms  p99 {result['c1_p99_ms']:7.3f} ms   "
        f"c={concurrency} {rps:7.0f} req/s   CPU {result['cpu_us_per_request']:6.0f} us/req",
        flush=True,
    )
    print(f"  {'':14} c={concurrency} " + breakdown(run), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement time per cell (default 3)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--policy", default="round_robin")
    parser.add_argument("--bodies", type=positive_int_list, default=[1, 64, 256], help="body sizes in KiB")
    parser.add_argument("--identity", type=_modes, default=list(IDENTITY_MODES), help="free,program")
    parser.add_argument(
        "--processes",
        type=positive_int_list,
        default=[1],
        help="agentd data_plane_processes, one agentd column per value (e.g. 1,2)",
    )
    parser.add_argument(
        "--http1",
        type=_http1,
        help="agentd's [server] http1_implementation, one agentd column per value (e.g. agentd,hypercorn)",
    )
    parser.add_argument("--vllm-router", help="the vllm-router executable (default: vllm-router on PATH)")
    parser.add_argument("--no-router", action="store_true", help="skip vllm-router even when installed")
    parser.add_argument("--naive", action="store_true", help="add the naive hypercorn+httpx proxy row")
    parser.add_argument("--no-naive", action="store_true", help=argparse.SUPPRESS)  # the default now
    parser.add_argument(
        "--harness",
        choices=HARNESSES,
        default="python",
        help="load generator and fake worker: python (Trio, the default) or native (wrk and nginx, which"
        f" leave the cores to the proxy; {INSTALL_HINT}; whole seconds per run)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--serve-worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-naive-proxy", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker is not None:
        serve_worker(args.serve_worker)
        return 0
    if args.serve_naive_proxy is not None:
        serve_naive_proxy(*args.serve_naive_proxy)
        return 0
    if args.processes != [1] and not supports_processes():
        print(
            "--processes: this agentd has no [server] data_plane_processes setting (one process only);"
            " run with --processes 1",
            file=sys.stderr,
        )
        return 2
    if args.http1 and not supports_http1():
        print("--http1: this agentd has no [server] http1_implementation setting", file=sys.stderr)
        return 2
    native_tools = tools()
    if args.harness == "native" and native_tools is None:
        print(f"--harness native: needs wrk and nginx on PATH ({INSTALL_HINT})", file=sys.stderr)
        return 2
    if args.harness == "native" and args.naive:
        print("--naive: only with --harness python", file=sys.stderr)
        return 2
    router = None if args.no_router else find_vllm_router(args.vllm_router)
    if args.vllm_router and router is None:
        print(f"--vllm-router: {args.vllm_router} is not an executable file", file=sys.stderr)
        return 2

    probe_us = python_speed_probe_us()
    uptime = os.getloadavg()
    print(
        f"proxy overhead: {args.seconds:g} s per cell, c=1 and c={args.concurrency}, bodies {args.bodies} KiB,"
        f" identity {args.identity}, agentd processes {args.processes},"
        f" vllm-router {router or 'absent (skipped)'}, harness {args.harness};"
        f" load {uptime[0]:.2f}, speed probe {probe_us:.1f} us",
        flush=True,
    )
    # one agentd column per (processes, HTTP/1.1 protocol): "agentd", "agentd N=2", "agentd h11 N=2"...
    columns: list[tuple[str, int, str | None]] = []
    for n in args.processes:
        for impl in args.http1 or [None]:
            name = "agentd"
            if args.http1 and len(args.http1) > 1:
                name += f" {HTTP1_LABELS[impl]}"
            if args.processes != [1]:
                name += f" N={n}"
            columns.append((name, n, impl))
    systems = [name for name, _, _ in columns]
    if router is not None:
        systems.append("vllm-router")
    results: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}  # mode -> kb -> system -> cell
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="proxy-overhead-") as tmp:
        try:
            worker_port = free_port()
            native = None
            if args.harness == "native":
                assert native_tools is not None
                wrk, nginx = native_tools
                native = NativeHarness(wrk, max(1, round(args.seconds)), Path(tmp) / "wrk")
                native.workdir.mkdir()
                worker = start_worker(nginx, worker_port, Path(tmp) / "nginx", REPLY, MODELS, WORKER_METRICS)
            else:
                worker = spawn_module(MODULE, "--serve-worker", str(worker_port))
            procs.append(worker)
            wait_listening(worker_port, worker, "fake worker")
            for mode in args.identity:
                program = mode == "program"
                bodies = {
                    kb: [agent_body(kb, program_context(user) if program else None) for user in range(args.concurrency)]
                    for kb in args.bodies
                }
                print(f"identity {mode}: starting " + ", ".join(systems), flush=True)
                ports: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
                logs: dict[str, Path] = {}
                for system, n, impl in columns:
                    config = None
                    if supports_processes():
                        config = Path(tmp) / f"agentd-{n}-{impl}.toml"
                        text = f"[server]\ndata_plane_processes = {n}\n"
                        if impl is not None:
                            text += f'http1_implementation = "{impl}"\n'
                        config.write_text(text)
                    port = free_port()
                    # the child's logs (its start-up warnings included) go to a file of the run,
                    # named when it fails: on the bench's stderr they read as the bench's own
                    log = Path(tmp) / f"agentd-{mode}-{n}-{impl}.log"
                    with log.open("wb") as sink:
                        proc = subprocess.Popen(
                            agentd_command(port, worker_port, args.policy, program, config),
                            cwd=ROOT,
                            stdout=subprocess.DEVNULL,
                            stderr=sink,
                            env=daemon_env(),
                        )
                    procs.append(proc)
                    ports[system] = (port, proc)
                    logs[system] = log
                if router is not None:
                    port = free_port()
                    log_dir = tempfile.mkdtemp(dir=tmp)
                    cmd = router_command(router, port, worker_port, args.policy, program, log_dir)
                    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    procs.append(proc)
                    ports["vllm-router"] = (port, proc)
                first = bodies[args.bodies[0]][0]
                for system, (port, proc) in ports.items():
                    what = system if system not in logs else f"{system} (log {logs[system]})"
                    wait_serving(port, proc, what, first)
                    if system.startswith("agentd") and not system.endswith(("N=1", "agentd")):
                        wait_relays(port, proc, what)
                naive = None
                if args.naive and mode == "free":
                    naive_port = free_port()
                    naive = spawn_module(
                        MODULE, "--serve-naive-proxy", str(naive_port), str(worker_port), stderr=subprocess.DEVNULL
                    )
                    procs.append(naive)
                    wait_listening(naive_port, naive, "naive proxy")
                    ports["naive"] = (naive_port, naive)
                results[mode] = {}
                for kb in args.bodies:
                    print(f"identity {mode}, body {kb} KiB ({len(bodies[kb][0]):,} bytes):", flush=True)
                    if native is not None:
                        prefix = write_bodies(native.workdir, f"{mode}-{kb}", bodies[kb])
                        measure_cell: Callable[[str, int, int, int], dict[str, Any]] = partial(
                            measure_native,
                            native=native,
                            concurrency=args.concurrency,
                            prefix=prefix,
                            count=len(bodies[kb]),
                        )
                    else:
                        measure_cell = partial(
                            measure,
                            seconds=args.seconds,
                            concurrency=args.concurrency,
                            body1=bodies[kb][0],
                            bodies=bodies[kb],
                        )
                    cells = {"direct": measure_cell("direct", worker_port, worker.pid, worker.pid)}
                    for system, (port, proc) in ports.items():
                        cells[system] = measure_cell(system, port, proc.pid, worker.pid)
                    for system, cell in cells.items():
                        if system != "direct":
                            cell["added_p50_ms"] = cell["c1_p50_ms"] - cells["direct"]["c1_p50_ms"]
                            cell["added_p99_ms"] = cell["c1_p99_ms"] - cells["direct"]["c1_p99_ms"]
                    results[mode][str(kb)] = cells
                for _, proc in ports.values():
                    procs.remove(proc)
                stop_all([proc for _, proc in ports.values()])
        finally:
            stop_all(procs)
    load_end = os.getloadavg()[0]
    report(results, args, systems, router is not None, probe_us, uptime[0], load_end)
    if args.json is not None:
        write_atomic(
            args.json,
            json.dumps(
                {
                    "results": results,
                    "cpus": os.cpu_count(),
                    "load_average_start": uptime[0],
                    "load_average_end": load_end,
                    "python_speed_probe_us": probe_us,
                    "seconds": args.seconds,
                    "concurrency": args.concurrency,
                    "policy": args.policy,
                    "processes": args.processes,
                    "vllm_router": router,
                    "harness": args.harness,
                },
                indent=2,
            ),
        )
    return 0


def report(
    results: dict[str, dict[str, dict[str, dict[str, Any]]]],
    args: argparse.Namespace,
    systems: list[str],
    has_router: bool,
    probe_us: float,
    load_start: float,
    load_end: float,
) -> None:
    c = args.concurrency
    print()
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load_start:.2f} at the start, {load_end:.2f} at the end;"
        f" speed probe {probe_us:.1f} us (about 8-10 us idle); {args.seconds:g} s per cell; policy {args.policy};"
        f" harness {args.harness}"
    )
    header = (
        f"{'identity':8} {'body':>6} {'system':14} {'added p50':>10} {'added p99':>10} "
        f"{f'c={c} req/s':>11} {'CPU us/req':>10}"
    )
    if has_router:
        header += f" {'p50 vs vr':>9} {'req/s vs vr':>11} {'CPU vs vr':>9}"
    print(header)
    for mode, by_kb in results.items():
        for kb, cells in by_kb.items():
            vr = cells.get("vllm-router")
            for system, cell in cells.items():
                added = "" if system == "direct" else f"{cell['added_p50_ms']:+9.3f}m {cell['added_p99_ms']:+9.3f}m"
                line = (
                    f"{mode:8} {kb + ' KB':>6} {system:14} {added or '':>21} "
                    f"{cell[f'c{c}_rps']:11.0f} {cell['cpu_us_per_request']:10.0f}"
                )
                if vr is not None and system.startswith("agentd"):
                    line += (
                        f" {_ratio(cell['added_p50_ms'], vr['added_p50_ms']):>9}"
                        f" {_ratio(cell[f'c{c}_rps'], vr[f'c{c}_rps']):>11}"
                        f" {_ratio(cell['cpu_us_per_request'], vr['cpu_us_per_request']):>9}"
                    )
                print(line)
    print("(added = c=1 latency minus the direct path with the same bodies; CPU = the proxy's process tree,")
    print(" the worker's for 'direct'; 'vs vr' = agentd / vllm-router in this run)")
    print(f"where the CPU went at c={c} (1.00 = one core; each proxy process: CPU, connections, share of requests):")
    for mode, by_kb in results.items():
        for kb, cells in by_kb.items():
            for system, cell in cells.items():
                if system != "direct" and f"c{c}_processes" in cell:
                    run = {
                        "processes": cell[f"c{c}_processes"],
                        "worker_cpu_share": cell[f"c{c}_worker_cpu_share"],
                        "loadgen_cpu_share": cell[f"c{c}_loadgen_cpu_share"],
                        "unattributed_connections": cell[f"c{c}_unattributed_connections"],
                    }
                    print(f"  {mode:8} {kb + ' KB':>6} {system:14} {breakdown(run)}")
    for mode, by_kb in results.items():
        kbs = list(by_kb)
        if len(kbs) < 2:
            continue
        small, large = kbs[0], kbs[-1]
        for system in systems:
            a, b = by_kb[small][system]["added_p50_ms"], by_kb[large][system]["added_p50_ms"]
            print(f"{mode}: {system} added p50 {large} KB / {small} KB = {_ratio(b, a)} (bar for agentd: <= 2x)")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.proxy_overhead"))
