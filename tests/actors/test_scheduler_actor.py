"""Scheduler actor + Program actors + rank actor over the real core, under the autojump clock.

Exact virtual times: a Program paused by its acting TTL at the armed deadline, released by the
paused retention after 1800 s, force-resumed at its deadline; ticks on the metrics grid; stale
observations -> one fallback event -> one recovery event."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from tests.actors.conftest import FakeWorkers, daemon_config, ok, program_request, program_scheduling


def _program(diag: dict, target: str | None = None) -> list[dict]:
    return [p for r in diag["ranks"] if target in (None, r["target_id"]) for p in r["programs"]]


async def test_first_program_request_is_admitted_and_polling_starts_lazily(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = daemon_config(token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg) as (dispatcher, registry, workers):
        await trio.sleep(5)
        assert workers.scrapes == []  # no Program request yet: no backend polling
        diag = dispatcher.diagnostics()
        assert [r["target_id"] for r in diag["ranks"]] == ["http://w0:8000@0", "http://w0:8000@1"]
        assert all(r["capacity_accounting_source"] == "router_ledger_missing_observation" for r in diag["ranks"])
        assert diag["backend_polling_started"] is False
        t0 = trio.current_time()
        async with dispatcher.lease(program_request("task-a:lead", tokens=200)) as lease:
            assert lease.target.target_id in ("http://w0:8000@0", "http://w0:8000@1")
            assert lease.wants_usage is True
            lease.finish(ok(prompt=200))
        await trio.testing.wait_all_tasks_blocked()
        assert [t - t0 for t, _ in workers.scrapes] == [0.0]
        await trio.sleep(2.5)
        assert [t - t0 for t, _ in workers.scrapes] == [0.0, 1.0, 2.0]
        diag = dispatcher.diagnostics()
        progs = _program(diag)
        assert len(progs) == 1
        # warm-up: TTL 0 -> paused right after the completion (reason ttl_expired)
        assert (progs[0]["state"], progs[0]["status"], progs[0]["pause_reason"]) == ("paused", "acting", "ttl_expired")
        assert all(r["router_estimated_used_tokens"] == 0 for r in diag["ranks"])
        assert registry.get_sample_value(
            "vllm_router_agent_aware_transitions_total", {"target": lease.target.target_id, "reason": "program_admit"}
        ) == 1.0
        assert registry.get_sample_value(
            "vllm_router_agent_aware_transitions_total", {"target": lease.target.target_id, "reason": "ttl_expired"}
        ) == 1.0
