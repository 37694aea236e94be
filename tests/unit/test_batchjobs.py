"""The seed-002 algorithm (actors.core.batchjobs): the upstream test vectors plus agentd's differences."""

from __future__ import annotations

import pytest

from actors.core.batchjobs import (
    COLD_START_PREDICTION,
    COLD_START_REQUESTS_PER_JOB,
    DEFAULT_JOB,
    EWMA_ALPHA,
    MAX_SAMPLES_PER_JOB,
    DecodeEstimator,
    JobQueue,
    JobStats,
    admission_budget_tokens,
    job_name,
    order_jobs,
    request_reserve_blocks,
    reserve_blocks,
)

LOW, SHORT = 4096, 32  # the seed's default thresholds


def pick(q: JobQueue[str], budget: int, est: DecodeEstimator | None = None) -> str | None:
    return q.pick(
        budget,
        est if est is not None else DecodeEstimator(0),
        low_available_tokens_threshold=LOW,
        short_decode_token_threshold=SHORT,
    )


def test_constants_are_the_seeds() -> None:
    assert (COLD_START_PREDICTION, EWMA_ALPHA, MAX_SAMPLES_PER_JOB, COLD_START_REQUESTS_PER_JOB) == (128, 0.1, 10, 3)
    assert DEFAULT_JOB == "__default__"


# --------------------------------------------------------------------------------------------
# job_name
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_id", "job"),
    [
        ("req1#job_name[my_job]#", "my_job"),  # suffix (the upstream unit tests)
        ("#job_name[job_A]#req_001", "job_A"),  # prefix (the seed's doc)
        ("chatcmpl-x#job_name[mid]#-1a2b3c4d", "mid"),  # survives vLLM's id decoration
        ("#job_name[first]##job_name[second]#", "first"),  # first match wins
        ("a#job_name[]#b", DEFAULT_JOB),  # empty tag names no job
        ("#job_name[]##job_name[x]#", "x"),
        ("#job_name[a[b]#", DEFAULT_JOB),  # brackets are not allowed in a name
        ("#job_name[a]b]#", DEFAULT_JOB),
        ("#job_name[[a]]#", DEFAULT_JOB),
        ("#job_name[a]#", "a"),
        ("#job_name[with space & ünïcode]#", "with space & ünïcode"),
        ("job_name[a]", DEFAULT_JOB),  # the hashes are part of the tag
        ("#job_name[a]", DEFAULT_JOB),
        ("#JOB_NAME[a]#", DEFAULT_JOB),  # case-sensitive
        ("plain-id", DEFAULT_JOB),
        ("", DEFAULT_JOB),
        (None, DEFAULT_JOB),
    ],
)
def test_job_name(request_id: str | None, job: str) -> None:
    assert job_name(request_id) == job


# --------------------------------------------------------------------------------------------
# DecodeEstimator
# --------------------------------------------------------------------------------------------


def test_unobserved_job_predicts_the_cold_start_default() -> None:
    est = DecodeEstimator(20)
    assert est.predict("a") == 128
    assert est.stats("a") is None
    assert est.jobs() == ()


def test_ewma_vector_100_150_120() -> None:
    est = DecodeEstimator(20)
    est.observe("a", 100)
    assert est.stats("a") == JobStats(1, 100.0)
    assert est.predict("a") == 100
    est.observe("a", 150)
    s = est.stats("a")
    assert s is not None and s.samples == 2 and s.ewma == pytest.approx(105.0)
    est.observe("a", 120)
    s = est.stats("a")
    assert s is not None and s.samples == 3 and s.ewma == pytest.approx(106.5)
    assert est.predict("a") == 106  # truncation


def test_ewma_vector_10_20_30() -> None:
    est = DecodeEstimator(20)
    ewmas = []
    for x in (10, 20, 30):
        est.observe("a", x)
        s = est.stats("a")
        assert s is not None
        ewmas.append(s.ewma)
    assert ewmas == pytest.approx([10.0, 11.0, 12.9])
    assert est.predict("a") == 12


def test_fifty_equal_observations_stay_at_the_value() -> None:
    est = DecodeEstimator(20)
    for _ in range(50):
        est.observe("a", 100)
    assert est.predict("a") == 100
    s = est.stats("a")
    assert s is not None and s.samples == MAX_SAMPLES_PER_JOB


def test_samples_freeze_after_ten() -> None:
    est = DecodeEstimator(20)
    for _ in range(10):
        est.observe("a", 100)
    est.observe("a", 300)
    s = est.stats("a")
    assert s is not None and s.samples == 10 and s.ewma == pytest.approx(100.0)
    assert est.predict("a") == 100


def test_jobs_are_estimated_independently() -> None:
    est = DecodeEstimator(20)
    est.observe("a", 100)
    est.observe("b", 10)
    assert (est.predict("a"), est.predict("b"), est.predict("c")) == (100, 10, 128)


def test_zero_length_observation_is_allowed_and_bad_values_are_rejected() -> None:
    est = DecodeEstimator(20)
    est.observe("a", 0)
    assert est.predict("a") == 0
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="decode_tokens"):
            est.observe("a", bad)  # type: ignore[arg-type]
    for bad_max in (-1, True, 2.0):
        with pytest.raises(ValueError, match="max_jobs"):
            DecodeEstimator(bad_max)  # type: ignore[arg-type]


def test_lru_eviction_instead_of_raising() -> None:
    est = DecodeEstimator(2)
    assert est.observe("a", 10) is None
    assert est.observe("b", 20) is None
    assert est.observe("c", 30) == "a"  # the engine raises RuntimeError here
    assert est.jobs() == ("b", "c")
    assert est.stats("a") is None and est.predict("a") == 128


def test_observe_and_touch_refresh_the_lru_order() -> None:
    est = DecodeEstimator(2)
    est.observe("a", 10)
    est.observe("b", 20)
    est.touch("a")
    assert est.jobs() == ("b", "a")
    assert est.observe("c", 30) == "b"
    est.observe("a", 11)  # an observation is a use too
    assert est.jobs() == ("c", "a")
    for _ in range(12):  # ... even once frozen
        est.observe("c", 5)
    assert est.jobs() == ("a", "c")
    assert est.observe("d", 1) == "a"


def test_touch_without_stats_does_nothing() -> None:
    est = DecodeEstimator(1)
    est.touch("a")
    assert est.jobs() == ()
    est.observe("b", 1)
    est.touch("a")
    assert est.observe("a", 2) == "b"


def test_default_job_is_never_counted_nor_evicted() -> None:
    est = DecodeEstimator(1)
    assert est.observe(DEFAULT_JOB, 7) is None
    assert est.observe("a", 1) is None  # the default does not use the one slot
    assert est.observe("b", 2) == "a"
    assert est.jobs() == (DEFAULT_JOB, "b")
    assert est.predict(DEFAULT_JOB) == 7
    est.touch(DEFAULT_JOB)
    assert est.observe("c", 3) == "b"


def test_max_jobs_zero_is_unlimited() -> None:
    est = DecodeEstimator(0)
    for i in range(100):
        assert est.observe(f"j{i}", i) is None
    assert len(est.jobs()) == 100


# --------------------------------------------------------------------------------------------
# order_jobs (the seed's _sort_jobs)
# --------------------------------------------------------------------------------------------


def test_order_both_classes_high_budget_long_first_each_descending() -> None:
    assert order_jobs({"b": 50, "c": 10, "a": 100}, 5000, LOW, SHORT) == ["a", "b", "c"]


def test_order_both_classes_low_budget_short_first() -> None:
    assert order_jobs({"a": 100, "b": 10}, 3000, LOW, SHORT) == ["b", "a"]


def test_order_short_class_is_descending_when_both_present() -> None:
    # The seed's code (not its docstring): short jobs sorted by prediction descending.
    assert order_jobs({"s1": 5, "s2": 20, "l": 100}, 3000, LOW, SHORT) == ["s2", "s1", "l"]
    assert order_jobs({"s1": 5, "s2": 20, "l1": 50, "l2": 100}, 5000, LOW, SHORT) == ["l2", "l1", "s2", "s1"]


def test_order_only_long() -> None:
    preds = {"a": 50, "b": 200, "c": 100}
    assert order_jobs(preds, 5000, LOW, SHORT) == ["b", "c", "a"]
    assert order_jobs(preds, 3000, LOW, SHORT) == ["a", "c", "b"]


def test_order_only_short() -> None:
    preds = {"a": 20, "b": 5, "c": 32}
    assert order_jobs(preds, 5000, LOW, SHORT) == ["c", "a", "b"]
    assert order_jobs(preds, 3000, LOW, SHORT) == ["b", "a", "c"]


def test_order_thresholds_are_strict() -> None:
    # pred == short threshold is short; budget == low threshold does not prioritise long jobs.
    assert order_jobs({"s": 32, "l": 33}, 4096, LOW, SHORT) == ["s", "l"]
    assert order_jobs({"s": 32, "l": 33}, 4097, LOW, SHORT) == ["l", "s"]


def test_order_ties_keep_mapping_order() -> None:
    assert order_jobs({"x": 50, "y": 50, "z": 50}, 5000, LOW, SHORT) == ["x", "y", "z"]
    assert order_jobs({"x": 50, "y": 50, "z": 50}, 100, LOW, SHORT) == ["x", "y", "z"]
    assert order_jobs({}, 100, LOW, SHORT) == []


# --------------------------------------------------------------------------------------------
# JobQueue
# --------------------------------------------------------------------------------------------


def warm(q: JobQueue[str], job: str) -> None:
    """Use up a job's cold-start window with fillers, keeping its bucket alive with a huge, warm request."""
    fillers = [f"{job}-warm{i}" for i in range(COLD_START_REQUESTS_PER_JOB)]
    for k in fillers:
        q.add(k, job, 1)
    q.add(f"{job}-keep", job, 10**9)
    for k in fillers:
        q.remove(k)
    assert not q.is_cold_start(f"{job}-keep")


def best_fit_queue(lengths: list[int]) -> JobQueue[str]:
    q: JobQueue[str] = JobQueue()
    for i in range(COLD_START_REQUESTS_PER_JOB):  # the window, then removed
        q.add(f"w{i}", "j", 5)
    for n in lengths:
        q.add(f"p{n}", "j", n)
    for i in range(COLD_START_REQUESTS_PER_JOB):
        q.remove(f"w{i}")
    return q


@pytest.mark.parametrize(
    ("budget", "lengths", "picked"),
    [(200, [100], "p100"), (150, [50, 200], "p50"), (50, [100, 200], "p100"), (100, [50, 100, 150], "p100")],
)
def test_best_fit_vectors(budget: int, lengths: list[int], picked: str) -> None:
    assert pick(best_fit_queue(lengths), budget) == picked


def test_best_fit_is_fifo_among_equal_lengths() -> None:
    q = best_fit_queue([])
    q.add("first", "j", 40)
    q.add("second", "j", 40)
    q.add("big", "j", 41)
    assert pick(q, 40) == "first"
    q.remove("first")
    assert pick(q, 40) == "second"


def test_budget_zero_picks_nothing() -> None:
    q: JobQueue[str] = JobQueue()
    q.add("a", "j", 10)
    assert pick(q, 0) is None
    assert pick(q, -5) is None
    assert pick(q, 1) == "a"  # cold start ignores the fit
    # zero free blocks -> budget 0 -> nothing admittable
    assert admission_budget_tokens(0, reserve_blocks([], 2, 8), 16) == 0


def test_empty_queue_picks_nothing() -> None:
    assert pick(JobQueue(), 10_000) is None


def test_cold_start_only_the_first_three_adds_per_job() -> None:
    q: JobQueue[str] = JobQueue()
    for i in range(5):
        q.add(f"a{i}", "a", 100)
    assert [q.is_cold_start(f"a{i}") for i in range(5)] == [True, True, True, False, False]
    picks = []
    for _ in range(3):
        k = pick(q, 10)
        assert k is not None
        picks.append(k)
        q.remove(k)
    assert picks == ["a0", "a1", "a2"]  # cold start ignores the budget (10 < 100)
    assert pick(q, 10) == "a3"  # then best fit: smallest when nothing fits


def test_readds_count_toward_the_window() -> None:
    q: JobQueue[str] = JobQueue()
    q.add("keep", "a", 1)
    q.add("x", "a", 1)
    q.remove("x")
    q.add("x", "a", 1)  # third add: still cold
    assert q.is_cold_start("x")
    q.remove("x")
    q.add("x", "a", 1)  # fourth add
    assert not q.is_cold_start("x")


def test_cold_start_jobs_in_bucket_creation_order_and_bucket_scan_order() -> None:
    q: JobQueue[str] = JobQueue()
    warm(q, "w")
    q.add("b1", "b", 100)
    q.add("a1", "a", 50)
    q.add("b2", "b", 50)
    q.add("b3", "b", 100)
    # job b's bucket came first; inside it length 100 (created first) before 50, FIFO inside.
    order = []
    while (k := pick(q, 10_000)) is not None and q.is_cold_start(k):
        order.append(k)
        q.remove(k)
    assert order == ["b1", "b3", "b2", "a1"]


def test_cold_start_scan_order_follows_length_recreation() -> None:
    q: JobQueue[str] = JobQueue()
    q.add("a", "j", 100)
    q.add("b", "j", 50)
    q.remove("a")  # the length-100 FIFO is deleted ...
    q.add("c", "j", 100)  # ... and re-created after length 50
    assert pick(q, 10_000) == "b"


def test_cold_start_beats_job_order() -> None:
    est = DecodeEstimator(20)
    q: JobQueue[str] = JobQueue()
    warm(q, "long")
    q.add("long-1", "long", 100)
    q.add("new-1", "new", 100)
    est.observe("new", 1)  # a short job, second by every order but cold
    assert pick(q, 10_000, est) == "new-1"


def test_pick_uses_the_first_ordered_job_only() -> None:
    est = DecodeEstimator(20)
    est.observe("long", 500)
    est.observe("short", 10)
    q: JobQueue[str] = JobQueue()
    warm(q, "long")
    warm(q, "short")
    q.add("l", "long", 3000)
    q.add("s", "short", 3000)
    # plenty of budget: long first; its best fit (3000 <= 5000) beats the keep-alive (10**9)
    assert pick(q, 5000, est) == "l"
    # scarce budget: short first; nothing of it fits, so its smallest prompt
    assert pick(q, 1000, est) == "s"
    q.remove("s")
    assert pick(q, 1000, est) == "short-keep"


def test_remove_cleans_empty_buckets_and_resets_cold_start() -> None:
    q: JobQueue[str] = JobQueue()
    for i in range(4):
        q.add(f"a{i}", "a", 10 * i)
    q.add("b0", "b", 5)
    assert (len(q), q.jobs(), q.job_size("a"), q.job_size("b")) == (5, ("a", "b"), 4, 1)
    assert q.job_of("a2") == "a" and q.prompt_tokens_of("a2") == 20 and "a2" in q
    for i in range(4):
        assert q.remove(f"a{i}")
    assert not q.remove("a0")
    assert q.jobs() == ("b",) and q.job_size("a") == 0
    assert q.job_of("a2") is None and q.prompt_tokens_of("a2") is None and "a2" not in q
    # the recreated bucket starts a fresh cold-start window and comes after b
    for i in range(4):
        q.add(f"n{i}", "a", 1)
    assert [q.is_cold_start(f"n{i}") for i in range(4)] == [True, True, True, False]
    assert q.jobs() == ("b", "a")


def test_queue_never_refuses_many_jobs() -> None:
    q: JobQueue[int] = JobQueue()
    for i in range(500):
        q.add(i, f"job{i}", i)
    assert len(q) == 500 and len(q.jobs()) == 500


def test_add_rejects_duplicates_and_bad_values() -> None:
    q: JobQueue[str] = JobQueue()
    q.add("a", "j", 1)
    with pytest.raises(ValueError, match="already queued"):
        q.add("a", "k", 2)
    with pytest.raises(ValueError, match="prompt_tokens"):
        q.add("b", "j", -1)
    with pytest.raises(ValueError, match="job"):
        q.add("b", "", 1)
    assert len(q) == 1


def test_unobserved_jobs_are_long_and_ordered_by_creation() -> None:
    q: JobQueue[str] = JobQueue()
    warm(q, "x")
    warm(q, "y")
    q.add("y1", "y", 10)
    q.add("x1", "x", 10)
    assert pick(q, 100) == "x1"  # both predict 128: ties keep bucket creation order


# --------------------------------------------------------------------------------------------
# Reservation and admission budget
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "computed", "blocks"),
    [
        (100, 0, 2),  # upstream: a 32-token chunk now, another 32 next round -> 2 blocks
        (100, 100, 0),  # upstream: decode, the next token fits in the current block
        (100, 99, 0),  # upstream: the last prompt token now, a decode token next
        (100, 64, 1),  # a chunk to 96 (a block boundary), then 4 tokens -> 1 block
        (16, 15, 1),  # to 16 (a block boundary), the next decode token needs a new block
        (15, 15, 1),  # decode without lookahead (L = 0): one token to 16, the next needs a new block
        (0, 0, 0),  # nothing to prefill: a decode token to position 1, the next fits (room 15)
    ],
)
def test_request_reserve_vectors(prompt: int, computed: int, blocks: int) -> None:
    assert request_reserve_blocks(prompt, computed, 16, 32) == blocks


def test_request_reserve_lookahead_and_budget_cap() -> None:
    # decode with lookahead 20: 21 tokens now (to 48, a boundary), 21 next -> 2 blocks
    assert request_reserve_blocks(10, 27, 16, 32, lookahead_tokens=20) == 2
    # ... and from 16: to 37 (room 11), 21 next -> 10 beyond the room -> 1 block
    assert request_reserve_blocks(10, 16, 16, 32, lookahead_tokens=20) == 1
    # a long prefill is capped by the step budget M both rounds
    assert request_reserve_blocks(10_000, 0, 16, 2048) == 128


def test_request_reserve_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="block_size"):
        request_reserve_blocks(10, 0, 0, 32)
    with pytest.raises(ValueError, match="max_scheduled_tokens"):
        request_reserve_blocks(10, 0, 16, 0)
    with pytest.raises(ValueError, match="computed_tokens"):
        request_reserve_blocks(10, -1, 16, 32)


def test_reserve_vectors() -> None:
    assert reserve_blocks([], 2, 8) == 2  # upstream: empty running set -> the margin
    assert reserve_blocks([], 10, 5) == 5  # upstream: margin 10 with max 5 -> 5
    assert reserve_blocks([2, 0, 0], 2, 8) == 4
    assert reserve_blocks([5, 5], 2, 8) == 8
    assert reserve_blocks(iter([1, 1]), 0, 8) == 2  # any iterable


def test_admission_budget() -> None:
    assert admission_budget_tokens(100, 8, 16) == 92 * 16
    assert admission_budget_tokens(8, 8, 16) == 0
    assert admission_budget_tokens(3, 8, 16) == 0  # never negative
