"""One long prefill at a time per rank (docs/priority.md §3, "One long prefill at a time per rank").

A non-preemptive engine serves a request that arrives behind a running prefill only once that
prefill is done, and a long-context prefill (tens of thousands of uncached tokens) takes seconds.
Two such prefills admitted together on one rank share the engine's token budget step by step, so
both finish at about the time the second alone would: whatever arrives meanwhile -- a light
tenant's first request, above all -- waits for the pair.  One at a time, the first finishes at
about half that time and a newcomer waits for at most one of them; the engine's work (and so the
throughput) is the same, as a long prefill fills the step's token budget on its own.

With ``long_prefill_seconds > 0``: a Program dispatch whose uncached prompt is estimated (at the
cost model of ``prefill_cost_model``) to take longer than that marks its rank busy with a long
prefill until its estimated end (or its completion, whichever is first), and a Program whose next
request would be such a prefill is not admitted on a rank so marked (a forced resume overrides
this, like every admission guard).  Short requests are never held.
"""

from __future__ import annotations

from actors.core.costs import prefill_seconds
from actors.core.ids import RequestId, TargetId
from actors.core.model import Program, RankState
from actors.core.state import SchedulerState


def uncached_tokens(p: Program, target: TargetId, context_tokens: float) -> float:
    """The prompt tokens the engine is expected to compute for ``p``'s next request on ``target``:
    beyond its previous context when it ran there last (its KV is likely still cached), else
    beyond its shared prefix."""
    if p.last_target == target and p.last_context_tokens is not None:
        cached = p.last_context_tokens
    else:
        cached = p.shared_prefix_tokens
    return max(0.0, context_tokens - cached)


def _seconds(s: SchedulerState, tokens: float) -> float:
    return prefill_seconds(tokens, s.cfg.prefill_cost_model)


def busy(s: SchedulerState, rank: RankState) -> bool:
    marker = rank.long_prefill
    return marker is not None and marker[1] > s.now


def allows(s: SchedulerState, p: Program, rank: RankState) -> bool:
    """Admission: a Program whose next request is a long prefill waits while another one runs on ``rank``."""
    limit = s.prio.long_prefill_seconds
    if limit <= 0 or not busy(s, rank):
        return True
    return _seconds(s, uncached_tokens(p, rank.target_id, p.estimated_context_tokens)) <= limit


def on_dispatch(s: SchedulerState, p: Program, rank: RankState, rid: RequestId, context_tokens: float) -> None:
    """Request ``rid`` of ``p`` goes to ``rank`` (called before the dispatch moves ``p``'s record)."""
    limit = s.prio.long_prefill_seconds
    if limit <= 0:
        return
    secs = _seconds(s, uncached_tokens(p, rank.target_id, context_tokens))
    if secs > limit:
        start = rank.long_prefill[1] if busy(s, rank) and rank.long_prefill is not None else s.now
        rank.long_prefill = (rid, start + secs)


def on_complete(rank: RankState, rid: RequestId) -> None:
    """Request ``rid`` ended on ``rank``: its prefill is certainly over."""
    if rank.long_prefill is not None and rank.long_prefill[0] == rid:
        rank.long_prefill = None
