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
    CompletionSplit,
    ProgramTime,
    add_to_totals,
    attribute_completion,
    lost_placement,
    sync,
    unreported_parts,
)
from actors.core.effects import TimeAttributed
from actors.core.events import RequestCompleted
from actors.core.ids import TargetId
from actors.core.model import Dispatch, Program
from actors.core.state import SchedulerState, lookup_key


def _record(s: SchedulerState, p: Program) -> ProgramTime:
    rec = s.times.records.get(lookup_key(p.ref))
    return rec if rec is not None else s.times.record(p.ref.key, s.now)


def sync_touched(s: SchedulerState) -> None:
    """Every Program the step touched enters its current phase (records start at first touch)."""
    records = s.times.records
    now = s.now
    pool = s.pool
    for ref, p in s.touched.items():
        rec = records.get(lookup_key(ref))
        if rec is None:
            rec = s.times.record(ref.key, now)
        sync(rec, now, p.in_flight, pool.program_len(ref))


def on_completion(s: SchedulerState, p: Program, d: Dispatch, ev: RequestCompleted) -> None:
    rec = _record(s, p)
    split = attribute_completion(
        rec,
        s.now,
        d.target_id,
        ev.success,
        ev.usage,
        ev.decode_seconds,
        d.estimated_context_tokens,
        s.cfg.prefill_cost_model,
    )
    _report(s, p, rec, d.target_id, split)


def on_lost_placement(s: SchedulerState, p: Program, reason: str) -> None:
    lost_placement(_record(s, p), reason)


def on_release(s: SchedulerState, p: Program) -> None:
    """Close a queue or serving interval; an idle one stays open (the idle tail after the last turn
    is not time between turns unless the Program comes back)."""
    rec = _record(s, p)
    if rec.phase != IDLE:
        sync(rec, s.now, 0, 0)
    _report(s, p, rec, p.placement or p.last_target, None)


def _report(
    s: SchedulerState, p: Program, rec: ProgramTime, target: TargetId | None, split: CompletionSplit | None
) -> None:
    parts = unreported_parts(rec)
    if parts is None and split is None:
        return
    if parts is None:
        parts = (0.0, 0.0, 0.0, 0.0, 0.0)
    add_to_totals(s.times.totals, parts, split)
    q, pf, rc, dc, bt = parts
    if split is None:
        s.effects.append(
            TimeAttributed(
                program=p.ref,
                target_id=target,
                queue_seconds=q,
                prefill_seconds=pf,
                recompute_seconds=rc,
                decode_seconds=dc,
                between_turns_seconds=bt,
            )
        )
        return
    s.effects.append(
        TimeAttributed(
            program=p.ref,
            target_id=target,
            queue_seconds=q,
            prefill_seconds=pf,
            recompute_seconds=rc,
            decode_seconds=dc,
            between_turns_seconds=bt,
            completed=True,
            cause=split.cause,
            recomputed_tokens=split.recomputed_tokens,
            cached_tokens=split.cached_tokens,
            new_tokens=split.new_tokens,
            estimated_split=split.estimated,
        )
    )
