"""The Responses API as Program work through agentd, in front of the embedded simulated backend
(docs/simulator.md §3; before session 33 the simulator answered 404, so the quick start could not
serve an agent SDK that speaks Responses).  The dispatcher reads each answer's usage
(``input_tokens``, ``output_tokens``), streamed and not, as for chat."""

from __future__ import annotations

import json
from functools import partial

import trio
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client
from test_program_sim import deterministic, sim_config

from daemon.supervisor import run_daemon


def _feedback(registry: object, outcome: str) -> float:
    value = registry.get_sample_value(  # type: ignore[attr-defined]
        "vllm_router_agent_aware_token_estimate_feedback_total",
        {"model_pool": "default", "endpoint": "responses", "outcome": outcome},
    )
    return value or 0.0


async def test_responses_requests_are_program_work_with_their_usage_read(autojump_clock: trio.abc.Clock) -> None:
    cfg = sim_config()
    context = {"vllm_xargs": {"agentic_context": {"program_id": "sdk:lead", "task_id": "sdk"}}}
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            async with in_process_client(handles) as client:
                body = {"model": "sim-model", "input": "plan the change", "max_output_tokens": 8, **context}
                first = await client.post("/v1/responses", json=body)
                assert first.status_code == 200, first.text
                assert first.json()["usage"]["output_tokens"] == 8
                streamed = await client.post("/v1/responses", json={**body, "stream": True})
                assert streamed.status_code == 200, streamed.text
                frames = [f for f in streamed.text.split("\n\n") if f]
                last = json.loads(frames[-1].split("data: ", 1)[1])
                assert last["type"] == "response.completed" and last["response"]["usage"]["output_tokens"] == 8
                assert "[DONE]" not in streamed.text  # the Responses stream has no [DONE] line, relayed as is
                ps = handles.program_dispatcher
                await ps.wait_diagnostics(lambda d: d["dispatcher"]["completed_count"] == 2)
            assert _feedback(handles.registry, "observed") == 2 and _feedback(handles.registry, "missing") == 0
            handles.request_shutdown()
            nursery.cancel_scope.cancel()
