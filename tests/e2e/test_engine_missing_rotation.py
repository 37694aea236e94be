"""A worker running fewer DP ranks than configured (docs/operations.md §11.3, "A rank whose engine
is missing").  Before session 36 the missing rank was only named in its ``last_scrape_error``: it
stayed in rotation, so Programs bound to it and identity-free requests picked for it went on being
sent to a DP rank the worker refuses (vLLM answers 400 ``data_parallel_rank 1 is out of range``).
Now the rank leaves rotation from the scrape that misses its engine and returns with the engine."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from test_program_scheduling import ProgramWorker, chat, post, program_daemon

INTERVAL = 0.25


async def test_a_rank_missing_from_its_workers_metrics_leaves_rotation_until_it_returns(
    autojump_clock: trio.testing.MockClock, event_log: Any
) -> None:
    worker = ProgramWorker(dp=2)
    async with program_daemon(worker, metrics_interval_seconds=INTERVAL) as (handles, client):
        t0 = trio.current_time()
        assert (await post(client, chat("first", "p0"))).status_code == 200  # starts the rank actors
        assert {t.dp_rank for t in handles.health.healthy_targets()} == {0, 1}

        worker.dp = 1  # restarted with one DP rank: engine 1's series are gone from /metrics
        await trio.sleep(1.0)
        assert [t.dp_rank for t in handles.health.healthy_targets()] == [0]
        targets = (await client.get("/scheduling/diagnostics")).json()["proxy"]["targets"]
        shown = [(t["dp_rank"], t["engine_missing"], t["healthy"]) for t in targets]
        assert shown == [(0, False, True), (1, True, True)]
        before = len(worker.seen)
        for i in range(6):  # Programs and identity-free requests alike
            assert (await post(client, chat(f"prog{i}", f"p{i}"))).status_code == 200
            assert (await post(client, chat(f"free{i}", None))).status_code == 200
        assert {s.rank for s in worker.seen[before:]} == {0}

        worker.dp = 2  # the engine is back
        await trio.sleep(1.0)
        assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1]
        before = len(worker.seen)
        for i in range(4):
            assert (await post(client, chat(f"again{i}", None))).status_code == 200
        assert {s.rank for s in worker.seen[before:]} == {0, 1}  # round robin over both again

    missing = [(round(t - t0, 6), f["target"]) for t, f in event_log.named("worker_engine_missing")]
    restored = [(round(t - t0, 6), f["target"]) for t, f in event_log.named("worker_engine_restored")]
    rank1 = handles.targets[1].target_id
    assert len(missing) == 1 and missing[0][1] == rank1
    assert len(restored) == 1 and restored[0][1] == rank1 and restored[0][0] > missing[0][0]


async def test_a_worker_listing_only_higher_engines_keeps_its_ranks_in_rotation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Series of engines above every configured rank (a vLLM server of one rank behind an external
    load balancer labels them with its global rank) say nothing about the ranks below: they are not
    missing (docs/operations.md §11.7).  Before session 41 both ranks were marked missing here and
    stayed in rotation only through the last resort (every rank in rotation would have left)."""
    worker = ProgramWorker(dp=2)
    original = worker.handler

    async def other_engines(request: Any) -> Any:
        response = await original(request)
        if request.url.path == "/metrics":
            text = response.text.replace('engine="0"', 'engine="7"').replace('engine="1"', 'engine="8"')
            response = type(response)(200, text=text)
        return response

    worker.handler = other_engines  # type: ignore[method-assign]
    async with program_daemon(worker, metrics_interval_seconds=INTERVAL) as (handles, client):
        assert (await post(client, chat("first", "p0"))).status_code == 200
        await trio.sleep(1.0)
        targets = (await client.get("/scheduling/diagnostics")).json()["proxy"]["targets"]
        assert [t["engine_missing"] for t in targets] == [False, False]
        assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1]
        assert (await post(client, chat("second", "p1"))).status_code == 200
