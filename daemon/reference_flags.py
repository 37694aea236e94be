"""The reference router's (vllm-router 0.1.17) launch flags beyond the ones
:func:`daemon.config_loading.add_router_flags` gives a field of their own.

An operator carries a launch command over by changing the program name (docs/operations.md §0,
§13.10).  Every other flag of the reference's ``--help`` is one of:

* :data:`MAPPED`: an agentd field with the same meaning; the flag sets it;
* :data:`UNSUPPORTED` with ``refused=True``: it asks for something agentd does not do (another
  deployment mode, a log file, CORS...); starting without it would silently serve differently, so
  it is a configuration error naming the flag and what agentd does instead (exit 2);
* :data:`UNSUPPORTED` with ``refused=False``: it only tunes a mechanism agentd does not have, and
  agentd's own behaviour covers it; it is accepted and a warning ``reference_flag_ignored`` names it.

A flag outside all of these is argparse's ``unrecognized arguments`` (exit 2, naming it).
"""

from __future__ import annotations

import argparse
from typing import Any

from attrs import frozen

# The operations page that lists every flag's verdict.
FLAGS_DOC = "docs/operations.md §13.10"


def _dest(flag: str) -> str:
    """The argparse attribute of a reference flag (``ref_`` first: never one of agentd's own)."""
    return "ref_" + flag.lstrip("-").replace("-", "_")


@frozen
class MappedFlag:
    flag: str
    section: str
    key: str
    kind: type
    note: str = ""

    @property
    def dest(self) -> str:
        return _dest(self.flag)

    @property
    def path(self) -> str:
        return f"{self.section}.{self.key}"


@frozen
class UnsupportedFlag:
    flag: str
    nargs: int | str | None  # None: a switch; 1: one value; "+"/"*": a list (repeatable)
    refused: bool
    reason: str

    @property
    def dest(self) -> str:
        return _dest(self.flag)


MAPPED: tuple[MappedFlag, ...] = (
    MappedFlag("--api-key", "worker_auth", "api_key", str, "the key sent to workers started with --api-key"),
    MappedFlag("--request-timeout-secs", "routing", "request_timeout_seconds", float),
    MappedFlag("--health-check-interval-secs", "routing", "health_check_interval_seconds", float),
    MappedFlag("--health-check-timeout-secs", "routing", "health_check_timeout_seconds", float),
    MappedFlag("--health-failure-threshold", "routing", "health_failures_to_eject", int),
    MappedFlag("--health-success-threshold", "routing", "health_successes_to_restore", int),
    MappedFlag("--max-payload-size", "server", "max_body_bytes", int),
    MappedFlag("--max-concurrent-requests", "limits", "max_in_flight_requests", int),
    MappedFlag("--queue-size", "limits", "max_queued_requests", int),
    MappedFlag("--queue-timeout-secs", "limits", "queue_timeout_seconds", float),
)

_PD = "prefill/decode disaggregation, which agentd does not do"
_DISCOVERY = "Kubernetes service discovery, which agentd does not do: give the workers with --worker-urls"
_CACHE_AWARE = "tunes the reference's cache_aware policy, which agentd does not have (--policy)"
_KV_AWARE = "tunes the reference's kv_aware policy, which agentd does not have (--policy)"
_RETRY = (
    "agentd never sends a request a worker received again (only one that never reached a worker goes "
    "to another, docs/operations.md §11.2) and answers a Program queue timeout with 429 at once"
)
_BREAKER = (
    "agentd has no circuit breaker: health checks and passive outlier ejection take a failing worker out "
    "of rotation (docs/operations.md §11.3)"
)
_STARTUP = "agentd does not wait for workers at start: each joins when its health check passes"

UNSUPPORTED: tuple[UnsupportedFlag, ...] = (
    UnsupportedFlag("--prefill-policy", 1, False, "applies to " + _PD),
    UnsupportedFlag("--decode-policy", 1, False, "applies to " + _PD),
    UnsupportedFlag("--router-temperature", 1, False, _KV_AWARE),
    UnsupportedFlag("--kv-penalty-host", 1, False, _KV_AWARE),
    UnsupportedFlag("--kv-penalty-external", 1, False, _KV_AWARE),
    UnsupportedFlag("--kv-penalty-disk", 1, False, _KV_AWARE),
    UnsupportedFlag("--kv-aware-session-affinity-ttl-secs", 1, False, _KV_AWARE),
    UnsupportedFlag("--kv-event-source", "+", False, _KV_AWARE),
    UnsupportedFlag("--kv-event-replay-source", "+", False, _KV_AWARE),
    UnsupportedFlag("--kv-event-block-size", 1, False, _KV_AWARE),
    UnsupportedFlag("--kv-event-model", 1, False, _KV_AWARE),
    UnsupportedFlag("--pd-kv-events", "+", True, _PD),
    UnsupportedFlag("--mini-lb", None, True, "the reference's Python debug load balancer"),
    UnsupportedFlag("--vllm-pd-disaggregation", None, True, _PD),
    UnsupportedFlag("--prefill", "+", True, _PD),
    UnsupportedFlag("--decode", "+", True, _PD),
    UnsupportedFlag("--worker-startup-timeout-secs", 1, False, _STARTUP),
    UnsupportedFlag("--worker-startup-check-interval", 1, False, _STARTUP),
    UnsupportedFlag("--cache-threshold", 1, False, _CACHE_AWARE),
    UnsupportedFlag("--balance-abs-threshold", 1, False, _CACHE_AWARE),
    UnsupportedFlag("--balance-rel-threshold", 1, False, _CACHE_AWARE),
    UnsupportedFlag("--eviction-interval-secs", 1, False, _CACHE_AWARE),
    UnsupportedFlag("--max-tree-size", 1, False, _CACHE_AWARE),
    UnsupportedFlag("--wasm-middleware", 1, True, "agentd runs no WASM middleware"),
    UnsupportedFlag("--wasm-middleware-sha256", 1, True, "agentd runs no WASM middleware"),
    UnsupportedFlag("--wasm-middleware-route", "+", True, "agentd runs no WASM middleware"),
    UnsupportedFlag(
        "--enable-igw",
        None,
        True,
        "agentd has no IGW mode: workers serving different models form model pools "
        "(routing.served_models, docs/operations.md §12)",
    ),
    UnsupportedFlag(
        "--log-dir",
        1,
        True,
        "agentd writes no log files: its log lines go to stderr (docs/operations.md §7); redirect them or "
        "let the service manager keep them",
    ),
    UnsupportedFlag("--service-discovery", None, True, _DISCOVERY),
    UnsupportedFlag("--selector", "+", True, _DISCOVERY),
    UnsupportedFlag("--service-discovery-port", 1, True, _DISCOVERY),
    UnsupportedFlag("--service-discovery-namespace", 1, True, _DISCOVERY),
    UnsupportedFlag("--prefill-selector", "+", True, _DISCOVERY),
    UnsupportedFlag("--decode-selector", "+", True, _DISCOVERY),
    UnsupportedFlag("--vllm-discovery-address", 1, True, _PD),
    UnsupportedFlag("--kv-connector", 1, True, _PD),
    UnsupportedFlag(
        "--request-id-headers",
        "*",
        True,
        "agentd takes a client's request id from X-Request-Id, else the body's request_id "
        "(docs/operations.md §12); other headers are not read",
    ),
    UnsupportedFlag("--retry-max-retries", 1, False, _RETRY),
    UnsupportedFlag("--retry-initial-backoff-ms", 1, False, _RETRY),
    UnsupportedFlag("--retry-max-backoff-ms", 1, False, _RETRY),
    UnsupportedFlag("--retry-backoff-multiplier", 1, False, _RETRY),
    UnsupportedFlag("--retry-jitter-factor", 1, False, _RETRY),
    UnsupportedFlag("--disable-retries", None, False, _RETRY + ": what this flag asks for"),
    UnsupportedFlag("--cb-failure-threshold", 1, False, _BREAKER),
    UnsupportedFlag("--cb-success-threshold", 1, False, _BREAKER),
    UnsupportedFlag("--cb-timeout-duration-secs", 1, False, _BREAKER),
    UnsupportedFlag("--cb-window-duration-secs", 1, False, _BREAKER),
    UnsupportedFlag("--disable-circuit-breaker", None, False, _BREAKER),
    UnsupportedFlag(
        "--rate-limit-tokens-per-second",
        1,
        True,
        "agentd has no token-bucket rate limit: --max-concurrent-requests and --queue-size "
        "(limits.max_in_flight_requests, limits.max_queued_requests) cap the load",
    ),
    UnsupportedFlag(
        "--cors-allowed-origins",
        "*",
        True,
        "agentd sends no CORS headers: a web page on another origin cannot call it",
    ),
)

# The only value of the reference's --health-check-endpoint agentd has (it checks GET /health).
HEALTH_ENDPOINT = "/health"
HEALTH_ENDPOINT_DEST = _dest("--health-check-endpoint")

# The reference's native policies agentd has no equivalent of (routing.policy lists agentd's own).
REFERENCE_ONLY_POLICIES = ("cache_aware", "kv_aware", "sticky_least_loaded")


def add_reference_flags(parser: argparse.ArgumentParser) -> None:
    mapped = parser.add_argument_group("reference-router flags with an agentd field (override the config file)")
    for m in MAPPED:
        note = f"; {m.note}" if m.note else ""
        mapped.add_argument(m.flag, dest=m.dest, type=m.kind, metavar="VALUE", help=f"({m.path}{note})")
    mapped.add_argument(
        "--health-check-endpoint",
        dest=HEALTH_ENDPOINT_DEST,
        metavar="PATH",
        help=f"only {HEALTH_ENDPOINT}, the path agentd checks; any other path is refused",
    )
    ignored = ", ".join(u.flag for u in UNSUPPORTED if not u.refused)
    refused = ", ".join(u.flag for u in UNSUPPORTED if u.refused)
    other = parser.add_argument_group(
        "reference-router flags agentd does not support",
        f"accepted and ignored with a warning naming them: {ignored}. Refused (exit 2): {refused}. "
        f"Why, flag by flag: {FLAGS_DOC}",
    )
    for u in UNSUPPORTED:
        if u.nargs is None:
            other.add_argument(u.flag, dest=u.dest, action="store_true", default=None, help=argparse.SUPPRESS)
        elif u.nargs == 1:
            other.add_argument(u.flag, dest=u.dest, action="append", help=argparse.SUPPRESS)
        else:
            other.add_argument(u.flag, dest=u.dest, nargs=u.nargs, action="append", help=argparse.SUPPRESS)


def given(args: argparse.Namespace, dest: str) -> bool:
    return getattr(args, dest, None) is not None


def reference_overrides(args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The fields the mapped flags set (``{section: {key: value}}``) and one problem line per refused
    flag given."""
    over: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for m in MAPPED:
        value = getattr(args, m.dest, None)
        if value is not None:
            over.setdefault(m.section, {})[m.key] = value
    endpoint = getattr(args, HEALTH_ENDPOINT_DEST, None)
    if endpoint is not None and endpoint != HEALTH_ENDPOINT:
        problems.append(
            f"--health-check-endpoint: agentd checks GET {HEALTH_ENDPOINT} on each worker; "
            f"another path is not supported (got {endpoint!r}; {FLAGS_DOC})"
        )
    policy = getattr(args, "policy", None)
    if policy in REFERENCE_ONLY_POLICIES:
        problems.append(
            f"--policy: the reference router's {policy} policy has no agentd equivalent (got {policy!r}); "
            "agentd's native policies are round_robin, random, power_of_two and consistent_hash "
            f"(consistent_hash keeps a session's requests on one worker: docs/config.md [routing]; {FLAGS_DOC})"
        )
    for u in UNSUPPORTED:
        if u.refused and given(args, u.dest):
            problems.append(f"{u.flag}: not supported by agentd: {u.reason} ({FLAGS_DOC})")
    return over, problems


def ignored_flags(args: argparse.Namespace) -> list[UnsupportedFlag]:
    """The accepted-but-ignored flags given (each gets a ``reference_flag_ignored`` warning)."""
    return [u for u in UNSUPPORTED if not u.refused and given(args, u.dest)]


def mapped_flag_fields() -> dict[str, tuple[str, str]]:
    """Field path -> (flag, argparse dest) of the mapped flags."""
    return {m.path: (m.flag, m.dest) for m in MAPPED}
