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

from actors.core.cache_residency import move_cost_seconds
from actors.core.effects import QueueEtaTold, Reject
from actors.core.errors import Rejection
from actors.core.eta import (
    DEFAULT_PRIOR_INTERVAL,
    LINE,
    LINE_WEIGHT,
    POOLED,
    Departure,
    FirstEta,
    QueueEta,
    QueueKey,
    completion_interval,
    departure_in,
    drain_interval,
    eta_seconds,
    gate_open_in,
    mean_residual,
    quantile,
    retry_after_seconds,
)
from actors.core.events import RequestSubmitted
from actors.core.ids import ProgramRef, RequestId, TargetId
from actors.core.ledger import (
    admission_plan,
    private_tokens,
    rank_counts,
    target_usage,
    waiting_gate_shut,
)
from actors.core.lifecycle import cancel_waiting
from actors.core.model import ACTING, GLOBAL_QUEUE, RANK_QUEUE, Program, RankState
from actors.core.resume import move_destination_allows, ordered
from actors.core.state import SchedulerState, live_program
from actors.core.stats import continuous_growth_reserve

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


def admission_usage(s: SchedulerState, rank: RankState) -> float:
    """What an admission on ``rank`` counts as used (docs/program-scheduling.md §3): the ledger's
    usage, the claims of waiting batch and interactive requests, and the growth reserve of the
    active Programs' remaining continuous rounds (a Program that fits without the reserve is
    admitted only when the batch-gain estimate says so, which the ETA does not predict)."""
    cfg = s.cfg
    used = target_usage(rank, s.now, cfg.metrics_interval_seconds)
    used += rank.batch_claim_tokens + rank.interactive_claim_tokens
    if cfg.token_capacity_per_dp_rank is not None:
        rounds = rank.factors.target_rounds(cfg.max_segment_rounds)
        if rounds > 0:
            remaining = [max(0, rounds - a.rounds_since_activation) for a in rank.active.values()]
            used += continuous_growth_reserve(rank.factors, rounds, remaining)
    return used


def releases(s: SchedulerState, rank: RankState) -> list[tuple[float, float]]:
    """(seconds until, private tokens freed) of the rank's acting Programs' TTL pauses, soonest first."""
    now = s.now
    out = [
        (max(0.0, a.ttl_deadline - now), a.charged_tokens)
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


def departures(
    s: SchedulerState, rank: RankState, busy: dict[TargetId, dict[ProgramRef, float]] | None = None
) -> tuple[list[Departure], float, float]:
    """The rank's Programs that may leave it, with the release probability of a completion and
    the service cycle of a held Program (docs/program-scheduling.md §13, "Departures"):

    * an acting Program leaves at its TTL deadline, a busy one marked to pause (or end) when idle
      at the end of its request: certain;
    * a busy Program leaves at the expected end of its request (the mean residual of the rank's
      recent service times, dispatch to completion, given how long it has run) with probability
      ``1 / mean rounds between the rank's TTL pauses``, else is held and completes again one mean
      service time later.  Without a TTL pause seen on the rank, completions are not counted."""
    now = s.now
    factors = rank.factors
    service = [r.e2e_seconds - r.queue_seconds for r in factors.requests]
    cycle = math.fsum(service) / len(service) if service else 0.0
    rounds = factors.mean_ttl_pause_rounds()
    q = 1.0 / max(1.0, rounds) if factors.ttl_pause_rounds else 0.0
    running = (busy if busy is not None else busy_since(s)).get(rank.target_id, {})
    out: list[Departure] = []
    for a in rank.active.values():
        if a.status == ACTING and a.ttl_deadline is not None:
            out.append(Departure(max(0.0, a.ttl_deadline - now), a.charged_tokens, certain=True, acting=True))
        elif a.in_flight > 0 and a.ref in running:
            rest = mean_residual(service, now - running[a.ref])
            if rest is None:
                continue
            certain = a.pause_when_idle or a.terminate_when_idle
            out.append(Departure(rest, a.charged_tokens, certain=certain))
    return out, q, cycle


def engine_completion_interval(s: SchedulerState, rank: RankState) -> float:
    """Seconds between two completions of the rank's engine while it has work queued
    (:func:`eta.completion_interval` over the rank's request window); for a rank that has not
    completed a request yet, the mean of the other ranks' that have; else ``DEFAULT_PRIOR_INTERVAL``."""
    c = _completion_interval(rank)
    if c is not None:
        return c
    others = [c for r in s.ranks.values() if r is not rank and (c := _completion_interval(r)) is not None]
    return math.fsum(others) / len(others) if others else DEFAULT_PRIOR_INTERVAL


def _completion_interval(rank: RankState) -> float | None:
    samples = [(r.finished_at, r.e2e_seconds - r.queue_seconds) for r in rank.factors.requests]
    return completion_interval(samples, rank.running_requests or 0)


def gate_in(s: SchedulerState, rank: RankState, to_tick: float) -> float | None:
    """Seconds until the rank's waiting gate is expected to open (docs/program-scheduling.md §3,
    §13 "The waiting gate"), or None when it is open, or expected to be at the next tick.  The gate
    is closed while the rank's fresh observation shows at least
    ``admission_waiting_request_threshold`` requests waiting in the engine; the first tick whose
    scrape shows fewer opens it, or, when the completion that brings the count below the threshold
    leaves nothing agentd dispatched in flight there, that completion (``ledger.waiting_gate_shut``,
    since session 33).  The engine's queue now is the observed one plus the Program requests
    dispatched to the rank since that scrape, minus those completed since (each completion lets a
    queued request run); it drains by one request per :func:`engine_completion_interval`."""
    cfg, now = s.cfg, s.now
    if not waiting_gate_shut(rank, s.now, s.cfg) or not gate_lasting(s, rank):
        return None
    w = rank.waiting_requests or 0
    threshold = cfg.admission_waiting_request_threshold
    in_flight = rank_counts(rank)[1]
    waiting = max(0, w + in_flight - rank.observed_router_active_reasoning_requests)
    requests = rank.factors.requests
    since = now - requests[-1].finished_at if requests else None
    opens = gate_open_in(waiting, threshold, engine_completion_interval(s, rank), since)
    if opens is None:
        return None
    stale = rank.dispatched - in_flight  # a stale placement's requests: their ends are not counted
    if in_flight <= waiting - threshold + 1 and not (stale > 0 or rank.batch_requests or rank.interactive_requests):
        return opens  # the completion that opens it leaves nothing of agentd's in flight (ledger.drained)
    return first_tick_after(s, to_tick, opens)


def gate_lasting(s: SchedulerState, rank: RankState) -> bool:
    """A closed gate is lasting when the engine runs requests and queues more than it runs, or when the
    observation before the rank's last one showed it closed too (as seen at a tick,
    :func:`note_gates`).  Otherwise it is mostly requests the engine had just received and starts
    at its next step: open again at the next scrape (docs/benchmarks.md §9.5, session 32)."""
    running = rank.running_requests or 0
    if running > 0 and (rank.waiting_requests or 0) > running:
        return True  # the engine queues more than it runs: it cannot start them all at its next step
    seen = s.eta.gates.get(str(rank.target_id))
    if seen is None:
        return False
    at, closed, closed_before = seen
    return closed_before if at == rank.observed_at else closed


def note_gates(s: SchedulerState) -> None:
    """At a tick: remember, per rank, whether its last observation showed the gate closed."""
    book = s.eta
    for target, rank in s.ranks.items():
        key = str(target)
        if rank.observed_at is None:
            continue
        seen = book.gates.get(key)
        if seen is not None and seen[0] == rank.observed_at:
            continue
        book.gates[key] = (rank.observed_at, waiting_gate_shut(rank, s.now, s.cfg), seen is not None and seen[1])
    for key in [k for k in book.gates if TargetId(k) not in s.ranks]:
        del book.gates[key]


def held_by_gate(s: SchedulerState, p: Program, rank: RankState, gate: float, to_tick: float) -> float:
    """How long a closed gate that opens in ``gate`` seconds holds ``p`` on ``rank``: not at all for
    a Program of a tenant the rank is kept for, until the first tick from its force-resume
    deadline when that is sooner (both go through the gate, ``ledger.admission_plan``)."""
    if p.tenant in rank.isolated_for:
        return 0.0
    deadline = p.force_resume_deadline
    if deadline is not None:
        return min(gate, first_tick_after(s, to_tick, deadline - s.now))
    return gate


def first_tick_after(s: SchedulerState, to_tick: float, wait: float) -> float:
    """Seconds from now to the first tick at least ``wait`` seconds from now (``to_tick``: the next one)."""
    interval = s.cfg.metrics_interval_seconds
    if wait <= to_tick + 1e-9 or interval <= 0:
        return to_tick
    return to_tick + math.ceil((wait - to_tick) / interval - 1e-9) * interval


def move_in(
    s: SchedulerState,
    p: Program,
    to_tick: float,
    pressure_at: float | None,
    waiting_targets: dict[TargetId | None, int],
) -> float | None:
    """Seconds until the cross-rank resume (docs/program-scheduling.md §7) is expected to move
    the waiting Program ``p`` to another rank of its pool, or None (docs/program-scheduling.md
    §13, "Moves").  A Program paused before may move once it has waited one interval while its
    rank is under pressure (``pressure_at``: when a Program ahead of it in its line will have
    waited one interval; always with the waiting gate off), or once it has waited as
    long as recomputing its context would take (patient); the move happens at a pass, expected at
    the first tick from then, to a rank that would admit it now.  A rank other waiters wait for
    (``waiting_targets``) is no destination.  A closed waiting gate (the engine's waiting count in
    the rank's last observation) is pressure too, but is not counted: it is the count of one
    scrape, which at the eviction point often opens again at the next one, an interval before the
    move could use it (docs/benchmarks.md §9.5, session 24)."""
    cfg, now = s.cfg, s.now
    source = s.ranks.get(p.last_target) if p.last_target is not None else None
    if p.last_pause_reason is None or source is None or p.queued_at is None:
        return None
    interval = cfg.metrics_interval_seconds
    earliest = p.queued_at + interval
    patient_at = p.queued_at + max(interval, move_cost_seconds(s, p))  # the pass's patience
    if cfg.admission_waiting_request_threshold == 0:
        pressure_at = now
    at = patient_at if pressure_at is None else max(earliest, min(pressure_at, patient_at))
    patient = at >= patient_at
    front = s.pool.front(p.ref)
    out = front.hints.expected_output_length if front is not None else None
    source_mature = source.factors.request_window_complete
    for dest_id in s.pools.get(p.ref.model_pool, ()):
        if dest_id == source.target_id or waiting_targets.get(dest_id, 0) > 0:
            continue
        dest = s.ranks[dest_id]
        if len(dest.active) >= cfg.max_active_programs_per_target:
            continue  # the admission's Program-count guard (a due force-resume deadline resumes at home)
        if not move_destination_allows(s, p, source, dest, patient=patient, source_mature=source_mature):
            continue
        if admission_plan(p, dest, now, cfg, front_output=out, global_mode=True) is not None:
            return first_tick_after(s, to_tick, at - now)
    return None


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


def queue_etas(s: SchedulerState, key: QueueKey, until: Program | None = None) -> list[tuple[Program, QueueEta]]:
    """Every waiting Program of queue ``key`` in admission order, with its position in its line
    (the waiters for the same rank) and its ETA; with ``until``, only its line, up to it (a line's
    ETAs depend on that line alone, and a move's on which ranks the other lines wait for, which
    both walks count in full)."""
    kind, name = key
    refs = s.global_queues.get(name) if kind == GLOBAL_QUEUE else s.rank_queues.get(TargetId(name))
    if not refs:
        return []
    cfg = s.cfg
    capacity = cfg.token_capacity_per_dp_rank
    low = capacity * cfg.low_watermark_ratio if capacity is not None else None
    to_tick = to_next_tick(s)
    out: list[tuple[Program, QueueEta]] = []
    # per line: (position so far, tokens the line needs so far, its drain interval, used, active,
    # the ETA of the previous position)
    lines: dict[TargetId | None, list[float]] = {}
    pauses_by_line: dict[TargetId | None, list[tuple[float, float]]] = {}  # the rank's TTL pauses
    leaving: dict[TargetId | None, tuple[list[Departure], float, float]] = {}  # departures(), per line
    busy: dict[TargetId, dict[ProgramRef, float]] | None = None  # busy_since(), once per call
    gates: dict[TargetId | None, float | None] = {}  # gate_in(), per line
    waiters = ordered(s, list(refs))
    moves = kind == GLOBAL_QUEUE and cfg.global_queue
    # per line: when the earliest-queued Program so far will have waited one interval (the
    # cross-rank pressure of the Programs behind it, docs/program-scheduling.md §7)
    pressure: dict[TargetId | None, float] = {}
    waiting_targets: dict[TargetId | None, int] = {}
    if moves:
        for o in waiters:
            waiting_targets[o.last_target] = waiting_targets.get(o.last_target, 0) + 1
    for p in waiters:
        line = p.last_target
        if until is not None and line != until.last_target:
            continue
        st = lines.get(line)
        if st is None:
            rank = s.ranks.get(line) if line is not None else None
            if rank is None:
                st = [0.0, 0.0, DEFAULT_PRIOR_INTERVAL, 0.0, 0.0, 0.0]
            else:
                used = admission_usage(s, rank)
                st = [0.0, 0.0, line_interval(s, rank.target_id), used, float(len(rank.active)), 0.0]
            lines[line] = st
        st[0] += 1
        st[1] += private_tokens(p, cfg.decode_buffer_tokens)
        position = int(st[0])
        count_over = st[4] + position - cfg.max_active_programs_per_target
        tokens_over = st[3] + st[1] - low if low is not None else 0.0
        fits = count_over <= 0 and tokens_over <= 0
        pauses = pauses_by_line.get(line)
        if pauses is None:
            rank = s.ranks.get(line) if line is not None else None
            pauses = pauses_by_line[line] = releases(s, rank) if rank is not None else []
        release_in = _release_in(pauses, count_over, tokens_over, fits)
        leave_in = None
        if not fits:
            dep = leaving.get(line)
            if dep is None:
                rank = s.ranks.get(line) if line is not None else None
                if rank is not None and busy is None:
                    busy = busy_since(s)
                dep = leaving[line] = departures(s, rank, busy) if rank is not None else ([], 0.0, 0.0)
            leave_in = departure_in(dep[0], count_over, tokens_over, dep[1], dep[2])
        d = st[2]
        eta = eta_seconds(position, d, to_tick, blocked=not fits, release_in=release_in, departure_in=leave_in)
        rank = s.ranks.get(line) if line is not None else None
        if fits and rank is not None:  # a blocked line waits for departures, which drain the engine too
            if line not in gates:
                gates[line] = gate_in(s, rank, to_tick)
            gate = gates[line]
            if gate is not None:  # no pass admits it there before the waiting gate opens
                eta = max(eta, held_by_gate(s, p, rank, gate, to_tick))
        eta = st[5] = max(eta, st[5])  # nobody behind it in its line goes first
        by_move = False
        if moves and not fits:
            moved = move_in(s, p, to_tick, pressure.get(line), waiting_targets)
            if moved is not None and moved < eta:
                eta, by_move = moved, True
        if p.queued_at is not None and moves:
            ready = p.queued_at + cfg.metrics_interval_seconds
            pressure[line] = min(pressure.get(line, ready), ready)
        out.append((p, QueueEta(position, eta, d, to_tick, blocked=not fits, moved=by_move)))
        if p is until:
            break
    return out


def _release_in(pauses: list[tuple[float, float]], count_over: float, tokens_over: float, fits: bool) -> float | None:
    """When the rank's TTL ``pauses`` have freed what the line needs (the first one, when it fits
    already), or None when they never do."""
    freed = 0.0
    for count, (at, tokens) in enumerate(pauses, start=1):
        freed += tokens
        if fits or (count >= count_over and freed >= tokens_over):
            return at
    return None


def program_eta(s: SchedulerState, p: Program) -> QueueEta | None:
    """Where the waiting Program ``p`` stands in its line, or None when it is not waiting."""
    if p.queued_in is None:
        return None
    for o, eta in queue_etas(s, p.queued_in, until=p):
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
    note_gates(s)
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
    waiting: dict[str, int] = {}
    for key in [(GLOBAL_QUEUE, n) for n in s.global_queues] + [(RANK_QUEUE, str(t)) for t in s.rank_queues]:
        for p, _eta in queue_etas(s, key):
            line = str(p.last_target)
            waiting[line] = waiting.get(line, 0) + 1
    lines = []
    to_tick = to_next_tick(s)
    for target in sorted(s.ranks):
        w = book.window((LINE, target))
        rank = s.ranks[target]
        lasting = waiting_gate_shut(rank, s.now, s.cfg) and gate_lasting(s, rank)
        lines.append(
            {
                "target_id": target,
                "waiting_programs": waiting.get(str(target), 0),
                "drain_interval_seconds": line_interval(s, target),
                "prior_interval_seconds": prior_interval(s, target),
                "interval_samples": len(w.intervals),
                "samples_observed": w.observed,
                "waiting_gate_lasting": lasting,
                "waiting_gate_opens_in_seconds": gate_in(s, rank, to_tick) if lasting else None,
                "engine_completion_interval_seconds": engine_completion_interval(s, rank),
            }
        )
    return {**accuracy(s), "next_tick_in_seconds": to_next_tick(s), "lines": lines}


def accuracy(s: SchedulerState) -> dict[str, object]:
    """The accuracy figures of the ``queue_eta`` section (the dashboard shows them without the
    per-rank lines, which cost a pass over each rank's statistics)."""
    book = s.eta
    errors = book.errors
    return {
        "samples_count": book.samples,
        "recent_samples": len(errors),
        "median_relative_error": book.median_error(),
        "p90_relative_error": quantile(errors, 0.9),
        "told_waiting_count": len(book.first),
        "bound_rejections_count": book.bound_rejections,
    }
