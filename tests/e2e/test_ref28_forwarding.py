"""What a worker receives, against the reference's (vllm-router 0.1.17, docs/operations.md §13.10).

The reference sends ``x-data-parallel-rank`` only with ``--intra-node-data-parallel-size`` > 1
(docs/operations.md §13.10, "what the worker receives"; the session-28 walk saw no header at size 1): a
vLLM server running several engines behind one URL then balances them itself.  agentd pinned every
request of such a worker to engine 0.
"""

from __future__ import annotations

import json
import random
from functools import partial

import attrs
import pytest
import trio
from native_fakes import FakeWorker, make_config

from daemon.config import ProgramSchedulingConfig
from daemon.supervisor import run_daemon


def _chat(program_id: str | None) -> bytes:
    body: dict[str, object] = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    if program_id is not None:
        body["vllm_xargs"] = {"agentic_context": {"program_id": program_id}}
    return json.dumps(body).encode()


@pytest.mark.parametrize(("dp", "expected"), [(1, {None}), (2, {"0", "1"})])
async def test_the_rank_header_goes_only_to_workers_with_several_dp_targets(
    fake_worker: FakeWorker, dp: int, expected: set[str | None]
) -> None:
    cfg = attrs.evolve(
        make_config(fake_worker.worker_urls, dp=dp),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(),
    )
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, cfg, transport_factory=fake_worker.transport, serve_http=False, rng=random.Random(3))
        )
        for program_id in (None, None, "task-a:lead", "task-b:lead", "task-c:lead", "task-d:lead"):
            sink = await handles.handle_collect(handles.build_request("chat", _chat(program_id), {}))
            assert sink.status == 200
        seen = fake_worker.generation_requests()
        assert len(seen) == 6
        ranks = {r.headers.get("x-data-parallel-rank") for r in seen}
        assert ranks == expected
        handles.request_shutdown()
