"""httpx's transport, with its idle connections closed without waiting for its next request.

httpx's pool (httpcore's) closes a keep-alive connection that expired, or that the server closed,
only when the pool is next used: after a burst to an ``https://`` worker the idle connections stayed
open past ``keepalive_expiry_seconds``, and in CLOSE-WAIT once the worker had closed them, until the
next request to it; a relay's client for the routes it forwards to the scheduler process kept its
connections to the scheduler's listener in CLOSE-WAIT after that listener's keep-alive timeout.
:class:`ReapedTransport` is httpx's own transport with a reaper task
(:meth:`ReapedTransport.run_reaper`, run in the nursery that owns the transport) that does for its
pool what :meth:`daemon.h1client.H1Pool.run_reaper` does for agentd's own HTTP/1.1 pool
(docs/operations.md §11.2):

* each idle connection is closed at its expiry (``keepalive_expiry`` after its last response ended):
  the reaper sleeps until the soonest one, and not at all while no connection is idle;
* one the server closed or reset while idle is closed as soon as the FIN or RST arrives: every
  connection's socket is registered once, when it is opened, in the reaper's epoll set for the
  peer's hang-up only (``EPOLLRDHUP``, edge-triggered), so response bytes never wake the reaper;
* a busy connection is left to its request.

The request path pays no system call for this: a response's end only arms the reaper's deadline
when it sleeps without one.  It relies on attributes of httpx 0.27-0.28 and httpcore 1.x that are not
public API (the transport's ``_pool``, the pool's ``_network_backend``, an HTTP/1.1 connection's
``_expire_at``); pyproject pins both ranges, and the first two are checked when the transport is made.
"""

from __future__ import annotations

import math
import select
import time
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any

import httpcore
import httpx
import trio

_CLOSE_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, httpcore.NetworkError)


class _HangupBackend(httpcore.AsyncNetworkBackend):
    """The pool's network backend, plus a call with every stream it opens (the reaper's watch)."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend, opened: Callable[[Any], None]) -> None:
        self._inner = inner
        self._opened = opened

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        self._opened(stream)
        return stream

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)
        self._opened(stream)
        return stream

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Ending(httpx.AsyncByteStream):
    """A response body that tells the reaper when it is closed (its connection may be idle now);
    iterating it is iterating the body itself."""

    __slots__ = ("_inner", "_ended")

    def __init__(self, inner: httpx.AsyncByteStream, ended: Callable[[], None]) -> None:
        self._inner = inner
        self._ended = ended

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._inner.__aiter__()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._ended()


def _expire_at(connection: Any) -> float | None:
    """An idle HTTP/1.1 connection's expiry on ``time.monotonic()``'s clock (httpcore's), if known."""
    at = getattr(getattr(connection, "_connection", None), "_expire_at", None)
    return at if isinstance(at, float) else None


class ReapedTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose idle connections :meth:`run_reaper` closes (module doc)."""

    def __init__(self, *, limits: httpx.Limits, **kwargs: Any) -> None:
        super().__init__(limits=limits, **kwargs)
        pool = getattr(self, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if not isinstance(pool, httpcore.AsyncConnectionPool) or not isinstance(backend, httpcore.AsyncNetworkBackend):
            raise TypeError(
                "httpx's transport has no httpcore connection pool with a network backend: "
                "daemon/pool_reaper.py supports httpx 0.27-0.28 with httpcore 1.x"
            )
        self._core = pool
        self._expiry = limits.keepalive_expiry
        self._hangups = select.epoll()  # every open connection's socket (closing one unregisters it)
        pool._network_backend = _HangupBackend(backend, self._watch)
        self._reaper: trio.CancelScope | None = None  # the reaper's wait (deadline: the next expiry)
        self._running = False
        self.reaped_count = 0  # idle connections the reaper closed: expired, or closed by the server
        self.reaper_wakeups = 0  # (tests: it wakes at expiries and hang-ups only)

    def open_connections(self) -> int:
        return sum(1 for c in self._core.connections if not c.is_closed())

    def idle_connections(self) -> int:
        return sum(1 for c in self._core.connections if c.is_idle() and not c.is_closed())

    def _watch(self, stream: Any) -> None:
        sock = stream.get_extra_info("socket")
        if sock is None or self._hangups.closed:
            return
        try:
            self._hangups.register(sock.fileno(), select.EPOLLRDHUP | select.EPOLLET)
        except (OSError, ValueError):  # closed meanwhile
            pass

    def _response_ended(self) -> None:
        reaper = self._reaper
        if reaper is not None and reaper.deadline == math.inf and self._expiry is not None:
            # the reaper asleep with nothing idle: this response's connection (if it stays open)
            # expires then; armed earlier, it wakes then and looks again
            reaper.deadline = trio.current_time() + self._expiry

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Ending(response.stream, self._response_ended)
        return response

    async def run_reaper(self) -> None:
        """Close idle connections at their expiry, and those the server closed at once, until
        cancelled or the transport is closed (run it in the nursery that owns the transport)."""
        if self._running:
            raise RuntimeError("the transport's reaper is already running")
        if self._hangups.closed:
            return
        self._running = True
        hangups = self._hangups
        try:
            while not hangups.closed:  # (closed while it closed a connection: the transport is gone)
                with trio.CancelScope(deadline=self._next_expiry()) as self._reaper:
                    await trio.lowlevel.wait_readable(hangups.fileno())
                self._reaper = None
                self.reaper_wakeups += 1
                hangups.poll(0)  # (edge-triggered: consumed)
                await self._reap()
        except trio.ClosedResourceError:  # the transport was closed (aclose)
            return
        finally:
            self._reaper = None
            self._running = False

    def _next_expiry(self) -> float:
        if self._expiry is None:
            return math.inf
        soonest = math.inf
        for connection in self._core.connections:
            if connection.is_idle() and not connection.is_closed():
                at = _expire_at(connection)
                soonest = min(soonest, at if at is not None else time.monotonic() + self._expiry)
        if soonest == math.inf:
            return math.inf
        return trio.current_time() + max(0.0, soonest - time.monotonic())

    async def _reap(self) -> None:
        """Close the idle connections that expired or whose server hung up (httpcore's own test:
        ``has_expired``, which also finds an idle socket readable); the pool forgets closed ones
        the next time it is used."""
        for connection in self._core.connections:
            if not connection.is_idle() or connection.is_closed():
                continue  # busy (its request decides), or gone
            at = _expire_at(connection)
            if connection.has_expired() or (at is not None and at <= time.monotonic()):
                self.reaped_count += 1
                with trio.CancelScope(shield=True):
                    try:
                        await connection.aclose()  # (marked closed before its first checkpoint)
                    except _CLOSE_ERRORS:
                        pass

    def _close_hangups(self) -> None:
        if not self._hangups.closed:
            trio.lowlevel.notify_closing(self._hangups.fileno())  # a waiting reaper returns
            self._hangups.close()

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            self._close_hangups()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc_value, traceback)
        finally:
            self._close_hangups()
