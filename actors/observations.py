"""Parse one vLLM ``/metrics`` scrape into per-DP-rank backend observations.

A vLLM API server with internal data parallelism exposes every engine (DP rank) on one
``/metrics`` endpoint and tells them apart with the ``engine`` label.  Program scheduling scrapes
each worker URL once per interval and hands each rank the series of its own engine
(``engine="<dp_rank>"``; a series without a parsable ``engine`` label counts as engine 0, the way
the reference router reads it).

Families read (everything else is ignored):

* ``vllm:kv_cache_usage_perc``    -> ``kv_cache_usage`` (fraction 0..1); for an engine without it,
  ``vllm:gpu_cache_usage_perc``, its name until vLLM 0.9.0 (both names from 0.9.1 or 0.9.2 to
  0.10.x, the old one hidden from 0.11: docs/operations.md §11.7)
* ``vllm:num_requests_running``   -> ``running_requests`` (float truncated to int)
* ``vllm:num_requests_waiting``   -> ``waiting_requests`` (float truncated to int)
* ``vllm:cache_config_info``      -> ``kv_capacity_tokens`` = ``num_gpu_blocks * block_size``
  (an info-style gauge whose labels carry the cache config).  The reference router ignores it;
  agentd reports it in diagnostics so an operator can compare it with
  ``token_capacity_per_dp_rank`` (backend accounting is ``kv_cache_usage * configured capacity``,
  so the two must agree).

An engine with none of the first three families (or the old KV name) produces no observation at all: nothing is
fabricated.  When several series map to the same engine (for example one per ``model_name``),
the last one wins, as in the reference.

Parsing uses ``prometheus_client.parser`` on the lines of these five families only: a real
vLLM scrape carries hundreds of histogram samples that Program scheduling never reads, and
parsing them every interval for every worker dominated the cost of observing the backend.  The
line filter keeps ``# TYPE``/``# HELP`` lines of the five families and their samples, so the
parser sees a well-formed (smaller) exposition.  Malformed text raises
:class:`ObservationParseError`.
"""

from __future__ import annotations

import math
import re

from attrs import frozen
from prometheus_client.parser import text_string_to_metric_families

KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
OLD_KV_CACHE_USAGE = "vllm:gpu_cache_usage_perc"  # vLLM <= 0.9.0; deprecated beside the new one until 0.10.x
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
CACHE_CONFIG_INFO = "vllm:cache_config_info"


class ObservationParseError(ValueError):
    """The scrape body is not Prometheus text exposition."""


@frozen
class EngineSample:
    """What one scrape said about one engine (DP rank).  ``None`` = series absent."""

    kv_cache_usage: float | None
    running_requests: int | None
    waiting_requests: int | None
    kv_capacity_tokens: int | None


def _engine_of(labels: dict[str, str]) -> int:
    raw = labels.get("engine")
    if raw is None:
        return 0
    try:
        return int(raw.strip())
    except ValueError:
        return 0


def _count(value: float) -> int | None:
    if not math.isfinite(value):
        return None
    return max(0, int(value))


_WANTED = (KV_CACHE_USAGE, OLD_KV_CACHE_USAGE, RUNNING, WAITING, CACHE_CONFIG_INFO)
_WANTED_COMMENTS = tuple(f"# {kind} {name}" for kind in ("HELP", "TYPE") for name in _WANTED)


_SAMPLE_LINE = re.compile(
    r"^[A-Za-z_:][A-Za-z0-9_:]*(\{.*\})?\s+[-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|Inf)(?:\s+-?[0-9]+)?\s*$"
)


def _wanted_lines(text: str) -> str:
    """The exposition restricted to the families read here (samples and their metadata).

    The first sample line must look like Prometheus text, so that a body that is not an
    exposition at all (an HTML error page, say) is still reported as a parse error."""
    keep = []
    checked = False
    for line in text.splitlines():
        if line.startswith(_WANTED) or line.startswith(_WANTED_COMMENTS):
            keep.append(line)
        elif not checked and line and not line.startswith("#"):
            if _SAMPLE_LINE.match(line) is None:
                raise ObservationParseError(f"invalid Prometheus text: unexpected line {line[:80]!r}")
            checked = True
    keep.append("")
    return "\n".join(keep)


# Identical scrapes parse to identical samples: the last few small texts are remembered, so a worker
# whose exposition does not change (the simulated backend through an idle stretch, scraped every
# second for hours of virtual time) is parsed once. Bounded in entries and in text size (a real
# vLLM exposition with its histograms is larger and changes with every scrape anyway).
_MEMO_TEXT_CHARS = 64 * 1024
_MEMO_ENTRIES = 16
_memo: dict[str, dict[int, EngineSample]] = {}


def parse_vllm_metrics(text: str) -> dict[int, EngineSample]:
    """Per-engine samples of one scrape, keyed by engine index (= DP rank)."""
    if len(text) > _MEMO_TEXT_CHARS:
        return _parse(text)
    hit = _memo.get(text)
    if hit is None:
        hit = _parse(text)  # a parse error raises and is not remembered
        if len(_memo) >= _MEMO_ENTRIES:
            del _memo[next(iter(_memo))]  # the oldest entry
        _memo[text] = hit
    return dict(hit)  # the caller's own dict; the samples are frozen


def _parse(text: str) -> dict[int, EngineSample]:
    kv: dict[int, float] = {}
    old_kv: dict[int, float] = {}  # vllm:gpu_cache_usage_perc, read where the new name is absent
    running: dict[int, int] = {}
    waiting: dict[int, int] = {}
    capacity: dict[int, int] = {}
    shared_capacity: int | None = None  # a cache_config_info without engine label serves all
    try:
        families = list(text_string_to_metric_families(_wanted_lines(text)))
    except (ValueError, TypeError, IndexError) as exc:
        raise ObservationParseError(f"invalid Prometheus text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            name = sample.name
            engine = _engine_of(sample.labels)
            if name in (KV_CACHE_USAGE, OLD_KV_CACHE_USAGE):
                if math.isfinite(sample.value):
                    (kv if name == KV_CACHE_USAGE else old_kv)[engine] = min(1.0, max(0.0, float(sample.value)))
            elif name == RUNNING:
                n = _count(sample.value)
                if n is not None:
                    running[engine] = n
            elif name == WAITING:
                n = _count(sample.value)
                if n is not None:
                    waiting[engine] = n
            elif name == CACHE_CONFIG_INFO:
                tokens = _capacity_from_cache_config(sample.labels)
                if tokens is None:
                    continue
                if "engine" in sample.labels:
                    capacity[engine] = tokens
                else:
                    shared_capacity = tokens
    kv = {**old_kv, **kv}
    engines = sorted(set(kv) | set(running) | set(waiting))
    return {
        e: EngineSample(
            kv_cache_usage=kv.get(e),
            running_requests=running.get(e),
            waiting_requests=waiting.get(e),
            kv_capacity_tokens=capacity.get(e, shared_capacity),
        )
        for e in engines
    }


def local_engines(samples: dict[int, EngineSample], ranks: int) -> dict[int, EngineSample]:
    """``samples`` keyed by the worker's local rank: a worker whose scrape lists exactly ``ranks``
    engines (the DP targets agentd has there), numbered contiguously from ``s > 0``, has engine
    ``s + r`` read as rank ``r``; any other scrape is returned as it is.

    A vLLM server of several ranks behind a hybrid load balancer (``--data-parallel-hybrid-lb``, one
    API server per node serving that node's ranks) labels its engines with their global DP index,
    ``engine="2"`` and ``engine="3"`` on the second node of DP 4, while the ``X-data-parallel-rank``
    header it accepts is the local index 0..N-1 (docs/operations.md §11.7)."""
    if ranks < 1 or len(samples) != ranks:
        return samples
    start = min(samples)
    if start <= 0 or max(samples) != start + ranks - 1:
        return samples
    return {engine - start: sample for engine, sample in sorted(samples.items())}


def _capacity_from_cache_config(labels: dict[str, str]) -> int | None:
    try:
        blocks = int(labels["num_gpu_blocks"])
        block_size = int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    if blocks <= 0 or block_size <= 0:
        return None
    return blocks * block_size
