"""HTTP server of the simulated vLLM backend: a Quart-Trio app delegating to ``SimApi``.

``create_app`` wraps one ``SimCluster``; streamed responses are written chunk by chunk as the
engine emits tokens.  ``serve_sim`` runs the app under ``hypercorn.trio.serve`` inside the caller's
nursery and reports the bound URL (the real port when 0 was asked) through ``task_status``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client import CollectorRegistry
from quart import Response, request
from quart_trio import QuartTrio

from actors.sim.api import ApiRequest, SimApi
from actors.sim.cluster import SimCluster
from actors.sim.responses import SseStream

METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


def create_app(cluster: SimCluster, registry: CollectorRegistry | None = None) -> QuartTrio:
    app = QuartTrio("agentd_sim")
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024 * 1024
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 600
    api = SimApi(cluster, registry)
    app.extensions["agentd_sim_api"] = api

    async def _stream(stream: SseStream) -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()

    @app.route("/", defaults={"path": ""}, methods=METHODS)
    @app.route("/<path:path>", methods=METHODS)
    async def catch_all(path: str) -> Response:
        body = await request.get_data()
        headers = {k.lower(): v for k, v in request.headers.items()}
        result = await api.handle(ApiRequest(request.method, "/" + path, headers, body))
        if result.stream is not None:
            response = Response(_stream(result.stream), status=result.status, content_type=result.content_type)
            response.timeout = None
        else:
            response = Response(result.body, status=result.status, content_type=result.content_type)
        for name, value in result.headers:
            response.headers[name] = value
        return response

    return app


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def serve_sim(
    cluster: SimCluster,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[None]],
    *,
    registry: CollectorRegistry | None = None,
    grace_seconds: float = 5.0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``cluster`` over HTTP until ``shutdown_trigger`` returns."""
    config = Config()
    config.bind = [_bind(host, port)]
    config.graceful_timeout = grace_seconds
    config.accesslog = None
    config.include_server_header = False
    config.keep_alive_timeout = 75.0
    app = create_app(cluster, registry)
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(partial(serve, app, config, shutdown_trigger=shutdown_trigger))
        task_status.started(binds[0])
