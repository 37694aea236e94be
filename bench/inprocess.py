"""An httpx transport that serves requests with a running daemon's handles: no sockets.

``agentd simulate`` runs the daemon (``run_daemon(serve_http=False)``) and the replay client in one
Trio run under a ``MockClock``; this transport is the wire between them.  ``POST
/v1/chat/completions`` and ``/v1/completions`` are validated with ``handles.build_request`` (the
same validation as the HTTP path; an ``ApiError`` becomes its JSON error response) and served by
``handles.handle`` in a task of the transport's nursery, which streams the response body through a
bounded memory channel so the client sees chunks as the proxy produces them (TTFT stays
meaningful).  ``GET /metrics`` renders the daemon's registry; ``GET /health`` answers 200;
``GET /scheduling/diagnostics`` renders the diagnostics document.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from daemon.handles import DaemonHandles
from daemon.http.errors import ApiError

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


class _ChannelSink:
    """ResponseSink that forwards start/chunks/end into memory channels."""

    def __init__(
        self, started: trio.MemorySendChannel[tuple[int, list[tuple[str, str]]]], chunks: trio.MemorySendChannel[bytes]
    ) -> None:
        self._started = started
        self._chunks = chunks

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        await self._started.send((status, headers))

    async def send(self, chunk: bytes) -> None:
        await self._chunks.send(chunk)

    async def end(self, chunk: bytes = b"") -> None:
        if chunk:
            await self._chunks.send(chunk)
        await self._chunks.aclose()


class _ChannelStream(httpx.AsyncByteStream):
    def __init__(self, recv: trio.MemoryReceiveChannel[bytes], cancel: trio.CancelScope) -> None:
        self._recv = recv
        self._cancel = cancel

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async with self._recv:
            async for chunk in self._recv:
                yield chunk

    async def aclose(self) -> None:
        # The client stopped reading: abandon the request (the proxy releases its lease).
        self._cancel.cancel()
        await self._recv.aclose()


class InProcessTransport(httpx.AsyncBaseTransport):
    def __init__(self, handles: DaemonHandles, nursery: trio.Nursery) -> None:
        self._handles = handles
        self._nursery = nursery

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path == "/metrics":
            return httpx.Response(
                200, headers={"content-type": CONTENT_TYPE_LATEST}, content=generate_latest(self._handles.registry)
            )
        if request.method == "GET" and path == "/health":
            return httpx.Response(200, text="ok")
        if request.method == "GET" and path == "/scheduling/diagnostics":
            from daemon.http.diagnostics import diagnostics_payload  # the HTTP app's own document

            return httpx.Response(200, content=json.dumps(diagnostics_payload(self._handles), default=str).encode())
        endpoint = ENDPOINTS.get(path)
        if request.method != "POST" or endpoint is None:
            return httpx.Response(404, json={"error": {"message": f"no route {request.method} {path}"}})
        raw = await request.aread()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            proxy_request = self._handles.build_request(endpoint, raw, headers)
        except ApiError as exc:
            return httpx.Response(exc.status, headers=dict(exc.headers), content=exc.body())
        # one start message; chunk buffer 16: a few SSE frames of slack between proxy and client
        start_send, start_recv = trio.open_memory_channel[tuple[int, list[tuple[str, str]]]](1)
        chunk_send, chunk_recv = trio.open_memory_channel[bytes](16)
        cancel = trio.CancelScope()

        async def serve() -> None:
            with cancel:
                async with start_send:
                    await self._handles.handle(proxy_request, _ChannelSink(start_send, chunk_send), raw_body=raw)
            await chunk_send.aclose()

        self._nursery.start_soon(serve)
        async with start_recv:
            try:
                status, resp_headers = await start_recv.receive()
            except trio.EndOfChannel:
                cancel.cancel()
                body = json.dumps({"error": {"message": "request ended without a response"}}).encode()
                return httpx.Response(502, content=body)
        return httpx.Response(status, headers=resp_headers, stream=_ChannelStream(chunk_recv, cancel))
