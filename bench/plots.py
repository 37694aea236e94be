"""PNG plots of a bench (optional: needs the ``plots`` extra, matplotlib, imported lazily).

``write_plots(reports, out_dir)`` writes ``jct_cdf.png`` (per-task JCT CDF per system),
``queue_wait_cdf.png`` (router and backend queue-wait CDFs from the histogram buckets) and
``cache_hit.png`` (token cache hit per system, preemptions annotated) and ``time_split.png`` (the
mean root Program's time to first tokens, decode and between turns as the client saw it, stacked per
system; beside it, for the systems that report it (agentd), the server's account per task: router
queue, prefill, recompute, decode, between turns, and the recomputed prompt tokens by cause,
docs/program-scheduling.md §14).  Returns the file names written, or ``[]`` when matplotlib is not
installed: report.md does not depend on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from actors.core.attribution import CAUSES

# (report key, legend) of the stacked bars of time_split.png
CLIENT_PARTS = (
    ("first_token", "to first token (queue + prefill)"),
    ("decode", "decode"),
    ("between_turns", "between turns (tools, subagents)"),
)
CAUSE_PARTS = tuple((cause, cause) for cause in CAUSES)
SERVER_PARTS = (
    ("queue", "router queue"),
    ("prefill", "prefill (new and cached tokens)"),
    ("recompute", "recompute (evicted KV, estimated)"),
    ("decode", "decode"),
    ("between_turns", "between turns (tools, humans)"),
)
# One colour per meaning across the panels of time_split.png: the server's queue, prefill and
# recompute are the client's time to first token (shades of blue, the recompute red to stand out),
# decode and between turns keep the client's colours, and the causes of recomputation (another
# quantity, tokens) take colours no time part uses.
PART_COLORS = {
    "first_token": "#4c72b0",
    "queue": "#a6c8e8",
    "prefill": "#4c72b0",
    "recompute": "#c44e52",
    "decode": "#dd8452",
    "between_turns": "#55a868",
}
CAUSE_COLORS = ("#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")


# The distribution is agentd-scheduler (the PyPI name "agentd" is another project's), so the extra
# is installed from the checkout.
NO_MATPLOTLIB = "matplotlib is not installed, so no PNG plots (from the checkout: .venv/bin/pip install -e '.[plots]')"


def missing_plots() -> str | None:
    """Why :func:`write_plots` would write nothing (``NO_MATPLOTLIB``), or None when it can plot."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return NO_MATPLOTLIB
    return None


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def write_plots(reports: Mapping[str, Mapping[str, Any]], out_dir: str) -> list[str]:
    try:  # the optional `plots` extra: imported only when plotting
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, rep in reports.items():
        values = rep.get("samples", {}).get("jct_seconds", [])
        if values:
            xs, ys = _cdf(values)
            ax.step(xs, ys, where="post", label=system)
    ax.set_xlabel("job completion time (trace s)")
    ax.set_ylabel("CDF")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "jct_cdf.png"), dpi=110)
    plt.close(fig)
    written.append("jct_cdf.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, rep in reports.items():
        for where, style in (("router", "-"), ("backend", ":")):
            hist = (rep.get("queue_wait_seconds") or {}).get(where)
            if not hist or not hist.get("count"):
                continue
            pts = hist.get("cdf") or []
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=".", label=f"{system} ({where})")
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("queue wait (trace s, bucket upper bounds)")
    ax.set_ylabel("CDF")
    # the title must fit the figure's width: the detail goes on a second, smaller line
    ax.set_title("Queue-wait CDF\nrouter: solid, backend: dotted (histogram bounds or summary quantiles)", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "queue_wait_cdf.png"), dpi=110)
    plt.close(fig)
    written.append("queue_wait_cdf.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    systems = list(reports)
    hits = [(reports[s].get("cache") or {}).get("token_hit_ratio") or 0.0 for s in systems]
    bars = ax.bar(systems, hits, color="#4c72b0")
    for bar, s in zip(bars, systems, strict=True):
        pre = reports[s].get("preemptions")
        label = f"{bar.get_height():.3f}\n{int(pre) if pre is not None else '-'} preempt."
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("token cache hit")
    ax.set_title("Token cache hit per system (preemptions annotated)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "cache_hit.png"), dpi=110)
    plt.close(fig)
    written.append("cache_hit.png")

    split: dict[str, Mapping[str, Any]] = {
        s: r["time_split_seconds"] for s, r in reports.items() if isinstance(r.get("time_split_seconds"), Mapping)
    }
    server: dict[str, Mapping[str, Any]] = {
        s: r["server_time_split"] for s, r in reports.items() if isinstance(r.get("server_time_split"), Mapping)
    }
    if split or server:
        # (title, y label, {system: {key: value}}, (key, legend) parts): the client's view of the root
        # Program, then agentd's own account (seconds, and the recomputed tokens by cause)
        panels: list[tuple[str, str, dict[str, Mapping[str, Any]], tuple[tuple[str, str], ...]]] = []
        if split:
            panels.append(
                ("Where a Program's time goes (client view)", "mean per root Program (trace s)", split, CLIENT_PARTS)
            )
        if server:
            seconds = {s: v.get("seconds_per_task") or {} for s, v in server.items()}
            tokens = {s: v.get("recomputed_tokens_per_task") or {} for s, v in server.items()}
            panels.append(
                ("agentd's account: time", "per task, summed over its Programs (trace s)", seconds, SERVER_PARTS)
            )
            panels.append(("agentd's account: recomputed tokens", "prompt tokens per task", tokens, CAUSE_PARTS))
        widths = [max(1.5, len(data)) + 1.0 for _, _, data, _ in panels]
        fig, axes = plt.subplots(
            1, len(panels), figsize=(1.6 * sum(widths), 5.0), squeeze=False, gridspec_kw={"width_ratios": widths}
        )
        for ax, (title, ylabel, data, parts) in zip(axes[0], panels, strict=True):
            names = list(data)
            bottom = [0.0] * len(names)
            height = max((sum(float(data[s].get(k) or 0.0) for k, _ in parts) for s in names), default=0.0)
            for i, (key, label) in enumerate(parts):
                values = [float(data[s].get(key) or 0.0) for s in names]
                color = PART_COLORS[key] if parts is not CAUSE_PARTS else CAUSE_COLORS[i % len(CAUSE_COLORS)]
                bars = ax.bar(names, values, bottom=bottom, label=label, width=0.6, color=color)
                for bar, v in zip(bars, values, strict=True):
                    if height > 0 and v >= 0.05 * height:  # label the parts tall enough to read
                        at = (bar.get_x() + bar.get_width() / 2, bar.get_y() + v / 2)
                        ax.annotate(f"{v:.0f}" if v >= 10 else f"{v:.1f}", at, ha="center", va="center", fontsize=7)
                bottom = [b + v for b, v in zip(bottom, values, strict=True)]
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=10)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2, frameon=False)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "time_split.png"), dpi=110)
        plt.close(fig)
        written.append("time_split.png")
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.plots --out DIR SYSTEM=REPORT.json ...``: the plots of saved reports (for
    benches whose driver writes no plots, such as ``bench.tool_bench``)."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=main.__doc__)
    parser.add_argument("--out", required=True, help="directory for the PNG files")
    parser.add_argument("reports", nargs="+", metavar="SYSTEM=REPORT.json", help="a system name and its JSON report")
    args = parser.parse_args(argv)
    reports: dict[str, Mapping[str, Any]] = {}
    for item in args.reports:
        system, sep, path = item.partition("=")
        if not sep or not system or not path:
            print(f"reports: expected SYSTEM=REPORT.json, got {item!r}", file=sys.stderr)
            return 2
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"reports: cannot read {path!r}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(data, dict):
            print(f"reports: {path!r} is not a JSON report object", file=sys.stderr)
            return 2
        reports[system] = data
    missing = missing_plots()
    if missing:  # before the directory is made: no empty output directory
        print(f"python -m bench.plots: {missing}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    written = write_plots(reports, args.out)
    for name in written:
        print(os.path.join(args.out, name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
