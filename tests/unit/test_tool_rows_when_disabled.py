"""A diagnostics ``tools`` row says ``decides`` only when the per-tool TTL can decide
(docs/program-scheduling.md §12, "Diagnostics"): with ``tool_retention.enabled = false`` the windows
still learn the gaps, but no completion gets a per-tool TTL."""

from __future__ import annotations

from actors.core.config import ToolRetentionConfig
from actors.core.tool_retention import ToolGapModel


def _learned(cfg: ToolRetentionConfig) -> ToolGapModel:
    model = ToolGapModel(cfg)
    for gap in (0.02, 0.03, 0.04):
        model.observe("default", ("grep",), gap)
    return model


def test_a_learned_tool_decides_only_with_the_per_tool_ttl_on() -> None:
    on = ToolRetentionConfig(min_samples=2)
    off = ToolRetentionConfig(min_samples=2, enabled=False)
    [row_on] = _learned(on).snapshot()
    [row_off] = _learned(off).snapshot()
    assert (row_on.samples, row_off.samples) == (3, 3)  # both learned the same gaps
    assert row_on.gap_p50_seconds == row_off.gap_p50_seconds == 0.03
    assert row_on.decides is True
    assert row_off.decides is False
    assert _learned(off).decide("default", ("grep",), cost=1.0, max_ttl=10.0) is None  # what the row now says
    [too_few] = _learned(ToolRetentionConfig(min_samples=4)).snapshot()
    assert too_few.decides is False
