"""End-to-end test helpers: a fake vLLM-compatible worker (httpx.MockTransport) and a daemon on port 0.

``FakeWorker`` answers ``/health``, ``/v1/models`` and the three generation routes in the chat,
completions and responses formats (JSON or SSE), records every request it sees, and can be told
to fail (status, unreachable), to report unhealthy, or to hold a stream open after its first
chunk until ``release`` is set (client-disconnect tests).  Streams are ``httpx.AsyncByteStream``
objects so closing the upstream response is observable (``closed_streams``).
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import trio

from daemon.config import AgentdConfig, RoutingConfig, ServerConfig

MODEL = "fake-model"
# Real-socket tests bound every HTTP call by this (httpx timeout): generous, never reached on success,
# so a broken behaviour fails instead of hanging.  180 s: whole tests under 60 s bounds took 33 s on
# the 2-core machine at load 9-10, too close for a loaded CI machine.
BUDGET_SECONDS = 180.0


@attrs.frozen
class SeenRequest:
    method: str
    base_url: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    raw: bytes


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class FakeStream(httpx.AsyncByteStream):
    def __init__(self, worker: FakeWorker, chunks: list[bytes]) -> None:
        self.worker = worker
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, chunk in enumerate(self.chunks):
            if i == 1 and self.worker.hold_streams:
                self.worker.holding += 1
                await self.worker.release.wait()
            if i > 0 and self.worker.chunk_delay_seconds:
                await trio.sleep(self.worker.chunk_delay_seconds)
            yield chunk
        if self.worker.break_stream_after_chunks:
            raise httpx.ReadError("connection reset by worker")

    async def aclose(self) -> None:
        self.worker.closed_streams += 1
        self.worker.stream_closed.set()


class FakeWorker:
    def __init__(self, worker_urls: tuple[str, ...] = ("http://w0:8000",)) -> None:
        self.worker_urls = worker_urls
        self.healthy: dict[str, bool] = {url: True for url in worker_urls}
        self.requests: list[SeenRequest] = []
        self.fail_status: int | None = None
        self.unreachable: set[str] = set()
        self.hold_streams = False
        self.holding = 0
        self.release = trio.Event()
        self.closed_streams = 0
        self.stream_closed = trio.Event()
        self.chunk_delay_seconds = 0.0
        self.break_stream_after_chunks = False
        self.health_checks: list[str] = []
        self.models_without_content_type = False  # a worker that labels its model list with nothing

    def client(self, cfg: AgentdConfig | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    def transport(self, cfg: AgentdConfig | None = None) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(self.handler)

    def generation_requests(self) -> list[SeenRequest]:
        return [r for r in self.requests if r.path.startswith("/v1/") and r.method == "POST"]

    async def handler(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        path = request.url.path
        if base in self.unreachable:
            raise httpx.ConnectError("connection refused", request=request)
        if path == "/health":
            self.health_checks.append(base)
            return httpx.Response(200 if self.healthy[base] else 503, text="")
        if path == "/metrics":  # minimal vLLM scrape for Program scheduling's rank observers
            text = "".join(
                f'vllm:num_requests_running{{engine="{r}"}} 0\nvllm:num_requests_waiting{{engine="{r}"}} 0\n'
                f'vllm:kv_cache_usage_perc{{engine="{r}"}} 0.0\n'
                for r in range(2)
            )
            return httpx.Response(200, text=text)
        raw = await request.aread()
        body = json.loads(raw) if raw else None
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(SeenRequest(request.method, base, path, headers, body, raw))
        if path == "/v1/models":
            listing = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
            if self.models_without_content_type:
                return httpx.Response(200, content=json.dumps(listing).encode())
            return httpx.Response(200, json=listing)
        if self.fail_status is not None:
            return httpx.Response(self.fail_status, json={"error": {"message": "worker exploded"}})
        if body is None:
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        if path == "/v1/chat/completions":
            return self._chat(body)
        if path == "/v1/completions":
            return self._completions(body)
        if path == "/v1/responses":
            return self._responses(body)
        return httpx.Response(404, json={"error": {"message": "no such route"}})

    @staticmethod
    def _include_usage(body: dict[str, Any]) -> bool:
        options = body.get("stream_options") or {}
        return bool(options.get("include_usage"))

    def _stream(self, chunks: list[bytes]) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=FakeStream(self, chunks))

    def _chat(self, body: dict[str, Any]) -> httpx.Response:
        usage = {
            "prompt_tokens": 11,
            "completion_tokens": 3,
            "total_tokens": 14,
            "prompt_tokens_details": {"cached_tokens": 4},
        }
        if not body.get("stream"):
            return httpx.Response(
                200,
                json={
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "Hello world"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                },
            )
        chunks = [
            sse({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            sse({"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hello"}}]}),
            sse({"id": "c1", "choices": [{"index": 0, "delta": {"content": " world"}, "finish_reason": "stop"}]}),
        ]
        if self._include_usage(body):
            chunks.append(sse({"id": "c1", "choices": [], "usage": usage}))
        chunks.append(b"data: [DONE]\n\n")
        return self._stream(chunks)

    def _completions(self, body: dict[str, Any]) -> httpx.Response:
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if not body.get("stream"):
            return httpx.Response(
                200,
                json={
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "text": "ok!", "finish_reason": "stop"}],
                    "usage": usage,
                },
            )
        chunks = [
            sse({"id": "cmpl-1", "choices": [{"index": 0, "text": "ok"}]}),
            sse({"id": "cmpl-1", "choices": [{"index": 0, "text": "!", "finish_reason": "stop"}]}),
        ]
        if self._include_usage(body):
            chunks.append(sse({"id": "cmpl-1", "choices": [], "usage": usage}))
        chunks.append(b"data: [DONE]\n\n")
        return self._stream(chunks)

    def _responses(self, body: dict[str, Any]) -> httpx.Response:
        usage = {
            "input_tokens": 9,
            "output_tokens": 2,
            "total_tokens": 11,
            "input_tokens_details": {"cached_tokens": 1},
        }
        response = {
            "id": "resp-1",
            "object": "response",
            "status": "completed",
            "usage": usage,
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
        }
        if not body.get("stream"):
            return httpx.Response(200, json=response)
        return self._stream(
            [
                b"event: response.created\n" + sse({"type": "response.created", "response": {"id": "resp-1"}}),
                b"event: response.output_text.delta\n" + sse({"type": "response.output_text.delta", "delta": "hi"}),
                b"event: response.completed\n" + sse({"type": "response.completed", "response": response}),
            ]
        )


def make_config(
    worker_urls: tuple[str, ...] = ("http://w0:8000",),
    *,
    dp: int = 1,
    policy: str = "round_robin",
    max_body_bytes: int = 1 << 20,
    grace_seconds: float = 5.0,
    health_interval_seconds: float = 5.0,
    health_failures_to_eject: int = 3,
    health_successes_to_restore: int = 2,
) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(
            host="127.0.0.1", port=0, max_body_bytes=max_body_bytes, shutdown_grace_seconds=grace_seconds
        ),
        routing=RoutingConfig(
            worker_urls=worker_urls,
            intra_node_data_parallel_size=dp,
            policy=policy,
            health_check_interval_seconds=health_interval_seconds,
            health_failures_to_eject=health_failures_to_eject,
            health_successes_to_restore=health_successes_to_restore,
        ),
    )


async def read_line(stream: trio.abc.ReceiveStream) -> str:
    """One line of a child process's output (byte by byte: never reads past the newline)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        data += chunk
    return data.decode()


async def stop_process(proc: trio.Process, sig: int = signal.SIGTERM, seconds: float = 60) -> int:
    """Send ``sig`` to a child process and return its exit status (waiting at most ``seconds``)."""
    proc.send_signal(sig)
    with trio.fail_after(seconds):
        return await proc.wait()


async def reap(proc: trio.Process) -> None:
    """Kill a child process the test leaves running (a failed assertion) and wait for it."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
