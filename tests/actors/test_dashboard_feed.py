"""The dashboard's event ring and per-tick history: which Transitions show, and the bounds."""

from __future__ import annotations

from actors.core.effects import Transition
from actors.core.ids import ProgramRef, TargetId
from actors.dashboard_feed import EVENTS_KEPT, TICKS_KEPT, DashboardFeed

P = ProgramRef("default", "task:a", 0)
T = TargetId("http://w@0")


def tr(frm: str, to: str, reason: str) -> Transition:
    return Transition(program=P, from_state=frm, to_state=to, reason=reason, target_id=T)


def test_transitions_map_to_event_kinds_and_lifecycle_moves_are_left_out() -> None:
    feed = DashboardFeed()
    feed.transition(tr("new_reasoning", "active_reasoning", "program_admit"), 1.0)
    feed.transition(tr("active_acting", "paused_acting", "ttl_expired"), 2.0)
    feed.transition(tr("paused_reasoning", "active_reasoning", "program_admit"), 3.0)
    feed.transition(tr("paused_reasoning", "active_reasoning", "force_resume"), 4.0)
    feed.transition(tr("paused_reasoning", "active_reasoning", "cross_rank_resume"), 5.0)
    feed.transition(tr("active_reasoning", "active_acting", "program_release"), 6.0)  # not shown
    doc = feed.document(now=10.0)
    assert [e["kind"] for e in doc["events"]] == ["migrate", "force-resume", "resume", "pause", "admit"]
    assert doc["events"][0]["age_seconds"] == 5.0
    assert doc["events_total"] == 5


def test_ticks_count_admissions_pauses_and_queue_wait_then_reset() -> None:
    feed = DashboardFeed()
    feed.transition(tr("new_reasoning", "active_reasoning", "program_admit"), 1.0)
    feed.transition(tr("active_reasoning", "paused_reasoning", "capacity_repair"), 1.0)
    feed.queue_wait(0.2)
    feed.queue_wait(0.4)
    feed.close_tick(1.5, resume_cache_miss_ratio=0.25, cache_miss_impact_mean_seconds=0.5)
    feed.close_tick(2.0, resume_cache_miss_ratio=0.25, cache_miss_impact_mean_seconds=0.5)
    h = feed.document(now=2.0)["history"]
    assert h["admissions"] == [1, 0]
    assert h["pauses"] == [1, 0]
    assert h["queue_wait_mean_seconds"] == [0.3, None]
    assert h["resume_cache_miss_ratio"] == [0.25, 0.25]


def test_buffers_are_bounded() -> None:
    feed = DashboardFeed()
    for i in range(EVENTS_KEPT + 10):
        feed.transition(tr("new_reasoning", "active_reasoning", "program_admit"), float(i))
    for i in range(TICKS_KEPT + 10):
        feed.close_tick(float(i), 0.0, 0.0)
    assert len(feed.events) == EVENTS_KEPT
    assert len(feed.ticks) == TICKS_KEPT
    assert feed.events_total == EVENTS_KEPT + 10
    assert len(feed.document(now=0.0, events=15)["events"]) == 15
