"""The ``vllm_router_agent_aware_*`` Prometheus catalogue of Program scheduling.

Same names, types, labels and buckets as the reference router (docs/operations.md, Reference), so dashboards
and the seed document's tuning workflow carry over unchanged.  Everything is registered on the
daemon's own ``CollectorRegistry`` passed in (never the global one), and only when Program
scheduling is enabled.  Labels are limited to target ids and bounded enums.

Two kinds of metric:

* **event metrics** (counters, histograms) are observed by the scheduler actor while it routes
  the core's effects (one writer);
* **state gauges** are produced on each scrape by :class:`ProgramGaugeCollector` from the latest
  published :class:`GaugeSnapshot` (an immutable value swapped by reference after every tick),
  so ``collect()`` never awaits and never mutates.  Like the reference, gauges only exist once
  targets are tracked (after the first Program request).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from attrs import frozen
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from actors.core.attribution import CAUSES, PARTS, TOKEN_KINDS
from actors.metric_batch import FlushBeforeCollect, MetricBatch

PREFIX = "vllm_router_agent_aware"

TOKEN_BUCKETS = (
    0,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    32768,
    65536,
    131072,
    262144,
    524288,
    1048576,
)
QUEUE_ETA_ERROR_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 4)
REQUEST_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
INTERVAL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
CACHE_MISS_IMPACT_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)
ARMED_TTL_BUCKETS = (0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)

# transitions_total reason label values (bounded enum).
# (metric name after "admission_", AdmissionCapacitySnapshot field, help, buckets): one histogram
# per capacity fact observed at each committed admission; a None field is not observed.
ADMISSION_HISTOGRAMS: tuple[tuple[str, str, str, tuple[float, ...]], ...] = (
    ("used_tokens", "used_tokens", "Rank usage at each committed admission.", TOKEN_BUCKETS),
    ("required_tokens", "required_tokens", "Tokens required by each committed admission.", TOKEN_BUCKETS),
    ("growth_reserve_tokens", "growth_reserve_tokens", "Growth reserve of each committed admission.", TOKEN_BUCKETS),
    (
        "capacity_pressure_ratio",
        "capacity_pressure_ratio",
        "used / capacity at each committed admission.",
        RATIO_BUCKETS,
    ),
    (
        "projected_pressure_ratio",
        "projected_pressure_ratio",
        "(used + required + reserve) / capacity at each admission.",
        RATIO_BUCKETS,
    ),
    (
        "backend_kv_usage_ratio",
        "backend_kv_usage_ratio",
        "Last observed backend KV usage at each admission.",
        RATIO_BUCKETS,
    ),
    (
        "backend_running_requests",
        "backend_running_requests",
        "Backend running requests at each admission.",
        REQUEST_BUCKETS,
    ),
    (
        "backend_waiting_requests",
        "backend_waiting_requests",
        "Backend waiting requests at each admission.",
        REQUEST_BUCKETS,
    ),
    (
        "capacity_observation_age_seconds",
        "observation_age_seconds",
        "Age of the capacity observation at each admission.",
        INTERVAL_BUCKETS,
    ),
)

TRANSITION_REASONS = (
    "program_admit",
    "batch_gain_admit",
    "force_resume",
    "pass_race_admit",
    "cross_rank_resume",
    "ttl_expired",
    "capacity_repair",
    "capacity_repair_mark",
    "priority_preemption",
    "priority_preemption_mark",
    "tenant_isolation",
    "tenant_isolation_mark",
    "prefill_requeue",
    "max_segment_yield",
    "request_failed",
    "health_failover",
    "paused_retention_release",
    "paused_capacity_release",
)
REQUEUE_OUTCOMES = ("requeued", "too_late", "not_requeueable")
ROLLING_WINDOWS = ("request", "continuity")
FEEDBACK_OUTCOMES = ("observed", "missing")


@frozen
class RankGauges:
    """Tick-time facts of one target for the state gauges."""

    target_id: str
    queue_size: int
    active_programs: int
    fitted_ttl_seconds: float
    context_growth_tokens: float
    request_samples: int
    continuity_samples: int
    cache_miss_impact_rolling_mean_seconds: float
    observation_fresh: bool


@frozen
class TokenEstimateGauge:
    model_pool: str
    endpoint: str
    tokens_per_byte: float


@frozen
class GaugeSnapshot:
    ranks: tuple[RankGauges, ...] = ()
    token_estimates: tuple[TokenEstimateGauge, ...] = ()


class ProgramGaugeCollector(Collector):
    """Yields the state gauges from the latest published snapshot on each scrape."""

    def __init__(self, snapshot: Callable[[], GaugeSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return list(self._families(GaugeSnapshot()))

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return list(self._families(self._snapshot()))

    @staticmethod
    def _families(snap: GaugeSnapshot) -> Iterator[GaugeMetricFamily]:
        def fam(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        queue = fam(
            "rank_queue_size", "Paused Programs with waiting requests whose last target is this rank.", ["target"]
        )
        active = fam("rank_active_programs", "Active Programs placed on this rank.", ["target"])
        ttl = fam("fitted_ttl_seconds", "Representative fitted acting TTL of this rank.", ["target"])
        growth = fam("context_growth_tokens", "Rolling mean context growth per request on this rank.", ["target"])
        samples = fam("rolling_samples", "Samples in the rolling statistics windows.", ["target", "window"])
        impact = fam(
            "cache_miss_impact_rolling_mean_seconds",
            "Mean cache-miss impact over the continuity window.",
            ["target"],
        )
        fresh = fam("capacity_observation_fresh", "1 when the backend observation is fresh, else 0.", ["target"])
        coeff = GaugeMetricFamily(
            f"{PREFIX}_token_estimate_coefficient",
            "Current prompt-token estimate coefficient (tokens per byte).",
            labels=["model_pool", "endpoint"],
        )
        for r in sorted(snap.ranks, key=lambda r: r.target_id):
            t = [r.target_id]
            queue.add_metric(t, r.queue_size)
            active.add_metric(t, r.active_programs)
            ttl.add_metric(t, r.fitted_ttl_seconds)
            growth.add_metric(t, r.context_growth_tokens)
            samples.add_metric([r.target_id, "request"], r.request_samples)
            samples.add_metric([r.target_id, "continuity"], r.continuity_samples)
            impact.add_metric(t, r.cache_miss_impact_rolling_mean_seconds)
            fresh.add_metric(t, 1.0 if r.observation_fresh else 0.0)
        for e in sorted(snap.token_estimates, key=lambda e: (e.model_pool, e.endpoint)):
            coeff.add_metric([e.model_pool, e.endpoint], e.tokens_per_byte)
        yield from (queue, active, ttl, growth, samples, impact, fresh, coeff)


class ProgramMetrics:
    """All Program-scheduling metrics, registered on ``registry``.

    The scheduler actor is the only writer of the event metrics and the only publisher of the
    gauge snapshot (:meth:`publish`).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._gauges = GaugeSnapshot()
        # the scheduler actor's event metrics are updated through ``batch`` (applied at every
        # collection of the registry: this collector is registered ahead of them, and at every
        # repair tick; actors/metric_batch.py)
        self.batch = MetricBatch()
        self._flush_first = FlushBeforeCollect()
        self._flush_first.add(self.batch.flush)
        registry.register(self._flush_first)

        def hist(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...] | None = None) -> Histogram:
            if buckets is None:
                return Histogram(f"{PREFIX}_{name}", doc, labels, registry=registry)
            return Histogram(f"{PREFIX}_{name}", doc, labels, buckets=buckets, registry=registry)

        self.transitions = Counter(
            f"{PREFIX}_transitions_total",
            "Committed Program transitions by reason.",
            ("target", "reason"),
            registry=registry,
        )
        self.queue_wait_seconds = hist(
            "queue_wait_seconds", "Router-side queue wait (dispatch - arrival) of each admitted request.", ("target",)
        )
        # first queue ETA against the actual wait of each admitted queued request (docs/program-scheduling.md §13)
        self.queue_eta_relative_error = Histogram(
            "agentd_queue_eta_relative_error",
            "|first queue ETA - actual wait| / actual wait of each queued request that was admitted.",
            buckets=QUEUE_ETA_ERROR_BUCKETS,
            registry=registry,
        )
        self.token_estimate_feedback = Counter(
            f"{PREFIX}_token_estimate_feedback_total",
            "Prompt-token estimator feedback on successful completions.",
            ("model_pool", "endpoint", "outcome"),
            registry=registry,
        )
        self.cache_miss_impact_seconds = hist(
            "cache_miss_impact_seconds",
            "Modelled cache-miss impact of each successful completion.",
            ("target",),
            CACHE_MISS_IMPACT_BUCKETS,
        )
        self.request_interval_seconds = hist(
            "request_interval_seconds",
            "Completion-to-next-arrival interval of the same Program.",
            ("target",),
            INTERVAL_BUCKETS,
        )
        self.armed_ttl_seconds = hist(
            "armed_ttl_seconds", "Acting TTL armed at completion.", ("target", "source"), ARMED_TTL_BUCKETS
        )
        self.shared_prefix_observed_tokens = hist(
            "shared_prefix_observed_tokens",
            "Explicit cached-token observations that refreshed a shared prefix.",
            ("target",),
            TOKEN_BUCKETS,
        )
        # admission_<name> histograms, one per AdmissionCapacitySnapshot field (see ADMISSION_HISTOGRAMS)
        self.admission: tuple[tuple[str, Histogram], ...] = tuple(
            (field, hist(f"admission_{name}", doc, ("target",), buckets))
            for name, field, doc, buckets in ADMISSION_HISTOGRAMS
        )
        # where each Program's time goes (docs/program-scheduling.md §14), summed over Programs;
        # every label value exists from the start (bounded enums), so a rate() never lacks a series
        self.program_time_seconds = Counter(
            "agentd_program_time_seconds",
            "Programs' wall time by part (queue, prefill, recompute, decode, between_turns), summed.",
            ("part",),
            registry=registry,
        )
        self.program_recomputed_tokens = Counter(
            "agentd_program_recomputed_tokens",
            "Prompt tokens a Program had in KV before and recomputed, by the cause of the loss.",
            ("cause",),
            registry=registry,
        )
        self.program_recompute_seconds = Counter(
            "agentd_program_recompute_seconds",
            "Estimated prefill time spent on recomputed prompt tokens, by the cause of the loss.",
            ("cause",),
            registry=registry,
        )
        self.program_prompt_tokens = Counter(
            "agentd_program_prompt_tokens",
            "Prompt tokens of completed Program requests: cached hits, new, recomputed.",
            ("kind",),
            registry=registry,
        )
        self.program_split_estimated = Counter(
            "agentd_program_split_estimated",
            "Completions whose prefill/decode split was priced by the cost model (not streamed).",
            registry=registry,
        )
        # long prefills taken back before their first token for a light tenant (docs/priority.md §3)
        self.prefill_requeues = Counter(
            "agentd_prefill_requeues_total",
            "Long prefills the scheduler asked back for a light tenant, by what the proxy did: "
            "requeued (aborted before its first token, dispatched again later), too_late (its "
            "answer had started: it runs on), not_requeueable (no proxy task can take it back here).",
            ("outcome",),
            registry=registry,
        )
        for outcome in REQUEUE_OUTCOMES:
            self.prefill_requeues.labels(outcome)
        self.time_parts = tuple(self.program_time_seconds.labels(part) for part in PARTS)
        for cause in CAUSES:
            self.program_recomputed_tokens.labels(cause)
            self.program_recompute_seconds.labels(cause)
        for kind in TOKEN_KINDS:
            self.program_prompt_tokens.labels(kind)
        self.collector = ProgramGaugeCollector(lambda: self._gauges)
        registry.register(self.collector)

    def publish(self, gauges: GaugeSnapshot) -> None:
        """Swap in the gauge snapshot of the latest tick."""
        self._gauges = gauges

    @property
    def gauges(self) -> GaugeSnapshot:
        return self._gauges
