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
  ledger): it goes at the next tick;
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

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

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
# what decided an ETA (QueueEta.basis, docs/program-scheduling.md §13)
TICK = "tick"  # the line fits now: the next tick's pass
RELEASE = "release"  # fits now, and an acting Program's TTL pause runs a pass before the tick
DEPART = "depart"  # the median time departures let the admission check pass
DRAIN = "drain"  # the learned drain interval per position
FORCED = "forced"  # the force-resume deadline


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
    basis: str = "drain"  # what decided it: TICK, RELEASE, DEPART, DRAIN or FORCED


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
    A held Program completes again every ``cycle`` seconds (at most ``MAX_CYCLES`` times).  When
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
        elif q > 0:
            cycles = 1 if q >= 1 or not (math.isfinite(cycle) and cycle > 0) else MAX_CYCLES
            events.extend((at + k * cycle, 2, d.tokens) for k in range(cycles))
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


# ---- admission by departures (docs/program-scheduling.md §13, "When the line is admitted") ------

MAX_LEAVERS = 6  # Programs of a rank whose departures are combined (the earliest to leave)
MAX_ATOMS = 64  # departure times kept per Program (the most probable)
SHIFT_WINDOW = 32  # usage shifts at observations kept per rank
MAX_TICKS = 16  # observations (ticks) an admission estimate looks ahead

Atom = tuple[float, float]  # (seconds from now, probability)


@frozen
class Leaver:
    """A Program active on a line's rank that may leave it: when (``atoms``: seconds from now and
    probability; the probabilities sum to at most 1, the rest is "not within the look-ahead"), and
    what its leaving frees: its private ``tokens`` and its remaining continuous ``rounds`` (its
    share of the growth reserve, docs/program-scheduling.md §3)."""

    atoms: tuple[Atom, ...]
    tokens: float
    rounds: int = 0

    def cdf(self, t: float) -> float:
        """The probability that it has left by ``t``."""
        return min(1.0, math.fsum(p for at, p in self.atoms if at <= t))


def busy_atoms(residual: float, release_probability: float, cycle: float, cycles: int = MAX_CYCLES) -> tuple[Atom, ...]:
    """When a busy Program leaves: its request ends in ``residual`` seconds and it then leaves with
    ``release_probability`` (independently per completion), else it is held and completes again
    ``cycle`` seconds later, up to ``cycles`` completions.  Empty when it never leaves."""
    q = min(1.0, max(0.0, release_probability)) if math.isfinite(release_probability) else 0.0
    if q <= 0 or not math.isfinite(residual):
        return ()
    if q >= 1 or not (math.isfinite(cycle) and cycle > 0):
        return ((max(0.0, residual), q),)
    atoms: dict[float, float] = {}
    weight = 1.0
    for k in range(max(1, cycles)):
        atoms[max(0.0, residual) + k * cycle] = weight * q
        weight *= 1.0 - q
    return _top_atoms(atoms)


def acting_atoms(
    to_deadline: float, elapsed: float, ttl: float, gaps: Sequence[float], then: Sequence[Atom]
) -> tuple[Atom, ...]:
    """When an acting Program leaves: at its TTL deadline (``to_deadline`` from now), unless its
    gap (from ``gaps``, the gaps after its tool or the rank's request intervals) ends within its
    ``ttl``; given that it has been idle ``elapsed`` seconds, the probability of leaving is the
    share of the gaps longer than ``elapsed`` that are also longer than ``ttl`` (1 without such
    gaps).  Coming back, it is busy again: ``then`` are the departures of a Program busy from the
    mean of those shorter gaps (seconds from now, as if it had come back at once)."""
    longer = [g for g in gaps if g > elapsed]
    if not longer:
        return ((max(0.0, to_deadline), 1.0),)
    back = [g for g in longer if g <= ttl]
    p_leave = 1.0 - len(back) / len(longer)
    atoms: dict[float, float] = {}
    if p_leave > 0:
        atoms[max(0.0, to_deadline)] = p_leave
    if back:
        shift = math.fsum(back) / len(back) - elapsed
        for at, p in then:
            key = max(0.0, at + shift)
            atoms[key] = atoms.get(key, 0.0) + (1.0 - p_leave) * p
    return _top_atoms(atoms)


def _top_atoms(atoms: dict[float, float]) -> tuple[Atom, ...]:
    items = [(at, p) for at, p in atoms.items() if p > 0 and math.isfinite(at)]
    if len(items) > MAX_ATOMS:
        items = sorted(items, key=lambda a: -a[1])[:MAX_ATOMS]
    items.sort()
    return tuple(items)


Slack = Callable[[int, float, int], float]  # (Programs left, tokens freed, rounds freed) -> tokens to spare


def admission_in(
    leavers: Sequence[Leaver],
    slack: Slack,
    shifts: Sequence[float] = (),
    next_observation: float = 0.0,
    interval: float = 1.0,
    gate_closed: bool = False,
    gate_open: float = 1.0,
) -> float | None:
    """The median time at which the line's candidate is admitted, or None when the departures do
    not make it likely within the look-ahead.

    ``slack(left, tokens, rounds)`` is the admission check (:func:`actors.core.ledger.admission_fit`)
    on the rank after ``left`` of the ``leavers`` (at most ``MAX_LEAVERS``, the earliest) have left,
    freeing ``tokens`` private tokens and ``rounds`` continuous rounds: the tokens to spare, < 0
    (or -inf for the Program count) when it does not pass.  The leavers leave independently; at
    time ``t`` the line passes with the probability that the set that has left by then leaves a
    slack >= 0.  From the ``next_observation`` on, the rank's usage is rebased on the engine's:
    the slack must cover a shift drawn from the rank's recent ``shifts`` (none: 0).  The waiting
    gate (``gate_closed`` now) admits nobody before the next observation, and each observation
    after it opens it with probability ``gate_open``."""
    chosen = sorted((lv for lv in leavers if lv.atoms), key=lambda lv: lv.atoms[0][0])[:MAX_LEAVERS]
    n = len(chosen)
    subsets: list[tuple[int, float]] = []  # (bitmask, slack)
    for mask in range(1 << n):
        left, tokens, rounds = 0, 0.0, 0
        for i in range(n):
            if mask >> i & 1:
                left += 1
                tokens += chosen[i].tokens
                rounds += chosen[i].rounds
        subsets.append((mask, slack(left, tokens, rounds)))
    ordered_shifts = sorted(x for x in shifts if math.isfinite(x))
    first = max(0.0, next_observation)
    ticks_ahead = {first + k * interval for k in range(MAX_TICKS)} if interval > 0 else {first}
    times = sorted({at for lv in chosen for at, _p in lv.atoms} | ticks_ahead)
    before = 0.0  # the probability of an admission before the observation
    curve: list[tuple[float, float]] = []
    for t in times:
        cdf = [lv.cdf(t) for lv in chosen]
        observed = t >= next_observation
        total = 0.0
        for mask, room in subsets:
            if room == -math.inf:
                continue
            weight = 1.0
            for i in range(n):
                weight *= cdf[i] if mask >> i & 1 else 1.0 - cdf[i]
                if weight == 0.0:
                    break
            if weight == 0.0:
                continue
            if not observed or not ordered_shifts:
                total += weight if room >= 0 else 0.0
            else:
                total += weight * bisect.bisect_right(ordered_shifts, room) / len(ordered_shifts)
        if not observed:
            before = p = 0.0 if gate_closed else total
        else:
            ticks = 1 + (int((t - next_observation) / interval) if interval > 0 else 0)
            opened = 1.0 - (1.0 - min(1.0, max(0.0, gate_open))) ** ticks
            p = max(before, total * opened)
        if curve and p < curve[-1][1]:
            p = curve[-1][1]
        curve.append((t, p))
        if p >= 0.5 and POINT == "median":
            break
    return point_of(curve)


POINT = "median"  # EXPERIMENT


def point_of(curve: list[tuple[float, float]], within: float = 0.3) -> float | None:
    if not curve or curve[-1][1] < 0.5:
        return None
    if POINT == "median":
        for t, p in curve:
            if p >= 0.5:
                return t
        return None
    # the time most likely within ``within`` of the actual wait: max P(X in [eta/(1+w), eta/(1-w)])
    times = [t for t, _ in curve]

    def at(x: float) -> float:
        i = bisect.bisect_right(times, x) - 1
        return curve[i][1] if i >= 0 else 0.0

    best, best_mass = None, -1.0
    for t, _p in curve:
        if t <= 0:
            continue
        lo, hi = t / (1 + within), t / (1 - within)
        i = bisect.bisect_left(times, lo) - 1
        below = curve[i][1] if i >= 0 else 0.0
        mass = at(hi) - below
        if mass > best_mass + 1e-12:
            best, best_mass = t, mass
    if best is None:
        return curve[0][0]
    return best


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

    __slots__ = (
        "windows",
        "first",
        "errors",
        "samples",
        "bound_rejections",
        "last_tick_at",
        "shifts",
        "gates",
    )

    def __init__(self) -> None:
        self.windows: dict[QueueKey, DrainWindow] = {}
        # per rank: the usage shifts at its observations, whether the waiting gate was open after them (§13)
        self.shifts: dict[str, deque[float]] = {}
        self.gates: dict[str, deque[bool]] = {}
        self.first: dict[RequestId, FirstEta] = {}  # queued requests told an ETA, until they leave
        self.errors: deque[float] = deque(maxlen=ACCURACY_WINDOW)
        self.samples = 0  # admitted queued requests ever compared
        self.bound_rejections = 0  # requests refused at once by x-agentd-max-queue-seconds
        self.last_tick_at: float | None = None  # the last RepairTick: admission passes run at ticks

    def observed(self, target: str, shift: float, gate_open: bool) -> None:
        """An observation of rank ``target`` moved its usage by ``shift`` tokens; the waiting gate
        is open after it (or not)."""
        if math.isfinite(shift):
            w = self.shifts.get(target)
            if w is None:
                w = self.shifts[target] = deque(maxlen=SHIFT_WINDOW)
            w.append(shift)
        g = self.gates.get(target)
        if g is None:
            g = self.gates[target] = deque(maxlen=SHIFT_WINDOW)
        g.append(gate_open)

    def gate_open_share(self, target: str) -> float:
        """The share of the rank's recent observations after which the waiting gate was open (1 without any)."""
        g = self.gates.get(target)
        return sum(g) / len(g) if g else 1.0

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
