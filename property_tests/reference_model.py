"""A deliberately naive model of resume ordering and count-only admission.

It restates the ordering rules of docs/program-scheduling.md §5 (resume order) and §3 (the Program-count
guard) as plain pairwise comparisons and an insertion sort, without tuples or sort keys, so
that it shares no code (and no cleverness) with ``actors.core.queue.resume_key``:

1. expired force-resume deadlines first;
2. then the larger priority of the FRONT request;
3. then a Program paused by max_segment_yield goes behind the others;
4. then FCFS (earlier ``queued_at``, then smaller program id) or MRU (a Program that finished
   a request before goes first, the most recent finish first, then FCFS), or LAS (the smaller
   service its task attained so far first, then as MRU).

``count_only_admissions`` is the naive admission of one rank without token capacity: walk the
waiters in that order; a forced waiter always enters, any other one only while the rank has a
free Program slot; nobody enters while the rank's waiting gate holds.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Waiter:
    program_id: str
    model_pool: str
    rank: str
    force_resume_deadline: float | None
    priority: int
    yielded: bool
    queued_at: float | None
    last_finished_at: float | None
    attained: float = 0.0  # the service its task attained (``las`` only)


def _forced(w: Waiter, now: float) -> bool:
    return w.force_resume_deadline is not None and w.force_resume_deadline <= now


def _fcfs_before(a: Waiter, b: Waiter) -> bool:
    if a.queued_at != b.queued_at:
        if a.queued_at is None:
            return False
        if b.queued_at is None:
            return True
        return a.queued_at < b.queued_at
    if a.program_id != b.program_id:
        return a.program_id < b.program_id
    return a.model_pool < b.model_pool


def resumes_before(a: Waiter, b: Waiter, now: float, resume_order: str) -> bool:
    """True when ``a`` must resume strictly before ``b``."""
    if _forced(a, now) and not _forced(b, now):
        return True
    if _forced(b, now) and not _forced(a, now):
        return False
    if a.priority > b.priority:
        return True
    if a.priority < b.priority:
        return False
    if b.yielded and not a.yielded:
        return True
    if a.yielded and not b.yielded:
        return False
    if resume_order == "las" and a.attained != b.attained:
        return a.attained < b.attained
    if resume_order in ("mru", "las"):
        if a.last_finished_at is not None and b.last_finished_at is None:
            return True
        if a.last_finished_at is None and b.last_finished_at is not None:
            return False
        if a.last_finished_at is not None and b.last_finished_at is not None:
            if a.last_finished_at > b.last_finished_at:
                return True
            if a.last_finished_at < b.last_finished_at:
                return False
    return _fcfs_before(a, b)


def naive_order(waiters: list[Waiter], now: float, resume_order: str) -> list[Waiter]:
    out: list[Waiter] = []
    for w in waiters:
        i = len(out)
        while i > 0 and resumes_before(w, out[i - 1], now, resume_order):
            i -= 1
        out.insert(i, w)
    return out


def count_only_admissions(
    waiters: list[Waiter], active_count: int, max_active: int, gate_holds: bool, now: float, resume_order: str
) -> list[Waiter]:
    """Who enters one rank, in order, when only the Program-count guard applies."""
    if gate_holds:
        return []
    admitted = []
    for w in naive_order(waiters, now, resume_order):
        if _forced(w, now) or active_count + 1 <= max_active:
            admitted.append(w)
            active_count += 1
    return admitted
