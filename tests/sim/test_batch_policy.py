"""The engine policy ``batch_job_aware`` (the seed's batch-job-aware scheduler, docs/batch.md §5):
LPT job order by the admission budget, the running-set reserve, head-of-line picks, natural-stop
estimates, and outputs identical to fcfs.  Exact virtual times."""

from __future__ import annotations

import argparse

import httpx
import pytest
import trio

from actors.core.batchjobs import COLD_START_PREDICTION
from bench.bench import ClusterSpec, sim_backend_command
from bench.calibrate import config_for
from daemon.commands import sim_backend
from sim.cluster import SimCluster, SimConfig
from sim.engine import Engine, EngineConfig, EngineOutput, Request
from sim.transport import SimTransport

BJA = "batch_job_aware"


def drain(engine: Engine) -> list[EngineOutput]:
    out: list[EngineOutput] = []
    while (t := engine.next_event_time()) is not None:
        out += engine.advance_to(t)
    return out


def tagged(rid: str, job: str) -> str:
    return f"{rid}#job_name[{job}]#"


def req(rid: str, job: str, prompt: int, output: int, base: int, finish: str = "length") -> Request:
    return Request(tagged(rid, job), [base + i for i in range(prompt)], list(range(output)), finish_reason=finish)


def first_tokens(outs: list[EngineOutput]) -> list[str]:
    """Request ids (tag removed) in the order of their first token."""
    firsts = [(o.time, o.request_id.split("#")[0]) for o in outs if o.first_index == 0]
    return [rid for _t, rid in sorted(firsts)]


def _lpt_engine(num_gpu_blocks: int) -> Engine:
    """One request at a time; the estimator already knows a long (40) and a short (8) job."""
    engine = Engine(EngineConfig(num_gpu_blocks=num_gpu_blocks, max_num_seqs=1, scheduling_policy=BJA))
    engine.estimator.observe("long", 40)
    engine.estimator.observe("short", 8)
    # the first three requests of each job are its cold start (picked first, bucket order);
    # s4 and l4 are then ordered by the admission budget
    for i in range(1, 5):
        engine.add_request(req(f"s{i}", "short", 32, 4, base=1000 * i), 0.0)
    for i in range(1, 5):
        engine.add_request(req(f"l{i}", "long", 32, 4, base=10_000 * i), 0.0)
    return engine


def test_lpt_long_job_first_when_free_kv_is_high() -> None:
    engine = _lpt_engine(num_gpu_blocks=1000)  # (999 - 2) x 16 tokens > 4096: long jobs first
    assert engine.admission_budget() == (999 - 2) * 16
    assert first_tokens(drain(engine)) == ["s1", "s2", "s3", "l1", "l2", "l3", "l4", "s4"]


def test_lpt_short_job_first_when_free_kv_is_low() -> None:
    engine = _lpt_engine(num_gpu_blocks=100)  # (99 - 2) x 16 = 1552 <= 4096: short jobs first
    assert engine.admission_budget() == 97 * 16
    assert first_tokens(drain(engine)) == ["s1", "s2", "s3", "l1", "l2", "l3", "s4", "l4"]


def test_fcfs_keeps_arrival_order() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=1000, max_num_seqs=1))
    for i in range(1, 3):
        engine.add_request(req(f"s{i}", "short", 32, 4, base=1000 * i), 0.0)
        engine.add_request(req(f"l{i}", "long", 32, 4, base=10_000 * i), 0.0)
    assert first_tokens(drain(engine)) == ["s1", "l1", "s2", "l2"]


def test_estimator_learns_from_natural_stops_only() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200, scheduling_policy=BJA))
    engine.add_request(req("a", "j", 20, 30, base=1, finish="stop"), 0.0)
    engine.add_request(req("b", "k", 20, 50, base=100, finish="length"), 0.0)
    engine.add_request(req("c", "j", 20, 10, base=200, finish="tool_calls"), 0.0)  # a stop for vLLM
    drain(engine)
    assert engine.estimator.stats("j").samples == 2
    # "c" (10 tokens) stops first, then "a" (30 tokens)
    assert engine.estimator.predict("j") == int(0.1 * 30 + 0.9 * 10) == 12
    assert engine.estimator.stats("k") is None
    assert engine.estimator.predict("k") == COLD_START_PREDICTION


def _pressured(policy: str) -> tuple[Engine, list[EngineOutput]]:
    # 19 usable blocks, 32 tokens per step: a chunked prefill running next to decodes needs the
    # blocks the reserve keeps; fcfs admits into them and preempts
    engine = Engine(EngineConfig(num_gpu_blocks=20, max_num_batched_tokens=32, scheduling_policy=policy))
    for rid, job, prompt, output, base in (
        ("r0", "short", 50, 4, 1000),
        ("r1", "short", 181, 6, 2000),
        ("r2", "long", 200, 81, 3000),
        ("r3", "short", 69, 8, 4000),
    ):
        engine.add_request(req(rid, job, prompt, output, base, finish="stop"), 0.0)
    return engine, drain(engine)


def test_reserve_avoids_preemptions_on_a_kv_pressured_mixed_workload() -> None:
    fcfs, fcfs_out = _pressured("fcfs")
    bja, bja_out = _pressured(BJA)
    assert fcfs.stats.num_preemptions == 2
    assert bja.stats.num_preemptions == 0
    finished = {o.request_id for o in bja_out if o.finish_reason is not None}
    assert finished == {o.request_id for o in fcfs_out if o.finish_reason is not None}
    assert len(finished) == 4
    # every request produced exactly its tokens, under both policies
    for outs in (fcfs_out, bja_out):
        counts: dict[str, int] = {}
        for o in outs:
            counts[o.request_id] = counts.get(o.request_id, 0) + o.num_tokens
        assert sorted(counts.values()) == [4, 6, 8, 81]


def test_zero_admission_budget_admits_nothing_and_a_blocked_pick_waits() -> None:
    # 9 usable blocks; "big" holds 7 of them: free 2 = the reserve's margin, budget 0
    engine = Engine(EngineConfig(num_gpu_blocks=10, max_num_batched_tokens=512, scheduling_policy=BJA))
    engine.add_request(req("big", "a", 100, 20, base=1), 0.0)
    drain_until = engine.next_event_time()
    assert drain_until is not None
    engine.advance_to(drain_until)  # front-end delay over: "big" is admitted (7 blocks)
    assert engine.num_running == 1 and engine.pool.num_free == 2
    assert engine.admission_budget() == 0
    engine.add_request(req("small", "b", 8, 2, base=500), drain_until)
    outs = drain(engine)
    small_first = next(o.time for o in outs if o.request_id.startswith("small") and o.first_index == 0)
    big_end = next(o.time for o in outs if o.request_id.startswith("big") and o.finish_reason is not None)
    # nothing was admitted while the budget was 0: "small" is prefilled in the step that starts
    # when "big" finishes
    assert small_first == big_end + engine._prefill_cost(8, 0)
    assert engine.stats.num_preemptions == 0


def test_preempted_requests_go_back_into_their_bucket() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=20, max_num_batched_tokens=32, scheduling_policy=BJA))
    r = req("x", "j", 50, 4, base=1)
    engine.add_request(r, 0.0)
    engine.advance_to(engine.next_event_time() or 0.0)
    assert engine.num_running == 1
    engine.running.remove(r)
    engine._preempt(r)
    assert engine._job_waiting.job_of(r) == "j" and engine.num_waiting == 1
    outs = drain(engine)
    assert sum(o.num_tokens for o in outs) == 4 and outs[-1].finish_reason == "length"


def test_abort_of_the_pick_clears_it() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=10, max_num_batched_tokens=512, scheduling_policy=BJA))
    engine.add_request(req("big", "a", 100, 20, base=1), 0.0)
    t = engine.next_event_time() or 0.0
    engine.advance_to(t)
    engine.add_request(req("w", "b", 120, 2, base=500), t)  # cannot fit next to "big": blocked pick
    engine.advance_to(engine.next_event_time() or t)
    engine.abort(tagged("w", "b"), engine._clock)
    assert engine._picked is None and engine.num_waiting == 0
    assert drain(engine)[-1].finish_reason == "length"


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="scheduling_policy must be one of fcfs, priority, batch_job_aware"):
        Engine(EngineConfig(scheduling_policy="sjf"))


async def _responses(policy: str) -> dict[str, tuple[str, str, int]]:
    config = SimConfig(
        dp_size=1,
        deterministic=True,
        engine=EngineConfig(num_gpu_blocks=60, max_num_batched_tokens=256, scheduling_policy=policy),
    )
    got: dict[str, tuple[str, str, int]] = {}

    async def one(client: httpx.AsyncClient, i: int) -> None:
        job = ("short", "long")[i % 2]
        body = {
            "messages": [{"role": "user", "content": f"item {i} " * (10 + 7 * i)}],
            "max_tokens": 8 if job == "short" else 60,
            "vllm_xargs": {"sim_output_tokens": 6 if job == "short" else 50},
        }
        r = await client.post("/v1/chat/completions", json=body, headers={"x-request-id": tagged(f"q{i}", job)})
        choice = r.json()["choices"][0]
        got[f"q{i}"] = (choice["message"]["content"], choice["finish_reason"], r.json()["usage"]["completion_tokens"])

    async with trio.open_nursery() as nursery:
        cluster: SimCluster = await nursery.start(SimCluster(config).run)
        async with httpx.AsyncClient(transport=SimTransport(cluster), base_url="http://sim") as client:
            async with trio.open_nursery() as clients:
                for i in range(12):
                    clients.start_soon(one, client, i)
        got["preemptions"] = ("", "", cluster.engines[0].stats.num_preemptions)
        nursery.cancel_scope.cancel()
    return got


async def test_outputs_are_the_same_tokens_as_fcfs(autojump_clock) -> None:
    fcfs = await _responses("fcfs")
    bja = await _responses(BJA)
    assert fcfs.pop("preemptions")[2] > 0  # the workload is KV-pressured
    bja.pop("preemptions")
    assert bja == fcfs
    assert {v[1] for v in fcfs.values()} == {"stop"}


def test_the_policy_is_a_flag_of_sim_backend_and_of_the_bench_workers() -> None:
    parser = argparse.ArgumentParser()
    sim_backend.add_arguments(parser)
    config = sim_backend.config_from_args(parser.parse_args(["--scheduling-policy", BJA]))
    assert config.engine.scheduling_policy == BJA
    assert all(e.job_policy for e in SimCluster(config).engines)
    cmd = sim_backend_command("python", 9000, ClusterSpec(scheduling_policy=BJA), 0)
    assert cmd[cmd.index("--scheduling-policy") + 1] == BJA
    assert config_for(ClusterSpec(scheduling_policy=BJA), "native").embedded.scheduling_policy == BJA
