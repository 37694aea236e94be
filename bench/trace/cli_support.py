"""Trace loading shared by the trace, replay, simulate and bench commands (argument types: daemon.commands.argtypes)."""

from __future__ import annotations

import sys

from bench.trace.format import Trace, TraceError, load_trace


def load_trace_arg(path: str, prog: str, flag: str = "--trace") -> Trace | None:
    """The trace at ``path``, or ``None`` after printing why it cannot be used (exit code 2)."""
    try:
        return load_trace(path)
    except OSError as exc:
        print(f"{prog}: cannot read {flag} {path}: {exc.strerror}", file=sys.stderr)
    except TraceError as exc:
        print(f"{prog}: invalid {flag} {path}: {exc}", file=sys.stderr)
    return None
