"""Tool-call-aware retention in virtual time: each bench point against its unlimited-KV floor.

``python -m bench.tool_bench --out DIR [--points thrash,tools,...] [--systems ...] [--seeds 1,2,3] [--jobs 2]``

For every point (a trace and a cluster, docs/benchmarks.md §9) the same trace runs through
``agentd simulate``'s in-process daemon (bench.simulate, deterministic virtual time) as:

- ``native``: no Program scheduling, consistent hash on the session;
- ``floor``: ``native`` with ``FLOOR_KV_BLOCKS`` per rank (nothing is evicted);
- ``agentd-floor``: ``agentd`` on the same unlimited KV (its balanced placement and queueing
  without any eviction: what is left for retention to win);
- ``agentd``: Program scheduling with the bench's configuration (bench.bench.scaled_program_config)
  and the per-tool acting TTL on (docs/program-scheduling.md §12);
- ablations, one mechanism changed each: ``agentd-no-tool-ttl`` (``tool_retention.enabled =
  false``: the fitted per-rank TTL only, the reference's behaviour), ``agentd-cap-at-fit``
  (``contention = "cap_at_fit"``: no rent, a per-tool TTL capped at the fit while Programs wait),
  ``agentd-hold-under-contention`` (``contention = "ignore"``: rent 1 always),
  ``agentd-measured-miss`` (``measured_miss = true``: a miss after a tool priced with the miss
  ratio measured after that tool), ``agentd-no-finish-keys`` (turns without a tool call are not learned),
  ``agentd-no-release`` (a decision to hold nothing falls back to the fit);
  ``agentd-move-resident`` (``cross_rank_move_cost = "resident"``: the cross-rank patience priced
  at the part of the context the previous rank probably still caches, docs/program-scheduling.md
  §12.1); ``agentd-las`` (``resume_order = "las"``: the waiting Program whose task attained the
  least service so far resumes first, docs/program-scheduling.md §5.1).  ``--ps-config-json
  '{...}'`` merges Program scheduling fields into every agentd row (a field under test, before it
  gets a row of its own).

The per-tool tables (agentd and agentd-no-tool-ttl) show the diagnostics of
docs/program-scheduling.md §12: decisions against the fitted TTL, how Programs came back, and what
the gaps after each tool cost in recomputation.

Writes ``<out>/<point>/<system>.json`` and ``<out>/report.md`` (mean JCT, p90, hit, preemptions and
the ratios agentd / floor and agentd / native per point).  Simulations run ``--jobs`` at a time in
separate processes.

``--seeds 1,2,3,4,5`` synthesises each point's trace once per seed (instead of the point's own
seed) and runs every system on every seed: ``<out>/<point>/seed<N>/<system>.json``, and a report
with each point's mean JCT per seed and, per seed, the ratio of every system to ``native``,
``floor`` and ``agentd`` (those in ``--systems``) with their mean, geomean, min, max and standard
deviation over the seeds.  One trace moves by 1-2% with any scheduling change (docs/benchmarks.md
§4.1), so a default is decided on the seeds' spread, not on one trace (§9.5.3).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import attrs

from bench.bench import FLOOR_KV_BLOCKS, ClusterSpec
from bench.calibrate import config_for
from bench.interrupt import run_main
from bench.output import report_json, write_atomic
from bench.replay import ReplayOptions
from bench.simulate import run_simulation
from bench.trace.synth import Knobs, synthesize
from daemon.commands.argtypes import positive_int, positive_int_list
from daemon.commands.paths import output_dir_problem
from daemon.config import AgentdConfig
from daemon.config_loading import ConfigError


@attrs.frozen
class Point:
    profile: str
    programs: int
    seed: int
    kv_blocks: int
    concurrency: int | None
    knobs: Knobs = Knobs()


# The issue's points (docs/benchmarks.md §4 and §9): swe-short at the thrash and eviction points,
# the named-tools agents at the thrash point, coding-long at its thrash point, chat-human.
POINTS: dict[str, Point] = {
    "thrash": Point("swe-short", 48, 1, 4500, 32),
    "tools": Point("agent-tools", 48, 1, 4500, 32),
    "eviction": Point("swe-short", 40, 1, 2500, 12),
    "coding-long": Point(
        "coding-long",
        16,
        2,
        3000,
        16,
        Knobs(
            input_scale=0.3,
            output_scale=0.5,
            gap_cap_seconds=60.0,
            human_gap_cap_seconds=30.0,
            max_turns=48,
            arrival_rate_per_second=10.0,
        ),
    ),
    "chat-human": Point(
        "chat-human", 40, 3, 450, None, Knobs(human_gap_cap_seconds=300.0, arrival_rate_per_second=0.5)
    ),
}

ABLATIONS: dict[str, dict[str, Any]] = {
    "agentd": {},
    "agentd-no-tool-ttl": {"enabled": False},
    "agentd-cap-at-fit": {"contention": "cap_at_fit"},
    "agentd-measured-miss": {"measured_miss": True},
    "agentd-hold-under-contention": {"contention": "ignore"},
    "agentd-no-finish-keys": {"finish_reason_keys": False},
    "agentd-no-release": {"release_when_long": False},
}
# rows that change a Program scheduling field instead of a tool_retention one
PS_ABLATIONS: dict[str, dict[str, Any]] = {
    "agentd-move-resident": {"cross_rank_move_cost": "resident"},
    "agentd-las": {"resume_order": "las"},
}
SYSTEMS = ("native", "floor", *ABLATIONS, *PS_ABLATIONS, "agentd-floor")


def system_config(point: Point, system: str, ps_overrides: dict[str, Any] | None = None) -> AgentdConfig:
    """The embedded-mode config of one row at one point: ``native``/``floor`` without Program
    scheduling, every other row agentd with its ablation and ``ps_overrides`` merged in."""
    blocks = FLOOR_KV_BLOCKS if system in ("floor", "agentd-floor") else point.kv_blocks
    cluster = ClusterSpec(workers=2, dp_size=2, num_gpu_blocks=blocks, time_scale=1.0)
    if system in ("native", "floor"):
        return config_for(cluster, "native")
    overrides = {**PS_ABLATIONS.get(system, {}), **(ps_overrides or {})}
    return config_for(cluster, "agentd", {"tool_retention": ABLATIONS.get(system, {}), **overrides})


def _run(
    point_name: str,
    point: Point,
    system: str,
    out_dir: str,
    sim_hints: bool = True,
    ps_overrides: dict[str, Any] | None = None,
    seed: int | None = None,
) -> tuple[str, int | None, str, dict[str, Any], float]:
    """One simulation: ``point``'s trace with its own seed, or with ``seed`` (then the report goes
    to ``<out>/<point>/seed<seed>/``)."""
    trace = synthesize(point.profile, point.programs, point.seed if seed is None else seed, point.knobs)
    cfg = system_config(point, system, ps_overrides)
    started = time.perf_counter()
    opts = ReplayOptions(concurrency=point.concurrency, sim_hints=sim_hints)
    report = run_simulation(cfg, trace, opts, system=system)
    wall = time.perf_counter() - started
    parts = [out_dir, point_name] if seed is None else [out_dir, point_name, f"seed{seed}"]
    path = os.path.join(*parts, f"{system}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, report_json(report))
    return point_name, seed, system, report, wall


def _get(report: dict[str, Any] | None, *keys: str) -> float | None:
    value: Any = report
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value if isinstance(value, (int, float)) else None


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def render(results: dict[str, dict[str, dict[str, Any]]], systems: list[str]) -> str:
    lines = ["# Tool-call-aware retention in virtual time (python -m bench.tool_bench)", ""]
    for point_name, by_system in results.items():
        p = POINTS[point_name]
        lines += [
            f"## {point_name}: {p.profile} x{p.programs} seed {p.seed}, {p.kv_blocks} blocks/rank, "
            f"concurrency {p.concurrency or 'trace'}",
            "",
            "| system | mean JCT (s) | p90 JCT (s) | hit | preemptions | / floor | / native | TTLs armed by source |",
            "|---|---|---|---|---|---|---|---|",
        ]
        floor = _get(by_system.get("floor"), "jct_seconds", "mean")
        native = _get(by_system.get("native"), "jct_seconds", "mean")
        for system in systems:
            r = by_system.get(system)
            if r is None:
                continue
            mean = _get(r, "jct_seconds", "mean")
            p90 = _get(r, "jct_seconds", "p90")
            hit = _get(r, "cache", "token_hit_ratio")
            pre = _get(r, "preemptions")
            armed = r.get("scheduling", {}).get("ttl_armed") or {}
            sources = ", ".join(f"{k} {int(v)}" for k, v in sorted(armed.items())) or "-"
            lines.append(
                f"| {system} | {mean:.1f} | {p90:.1f} | {hit:.3f} | {pre:.0f} | {_ratio(mean, floor)} | "
                f"{_ratio(mean, native)} | {sources} |"
                if mean is not None and p90 is not None and hit is not None and pre is not None
                else f"| {system} | - | - | - | - | - | - | - |"
            )
        splits = [(s, by_system[s].get("time_split_seconds")) for s in systems if s in by_system]
        if any(split for _, split in splits):
            lines += [
                "",
                "Where the root Program's time goes (mean per task, client view, `time_split_seconds`):",
                "",
                "| system | to first tokens (s) | decode (s) | between turns (s) | recomputed prompt tokens |",
                "|---|---|---|---|---|",
            ]
            for system, split in splits:
                if split:
                    lines.append(
                        f"| {system} | {split['first_token']:.1f} | {split['decode']:.1f} | "
                        f"{split['between_turns']:.1f} | {split['recomputed_prompt_tokens']:.0f} |"
                    )
        for system in ("agentd", "agentd-no-tool-ttl"):
            lines += _tool_table(system, (by_system.get(system) or {}).get("scheduling", {}).get("tools") or [])
        lines.append("")
    return "\n".join(lines)


# the rows every other row is divided by in the multi-seed report, in this order
REFERENCES = ("native", "floor", "agentd")


def ratio_pairs(systems: list[str]) -> list[tuple[str, str]]:
    """The (system, reference) pairs of the multi-seed report: every agentd row against
    ``native`` and ``floor``, and every other agentd row against ``agentd`` (those in ``systems``)."""
    return [
        (s, ref) for ref in REFERENCES if ref in systems for s in systems if s != ref and s not in ("native", "floor")
    ]


def ratio_stats(ratios: list[float]) -> dict[str, float]:
    """Mean, geometric mean, min, max and sample standard deviation (0 for one seed) of per-seed ratios."""
    return {
        "mean": statistics.fmean(ratios),
        "geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)),
        "min": min(ratios),
        "max": max(ratios),
        "sd": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
    }


def seed_ratios(by_seed: dict[int, dict[str, dict[str, Any]]], systems: list[str]) -> dict[str, dict[str, Any]]:
    """Per pair ``"a / b"``: the ratio of mean JCTs on each seed where both ran, and its statistics."""
    out: dict[str, dict[str, Any]] = {}
    for system, ref in ratio_pairs(systems):
        per_seed: dict[int, float] = {}
        for seed, by_system in by_seed.items():
            a = _get(by_system.get(system), "jct_seconds", "mean")
            b = _get(by_system.get(ref), "jct_seconds", "mean")
            if a is not None and b:
                per_seed[seed] = a / b
        if per_seed:
            out[f"{system} / {ref}"] = {"per_seed": per_seed, **ratio_stats(list(per_seed.values()))}
    return out


def render_seeds(
    results: dict[str, dict[int, dict[str, dict[str, Any]]]], systems: list[str], points: dict[str, Point]
) -> str:
    """The multi-seed report: per point, mean JCT per seed and system, then the ratios per seed
    with their mean, geomean and spread over the seeds."""
    lines = ["# Tool-call-aware retention in virtual time over trace seeds (python -m bench.tool_bench --seeds)", ""]
    for point_name, by_seed in results.items():
        p = points[point_name]
        seeds = sorted(by_seed)
        ran = [s for s in systems if any(s in by_seed[seed] for seed in seeds)]
        lines += [
            f"## {point_name}: {p.profile} x{p.programs}, trace seeds {','.join(map(str, seeds))}, "
            f"{p.kv_blocks} blocks/rank, concurrency {p.concurrency or 'trace'}",
            "",
            "Mean JCT (s) per trace seed:",
            "",
            "| seed | " + " | ".join(ran) + " |",
            "|---|" + "---|" * len(ran),
        ]
        for seed in seeds:
            cells = [_f(_get(by_seed[seed].get(s), "jct_seconds", "mean"), ".2f") for s in ran]
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
        ratios = seed_ratios(by_seed, ran)
        if ratios:
            names = list(ratios)
            lines += [
                "",
                "Ratio of mean JCTs per trace seed, and over the seeds (sd: sample standard deviation):",
                "",
                "| seed | " + " | ".join(names) + " |",
                "|---|" + "---|" * len(names),
            ]
            for seed in seeds:
                cells = [_f(ratios[n]["per_seed"].get(seed), ".3f") for n in names]
                lines.append(f"| {seed} | " + " | ".join(cells) + " |")
            for stat in ("mean", "geomean", "min", "max", "sd"):
                lines.append(f"| {stat} | " + " | ".join(format(ratios[n][stat], ".3f") for n in names) + " |")
            lines.append(
                "| seeds < 1 | "
                + " | ".join(
                    f"{sum(r < 1 for r in ratios[n]['per_seed'].values())} of {len(ratios[n]['per_seed'])}"
                    for n in names
                )
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _tool_table(system: str, tools: list[dict[str, Any]]) -> list[str]:
    """The per-tool windows of ``system`` at the end of its run: gaps, decisions against the fit,
    how the Programs came back, and what the gaps after each key cost in recomputation."""
    if not tools:
        return []
    lines = [
        "",
        f"{system}: per-tool gap windows at the end of the run (`/scheduling/diagnostics` `tools`):",
        "",
        "| tool | samples | gap p50 (s) | gap p90 (s) | held | released | fell back | < fit | > fit | "
        "back held | back released | fit would hold | fit would release | resumes | recomputed tokens | "
        "recompute (s) | last TTL (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in tools:
        lines.append(
            f"| `{t['tool']}` | {t['samples']} | {_f(t.get('gap_p50_seconds'), '.3f')} | "
            f"{_f(t.get('gap_p90_seconds'), '.3f')} | {t['held']} | {t['released']} | {t['fallbacks']} | "
            f"{t.get('shorter_than_fit', 0)} | {t.get('longer_than_fit', 0)} | {t.get('returned_held', 0)} | "
            f"{t.get('returned_released', 0)} | {t.get('fit_would_hold', 0)} | {t.get('fit_would_release', 0)} | "
            f"{t.get('resumes', 0)} | {t.get('recomputed_tokens', 0)} | {_f(t.get('recompute_seconds'), '.1f')} | "
            f"{_f(t.get('last_ttl_seconds'), '.3f')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tool_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--points", default=",".join(POINTS), help=f"comma-separated subset of {','.join(POINTS)}")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    parser.add_argument("--jobs", type=positive_int, default=2, help="simulations run at once (processes)")
    parser.add_argument(
        "--seeds",
        type=positive_int_list,
        default=None,
        help="comma-separated trace seeds: every point's trace synthesised with each and every system run on "
        "each; the report gives per-seed ratios and their mean, geomean and spread (default: each point's "
        "own seed, one trace)",
    )
    parser.add_argument(
        "--no-sim-hints",
        dest="sim_hints",
        action="store_false",
        help="replay without tool-call/stop hints (turns end by length, as before issue 17)",
    )
    parser.add_argument(
        "--ps-config-json",
        default=None,
        help="JSON object merged into every agentd row's [program_scheduling] (e.g. a field under test)",
    )
    args = parser.parse_args(argv)
    problem = output_dir_problem(args.out, "--out")
    if problem:
        parser.error(problem)
    ps_overrides: dict[str, Any] = {}
    if args.ps_config_json is not None:
        try:
            ps_overrides = json.loads(args.ps_config_json)
        except json.JSONDecodeError as exc:
            print(f"--ps-config-json: not valid JSON ({exc})", file=sys.stderr)
            return 2
        if not isinstance(ps_overrides, dict):
            print("--ps-config-json: must be a JSON object", file=sys.stderr)
            return 2
        try:
            system_config(POINTS["thrash"], "agentd", ps_overrides)
        except ConfigError as exc:
            print(f"--ps-config-json: {exc}", file=sys.stderr)
            return 2
    points = [p.strip() for p in args.points.split(",") if p.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for p in points:
        if p not in POINTS:
            print(f"--points: unknown point {p!r} (choose from {', '.join(POINTS)})", file=sys.stderr)
            return 2
    for s in systems:
        if s not in SYSTEMS:
            print(f"--systems: unknown system {s!r} (choose from {', '.join(SYSTEMS)})", file=sys.stderr)
            return 2
    if args.jobs < 1:
        print("--jobs: must be >= 1", file=sys.stderr)
        return 2
    seeds: list[int] | None = args.seeds
    if seeds is not None and len(set(seeds)) != len(seeds):
        print(f"--seeds: a seed is given twice ({','.join(map(str, seeds))})", file=sys.stderr)
        return 2
    trace_seeds: list[int | None] = [*seeds] if seeds is not None else [None]  # None: the point's own seed
    runs = [(p, seed, s) for p in points for seed in trace_seeds for s in systems]
    results: dict[str, dict[int | None, dict[str, dict[str, Any]]]] = {p: {} for p in points}
    # The simulations ignore Ctrl-C; this process stops them (bench.interrupt: exit 130) instead of
    # waiting for every queued simulation to finish, or printing one traceback per worker.
    pool = ProcessPoolExecutor(
        max_workers=args.jobs, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)
    )
    try:
        futures = [
            pool.submit(_run, p, POINTS[p], s, args.out, args.sim_hints, ps_overrides, seed) for p, seed, s in runs
        ]
        workers = min(args.jobs, len(futures))
        print(f"running {len(futures)} simulations on {workers} processes (each a few minutes)", flush=True)
        for fut in futures:
            point_name, seed, system, report, wall = fut.result()
            results[point_name].setdefault(seed, {})[system] = report
            mean = _get(report, "jct_seconds", "mean")
            at = "" if seed is None else f" seed {seed}"
            print(f"{point_name:>12}{at} {system:>22}: mean JCT {mean} ({wall:.0f} s wall)", flush=True)
    except BaseException:
        for process in list(getattr(pool, "_processes", {}).values()):  # no public way to stop running work
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    summary: dict[str, Any]
    if seeds is None:
        one = {p: by_seed[None] for p, by_seed in results.items()}
        text = render(one, systems)
        summary = {p: {s: r.get("jct_seconds") for s, r in by.items()} for p, by in one.items()}
    else:
        by_seeds = {p: {seed: by for seed, by in by_seed.items() if seed is not None} for p, by_seed in results.items()}
        text = render_seeds(by_seeds, systems, POINTS)
        summary = {
            p: {
                "seeds": {str(seed): {s: r.get("jct_seconds") for s, r in by.items()} for seed, by in by_seed.items()},
                "ratios": {
                    name: {**stats, "per_seed": {str(k): v for k, v in stats["per_seed"].items()}}
                    for name, stats in seed_ratios(by_seed, systems).items()
                },
            }
            for p, by_seed in by_seeds.items()
        }
    write_atomic(os.path.join(args.out, "report.md"), text + "\n")
    write_atomic(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=1, sort_keys=True))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.tool_bench"))
