"""Worker health actor: periodic ``GET /health`` per worker URL.

One check per *worker URL* per interval (all DP ranks of a worker share its verdict; health
checks never carry the DP header).  Checks of one round run concurrently, each bounded by
``routing.health_check_timeout_seconds``; rounds start on a fixed grid of absolute deadlines
``start + k * health_check_interval_seconds`` (a slow round skips missed ticks instead of
bunching up).  A worker is healthy when its last check returned a 2xx status.

:class:`HealthBoard` is the published state.  The actor (:func:`run_health_checks`) is its only
writer; the dispatcher, ``/health`` and the diagnostics only read it.  The first round completes
before ``task_status.started`` so the HTTP server never starts with unknown health.
Transitions are logged as ``health_change`` events and mirrored in
``agentd_health_target_healthy{target}``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import httpx
import trio

from actors.core.config import BackendTarget
from actors.logevents import get_logger, log_event
from daemon.metrics import ProxyMetrics

logger = get_logger("health")


@attrs.frozen
class WorkerHealth:
    worker_url: str
    healthy: bool
    reason: str  # "ok", "HTTP 503", "unreachable: ...", "timeout", "not checked yet"
    checked_at: float | None  # trio clock
    consecutive_failures_count: int


class HealthBoard:
    """Latest health verdict per worker URL; written only by :func:`run_health_checks`."""

    def __init__(self, targets: Sequence[BackendTarget]) -> None:
        self.targets = tuple(targets)
        self.worker_urls: tuple[str, ...] = tuple(dict.fromkeys(t.worker_url for t in targets))
        self._workers: dict[str, WorkerHealth] = {
            url: WorkerHealth(url, False, "not checked yet", None, 0) for url in self.worker_urls
        }
        self._healthy: tuple[BackendTarget, ...] = ()
        self.rounds_count = 0

    def record(self, health: WorkerHealth) -> bool:
        """Store one verdict; returns True when the worker's healthy flag changed."""
        previous = self._workers[health.worker_url]
        self._workers[health.worker_url] = health
        changed = previous.healthy != health.healthy
        if changed:
            self._healthy = tuple(t for t in self.targets if self._workers[t.worker_url].healthy)
        return changed

    def healthy_targets(self) -> tuple[BackendTarget, ...]:
        return self._healthy

    def is_healthy(self, target: BackendTarget) -> bool:
        return self._workers[target.worker_url].healthy

    def worker(self, url: str) -> WorkerHealth:
        return self._workers[url]

    def unhealthy_reason(self) -> str:
        if not self.targets:
            return "no targets are configured"
        return "; ".join(f"{url}: {self._workers[url].reason}" for url in self.worker_urls)


async def check_worker(client: httpx.AsyncClient, url: str, timeout_seconds: float) -> tuple[bool, str]:
    """One ``GET <url>/health``: (healthy, reason)."""
    with trio.move_on_after(timeout_seconds) as scope:
        try:
            response = await client.get(f"{url}/health")
        except httpx.TimeoutException:
            return False, "timeout"
        except httpx.HTTPError as exc:
            return False, f"unreachable: {type(exc).__name__}: {exc}"
    if scope.cancelled_caught:
        return False, "timeout"
    if 200 <= response.status_code < 300:
        return True, "ok"
    return False, f"HTTP {response.status_code}"


async def _check_and_record(
    board: HealthBoard,
    client: httpx.AsyncClient,
    url: str,
    timeout_seconds: float,
    metrics: ProxyMetrics | None,
) -> None:
    healthy, reason = await check_worker(client, url, timeout_seconds)
    previous = board.worker(url)
    failures = 0 if healthy else previous.consecutive_failures_count + 1
    changed = board.record(WorkerHealth(url, healthy, reason, trio.current_time(), failures))
    first = previous.checked_at is None
    if changed or (first and not healthy):
        level = logging.INFO if healthy else logging.WARNING
        log_event(logger, level, "health_change", worker=url, healthy=healthy, reason=reason)
    if metrics is not None and (changed or first):
        for target in board.targets:
            if target.worker_url == url:
                metrics.for_target(target.target_id).healthy.set(1 if healthy else 0)


async def run_health_round(
    board: HealthBoard,
    client: httpx.AsyncClient,
    timeout_seconds: float,
    metrics: ProxyMetrics | None = None,
) -> None:
    async with trio.open_nursery() as nursery:
        for url in board.worker_urls:
            nursery.start_soon(_check_and_record, board, client, url, timeout_seconds, metrics)
    board.rounds_count += 1


async def run_health_checks(
    board: HealthBoard,
    client: httpx.AsyncClient,
    interval_seconds: float,
    timeout_seconds: float,
    metrics: ProxyMetrics | None = None,
    *,
    task_status: trio.TaskStatus[HealthBoard] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Check every worker now, report started, then re-check on a fixed interval grid forever."""
    start = trio.current_time()
    await run_health_round(board, client, timeout_seconds, metrics)
    task_status.started(board)
    tick = 1
    while True:
        deadline = start + tick * interval_seconds
        now = trio.current_time()
        if deadline <= now:  # a slow round: skip the ticks we missed
            tick = int((now - start) // interval_seconds) + 1
            deadline = start + tick * interval_seconds
        await trio.sleep_until(deadline)
        await run_health_round(board, client, timeout_seconds, metrics)
        tick += 1
