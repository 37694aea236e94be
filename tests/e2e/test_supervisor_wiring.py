"""The supervisor wires worker health into Program scheduling, not only into the native path."""

from __future__ import annotations

import json
import random
from functools import partial

import attrs
import trio
import trio.testing
from native_fakes import FakeWorker, make_config

from actors.core.config import ProgramSchedulingConfig
from daemon.supervisor import run_daemon


def program_chat(program_id: str) -> bytes:
    return json.dumps(
        {
            "model": "fake-model",
            "messages": [{"role": "user", "content": f"task of {program_id}"}],
            "vllm_xargs": {"agentic_context": {"program_id": program_id}},
        }
    ).encode()


async def test_supervisor_program_scheduling_avoids_unhealthy_worker(
    fake_worker: FakeWorker, autojump_clock: trio.testing.MockClock
) -> None:
    fake_worker.healthy["http://w1:8000"] = False
    cfg = attrs.evolve(
        make_config(fake_worker.worker_urls, dp=2),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(binding_strategy="program_round_robin"),
    )
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, cfg, transport_factory=fake_worker.transport, serve_http=False, rng=random.Random(1))
        )
        for i in range(8):
            sink = await handles.handle_collect(handles.build_request("chat", program_chat(f"p{i}"), {}))
            assert sink.status == 200
        hit = {r.base_url for r in fake_worker.generation_requests()}
        # round-robin binding over all four targets would put half the Programs on w1
        assert hit == {"http://w0:8000"}
        handles.request_shutdown()
