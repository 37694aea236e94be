"""Edges of a Program request's arrival (actors/core/arrival.py, docs/program-scheduling.md §1, §3,
§5, §9.1, §15) that the mutation campaign found untested: the pool's targets sent with the request,
a request already forwarded under a resume pass, the end of an acting period, one continuity sample
per idle period, a second failover, and the metadata each arrival refreshes.  Exact virtual times."""

from __future__ import annotations

from typing import Any

from core_support import POOL, Harness, Ident, admitted, of, reasons, targets, tid

from actors.core import effects as fx
from actors.core.events import RequestSubmitted, TargetsChanged
from actors.core.ids import RequestId
from actors.core.invariants import check
from actors.core.model import RequestHints


def _event(rid: str, program: str = "p", **kw: Any) -> RequestSubmitted:
    return RequestSubmitted(RequestId(rid), Ident(program, program, program), 100, **kw)


def _ran_and_paused(h: Harness, program: str = "p") -> None:
    """``program`` ran r1 on its rank 0 and paused (the warm-up acting TTL is 0)."""
    h.submit(program, rid="r1", at=0.0)
    h.complete("r1", at=1.0, prompt=100, completion=10)
    assert (h.program(program).lifecycle, h.program(program).last_target) == ("paused_acting", tid(0))


def test_the_targets_sent_with_a_request_are_the_pools_targets() -> None:
    """``RequestSubmitted.targets``: the shell's current target list is taken before placing."""
    h = Harness(n_targets=0)
    eff = h.feed(_event("r1", targets=targets(2)), at=1.0)
    assert [(e.request_id, e.target_id) for e in of(eff, fx.Admit)] == [("r1", tid(1))]
    assert h.state.pools[POOL] == (tid(0), tid(1))
    assert of(eff, fx.Reject) == []


def test_a_request_of_a_pool_without_targets_is_refused_before_any_program_exists() -> None:
    """B2: no target, a 503 and nothing else: no Program generation is spawned or remembered."""
    h = Harness(n_targets=0)
    eff = h.submit("p", at=1.0)
    assert [(type(e).__name__, e.request_id, e.reason, e.status_hint) for e in eff] == [
        ("Reject", "r1", "no_targets", 503)
    ]
    assert h.state.programs == {} and h.state.last_generations == {}
    assert h.state.pool.get(RequestId("r1")) is None


def test_a_request_forwarded_under_a_revoked_pass_is_admitted_where_it_is() -> None:
    """docs/program-scheduling.md §15: the relay forwarded the request to rank 1 under a pass revoked since; the paused
    Program is admitted there as it stands (``pass_race_admit``), not where its binding is."""
    h = Harness(n_targets=2, binding_strategy="program_round_robin")
    _ran_and_paused(h)
    eff = h.feed(_event("r2", already_on=tid(1)), at=60.0)
    assert reasons(eff) == ["pass_race_admit", "cross_rank_resume"]
    assert [(e.request_id, e.target_id) for e in of(eff, fx.Admit)] == [("r2", tid(1))]
    p = h.program("p")
    assert (p.lifecycle, p.placement, p.last_target) == ("active_reasoning", tid(1), tid(1))
    assert [(e.kind, e.program.program_id) for e in of(eff, fx.CancelTimer)] == [("paused_retention", "p")]
    assert check(h.state, h.cfg) == []


def test_a_forwarded_request_of_an_active_program_is_dispatched_once_on_its_placement() -> None:
    """An Active Program dispatches the forwarded request as any other: one Admit, no transition."""
    h = Harness(n_targets=2, binding_strategy="program_round_robin")
    h.submit("p", rid="r1", at=0.0)
    eff = h.feed(_event("r2", already_on=tid(0)), at=1.0)
    assert [(e.request_id, e.target_id) for e in of(eff, fx.Admit)] == [("r2", tid(0))]
    assert reasons(eff) == []
    assert h.program("p").in_flight == 2
    assert check(h.state, h.cfg) == []


def test_a_forwarded_request_whose_target_left_the_pool_is_refused_and_not_kept() -> None:
    """The pass's target left the pool: B2's refusal, and the request no longer waits."""
    h = Harness(n_targets=2, binding_strategy="program_round_robin")
    _ran_and_paused(h)
    h.feed(TargetsChanged(POOL, targets(1)), at=2.0)
    eff = h.feed(_event("r2", already_on=tid(1)), at=3.0)
    assert [(e.request_id, e.reason, e.status_hint) for e in of(eff, fx.Reject)] == [("r2", "no_targets", 503)]
    assert admitted(eff) == [] and reasons(eff) == []
    assert h.state.pool.get(RequestId("r2")) is None
    assert h.state.pool.program_len(h.program("p").ref) == 0
    assert check(h.state, h.cfg) == []


def test_an_arrival_ends_the_acting_period_and_cancels_its_ttl_timer() -> None:
    """Active/Acting -> Active/Reasoning: the acting TTL armed at the completion no longer holds."""
    h = Harness(n_targets=1)
    h.submit("p", rid="r1", at=0.0, hints=RequestHints(kv_retention_ttl_seconds=10.0))
    h.complete("r1", at=1.0, prompt=100, completion=10)
    p = h.program("p")
    assert (p.lifecycle, p.acting_since, p.ttl_deadline) == ("active_acting", 1.0, 11.0)
    eff = h.submit("p", rid="r2", at=2.0)
    assert (p.lifecycle, p.acting_since, p.ttl_deadline) == ("active_reasoning", None, None)
    assert [e.kind for e in of(eff, fx.CancelTimer)] == ["acting_ttl"]
    assert h.timers == {}


def test_an_arrival_while_a_request_is_in_flight_takes_no_continuity_sample() -> None:
    """The interval sample is completion -> arrival of an *idle* Program: with r2 still running when
    r1 finished, r3's arrival is no continuity sample."""
    h = Harness(n_targets=1)
    h.submit("p", rid="r1", at=0.0)
    h.submit("p", rid="r2", at=0.5)
    h.complete("r1", at=1.0, prompt=100, completion=10)
    eff = h.submit("p", rid="r3", at=3.0)
    assert of(eff, fx.RequestIntervalObserved) == []
    assert len(h.rank().factors.continuities) == 0 and h.program("p").continuity_sampled_at is None


def test_two_arrivals_of_one_idle_period_take_one_continuity_sample() -> None:
    """B9: the Program stays paused (its rank is full), so both arrivals find it idle; the second is
    no new sample of the same idle period."""
    h = Harness(n_targets=1, max_active_programs_per_target=1)
    _ran_and_paused(h)
    h.submit("x", rid="rx", at=2.0)  # holds the only slot
    first = h.submit("p", rid="r2", at=4.0)
    second = h.submit("p", rid="r3", at=6.0)
    assert [e.seconds for e in of(first, fx.RequestIntervalObserved)] == [3.0]
    assert of(second, fx.RequestIntervalObserved) == []
    p = h.program("p")
    assert (p.lifecycle, p.in_flight, p.continuity_sampled_at) == ("paused_reasoning", 0, 1.0)
    assert len(h.rank().factors.continuities) == 1


def test_a_new_generation_is_paused_and_anchored_at_its_arrival() -> None:
    """The shared prefix's freshness counts from the generation's creation (docs/program-scheduling.md §2.2): created at
    5 s, its first measurement is fresh until 5 + the warm-up (100 s); it then holds for its TTL."""
    h = Harness(n_targets=1)
    h.submit("p", rid="r1", at=5.0, hints=RequestHints(kv_retention_ttl_seconds=10.0))
    p = h.program("p")
    assert (p.paused_at, p.shared_prefix_freshness_anchor_at) == (5.0, 5.0)
    h.complete("r1", at=6.0, prompt=100, cached=0, completion=10)
    assert (p.lifecycle, p.shared_prefix_fresh_until) == ("active_acting", 105.0)


def test_the_lineage_learns_the_declared_root() -> None:
    """A child declaring its parent and root is linked to the root (diagnostics, docs/program-scheduling.md §10)."""
    h = Harness(n_targets=1)
    h.submit("c", ident=Ident("c", "c", "c", parent_program_id="a", root_program_id="root"))
    assert h.state.lineage.root(POOL, "c") == "root"
    assert h.state.lineage.parents[(POOL, "c")] == "root"


def test_a_program_changing_tenant_settles_its_rent_with_the_previous_one() -> None:
    """docs/priority.md §3: what it held so far is charged to the tenant it held it for; the
    Program then belongs to the new tenant."""
    h = Harness(n_targets=1)
    ttl = RequestHints(kv_retention_ttl_seconds=10.0)
    h.feed(RequestSubmitted(RequestId("r1"), Ident("p", "p", "p"), 100, ttl, tenant="a"), at=0.0)
    h.complete("r1", at=1.0, prompt=100, completion=10)  # Active/Acting: it holds its tokens from 1 s
    p = h.program("p")
    held = p.rent_tokens
    assert (p.lifecycle, held, p.rent_since) == ("active_acting", p.charged_tokens, 1.0) and held > 0
    h.feed(RequestSubmitted(RequestId("r2"), Ident("p", "p", "p"), 100, tenant="b"), at=4.0)
    assert p.tenant == "b"
    assert h.state.fair.accounts["a"].kv_token_seconds == held * 3.0
    assert h.state.fair.accounts["a"].held_tokens == 0.0
    assert "b" not in h.state.fair.accounts or h.state.fair.accounts["b"].kv_token_seconds == 0.0


def test_an_estimate_equal_to_the_known_context_resets_the_shrink_count() -> None:
    """The estimate only grows on arrival; a new estimate at least as large as it (also equal)
    confirms it and clears the pending shrink observations."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    h.submit("p", rid="r1", tokens=1000, at=0.0)
    h.complete("r1", at=1.0, prompt=600, completion=10)  # one shrink observation
    p = h.program("p")
    assert (p.estimated_context_tokens, p.context_shrink_observations) == (1000, 1)
    h.submit("p", rid="r2", tokens=1000, at=2.0)
    assert (p.estimated_context_tokens, p.context_shrink_observations) == (1000, 0)
    h.submit("p", rid="r3", tokens=1200, at=2.5)
    h.complete("r2", at=3.0, prompt=700, completion=10)
    assert (p.estimated_context_tokens, p.context_shrink_observations) == (1200, 1)


def test_each_arrival_refreshes_the_identity_metadata() -> None:
    """The latest request's identity fields win; the step id counts up when it is not given."""
    h = Harness(n_targets=1)
    first = Ident(
        "p",
        placement_key="k1",
        placement_hash_key="h1",
        task_id="t1",
        session_id="s1",
        agent_id="a1",
        parent_program_id="parent1",
        root_program_id="root1",
        blocks_parent=True,
        agent_role="planner",
        spawn_reason="why",
    )
    h.submit("p", rid="r1", at=0.0, ident=first)
    p = h.program("p")
    fields = ("placement_key", "placement_hash_key", "task_id", "session_id", "agent_id")
    more = ("parent_program_id", "root_program_id", "blocks_parent", "agent_role", "spawn_reason", "step_id")
    seen = tuple(getattr(p, f) for f in fields + more)
    assert seen == ("k1", "h1", "t1", "s1", "a1", "parent1", "root1", True, "planner", "why", 0)
    h.complete("r1", at=1.0, prompt=100, completion=10)
    h.submit("p", rid="r2", at=2.0, ident=Ident("p", placement_key="k2", placement_hash_key="h2", task_id="t2"))
    seen = tuple(getattr(p, f) for f in fields + more)
    assert seen == ("k2", "h2", "t2", None, None, None, None, False, None, None, 1)
    h.complete("r2", at=3.0, prompt=100, completion=10)
    h.submit("p", rid="r3", at=4.0, ident=Ident("p", "k2", "h2", step_id=7))
    assert p.step_id == 7
    h.complete("r3", at=5.0, prompt=100, completion=10)
    h.submit("p", rid="r4", at=6.0, ident=Ident("p", "k2", "h2"))
    assert p.step_id == 8


def test_the_step_id_saturates_at_the_largest_64_bit_value() -> None:
    """An omitted step id counts up from the last one, never past 2**64 - 1."""
    h = Harness(n_targets=1)
    h.submit("p", rid="r1", at=0.0, ident=Ident("p", "p", "p", step_id=2**64 - 2))
    h.complete("r1", at=1.0, prompt=100, completion=10)
    h.submit("p", rid="r2", at=2.0)
    assert h.program("p").step_id == 2**64 - 1
    h.complete("r2", at=3.0, prompt=100, completion=10)
    h.submit("p", rid="r3", at=4.0)
    assert h.program("p").step_id == 2**64 - 1


def test_a_pass_race_admission_over_capacity_is_repaired_in_the_same_step() -> None:
    """docs/program-scheduling.md §15: ``pass_race_admit`` admits without a capacity plan and capacity repair deals with
    the excess: rank 1 holds q (7600 tokens), p's 3100 more pass 10 000, so repair marks p at once."""
    h = Harness(n_targets=2, binding_strategy="program_round_robin", token_capacity_per_dp_rank=10_000)
    h.submit("p", rid="r1", at=0.0, tokens=3000)
    h.complete("r1", at=1.0, prompt=3000, completion=10)
    h.submit("q", rid="q1", at=1.0, tokens=7500)
    assert (h.program("q").placement, h.rank(1).fallback_tokens) == (tid(1), 7600.0)
    eff = h.feed(RequestSubmitted(RequestId("r2"), Ident("p", "p", "p"), 3000, already_on=tid(1)), at=2.0)
    assert reasons(eff) == ["pass_race_admit", "cross_rank_resume", "capacity_repair_mark"]
    (mark,) = [e for e in of(eff, fx.Transition) if e.reason == "capacity_repair_mark"]
    assert mark.program.program_id == "p"
    assert (h.program("p").pause_when_idle, h.program("q").pause_when_idle) == (True, False)


def test_a_growing_request_of_an_active_program_is_repaired_in_the_same_step() -> None:
    """Its rank is marked dirty: p's context grows from 3000 to 4500 tokens next to q's 6000 on a
    10 000-token rank, and repair marks q (with or without a relay's ``already_on``)."""
    for already_on in (None, tid(0)):
        h = Harness(n_targets=1, token_capacity_per_dp_rank=10_000)
        h.submit("p", rid="r1", at=0.0, tokens=3000)
        h.submit("q", rid="q1", at=0.0, tokens=6000)
        assert h.rank(0).fallback_tokens == 9200.0
        eff = h.feed(RequestSubmitted(RequestId("r2"), Ident("p", "p", "p"), 4500, already_on=already_on), at=1.0)
        assert admitted(eff) == ["r2"]
        assert [(e.reason, e.program.program_id) for e in of(eff, fx.Transition)] == [("capacity_repair_mark", "q")]
        assert (h.program("p").pause_when_idle, h.program("q").pause_when_idle) == (False, True)


def test_a_failover_move_starts_the_program_over_as_paused_on_its_new_rank() -> None:
    """docs/program-scheduling.md §9.1: moved as if its rank had left the pool: paused since the move, no segment,
    the shared prefix's freshness anchored at the move."""
    a, b = "http://a:8000", "http://b:8000"
    h = Harness(n_targets=0, binding_strategy="program_round_robin")
    h.feed(TargetsChanged(POOL, targets(1, a) + targets(1, b)))
    h.submit("p", rid="r1", at=0.0, tokens=100)
    h.complete("r1", at=1.0, prompt=100, completion=10)
    h.submit("p", rid="r2", at=2.0)
    h.abandon("r2", at=2.5)
    p = h.program("p")
    assert (p.paused_at, p.segment_started_at is not None, p.last_target) == (2.5, True, tid(0, a))
    eff = h.submit("p", rid="r2.f1", at=4.0, avoid_workers=frozenset({a}))
    assert [(e.request_id, e.target_id) for e in of(eff, fx.Admit)] == [("r2.f1", tid(0, b))]
    (admit,) = of(eff, fx.Admit)
    assert admit.placement_start_request is True
    assert p.shared_prefix_freshness_anchor_at == 4.0
    assert p.segment_started_at == 4.0  # started over at its admission, not kept from rank a


def test_a_second_failover_while_the_first_runs_keeps_the_first_rank_it_left() -> None:
    """docs/program-scheduling.md §9.1: ``failover_from`` is the first rank a failover moved the Program off: r2.f1 runs
    on c after a failover off a, then another request of it could not reach c; it moves to b and
    still remembers a."""
    a, b, c = "http://a:8000", "http://b:8000", "http://c:8000"
    h = Harness(n_targets=0, binding_strategy="program_round_robin")
    h.feed(TargetsChanged(POOL, targets(1, a) + targets(1, b) + targets(1, c)))
    h.submit("p", rid="r1", at=0.0)
    h.complete("r1", at=1.0, prompt=100, completion=10)
    h.submit("p", rid="r2", at=2.0)
    h.abandon("r2", at=2.5)
    p = h.program("p")
    assert p.last_target == tid(0, a)
    h.submit("p", rid="r2.f1", at=2.5, avoid_workers=frozenset({a}))  # round robin: to c
    assert (p.lifecycle, p.placement, p.failover_from) == ("active_reasoning", tid(0, c), tid(0, a))
    eff = h.submit("p", rid="r3.f1", at=3.0, avoid_workers=frozenset({a, c}))
    assert [(e.request_id, e.target_id) for e in of(eff, fx.Admit)] == [("r3.f1", tid(0, b))]
    assert (p.placement, p.failover_from) == (tid(0, b), tid(0, a))
