"""Queue ETA: how long a queued Program request is expected to wait (docs/program-scheduling.md §13).

A queued request waits until its Program leaves the queue it sits in (its rank's queue, or the
model pool's global queue): an admission takes every waiting request of the Program at once, so
the unit of the queue is the Program.  Its **position** is 1 + the number of Programs ahead of it
in the admission (resume) order, which already orders classes, priorities, tenants and the
ordinary MRU/FCFS key (docs/priority.md §1, docs/program-scheduling.md §5).  Its ETA is

    eta(position) = position x d

where ``d`` is the queue's **drain interval**, the mean time between two exits of a waiting
Program while the queue is not empty, learned online per queue:

* an *exit* is the admission of a Program that waited (queued in an earlier step); a Program
  queued and admitted in the same step never waited and says nothing about the drain;
* the interval of an exit is ``now - max(previous exit, start of the busy period)``, where the busy
  period starts when the queue turns non-empty (so idle time between busy periods never counts);
* a :class:`DrainWindow` keeps the last ``WINDOW`` intervals (bounded memory);
* ``d = (sum of the window + PRIOR_WEIGHT x prior) / (window size + PRIOR_WEIGHT)``: the prior
  counts as ``PRIOR_WEIGHT`` samples, so it decides before the first exit and fades after a few.

The prior (computed by the caller from the ranks, ``eta_queue.prior_interval``) is the
force-resume estimate's drain, ``max(1, R) / throughput`` (each Program ahead needs about ``R``
rounds, docs/program-scheduling.md §5), or ``DEFAULT_PRIOR_INTERVAL`` while no rank has a full
request window.

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

QueueKey = tuple[str, str]  # Program.queued_in: (RANK_QUEUE, target id) | (GLOBAL_QUEUE, pool)


@frozen
class DrainWindow:
    """The drain of one queue: its recent exit intervals and where the current interval began."""

    intervals: tuple[float, ...] = ()
    last_exit_at: float | None = None
    exits: int = 0  # exits ever observed


@frozen
class QueueEta:
    """A queued request's place in line and expected wait, told to the waiting handler."""

    position: int  # 1 = the next Program to leave the queue
    eta_seconds: float
    drain_interval_seconds: float


@frozen
class FirstEta:
    """The first ETA a request was told, to compare with its actual wait at admission."""

    eta_seconds: float
    queued_at: float


def queue_exit(w: DrainWindow, now: float, busy_start: float, limit: int = WINDOW) -> DrainWindow:
    """A Program that waited in this line left it at ``now`` (admitted); the line has been busy
    (some Program waiting in it) since ``busy_start``."""
    start = busy_start if w.last_exit_at is None else max(w.last_exit_at, busy_start)
    interval = max(0.0, now - start)
    intervals = (*w.intervals, interval)
    if len(intervals) > limit:
        intervals = intervals[-limit:]
    return DrainWindow(intervals=intervals, last_exit_at=now, exits=w.exits + 1)


def drain_interval(w: DrainWindow, prior: float) -> float:
    """The drain interval ``d`` (seconds per position): the window's mean shrunk to ``prior``."""
    if not (math.isfinite(prior) and prior > 0):
        prior = DEFAULT_PRIOR_INTERVAL
    return (math.fsum(w.intervals) + PRIOR_WEIGHT * prior) / (len(w.intervals) + PRIOR_WEIGHT)


def eta_seconds(position: int, interval: float) -> float:
    """The expected wait of position ``position`` (>= 1) with drain interval ``interval``."""
    if position < 1:
        raise ValueError(f"position must be >= 1 (got {position})")
    eta = position * interval
    if not math.isfinite(eta) or eta < 0:
        return MAX_ETA_SECONDS
    return min(eta, MAX_ETA_SECONDS)


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

    __slots__ = ("windows", "first", "errors", "samples", "bound_rejections")

    def __init__(self) -> None:
        self.windows: dict[QueueKey, DrainWindow] = {}
        self.first: dict[RequestId, FirstEta] = {}  # queued requests told an ETA, until they leave
        self.errors: deque[float] = deque(maxlen=ACCURACY_WINDOW)
        self.samples = 0  # admitted queued requests ever compared
        self.bound_rejections = 0  # requests refused at once by x-agentd-max-queue-seconds

    def window(self, key: QueueKey) -> DrainWindow:
        return self.windows.get(key, EMPTY_WINDOW)

    def exited(self, key: QueueKey, now: float, busy_start: float) -> None:
        self.windows[key] = queue_exit(self.window(key), now, busy_start)

    def admitted(self, rid: RequestId, now: float) -> tuple[FirstEta, float, float] | None:
        """The request left the queue admitted: (its first ETA, actual wait, relative error), or
        None when it was never told an ETA (admitted in its arrival step) or did not wait."""
        first = self.first.pop(rid, None)
        if first is None:
            return None
        actual = now - first.queued_at
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
