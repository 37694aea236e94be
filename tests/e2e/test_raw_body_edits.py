"""Large bodies are edited as bytes (docs/operations.md §13, "Large bodies"): stripping the
agentic context and injecting ``stream_options.include_usage`` splice the client's bytes; a body
whose top-level keys repeat is re-encoded instead.  Both are counted in
``agentd_proxy_body_rewrites_total``."""

from __future__ import annotations

import json
import random
from functools import partial

import attrs
import httpx
import trio
from native_fakes import BUDGET_SECONDS, FakeWorker, make_config

from actors.core.config import ProgramSchedulingConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

MESSAGES = (
    b'[ {"role": "system", "content": "caf\xc3\xa9 \\"quoted\\" \\u00e9\\n\\ttab"},\n'
    + b",".join(b'{"role":"user","content":"' + b"x" * 5000 + b'"}' for _ in range(20))
    + b"]"
)
CTX = b'{"session_id": "s-1", "agent_id": "lead"}'


async def start(nursery: trio.Nursery, worker: FakeWorker) -> DaemonHandles:
    cfg = attrs.evolve(
        make_config(worker.worker_urls), enable_program_scheduling=True, program_scheduling=ProgramSchedulingConfig()
    )
    return await nursery.start(partial(run_daemon, cfg, client_factory=worker.client, rng=random.Random(2)))


def rewrites(scrape: str, method: str) -> float:
    line = next(
        x for x in scrape.splitlines() if x.startswith(f'agentd_proxy_body_rewrites_total{{method="{method}"}}')
    )
    return float(line.split()[-1])


async def test_large_program_body_is_edited_as_bytes(fake_worker: FakeWorker) -> None:
    raw = (
        b'{"model": "fake-model",  "messages": ' + MESSAGES + b',\n "stream": true,'
        b' "vllm_xargs": {"agentic_context": ' + CTX + b', "top_k": 5}}'
    )
    dup = (
        b'{"model":"fake-model","messages":'
        + MESSAGES
        + b',"stream":true,"stream":true,"vllm_xargs":{"agentic_context":'
        + CTX
        + b"}}"
    )
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            first = await client.post("/v1/chat/completions", content=raw)
            second = await client.post("/v1/chat/completions", content=dup)
            small = b'{"vllm_xargs":{"agentic_context":' + CTX + b'},"model":"fake-model","messages":[]}'
            third = await client.post("/v1/chat/completions", content=small)
            # a small body whose edited member ends it (an agent SDK's extra body): spliced
            small_last = b'{"model":"fake-model","messages":[],"vllm_xargs":{"agentic_context":' + CTX + b"}}"
            fourth = await client.post("/v1/chat/completions", content=small_last)
            scrape = (await client.get("/metrics")).text
        assert first.status_code == 200 and second.status_code == 200 and third.status_code == 200
        assert fourth.status_code == 200
        spliced, reencoded, small_one, small_spliced = fake_worker.generation_requests()
        # the conversation left as the client wrote it; only the small members were rewritten
        assert b'"messages": ' + MESSAGES + b',\n "stream": true' in spliced.raw
        assert spliced.body == {
            "model": "fake-model",
            "messages": json.loads(MESSAGES),
            "stream": True,
            "vllm_xargs": {"top_k": 5},
            "stream_options": {"include_usage": True},
        }
        # a repeated top-level key: re-encoded from the decoded body (the last value wins)
        assert MESSAGES not in reencoded.raw
        assert reencoded.body == {
            "model": "fake-model",
            "messages": json.loads(MESSAGES),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        # a body under MIN_LAYOUT_BYTES is re-encoded (cheaper than keeping its layout) unless
        # its one edited member is its last (docs/benchmarks.md §10.2.7)
        assert small_one.body == {"model": "fake-model", "messages": []}
        assert small_spliced.body == {"model": "fake-model", "messages": []}
        assert small_spliced.raw == b'{"model":"fake-model","messages":[]}'
        assert rewrites(scrape, "raw") == 2.0 and rewrites(scrape, "reencode_fallback") == 1.0
        assert rewrites(scrape, "reencode_small") == 1.0
        handles.request_shutdown()
