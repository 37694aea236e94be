"""Input facts consumed by ``scheduler.step`` (past-tense names, frozen values).

The shell (scheduler actor, HTTP handlers, rank and Program actors) turns everything that
happens into one of these and feeds it to ``step`` one at a time, in arrival order.
"""

from __future__ import annotations

from attrs import frozen

from actors.core.config import BackendTarget
from actors.core.ids import DEFAULT_MODEL_POOL, DEFAULT_TENANT, ProgramRef, RequestId, TargetId
from actors.core.model import NO_HINTS, NO_USAGE, ProgramIdentity, RequestHints, Usage

# Timer kinds armed in the Program actor.
ACTING_TTL = "acting_ttl"
FORCE_RESUME = "force_resume"
PAUSED_RETENTION = "paused_retention"
QUEUE_TIMEOUT = "queue_timeout"
TIMER_KINDS = (ACTING_TTL, FORCE_RESUME, PAUSED_RETENTION, QUEUE_TIMEOUT)


@frozen
class RequestSubmitted:
    """A request with a Program identity arrived.

    ``request_id`` is the shell's unique handle (must not be reused while the request lives).
    ``identity`` is the Program's identity as the edge parsed it; ``hints`` the request-scoped
    fields.  ``targets`` is the current target list of ``model_pool`` when the shell knows it;
    ``None`` keeps the known one.
    """

    request_id: RequestId
    identity: ProgramIdentity
    estimated_prompt_tokens: int
    hints: RequestHints = NO_HINTS
    model_pool: str = DEFAULT_MODEL_POOL
    targets: tuple[BackendTarget, ...] | None = None
    routing_text: str | None = None
    # who pays for it in the fairness counter (docs/priority.md §3); the class is ``agent`` and the
    # priority is ``hints.priority`` (larger first)
    tenant: str = DEFAULT_TENANT
    # the client's bound on its queue wait (``x-agentd-max-queue-seconds``, finite >= 0): a request
    # whose queue ETA exceeds it is refused at once (docs/program-scheduling.md §13); None: no bound
    max_queue_seconds: float | None = None
    # the request is already at ``already_on`` (a relay forwarded it under a resume pass,
    # docs/program-scheduling.md §15): it is dispatched there whatever the Program's state (never
    # queued or refused, unless that target is gone); None (always with one process and in the
    # simulator): an ordinary arrival
    already_on: TargetId | None = None
    # the workers (``BackendTarget.worker_url``) this request could not reach earlier in its
    # lifetime: the shell's failover of a request nothing was sent of (docs/operations.md §11.2).
    # While its pool has a target of another worker, the core does not place the request's
    # Program on theirs (docs/program-scheduling.md §9.1); empty: an ordinary arrival
    avoid_workers: frozenset[str] = frozenset()


@frozen
class InteractiveSubmitted:
    """A request without Program identity, of the ``interactive`` class, arrived while Program
    scheduling is on (docs/priority.md §2).

    Answered by ``AdmitInteractive`` (dispatch to its target) or ``Reject``; ended by
    ``RequestCompleted`` or ``RequestAbandoned`` like every other request.  ``priority`` uses the
    internal convention (larger first; OpenAI/vLLM ``priority`` p maps to ``-p``); ``max_tokens``
    is its output cap when it set one (the charge is ``prompt + max_tokens``, else ``prompt +
    decode_buffer_tokens``).  ``deadline_seconds`` bounds its queue wait (else
    ``queue_timeout_seconds``).
    """

    request_id: RequestId
    estimated_prompt_tokens: int
    tenant: str = DEFAULT_TENANT
    priority: int = 0
    max_tokens: int | None = None
    model_pool: str = DEFAULT_MODEL_POOL
    targets: tuple[BackendTarget, ...] | None = None
    deadline_seconds: float | None = None
    # a failover's request: the workers it could not reach, avoided while the pool has a target of
    # another worker (docs/program-scheduling.md §9.1)
    avoid_workers: frozenset[str] = frozenset()


@frozen
class BatchSubmitted:
    """A batch-class request arrived (docs/batch.md §2): it waits in the job-aware batch queue.

    ``job`` is the job name from the request id's ``#job_name[...]#`` tag (``__default__``
    without one); ``max_tokens`` the request's output cap, if it set one.
    """

    request_id: RequestId
    job: str
    estimated_prompt_tokens: int
    max_tokens: int | None = None
    model_pool: str = DEFAULT_MODEL_POOL
    targets: tuple[BackendTarget, ...] | None = None
    # the shell can restart it from scratch (nothing reached the client yet): Programs may preempt it
    preemptible: bool = False
    tenant: str = DEFAULT_TENANT
    priority: int = 0  # inside the batch class, larger first (docs/priority.md §1)


@frozen
class RequestCompleted:
    """A dispatched request finished (``success`` iff the upstream answered 2xx and ended normally).

    ``finish_reason`` is the first choice's (``stop`` = a natural stop, which alone feeds a batch
    job's decode-length estimate), when the response carried one; ``tool_names`` the names of the
    functions the first choice called, in response order (the per-tool acting TTL,
    docs/program-scheduling.md §12).
    """

    request_id: RequestId
    success: bool
    usage: Usage = NO_USAGE
    decode_seconds: float | None = None
    terminate: bool = False
    finish_reason: str | None = None
    tool_names: tuple[str, ...] = ()


@frozen
class RequestAbandoned:
    """The client went away.  Waiting: cancelled; in flight: a failed completion."""

    request_id: RequestId


@frozen
class RequestRequeued:
    """The shell took back a dispatched request before any of its answer reached the client (its
    upstream request was aborted) because the core asked it to (``RequeuePrefill``): the request
    waits in the RequestPool again and is answered by a new ``Admit`` (docs/priority.md §3,
    "Re-queueing a blocking long prefill")."""

    request_id: RequestId


@frozen
class TimerFired:
    """A timer armed by an ``ArmTimer`` effect fired.  Dropped unless ``token`` is current."""

    program: ProgramRef
    kind: str
    token: int


@frozen
class ObservationStarted:
    """A backend scrape of ``target_id`` begins: checkpoint the Router ledger under ``epoch``."""

    target_id: TargetId
    epoch: int


@frozen
class ObservationReceived:
    """Result of a backend scrape (vLLM ``/metrics`` of one DP rank)."""

    target_id: TargetId
    epoch: int
    kv_cache_usage: float | None
    running_requests: int | None
    waiting_requests: int | None
    observed_at: float | None = None  # default: the step's `now`
    # vllm:cache_config_info; sizes the batch budget when token_capacity_per_dp_rank is unset
    kv_capacity_tokens: int | None = None


@frozen
class ObservationStale:
    """Forget the last observation of ``target_id`` (scrape failures; property tests)."""

    target_id: TargetId


@frozen
class RepairTick:
    """The periodic tick (every metrics_interval): periodic decisions + source reporting.

    ``deadline`` is the grid point the tick stands for (the observation pacer's schedule).
    """

    deadline: float | None = None


@frozen
class TargetsChanged:
    """The healthy target list of ``model_pool`` changed (replaced atomically)."""

    model_pool: str
    targets: tuple[BackendTarget, ...]


Event = (
    RequestSubmitted
    | InteractiveSubmitted
    | BatchSubmitted
    | RequestCompleted
    | RequestAbandoned
    | RequestRequeued
    | TimerFired
    | ObservationStarted
    | ObservationReceived
    | ObservationStale
    | RepairTick
    | TargetsChanged
)
