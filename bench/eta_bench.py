"""Queue ETA accuracy in virtual time (docs/program-scheduling.md §13, docs/benchmarks.md §9.5).

``python -m bench.eta_bench [--points thrash,tools,...] [--seeds 1,2,3] [--resume-order mru|fcfs|las] [--out DIR]
[--explain]``

Runs ``agentd`` (the bench's Program scheduling configuration, bench.calibrate.config_for) on each
point of bench.tool_bench (the issue-17 traces and clusters) through ``agentd simulate``'s
in-process daemon, deterministic virtual time, and prints, per point, what the run's
``scheduling.queue_eta`` section says: how many queued requests were admitted and compared, and
the median and p90 of ``|first ETA - actual wait| / actual wait``.  ``--seeds`` runs each point's
trace with other synthesis seeds too (default: the point's own).  ``--out`` keeps each report.
``--explain`` also prints, for every admitted queued request, its line, position, whether its line
fitted the rank when it was told (``QueueEta.blocked``), the first ETA, the actual wait, the error
and the event whose step admitted it (docs/benchmarks.md §9.5): it wraps the
scheduler actor's ``step`` and reads the effects, so the decisions are the same.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs

import actors.scheduler_actor as scheduler_actor
from actors.core.config import RESUME_ORDERS
from actors.core.effects import Admit, QueueEtaTold
from actors.core.eta import relative_error
from actors.core.eta_queue import program_eta, tell_all
from actors.core.events import RepairTick, RequestSubmitted, TargetsChanged
from actors.core.ids import RequestId
from actors.core.model import RequestHints
from actors.core.resume import ordered
from actors.core.scheduler import initial_state, step
from actors.core.state import live_program
from actors.core.stats import RequestSample
from bench.bench import ClusterSpec
from bench.calibrate import config_for
from bench.core_bench import identities, make_config, make_targets
from bench.interrupt import run_main
from bench.output import report_json, write_atomic
from bench.replay import ReplayOptions
from bench.simulate import run_simulation
from bench.tool_bench import POINTS
from bench.trace.synth import synthesize
from daemon.commands.paths import output_dir_problem


class Explain:
    """Records, per admitted queued request, what its first ETA was based on and what admitted it."""

    def __init__(self) -> None:
        self.told: dict[str, dict[str, Any]] = {}
        self.rows: list[dict[str, Any]] = []

    def wrap(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def explained(state: Any, event: object, *, now: float, cfg: Any) -> Any:
            result = step(state, event, now=now, cfg=cfg)
            s = result.state
            for e in result.effects:
                if isinstance(e, QueueEtaTold) and e.first:
                    req = s.pool.get(e.request_id)
                    p = live_program(s, req.ref) if req is not None else None
                    eta = program_eta(s, p) if p is not None else None
                    self.told[e.request_id] = {
                        "at": now,
                        "line": str(p.last_target) if p is not None else "-",
                        "position": e.position,
                        "eta": e.eta_seconds,
                        "fits": "-" if eta is None else ("blocked" if eta.blocked else "fits"),
                    }
                elif isinstance(e, Admit) and e.request_id in self.told:
                    row = self.told.pop(e.request_id)
                    kind = getattr(event, "kind", None)
                    row["wait"] = now - row["at"]
                    row["by"] = type(event).__name__ + (f" ({kind})" if kind else "")
                    self.rows.append(row)
            return result

        return explained

    def table(self) -> str:
        lines = [
            "| line | position | line fits? | first ETA (s) | wait (s) | error | admitted by |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            err = relative_error(r["eta"], r["wait"])
            lines.append(
                f"| {r['line']} | {r['position']} | {r['fits']} | {r['eta']:.2f} | {r['wait']:.2f} | "
                f"{'-' if err is None else f'{err:.2f}'} | {r['by']} |"
            )
        return "\n".join(lines)


def eta_cost(
    ranks: int = 8, slots: int = 4, waiting: int = 64, repeat: int = 200, paused_before: bool = False
) -> tuple[float, float, int, int]:
    """CPU seconds of one tick's ETA pass (``tell_all``) and of one waiting request's first ETA
    (``program_eta``, on average over the waiters), on a scheduler state with ``ranks`` ranks of
    ``slots`` busy Programs each and ``waiting`` Programs queued (global queue, capacity 100,000
    tokens per rank, every rank's request window full, TTL pauses seen): (tell_all, first ETA,
    waiting, active).  With ``paused_before``, every waiting Program was paused before (a TTL
    pause, a recompute of 1 s) and waits for one of the first half of the ranks, so each one's
    cross-rank move to the other half is examined too (docs/program-scheduling.md §13, "Moves")."""
    cfg = attrs.evolve(
        make_config(),
        max_active_programs_per_target=slots,
        token_capacity_per_dp_rank=100_000,
        stats_window_size=4,
        admission_waiting_request_threshold=0,
        global_queue=True,
    )
    state = initial_state(cfg)
    step(state, TargetsChanged("default", make_targets(ranks)), now=0.0, cfg=cfg)
    step(state, RepairTick(), now=0.0, cfg=cfg)
    for i, ident in enumerate(identities(ranks * slots + waiting)):
        ev = RequestSubmitted(RequestId(f"r{i}"), ident, 1000 + 37 * i, RequestHints())
        step(state, ev, now=0.01 * i, cfg=cfg)
    for rank in state.ranks.values():
        for k in range(4):
            rank.factors.push_request(
                RequestSample(1000, 10, 0, 200, 1.0 + 0.5 * k, None, 0.0, 2, 0.1 * k)  # 1-2.5 s of service
            )
            rank.factors.push_ttl_pause_rounds(3)
    step(state, RepairTick(), now=1.0, cfg=cfg)
    state.now = 1.5
    queued = [p for q in state.global_queues.values() for p in ordered(state, list(q))]
    if paused_before:  # waiting for the first half of the ranks: the others are examined as destinations
        targets = sorted(state.ranks)
        for i, p in enumerate(queued):
            p.last_pause_reason = "ttl_expired"
            p.last_cache_miss_impact_seconds = 1.0
            p.last_target = targets[i % max(1, ranks // 2)]
    started = time.process_time()
    for _ in range(repeat):
        state.effects = []
        tell_all(state)
    tick = (time.process_time() - started) / repeat
    started = time.process_time()
    for p in queued:
        program_eta(state, p)
    first = (time.process_time() - started) / max(1, len(queued))
    state.effects = []
    return tick, first, len(queued), sum(len(r.active) for r in state.ranks.values())


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
    parser.add_argument("--resume-order", default="mru", choices=RESUME_ORDERS)
    parser.add_argument("--out", default=None, help="directory for the reports (JSON)")
    parser.add_argument("--explain", action="store_true", help="print each admitted queued request's ETA and wait")
    parser.add_argument("--cost", action="store_true", help="measure the ETA's CPU on a loaded state and exit")
    args = parser.parse_args(argv)
    problem = output_dir_problem(args.out, "--out") if args.out else None
    if problem:
        parser.error(problem)
    if args.cost:
        for paused_before in (False, True):
            tick, first, queued, active = eta_cost(paused_before=paused_before)
            what = "paused before (moves examined)" if paused_before else "new"
            print(
                f"queue ETA CPU, {queued} Programs ({what}) waiting behind {active} busy ones on 8 ranks: "
                f"{tick * 1e3:.2f} ms per tick (tell_all), {first * 1e6:.0f} us per first ETA (program_eta)"
            )
        return 0
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
            explain = Explain() if args.explain else None
            step = scheduler_actor.step
            if explain is not None:
                scheduler_actor.step = explain.wrap(step)
            try:
                report = run_point(name, args.resume_order, seed)
            finally:
                scheduler_actor.step = step
            wall = time.perf_counter() - started
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                tail = "" if seed is None else f"-seed{seed}"
                write_atomic(os.path.join(args.out, f"{name}{tail}-{args.resume_order}.json"), report_json(report))
            print(row(label, report, wall), flush=True)
            if explain is not None:
                print(f"\n{label}, request by request:\n\n{explain.table()}\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.eta_bench"))
