"""Batch-class requests through the daemon, in front of the embedded simulated backend (docs/batch.md §2).

In process under ``autojump_clock`` (deterministic simulated cluster, ``serve_http=False``): the
HTTP requests reach the daemon's ASGI app through ``httpx.ASGITransport``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs
import trio
import trio.testing
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client
from test_program_sim import body, deterministic, sim_config

from actors.core.config import BatchJobsConfig
from daemon.config import AgentdConfig
from daemon.supervisor import run_daemon


def batch_config(ps: dict[str, Any] | None = None, **batch: Any) -> AgentdConfig:
    cfg = sim_config()
    if ps:
        assert cfg.program_scheduling is not None
        cfg = attrs.evolve(cfg, program_scheduling=attrs.evolve(cfg.program_scheduling, **ps))
    return attrs.evolve(cfg, batch_jobs=BatchJobsConfig(enabled=True, **batch))


def batch_body(i: int, max_tokens: int = 8, words_count: int = 40) -> dict[str, Any]:
    words = " ".join(f"b{i}-word{k}" for k in range(words_count))  # 40 words: ~100 estimated prompt tokens
    return {"model": "sim-model", "messages": [{"role": "user", "content": words}], "max_tokens": max_tokens}


async def test_batch_requests_are_scheduled_by_job_and_reported(autojump_clock: trio.testing.MockClock) -> None:
    cfg = batch_config()
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            statuses: list[int] = []
            async with in_process_client(handles) as client:

                async def send(i: int) -> None:
                    headers = {"x-request-id": f"req-{i}#job_name[eval]#"} if i % 2 else {"x-agentd-class": "batch"}
                    r = await client.post("/v1/chat/completions", json=batch_body(i), headers=headers)
                    statuses.append(r.status_code)

                async with trio.open_nursery() as senders:
                    for i in range(12):
                        senders.start_soon(send, i)
                # completions reach the scheduler after the responses: wait for its next steps
                diag = await handles.program_dispatcher.wait_diagnostics(lambda d: d["batch"]["running"] == 0)
                metrics = (await client.get("/metrics")).text
            nursery.cancel_scope.cancel()
    assert statuses == [200] * 12
    batch = diag["batch"]
    assert batch["enabled"] is True and batch["queued"] == 0 and batch["running"] == 0
    jobs = {j["job"]: j for j in batch["jobs"]}
    # the simulated answers stop at max_tokens ("length"): no natural stop, no estimate, so the
    # jobs are forgotten once idle -- unless a counter remains; either way nothing is left queued
    for j in jobs.values():
        assert j["queued"] == 0 and j["running"] == 0
    assert "agentd_batch_admitted_total" in metrics
    assert "agentd_batch_rank_growth_reserve_tokens{" in metrics
    assert 'agentd_router_queued_requests{class="batch"} 0.0' in metrics
    # Programs saw no batch request: the Program dispatcher counted none of them as Programs
    assert diag["retained_requests"] == 0


async def test_batch_class_header_is_validated(autojump_clock: trio.testing.MockClock) -> None:
    cfg = batch_config()
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            async with in_process_client(handles) as client:
                bad = await client.post("/v1/chat/completions", json=batch_body(1), headers={"x-agentd-class": "vip"})
                bad_id = await client.post("/v1/chat/completions", json={**batch_body(1), "request_id": 7})
                opted_out = await client.post(
                    "/v1/chat/completions",
                    json=batch_body(2),
                    headers={"x-agentd-class": "interactive", "x-request-id": "x#job_name[j]#"},
                )
                diag = (await client.get("/scheduling/diagnostics")).json()
            nursery.cancel_scope.cancel()
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "x-agentd-class" and "vip" in bad.json()["error"]["message"]
    assert bad_id.status_code == 400 and bad_id.json()["error"]["param"] == "request_id"
    assert opted_out.status_code == 200
    assert diag["batch"]["jobs"] == []  # the opted-out request never reached the batch queue


async def test_programs_and_batch_share_the_ledger(autojump_clock: trio.testing.MockClock) -> None:
    """A batch job arriving first does not keep a Program out for longer than its requests run:
    batch admission stops while the Program waits, and every request completes."""
    cfg = batch_config()
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            statuses: dict[str, int] = {}
            async with in_process_client(handles) as client:

                async def send_batch(i: int) -> None:
                    r = await client.post(
                        "/v1/chat/completions", json=batch_body(i, 24), headers={"x-request-id": f"{i}#job_name[j]#"}
                    )
                    statuses[f"b{i}"] = r.status_code

                async def send_program() -> None:
                    await trio.sleep(0.01)
                    r = await client.post("/v1/chat/completions", json=body("agent", 16))
                    statuses["agent"] = r.status_code

                async with trio.open_nursery() as senders:
                    for i in range(16):
                        senders.start_soon(send_batch, i)
                    senders.start_soon(send_program)
                diag = await handles.program_dispatcher.wait_diagnostics(lambda d: d["batch"]["running"] == 0)
            nursery.cancel_scope.cancel()
    assert set(statuses.values()) == {200} and len(statuses) == 17
    assert diag["batch"]["queued"] == 0
    assert all(r["charged_tokens"] == 0 for r in diag["batch"]["ranks"])


async def test_a_program_preempts_batch_work_which_then_completes_once(autojump_clock: trio.testing.MockClock) -> None:
    """Non-streaming batch requests fill the rank; a Program arrives and preempts the youngest of
    them (their upstream calls are cancelled); every batch client still gets exactly one 200."""
    cfg = batch_config(guaranteed_kv_share=0.0, max_decode_slowdown=100.0)
    cfg = attrs.evolve(cfg, embedded=attrs.evolve(cfg.embedded, time_scale=1.0))  # ~2 s per batch answer
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            results: dict[str, tuple[int, Any]] = {}
            async with in_process_client(handles) as client:

                async def send_batch(i: int) -> None:
                    r = await client.post(
                        "/v1/chat/completions",
                        json=batch_body(i, 300, words_count=120),
                        headers={"x-request-id": f"b{i}#job_name[long]#"},
                    )
                    results[f"b{i}"] = (r.status_code, r.json())

                async def send_program() -> None:
                    await trio.sleep(0.5)  # the batch requests are decoding by now
                    r = await client.post("/v1/chat/completions", json=body("agent", 16))
                    results["agent"] = (r.status_code, r.json())

                async with trio.open_nursery() as senders:
                    for i in range(3):
                        senders.start_soon(send_batch, i)
                    senders.start_soon(send_program)
                diag = await handles.program_dispatcher.wait_diagnostics(lambda d: d["batch"]["running"] == 0)
            nursery.cancel_scope.cancel()
    assert {k: v[0] for k, v in results.items()} == {"b0": 200, "b1": 200, "b2": 200, "agent": 200}
    assert diag["batch"]["preemptions"] >= 1
    for i in range(3):
        answer = results[f"b{i}"][1]
        assert answer["usage"]["completion_tokens"] == 300  # one whole answer, not a cut one
    (job,) = [j for j in diag["batch"]["jobs"] if j["job"] == "long"] or [None]
    assert job is None or job["completed"] == 3
