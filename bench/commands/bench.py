"""``agentd bench --trace FILE --out DIR``: the same trace through several systems, side by side.

Systems (``--systems``, comma separated): ``native``, ``agentd``, ``vllm-router``,
``vllm-router-ps`` (these two only when the ``vllm-router`` executable is found: ``--vllm-router``
or PATH) and ``floor`` (native with ``--floor-kv-blocks`` per rank: the unlimited-KV floor).
Each runs in front of fresh ``agentd sim-backend`` workers of identical size and time scale
(bench.bench).  Writes ``<system>.json`` per system, ``report.md`` and, when
matplotlib is installed, PNG plots.

Pressure points: ``--point eviction`` (12 concurrent agents, KV sized so native lands near 0.80
token cache hit) and ``--point thrash`` (32 concurrent agents, native near 0.62 with preemptions).
``--target-native-hit R`` sizes the per-rank KV (``--kv-blocks``) by bisection with in-process
virtual-time simulations of the ``native`` system (bench.calibrate) before the real runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import attrs

from actors.core.config import problems as config_problems
from bench.bench import (
    FLOOR_KV_BLOCKS,
    SYSTEMS,
    BenchError,
    BenchOptions,
    BenchUsageError,
    ClusterSpec,
    bench_ports,
    find_vllm_router,
    run_bench,
    scaled_program_config,
)
from bench.calibrate import calibrate_kv_blocks
from bench.commands.common import add_replay_flags, from_args, load_trace_arg, replay_options
from bench.interrupt import run_interruptible
from bench.markdown import render_report
from bench.output import write_atomic
from bench.plots import missing_plots, write_plots
from bench.report import trace_summary
from daemon.commands.argtypes import int_at_least, positive_float, positive_int
from daemon.commands.paths import output_dir_problem
from daemon.config_loading import ConfigError, load_config
from sim.config import SCHEDULING_POLICIES

NAME = "bench"
HELP = "Run one trace through native agentd, agentd with Program scheduling and vllm-router, side by side."

POINTS: dict[str, dict[str, Any]] = {
    "eviction": {"concurrency": 12, "target_native_hit": 0.80},
    "thrash": {"concurrency": 32, "target_native_hit": 0.62},
}


def _ratio(text: str) -> float:
    value = positive_float(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="trace JSONL (agentd trace synth)")
    parser.add_argument("--out", required=True, help="output directory (reports, report.md, plots, logs)")
    parser.add_argument(
        "--systems", default=None, help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all available)"
    )
    parser.add_argument("--vllm-router", default=None, metavar="PATH", help="vllm-router executable (default: PATH)")
    parser.add_argument(
        "--point", choices=sorted(POINTS), default=None, help="pressure-point preset: concurrency and target native hit"
    )
    parser.add_argument(
        "--target-native-hit",
        type=_ratio,
        default=None,
        help="size --kv-blocks so native lands near this token cache hit (calibrated by simulation)",
    )
    parser.add_argument("--workers", type=positive_int, default=2, help="simulated workers per system")
    parser.add_argument("--dp-size", type=positive_int, default=2, help="DP ranks per worker")
    parser.add_argument("--kv-blocks", type=positive_int, default=4096, help="KV blocks per rank (num_gpu_blocks)")
    parser.add_argument(
        "--floor-kv-blocks",
        type=positive_int,
        default=FLOOR_KV_BLOCKS,
        help="KV blocks per rank of the `floor` system (native with unlimited KV)",
    )
    parser.add_argument("--block-size", type=positive_int, default=16)
    parser.add_argument("--max-num-seqs", type=positive_int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=8192)
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="simulated worker seed (>= 0)")
    parser.add_argument(
        "--scheduling-policy",
        choices=SCHEDULING_POLICIES,
        default="fcfs",
        help="the simulated engines' waiting-queue policy (docs/simulator.md §1)",
    )
    parser.add_argument(
        "--ps-config-json",
        default=None,
        metavar="JSON",
        help="extra Program scheduling fields for agentd and vllm-router-ps",
    )
    parser.add_argument(
        "--port-base",
        type=_port_base,
        default=18100,
        help="fixed loopback ports: router BASE, its metrics BASE+1, workers BASE+2.. "
        "(same for every system, so hash placement is reproducible; 0 = ephemeral)",
    )
    parser.add_argument(
        "--agentd-processes",
        type=_processes,
        default=1,
        help="agentd's data_plane_processes for the native and agentd systems (default 1; docs/operations.md §13)",
    )
    parser.add_argument("--no-progress", action="store_true")
    add_replay_flags(parser)


def _processes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _port_base(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer port, got {text!r}") from None
    if value != 0 and not 1024 <= value <= 65000:
        raise argparse.ArgumentTypeError(f"must be 0 (ephemeral) or in 1024..65000, got {text!r}")
    return value


def _systems(args: argparse.Namespace, router: str | None) -> tuple[str, ...] | str:
    if args.systems is None:
        return SYSTEMS if router else ("native", "agentd")
    chosen = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    for s in chosen:
        if s not in SYSTEMS:
            return f"--systems: unknown system {s!r} (choose from {', '.join(SYSTEMS)})"
        if s.startswith("vllm-router") and router is None:
            return f"--systems: {s} needs the vllm-router executable (pass --vllm-router PATH or put it on PATH)"
    if not chosen:
        return "--systems: must name at least one system"
    return chosen


def _program_config_problems(cluster: ClusterSpec, overrides: dict[str, Any]) -> list[str]:
    """What agentd says of the Program scheduling JSON the bench would start it with (the scaled
    defaults with ``--ps-config-json`` over them), one line per problem naming the field."""
    try:
        load_config(
            None, {"enable_program_scheduling": True, "program_scheduling": scaled_program_config(cluster, overrides)}
        )
    except ConfigError as exc:
        return list(exc.lines)
    return []


def _worker_problems(cluster: ClusterSpec, floor_kv_blocks: int | None) -> list[str]:
    """What one simulated worker process cannot hold (docs/simulator.md §4), naming the flags; with
    ``floor_kv_blocks``, the `floor` system's workers too."""
    shapes = [(cluster, "--kv-blocks")]
    if floor_kv_blocks is not None:
        floor = attrs.evolve(cluster, num_gpu_blocks=max(cluster.num_gpu_blocks, floor_kv_blocks))
        shapes.append((floor, "--floor-kv-blocks"))
    found: list[str] = []
    for shape, blocks_flag in shapes:
        for problem in config_problems(shape):
            line = problem.replace("num_gpu_blocks", blocks_flag).replace("dp_size", "--dp-size")
            if line not in found:
                found.append(line)
    return found


def run(args: argparse.Namespace) -> int:
    problem = output_dir_problem(args.out, "--out")
    if problem is not None:
        print(f"agentd bench: {problem}", file=sys.stderr)
        return 2
    trace = load_trace_arg(args.trace, "agentd bench")
    if trace is None:
        return 2
    router = find_vllm_router(args.vllm_router)
    if args.vllm_router and router is None:
        print(f"agentd bench: --vllm-router {args.vllm_router!r} is not an executable file", file=sys.stderr)
        return 2
    systems = _systems(args, router)
    if isinstance(systems, str):
        print(f"agentd bench: {systems}", file=sys.stderr)
        return 2
    overrides: dict[str, Any] = {}
    if args.ps_config_json:
        try:
            overrides = json.loads(args.ps_config_json)
        except json.JSONDecodeError as exc:
            print(f"agentd bench: --ps-config-json is not valid JSON ({exc})", file=sys.stderr)
            return 2
        if not isinstance(overrides, dict):
            print("agentd bench: --ps-config-json must be a JSON object", file=sys.stderr)
            return 2
    no_plots = missing_plots()  # said with the report (stderr and report.md)
    preset = POINTS.get(args.point or "", {})
    if args.concurrency is None and "concurrency" in preset:
        args.concurrency = preset["concurrency"]
    target_hit = args.target_native_hit if args.target_native_hit is not None else preset.get("target_native_hit")
    cluster = from_args(ClusterSpec, args, num_gpu_blocks="kv_blocks")
    worker_problems = _worker_problems(cluster, args.floor_kv_blocks if "floor" in systems else None)
    if worker_problems:  # each simulated worker exited 2 with them after the bench had started (exit 1)
        for line in worker_problems:
            print(f"agentd bench: {line}", file=sys.stderr)
        return 2
    problems = _program_config_problems(cluster, overrides) if overrides and "agentd" in systems else []
    if problems:  # agentd refused them at its start, after the systems before it had run (exit 1)
        for line in problems:
            print(f"agentd bench: --ps-config-json: {line}", file=sys.stderr)
        return 2
    if args.port_base:
        # checked again by each system as it starts; found there first, the problem was an exit 2
        # that left OUT and an empty OUT/logs/<system> behind (docs/traces.md, "Bench systems")
        try:
            bench_ports(args.port_base, cluster.workers)
        except BenchUsageError as exc:
            print(f"agentd bench: {exc}", file=sys.stderr)
            return 2
    replay = replay_options(args)
    context = [
        f"- trace: `{args.trace}` (profile {trace.meta.profile}, seed {trace.meta.seed}, "
        f"{len(trace.sessions())} programs, {len(trace.records)} requests)"
    ]
    if target_hit is not None:
        blocks, hit = calibrate_kv_blocks(
            trace, cluster, replay, target_hit, log=lambda m: print(f"calibrate: {m}", file=sys.stderr)
        )
        cluster = attrs.evolve(cluster, num_gpu_blocks=blocks)
        context.append(
            f"- KV calibrated by simulation: {blocks} blocks/rank gives native hit {hit:.3f} (target {target_hit:.2f})"
        )
    context.append(
        f"- cluster: {cluster.workers} workers x {cluster.dp_size} DP ranks, {cluster.num_gpu_blocks} blocks x "
        f"{cluster.block_size} tokens = {cluster.rank_kv_tokens} KV tokens/rank, max_num_seqs "
        f"{cluster.max_num_seqs}, time scale {cluster.time_scale:g}, engine policy {cluster.scheduling_policy}"
    )
    context.append(
        f"- replay: concurrency {replay.concurrency or trace.meta.concurrency}, "
        f"agentic context {replay.agentic_context}"
    )
    if args.agentd_processes != 1:
        context.append(f"- agentd: data_plane_processes {args.agentd_processes} (native and agentd)")
    opts = BenchOptions(
        out_dir=args.out,
        systems=systems,
        cluster=cluster,
        replay=replay,
        vllm_router=router,
        program_overrides=overrides,
        progress=not args.no_progress,
        port_base=args.port_base,
        floor_kv_blocks=args.floor_kv_blocks,
        agentd_processes=args.agentd_processes,
    )
    info = trace_summary(trace, args.trace, replay.concurrency)
    try:
        # Ctrl-C cancels the run (its processes stopped, their temporary directories removed);
        # Trio's default raised KeyboardInterrupt wherever the task was, once inside Trio itself
        reports = run_interruptible(lambda: run_bench(trace, opts, info))
    except BenchError as exc:
        print(f"agentd bench: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, BenchUsageError) else 1
    plots = write_plots(reports, args.out)
    if no_plots:
        print(f"agentd bench: {no_plots}", file=sys.stderr)
        context = [*context, f"- plots: none; {no_plots}"]
    text = render_report(reports, title=f"agentd bench: {trace.meta.profile}", context=context, plots=plots)
    write_atomic(os.path.join(args.out, "report.md"), text + "\n")
    print(text)
    return 0 if all(r["requests"]["failed"] == 0 for r in reports.values()) else 1
