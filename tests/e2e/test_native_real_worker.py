"""The default upstream path over real sockets: a tiny ASGI worker served by hypercorn on port 0.

Everything else in tests/e2e fakes the worker with ``httpx.MockTransport``; this file covers the
pooled ``httpx.AsyncHTTPTransport`` the daemon uses in production, streaming included, and the
DP header as the worker actually receives it.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import httpx
import trio
from native_fakes import BUDGET_SECONDS

from daemon.config import AgentdConfig, RoutingConfig, ServerConfig
from daemon.http.serve import serve_http
from daemon.supervisor import run_daemon


class AsgiWorker:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                reply = (
                    "lifespan.startup.complete"
                    if message["type"] == "lifespan.startup"
                    else "lifespan.shutdown.complete"
                )
                await send({"type": reply})
                if reply == "lifespan.shutdown.complete":
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        self.seen.append((scope["path"], headers))
        request = json.loads(body)
        if request.get("stream"):
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
            )
            for word in ("a", "b", "c"):
                chunk = {"choices": [{"delta": {"content": word}}]}
                await send(
                    {"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(), "more_body": True}
                )
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        payload = json.dumps(
            {"choices": [{"message": {"content": "abc"}}], "rank": headers.get("x-data-parallel-rank")}
        ).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


async def test_native_real_socket_worker_relay_and_stream() -> None:
    worker = AsgiWorker()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        worker_url = await nursery.start(serve_http, worker, "127.0.0.1", 0, 1.0, stop.wait)
        cfg = AgentdConfig(
            server=ServerConfig(port=0),
            routing=RoutingConfig(worker_urls=(worker_url,), intra_node_data_parallel_size=2, policy="round_robin"),
        )
        handles = await nursery.start(partial(run_daemon, cfg))
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            first = await client.post("/v1/chat/completions", json=chat)
            second = await client.post("/v1/chat/completions", json=chat, headers={"x-data-parallel-rank": "5"})
            streamed = await client.post("/v1/chat/completions", json={**chat, "stream": True})
        assert [first.json()["rank"], second.json()["rank"]] == ["0", "1"]
        assert streamed.headers["content-type"] == "text/event-stream"
        assert streamed.content.count(b"data: ") == 4 and streamed.content.endswith(b"data: [DONE]\n\n")
        assert [path for path, _ in worker.seen if path != "/v1/models"] == ["/v1/chat/completions"] * 3
        handles.request_shutdown()
        stop.set()
