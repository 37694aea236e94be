"""Where a Program's time goes, end to end (docs/program-scheduling.md §14).

The daemon runs in process under ``autojump_clock`` in front of a fake worker that streams each
answer with exact virtual delays: the first chunk after ``prefill`` seconds, the rest (with the
usage the test chose) ``decode`` seconds later.  Two turns of one Program, 7 s apart; the fitted
acting TTL is 0 during warm-up, so the Program releases its placement after each turn and the
second turn's recomputed tokens are attributed to the acting TTL.  ``/scheduling/diagnostics`` and
``/metrics`` must show the exact parts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families
from test_program_scheduling import ProgramWorker, program_daemon

# name -> (prefill s, decode s, prompt, cached, completion)
TURNS = {"T1": (1.0, 2.0, 1024, 0, 128), "T2": (3.0, 1.0, 2048, 256, 64)}


class TimedWorker(ProgramWorker):
    """Streams each chat answer with the delays and usage of ``TURNS``."""

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/health", "/metrics"):
            return await super().handler(request)
        body = json.loads(await request.aread())
        name = body["messages"][-1]["content"]
        prefill, decode, prompt, cached, completion = TURNS[name]
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

        def event(payload: dict[str, Any]) -> bytes:
            return f"data: {json.dumps(payload)}\n\n".encode()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return event({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]})

        async def stream() -> AsyncIterator[bytes]:
            await trio.sleep(prefill)
            yield chunk({"role": "assistant", "content": "a"})
            await trio.sleep(decode)
            yield chunk({"content": "b"}, "stop")
            yield event({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())


def turn(name: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": name}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "vllm_xargs": {"agentic_context": {"program_id": "agent-1"}},
    }


def samples(text: str, name: str, label: str) -> dict[str, float]:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels[label]: s.value for s in family.samples if s.name == f"{name}_total"}
    raise AssertionError(f"{name} missing from /metrics")


async def test_diagnostics_and_metrics_show_where_the_program_time_went(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker = TimedWorker()
    async with program_daemon(worker) as (handles, client):
        t0 = trio.current_time()
        r1 = await client.post("/v1/chat/completions", json=turn("T1"))
        assert r1.status_code == 200 and trio.current_time() - t0 == 3.0
        await trio.sleep(7.0)  # the agent's tool
        r2 = await client.post("/v1/chat/completions", json=turn("T2"))
        assert r2.status_code == 200 and trio.current_time() - t0 == 14.0
        await handles.program_dispatcher.wait_diagnostics(lambda d: d["time_split"]["completions"] == 2)

        diag = (await client.get("/scheduling/diagnostics")).json()
        split = diag["time_split"]
        expected = {"queue": 0.0, "prefill": 2.5, "recompute": 1.5, "decode": 3.0, "between_turns": 7.0}
        assert split["seconds"] == expected
        assert split["prompt_tokens"] == {"cached": 256, "new": 1920, "recomputed": 896}
        assert split["recomputed_tokens_by_cause"]["acting_ttl"] == 896
        assert split["recompute_seconds_by_cause"]["acting_ttl"] == 1.5
        (row,) = split["top_programs"]
        assert (row["prefill_seconds"], row["recompute_seconds"], row["decode_seconds"]) == (2.5, 1.5, 3.0)
        assert (row["between_turns_seconds"], row["completions"], row["estimated_splits"]) == (7.0, 2, 0)
        assert row["open_phase"] == "between_turns" and row["pending_loss_cause"] == "acting_ttl"

        text = (await client.get("/metrics")).text
        assert samples(text, "agentd_program_time_seconds", "part") == expected
        recomputed = samples(text, "agentd_program_recomputed_tokens", "cause")
        assert recomputed["acting_ttl"] == 896.0 and sum(recomputed.values()) == 896.0
        assert samples(text, "agentd_program_prompt_tokens", "kind") == {
            "cached": 256.0,
            "new": 1920.0,
            "recomputed": 896.0,
        }
        assert samples(text, "agentd_program_recompute_seconds", "cause")["acting_ttl"] == 1.5
