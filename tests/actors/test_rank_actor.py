"""Rank actor: one scrape per worker URL per grid tick, engine label -> DP rank, ticks on a fixed
grid of absolute deadlines (missed ones skipped), failures produce no observation."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.testing
from rank_fakes import W0, W1, observing, target, vllm_metrics

from actors.core.events import ObservationReceived, RepairTick
from actors.core.ids import TargetId
from actors.messages import ObservationRoundStarted
from actors.observations import EngineSample
from actors.rank_actor import RankSnapshot, ScrapeResult, WorkerScraped, missing_engine, run_rank_actor, sample_of

TARGETS = tuple(target(u, r, i) for i, (u, r) in enumerate([(W0, 0), (W0, 1), (W1, 0), (W1, 1)]))


async def test_rank_actor_scrapes_once_per_worker_and_ticks_on_grid(autojump_clock: trio.testing.MockClock) -> None:
    scrapes: list[tuple[float, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        scrapes.append((trio.current_time(), str(request.url)))
        if request.url.host == "worker-0":
            return httpx.Response(200, text=vllm_metrics((0.25, 0.5), waiting=(3,)))
        return httpx.Response(503)

    async with observing(TARGETS, handler) as obs:
        await trio.sleep(2.5)
    assert sorted((t - obs.t0, u) for t, u in scrapes) == [
        (0.0, f"{W0}/metrics"),
        (0.0, f"{W1}/metrics"),
        (1.0, f"{W0}/metrics"),
        (1.0, f"{W1}/metrics"),
        (2.0, f"{W0}/metrics"),
        (2.0, f"{W1}/metrics"),
    ]
    first_round = [m for t, m in obs.got if t == obs.t0]
    assert isinstance(first_round[0], ObservationRoundStarted)
    assert first_round[0].target_ids == tuple(t.target_id for t in TARGETS)
    received = [m for m in first_round if isinstance(m, ObservationReceived)]
    assert [(m.target_id, m.kv_cache_usage, m.waiting_requests) for m in received] == [
        (f"{W0}@0", 0.25, 3),
        (f"{W0}@1", 0.5, 0),
    ]
    assert isinstance(first_round[-1], RepairTick)
    ticks = [(t - obs.t0, m.deadline - obs.t0) for t, m in obs.got if isinstance(m, RepairTick)]
    assert ticks == [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0)]
    snap = [s.as_dict(obs.t0 + 2.0, 1.0) for s in obs.registry.snapshots().values()]
    assert snap[0]["observation_fresh"] is True and snap[0]["vllm_waiting_requests"] == 3
    assert snap[2]["observation_age_seconds"] is None and snap[2]["last_scrape_error"] == "HTTP 503"
    assert snap[2]["scrape_failures_count"] == 3


async def test_rank_actor_keeps_ticking_through_a_slow_scrape(autojump_clock: trio.testing.MockClock) -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 2:
            await trio.sleep(1.7)  # the scrape started at t=1 answers at t=2.7
        return httpx.Response(200, text=vllm_metrics((0.1, 0.1)))

    async with observing(TARGETS[:2], handler) as obs:
        await trio.sleep(4.5)
    ticks = [round(t - obs.t0, 6) for t, m in obs.got if isinstance(m, RepairTick)]
    assert ticks == [0.0, 2.0, 2.7, 3.0, 4.0]  # tick 1 at the next grid point; tick 2 with the late scrape
    assert [round(m.deadline - obs.t0, 6) for _, m in obs.got if isinstance(m, RepairTick)] == [0.0, 1.0, 2.0, 3.0, 4.0]


async def test_rank_actor_scrape_timeout_is_two_seconds(autojump_clock: trio.testing.MockClock) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(100)
        return httpx.Response(200, text="")

    async with observing(TARGETS[:1], handler, interval=5.0) as obs:
        await trio.sleep(1)
        await trio.sleep(1.5)
    assert [(t - obs.t0, type(m).__name__) for t, m in obs.got] == [
        (0.0, "ObservationRoundStarted"),
        (2.0, "RepairTick"),
    ]
    assert obs.registry.snapshots()[TARGETS[0].target_id].last_error == "timeout after 2.0 s"


def _scraped(epoch: int, at: float, result: ScrapeResult) -> tuple[WorkerScraped, trio.MemoryReceiveChannel[bool]]:
    done_send, done_recv = trio.open_memory_channel[bool](1)  # one-shot acknowledgement
    return WorkerScraped(epoch=epoch, observed_at=at, result=result, done=done_send), done_recv


async def test_rank_actor_publishes_reports_and_acknowledges_each_scrape(
    autojump_clock: trio.testing.MockClock,
) -> None:
    target = TARGETS[1]  # engine 1 of worker-0
    inbox_send, inbox_recv = trio.open_memory_channel[WorkerScraped](1)
    sched_send, sched_recv = trio.open_memory_channel[object](10)  # test sink
    published: list[RankSnapshot] = []
    sample = EngineSample(kv_cache_usage=0.5, running_requests=2, waiting_requests=0, kv_capacity_tokens=4096)
    other = EngineSample(kv_cache_usage=0.1, running_requests=1, waiting_requests=0, kv_capacity_tokens=None)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_rank_actor, target, inbox_recv, sched_send, published.append)
        assert published == [RankSnapshot(target)]

        msg, done = _scraped(1, 10.0, {0: other, 1: sample})
        inbox_send.send_nowait(msg)
        assert await done.receive() is True
        assert sched_recv.receive_nowait() == ObservationReceived(
            target_id=TargetId(target.target_id),
            epoch=1,
            kv_cache_usage=0.5,
            running_requests=2,
            waiting_requests=0,
            observed_at=10.0,
            kv_capacity_tokens=4096,
        )

        msg, done = _scraped(2, 11.0, {0: other})  # no series for engine 1: nothing fabricated
        inbox_send.send_nowait(msg)
        assert await done.receive() is True
        msg, done = _scraped(3, 12.0, "HTTP 502")
        inbox_send.send_nowait(msg)
        assert await done.receive() is True
        with pytest.raises(trio.WouldBlock):
            sched_recv.receive_nowait()
        nursery.cancel_scope.cancel()
    assert [(s.observed_at, s.last_scrape_at, s.last_error, s.scrapes_count, s.failures_count) for s in published] == [
        (None, None, None, 0, 0),
        (10.0, 10.0, None, 1, 0),
        (10.0, 11.0, missing_engine({0: other}, 1), 2, 0),  # the previous sample is kept and ages
        (10.0, 12.0, "HTTP 502", 3, 1),
    ]
    assert published[-1].sample == sample and published[-1].kv_capacity_tokens == 4096
    assert published[-1].fresh(13.0, 1.0) is True and published[-1].fresh(13.5, 1.0) is False


async def test_cancelled_rank_actor_releases_every_pending_hand_over(autojump_clock: trio.testing.MockClock) -> None:
    inbox_send, inbox_recv = trio.open_memory_channel[WorkerScraped](1)
    sched_send, _sched_recv = trio.open_memory_channel[object](10)  # test sink
    msg, done = _scraped(1, 0.0, {0: EngineSample(0.1, 1, 0, None)})
    inbox_send.send_nowait(msg)  # handed over, never handled
    with trio.CancelScope() as scope:
        scope.cancel()
        await run_rank_actor(TARGETS[0], inbox_recv, sched_send, lambda _snapshot: None)
    with trio.fail_after(1), pytest.raises(trio.EndOfChannel):
        await done.receive()  # closed without an acknowledgement: the pacer moves on
    assert sched_send.statistics().open_send_channels == 0  # the actor closed its scheduler channel


async def test_a_worker_without_the_ranks_engine_says_so(
    autojump_clock: trio.testing.MockClock, event_log: Any
) -> None:
    """A DP-2 worker restarted with one DP rank: engine 1's series are gone.  The rank kept its old
    sample with ``last_scrape_error`` null, so nothing said why it went stale (session-35 walk);
    now the error names the missing engine, logged once (``worker_engine_missing``) until it is back."""
    engines = [(0.25, 0.5)] * 2 + [(0.25,)] * 3 + [(0.25, 0.5)]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=vllm_metrics(engines.pop(0) if engines else (0.25, 0.5)))

    async with observing(TARGETS[:2], handler) as obs:
        await trio.sleep(3.5)
        rank1 = obs.registry.snapshots()[TARGETS[1].target_id].as_dict(trio.current_time(), 1.0)
        assert rank1["last_scrape_error"] == (
            "the worker's /metrics has no series for engine 1 (engines 0): is it running fewer DP ranks than "
            "configured (routing.intra_node_data_parallel_size)?"
        )
        assert rank1["observation_age_seconds"] == 2.5 and rank1["scrape_failures_count"] == 0
        assert obs.registry.snapshots()[TARGETS[0].target_id].last_error is None
        await trio.sleep(2.0)
        assert obs.registry.snapshots()[TARGETS[1].target_id].last_error is None  # back
    logged = [(t - obs.t0, f["target"]) for t, f in event_log.named("worker_engine_missing")]
    assert logged == [(2.0, TARGETS[1].target_id)]


def test_only_a_rank_above_every_listed_engine_is_missing() -> None:
    """vLLM numbers a server's engines 0..N-1: fewer ranks drop the highest.  A rank below a listed
    engine is unobserved, not missing (a DP server before 0.10.1 listed its last engine only; a
    server of one rank behind an external balancer lists its global rank), docs/operations.md §11.7."""
    s = EngineSample(0.1, 1, 0, None)
    assert missing_engine({0: s}, 1) is not None
    assert missing_engine({0: s, 1: s}, 2) is not None
    assert missing_engine({1: s}, 0) is None
    assert missing_engine({3: s}, 0) is None
    assert sample_of({3: s}, 0, ranked=False) is s  # a worker with one DP target reads its one engine
    assert sample_of({3: s}, 0) is None
    assert sample_of({2: s, 3: s}, 0, ranked=False) is None
