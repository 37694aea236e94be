"""Where a Program's time goes (docs/program-scheduling.md §14): a pure per-Program time account.

Every Program key (model pool, program id) gets one :class:`ProgramTime` record at its first
arrival.  The record partitions the Program's wall time, from that first arrival up to the last
event that touched it, into five parts:

* ``queue``: nothing in flight, requests waiting for admission in the router (observed);
* ``prefill``: the part of a request's service time before its first token (dispatch to first
  streamed chunk: connection, engine queue, prefill), minus ``recompute`` (observed when the
  response streamed, else estimated from ``prefill_cost_model``);
* ``recompute``: the share of that prefill time spent on *recomputed* prompt tokens (estimated:
  prefill time x recomputed / uncached tokens);
* ``decode``: first streamed chunk to the end of the response (observed when streamed);
* ``between_turns``: nothing in flight or waiting, after a completion and before the next arrival
  (tool time, the human, blocking subagents; observed).

The record is a state machine over three phases (``IDLE``, ``QUEUED``, ``SERVING``) derived from
the Program's in-flight and waiting counts.  :func:`sync` closes the interval since the last sync
into the bucket of the phase it was in, then reads the new phase; ``scheduler.step`` calls it for
every Program the step touched, so the phase changes exactly when the Program changes.  Serving
time is kept unsplit (``serving_open``) until a completion splits it with that completion's
observations (:func:`attribute_completion`).  Invariant (property-tested)::

    queue + prefill + recompute + decode + between_turns + serving_open == since - started_at

The open interval (now - since) is shown separately; the idle tail after a Program's last turn is
never closed, so it is not counted as time between turns.

Recomputed tokens are prompt tokens that this Program already had in KV (the prompt and output of
its previous successful completion, ``held_tokens``) and that are not prefix-cache hits now:
``max(0, min(prompt, held) - cached)``.  They are attributed to the cause recorded when the
Program lost its placement (the first loss since its last completion): the acting TTL ran out
(``acting_ttl``: evicted while acting), capacity repair (``capacity_repair``), a higher class or
priority (``preemption``), any other pause or release (``paused``: segment yield, failure,
cancellation, failover, retention release); a request served on another rank than the one that
holds the KV is ``migration``; a miss while the Program never lost its placement is ``in_place``
(engine-side eviction or preemption, a changed prefix, block granularity).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from attrs import define, frozen

from actors.core.config import PrefillCostModel
from actors.core.costs import prefill_seconds
from actors.core.effects import TimeAttributed
from actors.core.ids import ProgramKey, ProgramRef, TargetId, redacted_id
from actors.core.model import (
    CAPACITY_REPAIR,
    PREFILL_REQUEUE,
    PRIORITY_PREEMPTION,
    TENANT_ISOLATION,
    TTL_EXPIRED,
    Usage,
)

# phases of a Program's timeline
IDLE = 0
QUEUED = 1
SERVING = 2
PHASE_NAMES = ("between_turns", "queue", "serving")

PART_QUEUE = "queue"
PART_PREFILL = "prefill"
PART_RECOMPUTE = "recompute"
PART_DECODE = "decode"
PART_BETWEEN_TURNS = "between_turns"
PARTS = (PART_QUEUE, PART_PREFILL, PART_RECOMPUTE, PART_DECODE, PART_BETWEEN_TURNS)

CAUSE_ACTING_TTL = "acting_ttl"
CAUSE_PAUSED = "paused"
CAUSE_CAPACITY_REPAIR = "capacity_repair"
CAUSE_PREEMPTION = "preemption"
CAUSE_MIGRATION = "migration"
CAUSE_IN_PLACE = "in_place"
CAUSES = (CAUSE_ACTING_TTL, CAUSE_PAUSED, CAUSE_CAPACITY_REPAIR, CAUSE_PREEMPTION, CAUSE_MIGRATION, CAUSE_IN_PLACE)

TOKEN_KINDS = ("cached", "new", "recomputed")

_CAUSE_OF_REASON = {
    TTL_EXPIRED: CAUSE_ACTING_TTL,
    CAPACITY_REPAIR: CAUSE_CAPACITY_REPAIR,
    PRIORITY_PREEMPTION: CAUSE_PREEMPTION,
    TENANT_ISOLATION: CAUSE_PREEMPTION,  # paused for another tenant (docs/priority.md §3)
    PREFILL_REQUEUE: CAUSE_PREEMPTION,  # its prefill taken back for another tenant (docs/priority.md §3)
}

# how many live Programs the diagnostics list (the longest wall times)
DIAGNOSTICS_TOP_PROGRAMS = 20


def cause_of(reason: str) -> str:
    """The recomputation cause of a Program that lost its placement for ``reason``."""
    return _CAUSE_OF_REASON.get(reason, CAUSE_PAUSED)


@define(slots=True, eq=False)
class ProgramTime:
    """The time account of one Program key (kept across its generations)."""

    started_at: float
    since: float
    phase: int = IDLE
    queue: float = 0.0
    prefill: float = 0.0
    recompute: float = 0.0
    decode: float = 0.0
    between_turns: float = 0.0
    serving_open: float = 0.0  # serving time not yet split by a completion
    # closed since the last report (``TimeAttributed``): queue, between turns, failover prefill
    unreported_queue: float = 0.0
    unreported_between_turns: float = 0.0
    unreported_prefill: float = 0.0
    completions: int = 0
    estimated_splits: int = 0  # completions whose prefill/decode split came from the cost model
    unreported_usage: int = 0  # completions without prompt or cached tokens (no token split)
    cached_tokens: int = 0
    new_tokens: int = 0
    recomputed_tokens: int = 0
    recomputed_by_cause: dict[str, int] | None = None
    recompute_seconds_by_cause: dict[str, float] | None = None
    held_tokens: int | None = None  # prompt + output of the last successful completion
    kv_rank: TargetId | None = None  # the rank that served it
    loss_cause: str | None = None  # why the Program lost its placement since then

    def parts(self) -> tuple[float, float, float, float, float]:
        return (self.queue, self.prefill, self.recompute, self.decode, self.between_turns)


class TimeTotals:
    """Sums over every Program of what the effects reported (equal to the ``/metrics`` counters)."""

    __slots__ = (
        "queue",
        "prefill",
        "recompute",
        "decode",
        "between_turns",
        "tokens",
        "recomputed_by_cause",
        "recompute_seconds_by_cause",
        "programs",
        "completions",
    )

    def __init__(self) -> None:
        self.queue = self.prefill = self.recompute = self.decode = self.between_turns = 0.0
        self.tokens = dict.fromkeys(TOKEN_KINDS, 0)
        self.recomputed_by_cause = dict.fromkeys(CAUSES, 0)
        self.recompute_seconds_by_cause = dict.fromkeys(CAUSES, 0.0)
        self.programs = 0
        self.completions = 0

    @property
    def parts(self) -> dict[str, float]:
        return dict(
            zip(PARTS, (self.queue, self.prefill, self.recompute, self.decode, self.between_turns), strict=True)
        )


class TimeBook:
    """Every Program's :class:`ProgramTime` (by key) and the totals; owned by ``SchedulerState``."""

    __slots__ = ("records", "totals")

    def __init__(self) -> None:
        self.records: dict[ProgramKey, ProgramTime] = {}
        self.totals = TimeTotals()

    def record(self, key: ProgramKey, now: float) -> ProgramTime:
        rec = self.records.get(key)
        if rec is None:
            rec = self.records[key] = ProgramTime(started_at=now, since=now)
            self.totals.programs += 1
        return rec

    def forget(self, key: ProgramKey) -> None:
        """The Program's generation history was pruned: its account goes with it."""
        self.records.pop(key, None)


def advance(rec: ProgramTime, now: float) -> None:
    """Close ``[since, now]`` into the bucket of the phase the Program was in."""
    dt = now - rec.since
    if dt > 0.0:
        phase = rec.phase
        if phase == SERVING:
            rec.serving_open += dt
        elif phase == QUEUED:
            rec.queue += dt
            rec.unreported_queue += dt
        else:
            rec.between_turns += dt
            rec.unreported_between_turns += dt
    rec.since = now


def sync(rec: ProgramTime, now: float, in_flight: int, waiting: int) -> None:
    """Close the interval since the last sync, then enter the phase the counts give.

    Serving time left unsplit when nothing is in flight any more (requests lost to a failover:
    no completion counted them) goes to ``prefill``: no first token was seen for it."""
    if now != rec.since:
        advance(rec, now)
    phase = rec.phase = SERVING if in_flight > 0 else QUEUED if waiting > 0 else IDLE
    if phase != SERVING and rec.serving_open > 0.0:
        rec.prefill += rec.serving_open
        rec.unreported_prefill += rec.serving_open
        rec.serving_open = 0.0


def lost_placement(rec: ProgramTime, reason: str) -> None:
    """The Program left its placement for ``reason``: the first loss since its last completion
    names the cause of the recomputation its next request will pay."""
    if rec.loss_cause is None:
        rec.loss_cause = _CAUSE_OF_REASON.get(reason, CAUSE_PAUSED)


def attribute_completion(
    rec: ProgramTime,
    totals: TimeTotals,
    ref: ProgramRef,
    now: float,
    target: TargetId,
    success: bool,
    usage: Usage,
    decode_seconds: float | None,
    estimated_prompt_tokens: int,
    model: PrefillCostModel,
) -> TimeAttributed:
    """Split the serving time since the last completion with this completion's observations, add
    it to the totals and report it with what was closed since the last report.

    ``decode`` is the observed decode time (capped at the serving time); without it (not streamed,
    failed) the prefill is priced by the cost model for the uncached tokens and decode is the rest.
    The prefill time is shared between new and recomputed uncached tokens by their counts."""
    advance(rec, now)
    span = rec.serving_open
    rec.serving_open = 0.0
    rec.completions += 1
    prompt = usage.prompt_tokens
    cached = usage.cached_prompt_tokens
    recomputed = new = 0
    cause: str | None = None
    if prompt is not None and cached is not None:
        prompt = max(0, prompt)
        cached = min(max(0, cached), prompt)
        held = rec.held_tokens
        if held is not None:
            recomputed = max(0, min(prompt, held) - cached)
        new = prompt - cached - recomputed
        if recomputed:
            if rec.kv_rank is not None and target != rec.kv_rank:
                cause = CAUSE_MIGRATION
            else:
                cause = rec.loss_cause if rec.loss_cause is not None else CAUSE_IN_PLACE
        rec.cached_tokens += cached
        rec.new_tokens += new
        rec.recomputed_tokens += recomputed
        uncached = prompt - cached
    else:
        rec.unreported_usage += 1
        cached = 0
        uncached = max(0, prompt if prompt is not None else estimated_prompt_tokens)
    estimated = decode_seconds is None
    if decode_seconds is None:
        rec.estimated_splits += 1
        decode = max(0.0, span - prefill_seconds(uncached, model))
    else:
        decode = min(span, max(0.0, decode_seconds))
    prefill = span - decode
    recompute = prefill * recomputed / uncached if recomputed and uncached > 0 else 0.0
    prefill -= recompute
    rec.decode += decode
    rec.prefill += prefill
    rec.recompute += recompute
    t = totals
    t.completions += 1
    tokens = t.tokens
    tokens["cached"] += cached
    tokens["new"] += new
    if cause is not None:
        if rec.recomputed_by_cause is None or rec.recompute_seconds_by_cause is None:
            rec.recomputed_by_cause = {}
            rec.recompute_seconds_by_cause = {}
        rec.recomputed_by_cause[cause] = rec.recomputed_by_cause.get(cause, 0) + recomputed
        rec.recompute_seconds_by_cause[cause] = rec.recompute_seconds_by_cause.get(cause, 0.0) + recompute
        tokens["recomputed"] += recomputed
        t.recomputed_by_cause[cause] += recomputed
        t.recompute_seconds_by_cause[cause] += recompute
    if success and prompt is not None:
        # the KV now holds this prompt and its output on `target`
        rec.held_tokens = prompt + (usage.completion_tokens or 0)
        rec.kv_rank = target
        rec.loss_cause = None
    queue, between = rec.unreported_queue, rec.unreported_between_turns
    prefill += rec.unreported_prefill
    rec.unreported_queue = rec.unreported_between_turns = rec.unreported_prefill = 0.0
    t.queue += queue
    t.prefill += prefill
    t.recompute += recompute
    t.decode += decode
    t.between_turns += between
    return TimeAttributed(
        program=ref,
        target_id=target,
        queue_seconds=queue,
        prefill_seconds=prefill,
        recompute_seconds=recompute,
        decode_seconds=decode,
        between_turns_seconds=between,
        completed=True,
        cause=cause,
        recomputed_tokens=recomputed,
        cached_tokens=cached,
        new_tokens=new,
        estimated_split=estimated,
    )


def release_report(
    rec: ProgramTime, totals: TimeTotals, ref: ProgramRef, target: TargetId | None, now: float
) -> TimeAttributed | None:
    """A generation is released (idle): close a queue or serving interval (an idle one stays open:
    the idle tail after the last turn is not time between turns unless the Program comes back) and
    report what was closed since the last report, if anything."""
    if rec.phase != IDLE:
        sync(rec, now, 0, 0)
    queue, between, prefill = rec.unreported_queue, rec.unreported_between_turns, rec.unreported_prefill
    if not (queue or between or prefill):
        return None
    rec.unreported_queue = rec.unreported_between_turns = rec.unreported_prefill = 0.0
    totals.queue += queue
    totals.prefill += prefill
    totals.between_turns += between
    return TimeAttributed(
        program=ref,
        target_id=target,
        queue_seconds=queue,
        prefill_seconds=prefill,
        recompute_seconds=0.0,
        decode_seconds=0.0,
        between_turns_seconds=between,
    )


# ---- diagnostics ---------------------------------------------------------------------------------


@frozen
class ProgramTimeSnapshot:
    """One live Program's account (docs/program-scheduling.md §14)."""

    program: str  # redacted id
    generation: int
    wall_seconds: float  # first arrival to now
    queue_seconds: float
    prefill_seconds: float
    recompute_seconds: float
    decode_seconds: float
    between_turns_seconds: float
    serving_unsplit_seconds: float  # in flight since the last completion
    open_phase: str  # the phase since the last event; its time is in open_seconds
    open_seconds: float
    completions: int
    estimated_splits: int
    cached_tokens: int
    new_tokens: int
    recomputed_tokens: int
    recomputed_tokens_by_cause: dict[str, int]
    recompute_seconds_by_cause: dict[str, float]
    pending_loss_cause: str | None


@frozen
class TimeSplitSnapshot:
    """Totals over every Program (what ``/metrics`` counts) and the live Programs with the
    longest wall times."""

    programs_seen: int
    completions: int
    seconds: dict[str, float]
    prompt_tokens: dict[str, int]
    recomputed_tokens_by_cause: dict[str, int]
    recompute_seconds_by_cause: dict[str, float]
    top_programs: tuple[ProgramTimeSnapshot, ...]


def program_time_snapshot(ref: ProgramRef, rec: ProgramTime, now: float) -> ProgramTimeSnapshot:
    open_s = max(0.0, now - rec.since)
    return ProgramTimeSnapshot(
        program=redacted_id(ref),
        generation=ref.generation,
        wall_seconds=now - rec.started_at,
        queue_seconds=rec.queue,
        prefill_seconds=rec.prefill,
        recompute_seconds=rec.recompute,
        decode_seconds=rec.decode,
        between_turns_seconds=rec.between_turns,
        serving_unsplit_seconds=rec.serving_open,
        open_phase=PHASE_NAMES[rec.phase],
        open_seconds=open_s,
        completions=rec.completions,
        estimated_splits=rec.estimated_splits,
        cached_tokens=rec.cached_tokens,
        new_tokens=rec.new_tokens,
        recomputed_tokens=rec.recomputed_tokens,
        recomputed_tokens_by_cause=dict(sorted((rec.recomputed_by_cause or {}).items())),
        recompute_seconds_by_cause=dict(sorted((rec.recompute_seconds_by_cause or {}).items())),
        pending_loss_cause=rec.loss_cause,
    )


def time_split_snapshot(
    book: TimeBook, live: Iterable[ProgramRef], now: float, top: int = DIAGNOSTICS_TOP_PROGRAMS
) -> TimeSplitSnapshot:
    """The diagnostics view: totals plus the ``top`` live Programs by wall time (ties: by ref)."""
    rows: list[tuple[float, ProgramRef, ProgramTime]] = []
    for ref in live:
        rec = book.records.get(ref.key)
        if rec is not None:
            rows.append((now - rec.started_at, ref, rec))
    chosen = heapq.nsmallest(top, rows, key=lambda r: (-r[0], r[1]))  # ties: by (pool, id, generation)
    t = book.totals
    return TimeSplitSnapshot(
        programs_seen=t.programs,
        completions=t.completions,
        seconds=t.parts,
        prompt_tokens=dict(t.tokens),
        recomputed_tokens_by_cause=dict(t.recomputed_by_cause),
        recompute_seconds_by_cause=dict(t.recompute_seconds_by_cause),
        top_programs=tuple(program_time_snapshot(ref, rec, now) for _, ref, rec in chosen),
    )
