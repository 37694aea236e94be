"""The core's fairness machines (bench/fairness/core_machines.py, docs/priority.md §4) with a small,
deterministic budget: every property on the default configuration, and the classes machine on a
configuration with per-class caps, tenant weights and agents above interactive."""

from __future__ import annotations

import os
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from actors.core.config import ClassLimits, PriorityConfig, ProgramSchedulingConfig
from bench.fairness.core_machines import ALL_CHECKS, MACHINES, VtcBoundMachine, classes_machine, random_walk

DEEP = os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci"  # the dev profile: ten times the examples

BUDGET = settings(
    max_examples=600 if DEEP else 60,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@attrs.frozen
class Daemonish:
    """The attributes the machine factories read from a daemon configuration."""

    program_scheduling: ProgramSchedulingConfig | None = None
    priority: PriorityConfig | None = None


@pytest.mark.parametrize(("name", "factory"), MACHINES, ids=[name for name, _ in MACHINES])
def test_fairness_machine_on_the_defaults(name: str, factory: object) -> None:
    run_state_machine_as_test(factory(None), settings=BUDGET)  # type: ignore[operator]


def test_classes_machine_with_caps_weights_and_agents_first() -> None:
    prio = PriorityConfig(
        class_order=("agent", "interactive", "batch"),
        interactive=ClassLimits(max_running_per_rank=2),
        batch=ClassLimits(max_running_per_rank=1, max_kv_share=0.3),
        agent=ClassLimits(max_kv_share=0.7),
        tenant_weights={"tenant-a": 3.0},
        vtc_kv_token_second_weight=0.01,
    )
    ps = ProgramSchedulingConfig(token_capacity_per_dp_rank=3000, low_watermark_ratio=0.9, global_queue=True)
    cfg = Daemonish(ps, prio)
    machine = classes_machine(frozenset({"capacity", "conservation", "starvation", "kv_rent"}))(cfg)
    run_state_machine_as_test(machine, settings=BUDGET)


ISOLATING = PriorityConfig(
    tenant_pause_share=True,
    heavy_tenant_max_active_per_rank=0,
    tenant_isolation_tool_call_seconds=10.0,
    long_prefill_seconds=0.15,  # about 1,400 uncached tokens: a third of the machine's rank
    requeue_long_prefills=True,
    batch_max_running_near_interactive=1,
    tenant_weights={"tenant-b": 2.0},
)


@pytest.mark.parametrize("cap", [0, 1])
@pytest.mark.parametrize("global_queue", [False, True])
def test_classes_machine_with_fair_share_isolation_and_headroom(cap: int, global_queue: bool) -> None:
    """Every check of the classes machine with the quick start's tenant rules on: the fair share
    (``tenant_pause_share``), isolating light tenants (``heavy_tenant_max_active_per_rank``) and
    the headroom for interactive (docs/priority.md §2-§3); with ``cap = 1`` also one of the two
    ranks reserved for interactive (``interactive_reserved_ranks``), with ``cap = 0`` none (the
    headroom cap on both)."""
    prio = attrs.evolve(ISOLATING, heavy_tenant_max_active_per_rank=cap, interactive_reserved_ranks=cap)
    ps = ProgramSchedulingConfig(token_capacity_per_dp_rank=4000, global_queue=global_queue)
    machine = classes_machine(ALL_CHECKS)(Daemonish(ps, prio))
    run_state_machine_as_test(machine, settings=BUDGET)
    assert random_walk(machine, cap + 2 * global_queue, walks=20, steps=80) == 20 * 80


def test_isolation_machine_catches_a_core_that_ignores_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``isolation`` check fails when admission lets a heavy tenant past the cap."""
    from actors.core import fairness_isolation

    monkeypatch.setattr(fairness_isolation, "enforce", lambda s, view: None)
    monkeypatch.setattr(fairness_isolation, "allows", lambda s, p, rank, plan: True)
    ps = ProgramSchedulingConfig(token_capacity_per_dp_rank=4000)
    machine = classes_machine(frozenset({"isolation"}))(Daemonish(ps, ISOLATING))
    with pytest.raises(AssertionError, match="shared with a light tenant"):
        for seed in range(20):
            random_walk(machine, seed, walks=20, steps=80)


def test_classes_machine_catches_batch_on_a_rank_reserved_for_interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``priority_inversion`` check fails when batch may start on a reserved rank."""
    from actors.core import batch_class

    monkeypatch.setattr(batch_class, "batch_held_for_interactive", lambda s, rank: False)
    ps = ProgramSchedulingConfig(token_capacity_per_dp_rank=4000)
    prio = attrs.evolve(ISOLATING, interactive_reserved_ranks=1)
    machine = classes_machine(frozenset({"priority_inversion"}))(Daemonish(ps, prio))
    with pytest.raises(AssertionError, match="reserved"):
        for seed in range(20):
            random_walk(machine, seed, walks=20, steps=80)


def test_vtc_bound_is_what_the_machine_checks() -> None:
    m = VtcBoundMachine()
    # prompt 800, output 200 of a 4000-token rank: U = 800, R = 2 x 200, M = 4 in flight
    assert (m.dispatch_charge, m.completion_charge, m.max_in_flight) == (800.0, 400.0, 4)
    assert m.bound == 2 * (800 + 4 * 400)


def test_vtc_bound_machine_catches_a_scheduler_without_fairness() -> None:
    """FIFO across tenants (``fairness = "off"``) lets a flooding tenant take many times the bound."""
    machine = MACHINES[0][1](Daemonish(priority=PriorityConfig(fairness="off")))  # type: ignore[operator]
    with pytest.raises(AssertionError, match="while both are backlogged"):
        quick = settings(BUDGET, max_examples=200, stateful_step_count=50, phases=[Phase.generate, Phase.target])
        run_state_machine_as_test(machine, settings=quick)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classes_machine_seeded_random_walks(seed: int) -> None:
    """Long seeded walks through the same machine reach deep states (many tenants waiting, Programs
    holding KV, batch preempted) that short Hypothesis examples rarely do."""
    machine = classes_machine(
        frozenset({"capacity", "conservation", "priority_inversion", "work_conservation", "starvation", "kv_rent"})
    )(None)
    assert random_walk(machine, seed, walks=40, steps=80) == 40 * 80


def _requeue_machine() -> type:
    """One rank (so a light tenant's request always lands behind a heavy tenant's long prefill in
    flight there) and a short long-prefill threshold (about 500 uncached tokens): the core asks
    long prefills back often, and the walks take them back (docs/priority.md §3, "Re-queueing a
    blocking long prefill")."""
    prio = attrs.evolve(ISOLATING, long_prefill_seconds=0.05)
    machine = classes_machine(ALL_CHECKS)(Daemonish(ProgramSchedulingConfig(token_capacity_per_dp_rank=4000), prio))
    return type("RequeueMachine", (machine,), {"RANKS": 1})


def test_classes_machine_with_long_prefills_taken_back() -> None:
    """Every check of the classes machine while the core asks long prefills back and the shell
    takes them back: the ledger, the conservation of every request (a re-queued one waits again,
    is admitted again and ends once), the KV rent and the starvation bound hold, and a request is
    asked back at most once per dispatch and after at most two take-backs, never when a forced
    resume dispatched it."""
    machine = _requeue_machine()
    run_state_machine_as_test(machine, settings=BUDGET)
    made: list[Any] = []
    init = machine.__init__

    def tracked(self: Any) -> None:
        init(self)
        made.append(self)

    machine.__init__ = tracked  # type: ignore[method-assign]
    assert random_walk(machine, 0, walks=20, steps=80) == 20 * 80
    assert random_walk(machine, 1, walks=20, steps=80) == 20 * 80
    # the walks reach the rule: asks answered by a take-back (seeds 0 and 1 of this config)
    assert sum(m.asks_count for m in made) >= 5 and sum(len(m.requeued) for m in made) >= 5


def test_requeue_machine_catches_a_core_that_asks_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound check fails when the core forgets that it asked for a prefill already."""
    from actors.core import fairness_requeue

    original = fairness_requeue._candidate

    def forgetful(s: Any, rank: Any, heavy: Any) -> Any:
        d = s.in_flight.get(rank.long_prefill[0]) if rank.long_prefill is not None else None
        if d is not None:
            d.requeue_asked = False
        return original(s, rank, heavy)

    monkeypatch.setattr(fairness_requeue, "_candidate", forgetful)
    machine = _requeue_machine()
    with pytest.raises(AssertionError, match="asked back twice"):
        for seed in range(20):
            random_walk(machine, seed, walks=20, steps=80)


def test_requeue_machine_catches_a_core_that_takes_a_request_back_without_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound check fails when the core asks for a prefill back however often it was taken back
    already (docs/priority.md §3: at most ``MAX_PREFILL_REQUEUES`` times in a request's life)."""
    from actors.core import fairness_requeue, lifecycle

    monkeypatch.setattr(fairness_requeue, "MAX_PREFILL_REQUEUES", 10**6)
    monkeypatch.setattr(lifecycle, "MAX_PREFILL_REQUEUES", 10**6)
    machine = _requeue_machine()
    with pytest.raises(AssertionError, match="asked back after 2 take-backs"):
        for seed in range(40):
            random_walk(machine, seed, walks=20, steps=80)
