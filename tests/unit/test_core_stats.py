"""Rolling ProgressTtlFactors and the Progress-TTL formulas (docs/program-scheduling.md §4, §5)."""

from __future__ import annotations

import math

import pytest
from core_support import request_sample

from actors.core.stats import (
    ProgressTtlFactors,
    continuous_growth_reserve,
    erf_as,
    fit_ttl,
    normal_cdf,
    ttl_candidates,
    ttl_utility,
)


def test_core_stats_window_drops_oldest_and_reports_complete() -> None:
    f = ProgressTtlFactors(3)
    for i in range(5):
        f.push_request(request_sample(prompt=100 * (i + 1), at=float(i)))
    assert len(f.requests) == 3
    assert f.request_window_complete
    # the window holds prompts 300, 400, 500
    assert f.mean_prompt_tokens() == pytest.approx(400.0)


def test_core_stats_token_weighted_cache_ratio_and_throughput() -> None:
    f = ProgressTtlFactors(10)
    f.push_request(request_sample(prompt=100, cached=90, at=10.0))
    f.push_request(request_sample(prompt=300, cached=30, at=12.0))
    f.push_request(request_sample(prompt=600, cached=480, at=14.0))
    # token weighted: (90 + 30 + 480) / (100 + 300 + 600) = 600 / 1000
    assert f.cached_prompt_ratio() == pytest.approx(0.6)
    # (n - 1) / (last - first) = 2 / 4
    assert f.request_throughput_per_second() == pytest.approx(0.5)
    # mean uncached = mean(10, 270, 120) = 400 / 3
    assert f.mean_uncached_prompt_tokens() == pytest.approx(400 / 3)


def test_core_stats_empty_and_zero_limit_windows_are_safe() -> None:
    f = ProgressTtlFactors(0)
    f.push_request(request_sample())
    f.push_continuity(1.0, 0.5)
    assert len(f.requests) == 0 and len(f.continuities) == 0
    assert not f.request_window_complete and not f.continuity_window_complete
    assert f.mean_prompt_tokens() == 0.0
    assert f.mean_decode_seconds() is None
    assert f.request_throughput_per_second() == 0.0
    assert f.fitted_acting_ttl(5.0, 10.0) == 0.0
    assert f.target_rounds(14) == 0
    assert continuous_growth_reserve(f, f.target_rounds(14), []) == 0.0


def test_core_stats_growth_and_decode_means_only_count_valid_samples() -> None:
    f = ProgressTtlFactors(10)
    f.push_request(request_sample(growth=100, decode=2.0))
    f.push_request(request_sample(growth=None, decode=None))
    f.push_request(request_sample(growth=300, decode=float("nan")))
    assert f.mean_context_growth_tokens() == pytest.approx(200.0)
    assert f.mean_decode_seconds() == pytest.approx(2.0)


def test_core_stats_target_rounds_and_mature_reserve_formula() -> None:
    f = ProgressTtlFactors(2)
    f.push_request(request_sample(rounds=1, growth=500))
    assert f.target_rounds(14) == 0  # window incomplete
    assert continuous_growth_reserve(f, f.target_rounds(14), [3]) == 0.0
    f.push_request(request_sample(rounds=2, growth=700))
    # ceil(2 * mean(1, 2)) = ceil(3.0) = 3, within [1, 14]
    assert f.target_rounds(14) == 3
    assert f.target_rounds(2) == 2  # clamped to max_segment_rounds
    # reserve = g * (R + sum(remaining)) = 600 * (3 + 1 + 2)
    assert continuous_growth_reserve(f, 3, [1, 2]) == pytest.approx(3600.0)


def test_core_stats_target_rounds_floor_is_one() -> None:
    f = ProgressTtlFactors(2)
    f.push_request(request_sample(rounds=0))
    f.push_request(request_sample(rounds=0))
    assert f.target_rounds(14) == 1


def test_core_stats_ttl_pause_rounds_window_is_independent() -> None:
    f = ProgressTtlFactors(2)
    for r in (4, 6, 8):
        f.push_ttl_pause_rounds(r)
    assert list(f.ttl_pause_rounds) == [6, 8]
    assert f.mean_ttl_pause_rounds() == 7.0
    assert not f.request_window_complete  # request window untouched


def test_core_stats_erf_approximation_matches_math_erf() -> None:
    for x in (-3.0, -1.0, -0.2, 0.0, 0.4, 1.5, 4.0):
        assert erf_as(x) == pytest.approx(math.erf(x), abs=2e-7)
    assert normal_cdf(0.0) == pytest.approx(0.5)
    assert normal_cdf(-40.0) == 0.0 and normal_cdf(40.0) == 1.0


def test_core_stats_ttl_utility_worked_example() -> None:
    # mu = 1, sigma = 1, C = 5, d = e (so z = 0):
    # U = 5 * Phi(0) - exp(1.5) * Phi(-1) - e * (1 - Phi(0))
    #   = 2.5 - 4.481689 * 0.158655 - 2.718282 * 0.5 = 2.5 - 0.711043 - 1.359141 = 0.429816
    assert ttl_utility(math.e, 5.0, 1.0, 1.0) == pytest.approx(0.429816, abs=1e-5)
    assert ttl_utility(0.0, 5.0, 1.0, 1.0) == 0.0


def test_core_stats_ttl_candidates_grid() -> None:
    grid = ttl_candidates(5.0)
    assert grid[:3] == [0.0, 0.05, 5.0]
    assert len(grid) == 3 + 32
    assert grid[3] == pytest.approx(0.05) and grid[-1] == pytest.approx(5.0)
    # log spacing: constant ratio (5 / 0.05) ** (1 / 31)
    assert grid[4] / grid[3] == pytest.approx(100 ** (1 / 31))
    assert ttl_candidates(0.01) == [0.0, 0.01, 0.01]  # d_max <= 0.05: no log points


def _ref_phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def test_core_stats_fit_ttl_is_argmax_of_independent_utility() -> None:
    mu, sigma, c = 1.0, 1.0, 5.0
    m = math.exp(mu + sigma**2 / 2)

    def u(d: float) -> float:
        if d == 0:
            return 0.0
        z = (math.log(d) - mu) / sigma
        return c * _ref_phi(z) - m * _ref_phi(z - sigma) - d * (1 - _ref_phi(z))

    grid = [0.0, 0.05, 5.0] + [math.exp(math.log(0.05) + (math.log(5.0) - math.log(0.05)) * k / 31) for k in range(32)]
    best = max(grid, key=u)
    got = fit_ttl(mu, sigma, c, 10.0)
    assert got == pytest.approx(best)
    assert 0.05 <= got <= 5.0  # 0 or within [min(0.05, d_max), d_max]


def test_core_stats_fit_ttl_zero_when_holding_never_pays() -> None:
    # agents come back after ~e^5 = 148 s; a 1 s recompute is never worth holding KV
    assert fit_ttl(5.0, 0.1, 1.0, 10.0) == 0.0
    assert fit_ttl(0.0, 1.0, 0.0, 10.0) == 0.0  # no impact
    assert fit_ttl(0.0, 1.0, 5.0, 0.0) == 0.0  # max_acting_ttl 0


def test_core_stats_fit_ttl_capped_by_max_acting_ttl() -> None:
    # agents come back after ~1 s, recompute costs 100 s: hold as long as allowed
    got = fit_ttl(0.0, 0.5, 100.0, 2.0)
    assert got == pytest.approx(2.0)


def test_core_stats_fitted_ttl_requires_complete_continuity_window() -> None:
    f = ProgressTtlFactors(3)
    f.push_continuity(1.0, 0.0)
    f.push_continuity(math.e**2, 0.0)
    assert f.fitted_acting_ttl(5.0, 10.0) == 0.0  # incomplete window -> 0
    f.push_continuity(0.0, 0.0)  # zero intervals count for maturity but not for the fit
    mu, sigma = f.log_interval_fit()  # type: ignore[misc]
    assert (mu, sigma) == (pytest.approx(1.0), pytest.approx(1.0))
    assert f.fitted_acting_ttl(5.0, 10.0) == pytest.approx(fit_ttl(1.0, 1.0, 5.0, 10.0))


def test_core_stats_running_sums_match_recomputation_after_many_pushes() -> None:
    f = ProgressTtlFactors(7)
    for i in range(53):
        f.push_request(request_sample(prompt=100 + i, cached=i, e2e=0.1 * i, at=float(i)))
        f.push_continuity(0.1 * (i + 1), 0.01 * i)
    prompts = [s.prompt_tokens for s in f.requests]
    assert f.mean_prompt_tokens() == pytest.approx(sum(prompts) / 7)
    lns = [math.log(t) for t, _ in f.continuities]
    mu = sum(lns) / 7
    mu2, sigma = f.log_interval_fit()  # type: ignore[misc]
    assert mu2 == pytest.approx(mu)
    assert sigma == pytest.approx(math.sqrt(sum((x - mu) ** 2 for x in lns) / 7))


def test_core_stats_fit_ttl_survives_extremely_spread_intervals() -> None:
    # Log-intervals of [1.0 s, 2.2e-311 s]: mu = -357.6, sigma = 505.8, so exp(mu + sigma^2/2)
    # overflows a double.  The partial expectation m * Phi(z - sigma) is then evaluated in log
    # space; for a d of 1 s it is exp(127,559 + ln Phi(...)) with Phi's log around -127,5xx.
    lns = [math.log(1.0), math.log(2.2e-311)]
    mu = sum(lns) / 2
    sigma = math.sqrt(sum((x - mu) ** 2 for x in lns) / (len(lns) - 1))
    assert mu + sigma * sigma / 2 > 710  # math.exp would raise OverflowError
    got = fit_ttl(mu, sigma, 1.0, 1.0)
    assert got == 0.0 or 0.05 <= got <= 1.0
    assert math.isfinite(ttl_utility(0.5, 1.0, mu, sigma))
    # Half the mass returns almost at once (the 2.2e-311 s sample): holding pays for c = 1 s.
    assert ttl_utility(1.0, 1.0, mu, sigma) > 0.0


def test_core_stats_ttl_utility_log_space_path_matches_direct_formula() -> None:
    # Where both are representable, the overflow-safe evaluation equals the direct one.
    mu, sigma, c, d = 2.0, 1.5, 4.0, 3.0
    z = (math.log(d) - mu) / sigma
    direct = c * normal_cdf(z) - math.exp(mu + sigma**2 / 2) * normal_cdf(z - sigma) - d * (1 - normal_cdf(z))
    assert ttl_utility(d, c, mu, sigma) == pytest.approx(direct, rel=1e-12)


def test_resume_hit_window_miss_ratio_is_one_until_full_then_token_weighted() -> None:
    from actors.core.stats import ResumeHitWindow

    w = ResumeHitWindow(3)
    assert w.miss_ratio() == 1.0
    w.push(900, 1000)
    w.push(5000, 4000)  # cached is capped at the reusable context
    assert not w.complete and w.miss_ratio() == 1.0  # the reference's assumption until full
    w.push(0, 0)  # nothing reusable: not a sample
    w.push(0, 5000)
    assert w.complete
    assert w.miss_ratio() == pytest.approx(1 - (900 + 4000) / (1000 + 4000 + 5000))
    w.push(1000, 1000)  # the oldest sample leaves the window
    assert w.miss_ratio() == pytest.approx(1 - (4000 + 1000) / (4000 + 5000 + 1000))
    assert len(w.samples) == 3
