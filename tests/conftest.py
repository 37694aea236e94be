"""Shared fixtures for the agentd test suite."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from log_capture import event_log

from daemon.logs import LIBRARY_LOGGERS, ROOT_LOGGER, WARNINGS_LOGGER

__all__ = ["event_log", "isolated_state_dir", "restored_loggers"]

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


@pytest.fixture(autouse=True)
def restored_loggers() -> Iterator[None]:
    """Each test leaves the daemon's loggers as it found them.  An in-process ``agentd`` command
    installs its handler on the ``agentd`` logger (daemon.logs.configure_logging) writing to the
    stream of that moment - pytest's capture, closed after the test - so every later log line of
    the session became a "--- Logging error ---" traceback (100,000 lines after one failure)."""
    loggers = [logging.getLogger(name) for name in (ROOT_LOGGER, *LIBRARY_LOGGERS, WARNINGS_LOGGER)]
    saved = [(logger, list(logger.handlers), logger.level, logger.propagate) for logger in loggers]
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
