"""A framed connection between a relay and the scheduler (:mod:`daemon.dataplane.wire` frames).

``send`` never awaits: frames queue in an unbounded in-process channel and one writer task writes
everything queued as one socket write (a burst of completions costs one syscall).  The queue is
unbounded on purpose: a lease's release is sent from synchronous code (``lease.finish``) and from
``finally`` blocks, and must never be dropped (docs/operations.md §13); its size is bounded by the
number of open requests.  ``frames()`` yields the decoded frames the peer sent until it closes.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import trio

from daemon.dataplane.wire import FrameReader, encode

READ_BYTES = 256 * 1024


class LinkClosed(Exception):
    """The connection is closed: nothing more can be sent."""


class Link:
    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self.stream = stream
        self._out_send, self._out_recv = trio.open_memory_channel[bytes](math.inf)
        self.closed = False
        self.frames_sent = 0
        self.frames_received = 0
        self.drained = trio.Event()  # the writer returned: everything queued was written (or lost)

    def send(self, frame: Any) -> None:
        """Queue one frame (raises :class:`LinkClosed` once the link is closed)."""
        if self.closed:
            raise LinkClosed("data-plane link closed")
        try:
            self._out_send.send_nowait(encode(frame))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise LinkClosed("data-plane link closed") from None

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
                self.frames_sent += len(parts)
                await self.stream.send_all(b"".join(parts) if len(parts) > 1 else first)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.closed = True
        finally:
            self.drained.set()

    async def frames(self) -> AsyncIterator[Any]:
        """The peer's frames until it closes the connection (EOF or a broken socket)."""
        reader = FrameReader()
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

    def close(self) -> None:
        """No more frames: the writer writes what is queued, then returns."""
        self.closed = True
        self._out_send.close()
