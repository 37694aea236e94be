"""The frozen configuration tree of agentd.

Every class is an ``attrs.frozen`` value with defaults, so tests can build configs directly
(``ProgramSchedulingConfig(token_capacity_per_dp_rank=1000)``).  Construction does not validate:
``daemon.config_loading.load_config`` structures a file, applies CLI overrides and then calls
:func:`problems` on the whole tree so that *every* problem is reported at once, each naming the
field, the rule and the value.

Field rules are declared next to the field (``rule=...`` in the attrs metadata) and cross-field
rules live in ``_cross_field_problems`` methods.  The ``program_scheduling`` section mirrors the
reference router's ``ProgramSchedulingConfig`` field for field (names, defaults, constraints), so
operators can carry their JSON over unchanged.
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


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


FINITE_GT_0: Rule = (lambda x: _finite(x) and x > 0, "must be finite and > 0")
FINITE_GE_0: Rule = (lambda x: _finite(x) and x >= 0, "must be finite and >= 0")
FINITE_GE_1: Rule = (lambda x: _finite(x) and x >= 1, "must be finite and >= 1")
UNIT_INTERVAL: Rule = (lambda x: _finite(x) and 0 <= x <= 1, "must be finite and within [0, 1]")
INT_GT_0: Rule = (lambda x: isinstance(x, int) and x > 0, "must be an integer > 0")
INT_GE_0: Rule = (lambda x: isinstance(x, int) and x >= 0, "must be an integer >= 0")
PORT: Rule = (lambda x: isinstance(x, int) and 0 <= x <= 65535, "must be a port number within [0, 65535]")
OPTIONAL_INT_GT_0: Rule = (lambda x: x is None or (isinstance(x, int) and x > 0), "must be null or an integer > 0")
OPTIONAL_PORT: Rule = (lambda x: x is None or PORT[0](x), "must be null or a port number within [0, 65535]")
NON_EMPTY: Rule = (lambda x: isinstance(x, str) and x.strip() != "", "must be a non-empty string")


def one_of(*values: str) -> Rule:
    return (lambda x: x in values, "must be one of " + ", ".join(repr(v) for v in values))


def _rule(rule: Rule, default: Any) -> Any:
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
RESUME_ORDERS = ("mru", "fcfs")
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

    intercept_seconds: float = _rule(FINITE_GE_0, 0.06600061907132926)
    linear_seconds_per_1k_tokens: float = _rule(FINITE_GE_0, 0.05702024012166613)
    quadratic_seconds_per_1k_tokens_squared: float = _rule(FINITE_GE_0, 0.0044057347937978475)
    decode_throughput_alpha: float = _rule(UNIT_INTERVAL, 0.15)


@frozen
class DecodeThroughputModel:
    """Aggregate decode throughput ``B / (fixed + per_request*B + per_token*C)``."""

    fixed_step_seconds: float = _rule(FINITE_GT_0, 0.010635218423115973)
    batch_step_seconds_per_request: float = _rule(FINITE_GE_0, 0.0004192803698834784)
    context_step_seconds_per_token: float = _rule(FINITE_GE_0, 1.420458414996201e-7)


@frozen
class ProgramSchedulingConfig:
    program_scheduling_enable_key: str = _rule(one_of(*ENABLE_KEYS), "vllm_xargs.agentic_context")
    binding_only: bool = False
    global_queue: bool = False
    resume_order: str = _rule(one_of(*RESUME_ORDERS), "mru")
    cross_rank_headroom_ratio: float = _rule(FINITE_GE_1, 1.2)
    binding_strategy: str = _rule(one_of(*BINDING_STRATEGIES), "consistent_hash")
    hash_virtual_nodes: int = _rule(INT_GT_0, 160)
    token_capacity_per_dp_rank: int | None = _rule(OPTIONAL_INT_GT_0, None)
    max_active_programs_per_target: int = _rule(INT_GT_0, 64)
    metrics_interval_seconds: float = _rule(FINITE_GT_0, 1.0)
    admission_waiting_request_threshold: int = _rule(INT_GE_0, 1)
    queue_timeout_seconds: float = _rule(FINITE_GT_0, 600.0)
    force_resume_timeout_seconds: float = _rule(FINITE_GT_0, 300.0)
    paused_retention_ttl_seconds: float = _rule(FINITE_GT_0, 1800.0)
    shared_prefix_freshness_warmup_seconds: float = _rule(FINITE_GE_0, 100.0)
    shared_prefix_freshness_kv_turnovers: float = _rule(FINITE_GT_0, 2.0)
    decode_buffer_tokens: int = _rule(INT_GE_0, 100)
    max_acting_ttl_seconds: float = _rule(FINITE_GE_0, 10.0)
    high_watermark_ratio: float = _rule(UNIT_INTERVAL, 1.0)
    low_watermark_ratio: float = _rule(UNIT_INTERVAL, 1.0)
    max_segment_rounds: int = _rule(INT_GT_0, 14)
    stats_window_size: int = _rule(INT_GT_0, 100)
    enable_batch_gain_admission: bool = True
    prefill_cost_model: PrefillCostModel = field(factory=PrefillCostModel)
    decode_throughput_model: DecodeThroughputModel = field(factory=DecodeThroughputModel)
    # Dotted paths of the calibration coefficients the user supplied explicitly.  Bookkeeping for
    # the calibration warning only: never read from or written to a file.
    explicit_coefficients: frozenset[str] = field(default=frozenset(), eq=False)
    # Deprecated input aliases the file used (e.g. token_capacity_per_target); for warnings only.
    deprecated_inputs: tuple[str, ...] = field(default=(), eq=False)

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        low, high = self.low_watermark_ratio, self.high_watermark_ratio
        if _finite(low) and _finite(high):
            if low <= 0:
                yield f"{p}low_watermark_ratio: must be > 0 (watermarks must satisfy 0 < low <= high <= 1) (got {low!r})"
            if high < low:
                yield (
                    f"{p}high_watermark_ratio: must be >= low_watermark_ratio "
                    f"(got high_watermark_ratio={high!r}, low_watermark_ratio={low!r})"
                )
        force, queue = self.force_resume_timeout_seconds, self.queue_timeout_seconds
        if _finite(force) and _finite(queue) and force > queue:
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


# --------------------------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------------------------

NATIVE_POLICIES = ("round_robin", "random", "power_of_two", "consistent_hash")
AGENTIC_CONTEXT_FORWARDING = ("strip", "json_string", "unchanged")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("kv", "json")


@frozen
class BackendTarget:
    """One concrete DP rank behind one worker URL; ``target_id`` is ``"<url>@<rank>"``."""

    worker_url: str
    dp_rank: int
    target_id: str
    index: int


@frozen
class ServerConfig:
    host: str = _rule(NON_EMPTY, "127.0.0.1")
    port: int = _rule(PORT, 3001)
    max_body_bytes: int = _rule(INT_GT_0, 16 * 1024 * 1024)
    shutdown_grace_seconds: float = _rule(FINITE_GE_0, 30.0)
    log_level: str = _rule(one_of(*LOG_LEVELS), "info")
    log_format: str = _rule(one_of(*LOG_FORMATS), "kv")


def _valid_url(u: Any) -> bool:
    return isinstance(u, str) and (u.startswith("http://") or u.startswith("https://")) and len(u) > 8


@frozen
class RoutingConfig:
    worker_urls: tuple[str, ...] = field(
        default=(),
        converter=tuple,
        metadata={"rule": (lambda xs: all(_valid_url(u) for u in xs), "must be http:// or https:// URLs")},
    )
    intra_node_data_parallel_size: int = _rule(INT_GT_0, 1)
    policy: str = _rule(one_of(*NATIVE_POLICIES), "consistent_hash")
    health_check_interval_seconds: float = _rule(FINITE_GT_0, 5.0)
    health_check_timeout_seconds: float = _rule(FINITE_GT_0, 2.0)
    request_timeout_seconds: float = _rule(FINITE_GT_0, 600.0)
    connect_timeout_seconds: float = _rule(FINITE_GT_0, 5.0)
    agentic_context_forwarding: str = _rule(one_of(*AGENTIC_CONTEXT_FORWARDING), "strip")

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        seen: set[str] = set()
        for url in self.worker_urls:
            norm = url.rstrip("/") if isinstance(url, str) else url
            if norm in seen:
                yield f"{p}worker_urls: must not repeat a URL (got {url!r} twice)"
            seen.add(norm)


@frozen
class PrometheusConfig:
    """An extra listener serving only ``/metrics`` (the reference's ``--prometheus-host/port``)."""

    host: str | None = None
    port: int | None = _rule(OPTIONAL_PORT, None)

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        if self.host is not None and self.port is None:
            yield f"{p}port: must be set when {p}host is set (got None)"


@frozen
class EmbeddedConfig:
    """In-process simulated vLLM ranks, used when ``routing.worker_urls`` is empty."""

    num_workers: int = _rule(INT_GT_0, 1)
    dp_size: int = _rule(INT_GT_0, 2)
    num_gpu_blocks: int = _rule(INT_GT_0, 4096)
    block_size: int = _rule(INT_GT_0, 16)
    max_num_seqs: int = _rule(INT_GT_0, 256)
    max_num_batched_tokens: int = _rule(INT_GT_0, 8192)
    time_scale: float = _rule(FINITE_GT_0, 1.0)
    model: str = _rule(NON_EMPTY, "agentd-sim")
    scheduling_policy: str = _rule(one_of("fcfs", "priority"), "fcfs")
    seed: int = _rule(INT_GE_0, 0)


EMBEDDED_WORKER_URL = "http://embedded-sim"


@frozen
class AgentdConfig:
    server: ServerConfig = field(factory=ServerConfig)
    routing: RoutingConfig = field(factory=RoutingConfig)
    prometheus: PrometheusConfig = field(factory=PrometheusConfig)
    embedded: EmbeddedConfig = field(factory=EmbeddedConfig)
    enable_program_scheduling: bool = False
    program_scheduling: ProgramSchedulingConfig | None = None

    @property
    def embedded_mode(self) -> bool:
        return not self.routing.worker_urls

    def worker_urls(self) -> tuple[str, ...]:
        """The worker URLs requests go to (the embedded simulated workers in embedded mode)."""
        if self.embedded_mode:
            n = self.embedded.num_workers
            return (EMBEDDED_WORKER_URL,) if n == 1 else tuple(f"{EMBEDDED_WORKER_URL}-{i}" for i in range(n))
        return tuple(u.rstrip("/") for u in self.routing.worker_urls)

    def dp_size(self) -> int:
        return self.embedded.dp_size if self.embedded_mode else self.routing.intra_node_data_parallel_size

    def targets(self) -> tuple[BackendTarget, ...]:
        """Worker URLs x DP ranks, worker-major, with a stable index used as an ordering key."""
        out: list[BackendTarget] = []
        for url in self.worker_urls():
            for rank in range(self.dp_size()):
                out.append(BackendTarget(url, rank, f"{url}@{rank}", len(out)))
        return tuple(out)

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        if self.enable_program_scheduling and self.program_scheduling is None:
            yield "program_scheduling: must be present when enable_program_scheduling is true (got None)"
        if self.prometheus.port is not None and self.prometheus.port == self.server.port != 0:
            yield (
                f"prometheus.port: must differ from server.port "
                f"(got prometheus.port={self.prometheus.port!r}, server.port={self.server.port!r})"
            )
        if not self.enable_program_scheduling and self.program_scheduling is not None:
            yield (
                "program_scheduling: given without enable_program_scheduling = true "
                "(program_scheduling_config_json requires enable_program_scheduling)"
            )
