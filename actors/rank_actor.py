"""Backend observation of the DP rank targets and the periodic scheduling tick.

Each DP rank target has a :class:`RankObserver`: the single writer of what agentd last learned
about that rank from its worker (sample, scrape time, last error, backend KV capacity from
``vllm:cache_config_info``).  All rank observers are driven by one loop, :func:`run_rank_actor`,
because two facts couple them:

* one ``/metrics`` scrape per *worker URL* serves every DP rank behind it (``engine`` label ->
  DP rank), so the ranks of one worker share each scrape;
* the core's periodic tick (TTL expiry, paused retention, capacity repair, scheduling, and the
  capacity-accounting-source report) is global, once per interval, after the observations.

The loop runs on a fixed grid of absolute deadlines ``start + k * metrics_interval_seconds``;
a deadline that has already passed when the previous round ends is skipped, never bursted.
Each round, in this order:

1. ``ObservationStarted`` for every target (the core checkpoints its ledger: epoch protocol,
   so admissions committed while the scrape is in flight stay counted);
2. scrape every worker URL concurrently (``GET <url>/metrics``, 2 s timeout each);
3. ``ObservationReceived`` for every target whose engine had series, in target order; a failed
   scrape is logged (WARN ``backend_observation_failed``) and produces nothing, so the previous
   observation ages out: stale after three intervals, which the core reports once as
   ``capacity_observation_fallback`` and once as ``capacity_observation_recovered`` when usable
   accounting returns;
4. ``RepairTick``.

Nothing here runs until the first Program request: the service starts this actor lazily
(identity-free traffic never triggers backend polling).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import httpx
import trio
from attrs import define

from actors.core.config import BackendTarget, ProgramSchedulingConfig
from actors.logevents import get_logger, log_event
from actors.messages import ObservationReceived, ObservationStarted, RepairTick, SchedulerMessage
from actors.observations import EngineSample, ObservationParseError, parse_vllm_metrics

SCRAPE_TIMEOUT_SECONDS = 2.0
logger = get_logger("program.rank")


@define
class RankObserver:
    """What agentd last learned about one DP rank (written only by the rank actor loop)."""

    target: BackendTarget
    observed_at: float | None = None
    sample: EngineSample | None = None
    last_scrape_at: float | None = None
    last_error: str | None = None
    scrapes_count: int = 0
    failures_count: int = 0

    def snapshot(self, now: float, interval_seconds: float) -> dict[str, Any]:
        age = None if self.observed_at is None else max(0.0, now - self.observed_at)
        s = self.sample
        return {
            "target_id": self.target.target_id,
            "observation_age_seconds": age,
            "observation_fresh": age is not None and age <= 3 * interval_seconds,
            "vllm_kv_cache_usage": None if s is None else s.kv_cache_usage,
            "vllm_running_requests": None if s is None else s.running_requests,
            "vllm_waiting_requests": None if s is None else s.waiting_requests,
            "vllm_kv_capacity_tokens": None if s is None else s.kv_capacity_tokens,
            "last_scrape_error": self.last_error,
            "scrapes_count": self.scrapes_count,
            "scrape_failures_count": self.failures_count,
        }


class RankObservers:
    """The rank observers of all targets, grouped by worker URL (read by diagnostics)."""

    def __init__(self, targets: Sequence[BackendTarget]) -> None:
        self.targets = tuple(sorted(targets, key=lambda t: t.index))
        self.by_target = {t.target_id: RankObserver(t) for t in self.targets}
        self.worker_urls = tuple(dict.fromkeys(t.worker_url for t in self.targets))
        self.rounds_count = 0
        self.started = False

    def snapshot(self, now: float, interval_seconds: float) -> list[dict[str, Any]]:
        return [self.by_target[t.target_id].snapshot(now, interval_seconds) for t in self.targets]


async def _scrape(client: httpx.AsyncClient, url: str) -> dict[int, EngineSample] | str:
    """Per-engine samples, or an error string."""
    with trio.move_on_after(SCRAPE_TIMEOUT_SECONDS):
        try:
            response = await client.get(url.rstrip("/") + "/metrics")
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if not 200 <= response.status_code < 300:
            return f"HTTP {response.status_code}"
        try:
            return parse_vllm_metrics(response.text)
        except ObservationParseError as exc:
            return str(exc)
    return f"timeout after {SCRAPE_TIMEOUT_SECONDS} s"


async def run_rank_actor(
    cfg: ProgramSchedulingConfig,
    client: httpx.AsyncClient,
    observers: RankObservers,
    scheduler_send: trio.MemorySendChannel[SchedulerMessage],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Scrape and tick on a fixed grid of absolute deadlines until cancelled."""
    interval = cfg.metrics_interval_seconds
    async with scheduler_send:
        observers.started = True
        task_status.started()
        if not observers.targets:
            return  # nothing to observe and nothing to tick (reference: skip without targets)
        start = trio.current_time()
        k = 0
        epoch = 0
        while True:
            epoch += 1
            await _round(client, observers, scheduler_send, epoch)
            observers.rounds_count += 1
            await scheduler_send.send(RepairTick(deadline=start + k * interval))
            # Next grid point strictly in the future: missed ticks are skipped, not bursted.
            now = trio.current_time()
            k = max(k + 1, math.floor((now - start) / interval) + 1)
            await trio.sleep_until(start + k * interval)


async def _round(
    client: httpx.AsyncClient,
    observers: RankObservers,
    scheduler_send: trio.MemorySendChannel[SchedulerMessage],
    epoch: int,
) -> None:
    await scheduler_send.send(ObservationStarted(epoch=epoch, target_ids=tuple(t.target_id for t in observers.targets)))
    results: dict[str, dict[int, EngineSample] | str] = {}

    async def scrape_one(url: str) -> None:
        results[url] = await _scrape(client, url)

    async with trio.open_nursery() as nursery:
        for url in observers.worker_urls:
            nursery.start_soon(scrape_one, url)
    observed_at = trio.current_time()
    for url in observers.worker_urls:  # deterministic order: worker order, then rank order
        result = results[url]
        if isinstance(result, str):
            log_event(logger, logging.WARNING, "backend_observation_failed", base_url=url, error=result)
    for target in observers.targets:
        rank = observers.by_target[target.target_id]
        result = results[target.worker_url]
        rank.last_scrape_at = observed_at
        rank.scrapes_count += 1
        if isinstance(result, str):
            rank.failures_count += 1
            rank.last_error = result
            continue
        rank.last_error = None
        sample = result.get(target.dp_rank)
        if sample is None:
            continue  # no series for this engine: never fabricate an observation
        rank.sample = sample
        rank.observed_at = observed_at
        await scheduler_send.send(
            ObservationReceived(epoch=epoch, target_id=target.target_id, observed_at=observed_at, sample=sample)
        )
