"""Program scheduling end to end: HTTP clients -> agentd -> a fake vLLM worker, in virtual time.

The daemon runs in process (``run_daemon(..., serve_http=False)``) and the client talks to the
real ASGI app (``create_app(handles)``) through ``httpx.ASGITransport``: the whole request path
(body read, validation, Program lease, forwarding, relay) runs without sockets, so the tests
run under ``autojump_clock`` and assert exact virtual times (request deadline, queue timeout,
minimum residence before a cross-rank resume, resume on completion rather than on a tick).
One test keeps real sockets (hypercorn on 127.0.0.1:0) for the client-disconnect path, with
generous budgets and no timing assertions.

The worker (``ProgramWorker``, an ``httpx.MockTransport`` handler) serves ``/metrics`` with
per-engine gauges the test controls, answers chat completions with usage (JSON or SSE), records
the virtual time at which each request reached it, and can hold a request open until the test
releases it (``hold(name)``).  Synchronisation uses ``ProgramDispatcher.wait_diagnostics``
(woken by scheduler steps) and worker events; no real sleeps.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from native_fakes import make_config

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig
from daemon.handles import DaemonHandles
from daemon.http.app import create_app
from daemon.supervisor import run_daemon

W0 = "http://w0:8000"
PROMPT_TOKENS = 20
# Virtual-time budget of each in-process test: a broken behaviour fails with TooSlowError at this
# virtual time (in milliseconds of real time) instead of hanging.
VIRTUAL_BUDGET_SECONDS = 120.0
# Real-time budget of the real-socket test: never reached on the success path.
REAL_BUDGET_SECONDS = 60.0


@attrs.define
class Seen:
    name: str
    rank: int | None
    stream: bool
    include_usage: bool | None
    at: float  # trio clock time at which the request reached the worker


class ProgramWorker:
    def __init__(self, urls: tuple[str, ...] = (W0,), dp: int = 1) -> None:
        self.urls = urls
        self.dp = dp
        self.waiting: dict[tuple[str, int], int] = {}
        self.seen: list[Seen] = []
        self.metrics_scrapes = 0
        self.holds: dict[str, trio.Event] = {}
        self.arrived: dict[str, trio.Event] = {}
        self.fail: set[str] = set()  # request names answered with HTTP 500
        self.down: set[str] = set()  # worker URLs whose health checks get HTTP 503

    def client(self, cfg: Any = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    def hold(self, name: str) -> None:
        self.holds[name] = trio.Event()

    def release(self, name: str) -> None:
        self.holds[name].set()

    def arrival(self, name: str) -> trio.Event:
        return self.arrived.setdefault(name, trio.Event())

    def order(self) -> list[str]:
        return [s.name for s in self.seen]

    def at(self, name: str) -> float:
        (at,) = [s.at for s in self.seen if s.name == name]
        return at

    async def handler(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if request.url.path == "/health":
            return httpx.Response(503 if base in self.down else 200)
        if request.url.path == "/metrics":
            self.metrics_scrapes += 1
            lines = []
            for e in range(self.dp):
                lines += [
                    f'vllm:num_requests_running{{engine="{e}"}} 0',
                    f'vllm:num_requests_waiting{{engine="{e}"}} {self.waiting.get((base, e), 0)}',
                    f'vllm:kv_cache_usage_perc{{engine="{e}"}} 0.0',
                ]
            return httpx.Response(200, text="\n".join(lines) + "\n")
        body = json.loads(await request.aread())
        name = body["messages"][-1]["content"]
        rank = request.headers.get("x-data-parallel-rank")
        include = (body.get("stream_options") or {}).get("include_usage")
        self.seen.append(
            Seen(name, None if rank is None else int(rank), bool(body.get("stream")), include, trio.current_time())
        )
        self.arrival(name).set()
        hold = self.holds.get(name)
        if hold is not None:
            await hold.wait()
        if name in self.fail:
            return httpx.Response(500, json={"error": {"message": "worker exploded"}})
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": 2,
            "total_tokens": PROMPT_TOKENS + 2,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        if not body.get("stream"):
            return httpx.Response(
                200,
                json={
                    "id": "c",
                    "object": "chat.completion",
                    "model": "m",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    ],
                    "usage": usage,
                },
            )
        chunks = [
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
            }
        ]
        if include:
            chunks.append({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": usage})
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())


def chat(name: str, program_id: str | None, *, stream: bool = False, **ctx: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": name}], "stream": stream}
    if program_id is not None:
        body["vllm_xargs"] = {"agentic_context": {"program_id": program_id, **ctx}}
    return body


def program_config(worker: ProgramWorker, **ps: Any) -> AgentdConfig:
    return attrs.evolve(
        make_config(worker.urls, dp=worker.dp, policy="round_robin"),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(**ps),
    )


async def start_with(
    nursery: trio.Nursery, worker: ProgramWorker, cfg: AgentdConfig, *, serve_http: bool = True
) -> DaemonHandles:
    return await nursery.start(
        partial(run_daemon, cfg, client_factory=worker.client, rng=random.Random(1), serve_http=serve_http)
    )


async def start(nursery: trio.Nursery, worker: ProgramWorker, *, serve_http: bool = True, **ps: Any) -> DaemonHandles:
    return await start_with(nursery, worker, program_config(worker, **ps), serve_http=serve_http)


@asynccontextmanager
async def in_process_client(handles: DaemonHandles) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the daemon's ASGI app: the HTTP request path without sockets."""
    transport = httpx.ASGITransport(create_app(handles))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://agentd") as client:
        yield client


@asynccontextmanager
async def configured_daemon(
    worker: ProgramWorker, cfg: AgentdConfig
) -> AsyncIterator[tuple[DaemonHandles, httpx.AsyncClient]]:
    """The daemon with ``cfg`` in process (no sockets) and a client on its app, within the virtual
    budget."""
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start_with(nursery, worker, cfg, serve_http=False)
            try:
                async with in_process_client(handles) as client:
                    yield handles, client
            finally:
                handles.shutdown.set()


@asynccontextmanager
async def program_daemon(worker: ProgramWorker, **ps: Any) -> AsyncIterator[tuple[DaemonHandles, httpx.AsyncClient]]:
    """The daemon with Program scheduling (``ps``: its fields) in process, as ``configured_daemon``."""
    async with configured_daemon(worker, program_config(worker, **ps)) as pair:
        yield pair


async def post(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=body)


def rank0(pred: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    return lambda d: pred(d["ranks"][0])


# One Program at a time fits: after one request a Program holds 20 + 100 (decode buffer) tokens.
# Ticks every 0.25 s (exact in binary floating point) from the first Program request at t = 0.
INTERVAL = 0.25
TINY = {"token_capacity_per_dp_rank": 150, "metrics_interval_seconds": INTERVAL}


@pytest.mark.parametrize(("resume_order", "expected"), [("fcfs", ["P1", "P2", "P3"]), ("mru", ["P3", "P2", "P1"])])
async def test_program_tiny_capacity_queues_and_resumes_in_order(
    autojump_clock: trio.testing.MockClock, resume_order: str, expected: list[str]
) -> None:
    worker = ProgramWorker()
    async with program_daemon(worker, resume_order=resume_order, **TINY) as (handles, client):
        ps = handles.program_dispatcher
        t0 = trio.current_time()
        async with trio.open_nursery() as reqs:
            for k, pid in enumerate(("p1", "p2", "p3")):  # finish order p1, p2, p3 (MRU: p3 most recent)
                await trio.sleep_until(t0 + k * 0.0625)
                assert (await post(client, chat(f"warm-{pid}", pid))).status_code == 200
            worker.hold("X")
            reqs.start_soon(post, client, chat("X", "x"))
            await worker.arrival("X").wait()
            results: dict[str, int] = {}

            async def send(name: str, pid: str) -> None:
                results[name] = (await post(client, chat(name, pid))).status_code

            async with trio.open_nursery() as senders:
                for n, (name, pid) in enumerate((("P1", "p1"), ("P2", "p2"), ("P3", "p3")), start=1):
                    senders.start_soon(send, name, pid)
                    await ps.wait_diagnostics(lambda d, n=n: d["retained_requests"] == n)
                assert ps.diagnostics()["ranks"][0]["router_queued_programs"] == 3
                # X completes between two ticks: each completion admits the next one at once
                await trio.sleep_until(t0 + 5.125)
                assert ps.diagnostics()["retained_requests"] == 3
                worker.release("X")
        assert results == {"P1": 200, "P2": 200, "P3": 200}
        assert [(s.name, s.at - t0) for s in worker.seen[-4:]] == [("X", 0.125)] + [(e, 5.125) for e in expected]


async def test_program_priority_and_deadline(autojump_clock: trio.testing.MockClock) -> None:
    worker = ProgramWorker()
    async with program_daemon(worker, **TINY) as (handles, client):
        ps = handles.program_dispatcher
        t0 = trio.current_time()
        async with trio.open_nursery() as reqs:
            worker.hold("X")
            reqs.start_soon(post, client, chat("X", "x"))
            await worker.arrival("X").wait()
            async with trio.open_nursery() as senders:
                senders.start_soon(post, client, chat("LOW", "low"))
                await ps.wait_diagnostics(lambda d: d["retained_requests"] == 1)
                senders.start_soon(post, client, chat("HIGH", "high", priority=5))
                await ps.wait_diagnostics(lambda d: d["retained_requests"] == 2)
                # a 1.5 s request deadline forces resume while X still holds the rank
                await trio.sleep_until(t0 + 1.125)
                senders.start_soon(post, client, chat("DL", "dl", deadline_seconds=1.5))
                await worker.arrival("DL").wait()
                assert trio.current_time() - t0 == 2.625  # exactly at its deadline, not on a tick
                assert not worker.holds["X"].is_set()
                await trio.sleep_until(t0 + 4.0)
                worker.release("X")
        assert [(s.name, s.at - t0) for s in worker.seen] == [("X", 0.0), ("DL", 2.625), ("HIGH", 4.0), ("LOW", 4.0)]
        assert (
            handles.registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total", {"target": W0, "reason": "force_resume"}
            )
            == 1.0
        )


async def test_program_segment_yield_lets_the_waiter_in(autojump_clock: trio.testing.MockClock) -> None:
    worker = ProgramWorker()
    async with program_daemon(worker, max_segment_rounds=1, **TINY) as (handles, client):
        ps = handles.program_dispatcher
        t0 = trio.current_time()
        async with trio.open_nursery() as reqs:
            worker.hold("A")
            # a 60 s retention hint would keep A's KV reserved; the completed segment yields instead
            reqs.start_soon(post, client, chat("A", "a", kv_retention_ttl_seconds=60))
            await worker.arrival("A").wait()
            reqs.start_soon(post, client, chat("B", "b"))
            await ps.wait_diagnostics(lambda d: d["retained_requests"] == 1)
            await trio.sleep_until(t0 + 2.125)
            worker.release("A")
            await worker.arrival("B").wait()
        assert worker.at("B") - t0 == 2.125  # admitted on A's completion, not after A's 60 s retention
        diag = await ps.wait_diagnostics(lambda d: d["ranks"][0]["router_in_flight_requests"] == 0)
        (a,) = [p for p in diag["ranks"][0]["programs"] if p["root_program_id"] == "a"]
        assert (a["state"], a["pause_reason"]) == ("paused", "max_segment_yield")
        assert (
            handles.registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total", {"target": W0, "reason": "max_segment_yield"}
            )
            == 1.0
        )


async def test_program_cross_rank_resume_with_global_queue(autojump_clock: trio.testing.MockClock) -> None:
    worker = ProgramWorker(dp=2)
    async with program_daemon(
        worker,
        global_queue=True,
        stats_window_size=1,
        max_acting_ttl_seconds=0.0,
        metrics_interval_seconds=INTERVAL,
    ) as (handles, client):
        ps = handles.program_dispatcher
        t0 = trio.current_time()
        # mature both ranks' request windows (stats_window_size = 1)
        k = 0
        while not all(r["rolling"]["request_window_complete"] for r in ps.diagnostics()["ranks"]):
            k += 1
            assert (await post(client, chat(f"warm{k}", f"w{k}"))).status_code == 200
        assert (await post(client, chat("P-first", "p"))).status_code == 200
        home = worker.seen[-1].rank
        assert home is not None
        other = 1 - home
        await trio.sleep_until(t0 + 0.125)  # after the first scrape round (t0), before the next one
        worker.waiting[(W0, home)] = 1  # the home rank's vLLM queue closes the waiting gate
        await ps.wait_diagnostics(
            lambda d: d["ranks"][home]["vllm_waiting_requests"] == 1 and d["ranks"][home]["observation_fresh"]
        )
        assert trio.current_time() - t0 == 0.25
        await trio.sleep_until(t0 + 1.125)
        response = await post(client, chat("P-second", "p"))
        assert response.status_code == 200
    assert (worker.seen[-1].name, worker.seen[-1].rank) == ("P-second", other)
    # queued at 1.125; the tick at 1.25 is too early (minimum residence: one metrics interval);
    # the tick at 1.5 moves it to the other rank
    assert worker.seen[-1].at - t0 == 1.5
    assert (
        handles.registry.get_sample_value(
            "vllm_router_agent_aware_transitions_total", {"target": f"{W0}@{other}", "reason": "cross_rank_resume"}
        )
        == 1.0
    )


async def test_program_waiting_gate_holds_programs_not_identity_free_traffic(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker = ProgramWorker()
    async with program_daemon(worker, metrics_interval_seconds=INTERVAL) as (handles, client):
        ps = handles.program_dispatcher
        t0 = trio.current_time()
        async with trio.open_nursery() as reqs:
            assert (await post(client, chat("warm", "w"))).status_code == 200
            await trio.sleep_until(t0 + 0.125)  # after the first scrape round (t0), before the next one
            worker.waiting[(W0, 0)] = 1
            await ps.wait_diagnostics(rank0(lambda r: r["vllm_waiting_requests"] == 1 and r["observation_fresh"]))
            assert trio.current_time() - t0 == 0.25  # the first scrape after the change
            reqs.start_soon(post, client, chat("GATED", "g"))
            await ps.wait_diagnostics(lambda d: d["retained_requests"] == 1)
            plain = await post(client, chat("PLAIN", None))
            assert plain.status_code == 200
            await trio.sleep_until(t0 + 3.125)
            assert "GATED" not in worker.order()
            worker.waiting[(W0, 0)] = 0
            await worker.arrival("GATED").wait()
    assert [(s.name, s.at - t0) for s in worker.seen] == [("warm", 0.0), ("PLAIN", 0.25), ("GATED", 3.25)]


async def _disconnect_while_queued(worker: ProgramWorker, ps: Any, client: httpx.AsyncClient) -> None:
    """X holds the only slot; Q queues behind it and its client goes away; the ledger ends at zero."""
    async with trio.open_nursery() as reqs:
        worker.hold("X")
        reqs.start_soon(post, client, chat("X", "x"))
        await worker.arrival("X").wait()
        gone = trio.CancelScope()

        async def queued() -> None:
            with gone:  # the client gives up (its connection closes) while the request is queued
                await post(client, chat("Q", "q"))

        reqs.start_soon(queued)
        await ps.wait_diagnostics(lambda d: d["retained_requests"] == 1)
        gone.cancel()
        await ps.wait_diagnostics(lambda d: d["retained_requests"] == 0)
        worker.release("X")
    diag = await ps.wait_diagnostics(
        rank0(lambda r: r["router_in_flight_requests"] == 0 and r["router_active_programs"] == 0)
    )
    rank = diag["ranks"][0]
    assert rank["router_estimated_used_tokens"] == 0
    assert rank["router_queued_requests"] == 0
    assert diag["dispatcher"]["abandoned_count"] == 1
    assert "Q" not in worker.order()


async def test_program_client_disconnect_while_queued_leaves_ledger_at_zero(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker = ProgramWorker()
    async with program_daemon(worker, **TINY) as (handles, client):
        await _disconnect_while_queued(worker, handles.program_dispatcher, client)


async def test_program_client_disconnect_over_a_real_socket_while_queued() -> None:
    """The socket path: hypercorn reports the closed connection, the queued request is abandoned."""
    worker = ProgramWorker()
    with trio.fail_after(REAL_BUDGET_SECONDS):  # generous; only reached if the behaviour breaks
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, worker, **TINY)
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=REAL_BUDGET_SECONDS) as client:
                await _disconnect_while_queued(worker, handles.program_dispatcher, client)
            handles.shutdown.set()


async def test_program_forced_resume_goes_through_a_closed_waiting_gate(autojump_clock: trio.testing.MockClock) -> None:
    # docs/program-scheduling.md §10 (D6 fix): the gate holds ordinary admissions, but a due
    # force-resume deadline admits the Program whatever the engine's queue shows -- so its request
    # is served instead of being rejected at its queue timeout
    worker = ProgramWorker()
    async with program_daemon(
        worker, metrics_interval_seconds=INTERVAL, queue_timeout_seconds=2.0, force_resume_timeout_seconds=1.0
    ) as (handles, client):
        ps = handles.program_dispatcher
        t0 = trio.current_time()
        assert (await post(client, chat("warm", "w"))).status_code == 200
        await trio.sleep_until(t0 + 0.125)  # after the first scrape round (t0), before the next one
        worker.waiting[(W0, 0)] = 1  # the gate holds every ordinary Program admission
        await ps.wait_diagnostics(rank0(lambda r: r["vllm_waiting_requests"] == 1 and r["observation_fresh"]))
        assert trio.current_time() - t0 == 0.25
        await trio.sleep_until(t0 + 0.375)
        r = await post(client, chat("LATE", "late"))
        assert r.status_code == 200
        assert ps.diagnostics()["forced_admissions"] == 1
    assert (worker.seen[-1].name, worker.seen[-1].at - t0) == ("LATE", 1.375)  # at its force-resume deadline
    assert ps.diagnostics()["retained_requests"] == 0


async def test_program_worker_failure_is_502_and_leaves_the_program_consistent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker = ProgramWorker()
    worker.fail.add("BOOM")
    async with program_daemon(worker, **TINY) as (handles, client):
        ps = handles.program_dispatcher
        assert (await post(client, chat("BOOM", "p"))).status_code == 502
        # the response may reach the client before the scheduler has stepped on the completion
        diag = await ps.wait_diagnostics(rank0(lambda r: r["router_in_flight_requests"] == 0))
        (prog,) = diag["ranks"][0]["programs"]
        assert (prog["state"], prog["pause_reason"], prog["in_flight_requests"]) == ("paused", "request_failed", 0)
        assert diag["ranks"][0]["router_estimated_used_tokens"] == 0
        # the Program continues normally afterwards
        assert (await post(client, chat("fine", "p"))).status_code == 200
    assert (
        handles.registry.get_sample_value(
            "vllm_router_agent_aware_transitions_total", {"target": W0, "reason": "request_failed"}
        )
        == 1.0
    )
