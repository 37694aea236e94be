"""The frozen configuration tree of the daemon.

The Program-scheduling section, its cost models, the field rules and ``problems`` live in the pure
core (``actors.core.config``), which reads them; this module adds the daemon's own sections.  Every
class is an ``attrs.frozen`` value with defaults, so tests can build configs directly
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

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx
from attrs import field, frozen

from actors.core.config import (
    FINITE_GE_0,
    FINITE_GT_0,
    INT_GE_0,
    INT_GT_0,
    NON_EMPTY,
    OPTIONAL_PORT,
    PORT,
    BackendTarget,
    BatchJobsConfig,
    ProgramSchedulingConfig,
    one_of,
    problems,
    rule_field,
)
from actors.core.config import PriorityConfig as CorePriorityConfig
from daemon.hostnames import ANY_HOST, allowed_hosts_problem
from daemon.redact import redact_url
from sim.config import MAX_SIM_RANKS, SimServerShape, own_fields_first

# --------------------------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------------------------

NATIVE_POLICIES = ("round_robin", "random", "power_of_two", "consistent_hash")
AGENTIC_CONTEXT_FORWARDING = ("strip", "json_string", "unchanged")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# The reference router's --prometheus-host default (docs/operations.md §13.10)
PROMETHEUS_DEFAULT_HOST = "127.0.0.1"
LOG_FORMATS = ("kv", "json")


# relay processes one daemon may run: each is a Python process of its own (tens of MB), and the one
# scheduler process handles every relay's admissions; a million was a fork bomb that check-config
# passed (docs/config.md [server])
MAX_DATA_PLANE_PROCESSES = 64
HTTP1_IMPLEMENTATIONS = ("agentd", "hypercorn")
# overrides [server] http1_implementation when set (the test suite runs its socket tests on both)
HTTP1_ENV = "AGENTD_HTTP1_IMPLEMENTATION"


def _optional(rule: tuple[Any, str]) -> tuple[Any, str]:
    return (lambda x: x is None or rule[0](x), f"must be null or {rule[1].removeprefix('must be ')}")


@frozen
class ServerConfig:
    host: str = rule_field(NON_EMPTY, "127.0.0.1")
    port: int = rule_field(PORT, 3001)
    max_body_bytes: int = rule_field(INT_GT_0, 16 * 1024 * 1024)
    shutdown_grace_seconds: float = rule_field(FINITE_GE_0, 30.0)
    log_level: str = rule_field(one_of(*LOG_LEVELS), "info")
    log_format: str = rule_field(one_of(*LOG_FORMATS), "kv")
    # relay processes of the data plane (docs/operations.md §13): 1 = one process (the scheduler
    # serves HTTP itself); N > 1 = N relay processes on the port and one scheduler process;
    # 0 = auto (the number of cores, at most MAX_AUTO_DATA_PLANE_PROCESSES)
    data_plane_processes: int = rule_field(
        (
            lambda x: isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_DATA_PLANE_PROCESSES,
            f"must be an integer within [0, {MAX_DATA_PLANE_PROCESSES}]",
        ),
        1,
    )
    # hold the writes of one stream up to this many ms (0: every event at once; docs/operations.md
    # §13.5); never the first token, never the end of the stream
    stream_coalesce_ms: float = rule_field(
        (lambda x: isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x <= 1000, "must be in [0, 1000]"),
        0.0,
    )
    # the HTTP/1.1 protocol inside hypercorn's connection handling (docs/operations.md §13.7):
    # agentd's own (daemon/http/h1proto.py) or hypercorn's h11-based one
    http1_implementation: str = rule_field(one_of(*HTTP1_IMPLEMENTATIONS), "agentd")
    # Host names the listeners answer besides IP addresses and localhost (docs/operations.md §10.7):
    # a listener on loopback refuses every other name (DNS rebinding), one bound elsewhere checks only
    # when this lists some; ".example.com" names a domain and everything under it, ["*"] any name
    allowed_hosts: tuple[str, ...] = field(default=(), converter=tuple)

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        for entry in self.allowed_hosts:
            problem = allowed_hosts_problem(entry)
            if problem is not None:
                yield f"{p}allowed_hosts: {problem} (got {entry!r})"
        if ANY_HOST in self.allowed_hosts and len(self.allowed_hosts) > 1:
            entries = list(self.allowed_hosts)
            yield f'{p}allowed_hosts: "*" answers every name and must be the only entry (got {entries!r})'


def _finite_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _valid_url(u: Any) -> bool:
    return isinstance(u, str) and (u.startswith("http://") or u.startswith("https://")) and len(u) > 8


def _worker_url_problem(url: str) -> str | None:
    """Why an http(s) worker URL cannot be used, or None: it is parsed as the upstream client parses
    it.  ``http://w:abc`` and ``http://[::1`` passed check-config and ``agentd start`` ended in a
    traceback (exit 1) at its first health check; ``http://:80`` (no host), ``http://w:99999`` and a
    space in the host ran with a worker that could never be reached (docs/config.md [routing])."""
    if any(ch.isspace() for ch in url):
        return "must not contain whitespace"
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"is not a valid URL ({exc})"
    if not parsed.host:
        return "must name a host"
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        return "must have a port within [1, 65535]"
    return None


# Targets (worker URLs x DP ranks) one agentd schedules, as many as the simulator holds ranks
MAX_TARGETS = MAX_SIM_RANKS


@frozen
class RoutingConfig:
    # each URL must be http:// or https:// (checked per URL in _cross_field_problems: the error
    # names the offending URLs, not the whole list)
    worker_urls: tuple[str, ...] = field(default=(), converter=tuple)
    intra_node_data_parallel_size: int = rule_field(INT_GT_0, 1)
    policy: str = rule_field(one_of(*NATIVE_POLICIES), "consistent_hash")
    health_check_interval_seconds: float = rule_field(FINITE_GT_0, 5.0)
    health_check_timeout_seconds: float = rule_field(FINITE_GT_0, 2.0)
    request_timeout_seconds: float = rule_field(FINITE_GT_0, 600.0)
    connect_timeout_seconds: float = rule_field(FINITE_GT_0, 5.0)
    # docs/operations.md §11: upstream timeouts, keep-alive, health thresholds, outlier ejection
    first_byte_timeout_seconds: float = rule_field(FINITE_GT_0, 60.0)
    stream_idle_timeout_seconds: float = rule_field(FINITE_GT_0, 60.0)
    keepalive_expiry_seconds: float = rule_field(FINITE_GT_0, 4.0)
    health_failures_to_eject: int = rule_field(INT_GT_0, 3)
    health_successes_to_restore: int = rule_field(INT_GT_0, 2)
    outlier_consecutive_failures: int = rule_field(INT_GT_0, 5)
    agentic_context_forwarding: str = rule_field(one_of(*AGENTIC_CONTEXT_FORWARDING), "strip")
    # the workers run vLLM with --enable-force-include-usage: every stream ends with its usage chunk,
    # so agentd neither asks for it nor filters it out (docs/config.md, docs/operations.md §12)
    workers_force_include_usage: bool = False
    # worker URL -> the model ids it serves (overrides /v1/models discovery: daemon/models.py)
    served_models: dict[str, tuple[str, ...]] = field(
        factory=dict,
        metadata={
            "rule": (
                lambda m: (
                    isinstance(m, dict)
                    and all(
                        isinstance(v, tuple | list) and v and all(isinstance(x, str) and x for x in v)
                        for v in m.values()
                    )
                ),
                "must map worker URLs to non-empty lists of model ids",
            )
        },
    )

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        seen: set[str] = set()
        for url in self.worker_urls:
            norm = url.rstrip("/") if isinstance(url, str) else url
            if norm in seen:
                yield f"{p}worker_urls: must not repeat a URL (got {url!r} twice)"
            seen.add(norm)
            if not _valid_url(url):
                yield f"{p}worker_urls: must be http:// or https:// URLs (got {url!r})"
            unusable = _worker_url_problem(url) if _valid_url(url) else None
            if unusable is not None:
                yield f"{p}worker_urls: {unusable} (got {url!r})"
            if isinstance(norm, str) and norm.endswith("/v1"):
                # an OpenAI client's base URL: agentd adds /v1/... and /health itself, so every
                # health check got a 404 and the worker never entered rotation
                yield (
                    f"{p}worker_urls: must be the worker's root URL, without the OpenAI API's /v1 "
                    f"(got {url!r}; use {norm[: -len('/v1')]!r})"
                )
        for url in self.served_models if isinstance(self.served_models, dict) else ():
            if url.rstrip("/") not in seen:
                yield f"{p}served_models: names a worker that is not in worker_urls (got {url!r})"
        size = self.intra_node_data_parallel_size
        if isinstance(size, int) and size > 0 and len(self.worker_urls) * size > MAX_TARGETS:
            # each target is scheduler state, metric series and hash-ring points: 100000000 grew
            # agentd start by gigabytes before it listened
            yield (
                f"{p}intra_node_data_parallel_size: worker_urls x intra_node_data_parallel_size must be at most "
                f"{MAX_TARGETS} targets (got {len(self.worker_urls)} x {size})"
            )
        total = self.request_timeout_seconds
        for name in ("first_byte_timeout_seconds", "stream_idle_timeout_seconds"):
            value = getattr(self, name)
            if _finite_number(value) and _finite_number(total) and value > total:
                yield f"{p}{name}: must be <= request_timeout_seconds ({total!r}) (got {value!r})"


@frozen
class PrometheusConfig:
    """An extra listener serving only ``/metrics`` (the reference's ``--prometheus-host/port``)."""

    # "" bound every interface (0.0.0.0), where server.host and admin.host refuse it: the metrics
    # listener then served anyone on the network (docs/config.md [prometheus])
    host: str | None = rule_field(_optional(NON_EMPTY), None)
    port: int | None = rule_field(OPTIONAL_PORT, None)

    @property
    def bind_host(self) -> str:
        """``host``, else 127.0.0.1 as the reference's ``--prometheus-host`` default: never the public
        ``server.host`` (docs/operations.md §13.10)."""
        return self.host if self.host is not None else PROMETHEUS_DEFAULT_HOST

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        if self.host is not None and self.port is None:
            yield f"{p}port: must be set when {p}host is set (got None)"


@frozen(field_transformer=own_fields_first)
class EmbeddedConfig(SimServerShape):
    """In-process simulated vLLM ranks, used when ``routing.worker_urls`` is empty: ``num_workers``
    servers of one shape (``sim.config.SimServerShape``: its fields, defaults and rules are this
    section's other keys)."""

    num_workers: int = rule_field(INT_GT_0, 1)

    def servers_in_process(self) -> tuple[str, int] | None:
        return ("num_workers", self.num_workers)


EMBEDDED_WORKER_URL = "http://embedded-sim"


@frozen
class ClientHintsConfig:
    """Operator caps on the scheduling hints a client sends in ``agentic_context`` (issue 14 §6):
    the edge clamps them before the core sees them (docs/config.md ``[client_hints]``)."""

    # a smaller deadline_seconds is raised to this, so 0 cannot jump a Program to force-resume
    min_deadline_seconds: float = rule_field(FINITE_GE_0, 1.0)
    # a larger kv_retention_ttl_seconds is lowered to this (the hint otherwise bypasses the TTL fit)
    max_kv_retention_ttl_seconds: float = rule_field(FINITE_GE_0, 120.0)


# --------------------------------------------------------------------------------------------
# Limits, authentication, the admin listener, TLS to workers (docs/operations.md §10)
# --------------------------------------------------------------------------------------------

OPTIONAL_FINITE_GT_0 = (
    lambda x: x is None or (isinstance(x, int | float) and not isinstance(x, bool) and 0 < x < float("inf")),
    "must be null or finite and > 0",
)


@frozen
class LimitsConfig:
    """Caps and client-side timeouts of the public listener (docs/config.md ``[limits]``)."""

    # open client connections; one over the cap gets a JSON 503 + Retry-After and is closed
    max_connections: int = rule_field(INT_GT_0, 8192)
    # open connections from one client address; one more gets a JSON 429 + Retry-After and is
    # closed (0: no cap; per relay process with relays; docs/operations.md §10.3)
    max_connections_per_client: int = rule_field(INT_GE_0, 0)
    # agent-facing requests agentd works on at once (waiting in a scheduler queue counts)
    max_in_flight_requests: int = rule_field(INT_GT_0, 4096)
    # requests waiting at the edge for one of those slots; one more gets a JSON 429 + Retry-After
    max_queued_requests: int = rule_field(INT_GE_0, 4096)
    # a request waiting longer than this for a slot gets a JSON 503 + Retry-After
    queue_timeout_seconds: float = rule_field(FINITE_GT_0, 60.0)
    # the whole request body must arrive within this; else a JSON 408
    body_read_timeout_seconds: float = rule_field(FINITE_GT_0, 30.0)
    # one write to a client that does not read for this long closes its connection (lease released)
    client_write_timeout_seconds: float = rule_field(FINITE_GT_0, 60.0)
    # a streaming request with no response yet gets ``: keep-alive`` SSE comments this often; null = off
    sse_keepalive_seconds: float | None = rule_field(OPTIONAL_FINITE_GT_0, None)
    # the Retry-After of agentd's own 429/503 answers (caps, draining)
    retry_after_seconds: int = rule_field(INT_GT_0, 1)
    # bytes of request bodies over 1 MiB held at once per process, from their parse to the
    # request's end (a parsed body takes up to ~20x its size); over it a request waits up to
    # queue_timeout_seconds, then a JSON 503 queue_timeout (docs/operations.md §14)
    max_large_body_bytes_in_flight: int = rule_field(INT_GT_0, 32 * 1024 * 1024)


TENANT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _is_sha256_hex(x: Any) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x.lower())


def valid_key_entry(x: Any) -> bool:
    """``"<tenant>:<sha256 hex of the key>"`` with a tenant of ``[A-Za-z0-9_.-]``, 1-64 chars."""
    if not isinstance(x, str) or ":" not in x:
        return False
    tenant, digest = x.rsplit(":", 1)
    return 0 < len(tenant) <= 64 and set(tenant) <= TENANT_CHARS and _is_sha256_hex(digest)


@frozen
class AuthConfig:
    """API keys (docs/operations.md §10).  No key configured = no authentication (local use)."""

    api_keys: tuple[str, ...] = field(
        default=(),
        converter=tuple,
        metadata={
            "rule": (
                lambda xs: all(valid_key_entry(x) for x in xs),
                'must be "<tenant>:<sha256 hex of the key>" entries (tenant of A-Z a-z 0-9 _ . -)',
            )
        },
    )
    # a file of such entries, one per line ("#" comments); read at start
    api_keys_file: str = ""
    admin_keys: tuple[str, ...] = field(
        default=(),
        converter=tuple,
        metadata={"rule": (lambda xs: all(_is_sha256_hex(x) for x in xs), "must be sha256 hex digests of keys")},
    )

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys or self.api_keys_file)


@frozen
class AdminConfig:
    """A separate listener for the admin routes (diagnostics, metrics, dashboard)."""

    host: str = rule_field(NON_EMPTY, "127.0.0.1")
    port: int | None = rule_field(OPTIONAL_PORT, None)


@frozen
class WorkerTlsConfig:
    """TLS to ``https://`` workers: a custom CA bundle and a client certificate."""

    ca_file: str = ""  # PEM bundle; "" = the system trust store
    client_cert_file: str = ""  # PEM; may hold the key too
    client_key_file: str = ""
    verify: bool = True  # false only for testing: no certificate check

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        if self.client_key_file and not self.client_cert_file:
            yield f"{p}client_key_file: needs {p}client_cert_file (got client_cert_file='')"


@frozen
class WorkerAuthConfig:
    """The API key agentd presents to workers started with ``--api-key`` (docs/operations.md §10.5).

    Sent as ``Authorization: Bearer <key>`` on every request to a worker (generation, health,
    ``/metrics``, ``/v1/models``), replacing whatever a client sent.  Never shown: the effective
    configuration prints ``***`` and logs redact bearer tokens."""

    api_key: str = ""  # the key itself; prefer api_key_file, which keeps it out of the config
    api_key_file: str = ""  # a file holding the key (surrounding whitespace ignored); read at start

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        if self.api_key and self.api_key_file:
            yield f"{p}api_key: set api_key or api_key_file, not both (got both)"
        if any(c.isspace() or not c.isprintable() for c in self.api_key):
            yield f"{p}api_key: must not contain whitespace or control characters (got ***)"


# --------------------------------------------------------------------------------------------
# The Batch API (docs/batch.md §4)
# --------------------------------------------------------------------------------------------

BATCH_DATABASE_NAME = "batches.sqlite3"


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/agentd``, else ``~/.local/state/agentd`` (the XDG base directory default)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME", "")
    if base and Path(base).is_absolute():
        return Path(base) / "agentd"
    return Path(env.get("HOME") or Path.home()) / ".local" / "state" / "agentd"


@frozen
class BatchApiConfig:
    """The durable Batch API: ``/v1/files`` and ``/v1/batches`` backed by one SQLite database."""

    enabled: bool = True
    # "" = the default: default_state_dir() / "batches.sqlite3". A blank path ("  ", from a template
    # whose variable was empty) passed and created a database named "  " in the working directory
    # (docs/config.md [batch_api])
    database_path: str = rule_field(
        (lambda x: isinstance(x, str) and (x == "" or x.strip() != ""), 'must be "" (the default) or a non-blank path'),
        "",
    )
    max_file_bytes: int = rule_field(INT_GT_0, 200 * 1024 * 1024)
    max_lines: int = rule_field(INT_GT_0, 50_000)
    concurrency: int = rule_field(INT_GT_0, 32)

    def resolved_database_path(self, env: Mapping[str, str] | None = None) -> Path:
        if self.database_path:
            return Path(self.database_path).expanduser()
        return default_state_dir(env) / BATCH_DATABASE_NAME


# --------------------------------------------------------------------------------------------
# Request classes, priorities and tenants at the edge (docs/priority.md §5)
# --------------------------------------------------------------------------------------------

REQUEST_CLASSES = ("interactive", "agent", "batch")
# identity-free requests are interactive or batch; a request with Program identity is agent class
SETTABLE_CLASSES = ("interactive", "batch")
REQUEST_ORIGINS = ("http", "batch_api")
WORKER_POLICIES = ("fcfs", "priority", "auto")
DEFAULT_MAX_ABS_PRIORITY = 1_000_000
# the largest max_abs_priority: the engine value band * (2M + 1) - p (docs/priority.md §5.4) stays
# inside vLLM's signed 64-bit priority for every band agentd sends (at most 3 * (2M + 1) + M)
MAX_ABS_PRIORITY_LIMIT = 10**18
TENANT_HEADER = "x-agentd-tenant"
# a tenant name's length, in UTF-8 bytes, wherever it comes from (docs/priority.md §5.3)
MAX_TENANT_BYTES = 256
# distinct tenant metric labels besides metrics_tenants (docs/priority.md §5.6: label cardinality)
MAX_METRICS_TOP_K = 1000
_HEADER_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9a-z]+")
# headers that frame or route the request itself: never a tenant or a rule's matcher
FRAMING_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "content-encoding",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "proxy-connection",
    }
)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _header_match(x: Any) -> bool:
    """``name`` (present and non-blank) or ``name=value`` (exact value, name case-insensitive); the
    name an HTTP header name (a token), not a framing header: another could never match."""
    if x is None:
        return True
    if not isinstance(x, str):
        return False
    name = x.split("=", 1)[0].strip().lower()
    return _HEADER_TOKEN.fullmatch(name) is not None and name not in FRAMING_HEADERS


def _tenant_header(x: Any) -> bool:
    return isinstance(x, str) and (x == "" or (_HEADER_TOKEN.fullmatch(x) is not None and x not in FRAMING_HEADERS))


def _tenant_names(x: Any) -> bool:
    return isinstance(x, tuple) and all(
        isinstance(t, str) and t.strip() == t and t != "" and len(t.encode()) <= MAX_TENANT_BYTES for t in x
    )


def _strip_url_keys(d: Any) -> Any:
    return {k.rstrip("/"): v for k, v in d.items()} if isinstance(d, dict) else d


@frozen
class PriorityRule:
    """One operator rule (docs/priority.md §5.2): every matcher given must match (none given =
    every request); the first matching rule of ``priority.rules`` applies, the others are ignored."""

    # matchers
    tenant: str | None = rule_field(_optional(NON_EMPTY), None)
    header: str | None = field(
        default=None,
        metadata={
            "rule": (
                _header_match,
                "must be null, NAME or NAME=VALUE with NAME an HTTP header name (letters, digits, -, no spaces) "
                "other than a framing header (host, content-length, content-type, transfer-encoding, ...)",
            )
        },
    )
    model: str | None = rule_field(_optional(NON_EMPTY), None)
    origin: str | None = rule_field(_optional(one_of(*REQUEST_ORIGINS)), None)
    # actions
    set_class: str | None = rule_field(_optional(one_of(*SETTABLE_CLASSES)), None)
    max_class: str | None = rule_field(_optional(one_of(*REQUEST_CLASSES)), None)
    default_priority: int | None = rule_field((lambda x: x is None or _is_int(x), "must be null or an integer"), None)
    min_priority: int | None = rule_field((lambda x: x is None or _is_int(x), "must be null or an integer"), None)
    max_priority: int | None = rule_field((lambda x: x is None or _is_int(x), "must be null or an integer"), None)

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        lo, hi = self.min_priority, self.max_priority
        if lo is not None and hi is not None and _is_int(lo) and _is_int(hi) and lo > hi:
            yield f"{p}min_priority: must be <= {p}max_priority (got {lo!r} > {hi!r})"


@frozen(field_transformer=own_fields_first)
class PrioritySection(CorePriorityConfig):
    """``[priority]``: the core's class bands, per-class caps and tenant fairness
    (``actors.core.config.PriorityConfig``, docs/priority.md §1-§4: its fields, defaults and rules
    are this section's other keys) plus how the edge reads priorities and classes and forwards
    vLLM's ``priority`` (docs/priority.md §5)."""

    # accepted |priority| in both conventions; larger -> 400 naming the field
    max_abs_priority: int = rule_field(
        (
            lambda x: _is_int(x) and 0 < x <= MAX_ABS_PRIORITY_LIMIT,
            "must be an integer in [1, 10**18] (the engine priority sent to workers must fit 64 bits)",
        ),
        DEFAULT_MAX_ABS_PRIORITY,
    )
    # identity-free interactive requests queue in the scheduler, ahead of Programs and batch
    # (needs enable_program_scheduling); false (the reference router's behaviour) = they go
    # straight to a worker by the native policy
    interactive_scheduling: bool = False
    # the scheduling policy of workers not listed in worker_policies
    default_worker_policy: str = rule_field(one_of(*WORKER_POLICIES), "fcfs")
    # worker URL -> "priority" (runs vLLM --scheduling-policy priority: receives `priority`),
    # "fcfs" (stock: `priority` is stripped) or "auto" (sent until it answers vLLM's 400 for it)
    worker_policies: dict[str, str] = field(factory=dict, converter=_strip_url_keys)
    rules: tuple[PriorityRule, ...] = field(default=(), converter=tuple)

    def policy_of(self, worker_url: str) -> str:
        return self.worker_policies.get(worker_url.rstrip("/"), self.default_worker_policy)

    def core(self) -> CorePriorityConfig:
        """The core's part of the section, as the core's own type."""
        return CorePriorityConfig(**{a.name: getattr(self, a.name) for a in attrs.fields(CorePriorityConfig)})

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        inherited = getattr(CorePriorityConfig, "_cross_field_problems", None)
        if inherited is not None:
            yield from inherited(self, path)
        for url, policy in self.worker_policies.items():
            if not _valid_url(url):
                yield f"{p}worker_policies: keys must be http:// or https:// URLs (got {url!r})"
            if policy not in WORKER_POLICIES:
                yield (
                    f"{p}worker_policies.{url}: must be one of {', '.join(repr(v) for v in WORKER_POLICIES)} "
                    f"(got {policy!r})"
                )
        m = self.max_abs_priority
        for i, rule in enumerate(self.rules):
            where = f"{p}rules[{i}]"
            yield from problems(rule, where)
            for name in ("default_priority", "min_priority", "max_priority"):
                v = getattr(rule, name)
                if _is_int(v) and _is_int(m) and abs(v) > m:
                    yield f"{where}.{name}: must be within [-max_abs_priority, max_abs_priority] (got {v!r}, bound {m})"


@frozen
class TenantsConfig:
    """``[tenants]``: who a request belongs to (docs/priority.md §5.3).

    Tenant = the authenticated API key's tenant > the ``header`` > the OpenAI ``user`` field (when
    ``use_openai_user``) > ``"default"``."""

    header: str = rule_field(
        (
            _tenant_header,
            "must be a lower-case HTTP header name (letters, digits, -, no spaces) other than a framing header "
            '(host, content-length, content-type, transfer-encoding, ...), or ""',
        ),
        TENANT_HEADER,
    )
    use_openai_user: bool = True
    # tenants with their own metric label: these plus the first metrics_top_k others seen
    metrics_top_k: int = rule_field(
        (lambda x: _is_int(x) and 0 <= x <= MAX_METRICS_TOP_K, f"must be an integer in [0, {MAX_METRICS_TOP_K}]"), 8
    )
    metrics_tenants: tuple[str, ...] = field(
        default=(),
        converter=lambda x: tuple(x) if isinstance(x, list | tuple) else x,
        metadata={
            "rule": (
                _tenant_names,
                f"must be a list of tenant names (non-empty strings without leading or trailing blanks, at most "
                f"{MAX_TENANT_BYTES} bytes each)",
            )
        },
    )


@frozen
class AgentdConfig:
    server: ServerConfig = field(factory=ServerConfig)
    routing: RoutingConfig = field(factory=RoutingConfig)
    prometheus: PrometheusConfig = field(factory=PrometheusConfig)
    embedded: EmbeddedConfig = field(factory=EmbeddedConfig)
    enable_program_scheduling: bool = False
    program_scheduling: ProgramSchedulingConfig | None = None
    batch_jobs: BatchJobsConfig = field(factory=BatchJobsConfig)
    batch_api: BatchApiConfig = field(factory=BatchApiConfig)
    client_hints: ClientHintsConfig = field(factory=ClientHintsConfig)
    limits: LimitsConfig = field(factory=LimitsConfig)
    auth: AuthConfig = field(factory=AuthConfig)
    admin: AdminConfig = field(factory=AdminConfig)
    worker_tls: WorkerTlsConfig = field(factory=WorkerTlsConfig)
    priority: PrioritySection = field(factory=PrioritySection)
    tenants: TenantsConfig = field(factory=TenantsConfig)
    worker_auth: WorkerAuthConfig = field(factory=WorkerAuthConfig)

    @property
    def embedded_mode(self) -> bool:
        return not self.routing.worker_urls

    def worker_urls(self) -> tuple[str, ...]:
        """The worker URLs requests go to (the embedded simulated workers in embedded mode)."""
        if self.embedded_mode:
            n = self.embedded.num_workers
            return (EMBEDDED_WORKER_URL,) if n == 1 else tuple(f"{EMBEDDED_WORKER_URL}-{i}" for i in range(n))
        return tuple(u.rstrip("/") for u in self.routing.worker_urls)

    def served_models(self) -> dict[str, tuple[str, ...]]:
        """Each worker's served models as configured: ``routing.served_models``, or in embedded mode
        every simulated worker's ``[embedded] model`` (a request for another model is refused with
        404 ``model_not_found`` before it is scheduled, docs/operations.md §12)."""
        if self.embedded_mode:
            return {url: (self.embedded.model,) for url in self.worker_urls()}
        return dict(self.routing.served_models)

    def unpinned_workers(self) -> frozenset[str]:
        """Worker URLs with a single DP target: their requests carry no ``x-data-parallel-rank``, so a
        vLLM server running several engines behind one URL balances them itself, as behind the
        reference with ``--intra-node-data-parallel-size 1`` (docs/operations.md §13.10)."""
        ranks = self.embedded.dp_size if self.embedded_mode else self.routing.intra_node_data_parallel_size
        return frozenset(self.worker_urls()) if ranks == 1 else frozenset()

    def priority_workers(self) -> frozenset[str]:
        """Worker URLs that run vLLM ``--scheduling-policy priority`` and so receive ``priority``
        (docs/priority.md §5.4): the embedded workers when ``[embedded] scheduling_policy`` is
        ``priority``, else those ``[priority]`` configures so."""
        if self.embedded_mode:
            return frozenset(self.worker_urls()) if self.embedded.scheduling_policy == "priority" else frozenset()
        return frozenset(u for u in self.worker_urls() if self.priority.policy_of(u) in ("priority", "auto"))

    def priority_detect_workers(self) -> frozenset[str]:
        """Worker URLs of policy ``auto``: sent ``priority`` until one answers vLLM's "Priority
        scheduling is not enabled" 400 (docs/priority.md §5.4); never in embedded mode."""
        if self.embedded_mode:
            return frozenset()
        return frozenset(u for u in self.worker_urls() if self.priority.policy_of(u) == "auto")

    def dp_size(self) -> int:
        return self.embedded.dp_size if self.embedded_mode else self.routing.intra_node_data_parallel_size

    def targets(self) -> tuple[BackendTarget, ...]:
        """Worker URLs x DP ranks, worker-major, with a stable index used as an ordering key; ids
        ``<url>@<rank>``, or ``<url>`` at DP size 1."""
        out: list[BackendTarget] = []
        size = self.dp_size()
        for url in self.worker_urls():
            for rank in range(size):
                # the id (metrics labels, logs, diagnostics, the hash rings) never carries URL
                # credentials; one DP target per worker is named by the URL alone, as the reference
                # (docs/operations.md §13.10)
                tid = f"{redact_url(url)}@{rank}" if size > 1 else redact_url(url)
                out.append(BackendTarget(url, rank, tid, len(out), ranked=size > 1))
        return tuple(out)

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        if self.enable_program_scheduling and self.program_scheduling is None:
            yield "program_scheduling: must be present when enable_program_scheduling is true (got None)"
        if self.prometheus.port is not None and self.prometheus.port == self.server.port != 0:
            yield (
                f"prometheus.port: must differ from server.port "
                f"(got prometheus.port={self.prometheus.port!r}, server.port={self.server.port!r})"
            )
        if (
            self.admin.port is not None
            and self.admin.port != 0
            and self.admin.port
            in (
                self.server.port,
                self.prometheus.port,
            )
        ):
            yield f"admin.port: must differ from server.port and prometheus.port (got {self.admin.port!r})"
        if self.batch_jobs.enabled is True and self.enable_program_scheduling is not True:
            yield (
                "batch_jobs.enabled: requires enable_program_scheduling = true (batch jobs share the Program "
                f"scheduler's ledger) (got enable_program_scheduling={self.enable_program_scheduling!r})"
            )
        policies = self.priority.worker_policies
        if isinstance(policies, dict) and isinstance(self.routing.worker_urls, tuple):
            # as routing.served_models: a URL that is no worker (a typo, another port) was ignored,
            # and the worker it meant silently kept default_worker_policy
            known = {u.rstrip("/") for u in self.routing.worker_urls if isinstance(u, str)}
            for url in policies:
                if isinstance(url, str) and _valid_url(url) and url not in known:
                    where = (
                        "embedded mode has no worker_urls: [embedded] scheduling_policy decides"
                        if not known
                        else "not one of routing.worker_urls"
                    )
                    yield f"priority.worker_policies: names a worker that is not in worker_urls ({where}) (got {url!r})"
        if not self.enable_program_scheduling and self.program_scheduling is not None:
            yield (
                "program_scheduling: given without enable_program_scheduling = true "
                "(program_scheduling_config_json requires enable_program_scheduling)"
            )
