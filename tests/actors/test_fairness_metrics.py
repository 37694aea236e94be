"""Per-class, per-tenant figures with bounded labels (actors/fairness_metrics.py, docs/priority.md §5.6)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from actors.core.model import Usage
from actors.fairness_metrics import (
    OTHER,
    FairnessBook,
    FairnessGaugeCollector,
    FairnessMetrics,
    TenantLabels,
)


def test_tenant_labels_are_bounded() -> None:
    labels = TenantLabels(2, fixed=("acme",))
    assert [labels.label(t) for t in ("a", "acme", "b", "c", "a", "other", "d")] == [
        "a",
        "acme",
        "b",
        OTHER,
        "a",
        OTHER,
        OTHER,
    ]
    assert labels.labels() == ("acme", "a", "b")
    assert TenantLabels(0).label("x") == OTHER


def test_book_counts_waits_tokens_and_shares() -> None:
    now = [0.0]
    registry = CollectorRegistry()
    book = FairnessBook(
        TenantLabels(1),
        FairnessMetrics(registry),
        scheduler_view=lambda: {
            "accounts": {
                "a": {"counter": 5.0, "waiting": 1},
                "z": {"counter": 2.0, "waiting": 2},
                "y": {"counter": 3.0, "waiting": 0},
            }
        },
        clock=lambda: now[0],
    )
    registry.register(FairnessGaugeCollector(book))
    a1 = book.arrive("interactive", "a")
    a2 = book.arrive("batch", "a")
    z = book.arrive("batch", "z")  # beyond top-k: "other"
    gone = book.arrive("agent", "y")
    assert book.by_class()["batch"]["queued"] == 2
    now[0] = 2.0
    a1.admitted()
    a1.admitted()  # once only
    z.admitted()
    now[0] = 3.0
    a2.end("rejected")
    gone.end("abandoned")
    a1.end("completed", Usage(prompt_tokens=30, completion_tokens=10))
    z.end("failed", Usage(prompt_tokens=10, completion_tokens=0))
    z.end("completed")  # ignored: a request ends once
    classes = book.by_class()
    assert classes["interactive"]["completed"] == 1 and classes["interactive"]["wait_seconds_mean"] == 2.0
    assert classes["batch"] == {**classes["batch"], "queued": 0, "running": 0, "rejected": 1, "failed": 1}
    tenants = book.by_tenant()
    assert tenants["a"]["service_share"] == 0.8 and tenants[OTHER]["service_share"] == 0.2
    doc = book.diagnostics()
    assert doc["tenant_labels"] == {"top_k": 1, "labelled": ["a"], "rest": OTHER}
    assert doc["scheduler"] == {"a": {"counter": 5.0, "waiting": 1}, OTHER: {"counter": 3.0, "waiting": 2}}
    text = generate_latest(registry).decode()
    assert 'agentd_class_requests_total{class="interactive",outcome="admitted",tenant="a"} 1.0' in text
    assert 'agentd_tenant_tokens_total{class="interactive",kind="prompt",tenant="a"} 30.0' in text
    assert 'agentd_class_queue_wait_seconds_count{class="batch",tenant="other"} 1.0' in text
    assert 'agentd_tenant_service_share{tenant="a"} 0.8' in text
    assert 'agentd_tenant_virtual_counter{tenant="other"} 3.0' in text  # the largest of the rest
    assert 'agentd_class_running_requests{class="interactive",tenant="a"} 0.0' in text


def test_the_scheduler_process_of_relays_labels_the_tenants_it_schedules() -> None:
    """With relay processes the requests are tracked in the relays' books, and the scheduler
    process's book sees only the core's accounts: its tenants are labelled there, in the order the
    scheduler first saw them, within the same bound.  Before session 31 every tenant's VTC counter
    read ``tenant="other"`` with relays (the labels were only ever given at a request's arrival)."""
    accounts = {"b": {"counter": 7.0}, "a": {"counter": 5.0}, "c": {"counter": 9.0}}  # first seen: b, a, c
    registry = CollectorRegistry()
    book = FairnessBook(
        TenantLabels(2),
        FairnessMetrics(registry),
        scheduler_view=lambda: {"accounts": accounts},
        label_scheduler_tenants=True,
    )
    registry.register(FairnessGaugeCollector(book))
    assert book.diagnostics()["scheduler"] == {"a": {"counter": 5.0}, "b": {"counter": 7.0}, OTHER: {"counter": 9.0}}
    assert book.labels.labels() == ("b", "a")
    text = generate_latest(registry).decode()
    for tenant, value in (("a", 5.0), ("b", 7.0), (OTHER, 9.0)):
        assert f'agentd_tenant_virtual_counter{{tenant="{tenant}"}} {value}' in text
    # one process: the edge labels tenants at arrival; reading the accounts gives none
    edge = FairnessBook(TenantLabels(2), scheduler_view=lambda: {"accounts": accounts})
    assert edge.diagnostics()["scheduler"] == {OTHER: {"counter": 9.0}} and edge.labels.labels() == ()
