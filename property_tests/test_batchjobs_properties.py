"""Properties of the seed-002 batch-job algorithm (actors.core.batchjobs, docs/batch.md §1).

``BatchJobsMachine`` drives a ``JobQueue`` and a ``DecodeEstimator`` with add / remove / pick /
observe / touch sequences and checks them against a naive model (plain lists, linear scans: the
seed's data structures without agentd's indexes):

* ``len(queue) == adds - removes``; jobs and per-job sizes agree with the model;
* a pick is a queued key or None, and None iff the queue is empty or the budget is 0;
* a pick equals the naive model's: the first cold-start request in bucket scan order, else the
  best fit in the first job of ``order_jobs`` (so a non-cold pick's job is that first job);
* the estimator never holds more than ``max_jobs`` jobs other than ``__default__`` and evicts
  exactly the model's least recently used job; predictions equal the model's EWMA;
* determinism: replaying the recorded operations into fresh objects gives the same picks.

Plus stateless properties of the reserve: ``min(margin, max) <= reserve <= max`` and the
admission budget is never negative.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event as label
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actors.core.batchjobs import (
    COLD_START_PREDICTION,
    COLD_START_REQUESTS_PER_JOB,
    DEFAULT_JOB,
    EWMA_ALPHA,
    MAX_SAMPLES_PER_JOB,
    DecodeEstimator,
    JobQueue,
    admission_budget_tokens,
    order_jobs,
    request_reserve_blocks,
    reserve_blocks,
)

JOBS = st.sampled_from(["a", "b", "c", DEFAULT_JOB])
PROMPTS = st.sampled_from([0, 1, 16, 50, 100, 101, 200, 1000, 5000])
# the thresholds the machine draws, and their neighbours, so that equality cases are met
BUDGETS = st.one_of(st.just(0), st.sampled_from([1, 100, 101, 4096, 4097]), st.integers(1, 8000))
DECODES = st.one_of(st.sampled_from([1, 2, 32, 33, 128, 200, 201]), st.integers(0, 400))


class NaiveModel:
    """The seed's structures as plain lists: job -> {length -> [keys]} in creation order."""

    def __init__(self, max_jobs: int) -> None:
        self.buckets: dict[str, dict[int, list[int]]] = {}
        self.adds: dict[str, int] = {}
        self.cold: dict[str, set[int]] = {}
        self.where: dict[int, tuple[str, int]] = {}
        self.max_jobs = max_jobs
        self.stats: dict[str, tuple[int, float]] = {}
        self.lru: list[str] = []  # non-default jobs holding stats, least recently used first

    def add(self, key: int, job: str, prompt: int) -> None:
        if job not in self.buckets:
            self.buckets[job], self.adds[job], self.cold[job] = {}, 0, set()
        self.buckets[job].setdefault(prompt, []).append(key)
        self.adds[job] += 1
        if self.adds[job] <= COLD_START_REQUESTS_PER_JOB:
            self.cold[job].add(key)
        self.where[key] = (job, prompt)

    def remove(self, key: int) -> None:
        job, prompt = self.where.pop(key)
        self.buckets[job][prompt].remove(key)
        self.cold[job].discard(key)
        if not self.buckets[job][prompt]:
            del self.buckets[job][prompt]
        if not self.buckets[job]:
            del self.buckets[job], self.adds[job], self.cold[job]

    def predict(self, job: str) -> int:
        return int(self.stats[job][1]) if job in self.stats else COLD_START_PREDICTION

    def pick(self, budget: int, low: int, short: int) -> int | None:
        if budget == 0 or not self.buckets:
            return None
        for job, bucket in self.buckets.items():
            for keys in bucket.values():
                for key in keys:
                    if key in self.cold[job]:
                        return key
        first = self.order({j: self.predict(j) for j in self.buckets}, budget, low, short)[0]
        fitting = [n for n in self.buckets[first] if n <= budget]
        length = max(fitting) if fitting else min(self.buckets[first])
        return self.buckets[first][length][0]

    @staticmethod
    def order(preds: dict[str, int], budget: int, low: int, short: int) -> list[str]:
        """The seed's job order as one stable sort key (an independent statement of ``order_jobs``)."""
        prioritize_long = budget > low
        classes = {pred > short for pred in preds.values()}

        def key(job: str) -> tuple[int, int]:
            pred = preds[job]
            if len(classes) == 2:
                return (0 if (pred > short) == prioritize_long else 1, -pred)
            return (0, -pred if prioritize_long else pred)

        return sorted(preds, key=key)

    def use(self, job: str) -> None:
        if job in self.lru:
            self.lru.remove(job)
            self.lru.append(job)

    def observe(self, job: str, x: int) -> str | None:
        evicted = None
        if job not in self.stats:
            if job != DEFAULT_JOB and self.max_jobs and len(self.lru) >= self.max_jobs:
                evicted = self.lru.pop(0)
                del self.stats[evicted]
            self.stats[job] = (1, float(x))
            if job != DEFAULT_JOB:
                self.lru.append(job)
            return evicted
        n, ewma = self.stats[job]
        if n < MAX_SAMPLES_PER_JOB:
            self.stats[job] = (n + 1, EWMA_ALPHA * x + (1 - EWMA_ALPHA) * ewma)
        self.use(job)
        return None


def replay(ops: list[tuple[Any, ...]], max_jobs: int, low: int, short: int) -> list[int | None]:
    queue: JobQueue[int] = JobQueue()
    est = DecodeEstimator(max_jobs)
    picks: list[int | None] = []
    for op in ops:
        if op[0] == "add":
            queue.add(op[1], op[2], op[3])
            est.touch(op[2])
        elif op[0] == "remove":
            queue.remove(op[1])
        elif op[0] == "observe":
            est.observe(op[1], op[2])
        elif op[0] == "touch":
            est.touch(op[1])
        else:
            picks.append(queue.pick(op[1], est, low_available_tokens_threshold=low, short_decode_token_threshold=short))
    return picks


class BatchJobsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue: JobQueue[int] = JobQueue()
        self.next_key = 0
        self.n_adds = 0
        self.n_removes = 0
        self.ops: list[tuple[Any, ...]] = []
        self.picks: list[int | None] = []

    @initialize(
        max_jobs=st.integers(0, 3),
        low=st.sampled_from([1, 100, 4096]),
        short=st.sampled_from([1, 32, 128, 200]),
        backlog=st.lists(st.tuples(JOBS, PROMPTS), max_size=24),
    )
    def setup(self, max_jobs: int, low: int, short: int, backlog: list[tuple[str, int]]) -> None:
        self.max_jobs, self.low, self.short = max_jobs, low, short
        self.est = DecodeEstimator(max_jobs)
        self.model = NaiveModel(max_jobs)
        # A backlog whose cold-start requests are already admitted, so that ordered picks come early.
        for job, prompt in backlog:
            self.add_one(job, prompt)
        while (key := self.pick_one(10**6, False)) is not None and self.queue.is_cold_start(key):
            self.pick_one(10**6, True)

    @rule(job=JOBS, prompts=st.lists(PROMPTS, min_size=1, max_size=6))
    def add(self, job: str, prompts: list[int]) -> None:
        for prompt in prompts:
            self.add_one(job, prompt)

    def add_one(self, job: str, prompt: int) -> None:
        key = self.next_key
        self.next_key += 1
        self.queue.add(key, job, prompt)
        self.est.touch(job)
        self.model.add(key, job, prompt)
        self.model.use(job)
        self.n_adds += 1
        self.ops.append(("add", key, job, prompt))

    @precondition(lambda self: len(self.model.where) > 0)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model.where)))
        assert self.queue.remove(key)
        self.model.remove(key)
        self.n_removes += 1
        self.ops.append(("remove", key))

    @rule(key=st.integers(-3, -1))
    def remove_unknown(self, key: int) -> None:
        assert not self.queue.remove(key)

    @rule(budget=BUDGETS, admit=st.booleans())
    def pick(self, budget: int, admit: bool) -> None:
        self.pick_one(budget, admit)

    @rule(budget=BUDGETS, n=st.integers(1, 8))
    def admit_several(self, budget: int, n: int) -> None:
        """One scheduling step admitting up to ``n`` picks under the same budget."""
        for _ in range(n):
            if self.pick_one(budget, True) is None:
                break

    def pick_one(self, budget: int, admit: bool) -> int | None:
        got = self.queue.pick(
            budget, self.est, low_available_tokens_threshold=self.low, short_decode_token_threshold=self.short
        )
        self.picks.append(got)
        self.ops.append(("pick", budget))
        assert (got is None) == (budget == 0 or len(self.queue) == 0)
        assert got == self.model.pick(budget, self.low, self.short)
        if got is None:
            return None
        assert got in self.queue
        cold = self.queue.is_cold_start(got)
        label("pick: cold start" if cold else f"pick: first of {len(self.queue.jobs())} ordered jobs")
        job = self.queue.job_of(got)
        assert job is not None
        if not cold:
            assert not any(self.model.cold[j] for j in self.model.buckets)
            preds = {j: self.est.predict(j) for j in self.queue.jobs()}
            assert job == order_jobs(preds, budget, self.low, self.short)[0]
            assert order_jobs(preds, budget, self.low, self.short) == self.model.order(
                preds, budget, self.low, self.short
            )
        if admit:  # the caller admits the pick: pop it
            self.queue.remove(got)
            self.model.remove(got)
            self.n_removes += 1
            self.ops.append(("remove", got))
        return got

    @rule(job=JOBS, tokens=DECODES)
    def observe(self, job: str, tokens: int) -> None:
        evicted = self.est.observe(job, tokens)
        assert evicted == self.model.observe(job, tokens)
        assert evicted != DEFAULT_JOB
        self.ops.append(("observe", job, tokens))

    @rule(job=JOBS)
    def touch(self, job: str) -> None:
        self.est.touch(job)
        self.model.use(job)
        self.ops.append(("touch", job))

    @invariant()
    def sizes_agree(self) -> None:
        if not hasattr(self, "model"):
            return
        assert len(self.queue) == self.n_adds - self.n_removes == len(self.model.where)
        assert self.queue.jobs() == tuple(self.model.buckets)
        for job, bucket in self.model.buckets.items():
            assert self.queue.job_size(job) == sum(len(keys) for keys in bucket.values())
        for key, (job, prompt) in self.model.where.items():
            assert self.queue.job_of(key) == job and self.queue.prompt_tokens_of(key) == prompt
            assert self.queue.is_cold_start(key) == (key in self.model.cold[job])

    @invariant()
    def estimator_is_bounded_and_agrees(self) -> None:
        if not hasattr(self, "model"):
            return
        others = [j for j in self.est.jobs() if j != DEFAULT_JOB]
        if self.max_jobs:
            assert len(others) <= self.max_jobs
        assert others == self.model.lru
        for job in ("a", "b", "c", DEFAULT_JOB):
            assert self.est.predict(job) == self.model.predict(job)
            stats = self.est.stats(job)
            assert (stats is None) == (job not in self.model.stats)
            if stats is not None:
                assert stats.samples <= MAX_SAMPLES_PER_JOB

    def teardown(self) -> None:
        if hasattr(self, "model"):
            assert replay(self.ops, self.max_jobs, self.low, self.short) == self.picks


TestBatchJobsMachine = BatchJobsMachine.TestCase
TestBatchJobsMachine.settings = settings(max_examples=100, stateful_step_count=40)


# --------------------------------------------------------------------------------------------
# Reserve and admission budget
# --------------------------------------------------------------------------------------------

RUNNING = st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 6000)), max_size=20)


@settings(max_examples=100)
@given(
    running=RUNNING,
    block_size=st.sampled_from([1, 16, 128]),
    max_scheduled=st.integers(1, 4096),
    lookahead=st.integers(0, 8),
    margin=st.integers(0, 20),
    max_blocks=st.integers(1, 64),
    free_blocks=st.integers(0, 10_000),
)
def test_reserve_is_within_bounds(
    running: list[tuple[int, int]],
    block_size: int,
    max_scheduled: int,
    lookahead: int,
    margin: int,
    max_blocks: int,
    free_blocks: int,
) -> None:
    per_request = [request_reserve_blocks(p, c, block_size, max_scheduled, lookahead) for p, c in running]
    for blocks in per_request:  # at most the blocks of the largest possible next round
        assert 0 <= blocks <= -(-max(max_scheduled, 1 + lookahead) // block_size)
    reserve = reserve_blocks(per_request, margin, max_blocks)
    assert min(margin, max_blocks) <= reserve <= max_blocks
    budget = admission_budget_tokens(free_blocks, reserve, block_size)
    assert budget >= 0 and budget % block_size == 0
    assert (budget == 0) == (free_blocks <= reserve)
