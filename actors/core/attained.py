"""Attained service per task: the ``las`` resume order's key (docs/program-scheduling.md §5.1).

A task (``placement_key``: the task id, else the session id, else the Program id; one per model
pool) has *attained* the service seconds of every request of its Programs that completed so far:
dispatch to completion, lead and subagents summed, successful or not.  The value comes from
events the core already sees (``RequestCompleted`` against the dispatch it fences); it only grows
while the task lives.

A Program key joins its task at its first arrival (an identity that names another task later
does not move it: the service it brought stays where it was attained) and leaves it when
``sequences.prune_released_generations`` forgets its generation history.  A task's entry goes with
its last member, so the memory is bounded by the Program keys the core keeps anyway, and a live
Program's task is never forgotten.
"""

from __future__ import annotations

from actors.core.ids import ProgramKey

TaskKey = tuple[str, str]  # (model pool, placement key)


class AttainedService:
    __slots__ = ("seconds", "members", "task_of")

    def __init__(self) -> None:
        self.seconds: dict[TaskKey, float] = {}
        self.members: dict[TaskKey, int] = {}
        self.task_of: dict[ProgramKey, TaskKey] = {}

    def join(self, key: ProgramKey, placement_key: str) -> None:
        """Program ``key`` arrived: it belongs to its task from now on (a no-op once joined)."""
        if key in self.task_of:
            return
        task = (key.model_pool, placement_key or key.program_id)
        self.task_of[key] = task
        self.members[task] = self.members.get(task, 0) + 1
        self.seconds.setdefault(task, 0.0)

    def add(self, key: ProgramKey, seconds: float) -> None:
        """A request of Program ``key`` (joined at its arrival) completed after ``seconds`` of service."""
        task = self.task_of[key]
        self.seconds[task] += max(0.0, seconds)

    def of(self, key: ProgramKey) -> float:
        """The service the task of Program ``key`` attained so far (0 for a key that never arrived)."""
        task = self.task_of.get(key)
        return self.seconds[task] if task is not None else 0.0

    def forget(self, key: ProgramKey) -> None:
        """Program ``key``'s generation history was pruned: it leaves its task."""
        task = self.task_of.pop(key, None)
        if task is None:
            return
        left = self.members[task] - 1
        if left > 0:
            self.members[task] = left
        else:
            del self.members[task]
            del self.seconds[task]
