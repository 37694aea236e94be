"""agentd against the ``/metrics`` of the vLLM versions users run, 0.8 to 0.11 (V1 engine):
docs/operations.md §11.7.  The fake worker (``ProgramWorker``, at the HTTP boundary) serves the
text each version serves, in its shape: metric names, labels, ``_total``/``_created`` samples, and
which engines a data-parallel server lists.

* vLLM 0.8 to 0.9.0 name the KV gauge ``vllm:gpu_cache_usage_perc`` only.  Before session 41
  agentd read ``vllm:kv_cache_usage_perc`` alone: every rank had an observation without KV usage,
  so Program scheduling fell back to its own ledger for good (``capacity_observation_fallback``).
* Until mid-2025 (0.10.0 or 0.10.1) a data-parallel server listed only its last engine's series
  (``engine="N-1"``).  Before session 41 agentd took ranks 0..N-2 out of rotation as "missing
  engines": a DP-2 worker served on one rank.
* A server of one DP rank behind an external load balancer labels its series with its global
  rank (``engine="3"``): a worker with one DP target now reads that engine.
* A server of several ranks behind a hybrid load balancer labels them with their global ranks
  (``engine="2"``, ``engine="3"``) and takes the local rank in ``X-data-parallel-rank``: agentd's
  ranks 0 and 1 there read engines 2 and 3.  Before session 44 neither had an observation.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio
import trio.testing
from test_program_scheduling import ProgramWorker, chat, post, program_daemon

INTERVAL = 0.25


def _engine_series(engine: int, *, kv: float, old_kv: bool, new_kv: bool, running: int = 0) -> list[str]:
    labels = f'engine="{engine}",model_name="m"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} 0.0",
    ]
    if old_kv:
        lines += [
            "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            f"vllm:gpu_cache_usage_perc{{{labels}}} {kv}",
            "# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries (tokens).",
            "# TYPE vllm:gpu_prefix_cache_queries_total counter",
            f"vllm:gpu_prefix_cache_queries_total{{{labels}}} 96.0",
            "# HELP vllm:gpu_prefix_cache_queries_created GPU prefix cache queries (tokens).",
            "# TYPE vllm:gpu_prefix_cache_queries_created gauge",
            f"vllm:gpu_prefix_cache_queries_created{{{labels}}} 1.75e+09",
        ]
    if new_kv:
        lines += [
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {kv}",
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{{{labels}}} 96.0",
        ]
    return lines


def _cache_config_info(engines: list[int] | None) -> list[str]:
    """One series without ``engine`` (up to 0.10.0), else one per engine (0.10.1 on)."""
    head = [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
    ]
    common = 'block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9"'
    if engines is None:
        return [*head, f'vllm:cache_config_info{{{common},num_gpu_blocks="4096"}} 1.0']
    return head + [f'vllm:cache_config_info{{{common},engine="{e}",num_gpu_blocks="4096"}} 1.0' for e in engines]


def scrape_text(version: str, engines: list[int], kv: float) -> str:
    """``/metrics`` of a vLLM ``version`` whose listed engines are ``engines``."""
    old_kv = version in ("0.8", "0.9.0", "0.9.2", "0.10")
    new_kv = version not in ("0.8", "0.9.0")
    lines: list[str] = []
    for e in engines:
        lines += _engine_series(e, kv=kv, old_kv=old_kv, new_kv=new_kv)
    lines += _cache_config_info(None if version in ("0.8", "0.9.0", "0.9.2") else engines)
    lines += [  # a histogram, as every version serves many
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{engine="{engines[0]}",le="0.001",model_name="m"}} 0.0',
        f'vllm:time_to_first_token_seconds_bucket{{engine="{engines[0]}",le="+Inf",model_name="m"}} 3.0',
        f'vllm:time_to_first_token_seconds_count{{engine="{engines[0]}",model_name="m"}} 3.0',
        f'vllm:time_to_first_token_seconds_sum{{engine="{engines[0]}",model_name="m"}} 0.42',
    ]
    return "\n".join(lines) + "\n"


def versioned_worker(dp: int, version: str, engines: list[int], kv: float = 0.375) -> ProgramWorker:
    worker = ProgramWorker(dp=dp)
    original = worker.handler

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            worker.metrics_scrapes += 1
            return httpx.Response(200, text=scrape_text(version, engines, kv))
        return await original(request)

    worker.handler = handler  # type: ignore[method-assign]
    return worker


def _ranks(doc: dict[str, Any]) -> list[tuple[float | None, bool]]:
    return [(r["vllm_kv_cache_usage"], r["observation_fresh"]) for r in doc["ranks"]]


async def test_vllm_0_8_kv_gauge_under_its_old_name_is_read(autojump_clock: trio.testing.MockClock) -> None:
    for version in ("0.8", "0.9.0", "0.10", "0.11"):
        worker = versioned_worker(1, version, [0])
        async with program_daemon(worker, metrics_interval_seconds=INTERVAL) as (handles, client):
            assert (await post(client, chat("first", "p0"))).status_code == 200
            await trio.sleep(1.0)
            doc = (await client.get("/scheduling/diagnostics")).json()
            assert _ranks(doc) == [(0.375, True)], version
            targets = (await client.get("/scheduling/diagnostics")).json()["proxy"]["targets"]
            assert [t["engine_missing"] for t in targets] == [False]


async def test_a_dp_server_listing_only_its_last_engine_keeps_every_rank(
    autojump_clock: trio.testing.MockClock, event_log: Any
) -> None:
    """vLLM 0.9.x with ``--data-parallel-size 2``: ``/metrics`` lists engine 1 only.  Both ranks stay
    in rotation and get requests; rank 1 is observed, rank 0 is accounted by agentd's own ledger."""
    worker = versioned_worker(2, "0.9.2", [1])
    async with program_daemon(worker, metrics_interval_seconds=INTERVAL) as (handles, client):
        assert (await post(client, chat("first", "p0"))).status_code == 200
        await trio.sleep(1.0)
        assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1]
        targets = (await client.get("/scheduling/diagnostics")).json()["proxy"]["targets"]
        assert [t["engine_missing"] for t in targets] == [False, False]
        doc = (await client.get("/scheduling/diagnostics")).json()
        assert _ranks(doc) == [(None, False), (0.375, True)]
        before = len(worker.seen)
        for i in range(4):
            assert (await post(client, chat(f"free{i}", None))).status_code == 200
        assert {s.rank for s in worker.seen[before:]} == {0, 1}
    assert event_log.named("worker_engine_missing") == []


async def test_a_one_rank_server_behind_an_external_balancer_is_observed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``vllm serve --data-parallel-rank 3 --data-parallel-external-lb``: one engine, ``engine="3"``.
    agentd's worker has one DP target (no rank header) and reads that engine's series."""
    worker = versioned_worker(1, "0.11", [3], kv=0.5)
    async with program_daemon(worker, metrics_interval_seconds=INTERVAL) as (handles, client):
        assert (await post(client, chat("first", "p0"))).status_code == 200
        await trio.sleep(1.0)
        doc = (await client.get("/scheduling/diagnostics")).json()
        assert _ranks(doc) == [(0.5, True)]
        assert doc["ranks"][0]["vllm_kv_capacity_tokens"] == 4096 * 16
        assert worker.seen[0].rank is None


async def test_a_hybrid_lb_server_is_observed_per_rank_from_its_engine_offset(
    autojump_clock: trio.testing.MockClock, event_log: Any
) -> None:
    """``vllm serve --data-parallel-size 4 --data-parallel-size-local 2 --data-parallel-start-rank 2
    --data-parallel-hybrid-lb``: the second node's server lists engines 2 and 3.  agentd's two DP
    targets there read them as ranks 0 and 1, send the local rank in the header, and neither rank
    is taken for missing."""
    worker = ProgramWorker(dp=2)
    original = worker.handler
    lines = _engine_series(2, kv=0.25, old_kv=False, new_kv=True) + _engine_series(3, kv=0.5, old_kv=False, new_kv=True)
    text = "\n".join(lines + _cache_config_info([2, 3])) + "\n"

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            worker.metrics_scrapes += 1
            return httpx.Response(200, text=text)
        return await original(request)

    worker.handler = handler  # type: ignore[method-assign]
    async with program_daemon(worker, metrics_interval_seconds=INTERVAL) as (handles, client):
        assert (await post(client, chat("first", "p0"))).status_code == 200
        await trio.sleep(1.0)
        doc = (await client.get("/scheduling/diagnostics")).json()
        assert _ranks(doc) == [(0.25, True), (0.5, True)]
        assert [r["vllm_kv_capacity_tokens"] for r in doc["ranks"]] == [4096 * 16] * 2
        assert [t.dp_rank for t in handles.health.healthy_targets()] == [0, 1]
        before = len(worker.seen)
        for i in range(4):
            assert (await post(client, chat(f"free{i}", None))).status_code == 200
        assert {s.rank for s in worker.seen[before:]} == {0, 1}
    assert event_log.named("worker_engine_missing") == []
