"""RequestPool and formulas around the queue: global force-resume estimate (docs/program-scheduling.md §5),
shared-prefix freshness (§2.2), TTL-pause round sampling."""

from __future__ import annotations

import pytest
from core_support import Harness, of, request_sample

from actors.core import effects as fx
from actors.core.completion import shared_prefix_freshness
from actors.core.ids import ProgramRef, RequestId
from actors.core.model import PendingRequest, RequestHints
from actors.core.queue import RequestPool
from actors.core.resume import force_resume_estimate


def req(rid: str, ref: ProgramRef, seq: int) -> PendingRequest:
    return PendingRequest(
        request_id=RequestId(rid),
        ref=ref,
        seq=seq,
        arrived_at=float(seq),
        estimated_context_tokens=10,
        hints=RequestHints(),
        routing_text=None,
        queue_deadline=600.0,
    )


def test_core_pool_fifo_per_exact_generation_and_front_only() -> None:
    g0, g1 = ProgramRef("m", "p", 0), ProgramRef("m", "p", 1)
    pool = RequestPool()
    for i, (rid, ref) in enumerate([("a", g0), ("b", g1), ("c", g0)]):
        pool.retain(req(rid, ref, i))
    assert [r.request_id for r in pool.requests(g0)] == ["a", "c"]
    assert pool.take_front(g0, RequestId("c")) is None  # not the front
    assert pool.take_front(g0, RequestId("a")).request_id == "a"  # type: ignore[union-attr]
    assert pool.program_len(g0) == 1 and pool.program_len(g1) == 1 and len(pool) == 2


def test_core_pool_cancel_reports_front_and_deletes_empty_fifo() -> None:
    g0, g1 = ProgramRef("m", "p", 0), ProgramRef("m", "p", 1)
    pool = RequestPool()
    pool.retain(req("a", g0, 1))
    pool.retain(req("b", g0, 2))
    pool.retain(req("x", g1, 3))
    assert pool.cancel(RequestId("b"))[1] is False  # type: ignore[index]
    assert pool.cancel(RequestId("a"))[1] is True  # type: ignore[index]
    assert pool.front(g0) is None and g0 not in list(pool.refs())  # no empty FIFO is kept
    assert pool.cancel(RequestId("a")) is None  # already gone: no-op
    assert pool.requests(g1)[0].request_id == "x"  # the other generation is untouched
    assert not pool.has_empty_fifo() and pool.fifo_lengths_total() == len(pool) == 1


def test_core_global_force_resume_estimate_worked_numbers() -> None:
    h = Harness(
        n_targets=2,
        global_queue=True,
        stats_window_size=2,
        max_active_programs_per_target=1,
        binding_strategy="program_round_robin",
    )
    for i, gap in ((0, 2.0), (1, 1.0)):
        f = h.rank(i).factors
        for k, r in enumerate((1, 2)):  # R = ceil(2 * 1.5) = 3 on both ranks
            f.push_request(request_sample(rounds=r, at=k * gap))
    # throughputs 0.5/s and 1.0/s -> aggregate 1.5/s
    h.submit("a")  # rank 0, active: max(1, 3 - 0) = 3
    h.submit("b")  # rank 1, active: 3
    h.submit("c")  # rank 0, waits (count guard)
    h.submit("d")  # rank 1, waits behind c (FCFS within MRU: never finished, queued later)
    t, active, pool, agg = force_resume_estimate(h.state, h.program("d"))
    # 3 * (6 + 1 * max(1, R(rank 0) = 3)) / 1.5 = 18 -> clamped to min(30, 300) = 30
    assert (active, pool, agg) == (6.0, 3.0, 1.5)
    assert t == 30.0


def test_core_shared_prefix_freshness_formula_worked_numbers() -> None:
    h = Harness(token_capacity_per_dp_rank=10_000, stats_window_size=2)
    rank = h.rank()
    assert shared_prefix_freshness(h.state, rank) == 100.0  # warm-up value: window incomplete
    for k in range(2):
        rank.factors.push_request(request_sample(prompt=1000, cached=600, e2e=4.0, at=float(k)))
    assert shared_prefix_freshness(h.state, rank) == 100.0  # no active reasoning Program
    h.submit("a")
    h.submit("b")
    # 2 turnovers x 10000 tokens x 4.0 s mean e2e / 2 active reasoning / 400 mean uncached = 100.0
    rank.factors.push_request(request_sample(prompt=1000, cached=800, e2e=4.0, at=2.0))
    # window now (600, 800 cached) -> mean uncached 300 -> 2 * 10000 * 4 / 2 / 300 = 133.33
    assert shared_prefix_freshness(h.state, rank) == pytest.approx(133.333333)


def test_core_ttl_pause_samples_served_rounds_since_last_ttl_pause() -> None:
    h = Harness()
    hold = RequestHints(kv_retention_ttl_seconds=10.0)
    h.submit("a", hints=hold)
    h.complete("r1", at=1.0, prompt=100)
    h.submit("a", at=2.0, hints=hold)
    h.complete("r2", at=3.0, prompt=110, cached=100)
    h.submit("a", at=4.0)
    eff = h.complete("r3", at=5.0, prompt=120, cached=110)  # no hint: TTL 0 -> pause after 3 rounds
    assert [e.reason for e in of(eff, fx.Transition)] == ["ttl_expired"]
    assert list(h.rank().factors.ttl_pause_rounds) == [3]
    h.submit("a", at=100.0)  # long after: the next segment samples from 0 again
    h.complete("r4", at=101.0, prompt=130, cached=120)
    assert list(h.rank().factors.ttl_pause_rounds) == [3, 1]


def test_core_observation_lifting_the_gate_admits_at_once() -> None:
    h = Harness()
    h.observe(0, 0.1, 1, 4, at=0.0)
    assert of(h.submit("a", at=0.5), fx.Admit) == []
    eff = h.observe(0, 0.1, 1, 0, at=1.0, epoch=2)
    assert [a.request_id for a in of(eff, fx.Admit)] == ["r1"]
