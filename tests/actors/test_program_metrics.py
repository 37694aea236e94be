"""actors.program_metrics: the vllm_router_agent_aware_* catalogue (names, types, labels, buckets)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from actors.program_metrics import GaugeSnapshot, ProgramMetrics, RankGauges, TokenEstimateGauge

EXPECTED_TYPES = {
    "vllm_router_agent_aware_rank_queue_size": "gauge",
    "vllm_router_agent_aware_rank_active_programs": "gauge",
    "vllm_router_agent_aware_transitions": "counter",
    "vllm_router_agent_aware_queue_wait_seconds": "histogram",
    "agentd_queue_eta_relative_error": "histogram",
    "vllm_router_agent_aware_fitted_ttl_seconds": "gauge",
    "vllm_router_agent_aware_context_growth_tokens": "gauge",
    "vllm_router_agent_aware_rolling_samples": "gauge",
    "vllm_router_agent_aware_cache_miss_impact_rolling_mean_seconds": "gauge",
    "vllm_router_agent_aware_capacity_observation_fresh": "gauge",
    "vllm_router_agent_aware_token_estimate_coefficient": "gauge",
    "vllm_router_agent_aware_token_estimate_feedback": "counter",
    "vllm_router_agent_aware_cache_miss_impact_seconds": "histogram",
    "vllm_router_agent_aware_request_interval_seconds": "histogram",
    "vllm_router_agent_aware_armed_ttl_seconds": "histogram",
    "vllm_router_agent_aware_shared_prefix_observed_tokens": "histogram",
    "vllm_router_agent_aware_admission_used_tokens": "histogram",
    "vllm_router_agent_aware_admission_required_tokens": "histogram",
    "vllm_router_agent_aware_admission_growth_reserve_tokens": "histogram",
    "vllm_router_agent_aware_admission_capacity_pressure_ratio": "histogram",
    "vllm_router_agent_aware_admission_projected_pressure_ratio": "histogram",
    "vllm_router_agent_aware_admission_backend_kv_usage_ratio": "histogram",
    "vllm_router_agent_aware_admission_backend_running_requests": "histogram",
    "vllm_router_agent_aware_admission_backend_waiting_requests": "histogram",
    "vllm_router_agent_aware_admission_capacity_observation_age_seconds": "histogram",
    # where the Programs' time goes (docs/program-scheduling.md §14)
    "agentd_program_time_seconds": "counter",
    "agentd_program_recomputed_tokens": "counter",
    "agentd_program_recompute_seconds": "counter",
    "agentd_program_prompt_tokens": "counter",
    "agentd_program_split_estimated": "counter",
    "agentd_prefill_requeues": "counter",
}


def test_program_metrics_catalogue_names_and_types() -> None:
    registry = CollectorRegistry()
    ProgramMetrics(registry)
    found = {m.name: m.type for m in registry.collect()}
    assert found == EXPECTED_TYPES


def _buckets(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> list[str]:
    out = []
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == f"{name}_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
                out.append(s.labels["le"])
    return out


def test_program_metrics_histogram_buckets_match_reference() -> None:
    registry = CollectorRegistry()
    m = ProgramMetrics(registry)
    m.armed_ttl_seconds.labels(target="http://w:8000@0", source="fitted").observe(0)
    admission = dict(m.admission)
    admission["used_tokens"].labels(target="http://w:8000@0").observe(300)
    admission["backend_waiting_requests"].labels(target="http://w:8000@0").observe(3)
    m.cache_miss_impact_seconds.labels(target="http://w:8000@0").observe(0.3)
    assert _buckets(registry, "vllm_router_agent_aware_armed_ttl_seconds", {"source": "fitted"}) == [
        "0.0",
        "0.01",
        "0.05",
        "0.1",
        "0.25",
        "0.5",
        "1.0",
        "2.0",
        "5.0",
        "10.0",
        "20.0",
        "30.0",
        "60.0",
        "120.0",
        "300.0",
        "600.0",
        "+Inf",
    ]
    assert _buckets(registry, "vllm_router_agent_aware_admission_used_tokens", {})[-3:] == [
        "524288.0",
        "1.048576e+06",
        "+Inf",
    ]
    assert _buckets(registry, "vllm_router_agent_aware_admission_backend_waiting_requests", {}) == [
        "0.0",
        "1.0",
        "2.0",
        "4.0",
        "8.0",
        "16.0",
        "32.0",
        "64.0",
        "128.0",
        "256.0",
        "+Inf",
    ]
    assert (
        registry.get_sample_value(
            "vllm_router_agent_aware_cache_miss_impact_seconds_bucket", {"target": "http://w:8000@0", "le": "0.25"}
        )
        == 0.0
    )
    assert (
        registry.get_sample_value(
            "vllm_router_agent_aware_cache_miss_impact_seconds_bucket", {"target": "http://w:8000@0", "le": "0.5"}
        )
        == 1.0
    )


def test_program_metrics_gauges_follow_published_snapshot() -> None:
    registry = CollectorRegistry()
    m = ProgramMetrics(registry)
    assert registry.get_sample_value("vllm_router_agent_aware_rank_queue_size", {"target": "t@0"}) is None
    m.publish(
        GaugeSnapshot(
            ranks=(
                RankGauges("t@0", 2, 1, 0.5, 40.0, 100, 7, 1.25, True),
                RankGauges("t@1", 0, 3, 0.0, 0.0, 0, 0, 0.0, False),
            ),
            token_estimates=(TokenEstimateGauge("default", "chat", 0.275),),
        )
    )
    get = registry.get_sample_value
    assert get("vllm_router_agent_aware_rank_queue_size", {"target": "t@0"}) == 2
    assert get("vllm_router_agent_aware_rank_active_programs", {"target": "t@1"}) == 3
    assert get("vllm_router_agent_aware_rolling_samples", {"target": "t@0", "window": "continuity"}) == 7
    assert get("vllm_router_agent_aware_capacity_observation_fresh", {"target": "t@0"}) == 1
    assert get("vllm_router_agent_aware_capacity_observation_fresh", {"target": "t@1"}) == 0
    assert (
        get("vllm_router_agent_aware_token_estimate_coefficient", {"model_pool": "default", "endpoint": "chat"})
        == 0.275
    )
    text = generate_latest(registry).decode()
    assert 'vllm_router_agent_aware_fitted_ttl_seconds{target="t@0"} 0.5' in text


def test_time_split_counters_exist_for_every_label_from_the_start() -> None:
    from actors.core.attribution import CAUSES, PARTS, TOKEN_KINDS

    registry = CollectorRegistry()
    ProgramMetrics(registry)
    for part in PARTS:
        assert registry.get_sample_value("agentd_program_time_seconds_total", {"part": part}) == 0.0
    for cause in CAUSES:
        assert registry.get_sample_value("agentd_program_recomputed_tokens_total", {"cause": cause}) == 0.0
    for kind in TOKEN_KINDS:
        assert registry.get_sample_value("agentd_program_prompt_tokens_total", {"kind": kind}) == 0.0
