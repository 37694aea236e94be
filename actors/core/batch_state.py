"""The batch class's part of the scheduler state (docs/batch.md §2); decisions are in ``batch_class``."""

from __future__ import annotations

from collections.abc import Callable

from attrs import define, field

from actors.core.batchjobs import DecodeEstimator, JobQueue, Predictor
from actors.core.config import BatchJobsConfig
from actors.core.ids import DEFAULT_TENANT, RequestId, TargetId


@define(slots=True, eq=False)
class BatchPending:
    request_id: RequestId
    job: str
    prompt_tokens: int
    max_tokens: int | None
    model_pool: str
    arrived_at: float
    preemptible: bool = False
    preemptions: int = 0
    tenant: str = DEFAULT_TENANT
    priority: int = 0


@define(slots=True, eq=False)
class BatchRunning:
    request_id: RequestId
    job: str
    target_id: TargetId
    charged_tokens: float
    predicted_decode_tokens: int
    dispatched_at: float
    on_ledger: bool = True  # False once its rank left the topology (nothing to release there)
    pending: BatchPending | None = None  # its queue record, kept for a preemption
    gate_epoch: int = -1  # its rank's batch_gate_epoch when dispatched (engine-queue gate)


@define(slots=True, eq=False)
class JobCounters:
    """Per-job counts (diagnostics and metrics); kept while the job is live or its estimate is."""

    submitted: int = 0
    running: int = 0
    admitted: int = 0
    completed: int = 0
    failed: int = 0
    abandoned: int = 0
    queue_wait_seconds_sum: float = 0.0
    observed_decode_tokens_sum: int = 0
    observed_count: int = 0
    # dispatch time of each running request, oldest first (the job's progress lower bound)
    running_since: dict[RequestId, float] = field(factory=dict)


Lane = tuple[int, str]  # (priority, tenant)


class BatchLanes:
    """The batch waiting queue split into lanes by (priority, tenant) (docs/priority.md §1, §3).

    Each lane is one seed ``JobQueue``; :meth:`pick` asks the lanes in the order the caller gives
    (higher priority first, then the least-served tenant) and returns the first lane's pick, so
    with one tenant and one priority it is exactly the seed's queue.
    """

    def __init__(self) -> None:
        self.lanes: dict[Lane, JobQueue[RequestId]] = {}
        self._lane_of: dict[RequestId, Lane] = {}

    def add(self, key: RequestId, job: str, prompt_tokens: int, lane: Lane = (0, DEFAULT_TENANT)) -> None:
        q = self.lanes.get(lane)
        if q is None:
            q = self.lanes[lane] = JobQueue()
        q.add(key, job, prompt_tokens)
        self._lane_of[key] = lane

    def remove(self, key: RequestId) -> bool:
        lane = self._lane_of.pop(key, None)
        if lane is None:
            return False
        q = self.lanes[lane]
        q.remove(key)
        if not len(q):
            del self.lanes[lane]
        return True

    def pick(
        self,
        budget_tokens: int,
        estimator: Predictor,
        lane_key: Callable[[Lane], tuple[object, ...]],
        *,
        low_available_tokens_threshold: int,
        short_decode_token_threshold: int,
    ) -> RequestId | None:
        for lane in sorted(self.lanes, key=lane_key) if len(self.lanes) > 1 else list(self.lanes):
            got = self.lanes[lane].pick(
                budget_tokens,
                estimator,
                low_available_tokens_threshold=low_available_tokens_threshold,
                short_decode_token_threshold=short_decode_token_threshold,
            )
            if got is not None:
                return got
        return None

    def __len__(self) -> int:
        return len(self._lane_of)

    def job_size(self, job: str) -> int:
        return sum(q.job_size(job) for q in self.lanes.values())

    def job_of(self, key: RequestId) -> str | None:
        lane = self._lane_of.get(key)
        return None if lane is None else self.lanes[lane].job_of(key)


class BatchState:
    """The batch class's part of the scheduler state (one writer: the scheduler actor)."""

    def __init__(self, cfg: BatchJobsConfig) -> None:
        self.cfg = cfg
        self.queue = BatchLanes()
        self.estimator = DecodeEstimator(cfg.max_jobs)
        # insertion order = arrival order: the first entry is the oldest waiting request
        self.pending: dict[RequestId, BatchPending] = {}
        self.running: dict[RequestId, BatchRunning] = {}
        self.jobs: dict[str, JobCounters] = {}
        # observed decode tokens per second of one batch request, dispatch to completion (EWMA)
        self.decode_rate: float | None = None
        # the same, summed over every successful batch request (the growth reserve's progress rate)
        self.decoded_tokens_total = 0
        self.decode_seconds_total = 0.0
        self.escapes_count = 0
        self.preemptions_count = 0
        # job names seen for the first time (BatchJobCreated) and jobs whose statistics max_jobs
        # evicted (BatchJobEvicted), shown in the diagnostics beside the metrics' counters
        self.jobs_created_count = 0
        self.jobs_evicted_count = 0
