"""The data-plane link over a real Unix socket pair (docs/benchmarks.md §10.3.2): a frame is in the
peer's socket when ``send`` returns, frames keep their order when the socket is full, and the
reader hands over what it read before it yields."""

from __future__ import annotations

import socket

import pytest
import trio

from daemon.dataplane.link import Link, LinkClosed
from daemon.dataplane.wire import FrameReader, Load, MetricsText, Release, encode


def _pair() -> tuple[Link, socket.socket]:
    """A link on one end of a Unix socket pair and the other end as a plain non-blocking socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setblocking(False)
    return Link(trio.SocketStream(trio.socket.from_stdlib_socket(ours))), theirs


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


async def test_a_frame_is_written_before_the_sender_checkpoints() -> None:
    link, peer = _pair()
    link.send(Release(7))
    link.send(Load((1, 2)))
    # no checkpoint since the sends, no writer task running: the bytes are already in the socket
    assert FrameReader().feed(_read_all(peer)) == [Release(7), Load((1, 2))]
    assert link.direct_writes == 2
    assert link.frames_sent == 2
    peer.close()
    await link.stream.aclose()


async def test_frames_keep_their_order_when_the_socket_is_full() -> None:
    link, peer = _pair()
    big = "x" * 200_000  # a few of these fill the socket buffer
    frames = [MetricsText(i, big) if i % 3 == 0 else Release(i) for i in range(30)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run_writer)
        for frame in frames:
            link.send(frame)  # never blocks: what the socket does not take queues for the writer
        assert link.direct_writes < len(frames)
        received: list[object] = []
        reader = FrameReader()
        while len(received) < len(frames):
            await trio.lowlevel.wait_readable(peer)
            received += reader.feed(_read_all(peer))
        assert received == frames
        assert link.frames_sent == len(frames)
        link.close()
    assert link.drained.is_set()
    peer.close()
    await link.stream.aclose()


async def test_a_peer_that_is_gone_closes_the_link() -> None:
    link, peer = _pair()
    peer.close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run_writer)
        link.send(Release(1))  # the write fails: the frame is lost as a failed write's would be
        assert link.closed
        with pytest.raises(LinkClosed):
            link.send(Release(2))
    assert link.drained.is_set()
    await link.stream.aclose()


async def test_the_reader_hands_over_a_read_before_it_yields() -> None:
    link, peer = _pair()
    peer.sendall(wire_bytes(Release(1), Release(2)))
    frames = link.frames()
    # two frames of one read, handed over without a checkpoint in between (no other task ran)
    with trio.testing.assert_no_checkpoints():
        assert await frames.__anext__() == Release(1)
        assert await frames.__anext__() == Release(2)
    peer.close()  # EOF: the reader ends
    with pytest.raises(StopAsyncIteration):
        await frames.__anext__()
    assert link.frames_received == 2
    await link.stream.aclose()


async def test_a_reader_that_always_finds_data_still_yields() -> None:
    """A peer that keeps the socket full cannot starve the reader's process: the reader
    checkpoints after two reads in a row that found data."""
    link, peer = _pair()
    frames = link.frames()
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            ran += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)  # (it first runs when this task yields)
        before = ran
        for i in range(20):  # each frame its own read: the data is always there when the reader looks
            peer.sendall(wire_bytes(Release(i)))
            assert await frames.__anext__() == Release(i)
        # a checkpoint after every 2nd read (10 here): the other task ran (trio orders a batch's tasks
        # at random, so not always between two of them; never reading would leave it at 0)
        assert ran - before >= 4
        nursery.cancel_scope.cancel()
    await frames.aclose()
    peer.close()
    await link.stream.aclose()


def wire_bytes(*frames: object) -> bytes:
    return b"".join(encode(f) for f in frames)
