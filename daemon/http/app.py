"""The Quart-Trio application: proxy routes on a raw ASGI fast path, operational routes in Quart.

``create_app(handles)`` returns an :class:`AgentdApp`.  Its ``asgi_app`` sends the three
agent-facing POST routes (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``)
straight to :func:`serve_proxy_asgi`, which runs the whole request - body read with the size
limit, validation, dispatch, forwarding and relay - in one coroutine:

* the lease, the upstream stream and the response share one structured lifetime (no body
  generator outliving the handler, no lease handed across tasks);
* a client that goes away cancels the request scope, so the upstream request is cancelled at
  once: with agentd's HTTP/1.1 protocol the connection does it (``Exchange.watch_disconnect``,
  no task per request, docs/operations.md §13.8), else a sibling task waits for
  ``http.disconnect``;
* it avoids Quart's per-request context machinery on the hot path.

``POST /v1/files`` (the Batch API's upload, docs/batch.md §4) is raw ASGI too, so that its size
limits apply while the multipart body streams in (:mod:`daemon.http.batches`).

Everything else (``/v1/models``, the Batch API's other routes, ``/health``, ``/metrics``,
``/scheduling/diagnostics``, the ``/dashboard`` page and its ``/scheduling/dashboard.json``, 404/405
for unknown routes/methods) is ordinary Quart.  Every error body is OpenAI-shaped; unexpected
exceptions become a 500 ``internal_error`` without a traceback (the traceback goes to the log).
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from actors.logevents import get_logger, log_event
from daemon.auth import Authenticator
from daemon.config import LimitsConfig
from daemon.http.batches import PRINCIPAL_SCOPE_KEY, batches_blueprint, serve_file_upload
from daemon.http.dashboard import dashboard_blueprint
from daemon.http.diagnostics import PROBE_PATHS, diagnostics_blueprint
from daemon.http.direct_body import DirectBody
from daemon.http.direct_body import attach as attach_direct_body
from daemon.http.edge import DRAINED_STREAM_MESSAGE, LARGE_BODY_BYTES, Edge, Ticket, sse_error_event
from daemon.http.errors import ApiError, error_body, sse_error_tail
from daemon.http.h1proto import DISCONNECT_WATCH, RESPOND, TAKE_BODY
from daemon.http.hypercorn_close import HOLD_WRITE
from daemon.http.metrics_route import metrics_blueprint
from daemon.http.proxy import ClientGone, ProxyEngine, can_travel, send_error
from daemon.http.queue_eta import QueueWatch
from daemon.http.requests import ENDPOINTS
from daemon.models import find_model, with_pool_models
from daemon.upstream import client_headers

if TYPE_CHECKING:
    from daemon.handles import DaemonHandles

logger = get_logger("http")
JSON = "application/json"
KEEPALIVE_COMMENT = b": keep-alive\n\n"
CREDENTIAL_HEADERS = ("authorization", "x-api-key")
# Routes for operators only (docs/operations.md §10): on the admin listener when there is one,
# else on the public port, where they need an admin key once API keys are configured.
ADMIN_PREFIXES = ("/scheduling/", "/metrics", "/dashboard")
# The listener roles: "all" (one listener serves everything), "public" (the agent-facing routes
# and /health, /liveness, /readiness; the admin routes are 404), "admin" (the admin routes and those three).
ROLES = ("all", "public", "admin")


def is_admin_path(path: str) -> bool:
    return path.startswith(ADMIN_PREFIXES)


_SLASHES = re.compile(r"/{2,}")
_RAW_SLASHES = re.compile(rb"/{2,}")


def _origin_path(scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` with an absolute-form path (``http://host/v1/models``) made its path (``/v1/models``):
    Quart would route a path without its leading slash, which the admin check does not recognise
    (``scheduling/diagnostics`` reached the admin route from the public port)."""
    path = scope["path"]
    scheme, sep, rest = path.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return scope
    slash = rest.find("/")
    origin = dict(scope)
    origin["path"] = "/" if slash < 0 else rest[slash:]
    origin["raw_path"] = origin["path"].encode("utf-8", "surrogateescape")
    return origin


def _merged_slashes(scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` with each run of slashes in its path made one (``//metrics`` is ``/metrics``)."""
    merged = dict(scope)
    merged["path"] = _SLASHES.sub("/", scope["path"])
    raw = scope.get("raw_path")
    if raw:
        merged["raw_path"] = _RAW_SLASHES.sub(b"/", raw)
    return merged


def canonical_scope(scope: dict[str, Any]) -> tuple[dict[str, Any], ApiError | None]:
    """``scope`` with the path every route check and the routing see: an absolute-form target made
    its path, runs of slashes merged (docs/operations.md §14); or the 400 for a target that does not
    start with ``/``.  The public app and a relay process's app (which must recognise the proxy
    routes exactly as the scheduler process would, docs/operations.md §13.1) both route on it."""
    path = scope["path"]
    if not path.startswith("/"):  # absolute-form ("http://host/x") or a bare "x", "*"
        scope = _origin_path(scope)
        path = scope["path"]
        if not path.startswith("/"):
            error = ApiError(
                400,
                f"malformed request target {path[:80]!r}: it must start with /",
                code="invalid_request_line",
            )
            return scope, error
    if "//" in path:
        # one path for the admin split, the keys and the routing: Quart's router merges
        # repeated slashes, so //scheduling/diagnostics reached the admin route while the
        # prefix check saw a public path (docs/operations.md §14)
        scope = _merged_slashes(scope)
    return scope, None


class AsgiSink:
    """:class:`~daemon.http.proxy.ResponseSink` over an ASGI ``send``.

    With SSE keep-alive (``limits.sse_keepalive_seconds``) a streaming request still without a
    response sends its own ``200 text/event-stream`` head early (:meth:`keepalive`) and ``:
    keep-alive`` comments; the real response's head is then dropped, and an error response
    (non-2xx) is turned into an SSE error event followed by ``data: [DONE]``.
    """

    def __init__(self, send: Any, respond: Any = None) -> None:
        self._send = send
        # the connection's whole-response writer (agentd's HTTP/1.1 protocol, h1proto RESPOND): a
        # complete response's head and body without two ASGI messages (docs/operations.md §13.8)
        self._respond = respond
        self.started = False  # a response head went out (ours or the engine's)
        self.completed = False  # the final body message was handed to the server
        self.sse = False  # the response is an event stream
        self.at_boundary = True  # the bytes sent so far end between two SSE events
        self._early = False  # the head was the keep-alive one
        self._error_status: int | None = None  # an error response replaced by an SSE event
        self._error_body = b""
        self._direct: DirectBody | None = None  # the body's chunks straight to the socket
        self._head: dict[str, Any] | None = None  # a non-stream head waiting for its body

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        if self._early:
            if not 200 <= status < 300:
                self._error_status = status
            return
        self.started = True
        self.sse = any(k == "content-type" and v.startswith("text/event-stream") for k, v in headers)
        head = {
            "type": "http.response.start",
            "status": status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        }
        if not self.sse:
            self._head = head  # leaves with the body: one socket write (docs/benchmarks.md §10.2)
            return
        await self._send(head)  # a stream's head leaves at once (the client waits for it)
        if 200 <= status < 300:  # the relay's hot path (daemon/http/direct_body.py)
            self._direct = attach_direct_body(self._send)

    async def _send_head(self) -> None:
        head, self._head = self._head, None
        token = HOLD_WRITE.set(True)
        try:
            await self._send(head)
        finally:
            HOLD_WRITE.reset(token)

    @property
    def cancel_safe_send(self) -> bool:
        """:meth:`send` never delivers a cancellation (the direct body writer is attached)."""
        return self._direct is not None

    @property
    def sync_writer(self) -> DirectBody | None:
        """The direct body writer, for the relay hub's writes without a task switch (daemon/h1client.py
        ``RelayHub``; it writes complete events only, so ``at_boundary`` stays true)."""
        return self._direct

    async def send(self, chunk: bytes) -> None:
        direct = self._direct
        if direct is not None:
            if chunk:
                self.at_boundary = chunk.endswith(b"\n\n")
                await direct.write(chunk)
            return
        if self._error_status is not None:
            self._error_body += chunk
            return
        if chunk:
            self.at_boundary = chunk.endswith(b"\n\n")
        try:
            if self._head is not None:
                await self._send_head()
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ClientGone(str(exc)) from exc

    async def end(self, chunk: bytes = b"") -> None:
        if self._error_status is not None:
            chunk = _error_as_event(self._error_status, self._error_body + chunk)
            self._error_status = None
        self.completed = True
        try:
            if self._head is not None:
                if self._respond is not None:
                    head, self._head = self._head, None
                    await self._respond(head["status"], head["headers"], chunk)
                    return
                await self._send_head()
            await self._send({"type": "http.response.body", "body": chunk, "more_body": False})
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ClientGone(str(exc)) from exc

    async def keepalive(self, interval: float, watch: QueueWatch | None = None) -> None:
        """Send ``: keep-alive`` comments every ``interval`` seconds until a response starts; while
        the request waits in the scheduler's queue, ``: queued position=P eta=E.Es`` instead
        (``watch``, docs/program-scheduling.md §13)."""
        while True:
            await trio.sleep(interval)
            if self.completed or (self.started and not self._early):
                return
            try:
                if not self.started:
                    self.started = self._early = self.sse = True
                    await self._send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
                        }
                    )
                comment = watch.comment() if watch is not None else None
                body = KEEPALIVE_COMMENT if comment is None else comment
                await self._send({"type": "http.response.body", "body": body, "more_body": True})
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ClientGone(str(exc)) from exc


def _error_as_event(status: int, body: bytes) -> bytes:
    """A JSON error response as one SSE error event + ``[DONE]`` (the head already said 200)."""
    try:
        payload = json.loads(body)
        if not isinstance(payload, dict) or "error" not in payload:
            raise ValueError
    except ValueError:
        text = body.decode("utf-8", "replace")[:512] or f"HTTP {status}"
        payload = {"error": {"message": text, "type": "upstream_error", "param": None, "code": f"http_{status}"}}
    payload["error"]["status"] = status
    return sse_error_tail(payload)


def _scope_headers(scope: dict[str, Any]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"request body exceeds the limit of {limit} bytes (server.max_body_bytes)", code="body_too_large"
    )


def _check_declared(limit: int, declared: str | None) -> None:
    """ApiError 413 when the declared ``content-length`` is over ``limit``, 400 when it is not a number."""
    if declared is not None:
        # ASCII digits only (int() also takes "-1", " 1", "1_0" and "²"); a socket's protocol
        # refuses those before the app, an ASGI server in front of agentd might not
        if not (declared.isascii() and declared.isdigit()):
            raise ApiError(
                400, f"invalid content-length header: {declared[:40]!r}", code="invalid_header", param="content-length"
            )
        if len(declared) > 18 or int(declared) > limit:
            raise _too_large(limit)


async def _read_body(receive: Any, limit: int, declared: str | None) -> bytes | None:
    """The request body, ``None`` when the client disconnected; ApiError 413 over ``limit``."""
    _check_declared(limit, declared)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            # raised fresh, with the chunks dropped: an error kept in a local would form a cycle
            # with this frame and hold the body until a full garbage collection
            chunks.clear()
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _body_timeout(seconds: float) -> ApiError:
    return ApiError(
        408,
        f"the request body did not arrive within limits.body_read_timeout_seconds ({seconds:g} s)",
        code="body_read_timeout",
    )


async def _watch_disconnect(receive: Any, scope: trio.CancelScope, sink: AsgiSink) -> None:
    """Cancel the request when the client goes away before the response is complete.

    Hypercorn also reports ``http.disconnect`` right after the final body message of a
    completed response; that one must not cancel the (already finished) request.
    """
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not sink.completed:
                scope.cancel()
            return


async def _answer_drained(sink: AsgiSink, edge: Edge) -> None:
    """The drain deadline cut this request: a JSON 503, or an error event + ``[DONE]`` (docs/operations.md §10.4)."""
    if sink.completed:
        return
    with trio.CancelScope(shield=True):
        if not sink.started:
            await send_error(
                sink, ApiError(503, DRAINED_STREAM_MESSAGE, code="server_shutting_down", headers=edge.retry_after)
            )
        elif sink.sse:
            event = sse_error_event(DRAINED_STREAM_MESSAGE, "server_shutting_down")
            await sink.end(event if sink.at_boundary else b"\n\n" + event)
        else:
            await sink.end()


async def serve_proxy_asgi(
    engine: ProxyEngine,
    max_body_bytes: int,
    endpoint: str,
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    *,
    limits: LimitsConfig | None = None,
    edge: Edge | None = None,
    auth: Authenticator | None = None,
) -> None:
    """One agent-facing POST request, end to end (see the module docstring)."""
    extensions = scope.get("extensions") or {}
    sink = AsgiSink(send, extensions.get(RESPOND))
    headers = _scope_headers(scope)
    limits = limits if limits is not None else LimitsConfig()
    edge = edge if edge is not None else Edge(limits)
    try:
        principal = None if auth is None else auth.principal(headers)
        if principal is not None:  # the client's agentd key never reaches a worker
            headers = {k: v for k, v in headers.items() if k not in CREDENTIAL_HEADERS}
        ticket = edge.open_ticket()
    except ApiError as error:
        await send_error(sink, error, _echo_id(headers))
        return
    try:
        await _serve_ticket(
            engine, limits, max_body_bytes, endpoint, scope, receive, sink, headers, edge, ticket, principal
        )
    finally:
        edge.close_ticket(ticket)


def _echo_id(headers: dict[str, str]) -> str | None:
    """The client's ``x-request-id`` to echo on an answer given before the request was parsed
    (docs/operations.md §12): only one that could travel (bounded, visible ASCII)."""
    rid = headers.get("x-request-id")
    return rid if rid is not None and can_travel(rid) else None


async def _serve_ticket(
    engine: ProxyEngine,
    limits: LimitsConfig,
    max_body_bytes: int,
    endpoint: str,
    scope: dict[str, Any],
    receive: Any,
    sink: AsgiSink,
    headers: dict[str, str],
    edge: Edge,
    ticket: Ticket,
    principal: str | None,
) -> None:
    raw: bytes | None = None
    extensions = scope.get("extensions") or {}
    try:
        declared = headers.get("content-length")
        take_body = extensions.get(TAKE_BODY)
        if take_body is not None:  # agentd's protocol: a body that came with its head, at once
            _check_declared(max_body_bytes, declared)
            raw = take_body()
        if raw is None:
            # one scope for the body-read timeout and the drain (docs/benchmarks.md §10.2)
            seconds = limits.body_read_timeout_seconds
            with trio.CancelScope(deadline=trio.current_time() + seconds) as body_scope:
                ticket.scope = body_scope
                raw = await _read_body(receive, max_body_bytes, declared)
            if body_scope.cancelled_caught and not ticket.drained:
                raise _body_timeout(seconds)
        if ticket.drained:
            await _answer_drained(sink, edge)
            return
        if raw is None:
            return
        if len(raw) > LARGE_BODY_BYTES:  # held until the request ends (docs/operations.md §14)
            await edge.hold_large_body(ticket, len(raw))
        req = engine.build_request(endpoint, raw, headers, principal=principal)
    except ApiError as error:
        await send_error(sink, error, _echo_id(headers))
        return
    except Exception as exc:  # a bug in parsing: a JSON 500, logged once, never a bare 500
        logger.error(
            "request parsing failed",
            exc_info=exc,
            extra={"agentd_event": "internal_error", "agentd_fields": {"path": scope["path"]}},
        )
        bug = ApiError(500, "internal error in agentd (see the daemon log)", code="internal_error")
        await send_error(sink, bug, _echo_id(headers))
        return

    async def run() -> None:
        try:
            async with edge.slot(ticket):
                await engine.handle(req, sink, raw_body=raw)
        except ApiError as error:  # an edge limit or the drain refused the request
            log_event(
                logger, logging.INFO, "edge_refused", request_id=req.request_id, status=error.status, code=error.code
            )
            await send_error(sink, error, req.client_request_id or req.request_id)

    watch_disconnect = extensions.get(DISCONNECT_WATCH)
    keepalive = limits.sse_keepalive_seconds if req.stream else None
    try:
        if watch_disconnect is not None and keepalive is None:
            # agentd's protocol cancels the request when the client goes: no watcher task, no
            # nursery (docs/benchmarks.md §10.2.4)
            with trio.CancelScope() as request_scope:
                ticket.scope = request_scope
                unwatch = watch_disconnect(request_scope.cancel)
                try:
                    await run()
                finally:
                    unwatch()
        else:
            async with trio.open_nursery() as nursery:
                ticket.scope = nursery.cancel_scope
                nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope, sink)
                if keepalive is not None:
                    queue_watch = QueueWatch()  # the queue position/ETA comments (docs/program-scheduling.md §13)
                    req = attrs.evolve(req, queue_watch=queue_watch)
                    nursery.start_soon(sink.keepalive, keepalive, queue_watch)
                await run()
                nursery.cancel_scope.cancel()
    except* ClientGone:
        log_event(logger, logging.INFO, "client_gone", path=scope["path"], request_id=req.request_id)
    except* Exception as group:  # a bug: answer 500 without leaking the traceback, log it
        logger.error(
            "proxy handler failed",
            exc_info=group,
            extra={
                "agentd_event": "internal_error",
                "agentd_fields": {"path": scope["path"], "request_id": req.request_id},
            },
        )
        if not sink.started:
            await send_error(
                sink, ApiError(500, "internal error in agentd (see the daemon log)", code="internal_error")
            )
    if ticket.drained and not sink.completed:  # (a refusal still being written is complete enough)
        log_event(logger, logging.INFO, "request_drained", request_id=req.request_id, streamed=sink.started)
        await _answer_drained(sink, edge)


class AgentdApp(QuartTrio):
    handles: DaemonHandles
    edge: Edge
    auth: Authenticator
    role: str = "all"

    async def asgi_app(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            method = scope["method"]
            if method != method.upper():  # case-sensitive (RFC 9110 §9.1); Quart's routing is not
                await send_error(AsgiSink(send), lowercase_method(method, path))
                return
            if not path.startswith("/") or "//" in path:
                scope, error = canonical_scope(scope)
                if error is not None:
                    await send_error(AsgiSink(send), error)
                    return
                path = scope["path"]
            if await self._refused(path, scope, send):
                return
            endpoint = ENDPOINTS.get(path)
            if endpoint is not None:
                if scope["method"] == "POST":
                    await serve_proxy_asgi(
                        self.handles.engine,
                        self.handles.config.server.max_body_bytes,
                        endpoint,
                        scope,
                        receive,
                        send,
                        limits=self.handles.config.limits,
                        edge=self.edge,
                        auth=self.auth,
                    )
                    return
                error = ApiError(
                    405,
                    f"method {scope['method']} is not allowed on {path}; use POST",
                    code="method_not_allowed",
                    headers=(("allow", "POST"),),
                )
                await send_error(AsgiSink(send), error)
                return
            if path == "/v1/files" and self.handles.batches is not None and scope["method"] not in ("GET", "HEAD"):
                if scope["method"] != "POST":  # Quart's Allow would miss the POST served here
                    await _files_other_method(scope["method"], send)
                    return
                await serve_file_upload(
                    self.handles.batches,
                    scope,
                    receive,
                    send,
                    stall_seconds=self.handles.config.limits.body_read_timeout_seconds,
                )
                return
        await super().asgi_app(scope, receive, send)

    async def _refused(self, path: str, scope: Any, send: Any) -> bool:
        """Route split and authentication (docs/operations.md §10); True when answered here."""
        if path in PROBE_PATHS:  # /health and the reference's probes: no key, public and admin listeners
            return False
        admin = is_admin_path(path)
        error: ApiError | None = None
        if (admin and self.role == "public") or (not admin and self.role == "admin"):
            error = ApiError(404, f"unknown route {scope['method']} {path}", code="not_found")
        elif admin and self.role == "all":
            try:
                self.auth.check_admin(_scope_headers(scope))
            except ApiError as exc:
                error = exc
        elif not admin and self.role != "admin" and ENDPOINTS.get(path) is None and self.auth.enabled:
            try:  # the proxy routes authenticate in serve_proxy_asgi (the principal is needed there)
                scope[PRINCIPAL_SCOPE_KEY] = self.auth.principal(_scope_headers(scope))  # Batch API owner
            except ApiError as exc:
                error = exc
        if error is None:
            return False
        await send_error(AsgiSink(send), error)
        return True


FILES_ALLOW = "GET, HEAD, POST, OPTIONS"


def lowercase_method(method: str, path: str) -> ApiError:
    """A method with lower-case letters is another method than its upper-case form (RFC 9110 §9.1):
    a 405, never served as the upper-case one (a filter in front of agentd that blocks ``POST``
    must not be passed by ``post``; session-36 walk, docs/operations.md §14)."""
    shown = method[:40]
    return ApiError(
        405,
        f"method {shown!r} is not allowed on {path[:200]}: HTTP methods are case-sensitive (use {shown.upper()!r})",
        code="method_not_allowed",
    )


async def _files_other_method(method: str, send: Any) -> None:
    """``/v1/files`` with a method other than GET/HEAD/POST: OPTIONS is a 200 naming the methods,
    anything else a 405 with ``Allow`` (the upload is served in front of Quart, so Quart's own
    answer would leave POST out)."""
    sink = AsgiSink(send)
    if method == "OPTIONS":
        await sink.start(200, [("allow", FILES_ALLOW), ("content-length", "0")])
        await sink.end(b"")
        return
    error = ApiError(
        405,
        f"method {method} is not allowed on /v1/files",
        code="method_not_allowed",
        headers=(("allow", FILES_ALLOW),),
    )
    await send_error(sink, error)


def _json_response(body: bytes, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status=status, content_type=JSON, headers=headers)


def create_app(
    handles: DaemonHandles, *, role: str = "all", edge: Edge | None = None, auth: Authenticator | None = None
) -> AgentdApp:
    """The app of one listener; ``role`` is one of :data:`ROLES`, ``edge`` its limits and drain
    (shared by the listeners of one daemon), ``auth`` its API keys (default: none)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    app = AgentdApp("agentd")
    app.handles = handles
    app.role = role
    app.edge = edge if edge is not None else handles.edge if handles.edge is not None else Edge(handles.config.limits)
    app.auth = auth if auth is not None else Authenticator.from_config(handles.config.auth)
    app.config["RESPONSE_TIMEOUT"] = None  # streams may legitimately last for minutes
    # the Quart routes' bodies (POST /v1/batches) arrive within the proxy routes' limit (408)
    app.config["BODY_TIMEOUT"] = handles.config.limits.body_read_timeout_seconds
    app.config["MAX_CONTENT_LENGTH"] = handles.config.server.max_body_bytes
    app.register_blueprint(diagnostics_blueprint(handles))
    app.register_blueprint(dashboard_blueprint(handles))
    relays = None if handles.data_plane is None else handles.data_plane.relay_metrics.families
    app.register_blueprint(metrics_blueprint(handles.registry, relays))
    if handles.batches is not None:
        app.register_blueprint(batches_blueprint(handles.batches))

    async def fetch_models() -> httpx.Response:
        """The model list of the first healthy worker (its status, headers and body as they came)."""
        healthy = handles.health.healthy_targets()
        if not healthy:
            raise ApiError(
                503,
                f"no healthy targets are available: {handles.health.unhealthy_reason()}",
                code="no_healthy_target",
                headers=(("retry-after", str(handles.config.limits.retry_after_seconds)),),
            )
        target = healthy[0]
        try:
            upstream = await handles.client.get(
                f"{target.worker_url}/v1/models",
                # the client's own credential passes through only without agentd keys: an agentd
                # key never reaches a worker (docs/operations.md §10.1)
                headers={"authorization": request.headers["authorization"]}
                if "authorization" in request.headers and not app.auth.enabled
                else None,
            )
        except httpx.HTTPError as exc:
            raise ApiError(
                502,
                f"worker {target.target_id} is unreachable: {type(exc).__name__}: {exc}",
                code="upstream_unreachable",
                error_type="upstream_error",
            ) from exc
        if upstream.status_code >= 500:
            raise ApiError(
                502,
                f"worker {target.target_id} failed with HTTP {upstream.status_code}",
                code="upstream_status",
                error_type="upstream_error",
            )
        return upstream

    def relayed_headers(upstream: httpx.Response) -> dict[str, str]:
        """The worker's headers for the client; without a content-type, ``application/json`` (what
        the route serves), never Quart's default ``text/html`` on agentd's origin (session-35 walk)."""
        headers = dict(client_headers(upstream.headers))
        if not any(name.lower() == "content-type" for name in headers):
            headers["content-type"] = "application/json"
        return headers

    @app.get("/v1/models")
    async def models() -> Response:
        upstream = await fetch_models()
        content = upstream.content
        if upstream.status_code == 200 and handles.engine.models is not None:
            content = with_pool_models(content, handles.engine.models)  # every worker's models (model pools)
        return Response(content, status=upstream.status_code, headers=relayed_headers(upstream))

    @app.get("/v1/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        """One model of the list (OpenAI's ``GET /v1/models/{model}``, which vLLM does not serve):
        answered from ``/v1/models`` with every worker's models, 404 ``model_not_found`` naming it."""
        upstream = await fetch_models()
        content = upstream.content
        if upstream.status_code != 200:
            return Response(content, status=upstream.status_code, headers=relayed_headers(upstream))
        if handles.engine.models is not None:
            content = with_pool_models(content, handles.engine.models)
        found = find_model(content, model_id)
        if found is None:
            raise ApiError(404, f"The model '{model_id}' does not exist", code="model_not_found", param="model")
        return _json_response(json.dumps(found).encode(), 200)

    @app.errorhandler(ApiError)
    async def api_error(error: ApiError) -> Response:
        return _json_response(error.body(), error.status, dict(error.headers))

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        codes = {404: "not_found", 405: "method_not_allowed", 408: "body_read_timeout", 413: "body_too_large"}
        message = {
            404: f"unknown route {request.method} {request.path}",
            405: f"method {request.method} is not allowed on {request.path}",
            408: "the request body did not arrive within limits.body_read_timeout_seconds "
            f"({handles.config.limits.body_read_timeout_seconds:g} s)",
            413: "request body exceeds server.max_body_bytes",
        }.get(status, error.description or error.name)
        headers = {}
        if status == 405 and getattr(error, "valid_methods", None):
            # sorted: werkzeug's methods are a set, whose order changes with each process's hash
            # seed (a relay and the scheduler process answered the same 405 differently)
            headers["allow"] = ", ".join(sorted(error.valid_methods))  # type: ignore[attr-defined]
        body = error_body(
            message,
            "invalid_request_error" if status < 500 else "server_error",
            None,
            codes.get(status, f"http_{status}"),
        )
        return _json_response(body, status, headers)

    @app.errorhandler(Exception)
    async def internal_error(error: Exception) -> Response:
        logger.error(
            "unhandled error",
            exc_info=error,
            extra={"agentd_event": "internal_error", "agentd_fields": {"path": request.path}},
        )
        body = error_body("internal error in agentd (see the daemon log)", "server_error", None, "internal_error")
        return _json_response(body, 500)

    return app
