"""The ``las`` resume order: least attained service of the task first (docs/program-scheduling.md §5.1)."""

from __future__ import annotations

from typing import Any

from core_support import POOL, Harness, Ident, admitted, of

from actors.core import effects as fx
from actors.core.config import ProgramSchedulingConfig, problems
from actors.core.ids import ProgramKey
from actors.core.invariants import check


def _served(h: Harness, program: str, seconds: float, at: float, ident: Ident | None = None) -> None:
    """``program`` runs one request from ``at`` for ``seconds`` on a free rank (warm-up: its
    fitted TTL is 0, so it pauses at the completion and frees the slot)."""
    rid = f"{program}@{at}"
    assert admitted(h.submit(program, at=at, rid=rid, ident=ident)) == [rid]
    h.complete(rid, at=at + seconds, prompt=100)


def _two_waiters(order: str) -> tuple[Harness, tuple[Any, ...]]:
    """``b`` served 1 s (finished at 1.0), ``a`` 5 s (finished at 6.0, more recently); ``x`` holds
    the only slot from 6.0 to 10.0 while ``a`` (from 7.0) and ``b`` (from 8.0) wait."""
    h = Harness(max_active_programs_per_target=1, resume_order=order)
    _served(h, "b", 1.0, at=0.0)
    _served(h, "a", 5.0, at=1.0)
    assert admitted(h.submit("x", at=6.0, rid="x1")) == ["x1"]
    assert admitted(h.submit("a", at=7.0, rid="a2")) == []
    assert admitted(h.submit("b", at=8.0, rid="b2")) == []
    return h, h.complete("x1", at=10.0, prompt=100)


def test_las_resumes_the_least_served_task_first_where_mru_takes_the_latest_finisher() -> None:
    h, eff = _two_waiters("las")
    assert admitted(eff) == ["b2"]  # b's task attained 1 s, a's 5 s
    (a,) = of(eff, fx.Admit)
    assert (a.queue_wait_seconds, h.now) == (2.0, 10.0)
    s = h.state.attained
    assert (s.of(ProgramKey(POOL, "a")), s.of(ProgramKey(POOL, "b")), s.of(ProgramKey(POOL, "x"))) == (5.0, 1.0, 4.0)
    assert check(h.state, h.cfg) == []
    h, eff = _two_waiters("mru")
    assert admitted(eff) == ["a2"]  # a finished at 6.0, b at 1.0
    h, eff = _two_waiters("fcfs")
    assert admitted(eff) == ["a2"]  # a queued at 7.0, b at 8.0


def test_las_keys_service_on_the_task_so_a_new_subagent_inherits_its_lead_s_service() -> None:
    """A subagent of a task whose lead was served 5 s waits behind a new Program of a task that
    was served 1 s, although the subagent itself was never served (JCT is per task)."""
    h = Harness(max_active_programs_per_target=1, resume_order="las")
    lead = Ident("t1:lead", placement_key="t1", placement_hash_key="t1", task_id="t1")
    other = Ident("t2:lead", placement_key="t2", placement_hash_key="t2", task_id="t2")
    sub = Ident("t1:sub", placement_key="t1", placement_hash_key="t1", task_id="t1", parent_program_id="t1:lead")
    _served(h, "t2:lead", 1.0, at=0.0, ident=other)
    _served(h, "t1:lead", 5.0, at=1.0, ident=lead)
    assert admitted(h.submit("x", at=6.0, rid="x1")) == ["x1"]
    assert admitted(h.submit("t1:sub", at=7.0, rid="s1", ident=sub)) == []
    assert admitted(h.submit("t2:lead", at=8.0, rid="o2", ident=other)) == []
    assert h.state.attained.of(ProgramKey(POOL, "t1:sub")) == 5.0
    assert admitted(h.complete("x1", at=10.0, prompt=100)) == ["o2"]
    h.complete("o2", at=11.5, prompt=100)  # t2 now attained 2.5 s, still below t1's 5
    assert h.state.attained.of(ProgramKey(POOL, "t2:lead")) == 2.5
    assert h.program("t1:sub").state == "active"  # the only waiter left: admitted at 11.5
    h.complete("s1", at=12.0, prompt=100)
    assert h.state.attained.of(ProgramKey(POOL, "t1:lead")) == 5.5  # lead 5 s + subagent 0.5 s


def test_las_starvation_bound_is_the_force_resume_deadline() -> None:
    """A stream of new tasks (no service yet) passes the 5 s task ``a`` at every completion; ``a``
    is admitted at its force-resume deadline, 7.0 + 20 s, exactly (docs/program-scheduling.md §5.1)."""
    h, eff = _two_waiters_forced()
    assert admitted(eff) == ["a2"]
    (t,) = [e for e in of(eff, fx.Transition) if e.reason == "force_resume"]
    assert t.forced
    (adm,) = of(eff, fx.Admit)
    assert adm.queue_wait_seconds == 20.0  # the force-resume timer fired at 27.0, before the tick at 27.5
    assert check(h.state, h.cfg) == []


def _two_waiters_forced() -> tuple[Harness, tuple[Any, ...]]:
    h = Harness(max_active_programs_per_target=1, resume_order="las", force_resume_timeout_seconds=20.0)
    _served(h, "b", 1.0, at=0.0)
    _served(h, "a", 5.0, at=1.0)
    assert admitted(h.submit("x", at=6.0, rid="x1")) == ["x1"]
    assert admitted(h.submit("a", at=7.0, rid="a2")) == []
    assert h.program("a").force_resume_deadline == 27.0
    running = "x1"
    for k in range(8):  # n0 arrives at 11.0, the running request ends at 12.0, n0 enters; and so on
        assert admitted(h.submit(f"n{k}", at=11.0 + 2 * k, rid=f"n{k}")) == []
        assert admitted(h.complete(running, at=12.0 + 2 * k, prompt=100)) == [f"n{k}"]
        running = f"n{k}"
    assert h.now == 26.0 and h.program("a").state == "paused"
    return h, h.tick(at=27.5)


def test_las_forgets_a_task_with_its_last_program_history() -> None:
    """The attained service of a task lives as long as one of its Programs' generation histories:
    released at 3.0, forgotten by the tick at 3.0 + max(retention, 60 s) (bounded memory)."""
    h = Harness(max_active_programs_per_target=1, resume_order="las", paused_retention_ttl_seconds=30.0)
    done = Ident("s", placement_key="t", placement_hash_key="t", task_id="t", expected_resume=False)
    _served(h, "s", 2.0, at=1.0, ident=done)
    assert h.program("s") is None  # released at its completion (expected_resume: false)
    assert h.state.attained.of(ProgramKey(POOL, "s")) == 2.0
    h.tick(at=62.9)
    assert h.state.attained.of(ProgramKey(POOL, "s")) == 2.0
    h.tick(at=63.0)
    assert h.state.attained.of(ProgramKey(POOL, "s")) == 0.0
    assert ProgramKey(POOL, "s") not in h.state.attained.task_of and not h.state.attained.seconds


def test_las_is_a_valid_resume_order_and_others_are_refused() -> None:
    assert problems(ProgramSchedulingConfig(resume_order="las")) == []
    (msg,) = problems(ProgramSchedulingConfig(resume_order="lifo"))
    assert msg.startswith("resume_order: must be one of 'mru', 'fcfs', 'las'")


def test_las_keeps_a_tasks_service_while_one_of_its_programs_lives_then_forgets_the_task() -> None:
    """A task's attained service outlives a forgotten member while another lives; its entry goes with its last one."""
    h = Harness(max_active_programs_per_target=1, resume_order="las", paused_retention_ttl_seconds=30.0)
    lead = Ident("t:lead", placement_key="t", placement_hash_key="t", task_id="t", expected_resume=False)
    sub = Ident("t:sub", placement_key="t", placement_hash_key="t", task_id="t", expected_resume=False)
    _served(h, "t:lead", 1.0, at=0.0, ident=lead)  # released at 1.0
    _served(h, "t:sub", 2.0, at=2.0, ident=sub)  # released at 4.0
    s = h.state.attained
    assert s.members == {(POOL, "t"): 2} and s.of(ProgramKey(POOL, "t:sub")) == 3.0
    h.tick(at=61.0)  # the lead's history is pruned: the task keeps the service it attained
    assert ProgramKey(POOL, "t:lead") not in s.task_of
    assert s.members == {(POOL, "t"): 1} and s.of(ProgramKey(POOL, "t:sub")) == 3.0
    h.tick(at=64.0)  # the last member goes: so does the task's entry
    assert (s.members, s.seconds, s.task_of) == ({}, {}, {})


def test_las_counts_a_program_once_in_its_task_whatever_its_arrivals() -> None:
    """A Program's later arrivals do not join its task again: the task has one member per Program."""
    h = Harness(max_active_programs_per_target=1, resume_order="las")
    _served(h, "p", 1.0, at=0.0, ident=Ident("p", placement_key="t", placement_hash_key="t", task_id="t"))
    _served(h, "p", 2.0, at=2.0, ident=Ident("p", placement_key="t", placement_hash_key="t", task_id="t"))
    assert h.state.attained.members == {(POOL, "t"): 1}
    assert h.state.attained.of(ProgramKey(POOL, "p")) == 3.0
