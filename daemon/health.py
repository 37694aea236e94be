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
refuses or whose name does not resolve at connect is ejected at once (the request fails over,
nothing was sent); ``outlier_consecutive_failures`` consecutive failed exchanges (timeouts, resets,
garbage, 5xx other than 503) eject it as well; any good answer resets that count.  An ejected
worker returns only through its health checks.

A rank the worker refused (vLLM's 400 ``data_parallel_rank N is out of range``: it runs fewer DP
ranks than configured; :meth:`HealthBoard.report_rank_refused`, from the proxy) leaves rotation like
a rank whose engine is missing from the worker's ``/metrics``; each health round that finds its
worker healthy reads that ``/metrics`` and brings the rank back unless its engine is still missing
(docs/operations.md §11.3).

A connect *timeout* is not proof (a starved proxy or a momentarily full accept backlog misses it
too): it makes the worker *suspect* (docs/operations.md §11.3).  A suspect is out of rotation at
once, as if ejected, and the health actor sends it one confirming ``GET /health``
(:func:`run_suspect_probes`, bounded by ``health_check_timeout_seconds`` in :func:`check_worker`
and nowhere else): failed, the worker is ejected; passed, it is back in rotation at once.  While
every worker left in rotation is suspect, the suspects are routed to (a suspect that is fine
serves; a 503 would fail the request for certain).

:class:`HealthBoard` is the published state.  The health actor (:func:`run_health_checks`) and the
proxy's outcome reports (:meth:`HealthBoard.report_success`, :meth:`HealthBoard.report_failure`,
synchronous, between checkpoints) are its only writers; the dispatchers, ``/health`` and the
diagnostics read it.  The first round completes before ``task_status.started`` so the HTTP server
never starts with unknown health.  Transitions are logged as ``health_change`` events and mirrored
in ``agentd_health_target_healthy{target}`` and ``agentd_health_ejections_total{target,source}``;
suspects as ``health_suspect`` / ``health_suspect_restored`` and
``agentd_health_suspects_total{target,outcome}``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import attrs
import httpx
import trio

from actors.core.config import BackendTarget
from actors.logevents import get_logger, log_event
from actors.rank_actor import missing_engine
from actors.rank_registry import scrape_worker
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
    # trio clock of the connect timeout that made the worker suspect, None when it is not; a
    # suspect is ``healthy`` (no verdict yet) but out of rotation while a peer is in it
    suspect_since: float | None = None
    suspect_detail: str = ""  # that connect timeout's error

    @property
    def suspect(self) -> bool:
        return self.suspect_since is not None


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
        self.suspects_count: dict[str, int] = {"ejected": 0, "restored": 0}  # settled suspicions by outcome
        # URLs a confirming probe was asked for and has not reported yet (one in flight per worker,
        # so the channel never holds more than one entry per worker and ``send_nowait`` never
        # blocks); the health actor reads ``probe_requests`` (:func:`run_suspect_probes`)
        self._probing: set[str] = set()
        self._probe_send, self.probe_requests = trio.open_memory_channel[str](max(1, len(self.worker_urls)))
        # targets whose worker's /metrics lists other engines but not theirs (the worker runs fewer
        # DP ranks than configured): out of rotation while a peer is in it (docs/operations.md §11.3)
        self._engine_missing: set[str] = set()
        # targets whose worker refused a request for their DP rank (vLLM's 400 "data_parallel_rank
        # N is out of range"): out of rotation the same way, until a health round's /metrics no
        # longer shows the engine missing (docs/operations.md §11.3)
        self._rank_refused: dict[str, str] = {}  # target id -> the worker's message

    def record(self, health: WorkerHealth) -> bool:
        """Store one verdict; returns True when the worker's healthy flag changed."""
        previous = self._workers[health.worker_url]
        self._workers[health.worker_url] = health
        changed = previous.healthy != health.healthy
        if changed:
            self._publish(health.worker_url, health.healthy)
        if changed or previous.suspect != health.suspect:
            self._refresh()
        return changed

    def _refresh(self) -> None:
        """The targets in rotation: healthy, not suspect and with their engine on the worker; when
        that leaves none, the healthy ones with their engine, then every healthy one (the last
        resort: a suspect may well be fine, and a 503 fails the request for certain)."""
        workers = self._workers
        missing = self._engine_missing.union(self._rank_refused) if self._rank_refused else self._engine_missing
        healthy = tuple(t for t in self.targets if workers[t.worker_url].healthy)
        present = tuple(t for t in healthy if t.target_id not in missing)
        rotation = tuple(t for t in present if not workers[t.worker_url].suspect) or present or healthy
        self._healthy = rotation

    def set_engine_missing(self, target: BackendTarget, missing: bool) -> None:
        """The rank's engine left (or came back to) its worker's ``/metrics`` (the rank actors,
        through the rank registry): a missing engine's rank leaves rotation while another rank is
        in it, so requests stop going to a DP rank the worker refuses."""
        if (target.target_id in self._engine_missing) == missing or target not in self.targets:
            return
        if missing:
            self._engine_missing.add(target.target_id)
        else:
            self._engine_missing.discard(target.target_id)
        self._refresh()

    def engine_missing(self, target: BackendTarget) -> bool:
        return target.target_id in self._engine_missing or target.target_id in self._rank_refused

    def report_rank_refused(self, target: BackendTarget, detail: str) -> bool:
        """The worker refused a request for ``target``'s DP rank (the proxy, on vLLM's 400
        ``data_parallel_rank N is out of range``): the rank leaves rotation as a missing engine does
        (with native policies alone nothing else would notice).  True when it was in rotation."""
        if target not in self.targets or target.target_id in self._rank_refused:
            return False
        was_in = target in self._healthy
        self._rank_refused[target.target_id] = detail
        self._refresh()
        log_event(
            logger,
            logging.WARNING,
            "worker_engine_missing",
            target=target.target_id,
            reason=f"the worker refused a request for DP rank {target.dp_rank}: {detail}",
        )
        return was_in

    def rank_refused_targets(self, url: str) -> tuple[BackendTarget, ...]:
        """``url``'s targets out of rotation because the worker refused their rank."""
        return tuple(t for t in self.targets if t.worker_url == url and t.target_id in self._rank_refused)

    def settle_rank_refused(self, target: BackendTarget, still_missing: str | None) -> None:
        """A health round's verdict on a refused rank: its worker's ``/metrics`` still lists other
        engines but not this one (``still_missing``: why), or it does not (the engine is back, or the
        scrape says nothing about engines): then the rank is back in rotation, and a request the
        worker refuses again takes it out again."""
        if target.target_id not in self._rank_refused or still_missing is not None:
            return
        del self._rank_refused[target.target_id]
        self._refresh()
        log_event(logger, logging.INFO, "worker_engine_restored", target=target.target_id)

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

    def _count_suspect(self, url: str, outcome: str) -> None:
        self.suspects_count[outcome] += 1
        if self.metrics is None:
            return
        for target in self.targets:
            if target.worker_url == url:
                self.metrics.suspects.labels(target.target_id, outcome).inc()

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
        # a periodic check counts as always while the worker is suspect, but only the confirming
        # probe settles the suspicion (or an ejection: then this check's threshold)
        suspect_since, suspect_detail = (previous.suspect_since, previous.suspect_detail) if healthy else (None, "")
        if suspect_since is not None:
            shown = previous.reason
        health = WorkerHealth(url, healthy, shown, now, failures, successes, outliers, suspect_since, suspect_detail)
        changed = self.record(health)
        if changed and not healthy:
            self._count_ejection(url, "health")
            if previous.suspect:
                self._count_suspect(url, "ejected")
        return changed

    def report_success(self, url: str) -> None:
        """A good answer of real traffic (hot path: only a dict read unless a count must reset)."""
        worker = self._workers.get(url)
        if worker is not None and worker.outlier_failures_count:
            self._workers[url] = attrs.evolve(worker, outlier_failures_count=0)

    def report_failure(self, url: str, detail: str, *, eject_now: bool = False, suspect: bool = False) -> bool:
        """A failed exchange of real traffic; True when it took the worker out of rotation.

        ``eject_now``: the connection was refused or the name did not resolve (nothing was sent):
        ejected at once.  ``suspect``: the connect timed out (nothing was sent): the worker is
        suspect and a confirming probe is asked for; a suspect's further connect timeouts change
        nothing (the probe decides)."""
        worker = self._workers.get(url)
        if worker is None:
            return False
        if suspect and not eject_now and worker.healthy:
            if worker.suspect:
                return False
            self._suspect(worker, detail)
            return True
        count = worker.outlier_failures_count + 1
        eject = worker.healthy and (eject_now or count >= self.outlier_failures)
        if not eject:
            self._workers[url] = attrs.evolve(worker, outlier_failures_count=count)
            return False
        reason = f"ejected: {detail}" if eject_now else f"ejected after {count} failed requests in a row: {detail}"
        self._eject_outlier(worker, reason)
        return True

    def _eject_outlier(self, worker: WorkerHealth, reason: str) -> None:
        url = worker.worker_url
        self.record(
            attrs.evolve(
                worker,
                healthy=False,
                reason=reason,
                outlier_failures_count=0,
                consecutive_successes_count=0,
                suspect_since=None,
                suspect_detail="",
            )
        )
        self._count_ejection(url, "outlier")
        if worker.suspect:
            self._count_suspect(url, "ejected")
        log_event(logger, logging.WARNING, "health_change", worker=url, healthy=False, reason=reason, source="outlier")

    def _suspect(self, worker: WorkerHealth, detail: str) -> None:
        url = worker.worker_url
        reason = f"suspect: connect timeout ({detail}); confirming /health probe in flight"
        self.record(attrs.evolve(worker, reason=reason, suspect_since=trio.current_time(), suspect_detail=detail))
        self._request_probe(url)
        log_event(
            logger,
            logging.WARNING,
            "health_suspect",
            worker=url,
            detail=detail,
            # 0: no worker is left in rotation, so the suspects are routed to until their probes settle
            others_in_rotation=len({w for w in self._in_rotation_urls() if w != url}),
        )

    def _in_rotation_urls(self) -> set[str]:
        return {url for url, w in self._workers.items() if w.healthy and not w.suspect}

    def _request_probe(self, url: str) -> None:
        if url not in self._probing:
            self._probing.add(url)
            self._probe_send.send_nowait(url)

    def settle_suspect(self, url: str, ok: bool, reason: str, *, probe_started: float) -> bool:
        """The confirming probe's result (the health actor); True when it changed the rotation.

        Passed: back in rotation at once.  Failed or timed out: ejected (the reason names the
        connect timeout and the probe's result).  A worker no longer suspect (ejected meanwhile)
        is left alone; one that became suspect again after this probe started is probed again."""
        self._probing.discard(url)
        worker = self._workers[url]
        if worker.suspect_since is None:
            return False
        if worker.suspect_since > probe_started:
            self._request_probe(url)
            return False
        seconds = round(trio.current_time() - worker.suspect_since, 6)
        if ok:
            self.record(attrs.evolve(worker, reason=reason, suspect_since=None, suspect_detail=""))
            self._count_suspect(url, "restored")
            log_event(
                logger,
                logging.INFO,
                "health_suspect_restored",
                worker=url,
                probe=reason,
                suspect_seconds=seconds,
                detail=worker.suspect_detail,
            )
            return True
        why = f"ejected: connect timeout ({worker.suspect_detail}), then the confirming /health probe failed"
        self._eject_outlier(worker, f"{why}: {reason}")
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


# The client's own timeouts are off for a check: ``timeout_seconds`` bounds it whole, here and
# nowhere else - a ``connect_timeout_seconds`` set low for fast failover must not fail the checks
# (nor the confirming probe of a connect timeout) by the very timeout they are there to judge.
NO_CLIENT_TIMEOUTS = httpx.Timeout(None)


async def check_worker(client: httpx.AsyncClient, url: str, timeout_seconds: float) -> tuple[bool, str]:
    """One ``GET <url>/health``, bounded by ``timeout_seconds`` alone: (healthy, reason)."""
    with trio.move_on_after(timeout_seconds) as scope:
        try:
            response = await client.get(f"{url}/health", timeout=NO_CLIENT_TIMEOUTS)
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
    refused = board.rank_refused_targets(url) if healthy else ()
    if refused:  # is the engine of a rank the worker refused listed again? (docs/operations.md §11.3)
        with trio.move_on_after(timeout_seconds):
            scraped = await scrape_worker(client, url)
            for target in refused:
                board.settle_rank_refused(target, missing_engine(scraped, target.dp_rank))
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
    """Check every worker now, report started, then re-check on a fixed interval grid forever;
    meanwhile probe every worker that becomes suspect (:func:`run_suspect_probes`)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_suspect_probes, board, client, timeout_seconds)
        await nursery.start(partial(_run_rounds, board, client, interval_seconds, timeout_seconds, metrics))
        task_status.started(board)


async def run_suspect_probes(board: HealthBoard, client: httpx.AsyncClient, timeout_seconds: float) -> None:
    """The confirming probes: one ``GET /health`` per suspicion, as soon as it is asked for (the
    board asks once per worker while one is in flight), bounded by the health check timeout."""
    async with trio.open_nursery() as nursery:
        async for url in board.probe_requests:
            nursery.start_soon(_probe, board, client, url, timeout_seconds)


async def _probe(board: HealthBoard, client: httpx.AsyncClient, url: str, timeout_seconds: float) -> None:
    started = trio.current_time()
    ok, reason = await check_worker(client, url, timeout_seconds)
    board.settle_suspect(url, ok, reason, probe_started=started)


async def _run_rounds(
    board: HealthBoard,
    client: httpx.AsyncClient,
    interval_seconds: float,
    timeout_seconds: float,
    metrics: ProxyMetrics | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    start = trio.current_time()
    await run_health_round(board, client, timeout_seconds, metrics)
    task_status.started()
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
