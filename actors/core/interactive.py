"""The interactive class: requests without Program identity queued by the core (docs/priority.md §2).

An ``InteractiveSubmitted`` request waits in ``s.interactive.pending`` and is dispatched by
:func:`dispatch_interactive`, which runs at the start of every admission pass
(``resume.schedule_waiting``) and at the end of every step that ran none, so that it goes ahead of
the classes below it in ``class_order`` (by default ``agent`` and ``batch``).

Order: ``(-priority, tenant counter, arrival)`` -- priority first, then the least-served tenant
(``fairness``), then FIFO.  Each request, in that order, goes to the rank of its pool with the most
free tokens that fits it (``capacity x low_watermark - used - claims of requests ahead``), within
the class caps (``ClassLimits``).  Its charge -- ``prompt + max_tokens`` (else
``decode_buffer_tokens``) -- sits on the rank's ledger until its completion.  Without a known
capacity (no ``token_capacity_per_dp_rank`` and no engine report) it goes at once to the rank
running the fewest requests.  A rank that runs nothing at all takes a request of any size.

When it fits nowhere, room is made on the rank where it can be made soonest, strictly below the
interactive band:

1. restartable batch requests there are preempted, youngest first (``interactive_preempts_batch``);
2. idle (Active/Acting) Programs there are paused, lowest priority first, then the most-served
   tenant, then the largest (``priority_preemption``; their KV stays in the engine's prefix cache
   and they resume on that rank, docs/priority.md §1);
3. if that is still not enough, busy (Reasoning) Programs are marked to pause when their request
   ends (no request is ever cut), and the request *claims* the rank: lower classes see its charge
   as used (``RankState.interactive_claim_tokens``) until it is dispatched.

Steps 1-2 are taken only when, with the marks of step 3, they make the request fit; otherwise
nothing is disturbed beyond the marks.  A waiting request whose ``deadline_seconds`` (else
``queue_timeout_seconds``) passed is rejected (429) at the next tick.

Batch work near interactive traffic (docs/priority.md §2): the headroom cap
(``batch_max_running_near_interactive``) and the ranks reserved for interactive
(``interactive_reserved_ranks``) -- :func:`batch_held_for_interactive` is what the batch class
asks before it starts a request on a rank, :func:`_headroom_preemptions` what an interactive
dispatch preempts.
"""

from __future__ import annotations

from actors.core import fairness
from actors.core.batch_state import BatchRunning
from actors.core.costs import prefill_seconds
from actors.core.effects import AdmitInteractive
from actors.core.errors import INTERACTIVE_QUEUE_TIMEOUT, NO_TARGETS, InvalidEvent
from actors.core.events import InteractiveSubmitted, RequestCompleted
from actors.core.failover import allowed_targets
from actors.core.ids import RequestId, TargetId
from actors.core.interactive_state import InteractivePending, InteractiveRunning
from actors.core.ledger import target_usage
from actors.core.lifecycle import mark_dirty, mark_pause_when_idle, pause, reject
from actors.core.model import ACTING, AGENT, BATCH, INTERACTIVE, PRIORITY_PREEMPTION, REASONING, Program, RankState
from actors.core.preemption import preempt_batch
from actors.core.state import SchedulerState

# ---- events ------------------------------------------------------------------------------------


def on_interactive_submit(s: SchedulerState, ev: InteractiveSubmitted) -> None:
    """Queue an interactive request (the caller synced the targets); the step's admission pass dispatches it."""
    pool = ev.model_pool
    rid = ev.request_id
    st = s.interactive
    if rid in st.pending or rid in st.running or s.pool.get(rid) is not None or rid in s.in_flight:
        raise InvalidEvent(f"request_id {rid!r} is already live")
    if s.batch is not None and (rid in s.batch.pending or rid in s.batch.running):
        raise InvalidEvent(f"request_id {rid!r} is already live")
    if ev.estimated_prompt_tokens < 0:
        raise InvalidEvent(f"estimated_prompt_tokens must be >= 0 (got {ev.estimated_prompt_tokens})")
    if not s.pools.get(pool):
        s.effects.append(reject(rid, NO_TARGETS))
        return
    timeout = s.cfg.queue_timeout_seconds
    if ev.deadline_seconds is not None:
        timeout = min(timeout, ev.deadline_seconds)
    out = ev.max_tokens if ev.max_tokens is not None else s.cfg.decode_buffer_tokens
    st.seq += 1
    st.last_arrival = s.now
    _reserve(s, pool)
    fairness.arrive(s.fair, s.prio, ev.tenant, s.now)
    st.pending[rid] = InteractivePending(
        request_id=rid,
        tenant=ev.tenant,
        priority=ev.priority,
        prompt_tokens=int(ev.estimated_prompt_tokens),
        reserved_output_tokens=int(out),
        model_pool=pool,
        arrived_at=s.now,
        queue_deadline=s.now + timeout,
        seq=st.seq,
        avoid_workers=ev.avoid_workers,
    )
    if s.cfg.binding_only:
        dispatch_interactive(s)


def on_interactive_complete(s: SchedulerState, ev: RequestCompleted) -> bool:
    """Release a running interactive request; False when ``ev`` is not one."""
    r = s.interactive.running.pop(ev.request_id, None)
    if r is None:
        return False
    rank = s.ranks.get(r.target_id)
    if rank is not None and r.on_ledger:
        _charge_rank(rank, -r.charged_tokens, -1)
        mark_dirty(s, rank.target_id)
    out = fairness.output_tokens(ev.usage.completion_tokens, r.reserved_output_tokens, ev.success)
    fairness.charge(s.fair, s.prio, r.tenant, output_tokens=out)
    return True


def on_interactive_abandon(s: SchedulerState, rid: RequestId) -> bool:
    """The client left: unqueue the request, or release it as a failed completion."""
    st = s.interactive
    p = st.pending.pop(rid, None)
    if p is not None:
        fairness.leave(s.fair, s.prio, p.tenant, s.now, dispatched=False)
        return True
    if rid in st.running:
        return on_interactive_complete(s, RequestCompleted(rid, False))
    return False


def reject_timed_out_interactive(s: SchedulerState) -> None:
    """At the tick: reject (429) every waiting interactive request whose queue deadline passed."""
    st = s.interactive
    for p in [p for p in st.pending.values() if p.queue_deadline <= s.now]:
        del st.pending[p.request_id]
        st.rejected_count += 1
        fairness.leave(s.fair, s.prio, p.tenant, s.now, dispatched=False)
        s.effects.append(reject(p.request_id, INTERACTIVE_QUEUE_TIMEOUT))


def reject_without_targets_interactive(s: SchedulerState, pool: str) -> None:
    """The pool lost its last target: its waiting interactive requests get a 503."""
    st = s.interactive
    for p in [p for p in st.pending.values() if p.model_pool == pool]:
        del st.pending[p.request_id]
        fairness.leave(s.fair, s.prio, p.tenant, s.now, dispatched=False)
        s.effects.append(reject(p.request_id, NO_TARGETS))


def forget_target_interactive(s: SchedulerState, target: TargetId) -> None:
    """A rank left the topology: its running interactive requests no longer count on its ledger."""
    for r in s.interactive.running.values():
        if r.target_id == target:
            r.on_ledger = False


# ---- dispatch ----------------------------------------------------------------------------------


def _charge_rank(rank: RankState, delta: float, requests: int) -> None:
    rank.interactive_tokens += delta
    rank.interactive_requests += requests
    rank.delta_tokens += delta


def capacity_of(s: SchedulerState, rank: RankState) -> int | None:
    cap = s.cfg.token_capacity_per_dp_rank
    return cap if cap is not None else rank.backend_kv_capacity_tokens


def above(s: SchedulerState, lower: str) -> bool:
    """Is the interactive band above class ``lower`` in ``class_order``?"""
    return s.prio.class_rank(INTERACTIVE) < s.prio.class_rank(lower)


def free_tokens(s: SchedulerState, rank: RankState, capacity: int) -> float:
    """Tokens interactive work may still take on ``rank`` (claims of requests ahead excluded)."""
    used = target_usage(rank, s.now, s.cfg.metrics_interval_seconds) + rank.interactive_claim_tokens
    if not above(s, BATCH):  # below batch: leave it its guaranteed share, as Programs do
        used += rank.batch_claim_tokens
    return capacity * s.cfg.low_watermark_ratio - used


def caps_allow(s: SchedulerState, rank: RankState, need: int, capacity: int | None) -> bool:
    limits = s.prio.interactive
    if limits.max_running_per_rank is not None and rank.interactive_requests >= limits.max_running_per_rank:
        return False
    if capacity is not None and limits.max_kv_share < 1.0 and rank.interactive_requests:
        return rank.interactive_tokens + need <= limits.max_kv_share * capacity
    return True


def _idle(rank: RankState) -> bool:
    return not rank.active and not rank.batch_requests and not rank.interactive_requests


def fits(s: SchedulerState, rank: RankState, need: int) -> bool:
    """Would the interactive request of ``need`` tokens be dispatched on ``rank`` now?"""
    capacity = capacity_of(s, rank)
    if not caps_allow(s, rank, need, capacity):
        return False
    if capacity is None or s.cfg.binding_only:
        return True
    if rank.interactive_claim_tokens == 0 and _idle(rank):
        return True  # a rank running nothing takes a request of any size
    return need <= free_tokens(s, rank, capacity)


def order_key(s: SchedulerState, p: InteractivePending) -> tuple[float, float, int]:
    return (-p.priority, fairness.counter(s.fair, s.prio, p.tenant, s.now), p.seq)


def dispatch_interactive(s: SchedulerState) -> None:
    """Dispatch waiting interactive requests in order; make room or claim a rank for the rest."""
    st = s.interactive
    if st.claimed:
        for rank in s.ranks.values():
            rank.interactive_claim_tokens = 0.0
        st.claimed = False
    if not st.pending:
        return
    waiting = sorted(st.pending.values(), key=lambda p: order_key(s, p))
    for p in waiting:
        # not on a worker a failover's request could not reach while another is a target
        # (docs/program-scheduling.md §9.1)
        ids = allowed_targets(s, p.model_pool, p.avoid_workers)
        ranks = [s.ranks[t] for t in ids if t in s.ranks]
        if not ranks:
            continue
        chosen = _best_fit(s, ranks, p.need_tokens)
        if chosen is None:
            chosen = _make_room(s, ranks, p)
        if chosen is not None:
            _dispatch(s, p, chosen)


def _batch_first(s: SchedulerState, rank: RankState) -> int:
    """The leading term of an interactive request's rank choice: with ranks reserved for
    interactive, the fewest batch requests first (the reserved ranks, which take none), as a
    batch decode in the engine step lengthens the interactive prefill (docs/priority.md §2)."""
    return rank.batch_requests if s.prio.interactive_reserved_ranks else 0


def _best_fit(s: SchedulerState, ranks: list[RankState], need: int) -> RankState | None:
    best: tuple[tuple[int, float, int], RankState] | None = None
    for rank in ranks:
        if not fits(s, rank, need):
            continue
        capacity = capacity_of(s, rank)
        if capacity is None or s.cfg.binding_only:
            score = float(len(rank.active) + rank.batch_requests + rank.interactive_requests)
        else:
            score = -free_tokens(s, rank, capacity)
        key = (_batch_first(s, rank), score, rank.index)
        if best is None or key < best[0]:
            best = (key, rank)
    return best[1] if best is not None else None


def _batch_victims(s: SchedulerState, rank: RankState) -> list[tuple[float, object]]:
    b = s.batch
    if b is None or not s.prio.interactive_preempts_batch or not above(s, BATCH):
        return []
    out = [
        r
        for r in b.running.values()
        if r.target_id == rank.target_id and r.on_ledger and r.pending is not None and r.pending.preemptible
    ]
    out.sort(key=lambda r: (-r.dispatched_at, r.request_id))
    return [(r.charged_tokens, r) for r in out]


def _program_victims(s: SchedulerState, rank: RankState, status: str) -> list[Program]:
    if not s.prio.interactive_pauses_agents or not above(s, AGENT):
        return []
    out = [
        a
        for a in rank.active.values()
        if a.status == status and (a.in_flight == 0 if status == ACTING else not a.pause_when_idle and a.in_flight > 0)
    ]
    out.sort(
        key=lambda a: (
            a.priority,
            -fairness.counter(s.fair, s.prio, a.tenant, s.now),
            -a.charged_tokens,
            a.ref.program_id,
            a.ref.model_pool,
        )
    )
    return out


def _make_room(s: SchedulerState, ranks: list[RankState], p: InteractivePending) -> RankState | None:
    """Make room for ``p`` below its band (module docstring); the rank if it now fits, else None
    (then the request claims the rank where room comes soonest)."""
    need = p.need_tokens
    # a rank where room can be made now (the one that keeps the most free room: least disturbed),
    # else the rank where the most room comes eventually (busy Programs marked to pause)
    best: tuple[tuple[int, int, float, int], RankState, float, float] | None = None
    for rank in ranks:
        capacity = capacity_of(s, rank)
        if capacity is None or not caps_allow(s, rank, need, capacity):
            continue
        free = free_tokens(s, rank, capacity)
        now_relief = sum(t for t, _ in _batch_victims(s, rank))
        now_relief += sum(a.charged_tokens for a in _program_victims(s, rank, ACTING))
        if free + now_relief >= need:
            key = (0, _batch_first(s, rank), -free, rank.index)
        else:
            later = sum(a.charged_tokens for a in rank.active.values() if a.status == REASONING and a.pause_when_idle)
            later += sum(a.charged_tokens for a in _program_victims(s, rank, REASONING))
            key = (1, 0, -(free + now_relief + later), rank.index)
        if best is None or key < best[0]:
            best = (key, rank, free, now_relief)
    if best is None:
        return None
    _, rank, free, now_relief = best
    capacity = capacity_of(s, rank)
    assert capacity is not None
    if free + now_relief >= need:
        for _tokens, r in _batch_victims(s, rank):
            if free_tokens(s, rank, capacity) >= need:
                break
            assert s.batch is not None
            preempt_batch(s, s.batch, r, rank)  # type: ignore[arg-type]
            s.interactive.batch_preemptions += 1
        for a in _program_victims(s, rank, ACTING):
            if free_tokens(s, rank, capacity) >= need:
                break
            pause(s, a, PRIORITY_PREEMPTION)
            s.interactive.program_pauses += 1
        if fits(s, rank, need):
            return rank
    # not enough now: mark busy Programs (lowest first) so that room comes, and claim the rank
    room = free_tokens(s, rank, capacity) + sum(
        a.charged_tokens for a in rank.active.values() if a.status == REASONING and a.pause_when_idle
    )
    for a in _program_victims(s, rank, REASONING):
        if room >= need:
            break
        mark_pause_when_idle(s, a, PRIORITY_PREEMPTION)
        room += a.charged_tokens
    if above(s, AGENT):  # claims hold Programs and batch back: only for a band above both
        rank.interactive_claim_tokens += need
        s.interactive.claimed = True
    return None


def likely_in_prefill(s: SchedulerState, dispatched_at: float, prompt_tokens: float) -> bool:
    """Whether a request dispatched at ``dispatched_at`` is probably still in its prefill: less
    than its cold-prefill estimate (``prefill_cost_model``) plus one decode step ago."""
    window = prefill_seconds(max(0.0, prompt_tokens), s.cfg.prefill_cost_model)
    return s.now - dispatched_at < window + s.cfg.decode_throughput_model.fixed_step_seconds


def headroom_cap(s: SchedulerState) -> int | None:
    """The batch requests one rank may run while interactive traffic is recent (docs/priority.md
    §2, "Headroom for interactive"): ``batch_max_running_near_interactive`` while the latest
    interactive request arrived within ``interactive_window_seconds``, else ``None`` (no cap)."""
    cap = s.prio.batch_max_running_near_interactive
    last = s.interactive.last_arrival
    if cap is None or last is None or s.now - last > s.prio.interactive_window_seconds:
        return None
    return cap


def interactive_prefilling(s: SchedulerState, rank: RankState) -> bool:
    """An interactive request on ``rank`` is probably still in its prefill."""
    return any(
        r.target_id == rank.target_id
        and likely_in_prefill(s, r.dispatched_at, r.charged_tokens - r.reserved_output_tokens)
        for r in s.interactive.running.values()
    )


def _window_open(s: SchedulerState, last: float | None) -> bool:
    return last is not None and s.now - last <= s.prio.interactive_window_seconds


def reserved_ranks(s: SchedulerState, pool: str) -> tuple[TargetId, ...]:
    """The ranks of ``pool`` reserved for interactive now: none when ``interactive_reserved_ranks``
    is 0, when the pool's latest interactive request arrived more than ``interactive_window_seconds``
    ago, or when the pool has no more ranks than that (batch keeps at least one)."""
    k = s.prio.interactive_reserved_ranks
    st = s.interactive
    if not k or not _window_open(s, st.pool_last_arrival.get(pool)):
        return ()
    members = s.pools.get(pool, ())
    if len(members) <= k:
        return ()
    return tuple(t for t in st.reserved.get(pool, ()) if t in members)


def _reserve(s: SchedulerState, pool: str) -> None:
    """An interactive request of ``pool`` arrived: its window (re)opens, and the pool's
    reservation is kept, topped up to ``interactive_reserved_ranks`` with the ranks running the
    fewest batch requests (the least batch work to move away), then the fewest batch tokens, then
    the lowest index."""
    st = s.interactive
    was_open = _window_open(s, st.pool_last_arrival.get(pool))
    st.pool_last_arrival[pool] = s.now
    k = s.prio.interactive_reserved_ranks
    if not k:
        return
    members = [t for t in s.pools.get(pool, ()) if t in s.ranks]
    if len(members) <= k:
        st.reserved.pop(pool, None)
        return
    kept = [t for t in st.reserved.get(pool, ()) if t in members] if was_open else []
    rest = sorted(
        (t for t in members if t not in kept),
        key=lambda t: (s.ranks[t].batch_requests, s.ranks[t].batch_tokens, s.ranks[t].index),
    )
    st.reserved[pool] = tuple(kept + rest[: k - len(kept)])


def _reservation_of(s: SchedulerState, rank: RankState) -> tuple[bool, bool]:
    """(``rank`` is reserved for interactive, ``rank`` is in a pool that has reserved ranks now)."""
    reserved = in_pool = False
    for pool in s.interactive.reserved:
        ids = reserved_ranks(s, pool)
        if ids and rank.target_id in s.pools.get(pool, ()):
            in_pool = True
            reserved = reserved or rank.target_id in ids
    return reserved, in_pool


def batch_held_for_interactive(s: SchedulerState, rank: RankState) -> bool:
    """Whether no batch request may start on ``rank`` now because of interactive traffic
    (docs/priority.md §2): a rank reserved for interactive takes none; the other ranks of a pool
    with reserved ranks run batch without the headroom cap; every other rank runs at most
    ``batch_max_running_near_interactive`` while interactive traffic is recent; and, with either
    rule in force on the rank, none starts there while an interactive request is probably still
    in its prefill."""
    reserved, in_pool = _reservation_of(s, rank)
    if reserved:
        return True
    cap = None if in_pool else headroom_cap(s)
    if cap is not None and rank.batch_requests >= cap:
        return True
    return (in_pool or cap is not None) and interactive_prefilling(s, rank)


def _headroom_preemptions(s: SchedulerState, rank: RankState) -> None:
    """Preempt restartable batch requests on ``rank``, youngest first, down to
    ``batch_max_running_near_interactive`` (all of them on a rank reserved for interactive), and
    every restartable one probably still in its prefill (docs/priority.md §2): an interactive
    request must not queue in the engine behind batch work nor share its prefill steps with a
    batch prefill (on a reserved rank: with any batch work)."""
    if s.batch is None:
        return
    reserved, in_pool = _reservation_of(s, rank)
    cap = 0 if reserved else s.prio.batch_max_running_near_interactive
    if cap is None and not in_pool:
        return
    for _tokens, r in _batch_victims(s, rank):
        assert isinstance(r, BatchRunning) and r.pending is not None
        if (cap is None or rank.batch_requests <= cap) and not likely_in_prefill(
            s, r.dispatched_at, r.pending.prompt_tokens
        ):
            continue
        preempt_batch(s, s.batch, r, rank)
        s.interactive.batch_preemptions += 1


def _dispatch(s: SchedulerState, p: InteractivePending, rank: RankState) -> None:
    st = s.interactive
    del st.pending[p.request_id]
    _headroom_preemptions(s, rank)
    need = p.need_tokens
    capacity = capacity_of(s, rank)
    used = None if capacity is None else capacity * s.cfg.low_watermark_ratio - free_tokens(s, rank, capacity)
    _charge_rank(rank, float(need), 1)
    mark_dirty(s, rank.target_id)
    st.running[p.request_id] = InteractiveRunning(
        request_id=p.request_id,
        tenant=p.tenant,
        priority=p.priority,
        target_id=rank.target_id,
        charged_tokens=float(need),
        reserved_output_tokens=p.reserved_output_tokens,
        dispatched_at=s.now,
    )
    st.admitted_count += 1
    fairness.leave(s.fair, s.prio, p.tenant, s.now, dispatched=True)
    fairness.charge(s.fair, s.prio, p.tenant, input_tokens=p.prompt_tokens)  # output: at completion
    s.effects.append(
        AdmitInteractive(
            request_id=p.request_id,
            target_id=rank.target_id,
            tenant=p.tenant,
            priority=p.priority,
            queue_wait_seconds=s.now - p.arrived_at,
            charged_tokens=need,
            used_tokens=used,
        )
    )
