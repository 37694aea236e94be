"""``agentd calibrate --target URL``: measure the seven cost-model coefficients of a live backend.

Runs the probes of ``bench.calibrate_costs`` against any OpenAI-compatible server (a vLLM worker,
``agentd sim-backend``), prints the fit quality on stderr and the ``[program_scheduling]`` TOML block
on stdout (``--out FILE`` also writes it atomically).  A progress bar (probes done / total, ETA)
goes to stderr.  Bad flags exit 2 naming the flag; an unreachable target or a failed probe exits 1;
Ctrl-C ends the bar's line and exits 130 with nothing on stdout or in ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time

import httpx
import trio

from bench.calibrate_costs import CalibrateOptions, CalibrationError, calibrate
from bench.commands.common import TargetBearer, add_api_key_flag, api_key_arg
from bench.interrupt import run_interruptible
from bench.output import write_atomic
from daemon.batch_runner import target_base
from daemon.commands.argtypes import float_in, http_url_problem, int_at_least, int_within, non_empty, positive_float
from daemon.commands.paths import output_file_problem

NAME = "calibrate"
HELP = "Measure the seven cost-model coefficients of a live backend; print the [program_scheduling] TOML block."

MAX_PREFILL_POINTS = 256
MAX_TIME_SCALE = 1e6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = CalibrateOptions()
    parser.add_argument(
        "--target", required=True, type=non_empty, metavar="URL", help="backend base URL (a trailing /v1 is accepted)"
    )
    parser.add_argument("--model", default=None, type=non_empty, help="model name sent in requests (default: none)")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the TOML block to FILE (atomic)")
    parser.add_argument(
        "--time-scale",
        default=d.time_scale,
        # bounded: the measured seconds are multiplied by X and the fit squares them (1e300 was an
        # OverflowError traceback after every probe had run)
        type=float_in(0.0, MAX_TIME_SCALE),
        help=f"the backend runs X times faster than real time (agentd sim-backend --time-scale X; "
        f"at most {MAX_TIME_SCALE:g})",
    )
    parser.add_argument(
        "--max-seconds", default=d.max_seconds, type=positive_float, help="give up after this many seconds"
    )
    parser.add_argument(
        "--max-concurrency", default=d.max_concurrency, type=int_at_least(2), help="largest decode batch probed"
    )
    parser.add_argument(
        "--max-prompt-tokens", default=d.max_prompt_tokens, type=int_at_least(512), help="longest probe prompt"
    )
    parser.add_argument(
        "--max-context-tokens",
        default=d.max_context_tokens,
        type=int_at_least(1024),
        help="most KV tokens one probe holds at once",
    )
    # at most MAX_PREFILL_POINTS: the lengths are computed before the first probe, so 1e9 of them
    # spent minutes and gigabytes before anything was sent (and ignored --max-seconds)
    parser.add_argument(
        "--prefill-points",
        default=d.prefill_points,
        type=int_within(3, MAX_PREFILL_POINTS),
        help=f"prompt lengths (3 to {MAX_PREFILL_POINTS})",
    )
    parser.add_argument(
        "--decode-tokens", default=d.decode_tokens, type=int_at_least(8), help="output tokens per decode stream"
    )
    parser.add_argument(
        "--alpha-prompt-tokens", default=d.alpha_prompt_tokens, type=int_at_least(256), help="alpha probe's prompt"
    )
    parser.add_argument("--repeats", default=d.repeats, type=int_at_least(1), help="runs of every probe")
    parser.add_argument("--request-timeout", default=d.request_timeout, type=positive_float, help="seconds per request")
    parser.add_argument("--seed", default=d.seed, type=int_at_least(0), help="seed of the probe prompts")
    add_api_key_flag(parser)  # a vLLM worker started with --api-key, or an agentd with [auth]


def options(args: argparse.Namespace) -> CalibrateOptions:
    return CalibrateOptions(
        model=args.model,
        time_scale=args.time_scale,
        max_prompt_tokens=args.max_prompt_tokens,
        max_context_tokens=args.max_context_tokens,
        max_concurrency=args.max_concurrency,
        prefill_points=args.prefill_points,
        decode_tokens=args.decode_tokens,
        alpha_prompt_tokens=args.alpha_prompt_tokens,
        repeats=args.repeats,
        max_seconds=args.max_seconds,
        request_timeout=args.request_timeout,
        seed=args.seed,
    )


class _Bar:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.monotonic() - self.t0
        eta = elapsed / done * (total - done) if done else 0.0
        filled = 30 * done // max(1, total)
        sys.stderr.write(f"\rcalibrate [{'#' * filled}{'-' * (30 - filled)}] {done}/{total} probes  ETA {eta:.0f}s ")
        sys.stderr.flush()
        self.drawn = True

    def end(self) -> None:
        """End the bar's line (however the run ends: done, failed, Ctrl-C) so that what follows
        on stderr, or the shell's prompt, starts on a line of its own."""
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.drawn = False


def run(args: argparse.Namespace) -> int:
    target = target_base(args.target)  # a trailing /v1 (an OpenAI client's base URL) is accepted
    problem = http_url_problem("--target", args.target)
    if problem is not None:
        print(f"agentd calibrate: {problem}", file=sys.stderr)
        return 2
    problem = output_file_problem(args.out, "--out") if args.out is not None else None
    if problem is not None:
        print(f"agentd calibrate: {problem}", file=sys.stderr)
        return 2
    key, usable = api_key_arg(args, "agentd calibrate")
    if not usable:
        return 2
    opts = options(args)

    bar = _Bar()

    async def main() -> str:
        auth = None if key is None else TargetBearer(target, key)
        async with httpx.AsyncClient(timeout=opts.request_timeout, auth=auth) as client:
            result = await calibrate(client, target, opts, bar)
        bar.end()
        sys.stderr.write(result.report() + "\n")
        return result.toml_block()

    try:
        block = run_interruptible(main)
    except CalibrationError as exc:
        bar.end()
        print(f"agentd calibrate: {exc}", file=sys.stderr)
        return 1
    except trio.TooSlowError:
        bar.end()
        print(f"agentd calibrate: did not finish within --max-seconds {args.max_seconds:g}", file=sys.stderr)
        return 1
    except BaseException:  # Ctrl-C (daemon.cli exits 130) or a crash: the line ends first
        bar.end()
        raise
    sys.stdout.write(block)
    if args.out is not None:
        try:
            write_atomic(args.out, block)
        except OSError as exc:
            print(f"agentd calibrate: cannot write --out {args.out}: {exc.strerror}", file=sys.stderr)
            return 1
    return 0
