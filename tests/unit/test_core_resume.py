"""Resume order, force-resume deadlines, segment yield, global queue and cross-rank resume
(docs/program-scheduling.md §5, §7)."""

from __future__ import annotations

import pytest
from core_support import Harness, admitted, of, reasons, request_sample, tid

from actors.core import effects as fx
from actors.core.config import PrefillCostModel
from actors.core.ids import ProgramRef
from actors.core.invariants import check
from actors.core.model import MAX_SEGMENT_YIELD, PendingRequest, Program, RequestHints
from actors.core.queue import resume_key
from actors.core.resume import force_resume_estimate


def prog(
    pid: str,
    queued_at: float | None = None,
    finished: float | None = None,
    forced_at: float | None = None,
    yielded: bool = False,
) -> Program:
    p = Program(ref=ProgramRef("default", pid, 0), created_at=0.0)
    p.queued_at = queued_at
    p.last_request_finished_at = finished
    p.force_resume_deadline = forced_at
    p.last_pause_reason = MAX_SEGMENT_YIELD if yielded else None
    return p


def front(p: Program, priority: int = 0) -> PendingRequest:
    return PendingRequest(
        request_id="r",
        ref=p.ref,
        seq=1,
        arrived_at=0.0,
        estimated_context_tokens=10,
        hints=RequestHints(priority=priority),
        routing_text=None,
        queue_deadline=600.0,
    )  # type: ignore[arg-type]


def order(items: list[tuple[Program, int]], mode: str, now: float = 10.0) -> list[str]:
    return [
        p.ref.program_id for p, _ in sorted(items, key=lambda it: resume_key(it[0], front(it[0], it[1]), now, mode))
    ]


def test_core_resume_order_forced_then_priority_then_yield_then_mru() -> None:
    a = prog("a", queued_at=1.0, finished=5.0)
    b = prog("b", queued_at=2.0, finished=9.0)
    c = prog("c", queued_at=3.0, finished=8.0, yielded=True)
    d = prog("d", queued_at=4.0, finished=1.0, forced_at=10.0)  # forced at now=10
    e = prog("e", queued_at=5.0, finished=2.0)
    items = [(a, 0), (b, 0), (c, 0), (d, 0), (e, 3)]
    # forced d first; then priority 3 (e); then non-yielded MRU (b finished 9, a finished 5); yielded c last
    assert order(items, "mru") == ["d", "e", "b", "a", "c"]
    assert order(items, "fcfs") == ["d", "e", "a", "b", "c"]
    # equal attained service: then as MRU (docs/program-scheduling.md §5.1)
    assert order(items, "las") == ["d", "e", "b", "a", "c"]


def test_core_resume_order_priority_ranks_before_yield_penalty() -> None:
    y = prog("y", queued_at=1.0, finished=1.0, yielded=True)
    n = prog("n", queued_at=2.0, finished=2.0)
    assert order([(y, 5), (n, 0)], "mru") == ["y", "n"]
    assert order([(y, 0), (n, 0)], "mru") == ["n", "y"]


def test_core_mru_never_finished_sorts_last_and_fcfs_ties_by_program_id() -> None:
    new = prog("a", queued_at=0.0, finished=None)
    old = prog("b", queued_at=5.0, finished=1.0)
    assert order([(new, 0), (old, 0)], "mru") == ["b", "a"]
    x, w = prog("x", queued_at=1.0), prog("w", queued_at=1.0)
    assert order([(x, 0), (w, 0)], "fcfs") == ["w", "x"]


def test_core_successful_resume_clears_yield_marker() -> None:
    h = Harness()
    h.submit("a")
    h.complete("r1", at=1.0, prompt=100)
    h.program("a").last_pause_reason = MAX_SEGMENT_YIELD
    h.submit("a", at=2.0)
    assert h.program("a").last_pause_reason is None  # the yield marker is one-shot


def test_core_force_deadline_is_static_timeout_before_window_matures() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a")
    h.submit("b", at=7.0)
    p = h.program("b")
    assert p.force_resume_deadline == 7.0 + 300.0
    assert p.force_resume_timeout_seconds == 300.0
    arm = [e for e in h.log if isinstance(e, fx.ArmTimer) and e.kind == "force_resume"]
    assert [(a.program.program_id, a.deadline) for a in arm] == [("b", 307.0)]


def test_core_force_deadline_hint_replaces_estimate_capped_by_queue_timeout() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a")
    h.submit("b", at=1.0, hints=RequestHints(deadline_seconds=12.5))
    assert h.program("b").force_resume_deadline == 13.5
    h.submit("c", at=2.0, hints=RequestHints(deadline_seconds=5000.0))
    assert h.program("c").force_resume_deadline == 2.0 + 600.0  # min(hint, queue_timeout)


def test_core_later_arrival_never_postpones_force_deadline() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a")
    h.submit("b", at=1.0, hints=RequestHints(deadline_seconds=10.0))
    h.submit("b", at=2.0)  # the front request still has the 10 s hint: recomputed 12.0 > 11.0
    assert h.program("b").force_resume_deadline == 11.0  # B10 fix


def test_core_force_resume_fires_at_deadline_and_bypasses_count_guard() -> None:
    h = Harness(max_active_programs_per_target=1, force_resume_timeout_seconds=20.0)
    h.submit("a")
    h.submit("b", at=1.0)
    (arm,) = [e for e in h.log if isinstance(e, fx.ArmTimer) and e.kind == "force_resume"]
    eff = h.fire(arm.program, arm.kind, arm.token, at=21.0)
    assert admitted(eff) == ["r2"]
    t = [e for e in of(eff, fx.Transition) if e.reason == "force_resume"]
    assert t and t[0].forced
    assert len(h.rank().active) == 2  # the count guard was bypassed
    assert check(h.state, h.cfg) == []


def _mature(h: Harness, throughput_gap: float, rounds: tuple[int, ...]) -> None:
    f = h.rank().factors
    for i, r in enumerate(rounds):
        f.push_request(request_sample(rounds=r, at=i * throughput_gap))


def test_core_local_force_resume_estimate_worked_numbers() -> None:
    h = Harness(stats_window_size=2, max_active_programs_per_target=2)
    _mature(h, 2.0, (1, 2))  # throughput (2-1)/2 = 0.5/s; R = ceil(2 * 1.5) = 3
    h.submit("a")
    h.submit("b", at=0.1)
    h.program("b").rounds_since_activation = 1
    h.submit("c", at=0.2)  # queued first (count guard 2)
    h.submit("d", at=0.3)  # queued behind c
    # active remaining: a max(1, 3 - 0) = 3, b max(1, 3 - 1) = 2 -> 5; pool: 1 ahead * 3 = 3
    # timeout = clamp(3 * (5 + 3) / 0.5 = 48, min(30, 300), 300) = 48
    timeout, active, pool, thr = force_resume_estimate(h.state, h.program("d"))
    assert (timeout, active, pool, thr) == (48.0, 5.0, 3.0, 0.5)
    assert h.program("d").force_resume_deadline == pytest.approx(0.3 + 48.0)
    # c has nobody ahead: 3 * 5 / 0.5 = 30
    assert force_resume_estimate(h.state, h.program("c"))[0] == 30.0


def test_core_local_force_resume_estimate_clamped_to_30_seconds_floor() -> None:
    h = Harness(stats_window_size=2)
    _mature(h, 0.1, (1, 1))  # throughput 10/s
    h.submit("a")
    assert force_resume_estimate(h.state, h.program("a"))[0] == 30.0


def test_core_segment_yield_after_max_segment_rounds_when_waiter_exists() -> None:
    h = Harness(max_active_programs_per_target=1, max_segment_rounds=2)
    h.submit("a", hints=RequestHints(kv_retention_ttl_seconds=50.0))
    h.complete("r1", at=1.0, prompt=100)  # round 1 (TTL 50 from the hint)
    h.submit("b", at=1.5)  # waits: count guard
    h.submit("a", at=2.0, hints=RequestHints(kv_retention_ttl_seconds=50.0))
    eff = h.complete("r3", at=3.0, prompt=110, cached=100)  # round 2 -> yield to b
    assert "max_segment_yield" in reasons(eff)
    assert admitted(eff) == ["r2"]
    assert h.program("a").last_pause_reason == MAX_SEGMENT_YIELD


def test_core_no_yield_when_promised_relief_covers_the_waiter() -> None:
    """docs/program-scheduling.md §5: a Program at max_segment_rounds yields only when the waiter
    needs more than the relief already promised (Reasoning Programs marked to pause when idle).
    C = 900: m (400, priority -1) is marked for w (needs 400, priority 5); at p's completion
    w needs exactly the promised 400, so p (priority 5, not preemptible by w) keeps its placement."""
    h = Harness(token_capacity_per_dp_rank=900, max_segment_rounds=1)
    assert admitted(h.submit("m", 300, hints=RequestHints(priority=-1))) == ["r1"]  # 400
    hold = RequestHints(kv_retention_ttl_seconds=50.0, priority=5)
    assert admitted(h.submit("p", 100, at=0.5, hints=hold)) == ["r2"]  # 600
    eff = h.submit("w", 300, at=1.0, hints=RequestHints(priority=5))  # 600 + 400 > 900
    assert admitted(eff) == [] and reasons(eff) == ["priority_preemption_mark"]
    assert h.program("m").pause_when_idle and not h.program("p").pause_when_idle
    eff = h.complete("r2", at=2.0, prompt=100)  # p's round 1: acting
    assert "max_segment_yield" not in reasons(eff)
    assert h.program("p").lifecycle == "active_acting"


def test_core_segment_yield_in_global_mode_is_for_a_waiter_of_the_same_rank() -> None:
    """docs/program-scheduling.md §5, §7: in global mode a Program at max_segment_rounds yields to
    a waiter whose rank is its own; a waiter of another rank does not make it yield."""
    h = Harness(
        n_targets=2,
        global_queue=True,
        binding_strategy="program_round_robin",
        max_active_programs_per_target=1,
        max_segment_rounds=1,
    )
    hold = RequestHints(kv_retention_ttl_seconds=50.0)
    h.submit("a", hints=hold)  # rank 0
    h.submit("b", hints=hold)  # rank 1
    h.submit("c")  # rank 0: waits behind a (count guard)
    eff = h.complete("r2", at=1.0, prompt=100)  # b's round 1: c's rank is not b's
    assert "max_segment_yield" not in reasons(eff) and h.program("b").lifecycle == "active_acting"
    eff = h.complete("r1", at=2.0, prompt=100)  # a's round 1: c waits for a's rank
    assert "max_segment_yield" in reasons(eff) and admitted(eff) == ["r3"]


def test_core_no_yield_without_waiter() -> None:
    h = Harness(max_segment_rounds=1)
    h.submit("a", hints=RequestHints(kv_retention_ttl_seconds=50.0))
    eff = h.complete("r1", at=1.0, prompt=100)
    assert reasons(eff) == []
    assert h.program("a").lifecycle == "active_acting"


def test_core_global_mode_new_programs_stay_on_initial_binding() -> None:
    h = Harness(
        n_targets=2, global_queue=True, max_active_programs_per_target=1, binding_strategy="program_round_robin"
    )
    h.submit("a")  # round robin -> rank 0
    h.submit("b")  # -> rank 1
    h.submit("c")  # -> rank 0, busy; rank 1 busy too
    h.complete("r2", at=1.0, prompt=100)  # rank 1 frees up (b paused), but c never paused: no migration
    assert h.program("c").state == "paused"
    assert h.program("c").last_target == tid(0)


def _global_two_ranks(**kw: object) -> Harness:
    h = Harness(n_targets=2, global_queue=True, stats_window_size=1, binding_strategy="program_round_robin", **kw)
    for i in (0, 1):
        h.rank(i).factors.push_request(request_sample())
    return h


def test_core_cross_rank_resume_moves_paused_program_under_source_pressure() -> None:
    h = _global_two_ranks(max_active_programs_per_target=1, admission_waiting_request_threshold=0)
    h.submit("a")  # rank 0
    h.submit("x")  # rank 1
    h.submit("y")  # rank 0 (busy)
    h.complete("r2", at=0.5, prompt=100)  # x pauses on rank 1; y stays queued for rank 0 (never paused)
    h.complete("r1", at=1.0, prompt=100)  # a pauses; y admitted on rank 0
    eff = h.submit("a", at=2.0)  # a queued (rank 0 busy with y), paused before -> may migrate
    assert admitted(eff) == []  # minimum residence: now - queued_at < metrics_interval
    eff = h.tick(at=3.0)
    assert admitted(eff) == ["r4"]
    assert reasons(eff) == ["program_admit", "cross_rank_resume"]
    assert h.program("a").placement == tid(1)
    assert h.program("a").home_target == tid(0)  # home is never changed by resume


# a recompute 10x dearer than the default: the ski-rental patience (core/resume.py) stays far away
SLOW_PREFILL = PrefillCostModel(intercept_seconds=5.0)


def _a_waits_behind_big(h: Harness, z_tokens: int, a_tokens: int) -> None:
    """``big`` and ``a`` on rank 0, ``z`` (``z_tokens``) on rank 1; ``a`` pauses, ``big`` grows to
    8100 held, and ``a`` asks again with ``a_tokens`` at 1.0 (waiting when that does not fit)."""
    h.submit("big", tokens=6000)  # rank 0
    h.submit("z", tokens=z_tokens)  # rank 1
    h.submit("a", tokens=2000)  # rank 0: 6100 + 2100 <= 10000
    h.complete("r3", at=0.5, prompt=2000)  # a pauses (warm-up TTL 0)
    h.submit("big", tokens=8000, at=0.7)  # big grows: rank 0 now 8100 used
    h.submit("a", tokens=a_tokens, at=1.0)


@pytest.mark.parametrize(("second_ctx", "moves"), [(2000, True), (6000, False)])
def test_core_cross_rank_headroom_inequality(second_ctx: int, moves: bool) -> None:
    h = _global_two_ranks(
        token_capacity_per_dp_rank=10_000, admission_waiting_request_threshold=0, prefill_cost_model=SLOW_PREFILL
    )
    _a_waits_behind_big(h, 1000, second_ctx)  # rank 1: 1100 used; a cannot come back: 8100 + private > 10000
    assert h.rank(0).fallback_tokens == 8100.0
    eff = h.tick(at=2.0)
    # free(1) = 10000 - 1100 = 8900 must be >= free(0) + 1.2 * context = 1900 + 1.2 * ctx
    # ctx 2000: 1900 + 2400 = 4300 <= 8900 -> moves; ctx 6000: 1900 + 7200 = 9100 > 8900 -> stays
    assert (admitted(eff) == ["r5"]) is moves
    assert (h.program("a").placement == tid(1)) is moves
    assert check(h.state, h.cfg) == []


@pytest.mark.parametrize(("second_ctx", "moves"), [(6500, True), (6800, False)])
def test_core_cross_rank_headroom_free_is_zero_above_the_low_watermark(second_ctx: int, moves: bool) -> None:
    """docs/program-scheduling.md §7: ``free(x) = max(0, C x low - usage(x))``. Low 0.9 x 10000 =
    9000; rank 0 holds 9500, so free(0) = 0 and free(1) = 9000 - 1100 = 7900 must cover 1.2 x context."""
    h = _global_two_ranks(
        token_capacity_per_dp_rank=10_000,
        low_watermark_ratio=0.9,
        admission_waiting_request_threshold=0,
        prefill_cost_model=SLOW_PREFILL,
    )
    h.submit("big", tokens=6000)  # rank 0
    h.submit("z", tokens=1000)  # rank 1: 1100 used
    h.submit("a", tokens=2000)  # rank 0: 8200 <= 9000
    h.complete("r3", at=0.5, prompt=2000)  # a pauses
    h.submit("big", tokens=9400, at=0.7)  # rank 0 now 9500 used, above the low watermark
    h.submit("a", tokens=second_ctx, at=1.0)
    eff = h.tick(at=2.0)  # 6500: 7800 <= 7900 moves; 6800: 8160 > 7900 stays
    assert (admitted(eff) == ["r5"]) is moves
    assert (h.program("a").placement == tid(1)) is moves


def test_core_cross_rank_headroom_holds_at_equality() -> None:
    """docs/program-scheduling.md §7: ``free(dest) >= free(source) + ratio x context`` moves;
    here free(1) = 10000 - 2100 = 7900 == 1900 + 1.2 x 5000."""
    h = _global_two_ranks(
        token_capacity_per_dp_rank=10_000, admission_waiting_request_threshold=0, prefill_cost_model=SLOW_PREFILL
    )
    _a_waits_behind_big(h, 2000, 5000)  # rank 1: 2100 used; a cannot come back: 8100 + 5100 > 10000
    eff = h.tick(at=2.0)
    assert admitted(eff) == ["r5"]
    assert h.program("a").placement == tid(1)


def test_core_cross_rank_pressure_from_a_fresh_waiting_count_at_the_threshold() -> None:
    """docs/program-scheduling.md §7: the source is under pressure when its fresh ``waiting >=
    threshold``; one request waiting in rank 0's engine with a threshold of 1 is enough."""
    h = _global_two_ranks(
        token_capacity_per_dp_rank=10_000, admission_waiting_request_threshold=1, prefill_cost_model=SLOW_PREFILL
    )
    _a_waits_behind_big(h, 1000, 2000)  # rank 1: 1100 used; a cannot come back: 8100 + 2100 > 10000
    h.observe(0, 0.81, 1, 1, at=1.5)  # the engine holds big's 8100 tokens and queues one request
    eff = h.tick(at=2.0)  # free(1) 8900 >= 1900 + 1.2 x 2000
    assert admitted(eff) == ["r5"]
    assert h.program("a").placement == tid(1)


def test_core_cross_rank_pressure_from_an_older_waiter_of_the_source_ranked_ahead() -> None:
    """docs/program-scheduling.md §7: without a fresh backend count, the source is under pressure
    when another waiter of the source ranks ahead (resume order, MRU here) and has waited at least
    ``metrics_interval_seconds``; the Program itself and waiters behind it do not count."""
    h = _global_two_ranks(
        token_capacity_per_dp_rank=10_000, admission_waiting_request_threshold=1, prefill_cost_model=SLOW_PREFILL
    )
    h.submit("big", tokens=3000)  # rank 0
    h.submit("z", tokens=1000)  # rank 1: 1100 used
    h.submit("a", tokens=2000)  # rank 0
    h.submit("w", tokens=100)  # rank 1
    h.submit("c", tokens=2000)  # rank 0
    h.complete("r3", at=0.5, prompt=2000)  # a pauses
    h.complete("r4", at=0.55, prompt=100)  # w pauses
    h.complete("r5", at=0.6, prompt=2000)  # c pauses, finished last: first in MRU order
    h.submit("big", tokens=8000, at=0.7)  # rank 0 now 8100 used
    h.submit("a", tokens=2000, at=1.0)  # neither can come back: 8100 + 2100 > 10000
    h.submit("c", tokens=2000, at=1.2)
    # a (first in the cross-rank FCFS order) has waited 1 s, but c, ahead of it, only 0.8 s
    assert admitted(h.tick(at=2.0)) == []
    eff = h.tick(at=2.2)  # c has waited 1 s: rank 0 is under pressure, a moves
    assert admitted(eff) == ["r7"]
    assert reasons(eff) == ["program_admit", "cross_rank_resume"]
    assert h.program("a").placement == tid(1)
    assert h.program("c").state == "paused"  # no older waiter ahead of c is left


def test_core_cross_rank_ski_rental_moves_after_waiting_the_recompute_cost() -> None:
    """agentd difference: no backend pressure and no headroom margin, but a waited as long as a
    recompute of its private context elsewhere costs, so it moves to the rank that can admit it."""
    h = _global_two_ranks(
        token_capacity_per_dp_rank=10_000, admission_waiting_request_threshold=1, prefill_cost_model=SLOW_PREFILL
    )
    h.submit("big", tokens=6000)  # rank 0
    h.submit("z", tokens=1000)  # rank 1: 1100 used
    h.submit("a", tokens=2000)  # rank 0
    h.complete("r3", at=0.5, prompt=2000)  # a pauses
    impact = h.program("a").last_cache_miss_impact_seconds
    # 2000 private tokens: (5.0 + 0.057 * 2 + 0.0044 * 4) * (2 - 0.15)
    assert impact == pytest.approx((5.0 + 0.05702024012166613 * 2 + 0.0044057347937978475 * 4) * 1.85)
    h.submit("big", tokens=8000, at=0.7)  # rank 0 now 8100 used
    h.submit("a", tokens=6000, at=1.0)  # cannot come back: 8100 + 6100 > 10000
    h.observe(0, 0.5, 1, 0, at=1.5)  # no backend waiting requests on rank 0: no pressure
    eff = h.tick(at=1.0 + impact - 0.01)
    assert admitted(eff) == []  # headroom: 8900 < 1900 + 1.2 * 6000, and patience not yet spent
    eff = h.tick(at=1.0 + impact)
    assert admitted(eff) == ["r5"]
    assert reasons(eff) == ["program_admit", "cross_rank_resume"]
    assert h.program("a").placement == tid(1)
    assert check(h.state, h.cfg) == []


def test_core_cross_rank_order_is_fcfs_regardless_of_mru() -> None:
    a = prog("a", queued_at=2.0, finished=9.0)
    b = prog("b", queued_at=1.0, finished=1.0)
    assert order([(a, 0), (b, 0)], "mru") == ["a", "b"]
    assert order([(a, 0), (b, 0)], "fcfs") == ["b", "a"]  # what cross-rank uses


def test_core_cross_rank_escape_to_an_idle_rank_before_the_windows_mature() -> None:
    h = Harness(
        n_targets=2,
        global_queue=True,
        binding_strategy="program_round_robin",
        token_capacity_per_dp_rank=10_000,
        admission_waiting_request_threshold=0,
        prefill_cost_model=SLOW_PREFILL,
    )
    assert not h.rank(0).factors.request_window_complete  # stats_window_size 100: immature all along
    h.submit("big", tokens=6000)  # rank 0
    h.submit("z", tokens=1000, hints=RequestHints(kv_retention_ttl_seconds=600.0))  # rank 1
    h.submit("a", tokens=2000)  # rank 0: 6100 + 2100 <= 10000
    h.complete("r2", at=0.3, prompt=1000)  # z holds rank 1 (acting, hint TTL)
    h.complete("r3", at=0.5, prompt=2000)  # a pauses (warm-up TTL 0)
    h.submit("big", tokens=8000, at=0.7)  # rank 0 now 8100 used
    h.submit("a", tokens=2000, at=1.0)  # cannot come back to rank 0
    eff = h.tick(at=2.0)
    assert admitted(eff) == []  # rank 1 holds z and the windows are immature: the reference gate holds
    h.submit("z", tokens=1100, at=2.5)
    h.complete("r6", at=3.0, prompt=1100)  # no hint now: TTL 0, z pauses, rank 1 is idle
    assert [r.program_id for r in h.rank(1).active] == ["a"]  # a moved at once to the idle rank
    assert admitted(h.log[-12:]) == ["r5"]
    assert h.program("a").placement == tid(1)
    assert reasons(h.log[-12:])[-2:] == ["program_admit", "cross_rank_resume"]
    assert check(h.state, h.cfg) == []
