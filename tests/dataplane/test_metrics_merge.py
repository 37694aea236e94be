"""One /metrics for every process: the relays' samples are added to the scheduler's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from daemon.dataplane import MAX_AUTO_DATA_PLANE_PROCESSES, resolve_processes
from daemon.dataplane.metrics_merge import merged_exposition


def _registry(requests: int, healthy: float, latency: float, *, extra: bool = False) -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("agentd_proxy_requests", "r", ["target"], registry=registry).labels("w0").inc(requests)
    Gauge("agentd_health_target_healthy", "h", ["target"], registry=registry).labels("w0").set(healthy)
    Histogram("agentd_proxy_first_token_seconds", "t", registry=registry, buckets=(0.1, 1.0)).observe(latency)
    if extra:
        Gauge("agentd_relay_only", "only in relays", registry=registry).set(2)
    return registry


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_relay_samples_are_summed_and_scheduler_state_is_kept() -> None:
    scheduler = _registry(1, 1.0, 0.05)
    relays = [
        generate_latest(_registry(10, 0.0, 0.5, extra=True)).decode(),
        generate_latest(_registry(5, 0.0, 5.0)).decode(),
    ]
    merged = merged_exposition(scheduler, relays)
    samples = _samples(merged)
    assert samples[("agentd_proxy_requests_total", (("target", "w0"),))] == 16.0
    assert samples[("agentd_health_target_healthy", (("target", "w0"),))] == 1.0  # the scheduler's alone
    assert samples[("agentd_proxy_first_token_seconds_count", ())] == 3.0
    assert samples[("agentd_proxy_first_token_seconds_bucket", (("le", "0.1"),))] == 1.0
    assert samples[("agentd_proxy_first_token_seconds_bucket", (("le", "1.0"),))] == 2.0
    assert samples[("agentd_proxy_first_token_seconds_sum", ())] == 5.55
    assert samples[("agentd_relay_only", ())] == 2.0
    # every family once: the exposition parses, no duplicate creation-time families
    names = [f.name for f in text_string_to_metric_families(merged.decode())]
    assert len(names) == len(set(names))


def test_without_relays_the_exposition_is_the_registrys() -> None:
    registry = _registry(3, 1.0, 0.2)
    assert merged_exposition(registry, []) == generate_latest(registry)


def test_auto_processes_follow_the_cores_capped_and_embedded_is_one_process() -> None:
    assert resolve_processes(0, embedded=False, cpu_count=2) == 2
    assert resolve_processes(0, embedded=False, cpu_count=64) == MAX_AUTO_DATA_PLANE_PROCESSES
    assert resolve_processes(3, embedded=False, cpu_count=1) == 3
    assert resolve_processes(1, embedded=False) == 1
    assert resolve_processes(4, embedded=True) == 1


def _created(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if s.name.endswith("_created")
    }


def _relay_text(created: float, *, label: str) -> str:
    registry = CollectorRegistry()
    Counter("agentd_proxy_requests", "r", ["target"], registry=registry).labels(label).inc()
    Counter("agentd_relay_streams", "only in relays", registry=registry).inc()
    text = generate_latest(registry).decode()
    # creation times as a process that started at `created` would expose them
    return "\n".join(
        f"{line.rsplit(' ', 1)[0]} {created}" if line.startswith("agentd_") and "_created" in line else line
        for line in text.splitlines()
    )


def test_creation_times_are_the_schedulers_else_the_earliest_relays() -> None:
    scheduler = CollectorRegistry()
    Counter("agentd_proxy_requests", "r", ["target"], registry=scheduler).labels("w0").inc()
    own = _created(generate_latest(scheduler))[("agentd_proxy_requests_created", (("target", "w0"),))]
    merged = merged_exposition(scheduler, [_relay_text(300.0, label="w0"), _relay_text(200.0, label="w1")])
    created = _created(merged)
    # the scheduler's own series keeps its time; a label set and a family only relays have get the earliest relay's
    assert created == {
        ("agentd_proxy_requests_created", (("target", "w0"),)): own,
        ("agentd_proxy_requests_created", (("target", "w1"),)): 200.0,
        ("agentd_relay_streams_created", ()): 200.0,
    }
    names = [f.name for f in text_string_to_metric_families(merged.decode())]
    assert len(names) == len(set(names))
    assert b"# TYPE agentd_relay_streams_created gauge" in merged
