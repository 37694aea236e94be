"""report.md for a bench: one side-by-side table, ratios against ``native`` and ``vllm-router-ps``.

Input: ``{system: report}`` as produced by ``bench.report.build_report``.  Rows follow
the seed's reporting list (JCT, request latency/TTFT, throughput, token cache hit beside
preemptions, completed tasks, tokens, queue waits, migrations, force resumes, segment yields).
Missing values print as ``-`` (for example router queue waits of a router without Program
scheduling).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Getter = Callable[[Mapping[str, Any]], float | None]


def _get(*path: str) -> Getter:
    def get(report: Mapping[str, Any]) -> float | None:
        node: Any = report
        for key in path:
            if not isinstance(node, Mapping) or key not in node:
                return None
            node = node[key]
        return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None

    return get


# (label, getter, format, lower_is_better)
ROWS: tuple[tuple[str, Getter, str, bool | None], ...] = (
    ("completed tasks", _get("tasks", "completed"), "{:.0f}", None),
    ("failed requests", _get("requests", "failed"), "{:.0f}", True),
    ("JCT mean (s)", _get("jct_seconds", "mean"), "{:.2f}", True),
    ("JCT p50 (s)", _get("jct_seconds", "p50"), "{:.2f}", True),
    ("JCT p90 (s)", _get("jct_seconds", "p90"), "{:.2f}", True),
    ("JCT p99 (s)", _get("jct_seconds", "p99"), "{:.2f}", True),
    ("request latency mean (s)", _get("request_latency_seconds", "mean"), "{:.3f}", True),
    ("request latency p90 (s)", _get("request_latency_seconds", "p90"), "{:.3f}", True),
    ("TTFT p50 (s)", _get("ttft_seconds", "p50"), "{:.3f}", True),
    ("TTFT p90 (s)", _get("ttft_seconds", "p90"), "{:.3f}", True),
    ("requests/s", _get("throughput", "requests_per_second"), "{:.3f}", False),
    ("output tokens/s", _get("throughput", "output_tokens_per_second"), "{:.1f}", False),
    ("token cache hit", _get("cache", "token_hit_ratio"), "{:.3f}", False),
    ("preemptions", _get("preemptions"), "{:.0f}", True),
    ("input tokens", _get("tokens", "input"), "{:.0f}", None),
    ("output tokens", _get("tokens", "output"), "{:.0f}", None),
    ("router queue wait p50 (s)", _get("queue_wait_seconds", "router", "p50"), "{:.3f}", True),
    ("router queue wait p90 (s)", _get("queue_wait_seconds", "router", "p90"), "{:.3f}", True),
    ("backend queue wait p90 (s)", _get("queue_wait_seconds", "backend", "p90"), "{:.3f}", True),
    ("cross-rank migrations", _get("scheduling", "cross_rank_migrations"), "{:.0f}", None),
    ("force resumes", _get("scheduling", "force_resumes"), "{:.0f}", None),
    ("segment yields", _get("scheduling", "segment_yields"), "{:.0f}", None),
    ("wall time (trace s)", _get("duration_seconds"), "{:.1f}", True),
    ("router process CPU (s)", _get("process_cpu_seconds", "system"), "{:.1f}", True),
)

RATIO_ROWS = ("JCT mean (s)", "JCT p90 (s)", "request latency mean (s)", "requests/s", "output tokens/s")


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out.extend("| " + " | ".join(row) + " |" for row in rows)
    return out


def ratio_lines(reports: Mapping[str, Mapping[str, Any]], baseline: str) -> list[str]:
    if baseline not in reports:
        return []
    base = reports[baseline]
    others = [s for s in reports if s != baseline]
    if not others:
        return []
    rows = []
    getters = {label: getter for label, getter, _fmt_, _better in ROWS}
    for label in RATIO_ROWS:
        b = getters[label](base)
        row = [f"{label} ratio"]
        for s in others:
            v = getters[label](reports[s])
            row.append("-" if v is None or not b else f"{v / b:.3f}")
        rows.append(row)
    hit_b = getters["token cache hit"](base)
    row = ["token cache hit difference"]
    for s in others:
        v = getters["token cache hit"](reports[s])
        row.append("-" if v is None or hit_b is None else f"{v - hit_b:+.3f}")
    rows.append(row)
    return [f"### Against `{baseline}`", "", *_table(["metric", *others], rows), ""]


def render_report(
    reports: Mapping[str, Mapping[str, Any]], *, title: str, context: Sequence[str] = (), plots: Sequence[str] = ()
) -> str:
    systems = list(reports)
    lines = [f"# {title}", ""]
    lines.extend(context)
    if context:
        lines.append("")
    rows = [[label, *(_fmt(getter(reports[s]), fmt) for s in systems)] for label, getter, fmt, _ in ROWS]
    lines.extend(["## Side by side", "", *_table(["metric", *systems], rows), ""])
    lines.append(
        "Durations are in trace seconds (run time x time scale). Token cache hit = "
        "Δ`vllm:prompt_tokens_cached_total` / Δ`vllm:prompt_tokens_total` over all workers; "
        "preemptions = Δ`vllm:num_preemptions_total`."
    )
    lines.append("")
    ratio = ratio_lines(reports, "native") + ratio_lines(reports, "vllm-router-ps")
    if ratio:
        lines.extend(
            [
                "## Ratios",
                "",
                "Ratio = system / baseline (JCT and latency: lower is better; throughput: higher is better).",
                "",
                *ratio,
            ]
        )
    if plots:
        lines.extend(["## Plots", ""])
        lines.extend(f"![{p}]({p})" for p in plots)
        lines.append("")
    return "\n".join(lines)
