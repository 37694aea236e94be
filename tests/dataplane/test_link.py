"""The data-plane link over a real Unix socket pair (docs/benchmarks.md §10.3.2, §10.3.4): the
first frame of a run-loop turn is in the peer's socket when ``send`` returns and the rest of the
turn's frames follow in one write when the turn ends, frames keep their order when the socket is
full, and the reader hands over what it read before it yields."""

from __future__ import annotations

import socket
import threading

import pytest
import trio
import trio.testing

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


async def test_the_first_frame_of_a_turn_is_written_before_the_sender_checkpoints() -> None:
    link, peer = _pair()
    link.send(Release(7))
    link.send(Load((1, 2)))
    # no checkpoint since the sends, no writer task running: the first frame is already in the
    # socket; the second waits for the end of this run-loop turn (docs/benchmarks.md §10.3.4)
    assert FrameReader().feed(_read_all(peer)) == [Release(7)]
    assert (link.direct_writes, link.writes, link.frames_sent) == (1, 1, 2)
    await trio.lowlevel.checkpoint()  # the turn ends: the gathered frame is written
    assert FrameReader().feed(_read_all(peer)) == [Load((1, 2))]
    assert (link.direct_writes, link.writes) == (1, 2)
    link.send(Release(8))  # a new turn: written at once again
    assert FrameReader().feed(_read_all(peer)) == [Release(8)]
    assert (link.direct_writes, link.writes, link.frames_sent) == (2, 3, 3)
    peer.close()
    await link.stream.aclose()


async def test_the_frames_of_several_tasks_in_one_turn_take_two_writes() -> None:
    """Three tasks that run in the same batch each send a frame: the first is written at once,
    the other two together when the turn ends (one write for both, before the run loop waits)."""
    link, peer = _pair()

    async def sender(number: int) -> None:
        link.send(Release(number))

    async with trio.open_nursery() as nursery:
        for number in (1, 2, 3):
            nursery.start_soon(sender, number)  # (all three run in the next batch)
    received = FrameReader().feed(_read_all(peer))
    assert sorted(received, key=lambda r: r.lease) == [Release(1), Release(2), Release(3)]
    assert (link.direct_writes, link.writes, link.frames_sent) == (1, 2, 3)
    peer.close()
    await link.stream.aclose()


async def test_frames_gathered_when_the_link_closes_are_written_by_the_writer() -> None:
    link, peer = _pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run_writer)
        await trio.testing.wait_all_tasks_blocked()
        link.send(Release(1))
        link.send(Release(2))  # gathered
        link.close()  # in the same turn: the gathered frame goes to the writer, then the link ends
        with pytest.raises(LinkClosed):
            link.send(Release(3))
        await link.drained.wait()
    assert FrameReader().feed(_read_all(peer)) == [Release(1), Release(2)]
    assert (link.direct_writes, link.writes) == (1, 1)
    peer.close()
    await link.stream.aclose()


async def test_a_gathered_write_the_socket_does_not_take_is_finished_by_the_writer_at_once() -> None:
    """The end of the turn writes what the socket takes and hands the rest to the writer task,
    which runs at once: the run loop's wait was computed before the writer became runnable, so
    the link wakes it (without that the writer would wait for the next deadline, here 2 s)."""
    link, peer = _pair()
    frames = [Release(1), MetricsText(2, "x" * 4_000_000), Release(3)]  # larger than a socket buffer
    done = trio.Event()
    received: list[object] = []
    token = trio.lowlevel.current_trio_token()

    def read_in_thread() -> None:  # a plain thread: nothing it does wakes trio's run loop until the end
        peer.setblocking(True)
        reader = FrameReader()
        while len(received) < len(frames):
            received.extend(reader.feed(peer.recv(1 << 20)))
        token.run_sync_soon(done.set)

    thread = threading.Thread(target=read_in_thread)
    thread.start()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run_writer)
            await trio.testing.wait_all_tasks_blocked()
            for frame in frames:
                link.send(frame)  # the first written at once, the other two gathered
            with trio.fail_after(2):
                await done.wait()
            link.close()
    finally:
        thread.join(5)
    assert received == frames
    assert link.direct_writes == 1
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
