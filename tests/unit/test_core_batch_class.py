"""Scheduler core: batch requests as a class beside the Programs (docs/batch.md §2)."""

from __future__ import annotations

from core_support import BATCH_CAP, POOL, Harness, of, targets, tid
from core_support import admitted_batch as admitted_ids
from core_support import batch_harness as harness

from actors.core import effects as fx
from actors.core.batch_class import (
    RANK_STEP_RATIO,
    batch_diagnostics,
    decode_growth_tokens,
    engine_queue_full,
    peak_growth_tokens,
    rank_budget_tokens,
    rank_decode_step,
)
from actors.core.config import BatchJobsConfig
from actors.core.events import ObservationReceived, ObservationStarted, TargetsChanged
from actors.core.invariants import check

CAP = BATCH_CAP
BATCH = BatchJobsConfig(enabled=True)


def test_batch_request_is_dispatched_at_once_into_free_capacity_and_charged() -> None:
    h = harness()
    eff = h.submit_batch("b1", job="j", tokens=100)
    (adm,) = of(eff, fx.AdmitBatch)
    # cold-start prediction 128 decode tokens: charged prompt + prediction
    assert (adm.target_id, adm.job, adm.predicted_decode_tokens, adm.charged_tokens) == (tid(0), "j", 128, 228)
    assert adm.queue_wait_seconds == 0.0 and not adm.starvation_escape
    assert [type(e) for e in eff] == [fx.BatchJobCreated, fx.AdmitBatch]
    rank = h.rank()
    assert (rank.batch_tokens, rank.batch_requests, rank.fallback_tokens) == (228.0, 1, 0.0)
    assert check(h.state, h.cfg) == []


def test_budget_keeps_the_reserve_and_admission_stops_at_the_head_of_line() -> None:
    h = harness()
    # each request needs 1000 + 128 = 1128 tokens; the reserve is min(running + 2, 8) blocks of 16
    for i in range(10):
        h.submit_batch(f"b{i}", tokens=1000)
    rank = h.rank()
    # 8 running: used 9024, free blocks floor(976/16) = 61, reserve min(10, 8) = 8 -> budget 848 < 1128
    assert rank.batch_requests == 8
    assert rank_budget_tokens(h.state, rank) == (61 - 8) * 16
    assert len(h.state.batch.pending) == 2  # type: ignore[union-attr]
    eff = h.complete("b0", at=5.0, completion=50, finish_reason="stop")
    # the completion frees 1128 tokens: the oldest waiting request goes (FIFO inside one job)
    assert admitted_ids(eff) == ["b8"]
    (adm,) = of(eff, fx.AdmitBatch)
    assert adm.queue_wait_seconds == 5.0
    assert check(h.state, h.cfg) == []


def test_max_tokens_caps_the_predicted_decode_charge() -> None:
    h = harness()
    (adm,) = of(h.submit_batch("b1", tokens=100, max_tokens=20), fx.AdmitBatch)
    assert (adm.predicted_decode_tokens, adm.charged_tokens) == (20, 120)


def test_only_natural_stops_feed_the_job_estimate() -> None:
    h = harness()
    h.submit_batch("b1", job="j", tokens=10)
    h.complete("b1", completion=500, finish_reason="length")
    h.submit_batch("b2", job="j", tokens=10)
    h.complete("b2", success=False, completion=400, finish_reason="stop")
    (adm,) = of(h.submit_batch("b3", job="j", tokens=10), fx.AdmitBatch)
    assert adm.predicted_decode_tokens == 128  # still the cold-start prediction
    eff = h.complete("b3", completion=300, finish_reason="stop")
    (done,) = of(eff, fx.BatchCompleted)
    assert (done.predicted_decode_tokens, done.observed_decode_tokens, done.success) == (128, 300, True)
    (adm,) = of(h.submit_batch("b4", job="j", tokens=10), fx.AdmitBatch)
    assert adm.predicted_decode_tokens == 300


def _train(h: Harness, job: str, decode: int, rid: str) -> None:
    h.submit_batch(rid, job=job, tokens=10)
    h.complete(rid, completion=decode, finish_reason="stop")


def _queue_cold_then_next(h: Harness) -> None:
    """Queue three cold-start requests per job (short first) and then one more of each."""
    for job in ("short", "long"):
        for i in range(3):
            h.submit_batch(f"{job[0]}{i}", job=job, tokens=10)
    h.submit_batch("s-next", job="short", tokens=10)
    h.submit_batch("l-next", job="long", tokens=10)


def test_long_decode_jobs_go_first_when_the_budget_is_above_the_threshold() -> None:
    h = harness(token_capacity_per_dp_rank=100_000)
    _train(h, "long", 400, "t1")
    _train(h, "short", 10, "t2")
    h.submit_batch("blocker", job="block", tokens=99_989, max_tokens=1)  # leaves no free block
    _queue_cold_then_next(h)
    assert len(h.state.batch.pending) == 8  # type: ignore[union-attr]
    order = admitted_ids(h.complete("blocker", completion=1, finish_reason="length"))
    # cold-start requests first (the first 3 adds of each job, job by job), then by job order:
    # budget > low_available_tokens_threshold (4096) -> the long-decode job first
    assert order == ["s0", "s1", "s2", "l0", "l1", "l2", "l-next", "s-next"]


def test_short_decode_jobs_go_first_when_the_budget_is_at_or_below_the_threshold() -> None:
    h = harness(token_capacity_per_dp_rank=100_000)
    _train(h, "long", 400, "t1")
    _train(h, "short", 10, "t2")
    h.submit_batch("filler", job="fill", tokens=96_000, max_tokens=1)  # stays: 96,001 charged
    h.submit_batch("blocker", job="block", tokens=3_935, max_tokens=1)  # 99,937 in all: budget 0
    _queue_cold_then_next(h)
    order = admitted_ids(h.complete("blocker", completion=1, finish_reason="length"))
    # after the cold starts the budget is (floor(2709 / 16) - 8) * 16 = 2576 <= 4096: short first
    assert order == ["s0", "s1", "s2", "l0", "l1", "l2", "s-next", "l-next"]


def test_programs_first_then_the_starvation_escape() -> None:
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0))
    h.submit("a", tokens=9000)  # 9000 + 100 decode buffer: active
    h.submit("b", tokens=5000)  # does not fit: waits
    assert h.program("b").state == "paused"
    eff = h.submit_batch("x", tokens=100, at=1.0)
    # the budget (free 900 tokens) would fit it, but a Program waits for the rank: batch stops
    assert of(eff, fx.AdmitBatch) == []
    assert batch_diagnostics(h.state)["programs_waiting"] is True
    eff = h.tick(at=30.0)
    assert of(eff, fx.AdmitBatch) == []  # waited 29 s < max_wait_seconds
    eff = h.tick(at=31.0)
    (adm,) = of(eff, fx.AdmitBatch)
    assert adm.starvation_escape and adm.queue_wait_seconds == 30.0
    assert h.state.batch.escapes_count == 1  # type: ignore[union-attr]
    assert check(h.state, h.cfg) == []


def test_the_guaranteed_share_is_kept_for_backlogged_batch_work() -> None:
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.5))  # 5,000 of 10,000 tokens
    h.submit("a", tokens=3000)  # active: 3100
    h.submit("b", tokens=7000)  # 7100 more does not fit: waits
    assert h.program("b").state == "paused"
    # a Program waits, but batch may still fill its share (5000 tokens) of the rank
    for i in range(5):
        h.submit_batch(f"x{i}", tokens=872)  # 1000 tokens each with the 128 prediction
    assert h.rank().batch_requests == 5 and h.rank().batch_tokens == 5000.0
    h.submit_batch("over", tokens=872)
    assert "over" in h.state.batch.pending  # type: ignore[union-attr]
    # while batch is backlogged, Program admission leaves the unused share to it
    assert h.rank().batch_claim_tokens == 0.0  # the share is used up
    h.complete("x0", completion=128, finish_reason="stop", at=1.0)
    # "over" takes the freed share at once (the Program still waits: 3100 + 5000 + 7100 > 10,000)
    assert "over" in h.state.batch.running  # type: ignore[union-attr]
    assert check(h.state, h.cfg) == []


def test_a_waiting_program_preempts_batch_work_above_the_share_youngest_first() -> None:
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.2))
    from actors.core.events import BatchSubmitted
    from actors.core.ids import RequestId

    for i, at in enumerate((0.0, 1.0, 2.0)):
        h.feed(BatchSubmitted(RequestId(f"b{i}"), "j", 2872, None, preemptible=True), at=at)  # 3000 each
    assert h.rank().batch_tokens == 9000.0
    eff = h.submit("a", tokens=3900, at=3.0)  # needs 4000: 1000 free, deficit 3000, spare 7000
    pre = of(eff, fx.PreemptBatch)
    assert [p.request_id for p in pre] == ["b2"]  # the youngest alone covers the deficit
    assert [e.request_id for e in of(eff, fx.Admit)] == ["r1"]  # admitted in the same step
    b = h.state.batch
    assert b is not None and "b2" in b.pending and b.pending["b2"].preemptions == 1
    assert b.pending["b2"].arrived_at == 2.0  # it keeps its place in line
    # its answer was complete before the preemption landed: the late completion ends it
    eff = h.complete("b2", completion=10, finish_reason="stop", at=4.0)
    assert "b2" not in b.pending and b.jobs["j"].completed == 1
    assert check(h.state, h.cfg) == []


def test_non_preemptible_batch_work_is_never_preempted() -> None:
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0))
    for i in range(3):
        h.submit_batch(f"b{i}", tokens=2872)  # streaming-style: not preemptible
    eff = h.submit("a", tokens=3900, at=1.0)
    assert of(eff, fx.PreemptBatch) == [] and h.program("a").state == "paused"


def test_programs_see_batch_charges_in_their_admission() -> None:
    h = harness()
    h.submit_batch("x", tokens=9000, max_tokens=100)  # 9100 charged
    h.submit("a", tokens=5000)
    assert h.program("a").state == "paused"  # 5100 more does not fit next to the batch charge
    eff = h.complete("x", at=2.0, completion=100, finish_reason="length")
    assert h.program("a").state == "active"
    assert [e.request_id for e in of(eff, fx.Admit)] == ["r1"]


def test_abandon_unqueues_or_releases() -> None:
    h = harness()
    h.submit_batch("big", tokens=9500, max_tokens=10)
    h.submit_batch("q", tokens=1000)
    b = h.state.batch
    assert b is not None and "q" in b.pending
    h.abandon("q")
    assert "q" not in b.pending and len(b.queue) == 0
    assert b.jobs["__default__"].abandoned == 1
    (done,) = of(h.abandon("big"), fx.BatchCompleted)
    assert (done.request_id, done.success, done.observed_decode_tokens) == ("big", False, None)
    assert h.rank().batch_tokens == 0.0 and h.rank().batch_requests == 0
    assert "__default__" not in b.jobs  # nothing of the job is left: its counters are forgotten
    assert check(h.state, h.cfg) == []


def test_an_idle_rank_takes_a_request_larger_than_any_budget() -> None:
    h = harness()
    (adm,) = of(h.submit_batch("huge", tokens=20_000), fx.AdmitBatch)
    assert adm.charged_tokens == 20_128
    # the next one waits: the rank is no longer idle
    assert of(h.submit_batch("next", tokens=10), fx.AdmitBatch) == []


def test_programs_keep_their_decode_speed_and_batch_keeps_one_request_per_rank() -> None:
    h = harness(
        n_targets=2, token_capacity_per_dp_rank=1_000_000, batch=BatchJobsConfig(enabled=True, max_decode_slowdown=0.5)
    )
    h.submit("a", tokens=20_000)  # active on rank 0 (reasoning_token_balance or hash)
    home = h.program("a").placement
    other = tid(1) if home == tid(0) else tid(0)
    for i in range(40):
        h.submit_batch(f"b{i}", tokens=1372)  # 1500 tokens each
    ranks = h.state.ranks
    # the idle rank takes batch up to its budget; next to the Program the decode step may grow
    # by at most 50%: (0.0106 + 4.19e-4 n + 1.42e-7 ctx) <= 1.5 x the Program's step alone
    assert ranks[other].batch_requests > ranks[home].batch_requests >= 1
    model = h.cfg.decode_throughput_model
    from actors.core.costs import decode_step_seconds

    alone = decode_step_seconds(1, 20_100, model)
    shared = decode_step_seconds(1 + ranks[home].batch_requests, 20_100 + ranks[home].batch_tokens, model)
    assert shared <= 1.5 * alone
    assert decode_step_seconds(2 + ranks[home].batch_requests, 21_600 + ranks[home].batch_tokens, model) > 1.5 * alone


def test_losing_every_target_answers_queued_batch_requests_with_503() -> None:
    h = harness()
    h.submit_batch("big", tokens=9900, max_tokens=10)
    h.submit_batch("q", tokens=1000)
    eff = h.feed(TargetsChanged(POOL, ()))
    (rej,) = of(eff, fx.Reject)
    assert (rej.request_id, rej.status_hint) == ("q", 503)
    # the running one's completion still comes and changes nothing on a ledger that is gone
    h.complete("big", completion=1, finish_reason="stop")
    h.feed(TargetsChanged(POOL, targets(1)))
    assert h.rank().batch_requests == 0
    assert check(h.state, h.cfg) == []


def test_batch_disabled_state_has_no_batch_section() -> None:
    h = Harness(token_capacity_per_dp_rank=CAP)
    assert h.state.batch is None
    assert batch_diagnostics(h.state) == {"enabled": False}


def test_diagnostics_per_job_and_rank() -> None:
    h = harness()
    h.submit_batch("a1", job="A", tokens=100)
    h.complete("a1", completion=40, finish_reason="stop", at=1.0)
    h.submit_batch("a2", job="A", tokens=100, at=1.0)
    doc = batch_diagnostics(h.state)
    (job,) = doc["jobs"]  # type: ignore[misc]
    assert job["job"] == "A" and job["running"] == 1 and job["completed"] == 1
    assert job["predicted_decode_tokens"] == 40 and job["observed_decode_tokens_mean"] == 40
    (rank,) = doc["ranks"]  # type: ignore[misc]
    assert rank["running"] == 1 and rank["charged_tokens"] == 140.0 and rank["reserve_blocks"] == 3
    assert rank["growth_reserve_tokens"] == 0.0  # no observation: the ledger holds a2 at its predicted size


def test_without_a_configured_capacity_the_engines_reported_pool_sizes_the_budget() -> None:
    h = Harness(batch=BATCH)  # token_capacity_per_dp_rank unset
    h.submit_batch("first", tokens=100)  # an idle rank takes one request before any observation
    assert of(h.submit_batch("second", tokens=100), fx.AdmitBatch) == []
    assert rank_budget_tokens(h.state, h.rank()) == 0
    h.feed(ObservationStarted(tid(0), 1), at=1.0)
    eff = h.feed(ObservationReceived(tid(0), 1, 0.0, 1, 0, kv_capacity_tokens=10_000))
    assert admitted_ids(eff) == ["second"]
    assert h.rank().backend_kv_capacity_tokens == 10_000


def test_peak_growth_is_the_largest_rise_net_of_requests_that_end_first() -> None:
    assert peak_growth_tokens([]) == 0.0
    assert peak_growth_tokens([(100.0, 0.0)]) == 0.0  # nothing left to decode
    assert peak_growth_tokens([(100.0, 50.0)]) == 50.0
    # the 1,000-token request ends after 10 more tokens: both grow 10 (+20); later the short-lived
    # one's 1,000 tokens are freed, so the long one's further 40 tokens never raise the peak
    assert peak_growth_tokens([(1000.0, 10.0), (100.0, 50.0)]) == 20.0
    # two requests ending together grow together
    assert peak_growth_tokens([(10.0, 30.0), (10.0, 30.0)]) == 60.0
    # a small request ending early frees less than the others grow afterwards: the peak is just
    # before they end, 2 x 40 grown minus the 5 tokens the early one held
    assert peak_growth_tokens([(5.0, 10.0), (100.0, 40.0), (100.0, 40.0)]) == 75.0


def test_with_a_fresh_observation_the_budget_keeps_room_for_the_running_requests_decode() -> None:
    h = harness()
    h.submit_batch("a", job="j", tokens=100, at=0.0)
    h.complete("a", at=2.0, completion=100, finish_reason="stop")  # estimate 100, rate 50 tokens/s
    (adm,) = of(h.submit_batch("b", job="j", tokens=1000, at=2.0), fx.AdmitBatch)
    assert (adm.predicted_decode_tokens, adm.charged_tokens) == (100, 1100)
    rank = h.rank()
    assert decode_growth_tokens(h.state, rank) == 0.0  # no observation: b is on the ledger at 1100
    h.observe(0, 0.125, 1, 0, at=3.0)  # the engine holds 1250 tokens
    # b decoded about (3 - 2) x 50 = 50 of its 100 tokens by the observation: 50 more to come
    assert decode_growth_tokens(h.state, rank) == 50.0
    # free blocks floor((10000 - 1250 - 50) / 16) = 543, reserve min(1 + 2, 8) = 3
    assert rank_budget_tokens(h.state, rank) == (543 - 3) * 16
    # 8560 + 100 = 8660 tokens would fit without the growth (floor(8750 / 16) = 546 -> 8688): held
    assert of(h.submit_batch("c", job="j", tokens=8560, at=3.0), fx.AdmitBatch) == []
    eff = h.complete("b", at=4.0, completion=100, finish_reason="stop")
    assert admitted_ids(eff) == ["c"]
    # c was dispatched after the observation: on the ledger at its predicted size, not counted again
    assert decode_growth_tokens(h.state, rank) == 0.0
    h.tick(at=10.0)  # the observation is stale: the fallback ledger holds c at its predicted size
    assert decode_growth_tokens(h.state, rank) == 0.0


def test_growth_uses_the_jobs_current_prediction_when_it_rose_after_dispatch() -> None:
    h = harness()
    h.submit_batch("a", job="short", tokens=100, at=0.0)
    h.complete("a", at=1.0, completion=100, finish_reason="stop")  # rate 100 tokens/s
    (adm,) = of(h.submit_batch("b", job="long", tokens=100, at=1.0), fx.AdmitBatch)
    assert adm.predicted_decode_tokens == 128  # cold start
    h.observe(0, 0.05, 2, 0, at=4.0)
    # the progress lower bound: b has run (4 - 1) x 100 = 300 tokens' worth, so the job predicts
    # 300; b decoded min(300, 300) by the observation: nothing left to grow on that estimate
    assert decode_growth_tokens(h.state, h.rank()) == 0.0
    h.tick(at=5.0)  # the bound is now 400: b still grows 100 beyond what the observation saw
    assert decode_growth_tokens(h.state, h.rank()) == 100.0


def test_growth_frees_what_a_request_holds_when_its_jobs_prediction_rose_after_dispatch() -> None:
    h = harness()
    h.submit_batch("a", job="short", tokens=100, at=0.0)
    h.submit_batch("g", job="gen", tokens=10, at=0.0)
    h.complete("a", at=1.0, completion=100, finish_reason="stop")
    (b,) = of(h.submit_batch("b", job="long", tokens=100, at=1.0), fx.AdmitBatch)
    assert (b.predicted_decode_tokens, b.charged_tokens) == (128, 228)  # cold start
    h.complete("g", at=3.0, completion=400, finish_reason="stop")  # gen predicts 400
    (c,) = of(h.submit_batch("c", job="gen", tokens=10, at=3.0), fx.AdmitBatch)
    assert c.predicted_decode_tokens == 400
    h.observe(0, 0.1, 2, 0, at=4.0)
    # progress rate (100 + 400) / (1 + 3) = 125 tokens/s.  b decoded 375 tokens' worth, past the
    # ~310 its job predicts now (the progress bound): it ends now, freeing its prompt and decode,
    # 100 + ~310 (not 228 - ~310 + ~310: the charge holds the old prediction).  c holds 10 + 125
    # and grows 275 more: less than b frees first, so no growth to reserve (228 would leave 47)
    assert decode_growth_tokens(h.state, h.rank()) == 0.0


def test_growth_progress_rate_is_the_ratio_of_sums_not_the_ewma() -> None:
    h = harness()
    h.submit_batch("a1", job="x", tokens=10, at=0.0)
    h.submit_batch("a2", job="x", tokens=10, at=0.0)
    h.complete("a1", at=2.0, completion=100, finish_reason="stop")  # 50 tokens/s
    h.complete("a2", at=2.0, completion=300, finish_reason="stop")  # 150 tokens/s
    assert h.state.batch.decode_rate == 0.9 * 50 + 0.1 * 150  # type: ignore[union-attr]  # the EWMA: 60
    (adm,) = of(h.submit_batch("b", job="j", tokens=1000, at=2.0), fx.AdmitBatch)
    assert adm.predicted_decode_tokens == 128  # cold start (the progress bound, 60, is lower)
    h.observe(0, 0.125, 1, 0, at=3.0)
    # progress at (300 + 100) / (2 + 2) = 100 tokens/s: b decoded 100 of 128, whatever order a1 and
    # a2 were handled in (the EWMA would say 60 or 140)
    assert decode_growth_tokens(h.state, h.rank()) == 28.0


def _two_ranks_with_a_backlog(gate: int) -> Harness:
    """Two ranks of 10,000 tokens, no observation yet: 16 requests of 1,128 tokens (1,000 + 128)
    fill both ledgers (8 each), 8 more wait in the router's queue."""
    h = harness(n_targets=2, batch=BatchJobsConfig(enabled=True, engine_queue_requests=gate))
    for i in range(24):
        h.submit_batch(f"b{i}", tokens=1000, at=0.0)
    # start-up: no fresh observation, so the gate is open and each rank fills its ledger
    assert (h.rank(0).batch_requests, h.rank(1).batch_requests) == (8, 8)
    assert len(h.state.batch.pending) == 8  # type: ignore[union-attr]
    return h


def test_a_rank_whose_engine_queues_its_batch_work_does_not_take_a_same_instant_wave() -> None:
    h = _two_ranks_with_a_backlog(gate=4)
    # rank 0's engine has started one request (its KV: 1,128 tokens) and queues 7 for their prefill;
    # they hold no KV yet, so the observation's budget jumps -- but the engine queue is full
    assert admitted_ids(h.observe(0, 0.1128, 1, 7, at=1.0)) == []
    # three started, two still queued: two more go there (2 waiting + 2 sent since the observation = 4), the
    # rest stays in the router for whichever rank frees first
    assert admitted_ids(h.observe(0, 0.3384, 3, 2, at=2.0, epoch=2)) == ["b16", "b17"]
    assert h.rank(0).batch_dispatched_since_observation == 2
    assert len(h.state.batch.pending) == 6  # type: ignore[union-attr]
    assert check(h.state, h.cfg) == []


def test_without_the_engine_queue_gate_the_first_rank_to_refresh_takes_the_wave() -> None:
    h = _two_ranks_with_a_backlog(gate=0)
    # engine_queue_requests = 0: the old behaviour, the whole backlog in one instant
    assert len(admitted_ids(h.observe(0, 0.1128, 1, 7, at=1.0))) == 6
    assert h.rank(0).batch_requests == 14


def test_the_engine_queue_gate_opens_when_the_observation_goes_stale() -> None:
    h = _two_ranks_with_a_backlog(gate=4)
    h.observe(0, 0.1128, 1, 7, at=1.0)
    assert engine_queue_full(h.state, h.rank(0))
    assert not engine_queue_full(h.state, h.rank(1))  # no observation there: today's behaviour
    h.tick(at=10.0)  # three metrics intervals later the observation is stale
    assert not engine_queue_full(h.state, h.rank(0))


def test_the_engine_queue_gate_forgets_requests_that_ended_since_the_observation() -> None:
    """Short requests sent after an observation that complete before the next one are in no engine
    queue: the gate stops counting them, so a rank that finishes more requests per metrics interval
    than ``engine_queue_requests`` is not throttled to that many (it was, until its next observation)."""
    h = _two_ranks_with_a_backlog(gate=4)
    h.observe(0, 0.1128, 1, 7, at=1.0)
    assert admitted_ids(h.observe(0, 0.3384, 3, 2, at=2.0, epoch=2)) == ["b16", "b17"]
    # a request dispatched before the observation ends: the observation counted it, the gate does
    # not (2 waiting + 2 sent since: still full, so the freed room waits for the next observation)
    assert admitted_ids(h.complete("b0", at=2.05, completion=10)) == []
    assert h.rank(0).batch_dispatched_since_observation == 2
    # each of the two sent since ends within the same interval: the gate lets one more through
    assert admitted_ids(h.complete("b16", at=2.1, completion=10)) == ["b18"]
    assert admitted_ids(h.complete("b17", at=2.2, completion=10)) == ["b19"]
    assert h.rank(0).batch_dispatched_since_observation == 2  # b18 and b19
    assert check(h.state, h.cfg) == []


def _held_back_rank_beside_a_free_one() -> Harness:
    """Two ranks of 100,000 tokens (KV is not the limit); rank 1's fresh observation shows 48
    requests waiting in its engine, so the engine-queue gate keeps batch off it but for the one
    request an idle rank always takes, and rank 0 takes the rest of the backlog: 60 requests of
    10 + 128 = 138 tokens."""
    h = harness(n_targets=2, token_capacity_per_dp_rank=100_000)
    h.observe(1, 0.0, 0, 48, at=0.0)
    for i in range(60):
        h.submit_batch(f"b{i}", tokens=10, at=0.0)
    return h


def test_a_rank_whose_decode_steps_would_be_far_slower_than_another_ranks_takes_no_more_batch() -> None:
    """docs/batch.md §2.3: a rank takes a batch request only while its decode step with it stays
    within RANK_STEP_RATIO (3) times the fastest other rank's.  Rank 1 runs one request of 138
    tokens: a step of 10.635 + 0.419 + 0.020 = 11.074 ms.  Rank 0's step with n such requests is
    10.635 + 0.4389 n ms, within 3 x 11.074 = 33.223 ms up to n = 51 (before the bound it took
    all 59, its KV budget allowing them)."""
    h = _held_back_rank_beside_a_free_one()
    assert (h.rank(0).batch_requests, h.rank(1).batch_requests) == (51, 1)
    assert rank_decode_step(h.state, h.rank(0)) <= RANK_STEP_RATIO * rank_decode_step(h.state, h.rank(1))
    assert rank_decode_step(h.state, h.rank(0), 138.0) > RANK_STEP_RATIO * rank_decode_step(h.state, h.rank(1))
    assert rank_budget_tokens(h.state, h.rank(0)) > 8 * 138  # KV would have taken the rest
    assert len(h.state.batch.pending) == 8  # type: ignore[union-attr]
    # rank 1's engine queue drains: it takes the 8 that waited in the router
    assert admitted_ids(h.observe(1, 0.0, 1, 0, at=1.0, epoch=2)) == [f"b{i}" for i in range(52, 60)]
    assert (h.rank(0).batch_requests, h.rank(1).batch_requests) == (51, 9)
    assert check(h.state, h.cfg) == []


def test_the_step_bound_takes_one_more_request_when_one_on_the_slow_rank_ends() -> None:
    h = _held_back_rank_beside_a_free_one()
    assert admitted_ids(h.complete("b0", at=2.5, completion=20, finish_reason="stop")) == ["b52"]
    assert (h.rank(0).batch_requests, len(h.state.batch.pending)) == (51, 7)  # type: ignore[union-attr]


def test_a_rank_running_no_batch_takes_one_request_whatever_the_other_ranks_steps() -> None:
    """One batch request per rank always runs: a request whose context alone makes the step more
    than three times the other rank's still goes to a rank that runs no batch work."""
    h = harness(n_targets=2, token_capacity_per_dp_rank=1_000_000)
    # 400,000 tokens of context: 10.635 + 0.419 + 56.818 ms against rank 1's 10.635 ms
    (adm,) = of(h.submit_batch("huge", tokens=400_000, at=0.0), fx.AdmitBatch)
    assert adm.target_id == tid(0)
    assert rank_decode_step(h.state, h.rank(0)) > RANK_STEP_RATIO * rank_decode_step(h.state, h.rank(1))
    assert check(h.state, h.cfg) == []


def test_one_rank_alone_has_no_other_rank_to_compare_its_steps_with() -> None:
    h = harness(token_capacity_per_dp_rank=100_000)
    for i in range(60):
        h.submit_batch(f"b{i}", tokens=10, at=0.0)
    assert h.rank(0).batch_requests == 60


def test_diagnostics_count_created_and_evicted_jobs() -> None:
    """max_jobs eviction shows in the diagnostics, not only in the log and /metrics (session 32 walk:
    the batch section had no trace of it, and an evicted idle job simply vanished from ``jobs``)."""
    h = harness(batch=BatchJobsConfig(enabled=True, max_jobs=1))
    for i, job in enumerate(("A", "B", "C")):
        h.submit_batch(f"r{i}", job=job, tokens=100, at=float(i))
        h.complete(f"r{i}", completion=10, finish_reason="stop", at=i + 0.5)
    doc = batch_diagnostics(h.state)
    assert (doc["jobs_created"], doc["jobs_evicted"], doc["max_jobs"], doc["jobs_with_statistics"]) == (3, 2, 1, 1)
    assert [j["job"] for j in doc["jobs"]] == ["C"]  # type: ignore[attr-defined]


def _preempt_the_youngest_with_one_waiting_behind() -> Harness:
    """Three preemptible 3,000-token requests of tenant ``bt`` run (b0, b1, b2 at 0, 1, 2 s; b2 the
    only one sent since the rank's observation at 1.5 s), b3 (2.5 s) waits; Program ``a`` (4,000
    tokens) arrives at 3 s and preempts b2 alone."""
    from actors.core.events import BatchSubmitted
    from actors.core.ids import RequestId

    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.2))
    for i, at in enumerate((0.0, 1.0, 2.0, 2.5)):
        if i == 2:
            h.observe(0, 0.6, 2, 0, at=1.5)
            assert h.rank().batch_dispatched_since_observation == 0
        h.feed(BatchSubmitted(RequestId(f"b{i}"), "j", 2872, None, preemptible=True, tenant="bt"), at=at)
    assert h.rank().batch_dispatched_since_observation == 1
    assert [p.request_id for p in of(h.submit("a", tokens=3900, at=3.0), fx.PreemptBatch)] == ["b2"]
    return h


def test_a_preempted_batch_request_waits_again_in_arrival_order() -> None:
    """A preempted request waits in ``pending`` ahead of a later arrival (the starvation escape serves the first)."""
    h = _preempt_the_youngest_with_one_waiting_behind()
    b = h.state.batch
    assert b is not None and list(b.pending) == ["b2", "b3"]
    assert batch_diagnostics(h.state)["oldest_wait_seconds"] == 1.0


def test_preemption_updates_the_job_counters_and_the_preemption_count() -> None:
    """The preempted request no longer runs for its job, and the preemption is counted once."""
    h = _preempt_the_youngest_with_one_waiting_behind()
    b = h.state.batch
    assert b is not None
    assert (b.jobs["j"].running, list(b.jobs["j"].running_since)) == (2, ["b0", "b1"])
    diag = batch_diagnostics(h.state)
    assert diag["preemptions"] == 1
    assert [j["running"] for j in diag["jobs"] if j["job"] == "j"] == [2]  # type: ignore[index]


def test_preemption_takes_the_request_out_of_the_engine_queue_gate_count() -> None:
    """A preempted request dispatched since the rank's last observation leaves the engine-queue gate's count."""
    h = _preempt_the_youngest_with_one_waiting_behind()
    assert h.rank().batch_dispatched_since_observation == 0  # b2 was the only one, and it was taken back


def test_preemption_gives_the_tenant_back_its_dispatch_charge() -> None:
    """The preempted request's tenant gets back the prompt tokens its dispatch was charged (docs/priority.md §3)."""
    h = _preempt_the_youngest_with_one_waiting_behind()
    # b0 and b1 were charged their 2,872 prompt tokens each; b2's charge was refunded
    assert h.state.fair.accounts["bt"].counter == 2 * 2872
