"""Admission checks and the ledger (docs/program-scheduling.md §2, §3)."""

from __future__ import annotations

import math

import pytest
from core_support import POOL, Harness, admitted, cfg, of, reasons, request_sample, targets

from actors.core import effects as fx
from actors.core.events import ObservationReceived, ObservationStarted, RepairTick, TargetsChanged
from actors.core.ids import ProgramRef, TargetId
from actors.core.invariants import check
from actors.core.ledger import (
    admission_plan,
    continuity_loss_seconds,
    estimate_batch_gain,
    private_tokens,
    waiting_gate_shut,
)
from actors.core.model import Program, RankState, RequestHints
from actors.core.snapshot import diagnostics_document, snapshot
from actors.core.stats import ProgressTtlFactors


def test_core_count_guard_never_reclaims_acting_program() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a", hints=RequestHints(kv_retention_ttl_seconds=60.0))
    h.complete("r1", at=1.0, prompt=100)
    assert h.program("a").lifecycle == "active_acting"
    eff = h.submit("b", at=2.0)
    assert admitted(eff) == []
    assert h.program("a").lifecycle == "active_acting"  # admission never evicts
    assert h.program("b").lifecycle == "paused_reasoning"


def test_core_expected_output_length_replaces_decode_buffer() -> None:
    h = Harness(token_capacity_per_dp_rank=10_000)
    eff = h.submit("a", tokens=100, hints=RequestHints(expected_output_length=200))
    (snap,) = of(eff, fx.AdmissionCapacitySnapshot)
    assert snap.required_tokens == 300.0  # 100 context + 200 expected output
    assert h.rank().fallback_tokens == 300.0  # B4 fix: charged == required
    assert snap.capacity_pressure_ratio == 0.0
    assert snap.projected_pressure_ratio == pytest.approx(300 / 10_000)


def test_core_admission_checks_the_front_requests_output_allowance() -> None:
    """docs/program-scheduling.md §1, §2: the front waiting request decides the output allowance
    the admission check requires, not the Program's latest arrival."""
    h = Harness(token_capacity_per_dp_rank=1000, low_watermark_ratio=0.5)
    assert admitted(h.submit("a", tokens=100)) == ["r1"]  # 200 private
    eff = h.submit("b", tokens=100, at=1.0, hints=RequestHints(expected_output_length=250))
    assert admitted(eff) == []  # 200 + 350 > 500
    # b's second request has no hint: the decode buffer (100) would fit, but the front's 250 decides
    eff = h.submit("b", tokens=100, at=2.0)
    assert admitted(eff) == []
    assert h.program("b").lifecycle == "paused_reasoning"
    eff = h.complete("r1", at=3.0, prompt=100)  # ttl 0 -> a pauses, b fits
    assert admitted(eff) == ["r2", "r3"]
    (snap,) = of(eff, fx.AdmissionCapacitySnapshot)
    assert snap.required_tokens == 350.0
    assert h.rank().fallback_tokens == 350.0


def test_core_token_capacity_low_watermark_blocks_then_admits_after_pause() -> None:
    h = Harness(token_capacity_per_dp_rank=1000, low_watermark_ratio=0.5)
    h.submit("a", tokens=300)  # 400 private <= 500
    eff = h.submit("b", tokens=100, at=1.0)  # 400 + 200 > 500
    assert admitted(eff) == []
    eff = h.complete("r1", at=2.0, prompt=300)  # ttl 0 -> a pauses, b fits
    assert "ttl_expired" in reasons(eff) and admitted(eff) == ["r2"]
    assert h.rank().fallback_tokens == 200.0
    assert check(h.state, h.cfg) == []


def test_core_forced_resume_goes_through_the_waiting_gate() -> None:
    """docs/program-scheduling.md §10 (D6 fix): the gate holds ordinary resumes, never a due deadline."""
    h = Harness(max_active_programs_per_target=1, force_resume_timeout_seconds=5.0)
    h.submit("a")  # occupies the only slot
    h.observe(0, kv=0.1, running=1, waiting=1, at=0.5)
    eff = h.submit("b", at=1.0)
    assert admitted(eff) == []
    assert h.program("b").force_resume_deadline == 6.0
    mark = len(h.log)
    h.observe(0, kv=0.1, running=1, waiting=1, at=5.5, epoch=2)
    assert admitted(h.log[mark:]) == []  # not forced yet: the gate holds it
    eff = h.feed(RepairTick(), at=6.0)  # the force-resume timer fires at 6.0, the gate is still closed
    assert admitted(eff) == ["r2"]
    last = [t for t in of(h.log, fx.Transition) if t.reason == "force_resume"][-1]
    assert last.forced and last.program == h.program("b").ref
    assert h.state.forced_admissions == 1


def test_core_stale_observation_never_gates() -> None:
    h = Harness(max_active_programs_per_target=4, metrics_interval_seconds=1.0)
    h.observe(0, kv=0.1, running=1, waiting=5, at=0.0)
    assert admitted(h.submit("a", at=3.0)) == []  # age 3.0 <= 3 * 1.0: fresh, gated
    assert admitted(h.submit("b", at=3.5)) == ["r1", "r2"]  # age 3.5: stale, no gate


def test_core_waiting_gate_counts_completions_since_the_observation() -> None:
    """docs/program-scheduling.md §3, §10: the scrape showed the request then waiting in the engine;
    it completed since, so the engine queues nothing now and the next request is admitted at once
    (the reference held the gate shut until the next scrape)."""
    h = Harness(metrics_interval_seconds=1.0)
    assert admitted(h.submit("a", at=0.0)) == ["r1"]
    h.observe(0, kv=0.1, running=0, waiting=1, at=0.2)  # r1 still queued in the engine at the scrape
    assert admitted(h.submit("b", at=0.3)) == []  # nothing completed since: the gate holds b
    rank = diagnostics_document(snapshot(h.state, h.cfg, 0.3))["ranks"][0]
    assert (rank["vllm_waiting_requests"], rank["completed_since_observation"], rank["waiting_gate_shut"]) == (
        1,
        0,
        True,
    )
    eff = h.complete("r1", at=0.4, prompt=100)
    assert admitted(eff) == ["r2"]  # r1's completion opens it: b need not wait for the next scrape
    rank = diagnostics_document(snapshot(h.state, h.cfg, 0.4))["ranks"][0]
    assert (rank["completed_since_observation"], rank["waiting_gate_shut"]) == (1, True)  # r2 runs now
    # r2 is in flight now: the rank is not drained, and the scrape's count stands again
    assert admitted(h.submit("c", at=0.5)) == []
    h.observe(0, kv=0.1, running=1, waiting=1, at=1.2, epoch=2)  # a new scrape starts the count again
    assert h.rank().completed_since_observation == 0


def test_core_waiting_gate_counts_a_stale_placements_requests_as_in_flight() -> None:
    """docs/program-scheduling.md §3: a failover moved the Program, but its other requests still run
    on the rank it left; that rank is not drained until they end, so the scrape's count stands."""
    h = Harness(n_targets=0, metrics_interval_seconds=1.0)
    h.feed(TargetsChanged(POOL, targets(1, "http://a") + targets(1, "http://b")), at=0.0)
    assert admitted(h.submit("a", at=0.0)) == ["r1"]
    old = h.program("a").placement
    worker = h.state.ranks[old].worker_url
    assert admitted(h.submit("a", at=0.0)) == ["r2"]
    h.feed(ObservationStarted(old, 1), at=0.1)
    h.feed(ObservationReceived(old, 1, 0.1, 1, 1))  # one of them queued in the engine
    rank = h.state.ranks[old]
    h.complete("r1", at=0.2, prompt=100)
    assert rank.completed_since_observation == 1
    assert waiting_gate_shut(rank, h.now, h.cfg)  # r2 runs: the count stands
    eff = h.submit("a", at=0.3, avoid_workers=frozenset({worker}))  # a failover of a's
    assert "health_failover" in reasons(eff) and h.program("a").placement != old
    assert rank.dispatched == 1 and not rank.active  # r2 is a stale placement's, still running
    assert waiting_gate_shut(rank, h.now, h.cfg)
    eff = h.complete("r2", at=0.4, prompt=100)
    assert of(eff, fx.CompletionIgnored) and rank.dispatched == 0
    assert not waiting_gate_shut(rank, h.now, h.cfg)  # drained: r1's completion is counted out


def test_core_threshold_zero_disables_gate() -> None:
    h = Harness(admission_waiting_request_threshold=0)
    h.observe(0, kv=0.1, running=1, waiting=50, at=0.0)
    assert admitted(h.submit("a", at=0.1)) == ["r1"]


def _mature_rank(
    capacity_rounds: tuple[int, ...], growth: int, decode: float | None, completion: int = 50
) -> RankState:
    rank = RankState(
        target_id=TargetId("t@0"), worker_url="t", dp_rank=0, index=0, factors=ProgressTtlFactors(len(capacity_rounds))
    )
    for i, r in enumerate(capacity_rounds):
        rank.factors.push_request(
            request_sample(prompt=1000, completion=completion, growth=growth, decode=decode, rounds=r, at=float(i))
        )
    return rank


def _program(pid: str, ctx: int, state: str = "paused", status: str = "reasoning") -> Program:
    p = Program(ref=ProgramRef("default", pid, 0), created_at=0.0)
    p.state, p.status = state, status
    p.estimated_context_tokens = ctx
    p.last_target = TargetId("t@0")
    return p


def _activate(rank: RankState, p: Program, buf: int = 100) -> None:
    p.state = "active"
    p.placement = rank.target_id
    p.charged_tokens = private_tokens(p, buf)
    rank.active[p.ref] = p
    rank.fallback_tokens += p.charged_tokens


def test_core_growth_reserve_blocks_and_batch_gain_decides_worked_numbers() -> None:
    # rounds (1, 1) -> R = ceil(2 * 1) = 2; growth g = 1000; C = 23000
    rank = _mature_rank((1, 1), growth=1000, decode=3.0)
    a = _program("a", 10_000, status="reasoning")
    _activate(rank, a)  # private 10100
    a.last_cache_miss_impact_seconds = 0.2
    b = _program("b", 10_000)
    c = cfg(token_capacity_per_dp_rank=23_000)
    # used 10100, required 10100: immediate 20200 <= 23000, reserve 1000 * (2 + 2) = 4000 -> 24200 > 23000
    thr = lambda n, ctx: n / (0.010635218423115973 + 0.0004192803698834784 * n + 1.420458414996201e-7 * ctx)  # noqa: E731
    rel = thr(2, 20_000) / thr(1, 10_000) - 1  # 139.72 / 80.16 - 1 = 0.743
    assert rel == pytest.approx(0.7430, abs=1e-3)
    x = 10.0  # 10000 uncached tokens / 1000
    recovery = (0.06600061907132926 + 0.05702024012166613 * x + 0.0044057347937978475 * x * x) * (2 - 0.15)
    assert recovery == pytest.approx(1.99204, abs=1e-4)
    # continuity loss: P = 2, free = 12900, before = min(2, 12.9) = 2,
    # after = min(2, (12900 - 10100 - 2000) / 1000) = 0.8 -> (2 - 0.8) / 0.8 * 0.2 = 0.3
    gain = estimate_batch_gain(c, rank.factors, b, 1, 10_000.0, [(2, 0.2)], 10_100.0, 10_100.0, 2)
    assert gain.continuity_loss_seconds == pytest.approx(0.3)
    assert gain.gain_seconds == pytest.approx(3.0 * rel)  # 2.229 < 1.992 + 0.3
    assert not gain.admits
    assert admission_plan(b, rank, 0.0, c, front_output=None, global_mode=False) is None
    # a slower decode (3.2 s per request) makes the batch gain worth it: 3.2 * 0.743 = 2.378 >= 2.292
    rank2 = _mature_rank((1, 1), growth=1000, decode=3.2)
    _activate(rank2, a)
    plan = admission_plan(b, rank2, 0.0, c, front_output=None, global_mode=False)
    assert plan is not None and plan.batch_gain and not plan.forced
    assert (plan.used_tokens, plan.required_tokens, plan.reserve_tokens) == (10_100.0, 10_100.0, 4000.0)


def test_core_batch_gain_protects_only_programs_with_rounds_left() -> None:
    """docs/program-scheduling.md §3: the continuity loss counts the Programs with protected
    rounds left; an acting Program past its target rounds (R = 2) is not protected, so its
    cache-miss impact does not enter the mean. The worked example with it added (100 private):
    used 10200, free 12800, before = 2, after = 0.7, loss = 1.3 / 0.7 x 0.2 = 0.371;
    3.2 x 0.743 = 2.378 >= 1.992 + 0.371 (admit; with 1.0 s in the mean it would wait)."""
    rank = _mature_rank((1, 1), growth=1000, decode=3.2)
    a = _program("a", 10_000, status="reasoning")
    _activate(rank, a)
    a.last_cache_miss_impact_seconds = 0.2
    done = _program("done", 0, status="acting")
    _activate(rank, done)
    done.rounds_since_activation = 2
    done.last_cache_miss_impact_seconds = 1.0
    b = _program("b", 10_000)
    plan = admission_plan(b, rank, 0.0, cfg(token_capacity_per_dp_rank=23_000), front_output=None, global_mode=False)
    assert plan is not None and plan.batch_gain
    assert (plan.used_tokens, plan.reserve_tokens) == (10_200.0, 4000.0)


def test_core_a_program_whose_own_growth_never_fits_runs_alone_on_an_idle_rank() -> None:
    """docs/program-scheduling.md §3 and §10: with no active Program the growth reserve is the
    candidate's own (g x R = 1000 x 2); one that can never pass it runs at once, as one larger
    than the rank does, instead of waiting for its force-resume deadline with the rank idle (before
    session 41 an 8100-token Program waited there while a 10050-token one ran at once)."""
    c = cfg(token_capacity_per_dp_rank=10_000)
    for ctx in (8000, 9950):  # 8100 + 2000 > 10000; 10050 > 10000
        plan = admission_plan(
            _program("b", ctx),
            _mature_rank((1, 1), growth=1000, decode=3.0),
            0.0,
            c,
            front_output=None,
            global_mode=False,
        )
        assert plan is not None and not plan.forced and not plan.batch_gain and plan.reserve_tokens == 2000.0
    # one that fits with its reserve once the rank's batch work leaves waits for that
    rank = _mature_rank((1, 1), growth=1000, decode=3.0)
    rank.batch_tokens = 2000.0
    assert admission_plan(_program("b", 7000), rank, 0.0, c, front_output=None, global_mode=False) is None
    rank.batch_tokens = 0.0  # 7100 + 2000 <= 10000
    assert admission_plan(_program("b", 7000), rank, 0.0, c, front_output=None, global_mode=False) is not None


def test_core_batch_gain_never_bypasses_immediate_capacity() -> None:
    rank = _mature_rank((1, 1), growth=1000, decode=100.0)
    a = _program("a", 10_000)
    _activate(rank, a)
    b = _program("b", 10_000)
    c = cfg(token_capacity_per_dp_rank=20_000)  # 10100 + 10100 > 20000
    assert admission_plan(b, rank, 0.0, c, front_output=None, global_mode=False) is None


def test_core_batch_gain_disabled_cases() -> None:
    rank = _mature_rank((1, 1), growth=1000, decode=100.0)
    b = _program("b", 10_000)
    c = cfg(token_capacity_per_dp_rank=23_000)
    assert not estimate_batch_gain(c, rank.factors, b, 0, 0.0, [], 0.0, 10_100.0, 2).admits  # B == 0
    off = cfg(token_capacity_per_dp_rank=23_000, enable_batch_gain_admission=False)
    assert not estimate_batch_gain(off, rank.factors, b, 1, 10_000.0, [], 0.0, 10_100.0, 2).admits


def test_core_continuity_loss_infinite_when_protection_would_be_exhausted() -> None:
    # free = 5000 - 1000 = 4000; before = min(3, 4) = 3; after = max(0, 4000 - 3500 - 1000) = 0 -> inf
    assert continuity_loss_seconds(1000.0, [(3, 0.5)], 5000.0, 1000.0, 3500.0, 1) == math.inf
    assert continuity_loss_seconds(0.0, [(3, 0.5)], 5000.0, 1000.0, 3500.0, 1) == 0.0
    assert continuity_loss_seconds(1000.0, [], 50_000.0, 1000.0, 3500.0, 1) == 0.0


def test_core_continuity_loss_prices_lost_rounds_at_the_mean_protected_cost() -> None:
    """docs/program-scheduling.md §3: loss = (before - after) / after x the *mean* protected
    cache-miss impact. Two protected Programs (2 and 1 rounds left, 0.2 s and 0.4 s): P = 3,
    free = 23000 - 10100 = 12900, before = min(3, 12.9) = 3,
    after = min(3, (12900 - 10100 - 2 x 1000) / 1000) = 0.8 -> (3 - 0.8) / 0.8 x 0.3 = 0.825."""
    loss = continuity_loss_seconds(1000.0, [(2, 0.2), (1, 0.4)], 23_000.0, 10_100.0, 10_100.0, 2)
    assert loss == pytest.approx(0.825)


def test_core_rank_local_admits_only_on_last_target() -> None:
    rank = _mature_rank((1,), growth=0, decode=None)
    b = _program("b", 100)
    b.last_target = TargetId("other@0")
    assert admission_plan(b, rank, 0.0, cfg(), front_output=None, global_mode=False) is None
    assert admission_plan(b, rank, 0.0, cfg(), front_output=None, global_mode=True) is not None


def test_core_repeated_arrival_populates_continuity_window_once_per_idle_period() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("x")  # holds the only slot so that "a" stays queued below
    h.submit("a", at=0.0)
    h.complete("r1", at=1.0, prompt=100)  # x pauses, a admitted
    h.complete("r2", at=2.0, prompt=100)  # a pauses (warm-up TTL 0), x re-admitted? x has no request
    eff = h.submit("a", at=5.0)
    (iv,) = of(eff, fx.RequestIntervalObserved)
    assert iv.seconds == 3.0
    eff = h.submit("a", at=6.0)  # second arrival of the same idle period: no duplicate (B9 fix)
    assert of(eff, fx.RequestIntervalObserved) == []
    assert len(h.rank().factors.continuities) == 1


def test_core_marked_continuation_counts_growth_exactly_once() -> None:
    h = Harness(token_capacity_per_dp_rank=100_000)
    h.submit("a", tokens=1000)
    p = h.program("a")
    p.pause_when_idle = True  # as capacity repair would mark it
    h.submit("a", tokens=1500, at=1.0)  # continuation while marked: growth is charged
    assert h.rank().fallback_tokens == 1600.0
    assert check(h.state, h.cfg) == []
    h.complete("r1", at=2.0, prompt=1000)
    assert check(h.state, h.cfg) == []
    eff = h.complete("r2", at=3.0, prompt=1500)
    assert "capacity_repair" in reasons(eff)
    assert h.rank().fallback_tokens == 0.0
    assert h.rank().delta_tokens == 0.0  # every charge was released exactly


def test_core_program_larger_than_capacity_runs_alone_on_an_idle_rank() -> None:
    h = Harness(token_capacity_per_dp_rank=1000, force_resume_timeout_seconds=300.0)
    eff = h.submit("big", tokens=1500)  # 1600 private > 1000: can never fit
    assert admitted(eff) == ["r1"]  # idle rank: admitted at once, not at the force deadline
    assert h.program("big").lifecycle == "active_reasoning"
    eff = h.submit("small", tokens=100, at=1.0)  # the rank is not idle now: no exception
    assert admitted(eff) == []
    eff = h.submit("big2", tokens=1500, at=2.0)
    assert admitted(eff) == []  # oversized, but the rank holds an active Program
    assert check(h.state, h.cfg) == []
