"""The agentd trace format: Mooncake-style JSONL extended for agent Programs.

One JSON object per line. The optional first line is a metadata object ``{"meta": {...}}``
(profile name, seed, arrival mode, default concurrency, generator parameters). Every other line is
one LLM request (one *turn* of one *session* = one Program). Field names follow Mooncake
(``timestamp``, ``input_length``, ``output_length``, ``hash_ids``) and ABench (``input_delta``,
``pre_gap_ms``) where those exist; the agent fields (``session_id``, ``parent_session_id``, ``turn``,
``tool_name``, ``finish_reason``, ``priority``, ``job``, ``stream``) are the agent extension. docs/traces.md
("Format") is the user-facing reference.

Replay semantics encoded by the fields:

- A session's turn ``t > 0`` is sent ``pre_gap_ms`` after turn ``t-1`` completed (the tool or human
  gap). Its prompt is the conversation so far plus ``input_delta`` new tokens (role ``role``).
- Turn 0 of a root session arrives at ``timestamp`` (open-loop traces) or when a closed-loop slot
  frees up (its ``pre_gap_ms`` is not used).
- Turn 0 of a child session (subagent) starts ``pre_gap_ms`` after turn ``parent_turn`` of
  ``parent_session_id`` completed. When ``blocks_parent`` is true the parent's turn
  ``parent_turn + 1`` additionally waits for the child's last turn to complete.
- a record with a ``job`` is a batch request: sent without Program identity, with
  ``X-Agentd-Class: batch`` and the job tag in its request id, streamed only if ``stream``;
  batch roots always start at their ``timestamp`` (open loop), whatever the trace's arrival mode.
- ``tenant`` (default ``default``) is sent as the OpenAI ``user`` field and the
  ``X-Agentd-Tenant`` header; ``request_class`` ``interactive`` is sent one-shot (no Program
  identity) with ``X-Agentd-Class: interactive`` and, like batch roots, starts at its
  ``timestamp`` (open loop); ``priority`` is vLLM's convention (lower first).
- ``compaction`` drops the history: the prompt is the shared prefix plus ``input_delta`` only.
- ``input_length`` is derived (shared prefix + history + delta) and checked on load.

Times are in real (unscaled) milliseconds; replay divides them by its time scale.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO

import attrs

from bench.output import write_atomic

FORMAT_NAME = "agentd-trace/1"
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake traces hash 512-token blocks
ROLES = ("user", "tool")
CLASSES = ("interactive", "agent", "batch")
DEFAULT_TENANT = "default"
FINISH_REASONS = ("stop", "tool_calls", "length")
# The most tokens a record's prompt (given or derived) and each of its token counts may hold: the
# replay builds the text of every prompt (about 3.75 bytes a token), so a typo of a few zeros made
# replay, simulate and bench build gigabytes of text, deaf to Ctrl-C, until memory ran out. Far
# beyond any model's context and the largest synthesized prompt (coding-long at --input-scale 100:
# about 13 million) (docs/traces.md, "Format")
MAX_TRACE_TOKENS = 100_000_000
# input_length first: a plain Mooncake line's input_delta is a copy of its input_length
_TOKEN_FIELDS = ("input_length", "input_delta", "output_length", "shared_prefix_tokens")


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the line and field."""


@attrs.frozen
class TraceRecord:
    session_id: str
    turn: int
    input_delta: int
    output_length: int
    input_length: int = 0
    pre_gap_ms: float = 0.0
    timestamp: float | None = None
    parent_session_id: str | None = None
    parent_turn: int | None = None
    blocks_parent: bool = False
    role: str = "user"
    tool_name: str | None = None
    finish_reason: str = "stop"
    shared_prefix_id: str | None = None
    shared_prefix_tokens: int = 0
    compaction: bool = False
    priority: int = 0
    job: str | None = None
    agent_id: str = "lead"
    task_id: str | None = None
    hash_ids: tuple[int, ...] = ()
    stream: bool = True  # batch records may be sent non-streaming; written only when false
    tenant: str = DEFAULT_TENANT  # who sends it (docs/traces.md, "Tenants and classes"); written only when set
    request_class: str | None = None  # interactive | agent | batch; None: batch with a job, else agent

    @property
    def is_batch(self) -> bool:
        """A batch-job request (``job`` set): replayed without Program identity (docs/traces.md)."""
        return self.job is not None

    @property
    def klass(self) -> str:
        """The request class: the explicit ``request_class``, else ``batch`` for a job, else ``agent``."""
        if self.request_class is not None:
            return self.request_class
        return "batch" if self.is_batch else "agent"

    @property
    def is_interactive(self) -> bool:
        """An interactive-class request: replayed one-shot, without Program identity."""
        return self.klass == "interactive"


@attrs.frozen
class TraceMeta:
    profile: str = "custom"
    seed: int | None = None
    programs: int = 0
    arrival: str = "closed_loop"  # closed_loop | poisson | bursts
    concurrency: int = 16
    params: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Trace:
    meta: TraceMeta
    records: tuple[TraceRecord, ...]

    def sessions(self) -> dict[str, list[TraceRecord]]:
        """Records grouped per session, in file order (insertion-ordered dict)."""
        out: dict[str, list[TraceRecord]] = {}
        for rec in self.records:
            out.setdefault(rec.session_id, []).append(rec)
        return out


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "session_id": (str,),
    "turn": (int,),
    "input_delta": (int,),
    "output_length": (int,),
    "input_length": (int,),
    "pre_gap_ms": (int, float),
    "timestamp": (int, float),
    "parent_session_id": (str,),
    "parent_turn": (int,),
    "blocks_parent": (bool,),
    "role": (str,),
    "tool_name": (str,),
    "finish_reason": (str,),
    "shared_prefix_id": (str,),
    "shared_prefix_tokens": (int,),
    "compaction": (bool,),
    "priority": (int,),
    "job": (str,),
    "agent_id": (str,),
    "task_id": (str,),
    "hash_ids": (list,),
    "stream": (bool,),
    "tenant": (str,),
    "request_class": (str,),
}
_NULLABLE = {
    "timestamp",
    "parent_session_id",
    "parent_turn",
    "tool_name",
    "shared_prefix_id",
    "job",
    "task_id",
    "request_class",
}
_IGNORED = {"cached_tokens", "input_tokens", "output_tokens"}  # ABench extras we accept and recompute


# Fields added after agentd-trace/1 was first written: left out of a line at their default, so
# traces without them keep their bytes (and older readers their input).
_OMITTED_AT_DEFAULT: dict[str, Any] = {"stream": True, "tenant": DEFAULT_TENANT, "request_class": None}


def record_to_json(rec: TraceRecord) -> dict[str, Any]:
    out = attrs.asdict(rec, recurse=False)
    out["hash_ids"] = list(rec.hash_ids)
    for key, default in _OMITTED_AT_DEFAULT.items():
        if out[key] == default:
            del out[key]
    return out


def meta_to_json(meta: TraceMeta) -> dict[str, Any]:
    return {"meta": {"format": FORMAT_NAME, **attrs.asdict(meta)}}


def dumps_trace(trace: Trace, progress: Callable[[str, int, int], None] | None = None) -> str:
    """The JSONL text of ``trace``: the meta line, then one line per record (``progress`` is told
    how many records are encoded)."""
    lines = [json.dumps(meta_to_json(trace.meta), sort_keys=True)]
    total = len(trace.records)
    for done, r in enumerate(trace.records):
        if progress is not None:
            progress("encoding request", done, total)
        lines.append(json.dumps(record_to_json(r), sort_keys=True))
    return "\n".join(lines) + "\n"


def write_trace(trace: Trace, fh: TextIO, progress: Callable[[str, int, int], None] | None = None) -> None:
    fh.write(dumps_trace(trace, progress))


def save_trace(
    trace: Trace, path: str | os.PathLike[str], progress: Callable[[str, int, int], None] | None = None
) -> None:
    """Write ``trace`` to ``path`` atomically (the whole file or, on failure, the previous one)."""
    write_atomic(path, dumps_trace(trace, progress))


def _parse_meta(obj: Any, lineno: int) -> TraceMeta:
    if not isinstance(obj, dict):
        raise TraceError(f"line {lineno}: meta must be an object")
    fmt = obj.get("format", FORMAT_NAME)
    if fmt != FORMAT_NAME:
        raise TraceError(f"line {lineno}: meta.format must be {FORMAT_NAME!r}, got {fmt!r}")
    known = {f.name for f in attrs.fields(TraceMeta)}
    kwargs = {k: v for k, v in obj.items() if k in known}
    arrival = kwargs.get("arrival", "closed_loop")
    if arrival not in ("closed_loop", "poisson", "bursts"):
        raise TraceError(f"line {lineno}: meta.arrival must be closed_loop|poisson|bursts, got {arrival!r}")
    conc = kwargs.get("concurrency", 16)
    if not isinstance(conc, int) or isinstance(conc, bool) or conc < 1:
        raise TraceError(f"line {lineno}: meta.concurrency must be an integer >= 1, got {conc!r}")
    if not isinstance(kwargs.get("params", {}), dict):
        raise TraceError(f"line {lineno}: meta.params must be an object")
    return TraceMeta(**kwargs)


def _parse_record(obj: Any, lineno: int) -> TraceRecord:
    if not isinstance(obj, dict):
        raise TraceError(f"line {lineno}: record must be a JSON object")
    kwargs: dict[str, Any] = {}
    for key, value in obj.items():
        if key in _IGNORED:
            continue
        if key not in _FIELD_TYPES:
            raise TraceError(f"line {lineno}: unknown field {key!r}")
        if value is None:
            if key not in _NULLABLE:
                raise TraceError(f"line {lineno}: field {key!r} must not be null")
            kwargs[key] = None
            continue
        types = _FIELD_TYPES[key]
        if isinstance(value, bool) and bool not in types:
            raise TraceError(f"line {lineno}: field {key!r} must be {types[0].__name__}, got {value!r}")
        if not isinstance(value, types):
            raise TraceError(f"line {lineno}: field {key!r} must be {types[0].__name__}, got {value!r}")
        kwargs[key] = value
    # Plain Mooncake lines (timestamp, input_length, output_length) become one-turn sessions.
    if "output_length" not in kwargs:
        raise TraceError(f"line {lineno}: field 'output_length' is required")
    if "input_delta" not in kwargs:
        if "input_length" not in kwargs or "session_id" in kwargs:
            raise TraceError(f"line {lineno}: field 'input_delta' is required")
        kwargs["input_delta"] = kwargs["input_length"]
    kwargs.setdefault("session_id", f"line-{lineno}")
    kwargs.setdefault("turn", 0)
    if "hash_ids" in kwargs:
        ids = kwargs["hash_ids"]
        if ids and set(map(type, ids)) != {int}:  # C-speed check; excludes bool
            raise TraceError(f"line {lineno}: field 'hash_ids' must be a list of integers")
        kwargs["hash_ids"] = tuple(ids)
    for key in ("turn", "input_delta", "output_length", "input_length", "shared_prefix_tokens"):
        if key in kwargs and kwargs[key] < 0:
            raise TraceError(f"line {lineno}: field {key!r} must be >= 0, got {kwargs[key]}")
    if kwargs["output_length"] < 1:
        raise TraceError(f"line {lineno}: field 'output_length' must be >= 1, got {kwargs['output_length']}")
    for key in _TOKEN_FIELDS:
        if key in kwargs and kwargs[key] > MAX_TRACE_TOKENS:
            limit = f"must be at most {MAX_TRACE_TOKENS} tokens"
            raise TraceError(f"line {lineno}: field {key!r} {limit}, got {kwargs[key]}")
    for key in ("pre_gap_ms", "timestamp"):
        v = kwargs.get(key)
        if v is not None and (not math.isfinite(v) or v < 0):
            raise TraceError(f"line {lineno}: field {key!r} must be finite and >= 0, got {v!r}")
    if kwargs.get("role", "user") not in ROLES:
        raise TraceError(f"line {lineno}: field 'role' must be one of {ROLES}, got {kwargs['role']!r}")
    if kwargs.get("finish_reason", "stop") not in FINISH_REASONS:
        raise TraceError(
            f"line {lineno}: field 'finish_reason' must be one of {FINISH_REASONS}, got {kwargs['finish_reason']!r}"
        )
    if not kwargs["session_id"]:
        raise TraceError(f"line {lineno}: field 'session_id' must not be empty")
    if "tenant" in kwargs and not kwargs["tenant"]:
        raise TraceError(f"line {lineno}: field 'tenant' must not be empty")
    klass = kwargs.get("request_class")
    if klass is not None and klass not in CLASSES:
        raise TraceError(f"line {lineno}: field 'request_class' must be one of {CLASSES} or null, got {klass!r}")
    if klass is not None and (klass == "batch") != ("job" in kwargs and kwargs["job"] is not None):
        raise TraceError(f"line {lineno}: field 'request_class' {klass!r} needs a 'job' exactly when it is 'batch'")
    return TraceRecord(**kwargs)


def expected_input_length(rec: TraceRecord, prev: TraceRecord | None) -> int:
    """Prompt tokens of ``rec`` (template overhead excluded) given the session's previous turn."""
    if prev is None or rec.compaction:
        return rec.shared_prefix_tokens + rec.input_delta
    return prev.input_length + prev.output_length + rec.input_delta


def _where(idx: int, linenos: list[int] | None) -> str:
    return f"line {linenos[idx]}" if linenos else f"record {idx}"


def validate_structure(records: Iterable[TraceRecord], linenos: list[int] | None = None) -> tuple[TraceRecord, ...]:
    """Check turn order, parent links and derived lengths; fill a missing ``input_length``."""
    out: list[TraceRecord] = []
    last: dict[str, TraceRecord] = {}
    turns_of: dict[str, int] = {}
    for idx, rec in enumerate(records):
        where = _where(idx, linenos)
        prev = last.get(rec.session_id)
        want_turn = 0 if prev is None else prev.turn + 1
        if rec.turn != want_turn:
            raise TraceError(f"{where}: field 'turn' of session {rec.session_id!r} must be {want_turn}, got {rec.turn}")
        if rec.turn == 0 and rec.parent_session_id is not None:
            parent = rec.parent_session_id
            if parent == rec.session_id:
                raise TraceError(f"{where}: field 'parent_session_id' must differ from session_id")
            if parent not in turns_of:
                raise TraceError(f"{where}: field 'parent_session_id' {parent!r} must name an earlier session")
            if rec.parent_turn is None:
                raise TraceError(f"{where}: field 'parent_turn' is required with parent_session_id")
        if rec.parent_turn is not None and rec.parent_session_id is None:
            raise TraceError(f"{where}: field 'parent_turn' requires parent_session_id")
        if rec.blocks_parent and rec.parent_session_id is None:
            raise TraceError(f"{where}: field 'blocks_parent' requires parent_session_id")
        if rec.turn > 0 and prev is not None and rec.parent_session_id != prev.parent_session_id:
            raise TraceError(f"{where}: field 'parent_session_id' must be the same on every turn of a session")
        if prev is not None and rec.tenant != prev.tenant:
            raise TraceError(f"{where}: field 'tenant' must be the same on every turn of a session")
        if prev is not None and rec.klass != prev.klass:
            raise TraceError(f"{where}: field 'request_class' must be the same on every turn of a session")
        expected = expected_input_length(rec, prev)
        if rec.input_length == 0 and expected > 0:
            rec = attrs.evolve(rec, input_length=expected)
        elif rec.input_length != expected:
            raise TraceError(f"{where}: field 'input_length' must be {expected} (derived), got {rec.input_length}")
        last[rec.session_id] = rec
        turns_of[rec.session_id] = rec.turn + 1
        out.append(rec)
    # parent_turn must exist in the parent (checked once all parent turns are known).
    for idx, rec in enumerate(out):
        owner, at = rec.parent_session_id, rec.parent_turn
        if rec.turn == 0 and owner is not None and at is not None and at >= turns_of[owner]:
            raise TraceError(f"{_where(idx, linenos)}: field 'parent_turn' {at} is beyond the last turn of {owner!r}")
    return tuple(out)


def iter_lines(fh: TextIO) -> Iterator[tuple[int, Any]]:
    lineno = 0
    while True:
        try:
            line = fh.readline()
        except UnicodeDecodeError:  # a binary file given as a trace: a TraceError, not a traceback
            # (the decoder reads ahead: the line it reports is not necessarily the bad one)
            raise TraceError("not UTF-8 text (is this a trace?)") from None
        if not line:
            return
        lineno += 1
        if lineno == 1:  # a leading byte-order mark (an editor's UTF-8 export), as configs and batch files
            line = line.removeprefix("\ufeff")
        line = line.strip()
        if not line:
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"line {lineno}: invalid JSON ({exc.msg})") from None


def read_trace(fh: TextIO) -> Trace:
    meta = TraceMeta()
    records: list[TraceRecord] = []
    linenos: list[int] = []
    for lineno, obj in iter_lines(fh):
        if isinstance(obj, dict) and set(obj) == {"meta"}:
            if records:
                raise TraceError(f"line {lineno}: the meta line must come before every record")
            meta = _parse_meta(obj["meta"], lineno)
            continue
        records.append(_parse_record(obj, lineno))
        linenos.append(lineno)
    if not records:
        raise TraceError("trace holds no records")
    checked = validate_structure(records, linenos)
    for rec, lineno in zip(checked, linenos, strict=True):
        if rec.input_length > MAX_TRACE_TOKENS:  # each count is bounded, the history they add up to too
            raise TraceError(
                f"line {lineno}: field 'input_length' (the prompt: shared prefix + history + input_delta) must be at "
                f"most {MAX_TRACE_TOKENS} tokens, got {rec.input_length} (session {rec.session_id!r}, turn {rec.turn})"
            )
    return Trace(meta=meta, records=checked)


def load_trace(path: str) -> Trace:
    with open(path, encoding="utf-8") as fh:
        return read_trace(fh)


def merge_traces(traces: Sequence[tuple[str, Trace]]) -> Trace:
    """One trace holding every session of ``traces`` (``(name, trace)`` pairs, e.g. file paths).

    Records keep their order, trace by trace; ``hash_ids`` of each later trace are shifted past the
    earlier ones' (block ids are only comparable within one trace).  Every trace keeps its own
    clock: all start at t = 0.  The agent (non-batch) sessions must share one arrival mode, which
    becomes the merged trace's (with the concurrency of the first trace that has agents); batch
    records are open loop in any mode (docs/traces.md, "Merging").  A session id found in two
    traces is an error naming both.
    """
    if len(traces) < 2:
        raise TraceError(f"merge needs at least two traces, got {len(traces)}")
    owner: dict[str, int] = {}
    records: list[TraceRecord] = []
    agent_modes: list[tuple[str, TraceMeta]] = []
    shift = 0
    for index, (name, trace) in enumerate(traces):
        top = -1
        for rec in trace.records:
            first = owner.setdefault(rec.session_id, index)
            if first != index:
                raise TraceError(
                    f"{name} (trace {index + 1}): session_id {rec.session_id!r} is also in "
                    f"{traces[first][0]} (trace {first + 1})"
                )
            if rec.hash_ids:
                top = max(top, *rec.hash_ids)
                rec = attrs.evolve(rec, hash_ids=tuple(h + shift for h in rec.hash_ids))
            records.append(rec)
        shift += top + 1
        if any(not rec.is_batch for rec in trace.records):
            agent_modes.append((name, trace.meta))
    modes = {meta.arrival for _name, meta in agent_modes}
    if len(modes) > 1:
        named = ", ".join(f"{name} ({meta.arrival})" for name, meta in agent_modes)
        raise TraceError(f"meta.arrival: the agent sessions of merged traces must share one arrival mode, got {named}")
    base = agent_modes[0][1] if agent_modes else TraceMeta(arrival="bursts", concurrency=traces[0][1].meta.concurrency)
    parts = [{"name": name, **{k: v for k, v in attrs.asdict(t.meta).items() if k != "params"}} for name, t in traces]
    meta = TraceMeta(
        profile="+".join(t.meta.profile for _name, t in traces),
        seed=None,
        programs=sum(t.meta.programs for _name, t in traces),
        arrival=base.arrival,
        concurrency=base.concurrency,
        params={"merged": parts},
    )
    return Trace(meta=meta, records=validate_structure(records))


class HashChain:
    """Mooncake-style block ids of a growing prompt made of ``(segment_key, tokens)`` pieces.

    Equal prefixes (same segment keys in the same order) get equal ids; ``ids`` maps each distinct
    chained block key to a small integer in order of first appearance (shared across the trace).
    Extending the chain only hashes the new blocks, so a session's turns cost O(new tokens).
    """

    def __init__(self, ids: dict[tuple[Any, ...], int], block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        self._ids = ids
        self._block = block_tokens
        self._full: list[int] = []
        self._parent = -1
        self._pieces: list[tuple[str, int, int]] = []
        self._fill = 0

    def extend(self, key: str, length: int) -> None:
        start = 0
        while start < length:
            take = min(self._block - self._fill, length - start)
            self._pieces.append((key, start, start + take))
            self._fill += take
            start += take
            if self._fill == self._block:
                self._parent = self._ids.setdefault((self._parent, tuple(self._pieces)), len(self._ids))
                self._full.append(self._parent)
                self._pieces, self._fill = [], 0

    def hash_ids(self) -> tuple[int, ...]:
        if not self._pieces:
            return tuple(self._full)
        last = self._ids.setdefault((self._parent, tuple(self._pieces)), len(self._ids))
        return (*self._full, last)


def compute_hash_ids(
    segments: list[tuple[str, int]], ids: dict[tuple[Any, ...], int], block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> tuple[int, ...]:
    """Block ids of one prompt given as ``(segment_key, tokens)`` pieces (see :class:`HashChain`)."""
    chain = HashChain(ids, block_tokens)
    for key, length in segments:
        chain.extend(key, length)
    return chain.hash_ids()
