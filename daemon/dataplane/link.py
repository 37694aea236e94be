"""A framed connection between a relay and the scheduler (:mod:`daemon.dataplane.wire` frames).

``send`` never awaits.  On a socket link with nothing queued it writes the frame at once, from
the caller's own task (one non-blocking ``write``): an ``Ask``, a ``Grant`` or a ``Finish`` is in
the peer's socket before the caller's next checkpoint, instead of a run-loop turn later when a
writer task would have woken (docs/benchmarks.md §10.3.2).  What the socket does not take at once
(its buffer is full) and every frame behind it queue in an unbounded in-process channel, and one
writer task writes everything queued as one socket write, so the order of frames is the order of
``send`` calls.  The queue is unbounded on purpose: a lease's release is sent from synchronous
code (``lease.finish``) and from ``finally`` blocks, and must never be dropped
(docs/operations.md §13); its size is bounded by the number of open requests.

``frames()`` yields the decoded frames the peer sent until it closes.  On a socket it reads with
a non-blocking ``read`` and waits for readability only when nothing is there, so the frames of a
read are handled before the reader yields (a submission reaches the scheduler's inbox in the same
run-loop turn as the bytes were read); after two reads in a row that found data it checkpoints,
so a peer that keeps the socket full cannot starve the other tasks.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncGenerator
from typing import Any

import trio

from daemon.dataplane.wire import FrameReader, encode

READ_BYTES = 256 * 1024


class LinkClosed(Exception):
    """The connection is closed: nothing more can be sent."""


class Link:
    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self.stream = stream
        # the socket under a SocketStream (direct reads and writes); None: a stream of another kind
        self._socket: trio.socket.SocketType | None = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._out_send, self._out_recv = trio.open_memory_channel[bytes](math.inf)
        self._queued = 0  # chunks in the channel or being written by the writer task
        self.closed = False
        self.frames_sent = 0
        self.frames_received = 0
        self.direct_writes = 0  # frames written whole by ``send`` itself (diagnostics, tests)
        self.drained = trio.Event()  # the writer returned: everything queued was written (or lost)

    def send(self, frame: Any) -> None:
        """Send one frame: written now when nothing is queued ahead of it, else queued for the
        writer task (raises :class:`LinkClosed` once the link is closed)."""
        if self.closed:
            raise LinkClosed("data-plane link closed")
        data = encode(frame)
        if self._queued == 0 and self._socket is not None:
            try:
                written = os.write(self._socket.fileno(), data)
            except BlockingIOError:
                written = 0
            except OSError:  # the peer is gone (or the socket closed): as a failed write of the writer
                self._fail()
                return
            self.frames_sent += 1
            if written == len(data):
                self.direct_writes += 1
                return
            data = data[written:]  # the rest goes first to the writer; later frames queue behind it
        else:
            self.frames_sent += 1
        try:
            self._out_send.send_nowait(data)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise LinkClosed("data-plane link closed") from None
        self._queued += 1

    def _fail(self) -> None:
        self.closed = True
        self._out_send.close()  # the writer returns (``drained``) once what is queued is dropped

    async def run_writer(self) -> None:
        """Write queued frames until the link closes (or the peer stops reading)."""
        recv = self._out_recv
        try:
            async for first in recv:
                parts = [first]
                while True:
                    try:
                        parts.append(recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break  # (closed: the next receive ends the loop once this batch is out)
                await self.stream.send_all(b"".join(parts) if len(parts) > 1 else first)
                self._queued -= len(parts)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.closed = True
        finally:
            self.drained.set()

    async def frames(self) -> AsyncGenerator[Any, None]:
        """The peer's frames until it closes the connection (EOF or a broken socket)."""
        reader = FrameReader()
        sock = self._socket
        if sock is None:
            while True:
                try:
                    data = await self.stream.receive_some(READ_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
                if not data:
                    return
                for frame in reader.feed(data):
                    self.frames_received += 1
                    yield frame
        running = 0  # reads in a row that found data (no yield in between)
        while True:
            try:
                data = os.read(sock.fileno(), READ_BYTES)  # (a closed socket's fileno is -1: EBADF)
            except BlockingIOError:
                running = 0
                try:
                    await trio.lowlevel.wait_readable(sock)
                except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                    return
                continue
            except OSError:
                return
            if not data:
                return
            for frame in reader.feed(data):
                self.frames_received += 1
                yield frame
            running += 1
            if running >= 2:
                running = 0
                await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """No more frames: the writer writes what is queued, then returns."""
        self.closed = True
        self._out_send.close()
