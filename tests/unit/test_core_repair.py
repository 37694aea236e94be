"""Capacity repair between the watermarks (docs/program-scheduling.md §6)."""

from __future__ import annotations

import pytest
from core_support import Harness, of, reasons, request_sample

from actors.core import effects as fx
from actors.core.invariants import check
from actors.core.model import RequestHints
from actors.core.repair import projected_tokens


def _harness(**kw: object) -> Harness:
    return Harness(token_capacity_per_dp_rank=1000, high_watermark_ratio=0.9, low_watermark_ratio=0.8, **kw)


def test_core_repair_marks_reasoning_victim_and_does_not_remark_committed_relief() -> None:
    h = _harness()
    h.submit("a", tokens=300)  # 400 private
    h.submit("b", tokens=300, at=1.0)  # 800 <= low 800
    h.submit("a", tokens=500, at=2.0)  # a grows to 600: ledger 1000 > high 900
    marks = [e for e in of(h.log, fx.Transition) if e.reason == "capacity_repair_mark"]
    # victims (both reasoning, in flight) scored elapsed * 0.5: a (started 0) before b (started 1);
    # marking a relieves 600 -> projected 400 <= low: b is left alone
    assert [m.program.program_id for m in marks] == ["a"]
    assert h.program("a").pause_when_idle and not h.program("b").pause_when_idle
    assert projected_tokens(h.state, h.rank(), 0.0) == 400.0
    h.tick(at=3.0)
    assert [e.reason for e in of(h.log, fx.Transition)].count("capacity_repair_mark") == 1  # no re-mark
    assert check(h.state, h.cfg) == []


def test_core_repair_starts_only_above_the_high_watermark() -> None:
    """docs/program-scheduling.md §6: repair acts when ``projected > C x high``; at exactly the high
    watermark nothing is paused or marked. c = 10 (one sample), N = 1 reasoning Program (b)."""
    h = _harness()
    h.submit("a", tokens=300, hints=RequestHints(kv_retention_ttl_seconds=60.0))
    h.complete("r1", at=0.5, prompt=300, completion=10)  # a acting, 400 private
    h.submit("b", tokens=300, at=1.0)  # 800
    h.submit("b", tokens=390, at=2.0)  # b grows to 490: projected 890 + 10 == high 900
    assert projected_tokens(h.state, h.rank(), 10.0) == 900.0
    assert not [r for r in reasons(h.log) if r.startswith("capacity_repair")]
    assert h.program("a").lifecycle == "active_acting"
    eff = h.submit("b", tokens=391, at=3.0)  # projected 901 > high: the acting a is paused
    assert "capacity_repair" in reasons(eff)


def test_core_repair_never_pauses_in_flight_program_then_pauses_at_idle() -> None:
    h = _harness()
    h.submit("a", tokens=300)
    h.submit("b", tokens=300, at=1.0)
    h.submit("a", tokens=500, at=2.0)
    assert h.program("a").lifecycle == "active_reasoning"  # a busy Program is only marked
    h.complete("r1", at=3.0, prompt=300)
    assert h.program("a").lifecycle == "active_reasoning"  # r3 still in flight
    eff = h.complete("r3", at=4.0, prompt=500)
    assert "capacity_repair" in reasons(eff)
    assert h.program("a").lifecycle == "paused_acting"


def test_core_repair_pauses_acting_victims_first_by_score() -> None:
    h = _harness()
    hold = RequestHints(kv_retention_ttl_seconds=100.0)
    h.submit("a", tokens=300, hints=hold)  # 400
    h.complete("r1", at=1.0, prompt=300)  # acting, TTL 100, 400 private
    h.submit("b", tokens=300, at=2.0)  # 800
    eff = h.submit("b", tokens=500, at=3.0)  # b grows to 600 -> 1000 > 900
    # victims: a acting (elapsed 3 * 0.5), b reasoning (elapsed 1 * 0.5); a first: pause frees 400 -> 600 <= 800
    assert reasons(eff) == ["capacity_repair"]
    assert h.program("a").lifecycle == "paused_acting"
    assert not h.program("b").pause_when_idle
    assert h.rank().fallback_tokens == 600.0
    assert check(h.state, h.cfg) == []


def test_core_repair_stops_once_projected_reaches_the_low_watermark() -> None:
    """docs/program-scheduling.md §6: victims are walked until ``projected <= C x low``; pausing a
    frees 400 and brings 1200 to exactly 800, so b is not marked."""
    h = _harness()
    h.submit("a", tokens=300, hints=RequestHints(kv_retention_ttl_seconds=100.0))  # 400
    h.complete("r1", at=1.0, prompt=300)  # acting
    h.submit("b", tokens=300, at=2.0)  # 800
    eff = h.submit("b", tokens=700, at=3.0)  # b grows to 800 -> 1200 > 900
    assert reasons(eff) == ["capacity_repair"]
    assert h.rank().fallback_tokens == 800.0
    assert not h.program("b").pause_when_idle


def test_core_repair_a_marked_reasoning_program_relieves_its_private_tokens_plus_c() -> None:
    """docs/program-scheduling.md §6: marking a Reasoning Program relieves ``private + c``.
    c = 10, a 400 and b 790 private, both reasoning: projected 1190 + 2 x 10 = 1210 > 900;
    marking a (first by score) relieves 410 -> 800 <= low: b is left alone."""
    h = _harness()
    h.rank().factors.push_request(request_sample(prompt=400, completion=10))  # c_bar 10
    h.submit("a", tokens=300)  # 400
    h.submit("b", tokens=300, at=1.0)  # 800
    h.submit("b", tokens=690, at=3.0)  # b grows to 790
    assert reasons(h.log).count("capacity_repair_mark") == 1
    assert h.program("a").pause_when_idle and not h.program("b").pause_when_idle
    assert projected_tokens(h.state, h.rank(), 10.0) == 800.0


def test_core_repair_walks_as_many_victims_as_it_takes() -> None:
    """docs/program-scheduling.md §6: victims are walked until ``projected <= C x low``: two acting
    Programs (250 each) must pause before c's growth (to 700) fits: 1200 -> 950 -> 700 <= 800."""
    h = _harness()
    hold = RequestHints(kv_retention_ttl_seconds=100.0)
    h.submit("a", tokens=150, hints=hold)  # 250
    h.complete("r1", at=1.0, prompt=150)
    h.submit("b", tokens=150, at=2.0, hints=hold)  # 500
    h.complete("r2", at=3.0, prompt=150)
    h.submit("c", tokens=200, at=4.0)  # 800
    eff = h.submit("c", tokens=600, at=5.0)  # c grows to 700: 1200 > 900
    paused = [e.program.program_id for e in of(eff, fx.Transition) if e.reason == "capacity_repair"]
    assert paused == ["a", "b"]
    assert not h.program("c").pause_when_idle and h.rank().fallback_tokens == 700.0


def test_core_repair_score_prefers_small_contexts_worked_numbers() -> None:
    h = _harness()
    f = h.rank().factors
    f.push_request(request_sample(prompt=400, completion=0))  # mean prompt 400, c_bar 0
    hold = RequestHints(kv_retention_ttl_seconds=100.0)
    h.submit("small", tokens=100, hints=hold)  # 200 private
    h.complete("r1", at=1.0, prompt=100)
    h.submit("large", tokens=500, at=1.0)  # 600 private -> 800
    h.submit("large", tokens=650, at=5.0)  # 750 -> 950 > 900
    # small (acting): elapsed 5 * max(0.5, 1/sqrt(100/400) = 2) = 10
    # large (reasoning): elapsed 4 * max(0.5, 1/sqrt(650/400) = 0.784) = 3.14 -> small first
    # pausing small frees 200: 950 - 200 = 750 <= 800 -> stop
    assert [e.program.program_id for e in of(h.log, fx.Transition) if e.reason == "capacity_repair"] == ["small"]
    assert not h.program("large").pause_when_idle


def test_core_repair_score_weighs_the_context_against_the_mean_prompt() -> None:
    """docs/program-scheduling.md §6: ``score = elapsed x max(0.5, 1/sqrt(input / mean_prompt))``:
    a small context outranks a larger one that has been in its segment longer. Mean prompt 250
    (samples 400 and 100): small 4 x 1/sqrt(0.4) = 6.3 before large 5 x 1/sqrt(2.6) = 3.1
    (by elapsed time alone, 5 x 0.5 before 4 x 0.5, large would be marked instead)."""
    h = _harness()
    h.rank().factors.push_request(request_sample(prompt=400, completion=0))
    h.submit("large", tokens=500)  # 600 private, segment from 0
    h.submit("small", tokens=100, at=1.0, hints=RequestHints(kv_retention_ttl_seconds=100.0))  # 800
    h.complete("r2", at=1.5, prompt=100)  # small acting, segment from 1
    h.submit("large", tokens=650, at=5.0)  # 750 + 200 = 950 > 900
    assert [e.program.program_id for e in of(h.log, fx.Transition) if e.reason == "capacity_repair"] == ["small"]
    assert not h.program("large").pause_when_idle


def test_core_repair_projection_includes_expected_output_growth() -> None:
    h = _harness()
    f = h.rank().factors
    for c in (40, 41):
        f.push_request(request_sample(completion=c))
    # c_bar = ceil(40.5) = 41
    h.submit("a", tokens=300)  # 400
    h.submit("b", tokens=300, at=1.0)  # 800
    # projected = 800 + 41 * 2 = 882 <= 900: no repair yet
    assert projected_tokens(h.state, h.rank(), 41.0) == 882.0
    assert "capacity_repair_mark" not in reasons(h.log)
    h.submit("c", tokens=0, at=2.0)  # not admitted (800 + 100 > 800 low)
    h.submit("b", tokens=330, at=3.0)  # 830 + 82 = 912 > 900 -> mark until <= 800
    marks = [e.program.program_id for e in of(h.log, fx.Transition) if e.reason == "capacity_repair_mark"]
    # victim order: a (elapsed 3) then b (elapsed 2); a relieves 400 + 41: 912 - 441 = 471 <= 800
    assert marks == ["a"]


def test_core_repair_does_nothing_without_capacity() -> None:
    h = Harness(high_watermark_ratio=0.1)
    for i in range(5):
        h.submit(f"p{i}", tokens=10_000)
    assert "capacity_repair_mark" not in reasons(h.log)


@pytest.mark.parametrize("binding_only", [True])
def test_core_repair_skipped_in_binding_only(binding_only: bool) -> None:
    h = Harness(token_capacity_per_dp_rank=100, binding_only=binding_only)
    h.submit("a", tokens=500)
    h.submit("b", tokens=500)
    assert admitted_all(h) == ["r1", "r2"]
    assert "capacity_repair_mark" not in reasons(h.log)


def admitted_all(h: Harness) -> list[str]:
    return [e.request_id for e in of(h.log, fx.Admit)]
