"""Close a client connection's socket as soon as the client has gone (hypercorn 0.18, trio).

When a client closes (or resets) a connection that hypercorn considers idle - after a complete
response on a keep-alive connection, before a request head arrived, or during a request that then
ends - hypercorn's trio ``TCPServer`` leaves its read loop but then waits for its keep-alive idle
task (``keep_alive_timeout``) before it closes the socket: the socket sits in CLOSE_WAIT, holding a file
descriptor, for that long.  Clients that drop connections quickly can exhaust descriptors.  The
subclass below stops the idle task when the read loop ends and never restarts it after that, so
the socket closes as soon as the connection's request task is done
(found by the fault suite's descriptor check, docs/operations.md §11).

Two per-request costs of hypercorn's connection handler are replaced (docs/benchmarks.md §10.2,
same behaviour, measured there):

* **keep-alive idle timer**: hypercorn stops its idle task when a request starts and spawns a new
  one (a lock, a task, two cancel scopes) when the connection turns idle again.  Here one watcher
  task lives as long as the connection and the per-request switch only moves its deadline
  (:class:`IdleWatch`): an idle connection still closes after ``keep_alive_timeout`` or at once when
  the server drains (``context.terminated``), a busy one never does.
* **socket writes**: a write that the kernel takes whole leaves at once, without the send lock, the
  shielding cancel scope and the scheduler round trips of a Trio send (no other write of the
  connection can be in progress then: the lock is free and the write does not wait); a write the
  socket cannot take whole continues on hypercorn's path with what is left.
* **socket reads**: without a configured ``read_timeout`` (agentd sets none: the body-read timeout
  of ``[limits]`` bounds a slow request) hypercorn's read loop runs without its per-read cancel scope,
  and a read that filled its 64 KiB buffer is followed by one of :data:`LARGE_RECV` (a large request
  body arrives in a few pieces, each one h11 event and one ASGI message less).

:mod:`daemon.http.serve` runs its own accept loop (connection cap, write timeout, drain) and
instantiates the subclass directly; :func:`install` swaps it in for the class hypercorn's own trio
runner (``hypercorn.trio.serve``) instantiates, for any code that still serves through that.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import hypercorn.trio.run
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

from daemon.http.errors import error_body

# Set by the app around an ASGI send whose bytes should leave with the next write of the same
# connection: a complete response's head then goes out with its body in one socket write
# (daemon.http.app.AsgiSink; one send system call less per response, docs/benchmarks.md §10.2).
# hypercorn turns an ASGI send into socket writes in the sending task, so the flag is seen there.
# the read size after a read that filled hypercorn's MAX_RECV (64 KiB) buffer
LARGE_RECV = 1024 * 1024

HOLD_WRITE: contextvars.ContextVar[bool] = contextvars.ContextVar("agentd_hold_write", default=False)


class IdleWatch:
    """hypercorn's ``TrioSingleTask`` for the keep-alive idle timer, without a task per request.

    ``restart`` (the connection turned idle) arms a deadline ``timeout`` seconds ahead; ``stop``
    (a request started) disarms it.  The first ``restart`` starts the one watcher task; it runs
    ``on_idle`` (hypercorn's close of the connection, shielded) when an armed deadline passes or
    when ``terminated`` is set while armed.  :meth:`close` ends the watcher (the connection is
    over).  The ``action`` hypercorn passes to ``restart`` (its whole idle task) is not used."""

    def __init__(self, timeout: float, terminated: Any, on_idle: Callable[[], Awaitable[None]]) -> None:
        self._timeout = timeout
        self._terminated = terminated  # hypercorn's EventWrapper (wait / is_set)
        self._on_idle = on_idle
        self._armed = False
        self._deadline = math.inf
        self._scope: trio.CancelScope | None = None  # the watcher's current wait
        self._task_scope: trio.CancelScope | None = None  # the watcher as a whole
        self._closed = False

    async def restart(self, task_group: Any, action: Callable[[], Awaitable[None]]) -> None:
        self._armed = True
        self._deadline = trio.current_time() + self._timeout
        if self._task_scope is None:
            if not self._closed:
                self._task_scope = trio.CancelScope()
                task_group._nursery.start_soon(self._watch, self._task_scope)
            return
        if self._scope is not None:
            self._scope.deadline = self._deadline
            if self._terminated.is_set():
                self._scope.cancel()  # the drain is on: an idle connection closes now

    async def stop(self) -> None:
        self._armed = False
        self._deadline = math.inf
        if self._scope is not None:
            self._scope.deadline = math.inf

    def close(self) -> None:
        self._closed = True
        if self._task_scope is not None:
            self._task_scope.cancel()

    async def _watch(self, task_scope: trio.CancelScope) -> None:
        with task_scope:
            while True:
                with trio.CancelScope(deadline=self._deadline) as scope:
                    self._scope = scope
                    if self._terminated.is_set():
                        if self._armed:
                            break
                        await trio.sleep_forever()  # until the connection turns idle (restart)
                    else:
                        await self._terminated.wait()
                        if self._armed:
                            break
                self._scope = None
                if self._armed and (self._terminated.is_set() or trio.current_time() >= self._deadline):
                    break
            self._scope = None
            with trio.CancelScope(shield=True):
                await self._on_idle()


def head_size(request: h11.Request) -> int:
    """The size of ``request``'s head as agentd's protocol measures it (request line and header
    lines with their line ends, without the blank line that ends the head); whitespace around
    header values that h11 dropped is not counted."""
    size = len(request.method) + len(request.target) + len(b"HTTP/") + len(request.http_version) + 2
    for name, value in request.headers.raw_items():
        size += len(name) + len(value) + 4  # "\r\n" before the line, ": " inside it
    return size


def head_too_large_response(limit: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The JSON 431 of agentd's protocol (daemon/http/h1proto.py), for hypercorn's."""
    return refusal_response(f"the request head exceeds {limit} bytes", "request_head_too_large", None)


def framing_problem(request: h11.Request) -> tuple[int, str, str, str | None] | None:
    """(status, message, code, param) for a request head agentd's protocol refuses and h11 serves,
    else None: ``content-length`` with ``transfer-encoding`` (h11 frames by the coding and keeps the
    connection, so bytes the client declared as body were read as the next request: request
    smuggling; RFC 9112 §6.1: close after answering) and a version other than 1.0/1.1 (h11 served
    ``HTTP/1.2``) and a method with lower-case letters (RFC 9110 §9.1: another method; hypercorn
    upper-cases it, so a filter in front that blocks ``POST`` would be passed by ``post``)."""
    if request.http_version not in (b"1.0", b"1.1"):
        version = request.http_version.decode("latin-1")[:20]
        return 400, f"unsupported HTTP version 'HTTP/{version}'; use HTTP/1.1", "unsupported_http_version", None
    method = request.method.decode("ascii", "replace")
    if method != method.upper():  # hypercorn upper-cases it: "post" would be served as POST
        target = request.target.decode("latin-1").partition("?")[0]
        shown = method[:40]
        message = (
            f"method {shown!r} is not allowed on {target[:200]}: "
            f"HTTP methods are case-sensitive (use {shown.upper()!r})"
        )
        return 405, message, "method_not_allowed", None
    names = {name for name, _ in request.headers}  # lower-cased by h11
    if b"transfer-encoding" in names and b"content-length" in names:
        message = "content-length and transfer-encoding together: the body's length is ambiguous"
        return 400, message, "invalid_header", "transfer-encoding"
    return None


def refusal_response(message: str, code: str, param: str | None) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """A JSON error that closes the connection, as agentd's protocol answers a malformed head."""
    body = error_body(message, "invalid_request_error", param, code)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"connection", b"close"),
    ]
    return headers, body


class BoundedH11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol with the request head bounded as in agentd's protocol.

    h11 enforces ``h11_max_incomplete_size`` (16 KiB) only on a head that is still incomplete: a
    larger head that arrived whole in one read (up to the 64 KiB of a read) was accepted, where
    docs/operations.md §13.7 and §14 promise a 431.  A complete head over the limit is refused here
    with agentd's JSON 431 ``request_head_too_large`` and the connection closes; the 431 h11 raises
    for an incomplete head gets the same JSON body instead of none."""

    async def _create_stream(self, request: h11.Request) -> None:
        limit = self.config.h11_max_incomplete_size
        if head_size(request) > limit:
            await self._send_head_too_large(limit)
            await self.send(Closed())
            return
        problem = framing_problem(request)
        if problem is not None:  # refused as agentd's protocol does, and the connection closes
            status, message, code, param = problem
            await self._send_refusal(status, *refusal_response(message, code, param))
            await self.send(Closed())
            return
        await super()._create_stream(request)

    async def _send_error_response(self, status_code: int) -> None:
        if status_code == 431:
            await self._send_head_too_large(self.config.h11_max_incomplete_size)
            return
        await super()._send_error_response(status_code)

    async def _send_head_too_large(self, limit: int) -> None:
        await self._send_refusal(431, *head_too_large_response(limit))

    async def _send_refusal(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        await self._send_h11_event(
            h11.Response(status_code=status, headers=[*headers, *self.config.response_headers("h11")])
        )
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


class PromptCloseTCPServer(TCPServer):
    _peer_gone = False
    _held = b""  # bytes held back by HOLD_WRITE, sent before the connection's next write

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        watch = IdleWatch(self.config.keep_alive_timeout, self.context.terminated, self._initiate_server_close)
        self._idle_watch = self.idle_task = watch  # type: ignore[assignment]

    async def _read_data(self) -> None:
        inner = getattr(self.protocol, "protocol", None)
        if type(inner) is H11Protocol:  # the request head bounded (BoundedH11Protocol adds no state)
            inner.__class__ = BoundedH11Protocol
        try:
            if self.config.read_timeout is not None:
                await super()._read_data()
                return
            # hypercorn's loop without its per-read cancel scope (no read timeout is configured);
            # a read that filled its buffer is followed by a larger one: a large request body then
            # reaches h11 and the app in a few pieces instead of one per 64 KiB (docs/operations.md
            # §13.6), while small requests keep hypercorn's read size
            size = MAX_RECV
            while True:
                try:
                    data = await self.stream.receive_some(size)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    break
                size = LARGE_RECV if len(data) == size else MAX_RECV
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    break
            await self.protocol.handle(Closed())
        finally:
            self._peer_gone = True
            self._idle_watch.close()  # the peer is gone: nothing is left to time out

    def _send_now(self, data: bytes) -> int:
        """Write what the socket takes at once, without waiting; the number of bytes written
        (0 when another write is in progress or the socket cannot take any now)."""
        if self.send_lock.locked():
            return 0
        sock = getattr(self.stream, "socket", None)
        if sock is None:
            return 0
        try:
            return sock._sock.send(data)
        except OSError:  # would block, or an error hypercorn's own write path reports
            return 0

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            if HOLD_WRITE.get():
                self._held += event.data
                return
            data = self._held + event.data if self._held else event.data
            self._held = b""
            sent = self._send_now(data)
            if sent == len(data):
                return
            if sent or data is not event.data:
                event = RawData(data=data[sent:])
        elif isinstance(event, Closed):
            # the close runs shielded: it is sent from the app's task when a response ends before
            # the request body arrived (a 404, a 405), and Quart-trio cancels that task as soon as
            # the stream's close tells it the client is gone; cancelled at its first checkpoint,
            # the close left the socket open with the connection neither closed nor served, and
            # the client's next request on it hung (docs/operations.md §13.7, session 43).  Closing
            # a socket does not wait for the client (a held write is bounded by the write timeout).
            with trio.CancelScope(shield=True):
                if self._held:
                    held, self._held = self._held, b""
                    await super().protocol_send(RawData(data=held))
                await self._close()
            await self.protocol.handle(Closed())  # what hypercorn does after its close
            return
        # a request that ends after its client left turns the connection idle again: no new idle
        # wait then (the socket closes as soon as the request's task is done)
        if self._peer_gone and isinstance(event, Updated) and event.idle:
            return
        await super().protocol_send(event)


def install() -> None:
    hypercorn.trio.run.TCPServer = PromptCloseTCPServer  # type: ignore[misc]
