"""Edges of the queue ETA (actors/core/eta.py, actors/core/eta_queue.py, docs/program-scheduling.md
§13) that the mutation campaign found untested: the guards of the pure model and its bounds."""

from __future__ import annotations

import math

from actors.core import effects as fx
from actors.core import eta
from actors.core.eta import DEFAULT_PRIOR_INTERVAL, LINE, MAX_ETA_SECONDS, Departure, DrainWindow, EtaBook, FirstEta
from actors.core.eta_queue import first_tick_after, line_interval, prior_interval
from actors.core.ids import RequestId
from tests.unit.core_support import Harness, request_sample, tid
from tests.unit.test_core_eta import bounded


def test_a_drain_window_keeps_the_last_32_samples() -> None:
    """docs/program-scheduling.md §13: each window keeps its last 32 samples."""
    w = DrainWindow()
    for x in range(40):
        w = eta.observe(w, float(x))
    assert w.intervals == tuple(float(x) for x in range(8, 40)) and w.observed == 40


def test_a_drain_sample_must_be_finite_and_may_be_zero() -> None:
    """An infinite sample is ignored; a sample of 0 (admitted at the tick it was told) is kept."""
    w = DrainWindow()
    assert eta.observe(w, math.inf) == w
    assert eta.observe(w, 0.0) == DrainWindow(intervals=(0.0,), observed=1)


def test_a_prior_is_used_when_finite_and_positive() -> None:
    """A prior below one second is kept; an infinite one falls back to the default."""
    assert eta.drain_interval(DrainWindow(), 0.5) == 0.5
    assert eta.drain_interval(DrainWindow(), math.inf) == DEFAULT_PRIOR_INTERVAL


def test_eta_seconds_guards_and_bounds() -> None:
    """An ETA is finite, at most MAX_ETA_SECONDS, never negative, and may be 0."""
    assert eta.eta_seconds(1, 5.0, 0.0, blocked=False) == 0.0  # a line that fits at a tick now
    assert eta.eta_seconds(1, math.nan) == MAX_ETA_SECONDS
    assert eta.eta_seconds(1, 2e9) == MAX_ETA_SECONDS
    assert eta.eta_seconds(1, 1.0, to_tick=-0.5) == 1.0  # a negative time to the tick counts as 0
    assert eta.eta_seconds(2, 5.0, 0.5, departure_in=0.25) == 0.25
    assert eta.eta_seconds(2, 5.0, 0.5, departure_in=-1.0) == 0.0


def test_a_release_due_now_or_within_a_second_sets_the_eta() -> None:
    """release_in counts from 0 s on when sooner than the drain estimate."""
    assert eta.eta_seconds(1, 5.0, 0.5, release_in=0.0) == 0.0
    assert eta.eta_seconds(1, 5.0, 0.5, release_in=0.5) == 0.5
    assert eta.eta_seconds(1, 5.0, 0.5, release_in=-1.0) == 5.5  # a negative release is no release


def test_departures_look_ahead_16_completions_per_held_program() -> None:
    """docs/program-scheduling.md §13: a held Program's completions are looked ahead at most 16 times: at q = 0.04 the
    line is still blocked with probability 0.96^16 > 1/2 after them (the 17th would reach 1/2)."""
    assert eta.departure_in([Departure(0.0, 500.0)], 1, 0.0, 0.04, 1.0) is None
    # at q = 0.05 the 14th completion (k = 13) brings it to 0.95^14 <= 1/2
    assert eta.departure_in([Departure(0.0, 500.0)], 1, 0.0, 0.05, 1.0) == 13.0


def test_mean_residual_counts_only_samples_longer_than_the_elapsed_time() -> None:
    """mean(x - elapsed) over x > elapsed: a sample equal to the elapsed time is not counted."""
    assert eta.mean_residual([1.0, 3.0], 1.0) == 2.0


def test_departure_in_edges_of_the_release_probability_and_cycle() -> None:
    """q not finite counts as 0; a cycle that is not a positive finite number looks at one completion
    only; a median of exactly 1/2 is reached."""
    one = [Departure(2.0, 500.0)]
    assert eta.departure_in(one, 1, 0.0, math.nan, 3.0) is None
    assert eta.departure_in(one, 1, 0.0, 0.5, 3.0) == 2.0  # blocked 0.5 <= 1/2 at the first completion
    assert eta.departure_in(one, 1, 0.0, 0.3, 0.5) == 2.5  # 0.7, then 0.49 one cycle later
    for cycle in (0.0, -1.0, math.inf, math.nan):
        assert eta.departure_in(one, 1, 0.0, 0.3, cycle) is None  # 0.7 after the one completion
        assert eta.departure_in(one, 1, 0.0, 0.6, cycle) == 2.0  # (was NaN for an infinite or NaN cycle)


def test_departure_in_boundaries_of_what_frees_the_line() -> None:
    """Departures free what the line is over by when they reach it exactly (Programs and tokens);
    a completion counts only when its Program is enough to leave; a departure in the past counts now."""
    certain = Departure(1.0, 500.0, certain=True)
    assert eta.departure_in([certain], 1, 500.0, 0.0, 1.0) == 1.0
    assert eta.departure_in([Departure(1.0, 499.5, certain=True)], 1, 500.0, 0.0, 1.0) is None
    assert eta.departure_in([Departure(0.5, 100.0, certain=True)], 1, 0.0, 0.0, 1.0) == 0.5
    assert eta.departure_in([Departure(-1.0, 100.0, certain=True)], 1, 0.0, 0.0, 1.0) == 0.0
    completion = [Departure(1.0, 500.0)]
    assert eta.departure_in(completion, 1, 500.0, 0.6, 10.0) == 1.0
    assert eta.departure_in(completion, 2, 0.0, 0.6, 10.0) is None  # two Programs must leave


def test_completion_interval_under_load_is_the_mean_gap_not_the_service_time() -> None:
    """The mean gap between completions under load (dispatched before the previous one finished),
    however long the service times; non-finite samples are skipped, negative service is 0."""
    # gaps under load: 3.0 - 2.0 and 4.5 - 3.0; the last one was dispatched after 4.5 (idle engine)
    samples = [(2.0, 2.0), (3.0, 2.5), (4.5, 2.0), (9.0, 1.5)]
    assert eta.completion_interval(samples, running=1) == 1.25
    assert eta.completion_interval([(2.0, 2.0), (2.0, 1.5)], running=1) == 0.0  # at the same time
    assert eta.completion_interval([(2.0, 2.0), (math.nan, 5.0), (3.0, 2.5)], running=1) == 1.0
    assert eta.completion_interval([(2.0, 2.0), (2.5, math.inf), (3.0, 2.5)], running=1) == 1.0
    assert eta.completion_interval([(2.0, -1.0)], running=1) == 0.0


def test_gate_open_in_needs_a_finite_non_negative_interval() -> None:
    """An engine that completes at once opens the gate now; an unknown interval predicts nothing."""
    assert eta.gate_open_in(3, 1, 0.0, since_completion=0.5) == 0.0
    for bad in (math.nan, math.inf, -1.0):
        assert eta.gate_open_in(3, 1, bad, since_completion=0.5) is None


def test_retry_after_is_at_least_one_second() -> None:
    """Retry-After of an ETA of 0 (or a non-finite one) is 1 s (MAX_ETA_SECONDS)."""
    assert eta.retry_after_seconds(0.0) == 1.0
    assert eta.retry_after_seconds(math.inf) == MAX_ETA_SECONDS


def test_only_a_blocked_first_eta_of_a_known_line_gives_a_drain_sample() -> None:
    """A line that fitted, or a request without a line, gives no drain sample; a wait shorter than
    the time to the tick gives the sample 0."""
    book = EtaBook()
    book.first[RequestId("fits")] = FirstEta(eta_seconds=0.5, queued_at=0.0, line="t0", to_tick_seconds=0.5)
    book.first[RequestId("noline")] = FirstEta(eta_seconds=5.0, queued_at=0.0, blocked=True)
    assert book.admitted(RequestId("fits"), 1.0) is not None
    assert book.admitted(RequestId("noline"), 1.0) is not None
    assert book.windows == {}
    book.first[RequestId("early")] = FirstEta(
        eta_seconds=5.0, queued_at=0.0, line="t0", to_tick_seconds=0.5, blocked=True
    )
    book.first[RequestId("late")] = FirstEta(
        eta_seconds=5.0, queued_at=0.0, line="t0", to_tick_seconds=0.5, blocked=True
    )
    book.admitted(RequestId("early"), 0.25)
    book.admitted(RequestId("late"), 1.0)
    assert book.windows[(LINE, "t0")].intervals == (0.0, 0.5)


def test_median_and_quantile_of_nothing_and_of_four() -> None:
    """No errors: no median; the nearest-rank 0.5 quantile of four values is the second."""
    assert EtaBook().median_error() is None
    assert eta.quantile([], 0.9) is None
    assert eta.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0


def test_the_accuracy_window_keeps_the_last_4096_errors() -> None:
    """docs/program-scheduling.md §13 diagnostics: the median is over the last 4096 samples; every sample is counted."""
    book = EtaBook()
    for i in range(4100):
        rid = RequestId(f"r{i}")
        book.first[rid] = FirstEta(eta_seconds=1.0 if i < 4 else 2.0, queued_at=0.0)
        book.admitted(rid, 1.0)
    assert (book.samples, len(book.errors), book.median_error()) == (4100, 4096, 1.0)


def test_the_prior_is_rounds_over_throughput_once_the_request_window_is_full() -> None:
    """docs/program-scheduling.md §13: prior = max(1, R) / throughput (R = ceil(2 x mean rounds));
    5 s until the window is full."""
    for rounds, window, expected in ((3, 2, 6 / 0.25), (0, 2, 1 / 0.25), (3, 3, DEFAULT_PRIOR_INTERVAL)):
        h = Harness(stats_window_size=window)
        for at in (1.0, 5.0):  # two completions 4 s apart: 0.25 requests per second
            h.rank(0).factors.push_request(request_sample(e2e=2.0, at=at, rounds=rounds))
        assert prior_interval(h.state, tid(0)) == expected
        assert line_interval(h.state, tid(0)) == expected  # no drain sample yet: the prior


def test_a_bound_below_the_eta_refuses_at_once() -> None:
    """x-agentd-max-queue-seconds: a request whose ETA (11 s) exceeds its bound (10.9 s) is refused
    with Retry-After from the ETA, and never waits."""
    h = Harness(max_active_programs_per_target=1)
    h.submit("x")
    h.submit("a", at=1.0)  # position 1, ETA 6
    eff = h.feed(bounded("rb", "b", 10.9), at=2.0)  # position 2: 1 + 2 x 5 = 11 s
    (rej,) = [e for e in eff if isinstance(e, fx.Reject)]
    assert (rej.request_id, rej.reason, rej.retry_after_seconds) == ("rb", "queue_wait_exceeds_bound", 11.0)
    assert h.program("b") is None and h.state.eta.bound_rejections == 1


def test_first_tick_after_counts_whole_intervals_from_the_next_tick() -> None:
    """With ticks every 2 s and the next in 0.5 s: a wait of 3 s ends at the tick in 4.5 s, one
    already due by the next tick at that tick."""
    h = Harness(metrics_interval_seconds=2.0)
    assert first_tick_after(h.state, 0.5, 3.0) == 4.5
    assert first_tick_after(h.state, 0.5, 2.5) == 2.5
    assert first_tick_after(h.state, 0.5, 0.2) == 0.5
