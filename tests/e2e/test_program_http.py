"""Program scheduling over HTTP: usage reaches the scheduler (streaming with and without
``include_usage``), bad metadata is a 400 naming the field, identity-free traffic never creates
Program state nor triggers backend polling, and the official ``openai`` client works with the
agentic context in ``extra_body``.

The daemon runs in process and the clients talk to its ASGI app (``program_daemon``, see
``test_program_scheduling``): no sockets; under ``autojump_clock`` except the ``openai`` client
test (it uses worker threads, so it runs on the real clock without timing assertions)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import openai
import trio
import trio.testing
from test_program_scheduling import (
    PROMPT_TOKENS,
    W0,
    ProgramWorker,
    chat,
    configured_daemon,
    program_config,
    program_daemon,
)

from actors.core.config import BatchJobsConfig
from daemon.config import PrioritySection


def data_events(raw: bytes) -> list[str]:
    return [e[len("data: ") :] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


async def test_program_streaming_usage_reaches_scheduler_with_and_without_include_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker = ProgramWorker()
    async with program_daemon(worker, metrics_interval_seconds=0.25) as (handles, client):
        ps = handles.program_dispatcher
        plain = await client.post("/v1/chat/completions", json=chat("s1", "p", stream=True))
        body = chat("s2", "p", stream=True)
        body["stream_options"] = {"include_usage": True}
        asked = await client.post("/v1/chat/completions", json=body)
        assert plain.status_code == asked.status_code == 200
        # the worker was asked for usage both times
        assert [(s.name, s.include_usage) for s in worker.seen] == [("s1", True), ("s2", True)]
        plain_events = data_events(plain.content)
        asked_events = data_events(asked.content)
        assert not any('"usage"' in e for e in plain_events)  # the client did not ask: chunk removed
        assert plain_events[-1] == "[DONE]"
        usage_chunks = [json.loads(e) for e in asked_events if '"usage"' in e]
        assert [u["usage"]["prompt_tokens"] for u in usage_chunks] == [PROMPT_TOKENS]
        diag = await ps.wait_diagnostics(lambda d: d["ranks"][0]["rolling"]["request_samples"] == 2)
        rolling = diag["ranks"][0]["rolling"]
        assert rolling["avg_prompt_tokens"] == PROMPT_TOKENS
        assert rolling["avg_completion_tokens"] == 2
        (prog,) = diag["ranks"][0]["programs"]
        assert prog["estimated_context_tokens"] == PROMPT_TOKENS
        assert prog["step_id"] == 1  # omitted step ids count 0, 1


async def test_program_bad_metadata_is_400_naming_the_field(autojump_clock: trio.testing.MockClock) -> None:
    worker = ProgramWorker()
    async with program_daemon(worker) as (handles, client):
        bad = chat("b", "p", priority="high")
        r1 = await client.post("/v1/chat/completions", json=bad)
        r2 = await client.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "b"}],
                "vllm_xargs": {
                    "agentic_context": {
                        "task_id": "t",
                        "agent_id": "w",
                        "blocks_parent": True,
                        "parent_program_id": "t:w",
                    }
                },
            },
        )
        assert r1.status_code == 400
        err = r1.json()["error"]
        assert err["param"] == "vllm_xargs.agentic_context.priority"
        assert "priority" in err["message"]
        assert r2.status_code == 400
        assert r2.json()["error"]["param"].startswith("vllm_xargs.agentic_context.")
        assert worker.seen == []
        assert handles.program_dispatcher.diagnostics()["live_programs"] == 0


async def test_program_identity_free_traffic_is_unaffected(autojump_clock: trio.testing.MockClock) -> None:
    worker = ProgramWorker(dp=2)
    async with program_daemon(worker, token_capacity_per_dp_rank=1, metrics_interval_seconds=0.25) as (handles, client):
        for k in range(6):
            r = await client.post("/v1/chat/completions", json=chat(f"plain{k}", None))
            assert r.status_code == 200
        metrics = (await client.get("/metrics")).text
        diag = handles.program_dispatcher.diagnostics()
        assert worker.metrics_scrapes == 0  # no backend polling without Program identity
        assert diag["backend_polling_started"] is False
        assert (diag["live_programs"], diag["retained_requests"]) == (0, 0)
        assert all(r["programs"] == [] for r in diag["ranks"])
        # the native round-robin policy spread them over both ranks; a capacity of 1 token did not matter
        assert sorted({s.rank for s in worker.seen}) == [0, 1]
        assert "vllm_router_agent_aware_transitions_total{" not in metrics


async def test_program_no_targets_503_names_each_workers_reason(autojump_clock: trio.testing.MockClock) -> None:
    """Every worker out of rotation: a Program request's 503 ``no_targets`` names each worker's
    reason, as the native ``no_healthy_target`` does (docs/operations.md §11.3)."""
    worker = ProgramWorker()
    worker.down.add(W0)
    async with program_daemon(worker) as (handles, client):
        response = await client.post("/v1/chat/completions", json=chat("a", "p"))
        plain = await client.post("/v1/chat/completions", json=chat("b", None))
        assert response.status_code == plain.status_code == 503
        assert response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert error["code"] == "no_targets"
        assert error["message"] == f"no healthy DP targets are available: {W0}: HTTP 503"
        assert plain.json()["error"]["message"] == f"no healthy targets are available: {W0}: HTTP 503"
        assert worker.seen == []


async def test_batch_and_interactive_no_targets_503s_name_each_workers_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The batch and interactive classes go through the same scheduler: their ``no_targets``
    refusals name each worker's reason too (docs/operations.md §11.3)."""
    worker = ProgramWorker()
    worker.down.add(W0)
    cfg = attrs.evolve(
        program_config(worker),
        batch_jobs=BatchJobsConfig(enabled=True),
        priority=PrioritySection(interactive_scheduling=True),
    )
    async with configured_daemon(worker, cfg) as (_, client):
        batch = await client.post("/v1/chat/completions", json=chat("b", None), headers={"x-agentd-class": "batch"})
        interactive = await client.post(
            "/v1/chat/completions", json=chat("i", None), headers={"x-agentd-tenant": "alice"}
        )
    for response in (batch, interactive):
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "no_targets"
        assert error["message"] == f"no healthy DP targets are available: {W0}: HTTP 503"
    assert worker.seen == []


async def test_program_openai_client_streaming_and_not() -> None:
    """On the real clock: the openai client runs blocking helpers in worker threads (platform
    headers), which autojump would not wait for.  No timing assertions; the in-process budget
    (VIRTUAL_BUDGET_SECONDS, here real seconds) is never reached on the success path."""
    worker = ProgramWorker()
    async with program_daemon(worker, metrics_interval_seconds=0.25) as (handles, client):
        ps = handles.program_dispatcher
        extra: dict[str, Any] = {
            "vllm_xargs": {
                "agentic_context": {"task_id": "task-a", "agent_id": "lead", "request_id": "r-1", "priority": 3}
            }
        }
        async with openai.AsyncOpenAI(
            base_url="http://agentd/v1", api_key="unused", max_retries=0, http_client=client
        ) as oc:
            done = await oc.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "o1"}],
                extra_body=extra,
            )
            stream = await oc.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "o2"}],
                extra_body=extra,
                stream=True,
            )
            pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
        assert done.choices[0].message.content == "ok"
        assert done.usage is not None and done.usage.prompt_tokens == PROMPT_TOKENS
        assert pieces == ["ok"]
        assert [s.name for s in worker.seen] == ["o1", "o2"]
        diag = await ps.wait_diagnostics(lambda d: d["ranks"][0]["rolling"]["request_samples"] == 2)
        (prog,) = [p for r in diag["ranks"] for p in r["programs"]]
        assert (prog["task_id"], prog["agent_id"], prog["root_program_id"]) == ("task-a", "lead", "task-a:lead")
        assert (
            handles.registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total", {"target": W0, "reason": "program_admit"}
            )
            == 2.0
        )
