"""Configuration values the pure core reads: Program scheduling, its cost models, targets.

Every class is an ``attrs.frozen`` value with defaults, so tests can build configs directly
(``ProgramSchedulingConfig(token_capacity_per_dp_rank=1000)``).  Construction does not validate:
the daemon's loader (docs/config.md) structures a file, applies CLI overrides and then calls
:func:`problems` on the whole tree so that *every* problem is reported at once, each naming the
field, the rule and the value.  Field rules are declared next to the field (``rule=...`` in the
attrs metadata); cross-field rules live in ``_cross_field_problems`` methods.

The ``program_scheduling`` section mirrors the reference router's ``ProgramSchedulingConfig`` field
for field (names, defaults, constraints), so operators can carry their JSON over unchanged.  The
seed's cost-model coefficients are written here once; the simulated backend's default cost model
reads them from here too (docs/simulator.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from attrs import field, frozen

# --------------------------------------------------------------------------------------------
# Field rules: (predicate, human-readable rule).  Used by ``problems``.
# --------------------------------------------------------------------------------------------

Rule = tuple[Callable[[Any], bool], str]


def finite(x: Any) -> bool:
    """A real number (not a bool), neither infinite nor NaN."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


FINITE_GT_0: Rule = (lambda x: finite(x) and x > 0, "must be finite and > 0")
FINITE_GE_0: Rule = (lambda x: finite(x) and x >= 0, "must be finite and >= 0")
FINITE_GE_1: Rule = (lambda x: finite(x) and x >= 1, "must be finite and >= 1")
UNIT_INTERVAL: Rule = (lambda x: finite(x) and 0 <= x <= 1, "must be finite and within [0, 1]")
INT_GT_0: Rule = (lambda x: isinstance(x, int) and x > 0, "must be an integer > 0")
INT_GE_0: Rule = (lambda x: isinstance(x, int) and x >= 0, "must be an integer >= 0")
PORT: Rule = (lambda x: isinstance(x, int) and 0 <= x <= 65535, "must be a port number within [0, 65535]")
OPTIONAL_INT_GE_0: Rule = (lambda x: x is None or (isinstance(x, int) and x >= 0), "must be null or an integer >= 0")
OPTIONAL_INT_GT_0: Rule = (lambda x: x is None or (isinstance(x, int) and x > 0), "must be null or an integer > 0")
OPTIONAL_PORT: Rule = (lambda x: x is None or PORT[0](x), "must be null or a port number within [0, 65535]")
NON_EMPTY: Rule = (lambda x: isinstance(x, str) and x.strip() != "", "must be a non-empty string")


def one_of(*values: str) -> Rule:
    return (lambda x: x in values, "must be one of " + ", ".join(repr(v) for v in values))


def rule_field(rule: Rule, default: Any) -> Any:
    return field(default=default, metadata={"rule": rule})


def _field_problems(obj: Any, path: str) -> Iterator[str]:
    for a in attrs.fields(type(obj)):
        value = getattr(obj, a.name)
        where = f"{path}.{a.name}" if path else a.name
        rule = a.metadata.get("rule")
        if rule is not None and not rule[0](value):
            yield f"{where}: {rule[1]} (got {value!r})"
        if attrs.has(type(value)):
            yield from _field_problems(value, where)
    cross = getattr(obj, "_cross_field_problems", None)
    if cross is not None:
        yield from cross(path)


def problems(cfg: Any, path: str = "") -> list[str]:
    """Every rule violation in ``cfg`` (any config class), as ``"<field path>: <rule> (got <value>)"``."""
    return list(_field_problems(cfg, path))


# --------------------------------------------------------------------------------------------
# Program scheduling (the reference router's contract)
# --------------------------------------------------------------------------------------------

ENABLE_KEYS = ("vllm_xargs.agentic_context", "auto")
# las: least attained service of the task first (docs/program-scheduling.md §5.1)
RESUME_ORDERS = ("mru", "fcfs", "las")
MOVE_COSTS = ("context", "resident")  # docs/program-scheduling.md §12.1
# how a per-tool TTL prices holding while Programs wait for capacity (docs/program-scheduling.md §12)
TOOL_CONTENTION_MODES = ("rent", "cap_at_fit", "ignore")
BINDING_STRATEGIES = (
    "consistent_hash",
    "program_round_robin",
    "least_program_count",
    "reasoning_token_balance",
    "cache_aware",
)

# The seven calibration coefficients, in the fixed order the calibration warning lists them.
COEFFICIENT_FIELDS = (
    "prefill_cost_model.intercept_seconds",
    "prefill_cost_model.linear_seconds_per_1k_tokens",
    "prefill_cost_model.quadratic_seconds_per_1k_tokens_squared",
    "prefill_cost_model.decode_throughput_alpha",
    "decode_throughput_model.fixed_step_seconds",
    "decode_throughput_model.batch_step_seconds_per_request",
    "decode_throughput_model.context_step_seconds_per_token",
)


@frozen
class PrefillCostModel:
    """Cold prefill ``p(x) = intercept + linear*x + quadratic*x^2`` with ``x = uncached tokens / 1000``."""

    intercept_seconds: float = rule_field(FINITE_GE_0, 0.06600061907132926)
    linear_seconds_per_1k_tokens: float = rule_field(FINITE_GE_0, 0.05702024012166613)
    quadratic_seconds_per_1k_tokens_squared: float = rule_field(FINITE_GE_0, 0.0044057347937978475)
    decode_throughput_alpha: float = rule_field(UNIT_INTERVAL, 0.15)


@frozen
class DecodeThroughputModel:
    """Aggregate decode throughput ``B / (fixed + per_request*B + per_token*C)``."""

    fixed_step_seconds: float = rule_field(FINITE_GT_0, 0.010635218423115973)
    batch_step_seconds_per_request: float = rule_field(FINITE_GE_0, 0.0004192803698834784)
    context_step_seconds_per_token: float = rule_field(FINITE_GE_0, 1.420458414996201e-7)


@frozen
class ToolRetentionConfig:
    """Tool-call-aware acting TTL (docs/program-scheduling.md §12): agentd's own knobs.

    ``enabled`` false arms every acting TTL from the fitted per-rank Progress-TTL (the reference's
    behaviour).  ``contention`` says how holding is priced while Programs of the model pool wait
    for capacity (holding then also delays them): ``rent`` charges every second held once per
    waiting Program per rank of the pool on top of the holder's own second, ``cap_at_fit`` caps
    the per-tool TTL at the fitted one, ``ignore`` prices it as when nobody waits.
    ``measured_miss`` prices a miss after a key at the Program's cache-miss impact times the
    share of the previous context lost over the gaps after that key (once it has ``min_samples``
    resumes) instead of the cluster-wide resume miss ratio.
    ``finish_reason_keys`` also learns the gaps after turns that called no tool, keyed by their
    finish reason (``<stop>``, ``<length>``).  ``release_when_long`` false falls back to the fitted
    TTL where the per-tool decision is to hold nothing.  ``window_size`` gaps are kept per
    (model pool, tool); ``max_tools`` bounds the (model pool, tool) entries kept (least recently
    used forgotten); a tool decides once it has ``min_samples`` gaps.
    """

    enabled: bool = True
    contention: str = rule_field(one_of(*TOOL_CONTENTION_MODES), "rent")
    measured_miss: bool = False
    finish_reason_keys: bool = True
    release_when_long: bool = True
    window_size: int = rule_field(INT_GT_0, 64)
    min_samples: int = rule_field(INT_GT_0, 8)
    max_tools: int = rule_field(INT_GT_0, 256)
    # a learned gap g is held for g * (1 + margin_ratio) + margin_seconds (the next gap is never the same)
    margin_ratio: float = rule_field(FINITE_GE_0, 0.1)
    margin_seconds: float = rule_field(FINITE_GE_0, 0.02)

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        w, m = self.window_size, self.min_samples
        if isinstance(w, int) and isinstance(m, int) and m > w:
            yield f"{p}min_samples: must not exceed window_size (got min_samples={m!r}, window_size={w!r})"


@frozen
class ProgramSchedulingConfig:
    program_scheduling_enable_key: str = rule_field(one_of(*ENABLE_KEYS), "vllm_xargs.agentic_context")
    binding_only: bool = False
    global_queue: bool = False
    resume_order: str = rule_field(one_of(*RESUME_ORDERS), "mru")
    cross_rank_headroom_ratio: float = rule_field(FINITE_GE_1, 1.2)
    binding_strategy: str = rule_field(one_of(*BINDING_STRATEGIES), "consistent_hash")
    hash_virtual_nodes: int = rule_field(INT_GT_0, 160)
    token_capacity_per_dp_rank: int | None = rule_field(OPTIONAL_INT_GT_0, None)
    max_active_programs_per_target: int = rule_field(INT_GT_0, 64)
    metrics_interval_seconds: float = rule_field(FINITE_GT_0, 1.0)
    admission_waiting_request_threshold: int = rule_field(INT_GE_0, 1)
    queue_timeout_seconds: float = rule_field(FINITE_GT_0, 600.0)
    force_resume_timeout_seconds: float = rule_field(FINITE_GT_0, 300.0)
    paused_retention_ttl_seconds: float = rule_field(FINITE_GT_0, 1800.0)
    # agentd: a bound on idle paused Programs kept for paused_retention_ttl_seconds (0 = none), so a
    # client minting Program ids cannot grow the daemon's memory (docs/program-scheduling.md §1)
    max_idle_paused_programs: int = rule_field(INT_GE_0, 20000)
    shared_prefix_freshness_warmup_seconds: float = rule_field(FINITE_GE_0, 100.0)
    shared_prefix_freshness_kv_turnovers: float = rule_field(FINITE_GT_0, 2.0)
    decode_buffer_tokens: int = rule_field(INT_GE_0, 100)
    max_acting_ttl_seconds: float = rule_field(FINITE_GE_0, 10.0)
    high_watermark_ratio: float = rule_field(UNIT_INTERVAL, 1.0)
    low_watermark_ratio: float = rule_field(UNIT_INTERVAL, 1.0)
    max_segment_rounds: int = rule_field(INT_GT_0, 14)
    stats_window_size: int = rule_field(INT_GT_0, 100)
    enable_batch_gain_admission: bool = True
    cross_rank_move_cost: str = rule_field(one_of(*MOVE_COSTS), "context")
    prefill_cost_model: PrefillCostModel = field(factory=PrefillCostModel)
    decode_throughput_model: DecodeThroughputModel = field(factory=DecodeThroughputModel)
    tool_retention: ToolRetentionConfig = field(factory=ToolRetentionConfig)
    # Dotted paths of the calibration coefficients the user supplied explicitly.  Bookkeeping for
    # the calibration warning only: never read from or written to a file.
    explicit_coefficients: frozenset[str] = field(default=frozenset(), eq=False)
    # Deprecated input aliases the file used (e.g. token_capacity_per_target); for warnings only.
    deprecated_inputs: tuple[str, ...] = field(default=(), eq=False)

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        low, high = self.low_watermark_ratio, self.high_watermark_ratio
        if finite(low) and finite(high):
            if low <= 0:
                rule = "must be > 0 (watermarks must satisfy 0 < low <= high <= 1)"
                yield f"{p}low_watermark_ratio: {rule} (got {low!r})"
            if high < low:
                yield (
                    f"{p}high_watermark_ratio: must be >= low_watermark_ratio "
                    f"(got high_watermark_ratio={high!r}, low_watermark_ratio={low!r})"
                )
        force, queue = self.force_resume_timeout_seconds, self.queue_timeout_seconds
        if finite(force) and finite(queue) and force > queue:
            yield (
                f"{p}force_resume_timeout_seconds: must not exceed queue_timeout_seconds "
                f"(got force_resume_timeout_seconds={force!r}, queue_timeout_seconds={queue!r})"
            )
        if self.binding_strategy == "reasoning_token_balance" and self.token_capacity_per_dp_rank is None:
            yield (
                f"{p}binding_strategy: reasoning_token_balance requires token_capacity_per_dp_rank "
                f"(got token_capacity_per_dp_rank=None)"
            )

    def defaulted_coefficients(self) -> tuple[str, ...]:
        """The calibration coefficients left at their defaults, in the warning's fixed order."""
        return tuple(f for f in COEFFICIENT_FIELDS if f not in self.explicit_coefficients)


@frozen
class BackendTarget:
    """One concrete DP rank behind one worker URL; ``target_id`` is ``"<url>@<rank>"``, or the URL
    alone when the worker has one DP target (``ranked`` false: ``dp_rank`` 0 picks its engine's
    metrics, diagnostics show ``dp_rank`` null; docs/operations.md §13.10)."""

    worker_url: str
    dp_rank: int
    target_id: str
    index: int
    ranked: bool = True

    @property
    def shown_dp_rank(self) -> int | None:
        """The ``dp_rank`` diagnostics, the dashboard and ``/scheduling/diagnostics`` show."""
        return self.dp_rank if self.ranked else None


# --------------------------------------------------------------------------------------------
# Batch jobs (the seed-002 scheduler's parameters; docs/batch.md §1, docs/config.md)
# --------------------------------------------------------------------------------------------


@frozen
class BatchJobsConfig:
    """The seed's ``batch_job_sched_config`` (same names, defaults and rules: ``enabled`` to
    ``short_decode_token_threshold``) plus agentd's own five (``block_size_tokens`` on).

    ``max_jobs`` bounds the jobs whose decode statistics are kept (0 = no bound; the least
    recently used job's are evicted, docs/batch.md §1.2).  ``block_size_tokens`` is the KV block
    size the router reasons in; ``max_wait_seconds`` bounds how long a batch request may wait.
    """

    enabled: bool = False
    max_jobs: int = rule_field(INT_GE_0, 20)
    reserve_margin_blocks: int = rule_field(INT_GE_0, 2)
    reserve_max_blocks: int = rule_field(INT_GT_0, 8)
    low_available_tokens_threshold: int = rule_field(INT_GT_0, 4096)
    short_decode_token_threshold: int = rule_field(INT_GT_0, 32)
    block_size_tokens: int = rule_field(INT_GT_0, 16)
    max_wait_seconds: float = rule_field(FINITE_GT_0, 30.0)
    # share of each rank's KV capacity batch keeps while Programs wait there (docs/batch.md §2.2)
    guaranteed_kv_share: float = rule_field(UNIT_INTERVAL, 0.25)
    # how much batch requests may slow the decode steps of the Programs on the same rank (the
    # seed's decode cost model; 1.0 = steps up to twice as long; docs/batch.md §2.3)
    max_decode_slowdown: float = rule_field(FINITE_GE_0, 1.0)
    # batch dispatch to a rank stops while its engine's waiting requests (fresh observation) plus
    # the batch requests sent there since that observation reach this many; 0 = no gate
    # (docs/batch.md §2.2)
    engine_queue_requests: int = rule_field(INT_GE_0, 48)


# --------------------------------------------------------------------------------------------
# Priorities, classes and tenant fairness (docs/priority.md §1-§4)
# --------------------------------------------------------------------------------------------

CLASS_NAMES = ("interactive", "agent", "batch")
DEFAULT_CLASS_ORDER = ("interactive", "agent", "batch")


def _class_order_ok(x: Any) -> bool:
    if not isinstance(x, (tuple, list)) or sorted(x) != sorted(CLASS_NAMES):
        return False
    order = list(x)
    return order.index("agent") < order.index("batch")


CLASS_ORDER: Rule = (
    _class_order_ok,
    "must list 'interactive', 'agent' and 'batch' once each, 'agent' before 'batch' (batch is the filler class)",
)
OPTIONAL_SHARE: Rule = (lambda x: finite(x) and 0 < x <= 1, "must be finite and within (0, 1]")


def _weights_ok(x: Any) -> bool:
    return isinstance(x, dict) and all(isinstance(k, str) and k and FINITE_GT_0[0](v) for k, v in x.items())


TENANT_WEIGHTS: Rule = (_weights_ok, "must map non-empty tenant names to finite weights > 0")


@frozen
class ClassLimits:
    """Per-rank caps of one request class (docs/priority.md §2).

    ``max_running_per_rank``: requests of the class running on one rank at once (for ``agent``:
    active Programs); ``None`` = no cap beyond the scheduler's own.  ``max_kv_share``: share of the
    rank's token capacity the class may hold (1.0 = no cap).  A force-resume deadline overrides the
    ``agent`` caps, as it overrides the Program-count guard (starvation bound, docs/priority.md §4).
    """

    max_running_per_rank: int | None = rule_field(OPTIONAL_INT_GT_0, None)
    max_kv_share: float = rule_field(OPTIONAL_SHARE, 1.0)


@frozen
class PriorityConfig:
    """Class bands, per-class caps and the tenant fairness counter (docs/priority.md §1-§4).

    The defaults keep single-tenant, priority-0 decisions identical to the scheduler without them.

    * ``class_order``: strict bands, first = served first (``agent`` must precede ``batch``);
    * ``interactive`` / ``agent`` / ``batch``: per-class caps (:class:`ClassLimits`);
    * ``interactive_preempts_batch``: an interactive request that does not fit preempts
      restartable batch requests on its rank; ``interactive_pauses_agents``: it pauses idle
      (acting) lower Programs there and marks busy ones to pause when idle;
    * ``fairness``: ``"vtc"`` orders equal-priority work of different tenants by their virtual
      token counters, ``"off"`` ignores tenants;
    * ``tenant_weights`` (tenant -> weight, default ``default_tenant_weight``): a tenant of weight
      w is charged ``cost / w``, so backlogged tenants get service in proportion to their weights;
    * ``vtc_input_token_weight``, ``vtc_output_token_weight``: cost of one prompt token computed
      and one output token; ``vtc_kv_token_second_weight``: rent of one token of KV held for one
      second by an idle (acting) Program;
    * ``batch_max_running_near_interactive``: while an interactive request arrived less than
      ``interactive_window_seconds`` ago, the batch class runs at most this many requests per rank
      (on top of ``batch.max_running_per_rank``), so the engines keep room for the next
      interactive request (docs/priority.md §2, "Headroom for interactive"); ``None`` = no such cap;
    * ``interactive_reserved_ranks``: while a model pool's latest interactive request arrived less
      than ``interactive_window_seconds`` ago, this many of the pool's ranks (never all of them)
      run no batch work, interactive requests go to ranks running the fewest batch requests first,
      and the pool's other ranks run batch without ``batch_max_running_near_interactive``
      (docs/priority.md §2, "Ranks reserved for interactive"); 0 = off;
    * ``tenant_pause_share``: the first waiting Program of a tenant may pause idle (acting)
      Programs of tenants holding more than their weighted fair share of its rank's capacity
      (docs/priority.md §3, "Pausing for fairness"); off by default;
    * ``heavy_tenant_max_active_per_rank``: on a rank shared with a light tenant, a heavy tenant
      (one demanding more than its weighted fair share of the model pool) keeps at most this many
      Programs active; the excess is paused (docs/priority.md §3, "Isolating light tenants");
      ``None`` = off; ``tenant_isolation_window_seconds``: how long a rank stays shared with a
      light tenant after the tenant was last present on it; ``tenant_isolation_tool_call_seconds``:
      a Program between turns (its request ended in a tool call or any end but a natural stop,
      and it expects to resume) keeps its tenant present on its rank, and its context in its
      tenant's demand, until it sends its next request, for at most this long (0 = not at all);
    * ``long_prefill_seconds``: a Program whose next request's uncached prefill is estimated
      longer than this is not admitted on a rank where another such prefill is in flight (one
      long prefill at a time per rank, docs/priority.md §3); 0 = off;
    * ``requeue_long_prefills``: such a long prefill of a heavy tenant, on a rank kept for a light
      tenant whose request is in flight or waiting there, is taken back before its first token
      (the shell aborts it upstream and it waits in the queue again, once per request;
      docs/priority.md §3, "Re-queueing a blocking long prefill"); needs ``long_prefill_seconds``
      and ``heavy_tenant_max_active_per_rank``; off by default.
    """

    class_order: tuple[str, ...] = rule_field(CLASS_ORDER, DEFAULT_CLASS_ORDER)
    interactive: ClassLimits = field(factory=ClassLimits)
    agent: ClassLimits = field(factory=ClassLimits)
    batch: ClassLimits = field(factory=ClassLimits)
    interactive_preempts_batch: bool = True
    interactive_pauses_agents: bool = True
    fairness: str = rule_field(one_of("vtc", "off"), "vtc")
    tenant_weights: dict[str, float] = field(factory=dict, hash=False, metadata={"rule": TENANT_WEIGHTS})
    default_tenant_weight: float = rule_field(FINITE_GT_0, 1.0)
    vtc_input_token_weight: float = rule_field(FINITE_GE_0, 1.0)
    vtc_output_token_weight: float = rule_field(FINITE_GE_0, 2.0)
    vtc_kv_token_second_weight: float = rule_field(FINITE_GE_0, 0.001)
    batch_max_running_near_interactive: int | None = rule_field(OPTIONAL_INT_GT_0, None)
    interactive_window_seconds: float = rule_field(FINITE_GT_0, 10.0)
    interactive_reserved_ranks: int = rule_field(INT_GE_0, 0)
    tenant_pause_share: bool = False
    heavy_tenant_max_active_per_rank: int | None = rule_field(OPTIONAL_INT_GE_0, None)
    tenant_isolation_window_seconds: float = rule_field(FINITE_GE_0, 3.0)
    tenant_isolation_tool_call_seconds: float = rule_field(FINITE_GE_0, 0.0)
    long_prefill_seconds: float = rule_field(FINITE_GE_0, 0.0)
    requeue_long_prefills: bool = False

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        if self.requeue_long_prefills is True:
            missing = []
            if not (finite(self.long_prefill_seconds) and self.long_prefill_seconds > 0):
                missing.append(f"long_prefill_seconds > 0 (got {self.long_prefill_seconds!r})")
            if self.heavy_tenant_max_active_per_rank is None:
                missing.append("heavy_tenant_max_active_per_rank set (got None)")
            if missing:
                yield f"{p}requeue_long_prefills: needs {' and '.join(missing)} (got True)"
        elif self.requeue_long_prefills is not False:
            yield f"{p}requeue_long_prefills: must be true or false (got {self.requeue_long_prefills!r})"
        weights = (self.vtc_input_token_weight, self.vtc_output_token_weight, self.vtc_kv_token_second_weight)
        if self.fairness == "vtc" and all(isinstance(w, int | float) and w == 0 for w in weights):
            # every counter would stay 0: fairness on in name only (docs/priority.md §3)
            yield (
                f"{p}vtc_input_token_weight, vtc_output_token_weight, vtc_kv_token_second_weight: must not all be 0 "
                'with fairness = "vtc" (every tenant counter would stay 0); set fairness = "off" to turn it off '
                "(got 0, 0, 0)"
            )

    def weight(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, self.default_tenant_weight)

    def class_rank(self, request_class: str) -> int:
        return self.class_order.index(request_class)

    def limits(self, request_class: str) -> ClassLimits:
        limits: ClassLimits = getattr(self, request_class)
        return limits


DEFAULT_PRIORITY = PriorityConfig()
