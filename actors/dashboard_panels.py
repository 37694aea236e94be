"""The ``/dashboard`` panels beyond Program scheduling (docs/operations.md §9): batch jobs, classes
and tenants, tools, where the time goes, queue ETA.

Each builder takes what the ``/scheduling/diagnostics`` builders return (the ``batch`` and
``queue_eta`` dicts, the core's :class:`~actors.core.snapshot.PrioritySnapshot`, the tool and
time-split snapshots, the proxy's per-class and per-tenant figures) and keeps a bounded, rounded
part of it: at most ``TOP_ROWS`` jobs, tenants and tools (the most active ones, the rest counted
in ``*_more``) and ``TOP_PROGRAMS`` Programs, so the page's 1 s poll stays a few KB whatever the
number of jobs, tenants or tools.  Pure functions of their arguments: no clock, no state.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.core.attribution import CAUSES, PARTS, TimeSplitSnapshot
from actors.core.fairness import TenantAccount
from actors.core.snapshot import PrioritySnapshot, TenantSnapshot
from actors.core.tool_retention import ToolSnapshot

TOP_ROWS = 10  # jobs, tenants, tools shown
TOP_PROGRAMS = 5  # Programs of the time split shown


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def batch_panel(
    batch: Mapping[str, Any], charged_tokens_by_job: Mapping[str, float], block_size_tokens: int
) -> dict[str, Any]:
    """The Batch jobs panel from the diagnostics' ``batch`` section (docs/batch.md §2.7).

    ``charged_tokens_by_job``: the KV tokens the running requests of each job are charged on the
    ranks' ledgers (prompt + min(predicted decode, max_tokens), docs/batch.md §2.2), shown per job
    in blocks of ``block_size_tokens``.  Jobs: the most active first (queued + running, then
    admitted, then name), ``TOP_ROWS`` at most."""
    if not batch.get("enabled"):
        return {"enabled": False}
    jobs = sorted(batch["jobs"], key=lambda j: (-(j["queued"] + j["running"]), -j["admitted"], j["job"]))
    ranks = batch["ranks"]
    return {
        "enabled": True,
        "queued": batch["queued"],
        "running": batch["running"],
        "oldest_wait_seconds": _r(batch["oldest_wait_seconds"]),
        "starvation_escapes": batch["starvation_escapes"],
        "preemptions": batch["preemptions"],
        "decode_tokens_per_second": _r(batch["decode_tokens_per_second"], 1),
        "programs_waiting": batch["programs_waiting"],
        "block_size_tokens": block_size_tokens,
        "reserve_blocks": sum(r["reserve_blocks"] for r in ranks),
        "growth_reserve_tokens": round(sum(r["growth_reserve_tokens"] for r in ranks)),
        "budget_tokens": sum(r["budget_tokens"] for r in ranks),
        "jobs_total": len(jobs),
        "jobs_more": max(0, len(jobs) - TOP_ROWS),
        "jobs": [
            {
                "job": j["job"],
                "queued": j["queued"],
                "running": j["running"],
                "admitted": j["admitted"],
                "completed": j["completed"],
                "failed": j["failed"] + j["abandoned"],
                "predicted_decode_tokens": j["predicted_decode_tokens"],
                "observed_decode_tokens_mean": _r(j["observed_decode_tokens_mean"], 1),
                "mean_queue_wait_seconds": _r(j["mean_queue_wait_seconds"]),
                "charged_blocks": math.ceil(charged_tokens_by_job.get(j["job"], 0.0) / block_size_tokens),
            }
            for j in jobs[:TOP_ROWS]
        ],
    }


def classes_tenants_panel(
    priority: PrioritySnapshot | None,
    *,
    tenants: Sequence[TenantSnapshot] = (),
    tenants_total: int = 0,
    weight_total: float,
    served_total: float,
    proxy_classes: Mapping[str, Mapping[str, Any]] | None,
    proxy_tenants: Mapping[str, Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """The Classes and tenants panel (docs/priority.md §2, §3, §5.6).

    ``priority``: the core's view of the classes (None with Program scheduling off: the proxy's
    figures only); ``tenants``: the core's accounts to show (the caller picks the most active of
    its ``tenants_total`` accounts, :func:`most_active_tenants`).  ``weight_total`` and
    ``served_total``: the sums of the weights and of the charged input + output tokens over every
    tenant account of the core, so a tenant's ``weight_share`` and ``service_share`` compare over
    the same tenants.  ``proxy_classes`` / ``proxy_tenants``: the
    proxy's figures by class and by tenant label (``FairnessBook.by_class`` / ``by_tenant``);
    a tenant without a label of its own (beyond ``[tenants] metrics_top_k``) has no proxy figures.
    Tenants: the most active first (waiting + running, then served tokens, then name)."""
    pc = proxy_classes or {}
    pt = proxy_tenants or {}
    served_by_class = {c: f["prompt_tokens"] + f["completion_tokens"] for c, f in pc.items()}
    class_tokens = sum(served_by_class.values())
    classes: list[dict[str, Any]] = []
    core_classes = {c.request_class: c for c in priority.classes} if priority is not None else {}
    names = list(priority.class_order) if priority is not None else [c for c in pc]
    for name in names:
        core = core_classes.get(name)
        proxy = pc.get(name)
        classes.append(
            {
                "request_class": name,
                "waiting": core.waiting_requests if core is not None else (proxy or {}).get("queued", 0),
                "running": core.running_requests if core is not None else (proxy or {}).get("running", 0),
                "active_programs": core.active_programs if core is not None else None,
                "charged_tokens": round(core.charged_tokens) if core is not None else None,
                "oldest_wait_seconds": _r(core.oldest_wait_seconds) if core is not None else None,
                "admitted": proxy["admitted"] if proxy else 0,
                "completed": proxy["completed"] if proxy else 0,
                "rejected": proxy["rejected"] if proxy else 0,
                "wait_mean_seconds": _r(proxy["wait_seconds_mean"]) if proxy else None,
                "service_share": _r(served_by_class[name] / class_tokens, 4) if proxy and class_tokens else None,
            }
        )
    rows: list[dict[str, Any]] = []
    if priority is not None:
        for t in tenants:
            proxy = pt.get(t.tenant)
            served = t.input_tokens + t.output_tokens
            rows.append(
                {
                    "tenant": t.tenant,
                    "weight": t.weight,
                    "weight_share": _r(t.weight / weight_total, 4) if weight_total > 0 else None,
                    "service_share": _r(served / served_total, 4) if served_total > 0 else None,
                    "served_tokens": round(served),
                    "waiting": t.waiting_requests,
                    "running": proxy["running"] if proxy else None,
                    "dispatched": t.dispatched_requests,
                    "counter": round(t.counter, 1),
                    "kv_token_seconds": round(t.kv_token_seconds, 1),
                    "held_kv_tokens": round(t.held_kv_tokens),
                    "lifts": t.lifts,
                }
            )
        total = tenants_total
    else:  # the proxy's figures only, by tenant label
        tokens = sum(f["prompt_tokens"] + f["completion_tokens"] for f in pt.values())
        for label, f in pt.items():
            served = f["prompt_tokens"] + f["completion_tokens"]
            rows.append(
                {
                    "tenant": label,
                    "weight": None,
                    "weight_share": None,
                    "service_share": _r(served / tokens, 4) if tokens else None,
                    "served_tokens": served,
                    "waiting": f["queued"],
                    "running": f["running"],
                    "dispatched": f["admitted"],
                    "counter": None,
                    "kv_token_seconds": None,
                    "held_kv_tokens": None,
                    "lifts": None,
                }
            )
        total = len(rows)
    rows.sort(key=lambda r: (-(r["waiting"] + (r["running"] or 0)), -r["served_tokens"], r["tenant"]))
    return {
        "fairness": priority.fairness if priority is not None else None,
        "classes": classes,
        "tenants_total": total,
        "tenants_more": max(0, total - min(TOP_ROWS, len(rows))),
        "tenants": rows[:TOP_ROWS],
    }


def most_active_tenants(
    accounts: Mapping[str, TenantAccount], proxy_tenants: Mapping[str, Mapping[str, Any]] | None
) -> list[str]:
    """The ``TOP_ROWS`` tenants with the most requests waiting (the core's) and running (the
    proxy's, for a tenant with its own label), then the most tokens served, then by name."""
    pt = proxy_tenants or {}

    def key(item: tuple[str, TenantAccount]) -> tuple[float, float, str]:
        name, a = item
        running = pt[name]["running"] if name in pt else 0
        return (-(a.waiting + running), -(a.input_tokens + a.output_tokens), name)

    return [name for name, _ in heapq.nsmallest(TOP_ROWS, accounts.items(), key=key)]


def _decision(t: ToolSnapshot) -> str:
    """What the tool's completions get now (docs/program-scheduling.md §12)."""
    if not t.decides:
        return "fit"  # too few gaps (or the per-tool TTL is off): the fitted Progress-TTL
    if t.last_ttl_seconds is None:
        return "hold"
    return "release" if t.last_ttl_seconds <= 0 else "hold"


def tools_panel(tools: Iterable[ToolSnapshot], *, enabled: bool, min_samples: int) -> dict[str, Any]:
    """The Tools panel: per (model pool, tool) the gap window, the decision and its outcomes; the
    most observed first, ``TOP_ROWS`` at most."""
    rows = sorted(tools, key=lambda t: (-t.observed, t.model_pool, t.tool))
    return {
        "enabled": enabled,
        "min_samples": min_samples,
        "tools_total": len(rows),
        "tools_more": max(0, len(rows) - TOP_ROWS),
        "tools": [
            {
                "model_pool": t.model_pool,
                "tool": t.tool,
                "samples": t.samples,
                "observed": t.observed,
                "gap_p50_seconds": _r(t.gap_p50_seconds),
                "gap_p90_seconds": _r(t.gap_p90_seconds),
                "gap_p99_seconds": _r(t.gap_p99_seconds),
                "decision": _decision(t),
                "last_ttl_seconds": _r(t.last_ttl_seconds),
                "held": t.held,
                "released": t.released,
                "fallbacks": t.fallbacks,
                "returned_held": t.returned_held,
                "returned_released": t.returned_released,
                "fit_would_hold": t.fit_would_hold,
                "fit_would_release": t.fit_would_release,
                "resume_miss_ratio": _r(t.resume_miss_ratio, 4),
            }
            for t in rows[:TOP_ROWS]
        ],
    }


def time_split_panel(ts: TimeSplitSnapshot) -> dict[str, Any]:
    """Where the time goes (docs/program-scheduling.md §14): cluster totals by part, the recompute
    time by cause, prompt tokens by kind, and the first ``TOP_PROGRAMS`` of ``top_programs``."""
    return {
        "programs_seen": ts.programs_seen,
        "completions": ts.completions,
        "seconds": {part: round(ts.seconds.get(part, 0.0), 3) for part in PARTS},
        "recompute_seconds_by_cause": {c: round(ts.recompute_seconds_by_cause.get(c, 0.0), 3) for c in CAUSES},
        "prompt_tokens": dict(ts.prompt_tokens),
        "top_programs": [
            {
                "program": p.program,
                "wall_seconds": round(p.wall_seconds, 3),
                "queue_seconds": round(p.queue_seconds, 3),
                "prefill_seconds": round(p.prefill_seconds, 3),
                "recompute_seconds": round(p.recompute_seconds, 3),
                "decode_seconds": round(p.decode_seconds, 3),
                "between_turns_seconds": round(p.between_turns_seconds, 3),
                "open_phase": p.open_phase,
                "completions": p.completions,
                "pending_loss_cause": p.pending_loss_cause,
            }
            for p in ts.top_programs[:TOP_PROGRAMS]
        ],
    }


def queue_eta_panel(eta: Mapping[str, Any]) -> dict[str, Any]:
    """The Queue ETA panel from the accuracy figures of the diagnostics' ``queue_eta`` section
    (``eta_queue.accuracy``, docs/program-scheduling.md §13): how accurate the first ETAs were."""
    return {
        "samples": eta["samples_count"],
        "recent_samples": eta["recent_samples"],
        "median_relative_error": _r(eta["median_relative_error"], 4),
        "p90_relative_error": _r(eta["p90_relative_error"], 4),
        "told_waiting": eta["told_waiting_count"],
        "bound_rejections": eta["bound_rejections_count"],
    }
