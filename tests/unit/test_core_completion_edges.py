"""Edges of a Program request's completion (actors/core/completion.py, docs/program-scheduling.md
§2, §4, §9.1, §12) that the mutation campaign found untested: a completion of a released
generation, the output reservation's end, the completed rank's capacity repair, the lifetime
output count, and how the acting TTL is
priced (a request hint decides alone; contention modes).  Exact virtual times."""

from __future__ import annotations

import pytest
from core_support import POOL, Harness, Ident, admitted, of, targets, tid

from actors.core import effects as fx
from actors.core.config import ToolRetentionConfig
from actors.core.costs import cache_miss_impact_seconds
from actors.core.events import InteractiveSubmitted, RequestSubmitted, TargetsChanged
from actors.core.ids import ProgramKey, RequestId
from actors.core.invariants import check
from actors.core.model import RequestHints

PROMPT = 20_000


def _turns(h: Harness, program: str, tool: str, gap: float, n: int, start: float = 0.0) -> float:
    """``n`` turns of ``program`` each ending with a call of ``tool``, the next arriving ``gap`` later."""
    t = start
    for i in range(n):
        rid = f"{program}-{i}"
        h.submit(program, tokens=PROMPT, at=t, rid=rid)
        t += 1.0
        h.complete(rid, at=t, prompt=PROMPT, cached=0, completion=10, finish_reason="tool_calls", tool_names=(tool,))
        t += gap
    return t


def test_a_completion_of_a_released_generation_is_ignored() -> None:
    """Its rank left the pool while r1 ran; the paused Program was released by its retention TTL
    (1 s + 1800 s); r1's late completion changes nothing (``stale_generation``)."""
    h = Harness(n_targets=1)
    h.submit("p", rid="r1", at=0.0)
    h.feed(TargetsChanged(POOL, ()), at=1.0)
    h.feed(TargetsChanged(POOL, targets(1)), at=1900.0)
    assert h.program("p") is None
    eff = h.complete("r1", at=1901.0, prompt=100, completion=10)
    assert [(type(e).__name__, e.request_id, e.reason) for e in eff] == [
        ("CompletionIgnored", "r1", "stale_generation")
    ]
    assert h.state.in_flight == {} and h.rank().dispatched == 0
    assert check(h.state, h.cfg) == []


def test_the_output_reservation_ends_with_its_request() -> None:
    """docs/program-scheduling.md §4: the request's expected output (500) is charged while it runs,
    not while it acts."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    hints = RequestHints(expected_output_length=500, kv_retention_ttl_seconds=10.0)
    h.submit("p", rid="r1", at=0.0, tokens=1000, hints=hints)
    p = h.program("p")
    assert (p.output_token_reservation, p.charged_tokens) == (500, 1500.0)
    h.complete("r1", at=1.0, prompt=1000, completion=10)
    assert (p.lifecycle, p.output_token_reservation, p.charged_tokens) == ("active_acting", None, 1100.0)
    assert h.rank().fallback_tokens == 1100.0


def test_a_completion_that_outgrows_the_rank_is_repaired_in_the_same_step() -> None:
    """The completed rank is checked at once: p's 3000-token prompt answered with 1500 tokens
    holds 4600 next to q's 6100 on a 10 000-token rank; repair pauses the acting p."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=10_000)
    h.submit("p", rid="r1", at=0.0, tokens=3000, hints=RequestHints(kv_retention_ttl_seconds=10.0))
    h.submit("q", rid="q1", at=0.0, tokens=6000)
    assert h.rank().fallback_tokens == 9200.0
    h.tick(at=0.5)  # repairs every rank: none is left to check
    assert h.state.dirty_ranks == {}
    eff = h.complete("r1", at=1.0, prompt=3000, completion=1500)
    assert [(e.reason, e.program.program_id) for e in of(eff, fx.Transition)] == [("capacity_repair", "p")]
    assert (h.program("p").lifecycle, h.rank().fallback_tokens) == ("paused_acting", 6100.0)


def test_the_lifetime_output_counts_every_completion() -> None:
    h = Harness(n_targets=1)
    h.submit("p", rid="r1", at=0.0)
    h.complete("r1", at=1.0, prompt=100, completion=7)
    h.submit("p", rid="r2", at=2.0)
    h.complete("r2", at=3.0, prompt=150, completion=5)
    assert (h.program("p").lifetime_generated_tokens, h.program("p").last_completion_tokens) == (12, 5)


def test_a_request_hint_ttl_decides_alone_and_clears_the_last_tool_decision() -> None:
    """docs/program-scheduling.md §12: with ``kv_retention_ttl_seconds`` the per-tool model is not
    asked (its counters do not move) and the Program no longer carries the previous turn's armed
    tool TTL."""
    h = Harness(token_capacity_per_dp_rank=1_000_000, tool_retention=ToolRetentionConfig(min_samples=2))
    t = _turns(h, "a", "grep", 0.1, 3)
    p = h.program("a")
    assert p.tool_ttl_armed is not None and p.tool_ttl_armed[0] == "grep"
    held = {r.tool: r for r in h.state.tools.snapshot()}["grep"].held
    h.submit("a", tokens=PROMPT, at=t, rid="a-h", hints=RequestHints(kv_retention_ttl_seconds=7.0))
    (armed,) = of(h.complete("a-h", at=t + 1, prompt=PROMPT, tool_names=("grep",)), fx.TtlArmed)
    assert (armed.source, armed.ttl_seconds, armed.tool) == ("request_hint", 7.0, None)
    assert p.tool_ttl_armed is None
    assert {r.tool: r for r in h.state.tools.snapshot()}["grep"].held == held


def test_contention_ignore_holds_a_slow_tool_although_programs_wait() -> None:
    """contention = "ignore": holding costs 1 per second whoever waits, so bash (gaps of 3 s) is
    held as with nobody waiting; "rent" releases it (test_core_tool_retention.py)."""
    tr = ToolRetentionConfig(min_samples=3, contention="ignore")
    h = Harness(token_capacity_per_dp_rank=PROMPT + 500, tool_retention=tr)
    t = _turns(h, "a", "bash", 3.0, 4)
    h.submit("a", tokens=PROMPT, at=t, rid="a-x")
    h.submit("b", tokens=PROMPT, at=t + 0.5, rid="b-0")  # no room while "a" holds: "b" waits
    assert h.program("b").state == "paused"
    eff = h.complete("a-x", at=t + 1, prompt=PROMPT, cached=0, completion=10, tool_names=("bash",))
    (armed,) = of(eff, fx.TtlArmed)
    assert (armed.source, armed.tool, armed.ttl_seconds) == ("tool", "bash", pytest.approx(3.0 * 1.1 + 0.02))


def test_cap_at_fit_caps_only_while_a_program_waits() -> None:
    """contention = "cap_at_fit": nobody waits, so read_file's TTL is not capped at the fit (0 while
    the fit's window is not full); with a global queue, a Program waiting in it caps it."""
    tr = ToolRetentionConfig(min_samples=3, contention="cap_at_fit")
    for global_queue, waiter, expected in ((False, False, pytest.approx(0.05 * 1.1 + 0.02)), (True, True, 0.0)):
        h = Harness(token_capacity_per_dp_rank=PROMPT + 500, tool_retention=tr, global_queue=global_queue)
        t = _turns(h, "a", "read_file", 0.05, 4)
        h.submit("a", tokens=PROMPT, at=t, rid="a-x")
        if waiter:
            h.submit("b", tokens=PROMPT, at=t + 0.5, rid="b-0")
            assert h.program("b").state == "paused" and h.state.global_queues[POOL]
        eff = h.complete("a-x", at=t + 1, prompt=PROMPT, cached=0, completion=10, tool_names=("read_file",))
        (armed,) = of(eff, fx.TtlArmed)
        assert (armed.tool, armed.ttl_seconds) == ("read_file", expected)


def test_an_interactive_completion_admits_the_program_waiting_for_its_capacity() -> None:
    """docs/priority.md §2: the interactive request's 700 tokens are free again at its completion,
    and the Program that waited for them (500 + 100 of 1000) is admitted in the same step."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.feed(InteractiveSubmitted(RequestId("i1"), 600, max_tokens=100), 0.0)
    h.submit("p", rid="r1", tokens=500, at=1.0)
    assert h.program("p").lifecycle == "paused_reasoning"
    eff = h.complete("i1", at=2.0, prompt=600, completion=100)
    assert admitted(eff) == ["r1"]
    assert h.program("p").lifecycle == "active_reasoning"


def test_a_failed_request_teaches_no_tool_turn() -> None:
    """docs/program-scheduling.md §12: only a successful completion's tool calls are the Program's last turn."""
    h = Harness(n_targets=1, tool_retention=ToolRetentionConfig(min_samples=1))
    h.submit("p", rid="r1", at=0.0)
    h.complete("r1", at=1.0, prompt=100, completion=10, finish_reason="tool_calls", tool_names=("grep",))
    assert h.program("p").last_turn_keys != ()
    h.submit("p", rid="r2", at=2.0)
    h.complete("r2", at=3.0, success=False, finish_reason="tool_calls", tool_names=("grep",))
    assert h.program("p").last_turn_keys == ()


def test_an_old_dispatch_of_a_new_placement_on_the_same_rank_is_stale() -> None:
    """The placement epoch fences it: r1 ran when rank 0 left the pool; the Program came back on
    rank 0 (a new placement) with r2 running; r1's completion is ignored and r2 still counts."""
    h = Harness(n_targets=1)
    h.submit("p", rid="r1", at=0.0)
    h.feed(TargetsChanged(POOL, ()), at=1.0)
    h.feed(TargetsChanged(POOL, targets(1)), at=2.0)
    h.submit("p", rid="r2", at=3.0)
    p = h.program("p")
    assert (p.lifecycle, p.placement, p.in_flight) == ("active_reasoning", tid(0), 1)
    eff = h.complete("r1", at=4.0, prompt=100, completion=10)
    assert [(type(e).__name__, e.reason) for e in eff] == [("CompletionIgnored", "stale_placement")]
    assert (p.lifecycle, p.in_flight, p.completed_requests) == ("active_reasoning", 1, 0)
    assert check(h.state, h.cfg) == []


def _run_and_resume(h: Harness, cached: int | None) -> tuple[object, ...]:
    """p runs r1 (1000 tokens) on rank 0, pauses (warm-up TTL 0), and comes back with r2 (1100
    tokens) whose completion reports ``cached`` tokens (None: not reported)."""
    h.submit("p", rid="r1", tokens=1000, at=0.0)
    h.complete("r1", at=1.0, prompt=1000, cached=0, completion=10)
    assert h.program("p").lifecycle == "paused_acting"
    h.submit("p", rid="r2", tokens=1100, at=5.0)
    return h.complete("r2", at=6.0, prompt=1100, cached=cached, completion=10)


def test_the_resume_hit_window_learns_only_from_reported_placement_starts() -> None:
    """docs/program-scheduling.md §4: one sample per placement start of a Program that ran before, with the backend's
    cached count; a continuation within the placement, or a start without a report, is none."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    _run_and_resume(h, cached=600)
    assert list(h.state.resume_hits.samples) == [(600, 1000)]
    h.submit("p", rid="r3", tokens=1200, at=6.5)  # TTL 0 paused it again: a placement start
    h.complete("r3", at=7.0, prompt=1200, cached=None, completion=10)
    assert list(h.state.resume_hits.samples) == [(600, 1000), (0, 1100)]  # 0: the rank reports
    h2 = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    h2.submit("p", rid="r1", tokens=1000, at=0.0)
    h2.complete("r1", at=1.0, prompt=1000, completion=10)  # this rank never reported cached tokens
    h2.submit("p", rid="r2", tokens=1100, at=5.0)
    h2.complete("r2", at=6.0, prompt=1100, completion=10)
    assert list(h2.state.resume_hits.samples) == []


def test_a_continuation_inside_an_acting_period_is_no_resume_sample() -> None:
    """r2 continues p within its placement (acting TTL 50 s): not a placement start, no sample;
    its cache held (1000 of 1000), so no discontinuity either."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    ttl = RequestHints(kv_retention_ttl_seconds=50.0)
    h.submit("p", rid="r1", tokens=1000, at=0.0, hints=ttl)
    h.complete("r1", at=1.0, prompt=1000, cached=0, completion=10)
    h.submit("p", rid="r2", tokens=1100, at=2.0, hints=ttl)
    eff = h.complete("r2", at=3.0, prompt=1100, cached=1000, completion=10)
    assert list(h.state.resume_hits.samples) == []
    assert of(eff, fx.CacheDiscontinuity) == []
    assert h.program("p").segment_served_rounds == 2


def test_a_broken_cache_at_a_placement_start_starts_a_new_segment() -> None:
    """docs/program-scheduling.md §2.2: r1's segment (started at 0 s, one round, sampled at its TTL pause) ends when r2
    comes back with 100 of its previous 1000 tokens cached (< 0.9): the new segment starts at r2's
    dispatch (5 s) and counts one served round, none sampled yet (r2 holds a 50 s TTL)."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    h.submit("p", rid="r1", tokens=1000, at=0.0)
    h.complete("r1", at=1.0, prompt=1000, cached=0, completion=10)
    p = h.program("p")
    assert (p.segment_served_rounds, p.ttl_pause_sampled_segment_rounds, p.segment_started_at) == (1, 1, 0.0)
    h.submit("p", rid="r2", tokens=1100, at=5.0, hints=RequestHints(kv_retention_ttl_seconds=50.0))
    h.complete("r2", at=6.0, prompt=1100, cached=100, completion=10)
    assert (p.segment_served_rounds, p.ttl_pause_sampled_segment_rounds, p.segment_started_at) == (1, 0, 5.0)


def test_an_unreported_cache_count_is_no_evidence_of_a_discontinuity() -> None:
    """A rank that never reported cached tokens: a continuation's cache use is estimated (the
    rank's mean, 0 here), which is not reported as a ``CacheDiscontinuity``."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    ttl = RequestHints(kv_retention_ttl_seconds=50.0)
    h.submit("p", rid="r1", tokens=1000, at=0.0, hints=ttl)
    h.complete("r1", at=1.0, prompt=1000, completion=10)
    h.submit("p", rid="r2", tokens=1100, at=2.0, hints=ttl)
    eff = h.complete("r2", at=3.0, prompt=1100, completion=10)
    assert of(eff, fx.CacheDiscontinuity) == []
    assert h.rank().factors.requests[-1].cached_prompt_tokens == 0


def test_a_usage_without_prompt_tokens_keeps_the_estimated_cache_hits() -> None:
    """A rank that reports cached tokens; a completion with no usage at all is not a full miss: its
    cached count is the rank's mean (500 of the earlier 1000), its prompt the dispatch's estimate."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    ttl = RequestHints(kv_retention_ttl_seconds=50.0)
    h.submit("p", rid="r1", tokens=1000, at=0.0, hints=ttl)
    h.complete("r1", at=1.0, prompt=1000, cached=500, completion=10)
    h.submit("p", rid="r2", tokens=1100, at=2.0, hints=ttl)
    h.complete("r2", at=3.0)
    last = h.rank().factors.requests[-1]
    assert (last.prompt_tokens, last.cached_prompt_tokens) == (1100, 500)


def test_a_previous_context_of_zero_tokens_gives_no_growth_sample() -> None:
    """Growth is sampled only against a positive previous context."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    ttl = RequestHints(kv_retention_ttl_seconds=50.0)
    h.submit("p", rid="r1", tokens=0, at=0.0, hints=ttl)
    h.complete("r1", at=1.0, prompt=0, cached=0, completion=10)
    h.submit("p", rid="r2", tokens=100, at=2.0, hints=ttl)
    h.complete("r2", at=3.0, prompt=100, cached=0, completion=10)
    assert [r.context_growth_tokens for r in h.rank().factors.requests] == [None, None]


def test_the_context_estimate_follows_reported_growth_and_unreported_dispatches() -> None:
    """A reported prompt at least the estimate replaces it and clears the shrink count; without a
    reported prompt, only a larger dispatch estimate raises it (never lowers it)."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    h.submit("p", rid="r1", tokens=1000, at=0.0)
    h.submit("p", rid="r2", tokens=1000, at=0.0)
    h.submit("p", rid="r3", tokens=1000, at=0.0)
    h.submit("p", rid="r4", tokens=500, at=0.0)
    p = h.program("p")
    h.complete("r1", at=1.0, prompt=400, completion=10)
    h.complete("r2", at=2.0, prompt=400, completion=10)  # the second confirmation: 400
    assert (p.estimated_context_tokens, p.context_shrink_observations) == (400, 0)
    h.complete("r3", at=3.0)  # no usage: its dispatch's 1000 is larger
    assert (p.estimated_context_tokens, p.context_shrink_observations) == (1000, 0)
    h.submit("p", rid="r5", tokens=300, at=3.5)
    h.complete("r4", at=4.0)  # no usage: 500 is smaller, nothing changes
    assert p.estimated_context_tokens == 1000
    h.complete("r5", at=5.0, prompt=900, completion=10)  # one shrink observation
    h.submit("p", rid="r6", tokens=100, at=5.5)
    h.complete("r6", at=6.0, prompt=1500, completion=10)  # grew past the estimate: 1500, count cleared
    assert (p.estimated_context_tokens, p.context_shrink_observations) == (1500, 0)
    h.submit("p", rid="r7", tokens=100, at=6.5)
    h.complete("r7", at=7.0, prompt=1200, completion=10)  # one observation again, not the second
    assert (p.estimated_context_tokens, p.context_shrink_observations) == (1500, 1)


def test_cap_at_fit_ignores_programs_waiting_in_another_model_pool() -> None:
    """contention = "cap_at_fit" looks at the completed Program's pool only: a Program queued in
    pool "other" does not cap read_file's TTL in the default pool."""
    tr = ToolRetentionConfig(min_samples=3, contention="cap_at_fit")
    h = Harness(token_capacity_per_dp_rank=PROMPT + 500, tool_retention=tr)
    h.feed(TargetsChanged("other", targets(1, "http://o")))
    for rid, program in (("o1", "x"), ("o2", "y")):
        h.feed(RequestSubmitted(RequestId(rid), Ident(program, program, program), PROMPT, model_pool="other"))
    assert h.state.programs[ProgramKey("other", "y")].state == "paused" and h.state.rank_queues
    t = _turns(h, "a", "read_file", 0.05, 4)
    h.submit("a", tokens=PROMPT, at=t, rid="a-x")
    eff = h.complete("a-x", at=t + 1, prompt=PROMPT, cached=0, completion=10, tool_names=("read_file",))
    (armed,) = of(eff, fx.TtlArmed)
    assert (armed.tool, armed.ttl_seconds) == ("read_file", pytest.approx(0.05 * 1.1 + 0.02))


def test_a_failed_request_without_a_cached_count_keeps_its_split_estimated() -> None:
    """docs/program-scheduling.md §14: only a successful usage without a cached count reads as a full
    miss on a rank that reports cached tokens; a failed request's split of its time stays an
    estimate."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    ttl = RequestHints(kv_retention_ttl_seconds=50.0)
    h.submit("p", rid="r1", tokens=1000, at=0.0, hints=ttl)
    h.complete("r1", at=1.0, prompt=1000, cached=500, completion=10)
    h.submit("p", rid="r2", tokens=1100, at=2.0, hints=ttl)
    (tm,) = of(h.complete("r2", at=3.0, success=False, prompt=1100, completion=5), fx.TimeAttributed)
    assert (tm.estimated_split, tm.cached_tokens, tm.new_tokens, tm.recomputed_tokens) == (True, 0, 0, 0)


def test_a_request_window_of_full_cache_hits_gives_the_warm_up_freshness() -> None:
    """docs/program-scheduling.md §2.2: the KV-turnover freshness divides by the mean uncached prompt; a full request
    window of full cache hits has none, so the warm-up (100 s) is used: q's first measurement,
    anchored at its creation (4 s), holds until 104 s."""
    h = Harness(n_targets=1, stats_window_size=2, token_capacity_per_dp_rank=100_000)
    for i in range(2):
        h.submit("p", rid=f"r{i}", tokens=1000, at=2.0 * i)
        h.complete(f"r{i}", at=2.0 * i + 1, prompt=1000, cached=1000, completion=10)
    assert h.rank().factors.request_window_complete and h.rank().factors.mean_uncached_prompt_tokens() == 0
    h.submit("q", rid="q1", tokens=1000, at=4.0, hints=RequestHints(kv_retention_ttl_seconds=50.0))
    h.complete("q1", at=5.0, prompt=1000, cached=0, completion=10)
    assert h.program("q").shared_prefix_fresh_until == 104.0


def test_the_miss_impact_counts_only_the_prompt_beyond_the_shared_prefix() -> None:
    """docs/program-scheduling.md §2.2: r1's placement start measured a shared prefix of 400 tokens; r2's cache-miss
    impact prices its 1100-token prompt minus those 400."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    ttl = RequestHints(kv_retention_ttl_seconds=50.0)
    h.submit("p", rid="r1", tokens=1000, at=0.0, hints=ttl)
    h.complete("r1", at=1.0, prompt=1000, cached=400, completion=10)
    assert h.program("p").shared_prefix_tokens == 400
    h.submit("p", rid="r2", tokens=1100, at=2.0, hints=ttl)
    (obs,) = of(h.complete("r2", at=3.0, prompt=1100, cached=1000, completion=10), fx.CacheMissImpactObserved)
    assert obs.seconds == cache_miss_impact_seconds(700, h.cfg.prefill_cost_model)
    assert h.program("p").last_cache_miss_impact_seconds == obs.seconds


def test_nine_tenths_of_the_previous_context_cached_is_continuous() -> None:
    """``CACHE_CONTINUITY_HIT_RATIO`` (0.9) is inclusive: 900 of 1000 cached is no discontinuity
    and counts as a continuous round; 899 is one."""
    for cached, broken in ((900, False), (899, True)):
        h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
        ttl = RequestHints(kv_retention_ttl_seconds=50.0)
        h.submit("p", rid="r1", tokens=1000, at=0.0, hints=ttl)
        h.complete("r1", at=1.0, prompt=1000, cached=0, completion=10)
        h.submit("p", rid="r2", tokens=1100, at=2.0, hints=ttl)
        eff = h.complete("r2", at=3.0, prompt=1100, cached=cached, completion=10)
        found = [(e.cached_prompt_tokens, e.uncached_prompt_tokens) for e in of(eff, fx.CacheDiscontinuity)]
        assert found == ([(cached, 1100 - cached)] if broken else [])
        assert h.program("p").rounds_since_activation == (1 if broken else 2)


def test_a_stale_shared_prefix_is_measured_again_at_the_next_break() -> None:
    """docs/program-scheduling.md §2.2: the first measurement (0 tokens at 1 s) is fresh for the warm-up (100 s, its
    anchor moving with each pause); p comes back at 200 s with 300 of 1000 tokens cached, a new
    segment whose start measures the shared prefix again."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    h.submit("p", rid="r1", tokens=1000, at=0.0)
    h.complete("r1", at=1.0, prompt=1000, cached=0, completion=10)
    p = h.program("p")
    assert (p.shared_prefix_tokens, p.shared_prefix_fresh_until) == (0, 101.0)
    h.submit("p", rid="r2", tokens=1100, at=200.0)
    eff = h.complete("r2", at=201.0, prompt=1100, cached=300, completion=10)
    assert [e.tokens for e in of(eff, fx.SharedPrefixObserved)] == [300]
    assert p.shared_prefix_tokens == 300


def test_a_request_window_of_instant_requests_gives_the_warm_up_freshness() -> None:
    """A full request window whose requests took 0 s end to end: no KV-turnover estimate (it
    would divide by 0), the warm-up (100 s) instead: q's measurement holds until 102 + 100 s."""
    h = Harness(n_targets=1, stats_window_size=2, token_capacity_per_dp_rank=100_000)
    for i in range(2):
        h.submit("p", rid=f"r{i}", tokens=1000, at=float(i))
        h.complete(f"r{i}", at=float(i), prompt=1000, cached=0, completion=10)
    assert h.rank().factors.request_window_complete and h.rank().factors.mean_e2e_seconds() == 0.0
    h.submit("q", rid="q1", tokens=1000, at=2.0, hints=RequestHints(kv_retention_ttl_seconds=50.0))
    h.complete("q1", at=3.0, prompt=1000, cached=0, completion=10)
    assert h.program("q").shared_prefix_fresh_until == 102.0


def test_the_request_sample_fields_at_their_boundaries() -> None:
    """Growth is sampled only for 0 < growth < previous context (0, 1 and the previous context
    itself: none, 1, none); e2e counts from the arrival; a rank's first unreported cached count is
    0, and a later missing one on a reporting rank is 0 too (not the rank's mean)."""
    h = Harness(n_targets=1, token_capacity_per_dp_rank=100_000)
    ttl = RequestHints(kv_retention_ttl_seconds=50.0)
    prompts = (1000, 1000, 1001, 2002)
    for i, prompt in enumerate(prompts):
        h.submit("p", rid=f"r{i}", tokens=prompt, at=10.0 * i, hints=ttl)
        h.complete(f"r{i}", at=10.0 * i + 3.0, prompt=prompt, cached=None if i == 0 else 500, completion=10)
    h.submit("p", rid="r4", tokens=2100, at=40.0, hints=ttl)
    h.complete("r4", at=41.5, prompt=2100, completion=10)  # the rank reports: a missing count is 0
    samples = h.rank().factors.requests
    assert [r.context_growth_tokens for r in samples] == [None, None, 1, None, 98]
    assert [r.e2e_seconds for r in samples] == [3.0, 3.0, 3.0, 3.0, 1.5]
    assert [r.cached_prompt_tokens for r in samples] == [0, 500, 500, 500, 0]
