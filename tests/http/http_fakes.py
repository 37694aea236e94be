"""HTTP-layer test helpers: the daemon without sockets (``serve_http=False``) plus ``create_app``.

``daemon_app`` yields ``(handles, app)``: a full daemon in front of an ``httpx.MockTransport``
worker whose behaviour the test controls through :class:`MiniWorker`, and the Quart-Trio app
built on its handles, exercised with ``app.test_client()``.
"""

from __future__ import annotations

import json

import attrs
import httpx

from daemon.config import AgentdConfig, RoutingConfig, ServerConfig
from daemon.handles import DaemonHandles
from daemon.http.app import AgentdApp


class MiniWorker:
    def __init__(self) -> None:
        self.healthy = True
        self.explode = False  # raise a non-httpx error: simulates a bug below the proxy
        self.plain_error: str | None = None  # answer generation requests with this text/plain 400
        self.seen: list[httpx.Request] = []
        self.bodies: list[bytes] = []

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        if request.url.path == "/v1/models":  # not recorded: the daemon discovers models at start
            return httpx.Response(200, json={"object": "list", "data": [{"id": "mini"}]})
        self.seen.append(request)
        if self.explode:
            raise RuntimeError("secret internals")
        self.bodies.append(await request.aread())
        if self.plain_error is not None and request.url.path != "/v1/models":
            return httpx.Response(400, text=self.plain_error)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "mini"}]})
        body = json.loads(self.bodies[-1])
        if body.get("stream"):
            chunks = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n'
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chunks)
        return httpx.Response(
            200,
            json={"choices": [{"message": {"content": "a"}}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}},
        )

    def transport(self, cfg: AgentdConfig) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(self.handler)


@attrs.define
class DaemonApp:
    handles: DaemonHandles
    app: AgentdApp
    worker: MiniWorker


def http_config(**routing: object) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0, max_body_bytes=4096),
        routing=RoutingConfig(worker_urls=("http://mini:9000",), policy="round_robin", **routing),  # type: ignore[arg-type]
    )
