"""``agentd check-fairness``: the core's fairness machines and adversarial traces against one
configuration, in virtual time on the simulated backend (docs/priority.md §6).

For each scenario kind (bench/fairness/scenarios.py) and each of ``budget`` seeds, the victim's
workload is simulated alone and with the adversary (``bench.simulate.run_simulation``: the
daemon with the user's configuration in front of its ``[embedded]`` simulated ranks); the
properties (bench/fairness/properties.py) compare the two reports.  A kind stops at its first
violation, which is shrunk (``shrink``: fewer adversary sessions, fewer victim sessions, fewer
turns, as long as the property still fails, within a probe budget) and written to the output
directory as replayable traces, their reports and the ``agentd simulate`` commands that reproduce
them.  The core machines (bench/fairness/machines.py) run with ``budget`` times their example
count.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from bench.fairness import machines as machine_runner
from bench.fairness.properties import RATIO_PROPERTIES, Measure, scenario_measures, starvation_bound_seconds
from bench.fairness.scenarios import KINDS, ClusterSize, Scenario, build, subset, truncate
from bench.output import write_atomic
from bench.progress import ProgressLine, Writable
from bench.replay import ReplayOptions
from bench.report import trace_summary
from bench.simulate import run_simulation
from bench.trace.format import Trace, save_trace
from daemon.config import AgentdConfig

DEFAULT_SHRINK_PROBES = 8


@attrs.frozen
class CheckOptions:
    config_path: str
    out_dir: Path
    budget: int = 1
    seed: int = 0
    kinds: tuple[str, ...] = KINDS
    scale: float = 1.0
    machines: bool = True
    shrink_probes: int = DEFAULT_SHRINK_PROBES
    progress: bool = True


@attrs.frozen
class Violation:
    measure: Measure
    files: tuple[str, ...]
    commands: tuple[str, ...]
    note: str


@attrs.frozen
class CheckResult:
    measures: tuple[Measure, ...]
    violations: tuple[Violation, ...]
    skipped: tuple[str, ...]
    wall_seconds: float

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.measures)


def cluster_of(cfg: AgentdConfig) -> ClusterSize:
    e = cfg.embedded
    return ClusterSize(ranks=e.num_workers * e.dp_size, kv_tokens_per_rank=e.num_gpu_blocks * e.block_size)


class Checker:
    def __init__(
        self, cfg: AgentdConfig, opts: CheckOptions, log: Callable[[str], None], stream: Writable | None = None
    ):
        self.cfg = cfg
        self.opts = opts
        self.log = log
        self.stream = stream  # the progress lines' (stderr when None)
        self.written: list[Path] = []  # the files this run wrote so far (violations, machine failures)
        self.cluster = cluster_of(cfg)
        self.replay = ReplayOptions(time_scale=cfg.embedded.time_scale, model=cfg.embedded.model)
        self.simulations = 0
        self.starvation_bound = starvation_bound_seconds(cfg, self.replay.request_timeout_seconds)

    # ----------------------------------------------------------------------------- simulation

    def simulate(self, trace: Trace, label: str) -> dict[str, Any]:
        self.simulations += 1
        stream = self.stream if self.stream is not None else _stderr()
        line = ProgressLine(stream, label=f"  {label}") if self.opts.progress else None
        t0 = time.perf_counter()
        try:
            report = run_simulation(
                self.cfg,
                trace,
                self.replay,
                info=trace_summary(trace, label),
                system="agentd" if self.cfg.program_scheduling is not None else "native",
                progress=line.update if line is not None else None,
            )
        finally:
            if line is not None:
                line.close()
        if not self.opts.progress:
            self.log(f"  {label}: {time.perf_counter() - t0:.1f} s")
        return report

    # ----------------------------------------------------------------------------- scenarios

    def measures_of(
        self, scenario: Scenario, label: str, trace: Trace, alone: Trace, base: dict[str, Any] | None = None
    ) -> tuple[list[Measure], dict[str, Any], dict[str, Any]]:
        alone_report = base if base is not None else self.simulate(alone, f"{label}: {scenario.victim} alone")
        both = self.simulate(trace, f"{label}: {scenario.victim} + {scenario.adversary}")
        measures = scenario_measures(scenario.kind, label, scenario.victim, both, alone_report, self.starvation_bound)
        return measures, both, alone_report

    def check_scenario(self, kind: str, seed: int) -> tuple[list[Measure], Violation | None]:
        scenario = build(kind, self.cluster, seed, self.opts.scale)
        label = f"{kind} seed {seed}"
        measures, both, alone = self.measures_of(scenario, label, scenario.trace, scenario.alone)
        for m in measures:
            self.log(f"  {m.prop}: {m.describe()} (bound {_bound(m)}) {'ok' if m.ok else 'VIOLATED'}")
        failed = next((m for m in measures if not m.ok), None)
        if failed is None:
            return measures, None
        return measures, self.shrink(scenario, label, failed, both, alone)

    def shrink(
        self, scenario: Scenario, label: str, failed: Measure, both: dict[str, Any], alone: dict[str, Any]
    ) -> Violation:
        """Reduce the violating scenario while ``failed.prop`` still fails, within the probe budget."""
        trace, alone_trace = scenario.trace, scenario.alone
        adversary = scenario.sessions_of(scenario.adversary)
        victim = scenario.sessions_of(scenario.victim)
        probes = self.opts.shrink_probes
        if probes:
            self.log(f"  shrinking ({probes} probes at most)")

        def still_fails(
            t: Trace, a: Trace, base: dict[str, Any] | None
        ) -> tuple[dict[str, Any], dict[str, Any]] | None:
            nonlocal probes
            probes -= 1
            ms, b, al = self.measures_of(scenario, f"{label} shrink", t, a, base)
            hit = next((m for m in ms if m.prop == failed.prop), None)
            return (b, al) if hit is not None and not hit.ok else None

        # 1. halves of the adversary (the victim's run alone is unchanged)
        while probes > 0 and len(adversary) > 1:
            cut = len(adversary) // 2
            for part in (adversary[:cut], adversary[cut:]):
                if probes <= 0:
                    break
                candidate = subset(trace, victim + part)
                found = still_fails(candidate, alone_trace, alone)
                if found is not None:
                    adversary, trace = part, candidate
                    both, alone = found
                    break
            else:
                break
        # 2. halves of the victim (its run alone changes too)
        while probes > 0 and len(victim) > 1:
            half = victim[: max(1, len(victim) // 2)]
            candidate, candidate_alone = subset(trace, half + adversary), subset(alone_trace, half)
            found = still_fails(candidate, candidate_alone, None)
            if found is None:
                break
            victim, trace, alone_trace = half, candidate, candidate_alone
            both, alone = found
        # 3. fewer turns
        turns = max(r.turn for r in trace.records) + 1
        while probes > 0 and turns > 1:
            turns = max(1, turns // 2)
            candidate, candidate_alone = truncate(trace, turns), truncate(alone_trace, turns)
            found = still_fails(candidate, candidate_alone, None)
            if found is None:
                break
            trace, alone_trace = candidate, candidate_alone
            both, alone = found
        return self.write_violation(scenario, label, failed, trace, alone_trace, both, alone)

    def write_violation(
        self,
        scenario: Scenario,
        label: str,
        failed: Measure,
        trace: Trace,
        alone_trace: Trace,
        both: dict[str, Any],
        alone: dict[str, Any],
    ) -> Violation:
        out = self.opts.out_dir
        out.mkdir(parents=True, exist_ok=True)
        stem = f"violation-{failed.prop}-{scenario.kind}-seed{scenario.seed}"
        files = {
            "trace": out / f"{stem}.jsonl",
            "alone": out / f"{stem}.alone.jsonl",
            "report": out / f"{stem}.report.json",
            "alone_report": out / f"{stem}.alone.report.json",
        }
        save_trace(trace, files["trace"])
        self.written.append(files["trace"])
        save_trace(alone_trace, files["alone"])
        self.written.append(files["alone"])
        write_atomic(files["report"], json.dumps(both, indent=2, sort_keys=True) + "\n")
        self.written.append(files["report"])
        write_atomic(files["alone_report"], json.dumps(alone, indent=2, sort_keys=True) + "\n")
        self.written.append(files["alone_report"])
        final = next(
            m
            for m in scenario_measures(scenario.kind, label, scenario.victim, both, alone, self.starvation_bound)
            if m.prop == failed.prop
        )
        cfg = shlex.quote(self.opts.config_path)

        def command(trace_path: Path, report_path: Path) -> str:
            where = f"--trace {shlex.quote(str(trace_path))} --out {shlex.quote(str(report_path))}"
            return f"agentd simulate --config {cfg} {where}"

        commands = [command(files["trace"], files["report"])]
        if failed.prop in ("tenant-isolation", "interactive-ttft"):
            commands.append(command(files["alone"], files["alone_report"]))
        sessions, size = len(trace.sessions()), len(trace.records)
        shrunk = "shrunk to" if size < len(scenario.trace.records) else "not shrunk:"
        note = (
            f"{final.prop}: {final.describe()} > bound {_bound(final)} "
            f"({final.detail}; {shrunk} {sessions} sessions, {size} requests)"
        )
        return Violation(final, tuple(str(p) for p in files.values()), tuple(commands), note)

    # ----------------------------------------------------------------------------- machines

    def check_machines(self) -> tuple[list[Measure], list[Violation], list[str]]:
        found = machine_runner.available_machines()
        if not found:
            return [], [], ["core machines: none in this build (bench.fairness.core_machines is absent)"]
        measures: list[Measure] = []
        violations: list[Violation] = []
        for name, factory in found:
            t0 = time.perf_counter()
            self.log(f"core machine {name}: {machine_runner.examples_of(name, self.opts.budget)} examples ...")
            outcome = machine_runner.run_machine(name, factory, self.cfg, budget=self.opts.budget, seed=self.opts.seed)
            self.log(f"  {'ok' if outcome.measure.ok else 'VIOLATED'} ({time.perf_counter() - t0:.1f} s)")
            measures.append(outcome.measure)
            if not outcome.measure.ok:
                self.opts.out_dir.mkdir(parents=True, exist_ok=True)
                command = (
                    f"agentd check-fairness --config {shlex.quote(self.opts.config_path)} --seed {self.opts.seed} "
                    f"--budget {self.opts.budget} --scenarios none --out {shlex.quote(str(self.opts.out_dir))}"
                )
                path = machine_runner.write_failure(self.opts.out_dir, name, outcome, command)
                self.written.append(path)
                violations.append(
                    Violation(outcome.measure, (str(path),), (command,), f"{name}: {outcome.measure.detail}")
                )
        return measures, violations, []

    # ----------------------------------------------------------------------------- all

    def run(self) -> CheckResult:
        t0 = time.perf_counter()
        measures: list[Measure] = []
        violations: list[Violation] = []
        skipped: list[str] = []
        if self.opts.machines:
            ms, vs, sk = self.check_machines()
            measures += ms
            violations += vs
            skipped += sk
        for kind in self.opts.kinds:
            for k in range(self.opts.budget):
                seed = self.opts.seed + k
                size = f"{self.cluster.ranks} ranks x {self.cluster.kv_tokens_per_rank:,} KV tokens"
                if self.opts.scale != 1:
                    size += f", scale {self.opts.scale:g}"
                self.log(f"scenario {kind} seed {seed} ({size})")
                ms, violation = self.check_scenario(kind, seed)
                measures += ms
                if violation is not None:
                    violations.append(violation)
                    break  # one shrunk violation per kind
        return CheckResult(tuple(measures), tuple(violations), tuple(skipped), time.perf_counter() - t0)


def _verdict(m: Measure) -> str:
    if m.bound is None and m.measured is not None:
        return "info"  # reported beside a bounded property (e.g. priority-cost)
    return "PASS" if m.ok else "FAIL"


def _bound(m: Measure) -> str:
    if m.bound is None:
        return "-"
    return f"<= {m.bound:g}"


def _stderr() -> Any:
    import sys

    return sys.stderr


def scale_note(opts: CheckOptions) -> str | None:
    """What the verdict says about a ``--scale`` other than 1 (None at full size, or with no
    scenario to scale): a pass on reduced scenarios is not the full check."""
    if opts.scale == 1 or not opts.kinds:
        return None
    if opts.scale < 1:
        return f"scale {opts.scale:g}: scenarios reduced, not the full check"
    return f"scale {opts.scale:g}: scenarios enlarged beyond the default size"


def render(result: CheckResult, opts: CheckOptions, cluster: ClusterSize) -> str:
    """The verdict table and the reproduction commands (stdout of ``agentd check-fairness``)."""
    lines = [
        f"check-fairness: {opts.config_path} ({cluster.ranks} ranks x {cluster.kv_tokens_per_rank:,} KV tokens), "
        f"budget {opts.budget}, seed {opts.seed}, scale {opts.scale:g}, {result.wall_seconds:.1f} s",
        "",
        f"{'property':<20} {'scenario':<36} {'measured':>9} {'bound':>8}  verdict",
    ]
    for m in result.measures:
        lines.append(f"{m.prop:<20} {m.scenario:<36} {m.describe():>9} {_bound(m):>8}  {_verdict(m)}")
    for note in result.skipped:
        lines.append(f"(skipped) {note}")
    lines.append("")
    checks = sum(1 for m in result.measures if _verdict(m) != "info")
    scaled = scale_note(opts)
    suffix = f"; {scaled}" if scaled else ""
    if result.ok:
        lines.append(f"result: PASS ({checks} checks{suffix})")
        return "\n".join(lines) + "\n"
    lines.append(f"result: FAIL ({sum(not m.ok for m in result.measures)} of {checks} checks{suffix})")
    for v in result.violations:
        lines.append("")
        lines.append(f"violation: {v.note}")
        for path in v.files:
            lines.append(f"  wrote {path}")
        lines.append("  reproduce with:")
        for cmd in v.commands:
            lines.append(f"    {cmd}")
    return "\n".join(lines) + "\n"


def verdicts_json(result: CheckResult, opts: CheckOptions) -> dict[str, Any]:
    return {
        "config": opts.config_path,
        "budget": opts.budget,
        "seed": opts.seed,
        "scale": opts.scale,
        "scale_note": scale_note(opts),
        "ok": result.ok,
        "wall_seconds": result.wall_seconds,
        "checks": [attrs.asdict(m) for m in result.measures],
        "violations": [
            {
                "property": v.measure.prop,
                "scenario": v.measure.scenario,
                "note": v.note,
                "files": list(v.files),
                "commands": list(v.commands),
            }
            for v in result.violations
        ],
        "skipped": list(result.skipped),
    }


def kinds_arg(text: str) -> tuple[str, ...]:
    """``--scenarios``: a comma-separated list of kinds, ``all`` or ``none``.  Every item must name
    a kind (``flood,,hogs`` or a trailing comma is refused, not read as ``flood,hogs``) and name it
    once: a repeated kind would run the same scenario and seeds again and list each check twice."""
    if text == "all":
        return KINDS
    if text == "none":
        return ()
    kinds = tuple(k.strip() for k in text.split(","))
    bad = [k for k in kinds if k and k not in KINDS]
    twice = sorted({k for k in kinds if k and kinds.count(k) > 1}, key=kinds.index)
    problem = None
    if bad:
        problem = f"unknown: {', '.join(bad)}"
    elif "" in kinds:
        problem = "an empty item"
    elif twice:
        problem = f"{', '.join(twice)} listed twice"
    if problem is not None:
        raise ValueError(f"must be all, none or a comma-separated list of {', '.join(KINDS)}, got {text!r} ({problem})")
    return kinds


__all__: Sequence[str] = ("RATIO_PROPERTIES", "CheckOptions", "CheckResult", "Checker", "render", "verdicts_json")
