"""bench.admission_bench --phases: the core's steps and the effect routing timed per cycle."""

from __future__ import annotations

import subprocess
import sys

import actors.scheduler_actor
from actors.core.scheduler import step
from bench.admission_bench import run


async def test_phases_time_the_steps_and_the_routing_of_every_cycle() -> None:
    result = await run(cycles=40, programs=4, concurrency=2, ranks=1, phases=True)
    assert result["cycles"] == 40
    assert result["counters"]["completed_count"] == 44  # the warm-up's 4 and the 40 measured
    assert result["step_us_per_cycle"] > 0 and result["route_us_per_cycle"] > 0
    assert actors.scheduler_actor.step is step  # the clocks were taken off again
    plain = await run(cycles=4, programs=1, concurrency=1, ranks=1)
    assert "step_us_per_cycle" not in plain


def test_the_command_prints_its_result_and_nothing_on_stderr() -> None:
    """The daemon's start-up warnings do not apply to the bench's in-memory cluster: before, each
    one reached stderr as its bare event name (program_scheduling_reference_calibration)."""
    cmd = [sys.executable, "-m", "bench.admission_bench", "--cycles", "20", "--programs", "4"]
    done = subprocess.run(cmd + ["--concurrency", "2", "--ranks", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "20 submit->admit->complete cycles" in done.stdout
