"""The replay report: raw replay results plus metric scrapes -> one JSON-able dict.

Everything a Program-scheduling comparison needs, side by side (docs/operations.md, "5. Report";
the fields are described in docs/traces.md, "Replay, simulate, bench"): job completion time,
request latency and TTFT, request/token throughput, token cache hit from the workers' own counters
(``vllm:prompt_tokens_cached_total / vllm:prompt_tokens_total``, the difference between a scrape
before and after the run), preemptions (``vllm:num_preemptions_total``), completed tasks,
input/output tokens, queue-wait distributions, and the router's Program-scheduling events
(``vllm_router_agent_aware_transitions_total`` by reason: cross-rank resumes = migrations, force
resumes, max-segment yields) when the router exposes them.  ``measured_replay`` runs one replay
between the scrapes and builds the report.

Durations are reported in *trace* seconds: measured run time multiplied by the replay time scale,
so runs at different time scales compare directly.  Quantiles of histogram metrics (queue waits)
are interpolated linearly inside Prometheus buckets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from actors.core.attribution import PARTS
from bench.replay import ReplayOptions, ReplayResult, RequestResult, run_replay
from bench.trace.format import DEFAULT_TENANT, Trace
from bench.trace.stats import percentile

Labels = tuple[tuple[str, str], ...]
Snapshot = dict[str, dict[Labels, float]]  # sample name -> labels -> value

WORKER_PROMPT = "vllm:prompt_tokens_total"
WORKER_CACHED = "vllm:prompt_tokens_cached_total"
WORKER_PREEMPTIONS = "vllm:num_preemptions_total"
WORKER_QUEUE = "vllm:request_queue_time_seconds"
ROUTER_TRANSITIONS = "vllm_router_agent_aware_transitions_total"
ROUTER_QUEUE = "vllm_router_agent_aware_queue_wait_seconds"
ROUTER_ARMED_TTL = "vllm_router_agent_aware_armed_ttl_seconds"
TENANT_QUEUE = "agentd_class_queue_wait_seconds"  # by class and tenant (actors/fairness_metrics.py)
TENANT_COUNTER = "agentd_tenant_virtual_counter"
# where the Programs' time goes, server side (docs/program-scheduling.md §14; agentd only)
PROGRAM_TIME = "agentd_program_time_seconds_total"
PROGRAM_RECOMPUTED = "agentd_program_recomputed_tokens_total"
PROGRAM_PROMPT_TOKENS = "agentd_program_prompt_tokens_total"
SERVER_PARTS = PARTS


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> Snapshot:
    """Samples of a Prometheus text exposition: ``{sample name: {sorted labels: value}}``.

    A small line parser (comments skipped, label escapes undone) rather than a full exposition
    parser: it only needs sample lines, is fast on large scrapes, and a line it cannot read
    raises ``ValueError`` naming the line.
    """
    out: Snapshot = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            raise ValueError(f"metrics line {lineno}: not a sample: {line[:120]!r}")
        name, raw_labels, raw_value = m.groups()
        try:
            value = float(raw_value)
        except ValueError:
            raise ValueError(f"metrics line {lineno}: bad value {raw_value!r}") from None
        labels = tuple(
            sorted(
                (k, v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\"))
                for k, v in _LABEL_RE.findall(raw_labels or "")
            )
        )
        out.setdefault(name, {})[labels] = value
    return out


def _error_message(resp: httpx.Response) -> str | None:
    """The ``error.message`` of an OpenAI-shaped error body (agentd's 401 says why), else None."""
    try:
        message = resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    return message[:300] if isinstance(message, str) else None


async def scrape(client: httpx.AsyncClient, url: str, errors: list[str] | None = None) -> Snapshot | None:
    """One ``/metrics`` scrape; ``None`` (reason appended to ``errors``) when it cannot be read."""
    reason: str
    try:
        resp = await client.get(url, timeout=30.0)
    except httpx.HTTPError as exc:
        reason = f"{type(exc).__name__}: {exc}"
    else:
        if resp.status_code != 200:
            reason = f"HTTP {resp.status_code}"
            message = _error_message(resp)
            if message:
                reason += f" ({message})"
        else:
            try:
                return parse_metrics(resp.text)
            except ValueError as exc:
                reason = str(exc)
    if errors is not None:
        errors.append(f"{url}: {reason}")
    return None


async def scrape_all(
    client: httpx.AsyncClient, urls: Sequence[str], errors: list[str] | None = None
) -> list[Snapshot | None]:
    return [await scrape(client, url, errors) for url in urls]


def _sum(snap: Snapshot | None, name: str, where: Mapping[str, str] | None = None) -> float | None:
    if snap is None or name not in snap:
        return None
    total = 0.0
    for labels, value in snap[name].items():
        d = dict(labels)
        if where and any(d.get(k) != v for k, v in where.items()):
            continue
        total += value
    return total


def counter_delta(
    before: Sequence[Snapshot | None],
    after: Sequence[Snapshot | None],
    name: str,
    where: Mapping[str, str] | None = None,
) -> float | None:
    """Σ over endpoints of (after - before); ``None`` when no endpoint exposes ``name``."""
    total: float | None = None
    for b, a in zip(before, after, strict=True):
        va = _sum(a, name, where)
        if va is None:
            continue
        vb = _sum(b, name, where) or 0.0
        total = (total or 0.0) + (va - vb)
    return total


def _label_values(snaps: Sequence[Snapshot | None], name: str, label: str) -> list[str]:
    values: set[str] = set()
    for snap in snaps:
        if snap is None:
            continue
        for labels in snap.get(name, {}):
            d = dict(labels)
            if label in d:
                values.add(d[label])
    return sorted(values)


def histogram_delta(
    before: Sequence[Snapshot | None], after: Sequence[Snapshot | None], name: str
) -> list[tuple[float, float]] | None:
    """Cumulative ``(le, count)`` buckets of the run (summed over endpoints and labels)."""
    buckets: dict[float, float] = {}
    seen = False
    for b, a in zip(before, after, strict=True):
        if a is None or f"{name}_bucket" not in a:
            continue
        seen = True
        for labels, value in a[f"{name}_bucket"].items():
            le = float(dict(labels)["le"])
            prev = (b or {}).get(f"{name}_bucket", {}).get(labels, 0.0)
            buckets[le] = buckets.get(le, 0.0) + value - prev
    if not seen:
        return None
    return sorted(buckets.items())


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def _dist(values: Sequence[float]) -> dict[str, float | int]:
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "mean": math.fsum(values) / len(values),  # exact sum: the same whatever the results' order
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def _summary_quantiles(after: Sequence[Snapshot | None], name: str) -> list[tuple[float, float]]:
    """Count-weighted mean over labels (targets) of a Prometheus summary's quantiles: ``(q, value)``."""
    per_q: dict[float, list[tuple[float, float]]] = {}
    for snap in after:
        if snap is None or name not in snap:
            continue
        counts = snap.get(f"{name}_count", {})
        for labels, value in snap[name].items():
            d = dict(labels)
            if "quantile" not in d or math.isnan(value):
                continue
            key = tuple(sorted((k, v) for k, v in d.items() if k != "quantile"))
            weight = counts.get(key, 0.0)
            if weight > 0:
                per_q.setdefault(float(d["quantile"]), []).append((weight, value))
    return [(q, sum(w * v for w, v in pts) / sum(w for w, _ in pts)) for q, pts in sorted(per_q.items())]


def queue_wait_summary(
    before: Sequence[Snapshot | None], after: Sequence[Snapshot | None], name: str, scale: float
) -> dict[str, Any] | None:
    """Distribution of a queue-wait metric over the run, histogram or summary (vllm-router's).

    ``cdf`` is a list of ``[seconds, fraction]`` points: bucket bounds for a histogram (quantiles
    interpolated inside buckets), the summary's own quantiles for a summary (lifetime values: each
    bench system starts fresh, so lifetime = the run).  Durations are scaled to trace seconds.
    """
    count = counter_delta(before, after, f"{name}_count")
    if count is None:
        return None
    total = counter_delta(before, after, f"{name}_sum") or 0.0
    out: dict[str, Any] = {"count": int(count), "mean": (total / count) * scale if count else None}
    buckets = histogram_delta(before, after, name)
    if buckets is not None:
        out["kind"] = "histogram"
        out["cdf"] = [[le * scale, c / count] for le, c in buckets if math.isfinite(le)] if count else []
        for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            v = histogram_quantile(buckets, q)
            out[key] = None if v is None else v * scale
        return out
    quantiles = _summary_quantiles(after, name)
    out["kind"] = "summary"
    out["cdf"] = [[v * scale, q] for q, v in quantiles]
    lookup = dict(quantiles)
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        out[key] = lookup[q] * scale if q in lookup else None
    return out


def build_report(
    result: ReplayResult,
    *,
    time_scale: float,
    worker_before: Sequence[Snapshot | None] = (),
    worker_after: Sequence[Snapshot | None] = (),
    router_before: Sequence[Snapshot | None] = (),
    router_after: Sequence[Snapshot | None] = (),
    trace_info: Mapping[str, Any] | None = None,
    system: str | None = None,
    metrics_errors: Sequence[str] = (),
) -> dict[str, Any]:
    s = time_scale
    reqs = sorted(result.requests, key=lambda r: (r.session_id, r.turn))
    ok = [r for r in reqs if r.ok]
    # Programs (agent tasks) only: batch requests have their own section
    agent_tasks = [t for t in result.tasks if t.klass == "agent"]
    tasks_ok = [t for t in agent_tasks if t.ok]
    elapsed = max(result.finished - result.started, 1e-9)
    errors: dict[str, int] = {}
    for r in reqs:
        if not r.ok:
            key = (r.error or "unknown").split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    usage_prompt = sum(r.prompt_tokens or 0 for r in ok)
    usage_cached = sum(r.cached_tokens or 0 for r in ok)
    usage_output = sum(r.completion_tokens or 0 for r in ok)
    prompt = counter_delta(worker_before, worker_after, WORKER_PROMPT)
    cached = counter_delta(worker_before, worker_after, WORKER_CACHED)
    preempt = counter_delta(worker_before, worker_after, WORKER_PREEMPTIONS)
    reasons = _label_values(router_after, ROUTER_TRANSITIONS, "reason")
    transitions = {
        reason: counter_delta(router_before, router_after, ROUTER_TRANSITIONS, {"reason": reason}) or 0.0
        for reason in reasons
    }
    router_queue = counter_delta(router_before, router_after, f"{ROUTER_QUEUE}_count")
    # acting TTLs armed, by source (fitted, request_hint, tool, tool_release: docs/program-scheduling.md §12)
    ttl_sources = _label_values(router_after, f"{ROUTER_ARMED_TTL}_count", "source")
    ttl_armed = {
        src: counter_delta(router_before, router_after, f"{ROUTER_ARMED_TTL}_count", {"source": src}) or 0.0
        for src in ttl_sources
    }
    jct = [(t.end - t.start) * s for t in tasks_ok]
    report: dict[str, Any] = {
        "system": system,
        "trace": dict(trace_info or {}),
        "time_scale": time_scale,
        "duration_seconds": elapsed * s,
        "tasks": {
            "planned": result.planned_tasks - result.planned_batch_tasks - result.planned_interactive_tasks,
            "completed": len(tasks_ok),
            "failed": len(agent_tasks) - len(tasks_ok),
        },
        "jct_seconds": _dist(jct),
        "request_latency_seconds": _dist([(r.end - r.start) * s for r in ok]),
        "ttft_seconds": _dist([(r.first_token - r.start) * s for r in ok if r.first_token is not None]),
        "requests": {
            "planned": result.planned_requests,
            "completed": len(ok),
            "failed": len(reqs) - len(ok),
            "errors": dict(sorted(errors.items())),
        },
        "throughput": {
            "requests_per_second": len(ok) / (elapsed * s),
            "output_tokens_per_second": usage_output / (elapsed * s),
            "total_tokens_per_second": (usage_prompt + usage_output) / (elapsed * s),
            "tasks_per_second": len(tasks_ok) / (elapsed * s),
        },
        "tokens": {"input": usage_prompt, "output": usage_output, "cached_by_usage": usage_cached},
        "cache": {
            "prompt_tokens_total": prompt,
            "prompt_tokens_cached_total": cached,
            "token_hit_ratio": (cached / prompt) if prompt and cached is not None else None,
            "usage_hit_ratio": (usage_cached / usage_prompt) if usage_prompt else None,
        },
        "preemptions": preempt,
        "queue_wait_seconds": {
            "router": queue_wait_summary(router_before, router_after, ROUTER_QUEUE, s),
            "backend": queue_wait_summary(worker_before, worker_after, WORKER_QUEUE, s),
        },
        "scheduling": {
            "available": bool(reasons) or router_queue is not None,
            "cross_rank_migrations": transitions.get("cross_rank_resume", 0.0),
            "force_resumes": transitions.get("force_resume", 0.0),
            "segment_yields": transitions.get("max_segment_yield", 0.0),
            "transitions": transitions,
            "ttl_armed": ttl_armed,
        },
        "time_split_seconds": time_split(result, s),
        "server_time_split": server_time_split(router_before, router_after, len(tasks_ok), s),
        "samples": {"jct_seconds": sorted(jct)},
        "metrics_errors": list(metrics_errors),
    }
    if result.planned_batch_requests:
        report["batch"] = batch_summary(result, s, preempt)
    if any(r.tenant != DEFAULT_TENANT or r.klass == "interactive" or r.priority for r in reqs):
        report["tenants"] = tenant_summary(result, s, router_before, router_after)
        report["classes"] = class_summary(result, s)
    return report


def time_split(result: ReplayResult, scale: float) -> dict[str, Any] | None:
    """Where a Program's time goes, as the client sees it: the mean over completed agent tasks of
    the root Program's time to first token (router queue + backend queue + prefill), decode (first
    token to end) and time between its turns (tool time and waiting for subagents: the JCT minus
    the other two), in trace seconds; and the mean prompt tokens per task the backend recomputed
    (uncached tokens that the Program's previous prompt and output already held: evicted KV).
    None when no task completed."""
    by_session: dict[str, list[RequestResult]] = {}
    for r in result.requests:
        by_session.setdefault(r.session_id, []).append(r)
    rows: list[tuple[float, float, float, float]] = []
    for t in result.tasks:
        reqs = sorted(by_session.get(t.task_id, []), key=lambda r: r.turn)
        if not t.ok or t.klass != "agent" or not reqs:  # Programs only (no batch, no interactive)
            continue
        ttft = sum((r.first_token if r.first_token is not None else r.end) - r.start for r in reqs)
        decode = sum(r.end - r.first_token for r in reqs if r.first_token is not None)
        recomputed = 0.0
        held: int | None = None  # tokens the previous turn's prompt and output left in the KV
        for r in reqs:
            if held is not None and r.prompt_tokens is not None and r.cached_tokens is not None:
                recomputed += max(0, min(r.prompt_tokens, held) - r.cached_tokens)
            held = None if r.prompt_tokens is None else r.prompt_tokens + (r.completion_tokens or 0)
        rows.append((ttft, decode, max(0.0, (t.end - t.start) - ttft - decode), recomputed))
    if not rows:
        return None
    n = len(rows)
    return {
        "programs": n,
        "first_token": sum(r[0] for r in rows) / n * scale,
        "decode": sum(r[1] for r in rows) / n * scale,
        "between_turns": sum(r[2] for r in rows) / n * scale,
        "recomputed_prompt_tokens": sum(r[3] for r in rows) / n,
    }


def server_time_split(
    before: Sequence[Snapshot | None], after: Sequence[Snapshot | None], tasks: int, scale: float
) -> dict[str, Any] | None:
    """Where the Programs' time goes as agentd accounts it (docs/program-scheduling.md §14), from
    the run's deltas of ``agentd_program_*_total``: per completed agent task, summed over all of the
    task's Programs (the lead and its subagents), the seconds by part in trace seconds, the
    recomputed prompt tokens by cause and the prompt tokens by kind.  None for a router without
    these counters (native, vllm-router) or when no task completed."""
    if tasks <= 0 or counter_delta(before, after, PROGRAM_TIME) is None:
        return None
    # rounded to the microsecond: the counters sum many float increments, and completions that
    # land at the same virtual instant may be summed in either order (the last digit moves)
    seconds = {
        part: round((counter_delta(before, after, PROGRAM_TIME, {"part": part}) or 0.0) / tasks * scale, 6)
        for part in SERVER_PARTS
    }
    causes = _label_values(after, PROGRAM_RECOMPUTED, "cause")
    recomputed = {
        cause: (counter_delta(before, after, PROGRAM_RECOMPUTED, {"cause": cause}) or 0.0) / tasks for cause in causes
    }
    kinds = _label_values(after, PROGRAM_PROMPT_TOKENS, "kind")
    tokens = {
        kind: (counter_delta(before, after, PROGRAM_PROMPT_TOKENS, {"kind": kind}) or 0.0) / tasks for kind in kinds
    }
    return {
        "tasks": tasks,
        "seconds_per_task": seconds,
        "recomputed_tokens_per_task": recomputed,
        "prompt_tokens_per_task": tokens,
    }


def _service(r: RequestResult) -> int:
    """Tokens served to one completed request (prompt + output, from its usage)."""
    return (r.prompt_tokens or 0) + (r.completion_tokens or 0)


def _latency_stats(reqs: Sequence[RequestResult], scale: float) -> dict[str, Any]:
    ok = [r for r in reqs if r.ok]
    return {
        "requests": len(reqs),
        "completed": len(ok),
        "failed": len(reqs) - len(ok),
        "ttft_seconds": _dist([(r.first_token - r.start) * scale for r in ok if r.first_token is not None]),
        "latency_seconds": _dist([(r.end - r.start) * scale for r in ok]),
        "service_tokens": sum(_service(r) for r in ok),
    }


def tenant_summary(
    result: ReplayResult,
    scale: float,
    router_before: Sequence[Snapshot | None] = (),
    router_after: Sequence[Snapshot | None] = (),
) -> dict[str, Any]:
    """The report's ``tenants`` section (traces with tenants, classes or priorities, docs/traces.md):
    per tenant its requests, TTFT and latency, the tokens served (prompt + output of completed
    requests) and the JCT of its agent tasks; when the router exposes agentd's per-tenant metrics
    (docs/priority.md §5), the mean wait for a dispatch decision at the router
    (``router_queue_wait_mean_seconds``) and the tenant's virtual token counter at the end."""
    out: dict[str, Any] = {}
    for tenant in sorted({r.tenant for r in result.requests} | {t.tenant for t in result.tasks}):
        stats = _latency_stats([r for r in result.requests if r.tenant == tenant], scale)
        tasks = [t for t in result.tasks if t.tenant == tenant and t.klass == "agent"]
        stats["tasks"] = {"completed": sum(1 for t in tasks if t.ok), "failed": sum(1 for t in tasks if not t.ok)}
        stats["jct_seconds"] = _dist([(t.end - t.start) * scale for t in tasks if t.ok])
        where = {"tenant": tenant}
        waits = counter_delta(router_before, router_after, f"{TENANT_QUEUE}_count", where)
        if waits:
            total = counter_delta(router_before, router_after, f"{TENANT_QUEUE}_sum", where) or 0.0
            stats["router_queue_wait_mean_seconds"] = total / waits * scale
        counter = sum((_sum(snap, TENANT_COUNTER, where) or 0.0) for snap in router_after)
        if any(snap is not None and TENANT_COUNTER in snap for snap in router_after):
            stats["virtual_counter"] = counter
        out[tenant] = stats
    return out


def class_summary(result: ReplayResult, scale: float) -> dict[str, Any]:
    """The report's ``classes`` section: per request class (interactive, agent, batch) its requests,
    TTFT, latency and tokens served."""
    classes = sorted({r.klass for r in result.requests})
    return {k: _latency_stats([r for r in result.requests if r.klass == k], scale) for k in classes}


def _makespan_stats(reqs: Sequence[RequestResult], scale: float) -> dict[str, Any]:
    """Makespan (first arrival -> last completion) and throughput of one set of batch requests."""
    ok = [r for r in reqs if r.ok]
    out: dict[str, Any] = {"requests": len(reqs), "completed": len(ok), "failed": len(reqs) - len(ok)}
    output = sum(r.completion_tokens or 0 for r in ok)
    total = output + sum(r.prompt_tokens or 0 for r in ok)
    makespan = (max(r.end for r in ok) - min(r.start for r in reqs)) * scale if ok else None
    out["makespan_seconds"] = makespan
    out["output_tokens"] = output
    per_s = makespan if makespan else None
    out["requests_per_second"] = len(ok) / per_s if per_s else None
    out["output_tokens_per_second"] = output / per_s if per_s else None
    out["total_tokens_per_second"] = total / per_s if per_s else None
    out["latency_seconds"] = _dist([(r.end - r.start) * scale for r in ok])
    return out


def batch_summary(result: ReplayResult, scale: float, preemptions: float | None) -> dict[str, Any]:
    """The report's ``batch`` section (only for traces with batch records, docs/traces.md): makespan
    from the first batch arrival to the last batch completion, batch throughput over that span,
    the same per job, and the engines' preemptions over the whole run (all classes: the engines do
    not say whose request was preempted)."""
    batch = [r for r in result.requests if r.job is not None]
    by_job: dict[str, list[RequestResult]] = {}
    for r in batch:
        by_job.setdefault(r.job or "", []).append(r)
    out: dict[str, Any] = _makespan_stats(batch, scale) if batch else {"requests": 0, "completed": 0, "failed": 0}
    out["planned"] = result.planned_batch_requests
    out["engine_preemptions"] = preemptions
    out["jobs"] = {job: _makespan_stats(reqs, scale) for job, reqs in sorted(by_job.items())}
    return out


def trace_summary(trace: Trace, path: str, concurrency: int | None = None) -> dict[str, Any]:
    """The report's ``trace`` section: the file, its meta, and ``concurrency`` when the replay overrode
    the trace's own."""
    return {
        "path": path,
        "profile": trace.meta.profile,
        "seed": trace.meta.seed,
        "programs": trace.meta.programs,
        "requests": len(trace.records),
        "arrival": trace.meta.arrival,
        "concurrency": concurrency or trace.meta.concurrency,
    }


async def measured_replay(
    trace: Trace,
    client: httpx.AsyncClient,
    base_url: str,
    opts: ReplayOptions,
    *,
    worker_metrics: Sequence[str],
    router_metrics: Sequence[str],
    worker_client: httpx.AsyncClient | None = None,
    info: Mapping[str, Any] | None = None,
    system: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` against ``base_url`` with the workers' and the router's metrics scraped just
    before and just after, and build the report.

    ``worker_client`` reads the worker metrics when the workers are not reachable through ``client``
    (the simulated workers of ``agentd simulate``).  A scrape that fails is named in the report's
    ``metrics_errors``.
    """
    workers = worker_client or client
    errors: list[str] = []
    worker_before = await scrape_all(workers, worker_metrics, errors)
    router_before = await scrape_all(client, router_metrics, errors)
    result = await run_replay(trace, client, base_url, opts, progress=progress)
    worker_after = await scrape_all(workers, worker_metrics, errors)
    router_after = await scrape_all(client, router_metrics, errors)
    diagnostics = await _scheduling_diagnostics(client, base_url)
    tools = tool_section(diagnostics, opts.time_scale)
    report = build_report(
        result,
        time_scale=opts.time_scale,
        worker_before=worker_before,
        worker_after=worker_after,
        router_before=router_before,
        router_after=router_after,
        trace_info=info,
        system=system,
        metrics_errors=errors,
    )
    if tools is not None:
        report["scheduling"]["tools"] = tools
    queue_eta = diagnostics.get("queue_eta") if diagnostics is not None else None
    if isinstance(queue_eta, dict):
        # accuracy of the first queue ETA of every admitted queued request (docs/program-scheduling.md §13)
        report["scheduling"]["queue_eta"] = {k: v for k, v in queue_eta.items() if k != "lines"}
    return report


async def _scheduling_diagnostics(client: httpx.AsyncClient, base_url: str) -> dict[str, Any] | None:
    """agentd's ``/scheduling/diagnostics`` at the end of the run, or None when the router has none
    (native, the reference router)."""
    try:
        resp = await client.get(base_url.rstrip("/") + "/scheduling/diagnostics")
        doc = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# the durations of a diagnostics ``tools`` row (docs/program-scheduling.md §12, "Diagnostics")
TOOL_SECONDS_FIELDS = ("gap_p50_seconds", "gap_p90_seconds", "gap_p99_seconds", "last_ttl_seconds", "recompute_seconds")


def tool_section(doc: Mapping[str, Any] | None, scale: float = 1.0) -> list[dict[str, Any]] | None:
    """agentd's per-tool gap windows and decisions at the end of the run (docs/program-scheduling.md
    §12), or None when the router has no such section.  The daemon measures them on its own clock;
    like every duration of the report they are given in trace seconds (times ``scale``), so a
    tool's gaps read as the trace's gaps whatever the replay's time scale."""
    tools = doc.get("tools") if doc is not None else None
    if not isinstance(tools, list) or not tools:
        return None
    out = []
    for row in tools:
        if isinstance(row, Mapping):
            row = dict(row)
            for key in TOOL_SECONDS_FIELDS:
                v = row.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[key] = v * scale
        out.append(row)
    return out
