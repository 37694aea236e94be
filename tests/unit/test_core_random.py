"""Seeded random event sequences through the core: invariants after every step, request
conservation, the capacity bound, exact replay and the starvation bound.  (Deterministic and
fast; the Hypothesis state machines in property_tests/ explore further.)"""

from __future__ import annotations

import random
from typing import Any

import pytest
from core_support import POOL, Ident, cfg, targets

from actors.core import effects as fx
from actors.core.events import (
    ObservationReceived,
    ObservationStale,
    ObservationStarted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestSubmitted,
    TargetsChanged,
    TimerFired,
)
from actors.core.ids import RequestId
from actors.core.invariants import check
from actors.core.model import RequestHints, Usage
from actors.core.scheduler import initial_state, step

CONFIGS = {
    "count_guard": dict(max_active_programs_per_target=2, stats_window_size=3),
    "capacity": dict(
        token_capacity_per_dp_rank=3000,
        low_watermark_ratio=0.8,
        high_watermark_ratio=0.9,
        stats_window_size=3,
        max_active_programs_per_target=4,
    ),
    "global": dict(
        token_capacity_per_dp_rank=3000,
        global_queue=True,
        stats_window_size=2,
        admission_waiting_request_threshold=0,
        max_segment_rounds=2,
        resume_order="fcfs",
    ),
    "binding_only": dict(binding_only=True, stats_window_size=2),
    "least_count": dict(
        binding_strategy="least_program_count",
        max_active_programs_per_target=1,
        stats_window_size=2,
        queue_timeout_seconds=30.0,
        force_resume_timeout_seconds=10.0,
    ),
}


def run(name: str, seed: int, steps: int = 400) -> tuple[list[Any], dict[str, str]]:
    c = cfg(**CONFIGS[name])
    s = initial_state(c)
    rnd = random.Random(seed)
    now = 0.0
    log: list[Any] = []
    fate: dict[str, str] = {}
    in_flight: list[str] = []
    timers: dict[tuple[Any, str], tuple[float, int]] = {}
    n = 0

    def feed(ev: Any) -> None:
        out = step(s, ev, now=now, cfg=c).effects
        log.append((type(ev).__name__, out))
        for e in out:
            if isinstance(e, fx.Admit):
                assert fate[e.request_id] == "waiting", e
                fate[e.request_id] = "in_flight"
                in_flight.append(e.request_id)
            elif isinstance(e, fx.Reject):
                assert fate[e.request_id] == "waiting", e
                fate[e.request_id] = "rejected"
            elif isinstance(e, fx.ArmTimer):
                timers[(e.program, e.kind)] = (e.deadline, e.token)
            elif isinstance(e, fx.CancelTimer):
                timers.pop((e.program, e.kind), None)
            elif isinstance(e, fx.RetireProgram):
                for k in [k for k in timers if k[0] == e.program]:
                    del timers[k]
        problems = check(s, c)
        assert problems == [], (name, seed, type(ev).__name__, problems)
        cap = c.token_capacity_per_dp_rank
        if cap is not None and not c.binding_only:
            for e in out:
                if isinstance(e, fx.Transition) and e.reason in ("program_admit", "batch_gain_admit"):
                    # at decision time: used + required <= C x low for non-forced admissions
                    assert e.used_tokens + e.required_tokens <= cap * c.low_watermark_ratio + 1e-6

    feed(TargetsChanged(POOL, targets(3)))
    for _ in range(steps):
        now += rnd.choice((0.0, 0.1, 0.5, 1.0, 3.0))
        # deliver due timers first, in (deadline, token) order, like the Program actors would
        due = sorted((d, tok, ref, kind) for (ref, kind), (d, tok) in timers.items() if d <= now)
        for d, tok, ref, kind in due:
            if timers.get((ref, kind)) == (d, tok):
                del timers[(ref, kind)]
                feed(TimerFired(ref, kind, tok))
        r = rnd.random()
        if r < 0.35:
            n += 1
            rid = f"r{n}"
            fate[rid] = "waiting"
            hints = RequestHints(
                priority=rnd.choice((0, 0, 1)),
                deadline_seconds=rnd.choice((None, None, 5.0)),
                expected_output_length=rnd.choice((None, 50)),
                kv_retention_ttl_seconds=rnd.choice((None, None, 2.0)),
            )
            pid = f"p{rnd.randrange(8)}"
            feed(RequestSubmitted(RequestId(rid), Ident(pid, placement_hash_key=pid), rnd.randrange(50, 1500), hints))
        elif r < 0.65 and in_flight:
            rid = in_flight.pop(rnd.randrange(len(in_flight)))
            fate[rid] = "completed"
            prompt = rnd.choice((None, rnd.randrange(50, 1800)))
            cached = rnd.choice((None, 0, 40)) if prompt is not None else None
            feed(
                RequestCompleted(
                    RequestId(rid),
                    rnd.random() < 0.9,
                    Usage(prompt, cached, rnd.randrange(0, 80)),
                    rnd.choice((None, 0.5)),
                )
            )
        elif r < 0.72:
            waiting = [k for k, v in fate.items() if v == "waiting"]
            if waiting:
                rid = rnd.choice(waiting)
                fate[rid] = "cancelled"
                feed(RequestAbandoned(RequestId(rid)))
        elif r < 0.82:
            t = targets(3)[rnd.randrange(3)]
            if t.target_id in s.ranks:
                feed(ObservationStarted(t.target_id, n))
                feed(ObservationReceived(t.target_id, n, rnd.random() * 0.9, rnd.randrange(3), rnd.randrange(2)))
        elif r < 0.85:
            t = targets(3)[rnd.randrange(3)]
            feed(ObservationStale(t.target_id))
        elif r < 0.87:
            keep = targets(3) if rnd.random() < 0.5 else targets(3)[: rnd.randrange(1, 3)]
            feed(TargetsChanged(POOL, keep))
        else:
            feed(RepairTick())
    # conservation: every request is in exactly one place, none disappeared
    for rid, f in fate.items():
        if f == "waiting":
            assert s.pool.get(RequestId(rid)) is not None, rid
        elif f == "in_flight":
            assert RequestId(rid) in s.in_flight, rid
        else:
            assert s.pool.get(RequestId(rid)) is None and RequestId(rid) not in s.in_flight, rid
    # starvation: nothing waits past its force deadline plus one tick unless the gate holds it
    for p in s.programs.values():
        deadline = p.force_resume_deadline
        waiting = p.state == "paused" and s.pool.program_len(p.ref) > 0
        if waiting and deadline is not None and now > deadline + c.metrics_interval_seconds + 3.0:
            assert p.force_gate_blocked_at is not None, (name, seed, p.ref)
    return log, fate


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_core_random_sequences_keep_invariants(name: str, seed: int) -> None:
    log, fate = run(name, seed)
    assert any(v == "completed" for v in fate.values())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_core_replay_is_deterministic(name: str) -> None:
    assert run(name, 7, 250)[0] == run(name, 7, 250)[0]
