"""Queue ETA properties (docs/program-scheduling.md §13).

* the pure model: whatever drain was observed and whatever the prior, an ETA is finite,
  non-negative and non-decreasing in the position (strictly increasing when the drain interval is
  positive and not below the float resolution of the time to the next tick);
* in the scheduler: after any sequence of arrivals, completions, abandons and ticks on two ranks,
  every waiting Program has a finite, non-negative ETA, positions in each rank's line are 1..n in
  admission order and their ETAs never decrease along the line; every remembered first ETA
  belongs to a waiting request.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from actors.core import eta
from actors.core.eta_queue import queue_etas
from actors.core.events import RequestAbandoned, RequestCompleted, RequestSubmitted
from actors.core.ids import RequestId
from actors.core.invariants import check
from actors.core.model import GLOBAL_QUEUE, RANK_QUEUE, RequestHints, Usage
from tests.unit.core_support import Harness, Ident

samples = st.lists(st.one_of(st.floats(0.0, 1e4), st.just(math.nan), st.floats(-5.0, 0.0)), max_size=3 * eta.WINDOW)
priors = st.one_of(st.floats(0.0, 1e6), st.just(math.nan), st.just(math.inf), st.floats(-10.0, 0.0))


@given(samples, priors, st.integers(1, 500), st.floats(0.0, 10.0))
def test_eta_is_finite_non_negative_and_monotone_in_position(
    steps: list[float], prior: float, n: int, to_tick: float
) -> None:
    w = eta.DrainWindow()
    for x in steps:
        w = eta.observe(w, x)
    assert len(w.intervals) <= eta.WINDOW
    d = eta.drain_interval(w, prior)
    assert math.isfinite(d) and d >= 0
    assert all(eta.eta_seconds(k, d, to_tick, blocked=False) == to_tick for k in (1, n))
    etas = [eta.eta_seconds(k, d, to_tick) for k in range(1, n + 1)]
    assert all(math.isfinite(x) and x >= 0 for x in etas)
    assert all(a <= b for a, b in zip(etas, etas[1:], strict=False))
    if d > 1e-9 * max(1.0, to_tick):  # (a d far below to_tick's float resolution adds nothing)
        assert all(a < b for a, b in zip(etas, etas[1:], strict=False))
    assert all(eta.retry_after_seconds(x) >= 1 and eta.retry_after_seconds(x) >= x for x in etas)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 7), st.integers(10, 3000), st.floats(0.0, 20.0)),
        st.tuples(st.just("complete"), st.integers(0, 40), st.integers(10, 3000), st.floats(0.0, 20.0)),
        st.tuples(st.just("abandon"), st.integers(0, 40), st.just(0), st.floats(0.0, 20.0)),
        st.tuples(st.just("tick"), st.just(0), st.just(0), st.floats(0.0, 20.0)),
    ),
    max_size=40,
)


@given(ops, st.booleans(), st.sampled_from(["mru", "fcfs"]))
def test_scheduler_etas_are_finite_and_monotone_along_each_line(
    steps: list[tuple[str, int, int, float]], global_queue: bool, order: str
) -> None:
    h = Harness(
        n_targets=2,
        max_active_programs_per_target=2,
        global_queue=global_queue,
        resume_order=order,
        token_capacity_per_dp_rank=4000,
    )
    submitted: list[str] = []
    now = 0.0
    for op, k, tokens, dt in steps:
        now += dt
        if op == "submit":
            rid = f"q{len(submitted)}"
            program = f"p{k}"
            ident = Ident(program, placement_key=program, placement_hash_key=program)
            h.feed(RequestSubmitted(RequestId(rid), ident, tokens, RequestHints()), at=now)
            submitted.append(rid)
        elif op == "complete" and submitted:
            rid = submitted[k % len(submitted)]
            if RequestId(rid) in h.state.in_flight:
                h.feed(RequestCompleted(RequestId(rid), True, Usage(tokens, 0, 20), 0.5), at=now)
        elif op == "abandon" and submitted:
            rid = submitted[k % len(submitted)]
            if h.state.pool.get(RequestId(rid)) is not None or RequestId(rid) in h.state.in_flight:
                h.feed(RequestAbandoned(RequestId(rid)), at=now)
        elif op == "tick":
            h.tick(at=now)
        keys = [(GLOBAL_QUEUE, n) for n in h.state.global_queues] + [(RANK_QUEUE, str(t)) for t in h.state.rank_queues]
        for key in keys:
            last: dict[object, tuple[int, float]] = {}
            for p, e in queue_etas(h.state, key):
                assert math.isfinite(e.eta_seconds) and e.eta_seconds >= 0
                pos, prev = last.get(p.last_target, (0, 0.0))
                assert e.position == pos + 1
                # a Program expected to move to another rank first may be told less than the one
                # ahead of it in its line (which cannot move); nobody else in the line goes first
                assert e.moved or e.eta_seconds >= prev
                last[p.last_target] = (e.position, prev if e.moved else e.eta_seconds)
        assert check(h.state, h.cfg) == []


departures = st.lists(
    st.builds(
        eta.Departure,
        st.one_of(st.floats(0.0, 100.0), st.just(math.nan), st.just(math.inf), st.floats(-5.0, 0.0)),
        st.one_of(st.floats(0.0, 5000.0), st.just(math.nan)),
        st.booleans(),
        st.booleans(),
    ),
    max_size=12,
)


@given(departures, st.integers(-1, 4), st.floats(-100.0, 8000.0), st.floats(0.0, 1.0), st.floats(0.0, 20.0))
def test_departure_estimate_is_finite_and_later_for_a_larger_need_or_a_lower_release_probability(
    deps: list[eta.Departure], count_over: int, tokens_over: float, q: float, cycle: float
) -> None:
    """The departure term (docs/program-scheduling.md §13): None or a finite time >= 0, never
    before the first departure that is not a TTL pause (TTL pauses alone are the release term); a
    line that needs more waits no less, and a lower release probability never makes it sooner."""
    at = eta.departure_in(deps, count_over, tokens_over, q, cycle)
    if at is None:
        return
    assert math.isfinite(at) and at >= 0
    starts = [
        max(0.0, d.at) for d in deps if not (d.certain and d.acting) and math.isfinite(d.at) and math.isfinite(d.tokens)
    ]
    assert starts and at >= min(starts)
    more = eta.departure_in(deps, count_over, tokens_over + 100.0, q, cycle)
    assert more is None or more >= at
    lower = eta.departure_in(deps, count_over, tokens_over, q / 2, cycle)
    assert lower is None or lower >= at
