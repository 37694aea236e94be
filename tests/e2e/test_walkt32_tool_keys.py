"""Per-tool diagnostics for turns that call several tools, over real sockets (docs/program-scheduling.md
§12, "Turn keys" and "Diagnostics").

The fake worker answers each turn with the parallel tool calls the test names, streamed (one
header delta per call, as vLLM sends them) or not; agentd reads the names from the relayed
response.  Real clock, generous budget; nothing waits for time to pass, and nothing asserts on
the measured gaps but their count.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
from test_program_scheduling import ProgramWorker, start

from actors.core.config import ToolRetentionConfig

BUDGET_SECONDS = 60.0
USAGE = {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45, "prompt_tokens_details": {"cached_tokens": 0}}


class ToolWorker(ProgramWorker):
    """Answers a chat request with calls to the tools listed in its ``walk_tools`` field."""

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/health", "/metrics"):
            return await super().handler(request)
        body = json.loads(await request.aread())
        names: list[str] = body.get("walk_tools", [])
        calls = [
            {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
            for i, n in enumerate(names)
        ]
        if not body.get("stream"):
            message = {"role": "assistant", "content": None, "tool_calls": calls}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return httpx.Response(
                200, json={"id": "c", "object": "chat.completion", "choices": [choice], "usage": USAGE}
            )
        head = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
        events = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}]
        for call in calls:
            events.append({**head, "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})
        events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        events.append({**head, "choices": [], "usage": USAGE})
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())


def turn(program_id: str, tools: list[str], stream: bool) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "go"}],
        "stream": stream,
        "walk_tools": tools,
        "vllm_xargs": {"agentic_context": {"program_id": program_id}},
    }


async def test_parallel_tool_calls_learn_every_key_and_count_the_decision_once() -> None:
    retention = ToolRetentionConfig(min_samples=2)
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, ToolWorker(), tool_retention=retention)
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                for i in range(4):  # grep and edit_file in parallel, streamed and not
                    r = await client.post("/v1/chat/completions", json=turn("par", ["grep", "edit_file"], i % 2 == 0))
                    assert r.status_code == 200
                for _ in range(2):  # twelve calls: 8 names are read, the first 4 of them in sorted order are keys
                    names = [f"t{k}" for k in range(12)]
                    r = await client.post("/v1/chat/completions", json=turn("many", names, True))
                    assert r.status_code == 200
                r = await client.post("/v1/chat/completions", json=turn("nameless", [""], False))
                assert r.status_code == 200
                r = await client.post("/v1/chat/completions", json=turn("par", [], False))  # brings par back once more
                assert r.status_code == 200
                diag = (await client.get("/scheduling/diagnostics")).json()
            nursery.cancel_scope.cancel()
    rows = {row["tool"]: row for row in diag["tools"]}
    assert set(rows) == {"edit_file", "grep", "t0", "t1", "t2", "t3", "<tool_calls>"}
    grep, edit = rows["grep"], rows["edit_file"]
    # every key of a turn learns its gap: 4 turns, each followed by a return of the Program
    assert grep["samples"] == edit["samples"] == 4
    # turns 1 and 2 had fewer than min_samples gaps: both keys fell back; turns 3 and 4 decided once each
    assert grep["fallbacks"] == edit["fallbacks"] == 2
    decisions = [row["held"] + row["released"] for row in (grep, edit)]
    assert sorted(decisions) == [0, 2]
    assert all(rows[k]["samples"] == 1 and rows[k]["fallbacks"] == 2 for k in ("t0", "t1", "t2", "t3"))
