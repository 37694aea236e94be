"""daemon.h1client ``UpstreamBody.relay``: chunked bodies read, decoded, relayed and written by the
run's ``RelayHub`` (one task for every relayed body, docs/benchmarks.md §10.1).

Real loopback servers write the exact bytes of each test; the relay and the writer are recorders
standing in for ``StreamRelay`` and the direct body writer (the client socket is the process
boundary here).  The clock is virtual: autojump, or a frozen MockClock moved by hand where a test
asserts exact deadlines (as in test_h1client.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import httpx
import pytest
import trio
import trio.testing

from daemon.h1client import H1Pool, UpstreamBody, relay_hub
from tests.http.test_h1client import BUDGET_SECONDS, Server, _read_request, _real_time_guard, _request, _with_server

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Relay:
    """Passes every payload on (or holds it for ``hold`` seconds); records who called it."""

    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold
        self.due = math.inf
        self.held: list[bytes] = []
        self.callers: set[str] = set()

    def take(self, payload: bytes) -> bytes:
        self.callers.add(trio.lowlevel.current_task().name)
        if not self.hold:
            return payload
        self.held.append(payload)
        if self.due == math.inf:
            self.due = trio.current_time() + self.hold
        return b""

    def release(self) -> bytes:
        self.due = math.inf
        out, self.held = b"".join(self.held), []
        return out


class Writer:
    """Records what reached the client; ``short``: how many bytes of the n-th write it takes at once."""

    def __init__(self, short: dict[int, int] | None = None) -> None:
        self.wire = b""
        self.calls: list[tuple[str, float, bytes]] = []
        self.short = short or {}
        self.rest_gate: trio.Event | None = None
        self.fail_at: int | None = None
        self.on_write: Callable[[], None] | None = None
        self.resting = trio.Event()  # write_rest began

    def write_now(self, data: bytes) -> bytes:
        n = len([c for c in self.calls if c[0] == "now"])
        self.calls.append(("now", trio.current_time(), data))
        if self.fail_at == n:
            raise ConnectionResetError("the client went away")
        if self.on_write is not None:
            self.on_write()
        take = self.short.get(n, len(data))
        self.wire += data[:take]
        return data[take:]

    async def write_rest(self, rest: bytes) -> None:
        self.calls.append(("rest", trio.current_time(), rest))
        self.resting.set()
        if self.rest_gate is not None:
            with trio.CancelScope(shield=True):
                await self.rest_gate.wait()
        self.wire += rest


@pytest.mark.parametrize(
    "pieces",
    [
        [HEAD + _frame(b"data: 1\n\n"), _frame(b"data: 2\n\n") + b"0\r\n\r\n"],  # a chunk with the head
        [HEAD, b"9\r\ndata", b": 1\n\n\r\n9\r", b"\ndata: 2\n\n\r\n0\r\n", b"\r\n"],  # splits everywhere
        [HEAD, _frame(b"data: 1\n\n") + _frame(b"data: 2\n\n") + b"0\r\n\r\n"],  # a backlog in one read
    ],
)
async def test_the_hub_relays_the_exact_payload_and_the_connection_is_reused(
    pieces: list[bytes], autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        for piece in pieces:
            await stream.send_all(piece)
            await trio.sleep(0.01)  # separate reads
        return True

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        for _ in range(2):
            response = await pool.request(_request(url))
            assert isinstance(response.stream, UpstreamBody)
            relay, writer = Relay(), Writer()
            await response.stream.relay(relay, writer)
            await response.aclose()
            assert writer.wire == b"data: 1\n\ndata: 2\n\n"
            assert relay.callers <= {"agentd-relay-hub", trio.lowlevel.current_task().name}
        assert pool.idle_connections() == 1
        assert relay_hub()._entries == {}

    server = await _with_server(handler, body)
    assert server.accepted == 1


async def test_one_hub_wake_relays_a_token_of_every_ready_stream() -> None:
    """Eight streams, each given one token per step at the same instant: one wake-up of the hub per
    step relays all eight, and no stream's own task runs for them."""
    streams, steps = 8, 5
    sockets: list[trio.SocketStream] = []
    all_connected = trio.Event()
    writers = [Writer() for _ in range(streams)]
    relays = [Relay() for _ in range(streams)]

    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(HEAD)
        sockets.append(stream)
        if len(sockets) == streams:
            all_connected.set()
        await trio.sleep_forever()
        return False

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        hub = relay_hub()

        async def one(i: int) -> None:
            response = await pool.request(_request(url))
            assert isinstance(response.stream, UpstreamBody)
            try:
                await response.stream.relay(relays[i], writers[i])
            finally:
                await response.aclose()

        async with trio.open_nursery() as nursery:
            for i in range(streams):
                nursery.start_soon(one, i)
            await all_connected.wait()
            await trio.testing.wait_all_tasks_blocked()
            for step in range(steps):
                before = hub.wakeups
                for s in sockets:  # one decode step: a token for every stream, no checkpoint between
                    os.write(s.socket.fileno(), _frame(b"data: %d\n\n" % step))
                while not all(w.wire.count(b"data: %d\n\n" % step) for w in writers):
                    await trio.testing.wait_all_tasks_blocked()
                    await trio.lowlevel.checkpoint()
                assert hub.wakeups - before == 1
            nursery.cancel_scope.cancel()
        assert all(r.callers == {"agentd-relay-hub"} for r in relays)
        assert [w.wire for w in writers] == [b"".join(b"data: %d\n\n" % s for s in range(steps))] * streams
        assert hub._entries == {}  # the cancelled bodies let go of their sockets

    await _with_server(handler, body)


async def test_the_read_timeout_is_exact_and_counts_from_the_last_bytes(mock_clock: trio.testing.MockClock) -> None:
    """A 30 s read timeout through the hub: bytes at 0 and 20 s, the timeout at exactly 50 s."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
    send_second = trio.Event()

    async def serve() -> None:
        stream = await listener.accept()
        await _read_request(stream, bytearray())
        await stream.send_all(HEAD + _frame(b"abc"))
        await send_second.wait()
        await stream.send_all(_frame(b"def"))
        await trio.sleep_forever()

    pool = H1Pool(8, 5.0)
    outcome: list[tuple[BaseException | None, float]] = []
    writer = Writer()

    async def run() -> None:
        response = await pool.request(_request(url, timeout=30.0))
        try:
            assert isinstance(response.stream, UpstreamBody)
            await response.stream.relay(Relay(), writer)
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
            await until(lambda: writer.wire == b"abc")
            mock_clock.jump(20.0)
            send_second.set()
            await until(lambda: writer.wire == b"abcdef")
            mock_clock.jump(10.0)  # 30 s after the first bytes: no timeout
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []
            mock_clock.jump(20.0 - 0.25)
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []
            mock_clock.jump(0.25)
            await until(lambda: bool(outcome))
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught, "real-time budget ran out"
    [(exc, elapsed)] = outcome
    assert isinstance(exc, httpx.ReadTimeout)
    assert elapsed == 50.0
    assert relay_hub()._entries == {}
    await pool.aclose()
    await listener.aclose()


async def test_held_events_leave_when_due_and_the_silence_keeps_counting(mock_clock: trio.testing.MockClock) -> None:
    """Coalescing through the hub: the held payload is written at exactly ``due`` (50 ms after it
    arrived) by the body's task; that write does not restart the 30 s read timeout."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"

    go = trio.Event()

    async def serve() -> None:
        stream = await listener.accept()
        await _read_request(stream, bytearray())
        await stream.send_all(HEAD)
        await go.wait()  # the body's task waits already: the hub moves its deadline to ``due``
        await stream.send_all(_frame(b"abc"))
        await trio.sleep_forever()

    pool = H1Pool(8, 5.0)
    outcome: list[tuple[BaseException | None, float]] = []
    writer = Writer()
    relay = Relay(hold=0.05)

    async def run() -> None:
        response = await pool.request(_request(url, timeout=30.0))
        try:
            assert isinstance(response.stream, UpstreamBody)
            await response.stream.relay(relay, writer)
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
            await settle()
            go.set()
            while not relay.held:  # real I/O only: the clock is frozen
                await settle()
                await trio.lowlevel.checkpoint()
            await settle()
            mock_clock.jump(0.05 - 0.001)
            await settle()
            assert writer.wire == b""
            mock_clock.jump(0.001)
            await settle()
            assert writer.wire == b"abc" and [t - start for _, t, _ in writer.calls] == [pytest.approx(0.05)]
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
    assert isinstance(exc, httpx.ReadTimeout) and elapsed == pytest.approx(30.0)
    await pool.aclose()
    await listener.aclose()


async def test_a_frame_the_client_did_not_take_is_finished_first_and_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The client socket takes 4 bytes of the first write: the body's task writes the rest (here
    held up) while the hub leaves the stream alone; the next payload follows it, in order."""
    writer = Writer(short={0: 4})
    writer.rest_gate = trio.Event()

    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(HEAD + _frame(b"data: 1\n\n"))
        await writer.resting.wait()
        await stream.send_all(_frame(b"data: 2\n\n"))  # arrives while the rest is being written
        await trio.sleep(0.05)
        assert [c[0] for c in writer.calls] == ["now", "rest"]  # the hub did not write meanwhile
        assert writer.rest_gate is not None
        writer.rest_gate.set()
        await trio.sleep(0.05)
        await stream.send_all(b"0\r\n\r\n")
        return True

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        response = await pool.request(_request(url))
        assert isinstance(response.stream, UpstreamBody)
        await response.stream.relay(Relay(), writer)
        await response.aclose()
        assert writer.wire == b"data: 1\n\ndata: 2\n\n"
        assert [c[0] for c in writer.calls] == ["now", "rest", "now"]
        assert writer.calls[1][2] == b": 1\n\n"
        assert pool.idle_connections() == 1

    await _with_server(handler, body)


async def test_a_write_error_is_raised_in_the_body_task_and_the_socket_let_go(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writer = Writer()
    writer.fail_at = 1

    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(HEAD + _frame(b"data: 1\n\n"))
        await trio.sleep(0.01)
        await stream.send_all(_frame(b"data: 2\n\n"))
        await trio.sleep_forever()
        return False

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        response = await pool.request(_request(url))
        assert isinstance(response.stream, UpstreamBody)
        with pytest.raises(ConnectionResetError, match="the client went away"):
            await response.stream.relay(Relay(), writer)
        assert relay_hub()._entries == {}
        await response.aclose()
        assert writer.wire == b"data: 1\n\n" and pool.idle_connections() == 0  # an unfinished body: closed

    await _with_server(handler, body)


async def test_a_cancelled_body_finishes_the_frame_the_hub_started(autojump_clock: trio.testing.MockClock) -> None:
    """The request is cancelled (client gone, total timeout) just as the client socket took only
    part of a frame: the rest is still written (the client never sees a torn chunk), then the
    cancellation goes on; the hub lets go of the socket."""
    writer = Writer(short={1: 3})
    scope = trio.CancelScope()

    def cancel_on_second_write() -> None:
        if len(writer.calls) == 2:
            scope.cancel()

    writer.on_write = cancel_on_second_write

    async def handler(stream: trio.SocketStream, head: bytes) -> bool:
        await stream.send_all(HEAD + _frame(b"data: 1\n\n"))
        await trio.sleep(0.01)
        await stream.send_all(_frame(b"data: 2\n\n"))
        await trio.sleep_forever()
        return False

    async def body(pool: H1Pool, url: str, server: Server) -> None:
        response = await pool.request(_request(url))
        assert isinstance(response.stream, UpstreamBody)
        with scope:
            await response.stream.relay(Relay(), writer)
        assert scope.cancelled_caught
        assert relay_hub()._entries == {}
        await response.aclose()
        assert writer.wire == b"data: 1\n\ndata: 2\n\n"
        assert [c[0] for c in writer.calls] == ["now", "now", "rest"]

    await _with_server(handler, body)
