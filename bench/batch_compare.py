"""A small side-by-side table of batch-workload reports with ratios against the first one.

``python -m bench.batch_compare --title T [--out FILE] LABEL=REPORT.json ...`` prints (and with
``--out`` writes atomically) a markdown table of the figures the batch benchmarks compare
(bench/batch_bench.sh, docs/batch.md §5): batch makespan overall and per job, batch throughput,
engine preemptions and the agents' JCT, one column per report, then ``ratio`` columns (report /
first report).  A missing figure prints as ``-``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from bench.markdown import Getter, report_value
from bench.output import write_atomic

ROWS: tuple[tuple[str, Getter, str], ...] = (
    ("batch makespan (s)", report_value("batch", "makespan_seconds"), "{:.2f}"),
    ("batch requests/s", report_value("batch", "requests_per_second"), "{:.3f}"),
    ("batch output tokens/s", report_value("batch", "output_tokens_per_second"), "{:.1f}"),
    ("batch failed requests", report_value("batch", "failed"), "{:.0f}"),
    ("engine preemptions", report_value("batch", "engine_preemptions"), "{:.0f}"),
    ("agents' JCT mean (s)", report_value("jct_seconds", "mean"), "{:.2f}"),
    ("agents' JCT p90 (s)", report_value("jct_seconds", "p90"), "{:.2f}"),
    (
        "agents' failed tasks",
        lambda r: report_value("tasks", "failed")(r) if report_value("tasks", "planned")(r) else None,
        "{:.0f}",
    ),
)


def _jobs(reports: Sequence[Mapping[str, Any]]) -> list[str]:
    jobs: set[str] = set()
    for r in reports:
        batch = r.get("batch")
        if isinstance(batch, Mapping) and isinstance(batch.get("jobs"), Mapping):
            jobs.update(batch["jobs"])
    return sorted(jobs)


def render(title: str, reports: Mapping[str, Mapping[str, Any]]) -> str:
    labels = list(reports)
    rows = list(ROWS) + [
        (f"makespan job {job} (s)", report_value("batch", "jobs", job, "makespan_seconds"), "{:.2f}")
        for job in _jobs(list(reports.values()))
    ]
    header = ["metric", *labels, *(f"{label} / {labels[0]}" for label in labels[1:])]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, get, fmt in rows:
        values = [get(reports[label]) for label in labels]
        if all(v is None for v in values):
            continue
        cells = ["-" if v is None else fmt.format(v) for v in values]
        base = values[0]
        ratios = ["-" if v is None or not base else f"{v / base:.3f}" for v in values[1:]]
        lines.append("| " + " | ".join([name, *cells, *ratios]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_compare", description=__doc__.splitlines()[0])
    parser.add_argument("--title", required=True)
    parser.add_argument("--out", default=None, help="also write the table to this file (atomically)")
    parser.add_argument("reports", nargs="+", metavar="LABEL=REPORT.json")
    args = parser.parse_args(argv)
    reports: dict[str, dict[str, Any]] = {}
    for item in args.reports:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            print(f"batch_compare: REPORT: expected LABEL=REPORT.json, got {item!r}", file=sys.stderr)
            return 2
        try:
            with open(path, encoding="utf-8") as fh:
                reports[label] = json.load(fh)
        except (OSError, json.JSONDecodeError) as exc:
            print(f"batch_compare: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    text = render(args.title, reports)
    sys.stdout.write(text)
    if args.out:
        write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
