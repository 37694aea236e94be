"""actors.metric_batch: the scheduler's metric updates applied in bulk, exact at every scrape."""

from __future__ import annotations

import math

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from program_fakes import daemon_config, ok, program_request, program_scheduling
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from actors.metric_batch import FlushBeforeCollect, MetricBatch

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in registry.collect()
        if m.name == name
        for s in m.samples
        if not s.name.endswith("_created")
    }


@given(
    values=st.lists(
        st.one_of(
            st.floats(min_value=-5, max_value=50, allow_nan=False),
            st.sampled_from([0.001, 0.01, 0.1, 1.0, 10.0, math.inf, -math.inf]),
        ),
        max_size=60,
    ),
    incs=st.lists(st.integers(min_value=0, max_value=1000), max_size=20),
)
def test_a_flushed_batch_renders_what_one_update_per_value_renders(values: list[float], incs: list[int]) -> None:
    direct, batched = CollectorRegistry(), CollectorRegistry()
    hd = Histogram("h", "d", ("t",), buckets=BUCKETS, registry=direct).labels("a")
    cd = Counter("c", "d", ("t",), registry=direct).labels("a")
    hb = Histogram("h", "d", ("t",), buckets=BUCKETS, registry=batched).labels("a")
    cb = Counter("c", "d", ("t",), registry=batched).labels("a")
    batch = MetricBatch()
    for v in values:
        hd.observe(v)
        batch.observe(hb, v)
    for n in incs:
        cd.inc(n)
        batch.inc(cb, n)
    assert batch.pending == len(values) + (1 if incs else 0)
    batch.flush()
    assert batch.pending == 0
    for name in ("h", "c"):
        want, got = _samples(direct, name), _samples(batched, name)
        assert want.keys() == got.keys()
        for key, value in want.items():
            if key[0] == "h_sum":  # the same values added in another order: equal up to rounding
                same_nan = math.isnan(value) and math.isnan(got[key])
                assert same_nan or got[key] == value or math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-9)
            else:
                assert got[key] == value, key  # bucket counts, _count and counter totals: exact


def test_nan_is_in_no_bucket_as_with_observe() -> None:
    registry = CollectorRegistry()
    h = Histogram("h", "d", buckets=BUCKETS, registry=registry)
    batch = MetricBatch()
    batch.observe(h, math.nan)
    batch.observe(h, 0.5)
    batch.flush()
    assert registry.get_sample_value("h_count") == 1.0
    assert registry.get_sample_value("h_bucket", {"le": "1.0"}) == 1.0
    assert math.isnan(registry.get_sample_value("h_sum") or 0.0)


def test_a_scrape_flushes_first_and_the_limit_bounds_what_waits() -> None:
    registry = CollectorRegistry()
    first = FlushBeforeCollect()
    batch = MetricBatch(limit=3)
    first.add(batch.flush)
    registry.register(first)
    c = Counter("c", "d", registry=registry)
    h = Histogram("h", "d", buckets=BUCKETS, registry=registry)
    batch.inc(c, 2)
    batch.observe(h, 0.05)
    assert c._value.get() == 0.0  # not yet applied
    assert registry.get_sample_value("c_total") == 2.0  # the collection flushed before reading it
    assert registry.get_sample_value("h_count") == 1.0
    for v in (1.0, 2.0):
        batch.observe(h, v)
    assert batch.pending == 2
    batch.observe(h, 3.0)  # the third pending observation: flushed by itself
    assert batch.pending == 0 and batch.flushes == 2
    assert h._sum.get() == 6.05


async def test_scheduler_metrics_are_exact_at_scrape_time_after_n_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """N requests through the real scheduler actor, no tick in between: the updates wait in the
    batch, and the scrape (generate_latest) renders every one of them."""
    n = 7
    async with program_scheduling(daemon_config(token_capacity_per_dp_rank=10_000)) as (dispatcher, registry, _):
        start = trio.current_time()
        for i in range(n):
            async with dispatcher.lease(program_request(f"p{i % 3}", tokens=100)) as lease:
                lease.finish(ok(prompt=100, cached=0))
        assert trio.current_time() == start  # no tick ran: nothing was flushed by the actor
        router = dispatcher.scheduler.router
        assert router is not None and router.batch.pending > 0
        text = generate_latest(registry).decode()
        assert router.batch.pending == 0
        families = {f.name: f for f in text_string_to_metric_families(text)}
        waits = [s for s in families["vllm_router_agent_aware_queue_wait_seconds"].samples if s.name.endswith("_count")]
        assert sum(s.value for s in waits) == n  # one queue wait per admission
        prompt = {
            s.labels["kind"]: s.value
            for s in families["agentd_program_prompt_tokens"].samples
            if s.name.endswith("_total")
        }
        assert sum(prompt.values()) == 100 * n  # every completion's prompt tokens, split by kind
        admits = [
            s
            for s in families["vllm_router_agent_aware_transitions"].samples
            if s.name.endswith("_total") and s.labels["reason"] == "program_admit"
        ]
        # every request is an admission of its Program (the first, or the resume of a Program
        # its previous answer paused): as many as the dispatcher counted
        assert sum(s.value for s in admits) == dispatcher.counters.admitted_count == n
