"""Where a Program's time goes (docs/program-scheduling.md §14): scenarios through the real core.

Each scenario drives ``scheduler.step`` through the harness and checks the exact parts and the
recomputation cause.  Numbers are chosen so the splits are exact binary fractions: with the
previous turn's prompt 1024 + output 128 = 1152 tokens held, a prompt of 2048 with 256 cached
recomputes 1152 - 256 = 896 tokens out of 1792 uncached, so half of the prefill time is recompute.
"""

from __future__ import annotations

import pytest
from core_support import POOL, Harness, admitted, of, reasons, targets

from actors.core import effects as fx
from actors.core.attribution import (
    CAUSE_ACTING_TTL,
    CAUSE_CAPACITY_REPAIR,
    CAUSE_IN_PLACE,
    CAUSE_MIGRATION,
    CAUSE_PAUSED,
    CAUSE_PREEMPTION,
    PARTS,
    ProgramTime,
    cause_of,
    time_split_snapshot,
)
from actors.core.costs import prefill_seconds
from actors.core.events import TargetsChanged
from actors.core.ids import ProgramKey
from actors.core.model import RequestHints
from actors.core.snapshot import diagnostics_document, snapshot

HOLD = RequestHints(kv_retention_ttl_seconds=100.0)


def record(h: Harness, program: str) -> ProgramTime:
    return h.state.times.records[ProgramKey(POOL, program)]


def parts(rec: ProgramTime) -> dict[str, float]:
    return dict(zip(PARTS, rec.parts(), strict=True))


def attributed(effects: tuple[object, ...]) -> fx.TimeAttributed:
    (e,) = of(effects, fx.TimeAttributed)
    return e


def first_turn(h: Harness, program: str = "A", hints: RequestHints | None = None) -> None:
    """Turn 1: arrives at 0, admitted at once, first token at 1, ends at 3 (prompt 1024, output 128)."""
    assert admitted(h.submit(program, tokens=1024, at=0.0, hints=hints)) == ["r1"]
    e = attributed(h.complete("r1", at=3.0, prompt=1024, cached=0, completion=128, decode=2.0))
    assert (e.queue_seconds, e.prefill_seconds, e.recompute_seconds, e.decode_seconds) == (0.0, 1.0, 0.0, 2.0)
    assert (e.cached_tokens, e.new_tokens, e.recomputed_tokens, e.cause) == (0, 1024, 0, None)


def second_turn(h: Harness, rid: str, at_complete: float) -> fx.TimeAttributed:
    """The next turn: prompt 2048, 256 cached, decode 1 s."""
    return attributed(h.complete(rid, at=at_complete, prompt=2048, cached=256, completion=64, decode=1.0))


def test_evicted_while_acting_the_ttl_release_is_the_cause() -> None:
    h = Harness()  # warm-up: the fitted TTL is 0, every completion pauses the Program at once
    first_turn(h)
    assert "ttl_expired" in reasons(h.log)
    assert admitted(h.submit("A", tokens=2048, at=10.0)) == ["r2"]
    e = second_turn(h, "r2", 14.0)  # serving 4 s: decode 1, prefill 3 = 1.5 new + 1.5 recomputed
    assert e.between_turns_seconds == 7.0
    assert (e.prefill_seconds, e.recompute_seconds, e.decode_seconds) == (1.5, 1.5, 1.0)
    assert (e.cause, e.recomputed_tokens, e.cached_tokens, e.new_tokens) == (CAUSE_ACTING_TTL, 896, 256, 896)
    rec = record(h, "A")
    assert parts(rec) == {"queue": 0.0, "prefill": 2.5, "recompute": 1.5, "decode": 3.0, "between_turns": 7.0}
    assert sum(rec.parts()) == 14.0 == rec.since - rec.started_at
    assert rec.recomputed_by_cause == {CAUSE_ACTING_TTL: 896}
    assert rec.recompute_seconds_by_cause == {CAUSE_ACTING_TTL: 1.5}
    totals = h.state.times.totals
    assert totals.parts == parts(rec) and totals.tokens == {"cached": 256, "new": 1920, "recomputed": 896}
    assert totals.recomputed_by_cause[CAUSE_ACTING_TTL] == 896 and totals.completions == 2


def test_a_miss_while_the_program_kept_its_placement_is_in_place() -> None:
    h = Harness()
    first_turn(h, hints=HOLD)  # the hint keeps the capacity for 100 s
    assert h.program("A").lifecycle == "active_acting"
    assert admitted(h.submit("A", tokens=2048, at=10.0)) == ["r2"]
    e = second_turn(h, "r2", 14.0)
    assert (e.cause, e.recomputed_tokens, e.recompute_seconds) == (CAUSE_IN_PLACE, 896, 1.5)


def test_no_recompute_when_the_cache_held_everything_the_program_had() -> None:
    h = Harness()
    first_turn(h, hints=HOLD)
    h.submit("A", tokens=2048, at=10.0)
    e = attributed(h.complete("r2", at=14.0, prompt=2048, cached=1152, completion=64, decode=1.0))
    assert (e.cause, e.recomputed_tokens, e.recompute_seconds, e.prefill_seconds) == (None, 0, 0.0, 3.0)
    assert (e.cached_tokens, e.new_tokens) == (1152, 896)


def test_capacity_repair_is_the_cause_and_queue_time_is_counted() -> None:
    h = Harness(token_capacity_per_dp_rank=1000, high_watermark_ratio=0.9, low_watermark_ratio=0.8)
    h.submit("a", tokens=300, hints=HOLD, at=0.0)  # 400 private
    h.complete("r1", at=1.0, prompt=300, cached=0, completion=0, decode=0.5)  # acting, holds 400
    h.submit("b", tokens=300, at=2.0)  # 800
    assert reasons(h.submit("b", tokens=500, at=3.0)) == ["capacity_repair"]  # b grows: a paused
    assert admitted(h.submit("a", tokens=400, at=3.5)) == []  # 500 more does not fit: a waits
    h.complete("r2", at=4.0, prompt=300, cached=0, completion=0, decode=0.5)
    eff = h.complete("r3", at=5.0, prompt=500, cached=0, completion=0, decode=0.5)
    assert admitted(eff) == ["r4"]  # b is idle and paused (TTL 0): a is admitted at 5
    e = attributed(h.complete("r4", at=6.0, prompt=400, cached=100, completion=0, decode=0.5))
    # a held 300 tokens; 100 are hits: 200 recomputed of 300 uncached -> 2/3 of the 0.5 s prefill
    assert (e.between_turns_seconds, e.queue_seconds, e.decode_seconds) == (2.5, 1.5, 0.5)
    assert (e.cause, e.recomputed_tokens, e.new_tokens) == (CAUSE_CAPACITY_REPAIR, 200, 100)
    assert e.recompute_seconds == pytest.approx(1 / 3) and e.prefill_seconds == pytest.approx(1 / 6)
    rec = record(h, "a")
    assert rec.queue == 1.5 and sum(rec.parts()) == pytest.approx(6.0)


def test_serving_on_another_rank_is_migration() -> None:
    h = Harness(n_targets=2)
    eff = h.submit("A", tokens=1024, at=0.0)
    (home,) = [a.target_id for a in of(eff, fx.Admit)]
    h.complete("r1", at=3.0, prompt=1024, cached=0, completion=128, decode=2.0)
    h.feed(TargetsChanged(POOL, tuple(t for t in targets(2) if t.target_id != home)), at=5.0)  # its rank leaves
    eff = h.submit("A", tokens=2048, at=10.0)
    assert [a.target_id for a in of(eff, fx.Admit)] != [home]
    e = second_turn(h, "r2", 14.0)
    assert (e.cause, e.recomputed_tokens, e.recompute_seconds) == (CAUSE_MIGRATION, 896, 1.5)


def test_a_failed_request_pauses_and_its_split_is_priced_by_the_cost_model() -> None:
    h = Harness()
    first_turn(h, hints=HOLD)
    h.submit("A", tokens=1000, at=10.0)
    eff = h.complete("r2", at=11.0, success=False)  # no usage, no decode time
    assert "request_failed" in reasons(eff)
    e = attributed(eff)
    expected_prefill = prefill_seconds(1000, h.cfg.prefill_cost_model)  # the dispatch estimate, all uncached
    assert e.estimated_split and e.prefill_seconds == pytest.approx(expected_prefill)
    assert e.decode_seconds == pytest.approx(1.0 - expected_prefill) and e.cause is None
    h.submit("A", tokens=2048, at=20.0)
    e = second_turn(h, "r3", 24.0)
    # the failure paused it: the next miss is "paused"; held tokens are still those of turn 1
    assert (e.cause, e.recomputed_tokens, e.recompute_seconds, e.between_turns_seconds) == (CAUSE_PAUSED, 896, 1.5, 9.0)
    assert record(h, "A").estimated_splits == 1 and record(h, "A").unreported_usage == 1


def test_a_higher_priority_waiter_is_preemption() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("low", 600, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=-2), at=0.0)
    h.complete("r1", at=1.0, prompt=600, cached=0, completion=0, decode=0.5)  # acting, 700 held
    assert "priority_preemption" in reasons(h.submit("high", 400, at=2.0, hints=RequestHints(priority=3)))
    h.complete("r2", at=3.0, prompt=400, cached=0, completion=0, decode=0.5)  # high pauses (TTL 0)
    assert admitted(h.submit("low", 700, at=4.0)) == ["r3"]
    e = attributed(h.complete("r3", at=6.0, prompt=700, cached=0, completion=0, decode=1.0))
    assert (e.cause, e.recomputed_tokens, e.new_tokens) == (CAUSE_PREEMPTION, 600, 100)
    assert e.recompute_seconds == pytest.approx(1.0 * 600 / 700)


def test_queue_wait_is_the_router_queue_and_a_cancelled_waiter_reports_at_release() -> None:
    h = Harness(max_active_programs_per_target=1, queue_timeout_seconds=5.0)
    h.submit("A", tokens=100, hints=HOLD, at=0.0)
    h.complete("r1", at=1.0, prompt=100, cached=0, completion=10, decode=0.5)  # A holds the only slot
    assert admitted(h.submit("B", tokens=100, at=2.0)) == []
    h.tick(at=7.5)  # B's force-resume deadline (2 + min(F, queue timeout 5)) admitted it at 7
    assert "force_resume" in reasons(h.log) and "r2" in admitted(h.log)
    e = attributed(h.complete("r2", at=8.0, prompt=100, cached=0, completion=10, decode=0.5))
    assert (e.queue_seconds, e.prefill_seconds, e.decode_seconds) == (5.0, 0.5, 0.5)
    assert admitted(h.submit("C", tokens=100, at=9.0)) == []
    eff = h.abandon("r3", at=10.5)  # a Program that never completed anything is released at once
    assert "program_release" in reasons(eff)
    e = attributed(eff)
    assert e.program.program_id == "C" and not e.completed and e.queue_seconds == 1.5
    assert h.state.times.totals.parts["queue"] == 6.5
    assert record(h, "C").phase == 0 and record(h, "C").since == 10.5


def test_the_idle_tail_is_open_not_between_turns() -> None:
    h = Harness()
    first_turn(h)
    rec = record(h, "A")
    assert rec.between_turns == 0.0 and rec.since == 3.0
    snap = time_split_snapshot(h.state.times, [h.program("A").ref], 50.0)
    (row,) = snap.top_programs
    assert (row.wall_seconds, row.open_phase, row.open_seconds) == (50.0, "between_turns", 47.0)
    assert (row.prefill_seconds, row.decode_seconds, row.completions) == (1.0, 2.0, 1)
    assert row.pending_loss_cause == CAUSE_ACTING_TTL


def test_diagnostics_list_the_longest_live_programs_and_the_totals() -> None:
    h = Harness()
    for i, at in enumerate((0.0, 1.0, 2.0)):
        h.submit(f"p{i}", tokens=100, at=at, hints=HOLD)
    doc = diagnostics_document(snapshot(h.state, h.cfg, 5.0))
    split = doc["time_split"]
    assert split["programs_seen"] == 3 and split["completions"] == 0
    assert [row["wall_seconds"] for row in split["top_programs"]] == [5.0, 4.0, 3.0]
    assert [row["open_phase"] for row in split["top_programs"]] == ["serving"] * 3
    assert set(split["seconds"]) == set(PARTS)
    small = time_split_snapshot(h.state.times, [p.ref for p in h.state.programs.values()], 5.0, top=2)
    assert [r.wall_seconds for r in small.top_programs] == [5.0, 4.0]


def test_accounts_are_forgotten_with_the_generation_history() -> None:
    h = Harness(paused_retention_ttl_seconds=10.0)
    first_turn(h)  # paused at 3 (TTL 0); released at 13; history kept max(10, 60) s
    h.tick(at=14.0)
    assert h.program("A") is None and ProgramKey(POOL, "A") in h.state.times.records
    h.tick(at=74.0)
    assert ProgramKey(POOL, "A") not in h.state.times.records


def test_a_new_generation_continues_the_account_of_its_program() -> None:
    h = Harness(paused_retention_ttl_seconds=10.0)
    first_turn(h)
    h.tick(at=14.0)  # released at 13
    assert h.program("A") is None
    assert admitted(h.submit("A", tokens=2048, at=20.0)) == ["r2"]
    assert h.program("A").ref.generation == 1
    e = second_turn(h, "r2", 24.0)
    assert (e.between_turns_seconds, e.cause, e.recomputed_tokens) == (17.0, CAUSE_ACTING_TTL, 896)


def test_cause_of_pause_reasons() -> None:
    assert cause_of("ttl_expired") == CAUSE_ACTING_TTL
    assert cause_of("capacity_repair") == CAUSE_CAPACITY_REPAIR
    assert cause_of("priority_preemption") == CAUSE_PREEMPTION
    for reason in ("max_segment_yield", "request_failed", "request_cancelled", "health_failover"):
        assert cause_of(reason) == CAUSE_PAUSED


def test_a_usage_without_cached_tokens_from_a_reporting_rank_is_a_full_miss() -> None:
    """vLLM leaves ``prompt_tokens_details`` out when no prompt token was cached: once the rank's
    worker has reported cached tokens, a later usage without them counts 0 cached (all recomputed
    or new), not an unreported usage estimated from the rank's mean hits."""
    h = Harness()
    first_turn(h, hints=HOLD)  # reports cached=0: this rank's worker reports cached tokens
    h.submit("A", tokens=2048, at=10.0, hints=HOLD)
    e = attributed(h.complete("r2", at=14.0, prompt=2048, cached=None, completion=64, decode=1.0))
    # the 1152 tokens turn 1 left are all recomputed, 896 are new: 1152/2048 of the 3 s prefill
    assert (e.cached_tokens, e.recomputed_tokens, e.new_tokens, e.cause) == (0, 1152, 896, CAUSE_IN_PLACE)
    assert e.recompute_seconds == pytest.approx(3.0 * 1152 / 2048)
    assert record(h, "A").unreported_usage == 0

    never = Harness()  # a worker that never reports cached tokens: nothing is split
    assert admitted(never.submit("A", tokens=1024, at=0.0, hints=HOLD)) == ["r1"]
    never.complete("r1", at=3.0, prompt=1024, cached=None, completion=128, decode=2.0)
    never.submit("A", tokens=2048, at=10.0, hints=HOLD)
    e = attributed(never.complete("r2", at=14.0, prompt=2048, cached=None, completion=64, decode=1.0))
    assert (e.cached_tokens, e.recomputed_tokens, e.new_tokens) == (0, 0, 0)
    assert record(never, "A").unreported_usage == 2
