"""WARN ``worker_engines_unused`` (docs/operations.md §11.7): a worker whose ``/metrics`` lists more
engines than agentd has DP ranks there (a vLLM server of DP 4 configured as two targets) is named
once, again when the count changes, and INFO ``worker_engines_matched`` once it matches again;
a worker that lists as many engines as ranks, or fewer (``worker_engine_missing``), is not."""

from __future__ import annotations

import logging

import httpx
import trio
import trio.testing
from rank_fakes import W0, W1, observing, target, vllm_metrics


async def test_a_worker_with_more_engines_than_ranks_is_named_once_per_change(
    autojump_clock: trio.testing.MockClock, event_log
) -> None:
    targets = (target(W0, 0, 0), target(W0, 1, 1), target(W1, 0, 2), target(W1, 1, 3))
    engines = {"worker-0": 4, "worker-1": 2}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=vllm_metrics([0.25] * engines[request.url.host or ""]))

    async with observing(targets, handler) as obs:
        await trio.sleep(1.5)  # rounds at t=0 and t=1: one warning
        engines["worker-0"] = 3  # t=2: a changed count is named again
        await trio.sleep(1.0)
        engines["worker-0"] = 2  # t=3: matched
        await trio.sleep(1.0)
        engines["worker-1"] = 1  # t=4: fewer engines is the missing-engine case, not this one
        await trio.sleep(1.0)
    unused = [
        (round(t - obs.t0, 6), f["base_url"], f["engines"], f["ranks"])
        for t, f in event_log.at_level("worker_engines_unused", logging.WARNING)
    ]
    assert unused == [(0.0, W0, 4, 2), (2.0, W0, 3, 2)]
    (_, first), _ = event_log.named("worker_engines_unused")
    assert "routing.intra_node_data_parallel_size = 4" in first["message"]
    matched = [
        (round(t - obs.t0, 6), f["base_url"], f["engines"]) for t, f in event_log.named("worker_engines_matched")
    ]
    assert matched == [(3.0, W0, 2)]
