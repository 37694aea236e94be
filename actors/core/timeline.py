"""The hooks that feed each Program's time account from the scheduler (docs/program-scheduling.md §14).

``attribution`` holds the pure account; this module connects it to ``SchedulerState``:

* :func:`sync_touched` (end of every step): each Program the step touched enters the phase its
  in-flight and waiting counts give, closing the interval before;
* :func:`on_completion` (``completion.on_complete``, after the fence): splits the serving time
  with the completion and reports it (``TimeAttributed``);
* :func:`on_lost_placement` (every pause, cancellation pause and failover): records the cause;
* :func:`on_release` (terminal release): closes the account of the generation and reports what
  was not reported yet.
"""

from __future__ import annotations

from actors.core.attribution import (
    IDLE,
    QUEUED,
    SERVING,
    ProgramTime,
    advance,
    attribute_completion,
    lost_placement,
    release_report,
)
from actors.core.events import RequestCompleted
from actors.core.model import Dispatch, Program
from actors.core.state import SchedulerState, lookup_key


def _record(s: SchedulerState, p: Program) -> ProgramTime:
    rec = s.times.records.get(lookup_key(p.ref))
    return rec if rec is not None else s.times.record(p.ref.key, s.now)


def sync_touched(s: SchedulerState) -> None:
    """Every Program the step touched enters its current phase (records start at first touch)."""
    if not s.touched:
        return
    book = s.times
    records = book.records
    now = s.now
    program_len = s.pool.program_len
    for ref, p in s.touched.items():
        rec = records.get(lookup_key(ref))
        if rec is None:
            rec = book.record(ref.key, now)
        # ``attribution.sync`` inlined, its operations in its order (a Program in flight needs
        # no pool lookup: it serves whatever waits)
        if now != rec.since:
            advance(rec, now)
        if p.in_flight > 0:
            rec.phase = SERVING
        else:
            rec.phase = QUEUED if program_len(ref) > 0 else IDLE
            if rec.serving_open > 0.0:
                rec.prefill += rec.serving_open
                rec.unreported_prefill += rec.serving_open
                rec.serving_open = 0.0


def on_completion(s: SchedulerState, p: Program, d: Dispatch, ev: RequestCompleted) -> None:
    rec = s.times.records.get(lookup_key(p.ref))  # (``_record`` inlined: once per request)
    s.effects.append(
        attribute_completion(
            rec if rec is not None else s.times.record(p.ref.key, s.now),
            s.times.totals,
            p.ref,
            s.now,
            d.target_id,
            ev.success,
            ev.usage,
            ev.decode_seconds,
            d.estimated_context_tokens,
            s.cfg.prefill_cost_model,
        )
    )


def on_lost_placement(s: SchedulerState, p: Program, reason: str) -> None:
    lost_placement(_record(s, p), reason)


def on_release(s: SchedulerState, p: Program) -> None:
    effect = release_report(_record(s, p), s.times.totals, p.ref, p.placement or p.last_target, s.now)
    if effect is not None:
        s.effects.append(effect)
