"""``agentd trace synth|stats|merge``: generate synthetic agent traces, inspect and merge them.

``synth --profile NAME --programs N --seed S --out FILE`` writes a JSONL trace (docs/traces.md) of
one of the profiles (docs/traces.md, "Profiles"), deterministic for the seed; ``stats FILE`` prints
the distributions and compares them with the profile's calibration targets (exit 0 even when a
target is missed: it is a report, not a check; ``--strict`` makes a miss exit 1); ``merge A B -o C``
writes one mixed workload holding every session of A and B (``bench.trace.format.merge_traces``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

from bench.commands.common import add_progress_flags, from_args, load_trace_arg, progress_shown
from bench.trace.format import TraceError, merge_traces, save_trace, write_trace
from bench.trace.stats import compare, format_report, trace_stats
from bench.trace.synth import PROFILES, Knobs, knobs_from_meta, synthesize, targets_for
from daemon.commands.argtypes import finite_at_least, float_in, positive_float, positive_int
from daemon.commands.paths import output_file_problem

NAME = "trace"
HELP = "Synthesize agent traces (synth), merge them into mixed workloads (merge) and print their statistics (stats)."

# --input-scale / --output-scale exist to shrink token counts (docs/traces.md, "Profiles"); the
# generator hashes every 512-token block of every prompt, so an unbounded scale (1e300) grew the
# process by gigabytes until memory ran out. 100 already gives swe-short prompts of 2M tokens.
MAX_TOKEN_SCALE = 100.0
# The slowest open-loop arrival rate (one root in 11.6 days): at 1e-320 the arrival times overflowed
# to Infinity, written into a trace (exit 0) that every command then refused (docs/traces.md, "Profiles")
MIN_ARRIVAL_RATE = 1e-6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION")
    sub.required = True
    synth = sub.add_parser("synth", help="generate a synthetic trace of a profile")
    synth.add_argument("--profile", required=True, choices=PROFILES)
    synth.add_argument("--programs", required=True, type=positive_int, help="root Programs (sessions/tasks)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--out", required=True, help="output JSONL path ('-' for stdout)")
    token_scale = float_in(0.0, MAX_TOKEN_SCALE)
    synth.add_argument(
        "--input-scale",
        type=token_scale,
        default=1.0,
        help=f"multiply input token counts (0 < X <= {MAX_TOKEN_SCALE:g})",
    )
    synth.add_argument(
        "--output-scale",
        type=token_scale,
        default=1.0,
        help=f"multiply output token counts (0 < X <= {MAX_TOKEN_SCALE:g})",
    )
    synth.add_argument("--gap-cap-seconds", type=positive_float, default=300.0, help="cap on tool gaps")
    synth.add_argument("--human-gap-cap-seconds", type=positive_float, default=None, help="cap on human gaps")
    synth.add_argument(
        "--arrival-rate",
        type=finite_at_least(MIN_ARRIVAL_RATE),
        default=None,
        help=f"root arrivals per second for open-loop profiles (job bursts for batch; >= {MIN_ARRIVAL_RATE:g})",
    )
    synth.add_argument(
        "--concurrency", type=positive_int, default=None, help="default replay concurrency stored in the trace meta"
    )
    add_progress_flags(synth)
    synth.add_argument(
        "--max-turns",
        type=positive_int,
        default=None,
        help="cap turns per session (bench budgets; tail targets then miss)",
    )
    merge = sub.add_parser("merge", help="merge traces into one mixed workload (e.g. agents + a batch job)")
    merge.add_argument("files", nargs="+", metavar="FILE", help="two or more trace files (one may be '-': stdin)")
    merge.add_argument("-o", "--out", required=True, help="output JSONL path ('-' for stdout)")
    stats = sub.add_parser("stats", help="print distributions and profile-target comparison")
    stats.add_argument("file", metavar="FILE", help="trace JSONL ('-' for stdin)")
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    stats.add_argument("--strict", action="store_true", help="exit 1 when a profile target is missed")


def run(args: argparse.Namespace) -> int:
    if args.trace_command == "merge":
        return _merge(args)
    return _synth(args) if args.trace_command == "synth" else _stats(args)


def _out_problem(args: argparse.Namespace, prog: str) -> bool:
    """Print why ``--out`` cannot be written (before any work); True when it cannot."""
    problem = None if args.out == "-" else output_file_problem(args.out, "--out")
    if problem is not None:
        print(f"{prog}: {problem}", file=sys.stderr)
    return problem is not None


def _merge(args: argparse.Namespace) -> int:
    if len(args.files) < 2:
        print("agentd trace merge: FILE: give at least two traces to merge", file=sys.stderr)
        return 2
    if args.files.count("-") > 1:
        # the second read of standard input would find it empty ("trace holds no records")
        print("agentd trace merge: FILE: '-' (standard input) can be given only once", file=sys.stderr)
        return 2
    if _out_problem(args, "agentd trace merge"):
        return 2
    parts = []
    for path in args.files:
        trace = load_trace_arg(path, "agentd trace merge", "FILE")
        if trace is None:
            return 2
        parts.append((path, trace))
    try:
        merged = merge_traces(parts)
    except TraceError as exc:
        print(f"agentd trace merge: {exc}", file=sys.stderr)
        return 2
    if args.out == "-":
        write_trace(merged, sys.stdout)
    else:
        save_trace(merged, args.out)
        print(
            f"wrote {len(merged.records)} requests of {len(merged.sessions())} programs to {args.out}", file=sys.stderr
        )
    return 0


def _synth(args: argparse.Namespace) -> int:
    if _out_problem(args, "agentd trace synth"):
        return 2
    knobs = from_args(Knobs, args, arrival_rate_per_second="arrival_rate")
    shown = progress_shown(args)
    line = _ProgressLine(sys.stderr, f"agentd trace synth: {args.profile}") if shown else None
    try:
        trace = synthesize(args.profile, args.programs, args.seed, knobs, line.update if line else None)
        if args.out == "-":
            write_trace(trace, sys.stdout, line.update if line else None)
        else:
            save_trace(trace, args.out, line.update if line else None)
    finally:
        if line is not None:
            line.close()
    if args.out != "-":
        print(f"wrote {len(trace.records)} requests of {len(trace.sessions())} programs to {args.out}", file=sys.stderr)
    return 0


class _ProgressLine:
    """``\r``-redrawn ``label: phase done/total  elapsed``, at most four times a second: a
    coding-long trace of 3,000 programs takes about 20 s and 1.7 GB, of 30,000 minutes."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self._stream = stream
        self._label = label
        self._t0 = self._last = time.monotonic()
        self._drawn = 0  # the length of the line drawn last (0: none yet)
        self._state = ("", 0, 0)

    def update(self, phase: str, done: int, total: int) -> None:
        new_phase = phase != self._state[0]
        self._state = (phase, done, total)
        now = time.monotonic()
        if new_phase or now - self._last >= 0.25:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        phase, done, total = self._state
        text = f"{self._label}: {phase} {done:,}/{total:,}  {now - self._t0:.1f}s"
        self._stream.write("\r" + text.ljust(self._drawn))  # blanks over a longer previous line
        self._stream.flush()
        self._drawn = len(text)

    def close(self) -> None:
        if self._drawn:
            phase, _, total = self._state
            self._state = (phase, total, total)
            self._draw(time.monotonic())
            self._stream.write("\n")
            self._stream.flush()


def _stats(args: argparse.Namespace) -> int:
    trace = load_trace_arg(args.file, "agentd trace stats", "FILE")
    if trace is None:
        return 2
    stats = trace_stats(trace)
    comparisons = []
    if trace.meta.profile in PROFILES:
        comparisons = compare(stats, targets_for(trace.meta.profile, knobs_from_meta(trace.meta)))
    if args.json:
        targets = [{"metric": c.metric, "observed": c.observed, "target": c.target, "ok": c.ok} for c in comparisons]
        print(json.dumps({"stats": stats, "targets": targets}, indent=2, sort_keys=True))
    else:
        sys.stdout.write(format_report(trace, stats, comparisons))
    if args.strict and not all(c.ok for c in comparisons):
        return 1
    return 0
