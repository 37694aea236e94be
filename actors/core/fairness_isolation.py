"""Isolating light tenants from heavy ones (docs/priority.md §3, "Isolating light tenants").

The tenant counter orders the waiting work and the fair share (``tenant_pause_share``) bounds
the KV a tenant holds on a rank, but neither bounds what a flooding tenant's work costs the
other tenants *inside the engine*: every request of a rank runs in the same engine steps, so a
light tenant's decodes share their steps with the prefills and decodes of every Program the
heavy tenant keeps active there.  This module caps that:

* a tenant is **heavy** in a model pool when its demand there -- the tokens its active Programs
  hold on the pool's ranks plus the private tokens its waiting Programs need -- exceeds its
  weighted fair share of the pool's capacity (``capacity x ranks x weight / sum of the weights of
  the tenants with demand``); every other tenant with demand is **light**.  With fewer than two
  tenants, or no light one, nothing is heavy;
* a rank is **shared with a light tenant** while a light tenant has a Program active on it or
  waiting for it (its ``last_target``), and for ``tenant_isolation_window_seconds`` after that (a
  light agent's Programs come and go between turns and tasks; without the window the heavy
  tenant would refill the rank in every gap and the light tenant's next request would wait for,
  and share its steps with, everything the heavy tenant started meanwhile);
* on such a rank each heavy tenant keeps at most ``heavy_tenant_max_active_per_rank`` Programs
  active: admission refuses more (:func:`allows`), and at the start of every admission pass the
  excess is paused, idle (acting) Programs at once and busy ones marked to pause when their
  request ends (:func:`enforce`; transition reason ``tenant_isolation``).  A forced resume
  overrides the cap, as it overrides every other admission guard.

Every other rank stays work-conserving: a heavy tenant fills it as before, and the cap lifts on
a rank ``tenant_isolation_window_seconds`` after the last light tenant left it (at the next
admission pass).  Only tenants with demand, or present within the window, count: a single tenant
is never capped.
"""

from __future__ import annotations

from actors.core import fairness_prefill
from actors.core.ids import ProgramRef, TargetId
from actors.core.ledger import Plan, private_tokens
from actors.core.lifecycle import is_waiting_candidate, mark_pause_when_idle, pause
from actors.core.model import ACTING, PAUSED, TENANT_ISOLATION, Program, RankState
from actors.core.state import SchedulerState, live_program

# rank -> the heavy tenants of its pool, for every rank shared with a light tenant
IsolationView = dict[TargetId, frozenset[str]]


def enabled(s: SchedulerState) -> bool:
    return (
        s.prio.heavy_tenant_max_active_per_rank is not None
        and s.prio.fairness != "off"
        and s.cfg.token_capacity_per_dp_rank is not None
    )


def _front_output(s: SchedulerState, p: Program) -> int | None:
    front = s.pool.front(p.ref)
    return front.hints.expected_output_length if front is not None else None


def compute(s: SchedulerState, *, record: bool = True) -> IsolationView:
    """The ranks shared with a light tenant and the heavy tenants of their pools (module docstring).

    Also records where each light tenant is present (``SchedulerState.isolation_recent``): a rank
    stays shared with a light tenant for ``tenant_isolation_window_seconds`` after the tenant was
    last present there, and the tenant keeps counting among the tenants with work for that long.
    ``record=False`` leaves that record untouched (a read-only view, for checks)."""
    capacity = s.cfg.token_capacity_per_dp_rank
    if not enabled(s) or capacity is None:
        return {}
    now, window = s.now, s.prio.tenant_isolation_window_seconds
    view: IsolationView = {}
    for pool, targets in s.pools.items():
        if not targets:
            continue
        demand: dict[str, float] = {}
        present: dict[str, set[TargetId]] = {}
        for t in targets:
            rank = s.ranks.get(t)
            if rank is None:
                continue
            for a in rank.active.values():
                demand[a.tenant] = demand.get(a.tenant, 0.0) + a.charged_tokens
                present.setdefault(a.tenant, set()).add(t)
        if s.cfg.global_queue:
            refs: list[ProgramRef] = list(s.global_queues.get(pool, ()))
        else:
            refs = [r for t in targets for r in s.rank_queues.get(t, ())]
        for ref in refs:
            p = live_program(s, ref)
            if p is None or not is_waiting_candidate(s, p):
                continue
            need = private_tokens(p, s.cfg.decode_buffer_tokens, _front_output(s, p))
            demand[p.tenant] = demand.get(p.tenant, 0.0) + need
            if p.last_target in targets:
                present.setdefault(p.tenant, set()).add(p.last_target)
        recent = s.isolation_recent.setdefault(pool, {}) if record else dict(s.isolation_recent.get(pool, {}))
        for key in [key for key, seen in recent.items() if now - seen >= window]:
            del recent[key]
        calls = s.isolation_tool_calls.get(pool)
        if calls:
            limit = s.prio.tenant_isolation_tool_call_seconds
            for ref, (name, t, ended) in list(calls.items()):
                p = live_program(s, ref)
                if p is None or now - ended > limit or t not in targets:
                    if record:
                        del calls[ref]
                    continue
                present.setdefault(name, set()).add(t)  # in a tool call: back on t soon
                if p.state == PAUSED and p.status == ACTING:
                    # paused through its tool call: its context is demand all the same (without
                    # it a heavy tenant whose Programs are all between turns would look light)
                    demand[name] = demand.get(name, 0.0) + private_tokens(p, s.cfg.decode_buffer_tokens)
        tenants = set(demand) | set(present) | {name for name, _t in recent}
        if len(tenants) < 2:
            heavy: frozenset[str] = frozenset()
        else:
            weights = {name: s.prio.weight(name) for name in tenants}
            unit = capacity * len(targets) / sum(weights.values())  # the pool's fair share per unit of weight
            heavy = frozenset(name for name, d in demand.items() if d > unit * weights[name])
        for name, ranks in present.items():
            if name not in heavy:
                for t in ranks:
                    recent[(name, t)] = now  # a copy when not recording
        kept: dict[TargetId, set[str]] = {}
        if heavy and any(name not in heavy for name in tenants):
            for name, t in recent:
                if name not in heavy:
                    view[t] = heavy
                    kept.setdefault(t, set()).add(name)
        if record:
            for t in targets:
                rank = s.ranks.get(t)
                if rank is not None:
                    rank.isolated_for = frozenset(kept.get(t, ()))
    return view


def observe_return(s: SchedulerState, p: Program) -> None:
    """Program ``p`` sends its next request: it is back from its tool call (its own presence
    counts from now on)."""
    calls = s.isolation_tool_calls.get(p.ref.model_pool)
    if calls:
        calls.pop(p.ref, None)


def observe_completion(s: SchedulerState, p: Program, target: TargetId, ev_finish_reason: str | None, ok: bool) -> None:
    """A request of ``p`` on ``target`` ended.  When the Program will send a next turn (it
    expects to resume and the request did not end in a natural ``stop``: a tool call, or a
    truncated reply it continues), it is *between turns*: it keeps its tenant present on the rank
    until it is back, for at most ``tenant_isolation_tool_call_seconds``, and its context counts
    in its tenant's demand.  So a light tenant's rank stays its own through its tool calls instead
    of being refilled by the heavy tenant a window after the request ended, just before the light
    tenant comes back to it; and a heavy tenant whose Programs are all between turns (paused by
    the isolation itself) still counts as heavy, instead of looking light for a moment and being
    let back onto the light tenant's ranks.  A natural stop or a failure promises no next turn."""
    limit = s.prio.tenant_isolation_tool_call_seconds
    if not enabled(s) or limit <= 0:
        return
    calls = s.isolation_tool_calls.setdefault(p.ref.model_pool, {})
    if ok and p.expected_resume and ev_finish_reason != "stop":
        calls[p.ref] = (p.tenant, target, s.now)
    else:
        calls.pop(p.ref, None)


def current(s: SchedulerState) -> IsolationView:
    """The view of the admission pass in progress, else a fresh one."""
    return s.isolation if s.isolation is not None else compute(s)


def _capped(rank: RankState, tenant: str) -> list[Program]:
    """The tenant's Programs active on ``rank`` that stay there (not already marked to pause)."""
    return [a for a in rank.active.values() if a.tenant == tenant and not a.pause_when_idle]


def allows(s: SchedulerState, p: Program, rank: RankState, plan: Plan) -> bool:
    """Admission: a heavy tenant's Program joins a rank shared with a light tenant only below the cap."""
    if plan.forced:
        return True
    if not fairness_prefill.allows(s, p, rank):
        return False  # one long prefill at a time per rank (fairness_prefill)
    if not enabled(s):
        return True
    heavy = current(s).get(rank.target_id)
    if not heavy or p.tenant not in heavy:
        return True
    cap = s.prio.heavy_tenant_max_active_per_rank
    assert cap is not None
    return len(_capped(rank, p.tenant)) < cap


def enforce(s: SchedulerState, view: IsolationView) -> None:
    """Pause (idle) or mark (busy) each heavy tenant's Programs beyond the cap on every rank shared
    with a light tenant: idle ones first, then the largest, then the most recently activated."""
    cap = s.prio.heavy_tenant_max_active_per_rank
    if cap is None:
        return
    for target in sorted(view):
        rank = s.ranks.get(target)
        if rank is None:
            continue
        for tenant in sorted(view[target]):
            mine = _capped(rank, tenant)
            excess = len(mine) - cap
            if excess <= 0:
                continue
            order = {a.ref: i for i, a in enumerate(rank.active.values())}

            def key(a: Program, order: dict[ProgramRef, int] = order) -> tuple[object, ...]:
                idle = a.status == ACTING and a.in_flight == 0
                return (not idle, -a.charged_tokens, -order[a.ref], a.ref.program_id)

            for a in sorted(mine, key=key)[:excess]:
                if a.status == ACTING and a.in_flight == 0:
                    pause(s, a, TENANT_ISOLATION)
                else:
                    mark_pause_when_idle(s, a, TENANT_ISOLATION)
