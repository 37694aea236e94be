"""Accepted connections spread evenly over relays sharing one listening socket (daemon/dataplane/balance.py).

Real loopback sockets in one process: each "relay" is a :class:`BalancedListener` on its own
duplicate of one listening socket (the same kernel socket, as inherited by relay processes), all
on one :class:`AcceptBoard`.  A loopback connect is queued on the listening socket before
``connect`` returns, so under the autojump clock every decision below is deterministic."""

from __future__ import annotations

import errno
import select
import socket
from typing import Any

import pytest
import trio
import trio.testing

from daemon.dataplane.balance import (
    DEFER_LIMIT_SECONDS,
    DEFER_POLL_SECONDS,
    NOT_ACCEPTING,
    AcceptBoard,
    BalancedListener,
)


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


class Relays:
    """``n`` listeners on one socket, each accepting in a task and keeping what it accepted."""

    def __init__(self, n: int) -> None:
        self.sock = _listening()
        self.port = self.sock.getsockname()[1]
        self.board = AcceptBoard.create(n)
        self.listeners = [BalancedListener(self.sock.dup(), self.board, i) for i in range(n)]
        self.accepted: list[list[trio.SocketStream]] = [[] for _ in range(n)]

    async def accept_forever(self, i: int) -> None:
        while True:
            self.accepted[i].append(await self.listeners[i].accept())

    def counts(self) -> list[int]:
        return [len(a) for a in self.accepted]

    async def close(self) -> None:
        for listener in self.listeners:
            await listener.aclose()
        for streams in self.accepted:
            for stream in streams:
                await stream.aclose()
        self.sock.close()
        self.board.close()


async def _connect(relays: Relays) -> trio.SocketStream:
    before = sum(relays.counts())
    stream = await trio.open_tcp_stream("127.0.0.1", relays.port)
    # ``connect`` can return before the kernel has queued the connection on the listening socket
    # when it defers the handshake's last step (a loaded machine): wait for that kernel event
    # without yielding to Trio, so that virtual time cannot run ahead of it
    if sum(relays.counts()) == before:
        readable, _, _ = select.select([relays.sock], [], [], 10.0)
        assert readable, "the connection never reached the listening socket"
    await trio.testing.wait_all_tasks_blocked()  # every listener has had its look at it
    # a listener that left it to another one looks again after a poll interval (virtual time)
    await trio.sleep(2 * DEFER_POLL_SECONDS)
    await trio.testing.wait_all_tasks_blocked()
    return stream


async def test_connections_alternate_over_two_relays(autojump_clock: trio.testing.MockClock) -> None:
    relays = Relays(2)
    clients = []
    async with trio.open_nursery() as nursery:
        for i in range(2):
            nursery.start_soon(relays.accept_forever, i)
        await trio.testing.wait_all_tasks_blocked()
        assert relays.board.counts() == [0, 0]  # both accepting, none open
        start = trio.current_time()
        for n in range(1, 9):
            clients.append(await _connect(relays))
            counts = relays.counts()
            assert sum(counts) == n and max(counts) - min(counts) <= 1, counts
            assert relays.board.counts() == counts
        assert relays.counts() == [4, 4]
        # never the fallback: the less loaded relay always took its connection at once
        assert trio.current_time() - start < DEFER_LIMIT_SECONDS
        assert [listener.fallback_count for listener in relays.listeners] == [0, 0]
        # whether the busier relay saw a connection first (and deferred it) depends on the order
        # Trio wakes the two waiting tasks, which it randomises: deferral is tested
        # deterministically in test_a_relay_that_does_not_accept_is_not_waited_for
        nursery.cancel_scope.cancel()
    for client in clients:
        await client.aclose()
    await relays.close()


async def test_a_closed_connection_makes_room(autojump_clock: trio.testing.MockClock) -> None:
    relays = Relays(3)
    clients = []
    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(relays.accept_forever, i)
        for _ in range(6):
            clients.append(await _connect(relays))
        assert relays.counts() == [2, 2, 2]
        # one connection of relay 1 ends (its server calls connection_closed), the next goes there
        relays.listeners[1].connection_closed()
        assert relays.board.counts() == [2, 1, 2]
        clients.append(await _connect(relays))
        assert relays.counts() == [2, 3, 2] and relays.board.counts() == [2, 2, 2]
        nursery.cancel_scope.cancel()
    for client in clients:
        await client.aclose()
    await relays.close()


async def test_a_relay_that_does_not_accept_is_not_waited_for(autojump_clock: trio.testing.MockClock) -> None:
    relays = Relays(2)
    first = relays.listeners[0]
    clients = []
    # relay 1 has not called accept() yet (booting): it does not count, relay 0 takes everything
    for _ in range(3):
        clients.append(await trio.open_tcp_stream("127.0.0.1", relays.port))
        start = trio.current_time()
        relays.accepted[0].append(await first.accept())
        assert trio.current_time() == start
    assert relays.board.counts() == [3, NOT_ACCEPTING]

    # relay 1's slot says "accepting, 0 connections" but nobody accepts there (stuck): relay 0
    # leaves the connection to it for DEFER_LIMIT_SECONDS, then takes it itself
    relays.board.set(1, 0)
    clients.append(await trio.open_tcp_stream("127.0.0.1", relays.port))
    start = trio.current_time()
    relays.accepted[0].append(await first.accept())
    waited = trio.current_time() - start
    assert DEFER_LIMIT_SECONDS <= waited <= DEFER_LIMIT_SECONDS + 2 * DEFER_POLL_SECONDS
    assert (first.deferred_count, first.fallback_count) == (1, 1)
    assert relays.board.counts() == [4, 0]
    for client in clients:
        await client.aclose()
    await relays.close()


async def test_a_closed_listener_stops_accepting_and_leaves_the_board(
    autojump_clock: trio.testing.MockClock,
) -> None:
    relays = Relays(2)
    listener = relays.listeners[1]
    ended: list[str] = []

    async def accept_until_closed() -> None:
        try:
            await listener.accept()
        except trio.ClosedResourceError:
            ended.append("closed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_until_closed)
        await trio.testing.wait_all_tasks_blocked()
        assert relays.board.counts() == [NOT_ACCEPTING, 0]
        await listener.aclose()  # the drain: the waiting accept ends, the others stop deferring to it
        assert relays.board.counts() == [NOT_ACCEPTING, NOT_ACCEPTING]
    assert ended == ["closed"]
    with pytest.raises(trio.ClosedResourceError):
        await listener.accept()
    await relays.close()


async def test_one_listener_without_a_board_accepts_at_once(autojump_clock: trio.testing.MockClock) -> None:
    sock = _listening()
    listener = BalancedListener(sock, None, 0)
    client = await trio.open_tcp_stream("127.0.0.1", sock.getsockname()[1])
    start = trio.current_time()
    stream = await listener.accept()
    assert trio.current_time() == start and listener.open_connections == 1
    await stream.send_all(b"x")
    assert await client.receive_some(1) == b"x"
    for one in (stream, client, listener):
        await one.aclose()


class _AbortsFirst(socket.socket):
    """A listening socket whose first accepted connection was reset before accept() returned it
    (what accept(2) reports as ECONNABORTED)."""

    aborted = False

    def accept(self) -> tuple[socket.socket, Any]:
        if not self.aborted:
            self.aborted = True
            conn, _ = super().accept()
            conn.close()
            raise ConnectionAbortedError(errno.ECONNABORTED, "connection aborted")
        return super().accept()


async def test_a_connection_aborted_before_accept_is_skipped(autojump_clock: trio.testing.MockClock) -> None:
    sock = _AbortsFirst()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    listener = BalancedListener(sock, None, 0)
    port = sock.getsockname()[1]
    gone = await trio.open_tcp_stream("127.0.0.1", port)
    kept = await trio.open_tcp_stream("127.0.0.1", port)
    stream = await listener.accept()  # the aborted one is skipped, the listener keeps accepting
    assert listener.open_connections == 1
    await kept.send_all(b"y")
    assert await stream.receive_some(1) == b"y"
    for one in (stream, gone, kept, listener):
        await one.aclose()
