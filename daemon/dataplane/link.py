"""A framed connection between a relay and the scheduler (:mod:`daemon.dataplane.wire` frames).

``send`` never awaits.  On a socket link with nothing queued, the first frame sent in a turn of
trio's run loop is written at once, from the caller's own task (one non-blocking ``write``): an
``Ask``, a ``Grant`` or a ``Finish`` is in the peer's socket before the caller's next checkpoint,
instead of a run-loop turn later when a writer task would have woken (docs/benchmarks.md
§10.3.2).  The frames sent after it in the same turn are gathered and written together, as one
``write``, when the turn ends (just before the run loop next waits for I/O: a trio instrument's
``before_io_wait``, no task and no extra turn), so a burst of frames - the ``Grant`` of every
``Ask`` of one read, the ``Ask`` of every request parsed in one turn - costs the peer one wake-up
and one read instead of one per frame (docs/benchmarks.md §10.3.4).  One request at a time (c=1)
every frame is the first of its turn and leaves at once, as before.  What the socket does not take
at once (its buffer is full) and every frame behind it queue in an unbounded in-process channel,
and one writer task writes everything queued as one socket write, so the order of frames is the
order of ``send`` calls.  The queue is unbounded on purpose: a lease's release is sent from synchronous
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


class _TurnEnd(trio.abc.Instrument):
    """Writes what links gathered during a turn of the run loop, before it waits for I/O."""

    def __init__(self) -> None:
        self.links: list[Link] = []

    def before_io_wait(self, timeout: float) -> None:
        if self.links:
            links, self.links = self.links, []
            for link in links:
                link._end_turn()


_TURN_END = trio.lowlevel.RunVar[_TurnEnd]("dataplane_turn_end")


def _turn_end() -> _TurnEnd:
    """This run's instrument (added on first use)."""
    try:
        return _TURN_END.get()
    except LookupError:
        instrument = _TurnEnd()
        trio.lowlevel.add_instrument(instrument)
        _TURN_END.set(instrument)
        return instrument


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
        self.writes = 0  # socket writes by ``send`` and at the end of a turn (not the writer task's)
        self.reads = 0  # socket reads that returned data
        self._in_turn = False  # a frame was written or gathered in this run-loop turn
        self._gathered: list[bytes] = []  # frames that wait for the end of this turn
        self.drained = trio.Event()  # the writer returned: everything queued was written (or lost)

    def send(self, frame: Any) -> None:
        """Send one frame: written now when it is the first of this run-loop turn and nothing is
        queued ahead of it, else gathered until the turn ends (or queued for the writer task);
        raises :class:`LinkClosed` once the link is closed."""
        if self.closed:
            raise LinkClosed("data-plane link closed")
        data = encode(frame)
        self.frames_sent += 1
        if self._queued:
            self._enqueue(data)
        elif self._in_turn:
            self._gathered.append(data)  # written with the others when the turn ends
        elif self._socket is None:
            self._enqueue(data)
        else:
            self._in_turn = True
            _turn_end().links.append(self)
            if self._write(data):
                self.direct_writes += 1

    def _write(self, data: bytes) -> bool:
        """One non-blocking write of ``data``; what the socket does not take goes to the writer
        task first.  True when all of it was written."""
        assert self._socket is not None
        try:
            written = os.write(self._socket.fileno(), data)
        except BlockingIOError:
            written = 0
        except OSError:  # the peer is gone (or the socket closed): as a failed write of the writer
            self._fail()
            return False
        self.writes += 1
        if written == len(data):
            return True
        self._enqueue(data[written:])
        return False

    def _enqueue(self, data: bytes) -> None:
        try:
            self._out_send.send_nowait(data)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise LinkClosed("data-plane link closed") from None
        self._queued += 1

    def _end_turn(self) -> None:
        """The run loop is about to wait for I/O: write what this turn gathered (one ``write``).
        Called by the instrument, outside any task: a write that leaves bytes for the writer task
        (or fails) also wakes the run loop, whose wait was computed before the writer became
        runnable."""
        self._in_turn = False
        if not self._gathered:
            return
        data = b"".join(self._gathered)
        self._gathered = []
        if self.closed:
            return  # (close() handed the gathered frames to the writer; _fail() dropped them)
        if self._queued:
            self._enqueue(data)
        elif self._write(data):
            return
        trio.lowlevel.current_trio_token().run_sync_soon(_nothing)

    def _fail(self) -> None:
        self.closed = True
        self._gathered = []
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
            self.reads += 1
            for frame in reader.feed(data):
                self.frames_received += 1
                yield frame
            running += 1
            if running >= 2:
                running = 0
                await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """No more frames: the writer writes what is queued (and what this turn gathered), then
        returns."""
        if not self.closed and self._gathered:
            self._out_send.send_nowait(b"".join(self._gathered))
            self._queued += 1
        self._gathered = []
        self.closed = True
        self._out_send.close()


def _nothing() -> None:
    """(A callback whose only effect is to wake the run loop from its I/O wait.)"""
