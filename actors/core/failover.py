"""A failover's exclusion: the workers a request could not reach (docs/program-scheduling.md §9.1).

A request nothing was sent of (its connect was refused, unresolvable or timed out) is submitted
again by the shell with ``RequestSubmitted.avoid_workers``: the workers it failed on in its
lifetime (docs/operations.md §11.2).  Usually they have left the pool's targets by then (ejected,
or suspect beside a worker in rotation) and the target change already moved the Program
(``topology.sync_targets``).  When every worker left in rotation is suspect, the one the request
failed on is still a target, and the Program's own rank is on it: arrival then moves the
Program off it as a target change would (``arrival.steer_off``), to a target of another worker
while the pool has one.

This module holds what the other steps need of it:

* :func:`allowed_targets`: a pool's targets off the avoided workers (all of them when that leaves
  none: an exclusion never turns a servable request into a refusal);
* :func:`avoided_by_waiters`: the workers the waiting requests of a Program avoid (a cross-rank
  move and a re-binding after a target change honour them);
* :func:`give_back_unserved_move`: a Program the exclusion moved that goes idle without a
  successful completion since (the retry failed too, or was refused or abandoned) is bound again
  to the rank it left, so a failed failover leaves it where it was, as without the exclusion.
  A successful completion on its new rank keeps the move (``failover_from`` is cleared).
"""

from __future__ import annotations

from actors.core.ids import TargetId
from actors.core.model import ACTIVE, Program
from actors.core.state import SchedulerState


def allowed_targets(s: SchedulerState, pool: str, avoid: frozenset[str]) -> tuple[TargetId, ...]:
    """The targets of ``pool`` (sorted) whose worker is not in ``avoid``; all of them when that
    leaves none."""
    ids = s.pools.get(pool, ())
    if not avoid:
        return ids
    kept = tuple(t for t in ids if s.ranks[t].worker_url not in avoid)
    return kept or ids


def avoided_by_waiters(s: SchedulerState, p: Program) -> frozenset[str]:
    """The union of the ``avoid_workers`` of ``p``'s waiting requests (empty almost always).

    A request that avoids every worker of the pool's targets adds nothing: its exclusion is
    dropped (:func:`allowed_targets`), so it must not undo another waiter's exclusion either."""
    out: frozenset[str] = frozenset()
    workers: set[str] | None = None  # the pool's, computed only when a waiter has an exclusion
    for req in s.pool.requests(p.ref):
        if not req.avoid_workers:
            continue
        if workers is None:
            workers = {s.ranks[t].worker_url for t in s.pools.get(p.ref.model_pool, ())}
        if not workers <= req.avoid_workers:
            out |= req.avoid_workers
    return out


def give_back_unserved_move(s: SchedulerState, p: Program) -> None:
    """``p`` is idle (nothing in flight or waiting) after a failure or a cancellation: when an
    exclusion moved it and no request of it succeeded since, it is bound again to the rank it left
    (its home and last rank, and the binding table), if that rank is still a target of its pool.
    The move is forgotten either way.  A Program that is not idle is left alone (the caller
    checks; its move is settled by its next completion)."""
    back = p.failover_from
    if back is None or p.state == ACTIVE or p.in_flight or s.pool.program_len(p.ref):
        return
    p.failover_from = None
    if back == p.last_target or back not in s.pools.get(p.ref.model_pool, ()):
        return
    p.home_target = p.last_target = back
    s.binder.restore(p.ref.key, back)
    s.touched.setdefault(p.ref, p)
