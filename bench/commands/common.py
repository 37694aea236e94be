"""What the kit's commands share: the replay flags, trace loading, and options built from flags.

Argument types come from ``daemon.commands.argtypes``.  This module is not a command (it is not in
the ``agentd.commands`` entry-point group).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Generator, Mapping
from typing import Any, TypeVar

import attrs
import httpx
from attrs import AttrsInstance

from bench.replay import ReplayOptions
from bench.trace.format import Trace, TraceError, load_trace, read_trace
from daemon.commands.argtypes import finite_at_least, non_empty, positive_int
from sim.config import MIN_TIME_SCALE

T = TypeVar("T", bound=AttrsInstance)

MIN_REQUEST_TIMEOUT_SECONDS = 0.001


def from_args(cls: type[T], args: argparse.Namespace, **renamed: str) -> T:
    """An attrs ``cls`` built from parsed flags.

    Each field takes the flag of the same name, or the flag ``renamed`` names for it
    (``num_gpu_blocks="kv_blocks"``); a field no flag carries keeps its default.
    """
    flags = vars(args)
    values = {}
    for field in attrs.fields(cls):
        flag = renamed.get(field.name, field.name)
        if flag in flags:
            values[field.name] = flags[flag]
    return cls(**values)


def add_progress_flags(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` into ``args.progress`` (None: neither given)."""
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="progress line on stderr (the default when stderr is a terminal)",
    )
    shown.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line")


def progress_shown(args: argparse.Namespace) -> bool:
    """Whether to draw a progress line: as asked, else when stderr is a terminal."""
    return sys.stderr.isatty() if args.progress is None else bool(args.progress)


def add_replay_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of ``agentd replay``, ``agentd simulate`` and ``agentd bench``: see ``replay_options``."""
    parser.add_argument(
        "--time-scale",
        type=finite_at_least(MIN_TIME_SCALE),  # simulated workers run at it too (sim.config)
        default=1.0,
        help=f"run X times faster than the trace's recorded times (gaps, arrivals; >= {MIN_TIME_SCALE:g})",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help="max concurrent root Programs (default: trace meta for closed-loop traces)",
    )
    # '' sent "model": "" in every request: all refused (404), an exit 1 after the whole run
    parser.add_argument("--model", default="agentd-sim", type=non_empty, help="model name sent in requests")
    parser.add_argument(
        "--agentic-context",
        choices=("object", "string", "none"),
        default="object",
        help="vllm_xargs.agentic_context form (string = JSON string for stock vLLM)",
    )
    # at least 1 ms: agentd simulate with --request-timeout 1e-100 never ended (its virtual clock
    # waited for a deadline it could not reach), and no request is answered sooner anyway
    parser.add_argument(
        "--request-timeout",
        type=finite_at_least(MIN_REQUEST_TIMEOUT_SECONDS),
        default=600.0,
        help=f"seconds per request (at least {MIN_REQUEST_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument(
        "--no-sim-hints",
        dest="sim_hints",
        action="store_false",
        help="send no simulator hints (vllm_xargs.sim_*): tool-call turns then end as the backend decides",
    )


def replay_options(args: argparse.Namespace) -> ReplayOptions:
    return from_args(ReplayOptions, args, request_timeout_seconds="request_timeout")


def load_trace_arg(path: str, prog: str, flag: str = "--trace") -> Trace | None:
    """The trace at ``path`` (``-``: standard input, as ``agentd trace synth --out -`` writes it),
    or ``None`` after printing why it cannot be used (exit code 2)."""
    try:
        if path == "-":
            return read_trace(io.StringIO(_stdin_text()))
        return load_trace(path)
    except OSError as exc:
        print(f"{prog}: cannot read {flag} {path}: {exc.strerror}", file=sys.stderr)
    except TraceError as exc:
        print(f"{prog}: invalid {flag} {path}: {exc}", file=sys.stderr)
    return None


def _stdin_text() -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError("not UTF-8 text (is this a trace?)") from None


API_KEY_ENV = "OPENAI_API_KEY"  # as agentd batch (docs/batch.md §3)


def add_api_key_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help=f"sent to the target as 'Authorization: Bearer KEY' (default: ${API_KEY_ENV} when set; "
        "--api-key '' sends none)",
    )


def api_key_arg(args: argparse.Namespace, prog: str) -> tuple[str | None, bool]:
    """The key to send (``--api-key``, else ``$OPENAI_API_KEY``; "" = none) and whether it is usable;
    an unusable one is printed naming its source (the command exits 2)."""
    flag: str | None = args.api_key
    key = flag if flag is not None else os.environ.get(API_KEY_ENV) or None
    if not key:
        return None, True
    if not key.isprintable() or any(ch.isspace() for ch in key):
        source = "--api-key" if flag is not None else f"${API_KEY_ENV}"
        print(f"{prog}: {source}: the key contains whitespace or control characters", file=sys.stderr)
        return None, False
    return key, True


class TargetBearer(httpx.Auth):
    """``Authorization: Bearer KEY`` on requests to the target's origin only: the workers'
    ``/metrics`` (``--worker-metrics``) are other servers and never see the key."""

    def __init__(self, target: str, key: str) -> None:
        self._origin = _origin(httpx.URL(target))
        self._value = f"Bearer {key}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if _origin(request.url) == self._origin:
            request.headers["Authorization"] = self._value
        yield request


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, url.port if url.port is not None else default


def failure_line(prog: str, report: Mapping[str, Any]) -> str | None:
    """Why a replay-style report exits 1 (failed requests, by kind), as one line; None if none failed."""
    requests = report["requests"]
    if not requests["failed"]:
        return None
    kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(requests["errors"].items()))
    return (
        f"{prog}: {requests['failed']} of {requests['planned']} planned requests failed ({kinds}); "
        f"{requests['completed']} completed"
    )
