"""Shared fixtures for the agentd test suite."""

from __future__ import annotations

from log_capture import event_log

__all__ = ["event_log"]
