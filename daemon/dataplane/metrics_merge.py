"""One ``/metrics`` exposition from every process of the data plane (docs/operations.md §13.3).

The scheduler process renders its own registry and, on each scrape, asks every relay process for
its exposition over the data-plane socket; the families are merged sample by sample:

* counters, histograms, summaries and gauges are **summed** over the processes (request counts,
  latency buckets and in-flight gauges of the relays add up to the daemon's);
* creation times (``*_created``) are the scheduler's, and for a series only relays have (a family
  or a label set the scheduler process never touched) the earliest relay's, so that every counter,
  histogram and summary keeps its creation time whatever the number of processes;
* the families in :data:`SCHEDULER_ONLY` are state of the scheduler process (worker health, the
  tenants' service shares) and are taken from it alone.

Why not prometheus-client's multiprocess mode: it works through a process-wide environment
variable and memory-mapped files, replaces the per-daemon registry the tests and ``agentd
simulate`` rely on, and does not support the custom collectors (fairness, batch, Program gauges)
the scheduler publishes.  Collecting the relays' own expositions keeps every process's registry
unchanged and costs one round trip per scrape.

Counters stay monotonic when a relay restarts or misses a scrape (:class:`RelayMetrics`): a relay
that does not answer in time contributes what it answered last, and when a relay is replaced (it
died, or drained and exited) the cumulative samples it last answered - counters, histogram buckets,
counts and sums - are kept for its slot and added to every later exposition.  Without that, the
aggregate fell by the dead relay's counts, which Prometheus reads as a counter reset and turns into
a spike of the whole remaining count in ``rate()``.  What a relay counted after its last answered
scrape and before it died is lost (the process is gone); gauges of a relay that is gone are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

SCHEDULER_ONLY = frozenset({"agentd_health_target_healthy", "agentd_tenant_service_share"})
# families whose samples only grow while their process lives (a summary's quantiles excepted)
CUMULATIVE_TYPES = frozenset({"counter", "histogram", "summary"})


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
    own_created = {key for table in values.values() for key in table if key[0].endswith("_created")}
    for families in relays:
        for family in families:
            if family.name in SCHEDULER_ONLY:
                continue
            base = family.name[: -len("_created")] if family.name.endswith("_created") else ""
            if base in merged and merged[base].type in CUMULATIVE_TYPES:
                # the text form splits a cumulative family's creation times off as a gauge family:
                # they go back into their family, the scheduler's where it has one, else the earliest
                table = values[base]
                for sample in family.samples:
                    key = _key(sample)
                    seen = table.get(key)
                    if key not in own_created and (seen is None or sample.value < seen.value):
                        table[key] = sample
                continue
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
    relays = [list(text_string_to_metric_families(text)) for text in relay_texts]
    return merged_families_exposition(registry, relays)


def merged_families_exposition(registry: CollectorRegistry, relays: list[list[Metric]]) -> bytes:
    """The text exposition of ``registry`` with the relays' (parsed) families added."""
    if not relays:
        return generate_latest(registry)
    return generate_latest(_Families(merge_families(registry.collect(), relays)))


def cumulative_part(families: Iterable[Metric]) -> list[Metric]:
    """The samples of ``families`` that only grow while their process lives: counters, histogram
    buckets, counts and sums, a summary's count and sum (never creation times or gauges)."""
    out: list[Metric] = []
    for family in families:
        if family.type not in CUMULATIVE_TYPES or family.name in SCHEDULER_ONLY:
            continue
        kept = Metric(family.name, family.documentation, family.type, family.unit)
        kept.samples = [s for s in family.samples if not s.name.endswith("_created") and "quantile" not in s.labels]
        out.append(kept)
    return out


class ExpositionSource(Protocol):
    """One relay's end of the data-plane socket (``RelayConnection``): its exposition on demand."""

    async def exposition(self, seconds: float) -> str | None: ...


class RelayMetrics:
    """The relays' part of ``/metrics``, monotonic across relay restarts (see the module doc).

    ``connections()`` returns the live relay connections by slot index; a connection object stands
    for one relay process (a restarted relay has a new one).  Scrapes are serialised: each one
    reads every live relay, then updates what is remembered in one step."""

    def __init__(self, connections: Callable[[], Mapping[int, ExpositionSource]], timeout_seconds: float = 2.0) -> None:
        self._connections = connections
        self._timeout = timeout_seconds
        self._last: dict[int, tuple[ExpositionSource, list[Metric]]] = {}  # slot -> its relay's last answer
        self._retired: dict[int, list[Metric]] = {}  # slot -> cumulative samples of its earlier relays
        self._lock = trio.Lock()
        self.retired_count = 0  # relays whose counts were kept after they were replaced
        self.stale_count = 0  # answers used again because a relay did not answer a scrape in time

    async def families(self) -> list[list[Metric]]:
        """Every relay's families for one scrape, the retired counts of replaced relays included."""
        async with self._lock:
            live = dict(self._connections())
            answers: dict[int, str | None] = {}

            async def one(index: int, conn: ExpositionSource) -> None:
                answers[index] = await conn.exposition(self._timeout)

            async with trio.open_nursery() as nursery:
                for index, conn in live.items():
                    nursery.start_soon(one, index, conn)
            for index, (conn, families) in list(self._last.items()):
                if live.get(index) is not conn:  # that relay is gone: keep what it had counted
                    del self._last[index]
                    self._retire(index, families)
            for index, conn in live.items():
                text = answers.get(index)
                if text is not None:
                    self._last[index] = (conn, list(text_string_to_metric_families(text)))
                elif index in self._last:
                    self.stale_count += 1
            out = [families for _, families in self._last.values()]
            out.extend(self._retired.values())
            return out

    def _retire(self, index: int, families: list[Metric]) -> None:
        self.retired_count += 1
        earlier = self._retired.get(index, [])
        self._retired[index] = merge_families((), [earlier, cumulative_part(families)])

    def document(self) -> dict[str, int]:
        return {"retired_relays_count": self.retired_count, "stale_answers_count": self.stale_count}
