"""``agentd batch -i input.jsonl -o output.jsonl (--target URL | --config FILE)`` (docs/batch.md §3).

Sends every line of an OpenAI / vLLM ``run_batch`` file to an OpenAI-compatible server - a running
agentd, vLLM or any compatible URL (``--target``), or a daemon started in this process from a
configuration file (``--config``; the embedded simulated backend when it has no worker URLs) - and
appends one output record per line.  Rerunning with the same output file resumes.

Exit codes: 0 every valid line has a 2xx answer in the output; 1 some line failed (non-2xx answer or
no answer after retries), no line of the input is a valid request, or the run stopped early; 2 bad
usage (flags, unreadable input, an output file that is not a batch output, a bad configuration); 130
interrupted by Ctrl-C (143 by SIGTERM); the output is valid and a rerun resumes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import httpx
import trio

from daemon.batch_output import OutputFileError, Resumed, scan_output, write_errors_file
from daemon.batch_runner import BatchOptions, BatchRunner, BatchSummary
from daemon.commands.argtypes import http_url_problem, int_at_least, positive_float, positive_int
from daemon.commands.paths import input_file_problem, output_file_problem
from daemon.config import AgentdConfig
from daemon.config_loading import ConfigError, load_config

NAME = "batch"
HELP = "Run an OpenAI/vLLM batch file (JSONL) against agentd, any OpenAI-compatible URL or the embedded simulator."
CONNECT_TIMEOUT_SECONDS = 10.0

EPILOG = """\
exit codes: 0 every valid line answered 2xx; 1 some line failed, no line is a valid request or the run
stopped early; 2 bad usage; 130 Ctrl-C (143 SIGTERM) - rerun the same command to resume.
examples:
  agentd batch -i requests.jsonl -o results.jsonl --target http://localhost:3001
  agentd batch -i requests.jsonl -o results.jsonl --config configs/quickstart.toml --concurrency 64
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("-i", "--input", required=True, metavar="FILE", help="batch input file (JSONL)")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="output file (JSONL); appended to and resumed"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--target",
        metavar="URL",
        help="base URL of an OpenAI-compatible server (agentd, vLLM, ...), e.g. http://localhost:3001",
    )
    where.add_argument(
        "--config",
        metavar="FILE",
        help="start agentd in this process from this configuration (embedded simulator without worker_urls)",
    )
    parser.add_argument(
        "--concurrency", type=positive_int, default=16, metavar="N", help="requests in flight (default 16)"
    )
    parser.add_argument(
        "--errors",
        metavar="FILE",
        help="also write the records that are not a 2xx answer to FILE (rewritten at the end)",
    )
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY when set)",
    )
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--restart", action="store_true", help="overwrite the output file instead of resuming from it")
    again.add_argument(
        "--retry-failed",
        action="store_true",
        help="resume, but first remove the output's failed records (non-2xx, no answer) so those lines are sent again",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=600.0,
        metavar="SECONDS",
        help="per-request read timeout (default 600)",
    )
    parser.add_argument(
        "--max-attempts",
        type=positive_int,
        default=3,
        metavar="N",
        help="attempts per line on transport errors and 429/502/503/504 (default 3)",
    )
    parser.add_argument(
        "--fsync-every",
        type=int_at_least(1),
        default=64,
        metavar="N",
        help="fsync the output every N lines (default 64)",
    )


def _usage_error(message: str) -> int:
    print(f"agentd batch: error: {message}", file=sys.stderr)
    return 2


def _check_files(args: argparse.Namespace) -> str | None:
    """The usage problem with the input/output/errors paths, or None."""
    inp, out = Path(args.input), Path(args.output)
    problem = input_file_problem(args.input, "--input")
    if problem is not None:
        return problem
    if out.exists() and out.resolve() == inp.resolve():
        return f"--output: must be a file other than the input: {args.output}"
    problem = output_file_problem(args.output, "--output")
    if problem is not None:
        return problem
    if args.errors is not None:
        err = Path(args.errors)
        if err.resolve() in (inp.resolve(), out.resolve()):
            return f"--errors: must differ from --input and --output: {args.errors}"
        # the errors file is written at the end of the run: a bad path must not cost the run
        return output_file_problem(args.errors, "--errors")
    return None


def _load_daemon_config(path: str) -> AgentdConfig:
    """The ``--config`` file, served on an ephemeral loopback port, without the extra metrics and
    admin listeners and without the Batch API: that daemon serves only this command's requests, and
    its Batch API executor would resume the batches of the database a running daemon of the same
    configuration owns (two daemons on one database send requests twice, docs/batch.md §4).  The
    files the configuration names (API keys, worker TLS and key files) are read here, as
    ``agentd start`` reads them: a missing one raised its ConfigError inside the Trio run."""
    from daemon.security import load_security

    cfg = load_config(path)
    load_security(cfg)
    server = attrs.evolve(cfg.server, host="127.0.0.1", port=0)
    return attrs.evolve(
        cfg,
        server=server,
        prometheus=attrs.evolve(cfg.prometheus, port=None),
        admin=attrs.evolve(cfg.admin, port=None),
        batch_api=attrs.evolve(cfg.batch_api, enabled=False),
    )


@asynccontextmanager
async def in_process_daemon(cfg: AgentdConfig) -> AsyncIterator[str]:
    """Run agentd in this Trio run (real HTTP on 127.0.0.1, port 0); yield its URL, stop it on exit."""
    from daemon.supervisor import run_daemon

    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, cfg))
        try:
            assert handles.http_url is not None
            yield handles.http_url
        finally:
            handles.request_shutdown()


def make_client(opts: BatchOptions, timeout: float, *, trust_env: bool) -> httpx.AsyncClient:
    n = opts.concurrency
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_SECONDS),
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
        trust_env=trust_env,
    )


async def _watch_signals(runner: BatchRunner, received: list[int]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            received.append(signum)
            again = len(received) > 1
            if signum == signal.SIGTERM or again:
                runner.request_stop(cancel_in_flight=True)
                print("\nagentd batch: stopping, cancelling the requests in flight", file=sys.stderr)
            else:
                runner.request_stop()
                print(
                    f"\nagentd batch: stopping after the {runner.in_flight} requests in flight "
                    "(Ctrl-C again to cancel them)",
                    file=sys.stderr,
                )


@asynccontextmanager
async def _base_url(args: argparse.Namespace, cfg: AgentdConfig | None) -> AsyncIterator[str]:
    if cfg is None:
        yield args.target
        return
    async with in_process_daemon(cfg) as url:
        yield url


async def _main(
    args: argparse.Namespace, opts: BatchOptions, cfg: AgentdConfig | None, resumed: Resumed, received: list[int]
) -> BatchSummary:
    async with trio.open_nursery() as nursery, _base_url(args, cfg) as base_url:
        async with make_client(opts, args.timeout, trust_env=cfg is None) as client:
            runner = BatchRunner(opts, client, base_url)
            nursery.start_soon(_watch_signals, runner, received)
            summary = await runner.run(resumed)
        nursery.cancel_scope.cancel()
    return summary


def run(args: argparse.Namespace) -> int:
    if args.target is None and args.config is None:
        return _usage_error("one of --target URL or --config FILE is required")
    problem = None if args.target is None else http_url_problem("--target", args.target)
    if problem is not None:
        return _usage_error(problem)
    problem = _check_files(args)
    if problem is not None:
        return _usage_error(problem)
    cfg = None
    if args.config is not None:
        try:
            cfg = _load_daemon_config(args.config)
        except ConfigError as exc:
            print(f"agentd batch: error: invalid configuration ({args.config}):", file=sys.stderr)
            for line in exc.lines:
                print(f"  {line}", file=sys.stderr)
            return 2
    output = Path(args.output)
    resumed = Resumed(set(), set())
    if not args.restart:
        try:
            resumed = scan_output(output, drop_failed=args.retry_failed)  # truncates a partial last line
        except OutputFileError as exc:
            return _usage_error(f"--output {args.output}: {exc}; use --restart to overwrite it or another file")
    opts = BatchOptions(
        input_path=Path(args.input),
        output_path=output,
        concurrency=args.concurrency,
        restart=args.restart,
        retry_failed=args.retry_failed,
        max_attempts=args.max_attempts,
        fsync_every=args.fsync_every,
        api_key=args.api_key if args.api_key is not None else os.environ.get("OPENAI_API_KEY") or None,
    )
    if cfg is not None:
        from daemon.logs import configure_logging

        configure_logging("warning", "kv")  # the in-process daemon's INFO lines would bury the progress bar
    if resumed.dropped:
        print(
            f"agentd batch: removed {resumed.dropped} failed records from {args.output} to retry them", file=sys.stderr
        )
    received: list[int] = []
    failures: list[BaseException] = []
    summary = None
    try:
        summary = trio.run(_main, args, opts, cfg, resumed, received)
    except* OSError as group:  # e.g. disk full: the output still ends with a whole line
        failures.extend(group.exceptions)
    if summary is None:
        for failure in failures:
            print(f"agentd batch: error: {failure}", file=sys.stderr)
        print(f"agentd batch: stopped; {args.output} is valid, rerun the same command to resume", file=sys.stderr)
        return 1
    if args.errors is not None:
        n = write_errors_file(output, Path(args.errors))
        print(f"agentd batch: {n} records that are not a 2xx answer written to {args.errors}", file=sys.stderr)
    print(f"agentd batch: {summary.text()}", file=sys.stderr)
    if summary.truncated_bytes:
        print(
            f"agentd batch: removed a partial last line ({summary.truncated_bytes} bytes) left by an earlier run",
            file=sys.stderr,
        )
    if received or summary.stopped:
        print(
            f"agentd batch: interrupted with {summary.answered} of {summary.total} lines answered in {args.output}; "
            "rerun the same command to resume",
            file=sys.stderr,
        )
        if received:
            return 143 if received[0] == signal.SIGTERM else 130
        return 1
    print(f"agentd batch: results in {args.output}", file=sys.stderr)
    if summary.total == 0:
        # an empty file (a generator that wrote nothing, the wrong path): the Batch API fails it too
        print(f"agentd batch: {args.input} has no request lines: nothing was sent", file=sys.stderr)
        return 1
    if summary.malformed and summary.ok + summary.failed + summary.resumed == 0:
        # not one request in the file (a trace, an output file, another format): exit 0 read as success
        print(
            f"agentd batch: no line of {args.input} is a valid request (see the lines above): "
            'a run_batch file has one {"custom_id", "method", "url", "body"} object per line',
            file=sys.stderr,
        )
        return 1
    return summary.exit_code
