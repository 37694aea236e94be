"""The streamed body written straight to the client socket (daemon/http/direct_body.py), through a
real hypercorn socket: the bytes on the wire are a valid chunked body equal to the worker's
events, the connection serves the next request (h11's state is right), and an HTTP/1.0 client
(no chunked framing) keeps the ASGI path with the same events."""

from __future__ import annotations

import json
import random
from functools import partial
from typing import Any

import pytest
import trio
from native_fakes import BUDGET_SECONDS, FakeWorker, make_config

import daemon.http.app as app_module
from daemon.h1client import ChunkedDecoder
from daemon.handles import DaemonHandles
from daemon.http.direct_body import DirectBody
from daemon.supervisor import run_daemon

BODY = json.dumps(
    {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
).encode()


async def _exchange(stream: trio.SocketStream, port: int, version: bytes, buf: bytearray) -> tuple[bytes, bytes]:
    """One request; (response head, decoded body).  HTTP/1.0: the body runs until the close."""
    await stream.send_all(
        b"POST /v1/chat/completions HTTP/" + version + b"\r\nhost: 127.0.0.1:%d\r\n" % port
        + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)
        + BODY
    )  # fmt: skip
    while b"\r\n\r\n" not in buf:
        data = await stream.receive_some(65536)
        assert data, "closed before the response head"
        buf += data
    end = buf.index(b"\r\n\r\n")
    head = bytes(buf[:end]).lower()
    del buf[: end + 4]
    if b"transfer-encoding: chunked" not in head:
        while data := await stream.receive_some(65536):
            buf += data
        body = bytes(buf)
        buf.clear()
        return head, body
    decoder = ChunkedDecoder()
    body = decoder.feed(bytes(buf))
    buf.clear()
    while not decoder.done:
        data = await stream.receive_some(65536)
        assert data, "closed inside the chunked body"
        body += decoder.feed(data)
    assert decoder.surplus == 0
    return head, body


@pytest.mark.parametrize("version", [b"1.1", b"1.0"])
async def test_streamed_body_on_the_wire(
    fake_worker: FakeWorker, monkeypatch: pytest.MonkeyPatch, version: bytes
) -> None:
    attached: list[DirectBody | None] = []
    real_attach = app_module.attach_direct_body

    def spy(send: Any) -> DirectBody | None:
        attached.append(real_attach(send))
        return attached[-1]

    monkeypatch.setattr(app_module, "attach_direct_body", spy)
    cfg = make_config(fake_worker.worker_urls)
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles: DaemonHandles = await nursery.start(
                partial(run_daemon, cfg, transport_factory=fake_worker.transport, rng=random.Random(7))
            )
            port = int(handles.http_url.rsplit(":", 1)[1])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            buf = bytearray()
            bodies = []
            async with stream:
                for _ in range(2 if version == b"1.1" else 1):  # keep-alive: the same connection
                    head, body = await _exchange(stream, port, version, buf)
                    assert head.startswith(b"http/1.1 200")
                    bodies.append(body)
            handles.request_shutdown()
    for body in bodies:
        events = [e for e in body.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        text = "".join(
            json.loads(e[6:])["choices"][0]["delta"].get("content", "")
            for e in events[:-1]
            if json.loads(e[6:]).get("choices")
        )
        assert text == "Hello world"
    if version == b"1.1":
        assert len(attached) == 2 and all(d is not None and d.writes >= 1 for d in attached)
    else:
        assert attached == [None]  # no chunked framing: hypercorn writes the body
