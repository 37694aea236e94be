"""Scheduler core: the basic request lifecycle (docs/program-scheduling.md §1)."""

from __future__ import annotations

import pytest
from core_support import Harness, Ident, admitted, of, reasons, tid

from actors.core import effects as fx
from actors.core.errors import InvalidEvent
from actors.core.events import PAUSED_RETENTION, RequestSubmitted
from actors.core.ids import RequestId
from actors.core.invariants import check


def test_core_first_program_admitted_as_placement_start() -> None:
    h = Harness()
    eff = h.submit("a", tokens=100)
    assert isinstance(eff[0], fx.SpawnProgram)
    (adm,) = of(eff, fx.Admit)
    assert adm.request_id == "r1" and adm.target_id == tid(0)
    assert adm.placement_start_request is True and adm.generation == 0
    assert reasons(eff) == ["program_admit"]
    p = h.program("a")
    assert (p.state, p.status, p.in_flight) == ("active", "reasoning", 1)
    # private tokens: 100 context + 100 decode buffer
    assert h.rank().fallback_tokens == 200.0
    assert check(h.state, h.cfg) == []


def test_core_warmup_completion_pauses_immediately_with_zero_ttl() -> None:
    h = Harness()
    h.submit("a", tokens=100)
    eff = h.complete("r1", at=2.0, prompt=150, completion=30)
    (armed,) = of(eff, fx.TtlArmed)
    assert armed.ttl_seconds == 0.0 and armed.source == "fitted"
    assert reasons(eff) == ["ttl_expired"]
    p = h.program("a")
    assert (p.state, p.status, p.last_pause_reason) == ("paused", "acting", "ttl_expired")
    assert h.rank().fallback_tokens == 0.0
    arm = of(eff, fx.ArmTimer)
    assert [(a.kind, a.deadline) for a in arm] == [(PAUSED_RETENTION, 2.0 + 1800.0)]
    assert check(h.state, h.cfg) == []


def test_core_consecutive_request_keeps_epoch_and_is_not_placement_start() -> None:
    h = Harness()
    first = of(h.submit("a"), fx.Admit)[0]
    second = of(h.submit("a", at=0.5), fx.Admit)[0]
    assert second.placement_epoch == first.placement_epoch
    assert second.placement_start_request is False
    assert h.program("a").in_flight == 2


def test_core_terminal_completion_releases_occupancy() -> None:
    h = Harness()
    h.submit("a")
    eff = h.complete("r1", at=1.0, prompt=100, terminate=True)
    assert [e.program.program_id for e in of(eff, fx.RetireProgram)] == ["a"]
    assert h.program("a") is None
    assert h.rank().fallback_tokens == 0.0
    assert check(h.state, h.cfg) == []


def test_core_new_generation_after_release_and_stale_completion_is_fenced() -> None:
    h = Harness()
    h.submit("a")
    h.submit("a", at=0.1)  # r2 in flight too
    h.complete("r1", at=1.0, prompt=100, terminate=True)  # terminate marks; r2 still in flight
    assert h.program("a") is not None
    h.complete("r2", at=2.0, prompt=100)  # idle now -> released
    assert h.program("a") is None
    eff = h.submit("a", at=3.0)
    assert of(eff, fx.SpawnProgram)[0].program.generation == 1
    # a completion of the old generation is ignored
    eff = h.complete("r1", at=4.0)
    assert of(eff, fx.CompletionIgnored)[0].reason == "unknown_request"
    assert h.program("a").in_flight == 1


def test_core_cancel_unstarted_request_removes_transient_program() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a")
    eff = h.submit("b", at=1.0)
    assert admitted(eff) == []
    assert h.program("b").state == "paused"
    eff = h.abandon("r2", at=2.0)
    assert h.program("b") is None
    assert of(eff, fx.RetireProgram)[0].program.program_id == "b"
    assert len(h.state.pool) == 0
    assert check(h.state, h.cfg) == []


def test_core_duplicate_live_request_id_is_invalid() -> None:
    h = Harness()
    h.submit("a", rid="x")
    with pytest.raises(InvalidEvent, match="request_id"):
        h.feed(RequestSubmitted(RequestId("x"), Ident("b"), 10))


def test_core_no_targets_rejects_with_503_and_retains_nothing() -> None:
    h = Harness(n_targets=0)
    eff = h.submit("a")
    (rej,) = of(eff, fx.Reject)
    assert (rej.reason, rej.status_hint) == ("no_targets", 503)
    assert len(h.state.pool) == 0 and not h.state.programs


def test_core_a_negative_prompt_estimate_is_invalid_and_creates_nothing() -> None:
    """``estimated_prompt_tokens < 0`` is an ``InvalidEvent`` raised before any Program or request exists."""
    h = Harness()
    with pytest.raises(InvalidEvent, match="estimated_prompt_tokens must be >= 0"):
        h.feed(RequestSubmitted(RequestId("x"), Ident("b"), -1))
    assert not h.state.programs and len(h.state.pool) == 0
