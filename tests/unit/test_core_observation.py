"""Backend observations, ledger accounting and the diagnostics snapshot (docs/program-scheduling.md §2;
the document's fields are listed in docs/operations.md)."""

from __future__ import annotations

import json

import attrs
import pytest
from core_support import POOL, Harness, of, targets, tid

from actors.core import effects as fx
from actors.core.events import ObservationReceived, ObservationStale, ObservationStarted, TargetsChanged
from actors.core.invariants import check
from actors.core.ledger import target_usage
from actors.core.model import RequestHints
from actors.core.snapshot import diagnostics_document, snapshot


def test_core_observation_epoch_preserves_router_delta_committed_during_scrape() -> None:
    h = Harness(token_capacity_per_dp_rank=1000, decode_buffer_tokens=50)
    h.feed(ObservationStarted(tid(0), 1), at=0.0)
    h.submit("a", tokens=0, at=0.1)  # admitted while the scrape is in flight: +50
    h.feed(ObservationReceived(tid(0), 1, 0.5, 0, 0), at=0.2)
    # native 0.5 * 1000 = 500 (no running, no active reasoning at the checkpoint) + delta 50
    assert target_usage(h.rank(), 0.2, 1.0) == 550.0
    snap = snapshot(h.state, h.cfg, 0.2).ranks[0]
    assert snap.router_estimated_used_tokens == 550
    assert snap.vllm_usage_scaled_tokens == 500
    assert snap.router_minus_vllm_used_tokens == 50
    assert snap.capacity_accounting_source == "backend_observation"


def test_core_observation_scales_running_reasoning_and_adds_acting_tokens() -> None:
    h = Harness(token_capacity_per_dp_rank=10_000)
    h.submit("a", tokens=900)  # reasoning, 1000 private
    h.submit("b", tokens=400, hints=RequestHints(kv_retention_ttl_seconds=100.0))
    h.complete("r2", at=0.5, prompt=400)  # acting, 500 private
    h.feed(ObservationStarted(tid(0), 7), at=1.0)
    h.feed(ObservationReceived(tid(0), 7, 0.1, 1, 0), at=1.1)
    # native = 1000; running 1, router reasoning 1 -> 1000 * max(1, 1) / 1 = 1000; + acting 500
    assert h.rank().estimated_active_program_tokens == 1500.0
    assert target_usage(h.rank(), 1.1, 1.0) == 1500.0


def test_core_stale_epoch_cannot_restore_removed_target_or_cross_readd() -> None:
    h = Harness(n_targets=2, token_capacity_per_dp_rank=1000)
    h.feed(ObservationStarted(tid(1), 1), at=0.0)
    h.feed(TargetsChanged(POOL, targets(2)[:1]), at=0.1)  # remove rank 1
    eff = h.feed(ObservationReceived(tid(1), 1, 0.5, 1, 0), at=0.2)
    assert of(eff, fx.StaleObservationDropped) and tid(1) not in h.state.ranks
    h.feed(TargetsChanged(POOL, targets(2)), at=0.3)  # re-add
    h.feed(ObservationStarted(tid(0), 2), at=0.4)
    h.feed(TargetsChanged(POOL, targets(2)[:1]), at=0.5)
    h.feed(TargetsChanged(POOL, targets(2)), at=0.6)
    eff = h.feed(ObservationReceived(tid(0), 2, 0.5, 1, 0), at=0.7)
    (drop,) = of(eff, fx.StaleObservationDropped)
    assert drop.epoch_revision < drop.current_revision
    assert h.rank(0).observed_at is None


def test_core_accounting_sources_missing_fresh_stale_and_no_capacity() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    r = snapshot(h.state, h.cfg, 0.0).ranks[0]
    assert (r.observation_fresh, r.capacity_accounting_source) == (False, "router_ledger_missing_observation")
    assert r.observed_router_active_reasoning_programs == 0
    h.observe(0, 0.2, 0, 0, at=1.0)
    r = snapshot(h.state, h.cfg, 1.0).ranks[0]
    assert (r.observation_fresh, r.capacity_accounting_source) == (True, "backend_observation")
    r = snapshot(h.state, h.cfg, 5.0).ranks[0]  # 4 s old, interval 1 s
    assert (r.observation_fresh, r.capacity_accounting_source) == (False, "router_ledger_stale_observation")
    h2 = Harness()
    h2.observe(0, 0.2, 0, 0, at=1.0)
    assert snapshot(h2.state, h2.cfg, 1.0).ranks[0].capacity_accounting_source == "router_ledger_missing_token_estimate"


def test_core_capacity_source_transition_reported_once() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    (first,) = of(h.tick(at=1.0), fx.CapacitySourceChanged)
    assert (first.previous_source, first.source) == (None, "router_ledger_missing_observation")
    assert first.freshness_threshold_seconds == 3.0
    assert of(h.tick(at=2.0), fx.CapacitySourceChanged) == []
    h.observe(0, 0.1, 0, 0, at=2.5)
    (rec,) = of(h.tick(at=3.0), fx.CapacitySourceChanged)
    assert (rec.previous_source, rec.source, rec.observation_age_seconds) == (
        "router_ledger_missing_observation",
        "backend_observation",
        0.5,
    )
    h.feed(ObservationStale(tid(0)), at=3.5)
    (back,) = of(h.tick(at=4.0), fx.CapacitySourceChanged)
    assert back.source == "router_ledger_missing_observation"


def test_core_first_report_of_backend_source_is_silent() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    h.observe(0, 0.1, 0, 0, at=0.5)
    assert of(h.tick(at=1.0), fx.CapacitySourceChanged) == []


def test_core_snapshot_exposes_program_and_rank_facts() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a", tokens=100, hints=RequestHints(request_id="req-1", priority=9))
    h.submit(
        "b",
        tokens=50,
        at=1.0,
        hints=RequestHints(request_id="req-2", priority=3, deadline_seconds=12.5, expected_output_length=2048),
    )
    doc = diagnostics_document(snapshot(h.state, h.cfg, 2.0))
    json.dumps(doc)  # JSON ready
    assert isinstance(doc["ranks"], list) and isinstance(doc["ranks"][0]["programs"], list)
    assert doc["retained_requests"] == 1
    rank = doc["ranks"][0]
    assert rank["router_active_programs"] == 1 and rank["router_queued_programs"] == 1
    assert rank["router_queued_requests"] == 1 and rank["router_in_flight_requests"] == 1
    progs = {p["state"]: p for p in rank["programs"]}
    b = progs["paused"]
    assert (b["request_id"], b["request_priority"], b["request_deadline_seconds"]) == ("req-2", 3, 12.5)
    assert b["expected_output_tokens"] == 2048
    assert b["queued_seconds"] == 1.0
    assert b["force_resume_remaining_seconds"] == 11.5  # deadline hint 12.5 from 1.0
    assert b["private_tokens"] == 50 + 2048 and b["logical_tokens"] == 150
    assert b["program"] != "b" and len(b["program"]) == 16
    assert progs["active"]["placement"] == tid(0)
    assert check(h.state, h.cfg) == []


def test_core_snapshot_is_frozen_and_keeps_its_instant() -> None:
    h = Harness(max_active_programs_per_target=1)
    h.submit("a", tokens=100)
    h.submit("b", tokens=50, at=1.0)  # waits behind a
    snap = snapshot(h.state, h.cfg, 1.0)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        snap.ranks[0].queue_size = 0  # type: ignore[misc]
    h.complete("r1", at=2.0, prompt=100)  # a pauses (TTL 0), b is admitted
    rank = snap.ranks[0]
    assert (rank.queue_size, rank.active_programs, rank.router_queued_programs) == (1, 1, 1)
    assert sorted(p.state for p in rank.programs) == ["active", "paused"]
    now = snapshot(h.state, h.cfg, 2.0).ranks[0]
    assert (now.queue_size, now.active_programs, now.request_samples) == (0, 1, 1)


def test_core_gauge_values_and_document_agree() -> None:
    h = Harness(token_capacity_per_dp_rank=1000)
    h.submit("a", tokens=200, hints=RequestHints(kv_retention_ttl_seconds=5.0))
    h.complete("r1", at=1.0, prompt=220, cached=0)
    h.observe(0, 0.3, 1, 0, at=1.5)
    snap = snapshot(h.state, h.cfg, 2.0)
    rank = snap.ranks[0]
    doc = diagnostics_document(snap)["ranks"][0]
    assert rank.fitted_ttl_seconds == doc["rolling"]["fitted_acting_ttl_seconds"]
    assert rank.context_growth_tokens == doc["rolling"]["avg_context_growth_tokens"]
    assert (rank.request_samples, rank.continuity_samples) == (1, 0)
    assert rank.observation_fresh is doc["observation_fresh"] is True
    assert "queue_size" not in doc and "active_programs" not in doc  # gauge-only facts
    assert snapshot(h.state, h.cfg, 2.0, include_programs=False).ranks[0].programs == ()
