"""Run the daemon and the replay in one Trio run: embedded simulated ranks, no sockets.

``simulate_trace(cfg, trace, opts)`` starts ``run_daemon(cfg, serve_http=False)``, which in
embedded mode (``routing.worker_urls`` empty) runs one simulated server per embedded worker behind
a ``SimTransport`` (no sockets; ``sim_configure`` puts them in deterministic virtual-time mode),
connects the replay client to the daemon through
:class:`~bench.inprocess.InProcessTransport`, scrapes the simulated workers and the
daemon's registry before and after, and returns the same report as ``agentd replay``.  ``run_simulation`` wraps it in ``trio.run`` under ``trio.testing.MockClock
(autojump_threshold=0)``: time is virtual, so a run costs only the CPU of the simulation, and the
result is a function of the config, the trace and the seed.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

from bench.inprocess import InProcessTransport
from bench.replay import ReplayOptions, run_replay
from bench.report import build_report, scrape_all
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


async def simulate_trace(
    cfg: AgentdConfig,
    trace: Trace,
    opts: ReplayOptions,
    *,
    info: dict[str, Any] | None = None,
    system: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    per_step_wakeups: bool = False,
) -> dict[str, Any]:
    """Simulate ``cfg`` (embedded mode) serving ``trace``; must run under a MockClock.

    The simulated servers run with ``deterministic=True`` (same-instant submissions are ordered by
    their content, not by Trio's task order) and, unless ``per_step_wakeups``, wake only at the
    ends of multi-step decode runs (the fastest mode in virtual time; TTFT and completions keep
    their exact times).
    """
    from daemon.supervisor import run_daemon  # noqa: PLC0415 - heavy import, only when simulating

    check_simulatable(cfg)
    worker_metrics = [f"{url}/metrics" for url in cfg.worker_urls()]

    def configure(sim: SimConfig) -> SimConfig:
        return attrs.evolve(sim, deterministic=True, per_step_wakeups=per_step_wakeups)

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
            wb = await scrape_all(handles.client, worker_metrics)
            rb = await scrape_all(client, [f"{DAEMON_URL}/metrics"])
            result = await run_replay(trace, client, DAEMON_URL, opts, progress=progress)
            wa = await scrape_all(handles.client, worker_metrics)
            ra = await scrape_all(client, [f"{DAEMON_URL}/metrics"])
        handles.request_shutdown()
    return build_report(
        result,
        time_scale=opts.time_scale,
        worker_before=wb,
        worker_after=wa,
        router_before=rb,
        router_after=ra,
        trace_info=info,
        system=system,
    )


def run_simulation(
    cfg: AgentdConfig,
    trace: Trace,
    opts: ReplayOptions,
    *,
    info: dict[str, Any] | None = None,
    system: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``simulate_trace`` in virtual time; adds ``simulation`` (wall seconds, speed-up) to the report."""
    import trio.testing  # noqa: PLC0415 - imports pytest; keep it out of `agentd --help`

    check_simulatable(cfg)
    clock = trio.testing.MockClock(autojump_threshold=0)
    wall0 = time.perf_counter()
    report = trio.run(
        functools.partial(simulate_trace, cfg, trace, opts, info=info, system=system, progress=progress),
        clock=clock,
    )
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
