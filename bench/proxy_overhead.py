"""Proxy overhead benchmark: direct to a zero-delay worker vs through agentd.

Usage (from the repository root)::

    python -m bench.proxy_overhead [--seconds 5] [--concurrency 32] [--json out.json]

Three processes share the machine: a zero-delay fake worker (raw Trio sockets, HTTP/1.1
keep-alive, a fixed chat-completion body), ``agentd start --worker-urls <worker> --policy
round_robin`` and this load generator (raw keep-alive sockets, so the client costs little CPU).
Both paths are measured with the request the reference router's own overhead measurement uses::

    {"model":"fake-model","messages":[{"role":"user","content":"Say hi briefly."}],"max_tokens":8}

Reported: p50/p99 latency at concurrency 1 (and the difference = added latency), and requests/s
at concurrency ``--concurrency`` (closed loop, one connection per virtual user).  Targets from
issue 2 (docs/benchmarks.md section 2): added p50 <= 1.5 ms, >= 500 req/s at concurrency 32 on 2
cores.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

from bench.harness import (
    cpu_seconds,
    free_port,
    python_speed_probe_us,
    read_request,
    request_path,
    spawn_module,
    start_agentd,
    stop_all,
    wait_listening,
)
from bench.output import write_atomic

MODULE = "bench.proxy_overhead"  # re-run as the fake worker and the naive proxy
BODY = b'{"model":"fake-model","messages":[{"role":"user","content":"Say hi briefly."}],"max_tokens":8}'
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


# ----------------------------------------------------------------------------- fake worker
def _response(status: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: keep-alive\r\n\r\n"
    ).encode() + body


async def _worker_conn(stream: trio.SocketStream) -> None:
    buf = bytearray()
    try:
        while (head := await read_request(stream, buf)) is not None:
            if request_path(head) == b"/health":
                await stream.send_all(_response("200 OK", b"{}"))
            else:
                await stream.send_all(_response("200 OK", REPLY))
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        return


def serve_worker(port: int) -> None:
    async def main() -> None:
        await trio.serve_tcp(_worker_conn, port, host="127.0.0.1")

    trio.run(main)


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

    trio.run(main)


# ----------------------------------------------------------------------------- load generator
class Conn:
    def __init__(self, stream: trio.SocketStream, host_port: str, path: str) -> None:
        self.stream = stream
        self.request = (
            f"POST {path} HTTP/1.1\r\nhost: {host_port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
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
        return status


async def connect(port: int) -> Conn:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Conn(stream, f"127.0.0.1:{port}", "/v1/chat/completions")


async def latency_run(port: int, seconds: float) -> list[float]:
    conn = await connect(port)
    for _ in range(50):  # warm-up
        assert await conn.roundtrip() == 200
    samples: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        status = await conn.roundtrip()
        samples.append(time.perf_counter() - t0)
        assert status == 200, status
    await conn.stream.aclose()
    return samples


async def throughput_run(port: int, seconds: float, concurrency: int) -> float:
    conns = [await connect(port) for _ in range(concurrency)]
    counts = [0] * concurrency
    end = 0.0

    async def user(i: int) -> None:
        while time.perf_counter() < end:
            assert await conns[i].roundtrip() == 200
            counts[i] += 1

    end = time.perf_counter() + 1.0  # warm-up second
    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(user, i)
    counts = [0] * concurrency
    start = time.perf_counter()
    end = start + seconds
    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(user, i)
    elapsed = time.perf_counter() - start
    for conn in conns:
        await conn.stream.aclose()
    return sum(counts) / elapsed


async def throughput_with_cpu(port: int, seconds: float, concurrency: int, pid: int) -> tuple[float, float]:
    """(requests/s, CPU microseconds per request of process ``pid``) for one closed-loop run."""
    before = cpu_seconds(pid)
    counted: list[float] = []

    async def run() -> None:
        counted.append(await throughput_run(port, seconds, concurrency))

    await run()
    rps = counted[0]
    # throughput_run includes a one-second warm-up at the same rate
    requests = rps * (seconds + 1.0)
    return rps, (cpu_seconds(pid) - before) / requests * 1e6


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement time per cell")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--policy", default="round_robin")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive hypercorn+httpx proxy baseline row")
    parser.add_argument("--serve-worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-naive-proxy", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker is not None:
        serve_worker(args.serve_worker)
        return 0
    if args.serve_naive_proxy is not None:
        serve_naive_proxy(*args.serve_naive_proxy)
        return 0

    probe_us = python_speed_probe_us()
    worker_port, agentd_port, naive_port = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        worker = spawn_module(MODULE, "--serve-worker", str(worker_port))
        procs.append(worker)
        wait_listening(worker_port, worker, "fake worker")
        agentd = start_agentd(agentd_port, worker_port, args.policy)
        procs.append(agentd)
        wait_listening(agentd_port, agentd, "agentd")
        paths: list[tuple[str, int, int]] = [("direct", worker_port, worker.pid), ("agentd", agentd_port, agentd.pid)]
        if not args.no_naive:
            naive = spawn_module(
                MODULE, "--serve-naive-proxy", str(naive_port), str(worker_port), stderr=subprocess.DEVNULL
            )
            procs.append(naive)
            wait_listening(naive_port, naive, "naive proxy")
            paths.append(("naive", naive_port, naive.pid))

        results: dict[str, dict[str, float]] = {}
        for name, port, pid in paths:
            samples = trio.run(latency_run, port, args.seconds)
            rps, cpu_us = trio.run(throughput_with_cpu, port, args.seconds, args.concurrency, pid)
            results[name] = {
                "server_cpu_us_per_request": cpu_us,
                "c1_requests": len(samples),
                "c1_p50_ms": percentile(samples, 0.50) * 1000,
                "c1_p99_ms": percentile(samples, 0.99) * 1000,
                "c1_mean_ms": statistics.fmean(samples) * 1000,
                f"c{args.concurrency}_rps": rps,
            }
        added = {
            "added_p50_ms": results["agentd"]["c1_p50_ms"] - results["direct"]["c1_p50_ms"],
            "added_p99_ms": results["agentd"]["c1_p99_ms"] - results["direct"]["c1_p99_ms"],
        }
    finally:
        stop_all(procs)
    cpus = os.cpu_count()
    load = os.getloadavg()[0]
    print(
        f"machine: {cpus} CPUs, load average {load:.2f} at the end; {args.seconds:g} s per cell; policy {args.policy}"
    )
    print(f"python speed probe: sum(range(1000)) = {probe_us:.1f} us (about 8-10 us when the machine is idle)")
    print(
        f"{'path':8} {'c=1 p50 ms':>11} {'c=1 p99 ms':>11} {'c=1 mean ms':>12} "
        f"{f'c={args.concurrency} req/s':>13} {'server CPU us/req':>18}"
    )
    for name, r in results.items():
        print(
            f"{name:8} {r['c1_p50_ms']:11.3f} {r['c1_p99_ms']:11.3f} {r['c1_mean_ms']:12.3f} "
            f"{r[f'c{args.concurrency}_rps']:13.0f} {r['server_cpu_us_per_request']:18.0f}"
        )
    print(
        "(server CPU = the worker process for 'direct', the proxy process otherwise; 'naive' is the"
        " smallest hypercorn+httpx proxy, a floor for any Python proxy on this stack)"
    )
    print(f"added latency at c=1: p50 {added['added_p50_ms']:+.3f} ms, p99 {added['added_p99_ms']:+.3f} ms")
    ok = added["added_p50_ms"] <= 1.5 and results["agentd"][f"c{args.concurrency}_rps"] >= 500
    print(f"targets (added p50 <= 1.5 ms, >= 500 req/s at c={args.concurrency}): {'met' if ok else 'NOT met'}")
    if args.json is not None:
        write_atomic(
            args.json,
            json.dumps(
                {
                    "results": results,
                    **added,
                    "cpus": cpus,
                    "load_average": load,
                    "python_speed_probe_us": probe_us,
                    "seconds": args.seconds,
                    "policy": args.policy,
                },
                indent=2,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
