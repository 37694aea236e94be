"""configs/grafana/agentd.json filters, groups and names series only by labels that exist.

``test_grafana_dashboard.py`` checks the metric names of every panel query; a label that no
series carries passes that check and fails silently in Grafana: a matcher on it selects nothing
(``{targt=~"$target"}``), a ``by (...)`` on it collapses every series into one, a legend
``{{kind}}`` on it renders empty.  This walk (session 31) checks, for every panel query, the label
names of its selector matchers, of its grouping clauses and of its legend against what the
exported families declare: the daemon's own families from its registry (label names are known
before a series has a sample), the workers' from a simulated worker's ``/metrics``, and the
labels Prometheus attaches to every scraped series (``instance``, ``job``).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from test_grafana_dashboard import body, dashboard_panels, load_dashboard, sim_config
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client

from daemon.supervisor import run_daemon

# labels Prometheus adds to every series it scrapes (the dashboard's $worker variable reads instance)
SCRAPE_LABELS = frozenset({"instance", "job"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(by|without|on|ignoring)\s*\(([^()]*)\)")
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_IDENT = re.compile(r"(?<![\w:.$])[a-zA-Z_:][a-zA-Z0-9_:]*")

SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def registry_labels(registry: CollectorRegistry) -> dict[str, frozenset[str]]:
    """series name -> its label names, for every family of ``registry`` (samples or not)."""
    out: dict[str, frozenset[str]] = {}
    for family in registry.collect():
        names: set[str] = set()
        for collector_name, collector in registry._names_to_collectors.items():
            if collector_name in (family.name, f"{family.name}_total"):
                names.update(getattr(collector, "_labelnames", ()))
        names.update(getattr(family, "_labelnames", ()))  # a custom collector's family (no sample yet)
        for sample in family.samples:
            names.update(sample.labels)
        base = frozenset(names - {"le", "quantile"})
        out[family.name] = base
        for suffix in SUFFIXES:
            out[family.name + suffix] = base | ({"le"} if suffix == "_bucket" else set())
    return out


def exposition_labels(text: str) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in out.items()}


def label_problems(expr: str, legend: str | None, labels: dict[str, frozenset[str]]) -> list[str]:
    """What in ``expr`` (and its ``legend``) names a label none of its series has."""
    problems: list[str] = []
    s = _STRING.sub('""', expr)
    selected: dict[str, frozenset[str]] = {}
    for m in _SELECTOR.finditer(s):
        name = m.group(1)
        have = labels.get(name, frozenset()) | SCRAPE_LABELS
        selected[name] = have
        for matcher in _MATCHER.finditer(m.group(2)):
            if matcher.group(1) not in have:
                problems.append(f"{name}{{{matcher.group(1)}...}}: {name} has no label {matcher.group(1)!r}")
    for ident in _IDENT.findall(_SELECTOR.sub(" ", s)):
        if ident in labels:
            selected.setdefault(ident, labels[ident] | SCRAPE_LABELS)
    everywhere = frozenset().union(*selected.values()) if selected else SCRAPE_LABELS
    grouped: set[str] = set()
    for m in _GROUPING.finditer(s):
        names = {n.strip() for n in m.group(2).split(",") if n.strip()}
        if m.group(1) == "by":
            grouped |= names
        for n in sorted(names - everywhere):
            problems.append(f"{m.group(1)} ({n}): no series of {sorted(selected)} has it")
    # a legend can only show labels the result keeps: the grouping labels when there is a `by`
    shown = frozenset(grouped) if grouped else everywhere
    for n in _LEGEND.findall(legend or ""):
        if n not in shown:
            problems.append(f"legend {{{{{n}}}}}: not a label of the result")
    return problems


# ----------------------------------------------------------------------------- the checker


@pytest.mark.parametrize(
    ("expr", "legend", "found"),
    [
        ('sum by (reason) (rate(t_total{target=~"$t"}[5m]))', "{{reason}}", []),
        ('rate(t_total{targt=~"$t"}[5m])', None, ["t_total{targt...}: t_total has no label 'targt'"]),
        ("sum by (kind) (rate(t_total[5m]))", "{{kind}}", ["by (kind): no series of ['t_total'] has it"]),
        ("sum by (reason) (rate(t_total[5m]))", "{{target}}", ["legend {{target}}: not a label of the result"]),
        ('histogram_quantile(0.9, sum by (le, target) (rate(h_bucket{target=~"$t"}[5m])))', "{{target}}", []),
        ("sum by (le) (rate(t_total[5m]))", None, ["by (le): no series of ['t_total'] has it"]),
        ('w{instance=~"$worker"}', "{{instance}} {{engine}}", []),
        ('sum(rate(t_total{reason="x"}[5m])) / ignoring(reason) group_left sum(rate(t_total[5m]))', None, []),
    ],
)
def test_the_label_checker(expr: str, legend: str | None, found: list[str]) -> None:
    labels = {
        "t_total": frozenset({"reason", "target"}),
        "h_bucket": frozenset({"le", "target"}),
        "w": frozenset({"engine"}),
    }
    assert label_problems(expr, legend, labels) == found


# ----------------------------------------------------------------------------- against a real daemon


async def test_every_dashboard_label_is_exported(autojump_clock: trio.testing.MockClock) -> None:
    dash = load_dashboard()
    cfg = sim_config()
    (worker_url,) = cfg.worker_urls()
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(run_daemon, cfg, serve_http=False, sim_configure=lambda c: attrs.evolve(c, deterministic=True))
            )
            async with in_process_client(handles) as client:
                for _turn in range(2):
                    r = await client.post("/v1/chat/completions", json=body("grafana"))
                    assert r.status_code == 200
                await handles.program_dispatcher.wait_diagnostics(
                    lambda d: (
                        d["backend_polling_started"]
                        and d["ranks"][0]["observation_fresh"]
                        and bool(d["token_estimation"])
                    )  # the coefficient gauge has its series
                )
                while True:  # the scheduler's snapshot (the Program gauges) follows at its next tick
                    text = (await client.get("/metrics")).text
                    if "token_estimate_coefficient{" in text:
                        break
                    await handles.program_dispatcher.scheduler.wait_changed()
                daemon_labels = registry_labels(handles.registry)
                for name, found in exposition_labels(text).items():
                    daemon_labels[name] = daemon_labels.get(name, frozenset()) | found
            worker_resp = await handles.client.get(f"{worker_url}/metrics")
            assert worker_resp.status_code == 200
            handles.request_shutdown()
    labels: dict[str, frozenset[str]] = {**exposition_labels(worker_resp.text), **daemon_labels}
    # the checker sees the families it must: a daemon family without samples yet, and a worker's
    assert {"reason"} <= labels["agentd_proxy_rejected_requests_total"]
    assert {"engine"} <= labels["vllm:num_requests_running"]
    problems: dict[str, list[str]] = {}
    checked = 0
    for panel in dashboard_panels(dash):
        for target in panel["targets"]:
            checked += 1
            found = label_problems(target["expr"], target.get("legendFormat"), labels)
            if found:
                problems.setdefault(panel["title"], []).extend(found)
    for var in dash["templating"]["list"]:
        query: Any = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        m = re.fullmatch(r"\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*(\w+)\s*\)\s*", text)
        if m is not None and m.group(2) not in labels.get(m.group(1), frozenset()) | SCRAPE_LABELS:
            problems.setdefault(f"${var['name']}", []).append(f"{m.group(1)} has no label {m.group(2)!r}")
    assert checked >= 40
    assert problems == {}
