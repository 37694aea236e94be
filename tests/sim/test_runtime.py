"""Determinism in virtual time, the real-socket server, the CLI and ``run_sim_cluster``."""

from __future__ import annotations

import random
from functools import partial

import httpx
import pytest
import trio
import trio.testing
from sim_fakes import sse_payloads

from daemon.cli import main as cli_main
from daemon.config import EmbeddedConfig
from daemon.http.serve import serve_http
from sim import cluster as cluster_module
from sim import tokenizer
from sim.cluster import SimCluster, SimConfig, run_sim_cluster
from sim.engine import EngineConfig, Request
from sim.server import create_app
from sim.transport import SimTransport


def _scenario(seed: int) -> tuple[list[bytes], str]:
    """Concurrent multi-turn agents against a small KV cache (preemptions); all bytes returned."""

    async def agent(client: httpx.AsyncClient, i: int, log: list[tuple[int, int, bytes]]) -> None:
        rng = random.Random(i)
        messages = [
            {"role": "system", "content": tokenizer.text_of_tokens(300, "shared")},
            {"role": "user", "content": tokenizer.text_of_tokens(rng.randint(20, 400), f"u{i}")},
        ]
        for turn in range(3):
            body = {
                "messages": messages,
                "max_tokens": rng.randint(50, 250),
                "stream": turn % 2 == 0,
                "stream_options": {"include_usage": True} if turn % 2 == 0 else None,
                "priority": rng.randint(0, 2),
            }
            body = {k: v for k, v in body.items() if v is not None}
            if body["stream"]:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    raw = b"".join([c async for c in r.aiter_bytes()])
                content = "".join(
                    f["choices"][0]["delta"].get("content", "")
                    for f in sse_payloads(raw)
                    if isinstance(f, dict) and f["choices"]
                )
            else:
                r = await client.post("/v1/chat/completions", json=body)
                raw = r.content
                content = r.json()["choices"][0]["message"]["content"]
            log.append((i, turn, raw + repr(trio.current_time()).encode()))
            messages = [
                *messages,
                {"role": "assistant", "content": content},
                {"role": "tool", "content": tokenizer.text_of_tokens(rng.randint(5, 200), f"t{i}{turn}")},
            ]
            await trio.sleep(rng.choice([0.0, 0.5, 2.0]))

    async def main() -> tuple[list[bytes], str]:
        log: list[tuple[int, int, bytes]] = []
        config = SimConfig(
            dp_size=2,
            seed=seed,
            deterministic=True,
            engine=EngineConfig(
                num_gpu_blocks=120, max_num_batched_tokens=512, scheduling_policy="priority", seed=seed
            ),
        )
        async with trio.open_nursery() as nursery:
            cluster: SimCluster = await nursery.start(SimCluster(config).run)
            async with httpx.AsyncClient(transport=SimTransport(cluster), base_url="http://sim") as client:
                async with trio.open_nursery() as agents:
                    for i in range(8):
                        agents.start_soon(agent, client, i, log)
                metrics = (await client.get("/metrics")).text
                assert sum(e.stats.num_preemptions for e in cluster.engines) > 0
            nursery.cancel_scope.cancel()
        return [raw for _, _, raw in sorted(log)], metrics

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_same_seed_same_bytes() -> None:
    first = _scenario(1)
    second = _scenario(1)
    assert first == second
    assert _scenario(2)[0] != first[0]


async def test_idle_waits_count_the_waits_trio_has_not_woken() -> None:
    waits = cluster_module._idle_waits()
    returned: list[str] = []

    async def waiter(name: str) -> None:
        await cluster_module._wait_all_tasks_blocked()
        returned.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "a")
        nursery.start_soon(waiter, "b")
        while waits.waiting < 2:  # until both have registered (no idle moment in between)
            await trio.lowlevel.checkpoint()
        assert waits.epoch == 0
        await trio.testing.wait_all_tasks_blocked()  # Trio wakes a, b and this task together
        await trio.lowlevel.checkpoint()
        assert sorted(returned) == ["a", "b"]
        assert (waits.waiting, waits.epoch) == (0, 1)  # one new epoch for the waits woken together
        nursery.start_soon(waiter, "c")
        while not waits.waiting:
            await trio.lowlevel.checkpoint()
        assert (waits.waiting, waits.epoch) == (1, 1)
        nursery.cancel_scope.cancel()
    assert (waits.waiting, waits.epoch, sorted(returned)) == (0, 1, ["a", "b"])  # c left without a wake


async def test_input_missed_by_the_quiet_event_check_fails_loudly(autojump_clock: trio.abc.Clock) -> None:
    """A task outside the simulator that waits for idle (here with a cushion, so that Trio wakes it
    after the cluster) is invisible to the quiet-event check: its request must not reach the engines
    late, so the cluster raises."""
    cluster = SimCluster(SimConfig(dp_size=1, deterministic=True, per_step_wakeups=False))

    async def client(request_id: str) -> None:
        outputs = await cluster.submit(Request(request_id, list(range(1, 200)), [7] * 20), final_only=True)
        async for _ in outputs:
            pass

    async def outsider() -> None:
        await trio.testing.wait_all_tasks_blocked(cushion=1e-4)
        await client("late")

    with pytest.raises(ExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            await nursery.start(cluster.run)
            nursery.start_soon(client, "first")
            nursery.start_soon(outsider)
    assert info.group_contains(RuntimeError, match="without a wake-up")


async def test_real_socket_server_streams(nursery: trio.Nursery) -> None:
    config = SimConfig(dp_size=2, engine=EngineConfig(time_scale=1e6))
    cluster: SimCluster = await nursery.start(SimCluster(config).run)
    stop = trio.Event()
    url: str = await nursery.start(serve_http, create_app(cluster), "127.0.0.1", 0, 5.0, stop.wait)
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/health")).status_code == 200
        payload = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream(
            "POST", "/v1/chat/completions", json=payload, headers={"X-data-parallel-rank": "1"}
        ) as r:
            raw = b"".join([c async for c in r.aiter_bytes()])
        frames = sse_payloads(raw)
        assert frames[-1] == "[DONE]" and frames[-2]["usage"]["completion_tokens"] == 4
        assert cluster.engines[1].stats.generation_tokens == 4
        assert "vllm:num_requests_running" in (await client.get("/metrics")).text
    stop.set()
    nursery.cancel_scope.cancel()


async def test_run_sim_cluster_from_embedded_config(autojump_clock: trio.abc.Clock, nursery: trio.Nursery) -> None:
    cfg = EmbeddedConfig(dp_size=3, num_gpu_blocks=64, model="emb", seed=5)
    cluster: SimCluster = await nursery.start(partial(run_sim_cluster, cfg, worker_index=1))
    assert cluster.dp_size == 3 and cluster.config.model == "emb" and cluster.config.seed == 6
    assert cluster.max_model_len == 63 * 16
    other: SimCluster = await nursery.start(run_sim_cluster, cfg)
    transport = SimTransport({"http://w0:8000": other, "http://w1:8000": cluster})
    async with httpx.AsyncClient(transport=transport) as client:
        r = await client.post(
            "http://w1:8000/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "model": "emb"},
        )
        assert r.status_code == 200
        assert sum(e.stats.generation_tokens for e in cluster.engines) == 2
        assert sum(e.stats.generation_tokens for e in other.engines) == 0
        with pytest.raises(httpx.ConnectError):
            await client.get("http://w9:8000/health")
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--port", "70000"], "--port"),
        (["--dp-size", "0"], "--dp-size"),
        (["--num-gpu-blocks", "x"], "--num-gpu-blocks"),
        (["--time-scale", "-1"], "--time-scale"),
        (["--scheduling-policy", "sjf"], "--scheduling-policy"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
    ],
)
def test_cli_bad_flag_values_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["sim-backend", *argv])
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err
