"""Values and records of the scheduling core.

Frozen values (``RequestHints``) cross the event boundary.  The records (``Program``,
``PendingRequest``, ``Dispatch``, ``RankState``) are mutable ``attrs`` slots classes owned by one
``SchedulerState`` and mutated only inside ``scheduler.step``: the benchmark needs 10 000 live
Programs with a few-microsecond cycle and a few hundred bytes per idle Program, which frozen
copies of the whole state cannot give.  Nothing outside the core may mutate them; the shell
reads the frozen ``snapshot.snapshot(...)`` instead.

Field names follow the reference router's Program record, with unit suffixes.
Optional collections are created lazily (``None`` while empty) to keep idle Programs small.
"""

from __future__ import annotations

import attrs
from attrs import define, frozen

from actors.core.ids import DEFAULT_TENANT, ProgramRef, RequestId, TargetId
from actors.core.stats import ProgressTtlFactors

# Program state / status (the pair is the lifecycle state, see program.py).
ACTIVE = "active"
PAUSED = "paused"
REASONING = "reasoning"
ACTING = "acting"

# Pause reasons (metric labels of vllm_router_agent_aware_transitions_total).
TTL_EXPIRED = "ttl_expired"
CAPACITY_REPAIR = "capacity_repair"
MAX_SEGMENT_YIELD = "max_segment_yield"
REQUEST_FAILED = "request_failed"
REQUEST_CANCELLED = "request_cancelled"
# a higher class or priority needed the capacity (docs/priority.md §1)
PRIORITY_PREEMPTION = "priority_preemption"
# a heavy tenant above its cap on a rank shared with a light tenant (docs/priority.md §3)
TENANT_ISOLATION = "tenant_isolation"
# its long prefill was taken back before its first token for a light tenant (docs/priority.md §3)
PREFILL_REQUEUE = "prefill_requeue"
# how often one request may be taken back so (each dispatch is asked at most once): a light tenant
# that comes back after the re-dispatch gets the rank once more, then the prefill runs to its end
MAX_PREFILL_REQUEUES = 2
PAUSE_REASONS = (
    TTL_EXPIRED,
    CAPACITY_REPAIR,
    MAX_SEGMENT_YIELD,
    REQUEST_FAILED,
    REQUEST_CANCELLED,
    PRIORITY_PREEMPTION,
    TENANT_ISOLATION,
    PREFILL_REQUEUE,
)

# Request classes (docs/priority.md §2): ``interactive`` requests carry no Program identity and are
# queued by the core only when the edge sends them (``InteractiveSubmitted``); ``agent`` requests
# belong to Programs (the RequestPool); ``batch`` requests wait in the job-aware batch queue.
INTERACTIVE = "interactive"
AGENT = "agent"
BATCH = "batch"
REQUEST_CLASSES = (INTERACTIVE, AGENT, BATCH)


@frozen
class ProgramIdentity:
    """Program-level identity of one request, as the edge parsed it (overwrites the Program's
    metadata on arrival).

    ``source`` is the schema that produced it: ``"agentic_context"``, ``"agent_hint"``,
    ``"claude_code"``, ``"codex"`` or ``"x_session_id"``. ``placement_key`` groups a task
    (task_id, else session_id, else program_id); ``placement_hash_key`` feeds
    consistent-hash binding. ``step_id`` is the raw explicit value (None when omitted).
    """

    program_id: str
    task_id: str | None
    session_id: str | None
    agent_id: str | None
    parent_program_id: str | None
    root_program_id: str | None
    blocks_parent: bool
    expected_resume: bool
    agent_role: str | None
    spawn_reason: str | None
    step_id: int | None
    source: str
    placement_key: str
    placement_hash_key: str


# Where a queued Program waits: ("rank", target id) or ("global", model pool).
RANK_QUEUE = "rank"
GLOBAL_QUEUE = "global"
QueueSlot = tuple[str, str]


@frozen
class RequestHints:
    """Request-scoped fields: valid for exactly one RequestPool entry and its dispatch."""

    request_id: str | None = None
    priority: int = 0
    deadline_seconds: float | None = None
    expected_output_length: int | None = None
    kv_retention_ttl_seconds: float | None = None


NO_HINTS = RequestHints()


@frozen
class Usage:
    """Token usage reported by the backend for one completed request (``None`` = not reported)."""

    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    completion_tokens: int | None = None


NO_USAGE = Usage()


@define(slots=True, eq=False)
class PendingRequest:
    """One retained request in the RequestPool (one FIFO entry)."""

    request_id: RequestId
    ref: ProgramRef
    seq: int
    arrived_at: float
    estimated_context_tokens: int
    hints: RequestHints
    routing_text: str | None
    queue_deadline: float
    request_class: str = AGENT
    tenant: str = DEFAULT_TENANT
    requeues: int = 0  # times its dispatch was taken back before its first token (docs/priority.md §3)
    # workers it could not reach earlier (``RequestSubmitted.avoid_workers``, docs/program-scheduling.md §9.1)
    avoid_workers: frozenset[str] = frozenset()


@define(slots=True, eq=False)
class Dispatch:
    """A claimed (in-flight) request: what complete() needs, fenced by generation and epoch."""

    request_id: RequestId
    ref: ProgramRef
    target_id: TargetId
    placement_epoch: int
    arrived_at: float
    dispatched_at: float
    estimated_context_tokens: int
    placement_start_request: bool
    hints: RequestHints
    tenant: str = DEFAULT_TENANT
    reserved_output_tokens: int = 0  # expected output: charged at completion without usage (docs/priority.md §3)
    # what re-queueing it before its first token needs (docs/priority.md §3, fairness_requeue): its
    # place in the RequestPool, the input tokens its tenant was charged, whether a forced resume
    # dispatched it, how often it was re-queued already and whether the shell was asked to
    queue_seq: int = 0
    routing_text: str | None = None
    input_charge: float = 0.0
    forced: bool = False
    requeues: int = 0
    requeue_asked: bool = False


@define(slots=True, eq=False)
class Program:
    """Runtime and decision record of one live Program generation (docs/program-scheduling.md §1)."""

    ref: ProgramRef
    created_at: float
    state: str = PAUSED
    status: str = REASONING
    expected_resume: bool = True
    placement: TargetId | None = None
    placement_epoch: int = 0
    placement_start_pending: bool = False
    in_flight: int = 0
    # identity metadata (overwritten on every arrival)
    placement_key: str = ""
    placement_hash_key: str = ""
    task_id: str | None = None
    session_id: str | None = None
    agent_id: str | None = None
    parent_program_id: str | None = None
    root_program_id: str | None = None
    blocks_parent: bool = False
    agent_role: str | None = None
    spawn_reason: str | None = None
    step_id: int = 0
    # placement
    home_target: TargetId | None = None
    last_target: TargetId | None = None
    # the rank a failover's exclusion moved it off (docs/program-scheduling.md §9.1): given back if
    # it goes idle without a successful completion since; cleared by one
    failover_from: TargetId | None = None
    # occupancy
    estimated_context_tokens: int = 0
    context_shrink_observations: int = 0
    output_token_reservation: int | None = None
    charged_tokens: float = 0.0  # private tokens currently counted on `placement` (0 if paused)
    # segment statistics
    completed_requests: int = 0
    segment_served_rounds: int = 0
    rounds_since_activation: int = 0
    ttl_pause_sampled_segment_rounds: int = 0
    rounds_since_ttl_pause: int = 0
    segment_started_at: float | None = None
    last_context_tokens: int | None = None
    last_completion_tokens: int = 0
    lifetime_generated_tokens: int = 0
    last_request_finished_at: float | None = None
    last_cache_miss_impact_seconds: float = 0.0
    # (rank, its allocation counter, KV free ahead) at the last completion (cache_residency,
    # docs/program-scheduling.md §12.1)
    residency_mark: tuple[TargetId, float, float] | None = None
    continuity_sampled_at: float | None = None  # finish time already sampled (B9 fix)
    last_turn_keys: tuple[str, ...] = ()  # tool-gap keys of the last completed turn (tool_retention)
    tool_ttl_armed: tuple[str, float, float] | None = None  # (key, per-tool TTL, fitted TTL) of that turn
    # shared prefix
    shared_prefix_tokens: int = 0
    shared_prefix_observed: bool = False
    shared_prefix_freshness_anchor_at: float = 0.0
    shared_prefix_fresh_until: float | None = None
    # TTL / queueing / pause
    acting_since: float | None = None
    ttl_deadline: float | None = None
    queued_at: float | None = None
    queue_seq: int = 0
    queued_in: QueueSlot | None = None  # (RANK_QUEUE, target_id) | (GLOBAL_QUEUE, pool)
    force_resume_deadline: float | None = None
    force_resume_timeout_seconds: float | None = None
    force_resume_active_remaining_rounds: float = 0.0
    force_resume_pool_remaining_rounds: float = 0.0
    force_resume_request_throughput_per_second: float = 0.0
    force_gate_blocked_at: float | None = None  # unused since the D6 fix (docs/program-scheduling.md §10)
    paused_at: float = 0.0
    last_pause_reason: str | None = None
    pause_when_idle: bool = False
    pause_when_idle_reason: str = CAPACITY_REPAIR  # what marked it (capacity repair or a priority)
    terminate_when_idle: bool = False
    # priorities and fairness (docs/priority.md): the tenant and priority of the latest arrival;
    # the KV tokens held while idle (Active/Acting) and since when, for the tenant's KV rent
    tenant: str = DEFAULT_TENANT
    priority: int = 0
    rent_tokens: float = 0.0
    rent_since: float = 0.0
    # timers armed in the Program actor: kind -> (deadline, token)
    timers: dict[str, tuple[float, int]] | None = None

    @property
    def lifecycle(self) -> str:
        return f"{self.state}_{self.status}"


@define(slots=True, eq=False)
class ObservationCheckpoint:
    """Router ledger facts captured when a backend scrape starts (docs/program-scheduling.md §2: the checkpoint)."""

    revision: int
    ledger_checkpoint: float
    active_reasoning_programs: int
    active_reasoning_requests: int
    active_reasoning_private_tokens: float
    active_acting_private_tokens: float


@define(slots=True, eq=False)
class RankState:
    """One concrete DP rank (target): ledger, observation, queue, statistics."""

    target_id: TargetId
    worker_url: str
    dp_rank: int | None
    index: int
    # Active Programs placed here, in activation order (dict = ordered set).
    active: dict[ProgramRef, Program] = attrs.field(factory=dict)
    fallback_tokens: float = 0.0  # incremental sum of charged_tokens of `active`
    delta_tokens: float = 0.0  # active_program_token_delta (rebased at every observation)
    # running batch requests here and the tokens charged for them (docs/batch.md §2)
    batch_tokens: float = 0.0
    batch_requests: int = 0
    # batch requests dispatched here since the last observation and still running (engine-queue
    # gate, docs/batch.md §2.2), and the observations seen (which dispatches are "since" one)
    batch_dispatched_since_observation: int = 0
    batch_gate_epoch: int = 0
    backend_kv_capacity_tokens: int | None = None  # the engine's KV pool, as last reported
    # new KV tokens its completions reported (cache_residency, docs/program-scheduling.md §12.1)
    allocated_tokens: float = 0.0
    # a completion here reported its cached prompt tokens: the worker reports them, so a later
    # completion without them had none cached (vLLM leaves `prompt_tokens_details` out when the count
    # is 0; docs/program-scheduling.md §14, "Cached, new and recomputed tokens")
    reports_cached_tokens: bool = False
    # tokens Program admission leaves to backlogged batch work (its guaranteed share, docs/batch.md §2)
    batch_claim_tokens: float = 0.0
    # running interactive requests here and their charge (docs/priority.md §2)
    interactive_tokens: float = 0.0
    interactive_requests: int = 0
    # tokens lower classes leave to the interactive requests waiting for this rank (docs/priority.md §2)
    interactive_claim_tokens: float = 0.0
    # the long prefill in flight here and its estimated end (docs/priority.md §3, fairness_prefill)
    long_prefill: tuple[RequestId, float] | None = None
    # the light tenants this rank is kept for by the last admission pass (fairness_isolation)
    isolated_for: frozenset[str] = frozenset()
    # the last backend observation (docs/program-scheduling.md §2)
    kv_cache_usage: float | None = None
    running_requests: int | None = None
    waiting_requests: int | None = None
    # Program requests dispatched here that completed since that observation arrived: each let the
    # engine start one it queued (the waiting gate counts them, docs/program-scheduling.md §3)
    completed_since_observation: int = 0
    # Program requests dispatched here and still in flight, a stale placement's too (its Program was
    # invalidated, but the engine still runs the request): the waiting gate reads it (ledger.drained)
    dispatched: int = 0
    observed_router_active_reasoning_programs: int = 0
    observed_router_active_reasoning_requests: int = 0
    estimated_active_reasoning_tokens: float | None = None
    estimated_active_program_tokens: float | None = None
    observed_at: float | None = None
    reported_capacity_source: str | None = None
    checkpoints: dict[int, ObservationCheckpoint] = attrs.field(factory=dict)
    factors: ProgressTtlFactors = attrs.field(kw_only=True)  # the rank's rolling statistics


class Lineage:
    """Model-scoped parent forest over program ids; diagnostics only (``root_program_id``).

    ``observe`` links a Program to its declared parent, then to its declared root (which
    overrides the parent link), skipping self links and links that would create a cycle.
    """

    __slots__ = ("parents",)

    def __init__(self) -> None:
        self.parents: dict[tuple[str, str], str] = {}

    def _would_cycle(self, pool: str, child: str, proposed: str) -> bool:
        node = proposed
        for _ in range(len(self.parents) + 2):
            if node == child:
                return True
            nxt = self.parents.get((pool, node))
            if nxt is None or nxt == node:
                return False
            node = nxt
        return True

    def observe(self, pool: str, program_id: str, parent: str | None, root: str | None) -> None:
        current = self.parents.get((pool, program_id))
        if current is not None and current == (root if root is not None and root != program_id else parent):
            return  # the declared link is already in place (the common repeat arrival)
        self.parents.setdefault((pool, program_id), program_id)
        if parent is not None and parent != program_id and not self._would_cycle(pool, program_id, parent):
            self.parents.setdefault((pool, parent), parent)
            self.parents[(pool, program_id)] = parent
        if root is not None and root != program_id and not self._would_cycle(pool, program_id, root):
            self.parents.setdefault((pool, root), root)
            self.parents[(pool, program_id)] = root

    def forget(self, pool: str, program_id: str) -> None:
        """Drop a node whose history was pruned (docs/program-scheduling.md §10, B14); its children stop at its id."""
        self.parents.pop((pool, program_id), None)

    def root(self, pool: str, program_id: str) -> str:
        node = program_id
        for _ in range(len(self.parents) + 2):
            nxt = self.parents.get((pool, node))
            if nxt is None or nxt == node:
                return node
            node = nxt
        return node
