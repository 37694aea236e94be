"""Targets and backend observations (docs/program-scheduling.md §2, §9, §10).

* :func:`sync_targets` replaces a pool's target list: a new revision fences in-flight scrapes,
  removed ranks lose bindings, queues and statistics, and every Program of the pool whose rank
  vanished is invalidated (``health_failover``), re-bound and, if it waits, re-queued.
* :func:`on_observation_started` / :func:`on_observation` implement the checkpoint-and-rebase
  protocol: the Router ledger is checkpointed when a scrape starts, and the result is dropped
  when the topology changed meanwhile.
* :func:`report_capacity_sources` (run at every tick) reports accounting-source changes once each.
"""

from __future__ import annotations

from actors.core.batch_class import forget_target, reject_without_targets
from actors.core.binding import bind
from actors.core.config import BackendTarget
from actors.core.effects import CapacitySourceChanged, StaleObservationDropped
from actors.core.errors import NO_TARGETS
from actors.core.events import ObservationReceived, ObservationStale, ObservationStarted, TargetsChanged
from actors.core.failover import avoided_by_waiters
from actors.core.ids import TargetId
from actors.core.interactive import forget_target_interactive, reject_without_targets_interactive
from actors.core.ledger import (
    BACKEND_OBSERVATION,
    FRESHNESS_INTERVALS,
    apply_observation,
    capacity_accounting_source,
    rank_counts,
)
from actors.core.lifecycle import (
    cancel_waiting,
    dequeue,
    enqueue,
    invalidate,
    mark_dirty,
    reject,
    restart_freshness_anchor,
    touch,
)
from actors.core.model import ObservationCheckpoint, Program, RankState
from actors.core.resume import schedule_after_change
from actors.core.state import SchedulerState
from actors.core.stats import ProgressTtlFactors

# ---- targets -------------------------------------------------------------------------------------


def rebind(
    s: SchedulerState, p: Program, text: str | None, avoid: frozenset[str], *, left_rank: bool
) -> TargetId | None:
    """Bind ``p`` anew by the binding strategy (``avoid``: workers a failover could not reach) and
    make that rank its home and last rank.  ``left_rank``: it was bound to a rank it has left (the
    rank left the pool, or a failover moves it), so it starts over there as a paused Program."""
    s.binder.release(p.ref.key)
    dequeue(s, p)
    bound = bind(s, p, text, avoid)
    p.home_target = p.last_target = bound
    if left_rank:
        p.paused_at = s.now
        p.pause_when_idle = False
        p.ttl_deadline = None
        p.segment_started_at = None
        restart_freshness_anchor(p, s.now)
    touch(s, p)
    return bound


def sync_targets(s: SchedulerState, pool: str, targets: tuple[BackendTarget, ...]) -> None:
    """Replace the target list of ``pool`` (a new revision; the pool's Programs follow)."""
    sig = tuple(sorted((str(t.target_id), str(t.worker_url), t.shown_dp_rank, int(t.index)) for t in targets))
    if s.pool_signatures.get(pool) == sig:
        return
    s.revision += 1
    s.pool_signatures[pool] = sig
    new_ids = tuple(TargetId(x[0]) for x in sig)
    old_ids = s.pools.get(pool, ())
    s.pools[pool] = new_ids
    for tid, url, dp, idx in sig:
        rank = s.ranks.get(TargetId(tid))
        if rank is None:
            rank = s.ranks[TargetId(tid)] = RankState(
                target_id=TargetId(tid),
                worker_url=url,
                dp_rank=dp,
                index=idx,
                factors=ProgressTtlFactors(s.cfg.stats_window_size),
                # requests dispatched before the target left run on (a flapping worker)
                dispatched=sum(1 for d in s.in_flight.values() if d.target_id == tid),
            )
        else:
            rank.worker_url, rank.dp_rank, rank.index = url, dp, idx
        mark_dirty(s, rank.target_id)
    removed = [t for t in old_ids if t not in new_ids]
    still_used = {t for ids in s.pools.values() for t in ids}
    for t in removed:
        s.binder.remove_target(t)
    present = set(new_ids)
    for p in list(s.programs.values()):
        if p.ref.model_pool != pool or (p.last_target is not None and p.last_target in present):
            continue
        disappeared = p.last_target is not None
        if p.placement is not None and p.placement not in present:
            invalidate(s, p)
        # a failover's exclusion holds (docs/program-scheduling.md §9.1)
        bound = rebind(s, p, None, avoided_by_waiters(s, p), left_rank=disappeared)
        if s.pool.program_len(p.ref):
            if bound is not None:
                enqueue(s, p)
            else:  # the pool has no target left: waiting requests get 503 (retryable), not a leak
                for req in s.pool.requests(p.ref):
                    s.effects.append(reject(req.request_id, NO_TARGETS))
                    cancel_waiting(s, req.request_id)
    for t in removed:
        if t not in still_used:
            forget_target(s, t)
            forget_target_interactive(s, t)
            s.ranks.pop(t, None)
            s.rank_queues.pop(t, None)
            s.dirty_ranks.pop(t, None)
    if not new_ids:
        reject_without_targets(s, pool)
        reject_without_targets_interactive(s, pool)


def report_capacity_sources(s: SchedulerState) -> None:
    """Report each rank whose capacity accounting source changed since the last report (once each)."""
    interval = s.cfg.metrics_interval_seconds
    for t in sorted(s.ranks):
        rank = s.ranks[t]
        src = capacity_accounting_source(rank, s.now, interval)
        prev = rank.reported_capacity_source
        if src != prev:
            if src != BACKEND_OBSERVATION or prev is not None:
                age = s.now - rank.observed_at if rank.observed_at is not None else None
                s.effects.append(
                    CapacitySourceChanged(
                        target_id=t,
                        previous_source=prev,
                        source=src,
                        observation_age_seconds=age,
                        freshness_threshold_seconds=FRESHNESS_INTERVALS * interval,
                    )
                )
            rank.reported_capacity_source = src


def _checkpoint(s: SchedulerState, rank: RankState) -> ObservationCheckpoint:
    rp, rr, rt, at = rank_counts(rank)
    return ObservationCheckpoint(
        revision=s.revision,
        ledger_checkpoint=rank.delta_tokens,
        active_reasoning_programs=rp,
        active_reasoning_requests=rr,
        active_reasoning_private_tokens=rt,
        active_acting_private_tokens=at,
    )


def on_targets_changed(s: SchedulerState, ev: TargetsChanged) -> None:
    """The healthy target list of a pool changed: sync it, then run an admission pass."""
    sync_targets(s, ev.model_pool, ev.targets)
    schedule_after_change(s)


def on_observation_started(s: SchedulerState, ev: ObservationStarted) -> None:
    rank = s.ranks.get(ev.target_id)
    if rank is not None:
        rank.checkpoints[ev.epoch] = _checkpoint(s, rank)


def on_observation(s: SchedulerState, ev: ObservationReceived) -> None:
    rank = s.ranks.get(ev.target_id)
    if rank is None:
        s.effects.append(
            StaleObservationDropped(
                target_id=ev.target_id, epoch=ev.epoch, epoch_revision=-1, current_revision=s.revision
            )
        )
        return
    cp = rank.checkpoints.pop(ev.epoch, None)
    for e in [e for e in rank.checkpoints if e < ev.epoch]:
        del rank.checkpoints[e]
    if cp is None:
        cp = _checkpoint(s, rank)
    if cp.revision != s.revision:
        s.effects.append(
            StaleObservationDropped(
                target_id=ev.target_id, epoch=ev.epoch, epoch_revision=cp.revision, current_revision=s.revision
            )
        )
        return
    observed_at = ev.observed_at if ev.observed_at is not None else s.now
    apply_observation(
        rank,
        cp,
        ev.kv_cache_usage,
        ev.running_requests,
        ev.waiting_requests,
        observed_at,
        s.cfg.token_capacity_per_dp_rank,
    )
    rank.batch_dispatched_since_observation = 0  # the observation's waiting count includes them
    rank.batch_gate_epoch += 1
    if ev.kv_capacity_tokens is not None:
        rank.backend_kv_capacity_tokens = ev.kv_capacity_tokens
    mark_dirty(s, rank.target_id)
    schedule_after_change(s)


def on_observation_stale(s: SchedulerState, ev: ObservationStale) -> None:
    rank = s.ranks.get(ev.target_id)
    if rank is not None:
        rank.observed_at = None
        mark_dirty(s, rank.target_id)
