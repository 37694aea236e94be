"""In-process httpx transport serving the simulated API without sockets.

``httpx.AsyncClient(transport=SimTransport(cluster))`` talks to the same ``SimApi`` as the HTTP
server; streamed responses are fed frame by frame as the engine emits tokens (nothing is
buffered), and closing a response early aborts the request like a client disconnect.

``SimTransport`` serves one simulated server, or several keyed by base URL (``"http://host:port"``)
so that an embedded deployment with several workers uses one client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx
from prometheus_client import CollectorRegistry

from sim.api import ApiRequest, SimApi
from sim.cluster import SimCluster
from sim.responses import ResponsesStream, SseStream


class _SseByteStream(httpx.AsyncByteStream):
    def __init__(self, stream: SseStream | ResponsesStream) -> None:
        self._stream = stream

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._stream

    async def aclose(self) -> None:
        await self._stream.aclose()


def _base_url(url: httpx.URL) -> str:
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}"


class SimTransport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        cluster: SimCluster | Mapping[str, SimCluster],
        *,
        registry: CollectorRegistry | None = None,
        created_epoch: float = 0.0,
    ) -> None:
        # created_epoch: see SimApi (0.0 under MockClock; sim.api.wall_clock_epoch() on the real clock)
        if isinstance(cluster, SimCluster):
            self._default: SimApi | None = SimApi(cluster, registry, created_epoch=created_epoch)
            self._apis: dict[str, SimApi] = {}
        else:
            self._default = None
            self._apis = {url.rstrip("/"): SimApi(c, created_epoch=created_epoch) for url, c in cluster.items()}

    def api_for(self, url: httpx.URL) -> SimApi | None:
        if self._default is not None:
            return self._default
        return self._apis.get(_base_url(url))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        api = self.api_for(request.url)
        if api is None:
            raise httpx.ConnectError(f"no simulated server at {_base_url(request.url)}", request=request)
        body = await request.aread()
        headers = {k.lower(): v for k, v in request.headers.items()}
        path = request.url.raw_path.decode("ascii")
        response = await api.handle(ApiRequest(request.method, path, headers, body))
        out_headers = [("content-type", response.content_type), *response.headers]
        if response.stream is not None:
            return httpx.Response(
                response.status, headers=out_headers, stream=_SseByteStream(response.stream), request=request
            )
        return httpx.Response(response.status, headers=out_headers, content=response.body, request=request)
