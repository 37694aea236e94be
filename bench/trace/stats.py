"""Distributions of a trace, and how they compare with its profile's calibration targets.

``trace_stats(trace)`` returns a flat ``{metric: value}`` dict (dotted names such as
``turns_per_program.p50``); ``compare(stats, targets)`` pairs them with the targets from
``bench.trace.synth.targets_for``. ``format_report`` renders both as the text ``agentd trace stats``
prints. Besides the calibration metrics it reports two workload checks of the tuning workflow
(docs/operations.md, "2. Establish a comparable pressure point"; docs/traces.md, "Statistics"): the
ideal (infinite-cache) prompt-token hit ratio, and the share of return gaps shorter than the cold
prefill of the context they would recompute (where Progress-TTL can pay off).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from actors.core.config import PrefillCostModel
from actors.core.costs import prefill_seconds
from bench.trace.format import Trace
from bench.trace.synth import Target

# The cold-prefill cost of the reuse-opportunity check: Program scheduling's default prefill cost
# model (``program_scheduling.prefill_cost_model``, docs/config.md).
_PREFILL = PrefillCostModel()


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]; 0.0 for an empty sequence."""
    if not values:
        return 0.0
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def summarize(name: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {f"{name}.count": 0.0}
    return {
        f"{name}.count": float(len(values)),
        f"{name}.mean": sum(values) / len(values),
        f"{name}.p50": percentile(values, 50),
        f"{name}.p90": percentile(values, 90),
        f"{name}.p99": percentile(values, 99),
        f"{name}.max": float(max(values)),
    }


def trace_stats(trace: Trace) -> dict[str, float]:
    sessions = trace.sessions()
    roots = [s for s, recs in sessions.items() if recs[0].parent_session_id is None]
    children_of: dict[str, int] = {}
    for recs in sessions.values():
        parent = recs[0].parent_session_id
        if parent is not None:
            children_of[parent] = children_of.get(parent, 0) + 1
    out: dict[str, float] = {
        "programs": float(len(sessions)),
        "root_programs": float(len(roots)),
        "subagent_programs": float(len(sessions) - len(roots)),
        "requests": float(len(trace.records)),
        "subagent_session_share": (sum(1 for s in roots if s in children_of) / len(roots)) if roots else 0.0,
    }
    out.update(summarize("turns_per_program", [len(sessions[s]) for s in roots]))
    out.update(summarize("user_turns_per_program", [sum(1 for r in sessions[s] if r.role == "user") for s in roots]))
    out.update(summarize("initial_input_tokens", [sessions[s][0].input_length for s in roots]))
    appends = [r.input_delta for r in trace.records if r.turn > 0 and not r.compaction]
    out.update(summarize("append_tokens", appends))
    out.update(summarize("output_tokens", [r.output_length for r in trace.records]))
    out.update(summarize("input_tokens", [r.input_length for r in trace.records]))
    tool_gaps = [r.pre_gap_ms / 1000.0 for r in trace.records if r.turn > 0 and r.role == "tool"]
    human_gaps = [r.pre_gap_ms / 1000.0 for r in trace.records if r.turn > 0 and r.role == "user"]
    out.update(summarize("tool_gap_seconds", tool_gaps))
    out.update(summarize("human_gap_seconds", human_gaps))
    all_gaps = tool_gaps + human_gaps
    # Adjacent same-Program intervals include in-process user steps (bfcl); the router-RFC shares.
    if all_gaps:
        out["return_gap.share_under_1s"] = sum(1 for g in all_gaps if g < 1.0) / len(all_gaps)
        out["return_gap.share_under_10s"] = sum(1 for g in all_gaps if g < 10.0) / len(all_gaps)
    out["compactions"] = float(sum(1 for r in trace.records if r.compaction))
    total_in = sum(r.input_length for r in trace.records)
    total_shared = sum(r.shared_prefix_tokens for r in trace.records if r.turn == 0 or r.compaction)
    out["total_input_tokens"] = float(total_in)
    out["total_output_tokens"] = float(sum(r.output_length for r in trace.records))
    out["shared_prefix_share"] = (total_shared / total_in) if total_in else 0.0
    out["ideal_prefix_hit_ratio"] = _ideal_hit(trace) / total_in if total_in else 0.0
    out["gaps_below_cold_prefill_share"] = _reuse_opportunity(trace)
    jobs: dict[str, int] = {}
    for r in trace.records:
        if r.job is not None:
            jobs[r.job] = jobs.get(r.job, 0) + 1
    if jobs:
        out["jobs"] = float(len(jobs))
        out.update(summarize("programs_per_job", list(jobs.values())))
        outs_by_job: dict[str, list[int]] = {}
        for r in trace.records:
            if r.job is not None:
                outs_by_job.setdefault(r.job, []).append(r.output_length)
        # short jobs: median decode at most the engine's short-decode threshold (32 tokens, docs/batch.md)
        short = sum(len(v) for v in outs_by_job.values() if percentile(v, 50) <= 32 * _output_scale(trace))
        out["output_short_share"] = short / sum(len(v) for v in outs_by_job.values())
        medians = [percentile(v, 50) for v in outs_by_job.values()]
        out["job_output_tokens_p50.min"] = min(medians)
        out["job_output_tokens_p50.max"] = max(medians)
    return out


def _output_scale(trace: Trace) -> float:
    knobs = trace.meta.params.get("knobs", {}) if isinstance(trace.meta.params, dict) else {}
    value = knobs.get("output_scale", 1.0) if isinstance(knobs, dict) else 1.0
    return float(value) if isinstance(value, (int, float)) else 1.0


def _ideal_hit(trace: Trace) -> int:
    """Prompt tokens an infinite prefix cache would serve (history + seen shared prefixes)."""
    seen_prefix: set[str] = set()
    cached = 0
    last: dict[str, tuple[int, int]] = {}
    for r in trace.records:
        prev = last.get(r.session_id)
        if prev is not None and not r.compaction:
            cached += prev[0] + prev[1]
        elif r.shared_prefix_id is not None and r.shared_prefix_tokens > 0:
            if r.shared_prefix_id in seen_prefix:
                cached += r.shared_prefix_tokens
            seen_prefix.add(r.shared_prefix_id)
        last[r.session_id] = (r.input_length, r.output_length)
    return cached


def _reuse_opportunity(trace: Trace) -> float:
    """Share of return gaps shorter than the cold prefill of the context they would recompute."""
    hits = total = 0
    last: dict[str, tuple[int, int]] = {}
    for r in trace.records:
        prev = last.get(r.session_id)
        if prev is not None and not r.compaction:
            total += 1
            if r.pre_gap_ms / 1000.0 < prefill_seconds(prev[0] + prev[1], _PREFILL):
                hits += 1
        last[r.session_id] = (r.input_length, r.output_length)
    return hits / total if total else 0.0


@attrs.frozen
class Comparison:
    metric: str
    observed: float | None
    target: float
    tolerance: str
    ok: bool


def compare(stats: dict[str, float], targets: Sequence[Target]) -> list[Comparison]:
    out = []
    for t in targets:
        observed = stats.get(t.metric)
        tol = f"+-{t.abs_tol:g}" if t.abs_tol >= t.rel_tol * abs(t.value) else f"+-{t.rel_tol:.0%}"
        out.append(Comparison(t.metric, observed, t.value, tol, observed is not None and t.accepts(observed)))
    return out


_SHOWN = (
    "programs",
    "root_programs",
    "subagent_programs",
    "requests",
    "total_input_tokens",
    "total_output_tokens",
    "turns_per_program",
    "user_turns_per_program",
    "initial_input_tokens",
    "append_tokens",
    "output_tokens",
    "input_tokens",
    "tool_gap_seconds",
    "human_gap_seconds",
    "programs_per_job",
)


def format_report(trace: Trace, stats: dict[str, float], comparisons: Sequence[Comparison]) -> str:
    lines = [
        f"profile={trace.meta.profile} seed={trace.meta.seed} arrival={trace.meta.arrival} "
        f"concurrency={trace.meta.concurrency}",
        "",
    ]
    lines.append(f"{'distribution':<26}{'count':>8}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}{'max':>12}")
    for name in _SHOWN[6:]:
        if stats.get(f"{name}.count", 0.0) == 0.0:
            continue
        row = [stats[f"{name}.{k}"] for k in ("count", "mean", "p50", "p90", "p99", "max")]
        lines.append(f"{name:<26}{int(row[0]):>8}" + "".join(f"{v:>12.4g}" for v in row[1:]))
    lines.append("")
    for name in _SHOWN[:6]:
        lines.append(f"{name:<34}{stats.get(name, 0.0):>14.6g}")
    for name in (
        "subagent_session_share",
        "return_gap.share_under_1s",
        "return_gap.share_under_10s",
        "compactions",
        "shared_prefix_share",
        "ideal_prefix_hit_ratio",
        "gaps_below_cold_prefill_share",
        "output_short_share",
    ):
        if name in stats:
            lines.append(f"{name:<34}{stats[name]:>14.4f}")
    if comparisons:
        lines.append("")
        lines.append(f"{'target':<32}{'observed':>12}{'target':>12}{'tolerance':>12}  ok")
        for c in comparisons:
            obs = "-" if c.observed is None else f"{c.observed:.4g}"
            lines.append(f"{c.metric:<32}{obs:>12}{c.target:>12.4g}{c.tolerance:>12}  {'yes' if c.ok else 'NO'}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    from bench.interrupt import not_a_command

    sys.exit(not_a_command("bench.trace.stats", "agentd trace stats"))
