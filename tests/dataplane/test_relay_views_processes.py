"""Two relay processes over real sockets: each relay's own view of its leases and resume passes
agrees with the scheduler's after a burst of Program requests with clients dropping mid-stream, and
no mismatch is reported (docs/operations.md §13.3).

Nothing asserts a duration: waits are for conditions, with generous budgets (a loaded machine)."""

from __future__ import annotations

import random
from typing import Any

import httpx
import trio
from fault_env import BUDGET_SECONDS, await_diagnostics, relay_views_agree
from fault_worker import Act, FaultWorker
from prometheus_client.parser import text_string_to_metric_families
from test_relay_processes import CHAT, relay_config

from daemon.supervisor import run_daemon

PROGRAMS = 8
ROUNDS = 5


def _body(program_id: str) -> dict[str, Any]:
    # acting for 30 s after each request: at rest the relays still hold the Programs' passes
    context = {"program_id": program_id, "kv_retention_ttl_seconds": 30}
    return {**CHAT, "stream": True, "vllm_xargs": {"agentic_context": context}}


def _views_at_rest(doc: dict[str, Any]) -> bool:
    """No lease open anywhere, and every relay's view agrees with the scheduler's (the passes the
    Programs keep while acting are the same on both sides)."""
    if doc["data_plane"]["open_leases"] != 0 or not doc["invariants"]["at_rest"]:
        return False
    relays = doc["data_plane"]["relays"]
    return relay_views_agree(doc) and all(r["views"]["scheduler"]["leases"] == 0 for r in relays)


async def test_both_views_agree_after_a_burst_with_clients_dropping_mid_stream() -> None:
    rng = random.Random(30)
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        worker.default = Act(events=8, delay=0.01)  # ~80 ms streams: a drop lands mid-way
        done = trio.Event()

        async def daemon(task_status: trio.TaskStatus[Any]) -> None:
            await run_daemon(relay_config(worker.url), task_status=task_status)
            done.set()

        handles = await nursery.start(daemon)
        url = handles.http_url
        dropped = completed = 0

        async def program(i: int) -> None:
            nonlocal dropped, completed
            client = httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS)
            try:
                for _ in range(ROUNDS):  # back to back on one connection: the relay's pass is used
                    async with client.stream("POST", "/v1/chat/completions", json=_body(f"burst-{i}")) as response:
                        assert response.status_code == 200
                        if rng.random() < 0.4:
                            async for _chunk in response.aiter_raw():
                                break  # gone after the first bytes: the relay abandons the lease
                            dropped += 1
                            await client.aclose()
                            client = httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS)
                            continue
                        text = (await response.aread()).decode()
                        assert text.endswith("data: [DONE]\n\n")
                        completed += 1
            finally:
                await client.aclose()

        with trio.fail_after(BUDGET_SECONDS * 3):
            async with trio.open_nursery() as burst:
                for i in range(PROGRAMS):
                    burst.start_soon(program, i)
        assert dropped > 0 and completed > 0

        async with httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS) as client:
            doc = await await_diagnostics(client, _views_at_rest)
            plane = doc["data_plane"]
            assert plane["passes"]["issued_count"] > 0 and plane["passes"]["passed_count"] > 0, plane["passes"]
            assert plane["view_mismatches_count"] == 0
            for relay in plane["relays"]:
                views = relay["views"]
                assert (views["suspected"], views["suspected_count"], views["differed_count"]) == (False, 0, 0), views
                assert views["comparisons_count"] > 0
            assert doc["dispatcher"]["abandoned_count"] > 0  # the drops reached the scheduler
            families = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
            [total] = families["agentd_data_plane_view_mismatches"].samples
            assert total.value == 0.0
            flags = families["agentd_data_plane_relay_view_mismatch"].samples
            assert sorted((s.labels["relay"], s.value) for s in flags) == [("0", 0.0), ("1", 0.0)]
        handles.request_shutdown()
        with trio.fail_after(BUDGET_SECONDS):
            await done.wait()
        nursery.cancel_scope.cancel()
