"""Helpers for the scheduling-core unit tests (tests/unit/test_core_*.py); not a test module."""

from __future__ import annotations

from typing import Any

from attrs import frozen

from actors.core import effects as fx
from actors.core.config import BackendTarget, ProgramSchedulingConfig
from actors.core.events import (
    ObservationReceived,
    ObservationStarted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestSubmitted,
    TargetsChanged,
    TimerFired,
)
from actors.core.ids import ProgramRef, RequestId, TargetId
from actors.core.model import RequestHints, Usage
from actors.core.scheduler import initial_state, step
from actors.core.state import SchedulerState

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


def cfg(**kw: Any) -> ProgramSchedulingConfig:
    return ProgramSchedulingConfig(**kw)


def targets(n: int, url: str = "http://w") -> tuple[BackendTarget, ...]:
    return tuple(BackendTarget(worker_url=url, dp_rank=i, target_id=f"{url}@{i}", index=i) for i in range(n))


def tid(i: int, url: str = "http://w") -> TargetId:
    return TargetId(f"{url}@{i}")


class Harness:
    """Drives the core with explicit times and keeps every effect."""

    def __init__(self, config: ProgramSchedulingConfig | None = None, n_targets: int = 1, **kw: Any) -> None:
        self.cfg = config if config is not None else cfg(**kw)
        self.state: SchedulerState = initial_state(self.cfg)
        self.now = 0.0
        self.log: list[Any] = []
        self._n = 0
        if n_targets:
            self.feed(TargetsChanged(POOL, targets(n_targets)))

    def feed(self, event: Any, at: float | None = None) -> tuple[Any, ...]:
        if at is not None:
            self.now = at
        st = step(self.state, event, now=self.now, cfg=self.cfg)
        assert st.state is self.state
        self.log.extend(st.effects)
        return st.effects

    def submit(
        self,
        program: str,
        tokens: int = 100,
        at: float | None = None,
        rid: str | None = None,
        hints: RequestHints | None = None,
        ident: Ident | None = None,
        **ik: Any,
    ) -> tuple[Any, ...]:
        self._n += 1
        rid = rid or f"r{self._n}"
        identity = ident or Ident(program, placement_key=program, placement_hash_key=program, **ik)
        return self.feed(RequestSubmitted(RequestId(rid), identity, tokens, hints or RequestHints()), at)

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
    ) -> tuple[Any, ...]:
        return self.feed(
            RequestCompleted(RequestId(rid), success, Usage(prompt, cached, completion), decode, terminate), at
        )

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
        return self.feed(TimerFired(ref, kind, token), at)

    def program(self, program_id: str) -> Any:
        from actors.core.ids import ProgramKey

        return self.state.programs.get(ProgramKey(POOL, program_id))

    def rank(self, i: int = 0) -> Any:
        return self.state.ranks[tid(i)]


def of(effects: tuple[Any, ...] | list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def admitted(effects: tuple[Any, ...] | list[Any]) -> list[str]:
    return [e.request_id for e in of(effects, fx.Admit)]


def reasons(effects: tuple[Any, ...] | list[Any]) -> list[str]:
    return [e.reason for e in of(effects, fx.Transition)]
