"""HTTP app of the simulated vLLM backend: a Quart-Trio app delegating to ``SimApi``.

``create_app`` wraps one ``SimCluster``; streamed responses are written chunk by chunk as the
engine emits tokens.  ``agentd sim-backend`` serves it with ``daemon.http.serve.serve_http``
(hypercorn under Trio, bound URL reported through ``task_status``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry
from quart import Response, request
from quart_trio import QuartTrio

from sim.api import ApiRequest, SimApi
from sim.cluster import SimCluster
from sim.responses import ResponsesStream, SseStream

METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


def create_app(
    cluster: SimCluster, registry: CollectorRegistry | None = None, *, created_epoch: float = 0.0
) -> QuartTrio:
    app = QuartTrio("agentd_sim")
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024 * 1024
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 600
    api = SimApi(cluster, registry, created_epoch=created_epoch)
    app.extensions["agentd_sim_api"] = api

    async def _stream(stream: SseStream | ResponsesStream) -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()

    @app.route("/", defaults={"path": ""}, methods=METHODS)
    @app.route("/<path:path>", methods=METHODS)
    async def catch_all(path: str) -> Response:
        body = await request.get_data(cache=True, as_text=False, parse_form_data=False)
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
