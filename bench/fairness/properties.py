"""The trace-level fairness properties ``agentd check-fairness`` measures (docs/priority.md §6).

Each property reads the victim's figures from two simulation reports of one scenario (the
victim with the adversary, and the victim alone) and gives a :class:`Measure`: the measured value,
its bound and whether it holds.  The figures come from the report's ``tenants`` section
(bench/report.py), so a reproduced ``agentd simulate`` run shows the same numbers.

* ``tenant-isolation`` (``flood``, ``hogs``): the victim's mean JCT with the adversary over its
  mean JCT alone, at most ``ISOLATION_BOUND`` (issue 13's noisy-neighbour bar);
* ``starvation-bound`` (``priority-flood``): when the adversary claims the most urgent priority
  on everything, the documented ordering serves it first (priority before the tenant counter
  inside a class, docs/priority.md §1), so the victim is only owed the starvation bound: its
  longest time to first token with the adversary is at most the agent class's bound,
  ``force_resume_timeout_seconds + metrics_interval_seconds`` (no request waits past its
  force-resume deadline plus one tick; docs/priority.md §4), or the replay's request timeout on
  the native path, which has no router queue.  The JCT ratio is reported beside it
  (``priority-cost``, no bound): what the claimed priority cost the victim;
* ``interactive-ttft`` (``interactive-under-batch``): the interactive tenant's TTFT p90 with a
  saturating batch job over its TTFT p90 alone, at most ``TTFT_BOUND``;
* ``no-starvation`` (every scenario): every request of every tenant completed (none failed or
  timed out) in the run with the adversary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from daemon.config import AgentdConfig

ISOLATION_BOUND = 1.25
TTFT_BOUND = 1.2

# scenario kind -> (property, figure of the victim's tenants entry, bound)
RATIO_PROPERTIES: dict[str, tuple[str, tuple[str, str], float]] = {
    "flood": ("tenant-isolation", ("jct_seconds", "mean"), ISOLATION_BOUND),
    "hogs": ("tenant-isolation", ("jct_seconds", "mean"), ISOLATION_BOUND),
    "interactive-under-batch": ("interactive-ttft", ("ttft_seconds", "p90"), TTFT_BOUND),
}


@attrs.frozen
class Measure:
    prop: str
    scenario: str  # "<kind> seed <s>" or a core machine's name
    measured: float | None  # None: not measurable (e.g. the victim had no completed work)
    bound: float | None
    ok: bool
    detail: str = ""  # how the figure is read (for the reproduction hint)

    def describe(self) -> str:
        if self.measured is None:
            return "n/a"
        return f"{self.measured:.3f}"


def victim_figure(report: Mapping[str, Any], tenant: str, path: tuple[str, str]) -> float | None:
    entry = (report.get("tenants") or {}).get(tenant) or {}
    value = (entry.get(path[0]) or {}).get(path[1])
    return float(value) if isinstance(value, (int, float)) else None


def ratio_measure(
    kind: str, label: str, victim: str, with_adversary: Mapping[str, Any], alone: Mapping[str, Any]
) -> Measure:
    """The scenario's ratio property: victim's figure with the adversary / alone, against its bound."""
    prop, path, bound = RATIO_PROPERTIES[kind]
    both, base = victim_figure(with_adversary, victim, path), victim_figure(alone, victim, path)
    detail = f"tenants.{victim}.{path[0]}.{path[1]} with the adversary / alone"
    if both is None or base is None or base <= 0:
        return Measure(prop, label, None, bound, False, detail + " (no completed work to measure)")
    ratio = both / base
    return Measure(prop, label, ratio, bound, ratio <= bound, detail)


def starvation_bound_seconds(cfg: AgentdConfig, request_timeout_seconds: float) -> float:
    """The agent class's starvation bound (docs/priority.md §4) for ``cfg``."""
    ps = cfg.program_scheduling
    if ps is None:
        return request_timeout_seconds
    return ps.force_resume_timeout_seconds + ps.metrics_interval_seconds


def scenario_measures(
    kind: str,
    label: str,
    victim: str,
    with_adversary: Mapping[str, Any],
    alone: Mapping[str, Any],
    starvation_bound: float,
) -> list[Measure]:
    """Every property of one ``kind`` scenario's pair of runs, in table order."""
    out: list[Measure] = []
    if kind in RATIO_PROPERTIES:
        out.append(ratio_measure(kind, label, victim, with_adversary, alone))
    else:  # priority-flood
        path = ("ttft_seconds", "max")
        worst = victim_figure(with_adversary, victim, path)
        detail = f"tenants.{victim}.ttft_seconds.max with the adversary"
        out.append(
            Measure(
                "starvation-bound",
                label,
                worst,
                starvation_bound,
                worst is not None and worst <= starvation_bound,
                detail,
            )
        )
        jct = ("jct_seconds", "mean")
        both, base = victim_figure(with_adversary, victim, jct), victim_figure(alone, victim, jct)
        ratio = both / base if both is not None and base else None
        out.append(
            Measure("priority-cost", label, ratio, None, True, f"tenants.{victim}.jct_seconds.mean with / alone")
        )
    out.append(starvation_measure(label, with_adversary))
    return out


def starvation_measure(label: str, with_adversary: Mapping[str, Any]) -> Measure:
    """``no-starvation``: the number of failed requests (all tenants) in the run with the adversary."""
    failed = float((with_adversary.get("requests") or {}).get("failed", 0))
    return Measure("no-starvation", label, failed, 0.0, failed == 0, "requests.failed with the adversary")
