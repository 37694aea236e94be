"""agentd's own HTTP/1.1 server protocol, run inside hypercorn's connection handling of
:mod:`daemon.http.serve` (``[server] http1_implementation = "agentd"``, docs/config.md).

hypercorn stays the server: its configuration, the lifespan protocol, agentd's accept loop with
the connection cap, the client-write timeout and the drain (docs/operations.md §10) are unchanged,
and the app is the same ASGI app.  What this module replaces is the protocol object of one
connection - h11's parser and state machine, hypercorn's ``H11Protocol``/``HTTPStream`` events and
its task per request - which the profile of docs/benchmarks.md §10.2.3 put at about a fifth of
agentd's CPU per small request.  One task per connection reads a request head, runs the app for it
in that same task, and reads the next head once the response is complete.

Behaviour (docs/operations.md §13.7; the socket tests run on both implementations):

* **request head**: request line ``METHOD SP target SP HTTP/1.x``, header fields ``name: value``
  (``\\r\\n`` or bare ``\\n`` line ends, empty lines before a request are skipped); at most
  ``max_head_bytes`` (hypercorn's ``h11_max_incomplete_size``, 16 KiB) or a JSON 431; a malformed
  head (bad request line, header name or value, folded header, HTTP/1.1 without ``host``, an HTTP
  version other than 1.0 or 1.1, including HTTP/2's prior-knowledge preface) is a JSON 400 naming
  what is wrong; the connection closes after either.  A head whose method holds a byte no method
  can (a TLS ClientHello) is refused as soon as that byte arrives, not when the head ends.
* **request body**: ``content-length`` (equal repeated values only) or ``transfer-encoding:
  chunked`` (not both, no other coding: JSON 400 naming the header); chunk extensions and trailers
  are read and dropped; a malformed chunked body ends the app's read with ``http.disconnect`` and
  is answered with a JSON 400 when no response started.  ``expect: 100-continue`` is answered with
  ``100 Continue`` when the app first reads the body.
* **keep-alive**: HTTP/1.1 keeps the connection unless the request or the response says
  ``connection: close``; HTTP/1.0 closes after every response (as h11 does).  Pipelined requests
  are read from the same buffer after the response before them: answered in order.  A connection
  also closes after a response whose request body the app did not read whole (the head then says
  ``connection: close``), and during the drain (``connection: close`` on every response; an idle
  connection closes at once).  An idle connection (no request, or a head still incomplete) closes
  after ``keep_alive_timeout`` seconds.
* **response framing**: the app's ``content-length``, else chunked for HTTP/1.1, else (HTTP/1.0)
  the body ends with the connection; no body for HEAD, 204 and 304.  A ``date`` header is added.
  A head sent while :data:`~daemon.http.hypercorn_close.HOLD_WRITE` is set leaves with the next
  write (one socket write per complete response); a stream's body can be written straight to the
  socket (:meth:`Exchange.direct_body`, docs/benchmarks.md §10.1).
* **disconnect**: once the request body is read, the app's next ``receive`` waits for the client:
  it returns ``http.disconnect`` when the client closes the connection or a write to it fails, and
  right after the response is complete (as hypercorn does); bytes of a pipelined next request read
  meanwhile are kept for it.  Two ASGI scope extensions let the proxy routes skip that task
  (docs/operations.md §13.8): ``agentd.disconnect_watch`` (:meth:`Exchange.watch_disconnect`:
  a callback for the same disconnects, seen by the run's :class:`DisconnectHub`) and
  ``agentd.take_body`` (:meth:`Exchange.take_body`: a body already buffered, taken at once).
* **not served** (hypercorn would): ``upgrade: h2c`` and ``upgrade: websocket`` are ignored (the
  request is served as HTTP/1.1, which RFC 9110 §7.8 allows), HTTP/2 prior knowledge is a 400, TLS
  is not offered by agentd's listeners in either implementation.
"""

from __future__ import annotations

import email.utils
import http
import math
import re
import select
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import trio

from actors.logevents import get_logger
from daemon.http.direct_body import DirectBody
from daemon.http.errors import error_body
from daemon.http.hypercorn_close import HOLD_WRITE, LARGE_RECV

logger = get_logger("h1")

MAX_RECV = 65536  # a read's size; one that filled it is followed by a LARGE_RECV one
MAX_CHUNK_LINE = 1024  # a chunk-size line (with extensions) longer than this is malformed
_DISCONNECT = {"type": "http.disconnect"}
# ASGI scope extensions of agentd's protocol, read by the proxy route (daemon/http/app.py)
DISCONNECT_WATCH = "agentd.disconnect_watch"  # Exchange.watch_disconnect
TAKE_BODY = "agentd.take_body"  # Exchange.take_body
RESPOND = "agentd.respond"  # Exchange.respond
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f-\xff]")
# the start of a head whose method already holds a byte no method can: not a request line
_NOT_A_METHOD = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]*[^-!#$%&'*+.^_`|~0-9A-Za-z ]")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_IO_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
_NO_BODY_STATUS = frozenset({204, 304})
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")
    return line


_date = [0, b""]


def _date_header() -> bytes:
    now = int(time.time())
    if now != _date[0]:
        _date[0] = now
        _date[1] = b"date: " + email.utils.formatdate(now, usegmt=True).encode("ascii") + b"\r\n"
    return _date[1]  # type: ignore[return-value]


class HeadError(Exception):
    """A request head or body agentd cannot serve: answered with a JSON error, then closed."""

    def __init__(self, status: int, message: str, param: str | None, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def response(self) -> bytes:
        body = error_body(self.message, "invalid_request_error", self.param, self.code)
        return (
            _status_line(self.status)
            + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n" % len(body)
            + _date_header()
            + b"\r\n"
            + body
        )


def _bad(message: str, param: str | None = None, code: str = "invalid_request") -> HeadError:
    return HeadError(400, message, param, code)


def _not_a_request(buf: bytes) -> HeadError:
    if buf[:1] == b"\x16":  # a TLS handshake record
        return _bad("this port serves plain HTTP, not TLS: use http://", code="invalid_request_line")
    first = buf.split(b"\n", 1)[0].removesuffix(b"\r")
    return _bad(f"malformed request line {first[:80]!r}", code="invalid_request_line")


class Request:
    """One parsed request head (what the exchange needs of it)."""

    __slots__ = ("method", "scope", "keep_alive", "length", "chunked", "expect_continue")

    def __init__(
        self,
        method: str,
        scope: dict[str, Any],
        keep_alive: bool,
        length: int,
        chunked: bool,
        expect_continue: bool,
    ) -> None:
        self.method = method
        self.scope = scope
        self.keep_alive = keep_alive
        self.length = length  # body bytes still to read (content-length framing)
        self.chunked = chunked
        self.expect_continue = expect_continue


def _origin_form(target: bytes) -> bytes:
    """The path and query of an absolute-form target (``http://host/v1/models?x``, as clients
    behind an HTTP proxy send it; RFC 9112 §3.2.2); other targets (``*``) are left as they are."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return target
    slash = rest.find(b"/")
    return b"/" if slash < 0 else rest[slash:]


def parse_head(head: bytes, client: Any, server: Any, root_path: str = "", scheme: str = "http") -> Request:
    """The request of one head (without the empty line that ends it); :class:`HeadError` when it
    is malformed (see the module docstring)."""
    lines = head.split(b"\n")
    first = lines[0].removesuffix(b"\r")
    parts = first.split(b" ")
    if len(parts) != 3:
        if first.startswith(b"PRI * HTTP/2"):
            raise _bad("HTTP/2 is not served on this port; use HTTP/1.1", code="unsupported_http_version")
        raise _bad(f"malformed request line {first[:80]!r}", code="invalid_request_line")
    method_b, target, version_b = parts
    if version_b == b"HTTP/1.1":
        version = "1.1"
    elif version_b == b"HTTP/1.0":
        version = "1.0"
    elif version_b.startswith(b"HTTP/2"):
        raise _bad("HTTP/2 is not served on this port; use HTTP/1.1", code="unsupported_http_version")
    else:
        raise _bad(f"unsupported HTTP version {version_b[:20]!r}; use HTTP/1.1", code="unsupported_http_version")
    if _TOKEN.fullmatch(method_b) is None:
        raise _bad(f"malformed request method {method_b[:40]!r}", code="invalid_request_line")
    if not target or _BAD_TARGET.search(target) is not None:
        raise _bad(f"malformed request target {target[:80]!r}", code="invalid_request_line")
    headers: list[tuple[bytes, bytes]] = []
    host = False
    lengths: list[bytes] = []
    coding: bytes | None = None
    keep_alive = version == "1.1"
    expect_continue = False
    for raw in lines[1:]:
        line = raw.removesuffix(b"\r")
        if line[:1] in (b" ", b"\t"):
            raise _bad("folded header lines are not accepted", code="invalid_header")
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise _bad(f"malformed header line {line[:80]!r}", code="invalid_header")
        value = value.strip(b" \t")
        name = name.lower()
        if _BAD_VALUE.search(value) is not None:
            # param as the same check on the hypercorn path names it (daemon/http/requests.py check_headers)
            shown = name.decode()
            raise _bad(f"invalid characters in the {shown} header", param=f"headers.{shown}", code="invalid_header")
        headers.append((name, value))
        if name == b"host":
            if host:  # RFC 9112 §3.2: more than one host is a 400
                raise _bad("more than one host header", param="host", code="invalid_header")
            host = True
        elif name == b"content-length":
            lengths.extend(v.strip(b" \t") for v in value.split(b","))
        elif name == b"transfer-encoding":
            coding = value.lower() if coding is None else coding + b"," + value.lower()
        elif name == b"connection":
            tokens = [t.strip(b" \t") for t in value.lower().split(b",")]
            if b"close" in tokens:
                keep_alive = False
        elif name == b"expect" and value.lower() == b"100-continue" and version == "1.1":
            expect_continue = True
    if version == "1.1" and not host:
        raise _bad("an HTTP/1.1 request needs a host header", param="host", code="invalid_header")
    length = 0
    chunked = False
    if coding is not None:
        if lengths:
            raise _bad(
                "a request may not carry both transfer-encoding and content-length",
                param="transfer-encoding",
                code="invalid_header",
            )
        if coding != b"chunked" or version != "1.1":
            raise _bad(
                f"unsupported transfer-encoding {coding.decode('latin-1')!r} (only chunked, HTTP/1.1)",
                param="transfer-encoding",
                code="invalid_header",
            )
        chunked = True
    elif lengths:
        first_length = lengths[0]
        if not first_length.isdigit() or len(first_length) > 18 or any(v != first_length for v in lengths):
            declared = b", ".join(lengths).decode("latin-1")
            raise _bad(f"invalid content-length header: {declared!r}", param="content-length", code="invalid_header")
        length = int(first_length)
    if target[:1] != b"/":
        target = _origin_form(target)
        if target[:1] != b"/":  # "*", "v1/models": no route starts so (and a relay would forward it)
            raise _bad(f"malformed request target {target[:80]!r}: it must start with /", code="invalid_request_line")
    path_raw, _, query = target.partition(b"?")
    path = path_raw.decode("ascii")
    if "%" in path:
        path = unquote(path)
    method = method_b.decode("ascii")  # case-sensitive (RFC 9110 §9.1): "get" is not GET
    scope = {
        "type": "http",
        "asgi": {"spec_version": "2.1", "version": "3.0"},
        "http_version": version,
        "method": method,
        "scheme": scheme,
        "path": path,
        "raw_path": path_raw,
        "query_string": query,
        "root_path": root_path,
        "headers": headers,
        "client": client,
        "server": server,
        "state": {},
        "extensions": {},
    }
    return Request(method, scope, keep_alive, length, chunked, expect_continue)


class Exchange:
    """One request and its response on a connection: the ASGI ``receive`` and ``send``."""

    __slots__ = (
        "conn",
        "request",
        "body_done",
        "delivered",
        "started",
        "complete",
        "gone",
        "error",
        "chunked",
        "close",
        "suppress",
        "held",
        "remaining",
        "_sent_continue",
        "_wait",
        "_on_gone",
        "_chunk_left",
        "_chunk_state",
    )

    def __init__(self, conn: H1Connection, request: Request) -> None:
        self.conn = conn
        self.request = request
        self.body_done = not request.chunked and request.length == 0  # the body was read off the wire
        self.delivered = False  # the app received the body's last message
        self.started = False  # the response head was sent (or held)
        self.complete = False  # the response's last byte was handed to the socket
        self.gone = False  # the client closed the connection or a write to it failed
        self.error: HeadError | None = None  # a malformed chunked body
        self.chunked = False  # the response body is chunked
        self.close = False  # the connection closes after this response
        self.suppress = False  # a response without a body (HEAD, 204, 304)
        self.held = b""  # a head held back by HOLD_WRITE
        self.remaining = -1  # response body bytes still due under content-length (-1: not framed so)
        self._sent_continue = False
        self._wait: trio.CancelScope | None = None  # a receive waiting for the client
        self._on_gone: Callable[[], None] | None = None  # watch_disconnect's callback, while armed
        self._chunk_left = 0  # data bytes left in the current request chunk
        self._chunk_state = 0  # 0 size line, 1 data, 2 CRLF after data, 3 trailers

    # ------------------------------------------------------------------ receive
    async def receive(self) -> dict[str, Any]:
        if not self.delivered:
            if self.gone:
                return _DISCONNECT
            if self.body_done:  # no body, or all of it arrived with the head
                self.delivered = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if self.request.expect_continue and not self._sent_continue and not self.started:
                self._sent_continue = True
                await self.conn.write(b"HTTP/1.1 100 Continue\r\n\r\n", self)
            if self.request.chunked:
                return await self._read_chunked()
            return await self._read_length()
        if self.complete or self.gone:
            return _DISCONNECT
        return await self._wait_for_client()

    async def _read_length(self) -> dict[str, Any]:
        conn = self.conn
        data = conn.buf
        left = self.request.length
        if data:
            conn.buf = b""
        else:
            data = await conn.recv(left)
            if not data:
                self.gone = True
                return _DISCONNECT
        if len(data) >= left:
            if len(data) > left:
                conn.buf = data[left:]
                data = data[:left]
            self.request.length = 0
            self.body_done = self.delivered = True
            return {"type": "http.request", "body": data, "more_body": False}
        self.request.length = left - len(data)
        return {"type": "http.request", "body": data, "more_body": True}

    async def _read_chunked(self) -> dict[str, Any]:
        conn = self.conn
        while True:
            try:
                body = self._parse_chunks()
            except HeadError as error:
                self.error = error
                self.gone = True  # the request cannot be read on: the connection closes after it
                return _DISCONNECT
            if body or self.body_done:
                self.delivered = self.body_done
                return {"type": "http.request", "body": body, "more_body": not self.body_done}
            data = await conn.recv()
            if not data:
                self.gone = True
                return _DISCONNECT
            conn.buf += data

    def _parse_chunks(self) -> bytes:
        """Consume what the connection's buffer holds of the chunked body; the data read."""
        conn = self.conn
        buf = conn.buf
        out: list[bytes] = []
        pos = 0
        while True:
            state = self._chunk_state
            if state == 1:  # chunk data
                take = min(self._chunk_left, len(buf) - pos)
                if take == 0:
                    break
                out.append(buf[pos : pos + take])
                pos += take
                self._chunk_left -= take
                if self._chunk_left == 0:
                    self._chunk_state = 2
                continue
            end = buf.find(b"\n", pos)
            if end < 0:
                limit = MAX_CHUNK_LINE if state != 3 else conn.max_head_bytes
                if len(buf) - pos > limit:
                    raise _bad("malformed chunked request body (line too long)", "transfer-encoding", "invalid_body")
                break
            if end == pos or buf[end - 1] != 13:  # b"\r": a chunked body's lines end with CRLF (RFC 9112 §7.1)
                # a bare LF here is a known request-smuggling vector (parsers that disagree on it
                # disagree on where the body ends); the head, like most servers', stays lenient
                raise _bad(
                    "malformed chunked request body (a line ends without CR)", "transfer-encoding", "invalid_body"
                )
            line = buf[pos : end - 1]
            pos = end + 1
            if state == 2:
                if line:
                    raise _bad(
                        "malformed chunked request body (no CRLF after a chunk)", "transfer-encoding", "invalid_body"
                    )
                self._chunk_state = 0
            elif state == 0:
                size = line.split(b";", 1)[0].strip(b" \t")
                if _CHUNK_SIZE.fullmatch(size) is None:
                    raise _bad(f"malformed chunk size {size[:20]!r}", "transfer-encoding", "invalid_body")
                self._chunk_left = int(size, 16)
                self._chunk_state = 1 if self._chunk_left else 3
            elif not line:  # state 3: the empty line after the trailers ends the body
                self.body_done = True
                break
        conn.buf = buf[pos:]
        return b"".join(out)

    def take_body(self) -> bytes | None:
        """The whole request body when it is already in the connection's buffer (a small request
        arrives with its head), taken without a checkpoint: what :meth:`receive` would return in
        one ``http.request`` message.  ``None`` when the body must be read with :meth:`receive`
        (not all of it here, chunked, ``100-continue`` not answered yet, already read)."""
        request = self.request
        if self.delivered or request.chunked or self.gone:
            return None
        if self.body_done:
            self.delivered = True
            return b""
        if request.expect_continue and not self._sent_continue:
            return None
        conn = self.conn
        left = request.length
        if len(conn.buf) < left:
            return None
        data, conn.buf = conn.buf[:left], conn.buf[left:]
        request.length = 0
        self.body_done = self.delivered = True
        return data

    def watch_disconnect(self, on_gone: Callable[[], None]) -> Callable[[], None]:
        """Call ``on_gone`` (once) when the client goes away before the response is complete: the
        peer closed or reset the connection (:class:`DisconnectHub`) or a write to it failed.  In
        place of a task waiting in :meth:`receive` (docs/benchmarks.md §10.2.4); the same
        disconnects, seen the same way.  Returns the function that disarms it."""
        if self.conn.peer_gone:
            self.gone = True
        if self.gone and not self.complete:
            on_gone()
        elif not self.complete:
            self._on_gone = on_gone
            self.conn.watched = self
        return self._unwatch

    def _unwatch(self) -> None:
        self._on_gone = None
        if self.conn.watched is self:
            self.conn.watched = None

    async def _wait_for_client(self) -> dict[str, Any]:
        """The body is read: wait until the response is complete or the client is gone."""
        conn = self.conn
        with trio.CancelScope() as scope:
            self._wait = scope
            try:
                while not (self.complete or self.gone):
                    if len(conn.buf) > conn.max_head_bytes + MAX_RECV:  # a pipelined backlog: stop reading
                        await trio.sleep_forever()
                    data = await conn.recv()
                    if not data:
                        self.gone = True
                        break
                    conn.buf += data
            finally:
                self._wait = None
        return _DISCONNECT

    def _wake(self) -> None:
        """The response is complete or the client is gone: a waiting :meth:`receive` returns, an
        armed :meth:`watch_disconnect` fires (client gone first) or is disarmed."""
        if self._wait is not None:
            self._wait.cancel()
        on_gone = self._on_gone
        if on_gone is not None:
            self._unwatch()
            if self.gone and not self.complete:
                on_gone()

    # ------------------------------------------------------------------ send
    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body before http.response.start")
            if self.complete:
                return
            body = self._body(message.get("body", b""), message.get("more_body", False))
            if body:
                await self.conn.write(body, self)
        elif kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            head = self._head(int(message["status"]), message.get("headers", ()))
            if HOLD_WRITE.get():
                self.held = head
            else:
                await self.conn.write(head, self)

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole response at once: what ``send`` of its start (under ``HOLD_WRITE``) and of its
        one final body message do, without the two ASGI messages (the proxy's complete responses,
        docs/operations.md §13.8): one socket write."""
        if self.started:
            raise RuntimeError("http.response.start sent twice")
        self.started = True
        self.held = self._head(status, headers)
        data = self._body(body, False)
        if data:
            await self.conn.write(data, self)

    def _body(self, body: bytes, more: bool) -> bytes:
        """The bytes to write for a body message (framed, after a held head); the end of the
        response marks the exchange complete."""
        if self.suppress:
            body = b""
        elif self.chunked:
            if body:
                body = b"%x\r\n%b\r\n" % (len(body), body)
            if not more:
                body += b"0\r\n\r\n"
        elif self.remaining >= 0:
            self.remaining -= len(body)
        if self.held:
            body = self.held + body
            self.held = b""
        if not more:
            self.complete = True
            if self.remaining > 0:
                self.close = True  # shorter than its content-length: the framing is lost
            self._wake()
        return body

    def _head(self, status: int, headers: Any) -> bytes:
        request = self.request
        conn = self.conn
        length = None
        coded = False
        close = not request.keep_alive or not self.body_done or self.gone or conn.draining()
        parts = [_status_line(status)]
        for name, value in headers:
            lname = name.lower()
            if lname == b"content-length":
                length = value
            elif lname == b"transfer-encoding":
                coded = True
            elif lname == b"connection":
                if b"close" in value.lower():
                    close = True
                continue  # written below
            elif lname == b"date":
                continue
            parts.append(b"%b: %b\r\n" % (name, value))
        self.suppress = request.method == "HEAD" or status in _NO_BODY_STATUS or status < 200
        if not self.suppress:
            if length is not None:
                try:
                    self.remaining = int(length)
                except ValueError:
                    close = True
            elif coded:
                close = True  # the app framed the body itself: only the close ends it for sure
            elif request.scope["http_version"] == "1.1":
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            else:
                close = True  # HTTP/1.0 without a length: the body ends with the connection
        if close:
            self.close = True
            parts.append(b"connection: close\r\n")
        parts.append(_date_header())
        parts.append(b"\r\n")
        return b"".join(parts)

    def direct_body(self) -> DirectBody | None:
        """A writer of this response's chunked body straight to the socket (daemon/http/direct_body.py),
        once its head went out; ``None`` when the body must go through :meth:`send`."""
        if not self.chunked or self.held or self.complete or self.gone:
            return None
        return self.conn.direct_body()


class H1Connection:
    """One client connection served by agentd's HTTP/1.1 protocol (see the module docstring).

    ``stream`` is agentd's :class:`~daemon.http.serve.WriteTimeoutStream` (or any Trio stream);
    ``terminated`` is set when the server drains (hypercorn's ``WorkerContext.terminated``);
    :meth:`drain` closes the connection now if it is idle."""

    def __init__(
        self,
        app: Callable[..., Any],
        stream: Any,
        *,
        keep_alive_timeout: float,
        max_head_bytes: int,
        terminated: Any,
        root_path: str = "",
    ) -> None:
        self.app = app
        self.stream = stream
        self.keep_alive_timeout = keep_alive_timeout
        self.max_head_bytes = max_head_bytes
        self.terminated = terminated
        self.root_path = root_path
        self.lock = trio.Lock()  # held by a write that waits (the socket did not take it whole)
        self.buf = b""
        self.requests = 0
        self._size = MAX_RECV
        self._idle: trio.CancelScope | None = None
        self._dead = False  # a write failed: nothing more is sent on this connection
        self.peer_gone = False  # the client closed or reset the connection (DisconnectHub)
        self.watched: Exchange | None = None  # the exchange whose watch_disconnect is armed
        self._hub_fd = -1  # the descriptor the DisconnectHub watches for us (-1: none)
        sock = getattr(stream, "socket", None)
        self._sock = getattr(sock, "_sock", None)  # the stdlib socket, for non-blocking writes
        self.client = _address(sock, "getpeername")
        self.server = _address(sock, "getsockname")

    def draining(self) -> bool:
        return bool(self.terminated.is_set())

    def drain(self) -> None:
        """The server drains: an idle connection closes now (a busy one after its response)."""
        if self._idle is not None:
            self._idle.cancel()

    # ------------------------------------------------------------------ socket
    async def recv(self, at_most: int = 0) -> bytes:
        """The next bytes from the client, ``b""`` once it closed the connection or it broke;
        ``at_most``: no more than that (the rest of a request body: the read's buffer is then the
        body's size, not :data:`LARGE_RECV` cut down afterwards, docs/benchmarks.md §10.2.8)."""
        size = self._size if not 0 < at_most < self._size else at_most
        try:
            data = await self.stream.receive_some(size)
        except _IO_ERRORS:
            return b""
        self._size = LARGE_RECV if len(data) == size == self._size else MAX_RECV
        return bytes(data)

    def recv_now(self) -> bytes | None:
        """The bytes the socket holds already (``b""``: the client closed the connection), taken
        without a checkpoint; ``None`` when a read would have to wait, or went wrong (then
        :meth:`recv` reads, and reports it as it does).  The next request's head is read so
        whenever it is there: no idle timer's cancel scope for a read that does not wait
        (docs/benchmarks.md §10.2.8)."""
        if self._sock is None:
            return None
        size = self._size
        try:
            data = self._sock.recv(size)
        except OSError:  # would block (BlockingIOError), reset, closed: recv's path
            return None
        self._size = LARGE_RECV if len(data) == size else MAX_RECV
        return data

    async def write(self, data: bytes, exchange: Exchange | None = None) -> None:
        """Write ``data`` whole, in order with every other write of the connection.  A write the
        socket takes at once leaves without the lock or a checkpoint; the rest waits under the lock
        in a shielded scope (a torn response would break the connection's framing; agentd's
        write-timeout watchdog closes a client that stopped reading).  A failed write marks the
        exchange's client gone (its waiting ``receive`` returns ``http.disconnect``)."""
        if self._dead:
            if exchange is not None:
                exchange.gone = True
            return
        sent = 0
        if self._sock is not None and not self.lock.locked():
            try:
                sent = self._sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._fail(exchange)
                return
            if sent == len(data):
                return
        try:
            with trio.CancelScope(shield=True):
                async with self.lock:
                    await self.stream.send_all(data[sent:] if sent else data)
        except _IO_ERRORS:
            self._fail(exchange)

    def _fail(self, exchange: Exchange | None) -> None:
        self._dead = True
        if exchange is not None:
            exchange.gone = True
            exchange._wake()

    def peer_closed(self) -> None:
        """The :class:`DisconnectHub` saw the client close or reset the connection (it watches it
        no more).  The exchange whose disconnect watch is armed (its body is read) is gone now;
        one still reading its body finds the end in the socket as before."""
        self._hub_fd = -1
        self.peer_gone = True
        exchange = self.watched
        if exchange is not None:
            exchange.gone = True
            exchange._wake()

    def direct_body(self) -> DirectBody | None:
        sock = getattr(self.stream, "socket", None)
        if self._dead or sock is None or not hasattr(sock, "fileno") or sock.fileno() < 0:
            return None
        return DirectBody(sock, self.lock, self.stream)

    # ------------------------------------------------------------------ the connection
    async def run(self) -> None:
        hub: DisconnectHub | None = None
        if self._sock is not None:
            hub = disconnect_hub()
            if hub.watch(self, self._sock.fileno()):
                self._hub_fd = self._sock.fileno()
        try:
            while not self._dead:
                try:
                    request = await self._next_request()
                except HeadError as error:
                    await self.write(error.response())
                    break
                if request is None:
                    break
                self.requests += 1
                if not await self._exchange(request):
                    break
        finally:
            self._idle = None
            if hub is not None and self._hub_fd >= 0:
                hub.unwatch(self, self._hub_fd)
                self._hub_fd = -1
            await self._close()

    async def _next_request(self) -> Request | None:
        """The next request's head (waiting at most ``keep_alive_timeout`` for it), ``None`` when
        the connection should close (the client closed it, the idle timeout, the drain)."""
        buf = self.buf
        deadline = math.inf
        while True:
            if buf[:1] in (b"\r", b"\n"):
                buf = buf.lstrip(b"\r\n")
            match = _HEAD_END.search(buf)
            if match is not None and match.start() <= self.max_head_bytes:
                self.buf = buf[match.end() :]
                return parse_head(buf[: match.start()], self.client, self.server, self.root_path)
            if _NOT_A_METHOD.match(buf) is not None:
                # refused at once, not after keep_alive_timeout: a TLS ClientHello (an https://
                # client on this plain-HTTP port) or other binary never ends a head, and its
                # client waited the whole timeout for a close (docs/operations.md §13.7)
                raise _not_a_request(buf)
            if len(buf) > self.max_head_bytes:
                raise HeadError(
                    431,
                    f"the request head exceeds {self.max_head_bytes} bytes",
                    None,
                    "request_head_too_large",
                )
            if self.terminated.is_set():
                return None
            data = self.recv_now()
            if data is None:  # nothing there yet: wait for it, at most until the idle deadline
                if deadline == math.inf:
                    deadline = trio.current_time() + self.keep_alive_timeout
                with trio.CancelScope(deadline=deadline) as scope:
                    self._idle = scope
                    data = await self.recv()
                self._idle = None
                if scope.cancelled_caught:
                    return None
            if not data:
                return None
            buf += data

    async def _exchange(self, request: Request) -> bool:
        """Run the app for ``request``; whether the connection can serve another request."""
        exchange = Exchange(self, request)
        extensions = request.scope["extensions"]
        extensions[TAKE_BODY] = exchange.take_body
        extensions[RESPOND] = exchange.respond
        if self._hub_fd >= 0:
            extensions[DISCONNECT_WATCH] = exchange.watch_disconnect
        try:
            await self.app(request.scope, exchange.receive, exchange.send)
        except Exception as exc:  # the app failed: a JSON 500 when nothing was sent yet
            logger.error(
                "ASGI app failed",
                exc_info=exc,
                extra={"agentd_event": "internal_error", "agentd_fields": {"path": request.scope["path"]}},
            )
            if not exchange.started and not exchange.gone:
                error = HeadError(500, "internal error in agentd (see the daemon log)", None, "internal_error")
                body = error_body(error.message, "server_error", None, error.code)
                await self._send_simple(exchange, 500, body)
            return False
        if exchange.error is not None and not exchange.started and not self._dead:
            await self.write(exchange.error.response())
            return False
        if not exchange.complete:
            if not exchange.started and not exchange.gone:
                body = error_body("the app returned no response", "server_error", None, "internal_error")
                await self._send_simple(exchange, 500, body)
            return False
        if exchange.held:
            await self.write(exchange.held, exchange)
        return not (exchange.close or exchange.gone or self._dead or not exchange.body_done)

    async def _send_simple(self, exchange: Exchange, status: int, body: bytes) -> None:
        # the connection closes after this answer (_exchange returns False): the head says so, or a
        # keep-alive client sends its next request into the close and sees no response at all
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        await exchange.send({"type": "http.response.start", "status": status, "headers": headers})
        await exchange.send({"type": "http.response.body", "body": body})

    async def _close(self) -> None:
        with trio.CancelScope(shield=True):
            try:
                if not self._dead:
                    await self.stream.send_eof()
            except (*_IO_ERRORS, AttributeError):
                pass
            await trio.aclose_forcefully(self.stream)


class DisconnectHub:
    """Notices clients that close or reset their connection, for every connection of a Trio run
    on agentd's protocol, from one task (docs/benchmarks.md §10.2.4).

    Each connection's socket is registered once, for the peer's close (``EPOLLRDHUP``; a reset
    or an error is always reported), in an epoll set of the hub's own: no read, no task and no
    registration per request.  When the set is readable the hub takes each reported socket out
    of it (one report per connection) and tells its connection (:meth:`H1Connection.peer_closed`),
    which cancels the request being served, if any (:meth:`Exchange.watch_disconnect`).  A
    socket closed by agentd leaves the set with its descriptor (the kernel drops it), so a
    descriptor number reused by a new connection is matched to its connection object before
    anything is removed."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._conns: dict[int, H1Connection] = {}
        self.reports = 0  # connections reported closed (tests)

    def watch(self, conn: H1Connection, fd: int) -> bool:
        try:
            self._epoll.register(fd, select.EPOLLRDHUP)
        except FileExistsError:  # a closed socket's stale entry under the same number
            self._epoll.modify(fd, select.EPOLLRDHUP)
        except (OSError, ValueError):
            return False
        self._conns[fd] = conn
        return True

    def unwatch(self, conn: H1Connection, fd: int) -> None:
        if self._conns.get(fd) is conn:
            del self._conns[fd]
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):  # closed meanwhile: the kernel dropped it
                pass

    async def run(self) -> None:
        epoll = self._epoll
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                for fd, _ in epoll.poll(0):
                    conn = self._conns.pop(fd, None)
                    try:
                        epoll.unregister(fd)
                    except (OSError, ValueError):
                        pass
                    if conn is not None:
                        self.reports += 1
                        conn.peer_closed()
        finally:
            self._conns.clear()
            epoll.close()


_HUB: trio.lowlevel.RunVar[DisconnectHub] = trio.lowlevel.RunVar("agentd_disconnect_hub")


def disconnect_hub() -> DisconnectHub:
    """This Trio run's :class:`DisconnectHub` (started on first use, a system task)."""
    try:
        return _HUB.get()
    except LookupError:
        hub = DisconnectHub()
        _HUB.set(hub)
        trio.lowlevel.spawn_system_task(hub.run, name="agentd-disconnect-hub")
        return hub


def _address(sock: Any, method: str) -> tuple[str, int] | None:
    try:
        address = getattr(sock, method)()
    except (AttributeError, OSError):
        return None
    if isinstance(address, tuple) and len(address) >= 2:
        return (str(address[0]), int(address[1]))
    return None
