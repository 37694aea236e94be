"""A small HTTP/1.1 client for the worker hop: keep-alive pool, one write per request, lean reads.

The proxy relays every streamed token as one SSE event, so the per-event cost of the upstream
read path bounds how many tokens per second one daemon core can relay.  The general-purpose
stack (httpx -> httpcore -> h11) spends most of that cost in layers the proxy does not need:
per-event generator hops, trace context managers and a per-event state machine.  This client
reads straight from the Trio socket and decodes the chunked framing of everything one read
returned in a single pass, so a backlog of events leaves as one downstream write.

Scope (the workers are vLLM-compatible OpenAI servers on plain HTTP/1.1):

* ``http://`` only; :class:`daemon.upstream.UpstreamTransport` hands ``https://`` to httpx's own
  transport;
* request: head and body in one ``send_all``; ``Host`` and ``Content-Length`` come from httpx;
* response framing (RFC 9112 6.3): no body for HEAD, 1xx, 204 and 304; ``Transfer-Encoding``
  with ``chunked`` last; ``Content-Length``; otherwise until the server closes;
* 1xx interim responses are skipped; a connection is reused only after a complete response whose
  version and ``Connection`` header allow it, and never if the server sent more than the framing
  said;
* idle connections expire after ``keepalive_expiry`` seconds (keep it below the workers' own idle
  timeout: uvicorn, vLLM's server, closes idle connections after 5 s) and are dropped when the
  server has closed them.  While :meth:`H1Pool.run_reaper` runs (a task of the nursery that owns
  the pool), both happen without a request: the reaper closes each idle connection at its expiry
  and drops one the server closed or reset as soon as the FIN or RST arrives
  (docs/operations.md §11.2); taking a connection from the pool checks both again;
* timeouts (``request.extensions["timeout"]``): ``connect``, ``write``, ``first_byte`` (a deadline
  for the whole response head; ``read`` when absent) and ``read`` (the longest silence between two
  reads of the body: the stream-idle timeout);
* errors are the httpx types the proxy maps (``ConnectError``, ``ConnectTimeout``, ``WriteError``,
  ``WriteTimeout``, ``ReadError``, ``ReadTimeout``, ``RemoteProtocolError``).  The one retry: a
  *reused* keep-alive connection that fails before the worker sent a single response byte (the
  write fails, or the server closes or resets it within ``STALE_WINDOW_SECONDS`` of the send) is
  the idle-close race (the server closed the connection just as the request left, RFC 9112
  9.3.1): the request is sent once more on a new connection (``stale_retries_count``).  A failure
  on a new connection, or later, is never retried here.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

import httpx
import trio

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE_BYTES = 4096
READ_SIZE = 64 * 1024
# A reused connection closed or reset before any response byte *this soon* after the request was
# sent is the idle-close race (the server had closed it already); later, the worker failed on it.
STALE_WINDOW_SECONDS = 1.0
_CRLF = b"\r\n"
_HEX = frozenset(b"0123456789abcdefABCDEF")


class ChunkedDecoder:
    """Incremental decoder of the chunked transfer coding (pure; arbitrary input splits).

    :meth:`feed` returns the payload bytes completed by ``data`` (possibly empty); ``done`` turns
    true after the last-chunk and the trailer section; ``surplus`` counts bytes received after
    that (a server that sends them cannot be trusted with another request on the connection).
    """

    __slots__ = ("_buf", "_left", "_state", "done", "surplus")

    _SIZE, _DATA, _DATA_END, _TRAILER = 0, 1, 2, 3

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0
        self._state = self._SIZE
        self.done = False
        self.surplus = 0

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.surplus += len(data)
            return b""
        if not self._buf and self._state == self._SIZE:
            # the common read: whole chunks (one relayed event, a backlog of them, the last-chunk
            # without trailers); anything else is decoded from the start by the loop below
            n, pos = len(data), 0
            pieces: list[bytes] = []
            while True:
                eol = data.find(_CRLF, pos, pos + 18)
                if eol <= pos:
                    break
                size_text = data[pos:eol]
                if not _HEX.issuperset(size_text):
                    break
                start = eol + 2
                end = start + int(size_text, 16)
                if end + 2 > n or data[end : end + 2] != _CRLF:
                    break
                pos = end + 2
                if end == start:  # the last-chunk, then the empty trailer line
                    if pos != n:
                        break
                    self.done = True
                elif pos == n and not pieces:
                    return data[start:end]
                else:
                    pieces.append(data[start:end])
                if pos == n:
                    return b"".join(pieces)
        buf = self._buf + data if self._buf else data
        pos, end = 0, len(buf)
        out: list[bytes] = []
        state, left = self._state, self._left
        while pos < end:
            if state == self._DATA:
                take = min(left, end - pos)
                out.append(buf[pos : pos + take])
                pos += take
                left -= take
                if left:
                    break
                state = self._DATA_END
            elif state == self._DATA_END:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != _CRLF:
                    raise httpx.RemoteProtocolError("malformed chunked body: missing CRLF after chunk data")
                pos += 2
                state = self._SIZE
            else:  # a size line or a trailer line
                eol = buf.find(_CRLF, pos)
                if eol < 0:
                    if end - pos > MAX_CHUNK_LINE_BYTES:
                        raise httpx.RemoteProtocolError("malformed chunked body: line too long")
                    break
                line = buf[pos:eol]
                pos = eol + 2
                if state == self._TRAILER:
                    if not line:
                        self.done = True
                        self.surplus = end - pos
                        pos = end
                        break
                    continue
                size_text = line.split(b";", 1)[0].strip(b" \t")
                if not size_text or not _HEX.issuperset(size_text) or len(size_text) > 16:
                    raise httpx.RemoteProtocolError(f"malformed chunked body: bad chunk size {line[:40]!r}")
                left = int(size_text, 16)
                state = self._DATA if left else self._TRAILER
        self._state, self._left = state, left
        self._buf = buf[pos:] if pos < end else b""
        return out[0] if len(out) == 1 else b"".join(out)


class HoldTimer(Protocol):
    """Events held back by a coalescing relay: write them at ``due`` (``math.inf``: none held)."""

    @property
    def due(self) -> float: ...

    async def fire(self) -> None: ...


class SyncWriter(Protocol):
    """A downstream writer that can write without waiting (the direct body writer,
    daemon/http/direct_body.py)."""

    def write_now(self, data: bytes) -> bytes: ...  # the rest of the frame it could not write at once

    async def write_rest(self, rest: bytes) -> None: ...  # that rest, cancel-safe (shielded)


class SyncRelay(Protocol):
    """The per-chunk work of a relay, without waiting (``StreamRelay`` in daemon/http/proxy.py)."""

    @property
    def due(self) -> float: ...  # when held events must leave (``math.inf``: none held)

    def take(self, payload: bytes) -> bytes: ...  # what to write now for this payload (b"": nothing)

    def release(self) -> bytes: ...  # the held events, to write now


class _HubEntry:
    """One body relayed by the hub: its socket, decoder and relay, and what stopped it."""

    __slots__ = (
        "fd", "decoder", "relay", "writer", "watched", "quiet_since", "idle", "scope", "wake", "error", "rest", "done",
    )  # fmt: skip

    def __init__(self, fd: int, decoder: ChunkedDecoder, relay: SyncRelay, writer: SyncWriter) -> None:
        self.fd = fd
        self.decoder = decoder
        self.relay = relay
        self.writer = writer
        self.watched = False  # registered with the hub's epoll
        self.quiet_since = 0.0  # when the worker last sent body bytes
        self.idle = math.inf  # the idle deadline the body's task armed (at or before quiet_since + timeout)
        self.scope: trio.CancelScope | None = None  # the body task's wait (its deadline: timer and idle)
        self.wake: trio.Event | None = None  # set by the hub when the task must act
        self.error: BaseException | None = None  # the relay failed: raised in the body's task
        self.rest = b""  # a frame the client socket did not take at once: the body's task writes it
        self.done = False  # the body ended


class RelayHub:
    """Reads every relayed chunked body of a Trio run from one task (docs/benchmarks.md §10.1).

    Waking a task per relayed token costs more than the rest of the token's relay (trio re-arms
    the socket's one-shot epoll registration and runs the task through the scheduler: about
    20 µs on the loaded 2-core machine, against about 1.5 µs per socket from one wake-up of a
    task that polls them all).  The hub keeps the upstream sockets of the bodies it relays in an
    epoll set of its own (level-triggered, registered once per body), waits for that set to be
    readable, and for every ready socket reads, decodes the chunked framing, runs the relay's
    synchronous part and writes to the client socket, all without a task switch.  The body's own
    task sleeps meanwhile and wakes only when it has to act: the body ended, a read, decode or
    write failed (the error is raised there), the client socket did not take a whole frame (the
    task finishes it under hypercorn's send lock while the hub leaves the body alone), held
    events are due (coalescing) or the idle timeout may have expired.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._entries: dict[int, _HubEntry] = {}
        self.wakeups = 0  # the hub's own wake-ups (tests, docs/benchmarks.md §10.1)

    def watch(self, entry: _HubEntry) -> None:
        if not entry.watched:
            self._epoll.register(entry.fd, select.EPOLLIN)
            self._entries[entry.fd] = entry
            entry.watched = True

    def unwatch(self, entry: _HubEntry) -> None:
        if entry.watched:
            entry.watched = False
            del self._entries[entry.fd]
            try:
                self._epoll.unregister(entry.fd)
            except (OSError, ValueError):  # the socket was closed meanwhile
                pass

    async def run(self) -> None:
        epoll = self._epoll
        entries = self._entries
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                self.wakeups += 1
                now = trio.current_time()
                for fd, _ in epoll.poll(0):
                    entry = entries.get(fd)
                    if entry is not None:
                        self._readable(entry, now)
        finally:
            entries.clear()
            epoll.close()

    def _readable(self, entry: _HubEntry, now: float) -> None:
        try:
            data = os.read(entry.fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._stop(entry, httpx.ReadError(str(exc) or type(exc).__name__))
            return
        entry.quiet_since = now
        if not data:
            self._stop(entry, httpx.RemoteProtocolError("the worker closed the connection inside a chunked body"))
            return
        self.feed(entry, data)

    def feed(self, entry: _HubEntry, data: bytes) -> None:
        """Decode, relay and write one read's bytes (also the bytes read with the response head)."""
        relay = entry.relay
        due = relay.due
        try:
            payload = entry.decoder.feed(data)
            if payload:
                out = relay.take(payload)
                if out:
                    entry.rest = entry.writer.write_now(out)
        except Exception as exc:  # raised in the body's task, as if it had read itself
            self._stop(entry, exc)
            return
        if entry.rest or entry.decoder.done:
            entry.done = entry.decoder.done
            self._stop(entry, None)
        elif relay.due != due:  # events held, or written: the body's task wakes when they are due
            scope = entry.scope
            if scope is not None:
                scope.deadline = min(relay.due, entry.idle)

    def _stop(self, entry: _HubEntry, error: BaseException | None) -> None:
        entry.error = error
        self.unwatch(entry)
        if entry.wake is not None:
            entry.wake.set()


_HUB: trio.lowlevel.RunVar[RelayHub] = trio.lowlevel.RunVar("agentd_relay_hub")


def relay_hub() -> RelayHub:
    """This Trio run's :class:`RelayHub` (started on first use, a system task)."""
    try:
        return _HUB.get()
    except LookupError:
        hub = RelayHub()
        _HUB.set(hub)
        trio.lowlevel.spawn_system_task(hub.run, name="agentd-relay-hub")
        return hub


class StaleConnection(Exception):
    """A reused connection failed before the worker sent any response byte (internal)."""

    def __init__(self, cause: httpx.TransportError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Connection:
    __slots__ = ("stream", "key", "fd", "buf", "idle_since", "reused")

    def __init__(self, stream: trio.SocketStream, key: tuple[str, int]) -> None:
        self.stream = stream
        self.key = key
        self.fd = stream.socket.fileno()
        self.buf = b""  # bytes read past the response head
        self.idle_since = 0.0
        self.reused = False  # it served a response before this request


async def _close(conn: _Connection) -> None:
    with trio.CancelScope(shield=True):
        try:
            await conn.stream.aclose()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _send_now(conn: _Connection, payload: bytes) -> int:
    """Write what the socket takes without waiting; the number of bytes written.

    A request the kernel takes whole (the common case: a request fits the socket buffer) leaves
    without the cancel scope and the scheduler round trips of a Trio send (docs/benchmarks.md
    §10.2); the caller waits for the rest.  An error is left to the Trio send, which reports it."""
    try:
        return conn.stream.socket._sock.send(payload)  # type: ignore[attr-defined]
    except OSError:  # would block, or an error the Trio send reports
        return 0


async def _receive_head_bytes(conn: _Connection) -> bytes:
    """:func:`_receive` without a timeout (the caller's scope bounds the wait), without Trio's
    per-call context manager and scheduler round trip: the socket is read once it is readable
    (docs/benchmarks.md §10.2).  Errors take Trio's path, so they are reported the same way."""
    raw = conn.stream.socket._sock  # type: ignore[attr-defined]
    try:
        await trio.lowlevel.wait_readable(raw)
        return raw.recv(READ_SIZE)
    except (OSError, ValueError, trio.ClosedResourceError):  # would block, reset, closed: Trio's path
        return await _receive(conn, None)


async def _receive(conn: _Connection, timeout: float | None) -> bytes:
    try:
        if timeout is None:
            return await conn.stream.receive_some(READ_SIZE)
        with trio.CancelScope(deadline=trio.current_time() + timeout):
            return await conn.stream.receive_some(READ_SIZE)
        raise httpx.ReadTimeout(f"no data from the worker for {timeout:g} s")
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc


def request_bytes(method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]], content: bytes) -> bytes:
    """A request's bytes: request line, header fields in the given order, the empty line, the body."""
    head = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        head += (name, b": ", value, _CRLF)
    head.append(_CRLF)
    return b"".join(head) + content


def _token_set(values: list[bytes]) -> set[bytes]:
    return {t.strip().lower() for v in values for t in v.split(b",") if t.strip()}


def _parse_head(head: bytes) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]]]:
    lines = head.split(_CRLF)
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line from the worker: {lines[0][:80]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise httpx.RemoteProtocolError(f"malformed header line from the worker: {line[:80]!r}")
        headers.append((name, value.strip(b" \t")))
    return parts[0], int(parts[1]), parts[2] if len(parts) == 3 else b"", headers


class UpstreamBody(httpx.AsyncByteStream):
    """One response body; hands the connection back to the pool only after a clean, full read."""

    def __init__(
        self, pool: H1Pool, conn: _Connection, framing: str, length: int, reusable: bool, read_timeout: float | None
    ) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._framing = framing  # "none" | "length" | "chunked" | "close"
        self._left = length
        self._reusable = reusable
        self._timeout = read_timeout
        self._complete = framing == "none"

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None or self._complete:
            return
        framing = self._framing
        pending, conn.buf = conn.buf, b""
        if framing == "chunked":
            decoder = ChunkedDecoder()
            while True:
                data = pending or await _receive(conn, self._timeout)
                pending = b""
                if not data:
                    raise httpx.RemoteProtocolError("the worker closed the connection inside a chunked body")
                payload = decoder.feed(data)
                if payload:
                    yield payload
                if decoder.done:
                    self._reusable = self._reusable and not decoder.surplus
                    break
        elif framing == "length":
            while self._left > 0:
                data = pending or await _receive(conn, self._timeout)
                pending = b""
                if not data:
                    raise httpx.RemoteProtocolError(
                        f"the worker closed the connection with {self._left} body bytes missing"
                    )
                if len(data) > self._left:
                    self._reusable = False
                    data = data[: self._left]
                self._left -= len(data)
                yield data
        else:  # until the server closes
            self._reusable = False
            while True:
                data = pending or await _receive(conn, self._timeout)
                pending = b""
                if not data:
                    break
                yield data
        self._complete = True

    async def pump(
        self,
        handler: Callable[[bytes], Awaitable[None]],
        timer: HoldTimer | None = None,
        *,
        handler_cancel_safe: bool = False,
    ) -> None:
        """Feed every payload piece to ``handler``: the same bytes as iterating, less CPU.

        Iterating has to open a cancel scope per read (a scope cannot span an async generator's
        ``yield``); here one scope spans the whole body and only its deadline moves: armed with the
        read timeout while waiting for the worker, disarmed while ``handler`` runs.  A chunked body
        is read with ``os.read`` on the socket after ``wait_readable`` (one system call and one
        scheduler pass per read; trio's stream layer adds a failed read, three context managers and
        a second pass); a read that filled the buffer is followed by another read at once.

        ``timer`` (coalescing, docs/operations.md §13): while ``timer.due`` is finite, the wait for
        the worker ends at that time too and ``timer.fire()`` runs (the held events are written).

        ``handler_cancel_safe``: ``handler`` never delivers a cancellation (it has no unshielded
        checkpoint: the relay's direct body writer).  The idle deadline then stays armed while the
        handler runs and is not moved at every read: when it expires early (the worker spoke
        since it was set) a new scope takes the exact deadline, about once per read timeout
        instead of two deadline changes per read.
        """
        conn = self._conn
        if conn is None or self._complete:
            return
        if self._framing != "chunked":
            async for piece in self:
                await handler(piece)
            return
        timeout = self._timeout
        sock = conn.stream.socket
        wait_readable = trio.lowlevel.wait_readable
        checkpoint = trio.lowlevel.checkpoint
        decoder = ChunkedDecoder()
        pending, conn.buf = conn.buf, b""
        more = False  # the last read filled the buffer: read again before waiting
        quiet_until = math.inf  # the read timeout, counted from the end of the last handler call
        lazy = handler_cancel_safe and timeout is not None
        armed = math.inf  # lazy: the idle deadline in force (at or before quiet_until)
        while True:  # one scope per timer firing: a cancelled scope stays cancelled
            with trio.CancelScope() as scope:
                deadline = math.inf
                while True:
                    if pending:
                        data, pending = pending, b""
                    else:
                        if quiet_until == math.inf and timeout is not None:
                            quiet_until = trio.current_time() + timeout
                            if lazy and armed == math.inf:
                                armed = quiet_until
                        due = math.inf if timer is None else timer.due
                        limit = armed if lazy else quiet_until
                        if due > limit:
                            due = limit
                        if due != deadline:
                            scope.deadline = deadline = due
                        if more:
                            await checkpoint()
                        else:
                            await wait_readable(sock)
                        try:
                            data = os.read(sock.fileno(), READ_SIZE)
                        except BlockingIOError:
                            more = False
                            continue
                        except OSError as exc:
                            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
                        if deadline != math.inf and not lazy:  # never while the handler writes
                            scope.deadline = deadline = math.inf
                        quiet_until = math.inf
                        more = len(data) == READ_SIZE
                    if not data:
                        raise httpx.RemoteProtocolError("the worker closed the connection inside a chunked body")
                    payload = decoder.feed(data)
                    if payload:
                        await handler(payload)
                    if decoder.done:
                        self._reusable = self._reusable and not decoder.surplus
                        self._complete = True
                        return
            now = trio.current_time()
            if now >= quiet_until:
                break
            if lazy:
                armed = quiet_until  # the exact deadline (it was set before the last reads)
            if timer is not None and now >= timer.due:
                await timer.fire()  # (the silence goes on counting)
        raise httpx.ReadTimeout(f"no data from the worker for {timeout:g} s")

    async def relay(self, relay: SyncRelay, writer: SyncWriter) -> None:
        """Relay the body through this run's :class:`RelayHub`: the same bytes, writes and
        timeouts as :meth:`pump` with ``timer=relay`` and a cancel-safe handler that writes what
        ``relay.take`` returns through ``writer``, without a task switch per read (a body that is
        not chunked goes through :meth:`pump`).

        The read timeout counts from the last bytes the worker sent (or the end of a write this
        task finished); the task wakes at most once per read timeout to check it, and at
        ``relay.due`` to write the held events.  On any exit the hub lets go of the socket first;
        a frame it could not finish is finished here (shielded), so the client's chunked body
        is never torn.
        """
        conn = self._conn
        if conn is None or self._complete:
            return
        if self._framing != "chunked":

            async def handler(piece: bytes) -> None:
                out = relay.take(piece)
                if out:
                    await _write(writer, out)

            await self.pump(handler, _Release(relay, writer), handler_cancel_safe=True)
            return
        hub = relay_hub()
        entry = _HubEntry(conn.stream.socket.fileno(), ChunkedDecoder(), relay, writer)
        timeout = math.inf if self._timeout is None else self._timeout
        entry.quiet_since = trio.current_time()
        pending, conn.buf = conn.buf, b""
        if pending:
            hub.feed(entry, pending)
        try:
            while True:
                if entry.error is not None:
                    raise entry.error
                if entry.rest:  # the hub leaves the body alone until the frame is finished
                    hub.unwatch(entry)
                    rest, entry.rest = entry.rest, b""
                    await writer.write_rest(rest)
                    entry.quiet_since = trio.current_time()
                if entry.done:
                    self._reusable = self._reusable and not entry.decoder.surplus
                    self._complete = True
                    return
                now = trio.current_time()
                if now >= relay.due:
                    out = relay.release()
                    if out:
                        entry.rest = writer.write_now(out)
                    continue
                if now >= entry.quiet_since + timeout:
                    raise httpx.ReadTimeout(f"no data from the worker for {timeout:g} s")
                entry.wake = trio.Event()
                hub.watch(entry)
                entry.idle = entry.quiet_since + timeout
                with trio.CancelScope(deadline=min(relay.due, entry.idle)) as entry.scope:
                    await entry.wake.wait()
                entry.scope = entry.wake = None
        finally:
            hub.unwatch(entry)
            entry.scope = entry.wake = None
            if entry.rest:  # finish the frame the hub started (the client sees whole frames only)
                rest, entry.rest = entry.rest, b""
                with trio.CancelScope(shield=True):
                    await writer.write_rest(rest)

    async def read_all(self) -> bytes:
        """The whole body: what iterating gives, joined.  A ``content-length`` body that arrived
        with the head (a small complete response) is taken without a read or a checkpoint."""
        conn = self._conn
        if conn is not None and not self._complete and self._framing == "length" and len(conn.buf) >= self._left:
            data, left = conn.buf, self._left
            if len(data) > left:
                self._reusable = False  # more than the framing said: never reused
                data = data[:left]
            conn.buf = b""
            self._left = 0
            self._complete = True
            return data
        return b"".join([piece async for piece in self])

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._complete and self._reusable:
            self._pool.release(conn)
        else:
            await self._pool.discard(conn)


class RawHeaders:
    """A response's header fields as received (``raw``: name, value byte pairs), with the one
    lookup the proxy makes (:meth:`get`, as ``httpx.Headers.get``: case-insensitive, repeated
    fields joined with ``", "``)."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def get(self, name: str, default: str = "") -> str:
        key = name.lower().encode("ascii")
        values = [value.decode("latin-1") for field, value in self.raw if field.lower() == key]
        return ", ".join(values) if values else default


class LeanResponse:
    """A worker's response on the proxy's fast path (:meth:`daemon.upstream.UpstreamTransport.post`):
    the part of ``httpx.Response`` the proxy uses, without building one (its header model and
    its read path cost about 60 µs per response on the bench machine, docs/benchmarks.md §10.2.4).
    The body is the raw :class:`UpstreamBody` (a response with a ``content-encoding`` gets a
    real ``httpx.Response`` instead, which decodes it)."""

    __slots__ = ("status_code", "headers", "stream", "_content", "_consumed")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], stream: UpstreamBody) -> None:
        self.status_code = status_code
        self.headers = RawHeaders(headers)
        self.stream = stream
        self._content: bytes | None = None
        self._consumed = False

    @property
    def is_stream_consumed(self) -> bool:
        return self._consumed

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise httpx.ResponseNotRead()
        return self._content

    async def aread(self) -> bytes:
        if self._content is None:
            if self._consumed:
                raise httpx.StreamConsumed()
            self._consumed = True
            self._content = await self.stream.read_all()
        return self._content

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self._consumed:
            raise httpx.StreamConsumed()
        self._consumed = True
        async for piece in self.stream:
            yield piece

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _write(writer: SyncWriter, data: bytes) -> None:
    rest = writer.write_now(data)
    if rest:
        await writer.write_rest(rest)


class _Release:
    """:class:`HoldTimer` over a :class:`SyncRelay` (:meth:`UpstreamBody.relay` of a body that is
    not chunked)."""

    __slots__ = ("_relay", "_writer")

    def __init__(self, relay: SyncRelay, writer: SyncWriter) -> None:
        self._relay = relay
        self._writer = writer

    @property
    def due(self) -> float:
        return self._relay.due

    async def fire(self) -> None:
        out = self._relay.release()
        if out:
            await _write(self._writer, out)


class H1Pool:
    """Keep-alive connections per (host, port); unbounded active connections, bounded idle ones."""

    def __init__(self, max_keepalive_connections: int | None, keepalive_expiry: float | None) -> None:
        self._max_idle = max_keepalive_connections if max_keepalive_connections is not None else 1 << 30
        self._expiry = keepalive_expiry
        # per key, oldest first: a connection's idle_since is the time of its release (LIFO reuse)
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._idle_count = 0
        self._closed = False
        self.stale_retries_count = 0  # requests sent again after the idle-close race
        self.open_connections = 0  # connections currently open (idle or busy)
        # the reaper (run_reaper): its wait, whose deadline is the oldest idle connection's expiry
        # (math.inf: none idle), and its epoll set of every open connection's socket, by fd
        self._reaper: trio.CancelScope | None = None
        self._hangups: select.epoll | None = None
        self._by_fd: dict[int, _Connection] = {}
        self.reaped_count = 0  # idle connections the reaper closed: expired, or closed by the server
        self.reaper_wakeups = 0  # (tests: it wakes at expiries and hang-ups only)

    def idle_connections(self) -> int:
        return self._idle_count

    def close_idle(self) -> None:
        """Close every idle connection (tests: file descriptors back to a baseline)."""
        for stack in self._idle.values():
            for conn in stack:
                self._drop(conn)
        self._idle.clear()
        self._idle_count = 0

    def _drop(self, conn: _Connection) -> None:
        self._forget(conn)
        conn.stream.socket.close()
        self.open_connections -= 1

    def _forget(self, conn: _Connection) -> None:
        if self._by_fd:
            fd = conn.fd
            if self._by_fd.get(fd) is conn:
                del self._by_fd[fd]  # closing the socket takes it out of the epoll set

    def release(self, conn: _Connection) -> None:
        if self._closed or self._idle_count >= self._max_idle:
            self._drop(conn)
            return
        conn.reused = True
        conn.idle_since = now = trio.current_time()
        self._idle.setdefault(conn.key, []).append(conn)
        reaper = self._reaper
        if not self._idle_count and reaper is not None and reaper.deadline == math.inf and self._expiry is not None:
            # the only idle connection and the reaper asleep: it wakes at this one's expiry (armed
            # earlier, it wakes then and looks again: at most one early wake-up per expiry)
            reaper.deadline = now + self._expiry
        self._idle_count += 1

    async def run_reaper(self) -> None:
        """Close idle connections without waiting for the next request (until cancelled; run it in
        the nursery that owns the pool, docs/operations.md §11.2).

        Each idle connection is closed at ``keepalive_expiry`` after its release: the reaper sleeps
        until the oldest one's expiry (no wake-up while none is idle).  A connection the server
        closes or resets while idle is dropped when the FIN or RST arrives, not left half-closed
        (CLOSE-WAIT) until its expiry: the reaper's epoll set holds every open connection's socket,
        registered once at connect for the peer's hang-up only (``EPOLLRDHUP``, edge-triggered), so
        response bytes never wake it and taking or returning a connection costs nothing more.
        """
        if self._reaper is not None:
            raise RuntimeError("the pool's reaper is already running")
        hangups = select.epoll()
        self._hangups = hangups
        for stack in self._idle.values():  # (one busy now is not watched: it still expires)
            for conn in stack:
                self._watch_hangup(conn)
        try:
            while True:
                with trio.CancelScope(deadline=self._next_expiry()) as self._reaper:
                    await trio.lowlevel.wait_readable(hangups.fileno())
                self._reaper = None
                self.reaper_wakeups += 1
                self._reap(trio.current_time(), hangups.poll(0))
        finally:
            self._reaper = None
            self._hangups = None
            self._by_fd.clear()
            hangups.close()

    def _watch_hangup(self, conn: _Connection) -> None:
        hangups = self._hangups
        if hangups is None or conn.fd in self._by_fd:
            return
        try:
            hangups.register(conn.fd, select.EPOLLRDHUP | select.EPOLLET)
        except (OSError, ValueError):  # closed meanwhile
            return
        self._by_fd[conn.fd] = conn

    def _next_expiry(self) -> float:
        if self._expiry is None or not self._idle_count:
            return math.inf
        return min(stack[0].idle_since for stack in self._idle.values() if stack) + self._expiry

    def _reap(self, now: float, hangups: list[tuple[int, int]]) -> None:
        """Drop the idle connections whose server hung up (``hangups``: the epoll events) and
        those whose expiry is past; a connection that is busy is left to its request."""
        for fd, _ in hangups:
            conn = self._by_fd.get(fd)
            stack = self._idle.get(conn.key) if conn is not None else None
            if stack and conn in stack:
                stack.remove(conn)
                self._idle_count -= 1
                self.reaped_count += 1
                self._drop(conn)
        if self._expiry is None:
            return
        limit = now - self._expiry
        for stack in self._idle.values():
            expired = 0
            while expired < len(stack) and stack[expired].idle_since <= limit:
                expired += 1
            if expired:
                for conn in stack[:expired]:
                    self._drop(conn)
                del stack[:expired]
                self._idle_count -= expired
                self.reaped_count += expired

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        stack = self._idle.get(key)
        now = trio.current_time()
        while stack:
            conn = stack.pop()  # most recently used first
            self._idle_count -= 1
            expired = self._expiry is not None and now - conn.idle_since > self._expiry
            if expired or conn.stream.socket.is_readable():  # closed by the server (or garbage)
                self._drop(conn)
                continue
            return conn
        return None

    async def _connect(self, key: tuple[str, int], timeout: float | None) -> _Connection:
        try:
            with trio.fail_after(timeout if timeout is not None else float("inf")):
                stream = await trio.open_tcp_stream(key[0], key[1])
        except trio.TooSlowError:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} took more than {timeout:g} s") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        self.open_connections += 1
        conn = _Connection(stream, key)
        if self._hangups is not None:
            self._watch_hangup(conn)
        return conn

    async def request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key = (url.host, url.port or 80)
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        content = await request.aread()
        payload = request_bytes(request.method.encode("ascii"), url.raw_path, request.headers.raw, content)
        version, status, reason, headers, body = await self.send(key, request.method == "HEAD", payload, timeouts)
        return httpx.Response(
            status_code=status,
            headers=headers,
            stream=body,
            extensions={"http_version": version, "reason_phrase": reason},
            request=request,
        )

    async def send(
        self, key: tuple[str, int], head: bool, payload: bytes, timeouts: dict[str, Any]
    ) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]], UpstreamBody]:
        """Send one request's bytes (``head``: a HEAD request, whose response has no body) on a
        pooled connection to ``key``; the response's version, status, reason, headers and body."""
        conn = self._take_idle(key) or await self._connect(key, timeouts.get("connect"))
        try:
            return await self._exchange(conn, head, payload, timeouts)
        except StaleConnection:
            await self.discard(conn)
            self.stale_retries_count += 1
        except BaseException:
            await self.discard(conn)
            raise
        conn = await self._connect(key, timeouts.get("connect"))  # the idle-close race: once more
        try:
            return await self._exchange(conn, head, payload, timeouts)
        except StaleConnection as stale:  # a new connection is never "reused": cannot happen
            await self.discard(conn)
            raise stale.cause from None
        except BaseException:
            await self.discard(conn)
            raise

    async def discard(self, conn: _Connection) -> None:
        """Close a connection that must not be reused."""
        self.open_connections -= 1
        self._forget(conn)
        await _close(conn)

    async def _exchange(
        self, conn: _Connection, head: bool, payload: bytes, timeouts: dict[str, Any]
    ) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]], UpstreamBody]:
        write_timeout = timeouts.get("write")
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled request is not sent (as with a Trio send)
        try:
            sent = _send_now(conn, payload)
            if sent < len(payload):  # the socket could not take it whole: wait for it, bounded
                with trio.fail_after(write_timeout if write_timeout is not None else float("inf")):
                    await conn.stream.send_all(memoryview(payload)[sent:])
        except trio.TooSlowError:
            raise httpx.WriteTimeout(f"sending the request took more than {write_timeout:g} s") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            error = httpx.WriteError(str(exc) or type(exc).__name__)
            if conn.reused:
                raise StaleConnection(error) from exc
            raise error from exc
        read_timeout = timeouts.get("read")
        first_byte = timeouts.get("first_byte", read_timeout)
        sent_at = trio.current_time()
        deadline = sent_at + first_byte if first_byte is not None else math.inf
        # no cancel scope for an unbounded wait (the caller's total timeout bounds it), docs/benchmarks.md §10.2.4
        head_scope = trio.CancelScope(deadline=deadline) if deadline != math.inf else None
        try:
            with head_scope if head_scope is not None else contextlib.nullcontext():
                while True:
                    version, status, reason, headers = await self._read_head(conn)
                    if not 100 <= status < 200 or status == 101:
                        break
        except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
            raced = trio.current_time() - sent_at <= STALE_WINDOW_SECONDS  # not a worker failing later
            if conn.reused and raced and getattr(exc, "no_response_bytes", False):
                raise StaleConnection(exc) from exc
            raise
        if head_scope is not None and head_scope.cancelled_caught:
            raise httpx.ReadTimeout(f"no response from the worker within {first_byte:g} s (first-byte timeout)")
        names: dict[bytes, list[bytes]] = {}
        for name, value in headers:
            names.setdefault(name.lower(), []).append(value)
        connection = _token_set(names.get(b"connection", []))
        reusable = b"close" not in connection and (version == b"HTTP/1.1" or b"keep-alive" in connection)
        framing, length = "close", 0
        if head or status in (204, 304) or 100 <= status < 200:
            framing = "none"
        elif b"transfer-encoding" in names:
            codings = [t.strip().lower() for v in names[b"transfer-encoding"] for t in v.split(b",")]
            framing = "chunked" if codings and codings[-1] == b"chunked" else "close"
        elif b"content-length" in names:
            values = {v.strip() for v in names[b"content-length"]}
            if len(values) != 1 or not next(iter(values)).isdigit():
                raise httpx.RemoteProtocolError(f"invalid content-length from the worker: {sorted(values)!r}")
            framing, length = "length", int(next(iter(values)))
            if length == 0:
                framing = "none"
        if framing == "none" and conn.buf:
            reusable = False
        return version, status, reason, headers, UpstreamBody(self, conn, framing, length, reusable, read_timeout)

    async def _read_head(self, conn: _Connection) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]]]:
        """The next response head (the caller's cancel scope bounds it).  A close or reset before the
        first response byte is marked ``no_response_bytes`` (the idle-close race on a reused connection)."""
        buf = conn.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError(f"response head from the worker exceeds {MAX_HEAD_BYTES} bytes")
            try:
                data = await _receive_head_bytes(conn)
            except httpx.ReadError as exc:
                exc.no_response_bytes = not buf  # type: ignore[attr-defined]
                raise
            if not data:
                error = httpx.RemoteProtocolError("the worker closed the connection without sending a response")
                error.no_response_bytes = not buf  # type: ignore[attr-defined]
                raise error
            buf += data
        conn.buf = buf[end + 4 :]
        return _parse_head(buf[:end])

    async def aclose(self) -> None:
        self._closed = True
        self.close_idle()
