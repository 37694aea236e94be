"""Prometheus metrics of the agentd daemon.

One :class:`prometheus_client.CollectorRegistry` per daemon (:func:`build_registry`), passed
explicitly everywhere; nothing registers on the global default registry.

Names follow ``agentd_<subsystem>_<what>_<unit>``; counters get ``_total`` from the client library.
Label values are bounded: ``target`` is a configured target id (``URL@rank``), ``endpoint`` is
``chat|completions|responses`` or a forwarded route's kind (``daemon.http.requests.FORWARDED_ENDPOINTS``),
``outcome``/``kind``/``reason`` are small enums defined by the proxy.

Proxy catalogue (:class:`ProxyMetrics`):

* ``agentd_proxy_requests_total{endpoint,target,outcome}`` - finished proxied requests
  (``target="none"`` when dispatch rejected the request before a target was chosen);
* ``agentd_proxy_in_flight_requests{target}`` - requests currently holding a lease on a target;
* ``agentd_proxy_request_duration_seconds{target}`` - histogram, lease start to response end;
* ``agentd_proxy_first_token_seconds{target}`` - histogram, lease start to first streamed chunk;
* ``agentd_proxy_upstream_errors_total{target,kind}`` - unreachable / timeout / status / stream;
* ``agentd_proxy_rejected_requests_total{reason}`` - dispatch rejections (no healthy target ...);
* ``agentd_health_target_healthy{target}`` - 1 when the worker behind the target passes /health;
* ``agentd_proxy_failovers_total{target}`` - requests sent to another target because this target's
  worker could not be reached (the request provably never left, docs/operations.md §11) or refused
  its DP rank (nothing ran, §11.3);
* ``agentd_health_ejections_total{target,source}`` - the worker behind the target left rotation:
  ``health`` (consecutive failed checks) or ``outlier`` (failures of real traffic);
* ``agentd_health_suspects_total{target,outcome}`` - suspicions (a connect timeout, then one
  confirming ``/health`` probe) settled: ``ejected`` or ``restored`` (docs/operations.md §11.3).

Children for every known target are created up front (:meth:`ProxyMetrics.for_target`) and the
request counter's children are looked up once per label set (:mod:`actors.metric_children`), so
the request hot path does no ``labels()`` call.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from actors.metric_batch import FlushBeforeCollect, MetricBatch
from actors.metric_children import Children

LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
ENDPOINTS: tuple[str, ...] = (
    "chat", "completions", "responses",  # the agent-facing routes
    "embeddings", "pooling", "classify", "score", "v1_score", "rerank", "v1_rerank", "v2_rerank",
    "tokenize", "detokenize",  # vLLM's other routes, forwarded (docs/operations.md §12.1)
)  # fmt: skip
OUTCOMES: tuple[str, ...] = (
    "success",
    "upstream_status",
    "upstream_unreachable",
    "upstream_timeout",
    "upstream_stream",
    "client_disconnect",
    "rejected",
)
UPSTREAM_ERROR_KINDS: tuple[str, ...] = ("unreachable", "timeout", "status", "stream")
NO_TARGET = "none"


def build_registry() -> CollectorRegistry:
    """A fresh registry for one daemon (or one test)."""
    return CollectorRegistry(auto_describe=True)


@attrs.frozen(eq=False)
class TargetMetrics:
    """Pre-resolved metric children of one target (hot path)."""

    in_flight: Gauge
    duration: Histogram
    first_token: Histogram
    healthy: Gauge


class ProxyMetrics:
    """The proxy's metric families, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry, target_ids: Iterable[str]) -> None:
        # the per-request counter increments and histogram observations are applied in bulk,
        # before every collection of the registry (this collector is registered ahead of the
        # families below) and at 4,096 pending observations (actors/metric_batch.py); the
        # in-flight gauge is set directly
        self.batch = MetricBatch()
        self._flush_first = FlushBeforeCollect()
        self._flush_first.add(self.batch.flush)
        registry.register(self._flush_first)
        self.requests = Counter(
            "agentd_proxy_requests",
            "Proxied requests by endpoint, target and outcome.",
            ["endpoint", "target", "outcome"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "agentd_proxy_in_flight_requests",
            "Requests currently holding a lease on a target.",
            ["target"],
            registry=registry,
        )
        self.duration = Histogram(
            "agentd_proxy_request_duration_seconds",
            "Time from lease start to the end of the relayed response.",
            ["target"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=registry,
        )
        self.first_token = Histogram(
            "agentd_proxy_first_token_seconds",
            "Time from lease start to the first relayed chunk of a streamed response.",
            ["target"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=registry,
        )
        self.upstream_errors = Counter(
            "agentd_proxy_upstream_errors",
            "Upstream failures by target and kind (unreachable, timeout, status, stream).",
            ["target", "kind"],
            registry=registry,
        )
        self.body_rewrites = Counter(
            "agentd_proxy_body_rewrites",
            "Request bodies edited before forwarding, by method: raw (the client's bytes spliced), "
            "reencode_small (a body under 2 KiB, re-encoded: cheaper at that size) or reencode_fallback "
            "(re-encoded because a raw edit was not possible: a top-level key given twice, not UTF-8).",
            ["method"],
            registry=registry,
        )
        self.rejected = Counter(
            "agentd_proxy_rejected_requests",
            "Requests rejected by dispatch before reaching a target, by reason.",
            ["reason"],
            registry=registry,
        )
        self.healthy = Gauge(
            "agentd_health_target_healthy",
            "1 when the worker behind the target passes its /health check, else 0.",
            ["target"],
            registry=registry,
        )
        self.failovers = Counter(
            "agentd_proxy_failovers",
            "Requests sent to another target because this target's worker could not be reached or refused its DP rank.",
            ["target"],
            registry=registry,
        )
        self.requeued = Counter(
            "agentd_proxy_requeued",
            "Long prefills taken back from this target before their first token and forwarded "
            "again later (docs/priority.md §3).",
            ["target"],
            registry=registry,
        )
        self.ejections = Counter(
            "agentd_health_ejections",
            "Times the worker behind the target left rotation, by source (health, outlier).",
            ["target", "source"],
            registry=registry,
        )
        self.suspects = Counter(
            "agentd_health_suspects",
            "Connect timeouts that made the worker behind the target suspect, by how its confirming "
            "/health probe settled them (ejected, restored).",
            ["target", "outcome"],
            registry=registry,
        )
        self._requests = Children(self.requests)  # one dict access per request (docs/benchmarks.md §10.2.4)
        self._rewrites = Children(self.body_rewrites)
        self._targets: dict[str, TargetMetrics] = {}
        for target_id in target_ids:
            self._targets[target_id] = TargetMetrics(
                in_flight=self.in_flight.labels(target_id),
                duration=self.duration.labels(target_id),
                first_token=self.first_token.labels(target_id),
                healthy=self.healthy.labels(target_id),
            )
            for kind in UPSTREAM_ERROR_KINDS:
                self.upstream_errors.labels(target_id, kind)

    def for_target(self, target_id: str) -> TargetMetrics:
        return self._targets[target_id]

    def count_request(self, endpoint: str, target_id: str, outcome: str) -> None:
        self.batch.inc(self._requests.get(endpoint, target_id, outcome))

    def count_rewrite(self, method: str) -> None:
        self.batch.inc(self._rewrites.get(method))


BATCH_STATUSES: tuple[str, ...] = (
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "cancelling",
    "cancelled",
    "expired",
)
# succeeded: a 2xx answer committed; failed: another answer (after retries); invalid: a malformed input line.
BATCH_REQUEST_OUTCOMES: tuple[str, ...] = ("succeeded", "failed", "invalid")


class BatchApiMetrics:
    """The Batch API's families (docs/batch.md §4):

    * ``agentd_batch_api_batches{status}`` - batches in the database by status;
    * ``agentd_batch_api_requests_total{outcome}`` - batch lines by outcome (see
      :data:`BATCH_REQUEST_OUTCOMES`), counted once their record is committed.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batches = Gauge(
            "agentd_batch_api_batches", "Batch API batches in the database by status.", ["status"], registry=registry
        )
        self.requests = Counter(
            "agentd_batch_api_requests",
            "Batch API request lines by outcome (succeeded, failed, invalid).",
            ["outcome"],
            registry=registry,
        )
        for status in BATCH_STATUSES:
            self.batches.labels(status)
        for outcome in BATCH_REQUEST_OUTCOMES:
            self.requests.labels(outcome)

    def set_statuses(self, counts: dict[str, int]) -> None:
        for status in BATCH_STATUSES:
            self.batches.labels(status).set(counts.get(status, 0))
