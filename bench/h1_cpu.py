"""CPU per request of the HTTP/1.1 protocol alone: agentd's (daemon/http/h1proto.py) against
hypercorn's h11-based one (docs/benchmarks.md §10.2.3).

Usage (from the repository root)::

    python -m bench.h1_cpu [--requests 4000] [--connections 8] [--rounds 3] [--kb 1]

One process serves a tiny ASGI app through ``daemon.http.serve.serve_http`` (agentd's accept
loop, the limits and drain of docs/operations.md §10) with each ``[server] http1_implementation``
in turn, and raw keep-alive socket clients in the same process send ``--requests`` POSTs of a
``--kb`` KiB JSON body spread over ``--connections`` connections.  The app reads the body and
answers a fixed JSON body the way agentd's proxy does for a complete response: on agentd's
protocol through its scope extensions (the body taken at once, the disconnect watched by the
connection, head and body written by ``respond``: docs/operations.md §13.8), on hypercorn's with
the head held back by ``HOLD_WRITE`` so it leaves with the body and a sibling task waiting for
``http.disconnect``.
Reported: process CPU (server and clients together; the clients' share is the same for both) per
request, per round, the rounds alternating between the two protocols, and the difference of the
medians, which is what the protocol saves per request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from typing import Any

import trio

from bench.interrupt import run_interruptible, run_main
from daemon.http.h1proto import DISCONNECT_WATCH, RESPOND, TAKE_BODY
from daemon.http.hypercorn_close import HOLD_WRITE
from daemon.http.serve import serve_http

REPLY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
    }
).encode()
IMPLEMENTATIONS = ("agentd", "hypercorn")


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    extensions = scope.get("extensions") or {}
    if RESPOND in extensions:  # agentd's protocol: what the proxy route does (docs/operations.md §13.8)
        body = extensions[TAKE_BODY]()
        if body is None:
            body = await _read(receive)
            if body is None:
                return
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(REPLY))]
        with trio.CancelScope() as request_scope:
            unwatch = extensions[DISCONNECT_WATCH](request_scope.cancel)
            try:
                await extensions[RESPOND](200, headers, REPLY)
            finally:
                unwatch()
        return
    if await _read(receive) is None:
        return

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(REPLY))]
        token = HOLD_WRITE.set(True)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        finally:
            HOLD_WRITE.reset(token)
        await send({"type": "http.response.body", "body": REPLY})
        nursery.cancel_scope.cancel()


async def _read(receive: Any) -> bytes | None:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


def request_bytes(kb: int) -> bytes:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (kb * 1024 - 60)}]}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


async def client(port: int, count: int, request: bytes) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    buf = b""
    async with stream:
        for _ in range(count):
            await stream.send_all(request)
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    length = int(buf[:end].lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    if len(buf) >= end + 4 + length:
                        assert buf.startswith(b"HTTP/1.1 200"), buf[:80]
                        buf = buf[end + 4 + length :]
                        break
                data = await stream.receive_some(65536)
                if not data:
                    raise SystemExit("the server closed the connection")
                buf += data


async def one_round(impl: str, requests: int, connections: int, request: bytes) -> float:
    """Process CPU seconds per request for one protocol."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(partial(serve_http, http1=impl), app, "127.0.0.1", 0, 1.0, stop.wait)
        port = int(url.rsplit(":", 1)[1])
        async with trio.open_nursery() as warm:  # connections open, first requests served
            for _ in range(connections):
                warm.start_soon(client, port, 20, request)
        before = time.process_time()
        async with trio.open_nursery() as load:
            for _ in range(connections):
                load.start_soon(client, port, requests // connections, request)
        cpu = time.process_time() - before
        stop.set()
    return cpu / (requests // connections * connections)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.h1_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kb", type=int, default=1, help="request body size in KiB")
    args = parser.parse_args()
    for name in ("requests", "connections", "rounds", "kb"):
        if getattr(args, name) < 1:
            print(f"--{name}: must be >= 1", file=sys.stderr)
            return 2
    request = request_bytes(args.kb)
    results: dict[str, list[float]] = {impl: [] for impl in IMPLEMENTATIONS}
    for _ in range(args.rounds):
        for impl in IMPLEMENTATIONS:
            results[impl].append(
                run_interruptible(partial(one_round, impl, args.requests, args.connections, request)) * 1e6
            )
    for impl in IMPLEMENTATIONS:
        rounds = " ".join(f"{v:.0f}" for v in results[impl])
        median = statistics.median(results[impl])
        print(f"{impl:9} CPU per request (server + clients): median {median:.0f} us  [{rounds}]")
    saved = statistics.median(results["hypercorn"]) - statistics.median(results["agentd"])
    print(f"agentd's protocol saves {saved:.0f} us of CPU per request ({len(request)} byte requests)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.h1_cpu"))
