"""Stateful property test of the scheduling core with virtual time.

``SchedulerMachine`` drives ``actors.core.scheduler.step`` the way the Trio shell does: requests
are submitted (identity parsed by ``daemon.http.identity``), completed, abandoned; time advances
and the due timers (from ``ArmTimer``/``CancelTimer`` effects) are delivered in (deadline, token)
order, interleaved with the ``RepairTick`` grid, as the Program actors deliver them (the core acts
on a deadline only when its timer fires); backend observations start, arrive or go stale;
targets disappear and come back. After every rule the machine checks, against the core state
(the rules are those of docs/program-scheduling.md):

* ``invariants.check`` is clean;
* conservation: each submitted request is in exactly one of waiting / in flight / completed /
  rejected / cancelled, and the core agrees on waiting and in-flight;
* occupancy: in Router-ledger accounting, a rank's logical occupancy is at most
  ``capacity x low watermark`` plus what admitted Programs grew since admission plus what
  forced resumes brought in (recorded per admission); the active count likewise stays within
  ``max_active_programs_per_target`` plus forced entrants (docs/program-scheduling.md §3);
* starvation: no request waits past its force-resume deadline plus one tick, whatever the
  waiting gate says (docs/program-scheduling.md §10, D6);
* the incremental ledger equals a from-scratch recomputation (here and in ``invariants.check``);
* per step: admissions on a rank follow the naive reference order (``reference_model``); with
  only the Program-count guard, every waiter left behind is ordered after every one admitted
  and its rank is full; no admission but a forced one through a holding waiting gate; rank-local mode never
  migrates (docs/program-scheduling.md §7); a successful commit clears the yield marker (§5); repair only
  pauses idle Programs (§6); FIFO dispatch per Program; placement epochs strictly increase; generations
  step by one; releases only when idle, retention releases only after
  ``paused_retention_ttl`` (docs/program-scheduling.md §1); completions fenced by generation and placement epoch;
* windows never exceed ``stats_window_size``; lineage roots terminate;
* identity-free requests never create Program state;
* time accounts (docs/program-scheduling.md §14): each Program's parts are >= 0 and, with its
  unsplit serving time, sum to its accounted wall time; a live Program's phase matches its
  in-flight and waiting counts; the ``TimeAttributed`` effects sum to the totals;
* attained service (the ``las`` order, docs/program-scheduling.md §5.1): a completion the core
  accepts adds exactly its dispatch-to-completion time to its task; every live Program belongs to
  a task, every remembered key is live or in the released history (bounded memory), and the
  member counts match;
* a failover's exclusion (``RequestSubmitted.avoid_workers``, docs/program-scheduling.md §9.1):
  while its pool has a target of another worker, the request is dispatched, or its Program waits,
  on such a target; when every target is avoided, the step's effects are exactly those of the same
  arrival without the exclusion (replayed on a copy of the state); a Program the exclusion moved
  that goes idle without a success is given back to the rank it left (if still a target);
* determinism: at teardown the recorded events are replayed into a fresh state and must
  produce identical effects.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
from hypothesis import event as label
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actors.core import invariants
from actors.core.arrival import PASS_RACE_ADMIT
from actors.core.attribution import IDLE, PARTS, QUEUED, SERVING
from actors.core.effects import (
    Admit,
    ArmTimer,
    CancelTimer,
    CompletionIgnored,
    Reject,
    RetireProgram,
    SpawnProgram,
    StaleObservationDropped,
    TimeAttributed,
    Transition,
)
from actors.core.events import (
    ObservationReceived,
    ObservationStale,
    ObservationStarted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestSubmitted,
    TargetsChanged,
    TimerFired,
)
from actors.core.ids import ProgramKey, TargetId
from actors.core.ledger import BACKEND_OBSERVATION, capacity_accounting_source, fresh_waiting, private_tokens
from actors.core.model import ACTIVE, MAX_SEGMENT_YIELD, PAUSED, REASONING, Usage
from actors.core.scheduler import initial_state, step
from daemon.http.identity import parse_identity
from property_tests.reference_model import Waiter, naive_order, resumes_before
from property_tests.strategies import (
    PROGRAM_COUNT,
    identity_free_requests,
    make_targets,
    parse_program_request,
    request_scopes,
    scheduling_configs,
    usage_shapes,
)

ADMISSIONS = ("program_admit", "force_resume", "batch_gain_admit")
EPS = 1e-6
POOL = "default"


def _brief(x: object) -> str:
    """A short rendering of an event or effect for failure reports."""
    fields = getattr(type(x), "__attrs_attrs__", ())
    parts = []
    for f in fields:
        v = getattr(x, f.name)
        if f.name == "identity":
            v = v.program_id
        elif f.name == "targets":
            v = [t.target_id for t in v] if v is not None else None
        elif hasattr(v, "program_id") and hasattr(v, "generation"):
            v = f"{v.program_id}#{v.generation}"
        if v is None or v is False or f.default is not attrs.NOTHING and v == f.default:
            continue
        parts.append(f"{f.name}={v}")
    return f"{type(x).__name__}({', '.join(parts)})"


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(cfg=scheduling_configs(), rank_count=st.integers(min_value=1, max_value=3))
    def setup(self, cfg: Any, rank_count: int) -> None:
        self.cfg = cfg
        self.all_targets = make_targets(rank_count)
        self.present = [True] * rank_count
        self.tick = cfg.metrics_interval_seconds
        self.state = initial_state(cfg)
        self.now = 0.0
        self.next_tick = self.tick
        self.log: list[tuple[object, float]] = []
        self.effect_log: list[tuple[object, ...]] = []
        self.timers: dict[tuple[Any, str], tuple[float, int]] = {}
        self.status: dict[str, str] = {}  # request id -> waiting|in_flight|completed|rejected|cancelled
        self.program_of: dict[str, str] = {}
        self.fifo: dict[str, list[str]] = {}  # program id -> waiting request ids in submit order
        self.orphaned: set[str] = set()  # in-flight requests whose placement was invalidated
        self.est_of: dict[str, int] = {}
        self.seq = 0
        self.epoch = 0
        self.pending_epochs: dict[str, list[int]] = {}
        self.gate_released_at: dict[str, float] = {}
        self.max_epoch = 0
        self.generations: dict[str, tuple[int, float | None]] = {}  # program id -> (generation, released at)
        self.paused_since: dict[Any, float] = {}
        self.admission: dict[Any, dict[str, Any]] = {}  # active ref -> admission record
        self.attributed = dict.fromkeys(PARTS, 0.0)  # sums of the TimeAttributed effects
        self._step(TargetsChanged(POOL, self._targets()))

    # ------------------------------------------------------------------ driving the core

    def _targets(self) -> tuple[Any, ...]:
        return tuple(t for t, ok in zip(self.all_targets, self.present, strict=True) if ok)

    def _waiter_views(self) -> dict[Any, Waiter]:
        s = self.state
        out = {}
        for p in s.programs.values():
            if p.state == PAUSED and p.status == REASONING and s.pool.program_len(p.ref) and p.last_target is not None:
                front = s.pool.front(p.ref)
                out[p.ref] = Waiter(
                    p.ref.program_id,
                    p.ref.model_pool,
                    p.last_target,
                    p.force_resume_deadline,
                    front.hints.priority if front is not None else 0,
                    p.last_pause_reason == MAX_SEGMENT_YIELD,
                    p.queued_at,
                    p.last_request_finished_at,
                    s.attained.of(p.ref.key),
                )
        return out

    def _step(self, event: object) -> tuple[object, ...]:
        pre_moved = {p.ref: p.failover_from for p in self.state.programs.values() if p.failover_from is not None}
        pre_waiters = self._waiter_views()
        pre_last_target = {p.ref: p.last_target for p in self.state.programs.values()}
        pre_queued_at = {p.ref: p.queued_at for p in self.state.programs.values()}
        pre_pause_reason = {p.ref: p.last_pause_reason for p in self.state.programs.values()}
        served = self._served_before(event)
        effects = step(self.state, event, now=self.now, cfg=self.cfg).effects
        self.log.append((event, self.now))
        self.effect_log.append(effects)
        for e in effects:
            if isinstance(e, TimeAttributed):
                for part in PARTS:
                    self.attributed[part] += getattr(e, f"{part}_seconds")
        shown = [_brief(e) for e in effects if not isinstance(e, (ArmTimer, CancelTimer))]
        note(f"t={self.now}: {_brief(event)} -> {shown}")
        self._check_served(event, effects, served)
        self._absorb(event, effects)
        self._check_step(event, effects, pre_waiters, pre_last_target, pre_queued_at, pre_pause_reason)
        self._track_growth()
        self._check_given_back(event, pre_moved)
        return effects

    def _check_given_back(self, event: object, pre_moved: dict[Any, Any]) -> None:
        """A Program an exclusion moved (``failover_from``) that this step left idle without a
        successful completion of its own is back on the rank it left, if that is still a target."""
        s = self.state
        succeeded = isinstance(event, RequestCompleted) and event.success
        for ref, back in pre_moved.items():
            p = s.programs.get(ref.key)
            if p is None or p.ref != ref or p.failover_from is not None or p.in_flight or s.pool.program_len(ref):
                continue
            if succeeded and self.program_of.get(event.request_id) == ref.program_id:  # type: ignore[attr-defined]
                continue
            if back in s.pools.get(POOL, ()):
                assert p.last_target == back, f"{ref} idle after a failed failover on {p.last_target}, left {back}"

    def _served_before(self, event: object) -> tuple[Any, float, float] | None:
        """(task, its attained seconds, dispatch time) before a completion of a live dispatch."""
        if not isinstance(event, (RequestCompleted, RequestAbandoned)):
            return None
        d = self.state.in_flight.get(event.request_id)
        if d is None:
            return None
        task = self.state.attained.task_of.get(d.ref.key)
        if task is None and event.request_id in self.orphaned:
            return None  # its placement was invalidated, its generation released and forgotten since
        assert task is not None, f"{d.ref} has a request in flight but no task"
        return task, self.state.attained.seconds[task], d.dispatched_at

    def _check_served(
        self, event: object, effects: tuple[object, ...], served: tuple[Any, float, float] | None
    ) -> None:
        if served is None or any(isinstance(e, CompletionIgnored) for e in effects):
            return
        task, before, dispatched_at = served
        after = self.state.attained.seconds.get(task)
        if after is None:  # only the tick prunes histories
            raise AssertionError(f"{task} forgotten by a completion")
        assert abs(after - before - max(0.0, self.now - dispatched_at)) <= EPS, (task, before, after, dispatched_at)

    def _absorb(self, event: object, effects: tuple[object, ...]) -> None:
        for e in effects:
            if isinstance(e, Admit):
                assert self.status.get(e.request_id) == "waiting", (e, self.status.get(e.request_id))
                pid = self.program_of[e.request_id]
                assert self.fifo[pid][0] == e.request_id, f"{e.request_id} dispatched before {self.fifo[pid][0]}"
                self.fifo[pid].pop(0)
                self.status[e.request_id] = "in_flight"
                if e.placement_start_request:
                    assert e.placement_epoch > self.max_epoch, "placement epochs must strictly increase"
                    self.max_epoch = e.placement_epoch
            elif isinstance(e, Reject):
                label(f"reject {e.reason}")
                assert self.status.get(e.request_id) == "waiting", e
                self.status[e.request_id] = "rejected"
                self.fifo[self.program_of[e.request_id]].remove(e.request_id)
            elif isinstance(e, ArmTimer):
                self.timers[(e.program, e.kind)] = (e.deadline, e.token)
            elif isinstance(e, CancelTimer):
                self.timers.pop((e.program, e.kind), None)
            elif isinstance(e, SpawnProgram):
                prev = self.generations.get(e.program.program_id)
                keep = max(self.cfg.paused_retention_ttl_seconds, 60.0)
                if self.cfg.max_idle_paused_programs < 20_000:
                    # beyond the bound a released history may go once 60 s old (docs/program-scheduling.md §1)
                    keep = 60.0
                if prev is not None and prev[1] is not None and self.now - prev[1] < keep:
                    assert e.program.generation == prev[0] + 1, f"{e.program} after generation {prev[0]}"
                elif prev is not None and prev[1] is not None:
                    assert e.program.generation in (0, prev[0] + 1), e
                self.generations[e.program.program_id] = (e.program.generation, None)
                self.paused_since[e.program] = self.now
            elif isinstance(e, RetireProgram):
                pid = e.program.program_id
                live = [r for r, st_ in self.status.items() if self.program_of[r] == pid and st_ == "waiting"]
                assert not live, f"{e.program} released with waiting requests {live}"
                self.generations[pid] = (e.program.generation, self.now)
                for key in [k for k in self.timers if k[0] == e.program]:
                    del self.timers[key]
            elif isinstance(e, Transition):
                label(f"transition {e.reason}")
                if e.to_state == "paused_acting":
                    self.paused_since[e.program] = self.now
                if e.reason == "health_failover":
                    for rid, st_ in self.status.items():
                        if st_ == "in_flight" and self.program_of[rid] == e.program.program_id:
                            self.orphaned.add(rid)
                if e.reason == "paused_retention_release":
                    since = self.paused_since.get(e.program)
                    assert since is not None and self.now - since >= self.cfg.paused_retention_ttl_seconds - EPS, (
                        f"{e.program} released {self.now - (since or 0)} s after its pause"
                    )
                if e.reason == "capacity_repair" and e.to_state != "released":
                    assert e.from_state == "active_acting", f"repair paused a busy Program: {e}"
            elif isinstance(e, CompletionIgnored):
                assert e.request_id in self.orphaned, f"completion of a live dispatch ignored: {e}"

    def _gate_holds(self, target: str, dispatched_now: frozenset[str] = frozenset()) -> bool:
        """The waiting gate of ``target`` now; ``dispatched_now``: requests this step dispatched,
        left out of the rank's in-flight set (the gate is decided before each dispatch)."""
        thr = self.cfg.admission_waiting_request_threshold
        rank = self.state.ranks.get(target)
        if thr <= 0 or rank is None:
            return False
        w = fresh_waiting(rank, self.now, self.tick)
        if w is None:
            return False
        # a rank with nothing dispatched in flight (a stale placement's request included) counts
        # the completions since the observation out of it (docs/program-scheduling.md §3)
        drained = not any(
            d.target_id == target and rid not in dispatched_now for rid, d in self.state.in_flight.items()
        ) and not (rank.batch_requests or rank.interactive_requests)
        if drained and w - rank.completed_since_observation < thr:
            return False
        return w >= thr

    def _check_step(
        self,
        event: object,
        effects: tuple[object, ...],
        pre: dict[Any, Waiter],
        pre_last_target: dict[Any, Any],
        pre_queued_at: dict[Any, Any],
        pre_pause_reason: dict[Any, Any],
    ) -> None:
        s, cfg = self.state, self.cfg
        admitted = [e for e in effects if isinstance(e, Transition) and e.reason in ADMISSIONS]
        # a passed request admitted where it already is (docs/program-scheduling.md §15) may move its
        # Program at once: it is not a resume decision, so the migration rules do not apply to it
        raced = {e.program for e in effects if isinstance(e, Transition) and e.reason == PASS_RACE_ADMIT}
        cross = {e.program for e in effects if isinstance(e, Transition) and e.reason == "cross_rank_resume"} - raced
        if cfg.binding_only:
            return
        dispatched_now = frozenset(str(e.request_id) for e in effects if isinstance(e, Admit))
        through_drained: dict[Any, int] = {}
        for e in admitted:
            rank = s.ranks[e.target_id]
            # a due force-resume deadline goes through the gate (docs/program-scheduling.md §10, D6)
            assert e.forced or not self._gate_holds(e.target_id, dispatched_now), (
                f"admission through a holding waiting gate: {e}"
            )
            if not e.forced and self._gate_holds(e.target_id):
                # open only because the rank was drained: the first admission ends that (docs/program-scheduling.md §3)
                through_drained[e.target_id] = through_drained.get(e.target_id, 0) + 1
                assert through_drained[e.target_id] <= 1, f"a drained rank's open gate admitted twice: {e}"
            if not cfg.global_queue:
                assert e.program not in cross, f"rank-local mode migrated {e.program}"
            if e.forced:
                continue
            assert e.required_tokens is not None and e.used_tokens is not None
            cap = cfg.token_capacity_per_dp_rank
            if cap is not None:
                low = cap * cfg.low_watermark_ratio
                # can never fit, or never pass the reserve fit (with no active Program the reserve is
                # its own growth): runs alone on a rank without an active Program (docs/program-scheduling.md §10)
                never_fits = e.required_tokens > low + EPS
                never_reserve_fits = not e.batch_gain and e.required_tokens + (e.reserve_tokens or 0.0) > low + EPS
                if never_fits or never_reserve_fits:
                    assert set(rank.active) <= {a.program for a in admitted}, f"oversized admission beside others {e}"
                    self._record_admission(e, rank, alone=True)
                    continue
                assert e.used_tokens + e.required_tokens <= low + EPS, f"{e}"
                if not e.batch_gain:
                    assert e.used_tokens + e.required_tokens + (e.reserve_tokens or 0.0) <= low + EPS, f"{e}"
            self._record_admission(e, rank)
        for e in admitted:
            if e.forced:
                self._record_admission(e, s.ranks[e.target_id])
        for e in effects:  # admitted without a plan: allowed its whole charge, as a forced admission
            if isinstance(e, Transition) and e.reason == PASS_RACE_ADMIT and e.target_id is not None:
                p = s.programs[e.program.key]
                ledger_mode = (
                    capacity_accounting_source(s.ranks[e.target_id], self.now, self.tick) != BACKEND_OBSERVATION
                )
                charge = p.charged_tokens
                self.admission[e.program] = {
                    "forced": True,
                    "charge": charge,
                    "grown": 0.0,
                    "last": charge,
                    "ledger_mode": ledger_mode,
                }
        for ref in cross:
            assert pre_pause_reason.get(ref) is not None, f"{ref} migrated without a pause reason"
            queued_at = pre_queued_at.get(ref)
            assert queued_at is None or self.now - queued_at >= self.tick - EPS, f"{ref} migrated too early"
            dest = next(e.target_id for e in admitted if e.program == ref)
            assert dest != pre_last_target.get(ref), f"{ref} migrated to its own rank"
        for p in s.programs.values():
            if p.state == ACTIVE:
                assert p.last_pause_reason is None, f"active {p.ref} kept pause reason {p.last_pause_reason}"
        self._check_order(event, effects, admitted, cross, pre)

    def _track_growth(self) -> None:
        """Add what each admitted Program grew since the last look to its allowance.

        Called after every step, not only between rules: within one rule a Program can shrink (a
        smaller output allowance), let another one in, and grow again; seen only at the end of
        the rule, that growth would look like an over-admission.
        """
        s = self.state
        for ref in list(self.admission):
            p = s.programs.get(ref.key)
            if p is None or p.ref != ref or p.state != ACTIVE:
                del self.admission[ref]
                continue
            rec = self.admission[ref]
            rec["grown"] += max(0.0, p.charged_tokens - rec["last"])
            rec["last"] = p.charged_tokens

    def _record_admission(self, e: Transition, rank: Any, *, alone: bool = False) -> None:
        ledger_mode = capacity_accounting_source(rank, self.now, self.tick) != BACKEND_OBSERVATION
        self.admission[e.program] = {  # an oversized Program admitted alone is allowed its charge, as forced ones
            "forced": e.forced or alone,
            "charge": e.required_tokens,
            "grown": 0.0,
            "last": e.required_tokens,
            "ledger_mode": ledger_mode,
        }

    def _check_order(
        self,
        event: object,
        effects: tuple[object, ...],
        admitted: list[Transition],
        cross: set[Any],
        pre: dict[Any, Waiter],
    ) -> None:
        s, cfg = self.state, self.cfg
        schedules = isinstance(
            event,
            (
                RequestSubmitted,
                RequestCompleted,
                RequestAbandoned,
                TimerFired,
                RepairTick,
                ObservationReceived,
                TargetsChanged,
            ),
        )
        # a fenced (stale) completion returns before any decision; so does a late observation
        schedules = schedules and not any(isinstance(e, (CompletionIgnored, StaleObservationDropped)) for e in effects)
        if not schedules:
            assert not admitted, f"{type(event).__name__} must not admit: {admitted}"
            return
        skip = set()
        if isinstance(event, (RequestSubmitted, RequestAbandoned, RequestCompleted)):
            rid = event.request_id
            skip = {ref for ref in pre if ref.program_id == self.program_of.get(rid)}
        # the pass saw the attained service after this step's completion was counted (it only grows)
        views = {ref: attrs.evolve(w, attained=s.attained.of(ref.key)) for ref, w in pre.items() if ref not in skip}
        batch_gain = any(e.batch_gain for e in admitted)
        local = [e for e in admitted if e.program in views and e.program not in cross]
        if not batch_gain:
            if cfg.global_queue:  # phase A walks the whole pool in one order
                seq = [views[e.program] for e in local]
                assert seq == naive_order(seq, self.now, cfg.resume_order), "phase A admissions out of order"
            else:  # each rank queue is walked in its own order (a target change may rebind waiters)
                for target in sorted({e.target_id for e in local}):
                    on_rank = [views[e.program] for e in local if e.target_id == target]
                    assert on_rank == naive_order(on_rank, self.now, cfg.resume_order), f"{target}: out of order"
        admitted_refs = {e.program for e in admitted}
        for ref, w in views.items():
            p = s.programs.get(ref.key)
            still_waiting = (
                ref not in admitted_refs
                and p is not None
                and p.ref == ref
                and p.state == PAUSED
                and s.pool.program_len(ref) > 0
            )
            if not still_waiting or w.rank != p.last_target:
                continue
            forced = w.force_resume_deadline is not None and w.force_resume_deadline <= self.now
            if forced:
                raise AssertionError(f"forced waiter {ref} left behind (nothing may hold a due deadline)")
            if cfg.token_capacity_per_dp_rank is None and w.rank in s.ranks:
                rank = s.ranks[w.rank]
                full = len(rank.active) >= cfg.max_active_programs_per_target
                assert full or self._gate_holds(w.rank), f"{ref} waits although {w.rank} has a free slot"
                for e in local:
                    a = views[e.program]
                    if a.rank == w.rank and not e.forced:
                        assert not resumes_before(w, a, self.now, cfg.resume_order), (
                            f"{ref} was ordered before admitted {e.program} but left waiting"
                        )

    # ------------------------------------------------------------------ rules

    def _submit(self, index: int, scope: dict[str, Any], est: int, already_on: Any = None) -> None:
        parsed = parse_program_request(index, scope)
        rid = self._record(parsed.identity.program_id, est)
        self._step(RequestSubmitted(rid, parsed.identity, est, parsed.hints, already_on=already_on))

    def _record(self, program_id: str, est: int) -> str:
        """A new request of ``program_id``, waiting: its id."""
        self.seq += 1
        rid = f"r{self.seq}"
        self.status[rid] = "waiting"
        self.program_of[rid] = program_id
        self.fifo.setdefault(program_id, []).append(rid)
        self.est_of[rid] = est
        return rid

    @rule(
        index=st.integers(min_value=0, max_value=PROGRAM_COUNT - 1),
        scope=request_scopes,
        est=st.integers(min_value=0, max_value=3000),
        where=st.integers(min_value=-1, max_value=2),
    )
    def submit_passed(self, index: int, scope: dict[str, Any], est: int, where: int) -> None:
        """A request a relay already forwarded under a resume pass (docs/program-scheduling.md §15):
        to its Program's last target (``where`` -1), else to target ``where`` (maybe removed or
        never configured).  It is never queued: dispatched at once, or refused when its Program is
        not Active and its target is not in the pool."""
        parsed = parse_program_request(index, scope)
        p = self.state.programs.get(ProgramKey(POOL, parsed.identity.program_id))
        if where < 0 and p is not None and p.last_target is not None:
            target = p.last_target
        else:
            target = TargetId(self.all_targets[where % len(self.all_targets)].target_id)
        present = target in self.state.pools.get(POOL, ())
        active = p is not None and p.state == ACTIVE
        label(f"passed request {'present' if present else 'gone'} {'active' if active else 'idle'}")
        self._submit(index, scope, est, already_on=target)
        rid = f"r{self.seq}"
        # an Active Program dispatches it as any arrival (where it is Active); else it is admitted on
        # its target, or refused when that target left the pool
        expected = "in_flight" if active or present else "rejected"
        assert self.status[rid] == expected, (rid, target, self.status[rid])

    @rule(
        index=st.integers(min_value=0, max_value=PROGRAM_COUNT - 1),
        scope=request_scopes,
        est=st.integers(min_value=0, max_value=3000),
    )
    def submit(self, index: int, scope: dict[str, Any], est: int) -> None:
        self._submit(index, scope, est)

    @rule(
        index=st.integers(min_value=0, max_value=PROGRAM_COUNT - 1),
        scope=request_scopes,
        est=st.integers(min_value=0, max_value=3000),
        avoided=st.sets(st.integers(min_value=0, max_value=2), min_size=1),
    )
    def submit_failover(self, index: int, scope: dict[str, Any], est: int, avoided: set[int]) -> None:
        """A failover's request (docs/program-scheduling.md §9.1): it could not reach the workers of
        ``avoided`` (target indices, maybe removed or never configured)."""
        avoid = frozenset(self.all_targets[i % len(self.all_targets)].worker_url for i in avoided)
        pool = self.state.pools.get(POOL, ())
        every = all(self.state.ranks[t].worker_url in avoid for t in pool)
        parsed = parse_program_request(index, scope)
        shadow = None
        if every:  # the same arrival without the exclusion, on a copy of the state
            shadow = copy.deepcopy(self.state)
            event = RequestSubmitted(f"r{self.seq + 1}", parsed.identity, est, parsed.hints)
            expected = step(shadow, event, now=self.now, cfg=self.cfg).effects
        label(f"failover {'every target avoided' if every else 'another worker left'}")
        rid = self._record(parsed.identity.program_id, est)
        effects = self._step(RequestSubmitted(rid, parsed.identity, est, parsed.hints, avoid_workers=avoid))
        if shadow is not None:
            assert effects == expected, "an exclusion of every target changed the placement"
            return
        if self.status[rid] == "in_flight":
            [admit] = [e for e in effects if isinstance(e, Admit) and e.request_id == rid]
            where = admit.target_id
        elif self.status[rid] == "waiting":
            p = self.state.programs[ProgramKey(POOL, parsed.identity.program_id)]
            where = p.last_target
            assert where is not None
        else:
            return  # refused (its bound, no target)
        assert self.state.ranks[where].worker_url not in avoid, f"{rid} placed on {where}, avoiding {sorted(avoid)}"

    @rule(
        batch=st.lists(
            st.tuples(
                st.integers(min_value=0, max_value=PROGRAM_COUNT - 1),
                request_scopes,
                st.integers(min_value=0, max_value=3000),
            ),
            min_size=2,
            max_size=4,
        ),
        identity_free=st.none() | identity_free_requests,
    )
    def submit_burst(
        self,
        batch: list[tuple[int, dict[str, Any], int]],
        identity_free: tuple[dict[str, Any], dict[str, str], str] | None,
    ) -> None:
        """Several arrivals at the same instant, plus (maybe) one identity-free request."""
        if identity_free is not None:
            body, headers, enable_key = identity_free
            before = (len(self.state.programs), len(self.state.pool), len(self.state.in_flight))
            assert parse_identity(body, headers, enable_key) is None  # the shell routes it natively
            assert (len(self.state.programs), len(self.state.pool), len(self.state.in_flight)) == before
        for index, scope, est in batch:
            self._submit(index, scope, est)

    def _in_flight(self) -> list[str]:
        return sorted((r for r, st_ in self.status.items() if st_ == "in_flight"), key=lambda r: int(r[1:]))

    @precondition(lambda self: any(st_ == "in_flight" for st_ in self.status.values()))
    @rule(data=st.data(), success=st.booleans(), shape=usage_shapes)
    def complete(self, data: st.DataObject, success: bool, shape: dict[str, Any]) -> None:
        self._complete(data.draw(st.sampled_from(self._in_flight())), success, shape)

    def _complete(self, rid: str, success: bool, shape: dict[str, Any]) -> None:
        prompt = None if shape["growth_tokens"] is None else max(0, self.est_of[rid] + shape["growth_tokens"])
        base = prompt if prompt is not None else self.est_of[rid]
        cached = None if shape["cached_ratio"] is None else int(base * shape["cached_ratio"])
        usage = Usage(prompt, cached, shape["completion_tokens"])
        self.status[rid] = "completed"
        self._step(RequestCompleted(rid, success, usage, shape["decode_seconds"]))

    @precondition(lambda self: any(st_ == "in_flight" for st_ in self.status.values()))
    @rule(success=st.booleans(), shape=usage_shapes, gap=st.sampled_from([0.0, 0.5, 3.0]))
    def complete_oldest(self, success: bool, shape: dict[str, Any], gap: float) -> None:
        """Complete the oldest in-flight request after a short decode (keeps Programs cycling)."""
        if gap:
            self.advance(gap)
        flying = self._in_flight()
        if flying:
            self._complete(flying[0], success, shape)

    @precondition(lambda self: any(st_ in ("waiting", "in_flight") for st_ in self.status.values()))
    @rule(data=st.data())
    def abandon(self, data: st.DataObject) -> None:
        live = sorted(
            (r for r, st_ in self.status.items() if st_ in ("waiting", "in_flight")), key=lambda r: int(r[1:])
        )
        rid = data.draw(st.sampled_from(live))
        if self.status[rid] == "waiting":
            self.status[rid] = "cancelled"
            self.fifo[self.program_of[rid]].remove(rid)
        else:
            self.status[rid] = "completed"
        self._step(RequestAbandoned(rid))

    @rule(dt=st.sampled_from([0.5, 2.0, 5.0, 12.0, 45.0]))
    def advance(self, dt: float) -> None:
        """Deliver due timers in (deadline, token) order and the tick grid, then move to now + dt."""
        end = self.now + dt
        for _ in range(10_000):
            due = sorted((d, tok, key) for key, (d, tok) in self.timers.items() if d <= end)
            if due and due[0][0] <= self.next_tick:
                deadline, token, key = due[0]
                del self.timers[key]
                self.now = max(self.now, deadline)
                self._step(TimerFired(key[0], key[1], token))
            elif self.next_tick <= end:
                self.now = self.next_tick
                self.next_tick += self.tick
                self._step(RepairTick())
            else:
                break
        else:
            raise AssertionError("timers keep re-arming in the past")
        self.now = end

    @rule(index=st.integers(min_value=0, max_value=2))
    def start_observation(self, index: int) -> None:
        target = self.all_targets[index % len(self.all_targets)].target_id
        self.epoch += 1
        self.pending_epochs.setdefault(target, []).append(self.epoch)
        self._step(ObservationStarted(target, self.epoch))

    @rule(
        index=st.integers(min_value=0, max_value=2),
        kv=st.sampled_from([None, 0.0, 0.3, 0.7, 1.0]),
        running=st.integers(min_value=0, max_value=4),
        waiting=st.integers(min_value=0, max_value=3),
    )
    def observe(self, index: int, kv: float | None, running: int, waiting: int) -> None:
        target = self.all_targets[index % len(self.all_targets)].target_id
        pending = self.pending_epochs.get(target)
        if pending:
            epoch = pending.pop(0)
        else:
            self.epoch += 1
            epoch = self.epoch
        self._step(ObservationReceived(target, epoch, kv, running, waiting))

    @rule(index=st.integers(min_value=0, max_value=2))
    def make_stale(self, index: int) -> None:
        target = self.all_targets[index % len(self.all_targets)].target_id
        if self._gate_holds(target):
            self.gate_released_at[target] = self.now
        self._step(ObservationStale(target))

    @precondition(lambda self: len(self.all_targets) > 1)
    @rule(index=st.integers(min_value=0, max_value=2))
    def flap_target(self, index: int) -> None:
        i = index % len(self.all_targets)
        if self.present[i] and sum(self.present) == 1:
            return
        self.present[i] = not self.present[i]
        self._step(TargetsChanged(POOL, self._targets()))

    # ------------------------------------------------------------------ invariants

    @invariant()
    def core_invariants_hold(self) -> None:
        problems = invariants.check(self.state, self.cfg)
        assert problems == [], problems

    @invariant()
    def every_request_is_accounted_for(self) -> None:
        s = self.state
        for rid, st_ in self.status.items():
            assert st_ in ("waiting", "in_flight", "completed", "rejected", "cancelled")
            assert (s.pool.get(rid) is not None) == (st_ == "waiting"), (rid, st_)
            assert (rid in s.in_flight) == (st_ == "in_flight"), (rid, st_)
        assert len(s.pool) == sum(1 for v in self.status.values() if v == "waiting")

    @invariant()
    def ledger_matches_recomputation(self) -> None:
        s, buf = self.state, self.cfg.decode_buffer_tokens
        for target, rank in s.ranks.items():
            active = [p for p in s.programs.values() if p.state == ACTIVE and p.placement == target]
            assert sorted(p.ref for p in active) == sorted(rank.active), target
            total = sum(private_tokens(p, buf) for p in active)
            dispatched = sum(1 for d in s.in_flight.values() if d.target_id == target)
            assert rank.dispatched == dispatched, (target, rank.dispatched, dispatched)
            assert abs(rank.fallback_tokens - total) <= EPS * max(1.0, total), (target, rank.fallback_tokens, total)

    @invariant()
    def occupancy_within_low_watermark_except_forced(self) -> None:
        s, cfg = self.state, self.cfg
        if cfg.binding_only:
            return
        self._track_growth()
        for target, rank in s.ranks.items():
            recs = [self.admission.get(ref) for ref in rank.active]
            forced = sum(1 for r in recs if r is not None and r["forced"])
            assert len(rank.active) <= cfg.max_active_programs_per_target + forced, (target, len(rank.active), forced)
            cap = cfg.token_capacity_per_dp_rank
            if cap is None or any(r is None or not r["ledger_mode"] for r in recs):
                continue
            allowance = sum(r["grown"] + (r["charge"] if r["forced"] else 0.0) for r in recs if r is not None)
            limit = cap * cfg.low_watermark_ratio + allowance
            assert rank.fallback_tokens <= limit + EPS, (target, rank.fallback_tokens, limit)

    @invariant()
    def no_wait_past_force_deadline_plus_one_tick(self) -> None:
        s, cfg = self.state, self.cfg
        if cfg.binding_only:
            return
        for p in s.programs.values():
            if not (p.state == PAUSED and s.pool.program_len(p.ref) and p.force_resume_deadline is not None):
                continue
            if p.force_resume_deadline + self.tick > self.now:
                continue
            # nothing holds a due deadline, the waiting gate included (docs/program-scheduling.md §10, D6)
            raise AssertionError(
                f"{p.ref} waits {self.now - p.force_resume_deadline:.1f} s past its force-resume deadline "
                f"on {p.last_target}"
            )

    @invariant()
    def attained_service_bookkeeping(self) -> None:
        a = self.state.attained
        for key in self.state.programs:
            assert key in a.task_of, f"live {key} belongs to no task"
        for key in a.task_of:
            assert key in self.state.programs or key in self.state.released_at, f"{key} remembered past its history"
        counts: dict[Any, int] = {}
        for task in a.task_of.values():
            counts[task] = counts.get(task, 0) + 1
        assert counts == a.members and set(a.seconds) == set(counts), (counts, a.members, a.seconds)
        assert all(v >= 0.0 for v in a.seconds.values())

    @invariant()
    def statistics_windows_bounded(self) -> None:
        limit = self.cfg.stats_window_size
        for rank in self.state.ranks.values():
            f = rank.factors
            assert len(f.requests) <= limit and len(f.continuities) <= limit and len(f.ttl_pause_rounds) <= limit

    @invariant()
    def lineage_roots_terminate(self) -> None:
        lineage = self.state.lineage
        for pool, pid in list(lineage.parents):
            root = lineage.root(pool, pid)
            assert lineage.parents.get((pool, root), root) == root, (pid, root)

    @invariant()
    def time_accounts_partition_wall_time(self) -> None:
        s = self.state
        for key, rec in s.times.records.items():
            values = (*rec.parts(), rec.serving_open)
            assert all(v >= -EPS for v in values), (key, rec)
            wall = rec.since - rec.started_at
            assert abs(sum(values) - wall) <= EPS * max(1.0, wall), (key, rec)
            assert rec.started_at <= rec.since <= self.now
            p = s.programs.get(key)
            if p is not None:
                waiting = s.pool.program_len(p.ref)
                assert rec.phase == (SERVING if p.in_flight else QUEUED if waiting else IDLE), (key, rec)
        for part in PARTS:
            total = s.times.totals.parts[part]
            assert abs(total - self.attributed[part]) <= EPS * max(1.0, total), (part, total)

    def teardown(self) -> None:
        if not hasattr(self, "cfg"):
            return
        replay = initial_state(self.cfg)
        for (event, now), expected in zip(self.log, self.effect_log, strict=True):
            got = step(replay, event, now=now, cfg=self.cfg).effects
            assert got == expected, f"non-deterministic effects for {event!r} at t={now}"


TestSchedulerMachine = SchedulerMachine.TestCase
