"""Queue ETA on the scheduler state: positions, the prior drain, what waiting requests are told
(docs/program-scheduling.md §13; the model itself is ``eta``).

* :func:`after_submit` runs at the end of a ``RequestSubmitted`` step: a request still waiting is
  told its first ETA (``QueueEtaTold(first=True)``), which is remembered for the accuracy check;
  with a bound (``RequestSubmitted.max_queue_seconds``, the edge's ``x-agentd-max-queue-seconds``)
  that the ETA exceeds, it is refused at once instead (429 ``queue_wait_exceeds_bound`` with
  ``Retry-After``), and never waits;
* :func:`tell_all` runs at every tick: every waiting Program request is told its position and ETA
  again (the edge turns the latest into an SSE comment while a streaming request waits);
* :func:`retry_after` gives the ``Retry-After`` of a queue-timeout 429 from the Program's ETA.
"""

from __future__ import annotations

import math

from actors.core.effects import QueueEtaTold, Reject
from actors.core.errors import Rejection
from actors.core.eta import (
    DEFAULT_PRIOR_INTERVAL,
    FirstEta,
    QueueEta,
    QueueKey,
    drain_interval,
    eta_seconds,
    quantile,
    retry_after_seconds,
)
from actors.core.events import RequestSubmitted
from actors.core.ids import RequestId, TargetId
from actors.core.lifecycle import cancel_waiting
from actors.core.model import GLOBAL_QUEUE, RANK_QUEUE, Program
from actors.core.resume import ordered
from actors.core.state import SchedulerState, live_program

QUEUE_WAIT_EXCEEDS_BOUND = "queue_wait_exceeds_bound"


def prior_interval(s: SchedulerState, line: TargetId) -> float:
    """The drain prior of rank ``line``: ``max(1, R) / throughput`` (the force-resume estimate's
    drain, docs/program-scheduling.md §5), else ``DEFAULT_PRIOR_INTERVAL``."""
    rank = s.ranks.get(line)
    if rank is None:
        return DEFAULT_PRIOR_INTERVAL
    fac = rank.factors
    r = fac.target_rounds(s.cfg.max_segment_rounds)
    thr = fac.request_throughput_per_second()
    if r <= 0 or thr <= 0:
        return DEFAULT_PRIOR_INTERVAL
    return max(1, r) / thr


def line_interval(s: SchedulerState, line: TargetId) -> float:
    """The drain interval ``d`` of rank ``line``'s line (learned, shrunk to the prior)."""
    return drain_interval(s.eta.window((RANK_QUEUE, line)), prior_interval(s, line))


def queue_etas(s: SchedulerState, key: QueueKey) -> list[tuple[Program, QueueEta]]:
    """Every waiting Program of queue ``key`` in admission order, with its position in its line
    (the waiters for the same rank) and its ETA."""
    kind, name = key
    refs = s.global_queues.get(name) if kind == GLOBAL_QUEUE else s.rank_queues.get(TargetId(name))
    if not refs:
        return []
    out: list[tuple[Program, QueueEta]] = []
    ahead: dict[TargetId | None, int] = {}
    intervals: dict[TargetId, float] = {}
    for p in ordered(s, list(refs)):
        line = p.last_target
        position = ahead.get(line, 0) + 1
        ahead[line] = position
        if line is None:
            d = DEFAULT_PRIOR_INTERVAL
        else:
            d = intervals.get(line, -1.0)
            if d < 0:
                d = intervals[line] = line_interval(s, line)
        out.append((p, QueueEta(position, eta_seconds(position, d), d)))
    return out


def program_eta(s: SchedulerState, p: Program) -> QueueEta | None:
    """Where the waiting Program ``p`` stands in its line, or None when it is not waiting."""
    if p.queued_in is None:
        return None
    for o, eta in queue_etas(s, p.queued_in):
        if o is p:
            return eta
    return None


def retry_after(s: SchedulerState, p: Program | None) -> float | None:
    """``Retry-After`` for a request of ``p`` refused from the queue: its ETA rounded up, >= 1."""
    eta = program_eta(s, p) if p is not None else None
    return retry_after_seconds(eta.eta_seconds) if eta is not None else None


def after_submit(s: SchedulerState, ev: RequestSubmitted) -> None:
    """A submitted request that still waits is told its first ETA, or refused when it exceeds
    the request's bound (see the module docstring)."""
    rid = ev.request_id
    req = s.pool.get(rid)
    if req is None:
        return  # admitted at once, or refused
    p = live_program(s, req.ref)
    eta = program_eta(s, p) if p is not None else None
    if eta is None:
        return
    bound = ev.max_queue_seconds
    if bound is not None and eta.eta_seconds > bound:
        s.eta.bound_rejections += 1
        s.effects.append(bound_rejection(rid, eta, bound))
        cancel_waiting(s, rid)
        return
    s.eta.first[rid] = FirstEta(eta_seconds=eta.eta_seconds, queued_at=s.now)
    s.effects.append(QueueEtaTold(request_id=rid, position=eta.position, eta_seconds=eta.eta_seconds, first=True))


def bound_rejection(rid: RequestId, eta: QueueEta, bound: float) -> Reject:
    why = Rejection(
        reason=QUEUE_WAIT_EXCEEDS_BOUND,
        status_hint=429,
        message=(
            f"expected queue wait {eta.eta_seconds:.1f}s (position {eta.position}) exceeds "
            f"x-agentd-max-queue-seconds={_fmt(bound)}"
        ),
    )
    return Reject(
        request_id=rid,
        reason=why.reason,
        status_hint=why.status_hint,
        message=why.message,
        retry_after_seconds=retry_after_seconds(eta.eta_seconds),
    )


def _fmt(x: float) -> str:
    return f"{x:g}" if math.isfinite(x) else str(x)


def tell_all(s: SchedulerState) -> None:
    """Every waiting Program request is told its position and ETA (once per tick)."""
    keys: list[QueueKey] = [(GLOBAL_QUEUE, name) for name in s.global_queues]
    keys.extend((RANK_QUEUE, str(name)) for name in s.rank_queues)
    for key in keys:
        for p, eta in queue_etas(s, key):
            for req in s.pool.requests(p.ref):
                s.effects.append(
                    QueueEtaTold(
                        request_id=req.request_id, position=eta.position, eta_seconds=eta.eta_seconds, first=False
                    )
                )


def diagnostics(s: SchedulerState) -> dict[str, object]:
    """The ``queue_eta`` section of ``/scheduling/diagnostics``: accuracy of the first ETAs and
    each rank's line (docs/program-scheduling.md §13)."""
    book = s.eta
    errors = book.errors
    waiting: dict[str, int] = {}
    for key in [(GLOBAL_QUEUE, n) for n in s.global_queues] + [(RANK_QUEUE, str(t)) for t in s.rank_queues]:
        for p, _eta in queue_etas(s, key):
            line = str(p.last_target)
            waiting[line] = waiting.get(line, 0) + 1
    lines = []
    for target in sorted(s.ranks):
        w = book.window((RANK_QUEUE, target))
        lines.append(
            {
                "target_id": target,
                "waiting_programs": waiting.get(str(target), 0),
                "drain_interval_seconds": line_interval(s, target),
                "prior_interval_seconds": prior_interval(s, target),
                "interval_samples": len(w.intervals),
                "exits_count": w.exits,
            }
        )
    return {
        "samples_count": book.samples,
        "recent_samples": len(errors),
        "median_relative_error": book.median_error(),
        "p90_relative_error": quantile(errors, 0.9),
        "told_waiting_count": len(book.first),
        "bound_rejections_count": book.bound_rejections,
        "lines": lines,
    }
