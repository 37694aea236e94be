"""report.md for a bench: one side-by-side table, ratios against ``native``, ``vllm-router-ps`` and ``floor``.

Input: ``{system: report}`` as produced by ``bench.report.build_report``.  Rows follow
the reporting list of the tuning workflow (docs/operations.md, "5. Report": JCT, request
latency/TTFT, throughput, token cache hit beside preemptions, completed tasks, tokens, queue waits,
migrations, force resumes, segment yields).
Missing values print as ``-`` (for example router queue waits of a router without Program
scheduling).  When a report has a ``batch`` section (a trace with batch records) the table and the
ratios add the batch rows: makespan overall and per job, batch throughput, engine preemptions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.core.attribution import CAUSES, PARTS

Getter = Callable[[Mapping[str, Any]], float | None]
Cell = Callable[[float | None, float | None], str]  # (value, baseline value) -> table cell


def report_value(*path: str) -> Getter:
    """A getter of the number at ``path`` in a report (None when absent or not a number)."""

    def get(report: Mapping[str, Any]) -> float | None:
        node: Any = report
        for key in path:
            if not isinstance(node, Mapping) or key not in node:
                return None
            node = node[key]
        return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None

    return get


Row = tuple[str, Getter, str, bool | None]  # (label, getter, format, lower_is_better)


def _seconds(label: str, stats: Sequence[str], fmt: str, *path: str) -> tuple[Row, ...]:
    """``"<label> <stat> (s)"`` rows of one distribution in the report (lower is better)."""
    return tuple((f"{label} {stat} (s)", report_value(*path, stat), fmt, True) for stat in stats)


def _counts(section: str, labels: Mapping[str, str]) -> tuple[Row, ...]:
    """Count rows ``{label: key}`` of one report section (neither direction is better)."""
    return tuple((label, report_value(section, key), "{:.0f}", None) for label, key in labels.items())


ROWS: tuple[Row, ...] = (
    ("completed tasks", report_value("tasks", "completed"), "{:.0f}", None),
    ("failed requests", report_value("requests", "failed"), "{:.0f}", True),
    *_seconds("JCT", ("mean", "p50", "p90", "p99"), "{:.2f}", "jct_seconds"),
    *_seconds("request latency", ("mean", "p90"), "{:.3f}", "request_latency_seconds"),
    *_seconds("TTFT", ("p50", "p90"), "{:.3f}", "ttft_seconds"),
    ("requests/s", report_value("throughput", "requests_per_second"), "{:.3f}", False),
    ("output tokens/s", report_value("throughput", "output_tokens_per_second"), "{:.1f}", False),
    ("token cache hit", report_value("cache", "token_hit_ratio"), "{:.3f}", False),
    ("preemptions", report_value("preemptions"), "{:.0f}", True),
    *_counts("tokens", {"input tokens": "input", "output tokens": "output"}),
    *_seconds("router queue wait", ("p50", "p90"), "{:.3f}", "queue_wait_seconds", "router"),
    *_seconds("backend queue wait", ("p90",), "{:.3f}", "queue_wait_seconds", "backend"),
    *_counts(
        "scheduling",
        {
            "cross-rank migrations": "cross_rank_migrations",
            "force resumes": "force_resumes",
            "segment yields": "segment_yields",
        },
    ),
    ("root Program: to first tokens (s)", report_value("time_split_seconds", "first_token"), "{:.1f}", True),
    ("root Program: decode (s)", report_value("time_split_seconds", "decode"), "{:.1f}", True),
    ("root Program: between turns (s)", report_value("time_split_seconds", "between_turns"), "{:.1f}", True),
    (
        "root Program: recomputed prompt tokens",
        report_value("time_split_seconds", "recomputed_prompt_tokens"),
        "{:.0f}",
        True,
    ),
    # agentd's own account, per task over all its Programs (docs/program-scheduling.md §14)
    *(
        (
            f"server: {part.replace('_', ' ')} per task (s)",
            report_value("server_time_split", "seconds_per_task", part),
            "{:.1f}",
            True,
        )
        for part in PARTS
    ),
    *(
        (
            f"server: recomputed tokens per task, {cause}",
            report_value("server_time_split", "recomputed_tokens_per_task", cause),
            "{:.0f}",
            True,
        )
        for cause in CAUSES
    ),
    ("wall time (trace s)", report_value("duration_seconds"), "{:.1f}", True),
    ("router process CPU (s)", report_value("process_cpu_seconds", "system"), "{:.1f}", True),
)
# Rows of the report's ``batch`` section (docs/traces.md, "Report"), shown when some report has one.
BATCH_ROWS: tuple[Row, ...] = (
    ("batch makespan (s)", report_value("batch", "makespan_seconds"), "{:.2f}", True),
    ("batch requests/s", report_value("batch", "requests_per_second"), "{:.3f}", False),
    ("batch output tokens/s", report_value("batch", "output_tokens_per_second"), "{:.1f}", False),
    ("batch total tokens/s", report_value("batch", "total_tokens_per_second"), "{:.1f}", False),
    ("batch failed requests", report_value("batch", "failed"), "{:.0f}", True),
    ("engine preemptions", report_value("batch", "engine_preemptions"), "{:.0f}", True),
)
_GETTERS = {label: getter for label, getter, _fmt, _better in (*ROWS, *BATCH_ROWS)}

RATIO_ROWS = ("JCT mean (s)", "JCT p90 (s)", "request latency mean (s)", "requests/s", "output tokens/s")
BATCH_RATIO_ROWS = ("batch makespan (s)", "batch output tokens/s", "engine preemptions")


def has_batch(reports: Mapping[str, Mapping[str, Any]]) -> bool:
    return any(isinstance(r.get("batch"), Mapping) for r in reports.values())


def job_rows(reports: Mapping[str, Mapping[str, Any]]) -> tuple[Row, ...]:
    """A makespan row per batch job found in any report, in name order."""
    jobs: set[str] = set()
    for r in reports.values():
        batch = r.get("batch")
        if isinstance(batch, Mapping) and isinstance(batch.get("jobs"), Mapping):
            jobs.update(batch["jobs"])
    return tuple(
        (f"makespan job {job} (s)", report_value("batch", "jobs", job, "makespan_seconds"), "{:.2f}", True)
        for job in sorted(jobs)
    )


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out.extend("| " + " | ".join(row) + " |" for row in rows)
    return out


def _against(
    label: str, reports: Mapping[str, Mapping[str, Any]], baseline: str, others: Sequence[str], cell: Cell
) -> list[str]:
    """``label``'s values of ``others`` set against ``baseline``'s, one cell per system."""
    get = _GETTERS.get(label) or dict((row[0], row[1]) for row in job_rows(reports))[label]
    base = get(reports[baseline])
    return [cell(get(reports[s]), base) for s in others]


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.3f}"


def _difference(value: float | None, base: float | None) -> str:
    return "-" if value is None or base is None else f"{value - base:+.3f}"


def ratio_lines(reports: Mapping[str, Mapping[str, Any]], baseline: str) -> list[str]:
    if baseline not in reports:
        return []
    others = [s for s in reports if s != baseline]
    if not others:
        return []
    labels = list(RATIO_ROWS)
    if has_batch(reports):
        labels += [*BATCH_RATIO_ROWS, *(row[0] for row in job_rows(reports))]
    rows = [[f"{label} ratio", *_against(label, reports, baseline, others, _ratio)] for label in labels]
    hit = _against("token cache hit", reports, baseline, others, _difference)
    rows.append(["token cache hit difference", *hit])
    return [f"### Against `{baseline}`", "", *_table(["metric", *others], rows), ""]


def render_report(
    reports: Mapping[str, Mapping[str, Any]], *, title: str, context: Sequence[str] = (), plots: Sequence[str] = ()
) -> str:
    systems = list(reports)
    lines = [f"# {title}", ""]
    lines.extend(context)
    if context:
        lines.append("")
    shown = (*ROWS, *BATCH_ROWS, *job_rows(reports)) if has_batch(reports) else ROWS
    rows = [[label, *(_fmt(getter(reports[s]), fmt) for s in systems)] for label, getter, fmt, _ in shown]
    lines.extend(["## Side by side", "", *_table(["metric", *systems], rows), ""])
    lines.append(
        "Durations are in trace seconds (run time x time scale). Token cache hit = "
        "Δ`vllm:prompt_tokens_cached_total` / Δ`vllm:prompt_tokens_total` over all workers; "
        "preemptions = Δ`vllm:num_preemptions_total`."
        + (
            " Batch makespan = first batch arrival to last batch completion (per job: that job's);"
            " batch throughput is over the makespan; JCT covers the Programs only."
            if has_batch(reports)
            else ""
        )
    )
    lines.append("")
    ratio = ratio_lines(reports, "native") + ratio_lines(reports, "vllm-router-ps") + ratio_lines(reports, "floor")
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
