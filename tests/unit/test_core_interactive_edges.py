"""Scheduler core, interactive class: edges the mutation campaign found untested (docs/priority.md §2)."""

from __future__ import annotations

import pytest
from core_support import POOL, Harness, admitted, of, targets

from actors.core import effects as fx
from actors.core.config import BatchJobsConfig, ClassLimits, PriorityConfig
from actors.core.errors import InvalidEvent
from actors.core.events import BatchSubmitted, InteractiveSubmitted, RequestAbandoned, TargetsChanged
from actors.core.ids import RequestId
from actors.core.invariants import check
from actors.core.model import RequestHints

BATCH = BatchJobsConfig(enabled=True, guaranteed_kv_share=0.0)


def interactive(h: Harness, rid: str, tokens: int, *, at: float | None = None, **kw: object) -> tuple[object, ...]:
    return h.feed(InteractiveSubmitted(RequestId(rid), tokens, **kw), at)  # type: ignore[arg-type]


def admitted_interactive(effects: tuple[object, ...]) -> list[str]:
    return [e.request_id for e in of(effects, fx.AdmitInteractive)]


def batch(h: Harness, rid: str, prompt: int, max_tokens: int, *, preemptible: bool, at: float) -> None:
    h.feed(BatchSubmitted(RequestId(rid), "job", prompt, max_tokens=max_tokens, preemptible=preemptible), at)


def test_an_interactive_request_with_no_prompt_tokens_is_accepted() -> None:
    """``estimated_prompt_tokens`` 0 is valid (only negative counts are refused)."""
    h = Harness(token_capacity_per_dp_rank=1000)
    assert admitted_interactive(interactive(h, "i0", 0, max_tokens=10)) == ["i0"]
    with pytest.raises(InvalidEvent, match="estimated_prompt_tokens"):
        interactive(h, "i1", -1)


def test_an_idle_rank_takes_an_interactive_request_larger_than_its_capacity() -> None:
    """A rank running nothing takes an interactive request of any size (the KV-share cap needs one running)."""
    h = Harness(token_capacity_per_dp_rank=1000)
    (adm,) = of(interactive(h, "huge", 1_100, max_tokens=100), fx.AdmitInteractive)
    assert (adm.request_id, adm.charged_tokens) == ("huge", 1_200)


def test_the_interactive_kv_share_counts_the_new_requests_tokens() -> None:
    """``interactive.max_kv_share`` admits a request only while the class's tokens plus its own fit the share."""
    prio = PriorityConfig(interactive=ClassLimits(max_kv_share=0.5))
    h = Harness(token_capacity_per_dp_rank=1000, priority=prio)
    assert admitted_interactive(interactive(h, "i1", 300, max_tokens=100)) == ["i1"]  # 400
    assert admitted_interactive(interactive(h, "i2", 100, max_tokens=100)) == []  # 400 + 200 > 500
    assert admitted_interactive(interactive(h, "i3", 50, max_tokens=50)) == ["i3"]  # 400 + 100 <= 500


def test_room_is_made_by_preempting_only_as_many_batch_requests_as_needed() -> None:
    """Making room stops as soon as the request fits, free tokens exactly equal to its need included."""
    h = Harness(token_capacity_per_dp_rank=1000, batch=BATCH)
    batch(h, "b0", 300, 100, preemptible=True, at=0.0)
    batch(h, "b1", 300, 100, preemptible=True, at=1.0)  # 800 held by batch, 200 free
    eff = interactive(h, "i1", 500, max_tokens=100, at=2.0)  # 600: exactly 200 + the youngest's 400
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["b1"]
    assert admitted_interactive(eff) == ["i1"]
    assert h.state.interactive.batch_preemptions == 1
    assert check(h.state, h.cfg) == []


def _program_on_rank_1_batch_on_rank_0(h: Harness) -> None:
    """Program ``a`` reasons on rank 1 (600 tokens); rank 0 runs the restartable ``b0`` (400) and
    the non-restartable ``b1`` (100)."""
    h.submit("a", 500)
    assert h.program("a").placement == h.rank(1).target_id
    batch(h, "b0", 300, 100, preemptible=True, at=0.0)
    batch(h, "b1", 50, 50, preemptible=False, at=0.0)
    assert (h.rank(0).batch_tokens, h.rank(0).batch_requests) == (500.0, 2)


def test_the_rank_where_room_can_be_made_now_is_preferred_to_one_with_more_room_later() -> None:
    """A rank where preempting batch makes the request fit now wins over one where busy Programs would free more."""
    h = Harness(token_capacity_per_dp_rank=1000, n_targets=2, batch=BATCH)
    _program_on_rank_1_batch_on_rank_0(h)
    # 700: rank 0 has 500 free + 400 restartable; rank 1 has 400 free + a busy Program of 600
    eff = interactive(h, "i1", 600, max_tokens=100, at=1.0)
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["b0"]
    assert [e.target_id for e in of(eff, fx.AdmitInteractive)] == [h.rank(0).target_id]
    assert not h.program("a").pause_when_idle
    assert check(h.state, h.cfg) == []


def test_a_request_that_fits_nowhere_claims_the_rank_with_the_most_room_to_come() -> None:
    """Without room anywhere, the claim goes to the rank with the most free plus restartable tokens;
    with ``interactive_pauses_agents`` off, unmarked busy Programs are no room."""
    h = Harness(
        token_capacity_per_dp_rank=1000,
        n_targets=2,
        batch=BATCH,
        priority=PriorityConfig(interactive_pauses_agents=False),
    )
    _program_on_rank_1_batch_on_rank_0(h)
    # 950: rank 0 would have 500 + 400 = 900, rank 1 only its 400 free
    eff = interactive(h, "i1", 850, max_tokens=100, at=1.0)
    assert admitted_interactive(eff) == [] and of(eff, fx.PreemptBatch) == []
    assert (h.rank(0).interactive_claim_tokens, h.rank(1).interactive_claim_tokens) == (950, 0)


def test_abandoning_a_claiming_interactive_request_admits_the_program_it_held_back() -> None:
    """A waiting interactive request's client leaves: its claim goes, a Program that fits is admitted at once."""
    h = Harness(token_capacity_per_dp_rank=1000)
    assert admitted(h.submit("a", 500)) == ["r1"]  # 600
    assert admitted_interactive(interactive(h, "i1", 700, max_tokens=100, at=1.0)) == []  # claims 800
    assert h.rank().interactive_claim_tokens == 800
    assert admitted(h.submit("b", 200, at=2.0)) == []  # 300 fits the 400 free, but not beside the claim
    eff = h.feed(RequestAbandoned(RequestId("i1")), at=3.0)
    assert admitted(eff) == ["r2"]
    assert h.rank().interactive_claim_tokens == 0


def test_an_interactive_request_ending_after_its_rank_left_and_came_back_releases_nothing() -> None:
    """A running interactive request whose rank left the topology is off every ledger, the rank's new one too."""
    h = Harness(token_capacity_per_dp_rank=1000)
    interactive(h, "i1", 300, max_tokens=100)
    h.feed(TargetsChanged(POOL, ()), at=1.0)
    h.feed(TargetsChanged(POOL, targets(1)), at=2.0)
    h.complete("i1", at=3.0, completion=10)
    assert (h.rank().interactive_tokens, h.rank().interactive_requests) == (0.0, 0)
    assert check(h.state, h.cfg) == []


def test_without_headroom_cap_or_reservation_a_batch_prefill_is_not_preempted() -> None:
    """With neither headroom rule configured, an interactive dispatch leaves a batch request in its prefill alone."""
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH)
    batch(h, "young", 2000, 10, preemptible=True, at=0.9)  # about 0.2 s of prefill: still in it at 1.0
    eff = interactive(h, "i1", 2000, max_tokens=10, at=1.0)
    assert of(eff, fx.PreemptBatch) == [] and admitted_interactive(eff) == ["i1"]
    assert h.rank().batch_requests == 1


def test_a_pool_whose_reserved_rank_left_keeps_the_headroom_cap() -> None:
    """While no rank of the pool is reserved (its reserved rank left), its ranks run batch under the headroom cap."""
    prio = PriorityConfig(
        batch_max_running_near_interactive=1, interactive_window_seconds=5.0, interactive_reserved_ranks=1
    )
    h = Harness(token_capacity_per_dp_rank=100_000, n_targets=3, batch=BATCH, priority=prio)
    interactive(h, "i1", 100, max_tokens=10, at=0.0)
    assert h.state.interactive.reserved[POOL] == (h.rank(0).target_id,)
    h.feed(TargetsChanged(POOL, targets(3)[1:]), 0.5)  # rank 0 leaves
    for i in range(3):
        batch(h, f"b{i}", 100, 10, preemptible=False, at=0.6)
    assert (h.rank(1).batch_requests, h.rank(2).batch_requests) == (1, 1)
    assert len(h.state.batch.pending) == 1  # type: ignore[union-attr]


def test_abandoning_a_running_interactive_request_releases_its_charge() -> None:
    """The client of a running interactive request leaves: its charge leaves the rank's ledger."""
    h = Harness(token_capacity_per_dp_rank=1000)
    assert admitted_interactive(interactive(h, "i1", 300, max_tokens=100)) == ["i1"]
    h.feed(RequestAbandoned(RequestId("i1")), at=1.0)
    assert (h.rank().interactive_tokens, h.rank().interactive_requests) == (0.0, 0)
    assert "i1" not in h.state.interactive.running


def test_an_interactive_request_for_a_pool_without_targets_is_refused_with_503() -> None:
    """An interactive request whose model pool has no target is answered 503 at once."""
    h = Harness(token_capacity_per_dp_rank=1000)
    (rej,) = of(interactive(h, "i1", 100, model_pool="other"), fx.Reject)
    assert (rej.request_id, rej.status_hint) == ("i1", 503)
    assert h.state.interactive.pending == {}


def test_a_waiting_interactive_request_is_refused_with_503_when_its_pool_loses_every_target() -> None:
    """The pool's last target leaves: its waiting interactive requests get a 503 (retryable), not a wait."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", 500)
    assert admitted_interactive(interactive(h, "i1", 700, max_tokens=100, at=1.0)) == []  # waits, claims
    (rej,) = of(h.feed(TargetsChanged(POOL, ()), at=2.0), fx.Reject)
    assert (rej.request_id, rej.status_hint) == ("i1", 503)
    assert h.state.interactive.pending == {}


def test_queue_timeouts_are_counted() -> None:
    """Each waiting interactive request rejected at its queue deadline counts in ``rejected_count``."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", 500)
    interactive(h, "i1", 700, max_tokens=100, at=1.0, deadline_seconds=2.0, tenant="t")
    (rej,) = of(h.tick(at=3.0), fx.Reject)
    assert rej.request_id == "i1" and h.state.interactive.rejected_count == 1
    assert (h.state.fair.accounts["t"].dispatched, h.state.fair.accounts["t"].waiting) == (0, 0)


def test_the_claim_goes_where_busy_programs_marked_to_pause_free_the_most() -> None:
    """Without room anywhere, busy Programs that can be marked to pause count as room to come on their rank."""
    h = Harness(token_capacity_per_dp_rank=1000, n_targets=2, batch=BATCH)
    _program_on_rank_1_batch_on_rank_0(h)
    # 950: rank 0 would have 500 + 400 = 900; rank 1 400 free + the busy Program's 600 = 1000
    eff = interactive(h, "i1", 850, max_tokens=100, at=1.0)
    assert admitted_interactive(eff) == [] and of(eff, fx.PreemptBatch) == []
    assert (h.rank(0).interactive_claim_tokens, h.rank(1).interactive_claim_tokens) == (0, 950)
    assert h.program("a").pause_when_idle


def test_without_a_known_capacity_interactive_requests_go_at_once_to_the_least_busy_rank() -> None:
    """With no configured nor reported capacity an interactive request goes at once to the rank running the fewest."""
    h = Harness(n_targets=2)
    assert [e.target_id for e in of(interactive(h, "i1", 100), fx.AdmitInteractive)] == [h.rank(0).target_id]
    assert [e.target_id for e in of(interactive(h, "i2", 100), fx.AdmitInteractive)] == [h.rank(1).target_id]


def test_room_is_made_by_pausing_only_as_many_idle_programs_as_needed() -> None:
    """Pausing idle Programs stops as soon as the request fits, free tokens exactly equal to its need included."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", 400, hints=RequestHints(kv_retention_ttl_seconds=60.0))
    h.submit("b", 300, hints=RequestHints(kv_retention_ttl_seconds=60.0))
    h.complete("r1", at=1.0, prompt=400)
    h.complete("r2", at=1.0, prompt=300)  # both acting: 500 + 400 held, 100 free
    eff = interactive(h, "i1", 500, max_tokens=100, at=2.0)  # 600: exactly 100 + a's 500
    assert admitted_interactive(eff) == ["i1"]
    assert (h.program("a").state, h.program("b").state) == ("paused", "active")
    assert h.state.interactive.program_pauses == 1


def test_an_interactive_admission_reports_the_tokens_used_on_its_rank_before_it() -> None:
    """``AdmitInteractive.used_tokens`` is the rank's used tokens (claims included) before the request's charge."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", 500)  # 600
    (adm,) = of(interactive(h, "i1", 100, max_tokens=100, at=1.0), fx.AdmitInteractive)
    assert (adm.used_tokens, adm.charged_tokens) == (600.0, 200)


def test_a_pool_shrunk_to_its_reserved_rank_count_has_no_reserved_rank() -> None:
    """Batch keeps at least one rank: when the pool shrinks to ``interactive_reserved_ranks`` ranks none is reserved."""
    prio = PriorityConfig(interactive_window_seconds=5.0, interactive_reserved_ranks=1)
    h = Harness(token_capacity_per_dp_rank=100_000, n_targets=2, batch=BATCH, priority=prio)
    interactive(h, "i1", 100, max_tokens=10, at=0.0)
    assert h.state.interactive.reserved[POOL] == (h.rank(0).target_id,)
    h.feed(TargetsChanged(POOL, targets(1)), 0.5)  # rank 1 leaves: rank 0, the reserved one, is all there is
    batch(h, "b0", 100, 10, preemptible=False, at=1.0)
    assert h.rank(0).batch_requests == 1


def test_interactive_above_batch_does_not_leave_batch_its_guaranteed_share() -> None:
    """Interactive work above batch in ``class_order`` may take the share backlogged batch work claims."""
    h = Harness(token_capacity_per_dp_rank=10_000, batch=BatchJobsConfig(enabled=True, guaranteed_kv_share=0.5))
    h.submit("a", 8_000)  # 8100
    h.feed(BatchSubmitted(RequestId("q"), "job", 3_000), 1.0)  # waits: 3128 over the budget
    assert h.rank().batch_claim_tokens == 5_000.0
    assert admitted_interactive(interactive(h, "i1", 900, max_tokens=100, at=2.0)) == ["i1"]  # 1000 of 1900 free


def test_the_headroom_cap_holds_for_the_window_after_the_latest_interactive_arrival() -> None:
    """The headroom cap lasts ``interactive_window_seconds`` from the latest interactive arrival, whenever it came."""
    prio = PriorityConfig(batch_max_running_near_interactive=1, interactive_window_seconds=5.0)
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH, priority=prio)
    interactive(h, "i1", 100, max_tokens=10, at=10.0)
    h.complete("i1", at=10.5)
    for i in range(3):
        batch(h, f"b{i}", 100, 10, preemptible=False, at=12.0)
    assert h.rank().batch_requests == 1


def test_a_reservation_lasts_the_window_after_the_latest_interactive_arrival() -> None:
    """A rank stays reserved for ``interactive_window_seconds`` from the pool's latest interactive arrival."""
    prio = PriorityConfig(interactive_window_seconds=5.0, interactive_reserved_ranks=1)
    h = Harness(token_capacity_per_dp_rank=100_000, n_targets=2, batch=BATCH, priority=prio)
    interactive(h, "i1", 100, max_tokens=10, at=10.0)
    h.complete("i1", at=10.5)
    for i in range(2):
        batch(h, f"b{i}", 100, 10, preemptible=False, at=12.0)
    assert (h.rank(0).batch_requests, h.rank(1).batch_requests) == (0, 2)


def test_a_batch_request_is_in_its_prefill_for_its_estimate_plus_one_decode_step() -> None:
    """A batch request counts as prefilling for its cold-prefill estimate plus one decode step after dispatch."""
    prio = PriorityConfig(batch_max_running_near_interactive=4, interactive_window_seconds=5.0)
    h = Harness(token_capacity_per_dp_rank=100_000, batch=BATCH, priority=prio)
    batch(h, "young", 2000, 10, preemptible=True, at=0.8)
    eff = interactive(h, "i1", 100, max_tokens=10, at=1.0)  # 0.2 s after: 0.198 s of prefill + a 0.011 s step
    assert [e.request_id for e in of(eff, fx.PreemptBatch)] == ["young"]


def test_marking_busy_programs_stops_once_the_room_to_come_suffices() -> None:
    """Only as many busy Programs are marked to pause as the request needs, the largest first."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", 300)  # 400
    h.submit("b", 200)  # 300: both reasoning, 300 free
    assert admitted_interactive(interactive(h, "i1", 550, max_tokens=100, at=1.0)) == []  # 650
    assert (h.program("a").pause_when_idle, h.program("b").pause_when_idle) == (True, False)


def test_idle_programs_are_paused_lowest_priority_first_whatever_their_arrival() -> None:
    """Idle Programs are paused for an interactive request lowest priority first, not in their arrival order."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("b", 300, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=5))
    h.submit("a", 400, hints=RequestHints(kv_retention_ttl_seconds=60.0, priority=0))
    h.complete("r1", at=1.0, prompt=300)
    h.complete("r2", at=1.0, prompt=400)
    assert admitted_interactive(interactive(h, "i1", 400, at=2.0)) == ["i1"]
    assert (h.program("a").state, h.program("b").state) == ("paused", "active")


def test_an_interactive_charge_counts_on_a_rank_with_a_fresh_observation() -> None:
    """An interactive request dispatched after an observation is used tokens on the ledger until the next one."""
    h = Harness(token_capacity_per_dp_rank=1000)
    h.observe(0, 0.0, 0, 0, at=0.0)
    interactive(h, "i1", 500, max_tokens=100, at=0.5)  # 600
    assert admitted(h.submit("a", 400, at=0.6)) == []  # 500 does not fit the 400 left


def test_interactive_fits_below_the_low_watermark() -> None:
    """Interactive work fits into ``capacity x low_watermark_ratio - used``."""
    h = Harness(token_capacity_per_dp_rank=1000, low_watermark_ratio=0.8)
    h.submit("a", 100)  # 200: 600 left below the watermark
    assert admitted_interactive(interactive(h, "i1", 600, max_tokens=100, at=1.0)) == []  # 700
    assert admitted_interactive(interactive(h, "i2", 500, max_tokens=100, at=1.0)) == []  # behind i1's claim
