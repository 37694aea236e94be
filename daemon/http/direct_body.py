"""Writing a streamed response body straight to the client socket (docs/benchmarks.md §10.1).

Every relayed token is one body write.  Through ASGI, hypercorn turns each into a ``Body`` event,
an h11 ``Data`` event, chunked framing, a ``RawData`` event, a send lock, a shielded cancel scope
and a socket write with two scheduler yields: measured at about 40% of agentd's CPU per relayed
token (docs/benchmarks.md §10.1).  The framing of a chunked body is stateless (``<hex size>\\r\\n<data>\\r\\n``), so
for the body of an event stream this module frames the chunk itself and writes it to the socket
with one non-blocking ``os.write``; the response head and the end of the body (the last-chunk)
still go through hypercorn and h11, which keeps their state machine right (keep-alive, errors,
the next request on the connection).

:func:`attach` inspects the ASGI ``send`` of hypercorn 0.18's HTTP/1.1 protocol (the bound
``HTTPStream.app_send`` -> ``H11Protocol`` -> ``TCPServer``) and returns a writer only when all of
this holds, else ``None`` (the caller keeps the ASGI path): the head went out, h11 frames the body
as chunked (an HTTP/1.1 client, no ``content-length``, not HEAD), and the connection is a plain
socket (not TLS).  Writes keep hypercorn's guarantees:

* order: a write waits for hypercorn's send lock when anything else is writing;
* no torn frame: a frame the socket did not take at once is finished under the send lock in a
  shielded scope (as hypercorn writes), through agentd's write-timeout stream, whose watchdog
  closes a client that stopped reading (docs/operations.md §10); a write is never the place where
  a cancellation lands (:meth:`DirectBody.write` has no unshielded checkpoint), which lets the
  upstream read loop keep its idle deadline armed while it writes;
* the socket's descriptor is read at every write (``-1`` once hypercorn closed it), so a closed
  connection's reused descriptor is never written to; a failed write is :class:`ClientGone`.
"""

from __future__ import annotations

import os
from typing import Any

import h11
import trio

from daemon.http.proxy import ClientGone

_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


class DirectBody:
    """Chunked body frames written to the client socket (see the module docstring)."""

    __slots__ = ("_socket", "_lock", "_stream", "writes")

    def __init__(self, socket: Any, lock: trio.Lock, stream: Any) -> None:
        self._socket = socket
        self._lock = lock
        self._stream = stream
        self.writes = 0  # frames written (tests)

    async def write(self, data: bytes) -> None:
        rest = self.write_now(data)
        if rest:
            await self.write_rest(rest)

    def write_now(self, data: bytes) -> bytes:
        """Frame ``data`` and write what the socket takes at once, without waiting: returns the
        rest of the frame (empty when all of it went out), which must go through
        :meth:`write_rest` before anything else is written (the relay hub, daemon/h1client.py)."""
        if not data:
            return b""
        self.writes += 1
        frame = b"%x\r\n%b\r\n" % (len(data), data)
        if self._lock.locked():
            return frame
        try:
            sent = os.write(self._socket.fileno(), frame)
        except BlockingIOError:
            return frame
        except OSError as exc:
            raise ClientGone(str(exc) or type(exc).__name__) from exc
        return b"" if sent == len(frame) else frame[sent:]

    async def write_rest(self, frame: bytes) -> None:
        """The rest of a frame :meth:`write_now` could not write, under hypercorn's send lock in a
        shielded scope (a torn frame would break the chunked body)."""
        try:
            with trio.CancelScope(shield=True):  # no checkpoint can be cancelled in a write
                async with self._lock:
                    await self._stream.send_all(frame)
        except _ERRORS as exc:
            raise ClientGone(str(exc) or type(exc).__name__) from exc


def attach(send: Any) -> DirectBody | None:
    """A :class:`DirectBody` for the response ``send`` belongs to, once its head went out; ``None``
    when the body must go through ASGI (see the module docstring).  On agentd's own HTTP/1.1
    protocol (daemon/http/h1proto.py) the exchange that ``send`` belongs to decides."""
    own = getattr(getattr(send, "__self__", None), "direct_body", None)
    if own is not None:
        writer: DirectBody | None = own()
        return writer
    try:
        http_stream = send.__self__
        protocol = http_stream.send.__self__
        connection = protocol.connection
        server = protocol.send.__self__
        stream = server.stream
        lock = server.send_lock
        socket = stream.socket
    except AttributeError:
        return None
    if not isinstance(connection, h11.Connection) or protocol.stream is not http_stream:
        return None
    if connection.our_state is not h11.SEND_BODY or type(connection._writer).__name__ != "ChunkedWriter":
        return None
    if not isinstance(lock, trio.Lock) or not hasattr(socket, "fileno") or socket.fileno() < 0:
        return None
    return DirectBody(socket, lock, stream)
