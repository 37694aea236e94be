"""Queue ETA accuracy in virtual time (docs/program-scheduling.md §13, docs/benchmarks.md §9.5).

``python -m bench.eta_bench [--points thrash,tools,...] [--seeds 1,2,3] [--resume-order mru|fcfs] [--out DIR]``

Runs ``agentd`` (the bench's Program scheduling configuration, bench.calibrate.config_for) on each
point of bench.tool_bench (the issue-17 traces and clusters) through ``agentd simulate``'s
in-process daemon, deterministic virtual time, and prints, per point, what the run's
``scheduling.queue_eta`` section says: how many queued requests were admitted and compared, and
the median and p90 of ``|first ETA - actual wait| / actual wait``.  ``--seeds`` runs each point's
trace with other synthesis seeds too (default: the point's own).  ``--out`` keeps each report.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import attrs

from bench.bench import ClusterSpec
from bench.calibrate import config_for
from bench.output import report_json, write_atomic
from bench.replay import ReplayOptions
from bench.simulate import run_simulation
from bench.tool_bench import POINTS
from bench.trace.synth import synthesize


def run_point(name: str, resume_order: str, seed: int | None = None) -> dict[str, Any]:
    point = POINTS[name] if seed is None else attrs.evolve(POINTS[name], seed=seed)
    trace = synthesize(point.profile, point.programs, point.seed, point.knobs)
    cluster = ClusterSpec(workers=2, dp_size=2, num_gpu_blocks=point.kv_blocks, time_scale=1.0)
    cfg = config_for(cluster, "agentd", {"resume_order": resume_order})
    return run_simulation(cfg, trace, ReplayOptions(concurrency=point.concurrency, sim_hints=True), system="agentd")


def row(name: str, report: dict[str, Any], wall: float) -> str:
    eta = report.get("scheduling", {}).get("queue_eta") or {}
    med, p90 = eta.get("median_relative_error"), eta.get("p90_relative_error")
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    jct = report.get("jct_seconds", {}).get("mean")
    return (
        f"| {name} | {eta.get('samples_count', 0)} | {fmt(med)} | {fmt(p90)} | "
        f"{'-' if jct is None else f'{jct:.1f}'} | {wall:.0f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eta_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="thrash", help=f"comma-separated, of {', '.join(POINTS)}")
    parser.add_argument("--seeds", default=None, help="comma-separated trace seeds (default: each point's own)")
    parser.add_argument("--resume-order", default="mru", choices=("mru", "fcfs"))
    parser.add_argument("--out", default=None, help="directory for the reports (JSON)")
    args = parser.parse_args(argv)
    names = [n for n in args.points.split(",") if n]
    unknown = [n for n in names if n not in POINTS]
    if unknown or not names:
        print(f"--points: unknown point(s) {unknown}; choose from {', '.join(POINTS)}", file=sys.stderr)
        return 2
    seeds: list[int | None] = [None]
    if args.seeds is not None:
        try:
            seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        except ValueError:
            seeds = []
        if not seeds:
            print(f"--seeds: expected comma-separated integers (got {args.seeds!r})", file=sys.stderr)
            return 2
    print(f"# Queue ETA accuracy (resume_order = {args.resume_order})\n")
    print("| point | admitted queued requests | median rel. error | p90 rel. error | mean JCT (s) | wall (s) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        for seed in seeds:
            label = name if seed is None else f"{name} seed {seed}"
            started = time.perf_counter()
            report = run_point(name, args.resume_order, seed)
            wall = time.perf_counter() - started
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                tail = "" if seed is None else f"-seed{seed}"
                write_atomic(os.path.join(args.out, f"{name}{tail}-{args.resume_order}.json"), report_json(report))
            print(row(label, report, wall), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
