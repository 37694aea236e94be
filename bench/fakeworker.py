"""A fast, scriptable OpenAI-compatible worker for load and soak runs (raw Trio sockets).

The simulated vLLM backend models an engine and costs CPU per token; a load test of the *proxy*
needs a worker that costs almost nothing, so that agentd and the clients get the cores.  This one
answers ``GET /health``, ``GET /metrics`` (the vLLM series Program scheduling reads),
``GET /v1/models`` and ``POST /v1/chat/completions`` / ``/v1/completions`` over HTTP/1.1 with
keep-alive: a stream is ``tokens`` SSE chunks ``token_interval`` seconds apart (the first after
``first_token_seconds``), then a usage chunk when asked, then ``data: [DONE]``.  A request may
override the shape: ``max_tokens`` (the number of chunks), ``fake_token_interval`` and
``fake_event_bytes`` (the content size of each chunk) - the load bench's heavy streams.

Faults (``fault_rate``, seeded): each generation request fails with that probability in one of
:data:`FAULTS` - ``reset`` (the connection is closed mid-stream), ``status_500`` (a JSON 500),
``garbage`` (a response head that is not HTTP).  ``python -m bench.fakeworker --port 0`` prints
``fakeworker listening on http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

import attrs
import trio

from bench.interrupt import run_interruptible, run_main
from daemon.commands.argtypes import fraction, int_at_least, non_empty, non_negative_float, port, positive_int

FAULTS = ("reset", "status_500", "garbage")
MAX_TOKENS = 1_000_000
METRICS = (
    'vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 0\n'
    'vllm:kv_cache_usage_perc{engine="0"} 0.0\n'
)


@attrs.define
class WorkerShape:
    tokens: int = 32
    first_token_seconds: float = 0.05
    token_interval: float = 0.02
    fault_rate: float = 0.0
    seed: int = 0


@attrs.define
class WorkerCounters:
    requests: int = 0
    faults: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(FAULTS, 0))


def _response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class FakeWorker:
    def __init__(self, shape: WorkerShape) -> None:
        self.shape = shape
        self.rng = random.Random(shape.seed)
        self.counters = WorkerCounters()

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()
        async with trio.open_nursery() as nursery:
            task_status.started(f"http://{host}:{bound[1]}")
            nursery.start_soon(trio.serve_listeners, self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                while len(buf) < length:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                if not await self._answer(stream, method, path, body):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.SocketStream, method: str, path: str, body: bytes) -> bool:
        """Answer one request; False when the connection must close."""
        if method == "GET":
            if path == "/metrics":
                await stream.send_all(_response("200 OK", METRICS.encode(), "text/plain"))
            elif path == "/v1/models":
                await stream.send_all(_response("200 OK", b'{"object":"list","data":[{"id":"fake"}]}'))
            else:
                await stream.send_all(_response("200 OK", b"{}"))
            return True
        self.counters.requests += 1
        fault = None
        if self.shape.fault_rate and self.rng.random() < self.shape.fault_rate:
            fault = self.rng.choice(FAULTS)
            self.counters.faults[fault] += 1
        if fault == "status_500":
            await stream.send_all(_response("500 Internal Server Error", b'{"error":{"message":"injected"}}'))
            return True
        if fault == "garbage":
            await stream.send_all(b"\x00\x01 this is not HTTP\r\n\r\n")
            return False
        request = json.loads(body or b"{}")
        tokens = self.shape.tokens
        if isinstance(request.get("max_tokens"), int):
            tokens = max(1, min(request["max_tokens"], MAX_TOKENS))
        interval = request.get("fake_token_interval", self.shape.token_interval)
        pad = b"x" * min(int(request.get("fake_event_bytes", 1)), 1 << 20)
        await trio.sleep(self.shape.first_token_seconds)
        if not request.get("stream"):
            await trio.sleep(interval * (tokens - 1))
            answer = {
                "id": "cmpl-fake",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * tokens}}],
                "usage": {
                    "prompt_tokens": 8,
                    "completion_tokens": tokens,
                    "total_tokens": 8 + tokens,
                },
            }
            await stream.send_all(_response("200 OK", json.dumps(answer).encode()))
            return True
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        event = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + pad + b'"}}]}\n\n'
        for i in range(tokens):
            if i:
                await trio.sleep(interval)
            if fault == "reset" and i == tokens // 2:
                return False
            await stream.send_all(_chunk(event))
        options = request.get("stream_options") or {}
        if options.get("include_usage"):
            usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}
            await stream.send_all(_chunk(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"))
        await stream.send_all(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fakeworker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", type=non_empty)
    parser.add_argument("--port", type=port, default=0)
    parser.add_argument("--tokens", type=positive_int, default=32)
    parser.add_argument("--first-token-seconds", type=non_negative_float, default=0.05)
    parser.add_argument("--token-interval", type=non_negative_float, default=0.02)
    parser.add_argument("--fault-rate", type=fraction, default=0.0)
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    args = parser.parse_args(argv)
    shape = WorkerShape(args.tokens, args.first_token_seconds, args.token_interval, args.fault_rate, args.seed)
    worker = FakeWorker(shape)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(worker.serve, args.host, args.port)
            print(f"fakeworker listening on {url}", flush=True)

    try:
        run_interruptible(run)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.fakeworker"))
