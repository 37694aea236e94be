"""Where a released Program's KV probably still is, and the move cost priced on it
(docs/program-scheduling.md §7 patience, §12.1)."""

from __future__ import annotations

import pytest
from core_support import Harness, admitted, reasons, request_sample, tid

from actors.core.cache_residency import move_cost_seconds, resident_tokens
from actors.core.config import PrefillCostModel
from actors.core.costs import cache_miss_impact_seconds
from actors.core.invariants import check

# a recompute 10x dearer than the default, so the default patience is far away (as in test_core_resume)
SLOW_PREFILL = PrefillCostModel(intercept_seconds=5.0)


def _two_ranks(**kw: object) -> Harness:
    h = Harness(n_targets=2, global_queue=True, stats_window_size=1, binding_strategy="program_round_robin", **kw)
    for i in (0, 1):
        h.rank(i).factors.push_request(request_sample())
    return h


def test_core_residency_counts_allocations_against_the_kv_free_ahead() -> None:
    h = Harness(token_capacity_per_dp_rank=10_000, cross_rank_move_cost="resident")
    h.submit("a", tokens=3000)
    h.complete("r1", at=1.0, prompt=3000, cached=0, completion=100)
    a = h.program("a")
    # nothing else runs: 10000 - 3100 of a's own tokens are free ahead of a's blocks
    assert a.residency_mark == (tid(0), 3100.0, 6900.0)
    assert resident_tokens(h.state, a) == 3100
    h.submit("b", tokens=5000, at=2.0)
    h.complete("r2", at=3.0, prompt=5000, cached=0, completion=100)
    assert h.rank().allocated_tokens == 8200.0
    assert resident_tokens(h.state, a) == 3100  # b's 5100 new tokens fit in the 6900 ahead of a
    h.submit("c", tokens=4000, at=4.0)
    h.complete("r3", at=5.0, prompt=4000, cached=1000, completion=100)  # 3100 new tokens
    # 5100 + 3100 - 6900 = 1300 of a's 3100 are evicted, deepest first: a 1800-token prefix is left
    assert resident_tokens(h.state, a) == 1800
    # a move costs the recompute of that resident prefix (no shared prefix measured: cached 0),
    # docs/program-scheduling.md §12.1
    assert a.shared_prefix_tokens == 0
    assert move_cost_seconds(h.state, a) == cache_miss_impact_seconds(1800, h.cfg.prefill_cost_model) > 0
    assert check(h.state, h.cfg) == []


def test_core_residency_free_ahead_leaves_out_running_requests_and_uses_the_reported_kv() -> None:
    h = Harness(token_capacity_per_dp_rank=10_000, cross_rank_move_cost="resident")
    h.rank().backend_kv_capacity_tokens = 20_000  # the engine's report wins over the ledger capacity
    h.submit("a", tokens=2000)
    h.submit("b", tokens=5000)  # still running when a completes: its blocks are not free
    h.complete("r1", at=1.0, prompt=2000, cached=0, completion=0)
    assert h.program("a").residency_mark == (tid(0), 2000.0, 20_000.0 - 5000 - 2000)


@pytest.mark.parametrize("mode", ["context", "resident"])
def test_core_residency_unknown_before_a_completion_and_not_kept_by_default(mode: str) -> None:
    h = Harness(token_capacity_per_dp_rank=10_000, cross_rank_move_cost=mode)
    h.submit("a", tokens=2000)
    a = h.program("a")
    assert resident_tokens(h.state, a) is None
    a.last_cache_miss_impact_seconds = 1.5
    assert move_cost_seconds(h.state, a) == 1.5  # both modes fall back to the whole context
    h.complete("r1", at=1.0, prompt=2000, cached=0, completion=10)
    # the default keeps no marks and counts nothing (no decision reads them)
    assert (a.residency_mark is None) is (mode == "context")
    assert h.rank().allocated_tokens == (0.0 if mode == "context" else 2010.0)


@pytest.mark.parametrize(("mode", "moves_at_once"), [("context", False), ("resident", True)])
def test_core_cross_rank_patience_priced_at_the_resident_part(mode: str, moves_at_once: bool) -> None:
    """``cross_rank_move_cost = "resident"``: a Program whose previous rank has reused its blocks
    loses nothing by moving, so it moves once it waited ``metrics_interval_seconds``; the default
    waits the impact of its whole private context first."""
    h = _two_ranks(
        token_capacity_per_dp_rank=10_000,
        admission_waiting_request_threshold=1,
        prefill_cost_model=SLOW_PREFILL,
        cross_rank_move_cost=mode,
    )
    h.submit("big", tokens=6000)  # rank 0
    h.submit("z", tokens=1000)  # rank 1
    h.submit("a", tokens=2000)  # rank 0
    h.complete("r3", at=0.5, prompt=2000, cached=0, completion=0)  # a pauses
    a = h.program("a")
    if mode == "resident":
        assert a.residency_mark == (tid(0), 2000.0, 2000.0)  # big's 6000 are referenced
        assert resident_tokens(h.state, a) == 2000
    h.complete("r1", at=0.6, prompt=6000, cached=0, completion=0)  # rank 0 allocated 6000 more
    if mode == "resident":
        assert resident_tokens(h.state, a) == 0  # 6000 - 2000 ahead evicts all 2000 of a
    h.submit("big", tokens=8000, at=0.7)  # rank 0 now 8100 used
    h.submit("a", tokens=6000, at=1.0)  # cannot come back: 8100 + 6100 > 10000
    h.observe(0, 0.5, 1, 0, at=1.5)  # no backend waiting requests on rank 0: no pressure
    impact = cache_miss_impact_seconds(2000, SLOW_PREFILL)
    assert move_cost_seconds(h.state, a) == (impact if mode == "context" else 0.0)
    eff = h.tick(at=2.0)
    assert (admitted(eff) == ["r5"]) is moves_at_once
    if moves_at_once:
        assert reasons(eff) == ["program_admit", "cross_rank_resume"]
        assert a.placement == tid(1)
    else:
        assert admitted(h.tick(at=1.0 + impact)) == ["r5"]  # the default's ski rental, unchanged
    assert check(h.state, h.cfg) == []


def test_core_residency_unknown_without_a_kv_size_and_none_left_on_a_removed_rank() -> None:
    """Without a configured capacity and before the engine reports its KV, nothing says how much is
    free ahead: the residency is unknown (the whole private context prices a move,
    docs/program-scheduling.md §12.1); a rank that left the pool holds nothing any more."""
    h = Harness(cross_rank_move_cost="resident")  # no token_capacity_per_dp_rank
    h.submit("a", tokens=2000)
    h.complete("r1", at=1.0, prompt=2000, cached=0, completion=100)
    a = h.program("a")
    assert a.residency_mark is None and resident_tokens(h.state, a) is None
    assert move_cost_seconds(h.state, a) == a.last_cache_miss_impact_seconds
    h = Harness(token_capacity_per_dp_rank=10_000, cross_rank_move_cost="resident")
    h.submit("a", tokens=2000)
    h.complete("r1", at=1.0, prompt=2000, cached=0, completion=100)
    a = h.program("a")
    assert resident_tokens(h.state, a) == 2100
    h.state.ranks.pop(tid(0))  # what sync_targets does to a rank that left every pool
    assert resident_tokens(h.state, a) == 0
