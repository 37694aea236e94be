"""Batch workloads in the trace kit: the ``batch`` profile, ``stream`` records, ``trace merge``,
batch replay (headers, bodies, open-loop starts) and the report's ``batch`` section (exact times
under autojump against the fake worker)."""

from __future__ import annotations

import io
import json

import httpx
import pytest
import trio
from trace_fake_worker import FakeWorker

from bench import batch_compare
from bench.bench import ClusterSpec
from bench.calibrate import config_for
from bench.markdown import render_report
from bench.replay import ReplayOptions
from bench.report import measured_replay
from bench.simulate import run_simulation
from bench.trace.format import TraceError, dumps_trace, merge_traces, read_trace, save_trace
from bench.trace.stats import compare, trace_stats
from bench.trace.synth import BATCH_JOBS, Knobs, synthesize, targets_for
from daemon.cli import main
from sim.cluster import SimCluster, SimConfig
from sim.transport import SimTransport

URL = "http://worker"


def _trace(lines: list[dict], meta: dict | None = None):
    text = json.dumps({"meta": meta}) + "\n" if meta is not None else ""
    text += "".join(json.dumps(line) + "\n" for line in lines)
    return read_trace(io.StringIO(text))


def _rec(sid: str, turn: int, delta: int, out: int, **extra: object) -> dict:
    return {"session_id": sid, "turn": turn, "input_delta": delta, "output_length": out, **extra}


# ----------------------------------------------------------------------------- profile and format


def test_batch_profile_jobs_decode_lengths_and_burst() -> None:
    trace = synthesize("batch", 41, seed=4)
    recs = trace.records
    assert trace.meta.arrival == "bursts"
    assert all(r.is_batch and r.turn == 0 and not r.stream and r.finish_reason == "stop" for r in recs)
    assert all(r.priority == 0 and r.parent_session_id is None for r in recs)
    by_job: dict[str, list] = {}
    for r in recs:
        by_job.setdefault(r.job, []).append(r)
    # 41 requests over 4 jobs: the first job takes the remainder
    assert [len(by_job[name]) for name, *_ in BATCH_JOBS] == [11, 10, 10, 10]
    for j, (name, (lo, hi), _prompt, shared) in enumerate(BATCH_JOBS):
        assert all(lo <= r.output_length <= hi for r in by_job[name])
        prefixes = {(r.shared_prefix_id, r.shared_prefix_tokens) for r in by_job[name]}
        assert prefixes == {(f"batch-{name}-prompt", shared)}
        # job after job in one 200 ms burst: job j's requests within [50 j, 50 (j + 1)] ms
        assert all(50.0 * j <= r.timestamp <= 50.0 * (j + 1) for r in by_job[name])
    assert [r.timestamp for r in recs] == sorted(r.timestamp for r in recs)
    stats = trace_stats(trace)
    assert stats["jobs"] == 4.0
    assert stats["output_short_share"] == pytest.approx(11 / 41)


def test_batch_profile_scales_and_meets_its_targets() -> None:
    knobs = Knobs(output_scale=0.5, arrival_rate_per_second=4.0)
    trace = synthesize("batch", 400, seed=1, knobs=knobs)
    assert [c for c in compare(trace_stats(trace), targets_for("batch", knobs)) if not c.ok] == []
    assert min(r.timestamp for r in trace.records if r.job == "generate") >= 750.0  # job 3 at 3 / 4 s
    assert max(r.timestamp for r in trace.records) <= 1000.0


def test_stream_field_is_written_only_when_false_and_read_back() -> None:
    trace = _trace([_rec("a", 0, 5, 5), _rec("b", 0, 5, 5, job="j", stream=False)])
    lines = dumps_trace(trace).splitlines()
    assert "stream" not in json.loads(lines[1])
    assert json.loads(lines[2])["stream"] is False
    again = read_trace(io.StringIO(dumps_trace(trace)))
    assert [r.stream for r in again.records] == [True, False]
    with pytest.raises(TraceError, match="line 1: field 'stream' must be bool, got 'no'"):
        _trace([_rec("a", 0, 5, 5, stream="no")])


# ----------------------------------------------------------------------------- merge


def test_merge_keeps_sessions_shifts_block_ids_and_takes_the_agent_arrival() -> None:
    agents = synthesize("swe-short", 3, seed=1, knobs=Knobs(input_scale=0.2))
    batch = synthesize("batch", 8, seed=2)
    merged = merge_traces([("a.jsonl", agents), ("b.jsonl", batch)])
    assert merged.records[: len(agents.records)] == agents.records
    tail = merged.records[len(agents.records) :]
    shift = max(h for r in agents.records for h in r.hash_ids) + 1
    assert [r.hash_ids for r in tail] == [tuple(h + shift for h in r.hash_ids) for r in batch.records]
    assert [r.session_id for r in tail] == [r.session_id for r in batch.records]
    meta = merged.meta
    assert (meta.profile, meta.arrival, meta.concurrency, meta.programs, meta.seed) == (
        "swe-short+batch",
        "closed_loop",
        16,
        11,
        None,
    )
    assert [p["name"] for p in meta.params["merged"]] == ["a.jsonl", "b.jsonl"]
    # batch-only merges are bursts
    other = _trace([_rec("c0", 0, 5, 5, job="c", timestamp=0.0)], meta={"arrival": "poisson"})
    assert merge_traces([("x", batch), ("y", other)]).meta.arrival == "bursts"


def test_merge_errors_name_the_problem() -> None:
    agents = synthesize("swe-short", 2, seed=1)
    with pytest.raises(TraceError, match=r"y \(trace 2\): session_id 'swe-00000' is also in x \(trace 1\)"):
        merge_traces([("x", agents), ("y", agents)])
    chat = synthesize("chat-human", 2, seed=1)
    with pytest.raises(TraceError, match=r"meta.arrival: .* x \(closed_loop\), y \(poisson\)"):
        merge_traces([("x", agents), ("y", chat)])
    with pytest.raises(TraceError, match="at least two traces"):
        merge_traces([("x", agents)])


def test_trace_merge_cli(tmp_path, capsys) -> None:
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "m.jsonl"
    save_trace(synthesize("swe-short", 2, seed=1), a)
    save_trace(synthesize("batch", 4, seed=1), b)
    assert main(["trace", "merge", str(a), str(b), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().err
    merged = read_trace(io.StringIO(out.read_text()))
    assert len(merged.records) == len(synthesize("swe-short", 2, seed=1).records) + 4
    assert main(["trace", "merge", str(a), str(a), "-o", str(tmp_path / "x.jsonl")]) == 2
    assert "session_id 'swe-00000' is also in" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
    assert main(["trace", "merge", str(a), "-o", str(out)]) == 2
    assert "at least two traces" in capsys.readouterr().err
    assert main(["trace", "merge", str(a), str(tmp_path / "missing.jsonl"), "-o", str(out)]) == 2


# ----------------------------------------------------------------------------- replay and report


async def test_batch_replay_headers_bodies_starts_and_report(autojump_clock) -> None:
    worker = FakeWorker()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("x-agentd-class") == "batch":
            worker.preemptions += 1  # makes the engine-preemption delta visible
        return await worker.handler(request)

    trace = _trace(
        [
            _rec("a", 0, 10, 5),
            _rec("a", 1, 10, 5, pre_gap_ms=500.0, role="tool"),
            _rec("b0", 0, 20, 2, job="short", stream=False, timestamp=0.0),
            _rec("b1", 0, 20, 4, job="short", timestamp=100.0),
            _rec("b2", 0, 20, 10, job="long", stream=False, timestamp=50.0, finish_reason="length"),
        ],
        meta={"arrival": "closed_loop", "concurrency": 1},
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        report = await measured_replay(
            trace, client, URL, ReplayOptions(), worker_metrics=[f"{URL}/metrics"], router_metrics=[]
        )
    sent = {h["x-request-id"]: (h, b) for h, b in zip(worker.headers, worker.bodies, strict=True)}
    h0, b0 = sent["b0-t0#job_name[short]#"]
    assert h0["x-agentd-class"] == "batch" and "x-session-id" not in h0
    assert b0["stream"] is False and "stream_options" not in b0
    assert (b0["max_tokens"], b0["min_tokens"], b0["ignore_eos"]) == (2, 2, True)
    assert b0["vllm_xargs"] == {"sim_output_tokens": 2, "sim_finish_reason": "stop"}
    _h1, b1 = sent["b1-t0#job_name[short]#"]
    assert b1["stream"] is True and b1["stream_options"] == {"include_usage": True}
    _h2, b2 = sent["b2-t0#job_name[long]#"]
    assert "vllm_xargs" not in b2  # the record ended by length: no stop hint
    ha, ba = sent["a-t0"]
    assert "x-agentd-class" not in ha and ha["x-session-id"] == "a" and "agentic_context" in ba["vllm_xargs"]

    # batch roots start at their timestamps (+ the root index in microseconds), outside the
    # closed loop of concurrency 1; each request takes 0.1 s + 0.01 s per output token
    t_b0, t_b1, t_b2 = 1e-6, 0.1 + 2e-6, 0.05 + 3e-6
    end_b0, end_b1, end_b2 = t_b0 + 0.12, t_b1 + 0.14, t_b2 + 0.2
    batch = report["batch"]
    assert batch["planned"] == 3 and (batch["requests"], batch["completed"], batch["failed"]) == (3, 3, 0)
    assert batch["makespan_seconds"] == pytest.approx(end_b2 - t_b0, abs=1e-9)
    assert batch["requests_per_second"] == pytest.approx(3 / (end_b2 - t_b0), rel=1e-9)
    assert batch["output_tokens"] == 16
    assert batch["output_tokens_per_second"] == pytest.approx(16 / (end_b2 - t_b0), rel=1e-9)
    assert batch["engine_preemptions"] == 3.0 == report["preemptions"]
    assert batch["jobs"]["short"]["makespan_seconds"] == pytest.approx(end_b1 - t_b0, abs=1e-9)
    assert batch["jobs"]["long"]["makespan_seconds"] == pytest.approx(0.2, abs=1e-9)
    assert batch["jobs"]["long"]["requests_per_second"] == pytest.approx(1 / 0.2)
    assert batch["latency_seconds"]["max"] == pytest.approx(0.2)
    # the Programs' JCT counts the agent task only: 0.15 + 0.5 gap + 0.15
    assert report["tasks"] == {"planned": 1, "completed": 1, "failed": 0}
    assert report["jct_seconds"]["count"] == 1
    assert report["jct_seconds"]["mean"] == pytest.approx(0.8)
    assert report["requests"]["completed"] == 5
    assert end_b0 < end_b1


async def test_replayed_batch_stop_records_end_by_a_natural_stop_in_the_simulator(autojump_clock) -> None:
    # only natural stops feed the decode estimates (docs/batch.md §1.2): the replay must make the
    # simulated engine answer a "stop" record with exactly its output length and finish "stop"
    worker = FakeWorker()
    trace = _trace(
        [
            _rec("b0", 0, 20, 7, job="j", stream=False),
            _rec("b1", 0, 20, 5, job="j", stream=False, finish_reason="length"),
        ]
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        await measured_replay(trace, client, URL, ReplayOptions(), worker_metrics=[], router_metrics=[])
    answers = {}
    async with trio.open_nursery() as nursery:
        cluster: SimCluster = await nursery.start(SimCluster(SimConfig(dp_size=1, deterministic=True)).run)
        async with httpx.AsyncClient(transport=SimTransport(cluster), base_url="http://sim") as sim:
            for h, b in zip(worker.headers, worker.bodies, strict=True):
                r = await sim.post("/v1/chat/completions", json=b)
                assert r.status_code == 200, r.text
                answers[h["x-request-id"]] = r.json()
        nursery.cancel_scope.cancel()
    stop = answers["b0-t0#job_name[j]#"]
    assert (stop["choices"][0]["finish_reason"], stop["usage"]["completion_tokens"]) == ("stop", 7)
    length = answers["b1-t0#job_name[j]#"]
    assert (length["choices"][0]["finish_reason"], length["usage"]["completion_tokens"]) == ("length", 5)


async def test_report_has_no_batch_section_without_batch_records(autojump_clock) -> None:
    worker = FakeWorker()
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        report = await measured_replay(
            _trace([_rec("a", 0, 10, 5)]), client, URL, ReplayOptions(), worker_metrics=[], router_metrics=[]
        )
    assert "batch" not in report


def _report(makespan: float | None, preempt: float, jobs: dict[str, float]) -> dict:
    out: dict = {"jct_seconds": {"mean": 10.0}, "preemptions": preempt}
    if makespan is not None:
        out["batch"] = {
            "makespan_seconds": makespan,
            "output_tokens_per_second": 1000.0 / makespan,
            "engine_preemptions": preempt,
            "jobs": {job: {"makespan_seconds": m} for job, m in jobs.items()},
        }
    return out


def test_report_md_batch_rows_and_ratios() -> None:
    reports = {
        "native": _report(100.0, 40, {"long": 100.0, "short": 20.0}),
        "agentd": _report(80.0, 10, {"long": 80.0, "short": 30.0}),
    }
    text = render_report(reports, title="t")
    assert "| batch makespan (s) | 100.00 | 80.00 |" in text
    assert "| engine preemptions | 40 | 10 |" in text
    assert "| makespan job long (s) | 100.00 | 80.00 |" in text
    assert "| batch makespan (s) ratio | 0.800 |" in text
    assert "| batch output tokens/s ratio | 1.250 |" in text
    assert "| engine preemptions ratio | 0.250 |" in text
    assert "| makespan job short (s) ratio | 1.500 |" in text
    plain = render_report({"native": _report(None, 0, {}), "agentd": _report(None, 0, {})}, title="t")
    assert "batch" not in plain and "makespan" not in plain


# ----------------------------------------------------------------------------- simulate and the table


def test_simulate_a_batch_trace_with_each_engine_policy() -> None:
    trace = synthesize("batch", 24, seed=5, knobs=Knobs(input_scale=0.2, output_scale=0.2))
    reports = {}
    for policy in ("fcfs", "batch_job_aware"):
        cluster = ClusterSpec(workers=1, dp_size=1, num_gpu_blocks=120, scheduling_policy=policy, seed=1)
        cfg = config_for(cluster, "native")
        assert cfg.embedded.scheduling_policy == policy
        first = run_simulation(cfg, trace, ReplayOptions())
        again = run_simulation(cfg, trace, ReplayOptions())
        first.pop("simulation"), again.pop("simulation")
        assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
        batch = first["batch"]
        assert (batch["planned"], batch["completed"], batch["failed"]) == (24, 24, 0)
        assert batch["output_tokens"] == sum(r.output_length for r in trace.records)
        assert sorted(batch["jobs"]) == sorted(name for name, *_ in BATCH_JOBS)
        assert batch["engine_preemptions"] == first["preemptions"]
        assert first["tasks"]["planned"] == 0 and first["jct_seconds"] == {"count": 0}
        reports[policy] = first
    # the same requests and tokens either way; only the order (and so the times) differ
    assert reports["fcfs"]["tokens"]["output"] == reports["batch_job_aware"]["tokens"]["output"]


def test_batch_compare_table(tmp_path, capsys) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report(100.0, 40, {"long": 100.0})))
    b.write_text(json.dumps(_report(80.0, 10, {"long": 90.0})))
    out = tmp_path / "t.md"
    assert batch_compare.main(["--title", "T", "--out", str(out), f"fcfs={a}", f"x={b}"]) == 0
    text = capsys.readouterr().out
    assert text == out.read_text()
    assert "| metric | fcfs | x | x / fcfs |" in text
    assert "| batch makespan (s) | 100.00 | 80.00 | 0.800 |" in text
    assert "| engine preemptions | 40 | 10 | 0.250 |" in text
    assert "| makespan job long (s) | 100.00 | 90.00 | 0.900 |" in text
    assert "agents' JCT p90" not in text  # no value in any report
    assert batch_compare.main(["--title", "T", "nolabel"]) == 2
    assert "expected LABEL=REPORT.json" in capsys.readouterr().err
