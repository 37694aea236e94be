"""``/metrics`` with relay processes never goes backwards (docs/operations.md §13.3).

The scheduler merges every relay's exposition into its own on each scrape.  Before session 27 a
relay that was restarted (SIGKILL, OOM, a drain) took its counts with it: the aggregate fell by
them, which Prometheus reads as a counter reset.  A relay that missed the 2 s scrape deadline was
left out of that scrape, with the same effect.  Here the relays are fakes at their socket's end
(``exposition()`` is what ``RelayConnection`` answers), in virtual time.
"""

from __future__ import annotations

import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from daemon.dataplane.metrics_merge import RelayMetrics, merged_families_exposition

TIMEOUT = 2.0


class FakeRelay:
    """One relay process's end of the data-plane socket: its exposition, or silence."""

    def __init__(self, requests: float, latency: float, in_flight: float) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("agentd_proxy_requests", "r", ["outcome"], registry=self.registry)
        self.requests.labels("success").inc(requests)
        self.latency = Histogram("agentd_proxy_latency_seconds", "l", registry=self.registry, buckets=(1.0,))
        self.latency.observe(latency)
        Gauge("agentd_proxy_in_flight", "g", registry=self.registry).set(in_flight)
        self.silent = False

    async def exposition(self, seconds: float) -> str | None:
        if self.silent:  # busy or stuck: the scheduler gives up after `seconds`
            await trio.sleep(seconds)
            return None
        return generate_latest(self.registry).decode()


def _values(text: bytes) -> dict[str, float]:
    return {
        s.name + "".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }


async def _scrape(metrics: RelayMetrics, scheduler: CollectorRegistry) -> dict[str, float]:
    return _values(merged_families_exposition(scheduler, await metrics.families()))


async def test_counters_survive_a_relay_restart_and_a_missed_scrape(autojump_clock: trio.testing.MockClock) -> None:
    scheduler = CollectorRegistry()
    Counter("agentd_proxy_requests", "r", ["outcome"], registry=scheduler).labels("success").inc(1)
    relays: dict[int, FakeRelay] = {0: FakeRelay(5, 0.5, 2), 1: FakeRelay(3, 2.0, 1)}
    metrics = RelayMetrics(lambda: relays, TIMEOUT)

    first = await _scrape(metrics, scheduler)
    assert first["agentd_proxy_requests_totaloutcome=success"] == 9.0
    assert first["agentd_proxy_latency_seconds_count"] == 2.0
    assert first["agentd_proxy_latency_seconds_bucketle=1.0"] == 1.0
    assert first["agentd_proxy_latency_seconds_sum"] == 2.5
    assert first["agentd_proxy_in_flight"] == 3.0

    # relay 0 is killed and restarted: the new process has counted 2 requests so far
    relays[0] = FakeRelay(2, 0.25, 0)
    second = await _scrape(metrics, scheduler)
    assert second["agentd_proxy_requests_totaloutcome=success"] == 1 + 5 + 3 + 2
    assert second["agentd_proxy_latency_seconds_count"] == 3.0
    assert second["agentd_proxy_latency_seconds_bucketle=1.0"] == 2.0
    assert second["agentd_proxy_latency_seconds_sum"] == 2.75
    assert second["agentd_proxy_in_flight"] == 1.0  # the dead relay's gauge is gone with it
    assert metrics.document() == {"retired_relays_count": 1, "stale_answers_count": 0}

    # relay 1 does not answer within the deadline: its last answer stands in for it
    relays[1].silent = True
    start = trio.current_time()
    third = await _scrape(metrics, scheduler)
    assert trio.current_time() - start == TIMEOUT
    assert third["agentd_proxy_requests_totaloutcome=success"] == 11.0
    assert metrics.document()["stale_answers_count"] == 1

    # relay 1 dies and is not back yet (restart backoff); relay 0 counts on
    del relays[1]
    relays[0].requests.labels("success").inc(4)
    fourth = await _scrape(metrics, scheduler)
    assert fourth["agentd_proxy_requests_totaloutcome=success"] == 1 + 5 + 3 + 6
    assert fourth["agentd_proxy_latency_seconds_count"] == 3.0

    # its replacement, and a second restart of slot 0: every count kept exactly once
    relays[1] = FakeRelay(1, 0.1, 0)
    relays[0] = FakeRelay(0, 0.1, 0)
    fifth = await _scrape(metrics, scheduler)
    assert fifth["agentd_proxy_requests_totaloutcome=success"] == 1 + 5 + 3 + 6 + 1
    assert metrics.document() == {"retired_relays_count": 3, "stale_answers_count": 1}
    for name, value in first.items():
        if name != "agentd_proxy_in_flight":
            assert fifth[name] >= value, name


async def test_concurrent_scrapes_count_a_replaced_relay_once(autojump_clock: trio.testing.MockClock) -> None:
    """Two scrapers (the admin listener and the ``[prometheus]`` one) at the same moment as a restart."""
    scheduler = CollectorRegistry()
    relays: dict[int, FakeRelay] = {0: FakeRelay(7, 0.5, 0)}
    metrics = RelayMetrics(lambda: relays, TIMEOUT)
    assert (await _scrape(metrics, scheduler))["agentd_proxy_requests_totaloutcome=success"] == 7.0
    relays[0].silent = True  # the first scrape waits for it ...
    results: list[float] = []

    async def scrape() -> None:
        results.append((await _scrape(metrics, scheduler))["agentd_proxy_requests_totaloutcome=success"])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scrape)
        await trio.testing.wait_all_tasks_blocked()
        relays[0] = FakeRelay(1, 0.5, 0)  # ... while the relay is replaced
        nursery.start_soon(scrape)
    assert sorted(results) == [7.0, 8.0]
    assert (await _scrape(metrics, scheduler))["agentd_proxy_requests_totaloutcome=success"] == 8.0
