"""Helpers for the scheduling-core unit tests (tests/unit/test_core_*.py); not a test module."""

from __future__ import annotations

from typing import Any

from attrs import frozen

from actors.core import effects as fx
from actors.core.config import BackendTarget, BatchJobsConfig, PriorityConfig, ProgramSchedulingConfig
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
from actors.core.ids import ProgramKey, ProgramRef, RequestId, TargetId
from actors.core.model import RequestHints, Usage
from actors.core.scheduler import initial_state, step
from actors.core.state import SchedulerState
from actors.core.stats import RequestSample

POOL = "default"


@frozen
class Ident:
    program_id: str
    placement_key: str = ""
    placement_hash_key: str = ""
    task_id: str | None = None
    session_id: str | None = None
    agent_id: str | None = None
    parent_program_id: str | None = None
    root_program_id: str | None = None
    blocks_parent: bool = False
    agent_role: str | None = None
    spawn_reason: str | None = None
    expected_resume: bool = True
    step_id: int | None = None


def request_sample(
    *,
    prompt: int = 100,
    completion: int = 10,
    cached: int = 0,
    growth: int | None = None,
    e2e: float = 1.0,
    decode: float | None = None,
    queue: float = 0.0,
    rounds: int = 1,
    at: float = 0.0,
) -> RequestSample:
    """One statistics-window sample, with short keyword names and neutral defaults."""
    return RequestSample(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_prompt_tokens=cached,
        context_growth_tokens=growth,
        e2e_seconds=e2e,
        decode_seconds=decode,
        queue_seconds=queue,
        rounds_since_ttl_pause=rounds,
        finished_at=at,
    )


def cfg(**kw: Any) -> ProgramSchedulingConfig:
    return ProgramSchedulingConfig(**kw)


def targets(n: int, url: str = "http://w") -> tuple[BackendTarget, ...]:
    return tuple(BackendTarget(worker_url=url, dp_rank=i, target_id=f"{url}@{i}", index=i) for i in range(n))


def tid(i: int, url: str = "http://w") -> TargetId:
    return TargetId(f"{url}@{i}")


class Harness:
    """Drives the core with explicit times and keeps every effect.

    Like the Program actors, the harness delivers every armed timer when its deadline is reached:
    before an event at ``at``, the timers due by then fire in ``(deadline, token)`` order, each at
    its deadline; after the event, the timers it armed for ``now`` or earlier fire at once.
    ``feed`` returns the effects of all these steps in order.  ``fire`` delivers one
    ``TimerFired`` by hand and nothing else.
    """

    def __init__(
        self,
        config: ProgramSchedulingConfig | None = None,
        n_targets: int = 1,
        batch: BatchJobsConfig | None = None,
        priority: PriorityConfig | None = None,
        **kw: Any,
    ) -> None:
        self.cfg = config if config is not None else cfg(**kw)
        self.state: SchedulerState = initial_state(self.cfg, batch, priority)
        self.now = 0.0
        self.log: list[Any] = []
        self.timers: dict[tuple[ProgramRef, str], tuple[float, int]] = {}
        self._n = 0
        if n_targets:
            self.feed(TargetsChanged(POOL, targets(n_targets)))

    def _step(self, event: Any) -> tuple[Any, ...]:
        st = step(self.state, event, now=self.now, cfg=self.cfg)
        assert st.state is self.state
        self.log.extend(st.effects)
        for e in st.effects:
            if isinstance(e, fx.ArmTimer):
                self.timers[(e.program, e.kind)] = (e.deadline, e.token)
            elif isinstance(e, fx.CancelTimer):
                self.timers.pop((e.program, e.kind), None)
            elif isinstance(e, fx.RetireProgram):
                for key in [k for k in self.timers if k[0] == e.program]:
                    del self.timers[key]
        return st.effects

    def deliver_due(self, until: float) -> tuple[Any, ...]:
        """Fire the armed timers due at or before ``until``, in (deadline, token) order."""
        out: list[Any] = []
        for _ in range(10_000):
            due = sorted((d, tok, key) for key, (d, tok) in self.timers.items() if d <= until)
            if not due:
                return tuple(out)
            deadline, token, key = due[0]
            del self.timers[key]
            self.now = max(self.now, deadline)
            out.extend(self._step(TimerFired(key[0], key[1], token)))
        raise AssertionError("timers keep re-arming in the past")

    def feed(self, event: Any, at: float | None = None) -> tuple[Any, ...]:
        out: list[Any] = []
        out.extend(self.deliver_due(self.now if at is None else at))
        if at is not None:
            self.now = at
        out.extend(self._step(event))
        out.extend(self.deliver_due(self.now))
        return tuple(out)

    def submit(
        self,
        program: str,
        tokens: int = 100,
        at: float | None = None,
        rid: str | None = None,
        hints: RequestHints | None = None,
        ident: Ident | None = None,
        avoid_workers: frozenset[str] = frozenset(),
        **ik: Any,
    ) -> tuple[Any, ...]:
        self._n += 1
        rid = rid or f"r{self._n}"
        identity = ident or Ident(program, placement_key=program, placement_hash_key=program, **ik)
        event = RequestSubmitted(RequestId(rid), identity, tokens, hints or RequestHints(), avoid_workers=avoid_workers)
        return self.feed(event, at)

    def complete(
        self,
        rid: str,
        at: float | None = None,
        success: bool = True,
        prompt: int | None = None,
        cached: int | None = None,
        completion: int | None = None,
        decode: float | None = None,
        terminate: bool = False,
        finish_reason: str | None = None,
        tool_names: tuple[str, ...] = (),
    ) -> tuple[Any, ...]:
        return self.feed(
            RequestCompleted(
                RequestId(rid),
                success,
                Usage(prompt, cached, completion),
                decode,
                terminate,
                finish_reason,
                tool_names,
            ),
            at,
        )

    def submit_batch(
        self,
        rid: str,
        job: str = "__default__",
        tokens: int = 100,
        max_tokens: int | None = None,
        at: float | None = None,
    ) -> tuple[Any, ...]:
        return self.feed(BatchSubmitted(RequestId(rid), job, tokens, max_tokens), at)

    def abandon(self, rid: str, at: float | None = None) -> tuple[Any, ...]:
        return self.feed(RequestAbandoned(RequestId(rid)), at)

    def tick(self, at: float | None = None) -> tuple[Any, ...]:
        return self.feed(RepairTick(), at)

    def observe(
        self,
        i: int,
        kv: float | None,
        running: int | None,
        waiting: int | None,
        at: float | None = None,
        epoch: int = 1,
    ) -> tuple[Any, ...]:
        self.feed(ObservationStarted(tid(i), epoch), at)
        return self.feed(ObservationReceived(tid(i), epoch, kv, running, waiting))

    def fire(self, ref: ProgramRef, kind: str, token: int, at: float | None = None) -> tuple[Any, ...]:
        """Deliver one ``TimerFired`` by hand (no other timer is delivered)."""
        if at is not None:
            self.now = at
        if self.timers.get((ref, kind), (None, None))[1] == token:
            del self.timers[(ref, kind)]
        return self._step(TimerFired(ref, kind, token))

    def program(self, program_id: str) -> Any:
        return self.state.programs.get(ProgramKey(POOL, program_id))

    def rank(self, i: int = 0) -> Any:
        return self.state.ranks[tid(i)]


def of(effects: tuple[Any, ...] | list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def admitted(effects: tuple[Any, ...] | list[Any]) -> list[str]:
    return [e.request_id for e in of(effects, fx.Admit)]


def reasons(effects: tuple[Any, ...] | list[Any]) -> list[str]:
    return [e.reason for e in of(effects, fx.Transition)]


BATCH_CAP = 10_000  # the batch-class tests' token capacity per rank


def batch_harness(n_targets: int = 1, batch: BatchJobsConfig | None = None, **kw: Any) -> Harness:
    """A harness with batch jobs on (docs/batch.md §2) and ``BATCH_CAP`` tokens per rank unless given."""
    kw.setdefault("token_capacity_per_dp_rank", BATCH_CAP)
    return Harness(n_targets=n_targets, batch=batch or BatchJobsConfig(enabled=True), **kw)


def admitted_batch(effects: tuple[Any, ...] | list[Any]) -> list[str]:
    return [e.request_id for e in of(effects, fx.AdmitBatch)]
