"""The connection handler's per-request shortcuts (daemon/http/hypercorn_close.py,
docs/benchmarks.md §10.2): the keep-alive idle timer without a task per request, and socket writes
that leave at once when the kernel takes them whole."""

from __future__ import annotations

import trio
import trio.testing
from hypercorn.events import RawData
from hypercorn.trio.tcp_server import MAX_RECV
from hypercorn.trio.worker_context import EventWrapper

from daemon.http.hypercorn_close import LARGE_RECV, IdleWatch, PromptCloseTCPServer

TIMEOUT = 75.0


class Group:
    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery


async def noop() -> None:
    pass


async def watch_in(nursery: trio.Nursery, terminated: EventWrapper, closed_at: list[float]) -> IdleWatch:
    async def on_idle() -> None:
        closed_at.append(trio.current_time())

    return IdleWatch(TIMEOUT, terminated, on_idle)


async def test_an_idle_connection_closes_exactly_after_the_keep_alive_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    closed_at: list[float] = []
    async with trio.open_nursery() as nursery:
        watch = await watch_in(nursery, EventWrapper(), closed_at)
        await watch.restart(Group(nursery), noop)  # the connection opened: idle
        await trio.sleep(10)
        await watch.stop()  # a request
        await trio.sleep(200)  # a long request never times out
        assert closed_at == []
        await watch.restart(Group(nursery), noop)  # answered: idle again at t=210
        await trio.sleep(30)
        await watch.stop()
        await watch.restart(Group(nursery), noop)  # another request, idle again at t=240
    assert closed_at == [240 + TIMEOUT]


async def test_the_drain_closes_idle_connections_at_once_and_busy_ones_when_they_turn_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    terminated = EventWrapper()
    idle_closed: list[float] = []
    busy_closed: list[float] = []
    async with trio.open_nursery() as nursery:
        idle = await watch_in(nursery, terminated, idle_closed)
        busy = await watch_in(nursery, terminated, busy_closed)
        await idle.restart(Group(nursery), noop)
        await busy.restart(Group(nursery), noop)
        await trio.sleep(1)
        await busy.stop()
        await trio.sleep(4)
        await terminated.set()  # the drain starts at t=5
        await trio.sleep(3)
        assert idle_closed == [5] and busy_closed == []
        await busy.restart(Group(nursery), noop)  # its response went out at t=8
    assert busy_closed == [8]


async def test_a_closed_watch_never_fires(autojump_clock: trio.testing.MockClock) -> None:
    closed_at: list[float] = []
    async with trio.open_nursery() as nursery:
        watch = await watch_in(nursery, EventWrapper(), closed_at)
        await watch.restart(Group(nursery), noop)
        await trio.sleep(1)
        watch.close()  # the peer went away
        await watch.restart(Group(nursery), noop)
    assert closed_at == []
    assert trio.current_time() == 1


def server_on(stream: trio.SocketStream) -> PromptCloseTCPServer:
    server = PromptCloseTCPServer.__new__(PromptCloseTCPServer)  # only the write path is used
    server.stream = stream  # type: ignore[assignment]
    server.send_lock = trio.Lock()
    return server


async def read_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(1 << 20)
        assert chunk
        data += chunk
    return bytes(data)


async def test_writes_keep_their_order_whether_the_kernel_takes_them_whole_or_not() -> None:
    a, b = trio.socket.socketpair()
    left, right = trio.SocketStream(a), trio.SocketStream(b)
    server = server_on(left)
    big = bytes(range(256)) * 40_000  # ~10 MB: more than a socket buffer takes at once
    expected = b"head" + big + b"tail"
    async with trio.open_nursery() as nursery:
        received: list[bytes] = []

        async def reader() -> None:
            received.append(await read_exactly(right, len(expected)))

        nursery.start_soon(reader)
        await server.protocol_send(RawData(data=b"head"))  # taken whole: no lock, no wait
        await server.protocol_send(RawData(data=big))  # the rest waits on hypercorn's path
        await server.protocol_send(RawData(data=b"tail"))
    assert received == [expected]
    await left.aclose()
    await right.aclose()


async def test_a_write_while_another_is_in_progress_waits_its_turn() -> None:
    a, b = trio.socket.socketpair()
    left, right = trio.SocketStream(a), trio.SocketStream(b)
    server = server_on(left)
    big = b"x" * 10_000_000
    async with trio.open_nursery() as nursery:
        received: list[bytes] = []

        async def reader() -> None:
            await trio.testing.wait_all_tasks_blocked()  # the big write is parked, holding the lock
            received.append(await read_exactly(right, len(big) + 5))

        async def second() -> None:
            await trio.testing.wait_all_tasks_blocked()
            assert server.send_lock.locked()
            await server.protocol_send(RawData(data=b"after"))

        nursery.start_soon(second)
        nursery.start_soon(reader)
        await server.protocol_send(RawData(data=big))
    assert received == [big + b"after"]
    await left.aclose()
    await right.aclose()


class _Reads:
    """A client stream that hands out ``data`` as far as each read's size allows, recording sizes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.sizes: list[int] = []

    async def receive_some(self, size: int) -> bytes:
        self.sizes.append(size)
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk


class _Protocol:
    def __init__(self) -> None:
        self.events: list[object] = []

    async def handle(self, event: object) -> None:
        self.events.append(event)


async def test_a_read_that_fills_its_buffer_is_followed_by_a_larger_one() -> None:
    """A large request body reaches h11 in a few reads (docs/operations.md §13.6); after a short
    read the size is hypercorn's again, and every byte arrives in order."""
    body = bytes(range(256)) * 1500  # 384,000 bytes
    reads = _Reads(body)
    server = PromptCloseTCPServer.__new__(PromptCloseTCPServer)  # only the read loop is used
    server.stream = reads  # type: ignore[assignment]
    server.protocol = _Protocol()  # type: ignore[assignment]
    server.config = type("Config", (), {"read_timeout": None})()
    server._idle_watch = IdleWatch(1.0, EventWrapper(), _never)
    await server._read_data()
    assert reads.sizes == [MAX_RECV, LARGE_RECV, MAX_RECV]  # full 64 KiB, the rest, then EOF
    events = server.protocol.events  # type: ignore[attr-defined]
    assert b"".join(e.data for e in events if isinstance(e, RawData)) == body
    assert server._peer_gone


async def _never() -> None:
    raise AssertionError("an idle close was not expected")
