"""Class bands, priorities, per-class caps and tenant fairness in the core (docs/priority.md §1-§4)."""

from __future__ import annotations

import attrs
import pytest
from core_support import Harness, admitted, of, reasons

from actors.core import effects as fx
from actors.core import fairness
from actors.core.config import BatchJobsConfig, ClassLimits, PriorityConfig, problems
from actors.core.costs import prefill_seconds
from actors.core.events import BatchSubmitted, InteractiveSubmitted, RepairTick, RequestCompleted
from actors.core.ids import RequestId
from actors.core.invariants import check
from actors.core.model import NO_USAGE, RequestHints, Usage
from actors.core.snapshot import priority_snapshot

BATCH = BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0)


def interactive(h: Harness, rid: str, tokens: int, *, at: float | None = None, **kw: object) -> tuple[object, ...]:
    return h.feed(InteractiveSubmitted(RequestId(rid), tokens, **kw), at)  # type: ignore[arg-type]


def admitted_interactive(effects: tuple[object, ...]) -> list[str]:
    return [e.request_id for e in of(effects, fx.AdmitInteractive)]


def counter(h: Harness, tenant: str) -> float:
    return fairness.counter(h.state.fair, h.state.prio, tenant, h.now)


# ---- config ----------------------------------------------------------------------------------


def test_priority_config_defaults_are_valid_and_rules_name_the_field() -> None:
    assert problems(PriorityConfig()) == []
    bad = PriorityConfig(
        class_order=("interactive", "batch", "agent"),
        batch=ClassLimits(max_running_per_rank=0, max_kv_share=0.0),
        fairness="wfq",
        tenant_weights={"a": -1.0},
    )
    got = problems(bad, "priority")
    assert [line.split(":")[0] for line in got] == [
        "priority.class_order",
        "priority.batch.max_running_per_rank",
        "priority.batch.max_kv_share",
        "priority.fairness",
        "priority.tenant_weights",
    ]


# ---- the interactive class -------------------------------------------------------------------


def test_interactive_request_is_admitted_at_once_when_it_fits() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    eff = interactive(h, "i1", 200, tenant="t", priority=3, max_tokens=50)
    (adm,) = of(eff, fx.AdmitInteractive)
    assert (adm.request_id, adm.tenant, adm.priority, adm.charged_tokens) == ("i1", "t", 3, 250)
    assert h.rank().interactive_tokens == 250 and h.rank().interactive_requests == 1
    h.complete("i1", completion=20)
    assert h.rank().interactive_tokens == 0 and h.rank().interactive_requests == 0
    a = h.state.fair.accounts["t"]
    assert (a.input_tokens, a.output_tokens) == (200, 20)  # output charged at completion, as generated
    assert counter(h, "t") == 200 * 1.0 + 20 * 2.0
    assert check(h.state, h.cfg) == []


def test_interactive_goes_ahead_of_a_waiting_program_and_claims_the_rank() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    assert admitted(h.submit("a", 500)) == ["r1"]  # 600 private tokens
    assert admitted(h.submit("b", 350, at=1.0)) == []  # 450 > 1000 - 600: waits
    eff = interactive(h, "i1", 350, at=2.0)  # 450 > 400 free: busy "a" is marked, the rank claimed
    assert admitted_interactive(eff) == []
    assert "priority_preemption_mark" in reasons(eff) and h.program("a").pause_when_idle
    assert h.rank().interactive_claim_tokens == 450
    assert admitted(h.tick(at=2.5)) == [] and admitted_interactive(h.log[-5:]) == []
    eff = h.complete("r1", at=3.0, prompt=500, completion=10)
    assert "priority_preemption" in reasons(eff)  # "a" pauses when its request ends
    assert admitted_interactive(eff) == ["i1"]  # interactive first ...
    assert admitted(eff) == ["r2"]  # ... then the Program that still fits (450 <= 1000 - 450)
    assert h.rank().interactive_claim_tokens == 0
    assert check(h.state, h.cfg) == []


def test_interactive_pauses_idle_lower_programs_now() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", 400, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=0))
    h.submit("b", 300, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=5))
    h.complete("r1", at=1.0, prompt=400)
    h.complete("r2", at=1.0, prompt=300)  # both acting (idle), holding 900 tokens
    eff = interactive(h, "i1", 400, at=2.0)
    pauses = [t for t in of(eff, fx.Transition) if t.reason == "priority_preemption"]
    assert [t.program.program_id for t in pauses] == ["a"]  # the lower priority only: enough room
    assert admitted_interactive(eff) == ["i1"]
    assert h.program("a").state == "paused" and h.program("a").last_target == h.rank().target_id
    assert h.program("b").state == "active"
    assert check(h.state, h.cfg) == []


def test_interactive_preempts_restartable_batch_before_pausing_programs() -> None:
    h = Harness(token_capacity_per_dp_rank=1000, batch=BATCH)
    h.feed(BatchSubmitted(RequestId("b1"), "job", 300, max_tokens=100, preemptible=True))
    h.feed(BatchSubmitted(RequestId("b2"), "job", 300, max_tokens=100, preemptible=False))
    assert h.rank().batch_requests == 2
    eff = interactive(h, "i1", 400, max_tokens=100, at=1.0)  # 500 > 1000 - 800 - reserve
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["b1"]
    assert admitted_interactive(eff) == ["i1"]
    assert h.state.batch is not None and "b1" in h.state.batch.pending
    assert check(h.state, h.cfg) == []


def test_interactive_order_is_priority_then_least_served_tenant_then_arrival() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", 800)  # 900: only 100 left
    interactive(h, "x1", 300, tenant="x", at=1.0)
    interactive(h, "y1", 300, tenant="y", at=1.0)
    interactive(h, "x2", 300, tenant="x", priority=1, at=1.0)
    h.state.fair.accounts["x"].counter += 10_000  # x was served much more
    eff = h.complete("r1", at=2.0, prompt=800)  # "a" pauses (ttl 0): 1000 free, room for two of 400
    assert admitted_interactive(eff) == ["x2", "y1"]  # priority first, then the least-served tenant
    assert "x1" in h.state.interactive.pending


def test_interactive_queue_timeout_rejects_at_the_tick_and_abandon_unqueues() -> None:
    h = Harness(token_capacity_per_dp_rank=1000, queue_timeout_seconds=10.0)
    h.submit("a", 800)
    interactive(h, "i1", 500, deadline_seconds=2.0, at=1.0)
    interactive(h, "i2", 500, at=1.0)
    assert admitted_interactive(h.feed(RepairTick(), at=2.5)) == []
    eff = h.feed(RepairTick(), at=3.0)
    assert [(r.request_id, r.status_hint) for r in of(eff, fx.Reject)] == [("i1", 429)]
    (rejected,) = of(eff, fx.Reject)  # not "Program request ..." (session-35 walk)
    assert rejected.reason == "queue_timeout"
    assert rejected.message == "interactive request exceeded its admission queue timeout"
    h.abandon("i2", at=4.0)
    assert not h.state.interactive.pending and h.state.fair.accounts["default"].waiting == 0


# ---- priorities among Programs ---------------------------------------------------------------


def test_higher_priority_program_resumes_first() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("x")
    h.submit("low", at=1.0, hints=RequestHints(priority=-1))
    h.submit("high", at=2.0, hints=RequestHints(priority=4))
    eff = h.complete("r1", at=3.0)
    assert admitted(eff) == ["r3"]


@pytest.mark.parametrize("global_queue", [False, True])
def test_a_higher_priority_waiter_pauses_lower_idle_programs(global_queue: bool) -> None:
    """docs/priority.md §1, in either queue mode (docs/program-scheduling.md §3)."""
    h = Harness(token_capacity_per_dp_rank=1000, global_queue=global_queue)
    h.submit("low", 600, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=-2))
    h.complete("r1", at=1.0, prompt=600)  # acting, 700 held
    eff = h.submit("high", 400, at=2.0, hints=RequestHints(priority=3))
    assert "priority_preemption" in reasons(eff) and admitted(eff) == ["r2"]
    eff = h.submit("peer", 400, at=3.0, hints=RequestHints(priority=3))  # equal priority: never pauses
    assert "priority_preemption" not in reasons(eff)
    assert check(h.state, h.cfg) == []


def test_a_waiter_pauses_only_programs_below_its_own_priority() -> None:
    """docs/priority.md §1: the waiter's front request's priority decides which Programs are lower
    (here both are above the default 0)."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("low", 600, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=1))
    h.complete("r1", at=1.0, prompt=600)  # acting, 700 held
    eff = h.submit("high", 400, at=2.0, hints=RequestHints(priority=3))
    assert "priority_preemption" in reasons(eff) and admitted(eff) == ["r2"]
    assert h.program("low").lifecycle == "paused_acting"


def test_a_higher_priority_waiter_marks_busy_lower_programs_to_pause_when_idle() -> None:
    """docs/priority.md §1: a lower-priority Program with a request in flight is marked and pauses
    when that request ends; the waiter is admitted then."""
    h = Harness(token_capacity_per_dp_rank=1000)
    assert admitted(h.submit("low", 600, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=-2))) == ["r1"]
    eff = h.submit("high", 400, at=2.0, hints=RequestHints(priority=3))  # 700 + 500 > 1000
    assert admitted(eff) == [] and "priority_preemption_mark" in reasons(eff)
    assert h.program("low").pause_when_idle
    eff = h.complete("r1", at=3.0, prompt=600)
    assert "priority_preemption" in reasons(eff) and admitted(eff) == ["r2"]
    assert h.program("low").lifecycle == "paused_acting"


def test_busy_programs_already_marked_count_as_room_for_the_waiter() -> None:
    """docs/priority.md §1: busy lower-priority Programs are marked only until the room they will
    free covers the waiter; one marked in an earlier pass counts, so the next pass marks no more."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("l1", 300, hints=RequestHints(priority=-1))  # 400, in flight
    h.submit("l2", 300, at=0.5, hints=RequestHints(priority=-1))  # 800, in flight
    eff = h.submit("high", 500, at=1.0, hints=RequestHints(priority=2))  # needs 600, 200 free
    assert reasons(eff).count("priority_preemption_mark") == 1  # 200 + 400 == 600: enough
    h.tick(at=2.0)  # another pass: 200 free + 400 marked >= 600
    assert reasons(h.log).count("priority_preemption_mark") == 1
    assert [h.program(x).pause_when_idle for x in ("l1", "l2")].count(True) == 1


def test_idle_lower_programs_are_not_paused_when_that_cannot_admit_the_waiter() -> None:
    """docs/priority.md §1: idle lower-priority Programs are paused only when that makes the
    waiter admissible now. Low watermark 500: "peer" (equal priority, in flight) holds 250 and
    "low" (idle) 200; the waiter needs 300, and 50 free + 200 from "low" is not enough."""
    h = Harness(token_capacity_per_dp_rank=1000, low_watermark_ratio=0.5)
    h.submit("low", 100, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=-2))
    h.complete("r1", at=1.0, prompt=100)  # acting, 200 held
    assert admitted(h.submit("peer", 150, at=1.5, hints=RequestHints(priority=3))) == ["r2"]
    eff = h.submit("high", 200, at=2.0, hints=RequestHints(priority=3))
    assert admitted(eff) == [] and "priority_preemption" not in reasons(eff)
    assert h.program("low").lifecycle == "active_acting"


def test_capacity_repair_pauses_the_lowest_priority_first() -> None:
    h = Harness(token_capacity_per_dp_rank=1000, low_watermark_ratio=0.9, high_watermark_ratio=0.95)
    h.submit("hi", 300, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=2))
    h.submit("lo", 300, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=-2))
    h.complete("r1", at=1.0, prompt=300)
    h.complete("r2", at=1.0, prompt=300)
    # both acting; the growth of "hi"'s context pushes the rank over the high watermark
    eff = h.submit("hi", 700, at=10.0, hints=RequestHints(priority=2))
    paused = [t.program.program_id for t in of(eff, fx.Transition) if t.reason == "capacity_repair"]
    assert paused == ["lo"]


# ---- per-class caps ----------------------------------------------------------------------------


def test_agent_cap_on_running_programs_per_rank() -> None:
    h = Harness(priority=PriorityConfig(agent=ClassLimits(max_running_per_rank=1)))
    h.submit("a")
    assert admitted(h.submit("b", at=1.0)) == []
    assert admitted(h.complete("r1", at=2.0)) == ["r2"]


def test_agent_kv_share_admits_up_to_exactly_its_share() -> None:
    """docs/priority.md §2: the agent class may hold ``max_kv_share`` of the rank's capacity; a
    Program that brings its Programs' ledger to exactly that share is admitted."""
    h = Harness(token_capacity_per_dp_rank=1000, priority=PriorityConfig(agent=ClassLimits(max_kv_share=0.5)))
    assert admitted(h.submit("a")) == ["r1"]  # 200 private
    assert admitted(h.submit("b", tokens=201, at=1.0)) == []  # 200 + 301 > 500
    assert admitted(h.submit("c", tokens=200, at=2.0)) == ["r3"]  # 200 + 300 == 500
    assert h.rank().fallback_tokens == 500.0


def test_agent_kv_share_of_one_caps_nothing() -> None:
    """docs/priority.md §2, docs/program-scheduling.md §2-§3: with the default ``max_kv_share = 1``
    the agent class is not capped; admission checks the rank's usage, which a fresh backend
    observation gives, even when the Router ledger alone would exceed the capacity."""
    h = Harness(token_capacity_per_dp_rank=1000)
    assert admitted(h.submit("a", tokens=700)) == ["r1"]  # 800 private in the ledger
    h.observe(0, kv=0.1, running=1, waiting=0, at=0.5)  # the engine holds 100 tokens for it
    eff = h.submit("b", tokens=200, at=1.0)  # usage 100 + 300 <= 1000; the ledger says 800 + 300
    assert admitted(eff) == ["r2"]
    assert h.rank().fallback_tokens == 1100.0


def test_agent_caps_yield_to_a_due_force_resume_deadline() -> None:
    """docs/priority.md §2: a due force-resume deadline overrides the agent caps, as it overrides
    the Program-count guard (the agent class's starvation bound)."""
    h = Harness(
        force_resume_timeout_seconds=5.0,
        token_capacity_per_dp_rank=10_000,
        priority=PriorityConfig(agent=ClassLimits(max_running_per_rank=1, max_kv_share=0.05)),
    )
    assert admitted(h.submit("a")) == ["r1"]  # 200 private: the agent share holds 500
    assert admitted(h.submit("b", tokens=400, at=1.0)) == []  # the cap of one active Program
    assert h.program("b").force_resume_deadline == 6.0
    assert admitted(h.tick(at=5.5)) == []
    eff = h.tick(at=6.0)  # the force-resume timer fires at 6.0: the caps no longer hold b
    assert admitted(eff) == ["r2"]
    assert "force_resume" in reasons(eff)
    assert len(h.rank().active) == 2


def test_batch_and_interactive_caps_on_running_requests() -> None:
    prio = PriorityConfig(batch=ClassLimits(max_running_per_rank=1), interactive=ClassLimits(max_running_per_rank=2))
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH, priority=prio)
    for i in range(3):
        h.feed(BatchSubmitted(RequestId(f"b{i}"), "job", 10, max_tokens=10))
        interactive(h, f"i{i}", 10)
    assert h.rank().batch_requests == 1 and h.rank().interactive_requests == 2
    h.complete("i0")
    assert h.rank().interactive_requests == 2 and not h.state.interactive.pending


def test_class_order_can_put_agents_above_interactive() -> None:
    prio = PriorityConfig(class_order=("agent", "interactive", "batch"))
    h = Harness(token_capacity_per_dp_rank=1000, priority=prio)
    h.submit("a", 500)
    eff = interactive(h, "i1", 500, at=1.0)
    assert admitted_interactive(eff) == [] and "priority_preemption_mark" not in reasons(eff)
    assert h.rank().interactive_claim_tokens == 0  # no claim against a higher band


# ---- tenant fairness ---------------------------------------------------------------------------


def test_least_served_tenant_resumes_first_at_equal_priority() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("x0", tokens=1000)
    h.feed(_submit(h, "xa", "x", 100), at=1.0)
    h.feed(_submit(h, "yb", "y", 100), at=2.0)
    h.state.fair.accounts["x"].counter += 5_000
    eff = h.complete("r1", at=3.0)
    assert [e.program.program_id for e in of(eff, fx.Admit)] == ["yb"]


def _submit(h: Harness, program: str, tenant: str, tokens: int) -> object:
    from core_support import Ident

    from actors.core.events import RequestSubmitted

    h._n += 1
    return RequestSubmitted(
        RequestId(f"r{h._n}"), Ident(program, placement_key=program, placement_hash_key=program), tokens, tenant=tenant
    )


def test_counter_lift_for_a_newly_backlogged_tenant() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", 850)  # 950: nothing else fits
    interactive(h, "x1", 100, tenant="x", at=1.0)
    h.state.fair.accounts["x"].counter = 700.0
    interactive(h, "y1", 100, tenant="y", at=2.0)  # y was idle: lifted to x's counter, no credit
    assert counter(h, "y") == 700.0 and h.state.fair.accounts["y"].lifts == 1
    interactive(h, "x2", 100, tenant="x", at=3.0)  # x is backlogged already: no lift
    assert h.state.fair.accounts["x"].lifts == 0


@pytest.mark.parametrize(
    ("success", "usage", "output_charged"),
    [
        (True, Usage(completion_tokens=7), 7),  # the reported count
        (False, Usage(completion_tokens=7), 7),  # reported: charged even when it failed
        (True, NO_USAGE, 50),  # succeeded without usage: its expected output (max_tokens)
        (False, NO_USAGE, 0),  # failed without usage: nothing
    ],
)
def test_completion_charges_reported_output_else_expected_output_if_it_succeeded(
    success: bool, usage: Usage, output_charged: int
) -> None:
    """docs/priority.md §3: a completion is charged ``vtc_output_token_weight`` x the completion
    tokens it reports; without usage, its expected output if it succeeded, nothing if it failed."""
    h = Harness(token_capacity_per_dp_rank=1000)
    assert admitted_interactive(interactive(h, "i1", 100, tenant="t", max_tokens=50, at=1.0)) == ["i1"]
    h.feed(RequestCompleted(RequestId("i1"), success, usage), at=2.0)
    a = h.state.fair.accounts["t"]
    assert (a.input_tokens, a.output_tokens) == (100, output_charged)
    assert counter(h, "t") == 100 + 2 * output_charged  # input weight 1, output weight 2 (the defaults)
    assert a.dispatched == 1


def test_outstanding_rent_is_exact_below_one_token_second() -> None:
    """Rent read between settlements is ``held x now - sum(held x since)`` (docs/priority.md §3):
    exact at every instant, however small."""
    fair = fairness.FairnessState()
    cfg = PriorityConfig(vtc_kv_token_second_weight=1.0)
    fairness.hold(fair, cfg, "t", 0.0, 0.0, 10.0, 1.0)  # 10 tokens held from t = 1
    a = fair.accounts["t"]
    assert fairness.outstanding_rent_token_seconds(a, 1.05) == pytest.approx(0.5)
    assert fairness.total_kv_token_seconds(a, 1.05) == pytest.approx(0.5)
    assert fairness.counter(fair, cfg, "t", 1.05) == pytest.approx(0.5)


def test_kv_rent_accrues_while_acting() -> None:
    prio = PriorityConfig(vtc_kv_token_second_weight=0.5, tenant_weights={"t": 2.0})
    h = Harness(token_capacity_per_dp_rank=10_000, priority=prio)
    ev = _submit(h, "p", "t", 900)
    h.feed(ev.__class__(ev.request_id, ev.identity, 900, RequestHints(kv_retention_ttl_seconds=10.0), tenant="t"))  # type: ignore[attr-defined]
    c0 = counter(h, "t")
    h.complete("r1", at=1.0, prompt=900, completion=0)  # acting: 1000 tokens held until 11.0
    c1 = counter(h, "t")
    h.now = 5.0
    assert counter(h, "t") - c1 == pytest.approx(0.5 * 1000 * 4.0 / 2.0)
    eff = h.tick(at=20.0)  # the TTL fired at 11.0: the rent stops there
    assert "ttl_expired" in reasons(h.log)
    a = h.state.fair.accounts["t"]
    assert a.held_tokens == 0.0 and a.kv_token_seconds == pytest.approx(1000 * 10.0)
    assert counter(h, "t") - c1 == pytest.approx(0.5 * 1000 * 10.0 / 2.0)
    assert c1 == c0  # no output reported: nothing more charged at completion
    assert eff is not None


def test_single_tenant_priority_zero_decisions_do_not_depend_on_fairness() -> None:
    """With one tenant and priority 0, VTC changes nothing (docs/priority.md §4)."""
    runs = []
    for prio in (PriorityConfig(), PriorityConfig(fairness="off")):
        h = Harness(token_capacity_per_dp_rank=2000, max_active_programs_per_target=3, priority=prio)
        for i in range(12):
            h.submit(f"p{i % 5}", 200 + 37 * i, at=float(i))
            if i % 3 == 2:
                live = sorted(h.state.in_flight)
                if live:
                    h.complete(live[0], at=float(i) + 0.5, prompt=300, completion=20)
        h.tick(at=40.0)
        runs.append([e for e in h.log])
    assert runs[0] == runs[1]


# ---- diagnostics -------------------------------------------------------------------------------


def test_snapshot_has_class_and_tenant_sections() -> None:
    import json

    from actors.core.snapshot import diagnostics_document, snapshot

    h = Harness(token_capacity_per_dp_rank=1000, batch=BATCH)
    h.submit("a", 800)
    interactive(h, "i1", 300, tenant="t1", priority=2, at=1.0)
    h.feed(BatchSubmitted(RequestId("b1"), "job", 50, max_tokens=10, tenant="t2"), at=1.5)
    doc = diagnostics_document(snapshot(h.state, h.cfg, 3.0))
    json.dumps(doc)
    prio = doc["priority"]
    assert prio["class_order"] == ["interactive", "agent", "batch"] and prio["fairness"] == "vtc"
    by_class = {c["request_class"]: c for c in prio["classes"]}
    assert by_class["interactive"]["waiting_requests"] == 1 and by_class["interactive"]["oldest_wait_seconds"] == 2.0
    assert by_class["agent"]["running_requests"] == 1 and by_class["agent"]["active_programs"] == 1
    assert by_class["batch"]["band"] == 2
    tenants = {t["tenant"]: t for t in prio["tenants"]}
    assert set(tenants) == {"default", "t1", "t2"} and tenants["t1"]["waiting_requests"] == 1
    assert tenants["default"]["input_tokens"] == 800 and prio["tenants_total"] == 3
    assert "priority" not in diagnostics_document(snapshot(h.state, h.cfg, 3.0, include_programs=False))


def test_idle_accounts_are_pruned_beyond_the_bound_without_credit() -> None:
    fair = fairness.FairnessState()
    cfg = PriorityConfig()
    for i in range(10):
        fairness.arrive(fair, cfg, f"t{i}", 0.0)
        fairness.charge(fair, cfg, f"t{i}", input_tokens=i)
        fairness.leave(fair, cfg, f"t{i}", 0.0, dispatched=True)
    fairness.arrive(fair, cfg, "busy", 0.0)  # lifted to the last leaver's counter: the floor
    assert fairness.prune(fair, cfg, 1.0, keep=4) == 7
    assert "busy" in fair.accounts and len(fair.accounts) == 4


def test_prune_forgets_idle_accounts_at_most_the_smallest_backlogged_counter_oldest_first() -> None:
    """docs/priority.md §3, "Memory": beyond the bound the tick forgets idle tenants (nothing waiting,
    no KV held) whose counter is at most the lift floor -- the smallest counter of the backlogged
    tenants -- oldest first."""

    def accounts() -> fairness.FairnessState:
        fair = fairness.FairnessState()
        cfg = PriorityConfig()
        for name, served in [("a", 1), ("b", 3), ("c", 5), ("h", 0), ("w3", 3), ("w7", 7)]:
            fairness.charge(fair, cfg, name, input_tokens=served)  # counter = served (weight 1)
        fairness.hold(fair, cfg, "h", 0.0, 0.0, 10.0, 0.0)  # h holds KV (an idle Program's context)
        fairness.arrive(fair, cfg, "w3", 0.0)  # backlogged, one request each
        fairness.arrive(fair, cfg, "w7", 0.0)
        return fair

    fair = accounts()
    assert fairness.prune(fair, PriorityConfig(), 1.0, keep=1) == 2  # a (1) and b (3 = the floor)
    assert list(fair.accounts) == ["c", "h", "w3", "w7"]
    fair = accounts()
    assert fairness.prune(fair, PriorityConfig(), 1.0, keep=5) == 1  # one over the bound: the oldest
    assert list(fair.accounts) == ["b", "c", "h", "w3", "w7"]
    # with nothing backlogged the floor is the counter of the last tenant that stopped waiting
    fair = accounts()
    fairness.leave(fair, PriorityConfig(), "w7", 1.0, dispatched=True)
    fairness.leave(fair, PriorityConfig(), "w3", 1.0, dispatched=True)
    assert fairness.prune(fair, PriorityConfig(), 1.0, keep=1) == 3  # a, b and w3 (3); not c, h, w7
    assert list(fair.accounts) == ["c", "h", "w7"]


def test_idle_accounts_are_kept_up_to_4096() -> None:
    """docs/priority.md §3, "Memory": accounts of idle tenants are kept up to 4096 (the tick's bound)."""
    fair = fairness.FairnessState()
    cfg = PriorityConfig()
    for i in range(4096):
        fairness.account(fair, f"t{i}")
    assert fairness.prune(fair, cfg, 1.0) == 0 and len(fair.accounts) == 4096
    fairness.account(fair, "one-more")
    assert fairness.prune(fair, cfg, 1.0) == 1 and len(fair.accounts) == 4096


@pytest.mark.parametrize(
    ("fair", "expected"),
    [("vtc", ["a0", "b0", "a1", "b1", "a2", "a3"]), ("off", ["a0", "a1", "a2", "a3", "b0", "b1"])],
)
def test_programs_of_two_tenants_alternate_under_vtc(fair: str, expected: list[str]) -> None:
    """One Program slot; tenant a queued four Programs before tenant b's two (docs/priority.md §3)."""
    h = Harness(max_active_programs_per_target=1, priority=PriorityConfig(fairness=fair))
    for i, name in enumerate(["a0", "a1", "a2", "a3", "b0", "b1"]):
        h.feed(_submit(h, name, "tenant-" + name[0], 100), at=0.1 * i)
    order = []
    for k in range(6):
        (rid,) = sorted(h.state.in_flight)
        order.append(h.state.in_flight[rid].ref.program_id)
        h.complete(rid, at=1.0 + k, prompt=100, completion=10)  # TTL 0: the slot frees at once
    assert order == expected


# ---- headroom for interactive (docs/priority.md §2) -------------------------------------------


def test_interactive_arrival_preempts_batch_down_to_the_headroom_cap_youngest_first() -> None:
    prio = PriorityConfig(batch_max_running_near_interactive=1, interactive_window_seconds=5.0)
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH, priority=prio)
    h.feed(BatchSubmitted(RequestId("b0"), "job", 100, max_tokens=10, preemptible=True), 0.0)
    h.feed(BatchSubmitted(RequestId("b1"), "job", 100, max_tokens=10, preemptible=False), 0.5)
    h.feed(BatchSubmitted(RequestId("b2"), "job", 100, max_tokens=10, preemptible=True), 0.75)
    assert h.rank().batch_requests == 3  # no interactive traffic yet: batch runs uncapped
    eff = interactive(h, "i1", 100, max_tokens=10, at=1.0)
    # the youngest restartable first (b2), then b0; b1 cannot be restarted and keeps running
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["b2", "b0"]
    assert admitted_interactive(eff) == ["i1"]
    assert h.rank().batch_requests == 1
    assert check(h.state, h.cfg) == []


def test_batch_is_capped_while_interactive_traffic_is_recent_then_runs_again() -> None:
    prio = PriorityConfig(batch_max_running_near_interactive=1, interactive_window_seconds=5.0)
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH, priority=prio)
    interactive(h, "i1", 100, max_tokens=10, at=0.0)
    h.complete("i1")
    for i in range(3):
        h.feed(BatchSubmitted(RequestId(f"b{i}"), "job", 100, max_tokens=10), 1.0)
    assert h.rank().batch_requests == 1  # within 5 s of the interactive arrival
    h.feed(RepairTick(), 5.0)
    assert h.rank().batch_requests == 1  # 5.0 - 0.0 is not past the window
    h.feed(RepairTick(), 5.5)
    assert h.rank().batch_requests == 3  # the window passed: batch fills the rank again


def test_headroom_cap_is_off_by_default() -> None:
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH)
    interactive(h, "i1", 100, max_tokens=10, at=0.0)
    for i in range(3):
        h.feed(BatchSubmitted(RequestId(f"b{i}"), "job", 100, max_tokens=10, preemptible=True), 1.0)
    eff = interactive(h, "i2", 100, max_tokens=10, at=1.5)
    assert of(eff, fx.PreemptBatch) == [] and h.rank().batch_requests == 3


def test_interactive_arrival_preempts_a_batch_request_still_in_prefill_and_holds_new_batch() -> None:
    # prefill estimate of 2000 tokens with the default cost model: about 0.198 s (+ one 0.011 s step)
    prio = PriorityConfig(batch_max_running_near_interactive=4, interactive_window_seconds=5.0)
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH, priority=prio)
    h.feed(BatchSubmitted(RequestId("old"), "job", 2000, max_tokens=10, preemptible=True), 0.0)
    h.feed(BatchSubmitted(RequestId("young"), "job", 2000, max_tokens=10, preemptible=True), 0.9)
    eff = interactive(h, "i1", 2000, max_tokens=10, at=1.0)
    # under the cap of 4, but "young" was dispatched 0.1 s ago: probably still prefilling
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["young"]
    assert admitted_interactive(eff) == ["i1"]
    # while i1 is probably in its prefill no batch request is dispatched on its rank ...
    eff = h.feed(BatchSubmitted(RequestId("new"), "job", 100, max_tokens=10, preemptible=True), 1.1)
    assert of(eff, fx.AdmitBatch) == [] and h.rank().batch_requests == 1
    # ... and after it (the next tick) batch runs again, up to the cap
    eff = h.feed(RepairTick(), 1.5)
    assert sorted(e.request_id for e in of(eff, fx.AdmitBatch)) == ["new", "young"]
    assert check(h.state, h.cfg) == []


# ---- fair share of a rank between tenants (tenant_pause_share) --------------------------------


def _tenant_submit(
    h: Harness, program: str, tenant: str, tokens: int, at: float, **hints: object
) -> tuple[object, ...]:
    from core_support import Ident

    from actors.core.events import RequestSubmitted

    h._n += 1
    ident = Ident(program, placement_key=program, placement_hash_key=program)
    event = RequestSubmitted(RequestId(f"r{h._n}"), ident, tokens, tenant=tenant, hints=RequestHints(**hints))  # type: ignore[arg-type]
    return h.feed(event, at=at)


def test_a_tenant_above_its_fair_share_is_paused_for_another_tenants_waiter() -> None:
    for share, expected in ((True, ["r2"]), (False, [])):
        h = Harness(token_capacity_per_dp_rank=1000, priority=PriorityConfig(tenant_pause_share=share))
        _tenant_submit(h, "xa", "x", 600, 0.0, kv_retention_ttl_seconds=60.0)
        h.complete("r1", at=1.0, prompt=600)  # acting, 700 held: more than x's half of the rank
        eff = _tenant_submit(h, "yb", "y", 400, 2.0)
        assert admitted(eff) == expected
        assert ("priority_preemption" in reasons(eff)) is share
        assert check(h.state, h.cfg) == []


def test_fair_share_admission_caps_a_tenant_only_while_another_has_work() -> None:
    h = Harness(token_capacity_per_dp_rank=10_000, priority=PriorityConfig(tenant_pause_share=True))
    for i in range(3):  # one tenant alone: no cap (4 x 1100 held)
        assert admitted(_tenant_submit(h, f"s{i}", "solo", 1000, 0.0)) == [f"r{i + 1}"]
    h = Harness(token_capacity_per_dp_rank=10_000, priority=PriorityConfig(tenant_pause_share=True))
    assert admitted(_tenant_submit(h, "xa", "x", 1000, 0.0)) == ["r1"]  # 1100
    assert admitted(_tenant_submit(h, "yb", "y", 100, 0.0)) == ["r2"]  # y has work: x's share is 5000
    assert admitted(_tenant_submit(h, "xc", "x", 3000, 0.0)) == ["r3"]  # 4200 <= 5000
    assert admitted(_tenant_submit(h, "xd", "x", 1000, 0.0)) == []  # 5300 > 5000: waits
    assert check(h.state, h.cfg) == []


# ---- isolating light tenants (heavy_tenant_max_active_per_rank) -----------------------------

ISO = PriorityConfig(heavy_tenant_max_active_per_rank=1, tenant_isolation_window_seconds=3.0)


def test_a_heavy_tenant_keeps_at_most_the_cap_on_a_rank_a_light_tenant_uses() -> None:
    h = Harness(token_capacity_per_dp_rank=10_000, priority=ISO)
    for i in range(6):  # alone, x is never capped: 4 x 2100 held, two more wait for room
        assert admitted(_tenant_submit(h, f"x{i}", "x", 2000, 0.0)) == ([f"r{i + 1}"] if i < 4 else [])
    # y arrives: x demands 12600 > its half of the rank (5000), y 600: x is heavy and the rank is
    # shared with y, so three of x's four busy Programs are marked to pause when their request ends
    eff = _tenant_submit(h, "y0", "y", 500, 1.0)
    assert reasons(eff).count("tenant_isolation_mark") == 3
    assert admitted(eff) == ["r7"]  # 8400 + 600 fit the rank
    marked = sorted(p.ref.program_id for p in h.rank().active.values() if p.pause_when_idle)
    assert marked == ["x1", "x2", "x3"]  # the most recently activated (equal sizes)
    eff = h.complete("r2", at=1.5, prompt=2000)
    assert "tenant_isolation" in reasons(eff) and h.program("x1").state == "paused"
    # x1's next request waits: x keeps one Program on the rank while y uses it, room or not
    assert admitted(_tenant_submit(h, "x1", "x", 2100, 1.6)) == []
    assert admitted(h.complete("r3", at=1.7, prompt=2000)) == []
    assert admitted(h.complete("r4", at=1.8, prompt=2000)) == []  # y last seen on the rank
    assert admitted(h.complete("r7", at=2.0, prompt=500, terminate=True)) == []  # y's Program ends
    # the rank stays y's for the window (3 s) after y was last there ...
    assert admitted(h.tick(4.7)) == []
    # ... then x fills it again
    assert sorted(admitted(h.tick(4.9))) == ["r5", "r6", "r8"]
    assert check(h.state, h.cfg) == []


@pytest.mark.parametrize("tool_call_seconds", [10.0, 0.0])
def test_a_light_tenants_rank_stays_its_own_through_its_tool_call(tool_call_seconds: float) -> None:
    prio = attrs.evolve(ISO, heavy_tenant_max_active_per_rank=0, tenant_isolation_tool_call_seconds=tool_call_seconds)
    h = Harness(token_capacity_per_dp_rank=10_000, priority=prio)
    for i in range(10):  # x demands far more than its share even once its four active ones pause
        assert admitted(_tenant_submit(h, f"x{i}", "x", 2000, 0.0)) == ([f"r{i + 1}"] if i < 4 else [])
    assert admitted(_tenant_submit(h, "y0", "y", 500, 1.0)) == ["r11"]  # x's four are marked
    for n, at in ((1, 1.2), (2, 1.3), (3, 1.4), (4, 1.5)):
        assert admitted(h.complete(f"r{n}", at=at, prompt=2000)) == []  # x's Programs leave the rank
    # y's request ends in a tool call: y will send its next turn to this rank
    assert admitted(h.complete("r11", at=2.0, prompt=500, finish_reason="tool_calls")) == []
    if tool_call_seconds == 0:
        # the window alone: 3 s after y was last there, x fills the rank again ...
        assert sorted(admitted(h.tick(5.1))) == ["r5", "r6", "r7", "r8"]
        # ... and y's next turn, 5 s after its last, waits for x's Programs to leave
        assert admitted(_tenant_submit(h, "y0", "y", 2000, 7.0)) == []
        return
    # through the tool call (up to 10 s) the rank stays y's: x resumes nothing there
    assert admitted(h.tick(5.1)) == admitted(h.tick(6.9)) == []
    assert admitted(_tenant_submit(h, "y0", "y", 2000, 7.0)) == ["r12"]  # back: admitted at once
    # y's task ends with a natural stop: no next turn, the window alone holds the rank, 3 s after
    # the last pass that saw y there (its arrival at 7.0)
    assert admitted(h.complete("r12", at=7.5, prompt=2000, finish_reason="stop")) == []
    assert admitted(h.tick(9.9)) == []
    assert sorted(admitted(h.tick(10.1))) == ["r5", "r6", "r7", "r8"]
    assert check(h.state, h.cfg) == []


def test_a_tool_call_holds_a_light_tenants_rank_at_most_tenant_isolation_tool_call_seconds() -> None:
    prio = attrs.evolve(ISO, heavy_tenant_max_active_per_rank=0, tenant_isolation_tool_call_seconds=4.0)
    h = Harness(token_capacity_per_dp_rank=10_000, priority=prio)
    for i in range(10):
        _tenant_submit(h, f"x{i}", "x", 2000, 0.0)
    assert admitted(_tenant_submit(h, "y0", "y", 500, 1.0)) == ["r11"]
    for n, at in ((1, 1.2), (2, 1.3), (3, 1.4), (4, 1.5)):
        h.complete(f"r{n}", at=at, prompt=2000)
    h.complete("r11", at=2.0, prompt=500, finish_reason="tool_calls")
    # present until 6.0 (2.0 + 4 s) at the passes that saw it, then the 3 s window after that
    assert admitted(h.tick(6.0)) == []
    assert admitted(h.tick(8.9)) == []
    assert sorted(admitted(h.tick(9.1))) == ["r5", "r6", "r7", "r8"]
    assert check(h.state, h.cfg) == []


def test_a_waiting_programs_demand_counts_its_front_requests_expected_output() -> None:
    """A tenant's demand counts what its waiting Programs need, the front request's
    ``expected_output_length`` included (docs/priority.md §3): with it x is heavy, with the default
    output allowance it would not be (found by the mutation campaign of session 41)."""
    from actors.core import fairness_isolation

    h = Harness(token_capacity_per_dp_rank=10_000, priority=ISO)
    assert admitted(_tenant_submit(h, "x0", "x", 1000, 0.0)) == ["r1"]  # 1100 held
    assert admitted(_tenant_submit(h, "y0", "y", 500, 0.0)) == ["r2"]  # 600 held
    # 2000 of context and 7000 expected output: 9000 does not fit beside 1700, x1 waits; a second
    # request of x1 without the hint waits behind it (the Program's latest allowance is the default)
    assert admitted(_tenant_submit(h, "x1", "x", 2000, 0.0, expected_output_length=7000)) == []
    assert admitted(_tenant_submit(h, "x1", "x", 2000, 0.0)) == []
    # x demands 1100 + 9000 (its front request's) > its half (5000); with the default allowance
    # 1100 + 2100 would not be
    assert set(fairness_isolation.compute(h.state, record=False).values()) == {frozenset({"x"})}


def test_isolation_leaves_single_tenant_and_balanced_tenants_alone() -> None:
    h = Harness(token_capacity_per_dp_rank=10_000, priority=ISO)
    for i in range(4):
        assert admitted(_tenant_submit(h, f"a{i}", "a" if i % 2 else "b", 1000, 0.0)) == [f"r{i + 1}"]
    # two tenants, each below its half: nobody is heavy, nothing is marked
    eff = _tenant_submit(h, "a9", "a", 1000, 0.5)
    assert admitted(eff) == ["r5"] and "tenant_isolation_mark" not in reasons(eff)
    assert check(h.state, h.cfg) == []


def test_isolation_config_rules_name_the_fields() -> None:
    bad = PriorityConfig(
        heavy_tenant_max_active_per_rank=-1,
        tenant_isolation_window_seconds=-1.0,
        tenant_isolation_tool_call_seconds=-1.0,
        long_prefill_seconds=-1.0,
    )
    got = problems(bad, "priority")
    assert [line.split(":")[0] for line in got] == [
        "priority.heavy_tenant_max_active_per_rank",
        "priority.tenant_isolation_window_seconds",
        "priority.tenant_isolation_tool_call_seconds",
        "priority.long_prefill_seconds",
    ]
    assert problems(PriorityConfig(heavy_tenant_max_active_per_rank=0)) == []


# ---- one long prefill at a time per rank (long_prefill_seconds) -------------------------------

LONG = PriorityConfig(long_prefill_seconds=2.0)


def test_long_prefills_are_admitted_one_at_a_time_per_rank_short_ones_pass() -> None:
    # the reference cost model: 30,000 uncached tokens take 5.742 s to prefill, 1,000 take 0.127 s
    h = Harness(token_capacity_per_dp_rank=100_000, priority=LONG)
    assert admitted(_tenant_submit(h, "big0", "x", 30_000, 0.0)) == ["r1"]
    assert h.rank().long_prefill == (RequestId("r1"), pytest.approx(5.742, abs=1e-3))
    assert admitted(_tenant_submit(h, "big1", "x", 30_000, 0.1)) == []  # waits for big0's prefill
    assert admitted(_tenant_submit(h, "small", "y", 1_000, 0.2)) == ["r3"]  # short: not held
    # big0's request ends: its prefill is over, big1 goes
    assert admitted(h.complete("r1", at=3.0, prompt=30_000)) == ["r2"]
    assert h.rank().long_prefill == (RequestId("r2"), pytest.approx(3.0 + 5.742, abs=1e-3))
    # big0's next turn only adds 500 tokens to the context it has on this rank: short, not held
    assert admitted(_tenant_submit(h, "big0", "x", 30_600, 3.5)) == ["r4"]
    assert check(h.state, h.cfg) == []


def test_a_prefill_estimated_at_exactly_long_prefill_seconds_is_not_long() -> None:
    """docs/priority.md §3: only a request estimated to take *longer* than ``long_prefill_seconds``
    is held behind a long prefill in flight."""
    model = Harness().cfg.prefill_cost_model
    prio = PriorityConfig(long_prefill_seconds=prefill_seconds(20_000, model))
    h = Harness(token_capacity_per_dp_rank=100_000, priority=prio)
    assert admitted(_tenant_submit(h, "big0", "x", 30_000, 0.0)) == ["r1"]
    assert admitted(_tenant_submit(h, "over", "x", 20_001, 0.1)) == []  # longer: waits for big0's prefill
    assert admitted(_tenant_submit(h, "equal", "x", 20_000, 0.2)) == ["r3"]  # exactly the limit: not long
    assert h.rank().long_prefill == (RequestId("r1"), pytest.approx(5.742, abs=1e-3))


def test_a_long_prefill_marker_lapses_at_its_estimated_end_and_is_off_by_default() -> None:
    h = Harness(token_capacity_per_dp_rank=100_000, priority=LONG)
    assert admitted(_tenant_submit(h, "big0", "x", 30_000, 0.0)) == ["r1"]
    assert admitted(_tenant_submit(h, "big1", "x", 30_000, 0.1)) == []
    assert admitted(h.tick(5.7)) == []
    assert admitted(h.tick(5.8)) == ["r2"]  # 5.742 s after r1's dispatch, without its completion
    off = Harness(token_capacity_per_dp_rank=100_000, priority=PriorityConfig())
    assert admitted(_tenant_submit(off, "big0", "x", 30_000, 0.0)) == ["r1"]
    assert admitted(_tenant_submit(off, "big1", "x", 30_000, 0.1)) == ["r2"]
    assert off.rank().long_prefill is None


# ---- ranks reserved for interactive (docs/priority.md §2) --------------------------------------

RESERVING = PriorityConfig(
    batch_max_running_near_interactive=1, interactive_window_seconds=5.0, interactive_reserved_ranks=1
)


def _batch_on(h: Harness, i: int) -> list[str]:
    assert h.state.batch is not None
    return sorted(r.request_id for r in h.state.batch.running.values() if r.target_id == h.rank(i).target_id)


def _fill_two_ranks(h: Harness) -> None:
    """Five restartable batch requests at t = 0.0, 0.1, ... 0.4 on two ranks (no interactive traffic yet)."""
    for i in range(5):
        h.feed(BatchSubmitted(RequestId(f"b{i}"), "job", 100, max_tokens=10, preemptible=True), 0.1 * i)


def test_a_reserved_rank_sheds_its_batch_and_takes_the_interactive_request() -> None:
    h = Harness(token_capacity_per_dp_rank=100_000, n_targets=2, batch=BATCH, priority=RESERVING)
    _fill_two_ranks(h)
    assert (_batch_on(h, 0), _batch_on(h, 1)) == (["b0", "b2", "b4"], ["b1", "b3"])
    eff = interactive(h, "i1", 100, max_tokens=10, at=1.0)
    # rank 1 runs fewer batch requests: it is reserved, every batch request on it is preempted
    # (youngest first) and the interactive request goes there; rank 0 keeps its three, uncapped
    assert h.state.interactive.reserved == {"default": (h.rank(1).target_id,)}
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["b3", "b1"]
    assert [(e.request_id, e.target_id) for e in of(eff, fx.AdmitInteractive)] == [("i1", h.rank(1).target_id)]
    # the preempted requests went to rank 0 in the same step: no headroom cap outside the reservation
    assert (_batch_on(h, 0), _batch_on(h, 1)) == (["b0", "b1", "b2", "b3", "b4"], [])
    assert priority_snapshot(h.state, h.now).interactive_reserved_ranks == (str(h.rank(1).target_id),)
    assert check(h.state, h.cfg) == []


def test_a_reserved_rank_takes_no_batch_until_the_window_has_passed() -> None:
    h = Harness(token_capacity_per_dp_rank=100_000, n_targets=2, batch=BATCH, priority=RESERVING)
    interactive(h, "i1", 100, max_tokens=10, at=0.0)
    h.complete("i1", at=0.5)
    reserved = h.state.interactive.reserved["default"]
    assert reserved == (h.rank(0).target_id,)  # no batch anywhere: the lowest index
    for i in range(3):
        h.feed(BatchSubmitted(RequestId(f"b{i}"), "job", 100, max_tokens=10), 1.0)
    assert (_batch_on(h, 0), _batch_on(h, 1)) == ([], ["b0", "b1", "b2"])
    h.feed(RepairTick(), 5.0)  # 5.0 - 0.0 is not past the window
    h.feed(BatchSubmitted(RequestId("b3"), "job", 100, max_tokens=10), 5.0)
    assert _batch_on(h, 0) == []
    h.feed(RepairTick(), 5.5)
    h.feed(BatchSubmitted(RequestId("b4"), "job", 100, max_tokens=10), 5.5)
    assert _batch_on(h, 0) == ["b4"]  # the window passed: the rank is batch's again
    assert priority_snapshot(h.state, h.now).interactive_reserved_ranks == ()
    # the next interactive arrival opens a new window and reserves the rank with the least batch
    interactive(h, "i2", 100, max_tokens=10, at=6.0)
    assert h.state.interactive.reserved["default"] == (h.rank(0).target_id,)
    assert check(h.state, h.cfg) == []


def test_interactive_requests_prefer_the_reserved_rank_over_a_rank_with_more_free_tokens() -> None:
    h = Harness(token_capacity_per_dp_rank=100_000, n_targets=2, batch=BATCH, priority=RESERVING)
    interactive(h, "big", 30_000, max_tokens=10, at=0.0)  # reserves rank 0 and runs there
    eff = interactive(h, "i2", 100, max_tokens=10, at=0.5)
    # rank 1 has more free tokens, but rank 0 runs no batch (neither does rank 1: a tie on batch,
    # so the most free tokens win, as without a reservation)
    assert [e.target_id for e in of(eff, fx.AdmitInteractive)] == [h.rank(1).target_id]
    h.feed(BatchSubmitted(RequestId("b0"), "job", 100, max_tokens=10), 0.6)
    assert _batch_on(h, 1) == ["b0"]
    eff = interactive(h, "i3", 100, max_tokens=10, at=0.7)
    assert [e.target_id for e in of(eff, fx.AdmitInteractive)] == [h.rank(0).target_id]  # no batch there
    assert of(eff, fx.PreemptBatch) == []
    assert check(h.state, h.cfg) == []


def test_a_one_rank_pool_keeps_the_headroom_cap_instead_of_a_reservation() -> None:
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH, priority=RESERVING)
    for i in range(3):
        h.feed(BatchSubmitted(RequestId(f"b{i}"), "job", 100, max_tokens=10, preemptible=True), 0.1 * i)
    eff = interactive(h, "i1", 100, max_tokens=10, at=1.0)
    assert h.state.interactive.reserved == {}  # batch keeps the pool's only rank
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["b2", "b1"]  # down to the cap of 1
    assert admitted_interactive(eff) == ["i1"] and h.rank().batch_requests == 1


def test_without_reserved_ranks_both_ranks_keep_the_headroom_cap() -> None:
    prio = attrs.evolve(RESERVING, interactive_reserved_ranks=0)
    h = Harness(token_capacity_per_dp_rank=100_000, n_targets=2, batch=BATCH, priority=prio)
    _fill_two_ranks(h)
    eff = interactive(h, "i1", 100, max_tokens=10, at=1.0)
    # the rank with the most free tokens (rank 1: two requests) keeps one batch request beside it
    assert [e.target_id for e in of(eff, fx.AdmitInteractive)] == [h.rank(1).target_id]
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["b3"]
    assert (len(_batch_on(h, 0)), len(_batch_on(h, 1))) == (3, 1)  # no new batch beyond the cap
    assert h.state.interactive.reserved == {}


def test_interactive_reserved_ranks_rule_names_the_field() -> None:
    got = problems(PriorityConfig(interactive_reserved_ranks=-1), "priority")
    assert [line.split(":")[0] for line in got] == ["priority.interactive_reserved_ranks"]


def test_a_reserved_rank_that_leaves_the_pool_is_replaced_at_the_next_arrival() -> None:
    from core_support import POOL, targets

    from actors.core.events import TargetsChanged

    h = Harness(token_capacity_per_dp_rank=100_000, n_targets=3, batch=BATCH, priority=RESERVING)
    interactive(h, "i1", 100, max_tokens=10, at=0.0)
    assert h.state.interactive.reserved[POOL] == (h.rank(0).target_id,)
    h.feed(TargetsChanged(POOL, targets(3)[1:]), 0.5)  # rank 0 leaves
    h.feed(BatchSubmitted(RequestId("b0"), "job", 100, max_tokens=10, preemptible=True), 0.6)
    h.feed(BatchSubmitted(RequestId("b1"), "job", 100, max_tokens=10, preemptible=True), 0.7)
    # no rank of the pool is reserved until the next arrival: batch takes both remaining ranks
    assert priority_snapshot(h.state, h.now).interactive_reserved_ranks == ()
    assert (_batch_on(h, 1), _batch_on(h, 2)) == (["b0"], ["b1"])
    eff = interactive(h, "i2", 100, max_tokens=10, at=1.0)
    # the window is still open: the reservation is topped up (a tie on batch: the lowest index)
    assert h.state.interactive.reserved[POOL] == (h.rank(1).target_id,)
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["b0"]
    assert [e.target_id for e in of(eff, fx.AdmitInteractive)] == [h.rank(1).target_id]
    assert check(h.state, h.cfg) == []


def test_a_programs_next_request_ends_its_tool_call() -> None:
    """A Program between turns leaves the tenant isolation's tool-call table when its next request arrives."""
    prio = attrs.evolve(ISO, heavy_tenant_max_active_per_rank=0, tenant_isolation_tool_call_seconds=10.0)
    h = Harness(token_capacity_per_dp_rank=10_000, priority=prio)
    assert admitted(_tenant_submit(h, "y0", "y", 500, 0.0)) == ["r1"]
    h.complete("r1", at=1.0, prompt=500, finish_reason="tool_calls")
    ref = h.program("y0").ref
    assert h.state.isolation_tool_calls["default"] == {ref: ("y", h.rank().target_id, 1.0)}
    _tenant_submit(h, "y0", "y", 600, 2.0)
    assert h.state.isolation_tool_calls["default"] == {}
