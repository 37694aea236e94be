"""Stateful property test of the batch class beside Programs (docs/batch.md §2).

``BatchMachine`` drives ``actors.core.scheduler.step`` with Program requests, batch requests of a
few jobs, completions (natural stops, length stops, failures), abandons, ticks and backend
observations, in virtual time.  After every step it checks:

* ``invariants.check`` is clean (each rank's batch charge equals its running batch requests);
* conservation: every batch request is queued, running, finished, abandoned or rejected, exactly
  once, and the core agrees;
* the reserve never exceeds ``reserve_max_blocks`` (and is at least ``min(margin, max)``);
* a dispatch leaves room below the low watermark for the decode that the running requests the
  last fresh observation saw still grow into (``decode_growth_tokens``), except for a lone request;
* Programs first: a batch request is dispatched without the starvation escape only when no
  Program waits at the end of that step;
* work conservation: after a step, when no Program waits, no queued batch request that the
  seed's pick would choose fits a rank's budget (it would have been dispatched);
* starvation bound: with no Program waiting and a rank whose budget fits the oldest request,
  it does not stay queued (work conservation covers it); with Programs waiting, the escape
  dispatches the oldest request once it waited ``max_wait_seconds`` and a budget fits it;
* the batch's own decode speed: a rank that received batch work in a step and runs more than one
  batch request has a decode step (the seed's cost model, Programs and batch) within
  ``RANK_STEP_RATIO`` times the fastest other rank's;
* engine-queue gate: while a rank's observation is fresh, a batch request goes there only while
  the engine requests it saw waiting plus the batch requests sent there since and not ended
  (counted here, from the events and effects) stay below ``engine_queue_requests``, or to an idle
  rank (one request);
* determinism: replaying the recorded events into a fresh state gives identical effects.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from actors.core import invariants
from actors.core.batch_class import (
    RANK_STEP_RATIO,
    JobPredictor,
    decode_growth_tokens,
    dispatch_offers,
    taken_pick,
    waiting_homes,
)
from actors.core.config import BackendTarget, BatchJobsConfig, ProgramSchedulingConfig
from actors.core.costs import decode_step_seconds
from actors.core.effects import AdmitBatch, PreemptBatch, Reject
from actors.core.events import (
    BatchSubmitted,
    ObservationReceived,
    ObservationStarted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestSubmitted,
    TargetsChanged,
    TimerFired,
)
from actors.core.ids import RequestId
from actors.core.ledger import fresh_waiting, target_usage
from actors.core.model import Usage
from actors.core.scheduler import initial_state, step
from property_tests.strategies import parse_program_request

POOL = "default"
JOBS = ("__default__", "short", "long", "mid")


class BatchMachine(RuleBasedStateMachine):
    @initialize(
        ranks=st.integers(min_value=1, max_value=2),
        capacity=st.sampled_from([2_000, 6_000, 20_000]),
        margin=st.integers(min_value=0, max_value=4),
        cap=st.integers(min_value=1, max_value=8),
        max_jobs=st.sampled_from([0, 1, 2, 20]),
        share=st.sampled_from([0.0, 0.25, 0.5]),
        gate=st.sampled_from([0, 1, 3, 48]),
    )
    def setup(self, ranks: int, capacity: int, margin: int, cap: int, max_jobs: int, share: float, gate: int) -> None:
        self.cfg = ProgramSchedulingConfig(token_capacity_per_dp_rank=capacity, metrics_interval_seconds=1.0)
        self.bcfg = BatchJobsConfig(
            enabled=True,
            reserve_margin_blocks=margin,
            reserve_max_blocks=cap,
            max_jobs=max_jobs,
            max_wait_seconds=10.0,
            guaranteed_kv_share=share,
            engine_queue_requests=gate,
        )
        self.sent_since_observation: dict[object, set[object]] = {}
        self.state = initial_state(self.cfg, self.bcfg)
        self.now = 0.0
        self.events: list[tuple[float, object]] = []
        self.effects: list[tuple[object, ...]] = []
        self.timers: dict[tuple[Any, str], tuple[float, int]] = {}
        self.n = 0
        self.queued: set[str] = set()
        self.running: set[str] = set()
        self.done: set[str] = set()
        self.program_in_flight: list[str] = []
        self.targets = tuple(BackendTarget("http://w", i, f"http://w@{i}", i) for i in range(ranks))
        self._step(TargetsChanged(POOL, self.targets))

    # ---- driving ----------------------------------------------------------------------------

    def _step(self, event: object) -> tuple[object, ...]:
        self.events.append((self.now, event))
        result = step(self.state, event, now=self.now, cfg=self.cfg)
        self.effects.append(result.effects)
        if isinstance(event, ObservationReceived):
            self.sent_since_observation[event.target_id] = set()
        if isinstance(event, RequestCompleted | RequestAbandoned):
            for sent in self.sent_since_observation.values():
                sent.discard(event.request_id)  # it ended: in no engine queue
        dispatched_to: set[str] = set()
        for e in result.effects:
            name = type(e).__name__
            if name == "ArmTimer":
                self.timers[(e.program, e.kind)] = (e.deadline, e.token)  # type: ignore[attr-defined]
            elif name == "CancelTimer":
                self.timers.pop((e.program, e.kind), None)  # type: ignore[attr-defined]
            elif name == "Admit":
                self.program_in_flight.append(e.request_id)  # type: ignore[attr-defined]
            elif isinstance(e, AdmitBatch):
                assert e.request_id in self.queued, f"dispatched {e.request_id} that was not queued"
                self.queued.discard(e.request_id)
                self.running.add(e.request_id)
                self._check_engine_queue_gate(e.target_id, e.request_id)
                if not e.starvation_escape:
                    # Programs first: beside a waiting Program batch only fills its guaranteed share
                    rank = self.state.ranks[e.target_id]
                    homes = waiting_homes(self.state, POOL)
                    if None in homes or e.target_id in homes:
                        cap = self.cfg.token_capacity_per_dp_rank
                        assert cap is not None
                        share = cap * self.bcfg.guaranteed_kv_share
                        assert rank.batch_tokens <= share + 1e-6, "batch beyond its share while a Program waits"
                    dispatched_to.add(e.target_id)
            elif isinstance(e, PreemptBatch):
                self.sent_since_observation.get(e.target_id, set()).discard(e.request_id)
                assert e.request_id in self.running
                self.running.discard(e.request_id)
                self.queued.add(e.request_id)
            elif isinstance(e, Reject) and e.request_id in self.queued:
                self.queued.discard(e.request_id)
                self.done.add(e.request_id)
        # capacity: batch fills only the budget (what Programs leave below the low watermark), except
        # a lone request on an otherwise idle rank
        cap = self.cfg.token_capacity_per_dp_rank
        assert cap is not None
        for tid in dispatched_to:
            rank = self.state.ranks[tid]  # type: ignore[index]
            used = target_usage(rank, self.now, self.cfg.metrics_interval_seconds)
            alone = rank.batch_requests == 1 and not rank.active
            assert used <= cap * self.cfg.low_watermark_ratio or alone, f"{tid}: batch overfilled to {used}"
            # ... and leaves room for the decode the observed running requests still grow into
            growth = decode_growth_tokens(self.state, rank)
            assert used + growth <= cap * self.cfg.low_watermark_ratio or alone, f"{tid}: no room for {growth}"
            if rank.active and rank.batch_requests > 1:
                # Programs keep their decode speed within max_decode_slowdown (the seed's cost model)
                model = self.cfg.decode_throughput_model
                n = len(rank.active)
                ctx = sum(a.estimated_context_tokens for a in rank.active.values())
                alone_step = decode_step_seconds(n, ctx, model)
                shared = decode_step_seconds(n + rank.batch_requests, ctx + rank.batch_tokens, model)
                assert shared <= (1 + self.bcfg.max_decode_slowdown) * alone_step + 1e-12, "Programs slowed too much"
            if rank.batch_requests > 1:
                # the batch's own decode speed: its step stays within RANK_STEP_RATIO times the
                # fastest other rank's (docs/batch.md §2.3); the other ranks only gained work since
                steps = {t: self._decode_step(r) for t, r in self.state.ranks.items()}
                others = [v for t, v in steps.items() if t != tid]
                if others:
                    assert steps[tid] <= RANK_STEP_RATIO * min(others) + 1e-12, f"{tid}: steps {steps}"
        self._check_after_step()
        return result.effects

    def _decode_step(self, rank: Any) -> float:
        """The seed's decode step of a rank's active Programs and running batch requests."""
        n = len(rank.active) + rank.batch_requests
        ctx = sum(a.estimated_context_tokens for a in rank.active.values()) + rank.batch_tokens
        return decode_step_seconds(n, ctx, self.cfg.decode_throughput_model)

    def _check_engine_queue_gate(self, target: object, request_id: object) -> None:
        rank = self.state.ranks[target]  # type: ignore[index]
        ids = self.sent_since_observation.setdefault(target, set())
        sent = len(ids)
        ids.add(request_id)
        waiting = fresh_waiting(rank, self.now, self.cfg.metrics_interval_seconds)
        limit = self.bcfg.engine_queue_requests
        if not limit or waiting is None:
            return  # no gate, or no fresh observation: today's budget alone decides
        idle = rank.batch_requests == 1 and not rank.active  # the lone request an idle rank takes
        assert waiting + sent < limit or idle, f"{target}: {waiting} waiting + {sent} sent reach {limit}"

    def _deliver_due(self) -> None:
        for _ in range(1000):
            due = sorted((d, tok, key) for key, (d, tok) in self.timers.items() if d <= self.now)
            if not due:
                return
            _, token, key = due[0]
            del self.timers[key]
            self._step(TimerFired(key[0], key[1], token))

    # ---- rules --------------------------------------------------------------------------------

    @rule(
        job=st.sampled_from(JOBS),
        tokens=st.integers(min_value=0, max_value=3_000),
        cap=st.sampled_from([None, 8, 200]),
        preemptible=st.booleans(),
    )
    def submit_batch(self, job: str, tokens: int, cap: int | None, preemptible: bool) -> None:
        self.n += 1
        rid = f"b{self.n}"
        self.queued.add(rid)
        self._step(BatchSubmitted(RequestId(rid), job, tokens, cap, preemptible=preemptible))

    @rule(job=st.sampled_from(JOBS), count=st.integers(min_value=5, max_value=20), tokens=st.sampled_from([0, 50, 400]))
    def submit_batch_burst(self, job: str, count: int, tokens: int) -> None:
        for _ in range(count):
            self.n += 1
            rid = f"b{self.n}"
            self.queued.add(rid)
            self._step(BatchSubmitted(RequestId(rid), job, tokens, None, preemptible=True))

    @rule(program=st.integers(min_value=0, max_value=2), tokens=st.sampled_from([40, 300, 1_500, 5_000, 15_000]))
    def submit_program(self, program: int, tokens: int) -> None:
        self.n += 1
        parsed = parse_program_request(program, {})  # the edge's own parsing (property_tests/strategies.py)
        self._step(RequestSubmitted(RequestId(f"r{self.n}"), parsed.identity, tokens))

    @rule(
        data=st.data(),
        reason=st.sampled_from(["stop", "length", None]),
        success=st.booleans(),
        decode=st.integers(min_value=0, max_value=600),
    )
    def complete_batch(self, data: st.DataObject, reason: str | None, success: bool, decode: int) -> None:
        if not self.running:
            return
        rid = data.draw(st.sampled_from(sorted(self.running)))
        self.running.discard(rid)
        self.done.add(rid)
        self._step(RequestCompleted(RequestId(rid), success, Usage(None, None, decode), finish_reason=reason))

    @rule(data=st.data())
    def complete_program(self, data: st.DataObject) -> None:
        if not self.program_in_flight:
            return
        rid = data.draw(st.sampled_from(self.program_in_flight))
        self.program_in_flight.remove(rid)
        self._step(RequestCompleted(RequestId(rid), True, Usage(500, 0, 20), terminate=data.draw(st.booleans())))

    @rule(data=st.data())
    def abandon_batch(self, data: st.DataObject) -> None:
        live = sorted(self.queued | self.running)
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        self.queued.discard(rid)
        self.running.discard(rid)
        self.done.add(rid)
        self._step(RequestAbandoned(RequestId(rid)))

    @rule(dt=st.sampled_from([0.5, 3.0, 11.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._deliver_due()
        self._step(RepairTick(self.now))

    @rule(index=st.integers(min_value=0, max_value=1), kv=st.floats(0.0, 1.0), waiting=st.integers(0, 3))
    def observe(self, index: int, kv: float, waiting: int) -> None:
        if index >= len(self.targets):
            return
        t = self.targets[index].target_id
        self._step(ObservationStarted(t, 1 + self.n))  # type: ignore[arg-type]
        self._step(ObservationReceived(t, 1 + self.n, kv, 2, waiting))  # type: ignore[arg-type]

    # ---- checks -----------------------------------------------------------------------------

    def _check_after_step(self) -> None:
        s = self.state
        b = s.batch
        assert b is not None
        assert invariants.check(s, self.cfg) == []
        assert set(b.pending) == self.queued, (set(b.pending), self.queued)
        assert set(b.running) == self.running, (set(b.running), self.running)
        for rank in s.ranks.values():
            reserve = min(rank.batch_requests + self.bcfg.reserve_margin_blocks, self.bcfg.reserve_max_blocks)
            assert min(self.bcfg.reserve_margin_blocks, self.bcfg.reserve_max_blocks) <= reserve
            assert reserve <= self.bcfg.reserve_max_blocks
        if not b.pending:
            return
        # work conservation and the starvation escape: after a step no rank takes the pick it is
        # offered (dispatch_batch's loop may only end there)
        oldest = next(iter(b.pending.values()))
        offers, escape = dispatch_offers(s, POOL, oldest)
        predictor = JobPredictor(b, s.now)
        for offer in offers:
            taken = taken_pick(s, offer, predictor, oldest, escape)
            assert taken is None, f"{offer.rank.target_id} would take {taken[0].request_id}: a fitting request waits"

    @invariant()
    def nothing_lost(self) -> None:
        assert not (self.queued & self.running)
        assert not ((self.queued | self.running) & self.done)

    def teardown(self) -> None:
        if not hasattr(self, "events"):
            return
        fresh = initial_state(self.cfg, self.bcfg)
        for (now, event), expected in zip(self.events, self.effects, strict=True):
            assert step(fresh, event, now=now, cfg=self.cfg).effects == expected


TestBatchMachine = BatchMachine.TestCase


def test_requests_predicted_at_zero_tokens_respect_the_engine_queue_gate() -> None:
    """Found by the machine: five batch requests of an empty prompt beside a waiting Program, the
    first one's natural stop after 0 tokens makes the job's prediction 0, and its completion let
    the other four through the shut engine-queue gate at once (a 0 budget fits 0 tokens)."""
    machine = BatchMachine()
    machine.setup(ranks=1, capacity=2000, margin=0, cap=1, max_jobs=0, share=0.5, gate=1)
    machine.submit_program(0, 5000)
    machine.submit_batch_burst("__default__", 5, 0)
    machine.tick(11.0)
    machine.submit_program(1, 1500)
    machine.observe(0, kv=0.0, waiting=0)
    assert machine.running == {"b2"}
    machine.running.discard("b2")
    machine.done.add("b2")
    machine._step(RequestCompleted(RequestId("b2"), True, Usage(None, None, 0), finish_reason="stop"))
    assert len(machine.running) == 1  # one at a time through a gate of 1, not four
    machine.teardown()
