"""Prometheus exposition of the simulated engines under vLLM v1 metric names (docs/simulator.md §3).

``SimCollector`` is registered in the server's own ``CollectorRegistry`` (never the global one) and
reads the engines' counters at scrape time, so the exposition always equals the engine state.
Every series carries ``model_name`` and ``engine`` (the DP rank) labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sim.stats import Histogram

if TYPE_CHECKING:
    from sim.cluster import SimCluster

LABELS = ["model_name", "engine"]


class SimCollector(Collector):
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        cluster = self.cluster
        model = cluster.config.model
        engines = list(enumerate(cluster.engines))
        ecfg = cluster.config.engine

        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=LABELS
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=LABELS
        )
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=LABELS
        )
        info_labels = [
            "engine",
            "block_size",
            "num_gpu_blocks",
            "enable_prefix_caching",
            "cache_dtype",
            "gpu_memory_utilization",
            "prefix_caching_hash_algo",
        ]
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=info_labels
        )
        for rank, engine in engines:
            labels = [model, str(rank)]
            running.add_metric(labels, engine.num_running)
            waiting.add_metric(labels, engine.num_waiting)
            usage.add_metric(labels, engine.kv_cache_usage())
            info.add_metric(
                [str(rank), str(ecfg.block_size), str(ecfg.num_gpu_blocks), "True", "auto", "0.9", "builtin"], 1.0
            )
        yield from (running, waiting, usage, info)

        def counter(name: str, doc: str, attr: str) -> CounterMetricFamily:
            fam = CounterMetricFamily(name, doc, labels=LABELS)
            for rank, engine in engines:
                fam.add_metric([model, str(rank)], getattr(engine.stats, attr))
            return fam

        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens")
        yield counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", "prompt_tokens_cached"
        )
        yield counter(
            "vllm:prompt_tokens_recomputed",
            "Number of cached tokens recomputed for forward pass.",
            "prompt_tokens_recomputed",
        )
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens")
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            "prefix_cache_queries",
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits"
        )
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions")

        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", labels=[*LABELS, "source"]
        )
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*LABELS, "finished_reason"]
        )
        for rank, engine in engines:
            s = engine.stats
            by_source.add_metric([model, str(rank), "local_compute"], s.prompt_tokens_local_compute)
            by_source.add_metric([model, str(rank), "local_cache_hit"], s.prompt_tokens_local_cache_hit)
            by_source.add_metric([model, str(rank), "external_kv_transfer"], 0)
            for reason in ("stop", "length", "abort"):
                success.add_metric([model, str(rank), reason], s.request_success[reason])
        yield by_source
        yield success

        def histogram(name: str, doc: str, attr: str) -> HistogramMetricFamily:
            fam = HistogramMetricFamily(name, doc, labels=LABELS)
            for rank, engine in engines:
                h: Histogram = getattr(engine.stats, attr)
                fam.add_metric([model, str(rank)], h.cumulative(), sum_value=h.sum)
            return fam

        yield histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft")
        yield histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl")
        yield histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e")
        yield histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"
        )
