"""Serving an ASGI app on hypercorn's HTTP/1.1 protocol inside the caller's nursery.

:func:`serve_http` builds the hypercorn ``Config`` (bind, logging through the ``agentd`` logger,
no access log) and reports the *bound* URL (the real port when 0 was asked) through
``task_status`` once the socket listens.  It runs hypercorn's connection handler (its
``TCPServer``, as :class:`~daemon.http.hypercorn_close.PromptCloseTCPServer`: a connection the
client closed ends at once) under agentd's own accept loop instead of ``hypercorn.trio.serve``,
which is what adds the connection-level limits of docs/config.md ``[limits]``
(docs/operations.md §10).  Inside each connection runs either agentd's own HTTP/1.1 protocol
(:mod:`daemon.http.h1proto`, the default) or hypercorn's h11-based one (``[server]
http1_implementation``, docs/operations.md §13.7); the limits below hold for both:

* **connection cap** (:class:`ServerState` ``max_connections``): a connection over the cap is
  answered with a JSON 503 + ``Retry-After`` and closed, never left hanging in the backlog;
* **client-write timeout**: a socket write of a response pending for longer than
  ``client_write_timeout_seconds`` (:class:`WriteTimeoutStream`, checked by a per-listener
  watchdog) closes the connection, which the app sees as a disconnect (the request is cancelled
  and its lease released);
* **drain**: when ``shutdown_trigger`` returns, the listeners close at once (no new
  connections), idle keep-alive connections are closed, and open connections get
  ``hard_grace_seconds`` to finish: the app itself answers everything still running by
  ``shutdown_grace_seconds`` (docs/operations.md §10.4, :mod:`daemon.http.edge`), the extra
  seconds only let those answers reach the clients.  Writes never outlive that hard deadline.
"""

from __future__ import annotations

import errno
import math
import os
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

from actors.logevents import get_logger, log_event
from daemon.config import HTTP1_ENV, HTTP1_IMPLEMENTATIONS
from daemon.http.errors import error_body
from daemon.http.h1proto import H1Connection, disconnect_hub
from daemon.http.hypercorn_close import PromptCloseTCPServer

KEEP_ALIVE_MAX_REQUESTS = 1 << 62
ACCEPT_BACKLOG = 4096
logger = get_logger("serve")
RECEIVE_BYTES = 65536  # a read without a size (hypercorn always passes one)
OVER_CAP_READ_SECONDS = 1.0  # how long an over-the-cap connection may take to send its request head


def bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def hypercorn_config(host: str, port: int, grace_seconds: float) -> Config:
    config = Config()
    config.bind = [bind_address(host, port)]
    config.graceful_timeout = grace_seconds
    config.accesslog = None
    config.errorlog = get_logger("hypercorn")
    config.include_server_header = False
    config.keep_alive_timeout = 75.0
    # a burst of connects (a thousand agents starting at once) must not overflow the accept queue:
    # hypercorn's default of 100 turns the overflow into SYN retries of a second or more
    config.backlog = ACCEPT_BACKLOG
    # hypercorn closes a keep-alive connection after 1000 requests by default, and that close races
    # the app's last body write (trio.BusyResourceError): the 1000th response is lost.  Agents keep
    # one connection for a whole session, so agentd never recycles connections by request count.
    config.keep_alive_max_requests = KEEP_ALIVE_MAX_REQUESTS
    return config


class ListenError(Exception):
    """A listener could not be opened (the address is in use, not permitted, not local): the
    configuration field that names the port, the address and the system's reason; ``agentd
    start`` prints ``lines`` and exits 2 (docs/config.md)."""

    def __init__(self, field: str, address: str, error: OSError) -> None:
        reason = error.strerror or str(error)
        port_field = field.endswith(".port") or field == "--port"  # a field, or agentd sim-backend's flag
        if port_field and (isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL):
            # a host that does not resolve or is no address of this machine: the host is wrong, not
            # the port (it said "server.port: cannot listen on nosuchhost:3001: Name or service not known")
            field = field.removesuffix("port") + "host"
        super().__init__(f"{field}: cannot listen on {address}: {reason}")
        self.lines = [f"{field}: cannot listen on {address}: {reason} (errno {error.errno})"]


def create_listening_sockets(config: Config, field: str) -> list[socket.socket]:
    """hypercorn's sockets for ``config.bind``; a bind failure is a :class:`ListenError` naming
    ``field``."""
    try:
        return list(config.create_sockets().insecure_sockets)
    except OSError as error:
        raise ListenError(field, ", ".join(config.bind), error) from error


@attrs.define(eq=False)
class ServerState:
    """Connection-level limits and counters of one listener (read by diagnostics and tests)."""

    max_connections: int = 1 << 30
    # open connections from one client address (0: no cap; docs/operations.md §10.3)
    max_connections_per_client: int = 0
    client_write_timeout_seconds: float = math.inf
    retry_after_seconds: int = 1
    open_connections: int = 0
    rejected_connections: int = 0
    rejected_client_connections: int = 0  # refused over max_connections_per_client
    per_client: dict[str, int] = attrs.field(factory=dict)  # open connections by client address (with a cap)
    write_timeouts: int = 0
    hard_deadline: float = math.inf  # set when the drain starts: no write outlives it
    # called once per accepted connection when it ends (a relay's BalancedListener counts its own)
    connection_ended: Callable[[], None] | None = None


class WriteTimeoutStream(trio.abc.HalfCloseableStream):
    """A client socket whose writes give up after the client-write timeout (see the module doc).

    A write records when it started; the listener's watchdog (:func:`_watch_writes`) closes the
    socket of a write pending for longer than the timeout (or past the drain's hard deadline).
    hypercorn, whose writes are shielded from cancellation, then sees the connection closed and the
    app receives ``http.disconnect``.  No cancel scope per write: this is the hot path.
    """

    def __init__(self, inner: trio.SocketStream, state: ServerState) -> None:
        self.inner = inner
        self.socket = inner.socket
        self._state = state
        self.write_since: float | None = None
        self.timed_out = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.write_since = trio.current_time()
        try:
            await self.inner.send_all(data)
        except trio.ClosedResourceError:
            if self.timed_out:
                raise trio.BrokenResourceError("client write timeout: the client stopped reading") from None
            raise
        finally:
            self.write_since = None

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """Trio's ``receive_some`` without its per-call context manager and scheduler round trip
        when the socket answers at once (docs/benchmarks.md §10.2): bytes already there are taken
        without waiting, else the wait is Trio's ``wait_readable`` (a checkpoint that a close of the
        socket, such as the write watchdog's, interrupts).  Errors go through Trio's own path, so
        the caller sees the same exceptions."""
        raw = self.socket._sock  # type: ignore[attr-defined]
        size = max_bytes or RECEIVE_BYTES
        try:
            return raw.recv(size)
        except BlockingIOError:
            pass
        except OSError:
            return await self.inner.receive_some(max_bytes)
        await trio.lowlevel.wait_readable(raw)
        try:
            return raw.recv(size)
        except OSError:
            return await self.inner.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _watch_writes(state: ServerState, streams: set[WriteTimeoutStream]) -> None:
    """Close the socket of every write stuck past the client-write timeout or the hard deadline."""
    period = min(1.0, state.client_write_timeout_seconds / 4)
    while True:
        await trio.sleep(period)
        now = trio.current_time()
        for stream in list(streams):
            since = stream.write_since
            if since is None or stream.timed_out:
                continue
            if now - since >= state.client_write_timeout_seconds or now >= state.hard_deadline:
                stream.timed_out = True
                state.write_timeouts += 1
                stream.inner.socket.close()  # wakes the pending write with ClosedResourceError


# hypercorn's connection handler: a connection the client closed ends at once (no keep-alive
# linger, daemon/http/hypercorn_close.py), so the connection count is exact.
_Connection = PromptCloseTCPServer


def resolve_http1(configured: str | None) -> str:
    """The HTTP/1.1 protocol to run: :data:`~daemon.config.HTTP1_ENV` when set, else ``configured``,
    else agentd's (docs/config.md ``[server] http1_implementation``)."""
    value = os.environ.get(HTTP1_ENV) or configured or "agentd"
    if value not in HTTP1_IMPLEMENTATIONS:
        raise ValueError(f"{HTTP1_ENV}: must be one of {', '.join(HTTP1_IMPLEMENTATIONS)}, got {value!r}")
    return value


def over_capacity_response(retry_after: int, *, per_client: int = 0) -> bytes:
    """The answer to a connection over ``limits.max_connections`` (a 503: agentd is full), or, with
    ``per_client``, over ``limits.max_connections_per_client`` (a 429: this client holds too many)."""
    if per_client:
        body = error_body(
            f"too many open connections from this client ({per_client}, limits.max_connections_per_client); "
            "reuse or close connections, or retry later",
            "rate_limit_error",
            None,
            "too_many_client_connections",
        )
        status = "429 Too Many Requests"
    else:
        body = error_body(
            "too many open connections to agentd (limits.max_connections); retry later",
            "server_error",
            None,
            "too_many_connections",
        )
        status = "503 Service Unavailable"
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: {retry_after}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def client_address(stream: trio.SocketStream) -> str | None:
    """The peer's address (IPv4-mapped IPv6 as IPv4), None when the socket has none (closed)."""
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return None
    host = peer[0] if isinstance(peer, tuple) else str(peer)
    return host[7:] if isinstance(host, str) and host.startswith("::ffff:") else str(host)


async def _refuse(stream: trio.SocketStream, state: ServerState, *, per_client: bool = False) -> None:
    """Answer a connection over a cap: read its request head (briefly), a JSON 503 (or 429 over the
    per-client cap), close."""
    if per_client:
        state.rejected_client_connections += 1
    else:
        state.rejected_connections += 1
    answer = over_capacity_response(
        state.retry_after_seconds, per_client=state.max_connections_per_client if per_client else 0
    )
    try:
        with trio.move_on_after(OVER_CAP_READ_SECONDS):
            seen = b""
            while b"\r\n\r\n" not in seen and len(seen) < 65536:
                data = await stream.receive_some(65536)
                if not data:
                    break
                seen += data
        with trio.move_on_after(OVER_CAP_READ_SECONDS):
            await stream.send_all(answer)
            await stream.send_eof()
            with trio.move_on_after(OVER_CAP_READ_SECONDS):  # let the client read before the close
                while await stream.receive_some(65536):
                    pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def serve_http(
    app: Any,
    host: str,
    port: int,
    grace_seconds: float,
    shutdown_trigger: Callable[[], Awaitable[None]],
    *,
    state: ServerState | None = None,
    hard_grace_seconds: float | None = None,
    sock: socket.socket | None = None,
    listener: Any = None,
    http1: str | None = None,
    listen_field: str = "server.port",
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``shutdown_trigger`` returns, then drain (see the module doc).

    ``hard_grace_seconds`` (default ``grace_seconds``) bounds how long open connections may live
    after the trigger.  ``sock``: accept on this listening socket (a relay process's inherited
    public socket, docs/operations.md §13) instead of binding ``host:port``; it is closed at the
    drain like a socket of our own.  ``listener``: accept through this Trio listener instead (a relay
    process's :class:`~daemon.dataplane.balance.BalancedListener` over that socket, which has a
    ``socket`` attribute); closed at the drain too.  ``http1``: the HTTP/1.1 protocol of each
    connection, ``"agentd"`` (daemon/http/h1proto.py) or ``"hypercorn"`` (:func:`resolve_http1`).
    ``listen_field``: the configuration field a bind failure names (:class:`ListenError`)."""
    state = state if state is not None else ServerState()
    own_protocol = resolve_http1(http1) == "agentd"
    hard = grace_seconds if hard_grace_seconds is None else hard_grace_seconds
    config = hypercorn_config(host, port, hard)
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan = Lifespan(asgi, config, {})
    context = WorkerContext(None)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listeners: list[Any] = []
            binds = []
            if listener is not None:
                listeners.append(listener)
                binds.append(f"http://{repr_socket_addr(listener.socket.family, listener.socket.getsockname())}")
            if listener is not None:
                own_sockets: list[socket.socket] = []
            else:
                own_sockets = [sock] if sock is not None else create_listening_sockets(config, listen_field)
            for one in own_sockets:
                one.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(one)))
                binds.append(f"http://{repr_socket_addr(one.family, one.getsockname())}")

            streams: set[WriteTimeoutStream] = set()
            own: set[H1Connection] = set()  # connections on agentd's protocol (closed when idle at the drain)
            if own_protocol:
                disconnect_hub()  # started with the server: its epoll descriptor is there from the start
            # outside the connections' nursery: it must outlive them (past the hard deadline too)
            lifespan_nursery.start_soon(_watch_writes, state, streams)

            async def handle(stream: trio.SocketStream) -> None:
                if state.open_connections >= state.max_connections:
                    await _refuse(stream, state)
                    return
                client = client_address(stream) if state.max_connections_per_client else None
                if client is not None:
                    held = state.per_client.get(client, 0)
                    if held >= state.max_connections_per_client:
                        await _refuse(stream, state, per_client=True)
                        return
                    state.per_client[client] = held + 1
                try:
                    await _serve_connection(stream)
                finally:
                    if client is not None:
                        left = state.per_client[client] - 1
                        if left:
                            state.per_client[client] = left
                        else:
                            del state.per_client[client]

            async def _serve_connection(stream: trio.SocketStream) -> None:
                state.open_connections += 1
                wrapped = WriteTimeoutStream(stream, state)
                streams.add(wrapped)
                try:
                    if own_protocol:
                        connection = H1Connection(
                            app,
                            wrapped,
                            keep_alive_timeout=config.keep_alive_timeout,
                            max_head_bytes=config.h11_max_incomplete_size,
                            terminated=context.terminated,
                            root_path=config.root_path,
                        )
                        own.add(connection)
                        try:
                            await connection.run()
                        finally:
                            own.discard(connection)
                    else:
                        await _Connection(asgi, config, context, ConnectionState({}), wrapped)
                finally:
                    streams.discard(wrapped)
                    state.open_connections -= 1

            async def handle_counted(stream: trio.SocketStream) -> None:
                try:
                    await handle(stream)
                finally:
                    assert state.connection_ended is not None
                    state.connection_ended()

            handler = handle if state.connection_ended is None else handle_counted

            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(
                        partial(trio.serve_listeners, handler, [listener], handler_nursery=connections)
                    )
                task_status.started(binds[0])
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
            for listener in listeners:
                await listener.aclose()
            log_event(logger, 20, "listener_closed", url=binds[0], open_connections=state.open_connections)
            state.hard_deadline = trio.current_time() + hard
            await context.terminated.set()  # idle keep-alive connections close now
            for connection in list(own):
                connection.drain()
            connections.cancel_scope.deadline = state.hard_deadline
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
