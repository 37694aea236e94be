"""A complete (non-stream) response leaves in one socket write: the sink holds the head back
(``HOLD_WRITE``) and the TCP server sends it with the body; a stream's head leaves at once."""

from __future__ import annotations

from typing import Any

import trio
from hypercorn.events import Closed, RawData

from daemon.http.app import AsgiSink
from daemon.http.hypercorn_close import HOLD_WRITE, PromptCloseTCPServer


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def send_all(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    async def aclose(self) -> None:
        pass


def server_with(stream: Recorder) -> PromptCloseTCPServer:
    server = PromptCloseTCPServer.__new__(PromptCloseTCPServer)  # only the write path is used
    server.stream = stream  # type: ignore[assignment]
    server.send_lock = trio.Lock()
    return server


async def test_held_bytes_leave_with_the_next_write() -> None:
    stream = Recorder()
    server = server_with(stream)
    token = HOLD_WRITE.set(True)
    await server.protocol_send(RawData(data=b"HTTP/1.1 200 OK\r\n\r\n"))
    HOLD_WRITE.reset(token)
    assert stream.writes == []
    await server.protocol_send(RawData(data=b"body"))
    await server.protocol_send(RawData(data=b"next"))
    assert stream.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"next"]


async def test_held_bytes_are_flushed_before_the_connection_closes() -> None:
    stream = Recorder()
    server = server_with(stream)
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    server._close = close  # type: ignore[method-assign]

    class Protocol:
        async def handle(self, event: object) -> None:
            pass

    server.protocol = Protocol()  # type: ignore[assignment]
    token = HOLD_WRITE.set(True)
    await server.protocol_send(RawData(data=b"head"))
    HOLD_WRITE.reset(token)
    await server.protocol_send(Closed())
    assert stream.writes == [b"head"] and closed == [True]


async def test_sink_holds_a_complete_response_head_but_not_a_stream_head() -> None:
    sent: list[tuple[str, bool]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append((message["type"], HOLD_WRITE.get()))

    sink = AsgiSink(send)
    await sink.start(200, [("content-type", "application/json"), ("content-length", "2")])
    assert sent == [] and sink.started
    await sink.end(b"{}")
    assert sent == [("http.response.start", True), ("http.response.body", False)]

    sent.clear()
    stream = AsgiSink(send)
    await stream.start(200, [("content-type", "text/event-stream")])
    assert sent == [("http.response.start", False)]
    await stream.send(b"data: 1\n\n")
    await stream.end()
    assert [hold for _, hold in sent] == [False, False, False]
