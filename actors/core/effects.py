"""Output commands and facts produced by ``scheduler.step``, in decision order.

Commands (imperative) tell the shell what to do: ``Admit``/``Reject`` answer a waiting request,
``ArmTimer``/``CancelTimer`` drive the Program actor's timers, ``SpawnProgram``/``RetireProgram``
start/stop one Program actor per live generation.  Facts (nouns) feed logs and metrics:
``Transition`` (program_admit/program_pause logs, ``transitions_total{reason}``), and the
observation facts named after the metric they feed.  The order of the tuple is part of the
contract: within one step, effects appear in the order the decisions were taken; timer
commands for the Programs touched by the step come last, in first-touch order.

Effects are frozen attrs classes *without* ``__slots__``: a step builds about ten of them and
the shell drops them right after, so construction speed matters and memory does not (attrs'
frozen ``__init__`` writes a dict in one go, while a slotted one calls ``object.__setattr__``
per field, about 1.5x slower).  They are still immutable, hashable and compared by value.
"""

from __future__ import annotations

from attrs import frozen

from actors.core.ids import ProgramRef, RequestId, TargetId


@frozen(slots=False)  # see the module docstring
class Admit:
    """Dispatch ``request_id`` to ``target_id`` (the FIFO front of an Active Program)."""

    request_id: RequestId
    target_id: TargetId
    program: ProgramRef
    generation: int
    placement_epoch: int
    placement_start_request: bool
    queue_wait_seconds: float
    estimated_context_tokens: int
    # a long prefill the core may ask to take back before its first token (``RequeuePrefill``):
    # the shell keeps it re-dispatchable (docs/priority.md §3, "Re-queueing a blocking long prefill")
    requeueable: bool = False


@frozen(slots=False)
class AdmitInteractive:
    """Dispatch the interactive request ``request_id`` to ``target_id`` (docs/priority.md §2);
    ``charged_tokens`` stay on that rank's ledger until its ``RequestCompleted``/``RequestAbandoned``."""

    request_id: RequestId
    target_id: TargetId
    tenant: str
    priority: int
    queue_wait_seconds: float
    charged_tokens: int
    used_tokens: float | None = None  # the rank's usage before it (None: capacity unknown)


@frozen(slots=False)
class Reject:
    """Refuse a waiting request (queue timeout -> 429, no targets -> 503)."""

    request_id: RequestId
    reason: str
    status_hint: int
    message: str
    # ``Retry-After`` (whole seconds >= 1) from the queue ETA (docs/program-scheduling.md §13);
    # None: the shell's default
    retry_after_seconds: float | None = None


@frozen(slots=False)
class ArmTimer:
    """(Re)arm the ``kind`` timer of ``program`` at absolute ``deadline``; replaces any earlier one."""

    program: ProgramRef
    kind: str
    deadline: float
    token: int


@frozen(slots=False)
class CancelTimer:
    program: ProgramRef
    kind: str


@frozen(slots=False)
class SpawnProgram:
    """A new Program generation exists: start its actor."""

    program: ProgramRef


@frozen(slots=False)
class RetireProgram:
    """The generation was released: stop its actor (all its timers die with it)."""

    program: ProgramRef


@frozen(slots=False)
class Transition:
    """A committed lifecycle transition.

    ``reason`` is the metric label: program_admit, force_resume, batch_gain_admit,
    cross_rank_resume, ttl_expired, capacity_repair, capacity_repair_mark, max_segment_yield,
    request_failed, request_cancelled, paused_retention_release, health_failover, or
    ``program_release`` / ``request_arrival`` for lifecycle-only moves.  ``counted`` says whether
    ``transitions_total`` counts it (reference parity: request_cancelled, arrivals and plain
    releases are not counted).  Admissions carry the capacity numbers; pauses the released
    private tokens.
    """

    program: ProgramRef
    from_state: str
    to_state: str
    reason: str
    target_id: TargetId | None
    counted: bool = True
    forced: bool = False
    batch_gain: bool = False
    used_tokens: float | None = None
    required_tokens: float | None = None
    reserve_tokens: float | None = None
    capacity_tokens: int | None = None
    released_private_tokens: float | None = None


@frozen(slots=False)
class AdmissionCapacitySnapshot:
    """Capacity facts at a committed admission (not in binding_only)."""

    target_id: TargetId
    used_tokens: float
    required_tokens: float
    growth_reserve_tokens: float
    capacity_tokens: int | None
    capacity_pressure_ratio: float | None
    projected_pressure_ratio: float | None
    backend_kv_usage_ratio: float | None
    backend_running_requests: int | None
    backend_waiting_requests: int | None
    observation_age_seconds: float | None


@frozen(slots=False)
class QueueEtaTold:
    """Tell the waiting request ``request_id`` its place in line and expected wait
    (docs/program-scheduling.md §13): ``first`` at the step that queued it, then at every tick."""

    request_id: RequestId
    position: int
    eta_seconds: float
    first: bool


@frozen(slots=False)
class QueueEtaObserved:
    """A queued request was admitted: its first ETA against the wait it actually had."""

    target_id: TargetId
    eta_seconds: float
    wait_seconds: float
    relative_error: float


@frozen(slots=False)
class RequestIntervalObserved:
    """Completion -> next arrival of the same Program (a continuity sample)."""

    target_id: TargetId
    seconds: float


@frozen(slots=False)
class CacheMissImpactObserved:
    target_id: TargetId
    seconds: float


@frozen(slots=False)
class TtlArmed:
    program: ProgramRef
    target_id: TargetId
    ttl_seconds: float
    source: str  # "fitted" | "request_hint" | "tool" | "tool_release" (docs/program-scheduling.md §12)
    tool: str | None = None  # the turn key a per-tool TTL was decided on


@frozen(slots=False)
class TimeAttributed:
    """Where a Program's time went since its last report (docs/program-scheduling.md §14).

    Emitted at each completion (with what the completion added: its prompt tokens by kind and the
    recomputation's cause) and when a generation is released with time not yet reported (queue
    time of rejected or cancelled requests).  Feeds the ``agentd_program_*_total`` counters."""

    program: ProgramRef
    target_id: TargetId | None
    queue_seconds: float
    prefill_seconds: float
    recompute_seconds: float
    decode_seconds: float
    between_turns_seconds: float
    completed: bool = False  # a completion (the token fields below are its own)
    cause: str | None = None  # of this completion's recomputed tokens
    recomputed_tokens: int = 0
    cached_tokens: int = 0
    new_tokens: int = 0
    estimated_split: bool = False  # prefill/decode priced by the cost model (not streamed)


@frozen(slots=False)
class SharedPrefixObserved:
    target_id: TargetId
    tokens: int


@frozen(slots=False)
class CacheDiscontinuity:
    """unexpected_cache_discontinuity: cached tokens broke inside one placement."""

    program: ProgramRef
    target_id: TargetId
    prompt_tokens: int
    cached_prompt_tokens: int
    previous_context_tokens: int
    uncached_prompt_tokens: int
    cache_miss_impact_seconds: float
    segment_served_rounds: int


@frozen(slots=False)
class CapacitySourceChanged:
    """capacity_observation_fallback (to a ledger source) / _recovered (back to backend)."""

    target_id: TargetId
    previous_source: str | None
    source: str
    observation_age_seconds: float | None
    freshness_threshold_seconds: float


@frozen(slots=False)
class StaleObservationDropped:
    target_id: TargetId
    epoch: int
    epoch_revision: int
    current_revision: int


@frozen(slots=False)
class CompletionIgnored:
    """A completion that the generation/epoch fence rejected (no stats, no ledger change)."""

    request_id: RequestId
    reason: str  # "unknown_request" | "stale_generation" | "stale_placement"


@frozen(slots=False)
class AdmitBatch:
    """Dispatch the batch request ``request_id`` to ``target_id`` (docs/batch.md §2)."""

    request_id: RequestId
    target_id: TargetId
    job: str
    queue_wait_seconds: float
    predicted_decode_tokens: int
    charged_tokens: int
    starvation_escape: bool = False


@frozen(slots=False)
class PreemptBatch:
    """Stop the running batch request ``request_id`` (its upstream call is cancelled); it waits in
    the batch queue again and is dispatched anew later (docs/batch.md §2, preemption)."""

    request_id: RequestId
    target_id: TargetId
    job: str
    freed_tokens: int


@frozen(slots=False)
class RequeuePrefill:
    """Take back the in-flight long prefill ``request_id`` if none of its answer has reached the
    client yet: abort it upstream and answer ``RequestRequeued`` (it then waits in the RequestPool
    again); otherwise let it run (nothing to answer).  ``light_tenants`` are the tenants it blocks
    on ``target_id`` (docs/priority.md §3, "Re-queueing a blocking long prefill")."""

    request_id: RequestId
    target_id: TargetId
    program: ProgramRef
    tenant: str
    light_tenants: tuple[str, ...]
    estimated_prefill_end: float


@frozen(slots=False)
class BatchCompleted:
    """A running batch request ended; ``observed_decode_tokens`` is set for natural stops only."""

    request_id: RequestId
    job: str
    target_id: TargetId
    success: bool
    predicted_decode_tokens: int
    observed_decode_tokens: int | None


@frozen(slots=False)
class BatchJobCreated:
    """A job name was seen for the first time (or again after it was forgotten)."""

    job: str


@frozen(slots=False)
class BatchJobEvicted:
    """The decode estimate of the least recently used job was dropped to make room (``max_jobs``)."""

    job: str


Effect = (
    Admit
    | AdmitInteractive
    | AdmitBatch
    | PreemptBatch
    | RequeuePrefill
    | BatchCompleted
    | BatchJobCreated
    | BatchJobEvicted
    | Reject
    | ArmTimer
    | CancelTimer
    | SpawnProgram
    | RetireProgram
    | Transition
    | AdmissionCapacitySnapshot
    | QueueEtaTold
    | QueueEtaObserved
    | RequestIntervalObserved
    | CacheMissImpactObserved
    | TtlArmed
    | TimeAttributed
    | SharedPrefixObserved
    | CacheDiscontinuity
    | CapacitySourceChanged
    | StaleObservationDropped
    | CompletionIgnored
)
