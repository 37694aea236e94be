"""agentd's own HTTP/1.1 protocol (daemon/http/h1proto.py) over an in-memory stream pair: parsing
and its limits, request bodies, pipelining, keep-alive rules, response framing, disconnects, the
idle timer and the drain.  The socket-level behaviour is in tests/e2e/test_h1_sockets.py."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.http.h1proto import RESPOND, H1Connection, HeadError, parse_head
from daemon.http.hypercorn_close import HOLD_WRITE

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class Flag:
    def __init__(self) -> None:
        self.value = False

    def is_set(self) -> bool:
        return self.value


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, answers JSON with what it saw (content-length framed)."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message["body"]
        if not message["more_body"]:
            break
    payload = json.dumps(
        {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "body": body.decode("latin-1"),
            "version": scope["http_version"],
            "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, raw_head: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.raw_head = raw_head

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """The client end: sends raw bytes, parses responses (an independent, minimal parser)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = b""
        self.eof = False

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _more(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            self.eof = True
            raise EOFError
        self.buf += data

    async def response(self, head_only: bool = False) -> Response:
        while b"\r\n\r\n" not in self.buf:
            await self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.decode().lower()] = value.strip().decode()
        if head_only or status < 200 or status in (204, 304):
            return Response(status, headers, b"", head)
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n:
                await self._more()
            body, self.buf = self.buf[:n], self.buf[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    await self._more()
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line, 16)
                while len(self.buf) < size + 2:
                    await self._more()
                body += self.buf[:size]
                assert self.buf[size : size + 2] == b"\r\n"
                self.buf = self.buf[size + 2 :]
                if size == 0:
                    break
        else:  # close-delimited
            try:
                while True:
                    await self._more()
            except EOFError:
                pass
            body, self.buf = self.buf, b""
        return Response(status, headers, body, head)

    async def closed(self) -> bool:
        """True when the server closed the connection (after whatever is buffered)."""
        try:
            while True:
                await self._more()
        except EOFError:
            return True


def connection(
    app: App,
    stream: trio.abc.Stream,
    *,
    keep_alive: float = 75.0,
    max_head: int = 16384,
    terminated: Flag | None = None,
) -> H1Connection:
    return H1Connection(
        app,
        stream,
        keep_alive_timeout=keep_alive,
        max_head_bytes=max_head,
        terminated=terminated if terminated is not None else Flag(),
    )


async def exchange(
    app: App, data: bytes, count: int, close_wait: float = 10.0, **kwargs: Any
) -> tuple[list[Response], bool]:
    """Send ``data``, read ``count`` responses; and whether the server then closed within
    ``close_wait`` seconds (a bound for a close the test expects, generous for a loaded machine; a
    test that expects the connection kept open passes a short one: waiting longer changes nothing)."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(app, server_stream, **kwargs)
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(data)
        responses = [await client.response() for _ in range(count)]
        with trio.move_on_after(close_wait):
            closed = await client.closed()
            nursery.cancel_scope.cancel()
        if not client.eof:
            closed = False
            nursery.cancel_scope.cancel()
    return responses, closed


GET = b"GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n"


# ---------------------------------------------------------------------- the head parser
def test_parse_head_builds_the_scope() -> None:
    head = b"POST /v1/x%20y?q=1&r HTTP/1.1\r\nHost: h\r\nX-A:  v \r\ncontent-length: 3"
    request = parse_head(head, ("1.2.3.4", 5), ("127.0.0.1", 80))
    scope = request.scope
    assert scope["method"] == "POST"
    assert scope["path"] == "/v1/x y"
    assert scope["raw_path"] == b"/v1/x%20y"
    assert scope["query_string"] == b"q=1&r"
    assert scope["http_version"] == "1.1"
    assert scope["headers"] == [(b"host", b"h"), (b"x-a", b"v"), (b"content-length", b"3")]
    assert scope["client"] == ("1.2.3.4", 5)
    assert request.length == 3 and not request.chunked and request.keep_alive


def test_parse_head_keeps_the_case_of_the_method() -> None:
    """Methods are case-sensitive (RFC 9110 §9.1): the parser passes ``post`` on as sent and the
    application answers it with a 405 (docs/operations.md §14), instead of serving it as POST."""
    request = parse_head(b"post /v1/chat/completions HTTP/1.1\r\nhost: h", None, None)
    assert request.scope["method"] == "post"


def test_parse_head_takes_the_path_of_an_absolute_form_target_and_refuses_two_hosts() -> None:
    """RFC 9112 §3.2.2 (a client behind an HTTP proxy sends ``http://host/path``; before, Quart saw
    ``/host/path``) and §3.2 (more than one host header; before, accepted)."""
    request = parse_head(b"POST http://agentd:3001/v1/chat/completions?x=1 HTTP/1.1\r\nhost: h", None, None)
    assert (request.scope["path"], request.scope["query_string"]) == ("/v1/chat/completions", b"x=1")
    assert parse_head(b"GET HTTPS://agentd HTTP/1.1\r\nhost: h", None, None).scope["path"] == "/"
    for target in (b"*", b"v1/models", b"http:/v1/models"):
        with pytest.raises(HeadError) as caught:
            parse_head(b"OPTIONS " + target + b" HTTP/1.1\r\nhost: h", None, None)
        assert (caught.value.status, caught.value.code) == (400, "invalid_request_line")
    with pytest.raises(HeadError) as caught:
        parse_head(b"GET / HTTP/1.1\r\nhost: a\r\nhost: b", None, None)
    assert (caught.value.status, caught.value.param) == (400, "host")


def test_parse_head_keep_alive_rules() -> None:
    assert not parse_head(b"GET / HTTP/1.1\r\nhost: h\r\nconnection: keep-alive, Close", None, None).keep_alive
    assert not parse_head(b"GET / HTTP/1.0", None, None).keep_alive  # HTTP/1.0 closes (as h11)
    assert parse_head(b"GET / HTTP/1.1\r\nhost: h", None, None).keep_alive
    assert parse_head(b"PUT / HTTP/1.1\r\nhost: h\r\nExpect: 100-Continue", None, None).expect_continue
    assert not parse_head(b"PUT / HTTP/1.0\r\nExpect: 100-continue", None, None).expect_continue


@pytest.mark.parametrize(
    ("head", "param", "code"),
    [
        (b"GARBAGE", None, "invalid_request_line"),
        (b"GET  / HTTP/1.1\r\nhost: h", None, "invalid_request_line"),
        (b"GET / HTTP/1.2\r\nhost: h", None, "unsupported_http_version"),
        (b"PRI * HTTP/2.0", None, "unsupported_http_version"),
        (b"G(T / HTTP/1.1\r\nhost: h", None, "invalid_request_line"),
        (b"GET /\x01 HTTP/1.1\r\nhost: h", None, "invalid_request_line"),
        (b"GET / HTTP/1.1", "host", "invalid_header"),
        (b"GET / HTTP/1.1\r\nhost: h\r\n folded", None, "invalid_header"),
        (b"GET / HTTP/1.1\r\nhost: h\r\nbad name: v", None, "invalid_header"),
        (b"GET / HTTP/1.1\r\nhost: h\r\nnocolon", None, "invalid_header"),
        (b"GET / HTTP/1.1\r\nhost: h\r\nx: a\x00b", "headers.x", "invalid_header"),
        (b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 1x", "content-length", "invalid_header"),
        (b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 1\r\ncontent-length: 2", "content-length", "invalid_header"),
        (b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: -1", "content-length", "invalid_header"),
        (
            b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 1\r\ntransfer-encoding: chunked",
            "transfer-encoding",
            "invalid_header",
        ),
        (b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: gzip, chunked", "transfer-encoding", "invalid_header"),
        (b"POST / HTTP/1.0\r\ntransfer-encoding: chunked", "transfer-encoding", "invalid_header"),
    ],
)
def test_parse_head_rejects_malformed_heads(head: bytes, param: str | None, code: str) -> None:
    with pytest.raises(HeadError) as caught:
        parse_head(head, None, None)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert caught.value.code == code
    payload = json.loads(caught.value.response().split(b"\r\n\r\n", 1)[1])
    assert payload["error"]["param"] == param and payload["error"]["code"] == code


def test_repeated_equal_content_lengths_are_one() -> None:
    request = parse_head(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 4\r\nContent-Length: 4, 4", None, None)
    assert request.length == 4


# ---------------------------------------------------------------------- exchanges
async def test_pipelined_requests_are_answered_in_order() -> None:
    data = (
        b"\r\nPOST /one HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
        + b"POST /two HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nT: x\r\n\r\n"
        + GET
    )
    responses, closed = await exchange(echo, data, 3, close_wait=1.0)
    assert [r.json()["path"] for r in responses] == ["/one", "/two", "/a"]
    assert [r.json()["body"] for r in responses] == ["hello", "abcde", ""]
    assert responses[2].json()["query"] == "x=1"
    assert all(r.status == 200 and "connection" not in r.headers and "date" in r.headers for r in responses)
    assert not closed  # keep-alive: the connection waits for more


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=12), st.booleans())
def test_any_split_of_the_byte_stream_gives_the_same_answers(cuts: list[int], lf_only: bool) -> None:
    body = b'{"k": "' + b"v" * 300 + b'"}'
    parts = (body[:100], body[100:101], body[101:])
    chunked = b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"
    eol = b"\n" if lf_only else b"\r\n"
    data = (
        b"POST /p HTTP/1.1" + eol + b"Host: h" + eol + b"Content-Length: %d" % len(body) + eol + eol + body
        + b"POST /c HTTP/1.1" + eol + b"Host: h" + eol + b"Transfer-Encoding: chunked" + eol + eol + chunked
        + b"GET /g HTTP/1.1" + eol + b"Host: h" + eol + eol
    )  # fmt: skip
    pieces = []
    rest = data
    for cut in cuts:
        pieces.append(rest[:cut])
        rest = rest[cut:]
    pieces.append(rest)

    async def main() -> list[Any]:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        conn = connection(echo, server_stream)
        client = Client(client_stream)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            for piece in pieces:
                if piece:
                    await client.send(piece)
                    await trio.testing.wait_all_tasks_blocked()
            answers = [(await client.response()).json() for _ in range(3)]
            nursery.cancel_scope.cancel()
        return answers

    answers = trio.run(main)
    assert [(a["method"], a["path"], a["body"]) for a in answers] == [
        ("POST", "/p", body.decode()),
        ("POST", "/c", body.decode()),
        ("GET", "/g", ""),
    ]


async def test_an_oversized_head_is_a_json_431_and_closes() -> None:
    data = b"GET / HTTP/1.1\r\nHost: h\r\nx-big: " + b"a" * 3000 + b"\r\n\r\n"
    responses, closed = await exchange(echo, data, 1, max_head=2048)
    assert responses[0].status == 431
    assert responses[0].json()["error"]["code"] == "request_head_too_large"
    assert responses[0].headers["connection"] == "close"
    assert closed


async def test_an_oversized_head_arriving_slowly_is_a_431() -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(echo, server_stream, max_head=1024)
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(b"GET / HTTP/1.1\r\nHost: h\r\n")
        sent = 0
        try:
            for _ in range(20):
                await client.send(b"x-a: " + b"b" * 90 + b"\r\n")
                sent += 1
                await trio.testing.wait_all_tasks_blocked()
        except trio.BrokenResourceError:  # the server answered and closed
            pass
        assert 9 <= sent < 20  # over 1024 bytes after about ten lines, never all of them
        response = await client.response()
        assert response.status == 431
        assert await client.closed()


async def test_a_malformed_request_is_a_json_400_after_the_good_ones() -> None:
    responses, closed = await exchange(echo, GET + b"GET / HTTP/9.9\r\nHost: h\r\n\r\n", 2)
    assert responses[0].status == 200
    assert responses[1].status == 400
    assert responses[1].json()["error"]["code"] == "unsupported_http_version"
    assert closed


async def test_a_malformed_chunked_body_is_a_json_400() -> None:
    data = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    responses, closed = await exchange(echo, data, 1)
    assert responses[0].status == 400
    assert responses[0].json()["error"] == {
        "message": "malformed chunk size b'zz'",
        "type": "invalid_request_error",
        "param": "transfer-encoding",
        "code": "invalid_body",
    }
    assert closed


async def test_http_1_0_closes_and_a_body_without_length_ends_with_the_connection() -> None:
    async def stream(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"part1 ", "more_body": True})
        await send({"type": "http.response.body", "body": b"part2"})

    responses, closed = await exchange(stream, b"GET / HTTP/1.0\r\n\r\n", 1)
    assert responses[0].body == b"part1 part2"
    assert responses[0].headers["connection"] == "close"
    assert "transfer-encoding" not in responses[0].headers
    assert closed
    responses, closed = await exchange(stream, GET, 1, close_wait=1.0)  # HTTP/1.1: chunked, kept alive
    assert responses[0].headers["transfer-encoding"] == "chunked"
    assert responses[0].body == b"part1 part2"
    assert not closed


async def test_connection_close_from_the_client() -> None:
    responses, closed = await exchange(echo, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" + GET, 1)
    assert responses[0].headers["connection"] == "close"
    assert closed


async def test_head_has_no_body() -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(echo, server_stream)
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n" + GET)
        head = await client.response(head_only=True)
        assert head.status == 200 and int(head.headers["content-length"]) > 0  # the echo's length...
        following = await client.response()  # ...but no body: the next response follows the head
        assert following.json()["path"] == "/a"
        nursery.cancel_scope.cancel()


async def test_expect_100_continue_is_answered_when_the_app_reads() -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(echo, server_stream)
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        interim = await client.response(head_only=True)
        assert interim.status == 100
        await client.send(b"ok")
        final = await client.response()
        assert final.json()["body"] == "ok"
        nursery.cancel_scope.cancel()


async def test_no_100_continue_when_the_app_answers_without_reading() -> None:
    async def refuse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b'{"error": "too large"}'
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    data = b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n"
    responses, closed = await exchange(refuse, data, 1)
    assert responses[0].status == 413
    # the body was not read: the connection cannot carry another request
    assert responses[0].headers["connection"] == "close"
    assert closed


async def test_the_head_is_held_with_hold_write_and_leaves_with_the_body() -> None:
    writes: list[bytes] = []

    class Recording(trio.abc.HalfCloseableStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def send_all(self, data: Any) -> None:
            writes.append(bytes(data))
            await self.inner.send_all(data)

        async def wait_send_all_might_not_block(self) -> None:
            await self.inner.wait_send_all_might_not_block()

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            return bytes(await self.inner.receive_some(max_bytes))

        async def send_eof(self) -> None:
            await self.inner.aclose()

        async def aclose(self) -> None:
            await self.inner.aclose()

    async def held(scope: dict[str, Any], receive: Any, send: Any) -> None:
        token = HOLD_WRITE.set(True)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        finally:
            HOLD_WRITE.reset(token)
        await send({"type": "http.response.body", "body": b"hi"})

    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(held, Recording(server_stream))
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(GET)
        response = await client.response()
        nursery.cancel_scope.cancel()
    assert response.body == b"hi"
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n\r\nhi")


async def test_the_app_sees_the_disconnect_while_it_streams(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[tuple[str, float]] = []

    async def streaming(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # the (empty) body
        await send({"type": "http.response.start", "status": 200, "headers": []})

        async def watch() -> None:
            message = await receive()
            seen.append((message["type"], trio.current_time()))
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            while True:
                await send({"type": "http.response.body", "body": b"tick", "more_body": True})
                await trio.sleep(1)

    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(streaming, server_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client_stream.send_all(GET)
        await trio.sleep(2.5)
        await client_stream.aclose()
    assert seen == [("http.disconnect", 2.5)]


async def test_the_disconnect_watch_returns_once_the_response_is_complete() -> None:
    order: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()

        async def watch() -> None:
            message = await receive()
            order.append(message["type"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.testing.wait_all_tasks_blocked()
            await send({"type": "http.response.start", "status": 204, "headers": []})
            order.append("sent start")
            await send({"type": "http.response.body", "body": b""})
            order.append("sent body")

    responses, closed = await exchange(app, GET + GET, 2, close_wait=1.0)
    assert [r.status for r in responses] == [204, 204]
    assert order == ["sent start", "sent body", "http.disconnect"] * 2
    assert not closed


async def test_an_idle_connection_closes_after_the_keep_alive_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(echo, server_stream, keep_alive=5.0)
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await trio.sleep(3)
        await client.send(GET)  # a request at 3 s re-arms the timer after its response
        await client.response()
        assert await client.closed()
        assert trio.current_time() == 8.0
    # a head that never completes is idle too
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(echo, server_stream, keep_alive=5.0)
    client = Client(client_stream)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(b"GET / HTTP/1.1\r\n")
        await trio.sleep(4)
        await client.send(b"Host: h\r\n")
        assert await client.closed()
        assert trio.current_time() - start == 5.0


@pytest.mark.parametrize(
    ("start", "message"),
    [
        # a TLS ClientHello's first bytes: an https:// client on this plain-HTTP port
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(32), "not TLS"),
        (b"GE(T", "malformed request line"),  # no method holds '('
        (b"\r\n\x00\x01", "malformed request line"),
    ],
    ids=["tls-client-hello", "bad-method-byte", "binary"],
)
async def test_a_head_that_cannot_be_a_request_is_refused_at_once(
    autojump_clock: trio.testing.MockClock, start: bytes, message: str
) -> None:
    # before, such bytes waited for a head end that never comes: the client got a bare close
    # after the whole keep_alive_timeout
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(echo, server_stream, keep_alive=75.0)
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(start)
        response = await client.response()
        assert response.status == 400 and response.headers["connection"] == "close"
        error = response.json()["error"]
        assert error["code"] == "invalid_request_line" and message in error["message"]
        assert await client.closed()
        assert trio.current_time() == 0.0


async def test_a_method_still_arriving_is_waited_for(autojump_clock: trio.testing.MockClock) -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(echo, server_stream, keep_alive=75.0)
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(b"\r\nPO")  # a prefix of a method, token bytes only: not refused
        await trio.sleep(1)
        await client.send(b"ST /a HTTP/1.1\r\nHost: h\r\ncontent-length: 0\r\n\r\n")
        response = await client.response()
        assert response.status == 200 and response.json()["method"] == "POST"
        nursery.cancel_scope.cancel()


async def test_the_drain_closes_idle_connections_and_marks_responses_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    terminated = Flag()
    release = trio.Event()

    async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await release.wait()
        await echo(scope, receive, send)

    busy_client, busy_server = trio.testing.memory_stream_pair()
    idle_client, idle_server = trio.testing.memory_stream_pair()
    busy = connection(slow, busy_server, terminated=terminated)
    idle = connection(slow, idle_server, terminated=terminated)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(busy.run)
        nursery.start_soon(idle.run)
        await busy_client.send_all(GET)
        await trio.sleep(1)
        terminated.value = True
        busy.drain()
        idle.drain()
        assert await Client(idle_client).closed()
        assert trio.current_time() == 1.0  # at once
        release.set()
        client = Client(busy_client)
        response = await client.response()
        assert response.status == 200 and response.headers["connection"] == "close"
        assert await client.closed()


async def test_an_app_failure_is_a_json_500() -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    responses, closed = await exchange(broken, GET, 1)
    assert responses[0].status == 500
    assert responses[0].json()["error"]["code"] == "internal_error"
    assert responses[0].headers["connection"] == "close"  # said, so a keep-alive client does not reuse it
    assert closed


async def test_an_app_that_answers_nothing_is_a_json_500_that_closes() -> None:
    async def silent(scope: dict[str, Any], receive: Any, send: Any) -> None:
        return None

    responses, closed = await exchange(silent, GET, 1)
    assert responses[0].status == 500
    assert responses[0].headers["connection"] == "close"
    assert closed


# ---------------------------------------------------------------------- the setting
def test_http1_implementation_is_validated_by_config_and_start(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from daemon.cli import main
    from daemon.config import HTTP1_ENV

    monkeypatch.delenv(HTTP1_ENV, raising=False)
    config = tmp_path / "agentd.toml"
    config.write_text('[server]\nhttp1_implementation = "h2"\n')
    assert main(["check-config", str(config)]) == 2
    assert "server.http1_implementation" in capsys.readouterr().err
    config.write_text('[server]\nhttp1_implementation = "hypercorn"\nport = 0\n')
    monkeypatch.setenv(HTTP1_ENV, "h11")
    assert main(["start", "--config", str(config)]) == 2
    assert f"{HTTP1_ENV}: must be one of agentd, hypercorn, got 'h11'" in capsys.readouterr().err


async def _served_bytes(app: App, request: bytes) -> bytes:
    """Everything the server wrote for ``request`` (the client half-closes after sending it)."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(app, server_stream)
    out = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client_stream.send_all(request)
        await client_stream.send_eof()
        while data := await client_stream.receive_some(65536):
            out += data
    return out


@pytest.mark.parametrize(
    ("request_bytes", "status", "headers", "body"),
    [
        (b"POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\n{}", 200, [(b"content-length", b"5")], b"hello"),
        (b"POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\n{}", 200, [(b"content-type", b"text/x")], b"hi"),
        (b"HEAD /a HTTP/1.1\r\nhost: h\r\n\r\n", 200, [(b"content-length", b"5")], b"hello"),
        (b"GET /a HTTP/1.1\r\nhost: h\r\n\r\n", 204, [], b""),
        (b"GET /a HTTP/1.0\r\n\r\n", 200, [(b"x-a", b"1")], b"plain"),
        (b"GET /a HTTP/1.1\r\nhost: h\r\n\r\n", 200, [(b"content-length", b"9")], b"short"),
        (b"GET /a HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n", 404, [(b"content-length", b"0")], b""),
    ],
)
async def test_respond_writes_what_start_and_one_body_message_write(
    request_bytes: bytes, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    writes: list[str] = []

    async def by_messages(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        token = HOLD_WRITE.set(True)
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
        finally:
            HOLD_WRITE.reset(token)
        await send({"type": "http.response.body", "body": body})
        writes.append("messages")

    async def by_respond(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await scope["extensions"][RESPOND](status, headers, body)
        writes.append("respond")

    with trio.fail_after(5):
        expected = await _served_bytes(by_messages, request_bytes)
        got = await _served_bytes(by_respond, request_bytes)
    assert writes == ["messages", "respond"]
    strip = re.compile(rb"date: [^\r]*\r\n")  # the date header may tick between the two
    assert strip.sub(b"", got) == strip.sub(b"", expected)
    assert got.startswith(b"HTTP/1.1 %d " % status)


async def test_respond_after_a_start_is_refused() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        with pytest.raises(RuntimeError):
            await scope["extensions"][RESPOND](200, [], b"")
        await send({"type": "http.response.body", "body": b""})

    responses, _ = await exchange(app, GET, 1, close_wait=0.0)  # (kept alive: whether it closes is not the question)
    assert responses[0].status == 200


async def test_a_body_read_asks_for_no_more_than_the_rest_of_the_body() -> None:
    """A large body's later reads are sized to what is left of it (docs/benchmarks.md §10.2.8):
    never a 1 MiB buffer cut down afterwards; the bytes of the request that follows are read as
    before, and the app receives the same body."""
    asked: list[int | None] = []

    class Recording(trio.abc.HalfCloseableStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def send_all(self, data: Any) -> None:
            await self.inner.send_all(data)

        async def wait_send_all_might_not_block(self) -> None:
            await self.inner.wait_send_all_might_not_block()

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            asked.append(max_bytes)
            return bytes(await self.inner.receive_some(max_bytes))

        async def send_eof(self) -> None:
            await self.inner.aclose()

        async def aclose(self) -> None:
            await self.inner.aclose()

    body = b"x" * 200_000
    head = b"POST /e HTTP/1.1\r\nHost: h\r\ncontent-length: %d\r\n\r\n" % len(body)
    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = connection(echo, Recording(server_stream))
    client = Client(client_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send(head + body[: 65536 - len(head)])  # the first read fills its 64 KiB
        await trio.testing.wait_all_tasks_blocked()
        await client.send(body[65536 - len(head) :] + GET)  # the rest, and a pipelined request
        first = await client.response()
        second = await client.response()
        nursery.cancel_scope.cancel()
    assert first.json()["body"] == body.decode()
    assert second.status == 200 and second.json()["path"] == "/a"
    assert asked[0] == 65536
    # the body's next read: exactly what was left of it (was: 1 MiB)
    assert asked[1] == len(body) - (65536 - len(head))
    assert all(size is not None and size <= 65536 for size in asked[2:])


async def test_a_head_already_in_the_socket_is_read_without_the_idle_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The idle timer's cancel scope is entered only when the connection has to wait for the next
    request's bytes (docs/benchmarks.md §10.2.8): bytes already in the socket are taken at once.
    The requests are answered as before; the wait after them still closes at the idle timeout."""
    import daemon.http.h1proto as h1proto

    scopes: list[float] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(trio, name)

        @staticmethod
        def CancelScope(**kwargs: Any) -> trio.CancelScope:  # trio's name
            if "deadline" in kwargs:  # the idle timer's (the others are shields)
                scopes.append(kwargs["deadline"])
            return trio.CancelScope(**kwargs)

    monkeypatch.setattr(h1proto, "trio", Counting())
    a, b = trio.socket.socketpair()
    client_stream, server_stream = trio.SocketStream(a), trio.SocketStream(b)
    conn = connection(echo, server_stream, keep_alive=5.0)
    client = Client(client_stream)
    await client.send(GET + GET)  # two pipelined requests, in the socket before the server reads
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        responses = [await client.response() for _ in range(2)]
        await trio.testing.wait_all_tasks_blocked()
        idle = conn._idle
        nursery.cancel_scope.cancel()
    assert [r.status for r in responses] == [200, 200]
    assert [r.json()["path"] for r in responses] == ["/a", "/a"]
    # one scope: the wait for a third request (was: one for the first read as well)
    assert len(scopes) == 1 and idle is not None and idle.deadline == scopes[0]
