"""configs/grafana/agentd.json queries only metrics that agentd and the (simulated) vLLM workers export.

The dashboard is parsed, every panel target's PromQL ``expr`` is reduced to the metric names it
selects (a small identifier extractor, tested below on its own), and a real daemon runs in process
on the embedded simulated backend with Program scheduling on.  After a little Program traffic (so
the histograms have samples and the per-rank gauges exist) the daemon's ``/metrics`` and the
simulated worker's ``/metrics`` are scraped and parsed: every ``vllm:`` name must be a series of
the worker, every other name a series of the daemon.  A misspelt or unsuffixed name fails.
"""

from __future__ import annotations

import json
import re
import tomllib
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig, EmbeddedConfig, RoutingConfig, ServerConfig
from daemon.supervisor import run_daemon

DASHBOARD = Path(__file__).resolve().parents[2] / "configs" / "grafana" / "agentd.json"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# PromQL functions, aggregation operators and keywords: identifiers that are never metric names.
PROMQL_FUNCTIONS = _words(
    """abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp
    clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month
    deg delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
    histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase irate
    label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time
    minute month predict_linear present_over_time quantile_over_time rad rate resets round scalar
    sgn sin sinh sort sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time
    stdvar_over_time sum_over_time tan tanh time timestamp vector year"""
)
PROMQL_AGGREGATIONS = _words(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio"
)
PROMQL_KEYWORDS = _words("by without on ignoring group_left group_right bool and or unless offset atan2 le inf nan")
NOT_METRICS = PROMQL_FUNCTIONS | PROMQL_AGGREGATIONS | PROMQL_KEYWORDS
# series Prometheus itself attaches to every scrape target
PROMETHEUS_SYNTHETIC = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])[a-zA-Z_:][a-zA-Z0-9_:]*")


class PromQLError(ValueError):
    pass


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    String literals, label matchers (``{...}``), range/subquery brackets (``[...]``, which may hold
    Grafana variables such as ``$__rate_interval``) and grouping clauses (``by (le, target)``) are
    blanked first; of the identifiers left, those followed by ``(`` are function calls and must be
    known PromQL functions or aggregations (a misspelt function is an error, not a metric), and
    the others are metric names unless they are PromQL keywords.
    """
    s = _STRING.sub('""', expr)
    s = _MATCHERS.sub("{}", s)
    s = _RANGE.sub("[]", s)
    s = _GROUPING.sub(" ", s)
    names: set[str] = set()
    for m in _IDENT.finditer(s):
        ident = m.group(0)
        rest = s[m.end() :].lstrip()
        if ident.lower() in PROMQL_KEYWORDS:  # `and (...)`: a set operator before a parenthesis
            continue
        if rest.startswith("("):
            if ident not in PROMQL_FUNCTIONS | PROMQL_AGGREGATIONS:
                raise PromQLError(f"unknown PromQL function {ident!r} in {expr!r}")
            continue
        if ident.lower() in NOT_METRICS:
            continue
        names.add(ident)
    return names


def label_values_metric(query: str) -> str | None:
    """The metric of a Grafana ``label_values(metric, label)`` variable query (None without one)."""
    m = re.fullmatch(r"\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s*,\s*\w+\s*\)\s*", query)
    return m.group(1) if m else None


def exported_names(exposition: str) -> set[str]:
    """Every series name a scrape of ``exposition`` can yield, including families without children yet."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(exposition):
        names.update(s.name for s in fam.samples)
        if fam.type == "counter":
            names.add(f"{fam.name}_total")
        elif fam.type == "histogram":
            names.update(f"{fam.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        elif fam.type == "summary":
            names.update({fam.name, f"{fam.name}_sum", f"{fam.name}_count"})
        else:
            names.add(fam.name)
    return names


def dashboard_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, the ones inside collapsed rows included (rows themselves excluded)."""
    out: list[dict[str, Any]] = []
    for p in dash["panels"]:
        if p["type"] == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def dashboard_metrics(dash: dict[str, Any]) -> dict[str, set[str]]:
    """metric name -> titles of the panels (or variables) that query it."""
    used: dict[str, set[str]] = {}
    for panel in dashboard_panels(dash):
        for target in panel["targets"]:
            for name in metric_names(target["expr"]):
                used.setdefault(name, set()).add(panel["title"])
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            name = label_values_metric(query)
            assert name is not None, f"variable {var['name']}: not a label_values(metric, label) query: {query!r}"
            used.setdefault(name, set()).add(f"${var['name']}")
    return used


def unexported(used: dict[str, set[str]], agentd: set[str], worker: set[str]) -> dict[str, set[str]]:
    """The used names neither agentd (``vllm_router_*``/``agentd_*``) nor the worker (``vllm:``) exports."""
    return {
        name: where
        for name, where in used.items()
        if name not in PROMETHEUS_SYNTHETIC and name not in (worker if name.startswith("vllm:") else agentd)
    }


def load_dashboard() -> dict[str, Any]:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dash


# ----------------------------------------------------------------------------- the extractor


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.99, sum by (le, target) (rate(x_bucket{target=~"$target"}[$__rate_interval])))',
            {"x_bucket"},
        ),
        ('sum by (reason) (rate(t_total{reason="ttl_expired", target=~"a|b"}[5m]))', {"t_total"}),
        (
            "sum(rate(vllm:prompt_tokens_cached_total[1m])) / sum(rate(vllm:prompt_tokens_total[1m]))",
            {"vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total"},
        ),
        ("vllm:kv_cache_usage_perc", {"vllm:kv_cache_usage_perc"}),
        ("a_gauge{x='y'} > bool 0.5 and on (target) other_gauge", {"a_gauge", "other_gauge"}),
        ("sum(rate(a_sum[1m]))/sum(rate(a_count[1m])) * 1e3", {"a_sum", "a_count"}),
        ("sum without (instance) (up) or vector(0)", {"up"}),
        ("max_over_time(g[10m:1m]) offset 1h", {"g"}),
        ("(sum by (i) (a) > 0) and on (i) (sum by (i) (increase(b_total[30m])) == 0)", {"a", "b_total"}),
    ],
)
def test_metric_names_extracts_selectors_only(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_metric_names_rejects_unknown_functions() -> None:
    with pytest.raises(PromQLError, match="'rte'"):
        metric_names("sum(rte(x_total[1m]))")


def test_a_misspelt_metric_is_caught() -> None:
    exposition = (
        "# HELP vllm_router_agent_aware_queue_wait_seconds w\n"
        "# TYPE vllm_router_agent_aware_queue_wait_seconds histogram\n"
        "# HELP vllm_router_agent_aware_transitions_total t\n"
        "# TYPE vllm_router_agent_aware_transitions_total counter\n"
        "# HELP vllm:num_preemptions p\n"
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{engine="0"} 0.0\n'
    )
    agentd = worker = exported_names(exposition)
    good = {
        "histogram_quantile(0.5, sum by (le) (rate(vllm_router_agent_aware_queue_wait_seconds_bucket[1m])))",
        "rate(vllm_router_agent_aware_transitions_total[1m])",
        "rate(vllm:num_preemptions_total[1m])",
    }
    dash = {
        "panels": [{"type": "timeseries", "title": "ok", "targets": [{"expr": e} for e in good]}],
        "templating": {"list": []},
    }
    assert unexported(dashboard_metrics(dash), agentd, worker) == {}
    for bad in (
        "rate(vllm_router_agent_aware_queue_wait_second_bucket[1m])",  # misspelt family
        "rate(vllm_router_agent_aware_transitions[1m])",  # a counter without _total
        "histogram_quantile(0.5, rate(vllm_router_agent_aware_transitions_total_bucket[1m]))",  # not a histogram
        "rate(vllm:num_preemption_total[1m])",  # misspelt worker metric
    ):
        dash["panels"].append({"type": "timeseries", "title": bad, "targets": [{"expr": bad}]})
    missing = unexported(dashboard_metrics(dash), agentd, worker)
    assert set(missing) == {
        "vllm_router_agent_aware_queue_wait_second_bucket",
        "vllm_router_agent_aware_transitions",
        "vllm_router_agent_aware_transitions_total_bucket",
        "vllm:num_preemption_total",
    }


# ----------------------------------------------------------------------------- the dashboard shape


def test_dashboard_shape() -> None:
    dash = load_dashboard()
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["target"]["type"] == "query"
    assert label_values_metric(variables["target"]["query"]["query"]) is not None

    ids = [p["id"] for p in dash["panels"]] + [p["id"] for r in dash["panels"] for p in r.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    panels = dashboard_panels(dash)
    assert len(panels) >= 20
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"{p['title']}: no targets"
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]), p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
            assert t.get("datasource", p["datasource"]) == p["datasource"], p["title"]
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, v["name"]
    # the signals docs/operations.md tunes Program scheduling by are all on the dashboard
    used = dashboard_metrics(dash)
    for name in (
        "vllm_router_agent_aware_transitions_total",
        "vllm_router_agent_aware_queue_wait_seconds_bucket",
        "vllm_router_agent_aware_armed_ttl_seconds_bucket",
        "vllm_router_agent_aware_fitted_ttl_seconds",
        "vllm_router_agent_aware_cache_miss_impact_seconds_bucket",
        "vllm_router_agent_aware_rank_active_programs",
        "vllm_router_agent_aware_rank_queue_size",
        "vllm_router_agent_aware_capacity_observation_fresh",
        "vllm_router_agent_aware_token_estimate_coefficient",
        "agentd_proxy_requests_total",
        "agentd_proxy_upstream_errors_total",
        "agentd_proxy_request_duration_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens_cached_total",
        "vllm:prompt_tokens_total",
        "vllm:num_preemptions_total",
    ):
        assert name in used, name


# ----------------------------------------------------------------------------- against a real daemon


def sim_config() -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(policy="round_robin"),
        embedded=EmbeddedConfig(
            num_workers=1, dp_size=1, num_gpu_blocks=64, block_size=16, time_scale=50.0, model="sim-model"
        ),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(token_capacity_per_dp_rank=1024, metrics_interval_seconds=0.05),
    )


def body(program_id: str) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": " ".join(f"{program_id}-w{i}" for i in range(60))}],
        "max_tokens": 8,
        "vllm_xargs": {"agentic_context": {"program_id": program_id}},
    }


async def test_every_dashboard_metric_is_exported(autojump_clock: trio.testing.MockClock) -> None:
    used = dashboard_metrics(load_dashboard())
    cfg = sim_config()
    (worker_url,) = cfg.worker_urls()
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(run_daemon, cfg, serve_http=False, sim_configure=lambda c: attrs.evolve(c, deterministic=True))
            )
            async with in_process_client(handles) as client:
                for _turn in range(2):  # the second turn gives a request interval / continuity sample
                    r = await client.post("/v1/chat/completions", json=body("grafana"))
                    assert r.status_code == 200
                await handles.program_dispatcher.wait_diagnostics(
                    lambda d: d["backend_polling_started"] and d["ranks"][0]["observation_fresh"]
                )
                daemon_text = (await client.get("/metrics")).text
            worker_resp = await handles.client.get(f"{worker_url}/metrics")
            assert worker_resp.status_code == 200
            worker_text = worker_resp.text
            handles.request_shutdown()

    agentd, worker = exported_names(daemon_text), exported_names(worker_text)
    assert "vllm_router_agent_aware_queue_wait_seconds_count" in {
        s.name for f in text_string_to_metric_families(daemon_text) for s in f.samples
    }
    assert "vllm:prompt_tokens_cached_total" in worker
    assert not any(n.startswith("vllm:") for n in agentd)
    assert unexported(used, agentd, worker) == {}
    assert any(n.startswith("vllm:") for n in used) and any(n.startswith("vllm_router_") for n in used)


def test_scrape_example_matches_the_production_config() -> None:
    """configs/grafana/prometheus.yml scrapes the ports and workers configs/production.toml serves."""
    prod = tomllib.loads((DASHBOARD.parents[1] / "production.toml").read_text())
    scrape = (DASHBOARD.parent / "prometheus.yml").read_text()
    assert f'"agentd-host:{prod["prometheus"]["port"]}"' in scrape
    assert f'"agentd-host:{prod["admin"]["port"]}"' in scrape  # the operator routes' listener
    for url in prod["routing"]["worker_urls"]:
        assert f'"{url.removeprefix("http://")}"' in scrape, url
    assert scrape.count("metrics_path: /metrics") >= 2
