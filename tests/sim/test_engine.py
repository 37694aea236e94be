"""The pure engine model: cost figures, prefix cache, eviction, preemption, chunked prefill, runs."""

from __future__ import annotations

import random

import pytest

from actors.core.config import DecodeThroughputModel, PrefillCostModel
from actors.core.costs import decode_step_seconds, prefill_seconds
from sim.engine import Engine, EngineConfig, EngineOutput, Request
from sim.stats import CostModel


def drain(engine: Engine, until: float | None = None) -> list[EngineOutput]:
    out: list[EngineOutput] = []
    while (t := engine.next_event_time()) is not None and (until is None or t <= until):
        out += engine.advance_to(t)
    return out


def prompt(n: int, base: int = 1000) -> list[int]:
    return [base + i for i in range(n)]


def test_lone_cold_prefill_matches_seed_figure() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=4000))
    engine.add_request(Request("a", prompt(50_000), [7]), 0.0)
    (out,) = drain(engine)
    assert out.finish_reason == "length"
    assert out.time == pytest.approx(13.93, rel=0.01)
    assert out.time == pytest.approx(prefill_seconds(50_000, PrefillCostModel()), rel=1e-12)
    # 50,000 tokens at 8192 per step: 7 chunked-prefill steps
    assert engine.stats.num_steps == 7
    assert engine.stats.ttft.count == 1


def test_batch_of_four_decodes_at_seed_throughput() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=20_000))
    for i in range(4):
        engine.add_request(Request(f"r{i}", prompt(49_990, base=10_000 * (i + 1)), list(range(40))), 0.0)
    outs = drain(engine)
    # the steady phase starts when the last request emits its first token
    start = next(o.time for o in outs if o.request_id == "r3" and o.first_index == 0)
    tokens = sum(o.num_tokens for o in outs if o.time > start and o.first_index + o.num_tokens <= 40)
    end = max(o.time for o in outs if o.request_id == "r0")
    steady = [o for o in outs if start < o.time <= end]
    tokens = sum(o.num_tokens for o in steady)
    assert tokens / (end - start) == pytest.approx(98.23, rel=0.01)
    assert 4 / decode_step_seconds(4, 200_000, DecodeThroughputModel()) == pytest.approx(98.23, rel=0.001)


def test_time_scale_divides_durations() -> None:
    engine = Engine(EngineConfig(time_scale=100.0))
    engine.add_request(Request("a", prompt(10_000), [1, 2]), 5.0)
    outs = drain(engine)
    assert outs[-1].time - 5.0 == pytest.approx(
        (prefill_seconds(10_000, PrefillCostModel()) + decode_step_seconds(1, 10_001, DecodeThroughputModel())) / 100.0
    )


def test_prefix_hit_is_whole_blocks_capped_at_prompt_minus_one() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=64))
    engine.add_request(Request("a", prompt(32), [1]), 0.0)
    drain(engine)
    # identical 32-token prompt: cap at 31 tokens -> one whole block
    engine.add_request(Request("b", prompt(32), [1]), 10.0)
    (out,) = drain(engine)
    assert out.num_cached_tokens == 16
    # prompt extended by the first request's output plus more: the first two blocks hit
    engine.add_request(Request("c", prompt(40), [1]), 20.0)
    (out,) = drain(engine)
    assert out.num_cached_tokens == 32
    assert engine.stats.prefix_cache_queries == 32 + 32 + 40
    assert engine.stats.prefix_cache_hits == 0 + 16 + 32
    assert engine.stats.prompt_tokens_cached == 48


def test_prefix_miss_on_different_tokens_and_salt() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=64))
    engine.add_request(Request("a", prompt(64), [1]), 0.0)
    drain(engine)
    engine.add_request(Request("b", prompt(64, base=5000), [1]), 10.0)
    engine.add_request(Request("c", prompt(64), [1], cache_salt="tenant-2"), 10.0)
    engine.add_request(Request("d", prompt(64), [1], skip_prefix_cache=True), 10.0)
    assert {o.request_id: o.num_cached_tokens for o in drain(engine)} == {"b": 0, "c": 0, "d": 0}


def test_generated_tokens_are_cached_for_the_next_turn() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=64))
    output = list(range(500, 540))  # 40 generated tokens
    engine.add_request(Request("t1", prompt(24), output), 0.0)
    drain(engine)
    # next turn = prompt + output + 8 new tokens (72 tokens); 64 known tokens -> 4 blocks... but the
    # last generated token was never computed, so only the first 63 tokens have KV: 3 full blocks
    engine.add_request(Request("t2", prompt(24) + output + prompt(8, base=9000), [1]), 100.0)
    (out,) = drain(engine)
    assert out.num_cached_tokens == 48


def test_eviction_takes_deepest_blocks_first() -> None:
    # 1 null block + 8 usable blocks of 16 tokens
    engine = Engine(EngineConfig(num_gpu_blocks=9, max_num_batched_tokens=256))
    engine.add_request(Request("a", prompt(96), [1]), 0.0)  # 6 full blocks, freed deepest first
    drain(engine)
    assert engine.kv_cache_usage() == 0.0  # cached but unreferenced blocks count as free
    # a new 64-token unrelated prompt needs 4 (+1 for its output) blocks: two never-used blocks
    # come first, then the deepest cached blocks of "a" are evicted
    engine.add_request(Request("b", prompt(64, base=7000), [1]), 10.0)
    drain(engine)
    assert engine.pool.evictions == 2
    engine.add_request(Request("c", prompt(96), [1]), 20.0)
    (out,) = drain(engine)
    assert out.num_cached_tokens == 64  # blocks 0..3 of "a" survived, 4..5 were evicted


def _preemption_engine(policy: str) -> Engine:
    # 8 usable blocks = 128 tokens; three 32-token prompts growing by 40 tokens each cannot all fit
    return Engine(EngineConfig(num_gpu_blocks=9, max_num_batched_tokens=512, scheduling_policy=policy))


def test_fcfs_preempts_last_admitted() -> None:
    engine = _preemption_engine("fcfs")
    for i in range(3):
        engine.add_request(Request(f"r{i}", prompt(32, base=1000 * (i + 1)), list(range(40))), float(i) * 1e-3)
    outs = drain(engine)
    assert engine.stats.num_preemptions >= 1
    finish_order = [o.request_id for o in outs if o.finish_reason]
    assert finish_order[0] == "r0"
    assert finish_order[-1] == "r2"  # the last admitted was preempted and finished last
    assert sum(o.num_tokens for o in outs) == 120


def test_priority_policy_preempts_numerically_largest_priority() -> None:
    engine = _preemption_engine("priority")
    prios = {"r0": 5, "r1": 0, "r2": 1}
    for i, (rid, prio) in enumerate(prios.items()):
        engine.add_request(Request(rid, prompt(32, base=1000 * (i + 1)), list(range(40)), priority=prio), i * 1e-3)
    outs = drain(engine)
    assert engine.stats.num_preemptions >= 1
    finish_order = [o.request_id for o in outs if o.finish_reason]
    # r0 was admitted first but has the largest priority value: it is the victim and finishes last
    assert finish_order[-1] == "r0"
    assert sum(o.num_tokens for o in outs) == 120


def test_priority_waiting_queue_orders_by_priority_then_arrival() -> None:
    engine = Engine(EngineConfig(max_num_seqs=1, scheduling_policy="priority"))
    engine.add_request(Request("busy", prompt(100), list(range(30))), 0.0)
    drain(engine, until=0.1)
    for i, (rid, prio) in enumerate((("low", 3), ("high", -1), ("mid", 0), ("mid2", 0))):
        engine.add_request(Request(rid, prompt(20, base=1000 * (i + 5)), [1], priority=prio), 0.2 + i * 1e-3)
    order = [o.request_id for o in drain(engine) if o.finish_reason]
    assert order == ["busy", "high", "mid", "mid2", "low"]


def test_chunked_prefill_mixes_with_decodes_within_budget() -> None:
    engine = Engine(EngineConfig(max_num_batched_tokens=1000))
    engine.add_request(Request("dec", prompt(100), list(range(50))), 0.0)
    drain(engine, until=0.2)
    engine.add_request(Request("long", prompt(2_500, base=50_000), [1]), 0.2)
    outs = drain(engine)
    long_out = [o for o in outs if o.request_id == "long"]
    assert len(long_out) == 1
    # 2500 tokens with 999 budget per step (one decode per step) -> 3 prefill steps: the decode
    # request emits a token in each of them
    dec_during = [o for o in outs if o.request_id == "dec" and o.time <= long_out[0].time and o.time > 0.2]
    assert sum(o.num_tokens for o in dec_during) >= 3


def _rid(engine: Engine, i: int) -> str:
    """Request ids of ``_random_workload``: three batch jobs under batch_job_aware."""
    return f"q{i}#job_name[j{i % 3}]#" if engine.job_policy else f"q{i}"


def _random_workload(engine: Engine, seed: int) -> list[EngineOutput]:
    rng = random.Random(seed)
    out: list[EngineOutput] = []
    t = 0.0
    shared = prompt(300, base=90_000)
    for i in range(40):
        t += rng.expovariate(2.0)
        out += drain(engine, until=t)
        n_out = rng.randint(1, 120)
        p = shared + prompt(rng.randint(1, 2000), base=rng.randint(0, 1_000_000))
        finish = "stop" if engine.job_policy and i % 2 else "length"  # natural stops teach the estimator
        engine.add_request(
            Request(_rid(engine, i), p, list(range(n_out)), finish_reason=finish, priority=rng.randint(0, 3)), t
        )
        if i % 7 == 3:
            out += engine.abort(_rid(engine, i - 2), t + 0.01)
    return out + drain(engine)


@pytest.mark.parametrize("policy", ["fcfs", "priority", "batch_job_aware"])
def test_multi_step_runs_equal_step_by_step(policy: str) -> None:
    def make(max_steps: int) -> Engine:
        return Engine(
            EngineConfig(
                num_gpu_blocks=150,
                max_num_batched_tokens=2048,
                max_num_seqs=8,
                scheduling_policy=policy,
                max_steps_per_run=max_steps,
            )
        )

    fast, slow = make(1 << 30), make(1)
    out_fast, out_slow = _random_workload(fast, 7), _random_workload(slow, 7)

    def per_token(outs: list[EngineOutput]) -> dict[str, list[tuple[int, str | None]]]:
        res: dict[str, list[tuple[int, str | None]]] = {}
        for o in outs:
            res.setdefault(o.request_id, []).append((o.first_index + o.num_tokens, o.finish_reason))
        return {k: [v[-1]] for k, v in res.items()}

    assert per_token(out_fast) == per_token(out_slow)
    finish_fast = {o.request_id: o.time for o in out_fast if o.finish_reason}
    finish_slow = {o.request_id: o.time for o in out_slow if o.finish_reason}
    assert finish_fast == finish_slow
    assert fast.stats.num_preemptions == slow.stats.num_preemptions > 0
    assert fast.stats.prefix_cache_queries == slow.stats.prefix_cache_queries
    assert fast.stats.prefix_cache_hits == slow.stats.prefix_cache_hits
    assert fast.stats.itl.counts == slow.stats.itl.counts
    assert fast.stats.generation_tokens == slow.stats.generation_tokens
    assert fast.stats.num_steps < slow.stats.num_steps


def test_rejects_request_larger_than_kv() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=5))
    with pytest.raises(ValueError, match="max_model_len 64"):
        engine.add_request(Request("big", prompt(60), list(range(10))), 0.0)


def test_duplicate_blocks_are_kept_and_promoted_on_eviction() -> None:
    from sim.kv import BlockPool

    pool = BlockPool(5)
    first: list[int] = []
    second: list[int] = []
    pool.allocate(1, first)
    pool.allocate(1, second)
    pool.cache_block(first[0], 42)
    pool.cache_block(second[0], 42)  # computed twice concurrently: not de-duplicated
    assert pool.find_hits([42], 1) == first
    pool.free(first)
    pool.free(second)
    rest: list[int] = []
    pool.allocate(2, rest)  # the two never-used blocks
    evict_one: list[int] = []
    pool.allocate(1, evict_one)  # pops the oldest free block: the first copy
    assert evict_one == first and pool.evictions == 1
    assert pool.find_hits([42], 1) == second  # the younger copy still serves hits
    pool.allocate(1, evict_one)
    assert pool.find_hits([42], 1) == [] and pool.evictions == 2


def test_cost_model_is_the_cores_calibration() -> None:
    """Defaults are the core's (the seed's values, written only in actors.core.config); calibrated
    ``[program_scheduling]`` cost models plug in unchanged."""
    assert CostModel() == CostModel(prefill=PrefillCostModel(), decode=DecodeThroughputModel())
    custom = CostModel(
        prefill=PrefillCostModel(intercept_seconds=0.5, linear_seconds_per_1k_tokens=0.1),
        decode=DecodeThroughputModel(fixed_step_seconds=0.02),
    )
    engine = Engine(EngineConfig(num_gpu_blocks=1000, cost=custom))
    engine.add_request(Request("a", prompt(5_000), [7, 8]), 0.0)
    first, second = drain(engine)
    assert first.time == pytest.approx(prefill_seconds(5_000, custom.prefill), rel=1e-12)
    assert second.time - first.time == pytest.approx(decode_step_seconds(1, 5_001, custom.decode), rel=1e-12)


def test_generated_text_round_trips_through_the_tokenizer() -> None:
    from sim import tokenizer

    for n in (0, 1, 2, 17, 300):
        pieces = tokenizer.generate_pieces("seed", n)
        text = "".join(pieces)
        assert tokenizer.count_tokens(text) == n == len(pieces)
        assert tokenizer.tokenize(text) == tokenizer.piece_ids(pieces)
        assert tokenizer.text_of_tokens(n, "a") == tokenizer.text_of_tokens(n, "a")
    assert tokenizer.text_of_tokens(20, "a") != tokenizer.text_of_tokens(20, "b")
    for k in (1, 5, 40):
        assert tokenizer.count_tokens(tokenizer.tool_call_arguments("s", k)) == k + 1
    assert "".join(tokenizer.split_pieces("a  bcdefghijk \n")) == "a  bcdefghijk \n"
