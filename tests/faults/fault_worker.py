"""A scriptable fake vLLM worker over real sockets, and a small TCP fault proxy.

:class:`FaultWorker` is a minimal HTTP/1.1 keep-alive server (trio, 127.0.0.1, port 0) that answers
``/health``, ``/metrics``, ``/v1/models`` and ``/v1/chat/completions`` (JSON with Content-Length,
or SSE in chunked framing, one event per chunk).  Each generation request takes the next
:class:`Act` of ``worker.script`` (``worker.default`` when the script is empty):

* ``ok`` - a normal answer (``events`` content events in a stream, ``delay`` seconds between them);
* ``kill`` / ``reset`` - after ``after`` events (streams) or half the body (JSON): close the
  connection (FIN), or abort it (RST);
* ``stall`` - after ``after`` events: send nothing more until the peer closes;
* ``slow_head`` - wait ``delay`` seconds before the response head;
* ``garbage`` - bytes that are not HTTP, then close; ``truncated`` - a Content-Length larger than
  the body, then close; ``bad_chunk`` - a stream whose chunked framing breaks after ``after`` events;
* ``status`` - ``status`` with a JSON error body;
* ``drop_request`` - read the request and close without a byte, after ``delay`` seconds (at once:
  what a server closing an idle keep-alive connection does to a request that crosses the close,
  the idle-close race; later: a worker failing on the request).

With an ``ssl_context`` it serves HTTPS (``url`` is then ``https://``; :func:`self_signed` makes a
certificate for 127.0.0.1); ``kill``, ``reset`` and ``drop_request`` need the plain socket.

``health`` (a list of statuses, consumed one per check, then ``health_default``) scripts ``/health``
(``health_hold``, an event, holds every answer until it is set);
``metrics_broken`` makes ``/metrics`` answer 500.  ``idle_timeout`` closes idle keep-alive
connections like uvicorn's ``timeout_keep_alive``.  The worker records every request (with its
connection number) and counts open connections.

:class:`FaultProxy` forwards TCP to a worker; ``mode`` applies to connections accepted from then
on: ``pass``, ``reset_after`` (abort both sides after ``limit`` bytes from the worker),
``stall_after`` (stop forwarding after ``limit`` bytes) or ``drip`` (one byte every ``drip_seconds``).
:class:`Blackhole` is an address whose connects time out; :class:`Gate` one in front of a worker
whose connects time out while it is shut and go through while it is open.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import struct
import subprocess
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

MODEL = "fault-model"


@attrs.frozen
class Act:
    kind: str = "ok"
    events: int = 3
    after: int = 1
    delay: float = 0.0
    status: int = 500


@attrs.frozen
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def abort(stream: trio.SocketStream) -> None:
    """Close with RST instead of FIN (SO_LINGER 0)."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()


class _Closed(Exception):
    pass


class FaultWorker:
    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.port = 0
        self.script: deque[Act] = deque()
        self.default = Act()
        self.health: deque[int] = deque()
        self.health_default = 200
        self.health_checks = 0
        self.health_hold: trio.Event | None = None  # set: /health answers once the event is set
        self.metrics_broken = False
        self.metrics_scrapes = 0
        self.idle_timeout: float | None = None
        self.requests: list[Seen] = []
        self.faulted_at: list[float] = []  # trio time of each kill, reset or stall
        self.closed_at: list[float] = []  # trio time each connection ended (the peer closed it, or the worker)
        self.open_connections = 0
        self.connections = 0
        self._listeners: list[Any] = []
        self._scope = trio.CancelScope()

    @property
    def url(self) -> str:
        return f"{'http' if self.ssl_context is None else 'https'}://127.0.0.1:{self.port}"

    def generation_requests(self) -> list[Seen]:
        return [r for r in self.requests if r.path.startswith("/v1/chat")]

    async def run(self, *, task_status: trio.TaskStatus[FaultWorker] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            if self.ssl_context is None:
                listeners = await nursery.start(partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
                sock = listeners[0].socket
            else:
                serve = partial(trio.serve_ssl_over_tcp, self._serve, 0, self.ssl_context, https_compatible=True)
                listeners = await nursery.start(partial(serve, host="127.0.0.1"))
                sock = listeners[0].transport_listener.socket
            self._listeners = listeners
            self.port = sock.getsockname()[1]
            task_status.started(self)

    def die(self) -> None:
        """The worker process exits: its port refuses, its connections close."""
        self._scope.cancel()

    async def _serve(self, stream: trio.SocketStream) -> None:
        self.open_connections += 1
        self.connections += 1
        number = self.connections
        closed = False
        try:
            buf = b""
            while True:
                with trio.move_on_after(self.idle_timeout if self.idle_timeout is not None else float("inf")):
                    while b"\r\n\r\n" not in buf:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        buf += data
                if b"\r\n\r\n" not in buf:
                    return  # idle for idle_timeout: close, as uvicorn does
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                self.requests.append(Seen(method, path, headers, body, number))
                if not await self._respond(stream, path, body):
                    closed = True
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, _Closed):
            pass
        finally:
            self.open_connections -= 1
            self.closed_at.append(trio.current_time())
            if not closed:
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    async def _respond(self, stream: trio.SocketStream, path: str, body: bytes) -> bool:
        """Answer one request; False when the connection was closed (or must be)."""
        if path == "/health":
            self.health_checks += 1
            if self.health_hold is not None:
                await self.health_hold.wait()
            status = self.health.popleft() if self.health else self.health_default
            await _send_json(stream, status, {"status": status})
            return True
        if path == "/metrics":
            self.metrics_scrapes += 1
            if self.metrics_broken:
                await _send_json(stream, 500, {"error": "broken"})
                return True
            text = "".join(
                'vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 0\n'
                'vllm:kv_cache_usage_perc{engine="0"} 0.0\n'
                for _ in range(1)
            ).encode()
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: "
                + str(len(text)).encode()
                + b"\r\n\r\n"
                + text
            )
            return True
        if path == "/v1/models":
            await _send_json(stream, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            return True
        act = self.script.popleft() if self.script else self.default
        request = json.loads(body) if body else {}
        return await self._generate(stream, act, request)

    async def _generate(self, stream: trio.SocketStream, act: Act, request: dict[str, Any]) -> bool:
        kind = act.kind
        if kind == "drop_request":
            await trio.sleep(act.delay)
            stream.socket.close()
            return False
        if kind == "garbage":
            await stream.send_all(b"\x00\x01 this is not HTTP at all \xff\r\n\r\n")
            stream.socket.close()
            return False
        if kind == "status":
            await _send_json(stream, act.status, {"error": {"message": "worker failed", "code": act.status}})
            return True
        if kind == "slow_head":
            await trio.sleep(act.delay)
        if request.get("stream"):
            return await self._stream(stream, act, request)
        payload = json.dumps(
            {
                "id": "cmpl-1",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * act.events}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": act.events, "total_tokens": 5 + act.events},
            }
        ).encode()
        if kind == "truncated":
            head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(payload) + 100}\r\n\r\n"
            await stream.send_all(head.encode() + payload)
            stream.socket.close()
            return False
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
        if kind in ("kill", "reset", "stall"):
            await stream.send_all(head.encode() + payload[: len(payload) // 2])
            return await self._end_abruptly(stream, kind)
        await stream.send_all(head.encode() + payload)
        return True

    async def _stream(self, stream: trio.SocketStream, act: Act, request: dict[str, Any]) -> bool:
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        events = [_event({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
        events += [_event({"id": "c1", "choices": [{"index": 0, "delta": {"content": "x"}}]})] * act.events
        events.append(_event({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        options = request.get("stream_options") or {}
        if options.get("include_usage"):
            usage = {"prompt_tokens": 5, "completion_tokens": act.events, "total_tokens": 5 + act.events}
            events.append(_event({"id": "c1", "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        for i, event in enumerate(events):
            if act.kind in ("kill", "reset", "stall") and i == act.after:
                return await self._end_abruptly(stream, act.kind)
            if act.kind == "bad_chunk" and i == act.after:
                await stream.send_all(b"zz\r\nnot a chunk\r\n")
                stream.socket.close()
                return False
            if i and act.delay and act.kind != "slow_head":
                await trio.sleep(act.delay)
            await stream.send_all(_chunk(event))
        await stream.send_all(b"0\r\n\r\n")
        return True

    async def _end_abruptly(self, stream: trio.SocketStream, kind: str) -> bool:
        self.faulted_at.append(trio.current_time())
        if kind == "reset":
            abort(stream)
            return False
        if kind == "kill":
            stream.socket.close()
            return False
        while await stream.receive_some(65536):  # stall: until the peer gives up
            pass
        raise _Closed


async def _send_json(stream: trio.SocketStream, status: int, obj: Any) -> None:
    payload = json.dumps(obj).encode()
    head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    await stream.send_all(head.encode() + payload)


def self_signed(directory: Path) -> tuple[Path, Path] | None:
    """A self-signed certificate for 127.0.0.1 and its key, made with ``openssl`` in ``directory``
    (None when ``openssl`` is not installed)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = directory / "worker-cert.pem", directory / "worker-key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    return context


def closed_port() -> int:
    """A local port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fill_accept_queue(port: int) -> list[socket.socket]:
    """Connections that fill the accept queue of a listener (backlog 0) on ``port``, so that the
    next connect gets no answer and times out (backlog 0 admits one or two on Linux)."""
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(s)
    return fillers


class Blackhole:
    """A listener whose accept queue is full: new connections get no answer (SYNs are dropped), so
    connecting times out.  Use as a context manager."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = int(self.listener.getsockname()[1])
        self.fillers: list[socket.socket] = []

    def __enter__(self) -> Blackhole:
        self.fillers += fill_accept_queue(self.port)
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self.fillers:
            s.close()
        self.listener.close()


class Gate:
    """A worker address in front of ``upstream_port``.  Shut, its listener's accept queue is full,
    so new connections get no answer and connecting times out (as :class:`fault_worker.Blackhole`);
    open, it accepts and forwards every connection to the worker."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.fillers: list[socket.socket] = []
        self.accepted = 0
        # connections being forwarded: each holds two descriptors of this process (the accepted one
        # and the one to the worker) besides the client's and the worker's ends (fault_env.check_clean)
        self.forwarding = 0
        self._serving: trio.CancelScope | None = None

    def open(self, nursery: trio.Nursery) -> None:
        """Synchronous (called from a log handler): take what waits in the accept queue, then serve."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                break
            conn.close()
        for s in self.fillers:
            s.close()
        self.fillers.clear()
        self._serving = trio.CancelScope()
        nursery.start_soon(self._serve, self._serving)

    def shut(self) -> None:
        """Stop accepting, close the connections forwarded so far and fill the accept queue."""
        if self._serving is not None:
            self._serving.cancel()
            self._serving = None
        self.fillers += fill_accept_queue(self.port)

    def close(self) -> None:
        for s in self.fillers:
            s.close()
        self.listener.close()

    async def _serve(self, scope: trio.CancelScope) -> None:
        listener = trio.socket.from_stdlib_socket(self.listener)
        with scope:
            async with trio.open_nursery() as nursery:
                while True:
                    await trio.lowlevel.wait_readable(listener)
                    try:
                        conn, _ = self.listener.accept()
                    except BlockingIOError:
                        continue
                    self.accepted += 1
                    nursery.start_soon(self._forward, conn)

    async def _forward(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        client = trio.SocketStream(trio.socket.from_stdlib_socket(conn))
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        except OSError:
            await client.aclose()
            return
        self.forwarding += 1
        try:
            async with client, upstream, trio.open_nursery() as nursery:

                async def pipe(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                    try:
                        while data := await src.receive_some(65536):
                            await dst.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(pipe, client, upstream)
                nursery.start_soon(pipe, upstream, client)
        finally:
            self.forwarding -= 1


class FaultProxy:
    """TCP forwarding to ``upstream_port`` with transport faults (see the module docstring)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.mode = "pass"
        self.limit = 0
        self.drip_seconds = 0.01
        self.open_connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def run(self, *, task_status: trio.TaskStatus[FaultProxy] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started(self)

    async def _serve(self, client: trio.SocketStream) -> None:
        mode, limit = self.mode, self.limit
        self.open_connections += 1
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        except OSError:
            self.open_connections -= 1
            abort(client)
            return
        try:
            async with trio.open_nursery() as nursery:

                async def up() -> None:
                    try:
                        while data := await client.receive_some(65536):
                            await upstream.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
                    nursery.cancel_scope.cancel()

                async def down() -> None:
                    sent = 0
                    try:
                        while data := await upstream.receive_some(65536):
                            if mode in ("reset_after", "stall_after") and sent + len(data) > limit:
                                await client.send_all(data[: limit - sent])
                                if mode == "reset_after":
                                    abort(client)
                                    abort(upstream)
                                    nursery.cancel_scope.cancel()
                                    return
                                await trio.sleep_forever()  # stall: the daemon must give up first
                            if mode == "drip":
                                for i in range(len(data)):
                                    await client.send_all(data[i : i + 1])
                                    await trio.sleep(self.drip_seconds)
                            else:
                                await client.send_all(data)
                            sent += len(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(up)
                nursery.start_soon(down)
        finally:
            self.open_connections -= 1
            with trio.CancelScope(shield=True):
                for s in (client, upstream):
                    try:
                        await s.aclose()
                    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
