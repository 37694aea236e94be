"""``max_idle_paused_programs``: a bound on the idle paused Programs the scheduler keeps for
``paused_retention_ttl_seconds`` (docs/program-scheduling.md §1).  Found by the session-44 security
audit: a client minting Program ids grew the daemon by about 10 KB per id for 30 minutes."""

from __future__ import annotations

from core_support import POOL, Harness, admitted, of, reasons

from actors.core import effects as fx
from actors.core.ids import ProgramKey
from actors.core.invariants import check


def _idle(h: Harness, names: str, start: float = 0.0) -> None:
    """Each Program runs one request and pauses at its completion (the warm-up's TTL is 0)."""
    for i, name in enumerate(names):
        at = start + i
        h.submit(name, at=at, rid=f"{name}-1")
        assert reasons(h.complete(f"{name}-1", at=at + 0.5, prompt=100)) == ["ttl_expired"]


def test_the_tick_releases_the_idle_paused_programs_paused_longest_ago_beyond_the_cap() -> None:
    h = Harness(max_idle_paused_programs=2, max_active_programs_per_target=64)
    _idle(h, "dcab")  # paused at 0.5 (d), 1.5 (c), 2.5 (a), 3.5 (b)
    eff = h.tick(at=10.0)
    released = [(e.program.program_id, e.reason, e.to_state) for e in of(eff, fx.Transition)]
    assert released == [("d", "paused_capacity_release", "released"), ("c", "paused_capacity_release", "released")]
    assert [e.program.program_id for e in of(eff, fx.RetireProgram)] == ["d", "c"]
    assert sorted(k.program_id for k in h.state.programs) == ["a", "b"]
    assert all(e.counted for e in of(eff, fx.Transition))
    assert check(h.state, h.cfg) == []
    assert h.tick(at=11.0) == ()  # at the cap: nothing more
    # a released one comes back as a new generation, as after paused_retention_release
    assert of(h.submit("d", at=12.0), fx.SpawnProgram)[0].program.generation == 1


def test_only_idle_paused_programs_count_and_go() -> None:
    h = Harness(max_idle_paused_programs=1, max_active_programs_per_target=64)
    _idle(h, "ab")
    h.submit("c", at=5.0)  # active, in flight
    h.submit("a", at=5.5)  # paused a is resumed: active again
    eff = h.tick(at=6.0)
    assert [(e.program.program_id, e.reason) for e in of(eff, fx.Transition)] == []  # b alone is idle: at the cap
    assert sorted(k.program_id for k in h.state.programs) == ["a", "b", "c"]
    assert admitted(h.submit("b", at=7.0, rid="b-2")) == ["b-2"]


def test_zero_means_no_bound_and_the_default_leaves_small_deployments_alone() -> None:
    for cap in (0, None):
        h = Harness(max_idle_paused_programs=cap) if cap is not None else Harness(max_active_programs_per_target=64)
        _idle(h, "abcdef")
        assert of(h.tick(at=100.0), fx.Transition) == []
        assert len(h.state.programs) == 6


def test_released_histories_beyond_the_cap_go_after_60_seconds_not_after_the_retention() -> None:
    h = Harness(max_idle_paused_programs=1)  # paused_retention_ttl_seconds = 1800 by default
    for i, name in enumerate("abc"):
        h.submit(name, at=float(i), rid=f"{name}-1")
        h.complete(f"{name}-1", at=i + 0.5, prompt=100, terminate=True)  # released at once
    keys = [ProgramKey(POOL, n) for n in "abc"]
    h.tick(at=60.0)  # every history is younger than 60 s: kept
    assert [k in h.state.last_generations for k in keys] == [True, True, True]
    h.tick(at=61.0)  # a (released at 0.5) is old enough and beyond the cap
    assert [k in h.state.last_generations for k in keys] == [False, True, True]
    h.tick(at=63.0)  # b goes; c stays: the count is at the cap
    assert [k in h.state.last_generations for k in keys] == [False, False, True]
    assert len(h.state.released_at) == 1
