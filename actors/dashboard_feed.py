"""Bounded live history for the ``/dashboard`` page (docs/operations.md §9).

The scheduler actor's :class:`~actors.effect_router.EffectRouter` hands every ``Transition`` and
queue-wait observation to :meth:`DashboardFeed.transition` / :meth:`DashboardFeed.queue_wait`
(a dict lookup and a deque append: cheap on the scheduler's path), and the dispatcher closes one
sample per ``RepairTick`` with :meth:`DashboardFeed.close_tick`.  Both buffers are bounded
(``EVENTS_KEPT`` scheduling events, ``TICKS_KEPT`` tick samples), so memory never grows with load.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import attrs

from actors.core.effects import Transition
from actors.core.ids import ProgramRef, redacted_id

EVENTS_KEPT = 50
TICKS_KEPT = 60

# Transition reason -> the dashboard's event kind; resumes are admissions of a paused Program.
_KIND_BY_REASON = {
    "program_admit": "admit",
    "batch_gain_admit": "admit",
    "force_resume": "force-resume",
    "pass_race_admit": "admit",
    "cross_rank_resume": "migrate",
}


@attrs.frozen
class SchedulingEvent:
    at: float  # trio time
    kind: str  # admit | resume | force-resume | migrate | pause
    program: str  # redacted id
    target_id: str | None
    reason: str


@attrs.frozen
class TickSample:
    at: float
    admissions: int  # admit + resume + force-resume + migrate transitions since the previous tick
    pauses: int
    queue_wait_mean_seconds: float | None  # mean router queue wait of requests admitted in the tick
    resume_cache_miss_ratio: float
    cache_miss_impact_mean_seconds: float  # mean over ranks of the rolling cache-miss impact


# an event as the feed keeps it: (at, kind, Program, target_id, reason); the Program's redacted
# id (a hash) is made only when the dashboard is read (docs/benchmarks.md §10.2.6)
_RawEvent = tuple[float, str, ProgramRef, "str | None", str]


@attrs.define
class DashboardFeed:
    _raw: deque[_RawEvent] = attrs.field(factory=lambda: deque(maxlen=EVENTS_KEPT))
    ticks: deque[TickSample] = attrs.field(factory=lambda: deque(maxlen=TICKS_KEPT))
    events_total: int = 0
    _admissions: int = 0
    _pauses: int = 0
    _wait_sum: float = 0.0
    _wait_count: int = 0

    def transition(self, e: Transition, now: float) -> None:
        kind = _KIND_BY_REASON.get(e.reason)
        if kind == "admit" and e.from_state.startswith("paused"):
            kind = "resume"
        if kind is None:
            if not (e.from_state.startswith("active") and e.to_state.startswith("paused")):
                return  # lifecycle-only moves (arrivals, releases) are not shown
            kind = "pause"
            self._pauses += 1
        else:
            self._admissions += 1
        self.events_total += 1
        self._raw.append((now, kind, e.program, e.target_id, e.reason))

    @property
    def events(self) -> list[SchedulingEvent]:
        """The kept events, oldest first."""
        return [_event(raw) for raw in self._raw]

    def queue_wait(self, seconds: float) -> None:
        self._wait_sum += seconds
        self._wait_count += 1

    def close_tick(self, now: float, resume_cache_miss_ratio: float, cache_miss_impact_mean_seconds: float) -> None:
        self.ticks.append(
            TickSample(
                at=now,
                admissions=self._admissions,
                pauses=self._pauses,
                queue_wait_mean_seconds=self._wait_sum / self._wait_count if self._wait_count else None,
                resume_cache_miss_ratio=resume_cache_miss_ratio,
                cache_miss_impact_mean_seconds=cache_miss_impact_mean_seconds,
            )
        )
        self._admissions = self._pauses = self._wait_count = 0
        self._wait_sum = 0.0

    def document(self, now: float, events: int = 15, ticks: int = 60) -> dict[str, Any]:
        """Recent events (newest first, at most ``events``) and the last ``ticks`` tick samples as columns."""
        recent = [_event(raw) for raw in list(self._raw)[-events:][::-1]]
        samples = list(self.ticks)[-ticks:]
        return {
            "events_total": self.events_total,
            "events": [
                {
                    "age_seconds": round(now - ev.at, 3),
                    "kind": ev.kind,
                    "program": ev.program,
                    "target_id": ev.target_id,
                    "reason": ev.reason,
                }
                for ev in recent
            ],
            "history": {
                "ticks": len(samples),
                "admissions": [t.admissions for t in samples],
                "pauses": [t.pauses for t in samples],
                "queue_wait_mean_seconds": [_r(t.queue_wait_mean_seconds) for t in samples],
                "resume_cache_miss_ratio": [_r(t.resume_cache_miss_ratio) for t in samples],
                "cache_miss_impact_mean_seconds": [_r(t.cache_miss_impact_mean_seconds) for t in samples],
            },
        }


def _event(raw: _RawEvent) -> SchedulingEvent:
    at, kind, ref, target, reason = raw
    return SchedulingEvent(at, kind, redacted_id(ref), target, reason)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
