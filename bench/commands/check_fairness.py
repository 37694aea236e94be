"""``agentd check-fairness --config FILE [--budget N] [--seed S] [--out DIR]``: property-based
fairness testing of one configuration (docs/priority.md §6).

Runs the core's fairness machines and the adversarial scenarios (one tenant flooding, long-context
hogs, a priority flood, interactive requests under a batch job) against the configuration on its
``[embedded]`` simulated ranks in virtual time (bench/fairness/check.py).  Progress goes to
stderr; the verdict table (each property's measured worst case against its bound) and, for each
violation, the files written and the ``agentd simulate`` commands that reproduce it go to stdout.
Exit 0 when every property holds, 1 when one is violated, 2 for bad input (the message names the
flag or the configuration field), 130 on Ctrl-C (the progress line ended, and one line on stderr
saying that no verdicts were written and which violation files were).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from bench.fairness.check import Checker, CheckOptions, cluster_of, kinds_arg, render, verdicts_json
from bench.fairness.scenarios import KINDS
from bench.output import write_atomic
from bench.progress import LineTracker
from bench.simulate import SimulateError, check_simulatable
from daemon.commands.argtypes import float_in, int_at_least, positive_int
from daemon.commands.paths import output_dir_problem
from daemon.config_loading import ConfigError, load_config
from daemon.logs import configure_logging

NAME = "check-fairness"
# --scale's bound: the scenarios' sessions grow with it, and with them the run's time and memory
# (docs/priority.md §6.3); unbounded, a typo such as 1e9 ran until memory ran out
MAX_SCALE = 50.0
# --out's default, relative to the current directory (docs/priority.md §6)
DEFAULT_OUT = "check-fairness-out"
HELP = "Check a configuration's fairness: core machines and adversarial traces in virtual time; exit 1 on a violation."


# the files a run writes into --out besides verdicts.json (bench/fairness/check.py: write_violation,
# bench/fairness/machines.py: write_failure)
_VIOLATION_FILE = re.compile(r"violation-(?P<what>[a-z_-]+)-seed\d+(\.alone)?(\.jsonl|\.report\.json)")
_MACHINE_FILE = re.compile(r"machine-[a-z_]+\.txt")


def clear_earlier_results(out: Path, kinds: tuple[str, ...], machines: bool) -> list[Path]:
    """Remove what an earlier run into ``out`` wrote for the checks this run repeats: the violation
    files of its scenarios, and the machine-failure files when it runs the machines (docs/priority.md
    §6.2).  A passing run into a reused ``--out`` no longer leaves an earlier violation beside its
    passing verdicts.json.  Files of checks this run does not repeat stay (the machines' reproduce
    command, ``--scenarios none``, keeps the scenarios' traces), and so does anything not named as a
    run names its files."""
    if not out.is_dir():
        return []
    removed = []
    for path in sorted(out.iterdir()):
        violation = _VIOLATION_FILE.fullmatch(path.name)
        if violation is not None:  # violation-<property>-<scenario>-seed<N>...: the longest scenario name that ends it
            kind = max((k for k in KINDS if violation["what"].endswith(f"-{k}")), key=len, default=None)
            ours = kind in kinds
        else:
            ours = machines and _MACHINE_FILE.fullmatch(path.name) is not None
        if ours and path.is_file():
            path.unlink()
            removed.append(path)
    return removed


def _kinds(text: str) -> tuple[str, ...]:
    try:
        return kinds_arg(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="agentd config (embedded mode: no worker_urls)")
    parser.add_argument(
        "--budget",
        type=positive_int,
        default=1,
        help="seeds per scenario; multiplies the core machines' examples (default 1: under 2 minutes on 2 cores)",
    )
    parser.add_argument(
        "--seed", type=int_at_least(0), default=0, help="first scenario seed and the machines' seed (>= 0, default 0)"
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where violations and verdicts.json are written (default ./{DEFAULT_OUT})",
    )
    parser.add_argument(
        "--scenarios",
        type=_kinds,
        default="all",
        metavar="LIST",
        help="all (default), none, or a comma-separated list of flood, hogs, priority-flood, interactive-under-batch",
    )
    parser.add_argument(
        "--scale",
        type=float_in(0.0, MAX_SCALE),
        default=1.0,
        help=f"multiply every scenario's session count (0 < X <= {MAX_SCALE:g}, default 1: the full-size check)",
    )
    parser.add_argument("--no-machines", action="store_true", help="skip the core's state machines")
    parser.add_argument(
        "--shrink-probes", type=int_at_least(0), default=8, help="simulations spent shrinking a violation (default 8)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no live progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    prog = "agentd check-fairness"
    try:
        cfg = load_config(args.config)
        check_simulatable(cfg)
    except ConfigError as exc:
        print(f"{prog}: invalid configuration ({args.config}):", file=sys.stderr)
        for line in exc.lines:
            print(f"  {line}", file=sys.stderr)
        return 2
    except SimulateError as exc:
        print(f"{prog}: {args.config}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: cannot read --config {args.config}: {exc.strerror}", file=sys.stderr)
        return 2
    kinds = args.scenarios if isinstance(args.scenarios, tuple) else kinds_arg(args.scenarios)
    if not kinds and args.no_machines:  # it printed "result: PASS (0 checks)" and exited 0
        print(f"{prog}: --scenarios none with --no-machines leaves nothing to check", file=sys.stderr)
        return 2
    out = Path(args.out)
    problem = output_dir_problem(args.out, "--out")
    if problem is not None:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    opts = CheckOptions(
        config_path=args.config,
        out_dir=out,
        budget=args.budget,
        seed=args.seed,
        kinds=kinds,
        scale=args.scale,
        machines=not args.no_machines,
        shrink_probes=args.shrink_probes,
        progress=not args.no_progress,
    )

    stderr = LineTracker(sys.stderr)

    def log(line: str) -> None:
        stderr.write(line + "\n")
        stderr.flush()

    # the daemon's start-up warnings (e.g. reference calibration), once per simulation, would bury
    # the progress lines: only errors are logged (to stderr)
    configure_logging("error", cfg.server.log_format)
    checker = Checker(cfg, opts, log, stream=stderr)
    try:
        removed = clear_earlier_results(out, kinds, not args.no_machines)
        if removed:
            log(f"removed {len(removed)} file(s) an earlier run wrote for these checks from {out}")
            # its verdicts.json named them: until this run writes its own there is none (an
            # interrupted run leaves no verdicts, rather than one naming files that are gone)
            (out / "verdicts.json").unlink(missing_ok=True)
        result = checker.run()
    except KeyboardInterrupt:
        pass
    except BaseExceptionGroup as group:  # as daemon.cli: Ctrl-C inside a Trio run's nurseries
        if group.subgroup(KeyboardInterrupt) is None:
            raise
    else:
        sys.stdout.write(render(result, opts, cluster_of(cfg)))
        out.mkdir(parents=True, exist_ok=True)
        verdicts = json.dumps(verdicts_json(result, opts), indent=2, sort_keys=True) + "\n"
        write_atomic(out / "verdicts.json", verdicts)
        return 0 if result.ok else 1
    if sys.stderr.isatty():  # the terminal echoed ^C where the cursor was (bench.interrupt.run_main)
        stderr.write("\n")
    stderr.end_line()  # the live progress line, if one was open
    print(interrupted_message(prog, out, checker.written), file=sys.stderr, flush=True)
    return 130


def interrupted_message(prog: str, out: Path, written: list[Path]) -> str:
    """What Ctrl-C left: no verdict table on stdout and no verdicts.json (an earlier run's stays, as
    every interrupted agentd bench leaves the previous report or none), and the violation files
    written before it, if any."""
    text = f"{prog}: interrupted; no verdict table and no {out / 'verdicts.json'} written"
    if (out / "verdicts.json").exists():
        text += " (the one there is an earlier run's)"
    if written:
        text += f"; {len(written)} violation file(s) of this run are in {out}"
    return text
