"""The compact ``/scheduling/dashboard.json`` document (docs/operations.md §9).

Built from the same frozen values as ``/scheduling/diagnostics`` (:mod:`actors.core.snapshot`):
the ranks from ``snapshot(..., include_programs=False)`` and the Programs of one table page from
``program_snapshot``, so a poll costs one pass over the live Programs (count, filter, sort) plus
at most ``PAGE_SIZE`` Program snapshots, whatever the number of live Programs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from actors.core import eta_queue
from actors.core.attribution import time_split_snapshot
from actors.core.batch_class import batch_diagnostics
from actors.core.ids import redacted_id
from actors.core.model import ACTING, ACTIVE, PAUSED, REASONING, Program
from actors.core.snapshot import priority_snapshot, program_snapshot, snapshot, tenant_snapshot
from actors.core.state import SchedulerState
from actors.dashboard_feed import DashboardFeed
from actors.dashboard_panels import (
    TOP_PROGRAMS,
    batch_panel,
    classes_tenants_panel,
    most_active_tenants,
    queue_eta_panel,
    time_split_panel,
    tools_panel,
)
from actors.scheduler_actor import SchedulerHandle

PAGE_SIZE = 25
STATE_FILTERS = ("all", "active", "reasoning", "acting", "paused", "queued")
SORT_KEYS = ("program", "context", "waiting")


def _matches(state: SchedulerState, p: Program, wanted: str) -> bool:
    if wanted == "all":
        return True
    if wanted == "active":
        return p.state == ACTIVE
    if wanted == "paused":
        return p.state == PAUSED
    if wanted == "queued":
        return p.state == PAUSED and state.pool.program_len(p.ref) > 0
    return p.state == ACTIVE and p.status == wanted  # reasoning | acting


def _sort_key(sort: str) -> Callable[[Program], Any]:
    if sort == "context":  # largest context first, then id
        return lambda p: (-p.estimated_context_tokens, redacted_id(p.ref))
    if sort == "waiting":  # longest waiting first; Programs not waiting last
        return lambda p: (p.queued_at is None, p.queued_at or 0.0, redacted_id(p.ref))
    return lambda p: redacted_id(p.ref)


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def dashboard_document(
    handle: SchedulerHandle,
    feed: DashboardFeed,
    now: float,
    *,
    page: int = 1,
    state: str = "all",
    sort: str = "program",
    proxy_classes: Mapping[str, Mapping[str, Any]] | None = None,
    proxy_tenants: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The dashboard body at ``now``: ranks, Program counts, one table page, events, history, and
    the panels of :mod:`actors.dashboard_panels` (``proxy_classes`` / ``proxy_tenants``: the
    proxy's per-class and per-tenant figures, ``FairnessBook.by_class`` / ``by_tenant``)."""
    s = handle.state
    snap = snapshot(s, handle.cfg, now, include_programs=False)
    ranks = [
        {
            "target_id": r.target_id,
            "dp_rank": r.dp_rank,
            "capacity_tokens": r.configured_token_capacity,
            "ledger_used_tokens": r.router_estimated_used_tokens,
            "observed_used_tokens": r.vllm_usage_scaled_tokens,
            "headroom_tokens": r.router_estimated_headroom_tokens,
            "kv_cache_usage": _round(r.vllm_kv_cache_usage, 4),
            "queued_programs": r.router_queued_programs,
            "queued_requests": r.router_queued_requests,
            "active_programs": r.router_active_programs,
            "acting_programs": r.router_active_acting_programs,
            "paused_programs": r.router_paused_reasoning_programs + r.router_paused_acting_programs,
            "in_flight_requests": r.router_in_flight_requests,
            "engine_waiting_requests": r.vllm_waiting_requests,
            "waiting_gate_shut": r.waiting_gate_shut,
            "observation_age_seconds": _round(r.observation_age_seconds),
            "observation_fresh": r.observation_fresh,
            "capacity_accounting_source": r.capacity_accounting_source,
        }
        for r in snap.ranks
    ]
    counts = dict.fromkeys(STATE_FILTERS, 0)
    selected: list[Program] = []
    for p in s.programs.values():
        counts["all"] += 1
        if p.state == ACTIVE:
            counts["active"] += 1
            counts[REASONING if p.status == REASONING else ACTING] += 1
        elif p.state == PAUSED:
            counts["paused"] += 1
            if s.pool.program_len(p.ref) > 0:
                counts["queued"] += 1
        if _matches(s, p, state):
            selected.append(p)
    pages = max(1, -(-len(selected) // PAGE_SIZE))
    page = min(page, pages)
    selected.sort(key=_sort_key(sort))
    rows = []
    for p in selected[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]:
        v = program_snapshot(s, p, handle.cfg, now)
        rows.append(
            {
                "program": v.program,
                "state": v.state,
                "status": v.status,
                "target_id": v.placement or v.last_target,
                "context_tokens": v.estimated_context_tokens,
                "in_flight_requests": v.in_flight_requests,
                "waiting_requests": v.waiting_requests,
                "ttl_remaining_seconds": _round(v.ttl_remaining_seconds),
                "waiting_seconds": _round(v.queued_seconds),
                "pause_reason": v.pause_reason,
                "tenant": v.tenant,
                "priority": v.priority,
            }
        )
    return {
        "enabled": True,
        "live_programs": snap.live_programs,
        "in_flight_requests": snap.in_flight_requests,
        "retained_requests": snap.retained_requests,
        "forced_admissions": snap.forced_admissions,
        "resume_cache_miss_ratio": round(snap.resume_cache_miss_ratio, 4),
        "ranks": ranks,
        "programs": {
            "counts": counts,
            "state": state,
            "sort": sort,
            "page": page,
            "pages": pages,
            "page_size": PAGE_SIZE,
            "matching": len(selected),
            "rows": rows,
        },
        **feed.document(now),
        **_panels(handle, now, proxy_classes, proxy_tenants),
    }


def _panels(
    handle: SchedulerHandle,
    now: float,
    proxy_classes: Mapping[str, Mapping[str, Any]] | None,
    proxy_tenants: Mapping[str, Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """Batch jobs, classes and tenants, tools, time split and queue ETA (docs/operations.md §9),
    from the builders of the diagnostics' ``batch``, ``priority``, ``tools``, ``time_split`` and
    ``queue_eta`` sections; ``batch`` only with batch jobs on."""
    s = handle.state
    out: dict[str, Any] = {}
    if s.batch is not None:
        charged: dict[str, float] = {}
        for r in s.batch.running.values():
            charged[r.job] = charged.get(r.job, 0.0) + r.charged_tokens
        out["batch"] = batch_panel(batch_diagnostics(s), charged, s.batch.cfg.block_size_tokens)
    prio = s.prio
    weight_total = 0.0
    served_total = 0.0
    for tenant, account in s.fair.accounts.items():
        weight_total += prio.weight(tenant)
        served_total += account.input_tokens + account.output_tokens
    shown = most_active_tenants(s.fair.accounts, proxy_tenants)
    out["classes_tenants"] = classes_tenants_panel(
        priority_snapshot(s, now),
        tenants=[tenant_snapshot(s, name, now) for name in shown],
        tenants_total=len(s.fair.accounts),
        weight_total=weight_total,
        served_total=served_total,
        proxy_classes=proxy_classes,
        proxy_tenants=proxy_tenants,
    )
    tr = handle.cfg.tool_retention
    out["tools"] = tools_panel(s.tools.snapshot(), enabled=tr.enabled, min_samples=tr.min_samples)
    live = (p.ref for p in s.programs.values())
    out["time_split"] = time_split_panel(time_split_snapshot(s.times, live, now, top=TOP_PROGRAMS))
    out["queue_eta"] = queue_eta_panel(eta_queue.accuracy(s))
    return out
