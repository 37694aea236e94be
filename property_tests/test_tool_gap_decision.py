"""The per-tool ski-rental TTL computed on the kept-sorted window and its prepared candidates is
exactly the from-scratch decision (docs/program-scheduling.md §12), for any gaps, windows and costs.

``reference_best_ttl`` is the decision as it was computed before the window was kept sorted: sort
the window, sum it, evaluate every candidate in order and keep the first strictly best one.  The
incremental :meth:`GapWindow.best_ttl` (and ``ToolGapModel.decide`` around it) must give the same
float, bit for bit, after any sequence of pushes and decisions.
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_right

from hypothesis import example, given
from hypothesis import strategies as st

from actors.core.config import ToolRetentionConfig
from actors.core.tool_retention import GapWindow, ToolGapModel, best_ttl_scan


def reference_best_ttl(
    window: list[float], c: float, d_max: float, margin_ratio: float, margin_seconds: float, rent: float
) -> float:
    """The decision from scratch (the code before the incremental window, verbatim in its arithmetic)."""
    if c <= 0 or d_max <= 0:
        return 0.0
    gaps = sorted(window)
    n = len(gaps)
    if n == 0:
        return 0.0
    prefix = [0.0]
    total = 0.0
    for g in gaps:
        total += g
        prefix.append(total)

    def utility(d: float) -> float:
        if d <= 0:
            return 0.0
        k = bisect_right(gaps, d)
        return (c * k - rent * (prefix[k] + d * (n - k))) / n

    best_d, best_u = 0.0, 0.0
    seen: set[float] = set()
    for g in gaps:
        if g > d_max:
            break
        d = min(d_max, g * (1.0 + margin_ratio) + margin_seconds)
        if d in seen:
            continue
        seen.add(d)
        if d <= 0:
            continue
        k = bisect_right(gaps, d)
        u = (c * k - rent * (prefix[k] + d * (n - k))) / n
        if u > best_u:
            best_d, best_u = d, u
    if d_max not in seen:
        u = utility(d_max)
        if u > best_u:
            best_d, best_u = d_max, u
    return best_d


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


# gaps: a coarse grid (ties, equal candidates, zeros) mixed with arbitrary non-negative floats
_grid = st.sampled_from([0.0, -0.0, 0.001, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 60.0])
_any_gap = st.floats(min_value=0.0, max_value=1e308, allow_nan=False)
gap = st.one_of(_grid, st.floats(min_value=0.0, max_value=120.0, allow_nan=False), _any_gap)
# pushes the window ignores (not finite, negative) are part of the sequences too
push_value = st.one_of(gap, gap, gap, st.sampled_from([-1.0, math.inf, math.nan]))
cost = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]),
    st.floats(min_value=-10.0, max_value=200.0, allow_nan=False),
    st.floats(allow_nan=True, allow_infinity=True),
)
margin = st.one_of(
    st.sampled_from([0.0, 0.1, 0.02, 1.0]),
    st.floats(min_value=0.0, max_value=10.0),
    st.floats(allow_nan=False, allow_infinity=False),
)
rent = st.one_of(st.sampled_from([1.0, 1.5, 2.0, 0.0]), st.floats(min_value=-2.0, max_value=50.0), st.floats())


@given(
    limit=st.integers(min_value=1, max_value=80),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("push"), push_value),
            st.tuples(st.just("decide"), st.tuples(cost, cost, margin, margin, rent)),
        ),
        max_size=160,
    ),
)
# exact ties between candidates with different held counts: the shorter TTL must win
@example(limit=8, ops=[*(("push", g) for g in (0.5, 1.0, 4.0, 6.0, 8.0)), ("decide", (5.0, 20.0, 0.0, 0.0, 1.0))])
@example(limit=8, ops=[*(("push", g) for g in (8.0, 0.5, 6.0, 1.0, 0.5, 2.0)), ("decide", (3.0, 5.0, 0.0, 0.0, 1.0))])
@example(limit=2, ops=[*(("push", g) for g in (9.0, 4.0, 1.0)), ("decide", (3.0, 20.0, 0.0, 0.0, 1.0))])
def test_incremental_window_decides_as_from_scratch(limit: int, ops: list[tuple[str, object]]) -> None:
    w = GapWindow(limit)
    for kind, arg in ops:
        if kind == "push":
            assert isinstance(arg, float)
            w.push(arg)
            expected = sorted(w.gaps)
            assert [bits(x) for x in w.sorted_gaps()] == [bits(x) for x in expected]
            for q in (0.5, 0.9, 0.99):
                got = w.quantile(q)
                ref = expected[min(len(expected) - 1, max(0, math.ceil(q * len(expected)) - 1))] if expected else None
                assert (got is None and ref is None) or (got is not None and ref is not None and bits(got) == bits(ref))
            continue
        assert isinstance(arg, tuple)
        c, d_max, mr, ms, r = arg
        ref = reference_best_ttl(list(w.gaps), c, d_max, mr, ms, r)
        got = w.best_ttl(c, d_max, mr, ms, r)
        assert bits(got) == bits(ref) or (math.isnan(got) and math.isnan(ref)), (c, d_max, mr, ms, r, list(w.gaps))
        scan = best_ttl_scan(list(w.sorted_gaps()), c, d_max, mr, ms, r)
        assert bits(scan) == bits(ref) or (math.isnan(scan) and math.isnan(ref))


@given(
    gaps=st.lists(gap, min_size=1, max_size=64),
    c=st.floats(min_value=0.001, max_value=100.0),
    max_ttl=st.floats(min_value=0.0, max_value=600.0),
    rent=st.floats(min_value=0.0, max_value=40.0),
    margin_ratio=st.floats(min_value=0.0, max_value=1.0),
    margin_seconds=st.floats(min_value=0.0, max_value=1.0),
)
def test_decide_uses_the_from_scratch_ttl(
    gaps: list[float], c: float, max_ttl: float, rent: float, margin_ratio: float, margin_seconds: float
) -> None:
    """Through ``ToolGapModel.decide`` (the daemon's call: ``d_max = min(max_ttl, c / rent)``,
    rent at least 1, windows of the configured size), the armed TTL is the reference's."""
    cfg = ToolRetentionConfig(window_size=16, min_samples=1, margin_ratio=margin_ratio, margin_seconds=margin_seconds)
    model = ToolGapModel(cfg)
    for i, g in enumerate(gaps):
        model.observe("pool", ("tool",), g)
        decision = model.decide("pool", ("tool",), c, max_ttl, rent)
        window = [x for x in gaps[: i + 1] if math.isfinite(x) and x >= 0][-16:]
        r = max(1.0, rent)
        ref = reference_best_ttl(window, c, min(max_ttl, c / r), margin_ratio, margin_seconds, r)
        assert decision is not None
        assert bits(decision.ttl_seconds) == bits(ref)


@given(
    gaps=st.lists(st.one_of(_grid, st.floats(min_value=0.0, max_value=30.0)), min_size=1, max_size=64),
    queries=st.lists(
        st.tuples(st.floats(min_value=0.01, max_value=40.0), st.floats(min_value=0.01, max_value=40.0), rent),
        min_size=2,
        max_size=8,
    ),
)
# a short d_max prepares a few candidates; the next, longer one must extend them
@example(gaps=[1.0, 2.0, 3.0, 4.0], queries=[(10.0, 1.5, 1.0), (10.0, 10.0, 1.0)])
def test_decisions_on_one_window_version_in_any_order(
    gaps: list[float], queries: list[tuple[float, float, float]]
) -> None:
    """Several decisions between two pushes (candidates prepared for one d_max, then reused or
    extended for another) each give the from-scratch TTL."""
    w = GapWindow(64)
    for g in gaps:
        w.push(g)
    for c, d_max, r in queries:
        ref = reference_best_ttl(list(w.gaps), c, d_max, 0.1, 0.02, r)
        assert bits(w.best_ttl(c, d_max, 0.1, 0.02, r)) == bits(ref)
