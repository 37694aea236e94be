"""The simulated server's Responses API names its own fields in a context-length refusal
(docs/simulator.md §3): found by the session-43 HTTP audit against the quick start, where a
``max_output_tokens`` beyond the context was refused naming ``max_completion_tokens`` (the chat
field it becomes), a field the client never sent, and an input that fills the context alone
named ``messages``."""

from __future__ import annotations

import trio
from sim_fakes import sim_client

from sim.cluster import SimConfig
from sim.engine import EngineConfig

CONFIG = SimConfig(dp_size=1, engine=EngineConfig(num_gpu_blocks=101), deterministic=True)  # 1,600 tokens


async def test_a_context_length_refusal_names_the_responses_fields(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client(CONFIG) as (_cluster, client):
        too_long = await client.post("/v1/responses", json={"input": "x", "max_output_tokens": 100_000})
        too_big = await client.post("/v1/responses", json={"input": "word " * 5_000})
        chat = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 100_000},
        )
    error = too_long.json()["error"]
    assert too_long.status_code == 400 and error["param"] == "max_output_tokens", error
    assert "max_output_tokens" in error["message"] and "max_completion_tokens" not in error["message"]
    error = too_big.json()["error"]
    assert too_big.status_code == 400 and error["param"] == "input", error
    assert "messages" not in error["message"]
    # the chat route keeps vLLM's names
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "max_completion_tokens"
