"""A worker that dies under Program scheduling with two relay processes (docs/operations.md §11.2,
§11.4, §13.1), over real sockets: a burst of new Programs, some placed on the dead worker before
anyone knew, all get their answer from the other worker - each request whose connect was refused
fails over once, never back to the worker that refused it.

Before session 31 the failover of such a request was forwarded to the dead worker again under the
resume pass its first attempt's Grant had brought (an operator's walk: 4-6 of 24 concurrent new
Program requests got a 502 ``upstream_unreachable``; with one process none did).

No bound here is the thing measured: waits are generous (a loaded 2-core machine)."""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs
import httpx
import trio
from fault_env import BUDGET_SECONDS, CHAT, agentd_log, await_diagnostics, fault_config
from fault_worker import FaultWorker
from prometheus_client.parser import text_string_to_metric_families

from daemon.supervisor import run_daemon

PROGRAMS = 24


def _body(i: int) -> dict[str, Any]:
    return {
        **CHAT,
        "messages": [{"role": "user", "content": f"burst {i} " + "z " * 50}],
        "vllm_xargs": {"agentic_context": {"program_id": f"burst-{i}"}},
    }


async def test_new_programs_on_a_dead_worker_fail_over_to_the_live_one_through_relays() -> None:
    with agentd_log() as log:
        async with trio.open_nursery() as nursery:
            live, dead = [await nursery.start(FaultWorker().run) for _ in range(2)]
            cfg = fault_config([live.url, dead.url], program=True)
            cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, data_plane_processes=2))
            handles = await nursery.start(partial(run_daemon, cfg))
            assert handles.http_url is not None and handles.data_plane is not None
            dead.die()  # SIGKILL: its port refuses; nobody knows yet (the next health round is an hour away)
            statuses: list[tuple[int, str]] = []
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:

                async def one(i: int) -> None:
                    response = await client.post("/v1/chat/completions", json=_body(i))
                    statuses.append((response.status_code, "" if response.status_code == 200 else response.text))

                with trio.fail_after(BUDGET_SECONDS):
                    async with trio.open_nursery() as burst:
                        for i in range(PROGRAMS):
                            burst.start_soon(one, i)
                assert statuses == [(200, "")] * PROGRAMS, [s for s in statuses if s[0] != 200]
                assert len(live.generation_requests()) == PROGRAMS
                # the relays' counters, merged by the scheduler's /metrics
                metrics = (await client.get("/metrics")).text
                failovers = {
                    sample.labels["target"]: sample.value
                    for family in text_string_to_metric_families(metrics)
                    for sample in family.samples
                    if sample.name == "agentd_proxy_failovers_total"
                }
                # each failover left the dead worker (every request failed over at most once: all
                # answered by the live worker, PROGRAMS generation requests in all)
                assert sum(failovers.values()) >= 1, "no request was placed on the dead worker: nothing was tested"
                assert all(target.startswith(dead.url) for target, n in failovers.items() if n), failovers
                doc = await await_diagnostics(client, lambda d: d["invariants"]["at_rest"])
                assert doc["invariants"]["at_rest"], doc["invariants"]
                assert log.errors() == []
            handles.request_shutdown()
            nursery.cancel_scope.cancel()  # (the workers)
