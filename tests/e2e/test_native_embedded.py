"""Embedded mode: no worker URLs -> the in-process simulated cluster serves real completions."""

from __future__ import annotations

import json
from functools import partial

import attrs
import httpx
import trio
import trio.testing
from native_fakes import BUDGET_SECONDS

from daemon.config import AgentdConfig, EmbeddedConfig, RoutingConfig, ServerConfig
from daemon.http.proxy import CollectingSink
from daemon.supervisor import run_daemon


def embedded_config(policy: str = "round_robin") -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(policy=policy),
        embedded=EmbeddedConfig(dp_size=2, num_gpu_blocks=256, time_scale=50.0, model="sim-model"),
    )


async def test_native_embedded_serves_streamed_completions_over_http() -> None:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, embedded_config()))
        assert [t.target_id for t in handles.targets] == ["http://embedded-sim@0", "http://embedded-sim@1"]
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            whole = await client.post("/v1/chat/completions", json=body)
            streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
            health = await client.get("/health")
            models = await client.get("/v1/models")
        assert whole.status_code == 200
        assert whole.json()["usage"]["completion_tokens"] == 5
        events = [e for e in streamed.content.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        deltas = [
            json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[:-1] if json.loads(e[6:])["choices"]
        ]
        assert sum(1 for d in deltas if d) == 5  # one event per generated token
        assert health.status_code == 200 and health.json()["embedded"] is True
        assert models.json()["data"][0]["id"] == "sim-model"
        handles.request_shutdown()


async def test_native_embedded_without_http_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    cfg = attrs.evolve(embedded_config(), embedded=EmbeddedConfig(dp_size=2, num_gpu_blocks=256, time_scale=1.0))
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, cfg, serve_http=False, sim_configure=lambda c: attrs.evolve(c, deterministic=True))
        )
        assert handles.http_url is None
        raw = json.dumps(
            {"model": "agentd-sim", "prompt": "once upon a time", "max_tokens": 4, "stream": True}
        ).encode()
        sinks: list[CollectingSink] = []
        for _ in range(2):
            sink = CollectingSink()
            await handles.handle(handles.build_request("completions", raw, {}), sink, raw_body=raw)
            sinks.append(sink)
        assert [s.status for s in sinks] == [200, 200]
        assert all(s.ended and s.body.endswith(b"data: [DONE]\n\n") for s in sinks)
        # round robin over the two simulated ranks, each pinned by the DP header
        assert handles.native_dispatcher.statistics().finished_count == 2
        assert trio.current_time() > 0  # the simulated engine consumed virtual time
        handles.request_shutdown()
