"""Run the daemon and the replay in one Trio run: embedded simulated ranks, no sockets.

``run_simulation(cfg, trace, opts)`` runs, under ``trio.testing.MockClock(autojump_threshold=0)``,
``run_daemon(cfg, serve_http=False)``, which in embedded mode (``routing.worker_urls`` empty) runs
one simulated server per embedded worker behind a ``SimTransport`` (no sockets; ``sim_configure``
puts them in deterministic virtual-time mode).  The replay client reaches the daemon through
:class:`~bench.inprocess.InProcessTransport`; the simulated workers and the daemon's registry are
scraped before and after (``bench.report.measured_replay``), so the report is the same as
``agentd replay``'s.  Time is virtual, so a run costs only the CPU of the simulation, and the result
is a function of the config, the trace and the seed.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any

import attrs
import httpx

from bench.inprocess import InProcessTransport
from bench.interrupt import run_interruptible
from bench.replay import ReplayOptions
from bench.report import measured_replay
from bench.trace.format import Trace
from daemon.config import AgentdConfig
from sim.cluster import SimConfig

DAEMON_URL = "http://agentd.simulated"


class SimulateError(ValueError):
    """The configuration cannot be simulated (the message names the field)."""


def check_simulatable(cfg: AgentdConfig) -> None:
    if not cfg.embedded_mode:
        raise SimulateError(
            "routing.worker_urls: must be empty for simulate (it runs the embedded simulated cluster), "
            f"got {list(cfg.routing.worker_urls)!r}"
        )


def run_simulation(
    cfg: AgentdConfig,
    trace: Trace,
    opts: ReplayOptions,
    *,
    info: dict[str, Any] | None = None,
    system: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    per_step_wakeups: bool = True,
) -> dict[str, Any]:
    """Simulate ``cfg`` (embedded mode) serving ``trace`` in virtual time; the report gets a
    ``simulation`` section (wall seconds, speed-ups).

    The simulated servers run with ``deterministic=True`` (same-instant submissions are ordered by
    their content, not by Trio's task order) and, unless ``per_step_wakeups``, wake only at the
    ends of multi-step decode runs (the fastest mode in virtual time; TTFT and completions keep
    their exact times).
    """
    # imported here, not at the top: the daemon's supervisor is heavy, and trio.testing imports
    # pytest; neither belongs in `agentd --help`, which imports every command module
    import trio.testing

    from daemon.supervisor import run_daemon

    check_simulatable(cfg)

    # batch preemption cancels running requests at any time (docs/batch.md §2): the engines must
    # not be advanced ahead of the clock between wake-ups (docs/simulator.md §4, quiet events)
    per_step = per_step_wakeups or cfg.batch_jobs.enabled

    def configure(sim: SimConfig) -> SimConfig:
        return attrs.evolve(sim, deterministic=True, per_step_wakeups=per_step)

    async def simulate() -> dict[str, Any]:
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                functools.partial(
                    run_daemon,
                    cfg,
                    serve_http=False,
                    rng=random.Random(cfg.embedded.seed),
                    sim_configure=configure,
                )
            )
            transport = InProcessTransport(handles, nursery)
            async with httpx.AsyncClient(transport=transport, base_url=DAEMON_URL, timeout=None) as client:
                report = await measured_replay(
                    trace,
                    client,
                    DAEMON_URL,
                    opts,
                    worker_metrics=[f"{url}/metrics" for url in cfg.worker_urls()],
                    worker_client=handles.client,
                    router_metrics=[f"{DAEMON_URL}/metrics"],
                    info=info,
                    system=system,
                    progress=progress,
                )
            handles.request_shutdown()
        return report

    wall0 = time.perf_counter()
    # Ctrl-C cancels the run (its daemon and replay end) and surfaces as one KeyboardInterrupt,
    # never Trio's default raised wherever the simulation happened to be (bench.interrupt)
    report = run_interruptible(simulate, clock=trio.testing.MockClock(autojump_threshold=0))
    wall = time.perf_counter() - wall0
    virtual = report["duration_seconds"] / opts.time_scale
    report["simulation"] = {
        "wall_seconds": wall,
        "virtual_seconds": virtual,
        # vs. running the same replay on real workers at the same time scale
        "speedup_vs_real_time": virtual / wall if wall > 0 else None,
        # vs. the trace's own (unscaled) time
        "speedup_vs_trace_time": report["duration_seconds"] / wall if wall > 0 else None,
    }
    return report


if __name__ == "__main__":
    import sys

    from bench.interrupt import not_a_command

    sys.exit(not_a_command("bench.simulate", "agentd simulate"))
