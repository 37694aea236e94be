"""DaemonHandles: the frozen bundle the supervisor hands to the HTTP app, tests and simulate.

It carries references (client, registry, dispatchers, health board, proxy engine) - never
ownership: the supervisor owns and closes everything.  ``http_url``/``metrics_url`` are filled
in (with :func:`attrs.evolve`) once the listeners are bound; they stay ``None`` when the daemon
runs without HTTP (``serve_http=False``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import httpx
import trio
from prometheus_client import CollectorRegistry

from actors.core.config import BackendTarget
from daemon.config import AgentdConfig
from daemon.dispatch import Dispatcher, NativeDispatcher, ProxyRequest
from daemon.health import HealthBoard
from daemon.http.proxy import CollectingSink, ProxyEngine, ResponseSink
from daemon.metrics import ProxyMetrics

if TYPE_CHECKING:
    from daemon.batch_executor import BatchService


@attrs.frozen(eq=False)
class DaemonHandles:
    config: AgentdConfig
    targets: tuple[BackendTarget, ...]
    registry: CollectorRegistry
    client: httpx.AsyncClient
    health: HealthBoard
    native_dispatcher: NativeDispatcher
    program_dispatcher: Dispatcher | None
    engine: ProxyEngine
    metrics: ProxyMetrics
    shutdown: trio.Event  # set it to stop the daemon gracefully (what SIGINT/SIGTERM do)
    embedded: Any = None  # the embedded simulated cluster handle when cfg.embedded_mode
    batches: BatchService | None = None  # the Batch API (docs/batch.md §4) when batch_api.enabled
    http_url: str | None = None
    metrics_url: str | None = None
    admin_url: str | None = None  # the admin listener ([admin] port), docs/operations.md §10
    edge: Any = None  # daemon.http.edge.Edge: request limits and the drain of the public routes
    server_state: Any = None  # daemon.http.serve.ServerState: the public listener's connections
    # daemon.dataplane.processes.DataPlane when relay processes serve the port (docs/operations.md §13)
    data_plane: Any = None

    def request_shutdown(self) -> None:
        """Stop accepting, drain in-flight requests within the grace period, then stop."""
        self.shutdown.set()

    async def handle(self, req: ProxyRequest, sink: ResponseSink, *, raw_body: bytes | None = None) -> None:
        """Run the proxy for one request without HTTP (streams into ``sink``)."""
        await self.engine.handle(req, sink, raw_body=raw_body)

    async def handle_collect(self, req: ProxyRequest) -> CollectingSink:
        """Run the proxy for one request and return the whole response."""
        sink = CollectingSink()
        await self.engine.handle(req, sink)
        return sink

    def build_request(self, endpoint: str, raw: bytes, headers: dict[str, str]) -> ProxyRequest:
        """Validate a raw body exactly as the HTTP path does (raises ApiError)."""
        return self.engine.build_request(endpoint, raw, {k.lower(): v for k, v in headers.items()})
