"""Where a released Program's KV probably still is (docs/program-scheduling.md §12.1).

An engine with prefix caching frees a finished request's blocks to the tail of an LRU free queue
and evicts from the head when it allocates, so a Program's context stays cached on its rank until
the rank has allocated more new blocks than were free ahead of it when its last request finished
(deepest blocks first: the prefix survives longest).  agentd does not see the engine's block
table; it counts what each rank allocated from the usage every completion reports (uncached
prompt tokens plus completion tokens) and, at a Program's completion, how much of the rank was
free ahead of it (the KV size less the contexts of the requests still running there).  Then

    resident(p) = max(0, context - max(0, allocated since - free ahead))

is the prefix its previous rank probably still holds, and moving it elsewhere costs the recompute
of that resident part only (what the rest costs, it pays wherever it resumes).

Pure functions over the scheduler state (no I/O, no clock).
"""

from __future__ import annotations

from actors.core.costs import cache_miss_impact_seconds
from actors.core.model import Program, RankState
from actors.core.state import SchedulerState


def engine_kv_tokens(s: SchedulerState, rank: RankState) -> float | None:
    """The rank's engine KV in tokens: the backend's report, else the configured capacity."""
    if rank.backend_kv_capacity_tokens is not None:
        return float(rank.backend_kv_capacity_tokens)
    cap = s.cfg.token_capacity_per_dp_rank
    return float(cap) if cap is not None else None


def note_completion(s: SchedulerState, p: Program, rank: RankState, prompt: int, cached: int, completion: int) -> None:
    """Count a completed Program request's allocation on ``rank`` and remember, for ``p``, the
    rank's allocation counter and the KV free ahead of its blocks at this moment.  Nothing is
    kept while no decision reads it (``cross_rank_move_cost = "context"``, the default)."""
    if s.cfg.cross_rank_move_cost == "context":
        return
    rank.allocated_tokens += max(0, prompt - cached) + max(0, completion)
    kv = engine_kv_tokens(s, rank)
    if kv is None:
        p.residency_mark = None
        return
    running = rank.batch_tokens + rank.interactive_tokens
    for a in rank.active.values():
        if a is not p and a.in_flight > 0:
            running += a.estimated_context_tokens
    own = prompt + completion
    p.residency_mark = (rank.target_id, rank.allocated_tokens, max(0.0, kv - running - own))


def resident_tokens(s: SchedulerState, p: Program) -> int | None:
    """The prefix of ``p``'s context its previous rank probably still caches (None: unknown)."""
    mark = p.residency_mark
    if mark is None or p.last_context_tokens is None:
        return None
    target, allocated_at, free_ahead = mark
    rank = s.ranks.get(target)
    if rank is None:
        return 0
    context = p.last_context_tokens + p.last_completion_tokens
    evicted = max(0.0, rank.allocated_tokens - allocated_at - free_ahead)
    return max(0, int(context - evicted))


def _private_impact(s: SchedulerState, p: Program, resident: int) -> float:
    private = max(0, resident - p.shared_prefix_tokens)
    return cache_miss_impact_seconds(private, s.cfg.prefill_cost_model) if private else 0.0


def own_move_cost_seconds(s: SchedulerState, p: Program) -> float:
    """What moving ``p`` off its previous rank costs it in recompute: the impact of the private
    part of its still-resident prefix (docs/program-scheduling.md §7 patience, §12.1); the impact
    of its whole private context when the residency is unknown."""
    resident = resident_tokens(s, p)
    if resident is None:
        return p.last_cache_miss_impact_seconds
    return _private_impact(s, p, resident)


def move_cost_seconds(s: SchedulerState, p: Program) -> float:
    """The patience of a cross-rank resume of ``p`` (docs/program-scheduling.md §7, §12.1) under
    ``cross_rank_move_cost``: ``context`` the impact of its whole private context (the default),
    ``resident`` the impact of the part its previous rank probably still caches."""
    if s.cfg.cross_rank_move_cost == "resident":
        return own_move_cost_seconds(s, p)
    return p.last_cache_miss_impact_seconds
