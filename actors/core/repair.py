"""Capacity repair between the watermarks (docs/program-scheduling.md §6).

Runs only with a token capacity ``C``.  For every rank touched since the last repair (in
target-id order) with ``c`` = ceil(mean completion tokens) and ``N`` = Active/Reasoning count::

    projected = max(0, usage + c*N - sum(private(marked)) - c*|marked|)

If ``projected > C * high_watermark_ratio`` the victims are walked until
``projected <= C * low_watermark_ratio``: Acting Programs (nothing in flight) are paused now
(``capacity_repair``); Reasoning Programs with requests in flight and not yet marked get
``pause_when_idle`` (``capacity_repair_mark``), and relieve ``private + c``.  Victims are sorted
by ``score = elapsed_segment * max(0.5, 1/sqrt(max(1e-6, input/mean_prompt)))`` descending,
then private tokens descending, then program id.  Repair is the only path that reclaims
capacity from Active Programs; admission never evicts.

Only "dirty" ranks are examined: a rank whose usage, membership, statistics and Program
statuses did not change since its last repair would reach the same decision again (everything
eligible was already paused or marked), so skipping it is exact and keeps the step O(1).
"""

from __future__ import annotations

import math

from actors.core.effects import Transition
from actors.core.ledger import target_usage
from actors.core.lifecycle import pause, touch
from actors.core.model import ACTING, CAPACITY_REPAIR, REASONING, Program, RankState
from actors.core.state import SchedulerState


def repair_capacity(s: SchedulerState) -> None:
    cfg = s.cfg
    capacity = cfg.token_capacity_per_dp_rank
    if capacity is None or cfg.binding_only:
        s.dirty_ranks.clear()
        return
    dirty = sorted(s.dirty_ranks)
    s.dirty_ranks.clear()
    for target in dirty:
        rank = s.ranks.get(target)
        if rank is not None:
            repair_rank(s, rank, capacity)


def projected_tokens(s: SchedulerState, rank: RankState, c_bar: float) -> float:
    usage = target_usage(rank, s.now, s.cfg.metrics_interval_seconds)
    n = marked = 0
    marked_tokens = 0.0
    for a in rank.active.values():
        if a.status == REASONING:
            n += 1
            if a.pause_when_idle:
                marked += 1
                marked_tokens += a.charged_tokens
    return max(0.0, usage + c_bar * n - marked_tokens - c_bar * marked)


def repair_rank(s: SchedulerState, rank: RankState, capacity: int) -> None:
    cfg = s.cfg
    high = capacity * cfg.high_watermark_ratio
    low = capacity * cfg.low_watermark_ratio
    fac = rank.factors
    has_samples = len(fac.requests) > 0
    c_bar = float(math.ceil(fac.mean_completion_tokens())) if has_samples else 0.0
    usage = target_usage(rank, s.now, cfg.metrics_interval_seconds)
    if usage + c_bar * len(rank.active) <= high:  # upper bound of `projected`: nothing to do
        return
    projected = projected_tokens(s, rank, c_bar)
    if projected <= high:
        return
    p_bar = max(1.0, fac.mean_prompt_tokens()) if has_samples else 1.0
    victims: list[tuple[tuple[object, ...], Program]] = []
    for a in rank.active.values():
        if a.status == ACTING and a.in_flight == 0:
            inp = a.last_context_tokens if a.last_context_tokens is not None else a.estimated_context_tokens
        elif a.status == REASONING and not a.pause_when_idle and a.in_flight > 0:
            inp = a.estimated_context_tokens
        else:
            continue
        elapsed = s.now - a.segment_started_at if a.segment_started_at is not None else 0.0
        score = elapsed * max(0.5, 1.0 / math.sqrt(max(1e-6, inp / p_bar)))
        # lowest priority first (docs/priority.md §1), then the reference's score
        victims.append(((a.priority, -score, -a.charged_tokens, a.ref.program_id, a.ref.model_pool), a))
    victims.sort(key=lambda v: v[0])
    for _, a in victims:
        if projected <= low:
            break
        if a.status == ACTING:
            relief = a.charged_tokens
            pause(s, a, CAPACITY_REPAIR)
        else:
            relief = a.charged_tokens + c_bar
            a.pause_when_idle = True
            a.pause_when_idle_reason = CAPACITY_REPAIR
            touch(s, a)
            s.effects.append(
                Transition(
                    program=a.ref,
                    from_state=a.lifecycle,
                    to_state=a.lifecycle,
                    reason="capacity_repair_mark",
                    target_id=rank.target_id,
                )
            )
        projected = max(0.0, projected - relief)
