"""The batch class's part of the scheduler state (docs/batch.md §2); decisions are in ``batch_class``."""

from __future__ import annotations

from attrs import define, field

from actors.core.batchjobs import DecodeEstimator, JobQueue
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
    predicted_decode_tokens_sum: int = 0
    # dispatch time of each running request, oldest first (the job's progress lower bound)
    running_since: dict[RequestId, float] = field(factory=dict)


class BatchState:
    """The batch class's part of the scheduler state (one writer: the scheduler actor)."""

    def __init__(self, cfg: BatchJobsConfig) -> None:
        self.cfg = cfg
        self.queue: JobQueue[RequestId] = JobQueue()
        self.estimator = DecodeEstimator(cfg.max_jobs)
        # insertion order = arrival order: the first entry is the oldest waiting request
        self.pending: dict[RequestId, BatchPending] = {}
        self.running: dict[RequestId, BatchRunning] = {}
        self.jobs: dict[str, JobCounters] = {}
        # observed decode tokens per second of one batch request, dispatch to completion (EWMA)
        self.decode_rate: float | None = None
        self.escapes_count = 0
        self.preemptions_count = 0
