"""Batch jobs: the seed-002 algorithm as pure values and functions (docs/batch.md §1).

A batch request belongs to a **job**, named by a ``#job_name[NAME]#`` tag anywhere in its request
id (:func:`job_name`; untagged requests belong to :data:`DEFAULT_JOB`).  Three pieces follow the
seed's batch-job-aware scheduler:

* :class:`DecodeEstimator` predicts each job's decode length with an EWMA over the first
  :data:`MAX_SAMPLES_PER_JOB` natural completions (128 tokens until the first one).  Unlike the
  engine, which raises once more than ``max_jobs`` jobs were ever observed, it keeps at most
  ``max_jobs`` jobs' statistics and evicts the least recently used one; :data:`DEFAULT_JOB` is
  exempt from the limit.
* :class:`JobQueue` is the waiting queue: one bucket per job, each a map prompt length -> FIFO
  with the lengths kept sorted.  :meth:`JobQueue.pick` returns the key to admit next: cold-start
  requests first, then the first job of :func:`order_jobs` (LPT order switched by the admission
  budget) and, inside it, the best fit by prompt length.  It never refuses a request.
* :func:`request_reserve_blocks`, :func:`reserve_blocks` and :func:`admission_budget_tokens`
  compute the KV reserve kept for the running set and the admission budget left after it.

Everything here is pure (no clock, no I/O); the estimator and the queue are mutable objects with
a single writer, used by the scheduler and by the simulated backend alike.
"""

from __future__ import annotations

import re
from bisect import bisect_right, insort
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, Protocol, TypeVar

from attrs import frozen

DEFAULT_JOB = "__default__"
COLD_START_PREDICTION = 128
EWMA_ALPHA = 0.1
MAX_SAMPLES_PER_JOB = 10
COLD_START_REQUESTS_PER_JOB = 3

_JOB_TAG = re.compile(r"#job_name\[([^\[\]]+)\]#")


def job_name(request_id: str | None) -> str:
    """The job a request id names: the first ``#job_name[NAME]#`` tag anywhere, else ``__default__``.

    ``NAME`` is one or more characters other than ``[`` and ``]``; an empty tag names no job.
    """
    if not request_id:
        return DEFAULT_JOB
    m = _JOB_TAG.search(request_id)
    return m.group(1) if m is not None else DEFAULT_JOB


# --------------------------------------------------------------------------------------------
# Decode-length estimator (docs/batch.md §1.2)
# --------------------------------------------------------------------------------------------


@frozen
class JobStats:
    """One job's decode statistics: natural completions counted (at most 10) and their EWMA."""

    samples: int
    ewma: float


class Predictor(Protocol):
    """What :meth:`JobQueue.pick` needs of an estimator: a decode-length prediction per job."""

    def predict(self, job: str) -> int: ...


class DecodeEstimator:
    """Per-job EWMA of decode lengths with the seed's constants, bounded by LRU eviction.

    ``max_jobs`` bounds the jobs other than :data:`DEFAULT_JOB` that hold statistics (0 = no
    bound).  "Used" means observed or touched; a job without statistics has no slot to touch.
    """

    def __init__(self, max_jobs: int) -> None:
        if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 0:
            raise ValueError(f"max_jobs must be an integer >= 0 (got {max_jobs!r})")
        self.max_jobs = max_jobs
        self._default: JobStats | None = None
        # Least recently used first.
        self._stats: OrderedDict[str, JobStats] = OrderedDict()

    def predict(self, job: str) -> int:
        """128 until the job's first natural completion, then its EWMA truncated to an integer."""
        stats = self.stats(job)
        return COLD_START_PREDICTION if stats is None else int(stats.ewma)

    def observe(self, job: str, decode_tokens: int) -> str | None:
        """Record a naturally stopped completion (the caller filters ``finish_reason``).

        Returns the name of the job whose statistics were evicted to make room, else None.  After
        :data:`MAX_SAMPLES_PER_JOB` samples a job's statistics are frozen (the observation still
        counts as a use for the LRU order).
        """
        if isinstance(decode_tokens, bool) or not isinstance(decode_tokens, int) or decode_tokens < 0:
            raise ValueError(f"decode_tokens must be an integer >= 0 (got {decode_tokens!r})")
        old = self.stats(job)
        if old is None:
            new = JobStats(1, float(decode_tokens))
        elif old.samples >= MAX_SAMPLES_PER_JOB:
            new = old
        else:
            new = JobStats(old.samples + 1, EWMA_ALPHA * decode_tokens + (1 - EWMA_ALPHA) * old.ewma)
        if job == DEFAULT_JOB:
            self._default = new
            return None
        evicted: str | None = None
        if old is None and self.max_jobs and len(self._stats) >= self.max_jobs:
            evicted, _ = self._stats.popitem(last=False)
        self._stats[job] = new
        self._stats.move_to_end(job)
        return evicted

    def touch(self, job: str) -> None:
        """Mark ``job`` as recently used (a request of it arrived); no effect without statistics."""
        if job in self._stats:
            self._stats.move_to_end(job)

    def stats(self, job: str) -> JobStats | None:
        return self._default if job == DEFAULT_JOB else self._stats.get(job)

    @property
    def tracked_jobs(self) -> int:
        """Jobs other than :data:`DEFAULT_JOB` holding statistics (at most ``max_jobs`` when bounded)."""
        return len(self._stats)

    def jobs(self) -> tuple[str, ...]:
        """Jobs holding statistics: ``__default__`` first if observed, then least to most recently used."""
        head = (DEFAULT_JOB,) if self._default is not None else ()
        return head + tuple(self._stats)


# --------------------------------------------------------------------------------------------
# Job order (docs/batch.md §1.3)
# --------------------------------------------------------------------------------------------


def order_jobs(preds: Mapping[str, int], budget_tokens: int, low_threshold: int, short_threshold: int) -> list[str]:
    """The seed's job order (its code, not its docstring).

    A job is long when its prediction is > ``short_threshold`` (equality is short).  Long jobs go
    first when ``budget_tokens > low_threshold``.  With both classes present each class is sorted
    by prediction descending; with one class only, descending when long jobs go first, ascending
    otherwise.  Ties keep the mapping's order.
    """
    long_jobs = [j for j, p in preds.items() if p > short_threshold]
    short_jobs = [j for j, p in preds.items() if p <= short_threshold]
    prioritize_long = budget_tokens > low_threshold
    if long_jobs and short_jobs:
        longs = sorted(long_jobs, key=preds.__getitem__, reverse=True)
        shorts = sorted(short_jobs, key=preds.__getitem__, reverse=True)
        return longs + shorts if prioritize_long else shorts + longs
    return sorted(long_jobs or short_jobs, key=preds.__getitem__, reverse=prioritize_long)


# --------------------------------------------------------------------------------------------
# The waiting queue (docs/batch.md §1.3)
# --------------------------------------------------------------------------------------------

K = TypeVar("K", bound=Hashable)


class _Bucket(Generic[K]):
    """One job's requests: prompt length -> FIFO (lengths in creation order), lengths sorted."""

    __slots__ = ("fifos", "length_rank", "lengths", "adds", "cold", "size")

    def __init__(self) -> None:
        self.fifos: dict[int, OrderedDict[K, None]] = {}
        self.length_rank: dict[int, int] = {}  # creation stamp of each length's FIFO: the scan order
        self.lengths: list[int] = []  # sorted
        self.adds = 0  # adds since the bucket was created (re-adds included)
        self.cold: dict[K, None] = {}  # queued keys among the first COLD_START_REQUESTS_PER_JOB adds
        self.size = 0


@frozen
class _Entry:
    job: str
    prompt_tokens: int
    seq: int  # global add stamp: FIFO order within one length


class JobQueue(Generic[K]):
    """The seed's batch waiting queue: per-job buckets of prompt-length FIFOs.

    A bucket is deleted when it empties, which resets the job's cold-start count.  Adding a key
    that is already queued is a caller error (``ValueError``); otherwise the queue never refuses.
    """

    def __init__(self) -> None:
        self._buckets: dict[str, _Bucket[K]] = {}  # creation order
        self._entries: dict[K, _Entry] = {}
        self._stamp = 0

    def _next_stamp(self) -> int:
        self._stamp += 1
        return self._stamp

    def add(self, key: K, job: str, prompt_tokens: int) -> None:
        if key in self._entries:
            raise ValueError(f"request {key!r} is already queued")
        if not isinstance(job, str) or not job:
            raise ValueError(f"job must be a non-empty string (got {job!r})")
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be an integer >= 0 (got {prompt_tokens!r})")
        bucket = self._buckets.get(job)
        if bucket is None:
            bucket = self._buckets[job] = _Bucket()
        fifo = bucket.fifos.get(prompt_tokens)
        if fifo is None:
            fifo = bucket.fifos[prompt_tokens] = OrderedDict()
            bucket.length_rank[prompt_tokens] = self._next_stamp()
            insort(bucket.lengths, prompt_tokens)
        fifo[key] = None
        bucket.size += 1
        bucket.adds += 1
        if bucket.adds <= COLD_START_REQUESTS_PER_JOB:
            bucket.cold[key] = None
        self._entries[key] = _Entry(job, prompt_tokens, self._next_stamp())

    def remove(self, key: K) -> bool:
        """Remove ``key``; False when it is not queued.  An emptied bucket is deleted."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        bucket = self._buckets[entry.job]
        fifo = bucket.fifos[entry.prompt_tokens]
        del fifo[key]
        bucket.cold.pop(key, None)
        bucket.size -= 1
        if not fifo:
            del bucket.fifos[entry.prompt_tokens]
            del bucket.length_rank[entry.prompt_tokens]
            bucket.lengths.pop(bisect_right(bucket.lengths, entry.prompt_tokens) - 1)
        if bucket.size == 0:
            del self._buckets[entry.job]
        return True

    def pick(
        self,
        budget_tokens: int,
        estimator: Predictor,
        *,
        low_available_tokens_threshold: int,
        short_decode_token_threshold: int,
    ) -> K | None:
        """The key to admit next (not removed), or None when the budget is 0 or the queue is empty.

        1. a cold-start key, whatever its size: jobs in bucket creation order, inside a job the
           bucket's scan order (lengths in creation order, FIFO within a length);
        2. else the first job of :func:`order_jobs` over the queued jobs' predictions and, in it,
           the oldest request of the largest prompt length <= ``budget_tokens``, or of the
           smallest length when none fits.
        """
        if budget_tokens <= 0 or not self._buckets:
            return None
        for bucket in self._buckets.values():
            if bucket.cold:
                return self._first_cold(bucket)
        preds = {job: estimator.predict(job) for job in self._buckets}
        first = order_jobs(preds, budget_tokens, low_available_tokens_threshold, short_decode_token_threshold)[0]
        bucket = self._buckets[first]
        i = bisect_right(bucket.lengths, budget_tokens)
        length = bucket.lengths[i - 1] if i > 0 else bucket.lengths[0]
        return next(iter(bucket.fifos[length]))

    def _first_cold(self, bucket: _Bucket[K]) -> K:
        """The bucket's cold-start key met first in its scan order (at most 3 candidates)."""

        def scan_position(key: K) -> tuple[int, int]:
            entry = self._entries[key]
            return bucket.length_rank[entry.prompt_tokens], entry.seq

        return min(bucket.cold, key=scan_position)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def jobs(self) -> tuple[str, ...]:
        """Jobs with queued requests, in bucket creation order."""
        return tuple(self._buckets)

    def job_size(self, job: str) -> int:
        bucket = self._buckets.get(job)
        return 0 if bucket is None else bucket.size

    def job_of(self, key: K) -> str | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.job

    def prompt_tokens_of(self, key: K) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.prompt_tokens

    def is_cold_start(self, key: K) -> bool:
        """Whether ``key`` is queued as one of its job's cold-start requests."""
        entry = self._entries.get(key)
        return entry is not None and key in self._buckets[entry.job].cold


# --------------------------------------------------------------------------------------------
# KV reservation and admission budget (docs/batch.md §1.4)
# --------------------------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def request_reserve_blocks(
    prompt_tokens: int,
    computed_tokens: int,
    block_size: int,
    max_scheduled_tokens: int,
    lookahead_tokens: int = 0,
) -> int:
    """KV blocks one running request needs for the round after this one (seed's reserver)."""
    if block_size <= 0 or max_scheduled_tokens <= 0:
        raise ValueError(
            f"block_size and max_scheduled_tokens must be > 0 (got {block_size!r}, {max_scheduled_tokens!r})"
        )
    if prompt_tokens < 0 or computed_tokens < 0 or lookahead_tokens < 0:
        raise ValueError(
            "prompt_tokens, computed_tokens and lookahead_tokens must be >= 0 "
            f"(got {prompt_tokens!r}, {computed_tokens!r}, {lookahead_tokens!r})"
        )

    def tokens_at(computed: int) -> int:
        return min(prompt_tokens - computed, max_scheduled_tokens) if computed < prompt_tokens else 1 + lookahead_tokens

    after = computed_tokens + tokens_at(computed_tokens)
    following = tokens_at(after)
    pos = after % block_size
    room = block_size - pos if pos > 0 else 0
    return _cdiv(following - room, block_size) if following > room else 0


def reserve_blocks(per_request_blocks: Iterable[int], margin_blocks: int, max_blocks: int) -> int:
    """The running set's reserve: ``min(sum + margin, max)``."""
    return min(sum(per_request_blocks) + margin_blocks, max_blocks)


def admission_budget_tokens(free_blocks: int, reserve: int, block_size: int) -> int:
    """Tokens admissible after the reserve: ``max(0, (free - reserve) * block_size)``."""
    return max(0, (free_blocks - reserve) * block_size)
