"""UpstreamTransport over real loopback sockets: relay, error mapping to httpx types."""

from __future__ import annotations

import socket

import httpx
import pytest
import trio
import trio.testing

from daemon.upstream import UpstreamTransport, map_httpx_error, upstream_limits


async def _serve_once(listener: trio.SocketListener, received: list[bytes], reply: bytes | None) -> None:
    stream = await listener.accept()
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        data += chunk
        received.append(chunk)
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
    reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\": 1}\r\n"
    transport = UpstreamTransport(upstream_limits())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_once, listener, received, reply)
        request = httpx.Request("POST", f"http://127.0.0.1:{port}/v1/completions", content=b'{"prompt": "x"}',
                                extensions={"timeout": httpx.Timeout(5.0).as_dict()})
        response = await transport.handle_async_request(request)
        body = await response.aread()
        await response.aclose()
    await transport.aclose()
    assert response.status_code == 200 and body == b'{"ok": 1}\r\n'
    assert len(received) == 1 and received[0].endswith(b'{"prompt": "x"}')  # one segment: head + body


async def test_upstream_transport_connection_refused_is_httpx_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    transport = UpstreamTransport(upstream_limits())
    request = httpx.Request("POST", f"http://127.0.0.1:{port}/x", content=b"{}")
    with pytest.raises(httpx.ConnectError) as info:
        await transport.handle_async_request(request)
    assert map_httpx_error("w@0", info.value).status == 502
    await transport.aclose()


async def test_upstream_transport_read_timeout_is_httpx_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = await _listener()
    port = listener.socket.getsockname()[1]
    transport = UpstreamTransport(upstream_limits())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_once, listener, [], None)
        request = httpx.Request("POST", f"http://127.0.0.1:{port}/x", content=b"{}",
                                extensions={"timeout": httpx.Timeout(30.0, connect=5.0).as_dict()})
        start = trio.current_time()
        with pytest.raises(httpx.ReadTimeout):
            await transport.handle_async_request(request)
        assert trio.current_time() - start == pytest.approx(30.0)
        nursery.cancel_scope.cancel()
    await transport.aclose()
