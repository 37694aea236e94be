"""The rank actors' registry and the observation pacer: backend polling and the periodic tick.

:class:`RankRegistry` keeps one rank actor (``actors/rank_actor.py``) per DP rank target.
:meth:`RankRegistry.sync` declares the wanted targets: once the registry runs, it starts an actor
for each new target and cancels the actor of each removed one, all in the registry's own nursery
(as ``actors/program_registry.py`` does for Program actors).  A removed target's snapshot
disappears at once; an added target reads as never observed until its first scrape.

:func:`run_observation_rounds` is the pacer.  It owns the grid of absolute deadlines
``start + k * metrics_interval_seconds``; a deadline already past when a round ends is skipped,
never bursted.  Each round, in this order:

1. ``ObservationRoundStarted`` for every target to the scheduler (the core checkpoints its ledger:
   admissions committed while the scrape is in flight stay counted, docs/program-scheduling.md §2);
2. one ``GET <url>/metrics`` per *worker URL*, all concurrently, 2 s timeout each: one scrape
   serves every DP rank behind the worker (``engine`` label = DP rank); the round waits for them
   until the next grid point at most.  A scrape still running then goes on (a hung worker's until
   its timeout) and is handed over by the first later round that finds it done; its worker gets
   no other GET meanwhile and its targets are left out of those rounds' ``ObservationRoundStarted``.
   So one slow worker delays neither the other workers' observations nor the tick.  A scrape whose
   worker is no longer observed (its targets removed) is cancelled and awaited by the next round,
   or before the pacer parks: no scrape runs for a worker nothing observes, and a worker that
   returns gets a new GET, never a second one beside the old (its connection is closed by the pool's
   cancellation path, docs/operations.md §11.5).  A worker whose
   scrapes start failing is logged once, in worker order (WARN ``backend_observation_failed``,
   repeats at DEBUG), and once more when a scrape succeeds again (INFO
   ``backend_observation_recovered`` with the number of failed rounds; docs/operations.md §1 and §11);
3. each rank actor, in target order, gets its worker's result (stamped with the time that scrape
   completed) and the pacer waits for its acknowledgement before the next rank, so the actors'
   ``ObservationReceived`` messages reach the scheduler in target order (a failed scrape produces
   none: the previous observation ages out and turns stale after three intervals);
4. ``RepairTick`` (TTL expiry, paused retention, capacity repair, scheduling).

Order comes from explicit keys (target index, then worker order), never from task wake order.

Lifecycle: :func:`run_rank_registry` is started lazily, on the first request that carries Program
identity (docs/operations.md §1); identity-free traffic never polls the backend.  With no targets
no actor exists and the pacer is parked: nothing is scraped and nothing ticks.  Cancelling the
registry's task cancels the pacer and every rank actor.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import trio

from actors.core.config import BackendTarget, ProgramSchedulingConfig
from actors.core.events import RepairTick
from actors.logevents import get_logger, log_event
from actors.mailbox import channel_statistics
from actors.messages import ObservationRoundStarted, SchedulerMessage
from actors.observations import ObservationParseError, local_engines, parse_vllm_metrics
from actors.rank_actor import RankSnapshot, ScrapeResult, WorkerScraped, run_rank_actor

SCRAPE_TIMEOUT_SECONDS = 2.0

# Per-rank inbox.  Only the pacer sends to it, one WorkerScraped per round, and it waits for that
# scrape's acknowledgement before handing anything else to any rank: at most one message is ever
# pending, so one slot means the hand-over never blocks the pacer.
RANK_INBOX_SIZE = 1

logger = get_logger("program.rank")


# Told when a rank's engine leaves (True) or returns to (False) its worker's /metrics.
EngineMissingHook = Callable[[BackendTarget, bool], None]


class RankInboxOverflow(RuntimeError):
    """A rank actor's inbox was full: the pacer handed over a scrape without awaiting the last one."""


class RankHandle:
    """The registry's record of one running rank actor: its target, inbox, cancel scope and the
    snapshot it last published."""

    def __init__(
        self,
        target: BackendTarget,
        inbox: trio.MemorySendChannel[WorkerScraped],
        on_engine_missing: EngineMissingHook | None = None,
    ) -> None:
        self.target = target
        self.inbox = inbox
        self.cancel_scope = trio.CancelScope()
        self.snapshot = RankSnapshot(target)
        self.on_engine_missing = on_engine_missing

    def publish(self, snapshot: RankSnapshot) -> None:
        """Called by the rank actor only: swap in its newest snapshot (and tell the hook when the
        rank's engine left or came back to its worker's ``/metrics``)."""
        changed = snapshot.engine_missing != self.snapshot.engine_missing
        self.snapshot = snapshot
        if changed and self.on_engine_missing is not None:
            self.on_engine_missing(self.target, snapshot.engine_missing)

    async def hand_over(self, epoch: int, observed_at: float, result: ScrapeResult) -> bool:
        """Give the actor its worker's scrape and wait until it has handled it.

        False when the actor is gone (its target was removed before or during the hand-over).
        """
        # One-shot acknowledgement: the actor answers once with send_nowait (buffer 1).
        done_send, done_recv = trio.open_memory_channel[bool](1)
        with done_recv:
            try:
                self.inbox.send_nowait(
                    WorkerScraped(epoch=epoch, observed_at=observed_at, result=result, done=done_send)
                )
            except trio.WouldBlock:
                done_send.close()
                raise RankInboxOverflow(f"rank actor {self.target.target_id} inbox full") from None
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                done_send.close()
                return False
            try:
                return await done_recv.receive()
            except trio.EndOfChannel:
                return False  # cancelled before handling it (target removed)


class RankRegistry:
    """One rank actor per DP rank target; what the dispatcher's diagnostics read.

    ``on_engine_missing(target, missing)``: called when a rank's engine leaves or returns to its
    worker's ``/metrics`` (the daemon takes such a rank out of rotation, docs/operations.md §11.3);
    a rank whose actor stops while its engine is missing is reported back (``missing=False``)."""

    def __init__(
        self, targets: Iterable[BackendTarget] = (), on_engine_missing: EngineMissingHook | None = None
    ) -> None:
        self.on_engine_missing = on_engine_missing
        self.targets: tuple[BackendTarget, ...] = ()
        self.started = False  # backend polling has started (the registry runs)
        self.rounds_count = 0  # written by the pacer only
        self.started_count = 0
        self.stopped_count = 0
        self.failing_workers: dict[str, int] = {}  # worker URL -> failed rounds in a row (the pacer's)
        # worker URL -> engines its /metrics lists beyond agentd's ranks there, once warned (the pacer's)
        self.unused_engines: dict[str, int] = {}
        self._ranks: dict[str, RankHandle] = {}  # target order
        self._nursery: trio.Nursery | None = None
        self._scheduler_send: trio.MemorySendChannel[SchedulerMessage] | None = None
        self._targets_changed = trio.Event()
        self.sync(targets)

    def sync(self, targets: Iterable[BackendTarget]) -> None:
        """Make the running actors match ``targets``: start new ones, cancel removed ones.

        Before the registry runs this only records the targets (their actors start with it).
        """
        self.targets = tuple(sorted(targets, key=lambda t: t.index))
        self._targets_changed.set()
        self._targets_changed = trio.Event()
        if self._nursery is None:
            return
        wanted = {t.target_id: t for t in self.targets}
        for target_id, handle in list(self._ranks.items()):
            if wanted.get(target_id) != handle.target:  # removed, or moved (index, URL, rank)
                del self._ranks[target_id]
                handle.inbox.close()
                handle.cancel_scope.cancel()
        running = self._ranks
        self._ranks = {t.target_id: running.get(t.target_id) or self._start(t) for t in self.targets}

    def _bind(self, nursery: trio.Nursery, scheduler_send: trio.MemorySendChannel[SchedulerMessage]) -> None:
        """The registry runs: start the actors of the synced targets in ``nursery``."""
        self._nursery = nursery
        self._scheduler_send = scheduler_send
        self.started = True
        self._ranks = {}
        self.sync(self.targets)

    def _unbind(self) -> None:
        """The registry stops (its nursery cancels the actors); their last snapshots stay readable."""
        self._nursery = None
        self._scheduler_send = None

    def _start(self, target: BackendTarget) -> RankHandle:
        assert self._nursery is not None and self._scheduler_send is not None
        # See RANK_INBOX_SIZE for the bound.
        send, recv = trio.open_memory_channel[WorkerScraped](RANK_INBOX_SIZE)
        handle = RankHandle(target, send, self.on_engine_missing)
        self._nursery.start_soon(self._run_actor, handle, recv, self._scheduler_send.clone())
        self.started_count += 1
        return handle

    async def _run_actor(
        self,
        handle: RankHandle,
        recv: trio.MemoryReceiveChannel[WorkerScraped],
        scheduler_send: trio.MemorySendChannel[SchedulerMessage],
    ) -> None:
        try:
            with handle.cancel_scope:
                await run_rank_actor(handle.target, recv, scheduler_send, handle.publish)
        finally:
            self.stopped_count += 1
            if handle.snapshot.engine_missing and handle.on_engine_missing is not None:
                handle.on_engine_missing(handle.target, False)  # nothing observes it any more

    async def wait_targets_changed(self) -> None:
        """Return after the next :meth:`sync`."""
        await self._targets_changed.wait()

    def ranks(self) -> tuple[RankHandle, ...]:
        """The running rank actors, in target order."""
        return tuple(self._ranks.values())

    def snapshots(self) -> dict[str, RankSnapshot]:
        """Each rank's last published snapshot by target id, in target order.

        Before the registry runs (polling not started), every synced target reads as never observed.
        """
        if not self.started:
            return {t.target_id: RankSnapshot(t) for t in self.targets}
        return {target_id: handle.snapshot for target_id, handle in self._ranks.items()}

    def statistics(self) -> dict[str, Any]:
        """Rank actors' inbox statistics (for the diagnostics ``channels`` list)."""
        inboxes = [channel_statistics(f"rank_inbox:{h.target.target_id}", h.inbox) for h in self._ranks.values()]
        used = [c["current_buffer_used"] for c in inboxes]
        return {
            "name": "rank_actors",
            "live_rank_actors": self.started_count - self.stopped_count,  # tasks still running
            "started_total": self.started_count,
            "stopped_total": self.stopped_count,
            "observation_rounds_total": self.rounds_count,
            "max_buffer_size": RANK_INBOX_SIZE,
            "current_buffer_used_total": sum(used),
            "current_buffer_used_max": max(used, default=0),
            "inboxes": inboxes,
        }


async def run_rank_registry(
    cfg: ProgramSchedulingConfig,
    client: httpx.AsyncClient,
    registry: RankRegistry,
    scheduler_send: trio.MemorySendChannel[SchedulerMessage],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the rank actors of ``registry`` and the observation pacer until cancelled."""
    async with scheduler_send, trio.open_nursery() as nursery:
        registry._bind(nursery, scheduler_send)
        try:
            task_status.started()
            await run_observation_rounds(cfg, client, registry, scheduler_send)
        finally:
            registry._unbind()


async def run_observation_rounds(
    cfg: ProgramSchedulingConfig,
    client: httpx.AsyncClient,
    registry: RankRegistry,
    scheduler_send: trio.MemorySendChannel[SchedulerMessage],
) -> None:
    """Observation rounds and ticks on a fixed grid of absolute deadlines, until cancelled."""
    interval = cfg.metrics_interval_seconds
    if not registry.ranks():
        await _wait_for_ranks(registry)  # nothing to observe and nothing to tick
    start = trio.current_time()
    k = 0
    epoch = 0
    pending: dict[str, _Scrape] = {}  # worker URL -> its scrape, started in this round or an earlier one
    async with trio.open_nursery() as scrapes:
        while True:
            ranks = registry.ranks()
            cut = False
            if ranks:
                epoch += 1
                cut = await _observation_round(
                    client,
                    ranks,
                    scheduler_send,
                    epoch,
                    registry.failing_workers,
                    pending=pending,
                    unused=registry.unused_engines,
                    nursery=scrapes,
                    deadline=start + (k + 1) * interval,
                )
                registry.rounds_count += 1
                await scheduler_send.send(RepairTick(deadline=start + k * interval))
            else:
                await _stop_unobserved(pending, ())  # nothing observed: no scrape goes on while parked
                await _wait_for_ranks(registry)  # every target was removed: parked until one returns
            if cut:  # the round stopped waiting at the next grid point: that round starts now
                k += 1
                continue
            # Next grid point strictly in the future: missed ticks are skipped, not bursted.
            now = trio.current_time()
            k = max(k + 1, math.floor((now - start) / interval) + 1)
            await trio.sleep_until(start + k * interval)


async def _wait_for_ranks(registry: RankRegistry) -> None:
    while not registry.ranks():
        await registry.wait_targets_changed()


class _Scrape:
    """One worker's ``/metrics`` GET, run by the pacer's nursery: the round whose epoch it belongs
    to, and once ``done`` is set, its result and the time it completed."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.done = trio.Event()
        self.result: ScrapeResult = ""
        self.finished_at = 0.0
        self.cancel_scope = trio.CancelScope()

    async def run(self, client: httpx.AsyncClient, url: str) -> None:
        try:
            with self.cancel_scope:
                self.result = await scrape_worker(client, url)
        finally:
            self.finished_at = trio.current_time()
            self.done.set()


async def _stop_unobserved(pending: dict[str, _Scrape], worker_urls: tuple[str, ...]) -> None:
    """Cancel the scrapes of workers not in ``worker_urls`` (no target observes them any more) and
    wait until each has ended: a cancelled GET ends at its next checkpoint, its connection discarded
    by the pool (a shielded close), so this wait is one scheduling pass, not a timeout."""
    gone = [url for url in pending if url not in worker_urls]
    for url in gone:
        pending[url].cancel_scope.cancel()
    for url in gone:
        await pending.pop(url).done.wait()


async def _observation_round(
    client: httpx.AsyncClient,
    ranks: tuple[RankHandle, ...],
    scheduler_send: trio.MemorySendChannel[SchedulerMessage],
    epoch: int,
    failing: dict[str, int] | None = None,
    *,
    pending: dict[str, _Scrape],
    nursery: trio.Nursery,
    deadline: float,
    unused: dict[str, int] | None = None,
) -> bool:
    """One round; True when it stopped waiting for a scrape at ``deadline`` (the next grid point).

    A worker whose scrape is slower than the interval does not hold the others' observations and the
    tick back (docs/operations.md §1): the round hands over what arrived by the next grid point, the
    slow scrape goes on (up to its own timeout) and is handed over, with its own epoch and completion
    time, by the first round that finds it done; no second GET goes to that worker meanwhile."""
    failing = {} if failing is None else failing
    worker_urls = tuple(dict.fromkeys(h.target.worker_url for h in ranks))  # worker order = first target's order
    await _stop_unobserved(pending, worker_urls)
    fresh = [url for url in worker_urls if url not in pending]
    if fresh:
        started = tuple(h.target.target_id for h in ranks if h.target.worker_url in fresh)
        await scheduler_send.send(ObservationRoundStarted(epoch=epoch, target_ids=started))
        for url in fresh:
            scrape = pending[url] = _Scrape(epoch)
            nursery.start_soon(scrape.run, client, url)
    with trio.move_on_at(deadline) as waiting:
        for url in worker_urls:
            await pending[url].done.wait()
    cut = waiting.cancelled_caught
    done = {url: pending.pop(url) for url in worker_urls if pending[url].done.is_set()}
    for url, scrape in done.items():
        result = scrape.result
        if isinstance(result, str):
            streak = failing[url] = failing.get(url, 0) + 1
            level = logging.WARNING if streak == 1 else logging.DEBUG  # one warning per failure streak
            log_event(logger, level, "backend_observation_failed", base_url=url, error=result, failed_rounds=streak)
        elif url in failing:
            streak = failing.pop(url)
            log_event(logger, logging.INFO, "backend_observation_recovered", base_url=url, failed_rounds=streak)
    per_worker = Counter(h.target.worker_url for h in ranks)
    results = {  # keyed by local rank: a hybrid-LB server numbers its engines from an offset
        url: scrape.result if isinstance(scrape.result, str) else local_engines(scrape.result, per_worker[url])
        for url, scrape in done.items()
    }
    _warn_unused_engines(results, per_worker, {} if unused is None else unused)
    for handle in ranks:  # target order; each rank is done before the next one starts
        answered = done.get(handle.target.worker_url)
        if answered is not None:
            await handle.hand_over(answered.epoch, answered.finished_at, results[handle.target.worker_url])
    return cut


def _warn_unused_engines(results: dict[str, ScrapeResult], ranks: Counter[str], unused: dict[str, int]) -> None:
    """WARN ``worker_engines_unused`` when a worker's ``/metrics`` lists more engines than agentd has
    DP ranks there (again when the count changes; INFO ``worker_engines_matched`` once it no longer
    does): a vLLM server of DP 4 configured as one or two targets gets its requests on the engines
    agentd names, or vLLM's own balancing with one target, and Program scheduling observes only
    the engines it has ranks for (docs/operations.md §11.7)."""
    for url, result in results.items():
        if isinstance(result, str):
            continue
        engines, targets = len(result), ranks[url]
        seen = engines if engines > targets else 0
        if seen == unused.get(url, 0):
            continue
        if seen:
            unused[url] = seen
            log_event(
                logger,
                logging.WARNING,
                "worker_engines_unused",
                base_url=url,
                engines=engines,
                ranks=targets,
                message=(
                    f"the worker's /metrics lists {engines} engines and agentd schedules {targets} DP "
                    f"rank(s) there: set routing.intra_node_data_parallel_size = {engines} if they serve "
                    "this worker URL"
                ),
            )
        else:
            del unused[url]
            log_event(logger, logging.INFO, "worker_engines_matched", base_url=url, engines=engines, ranks=targets)


async def scrape_worker(client: httpx.AsyncClient, url: str) -> ScrapeResult:
    """``GET <url>/metrics`` parsed into per-engine samples, or an error string."""
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
