"""Streaming relay cost: CPU per relayed token, side by side with vllm-router (docs/benchmarks.md §10.1).

Usage (from the repository root)::

    python -m bench.relay_cpu [--quick] [--vllm-router PATH] [--stream-coalesce-ms 50 ...]
        [--mode both|closed|lockstep] [--seconds 5] [--streams 32] [--interval-ms 20] [--events 200]
        [--lockstep-streams 64,128,256] [--itl-ms 25] [--lockstep-events 60] [--json OUT] [--markdown OUT]

Every token is one SSE event, as vLLM streams.  Two loads, each through every system in turn in
front of the same fake worker (raw Trio sockets, HTTP/1.1 keep-alive, chunked SSE), in one run:

* **closed** (the issue-15 load): ``--streams`` closed-loop clients; each response is ``--events``
  token events, one every ``--interval-ms`` per stream on its own timer (events of different
  streams rarely coincide: the worst case, one upstream read and one downstream write per token);
* **lockstep** (a decoding engine): per ``--lockstep-streams`` value, that many closed-loop
  clients; the worker emits one event for every open stream at each decode step, every
  ``--itl-ms``, ``--lockstep-events`` steps per response.

Systems: ``direct`` (clients talk to the worker: the baseline of every "added" figure), ``agentd``
(``agentd start``, native round robin), ``agentd+cW`` per ``--stream-coalesce-ms`` W > 0 (the same
with ``[server] stream_coalesce_ms = W``) and ``vllm-router`` (``--policy round_robin``, when
``--vllm-router`` or ``vllm-router`` on PATH is found).

Reported per system and load: tokens relayed per second, the proxy's CPU (user + system, every
thread) per relayed token, and from per-token stamps (the worker writes its send time, and the
request's arrival time in the first event; the clock is CLOCK_MONOTONIC, shared by the processes):
added TTFT (first token received - request sent, minus the worker's own arrival-to-first-token),
token delay (received - sent by the worker) p50/p99, inter-token gap at the client p50/p99,
last-token delay p50/max and time to last byte p50.  "Added" figures subtract ``direct``'s.  For
lockstep loads, tokens/s delivered against the offered rate (streams x 1000 / ITL) and the one-core
ceiling 1e6 / (CPU us per token).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bench import harness
from bench.interrupt import run_interruptible, run_main
from bench.output import write_atomic
from daemon.commands.argtypes import positive_int_list
from daemon.commands.paths import output_file_problem

MODULE = "bench.relay_cpu"  # re-run as the fake worker
BODY = b'{"model":"fake-model","messages":[{"role":"user","content":"Say hi."}],"max_tokens":200,"stream":true}'
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
USAGE = (
    b'data: {"id":"chatcmpl-relay","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}\n\n'
)
TAIL = USAGE + b"data: [DONE]\n\n"
# a token event's content: " t<send ns>" (the first also " a<arrival ns>": when the request arrived)
STAMP = re.compile(rb' t(\d+)(?: a(\d+))?"')


def _event(now_ns: int, arrival_ns: int | None, final: bool) -> bytes:
    content = f" t{now_ns}" if arrival_ns is None else f" t{now_ns} a{arrival_ns}"
    reason = '"stop"' if final else "null"
    return (
        b'data: {"id":"chatcmpl-relay","object":"chat.completion.chunk","created":0,"model":"fake-model",'
        b'"choices":[{"index":0,"delta":{"content":"'
        + content.encode()
        + b'"},"logprobs":null,"finish_reason":'
        + reason.encode()
        + b"}]}\n\n"
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _response_piece(i: int, events: int, arrival_ns: int) -> bytes:
    """Token event ``i`` of ``events`` framed as one chunk (the last one with the tail and the end)."""
    now = time.monotonic_ns()
    event = _event(now, arrival_ns if i == 0 else None, i == events - 1)
    if i < events - 1:
        return _chunk(event)
    return _chunk(event) + _chunk(TAIL) + b"0\r\n\r\n"


# ---------------------------------------------------------------------------------------------
# Fake workers
# ---------------------------------------------------------------------------------------------


async def _closed_conn(stream: trio.SocketStream, events: int, interval: float) -> None:
    """One stream per connection, one event every ``interval`` seconds on its own timer."""
    buf = bytearray()
    try:
        while (head := await harness.read_request(stream, buf)) is not None:
            if harness.request_path(head) == b"/health":
                await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                continue
            arrival = time.monotonic_ns()
            await stream.send_all(HEAD)
            for i in range(events):
                await trio.sleep(interval)
                await stream.send_all(_response_piece(i, events, arrival))
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        return


class _LockstepStream:
    __slots__ = ("fd", "arrival", "sent", "out", "flushing", "done", "wake", "broken")

    def __init__(self, fd: int, arrival: int) -> None:
        self.fd = fd
        self.arrival = arrival
        self.sent = 0
        self.out = bytearray()  # bytes the socket did not take at once (the connection's task writes them)
        self.flushing = False
        self.done = False
        self.broken = False
        self.wake = trio.Event()


class LockstepEngine:
    """A decode loop: every ``itl`` seconds one event for every open stream (one pass, no task hop
    per stream: the worker's own cost stays small next to the proxy's)."""

    def __init__(self, itl: float, events: int) -> None:
        self.itl = itl
        self.events = events
        self.streams: list[_LockstepStream] = []

    async def run(self) -> None:
        tick = trio.current_time()
        while True:
            tick += self.itl
            await trio.sleep_until(tick)
            keep = []
            for s in self.streams:
                self._push(s, _response_piece(s.sent, self.events, s.arrival))
                s.sent += 1
                if s.sent >= self.events or s.broken:
                    s.done = True
                    s.wake.set()
                else:
                    keep.append(s)
            self.streams = keep

    @staticmethod
    def _push(s: _LockstepStream, data: bytes) -> None:
        if s.broken:
            return
        if s.out or s.flushing:
            s.out += data
            return
        try:
            n = os.write(s.fd, data)
        except BlockingIOError:
            n = 0
        except OSError:
            s.broken = True
            return
        if n < len(data):
            s.out += data[n:]
            s.wake.set()


async def _lockstep_conn(stream: trio.SocketStream, engine: LockstepEngine) -> None:
    buf = bytearray()
    try:
        while (head := await harness.read_request(stream, buf)) is not None:
            if harness.request_path(head) == b"/health":
                await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                continue
            s = _LockstepStream(stream.socket.fileno(), time.monotonic_ns())
            await stream.send_all(HEAD)
            engine.streams.append(s)
            while True:
                await s.wake.wait()
                s.wake = trio.Event()
                s.flushing = True
                while s.out:
                    data = bytes(s.out)
                    s.out.clear()
                    await stream.send_all(data)
                s.flushing = False
                if s.done:
                    break
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        return


def serve_worker(port: int, mode: str, events: int, interval: float) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if mode == "lockstep":
                engine = LockstepEngine(interval, events)
                nursery.start_soon(engine.run)
                handler: Any = lambda s: _lockstep_conn(s, engine)  # noqa: E731
            else:
                handler = lambda s: _closed_conn(s, events, interval)  # noqa: E731
            nursery.start_soon(partial(trio.serve_tcp, handler, port, host="127.0.0.1"))

    run_interruptible(main)


# ---------------------------------------------------------------------------------------------
# The load generator
# ---------------------------------------------------------------------------------------------


class Record:
    """Client-side observations of one system under one load (nanoseconds)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.responses = 0
        self.ttft_added: list[int] = []  # first token received - request sent - worker's own wait
        self.delay: list[int] = []  # token received - token sent by the worker
        self.gap: list[int] = []  # between two tokens of one stream, at the client
        self.last_delay: list[int] = []  # the last token's delay
        self.ttlb: list[int] = []  # request sent -> last byte


async def _stream_once(stream: trio.SocketStream, port: int, rec: Record | None) -> None:
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    sent = time.monotonic_ns()
    await stream.send_all(request)
    carry = b""
    tokens = 0
    first_recv = prev_recv = 0
    ttft_added = last_delay = 0
    delays: list[int] = []
    gaps: list[int] = []
    while True:
        more = await stream.receive_some(65536)
        now = time.monotonic_ns()
        if not more:
            raise ConnectionError("server closed the connection")
        data = carry + more
        cut = data.rfind(b"\n\n")
        if cut >= 0:
            for m in STAMP.finditer(data, 0, cut):
                stamp = int(m.group(1))
                if m.group(2) is not None:
                    first_recv = now
                    ttft_added = (now - sent) - (stamp - int(m.group(2)))
                elif prev_recv:
                    gaps.append(now - prev_recv)
                prev_recv = now
                last_delay = now - stamp
                delays.append(last_delay)
                tokens += 1
            carry = data[cut + 2 :]
        else:
            carry = data
        if data.endswith(b"0\r\n\r\n"):
            break
    if rec is not None and first_recv:
        rec.tokens += tokens
        rec.responses += 1
        rec.ttft_added.append(ttft_added)
        rec.delay.extend(delays)
        rec.gap.extend(gaps)
        rec.last_delay.append(last_delay)
        rec.ttlb.append(now - sent)


async def load(port: int, streams: int, seconds: float, rec: Record | None) -> float:
    """Run ``streams`` closed-loop streaming clients for ``seconds`` (each finishes its response)."""
    end = time.perf_counter() + seconds

    async def user() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            while time.perf_counter() < end:
                await _stream_once(stream, port, rec)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(user)
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Systems
# ---------------------------------------------------------------------------------------------


def start_agentd(
    port: int, worker_port: int, coalesce_ms: float, tmp: Path, processes: int = 1, root: Path | None = None
) -> subprocess.Popen[bytes]:
    """``agentd start`` from this repository, or from the checkout ``root`` (``--baseline``)."""
    args = ["start", "--port", str(port), "--log-level", "warning"]
    args += ["--worker-urls", f"http://127.0.0.1:{worker_port}", "--policy", "round_robin"]
    if coalesce_ms > 0 or processes != 1:
        config = tmp / f"agentd-c{coalesce_ms:g}-p{processes}.toml"
        config.write_text(f"[server]\nstream_coalesce_ms = {coalesce_ms!r}\ndata_plane_processes = {processes}\n")
        args += ["--config", str(config)]
    if root is None:
        return harness.spawn_module("daemon", *args, stdout=subprocess.DEVNULL, env=harness.daemon_env())
    # `python -m daemon` from ``root``: its own packages come first on sys.path
    return subprocess.Popen(
        [sys.executable, "-m", "daemon", *args], cwd=root, stdout=subprocess.DEVNULL, env=harness.daemon_env()
    )


def start_router(path: str, port: int, worker_port: int) -> subprocess.Popen[bytes]:
    args = [path, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin"]
    args += ["--worker-urls", f"http://127.0.0.1:{worker_port}", "--log-level", "warning"]
    args += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(harness.free_port())]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _pct(values: Sequence[int], q: float) -> float:
    """The q-quantile (nearest rank) in milliseconds; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] / 1e6


class Cell:
    """One system under one load, over every repetition (pooled)."""

    def __init__(self) -> None:
        self.rec = Record()
        self.cpu: float | None = 0.0
        self.elapsed = 0.0
        self.cpu_us_per_rep: list[float] = []


def measure(cell: Cell, port: int, pid: int | None, streams: int, seconds: float, warmup: float) -> None:
    """One repetition: warm-up, then ``seconds`` of load with the proxy's CPU read around it."""
    run_interruptible(partial(load, port, streams, warmup, None))
    tokens_before = cell.rec.tokens
    # the process and its children: agentd's relay processes with data_plane_processes > 1
    cpu0 = harness.tree_cpu_seconds(pid) if pid is not None else 0.0
    cell.elapsed += run_interruptible(partial(load, port, streams, seconds, cell.rec))
    if pid is None:
        cell.cpu = None
        return
    cpu = harness.tree_cpu_seconds(pid) - cpu0
    assert cell.cpu is not None
    cell.cpu += cpu
    cell.cpu_us_per_rep.append(cpu / max(cell.rec.tokens - tokens_before, 1) * 1e6)


def summarise(name: str, streams: int, cell: Cell) -> dict[str, Any]:
    rec, cpu, elapsed = cell.rec, cell.cpu, cell.elapsed
    tokens = max(rec.tokens, 1)
    return {
        "system": name,
        "streams": streams,
        "seconds": elapsed,
        "responses": rec.responses,
        "tokens": rec.tokens,
        "tokens_per_second": rec.tokens / elapsed,
        "cpu_seconds": cpu,
        "cpu_us_per_token": None if cpu is None else cpu / tokens * 1e6,
        "cpu_us_per_token_each_repeat": cell.cpu_us_per_rep,
        "cpu_share_of_one_core": None if cpu is None else cpu / elapsed,
        "ttft_ms_p50": _pct(rec.ttft_added, 0.5),
        "delay_ms_p50": _pct(rec.delay, 0.5),
        "delay_ms_p99": _pct(rec.delay, 0.99),
        "gap_ms_p50": _pct(rec.gap, 0.5),
        "gap_ms_p99": _pct(rec.gap, 0.99),
        "last_delay_ms_p50": _pct(rec.last_delay, 0.5),
        "last_delay_ms_max": _pct(rec.last_delay, 1.0),
        "ttlb_ms_p50": _pct(rec.ttlb, 0.5),
    }


def _added(rows: list[dict[str, Any]]) -> None:
    base = next((r for r in rows if r["system"] == "direct"), None)
    for r in rows:
        for key in ("ttft_ms_p50", "delay_ms_p50", "delay_ms_p99", "gap_ms_p50", "gap_ms_p99", "ttlb_ms_p50"):
            r[f"added_{key}"] = None if base is None else r[key] - base[key]


def run_load(
    mode: str,
    stream_counts: Sequence[int],
    events: int,
    interval_ms: float,
    coalesce: Sequence[float],
    router: str | None,
    seconds: float,
    warmup: float,
    tmp: Path,
    repeat: int = 1,
    processes: Sequence[int] = (),
    baseline: Path | None = None,
) -> list[dict[str, Any]]:
    worker_port = harness.free_port()
    worker = harness.spawn_module(
        MODULE, "--serve-worker", str(worker_port), "--worker-mode", mode,
        "--events", str(events), "--interval-ms", str(interval_ms),
    )  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = [worker]
    rows: list[dict[str, Any]] = []
    try:
        harness.wait_listening(worker_port, worker, "fake worker")
        systems: list[tuple[str, int, int | None]] = [("direct", worker_port, None)]
        for w in [0.0, *[c for c in coalesce if c > 0]]:
            # --baseline: the same rows from another checkout, each next to this one's
            for root, tag in [(None, ""), *([(baseline, "@base")] if baseline is not None else [])]:
                port = harness.free_port()
                proc = start_agentd(port, worker_port, w, tmp, root=root)
                procs.append(proc)
                harness.wait_listening(port, proc, "agentd")
                systems.append((("agentd" if w == 0 else f"agentd+c{w:g}") + tag, port, proc.pid))
        for n in [n for n in processes if n != 1]:  # relay processes (docs/operations.md §13)
            port = harness.free_port()
            proc = start_agentd(port, worker_port, 0.0, tmp, processes=n)
            procs.append(proc)
            harness.wait_listening(port, proc, "agentd")
            systems.append((f"agentd-p{n}", port, proc.pid))
        if router is not None:
            port = harness.free_port()
            proc = start_router(router, port, worker_port)
            procs.append(proc)
            harness.wait_listening(port, proc, "vllm-router")
            systems.append(("vllm-router", port, proc.pid))
        for streams in stream_counts:
            cells = {name: Cell() for name, _, _ in systems}
            for _ in range(repeat):  # round robin: every system sees the same machine load
                for name, port, pid in systems:
                    measure(cells[name], port, pid, streams, seconds, warmup)
                    last = cells[name].cpu_us_per_rep[-1:]
                    print(
                        f"  {mode:8} {streams:4} streams  {name:14} " + "".join(f"{x:6.1f} us CPU/token" for x in last),
                        flush=True,
                    )
            group = []
            for name, _, _ in systems:
                row = summarise(name, streams, cells[name])
                row.update(load=mode, interval_ms=interval_ms, events_per_response=events, repeat=repeat)
                group.append(row)
            _added(group)
            rows += group
    finally:
        harness.stop_all(procs)
    return rows


def _fmt(x: Any, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"relay_cpu, {result['date']}, load: {result['uptime']}, speed probe {result['python_speed_probe_us']:.1f} us",
        "",
        "| load | streams | system | tok/s | CPU us/token | x router | added TTFT p50 ms | added delay p50 / p99 ms "
        "| gap p50 / p99 ms | last-token delay p50 / max ms | added TTLB p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['load']} | {r['streams']} | {r['system']} | {r['tokens_per_second']:.0f} | "
            f"{_fmt(r['cpu_us_per_token'])} | {_fmt(r.get('x_router'), '.2f')} | "
            f"{_fmt(r['added_ttft_ms_p50'], '.2f')} | "
            f"{_fmt(r['added_delay_ms_p50'], '.2f')} / {_fmt(r['added_delay_ms_p99'], '.2f')} | "
            f"{_fmt(r['gap_ms_p50'], '.1f')} / {_fmt(r['gap_ms_p99'], '.1f')} | "
            f"{_fmt(r['last_delay_ms_p50'], '.2f')} / {_fmt(r['last_delay_ms_max'], '.2f')} | "
            f"{_fmt(r['added_ttlb_ms_p50'], '.1f')} |"
        )
    lockstep = [r for r in result["rows"] if r["load"] == "lockstep" and r["cpu_us_per_token"]]
    if lockstep:
        lines += ["", "| lockstep streams | system | offered tok/s | delivered tok/s | one-core ceiling tok/s |"]
        lines.append("| --- | --- | --- | --- | --- |")
        for r in lockstep:
            offered = r["streams"] * 1000 / r["interval_ms"]
            lines.append(
                f"| {r['streams']} | {r['system']} | {offered:.0f} | {r['tokens_per_second']:.0f} | "
                f"{1e6 / r['cpu_us_per_token']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_cpu", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="short cells (2 s, 0.5 s warm-up, 1 repeat; lockstep 64,128)"
    )
    parser.add_argument("--mode", choices=("both", "closed", "lockstep"), default="both")
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement time per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up time per cell")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="cells per system, round robin over the systems (pooled; noise of a loaded machine)",
    )
    parser.add_argument("--streams", type=int, default=32, help="closed load: concurrent streams")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="closed load: time between two tokens")
    parser.add_argument("--events", type=int, default=200, help="closed load: tokens per response")
    parser.add_argument("--lockstep-streams", type=positive_int_list, default=[64, 128, 256])
    parser.add_argument("--itl-ms", type=float, default=25.0, help="lockstep load: decode step")
    parser.add_argument("--lockstep-events", type=int, default=60, help="lockstep load: tokens per response")
    parser.add_argument(
        "--stream-coalesce-ms", type=float, nargs="*", default=[50.0],
        help="agentd rows with [server] stream_coalesce_ms = W (besides the plain one); 0 or none: plain only",
    )  # fmt: skip
    parser.add_argument(
        "--processes", type=positive_int_list, default=[1],
        help="agentd rows per [server] data_plane_processes N (e.g. 1,2; CPU summed over its processes)",
    )  # fmt: skip
    parser.add_argument("--vllm-router", default=shutil.which("vllm-router"), help="vllm-router executable")
    parser.add_argument(
        "--baseline", type=Path,
        help="another agentd checkout (e.g. the main branch's worktree): its rows (`@base`) run beside this one's",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the tables as markdown here")
    parser.add_argument("--serve-worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-mode", default="closed", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker is not None:
        serve_worker(args.serve_worker, args.worker_mode, args.events, args.interval_ms / 1000)
        return 0
    if args.quick:
        args.seconds, args.warmup, args.repeat = 2.0, 0.5, 1
        if args.lockstep_streams == [64, 128, 256]:
            args.lockstep_streams = [64, 128]
    for name in ("seconds", "interval_ms", "itl_ms"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("streams", "events", "lockstep_events", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        problem = output_file_problem(str(path), flag) if path is not None else None
        if problem:
            parser.error(problem)
    if any(not 0 <= c <= 1000 for c in args.stream_coalesce_ms):
        parser.error(f"--stream-coalesce-ms values must be in [0, 1000], got {args.stream_coalesce_ms}")
    if args.baseline is not None and not (args.baseline / "daemon" / "__main__.py").is_file():
        parser.error(f"--baseline: {args.baseline} is not an agentd checkout (no daemon/__main__.py)")
    router = args.vllm_router
    if router is not None and not os.access(router, os.X_OK):
        parser.error(f"--vllm-router: {router} is not an executable file")
    if router is None:
        print("vllm-router not found (--vllm-router PATH): its rows are skipped")

    probe_us = harness.python_speed_probe_us()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"python speed probe: sum(range(1000)) = {probe_us:.1f} us (about 8-10 us when the machine is idle)")
    print(uptime)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="relay-cpu-") as tmp:
        if args.mode in ("both", "closed"):
            rows += run_load(
                "closed", [args.streams], args.events, args.interval_ms, args.stream_coalesce_ms,
                router, args.seconds, args.warmup, Path(tmp), args.repeat, args.processes, args.baseline,
            )  # fmt: skip
        if args.mode in ("both", "lockstep"):
            rows += run_load(
                "lockstep", args.lockstep_streams, args.lockstep_events, args.itl_ms, args.stream_coalesce_ms,
                router, args.seconds, args.warmup, Path(tmp), args.repeat, args.processes, args.baseline,
            )  # fmt: skip
    for r in rows:
        same = [x for x in rows if x["load"] == r["load"] and x["streams"] == r["streams"]]
        ref = next((x for x in same if x["system"] == "vllm-router"), None)
        ok = ref is not None and ref["cpu_us_per_token"] and r["cpu_us_per_token"] is not None
        r["x_router"] = r["cpu_us_per_token"] / ref["cpu_us_per_token"] if ok else None  # type: ignore[index]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "uptime": uptime,
        "python_speed_probe_us": probe_us,
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    text = markdown(result)
    print()
    print(text)
    if args.json is not None:
        write_atomic(args.json, json.dumps(result, indent=2))
    if args.markdown is not None:
        write_atomic(args.markdown, text)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.relay_cpu"))
