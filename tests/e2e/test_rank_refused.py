"""A worker that refuses a DP rank (docs/operations.md §11.3, "A rank whose engine is missing"), seen
from real traffic.  vLLM answers a request for a rank it does not run with 400 ``data_parallel_rank
N is out of range [0, M).``.  Before session 39 only Program scheduling's ``/metrics`` scrapes
noticed such a rank, so with native policies alone every request routed there reached the client
as that 400.  Now the refusal takes the rank out of rotation and the request goes to another rank
(the worker ran nothing); the health rounds bring it back once the worker's ``/metrics`` lists the
engine again."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio.testing
from log_capture import EventLog, attached
from native_fakes import make_config
from test_program_process import _start, _stop
from test_program_scheduling import ProgramWorker, chat, configured_daemon, post, program_daemon
from test_walk31_relay_limits import samples

from actors.core.invariants import check
from daemon.program_dispatch import ProgramDispatcher

INTERVAL = 1.0  # routing.health_check_interval_seconds


class ShrunkWorker(ProgramWorker):
    """The fake worker, answering a request for a DP rank it does not run as vLLM does."""

    refused: int = 0

    async def handler(self, request: httpx.Request) -> httpx.Response:
        rank = request.headers.get("x-data-parallel-rank")
        if request.url.path.startswith("/v1/") and rank is not None and int(rank) >= self.dp:
            self.refused += 1
            if self.refused > 16:  # refused in a loop: fail the exchange (a 502) instead of hanging the test
                raise httpx.ReadError("refused over and over")
            message = f"data_parallel_rank {rank} is out of range [0, {self.dp})."
            body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
            return httpx.Response(400, json=body)
        return await super().handler(request)


def native(worker: ProgramWorker, dp: int) -> Any:
    cfg = make_config(worker.urls, dp=dp, policy="round_robin")
    return attrs.evolve(cfg, routing=attrs.evolve(cfg.routing, health_check_interval_seconds=INTERVAL))


async def test_native_requests_to_a_refused_rank_fail_over_and_the_rank_returns_with_its_engine(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker = ShrunkWorker(dp=4)
    event_log = EventLog()
    with attached(event_log, "agentd", logging.DEBUG):
        async with configured_daemon(worker, native(worker, 4)) as (handles, client):
            await scenario(worker, handles, client)
    missing = [(f["target"], f["reason"]) for _, f in event_log.named("worker_engine_missing")]
    assert missing == [
        (handles.targets[r].target_id, f"the worker refused a request for DP rank {r}: "
         f"HTTP 400: data_parallel_rank {r} is out of range [0, 2)")
        for r in (2, 3)
    ]  # fmt: skip
    restored = [f["target"] for _, f in event_log.named("worker_engine_restored")]
    assert restored == [handles.targets[2].target_id, handles.targets[3].target_id]
    failovers = [f["detail"] for _, f in event_log.named("upstream_failover")]
    assert len(failovers) == 2 and all("out of range" in d for d in failovers)


async def scenario(worker: ShrunkWorker, handles: Any, client: httpx.AsyncClient) -> None:
    """Ranks 2 and 3 refused, then out of rotation until their engines are listed again."""
    worker.dp = 2  # restarted with two DP ranks: ranks 2 and 3 are refused
    statuses = [(await post(client, chat(f"free{i}", None))).status_code for i in range(8)]
    assert statuses == [200] * 8  # no client sees the 400
    assert worker.refused == 2  # once per rank: then it is out of rotation
    assert {s.rank for s in worker.seen} == {0, 1}
    assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1]
    targets = (await client.get("/scheduling/diagnostics")).json()["proxy"]["targets"]
    assert [(t["dp_rank"], t["engine_missing"]) for t in targets] == [(0, False), (1, False), (2, True), (3, True)]

    await trio.sleep(3 * INTERVAL)  # health rounds: /metrics still lists engines 0 and 1 only
    assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1]

    worker.dp = 4  # the engines are back
    await trio.sleep(INTERVAL)
    assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1, 2, 3]
    before = len(worker.seen)
    for i in range(4):
        assert (await post(client, chat(f"again{i}", None))).status_code == 200
    assert {s.rank for s in worker.seen[before:]} == {0, 1, 2, 3}
    assert worker.refused == 2


async def test_a_stream_to_a_refused_rank_fails_over_before_its_first_byte(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker = ShrunkWorker(dp=2)
    async with configured_daemon(worker, native(worker, 2)) as (handles, client):
        worker.dp = 1
        for i in range(3):
            response = await post(client, chat(f"s{i}", None, stream=True))
            assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]")
        assert worker.refused == 1 and {s.rank for s in worker.seen} == {0}


async def test_another_400_is_relayed_as_it_is_and_keeps_the_rank(autojump_clock: trio.testing.MockClock) -> None:
    worker = ShrunkWorker(dp=2)
    original = worker.handler

    async def bad_request(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1/"):
            return httpx.Response(400, json={"error": {"message": "max_tokens is too large", "code": 400}})
        return await original(request)

    worker.handler = bad_request  # type: ignore[method-assign]
    async with configured_daemon(worker, native(worker, 2)) as (handles, client):
        response = await post(client, chat("x", None))
        assert response.status_code == 400 and "max_tokens is too large" in response.text
        assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1]


async def test_when_every_rank_is_refused_the_client_gets_the_workers_400(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The last resort (as for missing engines): the rotation never empties, and a request refused
    on every rank gets the worker's own answer instead of looping."""
    worker = ShrunkWorker(dp=2)
    async with configured_daemon(worker, native(worker, 2)) as (handles, client):
        worker.dp = 0
        response = await post(client, chat("x", None))
        assert response.status_code == 400 and "is out of range" in response.text
        assert worker.refused == 2
        assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1]


async def test_through_relay_processes_a_refused_rank_fails_over_and_leaves_every_relays_rotation(
    tmp_path: Path,
) -> None:
    """Real processes: ``agentd sim-backend`` with one DP rank behind ``agentd start`` configured
    for two, with two relay processes.  A relay takes the refused rank out of its own rotation at
    once and tells the scheduler's board, whose next snapshot takes it out of the other relay's."""
    procs: list[trio.Process] = []
    try:
        sim = [sys.executable, "-m", "daemon", "sim-backend", "--port", "0", "--dp-size", "1", "--model", "m"]
        worker = await _start(sim, "agentd sim-backend listening on", procs)
        config = tmp_path / "agentd.toml"
        config.write_text(
            f'[server]\nport = 0\ndata_plane_processes = 2\nlog_level = "warning"\n'
            f'[routing]\nworker_urls = ["{worker}"]\nintra_node_data_parallel_size = 2\npolicy = "round_robin"\n'
            f'[batch_api]\ndatabase_path = "{tmp_path / "batches.sqlite3"}"\n'
        )
        agentd = await _start(
            [sys.executable, "-m", "daemon", "start", "--config", str(config)], "agentd listening on", procs
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        with trio.fail_after(120):
            # a connection each: both relays take some of them
            for _ in range(12):
                async with httpx.AsyncClient(base_url=agentd, timeout=60) as client:
                    response = await client.post("/v1/chat/completions", json=body)
                    assert response.status_code == 200, response.text
            async with httpx.AsyncClient(base_url=agentd, timeout=60) as client:
                targets = (await client.get("/scheduling/diagnostics")).json()["proxy"]["targets"]
                text = (await client.get("/metrics")).text
        assert [(t["dp_rank"], t["engine_missing"]) for t in targets] == [(0, False), (1, True)]
        failovers = samples(text, "agentd_proxy_failovers_total")
        # once per relay at most: the first refusal reaches the other relay's view within a snapshot
        assert 1 <= sum(failovers.values()) <= 2, failovers
    finally:
        codes = [await _stop(p) for p in reversed(procs)]
    assert codes == [0, 0]


async def test_with_two_workers_refusing_every_rank_the_request_still_ends_with_the_400(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Refusals are bounded by the number of targets, not by the failovers to other workers."""
    worker = ShrunkWorker(urls=("http://w0:8000", "http://w1:8000"), dp=2)
    async with configured_daemon(worker, native(worker, 2)) as (handles, client):
        worker.dp = 0
        with trio.fail_after(60):
            response = await post(client, chat("x", None))
        assert response.status_code == 400 and "is out of range" in response.text
        assert worker.refused == 4  # one per target, then the last one's answer
        assert len(handles.health.healthy_targets()) == 4


async def test_a_program_request_to_a_refused_rank_is_placed_again_elsewhere(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With Program scheduling, before any ``/metrics`` scrape has noticed the missing engine
    (scrapes every 60 s here): the refused Program request is submitted again under a derived id
    and placed on a rank still in rotation; the Programs that follow never go to the refused rank."""
    worker = ShrunkWorker(dp=2)
    async with program_daemon(worker, metrics_interval_seconds=60.0) as (handles, client):
        worker.dp = 1
        statuses = [(await post(client, chat(f"turn{i}", f"p{i % 4}"))).status_code for i in range(8)]
        assert statuses == [200] * 8
        assert worker.refused == 1 and {s.rank for s in worker.seen} == {0}
        assert [t.dp_rank for t in handles.health.healthy_targets()] == [0]
        doc = (await client.get("/scheduling/diagnostics")).json()
        assert doc["invariants"]["at_rest"], doc["invariants"]  # the refused attempt's lease released
        program = handles.program_dispatcher
        assert isinstance(program, ProgramDispatcher)
        assert check(program.scheduler.state, program.cfg) == []
        c = program.counters
        assert c.submitted_count == 9 and c.abandoned_count == 1 and c.completed_count == 8, c
