"""``agentd replay --trace FILE --target URL``: drive an OpenAI-compatible endpoint with a trace.

Scrapes the workers' ``/metrics`` (``--worker-metrics``, repeatable) and the target's own metrics
(``--router-metrics``, default ``<target>/metrics``) before and after the run, replays the trace
(bench.replay) with a live progress line on stderr, and writes the JSON report
(bench.report) to ``--out`` (or stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx
import trio

from bench.progress import ProgressLine
from bench.replay import ReplayOptions, run_replay
from bench.report import build_report, scrape_all
from bench.trace.cli_support import load_trace_arg
from bench.trace.format import Trace
from daemon.commands.argtypes import positive_float, positive_int

NAME = "replay"
HELP = "Replay a trace against an OpenAI-compatible endpoint and write a JSON report."


def add_replay_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared with ``agentd bench`` and ``agentd simulate``."""
    parser.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="run X times faster than the trace's recorded times (gaps, arrivals)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help="max concurrent root Programs (default: trace meta for closed-loop traces)",
    )
    parser.add_argument("--model", default="agentd-sim", help="model name sent in requests")
    parser.add_argument(
        "--agentic-context",
        choices=("object", "string", "none"),
        default="object",
        help="vllm_xargs.agentic_context form (string = JSON string for stock vLLM)",
    )
    parser.add_argument("--request-timeout", type=positive_float, default=600.0, help="seconds per request")


def replay_options(args: argparse.Namespace) -> ReplayOptions:
    return ReplayOptions(
        time_scale=args.time_scale,
        concurrency=args.concurrency,
        model=args.model,
        agentic_context=args.agentic_context,
        request_timeout_seconds=args.request_timeout,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="trace JSONL (agentd trace synth)")
    parser.add_argument("--target", required=True, help="base URL of the endpoint, e.g. http://127.0.0.1:3001")
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
    add_replay_flags(parser)


def trace_info(trace: Trace, path: str) -> dict[str, Any]:
    return {
        "path": path,
        "profile": trace.meta.profile,
        "seed": trace.meta.seed,
        "programs": trace.meta.programs,
        "requests": len(trace.records),
        "arrival": trace.meta.arrival,
        "concurrency": trace.meta.concurrency,
    }


async def replay_with_metrics(
    trace: Trace,
    client: httpx.AsyncClient,
    target: str,
    opts: ReplayOptions,
    *,
    worker_metrics: list[str],
    router_metrics: list[str],
    info: dict[str, Any],
    system: str | None,
    progress: ProgressLine | None,
) -> dict[str, Any]:
    errors: list[str] = []
    wb = await scrape_all(client, worker_metrics, errors)
    rb = await scrape_all(client, router_metrics, errors)
    result = await run_replay(trace, client, target, opts, progress=progress.update if progress else None)
    if progress is not None:
        progress.close()
    wa = await scrape_all(client, worker_metrics, errors)
    ra = await scrape_all(client, router_metrics, errors)
    info = dict(info, concurrency=opts.concurrency or info.get("concurrency"))
    return build_report(
        result,
        time_scale=opts.time_scale,
        worker_before=wb,
        worker_after=wa,
        router_before=rb,
        router_after=ra,
        trace_info=info,
        system=system,
        metrics_errors=errors,
    )


def run(args: argparse.Namespace) -> int:
    trace = load_trace_arg(args.trace, "agentd replay")
    if trace is None:
        return 2
    target = args.target.rstrip("/")
    if not target.startswith(("http://", "https://")):
        print(f"agentd replay: --target must be an http(s) URL, got {args.target!r}", file=sys.stderr)
        return 2
    router = [] if args.router_metrics == "none" else [args.router_metrics or f"{target}/metrics"]
    opts = replay_options(args)
    progress = None if args.no_progress else ProgressLine(sys.stderr, label="replay")

    async def main() -> dict[str, Any]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
        async with httpx.AsyncClient(limits=limits, timeout=None) as client:
            return await replay_with_metrics(
                trace,
                client,
                target,
                opts,
                worker_metrics=list(args.worker_metrics),
                router_metrics=router,
                info=trace_info(trace, args.trace),
                system=None,
                progress=progress,
            )

    report = trio.run(main)
    text = json.dumps(report, indent=2, sort_keys=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0 if report["requests"]["failed"] == 0 else 1
