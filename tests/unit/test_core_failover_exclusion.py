"""A failover's exclusion in the core's placement (docs/program-scheduling.md §9.1).

The shell submits a Program request that could not reach its worker again with
``RequestSubmitted.avoid_workers``.  When that worker is still a target (every worker left in
rotation is suspect, docs/operations.md §11.3), the arrival moves the Program off it as a target
change would, to a target of another worker; with none left it is placed as without the
exclusion.  A failed retry gives the Program back to the rank it left; a successful one keeps the
move.  Exact virtual times; every case ends with the core's invariants clean.
"""

from __future__ import annotations

from typing import Any

import pytest
from core_support import POOL, Harness, Ident, admitted, of, reasons

from actors.core import effects as fx
from actors.core.config import BackendTarget
from actors.core.events import InteractiveSubmitted, RequestSubmitted, TargetsChanged
from actors.core.ids import ProgramKey, RequestId, TargetId
from actors.core.invariants import check
from actors.core.model import RequestHints
from actors.core.resume import select_cross_rank

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"


def workers(*spec: tuple[str, int]) -> tuple[BackendTarget, ...]:
    """Targets of workers given as (url, DP ranks); a rank's id is ``url@rank``."""
    out = []
    for url, ranks in spec:
        for r in range(ranks):
            out.append(BackendTarget(worker_url=url, dp_rank=r, target_id=f"{url}@{r}", index=len(out)))
    return tuple(out)


def at(url: str, rank: int = 0) -> TargetId:
    return TargetId(f"{url}@{rank}")


def harness(*spec: tuple[str, int], **kw: Any) -> Harness:
    h = Harness(n_targets=0, binding_strategy=kw.pop("binding_strategy", "program_round_robin"), **kw)
    h.feed(TargetsChanged(POOL, workers(*spec)))
    return h


def targets_of(effects: tuple[Any, ...]) -> list[tuple[str, str]]:
    return [(e.request_id, e.target_id) for e in of(effects, fx.Admit)]


def ran_then_failed(h: Harness, program: str = "p") -> None:
    """``program`` ran once (r1, on its first rank), then r2 could not reach its worker: the shell
    left its lease unfinished, which the core counts as a failed completion."""
    h.submit(program, rid="r1", at=0.0)
    h.complete("r1", at=1.0, prompt=100, completion=10)
    h.submit(program, rid="r2", at=2.0)
    h.abandon("r2", at=2.5)


def test_a_failover_is_placed_off_the_worker_its_request_could_not_reach() -> None:
    h = harness((A, 1), (B, 1))
    ran_then_failed(h)
    p = h.program("p")
    assert (p.lifecycle, p.last_target, p.last_pause_reason) == ("paused_acting", at(A), "request_failed")
    eff = h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=frozenset({A}))
    assert targets_of(eff) == [("r2.failover1", at(B))]
    assert (p.home_target, p.last_target, p.failover_from) == (at(B), at(B), at(A))
    assert h.state.binder.bindings[ProgramKey(POOL, "p")] == at(B)
    # it ran there: the move stands, and the Program's next request goes there without an exclusion
    h.complete("r2.failover1", at=3.0, prompt=100, completion=10)
    assert (p.last_target, p.failover_from) == (at(B), None)
    assert targets_of(h.submit("p", rid="r3", at=4.0)) == [("r3", at(B))]
    assert check(h.state, h.cfg) == []


def test_without_an_exclusion_the_retry_goes_back_to_the_same_rank() -> None:
    """What the exclusion changes: the same failover without it resumes on the rank it failed on
    (the session-31 corner: the client got the 504 of a second connect timeout)."""
    h = harness((A, 1), (B, 1))
    ran_then_failed(h)
    assert targets_of(h.submit("p", rid="r2.failover1", at=2.5)) == [("r2.failover1", at(A))]


def test_every_rank_of_the_avoided_worker_is_avoided() -> None:
    h = harness((A, 2), (B, 1))
    ran_then_failed(h)
    assert h.program("p").last_target == at(A, 0)
    eff = h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=frozenset({A}))
    assert targets_of(eff) == [("r2.failover1", at(B))]  # not A's other rank: the same socket address


def _after_failover(spec: tuple[tuple[str, int], ...], avoid: frozenset[str]) -> tuple[Harness, tuple[Any, ...]]:
    h = harness(*spec)
    ran_then_failed(h)
    eff = h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=avoid)
    eff += h.complete("r2.failover1", at=3.0, prompt=100, completion=10)
    eff += h.submit("p", rid="r3", at=4.0)
    return h, eff


@pytest.mark.parametrize(
    ("spec", "avoid"),
    [
        (((A, 1), (B, 1)), frozenset({A, B})),
        (((A, 2),), frozenset({A})),  # one worker, two ranks
        (((A, 1), (B, 1)), frozenset({A, B, C})),  # a worker that left meanwhile
    ],
    ids=["both-workers", "one-worker-two-ranks", "more-than-the-pool"],
)
def test_when_every_target_is_avoided_the_request_is_placed_as_without_the_exclusion(
    spec: tuple[tuple[str, int], ...], avoid: frozenset[str]
) -> None:
    h, eff = _after_failover(spec, avoid)
    plain, plain_eff = _after_failover(spec, frozenset())
    assert eff == plain_eff
    assert h.program("p").failover_from is None and h.program("p").last_target == plain.program("p").last_target
    assert admitted(eff) == ["r2.failover1", "r3"]
    assert check(h.state, h.cfg) == []


def test_an_active_program_on_the_avoided_worker_moves_as_if_its_rank_had_left() -> None:
    """A Program with another request in flight on the worker (two at once): the failover
    invalidates its placement there (``health_failover``: the charge is released, the other
    request's completion no longer counts) and it is admitted on the other worker."""
    h = harness((A, 1), (B, 1), token_capacity_per_dp_rank=10_000)
    hold = RequestHints(kv_retention_ttl_seconds=60.0)
    h.submit("p", rid="r1", at=0.0, hints=hold)
    h.complete("r1", at=1.0, prompt=100, completion=10)
    h.submit("p", rid="r2", at=2.0, hints=hold)
    h.submit("p", rid="r3", at=2.0, hints=hold)  # both in flight on A
    h.abandon("r3", at=2.5)
    p = h.program("p")
    assert (p.state, p.placement, p.in_flight) == ("active", at(A), 1)
    eff = h.submit("p", rid="r3.failover1", at=2.5, avoid_workers=frozenset({A}), hints=hold)
    assert reasons(eff)[:1] == ["health_failover"]
    [invalidated] = [e for e in of(eff, fx.Transition) if e.reason == "health_failover"]
    assert invalidated.target_id == at(A) and invalidated.released_private_tokens > 0
    assert targets_of(eff) == [("r3.failover1", at(B))]
    assert h.state.ranks[at(A)].active == {} and h.state.ranks[at(A)].fallback_tokens == 0
    assert (p.placement, p.failover_from) == (at(B), at(A))
    ignored = of(h.complete("r2", at=3.0, prompt=100, completion=10), fx.CompletionIgnored)
    assert [e.reason for e in ignored] == ["stale_placement"]
    assert check(h.state, h.cfg) == []


def test_a_failed_retry_gives_the_program_back_to_the_rank_it_left() -> None:
    h = harness((A, 1), (B, 1), token_capacity_per_dp_rank=10_000)
    ran_then_failed(h)
    h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=frozenset({A}))
    p = h.program("p")
    assert p.placement == at(B) and h.state.ranks[at(B)].fallback_tokens > 0
    h.abandon("r2.failover1", at=3.0)  # the retry could not reach B either
    assert (p.lifecycle, p.home_target, p.last_target, p.failover_from) == ("paused_acting", at(A), at(A), None)
    assert h.state.binder.bindings[ProgramKey(POOL, "p")] == at(A)
    assert [r.fallback_tokens for r in h.state.ranks.values()] == [0, 0]  # nothing left charged
    assert targets_of(h.submit("p", rid="r4", at=4.0)) == [("r4", at(A))]
    assert check(h.state, h.cfg) == []


def test_a_retry_abandoned_while_it_waits_gives_the_program_back() -> None:
    """B is full (another Program holds it), so the retry waits there; the client gives up."""
    h = harness((A, 1), (B, 1), token_capacity_per_dp_rank=1000)
    ran_then_failed(h)  # p: rank A (round robin, first)
    h.submit("q", rid="q1", at=2.5, tokens=800, hints=RequestHints(kv_retention_ttl_seconds=60.0))  # rank B
    assert h.program("q").placement == at(B)
    eff = h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=frozenset({A}))
    assert admitted(eff) == []
    p = h.program("p")
    assert (p.lifecycle, p.last_target) == ("paused_reasoning", at(B))
    h.abandon("r2.failover1", at=5.0)
    assert (p.lifecycle, p.last_target, p.home_target, p.failover_from) == ("paused_acting", at(A), at(A), None)
    assert check(h.state, h.cfg) == []


def test_a_second_failover_moves_again_from_where_the_first_left_it() -> None:
    h = harness((A, 1), (B, 1), (C, 1))
    ran_then_failed(h)
    h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=frozenset({A}))
    p = h.program("p")
    first = p.last_target
    assert first in (at(B), at(C)) and p.failover_from == at(A)
    h.abandon("r2.failover1", at=3.0)
    assert (p.last_target, p.failover_from) == (at(A), None)  # given back before the next attempt
    other = {at(B), at(C)} - {first}
    [rest] = other
    worker = {at(B): B, at(C): C}[first]
    eff = h.submit("p", rid="r2.failover2", at=3.0, avoid_workers=frozenset({A, worker}))
    assert targets_of(eff) == [("r2.failover2", rest)]
    assert p.failover_from == at(A)
    h.complete("r2.failover2", at=4.0, prompt=100, completion=10)
    assert (p.last_target, p.failover_from) == (rest, None)
    assert check(h.state, h.cfg) == []


def test_a_cross_rank_move_does_not_take_a_waiting_retry_back_to_the_avoided_worker() -> None:
    h = harness((A, 1), (B, 1), token_capacity_per_dp_rank=1000, global_queue=True)
    ran_then_failed(h)
    h.submit("q", rid="q1", at=2.5, tokens=800, hints=RequestHints(kv_retention_ttl_seconds=60.0))
    h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=frozenset({A}))
    p = h.program("p")
    assert (p.lifecycle, p.last_target, p.last_pause_reason) == ("paused_reasoning", at(B), "request_failed")
    for t in (3.0, 4.0, 5.0, 10.0):  # patience (max(interval, recompute cost) = 1 s) long passed
        assert admitted(h.tick(at=t)) == []
    h.now = 10.0
    assert select_cross_rank(h.state, p) is None
    [req] = h.state.pool.requests(p.ref)
    req.avoid_workers = frozenset()  # the same waiter without its exclusion would move to A now
    choice = select_cross_rank(h.state, p)
    assert choice is not None and choice[0].target_id == at(A)
    assert check(h.state, h.cfg) == []


def test_a_waiter_that_avoids_every_worker_does_not_undo_another_waiters_exclusion() -> None:
    """docs/program-scheduling.md §9.1: an exclusion of every target carries no preference, so
    the union of the waiters' exclusions leaves it out (it used to cover every worker and so
    allow every target, A included)."""
    h = harness((A, 1), (B, 1), token_capacity_per_dp_rank=1000, global_queue=True)
    ran_then_failed(h)
    h.submit("q", rid="q1", at=2.5, tokens=800, hints=RequestHints(kv_retention_ttl_seconds=60.0))
    h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=frozenset({A}))
    eff = h.submit("p", rid="r3.failover1", at=3.0, avoid_workers=frozenset({A, B}))
    assert admitted(eff) == []
    p = h.program("p")
    assert (p.lifecycle, p.last_target) == ("paused_reasoning", at(B))
    for t in (4.0, 5.0, 10.0):
        assert admitted(h.tick(at=t)) == []
    h.now = 10.0
    assert select_cross_rank(h.state, p) is None  # r2.failover1 still keeps it off A
    assert check(h.state, h.cfg) == []


def test_a_target_change_rebinds_a_waiting_retry_off_the_avoided_worker() -> None:
    """The waiting retry's rank leaves the pool: the re-binding keeps to the exclusion."""
    h = harness((A, 1), (B, 1), (C, 1), max_active_programs_per_target=1)
    hold = RequestHints(kv_retention_ttl_seconds=60.0)
    ran_then_failed(h)  # p: A (round robin 0)
    h.submit("q", rid="q1", at=2.5, hints=hold)  # B (1)
    h.submit("s", rid="s1", at=2.5, hints=hold)  # C (2)
    h.submit("p", rid="r2.failover1", at=2.5, avoid_workers=frozenset({A}))  # (3) of (B, C): C, full
    p = h.program("p")
    assert (p.lifecycle, p.last_target) == ("paused_reasoning", at(C))
    assert h.state.binder._rr[POOL] == 4  # without the exclusion the next choice of (A, B) is A
    h.feed(TargetsChanged(POOL, workers((A, 1), (B, 1))), at=3.0)
    assert (p.lifecycle, p.last_target) == ("paused_reasoning", at(B))
    assert check(h.state, h.cfg) == []


def test_a_request_forwarded_under_a_pass_is_not_moved() -> None:
    """``already_on``: the request is at its worker already (a relay's resume pass), the exclusion
    of an earlier attempt cannot move it."""
    h = harness((A, 1), (B, 1))
    ran_then_failed(h)
    rid = RequestId("r2.failover1")
    event = RequestSubmitted(rid, Ident("p", "p", "p"), 100, avoid_workers=frozenset({A}), already_on=at(A))
    assert targets_of(h.feed(event, at=2.5)) == [("r2.failover1", at(A))]
    assert h.program("p").failover_from is None


@pytest.mark.parametrize(
    ("avoid", "where"), [(frozenset(), at(A)), (frozenset({A}), at(B)), (frozenset({A, B}), at(A))]
)
def test_an_interactive_failover_avoids_the_worker_it_could_not_reach(avoid: frozenset[str], where: TargetId) -> None:
    """An identity-free interactive request queued by the scheduler (docs/priority.md §5.5): the
    best fit is A (the lower index on a tie); its failover avoiding A goes to B; avoiding both, to A."""
    h = harness((A, 1), (B, 1), token_capacity_per_dp_rank=1000)
    eff = h.feed(InteractiveSubmitted(RequestId("i1.failover1"), 100, avoid_workers=avoid), at=1.0)
    assert [(e.request_id, e.target_id) for e in of(eff, fx.AdmitInteractive)] == [("i1.failover1", where)]
    assert check(h.state, h.cfg) == []
