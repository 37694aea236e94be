"""The suite's Hypothesis tests set no wall-clock limits (tests/conftest.py): an example that takes
over 200 ms, or slow generation, on a loaded machine is not a failure."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# created at import, as the suite's @settings(...) decorators are: it inherits the default then
AT_IMPORT = settings(max_examples=5)


def test_settings_made_at_import_have_no_deadline_and_no_too_slow_check() -> None:
    assert AT_IMPORT.deadline is None
    assert HealthCheck.too_slow in AT_IMPORT.suppress_health_check


@given(st.integers())
def test_a_given_without_settings_runs_without_a_deadline(n: int) -> None:
    assert settings.default.deadline is None
    assert isinstance(n, int)
