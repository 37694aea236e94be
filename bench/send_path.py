"""CPU per streamed body chunk: hypercorn's ASGI send path against the direct chunk writer
(docs/benchmarks.md §10.1).

Usage (from the repository root)::

    python -m bench.send_path [--chunks 20000] [--rounds 3]

One process serves a tiny ASGI app with agentd's own HTTP server (``daemon.http.serve``:
hypercorn's HTTP/1.1 protocol under agentd's accept loop) and a raw-socket client reads one
streamed response of ``--chunks`` SSE events (the size of a vLLM token event) per round.  The app
writes each event either as an ASGI ``http.response.body`` message (hypercorn -> h11 -> the
socket) or with :class:`daemon.http.direct_body.DirectBody` (the frame written to the socket).
Reported: process CPU (server and client together, the client's share is the same in both) per
chunk for each path and the difference, which is what the direct path saves per relayed token.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from bench import harness
from bench.interrupt import run_interruptible, run_main
from bench.output import write_atomic
from daemon.commands.paths import output_file_problem
from daemon.http.direct_body import attach
from daemon.http.serve import serve_http

EVENT = (
    b'data: {"id":"chatcmpl-relay","object":"chat.completion.chunk","created":0,"model":"fake-model",'
    b'"choices":[{"index":0,"delta":{"content":" t1234567890123456789"},"logprobs":null,"finish_reason":null}]}\n\n'
)


def make_app(chunks: int) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        direct_mode = scope["path"] == "/direct"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        direct = attach(send) if direct_mode else None
        if direct_mode and direct is None:
            raise RuntimeError("the direct body writer did not attach")
        for _ in range(chunks):
            if direct is not None:
                await direct.write(EVENT)
            else:
                await send({"type": "http.response.body", "body": EVENT, "more_body": True})
            await trio.lowlevel.checkpoint()  # a relay task yields between two tokens
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def fetch(port: int, path: str) -> int:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        total = 0
        tail = b""
        while True:
            data = await stream.receive_some(1 << 20)
            if not data:
                break
            total += len(data)
            tail = (tail + data)[-5:]
            if tail == b"0\r\n\r\n":
                break
        return total


async def run(chunks: int, rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"asgi": [], "direct": []}
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_http, make_app(chunks), "127.0.0.1", 0, 1.0, stop.wait)
        port = int(url.rsplit(":", 1)[1])
        await fetch(port, "/asgi")  # warm-up
        await fetch(port, "/direct")
        for _ in range(rounds):
            for mode in ("asgi", "direct"):
                cpu0 = time.process_time()
                await fetch(port, "/" + mode)
                results[mode].append((time.process_time() - cpu0) / chunks * 1e6)
        stop.set()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.send_path", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for name in ("chunks", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    problem = output_file_problem(str(args.json), "--json") if args.json else None
    if problem:
        parser.error(problem)
    probe = harness.python_speed_probe_us()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    results = run_interruptible(lambda: run(args.chunks, args.rounds))
    asgi, direct = min(results["asgi"]), min(results["direct"])
    print(f"python speed probe: {probe:.1f} us; {uptime}")
    print(
        f"CPU per body chunk (server + client, best of {args.rounds}): ASGI -> hypercorn -> h11 {asgi:.1f} us, "
        f"direct {direct:.1f} us: {asgi - direct:.1f} us saved per chunk"
    )
    if args.json is not None:
        out = {"asgi_us": results["asgi"], "direct_us": results["direct"], "probe_us": probe, "uptime": uptime}
        write_atomic(args.json, json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.send_path"))
