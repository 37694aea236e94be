"""Spreading accepted connections evenly over the relay processes (docs/operations.md §13.1).

Every relay accepts on the same inherited listening socket.  Left to the kernel, a new connection
goes to whichever relay calls ``accept`` first, which is a matter of who happened to be waiting:
32 keep-alive connections opened together ended up 7/25 or 24/8 over two relays
(docs/benchmarks.md §10.3), and because agents keep a connection for a whole session, that split
stays for hours.

:class:`AcceptBoard` is a small shared-memory table (a ``memfd`` the scheduler process creates and
every relay maps): one slot per relay, holding that relay's open connections, or
:data:`NOT_ACCEPTING` while it is not accepting (not started yet, draining, dead).  A relay writes
only its own slot, at each accept and each connection's end; the scheduler process writes a slot
only to mark a relay that exited as not accepting.  Reads of another relay's slot may be a moment
old; that costs at most one connection placed on the second-best relay.

:class:`BalancedListener` is the relay's Trio listener.  When the listening socket becomes
readable every relay waiting on it wakes (the kernel wakes all of them); a relay that holds more
connections than some other accepting relay lets that one take the connection: it checks again
every :data:`DEFER_POLL_SECONDS` and accepts the connection itself only if it is still waiting
:data:`DEFER_LIMIT_SECONDS` after it was first seen (the less loaded relay is stuck or starved of
CPU: a connection is never left in the backlog because of the balancing).  Ties are taken by the
first relay to ``accept``.  With no other accepting relay (one process, the others draining or
restarting) it accepts at once.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import socket
import tempfile

import trio

# accept(2) reports errors of the connection being accepted (reset or aborted before the accept,
# refused by a firewall, a network error pending on it): that connection is gone, the next one is
# accepted as usual.  Anything else (EMFILE and the like) goes to trio.serve_listeners.
CONNECTION_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED",
        "ECONNRESET",
        "EPERM",
        "EPROTO",
        "ETIMEDOUT",
        "ENETDOWN",
        "ENETUNREACH",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "ENONET",
        "ENOPROTOOPT",
        "EOPNOTSUPP",
    )
    if hasattr(errno, name)
)
NOT_ACCEPTING = -1
SLOT_BYTES = 4  # a signed 32-bit count: one aligned machine word, written and read whole
DEFER_POLL_SECONDS = 0.001
DEFER_LIMIT_SECONDS = 0.25


class AcceptBoard:
    """The shared table of open connections per relay (see the module doc)."""

    def __init__(self, fd: int, slots: int) -> None:
        self.fd = fd
        self.slots = slots
        self._map = mmap.mmap(fd, slots * SLOT_BYTES)
        self._counts = memoryview(self._map).cast("i")

    @classmethod
    def create(cls, slots: int) -> AcceptBoard:
        """A new table (in the scheduler process), every slot :data:`NOT_ACCEPTING`; its ``fd`` is
        passed to each relay process (not inheritable by anything else)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("agentd-accept-board", os.MFD_CLOEXEC)
        else:  # (not Linux) an unlinked temporary file serves the same purpose
            with tempfile.TemporaryFile() as fh:
                fd = os.dup(fh.fileno())
        os.ftruncate(fd, slots * SLOT_BYTES)
        board = cls(fd, slots)
        for i in range(slots):
            board.set(i, NOT_ACCEPTING)
        return board

    def set(self, slot: int, value: int) -> None:
        self._counts[slot] = value

    def get(self, slot: int) -> int:
        return int(self._counts[slot])

    def counts(self) -> list[int]:
        if self._map.closed:
            return [NOT_ACCEPTING] * self.slots
        return list(self._counts)

    def least_other(self, slot: int) -> int | None:
        """The fewest open connections of another accepting relay; None when no other accepts."""
        best: int | None = None
        for i, value in enumerate(self._counts):
            if i != slot and value != NOT_ACCEPTING and (best is None or value < best):
                best = value
        return best

    def close(self) -> None:
        self._counts.release()
        self._map.close()
        os.close(self.fd)


class BalancedListener(trio.abc.Listener[trio.SocketStream]):
    """Accepts on a shared listening socket, leaving a new connection to a less loaded relay (see
    the module doc).  :meth:`connection_closed` must be called once for every stream returned."""

    def __init__(self, sock: socket.socket, board: AcceptBoard | None, slot: int) -> None:
        sock.setblocking(False)
        self.socket = sock
        self.board = board
        self.slot = slot
        self.open_connections = 0
        self.deferred_count = 0  # connections first seen here and left to a less loaded relay
        self.fallback_count = 0  # connections taken here after DEFER_LIMIT_SECONDS of deferring
        self._closed = False
        self._poll = select.poll()  # is a connection still waiting? (no fd-number limit, unlike select)
        self._poll.register(sock, select.POLLIN)
        self._accepting = False  # the slot says NOT_ACCEPTING until the first accept() call

    def _publish(self) -> None:
        if self.board is not None:
            accepting = self._accepting and not self._closed
            self.board.set(self.slot, self.open_connections if accepting else NOT_ACCEPTING)

    def _should_defer(self) -> bool:
        if self.board is None:
            return False
        least = self.board.least_other(self.slot)
        return least is not None and least < self.open_connections

    async def accept(self) -> trio.SocketStream:
        if not self._accepting and not self._closed:
            self._accepting = True
            self._publish()
        while True:
            if self._closed:
                raise trio.ClosedResourceError("the listener was closed")
            await trio.lowlevel.wait_readable(self.socket)
            deferring_since: float | None = None
            while self._should_defer():
                now = trio.current_time()
                if deferring_since is None:
                    deferring_since = now
                    self.deferred_count += 1
                elif now - deferring_since >= DEFER_LIMIT_SECONDS:
                    self.fallback_count += 1
                    break
                await trio.sleep(DEFER_POLL_SECONDS)
                if self._closed or not self._poll.poll(0):
                    break  # taken by another relay (or closed): back to waiting
            try:
                conn, _ = self.socket.accept()
            except BlockingIOError:  # another relay took it
                continue
            except OSError as exc:
                if self._closed or exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the listener was closed") from exc
                if exc.errno in CONNECTION_ERRNOS:
                    continue
                raise  # trio.serve_listeners backs off on EMFILE and the like
            self.open_connections += 1
            self._publish()
            return trio.SocketStream(trio.socket.from_stdlib_socket(conn))

    def connection_closed(self) -> None:
        self.open_connections -= 1
        self._publish()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._publish()
            trio.lowlevel.notify_closing(self.socket)
            self.socket.close()
        await trio.lowlevel.checkpoint()
