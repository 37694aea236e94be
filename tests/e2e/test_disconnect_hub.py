"""The client-disconnect watch of agentd's HTTP/1.1 protocol without a task per request
(daemon/http/h1proto.py ``DisconnectHub``, ``Exchange.watch_disconnect``, ``Exchange.take_body``;
docs/benchmarks.md §10.2.4), over real sockets: a client that closes or resets its connection
cancels the request it is waiting for, a close after the response never does, a reused
descriptor number is never confused with the closed connection's; and end to end through the
proxy with both protocols: a non-streamed request whose client leaves while the worker holds
it is cancelled upstream and its lease abandoned."""

from __future__ import annotations

import json
import random
import socket
import struct
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing
from native_fakes import FakeWorker, make_config

from daemon.config import HTTP1_ENV
from daemon.handles import DaemonHandles
from daemon.http.h1proto import DISCONNECT_WATCH, TAKE_BODY, DisconnectHub, disconnect_hub
from daemon.http.serve import serve_http
from daemon.supervisor import run_daemon

BUDGET = 30.0  # generous: a broken behaviour fails instead of hanging, success never nears it
POST = b"POST /x HTTP/1.1\r\nhost: localhost\r\ncontent-length: %d\r\n\r\n"


class WatchingApp:
    """Takes the body with ``take_body`` when it can, arms the disconnect watch and waits until it
    fires (or answers at once when ``answer`` is set, then waits for ``release``)."""

    def __init__(self, answer: bool = False) -> None:
        self.answer = answer
        self.bodies: list[bytes | None] = []
        self.fired: list[str] = []
        self.armed = trio.Event()
        self.release = trio.Event()
        self.done = trio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        taken = scope["extensions"][TAKE_BODY]()
        self.bodies.append(taken)
        if taken is None:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    break
            self.bodies.append(body)
        with trio.CancelScope() as cancel_scope:
            unwatch = scope["extensions"][DISCONNECT_WATCH](lambda: self.fired.append("gone") or cancel_scope.cancel())
            self.armed.set()
            try:
                if self.answer:
                    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
                    await send({"type": "http.response.body", "body": b"ok"})
                await self.release.wait()
            finally:
                unwatch()
        self.done.set()


async def start(nursery: trio.Nursery, app: WatchingApp) -> int:
    stop = trio.Event()
    url: str = await nursery.start(serve_http, app, "127.0.0.1", 0, 1.0, stop.wait)
    return int(url.rsplit(":", 1)[1])


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Checkpoint until ``predicate()`` holds (the caller bounds it with ``trio.fail_after``)."""
    while not predicate():
        await trio.testing.wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("reset", [False, True])
async def test_a_client_that_leaves_cancels_the_armed_request(reset: bool) -> None:
    app = WatchingApp()
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            port = await start(nursery, app)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(POST % 5 + b"hello")
            await app.armed.wait()
            if reset:  # SO_LINGER 0: the close is a reset
                stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await stream.aclose()
            await app.done.wait()
            assert app.bodies == [b"hello"]  # the body came with the head: taken at once
            assert app.fired == ["gone"]
            assert disconnect_hub().reports == 1
            nursery.cancel_scope.cancel()


async def test_a_close_after_the_complete_response_cancels_nothing() -> None:
    app = WatchingApp(answer=True)
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            port = await start(nursery, app)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(POST % 2 + b"hi")
            data = b""
            while not data.endswith(b"ok"):
                data += await stream.receive_some(4096)
            await stream.aclose()
            hub = disconnect_hub()
            await wait_until(lambda: hub.reports == 1)  # the hub saw the close ...
            app.release.set()
            await app.done.wait()
            assert app.fired == []  # ... and the complete response's watch was disarmed
            nursery.cancel_scope.cancel()


async def test_a_body_still_arriving_is_read_with_receive() -> None:
    app = WatchingApp(answer=True)
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            port = await start(nursery, app)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(POST % 10 + b"hello")
            await wait_until(lambda: bool(app.bodies))
            await stream.send_all(b"world")
            await app.armed.wait()
            assert app.bodies == [None, b"helloworld"]
            app.release.set()
            await app.done.wait()
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_expect_100_continue_is_not_taken_at_once() -> None:
    app = WatchingApp(answer=True)
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            port = await start(nursery, app)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            head = b"POST /x HTTP/1.1\r\nhost: localhost\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
            await stream.send_all(head + b"hi")
            data = b""
            while not data.endswith(b"ok"):
                data += await stream.receive_some(4096)
            assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
            assert app.bodies == [None, b"hi"]
            app.release.set()
            await app.done.wait()
            await stream.aclose()
            nursery.cancel_scope.cancel()


class Conn:
    def __init__(self) -> None:
        self.closed = 0

    def peer_closed(self) -> None:
        self.closed += 1


async def test_a_reused_descriptor_number_is_matched_to_its_connection() -> None:
    hub = DisconnectHub()
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hub.run)
            first, first_peer = socket.socketpair()
            fd = first.fileno()
            old, new = Conn(), Conn()
            assert hub.watch(old, fd)  # type: ignore[arg-type]
            first.close()  # agentd closed the socket: the kernel drops it from the set
            second, second_peer = socket.socketpair()
            if second.fileno() != fd:  # the descriptor number was not reused: nothing to check
                pytest.skip("the descriptor number was not reused")
            assert hub.watch(new, fd)  # type: ignore[arg-type]
            hub.unwatch(old, fd)  # the closed connection's late unwatch leaves the new one alone
            second_peer.close()
            await wait_until(lambda: new.closed > 0)
            assert (old.closed, new.closed, hub.reports) == (0, 1, 1)
            second.close()
            first_peer.close()
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ end to end through the proxy
class HoldingTransport(httpx.AsyncBaseTransport):
    """The worker: holds every chat completion until cancelled."""

    def __init__(self, worker: FakeWorker) -> None:
        self.inner = worker.transport()
        self.held = trio.Event()
        self.cancelled = trio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return await self.inner.handle_async_request(request)
        self.held.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


@pytest.mark.parametrize("http1", ["agentd", "hypercorn"])
async def test_a_client_leaving_a_held_complete_request_abandons_it(
    http1: str, fake_worker: FakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HTTP1_ENV, http1)
    transport = HoldingTransport(fake_worker)
    cfg = make_config(fake_worker.worker_urls)
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            handles: DaemonHandles = await nursery.start(
                partial(run_daemon, cfg, transport_factory=lambda _cfg=None: transport, rng=random.Random(3))
            )
            assert handles.http_url is not None
            port = int(handles.http_url.rsplit(":", 1)[1])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            await stream.send_all(head + b"content-length: %d\r\n\r\n" % len(body) + body)
            await transport.held.wait()
            assert handles.native_dispatcher.total_in_flight() == 1
            await stream.aclose()
            await transport.cancelled.wait()  # the upstream request was cancelled
            await wait_until(lambda: handles.native_dispatcher.statistics().abandoned_count >= 1)
            stats = handles.native_dispatcher.statistics()
            assert (stats.abandoned_count, stats.finished_count) == (1, 0)
            assert handles.native_dispatcher.total_in_flight() == 0
            if http1 == "agentd":
                assert disconnect_hub().reports >= 1
            handles.request_shutdown()
