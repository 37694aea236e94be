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
from actors.core.ledger import Plan, private_tokens
from actors.core.model import PAUSED, Program, RankState
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
    ``cross_rank_move_cost``: ``context`` (the default) and ``resident_room`` the impact of its
    whole private context, ``resident`` the impact of the part its previous rank probably still
    caches (``resident_room`` uses that price only on a destination with room to spare,
    :func:`cheap_move_cost_seconds`, :func:`room_for_returning`)."""
    if s.cfg.cross_rank_move_cost == "resident":
        return own_move_cost_seconds(s, p)
    return p.last_cache_miss_impact_seconds


def cheap_move_cost_seconds(s: SchedulerState, p: Program) -> float | None:
    """The lower patience ``resident_room`` grants on a destination with room to spare (the
    resident price), or None when the move cost has no such second price."""
    if s.cfg.cross_rank_move_cost == "resident_room":
        return own_move_cost_seconds(s, p)
    return None


# a released Program is expected back while it has been gone no longer than this quantile of the
# gaps after its last turn's tools (nearest rank: the longest gap in a window under 100 samples;
# docs/program-scheduling.md §12.1)
EXPECTED_BACK_QUANTILE = 0.99


def expected_back(s: SchedulerState, p: Program) -> bool:
    """``p`` is paused outside any queue and probably comes back: it has been gone no longer than
    (nearly) the longest gap seen after its last turn's tools (:data:`EXPECTED_BACK_QUANTILE`).
    A turn after whose tools no Program ever came back (a task's final answer), or a Program gone
    longer than any gap seen after them, is not counted."""
    if p.state != PAUSED or p.queued_in is not None or not p.expected_resume or p.last_request_finished_at is None:
        return False
    usual = s.tools.usual_gap(p.ref.model_pool, p.last_turn_keys, EXPECTED_BACK_QUANTILE)
    return usual is not None


def returning_tokens(s: SchedulerState, rank: RankState, mover: Program) -> float:
    """The private tokens (context and output reservation) of the Programs that last ran on
    ``rank`` and are expected back soon (:func:`expected_back`): the room they will ask ``rank``
    for when they return."""
    total = 0.0
    for o in s.programs.values():
        if o is not mover and o.last_target == rank.target_id and expected_back(s, o):
            total += private_tokens(o, s.cfg.decode_buffer_tokens)
    return total


def room_for_returning(s: SchedulerState, rank: RankState, plan: Plan, mover: Program) -> bool:
    """True when ``rank``, with the mover admitted by ``plan``, still has room under the low
    watermark for every Program expected back to it (:func:`returning_tokens`): a move there
    takes no room its own Programs will need (docs/program-scheduling.md §12.1)."""
    capacity = s.cfg.token_capacity_per_dp_rank
    if capacity is None:
        return False
    free = capacity * s.cfg.low_watermark_ratio - (plan.used_tokens + plan.required_tokens + plan.reserve_tokens)
    return free >= returning_tokens(s, rank, mover)
