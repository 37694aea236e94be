"""Shared fixtures for the agentd test suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from log_capture import event_log

__all__ = ["event_log", "isolated_state_dir"]


@pytest.fixture(autouse=True)
def isolated_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Daemons started by tests (and their child processes) keep their state - the Batch API's
    default database, docs/config.md ``[batch_api]`` - in a temporary directory, never in the
    user's ``~/.local/state``."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    yield state
