"""Usage injection and stripping when the dispatcher wants usage (Program scheduling leases).

With Program scheduling on, a request carrying ``vllm_xargs.agentic_context`` is leased by the
ProgramDispatcher, whose leases want usage.  A client that streams without
``stream_options.include_usage`` must still get exactly the stream it asked for: agentd asks
the worker for usage and removes the extra usage-only chunk.  Identity-free requests keep the
native path and are forwarded untouched.
"""

from __future__ import annotations

import json
import random
from functools import partial

import attrs
import httpx
import trio
import trio.testing
from native_fakes import BUDGET_SECONDS, FakeWorker, make_config

from actors.core.config import ProgramSchedulingConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

CTX = {"program_id": "prog-1", "agent_id": "lead"}


def program_chat(stream: bool, include_usage: bool | None = None) -> dict:
    body: dict = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "vllm_xargs": {"agentic_context": CTX},
    }
    if include_usage is not None:
        body["stream_options"] = {"include_usage": include_usage}
    return body


async def start(nursery: trio.Nursery, worker: FakeWorker) -> DaemonHandles:
    cfg = attrs.evolve(
        make_config(worker.worker_urls), enable_program_scheduling=True, program_scheduling=ProgramSchedulingConfig()
    )
    return await nursery.start(partial(run_daemon, cfg, client_factory=worker.client, rng=random.Random(2)))


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


async def test_native_usage_injected_and_extra_chunk_removed(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        assert handles.program_dispatcher is not None
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            plain = await client.post("/v1/chat/completions", json=program_chat(stream=True))
            asked = await client.post("/v1/chat/completions", json=program_chat(True, include_usage=True))
        # the worker was asked for usage both times; the agentic context never reached it
        first, second = fake_worker.generation_requests()
        assert first.body["stream_options"] == {"include_usage": True}
        assert second.body["stream_options"] == {"include_usage": True}
        assert "vllm_xargs" not in first.body
        # the client that did not ask sees no usage chunk; the one that asked keeps it
        assert not any(b'"usage"' in e for e in events(plain.content))
        assert events(plain.content)[-1] == b"data: [DONE]"
        assert len(events(plain.content)) == 4
        usage_events = [e for e in events(asked.content) if b'"usage"' in e]
        assert len(usage_events) == 1 and json.loads(usage_events[0][6:])["choices"] == []
        # the scheduler received the worker's usage for both requests
        await trio.testing.wait_all_tasks_blocked()
        diag = handles.program_dispatcher.diagnostics()
        rolling = [r["rolling"] for r in diag["ranks"] if r["rolling"]["request_samples"]]
        assert sum(r["request_samples"] for r in rolling) == 2
        assert rolling[0]["avg_prompt_tokens"] == 11
        handles.request_shutdown()


async def test_native_identity_free_request_not_rewritten(fake_worker: FakeWorker) -> None:
    raw = b'{"model": "fake-model",   "messages": [{"role": "user", "content": "hi"}], "stream": true}'
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", content=raw)
        assert response.status_code == 200
        [seen] = fake_worker.generation_requests()
        assert seen.raw == raw  # byte for byte, odd spacing included
        handles.request_shutdown()


async def test_native_invalid_identity_is_400_with_param(fake_worker: FakeWorker) -> None:
    body = program_chat(stream=False)
    body["vllm_xargs"]["agentic_context"] = {"program_id": ""}
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "invalid_program_identity"
        assert error["param"] and "program_id" in error["param"]
        assert error["message"].startswith("invalid Program identity")
        handles.request_shutdown()
