"""Run the core's fairness state machines for ``agentd check-fairness`` (docs/priority.md §6).

The machines themselves (Hypothesis ``RuleBasedStateMachine`` classes over the pure core, with
the VTC bound, starvation, priority-inversion, work-conservation and KV-rent invariants) live in
``bench.fairness.core_machines`` (written with the core, docs/priority.md §4), which exposes
``MACHINES``: a sequence of ``(property name, factory)`` where ``factory(cfg)`` returns the
machine class for the user's configuration.  This module runs each with a budget and a seed,
and turns the outcome into a :class:`~bench.fairness.properties.Measure`; a failing machine's
shrunk steps (Hypothesis's minimal failing example) are written to a file.
"""

from __future__ import annotations

import importlib
import io
import traceback
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import attrs

from bench.fairness.properties import Measure
from bench.interrupt import noticing_interrupts
from bench.output import write_atomic

EXAMPLES_PER_BUDGET = 50  # Hypothesis examples per machine per budget unit
STEPS_PER_EXAMPLE = 30
# a machine whose property needs long walks (a backlog must build up before the service of two
# tenants can drift apart): (examples per budget unit, steps per example)
LONG_WALKS: dict[str, tuple[int, int]] = {"vtc_bound": (20, 100)}

MachineFactory = Callable[[Any], type]


@attrs.frozen
class MachineOutcome:
    measure: Measure
    examples: int
    failure_text: str | None = None  # the shrunk failing steps and the assertion


def available_machines() -> Sequence[tuple[str, MachineFactory]]:
    """``bench.fairness.core_machines.MACHINES``, or nothing when the core's machines are absent."""
    try:
        module = importlib.import_module("bench.fairness.core_machines")
    except ImportError:
        return ()
    return tuple(getattr(module, "MACHINES", ()))


def run_machine(name: str, factory: MachineFactory, cfg: Any, *, budget: int, seed: int) -> MachineOutcome:
    """Run one machine with ``EXAMPLES_PER_BUDGET * budget`` examples from ``seed``."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as use_seed
    from hypothesis.stateful import run_state_machine_as_test

    machine = factory(cfg)
    # a fresh subclass carries the seed, so the core's own class stays untouched
    seeded = use_seed(seed)(type(f"{machine.__name__}Check", (machine,), {}))
    per_budget, steps = LONG_WALKS.get(name, (EXAMPLES_PER_BUDGET, STEPS_PER_EXAMPLE))
    examples = per_budget * budget
    conf = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=False,
        print_blob=False,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    captured = io.StringIO()
    # a Ctrl-C that Hypothesis loses (or turns into the machine's AssertionError) still
    # interrupts: raised at the block's end, never reported as the machine's outcome
    with noticing_interrupts():
        try:
            with redirect_stdout(captured):
                run_state_machine_as_test(seeded, settings=conf)
        except Exception as exc:  # the machine's assertion (or any error in it) is the violation
            notes = "\n".join(getattr(exc, "__notes__", ()))
            text = "".join(traceback.format_exception_only(type(exc), exc))
            failure = f"{text}\n{notes}\n{captured.getvalue()}".strip() + "\n"
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            outcome = Measure(name, f"core machine (seed {seed})", None, None, False, first)
            return MachineOutcome(outcome, examples, failure)
    measured, bound = _worst_case(seeded)
    return MachineOutcome(
        Measure(
            name, f"core machine (seed {seed})", measured, bound, True, f"no counterexample in {examples} examples"
        ),
        examples,
    )


def _worst_case(machine: type) -> tuple[float | None, float | None]:
    """A machine may publish the worst value it saw against its bound as a class attribute
    ``worst_case = (measured, bound)`` (set with ``type(self).worst_case = ...`` by its invariant,
    so it lands on the seeded subclass run here); ``(None, None)`` otherwise."""
    value = getattr(machine, "worst_case", None)
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return float(value[0]), float(value[1])
    return None, None


def examples_of(name: str, budget: int) -> int:
    return LONG_WALKS.get(name, (EXAMPLES_PER_BUDGET, STEPS_PER_EXAMPLE))[0] * budget


def write_failure(out_dir: Path, name: str, outcome: MachineOutcome, command: str) -> Path:
    path = out_dir / f"machine-{name}.txt"
    write_atomic(path, f"# reproduce: {command}\n\n{outcome.failure_text or ''}")
    return path
