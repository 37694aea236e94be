"""The side-by-side tables of the priority and fairness benchmarks (bench/fairness_bench.sh,
docs/benchmarks.md §7).

``python -m bench.fairness.compare --kind noisy|interactive --title T LABEL=ALONE.json,WITH.json ...``
prints a markdown table, one row per system (the first is the baseline for the throughput ratio):

* ``noisy``: the light tenant's mean JCT alone and with the flooding tenant, their ratio (bar:
  <= 1.25), the flood's mean JCT, the cluster's total tokens per second with the flood and its
  ratio to the first row (bar: within 5% of native);
* ``interactive``: the interactive tenant's TTFT p90 alone and with the batch job, their ratio
  (bar: <= 1.2), the TTFT p50 with the batch job, the batch makespan and total tokens per second.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from bench.fairness.properties import victim_figure
from bench.output import write_atomic


def _get(report: Mapping[str, Any], *path: str) -> float | None:
    node: Any = report
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return float(node) if isinstance(node, (int, float)) else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def noisy_table(runs: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[str]:
    header = (
        "| system | light JCT alone (s) | light JCT with flood (s) | ratio (bar <= 1.25) | flood JCT (s) "
        "| total tokens/s with flood | vs first row | failed |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    base_tps: float | None = None
    for label, (alone, both) in runs.items():
        a = victim_figure(alone, "light", ("jct_seconds", "mean"))
        b = victim_figure(both, "light", ("jct_seconds", "mean"))
        flood = victim_figure(both, "flood", ("jct_seconds", "mean"))
        tps = _get(both, "throughput", "total_tokens_per_second")
        if base_tps is None:
            base_tps = tps
        failed = (_get(alone, "requests", "failed") or 0) + (_get(both, "requests", "failed") or 0)
        lines.append(
            f"| {label} | {_fmt(a, '.2f')} | {_fmt(b, '.2f')} | {_fmt(_ratio(b, a), '.3f')} | {_fmt(flood, '.2f')} "
            f"| {_fmt(tps, '.0f')} | {_fmt(_ratio(tps, base_tps), '.3f')} | {failed:.0f} |"
        )
    return lines


def interactive_table(runs: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[str]:
    header = (
        "| system | interactive TTFT p90 alone (s) | with batch (s) | ratio (bar <= 1.2) | TTFT p50 with batch (s) "
        "| batch makespan (s) | batch total tokens/s | failed |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for label, (alone, both) in runs.items():
        a = victim_figure(alone, "interactive", ("ttft_seconds", "p90"))
        b = victim_figure(both, "interactive", ("ttft_seconds", "p90"))
        p50 = victim_figure(both, "interactive", ("ttft_seconds", "p50"))
        failed = (_get(alone, "requests", "failed") or 0) + (_get(both, "requests", "failed") or 0)
        lines.append(
            f"| {label} | {_fmt(a, '.3f')} | {_fmt(b, '.3f')} | {_fmt(_ratio(b, a), '.3f')} | {_fmt(p50, '.3f')} "
            f"| {_fmt(_get(both, 'batch', 'makespan_seconds'), '.2f')} "
            f"| {_fmt(_get(both, 'batch', 'total_tokens_per_second'), '.0f')} | {failed:.0f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--kind", required=True, choices=("noisy", "interactive"))
    parser.add_argument("--title", required=True)
    parser.add_argument("--out", default=None, help="also write the table to this file (atomically)")
    parser.add_argument("runs", nargs="+", metavar="LABEL=ALONE.json,WITH.json")
    args = parser.parse_args(argv)
    runs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for item in args.runs:
        label, sep, paths = item.partition("=")
        alone_path, comma, with_path = paths.partition(",")
        if not (sep and comma and label and alone_path and with_path):
            print(f"fairness compare: RUN: expected LABEL=ALONE.json,WITH.json, got {item!r}", file=sys.stderr)
            return 2
        try:
            with open(alone_path, encoding="utf-8") as fa, open(with_path, encoding="utf-8") as fb:
                runs[label] = (json.load(fa), json.load(fb))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"fairness compare: cannot read {item}: {exc}", file=sys.stderr)
            return 2
    table = noisy_table(runs) if args.kind == "noisy" else interactive_table(runs)
    text = "\n".join([f"## {args.title}", "", *table]) + "\n"
    sys.stdout.write(text)
    if args.out:
        write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
