"""daemon.h1client: chunked decoding (property-based), framing, keep-alive reuse, errors.

Socket tests use real loopback servers written with raw Trio streams, so the bytes on the wire are
exactly the ones each test states.  Real-clock tests have a generous budget that a correct client
never reaches; the read-timeout test moves a frozen MockClock by hand, as in
test_upstream_transport.py.
"""

from __future__ import annotations

import math
import os
import threading
from collections import Counter
from collections.abc import Awaitable, Callable

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.h1client import ChunkedDecoder, H1Pool, UpstreamBody

BUDGET_SECONDS = 60.0


def _chunked(pieces: list[bytes], extension: bool, trailers: bool) -> bytes:
    out = b""
    for piece in pieces:
        out += f"{len(piece):x}".encode() + (b";name=value" if extension else b"") + b"\r\n" + piece + b"\r\n"
    return out + b"0\r\n" + (b"x-trailer: 1\r\n" if trailers else b"") + b"\r\n"


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.binary(min_size=1, max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
    extension=st.booleans(),
    trailers=st.booleans(),
    surplus=st.binary(max_size=5),
)
def test_chunked_decoder_any_split_gives_the_payload(
    pieces: list[bytes], cuts: list[int], extension: bool, trailers: bool, surplus: bytes
) -> None:
    wire = _chunked(pieces, extension, trailers)
    bounds = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    decoder = ChunkedDecoder()
    out = b""
    for a, b in zip(bounds, bounds[1:], strict=False):
        assert not decoder.done
        out += decoder.feed(wire[a:b])
    assert decoder.done and out == b"".join(pieces)
    decoder.feed(surplus)
    assert decoder.surplus == len(surplus)


@pytest.mark.parametrize("wire", [b"zz\r\nab\r\n", b"2\r\nabXY", b"\r\n", b"-1\r\n", b"1" * 5000])
def test_chunked_decoder_rejects_malformed_framing(wire: bytes) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        ChunkedDecoder().feed(wire)


# ---------------------------------------------------------------------------------------------
# over loopback sockets

Handler = Callable[[trio.SocketStream, bytes], Awaitable[bool]]  # -> keep the connection open


async def _read_request(stream: trio.SocketStream, buf: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    buf[:] = rest[length:]
    return head


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.heads: list[bytes] = []

    async def serve(self, listener: trio.SocketListener) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                self.accepted += 1
                nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        buf = bytearray()
        async with stream:
            while True:
                head = await _read_request(stream, buf)
                if head is None:
                    return
                self.heads.append(head)
                if not await self.handler(stream, head):
                    return


async def _with_server(handler: Handler, body: Callable[[H1Pool, str, Server], Awaitable[None]]) -> Server:
    server = Server(handler)
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
    pool = H1Pool(max_keepalive_connections=8, keepalive_expiry=5.0)
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, listener)
            try:
                await body(pool, url, server)
            finally:
                await pool.aclose()
                nursery.cancel_scope.cancel()
    return server


def _request(url: str, path: str = "/v1/x", method: str = "POST", timeout: float = BUDGET_SECONDS) -> httpx.Request:
    return httpx.Request(
        method,
        url + path,
        content=b"{}" if method == "POST" else None,
        extensions={"timeout": httpx.Timeout(timeout).as_dict()},
    )


def _reply(head: bytes, body: bytes) -> Handler:
    async def handler(stream: trio.SocketStream, request_head: bytes) -> bool:
        await stream.send_all(head + body)
        return b"connection: close" not in head.lower()

    return handler


async def test_keep_alive_reuses_one_connection_for_sequential_requests() -> None:
    async def body(pool: H1Pool, url: str, server: Server) -> None:
        for _ in range(3):
            response = await pool.request(_request(url))
            assert await response.aread() == b"hello"
            await response.aclose()
        assert pool.idle_connections() == 1

    server = await _with_server(_reply(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", b"hello"), body)
    assert server.accepted == 1 and len(server.heads) == 3
    assert server.heads[0].startswith(b"POST /v1/x HTTP/1.1\r\n")
    assert b"content-length: 2" in server.heads[0].lower() and b"host: 127.0.0.1" in server.heads[0].lower()


async def test_connection_close_and_unread_bodies_are_never_reused() -> None:
    async def body(pool: H1Pool, url: str, server: Server) -> None:
        response = await pool.request(_request(url))
        assert await response.aread() == b"hello"
        await response.aclose()
        assert pool.idle_connections() == 0  # the server said close
        response = await pool.request(_request(url))
        await response.aclose()  # body never read: the connection is closed, not pooled
        assert pool.idle_connections() == 0

    server = await _with_server(
        _reply(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\n", b"hello"), body
    )
    assert server.accepted == 2


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        return False  # close after answering, without saying so

    def _appender(into: list[bytes]) -> Callable[[bytes], Awaitable[None]]:
        async def collect(piece: bytes) -> None:
            into.append(piece)

        return collect

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        for _ in range(2):
            response = await pool.request(_request(url))
            assert await response.aread() == b"ok"
            await response.aclose()
            assert pool.idle_connections() == 1
            await trio.testing.wait_all_tasks_blocked()  # the server task has closed its end
            assert [c.stream.socket.is_readable() for stack in pool._idle.values() for c in stack] == [True]

    server = await _with_server(handler, body)
    assert server.accepted == 2  # the second request saw the closed idle socket and reconnected


@pytest.mark.parametrize("use_pump", [False, True])
async def test_chunked_stream_is_decoded_and_the_connection_reused(use_pump: bool) -> None:
    events = [b"data: %d\n\n" % i for i in range(5)]

    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for event in events:
            await stream.send_all(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        await stream.send_all(b"0\r\n\r\n")
        return True

    def _appender(into: list[bytes]) -> Callable[[bytes], Awaitable[None]]:
        async def collect(piece: bytes) -> None:
            into.append(piece)

        return collect

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        for _ in range(2):
            response = await pool.request(_request(url))
            assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
            got: list[bytes] = []
            if use_pump:
                assert isinstance(response.stream, UpstreamBody)

                await response.stream.pump(_appender(got))
            else:
                got = [piece async for piece in response.aiter_raw()]
            await response.aclose()
            assert b"".join(got) == b"".join(events)
        assert pool.idle_connections() == 1

    server = await _with_server(handler, body)
    assert server.accepted == 1


@pytest.mark.parametrize(
    ("reply", "framing"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", "length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel", "chunked"),
    ],
)
async def test_a_body_cut_short_is_a_remote_protocol_error(reply: bytes, framing: str) -> None:
    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(reply)
        return False

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        response = await pool.request(_request(url))
        with pytest.raises(httpx.RemoteProtocolError):
            await response.aread()
        await response.aclose()
        assert pool.idle_connections() == 0

    await _with_server(handler, body)


async def test_body_until_close_interim_responses_and_no_body_statuses() -> None:
    replies = iter(
        [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\nx-a: 1\r\n\r\nuntil the end",
            b"HTTP/1.1 204 No Content\r\nx-b:   spaced  \r\n\r\n",
        ]
    )

    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(next(replies))
        return head.startswith(b"GET")  # the until-close reply ends with the connection

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        response = await pool.request(_request(url))
        assert response.status_code == 200 and response.headers["x-a"] == "1"
        assert await response.aread() == b"until the end"
        await response.aclose()
        response = await pool.request(_request(url, method="GET"))
        assert response.status_code == 204 and response.headers["x-b"] == "spaced"
        assert await response.aread() == b""
        await response.aclose()

    await _with_server(handler, body)


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno-colon-here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nx",
    ],
)
async def test_malformed_heads_are_remote_protocol_errors(reply: bytes) -> None:
    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(reply)
        return False

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        with pytest.raises(httpx.RemoteProtocolError):
            await pool.request(_request(url))
        assert pool.idle_connections() == 0

    await _with_server(handler, body)


async def test_server_closing_without_an_answer_is_a_remote_protocol_error() -> None:
    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        return False

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await pool.request(_request(url))

    await _with_server(handler, body)


async def _real_time_guard(seconds: float, scope: trio.CancelScope) -> None:
    never = threading.Event()
    try:
        await trio.to_thread.run_sync(never.wait, seconds, abandon_on_cancel=True)
    finally:
        never.set()
    scope.cancel()


async def test_pump_read_timeout_counts_only_the_wait_for_the_worker(mock_clock: trio.testing.MockClock) -> None:
    """A 30 s read timeout: the handler's own time does not count, a 30 s silence does."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
    first_sent = trio.Event()

    async def serve() -> None:
        stream = await listener.accept()
        await _read_request(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        first_sent.set()
        await trio.sleep_forever()

    pool = H1Pool(8, 5.0)
    outcome: list[tuple[BaseException | None, float]] = []
    pieces: list[bytes] = []
    handler_done = trio.Event()

    async def slow_handler(piece: bytes) -> None:
        pieces.append(piece)
        await trio.sleep(100.0)  # a slow client: longer than the read timeout
        handler_done.set()

    async def run(start: float) -> None:
        response = await pool.request(_request(url, timeout=30.0))
        try:
            assert isinstance(response.stream, UpstreamBody)
            await response.stream.pump(slow_handler)
            outcome.append((None, trio.current_time() - start))
        except httpx.ReadTimeout as exc:
            outcome.append((exc, trio.current_time() - start))
        finally:
            await response.aclose()

    with trio.CancelScope() as guard:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_real_time_guard, BUDGET_SECONDS, guard)
            nursery.start_soon(serve)
            start = trio.current_time()
            nursery.start_soon(run, start)
            await first_sent.wait()
            while not pieces:  # real I/O only: the clock is frozen
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(100.0)  # the handler's sleep ends; no read timeout meanwhile
            while not handler_done.is_set():
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []
            mock_clock.jump(30.0 - 0.001)
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []
            mock_clock.jump(0.001)
            while not outcome:
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught, "real-time budget ran out"
    [(exc, elapsed)] = outcome
    assert isinstance(exc, httpx.ReadTimeout) and pieces == [b"abc"]
    assert elapsed == pytest.approx(130.0)
    await pool.aclose()
    await listener.aclose()


async def test_pump_hold_timer_fires_on_time_and_the_silence_keeps_counting(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Coalescing (docs/operations.md §13): the wait for the worker also ends when the held events
    are due (``timer.fire``); that write does not restart the read timeout's count."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"

    async def serve() -> None:
        stream = await listener.accept()
        await _read_request(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await trio.sleep_forever()

    class Timer:
        due = math.inf
        fired: list[float] = []

        async def fire(self) -> None:
            self.fired.append(trio.current_time() - start)
            self.due = math.inf

    timer = Timer()
    pool = H1Pool(8, 5.0)
    outcome: list[tuple[BaseException | None, float]] = []
    pieces: list[bytes] = []

    async def hold(piece: bytes) -> None:
        pieces.append(piece)
        timer.due = trio.current_time() + 0.05

    async def run() -> None:
        response = await pool.request(_request(url, timeout=30.0))
        try:
            assert isinstance(response.stream, UpstreamBody)
            await response.stream.pump(hold, timer)
            outcome.append((None, trio.current_time() - start))
        except httpx.ReadTimeout as exc:
            outcome.append((exc, trio.current_time() - start))
        finally:
            await response.aclose()

    async def settle() -> None:
        await trio.testing.wait_all_tasks_blocked()

    with trio.CancelScope() as guard:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_real_time_guard, BUDGET_SECONDS, guard)
            nursery.start_soon(serve)
            start = trio.current_time()
            nursery.start_soon(run)
            while not pieces:  # real I/O only: the clock is frozen
                await settle()
                await trio.lowlevel.checkpoint()
            await settle()
            mock_clock.jump(0.05 - 0.001)
            await settle()
            assert timer.fired == []
            mock_clock.jump(0.001)
            await settle()
            assert timer.fired == [pytest.approx(0.05)]
            mock_clock.jump(30.0 - 0.05 - 0.001)
            await settle()
            assert outcome == []
            mock_clock.jump(0.001)
            while not outcome:
                await settle()
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught, "real-time budget ran out"
    [(exc, elapsed)] = outcome
    assert isinstance(exc, httpx.ReadTimeout) and pieces == [b"abc"]
    assert elapsed == pytest.approx(30.0)
    await pool.aclose()
    await listener.aclose()


async def test_pump_cancel_safe_handler_keeps_the_exact_read_timeout(mock_clock: trio.testing.MockClock) -> None:
    """``handler_cancel_safe``: the idle deadline is not moved at every read, yet the timeout still
    fires exactly ``timeout`` after the last piece (here 20 + 30 s, past the stale 30 s mark)."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
    send_second = trio.Event()

    async def serve() -> None:
        stream = await listener.accept()
        await _read_request(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await send_second.wait()
        await stream.send_all(b"3\r\ndef\r\n")
        await trio.sleep_forever()

    pool = H1Pool(8, 5.0)
    outcome: list[tuple[BaseException | None, float]] = []
    pieces: list[bytes] = []

    async def collect(piece: bytes) -> None:
        pieces.append(piece)

    async def run() -> None:
        response = await pool.request(_request(url, timeout=30.0))
        try:
            assert isinstance(response.stream, UpstreamBody)
            await response.stream.pump(collect, handler_cancel_safe=True)
            outcome.append((None, trio.current_time() - start))
        except httpx.ReadTimeout as exc:
            outcome.append((exc, trio.current_time() - start))
        finally:
            await response.aclose()

    async def until(predicate: Callable[[], bool]) -> None:
        while not predicate():  # real I/O only: the clock is frozen
            await trio.testing.wait_all_tasks_blocked()
            await trio.lowlevel.checkpoint()
        await trio.testing.wait_all_tasks_blocked()

    with trio.CancelScope() as guard:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_real_time_guard, BUDGET_SECONDS, guard)
            nursery.start_soon(serve)
            start = trio.current_time()
            nursery.start_soon(run)
            await until(lambda: len(pieces) == 1)
            mock_clock.jump(20.0)
            send_second.set()
            await until(lambda: len(pieces) == 2)
            mock_clock.jump(10.0)  # 30 s after the first piece: the stale deadline, no timeout
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []
            mock_clock.jump(20.0 - 0.25)  # (binary-exact steps: the clock is frozen at the sum)
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []
            mock_clock.jump(0.25)
            await until(lambda: bool(outcome))
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught, "real-time budget ran out"
    [(exc, elapsed)] = outcome
    assert isinstance(exc, httpx.ReadTimeout) and pieces == [b"abc", b"def"]
    assert elapsed == pytest.approx(50.0)
    await pool.aclose()
    await listener.aclose()


async def test_a_request_larger_than_the_socket_buffer_arrives_whole() -> None:
    """Most of a big request leaves with the waiting Trio send after the first non-blocking write
    took what the socket could (daemon.h1client._send_now)."""
    payload = bytes(range(256)) * 60_000  # ~15 MB
    received: list[bytes] = []

    async def serve_one(stream: trio.SocketStream) -> None:
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            buf += await stream.receive_some(65536)
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        body = bytearray(rest)
        while len(body) < length:
            body += await stream.receive_some(1 << 20)
        received.append(bytes(body))
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
    pool = H1Pool(max_keepalive_connections=8, keepalive_expiry=5.0)
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:

            async def accept_one() -> None:
                stream = await listener.accept()
                async with stream:
                    await serve_one(stream)

            nursery.start_soon(accept_one)
            request = httpx.Request(
                "POST", url + "/v1/x", content=payload, extensions={"timeout": httpx.Timeout(30.0).as_dict()}
            )
            response = await pool.request(request)
            assert await response.aread() == b"ok"
            await response.aclose()
        await pool.aclose()
        await listener.aclose()
    assert received == [payload]


# ---------------------------------------------------------------------------------------------
# the idle reaper (docs/operations.md §11.2)


TCP_STATES = {"01": "ESTABLISHED", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE"}
TCP_STATES |= {"08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def sockets_to(port: int, pid: int | str = "self") -> Counter[str]:
    """The TCP sockets of process ``pid`` (this one by default) connected to ``port``, by state
    (``CLOSE_WAIT``: the peer closed, the process did not)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    states: Counter[str] = Counter()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if remote_port == port and fields[9] in inodes:
                    states[TCP_STATES.get(fields[3], fields[3])] += 1
    return states


def close_wait_sockets(port: int) -> int:
    """This process's TCP sockets to ``port`` in CLOSE-WAIT (the peer closed, we did not)."""
    return sockets_to(port)["CLOSE_WAIT"]


async def test_the_reaper_closes_each_idle_connection_at_its_expiry(autojump_clock: trio.testing.MockClock) -> None:
    """Virtual time, expiry 4 s: a connection released at 0 and reused until 1 closes at 5, another
    worker's released at 2 closes at 6 - without a request, exactly at the expiry.  The reaper wakes
    only then, and once at 4 (armed by the first release; the reuse made that early)."""
    closed_at: dict[int, list[float]] = {}

    async def serve(listener: trio.SocketListener) -> None:
        port = listener.socket.getsockname()[1]

        async def connection(stream: trio.SocketStream) -> None:
            buf = bytearray()
            async with stream:
                while await _read_request(stream, buf) is not None:
                    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            closed_at.setdefault(port, []).append(trio.current_time())

        async with trio.open_nursery() as nursery:
            while True:
                nursery.start_soon(connection, await listener.accept())

    async def exchange(url: str) -> None:
        response = await pool.request(_request(url, timeout=None))  # type: ignore[arg-type]
        assert await response.aread() == b"ok"
        await response.aclose()

    async def at(when: float) -> None:
        await trio.sleep_until(when)
        await trio.testing.wait_all_tasks_blocked()  # the reaper and the servers ran (loopback I/O)

    a, b = [(await trio.open_tcp_listeners(0, host="127.0.0.1"))[0] for _ in range(2)]
    port_a, port_b = a.socket.getsockname()[1], b.socket.getsockname()[1]
    pool = H1Pool(max_keepalive_connections=8, keepalive_expiry=4.0)
    with trio.CancelScope() as guard:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_real_time_guard, BUDGET_SECONDS, guard)
            nursery.start_soon(serve, a)
            nursery.start_soon(serve, b)
            nursery.start_soon(pool.run_reaper)
            await exchange(f"http://127.0.0.1:{port_a}")
            await at(1.0)
            await exchange(f"http://127.0.0.1:{port_a}")  # the same connection, idle again from 1
            await at(2.0)
            await exchange(f"http://127.0.0.1:{port_b}")
            assert (pool.idle_connections(), pool.open_connections, pool.reaper_wakeups) == (2, 2, 0)
            await at(4.0)
            assert (pool.idle_connections(), closed_at, pool.reaper_wakeups) == (2, {}, 1)
            await at(5.0 - 1e-6)
            assert pool.idle_connections() == 2
            await at(5.0)
            assert (pool.idle_connections(), closed_at) == (1, {port_a: [5.0]})
            await at(6.0)
            assert (pool.idle_connections(), pool.open_connections) == (0, 0)
            assert closed_at == {port_a: [5.0], port_b: [6.0]}
            assert (pool.reaped_count, pool.reaper_wakeups) == (2, 3)
            await at(100.0)  # nothing idle: the reaper sleeps
            assert pool.reaper_wakeups == 3
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught, "real-time budget ran out"
    await pool.aclose()


async def test_a_connection_the_worker_closes_while_idle_is_dropped_at_once() -> None:
    """Real sockets: the worker closes a kept-alive connection after answering; long before the
    pool's expiry (an hour) the reaper closes agentd's end - no socket left in CLOSE-WAIT - and a
    streamed body's reads never wake the reaper."""
    pieces = [f"event {i}".encode() for i in range(20)]
    stream_sent = trio.Event()

    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        if b"/stream" in head:
            await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for piece in pieces:
                await stream.send_all(b"%x\r\n%s\r\n" % (len(piece), piece))
                await trio.testing.wait_all_tasks_blocked()  # one read per piece
            await stream.send_all(b"0\r\n\r\n")
            stream_sent.set()
            return True
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        return False  # close after answering, without saying so: the connection is pooled

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        port = int(url.rsplit(":", 1)[1])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run_reaper)
            await trio.testing.wait_all_tasks_blocked()
            response = await pool.request(_request(url, "/stream"))
            assert b"".join([p async for p in response.aiter_raw()]) == b"".join(pieces)
            await response.aclose()
            assert (pool.idle_connections(), pool.reaper_wakeups) == (1, 0)  # 20 reads, no wake-up
            response = await pool.request(_request(url))  # the same connection: the server closes it
            assert await response.aread() == b"ok"
            await response.aclose()
            assert server.accepted == 1
            with trio.move_on_after(BUDGET_SECONDS / 2):
                while pool.open_connections:  # loopback: the FIN arrives while every task waits
                    await trio.testing.wait_all_tasks_blocked()
                    await trio.lowlevel.checkpoint()
            assert (pool.open_connections, pool.idle_connections(), pool.reaped_count) == (0, 0, 1)
            assert close_wait_sockets(port) == 0
            assert pool.reaper_wakeups == 1
            nursery.cancel_scope.cancel()

    async def timed(pool: H1Pool, url: str, server: Server) -> None:
        pool._expiry = 3600.0
        await body(pool, url, server)

    await _with_server(handler, timed)
