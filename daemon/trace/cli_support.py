"""Argument types and trace loading shared by the trace, replay, simulate and bench commands."""

from __future__ import annotations

import argparse
import math
import sys

from daemon.trace.format import Trace, TraceError, load_trace


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def load_trace_arg(path: str, prog: str, flag: str = "--trace") -> Trace | None:
    """The trace at ``path``, or ``None`` after printing why it cannot be used (exit code 2)."""
    try:
        return load_trace(path)
    except OSError as exc:
        print(f"{prog}: cannot read {flag} {path}: {exc.strerror}", file=sys.stderr)
    except TraceError as exc:
        print(f"{prog}: invalid {flag} {path}: {exc}", file=sys.stderr)
    return None
