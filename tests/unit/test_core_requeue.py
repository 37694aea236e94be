"""Re-queueing a long prefill that blocks a light tenant (docs/priority.md §3, "Re-queueing a
blocking long prefill"; ``actors/core/fairness_requeue.py``)."""

from __future__ import annotations

import attrs
import pytest
from core_support import Harness, Ident, admitted, of, reasons

from actors.core import effects as fx
from actors.core.config import PriorityConfig, problems
from actors.core.errors import InvalidEvent
from actors.core.events import RequestRequeued, RequestSubmitted
from actors.core.ids import RequestId
from actors.core.invariants import check
from actors.core.model import MAX_PREFILL_REQUEUES, RequestHints

# the reference cost model: 30,000 uncached tokens take 5.742 s to prefill (test_core_priority)
REQUEUE = PriorityConfig(heavy_tenant_max_active_per_rank=0, long_prefill_seconds=2.0, requeue_long_prefills=True)


def submit(h: Harness, program: str, tenant: str, tokens: int, at: float) -> tuple[object, ...]:
    h._n += 1
    ident = Ident(program, placement_key=program, placement_hash_key=program)
    return h.feed(RequestSubmitted(RequestId(f"r{h._n}"), ident, tokens, RequestHints(), tenant=tenant), at)  # type: ignore[arg-type]


def requeued(h: Harness, rid: str, at: float) -> tuple[object, ...]:
    return h.feed(RequestRequeued(RequestId(rid)), at)


def hogs(priority: PriorityConfig = REQUEUE) -> Harness:
    """One rank of 100,000 tokens; tenant x: two 30,000-token Programs at t = 0 (the second waits
    for the first's prefill), so x demands more than half the rank once another tenant comes."""
    h = Harness(token_capacity_per_dp_rank=100_000, priority=priority)
    eff = submit(h, "h0", "x", 30_000, 0.0)
    (adm,) = of(eff, fx.Admit)
    assert adm.request_id == "r1" and adm.requeueable == priority.requeue_long_prefills
    assert h.rank().long_prefill == (RequestId("r1"), pytest.approx(5.742, abs=1e-3))
    assert admitted(submit(h, "h1", "x", 30_000, 0.0)) == []  # one long prefill at a time
    return h


def test_a_light_request_behind_a_heavy_long_prefill_asks_for_it_back() -> None:
    h = hogs()
    charged = h.state.fair.accounts["x"].input_tokens
    eff = submit(h, "l0", "y", 1_000, 1.0)
    assert admitted(eff) == ["r3"]  # the light request goes to the rank at once ...
    (ask,) = of(eff, fx.RequeuePrefill)  # ... and the hog's prefill in flight there is asked back
    assert (ask.request_id, ask.tenant, ask.light_tenants) == ("r1", "x", ("y",))
    assert ask.estimated_prefill_end == pytest.approx(5.742, abs=1e-3)
    assert "tenant_isolation_mark" in reasons(eff)
    # nothing moved yet: the request is still in flight until the shell says it took it back
    assert "r1" in h.state.in_flight and h.program("h0").state == "active"
    assert check(h.state, h.cfg) == []
    # the shell aborted it before its first token
    eff = requeued(h, "r1", 1.0)
    assert "prefill_requeue" in reasons(eff) and admitted(eff) == []  # the rank is kept for y
    h0 = h.program("h0")
    assert (h0.state, h0.status, h0.in_flight) == ("paused", "reasoning", 0)
    assert h.state.pool.front(h0.ref).request_id == "r1" and h.state.pool.front(h0.ref).requeues == 1
    assert "r1" not in h.state.in_flight and h.rank().long_prefill is None
    assert h.state.fair.accounts["x"].input_tokens == charged - 30_000  # its dispatch's charge refunded
    assert list(h.rank().active) == [h.program("l0").ref]
    assert check(h.state, h.cfg) == []
    # y's request ends (a natural stop, its Program leaves the rank): 3 s after y was last seen
    # there (the pass at 1.0) the rank is no longer kept for y, and r1 goes again, before h1's
    # r2 (it keeps its place in the resume order)
    h.complete("r3", at=1.5, prompt=1_000, completion=20, finish_reason="stop")
    assert admitted(h.tick(at=3.9)) == []
    eff = h.tick(at=4.0)
    (adm,) = of(eff, fx.Admit)
    assert adm.request_id == "r1" and adm.requeueable  # re-queued once: it may be once more
    assert h.rank().long_prefill == (RequestId("r1"), pytest.approx(4.0 + 5.742, abs=1e-3))
    assert h.state.in_flight[RequestId("r1")].requeues == 1
    assert check(h.state, h.cfg) == []


def test_a_light_tenant_back_after_the_re_dispatch_takes_it_back_once_more_then_never() -> None:
    """docs/benchmarks.md §7.0, hogs seed 2: the light tenant's window passed, the hog went again,
    and the light tenant came back to the rank while the hog prefilled a second time."""
    h = hogs()
    submit(h, "l0", "y", 1_000, 1.0)
    requeued(h, "r1", 1.0)
    h.complete("r3", at=1.5, prompt=1_000, completion=20, finish_reason="stop")
    assert admitted(h.tick(at=4.0)) == ["r1"]  # the second dispatch
    # y comes back while r1 prefills again: r1 is asked back a second time ...
    eff = submit(h, "l1", "y", 1_000, 5.0)
    assert admitted(eff) == ["r4"]
    (ask,) = of(eff, fx.RequeuePrefill)
    assert (ask.request_id, ask.light_tenants) == ("r1", ("y",))
    assert ask.estimated_prefill_end == pytest.approx(4.0 + 5.742, abs=1e-3)
    eff = submit(h, "l2", "y", 1_000, 5.1)
    assert admitted(eff) == ["r5"] and of(eff, fx.RequeuePrefill) == []  # ... once per dispatch
    eff = requeued(h, "r1", 5.1)
    assert "prefill_requeue" in reasons(eff) and admitted(eff) == []
    assert h.state.pool.front(h.program("h0").ref).requeues == 2
    assert h.rank().long_prefill is None and check(h.state, h.cfg) == []
    # y leaves; once the rank is no longer kept for y the third dispatch goes, never asked back
    h.complete("r4", at=5.5, prompt=1_000, completion=20, finish_reason="stop")
    h.complete("r5", at=5.6, prompt=1_000, completion=20, finish_reason="stop")
    assert admitted(h.tick(at=8.4)) == []
    eff = h.tick(at=8.5)  # 3 s after the last pass that saw y's request in flight (5.5)
    (adm,) = of(eff, fx.Admit)
    assert adm.request_id == "r1" and not adm.requeueable  # taken back twice: never again
    assert h.state.in_flight[RequestId("r1")].requeues == MAX_PREFILL_REQUEUES == 2
    eff = submit(h, "l3", "y", 1_000, 9.0)  # y back once more
    assert admitted(eff) == ["r6"] and of(eff, fx.RequeuePrefill) == []
    assert check(h.state, h.cfg) == []


def test_without_the_knob_the_light_request_waits_behind_the_prefill() -> None:
    h = hogs(attrs.evolve(REQUEUE, requeue_long_prefills=False))
    eff = submit(h, "l0", "y", 1_000, 1.0)
    assert admitted(eff) == ["r3"] and of(eff, fx.RequeuePrefill) == []
    assert h.program("h0").pause_when_idle  # marked: it leaves only when its request ends
    assert check(h.state, h.cfg) == []


def test_a_prefill_past_its_estimated_end_or_of_a_light_tenant_is_not_asked() -> None:
    h = hogs()
    eff = submit(h, "l0", "y", 1_000, 5.8)  # 5.742 s after r1's dispatch: probably decoding
    assert admitted(eff) == ["r3"] and of(eff, fx.RequeuePrefill) == []
    # one tenant alone: nothing is heavy, nothing asked
    solo = Harness(token_capacity_per_dp_rank=100_000, priority=REQUEUE)
    submit(solo, "h0", "x", 30_000, 0.0)
    eff = submit(solo, "s", "x", 1_000, 1.0)
    assert admitted(eff) == ["r2"] and of(eff, fx.RequeuePrefill) == []


def test_a_late_or_unknown_requeue_is_answered_and_an_unasked_one_is_a_bug() -> None:
    h = hogs()
    submit(h, "l0", "y", 1_000, 1.0)
    h.complete("r1", at=1.2, prompt=30_000, completion=10)  # it ended before the shell could act
    eff = requeued(h, "r1", 1.2)
    (rej,) = of(eff, fx.Reject)
    assert (rej.request_id, rej.reason, rej.status_hint) == ("r1", "requeue_lost", 503)
    assert "r2" in h.state.in_flight  # h1 went when h0 left (without tool-call presence x looks light)
    with pytest.raises(InvalidEvent, match="never asked"):
        requeued(h, "r2", 1.3)
    assert check(h.state, h.cfg) == []


def test_abandoning_a_requeued_request_releases_it() -> None:
    h = hogs()
    submit(h, "l0", "y", 1_000, 1.0)
    requeued(h, "r1", 1.0)
    h.abandon("r1", at=2.0)  # the client left while it waited again
    assert h.state.pool.get(RequestId("r1")) is None and "r1" not in h.state.in_flight
    assert h.program("h0") is None  # it never completed a request: released, as any cancelled first request
    assert check(h.state, h.cfg) == []


def test_requeue_config_field_is_a_bool() -> None:
    assert problems(REQUEUE, "priority") == []


def test_requeue_config_needs_the_long_prefill_rule_and_the_isolation() -> None:
    got = problems(PriorityConfig(requeue_long_prefills=True), "priority")
    assert got == [
        "priority.requeue_long_prefills: needs long_prefill_seconds > 0 (got 0.0) and "
        "heavy_tenant_max_active_per_rank set (got None) (got True)"
    ]
    got = problems(attrs.evolve(REQUEUE, requeue_long_prefills="yes"), "priority")
    assert got == ["priority.requeue_long_prefills: must be true or false (got 'yes')"]


def test_a_requeued_program_s_next_recomputation_counts_as_preemption() -> None:
    from actors.core.attribution import CAUSE_PREEMPTION, cause_of

    assert cause_of("prefill_requeue") == CAUSE_PREEMPTION


def test_only_the_ranks_long_prefill_is_dispatched_as_requeueable() -> None:
    """``requeueable`` marks the request that is its rank's long prefill, never a short one beside it or before it."""
    h = Harness(token_capacity_per_dp_rank=100_000, priority=REQUEUE)
    (short,) = of(submit(h, "l0", "y", 1_000, 0.0), fx.Admit)  # no long prefill on the rank
    assert (short.request_id, short.requeueable, h.rank().long_prefill) == ("r1", False, None)
    (long,) = of(submit(h, "h0", "x", 30_000, 0.0), fx.Admit)
    assert (long.request_id, long.requeueable) == ("r2", True)
    (beside,) = of(submit(h, "l1", "y", 1_000, 0.5), fx.Admit)  # r2's prefill runs: r3 is not it
    assert (beside.request_id, beside.requeueable, h.rank().long_prefill[0]) == ("r3", False, "r2")


def test_a_forced_resumes_long_prefill_is_not_requeueable() -> None:
    """A long prefill dispatched by a forced resume is never asked back (docs/priority.md §3)."""
    h = Harness(
        token_capacity_per_dp_rank=100_000,
        max_active_programs_per_target=1,
        force_resume_timeout_seconds=5.0,
        priority=REQUEUE,
    )
    submit(h, "a", "y", 1_000, 0.0)  # takes the only slot
    assert admitted(submit(h, "h0", "x", 30_000, 1.0)) == []
    eff = h.tick(at=6.0)  # h0's force-resume deadline
    (adm,) = of(eff, fx.Admit)
    assert (adm.request_id, adm.requeueable, h.rank().long_prefill[0]) == ("r2", False, "r2")
    assert "force_resume" in reasons(eff)


@pytest.mark.parametrize("global_queue", [False, True])
def test_a_light_program_waiting_for_the_rank_asks_the_heavy_prefill_back_and_its_own_is_never_asked(
    global_queue: bool,
) -> None:
    """A light tenant's Program waiting to resume on the rank (per-rank or global queue) is held back by
    the heavy tenant's long prefill there; the light tenant's own long prefill that follows is not asked."""
    h = Harness(token_capacity_per_dp_rank=100_000, priority=REQUEUE, global_queue=global_queue)
    assert admitted(submit(h, "l0", "y", 1_000, 0.0)) == ["r1"]
    h.complete("r1", at=0.5, prompt=1_000, completion=10)  # l0 pauses with the rank as its home
    assert admitted(submit(h, "h0", "x", 30_000, 1.0)) == ["r2"]  # x alone: nothing heavy, nothing asked
    assert admitted(submit(h, "h1", "x", 30_000, 1.0)) == []  # one long prefill at a time
    eff = submit(h, "l0", "y", 20_000, 2.0)  # a long prefill too: l0 waits for r2's
    assert admitted(eff) == [] and h.program("l0").state == "paused"
    (ask,) = of(eff, fx.RequeuePrefill)
    assert (ask.request_id, ask.tenant, ask.light_tenants) == ("r2", "x", ("y",))
    eff = requeued(h, "r2", 2.0)  # l0's long prefill goes in its place and is not asked back: y is light
    assert admitted(eff) == ["r4"] and of(eff, fx.RequeuePrefill) == []
    assert h.rank().long_prefill is not None and h.rank().long_prefill[0] == "r4"
    assert check(h.state, h.cfg) == []


def test_a_long_prefill_of_a_program_with_two_requests_in_flight_is_not_asked() -> None:
    """Only a Program's only request in flight is asked back (the Program pauses when it goes back)."""
    h = Harness(token_capacity_per_dp_rank=100_000, priority=REQUEUE)
    assert admitted(submit(h, "h0", "x", 30_000, 0.0)) == ["r1"]
    assert admitted(submit(h, "h0", "x", 1_000, 0.1)) == ["r2"] and h.program("h0").in_flight == 2
    assert admitted(submit(h, "h1", "x", 30_000, 0.2)) == []
    eff = submit(h, "l0", "y", 1_000, 1.0)
    assert admitted(eff) == ["r4"] and of(eff, fx.RequeuePrefill) == []


def test_a_light_program_between_turns_on_the_rank_does_not_ask() -> None:
    """A light tenant's Program acting on the rank (nothing in flight, nothing waiting) is not held back by it."""
    h = Harness(token_capacity_per_dp_rank=100_000, priority=REQUEUE)
    h._n += 1
    ident = Ident("l0", placement_key="l0", placement_hash_key="l0")
    hints = RequestHints(kv_retention_ttl_seconds=60.0)
    assert admitted(h.feed(RequestSubmitted(RequestId("r1"), ident, 1_000, hints, tenant="y"), 0.0)) == ["r1"]  # type: ignore[arg-type]
    h.complete("r1", at=0.5, prompt=1_000, completion=10)
    assert (h.program("l0").state, h.program("l0").status) == ("active", "acting")
    assert admitted(submit(h, "h0", "x", 30_000, 1.0)) == ["r2"]
    eff = submit(h, "h1", "x", 30_000, 1.0)  # x is heavy now: the rank is kept for y
    assert admitted(eff) == [] and h.rank().isolated_for == frozenset({"y"})
    assert of(eff, fx.RequeuePrefill) == []


def test_a_long_prefill_threshold_below_one_second_takes_prefills_back_too() -> None:
    """Any ``long_prefill_seconds`` > 0 turns the re-queueing on (with the knob and the isolation)."""
    h = hogs(attrs.evolve(REQUEUE, long_prefill_seconds=0.5))
    (ask,) = of(submit(h, "l0", "y", 1_000, 1.0), fx.RequeuePrefill)
    assert (ask.request_id, ask.light_tenants) == ("r1", ("y",))
