"""The dashboard panel builders on hand-made inputs (actors/dashboard_panels.py, docs/operations.md §9):
ordering by activity, the bounds, the per-job charged blocks, the tool decision labels."""

from __future__ import annotations

from typing import Any

from actors.core.fairness import TenantAccount
from actors.core.tool_retention import ToolSnapshot
from actors.dashboard_panels import TOP_ROWS, batch_panel, classes_tenants_panel, most_active_tenants, tools_panel


def job(name: str, queued: int = 0, running: int = 0, admitted: int = 0, **kw: Any) -> dict[str, Any]:
    return {
        "job": name,
        "queued": queued,
        "running": running,
        "submitted": queued + admitted,
        "admitted": admitted,
        "completed": kw.get("completed", 0),
        "failed": kw.get("failed", 0),
        "abandoned": kw.get("abandoned", 0),
        "predicted_decode_tokens": 100,
        "estimated_decode_tokens": 100,
        "estimate_samples": 0,
        "observed_decode_tokens_mean": kw.get("observed"),
        "mean_queue_wait_seconds": None,
    }


def batch(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    rank = {
        "running": 0,
        "charged_tokens": 0.0,
        "reserve_blocks": 3,
        "growth_reserve_tokens": 40.4,
        "budget_tokens": 500,
    }
    return {
        "enabled": True,
        "queued": 7,
        "running": 2,
        "starvation_escapes": 1,
        "preemptions": 0,
        "decode_tokens_per_second": 12.345,
        "oldest_wait_seconds": 1.23456,
        "programs_waiting": True,
        "jobs": jobs,
        "ranks": [{**rank, "target_id": "a"}, {**rank, "target_id": "b"}],
    }


def test_batch_panel_orders_jobs_by_activity_and_bounds_them() -> None:
    jobs = [job(f"idle-{i:02d}", admitted=i) for i in range(20)]
    jobs += [job("waiting", queued=5), job("running", running=2, admitted=2, failed=1, abandoned=2, observed=33.333)]
    doc = batch_panel(batch(jobs), {"running": 33.0, "idle-19": 16.0}, 16)
    assert [j["job"] for j in doc["jobs"][:4]] == ["waiting", "running", "idle-19", "idle-18"]
    assert (len(doc["jobs"]), doc["jobs_total"], doc["jobs_more"]) == (TOP_ROWS, 22, 22 - TOP_ROWS)
    running = doc["jobs"][1]
    assert running["charged_blocks"] == 3  # ceil(33 / 16)
    assert doc["jobs"][2]["charged_blocks"] == 1 and doc["jobs"][0]["charged_blocks"] == 0
    assert running["failed"] == 3 and running["observed_decode_tokens_mean"] == 33.3  # failed + abandoned
    assert (doc["reserve_blocks"], doc["growth_reserve_tokens"], doc["budget_tokens"]) == (6, 81, 1000)
    assert (doc["oldest_wait_seconds"], doc["decode_tokens_per_second"]) == (1.235, 12.3)
    assert batch_panel({"enabled": False}, {}, 16) == {"enabled": False}


def tool(name: str, observed: int, decides: bool, last_ttl: float | None) -> ToolSnapshot:
    return ToolSnapshot(
        model_pool="default",
        tool=name,
        samples=min(observed, 64),
        observed=observed,
        gap_p50_seconds=0.12345,
        gap_p90_seconds=None,
        gap_p99_seconds=None,
        decides=decides,
        held=1,
        released=2,
        fallbacks=3,
        last_ttl_seconds=last_ttl,
    )


def test_tools_panel_labels_the_decision_and_keeps_the_most_observed() -> None:
    tools = [tool(f"t{i:02d}", i, True, 1.0) for i in range(15)]
    tools += [tool("hold", 100, True, 2.5), tool("release", 90, True, 0.0), tool("learning", 80, False, None)]
    doc = tools_panel(tools, enabled=True, min_samples=8)
    shown = [(t["tool"], t["decision"], t["last_ttl_seconds"]) for t in doc["tools"][:3]]
    assert shown == [("hold", "hold", 2.5), ("release", "release", 0.0), ("learning", "fit", None)]
    assert (len(doc["tools"]), doc["tools_total"], doc["tools_more"]) == (TOP_ROWS, 18, 8)
    assert doc["tools"][0]["gap_p50_seconds"] == 0.123 and doc["tools"][0]["gap_p90_seconds"] is None


def test_classes_tenants_panel_from_the_proxy_alone() -> None:
    figures = {"queued": 0, "running": 0, "admitted": 0, "rejected": 0, "completed": 0, "wait_seconds_mean": None}
    tenants = {
        "a": {**figures, "running": 1, "admitted": 4, "prompt_tokens": 30, "completion_tokens": 10},
        "b": {**figures, "queued": 2, "admitted": 2, "prompt_tokens": 50, "completion_tokens": 10},
        "c": {**figures, "admitted": 1, "prompt_tokens": 0, "completion_tokens": 0},
    }
    classes = {
        "agent": {**figures, "admitted": 7, "wait_seconds_mean": 0.25, "prompt_tokens": 80, "completion_tokens": 20}
    }
    doc = classes_tenants_panel(None, weight_total=0.0, served_total=0.0, proxy_classes=classes, proxy_tenants=tenants)
    assert [(t["tenant"], t["waiting"], t["running"], t["dispatched"], t["service_share"]) for t in doc["tenants"]] == [
        ("b", 2, 0, 2, 0.6),  # two waiting: the most active
        ("a", 0, 1, 4, 0.4),
        ("c", 0, 0, 1, 0.0),
    ]
    assert doc["classes"] == [
        {
            "request_class": "agent",
            "waiting": 0,
            "running": 0,
            "active_programs": None,
            "charged_tokens": None,
            "oldest_wait_seconds": None,
            "admitted": 7,
            "completed": 0,
            "rejected": 0,
            "wait_mean_seconds": 0.25,
            "service_share": 1.0,
        }
    ]
    assert (doc["tenants_total"], doc["tenants_more"], doc["fairness"]) == (3, 0, None)


def test_most_active_tenants_looks_at_every_account() -> None:
    """Beyond the diagnostics' 100 tenants (the most waiting, then the lowest counter: the least
    served) the most served tenants still make the panel."""
    accounts = {f"t{i:03d}": TenantAccount(input_tokens=float(i), output_tokens=1.0) for i in range(150)}
    assert most_active_tenants(accounts, None) == [f"t{i:03d}" for i in range(149, 149 - TOP_ROWS, -1)]
    accounts["t005"].waiting = 1  # waiting first, then running (the proxy's), then tokens served
    proxy = {"t007": {"running": 2}, "t149": {"running": 0}}
    assert most_active_tenants(accounts, proxy)[:3] == ["t007", "t005", "t149"]
