"""Worker health: periodic ``GET /health`` per worker URL, thresholds, passive outlier ejection.

One check per *worker URL* per interval (all DP ranks of a worker share its verdict; health
checks never carry the DP header).  Checks of one round run concurrently, each bounded by
``routing.health_check_timeout_seconds``; rounds start on a fixed grid of absolute deadlines
``start + k * health_check_interval_seconds`` (a slow round skips missed ticks instead of
bunching up).

Verdicts (docs/operations.md §11): the first check decides alone (the daemon starts serving with
the workers that answer); after that a healthy worker leaves rotation after
``health_failures_to_eject`` consecutive failed checks and an out-of-rotation worker returns after
``health_successes_to_restore`` consecutive passed checks, so a worker whose checks flap within
the thresholds never leaves.  Real traffic reports too (passive outlier ejection): a worker that
refuses or cannot be reached at connect is ejected at once (the request fails over, nothing was
sent); ``outlier_consecutive_failures`` consecutive failed exchanges (timeouts, resets, garbage,
5xx other than 503) eject it as well; any good answer resets that count.  An ejected worker returns
only through its health checks.

:class:`HealthBoard` is the published state.  The health actor (:func:`run_health_checks`) and the
proxy's outcome reports (:meth:`HealthBoard.report_success`, :meth:`HealthBoard.report_failure`,
synchronous, between checkpoints) are its only writers; the dispatchers, ``/health`` and the
diagnostics read it.  The first round completes before ``task_status.started`` so the HTTP server
never starts with unknown health.  Transitions are logged as ``health_change`` events and mirrored
in ``agentd_health_target_healthy{target}`` and ``agentd_health_ejections_total{target,source}``.
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
    reason: str  # "ok", "HTTP 503", "unreachable: ...", "timeout", "not checked yet", "ejected: ..."
    checked_at: float | None  # trio clock of the last health check
    consecutive_failures_count: int  # failed health checks in a row
    consecutive_successes_count: int = 0  # passed health checks in a row
    outlier_failures_count: int = 0  # failed exchanges of real traffic in a row


class HealthBoard:
    """Health verdict per worker URL (see the module docstring for who writes it)."""

    def __init__(
        self,
        targets: Sequence[BackendTarget],
        *,
        failures_to_eject: int = 1,
        successes_to_restore: int = 1,
        outlier_failures: int = 5,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.targets = tuple(targets)
        self.worker_urls: tuple[str, ...] = tuple(dict.fromkeys(t.worker_url for t in targets))
        self._workers: dict[str, WorkerHealth] = {
            url: WorkerHealth(url, False, "not checked yet", None, 0) for url in self.worker_urls
        }
        self._healthy: tuple[BackendTarget, ...] = ()
        self.rounds_count = 0
        self.failures_to_eject = failures_to_eject
        self.successes_to_restore = successes_to_restore
        self.outlier_failures = outlier_failures
        self.metrics = metrics
        self.ejections_count = 0

    def record(self, health: WorkerHealth) -> bool:
        """Store one verdict; returns True when the worker's healthy flag changed."""
        previous = self._workers[health.worker_url]
        self._workers[health.worker_url] = health
        changed = previous.healthy != health.healthy
        if changed:
            self._healthy = tuple(t for t in self.targets if self._workers[t.worker_url].healthy)
            self._publish(health.worker_url, health.healthy)
        return changed

    def _publish(self, url: str, healthy: bool) -> None:
        if self.metrics is None:
            return
        for target in self.targets:
            if target.worker_url == url:
                self.metrics.for_target(target.target_id).healthy.set(1 if healthy else 0)

    def _count_ejection(self, url: str, source: str) -> None:
        self.ejections_count += 1
        if self.metrics is None:
            return
        for target in self.targets:
            if target.worker_url == url:
                self.metrics.ejections.labels(target.target_id, source).inc()

    def record_check(self, url: str, ok: bool, reason: str, now: float) -> bool:
        """Apply one health check's verdict with the thresholds; True when rotation changed."""
        previous = self._workers[url]
        first = previous.checked_at is None and previous.reason == "not checked yet"
        failures = 0 if ok else previous.consecutive_failures_count + 1
        successes = previous.consecutive_successes_count + 1 if ok else 0
        if first:
            healthy = ok
        elif previous.healthy:
            healthy = ok or failures < self.failures_to_eject
        else:
            healthy = ok and successes >= self.successes_to_restore
        if healthy and not previous.healthy:
            outliers = 0
        else:
            outliers = previous.outlier_failures_count
        shown = reason
        if not healthy and ok:
            shown = f"recovering: {successes}/{self.successes_to_restore} checks passed"
        changed = self.record(WorkerHealth(url, healthy, shown, now, failures, successes, outliers))
        if changed and not healthy:
            self._count_ejection(url, "health")
        return changed

    def report_success(self, url: str) -> None:
        """A good answer of real traffic (hot path: only a dict read unless a count must reset)."""
        worker = self._workers.get(url)
        if worker is not None and worker.outlier_failures_count:
            self._workers[url] = attrs.evolve(worker, outlier_failures_count=0)

    def report_failure(self, url: str, detail: str, *, eject_now: bool = False) -> bool:
        """A failed exchange of real traffic; True when it ejected the worker (``eject_now``: a
        connect failure, nothing was sent)."""
        worker = self._workers.get(url)
        if worker is None:
            return False
        count = worker.outlier_failures_count + 1
        eject = worker.healthy and (eject_now or count >= self.outlier_failures)
        if not eject:
            self._workers[url] = attrs.evolve(worker, outlier_failures_count=count)
            return False
        reason = f"ejected: {detail}" if eject_now else f"ejected after {count} failed requests in a row: {detail}"
        self.record(
            attrs.evolve(worker, healthy=False, reason=reason, outlier_failures_count=0, consecutive_successes_count=0)
        )
        self._count_ejection(url, "outlier")
        log_event(logger, logging.WARNING, "health_change", worker=url, healthy=False, reason=reason, source="outlier")
        return True

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
    first = previous.checked_at is None
    changed = board.record_check(url, healthy, reason, trio.current_time())
    now_healthy = board.worker(url).healthy
    if changed or (first and not now_healthy):
        level = logging.INFO if now_healthy else logging.WARNING
        log_event(logger, level, "health_change", worker=url, healthy=now_healthy, reason=reason, source="health")
    elif healthy != now_healthy:
        log_event(logger, logging.DEBUG, "health_check_within_threshold", worker=url, healthy=healthy, reason=reason)
    if metrics is not None and (changed or first):
        for target in board.targets:
            if target.worker_url == url:
                metrics.for_target(target.target_id).healthy.set(1 if now_healthy else 0)


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
