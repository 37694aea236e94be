"""A minimal HTTP/1.1 client over raw Trio sockets, for load and drain measurements.

httpx costs more CPU per streamed chunk than the proxy it measures; with a thousand concurrent
streams on two cores the client would dominate.  :func:`post` sends one request on a fresh
connection and reads the whole response (content-length, chunked or until close), recording when
the head and the first body byte arrived and whether the connection was reset or closed before
the response was complete.  Nothing here is a general HTTP client: no redirects, no TLS.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import attrs
import trio


@attrs.define
class RawResponse:
    status: int | None = None
    headers: dict[str, str] = attrs.field(factory=dict)
    body: bytes = b""
    sent_at: float = 0.0
    head_at: float | None = None
    first_byte_at: float | None = None  # first body byte (TTFT for a stream)
    first_data_at: float | None = None  # first ``data:`` event (keep-alive comments do not count)
    done_at: float | None = None
    complete: bool = False  # the response ended by its own framing
    error: str | None = None  # "reset", "closed_early", "connect: ...", "timeout"

    @property
    def sse_done(self) -> bool:
        return self.body.endswith(b"data: [DONE]\n\n")

    def json(self) -> Any:
        return json.loads(self.body)


def request_bytes(host: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", "content-type: application/json", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Reader:
    def __init__(self, stream: trio.SocketStream, out: RawResponse) -> None:
        self.stream = stream
        self.buf = b""
        self.out = out
        self.on_first_byte: Callable[[], object] | None = None

    async def more(self) -> bool:
        data = await self.stream.receive_some(65536)
        if not data:
            return False
        self.buf += data
        return True


async def post(
    host: str,
    port: int,
    path: str,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
    read_delay_seconds: float = 0.0,
    send_slowly_seconds: float = 0.0,
    abort_after_first_byte: bool = False,
    receive_buffer_bytes: int | None = None,
) -> RawResponse:
    """One request on a new connection; never raises for network trouble (see ``error``).

    ``read_delay_seconds`` sleeps before every read after the head (a slow reader);
    ``send_slowly_seconds`` spreads the request bytes over that long (a slow sender);
    ``abort_after_first_byte`` closes the connection once the first body byte arrived (an
    impatient client, ``error = "aborted"``); ``receive_buffer_bytes`` sets the socket's receive
    buffer (a client that stops reading then stops the sender's writes after that many bytes)."""
    out = RawResponse(sent_at=trio.current_time())
    try:
        if receive_buffer_bytes is None:
            stream = await trio.open_tcp_stream(host, port)
        else:
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
            await sock.connect((host, port))
            stream = trio.SocketStream(sock)
    except OSError as exc:
        out.error = f"connect: {exc}"
        return out
    try:
        data = request_bytes(f"{host}:{port}", path, body, headers)
        if send_slowly_seconds > 0:
            pieces = 10
            step = max(1, len(data) // pieces)
            for i in range(0, len(data), step):
                await stream.send_all(data[i : i + step])
                await trio.sleep(send_slowly_seconds / pieces)
        else:
            await stream.send_all(data)
        reader = _Reader(stream, out)
        if abort_after_first_byte:
            with trio.CancelScope() as scope:
                reader.on_first_byte = scope.cancel
                await _read_response(reader, read_delay_seconds)
            if scope.cancelled_caught:
                out.error = "aborted"
        else:
            await _read_response(reader, read_delay_seconds)
    except trio.BrokenResourceError as exc:
        out.error = "reset" if "reset" in str(exc).lower() or "Errno 104" in str(exc) else f"broken: {exc}"
    except OSError as exc:
        out.error = f"os: {exc}"
    finally:
        await trio.aclose_forcefully(stream)
    out.done_at = trio.current_time()
    return out


async def _read_response(reader: _Reader, read_delay: float) -> None:
    out = reader.out
    while b"\r\n\r\n" not in reader.buf:
        if not await reader.more():
            out.error = "closed_early"
            return
    head, _, reader.buf = reader.buf.partition(b"\r\n\r\n")
    out.head_at = trio.current_time()
    lines = head.decode("latin-1").split("\r\n")
    out.status = int(lines[0].split(" ", 2)[1])
    for line in lines[1:]:
        name, _, value = line.partition(":")
        out.headers[name.strip().lower()] = value.strip()
    if "content-length" in out.headers:
        length = int(out.headers["content-length"])
        while len(reader.buf) < length:
            if not await reader.more():
                out.error = "closed_early"
                return
        out.body = reader.buf[:length]
        out.first_byte_at = out.first_data_at = trio.current_time()
        out.complete = True
        return
    if out.headers.get("transfer-encoding", "").lower() == "chunked":
        await _read_chunked(reader, read_delay)
        return
    while await reader.more():  # until close
        pass
    out.body = reader.buf
    out.complete = True


async def _read_chunked(reader: _Reader, read_delay: float) -> None:
    out = reader.out
    parts: list[bytes] = []
    while True:
        while b"\r\n" not in reader.buf:
            if read_delay:
                await trio.sleep(read_delay)
            if not await reader.more():
                out.error = "closed_early"
                out.body = b"".join(parts)
                return
        size_line, _, rest = reader.buf.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        while len(rest) < size + 2:
            if read_delay:
                await trio.sleep(read_delay)
            if not await reader.more():
                out.error = "closed_early"
                out.body = b"".join(parts)
                return
            rest = reader.buf.partition(b"\r\n")[2]
        chunk = rest[:size]
        reader.buf = rest[size + 2 :]
        if size == 0:
            out.body = b"".join(parts)
            out.complete = True
            return
        now = trio.current_time()
        if out.first_byte_at is None:
            out.first_byte_at = now
            if reader.on_first_byte is not None:
                reader.on_first_byte()
        if out.first_data_at is None and b"data:" in chunk:
            out.first_data_at = now
        parts.append(chunk)
