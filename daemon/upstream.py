"""Talking to workers: the httpx client, error mapping, header hygiene and usage extraction.

* :func:`client_kwargs` - timeouts and pool limits from ``cfg.routing`` for the one
  ``httpx.AsyncClient`` the supervisor owns.
* :class:`UpstreamError` family - httpx errors translated at the boundary into the three cases the
  proxy maps to HTTP: unreachable (502), timeout (504) and protocol/stream failures (502).
* :func:`upstream_headers` / :func:`client_headers` - hop-by-hop headers (RFC 9110 7.6.1 plus the
  ones named in ``Connection``) never cross the proxy; the client's ``x-data-parallel-rank`` never
  reaches a worker (agentd sets its own); ``content-length``/``host`` are recomputed.
* :class:`UsageAccumulator` - token usage from a JSON body or an SSE stream in the chat,
  completions and responses formats (``usage``, ``message.usage``, ``response.usage``); fields
  merge by per-field max so partial chunks never regress.
* :class:`UpstreamTransport` - the pooled HTTP/1.1 transport to real workers
  (:mod:`daemon.h1client`: head and body in one socket write, lean streamed reads).
* :class:`UsageChunkFilter` - when agentd injected ``stream_options.include_usage`` on behalf of
  the scheduler, drops the extra usage-only chunk (``"choices": []`` plus ``usage``) before the
  client sees it, at SSE event granularity (events are relayed as soon as they are complete).
"""

from __future__ import annotations

import base64
import json
import math
import re
import ssl
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import httpx
import trio

from actors.core.model import Usage
from daemon.h1client import H1Pool, LeanResponse, RawHeaders, request_bytes
from daemon.pool_reaper import ReapedTransport

HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
DP_RANK_HEADER = "x-data-parallel-rank"
_DROP_TO_UPSTREAM = HOP_BY_HOP | {"host", "content-length", "content-type", DP_RANK_HEADER, "accept-encoding", "expect"}
_DROP_TO_CLIENT = HOP_BY_HOP | {"content-length", "date", "server"}
MAX_SSE_LINE_BYTES = 1 << 20


class UpstreamError(Exception):
    """A failure talking to a worker; ``kind`` is the bounded metric/outcome label."""

    kind = "stream"
    status = 502

    def __init__(self, target_id: str, detail: str) -> None:
        super().__init__(f"worker {target_id} {self.describe()}: {detail}")
        self.target_id = target_id
        self.detail = detail

    def describe(self) -> str:
        return "failed mid-response"


class UpstreamUnreachable(UpstreamError):
    kind = "unreachable"
    status = 502

    def describe(self) -> str:
        return "is unreachable"


class UpstreamRankRefused(UpstreamError):
    """The worker refused the request's DP rank (it runs fewer ranks than configured): nothing ran,
    so the request is sent to another rank (docs/operations.md §11.3)."""

    kind = "rank_refused"
    status = 400

    def describe(self) -> str:
        return "refused its DP rank"


class UpstreamTimeout(UpstreamError):
    kind = "timeout"
    status = 504

    def describe(self) -> str:
        return "timed out"


def map_httpx_error(target_id: str, exc: httpx.HTTPError) -> UpstreamError:
    """Most specific :class:`UpstreamError` for an httpx error (chain with ``from exc``)."""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(target_id, detail)
    if isinstance(exc, httpx.ConnectError | httpx.UnsupportedProtocol):
        return UpstreamUnreachable(target_id, detail)
    return UpstreamError(target_id, detail)


# Idle keep-alive connections expire before the workers close them: uvicorn (vLLM's server) closes
# an idle connection after 5 s; reusing one just as it closes is the idle-close race
# (docs/operations.md §11).
DEFAULT_KEEPALIVE_EXPIRY_SECONDS = 4.0


def upstream_limits(keepalive_expiry_seconds: float = DEFAULT_KEEPALIVE_EXPIRY_SECONDS) -> httpx.Limits:
    return httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=keepalive_expiry_seconds)


@attrs.frozen
class UpstreamTimeouts:
    """The four upstream timeouts (docs/operations.md §11), in seconds.

    ``connect``: opening a connection; ``first_byte``: from the request sent to the response head,
    for streaming requests (a non-streaming answer's head comes with the whole completion, so
    only ``total`` bounds it); ``idle``: the longest silence between two reads of a response body;
    ``total``: the whole exchange, head to last byte.
    """

    connect: float = 5.0
    first_byte: float = 60.0
    idle: float = 60.0
    total: float = 600.0

    def for_request(self, stream: bool) -> dict[str, float]:
        """The ``timeout`` extension of one request (:mod:`daemon.h1client` reads these keys)."""
        return {
            "connect": self.connect,
            "write": self.idle,
            "pool": self.connect,
            "first_byte": self.first_byte if stream else self.total,
            "read": self.idle,
        }


# The embedded simulated workers live in the daemon's own process (no network to fail) and run in
# virtual time under ``agentd simulate``, where a queued request's silence can be arbitrarily long.
UNBOUNDED_TIMEOUTS = UpstreamTimeouts(connect=math.inf, first_byte=math.inf, idle=math.inf, total=math.inf)


def upstream_timeouts(routing: Any, *, embedded: bool = False) -> UpstreamTimeouts:
    """The timeouts of ``[routing]`` (``daemon.config.RoutingConfig``); none for embedded workers."""
    if embedded:
        return UNBOUNDED_TIMEOUTS
    return UpstreamTimeouts(
        connect=routing.connect_timeout_seconds,
        first_byte=routing.first_byte_timeout_seconds,
        idle=routing.stream_idle_timeout_seconds,
        total=routing.request_timeout_seconds,
    )


def client_kwargs(
    request_timeout_seconds: float,
    connect_timeout_seconds: float,
    keepalive_expiry_seconds: float = DEFAULT_KEEPALIVE_EXPIRY_SECONDS,
) -> dict[str, Any]:
    """Keyword arguments for the daemon's ``httpx.AsyncClient``."""
    return {
        "timeout": httpx.Timeout(request_timeout_seconds, connect=connect_timeout_seconds),
        "limits": upstream_limits(keepalive_expiry_seconds),
        "follow_redirects": False,
        "trust_env": False,
    }


def _connection_named(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    named: set[str] = set()
    for name, value in headers:
        if name == "connection":
            named.update(part.strip().lower() for part in value.split(","))
    return frozenset(named)


def upstream_headers(
    client_headers: Mapping[str, str], dp_rank: int | None, request_id: str, attempt: int = 0
) -> list[tuple[str, str]]:
    """Headers sent to a worker: the client's minus hop-by-hop/DP/length, plus ours.

    ``dp_rank`` None: no ``x-data-parallel-rank`` (a worker with one DP target: vLLM balances its
    own engines, as behind the reference with ``--intra-node-data-parallel-size 1``).

    ``request_id`` is the id the worker sees (``daemon.request_ids.upstream_request_id``: the
    client's own ``X-Request-Id`` never travels alone).  A repeated attempt (a preempted batch
    request sent again, docs/batch.md §2) gets its own ``X-Request-Id`` (``<id>.retry<N>``), so
    the engine never confuses it with the aborted one.
    """
    extra_drop = _connection_named(client_headers.items())
    out = [
        (name, value)
        for name, value in client_headers.items()
        if name not in _DROP_TO_UPSTREAM and name not in extra_drop
    ]
    out.append(("content-type", "application/json"))
    out.append(("accept-encoding", "identity"))
    if dp_rank is not None:
        out.append((DP_RANK_HEADER, str(dp_rank)))
    out = [(n, v) for n, v in out if n != "x-request-id"]
    out.append(("x-request-id", f"{request_id}.retry{attempt}" if attempt else request_id))
    return out


def client_headers(worker_headers: httpx.Headers | RawHeaders) -> list[tuple[str, str]]:
    """Response headers relayed to the client (hop-by-hop and framing removed)."""
    pairs = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in worker_headers.raw]
    extra_drop = _connection_named(pairs)
    return [(k, v) for k, v in pairs if k not in _DROP_TO_CLIENT and k not in extra_drop]


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def usage_from_object(obj: Any) -> Usage | None:
    """Usage in one JSON object: ``usage``, ``message.usage`` or ``response.usage``."""
    if not isinstance(obj, dict):
        return None
    candidates = [obj.get("usage")]
    for outer in ("message", "response"):
        inner = obj.get(outer)
        if isinstance(inner, dict):
            candidates.append(inner.get("usage"))
    best: Usage | None = None
    for usage in candidates:
        if isinstance(usage, dict):
            best = merge_usage(best, _parse_usage(usage))
    return best


_USAGE_MEMBER = re.compile(rb'"usage"\s*:\s*\{')
_DECODER = json.JSONDecoder()


def usage_of_body(body: bytes) -> Usage | None:
    """The usage of a whole (non-streamed) JSON answer, read from its last ``"usage": {...}`` member
    alone: about 1.5 µs for a 1 KB chat completion, against 12 µs for parsing the whole body as
    :meth:`UsageAccumulator.feed_json` does (docs/priority.md §5.6).  A ``"usage"`` inside a string
    has its quotes escaped and never matches; a string value ``"usage"`` has no ``:`` after it.
    None when the body has no such member or it does not parse."""
    start = body.rfind(b'"usage"')
    while start >= 0:
        member = _USAGE_MEMBER.match(body, start)
        if member is not None:
            try:
                obj, _ = _DECODER.raw_decode(body[member.end() - 1 :].decode("utf-8", "replace"))
            except ValueError:
                return None
            return _parse_usage(obj) if isinstance(obj, dict) else None
        start = body.rfind(b'"usage"', 0, start)
    return None


def _parse_usage(u: dict[str, Any]) -> Usage:
    cache_read = None
    for key in ("cache_read_input_tokens", "cached_input_tokens", "cached_tokens"):
        cache_read = _int_or_none(u.get(key))
        if cache_read is not None:
            break
    cache_creation = _int_or_none(u.get("cache_creation_input_tokens"))
    prompt = _int_or_none(u.get("prompt_tokens"))
    if prompt is None:
        input_tokens = _int_or_none(u.get("input_tokens"))
        if input_tokens is not None:
            prompt = input_tokens + (cache_read or 0) + (cache_creation or 0)
    completion = _int_or_none(u.get("completion_tokens"))
    if completion is None:
        completion = _int_or_none(u.get("output_tokens"))
    cached = None
    for details_key in ("prompt_tokens_details", "input_tokens_details"):
        details = u.get(details_key)
        if isinstance(details, dict):
            cached = _int_or_none(details.get("cached_tokens"))
            if cached is not None:
                break
    if cached is None:
        cached = cache_read
    return Usage(prompt_tokens=prompt, cached_prompt_tokens=cached, completion_tokens=completion)


def _max_opt(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def merge_usage(a: Usage | None, b: Usage | None) -> Usage | None:
    if a is None:
        return b
    if b is None:
        return a
    return Usage(
        prompt_tokens=_max_opt(a.prompt_tokens, b.prompt_tokens),
        cached_prompt_tokens=_max_opt(a.cached_prompt_tokens, b.cached_prompt_tokens),
        completion_tokens=_max_opt(a.completion_tokens, b.completion_tokens),
    )


# a finish_reason that is a string (not null): only the event that ends a choice has one
_FINAL_REASON = re.compile(rb'"finish_reason"\s*:\s*"')


def _may_have_final_reason(data: bytes) -> bool:
    """:data:`_FINAL_REASON` matches ``data``; two substring counts settle the usual case (every
    ``finish_reason`` of the chunk is ``null``, as in every event but the last) without the regex."""
    total = data.count(b'"finish_reason"')
    if not total or total == data.count(b'"finish_reason":null'):
        return False
    return _FINAL_REASON.search(data) is not None


def finish_reason_of(obj: Any) -> str | None:
    """The first choice's ``finish_reason`` of a completion object or stream event, if it is set."""
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            reason = choice.get("finish_reason")
            return reason if isinstance(reason, str) else None
    return None


# the names of called functions: a chat/completions ``tool_calls`` entry (the first delta of each
# call when streamed), a legacy ``function_call``, or a Responses API ``function_call`` item
MAX_TOOL_NAMES = 8


def _has_tool_name(data: bytes) -> bool:
    return b'"name"' in data and (b'"tool_calls"' in data or b'"function_call"' in data)


def _function_name(call: Any) -> str | None:
    if isinstance(call, dict):
        fn = call.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name:
            return name
    return None


def tool_names_of(obj: Any) -> list[str]:
    """The function names the first choice calls in a completion object or stream event, in order
    (docs/program-scheduling.md §12); ``[]`` when it calls none.  Read-only: the relayed bytes are
    never changed."""
    if not isinstance(obj, dict):
        return []
    out: list[str] = []
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            for part in ("message", "delta"):
                msg = choice.get(part)
                if not isinstance(msg, dict):
                    continue
                calls = msg.get("tool_calls")
                for call in calls if isinstance(calls, list) else ():
                    name = _function_name(call)
                    if name is not None:
                        out.append(name)
                legacy = msg.get("function_call")
                if isinstance(legacy, dict) and isinstance(legacy.get("name"), str) and legacy["name"]:
                    out.append(legacy["name"])
            break
        return out
    # Responses API: a whole response ({"output": [...]}), a `response.*` event carrying one, or
    # `response.output_item.added` with its item
    items: list[Any] = []
    inner = obj.get("response")
    response: dict[str, Any] = inner if isinstance(inner, dict) else obj
    output = response.get("output")
    if isinstance(output, list):
        items.extend(output)
    if isinstance(obj.get("item"), dict) and obj.get("type") == "response.output_item.added":
        items.append(obj["item"])
    for item in items:
        if isinstance(item, dict) and item.get("type") == "function_call":
            name = item.get("name")
            if isinstance(name, str) and name:
                out.append(name)
    return out


class UsageAccumulator:
    """Collects usage, the first choice's ``finish_reason`` and the names of the functions it
    called from a whole JSON body (:meth:`feed_json`) or SSE chunks (:meth:`feed_sse`).  Only
    events that carry usage, a non-null finish reason or a function name are parsed (a cheap byte
    test first), so ordinary token events cost a few substring searches."""

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.tool_names: list[str] = []
        self._partial = b""

    def _tools(self, obj: Any) -> None:
        for name in tool_names_of(obj):
            if len(self.tool_names) < MAX_TOOL_NAMES:
                self.tool_names.append(name)

    def feed_json(self, body: bytes) -> None:
        wants_reason = self.finish_reason is None and _FINAL_REASON.search(body) is not None
        wants_tools = _has_tool_name(body)
        if b'"usage"' not in body and not wants_reason and not wants_tools:
            return
        try:
            obj = json.loads(body)
        except ValueError:
            return
        self.usage = merge_usage(self.usage, usage_from_object(obj))
        if wants_reason:
            self.finish_reason = finish_reason_of(obj)
        if wants_tools:
            self._tools(obj)

    def feed_sse(self, chunk: bytes) -> None:
        data = self._partial + chunk if self._partial else chunk
        if data.endswith(b"\n"):  # the common chunk: whole events
            complete, self._partial = data, b""
        else:
            cut = data.rfind(b"\n")
            if cut < 0:
                self._partial = data if len(data) <= MAX_SSE_LINE_BYTES else b""
                return
            complete, self._partial = data[: cut + 1], data[cut + 1 :]
            if len(self._partial) > MAX_SSE_LINE_BYTES:
                self._partial = b""
        if (
            b'"usage"' in complete
            or (self.finish_reason is None and _may_have_final_reason(complete))
            or _has_tool_name(complete)
        ):
            for line in complete.split(b"\n"):
                self._line(line)

    def finish(self) -> Usage | None:
        if self._partial:
            self._line(self._partial)
            self._partial = b""
        return self.usage

    def _line(self, line: bytes) -> None:
        line = line.rstrip(b"\r")
        if not line.startswith(b"data:"):
            return
        wants_reason = self.finish_reason is None and _FINAL_REASON.search(line) is not None
        wants_tools = _has_tool_name(line)
        if b'"usage"' not in line and not wants_reason and not wants_tools:
            return
        try:
            obj = json.loads(line[5:].strip())
        except ValueError:
            return
        self.usage = merge_usage(self.usage, usage_from_object(obj))
        if wants_reason:
            self.finish_reason = finish_reason_of(obj)
        if wants_tools:
            self._tools(obj)


def _is_usage_only_event(event: bytes) -> bool:
    if b'"usage"' not in event:
        return False
    for line in event.split(b"\n"):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            try:
                obj = json.loads(line[5:].strip())
            except ValueError:
                return False
            return isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)
    return False


class UsageChunkFilter:
    """Relays complete SSE events, dropping the usage-only event agentd asked for itself."""

    def __init__(self) -> None:
        self._buffer = b""
        self.dropped_count = 0

    def feed(self, chunk: bytes) -> bytes:
        data = self._buffer + chunk if self._buffer else chunk
        if b'"usage"' not in data:  # nothing to drop: the complete events pass through as they are
            cut = _complete_end(data)
            self._buffer = data[cut:]
            return data if cut == len(data) else data[:cut]
        out: list[bytes] = []
        start = 0
        while True:
            end, sep = _event_end(data, start)
            if end < 0:
                break
            event = data[start : end + sep]
            if _is_usage_only_event(event):
                self.dropped_count += 1
            else:
                out.append(event)
            start = end + sep
        self._buffer = data[start:]
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        if rest and _is_usage_only_event(rest):
            self.dropped_count += 1
            return b""
        return rest


def _complete_end(data: bytes) -> int:
    """The length of the prefix of ``data`` made of complete SSE events (blank-line terminated)."""
    if data.endswith(b"\n\n"):
        return len(data)
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _event_end(data: bytes, start: int) -> tuple[int, int]:
    """Index of the first blank-line separator at or after ``start`` and its length."""
    lf = data.find(b"\n\n", start)
    crlf = data.find(b"\r\n\r\n", start)
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, 4
    if lf >= 0:
        return lf, 2
    return -1, 0


# ---------------------------------------------------------------------------------------------
# The pooled transport to real workers
# ---------------------------------------------------------------------------------------------


def basic_authorization(url: httpx.URL) -> str:
    """HTTP Basic credentials of a worker URL's user-info (docs/operations.md §10)."""
    token = base64.b64encode(f"{url.username}:{url.password}".encode()).decode()
    return f"Basic {token}"


class UpstreamTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 to the workers: :mod:`daemon.h1client` for ``http://``, httpx's transport for TLS
    (:class:`daemon.pool_reaper.ReapedTransport`, made at the first ``https://`` request).

    Both raise httpx's own exception types, so the proxy maps errors the same way whichever path
    a worker URL takes, and both close their idle connections while :meth:`run_reaper` runs.
    """

    def __init__(
        self, limits: httpx.Limits, ssl_context: ssl.SSLContext | None = None, api_key: str | None = None
    ) -> None:
        self._limits = limits
        # [worker_auth] (docs/operations.md §10.5): replaces any client credential on every request
        self._authorization = None if not api_key else f"Bearer {api_key}"
        self._ssl = ssl_context  # worker_tls: custom CA / client certificate (docs/operations.md §10)
        self._plain = H1Pool(limits.max_keepalive_connections, limits.keepalive_expiry)
        self._tls: ReapedTransport | None = None
        self._tls_made = trio.Event()

    @property
    def pool(self) -> H1Pool:
        """The plain-HTTP pool (its counters: ``stale_retries_count``, ``open_connections``)."""
        return self._plain

    @property
    def tls(self) -> ReapedTransport | None:
        """The TLS transport (its counters), once an ``https://`` worker was asked."""
        return self._tls

    async def run_reaper(self) -> None:
        """Close idle connections at their expiry, and those the worker closed at once: the
        plain-HTTP pool's (:meth:`H1Pool.run_reaper`) and, once it exists, the TLS transport's
        (:meth:`ReapedTransport.run_reaper`); run it in the nursery that owns the transport
        (docs/operations.md §11.2)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._plain.run_reaper)
            await self._tls_made.wait()
            assert self._tls is not None
            await self._tls.run_reaper()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._authorization is not None:
            request.headers["authorization"] = self._authorization
        elif request.url.userinfo and "authorization" not in request.headers:  # http://user:pass@worker
            request.headers["authorization"] = basic_authorization(request.url)
        scheme = request.url.scheme
        if scheme == "http":
            return await self._plain.request(request)
        if scheme != "https":
            raise httpx.UnsupportedProtocol(f"unsupported worker URL scheme {scheme!r}", request=request)
        if self._tls is None:
            verify: ssl.SSLContext | bool = True if self._ssl is None else self._ssl
            self._tls = ReapedTransport(limits=self._limits, verify=verify)
            self._tls_made.set()
        return await self._tls.handle_async_request(request)

    def lean_target(self, url: httpx.URL) -> LeanTarget | None:
        """Where :meth:`post` sends requests for ``url``; ``None`` when only
        :meth:`handle_async_request` can (TLS, credentials in the URL)."""
        if url.scheme != "http" or url.userinfo:
            return None
        return LeanTarget((url.host, url.port or 80), url.netloc, url.raw_path)

    async def post(
        self, target: LeanTarget, headers: list[tuple[str, str]], content: bytes, timeouts: dict[str, Any]
    ) -> LeanResponse | httpx.Response:
        """POST ``content`` to a plain-HTTP worker without ``httpx.Request``/``httpx.Response``
        objects (docs/benchmarks.md §10.2.4): the same bytes on the wire as
        :meth:`handle_async_request` sends for ``httpx.Request("POST", url, headers=headers,
        content=content)`` (tests/http/test_upstream_transport.py checks it), the same errors.
        A response with a ``content-encoding`` is returned as an ``httpx.Response`` (it decodes)."""
        fields = _post_fields(target.netloc, headers, len(content), self._authorization)
        payload = request_bytes(b"POST", target.raw_path, fields, content)
        _, status, _, raw, body = await self._plain.send(target.key, False, payload, timeouts)
        for name, value in raw:
            if name.lower() == b"content-encoding" and value.strip().lower() != b"identity":
                return httpx.Response(status_code=status, headers=raw, stream=body)
        return LeanResponse(status, raw, body)

    async def aclose(self) -> None:
        await self._plain.aclose()
        if self._tls is not None:
            await self._tls.aclose()


@attrs.frozen
class LeanTarget:
    """A plain-HTTP worker URL, parsed once: the pool's key, the ``Host`` value, the request target."""

    key: tuple[str, int]
    netloc: bytes
    raw_path: bytes


def _post_fields(
    netloc: bytes, headers: list[tuple[str, str]], length: int, authorization: str | None
) -> list[tuple[bytes, bytes]]:
    """The header fields ``httpx.Request("POST", ..., headers=headers, content=<length bytes>)``
    sends, then :class:`UpstreamTransport`'s ``authorization``: ``Host`` first and
    ``Content-Length`` last unless given (an empty body's ``Content-Length: 0`` right after
    ``Host``); a given ``authorization`` replaced in place (the first one; the others dropped),
    else appended.  Names and values as ASCII (httpx's encoding: a value that is not ASCII raises
    the same ``UnicodeEncodeError``)."""
    fields = [(name.encode("ascii"), value.encode("ascii")) for name, value in headers]
    lowered = [name.lower() for name, _ in fields]
    auto: list[tuple[bytes, bytes]] = []
    if b"host" not in lowered:
        auto.append((b"Host", netloc))
    if b"content-length" not in lowered:
        if length:
            fields.append((b"Content-Length", str(length).encode("ascii")))
        elif b"transfer-encoding" not in lowered:
            auto.append((b"Content-Length", b"0"))
    if auto:
        fields[:0] = auto
    if authorization is not None:
        value = authorization.encode("utf-8")
        found = [i for i, (name, _) in enumerate(fields) if name.lower() == b"authorization"]
        if found:
            fields[found[0]] = (b"authorization", value)
            for i in reversed(found[1:]):
                del fields[i]
        else:
            fields.append((b"authorization", value))
    return fields
