"""The ``agentd_batch_*`` Prometheus metrics of the batch class (docs/batch.md §2, docs/operations.md).

Event metrics (counters, histograms) are observed by the scheduler actor while it routes the
core's batch effects; they carry no job label, so their cardinality never grows.  The per-job and
per-rank gauges are produced at scrape time by :class:`BatchGaugeCollector` from the core's
``batch_diagnostics`` document: only live jobs (at most ``max_jobs`` plus the default job) and the
configured ranks appear, so their label sets stay bounded too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "agentd_batch"
WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
RATIO_BUCKETS = (0.125, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4, 8)


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.admitted = Counter(
            f"{PREFIX}_admitted",
            "Batch requests dispatched to a rank (starvation_escape: dispatched while Programs waited).",
            ["starvation_escape"],
            registry=registry,
        )
        self.completed = Counter(
            f"{PREFIX}_completed",
            "Batch requests that ended, by outcome (success, failure).",
            ["outcome"],
            registry=registry,
        )
        self.preempted = Counter(
            f"{PREFIX}_preempted",
            "Running batch requests preempted so that a waiting Program could be admitted.",
            registry=registry,
        )
        self.jobs_created = Counter(f"{PREFIX}_jobs_created", "Job names seen for the first time.", registry=registry)
        self.jobs_evicted = Counter(
            f"{PREFIX}_jobs_evicted", "Job decode estimates dropped to respect max_jobs (LRU).", registry=registry
        )
        self.queue_wait_seconds = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time batch requests waited in the router before dispatch.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.decode_ratio = Histogram(
            f"{PREFIX}_observed_to_predicted_decode_ratio",
            "Observed decode length over the job's prediction at dispatch (natural stops only).",
            buckets=RATIO_BUCKETS,
            registry=registry,
        )


class BatchGaugeCollector(Collector):
    """Per-job and per-rank gauges read from the latest scheduler state at scrape time."""

    def __init__(self, document: Callable[[], dict[str, Any]]) -> None:
        self._document = document

    def collect(self) -> Iterator[GaugeMetricFamily]:
        doc = self._document()
        if not doc.get("enabled"):
            return
        queued = GaugeMetricFamily(
            f"{PREFIX}_job_queued", "Batch requests of the job waiting in the router.", labels=["job"]
        )
        running = GaugeMetricFamily(f"{PREFIX}_job_running", "Batch requests of the job dispatched.", labels=["job"])
        predicted = GaugeMetricFamily(
            f"{PREFIX}_job_predicted_decode_tokens", "The job's decode-length estimate (EWMA).", labels=["job"]
        )
        observed = GaugeMetricFamily(
            f"{PREFIX}_job_observed_decode_tokens_mean",
            "Mean observed decode length of the job's natural stops.",
            labels=["job"],
        )
        for job in doc["jobs"]:
            name = job["job"]
            queued.add_metric([name], job["queued"])
            running.add_metric([name], job["running"])
            predicted.add_metric([name], job["predicted_decode_tokens"])
            if job["observed_decode_tokens_mean"] is not None:
                observed.add_metric([name], job["observed_decode_tokens_mean"])
        rank_running = GaugeMetricFamily(
            f"{PREFIX}_rank_running", "Batch requests running on the rank.", labels=["target"]
        )
        rank_tokens = GaugeMetricFamily(
            f"{PREFIX}_rank_charged_tokens", "Tokens charged for running batch requests on the rank.", labels=["target"]
        )
        reserve = GaugeMetricFamily(
            f"{PREFIX}_rank_reserve_blocks", "KV blocks reserved for running batch requests' growth.", labels=["target"]
        )
        growth = GaugeMetricFamily(
            f"{PREFIX}_rank_growth_reserve_tokens",
            "KV tokens kept for the decode the running batch requests on the rank still grow into.",
            labels=["target"],
        )
        budget = GaugeMetricFamily(
            f"{PREFIX}_rank_budget_tokens", "Batch admission budget of the rank now.", labels=["target"]
        )
        for rank in doc["ranks"]:
            t = [rank["target_id"]]
            rank_running.add_metric(t, rank["running"])
            rank_tokens.add_metric(t, rank["charged_tokens"])
            reserve.add_metric(t, rank["reserve_blocks"])
            growth.add_metric(t, rank["growth_reserve_tokens"])
            budget.add_metric(t, rank["budget_tokens"])
        queue_size = GaugeMetricFamily(
            "agentd_router_queued_requests", "Requests waiting in the router, by class.", labels=["class"]
        )
        queue_size.add_metric(["batch"], doc["queued"])
        yield from (queued, running, predicted, observed, rank_running, rank_tokens, reserve, growth, budget)
        yield queue_size
