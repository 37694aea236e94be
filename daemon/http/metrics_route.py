"""``GET /metrics`` on the main app, and a tiny standalone ASGI app for ``--prometheus-port``.

Both render the daemon's own registry with ``generate_latest``; nothing reads the global
``REGISTRY``.  :func:`metrics_asgi_app` speaks just enough ASGI (lifespan + one GET route) to
be served by a second ``hypercorn.trio.serve`` inside the supervisor nursery.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from quart import Blueprint, Response

from daemon.dataplane.metrics_merge import merged_families_exposition
from daemon.http.errors import error_body
from daemon.http.lifespan import answer_lifespan

Asgi = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
# with relay processes: every relay's families (``RelayMetrics.families``), merged into the
# scheduler's (docs/operations.md §13.3)
RelayExpositions = Callable[[], Awaitable[list[list[Metric]]]]


async def exposition(registry: CollectorRegistry, relays: RelayExpositions | None) -> bytes:
    if relays is None:
        return generate_latest(registry)
    return merged_families_exposition(registry, await relays())


def metrics_blueprint(registry: CollectorRegistry, relays: RelayExpositions | None = None) -> Blueprint:
    bp = Blueprint("metrics", __name__)

    @bp.get("/metrics")
    async def metrics() -> Response:
        return Response(await exposition(registry, relays), status=200, content_type=CONTENT_TYPE_LATEST)

    return bp


def metrics_asgi_app(registry: CollectorRegistry, relays: RelayExpositions | None = None) -> Asgi:
    """ASGI app serving only ``GET /metrics`` (404/405 JSON errors otherwise)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        extra: list[tuple[bytes, bytes]] = []
        if scope["path"] != "/metrics":
            status, content_type = 404, "application/json"
            body = error_body(
                f"unknown route {scope['method']} {scope['path']}", "invalid_request_error", None, "not_found"
            )
        elif scope["method"] not in ("GET", "HEAD"):
            status, content_type = 405, "application/json"
            extra = [(b"allow", b"GET, HEAD")]
            body = error_body(
                f"method {scope['method']} is not allowed on /metrics",
                "invalid_request_error",
                None,
                "method_not_allowed",
            )
        else:
            status, content_type, body = 200, CONTENT_TYPE_LATEST, await exposition(registry, relays)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type.encode()),
                    (b"content-length", str(len(body)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body if scope["method"] != "HEAD" else b""})

    return app
