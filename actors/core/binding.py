"""Initial binding of a new Program generation: the candidates and the strategy call.

``bind`` asks the :class:`~actors.core.placement.Binder` for the home rank of a Program
(docs/program-scheduling.md §9).  The hash and round-robin strategies need only the sorted
target ids; the others get one :class:`~actors.core.placement.Candidate` per target of the pool,
with the Programs accounted to it and its KV pressure.  A failover's exclusion
(``avoid``: workers its request could not reach, docs/program-scheduling.md §9.1) removes those
workers' targets from the choice while another target is left (:func:`~actors.core.failover.allowed_targets`).
"""

from __future__ import annotations

from actors.core.failover import allowed_targets
from actors.core.ids import TargetId
from actors.core.ledger import private_tokens, target_usage
from actors.core.model import ACTIVE, PAUSED, REASONING, Program
from actors.core.placement import Candidate
from actors.core.state import SchedulerState


def binding_candidates(
    s: SchedulerState, pool: str, p: Program, among: tuple[TargetId, ...] | None = None
) -> list[Candidate]:
    """One candidate per target of ``pool`` (of ``among`` when given)."""
    cfg = s.cfg
    cap = cfg.token_capacity_per_dp_rank
    low = cap * cfg.low_watermark_ratio if cap is not None else None
    ids = s.pools.get(pool, ()) if among is None else among
    per: dict[TargetId, list[float]] = {t: [0, 0.0, 0.0] for t in ids}
    for o in s.programs.values():
        target = o.last_target
        if o is p or target is None or target not in per:
            continue
        acc = per[target]
        if o.state == ACTIVE or o.status == REASONING:
            acc[0] += 1
            acc[1] += private_tokens(o, cfg.decode_buffer_tokens)
        if o.state == PAUSED and o.status == REASONING and o.completed_requests == 0 and s.pool.program_len(o.ref):
            acc[2] += private_tokens(o, cfg.decode_buffer_tokens)
    out = []
    for t, (n, tokens, pending) in per.items():
        rank = s.ranks[t]
        usage = target_usage(rank, s.now, cfg.metrics_interval_seconds)
        if cap is None:
            pressure = 0.0
        elif cap:
            pressure = min(1.0, max(0.0, (usage + pending) / cap))
        else:
            pressure = 1.0
        admissible = len(rank.active) + 1 <= cfg.max_active_programs_per_target and (
            low is None or usage + p.estimated_context_tokens + cfg.decode_buffer_tokens <= low
        )
        out.append(
            Candidate(
                target_id=t,
                accounted_programs=int(n),
                accounted_tokens=tokens,
                capacity_tokens=cap,
                kv_pressure=pressure,
                immediately_admissible=admissible,
            )
        )
    return out


def bind(s: SchedulerState, p: Program, text: str | None, avoid: frozenset[str] = frozenset()) -> TargetId | None:
    """The home rank of ``p`` (None when its pool has no target), not on a worker of ``avoid``
    while the pool has a target of another worker (docs/program-scheduling.md §9.1)."""
    hash_key = p.placement_hash_key or p.ref.program_id
    pool = p.ref.model_pool
    among = allowed_targets(s, pool, avoid) if avoid else None
    if s.binder.strategy in ("consistent_hash", "program_round_robin"):  # no per-target accounting needed
        return s.binder.bind_ids(p.ref.key, hash_key, s.pools.get(pool, ()) if among is None else among)
    cands = binding_candidates(s, pool, p, among)
    return s.binder.bind(p.ref.key, hash_key, cands, text)
