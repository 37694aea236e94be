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
    DEPART,
    DRAIN,
    FORCED,
    LINE,
    LINE_WEIGHT,
    MAX_ETA_SECONDS,
    POOLED,
    RELEASE,
    TICK,
    Atom,
    FirstEta,
    Leaver,
    QueueEta,
    QueueKey,
    Slack,
    acting_atoms,
    admission_in,
    busy_atoms,
    drain_interval,
    mean_residual,
    quantile,
    retry_after_seconds,
)
from actors.core.events import RequestSubmitted
from actors.core.ids import ProgramRef, RequestId, TargetId
from actors.core.ledger import admission_fit, fresh_waiting, private_tokens, remaining_rounds, target_usage
from actors.core.lifecycle import cancel_waiting
from actors.core.model import ACTING, GLOBAL_QUEUE, RANK_QUEUE, Program, RankState
from actors.core.resume import _front_output, ordered
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
    """The drain interval ``d`` of rank ``line``'s line: its own samples shrunk to the pooled drain
    of every line, which is shrunk to the rank's prior."""
    pooled = drain_interval(s.eta.window(POOLED), prior_interval(s, line))
    return drain_interval(s.eta.window((LINE, line)), pooled, LINE_WEIGHT)


def releases(s: SchedulerState, rank: RankState) -> list[float]:
    """Seconds until the rank's acting Programs' TTL pauses, soonest first (each runs a pass)."""
    now = s.now
    out = [
        max(0.0, a.ttl_deadline - now)
        for a in rank.active.values()
        if a.status == ACTING and a.ttl_deadline is not None
    ]
    out.sort()
    return out


def busy_since(s: SchedulerState) -> dict[TargetId, dict[ProgramRef, float]]:
    """Per rank, the latest dispatch time of each Program with a request in flight there."""
    out: dict[TargetId, dict[ProgramRef, float]] = {}
    for d in s.in_flight.values():
        running = out.setdefault(d.target_id, {})
        running[d.ref] = max(running.get(d.ref, d.dispatched_at), d.dispatched_at)
    return out


def leavers(
    s: SchedulerState, rank: RankState, busy: dict[TargetId, dict[ProgramRef, float]] | None = None
) -> list[Leaver]:
    """The rank's active Programs, each with when it may leave the rank and what that frees
    (docs/program-scheduling.md §13, "Departures"):

    * a busy Program's request ends after the mean residual of the rank's recent service times
      (dispatch to completion) given how long it has run; one marked to pause (or end) when idle
      leaves then; any other leaves then with the rank's release probability ``1 / mean rounds
      between its TTL pauses`` or is held and completes again a mean service time later
      (:func:`eta.busy_atoms`; not counted until the rank has seen a TTL pause);
    * an acting (held) Program leaves at its TTL deadline unless its gap ends first: the gaps
      after its tool (docs/program-scheduling.md §12) or, for a fitted or hinted TTL, the rank's
      request intervals (§4) give that probability; coming back, it is busy again
      (:func:`eta.acting_atoms`)."""
    now, cfg = s.now, s.cfg
    factors = rank.factors
    service = [r.e2e_seconds - r.queue_seconds for r in factors.requests]
    mean_service = math.fsum(service) / len(service) if service else 0.0
    release = factors.mean_ttl_pause_rounds()
    q = 1.0 / max(1.0, release) if factors.ttl_pause_rounds else 0.0
    rounds = factors.target_rounds(cfg.max_segment_rounds)
    running = (busy if busy is not None else busy_since(s)).get(rank.target_id, {})
    then: tuple[Atom, ...] | None = None  # the departures of a Program busy from now on
    out: list[Leaver] = []
    for a in rank.active.values():
        left = max(0, rounds - a.rounds_since_activation) if rounds > 0 else 0
        if a.status == ACTING and a.ttl_deadline is not None:
            if then is None:
                then = busy_atoms(mean_service, q, mean_service)
            since = a.acting_since if a.acting_since is not None else now
            atoms = acting_atoms(a.ttl_deadline - now, now - since, a.ttl_deadline - since, _gaps(s, rank, a), then)
        elif a.in_flight > 0 and a.ref in running:
            rest = mean_residual(service, now - running[a.ref])
            if rest is None:
                continue
            if a.pause_when_idle or a.terminate_when_idle:
                atoms = ((rest, 1.0),)
            else:
                atoms = busy_atoms(rest, q, mean_service)
        else:
            continue
        if atoms:
            out.append(Leaver(atoms, a.charged_tokens, left))
    return out


def _gaps(s: SchedulerState, rank: RankState, a: Program) -> list[float]:
    """The gaps an acting Program's TTL was sized for: its tool's (read without touching the
    model's recency order), else the rank's request intervals."""
    if a.tool_ttl_armed is not None:
        w = s.tools.windows.get((a.ref.model_pool, a.tool_ttl_armed[0]))
        if w is not None:
            return list(w.gaps)
    return [x for x, _impact in rank.factors.continuities]


def line_slack(s: SchedulerState, rank: RankState, p: Program, ahead_tokens: float, ahead: int) -> Slack:
    """The admission check of ``p`` on ``rank`` behind ``ahead`` Programs of its line (admitted
    first, with ``ahead_tokens`` private tokens), as a function of what leaves the rank: the
    tokens it would have to spare (docs/program-scheduling.md §3, ``ledger.admission_fit``)."""
    cfg, now = s.cfg, s.now
    factors = rank.factors
    rounds = factors.target_rounds(cfg.max_segment_rounds)
    used = target_usage(rank, now, cfg.metrics_interval_seconds) + rank.batch_claim_tokens
    used += rank.interactive_claim_tokens + ahead_tokens
    required = private_tokens(p, cfg.decode_buffer_tokens, _front_output(s, p))
    remaining = remaining_rounds(rank, rounds) + ahead * max(0, rounds)
    active = len(rank.active) + ahead

    def slack(left: int, tokens: float, freed_rounds: int) -> float:
        count = active - left
        fit = admission_fit(cfg, factors, rounds, used - tokens, required, count, remaining - freed_rounds)
        count_fits, _immediate, reserve_fits, reserve, low = fit
        if count == 0 and required > low:
            return 0.0  # it could never fit: it runs alone on the idle rank (§3)
        if not count_fits:
            return -math.inf
        if math.isinf(low):
            return 0.0
        spare = low - (used - tokens + required + reserve)
        return spare if reserve_fits else min(spare, -1e-9)

    return slack


def to_next_tick(s: SchedulerState) -> float:
    """Seconds to the next tick (its admission pass); one interval before the first tick."""
    interval = s.cfg.metrics_interval_seconds
    last = s.eta.last_tick_at
    if last is None:
        return interval
    ahead = last + interval - s.now
    if ahead < 0:  # a tick is late: the next one is one interval after it is due
        ahead = interval - (-ahead % interval) if interval > 0 else 0.0
    return ahead


def queue_etas(s: SchedulerState, key: QueueKey) -> list[tuple[Program, QueueEta]]:
    """Every waiting Program of queue ``key`` in admission order, with its position in its line
    (the waiters for the same rank) and its ETA."""
    kind, name = key
    refs = s.global_queues.get(name) if kind == GLOBAL_QUEUE else s.rank_queues.get(TargetId(name))
    if not refs:
        return []
    cfg, now = s.cfg, s.now
    to_tick = to_next_tick(s)
    out: list[tuple[Program, QueueEta]] = []
    # per line: [position so far, private tokens of the line so far, the previous position's ETA]
    lines: dict[TargetId | None, list[float]] = {}
    cache: dict[TargetId, tuple[list[Leaver], list[float]]] = {}  # the rank's leavers and TTL pauses
    busy: dict[TargetId, dict[ProgramRef, float]] | None = None  # busy_since(), once per call
    for p in ordered(s, list(refs)):
        line = p.last_target
        st = lines.setdefault(line, [0.0, 0.0, 0.0])
        ahead, ahead_tokens = int(st[0]), st[1]
        st[0] += 1
        st[1] += private_tokens(p, cfg.decode_buffer_tokens, _front_output(s, p))
        position = int(st[0])
        rank = s.ranks.get(line) if line is not None else None
        d = line_interval(s, rank.target_id) if rank is not None else DEFAULT_PRIOR_INTERVAL
        blocked, basis = True, DRAIN
        eta = max(0.0, to_tick) + position * d
        if rank is not None:
            if rank.target_id not in cache:
                if busy is None:
                    busy = busy_since(s)
                cache[rank.target_id] = (leavers(s, rank, busy), releases(s, rank))
            gone, pauses = cache[rank.target_id]
            slack = line_slack(s, rank, p, ahead_tokens, ahead)
            if slack(0, 0.0, 0) >= 0:  # it fits now: what holds it back is re-checked at the next pass
                blocked, basis = False, TICK
                eta = max(0.0, to_tick)
                if pauses and pauses[0] < eta:
                    eta, basis = pauses[0], RELEASE
            else:
                target = str(rank.target_id)
                threshold = cfg.admission_waiting_request_threshold
                waiting = fresh_waiting(rank, now, cfg.metrics_interval_seconds)
                at = admission_in(
                    gone,
                    slack,
                    s.eta.shifts.get(target, ()),
                    to_tick,
                    cfg.metrics_interval_seconds,
                    gate_closed=threshold > 0 and waiting is not None and waiting >= threshold,
                    gate_open=s.eta.gate_open_share(target),
                )
                if at is not None:
                    eta, basis = at, DEPART
        forced_in = p.force_resume_deadline - now if p.force_resume_deadline is not None else math.inf
        if 0 < forced_in < eta:  # its force-resume timer runs a pass that admits it past every check (§5)
            eta, basis = forced_in, FORCED
        eta = min(eta, MAX_ETA_SECONDS) if math.isfinite(eta) else MAX_ETA_SECONDS
        eta = st[2] = max(eta, st[2])  # nobody behind it in its line goes first
        out.append((p, QueueEta(position, eta, d, to_tick, blocked=blocked, basis=basis)))
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
    if bound is not None and (eta.eta_seconds > bound or bound == 0):  # 0: do not queue at all
        s.eta.bound_rejections += 1
        s.effects.append(bound_rejection(rid, eta, bound))
        cancel_waiting(s, rid)
        return
    s.eta.first[rid] = FirstEta(
        eta_seconds=eta.eta_seconds,
        queued_at=s.now,
        line=None if p is None or p.last_target is None else str(p.last_target),
        position=eta.position,
        to_tick_seconds=eta.to_tick_seconds,
        blocked=eta.blocked,
    )
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
        w = book.window((LINE, target))
        lines.append(
            {
                "target_id": target,
                "waiting_programs": waiting.get(str(target), 0),
                "drain_interval_seconds": line_interval(s, target),
                "prior_interval_seconds": prior_interval(s, target),
                "interval_samples": len(w.intervals),
                "samples_observed": w.observed,
            }
        )
    return {
        "samples_count": book.samples,
        "recent_samples": len(errors),
        "median_relative_error": book.median_error(),
        "p90_relative_error": quantile(errors, 0.9),
        "told_waiting_count": len(book.first),
        "bound_rejections_count": book.bound_rejections,
        "next_tick_in_seconds": to_next_tick(s),
        "lines": lines,
    }
