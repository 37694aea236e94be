"""Workers started with vLLM's ``--enable-force-include-usage`` (``routing.workers_force_include_usage``,
docs/config.md, docs/operations.md §12): every stream of theirs ends with a usage chunk.  Before
session 33 agentd asked for it in a Program request's stream (``stream_options.include_usage``) and
then filtered it out for the client, which would have got it from the worker directly.  With the
field set agentd sends the client's body as it is and relays the usage chunk; the scheduler still
reads the usage."""

from __future__ import annotations

import json

import attrs
import httpx
import pytest
import trio
import trio.testing
from native_fakes import make_config
from test_program_scheduling import ProgramWorker, chat, configured_daemon

from actors.core.config import ProgramSchedulingConfig


class ForcingWorker(ProgramWorker):
    """A worker that adds ``include_usage`` to every stream, as vLLM with the flag does; it keeps
    what agentd sent (``asked``: the body's own ``stream_options.include_usage``)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[object] = []

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return await super().handler(request)
        body = json.loads(await request.aread())
        self.asked.append((body.get("stream_options") or {}).get("include_usage"))
        forced = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
        again = httpx.Request(request.method, request.url, headers=request.headers, json=forced)
        return await super().handler(again)


def usage_chunks(text: str) -> list[dict[str, object]]:
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f.startswith("data: {")]
    return [c for c in map(json.loads, frames) if c.get("usage")]


@pytest.mark.parametrize("forced", [False, True])
async def test_a_forced_usage_chunk_reaches_the_client(autojump_clock: trio.testing.MockClock, forced: bool) -> None:
    worker = ForcingWorker()
    base = make_config(worker.urls, policy="round_robin")
    cfg = attrs.evolve(
        base,
        routing=attrs.evolve(base.routing, workers_force_include_usage=forced),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(),
    )
    async with configured_daemon(worker, cfg) as (handles, client):
        response = await client.post("/v1/chat/completions", json=chat("a", "p1", stream=True))
        assert response.status_code == 200
        ps = handles.program_dispatcher
        await ps.wait_diagnostics(lambda d: d["dispatcher"]["completed_count"] == 1)
        observed = handles.registry.get_sample_value(
            "vllm_router_agent_aware_token_estimate_feedback_total",
            {"model_pool": "default", "endpoint": "chat", "outcome": "observed"},
        )
    assert observed == 1  # the scheduler read the usage either way
    if forced:
        assert worker.asked == [None]  # the client's body as it was
        assert len(usage_chunks(response.text)) == 1  # as from the worker directly
    else:
        assert worker.asked == [True]  # agentd asked for it ...
        assert usage_chunks(response.text) == []  # ... and kept it from the client, who did not
