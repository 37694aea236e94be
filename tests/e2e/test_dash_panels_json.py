"""``/scheduling/dashboard.json``'s panels beyond Program scheduling (docs/operations.md §9), in process.

The daemon runs on the embedded simulated backend (deterministic, one rank) under
``autojump_clock``; requests reach it through ``httpx.ASGITransport``.  Once the load has ended,
the dashboard body and the diagnostics are built back to back with no checkpoint between them
(:func:`dashboard_payload`, :func:`diagnostics_payload`), so both describe the same instant and
the panels must equal what the diagnostics report, rounded, besides the values the load fixes
(counts, decode lengths, weights).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import attrs
import trio
import trio.testing
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client
from test_program_sim import deterministic, sim_config

from actors.core.config import BatchJobsConfig, ToolRetentionConfig
from actors.dashboard_panels import TOP_ROWS
from daemon.config import AgentdConfig
from daemon.handles import DaemonHandles
from daemon.http.dashboard import dashboard_payload
from daemon.http.diagnostics import diagnostics_payload
from daemon.supervisor import run_daemon


def panels_config(*, batch: bool = True, **ps: Any) -> AgentdConfig:
    cfg = sim_config(**ps)
    cfg = attrs.evolve(cfg, priority=attrs.evolve(cfg.priority, tenant_weights={"acme": 2.0}))
    return attrs.evolve(cfg, batch_jobs=BatchJobsConfig(enabled=True, max_jobs=0)) if batch else cfg


def agent_turn(program_id: str, tool: str, *, words: int = 40, max_tokens: int = 8) -> dict[str, Any]:
    """One agent turn that ends calling ``tool`` (the simulator's hints: docs/simulator.md)."""
    text = " ".join(f"{program_id}-word{i}" for i in range(words))
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "vllm_xargs": {
            "agentic_context": {"program_id": program_id},
            "sim_finish_reason": "tool_calls",
            "sim_tool_name": tool,
        },
    }


def batch_request(i: int, output_tokens: int) -> dict[str, Any]:
    words = " ".join(f"b{i}-word{k}" for k in range(40))
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 64,
        "vllm_xargs": {"sim_output_tokens": output_tokens},  # a natural stop: the job keeps its statistics
    }


async def settled(handles: DaemonHandles) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dashboard body and the diagnostics at one instant, once nothing runs or waits."""

    def idle(d: dict[str, Any]) -> bool:
        batch_idle = d["batch"].get("running", 0) == 0 and d["batch"].get("queued", 0) == 0
        return d["in_flight_requests"] == 0 and d["retained_requests"] == 0 and batch_idle

    await handles.program_dispatcher.wait_diagnostics(idle)
    return dashboard_payload(handles), diagnostics_payload(handles)


async def test_panels_show_the_diagnostics_values_of_a_known_load(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(run_daemon, panels_config(), serve_http=False, sim_configure=deterministic)
            )
            async with in_process_client(handles) as client:

                async def agent(pid: str, tenant: str, tool: str, turns: int) -> None:
                    for _ in range(turns):
                        r = await client.post(
                            "/v1/chat/completions", json=agent_turn(pid, tool), headers={"x-agentd-tenant": tenant}
                        )
                        assert r.status_code == 200, r.text
                        await trio.sleep(0.5)  # the tool runs

                async def batch(i: int, job: str, output_tokens: int) -> None:
                    r = await client.post(
                        "/v1/chat/completions",
                        json=batch_request(i, output_tokens),
                        headers={"x-request-id": f"b{i}#job_name[{job}]#", "x-agentd-tenant": "batchco"},
                    )
                    assert r.status_code == 200, r.text

                async with trio.open_nursery() as load:
                    load.start_soon(agent, "a1", "acme", "read_file", 3)
                    load.start_soon(agent, "g1", "globex", "run_tests", 2)
                    load.start_soon(batch, 0, "alpha", 10)
                    load.start_soon(batch, 1, "alpha", 20)
                    load.start_soon(batch, 2, "beta", 30)
                doc, diag = await settled(handles)
                over_http = (await client.get("/scheduling/dashboard.json")).json()
            nursery.cancel_scope.cancel()

    assert set(over_http) == set(doc)
    # Batch jobs: the most admitted first when none waits; the decode lengths the simulator gave
    b = doc["batch"]
    assert [j["job"] for j in b["jobs"]] == ["alpha", "beta"]
    assert (b["enabled"], b["queued"], b["running"], b["jobs_total"], b["jobs_more"]) == (True, 0, 0, 2, 0)
    alpha, beta = b["jobs"]
    assert (alpha["admitted"], alpha["completed"], alpha["failed"], alpha["charged_blocks"]) == (2, 2, 0, 0)
    assert (beta["admitted"], beta["completed"], beta["failed"], beta["charged_blocks"]) == (1, 1, 0, 0)
    assert alpha["observed_decode_tokens_mean"] == 15.0 and beta["observed_decode_tokens_mean"] == 30.0
    diag_jobs = {j["job"]: j for j in diag["batch"]["jobs"]}
    for j in b["jobs"]:
        assert j["predicted_decode_tokens"] == diag_jobs[j["job"]]["predicted_decode_tokens"]
    assert b["block_size_tokens"] == 16
    assert b["reserve_blocks"] == diag["batch"]["ranks"][0]["reserve_blocks"] == 2  # nothing runs: the margin
    assert b["budget_tokens"] == diag["batch"]["ranks"][0]["budget_tokens"]
    assert (b["starvation_escapes"], b["preemptions"]) == (0, 0)
    # Classes and tenants: weights 2 : 1 : 1, the core's counts and counters
    ct = doc["classes_tenants"]
    assert ct["fairness"] == diag["priority"]["fairness"]
    tenants = {t["tenant"]: t for t in ct["tenants"]}
    assert set(tenants) == {"acme", "globex", "batchco"} and ct["tenants_total"] == 3 and ct["tenants_more"] == 0
    assert [tenants[t]["weight_share"] for t in ("acme", "globex", "batchco")] == [0.5, 0.25, 0.25]
    assert [tenants[t]["dispatched"] for t in ("acme", "globex", "batchco")] == [3, 2, 3]
    core = {t["tenant"]: t for t in diag["priority"]["tenants"]}
    served = {n: t["input_tokens"] + t["output_tokens"] for n, t in core.items()}
    for name, t in tenants.items():
        assert t["service_share"] == round(served[name] / sum(served.values()), 4)
        assert t["counter"] == round(core[name]["counter"], 1)
        assert (t["waiting"], t["running"], t["lifts"]) == (0, 0, core[name]["lifts"])
    classes = {c["request_class"]: c for c in ct["classes"]}
    assert list(classes) == diag["priority"]["class_order"]
    assert [classes[c]["admitted"] for c in ("interactive", "agent", "batch")] == [0, 5, 3]
    tokens = {c: f["prompt_tokens"] + f["completion_tokens"] for c, f in diag["fairness"]["classes"].items()}
    assert classes["batch"]["service_share"] == round(tokens["batch"] / sum(tokens.values()), 4)
    assert classes["interactive"]["service_share"] is None
    # Tools: two gaps after read_file (three turns), one after run_tests; too few to decide
    tools = {t["tool"]: t for t in doc["tools"]["tools"]}
    assert list(tools) == ["read_file", "run_tests"]  # the most observed first
    diag_tools = {t["tool"]: t for t in diag["tools"]}
    assert (tools["read_file"]["samples"], tools["run_tests"]["samples"]) == (2, 1)
    for name, t in tools.items():
        assert t["decision"] == "fit" and t["model_pool"] == "default"
        assert t["gap_p50_seconds"] == round(diag_tools[name]["gap_p50_seconds"], 3)
        assert t["fallbacks"] == diag_tools[name]["fallbacks"] > 0
    assert doc["tools"]["enabled"] is True and doc["tools"]["tools_total"] == 2
    # Where the time goes: the diagnostics' totals, rounded; the two live Programs
    ts, dts = doc["time_split"], diag["time_split"]
    assert (ts["programs_seen"], ts["completions"]) == (2, 5)
    assert ts["seconds"] == {k: round(v, 3) for k, v in dts["seconds"].items()}
    assert ts["seconds"]["between_turns"] >= 1.5  # 0.5 s after each of a1's first two turns, one of g1's
    assert ts["prompt_tokens"] == dts["prompt_tokens"]
    assert [p["program"] for p in ts["top_programs"]] == [p["program"] for p in dts["top_programs"]]
    assert len(ts["top_programs"]) == 2
    # Queue ETA: the diagnostics' accuracy figures
    q, dq = doc["queue_eta"], diag["queue_eta"]
    assert (q["samples"], q["told_waiting"], q["bound_rejections"]) == (
        dq["samples_count"],
        dq["told_waiting_count"],
        dq["bound_rejections_count"],
    )
    assert (q["median_relative_error"], q["p90_relative_error"]) == (
        None if dq["median_relative_error"] is None else round(dq["median_relative_error"], 4),
        None if dq["p90_relative_error"] is None else round(dq["p90_relative_error"], 4),
    )
    # the Program rows carry their tenant and priority
    rows = {r["tenant"] for r in doc["programs"]["rows"]}
    assert rows == {"acme", "globex"}
    assert all(r["priority"] == 0 for r in doc["programs"]["rows"])


async def test_panels_are_bounded_with_many_jobs_tenants_and_tools(autojump_clock: trio.testing.MockClock) -> None:
    n = 3 * TOP_ROWS
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(run_daemon, panels_config(), serve_http=False, sim_configure=deterministic)
            )
            async with in_process_client(handles) as client:

                async def one(i: int) -> None:
                    tenant = {"x-agentd-tenant": f"tenant-{i:02d}"}
                    for _ in range(2):  # the second turn gives tool-{i} its gap
                        r = await client.post(
                            "/v1/chat/completions", json=agent_turn(f"p{i}", f"tool-{i:02d}"), headers=tenant
                        )
                        assert r.status_code == 200
                    r = await client.post(
                        "/v1/chat/completions",
                        json=batch_request(i, 5),
                        headers={"x-request-id": f"b{i}#job_name[job-{i:02d}]#", **tenant},
                    )
                    assert r.status_code == 200

                async with trio.open_nursery() as load:
                    for i in range(n):
                        load.start_soon(one, i)
                doc, _diag = await settled(handles)
                body = (await client.get("/scheduling/dashboard.json")).content
            nursery.cancel_scope.cancel()

    b, ct, tl = doc["batch"], doc["classes_tenants"], doc["tools"]
    assert (len(b["jobs"]), b["jobs_total"], b["jobs_more"]) == (TOP_ROWS, n, n - TOP_ROWS)
    assert (len(ct["tenants"]), ct["tenants_total"], ct["tenants_more"]) == (TOP_ROWS, n, n - TOP_ROWS)
    assert (len(tl["tools"]), tl["tools_total"], tl["tools_more"]) == (TOP_ROWS, n, n - TOP_ROWS)
    assert len(doc["time_split"]["top_programs"]) == 5
    served = [t["served_tokens"] for t in ct["tenants"]]
    assert served == sorted(served, reverse=True)  # none waits or runs: the most served first
    admitted = [j["admitted"] for j in b["jobs"]]
    assert admitted == [1] * TOP_ROWS and [j["job"] for j in b["jobs"]] == [f"job-{i:02d}" for i in range(TOP_ROWS)]
    assert len(body) < 24_000, len(body)  # 30 Programs on the page's table, 10 rows per panel


async def test_panels_absent_or_off_when_their_feature_is(autojump_clock: trio.testing.MockClock) -> None:
    no_tools = ToolRetentionConfig(enabled=False)
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(
                    run_daemon,
                    panels_config(batch=False, tool_retention=no_tools),
                    serve_http=False,
                    sim_configure=deterministic,
                )
            )
            async with in_process_client(handles) as client:
                fresh = dashboard_payload(handles)
                r = await client.post("/v1/chat/completions", json=agent_turn("solo", "grep"))
                assert r.status_code == 200
                r = await client.post("/v1/chat/completions", json=agent_turn("solo", "grep"))
                assert r.status_code == 200
                doc, _diag = await settled(handles)
            nursery.cancel_scope.cancel()
    # nothing seen yet: empty panels, no batch section without batch jobs
    assert "batch" not in fresh and "batch" not in doc
    assert fresh["tools"] == {"enabled": False, "min_samples": 8, "tools_total": 0, "tools_more": 0, "tools": []}
    assert fresh["time_split"]["programs_seen"] == 0 and fresh["time_split"]["top_programs"] == []
    assert fresh["queue_eta"]["samples"] == 0
    assert fresh["classes_tenants"]["tenants"] == [] and fresh["classes_tenants"]["tenants_total"] == 0
    # the per-tool TTL off: the gaps are learned, nothing decides
    (grep,) = doc["tools"]["tools"]
    assert (grep["tool"], grep["samples"], grep["decision"], grep["held"], grep["released"]) == ("grep", 1, "fit", 0, 0)
    (tenant,) = doc["classes_tenants"]["tenants"]
    assert tenant["tenant"] == "default" and tenant["dispatched"] == 2


async def test_without_program_scheduling_only_the_proxy_figures_remain(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = attrs.evolve(sim_config(), enable_program_scheduling=False, program_scheduling=None)
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            async with in_process_client(handles) as client:
                for tenant in ("acme", "acme", "globex"):
                    r = await client.post(
                        "/v1/chat/completions", json=batch_request(0, 4), headers={"x-agentd-tenant": tenant}
                    )
                    assert r.status_code == 200
                doc = (await client.get("/scheduling/dashboard.json")).json()
            nursery.cancel_scope.cancel()
    assert set(doc) == {"enabled", "classes_tenants", "proxy"} and doc["enabled"] is False
    ct = doc["classes_tenants"]
    assert ct["fairness"] is None
    assert [(t["tenant"], t["dispatched"], t["running"], t["weight"], t["counter"]) for t in ct["tenants"]] == [
        ("acme", 2, 0, None, None),
        ("globex", 1, 0, None, None),
    ]
    # the native path reads the usage of plain answers (docs/priority.md §5.6): equal answers, so
    # each tenant's share is its share of the requests
    assert [t["service_share"] for t in ct["tenants"]] == [0.6667, 0.3333]
    (cls,) = ct["classes"]  # a request without a Program identity is class interactive
    assert (cls["request_class"], cls["admitted"], cls["completed"], cls["charged_tokens"]) == (
        "interactive",
        3,
        3,
        None,
    )
    assert json.dumps(doc)  # JSON-ready
