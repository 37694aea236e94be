"""Trace kit: the JSONL trace format, profile synthesizers and statistics (see docs/traces.md)."""

from bench.trace.format import Trace, TraceError, TraceMeta, TraceRecord, load_trace, read_trace, write_trace
from bench.trace.synth import PROFILES, Knobs, synthesize, targets_for

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
