"""The per-tool acting TTL (actors/core/tool_retention.py, docs/program-scheduling.md §12)."""

from __future__ import annotations

import pytest

from actors.core import effects as fx
from actors.core.config import ProgramSchedulingConfig, ToolRetentionConfig, problems
from actors.core.costs import cache_miss_impact_seconds
from actors.core.model import RequestHints
from actors.core.snapshot import diagnostics_document, snapshot
from actors.core.tool_retention import GapWindow, ToolGapModel, turn_keys
from tests.unit.core_support import Harness, of

CFG = ToolRetentionConfig()
PROMPT = 20_000
COST = cache_miss_impact_seconds(PROMPT, ProgramSchedulingConfig().prefill_cost_model)  # ~5.49 s


def test_turn_keys_sorted_deduplicated_bounded_and_finish_reason_fallback() -> None:
    assert turn_keys(("grep", "read_file", "grep"), "tool_calls", CFG) == ("grep", "read_file")
    assert turn_keys((), "stop", CFG) == ("<stop>",)
    assert turn_keys((), None, CFG) == ()
    assert turn_keys((), "stop", ToolRetentionConfig(finish_reason_keys=False)) == ()
    assert turn_keys(("x" * 100,), None, CFG) == ("x" * 64,)
    assert len(turn_keys(tuple(f"t{i}" for i in range(10)), None, CFG)) == 4


def test_gap_window_utility_is_the_empirical_ski_rental_value() -> None:
    w = GapWindow(4)
    for g in (1.0, 2.0, 3.0, 10.0):
        w.push(g)
    # hold 2.5 s against C = 5: gaps 1 and 2 pay 5-1 + 5-2, gaps 3 and 10 cost 2.5 each
    assert w.utility(2.5, 5.0) == pytest.approx((4.0 + 3.0 - 2.5 - 2.5) / 4)
    assert w.utility(0.0, 5.0) == 0.0
    assert w.quantile(0.5) == 2.0 and w.quantile(0.99) == 10.0
    w.push(4.0)  # the window keeps the last 4
    assert sorted(w.gaps) == [2.0, 3.0, 4.0, 10.0] and w.observed == 5


def test_best_ttl_holds_for_short_gaps_releases_for_long_ones() -> None:
    short = GapWindow(64)
    gaps = [0.1 + 0.01 * i for i in range(20)]  # 0.10 .. 0.29
    for g in gaps:
        short.push(g)
    ttl = short.best_ttl(5.0, 5.0, 0.1, 0.02)
    # the shortest candidate that covers every learned gap (g * 1.1 + 0.02 >= 0.29: g = 0.25)
    assert ttl == pytest.approx(gaps[15] * 1.1 + 0.02) and ttl >= max(gaps)
    long = GapWindow(64)
    for _ in range(20):
        long.push(30.0)
    assert long.best_ttl(5.0, 5.0, 0.1, 0.02) == 0.0
    # a gap longer than the recompute cost never pays; a shorter one pays unless max_acting_ttl cuts it
    six, four = GapWindow(64), GapWindow(64)
    for _ in range(20):
        six.push(6.0)
        four.push(4.0)
    assert six.best_ttl(5.0, 10.0, 0.1, 0.02) == 0.0
    assert four.best_ttl(5.0, 5.0, 0.1, 0.02) == pytest.approx(4.42)
    assert four.best_ttl(5.0, 3.0, 0.1, 0.02) == 0.0


def test_model_falls_back_until_min_samples_then_decides_on_the_slowest_tool() -> None:
    m = ToolGapModel(ToolRetentionConfig(min_samples=3))
    assert m.decide("p", ("grep",), COST, 10.0) is None
    for _ in range(3):
        m.observe("p", ("grep",), 0.2)
    d = m.decide("p", ("grep",), COST, 10.0)
    assert d is not None and d.source == "tool" and d.ttl_seconds == pytest.approx(0.2 * 1.1 + 0.02)
    assert m.decide("p", ("grep", "web_fetch"), COST, 10.0) is None  # web_fetch unknown: fall back
    for _ in range(3):
        m.observe("p", ("web_fetch",), 60.0)
    d2 = m.decide("p", ("grep", "web_fetch"), COST, 10.0)
    assert d2 is not None and d2.key == "web_fetch" and d2.ttl_seconds == 0.0 and d2.source == "tool_release"
    assert m.decide("other-pool", ("grep",), COST, 10.0) is None  # per model pool
    rows = {(r.model_pool, r.tool): r for r in m.snapshot()}
    assert rows[("p", "grep")].held == 1 and rows[("p", "grep")].fallbacks == 1
    assert rows[("p", "web_fetch")].released == 1 and rows[("p", "web_fetch")].gap_p50_seconds == 60.0


def test_model_is_bounded_by_max_tools_least_recently_used_out() -> None:
    m = ToolGapModel(ToolRetentionConfig(max_tools=3, window_size=2, min_samples=1))
    for name in ("a", "b", "c"):
        m.observe("p", (name,), 1.0)
    m.decide("p", ("a",), COST, 10.0)  # touch a: b is now the least recently used
    m.observe("p", ("d",), 1.0)
    assert sorted(k for _, k in m.windows) == ["a", "c", "d"]
    for _ in range(10):
        m.observe("p", ("a",), 1.0)
    assert len(m.windows[("p", "a")].gaps) == 2


def test_release_when_long_off_and_disabled_fall_back() -> None:
    m = ToolGapModel(ToolRetentionConfig(min_samples=1, release_when_long=False))
    m.observe("p", ("slow",), 100.0)
    assert m.decide("p", ("slow",), COST, 10.0) is None
    off = ToolGapModel(ToolRetentionConfig(enabled=False, min_samples=1))
    off.observe("p", ("fast",), 0.01)
    assert off.decide("p", ("fast",), COST, 10.0) is None


def test_config_rules_name_the_field() -> None:
    bad = ProgramSchedulingConfig(tool_retention=ToolRetentionConfig(window_size=4, min_samples=8, max_tools=0))
    out = problems(bad, "program_scheduling")
    assert "program_scheduling.tool_retention.max_tools: must be an integer > 0 (got 0)" in out
    bad_mode = ProgramSchedulingConfig(tool_retention=ToolRetentionConfig(contention="sometimes"))
    (msg,) = problems(bad_mode, "program_scheduling")
    assert msg.startswith("program_scheduling.tool_retention.contention: must be one of") and "'sometimes'" in msg
    assert any(p.startswith("program_scheduling.tool_retention.min_samples: must not exceed window_size") for p in out)


def _turns(h: Harness, program: str, tools: tuple[str, ...], gap: float, n: int, start: float = 0.0) -> float:
    """``n`` turns of ``program`` each ending with a call of ``tools``, the next arriving ``gap`` later."""
    t = start
    for i in range(n):
        rid = f"{program}-{i}"
        h.submit(program, tokens=PROMPT, at=t, rid=rid)
        t += 1.0
        h.complete(rid, at=t, prompt=PROMPT, cached=0, completion=10, finish_reason="tool_calls", tool_names=tools)
        t += gap
    return t


def test_core_arms_the_per_tool_ttl_and_releases_at_once_after_slow_tools() -> None:
    h = Harness(token_capacity_per_dp_rank=1_000_000, tool_retention=ToolRetentionConfig(min_samples=3))
    t = _turns(h, "a", ("read_file",), 0.05, 4)  # 3 gaps learned (the 4th turn's gap is not seen yet)
    h.submit("a", tokens=PROMPT, at=t, rid="a-x")
    eff = h.complete("a-x", at=t + 1, prompt=PROMPT, cached=0, completion=10, tool_names=("read_file",))
    (armed,) = of(eff, fx.TtlArmed)
    assert armed.source == "tool" and armed.tool == "read_file"
    assert armed.ttl_seconds == pytest.approx(0.05 * 1.1 + 0.02)
    t = _turns(h, "b", ("run_tests",), 30.0, 4, start=t + 2)
    h.submit("b", tokens=PROMPT, at=t, rid="b-x")
    eff = h.complete("b-x", at=t + 1, prompt=PROMPT, cached=0, completion=10, tool_names=("run_tests",))
    (armed,) = of(eff, fx.TtlArmed)
    assert armed.source == "tool_release" and armed.ttl_seconds == 0.0
    assert "ttl_expired" in [e.reason for e in of(eff, fx.Transition)]  # paused at once
    doc = diagnostics_document(snapshot(h.state, h.cfg, h.now))
    rows = {r["tool"]: r for r in doc["tools"]}
    assert rows["run_tests"]["released"] == 2 and rows["run_tests"]["gap_p50_seconds"] == 30.0
    assert rows["read_file"]["held"] == 2 and rows["read_file"]["samples"] == 4


def test_core_request_hint_wins_and_unknown_tools_use_the_fitted_ttl() -> None:
    h = Harness(token_capacity_per_dp_rank=1_000_000, tool_retention=ToolRetentionConfig(min_samples=2))
    t = _turns(h, "a", ("grep",), 0.1, 3)
    h.submit("a", tokens=PROMPT, at=t, rid="a-h", hints=RequestHints(kv_retention_ttl_seconds=7.0))
    (armed,) = of(h.complete("a-h", at=t + 1, prompt=PROMPT, tool_names=("grep",)), fx.TtlArmed)
    assert (armed.source, armed.ttl_seconds) == ("request_hint", 7.0)
    h.submit("a", tokens=PROMPT, at=t + 2, rid="a-u")
    (armed,) = of(h.complete("a-u", at=t + 3, prompt=PROMPT, tool_names=("never_seen",)), fx.TtlArmed)
    assert armed.source == "fitted" and armed.tool is None


def test_core_retention_release_teaches_a_long_gap() -> None:
    h = Harness(
        token_capacity_per_dp_rank=1_000_000,
        paused_retention_ttl_seconds=100.0,
        tool_retention=ToolRetentionConfig(min_samples=1),
    )
    h.submit("a", tokens=PROMPT, at=0.0, rid="a0")
    h.complete("a0", at=1.0, prompt=PROMPT, finish_reason="stop")
    h.tick(at=200.0)
    rows = {r.tool: r for r in h.state.tools.snapshot()}
    assert rows["<stop>"].samples == 1 and rows["<stop>"].gap_p50_seconds == pytest.approx(100.0, abs=1.5)


def test_core_per_tool_ttl_is_capped_at_the_fit_while_programs_wait() -> None:
    """contention = "cap_at_fit": with a Program queued for capacity, a tool may only release sooner
    than the fitted TTL (0 here: the fit's window is not full), never hold longer; "ignore" holds."""
    for mode, expected in (("cap_at_fit", 0.0), ("ignore", pytest.approx(0.05 * 1.1 + 0.02))):
        tr = ToolRetentionConfig(min_samples=3, contention=mode)
        h = Harness(token_capacity_per_dp_rank=PROMPT + 500, tool_retention=tr)
        t = _turns(h, "a", ("read_file",), 0.05, 4)
        h.submit("a", tokens=PROMPT, at=t, rid="a-x")
        h.submit("b", tokens=PROMPT, at=t + 0.5, rid="b-0")  # no room while "a" holds: "b" waits
        assert h.program("b").state == "paused"
        eff = h.complete("a-x", at=t + 1, prompt=PROMPT, cached=0, completion=10, tool_names=("read_file",))
        (armed,) = of(eff, fx.TtlArmed)
        assert armed.source == "tool" and armed.ttl_seconds == expected


def test_rent_prices_every_second_held() -> None:
    w = GapWindow(8)
    for g in (0.2, 0.2, 0.2, 3.0):
        w.push(g)
    # hold 0.25 s at rent 2 against C = 1: three gaps pay 1 - 2 * 0.2, the fourth costs 2 * 0.25
    assert w.utility(0.25, 1.0, 2.0) == pytest.approx((3 * 0.6 - 0.5) / 4)
    assert w.best_ttl(1.0, 1.0, 0.1, 0.02, 1.0) == pytest.approx(0.2 * 1.1 + 0.02)
    # at rent 4 the short gaps still pay (1 - 0.8 each) but the miss (4 * 0.24) takes it below 0
    assert w.utility(0.24, 1.0, 4.0) == pytest.approx((3 * 0.2 - 0.96) / 4)
    assert w.best_ttl(1.0, 0.25, 0.1, 0.02, 4.0) == 0.0
    m = ToolGapModel(ToolRetentionConfig(min_samples=4))
    for g in (0.2, 0.2, 0.2, 0.2):
        m.observe("p", ("grep",), g)
    held = m.decide("p", ("grep",), 1.0, 10.0, rent=4.0)
    assert held is not None and held.ttl_seconds == pytest.approx(0.24)  # 1 - 4 * 0.2 > 0: held
    released = m.decide("p", ("grep",), 1.0, 10.0, rent=6.0)  # 1 - 6 * 0.2 < 0: released
    assert released is not None and released.ttl_seconds == 0.0
    # d_max = min(max_ttl, C / rent): holding longer than C / rent never pays
    assert m.decide("p", ("grep",), 1.0, 10.0, rent=0.5) == held  # rent below 1 counts as 1


def test_decisions_are_counted_against_the_fit_and_by_outcome() -> None:
    m = ToolGapModel(ToolRetentionConfig(min_samples=1))
    m.observe("p", ("grep",), 0.2)
    m.note_armed("p", "grep", 0.5, 0.1)  # held longer than the fit
    m.observe("p", ("grep",), 0.3, ("grep", 0.5, 0.1))  # back in time; the fit had released it
    m.note_armed("p", "grep", 0.0, 0.1)  # released sooner than the fit
    m.observe("p", ("grep",), 0.05, ("grep", 0.0, 0.1))  # back after release; the fit would have held
    m.observe("p", ("grep",), 9.0, ("grep", 0.5, 0.1))  # back after both
    m.observe_resume("p", ("grep", "ls"), 1200, 0.4)  # the first key carries the cost
    m.observe_resume("p", ("grep",), 800, 0.1)
    (row,) = m.snapshot()
    assert (row.shorter_than_fit, row.longer_than_fit) == (1, 1)
    assert (row.returned_held, row.returned_released, row.fit_would_hold, row.fit_would_release) == (1, 2, 1, 1)
    assert (row.resumes, row.recomputed_tokens, row.recompute_seconds) == (2, 2000, 0.5)
    assert row.samples == 4


def test_core_rent_holds_instant_tools_past_the_fit_and_releases_slower_ones_while_programs_wait() -> None:
    """contention = "rent" (default): with one Program waiting on the pool's one rank, a second
    held costs 2; read_file (gaps 0.05 s) is still held against C ~ 5.5 s although the fit gives
    0, a tool whose gaps are 3 s is held while nobody waits (3 < C) and released while one waits
    (2 x 3 > C)."""
    tr = ToolRetentionConfig(min_samples=3)
    for tool, gap, waiter, expected in (
        ("read_file", 0.05, True, pytest.approx(0.05 * 1.1 + 0.02)),
        ("bash", 3.0, False, pytest.approx(3.0 * 1.1 + 0.02)),
        ("bash", 3.0, True, 0.0),
    ):
        h = Harness(token_capacity_per_dp_rank=PROMPT + 500, tool_retention=tr)
        t = _turns(h, "a", (tool,), gap, 4)
        h.submit("a", tokens=PROMPT, at=t, rid="a-x")
        if waiter:
            h.submit("b", tokens=PROMPT, at=t + 0.5, rid="b-0")  # no room while "a" holds: "b" waits
            assert h.program("b").state == "paused"
        eff = h.complete("a-x", at=t + 1, prompt=PROMPT, cached=0, completion=10, tool_names=(tool,))
        (armed,) = of(eff, fx.TtlArmed)
        assert armed.tool == tool and armed.ttl_seconds == expected
        assert h.program("a").tool_ttl_armed == (tool, armed.ttl_seconds, 0.0)  # the fit: 0 (window not full)
        row = {r.tool: r for r in h.state.tools.snapshot()}[tool]
        # the 4th turn of _turns already decided (3 gaps, nobody waiting): held past the fit too
        assert row.longer_than_fit == 1 + (armed.ttl_seconds > 0) and row.shorter_than_fit == 0


def test_core_resume_after_a_gap_counts_what_it_recomputed() -> None:
    """A Program paused after a tool and resumed with part of its context gone: the tool's window
    counts the resume, the lost tokens and their recompute seconds (cache_miss_impact)."""
    h = Harness(token_capacity_per_dp_rank=1_000_000, tool_retention=ToolRetentionConfig(min_samples=1))
    h.submit("a", tokens=PROMPT, at=0.0, rid="a0")
    h.complete("a0", at=1.0, prompt=PROMPT, cached=0, completion=10, tool_names=("run_tests",))
    h.tick(at=200.0)  # no gap learned yet: the fit (0 while its window is not full) paused it
    assert h.program("a").state == "paused"
    h.submit("a", tokens=PROMPT + 100, at=201.0, rid="a1")
    h.complete("a1", at=202.0, prompt=PROMPT + 100, cached=15_000, completion=10, tool_names=("run_tests",))
    row = {r.tool: r for r in h.state.tools.snapshot()}["run_tests"]
    lost = PROMPT - 15_000
    assert (row.resumes, row.recomputed_tokens) == (1, lost)
    assert row.recompute_seconds == pytest.approx(
        cache_miss_impact_seconds(lost, ProgramSchedulingConfig().prefill_cost_model), abs=1e-6
    )


def test_measured_miss_ratio_of_a_key_prices_its_miss() -> None:
    """Once a key has min_samples resumes, a miss after it costs impact x the share of the previous
    context those resumes lost, not the cluster-wide cost passed in."""
    for measured, expected in ((True, 0.0), (False, pytest.approx(0.24))):
        m = ToolGapModel(ToolRetentionConfig(min_samples=4, measured_miss=measured))
        for _ in range(4):
            m.observe("p", ("grep", "ls"), 0.2)
        for _ in range(3):
            m.observe_resume("p", ("grep", "ls"), 100, 0.09, 1000)
        # 3 resumes: too few, the cost passed in (1.0) decides: 1 - 4 x 0.2 > 0 holds
        d = m.decide("p", ("grep",), 1.0, 10.0, rent=4.0, impact=2.0)
        assert d is not None and d.ttl_seconds == pytest.approx(0.24)
        m.observe_resume("p", ("grep", "ls"), 100, 0.09, 1000)
        # 4 resumes lost 10%: a miss costs 2.0 x 0.1 = 0.2 < 4 x 0.2, release at once
        d = m.decide("p", ("grep",), 1.0, 10.0, rent=4.0, impact=2.0)
        assert d is not None and d.ttl_seconds == expected
        rows = {r.tool: r for r in m.snapshot()}
        assert rows["grep"].resume_miss_ratio == pytest.approx(0.1)
        assert rows["ls"].resume_miss_ratio == pytest.approx(0.1)
        assert rows["grep"].recompute_seconds == pytest.approx(0.36) and rows["ls"].recompute_seconds == 0.0
