"""Metric updates of the scheduler's hot path, gathered and applied in bulk (docs/benchmarks.md §10.2.6).

prometheus-client's ``Counter.inc`` and ``Histogram.observe`` take a lock per value (an observation
two, and a scan of the buckets): about 22 locked increments and 7 observations per Program
request's submission and completion, between the core's decision and the request's reply.
:class:`MetricBatch` keeps them in plain dicts instead (a dict update each) and applies them to
the same metric children when it is flushed:

* every collection of the registry (a ``/metrics`` scrape, ``get_sample_value``) flushes first
  (:class:`FlushBeforeCollect`, registered ahead of the metrics it covers), so a scrape always
  sees every update made before it: the counts are exact at scrape time;
* the scheduler actor flushes at every repair tick, and a batch flushes itself once it holds
  ``limit`` pending observations, so memory stays bounded without scrapes.

A counter's pending increments become one ``inc`` of their sum; a histogram's pending values are
counted per bucket (``bisect`` over the child's bounds) and added with one increment per touched
bucket and one to the sum.  Bucket counts and ``_count`` are exactly those of one ``observe`` per
value; a sum may differ from the value-by-value sum in its last bits (floating-point addition in
another order).  Single-threaded by design: the batch is written and flushed in the daemon's Trio
thread (the registry is rendered there too, daemon/http/metrics_route.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.registry import Collector

# pending observations (all histograms together) that make the batch flush itself
DEFAULT_LIMIT = 4096


class MetricBatch:
    """Pending counter increments and histogram observations of metric children (module doc)."""

    __slots__ = ("_adds", "_values", "_pending", "limit", "flushes")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._adds: dict[Any, float] = {}  # counter child -> pending increment
        self._values: dict[Any, list[float]] = {}  # histogram child -> pending observations
        self._pending = 0
        self.limit = limit
        self.flushes = 0

    def inc(self, child: Any, amount: float = 1.0) -> None:
        """``child.inc(amount)`` at the next flush (``amount`` must not be negative)."""
        adds = self._adds
        adds[child] = adds.get(child, 0.0) + amount

    def observe(self, child: Any, value: float) -> None:
        """``child.observe(value)`` at the next flush."""
        values = self._values.get(child)
        if values is None:
            self._values[child] = [value]
        else:
            values.append(value)
        self._pending += 1
        if self._pending >= self.limit:
            self.flush()

    @property
    def pending(self) -> int:
        """Pending updates (counter children with an increment, plus histogram observations)."""
        return len(self._adds) + self._pending

    def flush(self) -> None:
        """Apply every pending update to its metric child."""
        if not self._adds and not self._values:
            return
        adds, self._adds = self._adds, {}
        values, self._values = self._values, {}
        self._pending = 0
        self.flushes += 1
        for child, amount in adds.items():
            child.inc(amount)
        for child, observed in values.items():
            _observe_all(child, observed)


def _observe_all(child: Any, observed: list[float]) -> None:
    """``child.observe(v)`` for every ``v``: one increment per bucket touched and one for the sum
    (prometheus-client's histogram child keeps ``_upper_bounds``, ``_buckets`` and ``_sum``; a
    child without them is observed value by value)."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for v in observed:
            child.observe(v)
        return
    counts: dict[int, int] = {}
    for v in observed:
        if v == v:  # (NaN is in no bucket, as with observe; the last bound is +Inf)
            i = bisect_left(bounds, v)  # the first bound >= v: observe's "v <= bound"
            counts[i] = counts.get(i, 0) + 1
    total.inc(sum(observed))
    for i, n in counts.items():
        buckets[i].inc(n)


class FlushBeforeCollect(Collector):
    """A collector with no metrics of its own that flushes ``batches`` when the registry is
    collected; registered before the metrics it covers, so their collection sees every update."""

    def __init__(self) -> None:
        self._flushes: list[Callable[[], None]] = []

    def add(self, flush: Callable[[], None]) -> None:
        self._flushes.append(flush)

    def describe(self) -> Iterable[Any]:
        return ()  # (no metric names of its own: registering it never collects)

    def collect(self) -> Iterable[Any]:
        for flush in self._flushes:
            flush()
        return ()
