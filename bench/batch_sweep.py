"""The batch benchmarks of ``bench/batch_bench.sh`` over a range of KV sizes (docs/benchmarks.md §6.5).

``python -m bench.batch_sweep [--out DIR] [--batch-blocks 768,1024,...] [--mix-blocks 1000,...]
[--mix-seeds 1,2,3] [--jobs 2]`` runs ``bench/batch_bench.sh`` once per point, each with one
scenario (``SCENARIOS``): the batch-only scenario at every ``--batch-blocks`` size (KV blocks per
rank, ``BLOCKS_BATCH``), the agents + batch scenario at every ``--mix-blocks`` size (``BLOCKS_MIX``)
and trace seed (``MIX_SEED``).  At most ``--jobs`` points run at once, and a point runs its
simulations one after the other, so at most ``--jobs`` simulations run at a time (all in virtual
time: the numbers do not depend on the machine's load).  Each point's reports, configs, traces and
``summary.md`` are in ``DIR/batch-only-<blocks>/`` or ``DIR/mixed-<blocks>-s<seed>/``; a point
whose reports exist from an earlier run with the same parameters is reused (``--fresh`` re-runs
it), so an interrupted sweep continues where it stopped.

It writes ``DIR/sweep.md`` (one table per scenario: makespans and their ratios to FCFS dispatch,
engine preemptions, the batch-only trace's makespan floor for any order (``bench.batch_bound``)
and, beside agents, the agents' mean JCT), ``DIR/sweep.json`` (the same figures) and, with the
``plots`` extra (matplotlib), ``DIR/batch_sweep.png``.  Progress goes to stderr, one line per
point.  The sizes of the traces are batch_bench.sh's defaults unless ``--batch-requests``,
``--mix-programs`` or ``--mix-batch-requests`` say otherwise.  Exit 0, 1 when a point failed
(its log is named), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from bench.batch_bound import makespan_bound
from bench.interrupt import run_main
from bench.markdown import report_value
from bench.output import write_atomic
from bench.plots import missing_plots
from bench.trace.format import load_trace
from daemon.config_loading import load_config

SCRIPT = Path(__file__).with_name("batch_bench.sh")
BATCH_SYSTEMS = ("fcfs", "agentd", "engine-bja")
MIX_SYSTEMS = ("fcfs", "agentd-ps", "agentd", "engine-bja")
DEFAULT_BATCH_BLOCKS = "768,1024,1536,2048,3072,4096,8192"
DEFAULT_MIX_BLOCKS = "1000,1500,2500,4000"
DEFAULT_MIX_SEEDS = "1,2,3"
COLORS = {"fcfs": "C0", "agentd": "C1", "engine-bja": "C2"}  # one colour per system on every panel
# the issue-12 bars (docs/benchmarks.md §6.3), drawn on the plot
BAR_BATCH_ONLY = 0.90
BAR_AGENTS = 0.80
BAR_MIX_BATCH = 1.15


@attrs.frozen
class Point:
    """One run of batch_bench.sh: one scenario at one KV size (and trace seed)."""

    scenario: str  # "batch-only" or "mixed"
    blocks: int
    seed: int = 1

    @property
    def name(self) -> str:
        return f"batch-only-{self.blocks}" if self.scenario == "batch-only" else f"mixed-{self.blocks}-s{self.seed}"

    @property
    def systems(self) -> tuple[str, ...]:
        return BATCH_SYSTEMS if self.scenario == "batch-only" else MIX_SYSTEMS

    def env(self, sizes: Mapping[str, int]) -> dict[str, str]:
        env = {"SCENARIOS": self.scenario, **{k: str(v) for k, v in sizes.items()}}
        if self.scenario == "batch-only":
            env["BLOCKS_BATCH"] = str(self.blocks)
        else:
            env["BLOCKS_MIX"] = str(self.blocks)
            env["MIX_SEED"] = str(self.seed)
        return env

    def reports(self, out: Path) -> dict[str, Path]:
        return {system: out / self.name / self.scenario / f"{system}.json" for system in self.systems}


def _ints(text: str) -> tuple[int, ...]:
    """``"768,1024"`` -> (768, 1024); ``""`` -> () (the scenario is skipped)."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every value must be >= 1, got {text!r}")
    return values


def _params(point: Point, sizes: Mapping[str, int]) -> dict[str, Any]:
    return {"scenario": point.scenario, "blocks": point.blocks, "seed": point.seed, **sizes}


def _reusable(point: Point, out: Path, sizes: Mapping[str, int]) -> bool:
    stamp = out / point.name / "sweep-point.json"
    try:
        same = json.loads(stamp.read_text(encoding="utf-8")) == _params(point, sizes)
    except (OSError, ValueError):
        return False
    return same and all(p.is_file() for p in point.reports(out).values())


def _load(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a report")
    return data


def _num(report: Mapping[str, Any], *path: str) -> float | None:
    return report_value(*path)(report)


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def point_row(point: Point, out: Path) -> dict[str, Any]:
    """The sweep's figures of one finished point (module docstring)."""
    reports = {system: _load(path) for system, path in point.reports(out).items()}
    row: dict[str, Any] = {"blocks": point.blocks}
    if point.scenario == "mixed":
        row["seed"] = point.seed
    row["makespan_seconds"] = {s: _num(r, "batch", "makespan_seconds") for s, r in reports.items()}
    row["engine_preemptions"] = {s: _num(r, "batch", "engine_preemptions") for s, r in reports.items()}
    row["failed_batch_requests"] = {s: _num(r, "batch", "failed") for s, r in reports.items()}
    if point.scenario == "mixed":
        row["agents_jct_mean_seconds"] = {s: _num(r, "jct_seconds", "mean") for s, r in reports.items()}
        row["agents_jct_p90_seconds"] = {s: _num(r, "jct_seconds", "p90") for s, r in reports.items()}
        row["agents_failed_tasks"] = {s: _num(r, "tasks", "failed") for s, r in reports.items()}
    else:
        cfg = load_config(str(out / point.name / "configs" / "batch-fcfs.toml")).embedded
        bound = makespan_bound(
            load_trace(str(out / point.name / "batch.jsonl")).records,
            ranks=cfg.num_workers * cfg.dp_size,
            kv_tokens_per_rank=cfg.num_gpu_blocks * cfg.block_size,
        )
        row["kv_tokens_per_rank"] = bound.kv_tokens_per_rank
        row["floor_seconds"] = bound.makespan_seconds
    return row


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _failed(row: Mapping[str, Any]) -> str:
    """Failed agents' tasks and batch requests summed over the systems: ``0 / 0`` in a healthy run."""
    tasks = sum(v or 0 for v in row["agents_failed_tasks"].values())
    batch = sum(v or 0 for v in row["failed_batch_requests"].values())
    return f"{tasks:.0f} / {batch:.0f}"


def render(rows: Mapping[str, Sequence[Mapping[str, Any]]], sizes: Mapping[str, int]) -> str:
    """``sweep.md``: one table per scenario that was run."""
    lines: list[str] = []
    batch = rows.get("batch-only") or []
    if batch:
        lines += [
            f"## batch only ({sizes['BATCH_REQUESTS']} requests; one worker x 2 DP ranks; makespan ratios to fcfs)",
            "",
            "| KV blocks per rank | fcfs makespan (s) | agentd / fcfs | engine-bja / fcfs | floor / fcfs | "
            "floor / agentd | preemptions fcfs / agentd / engine-bja | failed batch requests |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in batch:
            m = r["makespan_seconds"]
            p = r["engine_preemptions"]
            lines.append(
                f"| {r['blocks']} | {_f(m['fcfs'], '{:.2f}')} | {_f(_ratio(m['agentd'], m['fcfs']), '{:.3f}')} | "
                f"{_f(_ratio(m['engine-bja'], m['fcfs']), '{:.3f}')} | "
                f"{_f(_ratio(r['floor_seconds'], m['fcfs']), '{:.3f}')} | "
                f"{_f(_ratio(r['floor_seconds'], m['agentd']), '{:.3f}')} | "
                + " / ".join(_f(p[s], "{:.0f}") for s in BATCH_SYSTEMS)
                + f" | {sum(v or 0 for v in r['failed_batch_requests'].values()):.0f} |"
            )
    mixed = rows.get("mixed") or []
    if mixed:
        if lines:
            lines.append("")
        lines += [
            f"## agents + batch ({sizes['MIX_PROGRAMS']} swe-short Programs + {sizes['MIX_BATCH_REQUESTS']} batch "
            "requests; two workers x 2 DP ranks; ratios to fcfs)",
            "",
            "| KV blocks per rank | seed | fcfs agents' JCT mean (s) | fcfs batch makespan (s) | "
            "agentd agents' JCT / fcfs | agentd batch makespan / fcfs | agentd-ps agents' JCT / fcfs | "
            "engine-bja agents' JCT / fcfs | engine-bja batch makespan / fcfs | "
            "preemptions fcfs / agentd-ps / agentd / engine-bja | failed agents' tasks / batch requests |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in mixed:
            j = r["agents_jct_mean_seconds"]
            m = r["makespan_seconds"]
            p = r["engine_preemptions"]
            lines.append(
                f"| {r['blocks']} | {r['seed']} | {_f(j['fcfs'], '{:.2f}')} | {_f(m['fcfs'], '{:.2f}')} | "
                f"{_f(_ratio(j['agentd'], j['fcfs']), '{:.3f}')} | {_f(_ratio(m['agentd'], m['fcfs']), '{:.3f}')} | "
                f"{_f(_ratio(j['agentd-ps'], j['fcfs']), '{:.3f}')} | "
                f"{_f(_ratio(j['engine-bja'], j['fcfs']), '{:.3f}')} | "
                f"{_f(_ratio(m['engine-bja'], m['fcfs']), '{:.3f}')} | "
                + " / ".join(_f(p[s], "{:.0f}") for s in MIX_SYSTEMS)
                + f" | {_failed(r)} |"
            )
    return "\n".join(lines) + "\n"


def _kv_axis(ax: Any, blocks: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(blocks)))
    ax.set_xticklabels([str(b) for b in sorted(set(blocks))], rotation=45)
    ax.minorticks_off()
    ax.set_xlabel("KV blocks per rank (16 tokens each)")


def write_plot(rows: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> bool:
    """``batch_sweep.png``: the ratios against the KV size; False without matplotlib."""
    try:  # the optional `plots` extra: imported only when plotting
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    batch = rows.get("batch-only") or []
    mixed = rows.get("mixed") or []
    panels = (2 if batch else 0) + (1 if mixed else 0)
    if not panels:
        return False
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.5), squeeze=False)
    ax_iter = iter(axes[0])
    if batch:
        ax = next(ax_iter)
        xs = [r["blocks"] for r in batch]
        for label, color, get in (
            (
                "agentd / fcfs",
                COLORS["agentd"],
                lambda r: _ratio(r["makespan_seconds"]["agentd"], r["makespan_seconds"]["fcfs"]),
            ),
            (
                "engine-bja / fcfs",
                COLORS["engine-bja"],
                lambda r: _ratio(r["makespan_seconds"]["engine-bja"], r["makespan_seconds"]["fcfs"]),
            ),
            ("floor (any order) / fcfs", "C3", lambda r: _ratio(r["floor_seconds"], r["makespan_seconds"]["fcfs"])),
        ):
            ax.plot(xs, [get(r) for r in batch], marker="o", color=color, label=label)
        ax.axhline(BAR_BATCH_ONLY, color="grey", linestyle=":", label=f"bar ({BAR_BATCH_ONLY})")
        ax.axhline(1.0, color="black", linewidth=0.8)
        _kv_axis(ax, xs)
        ax.set_ylabel("batch makespan / fcfs")
        ax.set_title("batch only: makespan")
        ax.grid(alpha=0.3)
        ax.legend()
        ax = next(ax_iter)
        for system in BATCH_SYSTEMS:
            ax.plot(
                xs, [r["engine_preemptions"][system] for r in batch], marker="o", color=COLORS[system], label=system
            )
        _kv_axis(ax, xs)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("engine preemptions")
        ax.set_title("batch only: preemptions")
        ax.grid(alpha=0.3)
        ax.legend()
    if mixed:
        ax = next(ax_iter)
        seeds = sorted({r["seed"] for r in mixed})
        for n, seed in enumerate(seeds):
            mine = [r for r in mixed if r["seed"] == seed]
            xs = [r["blocks"] for r in mine]
            color = f"C{n}"
            ax.plot(
                xs,
                [_ratio(r["agents_jct_mean_seconds"]["agentd"], r["agents_jct_mean_seconds"]["fcfs"]) for r in mine],
                marker="o",
                color=color,
                label=f"agents' JCT, seed {seed}",
            )
            ax.plot(
                xs,
                [_ratio(r["makespan_seconds"]["agentd"], r["makespan_seconds"]["fcfs"]) for r in mine],
                marker="s",
                linestyle="--",
                color=color,
                label=f"batch makespan, seed {seed}",
            )
        ax.axhline(BAR_AGENTS, color="grey", linestyle=":")
        ax.axhline(BAR_MIX_BATCH, color="grey", linestyle="-.")
        ax.axhline(1.0, color="black", linewidth=0.8)
        _kv_axis(ax, [r["blocks"] for r in mixed])
        ax.set_ylabel("agentd / fcfs co-location")
        ax.set_title(f"agents + batch (bars {BAR_AGENTS} and {BAR_MIX_BATCH})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _start(point: Point, out: Path, script: Path, sizes: Mapping[str, int]) -> subprocess.Popen[bytes]:
    (out / point.name).mkdir(parents=True, exist_ok=True)
    (out / point.name / "sweep-point.json").unlink(missing_ok=True)
    log = open(out / point.name / "log.txt", "wb")  # noqa: SIM115 - the child owns it until it ends
    try:
        return subprocess.Popen(
            ["bash", str(script), str(out / point.name)],
            env={**os.environ, **point.env(sizes)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped whole (the script and its agentd)
        )
    finally:
        log.close()


def run_sweep(
    points: Sequence[Point],
    out: Path,
    *,
    sizes: Mapping[str, int],
    jobs: int = 2,
    fresh: bool = False,
    script: Path = SCRIPT,
    poll_seconds: float = 0.2,
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Run (or reuse) every point, at most ``jobs`` at once; ({scenario: rows}, failed point names)."""
    out.mkdir(parents=True, exist_ok=True)
    todo = list(points)
    running: dict[Point, tuple[subprocess.Popen[bytes], float]] = {}
    done = 0
    failed: list[str] = []
    total = len(todo)

    def say(point: Point, what: str) -> None:
        print(f"batch sweep: [{done}/{total}] {point.name}: {what}", file=sys.stderr, flush=True)

    try:
        while todo or running:
            while todo and len(running) < jobs:
                point = todo.pop(0)
                if not fresh and _reusable(point, out, sizes):
                    done += 1
                    say(point, "reused (same parameters; --fresh re-runs it)")
                    continue
                running[point] = (_start(point, out, script, sizes), time.monotonic())
                print(f"batch sweep: {point.name}: started", file=sys.stderr, flush=True)
            for point, (proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[point]
                done += 1
                missing = [s for s, p in point.reports(out).items() if not p.is_file()]
                if proc.returncode != 0 or missing:
                    failed.append(point.name)
                    say(point, f"FAILED (exit {proc.returncode}; see {out / point.name / 'log.txt'})")
                    continue
                write_atomic(out / point.name / "sweep-point.json", json.dumps(_params(point, sizes)))
                say(point, f"done in {time.monotonic() - t0:.0f} s")
            if running:
                time.sleep(poll_seconds)
    finally:  # interrupted (Ctrl-C, an error): stop the points still running, script and simulation
        for proc, _ in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in running.values():
            proc.wait()
    rows: dict[str, list[dict[str, Any]]] = {}
    for point in points:
        if point.name not in failed:
            rows.setdefault(point.scenario, []).append(point_row(point, out))
    return rows, failed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.batch_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="batch-sweep-out", help="output directory (default: batch-sweep-out)")
    ap.add_argument(
        "--batch-blocks",
        type=_ints,
        default=DEFAULT_BATCH_BLOCKS,
        help="KV blocks per rank of the batch-only points, comma-separated ('' skips the scenario; "
        "default: %(default)s)",
    )
    ap.add_argument(
        "--mix-blocks",
        type=_ints,
        default=DEFAULT_MIX_BLOCKS,
        help="KV blocks per rank of the agents + batch points ('' skips; default: %(default)s)",
    )
    ap.add_argument("--mix-seeds", type=_ints, default=DEFAULT_MIX_SEEDS, help="trace seeds (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=2, help="points (simulations) at once (default: 2)")
    ap.add_argument("--batch-requests", type=int, default=400, help="BATCH_REQUESTS (default: 400)")
    ap.add_argument("--mix-programs", type=int, default=8, help="MIX_PROGRAMS (default: 8)")
    ap.add_argument("--mix-batch-requests", type=int, default=800, help="MIX_BATCH_REQUESTS (default: 800)")
    ap.add_argument("--fresh", action="store_true", help="re-run points whose reports exist")
    args = ap.parse_args(argv)
    if not args.out:
        ap.error("--out: must not be empty")
    if args.jobs < 1:
        ap.error("--jobs: must be >= 1")
    if min(args.batch_requests, args.mix_programs, args.mix_batch_requests) < 1:
        ap.error("--batch-requests, --mix-programs and --mix-batch-requests must be >= 1")
    if args.mix_blocks and not args.mix_seeds:
        ap.error("--mix-seeds: at least one seed for the agents + batch points")
    points = [Point("batch-only", b) for b in args.batch_blocks] + [
        Point("mixed", b, s) for s in args.mix_seeds for b in args.mix_blocks
    ]
    if not points:
        ap.error("nothing to run: --batch-blocks and --mix-blocks are both empty")
    sizes = {
        "BATCH_REQUESTS": args.batch_requests,
        "MIX_PROGRAMS": args.mix_programs,
        "MIX_BATCH_REQUESTS": args.mix_batch_requests,
    }
    out = Path(args.out)
    t0 = time.monotonic()
    rows, failed = run_sweep(points, out, sizes=sizes, jobs=args.jobs, fresh=args.fresh, script=SCRIPT)
    for scenario in rows:  # the tables in KV order (mixed: then by seed)
        rows[scenario].sort(key=lambda r: (r["blocks"], r.get("seed", 0)))
    text = render(rows, sizes)
    write_atomic(out / "sweep.md", text)
    write_atomic(out / "sweep.json", json.dumps({"sizes": sizes, **rows}, indent=2, sort_keys=True) + "\n")
    sys.stdout.write(text)
    if write_plot(rows, out / "batch_sweep.png"):
        print(f"batch sweep: plot in {out / 'batch_sweep.png'}", file=sys.stderr)
    else:
        print(f"batch sweep: {missing_plots() or 'no plot'}", file=sys.stderr)
    print(f"batch sweep: {time.monotonic() - t0:.0f} s wall; tables in {out / 'sweep.md'}", file=sys.stderr)
    if failed:
        print(f"batch sweep: {len(failed)} point(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.batch_sweep"))
