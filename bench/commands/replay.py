"""``agentd replay --trace FILE --target URL``: drive an OpenAI-compatible endpoint with a trace.

Scrapes the workers' ``/metrics`` (``--worker-metrics``, repeatable) and the target's own metrics
(``--router-metrics``, default ``<target>/metrics``) before and after the run, replays the trace
(bench.replay) with a live progress line on stderr, and writes the JSON report
(bench.report) to ``--out`` (or stdout).  ``--api-key`` (default ``$OPENAI_API_KEY``, as ``agentd
batch``) is sent as a bearer token to the target, never to the ``--worker-metrics`` URLs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench.commands.common import (
    TargetBearer,
    add_api_key_flag,
    add_replay_flags,
    api_key_arg,
    failure_line,
    load_trace_arg,
    replay_options,
)
from bench.interrupt import run_interruptible
from bench.output import write_report
from bench.progress import progress_line
from bench.replay import replay_client
from bench.report import measured_replay, trace_summary
from daemon.batch_runner import target_base
from daemon.commands.argtypes import http_url_problem
from daemon.commands.paths import output_file_problem

NAME = "replay"
HELP = "Replay a trace against an OpenAI-compatible endpoint and write a JSON report."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="trace JSONL (agentd trace synth)")
    parser.add_argument(
        "--target",
        required=True,
        help="base URL of the endpoint, e.g. http://127.0.0.1:3001 (a trailing /v1 is accepted)",
    )
    parser.add_argument("--out", default=None, help="report JSON path (default: stdout)")
    parser.add_argument(
        "--worker-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a worker's /metrics URL for cache-hit and preemption counters (repeatable)",
    )
    parser.add_argument(
        "--router-metrics",
        default=None,
        metavar="URL",
        help="the target's Prometheus URL (default <target>/metrics; 'none' to skip)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    add_api_key_flag(parser)
    add_replay_flags(parser)


def run(args: argparse.Namespace) -> int:
    problem = output_file_problem(args.out, "--out") if args.out else None
    if problem is not None:
        print(f"agentd replay: {problem}", file=sys.stderr)
        return 2
    trace = load_trace_arg(args.trace, "agentd replay")
    if trace is None:
        return 2
    target = target_base(args.target)  # a trailing /v1 (an OpenAI client's base URL) is accepted, as by agentd batch
    urls = [("--target", args.target), *(("--worker-metrics", url) for url in args.worker_metrics)]
    if args.router_metrics not in (None, "none"):
        urls.append(("--router-metrics", args.router_metrics))
    for flag, url in urls:
        problem = http_url_problem(flag, url)
        if problem is not None:
            print(f"agentd replay: {problem}", file=sys.stderr)
            return 2
    key, usable = api_key_arg(args, "agentd replay")
    if not usable:
        return 2
    router = [] if args.router_metrics == "none" else [args.router_metrics or f"{target}/metrics"]
    opts = replay_options(args)

    async def main() -> dict[str, Any]:
        async with replay_client() as client:
            if key is not None:
                client.auth = TargetBearer(target, key)
            with progress_line(not args.no_progress, "replay") as progress:
                return await measured_replay(
                    trace,
                    client,
                    target,
                    opts,
                    worker_metrics=list(args.worker_metrics),
                    router_metrics=router,
                    info=trace_summary(trace, args.trace, opts.concurrency),
                    progress=progress,
                )

    report = run_interruptible(main)
    write_report(report, args.out)
    # the report's figures from a /metrics URL it could not read are missing: say so (unless no
    # request got through either: the failure line below says why)
    for error in report["metrics_errors"] if report["requests"]["completed"] else ():
        print(f"agentd replay: warning: could not read {error}", file=sys.stderr)
        if router and error.startswith(f"{router[0]}: HTTP 40") and not args.router_metrics:
            print(
                "agentd replay: an agentd with API keys serves /metrics only to admin keys or on its "
                "[prometheus] or [admin] listener: pass --router-metrics URL (or --router-metrics none)",
                file=sys.stderr,
            )
    requests = report["requests"]
    failure = failure_line("agentd replay", report)
    if failure:  # exit 1 said nothing of why (with --no-progress, or the report on stdout)
        print(failure, file=sys.stderr)
    return 0 if requests["failed"] == 0 else 1
