"""Queue ETA (docs/program-scheduling.md §13): the pure model and its hooks in the scheduler."""

from __future__ import annotations

import math

import pytest

from actors.core import effects as fx
from actors.core import eta, eta_queue
from actors.core.config import PrefillCostModel
from actors.core.eta import DEFAULT_PRIOR_INTERVAL, LINE, WINDOW, DrainWindow, EtaBook, FirstEta
from actors.core.eta_queue import QUEUE_WAIT_EXCEEDS_BOUND, diagnostics, prior_interval
from actors.core.events import QUEUE_TIMEOUT, RequestSubmitted
from actors.core.ids import RequestId
from actors.core.invariants import check
from actors.core.model import GLOBAL_QUEUE, RequestHints
from tests.unit.core_support import Harness, Ident, admitted, request_sample, tid


def told(effects: tuple[object, ...]) -> list[tuple[str, int, float, bool]]:
    return [
        (e.request_id, e.position, round(e.eta_seconds, 9), e.first) for e in effects if isinstance(e, fx.QueueEtaTold)
    ]


def observed(effects: tuple[object, ...]) -> list[tuple[float, float, float]]:
    return [(e.eta_seconds, e.wait_seconds, e.relative_error) for e in effects if isinstance(e, fx.QueueEtaObserved)]


# ---- the pure model ------------------------------------------------------------------------------


def test_drain_interval_is_the_window_mean_shrunk_to_the_prior() -> None:
    w = DrainWindow()
    assert eta.drain_interval(w, 5.0) == 5.0  # no sample: the prior
    w = eta.observe(eta.observe(w, 3.0), 6.0)
    assert w.intervals == (3.0, 6.0) and w.observed == 2
    assert eta.drain_interval(w, 5.0) == (3.0 + 6.0 + 2 * 5.0) / 4  # 4.75
    assert eta.observe(w, -1.0) == w and eta.observe(w, math.nan) == w  # ignored


def test_drain_window_is_bounded() -> None:
    w = DrainWindow()
    for _ in range(WINDOW + 10):
        w = eta.observe(w, 1.0)
    assert len(w.intervals) == WINDOW and w.observed == WINDOW + 10
    assert eta.drain_interval(w, 100.0) == pytest.approx((WINDOW * 1.0 + 2 * 100.0) / (WINDOW + 2))


def test_a_bad_prior_falls_back_to_the_default() -> None:
    assert eta.drain_interval(DrainWindow(), math.nan) == DEFAULT_PRIOR_INTERVAL
    assert eta.drain_interval(DrainWindow(), 0.0) == DEFAULT_PRIOR_INTERVAL


def test_eta_is_position_times_interval_and_retry_after_rounds_up() -> None:
    assert eta.eta_seconds(3, 1.5) == 4.5
    assert eta.eta_seconds(3, 1.5, to_tick=0.25) == 4.75
    assert eta.eta_seconds(3, 1.5, to_tick=0.25, blocked=False) == 0.25
    assert eta.eta_seconds(1, math.inf) == eta.MAX_ETA_SECONDS
    with pytest.raises(ValueError, match="position must be >= 1"):
        eta.eta_seconds(0, 1.0)
    assert [eta.retry_after_seconds(x) for x in (0.2, 1.0, 4.2, 7.0)] == [1.0, 1.0, 5.0, 7.0]


def test_book_compares_the_first_eta_with_the_actual_wait() -> None:
    book = EtaBook()
    first = FirstEta(eta_seconds=5.0, queued_at=1.0, line="t0", position=2, to_tick_seconds=0.5, blocked=True)
    book.first[RequestId("r1")] = first
    book.first[RequestId("r2")] = FirstEta(eta_seconds=2.0, queued_at=3.0)
    assert book.admitted(RequestId("r1"), 5.0) == (first, 4.0, 0.25)
    assert book.windows[(LINE, "t0")].intervals == ((4.0 - 0.5) / 2,)  # a blocked ETA: a drain sample
    assert book.admitted(RequestId("r1"), 6.0) is None  # once
    assert book.admitted(RequestId("r2"), 3.0) is None  # did not wait: no sample
    assert book.admitted(RequestId("r9"), 3.0) is None  # never told
    assert (book.samples, list(book.errors), book.median_error()) == (1, [0.25], 0.25)
    assert eta.median([3.0, 1.0, 2.0, 10.0]) == 2.5 and eta.quantile([1.0, 2.0, 3.0, 4.0], 0.9) == 4.0


def bounded(rid: str, program: str, bound: float) -> RequestSubmitted:
    ident = Ident(program, placement_key=program, placement_hash_key=program)
    return RequestSubmitted(RequestId(rid), ident, 100, RequestHints(), max_queue_seconds=bound)


# ---- in the scheduler ---------------------------------------------------------------------------


def test_queued_request_is_told_its_position_and_eta_and_accuracy_is_recorded() -> None:
    h = Harness(max_active_programs_per_target=1)  # metrics_interval_seconds = 1
    h.submit("x")  # r1 admitted: the rank's one slot
    # blocked (the slot is taken): one interval to the first tick + 1 position x 5 s (the prior)
    assert told(h.submit("a", at=1.0)) == [("r2", 1, 6.0, True)]
    assert told(h.submit("b", at=2.0)) == [("r3", 2, 11.0, True)]
    assert told(h.tick(at=3.0)) == [("r2", 1, 6.0, False), ("r3", 2, 11.0, False)]
    assert told(h.submit("c", at=3.25)) == [("r4", 3, 0.75 + 15.0, True)]  # the next tick is at 4
    h.abandon("r4", at=3.5)
    eff = h.complete("r1", at=4.0, prompt=100)  # x leaves the slot: a is admitted after 3 s
    assert observed(eff) == [(6.0, 3.0, 1.0)]
    # a's sample: (3 s - 1 s to the tick) / position 1 = 2 s; pooled d = (2 + 2 x 5) / 3 = 4,
    # the line's d = (2 + 1 x 4) / 2 = 3
    assert h.state.eta.windows[(LINE, tid(0))].intervals == (2.0,)
    # at the tick of 5.0 the rank has seen one request (4 s of service) and one TTL pause (x,
    # after 1 round: release probability 1): a, running for 1 s, is expected to end and leave in
    # 4 - 1 = 3 s, which replaces the drain estimate 1 + 3 (docs/program-scheduling.md §13)
    assert told(h.tick(at=5.0)) == [("r3", 1, 3.0, False)]
    eff = h.complete("r2", at=10.0, prompt=100)  # b admitted after 8 s; its first ETA was 11
    assert observed(eff) == [(11.0, 8.0, 0.375)]
    assert h.state.eta.windows[(LINE, tid(0))].intervals == (2.0, 3.5)  # (8 - 1) / 2
    doc = diagnostics(h.state)
    assert doc["samples_count"] == 2 and doc["median_relative_error"] == pytest.approx((1.0 + 0.375) / 2)
    assert doc["told_waiting_count"] == 0
    assert check(h.state, h.cfg) == []


def test_a_line_that_fits_now_waits_for_the_next_tick_only() -> None:
    # capacity 1000, 600 used; a needs 300 (200 + decode buffer 100) and fits, but the waiting
    # gate (engine waiting >= 1) holds it back until a pass re-checks
    h = Harness(token_capacity_per_dp_rank=1000, decode_buffer_tokens=100, admission_waiting_request_threshold=1)
    h.tick(at=0.0)  # the tick grid: 0, 1, 2, ...
    h.submit("x", tokens=500)
    # 600 tokens used; the gate is closed, at one scrape, by no more requests than the engine runs
    # (not counted as lasting: docs/program-scheduling.md §13, "The waiting gate")
    h.observe(0, kv=0.6, running=1, waiting=1, at=0.5)
    assert told(h.submit("a", tokens=200, at=0.75)) == [("r2", 1, 0.25, True)]  # to the first tick at 1
    assert told(h.submit("b", tokens=400, at=0.8)) == [("r3", 2, 0.2 + 2 * 5.0, True)]  # 600 + 300 + 500 > 1000


def test_request_admitted_in_its_arrival_step_is_told_nothing() -> None:
    h = Harness(max_active_programs_per_target=2)
    assert told(h.submit("x")) == [] and told(h.submit("y", at=1.0)) == []
    assert h.state.eta.first == {}


def test_bound_refuses_at_once_when_the_eta_exceeds_it() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("x")
    h.submit("a", at=1.0)  # position 1, eta 5
    ev = RequestSubmitted(
        RequestId("rb"),
        Ident("b", placement_key="b", placement_hash_key="b"),
        100,
        RequestHints(),
        max_queue_seconds=0.0,
    )
    eff = h.feed(ev, at=2.0)
    (rej,) = [e for e in eff if isinstance(e, fx.Reject)]
    assert (rej.request_id, rej.reason, rej.status_hint, rej.retry_after_seconds) == (
        "rb",
        QUEUE_WAIT_EXCEEDS_BOUND,
        429,
        11.0,
    )
    assert "expected queue wait 11.0s (position 2)" in rej.message and "x-agentd-max-queue-seconds=0" in rej.message
    assert told(eff) == [] and h.state.pool.get(RequestId("rb")) is None and h.program("b") is None
    assert h.state.eta.bound_rejections == 1
    # a bound the ETA meets: queued normally
    ev = RequestSubmitted(
        RequestId("rc"),
        Ident("c", placement_key="c", placement_hash_key="c"),
        100,
        RequestHints(),
        max_queue_seconds=11.0,
    )
    assert told(h.feed(ev, at=2.0)) == [("rc", 2, 11.0, True)]
    assert check(h.state, h.cfg) == []


def test_bound_does_not_apply_when_the_request_is_admitted_at_once() -> None:
    h = Harness(max_active_programs_per_target=1)
    ev = RequestSubmitted(
        RequestId("r1"),
        Ident("x", placement_key="x", placement_hash_key="x"),
        100,
        RequestHints(),
        max_queue_seconds=0.0,
    )
    eff = h.feed(ev, at=0.0)
    assert [e.request_id for e in eff if isinstance(e, fx.Admit)] == ["r1"]


def test_invalid_bound_is_an_invalid_event() -> None:
    h = Harness()
    ev = RequestSubmitted(
        RequestId("r1"), Ident("x", placement_key="x", placement_hash_key="x"), 100, max_queue_seconds=-1.0
    )
    with pytest.raises(Exception, match="max_queue_seconds must be finite and >= 0"):
        h.feed(ev)


def test_queue_timeout_429_carries_retry_after_from_the_eta() -> None:
    h = Harness(max_active_programs_per_target=1, queue_timeout_seconds=50.0, force_resume_timeout_seconds=50.0)
    h.submit("a")
    h.observe(0, kv=0.1, running=1, waiting=3, at=0.0)  # gate closed
    h.submit("b", at=1.0)
    h.submit("c", at=2.0)
    qt = [e for e in h.log if isinstance(e, fx.ArmTimer) and e.kind == QUEUE_TIMEOUT]
    h.observe(0, kv=0.1, running=1, waiting=3, at=49.0, epoch=2)
    eff = h.fire(qt[0].program, QUEUE_TIMEOUT, qt[0].token, at=51.0)
    (rej,) = [e for e in eff if isinstance(e, fx.Reject)]
    # b is first in line and blocked: 1 s to the first tick + 1 x 5 s prior -> Retry-After 6
    assert (rej.request_id, rej.reason, rej.retry_after_seconds) == ("r2", "queue_timeout", 6.0)


def test_prior_is_the_default_until_the_rank_knows_its_throughput() -> None:
    h = Harness()
    assert prior_interval(h.state, tid(0)) == DEFAULT_PRIOR_INTERVAL
    assert prior_interval(h.state, tid(7)) == DEFAULT_PRIOR_INTERVAL  # unknown rank


def test_an_acting_programs_ttl_pause_that_frees_the_slot_sets_the_eta_when_sooner() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.tick(at=0.0)
    h.submit("x", hints=RequestHints(kv_retention_ttl_seconds=30.0))
    h.complete("r1", at=0.5, prompt=100)  # x acts, holding the slot until 30.5
    # blocked: 0.5 s to the tick + 5 s is sooner than x's TTL pause in 30 s
    assert told(h.submit("a", at=0.5)) == [("r2", 1, 5.5, True)]
    assert h.program("x").ttl_deadline == 30.5
    h.abandon("r2", at=0.6)
    h2 = Harness(max_active_programs_per_target=1)
    h2.tick(at=0.0)
    h2.submit("x", hints=RequestHints(kv_retention_ttl_seconds=2.0))
    h2.complete("r1", at=0.5, prompt=100)  # x acts until 2.5, then its pause frees the slot
    assert told(h2.submit("a", at=0.75)) == [("r2", 1, 1.75, True)]  # sooner than 0.25 + 5
    eff = h2.tick(at=2.5)  # the TTL fires first (timers due at 2.5), then the tick
    assert observed(eff) == [(1.75, 1.75, 0.0)]


# ---- departures: completions that free the rank (docs/program-scheduling.md §13) ------------------


def test_mean_residual_is_the_mean_overshoot_of_the_longer_samples() -> None:
    assert eta.mean_residual([1.0, 2.0, 4.0, 6.0], 1.5) == pytest.approx(((2 - 1.5) + (4 - 1.5) + (6 - 1.5)) / 3)
    assert eta.mean_residual([1.0, 2.0], 0.0) == 1.5
    assert eta.mean_residual([1.0, 2.0], 3.0) == 0.0  # outlived every sample: due now
    assert eta.mean_residual([], 1.0) is None


def test_departure_in_is_the_median_time_the_line_fits() -> None:
    dep = eta.Departure
    # one slot over: a completion in 2 s that releases with probability 1 frees it then
    assert eta.departure_in([dep(2.0, 500.0)], 1, 0.0, 1.0, 3.0) == 2.0
    # with probability 0.3 per completion, blocked 0.7 after 2 s, 0.49 after 5 s (one cycle later)
    assert eta.departure_in([dep(2.0, 500.0)], 1, 0.0, 0.3, 3.0) == 5.0
    # two Programs ending at 1 and 4 s, each leaving with probability 0.4: 0.6, then 0.36
    assert eta.departure_in([dep(1.0, 500.0), dep(4.0, 500.0)], 1, 0.0, 0.4, 10.0) == 4.0
    # a completion that frees too few tokens alone counts only after a certain pause adds to it
    line = [dep(1.0, 100.0), dep(3.0, 300.0, certain=True, acting=True), dep(5.0, 100.0)]
    assert eta.departure_in(line, 1, 350.0, 0.9, 10.0) == 5.0  # 300 + 100 >= 350 at the completion of 5 s
    assert eta.departure_in(line, 1, 250.0, 0.9, 10.0) is None  # the TTL pause alone: the release term
    assert eta.departure_in(line, 2, 350.0, 0.9, 10.0) == 5.0  # two Programs must leave
    # a completion that always releases is a certain departure: it adds up with the pause at 3 s
    assert eta.departure_in(line, 1, 350.0, 1.0, 10.0) == 3.0  # 100 + 300
    assert eta.departure_in(line, 2, 350.0, 1.0, 10.0) == 3.0
    assert eta.departure_in(line, 1, 50.0, 1.0, 10.0) == 1.0
    # a busy Program marked to pause when idle leaves at the end of its request for sure
    marked = [dep(0.5, 300.0, certain=True, acting=True), dep(2.0, 300.0, certain=True)]
    assert eta.departure_in(marked, 1, 250.0, 0.5, 10.0) is None  # the TTL pause suffices first
    assert eta.departure_in(marked, 1, 500.0, 0.0, 10.0) == 2.0  # both, the second one not a TTL
    assert eta.departure_in(line, 1, 1000.0, 1.0, 10.0) is None  # never enough
    assert eta.departure_in([dep(1.0, 500.0)], 1, 0.0, 0.0, 3.0) is None  # completions never release
    assert eta.departure_in([dep(math.nan, 500.0), dep(1.0, math.inf)], 1, 0.0, 1.0, 3.0) is None
    # the look-ahead is bounded: at most MAX_CYCLES completions per held Program
    assert eta.departure_in([dep(0.0, 500.0)], 1, 0.0, 0.01, 1.0) is None


def test_eta_uses_the_departure_estimate_for_a_blocked_line() -> None:
    assert eta.eta_seconds(2, 5.0, 0.5, blocked=True, departure_in=1.25) == 1.25
    assert eta.eta_seconds(2, 5.0, 0.5, blocked=True, departure_in=1.25, release_in=1.0) == 1.0
    assert eta.eta_seconds(2, 5.0, 0.5, blocked=False, departure_in=1.25) == 0.5  # fits: the tick
    assert eta.eta_seconds(2, 5.0, 0.5, blocked=True, departure_in=math.inf) == 10.5


def test_a_queued_program_is_told_when_the_running_ones_are_expected_to_leave() -> None:
    # one slot per rank; x's first request takes 4 s and x pauses after it (TTL 0): the rank has
    # seen a service time of 4 s and one TTL pause after 1 round (release probability 1)
    h = Harness(max_active_programs_per_target=1)
    h.tick(at=0.0)
    h.submit("x", hints=RequestHints(kv_retention_ttl_seconds=0.0))
    h.complete("r1", at=4.0, prompt=100)
    assert h.program("x").state == "paused"
    h.submit("y", at=4.0)  # r2: y takes the slot
    # z arrives 1.5 s into y's request: y is expected to end in 4 - 1.5 = 2.5 s and leave then
    assert told(h.submit("z", at=5.5)) == [("r3", 1, 2.5, True)]
    # a second waiter needs two Programs to leave and only y may: the drain estimate, 0.25 s to
    # the tick + 2 positions x the 5 s prior
    assert told(h.submit("w", at=5.75)) == [("r4", 2, 0.25 + 2 * 5.0, True)]
    eff = h.complete("r2", at=8.0, prompt=100)  # y ends at 8.0 and its slot goes to z: exact
    assert observed(eff) == [(2.5, 2.5, 0.0)]
    assert check(h.state, h.cfg) == []


def test_a_line_fits_only_with_what_an_admission_counts_as_used() -> None:
    # capacity 1000: x holds 600 (500 + decode buffer 100); a needs 300 and fits (900), but not
    # once 200 tokens are claimed by waiting batch requests, as the admission itself counts them
    h = Harness(token_capacity_per_dp_rank=1000, decode_buffer_tokens=100, admission_waiting_request_threshold=1)
    h.tick(at=0.0)
    h.submit("x", tokens=500)
    h.observe(0, kv=0.6, running=1, waiting=1, at=0.5)  # the waiting gate is closed (at one scrape)
    assert told(h.submit("a", tokens=200, at=0.75)) == [("r2", 1, 0.25, True)]  # fits: the next tick
    h.abandon("r2", at=0.8)
    h.state.ranks[tid(0)].batch_claim_tokens = 200.0
    assert told(h.submit("b", tokens=200, at=0.8)) == [("r3", 1, 0.2 + 5.0, True)]  # blocked: the drain estimate


def test_a_programs_eta_from_its_own_line_equals_the_whole_queues() -> None:
    # two ranks of one slot each, three waiters per line: program_eta computes only the waiter's
    # line, up to it, and must tell exactly what the whole queue's pass tells it
    h = Harness(max_active_programs_per_target=1, n_targets=2, global_queue=True)
    h.tick(at=0.0)
    for i in range(8):
        h.submit(f"p{i}", at=0.1 * i)
    (pool,) = h.state.global_queues
    whole = eta_queue.queue_etas(h.state, (GLOBAL_QUEUE, pool))
    lines = {p.last_target for p, _eta in whole}
    assert len(whole) == 6 and len(lines) == 2
    positions = sorted(e.position for _p, e in whole)
    assert positions == [1, 1, 2, 2, 3, 3]
    for p, e in whole:
        assert eta_queue.program_eta(h.state, p) == e


# ---- moves: the cross-rank resume (docs/program-scheduling.md §7, §13 "Moves") --------------------

SLOW_PREFILL = PrefillCostModel(intercept_seconds=5.0)  # a recompute far dearer than one interval


def _two_ranks(**kw: object) -> Harness:
    h = Harness(n_targets=2, global_queue=True, stats_window_size=1, binding_strategy="program_round_robin", **kw)
    for i in (0, 1):
        h.rank(i).factors.push_request(request_sample())
    return h


def test_a_paused_program_under_pressure_is_told_its_move_to_a_free_rank() -> None:
    h = _two_ranks(max_active_programs_per_target=1, admission_waiting_request_threshold=0)
    h.submit("a")  # rank 0
    h.submit("x")  # rank 1
    h.submit("y")  # rank 0 (busy): a brand-new Program never moves
    h.complete("r2", at=0.5, prompt=100)  # x pauses on rank 1
    h.complete("r1", at=3.0, prompt=100)  # a pauses after a 3 s request; y admitted on rank 0
    # a, paused before, is queued for rank 0 (busy with y, expected to end in 3 - 1 = 2 s); with
    # the waiting gate off (threshold 0) its rank is under pressure, so it may move once it has
    # waited one interval: at the first tick from 5.0 (no tick yet: one interval from now), to
    # rank 1, which would admit it now
    eff = h.submit("a", at=4.0)
    assert told(eff) == [("r4", 1, 1.0, True)]
    assert admitted(h.tick(at=5.0)) == ["r4"]
    assert h.program("a").placement == tid(1)
    assert h.state.eta.errors[-1] == 0.0  # told 1.0 s, waited 1.0 s


def test_a_paused_program_without_pressure_is_told_its_move_after_the_recompute_cost() -> None:
    h = _two_ranks(
        token_capacity_per_dp_rank=10_000, admission_waiting_request_threshold=1, prefill_cost_model=SLOW_PREFILL
    )
    h.tick(at=0.0)  # the tick grid: 0, 1, 2, ...
    h.submit("big", tokens=6000)  # rank 0
    h.submit("z", tokens=1000)  # rank 1: 1100 used
    h.submit("a", tokens=2000)  # rank 0
    h.complete("r3", at=0.5, prompt=2000)  # a pauses
    impact = h.program("a").last_cache_miss_impact_seconds  # 9.49 s
    assert 9.0 < impact < 10.0
    h.submit("big", tokens=8000, at=0.7)  # rank 0 now 8100 used
    h.rank(0).factors.push_request(request_sample(e2e=30.0))  # rank 0's requests take 30 s
    h.observe(0, 0.5, 1, 0, at=0.9)  # no backend waiting requests on rank 0: no pressure
    # a cannot come back (8100 + 6100 > 10000) and nobody waits ahead of it: it moves once it has
    # waited as long as recomputing its context elsewhere takes (patient, no headroom margin), at
    # the first tick from 1.0 + 9.49 s: 11.0, 10 s from now (big's request, the line's own
    # estimate, is expected to end in 30 - 0.3 s)
    eff = h.submit("a", tokens=6000, at=1.0)
    assert told(eff) == [("r5", 1, 10.0, True)]
    for t in range(2, 11):
        assert admitted(h.tick(at=float(t))) == []
    assert admitted(h.tick(at=11.0)) == ["r5"]
    assert h.program("a").placement == tid(1)
    assert h.state.eta.errors[-1] == 0.0
    assert check(h.state, h.cfg) == []


def test_a_closed_waiting_gate_is_not_counted_as_lasting_pressure() -> None:
    # as above, but the engine of rank 0 reports a waiting request when a is queued (the gate is
    # closed: pressure) and none at the next scrape: the ETA counts on the patient move only
    h = _two_ranks(
        token_capacity_per_dp_rank=10_000, admission_waiting_request_threshold=1, prefill_cost_model=SLOW_PREFILL
    )
    h.tick(at=0.0)
    h.submit("big", tokens=6000)
    h.submit("z", tokens=1000)
    h.submit("a", tokens=2000)
    h.complete("r3", at=0.5, prompt=2000)
    h.submit("big", tokens=8000, at=0.7)
    h.rank(0).factors.push_request(request_sample(e2e=30.0))
    h.observe(0, 0.5, 1, 1, at=0.9)  # one waiting request in rank 0's engine: the gate is closed
    eff = h.submit("a", tokens=6000, at=1.0)
    assert told(eff) == [("r5", 1, 10.0, True)]  # not 1.0 (the tick at 2.0)
    h.observe(0, 0.5, 1, 0, at=1.5)  # the gate opens again
    for t in range(2, 11):
        assert admitted(h.tick(at=float(t))) == []
    assert admitted(h.tick(at=11.0)) == ["r5"]
    assert h.state.eta.errors[-1] == 0.0


def test_no_move_is_told_when_no_other_rank_would_admit_the_program() -> None:
    h = _two_ranks(max_active_programs_per_target=1, admission_waiting_request_threshold=0)
    h.submit("a")  # rank 0
    h.submit("x")  # rank 1, stays busy
    h.submit("y")  # rank 0 (busy)
    h.complete("r1", at=3.0, prompt=100)  # a pauses after a 3 s request; y admitted on rank 0
    # both ranks full: the line's own estimate, y's expected end (3 - 1 = 2 s; a TTL pause seen on
    # rank 0 after 1 round: it leaves)
    eff = h.submit("a", at=4.0)
    assert told(eff) == [("r4", 1, 2.0, True)]


# ---- the waiting gate (docs/program-scheduling.md §13, "The waiting gate") ------------------------


def test_completion_interval_is_the_engines_gap_between_completions_under_load() -> None:
    # (finished at, service seconds): the second was dispatched at 0.5, before the first finished
    # (a gap of 2.0 under load); the third at 4.5, after the second finished (the engine idled)
    assert eta.completion_interval([(2.0, 2.0), (4.0, 3.5), (6.5, 2.0)], running=1) == 2.0
    # no pair under load: the shortest service time shared by the engine's running requests
    assert eta.completion_interval([(2.0, 2.0), (5.0, 3.0)], running=2) == 1.0
    assert eta.completion_interval([], running=1) is None


def test_gate_opens_after_the_completions_that_bring_the_engine_queue_below_the_threshold() -> None:
    assert eta.gate_open_in(3, 1, 2.0, since_completion=0.5) == 1.5 + 2 * 2.0  # 3 completions
    assert eta.gate_open_in(3, 2, 2.0, since_completion=0.5) == 1.5 + 2.0  # 2 completions leave 1 < 2
    assert eta.gate_open_in(0, 1, 2.0, since_completion=0.5) is None  # open already
    assert eta.gate_open_in(1, 1, 2.0, since_completion=None) == 2.0  # no completion yet: one interval
    assert eta.gate_open_in(1, 1, 2.0, since_completion=3.0) == 0.0  # overdue


def _gate_closed_twice() -> Harness:
    """Three Programs on one engine that runs one request at a time: it queues two of them, as
    the scrapes at 0.5 and 1.5 say; the tick at 2.0 has seen both."""
    h = Harness(admission_waiting_request_threshold=1)
    h.tick(at=0.0)
    for program in ("x", "y", "z"):
        assert admitted(h.submit(program)) != []  # no observation yet: the gate is open
    h.observe(0, None, 1, 2, at=0.5)
    h.tick(at=1.0)
    h.observe(0, None, 1, 2, at=1.5, epoch=2)
    h.tick(at=2.0)
    return h


def test_a_line_behind_a_lasting_closed_gate_is_told_when_the_engine_drains() -> None:
    h = _gate_closed_twice()
    h.complete("r1", at=2.1, prompt=100)  # x after 2.1 s: the engine's completion interval
    # the engine's queue now: 2 at the scrape of 1.5, 3 requests in flight then, 2 now: 1 waiting,
    # so one completion opens the gate: 2.1 s after x's (2.0 s from now, at 4.2), seen by the
    # scrape of the first tick from then (5.0): 2.75 s; the line fits (was told 0.75 s, the next tick)
    assert told(h.submit("a", at=2.25)) == [("r4", 1, 2.75, True)]
    assert told(h.submit("b", at=2.25)) == [("r5", 2, 2.75, True)]  # the gate admits the line at once
    h.complete("r2", at=4.2, prompt=100)
    h.observe(0, None, 1, 0, at=5.0, epoch=3)  # z runs, nothing waits: the gate is open
    assert check(h.state, h.cfg) == []


def test_a_gate_closed_at_one_scrape_only_is_told_as_the_next_tick() -> None:
    h = Harness(admission_waiting_request_threshold=1)
    h.tick(at=0.0)
    for program in ("x", "y", "z"):
        h.submit(program)
    h.complete("r1", at=0.2, prompt=100)
    h.observe(0, None, 1, 1, at=0.5)  # one scrape: requests the engine had just received, mostly
    assert told(h.submit("a", at=0.75)) == [("r4", 1, 0.25, True)]


def test_the_engine_queue_counts_what_was_dispatched_and_completed_since_the_scrape() -> None:
    h = _gate_closed_twice()
    h.complete("r1", at=2.1, prompt=100)
    h.complete("r2", at=2.2, prompt=100)  # two completions since the scrape: nothing waits now
    assert told(h.submit("a", at=2.25)) == [("r4", 1, 0.75, True)]  # the next tick


def test_what_goes_through_the_gate_is_not_held_by_it() -> None:
    h = _gate_closed_twice()
    h.complete("r1", at=2.1, prompt=100)
    assert told(h.submit("a", at=2.25)) == [("r4", 1, 2.75, True)]
    a = h.program("a")
    # a force-resume deadline due at 3.1 goes through at the first tick from then (4.0): 1.75 s
    a.force_resume_deadline = 3.1
    assert eta_queue.program_eta(h.state, a) == eta.QueueEta(1, 1.75, 5.0, 0.75, blocked=False)
    # a Program of a tenant the rank is kept for (docs/priority.md §3): the next tick
    a.force_resume_deadline = None
    h.rank(0).isolated_for = frozenset({a.tenant})
    assert eta_queue.program_eta(h.state, a) == eta.QueueEta(1, 0.75, 5.0, 0.75, blocked=False)


def test_an_engine_that_queues_more_than_it_runs_holds_its_gate_from_the_first_scrape() -> None:
    h = Harness(admission_waiting_request_threshold=1)
    h.tick(at=0.0)
    for program in ("x", "y", "z"):
        h.submit(program)
    h.complete("r1", at=0.45, prompt=100)  # x after 0.45 s
    h.observe(0, None, 1, 2, at=0.5)  # one request runs, two wait: more than it runs
    # two completions open the gate: the first 0.45 s after x's (0.15 s from now), the second
    # 0.45 s later (at 1.35).  That one leaves nothing of agentd's in flight on the rank, so its
    # pass admits (session 33, ledger.waiting_gate_shut; before, the scrape of the tick of 2.0:
    # 1.25 s; before session 32, the next tick: 0.25 s)
    assert told(h.submit("a", at=0.75)) == [("r4", 1, 0.6, True)]
    h.complete("r2", at=0.9, prompt=100)
    assert admitted(h.complete("r3", at=1.35, prompt=100)) == ["r4"]


def test_an_engine_that_runs_nothing_yet_does_not_hold_its_gate_from_the_first_scrape() -> None:
    h = Harness(admission_waiting_request_threshold=1)
    h.tick(at=0.0)
    h.submit("x")
    h.complete("r1", at=0.45, prompt=100)
    h.submit("y", at=0.49)
    h.observe(0, None, 0, 1, at=0.5)  # y reached the engine, which has not started it yet
    assert told(h.submit("a", at=0.75)) == [("r3", 1, 0.25, True)]  # the next tick
