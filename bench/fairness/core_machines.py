"""Hypothesis state machines over the pure core: classes, priorities and tenant fairness
(docs/priority.md §4).

Two machines drive ``actors.core.scheduler.step`` the way the Trio shell does (virtual time, the
Program actors' timers delivered in (deadline, token) order, a ``RepairTick`` on the metrics grid):

:class:`ClassesMachine`
    Programs (``agent``), ``interactive`` and ``batch`` requests of several tenants and priorities
    on two ranks.  After every step (``CHECKS`` selects which):

    * ``capacity``: every admission decision -- a non-forced Program admission (its
      ``Transition``), an interactive dispatch (``AdmitInteractive.used_tokens``) -- fits the rank's
      ``capacity x low_watermark_ratio``, or the rank ran nothing and takes one oversized request;
      ``invariants.check`` is clean (ledgers, class charges, tenant accounts);
    * ``conservation``: every submitted request is in exactly one of waiting / in flight / done, and
      the core's queues and in-flight tables agree with the machine's;
    * ``priority_inversion``: no lower-class admission (a non-forced Program, a batch request
      outside its starvation escape) took room on a rank where an interactive request still
      waiting at the end of the step would have fitted without it, and no interactive request
      was dispatched while a waiting one ahead of it (priority, then tenant counter) would have
      fitted in its place -- at most the one dispatch that was under way when the waiter arrived;
      and, with ``interactive_reserved_ranks = k``, while an interactive request arrived within
      ``interactive_window_seconds`` the core keeps exactly ``k`` ranks of the pool reserved
      (none when the pool has no more than ``k``) and no batch request is dispatched on one;
    * ``work_conservation``: no interactive request waits while a rank nobody claimed has the
      room and the class caps for it;
    * ``starvation``: no Program waits past its force-resume deadline plus one tick, and no
      interactive request past its queue deadline plus one tick;
    * ``kv_rent``: each tenant's KV rent equals the machine's own integral of the tokens its idle
      (Active/Acting) Programs hold over time, and each counter equals its charges over its
      weight plus its lifts;
    * ``isolation`` (with ``heavy_tenant_max_active_per_rank``, docs/priority.md §3 "Isolating
      light tenants"): the heavy tenants are exactly those the machine computes itself from the
      state (demand = tokens held by active Programs + private tokens of waiting ones, against the
      weighted share of the pool among the tenants with demand or seen within the window); every
      ``tenant_isolation`` pause or mark hits a tenant that was heavy on that rank at the pass;
      and after a pass whose view still holds at the end of the step, no heavy tenant keeps more
      than the cap of unmarked Programs on a rank shared with a light tenant (forced resumes
      excepted).  Run with ``tenant_pause_share`` and the headroom for interactive on as well,
      the other checks cover those rules (their admissions and pauses must keep capacity,
      conservation, the starvation bounds and the rent exact).

:class:`VtcBoundMachine`
    Interactive requests of one size from three tenants of equal weight on one rank.  While two
    tenants are both continuously backlogged, the difference of the service they receive (their
    charges, lifts excluded) stays within ``2 x (U + M x R)``: ``U`` the charge of one dispatch (its
    prompt), ``R`` the largest charge of one completion (its output), ``M`` the most requests one
    tenant can have in flight (docs/priority.md §4 derives it).

``MACHINES`` lists ``(property name, factory)``; ``factory(cfg)`` returns the machine class for a
daemon configuration (``program_scheduling``, ``batch_jobs``, ``priority`` attributes, each
optional) or for ``None`` (the defaults).  ``agentd check-fairness`` runs them;
``property_tests/test_fairness_machines.py`` runs them with a small deterministic budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis import target
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from actors.core import fairness, fairness_isolation, invariants
from actors.core.config import BackendTarget, BatchJobsConfig, PriorityConfig, ProgramSchedulingConfig
from actors.core.effects import (
    Admit,
    AdmitBatch,
    AdmitInteractive,
    ArmTimer,
    CancelTimer,
    PreemptBatch,
    Reject,
    RequeuePrefill,
    RetireProgram,
    Transition,
)
from actors.core.events import (
    BatchSubmitted,
    InteractiveSubmitted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestRequeued,
    RequestSubmitted,
    TargetsChanged,
    TimerFired,
)
from actors.core.fairness_sync import held_tokens
from actors.core.ids import DEFAULT_MODEL_POOL, RequestId, TargetId
from actors.core.ledger import private_tokens
from actors.core.lifecycle import is_waiting_candidate
from actors.core.model import MAX_PREFILL_REQUEUES, PAUSED, ProgramIdentity, RequestHints, Usage
from actors.core.scheduler import initial_state, step
from actors.core.state import SchedulerState

POOL = DEFAULT_MODEL_POOL
TENANTS = ("tenant-a", "tenant-b", "tenant-c")
PRIORITIES = (-1, 0, 2)
DEFAULT_CAPACITY = 4000
EPS = 1e-6
ADMIT_REASONS = ("program_admit", "batch_gain_admit", "force_resume")

ALL_CHECKS = frozenset(
    {"capacity", "conservation", "priority_inversion", "work_conservation", "starvation", "kv_rent", "isolation"}
)


def identity(program_id: str) -> ProgramIdentity:
    return ProgramIdentity(
        program_id=program_id,
        task_id=None,
        session_id=None,
        agent_id=None,
        parent_program_id=None,
        root_program_id=None,
        blocks_parent=False,
        expected_resume=True,
        agent_role=None,
        spawn_reason=None,
        step_id=None,
        source="agentic_context",
        placement_key=program_id,
        placement_hash_key=program_id,
    )


# ---- configuration ------------------------------------------------------------------------------


def core_configs(cfg: Any) -> tuple[ProgramSchedulingConfig, BatchJobsConfig, PriorityConfig]:
    """The core's three configs from a daemon configuration (or None): Program scheduling with a
    token capacity (the machines need one: ``DEFAULT_CAPACITY`` when unset) and never
    ``binding_only``, batch (enabled, so the batch class is exercised), priorities
    (``cfg.priority.core()`` when the edge extends it)."""
    ps = getattr(cfg, "program_scheduling", None)
    if not isinstance(ps, ProgramSchedulingConfig):
        ps = ProgramSchedulingConfig()
    if ps.token_capacity_per_dp_rank is None:
        ps = attrs.evolve(ps, token_capacity_per_dp_rank=DEFAULT_CAPACITY)
    ps = attrs.evolve(ps, binding_only=False)  # binding_only takes no admission decision to check
    batch = getattr(cfg, "batch_jobs", None)
    if not isinstance(batch, BatchJobsConfig):
        batch = BatchJobsConfig()
    batch = attrs.evolve(batch, enabled=True)
    prio = getattr(cfg, "priority", None)
    core = getattr(prio, "core", None)
    if callable(core):
        prio = core()
    if not isinstance(prio, PriorityConfig):
        prio = PriorityConfig()
    return ps, batch, prio


# ---- the classes machine ----------------------------------------------------------------------


@attrs.define
class Tracked:
    kind: str  # "agent" | "interactive" | "batch"
    tenant: str
    status: str = "waiting"  # waiting | in_flight | done


class ClassesMachine(RuleBasedStateMachine):
    """Programs, interactive and batch requests of several tenants (module docstring)."""

    PROGRAM_CFG: ProgramSchedulingConfig = ProgramSchedulingConfig(token_capacity_per_dp_rank=DEFAULT_CAPACITY)
    BATCH_CFG: BatchJobsConfig = BatchJobsConfig(enabled=True)
    PRIO_CFG: PriorityConfig = PriorityConfig()
    CHECKS: frozenset[str] = ALL_CHECKS
    RANKS = 2

    def __init__(self) -> None:
        super().__init__()
        self.cfg = self.PROGRAM_CFG
        self.state: SchedulerState = initial_state(self.cfg, self.BATCH_CFG, self.PRIO_CFG)
        self.capacity = self.cfg.token_capacity_per_dp_rank or DEFAULT_CAPACITY
        self.tick = self.cfg.metrics_interval_seconds
        self.now = 0.0
        self.next_tick = self.tick
        self.timers: dict[tuple[Any, str], tuple[float, int]] = {}
        self.requests: dict[str, Tracked] = {}
        self.n = 0
        self.interactive_at: float | None = None  # the latest interactive submission
        self.rent: dict[str, float] = {}
        self.held: dict[str, float] = {}
        self.rent_at = 0.0
        self.forced: set[Any] = set()  # Programs whose current admission was a forced resume
        # long prefills asked back (docs/priority.md §3, "Re-queueing a blocking long prefill"):
        # requests asked in their current dispatch, asked and not yet answered, taken back, dispatched
        # by a forced resume
        self.asked: set[str] = set()
        self.asks_open: set[str] = set()
        self.requeued: set[str] = set()
        self.requeue_counts: dict[str, int] = {}  # take-backs per request (at most MAX_PREFILL_REQUEUES)
        self.forced_rids: set[str] = set()
        self.asks_count = 0

    @initialize()
    def targets(self) -> None:
        ts = tuple(BackendTarget("http://w", i, f"http://w@{i}", i) for i in range(self.RANKS))
        self._step(TargetsChanged(POOL, ts))

    # ---- driving ----------------------------------------------------------------------------

    def _tokens(self, frac: float) -> int:
        return max(1, int(frac * self.capacity))

    def _rid(self, kind: str, tenant: str) -> RequestId:
        self.n += 1
        rid = f"{kind[0]}{self.n}"
        self.requests[rid] = Tracked(kind, tenant)
        return RequestId(rid)

    def _deliver_due(self) -> None:
        for _ in range(10_000):
            due = sorted((d, tok, key) for key, (d, tok) in self.timers.items() if d <= self.now)
            if not due:
                return
            _, token, key = due[0]
            del self.timers[key]
            self._apply(TimerFired(key[0], key[1], token))
        raise AssertionError("timers keep re-arming in the past")

    def _step(self, event: object) -> None:
        self._deliver_due()
        self._apply(event)
        self._deliver_due()

    def _apply(self, event: object) -> None:
        s = self.state
        # KV rent: what the tenants' idle Programs held since the last step, held until now
        for tenant, tokens in self.held.items():
            self.rent[tenant] = self.rent.get(tenant, 0.0) + tokens * (self.now - self.rent_at)
        self.rent_at = self.now
        before: dict[str, float] = {str(tid): self._usage(tid) for tid in s.ranks}
        result = step(s, event, now=self.now, cfg=self.cfg)
        forced_now: set[Any] = set()
        admitted_now: set[str] = set()  # dispatched in this step (their status moves below)
        for e in result.effects:
            if isinstance(e, Admit):
                self.asked.discard(e.request_id)  # a new dispatch: it may be asked once more
                admitted_now.add(e.request_id)
            if isinstance(e, Transition) and e.reason in ADMIT_REASONS and e.forced:
                forced_now.add(e.program)
            elif isinstance(e, Admit) and e.program in forced_now:
                forced_now.discard(e.program)  # the request the forced resume was for
                self.forced_rids.add(e.request_id)
            elif isinstance(e, RequeuePrefill):
                self._check_requeue_ask(e, admitted_now)
        for e in result.effects:
            if isinstance(e, ArmTimer):
                self.timers[(e.program, e.kind)] = (e.deadline, e.token)
            elif isinstance(e, CancelTimer):
                self.timers.pop((e.program, e.kind), None)
            elif isinstance(e, RetireProgram):
                for key in [k for k in self.timers if k[0] == e.program]:
                    del self.timers[key]
            elif isinstance(e, (Admit, AdmitInteractive, AdmitBatch)):
                self._move(e.request_id, "waiting", "in_flight")
            elif isinstance(e, PreemptBatch):
                self._move(e.request_id, "in_flight", "waiting")
            elif isinstance(e, Reject):
                self._move(e.request_id, "waiting", "done")
        for e in result.effects:
            if isinstance(e, Transition) and e.reason in ADMIT_REASONS:
                if e.forced:
                    self.forced.add(e.program)
                else:
                    self.forced.discard(e.program)
        self.held = {}
        for p in s.programs.values():
            h = held_tokens(p)
            if h:
                self.held[p.tenant] = self.held.get(p.tenant, 0.0) + h
        self._check_step(result.effects, before)

    def _check_requeue_ask(self, e: RequeuePrefill, admitted_now: set[str]) -> None:
        """Bounded re-queueing: a request is asked back at most once per dispatch, never after it
        was taken back ``MAX_PREFILL_REQUEUES`` times, never when a forced resume dispatched it,
        only while in flight."""
        rid = e.request_id
        if "conservation" in self.CHECKS:
            assert rid not in self.asked, f"{rid} asked back twice in one dispatch"
            taken = self.requeue_counts.get(rid, 0)
            assert taken < MAX_PREFILL_REQUEUES, f"{rid} asked back after {taken} take-backs"
            assert rid not in self.forced_rids, f"{rid} asked back although a forced resume dispatched it"
            r = self.requests.get(rid)
            in_flight = r is not None and (r.status == "in_flight" or rid in admitted_now)
            assert in_flight, f"{rid} asked back while not in flight"
            assert e.tenant not in e.light_tenants, f"{rid}: its own tenant is among those it blocks"
        self.asked.add(rid)
        self.asks_open.add(rid)
        self.asks_count += 1

    def _move(self, rid: str, frm: str, to: str) -> None:
        r = self.requests.get(rid)
        assert r is not None, f"effect for unknown request {rid}"
        if "conservation" in self.CHECKS:
            assert r.status == frm, f"{rid}: {r.status} -> {to}, expected from {frm}"
        r.status = to

    def _usage(self, tid: str) -> float:
        rank = self.state.ranks[TargetId(tid)]  # no observations: the Router ledger
        return rank.fallback_tokens + rank.batch_tokens + rank.interactive_tokens

    def _capped(self, tid: str, need: int, without: float | None = None) -> bool:
        """Do the interactive class caps keep a request of ``need`` tokens off rank ``tid`` (``without``
        one running interactive request of that charge)?"""
        rank = self.state.ranks[TargetId(tid)]
        limits = self.state.prio.interactive
        running, tokens = rank.interactive_requests, rank.interactive_tokens
        if without is not None:
            running, tokens = running - 1, tokens - without
        if limits.max_running_per_rank is not None and running >= limits.max_running_per_rank:
            return True
        return bool(running) and tokens + need > limits.max_kv_share * self.capacity

    def _low(self) -> float:
        return self.capacity * self.cfg.low_watermark_ratio

    # ---- rules ------------------------------------------------------------------------------

    @rule(
        program=st.integers(0, 5),
        tenant=st.sampled_from(TENANTS),
        priority=st.sampled_from(PRIORITIES),
        frac=st.floats(0.01, 0.35),
        ttl=st.sampled_from([8.0, 2.0, None, 0.0]),  # simplest first: Programs that keep their KV
    )
    def submit_program(self, program: int, tenant: str, priority: int, frac: float, ttl: float | None) -> None:
        rid = self._rid("agent", tenant)
        hints = RequestHints(priority=priority, kv_retention_ttl_seconds=ttl)
        self._step(RequestSubmitted(rid, identity(f"p{program}"), self._tokens(frac), hints, tenant=tenant))

    @rule(
        tenant=st.sampled_from(TENANTS),
        priority=st.sampled_from(PRIORITIES),
        frac=st.floats(0.01, 0.4),
        out=st.integers(1, 200),
        deadline=st.sampled_from([None, 3.0]),
    )
    def submit_interactive(self, tenant: str, priority: int, frac: float, out: int, deadline: float | None) -> None:
        rid = self._rid("interactive", tenant)
        self.interactive_at = self.now
        self._step(
            InteractiveSubmitted(
                rid, self._tokens(frac), tenant=tenant, priority=priority, max_tokens=out, deadline_seconds=deadline
            )
        )

    @rule(
        tenant=st.sampled_from(TENANTS),
        priority=st.sampled_from(PRIORITIES),
        frac=st.floats(0.01, 0.3),
        out=st.integers(1, 200),
        preemptible=st.booleans(),
    )
    def submit_batch(self, tenant: str, priority: int, frac: float, out: int, preemptible: bool) -> None:
        rid = self._rid("batch", tenant)
        job = f"job-{tenant}"
        ev = BatchSubmitted(
            rid, job, self._tokens(frac), max_tokens=out, tenant=tenant, priority=priority, preemptible=preemptible
        )
        self._step(ev)

    def _complete(self, kind: str, index: int, out: int, failed: bool, finish: str = "stop") -> None:
        live = sorted(rid for rid, r in self.requests.items() if r.status == "in_flight" and r.kind == kind)
        if not live:
            return
        rid = live[index % len(live)]
        self.requests[rid].status = "done"
        self._step(RequestCompleted(RequestId(rid), not failed, Usage(None, None, out), finish_reason=finish))

    @rule(
        index=st.integers(0, 30),
        out=st.integers(0, 300),
        failed=st.booleans(),
        finish=st.sampled_from(["stop", "tool_calls"]),
    )
    def complete_program_request(self, index: int, out: int, failed: bool, finish: str) -> None:
        # a tool call keeps a light tenant present on its rank (docs/priority.md §3)
        self._complete("agent", index, out, failed, finish)

    @rule(index=st.integers(0, 30), out=st.integers(0, 300), failed=st.booleans())
    def complete_interactive(self, index: int, out: int, failed: bool) -> None:
        self._complete("interactive", index, out, failed)

    @rule(index=st.integers(0, 30), out=st.integers(0, 300), failed=st.booleans())
    def complete_batch(self, index: int, out: int, failed: bool) -> None:
        self._complete("batch", index, out, failed)

    @rule(index=st.integers(0, 30))
    def requeue_prefill(self, index: int) -> None:
        """The shell takes back a long prefill the core asked for (before its first token)."""
        open_asks = sorted(rid for rid in self.asks_open if self.requests[rid].status == "in_flight")
        self.asks_open = set(open_asks)
        if not open_asks:
            return
        rid = open_asks[index % len(open_asks)]
        self.asks_open.discard(rid)
        self.requeued.add(rid)
        self.requeue_counts[rid] = self.requeue_counts.get(rid, 0) + 1
        self.requests[rid].status = "waiting"
        self._step(RequestRequeued(RequestId(rid)))

    @rule(index=st.integers(0, 30))
    def abandon(self, index: int) -> None:
        live = sorted(rid for rid, r in self.requests.items() if r.status != "done")
        if not live:
            return
        rid = live[index % len(live)]
        self.requests[rid].status = "done"
        self._step(RequestAbandoned(RequestId(rid)))

    @rule(dt=st.sampled_from([0.25, 1.0, 3.0, 10.0]))
    def advance(self, dt: float) -> None:
        until = self.now + dt
        while self.next_tick <= until:
            self.now = self.next_tick
            self._step(RepairTick(self.next_tick))
            self.next_tick += self.tick
        self.now = until
        self._step(RepairTick())

    # ---- per-step checks ----------------------------------------------------------------------

    def _check_step(self, effects: tuple[object, ...], before: dict[str, float]) -> None:
        s = self.state
        low = self._low()
        if "capacity" in self.CHECKS:
            for e in effects:
                if isinstance(e, Transition) and e.reason in ADMIT_REASONS and not e.forced:
                    assert e.used_tokens is not None and e.required_tokens is not None
                    alone = e.required_tokens > low  # never fits: may run alone on an idle rank
                    assert alone or e.used_tokens + e.required_tokens <= low + EPS, f"admission beyond capacity: {e}"
                elif isinstance(e, AdmitInteractive) and e.used_tokens is not None:
                    idle = before.get(e.target_id, 0.0) == 0.0 or e.used_tokens <= EPS
                    assert idle or e.used_tokens + e.charged_tokens <= low + EPS, f"interactive beyond capacity: {e}"
        if "isolation" in self.CHECKS:
            self._check_isolation(effects)
        waiting_int = list(s.interactive.pending.values())
        if "priority_inversion" in self.CHECKS and waiting_int:
            self._check_inversions(effects, waiting_int)
        if "priority_inversion" in self.CHECKS:
            self._check_reserved(effects)
        if "work_conservation" in self.CHECKS:
            for w in waiting_int:
                for tid in s.pools.get(w.model_pool, ()):
                    rank = s.ranks[tid]
                    if rank.interactive_claim_tokens or self._capped(tid, w.need_tokens):
                        continue
                    free = low - self._usage(tid)
                    if s.prio.class_rank("interactive") > s.prio.class_rank("batch"):
                        free -= rank.batch_claim_tokens
                    assert w.need_tokens > free + EPS, f"{w.request_id} waits although {tid} has {free} free"

    def _heavy(self) -> dict[str, frozenset[str]]:
        """The machine's own heavy tenants of each pool (docs/priority.md §3), from the state and the
        core's record of where light tenants were seen (``isolation_recent``, the window)."""
        s, prio = self.state, self.state.prio
        out: dict[str, frozenset[str]] = {}
        for pool, targets in s.pools.items():
            demand: dict[str, float] = {}
            for tid in targets:
                for a in s.ranks[tid].active.values():
                    demand[a.tenant] = demand.get(a.tenant, 0.0) + a.charged_tokens
            refs = list(s.global_queues.get(pool, ())) if self.cfg.global_queue else []
            if not self.cfg.global_queue:
                for tid in targets:
                    refs.extend(s.rank_queues.get(tid, ()))
            for ref in refs:
                p = s.programs.get(ref.key)
                if p is None or p.ref != ref or not is_waiting_candidate(s, p):
                    continue
                front = s.pool.front(p.ref)
                out_tokens = front.hints.expected_output_length if front is not None else None
                need = private_tokens(p, self.cfg.decode_buffer_tokens, out_tokens)
                demand[p.tenant] = demand.get(p.tenant, 0.0) + need
            limit = prio.tenant_isolation_tool_call_seconds
            for ref, (name, tid, ended) in s.isolation_tool_calls.get(pool, {}).items():
                p = s.programs.get(ref.key)
                if p is None or p.ref != ref or self.now - ended > limit or tid not in targets:
                    continue
                if p.state == "paused" and p.status == "acting":  # between turns: its context is demand
                    demand[name] = demand.get(name, 0.0) + private_tokens(p, self.cfg.decode_buffer_tokens)
            seen = {
                name
                for (name, _t), at in s.isolation_recent.get(pool, {}).items()
                if self.now - at < prio.tenant_isolation_window_seconds
            }
            tenants = set(demand) | seen
            if len(tenants) < 2:
                out[pool] = frozenset()
                continue
            unit = self.capacity * len(targets) / sum(prio.weight(n) for n in tenants)
            out[pool] = frozenset(n for n, d in demand.items() if d > unit * prio.weight(n))
        return out

    def _check_isolation(self, effects: tuple[object, ...]) -> None:
        s = self.state
        cap = s.prio.heavy_tenant_max_active_per_rank
        if not fairness_isolation.enabled(s) or cap is None:
            return
        last = s.isolation_last
        pass_view = last[1] if last is not None and last[0] == self.now else None
        for e in effects:
            # a mark is decided by the pass (a pause at a request's end may come after the shares moved)
            if isinstance(e, Transition) and e.reason == "tenant_isolation_mark":
                p = s.programs.get(e.program.key)
                tenant = p.tenant if p is not None else None
                heavy = pass_view.get(TargetId(e.target_id), frozenset()) if pass_view and e.target_id else frozenset()
                assert tenant in heavy, f"{e.program} ({tenant}) paused for isolation on {e.target_id}, not heavy there"
        view = fairness_isolation.compute(s, record=False)
        heavy_of = self._heavy()
        for tid, heavy in view.items():
            pool = next(pool for pool, targets in s.pools.items() if tid in targets)
            mine = heavy_of[pool]
            assert heavy == mine, f"heavy tenants on {tid}: core {sorted(heavy)}, machine {sorted(mine)}"
        if pass_view is None or view != pass_view:
            return  # the shares moved within the step: the next pass enforces the new view
        for tid, heavy in view.items():
            rank = s.ranks[tid]
            for tenant in heavy:
                kept = [
                    a
                    for a in rank.active.values()
                    if a.tenant == tenant and not a.pause_when_idle and a.ref not in self.forced
                ]
                n = len(kept)
                assert n <= cap, f"{tenant} keeps {n} Programs on {tid}, shared with a light tenant (cap {cap})"

    def _check_reserved(self, effects: tuple[object, ...]) -> None:
        """Ranks reserved for interactive (docs/priority.md §2) take no batch while the window is open."""
        s = self.state
        k = s.prio.interactive_reserved_ranks
        last = self.interactive_at
        if not k or last is None or self.now - last > s.prio.interactive_window_seconds:
            return
        members = s.pools.get(POOL, ())
        reserved = [t for t in s.interactive.reserved.get(POOL, ()) if t in members]
        assert len(reserved) == (k if len(members) > k else 0), f"{len(reserved)} ranks reserved of {members}, k = {k}"
        for e in effects:
            if isinstance(e, AdmitBatch):
                assert e.target_id not in reserved, f"batch {e.request_id} dispatched on {e.target_id}, reserved"

    def _check_inversions(self, effects: tuple[object, ...], waiting: list[Any]) -> None:
        s = self.state
        order = s.prio.class_order
        interactive_rank = order.index("interactive")
        lower: list[tuple[str, float]] = []  # (rank, tokens) taken by lower classes in this step
        for e in effects:
            if isinstance(e, Transition) and e.reason in ADMIT_REASONS and not e.forced and e.target_id is not None:
                if order.index("agent") > interactive_rank and e.required_tokens is not None:
                    lower.append((e.target_id, e.required_tokens))
            elif isinstance(e, AdmitBatch) and not e.starvation_escape and order.index("batch") > interactive_rank:
                lower.append((e.target_id, float(e.charged_tokens)))
        low = self._low()
        for tid, tokens in lower:
            free_after = low - self._usage(tid) - s.ranks[TargetId(tid)].interactive_claim_tokens
            for w in waiting:
                if tid in s.pools.get(w.model_pool, ()) and not self._capped(tid, w.need_tokens):
                    assert w.need_tokens > free_after + tokens + EPS, (
                        f"a lower class took {tokens} on {tid} while {w.request_id} ({w.need_tokens}) waits"
                    )
        for e in effects:
            if not isinstance(e, AdmitInteractive):
                continue
            free_after = low - self._usage(e.target_id)
            for w in waiting:
                if w.priority > e.priority and not self._capped(e.target_id, w.need_tokens, e.charged_tokens):
                    assert w.need_tokens > free_after + e.charged_tokens + EPS, (
                        f"{e.request_id} (priority {e.priority}) dispatched in place of {w.request_id} "
                        f"(priority {w.priority})"
                    )

    # ---- invariants ---------------------------------------------------------------------------

    @invariant()
    def core_invariants(self) -> None:
        if "capacity" in self.CHECKS or "conservation" in self.CHECKS or "kv_rent" in self.CHECKS:
            problems = invariants.check(self.state, self.cfg)
            assert problems == [], problems

    @invariant()
    def conservation(self) -> None:
        if "conservation" not in self.CHECKS:
            return
        s = self.state
        waiting = {str(r) for ref in list(s.pool.refs()) for r in (q.request_id for q in s.pool.requests(ref))}
        waiting |= {str(r) for r in s.interactive.pending}
        in_flight = {str(r) for r in s.in_flight} | {str(r) for r in s.interactive.running}
        if s.batch is not None:
            waiting |= {str(r) for r in s.batch.pending}
            in_flight |= {str(r) for r in s.batch.running}
        mine_w = {rid for rid, r in self.requests.items() if r.status == "waiting"}
        mine_f = {rid for rid, r in self.requests.items() if r.status == "in_flight"}
        assert waiting == mine_w, f"waiting: core {sorted(waiting)} vs machine {sorted(mine_w)}"
        assert in_flight == mine_f, f"in flight: core {sorted(in_flight)} vs machine {sorted(mine_f)}"

    @invariant()
    def starvation(self) -> None:
        if "starvation" not in self.CHECKS:
            return
        s = self.state
        for p in s.programs.values():
            if p.state == PAUSED and s.pool.program_len(p.ref) and p.force_resume_deadline is not None:
                assert p.force_resume_deadline + self.tick > self.now, (
                    f"{p.ref} waits {self.now - p.force_resume_deadline:.2f} s past its force-resume deadline"
                )
        for w in s.interactive.pending.values():
            assert w.queue_deadline + self.tick > self.now, f"{w.request_id} waits past its queue deadline"

    @invariant()
    def kv_rent(self) -> None:
        if "kv_rent" not in self.CHECKS:
            return
        s, prio = self.state, self.state.prio
        for tenant, a in s.fair.accounts.items():
            total = fairness.total_kv_token_seconds(a, self.now)
            mine = self.rent.get(tenant, 0.0) + self.held.get(tenant, 0.0) * (self.now - self.rent_at)
            assert math.isclose(total, mine, rel_tol=1e-9, abs_tol=1e-6), f"{tenant}: rent {total} vs held {mine}"
            if prio.fairness == "off":
                continue
            cost = (
                prio.vtc_input_token_weight * a.input_tokens
                + prio.vtc_output_token_weight * a.output_tokens
                + prio.vtc_kv_token_second_weight * total
            )
            expected = cost / prio.weight(tenant) + a.lifted
            got = fairness.counter(s.fair, prio, tenant, self.now)
            assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-6), f"{tenant}: counter {got} != {expected}"


# ---- the VTC bound machine ----------------------------------------------------------------------


class VtcBoundMachine(RuleBasedStateMachine):
    """Equal-weight tenants, one request size, one rank (module docstring)."""

    PROGRAM_CFG: ProgramSchedulingConfig = ProgramSchedulingConfig(token_capacity_per_dp_rank=DEFAULT_CAPACITY)
    PRIO_CFG: PriorityConfig = PriorityConfig()
    PROMPT_SHARE = 0.2  # of the capacity, per request (few in flight: a tight bound, quickly tested)
    OUTPUT_SHARE = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.cfg = attrs.evolve(self.PROGRAM_CFG, low_watermark_ratio=1.0, high_watermark_ratio=1.0)
        # tenants without a configured weight: equal weights (the bound's premise)
        self.prio = attrs.evolve(self.PRIO_CFG, interactive=attrs.evolve(self.PRIO_CFG.interactive, max_kv_share=1.0))
        self.tenants = tuple(t for t in ("vtc-x", "vtc-y", "vtc-z") if t not in self.prio.tenant_weights)
        self.state = initial_state(self.cfg, None, self.prio)
        capacity = self.cfg.token_capacity_per_dp_rank or DEFAULT_CAPACITY
        self.prompt = max(1, int(self.PROMPT_SHARE * capacity))
        self.output = max(1, int(self.OUTPUT_SHARE * capacity))
        p = self.prio
        w = p.default_tenant_weight
        self.dispatch_charge = p.vtc_input_token_weight * self.prompt / w
        self.completion_charge = p.vtc_output_token_weight * self.output / w
        per_rank = capacity // (self.prompt + self.output)
        cap = p.interactive.max_running_per_rank
        self.max_in_flight = min(per_rank, cap) if cap is not None else per_rank
        self.bound = 2.0 * (self.dispatch_charge + self.max_in_flight * self.completion_charge)
        self.now = 0.0
        self.n = 0
        self.running: list[str] = []
        self.since: dict[tuple[str, str], tuple[float, float]] = {}
        self.worst = 0.0
        self._step(TargetsChanged(POOL, (BackendTarget("http://w", 0, "http://w@0", 0),)))

    def _step(self, event: object) -> None:
        result = step(self.state, event, now=self.now, cfg=self.cfg)
        for e in result.effects:
            if isinstance(e, AdmitInteractive):
                self.running.append(e.request_id)

    @rule(tenant=st.sampled_from((0, 1, 2)), count=st.integers(1, 8))
    def submit(self, tenant: int, count: int) -> None:
        for _ in range(count):
            self.n += 1
            name = self.tenants[tenant % len(self.tenants)]
            self._step(InteractiveSubmitted(RequestId(f"v{self.n}"), self.prompt, tenant=name, max_tokens=self.output))

    @rule(index=st.integers(0, 20), out=st.integers(0, 10**6))
    def complete(self, index: int, out: int) -> None:
        if not self.running:
            return
        rid = self.running.pop(index % len(self.running))
        self.now += 0.5
        self._step(RequestCompleted(RequestId(rid), True, Usage(None, None, out % (self.output + 1))))

    def teardown(self) -> None:
        # steer the search towards the largest service difference (Hypothesis targeting)
        target(self.worst, label="service difference of two backlogged tenants")

    def _service(self, tenant: str) -> float:
        """The service ``tenant`` received: its charges over its weight (lifts excluded), measured
        whether or not the scheduler orders by them (``fairness = "off"``)."""
        a = self.state.fair.accounts[tenant]
        p = self.state.prio
        cost = p.vtc_input_token_weight * a.input_tokens + p.vtc_output_token_weight * a.output_tokens
        return cost / p.weight(tenant)

    @invariant()
    def service_difference_within_bound(self) -> None:
        s = self.state
        backlogged = [t for t in self.tenants if (acct := s.fair.accounts.get(t)) is not None and acct.waiting > 0]
        live: set[tuple[str, str]] = set()
        for i, a in enumerate(backlogged):
            for b in backlogged[i + 1 :]:
                live.add((a, b))
                ca, cb = self._service(a), self._service(b)
                if (a, b) not in self.since:
                    self.since[(a, b)] = (ca, cb)
                    continue
                a0, b0 = self.since[(a, b)]
                diff = abs((ca - a0) - (cb - b0))
                self.worst = max(self.worst, diff)
                assert diff <= self.bound + EPS, (
                    f"service of {a} and {b} differs by {diff:.1f} while both are backlogged (bound {self.bound:.1f})"
                )
        for pair in [p for p in self.since if p not in live]:
            del self.since[pair]


# ---- factories ----------------------------------------------------------------------------------


def classes_machine(checks: frozenset[str]) -> Callable[[Any], type[ClassesMachine]]:
    def factory(cfg: Any) -> type[ClassesMachine]:
        ps, batch, prio = core_configs(cfg)
        name = "Classes_" + "_".join(sorted(checks))
        return type(
            name, (ClassesMachine,), {"PROGRAM_CFG": ps, "BATCH_CFG": batch, "PRIO_CFG": prio, "CHECKS": checks}
        )

    return factory


def vtc_machine(cfg: Any) -> type[VtcBoundMachine]:
    ps, _batch, prio = core_configs(cfg)
    return type("VtcBound", (VtcBoundMachine,), {"PROGRAM_CFG": ps, "PRIO_CFG": prio})


MACHINES: Sequence[tuple[str, Callable[[Any], type]]] = (
    ("vtc_bound", vtc_machine),
    ("starvation", classes_machine(frozenset({"starvation"}))),
    ("priority_inversion", classes_machine(frozenset({"priority_inversion"}))),
    ("work_conservation", classes_machine(frozenset({"work_conservation"}))),
    ("capacity", classes_machine(frozenset({"capacity"}))),
    ("conservation", classes_machine(frozenset({"conservation"}))),
    ("kv_rent", classes_machine(frozenset({"kv_rent"}))),
    ("isolation", classes_machine(frozenset({"isolation"}))),
)


# ---- seeded random walks ------------------------------------------------------------------------


def random_walk(machine: type[ClassesMachine], seed: int, *, walks: int = 20, steps: int = 60) -> int:
    """Drive ``machine`` with ``walks`` seeded random walks of ``steps`` rules each, checking every
    invariant after every rule (the same checks as the Hypothesis runs, with long walks that reach
    deep states cheaply; an ``AssertionError`` names the broken property).  Returns the rules run.

    Deterministic for a seed; the failing walk is reproduced by the same call."""
    import random

    rnd = random.Random(seed)
    ran = 0
    for _ in range(walks):
        m = machine()
        m.targets()
        for _ in range(steps):
            k = rnd.randrange(9)
            tenant = rnd.choice(TENANTS)
            priority = rnd.choice(PRIORITIES)
            if k == 0:
                ttl = rnd.choice([8.0, 2.0, None, 0.0])
                m.submit_program(rnd.randrange(6), tenant, priority, rnd.uniform(0.01, 0.35), ttl)
            elif k == 1:
                m.submit_interactive(
                    tenant, priority, rnd.uniform(0.01, 0.4), rnd.randrange(1, 200), rnd.choice([None, 3.0])
                )
            elif k == 2:
                m.submit_batch(tenant, priority, rnd.uniform(0.01, 0.3), rnd.randrange(1, 200), rnd.random() < 0.5)
            elif k in (3, 4, 5):
                kind = ("agent", "interactive", "batch")[k - 3]
                m._complete(kind, rnd.randrange(30), rnd.randrange(300), rnd.random() < 0.2)
            elif k == 6:
                m.abandon(rnd.randrange(30))
            else:
                m.advance(rnd.choice([0.25, 1.0, 3.0, 10.0]))
            if m.asks_open and rnd.random() < 0.5:  # the shell takes a long prefill back (not drawn otherwise)
                m.requeue_prefill(rnd.randrange(30))
            m.core_invariants()
            m.conservation()
            m.starvation()
            m.kv_rent()
            ran += 1
    return ran
