"""Replay driver and report against a fake worker (exact virtual times under autojump)."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from trace_fake_worker import FakeWorker

from bench.replay import ReplayOptions, run_replay
from bench.report import build_report, measured_replay
from bench.trace.format import read_trace
from bench.trace.synth import synthesize
from sim.tokenizer import render_chat

URL = "http://worker"


def _trace(lines: list[dict], meta: dict | None = None):
    text = ""
    if meta is not None:
        text += json.dumps({"meta": meta}) + "\n"
    text += "".join(json.dumps(line) + "\n" for line in lines)
    return read_trace(io.StringIO(text))


def _rec(sid: str, turn: int, delta: int, out: int, gap: float = 0.0, **extra: object) -> dict:
    return {
        "session_id": sid,
        "turn": turn,
        "input_delta": delta,
        "output_length": out,
        "pre_gap_ms": gap,
        "role": "tool" if turn else "user",
        **extra,
    }


async def test_replay_timing_messages_and_report(autojump_clock) -> None:
    worker = FakeWorker()
    trace = _trace(
        [
            _rec("a", 0, 40, 5, shared_prefix_id="sys", shared_prefix_tokens=30),
            _rec("a", 1, 20, 5, gap=500.0, shared_prefix_id="sys", shared_prefix_tokens=30),
        ]
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        report = await measured_replay(
            trace,
            client,
            URL,
            ReplayOptions(time_scale=2.0),
            worker_metrics=[f"{URL}/metrics"],
            router_metrics=[],
            info={"path": "t.jsonl"},
            system="s",
        )
    # the second prompt extends the first prompt plus the streamed reply
    first, second = (render_chat(b["messages"]) for b in worker.bodies)
    assert second[: len(first)] == first
    assert worker.bodies[1]["messages"][2]["role"] == "assistant"
    ctx = worker.bodies[1]["vllm_xargs"]["agentic_context"]
    assert ctx == {
        "program_id": "a",
        "task_id": "a",
        "agent_id": "lead",
        "step_id": 1,
        "expected_resume": True,
        "priority": 0,
    }
    assert worker.bodies[0]["stream_options"] == {"include_usage": True}
    assert worker.headers[0]["x-session-id"] == "a"

    # in trace seconds (run seconds x time scale): each request takes 0.1 s + 5 x 0.01 s, and the
    # task adds the 500 ms gap, 0.25 s at time scale 2
    assert report["system"] == "s" and report["trace"] == {"path": "t.jsonl"}
    assert report["request_latency_seconds"]["count"] == 2
    assert report["request_latency_seconds"]["mean"] == report["request_latency_seconds"]["max"] == pytest.approx(0.3)
    assert report["jct_seconds"]["mean"] == pytest.approx(2 * (0.15 + 0.25 + 0.15))
    assert report["ttft_seconds"]["mean"] == pytest.approx(2 * 0.11)
    assert report["tasks"] == {"planned": 1, "completed": 1, "failed": 0}
    assert report["requests"]["completed"] == 2
    prompt_total = len(first) + len(second)
    assert report["cache"]["prompt_tokens_total"] == prompt_total
    # the fake caches whole 16-token blocks of the first prompt + its 5 output tokens
    cached = (len(first) + 5) // 16 * 16
    assert report["cache"]["prompt_tokens_cached_total"] == cached
    assert report["cache"]["token_hit_ratio"] == pytest.approx(cached / prompt_total)
    assert report["tokens"] == {"input": prompt_total, "output": 10, "cached_by_usage": cached}
    assert report["preemptions"] == 0
    assert report["scheduling"]["available"] is False
    assert report["metrics_errors"] == []


async def test_replay_subagents_block_the_parent(autojump_clock) -> None:
    worker = FakeWorker()
    trace = _trace(
        [
            _rec("p", 0, 10, 5),
            _rec("p", 1, 10, 5, gap=100.0),
            _rec(
                "p.c",
                0,
                10,
                5,
                gap=10.0,
                parent_session_id="p",
                parent_turn=0,
                blocks_parent=True,
                agent_id="sub0",
                task_id="p",
            ),
            _rec("p.c", 1, 10, 5, gap=1000.0, parent_session_id="p", agent_id="sub0", task_id="p"),
        ]
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        result = await run_replay(trace, client, URL)
    by = {(r.session_id, r.turn): r for r in result.requests}
    # the child starts 10 ms after the parent's turn 0; the parent's turn 1 waits for the child's end
    assert by[("p.c", 0)].start == pytest.approx(by[("p", 0)].end + 0.010)
    assert by[("p", 1)].start == pytest.approx(by[("p.c", 1)].end + 0.100)
    child_ctx = next(b for b in worker.bodies if b["vllm_xargs"]["agentic_context"]["program_id"] == "p.c")
    assert child_ctx["vllm_xargs"]["agentic_context"]["parent_program_id"] == "p"
    assert child_ctx["vllm_xargs"]["agentic_context"]["blocks_parent"] is True
    assert len(result.tasks) == 1 and result.tasks[0].requests == 4


async def test_replay_closed_loop_concurrency(autojump_clock) -> None:
    worker = FakeWorker()
    trace = synthesize("bfcl", 6, seed=3)
    updates: list[dict] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        result = await run_replay(trace, client, URL, ReplayOptions(concurrency=2), progress=updates.append)
    edges = sorted([(t.start, 1) for t in result.tasks] + [(t.end, -1) for t in result.tasks])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    assert peak == 2
    assert updates[-1]["done_tasks"] == 6 and updates[-1]["done_requests"] == len(trace.records)
    assert len(result.requests) == len(trace.records) and all(r.ok for r in result.requests)
    starts = sorted(t.start for t in result.tasks)
    assert starts[2] >= sorted(t.end for t in result.tasks)[0]


async def test_replay_records_http_errors_and_ends_the_program(autojump_clock) -> None:
    async def failing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, text="Program request exceeded its admission queue timeout")

    trace = _trace([_rec("a", 0, 10, 5), _rec("a", 1, 10, 5)])
    async with httpx.AsyncClient(transport=httpx.MockTransport(failing)) as client:
        result = await run_replay(trace, client, URL)
    assert len(result.requests) == 1 and result.requests[0].status == 429
    report = build_report(result, time_scale=1.0)
    assert report["tasks"] == {"planned": 1, "completed": 0, "failed": 1}
    assert report["requests"]["errors"] == {"http_429": 1}


async def test_measured_replay_names_the_scrapes_that_failed(autojump_clock) -> None:
    worker = FakeWorker()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(503)
        return await worker.handler(request)

    trace = _trace([_rec("a", 0, 10, 5)])
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        report = await measured_replay(
            trace, client, URL, ReplayOptions(), worker_metrics=[f"{URL}/metrics"], router_metrics=[]
        )
    assert report["requests"]["completed"] == 1
    assert report["metrics_errors"] == [f"{URL}/metrics: HTTP 503"] * 2  # before and after
    assert report["cache"]["token_hit_ratio"] is None


def test_replay_sim_hints_name_the_next_turns_tool_and_can_be_left_out() -> None:
    from bench.replay import _Progress, _Replayer

    trace = synthesize("agent-tools", 1, seed=2)
    recs = trace.sessions()["tools-00000"]
    rep = _Replayer(trace, httpx.AsyncClient(), URL, ReplayOptions(), _Progress(0, 0, None))
    first = rep._body(recs[0], [])["vllm_xargs"]
    assert first["sim_finish_reason"] == "tool_calls" and first["sim_tool_name"] == recs[1].tool_name
    assert first["agentic_context"]["program_id"] == "tools-00000"
    assert rep._body(recs[-1], [])["vllm_xargs"]["sim_finish_reason"] == "stop"
    plain = _Replayer(trace, httpx.AsyncClient(), URL, ReplayOptions(sim_hints=False), _Progress(0, 0, None))
    assert "sim_finish_reason" not in plain._body(recs[0], [])["vllm_xargs"]


async def test_open_loop_roots_start_at_their_timestamps_whatever_the_file_order(autojump_clock) -> None:
    # Roots listed late-first: each must still start exactly at its own timestamp (not after the
    # roots listed before it), with the file order breaking a tie.
    worker = FakeWorker()
    trace = _trace(
        [
            _rec("late", 0, 10, 5, timestamp=8000.0),
            _rec("mid", 0, 10, 5, timestamp=3000.0),
            _rec("early", 0, 10, 5, timestamp=0.0),
            _rec("mid2", 0, 10, 5, timestamp=3000.0),
        ],
        meta={"arrival": "poisson"},
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        result = await run_replay(trace, client, URL)
    t0 = result.started
    start = {t.task_id: t.start - t0 for t in result.tasks}
    # the replay's per-root stagger is the root's file index in microseconds
    assert start == {
        "early": pytest.approx(0.0 + 2e-6, abs=1e-9),
        "mid": pytest.approx(3.0 + 1e-6, abs=1e-9),
        "mid2": pytest.approx(3.0 + 3e-6, abs=1e-9),
        "late": pytest.approx(8.0, abs=1e-9),
    }
    # each request takes 0.1 s + 5 x 0.01 s at the fake worker
    assert {r.session_id: r.end - r.start for r in result.requests} == pytest.approx(
        {"late": 0.15, "mid": 0.15, "early": 0.15, "mid2": 0.15}
    )
    assert [b["vllm_xargs"]["agentic_context"]["program_id"] for b in worker.bodies] == ["early", "mid", "mid2", "late"]


async def test_open_loop_roots_keep_timestamp_order_under_a_concurrency_cap(autojump_clock) -> None:
    worker = FakeWorker()
    trace = _trace(
        [_rec("b", 0, 10, 5, timestamp=1000.0), _rec("a", 0, 10, 5, timestamp=0.0)],
        meta={"arrival": "bursts"},
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        result = await run_replay(trace, client, URL, ReplayOptions(concurrency=1))
    start = {t.task_id: t.start - result.started for t in result.tasks}
    assert start == {"a": pytest.approx(1e-6, abs=1e-9), "b": pytest.approx(1.0, abs=1e-9)}
