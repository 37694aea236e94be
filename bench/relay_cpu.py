"""Streaming relay cost: agentd CPU per relayed SSE event (one event = one token, as vLLM streams).

Usage (from the repository root)::

    python -m bench.relay_cpu [--seconds 10] [--streams 32] [--interval-ms 20] [--events 200]

A fake worker (raw Trio sockets, HTTP/1.1 keep-alive, chunked SSE) answers every streaming chat
request with ``--events`` token events, one every ``--interval-ms`` per stream (a decode step),
then a usage event and ``data: [DONE]``.  ``--streams`` closed-loop clients keep that many streams
open through ``agentd start`` (native routing, round robin).  Reported: events relayed per second
and agentd's CPU (user + system) per relayed event, which bounds the tokens per second one daemon
core can relay.  The worker's own CPU per event is printed for scale.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import trio

from bench import harness
from bench.output import write_atomic

MODULE = "bench.relay_cpu"  # re-run as the fake worker
BODY = b'{"model":"fake-model","messages":[{"role":"user","content":"Say hi."}],"max_tokens":200,"stream":true}'


def _event(i: int) -> bytes:
    payload = json.dumps(
        {
            "id": "chatcmpl-relay",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "fake-model",
            "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "logprobs": None, "finish_reason": None}],
        }
    ).encode()
    return b"data: " + payload + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


USAGE = (
    b'data: {"id":"chatcmpl-relay","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}\n\n'
)


async def _worker_conn(stream: trio.SocketStream, events: int, interval: float) -> None:
    buf = bytearray()
    try:
        while (head := await harness.read_request(stream, buf)) is not None:
            if harness.request_path(head) == b"/health":
                await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                continue
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for i in range(events):
                await trio.sleep(interval)
                await stream.send_all(_chunk(_event(i)))
            await stream.send_all(_chunk(USAGE) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        return


def serve_worker(port: int, events: int, interval: float) -> None:
    async def main() -> None:
        await trio.serve_tcp(lambda s: _worker_conn(s, events, interval), port, host="127.0.0.1")

    trio.run(main)


async def _stream_once(stream: trio.SocketStream, port: int, buf: bytearray) -> int:
    await stream.send_all(
        (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(BODY)}\r\n\r\n"
        ).encode()
        + BODY
    )
    data = bytes(buf)
    while not data.endswith(b"0\r\n\r\n"):
        more = await stream.receive_some(65536)
        if not more:
            raise ConnectionError("server closed the connection")
        data += more
    buf.clear()
    return data.count(b"data: ")


async def load(port: int, streams: int, seconds: float) -> tuple[int, float]:
    """(SSE events received, elapsed seconds) of ``streams`` closed-loop streaming clients."""
    counts = [0] * streams
    end = time.perf_counter() + seconds

    async def user(i: int) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        buf = bytearray()
        async with stream:
            while time.perf_counter() < end:
                counts[i] += await _stream_once(stream, port, buf)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(streams):
            nursery.start_soon(user, i)
    return sum(counts), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement time (after 2 s of warm-up)")
    parser.add_argument("--streams", type=int, default=32, help="concurrent streams")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="time between two events of one stream")
    parser.add_argument("--events", type=int, default=200, help="token events per response")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--serve-worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker is not None:
        serve_worker(args.serve_worker, args.events, args.interval_ms / 1000)
        return 0
    for name in ("seconds", "interval_ms"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("streams", "events"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")

    probe_us = harness.python_speed_probe_us()
    worker_port, agentd_port = harness.free_port(), harness.free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        worker_args = ["--serve-worker", str(worker_port), "--events", str(args.events)]
        worker = harness.spawn_module(MODULE, *worker_args, "--interval-ms", str(args.interval_ms))
        procs.append(worker)
        harness.wait_listening(worker_port, worker, "fake worker")
        agentd = harness.start_agentd(agentd_port, worker_port, "round_robin")
        procs.append(agentd)
        harness.wait_listening(agentd_port, agentd, "agentd")
        trio.run(load, agentd_port, args.streams, 2.0)  # warm-up
        cpu0, wcpu0 = harness.cpu_seconds(agentd.pid), harness.cpu_seconds(worker.pid)
        events, elapsed = trio.run(load, agentd_port, args.streams, args.seconds)
        cpu, wcpu = harness.cpu_seconds(agentd.pid) - cpu0, harness.cpu_seconds(worker.pid) - wcpu0
    finally:
        harness.stop_all(procs)
    result = {
        "streams": args.streams,
        "interval_ms": args.interval_ms,
        "events_per_response": args.events,
        "seconds": elapsed,
        "events": events,
        "events_per_second": events / elapsed,
        "agentd_cpu_seconds": cpu,
        "agentd_cpu_us_per_event": cpu / events * 1e6,
        "agentd_cpu_share_of_one_core": cpu / elapsed,
        "worker_cpu_us_per_event": wcpu / events * 1e6,
        "python_speed_probe_us": probe_us,
    }
    print(f"python speed probe: sum(range(1000)) = {probe_us:.1f} us (about 8-10 us when the machine is idle)")
    print(
        f"{args.streams} streams, one event every {args.interval_ms:g} ms each, {args.events} events per "
        f"response: {events} events in {elapsed:.1f} s = {events / elapsed:.0f} events/s"
    )
    print(
        f"agentd CPU: {cpu:.2f} s = {cpu / events * 1e6:.1f} us per relayed event "
        f"({cpu / elapsed:.0%} of one core); fake worker: {wcpu / events * 1e6:.1f} us per event"
    )
    if args.json is not None:
        write_atomic(args.json, json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
