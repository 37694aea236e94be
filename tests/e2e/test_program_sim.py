"""Program scheduling over HTTP in front of the embedded simulated vLLM backend.

The simulated rank has a 1024-token KV pool and ``token_capacity_per_dp_rank`` says the same, so
backend accounting (``vllm:kv_cache_usage_perc`` x capacity) and the Router ledger agree.  Each
Program needs about 400 tokens: two run, the others are retained in the RequestPool and resume in
arrival order as capacity frees up.

Every test runs under ``autojump_clock`` with the simulated cluster in deterministic mode and the
daemon in process (``serve_http=False``); the HTTP tests talk to the daemon's ASGI app through
``httpx.ASGITransport``, so no test depends on real time or sockets.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from log_capture import EventLog
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig, EmbeddedConfig, RoutingConfig, ServerConfig
from daemon.http.proxy import CollectingSink
from daemon.supervisor import run_daemon

TARGET = "http://embedded-sim@0"


def sim_config(**ps: Any) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(policy="round_robin"),
        embedded=EmbeddedConfig(
            num_workers=1, dp_size=1, num_gpu_blocks=64, block_size=16, time_scale=50.0, model="sim-model"
        ),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(
            token_capacity_per_dp_rank=1024, metrics_interval_seconds=0.05, **ps
        ),
    )


def body(program_id: str, max_tokens: int = 16) -> dict[str, Any]:
    words = " ".join(f"{program_id}-word{i}" for i in range(120))  # ~300 estimated prompt tokens
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": max_tokens,
        "vllm_xargs": {"agentic_context": {"program_id": program_id}},
    }


def deterministic(c: Any) -> Any:
    return attrs.evolve(c, deterministic=True)


async def test_program_sim_tiny_capacity_queues_over_http(autojump_clock: trio.testing.MockClock) -> None:
    cfg = sim_config()
    # a request takes ~0.25 s of virtual time; the four are sent at the same virtual instant
    cfg = attrs.evolve(cfg, embedded=attrs.evolve(cfg.embedded, time_scale=1.0))
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            ps = handles.program_dispatcher
            statuses: dict[str, int] = {}
            async with in_process_client(handles) as client:

                async def send(pid: str) -> None:
                    statuses[pid] = (await client.post("/v1/chat/completions", json=body(pid, 32))).status_code

                async with trio.open_nursery() as senders:
                    for pid in ("p1", "p2", "p3", "p4"):
                        senders.start_soon(send, pid)
                diag = await ps.wait_diagnostics(
                    lambda d: d["ranks"][0]["router_in_flight_requests"] == 0 and d["retained_requests"] == 0
                )
            assert statuses == {"p1": 200, "p2": 200, "p3": 200, "p4": 200}
            rank = diag["ranks"][0]
            assert rank["capacity_accounting_source"] == "backend_observation"
            assert rank["vllm_kv_capacity_tokens"] == 1024
            assert rank["router_estimated_used_tokens"] == 0
            assert rank["rolling"]["request_samples"] == 4
            assert rank["rolling"]["avg_router_queue_seconds"] > 0  # two of them had to wait
            handles.request_shutdown()


ARRIVAL_GAP = 0.01  # virtual seconds between arrivals, far below one request's ~0.25 s


async def test_program_sim_resumes_in_arrival_order_in_virtual_time(
    autojump_clock: trio.testing.MockClock, event_log: EventLog
) -> None:
    cfg = sim_config(resume_order="fcfs")
    # real simulated speed in virtual time: a request takes ~0.25 s; the four arrivals are spaced
    # ARRIVAL_GAP apart (distinct arrival instants, so FCFS cannot fall back on a tie-break such as
    # the Program id) and all land while p1 and p2 still hold the capacity
    cfg = attrs.evolve(cfg, embedded=attrs.evolve(cfg.embedded, time_scale=1.0))
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
        ps = handles.program_dispatcher
        sinks: dict[str, CollectingSink] = {}
        started: dict[str, float] = {}
        t0 = trio.current_time()

        async def send(pid: str) -> None:
            raw = json.dumps(body(pid)).encode()
            sink = sinks[pid] = CollectingSink()
            started[pid] = trio.current_time()
            await handles.handle(handles.build_request("chat", raw, {}), sink, raw_body=raw)

        async with trio.open_nursery() as senders:
            for n, pid in enumerate(("p1", "p2", "p3", "p4"), start=1):
                senders.start_soon(send, pid)
                # the core registered this Program (woken by that very step) before the next one is sent
                await ps.wait_diagnostics(lambda d, n=n: d["live_programs"] == n)
                if n < 4:
                    await trio.sleep(ARRIVAL_GAP)
            peak = ps.diagnostics()
            assert trio.current_time() - t0 == pytest.approx(3 * ARRIVAL_GAP)
        assert {pid: at - t0 for pid, at in started.items()} == pytest.approx(
            {"p1": 0.0, "p2": ARRIVAL_GAP, "p3": 2 * ARRIVAL_GAP, "p4": 3 * ARRIVAL_GAP}
        )
        diag = await ps.wait_diagnostics(lambda d: d["ranks"][0]["router_in_flight_requests"] == 0)
        assert {pid: s.status for pid, s in sinks.items()} == {"p1": 200, "p2": 200, "p3": 200, "p4": 200}
        assert peak["retained_requests"] == 2  # p1 and p2 fit in 1024 tokens; p3 and p4 wait
        ids = {p["root_program_id"]: p["program"] for r in diag["ranks"] for p in r["programs"]}
        admitted = [fields["program"] for _, fields in event_log.named("program_admit")]
        assert admitted == [ids["p1"], ids["p2"], ids["p3"], ids["p4"]]
        assert diag["ranks"][0]["router_estimated_used_tokens"] == 0
        handles.request_shutdown()


SEED_METRICS = (
    "request_interval_seconds",
    "cache_miss_impact_seconds",
    "armed_ttl_seconds",
    "transitions_total",
    "context_growth_tokens",
    "shared_prefix_observed_tokens",
    "rank_queue_size",
    "queue_wait_seconds",
    "rank_active_programs",
    "admission_used_tokens",
    "admission_required_tokens",
    "admission_growth_reserve_tokens",
    "admission_capacity_pressure_ratio",
    "admission_projected_pressure_ratio",
    "capacity_observation_fresh",
)


async def test_program_sim_tuning_workflow_signals_exist(autojump_clock: trio.testing.MockClock) -> None:
    """Every signal the seed's tuning workflow names is served after a little agent traffic."""
    cfg = sim_config()
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
        ps = handles.program_dispatcher
        with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
            async with in_process_client(handles) as client:
                for _turn in range(2):  # two turns: the second one is a continuity sample (request interval)
                    for pid in ("a", "b"):
                        r = await client.post("/v1/chat/completions", json=body(pid))
                        assert r.status_code == 200
                await ps.wait_diagnostics(lambda d: d["backend_polling_started"] and d["ranks"][0]["observation_fresh"])
                text = (await client.get("/metrics")).text
                diag = (await client.get("/scheduling/diagnostics")).json()
        for name in SEED_METRICS:
            assert f"# TYPE vllm_router_agent_aware_{name} " in text, name
        for observed in (
            "request_interval_seconds_count",
            "cache_miss_impact_seconds_count",
            "armed_ttl_seconds_count",
            "admission_used_tokens_count",
            "queue_wait_seconds_count",
        ):
            assert f"vllm_router_agent_aware_{observed}{{" in text, observed
        rank = diag["ranks"][0]
        for field in (
            "observation_age_seconds",
            "observation_fresh",
            "capacity_accounting_source",
            "rolling",
            "programs",
            "router_queued_programs",
            "vllm_running_requests",
            "vllm_waiting_requests",
        ):
            assert field in rank, field
        assert rank["rolling"]["continuity_samples"] == 2
        assert {p["root_program_id"] for p in rank["programs"]} == {"a", "b"}
        handles.request_shutdown()
