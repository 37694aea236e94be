"""Edges of the per-tool acting TTL (actors/core/tool_retention.py, docs/program-scheduling.md §12)
that the mutation campaign found untested: the caps of the decision, which key decides, the
window's guards and the diagnostics counters at their boundaries."""

from __future__ import annotations

import math
from typing import Any

import pytest

from actors.core.config import ToolRetentionConfig
from actors.core.tool_retention import GapWindow, ToolGapModel, ToolSnapshot, best_ttl_scan


def _model(gaps: dict[str, tuple[float, ...]], **kw: Any) -> ToolGapModel:
    m = ToolGapModel(ToolRetentionConfig(**kw))
    for key, values in gaps.items():
        for g in values:
            m.observe("p", (key,), g)
    return m


def _rows(m: ToolGapModel) -> dict[str, ToolSnapshot]:
    return {r.tool: r for r in m.snapshot()}


def test_an_empty_window_has_prefix_zero_no_quantile_and_no_utility() -> None:
    """An empty window: prefix sums [0], no quantile, utility 0 (no division by zero)."""
    w = GapWindow(4)
    assert w.prefix_sums() == [0.0]
    assert w.quantile(0.5) is None
    assert w.utility(1.0, 5.0) == 0.0


def test_push_ignores_non_finite_and_negative_gaps_but_keeps_a_zero_gap() -> None:
    """NaN, infinite and negative gaps are not learned; an instant return (0 s) is."""
    w = GapWindow(4)
    for g in (math.nan, math.inf, -1.0, 0.0):
        w.push(g)
    assert list(w.gaps) == [0.0] and w.observed == 1 and w.prefix_sums() == [0.0, 0.0]


def test_holding_nothing_is_worth_nothing_even_after_instant_returns() -> None:
    """U(0) = 0 (docs/program-scheduling.md §12) also when gaps of 0 s would count as hits at d = 0."""
    w = GapWindow(8)
    for g in (0.0, 0.0, 2.0):
        w.push(g)
    assert w.utility(0.0, 5.0) == 0.0 and w.utility(-1.0, 5.0) == 0.0
    assert w.utility(1.0, 5.0) == pytest.approx((5.0 + 5.0 - 1.0) / 3)


def test_quantile_is_the_nearest_rank_lower_median_of_two() -> None:
    """Nearest rank: the median of two gaps is the shorter one, the 100th percentile the longer."""
    w = GapWindow(4)
    w.push(2.0)
    w.push(1.0)
    assert (w.quantile(0.5), w.quantile(1.0)) == (1.0, 2.0)


def test_a_candidate_above_cost_over_rent_is_clipped_to_it() -> None:
    """d_max = min(max_acting_ttl, C / rho): a gap just below C / rho is held exactly C / rho."""
    m = _model({"grep": (2.4, 2.4, 2.4)}, min_samples=3)
    # C = 5, rho = 2: d_max = 2.5; the candidate 2.4 x 1.1 + 0.02 = 2.66 is clipped to 2.5,
    # U(2.5) = 5 - 2 x 2.4 = 0.2 > 0
    d = m.decide("p", ("grep",), 5.0, 10.0, rent=2.0)
    assert d is not None and d.ttl_seconds == 2.5


def test_max_acting_ttl_below_the_gaps_releases_at_once() -> None:
    """d_max = min(max_acting_ttl, C / rho): with max_acting_ttl below every gap nothing is worth holding."""
    m = _model({"grep": (4.0, 4.0, 4.0)}, min_samples=3)
    d = m.decide("p", ("grep",), 5.0, 3.0)
    assert d is not None and d.ttl_seconds == 0.0 and d.source == "tool_release"


def test_a_rent_below_one_is_priced_as_one() -> None:
    """rho >= 1: at rent 0.5 a 3 s gap against C = 2 is still released (C / 1 = 2 < 3)."""
    m = _model({"bash": (3.0, 3.0, 3.0)}, min_samples=3)
    d = m.decide("p", ("bash",), 2.0, 10.0, rent=0.5)
    assert d is not None and d.ttl_seconds == 0.0


def test_the_tool_with_the_longest_median_gap_decides() -> None:
    """Several tools in one turn: the longest *median* gap decides (not the longest gap), the
    median 0 of instant tools counts as 0, and equal medians keep the first key in sorted order."""
    m = _model({"a_slow": (5.0, 5.0, 5.0), "b_fast": (0.1, 0.1, 100.0)}, min_samples=3)
    d = m.decide("p", ("a_slow", "b_fast"), 10.0, 10.0)
    assert d is not None and d.key == "a_slow" and d.ttl_seconds == pytest.approx(5.0 * 1.1 + 0.02)
    assert _rows(m)["a_slow"].held == 1 and _rows(m)["b_fast"].held == 0
    zero = _model({"a": (0.0, 0.0, 0.0), "b": (0.5, 0.5, 0.5)}, min_samples=3)
    d = zero.decide("p", ("a", "b"), 10.0, 10.0)
    assert d is not None and d.key == "b"
    tie = _model({"a": (0.2, 0.2, 0.2), "b": (0.2, 0.2, 0.2)}, min_samples=3)
    d = tie.decide("p", ("a", "b"), 10.0, 10.0)
    assert d is not None and d.key == "a"


def test_release_when_long_off_still_holds_short_tools_and_counts_the_fallback() -> None:
    """release_when_long = false only turns a decision of 0 into a fallback (counted); a positive TTL holds."""
    m = _model({"fast": (0.2,), "slow": (100.0,)}, min_samples=1, release_when_long=False)
    d = m.decide("p", ("fast",), 5.0, 10.0)
    assert d is not None and d.source == "tool" and d.ttl_seconds == pytest.approx(0.2 * 1.1 + 0.02)
    assert m.decide("p", ("slow",), 5.0, 10.0) is None
    rows = _rows(m)
    fast, slow = rows["fast"], rows["slow"]
    assert (fast.held, fast.fallbacks, fast.last_ttl_seconds) == (1, 0, pytest.approx(0.24))
    assert (slow.held, slow.released, slow.fallbacks, slow.last_ttl_seconds) == (0, 0, 1, None)


def test_a_key_decides_from_exactly_min_samples_gaps() -> None:
    """`decides` and a decision start at min_samples gaps, not one later."""
    m = _model({"grep": (0.2, 0.2)}, min_samples=3)
    assert _rows(m)["grep"].decides is False
    m.observe("p", ("grep",), 0.2)
    assert _rows(m)["grep"].decides is True
    assert m.decide("p", ("grep",), 5.0, 10.0) is not None


def test_diagnostics_quantiles_are_nearest_rank_p90_and_p99() -> None:
    """gap_p50/p90/p99 are the nearest-rank quantiles of the window (1..200 s: 100, 180, 198)."""
    m = _model({"t": tuple(float(g) for g in range(1, 201))}, window_size=200, min_samples=1)
    row = _rows(m)["t"]
    assert (row.gap_p50_seconds, row.gap_p90_seconds, row.gap_p99_seconds) == (100.0, 180.0, 198.0)


def test_outcomes_at_the_ttl_and_fit_boundaries() -> None:
    """A Program back exactly at the per-tool TTL (or the fit's) counts as back within it."""
    m = _model({"grep": (0.1,)}, min_samples=1)
    m.observe("p", ("grep",), 0.5, ("grep", 0.5, 0.5))  # at both TTLs: held, and the fit held too
    row = _rows(m)["grep"]
    assert (row.returned_held, row.returned_released, row.fit_would_hold, row.fit_would_release) == (1, 0, 0, 0)
    m.observe("p", ("grep",), 0.5, ("grep", 0.2, 0.5))  # after the tool's TTL, exactly at the fit's
    row = _rows(m)["grep"]
    assert (row.returned_held, row.returned_released, row.fit_would_hold, row.fit_would_release) == (1, 1, 1, 0)


def test_a_non_finite_gap_counts_no_outcome() -> None:
    """A gap that is not finite is neither learned nor counted against the armed TTLs."""
    m = _model({"grep": (0.1,)}, min_samples=1)
    m.observe("p", ("grep",), math.nan, ("grep", 0.5, 0.5))
    row = _rows(m)["grep"]
    assert (row.samples, row.returned_held, row.returned_released, row.fit_would_hold) == (1, 0, 0, 0)


def test_outcomes_of_a_key_whose_window_was_just_forgotten_are_dropped() -> None:
    """With max_tools below the turn's keys, the armed key's window may be evicted by its own turn: no error, no row."""
    m = ToolGapModel(ToolRetentionConfig(max_tools=1, min_samples=1))
    m.observe("p", ("a", "b"), 1.0, ("a", 2.0, 0.5))
    assert list(m.windows) == [("p", "b")]
    (row,) = m.snapshot()
    assert (row.tool, row.returned_held, row.returned_released) == ("b", 0, 0)
    m.note_armed("p", "gone", 1.0, 0.5)  # an unknown key: nothing counted, nothing created
    assert list(m.windows) == [("p", "b")]


def test_resume_costs_are_clamped_and_the_miss_ratio_bounded() -> None:
    """Negative resume figures count as 0; the miss ratio is at most 1, and unknown without a context."""
    m = ToolGapModel(ToolRetentionConfig(min_samples=1))
    for key in ("neg", "nocontext", "one", "over", "round"):
        m.observe("p", (key,), 1.0)
    m.observe_resume("p", ("neg",), -5, -1.0, -10)
    m.observe_resume("p", ("nocontext",), 300, 0.1)
    m.observe_resume("p", ("one",), 1, 0.0, 1)
    m.observe_resume("p", ("over",), 1500, 0.0, 1000)
    m.observe_resume("p", ("round",), 10, 0.1234567, 100)
    rows = _rows(m)
    neg = rows["neg"]
    assert (neg.resumes, neg.recomputed_tokens, neg.recompute_seconds, neg.resume_miss_ratio) == (1, 0, 0.0, None)
    m.observe_resume("p", ("neg",), 50, 0.0, 100)  # the negative context above counted as 0, not -10
    assert _rows(m)["neg"].resume_miss_ratio == 0.5
    assert rows["nocontext"].resume_miss_ratio is None
    assert rows["one"].resume_miss_ratio == 1.0
    assert rows["over"].resume_miss_ratio == 1.0
    assert rows["round"].recompute_seconds == 0.123457


def test_the_prepared_candidates_follow_a_change_of_margins() -> None:
    """A decision with other margins on the same window uses its own candidates, not the prepared ones."""
    w = GapWindow(8)
    for _ in range(3):
        w.push(1.0)
    assert w.best_ttl(10.0, 10.0, 0.1, 0.02) == pytest.approx(1.12)
    assert w.best_ttl(10.0, 10.0, 0.5, 0.02) == pytest.approx(1.52)
    assert w.best_ttl(10.0, 10.0, 0.5, 0.5) == pytest.approx(2.0)
    assert w.best_ttl(10.0, 10.0, 0.5, 0.5) == best_ttl_scan(w.sorted_gaps(), 10.0, 10.0, 0.5, 0.5)
