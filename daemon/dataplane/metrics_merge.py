"""One ``/metrics`` exposition from every process of the data plane (docs/operations.md §13.3).

The scheduler process renders its own registry and, on each scrape, asks every relay process for
its exposition over the data-plane socket; the families are merged sample by sample:

* counters, histograms, summaries and gauges are **summed** over the processes (request counts,
  latency buckets and in-flight gauges of the relays add up to the daemon's);
* creation times (``*_created``) are the scheduler's;
* the families in :data:`SCHEDULER_ONLY` are state of the scheduler process (worker health, the
  tenants' service shares) and are taken from it alone.

Why not prometheus-client's multiprocess mode: it works through a process-wide environment
variable and memory-mapped files, replaces the per-daemon registry the tests and ``agentd
simulate`` rely on, and does not support the custom collectors (fairness, batch, Program gauges)
the scheduler publishes.  Collecting the relays' own expositions keeps every process's registry
unchanged and costs one round trip per scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

SCHEDULER_ONLY = frozenset({"agentd_health_target_healthy", "agentd_tenant_service_share"})


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _key(sample: Sample) -> tuple[str, tuple[tuple[str, str], ...]]:
    return sample.name, tuple(sorted(sample.labels.items()))


def merge_families(own: Iterable[Metric], relays: Iterable[Iterable[Metric]]) -> list[Metric]:
    """``own`` (the scheduler's families) with every relay's samples added (see the module doc)."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]] = {}
    for family in own:
        out = Metric(family.name, family.documentation, family.type, family.unit)
        merged[family.name] = out
        values[family.name] = {_key(s): s for s in family.samples}
    for families in relays:
        for family in families:
            if family.name in SCHEDULER_ONLY:
                continue
            if family.name.endswith("_created") and family.name[: -len("_created")] in merged:
                continue  # the text form splits a counter's creation time off: the scheduler's is kept
            if family.name not in merged:
                merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            table = values[family.name]
            for sample in family.samples:
                key = _key(sample)
                seen = table.get(key)
                if seen is None:
                    table[key] = sample
                else:
                    table[key] = seen._replace(value=seen.value + sample.value)
    for name, family in merged.items():
        family.samples = list(values[name].values())
    return list(merged.values())


def merged_exposition(registry: CollectorRegistry, relay_texts: Iterable[str]) -> bytes:
    """The text exposition of ``registry`` merged with the relays' expositions."""
    if not relay_texts:
        return generate_latest(registry)
    relays = [list(text_string_to_metric_families(text)) for text in relay_texts]
    return generate_latest(_Families(merge_families(registry.collect(), relays)))
