"""Per-class and per-tenant observability (docs/priority.md §5.6): metrics and the diagnostics section.

:class:`FairnessBook` is the edge's record of every proxied request by class (``interactive``,
``agent``, ``batch``) and tenant: how many wait for a dispatch decision, how many run, how long
they waited, how many tokens they were served.  The proxy is its only writer (one
:class:`Tracked` per request, from arrival to the end of its response); everything in it is
synchronous, so it needs no lock under Trio.

Label cardinality is bounded (:class:`TenantLabels`): the configured ``[tenants] metrics_tenants``
and the first ``metrics_top_k`` other tenants seen get their own ``tenant`` label for the daemon's
lifetime; every later tenant is counted as ``other``.  So at most ``metrics_top_k +
len(metrics_tenants) + 1`` tenant values (times 3 classes) ever exist.  The diagnostics section
lists the same labels.  Scheduler-side figures (the VTC counters of the core, docs/priority.md
§3) are merged in by a provider callable when Program scheduling is on.

Metrics (``/metrics``):

* ``agentd_class_requests_total{class,tenant,outcome}`` -- outcome ``admitted`` (a dispatch
  decision, once per request), ``rejected``, ``completed``, ``failed``, ``abandoned``;
* ``agentd_class_queue_wait_seconds{class,tenant}`` -- arrival to dispatch decision;
* ``agentd_tenant_tokens_total{class,tenant,kind}`` -- ``prompt`` and ``completion`` tokens served
  (the service share of a tenant is its rate over the sum);
* gauges at scrape time: ``agentd_class_queued_requests{class,tenant}``,
  ``agentd_class_running_requests{class,tenant}``, ``agentd_tenant_service_share{tenant}``
  (share of all tokens served so far) and ``agentd_tenant_virtual_counter{tenant}`` (the core's
  VTC counter; ``other``: the largest of the unlabelled tenants').

``scheduler_view()`` returns ``{"accounts": {tenant: {"counter": ..., other figures summed for
``other``}}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from actors.batch_metrics import WAIT_BUCKETS
from actors.core.model import Usage
from actors.metric_children import Children

OTHER = "other"
CLASSES = ("interactive", "agent", "batch")


class TenantLabels:
    """A bounded tenant -> label map: fixed tenants, then the first ``top_k`` others, then ``other``."""

    def __init__(self, top_k: int, fixed: Sequence[str] = ()) -> None:
        self.top_k = top_k
        self.fixed = frozenset(fixed)
        self._dynamic: dict[str, None] = {}  # insertion-ordered set

    def label(self, tenant: str) -> str:
        if tenant in self.fixed or tenant in self._dynamic:
            return tenant
        if len(self._dynamic) < self.top_k and tenant != OTHER:
            self._dynamic[tenant] = None
            return tenant
        return OTHER

    def peek(self, tenant: str) -> str:
        """The label of ``tenant`` without giving it one (reads never assign labels)."""
        return tenant if tenant in self.fixed or tenant in self._dynamic else OTHER

    def labels(self) -> tuple[str, ...]:
        return (*sorted(self.fixed), *self._dynamic)


@attrs.define
class Figures:
    """One (class, tenant label) cell."""

    queued: int = 0
    running: int = 0
    admitted: int = 0
    rejected: int = 0
    completed: int = 0
    failed: int = 0
    abandoned: int = 0
    wait_seconds_sum: float = 0.0
    wait_seconds_max: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: Figures) -> None:
        for a in attrs.fields(Figures):
            if a.name == "wait_seconds_max":
                self.wait_seconds_max = max(self.wait_seconds_max, other.wait_seconds_max)
            else:
                setattr(self, a.name, getattr(self, a.name) + getattr(other, a.name))

    def document(self) -> dict[str, Any]:
        doc = attrs.asdict(self)
        doc["wait_seconds_mean"] = self.wait_seconds_sum / self.admitted if self.admitted else None
        return doc


class FairnessMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "agentd_class_requests",
            "Proxied requests by class, tenant (bounded: top tenants, the rest 'other') and outcome.",
            ["class", "tenant", "outcome"],
            registry=registry,
        )
        self.wait = Histogram(
            "agentd_class_queue_wait_seconds",
            "Time from a request's arrival to its dispatch decision, by class and tenant.",
            ["class", "tenant"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "agentd_tenant_tokens",
            "Tokens served, by class, tenant and kind (prompt, completion).",
            ["class", "tenant", "kind"],
            registry=registry,
        )
        # the children, looked up once per label set (class x bounded tenant label x outcome)
        self.requests_of = Children(self.requests)
        self.wait_of = Children(self.wait)
        self.tokens_of = Children(self.tokens)


class FairnessBook:
    """The per-class, per-tenant record of proxied requests (module docstring)."""

    def __init__(
        self,
        labels: TenantLabels,
        metrics: FairnessMetrics | None = None,
        scheduler_view: Callable[[], Mapping[str, Any]] | None = None,
        clock: Callable[[], float] = trio.current_time,
        *,
        label_scheduler_tenants: bool = False,
    ) -> None:
        self.clock = clock
        self.labels = labels
        # the scheduler process of relay processes (docs/operations.md §13.3): the relays' books see
        # the requests, this one only the scheduler's accounts, so their tenants take labels here in
        # the order the scheduler first saw them (else every tenant would read ``other``)
        self.label_scheduler_tenants = label_scheduler_tenants
        self.metrics = metrics
        self.cells: dict[tuple[str, str], Figures] = {}
        # the core's per-tenant figures (VTC counters...), when Program scheduling reports them
        self.scheduler_view = scheduler_view

    def cell(self, cls: str, label: str) -> Figures:
        key = (cls, label)
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = Figures()
        return found

    def arrive(self, cls: str, tenant: str) -> Tracked:
        label = self.labels.label(tenant)
        self.cell(cls, label).queued += 1
        return Tracked(self, cls, label, self.clock())

    # ------------------------------------------------------------ documents

    def by_class(self) -> dict[str, dict[str, Any]]:
        out: dict[str, Figures] = {}
        for (cls, _), figures in self.cells.items():
            out.setdefault(cls, Figures()).add(figures)
        return {cls: out[cls].document() for cls in CLASSES if cls in out}

    def by_tenant(self) -> dict[str, dict[str, Any]]:
        out: dict[str, Figures] = {}
        for (_, label), figures in self.cells.items():
            out.setdefault(label, Figures()).add(figures)
        total = sum(f.prompt_tokens + f.completion_tokens for f in out.values())
        docs = {}
        for label, figures in sorted(out.items()):
            doc = figures.document()
            served = figures.prompt_tokens + figures.completion_tokens
            doc["service_share"] = served / total if total else None
            docs[label] = doc
        return docs

    def diagnostics(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "classes": self.by_class(),
            "tenants": self.by_tenant(),
            "tenant_labels": {"top_k": self.labels.top_k, "labelled": list(self.labels.labels()), "rest": OTHER},
        }
        if self.scheduler_view is not None:
            doc["scheduler"] = self.scheduler_accounts()
        return doc

    def scheduler_accounts(self) -> dict[str, dict[str, float]]:
        """The scheduler's per-tenant accounts by label: ``other`` sums the rest (its counter is
        their largest)."""
        out: dict[str, dict[str, float]] = {}
        view = {} if self.scheduler_view is None else dict(self.scheduler_view())
        accounts = view.get("accounts", {})
        if self.label_scheduler_tenants:
            for tenant in accounts:  # the scheduler's first-seen order
                self.labels.label(tenant)
        for tenant, account in sorted(accounts.items()):
            label = self.labels.peek(tenant)
            into = out.get(label)
            if into is None:
                out[label] = dict(account)
                continue
            for key, value in account.items():
                into[key] = max(into[key], value) if key == "counter" else into[key] + value
        return out


@attrs.define(eq=False)
class Tracked:
    """One request's passage: ``admitted`` at its dispatch decision (once), ``end`` exactly once."""

    book: FairnessBook
    cls: str
    label: str
    arrived: float
    state: str = "queued"  # queued | running | ended

    def admitted(self) -> None:
        if self.state != "queued":
            return
        now = self.book.clock()
        self.state = "running"
        c = self.book.cell(self.cls, self.label)
        c.queued -= 1
        c.running += 1
        c.admitted += 1
        wait = max(0.0, now - self.arrived)
        c.wait_seconds_sum += wait
        c.wait_seconds_max = max(c.wait_seconds_max, wait)
        m = self.book.metrics
        if m is not None:
            m.requests_of.get(self.cls, self.label, "admitted").inc()
            m.wait_of.get(self.cls, self.label).observe(wait)

    def end(self, outcome: str, usage: Usage | None = None) -> None:
        """``outcome``: completed, failed, abandoned or rejected."""
        if self.state == "ended":
            return
        c = self.book.cell(self.cls, self.label)
        if self.state == "queued":
            c.queued -= 1
        else:
            c.running -= 1
        self.state = "ended"
        setattr(c, outcome, getattr(c, outcome) + 1)
        m = self.book.metrics
        if m is not None:
            m.requests_of.get(self.cls, self.label, outcome).inc()
        if usage is not None:
            c.prompt_tokens += usage.prompt_tokens or 0
            c.completion_tokens += usage.completion_tokens or 0
            if m is not None:
                m.tokens_of.get(self.cls, self.label, "prompt").inc(usage.prompt_tokens or 0)
                m.tokens_of.get(self.cls, self.label, "completion").inc(usage.completion_tokens or 0)


class FairnessGaugeCollector(Collector):
    """Queue and running gauges, service shares and the core's VTC counters, at scrape time."""

    def __init__(self, book: FairnessBook) -> None:
        self._book = book

    def collect(self) -> Iterator[GaugeMetricFamily]:
        book = self._book
        queued = GaugeMetricFamily(
            "agentd_class_queued_requests", "Requests waiting for a dispatch decision.", labels=["class", "tenant"]
        )
        running = GaugeMetricFamily(
            "agentd_class_running_requests", "Requests dispatched and not yet ended.", labels=["class", "tenant"]
        )
        for (cls, label), f in sorted(book.cells.items()):
            queued.add_metric([cls, label], f.queued)
            running.add_metric([cls, label], f.running)
        share = GaugeMetricFamily(
            "agentd_tenant_service_share", "Share of all tokens served so far, by tenant.", labels=["tenant"]
        )
        for label, doc in book.by_tenant().items():
            if doc["service_share"] is not None:
                share.add_metric([label], doc["service_share"])
        yield from (queued, running, share)
        if book.scheduler_view is not None:
            vtc = GaugeMetricFamily(
                "agentd_tenant_virtual_counter",
                "The scheduler's virtual token counter of the tenant (VTC, docs/priority.md §3).",
                labels=["tenant"],
            )
            for label, account in book.scheduler_accounts().items():
                vtc.add_metric([label], account["counter"])
            yield vtc
