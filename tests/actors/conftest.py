"""Fixtures of the Program-scheduling actor tests (helpers live in ``program_fakes.py``)."""

from __future__ import annotations

from program_fakes import event_log

__all__ = ["event_log"]
