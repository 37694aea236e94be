"""Helpers of the HTTP property tests (``property_tests/test_http_*.py``): a whole daemon in
process (``serve_http=False``) in front of a fake worker at the process boundary, its app called
with raw ASGI messages (any method, path, query string, header bytes and body chunking, a client
that goes away mid-body), and the checks every answer and the daemon's accounting must pass.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio.testing

from actors.core.config import BatchJobsConfig, ProgramSchedulingConfig
from actors.core.invariants import check
from daemon.config import AgentdConfig, BatchApiConfig, RoutingConfig, ServerConfig
from daemon.handles import DaemonHandles
from daemon.http.app import AgentdApp, create_app
from daemon.invariants import capacity_invariants
from daemon.program_dispatch import ProgramDispatcher
from daemon.supervisor import run_daemon

WORKER = "http://fuzz-worker:9000"
MODEL = "fuzz-model"
MAX_BODY_BYTES = 16 * 1024
# Error codes that blame one field or header of the request: their ``param`` must name it.
FIELD_CODES = frozenset(
    {
        "invalid_type",
        "missing_field",
        "invalid_program_identity",
        "invalid_priority",
        "invalid_tenant",
        "invalid_user",
        "invalid_request_class",
        "invalid_header",
        "invalid_value",
        "unknown_parameter",
        "duplicate_field",
        "invalid_filename",
        "invalid_parameter",
        "header_too_large",
        "too_many_lines",
        "file_too_large",
        "invalid_content_type",
        "file_not_found",
        "batch_not_found",
    }
)


async def fake_worker(request: httpx.Request) -> httpx.Response:
    """A healthy worker: whatever agentd forwards it answers 200 (an event stream when asked)."""
    path = request.url.path
    if path == "/health":
        return httpx.Response(200)
    if path == "/metrics":
        return httpx.Response(200, text="")
    if path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL}]})
    body = json.loads(await request.aread())  # agentd forwards only valid JSON objects
    assert isinstance(body, dict)
    usage = {"prompt_tokens": 3, "completion_tokens": 1}
    if body.get("stream"):
        events = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n'
        events += b'data: {"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events)
    return httpx.Response(200, json={"choices": [{"message": {"content": "a"}}], "usage": usage})


def virtual_clock() -> trio.testing.MockClock:
    """Virtual time for one example.  Not ``autojump_threshold=0``: the Batch API's SQLite work runs
    in a worker thread, and while it runs every task is blocked, so a zero threshold jumped the clock
    from deadline to deadline (thousands of virtual seconds of metrics polls per request, most of
    these tests' wall time).  Jumping only after 20 ms of real idleness lets the thread finish
    first; these tests assert no durations."""
    return trio.testing.MockClock(autojump_threshold=0.02)


def fuzz_config(database: Path, **batch_api: Any) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0, max_body_bytes=MAX_BODY_BYTES),
        routing=RoutingConfig(worker_urls=(WORKER,), intra_node_data_parallel_size=2, policy="round_robin"),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(
            program_scheduling_enable_key="auto", max_active_programs_per_target=2
        ),
        batch_jobs=BatchJobsConfig(enabled=True),
        batch_api=BatchApiConfig(database_path=str(database), **batch_api),
    )


@attrs.frozen
class Answer:
    status: int | None  # None: no response started (the client went away first)
    headers: dict[str, str]
    body: bytes


async def asgi_call(
    app: AgentdApp,
    method: str,
    path: str,
    *,
    query: bytes = b"",
    headers: Sequence[tuple[bytes, bytes]] = (),
    chunks: Sequence[bytes] = (b"",),
    disconnect_after: int | None = None,
) -> Answer:
    """One request through the app's ASGI interface: the body in ``chunks``; with
    ``disconnect_after`` the client goes away after that many chunks instead of sending the rest."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.1"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": query,
        "root_path": "",
        "headers": list(headers),
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 3001),
        "state": {},
        "extensions": {},
    }
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    if disconnect_after is not None:
        messages = [*messages[:disconnect_after], {"type": "http.disconnect"}]
    finished = trio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await finished.wait()  # after the body: the connection stays open until the response ends
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    starts = [m for m in sent if m["type"] == "http.response.start"]
    if not starts:
        return Answer(None, {}, b"")
    assert len(starts) == 1, starts
    head = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in starts[0]["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Answer(starts[0]["status"], head, body)


def assert_well_formed(answer: Answer, method: str) -> dict[str, Any] | None:
    """Never a 5xx; an error is OpenAI-shaped JSON whose ``param`` names the field at fault; a 405
    says which methods are allowed.  Returns the ``error`` object (None for a success)."""
    status = answer.status
    assert status is not None and 100 <= status < 500, (status, answer.body[:300])
    if status == 405:
        assert answer.headers.get("allow"), answer.headers
    if status < 400:
        return None
    if method == "HEAD":
        return None
    assert answer.headers.get("content-type", "").startswith("application/json"), answer.headers
    payload = json.loads(answer.body)
    error = payload["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] in ("invalid_request_error", "rate_limit_error", "authentication_error"), error
    assert isinstance(error["code"], str) and error["code"]
    if error["code"] in FIELD_CODES:
        assert isinstance(error["param"], str), error
    return dict(error)


def assert_at_rest(handles: DaemonHandles) -> None:
    """Every request-bound counter back at zero: no lease, Program request, queued request, reply
    channel or edge slot left behind, and the core's invariants intact."""
    invariants = capacity_invariants(handles)
    assert invariants["at_rest"], invariants
    assert handles.edge is not None
    edge = handles.edge.statistics()
    assert edge.in_flight == 0 and edge.queued == 0, edge
    stats = handles.native_dispatcher.statistics()
    assert stats.leases_granted_count == stats.finished_count + stats.abandoned_count, stats
    program = handles.program_dispatcher
    assert isinstance(program, ProgramDispatcher), program
    c = program.counters
    assert c.submitted_count == c.rejected_count + c.completed_count + c.abandoned_count, c
    problems = check(program.scheduler.state, program.cfg)
    assert problems == [], problems


@asynccontextmanager
async def running_app(cfg: AgentdConfig) -> AsyncIterator[tuple[DaemonHandles, AgentdApp]]:
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(
                run_daemon,
                cfg,
                transport_factory=lambda _cfg: httpx.MockTransport(fake_worker),
                serve_http=False,
                batch_executor=True,
                rng=random.Random(0),
            )
        )
        yield handles, create_app(handles)
        nursery.cancel_scope.cancel()
