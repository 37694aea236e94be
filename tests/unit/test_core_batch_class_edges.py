"""Scheduler core, batch class: edges the mutation campaign found untested (docs/batch.md §2)."""

from __future__ import annotations

import pytest
from core_support import BATCH_CAP, POOL, Harness, of, targets, tid
from core_support import admitted_batch as admitted_ids
from core_support import batch_harness as harness

from actors.core import batch_class as bc
from actors.core import effects as fx
from actors.core.config import BatchJobsConfig, ClassLimits, DecodeThroughputModel, PriorityConfig
from actors.core.costs import decode_step_seconds
from actors.core.errors import InvalidEvent
from actors.core.events import BatchSubmitted, InteractiveSubmitted, RequestAbandoned, TargetsChanged
from actors.core.ids import RequestId

CAP = BATCH_CAP
BATCH = BatchJobsConfig(enabled=True)


def preemptible(h: Harness, rid: str, tokens: int, at: float) -> tuple[object, ...]:
    return h.feed(BatchSubmitted(RequestId(rid), "j", tokens, None, preemptible=True), at=at)


# ---- growth reserve ----------------------------------------------------------------------------


def test_peak_growth_nets_out_every_request_that_ended_before_the_peak() -> None:
    """At the peak the growing request's rise is net of all the requests that ended first, not the next one only."""
    # at tau = 100 the first request grew by 100; the two others ended, freeing 30 + 30
    assert bc.peak_growth_tokens([(0.0, 100.0), (30.0, 10.0), (30.0, 10.0)]) == 40.0


# ---- preemption for a waiting Program (docs/batch.md §2.4) -------------------------------------


def test_no_batch_work_is_preempted_when_preempting_cannot_cover_the_programs_deficit() -> None:
    """A waiting Program whose deficit is more than batch holds above its share preempts nothing."""
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.5))
    for i, at in enumerate((0.0, 1.0, 2.0)):
        preemptible(h, f"b{i}", 2872, at)  # 3000 tokens each
    # needs 7000: 1000 free, deficit 6000; batch holds 9000, of which 4000 above its 5000 share
    eff = h.submit("a", tokens=6900, at=3.0)
    assert of(eff, fx.PreemptBatch) == [] and h.program("a").state == "paused"
    assert (h.rank().batch_requests, h.rank().batch_tokens) == (3, 9000.0)


def test_preemption_never_takes_batch_below_its_guaranteed_share() -> None:
    """A victim whose preemption would leave batch below its guaranteed share is kept."""
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.8))
    for i, at in enumerate((0.0, 1.0, 2.0)):
        preemptible(h, f"b{i}", 2872, at)  # 9000 in all, 1000 above the 8000 share
    eff = h.submit("a", tokens=3900, at=3.0)  # deficit 3000: the youngest (3000) would cover it
    assert of(eff, fx.PreemptBatch) == [] and h.program("a").state == "paused"
    assert h.rank().batch_requests == 3


def test_the_deficit_is_measured_against_the_low_watermark() -> None:
    """A Program's deficit is ``required - (capacity x low_watermark_ratio - used)``, not the whole capacity."""
    h = harness(low_watermark_ratio=0.9, batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0))
    for i, at in enumerate((0.0, 1.0, 2.0)):
        preemptible(h, f"b{i}", 2572, at)  # 2700 each: 8100 of the 9000 below the watermark
    assert h.rank().batch_requests == 3
    eff = h.submit("a", tokens=1900, at=3.0)  # needs 2000: 900 free below the watermark, deficit 1100
    assert [p.request_id for p in of(eff, fx.PreemptBatch)] == ["b2"]
    assert [e.request_id for e in of(eff, fx.Admit)] == ["r1"]


# ---- arrival, completion, abandon --------------------------------------------------------------


def test_a_batch_request_with_no_prompt_tokens_is_accepted() -> None:
    """``estimated_prompt_tokens`` 0 is valid (only negative counts are refused)."""
    h = harness()
    (adm,) = of(h.submit_batch("b0", tokens=0), fx.AdmitBatch)
    assert (adm.request_id, adm.charged_tokens) == ("b0", 128)
    with pytest.raises(InvalidEvent, match="estimated_prompt_tokens"):
        h.submit_batch("b1", tokens=-1)


def test_a_batch_request_id_already_queued_is_refused() -> None:
    """A second arrival with the id of a queued batch request is an invalid event."""
    h = harness()
    h.submit_batch("big", tokens=9_500, max_tokens=10)
    h.submit_batch("q", tokens=1_000)
    assert "q" in h.state.batch.pending  # type: ignore[union-attr]
    with pytest.raises(InvalidEvent, match="already live"):
        h.submit_batch("q", tokens=1_000)


def test_an_arrival_keeps_its_jobs_estimate_from_eviction() -> None:
    """A request's arrival makes its job the most recently used: ``max_jobs`` evicts another job's estimate."""
    h = harness(batch=BatchJobsConfig(enabled=True, max_jobs=2))
    for i, job in enumerate(("A", "B")):
        h.submit_batch(f"t{i}", job=job, tokens=10, at=float(i))
        h.complete(f"t{i}", completion=50 + i, finish_reason="stop", at=i + 0.5)
    h.submit_batch("a2", job="A", tokens=10, at=2.0)  # A is now more recent than B
    h.submit_batch("c", job="C", tokens=10, at=2.0)
    (ev,) = of(h.complete("c", completion=70, finish_reason="stop", at=3.0), fx.BatchJobEvicted)
    assert ev.job == "B"


def test_a_programs_completion_is_not_taken_for_a_batch_requests() -> None:
    """With batch on, a Program request's completion is handled as the Program's (not a batch request's)."""
    h = harness()
    h.submit_batch("x", tokens=100)
    h.submit("a", tokens=1_000)
    h.complete("r1", at=1.0, prompt=1_000, completion=10, finish_reason="stop")
    assert h.program("a").in_flight == 0 and "x" in h.state.batch.running  # type: ignore[union-attr]


def test_a_batch_completion_charges_its_tenant_the_reported_output() -> None:
    """A batch request's tenant is charged its prompt at dispatch and its reported output at completion."""
    h = harness()
    h.feed(BatchSubmitted(RequestId("b"), "j", 100, None, tenant="t"))
    assert h.state.fair.accounts["t"].input_tokens == 100
    h.complete("b", completion=40, finish_reason="stop", at=1.0)
    assert (h.state.fair.accounts["t"].input_tokens, h.state.fair.accounts["t"].output_tokens) == (100, 40)


def test_a_late_completion_without_usage_charges_no_output() -> None:
    """A preempted request whose answer completed anyway, with no usage reported, is charged no output."""
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0))
    h.feed(BatchSubmitted(RequestId("b"), "j", 2872, None, preemptible=True, tenant="t"), at=0.0)
    h.feed(BatchSubmitted(RequestId("c"), "j", 2872, None, tenant="t"), at=0.0)
    h.feed(BatchSubmitted(RequestId("d"), "j", 2872, None, tenant="t"), at=0.0)
    assert [p.request_id for p in of(h.submit("a", tokens=3900, at=1.0), fx.PreemptBatch)] == ["b"]
    h.complete("b", at=2.0)  # no usage at all
    assert "b" not in h.state.batch.pending  # type: ignore[union-attr]
    assert h.state.fair.accounts["t"].output_tokens == 0


def test_abandoning_the_last_queued_request_of_a_job_forgets_the_job() -> None:
    """A job with nothing queued, nothing running and no estimate leaves the per-job counters on abandon."""
    h = harness()
    h.submit_batch("big", job="A", tokens=9_500, max_tokens=10)
    h.submit_batch("q", job="B", tokens=1_000)
    b = h.state.batch
    assert b is not None and "q" in b.pending and "B" in b.jobs
    h.abandon("q")
    assert sorted(b.jobs) == ["A"]


def test_abandoning_a_waiting_program_request_with_batch_on_cancels_it() -> None:
    """With the batch class on, an abandoned request that is no batch request still leaves the Programs' queue."""
    h = harness()
    h.submit("a", 9_000)
    h.submit("b", 5_000)  # waits
    assert h.state.pool.get(RequestId("r2")) is not None
    h.feed(RequestAbandoned(RequestId("r2")), at=1.0)
    assert h.state.pool.get(RequestId("r2")) is None


def test_queue_waits_feed_the_jobs_mean_queue_wait() -> None:
    """The diagnostics' mean queue wait is over the job's dispatched requests, waits included."""
    h = harness()
    h.submit_batch("big", job="j", tokens=9_500, max_tokens=10, at=0.0)
    h.submit_batch("q", job="j", tokens=1_000, at=1.0)
    assert admitted_ids(h.complete("big", completion=10, finish_reason="length", at=5.0)) == ["q"]
    (job,) = bc.batch_diagnostics(h.state)["jobs"]  # type: ignore[misc]
    assert job["mean_queue_wait_seconds"] == (0.0 + 4.0) / 2


# ---- Programs first, decode speed, step balance ------------------------------------------------


def test_a_program_waiting_in_the_global_queue_holds_batch_back() -> None:
    """In global-queue mode a waiting Program gates batch on the ranks it could resume on."""
    h = harness(global_queue=True, batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0))
    h.submit("a", tokens=9000)
    h.submit("b", tokens=5000)
    assert h.program("b").state == "paused"
    assert of(h.submit_batch("x", tokens=100, at=1.0), fx.AdmitBatch) == []
    assert bc.batch_diagnostics(h.state)["programs_waiting"] is True


def test_one_batch_request_runs_beside_programs_whatever_its_slowdown_but_no_second() -> None:
    """Beside active Programs the first batch request on a rank always runs; a second must keep the slowdown bound."""
    h = harness(token_capacity_per_dp_rank=1_000_000, batch=BatchJobsConfig(enabled=True, max_decode_slowdown=0.1))
    h.submit("a", tokens=20_000)
    # 100,128 tokens of context beside the Program's 20,100: the step doubles, far above 1.1 x
    assert admitted_ids(h.submit_batch("big", tokens=100_000, at=1.0)) == ["big"]
    assert admitted_ids(h.submit_batch("small", tokens=10, at=1.0)) == []
    assert h.rank().batch_requests == 1


def test_the_decode_step_with_one_more_request_counts_its_context() -> None:
    """A prospective request adds one request and its tokens to the rank's decode step."""
    h = harness(token_capacity_per_dp_rank=1_000_000)
    h.submit_batch("b", tokens=1_000)
    rank = h.rank()
    model = h.cfg.decode_throughput_model
    assert bc.rank_decode_step(h.state, rank) == decode_step_seconds(1, 1_128, model)
    assert bc.rank_decode_step(h.state, rank, 50_000.0) == decode_step_seconds(2, 51_128, model)


def test_a_rank_takes_a_request_whose_step_is_exactly_the_step_bound() -> None:
    """The step bound admits a rank's step equal to RANK_STEP_RATIO x the fastest other rank's (docs/batch.md §2.3)."""
    # steps of 0.25 s + 0.25 s per request, context free: exact in binary floating point
    model = DecodeThroughputModel(0.25, 0.25, 0.0)
    h = harness(n_targets=2, token_capacity_per_dp_rank=100_000, decode_throughput_model=model)
    h.observe(1, 0.0, 0, 48, at=0.0)  # rank 1's engine queue is full: it takes only an idle rank's one
    for i in range(10):
        h.submit_batch(f"b{i}", tokens=10, at=0.0)
    # rank 1 runs one (step 0.5 s): rank 0 runs 5, a step of 0.25 + 5 x 0.25 = 1.5 s = 3 x 0.5 s
    assert (h.rank(0).batch_requests, h.rank(1).batch_requests) == (5, 1)
    assert bc.rank_decode_step(h.state, h.rank(0)) == 3 * bc.rank_decode_step(h.state, h.rank(1))
    assert h.state.batch.running["b0"].target_id == tid(0)  # type: ignore[union-attr]


def test_a_deficit_of_one_token_is_a_deficit() -> None:
    """A waiting Program short of a single token preempts batch work above the share."""
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.2))
    for i, at in enumerate((0.0, 1.0, 2.0)):
        preemptible(h, f"b{i}", 2872, at)  # 9000 held, 1000 free
    eff = h.submit("a", tokens=901, at=3.0)  # needs 1001
    assert [p.request_id for p in of(eff, fx.PreemptBatch)] == ["b2"]
    assert [e.request_id for e in of(eff, fx.Admit)] == ["r1"]


def test_batch_keeps_the_slowdown_bound_up_to_exactly_its_limit() -> None:
    """``max_decode_slowdown`` admits a decode step of exactly ``1 + slowdown`` times the Programs' alone."""
    # steps of 0.25 s + 0.25 s per request, context free: exact in binary floating point
    model = DecodeThroughputModel(0.25, 0.25, 0.0)
    h = harness(
        token_capacity_per_dp_rank=100_000,
        decode_throughput_model=model,
        batch=BatchJobsConfig(enabled=True, max_decode_slowdown=1.0),
    )
    h.submit("a", tokens=1_000)  # alone: a step of 0.5 s, so batch may take it to 1.0 s
    for i in range(3):
        h.submit_batch(f"b{i}", tokens=10, at=1.0)
    # b1 makes 0.25 + 3 x 0.25 = 1.0 s (allowed); b2 would make 1.25 s
    assert h.rank().batch_requests == 2 and list(h.state.batch.pending) == ["b2"]  # type: ignore[union-attr]


def test_an_interactive_claim_on_a_rank_holds_batch_back() -> None:
    """A rank claimed by a waiting interactive request counts it as used in the batch budget (docs/priority.md §2)."""
    h = harness(token_capacity_per_dp_rank=1_000)
    h.submit("a", tokens=500)  # 600
    h.feed(InteractiveSubmitted(RequestId("i1"), 700, max_tokens=100), at=1.0)  # 800 > 400 free: claims
    assert h.rank().interactive_claim_tokens == 800
    assert admitted_ids(h.submit_batch("x", tokens=100, at=1.0)) == []  # 228 would fit the 400 free
    assert bc.rank_budget_tokens(h.state, h.rank()) == 0


def test_a_rank_whose_engine_queue_is_full_is_offered_last() -> None:
    """A closed rank offers no budget: an idle one takes its lone request only after the open ranks refused it."""
    h = harness(n_targets=2)
    h.observe(1, 0.0, 0, 48, at=0.0)  # rank 1: 48 requests in its engine queue, nothing on the ledger
    assert admitted_ids(h.submit_batch("b0", tokens=1_000, at=0.0)) == ["b0"]
    assert admitted_ids(h.submit_batch("b1", tokens=1_000, at=0.0)) == ["b1"]
    b = h.state.batch
    assert b is not None and [b.running[r].target_id for r in ("b0", "b1")] == [tid(0), tid(0)]


def test_a_lane_with_nothing_queued_is_dropped() -> None:
    """The batch queue keeps a lane only while a request of its (priority, tenant) waits (bounded memory)."""
    h = harness()
    h.submit_batch("big", tokens=9_500, max_tokens=10)
    h.feed(BatchSubmitted(RequestId("q"), "j", 1_000, None, tenant="t"))
    b = h.state.batch
    assert b is not None and list(b.queue.lanes) == [(0, "t")]
    h.abandon("q")
    assert b.queue.lanes == {} and len(b.queue) == 0


def test_a_higher_priority_batch_request_is_dispatched_first() -> None:
    """Inside the batch class the lane of the larger priority is asked first, whatever the arrival order."""
    h = harness()
    h.submit_batch("big", tokens=9_500, max_tokens=10, at=0.0)
    h.feed(BatchSubmitted(RequestId("low"), "j", 1_000, None, priority=0), at=1.0)
    h.feed(BatchSubmitted(RequestId("high"), "j", 1_000, None, priority=5), at=2.0)
    assert admitted_ids(h.complete("big", completion=10, finish_reason="length", at=3.0)) == ["high", "low"]


def test_the_decode_rate_is_measured_from_dispatch_to_completion() -> None:
    """A batch request's observed rate is its completion tokens over the seconds since its dispatch."""
    h = harness()
    h.submit_batch("a", tokens=10, at=1.0)
    h.complete("a", completion=100, finish_reason="stop", at=3.0)
    b = h.state.batch
    assert b is not None and (b.decode_rate, b.decoded_tokens_total, b.decode_seconds_total) == (50.0, 100, 2.0)
    assert bc.batch_diagnostics(h.state)["decode_tokens_per_second"] == 50.0


def test_the_slowdown_bound_prices_the_programs_context_to_the_token() -> None:
    """The Programs' step alone is priced on exactly their context tokens: one token more batch context is refused."""
    # 0.25 s per step plus 1/4096 s per context token (0.25 s = 1024 tokens' worth): exact in binary
    model = DecodeThroughputModel(0.25, 0.0, 2.0**-12)

    def second_request_runs(prompt: int) -> bool:
        h = harness(
            token_capacity_per_dp_rank=100_000,
            decode_throughput_model=model,
            batch=BatchJobsConfig(enabled=True, max_decode_slowdown=1.0),
        )
        h.submit("a", tokens=1_000)  # 1,000 tokens of context: a step of (1024 + 1000) / 4096 s
        assert admitted_ids(h.submit_batch("b0", tokens=872, at=1.0)) == ["b0"]  # 1,000 tokens
        return admitted_ids(h.submit_batch("b1", tokens=prompt, at=1.0)) == ["b1"]

    # with b0 and b1 the step may reach 2 x 2024 / 4096 s: b1 may bring up to 2024 - 1000 = 1024 tokens
    assert second_request_runs(1024 - 128)
    assert not second_request_runs(1025 - 128)


# ---- fairness, counters, topology --------------------------------------------------------------


def test_a_tenants_dispatch_counts_but_not_its_abandoned_or_rejected_requests() -> None:
    """The tenant's ``dispatched`` count grows at a batch dispatch, not at an abandon or a refusal."""
    h = harness()
    h.feed(BatchSubmitted(RequestId("big"), "j", 9_500, 10, tenant="t"), at=0.0)
    a = h.state.fair.accounts["t"]
    assert (a.dispatched, a.waiting) == (1, 0)
    h.feed(BatchSubmitted(RequestId("q1"), "j", 1_000, None, tenant="t"), at=1.0)
    h.abandon("q1", at=2.0)
    h.feed(BatchSubmitted(RequestId("q2"), "j", 1_000, None, tenant="t"), at=3.0)
    (rej,) = of(h.feed(TargetsChanged(POOL, ()), at=4.0), fx.Reject)
    assert rej.request_id == "q2"
    assert (a.dispatched, a.waiting) == (1, 0)


def test_the_least_served_tenants_lane_is_asked_first() -> None:
    """At equal priority the lane of the tenant with the lower fairness counter goes first (docs/priority.md §3)."""
    h = harness()
    h.feed(BatchSubmitted(RequestId("big"), "j", 9_500, 10, tenant="a"), at=0.0)  # a is served 9,500
    h.feed(BatchSubmitted(RequestId("qa"), "j", 1_000, None, tenant="a"), at=1.0)
    h.feed(BatchSubmitted(RequestId("qb"), "j", 1_000, None, tenant="b"), at=2.0)
    assert admitted_ids(h.complete("big", completion=10, finish_reason="length", at=3.0)) == ["qb", "qa"]


def test_lanes_of_equally_served_tenants_go_in_tenant_name_order() -> None:
    """At equal priority and counters the lanes are asked in tenant-name order, not in arrival order."""
    h = harness()
    h.feed(BatchSubmitted(RequestId("big"), "j", 9_500, 10, tenant="c"), at=0.0)
    h.feed(BatchSubmitted(RequestId("qb"), "j", 1_000, None, tenant="b"), at=1.0)
    h.feed(BatchSubmitted(RequestId("qa"), "j", 1_000, None, tenant="a"), at=2.0)
    assert admitted_ids(h.complete("big", completion=10, finish_reason="length", at=3.0)) == ["qa", "qb"]


def test_a_late_completion_charges_its_tenant_the_prompt_and_the_output_and_forgets_the_job() -> None:
    """A preempted request whose answer completed anyway is charged as served and, last of its job, ends the job."""
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0))
    h.feed(BatchSubmitted(RequestId("b"), "late", 2872, None, preemptible=True, tenant="t"), at=0.0)
    h.feed(BatchSubmitted(RequestId("c"), "j", 2872, None, tenant="t"), at=0.0)
    h.feed(BatchSubmitted(RequestId("d"), "j", 2872, None, tenant="t"), at=0.0)
    a = h.state.fair.accounts["t"]
    assert [p.request_id for p in of(h.submit("a", tokens=3900, at=1.0), fx.PreemptBatch)] == ["b"]
    assert a.input_tokens == 2 * 2872  # the preempted request's prompt is refunded
    h.complete("b", at=2.0, completion=10)
    assert (a.input_tokens, a.output_tokens, a.dispatched) == (3 * 2872, 10, 4)  # dispatched: b twice, c, d
    assert sorted(h.state.batch.jobs) == ["j"]  # type: ignore[union-attr]


def test_diagnostics_count_submitted_and_failed_requests_per_job() -> None:
    """The per-job counters count every submission and every unsuccessful completion."""
    h = harness()
    h.submit_batch("x", job="j", tokens=100)
    h.submit_batch("y", job="j", tokens=100)
    h.complete("x", success=False, at=1.0)
    (job,) = bc.batch_diagnostics(h.state)["jobs"]  # type: ignore[misc]
    assert (job["submitted"], job["admitted"], job["completed"], job["failed"], job["running"]) == (2, 2, 0, 1, 1)


def test_growth_before_any_completion_reserves_the_whole_predicted_decode() -> None:
    """With no batch completion yet the progress rate is 0: a running request grows by all its prediction."""
    h = harness()
    h.submit_batch("b", tokens=100, at=0.0)  # 128 predicted
    h.observe(0, 0.01, 1, 0, at=5.0)
    assert bc.decode_growth_tokens(h.state, h.rank()) == 128.0


def test_a_batch_request_ending_after_its_rank_left_and_came_back_releases_nothing() -> None:
    """A running batch request whose rank left the topology is off every ledger, the rank's new one too."""
    h = harness()
    h.submit_batch("b", tokens=100)
    h.feed(TargetsChanged(POOL, ()), at=1.0)
    h.feed(TargetsChanged(POOL, targets(1)), at=2.0)
    h.complete("b", at=3.0, completion=10, finish_reason="stop")
    assert (h.rank().batch_tokens, h.rank().batch_requests) == (0.0, 0)


def test_preemption_serves_the_first_waiting_program_of_the_rank_in_resume_order() -> None:
    """Per rank only the first waiting Program in resume order is preempted for; one behind it preempts nothing."""
    h = harness(resume_order="fcfs", batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.5))
    for i, at in enumerate((0.0, 1.0, 2.0)):
        preemptible(h, f"b{i}", 2872, at)  # 9000 held, 4000 above the share
    assert of(h.submit("a", tokens=6900, at=3.0), fx.PreemptBatch) == []  # deficit 6000: not coverable
    eff = h.submit("b", tokens=1900, at=4.0)  # deficit 1000 would be, but "a" is first
    assert of(eff, fx.PreemptBatch) == [] and h.program("b").state == "paused"


def test_an_engine_queue_gate_of_one_request_is_on() -> None:
    """``engine_queue_requests`` 1 shuts the gate at one waiting engine request (only 0 turns it off)."""
    h = harness(batch=BatchJobsConfig(enabled=True, engine_queue_requests=1))
    h.observe(0, 0.0, 0, 1, at=0.0)
    assert bc.engine_queue_full(h.state, h.rank())


def test_a_batch_request_for_a_pool_without_targets_is_refused_with_503() -> None:
    """A batch request whose model pool has no target is answered 503 at once and not queued."""
    h = harness()
    (rej,) = of(h.feed(BatchSubmitted(RequestId("b"), "j", 100, None, model_pool="other")), fx.Reject)
    assert (rej.request_id, rej.status_hint) == ("b", 503)
    assert h.state.batch.pending == {} and len(h.state.batch.queue) == 0  # type: ignore[union-attr]


def test_the_batch_kv_share_counts_the_new_requests_tokens() -> None:
    """``batch.max_kv_share`` admits a batch request only while the class's tokens plus its own fit the share."""
    h = harness(priority=PriorityConfig(batch=ClassLimits(max_kv_share=0.5)))
    assert admitted_ids(h.submit_batch("b0", tokens=2_872, at=0.0)) == ["b0"]  # 3000
    assert admitted_ids(h.submit_batch("b1", tokens=2_000, at=0.0)) == []  # 3000 + 2128 > 5000
    assert admitted_ids(h.submit_batch("b2", tokens=1_872, at=0.0)) == []  # head of line: b1 waits first
    assert h.rank().batch_requests == 1


def test_backlogged_batch_work_claims_its_unused_share_from_program_admission() -> None:
    """While batch work waits, Program admission leaves batch the unused part of its guaranteed share."""
    h = harness(batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.5))
    h.submit("a", tokens=3_000)  # 3100
    h.submit_batch("q", tokens=8_000, at=1.0)  # 8128: above the budget, the rank is not idle: it waits
    assert h.rank().batch_claim_tokens == 5_000.0
    h.submit("b", tokens=2_000, at=2.0)  # 2100 fits the 6900 free, not beside the 5000 claim
    assert h.program("b").state == "paused"


def test_a_stale_observation_reserves_no_growth() -> None:
    """Once the observation is stale the fallback ledger holds every request at its predicted size: no growth."""
    h = harness()
    h.submit_batch("a", job="j", tokens=100, at=0.0)
    h.complete("a", at=2.0, completion=100, finish_reason="stop")
    h.submit_batch("b", job="j", tokens=1000, at=2.0)
    h.observe(0, 0.125, 1, 0, at=3.0)
    assert bc.decode_growth_tokens(h.state, h.rank()) == 50.0
    h.tick(at=10.0)
    assert bc.decode_growth_tokens(h.state, h.rank()) == 0.0


def test_the_decode_step_of_a_rank_counts_its_programs_context() -> None:
    """A rank's decode step prices its active Programs' context beside its batch requests'."""
    h = harness(token_capacity_per_dp_rank=1_000_000)
    h.submit("a", tokens=20_000)
    h.submit_batch("b", tokens=1_000)
    model = h.cfg.decode_throughput_model
    assert bc.rank_decode_step(h.state, h.rank()) == decode_step_seconds(2, 20_000 + 1_128, model)
