"""UpstreamTransport over real loopback sockets: relay, error mapping to httpx types.

Real sockets are the point here.  Real-clock tests use generous budgets (``BUDGET_SECONDS``,
never reached on success).  The read-timeout test runs on a frozen ``MockClock`` (no autojump)
and moves time by hand only once the request has fully reached the server, so no real I/O is
ever in flight when virtual time moves and the connect timeout can never fire.
"""

from __future__ import annotations

import socket
import threading

import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing

from daemon.upstream import UpstreamTransport, map_httpx_error, upstream_limits

BUDGET_SECONDS = 60.0  # generous real-time budget: a broken behaviour fails instead of hanging


async def _serve_once(
    listener: trio.SocketListener, received: list[bytes], reply: bytes | None, got_request: trio.Event | None = None
) -> None:
    stream = await listener.accept()
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        data += chunk
        received.append(chunk)
    if got_request is not None:
        got_request.set()
    if reply is None:
        await trio.sleep_forever()  # accept, read, never answer
    await stream.send_all(reply)
    await stream.aclose()


async def _listener() -> trio.SocketListener:
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    return listener


async def test_upstream_transport_sends_head_and_body_in_one_write_and_relays() -> None:
    listener = await _listener()
    port = listener.socket.getsockname()[1]
    received: list[bytes] = []
    reply = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok": 1}\r\n'
    transport = UpstreamTransport(upstream_limits())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_once, listener, received, reply)
        request = httpx.Request(
            "POST",
            f"http://127.0.0.1:{port}/v1/completions",
            content=b'{"prompt": "x"}',
            extensions={"timeout": httpx.Timeout(BUDGET_SECONDS).as_dict()},
        )
        response = await transport.handle_async_request(request)
        body = await response.aread()
        await response.aclose()
    await transport.aclose()
    await listener.aclose()
    assert response.status_code == 200 and body == b'{"ok": 1}\r\n'
    assert len(received) == 1 and received[0].endswith(b'{"prompt": "x"}')  # one segment: head + body


async def test_upstream_transport_connection_refused_is_httpx_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    transport = UpstreamTransport(upstream_limits())
    request = httpx.Request(
        "POST",
        f"http://127.0.0.1:{port}/x",
        content=b"{}",
        extensions={"timeout": httpx.Timeout(BUDGET_SECONDS).as_dict()},
    )
    with pytest.raises(httpx.ConnectError) as info:
        await transport.handle_async_request(request)
    assert map_httpx_error("w@0", info.value).status == 502
    await transport.aclose()


async def _real_time_guard(seconds: float, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` after ``seconds`` of *real* time (a thread waits: the mock clock stays frozen)."""
    never = threading.Event()
    try:
        await trio.to_thread.run_sync(never.wait, seconds, abandon_on_cancel=True)
    finally:
        never.set()  # lets an abandoned thread end at once
    scope.cancel()


async def test_upstream_transport_read_timeout_is_httpx_read_timeout(mock_clock: trio.testing.MockClock) -> None:
    listener = await _listener()
    port = listener.socket.getsockname()[1]
    transport = UpstreamTransport(upstream_limits())
    got_request = trio.Event()
    outcome: list[tuple[BaseException, float]] = []

    async def send(request: httpx.Request) -> None:
        try:
            await transport.handle_async_request(request)
        except httpx.TransportError as exc:
            outcome.append((exc, trio.current_time()))

    with trio.CancelScope() as guard:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_real_time_guard, BUDGET_SECONDS, guard)
            nursery.start_soon(_serve_once, listener, [], None, got_request)
            request = httpx.Request(
                "POST",
                f"http://127.0.0.1:{port}/x",
                content=b"{}",
                extensions={"timeout": httpx.Timeout(30.0, connect=5.0).as_dict()},
            )
            start = trio.current_time()
            nursery.start_soon(send, request)
            await got_request.wait()  # connected and written on a frozen clock: real I/O only
            await trio.testing.wait_all_tasks_blocked()  # the client now waits for the answer
            mock_clock.jump(30.0 - 0.001)
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []  # not before the read timeout
            mock_clock.jump(0.001)
            while not outcome:
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught, "real-time budget ran out"
    [(exc, failed_at)] = outcome
    assert isinstance(exc, httpx.ReadTimeout)
    assert failed_at - start == pytest.approx(30.0)
    await transport.aclose()
    await listener.aclose()
