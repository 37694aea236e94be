"""Rank actors and their registry: one actor per DP rank target, one scrape per worker URL per
round, ObservationReceived in target order, sync() starting and cancelling actors, failures
counted per rank, frozen snapshots in the diagnostics."""

from __future__ import annotations

import logging

import attrs
import httpx
import pytest
import trio
import trio.testing
from program_fakes import FakeWorkers, daemon_config, ok, program_request, program_scheduling
from rank_fakes import W0, W1, observing, target, vllm_metrics

from actors.core.events import ObservationReceived, RepairTick
from actors.messages import ObservationRoundStarted
from actors.rank_actor import RankSnapshot
from actors.rank_registry import RANK_INBOX_SIZE


def _summary(got: list[tuple[float, object]], t0: float) -> list[tuple[float, str, object]]:
    """(time since t0, message type, target id / target ids / tick deadline since t0)."""
    out: list[tuple[float, str, object]] = []
    for t, m in got:
        if isinstance(m, ObservationRoundStarted):
            out.append((round(t - t0, 6), "started", m.target_ids))
        elif isinstance(m, ObservationReceived):
            out.append((round(t - t0, 6), "received", m.target_id))
        elif isinstance(m, RepairTick):
            out.append((round(t - t0, 6), "tick", round(m.deadline - t0, 6)))
    return out


async def test_observation_received_follows_target_order_not_scrape_completion(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Target order interleaves the workers, and worker-0 (first in worker order) answers last.
    targets = (target(W1, 1, 3), target(W0, 0, 0), target(W1, 0, 1), target(W0, 1, 2))
    scrapes: list[tuple[float, str]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "worker-0":
            await trio.sleep(0.5)
        scrapes.append((trio.current_time(), str(request.url)))
        return httpx.Response(200, text=vllm_metrics())

    async with observing(targets, handler) as obs:
        assert [h.target.target_id for h in obs.registry.ranks()] == [f"{W0}@0", f"{W1}@0", f"{W0}@1", f"{W1}@1"]
        await trio.sleep(1.7)
    # one GET per worker URL per round, whatever the number of ranks behind it
    assert [(round(t - obs.t0, 6), u) for t, u in scrapes] == [
        (0.0, f"{W1}/metrics"),
        (0.5, f"{W0}/metrics"),
        (1.0, f"{W1}/metrics"),
        (1.5, f"{W0}/metrics"),
    ]
    ids = (f"{W0}@0", f"{W1}@0", f"{W0}@1", f"{W1}@1")
    assert _summary(obs.got, obs.t0) == [
        (0.0, "started", ids),
        *[(0.5, "received", i) for i in ids],
        (0.5, "tick", 0.0),
        (1.0, "started", ids),
        *[(1.5, "received", i) for i in ids],
        (1.5, "tick", 1.0),
    ]
    assert obs.registry.statistics()["observation_rounds_total"] == 2
    received = [m for _, m in obs.got if isinstance(m, ObservationReceived)]
    running = [m.running_requests for m in received[:4]]
    assert running == [1, 1, 2, 2]  # engine label -> DP rank
    assert {m.epoch for m in received} == {1, 2}


async def test_a_scrape_slower_than_the_interval_neither_delays_the_tick_nor_gets_a_second_get(
    autojump_clock: trio.testing.MockClock,
) -> None:
    targets = (target(W0, 0, 0), target(W0, 1, 1))
    scrapes: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        scrapes.append(trio.current_time())
        if len(scrapes) == 2:
            await trio.sleep(1.9)  # still under the 2 s timeout: the scrape of t=1 answers at t=2.9
        return httpx.Response(200, text=vllm_metrics())

    async with observing(targets, handler) as obs:
        await trio.sleep(3.5)
    assert [round(t - obs.t0, 6) for t in scrapes] == [0.0, 1.0, 3.0]  # no second GET while one runs
    ids = (f"{W0}@0", f"{W0}@1")
    assert _summary(obs.got, obs.t0) == [
        (0.0, "started", ids),
        (0.0, "received", ids[0]),
        (0.0, "received", ids[1]),
        (0.0, "tick", 0.0),
        (1.0, "started", ids),
        (2.0, "tick", 1.0),  # the round stops waiting at the next grid point
        (2.9, "received", ids[0]),  # the slow scrape, handed over by the round of t=2
        (2.9, "received", ids[1]),
        (2.9, "tick", 2.0),
        (3.0, "started", ids),
        (3.0, "received", ids[0]),
        (3.0, "received", ids[1]),
        (3.0, "tick", 3.0),
    ]
    late = [m for t, m in obs.got if isinstance(m, ObservationReceived) and round(t - obs.t0, 6) == 2.9]
    assert {(m.epoch, round(m.observed_at - obs.t0, 6)) for m in late} == {(2, 2.9)}  # its own round's epoch
    snap = obs.registry.snapshots()[ids[1]]
    assert (snap.age(obs.t0 + 3.5), snap.scrapes_count, snap.fresh(obs.t0 + 3.5, 1.0)) == (0.5, 3, True)


async def test_a_hung_worker_leaves_the_other_workers_observations_and_the_ticks_on_the_grid(
    autojump_clock: trio.testing.MockClock, event_log
) -> None:
    # docs/operations.md §1: a worker whose /metrics hangs (SIGSTOP) turns stale alone.  Before, every
    # round waited for its scrape's 2 s timeout: a tick every 2.4 s instead of every 0.8 s here, and
    # the healthy worker's observations aged past the freshness threshold (3 intervals, 2.4 s)
    # between rounds, so its ranks fell back to the router's ledger too.
    targets = (target(W0, 0, 0), target(W0, 1, 1), target(W1, 0, 2), target(W1, 1, 3))
    gets: list[tuple[float, str]] = []
    t0 = trio.current_time()

    async def handler(request: httpx.Request) -> httpx.Response:
        gets.append((round(trio.current_time() - t0, 6), request.url.host or ""))
        if request.url.host == "worker-1" and trio.current_time() - t0 >= 0.5:
            await trio.sleep(100)  # hung from t=0.5 on: each GET ends at its 2 s timeout
        return httpx.Response(200, text=vllm_metrics())

    async with observing(targets, handler, interval=0.8) as obs:
        await trio.sleep(6.5)
    grid = [round(0.8 * k, 6) for k in range(8)]
    ticks = [(round(t - obs.t0, 6), round(m.deadline - obs.t0, 6)) for t, m in obs.got if isinstance(m, RepairTick)]
    assert [deadline for _, deadline in ticks] == grid  # no grid point skipped
    assert ticks == [(0.0, 0.0), (1.6, 0.8), (2.4, 1.6), (2.8, 2.4), (4.0, 3.2), (4.8, 4.0), (5.2, 4.8), (6.4, 5.6)]
    healthy = [
        round(m.observed_at - obs.t0, 6)
        for _, m in obs.got
        if isinstance(m, ObservationReceived) and m.target_id.startswith(W0)
    ]
    assert healthy == [t for t in grid for _ in (0, 1)]  # both ranks of worker-0 at every round
    assert [t for t, host in gets if host == "worker-1"] == [0.0, 0.8, 3.2, 5.6]  # one GET at a time
    failed = [(round(t - obs.t0, 6), f["failed_rounds"]) for t, f in event_log.named("backend_observation_failed")]
    assert failed == [(2.8, 1), (5.2, 2)]
    now = obs.t0 + 6.5
    fresh = {i: s.fresh(now, 0.8) for i, s in obs.registry.snapshots().items()}
    assert fresh == {f"{W0}@0": True, f"{W0}@1": True, f"{W1}@0": False, f"{W1}@1": False}
    started = [(round(t - obs.t0, 6), m.target_ids) for t, m in obs.got if isinstance(m, ObservationRoundStarted)]
    assert started[2] == (1.6, (f"{W0}@0", f"{W0}@1"))  # worker-1's scrape of t=0.8 still runs


async def test_a_slow_scrape_of_a_worker_no_longer_observed_is_cancelled_and_a_returning_worker_gets_a_new_get(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # docs/operations.md §1: a scrape outliving its round runs only while its worker is observed.
    a, b = target(W0, 0, 0), target(W1, 0, 1)
    gets: list[tuple[float, str]] = []
    ended: list[tuple[float, str]] = []  # each worker-1 GET: when it ended, and how
    t0 = trio.current_time()

    async def handler(request: httpx.Request) -> httpx.Response:
        now = round(trio.current_time() - t0, 6)
        gets.append((now, request.url.host or ""))
        if request.url.host == "worker-1" and now == 1.0:
            try:
                await trio.sleep(1.5)  # would answer at t=2.5, under the 2 s timeout
            except trio.Cancelled:
                ended.append((round(trio.current_time() - t0, 6), "cancelled"))
                raise
            ended.append((round(trio.current_time() - t0, 6), "answered"))
        return httpx.Response(200, text=vllm_metrics((0.25,)))

    async with observing((a, b), handler) as obs:
        await trio.sleep(1.5)  # worker-1's GET of t=1 runs past the grid point t=2
        obs.registry.sync((a,))  # worker-1 leaves: the round of t=2 cancels its GET
        await trio.sleep(1.0)
        assert ended == [(2.0, "cancelled")]
        obs.registry.sync((a, b))  # worker-1 returns: the round of t=3 sends it a new GET
        await trio.sleep(1.0)
    assert ended == [(2.0, "cancelled")]  # never answered after its worker left
    assert [t for t, host in gets if host == "worker-1"] == [0.0, 1.0, 3.0]
    assert [t for t, host in gets if host == "worker-0"] == [0.0, 1.0, 2.0, 3.0]
    received = [(round(t - obs.t0, 6), m.target_id, m.epoch) for t, m in obs.got if isinstance(m, ObservationReceived)]
    assert received[-3:] == [(2.0, a.target_id, 3), (3.0, a.target_id, 4), (3.0, b.target_id, 4)]


async def test_sync_cancels_removed_actors_and_starts_added_ones(autojump_clock: trio.testing.MockClock) -> None:
    a, b, c = target(W0, 0, 0), target(W0, 1, 1), target(W1, 0, 2)
    d = target(W1, 1, 3)
    scrapes: list[tuple[float, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        scrapes.append((trio.current_time(), request.url.host or ""))
        return httpx.Response(200, text=vllm_metrics())

    async with observing((a, b, c), handler) as obs:
        await trio.sleep(0.5)
        assert obs.send.statistics().open_send_channels == 1 + 3  # the registry's + one per rank actor
        old_b = obs.registry.snapshots()[b.target_id]
        assert old_b.scrapes_count == 1

        obs.registry.sync((d, c, a))  # b removed, d added (given in any order: kept in target order)
        assert list(obs.registry.snapshots()) == [a.target_id, c.target_id, d.target_id]  # b's snapshot is gone
        assert obs.registry.snapshots()[d.target_id] == RankSnapshot(d)  # not observed yet
        await trio.testing.wait_all_tasks_blocked()
        stats = obs.registry.statistics()
        assert (stats["live_rank_actors"], stats["started_total"], stats["stopped_total"]) == (3, 4, 1)
        assert [i["name"] for i in stats["inboxes"]] == [f"rank_inbox:{t.target_id}" for t in (a, c, d)]
        assert obs.send.statistics().open_send_channels == 1 + 3  # b's actor ended and closed its clone
        await trio.sleep(1.0)
    assert old_b.scrapes_count == 1  # a published snapshot is a value: it never changes
    assert sorted((round(t - obs.t0, 6), host) for t, host in scrapes) == [
        (0.0, "worker-0"),
        (0.0, "worker-1"),
        (1.0, "worker-0"),
        (1.0, "worker-1"),
    ]
    assert _summary(obs.got, obs.t0)[5:] == [
        (1.0, "started", (a.target_id, c.target_id, d.target_id)),
        (1.0, "received", a.target_id),
        (1.0, "received", c.target_id),
        (1.0, "received", d.target_id),
        (1.0, "tick", 1.0),
    ]
    assert obs.registry.snapshots()[d.target_id].scrapes_count == 1


async def test_targets_removed_in_the_middle_of_a_round(autojump_clock: trio.testing.MockClock) -> None:
    a, b, c = target(W0, 0, 0), target(W0, 1, 1), target(W1, 0, 2)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=vllm_metrics())

    # Unbuffered sink: a rank actor's ObservationReceived waits until the drain takes it, and after
    # the first message the scheduler is busy for 0.3 s: a's actor is blocked sending.
    async with observing((a, b, c), handler, sink_size=0, hold_first=0.3) as obs:
        await trio.sleep(0.2)
        # a's actor is cancelled in the middle of its hand-over; b's turn has not come yet
        obs.registry.sync((c,))
        await trio.sleep(1.0)
    assert _summary(obs.got, obs.t0) == [
        (0.0, "started", (a.target_id, b.target_id, c.target_id)),
        (0.3, "received", c.target_id),  # the pacer neither waited for a nor handed over to b
        (0.3, "tick", 0.0),
        (1.0, "started", (c.target_id,)),
        (1.0, "received", c.target_id),
        (1.0, "tick", 1.0),
    ]
    assert obs.registry.statistics()["stopped_total"] == 2 + 1  # a and b, then c at shutdown


async def test_without_targets_nothing_runs_until_sync_adds_one(autojump_clock: trio.testing.MockClock) -> None:
    a = target(W0, 0, 0)
    scrapes: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        scrapes.append(trio.current_time())
        return httpx.Response(200, text=vllm_metrics((0.25,)))

    async with observing((), handler) as obs:
        await trio.sleep(5.0)
        assert (scrapes, obs.got, obs.registry.statistics()["live_rank_actors"]) == ([], [], 0)
        obs.registry.sync((a,))  # the grid starts with the first target
        await trio.sleep(1.5)
        obs.registry.sync(())  # every target gone: parked, no scrape and no tick
        await trio.sleep(1.6)
        obs.registry.sync((a,))  # back at t=8.1: the next round is on the grid, at t=9
        await trio.sleep(1.0)
    assert [round(t - obs.t0, 6) for t in scrapes] == [5.0, 6.0, 9.0]
    assert [(t, kind) for t, kind, _ in _summary(obs.got, obs.t0) if kind != "received"] == [
        (5.0, "started"),
        (5.0, "tick"),
        (6.0, "started"),
        (6.0, "tick"),
        (9.0, "started"),
        (9.0, "tick"),
    ]
    assert [m.deadline - obs.t0 for _, m in obs.got if isinstance(m, RepairTick)] == [5.0, 6.0, 9.0]


async def test_failed_scrape_counts_on_every_rank_of_the_worker(
    autojump_clock: trio.testing.MockClock, event_log
) -> None:
    # worker-1 comes first in target order, so it is first in worker order too
    targets = (target(W1, 0, 0), target(W1, 1, 1), target(W0, 0, 2), target(W0, 1, 3))
    failing = {"worker-0": "503", "worker-1": "connect"}

    def handler(request: httpx.Request) -> httpx.Response:
        mode = failing.get(request.url.host or "")
        if mode == "503":
            return httpx.Response(503)
        if mode == "connect":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, text=vllm_metrics())

    async with observing(targets, handler) as obs:
        await trio.sleep(1.5)
        failing.pop("worker-1")  # worker-1 recovers for the round of t=2
        await trio.sleep(1.0)
    failures = [
        (round(t - obs.t0, 6), f["base_url"], f["error"], f["failed_rounds"])
        for t, f in event_log.named("backend_observation_failed")
    ]
    assert failures == [
        (0.0, W1, "ConnectError: connection refused", 1),
        (0.0, W0, "HTTP 503", 1),
        (1.0, W1, "ConnectError: connection refused", 2),  # repeats of a streak: DEBUG
        (1.0, W0, "HTTP 503", 2),
        (2.0, W0, "HTTP 503", 3),
    ]
    warnings = [f["base_url"] for _, f in event_log.at_level("backend_observation_failed", logging.WARNING)]
    assert warnings == [W1, W0]  # one per failure streak
    recovered = [
        (round(t - obs.t0, 6), f["base_url"], f["failed_rounds"])
        for t, f in event_log.named("backend_observation_recovered")
    ]
    assert recovered == [(2.0, W1, 2)]
    assert _summary(obs.got, obs.t0) == [
        (0.0, "started", tuple(t.target_id for t in targets)),
        (0.0, "tick", 0.0),
        (1.0, "started", tuple(t.target_id for t in targets)),
        (1.0, "tick", 1.0),
        (2.0, "started", tuple(t.target_id for t in targets)),
        (2.0, "received", f"{W1}@0"),
        (2.0, "received", f"{W1}@1"),
        (2.0, "tick", 2.0),
    ]
    snaps = obs.registry.snapshots()
    summary = {
        i: (s.scrapes_count, s.failures_count, s.last_error, s.observed_at is not None) for i, s in snaps.items()
    }
    assert summary == {
        f"{W1}@0": (3, 2, None, True),  # a successful scrape clears the error, not the count
        f"{W1}@1": (3, 2, None, True),
        f"{W0}@0": (3, 3, "HTTP 503", False),
        f"{W0}@1": (3, 3, "HTTP 503", False),
    }


@attrs.define
class CacheConfigWorkers(FakeWorkers):
    """Fake workers that also export ``vllm:cache_config_info`` (1024 blocks of 16 tokens)."""

    def handler(self, request: httpx.Request) -> httpx.Response:
        response = super().handler(request)
        if response.status_code != 200:
            return response
        info = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"} 1.0\n'
        return httpx.Response(200, text=response.text + info)


async def test_diagnostics_show_each_ranks_frozen_snapshot(autojump_clock: trio.testing.MockClock) -> None:
    cfg = daemon_config(("http://w0:8000", "http://w1:8000"), token_capacity_per_dp_rank=10_000)
    workers = CacheConfigWorkers(dp_size=2, failing={"http://w1:8000"})
    async with program_scheduling(cfg, workers) as (dispatcher, _, _):
        await trio.sleep(3)
        before = dispatcher.diagnostics()
        assert before["backend_polling_started"] is False
        assert [
            (r["vllm_kv_capacity_tokens"], r["last_scrape_error"], r["scrape_failures_count"]) for r in before["ranks"]
        ] == [(None, None, 0)] * 4
        rank_channels = before["channels"][-1]
        assert (rank_channels["name"], rank_channels["live_rank_actors"], rank_channels["inboxes"]) == (
            "rank_actors",
            0,
            [],
        )

        t0 = trio.current_time()
        async with dispatcher.lease(program_request("task-a:lead")) as lease:
            lease.finish(ok())
        await trio.sleep(0.5)
        first = dispatcher.observers.snapshots()
        await trio.sleep(2.0)
        diag = dispatcher.diagnostics()

        assert [t - t0 for t, _ in workers.scrapes] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]  # one GET per worker
        assert diag["backend_polling_started"] is True
        assert [
            (r["target_id"], r["vllm_kv_capacity_tokens"], r["last_scrape_error"], r["scrape_failures_count"])
            for r in diag["ranks"]
        ] == [
            ("http://w0:8000@0", 16 * 1024, None, 0),
            ("http://w0:8000@1", 16 * 1024, None, 0),
            ("http://w1:8000@0", None, "HTTP 500", 3),
            ("http://w1:8000@1", None, "HTTP 500", 3),
        ]
        rank_channels = diag["channels"][-1]
        assert rank_channels["live_rank_actors"] == 4
        assert rank_channels["max_buffer_size"] == RANK_INBOX_SIZE == 1
        assert [(c["name"], c["current_buffer_used"], c["max_buffer_size"]) for c in rank_channels["inboxes"]] == [
            (f"rank_inbox:{t}", 0, 1)
            for t in ("http://w0:8000@0", "http://w0:8000@1", "http://w1:8000@0", "http://w1:8000@1")
        ]

        # The snapshots read at t0+0.5 are values: later rounds published new ones beside them.
        snap = first["http://w1:8000@0"]
        assert (snap.scrapes_count, snap.failures_count) == (1, 1)
        assert dispatcher.observers.snapshots()["http://w1:8000@0"].failures_count == 3
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            snap.failures_count = 99  # type: ignore[misc]
