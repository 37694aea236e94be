"""The proxy's fast path to plain-HTTP workers (``UpstreamTransport.post``, ``LeanResponse``,
``UpstreamBody.read_all``; docs/benchmarks.md §10.2.4): the same bytes on the wire as the httpx
path for any header list (Hypothesis), and over real sockets the same answers - a complete body
that came with its head, one that did not, a chunked one, a gzip one (decoded, as httpx does), a
stream and a worker error through the whole proxy."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.h1client import LeanResponse, RawHeaders, request_bytes
from daemon.upstream import UpstreamTransport, _post_fields, client_headers, upstream_limits

BUDGET = 30.0

_NAMES = st.sampled_from(
    ["x-a", "X-B", "authorization", "Authorization", "content-length", "Content-Type", "host", "x-request-id"]
)
_VALUES = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    headers=st.lists(st.tuples(_NAMES, _VALUES), max_size=6),
    content=st.binary(max_size=40),
    authorization=st.one_of(st.none(), st.just("Bearer k")),
    port=st.sampled_from([None, 80, 8000]),
)
def test_post_sends_the_bytes_of_the_httpx_path(
    headers: list[tuple[str, str]], content: bytes, authorization: str | None, port: int | None
) -> None:
    url = httpx.URL("http://127.0.0.1" + ("" if port is None else f":{port}") + "/v1/chat/completions?x=1")
    request = httpx.Request("POST", url, headers=headers, content=content)
    if authorization is not None:  # what UpstreamTransport.handle_async_request does
        request.headers["authorization"] = authorization
    expected = request_bytes(b"POST", url.raw_path, request.headers.raw, content)
    transport = UpstreamTransport(upstream_limits(), api_key=None if authorization is None else "k")
    target = transport.lean_target(url)
    assert target is not None
    fields = _post_fields(target.netloc, headers, len(content), authorization)
    assert request_bytes(b"POST", target.raw_path, fields, content) == expected


def test_no_lean_target_for_tls_or_credentials_in_the_url() -> None:
    transport = UpstreamTransport(upstream_limits())
    assert transport.lean_target(httpx.URL("https://w:8000/v1/x")) is None
    assert transport.lean_target(httpx.URL("http://u:p@w:8000/v1/x")) is None
    target = transport.lean_target(httpx.URL("http://w/v1/x"))
    assert target is not None and target.key == ("w", 80) and target.netloc == b"w"


def test_raw_headers_get_is_httpx_headers_get() -> None:
    raw = [(b"Content-Type", b"text/event-stream"), (b"x-a", b"1"), (b"X-A", b"2")]
    ours, theirs = RawHeaders(raw), httpx.Headers(raw)
    for name in ("content-type", "X-A", "missing"):
        assert ours.get(name, "") == theirs.get(name, "")
    assert client_headers(ours) == client_headers(theirs)


class Worker:
    """Answers each request with the next reply, each sent in the given pieces."""

    def __init__(self, replies: list[list[bytes]]) -> None:
        self.replies = replies
        self.requests: list[bytes] = []

    async def serve(self, listener: trio.SocketListener) -> None:
        stream = await listener.accept()
        buf = b""
        for pieces in self.replies:
            while b"\r\n\r\n" not in buf:
                buf += await stream.receive_some(65536)
            head, _, rest = buf.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(rest) < length:
                rest += await stream.receive_some(65536)
            self.requests.append(head + b"\r\n\r\n" + rest[:length])
            buf = rest[length:]
            for piece in pieces:
                await stream.send_all(piece)
                await trio.sleep(0.01)  # the pieces arrive in separate reads
        await trio.sleep_forever()


def _reply(body: bytes, *extra: bytes, split: bool = False) -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + b"".join(extra)
    head += b"content-length: %d\r\n\r\n" % len(body)
    return [head, body] if split else [head + body]


async def _post_all(replies: list[list[bytes]]) -> tuple[list[Any], Worker, UpstreamTransport]:
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    worker = Worker(replies)
    transport = UpstreamTransport(upstream_limits())
    target = transport.lean_target(httpx.URL(f"http://127.0.0.1:{port}/v1/chat/completions"))
    assert target is not None
    out: list[Any] = []
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve, listener)
            for _ in replies:
                response = await transport.post(target, [("content-type", "application/json")], b"{}", {})
                out.append((response, await response.aread()))
                await response.aclose()
            nursery.cancel_scope.cancel()
    await transport.aclose()
    return out, worker, transport


async def test_complete_bodies_with_and_without_the_head_reuse_the_connection() -> None:
    chunked = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n", b"0\r\n\r\n"]
    replies = [_reply(b'{"a": 1}'), _reply(b'{"b": 22}', split=True), chunked, _reply(b"{}")]
    out, worker, transport = await _post_all(replies)
    assert [body for _, body in out] == [b'{"a": 1}', b'{"b": 22}', b"hello", b"{}"]
    assert all(isinstance(response, LeanResponse) and response.status_code == 200 for response, _ in out)
    assert len(worker.requests) == 4  # one connection served all four
    assert worker.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert worker.requests[0].endswith(b"\r\ncontent-type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    assert transport.pool.open_connections == 0


async def test_a_gzip_body_is_decoded_as_httpx_does() -> None:
    out, _, _ = await _post_all([_reply(gzip.compress(b'{"z": 1}'), b"content-encoding: gzip\r\n")])
    [(response, body)] = out
    assert isinstance(response, httpx.Response) and body == b'{"z": 1}'


async def test_a_body_longer_than_its_length_is_cut_and_the_connection_not_reused() -> None:
    replies = [[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}xx"], _reply(b"{}")]
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    transport = UpstreamTransport(upstream_limits())
    target = transport.lean_target(httpx.URL(f"http://127.0.0.1:{port}/v1/x"))
    assert target is not None
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Worker(replies).serve, listener)
            response = await transport.post(target, [], b"{}", {})
            assert await response.aread() == b"{}"
            await response.aclose()
            assert transport.pool.idle_connections() == 0  # more than the framing said: dropped
            nursery.cancel_scope.cancel()
    await transport.aclose()


async def test_lean_response_reads_once() -> None:
    out, _, _ = await _post_all([_reply(b"{}")])
    [(response, body)] = out
    assert response.content == body == b"{}" and response.is_stream_consumed
    assert await response.aread() == b"{}"
    with pytest.raises(httpx.StreamConsumed):
        async for _ in response.aiter_raw():
            pass


# ------------------------------------------------------------------ through the proxy
class StatusWorker:
    """A worker served by agentd's HTTP/1.1 protocol: the status and body named by the prompt."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                done = message["type"] == "lifespan.shutdown"
                await send({"type": "lifespan.shutdown.complete" if done else "lifespan.startup.complete"})
                if done:
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] != "/v1/chat/completions":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        status, text = json.loads(body)["messages"][0]["content"].split(" ", 1)
        payload = text.encode()
        headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(payload))]
        await send({"type": "http.response.start", "status": int(status), "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def test_worker_errors_through_the_lean_path() -> None:
    from functools import partial

    from daemon.config import AgentdConfig, RoutingConfig, ServerConfig
    from daemon.http.serve import serve_http
    from daemon.supervisor import run_daemon

    stop = trio.Event()
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            worker_url = await nursery.start(serve_http, StatusWorker(), "127.0.0.1", 0, 1.0, stop.wait)
            cfg = AgentdConfig(server=ServerConfig(port=0), routing=RoutingConfig(worker_urls=(worker_url,)))
            handles = await nursery.start(partial(run_daemon, cfg))

            def chat(content: str) -> dict[str, Any]:
                return {"model": "m", "messages": [{"role": "user", "content": content}]}

            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET) as client:
                ok = await client.post("/v1/chat/completions", json=chat("200 plain words"))
                failed = await client.post("/v1/chat/completions", json=chat("500 the engine fell over"))
                missing = await client.post("/v1/chat/completions", json=chat("404 no such thing"))
            assert (ok.status_code, ok.text, ok.headers["content-type"]) == (200, "plain words", "text/plain")
            assert failed.status_code == 502 and "the engine fell over" in failed.json()["error"]["message"]
            assert missing.status_code == 404 and missing.json()["error"]["message"].endswith("no such thing")
            handles.request_shutdown()
            stop.set()
