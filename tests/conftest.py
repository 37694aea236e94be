"""Shared fixtures for the agentd test suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from log_capture import event_log

__all__ = ["event_log", "isolated_state_dir"]

# Hypothesis measures wall time twice: a 200 ms deadline per example and the too_slow health check
# (generating the first examples took over a second).  On a loaded CI machine both fail tests that
# are right.  The property tests' own profiles (property_tests/conftest.py) already turn both off;
# this is the default for everything under tests/, whose @settings inherit it (they are created at
# import, before property_tests/conftest.py runs).
settings.register_profile("agentd-tests", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("agentd-tests")


@pytest.fixture(autouse=True)
def isolated_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Daemons started by tests (and their child processes) keep their state - the Batch API's
    default database, docs/config.md ``[batch_api]`` - in a temporary directory, never in the
    user's ``~/.local/state``."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    yield state
