"""The bench driver end to end on a tiny trace: real sim-backend subprocesses on loopback, no vllm-router.

Asserts only what is deterministic (never timings, nor values that depend on how the real-clock
simulator interleaves requests: cache hit ratio, preemptions, CPU seconds are checked for presence,
type and range): both systems complete the same work, the prompt-token counters come from the
workers, and report.md holds the side-by-side table.
"""

from __future__ import annotations

import json
import os
import socket

import pytest

from bench.bench import BenchError, bench_ports
from bench.trace.format import save_trace
from bench.trace.synth import Knobs, synthesize
from daemon.cli import main


def test_bench_native_and_agentd_on_a_tiny_trace(tmp_path, capsys) -> None:
    trace = synthesize("swe-short", 2, seed=4, knobs=Knobs(input_scale=0.05, output_scale=0.05, gap_cap_seconds=0.5))
    path = tmp_path / "tiny.jsonl"
    save_trace(trace, path)
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--trace",
            str(path),
            "--out",
            str(out),
            "--systems",
            "native,agentd",
            "--workers",
            "1",
            "--kv-blocks",
            "256",
            "--time-scale",
            "20",
            "--no-progress",
            "--port-base",
            "0",
        ]
    )
    assert code == 0
    reports = {s: json.loads((out / f"{s}.json").read_text()) for s in ("native", "agentd")}
    for system, rep in reports.items():
        assert rep["system"] == system
        assert rep["tasks"] == {"planned": 2, "completed": 2, "failed": 0}
        assert rep["requests"]["completed"] == len(trace.records)
        assert rep["tokens"]["output"] == sum(r.output_length for r in trace.records)
        # the workers' counters saw exactly the prompt tokens the usage reported
        assert rep["cache"]["prompt_tokens_total"] == rep["tokens"]["input"]
        assert isinstance(rep["cache"]["token_hit_ratio"], float)
        assert 0.0 <= rep["cache"]["token_hit_ratio"] <= 1.0
        assert isinstance(rep["preemptions"], (int, float)) and rep["preemptions"] >= 0
        assert rep["cluster"]["num_gpu_blocks"] == 256
        cpu = rep["process_cpu_seconds"]
        assert isinstance(cpu["system"], (int, float)) and cpu["system"] >= 0.0  # coarse ticks: may be 0
        assert len(cpu["workers"]) == 1
    assert reports["native"]["tokens"]["input"] == reports["agentd"]["tokens"]["input"]
    # Program scheduling exposes its queue-wait histogram; the native path has none
    assert reports["native"]["queue_wait_seconds"]["router"] is None
    assert reports["agentd"]["queue_wait_seconds"]["router"]["count"] == len(trace.records)
    assert reports["agentd"]["program_scheduling_config"]["token_capacity_per_dp_rank"] == 256 * 16
    assert reports["agentd"]["program_scheduling_config"]["binding_strategy"] == "reasoning_token_balance"
    md = (out / "report.md").read_text()
    assert "| metric | native | agentd |" in md and "### Against `native`" in md
    assert md in capsys.readouterr().out
    assert os.path.exists(out / "logs" / "agentd" / "worker-0.log")
    # the processes' state directories were working files: not left in the output (walk 27)
    assert sorted(os.listdir(out / "logs" / "agentd")) == ["agentd.log", "worker-0.log"]


def test_bench_rejects_unknown_system(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    save_trace(synthesize("bfcl", 1, seed=1), path)
    assert main(["bench", "--trace", str(path), "--out", str(tmp_path / "o"), "--systems", "native,sglang"]) == 2
    assert "--systems: unknown system 'sglang'" in capsys.readouterr().err
    assert (
        main(
            [
                "bench",
                "--trace",
                str(path),
                "--out",
                str(tmp_path / "o"),
                "--systems",
                "vllm-router",
                "--vllm-router",
                str(tmp_path / "missing"),
            ]
        )
        == 2
    )
    assert "is not an executable file" in capsys.readouterr().err


def _free_run(length: int) -> int:
    """A base port below the kernel's ephemeral range whose next ``length`` ports are all free
    now, so the test does not depend on which neighbours of an ephemeral port other processes
    of a busy machine hold."""
    for base in range(20000, 30000, 97):
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + length):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    pytest.skip("no run of free ports in 20000..30000")


def test_bench_ports_are_fixed_from_the_base_and_a_busy_one_is_named() -> None:
    base = _free_run(5)
    router, prom, workers = bench_ports(base, 3)
    assert (router, prom, workers) == (base, base + 1, [base + 2, base + 3, base + 4])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", base + 3))
        busy.listen()
        with pytest.raises(BenchError, match=rf"--port-base: port {base + 3} \(of {base}..{base + 4}\) is in use"):
            bench_ports(base, 3)
    ephemeral = bench_ports(0, 2)
    assert len(set([ephemeral[0], ephemeral[1], *ephemeral[2]])) == 4


def test_bench_rejects_a_bad_port_base(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    save_trace(synthesize("bfcl", 1, seed=1), path)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--trace", str(path), "--out", str(tmp_path / "o"), "--port-base", "80"])
    assert exc.value.code == 2
    assert "--port-base: must be 0 (ephemeral) or in 1024..65000, got '80'" in capsys.readouterr().err


def test_bench_tool_workload_end_to_end_over_sockets(tmp_path) -> None:
    """agent-tools over real sockets: the simulated workers answer the tool turns with the traced
    tools' calls, agentd reads the names from the relayed stream and arms per-tool TTLs
    (docs/program-scheduling.md §12), and the floor system runs on unlimited KV."""
    knobs = Knobs(input_scale=0.05, output_scale=0.2, gap_cap_seconds=0.5, max_turns=8)
    trace = synthesize("agent-tools", 3, seed=5, knobs=knobs)
    path = tmp_path / "tools.jsonl"
    save_trace(trace, path)
    out = tmp_path / "bench"
    ps = json.dumps({"tool_retention": {"min_samples": 1}})
    args = ["bench", "--trace", str(path), "--out", str(out), "--systems", "agentd,floor", "--workers", "1"]
    args += ["--kv-blocks", "256", "--floor-kv-blocks", "2048", "--time-scale", "20", "--no-progress"]
    assert main([*args, "--port-base", "0", "--ps-config-json", ps]) == 0
    agentd = json.loads((out / "agentd.json").read_text())
    floor = json.loads((out / "floor.json").read_text())
    assert agentd["tasks"]["completed"] == floor["tasks"]["completed"] == 3
    assert floor["cluster"]["num_gpu_blocks"] == 2048
    tools = {t["tool"]: t for t in agentd["scheduling"]["tools"]}
    traced = {r.tool_name for r in trace.records if r.tool_name} | {"<stop>"}
    assert set(tools) <= traced and len(tools) >= 2
    armed = agentd["scheduling"]["ttl_armed"]
    assert armed.get("tool", 0) + armed.get("tool_release", 0) > 0
    assert "### Against `floor`" in (out / "report.md").read_text()
