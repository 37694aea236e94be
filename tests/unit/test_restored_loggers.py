"""The suite's ``restored_loggers`` fixture (tests/conftest.py): a test that configures the daemon's
logging onto a stream that is closed afterwards (pytest's capture) does not break the logging of
the tests after it.  The two tests run in this order (pytest keeps a module's order)."""

from __future__ import annotations

import io
import logging

import pytest

from daemon.logs import configure_logging

CLOSED = io.StringIO()


def test_a_command_configures_logging_onto_a_stream_that_then_closes() -> None:
    configure_logging("info", "kv", CLOSED)
    logging.getLogger("agentd").info("inside the test that configured it")
    assert "inside the test" in CLOSED.getvalue()
    CLOSED.close()


def test_the_next_test_logs_without_a_logging_error(capsys: pytest.CaptureFixture[str]) -> None:
    logging.getLogger("agentd").warning("a later test's log line")
    assert "Logging error" not in capsys.readouterr().err
