"""Properties of the rolling statistics and the Progress-TTL fit (docs/program-scheduling.md §4, §5)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from actors.core.stats import (
    ProgressTtlFactors,
    RequestSample,
    continuous_growth_reserve,
    fit_ttl,
    normal_cdf,
)

finite = {"allow_nan": False, "allow_infinity": False}
# Realistic tool-call gaps: 0 (dropped by the fit) or at least a microsecond.
intervals = st.just(0.0) | st.floats(min_value=1e-6, max_value=1e4, **finite)
impacts = st.floats(min_value=0.0, max_value=1e3, **finite)


@st.composite
def request_samples(draw: st.DrawFn) -> RequestSample:
    prompt = draw(st.integers(min_value=0, max_value=200_000))
    return RequestSample(
        prompt_tokens=prompt,
        completion_tokens=draw(st.integers(min_value=0, max_value=8000)),
        cached_prompt_tokens=draw(st.integers(min_value=0, max_value=prompt)),
        context_growth_tokens=draw(st.none() | st.integers(min_value=1, max_value=50_000)),
        e2e_seconds=draw(st.floats(min_value=0.0, max_value=600.0, **finite)),
        decode_seconds=draw(st.none() | st.floats(min_value=0.0, max_value=600.0, **finite)),
        queue_seconds=draw(st.floats(min_value=0.0, max_value=600.0, **finite)),
        rounds_since_ttl_pause=draw(st.integers(min_value=0, max_value=40)),
        finished_at=draw(st.floats(min_value=0.0, max_value=1e5, **finite)),
    )


def naive_mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


@given(st.integers(min_value=0, max_value=12), st.lists(request_samples(), max_size=40))
def test_request_window_bounded_and_means_match_recomputation(limit: int, samples: list[RequestSample]) -> None:
    f = ProgressTtlFactors(limit)
    for i, s in enumerate(samples, 1):
        f.push_request(s)
        assert len(f.requests) == min(i, limit) if limit > 0 else len(f.requests) == 0  # windows stay bounded
    window = list(f.requests)
    assert window == samples[len(samples) - len(window) :]
    assert f.request_window_complete == (limit > 0 and len(samples) >= limit)
    assert math.isclose(
        f.mean_prompt_tokens(), naive_mean([s.prompt_tokens for s in window]), rel_tol=1e-9, abs_tol=1e-6
    )
    assert math.isclose(
        f.mean_completion_tokens(), naive_mean([s.completion_tokens for s in window]), rel_tol=1e-9, abs_tol=1e-6
    )
    growth = [s.context_growth_tokens for s in window if s.context_growth_tokens is not None]
    assert math.isclose(f.mean_context_growth_tokens(), naive_mean(growth), rel_tol=1e-9, abs_tol=1e-6)
    decode = [s.decode_seconds for s in window if s.decode_seconds is not None]
    got = f.mean_decode_seconds()
    if decode:
        assert got is not None and math.isclose(got, naive_mean(decode), rel_tol=1e-9, abs_tol=1e-6)
    else:
        assert got is None
    rounds = naive_mean([s.rounds_since_ttl_pause for s in window])
    assert math.isclose(f.mean_rounds_since_ttl_pause(), rounds, rel_tol=1e-9, abs_tol=1e-9)


@given(
    st.integers(min_value=1, max_value=10),
    st.integers(min_value=1, max_value=20),
    st.lists(request_samples(), max_size=30),
)
def test_target_rounds_is_zero_or_an_integer_within_the_cap(limit: int, cap: int, samples: list[RequestSample]) -> None:
    f = ProgressTtlFactors(limit)
    for s in samples:
        f.push_request(s)
    r = f.target_rounds(cap)
    assert isinstance(r, int)
    if not f.request_window_complete:
        assert r == 0  # no target rounds before the window is full
        assert continuous_growth_reserve(f, r, [3, 4]) == 0.0
    else:
        assert 1 <= r <= cap
        expected = max(1, min(cap, math.ceil(2 * naive_mean([s.rounds_since_ttl_pause for s in f.requests]) - 1e-9)))
        assert abs(r - expected) <= 1


@given(st.integers(min_value=1, max_value=10), st.lists(intervals, max_size=30), impacts, st.floats(0.0, 60.0))
def test_fitted_ttl_zero_until_mature_then_bounded(limit: int, gaps: list[float], impact: float, cap: float) -> None:
    f = ProgressTtlFactors(limit)
    for g in gaps:
        f.push_continuity(g, 1.0)
    ttl = f.fitted_acting_ttl(impact, cap)
    d_max = min(cap, impact)
    if not f.continuity_window_complete:
        assert ttl == 0.0  # an incomplete window fits 0
    assert ttl == 0.0 or min(0.05, d_max) - 1e-12 <= ttl <= d_max + 1e-12
    assert len(f.continuities) == min(len(gaps), limit)


@given(
    st.floats(min_value=-5.0, max_value=8.0, **finite),
    st.floats(min_value=1e-6, max_value=4.0, **finite),
    impacts,
    st.floats(min_value=0.0, max_value=60.0, **finite),
)
def test_fit_ttl_bounds(mu: float, sigma: float, impact: float, cap: float) -> None:
    ttl = fit_ttl(mu, sigma, impact, cap)
    d_max = min(cap, impact)
    if d_max <= 0:
        assert ttl == 0.0
    else:
        assert ttl == 0.0 or min(0.05, d_max) - 1e-12 <= ttl <= d_max + 1e-12


@given(st.floats(min_value=-40.0, max_value=40.0, **finite), st.floats(min_value=-40.0, max_value=40.0, **finite))
def test_normal_cdf_is_a_monotone_probability(a: float, b: float) -> None:
    lo, hi = min(a, b), max(a, b)
    assert 0.0 <= normal_cdf(lo) <= normal_cdf(hi) <= 1.0
    assert abs(normal_cdf(a) + normal_cdf(-a) - 1.0) < 1e-6
