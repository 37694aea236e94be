"""Re-queueing a blocking long prefill in a whole simulated daemon (docs/priority.md §3,
"Re-queueing a blocking long prefill"): the quick start on the first turns of check-fairness's
``hogs`` scenario (two 29,500-token hog Programs per rank at t = 0, four light Programs from 2.1 s),
in virtual time on the simulated engines, under several Trio wake orders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from bench.fairness.scenarios import ClusterSize, build, truncate
from bench.replay import ReplayOptions
from bench.simulate import run_simulation
from daemon.config_loading import load_config

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"
TRACE = truncate(build("hogs", ClusterSize(2, 65_536), seed=0).trace, 1)
OPTS = ReplayOptions(sim_hints=True)
_REPORTS: list[dict[str, Any]] = []


def _run(requeue: bool) -> dict[str, Any]:
    cfg = load_config(QUICKSTART)
    assert cfg.priority.requeue_long_prefills  # the quick start sets it
    if not requeue:
        cfg = attrs.evolve(cfg, priority=attrs.evolve(cfg.priority, requeue_long_prefills=False))
    return run_simulation(cfg, TRACE, OPTS, system="agentd")


@settings(max_examples=3, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
@given(st.random_module())
def test_hog_prefills_are_taken_back_for_the_light_tenant_reproducibly(seeder: Any) -> None:
    """Both hogs' first prefills are taken back when the light tenant's first requests land behind
    them; every request completes once with its whole answer, and runs under different Trio wake
    orders give identical reports (docs/architecture.md §7)."""
    report = _run(requeue=True)
    assert report["requests"] == {"planned": 8, "completed": 8, "failed": 0, "errors": {}}
    assert report["tokens"]["output"] == sum(r.output_length for r in TRACE.records)
    assert report["scheduling"]["transitions"]["prefill_requeue"] == 2
    light = report["tenants"]["light"]
    assert light["ttft_seconds"]["max"] == pytest.approx(0.368, abs=1e-3)
    assert light["jct_seconds"]["mean"] == pytest.approx(0.691, abs=1e-3)
    _REPORTS.append({k: v for k, v in report.items() if k != "simulation"})
    assert _REPORTS[-1] == _REPORTS[0]


def test_without_requeue_the_light_tenant_waits_for_the_hogs_prefills() -> None:
    report = _run(requeue=False)
    assert report["requests"]["failed"] == 0
    assert "prefill_requeue" not in report["scheduling"]["transitions"]
    light = report["tenants"]["light"]
    assert light["ttft_seconds"]["max"] == pytest.approx(3.781, abs=1e-3)  # a whole hog prefill
    assert light["jct_seconds"]["mean"] == pytest.approx(2.235, abs=1e-3)
