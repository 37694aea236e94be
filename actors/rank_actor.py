"""One rank actor per DP rank target: the single writer of what agentd learned about that rank.

A rank actor owns one target's backend observation: the last engine sample, when it was observed,
when the rank was last scraped, the last scrape error, the scrape and failure counts, and the
backend KV capacity (``vllm:cache_config_info``, in the sample).  Its whole state is one frozen
:class:`RankSnapshot`; each update builds the next value (:meth:`RankSnapshot.after_scrape`) and
*publishes* it by swapping a reference, so diagnostics read an immutable value and never the
actor's working state (docs/architecture.md, "Who owns what").  Freshness is derived from
``observed_at`` at read time: at most ``3 x metrics_interval_seconds`` old
(docs/program-scheduling.md §2).

The actor does not scrape.  One ``/metrics`` GET per *worker URL* serves every DP rank behind it
(vLLM labels each series with its ``engine`` = DP rank), so the observation pacer
(``actors/rank_registry.py``) scrapes each worker once per round and hands every rank actor its
worker's result as a :class:`WorkerScraped` message, one rank after the other in target order.
The actor then, in this order:

1. counts the scrape (a failed scrape is counted as a failure and its error string kept; a
   successful one clears the error);
2. when its engine had series, records the sample and ``observed_at`` (an engine without series
   keeps the previous sample: nothing is fabricated);
3. publishes the new snapshot;
4. sends ``ObservationReceived`` to the scheduler when there was a sample;
5. acknowledges on the message's one-shot ``done`` channel, which is what lets the pacer keep the
   scheduler's ``ObservationReceived`` messages in target order.

Lifecycle: the registry starts the actor in its nursery when its target appears and cancels it
when the target goes.  However the actor ends, every ``done`` channel it holds or still has in
its inbox is closed, so the pacer never waits for a rank that is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs
import trio
from attrs import frozen

from actors.core.config import BackendTarget
from actors.core.events import ObservationReceived
from actors.core.ids import TargetId
from actors.logevents import get_logger, log_event
from actors.mailbox import reply_nowait
from actors.messages import SchedulerMessage
from actors.observations import EngineSample

logger = get_logger("program.rank")

# What one scrape of a worker's /metrics gave: samples by engine index (= DP rank), or an error.
ScrapeResult = dict[int, EngineSample] | str


@frozen(eq=False)
class WorkerScraped:
    """Pacer -> rank actor: the result of this round's scrape of the rank's worker.

    The actor acknowledges exactly once on ``done`` (buffer 1); a ``done`` closed without an
    acknowledgement means the actor was cancelled before handling the scrape.
    """

    epoch: int
    observed_at: float
    result: ScrapeResult
    done: trio.MemorySendChannel[bool]


def sample_of(result: ScrapeResult, dp_rank: int, *, ranked: bool = True) -> EngineSample | None:
    """The rank's sample in a scrape result; None when the scrape failed or its engine had no series.

    A worker with one DP target (``ranked`` false: agentd names no rank, the worker balances) whose
    scrape lists exactly one engine is read from that engine whatever its index: a vLLM server of
    one rank under an external load balancer (``--data-parallel-external-lb``) labels its series
    with its global rank, ``engine="3"`` (docs/operations.md §11.7)."""
    if isinstance(result, str):
        return None
    sample = result.get(dp_rank)
    if sample is None and not ranked and len(result) == 1:
        (sample,) = result.values()
    return sample


def missing_engine(result: ScrapeResult, dp_rank: int) -> str | None:
    """Why a successful scrape says nothing about ``dp_rank`` while it has other engines' series (a
    worker started with fewer DP ranks than agentd was configured for, or restarted so), else None.
    A worker without any engine series (not vLLM's metrics) is not an error: it has no observation.

    Only a rank above every engine listed is missing: a vLLM server numbers its engines 0..N-1, so
    fewer ranks drop the highest ones.  A rank below a listed engine is not missing but unobserved:
    vLLM before 0.10.1 exposed only the last engine's series of a data-parallel server
    (``engine="N-1"``; every engine's from 0.10.1 on), and a server of one rank behind an external
    load balancer lists its global rank alone (docs/operations.md §11.7)."""
    if isinstance(result, str) or not result or dp_rank in result or dp_rank < max(result):
        return None
    engines = ", ".join(str(e) for e in sorted(result))
    return (
        f"the worker's /metrics has no series for engine {dp_rank} (engines {engines}): is it running fewer "
        "DP ranks than configured (routing.intra_node_data_parallel_size)?"
    )


@frozen
class RankSnapshot:
    """What agentd last learned about one DP rank (an immutable value published by its actor)."""

    target: BackendTarget
    observed_at: float | None = None
    sample: EngineSample | None = None
    last_scrape_at: float | None = None
    last_error: str | None = None
    scrapes_count: int = 0
    failures_count: int = 0
    # the last successful scrape had other engines' series but not this rank's (a failed scrape
    # keeps the previous value: it says nothing about the engines)
    engine_missing: bool = False

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Backend KV capacity (``num_gpu_blocks * block_size``) from the last sample."""
        return None if self.sample is None else self.sample.kv_capacity_tokens

    def age(self, now: float) -> float | None:
        return None if self.observed_at is None else max(0.0, now - self.observed_at)

    def fresh(self, now: float, interval_seconds: float) -> bool:
        """At most three intervals old (docs/program-scheduling.md §2)."""
        age = self.age(now)
        return age is not None and age <= 3 * interval_seconds

    def after_scrape(self, observed_at: float, result: ScrapeResult) -> RankSnapshot:
        """The next snapshot once the rank's worker was scraped at ``observed_at``."""
        if isinstance(result, str):
            return attrs.evolve(
                self,
                last_scrape_at=observed_at,
                last_error=result,
                scrapes_count=self.scrapes_count + 1,
                failures_count=self.failures_count + 1,
            )
        sample = sample_of(result, self.target.dp_rank, ranked=self.target.ranked)
        missing = missing_engine(result, self.target.dp_rank)
        return attrs.evolve(
            self,
            last_scrape_at=observed_at,
            last_error=missing,
            engine_missing=missing is not None,
            scrapes_count=self.scrapes_count + 1,
            # no series for this engine: keep the previous sample (never fabricate an observation)
            sample=self.sample if sample is None else sample,
            observed_at=self.observed_at if sample is None else observed_at,
        )

    def as_dict(self, now: float, interval_seconds: float) -> dict[str, Any]:
        """JSON-ready view of the snapshot at ``now``."""
        s = self.sample
        return {
            "target_id": self.target.target_id,
            "observation_age_seconds": self.age(now),
            "observation_fresh": self.fresh(now, interval_seconds),
            "vllm_kv_cache_usage": None if s is None else s.kv_cache_usage,
            "vllm_running_requests": None if s is None else s.running_requests,
            "vllm_waiting_requests": None if s is None else s.waiting_requests,
            "vllm_kv_capacity_tokens": self.kv_capacity_tokens,
            "last_scrape_error": self.last_error,
            "scrapes_count": self.scrapes_count,
            "scrape_failures_count": self.failures_count,
        }


async def run_rank_actor(
    target: BackendTarget,
    inbox: trio.MemoryReceiveChannel[WorkerScraped],
    scheduler_send: trio.MemorySendChannel[SchedulerMessage],
    publish: Callable[[RankSnapshot], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Observe ``target`` from the scrapes handed to it until cancelled or the inbox closes."""
    snapshot = RankSnapshot(target)
    publish(snapshot)
    async with inbox, scheduler_send:
        try:
            task_status.started()
            async for msg in inbox:
                with msg.done:  # closed however this ends: the pacer never waits for a gone actor
                    previous = snapshot
                    snapshot = snapshot.after_scrape(msg.observed_at, msg.result)
                    missing = missing_engine(msg.result, target.dp_rank)
                    if missing is not None and previous.last_error != missing:  # once, when it starts
                        log_event(
                            logger, logging.WARNING, "worker_engine_missing", target=target.target_id, reason=missing
                        )
                    elif previous.engine_missing and not snapshot.engine_missing:
                        log_event(logger, logging.INFO, "worker_engine_restored", target=target.target_id)
                    publish(snapshot)
                    sample = sample_of(msg.result, target.dp_rank, ranked=target.ranked)
                    if sample is not None:
                        await scheduler_send.send(
                            ObservationReceived(
                                target_id=TargetId(target.target_id),
                                epoch=msg.epoch,
                                kv_cache_usage=sample.kv_cache_usage,
                                running_requests=sample.running_requests,
                                waiting_requests=sample.waiting_requests,
                                observed_at=msg.observed_at,
                                kv_capacity_tokens=sample.kv_capacity_tokens,
                            )
                        )
                    reply_nowait(msg.done, True)
        finally:
            # Scrapes handed over but never handled (the actor was cancelled): release their waiters.
            while True:
                try:
                    pending = inbox.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                pending.done.close()
