"""Trace kit: the JSONL trace format, profile synthesizers and statistics (see docs/traces.md)."""

from daemon.trace.format import Trace, TraceError, TraceMeta, TraceRecord, load_trace, read_trace, write_trace
from daemon.trace.synth import PROFILES, Knobs, synthesize, targets_for

__all__ = [
    "PROFILES",
    "Knobs",
    "Trace",
    "TraceError",
    "TraceMeta",
    "TraceRecord",
    "load_trace",
    "read_trace",
    "synthesize",
    "targets_for",
    "write_trace",
]
