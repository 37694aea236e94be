"""Limits of the public listener over real sockets (docs/operations.md §10, issue 14 §2 and §5).

Real clock (the socket path is the point, as in ``test_native_lifecycle``): waits poll explicit
conditions under a generous budget; the short timeouts configured here (a fraction of a second)
are asserted as ordering and outcome, never as measured durations.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from functools import partial

import attrs
import httpx
import trio
import trio.lowlevel
import trio.testing
from native_fakes import FakeWorker, make_config

from daemon.config import LimitsConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

BUDGET_SECONDS = 60.0
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
PLAIN = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` on the real clock (socket progress has no event to wait for)."""
    while True:
        if predicate():
            return
        await trio.sleep(0.01)


async def start(nursery: trio.Nursery, worker: FakeWorker, grace: float = 5.0, **limits: object) -> DaemonHandles:
    cfg = attrs.evolve(make_config(worker.worker_urls, grace_seconds=grace), limits=LimitsConfig(**limits))  # type: ignore[arg-type]
    return await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport, rng=random.Random(3)))


def host_port(handles: DaemonHandles) -> tuple[str, int]:
    assert handles.http_url is not None
    host, port = handles.http_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def test_in_flight_cap_queues_then_refuses_with_429_and_retry_after(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker, max_in_flight_requests=1, max_queued_requests=1)
            edge = handles.edge
            results: dict[str, bytes] = {}
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:

                async def stream(name: str) -> None:
                    async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                        results[name] = b"".join([c async for c in response.aiter_raw()])

                nursery.start_soon(stream, "first")
                await wait_until(lambda: fake_worker.holding == 1)
                nursery.start_soon(stream, "queued")
                await wait_until(lambda: edge.queued == 1)
                refused = await client.post("/v1/chat/completions", json=PLAIN)
                assert refused.status_code == 429
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["code"] == "too_many_requests"
                assert refused.json()["error"]["type"] == "rate_limit_error"
                fake_worker.release.set()
                await wait_until(lambda: len(results) == 2)
            assert all(body.endswith(b"data: [DONE]\n\n") for body in results.values())
            # A handler closes its ticket after its last byte is written, so the client can read
            # that byte first: wait for the edge to go idle (a leaked ticket never does, and the
            # budget fails the test), then check every counter is back to zero.
            await wait_until(lambda: edge.active == 0)
            assert (edge.in_flight, edge.queued, edge.active) == (0, 0, 0)
            stats = edge.statistics()
            assert (stats.admitted_count, stats.refused_queue_full_count) == (2, 1)
            handles.request_shutdown()


async def test_queue_timeout_is_a_json_503(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker, max_in_flight_requests=1, queue_timeout_seconds=0.2)
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                async with client.stream("POST", "/v1/chat/completions", json=CHAT) as held:
                    held_chunks = held.aiter_raw()  # keep a reference: a collected iterator closes the stream
                    await held_chunks.__anext__()
                    late = await client.post("/v1/chat/completions", json=PLAIN)
                    assert late.status_code == 503
                    assert late.json()["error"]["code"] == "queue_timeout"
                    assert "retry-after" in late.headers
                    fake_worker.release.set()
            await wait_until(lambda: handles.edge.active == 0)
            handles.request_shutdown()


async def test_sse_keepalive_comments_while_queued_then_the_real_stream(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker, max_in_flight_requests=1, sse_keepalive_seconds=0.05)
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                async with client.stream("POST", "/v1/chat/completions", json=CHAT) as held:
                    held_chunks = held.aiter_raw()  # keep a reference: a collected iterator closes the stream
                    await held_chunks.__anext__()
                    async with client.stream("POST", "/v1/chat/completions", json=CHAT) as queued:
                        assert queued.status_code == 200
                        assert queued.headers["content-type"] == "text/event-stream"
                        chunks = queued.aiter_raw()
                        first = await chunks.__anext__()
                        assert first.startswith(b": keep-alive\n\n")
                        fake_worker.release.set()
                        rest = b"".join([c async for c in chunks])
                    assert rest.endswith(b"data: [DONE]\n\n")
                    assert b"Hello" in first + rest
            handles.request_shutdown()


async def test_sse_keepalive_turns_a_later_refusal_into_an_error_event(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            # the first keep-alive comment (0.05 s) must go out before the refusal: 2 s apart, not
            # the 0.25 s a loaded machine's scheduling delays could cover (a JSON 503 then)
            handles = await start(
                nursery, fake_worker, max_in_flight_requests=1, queue_timeout_seconds=2.0, sse_keepalive_seconds=0.05
            )
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                async with client.stream("POST", "/v1/chat/completions", json=CHAT) as held:
                    held_chunks = held.aiter_raw()  # keep a reference: a collected iterator closes the stream
                    await held_chunks.__anext__()
                    async with client.stream("POST", "/v1/chat/completions", json=CHAT) as queued:
                        body = b"".join([c async for c in queued.aiter_raw()])
                    fake_worker.release.set()
            events = [e for e in body.split(b"\n\n") if e.startswith(b"data: ")]
            assert events[-1] == b"data: [DONE]"
            error = json.loads(events[-2][len(b"data: ") :])["error"]
            assert (error["code"], error["status"]) == ("queue_timeout", 503)
            handles.request_shutdown()


async def test_connection_cap_answers_json_503_and_closes(fake_worker: FakeWorker) -> None:
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker, max_connections=1)
            host, port = host_port(handles)
            first = await trio.open_tcp_stream(host, port)
            await wait_until(lambda: handles.server_state.open_connections == 1)
            second = await trio.open_tcp_stream(host, port)
            await second.send_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
            data = b""
            while chunk := await second.receive_some(65536):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503")
            assert b"retry-after: 1" in head
            assert json.loads(body)["error"]["code"] == "too_many_connections"
            await second.aclose()
            await first.aclose()
            await wait_until(lambda: handles.server_state.open_connections == 0)
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                assert (await client.get("/health")).status_code == 200
            assert handles.server_state.rejected_connections == 1
            handles.request_shutdown()


async def test_body_read_timeout_is_a_json_408(fake_worker: FakeWorker) -> None:
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker, body_read_timeout_seconds=0.2)
            host, port = host_port(handles)
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                b'content-length: 100\r\n\r\n{"model": '
            )
            data = b""
            while b"}}" not in data:
                chunk = await stream.receive_some(65536)
                assert chunk
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408")
            assert json.loads(body)["error"]["code"] == "body_read_timeout"
            await stream.aclose()
            await wait_until(lambda: handles.edge.active == 0)
            handles.request_shutdown()


class EndlessWorker:
    """A worker whose stream never ends (64 KiB chunks as fast as they are taken)."""

    def __init__(self) -> None:
        self.closed = trio.Event()

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        worker = self

        class Endless(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                chunk = b"data: " + b"x" * 65536 + b"\n\n"
                while True:
                    await trio.lowlevel.checkpoint()
                    yield chunk

            async def aclose(self) -> None:
                worker.closed.set()

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Endless())

    def transport(self, cfg: object = None) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(self.handler)


async def test_a_client_that_stops_reading_loses_its_connection_and_lease() -> None:
    worker = EndlessWorker()
    cfg = attrs.evolve(make_config(), limits=LimitsConfig(client_write_timeout_seconds=0.3))
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport))
            host, port = host_port(handles)
            stream = await trio.open_tcp_stream(host, port)
            body = json.dumps(CHAT).encode()
            await stream.send_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200")
            # ... and never read again: the socket buffers fill, a write times out
            await worker.closed.wait()
            await wait_until(lambda: handles.native_dispatcher.total_in_flight() == 0 and handles.edge.active == 0)
            assert handles.native_dispatcher.statistics().abandoned_count == 1
            assert handles.server_state.write_timeouts >= 1
            await stream.aclose()
            handles.request_shutdown()


async def test_drain_refuses_queued_and_new_requests_with_503(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker, grace=30.0, max_in_flight_requests=1)
            edge = handles.edge
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                async with client.stream("POST", "/v1/chat/completions", json=CHAT) as held:
                    chunks = held.aiter_raw()
                    await chunks.__anext__()
                    queued: list[httpx.Response] = []

                    async def post() -> None:
                        queued.append(await client.post("/v1/chat/completions", json=PLAIN))

                    nursery.start_soon(post)
                    await wait_until(lambda: edge.queued == 1)
                    handles.request_shutdown()
                    await wait_until(lambda: len(queued) == 1)
                    assert queued[0].status_code == 503
                    assert queued[0].json()["error"]["code"] == "server_shutting_down"
                    assert queued[0].headers["retry-after"] == "1"
                    fake_worker.release.set()  # the admitted stream still finishes normally
                    rest = b"".join([c async for c in chunks])
            assert rest.endswith(b"data: [DONE]\n\n")
            assert b"server_shutting_down" not in rest
