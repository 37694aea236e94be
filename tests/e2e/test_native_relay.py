"""End to end through a real hypercorn socket: relay, streaming, DP header, usage injection."""

from __future__ import annotations

import json
import random
from functools import partial

import httpx
import trio

from conftest import FakeWorker, make_config
from daemon.dispatch import DispatchRejected, ProxyRequest
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def start(nursery: trio.Nursery, worker: FakeWorker, **cfg_kwargs: object) -> DaemonHandles:
    cfg = make_config(worker.worker_urls, **cfg_kwargs)  # type: ignore[arg-type]
    return await nursery.start(partial(run_daemon, cfg, client_factory=worker.client, rng=random.Random(7)))


async def test_native_non_streaming_chat_relayed_whole(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=None) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        assert response.json()["choices"][0]["message"]["content"] == "Hello world"
        assert response.headers["content-type"] == "application/json"
        [seen] = fake_worker.generation_requests()
        assert seen.path == "/v1/chat/completions"
        assert json.loads(seen.raw) == CHAT
        handles.request_shutdown()
    assert handles.native_dispatcher.statistics().finished_count == 1
