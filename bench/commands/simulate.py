"""``agentd simulate --config FILE --trace FILE``: the daemon and the replay in virtual time.

Runs the daemon's actors and the embedded simulated ranks (the config must leave
``routing.worker_urls`` empty; ``[embedded]`` sizes the ranks) and replays the trace in one process
under a mock clock (bench.simulate): no sockets, deterministic for the config's
``embedded.seed``.  Writes the same JSON report as ``agentd replay`` plus a ``simulation`` section
(wall seconds and speed-up against real time).  ``--time-scale`` defaults to ``embedded.time_scale``
so trace gaps and simulated compute stay in proportion.
"""

from __future__ import annotations

import argparse
import sys

import attrs

from bench.commands.common import (
    add_progress_flags,
    add_replay_flags,
    failure_line,
    load_trace_arg,
    progress_shown,
    replay_options,
)
from bench.output import write_report
from bench.progress import progress_line
from bench.report import trace_summary
from bench.simulate import SimulateError, check_simulatable, run_simulation
from daemon.commands.argtypes import int_at_least
from daemon.commands.paths import output_file_problem
from daemon.config_loading import ConfigError, load_config
from daemon.logs import configure_logging
from daemon.security import load_security

NAME = "simulate"
HELP = "Simulate the daemon and a trace replay in one process in virtual time; write the replay report."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="agentd config (embedded mode)")
    parser.add_argument("--trace", required=True, metavar="FILE", help="trace JSONL (agentd trace synth)")
    parser.add_argument("--out", default=None, help="report JSON path (default: stdout)")
    parser.add_argument("--seed", type=int_at_least(0), default=None, help="override embedded.seed (>= 0)")
    add_progress_flags(parser)
    add_replay_flags(parser)
    parser.set_defaults(time_scale=None)


def run(args: argparse.Namespace) -> int:
    problem = output_file_problem(args.out, "--out") if args.out else None
    if problem is not None:
        print(f"agentd simulate: {problem}", file=sys.stderr)
        return 2
    overrides = {"embedded": {"seed": args.seed}} if args.seed is not None else None
    try:
        cfg = load_config(args.config, overrides)
        check_simulatable(cfg)
        load_security(cfg)  # the files it names, as agentd start reads them (else a traceback in the run)
    except ConfigError as exc:
        print(f"agentd simulate: invalid configuration ({args.config}):", file=sys.stderr)
        for line in exc.lines:
            print(f"  {line}", file=sys.stderr)
        return 2
    except SimulateError as exc:
        print(f"agentd simulate: {exc}", file=sys.stderr)
        return 2
    trace = load_trace_arg(args.trace, "agentd simulate")
    if trace is None:
        return 2
    if args.time_scale is None:
        args.time_scale = cfg.embedded.time_scale
    # Without a handler, Python printed each daemon warning as its bare event name
    # ("program_scheduling_reference_calibration").  The simulated ranks run the reference cost
    # model, so that start-up warning does not apply here: log errors only, as check-fairness does.
    configure_logging("error", cfg.server.log_format)
    opts = replay_options(args)
    if args.model == "agentd-sim":
        opts = attrs.evolve(opts, model=cfg.embedded.model)
    # long runs show progress as bench, replay and check-fairness do; a pipe or a file stays clean
    shown = progress_shown(args)
    with progress_line(shown, "simulate") as progress:
        report = run_simulation(
            cfg,
            trace,
            opts,
            # trace.concurrency stays the trace's own here (replay and bench report the
            # --concurrency they ran at), so simulate reports compare with earlier ones
            info=trace_summary(trace, args.trace),
            system="agentd" if cfg.program_scheduling is not None else "native",
            progress=progress,
        )
    write_report(report, args.out)
    failure = failure_line("agentd simulate", report)
    if failure:  # exit 1 said nothing of why (e.g. --model not the one [embedded] serves: all 404)
        print(failure, file=sys.stderr)
    return 0 if report["requests"]["failed"] == 0 else 1
