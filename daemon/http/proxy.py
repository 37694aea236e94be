"""The proxy engine: dispatch, forward, relay, report - independent of Quart and of sockets.

:class:`ProxyEngine` holds everything one request needs (httpx client, dispatchers, metrics) and
exposes two steps:

* :meth:`ProxyEngine.build_request` - raw body + headers -> validated
  :class:`~daemon.dispatch.ProxyRequest` with a unique request id (:mod:`daemon.request_ids`),
  the client's hints clamped to ``[client_hints]`` and its model pool (:mod:`daemon.models`);
  raises :class:`~daemon.http.errors.ApiError` (4xx for bad input, a 500 naming the request id
  for a bug);
* :meth:`ProxyEngine.handle` - lease a target, forward, relay the response into a
  :class:`ResponseSink`, ``lease.finish(Outcome)`` exactly once when the response ended; an
  unexpected exception is logged once and answered with a JSON 500 (docs/operations.md §12).

The HTTP server drives it through :func:`serve_proxy_asgi` (a raw ASGI handler mounted in front of
the Quart app, see :mod:`daemon.http.app`); ``agentd simulate`` calls ``handle`` directly with a
:class:`CollectingSink` under MockClock.  Both share this one code path.

Forwarding rules: POST to ``worker_url + path`` with ``X-data-parallel-rank: <rank>``; the body
bytes are forwarded unchanged unless ``vllm_xargs.agentic_context`` must be rewritten
(``routing.agentic_context_forwarding``) or usage must be injected (the lease ``wants_usage``, the
client streams without ``stream_options.include_usage``: agentd sets it and drops the extra
usage-only chunk) or vLLM's ``priority`` must be set (a worker in priority mode) or stripped (any
other worker; docs/priority.md §5.4).  Streams are relayed as they arrive, no buffering: whatever one socket read
brought from a worker (``UpstreamBody.pump`` of :mod:`daemon.h1client`; ``aiter_raw`` for other
transports) leaves in one write; completion is the end of the upstream stream.  Worker 5xx ->
502 (503 stays 503) naming the target; worker 4xx keep their status, and a body that is not an
OpenAI error object is wrapped into one; unreachable -> 502;
timeout -> 504.  Cancellation (client disconnect) propagates: the upstream request is closed and
the lease is left without ``finish`` (abandoned).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs
import httpx
import trio

from actors.core.batchjobs import DEFAULT_JOB, job_name
from actors.core.config import BackendTarget
from actors.fairness_metrics import FairnessBook
from actors.logevents import get_logger, log_event
from daemon.auth import scope_id, scope_identity
from daemon.batchfile import BATCH_CLASS, BATCH_CLASS_HEADER
from daemon.config import ClientHintsConfig, PrioritySection, TenantsConfig
from daemon.dispatch import Dispatcher, DispatchRejected, Lease, Outcome, ProxyRequest, RequeueableLease, Requeued
from daemon.h1client import LeanResponse, SyncWriter, UpstreamBody
from daemon.http.errors import SSE_DONE, ApiError, error_body, sse_error_tail, wrap_worker_error
from daemon.http.identity import IdentityError, ParsedIdentity, parse_identity, strip_agentic_context
from daemon.http.priority import (
    CONTEXT_PRIORITY,
    UNSHOWABLE,
    PriorityInfo,
    batch_job_for,
    engine_priority,
    resolve,
)
from daemon.http.queue_eta import max_queue_bound
from daemon.http.rawbody import DELETE, MIN_LAYOUT_BYTES, edit_last_member
from daemon.http.requests import (
    ENDPOINTS,
    FORWARDED_KINDS,
    MAX_ID_HEADER_BYTES,
    check_headers,
    parse_json_body_layout,
    request_texts,
    validate_body,
)
from daemon.metrics import NO_TARGET, ProxyMetrics
from daemon.models import ModelDirectory
from daemon.request_ids import RequestIds, upstream_request_id
from daemon.upstream import (
    LeanTarget,
    UpstreamError,
    UpstreamRankRefused,
    UpstreamTimeout,
    UpstreamTimeouts,
    UpstreamTransport,
    UsageAccumulator,
    UsageChunkFilter,
    client_headers,
    map_httpx_error,
    upstream_headers,
    usage_of_body,
)

logger = get_logger("proxy")
JOB_TAG_MARK = "#job_name["
PATHS: dict[str, str] = {endpoint: path for path, endpoint in ENDPOINTS.items()}
# vLLM's 400 when a request carries a non-zero priority and the engine runs fcfs (lower-cased)
PRIORITY_REJECTION = "priority scheduling is not enabled"
# vLLM's 400 for a DP rank the worker does not run ("data_parallel_rank 3 is out of range [0, 2).")
RANK_REJECTION = re.compile(r"data_parallel_rank -?\d+ is out of range[^\"]*")
RANK_REJECTION_BYTES = 4096  # a 400 body longer than this is not that refusal (read no further)
ERROR_SNIPPET_BYTES = 512
JSON_HEADERS: list[tuple[str, str]] = [("content-type", "application/json")]
# a worker's response: httpx's, or agentd's client's lean one (daemon/h1client.py LeanResponse)
WorkerResponse = httpx.Response | LeanResponse


@attrs.frozen(eq=False)
class ProgramRoute:
    """Program scheduling as the proxy sees it: which key enables it, and its dispatcher; with
    ``[batch_jobs]`` enabled, the dispatcher of batch-class requests (docs/batch.md §2)."""

    enable_key: str
    dispatcher: Dispatcher
    batch: BatchServer | None = None
    # identity-free interactive requests through the scheduler (docs/priority.md §5.5)
    interactive: Dispatcher | None = None


class BatchServer(Protocol):
    """Serves a batch-class request: ``forward(lease)`` runs once per admission (a preempted
    attempt is cancelled before anything reached the client, docs/batch.md §2)."""

    async def serve(self, req: ProxyRequest, forward: Callable[[Any], Awaitable[object]]) -> None: ...


# "agent" names the class of requests with Program identity; on a request without identity it
# means nothing more than "not batch" (docs/priority.md §5.2)
REQUEST_CLASSES = (BATCH_CLASS, "interactive", "agent")


def batch_job_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The job name of a batch-class request, None for any other (docs/batch.md §2).

    Batch class: the ``X-Agentd-Class: batch`` header, or a ``#job_name[...]#`` tag in the request
    id (body ``request_id``, else the ``X-Request-Id`` header); ``X-Agentd-Class: interactive``
    opts a tagged request out.  The job is the tag's name, ``__default__`` without one.
    """
    rid = body.get("request_id")
    if rid is not None and not isinstance(rid, str):
        raise ApiError(
            400,
            f"request_id: must be a string (got {type(rid).__name__})",
            code="invalid_request_id",
            param="request_id",
        )
    ids = [x for x in (rid, headers.get("x-request-id")) if x]
    tagged = next((x for x in ids if JOB_TAG_MARK in x and job_name(x) != DEFAULT_JOB), None)
    cls = headers.get(BATCH_CLASS_HEADER)
    if cls is not None:
        cls = cls.strip().lower()
        if cls not in REQUEST_CLASSES:
            raise ApiError(
                400,
                f"{BATCH_CLASS_HEADER}: must be one of {', '.join(REQUEST_CLASSES)} (got {cls[:64]!r})",
                code="invalid_request_class",
                param=BATCH_CLASS_HEADER,
            )
    if cls == BATCH_CLASS or (cls is None and tagged is not None):
        name = job_name(tagged)
        if name != DEFAULT_JOB:
            check_job_name(name, "request_id" if tagged is rid else "x-request-id")
        return name
    return None


MAX_JOB_NAME_BYTES = 256


def scope_job(job: str | None, principal: str | None) -> str | None:
    """A named job scoped ``<tenant>/<name>`` by the API key's tenant, as Program ids are
    (docs/operations.md §10.1): two tenants' jobs of one name are two jobs, so one tenant's
    requests never join, and never move the decode-length estimate of, another tenant's job.
    Untagged batch work stays in the one ``__default__`` job; without keys nothing changes."""
    if job is None or principal is None or job == DEFAULT_JOB:
        return job
    return scope_id(principal, job)


def check_job_name(name: str, param: str) -> None:
    """400 ``invalid_request_id`` naming ``param`` for a job name agentd would not show: over 256
    UTF-8 bytes or with control or bidirectional-override characters.  The name is a ``/metrics``
    label, a log field and a key the scheduler keeps (docs/batch.md §2.1); before session 44 a body
    ``request_id`` could tag a job of 16 MB, written whole into a log line per job and kept in the
    job table."""
    if UNSHOWABLE.search(name) is not None:
        raise ApiError(
            400,
            f"{param}: the #job_name[...]# tag holds control or bidirectional-override characters",
            code="invalid_request_id",
            param=param,
        )
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_JOB_NAME_BYTES:
        raise ApiError(
            400,
            f"{param}: the #job_name[...]# tag names a job of {size} bytes, more than {MAX_JOB_NAME_BYTES}",
            code="invalid_request_id",
            param=param,
        )


def parse_program_identity(
    body: dict[str, Any], headers: Mapping[str, str], enable_key: str, caps: ClientHintsConfig | None = None
) -> ParsedIdentity | None:
    """Program identity of a request (None = identity-free); bad metadata is a 400 naming the field.
    With ``caps`` the client's scheduling hints are clamped to the operator's bounds."""
    try:
        parsed = parse_identity(body, headers, enable_key)
    except IdentityError as exc:
        # agentic_context.priority is a priority first: the same code with or without Program
        # scheduling (docs/priority.md §5.1)
        code = "invalid_priority" if exc.param == CONTEXT_PRIORITY else "invalid_program_identity"
        raise ApiError(400, str(exc), code=code, param=exc.param) from exc
    return parsed if parsed is None or caps is None else cap_hints(parsed, caps)


def cap_hints(parsed: ParsedIdentity, caps: ClientHintsConfig) -> ParsedIdentity:
    """``deadline_seconds`` raised to ``min_deadline_seconds``, ``kv_retention_ttl_seconds`` lowered
    to ``max_kv_retention_ttl_seconds`` (docs/config.md ``[client_hints]``)."""
    hints = parsed.hints
    deadline, ttl = hints.deadline_seconds, hints.kv_retention_ttl_seconds
    capped_deadline = None if deadline is None else max(deadline, caps.min_deadline_seconds)
    capped_ttl = None if ttl is None else min(ttl, caps.max_kv_retention_ttl_seconds)
    if capped_deadline == deadline and capped_ttl == ttl:
        return parsed
    return attrs.evolve(
        parsed, hints=attrs.evolve(hints, deadline_seconds=capped_deadline, kv_retention_ttl_seconds=capped_ttl)
    )


def parse_request(
    request_id: str,
    endpoint: str,
    raw: bytes,
    headers: Mapping[str, str],
    enable_key: str | None,
    *,
    principal: str | None = None,
    hint_caps: ClientHintsConfig | None = None,
) -> ProxyRequest:
    """Raw body and headers -> a validated :class:`ProxyRequest`; Program identity is read only
    when Program scheduling is on (``enable_key``).  Every bad input raises :class:`ApiError` (4xx)."""
    return ProxyRequest(
        **request_fields(request_id, endpoint, raw, headers, enable_key, principal=principal, hint_caps=hint_caps)
    )


def request_fields(
    request_id: str,
    endpoint: str,
    raw: bytes,
    headers: Mapping[str, str],
    enable_key: str | None,
    *,
    principal: str | None = None,
    hint_caps: ClientHintsConfig | None = None,
) -> dict[str, Any]:
    """:func:`parse_request`'s fields, before the :class:`ProxyRequest` is built (the proxy adds
    its pool, queue bound and class first: one object per request, docs/benchmarks.md §10.2.4)."""
    check_headers(headers)
    body, layout = parse_json_body_layout(raw)
    validate_body(endpoint, body)
    if endpoint in FORWARDED_KINDS:  # no identity, class or job: forwarded as is (docs/operations.md §12.1)
        identity, batch_job = None, None
    else:
        identity = None if enable_key is None else parse_program_identity(body, headers, enable_key, hint_caps)
        identity = scope_identity(identity, principal)  # per-tenant Program ids (docs/operations.md §10)
        batch_job = scope_job(batch_job_of(body, headers), principal)  # per-tenant jobs (docs/batch.md §2.1)
    return {
        "request_id": request_id,
        "endpoint": endpoint,
        "body": body,
        "headers": headers,
        "model": body.get("model"),
        "stream": body.get("stream") is True,
        # worked out when a dispatcher first reads them (docs/benchmarks.md §10.2.8)
        "texts": functools.partial(request_texts, endpoint, body),
        "identity": identity,
        "batch_job": batch_job,
        "principal": principal,
        "client_request_id": client_request_id(body, headers),
        "layout": layout,
    }


def client_request_id(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The client's own request id: the ``X-Request-Id`` header, else the body's ``request_id`` when
    it can travel in a header (visible ASCII, bounded); None without one."""
    header = headers.get("x-request-id")
    if header:
        return header
    rid = body.get("request_id")
    return rid if isinstance(rid, str) and can_travel(rid) else None


def can_travel(rid: str) -> bool:
    """A request id that can go in a header: non-empty, bounded, visible ASCII."""
    return bool(rid) and len(rid) <= MAX_ID_HEADER_BYTES and all(" " <= ch <= "~" for ch in rid)


def with_request_id(headers: list[tuple[str, str]], request_id: str) -> list[tuple[str, str]]:
    """``headers`` with one ``x-request-id``, ``request_id`` (docs/operations.md §12)."""
    head = [h for h in headers if h[0] != "x-request-id"]
    head.append(("x-request-id", request_id))
    return head


class ClientGone(Exception):
    """The client went away while the response was being written."""


class OutcomeReports(Protocol):
    """Where the proxy reports each exchange's outcome per worker (the health board: passive
    outlier ejection, docs/operations.md §11)."""

    @property
    def worker_urls(self) -> tuple[str, ...]: ...
    @property
    def targets(self) -> tuple[BackendTarget, ...]: ...
    def report_success(self, url: str) -> None: ...
    def report_failure(self, url: str, detail: str, *, eject_now: bool = False, suspect: bool = False) -> bool: ...
    def report_rank_refused(self, target: BackendTarget, detail: str) -> bool: ...


class NotSent(Exception):
    """The request provably never reached the worker (the connection could not be opened), or
    never ran on it (the worker refused its DP rank: ``worker_ok``, the worker's other ranks may
    take it): it may be sent elsewhere (failover, docs/operations.md §11, §11.3)."""

    def __init__(self, error: UpstreamError, worker_url: str, *, worker_ok: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.worker_url = worker_url
        self.worker_ok = worker_ok


@attrs.define(eq=False)
class _Exchange:
    """What one forward has done so far (the total-timeout handler needs it)."""

    lease: Lease
    sink: ResponseSink
    finished: bool = False  # lease.finish ran
    started: bool = False  # the response head went to the client
    ended: bool = False  # the response is complete

    def finish(self, outcome: Outcome) -> None:
        self.finished = True
        self.lease.finish(outcome)

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.started = True
        await self.sink.start(status, headers)

    async def send(self, chunk: bytes) -> None:
        await self.sink.send(chunk)

    async def end(self, chunk: bytes = b"") -> None:
        self.ended = True
        await self.sink.end(chunk)


_NO_SCOPE = contextlib.nullcontext()  # in place of a cancel scope that could never fire
_UNKNOWN = object()


def _json_error_as_event(body: bytes) -> bytes:
    """A later forward's JSON error answer (an OpenAI error body) as the stream's error event."""
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return b"data: " + body.strip() + b"\n\n" + SSE_DONE
    return sse_error_tail(payload)


def stream_error_tail(message: str, code: str) -> bytes:
    """The end of a stream that failed after it started: an OpenAI-shaped error event, then
    ``[DONE]`` so every SSE client stops reading (docs/operations.md §11)."""
    return sse_error_tail(json.loads(error_body(message, "upstream_error", None, code)))


def internal_error(request_id: str) -> ApiError:
    return ApiError(
        500,
        f"internal error in agentd (request id {request_id}; see the daemon log)",
        code="internal_error",
        headers=(("x-request-id", request_id),),
    )


def log_internal_error(request_id: str, message: str, exc: BaseException, **fields: Any) -> None:
    """One ERROR line with the traceback, ``event=internal_error`` and the request id."""
    logger.error(
        message,
        exc_info=exc,
        extra={"agentd_event": "internal_error", "agentd_fields": {"request_id": request_id, **fields}},
    )


class _StartTracker:
    """A :class:`ResponseSink` wrapper that remembers whether the response started and ended
    (``send`` is the wrapped sink's own method: no cost per relayed chunk), and puts the request's
    ``x-request-id`` on the response head: the client's own id when it sent one, else agentd's
    (docs/operations.md §12), in place of any the worker or an error set."""

    def __init__(self, sink: ResponseSink, request_id: str) -> None:
        self._sink = sink
        self.send = sink.send
        self.started = False
        self.ended = False
        self._request_id = request_id

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.started = True
        await self._sink.start(status, with_request_id(headers, self._request_id))

    async def end(self, chunk: bytes = b"") -> None:
        self.ended = True
        await self._sink.end(chunk)

    @property
    def cancel_safe_send(self) -> bool:
        return bool(getattr(self._sink, "cancel_safe_send", False))

    @property
    def sync_writer(self) -> SyncWriter | None:
        return getattr(self._sink, "sync_writer", None)


class ResponseSink(Protocol):
    async def start(self, status: int, headers: list[tuple[str, str]]) -> None: ...
    async def send(self, chunk: bytes) -> None: ...
    async def end(self, chunk: bytes = b"") -> None: ...  # final chunk (may be empty)


def _is_event_stream(status: int, headers: list[tuple[str, str]]) -> bool:
    return 200 <= status < 300 and any(
        k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in headers
    )


class RequeueSink:
    """The client's sink for a request the scheduler may take back before its answer starts
    (docs/priority.md §3, "Re-queueing a blocking long prefill"); one per request, across its
    forwards.

    An event stream's head (status and headers, no body byte) goes to the client with the first
    forward, as for any stream; nothing after it is *committed* until the first body byte.  Once
    the scheduler took the request back (``taken_back()``, read at every uncommitted write: the
    take-back and the first write exclude each other, as both run without a checkpoint between
    their check and their effect) nothing more is written: the next write raises
    :class:`Requeued`, which ends the forward.  A later forward's head is not sent again
    (the client has it); an error answer of a later forward (a JSON head) becomes an SSE error
    event and ``[DONE]`` in the stream already started.  A non-stream head commits at once (it
    carries its body's length).  No direct body writer: the one extra check per write is only
    paid by these requests (long prefills)."""

    def __init__(self, sink: ResponseSink, taken_back: Callable[[], bool]) -> None:
        self._sink = sink
        self._taken_back = taken_back  # the forward running now was taken back
        self.head_sent = False
        self.committed = False  # a byte of the answer (beyond an event stream's head) went out
        self._as_event = False  # this forward answers an error into the started event stream

    def is_committed(self) -> bool:
        return self.committed

    def next_forward(self) -> None:
        self._as_event = False

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        if self._taken_back():
            raise Requeued("taken back before its answer started")
        sse = _is_event_stream(status, headers)
        if self.head_sent:
            # the client has the stream's head already: a later forward's event-stream head is
            # not sent again and commits nothing (it can still be taken back, docs/priority.md §3)
            self._as_event = not sse
            self.committed = not sse
            return
        self.head_sent = True
        self.committed = not sse
        await self._sink.start(status, headers)

    async def send(self, chunk: bytes) -> None:
        if not self.committed:
            if self._taken_back():
                raise Requeued("taken back before its answer started")
            self.committed = True
        await self._sink.send(chunk)

    async def end(self, chunk: bytes = b"") -> None:
        if not self.committed and self._taken_back():
            raise Requeued("taken back before its answer started")
        self.committed = True
        if self._as_event:
            chunk = _json_error_as_event(chunk)
        await self._sink.end(chunk)


@attrs.define(eq=False)
class CollectingSink:
    """Collects a whole response in memory (``agentd simulate``, tests)."""

    status: int | None = None
    headers: list[tuple[str, str]] = attrs.field(factory=list)
    chunks: list[bytes] = attrs.field(factory=list)
    ended: bool = False

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.status, self.headers = status, headers

    async def send(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    async def end(self, chunk: bytes = b"") -> None:
        if chunk:
            self.chunks.append(chunk)
        self.ended = True

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


async def send_error(sink: ResponseSink, error: ApiError, request_id: str | None = None) -> None:
    """The error's JSON answer; ``request_id``: an ``x-request-id`` to put on it (docs/operations.md
    §12), in place of one the error carries."""
    body = error.body()
    headers = [*JSON_HEADERS, ("content-length", str(len(body))), *error.headers]
    if request_id is not None:
        headers = with_request_id(headers, request_id)
    await sink.start(error.status, headers)
    await sink.end(body)


def _truthy_include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


class ProxyEngine:
    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        native: Dispatcher,
        metrics: ProxyMetrics,
        agentic_context_forwarding: str,
        workers_force_include_usage: bool = False,
        program: ProgramRoute | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: httpx.Timeout | None = None,
        timeouts: UpstreamTimeouts | None = None,
        outcomes: OutcomeReports | None = None,
        ids: RequestIds | None = None,
        hint_caps: ClientHintsConfig | None = None,
        models: ModelDirectory | None = None,
        priority: PrioritySection | None = None,
        tenants: TenantsConfig | None = None,
        priority_workers: frozenset[str] = frozenset(),
        detect_workers: frozenset[str] = frozenset(),
        unpinned_workers: frozenset[str] = frozenset(),
        fairness: FairnessBook | None = None,
        stream_coalesce_seconds: float = 0.0,
        retry_after_seconds: int = 1,
    ) -> None:
        self.client = client
        # the Retry-After of a refusal that carries none of its own ([limits] retry_after_seconds)
        self.retry_after_seconds = retry_after_seconds
        # hold a stream's writes up to this long (docs/operations.md §13.5)
        self.stream_coalesce_seconds = stream_coalesce_seconds
        self.transport = transport
        if timeouts is None:
            given = timeout or httpx.Timeout(600.0)
            total = given.read if given.read is not None else 600.0
            connect = given.connect if given.connect is not None else total
            timeouts = UpstreamTimeouts(connect=connect, first_byte=total, idle=total, total=total)
        self.timeouts = timeouts
        self._stream_timeouts = timeouts.for_request(True)
        # a complete response's head: the exchange's total-timeout scope (_forward) bounds the wait
        # and always ends first (same length, started earlier), so the client opens no scope of its
        # own for it (docs/benchmarks.md §10.2.4)
        self._plain_timeouts = {**timeouts.for_request(False), "first_byte": math.inf}
        self.outcomes = outcomes
        self._max_failovers = 0 if outcomes is None else max(0, len(outcomes.worker_urls) - 1)
        # one per DP target: each refusal takes a rank out, so the last one left is tried too
        self._max_rank_failovers = 0 if outcomes is None else max(0, len(outcomes.targets) - 1)
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        self._lean: dict[tuple[str, str], object] = {}  # (worker, path) -> LeanTarget | None
        self.native = native
        self.program = program
        self.metrics = metrics
        self.forwarding_mode = agentic_context_forwarding
        # the workers send every stream's usage themselves (vLLM --enable-force-include-usage):
        # nothing to inject, nothing to filter (docs/operations.md §12)
        self.workers_force_usage = workers_force_include_usage
        self.ids = ids or RequestIds()
        self.hint_caps = hint_caps or ClientHintsConfig()
        self.models = models
        self.priority = priority if priority is not None else PrioritySection()
        self.tenants = tenants if tenants is not None else TenantsConfig()
        # workers running vLLM --scheduling-policy priority: they receive `priority`, the others
        # never see it (docs/priority.md §5.4)
        self.priority_workers = priority_workers
        # workers of policy "auto": priority_workers until one rejects the field (then stock)
        self.detect_workers = detect_workers
        # workers with one DP target: sent no x-data-parallel-rank (docs/operations.md §13.10)
        self.unpinned_workers = unpinned_workers
        self.bands = self.priority.class_order
        self.fairness = fairness  # per-class, per-tenant figures (docs/priority.md §5.6)

    def build_request(
        self,
        endpoint: str,
        raw: bytes,
        headers: Mapping[str, str],
        *,
        principal: str | None = None,
        origin: str = "http",
    ) -> ProxyRequest:
        """``principal``: the tenant of the authenticated API key (daemon/auth.py), if any;
        ``origin``: ``http`` or ``batch_api`` (a Batch API line), matched by priority rules.

        Bad input raises a 4xx :class:`ApiError`; an unexpected exception (a bug) is logged once
        with the request id and raised as a 500 ``internal_error`` :class:`ApiError` naming it."""
        enable_key = None if self.program is None else self.program.enable_key
        request_id = self.ids.new()
        try:
            fields = request_fields(
                request_id, endpoint, raw, headers, enable_key, principal=principal, hint_caps=self.hint_caps
            )
            if self.models is not None:
                pool, eligible = self.models.route(fields["model"])  # 404 model_not_found
                if eligible is not None:
                    fields["model_pool"], fields["pool_targets"] = pool, eligible
            bound = max_queue_bound(headers)  # 400 naming x-agentd-max-queue-seconds
            if bound is not None:
                fields["max_queue_seconds"] = bound
            fields["prio"], fields["batch_job"] = self._class_of(
                fields["body"], headers, fields["identity"] is not None, fields["batch_job"], principal, origin
            )
            return ProxyRequest(**fields)
        except ApiError:
            raise
        except Exception as exc:
            log_internal_error(request_id, "request parsing failed", exc, endpoint=endpoint)
            raise internal_error(request_id) from exc

    def classify(self, req: ProxyRequest, origin: str = "http") -> ProxyRequest:
        """The request with its class, priority and tenant after the operator's rules
        (daemon/http/priority.py, docs/priority.md §5)."""
        prio, batch_job = self._class_of(
            req.body, req.headers, req.identity is not None, req.batch_job, req.principal, origin
        )
        return attrs.evolve(req, prio=prio, batch_job=batch_job)

    def _class_of(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        has_identity: bool,
        batch_job: str | None,
        principal: str | None,
        origin: str,
    ) -> tuple[PriorityInfo, str | None]:
        info = resolve(
            body=body,
            headers=headers,
            has_identity=has_identity,
            batch=batch_job is not None,
            principal=principal,
            origin=origin,
            priority=self.priority,
            tenants=self.tenants,
            bands=self.bands,
        )
        return info, batch_job_for(info, batch_job)

    async def handle(self, req: ProxyRequest, sink: ResponseSink, *, raw_body: bytes | None = None) -> None:
        """Serve one request end to end; every expected failure becomes an error response.

        An unexpected exception (a bug) is logged once with the request id and answered with a JSON
        500 ``internal_error`` (or, when the response already started, an SSE error event and the
        end of the response); the lease is left unfinished, so its capacity is released as
        abandoned.  ``ClientGone`` and cancellation propagate."""
        tracked = _StartTracker(sink, req.client_request_id or req.request_id)
        try:
            await self._handle(req, tracked, raw_body)
        except ClientGone:
            raise
        except Exception as exc:
            log_internal_error(req.request_id, "proxy handler failed", exc, endpoint=req.endpoint)
            if tracked.ended:
                return
            error = internal_error(req.request_id)
            if not tracked.started:
                await send_error(tracked, error)
            elif req.stream:
                await sink.end(sse_error_tail(json.loads(error.body())))
            else:
                await sink.end()

    async def _handle(self, req: ProxyRequest, sink: ResponseSink, raw_body: bytes | None) -> None:
        dispatcher = self.native
        batch: BatchServer | None = None
        # forwarded routes go native (docs/operations.md §12.1)
        if self.program is not None and req.endpoint not in FORWARDED_KINDS:
            if req.identity is not None:
                dispatcher = self.program.dispatcher
            elif req.batch_job is not None:
                batch = self.program.batch
            elif self.program.interactive is not None:
                dispatcher = self.program.interactive  # docs/priority.md §5.5
        track = None if self.fairness is None else self.fairness.arrive(req.prio.request_class, req.prio.tenant)
        leased: list[Lease] = []
        refused_ranks = 0  # failovers after a worker refused the DP rank (each takes a rank out)

        async def forward(lease: Lease, *, failover: bool = False, into: ResponseSink | None = None) -> None:
            if track is not None:
                track.admitted()
            leased.append(lease)
            # bounded by the number of targets alone: a refusal never counts as a failover to
            # another worker, so ``failover`` may stay true while every rank refuses
            rank_failover = batch is None and refused_ranks < self._max_rank_failovers
            await self._forward(
                req, lease, sink if into is None else into, raw_body, failover=failover, rank_failover=rank_failover
            )

        try:
            if batch is not None:
                await batch.serve(req, forward)
                return
            original_id = req.request_id
            failovers = 0
            while True:
                try:
                    async with dispatcher.lease(req) as lease:
                        if getattr(lease, "requeueable", False) and isinstance(lease, RequeueableLease):
                            await self._forward_requeueable(
                                req, lease, sink, raw_body, forward, failover=failovers < self._max_failovers
                            )
                        else:
                            await forward(lease, failover=failovers < self._max_failovers)
                    return
                except NotSent as not_sent:
                    # the lease was left unfinished (abandoned: nothing was consumed) and the worker
                    # ejected or suspect, so the next lease cannot land there (a suspect still can
                    # when every worker left is one: the request then avoids the ones it tried,
                    # docs/operations.md §11.3); a Program request is submitted again under a
                    # derived id with those workers, which the core's placement avoids too
                    # (docs/program-scheduling.md §9.1)
                    if not_sent.worker_ok:  # a refused DP rank: out of rotation now, not its worker
                        refused_ranks += 1
                    else:
                        failovers += 1
                        req = attrs.evolve(req, avoid_workers=req.avoid_workers | {not_sent.worker_url})
                    self.metrics.failovers.labels(not_sent.error.target_id).inc()
                    log_event(
                        logger,
                        logging.WARNING,
                        "upstream_failover",
                        request_id=original_id,
                        target=not_sent.error.target_id,
                        attempt=failovers + refused_ranks,
                        detail=not_sent.error.detail,
                    )
                    if dispatcher is not self.native:
                        req = attrs.evolve(req, request_id=f"{original_id}.failover{failovers + refused_ranks}")
        except DispatchRejected as rejected:
            if track is not None:
                track.end("rejected")
                track = None
            rejection = rejected.rejection
            self.metrics.rejected.labels(rejection.reason).inc()
            self.metrics.count_request(req.endpoint, NO_TARGET, "rejected")
            log_event(
                logger,
                logging.INFO,
                "proxy_rejected",
                request_id=req.request_id,
                status=rejection.status_hint,
                code=rejection.reason,
                reason=rejection.message,
            )
            await send_error(sink, ApiError.from_rejection(rejection, self.retry_after_seconds))
        finally:
            if track is not None:
                outcome = getattr(leased[-1], "outcome", None) if leased else None
                track.end(
                    "abandoned" if outcome is None else "completed" if outcome.success else "failed",
                    None if outcome is None else outcome.usage,
                )

    async def _forward_requeueable(
        self,
        req: ProxyRequest,
        lease: RequeueableLease,
        sink: ResponseSink,
        raw_body: bytes | None,
        forward: Callable[..., Awaitable[None]],
        *,
        failover: bool,
    ) -> None:
        """Forward a long prefill the scheduler may take back before its first token
        (docs/priority.md §3, "Re-queueing a blocking long prefill"): each forward runs in a scope
        the scheduler cancels (``ProgramDispatcher.requeue``) while nothing of the answer reached
        the client; the upstream request is then closed (the engine aborts it and keeps the prefix
        it computed in its cache), the request waits for its next admission and is forwarded
        again into the same client response.  The client sees one answer.  The first forward fails
        over like any other (nothing was sent when the worker could not be reached); a later one's
        connection failure is answered in the stream."""
        guard = RequeueSink(sink, lambda: lease.requeue_requested)
        first = True
        while True:
            scope = lease.attempt_scope(guard.is_committed)
            try:
                with scope:
                    if first:
                        await forward(lease, failover=failover, into=guard)
                    else:
                        await self._forward(req, lease, guard, raw_body)
            except Requeued:
                pass
            finally:
                lease.attempt_done()
            if not lease.requeue_requested:
                return
            first = False
            self.metrics.requeued.labels(lease.target.target_id).inc()
            log_event(
                logger,
                logging.INFO,
                "proxy_requeued",
                request_id=req.request_id,
                target=lease.target.target_id,
                attempt=lease.attempt,
                head_sent=guard.head_sent,
            )
            try:
                await lease.readmit()
            except DispatchRejected as rejected:
                if not guard.head_sent:
                    raise
                rejection = rejected.rejection
                self.metrics.rejected.labels(rejection.reason).inc()
                guard.next_forward()
                await guard.end(stream_error_tail(rejection.message, rejection.reason))
                return
            guard.next_forward()

    def _outgoing_body(self, req: ProxyRequest, lease: Lease, raw_body: bytes | None) -> tuple[bytes, bool]:
        """The body for the worker, and whether usage is injected into a stream.

        The edits touch top-level members only (``vllm_xargs``, ``priority``, ``stream_options``):
        with the body's layout they splice the client's bytes (daemon/http/rawbody.py), else the
        decoded body is re-encoded; each rewrite is counted by method (docs/operations.md §13)."""
        if req.endpoint in FORWARDED_KINDS:  # forwarded routes: the client's bytes (docs/operations.md §12.1)
            return (raw_body if raw_body is not None else json.dumps(req.body).encode()), False
        body = req.body
        changes: dict[str, Any] = {}
        xargs = body.get("vllm_xargs")
        if self.forwarding_mode != "unchanged" and isinstance(xargs, dict) and "agentic_context" in xargs:
            stripped = strip_agentic_context(body, self.forwarding_mode)
            if stripped.get("vllm_xargs") is not xargs:  # (json_string keeps a string or null context)
                body = stripped
                changes["vllm_xargs"] = body.get("vllm_xargs", DELETE)
        if lease.target.worker_url in self.priority_workers:
            wanted = engine_priority(req.prio, self.priority.max_abs_priority, self.bands)
            if body.get("priority", 0) != wanted:
                body = {**body, "priority": wanted}
                changes["priority"] = wanted
        elif "priority" in body:  # a stock worker never sees the field (vLLM answers 400 or ignores it)
            body = {k: v for k, v in body.items() if k != "priority"}
            changes["priority"] = DELETE
        inject = (
            req.stream
            and not self.workers_force_usage
            and lease.wants_usage
            and req.endpoint in ("chat", "completions")
            and not _truthy_include_usage(body)
        )
        if inject:
            given = body.get("stream_options")
            options: dict[str, Any] = given if isinstance(given, dict) else {}
            options = {**options, "include_usage": True}
            if options.get("continuous_usage_stats"):
                # vLLM adds usage to every chunk only with include_usage: the client, which did not
                # ask for usage, must not get it on every chunk now (the filter drops the last one)
                options["continuous_usage_stats"] = False
            body = {**body, "stream_options": options}
            changes["stream_options"] = options
        if raw_body is not None and not changes:
            return raw_body, inject
        if raw_body is not None:
            if req.layout is not None:
                edited = req.layout.rebuild(changes)
                if edited is not None:
                    self.metrics.count_rewrite("raw")
                    return edited, inject
            # no layout for a small body (re-encoding it is cheaper), else the raw edit was impossible
            small = req.layout is None and len(raw_body) < MIN_LAYOUT_BYTES
            if small and len(changes) == 1:
                # one member edited, the body's last (an agent's vllm_xargs): spliced without a
                # layout (docs/benchmarks.md §10.2.7)
                ((key, value),) = changes.items()
                edited = edit_last_member(raw_body, req.body, key, value)
                if edited is not None:
                    self.metrics.count_rewrite("raw")
                    return edited, inject
            self.metrics.count_rewrite("reencode_small" if small else "reencode_fallback")
        return json.dumps(body).encode(), inject

    async def _forward(
        self,
        req: ProxyRequest,
        lease: Lease,
        sink: ResponseSink,
        raw_body: bytes | None,
        *,
        failover: bool = False,
        rank_failover: bool = False,
    ) -> None:
        """Send to the lease's target and relay the answer; ``failover``: a request that could not
        be sent raises :class:`NotSent` instead of answering the client; ``rank_failover``: so does
        one whose DP rank the worker refused (the rank leaves rotation either way)."""
        target = lease.target
        tm = self.metrics.for_target(target.target_id)
        content, inject = self._outgoing_body(req, lease, raw_body)
        started = trio.current_time()
        outcome_label = "client_disconnect"
        exchange = _Exchange(lease, sink)
        tm.in_flight.inc()
        try:
            with trio.move_on_at(started + self.timeouts.total) as total_scope:
                try:
                    first_byte = self.timeouts.first_byte if req.stream else math.inf
                    # any transport; daemon.h1client checks it too.  No scope when unbounded (a
                    # complete response: the total timeout bounds it), docs/benchmarks.md §10.2
                    head = None if first_byte == math.inf else trio.CancelScope(deadline=started + first_byte)
                    with head if head is not None else _NO_SCOPE:
                        response = await self._send(
                            target.worker_url,
                            PATHS[req.endpoint],
                            _worker_headers(req, lease, self.unpinned_workers),
                            content,
                            req.stream,
                        )
                        if response.status_code == 400 and self._probing(req, lease):
                            response, inject = await self._priority_rejected(req, lease, raw_body, response, inject)
                        if response.status_code == 400 and self._pinned(target):
                            refusal = await self._rank_refusal(response, target)
                            if refusal is not None and rank_failover:
                                outcome_label = "failover"
                                with trio.CancelScope(shield=True):
                                    await response.aclose()
                                raise NotSent(refusal, target.worker_url, worker_ok=True)
                    if head is not None and head.cancelled_caught:
                        raise httpx.ReadTimeout(
                            f"no response from the worker within {first_byte:g} s (first-byte timeout)"
                        )
                except httpx.HTTPError as exc:
                    error = map_httpx_error(target.target_id, exc)
                    # nothing was sent: refused or unresolvable ejects the worker at once, a
                    # connect timeout makes it suspect (docs/operations.md §11.3)
                    timed_out = isinstance(exc, httpx.ConnectTimeout)
                    not_sent = timed_out or isinstance(exc, httpx.ConnectError)
                    self._report_failure(
                        target.worker_url, error, eject_now=not_sent and not timed_out, suspect=timed_out
                    )
                    if not_sent and failover:
                        outcome_label = "failover"
                        raise NotSent(error, target.worker_url) from exc
                    outcome_label = f"upstream_{error.kind}"
                    await self._fail(exchange, error)
                    return
                try:
                    outcome_label = await self._relay(req, exchange, response, started, inject)
                finally:
                    if isinstance(response.stream, UpstreamBody):  # its close shields itself (h1client)
                        await response.aclose()
                    else:
                        with trio.CancelScope(shield=True):
                            await response.aclose()
            if total_scope.cancelled_caught and not exchange.ended:
                error = UpstreamTimeout(
                    target.target_id, f"the exchange took longer than {self.timeouts.total:g} s (total timeout)"
                )
                self._report_failure(target.worker_url, error)
                outcome_label = await self._fail_or_abort(exchange, error, exchange.started)
        finally:
            tm.in_flight.dec()
            self.metrics.batch.observe(tm.duration, trio.current_time() - started)
            self.metrics.count_request(req.endpoint, target.target_id, outcome_label)
            if logger.isEnabledFor(logging.DEBUG):
                log_event(
                    logger,
                    logging.DEBUG,
                    "proxy_request",
                    request_id=req.request_id,
                    endpoint=req.endpoint,
                    target=target.target_id,
                    outcome=outcome_label,
                    duration_seconds=round(trio.current_time() - started, 6),
                )

    def _report_failure(
        self, worker_url: str, error: UpstreamError, *, eject_now: bool = False, suspect: bool = False
    ) -> None:
        if self.outcomes is not None:
            self.outcomes.report_failure(
                worker_url, f"{error.kind}: {error.detail}", eject_now=eject_now, suspect=suspect
            )

    def _report_success(self, worker_url: str) -> None:
        if self.outcomes is not None:
            self.outcomes.report_success(worker_url)

    def _pinned(self, target: BackendTarget) -> bool:
        """Whether requests to ``target`` name its DP rank (a worker with one DP target gets none)."""
        return self.outcomes is not None and target.worker_url not in self.unpinned_workers

    async def _rank_refusal(self, response: WorkerResponse, target: BackendTarget) -> UpstreamError | None:
        """A worker's 400 that refuses the DP rank itself (it runs fewer ranks than configured:
        restarted with a smaller ``--data-parallel-size``): the rank leaves rotation
        (docs/operations.md §11.3, "A rank whose engine is missing") and the refusal is returned;
        None for any other 400, which is relayed as it is (read first when it is small enough to be
        that refusal)."""
        declared = response.headers.get("content-length")
        # (isascii: "²".isdigit() is true and int() refuses it)
        if declared is not None and not (
            declared.isascii() and declared.isdigit() and int(declared) <= RANK_REJECTION_BYTES
        ):
            return None
        body = await response.aread()
        match = RANK_REJECTION.search(body[:RANK_REJECTION_BYTES].decode("utf-8", "replace"))
        if match is None:
            return None
        detail = f"HTTP 400: {match.group(0).rstrip('. ')}"
        assert self.outcomes is not None
        self.outcomes.report_rank_refused(target, detail)
        return UpstreamRankRefused(target.target_id, detail)

    def _probing(self, req: ProxyRequest, lease: Lease) -> bool:
        """True when ``priority`` went to a worker whose policy is being detected (``auto``)."""
        url = lease.target.worker_url
        return (
            url in self.detect_workers
            and url in self.priority_workers
            and engine_priority(req.prio, self.priority.max_abs_priority, self.bands) != 0
        )

    async def _priority_rejected(
        self, req: ProxyRequest, lease: Lease, raw_body: bytes | None, response: WorkerResponse, inject: bool
    ) -> tuple[WorkerResponse, bool]:
        """A worker of policy ``auto`` answered 400: when it is vLLM's "Priority scheduling is not
        enabled", the worker is stock from now on and the request (which never ran) is sent again
        without ``priority``; any other 400 is relayed (docs/priority.md §5.4)."""
        body = await response.aread()
        if PRIORITY_REJECTION not in body.decode("utf-8", "replace").lower():
            return response, inject
        with trio.CancelScope(shield=True):
            await response.aclose()
        target = lease.target
        self.priority_workers = self.priority_workers - {target.worker_url}
        log_event(
            logger,
            logging.WARNING,
            "worker_priority_mode_detected",
            worker=target.worker_url,
            scheduling_policy="fcfs",
            message="the worker rejects priority: it is no longer sent there",
        )
        content, inject = self._outgoing_body(req, lease, raw_body)
        again = await self._send(
            target.worker_url,
            PATHS[req.endpoint],
            _worker_headers(req, lease, self.unpinned_workers),
            content,
            req.stream,
        )
        return again, inject

    def priority_mode(self, worker_url: str) -> str:
        """``priority`` or ``fcfs`` as the proxy treats the worker now; ``auto:`` + that while detecting."""
        mode = "priority" if worker_url in self.priority_workers else "fcfs"
        return f"auto:{mode}" if worker_url in self.detect_workers else mode

    async def _send(
        self, worker_url: str, path: str, headers: list[tuple[str, str]], content: bytes, stream: bool
    ) -> WorkerResponse:
        """POST to the worker with a streamed response.

        With a ``transport`` the request goes straight to it: the proxy needs none of the
        client layer (URL merging, cookies, auth, redirects, event hooks), which costs more CPU
        than the rest of the proxy path.  The worker URL is parsed once per (worker, path).
        """
        if self.transport is None:
            request = self.client.build_request("POST", worker_url + path, headers=headers, content=content)
            return await self.client.send(request, stream=True)
        timeouts = self._stream_timeouts if stream else self._plain_timeouts
        lean = self._lean.get((worker_url, path), _UNKNOWN)
        if lean is _UNKNOWN:
            lean = self._lean[(worker_url, path)] = (
                self.transport.lean_target(httpx.URL(worker_url + path))
                if isinstance(self.transport, UpstreamTransport)
                else None
            )
        if lean is not None:  # plain HTTP through agentd's client: no httpx objects (docs/benchmarks.md §10.2.4)
            assert isinstance(self.transport, UpstreamTransport) and isinstance(lean, LeanTarget)
            return await self.transport.post(lean, headers, content, timeouts)
        url = self._urls.get((worker_url, path))
        if url is None:
            url = self._urls[(worker_url, path)] = httpx.URL(worker_url + path)
        request = httpx.Request("POST", url, headers=headers, content=content, extensions={"timeout": timeouts})
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    async def _fail(self, exchange: _Exchange, error: UpstreamError) -> None:
        self.metrics.upstream_errors.labels(error.target_id, error.kind).inc()
        log_event(
            logger, logging.WARNING, "upstream_error", target=error.target_id, kind=error.kind, detail=error.detail
        )
        if not exchange.finished:
            exchange.finish(Outcome(False, None, f"upstream_{error.kind}", None, None))
        body = ApiError(error.status, str(error), code=f"upstream_{error.kind}", error_type="upstream_error").body()
        await exchange.start(error.status, [*JSON_HEADERS, ("content-length", str(len(body)))])
        await exchange.end(body)

    async def _relay(
        self,
        req: ProxyRequest,
        exchange: _Exchange,
        response: WorkerResponse,
        started: float,
        inject: bool,
    ) -> str:
        lease = exchange.lease
        target = lease.target
        target_id = target.target_id
        status = response.status_code
        if status >= 500:
            snippet = await _read_snippet(response)
            self.metrics.upstream_errors.labels(target_id, "status").inc()
            log_event(
                logger,
                logging.WARNING,
                "upstream_error",
                target=target_id,
                kind="status",
                status=status,
                detail=snippet,
            )
            if status != 503:  # 503: the worker is alive and says so (overloaded, starting)
                self._report_failure(target.worker_url, UpstreamError(target_id, f"HTTP {status}"))
            exchange.finish(Outcome(False, None, "upstream_status", None, None))
            await send_error(
                exchange,
                ApiError(
                    503 if status == 503 else 502,
                    f"worker {target_id} failed with HTTP {status}: {snippet}",
                    code="upstream_status",
                    error_type="upstream_error",
                ),
            )
            return "upstream_status"
        headers = client_headers(response.headers)
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
        if req.stream and is_sse and 200 <= status < 300:
            return await self._relay_stream(exchange, response, headers, started, inject)
        try:
            body = await self._read_body(response)
        except httpx.HTTPError as exc:
            error = map_httpx_error(target_id, exc)
            self._report_failure(target.worker_url, error)
            return await self._fail_or_abort(exchange, error, False)
        self._report_success(target.worker_url)
        ok = 200 <= status < 300
        answer = body
        if not ok:
            wrapped = wrap_worker_error(status, body, target_id)
            if wrapped is not None:  # plain-text/HTML worker errors become OpenAI-shaped JSON
                answer = wrapped
                headers = [(k, v) for k, v in headers if k != "content-type"] + JSON_HEADERS
        try:
            await exchange.start(status, [*headers, ("content-length", str(len(answer)))])
            await exchange.end(answer)
        finally:
            # The usage is read from the worker's body after the answer's last write, off the
            # client's path (docs/benchmarks.md §10.2.7); in a ``finally``, so an answer whose
            # write failed or was cancelled still finishes the lease, as when it was read first.
            # (A lease taken back before its answer started raises ``Requeued`` either way.)
            accumulator = UsageAccumulator()
            if lease.wants_usage:
                accumulator.feed_json(body)
            elif ok and self.fairness is not None:
                # a native lease: only the tenants' token counts need the usage (docs/priority.md §5.6)
                accumulator.usage = usage_of_body(body)
            exchange.finish(
                Outcome(
                    ok,
                    accumulator.usage,
                    None if ok else "upstream_status",
                    None,
                    None,
                    accumulator.finish_reason,
                    tuple(accumulator.tool_names),
                )
            )
        return "success" if ok else "upstream_status"

    async def _read_body(self, response: WorkerResponse) -> bytes:
        """The whole body; the stream-idle timeout bounds each silence for transports that do not
        enforce it themselves (:mod:`daemon.h1client` does)."""
        if response.is_stream_consumed or isinstance(response.stream, UpstreamBody):
            return await response.aread()
        parts: list[bytes] = []

        async def keep(chunk: bytes) -> None:
            parts.append(chunk)

        await self._pump_idle(response, keep)
        return b"".join(parts)

    async def _pump_idle(self, response: WorkerResponse, handler: Callable[[bytes], Awaitable[None]]) -> None:
        """``aiter_raw`` into ``handler``, raising ``httpx.ReadTimeout`` after ``timeouts.idle``
        seconds without a chunk (the deadline is disarmed while ``handler`` runs)."""
        idle = self.timeouts.idle
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + idle
            async for chunk in _raw_chunks(response):
                scope.deadline = math.inf
                await handler(chunk)
                scope.deadline = trio.current_time() + idle
            return
        raise httpx.ReadTimeout(f"no data from the worker for {idle:g} s")

    async def _pump_idle_timed(self, response: WorkerResponse, relay: StreamRelay) -> None:
        """:meth:`_pump_idle` with the coalescing timer (any transport; :mod:`daemon.h1client`
        has its own): the body is read by a child task, so that waiting for the next chunk can
        also end when the held events are due.  Errors cross as values (no exception group)."""
        idle = self.timeouts.idle
        send_items, receive_items = trio.open_memory_channel[object](0)
        end = object()

        async def produce() -> None:
            item: object = end
            try:
                async for chunk in _raw_chunks(response):
                    await send_items.send(chunk)
            except Exception as exc:
                item = exc
            await send_items.send(item)

        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            try:
                quiet_since = trio.current_time()
                while True:
                    item = None
                    with trio.move_on_at(min(relay.due, quiet_since + idle)):
                        item = await receive_items.receive()
                    if item is None:
                        if trio.current_time() >= quiet_since + idle:
                            raise httpx.ReadTimeout(f"no data from the worker for {idle:g} s")
                        await relay.fire()
                        continue
                    if item is end:
                        break
                    if isinstance(item, Exception):
                        raise item
                    await relay.feed(item)  # type: ignore[arg-type]
                    quiet_since = trio.current_time()
            except Exception as exc:
                error = exc
            nursery.cancel_scope.cancel()
        if error is not None:
            try:
                raise error
            finally:  # the traceback holds this frame: drop its references to the exception (no cycle)
                error = item = None

    async def _relay_stream(
        self,
        exchange: _Exchange,
        response: WorkerResponse,
        headers: list[tuple[str, str]],
        started: float,
        inject: bool,
    ) -> str:
        lease = exchange.lease
        first_token = self.metrics.for_target(lease.target.target_id).first_token
        observe = self.metrics.batch.observe
        relay = StreamRelay(
            exchange.sink.send,
            UsageChunkFilter() if inject else None,
            self.stream_coalesce_seconds,
            lambda now: observe(first_token, now - started),
        )
        await exchange.start(response.status_code, headers)
        try:
            stream = response.stream
            timed = relay.coalesce > 0
            writer = getattr(exchange.sink, "sync_writer", None)
            if isinstance(stream, UpstreamBody) and not response.is_stream_consumed and writer is not None:
                # the leanest path: daemon.h1client's relay hub writes with the direct body writer
                await stream.relay(relay, writer)
            elif isinstance(stream, UpstreamBody) and not response.is_stream_consumed:
                # the lean path of daemon.h1client
                safe = bool(getattr(exchange.sink, "cancel_safe_send", False))
                await stream.pump(relay.feed, relay if timed else None, handler_cancel_safe=safe)
            elif timed:
                await self._pump_idle_timed(response, relay)
            else:
                await self._pump_idle(response, relay.feed)
            await relay.finish()
        except httpx.HTTPError as exc:
            error = map_httpx_error(lease.target.target_id, exc)
            self._report_failure(lease.target.worker_url, error)
            return await self._fail_or_abort(exchange, error, True)
        self._report_success(lease.target.worker_url)
        accumulator = relay.accumulator
        first, last = relay.first, relay.last
        exchange.finish(
            Outcome(
                True,
                accumulator.finish(),
                None,
                None if first is None else first - started,
                None if first is None or last is None else last - first,
                accumulator.finish_reason,
                tuple(accumulator.tool_names),
            )
        )
        await exchange.end()
        return "success"

    async def _fail_or_abort(self, exchange: _Exchange, error: UpstreamError, stream_started: bool) -> str:
        """A worker failure after the upstream headers arrived (or the total timeout): a JSON error
        when nothing reached the client yet, else the stream ends with an error event and ``[DONE]``."""
        if not stream_started:
            await self._fail(exchange, error)
            return f"upstream_{error.kind}"
        self.metrics.upstream_errors.labels(error.target_id, "stream").inc()
        log_event(logger, logging.WARNING, "upstream_error", target=error.target_id, kind="stream", detail=error.detail)
        if not exchange.finished:
            exchange.finish(Outcome(False, None, "upstream_stream", None, None))
        await exchange.end(stream_error_tail(str(error), "upstream_stream"))
        return "upstream_stream"


# the first event that carries generated text (or a tool call): coalescing never holds it
_FIRST_TOKEN = re.compile(rb'"(?:content|text|delta|arguments|reasoning_content|name)"\s*:\s*"[^"]')


class StreamRelay:
    """The per-chunk work of relaying one event stream (docs/benchmarks.md §10.1).

    Each chunk the worker sent (all the bytes of one read: one event or a backlog of them) costs
    a few substring searches (usage, finish reason and tool names, :class:`UsageAccumulator`),
    the cut at the last complete event (the incomplete tail is sent with the rest of it, and
    dropped if the stream fails first, so an error event never lands inside a half event,
    docs/operations.md §11) and one downstream write.  With ``stream_options.include_usage``
    injected by agentd, the chunks go through :class:`UsageChunkFilter` instead, which only
    splits the chunks that contain a usage object.

    Coalescing (``coalesce`` seconds > 0, ``[server] stream_coalesce_ms``, docs/operations.md
    §13): events up to and including the first one that carries a token go out at once; later
    ones are held at most ``coalesce`` seconds after the first held one (``due``) and leave as
    one write.  Held events leave when a chunk arrives whose successor, expected one gap later
    (the last gap between two chunks), would come after ``due``: in a steady stream the window
    closes on an arrival, never late and without a timer; the pump calls :meth:`fire` at ``due``
    only when the worker is later than that.  The end is never held: the event with the first
    finish reason, ``[DONE]`` and the end of the body write everything held at once.
    """

    __slots__ = (
        "_send", "accumulator", "_filter", "coalesce", "_on_first", "first", "last",
        "_partial", "_held", "due", "_token_seen", "writes",
    )  # fmt: skip

    def __init__(
        self,
        send: Callable[[bytes], Awaitable[None]],
        chunk_filter: UsageChunkFilter | None,
        coalesce: float,
        on_first: Callable[[float], None],
    ) -> None:
        self._send = send
        self.accumulator = UsageAccumulator()
        self._filter = chunk_filter
        self.coalesce = coalesce
        self._on_first = on_first
        self.first: float | None = None  # when the first chunk arrived
        self.last: float | None = None  # when the last one did
        self._partial = b""  # the incomplete last event
        self._held: list[bytes] = []  # complete events held back by coalescing
        self.due = math.inf  # when the held events must leave
        self._token_seen = coalesce <= 0
        self.writes = 0  # downstream writes

    async def feed(self, chunk: bytes) -> None:
        out = self.take(chunk)
        if out:
            await self._send(out)

    def take(self, chunk: bytes) -> bytes:
        """Account for ``chunk`` and return what to write now (``b""``: nothing, or held)."""
        if not chunk:
            return b""
        accumulator = self.accumulator
        had_reason = accumulator.finish_reason is not None
        accumulator.feed_sse(chunk)
        now = trio.current_time()
        last = self.last
        if last is None:
            self.first = now
            self._on_first(now)
            last = now
        self.last = now
        if self._filter is not None:
            out = self._filter.feed(chunk)  # relays whole events only
        elif self._partial:
            data = self._partial + chunk
            cut = complete_events_end(data)
            out, self._partial = data[:cut], data[cut:]
        elif chunk.endswith(b"\n\n"):  # the common chunk: whole events
            out = chunk
        else:
            cut = complete_events_end(chunk)
            out, self._partial = chunk[:cut], chunk[cut:]
        if not out:
            return b""
        if self.coalesce <= 0:
            self.writes += 1
            return out
        held = self._held
        held.append(out)
        if not self._token_seen:
            self._token_seen = _FIRST_TOKEN.search(out) is not None
            return self.release()
        if now >= self.due or (not had_reason and accumulator.finish_reason is not None) or b"[DONE]" in out:
            return self.release()
        if self.due == math.inf:
            self.due = now + self.coalesce
        if now + (now - last) >= self.due:  # the next chunk is expected after the window: write now
            return self.release()
        return b""

    async def fire(self) -> None:
        """Write everything held, as one write."""
        out = self.release()
        if out:
            await self._send(out)

    def release(self) -> bytes:
        """Everything held, as one write (``b""``: nothing held)."""
        self.due = math.inf
        held = self._held
        if not held:
            return b""
        data = held[0] if len(held) == 1 else b"".join(held)
        held.clear()
        self.writes += 1
        return data

    async def finish(self) -> None:
        """The body ended: write what is held and the incomplete tail, if any."""
        rest = self._filter.flush() if self._filter is not None else self._partial
        self._partial = b""
        if rest:
            self._held.append(rest)
        if self._held:
            if self.coalesce <= 0:
                data = b"".join(self._held)
                self._held.clear()
                self.writes += 1
                await self._send(data)
            else:
                await self.fire()


def complete_events_end(data: bytes) -> int:
    """The length of the prefix of ``data`` made of complete SSE events (blank-line terminated)."""
    if data.endswith(b"\n\n"):
        return len(data)
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _worker_headers(req: ProxyRequest, lease: Lease, unpinned: frozenset[str]) -> list[tuple[str, str]]:
    """The headers of the request to the worker: the DP rank (none to a worker with one DP target,
    as the reference: docs/operations.md §13.10), agentd's request id (with the client's id and the
    retry attempt, docs/operations.md §12)."""
    target = lease.target
    return upstream_headers(
        req.headers,
        None if target.worker_url in unpinned else target.dp_rank,
        upstream_request_id(req.request_id, req.client_request_id),
        lease.attempt,
    )


async def _raw_chunks(response: WorkerResponse) -> AsyncIterator[bytes]:
    """``aiter_raw`` that also accepts an in-memory (already read) response."""
    if response.is_stream_consumed:
        yield response.content
        return
    async for chunk in response.aiter_raw():
        yield chunk


async def _read_snippet(response: WorkerResponse) -> str:
    data = b""
    try:
        async for chunk in response.aiter_raw():
            data += chunk
            if len(data) >= ERROR_SNIPPET_BYTES:
                break
    except httpx.StreamConsumed:  # an in-memory response (already read)
        data = response.content
    except httpx.HTTPError:
        pass
    return data[:ERROR_SNIPPET_BYTES].decode("utf-8", "replace").strip() or "(empty body)"
