"""Queue ETA: how long a queued Program request is expected to wait (docs/program-scheduling.md §13).

A queued request waits until its Program is admitted; an admission takes every waiting request
of the Program at once, so the unit of the queue is the Program.  A waiting Program waits for its
rank (``last_target``, its **line**): admission resumes Programs on their previous rank first
(docs/program-scheduling.md §3, §7).  Its **position** is 1 + the number of Programs ahead of it
in its line, in the admission (resume) order, which already orders classes, priorities, tenants
and MRU/FCFS (docs/priority.md §1, docs/program-scheduling.md §5).  Admission passes run at every
tick (``metrics_interval_seconds``, with a fresh observation) and at completions, so

    eta = to_tick                       when the line, up to and including it, fits the rank now
    eta = to_tick + position x d        otherwise

* ``to_tick``: the time to the next tick (``last tick + metrics_interval_seconds``; one interval
  before the first tick).  A Program that fits the rank's free capacity and its Program count now
  is held back only by what the next pass re-checks (the growth reserve, the waiting gate, a stale
  ledger): it goes at the next tick, unless the rank's waiting gate is closed for longer: then at
  the first tick after the engine's completions have brought its queue below the threshold
  (:func:`gate_open_in`, :func:`completion_interval`; docs/program-scheduling.md §13, "The waiting
  gate");
* ``d``: the line's **drain interval**, the wait per position of Programs that did not fit, learned
  online from admissions: when a request that was told a blocked ETA is admitted, ``max(0, wait -
  to_tick) / position`` (both as told) is one sample;
* a :class:`DrainWindow` keeps the last ``WINDOW`` samples per line (bounded memory);
  ``d = (sum + PRIOR_WEIGHT x prior) / (count + PRIOR_WEIGHT)``: the prior counts as
  ``PRIOR_WEIGHT`` samples, so it decides before the first sample and fades after a few.

The prior (``eta_queue.prior_interval``) is the force-resume estimate's drain, ``max(1, R) /
throughput`` of the rank (each Program ahead needs about ``R`` rounds, docs/program-scheduling.md
§5), or ``DEFAULT_PRIOR_INTERVAL`` while the rank's request window is not full.

Accuracy: the first ETA told to a request is remembered (:class:`FirstEta`); when that request is
admitted, ``|first eta - actual wait| / actual wait`` goes into a bounded window of recent errors
(:class:`EtaBook`), whose median the diagnostics report.

Pure: no clock, no I/O; values are frozen, the one mutable holder is :class:`EtaBook` (owned by the
scheduler state, written only inside ``step``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from attrs import frozen

from actors.core.ids import RequestId

WINDOW = 32  # drain intervals kept per queue
PRIOR_WEIGHT = 2.0  # the prior counts as this many intervals
DEFAULT_PRIOR_INTERVAL = 5.0  # seconds per position while no rank knows its throughput
ACCURACY_WINDOW = 4096  # recent relative errors kept for the diagnostics' median
MAX_ETA_SECONDS = 1e9  # an ETA is always finite

QueueKey = tuple[str, str]  # Program.queued_in: (RANK_QUEUE, target id) | (GLOBAL_QUEUE, pool); (LINE, target id)
LINE = "line"  # the drain windows' key kind: one line per rank
POOLED = (LINE, "*")  # every line's samples together: what a line with few samples shrinks to
LINE_WEIGHT = 1.0  # a line's own window shrinks to the pooled drain with this weight


@frozen
class DrainWindow:
    """One line's recent drain samples (seconds of wait per position beyond the next tick)."""

    intervals: tuple[float, ...] = ()
    observed: int = 0  # samples ever pushed


@frozen
class QueueEta:
    """A queued request's place in line and expected wait, told to the waiting handler."""

    position: int  # 1 = the next Program of its line
    eta_seconds: float
    drain_interval_seconds: float
    to_tick_seconds: float = 0.0
    blocked: bool = True  # the line up to it does not fit the rank now
    # expected to leave its line by a cross-rank move before its turn there (it may then be told
    # less than the Program ahead of it, which cannot move: docs/program-scheduling.md §13, "Moves")
    moved: bool = False


@frozen
class FirstEta:
    """The first ETA a request was told, to compare with its actual wait at admission."""

    eta_seconds: float
    queued_at: float
    line: str | None = None  # the rank it waited for
    position: int = 1
    to_tick_seconds: float = 0.0
    blocked: bool = False


def observe(w: DrainWindow, sample: float, limit: int = WINDOW) -> DrainWindow:
    """One more drain sample (finite, >= 0; others are ignored)."""
    if not (math.isfinite(sample) and sample >= 0):
        return w
    intervals = (*w.intervals, sample)
    if len(intervals) > limit:
        intervals = intervals[-limit:]
    return DrainWindow(intervals=intervals, observed=w.observed + 1)


def drain_interval(w: DrainWindow, prior: float, weight: float = PRIOR_WEIGHT) -> float:
    """The drain interval ``d`` (seconds per position): the window's mean shrunk to ``prior``,
    which counts as ``weight`` samples."""
    if not (math.isfinite(prior) and prior > 0):
        prior = DEFAULT_PRIOR_INTERVAL
    return (math.fsum(w.intervals) + weight * prior) / (len(w.intervals) + weight)


def eta_seconds(
    position: int,
    interval: float,
    to_tick: float = 0.0,
    blocked: bool = True,
    release_in: float | None = None,
    departure_in: float | None = None,
) -> float:
    """The expected wait of position ``position`` (>= 1): ``to_tick``, plus ``position x interval``
    when the line up to it does not fit now (or, when known, ``departure_in``: the time by which
    the rank's Programs are expected to have left enough room, :func:`departure_in`); or
    ``release_in``, when sooner (the acting Programs whose TTL deadlines come first free what the
    line needs: their pauses run an admission pass)."""
    if position < 1:
        raise ValueError(f"position must be >= 1 (got {position})")
    if blocked and departure_in is not None and math.isfinite(departure_in):
        eta = max(0.0, departure_in)
    else:
        eta = max(0.0, to_tick) + (position * interval if blocked else 0.0)
    if release_in is not None and 0.0 <= release_in < eta:
        eta = release_in
    if not math.isfinite(eta) or eta < 0:
        return MAX_ETA_SECONDS
    return min(eta, MAX_ETA_SECONDS)


@frozen
class Departure:
    """A Program that may leave a rank: ``at`` seconds from now, freeing ``tokens``.  ``certain``
    departures (an acting Program's TTL pause, a Program marked to pause when idle) leave at
    ``at``; the others are Programs with a request in flight: ``at`` is the expected end of that
    request, after which the Program leaves with the rank's release probability, or is held and
    comes back for another request one service ``cycle`` later (docs/program-scheduling.md §13)."""

    at: float
    tokens: float
    certain: bool = False
    acting: bool = False  # a certain departure that is an acting Program's TTL pause


MAX_CYCLES = 16  # completions per in-flight Program a departure estimate looks ahead


def mean_residual(samples: Iterable[float], elapsed: float) -> float | None:
    """The mean residual service time of a request that has run ``elapsed`` seconds:
    ``mean(x - elapsed)`` over the samples ``x > elapsed``; 0 when it has outlived every sample
    (it is due), None without samples."""
    total, n, any_sample = 0.0, 0, False
    for x in samples:
        any_sample = True
        if x > elapsed:
            total += x - elapsed
            n += 1
    if not any_sample:
        return None
    return total / n if n else 0.0


def departure_in(
    departures: Iterable[Departure], count_over: float, tokens_over: float, release_probability: float, cycle: float
) -> float | None:
    """The median time until departures free what a blocked line is over by (``count_over``
    Programs and ``tokens_over`` private tokens), or None when they do not within the look-ahead.

    Certain departures accumulate; an uncertain one (a completion) frees enough only together with
    the certain ones before it, and does so with ``release_probability``, independently per
    completion: each completion that would suffice multiplies the probability that the line is
    still blocked by ``1 - release_probability``; the answer is the first time it is <= 1/2.
    A held Program completes again every ``cycle`` seconds (at most ``MAX_CYCLES`` times).  With
    ``release_probability`` 1 a completion is certain to free its Program and counts as a certain
    departure (it used to count only when it sufficed alone, so a lower probability, whose held
    Programs come back, could answer sooner).  When
    the certain departures alone suffice first, that is the answer, unless they are all acting
    Programs' TTL pauses: then None, as those are the ETA's release term, which counts only when
    sooner than the drain estimate (an acting Program held through a short tool usually comes back
    before its TTL runs out)."""
    q = min(1.0, max(0.0, release_probability)) if math.isfinite(release_probability) else 0.0
    events: list[tuple[float, int, float]] = []  # (at, 0 TTL pause | 1 other certain | 2 completion, tokens)
    for d in departures:
        if not (math.isfinite(d.at) and math.isfinite(d.tokens)):
            continue
        at = max(0.0, d.at)
        if d.certain:
            events.append((at, 0 if d.acting else 1, d.tokens))
        elif q >= 1:  # a completion that always releases is a certain departure: it accumulates
            events.append((at, 1, d.tokens))
        elif q > 0:
            # one completion only without a usable cycle (0 x an infinite cycle would be NaN)
            step = cycle if math.isfinite(cycle) and cycle > 0 else 0.0
            events.extend((at + k * step, 2, d.tokens) for k in range(MAX_CYCLES if step > 0 else 1))
    events.sort()
    count, freed, blocked, ttl_only = 0, 0.0, 1.0, True
    for at, kind, tokens in events:
        if kind < 2:
            count += 1
            freed += tokens
            ttl_only = ttl_only and kind == 0
            if count >= count_over and freed >= tokens_over:
                # TTL pauses alone: the caller's release term (which counts only when sooner)
                return None if ttl_only else at
        elif count + 1 >= count_over and freed + tokens >= tokens_over:
            blocked *= 1.0 - q
            if blocked <= 0.5:
                return at
    return None


def completion_interval(samples: Iterable[tuple[float, float]], running: int) -> float | None:
    """The seconds between two completions of a rank's engine while it has work queued, from its
    recent requests ``(finished at, service seconds from dispatch to completion)`` in completion
    order: the mean gap between consecutive completions whose later request was already at the
    engine when the earlier one finished (dispatched before it); without such a pair, the
    shortest service time over the engine's ``running`` count (what one request takes there, shared
    by the requests it runs at once); None without samples."""
    gaps: list[float] = []
    shortest = math.inf
    previous: float | None = None
    for finished, service in samples:
        if not (math.isfinite(finished) and math.isfinite(service)):
            continue
        if previous is not None and finished - service < previous and finished >= previous:
            gaps.append(finished - previous)
        shortest = min(shortest, max(0.0, service))
        previous = finished
    if gaps:
        return math.fsum(gaps) / len(gaps)
    if math.isfinite(shortest):
        return shortest / max(1, running)
    return None


def gate_open_in(waiting: int, threshold: int, interval: float, since_completion: float | None) -> float | None:
    """Seconds until the engine's waiting count falls below ``threshold`` (the waiting gate opens,
    docs/program-scheduling.md §3), or None when it should be below it already: ``waiting`` (the
    engine's queue now) minus ``threshold - 1`` completions are needed, one every ``interval``
    seconds, the first ``interval`` after the last one (``since_completion`` seconds ago; at once
    when that is longer ago; ``interval`` from now when there was none)."""
    needed = waiting - threshold + 1
    if needed <= 0:
        return None
    if not (math.isfinite(interval) and interval >= 0):
        return None
    first = max(0.0, interval - since_completion) if since_completion is not None else interval
    return first + (needed - 1) * interval


def retry_after_seconds(eta: float) -> float:
    """``Retry-After`` from an ETA: rounded up to whole seconds, at least 1."""
    return float(max(1, math.ceil(eta))) if math.isfinite(eta) else MAX_ETA_SECONDS


def relative_error(eta: float, actual: float) -> float | None:
    """``|eta - actual| / actual``; None when the request did not wait (``actual <= 0``)."""
    if not actual > 0:
        return None
    return abs(eta - actual) / actual


class EtaBook:
    """The queue-ETA state of one scheduler: drain windows, first ETAs, recent errors."""

    __slots__ = ("windows", "first", "errors", "samples", "bound_rejections", "last_tick_at", "gates")

    def __init__(self) -> None:
        self.windows: dict[QueueKey, DrainWindow] = {}
        self.first: dict[RequestId, FirstEta] = {}  # queued requests told an ETA, until they leave
        self.errors: deque[float] = deque(maxlen=ACCURACY_WINDOW)
        self.samples = 0  # admitted queued requests ever compared
        self.bound_rejections = 0  # requests refused at once by x-agentd-max-queue-seconds
        self.last_tick_at: float | None = None  # the last RepairTick: admission passes run at ticks
        # per rank: (the time of the last observation seen at a tick, whether it showed the waiting
        # gate closed, whether the one before did): a gate closed at two observations in a row is
        # told as lasting (docs/program-scheduling.md §13, "The waiting gate")
        self.gates: dict[str, tuple[float, bool, bool]] = {}

    def window(self, key: QueueKey) -> DrainWindow:
        return self.windows.get(key, EMPTY_WINDOW)

    def admitted(self, rid: RequestId, now: float) -> tuple[FirstEta, float, float] | None:
        """The request left the queue admitted: (its first ETA, actual wait, relative error), or
        None when it was never told an ETA (admitted in its arrival step) or did not wait.  A
        blocked first ETA also gives its line a drain sample."""
        first = self.first.pop(rid, None)
        if first is None:
            return None
        actual = now - first.queued_at
        if first.blocked and first.line is not None:
            sample = max(0.0, actual - first.to_tick_seconds) / max(1, first.position)
            for key in ((LINE, first.line), POOLED):  # the line's window and the pooled one
                self.windows[key] = observe(self.window(key), sample)
        err = relative_error(first.eta_seconds, actual)
        if err is None:
            return None
        self.errors.append(err)
        self.samples += 1
        return first, actual, err

    def median_error(self) -> float | None:
        return median(self.errors)


EMPTY_WINDOW = DrainWindow()


def median(values: Iterable[float]) -> float | None:
    """The median (the mean of the two middle values of an even count); None when empty."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def quantile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1); None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
