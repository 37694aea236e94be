"""Fuzz of the whole proxy path in process (issue 14 §1): hostile bodies and headers through
``ProxyEngine.build_request`` and ``handle`` against a fake worker, with Program scheduling and
batch jobs on.  Every answer is below 500 (a fake worker's own 5xx becomes a 502/503 naming it,
which is allowed), every error body is OpenAI-shaped, and once the requests are over no capacity
is left behind: no native lease in flight, every Program request completed, abandoned or
rejected, the scheduler's RequestPool, in-flight table and reply table empty, the core's
invariants intact.  Deterministic (derandomized) and small, so it runs in the normal suite."""

from __future__ import annotations

import json
import random
from functools import partial
from typing import Any

import httpx
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.core.config import BatchJobsConfig, ProgramSchedulingConfig
from actors.core.invariants import check
from daemon.config import AgentdConfig, RoutingConfig, ServerConfig
from daemon.http.errors import ApiError
from daemon.http.proxy import CollectingSink
from daemon.program_dispatch import ProgramDispatcher
from daemon.supervisor import run_daemon

WORKER = "http://fuzz:9000"
# The fake worker's answer is chosen by the request's model.
MODELS = ["ok", "plain400", "json400", "html502", "err500", "empty404"]


async def worker(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/health":
        return httpx.Response(200)
    if path == "/metrics":
        text = "".join(
            f'vllm:num_requests_running{{engine="{r}"}} 0\nvllm:num_requests_waiting{{engine="{r}"}} 0\n'
            for r in range(2)
        )
        return httpx.Response(200, text=text)
    if path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": m} for m in MODELS]})
    body = json.loads(await request.aread())
    model = body.get("model")
    if model == "plain400":
        return httpx.Response(400, text="Bad Request: you sent something odd")
    if model == "json400":
        return httpx.Response(400, json={"object": "error", "message": "bad", "type": "BadRequestError", "code": 400})
    if model == "html502":
        return httpx.Response(502, html="<html>bad gateway</html>")
    if model == "err500":
        return httpx.Response(500, text="Internal Server Error")
    if model == "empty404":
        return httpx.Response(404)
    usage = {"prompt_tokens": 7, "completion_tokens": 2}
    if body.get("stream"):
        chunks = (
            b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n'
            + b'data: {"choices":[],"usage":'
            + json.dumps(usage).encode()
            + b"}\n\n"
            + b"data: [DONE]\n\n"
        )
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chunks)
    return httpx.Response(
        200, json={"choices": [{"message": {"content": "a"}, "finish_reason": "stop"}], "usage": usage}
    )


def fuzz_config() -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0, max_body_bytes=1 << 20),
        routing=RoutingConfig(worker_urls=(WORKER,), intra_node_data_parallel_size=2, policy="round_robin"),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(
            program_scheduling_enable_key="auto", max_active_programs_per_target=2
        ),
        batch_jobs=BatchJobsConfig(enabled=True),
    )


KEYS = st.sampled_from(
    [
        "model", "stream", "stream_options", "include_usage", "messages", "role", "content", "text",
        "tool_calls", "function", "tools", "function_call", "prompt", "input", "instructions", "max_tokens",
        "n", "vllm_xargs", "agentic_context", "program_id", "task_id", "session_id", "agent_id", "priority",
        "deadline_seconds", "kv_retention_ttl_seconds", "expected_output_length", "step_id", "agent_hint",
        "user", "request_id", "blocks_parent", "parent_agent_id",
    ]
)  # fmt: skip
TEXT = st.text(max_size=10) | st.sampled_from(["user", "lead", "p1", "#job_name[j]#r", "\ud800", ""])
SCALARS = st.none() | st.booleans() | st.integers(-(2**66), 2**66) | st.floats() | TEXT | st.sampled_from(MODELS)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=20
)
CONTEXT = st.fixed_dictionaries(
    {
        "agentic_context": st.fixed_dictionaries(
            {"program_id": st.sampled_from(["p1", "p2", "p3"])},
            optional={
                "deadline_seconds": st.one_of(st.floats(0, 5), VALUES),
                "kv_retention_ttl_seconds": st.one_of(st.floats(0, 5), VALUES),
                "priority": st.one_of(st.integers(-3, 3), VALUES),
                "step_id": VALUES,
            },
        )
        | VALUES
    }
)
CHAT = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.one_of(TEXT, TEXT, VALUES)}
            ),
            min_size=1,
            max_size=2,
        ),
    },
    optional={
        "stream": st.one_of(st.booleans(), st.booleans(), VALUES),
        "vllm_xargs": st.one_of(CONTEXT, CONTEXT, VALUES),
        "tools": st.one_of(st.just([{"type": "function", "function": {"name": "f"}}]), VALUES),
        "max_tokens": st.one_of(st.integers(-1, 5), VALUES),
        "request_id": TEXT,
    },
)
HEADER_NAMES = st.sampled_from(
    [
        "x-session-id",
        "x-request-id",
        "session-id",
        "x-claude-code-session-id",
        "x-agentd-class",
        "x-user-id",
        "thread-id",
    ]
)
HEADER_VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=12) | st.sampled_from(
    ["batch", "interactive", "#job_name[x]#1"]
)
HEADERS = st.one_of(
    st.just({}),
    st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=2),
    st.just({"x-request-id": "#job_name[j]#r1"}),
    st.just({"x-session-id": "s" * 2000}),
)
ENDPOINT_BODIES = st.one_of(
    st.tuples(st.just("chat"), CHAT),
    st.tuples(st.just("chat"), CHAT),
    st.tuples(st.just("completions"), st.fixed_dictionaries({"model": st.sampled_from(MODELS), "prompt": TEXT})),
    st.tuples(st.sampled_from(["chat", "completions", "responses"]), st.dictionaries(KEYS, VALUES, max_size=6)),
)
RAW_EXTRAS = st.sampled_from(
    [b"", b"[", b'{"messages":' + b"[" * 80 + b"]" * 80 + b"}", b'{"messages":[{"role":"user","content":"\\udc00"}]}']
)


@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    requests=st.lists(st.tuples(ENDPOINT_BODIES, HEADERS), min_size=1, max_size=6),
    raw_extra=RAW_EXTRAS,
)
def test_fuzzed_requests_never_get_a_5xx_nor_leak_capacity(
    requests: list[tuple[tuple[str, dict[str, Any]], dict[str, str]]], raw_extra: bytes
) -> None:
    trio.run(run_example, requests, raw_extra, clock=trio.testing.MockClock(autojump_threshold=0))


async def run_example(requests: list[tuple[tuple[str, dict[str, Any]], dict[str, str]]], raw_extra: bytes) -> None:
    statuses: list[int] = []

    async def one(endpoint: str, raw: bytes, headers: dict[str, str]) -> None:
        try:
            req = handles.engine.build_request(endpoint, raw, headers)
        except ApiError as error:
            assert 400 <= error.status < 500, error.message
            json.loads(error.body())
            statuses.append(error.status)
            return
        sink = CollectingSink()
        await handles.engine.handle(req, sink)
        assert sink.status is not None and sink.ended
        statuses.append(sink.status)
        if sink.status >= 400 and not req.stream:
            error = json.loads(sink.body)["error"]
            assert set(error) >= {"message", "type", "param", "code"}, sink.body

    def encoded(body: dict[str, Any]) -> bytes:
        return json.dumps(body).encode("utf-8", "surrogatepass")

    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(
                run_daemon,
                fuzz_config(),
                transport_factory=lambda cfg: httpx.MockTransport(worker),
                serve_http=False,
                rng=random.Random(0),
            )
        )
        async with trio.open_nursery() as clients:
            for (endpoint, body), headers in requests:
                clients.start_soon(one, endpoint, encoded(body), headers)
            if raw_extra:
                clients.start_soon(one, "chat", raw_extra, {})
        await trio.sleep(1.0)  # a few ticks: every release reached the scheduler
        assert all(s < 500 or s in (502, 503) for s in statuses), statuses
        native = handles.native_dispatcher
        assert native.total_in_flight() == 0
        stats = native.statistics()
        assert stats.leases_granted_count == stats.finished_count + stats.abandoned_count
        program = handles.program_dispatcher
        assert isinstance(program, ProgramDispatcher)
        c = program.counters
        assert c.submitted_count == c.rejected_count + c.completed_count + c.abandoned_count, c
        state = program.scheduler.state
        assert len(state.pool) == 0 and not state.in_flight
        assert program.scheduler.pending_replies_count == 0
        assert check(state, program.cfg) == []
        handles.request_shutdown()
