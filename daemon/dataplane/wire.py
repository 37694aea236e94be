"""The frames between a relay process and the scheduler process, and their codec.

A frame is a 4-byte big-endian length followed by that many bytes of compact JSON: a two-element
array ``[tag, fields]`` where ``tag`` names one of the frame classes below and ``fields`` is the
value's fields in declaration order, nested values nested the same way
(:mod:`daemon.dataplane.positional`; both processes run the same code, so no field names
travel).  The frames carry the existing message values unchanged where they exist
(``Admitted``, the core's ``Rejection``, the proxy's ``Outcome``, the edge's
``ParsedIdentity``/``PromptSize``/``PriorityInfo``), so the scheduler side rebuilds the request the
in-process path would have seen, but for its routing text: only the prefix the scheduler reads
travels (``CACHE_AWARE_PREFIX_CHARS``, docs/architecture.md §9).

Relay -> scheduler: :class:`Hello`, :class:`Ask`, :class:`Finish`, :class:`Release`,
:class:`Report`, :class:`Load`, :class:`Drop`, :class:`MetricsText`.
Scheduler -> relay: :class:`Grant`, :class:`Refuse`, :class:`Preempt`, :class:`Revoke`,
:class:`Snapshot`, :class:`MetricsAsk`.

``lease`` numbers are chosen by the relay, unique per connection; every frame about one request
carries its number.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from json.scanner import make_scanner
from typing import Any

from attrs import frozen

from actors.core.errors import Rejection
from actors.core.ids import DEFAULT_MODEL_POOL
from actors.core.placement import CACHE_AWARE_PREFIX_CHARS
from actors.messages import Admitted
from daemon.dataplane.positional import PositionalCodec
from daemon.dispatch import Outcome, ProxyRequest
from daemon.http.identity import ParsedIdentity
from daemon.http.priority import DEFAULT_INFO, PriorityInfo
from daemon.http.requests import PromptSize

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 * 1024 * 1024  # a frame larger than this is a protocol error


class FrameError(Exception):
    """A frame that cannot be decoded (a protocol error: the connection is closed)."""


# ------------------------------------------------------------------------------ the request


@frozen
class WireRequest:
    """What the scheduler needs of a :class:`~daemon.dispatch.ProxyRequest` (never the body or the
    headers: only the output cap is read from the body).  The routing text is cut to the prefix
    the core reads (cache-aware binding compares the first ``CACHE_AWARE_PREFIX_CHARS`` characters;
    no other scheduling decision reads it), so a long system prompt does not cross the socket
    with every Program request."""

    request_id: str
    endpoint: str
    model: str | None
    stream: bool
    prompt: PromptSize
    routing_text: str
    identity: ParsedIdentity | None = None
    batch_job: str | None = None
    model_pool: str = DEFAULT_MODEL_POOL
    pool_targets: tuple[int, ...] | None = None
    prio: PriorityInfo = DEFAULT_INFO
    max_tokens: int | None = None
    # the client's x-agentd-max-queue-seconds (docs/program-scheduling.md §13): the scheduler
    # refuses at once a request whose queue ETA exceeds it (before session 31 a relay dropped it)
    max_queue_seconds: float | None = None
    # a streaming request with SSE keep-alive: the scheduler sends its queue position and ETA while
    # it waits (:class:`Queued`, the ``: queued position=P eta=E`` comments of docs/program-scheduling.md §13)
    queue_updates: bool = False
    # a failover's ask: the workers the request could not reach (sorted), which the core's placement
    # avoids as in one process (docs/program-scheduling.md §9.1)
    avoid_workers: tuple[str, ...] = ()

    @classmethod
    def of(cls, req: ProxyRequest, max_tokens: int | None) -> WireRequest:
        return cls(
            request_id=req.request_id,
            endpoint=req.endpoint,
            model=req.model,
            stream=req.stream,
            prompt=req.prompt,
            routing_text=req.routing_text[:CACHE_AWARE_PREFIX_CHARS],
            identity=req.identity,
            batch_job=req.batch_job,
            model_pool=req.model_pool,
            pool_targets=None if req.pool_targets is None else tuple(sorted(req.pool_targets)),
            prio=req.prio,
            max_tokens=max_tokens,
            max_queue_seconds=req.max_queue_seconds,
            queue_updates=req.queue_watch is not None,
            avoid_workers=tuple(sorted(req.avoid_workers)),
        )

    def proxy_request(self) -> ProxyRequest:
        return ProxyRequest(
            request_id=self.request_id,
            endpoint=self.endpoint,
            body={} if self.max_tokens is None else {"max_tokens": self.max_tokens},
            headers={},
            model=self.model,
            stream=self.stream,
            prompt=self.prompt,
            routing_text=self.routing_text,
            identity=self.identity,
            batch_job=self.batch_job,
            model_pool=self.model_pool,
            pool_targets=None if self.pool_targets is None else frozenset(self.pool_targets),
            prio=self.prio,
            max_queue_seconds=self.max_queue_seconds,
            avoid_workers=frozenset(self.avoid_workers),
        )


LEASE_KINDS = ("program", "interactive", "batch")

# ------------------------------------------------------------------------------ relay -> scheduler


@frozen
class Hello:
    """The first frame of a relay: who it is."""

    relay: int
    pid: int


@frozen
class Ask:
    """Ask for a lease (``kind``: ``program``, ``interactive`` or ``batch``).

    ``pass_number`` > 0: the relay already forwarded this Program request to ``pass_target`` (a
    target id) under that resume pass and does not wait for the answer (docs/architecture.md §9)."""

    lease: int
    kind: str
    request: WireRequest
    pass_number: int = 0
    pass_target: str = ""


@frozen
class Finish:
    """The lease's response ended with ``outcome`` (``lease.finish``)."""

    lease: int
    outcome: Outcome


@frozen
class Release:
    """The request left without ``finish`` (client gone, cancelled, failed over): abandoned."""

    lease: int


@frozen
class Report:
    """An outcome report of real traffic for the health board (passive outlier ejection;
    ``suspect``: a connect timeout, docs/operations.md §11.3)."""

    worker_url: str
    ok: bool
    detail: str = ""
    eject_now: bool = False
    suspect: bool = False
    # the worker refused this target index's DP rank (-1: no rank refused; docs/operations.md §11.3)
    refused_rank_target: int = -1


@frozen
class Load:
    """The relay's own view, sent when it changed (docs/architecture.md §9, "What a relay reports"):
    its native in-flight count per target index (load-aware native policies); the scheduler-decided
    leases it holds (``leases``: asked, neither ended by a ``Finish``/``Release`` it sent nor
    refused by a ``Refuse`` it read); the resume passes it holds; the age of its oldest open lease
    in seconds when it sent the frame (None: none open; an age, not a time, since the processes'
    clocks differ); and how many of the scheduler's frames it had handled when it took these
    counts (``frames_read``: the scheduler compares only when none of its own frames was still on
    the way, so the two views describe the same instant)."""

    in_flight: tuple[int, ...]
    leases: int = 0
    passes: int = 0
    oldest_lease_seconds: float | None = None
    frames_read: int = 0


@frozen
class Drop:
    """The relay dropped resume pass ``number`` on its own, without a :class:`Revoke`: its request
    failed, its map of passes was full, or it came with the ``Grant`` of a lease the relay had
    already released (docs/architecture.md §9).  The scheduler forgets it, so both sides count the
    same passes."""

    number: int


@frozen
class MetricsText:
    """The relay's Prometheus exposition, answering :class:`MetricsAsk` ``token``."""

    token: int
    text: str


# ------------------------------------------------------------------------------ scheduler -> relay


@frozen
class Grant:
    """The lease is admitted: forward to ``admitted.target`` (``attempt`` > 0: a batch repeat).

    ``pass_number`` > 0: a resume pass for the request's Program: until a :class:`Revoke` of that
    number arrives, the relay may forward the Program's next request to ``admitted.target`` at
    once (docs/architecture.md §9)."""

    lease: int
    admitted: Admitted
    attempt: int = 0
    pass_number: int = 0


@frozen
class Refuse:
    """The lease is refused (the core's rejection, rendered by the relay's edge)."""

    lease: int
    rejection: Rejection


@frozen
class Queued:
    """Lease ``lease`` waits in the scheduler's queue at ``position`` in its line, expected to wait
    ``eta_seconds`` more (the core's ``QueuePosition``, docs/program-scheduling.md §13); sent only for
    an ask with ``queue_updates``, once when it is queued and then at every tick."""

    lease: int
    position: int
    eta_seconds: float


@frozen
class Preempt:
    """The scheduler preempted the batch request's current attempt (docs/batch.md §2)."""

    lease: int


@frozen
class Revoke:
    """Resume pass ``number`` of Program ``program_id`` (in ``model_pool``) is no longer valid: the
    Program stopped being Active on the pass's target (docs/architecture.md §9)."""

    model_pool: str
    program_id: str
    number: int


@frozen
class WorkerModels:
    worker_url: str
    models: tuple[str, ...] | None


@frozen
class Snapshot:
    """What the relays' native dispatchers read: healthy target indices, why none may be healthy,
    the other processes' native in-flight counts per target index, each worker's served models
    and how many of this relay's :class:`Report` frames the scheduler has applied."""

    seq: int
    healthy: tuple[int, ...]
    unhealthy_reason: str
    others_in_flight: tuple[int, ...]
    models: tuple[WorkerModels, ...] = ()
    reports_applied: int = 0


@frozen
class MetricsAsk:
    token: int


Frame = (
    Hello
    | Ask
    | Finish
    | Release
    | Report
    | Load
    | Drop
    | MetricsText
    | Grant
    | Refuse
    | Queued
    | Preempt
    | Revoke
    | Snapshot
    | MetricsAsk
)
FRAME_TYPES: tuple[type, ...] = (
    Hello,
    Ask,
    Finish,
    Release,
    Report,
    Load,
    Drop,
    MetricsText,
    Grant,
    Refuse,
    Queued,
    Preempt,
    Revoke,
    Snapshot,
    MetricsAsk,
)
_BY_TAG: dict[str, type] = {cls.__name__: cls for cls in FRAME_TYPES}
_CODEC = PositionalCodec(FRAME_TYPES)
_ENCODERS: dict[type, tuple[str, Any]] = {cls: (cls.__name__, _CODEC.encoders[cls]) for cls in FRAME_TYPES}
_DECODERS: dict[str, Any] = {cls.__name__: _CODEC.decoders[cls] for cls in FRAME_TYPES}
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
# the C scanner of the standard decoder, called on the payload's text directly: ``json.loads`` on
# bytes first guesses their encoding, which cost as much as the scan itself (docs/benchmarks.md
# §10.3.4); a frame is UTF-8, as ``encode`` writes it
_scan: Callable[[str, int], tuple[Any, int]] = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def encode(frame: Any) -> bytes:
    """One frame: length prefix + ``[tag, fields]`` as compact JSON (fields positional)."""
    entry = _ENCODERS.get(type(frame))
    if entry is None:
        raise TypeError(f"not a data-plane frame: {type(frame).__name__}")
    tag, enc = entry
    payload = _dumps([tag, enc(frame)]).encode()
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> Any:
    """The frame value of one payload (without its length prefix); :class:`FrameError` if invalid."""
    try:
        text = payload.decode()
        value, end = _scan(text, 0)
        if end != len(text):
            raise ValueError(f"data after the frame's JSON value at {end}")
        tag, fields = value
        return _DECODERS[tag](fields)
    except Exception as exc:
        raise FrameError(f"undecodable frame: {type(exc).__name__}: {exc}") from exc


class FrameReader:
    """Splits a byte stream into frame payloads (``feed`` bytes, iterate the complete frames)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray) -> list[Any]:
        self._buffer += data
        frames = []
        buffer = self._buffer
        start = 0
        while len(buffer) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, start)
            if size > MAX_FRAME_BYTES:
                raise FrameError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
            end = start + HEADER.size + size
            if len(buffer) < end:
                break
            frames.append(decode(bytes(buffer[start + HEADER.size : end])))
            start = end
        if start:
            del buffer[:start]
        return frames

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)
