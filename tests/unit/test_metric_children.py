"""actors/metric_children.py: cached label children count into the same series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from actors.fairness_metrics import FairnessBook, FairnessMetrics, TenantLabels
from actors.metric_children import Children
from daemon.metrics import ProxyMetrics


def test_a_cached_child_is_the_metrics_own_child() -> None:
    registry = CollectorRegistry()
    counter = Counter("x", "x", ["a", "b"], registry=registry)
    children = Children(counter)
    first = children.get("1", "2")
    assert children.get("1", "2") is first is counter.labels("1", "2")
    first.inc()
    children.get("1", "3").inc(2)
    assert registry.get_sample_value("x_total", {"a": "1", "b": "2"}) == 1
    assert registry.get_sample_value("x_total", {"a": "1", "b": "3"}) == 2


def test_proxy_and_fairness_counters_through_the_cache() -> None:
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, ["t0"])
    for _ in range(3):
        metrics.count_request("chat", "t0", "success")
    metrics.count_request("chat", "t0", "upstream_status")
    sample = registry.get_sample_value
    series = {"endpoint": "chat", "target": "t0"}
    assert sample("agentd_proxy_requests_total", {**series, "outcome": "success"}) == 3
    assert sample("agentd_proxy_requests_total", {**series, "outcome": "upstream_status"}) == 1
    clock = iter([0.0, 0.5, 1.0, 4.0]).__next__
    book = FairnessBook(TenantLabels(top_k=2), FairnessMetrics(registry), clock=clock)
    for _ in range(2):
        track = book.arrive("agent", "acme")
        track.admitted()
        track.end("completed")
    labels = {"class": "agent", "tenant": "acme"}
    assert sample("agentd_class_requests_total", {**labels, "outcome": "admitted"}) == 2
    assert sample("agentd_class_requests_total", {**labels, "outcome": "completed"}) == 2
    assert sample("agentd_class_queue_wait_seconds_count", labels) == 2
    assert sample("agentd_class_queue_wait_seconds_sum", labels) == 0.5 + 3.0


def test_histogram_children() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", ["k"], registry=registry)
    Children(histogram).get("v").observe(0.2)
    assert registry.get_sample_value("h_count", {"k": "v"}) == 1
