"""Completion bookkeeping, TTL arming/expiry, timers, cancellation, retention and fencing
(docs/program-scheduling.md §1, §2.2, §4, §5)."""

from __future__ import annotations

import pytest
from core_support import POOL, Harness, Ident, admitted, of, reasons, targets, tid

from actors.core import effects as fx
from actors.core.events import ACTING_TTL, PAUSED_RETENTION, QUEUE_TIMEOUT, TargetsChanged
from actors.core.ids import ProgramKey, redacted_id
from actors.core.invariants import check
from actors.core.model import RequestHints


def test_core_kv_retention_ttl_hint_overrides_fitted_ttl_once() -> None:
    h = Harness()
    h.submit("a", hints=RequestHints(kv_retention_ttl_seconds=4.5))
    eff = h.complete("r1", at=1.0, prompt=100)
    (armed,) = of(eff, fx.TtlArmed)
    assert (armed.ttl_seconds, armed.source) == (4.5, "request_hint")
    assert [(a.kind, a.deadline) for a in of(eff, fx.ArmTimer)] == [(ACTING_TTL, 5.5)]
    assert h.program("a").lifecycle == "active_acting"
    h.submit("a", at=2.0)  # the next request has no hint: fitted TTL (0 in warm-up)
    eff = h.complete("r2", at=3.0, prompt=110, cached=100)
    assert of(eff, fx.TtlArmed)[0].source == "fitted"
    assert reasons(eff) == ["ttl_expired"]


def test_core_hint_ttl_is_not_capped_by_max_acting_ttl() -> None:
    h = Harness(max_acting_ttl_seconds=1.0)
    h.submit("a", hints=RequestHints(kv_retention_ttl_seconds=30.0))
    assert of(h.complete("r1", at=1.0), fx.TtlArmed)[0].ttl_seconds == 30.0


def test_core_acting_ttl_timer_expires_exactly_and_stale_token_is_dropped() -> None:
    h = Harness()
    h.submit("a", hints=RequestHints(kv_retention_ttl_seconds=5.0))
    (arm,) = of(h.complete("r1", at=1.0), fx.ArmTimer)
    assert h.fire(arm.program, ACTING_TTL, arm.token + 99, at=6.0) == ()  # stale token: no effect
    assert h.program("a").lifecycle == "active_acting"
    eff = h.fire(arm.program, ACTING_TTL, arm.token, at=6.0)
    assert reasons(eff) == ["ttl_expired"]
    assert h.fire(arm.program, ACTING_TTL, arm.token, at=6.5) == ()  # already consumed
    assert list(h.rank().factors.ttl_pause_rounds) == [1]


def test_core_arrival_rescues_acting_program_before_expiry_and_cancels_timer() -> None:
    h = Harness()
    h.submit("a", hints=RequestHints(kv_retention_ttl_seconds=5.0))
    (arm,) = of(h.complete("r1", at=1.0), fx.ArmTimer)
    eff = h.submit("a", at=3.0)
    assert admitted(eff) == ["r2"]
    assert fx.CancelTimer(arm.program, ACTING_TTL) in eff
    assert h.fire(arm.program, ACTING_TTL, arm.token, at=6.0) == ()


def test_core_failed_completion_pauses_with_request_failed() -> None:
    h = Harness()
    h.submit("a")
    eff = h.complete("r1", at=1.0, success=False)
    assert reasons(eff) == ["request_failed"]
    assert of(eff, fx.TtlArmed) == []
    assert len(h.rank().factors.requests) == 0  # no sample for failures


def test_core_abandon_in_flight_is_a_failed_completion_and_exactly_once() -> None:
    h = Harness()
    h.submit("a")
    assert reasons(h.abandon("r1", at=1.0)) == ["request_failed"]
    assert of(h.complete("r1", at=2.0), fx.CompletionIgnored)[0].reason == "unknown_request"
    assert h.abandon("r1", at=3.0) == ()
    assert h.program("a").in_flight == 0
    assert check(h.state, h.cfg) == []


def test_core_queue_timeout_rejects_with_429() -> None:
    h = Harness(max_active_programs_per_target=1, queue_timeout_seconds=50.0, force_resume_timeout_seconds=50.0)
    h.submit("a")
    h.observe(0, kv=0.1, running=1, waiting=3, at=0.0)  # gate closed
    h.submit("b", at=1.0)
    qt = [e for e in h.log if isinstance(e, fx.ArmTimer) and e.kind == QUEUE_TIMEOUT]
    assert [(e.program.program_id, e.deadline) for e in qt] == [("b", 51.0)]
    h.observe(0, kv=0.1, running=1, waiting=3, at=49.0, epoch=2)
    eff = h.fire(qt[0].program, QUEUE_TIMEOUT, qt[0].token, at=51.0)
    (rej,) = of(eff, fx.Reject)
    assert (rej.request_id, rej.reason, rej.status_hint) == ("r2", "queue_timeout", 429)
    assert h.program("b") is None  # never completed: the transient Program is released
    assert check(h.state, h.cfg) == []


def test_core_queue_timeout_fires_at_the_earliest_deadline_of_a_programs_waiters() -> None:
    """docs/program-scheduling.md §5: each waiting request leaves at its own queue deadline; a
    later request with a short deadline behind the front is refused at that deadline, the front
    waits on."""
    h = Harness(max_active_programs_per_target=1)
    h.submit("a")
    h.submit("b", at=1.0)  # front: queue deadline 601
    h.submit("b", at=2.0, hints=RequestHints(deadline_seconds=5.0))  # queue deadline 7
    qt = [e for e in h.log if isinstance(e, fx.ArmTimer) and e.kind == QUEUE_TIMEOUT]
    assert qt[-1].deadline == 7.0
    eff = h.tick(at=8.0)  # the queue-timeout timer fired at 7
    assert [(r.request_id, r.reason) for r in of(eff, fx.Reject)] == [("r3", "queue_timeout")]
    assert h.state.pool.get("r2") is not None
    assert check(h.state, h.cfg) == []


def test_core_request_deadline_shortens_but_never_extends_queue_timeout() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a")
    h.observe(0, kv=0.1, running=1, waiting=3, at=0.0)
    h.submit("b", at=1.0, hints=RequestHints(deadline_seconds=2.0))
    h.submit("c", at=1.0, hints=RequestHints(deadline_seconds=9999.0))
    assert h.state.pool.get("r2").queue_deadline == 3.0  # type: ignore[union-attr]
    assert h.state.pool.get("r3").queue_deadline == 601.0  # type: ignore[union-attr]
    h.observe(0, kv=0.1, running=1, waiting=3, at=2.9, epoch=2)
    # the hint's deadline is due at 3.0: forced through the gate (docs/program-scheduling.md §10, D6 fix)
    eff = h.tick(at=3.0)
    assert admitted(eff) == ["r2"] and of(eff, fx.Reject) == []


def test_core_cancel_waiting_request_keeps_fifo_of_others() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("x")
    h.submit("a", at=1.0)
    h.submit("a", at=2.0)
    h.submit("a", at=3.0)
    h.abandon("r3", at=4.0)  # middle of the FIFO
    assert [r.request_id for r in h.state.pool.requests(h.program("a").ref)] == ["r2", "r4"]
    eff = h.complete("r1", at=5.0, prompt=100)
    assert admitted(eff) == ["r2", "r4"]  # FIFO order


def test_core_cancel_last_waiter_of_completed_program_pauses_it() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a")
    h.complete("r1", at=1.0, prompt=100)  # a paused (completed once)
    h.submit("x", at=1.5)  # x takes the slot
    h.submit("a", at=2.0)  # waits
    h.abandon("r3", at=3.0)
    p = h.program("a")
    assert p is not None and p.lifecycle == "paused_acting"
    assert h.state.rank_queues == {}
    assert check(h.state, h.cfg) == []


def test_core_paused_retention_releases_idle_program_and_new_generation_follows() -> None:
    h = Harness(paused_retention_ttl_seconds=100.0)
    h.submit("a")
    eff = h.complete("r1", at=1.0, prompt=100)
    (arm,) = [e for e in of(eff, fx.ArmTimer) if e.kind == PAUSED_RETENTION]
    assert arm.deadline == 101.0
    early = h.fire(arm.program, PAUSED_RETENTION, arm.token, at=100.0)  # delivered early: re-armed only
    assert [(type(e), e.deadline) for e in early] == [(fx.ArmTimer, 101.0)]
    eff = h.tick(at=101.0)
    assert reasons(eff) == ["paused_retention_release"]
    assert of(eff, fx.RetireProgram)[0].program == arm.program
    assert h.state.last_generations[ProgramKey(POOL, "a")] == 0
    assert of(h.submit("a", at=102.0), fx.SpawnProgram)[0].program.generation == 1
    ref0, ref1 = arm.program, h.program("a").ref
    assert redacted_id(ref0) != redacted_id(ref1) and len(redacted_id(ref0)) == 16


def test_core_released_generation_history_is_pruned_after_retention() -> None:
    h = Harness(paused_retention_ttl_seconds=10.0)
    h.submit("a")
    h.complete("r1", at=1.0, prompt=100, terminate=True)
    assert ProgramKey(POOL, "a") in h.state.last_generations
    h.tick(at=60.0)
    assert ProgramKey(POOL, "a") in h.state.last_generations  # max(10, 60) s not yet over
    h.tick(at=61.0)
    assert ProgramKey(POOL, "a") not in h.state.last_generations
    assert of(h.submit("a", at=62.0), fx.SpawnProgram)[0].program.generation == 0  # B12: safe by epoch


def test_core_omitted_step_id_advances_previous() -> None:
    h = Harness()
    h.submit("a", ident=Ident("a", step_id=7))
    assert h.program("a").step_id == 7
    h.submit("a", at=1.0)
    assert h.program("a").step_id == 8


def test_core_missing_cached_usage_never_becomes_shared_prefix_evidence() -> None:
    h = Harness()
    h.submit("a", tokens=1000)
    eff = h.complete("r1", at=1.0, prompt=1000)  # no cached field
    p = h.program("a")
    assert p.shared_prefix_tokens == 0 and p.shared_prefix_observed
    assert of(eff, fx.SharedPrefixObserved) == []


def test_core_shared_prefix_measured_at_segment_start_and_kept_within_placement() -> None:
    h = Harness()
    hold = RequestHints(kv_retention_ttl_seconds=100.0)
    h.submit("a", tokens=1000, hints=hold)
    eff = h.complete("r1", at=1.0, prompt=1000, cached=400)
    assert of(eff, fx.SharedPrefixObserved) == [fx.SharedPrefixObserved(tid(0), 400)]
    p = h.program("a")
    assert p.shared_prefix_tokens == 400
    assert p.shared_prefix_fresh_until == 0.0 + 100.0  # anchor (creation) + warm-up freshness
    # private tokens now exclude the shared prefix: 1000 - 400 + 100
    assert h.rank().fallback_tokens == 700.0
    # low cache hit without a placement restart: segment and first observation are kept
    h.submit("a", tokens=1200, at=2.0, hints=hold)
    eff = h.complete("r2", at=3.0, prompt=1200, cached=10)
    (disc,) = of(eff, fx.CacheDiscontinuity)
    assert (disc.prompt_tokens, disc.cached_prompt_tokens, disc.previous_context_tokens) == (1200, 10, 1000)
    assert p.shared_prefix_tokens == 400
    assert p.segment_served_rounds == 2
    assert p.rounds_since_activation == 1  # the discontinuous round is not counted


def test_core_context_estimate_shrinks_only_after_two_confirmations() -> None:
    h = Harness()
    hold = RequestHints(kv_retention_ttl_seconds=100.0)
    h.submit("a", tokens=1000, hints=hold)
    h.complete("r1", at=1.0, prompt=1000)
    h.submit("a", tokens=10, at=2.0, hints=hold)
    h.complete("r2", at=3.0, prompt=600)
    assert h.program("a").estimated_context_tokens == 1000  # one smaller reading is not enough
    h.submit("a", tokens=10, at=4.0, hints=hold)
    h.complete("r3", at=5.0, prompt=600)
    assert h.program("a").estimated_context_tokens == 600
    assert check(h.state, h.cfg) == []


def test_core_completion_of_invalidated_placement_is_fenced() -> None:
    h = Harness(n_targets=2, binding_strategy="program_round_robin")
    h.submit("a")  # rank 0
    eff = h.feed(TargetsChanged(POOL, targets(2)[1:]), at=1.0)  # rank 0 removed
    assert "health_failover" in reasons(eff)
    p = h.program("a")
    assert p.lifecycle == "paused_acting"  # B6 fix: reclaimable
    assert p.home_target == p.last_target == tid(1)  # rebound
    eff = h.complete("r1", at=2.0, prompt=100)
    assert of(eff, fx.CompletionIgnored)[0].reason == "stale_placement"
    assert h.program("a").completed_requests == 0
    assert check(h.state, h.cfg) == []


def test_core_removed_target_requeues_waiting_program_on_new_binding() -> None:
    h = Harness(n_targets=2, binding_strategy="program_round_robin", max_active_programs_per_target=1)
    h.submit("a")  # rank 0
    h.submit("b")  # rank 1
    h.submit("c")  # rank 0, waits
    h.feed(TargetsChanged(POOL, targets(2)[1:]), at=1.0)
    c = h.program("c")
    assert c.last_target == tid(1) and c.queued_in == ("rank", tid(1))
    assert h.program("a").lifecycle == "paused_acting"
    assert check(h.state, h.cfg) == []


def test_core_stale_timer_of_old_generation_is_dropped() -> None:
    h = Harness()
    h.submit("a", hints=RequestHints(kv_retention_ttl_seconds=5.0))
    (arm,) = of(h.complete("r1", at=1.0, terminate=True), fx.ArmTimer) or [None]  # released: no timer
    assert arm is None
    h.submit("a", at=2.0, hints=RequestHints(kv_retention_ttl_seconds=5.0))
    (arm2,) = of(h.complete("r2", at=3.0), fx.ArmTimer)
    old = arm2.program._replace(generation=0)
    assert h.fire(old, ACTING_TTL, arm2.token, at=8.0) == ()
    assert h.program("a").lifecycle == "active_acting"


@pytest.mark.parametrize("binding_only", [True])
def test_core_binding_only_reactivates_on_last_target_without_checks(binding_only: bool) -> None:
    h = Harness(binding_only=binding_only, max_active_programs_per_target=1)
    h.submit("a")
    assert admitted(h.submit("b", at=1.0)) == ["r2"]  # no count guard
    eff = h.complete("r1", at=2.0, prompt=100)
    assert reasons(eff) == ["ttl_expired"]  # TTL still runs (0 in warm-up)
    assert of(eff, fx.AdmissionCapacitySnapshot) == []
    assert admitted(h.submit("a", at=3.0)) == ["r3"]
    assert check(h.state, h.cfg) == []


def test_core_pool_losing_every_target_rejects_waiting_requests_with_503() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a")
    h.submit("b", at=1.0)  # waits
    eff = h.feed(TargetsChanged(POOL, ()), at=2.0)
    assert [(r.request_id, r.status_hint) for r in of(eff, fx.Reject)] == [("r2", 503)]
    assert h.program("b") is None and len(h.state.pool) == 0
    assert h.program("a").lifecycle == "paused_acting" and h.program("a").last_target is None
    assert check(h.state, h.cfg) == []
    h.feed(TargetsChanged(POOL, targets(1)), at=3.0)  # targets come back: a is re-bound
    assert h.program("a").last_target == tid(0)
    assert admitted(h.submit("a", at=4.0)) == ["r3"]


def test_core_timers_stay_one_per_kind_under_churn() -> None:
    h = Harness(paused_retention_ttl_seconds=1e6)
    for i in range(3000):  # 3000 pauses of one Program: each re-arms the same retention kind
        h.submit("a", at=float(i))
        h.complete(f"r{i + 1}", at=i + 0.5, prompt=100)
    p = h.program("a")
    assert p.lifecycle == "paused_acting"
    assert list(p.timers) == [PAUSED_RETENTION]  # the core keeps one deadline per kind
    assert list(h.timers) == [(p.ref, PAUSED_RETENTION)]  # and so does the Program actor
    (arm,) = [e for e in h.log if isinstance(e, fx.ArmTimer) and e.kind == PAUSED_RETENTION][-1:]
    assert reasons(h.tick(at=arm.deadline)) == ["paused_retention_release"]  # released on time
    assert h.program("a") is None


def test_core_released_history_is_pruned_in_release_order() -> None:
    h = Harness(paused_retention_ttl_seconds=10.0)
    for i, name in enumerate(["a", "b", "c"]):
        h.submit(name, at=float(i))
        h.complete(f"r{i + 1}", at=i + 0.5, prompt=100, terminate=True)  # released at 0.5, 1.5, 2.5
    h.submit("a", at=3.0)
    h.complete("r4", at=3.5, prompt=100, terminate=True)  # re-released: moves behind b and c
    assert list(h.state.released_at) == [ProgramKey(POOL, "b"), ProgramKey(POOL, "c"), ProgramKey(POOL, "a")]
    h.tick(at=63.0)  # keep = max(10, 60) s: b (1.5) and c (2.5) are forgotten, a (3.5) is not
    assert list(h.state.released_at) == [ProgramKey(POOL, "a")]
    assert set(h.state.last_generations) == {ProgramKey(POOL, "a")}
    assert check(h.state, h.cfg) == []


def test_core_warm_up_ttl_is_fitted_on_the_intervals_of_all_ranks() -> None:
    from actors.core.stats import fit_ttl

    h = Harness(n_targets=2, stats_window_size=4, max_acting_ttl_seconds=10.0)
    names = ["p0", "p1", "p2", "p3", "p4", "p5"]
    for n in names:
        h.submit(n, at=0.0)
    by_rank: dict[str, list[str]] = {}
    for n in names:
        by_rank.setdefault(h.program(n).placement, []).append(n)
    assert len(by_rank) == 2  # programs on both ranks
    a, b = (v[0] for _, v in sorted(by_rank.items()))
    t = 1.0
    intervals = {a: [0.1, 0.4], b: [0.2, 0.3]}
    log = []
    for prog in (a, b):
        for gap in intervals[prog]:
            # complete the program's in-flight request, then come back after `gap`
            (inflight,) = [r for r, d in h.state.in_flight.items() if d.ref.program_id == prog]
            eff = h.complete(str(inflight), at=t, prompt=30000)
            armed = of(eff, fx.TtlArmed)
            log.append(armed[0].ttl_seconds if armed else None)
            t += gap
            h.submit(prog, at=t)
            t += 0.25
    assert all(x in (0.0, None) for x in log)  # warm-up: no window is full yet
    own = h.state.ranks[h.program(a).placement].factors
    assert len(own.continuities) == 2 and not own.continuity_window_complete
    assert len(h.state.warm_factors.continuities) == 4
    (inflight,) = [r for r, d in h.state.in_flight.items() if d.ref.program_id == a]
    eff = h.complete(str(inflight), at=t, prompt=30000)
    (armed,) = of(eff, fx.TtlArmed)
    mu, sigma = h.state.warm_factors.log_interval_fit()
    impact = h.program(a).last_cache_miss_impact_seconds
    assert armed.ttl_seconds == pytest.approx(fit_ttl(mu, sigma, impact, 10.0))
    assert armed.ttl_seconds > 0.0  # the reference would arm 0 here (rank window 2 of 4)
    assert check(h.state, h.cfg) == []


@pytest.mark.parametrize(("resume_cached", "expect_hold"), [(0, True), (30000, False)])
def test_core_ttl_fit_weighs_the_cache_kept_across_pauses(resume_cached: int, expect_hold: bool) -> None:
    # one rank, window 3: warm-up pauses after every completion; each return is a placement start
    h = Harness(stats_window_size=3, max_acting_ttl_seconds=10.0)
    h.submit("a", at=0.0)
    t = 1.0
    for i, gap in enumerate([0.1, 0.4, 0.2]):
        (inflight,) = list(h.state.in_flight)
        h.complete(str(inflight), at=t, prompt=30000, cached=0 if i == 0 else resume_cached)
        t += gap
        h.submit("a", at=t)
        t += 0.25
    (inflight,) = list(h.state.in_flight)
    eff = h.complete(str(inflight), at=t, prompt=30000, cached=resume_cached)
    assert h.state.resume_hits.complete
    assert h.state.resume_hits.miss_ratio() == (1.0 if expect_hold else 0.0)
    (armed,) = of(eff, fx.TtlArmed)
    # engine kept everything across pauses: holding capacity buys nothing, TTL 0
    assert (armed.ttl_seconds > 0.0) is expect_hold


def test_core_expected_resume_false_ends_the_program_at_completion() -> None:
    """A request that says ``expected_resume: false`` (a blocking subagent's default) ends its
    Program when it completes: no acting TTL, its capacity released, the next request a new
    generation (the reference's 0.1.17 binary; docs/program-scheduling.md §1, §10 B15)."""
    h = Harness(paused_retention_ttl_seconds=100.0)
    h.submit("sub", expected_resume=False)
    ref = h.program("sub").ref
    eff = h.complete("r1", at=1.0, prompt=100)
    assert of(eff, fx.ArmTimer) == []
    assert [e.program for e in of(eff, fx.RetireProgram)] == [ref]
    assert check(h.state, h.cfg) == []
    (spawn,) = of(h.submit("sub", at=2.0, expected_resume=False), fx.SpawnProgram)
    assert spawn.program.generation == ref.generation + 1


def test_core_expected_resume_false_waits_for_a_queued_request_that_resumes() -> None:
    """Only the latest request's ``expected_resume`` counts, and only when the Program is idle."""
    h = Harness()
    h.submit("sub", expected_resume=False)
    h.submit("sub", at=0.5)  # expected_resume true again: queued behind r1
    eff = h.complete("r1", at=1.0, prompt=100)
    assert of(eff, fx.RetireProgram) == []
    eff = h.complete("r2", at=2.0, prompt=120)
    assert of(eff, fx.RetireProgram) == []  # the latest request expects to resume: acting TTL
    assert h.program("sub").lifecycle in ("active_acting", "paused_acting")  # not ended
    assert check(h.state, h.cfg) == []


def test_core_a_pause_restarts_the_shared_prefix_freshness_window() -> None:
    """A pause shifts the shared prefix's freshness window to start at the pause (docs/program-scheduling.md §2.2)."""
    h = Harness()
    h.submit("a", tokens=1000, hints=RequestHints(kv_retention_ttl_seconds=5.0))
    eff = h.complete("r1", at=1.0, prompt=1000, cached=400)
    assert of(eff, fx.CacheDiscontinuity) == []  # a placement's first request is no break inside it
    p = h.program("a")
    assert (p.shared_prefix_tokens, p.shared_prefix_freshness_anchor_at, p.shared_prefix_fresh_until) == (
        400,
        0.0,
        100.0,
    )
    h.tick(at=50.0)  # the acting TTL expired at 6 s: paused then
    assert (p.state, p.paused_at) == ("paused", 6.0)
    assert (p.shared_prefix_freshness_anchor_at, p.shared_prefix_fresh_until) == (6.0, 106.0)
    # the next placement starts without its cache at 104 s: the 400 measured at 1 s is still fresh
    assert admitted(h.submit("a", tokens=1100, at=103.0)) == ["r2"]
    eff = h.complete("r2", at=104.0, prompt=1100, cached=300)
    assert of(eff, fx.SharedPrefixObserved) == of(eff, fx.CacheDiscontinuity) == []
    assert p.shared_prefix_tokens == 400
    # its fitted TTL is 0 (warm-up): it paused again at 104 s, and the window moved with it
    assert (p.state, p.shared_prefix_freshness_anchor_at, p.shared_prefix_fresh_until) == ("paused", 104.0, 204.0)


def test_core_each_dispatched_request_reserves_its_own_expected_output() -> None:
    """Requests dispatched together each reserve their own ``expected_output_length`` (docs/priority.md §3)."""
    h = Harness(max_active_programs_per_target=1)
    h.submit("b")
    h.submit("a", at=1.0, hints=RequestHints(expected_output_length=50))
    h.submit("a", at=2.0, hints=RequestHints(expected_output_length=70))
    assert h.program("a").state == "paused"
    eff = h.complete("r1", at=4.0, terminate=True)  # b ends: a takes the rank with both requests
    assert admitted(eff) == ["r2", "r3"]
    assert [h.state.in_flight[r].reserved_output_tokens for r in ("r2", "r3")] == [50, 70]


def test_core_a_dispatch_charges_the_prompt_tokens_beyond_the_previous_context() -> None:
    """A dispatch charges the prompt beyond what its placement holds, never below 0 (docs/priority.md §3)."""
    h = Harness()
    hold = RequestHints(kv_retention_ttl_seconds=100.0)
    h.submit("a", tokens=1000, hints=hold)
    assert h.state.in_flight["r1"].input_charge == 1000  # the placement's first request: all of it
    h.complete("r1", at=1.0, prompt=1000, cached=0)
    h.submit("a", tokens=1500, at=2.0, hints=hold)
    assert h.state.in_flight["r2"].input_charge == 500  # beyond the previous context (its KV is there)
    h.complete("r2", at=3.0, prompt=1500, cached=1000)
    h.submit("a", tokens=800, at=4.0, hints=hold)
    assert h.state.in_flight["r3"].input_charge == 0  # a shorter prompt than the context held
    a = h.state.fair.accounts["default"]
    assert (a.dispatched, a.waiting) == (3, 0)


def test_core_an_admission_after_a_failover_restarts_the_round_count_and_clears_the_acting_period() -> None:
    """After a failover, the next admission starts a fresh placement: no rounds, no acting period (snapshot fields)."""
    h = Harness(n_targets=2)
    hold = RequestHints(kv_retention_ttl_seconds=100.0)
    h.submit("a", tokens=1000, hints=hold)
    h.complete("r1", at=1.0, prompt=1000, cached=0)
    h.submit("a", tokens=1100, at=2.0, hints=hold)
    h.complete("r2", at=3.0, prompt=1100, cached=1000)
    p = h.program("a")
    lost = p.placement
    assert p.rounds_since_activation == 2
    eff = h.feed(TargetsChanged(POOL, tuple(t for t in targets(2) if t.target_id != lost)), at=4.0)
    assert reasons(eff) == ["health_failover"]
    assert (p.lifecycle, p.acting_since) == ("paused_acting", 3.0)  # as it was
    assert admitted(h.submit("a", tokens=1200, at=5.0)) == ["r3"]
    assert (p.state, p.placement != lost, p.rounds_since_activation) == ("active", True, 0)
    assert (p.acting_since, p.ttl_deadline) == (None, None)


def test_core_an_ordinary_admission_clears_the_force_resume_deadline() -> None:
    """A Program admitted before its force-resume deadline gets a new deadline when it waits again, not the old one."""
    h = Harness(max_active_programs_per_target=1, force_resume_timeout_seconds=5.0)
    h.submit("a")
    h.submit("b", at=1.0)
    b = h.program("b")
    assert b.force_resume_deadline == 6.0
    assert admitted(h.complete("r1", at=3.0, terminate=True)) == ["r2"]  # a ends: b admitted, not forced
    assert (b.state, b.force_resume_deadline, b.force_resume_timeout_seconds) == ("active", None, None)
    h.complete("r2", at=4.0)  # fitted TTL 0: b pauses
    assert admitted(h.submit("a", at=10.0)) == ["r3"]
    assert admitted(h.submit("b", at=11.0)) == []  # waits again, behind a
    assert (b.state, b.force_resume_deadline) == ("paused", 16.0)
    assert h.state.forced_admissions == 0


def test_core_cancelling_the_only_waiting_request_of_a_paused_program_reports_no_pause() -> None:
    """A paused Program whose only waiting request is abandoned leaves its queue and keeps its pause (no Transition)."""
    h = Harness(max_active_programs_per_target=1)
    h.submit("b")
    h.complete("r1", at=1.0)  # fitted TTL 0: b pauses (ttl_expired)
    h.submit("a", at=2.0)  # a takes the only slot
    assert admitted(h.submit("b", at=3.0)) == []
    b = h.program("b")
    assert (b.lifecycle, b.queued_in is not None, b.last_pause_reason) == ("paused_reasoning", True, "ttl_expired")
    eff = h.abandon("r3", at=4.0)
    assert reasons(eff) == []
    assert (b.lifecycle, b.queued_in, b.paused_at, b.last_pause_reason) == ("paused_acting", None, 4.0, "ttl_expired")


def test_core_a_completion_records_its_request_sample() -> None:
    """A completion's statistics sample: queue wait, plausible context growth only, rounds since the TTL pause."""
    h = Harness()
    hold = RequestHints(kv_retention_ttl_seconds=100.0)
    h.submit("a", tokens=1000, hints=hold)
    h.complete("r1", at=1.0, prompt=1000, cached=0, completion=10)
    h.submit("a", tokens=1300, at=2.0, hints=hold)
    h.complete("r2", at=3.0, prompt=1300, cached=1000, completion=20)
    h.submit("a", tokens=5000, at=4.0, hints=hold)  # grew by more than its context: not plausible
    h.complete("r3", at=5.0, prompt=5000, cached=1300, completion=30)
    samples = list(h.rank().factors.requests)
    assert [(x.context_growth_tokens, x.rounds_since_ttl_pause, x.queue_seconds) for x in samples] == [
        (None, 1, 0.0),
        (300, 2, 0.0),
        (None, 3, 0.0),
    ]
    assert h.program("a").completed_requests == 3
