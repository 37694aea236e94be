"""The interactive class ahead of agent and batch work, end to end (docs/priority.md §5.5).

Batch requests and Programs saturate a one-rank embedded simulated cluster (requests wait in the
router); an identity-free interactive request arriving then is admitted ahead of every one of them.
Once in process under ``autojump_clock`` (exact virtual times), once over real sockets.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs
import httpx
import trio
import trio.testing
from test_batch_class_sim import batch_body
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client
from test_program_sim import body, deterministic, sim_config

from actors.core.config import BatchJobsConfig
from daemon.config import AgentdConfig, PriorityRule, PrioritySection
from daemon.supervisor import run_daemon

BATCH_COUNT = 4
PROGRAM_COUNT = 4


def saturated_config(**priority: Any) -> AgentdConfig:
    cfg = sim_config()
    return attrs.evolve(
        cfg,
        embedded=attrs.evolve(cfg.embedded, time_scale=1.0, scheduling_policy="priority"),
        batch_jobs=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0),
        priority=PrioritySection(interactive_scheduling=True, **priority),
    )


def interactive_body() -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": "quick question"}], "max_tokens": 8}


async def saturate_then_ask(client: httpx.AsyncClient, wait_queued: Any) -> dict[str, tuple[int, float, float]]:
    """(status, sent at, done at) per request: batch and Program work first, the interactive request
    once some of it waits in the router."""
    done: dict[str, tuple[int, float, float]] = {}

    async def post(name: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        sent = trio.current_time()
        r = await client.post("/v1/chat/completions", json=payload, headers=headers or {})
        done[name] = (r.status_code, sent, trio.current_time())

    async with trio.open_nursery() as senders:
        for i in range(BATCH_COUNT):
            senders.start_soon(post, f"b{i}", batch_body(i, 120, words_count=120), {"x-agentd-class": "batch"})
        for i in range(PROGRAM_COUNT):
            senders.start_soon(post, f"p{i}", body(f"p{i}", 120))
        await wait_queued()
        await trio.sleep(0.3)  # the admitted work is decoding now
        senders.start_soon(post, "interactive", interactive_body(), {"x-agentd-tenant": "alice"})
    return done


def assert_served_ahead(done: dict[str, tuple[int, float, float]]) -> list[str]:
    assert {name: status for name, (status, _, _) in done.items()} == dict.fromkeys(done, 200)
    asked = done["interactive"][1]
    answered = done["interactive"][2]
    overtaken = sorted(n for n, (_, _, end) in done.items() if n != "interactive" and end > answered)
    # every request still unanswered when the interactive one arrived ended after it
    still_running = sorted(n for n, (_, _, end) in done.items() if n != "interactive" and end > asked)
    assert overtaken == still_running and len(still_running) >= 4, (overtaken, still_running)
    return still_running


async def test_interactive_is_served_ahead_of_saturating_batch_and_agents(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = saturated_config()
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            ps = handles.program_dispatcher

            async def wait_queued() -> None:
                await ps.wait_diagnostics(lambda d: d["batch"]["queued"] > 0 and d["retained_requests"] > 0)

            async with in_process_client(handles) as client:
                done = await saturate_then_ask(client, wait_queued)
                diag = (await client.get("/scheduling/diagnostics")).json()
                metrics = (await client.get("/metrics")).text
            nursery.cancel_scope.cancel()
    assert_served_ahead(done)
    # one short answer (8 tokens) beside the running work: 0.166 s of virtual time here, while
    # the first saturating request ends at 1.53 s
    assert done["interactive"][2] - done["interactive"][1] < 0.5
    fairness = diag["fairness"]
    assert fairness["classes"]["interactive"]["completed"] == 1
    assert fairness["classes"]["batch"]["completed"] == BATCH_COUNT
    assert fairness["classes"]["agent"]["completed"] == PROGRAM_COUNT
    assert fairness["tenants"]["alice"]["completed"] == 1
    accounts = fairness["scheduler"]  # the core's VTC accounts by tenant label
    assert accounts["alice"]["dispatched"] == 1 and accounts["alice"]["counter"] > 0
    # a preempted batch request is dispatched again (same-instant completions reach the scheduler
    # in task order, docs/architecture.md §7, so the number of preemptions may vary by one or two)
    assert accounts["default"]["dispatched"] >= BATCH_COUNT + PROGRAM_COUNT
    assert 'agentd_tenant_virtual_counter{tenant="alice"}' in metrics
    # queued behind nothing: its router wait is far below the waits of the saturating work
    interactive_wait = fairness["classes"]["interactive"]["wait_seconds_max"]
    assert interactive_wait < fairness["classes"]["batch"]["wait_seconds_max"]
    assert interactive_wait < fairness["classes"]["agent"]["wait_seconds_max"]
    assert 'agentd_class_requests_total{class="interactive",outcome="completed",tenant="alice"} 1.0' in metrics


async def test_interactive_is_served_ahead_over_sockets() -> None:
    cfg = saturated_config()
    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg))
            ps = handles.program_dispatcher

            async def wait_queued() -> None:
                await ps.wait_diagnostics(lambda d: d["batch"]["queued"] > 0 and d["retained_requests"] > 0)

            async with httpx.AsyncClient(base_url=handles.http_url, timeout=60) as client:
                done = await saturate_then_ask(client, wait_queued)
            handles.shutdown.set()
    assert_served_ahead(done)


async def test_program_requests_carry_the_edge_priority_and_tenant(autojump_clock: trio.testing.MockClock) -> None:
    """A Program request's vLLM-convention ``priority`` reaches the core as ``hints.priority`` (larger
    first), capped by the operator's rule, and its tenant is charged in the core's VTC account."""
    cfg = saturated_config(rules=(PriorityRule(header="x-agentd-tenant=bob", max_priority=3),))
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            async with in_process_client(handles) as client:
                alice = await client.post(
                    "/v1/chat/completions", json={**body("pa"), "priority": -5}, headers={"x-agentd-tenant": "alice"}
                )
                bob = await client.post(
                    "/v1/chat/completions", json={**body("pb"), "priority": -5}, headers={"x-agentd-tenant": "bob"}
                )
                diag = (await client.get("/scheduling/diagnostics")).json()
                # the core's Programs (read between steps): priority and tenant of their latest request
                programs = {k.program_id: p for k, p in handles.program_dispatcher.scheduler.state.programs.items()}
            nursery.cancel_scope.cancel()
    assert (alice.status_code, bob.status_code) == (200, 200)
    assert (programs["pa"].priority, programs["pa"].tenant) == (5, "alice")  # vLLM -5 = agentd 5
    assert (programs["pb"].priority, programs["pb"].tenant) == (3, "bob")  # capped by the rule
    accounts = diag["fairness"]["scheduler"]
    assert accounts["alice"]["dispatched"] == 1 and accounts["bob"]["dispatched"] == 1
    assert diag["fairness"]["classes"]["agent"]["completed"] == 2
